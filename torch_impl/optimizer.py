"""StiefelAdam as a torch.optim.Optimizer (the API of torch/optim/adamw.py).

A param group holds one of two kinds of tensor, named by its option `manifold`:

* "stiefel" (the default): each parameter of shape (..., d, r) is a batch of frames on St(d, r)
  (for example the W_Q of all heads of a layer, shape (heads, d_model, d_head)), stepped by
  `torch_impl.functional.stiefel_adam_step`. Its state is

    state["step"]       t, float64 tensor of shape (...): steps taken, one count per frame (a frame
                        skipped for a non-finite step keeps its count)
    state["exp_avg"]    m, shape (..., d, r), float64 for float64 parameters, float32 otherwise:
                        the moment of the last step, tangent at the frame *before* that step (its
                        transport to the current frame is done by the next step, inside its own
                        projection; functional.transported_moment(p, m) gives docs/algorithm.md's m)
    state["exp_avg_sq"] v, shape (...), one scalar per frame, same dtype as m

  Parameters of one (d, r), dtype and device with the same hyper-parameters are stepped in one
  batched call, as torch.optim's foreach path does for a list of tensors.
* "euclidean": ordinary tensors of any shape, stepped by torch.optim's own functional AdamW
  (`torch.optim.adamw.adamw`, not a copy of it) with the group's lr, betas, eps and
  weight_decay (AdamW's decoupled decay p <- p (1 - lr weight_decay)), with the state that
  torch.optim.AdamW keeps: the same numbers bit for bit. So one optimizer, one scheduler and one
  state_dict cover a whole model.
"""

from __future__ import annotations

import math
from itertools import chain

import torch

from reference_impl import StiefelAdamConfig

import torch.optim.adam as _adam
import torch.optim.adamw as _adamw

from .functional import compute_dtype, feasibility, resolve_retraction, stiefel_adam_step, unit_roundoff

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


ORDINARY_WEIGHT_HINT = "if it is an ordinary weight, put it in a param group with manifold='euclidean' (stepped by AdamW)"


def _check_frame(name: str, p: torch.Tensor) -> None:
    """ValueError unless p (..., d, r) is a batch of frames on St(d, r) in a supported dtype."""
    try:
        _check_frame_shape(name, p)
    except ValueError as error:
        raise ValueError(f"{error}; {ORDINARY_WEIGHT_HINT}") from None
    if p.dtype not in (torch.float64, torch.float32, torch.bfloat16):
        raise ValueError(f"{name} must have dtype float64, float32 or bfloat16, got {p.dtype}")
    d, r = p.shape[-2], p.shape[-1]
    tol = manifold_tolerance(d, r, p.dtype)
    residual = feasibility(p.detach())
    worst = float(residual.max()) if residual.numel() else 0.0
    if not worst <= tol:
        raise ValueError(
            f"{name} must satisfy W^T W = I (||W^T W - I|| = {worst:.1e} > {tol:.1e} for {p.dtype}) in a "
            f"param group of frames; either initialise it on the manifold with torch_impl.stiefel_init_, or, {ORDINARY_WEIGHT_HINT}"
        )


def _check_hyperparameters(lr, betas, eps, trust_radius, weight_decay) -> None:
    """The rules of docs/algorithm.md, from the reference's own config (same ValueError messages)."""
    StiefelAdamConfig(lr=lr, betas=betas, eps=eps, trust_radius=trust_radius, weight_decay=weight_decay)


MANIFOLDS = ("stiefel", "euclidean")
SUPPORTED_OPTIONS = (
    "lr", "betas", "eps", "trust_radius", "weight_decay", "skip_nonfinite", "retraction_method", "manifold",
)
# Options of torch.optim.Adam / AdamW and geoopt's RiemannianAdam that this optimizer does not
# implement, with the values that ask for nothing (those optimizers' defaults): they are accepted,
# so code written for those optimizers runs unchanged; any other value is refused by name, since
# silently ignoring amsgrad=True or maximize=True would train something other than was asked.
FOREIGN_OPTIONS = {
    "amsgrad": (False,),
    "maximize": (False,),
    "foreach": (None, False),
    "fused": (None, False),
    "capturable": (False,),
    "differentiable": (False,),
    "decoupled_weight_decay": (False,),
    "stabilize": (None,),
}


def _check_foreign_options(options: dict, where: str, unknown_ok: bool) -> None:
    """ValueError for an option that asks for something StiefelAdam does not do."""
    supported = ", ".join(SUPPORTED_OPTIONS)
    for key, value in options.items():
        if key in SUPPORTED_OPTIONS or key == "params":
            continue
        if key not in FOREIGN_OPTIONS:
            if unknown_ok:  # a param group may carry the user's own keys ("name", ...), as in torch.optim
                continue
            raise ValueError(f"{where}: unknown option {key!r}; StiefelAdam takes {supported}")
        if not any(value is off or (off is not None and value == off) for off in FOREIGN_OPTIONS[key]):
            accepted = " or ".join(f"{key}={off!r}" for off in FOREIGN_OPTIONS[key])
            raise ValueError(
                f"{where}: {key}={value!r} is not supported (only {accepted}, which asks for nothing); "
                f"StiefelAdam takes {supported}"
            )


class StiefelAdam(torch.optim.Optimizer):
    """Riemannian Adam on the Stiefel manifold with one scalar second moment per frame (docs/algorithm.md),
    and torch.optim's AdamW for the ordinary tensors of the same model.

    params: parameters or param groups. In a group with manifold="stiefel" (the default) each
    parameter has shape (..., d, r), 1 <= r <= d, dtype float64, float32 or bfloat16, every frame on
    St(d, r) (use `stiefel_init_`); in a group with manifold="euclidean" any floating tensor.
    lr > 0; betas in [0, 1)^2; eps >= 0 (added after the square root); trust_radius in (0, inf]
    (Frobenius cap on each frame's step; frames only); weight_decay >= 0 (for frames coupled,
    G + lambda W, whose Riemannian gradient is zero, so it leaves frames unchanged, P5,
    docs/claims.md; for ordinary tensors AdamW's decoupled decay); retraction_method: "auto",
    "newton_schulz" or "eigh" (see torch_impl.functional).

    skip_nonfinite=False: a step that is not finite (a NaN or inf in a gradient, or a float32
    overflow of ||g||^2) raises ValueError before anything is written; deciding that waits for the
    device once per `step()`. skip_nonfinite=True: each *frame* whose step is not finite keeps its
    frame, moments and step count while the other frames of the same tensor step, decided on the
    device with `torch.where`: `step()` then never waits for the device, and compiles with
    torch.compile without graph breaks. An ordinary tensor with a non-finite gradient is skipped
    whole: AdamW steps it and `torch.where` puts back its value, moments and count (AdamW keeps
    that count on the CPU, so on CUDA this one copy waits for the device). `skipped_steps` counts
    the skipped frames and tensors (reading it waits for the device).

    Options of torch.optim.Adam/AdamW and geoopt (amsgrad, maximize, foreach, fused, capturable,
    differentiable, ...) are accepted only with the value that asks for nothing; any other raises
    ValueError naming the supported options.
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
        manifold: str = "stiefel",
        **options,
    ):
        _check_foreign_options(options, "StiefelAdam", unknown_ok=False)
        _check_hyperparameters(lr, betas, eps, trust_radius, weight_decay)
        defaults = dict(
            lr=lr,
            betas=tuple(betas),
            eps=eps,
            trust_radius=trust_radius,
            weight_decay=weight_decay,
            skip_nonfinite=bool(skip_nonfinite),
            retraction_method=retraction_method,
            manifold=manifold,
        )
        self._skipped: dict = {}  # device -> count of skipped frames and tensors, kept on that device
        self._skipped_offset = 0
        super().__init__(params, defaults)

    @property
    def skipped_steps(self) -> int:
        """Frames (and ordinary tensors) skipped for a non-finite step; reading it waits for the device."""
        return self._skipped_offset + sum(int(count) for count in self._skipped.values())

    @skipped_steps.setter
    def skipped_steps(self, value: int) -> None:
        self._skipped, self._skipped_offset = {}, int(value)

    def _count_skipped(self, device: torch.device, count: torch.Tensor) -> None:
        total = self._skipped.get(device)
        self._skipped[device] = count if total is None else total + count

    def add_param_group(self, param_group: dict) -> None:
        index = len(self.param_groups)
        _check_foreign_options(param_group, f"param group {index}", unknown_ok=True)
        super().add_param_group(param_group)
        group = self.param_groups[-1]
        _check_hyperparameters(group["lr"], group["betas"], group["eps"], group["trust_radius"], group["weight_decay"])
        group["betas"] = tuple(group["betas"])
        if group["manifold"] not in MANIFOLDS:
            raise ValueError(f"param group {index}: manifold must be one of {MANIFOLDS}, got {group['manifold']!r}")
        if group["manifold"] == "euclidean":
            for position, p in enumerate(group["params"]):
                if not p.is_floating_point():
                    raise ValueError(f"params[{position}] of param group {index} must be a floating tensor, got {p.dtype}")
            return
        resolve_retraction(group["retraction_method"], group["trust_radius"])
        for position, p in enumerate(group["params"]):
            _check_frame(f"params[{position}] of param group {index}", p)

    # ------------------------------------------------------------------------------------------
    # frames
    # ------------------------------------------------------------------------------------------

    def _fresh_state(self, p: torch.Tensor) -> dict:
        dtype = compute_dtype(p.dtype)
        return {
            "step": torch.zeros(p.shape[:-2], dtype=torch.float64, device=p.device),
            "exp_avg": torch.zeros(p.shape, dtype=dtype, device=p.device),
            "exp_avg_sq": torch.zeros(p.shape[:-2], dtype=dtype, device=p.device),
        }

    def _frame_buckets(self) -> dict:
        """Parameters with a gradient, by what one batched call needs to be the same for them all:
        hyper-parameters, (d, r), dtype and device. Values: lists of (parameter, name)."""
        buckets: dict = {}
        for group_index, group in enumerate(self.param_groups):
            if group["manifold"] != "stiefel":
                continue
            settings = tuple(group[key] for key in BUCKET_SETTINGS)
            for index, p in enumerate(group["params"]):
                if p.grad is None:
                    continue
                name = f"params[{index}] of param group {group_index}"
                if p.grad.is_sparse:
                    raise ValueError(f"{name}: StiefelAdam does not support sparse gradients")
                key = settings + (tuple(p.shape[-2:]), p.dtype, p.device)
                buckets.setdefault(key, []).append((p, name))
        return buckets

    def _step_bucket(self, settings: tuple, members: list) -> "_BucketStep":
        """The batched step of one bucket, nothing written yet."""
        lr, (beta1, beta2), eps, trust_radius, weight_decay, skip, method = settings[: len(BUCKET_SETTINGS)]
        params = [p for p, _ in members]
        states = [self.state[p] if len(self.state[p]) else self._fresh_state(p) for p in params]
        W, G = _joined(params), _joined([p.grad for p in params])
        m, v = _joined([s["exp_avg"] for s in states]), _joined_counts([s["exp_avg_sq"] for s in states])
        t = _joined_counts([s["step"] for s in states])
        W_new, m_new, v_new = stiefel_adam_step(
            W, G, m, v, t, lr, beta1, beta2, eps, trust_radius, weight_decay,
            retraction_method=method, sync_free=skip,
        )
        # |W_new| <= 1 entrywise, so a frame whose sum is not finite has a NaN or inf entry; every
        # NaN or inf of G or of m_new reaches W_new or v (it makes ||g||^2, hence v, non-finite,
        # or, with v finite, xi = c m_new and so polar(W + xi) NaN), and so does a finite gradient
        # that overflows the compute dtype in W^T G or ||g||^2 (v = inf would freeze the frame)
        finite = torch.isfinite(v_new) & torch.isfinite(W_new.sum(dim=(-2, -1), dtype=torch.float32))
        if skip:
            keep = finite[:, None, None]
            W_new = torch.where(keep, W_new, W)
            m_new = torch.where(keep, m_new, m)
            v_new = torch.where(finite, v_new, v)
        return _BucketStep(members, states, W_new, m_new, v_new, t + finite, finite)

    def _write(self, bucket: "_BucketStep") -> None:
        start = 0
        for (p, _), state in zip(bucket.members, bucket.states):
            stop = start + _frame_count(p)
            if not len(self.state[p]):
                self.state[p].update(state)
            state = self.state[p]
            # in place, as torch.optim does: references to the parameter and the state stay valid
            p.copy_(bucket.W[start:stop].view(p.shape))
            state["exp_avg"].copy_(bucket.m[start:stop].view(p.shape))
            state["exp_avg_sq"].copy_(bucket.v[start:stop].view(p.shape[:-2]))
            state["step"].copy_(bucket.t[start:stop].view(p.shape[:-2]))
            start = stop

    def _refuse_nonfinite(self, steps: list) -> None:
        """ValueError naming the first parameter whose step is not finite (error mode only)."""
        for bucket in steps:
            start = 0
            for p, name in bucket.members:
                frames = _frame_count(p)
                if bool(bucket.finite[start : start + frames].all()):
                    start += frames
                    continue
                if not bool(torch.isfinite(p.grad).all()):
                    raise ValueError(
                        f"{name}: gradient must be finite (found NaN or inf); no parameter or state was "
                        "changed (pass skip_nonfinite=True to skip such frames)"
                    )
                raise ValueError(
                    f"{name}: the step overflowed in {compute_dtype(p.dtype)} (largest gradient entry "
                    f"{float(p.grad.abs().max()):.3g}); no parameter or state was changed "
                    "(scale the loss down, or pass skip_nonfinite=True to skip such frames)"
                )

    # ------------------------------------------------------------------------------------------
    # ordinary tensors
    # ------------------------------------------------------------------------------------------

    def _step_euclidean(self, group: dict, group_index: int) -> None:
        """torch.optim.AdamW's step for one group, through torch.optim's own functional adamw."""
        params, grads, exp_avgs, exp_avg_sqs, steps = [], [], [], [], []
        skip = group["skip_nonfinite"]
        for index, p in enumerate(group["params"]):
            if p.grad is None:
                continue
            if p.grad.is_sparse:
                raise ValueError(f"params[{index}] of param group {group_index}: StiefelAdam does not support sparse gradients")
            state = self.state[p]
            if not len(state):
                # torch.optim.AdamW's own initial state (capturable=False: the count on the CPU)
                state["step"] = torch.tensor(0.0, dtype=_adam._get_scalar_dtype(), device="cpu")
                state["exp_avg"] = torch.zeros_like(p, memory_format=torch.preserve_format)
                state["exp_avg_sq"] = torch.zeros_like(p, memory_format=torch.preserve_format)
            params.append(p)
            grads.append(p.grad)
            exp_avgs.append(state["exp_avg"])
            exp_avg_sqs.append(state["exp_avg_sq"])
            steps.append(state["step"])
        if not params:
            return
        beta1, beta2 = group["betas"]
        tensors = (params, exp_avgs, exp_avg_sqs, steps)
        before = [[x.clone() for x in kind] for kind in tensors] if skip else None
        _adamw.adamw(
            params, grads, exp_avgs, exp_avg_sqs, [], steps, foreach=None, capturable=False, differentiable=False,
            fused=None, amsgrad=False, beta1=beta1, beta2=beta2, lr=group["lr"], weight_decay=group["weight_decay"],
            eps=group["eps"], maximize=False,
        )
        if skip:
            # a tensor whose gradient is not finite gets back its value, moments and count
            for index, grad in enumerate(grads):
                finite = torch.isfinite(grad).all()
                for kind, old in zip(tensors, before):
                    kind[index].copy_(torch.where(finite.to(kind[index].device), kind[index], old[index]))
                self._count_skipped(grad.device, (~finite).to(torch.int64))

    @torch.no_grad()
    def step(self, closure=None):
        """One step for every parameter with a gradient; returns closure() if given.

        Frames first, computed for every bucket before anything is written, so that in the error
        mode (skip_nonfinite=False) a non-finite step leaves every parameter and state as it was.
        """
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        buckets = self._frame_buckets()
        steps = [self._step_bucket(settings, members) for settings, members in buckets.items()]
        checked = [bucket for bucket, settings in zip(steps, buckets) if not settings[_SKIP]]
        # the one wait for the device in a step, and only in the error mode: the buckets' flags are
        # gathered on one device and read once
        if checked:
            flags = [bucket.finite.all() for bucket in checked]
            if not bool(torch.stack([flag.to(flags[0].device, non_blocking=True) for flag in flags]).all()):
                self._refuse_nonfinite(checked)
        for bucket, settings in zip(steps, buckets):
            self._write(bucket)
            if settings[_SKIP]:  # counted once the step is known to be written (a refused step skips nothing)
                self._count_skipped(bucket.W.device, (~bucket.finite).sum())
        for group_index, group in enumerate(self.param_groups):
            if group["manifold"] == "euclidean":
                self._step_euclidean(group, group_index)
        return loss

    def __setstate__(self, state: dict) -> None:
        super().__setstate__(state)
        for group in self.param_groups:
            # a checkpoint written before euclidean groups and skipping existed: its groups are frame groups
            group.setdefault("manifold", "stiefel")
            group.setdefault("skip_nonfinite", False)
            group.setdefault("retraction_method", "auto")

    def load_state_dict(self, state_dict: dict) -> None:
        """As torch.optim.Optimizer.load_state_dict, but a frame's moments keep their float32 /
        float64 dtype (the base class would cast them to a bfloat16 parameter's dtype, losing the
        exact resume) and their values bit for bit; a step count saved as one int (by an earlier
        version) becomes one count per frame. Ordinary tensors are restored as torch.optim.AdamW
        restores them."""
        saved_groups = state_dict["param_groups"]
        saved_ids = chain.from_iterable(g["params"] for g in saved_groups)
        frame_params = chain.from_iterable(
            g["params"] if saved.get("manifold", "stiefel") == "stiefel" else [None] * len(g["params"])
            for g, saved in zip(self.param_groups, saved_groups)
        )
        id_to_param = {saved_id: p for saved_id, p in zip(saved_ids, frame_params) if p is not None}
        saved_state = state_dict["state"]
        super().load_state_dict(state_dict)
        for saved_id, p in id_to_param.items():
            if saved_id not in saved_state:
                continue
            state = self.state[p]
            for key, value in saved_state[saved_id].items():
                if key == "step":
                    count = value if torch.is_tensor(value) else torch.tensor(float(value))
                    state[key] = count.to(device=p.device, dtype=torch.float64, copy=True).expand(p.shape[:-2]).clone()
                elif torch.is_tensor(value):
                    state[key] = value.to(device=p.device, dtype=compute_dtype(p.dtype), copy=True)


# A bucket's key starts with these settings of its group (then (d, r), dtype and device)
BUCKET_SETTINGS = ("lr", "betas", "eps", "trust_radius", "weight_decay", "skip_nonfinite", "retraction_method")
_SKIP = BUCKET_SETTINGS.index("skip_nonfinite")


def _frame_count(p: torch.Tensor) -> int:
    """Frames in a parameter of shape (..., d, r)."""
    return math.prod(p.shape[:-2])


class _BucketStep:
    """The result of one batched call: parameters (with names), their states, the new frames,
    moments and counts (all frames of the bucket along the first axis) and which frames were finite."""

    def __init__(self, members, states, W, m, v, t, finite):
        self.members, self.states = members, states
        self.W, self.m, self.v, self.t, self.finite = W, m, v, t, finite


def _joined(tensors: list) -> torch.Tensor:
    """(B, d, r): the frames of every tensor along one batch axis (a view for a single tensor)."""
    d, r = tensors[0].shape[-2:]
    if len(tensors) == 1:
        return tensors[0].reshape(-1, d, r)
    return torch.cat([x.reshape(-1, d, r) for x in tensors])


def _joined_counts(tensors: list) -> torch.Tensor:
    """(B,): one value per frame, for every tensor of shape (...)."""
    if len(tensors) == 1:
        return tensors[0].reshape(-1)
    return torch.cat([x.reshape(-1) for x in tensors])
