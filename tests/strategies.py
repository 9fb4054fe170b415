"""The strategies the project's own tests draw from: the public ones of certify.ci.strategies, with
the tests' defaults (frames up to d = 12 with up to two leading axes). Points are drawn from a
numpy Generator seeded by hypothesis, so every example is reproducible from hypothesis' own record."""

from __future__ import annotations

from certify.ci import strategies as public

seeds = public.seeds()
gradient_scales = public.gradient_scales()


def frame_shapes(max_d: int = 12, max_batch_dims: int = 2):
    return public.frame_shapes(max_d=max_d, max_batch_dims=max_batch_dims)


def stiefel_points(shapes=None):
    return public.stiefel_points(shapes if shapes is not None else frame_shapes())


def points_and_tangents(shapes=None):
    return public.points_and_tangents(shapes if shapes is not None else frame_shapes())


def orthogonal_matrices(n: int, batch=()):
    return public.orthogonal_matrices(n, batch=batch)


def gradients_for(W):
    """A Gaussian gradient shaped like W, times a power of two in [2^-200, 2^200]."""
    return public.gradients(W, scale=gradient_scales)
