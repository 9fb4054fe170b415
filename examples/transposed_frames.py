"""A worked adapter (docs/adapters.md#a-worked-adapter): a torch optimizer that stores its frames
transposed, (r, d) with orthonormal rows, and takes only parameters tagged with a manifold, put
behind the interface certify calls: init(W) and step(W, G, state, config) on one (d, r) frame.

    cd examples && certify run P4 --properties --implementation transposed_frames:adapter:per_frame,black_box

RowStiefelSGD stands for the optimizer as its authors wrote it; `Adapter` is all a user writes.
"""

from __future__ import annotations

import copy

import numpy as np
import torch


class RowStiefelSGD(torch.optim.Optimizer):
    """Momentum SGD on frames stored as rows: parameters of shape (r, d) with orthonormal rows, each
    tagged p.manifold = "stiefel_rows". A step projects the gradient onto the tangent space at the rows
    (g - sym(g W^T) W), keeps a momentum buffer of it, and retracts by the polar factor of W - lr buf."""

    def __init__(self, params, lr=1e-2, momentum=0.9, weight_decay=0.0):
        super().__init__(params, {"lr": lr, "momentum": momentum, "weight_decay": weight_decay})

    @torch.no_grad()
    def step(self, closure=None):
        for group in self.param_groups:
            for p in group["params"]:
                if getattr(p, "manifold", None) != "stiefel_rows":
                    raise ValueError("RowStiefelSGD takes parameters tagged p.manifold = 'stiefel_rows'")
                if p.grad is None:
                    continue
                g = p.grad + group["weight_decay"] * p
                tangent = g - 0.5 * (g @ p.T + p @ g.T) @ p
                state = self.state[p]
                buffer = state.get("momentum")
                buffer = tangent.clone() if buffer is None else group["momentum"] * buffer + tangent
                state["momentum"] = buffer
                U, _, Vh = torch.linalg.svd(p - group["lr"] * buffer, full_matrices=False)
                p.copy_(U @ Vh)
        return None


class Adapter:
    """RowStiefelSGD behind certify's NumPy interface, one (d, r) frame at a time (flag per_frame); its
    state is its own (flag black_box): the parameter and the optimizer."""

    TAG = "stiefel_rows"

    def init(self, W):
        parameter = torch.nn.Parameter(torch.as_tensor(np.asarray(W, dtype=np.float64).T.copy()))  # the optimizer's layout: (r, d)
        parameter.manifold = self.TAG  # the tag it asks for
        return {"parameter": parameter, "optimizer": RowStiefelSGD([parameter])}

    def step(self, W, G, state, config):
        # work on a copy: certify may start several runs from one state (a warm start)
        state = copy.deepcopy(state)
        parameter, optimizer = state["parameter"], state["optimizer"]
        parameter.manifold = self.TAG  # a deep copy of a Parameter keeps none of its own attributes
        for group in optimizer.param_groups:  # the hyper-parameters it has; betas, eps, trust_radius reach nothing
            group.update(lr=float(config.lr), weight_decay=float(config.weight_decay))
        parameter.grad = torch.as_tensor(np.asarray(G, dtype=np.float64).T.copy())  # the gradient in its layout
        optimizer.step()
        return parameter.detach().numpy().T.copy(), state  # back to (d, r)


adapter = Adapter()
