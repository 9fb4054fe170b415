"""Each control differs from the real step where it should, and agrees where it should not differ.

Agreement bounds: two float64 evaluations of the same formula in a different order differ by at
most C (d + r) r u relative (inner products of length d and r), C = 64 for the few stages chained.
Differences claimed below are O(lr) or O(1), at least 10^6 times those bounds.
"""

from __future__ import annotations

import numpy as np
import pytest

import reference_impl as ri
from reference_impl.controls import CONTROL_NAMES, VARIANTS, get_variant

u = 2.0**-53


def setup(d=8, r=3, batch=(4,), seed=0):
    rng = np.random.default_rng(seed)
    W = ri.random_point(d, r, rng, batch)
    G = rng.standard_normal(W.shape)
    return rng, W, G


def run(name, W, G, config):
    variant = get_variant(name)
    return variant.step(W, G, variant.init(W), config)


def distance(A, B):
    return float(np.max(np.linalg.norm(A - B, axis=(-2, -1))))


def tangent_residual(W, xi):
    Wt_xi = np.swapaxes(W, -1, -2) @ xi
    return float(np.max(np.linalg.norm(Wt_xi + np.swapaxes(Wt_xi, -1, -2), axis=(-2, -1))))


def test_registry_lists_all_required_controls():
    required = {
        "elementwise_second_moment", "qr_retraction", "projection_without_sym", "unprojected_decay",
        "euclidean_adamw", "fixed_step_sgd", "canonical_metric_gradient",
    }
    assert set(CONTROL_NAMES) == required
    assert "stiefel_adam" in VARIANTS
    for name in CONTROL_NAMES:
        assert VARIANTS[name].breaks and VARIANTS[name].description
    with pytest.raises(ValueError, match="unknown optimizer variant 'nope'"):
        get_variant("nope")


def test_real_variant_is_reference_step():
    _, W, G = setup()
    config = ri.StiefelAdamConfig(lr=0.05)
    W1, s1 = run("stiefel_adam", W, G, config)
    W2, s2 = ri.step(W, G, ri.init(W), config)
    np.testing.assert_array_equal(W1, W2)


def test_elementwise_second_moment_leaves_tangent_space():
    _, W, G = setup()
    config = ri.StiefelAdamConfig(lr=0.05, trust_radius=np.inf)
    variant = get_variant("elementwise_second_moment")
    state = variant.init(W)
    assert state.v.shape == W.shape
    # xi = polar^-1: recover the step direction from the first step with beta1 = beta2 = 0
    config0 = ri.StiefelAdamConfig(lr=0.05, betas=(0.0, 0.0), eps=0.0, trust_radius=np.inf)
    g = ri.project_tangent(W, G)
    xi = -0.05 * g / np.abs(g)
    assert tangent_residual(W, xi) > 1e-3
    W_control, _ = variant.step(W, G, state, config0)
    np.testing.assert_allclose(W_control, ri.polar_retract(W, xi), atol=64 * 11 * 3 * u)
    W_real, _ = ri.step(W, G, ri.init(W), config)
    assert distance(W_control, W_real) > 1e-3


def test_qr_retraction_differs_from_polar():
    _, W, G = setup()
    config = ri.StiefelAdamConfig(lr=0.05)
    W_qr, _ = run("qr_retraction", W, G, config)
    W_real, _ = run("stiefel_adam", W, G, config)
    assert np.all(ri.feasibility(W_qr) <= ri.manifold_tolerance(8, 3))
    assert distance(W_qr, W_real) > 1e-4


def test_projection_without_sym_drops_skew_part():
    _, W, G = setup()
    config = ri.StiefelAdamConfig(lr=0.05, betas=(0.0, 0.0))
    g_wrong = ri.riemannian_gradient(W, G, 0.0, "projection_without_sym")
    g_real = ri.project_tangent(W, G)
    assert np.max(np.abs(np.swapaxes(W, -1, -2) @ g_wrong)) <= 64 * 11 * 3 * u * np.max(np.abs(G))
    assert distance(g_wrong, g_real) > 0.1
    assert distance(run("projection_without_sym", W, G, config)[0], run("stiefel_adam", W, G, config)[0]) > 1e-3


def test_canonical_gradient_is_tangent_but_different():
    _, W, G = setup(d=9, r=4)
    g_canonical = ri.riemannian_gradient(W, G, 0.0, "canonical_metric_gradient")
    assert tangent_residual(W, g_canonical) <= 64 * 13 * 4 * u * np.max(np.linalg.norm(G, axis=(-2, -1)))
    assert distance(g_canonical, ri.project_tangent(W, G)) > 0.1


def test_unprojected_decay_moves_with_lambda_and_real_step_does_not():
    _, W, G = setup()
    base = ri.StiefelAdamConfig(lr=0.05, weight_decay=0.0)
    decayed = ri.StiefelAdamConfig(lr=0.05, weight_decay=5.0)
    real_gap = distance(run("stiefel_adam", W, G, base)[0], run("stiefel_adam", W, G, decayed)[0])
    control_gap = distance(run("unprojected_decay", W, G, base)[0], run("unprojected_decay", W, G, decayed)[0])
    assert real_gap <= 64 * 11 * 3 * u * 5.0
    assert control_gap > 1e-3


def test_euclidean_adamw_shrinks_the_frame():
    _, W, _ = setup()
    config = ri.StiefelAdamConfig(lr=0.01, weight_decay=0.5)
    variant = get_variant("euclidean_adamw")
    state = variant.init(W)
    X = W
    for _ in range(10):
        X, state = variant.step(X, np.zeros_like(X), state, config)
    # zero gradient: only the decay acts, ||W|| shrinks by (1 - lr lambda) per step exactly
    expected = np.sqrt(3) * (1 - 0.005) ** 10
    np.testing.assert_allclose(np.linalg.norm(X, axis=(-2, -1)), expected, rtol=64 * 10 * u * 24)
    W_real = W
    state_real = ri.init(W)
    for _ in range(10):
        W_real, state_real = ri.step(W_real, np.zeros_like(W_real), state_real, config)
    np.testing.assert_allclose(np.linalg.norm(W_real, axis=(-2, -1)) ** 2, 3.0, rtol=64 * 10 * 24 * u)


def test_fixed_step_sgd_is_degree_one_in_scale():
    _, W, G = setup()
    config = ri.StiefelAdamConfig(lr=0.01, eps=0.0)
    small = run("fixed_step_sgd", W, G, config)[0]
    big = run("fixed_step_sgd", W, 4.0 * G, config)[0]
    assert distance(small, big) > 1e-3
    np.testing.assert_array_equal(run("stiefel_adam", W, G, config)[0], run("stiefel_adam", W, 4.0 * G, config)[0])
    np.testing.assert_allclose(small, ri.polar_retract(W, -0.01 * ri.project_tangent(W, G)), atol=64 * 11 * 3 * u)


@pytest.mark.parametrize("name", CONTROL_NAMES)
def test_every_control_runs_batched_and_keeps_shapes(name):
    _, W, G = setup(d=5, r=5, batch=(2, 3))
    W_new, state = run(name, W, G, ri.StiefelAdamConfig(lr=0.05, weight_decay=0.1))
    assert W_new.shape == W.shape and state.m.shape == W.shape and state.t == 1
    assert np.all(np.isfinite(W_new))
