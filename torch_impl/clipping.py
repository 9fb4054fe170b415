"""Gradient clipping that lets one non-finite head fail alone.

`torch.nn.utils.clip_grad_norm_` scales every gradient by max_norm / total, where total is the norm
over all of them: one NaN entry anywhere makes total NaN, and the scaling then writes NaN into
every gradient of the model, so that `skip_nonfinite` skips every tensor instead of one frame.
`clip_grad_norm_finite_` takes the total over the *finite units* only and scales only those,
leaving a unit whose gradient is not finite untouched for the optimizer to skip. A unit is one
frame (..., d, r) -> one (d, r) slice of a parameter in a frame group (a StiefelAdam param group
with manifold="stiefel"), so one NaN head of a (heads, d, r) parameter does not stop its other
heads from being clipped; any other tensor is one unit, as AdamW under skip_nonfinite skips it
whole. Nothing waits for the device.
"""

from __future__ import annotations

import torch

MANIFOLD_KEY = "manifold"


def clip_grad_norm_finite_(parameters, max_norm: float, norm_type: float = 2.0) -> torch.Tensor:
    """Scale the finite gradients so that their total norm is at most max_norm; returns that total.

    parameters: an iterable of tensors (each one unit) or of param groups (dicts with "params", for
    example `optimizer.param_groups` of a StiefelAdam: in a group with manifold="stiefel" every
    frame of a (..., d, r) parameter is its own unit), or a mixture. Tensors without a gradient are
    ignored. A unit is finite when the norm of its gradient is (no NaN or inf entry, and a norm
    within the gradient's dtype); the total is the norm_type-norm of the finite units' norms, the
    total that torch.nn.utils.clip_grad_norm_ computes when every unit is finite (up to the
    order of the reduction: one (d, r) slice at a time). Each finite gradient is multiplied by
    min(1, max_norm / (total + 1e-6)), as in torch; the others keep their values.
    Returns the total, a 0-d tensor (float64 if any gradient is float64, else float32) on the
    device of the first gradient; 0 where no unit is finite or there is no gradient.
    """
    if not (max_norm > 0):
        raise ValueError(f"max_norm must be > 0, got {max_norm!r}")
    grads, frame_flags = _gradients(parameters)
    if not grads:
        return torch.tensor(0.0)
    device = grads[0].device
    dtype = torch.float64 if any(g.dtype == torch.float64 for g in grads) else torch.float32
    norms = [_unit_norms(g, norm_type, frames) for g, frames in zip(grads, frame_flags)]
    finite = [torch.isfinite(norm) for norm in norms]
    kept = torch.cat([torch.where(ok, norm, 0.0).reshape(-1).to(device=device, dtype=dtype) for norm, ok in zip(norms, finite)])
    total = torch.linalg.vector_norm(kept, norm_type)
    coefficient = torch.clamp(max_norm / (total + 1e-6), max=1.0)
    for g, ok, frames in zip(grads, finite, frame_flags):
        # computed in the coefficient's dtype and rounded to the gradient's, as torch's clip_grad_norm_
        factor = torch.where(ok, coefficient.to(g.device), 1.0)
        g.mul_(factor[..., None, None] if frames else factor)
    return total


def _gradients(parameters) -> tuple[list, list]:
    """(gradients, whether each is a stack of frames) of the parameters with a gradient."""
    if isinstance(parameters, (torch.Tensor, dict)):
        parameters = [parameters]
    grads, frames = [], []
    for item in parameters:
        if isinstance(item, dict):
            members = item["params"]
            members = [members] if isinstance(members, torch.Tensor) else list(members)
            is_frames = item.get(MANIFOLD_KEY) == "stiefel"
        elif isinstance(item, torch.Tensor):
            members, is_frames = [item], False
        else:
            raise ValueError(f"parameters must hold tensors or param groups (dicts with 'params'), got {type(item).__name__}")
        for p in members:
            if p.grad is None:
                continue
            if p.grad.is_sparse:
                raise ValueError("clip_grad_norm_finite_ does not support sparse gradients")
            if is_frames and p.dim() < 2:
                raise ValueError(f"a parameter of a frame group must have shape (..., d, r), got {tuple(p.shape)}")
            grads.append(p.grad)
            frames.append(is_frames)
    return grads, frames


def _unit_norms(grad: torch.Tensor, norm_type: float, frames: bool) -> torch.Tensor:
    """The norm of each unit of one gradient: shape (...) for a stack of frames, () otherwise."""
    if frames:
        return torch.linalg.vector_norm(grad, norm_type, dim=(-2, -1))
    return torch.linalg.vector_norm(grad, norm_type)
