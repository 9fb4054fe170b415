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
    "clip_total_in_gradient_dtype": "promise/clip_total_dtype",
    # rows without a gradient: nothing counted, so the total is also the float32 zero of "no gradient"
    "clip_group_tensor_by_rows": ("promise/clip_matches_torch", "promise/clip_total_dtype"),
    "retraction_method_ignored": "promise/class_is_kernel",
    "tolerance_storage_term_over_sqrt_r": "promise/tolerance_decides",
    "named_load_without_position": "promise/named_checkpoint",
    "refusal_without_name": "promise/named_refusal",
    "older_checkpoint_skips": "promise/older_checkpoint_defaults",
    "kernel_default_beta1": "promise/documented_defaults",
    "unpickled_without_call_record": "promise/pickle_round_trip",
    "step_not_marked_for_scheduler": "promise/scheduler_sees_step",
    "buckets_ignore_dtype": "promise/mixed_dtypes",
    "off_manifold_also_skipped": "promise/counts_each_frame_once",
    "joined_view_ignores_gap": "promise/joined_states_with_gap",
    "clip_total_of_nothing_is_one": "promise/edge_inputs",
    "drift_bound_kappa_cubed": "promise/derived_constants",
    "newton_schulz_count_from_two": "promise/derived_constants",
    "route_rule_sigma_four_times": "promise/route_test_as_documented",
    "counts_on_default_device": "promise/state_on_parameter_device",
    "ordinary_moment_on_default_device": "promise/state_on_parameter_device",
}


def _catching(name) -> tuple:
    caught = CAUGHT_BY[name]
    return caught if isinstance(caught, tuple) else (caught,)


def _ratios(subject) -> dict:
    return {check.name: check.max_ratio for check in promises.promise_checks(subject, 0)}


def test_the_real_optimizer_keeps_every_promise():
    ratios = _ratios(real_subject())
    assert set(ratios) == {name for caught in CAUGHT_BY for name in _catching(caught)} and all(ratio <= 1 for ratio in ratios.values()), ratios


def test_every_promise_control_is_listed_here():
    assert {name for name, spec in CONTROLS.items() if spec.part == "promises"} == set(CAUGHT_BY)


@pytest.mark.parametrize("name", list(CAUGHT_BY))
def test_each_promise_control_is_caught_by_its_own_check_alone(name):
    assert CONTROLS[name].part == "promises"
    ratios = _ratios(broken_subjects()[name])
    assert all(ratios[check] >= DETECTION_FACTOR for check in _catching(name)), ratios
    assert all(ratio <= 1 for check, ratio in ratios.items() if check not in _catching(name)), ratios


@pytest.mark.parametrize("name", list(CAUGHT_BY))
def test_a_promise_control_runs_its_own_promise_alone(name):
    """The control's regime: the sibling runs of its promise only, which detect it as the whole part does."""
    checks = promises.promise_checks(broken_subjects()[name], 0, only=CONTROLS[name].promise)
    assert {check.name for check in checks} >= set(_catching(name))
    assert max(check.max_ratio for check in checks) >= DETECTION_FACTOR


@pytest.mark.parametrize("name, constant, narrowed", [
    ("clip_ignores_norm_type", "NORM_TYPES", (2.0,)),
    ("sync_free_without_sharper_test", "SYNC_SHAPES", ((4, 4), (6, 1), (5, 2))),
    ("tensor_lr_in_parameter_dtype", "DTYPES", ("float64",)),
    ("clip_total_in_gradient_dtype", "DTYPE_MIXES", (("float64",), ("float32",), ("float32", "bfloat16"), ("float64", "float32"))),
    ("clip_group_tensor_by_rows", "CLIP_FORMS", ("tensors", "frame_group")),
    ("tolerance_storage_term_over_sqrt_r", "TOLERANCE_SHAPES", ((6, 1),)),
    ("tolerance_storage_term_over_sqrt_r", "DTYPES", ("float64", "float32")),
])
def test_a_promise_narrowed_back_lets_its_control_escape(monkeypatch, name, constant, narrowed):
    """norm_type 2 only, the shape classes without the shapes where the route test runs, float64 only:
    each is where the documented promise was checked before, and the bug its control plants passes there."""
    monkeypatch.setattr(promises, constant, narrowed)
    ratios = _ratios(broken_subjects()[name])
    assert all(ratios[check] < DETECTION_FACTOR for check in _catching(name)), ratios
