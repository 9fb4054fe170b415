"""The torch optimizers of tests/broken_impls.py (torch:broken_torch:NAME): StiefelAdam written
plainly in torch, float64, with one stage wrong (SumSquaresAdam: stage 4; QRRetractionAdam: stage 8)
or none (FixedAdam)."""

from __future__ import annotations

import math

import torch


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
