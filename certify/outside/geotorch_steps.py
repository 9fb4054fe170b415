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

The state is plain tensors (the module's parameter and base, the optimizer's state dict), loaded into
one module and optimizer per frame shape for a step and read back after, so that a state handed to
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


class _one_thread:
    """One torch intra-op thread while a step runs (as the torch adapter steps): the frames are small,
    and a thread team on a two-core machine costs more in wake-ups than it gives (a step four times slower)."""

    def __enter__(self):
        torch, _ = _torch()
        self.threads = torch.get_num_threads()
        torch.set_num_threads(1)

    def __exit__(self, *exc):
        torch, _ = _torch()
        torch.set_num_threads(self.threads)
        return False


class GeotorchOptimizer:
    """init and step of geotorch.orthogonal under one torch.optim class (module docstring)."""

    def __init__(self, optimizer: str):
        self.optimizer = optimizer
        self.workspaces: dict = {}  # (d, r) -> (module, optimizer): one of each, loaded with a state per step

    def hyperparameters(self, config) -> dict:
        values = {"lr": float(config.lr), "weight_decay": float(config.weight_decay)}
        if self.optimizer == "Adam":
            values.update(betas=tuple(float(b) for b in config.betas), eps=float(config.eps))
        return values

    def _workspace(self, shape):
        """The module and optimizer of one frame shape, built once: a state is plain tensors, loaded into
        them for a step and read back after (a deep copy of a parametrised module per step cost 30 % of
        a run)."""
        if shape not in self.workspaces:
            torch, geotorch = _torch()
            module = torch.nn.Module()
            module.weight = torch.nn.Parameter(torch.zeros(shape, dtype=torch.float64))
            geotorch.orthogonal(module, "weight")
            self.workspaces[shape] = (module, getattr(torch.optim, self.optimizer)(module.parameters(), lr=1e-3))
        return self.workspaces[shape]

    def init(self, W):
        torch, _ = _torch()
        W = np.asarray(W, dtype=np.float64)
        module, _ = self._workspace(W.shape)
        # geotorch's right inverse: the parameter whose weight is W, with W completed to a square orthogonal
        # base by columns it draws from torch's generator: seeded here, so that identical inputs give
        # identical runs (from the unseeded global generator, runs of identical inputs part by 0.1)
        with torch.random.fork_rng(devices=[]), _one_thread():
            torch.manual_seed(0)
            module.weight = torch.as_tensor(W.copy())
        return {"module": {key: value.detach().clone() for key, value in module.state_dict().items()}, "optimizer": None}

    def step(self, W, G, state, config):
        with _one_thread():
            return self._step(W, G, state, config)

    def _step(self, W, G, state, config):
        torch, _ = _torch()
        module, optimizer = self._workspace(np.shape(W))
        # a state is never changed: certify may start several runs from one (a warm start)
        module.load_state_dict(state["module"])
        if state["optimizer"] is None:
            optimizer.state.clear()
        else:
            optimizer.load_state_dict(state["optimizer"])
        for group in optimizer.param_groups:
            group.update(self.hyperparameters(config))
        optimizer.zero_grad()
        (module.weight * torch.as_tensor(np.asarray(G, dtype=np.float64))).sum().backward()
        optimizer.step()
        with torch.no_grad():
            W_new = module.weight.detach().numpy().copy()
        new_state = {"module": {key: value.detach().clone() for key, value in module.state_dict().items()},
                     "optimizer": copy.deepcopy(optimizer.state_dict())}
        return W_new, new_state


adam = GeotorchOptimizer("Adam")
sgd = GeotorchOptimizer("SGD")

__all__ = ["GeotorchOptimizer", "adam", "sgd"]
