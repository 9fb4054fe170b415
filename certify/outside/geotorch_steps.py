"""geotorch's orthogonal parametrisation under a torch optimizer, as a NumPy step of one frame
(docs/adapters.md#geotorch): the shortcuts geotorch-adam and geotorch-sgd.

geotorch keeps a frame on St(d, r) by parametrisation: `geotorch.orthogonal(module, "weight")` makes
module.weight a function of an unconstrained parameter (by default the matrix exponential of a skew
matrix, times a base frame set when the weight is assigned), and an ordinary torch.optim optimizer
updates that parameter. A step here is one such update for one (d, r) frame:

  init(W)                         a module whose weight is W (assigned: geotorch solves for its
                                  parameter), and the optimizer over the module's parameters;
  step(W, G, state, config)       the gradient G of the loss sum(weight * G) pushed through the
                                  parametrisation by autograd, one optimizer step at config's lr
                                  (and betas, eps for Adam; weight_decay for both, which torch
                                  applies to the unconstrained parameter), the new weight returned.

geotorch completes a tall frame W to the square orthogonal base of its parametrisation with random
columns from torch's generator; init seeds that draw (torch.manual_seed(0) in a forked generator,
the global one untouched), so that runs of identical inputs are identical: from the unseeded global
generator the determinism probe measured runs of identical inputs 0.0986 apart, and that noise left
every comparison unresolved. The completion still depends on W (it is orthogonalised against it),
which is part of what the properties see.

The state is the module and the optimizer; a step works on a copy of it, so that a state handed to
several runs (the warm start of P3) is never changed under them. The adapter's flags are per_frame
(one module per frame) and black_box (the state is the optimizer's own, not m, v, t).
trust_radius has no counterpart, and SGD takes no betas or eps: they reach nothing.
"""

from __future__ import annotations

import copy

import numpy as np


def _torch():
    try:
        import geotorch
        import torch
    except ImportError as error:  # the adapter reports it in one line
        raise ImportError(f"geotorch-adam and geotorch-sgd need torch and geotorch ({error}): pip install -e '.[bench]' in this "
                          "project's checkout") from None
    return torch, geotorch


class GeotorchOptimizer:
    """init and step of geotorch.orthogonal under one torch.optim class (module docstring)."""

    def __init__(self, optimizer: str):
        self.optimizer = optimizer

    def hyperparameters(self, config) -> dict:
        values = {"lr": float(config.lr), "weight_decay": float(config.weight_decay)}
        if self.optimizer == "Adam":
            values.update(betas=tuple(float(b) for b in config.betas), eps=float(config.eps))
        return values

    def init(self, W):
        torch, geotorch = _torch()
        W = np.asarray(W, dtype=np.float64)
        module = torch.nn.Module()
        module.weight = torch.nn.Parameter(torch.zeros(W.shape, dtype=torch.float64))
        geotorch.orthogonal(module, "weight")
        # geotorch's right inverse: the parameter whose weight is W, with W completed to a square orthogonal
        # base by columns it draws from torch's generator: seeded here, so that identical inputs give
        # identical runs (from the unseeded global generator, runs of identical inputs part by 0.1)
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(0)
            module.weight = torch.as_tensor(W.copy())
        optimizer = getattr(torch.optim, self.optimizer)(module.parameters(), lr=1e-3)
        return {"module": module, "optimizer": optimizer}

    def step(self, W, G, state, config):
        torch, _ = _torch()
        state = copy.deepcopy(state)
        module, optimizer = state["module"], state["optimizer"]
        for group in optimizer.param_groups:
            group.update(self.hyperparameters(config))
        optimizer.zero_grad()
        (module.weight * torch.as_tensor(np.asarray(G, dtype=np.float64))).sum().backward()
        optimizer.step()
        with torch.no_grad():
            W_new = module.weight.detach().numpy().copy()
        return W_new, state


adam = GeotorchOptimizer("Adam")
sgd = GeotorchOptimizer("SGD")

__all__ = ["GeotorchOptimizer", "adam", "sgd"]
