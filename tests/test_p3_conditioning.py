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
from propositions.kit.protocol import derive_symbolic
from reference_impl.adam import clip_to_trust_region, moments_and_direction

from strategies import seeds

SMALL = Profile("test", frames=200, steps=2, long_run_steps=120, mp_dps=30, mp_samples=2)


@settings(max_examples=3)
@given(seed=seeds)
def test_real_optimizer_passes(seed):
    result = p3.CLAIM.run(seed, SMALL, "stiefel_adam")
    assert result.verdict == "pass", result.failures()
    assert [c.name for c in result.controls] == list(p3.CLAIM.control_names)
    assert all(c.detected for c in result.controls)


def test_elementwise_second_moment_fails_by_orders_of_magnitude():
    result = p3.CLAIM.run(2, SMALL, "elementwise_second_moment")
    assert result.verdict == "fail"
    by_name = {c.name: c for c in result.checks}
    tangency = by_name["step_stays_tangent[elementwise_second_moment]"]
    assert not tangency.passed and tangency.max_ratio > 1e6 * DETECTION_FACTOR
    assert not by_name["preconditioner_spread[elementwise_second_moment]"].passed
    # the reconstruction of the step's xi is still right: the control is caught for what it does
    assert by_name["step_reconstruction[elementwise_second_moment]"].passed


def test_recorded_control_detected():
    result = p3.CLAIM.run(4, SMALL)
    (control,) = result.controls
    assert control.name == "elementwise_second_moment" and control.detected and control.margin > 1e6


def test_symbolic_and_exact_parts():
    assert derive_symbolic(p3.CLAIM.symbolic).status == "proved"
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


def test_step_checks_read_the_steps_own_direction():
    evidence = p3.step_checks(0, SMALL, "stiefel_adam", frames=100, large=())
    checks, frames = evidence.checks, evidence.frames
    sources, coarse = sorted(evidence.extra["direction_source"]), evidence.extra["left_out"]["coarse"]
    assert sources == ["hook"] and frames > 0 and coarse == 0  # float64 bounds every ratio
    by_name = {c.name: c for c in checks}
    assert all(c.passed for c in checks)
    # both steps (t = 1 fresh, t = 2 from the returned state) are recorded
    assert by_name["preconditioner_spread[stiefel_adam]"].samples > frames
    # the spread is a rounding-level statement, not a loose one
    assert by_name["preconditioner_spread[stiefel_adam]"].to_dict()["bound"]["max"] < 1e-9


# Broken steps built here, each a plausible mistake the earlier checks (which rebuilt xi from the
# state, at t = 1 only) let through or caught only by accident.


def _moments(W, G, state, config):
    g = ri.project_tangent(W, G + config.weight_decay * W, validate=False)
    return moments_and_direction(g, state, config)


def _no_transport_step(W, G, state, config):
    """The first moment is stored as it is, not transported to the new frame (m+ = m)."""
    m, v, t, xi = _moments(W, G, state, config)
    return ri.polar_retract(W, xi, validate=False), ri.StiefelAdamState(m=m, v=v, t=t)


def _per_column_step(W, G, state, config):
    """xi divides each column of m^ by that column's root mean square (a per-column preconditioner),
    while the stored v is the algorithm's scalar."""
    m, v, t, _ = _moments(W, G, state, config)
    beta1, beta2 = config.betas
    m_hat = m / (1 - beta1**t)
    column_ms = np.mean(m_hat * m_hat, axis=-2, keepdims=True)
    share = column_ms / np.mean(m_hat * m_hat, axis=(-2, -1), keepdims=True)
    v_hat = (v / (1 - beta2**t))[..., None, None] * share
    xi = clip_to_trust_region(-config.lr * m_hat / (np.sqrt(v_hat) + config.eps), config.trust_radius)
    W_new = ri.polar_retract(W, xi, validate=False)
    return W_new, ri.StiefelAdamState(m=ri.project_tangent(W_new, m, validate=False), v=v, t=t)


def _qr_with_hook(W, G, state, config):
    """Reports the right xi but retracts with QR: W_new is not polar(W + xi)."""
    m, v, t, xi = _moments(W, G, state, config)
    W_new = ri.haar_from_gaussian(W + xi)
    return W_new, ri.StiefelAdamState(m=ri.project_tangent(W_new, m, validate=False), v=v, t=t), xi


def test_untransported_first_moment_fails():
    """Invisible in the direction of a step from a fresh state (m^ = g there): the stored m is off
    T_{W+}. (The step's xi then inherits the input's defect, which its tangency bound carries;
    the state check is the one that names the stage.)"""
    variant = ri.Variant("no_transport", "m+ = m, not P_{W+}(m)", ("P3",), ri.init, _no_transport_step)
    result = p3.CLAIM.run(3, SMALL, variant)
    assert result.verdict == "fail"
    by_name = {c.name: c for c in result.checks}
    assert by_name["state_stays_tangent[no_transport]"].max_ratio > 1e6
    assert result.extra["direction_source"] == ["inverse"]


def test_per_column_preconditioner_fails_on_the_spread():
    variant = ri.Variant("per_column", "per-column preconditioner, scalar v stored", ("P3",), ri.init, _per_column_step)
    evidence = p3.step_checks(1, SMALL, variant, frames=100, large=())
    by_name = {c.name: c for c in evidence.checks}
    assert sorted(evidence.extra["direction_source"]) == ["inverse"]
    assert by_name["preconditioner_spread[per_column]"].max_ratio > 1e6
    assert by_name["direction_matches_state[per_column]"].max_ratio > 1e3
    # the direction recovered from W_new is the one retracted: only the preconditioner is wrong
    assert by_name["step_reconstruction[per_column]"].passed


def test_step_whose_reported_xi_was_not_retracted_fails_reconstruction():
    variant = ri.Variant("qr_hooked", "reports xi, retracts by QR", ("P3",), ri.init, step_with_direction=_qr_with_hook)
    evidence = p3.step_checks(2, SMALL, variant, frames=100, large=())
    by_name = {c.name: c for c in evidence.checks}
    assert sorted(evidence.extra["direction_source"]) == ["hook"]
    assert by_name["step_reconstruction[qr_hooked]"].max_ratio > 1e6
    assert by_name["preconditioner_spread[qr_hooked]"].passed


def test_entrywise_projection_error_covers_a_high_precision_projection():
    from reference_impl.highprec import project_tangent_mp

    rng = rng_for(0, "test", "entrywise")
    W = ri.random_point(7, 3, rng, (3,))
    G = rng.standard_normal(W.shape) * 10.0 ** rng.uniform(-5, 5, size=(3, 1, 1))
    computed = ri.project_tangent(W, G)
    bound = p3.entrywise_projection_error(W, G)
    for k in range(3):
        exact = project_tangent_mp(W[k], G[k], dps=40)
        error = np.array([[abs(float(exact[i, j] - computed[k, i, j])) for j in range(3)] for i in range(7)])
        assert np.all(error <= bound[k])
        assert np.any(error > 0)


def test_polar_error_bound_scales_with_cond_and_covers_highprec():
    # linear in cond: the backward error's share grows with cond, the loss of orthonormality does not
    b1, b2, b3 = (float(p3.polar_error_bound(8, 3, c)) for c in (1.0, 2.0, 3.0))
    assert b3 - b2 == pytest.approx(b2 - b1) and 0 < b2 - b1 < b1
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


def test_the_frame_steps_left_out_are_counted_over_every_chunk():
    # a black box's direction is recovered from W_new; some frame-steps are left out of the spread,
    # and the description of the merged check must count those of every chunk, not of the first
    from certify.outside import adapters

    variant = adapters.resolve("reference_impl")
    chunks = p3._tangent_chunks(p3.shape_plan(SMALL, frames=150, large=()))
    per_chunk = [p3.step_chunk(chunk, 0, variant).extra["left_out"] for chunk in chunks]
    unrecoverable, coarse = sum(c["unrecoverable"] for c in per_chunk), sum(c["coarse"] for c in per_chunk)
    merged = p3.step_checks(0, SMALL, variant, frames=150, large=()).checks
    spread = next(check for check in merged if check.name.startswith("preconditioner_spread"))
    assert sum(c["unrecoverable"] > 0 for c in per_chunk) >= 2  # more than the first chunk's count is at stake
    assert unrecoverable > 0 and coarse == 0
    assert f"; {unrecoverable} frame-steps left out" in spread.description
    assert spread.description.count("frame-steps left out") == 1


def test_a_spread_without_a_bound_is_left_out_and_counted_not_judged():
    # two frames (d = r = 1) with the same ratio -xi / m^ = 1: the first's entry error bound,
    # allowance / (|m| - allowance) = 0.875 with a recovery error 0.43, makes the ratio's relative
    # error e = 1.68 >= 1, where 2 e / (1 - e) is no bound; the second is an ordinary frame
    from types import SimpleNamespace

    m = np.array([3.0, 3.0]).reshape(2, 1, 1)
    step = SimpleNamespace(count=2, d=1, r=1, m=m, m_hat=m, xi=-m, allowance=np.array([1.4, 1e-12]).reshape(2, 1, 1),
                           recovery_error=np.array([0.9, 0.0]), precision=p3.precisions.FLOAT64)
    residual, bound, recoverable, coarse = p3._spread(step)
    assert coarse == 1 and recoverable.tolist() == [False, True]
    assert residual.shape == (1,) and np.all(bound > 0) and np.all(residual <= bound)
