"""PyTorch StiefelAdam, held to the float64 reference (reference_impl) by the claim propositions.crosscheck.

`StiefelAdam` is a torch.optim.Optimizer over parameters of shape (..., d, r) (batches of frames on
St(d, r)); `stiefel_init_` puts a tensor on the manifold and `stiefel_project_` puts one back (the
nearest frame); `clip_grad_norm_finite_` clips gradients over their finite frames and tensors;
`functional.stiefel_adam_step` is the batched step that the optimizer calls (CPU and CUDA;
float64, float32, bfloat16 storage); `declared_precision(dtype)` says in which dtype it evaluates
each stage, which its certifier holds it to.
"""

from . import functional
from .clipping import clip_grad_norm_finite_
from .functional import declared_precision, feasibility, polar_factor, polar_retract, project_tangent, stiefel_adam_step
from .optimizer import StiefelAdam, manifold_tolerance, stiefel_init_, stiefel_project_

__all__ = [
    "StiefelAdam",
    "stiefel_init_",
    "stiefel_project_",
    "clip_grad_norm_finite_",
    "manifold_tolerance",
    "functional",
    "stiefel_adam_step",
    "polar_retract",
    "polar_factor",
    "project_tangent",
    "feasibility",
    "declared_precision",
]
