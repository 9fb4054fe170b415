"""Tests of the trajectory comparison (propositions/kit/trajectories.py) and of its model.

Each broken variant below is the real step with one plausible mistake, built from reference_impl's
own functions; the comparison must fail it and pass the real optimizer. Several of these mistakes
pass every other check of the claims, because those look at the first step from a fresh state or
compare the optimizer with itself under a symmetry.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

import reference_impl as ri
from reference_impl import highprec
from reference_impl.adam import StiefelAdamState, check_step_inputs, clip_to_trust_region, frobenius, scale_free_direction
from reference_impl.manifold import polar_retract, project_tangent

from propositions import p3_conditioning
from propositions._common import DETECTION_FACTOR, PROFILES, Profile, rng_for, u
from propositions.kit import model as model_module
from propositions.kit.model import model_step
from propositions import trajectory_plans
from propositions.kit.trajectories import one_step_bound, trajectory_agreement

PLANS = trajectory_plans()  # each claim's TRAJECTORIES

QUICK = PROFILES["quick"]


def _transpose(A):
    return np.swapaxes(A, -1, -2)


def _step(W, G, state, config, *, stored_m="m", count=1, bias_after_first=True, cap_stored_m=False,
          retraction="polar", trust_norm="frames", v_mode="scalar", transport=True):
    """The real step (docs/algorithm.md) with one stage replaceable; every default is correct."""
    check_step_inputs(W, G, state, config)
    beta1, beta2 = config.betas
    d, r = W.shape[-2:]
    g = project_tangent(W, G + config.weight_decay * W, validate=False)
    m = beta1 * state.m + (1 - beta1) * g
    if v_mode == "axis12":  # a norm over axis=(1, 2): right for (count, d, r) only
        square = np.sum(g * g, axis=(1, 2)) / (d * r)
    else:
        square = np.sum(g * g, axis=(-2, -1)) / {"scalar": d * r, "no_dr_after_first": d * r if state.t == 0 else 1,
                                                  "per_d": d, "shared": d * r}[v_mode]
    if v_mode == "shared":  # one statistic for the whole batch
        square = np.broadcast_to(np.mean(square), square.shape)
    v = beta2 * state.v + (1 - beta2) * square
    t = state.t + 1
    corrected = bias_after_first or t == 1
    m_hat = m / (1 - beta1**t) if corrected else m
    v_hat = v / (1 - beta2**t) if corrected else v
    xi = scale_free_direction(m_hat, v_hat, config.lr, config.eps)
    raw_norm = frobenius(xi)
    if trust_norm == "flattened" and xi.ndim > 3:  # per sample of the first axis, as in flattened torch code
        norm = np.sqrt(np.sum(xi * xi, axis=tuple(range(1, xi.ndim)), keepdims=True))
        xi = xi * np.where(norm > config.trust_radius, config.trust_radius / norm, 1.0)
    else:
        xi = clip_to_trust_region(xi, config.trust_radius)
    if cap_stored_m:
        m = m * np.minimum(1.0, config.trust_radius / np.where(raw_norm > 0, raw_norm, 1.0))[..., None, None]
    A = W + xi
    if retraction == "second_order":
        W_new = A - 0.5 * A @ (_transpose(xi) @ xi)
    elif retraction == "newton_schulz_1":
        W_new = 1.5 * A - 0.5 * A @ (_transpose(A) @ A)
    elif retraction == "closed_form":
        W_new = polar_retract(W, xi, "closed_form", validate=False)
    else:
        W_new = polar_retract(W, xi, "svd", validate=False)
    stored = m_hat if stored_m == "m_hat" else m
    m_new = project_tangent(W_new, stored, validate=False) if transport else stored
    return W_new, StiefelAdamState(m=m_new, v=v, t=state.t + count)


def _variant(name, **mistake):
    return ri.Variant(name, f"the real step with {mistake}", (), ri.init, lambda W, G, s, c: _step(W, G, s, c, **mistake))


CORRECT = _variant("composed_correct")
# each mistake, and the claim whose trajectories are asked to catch it in the tests below (the
# report's matrix runs every mistake against every claim)
BROKEN = {
    "m_hat_stored": (dict(stored_m="m_hat"), "P1"),
    "t_not_incremented": (dict(count=0), "P1"),
    "bias_correction_off_after_first": (dict(bias_after_first=False), "P1"),
    "cap_on_stored_m": (dict(cap_stored_m=True), "P1"),
    "m_not_transported": (dict(transport=False), "P1"),
    "second_order_retraction": (dict(retraction="second_order"), "P3"),
    "one_newton_schulz_iteration": (dict(retraction="newton_schulz_1"), "P3"),
    # exact for tangent xi at an exact frame; wrong where rounding leaves xi a normal part that is not
    # small against xi: noise-driven steps (G in the normal space) and strong weight decay
    "closed_form_retraction": (dict(retraction="closed_form"), "P2"),
    "trust_norm_over_flattened_batch": (dict(trust_norm="flattened"), "P4"),
    "norm_over_axis_1_2": (dict(v_mode="axis12"), "P4"),
    "v_shared_across_frames": (dict(v_mode="shared"), "P4"),
    "v_without_dr_after_first": (dict(v_mode="no_dr_after_first"), "P2"),
    "v_over_d_only": (dict(v_mode="per_d"), "P5"),
}


def _broken(name):
    return _variant(name, **BROKEN[name][0])


def _by_kind(checks):
    return {c.name.split("[")[0]: c for c in checks}


@pytest.mark.parametrize("claim", sorted(PLANS))
def test_real_optimizer_and_composed_copy_pass(claim):
    for optimizer in ("stiefel_adam", CORRECT):
        checks = trajectory_agreement(3, QUICK, optimizer, PLANS[claim])
        assert all(c.passed for c in checks), [(c.name, c.max_ratio) for c in checks if not c.passed]
        assert all(c.samples > 0 for c in checks)


@pytest.mark.parametrize("name", sorted(BROKEN))
def test_each_mistake_is_caught_by_the_trajectories(name):
    checks = trajectory_agreement(1, QUICK, _broken(name), PLANS[BROKEN[name][1]])
    failed = [c for c in checks if not c.passed]
    assert failed, name
    # a clear miss: far above the rounding bound, or a t that differs (integers agree exactly or not at all)
    assert any(c.max_ratio >= DETECTION_FACTOR or c.name.startswith("trajectory_model_bookkeeping") for c in failed)


def _fails_only_in(name, claims):
    return {claim: not all(c.passed for c in trajectory_agreement(1, QUICK, _broken(name), PLANS[claim])) for claim in claims}


def test_two_leading_axes_catch_a_flattened_batch_norm():
    # right for bare frames and one leading axis: only the (3, 2) and (2, 1, 2) batches of P4 expose it
    variant = _broken("trust_norm_over_flattened_batch")
    W = ri.random_point(5, 2, rng_for(0, "flat"), (4,))
    G = rng_for(1, "flat").standard_normal(W.shape)
    config = ri.StiefelAdamConfig(lr=0.5, trust_radius=0.3)
    W_a, _ = variant.step(W, G, ri.init(W), config)
    W_b, _ = ri.step(W, G, ri.init(W), config)
    assert np.array_equal(W_a, W_b)
    assert _fails_only_in("trust_norm_over_flattened_batch", ("P1", "P4")) == {"P1": False, "P4": True}


def test_norm_over_axis_1_2_fails_on_bare_frames_and_two_leading_axes_not_on_one():
    variant = _broken("norm_over_axis_1_2")
    checks = _by_kind(trajectory_agreement(0, QUICK, variant, PLANS["P4"]))
    assert math.isinf(checks["trajectory_model_bookkeeping"].max_ratio)
    assert "raised" in checks["trajectory_model_W"].worst["error"] or "shape" in checks["trajectory_model_W"].worst["error"]
    W = ri.random_point(4, 2, rng_for(0, "axis12"), (3,))
    G = rng_for(1, "axis12").standard_normal(W.shape)
    config = ri.StiefelAdamConfig()
    assert np.array_equal(variant.step(W, G, ri.init(W), config)[0], ri.step(W, G, ri.init(W), config)[0])


def test_bookkeeping_mistakes_pass_the_first_step_from_a_fresh_state():
    # why these need trajectories: the first fresh step of each is the real one's W
    W = ri.random_point(6, 3, rng_for(0, "first"), (5,))
    G = rng_for(1, "first").standard_normal(W.shape)
    config = ri.StiefelAdamConfig(lr=0.1, trust_radius=2.0)
    W_real, _ = ri.step(W, G, ri.init(W), config)
    for name in ("t_not_incremented", "bias_correction_off_after_first", "v_without_dr_after_first", "m_not_transported"):
        W_broken, _ = _broken(name).step(W, G, ri.init(W), config)
        assert np.array_equal(W_broken, W_real), name
        assert not all(c.passed for c in trajectory_agreement(2, QUICK, _broken(name), PLANS["P1"])), name


def test_small_step_retractions_caught_at_large_trust_radii():
    for name in ("second_order_retraction", "one_newton_schulz_iteration"):
        checks = _by_kind(trajectory_agreement(0, QUICK, _broken(name), PLANS["P3"]))
        assert checks["trajectory_model_W"].max_ratio > 1e6, name


def test_elementwise_second_moment_gives_inf_not_an_exception():
    for claim in ("P1", "P2"):  # fresh states (its own init) and warm states (a spec state it rejects)
        checks = _by_kind(trajectory_agreement(0, QUICK, "elementwise_second_moment", PLANS[claim]))
        for kind in ("trajectory_model_W", "trajectory_model_m", "trajectory_model_v", "trajectory_model_bookkeeping"):
            assert math.isinf(checks[kind].max_ratio), (claim, kind)
        assert checks["trajectory_model_W"].worst["error"]


def test_a_step_that_modifies_its_input_fails():
    def step(W, G, state, config):
        W_new, state_new = ri.step(W, G, state, config)
        state.m[...] = state_new.m  # in place: the caller's state changes under it
        return W_new, state_new

    variant = ri.Variant("in_place", "the real step writing m into its input", (), ri.init, step)
    checks = _by_kind(trajectory_agreement(0, QUICK, variant, PLANS["P1"]))
    assert math.isinf(checks["trajectory_model_m"].max_ratio)
    assert "modified its input" in checks["trajectory_model_m"].worst["error"]


def test_whole_claim_fails_with_a_bookkeeping_mistake():
    small = Profile("test", frames=200, steps=2, long_run_steps=50, mp_dps=30, mp_samples=2)
    variant = _broken("m_hat_stored")
    result = p3_conditioning.CLAIM.run(0, small, variant)
    assert result.verdict == "fail"
    assert any(f.startswith("check trajectory_model_m[m_hat_stored]") for f in result.failures())
    # the real optimizer passes the same run: tests/test_p3_conditioning.py::test_real_optimizer_passes


# --------------------------------------------------------------------------------------------
# The model on its own
# --------------------------------------------------------------------------------------------


def test_model_shares_no_code_with_reference_impl():
    import ast
    import inspect

    tree = ast.parse(inspect.getsource(model_module))
    imported = {alias.name for node in ast.walk(tree) if isinstance(node, ast.Import) for alias in node.names}
    imported |= {node.module or "" for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)}
    assert not any("reference_impl" in name or "propositions" in name for name in imported), imported


@pytest.mark.parametrize("lead", [(), (3,), (3, 2)])
@pytest.mark.parametrize("d,r", [(1, 1), (4, 1), (3, 3), (7, 3)])
def test_model_agrees_with_reference_within_the_bound(lead, d, r):
    rng = rng_for(0, "model", d, r, *lead)
    W = ri.random_point(d, r, rng, lead)
    state = ri.StiefelAdamState(m=ri.random_tangent(W, rng), v=np.asarray(rng.uniform(0.5, 2.0, size=lead)), t=7)
    for config in (ri.StiefelAdamConfig(lr=0.3, trust_radius=0.5, weight_decay=0.2),
                   ri.StiefelAdamConfig(lr=0.7, eps=0.0, trust_radius=math.inf)):
        G = rng.standard_normal(W.shape)
        W_ref, state_ref = ri.step(W, G, state, config)
        out = model_step(W, G, state.m, state.v, state.t, config)
        bound = one_step_bound(W, G, state.m, state.v, state.t, config, out)
        assert out.t == state_ref.t == 8
        assert np.all(frobenius(out.W - W_ref) <= 2 * bound.W)
        assert np.all(frobenius(out.m - state_ref.m) <= 2 * bound.m)
        assert np.all(np.abs(out.v - state_ref.v) <= 2 * bound.v)
        assert np.all(bound.W < 1e-11)  # the bound is a rounding bound, not a loose one


def test_model_agrees_with_highprec_twin():
    rng = rng_for(0, "model-twin")
    for d, r in ((3, 1), (4, 2), (3, 3)):
        W = ri.random_point(d, r, rng)
        state = ri.init(W)
        config = ri.StiefelAdamConfig(lr=0.9, trust_radius=1.5, weight_decay=0.1)
        for _ in range(3):
            G = rng.standard_normal(W.shape)
            out = model_step(W, G, state.m, state.v, state.t, config)
            bound = one_step_bound(W, G, state.m, state.v, state.t, config, out)
            W_mp, state_mp = highprec.step_mp(W, G, state, config, dps=40)
            assert frobenius(out.W - highprec.to_float64(W_mp)) <= bound.W + u * math.sqrt(r)
            assert frobenius(out.m - highprec.to_float64(state_mp.m)) <= bound.m + u * frobenius(out.m)
            W, state = ri.step(W, G, state, config)


def test_model_is_exactly_spec_on_a_hand_example():
    # d = 2, r = 1, W = e1, G = (3, 4), dyadic betas and lr: g = (0, 4), m = (0, 2), v = 0.25 * 16 / 2 = 2,
    # m^ = (0, 4), v^ = 8, xi = -lr m^ / sqrt(8) = (0, -s) with s = sqrt(2) / 8, W+ = (1, -s) / sqrt(1 + s^2),
    # m+ = m - W+ (W+^T m) = 2 (s, 1) / (1 + s^2)
    config = ri.StiefelAdamConfig(lr=0.125, betas=(0.5, 0.75), eps=0.0, trust_radius=math.inf)
    W = np.array([[1.0], [0.0]])
    out = model_step(W, np.array([[3.0], [4.0]]), np.zeros((2, 1)), np.zeros(()), 0, config)
    s = math.sqrt(2) / 8
    assert out.t == 1 and out.v == 2.0 and abs(out.v_hat - 8.0) <= 4 * u * 8.0  # 1 - beta2 via expm1: a few ulps
    assert np.allclose(out.W, np.array([[1.0], [-s]]) / math.sqrt(1 + s * s), rtol=0, atol=4 * u)
    assert np.allclose(out.m, 2 * np.array([[s], [1.0]]) / (1 + s * s), rtol=0, atol=16 * u)


def test_model_rejects_mismatched_shapes():
    W = ri.random_point(4, 2, rng_for(0, "shapes"), (3,))
    with pytest.raises(ValueError, match="v of shape"):
        model_step(W, W, W, np.zeros((3, 4, 2)), 0, ri.StiefelAdamConfig())


def test_an_inconclusive_well_posedness_reason_gives_the_count_the_shape_and_a_case():
    """At a coarse precision, frame-steps that are not well posed are not compared; the reason names
    how many, at which shapes, and one case to reproduce (its setting, shape, frame and step)."""
    from propositions._common import NumericalCheck
    from propositions.kit.trajectories import _case_text

    check = NumericalCheck("trajectory_model_well_posed[x]", "d", "b")
    extra = {"setting": "fresh_capped_1", "lr": 0.5, "betas": [0.9, 0.999], "eps": 1e-8, "trust_radius": 1.0, "weight_decay": 0.0,
             "lead": [3], "index_layout": "(step - 1) * frames + frame"}
    check.add([0.0, 0.0, 0.0, 0.0, 1.0, 1.0], 0.5, shape=(6, 6), key=("trajectories", "P3", "fresh_capped_1", 6, 6, "3"), seed=0, extra=extra)
    assert check.exceeding() == 2 and not check.passed
    assert _case_text(check.worst) == ("setting fresh_capped_1 (lr 0.5, betas (0.9, 0.999), eps 1e-08, Delta 1, lambda 0), shape (6, 6), "
                                       "frame 1 of a batch (3,), step 2, seed 0 (key trajectories/P3/fresh_capped_1/6/6/3)")
