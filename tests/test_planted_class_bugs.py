"""Bugs in the optimizer class found in the wild (each passed the scripted scenario the optimizer claim
used to run) are controls of the claim `optimizer` (propositions/optimizer_class.CONTROLS, among them
the source edits of propositions/_optimizer_controls.SOURCE_EDITS), used from there: every control's
detection is tested in test_optimizer_claim.py. Here: a whole dtype's runs with such a bug fail with a
fail verdict (a check's residual above its bound), never an error of the claim's own code, and the
failing run shrinks to a short one that names the operation."""

import inspect

import pytest

pytest.importorskip("torch")

from propositions import get_profile  # noqa: E402
from propositions._optimizer_controls import SOURCE_EDITS  # noqa: E402
from propositions.kit import source_edits  # noqa: E402
from propositions.kit.protocol import Context  # noqa: E402
from propositions.optimizer_class import CONTROLS, dtype_part  # noqa: E402

QUICK = get_profile("quick")


def _fails(evidence) -> list[str]:
    return [check.name for check in evidence.checks if check.samples and not check.passed]


def test_a_euclidean_group_skipped_by_one_flag_fails():
    """One NaN tensor freezes every tensor of its euclidean group: the flag is the group's, not the tensor's."""
    evidence = dtype_part("float64", Context(0, QUICK, "euclidean_group_skips_whole"))
    assert "float64/euclidean_is_adamw" in _fails(evidence)


def test_an_older_checkpoint_loaded_as_it_is_fails_at_the_checkpoint():
    """The older format's int count loaded as it is (an int where a tensor per frame is expected)."""
    evidence = dtype_part("bfloat16", Context(0, QUICK, "old_count_loaded_as_is"))
    assert set(_fails(evidence)) & {"bfloat16/scenario_completes", "bfloat16/checkpoint_round_trip"}


def test_every_source_edit_is_a_control_and_applies_to_the_current_source():
    assert set(SOURCE_EDITS) <= set(CONTROLS)
    for before, after in SOURCE_EDITS.values():
        assert source_edits.edited("torch_impl.optimizer", before, after, "StiefelAdam") is not None


def test_a_source_edit_whose_text_has_moved_is_an_error_not_a_silent_pass():
    with pytest.raises(source_edits.SourceEditError, match="occurs 0 times"):
        source_edits.edited("torch_impl.optimizer", "text that is not in the source\n", "", "StiefelAdam")


def test_a_source_edit_leaves_the_real_module_alone():
    import torch_impl
    from torch_impl import optimizer

    before, after = SOURCE_EDITS["joined_view_ignores_gap"]
    broken = source_edits.edited("torch_impl.optimizer", before, after, "StiefelAdam")
    assert broken is not optimizer.StiefelAdam and torch_impl.StiefelAdam is optimizer.StiefelAdam
    assert inspect.unwrap(broken.step).__globals__["_consecutive_view"] is not optimizer._consecutive_view
