"""The exact rational tier and the mpmath twin."""

from __future__ import annotations

import numpy as np
import pytest
import sympy

import reference_impl as ri
from reference_impl import exact, highprec

u = 2.0**-53


@pytest.mark.parametrize("d,r", [(1, 1), (3, 1), (3, 3), (4, 2), (5, 3)])
def test_rational_points_are_exact_frames(d, r):
    rng = np.random.default_rng(d * 10 + r)
    W = exact.rational_point(d, r, rng)
    assert all(isinstance(x, sympy.Rational) for x in W)
    assert exact.is_on_manifold(W)
    G = exact.rational_matrix(d, r, rng)
    P = exact.project_tangent(W, G)
    assert exact.is_zero(exact.project_tangent(W, W))  # P_W(W) = 0, zero tolerance
    assert exact.is_zero(exact.sym(W.T * P))  # W^T P_W(G) is skew
    assert exact.is_zero(exact.project_tangent(W, P) - P)  # idempotent
    # and the float64 rounding of an exact frame passes the reference's manifold test
    ri.init(exact.to_float64(W))


def test_rational_orthogonal_both_components():
    rng = np.random.default_rng(0)
    for det in (1, -1):
        Q = exact.rational_orthogonal(4, rng, det=det)
        assert Q.det() == det and exact.is_zero(Q.T * Q - sympy.eye(4))
    with pytest.raises(ValueError, match="det must be"):
        exact.rational_orthogonal(3, rng, det=2)
    with pytest.raises(ValueError, match="skew-symmetric"):
        exact.cayley(sympy.eye(2))


def test_is_zero_has_no_tolerance():
    assert not exact.is_zero(sympy.Matrix([[sympy.Rational(1, 10**30)]]))


def test_to_mp_is_exact():
    x = np.array([[0.1, 2.0**-1074], [1e308, -3.0]])
    M = highprec.to_mp(x)
    np.testing.assert_array_equal(highprec.to_float64(M), x)


@pytest.mark.parametrize("d,r", [(1, 1), (2, 1), (3, 3), (6, 2), (8, 4)])
def test_float64_step_agrees_with_mpmath_twin(d, r):
    """Each float64 step, started from the same float64 (W, G, state), is compared with the twin.

    Bound: the float64 step's forward error is at most C (d r + d + r) u kappa (1 + ||xi||) with
    kappa = ||G~||/||g|| (the analysis in tests/test_reference_step.py), C = 16; the twin's own
    rounding (10^-50) and the final rounding to float64 (u/2 per entry) are below that.
    """
    rng = np.random.default_rng(100 + d * r)
    configs = [
        ri.StiefelAdamConfig(lr=0.05, eps=1e-8, trust_radius=0.1, weight_decay=0.2),
        ri.StiefelAdamConfig(lr=0.01, betas=(0.5, 0.9), eps=0.0, trust_radius=np.inf),
    ]
    for config in configs:
        W = ri.random_point(d, r, rng)
        state = ri.init(W)
        for _ in range(3):
            G = rng.standard_normal(W.shape)
            W_new, state_new = ri.step(W, G, state, config)
            W_mp, state_mp = highprec.step_mp(W, G, state, config, dps=50)
            g = ri.project_tangent(W, G + config.weight_decay * W)
            kappa = np.linalg.norm(G + config.weight_decay * W) / max(np.linalg.norm(g), 1e-300)
            bound = 16 * (d * r + d + r) * u * max(kappa, 1.0) * 2
            assert np.max(np.abs(W_new - highprec.to_float64(W_mp))) <= bound
            m_scale = max(np.max(np.abs(state_new.m)), np.finfo(float).tiny)
            assert np.max(np.abs(state_new.m - highprec.to_float64(state_mp.m))) <= bound * m_scale
            assert abs(float(state_new.v) - float(state_mp.v)) <= bound * max(float(state_mp.v), np.finfo(float).tiny)
            W, state = W_new, state_new


def test_twin_follows_a_trajectory_in_high_precision():
    rng = np.random.default_rng(5)
    W = ri.random_point(4, 2, rng)
    config = ri.StiefelAdamConfig(lr=0.05)
    W_mp, state_mp = highprec.step_mp(W, rng.standard_normal(W.shape), ri.init(W), config)
    W2, state2 = highprec.step_mp(highprec.to_float64(W_mp), rng.standard_normal(W.shape), state_mp, config)
    assert state2.t == 2


def test_twin_argument_checks():
    W = ri.random_point(3, 2, np.random.default_rng(0))
    with pytest.raises(ValueError, match="dps must be an integer >= 20"):
        highprec.polar_retract_mp(W, np.zeros_like(W), dps=10)
    with pytest.raises(ValueError, match="one frame"):
        highprec.to_mp(np.zeros((2, 2, 2)))
    with pytest.raises(ValueError, match="state must be"):
        highprec.step_mp(W, np.zeros_like(W), None, ri.StiefelAdamConfig())
    with pytest.raises(ValueError, match="W must satisfy"):
        highprec.project_tangent_mp(2 * W, W)
    R = highprec.polar_retract_mp(W, np.zeros_like(W))
    assert np.max(np.abs(highprec.to_float64(R) - W)) <= 8 * 5 * 2 * u
