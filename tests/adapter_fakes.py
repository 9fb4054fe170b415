"""Outside implementations for the adapter tests, loaded as numpy:adapter_fakes:NAME.

Each `break_pN` is reference_impl.step verbatim except in the regime REGIMES["PN"], which only
claim PN probes, where it makes the mistake that PN is about; so each must fail PN and, seeing the
reference everywhere else, pass the other claims. `recorder` is the reference step noting which
regimes its inputs fall in. The regimes:

  break_p1  betas = (0.5, 0.9) with eps = 0 (P1's second first-step configuration): the canonical-
            metric gradient G - W G^T W in place of P_W(G)              (not steepest descent)
  break_p2  ||G||^2 < 1e-200 (gradients scaled by c below 10^-100, P2's range of c): a floor
            1e-210 added to v                                                  (scale dependence)
  break_p3  trust_radius = inf and G != 0: one Newton-Schulz iteration A (3 I - A^T A) / 2 in place of the polar
            factor of A = W + xi (P3's uncapped trajectories)          (inaccurate retraction)
  break_p4  P4's configuration (lr 0.02, eps 1e-8, lambda 0.1): the step divided per column by the
            column's root mean square instead of one scalar per frame  (not O(r)-equivariant)
  break_p5  lambda in P5's grid {1e-6, 1e-3, 1e3}: the decay term added after the projection
                                                                        (decay moves W)

and the bad inputs: `wrong_signature` (two arguments), `returns_nan`, `leaves_manifold`, `unguarded`
(NaN where G = 0),
`per_frame_step` (takes one (d, r) frame only) and `opaque` (init/step with a state of its own).
"""

from __future__ import annotations

import math

import numpy as np

import reference_impl as ri
from reference_impl.adam import StiefelAdamState, moments_and_direction
from reference_impl.manifold import polar_retract, project_tangent


def _transpose(A):
    return np.swapaxes(A, -1, -2)


def init(W):
    return ri.init(W)


def _step(W, G, state, config, *, gradient=None, v_floor=0.0, retraction=None, per_column=False, unprojected=False):
    G_decayed = G + config.weight_decay * W
    if gradient == "canonical":
        g = G_decayed - W @ _transpose(G_decayed) @ W
    elif unprojected:
        g = project_tangent(W, G, validate=False) + config.weight_decay * W
    else:
        g = project_tangent(W, G_decayed, validate=False)
    m, v, t, xi = moments_and_direction(g, state._replace(v=np.asarray(state.v) + v_floor), config)
    if per_column:
        beta1 = config.betas[0]
        m_hat = m / (1 - beta1**t)
        column_rms = np.sqrt(np.mean(m_hat * m_hat, axis=-2, keepdims=True))
        xi = -config.lr * m_hat / np.where(column_rms > 0, column_rms, 1.0)
    if retraction == "newton_schulz":
        A = W + xi
        W_new = A @ (3 * np.eye(W.shape[-1]) - _transpose(A) @ A) / 2
    else:
        W_new = polar_retract(W, xi, "svd", validate=False)
    return W_new, StiefelAdamState(m=project_tangent(W_new, m, validate=False), v=v, t=t)


# The regime each fake breaks, as a predicate of the step's input: each must be met by its own claim
# and by no other (tests/test_adapters.py records which claims meet which regime through `recorder`).
REGIMES = {
    "P1": lambda W, G, state, config: tuple(config.betas) == (0.5, 0.9) and config.eps == 0,
    "P2": lambda W, G, state, config: bool(np.any(np.sum(G * G, axis=(-2, -1)) < 1e-200)) and bool(np.any(G != 0)),
    "P3": lambda W, G, state, config: math.isinf(config.trust_radius) and bool(np.any(G != 0)),
    "P4": lambda W, G, state, config: (config.lr, config.eps, config.weight_decay) == (0.02, 1e-8, 0.1),
    "P5": lambda W, G, state, config: config.weight_decay in (1e-6, 1e-3, 1e3),
}

HITS: set = set()


def recorder(W, G, state, config):
    """reference_impl.step, noting in HITS which regimes its inputs fall in."""
    HITS.update(name for name, regime in REGIMES.items() if regime(W, G, state, config))
    return ri.step(W, G, state, config)


def _broken_in(claim: str, **change):
    """reference_impl.step, but _step(..., **change) inside `claim`'s regime (REGIMES) only."""

    def step(W, G, state, config):
        if REGIMES[claim](W, G, state, config):
            return _step(W, G, state, config, **change)
        return ri.step(W, G, state, config)

    step.__name__ = f"break_{claim.lower()}"
    return step


break_p1 = _broken_in("P1", gradient="canonical")
# inside the regime ||g||^2 <= ||G||^2 < 1e-200, so a floor of 1e-210 moves v by >= 1e-7 relative
break_p2 = _broken_in("P2", v_floor=1e-210)
break_p3 = _broken_in("P3", retraction="newton_schulz")
break_p4 = _broken_in("P4", per_column=True)
break_p5 = _broken_in("P5", unprojected=True)


def wrong_signature(W, G):
    return W


def returns_nan(W, G, state, config):
    W_new, state_new = ri.step(W, G, state, config)
    return np.full_like(W_new, np.nan), state_new


def leaves_manifold(W, G, state, config):
    """Euclidean gradient descent: W - lr G, never retracted."""
    return W - config.lr * G, state


def unguarded(W, G, state, config):
    """The reference step, but 0/0 (NaN) where the gradient is exactly zero."""
    W_new, state_new = ri.step(W, G, state, config)
    if not np.any(G):
        return np.full_like(W_new, np.nan), state_new
    return W_new, state_new


def per_frame_step(W, G, state, config):
    if np.ndim(W) != 2:
        raise ValueError("this step takes one (d, r) frame")
    return ri.step(W, G, state, config)


class Opaque:
    """init/step with a state of its own (a dict): a black box to the claims."""

    @staticmethod
    def init(W):
        return {"inner": ri.init(W)}

    @staticmethod
    def step(W, G, state, config):
        W_new, inner = ri.step(W, G, state["inner"], config)
        return W_new, {"inner": inner}


opaque = Opaque()



def nan_at_eps_zero(W, G, state, config):
    """The reference step, but 0/0 everywhere at eps = 0 (an implementation undefined there)."""
    W_new, state_new = ri.step(W, G, state, config)
    if config.eps == 0:
        return np.full_like(W_new, np.nan), state_new
    return W_new, state_new


def uncapped_nan(W, G, state, config):
    """No trust region, and a NaN frame for a long step: a NaN must not read as 'no move'."""
    W_new, state_new = ri.step(W, G, state, ri.StiefelAdamConfig(lr=config.lr, betas=config.betas, eps=config.eps,
                                                                 trust_radius=float("inf"), weight_decay=config.weight_decay))
    if config.lr * np.sqrt(W.shape[-2] * W.shape[-1]) > 10:
        return np.full_like(W_new, np.nan), state_new
    return W_new, state_new
