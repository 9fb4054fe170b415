"""The promises torch_impl's documentation states bit for bit or against torch
(propositions/optimizer_promises.py, a part of the optimizer claim): the real optimizer keeps them,
each control breaks one and is caught by that promise's check alone, and a check narrowed back to one
norm type, one dtype or the shape classes alone lets its control escape."""

from __future__ import annotations

import pytest

pytest.importorskip("torch")

from propositions import optimizer_promises as promises  # noqa: E402
from propositions._common import DETECTION_FACTOR  # noqa: E402
from propositions.optimizer_class import CONTROLS, broken_subjects, real_subject  # noqa: E402

CAUGHT_BY = {
    "tensor_lr_in_parameter_dtype": "promise/lr_tensor_bit_for_bit",
    "meta_skipped_without_gradient": "promise/meta_parameter_refused",
    "clip_ignores_norm_type": "promise/clip_matches_torch",
    "sync_free_without_sharper_test": "promise/sync_free_bit_for_bit",
    "meta_refused_in_frame_groups_only": "promise/meta_parameter_refused",
    "zero_grad_keeps_zeros": "promise/zero_grad_sets_none",
}


def _ratios(subject) -> dict:
    return {check.name: check.max_ratio for check in promises.promise_checks(subject, 0)}


def test_the_real_optimizer_keeps_every_promise():
    ratios = _ratios(real_subject())
    assert set(ratios) == set(CAUGHT_BY.values()) and all(ratio <= 1 for ratio in ratios.values()), ratios


@pytest.mark.parametrize("name", list(CAUGHT_BY))
def test_each_promise_control_is_caught_by_its_own_check_alone(name):
    assert CONTROLS[name].part == "promises"
    ratios = _ratios(broken_subjects()[name])
    assert ratios[CAUGHT_BY[name]] >= DETECTION_FACTOR
    assert all(ratio <= 1 for check, ratio in ratios.items() if check != CAUGHT_BY[name]), ratios


@pytest.mark.parametrize("name, constant, narrowed", [
    ("clip_ignores_norm_type", "NORM_TYPES", (2.0,)),
    ("sync_free_without_sharper_test", "SYNC_SHAPES", ((4, 4), (6, 1), (5, 2))),
    ("tensor_lr_in_parameter_dtype", "DTYPES", ("float64",)),
])
def test_a_promise_narrowed_back_lets_its_control_escape(monkeypatch, name, constant, narrowed):
    """norm_type 2 only, the shape classes without the shapes where the route test runs, float64 only:
    each is where the documented promise was checked before, and the bug its control plants passes there."""
    monkeypatch.setattr(promises, constant, narrowed)
    assert _ratios(broken_subjects()[name])[CAUGHT_BY[name]] < DETECTION_FACTOR
