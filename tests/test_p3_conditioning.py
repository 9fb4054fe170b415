"""Tests of P3 (conditioning): the claim passes for the real optimizer, fails for the elementwise
second moment, and its pieces (bounds, rank-one tangents, the step's reconstructed direction, the
long-run record and the conditioning figure) do what they say."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
from hypothesis import given, settings

import reference_impl as ri
from propositions import p3_conditioning as p3
from propositions._common import DETECTION_FACTOR, Profile, rng_for

from strategies import seeds

SMALL = Profile("test", frames=200, steps=2, long_run_steps=120, mp_dps=30, mp_samples=2)


@settings(max_examples=3)
@given(seed=seeds)
def test_real_optimizer_passes(seed):
    result = p3.CLAIM.run(seed, SMALL, "stiefel_adam")
    assert result.verdict == "pass", result.failures()
    assert [c.name for c in result.controls] == list(p3.CONTROLS)
    assert all(c.detected for c in result.controls)


def test_elementwise_second_moment_fails_by_orders_of_magnitude():
    result = p3.CLAIM.run(2, SMALL, "elementwise_second_moment")
    assert result.verdict == "fail"
    by_name = {c.name: c for c in result.checks}
    tangency = by_name["step_stays_tangent[elementwise_second_moment]"]
    assert not tangency.passed and tangency.max_ratio > 1e6 * DETECTION_FACTOR
    assert not by_name["preconditioner_condition_number[elementwise_second_moment]"].passed
    # the reconstruction of the step's xi is still right: the control is caught for what it does
    assert by_name["step_reconstruction[elementwise_second_moment]"].passed


def test_recorded_control_detected():
    result = p3.CLAIM.run(4, SMALL)
    (control,) = result.controls
    assert control.name == "elementwise_second_moment" and control.detected and control.margin > 1e6


def test_symbolic_and_exact_parts():
    assert p3.symbolic_part().status == "proved"
    assert all(record["passed"] for record in p3.exact_part(7))


def test_rank_one_tangent_is_tangent_and_attains_bound():
    rng = rng_for(0, "test", "rank-one")
    W = ri.random_point(9, 4, rng, (5,))
    delta = 0.7
    xi = p3.rank_one_tangent(W, rng, delta)
    assert np.allclose(np.linalg.norm(xi, axis=(-2, -1)), delta, rtol=0, atol=1e-15)
    assert np.max(np.abs(np.swapaxes(W, -1, -2) @ xi)) < 1e-15
    assert np.all(np.linalg.matrix_rank(xi) == 1)
    singular = np.linalg.svd(W + xi, compute_uv=False)
    assert np.allclose(singular[:, 0] / singular[:, -1], math.sqrt(1 + delta**2), rtol=0, atol=1e-14)


def test_random_tangents_stay_below_bound_in_figure():
    figure = p3.conditioning_figure(3)
    bound = np.asarray(figure["bound"])
    assert np.all(np.asarray(figure["max_cond_random"]) <= bound * (1 + 1e-13))
    assert np.allclose(figure["cond_rank_one"], bound, rtol=1e-13, atol=0)
    assert len(figure["delta"]) == len(figure["bound"]) == len(figure["max_cond_random"])


def test_step_direction_of_real_step_is_scalar_and_tangent():
    rng = rng_for(0, "test", "step-direction")
    W = ri.random_point(6, 3, rng, (4,))
    G = rng.standard_normal(W.shape) * 1e20
    W_new, xi, preconditioner, g = p3.step_direction(W, G, "stiefel_adam", p3.STEP_CONFIG)
    flat = preconditioner.reshape(4, -1)
    assert np.all(flat.max(axis=-1) == flat.min(axis=-1))
    assert np.max(np.linalg.norm(ri.polar_retract(W, xi) - W_new, axis=(-2, -1))) < 1e-14
    WtXi = np.swapaxes(W, -1, -2) @ xi
    assert np.max(np.abs(WtXi + np.swapaxes(WtXi, -1, -2))) < 1e-15


def test_polar_error_bound_scales_with_cond_and_covers_highprec():
    assert p3.polar_error_bound(8, 3, 2.0) == pytest.approx(2 * p3.polar_error_bound(8, 3, 1.0))
    check, samples = p3.highprec_check(1, SMALL)
    assert check.passed and len(samples) == SMALL.mp_samples
    assert all(sample["residual"] > 0 for sample in samples)  # float64 is not exact: the oracle sees it


def test_long_run_records_checkpoints_and_growth():
    check, summary, figure = p3.long_run(0, SMALL, "stiefel_adam")
    assert check.passed and check.samples == SMALL.long_run_steps * p3.LONG_RUN_BATCH
    assert set(summary["max_feasibility_at"]) == {"1", "10", "100"}
    assert math.isfinite(summary["growth_slope_loglog"])
    assert figure["steps"][0] == 1 and figure["steps"][-1] == SMALL.long_run_steps
    assert all(f <= figure["bound"] for f in figure["max_feasibility"])


def test_long_run_bound_is_violated_by_a_drifting_frame():
    """The feasibility bound is tight enough to see a float32-level drift (docs/algorithm.md#pitfalls)."""
    d, r = p3.LONG_RUN_SHAPE
    rng = rng_for(0, "test", "drift")
    W = ri.random_point(d, r, rng, (1,))
    drifted = W + 1e-7 * rng.standard_normal(W.shape)
    assert ri.feasibility(drifted)[0] > 1e3 * p3.feasibility_bound(d, r)
    assert ri.feasibility(W)[0] <= p3.feasibility_bound(d, r)


def test_result_is_json_ready_with_figures():
    body = p3.CLAIM.run(1, SMALL).to_dict()
    json.dumps(body)
    assert set(body["figures"]) == {"conditioning_bound", "long_run_feasibility"}
    assert body["extra"]["long_run"]["steps"] == SMALL.long_run_steps
