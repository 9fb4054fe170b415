"""The direction a step applied: read from its hook, or recovered from W_new by the inverse retraction.

A claim about the step's direction xi must test the xi of the step under test, not one the checker
rebuilds from the step's state (a rebuilt xi agrees with the algorithm by construction, whatever
the step did). `step_direction` asks the variant for it: registered variants return it from the
same function that makes the step (reference_impl.controls.Variant.step_with_direction). A Variant
built from a plain step has no hook; its xi is then recovered from W_new by the inverse of the
polar retraction (`inverse_polar_retraction`), with a stated error bound.

The inverse of the polar retraction
    For tangent xi at W (W^T W = I, W^T xi + xi^T W = 0), W + xi = W_new H with
    W_new = polar(W + xi) and H = (W + xi)^T W_new = ((W + xi)^T (W + xi))^(1/2) = (I + xi^T xi)^(1/2)
    symmetric positive definite. Hence xi = W_new H - W, and tangency of xi reads
        W^T (W_new H - W) + (H W_new^T - W^T) W = 0  <=>  A H + H A^T = 2 I,   A = W^T W_new,
    a Lyapunov equation for H. Conversely, for any W_new on St(d, r) whose solution S of
    A S + S A^T = 2 I is symmetric positive definite, xi = W_new S - W is tangent (up to
    2 ||W^T W - I|| when W is a float frame) and polar(W + xi) = polar(W_new S) = W_new exactly.
    The solution is unique while the Lyapunov operator L(S) = A S + S A^T is invertible; writing
    L = 2 id + E with ||E(S)|| <= 2 ||A - I||_2 ||S||, a Neumann series gives
        ||L^-1|| <= 1 / (2 (1 - ||A - I||_2))    when ||A - I||_2 < 1,
    which holds for every step inside the trust region Delta <= 1/2: A - I = (H^-1 - I) + Omega H^-1
    with Omega = W^T xi, so ||A - I||_F <= Delta^2 / 2 + Delta < 1.

Error bound (a posteriori, computed per frame)
    With the float A~ = fl(W^T W_new) (||A~ - A||_F <= gamma_d ||W||_F ||W_new||_F), the computed S~
    and its residual R = 2 I - (A~ S~ + S~ A~^T) evaluated in float64 (rounding <= 2 gamma_r
    ||A~||_F ||S~||_F), the exact solution S for the exact A satisfies
        ||S~ - S||_F <= kappa_L (||R||_F + 2 gamma_r ||A~||_F ||S~||_F + 2 ||A~ - A||_F ||S~||_F),
        kappa_L = 1 / (2 (1 - ||A~ - I||_F - ||A~ - A||_F))
    (the Frobenius norm bounds the 2-norm). Forming xi = fl(fl(W_new S~) - W) adds
    gamma_r ||W_new||_F ||S~||_F + u (||W_new S~||_F + ||W||_F), and ||W_new||_2 <= 1 + ||W_new^T W_new - I||_F
    multiplies the error of S~. The sum is `error_bound`: ||xi~ - xi*|| for xi* the exact inverse of
    the float inputs. It is infinite where the bound does not apply (||A~ - I||_F too large, S~
    not positive definite: W_new is not a polar retraction of W by a tangent vector of norm <= 1/2).
    Inputs that are themselves rounded move xi* by at most `sensitivity` times ||delta W_new||_F:
    d xi = dW_new S + W_new dS, dS = L^-1(-(dA S + S dA^T)), dA = W^T dW_new, so
        sensitivity = ||S||_F (1 + 2 kappa_L ||W||_F-bound ||W_new||_2).
    A step whose own xi has tangency defect T = W^T xi + xi^T W differs from xi* by
    ||W_new||_2 kappa_L (||T||_F + 2 ||W^T W - I||_F) (the same equation with 2 I + T on the right).
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
import scipy.linalg

from reference_impl import get_variant
from reference_impl.manifold import sym

from .bounds import gamma
from .common import u

# r at most this: the Lyapunov equation is solved batched as an r^2 x r^2 linear system (Kronecker
# form); larger r loop over frames with scipy's Bartels-Stewart solver.
KRONECKER_MAX_R = 8


def _transpose(A: np.ndarray) -> np.ndarray:
    return np.swapaxes(A, -1, -2)


def _frobenius(A: np.ndarray) -> np.ndarray:
    return np.sqrt(np.sum(A * A, axis=(-2, -1)))


def solve_lyapunov(A: np.ndarray, Q: np.ndarray) -> np.ndarray:
    """S with A S + S A^T = Q for each frame: A, Q (..., r, r) float64, returns (..., r, r).

    Row-major vec: vec(A S) = (A kron I) vec(S), vec(S A^T) = (I kron A) vec(S).
    """
    r = A.shape[-1]
    batch = A.shape[:-2]
    A_flat = A.reshape((-1, r, r))
    Q_flat = np.broadcast_to(Q, A.shape).reshape((-1, r, r))
    if r <= KRONECKER_MAX_R:
        eye = np.eye(r)
        K = np.einsum("bik,jl->bijkl", A_flat, eye) + np.einsum("ik,bjl->bijkl", eye, A_flat)
        K = K.reshape((-1, r * r, r * r))
        S = np.linalg.solve(K, Q_flat.reshape((-1, r * r, 1)))[..., 0].reshape((-1, r, r))
    else:
        S = np.stack([scipy.linalg.solve_continuous_lyapunov(a, q) for a, q in zip(A_flat, Q_flat)])
    return S.reshape(batch + (r, r))


class InversePolar(NamedTuple):
    """xi (..., d, r); S (..., r, r) the symmetric factor with W + xi = W_new S; error_bound (...)
    on ||xi - xi*||_F (xi* the exact inverse of the float inputs); sensitivity (...) of xi* to
    W_new; kappa_L (...) the bound on ||L^-1||."""

    xi: np.ndarray
    S: np.ndarray
    error_bound: np.ndarray
    sensitivity: np.ndarray
    kappa_L: np.ndarray


def inverse_polar_retraction(W: np.ndarray, W_new: np.ndarray) -> InversePolar:
    """The tangent xi at W with polar(W + xi) = W_new (see the module docstring), batched.

    W, W_new: (..., d, r) float64 frames. Returns an InversePolar with the per-frame error bound.
    """
    d, r = W.shape[-2], W.shape[-1]
    identity = np.eye(r)
    A = _transpose(W) @ W_new
    # ||A - I||_F < 1 puts every eigenvalue of A within 1 of 1, so no two sum to 0 and the Lyapunov
    # operator is invertible; a frame outside (an output far from W, or not finite) is not recovered
    # (valid below is False there, its bound infinite): it is solved at A = I instead, so that a
    # singular operator never stops the other frames
    inside = _frobenius(A - identity) < 1.0
    S = sym(solve_lyapunov(np.where(inside[..., None, None], A, identity), 2.0 * identity))
    W_new_S = W_new @ S
    xi = W_new_S - W
    norm_W, norm_W_new = _frobenius(W), _frobenius(W_new)
    norm_A, norm_S = _frobenius(A), _frobenius(S)
    A_error = gamma(d) * norm_W * norm_W_new
    residual = _frobenius(2.0 * identity - (A @ S + S @ _transpose(A)))
    distance = _frobenius(A - identity) + A_error
    W_new_two = 1.0 + _frobenius(_transpose(W_new) @ W_new - identity) + gamma(d) * norm_W_new**2
    W_two = 1.0 + _frobenius(_transpose(W) @ W - identity) + gamma(d) * norm_W**2
    positive = np.linalg.eigvalsh(S)[..., 0] > 0
    valid = (distance < 1.0) & positive & inside
    with np.errstate(divide="ignore", invalid="ignore"):
        kappa_L = np.where(valid, 1.0 / (2.0 * (1.0 - distance)), np.inf)
        S_error = kappa_L * (residual + 2.0 * gamma(r) * norm_A * norm_S + 2.0 * A_error * norm_S)
        error_bound = (W_new_two * S_error + gamma(r) * norm_W_new * norm_S
                       + u * (_frobenius(W_new_S) + norm_W))
        sensitivity = norm_S * (1.0 + 2.0 * kappa_L * W_two * W_new_two)
    error_bound = np.where(valid, error_bound, np.inf)
    return InversePolar(xi, S, error_bound, np.where(valid, sensitivity, np.inf), kappa_L)


class StepDirection(NamedTuple):
    """W_new, state_new: the step's output; xi: its direction; source: "hook" (the step's own xi,
    exact) or "inverse" (recovered from W_new); error_bound (...): 0 for the hook, the inverse's
    a posteriori bound otherwise; inverse: the InversePolar record (None for the hook)."""

    W_new: np.ndarray
    state_new: object
    xi: np.ndarray
    source: str
    error_bound: np.ndarray
    inverse: InversePolar | None


def step_direction(variant, W: np.ndarray, G: np.ndarray, state, config) -> StepDirection:
    """Run one step of `variant` (a name or a reference_impl.Variant) and return its direction.

    With a hook the step and its xi come from one call; without one, the step runs as it is and xi
    is recovered from (W, W_new) by `inverse_polar_retraction`.
    """
    variant = get_variant(variant)
    if variant.step_with_direction is not None:
        W_new, state_new, xi = variant.step_with_direction(W, G, state, config)
        return StepDirection(W_new, state_new, xi, "hook", np.zeros(W.shape[:-2]), None)
    W_new, state_new = variant.step(W, G, state, config)
    inverse = inverse_polar_retraction(W, W_new)
    return StepDirection(W_new, state_new, inverse.xi, "inverse", inverse.error_bound, inverse)


def variant_name(optimizer) -> str:
    """The name of a variant given by name or as a Variant object (for check labels)."""
    return get_variant(optimizer).name


__all__ = [
    "KRONECKER_MAX_R",
    "InversePolar",
    "StepDirection",
    "inverse_polar_retraction",
    "solve_lyapunov",
    "step_direction",
    "variant_name",
]

