"""Deliberately broken implementations for the counterexample tests, each wrong in one stage of
docs/algorithm.md, loaded as numpy:broken_impls:NAME and torch:broken_impls:NAME.

  bias_from_step_2    (numpy, stage 5)   m^ = m / (1 - beta1), v^ = v / (1 - beta2): right at t = 1 only
  projection_no_sym   (numpy, stages 1-2) g = G~ - W W^T G~: drops W skew(W^T G~); right for r = 1
  cap_by_max_entry    (numpy, stage 7)   the cap measures xi by its largest entry, not ||xi||_F
  SumSquaresAdam      (torch, stage 4)   v = beta2 v + (1 - beta2) ||g||^2 (no 1 / (d r))
  QRRetractionAdam    (torch, stage 8)   W+ = qf(W + xi) (sign-fixed QR), not the polar factor

`fixed_step` and `FixedAdam` are the same code with the mistake taken out.
"""

from __future__ import annotations

import math

import numpy as np
import torch

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
    xi = scale_free_direction(m / (1 - beta1**power), v / (1 - beta2**power), config.lr, config.eps)
    if bug == "cap":
        largest = np.max(np.abs(xi), axis=(-2, -1))
        xi = xi * np.where(largest > config.trust_radius, config.trust_radius / np.where(largest > 0, largest, 1.0), 1.0)[..., None, None]
    else:
        xi = clip_to_trust_region(xi, config.trust_radius)
    W_new = polar_retract(W, xi, "svd", validate=False)
    return W_new, StiefelAdamState(m=project_tangent(W_new, m, validate=False), v=v, t=t)


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


class _TorchAdam(torch.optim.Optimizer):
    """StiefelAdam on parameters of shape (..., d, r), written plainly in torch (float64)."""

    bug: str | None = None

    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, trust_radius=0.5, weight_decay=0.0):
        super().__init__(params, dict(lr=lr, betas=tuple(betas), eps=eps, trust_radius=trust_radius, weight_decay=weight_decay))

    @torch.no_grad()
    def step(self, closure=None):
        for group in self.param_groups:
            for W in group["params"]:
                if W.grad is not None:
                    self._update(W, group)

    def _update(self, W, group):
        beta1, beta2 = group["betas"]
        state = self.state[W]
        if not state:
            state.update(m=torch.zeros_like(W), v=torch.zeros(W.shape[:-2], dtype=W.dtype), t=0)
        G = W.grad + group["weight_decay"] * W
        WtG = W.mT @ G
        g = G - W @ (WtG + WtG.mT) / 2
        d, r = W.shape[-2:]
        m = beta1 * state["m"] + (1 - beta1) * g
        square = (g * g).sum(dim=(-2, -1))
        v = beta2 * state["v"] + (1 - beta2) * (square if self.bug == "moments" else square / (d * r))
        t = state["t"] + 1
        m_hat, v_hat = m / (1 - beta1**t), v / (1 - beta2**t)
        moves = v_hat > 0
        scale = torch.where(moves, -group["lr"] / (v_hat.sqrt() + group["eps"]), torch.zeros_like(v_hat))
        xi = m_hat * scale[..., None, None]
        if not math.isinf(group["trust_radius"]):
            norm = xi.square().sum(dim=(-2, -1)).sqrt()
            xi = xi * torch.where(norm > group["trust_radius"], group["trust_radius"] / norm.clamp_min(1e-300), torch.ones_like(norm))[..., None, None]
        W_new = _qr(W + xi) if self.bug == "retraction" else _polar(W + xi)
        W.copy_(W_new)
        WtM = W.mT @ m
        state.update(m=m - W @ (WtM + WtM.mT) / 2, v=v, t=t)


def _polar(A):
    U, _, Vh = torch.linalg.svd(A, full_matrices=False)
    return U @ Vh


def _qr(A):
    Q, R = torch.linalg.qr(A)
    signs = torch.where(torch.diagonal(R, dim1=-2, dim2=-1) < 0, -1.0, 1.0).to(A.dtype)
    return Q * signs[..., None, :]


class FixedAdam(_TorchAdam):
    bug = None


class SumSquaresAdam(_TorchAdam):
    bug = "moments"


class QRRetractionAdam(_TorchAdam):
    bug = "retraction"
