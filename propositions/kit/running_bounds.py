"""Running rounding bounds of whole float64 StiefelAdam trajectories, and the trajectory plumbing
that the claims comparing two trajectories share (P2 scales the gradients, P4 rotates the inputs).

`record_trajectory` runs the reference and records the norms that `trajectory_rounding_bound`
needs; `run_trajectory` runs the optimizer under test; the bound is a first-order recursion over
the steps (derivation in its docstring), so two trajectories that agree in exact arithmetic are
compared against the sum of their two bounds.
"""

from __future__ import annotations

import math

import numpy as np

from reference_impl import adam
from reference_impl.adam import StiefelAdamConfig, frobenius
from reference_impl.controls import get_variant
from reference_impl.manifold import project_tangent

from .._common import chunk_sizes, u
from .bounds import POLAR_ERROR_TEXT, POLAR_PERTURBATION_TEXT, polar_error_bound, polar_perturbation_bound

# The largest frames (up to (1024, 128)) run in the main trajectory check; the other checks use
# frames up to (128, 16), which keeps one run inside its time budget.
MEDIUM_SHAPES = ((32, 8), (64, 16), (64, 64), (128, 16))

CHUNK_ENTRIES = 2**18


# --------------------------------------------------------------------------------------------
# Error analysis
# --------------------------------------------------------------------------------------------


def step_polar_error(d: int, r: int, step_norm, distance=0.0):
    """polar_error_bound of the retraction W + xi of a step of norm step_norm (scalar or per frame).

    For tangent xi at a frame within `distance` (< 1) of St(d, r), the singular values of W + xi
    lie in [1 - distance, sqrt(1 + ||xi||^2) (1 + distance)] (P3(b)), so cond(W + xi) <= sqrt(1 +
    ||xi||^2) (1 + distance) / (1 - distance).
    """
    step_norm = np.asarray(step_norm, dtype=np.float64)
    distance = np.asarray(distance, dtype=np.float64)
    cond = np.sqrt(1.0 + step_norm**2) * (1.0 + distance) / (1.0 - distance)
    return polar_error_bound(d, r, cond)


TRAJECTORY_BOUND_TEXT = (
    "trajectory_rounding_bound (propositions/kit/running_bounds.py), the running first-order bound on a "
    "float64 trajectory's distance to the exact one: projection (d + r + 5) u ||G~||, mean square (d r + 3) u, "
    "the polar factor's rounding at cond(W + xi) <= sqrt(1 + ||xi||^2) [" + POLAR_ERROR_TEXT + "], propagated "
    "through the polar factor [" + POLAR_PERTURBATION_TEXT + "] and the quadratic dependence of P_W on W"
)


def trajectory_rounding_bound(norms: dict, d: int, r: int, config: StiefelAdamConfig, *, scale=1.0,
                              input_relative_error=0.0, initial_distance=0.0) -> dict:
    """Running first-order bound on the distance of a float64 StiefelAdam trajectory to the exact one.

    norms: from `record_trajectory` (arrays of shape (T, n) from the float64 run with scale 1):
    G_norm ||G_t||, g_norm ||g_t||, m_norm ||m_t|| before transport, v, v_hat, xi_norm ||xi_t||
    before the trust region. scale: the c > 0 multiplying the gradients of the run bounded here (its
    exact trajectory has the same W_t, m_t scaled by c, v_t by c^2; norms scale alike, except the
    unscaled decay term lambda W); a scalar or one per frame (n,). input_relative_error (scalar or
    (n,)): entrywise relative error of the gradient
    as handed to the step (u for fl(c G); gamma_d sqrt(d) for a matmul Q G). initial_distance:
    ||W_0 - W_0*|| (n,) or scalar, the distance of the float64 start to the exact frame.

    Returns {"W": (T, n) bound on ||W_t - W_t*||_F, "m": (T, n) bound on ||m_t - m_t*|| / scale,
    "v": (T, n) bound on |v_t - v_t*| / scale^2}.

    Derivation (Higham's standard model, first order in u; ||W||_2 = 1 + O(u)). Write a for the
    bound on ||dW|| before the step, b_m for ||dm|| after the previous transport, b_v for |dv|,
    G~ = G + (lambda / c) W in units of the scaled run, Gc = ||G|| + lambda sqrt(r) / c >= ||G~||:
      g   = P_W(G~): W^T G~ (length d), W sym(.) (length r), sym, subtraction and the decay sum:
            (d + r + 5) u Gc, the input error input_relative_error ||G||, and the dependence of P_W
            on W (P_W is quadratic in W: ||P_W' G - P_W G|| <= 2 ||W' - W|| ||G||): 2 Gc a. This is
            where the rounding of P_W(lambda W) enters: lambda W is not scaled by c.
      m   = beta1 m + (1 - beta1) g: beta1 b_m + (1 - beta1) dg + 3 u ||m||.
      v   = beta2 v + (1 - beta2) ||g||^2 / (d r): the sum of d r squares carries (d r + 3) u
            ||g||^2, its dependence on g is 2 ||g|| dg, and the update 3 u v.
      xi  = -lr m^ / (sqrt(v^) + eps): relative error rho = dm / ||m|| + dv / (2 v) + 6 u (bias
            corrections, square root, division, lr); the trust region is 1-Lipschitz radially and
            Delta / ||xi|| transversally, so ||dxi|| <= min(||xi||, Delta) (rho + 2 u).
      W+  = polar(W + xi): the polar factor is 1 / sigma_min-Lipschitz along segments of W + tangent
            (kit/bounds.polar_perturbation_bound), with sigma_min(W + xi) >= 1 - a for tangent xi at a
            frame within a of St(d, r): a+ = polar_perturbation_bound(a + ||dxi||, 1 - a) + step_polar_error(d, r, min(||xi||, Delta), a), the
            rounding of the computed polar factor (kit/bounds.polar_error_bound at the condition
            number that P3(b) gives for W + xi).
      m+  = P_{W+}(m): b_m+ = dm + (d + r + 4) u ||m|| + 2 ||m|| a+.
    Frames with v = 0 take xi = 0 exactly (g = 0 exactly, the (1, 1) frames), rho = 0 there.
    The amplification per step is about 1 + 4 min(||xi||, Delta) ||G|| / ||m^|| (how much a tilt of
    W tilts the next direction): modest for the step lengths used, but it compounds over T steps,
    and the bound says so.
    """
    beta1, beta2 = config.betas
    trust_radius = config.trust_radius
    weight_decay = config.weight_decay
    G_norm, g_norm, m_norm = norms["G_norm"], norms["g_norm"], norms["m_norm"]
    v, xi_norm = norms["v"], norms["xi_norm"]
    steps, count = G_norm.shape
    a = np.broadcast_to(np.asarray(initial_distance, dtype=np.float64), (count,)).copy()
    b_m = np.zeros(count)
    b_v = np.zeros(count)
    bounds = {"W": np.zeros((steps, count)), "m": np.zeros((steps, count)), "v": np.zeros((steps, count))}
    # Once a reaches 1/2 the first-order analysis no longer applies; the bound is then infinite
    # (vacuous), never a finite number that could be mistaken for a certificate.
    with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
        return _rounding_recursion(G_norm, g_norm, m_norm, v, xi_norm, d, r, beta1, beta2, trust_radius,
                                   weight_decay, scale, input_relative_error, a, b_m, b_v, bounds)


def _rounding_recursion(G_norm, g_norm, m_norm, v, xi_norm, d, r, beta1, beta2, trust_radius, weight_decay,
                        scale, input_relative_error, a, b_m, b_v, bounds):
    projection_rounding = (d + r + 4) * u
    for t in range(G_norm.shape[0]):
        Gc = G_norm[t] + weight_decay * math.sqrt(r) / scale
        dg = (projection_rounding + u) * Gc + input_relative_error * G_norm[t] + 2.0 * Gc * a
        dm = beta1 * b_m + (1 - beta1) * dg + 3 * u * m_norm[t]
        dv = beta2 * b_v + (1 - beta2) * (2 * g_norm[t] * dg + (d * r + 3) * u * g_norm[t] ** 2) / (d * r) + 3 * u * v[t]
        moving = (v[t] > 0) & (m_norm[t] > 0)
        with np.errstate(divide="ignore", invalid="ignore"):
            rho = np.where(moving, dm / np.where(moving, m_norm[t], 1.0) + dv / (2 * np.where(moving, v[t], 1.0)) + 6 * u, 0.0)
        step_norm = np.minimum(xi_norm[t], trust_radius)
        dxi = step_norm * (rho + 2 * u)
        inside = a < 0.5
        e_polar = step_polar_error(d, r, step_norm, np.where(inside, a, 0.0))
        a = np.where(inside, polar_perturbation_bound(a + dxi, 1.0 - a) + e_polar, np.inf)
        b_m = dm + projection_rounding * m_norm[t] + 2 * m_norm[t] * a
        b_v = dv
        bounds["W"][t], bounds["m"][t], bounds["v"][t] = a, b_m, b_v
    return bounds


def _stepper(optimizer: str):
    if optimizer == "stiefel_adam":
        return adam.init, adam._step
    variant = get_variant(optimizer)
    return variant.init, variant.step


def run_trajectory(optimizer: str, W0: np.ndarray, gradients: np.ndarray, config: StiefelAdamConfig):
    """W_t for t = 1..T, shape (T, n, d, r), and the final states' list, for gradients (T, n, d, r)."""
    init, step = _stepper(optimizer)
    W, state = W0, init(W0)
    frames, states = [], []
    with np.errstate(all="ignore"):
        for G in gradients:
            W, state = step(W, G, state, config)
            frames.append(W)
            states.append(state)
    return np.stack(frames), states


def record_trajectory(W0: np.ndarray, gradients: np.ndarray, config: StiefelAdamConfig):
    """The real float64 trajectory and the norms that `trajectory_rounding_bound` needs.

    W0: (n, d, r); gradients: (T, n, d, r). Returns (W (T, n, d, r), states, norms) with norms a
    dict of (T, n) arrays: G_norm, g_norm, m_norm (before transport), v, v_hat, xi_norm (before
    the trust region). The norms are recomputed from the stages of docs/algorithm.md.
    """
    beta1, beta2 = config.betas
    W, state = W0, adam.init(W0)
    frames, states = [], []
    norms = {key: [] for key in ("G_norm", "g_norm", "m_norm", "v", "v_hat", "xi_norm")}
    for t, G in enumerate(gradients, start=1):
        g = project_tangent(W, G + config.weight_decay * W, validate=False)
        m_norm = frobenius(beta1 * state.m + (1 - beta1) * g)
        W, state = adam._step(W, G, state, config)
        v_hat = state.v / (1 - beta2**t)
        with np.errstate(divide="ignore", invalid="ignore"):
            xi_norm = np.where(v_hat > 0, config.lr * m_norm / (1 - beta1**t) / (np.sqrt(v_hat) + config.eps), 0.0)
        for key, value in (("G_norm", frobenius(G)), ("g_norm", frobenius(g)), ("m_norm", m_norm),
                           ("v", state.v), ("v_hat", v_hat), ("xi_norm", xi_norm)):
            norms[key].append(value)
        frames.append(W)
        states.append(state)
    return np.stack(frames), states, {key: np.stack(value) for key, value in norms.items()}


def frame_distance(A: np.ndarray, B: np.ndarray) -> np.ndarray:
    """||A - B||_F over the last two axes; NaN where either is not finite."""
    with np.errstate(invalid="ignore", over="ignore"):
        diff = np.sqrt(np.sum((A - B) ** 2, axis=(-2, -1)))
    finite = np.all(np.isfinite(A), axis=(-2, -1)) & np.all(np.isfinite(B), axis=(-2, -1))
    return np.where(finite, diff, np.nan)


def worst_over_steps(residual: np.ndarray, bound: np.ndarray):
    """Per frame, the step t with the largest residual / bound: (residual (n,), bound (n,), t (n,))."""
    ratio = np.where(np.isnan(residual), np.inf, residual) / bound
    t = np.argmax(ratio, axis=0)
    columns = np.arange(residual.shape[1])
    return residual[t, columns], bound[t, columns], t


def plan_chunks(plan):
    """(d, r, count, chunk index) for every chunk of every ShapeBatch of a shape plan.

    Chunks hold at most CHUNK_ENTRIES entries per matrix, so that a trajectory of T steps keeps
    T * CHUNK_ENTRIES * 8 bytes per stacked array (32 MiB at T = 16) whatever the profile.
    """
    for batch in plan:
        for index, size in enumerate(chunk_sizes(batch.count, batch.d, batch.r, CHUNK_ENTRIES)):
            yield batch.d, batch.r, size, index


def initial_distance_to_manifold(W0):
    r = W0.shape[-1]
    gram = np.swapaxes(W0, -1, -2) @ W0
    # ||W - polar(W)|| = ||S - I|| <= ||S^2 - I|| = ||W^T W - I||, plus the rounding of the Gram.
    return np.linalg.norm(gram - np.eye(r), axis=(-2, -1)) + (W0.shape[-2] + 2) * math.sqrt(r) * u
