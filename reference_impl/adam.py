"""StiefelAdam, one step, exactly as docs/algorithm.md (batched over leading axes).

The shape of the optimizer follows optax: `init(W) -> state` and
`step(W, G, state, config) -> (W_new, state_new)`, pure functions on float64 arrays with the state a
small immutable named tuple. Each frame along the leading axes has its own scalar second moment v
and its own trust region; frames never share statistics.

    1. G~ = G + lambda W
    2. g  = P_W(G~)
    3. m  = beta1 m + (1 - beta1) g
    4. v  = beta2 v + (1 - beta2) ||g||^2 / (d r)
    5. t  = t + 1;  m^ = m / (1 - beta1^t);  v^ = v / (1 - beta2^t)
    6. xi = -lr m^ / (sqrt(v^) + eps);  xi = 0 where v^ = 0
    7. if ||xi|| > Delta: xi = xi Delta / ||xi||
    8. W+ = R_W(xi);  m+ = P_{W+}(m)

The same skeleton, with one stage swapped, gives the controls of docs/algorithm.md#the-controls
(`reference_impl.controls`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np

from ._validation import check_float64_array, check_frame, check_real, check_same_shape
from .manifold import polar_retract, project_tangent


@dataclass(frozen=True)
class StiefelAdamConfig:
    """Hyper-parameters; validated on construction (ValueError names the argument and the rule)."""

    lr: float = 1e-3
    betas: tuple[float, float] = (0.9, 0.999)
    eps: float = 1e-8
    trust_radius: float = 0.5
    weight_decay: float = 0.0

    def __post_init__(self):
        object.__setattr__(self, "lr", check_real("lr", self.lr, "0 < lr < inf", lambda x: 0 < x < math.inf))
        betas = self.betas
        if not isinstance(betas, (tuple, list)) or len(betas) != 2:
            raise ValueError(f"betas must be a pair (beta1, beta2), got {betas!r}")
        beta1 = check_real("betas[0] (beta1)", betas[0], "0 <= beta1 < 1", lambda x: 0 <= x < 1)
        beta2 = check_real("betas[1] (beta2)", betas[1], "0 <= beta2 < 1", lambda x: 0 <= x < 1)
        object.__setattr__(self, "betas", (beta1, beta2))
        object.__setattr__(self, "eps", check_real("eps", self.eps, "0 <= eps < inf", lambda x: 0 <= x < math.inf))
        object.__setattr__(
            self,
            "trust_radius",
            check_real("trust_radius", self.trust_radius, "0 < trust_radius <= inf", lambda x: x > 0),
        )
        object.__setattr__(
            self,
            "weight_decay",
            check_real("weight_decay", self.weight_decay, "0 <= weight_decay < inf", lambda x: 0 <= x < math.inf),
        )


class StiefelAdamState(NamedTuple):
    """m: (..., d, r) first moment (tangent at the current W); v: (...) scalar second moment per
    frame (a control may store (..., d, r)); t: number of steps taken."""

    m: np.ndarray
    v: np.ndarray
    t: int


def init(W: np.ndarray) -> StiefelAdamState:
    """Fresh state for frames W (..., d, r): m = 0, v = 0 per frame, t = 0."""
    check_frame("W", W)
    return StiefelAdamState(m=np.zeros_like(W), v=np.zeros(W.shape[:-2]), t=0)


def check_state(state, W: np.ndarray, v_shape: tuple[int, ...]) -> None:
    if not isinstance(state, StiefelAdamState):
        raise ValueError(f"state must be a StiefelAdamState (from init), got {type(state).__name__}")
    check_float64_array("state.m", state.m)
    check_same_shape("state.m", state.m, "W", W.shape)
    check_float64_array("state.v", np.asarray(state.v) if isinstance(state.v, np.float64) else state.v)
    if np.shape(state.v) != v_shape:
        raise ValueError(f"state.v must have shape {v_shape} (one per frame), got {np.shape(state.v)}")
    if np.any(state.v < 0):
        raise ValueError("state.v must be >= 0 (a second moment)")
    if isinstance(state.t, bool) or not isinstance(state.t, (int, np.integer)) or state.t < 0:
        raise ValueError(f"state.t must be a non-negative integer, got {state.t!r}")


def check_step_inputs(W, G, state, config, v_shape_of=lambda W: W.shape[:-2], atol=None) -> None:
    check_frame("W", W, atol)
    check_float64_array("G", G)
    check_same_shape("G", G, "W", W.shape)
    check_state(state, W, v_shape_of(W))
    if not isinstance(config, StiefelAdamConfig):
        raise ValueError(f"config must be a StiefelAdamConfig, got {type(config).__name__}")


def frobenius(A: np.ndarray) -> np.ndarray:
    """||A||_F per frame, shape A.shape[:-2]."""
    return np.sqrt(np.sum(A * A, axis=(-2, -1)))


def scale_free_direction(m_hat: np.ndarray, v_hat: np.ndarray, lr: float, eps: float) -> np.ndarray:
    """xi = -lr m^ / (sqrt(v^) + eps), and 0 where v^ = 0 (never 0/0). v^ broadcasts against m^."""
    v_hat = np.asarray(v_hat)
    if v_hat.ndim < m_hat.ndim:
        v_hat = v_hat[..., None, None]
    zero = v_hat == 0
    denominator = np.where(zero, 1.0, np.sqrt(v_hat) + eps)
    return np.where(zero, 0.0, -lr * m_hat / denominator)


def clip_to_trust_region(xi: np.ndarray, trust_radius: float) -> np.ndarray:
    """xi * Delta / ||xi|| for frames with ||xi||_F > Delta; others unchanged."""
    if math.isinf(trust_radius):
        return xi
    norm = frobenius(xi)
    factor = np.where(norm > trust_radius, trust_radius / np.where(norm > 0, norm, 1.0), 1.0)
    return xi * factor[..., None, None]


def step_with_direction(W: np.ndarray, G: np.ndarray, state: StiefelAdamState, config: StiefelAdamConfig):
    """One StiefelAdam step that also returns its direction: (W_new, state_new, xi).

    xi (..., d, r) is the tangent vector the step retracted, after the trust region: W_new =
    R_W(xi). `step` is this function with xi dropped, so the direction a claim reads here is the one
    the step applied, never a second computation that could disagree with it.
    """
    check_step_inputs(W, G, state, config)
    return _step_with_direction(W, G, state, config)


def _step_with_direction(W, G, state, config):
    G_decayed = G + config.weight_decay * W  # 1
    g = project_tangent(W, G_decayed, validate=False)  # 2
    m, v, t, xi = moments_and_direction(g, state, config)  # 3-7
    W_new = polar_retract(W, xi, "svd", validate=False)  # 8
    m_new = project_tangent(W_new, m, validate=False)
    return W_new, StiefelAdamState(m=m_new, v=v, t=t), xi


def without_direction(step_with_direction):
    """The step (W, G, state, config) -> (W_new, state_new) of a step that also returns its xi.

    The returned function keeps the hook as its attribute `direction_hook`, so that a Variant built
    from it can tell that the two are one function.
    """

    def step(W, G, state, config):
        W_new, state_new, _ = step_with_direction(W, G, state, config)
        return W_new, state_new

    step.direction_hook = step_with_direction
    step.__name__ = getattr(step_with_direction, "__name__", "step").replace("_with_direction", "") or "step"
    step.__doc__ = step_with_direction.__doc__
    return step


def step(W: np.ndarray, G: np.ndarray, state: StiefelAdamState, config: StiefelAdamConfig):
    """One StiefelAdam step (docs/algorithm.md). Returns (W_new, state_new); inputs unchanged.

    W: (..., d, r) float64 frames; G: Euclidean gradient, same shape; state from `init`.
    It is `step_with_direction` with the direction dropped.
    """
    W_new, state_new, _ = step_with_direction(W, G, state, config)
    return W_new, state_new


step.direction_hook = step_with_direction
_step = without_direction(_step_with_direction)


def moments_and_direction(g, state, config, elementwise=False):
    """Stages 3-7 of docs/algorithm.md for a gradient g (..., d, r): returns (m, v, t, xi).

    elementwise=True keeps v per entry (the elementwise_second_moment control) instead of the one
    scalar per frame ||g||^2 / (d r).
    """
    beta1, beta2 = config.betas
    d, r = g.shape[-2], g.shape[-1]
    m = beta1 * state.m + (1 - beta1) * g
    if elementwise:
        v = beta2 * state.v + (1 - beta2) * g * g
    else:
        v = np.asarray(beta2 * state.v + (1 - beta2) * np.sum(g * g, axis=(-2, -1)) / (d * r))
    t = state.t + 1
    m_hat = m / (1 - beta1**t)
    v_hat = v / (1 - beta2**t)
    xi = scale_free_direction(m_hat, v_hat, config.lr, config.eps)
    xi = clip_to_trust_region(xi, config.trust_radius)
    return m, v, t, xi


def run_trajectory(W, gradients, config, state=None, step_fn=None):
    """Apply `step` for each gradient in the sequence `gradients` (each shaped like W).

    gradients may be a callable W -> G. Returns (list of W_t for t = 0..T, final state).
    """
    step_fn = step if step_fn is None else step_fn
    state = init(W) if state is None else state
    trajectory = [W]
    for G in gradients:
        W, state = step_fn(W, G(W) if callable(G) else G, state, config)
        trajectory.append(W)
    return trajectory, state
