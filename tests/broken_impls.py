"""Deliberately broken implementations for the counterexample tests, each wrong in one stage of
docs/algorithm.md, loaded as numpy:broken_impls:NAME (and torch:broken_torch:NAME, tests/broken_torch.py).

  bias_from_step_2    (numpy, stage 5)   m^ = m / (1 - beta1), v^ = v / (1 - beta2): right at t = 1 only
  projection_no_sym   (numpy, stages 1-2) g = G~ - W W^T G~: drops W skew(W^T G~); right for r = 1
  cap_by_max_entry    (numpy, stage 7)   the cap measures xi by its largest entry, not ||xi||_F
  eps_inside_sqrt     (numpy, stage 6)   xi = -lr m^ / sqrt(v^ + eps)
  untransported       (numpy, stage 8)   m+ = m, not P_{W+}(m)
  SumSquaresAdam      (torch, stage 4)   v = beta2 v + (1 - beta2) ||g||^2 (no 1 / (d r))
  QRRetractionAdam    (torch, stage 8)   W+ = qf(W + xi) (sign-fixed QR), not the polar factor

`fixed_step` (and broken_torch.FixedAdam) is the same code with the mistake taken out.
"""

from __future__ import annotations

import numpy as np

import reference_impl as ri
from reference_impl.adam import StiefelAdamState, clip_to_trust_region, scale_free_direction
from reference_impl.manifold import polar_retract, project_tangent


def _numpy_step(W, G, state, config, bug=None):
    beta1, beta2 = config.betas
    d, r = W.shape[-2:]
    G_decayed = G + config.weight_decay * W
    if bug == "projection":
        g = G_decayed - W @ (np.swapaxes(W, -1, -2) @ G_decayed)
    else:
        g = project_tangent(W, G_decayed, validate=False)
    m = beta1 * state.m + (1 - beta1) * g
    v = np.asarray(beta2 * state.v + (1 - beta2) * np.sum(g * g, axis=(-2, -1)) / (d * r))
    t = state.t + 1
    power = 1 if bug == "bias" else t
    m_hat, v_hat = m / (1 - beta1**power), v / (1 - beta2**power)
    if bug == "eps":
        xi = np.where(v_hat[..., None, None] > 0, -config.lr * m_hat / np.sqrt(v_hat + config.eps)[..., None, None], 0.0)
    else:
        xi = scale_free_direction(m_hat, v_hat, config.lr, config.eps)
    if bug == "cap":
        largest = np.max(np.abs(xi), axis=(-2, -1))
        xi = xi * np.where(largest > config.trust_radius, config.trust_radius / np.where(largest > 0, largest, 1.0), 1.0)[..., None, None]
    else:
        xi = clip_to_trust_region(xi, config.trust_radius)
    W_new = polar_retract(W, xi, "svd", validate=False)
    return W_new, StiefelAdamState(m=m if bug == "transport" else project_tangent(W_new, m, validate=False), v=v, t=t)


def init(W):
    return ri.init(W)


def fixed_step(W, G, state, config):
    return _numpy_step(W, G, state, config)


def bias_from_step_2(W, G, state, config):
    return _numpy_step(W, G, state, config, bug="bias")


def projection_no_sym(W, G, state, config):
    return _numpy_step(W, G, state, config, bug="projection")


def cap_by_max_entry(W, G, state, config):
    return _numpy_step(W, G, state, config, bug="cap")


def eps_inside_sqrt(W, G, state, config):
    return _numpy_step(W, G, state, config, bug="eps")


def untransported(W, G, state, config):
    return _numpy_step(W, G, state, config, bug="transport")
