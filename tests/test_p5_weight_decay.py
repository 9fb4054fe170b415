"""P5: coupled weight decay has zero Riemannian gradient. The certificate passes for the real step,
fails for each control it names, and its bounds are tight enough to catch small violations."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings

import reference_impl as ri
from propositions import p5_weight_decay as p5
from propositions._common import Profile, chunk_sizes, rng_for
from propositions.kit.protocol import derive_symbolic
from reference_impl.manifold import polar_retract, project_tangent

from strategies import seeds

# A reduced profile: every shape of the plan, fewer frames and steps, to keep the tests fast.
SMALL = Profile("test", frames=200, steps=2, long_run_steps=10, mp_dps=30, mp_samples=2)


@pytest.fixture(scope="module")
def real_result():
    return p5.CLAIM.run(7, SMALL)


@settings(max_examples=2, deadline=None)
@given(seed=seeds)
def test_real_step_passes(seed):
    result = p5.CLAIM.run(seed, SMALL)
    assert result.verdict == "pass", result.failures()
    assert result.frames >= SMALL.frames


def test_certificate_content(real_result):
    body = real_result.to_dict()
    assert body["symbolic"]["status"] == "proved"
    assert {e["name"] for e in body["exact"]} == {
        "decay_projection_zero", "step_weight_decay_invariance", "decoupled_decay_polar", "norm_constant",
    }
    assert all(e["passed"] for e in body["exact"])
    names = {c["name"] for c in body["numerical"]["checks"]}
    assert names == {
        "decay_projection_zero", "decoupled_decay_polar", "step_weight_decay_invariance",
        "trajectory_weight_decay_invariance", "norm_constant", "gradient_weight_decay_invariance",
        "direction_weight_decay_invariance",
    } | {f"trajectory_model_{part}[stiefel_adam]" for part in ("W", "m", "v", "bookkeeping", "well_posed")}
    shapes = {tuple(s) for c in body["numerical"]["checks"] for s in c["shapes"]}
    assert {(1, 1), (16, 16), (1024, 128)} <= shapes
    assert {c["name"]: c["detected"] for c in body["controls"]} == {"euclidean_adamw": True, "unprojected_decay": True}


@pytest.mark.parametrize("control", p5.CLAIM.control_names)
def test_control_as_optimizer_fails(control):
    result = p5.CLAIM.run(3, SMALL, optimizer=control)
    assert result.verdict == "fail"
    failed = {c.name for c in result.checks if not c.passed}
    # the optimizer-independent identities still hold; the step-level consequences do not
    assert "decay_projection_zero" not in failed and "decoupled_decay_polar" not in failed
    assert "step_weight_decay_invariance" in failed


def test_figure_shows_adamw_shrinking(real_result):
    figure = real_result.figures["weight_norm"]
    assert figure.kind == "line"
    real_series, adamw_series, _ = figure.series
    steps = real_series.x
    real = np.array(real_series.y)
    adamw = np.array(adamw_series.y)
    r = p5.FIGURE_SHAPE[1]
    assert len(real) == len(adamw) == len(steps) == p5.FIGURE_STEPS + 1
    assert np.max(np.abs(real**2 - r)) <= p5.norm_constant_bound(*p5.FIGURE_SHAPE)
    assert adamw[-1] < 0.5 * math.sqrt(r)


# ---------------------------------------------------------------------------------------------
# The bounds: positive, and small enough that a violation of the identity shows.
# ---------------------------------------------------------------------------------------------


def test_decay_projection_bound_catches_drift():
    rng = rng_for(0, "test", "drift")
    for d, r in [(1, 1), (8, 3), (64, 16)]:
        W = ri.random_point(d, r, rng, batch=(20,))
        bound = p5.decay_projection_bound(d, r)
        assert np.all(np.linalg.norm(project_tangent(W, W, validate=False), axis=(-2, -1)) <= bound)
        # a frame off the manifold by 1e-9 in scale: P_W(W) = W (I - W^T W) ~ 2e-9 sqrt(r)
        drifted = (1 + 1e-9) * W
        assert np.all(np.linalg.norm(project_tangent(drifted, drifted, validate=False), axis=(-2, -1)) > 10 * bound)


def test_decoupled_decay_bound_catches_sign_flip_and_rescaling():
    rng = rng_for(0, "test", "decoupled")
    d, r = 12, 5
    W = ri.random_point(d, r, rng, batch=(10,))
    bound = p5.decoupled_decay_bound(d, r)
    assert np.all(np.linalg.norm(polar_retract(0.25 * W, np.zeros_like(W), validate=False) - W, axis=(-2, -1)) <= bound)
    # alpha < 0 is not a decay: polar(-W) = -W, at distance 2 sqrt(r)
    assert np.all(np.linalg.norm(polar_retract(-W, np.zeros_like(W), validate=False) - W, axis=(-2, -1)) > 1e10 * bound)
    # no retraction (AdamW): (1 - 1e-6) W differs from W by 1e-6 sqrt(r)
    assert np.all(np.linalg.norm((1 - 1e-6) * W - W, axis=(-2, -1)) > 1e3 * bound)


def test_norm_constant_bound_catches_a_decoupled_decay_of_1e_8():
    rng = rng_for(0, "test", "norm")
    for d, r in [(2, 2), (16, 4), (1024, 128)]:
        W = ri.random_point(d, r, rng, batch=(2,))
        bound = p5.norm_constant_bound(d, r)
        assert np.all(np.abs(np.sum(W * W, axis=(-2, -1)) - r) <= bound)
        # one AdamW decay with lr lambda = 1e-8: ||W||^2 - r = -2e-8 r, far outside the bound
        shrunk = (1 - 1e-8) * W
        assert np.all(np.abs(np.sum(shrunk * shrunk, axis=(-2, -1)) - r) > 10 * bound)


def test_step_difference_bound_scale_free_and_small():
    rng = rng_for(0, "test", "step_bound")
    d, r = 16, 4
    W = ri.random_point(d, r, rng, batch=(50,))
    G = rng.standard_normal(W.shape)
    state = ri.init(W)
    for lam in (0.0, 1e-6, 1e3):
        config = ri.StiefelAdamConfig(weight_decay=lam)
        bound = p5.step_difference_bound(W, G, state, config, lam)
        assert np.all(bound > 0) and np.all(np.isfinite(bound))
        # far below the step length lr sqrt(d r), so a decay that reaches the step is seen
        assert np.all(bound < 1e-6 * config.lr * math.sqrt(d * r))
    # with lambda = 0 and eps = 0 the bound is invariant under the scale of G up to rounding:
    # the step is scale free and so is its error analysis
    config = ri.StiefelAdamConfig(eps=0.0)
    small = p5.step_difference_bound(W, 1e-6 * G, state, config, 0.0)
    large = p5.step_difference_bound(W, 1e6 * G, state, config, 0.0)
    np.testing.assert_allclose(small, large, rtol=1e-12)


def test_step_difference_bound_holds_for_the_real_step_and_not_for_unprojected_decay():
    rng = rng_for(1, "test", "step")
    d, r = 8, 3
    W = ri.random_point(d, r, rng, batch=(100,))
    G = 1e-2 * rng.standard_normal(W.shape)
    lam = 1.0
    config, config_free = ri.StiefelAdamConfig(weight_decay=lam), ri.StiefelAdamConfig()
    state = ri.init(W)
    bound = p5.step_difference_bound(W, G, state, config, lam)
    difference = np.linalg.norm(ri.step(W, G, state, config)[0] - ri.step(W, G, state, config_free)[0], axis=(-2, -1))
    assert np.all(difference <= bound)
    wrong = ri.get_variant("unprojected_decay")
    moved = wrong.step(W, G, state, config)[0] - wrong.step(W, G, state, config_free)[0]
    assert np.all(np.linalg.norm(moved, axis=(-2, -1)) > 1e6 * bound)


def test_step_difference_bound_is_finite_on_one_by_one_frames():
    """St(1, 1) = {-1, +1}: P_W(G) = 0 exactly, v^ = 0, and the general analysis divides by sqrt(v^).
    The bound is the retractions' rounding there: finite, and Euclidean AdamW (which moves a 1 x 1
    frame by lr lambda W, unseen under an infinite bound) misses it."""
    rng = rng_for(2, "test", "one-by-one")
    W = ri.random_point(1, 1, rng, batch=(40,))
    G = 10.0 ** rng.uniform(-3, 3, size=(40, 1, 1)) * rng.standard_normal(W.shape)
    lam = 10.0
    config, config_free = ri.StiefelAdamConfig(lr=1e-2, weight_decay=lam), ri.StiefelAdamConfig(lr=1e-2)
    state = ri.init(W)
    bound = p5.step_difference_bound(W, G, state, config, lam)
    assert np.all(np.isfinite(bound)) and np.all(bound > 0) and np.all(bound < 1e-13)
    difference = np.linalg.norm(ri.step(W, G, state, config)[0] - ri.step(W, G, state, config_free)[0], axis=(-2, -1))
    assert np.all(difference <= bound)
    adamw = ri.get_variant("euclidean_adamw")
    moved = adamw.step(W, G, adamw.init(W), config)[0] - adamw.step(W, G, adamw.init(W), config_free)[0]
    assert np.all(np.linalg.norm(moved, axis=(-2, -1)) > 1e6 * bound)
    # without a trust region below 1 the sign of a 1 x 1 frame is not protected: the general bound
    unbounded = ri.StiefelAdamConfig(lr=1e-2, weight_decay=lam, trust_radius=math.inf)
    assert np.all(np.isinf(p5.step_difference_bound(W, G, state, unbounded, lam)))


def test_symbolic_and_exact_tiers():
    symbolic = derive_symbolic(p5.CLAIM.symbolic)
    assert symbolic.status == "proved"
    assert len(symbolic.steps) >= 5
    assert all(record["passed"] for record in p5.exact_checks(11))


def test_each_chunk_takes_the_weight_decay_of_its_batch_chunk_and_group(monkeypatch):
    """lambda rotates through LAMBDA_GRID with the batch of the shape plan, the chunk and the group."""
    calls = []
    monkeypatch.setattr(p5, "_lambda_group", lambda checks, variant, seed, steps, d, r, size, lam, key: calls.append((d, r, lam, key)))
    p5._optimizer_checks(0, SMALL, "stiefel_adam", SMALL.frames, "", "step")
    expected = []
    for shape_index, batch in enumerate(p5.shape_plan(SMALL, frames=SMALL.frames)):
        for chunk_index, count in enumerate(chunk_sizes(batch.count, batch.d, batch.r)):
            for group_index in range(min(len(p5.LAMBDA_GRID), count)):
                lam = p5.LAMBDA_GRID[(shape_index + chunk_index + group_index) % len(p5.LAMBDA_GRID)]
                expected.append((batch.d, batch.r, lam, (p5.CLAIM_ID, "step", batch.d, batch.r, chunk_index, group_index)))
    assert calls == expected and len({lam for _, _, lam, _ in calls}) == len(p5.LAMBDA_GRID)
