"""StiefelAdam as a torch.optim.Optimizer (the API of torch/optim/adamw.py).

Each parameter of shape (..., d, r) is a batch of frames on St(d, r) (for example the W_Q of all
heads of a layer, shape (heads, d_model, d_head)). Its state is

    state["step"]       int, steps taken
    state["exp_avg"]    m, shape (..., d, r), float64 for float64 parameters, float32 otherwise:
                        the moment of the last step, tangent at the frame *before* that step (its
                        transport to the current frame is done by the next step, inside its own
                        projection; functional.transported_moment(p, m) gives docs/algorithm.md's m)
    state["exp_avg_sq"] v, shape (...), one scalar per frame, same dtype as m

and one `step` applies `torch_impl.functional.stiefel_adam_step` to the whole tensor.
"""

from __future__ import annotations

import math
from itertools import chain

import torch

from reference_impl import StiefelAdamConfig

from .functional import RETRACTION_METHODS, compute_dtype, feasibility, resolve_retraction, unit_roundoff

# The manifold tolerance of reference_impl/_validation.py, 32 (d r + 2 sqrt(r)) u, has two parts:
# d r u, the orthogonality error of a frame computed (and its Gram matrix evaluated) in precision u,
# and 2 sqrt(r) u, the representation error of rounding an exact frame to precision u
# (||W^T W - I|| <= 2 ||E|| with ||E||_F <= u sqrt(r)). For a stored frame the first part is at the
# precision the frame can be computed in (the compute dtype: float32 for bfloat16 storage), the
# second at the storage dtype's unit roundoff u_s. Hence
#     tol(d, r, dtype) = 32 d r u_c + 4 sqrt(r) u_s,
# which is the reference's tolerance for float64 (up to the factor on the rounding term, where a
# worst case needs no slack beyond 2) and accepts a stiefel_init_ frame in any storage dtype, while
# rejecting a frame rounded to a coarser dtype than its own or one that drifted.
MANIFOLD_TOL_FACTOR = 32.0


def manifold_tolerance(d: int, r: int, dtype: torch.dtype) -> float:
    """Largest accepted ||W^T W - I_r||_F for a frame of shape (d, r) stored in dtype."""
    return MANIFOLD_TOL_FACTOR * d * r * unit_roundoff(compute_dtype(dtype)) + 4.0 * math.sqrt(r) * unit_roundoff(dtype)


@torch.no_grad()
def stiefel_init_(tensor: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
    """Fill tensor (..., d, r), r <= d, in place with Haar-random frames: the polar factor of a
    Gaussian matrix, computed in float64 (by SVD) and rounded to the tensor's dtype. Returns tensor.
    """
    _check_frame_shape("tensor", tensor)
    gaussian = torch.randn(tensor.shape, dtype=torch.float64, device=tensor.device, generator=generator)
    U, _, Vh = torch.linalg.svd(gaussian, full_matrices=False)
    tensor.copy_((U @ Vh).to(tensor.dtype))
    return tensor


def _check_frame_shape(name: str, tensor: torch.Tensor) -> None:
    if tensor.dim() < 2:
        raise ValueError(f"{name} must have shape (..., d, r) with at least 2 dims, got shape {tuple(tensor.shape)}")
    d, r = tensor.shape[-2], tensor.shape[-1]
    if r < 1 or r > d:
        raise ValueError(
            f"{name} must have 1 <= r <= d (r orthonormal columns in R^d), got d={d}, r={r} (shape {tuple(tensor.shape)})"
        )


def _check_hyperparameters(lr, betas, eps, trust_radius, weight_decay) -> None:
    """The rules of docs/algorithm.md, from the reference's own config (same ValueError messages)."""
    StiefelAdamConfig(lr=lr, betas=betas, eps=eps, trust_radius=trust_radius, weight_decay=weight_decay)


class StiefelAdam(torch.optim.Optimizer):
    """Riemannian Adam on the Stiefel manifold with one scalar second moment per frame (docs/algorithm.md).

    params: parameters (or param groups) of shape (..., d, r), 1 <= r <= d, dtype float64, float32
    or bfloat16, each frame on St(d, r) (use `stiefel_init_`); lr > 0; betas in [0, 1)^2; eps >= 0
    (added after the square root); trust_radius in (0, inf] (Frobenius cap on each frame's step);
    weight_decay >= 0 (coupled, G + lambda W; its Riemannian gradient is zero, so it leaves frames
    unchanged, P5, docs/claims.md); skip_nonfinite: a parameter whose gradient has a NaN or inf is skipped
    (parameter and state untouched) instead of raising ValueError; retraction_method: "auto",
    "newton_schulz" or "eigh" (see torch_impl.functional).
    """

    def __init__(
        self,
        params,
        lr: float = 1e-3,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-8,
        trust_radius: float = 0.5,
        weight_decay: float = 0.0,
        *,
        skip_nonfinite: bool = False,
        retraction_method: str = "auto",
    ):
        _check_hyperparameters(lr, betas, eps, trust_radius, weight_decay)
        if retraction_method not in RETRACTION_METHODS:
            raise ValueError(f"retraction_method must be one of {RETRACTION_METHODS}, got {retraction_method!r}")
        defaults = dict(
            lr=lr,
            betas=tuple(betas),
            eps=eps,
            trust_radius=trust_radius,
            weight_decay=weight_decay,
            skip_nonfinite=bool(skip_nonfinite),
            retraction_method=retraction_method,
        )
        super().__init__(params, defaults)
        self.skipped_steps = 0  # parameters skipped for a non-finite gradient (skip_nonfinite=True)

    def add_param_group(self, param_group: dict) -> None:
        super().add_param_group(param_group)
        group = self.param_groups[-1]
        _check_hyperparameters(group["lr"], group["betas"], group["eps"], group["trust_radius"], group["weight_decay"])
        resolve_retraction(group["retraction_method"], group["trust_radius"])
        for index, p in enumerate(group["params"]):
            name = f"params[{index}] of param group {len(self.param_groups) - 1}"
            _check_frame_shape(name, p)
            if p.dtype not in (torch.float64, torch.float32, torch.bfloat16):
                raise ValueError(f"{name} must have dtype float64, float32 or bfloat16, got {p.dtype}")
            d, r = p.shape[-2], p.shape[-1]
            tol = manifold_tolerance(d, r, p.dtype)
            residual = feasibility(p.detach())
            worst = float(residual.max()) if residual.numel() else 0.0
            if not worst <= tol:
                raise ValueError(
                    f"{name} must satisfy W^T W = I (||W^T W - I|| = {worst:.1e} > {tol:.1e} for {p.dtype}); "
                    "initialise it with torch_impl.stiefel_init_"
                )

    def _state_dtype(self, p: torch.Tensor) -> torch.dtype:
        return compute_dtype(p.dtype)

    def _init_state(self, p: torch.Tensor) -> dict:
        dtype = self._state_dtype(p)
        return {
            "step": 0,
            "exp_avg": torch.zeros(p.shape, dtype=dtype, device=p.device),
            "exp_avg_sq": torch.zeros(p.shape[:-2], dtype=dtype, device=p.device),
        }

    @torch.no_grad()
    def step(self, closure=None):
        """One step for every parameter with a gradient; returns closure() if given."""
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        from .functional import stiefel_adam_step

        for group_index, group in enumerate(self.param_groups):
            beta1, beta2 = group["betas"]
            for index, p in enumerate(group["params"]):
                if p.grad is None:
                    continue
                grad = p.grad
                name = f"params[{index}] of param group {group_index}"
                if grad.is_sparse:
                    raise ValueError(f"{name}: StiefelAdam does not support sparse gradients")
                state = self.state[p]
                # a fresh state is stored only with the first step that is written
                current = state if len(state) else self._init_state(p)
                W_new, m_new, v_new = stiefel_adam_step(
                    p,
                    grad,
                    current["exp_avg"],
                    current["exp_avg_sq"],
                    current["step"],
                    group["lr"],
                    beta1,
                    beta2,
                    group["eps"],
                    group["trust_radius"],
                    group["weight_decay"],
                    retraction_method=group["retraction_method"],
                )
                # Nothing is written unless the step is finite, and two cheap reductions decide it:
                # |W_new| <= 1 entrywise, so a non-finite sum of W_new means a NaN or inf entry, and
                # v_new is one scalar per frame. Every NaN or inf of G or of m_new reaches one of
                # them: it makes ||g||^2 (hence v) non-finite, or, with v finite and > 0, the
                # coefficient c finite and xi = c m_new non-finite, so W_new = polar(W + xi) NaN. A
                # finite gradient can still overflow the compute dtype (float32 for float32 and
                # bfloat16 storage), in W^T G or in ||g||^2 (entries near 1e19 in float32), which
                # would leave v = inf and the parameter frozen from then on: the same test catches it.
                if not (bool(torch.isfinite(W_new.sum())) and bool(torch.isfinite(v_new).all())):
                    if group["skip_nonfinite"]:
                        self.skipped_steps += 1
                        continue
                    if not bool(torch.isfinite(grad).all()):
                        raise ValueError(
                            f"{name}: gradient must be finite (found NaN or inf); parameter and state were "
                            "left unchanged (pass skip_nonfinite=True to skip such steps)"
                        )
                    raise ValueError(
                        f"{name}: the step overflowed in {W_new.dtype} (largest gradient entry "
                        f"{float(grad.abs().max()):.3g}); parameter and state were left unchanged "
                        "(scale the loss down, or pass skip_nonfinite=True to skip such steps)"
                    )
                # in place, as torch.optim does: references to the state stay valid
                if current is not state:
                    state.update(current)
                p.copy_(W_new)
                state["exp_avg"].copy_(m_new)
                state["exp_avg_sq"].copy_(v_new)
                state["step"] += 1
        return loss

    def load_state_dict(self, state_dict: dict) -> None:
        """As torch.optim.Optimizer.load_state_dict, but the moments keep their float32 / float64
        dtype (the base class would cast them to a bfloat16 parameter's dtype, losing the exact
        resume) and their values bit for bit."""
        saved_ids = chain.from_iterable(g["params"] for g in state_dict["param_groups"])
        params = chain.from_iterable(g["params"] for g in self.param_groups)
        id_to_param = dict(zip(saved_ids, params))
        saved_state = state_dict["state"]
        super().load_state_dict(state_dict)
        for saved_id, p in id_to_param.items():
            if saved_id not in saved_state:
                continue
            state = self.state[p]
            for key, value in saved_state[saved_id].items():
                if torch.is_tensor(value):
                    state[key] = value.to(device=p.device, dtype=self._state_dtype(p), copy=True)
                elif key == "step":
                    state[key] = int(value)
