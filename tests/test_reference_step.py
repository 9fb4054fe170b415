"""The reference step against docs/algorithm.md, written out a second time frame by frame.

`spec_step` below is the page read literally: one frame at a time, Python scalars for v, the
polar factor from scipy.linalg.polar. The vectorized reference must agree with it on multi-step
trajectories over shapes (1, 1) .. (128, 16), batched and not, with and without trust-region
clipping, weight decay, eps = 0, zero gradients, and gradient scales 2^-200 .. 2^200.

Error analysis for the comparison (both sides evaluate the same formulas in float64, with
different summation orders and SVD paths):
- g = G~ - W sym(W^T G~): the entries of W^T G~ are inner products of length d, so each side's
  g carries an absolute error of at most about (d + r) u ||G~||; relative to ||g|| that is
  (d + r) u kappa with kappa = ||G~|| / ||g|| (the cancellation when G~ is mostly normal).
- m, v, m^, v^ and xi = -lr m^/(sqrt(v^)+eps) add O(1) u relatively; clipping rescales by a factor
  computed from ||xi|| (d r terms: d r u relative). So ||delta xi|| <= c1 (d r + d + r) u kappa ||xi||.
- The polar factor of A = W + xi with sigma_min(A) >= 1 (xi tangent) moves by at most
  2 ||delta A|| / (sigma_min + sigma_min) <= ||delta A||, and a backward-stable SVD adds
  about d r u.
- Over k steps the errors add; the map W -> W+ is Lipschitz with constant 1 + O(lr) in W, which for
  the lr <= 0.1 used here and k <= 6 steps stays below 2.
So per trajectory  ||W_k(reference) - W_k(spec)|| <= 2 k * C (d r + d + r) u kappa_max (1 + ||xi||)
with C = 16, and the same for m (relative to ||m||) and v (relative to v).
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import scipy.linalg
from hypothesis import given, settings
from hypothesis import strategies as st

import reference_impl as ri

u = 2.0**-53
C = 16.0


def spec_step(W, G, m, v, t, lr, beta1, beta2, eps, trust_radius, weight_decay):
    """docs/algorithm.md for one frame W (d, r); v a Python float. Returns (W+, m+, v+, t+)."""
    d, r = W.shape
    G_tilde = G + weight_decay * W
    WtG = W.T @ G_tilde
    g = G_tilde - W @ ((WtG + WtG.T) / 2)
    m = beta1 * m + (1 - beta1) * g
    v = beta2 * v + (1 - beta2) * float(np.sum(g**2)) / (d * r)
    t = t + 1
    m_hat = m / (1 - beta1**t)
    v_hat = v / (1 - beta2**t)
    if v_hat == 0:
        xi = np.zeros_like(W)
    else:
        xi = -lr * m_hat / (math.sqrt(v_hat) + eps)
    norm = float(np.linalg.norm(xi))
    if norm > trust_radius:
        xi = xi * trust_radius / norm
    W_new, _ = scipy.linalg.polar(W + xi, side="right")
    Wm = W_new.T @ m
    m_new = m - W_new @ ((Wm + Wm.T) / 2)
    return W_new, m_new, v, t, norm, float(np.linalg.norm(G_tilde)) / max(float(np.linalg.norm(g)), 1e-300)


SHAPES = [(1, 1), (2, 1), (3, 3), (5, 2), (8, 8), (16, 4), (32, 7), (64, 16), (128, 16)]
CONFIGS = {
    "default": dict(lr=1e-3, betas=(0.9, 0.999), eps=1e-8, trust_radius=0.5, weight_decay=0.0),
    "clipped": dict(lr=0.1, betas=(0.9, 0.999), eps=1e-8, trust_radius=0.05, weight_decay=0.0),
    "decay": dict(lr=0.01, betas=(0.8, 0.99), eps=1e-8, trust_radius=math.inf, weight_decay=0.3),
    "eps0": dict(lr=0.01, betas=(0.0, 0.0), eps=0.0, trust_radius=0.5, weight_decay=0.0),
}


def compare_trajectory(d, r, batch, config_kwargs, scale, seed, steps=5, zero_at=()):
    rng = np.random.default_rng(seed)
    config = ri.StiefelAdamConfig(**config_kwargs)
    W = ri.random_point(d, r, rng, batch)
    state = ri.init(W)
    frames = W.reshape((-1, d, r))
    spec = [(frames[i].copy(), np.zeros((d, r)), 0.0, 0) for i in range(frames.shape[0])]
    kappa_max, xi_max = 1.0, 0.0
    for k in range(steps):
        G = scale * rng.standard_normal(W.shape)
        if k in zero_at:
            G = np.zeros_like(G)
        W, state = ri.step(W, G, state, config)
        flat_G = G.reshape((-1, d, r))
        new_spec = []
        for i, (Wi, mi, vi, ti) in enumerate(spec):
            Wn, mn, vn, tn, xi_norm, kappa = spec_step(
                Wi, flat_G[i], mi, vi, ti, config.lr, *config.betas, config.eps, config.trust_radius, config.weight_decay
            )
            if np.any(flat_G[i]):
                kappa_max = max(kappa_max, kappa)
            xi_max = max(xi_max, min(xi_norm, config.trust_radius))
            new_spec.append((Wn, mn, vn, tn))
        spec = new_spec
        bound = 2 * (k + 1) * C * (d * r + d + r) * u * kappa_max * (1 + xi_max)
        got_W = W.reshape((-1, d, r))
        got_m = state.m.reshape((-1, d, r))
        got_v = np.asarray(state.v).reshape(-1)
        for i, (Wi, mi, vi, ti) in enumerate(spec):
            assert ti == state.t == k + 1
            assert np.linalg.norm(got_W[i] - Wi) <= bound, (d, r, k, np.linalg.norm(got_W[i] - Wi), bound)
            m_scale = max(np.linalg.norm(mi), np.finfo(float).tiny)
            assert np.linalg.norm(got_m[i] - mi) <= bound * m_scale
            assert abs(got_v[i] - vi) <= bound * max(vi, np.finfo(float).tiny)


@pytest.mark.parametrize("d,r", SHAPES)
@pytest.mark.parametrize("name", list(CONFIGS))
def test_trajectory_matches_spec(d, r, name):
    compare_trajectory(d, r, (), CONFIGS[name], 1.0, seed=d * 1000 + r)


@pytest.mark.parametrize("d,r,batch", [(1, 1, (3,)), (4, 2, (2, 3)), (16, 16, (2,)), (128, 16, (3,))])
@pytest.mark.parametrize("name", ["clipped", "decay"])
def test_batched_trajectory_matches_spec(d, r, batch, name):
    compare_trajectory(d, r, batch, CONFIGS[name], 1.0, seed=7 + d)


@pytest.mark.parametrize("exponent", [-200, -100, -1, 0, 1, 100, 200])
@pytest.mark.parametrize("name", ["default", "eps0", "clipped"])
def test_wide_gradient_scales_match_spec(exponent, name):
    compare_trajectory(6, 3, (2,), CONFIGS[name], 2.0**exponent, seed=abs(exponent) + 3)


def test_zero_gradient_steps_match_spec():
    compare_trajectory(5, 2, (2,), CONFIGS["default"], 1.0, seed=11, zero_at=(0, 3))


@given(seed=st.integers(0, 2**31 - 1), d=st.integers(1, 9), data=st.data())
@settings(max_examples=15)
def test_trajectory_matches_spec_random_shapes(seed, d, data):
    r = data.draw(st.integers(1, d))
    name = data.draw(st.sampled_from(list(CONFIGS)))
    exponent = data.draw(st.integers(-200, 200))
    compare_trajectory(d, r, (2,), CONFIGS[name], 2.0**exponent, seed, steps=3)


def test_zero_gradient_from_fresh_state_is_a_zero_step():
    rng = np.random.default_rng(0)
    W = ri.random_point(7, 3, rng, (4,))
    W_new, state = ri.step(W, np.zeros_like(W), ri.init(W), ri.StiefelAdamConfig(eps=0.0))
    assert np.all(np.isfinite(W_new)) and np.all(np.isfinite(state.m))
    np.testing.assert_array_equal(state.v, 0.0)
    # polar(W) of an exact-rounding frame moves it by at most a backward-stable SVD's d r u
    assert np.max(np.linalg.norm(W_new - W, axis=(-2, -1))) <= 8 * 7 * 3 * u


def test_normal_gradient_gives_no_nan():
    """G = W S (S symmetric) is normal: g vanishes up to rounding; never 0/0."""
    rng = np.random.default_rng(1)
    W = ri.random_point(6, 6, rng)
    S = rng.standard_normal((6, 6))
    W_new, state = ri.step(W, W @ (S + S.T), ri.init(W), ri.StiefelAdamConfig(eps=0.0))
    assert np.all(np.isfinite(W_new))


def test_inputs_not_modified():
    rng = np.random.default_rng(2)
    W = ri.random_point(8, 3, rng, (2,))
    G = rng.standard_normal(W.shape)
    state = ri.init(W)
    W_new, state = ri.step(W, G, state, ri.StiefelAdamConfig(lr=0.1))
    copies = [a.copy() for a in (W_new, G, state.m, state.v)]
    for arr in (W_new, G, state.m, state.v):
        arr.flags.writeable = False  # any in-place write raises
    ri.step(W_new, G, state, ri.StiefelAdamConfig(lr=0.1, weight_decay=0.1))
    ri.project_tangent(W_new, G)
    ri.polar_retract(W_new, ri.project_tangent(W_new, G))
    for before, after in zip(copies, (W_new, G, state.m, state.v)):
        np.testing.assert_array_equal(before, after)


def test_trust_region_caps_each_frame_separately():
    """Two frames in a batch: one clipped, one not; each frame's own v and own cap."""
    rng = np.random.default_rng(3)
    W = ri.random_point(10, 2, rng, (2,))
    G = rng.standard_normal(W.shape)
    config = ri.StiefelAdamConfig(lr=1.0, betas=(0.0, 0.0), eps=0.0, trust_radius=0.25)
    W_new, state = ri.step(W, G, ri.init(W), config)
    # first step, eps = 0: xi = -lr sqrt(d r) g/||g||, length sqrt(20) > 0.25, so clipped to 0.25
    for i in range(2):
        g = ri.project_tangent(W[i], G[i])
        np.testing.assert_allclose(state.v[i], np.sum(g * g) / 20, rtol=64 * 20 * u)
        expected = ri.polar_retract(W[i], -0.25 * g / np.linalg.norm(g))
        assert np.linalg.norm(W_new[i] - expected) <= 64 * 20 * u


def test_frames_do_not_share_statistics():
    """Scaling the gradient of one frame leaves the other frame's step bit-identical."""
    rng = np.random.default_rng(4)
    W = ri.random_point(6, 3, rng, (2,))
    G = rng.standard_normal(W.shape)
    config = ri.StiefelAdamConfig(lr=0.05)
    W_a, state_a = ri.step(W, G, ri.init(W), config)
    G_b = G.copy()
    G_b[1] *= 1e6
    W_b, state_b = ri.step(W, G_b, ri.init(W), config)
    np.testing.assert_array_equal(W_a[0], W_b[0])
    np.testing.assert_array_equal(state_a.v[0], state_b.v[0])
    assert state_b.v[1] > 1e10 * state_a.v[1]


def test_run_trajectory_applies_steps_in_order():
    rng = np.random.default_rng(5)
    W = ri.random_point(5, 2, rng)
    gradients = [rng.standard_normal(W.shape) for _ in range(3)]
    config = ri.StiefelAdamConfig(lr=0.05)
    trajectory, state = ri.run_trajectory(W, gradients, config)
    W_manual, state_manual = W, ri.init(W)
    for G in gradients:
        W_manual, state_manual = ri.step(W_manual, G, state_manual, config)
    assert len(trajectory) == 4 and state.t == 3
    np.testing.assert_array_equal(trajectory[-1], W_manual)
    trajectory_callable, _ = ri.run_trajectory(W, [lambda X, G=G: G for G in gradients], config)
    np.testing.assert_array_equal(trajectory_callable[-1], W_manual)
