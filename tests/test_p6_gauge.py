"""P6: gauge directions carry no gradient. The certificate passes for a real softmax attention
layer, its claim-specific control (a loss that is not gauge invariant) is detected, and the
hand-written gradients agree with finite differences and with torch autograd."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings

import reference_impl as ri
from propositions import attention
from propositions import p6_gauge as p6
from propositions.kit.protocol import derive_symbolic
from propositions._common import Profile, rng_for

from strategies import seeds

SMALL = Profile("test", frames=200, steps=2, long_run_steps=10, mp_dps=30, mp_samples=2)


def _layers(seed, count=40, n=6, d=7, r=3):
    rng = rng_for(seed, "test", "layers", n, d, r)
    return rng, p6.random_layers(rng, count, n, d, r)


def _unit_directions(rng, W_Q, W_V):
    return {name: p6._unit(rng, shape) for name, shape in (("W_Q", W_Q.shape), ("W_K", W_Q.shape), ("W_V", W_V.shape))}


@settings(max_examples=3, deadline=None)
@given(seed=seeds)
def test_gauge_claim_passes(seed):
    result = p6.CLAIM.run(seed, SMALL)
    assert result.verdict == "pass", result.failures()
    assert result.frames >= SMALL.frames


def test_certificate_content():
    body = p6.CLAIM.run(5, SMALL).to_dict()
    assert body["symbolic"]["status"] == "proved"
    assert all(e["passed"] for e in body["exact"]) and len(body["exact"]) == 3
    names = {c["name"] for c in body["numerical"]["checks"]}
    assert {"gauge_residual", "gauge_inner_product", "finite_difference_gradient"} <= names
    shapes = {tuple(s) for c in body["numerical"]["checks"] for s in c["shapes"]}
    assert {(1, 1), (16, 16), (1024, 128)} <= shapes
    (control,) = body["controls"]
    assert control["name"] == "anchored_query_loss" and control["detected"]
    histogram = body["figures"]["control_gauge_residual"]
    assert len(histogram["counts"]) == len(histogram["log10_edges"]) + 1
    # the control's residuals lie far right of the bound (log10 ratio > 1), except at r = 1 where
    # skew(.) of a 1 x 1 matrix is 0 and there is no gauge freedom at all
    over = sum(histogram["counts"][k] for k, edge in enumerate([-math.inf] + histogram["log10_edges"]) if edge >= 1)
    assert over > sum(histogram["counts"]) / 2


@pytest.mark.parametrize("optimizer", ["canonical_metric_gradient", "projection_without_sym"])
def test_every_gradient_map_is_gauge_orthogonal(optimizer):
    # P6 is about gradients: the gradient maps of the controls also annihilate gauge directions
    assert p6.CLAIM.run(2, SMALL, optimizer=optimizer).verdict == "pass"


def test_check_fails_on_a_loss_that_is_not_gauge_invariant():
    rng, (X, W_Q, W_K, W_V, Y) = _layers(3)
    _, grads, fwd = attention.loss_and_gradients(X, W_Q, W_K, W_V, Y)
    omega, omega_norm = p6.random_skew(rng, X.shape[0], W_Q.shape[-1])
    invariant, anchored = p6._gauge_checks(""), p6._gauge_checks("anchored:")
    kwargs = dict(shape=W_Q.shape[-2:], key=("test",), seed=3)
    p6._gauge_sample(invariant, "stiefel_adam", X, W_Q, W_K, grads.W_Q, grads.W_K, fwd, grads, omega, omega_norm, **kwargs)
    anchor = rng.standard_normal(W_Q.shape)
    p6._gauge_sample(anchored, "stiefel_adam", X, W_Q, W_K, grads.W_Q + (W_Q - anchor), grads.W_K, fwd, grads,
                     omega, omega_norm, **kwargs)
    assert all(check.passed for check in invariant.values())
    assert not anchored["gauge_residual"].passed and anchored["gauge_residual"].max_ratio > 1e6
    assert not anchored["gauge_inner_product"].passed


def test_hand_gradients_match_finite_differences():
    rng, (X, W_Q, W_K, W_V, Y) = _layers(4)
    out = attention.finite_difference_check(X, W_Q, W_K, W_V, Y, _unit_directions(rng, W_Q, W_V))
    for name, (residual, bound) in out.items():
        assert np.all(bound > 0)
        assert np.all(residual <= bound), name


def test_finite_differences_catch_a_wrong_gradient():
    rng, (X, W_Q, W_K, W_V, Y) = _layers(5)
    directions = _unit_directions(rng, W_Q, W_V)
    out = attention.finite_difference_check(X, W_Q, W_K, W_V, Y, directions)
    _, grads, fwd = attention.loss_and_gradients(X, W_Q, W_K, W_V, Y)
    h = attention.FD_STEP
    E = directions["W_Q"]
    fd = (attention.loss(X, W_Q + h * E, W_K, W_V, Y) - attention.loss(X, W_Q - h * E, W_K, W_V, Y)) / (2 * h)
    # a classic slip: Gbar without the softmax centring term
    wrong_gbar = fwd.weights * (fwd.residual @ np.swapaxes(fwd.V, -1, -2))
    wrong_G_Q = np.swapaxes(X, -1, -2) @ (wrong_gbar @ fwd.K) / np.sqrt(W_Q.shape[-1])
    residual = np.abs(fd - np.sum(wrong_G_Q * E, axis=(-2, -1)))
    _, bound = out["W_Q"]
    assert np.mean(residual > bound) > 0.9


def test_third_derivative_bound_dominates_a_measured_third_difference():
    rng, (X, W_Q, W_K, W_V, Y) = _layers(6, count=20)
    E = p6._unit(rng, W_Q.shape)
    m3 = attention.third_derivative_bound(X, W_Q, W_K, W_V, Y, E, "W_Q")
    h = 1e-2
    values = [attention.loss(X, W_Q + k * h * E, W_K, W_V, Y) for k in (-2, -1, 1, 2)]
    third = (values[3] - 2 * values[2] + 2 * values[1] - values[0]) / (2 * h**3)
    assert np.all(np.abs(third) <= m3 * (1 + 1e-6) + 1e-6 * np.abs(third))
    assert np.all(attention.third_derivative_bound(X, W_Q, W_K, W_V, Y, p6._unit(rng, W_V.shape), "W_V") == 0)


def test_torch_autograd_agrees():
    pytest.importorskip("torch")
    _, (X, W_Q, W_K, W_V, Y) = _layers(7)
    _, grads, fwd = attention.loss_and_gradients(X, W_Q, W_K, W_V, Y)
    torch_grads = attention.torch_gradients(X, W_Q, W_K, W_V, Y)
    errors = attention.rounding_bounds(X, W_Q, W_K, W_V, fwd, grads)
    for name in ("W_Q", "W_K", "W_V"):
        difference = np.linalg.norm(getattr(grads, name) - getattr(torch_grads, name), axis=(-2, -1))
        assert np.all(difference <= p6.torch_bound(errors, name)), name


def test_gauge_bounds_positive_and_riemannian_gradient_is_gauge_orthogonal():
    rng, (X, W_Q, W_K, W_V, Y) = _layers(8, d=16, r=16, n=5)
    _, grads, fwd = attention.loss_and_gradients(X, W_Q, W_K, W_V, Y)
    bound = p6.gauge_residual_bound(X, W_Q, W_K, fwd, grads)
    assert np.all(bound > 0)
    omega, _ = p6.random_skew(rng, X.shape[0], 16)
    g_Q, g_K = ri.project_tangent(W_Q, grads.W_Q), ri.project_tangent(W_K, grads.W_K)
    inner = np.sum(g_Q * (W_Q @ omega), axis=(-2, -1)) + np.sum(g_K * (W_K @ omega), axis=(-2, -1))
    assert np.all(np.abs(inner) <= p6.gauge_inner_product_bound(16, 16, bound, grads.W_Q, grads.W_K, 1.0))


def test_symbolic_tier_proves_the_identity():
    symbolic = derive_symbolic(p6.CLAIM.symbolic)
    assert symbolic.status == "proved" and len(symbolic.steps) >= 5


def test_every_layer_of_the_plan_is_drawn_once_at_its_token_count():
    """The chunks of layer_checks are (d, r, n, index, count): the evidence counts every frame of the
    plan once, and each token count gets the frames the plan gives it."""
    chunks = list(p6._plan(SMALL))
    seen = []
    original = p6.random_layers

    def recording(rng, count, n, d, r, scales=None):
        seen.append((d, r, n, count))
        return original(rng, count, n, d, r, scales)

    p6.random_layers = recording
    try:
        evidence = p6.layer_checks(0, SMALL, "stiefel_adam", False)
    finally:
        p6.random_layers = original
    assert seen == [(d, r, n, count) for d, r, n, _, count in chunks]
    assert evidence.frames == sum(count for *_, count in chunks) == evidence.checks[0].samples


def test_the_torch_cross_check_runs_on_every_chunk():
    pytest.importorskip("torch")
    profile = Profile("test", frames=40, steps=2, long_run_steps=10, mp_dps=30, mp_samples=2)
    evidence = p6.layer_checks(0, profile, "stiefel_adam", True)
    torch_check = evidence.check("torch_autograd_gradient")
    assert evidence.extra["torch_available"] is True
    assert torch_check.passed and torch_check.samples == 3 * evidence.frames  # W_Q, W_K, W_V of every frame
