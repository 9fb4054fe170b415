"""Tests of propositions.kit.directions: the direction hook of every variant is the step, and the
inverse polar retraction recovers xi within its stated bound (and says when it cannot)."""

from __future__ import annotations

import numpy as np
import pytest

import reference_impl as ri
from propositions import p3_conditioning as p3
from propositions.kit.directions import inverse_polar_retraction, solve_lyapunov, step_direction
from propositions._common import rng_for
from reference_impl.controls import VARIANTS

CONFIG = ri.StiefelAdamConfig(lr=0.05, trust_radius=0.5, weight_decay=0.1)


@pytest.mark.parametrize("name", list(VARIANTS))
def test_every_registered_variant_returns_the_direction_of_its_own_step(name):
    variant = VARIANTS[name]
    assert variant.step_with_direction is not None
    rng = rng_for(0, "test", "hook", name)
    W = ri.random_point(6, 3, rng, (5,))
    G = rng.standard_normal(W.shape)
    state = variant.init(W)
    W_plain, state_plain = variant.step(W, G, state, CONFIG)
    W_new, state_new, xi = variant.step_with_direction(W, G, state, CONFIG)
    assert np.array_equal(W_plain, W_new) and np.array_equal(state_plain.m, state_new.m)
    if name == "euclidean_adamw":
        assert np.array_equal(xi, W_new - W)
    elif name == "qr_retraction":
        assert np.array_equal(W_new, ri.haar_from_gaussian(W + xi))
    else:
        assert np.array_equal(W_new, ri.polar_retract(W, xi, validate=False))


def test_plain_constructor_still_works_and_a_second_step_is_refused():
    plain = ri.Variant("plain", "a plain step", (), ri.init, ri.step)
    assert plain.step is ri.step and plain.step_with_direction is None
    hooked = ri.Variant("hooked", "from the hook", (), ri.init, step_with_direction=ri.adam.step_with_direction)
    assert hooked.step.direction_hook is ri.adam.step_with_direction
    # the real step carries its hook, so naming both is consistent
    ri.Variant("both", "step and its hook", (), ri.init, ri.step, ri.adam.step_with_direction)
    with pytest.raises(ValueError, match="not both"):
        ri.Variant("mixed", "unrelated step and hook", (), ri.init, VARIANTS["fixed_step_sgd"].step,
                   ri.adam.step_with_direction)
    with pytest.raises(ValueError, match="needs a step"):
        ri.Variant("empty", "nothing", (), ri.init)


def test_solve_lyapunov_both_paths():
    rng = rng_for(0, "test", "lyapunov")
    for r in (1, 3, 8, 11):
        A = np.eye(r) + 0.3 * rng.standard_normal((4, r, r))
        Q = 2.0 * np.eye(r)
        S = solve_lyapunov(A, Q)
        residual = A @ S + S @ np.swapaxes(A, -1, -2) - Q
        assert np.max(np.abs(residual)) < 1e-13


@pytest.mark.parametrize("shape", [(1, 1), (2, 1), (3, 3), (8, 3), (12, 5), (16, 16), (64, 16)])
def test_inverse_recovers_a_tangent_step_within_its_bound(shape):
    d, r = shape
    rng = rng_for(0, "test", "inverse", d, r)
    W = ri.random_point(d, r, rng, (40,))
    xi = ri.random_tangent(W, rng)
    norms = np.linalg.norm(xi, axis=(-2, -1))
    xi = xi * (0.5 * rng.uniform(0, 1, 40) / np.where(norms > 0, norms, 1.0))[:, None, None]
    W_new = ri.polar_retract(W, xi, validate=False)
    inverse = inverse_polar_retraction(W, W_new)
    # xi is exactly tangent up to its own rounding T; W_new is a float polar factor of W + xi
    WtXi = np.swapaxes(W, -1, -2) @ xi
    defect = np.linalg.norm(WtXi + np.swapaxes(WtXi, -1, -2), axis=(-2, -1)) + 2 * ri.feasibility(W)
    bound = (inverse.error_bound + inverse.sensitivity * p3.polar_error_bound(d, r, np.sqrt(1.25))
             + 1.1 * inverse.kappa_L * defect)
    error = np.linalg.norm(inverse.xi - xi, axis=(-2, -1))
    assert np.all(np.isfinite(inverse.error_bound))
    assert np.all(error <= bound)
    assert np.all(inverse.error_bound < 1e-11)
    # the recovered xi is tangent and retracts to W_new
    assert np.max(np.linalg.norm(ri.polar_retract(W, inverse.xi, validate=False) - W_new, axis=(-2, -1))) < 1e-12


def test_inverse_bound_is_infinite_where_no_short_tangent_step_reaches_w_new():
    rng = rng_for(1, "test", "inverse-far")
    W = ri.random_point(4, 4, rng, (3,))
    flipped = W.copy()
    flipped[..., :, 0] *= -1  # the other component of O(4): no retraction step reaches it
    inverse = inverse_polar_retraction(W, flipped)
    assert np.all(np.isinf(inverse.error_bound))


def test_step_direction_falls_back_to_the_inverse_for_a_plain_step():
    rng = rng_for(2, "test", "fallback")
    W = ri.random_point(7, 3, rng, (6,))
    G = rng.standard_normal(W.shape)
    config = ri.StiefelAdamConfig(lr=0.05)
    hooked = step_direction("stiefel_adam", W, G, ri.init(W), config)
    plain = step_direction(ri.Variant("plain", "plain", (), ri.init, ri.step), W, G, ri.init(W), config)
    assert hooked.source == "hook" and plain.source == "inverse"
    assert np.array_equal(hooked.W_new, plain.W_new)
    assert np.all(hooked.error_bound == 0)
    assert np.max(np.linalg.norm(plain.xi - hooked.xi, axis=(-2, -1))) < 1e-13


def test_an_output_outside_the_inverse_retractions_domain_is_marked_not_raised():
    """W_new = W J with J a quarter turn in the first two columns is on St(d, r) but W^T W_new = J has
    eigenvalues +-i, which sum to 0: the Lyapunov operator is singular. Such a frame (an outside
    implementation's degenerate output) gets an infinite error bound, and the other frames of the
    batch are recovered as before, instead of a LinAlgError stopping the claim."""
    rng = np.random.default_rng(3)
    W = np.linalg.qr(rng.standard_normal((3, 5, 2)))[0]
    xi = ri.project_tangent(W, 1e-2 * rng.standard_normal((3, 5, 2)))
    W_new = ri.project_to_manifold(W + xi)
    J = np.array([[0.0, -1.0], [1.0, 0.0]])
    regular = inverse_polar_retraction(W, W_new)
    W_new[1] = W[1] @ J
    found = inverse_polar_retraction(W, W_new)
    assert np.isinf(found.error_bound[1]) and np.isinf(found.sensitivity[1])
    for i in (0, 2):  # each frame is solved by itself: the same bits as without the degenerate one
        assert np.isfinite(found.error_bound[i]) and np.array_equal(found.xi[i], regular.xi[i])
        assert found.error_bound[i] == regular.error_bound[i]
