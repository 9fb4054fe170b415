"""A single-head softmax attention layer in NumPy with hand-written gradients (used by P6).

Shapes (float64, any leading batch axes "..." shared by all arguments, one layer per batch index):

    X    (..., n, d)     tokens                      W_Q, W_K (..., d, r)   query / key frames
    W_V  (..., d, d_v)   values                      Y        (..., n, d_v) regression target

    Q = X W_Q,  K = X W_K,  V = X W_V,  L = Q K^T / sqrt(r)        (attention logits, (..., n, n))
    A = softmax(L) along the last axis,  O = A V,  loss = 1/2 ||O - Y||_F^2      (per layer, (...))

Backward pass (the chain rule, written out):

    dO = O - Y,   dA = dO V^T,   Gbar = dloss/dL = A * (dA - rowsum(dA * A)),
    G_Q = X^T Gbar K / sqrt(r),   G_K = X^T Gbar^T Q / sqrt(r),   G_V = X^T A^T dO.

The loss depends on (W_Q, W_K) only through W_Q W_K^T, which is what P6 is about.

`rounding_bounds` carries a first-order running error bound through the same operations
(Higham, Accuracy and Stability of Numerical Algorithms, 2002, sec. 3.3): each product of a
length-k inner product adds gamma_k |a|^T |b|, each elementwise operation u |result|, and errors of
the inputs are propagated through the absolute values of the partial derivatives. The softmax is
handled through its Jacobian, |dA_i| <= a_i (|dl_i| + E_a |dl|), with the rounding of exp, of the
length-n sum and of the division added as a relative (gamma_n + 9u) per entry. The bounds are first
order in u; callers apply a factor 2 for the dropped O(u^2) terms.

The softmax constant, counted: a_i = e_i / s with e_i = exp(l_i - max) and s = sum_j e_j. numpy's
float64 exp is within EXP_ULPS = 2 ulp of the exact value (a relative error of at most 2 EXP_ULPS u
= 4u, one ulp being at most 2u relative; tests/test_bounds.py measures it against mpmath over the
softmax's argument range). The numerator carries that 4u; the sum of the computed e_j carries the
weighted mean of their errors, at most another 4u, and its own length-n rounding gamma_{n-1} <=
gamma_n; the division adds u. In all gamma_n + (4 + 4 + 1) u = gamma_n + 9u relative per entry.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np

from reference_impl import UNIT_ROUNDOFF

u = UNIT_ROUNDOFF
# numpy's float64 exp is accurate to this many ulps (module docstring; measured in tests/test_bounds.py)
EXP_ULPS = 2
# the softmax's relative rounding beyond gamma_n: exp in the numerator and, weighted, in the sum (2 EXP_ULPS u
# each, an ulp being at most 2u relative) and the division (u)
SOFTMAX_ROUNDING = 2 * (2 * EXP_ULPS) + 1


def _gamma(k: int) -> float:
    return k * u / (1 - k * u)


def _t(A: np.ndarray) -> np.ndarray:
    return np.swapaxes(A, -1, -2)


class AttentionForward(NamedTuple):
    """Intermediate values of the forward pass (shapes in the module docstring); loss: (...)."""

    Q: np.ndarray
    K: np.ndarray
    V: np.ndarray
    logits: np.ndarray
    weights: np.ndarray
    output: np.ndarray
    residual: np.ndarray
    loss: np.ndarray


class AttentionGradients(NamedTuple):
    """Euclidean gradients of the loss: W_Q, W_K (..., d, r); W_V (..., d, d_v); logits (..., n, n)."""

    W_Q: np.ndarray
    W_K: np.ndarray
    W_V: np.ndarray
    logits: np.ndarray


def softmax(L: np.ndarray) -> np.ndarray:
    """Row softmax along the last axis, with the row maximum subtracted (no overflow)."""
    shifted = L - np.max(L, axis=-1, keepdims=True)
    e = np.exp(shifted)
    return e / np.sum(e, axis=-1, keepdims=True)


def forward(X, W_Q, W_K, W_V, Y) -> AttentionForward:
    """The forward pass; returns every intermediate (see AttentionForward)."""
    r = W_Q.shape[-1]
    Q = X @ W_Q
    K = X @ W_K
    V = X @ W_V
    logits = Q @ _t(K) / math.sqrt(r)
    weights = softmax(logits)
    output = weights @ V
    residual = output - Y
    loss = 0.5 * np.sum(residual * residual, axis=(-2, -1))
    return AttentionForward(Q, K, V, logits, weights, output, residual, loss)


def loss(X, W_Q, W_K, W_V, Y) -> np.ndarray:
    """1/2 ||softmax(X W_Q W_K^T X^T / sqrt r) X W_V - Y||_F^2 per layer, shape (...)."""
    return forward(X, W_Q, W_K, W_V, Y).loss


def backward(X, fwd: AttentionForward) -> AttentionGradients:
    """Hand-written gradients from a forward pass (formulas in the module docstring)."""
    r = fwd.Q.shape[-1]
    root_r = math.sqrt(r)
    dA = fwd.residual @ _t(fwd.V)
    row_mean = np.sum(dA * fwd.weights, axis=-1, keepdims=True)
    gbar = fwd.weights * (dA - row_mean)
    X_t = _t(X)
    G_Q = X_t @ (gbar @ fwd.K / root_r)
    G_K = X_t @ (_t(gbar) @ fwd.Q / root_r)
    G_V = X_t @ (_t(fwd.weights) @ fwd.residual)
    return AttentionGradients(G_Q, G_K, G_V, gbar)


def loss_and_gradients(X, W_Q, W_K, W_V, Y) -> tuple[np.ndarray, AttentionGradients, AttentionForward]:
    """(loss (...), gradients, forward intermediates) of the layer."""
    fwd = forward(X, W_Q, W_K, W_V, Y)
    return fwd.loss, backward(X, fwd), fwd


class RoundingBounds(NamedTuple):
    """First-order entrywise bounds on |computed - exact|: loss (...), W_Q, W_K, W_V like the
    gradients, logits_gradient like Gbar."""

    loss: np.ndarray
    W_Q: np.ndarray
    W_K: np.ndarray
    W_V: np.ndarray
    logits_gradient: np.ndarray


def rounding_bounds(X, W_Q, W_K, W_V, fwd: AttentionForward, grads: AttentionGradients) -> RoundingBounds:
    """Running error bound of `forward` and `backward` (module docstring), entrywise, first order."""
    n, d = X.shape[-2], X.shape[-1]
    r, d_v = W_Q.shape[-1], W_V.shape[-1]
    root_r = math.sqrt(r)
    aX = np.abs(X)
    aQ, aK, aV = np.abs(fwd.Q), np.abs(fwd.K), np.abs(fwd.V)
    A = fwd.weights
    e_Q = _gamma(d) * (aX @ np.abs(W_Q))
    e_K = _gamma(d) * (aX @ np.abs(W_K))
    e_V = _gamma(d) * (aX @ np.abs(W_V))
    # L = Q K^T / sqrt r: input errors, the length-r products, the division (and sqrt r itself)
    e_L = (e_Q @ _t(aK) + aQ @ _t(e_K) + _gamma(r) * (aQ @ _t(aK))) / root_r + 2 * u * np.abs(fwd.logits)
    # the shifted argument l - max rounds by u |l - max|; it perturbs the softmax like e_L does
    shift = np.abs(fwd.logits - np.max(fwd.logits, axis=-1, keepdims=True))
    e_arg = e_L + u * shift
    e_A = A * (e_arg + np.sum(A * e_arg, axis=-1, keepdims=True)) + (_gamma(n) + SOFTMAX_ROUNDING * u) * A
    e_O = e_A @ aV + A @ e_V + _gamma(n) * (A @ aV)
    res = fwd.residual
    e_res = e_O + u * np.abs(res)
    e_loss = np.sum(np.abs(res) * e_res, axis=(-2, -1)) + _gamma(n * d_v + 1) * fwd.loss
    # backward
    dA = res @ _t(fwd.V)
    e_dA = e_res @ _t(aV) + np.abs(res) @ _t(e_V) + _gamma(d_v) * (np.abs(res) @ _t(aV))
    e_row = np.sum(e_dA * A + np.abs(dA) * e_A + _gamma(n) * np.abs(dA) * A, axis=-1, keepdims=True)
    row_mean = np.sum(dA * A, axis=-1, keepdims=True)
    centred = np.abs(dA - row_mean)
    e_gbar = e_A * centred + A * (e_dA + e_row + u * centred) + u * np.abs(grads.logits)
    a_gbar = np.abs(grads.logits)
    aX_t = _t(aX)
    # dQ = Gbar K / sqrt r and dK = Gbar^T Q / sqrt r: length-n products, then the division (2u)
    dQ = np.abs(grads.logits @ fwd.K) / root_r
    dK = np.abs(_t(grads.logits) @ fwd.Q) / root_r
    e_dQ = (e_gbar @ aK + a_gbar @ e_K + _gamma(n) * (a_gbar @ aK)) / root_r + 2 * u * dQ
    e_dK = (_t(e_gbar) @ aQ + _t(a_gbar) @ e_Q + _gamma(n) * (_t(a_gbar) @ aQ)) / root_r + 2 * u * dK
    e_GQ = aX_t @ e_dQ + _gamma(n) * (aX_t @ dQ)
    e_GK = aX_t @ e_dK + _gamma(n) * (aX_t @ dK)
    dV = _t(A) @ res
    e_dV = _t(e_A) @ np.abs(res) + _t(A) @ e_res + _gamma(n) * (_t(A) @ np.abs(res))
    e_GV = aX_t @ e_dV + _gamma(n) * (aX_t @ np.abs(dV))
    return RoundingBounds(e_loss, e_GQ, e_GK, e_GV, e_gbar)


def third_derivative_bound(X, W_Q, W_K, W_V, Y, direction: np.ndarray, parameter: str) -> np.ndarray:
    """Bound on |phi'''(t)| for phi(t) = loss(parameter + t direction), valid for every t, per layer.

    parameter: "W_Q", "W_K" or "W_V"; direction shaped like that parameter.

    For W_V the loss is quadratic in t: phi''' = 0. For W_Q (W_K) the logits are affine in t,
    L(t) = L + t L1 with L1 = X E K^T / sqrt r (Q (X E)^T / sqrt r). Along an affine path the row
    softmax a has ||a'||_1 <= R, ||a''||_1 <= 1.25 R^2, ||a'''||_1 <= 2.75 R^3 with R the range of
    the row of L1 (a' = a c, a'' = a (c^2 - Var), a''' = a (c^3 - 3 c Var - kappa_3) with c the
    centred row, |c| <= R, Var <= R^2 / 4, |kappa_3| <= R^3). Each output row o_i = a_i V is a
    convex combination of the rows v_j, so ||o_i^(k)|| <= ||a_i^(k)||_1 v_max and
    ||o_i - y_i|| <= v_max + ||y_i||; phi''' = sum_i 3 <o_i', o_i''> + <o_i - y_i, o_i'''> gives
    |phi'''| <= sum_i R_i^3 v_max (3.75 v_max + 2.75 (v_max + ||y_i||)).
    """
    r = W_Q.shape[-1]
    if parameter == "W_V":
        return np.zeros(X.shape[:-2])
    if parameter == "W_Q":
        L1 = (X @ direction) @ _t(X @ W_K) / math.sqrt(r)
    elif parameter == "W_K":
        L1 = (X @ W_Q) @ _t(X @ direction) / math.sqrt(r)
    else:
        raise ValueError(f"parameter must be 'W_Q', 'W_K' or 'W_V', got {parameter!r}")
    row_range = np.max(L1, axis=-1) - np.min(L1, axis=-1)
    V = X @ W_V
    v_max = np.max(np.linalg.norm(V, axis=-1), axis=-1)
    y_norm = np.linalg.norm(Y, axis=-1)
    v_max = v_max[..., None]
    return np.sum(row_range**3 * v_max * (3.75 * v_max + 2.75 * (v_max + y_norm)), axis=-1)


# Central differences: truncation h^2 |phi'''| / 6 against rounding (eps_f + eps_arg) / h; the
# optimum is h ~ (3 eps / M3)^(1/3), i.e. h ~ u^(1/3) for eps and M3 of order one. A power of two
# makes 2h and the division by it exact.
FD_STEP = 2.0 ** round(math.log2(u ** (1.0 / 3.0)))


def finite_difference_check(X, W_Q, W_K, W_V, Y, directions: dict, h: float = FD_STEP):
    """Central differences of the loss along unit directions, against <G, E>, with their bound.

    directions: {"W_Q": E_Q, "W_K": E_K, "W_V": E_V}, each unit Frobenius norm per layer, shaped
    like the parameter. Returns {parameter: (residual (...), bound (...))}.

    residual = |(phi(h) - phi(-h)) / (2h) - <G, E>|. bound (per layer):
        h^2 M3 / 6                                   truncation, M3 from third_derivative_bound
      + 2 eps_f / h                                  rounding of the two loss values (eps_f from
                                                     rounding_bounds; 2 covers the change of eps_f
                                                     over the segment)
      + 2 u (||W|| + h) ||G|| / h                    W +- h E is rounded before the evaluation:
                                                     a perturbation of size u ||W +- hE|| moves
                                                     phi by at most that times the gradient norm
                                                     (2 covers its change over the segment)
      + 2 sum(e_G |E|) + gamma_{size} sum |G| |E|    rounding of the hand gradient and of <G, E>
      + 2 u |fd|                                     the subtraction and division of the difference
    """
    value, grads, fwd = loss_and_gradients(X, W_Q, W_K, W_V, Y)
    errors = rounding_bounds(X, W_Q, W_K, W_V, fwd, grads)
    params = {"W_Q": W_Q, "W_K": W_K, "W_V": W_V}
    out = {}
    for name, E in directions.items():
        args = dict(params)
        args[name] = params[name] + h * E
        plus = loss(X, args["W_Q"], args["W_K"], args["W_V"], Y)
        args[name] = params[name] - h * E
        minus = loss(X, args["W_Q"], args["W_K"], args["W_V"], Y)
        fd = (plus - minus) / (2 * h)
        G = getattr(grads, name)
        e_G = getattr(errors, name)
        directional = np.sum(G * E, axis=(-2, -1))
        m3 = third_derivative_bound(X, W_Q, W_K, W_V, Y, E, name)
        W_norm = np.linalg.norm(params[name], axis=(-2, -1))
        G_norm = np.linalg.norm(G, axis=(-2, -1))
        size = G.shape[-2] * G.shape[-1]
        bound = (
            h * h * m3 / 6
            + 2 * errors.loss / h
            + 2 * u * (W_norm + h) * G_norm / h
            + 2 * np.sum(e_G * np.abs(E), axis=(-2, -1))
            + _gamma(size) * np.sum(np.abs(G * E), axis=(-2, -1))
            + 2 * u * np.abs(fd)
        )
        out[name] = (np.abs(fd - directional), bound)
    return out


def torch_gradients(X, W_Q, W_K, W_V, Y):
    """Gradients of the same loss by torch autograd in float64, or None when torch is missing.

    Returns an AttentionGradients with logits = None (torch does not expose Gbar here).
    """
    try:
        import torch
    except ImportError:
        return None
    tensors = [torch.from_numpy(np.ascontiguousarray(a)) for a in (X, W_Q, W_K, W_V, Y)]
    X_t, Q_w, K_w, V_w, Y_t = tensors
    for w in (Q_w, K_w, V_w):
        w.requires_grad_(True)
    r = W_Q.shape[-1]
    logits = (X_t @ Q_w) @ (X_t @ K_w).transpose(-1, -2) / math.sqrt(r)
    output = torch.softmax(logits, dim=-1) @ (X_t @ V_w)
    value = 0.5 * ((output - Y_t) ** 2).sum()
    value.backward()
    return AttentionGradients(Q_w.grad.numpy(), K_w.grad.numpy(), V_w.grad.numpy(), None)
