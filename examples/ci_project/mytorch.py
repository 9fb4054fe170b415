"""StiefelAdam as a torch.optim.Optimizer, for parameters of shape (..., d, r) (docs/ci.md)."""

import math

import torch


class MyStiefelAdam(torch.optim.Optimizer):
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
        d, r = W.shape[-2:]
        g = _project(W, W.grad + group["weight_decay"] * W)
        m = beta1 * state["m"] + (1 - beta1) * g
        v = beta2 * state["v"] + (1 - beta2) * (g * g).sum(dim=(-2, -1)) / (d * r)
        t = state["t"] + 1
        m_hat, v_hat = m / (1 - beta1**t), v / (1 - beta2**t)
        scale = torch.where(v_hat > 0, -group["lr"] / (v_hat.sqrt() + group["eps"]), torch.zeros_like(v_hat))
        xi = m_hat * scale[..., None, None]
        if not math.isinf(group["trust_radius"]):
            norm = xi.square().sum(dim=(-2, -1)).sqrt()
            factor = torch.where(norm > group["trust_radius"], group["trust_radius"] / norm.clamp_min(1e-300), torch.ones_like(norm))
            xi = xi * factor[..., None, None]
        U, _, Vh = torch.linalg.svd(W + xi, full_matrices=False)
        W.copy_(U @ Vh)
        state.update(m=_project(W, m), v=v, t=t)


def _project(W, X):
    WtX = W.mT @ X
    return X - W @ ((WtX + WtX.mT) / 2)
