"""High-precision twin of the step: one frame, mpmath at a chosen number of digits (default 50).

Inputs are float64 arrays, converted exactly (every float64 is a dyadic rational that mpmath holds
exactly at any precision of at least 53 bits), so the twin evaluates the same mathematical function
at the same point; its own rounding is about 10^-dps, far below float64's u = 2^-53 ~ 1.1e-16 for
dps >= 30. It is the oracle for accuracy claims: the float64 result minus the twin's result is the
float64 rounding error alone.

The polar factor is computed from the actual Gram matrix, (W + xi) ((W + xi)^T (W + xi))^(-1/2),
with the inverse square root from mpmath's symmetric eigensolver; this equals U V^T of the SVD in
exact arithmetic for any full-rank W + xi.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import mpmath
import numpy as np

from ._validation import check_float64_array, check_frame, check_same_shape
from .adam import StiefelAdamConfig, StiefelAdamState


class HighPrecisionState(NamedTuple):
    m: mpmath.matrix
    v: mpmath.mpf
    t: int


def _context(dps: int) -> mpmath.ctx_mp.MPContext:
    if not isinstance(dps, int) or dps < 20:
        raise ValueError(f"dps must be an integer >= 20 (digits), got {dps!r}")
    ctx = mpmath.mp.clone()
    ctx.dps = dps
    return ctx


def to_mp(A: np.ndarray, ctx=None) -> mpmath.matrix:
    """Exact conversion of a 2-D float64 array to an mpmath matrix."""
    ctx = mpmath.mp if ctx is None else ctx
    A = np.asarray(A, dtype=np.float64)
    if A.ndim != 2:
        raise ValueError(f"the high-precision twin works on one frame (2-D array), got shape {A.shape}")
    return ctx.matrix([[ctx.mpf(float(x)) for x in row] for row in A])


def to_float64(M: mpmath.matrix) -> np.ndarray:
    """Round each entry of an mpmath matrix to the nearest float64."""
    return np.array([[float(M[i, j]) for j in range(M.cols)] for i in range(M.rows)], dtype=np.float64)


def _sym(ctx, A):
    return (A + A.T) * ctx.mpf(0.5)


def _project(ctx, W, G):
    return G - W * _sym(ctx, W.T * G)


def _polar(ctx, A):
    gram = A.T * A
    eigenvalues, eigenvectors = ctx.eigsy(gram)
    n = gram.rows
    inverse_sqrt = ctx.zeros(n, n)
    for k in range(n):
        column = eigenvectors[:, k]
        inverse_sqrt += (column * column.T) / ctx.sqrt(eigenvalues[k])
    return A * inverse_sqrt


def _frobenius(ctx, A):
    return ctx.sqrt(ctx.fsum(A[i, j] ** 2 for i in range(A.rows) for j in range(A.cols)))


def project_tangent_mp(W: np.ndarray, G: np.ndarray, dps: int = 50) -> mpmath.matrix:
    """P_W(G) at dps digits for one frame W (d, r) and G (d, r), both float64."""
    check_frame("W", W)
    check_float64_array("G", G)
    check_same_shape("G", G, "W", W.shape)
    ctx = _context(dps)
    return _project(ctx, to_mp(W, ctx), to_mp(G, ctx))


def polar_retract_mp(W: np.ndarray, xi: np.ndarray, dps: int = 50) -> mpmath.matrix:
    """polar(W + xi) at dps digits for one frame W (d, r) and xi (d, r), both float64."""
    check_frame("W", W)
    check_float64_array("xi", xi)
    check_same_shape("xi", xi, "W", W.shape)
    ctx = _context(dps)
    return _polar(ctx, to_mp(W, ctx) + to_mp(xi, ctx))


def step_mp(W: np.ndarray, G: np.ndarray, state, config: StiefelAdamConfig, dps: int = 50, validate: bool = True):
    """docs/algorithm.md, one frame, at dps digits. Returns (W_new, HighPrecisionState).

    state is a float64 StiefelAdamState (fresh or from the float64 step, converted exactly) or a
    HighPrecisionState from an earlier call (to follow a whole trajectory in high precision).
    validate=False: W need not be a frame to float64 accuracy (a float32 implementation's frame, off
    by its rounding): the formulas are evaluated at the W given.
    """
    if validate:
        check_frame("W", W)
    check_float64_array("G", G)
    check_same_shape("G", G, "W", W.shape)
    if not isinstance(config, StiefelAdamConfig):
        raise ValueError(f"config must be a StiefelAdamConfig, got {type(config).__name__}")
    ctx = _context(dps)
    if isinstance(state, StiefelAdamState):
        m, v, t = to_mp(state.m, ctx), ctx.mpf(float(np.asarray(state.v))), state.t
    elif isinstance(state, HighPrecisionState):
        m, v, t = ctx.matrix(state.m), ctx.mpf(state.v), state.t
    else:
        raise ValueError(f"state must be a StiefelAdamState or HighPrecisionState, got {type(state).__name__}")
    W_mp = to_mp(W, ctx)
    d, r = W.shape
    beta1, beta2 = ctx.mpf(config.betas[0]), ctx.mpf(config.betas[1])
    lr, eps, weight_decay = ctx.mpf(config.lr), ctx.mpf(config.eps), ctx.mpf(config.weight_decay)
    g = _project(ctx, W_mp, to_mp(G, ctx) + weight_decay * W_mp)
    m = beta1 * m + (1 - beta1) * g
    v = beta2 * v + (1 - beta2) * _frobenius(ctx, g) ** 2 / (d * r)
    t = t + 1
    m_hat = m / (1 - beta1**t)
    v_hat = v / (1 - beta2**t)
    if v_hat == 0:
        xi = ctx.zeros(d, r)
    else:
        xi = -lr * m_hat / (ctx.sqrt(v_hat) + eps)
    if not math.isinf(config.trust_radius):
        norm = _frobenius(ctx, xi)
        radius = ctx.mpf(config.trust_radius)
        if norm > radius:
            xi = xi * (radius / norm)
    W_new = _polar(ctx, W_mp + xi)
    m_new = _project(ctx, W_new, m)
    return W_new, HighPrecisionState(m=m_new, v=v, t=t)


class HighPrecisionStep(NamedTuple):
    """One step of trajectory_mp: the new frame, the state, and the norms of the step (floats):
    ||G||, ||g||, ||m|| before its transport, v, v^ and ||xi|| before the trust region."""

    W: mpmath.matrix
    state: HighPrecisionState
    norms: dict


def frobenius_mp(A: mpmath.matrix, ctx=None):
    """||A||_F of an mpmath matrix, in its context ctx (mpmath.mp by default)."""
    return _frobenius(mpmath.mp if ctx is None else ctx, A)


def context(dps: int):
    """An mpmath context at dps decimal digits (dps >= 20), for matrices a caller forms itself."""
    return _context(dps)


def polar_mp(A: mpmath.matrix, dps: int = 50, ctx=None) -> mpmath.matrix:
    """polar(A) = A (A^T A)^(-1/2) at dps digits (or in the context ctx, of which A must be a matrix)
    for an mpmath matrix A (d, r) of full rank."""
    return _polar(_context(dps) if ctx is None else ctx, A)


def trajectory_mp(W0: mpmath.matrix, gradients, config: StiefelAdamConfig, ctx) -> list[HighPrecisionStep]:
    """docs/algorithm.md from a fresh state for one frame, every quantity in the mpmath context ctx
    (`context(dps)`): W0 and each gradient are matrices (d, r) of ctx, formed exactly by the caller,
    so that no input is rounded to float64 between the steps (as step_mp's float64 frames would be).
    Returns one HighPrecisionStep per gradient."""
    if not isinstance(config, StiefelAdamConfig):
        raise ValueError(f"config must be a StiefelAdamConfig, got {type(config).__name__}")
    d, r = W0.rows, W0.cols
    beta1, beta2 = ctx.mpf(config.betas[0]), ctx.mpf(config.betas[1])
    lr, eps, weight_decay = ctx.mpf(config.lr), ctx.mpf(config.eps), ctx.mpf(config.weight_decay)
    W, m, v, t = W0, ctx.zeros(d, r), ctx.mpf(0), 0
    steps = []
    for G in gradients:
        g = _project(ctx, W, G + weight_decay * W)
        m = beta1 * m + (1 - beta1) * g
        v = beta2 * v + (1 - beta2) * _frobenius(ctx, g) ** 2 / (d * r)
        t = t + 1
        m_hat, v_hat = m / (1 - beta1**t), v / (1 - beta2**t)
        xi = ctx.zeros(d, r) if v_hat == 0 else -lr * m_hat / (ctx.sqrt(v_hat) + eps)
        norms = {"G_norm": float(_frobenius(ctx, G)), "g_norm": float(_frobenius(ctx, g)), "m_norm": float(_frobenius(ctx, m)),
                 "v": float(v), "v_hat": float(v_hat), "xi_norm": float(_frobenius(ctx, xi))}
        if not math.isinf(config.trust_radius):
            norm, radius = _frobenius(ctx, xi), ctx.mpf(config.trust_radius)
            if norm > radius:
                xi = xi * (radius / norm)
        W = _polar(ctx, W + xi)
        m = _project(ctx, W, m)
        steps.append(HighPrecisionStep(W=W, state=HighPrecisionState(m=m, v=v, t=t), norms=norms))
    return steps
