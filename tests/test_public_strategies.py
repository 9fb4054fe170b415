"""certify.ci.strategies, the public hypothesis strategies: what each promises, checked on its draws."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import reference_impl as ri
from certify.ci import strategies as cs
from certify.ci.counterexample import Case


@given(cs.stiefel_points(max_d=6))
def test_stiefel_points_are_orthonormal_frames(W):
    r = W.shape[-1]
    assert W.dtype == np.float64 and r <= W.shape[-2] <= 6
    assert np.all(ri.feasibility(W) <= ri.manifold_tolerance(*W.shape[-2:]))
    assert np.allclose(np.swapaxes(W, -1, -2) @ W, np.eye(r), atol=ri.manifold_tolerance(*W.shape[-2:]))


@given(cs.points_and_tangents(max_d=6))
def test_tangent_vectors_are_tangent(pair):
    W, xi = pair
    WtXi = np.swapaxes(W, -1, -2) @ xi
    scale = max(1.0, float(np.max(np.abs(xi))))
    assert np.allclose(WtXi + np.swapaxes(WtXi, -1, -2), 0.0, atol=64 * np.finfo(float).eps * W.shape[-2] * scale)


@given(st.data(), st.sampled_from([None, 1, -1]), st.integers(1, 5))
def test_orthogonal_matrices_have_the_asked_determinant(data, det, n):
    Q = data.draw(cs.orthogonal_matrices(n, det=det, batch=(3,)))
    assert np.allclose(Q @ np.swapaxes(Q, -1, -2), np.eye(n), atol=1e-12)
    if det is not None:
        assert np.allclose(np.linalg.det(Q), det)


@given(st.data(), cs.stiefel_points(max_d=4))
def test_gradients_take_the_chosen_scale(data, W):
    G = data.draw(cs.gradients(W, scale=2.0**-300))
    assert G.shape == W.shape and np.all(np.abs(G) < 2.0**-290)
    H = data.draw(cs.gradients(W, scale=cs.gradient_scales(5, 5)))
    assert np.array_equal(H, 32.0 * (H / 32.0))


@given(cs.configs())
def test_configs_are_valid(config):
    assert isinstance(config, ri.StiefelAdamConfig) and config.lr > 0 and config.trust_radius > 0


@given(cs.configs(lr=0.5, trust_radius=math.inf))
def test_configs_take_fixed_values(config):
    assert config.lr == 0.5 and math.isinf(config.trust_radius)


@given(cs.cases("P2", black_box=True))
def test_cases_follow_the_claims_settings(case):
    assert isinstance(case, Case) and case.claim == "P2" and case.start == "fresh" and 1 <= case.r <= case.d


def test_bad_arguments_are_refused():
    with pytest.raises(ValueError, match="det"):
        cs.orthogonal_matrices(3, det=2)
    with pytest.raises(ValueError, match="claim"):
        cs.cases("P6")
    with pytest.raises(ValueError, match="min_exponent"):
        cs.gradient_scales(3, 1)
