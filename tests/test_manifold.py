"""Manifold operations: the identities of docs/mathematics.md, with bounds from their rounding.

Bounds: an entry of W^T A is an inner product of length d (error <= d u ||A||, Higham gamma_d);
a product W (W^T A) adds r u; so each residual below is at most C (d + r) r u times the norm of the
input, with C = 8 covering the two or three such products per identity.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given

import reference_impl as ri
from strategies import points_and_tangents, seeds, stiefel_points

u = 2.0**-53
C = 8.0


def norm(A):
    return np.linalg.norm(A, axis=(-2, -1))


def bound(W, scale=1.0):
    d, r = W.shape[-2:]
    return C * (d + r) * r * u * np.maximum(scale, np.finfo(float).tiny)


def test_sym_skew_split():
    A = np.random.default_rng(0).standard_normal((3, 4, 4))
    np.testing.assert_array_equal(ri.sym(A), np.swapaxes(ri.sym(A), -1, -2))
    np.testing.assert_array_equal(ri.skew(A), -np.swapaxes(ri.skew(A), -1, -2))
    np.testing.assert_allclose(ri.sym(A) + ri.skew(A), A, rtol=0, atol=4 * u * np.abs(A).max())


@given(stiefel_points(), seeds)
def test_projection_is_orthogonal_projector(W, seed):
    rng = np.random.default_rng(seed)
    G = rng.standard_normal(W.shape)
    H = rng.standard_normal(W.shape)
    P = ri.project_tangent(W, G)
    Wt = np.swapaxes(W, -1, -2)
    # range in T_W: W^T P + P^T W = 0
    assert np.all(norm(Wt @ P + np.swapaxes(Wt @ P, -1, -2)) <= bound(W, norm(G)))
    # idempotent
    assert np.all(norm(ri.project_tangent(W, P) - P) <= bound(W, norm(G)))
    # self-adjoint: <P G, H> = <G, P H>
    lhs = np.sum(P * H, axis=(-2, -1))
    rhs = np.sum(G * ri.project_tangent(W, H), axis=(-2, -1))
    assert np.all(np.abs(lhs - rhs) <= bound(W, norm(G) * norm(H)) * W.shape[-2])
    # kernel contains the normal space W S
    S = rng.standard_normal(W.shape[:-2] + (W.shape[-1],) * 2)
    normal = W @ (S + np.swapaxes(S, -1, -2))
    assert np.all(norm(ri.project_tangent(W, normal)) <= bound(W, norm(normal)))


@given(points_and_tangents())
def test_retraction_paths_agree_and_land_on_manifold(W_xi):
    W, xi = W_xi
    d, r = W.shape[-2:]
    R = ri.polar_retract(W, xi)
    assert np.all(ri.feasibility(R) <= ri.manifold_tolerance(d, r))
    # sigma_min(W + xi) >= 1 for tangent xi, so the polar factor is 1-Lipschitz there; the paths
    # differ only by the rounding of an eigh / SVD of an r x r or d x r matrix, cond <= sqrt(1 + ||xi||^2)
    cond = np.sqrt(1 + norm(xi) ** 2)
    for method, residual in ri.retraction_agreement(W, xi).items():
        assert np.all(residual <= 4 * bound(W) * cond**2), method


@given(stiefel_points())
def test_retraction_at_zero_is_identity(W):
    assert np.all(norm(ri.polar_retract(W, np.zeros_like(W)) - W) <= bound(W))


def test_random_point_is_haar_and_sign_fixed():
    rng = np.random.default_rng(1)
    W = ri.random_point(4, 4, rng, (4000,))
    dets = np.linalg.det(W)
    # both components of O(4), each with probability 1/2: 4000 draws, 6 sigma = 190
    assert abs(np.sum(dets > 0) - 2000) < 190
    # Haar: E[W_ij^2] = 1/d; the sample mean of 4000 draws has sd sqrt(2/(d^2 4000)) ~ 0.0056
    assert np.all(np.abs(np.mean(W**2, axis=0) - 0.25) < 6 * 0.0056)


def test_haar_sign_fix_keeps_all_columns_when_r_diagonal_has_zero():
    Z = np.zeros((3, 2))
    Z[0, 1] = 1.0
    Z[1, 0] = 0.0
    Z[2, 0] = 1.0
    Q = ri.haar_from_gaussian(Z)
    assert np.all(np.linalg.norm(Q, axis=0) > 0.5)


def test_random_tangent_and_orthogonal():
    rng = np.random.default_rng(2)
    W = ri.random_point(6, 2, rng, (5,))
    xi = ri.random_tangent(W, rng, scale=3.0)
    Wt_xi = np.swapaxes(W, -1, -2) @ xi
    assert np.all(norm(Wt_xi + np.swapaxes(Wt_xi, -1, -2)) <= bound(W, norm(xi)))
    Q = ri.random_orthogonal(5, rng, (7,))
    assert np.all(ri.feasibility(Q) <= ri.manifold_tolerance(5, 5))
    P = ri.random_signed_permutation(4, rng, (3,))
    np.testing.assert_array_equal(np.swapaxes(P, -1, -2) @ P, np.broadcast_to(np.eye(4), (3, 4, 4)))


def test_project_to_manifold_is_nearest_frame():
    rng = np.random.default_rng(3)
    W = ri.random_point(7, 3, rng)
    A = W + 1e-3 * rng.standard_normal(W.shape)
    X = ri.project_to_manifold(A)
    assert ri.feasibility(X) <= ri.manifold_tolerance(7, 3)
    # the polar factor minimises ||A - X|| over frames: better than W and than random frames
    for Y in [W] + [ri.random_point(7, 3, rng) for _ in range(20)]:
        assert np.linalg.norm(A - X) <= np.linalg.norm(A - Y) + bound(W)


@pytest.mark.parametrize("d,r", [(1, 1), (3, 3), (1024, 128)])
def test_feasibility_of_random_points(d, r):
    W = ri.random_point(d, r, np.random.default_rng(d), (2,))
    assert np.all(ri.feasibility(W) <= ri.manifold_tolerance(d, r))
