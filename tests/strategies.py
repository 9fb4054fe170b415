"""Hypothesis strategies that compose: shapes, Stiefel points, tangent vectors, orthogonal matrices,
gradients of wide scale. Points are drawn from a numpy Generator seeded by hypothesis, so every
example is reproducible from hypothesis' own record."""

from __future__ import annotations

import numpy as np
from hypothesis import strategies as st

import reference_impl as ri

seeds = st.integers(min_value=0, max_value=2**32 - 1)


@st.composite
def frame_shapes(draw, max_d: int = 12, max_batch_dims: int = 2):
    """(batch, d, r) with 1 <= r <= d, r = 1 and r = d included, batch of up to max_batch_dims axes."""
    d = draw(st.integers(1, max_d))
    r = draw(st.one_of(st.just(1), st.just(d), st.integers(1, d)))
    batch = tuple(draw(st.lists(st.integers(1, 3), max_size=max_batch_dims)))
    return batch, d, r


@st.composite
def stiefel_points(draw, shapes=frame_shapes()):
    batch, d, r = draw(shapes)
    rng = np.random.default_rng(draw(seeds))
    return ri.random_point(d, r, rng, batch)


@st.composite
def points_and_tangents(draw, shapes=frame_shapes()):
    W = draw(stiefel_points(shapes))
    rng = np.random.default_rng(draw(seeds))
    return W, ri.random_tangent(W, rng)


@st.composite
def orthogonal_matrices(draw, n: int, batch=()):
    rng = np.random.default_rng(draw(seeds))
    return ri.random_orthogonal(n, rng, batch)


gradient_scales = st.integers(min_value=-200, max_value=200).map(lambda k: 2.0**k)


@st.composite
def gradients_for(draw, W: np.ndarray):
    """Gaussian gradient shaped like W, times a power of two in [2^-200, 2^200]."""
    rng = np.random.default_rng(draw(seeds))
    return draw(gradient_scales) * rng.standard_normal(W.shape)
