"""The claim 'optimizer' (propositions/optimizer_class.py): the real StiefelAdam passes in float64,
float32 and bfloat16, and each broken subclass (one piece of bookkeeping wrong) fails it."""

import pytest

pytest.importorskip("torch")

from propositions._common import get_profile  # noqa: E402
from propositions.optimizer_class import CLAIM, CONTROL_NAMES, broken_optimizers  # noqa: E402


@pytest.fixture(scope="module")
def quick_result():
    return CLAIM.run(seed=3, profile=get_profile("quick"))


def test_the_class_passes_in_three_dtypes_and_every_control_is_detected(quick_result):
    result = quick_result
    assert result.verdict == "pass", result.failures()
    names = {check.name for check in result.checks}
    for dtype in ("float64", "float32", "bfloat16"):
        for check in ("frame", "first_moment", "second_moment", "step_count", "no_gradient_untouched",
                      "nonfinite_frame_untouched", "resume_bit_for_bit", "closure_loss", "euclidean_is_adamw"):
            assert f"{dtype}/{check}" in names
    assert all(check.samples > 0 for check in result.checks)
    assert sorted(control.name for control in result.controls) == sorted(CONTROL_NAMES)
    assert all(control.detected for control in result.controls)
    assert result.extra["unit_roundoffs_bfloat16"] == {"W": 2.0**-8, "m_v": 2.0**-24, "compute": 2.0**-24}
    assert result.extra["undefined_frame_steps_float64"] == 0


@pytest.mark.parametrize("name", CONTROL_NAMES)
def test_each_broken_class_fails_the_claim(name):
    result = CLAIM.run(seed=4, profile=get_profile("quick"), optimizer=name)
    assert result.verdict == "fail"
    assert name in broken_optimizers()
