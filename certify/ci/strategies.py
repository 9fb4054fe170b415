"""Hypothesis strategies for tests of optimizers on the Stiefel manifold St(d, r).

Small strategies that compose, for a user's own `@given` tests and for the certify pytest plugin:

    from hypothesis import given
    from certify.ci import strategies as cs

    @given(cs.stiefel_points(max_d=6), cs.seeds())
    def test_my_step_stays_on_the_manifold(W, seed): ...

Every array is drawn from a numpy Generator whose seed hypothesis draws, so an example is
reproduced, and shrunk, from hypothesis' own record: shapes shrink towards d = r = 1 and no leading
axes, scales towards 1, seeds towards 0. Arrays are float64.
"""

from __future__ import annotations

import math

import numpy as np
from hypothesis import strategies as st

import reference_impl as ri


def seeds() -> st.SearchStrategy[int]:
    """Seeds of numpy Generators, 0 <= seed < 2^32 (shrinks towards 0)."""
    return st.integers(min_value=0, max_value=2**32 - 1)


def _generator(draw) -> np.random.Generator:
    return np.random.default_rng(draw(seeds()))


@st.composite
def frame_shapes(draw, max_d: int = 8, max_batch_dims: int = 1, max_batch: int = 3):
    """(batch, d, r) with 1 <= r <= d <= max_d (r = 1 and r = d drawn often: the edge cases of
    St(d, r)) and batch a tuple of up to max_batch_dims axes of 1..max_batch."""
    if max_d < 1:
        raise ValueError(f"max_d must be at least 1, got {max_d}")
    d = draw(st.integers(1, max_d))
    r = draw(st.one_of(st.just(1), st.just(d), st.integers(1, d)))
    batch = tuple(draw(st.lists(st.integers(1, max_batch), max_size=max_batch_dims)))
    return batch, d, r


@st.composite
def stiefel_points(draw, shapes=None, max_d: int = 8):
    """Haar-random frames W (batch + (d, r)) with W^T W = I to rounding; shapes: a frame_shapes strategy."""
    batch, d, r = draw(shapes if shapes is not None else frame_shapes(max_d=max_d))
    return ri.random_point(d, r, _generator(draw), batch)


@st.composite
def tangent_vectors(draw, W: np.ndarray, scale: float = 1.0):
    """P_W of a Gaussian matrix times scale: a tangent vector at each frame of W (same shape)."""
    return ri.random_tangent(np.asarray(W, dtype=np.float64), _generator(draw), scale)


@st.composite
def points_and_tangents(draw, shapes=None, max_d: int = 8):
    """(W, xi): frames and a tangent vector at each."""
    W = draw(stiefel_points(shapes, max_d))
    return W, draw(tangent_vectors(W))


def gradient_scales(min_exponent: int = -200, max_exponent: int = 200) -> st.SearchStrategy[float]:
    """Powers of two 2^k, min_exponent <= k <= max_exponent (exact scalings; shrinks towards 1)."""
    if min_exponent > max_exponent:
        raise ValueError(f"min_exponent {min_exponent} > max_exponent {max_exponent}")
    return st.integers(min_exponent, max_exponent).map(lambda k: 2.0**k)


@st.composite
def gradients(draw, W: np.ndarray, scale=None):
    """A Gaussian gradient shaped like W times a scale: a number (that scale), a strategy of numbers,
    or None (gradient_scales(): 2^-200 .. 2^200)."""
    if scale is None:
        scale = gradient_scales()
    factor = draw(scale) if isinstance(scale, st.SearchStrategy) else float(scale)
    return factor * _generator(draw).standard_normal(np.shape(W))


def orthogonal_matrices(n: int, det: int | None = None, batch=()) -> st.SearchStrategy[np.ndarray]:
    """Haar-random matrices of O(n), shape batch + (n, n); det +1 or -1 restricts to that component
    (the first column's sign is flipped where the determinant is the other one)."""
    if det not in (None, 1, -1):
        raise ValueError(f"det must be None, 1 or -1, got {det!r}")
    if not isinstance(n, int) or n < 1:
        raise ValueError(f"n must be a positive integer, got {n!r}")
    return _orthogonal_matrices(n, det, tuple(batch))


@st.composite
def _orthogonal_matrices(draw, n: int, det, batch):
    Q = ri.random_orthogonal(n, _generator(draw), batch)
    if det is not None:
        flip = np.where(np.linalg.det(Q) * det < 0, -1.0, 1.0)
        Q = Q.copy()
        Q[..., :, 0] *= flip[..., None]
    return Q


@st.composite
def configs(draw, lr=None, trust_radius=None, weight_decay=None, eps=None, betas=None):
    """reference_impl.StiefelAdamConfig; each hyper-parameter a value, a strategy, or None for a
    default range: lr 10^[-4, 0], betas in [0, 0.999], eps in {0, 1e-8}, trust_radius in
    {0.1, 0.5, 1, inf}, weight_decay in {0, 0.01, 1}."""

    def pick(value, default):
        chosen = default if value is None else value
        return draw(chosen) if isinstance(chosen, st.SearchStrategy) else chosen

    beta = st.sampled_from([0.9, 0.0, 0.5, 0.99, 0.999])
    return ri.StiefelAdamConfig(
        lr=pick(lr, st.integers(-4, 0).map(lambda k: 10.0**k)),
        betas=tuple(pick(betas, st.tuples(beta, beta))),
        eps=pick(eps, st.sampled_from([0.0, 1e-8])),
        trust_radius=pick(trust_radius, st.sampled_from([0.5, 0.1, 1.0, math.inf])),
        weight_decay=pick(weight_decay, st.sampled_from([0.0, 0.01, 1.0])),
    )


def cases(claim: str, black_box: bool = False, max_d: int = 6, max_steps: int = 8, max_exponent: int | None = None) -> st.SearchStrategy:
    """A certify.ci.counterexample.Case of claim's trajectory settings (propositions/kit/trajectories.py):
    a setting of the claim, a shape, a batch (0: a bare frame), a number of steps and a seed; its
    check is trajectory_model_W (replace(case, quantity=...) for m, v, bookkeeping). A black box
    takes only its own state: its warm settings start fresh. max_exponent: the largest power of ten
    of a wide setting's gradient scale (default counterexample.WIDE_EXPONENT, 20; the plugin passes
    counterexample.wide_exponent(implementation), 13 for float32 and bfloat16 storage)."""
    from propositions import trajectory_plans

    plans = trajectory_plans()
    if claim not in plans:
        raise ValueError(f"no trajectory settings for claim {claim!r}; known: {', '.join(plans)}")
    if max_d < 1 or max_steps < 1:
        raise ValueError(f"max_d and max_steps must be at least 1, got {max_d} and {max_steps}")
    from certify.ci.counterexample import WIDE_EXPONENT

    return _cases(claim, black_box, max_d, max_steps, plans[claim].settings, WIDE_EXPONENT if max_exponent is None else max_exponent)


@st.composite
def _cases(draw, claim, black_box, max_d, max_steps, settings, max_exponent):
    from certify.ci.counterexample import Case

    setting = draw(st.sampled_from(settings))
    d = draw(st.integers(1, max_d))
    r = draw(st.integers(1, d))
    wide = setting.gradients == "wide"
    if wide:
        exponent = draw(st.integers(-max_exponent, max_exponent))
    elif setting.eps > 0 and setting.gradients == "gaussian":
        # where eps is set, the gradient's scale decides whether it matters (x = eps / sqrt(v^)): scales
        # down to 10^-EPS_DECADES make x reach 1e-2 at eps = 1e-8, where a misplaced eps shows at any
        # precision (at unit scale x = 1e-8 is below float32's resolution)
        exponent = draw(st.integers(-min(EPS_DECADES, max_exponent), 0))
    else:
        exponent = 0
    return Case(claim, "W", d, r, draw(st.integers(0, 3)),
                draw(st.integers(1, max_steps)), "fresh" if black_box else setting.start, "gaussian" if wide else setting.gradients,
                exponent, setting.step_length, tuple(setting.betas),
                setting.eps, setting.trust_radius, setting.weight_decay, draw(seeds()))


EPS_DECADES = 6


__all__ = ["cases", "configs", "frame_shapes", "gradient_scales", "gradients", "orthogonal_matrices", "points_and_tangents",
           "seeds", "stiefel_points", "tangent_vectors"]
