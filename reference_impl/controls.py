"""Controls: deliberately wrong variants of the step, behind the interface of `step` (docs/algorithm.md#the-controls).

A certificate that cannot fail is worthless, so every proposition runs the real optimizer and some
of these variants, and must tell them apart. Each variant is one stage of docs/algorithm.md swapped
for a plausible mistake:

  elementwise_second_moment  v is a (d, r) array (Adam's per-entry statistics); xi = m^/sqrt(v^)
                             is then off T_W and not O(d)-equivariant.            breaks P3, P4
  qr_retraction              W+ = qf(W + xi) (sign-fixed) instead of the polar factor: not
                             equivariant under the right action of O(r).          breaks P4
  projection_without_sym     g = G - W W^T G (drops the skew part W skew(W^T G)): not the
                             orthogonal projector onto T_W, so not steepest descent. breaks P1
  unprojected_decay          g = P_W(G) + lambda W: the decay term skips the projection and moves
                             W.                                                    breaks P5
  euclidean_adamw            torch-style AdamW on the same frame, elementwise v, decoupled decay
                             W <- (1 - lr lambda) W, no retraction.                breaks P5
  fixed_step_sgd             W+ = R_W(-lr g): degree one in the gradient scale.    breaks P2
  canonical_metric_gradient  g = G~ - W G~^T W, the canonical-metric gradient: a different
                             direction, so the steepest-descent claim is metric-specific. breaks P1

`VARIANTS` maps a name to a `Variant` (init, step, description, the claims it must break); the real
optimizer is registered as "stiefel_adam". `get_variant(name)` raises ValueError for unknown names.

Every registered variant is built from a step that also returns the direction xi it applied
(`step_with_direction(W, G, state, config) -> (W_new, state_new, xi)`); its `step` is that function
with xi dropped, so the claims read the direction of the very step they certify. A Variant built
from a plain `step` (an outside implementation, a test's broken step) has no such hook; the claims
then recover xi from W_new (propositions.kit.directions).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np

from . import adam
from ._validation import check_float64_array, check_frame, check_same_shape
from .adam import (
    StiefelAdamState,
    check_step_inputs,
    moments_and_direction,
    scale_free_direction,
    without_direction,
)
from .manifold import polar_retract, project_tangent, _transpose, haar_from_gaussian, sym


@dataclass(frozen=True)
class Variant:
    """An optimizer behind the interface of `reference_impl.step`.

    Built as Variant(name, description, breaks, init, step) from a plain step (W, G, state, config)
    -> (W_new, state_new), or as Variant(name, description, breaks, init,
    step_with_direction=hook) from a step that also returns the direction it applied,
    (W_new, state_new, xi); `step` is then derived from the hook (the same function, xi dropped),
    so the two can never disagree. Giving both a hook and an unrelated step is a ValueError.
    """

    name: str
    description: str
    breaks: tuple[str, ...]
    init: Callable
    step: Callable | None = None  # (W, G, state, config) -> (W_new, state_new)
    step_with_direction: Callable | None = None  # (W, G, state, config) -> (W_new, state_new, xi)

    def __post_init__(self):
        hook = self.step_with_direction
        if hook is None:
            if self.step is None:
                raise ValueError(f"variant {self.name!r} needs a step or a step_with_direction")
            return
        if self.step is not None and getattr(self.step, "direction_hook", None) is not hook:
            raise ValueError(
                f"variant {self.name!r}: give step or step_with_direction, not both (the step is derived from the hook)"
            )
        object.__setattr__(self, "step", without_direction(hook))


def _riemannian_step(gradient_map, second_moment="scalar", retraction="polar"):
    """The StiefelAdam skeleton with one stage replaced; see the module docstring.

    Returns the step with its direction hook: (W, G, state, config) -> (W_new, state_new, xi).
    """

    def step_with_direction(W, G, state, config):
        v_shape = W.shape if second_moment == "elementwise" else W.shape[:-2]
        check_step_inputs(W, G, state, config, v_shape_of=lambda W: v_shape)
        g = gradient_map(W, G, config.weight_decay)
        m, v, t, xi = moments_and_direction(g, state, config, elementwise=second_moment == "elementwise")
        if retraction == "qr":
            W_new = haar_from_gaussian(W + xi)
        else:
            W_new = polar_retract(W, xi, "svd", validate=False)
        m_new = project_tangent(W_new, m, validate=False)
        return W_new, StiefelAdamState(m=m_new, v=v, t=t), xi

    return step_with_direction


def _projected(W, G, weight_decay):
    return project_tangent(W, G + weight_decay * W, validate=False)


def _projection_without_sym(W, G, weight_decay):
    G_decayed = G + weight_decay * W
    return G_decayed - W @ (_transpose(W) @ G_decayed)


def _unprojected_decay(W, G, weight_decay):
    return project_tangent(W, G, validate=False) + weight_decay * W


def _canonical_gradient(W, G, weight_decay):
    G_decayed = G + weight_decay * W
    return G_decayed - W @ _transpose(G_decayed) @ W


def _init_scalar(W):
    return adam.init(W)


def _init_elementwise(W):
    check_frame("W", W)
    return StiefelAdamState(m=np.zeros_like(W), v=np.zeros_like(W), t=0)


def euclidean_adamw_step_with_direction(W, G, state, config):
    """torch.optim.AdamW on a frame: decoupled decay, elementwise v, no projection, no retraction.

    W here is any float64 matrix (the step leaves the manifold); trust_radius is ignored, as AdamW
    has none. The direction is the whole move, xi = W_new - W (decay included): there is no
    retraction to invert.
    """
    check_float64_array("W", W, min_ndim=2)
    check_float64_array("G", G)
    check_same_shape("G", G, "W", W.shape)
    if not isinstance(state, StiefelAdamState) or state.v.shape != W.shape:
        raise ValueError("state must be a StiefelAdamState with elementwise v (from this variant's init)")
    beta1, beta2 = config.betas
    W_decayed = W * (1 - config.lr * config.weight_decay)
    m = beta1 * state.m + (1 - beta1) * G
    v = beta2 * state.v + (1 - beta2) * G * G
    t = state.t + 1
    m_hat = m / (1 - beta1**t)
    v_hat = v / (1 - beta2**t)
    W_new = W_decayed + scale_free_direction(m_hat, v_hat, config.lr, config.eps)
    return W_new, StiefelAdamState(m=m, v=v, t=t), W_new - W


def fixed_step_sgd_step_with_direction(W, G, state, config):
    """Riemannian SGD with a fixed step: W+ = R_W(xi), xi = -lr P_W(G + lambda W). State only counts t."""
    check_step_inputs(W, G, state, config)
    g = _projected(W, G, config.weight_decay)
    xi = -config.lr * g
    W_new = polar_retract(W, xi, "svd", validate=False)
    return W_new, StiefelAdamState(m=state.m, v=state.v, t=state.t + 1), xi


euclidean_adamw_step = without_direction(euclidean_adamw_step_with_direction)
fixed_step_sgd_step = without_direction(fixed_step_sgd_step_with_direction)
stiefel_adam_step = adam.step  # the real optimizer (reference_impl.step), hook adam.step_with_direction


VARIANTS: dict[str, Variant] = {
    v.name: v
    for v in [
        Variant("stiefel_adam", "the real StiefelAdam step (docs/algorithm.md)", (), _init_scalar,
                step_with_direction=adam.step_with_direction),
        Variant(
            "elementwise_second_moment",
            "Adam's elementwise second moment in place of the one scalar per frame",
            ("P3", "P4"),
            _init_elementwise,
            step_with_direction=_riemannian_step(_projected, second_moment="elementwise"),
        ),
        Variant(
            "qr_retraction",
            "sign-fixed QR retraction qf(W + xi) in place of the polar factor",
            ("P4",),
            _init_scalar,
            step_with_direction=_riemannian_step(_projected, retraction="qr"),
        ),
        Variant(
            "projection_without_sym",
            "g = G - W W^T G: the projection with sym(W^T G) replaced by W^T G",
            ("P1",),
            _init_scalar,
            step_with_direction=_riemannian_step(_projection_without_sym),
        ),
        Variant(
            "unprojected_decay",
            "g = P_W(G) + lambda W: the weight-decay term is not projected",
            ("P5",),
            _init_scalar,
            step_with_direction=_riemannian_step(_unprojected_decay),
        ),
        Variant(
            "euclidean_adamw",
            "Euclidean AdamW on the same frame (decoupled decay, no projection, no retraction)",
            ("P5",),
            _init_elementwise,
            step_with_direction=euclidean_adamw_step_with_direction,
        ),
        Variant(
            "fixed_step_sgd",
            "fixed-step Riemannian SGD W+ = R_W(-lr g): degree one in the gradient",
            ("P2",),
            _init_scalar,
            step_with_direction=fixed_step_sgd_step_with_direction,
        ),
        Variant(
            "canonical_metric_gradient",
            "the canonical-metric gradient G - W G^T W in place of P_W(G)",
            ("P1",),
            _init_scalar,
            step_with_direction=_riemannian_step(_canonical_gradient),
        ),
    ]
}

CONTROL_NAMES = tuple(name for name in VARIANTS if name != "stiefel_adam")

GRADIENT_MAPS = {
    "stiefel_adam": _projected,
    "projection_without_sym": _projection_without_sym,
    "unprojected_decay": _unprojected_decay,
    "canonical_metric_gradient": _canonical_gradient,
}


def get_variant(name) -> Variant:
    """The variant registered under name ("stiefel_adam" or one of CONTROL_NAMES).

    A Variant passed in is returned as it is, so that a claim can be run against an optimizer that
    is not registered (a test's broken variant, an outside implementation behind the same interface).
    """
    if isinstance(name, Variant):
        return name
    try:
        return VARIANTS[name]
    except KeyError:
        raise ValueError(f"unknown optimizer variant {name!r}; known: {', '.join(VARIANTS)}") from None


def riemannian_gradient(W, G, weight_decay=0.0, variant="stiefel_adam"):
    """The gradient map (stage 1-2) that a variant uses; controls that keep P_W map to it."""
    if variant not in GRADIENT_MAPS:
        variant = "stiefel_adam"
    return GRADIENT_MAPS[variant](W, G, weight_decay)


__all__ = [
    "Variant",
    "VARIANTS",
    "CONTROL_NAMES",
    "GRADIENT_MAPS",
    "get_variant",
    "riemannian_gradient",
    "euclidean_adamw_step",
    "euclidean_adamw_step_with_direction",
    "fixed_step_sgd_step",
    "fixed_step_sgd_step_with_direction",
    "sym",
]
