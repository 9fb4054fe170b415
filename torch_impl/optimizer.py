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

from .functional import compute_dtype, feasibility, frame_deviation, memoized, resolve_retraction, stiefel_adam_step, unit_roundoff

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


@memoized
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


@torch.no_grad()
def stiefel_project_(tensor: torch.Tensor) -> torch.Tensor:
    """Replace every frame of tensor (..., d, r), r <= d, in place by its polar factor U V^T (the
    nearest frame on St(d, r) in the Frobenius norm, unique where the frame has rank r), computed
    in float64 by SVD and rounded to the tensor's dtype. The way back to the manifold for a frame
    that left it (an in-place edit, a load of other weights). Returns tensor.
    """
    _check_frame_shape("tensor", tensor)
    if not bool(torch.isfinite(tensor).all()):
        raise ValueError("tensor must be finite to be projected onto St(d, r) (found NaN or inf); re-initialise it with torch_impl.stiefel_init_")
    U, _, Vh = torch.linalg.svd(tensor.detach().to(torch.float64), full_matrices=False)
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


def _check_saved_frame_state(name: str, p: torch.Tensor, state: dict) -> None:
    """ValueError naming the parameter unless `state` is a StiefelAdam frame state for p: exp_avg of
    p's shape, exp_avg_sq and step of one entry per frame (a step saved as one number, by an earlier
    version, is one count for every frame). A state of another optimizer (torch.optim.Adam's
    exp_avg_sq has p's shape) or of another parameter is refused here, not by a reshape later."""
    if not state:  # a frame that has not stepped yet: nothing saved, nothing to load
        return
    frames = tuple(p.shape[:-2])
    missing = [key for key in ("exp_avg", "exp_avg_sq", "step") if key not in state]
    if missing:
        raise ValueError(f"{name}: the saved state has no {', '.join(missing)} (keys {sorted(state)}): not a StiefelAdam frame state")
    expected = {"exp_avg": tuple(p.shape), "exp_avg_sq": frames}
    for key, shape in expected.items():
        value = state[key]
        if not torch.is_tensor(value) or tuple(value.shape) != shape:
            found = tuple(value.shape) if torch.is_tensor(value) else type(value).__name__
            raise ValueError(f"{name}: the saved {key} has shape {found}, a frame state of this parameter {tuple(p.shape)} has {shape} "
                             "(the state of another parameter or optimizer)")
    step = state["step"]
    if torch.is_tensor(step) and step.dim() and tuple(step.shape) != frames:
        raise ValueError(f"{name}: the saved step has shape {tuple(step.shape)}, one count per frame of this parameter is {frames}")


def _check_frame(name: str, p: torch.Tensor) -> None:
    """ValueError unless p (..., d, r) is a batch of frames on St(d, r) in a supported dtype. A
    tensor on the meta device has no values: its shape and dtype are checked here, its frames by
    the check of every step (and by load_state_dict once it has values)."""
    try:
        _check_frame_shape(name, p)
    except ValueError as error:
        raise ValueError(f"{error}; {ORDINARY_WEIGHT_HINT}") from None
    if p.dtype not in (torch.float64, torch.float32, torch.bfloat16):
        raise ValueError(f"{name} must have dtype float64, float32 or bfloat16, got {p.dtype}")
    if p.is_meta:
        return
    d, r = p.shape[-2], p.shape[-1]
    tol = manifold_tolerance(d, r, p.dtype)
    residual = feasibility(p.detach())
    worst = float(residual.max()) if residual.numel() else 0.0
    if not worst <= tol:
        raise ValueError(
            f"{name} must satisfy W^T W = I (||W^T W - I|| = {worst:.1e} > {tol:.1e} for {p.dtype}) in a "
            f"param group of frames; either initialise it on the manifold with torch_impl.stiefel_init_ (or "
            f"project it there with torch_impl.stiefel_project_), or, {ORDINARY_WEIGHT_HINT}"
        )


# Hyper-parameters that may be 0-d tensors, as torch.optim allows for a capturable or compiled
# step: a scheduler then fills the tensor in place and torch.compile sees data, not a constant.
# betas, weight_decay and trust_radius enter the kernel's fused multiply-adds
# (torch.add(x, y, alpha=...)) and its Python-side iteration counts as host numbers, so they are
# numbers (a tensor there would be read on the host at every step).
TENSOR_HYPERPARAMETERS = ("lr", "eps")


def _check_hyperparameters(lr, betas, eps, trust_radius, weight_decay) -> None:
    """The rules of docs/algorithm.md, from the reference's own config (same ValueError messages);
    lr and eps may be 1-element floating tensors (read once here, on the host)."""
    values = {"lr": lr, "eps": eps}
    for name, value in values.items():
        if torch.is_tensor(value):
            if value.numel() != 1 or not value.is_floating_point() or value.requires_grad:
                raise ValueError(
                    f"{name} must be a real number or a 1-element floating tensor without grad, got a "
                    f"{value.dtype} tensor of shape {tuple(value.shape)}" + (" that requires grad" if value.requires_grad else "")
                )
            values[name] = float(value)
    for name, value in (("betas", tuple(betas) if isinstance(betas, (tuple, list)) else betas), ("trust_radius", trust_radius), ("weight_decay", weight_decay)):
        if torch.is_tensor(value) or (isinstance(value, tuple) and any(torch.is_tensor(x) for x in value)):
            raise ValueError(
                f"{name} must be Python numbers, got a tensor; only {' and '.join(TENSOR_HYPERPARAMETERS)} may be "
                "tensors (the others enter the step as host numbers)"
            )
    StiefelAdamConfig(lr=values["lr"], betas=betas, eps=values["eps"], trust_radius=trust_radius, weight_decay=weight_decay)


def _as_scalar(value):
    """A 1-element tensor as a 0-d tensor (as torch.optim's _to_scalar); anything else unchanged."""
    return value.reshape(()) if torch.is_tensor(value) and value.dim() != 0 else value


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
    St(d, r) (use `stiefel_init_`; parameters on the meta device are accepted and checked once they
    have values); in a group with manifold="euclidean" any floating tensor.
    lr > 0 (a number or a 0-d tensor, which a scheduler fills in place: torch.compile then does not
    recompile for a new value); betas in [0, 1)^2; eps >= 0 (added after the square root; a number
    or a 0-d tensor); trust_radius in (0, inf] (Frobenius cap on each frame's step; frames only);
    weight_decay >= 0 (for frames coupled, G + lambda W, whose Riemannian gradient is zero, so it
    leaves frames unchanged, P5, docs/claims.md; for ordinary tensors AdamW's decoupled decay);
    retraction_method: "auto", "newton_schulz" or "eigh" (see torch_impl.functional).

    Every step checks every frame it steps: its step must be finite (no NaN or inf in the
    gradient, no float32 overflow of ||g||^2), and the frame must still be on St(d, r)
    (||W^T W - I||_F <= manifold_tolerance, one batched r x r Gram product per step), since a
    frame edited in place or loaded from other weights after construction would be stepped into
    nonsense. skip_nonfinite=False: a step that fails either check raises ValueError before
    anything is written, naming the parameter and frame; deciding that waits for the device once per
    `step()`. Under torch.compile the step does not wait: it makes the same decision on the device,
    writes nothing when it refuses, and the ValueError is raised by the next eager `zero_grad()`,
    `state_dict()` or `step()` (docs/algorithm.md). skip_nonfinite=True: each *frame* that fails
    keeps its frame, moments and step count while the other frames of the same tensor step, decided
    on the device with `torch.where`: `step()` then never waits for the device, and compiles with
    torch.compile without graph breaks. `skipped_steps` counts the frames (and ordinary tensors)
    skipped for a non-finite step, `off_manifold_steps` the frames skipped for being off St(d, r)
    (reading either waits for the device). An ordinary tensor with a non-finite gradient is skipped
    whole: AdamW steps it and `torch.where` puts back its value, moments and count (AdamW keeps
    that count on the CPU, so on CUDA this one copy waits for the device).

    Options of torch.optim.Adam/AdamW and geoopt (amsgrad, maximize, foreach, fused, capturable,
    differentiable, ...) are accepted only with the value that asks for nothing; any other raises
    ValueError naming the supported options.
    """

    def __init__(
        self,
        params,
        lr: float | torch.Tensor = 1e-3,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float | torch.Tensor = 1e-8,
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
            lr=_as_scalar(lr),
            betas=tuple(betas),
            eps=_as_scalar(eps),
            trust_radius=trust_radius,
            weight_decay=weight_decay,
            skip_nonfinite=bool(skip_nonfinite),
            retraction_method=retraction_method,
            manifold=manifold,
        )
        # device -> count kept on that device: frames and tensors skipped for a non-finite step,
        # frames skipped for being off the manifold; device -> flag of a refused compiled step
        self._skipped: dict = {}
        self._skipped_offset = 0
        self._off_manifold: dict = {}
        self._off_manifold_offset = 0
        self._refused: dict = {}
        self._calls: dict = {}  # whether step() has run (_opt_called), kept in a dict: see _SCHEDULER_MARK
        self._accepted = None  # the error-mode decision of the step in progress (a tensor while compiling)
        self._plan = None  # _BucketPlan of the last step, see _frame_buckets
        super().__init__(params, defaults)

    @property
    def skipped_steps(self) -> int:
        """Frames (and ordinary tensors) skipped for a non-finite step; reading it waits for the device."""
        return self._skipped_offset + sum(int(count) for count in self._skipped.values())

    @skipped_steps.setter
    def skipped_steps(self, value: int) -> None:
        self._skipped, self._skipped_offset = {}, int(value)

    @property
    def off_manifold_steps(self) -> int:
        """Frames skipped (under skip_nonfinite) because they were not on St(d, r) when the step
        began; reading it waits for the device."""
        return self._off_manifold_offset + sum(int(count) for count in self._off_manifold.values())

    @off_manifold_steps.setter
    def off_manifold_steps(self, value: int) -> None:
        self._off_manifold, self._off_manifold_offset = {}, int(value)

    def _count_skipped(self, device: torch.device, count: torch.Tensor) -> None:
        total = self._skipped.get(device)
        self._skipped[device] = count if total is None else total + count

    def _count_off_manifold(self, device: torch.device, count: torch.Tensor) -> None:
        total = self._off_manifold.get(device)
        self._off_manifold[device] = count if total is None else total + count

    def add_param_group(self, param_group: dict) -> None:
        index = len(self.param_groups)
        _check_foreign_options(param_group, f"param group {index}", unknown_ok=True)
        super().add_param_group(param_group)
        self._plan = None
        group = self.param_groups[-1]
        _check_hyperparameters(group["lr"], group["betas"], group["eps"], group["trust_radius"], group["weight_decay"])
        group["betas"] = tuple(group["betas"])
        group["lr"], group["eps"] = _as_scalar(group["lr"]), _as_scalar(group["eps"])
        if group["manifold"] not in MANIFOLDS:
            raise ValueError(f"param group {index}: manifold must be one of {MANIFOLDS}, got {group['manifold']!r}")
        if group["manifold"] == "euclidean":
            for position, p in enumerate(group["params"]):
                if not p.is_floating_point():
                    raise ValueError(f"{_parameter_name(group, position, index)} must be a floating tensor, got {p.dtype}")
            return
        resolve_retraction(group["retraction_method"], group["trust_radius"])
        for position, p in enumerate(group["params"]):
            _check_frame(_parameter_name(group, position, index), p)

    # ------------------------------------------------------------------------------------------
    # frames
    # ------------------------------------------------------------------------------------------

    def _frame_buckets(self) -> dict:
        """Parameters with a gradient, by what one batched call needs to be the same for them all:
        hyper-parameters, (d, r), dtype and device. Values: lists of (parameter, name).

        The grouping is kept between steps (`_BucketPlan`) and rebuilt when its signature changes:
        the number of groups, which groups have equal settings, and per parameter its identity,
        whether it has a gradient (and its layout), its shape, dtype and device. A scheduler that
        changes every group's lr alike keeps the grouping; the keys carry the current values."""
        groups = self.param_groups
        settings = [_group_settings(group) for group in groups]
        classes = [_settings_class(settings, index) for index in range(len(groups))]
        signature = (tuple(classes), tuple(_parameters_signature(group["params"]) for group in groups))
        plan = self._plan
        if plan is None or plan.signature != signature or torch.compiler.is_compiling():
            plan = _BucketPlan(signature, self._grouping(classes))
            if not torch.compiler.is_compiling():
                self._plan = plan
        return {settings[group_index] + tail: members for group_index, tail, members in plan.buckets}

    def _grouping(self, classes: list) -> list:
        """[(index of a group with the bucket's settings, ((d, r), dtype, device), members)]."""
        buckets: dict = {}
        for group_index, group in enumerate(self.param_groups):
            for index, p in enumerate(group["params"]):
                name = _parameter_name(group, index, group_index)
                if p.is_meta:
                    raise ValueError(
                        f"{name} is on the meta device (it has no values) at step(): Module.to_empty() made new "
                        "parameters; build the optimizer after it, or call "
                        "torch.__future__.set_swap_module_params_on_conversion(True) first so that it keeps them"
                    )
                if group["manifold"] != "stiefel" or p.grad is None:
                    continue
                if p.grad.is_sparse:
                    raise ValueError(f"{name}: StiefelAdam does not support sparse gradients")
                key = (classes[group_index], tuple(p.shape[-2:]), p.dtype, p.device)
                buckets.setdefault(key, []).append((p, name))
        return [(key[0], key[1:], members) for key, members in buckets.items()]

    def _step_bucket(self, settings: tuple, members: list) -> "_BucketStep":
        """The batched step of one bucket, nothing written yet."""
        lr, (beta1, beta2), eps, trust_radius, weight_decay, skip, method = settings[: len(BUCKET_SETTINGS)]
        compiling = torch.compiler.is_compiling()
        layout = _BucketLayout([p for p, _ in members], self.state, compiling)
        W, m, v, t = layout.W, layout.m, layout.v, layout.t
        W_new, m_new, v_new = stiefel_adam_step(
            W, layout.G, m, v, t, lr, beta1, beta2, eps, trust_radius, weight_decay,
            retraction_method=method, sync_free=skip or compiling,
        )
        d, r = W.shape[-2:]
        deviation = self._frame_deviation(W)
        on_manifold = deviation <= manifold_tolerance(d, r, W.dtype)
        finite = self._finite_steps(W_new, v_new)
        stepped = finite & on_manifold
        if skip:
            keep = stepped[:, None, None]
            W_new = torch.where(keep, W_new, W)
            m_new = torch.where(keep, m_new, m)
            v_new = torch.where(stepped, v_new, v)
        bucket = _BucketStep(members, layout, W_new, m_new, v_new, t + stepped, finite)
        bucket.on_manifold, bucket.deviation, bucket.stepped = on_manifold, deviation, stepped
        return bucket

    def _finite_steps(self, W_new: torch.Tensor, v_new: torch.Tensor) -> torch.Tensor:
        """Which frames' steps are finite, (B,) bool, from W+ (B, d, r) and v (B,).

        |W_new| <= 1 entrywise, so a frame whose sum is not finite has a NaN or inf entry; every NaN
        or inf of G or of m reaches W_new or v: it makes ||g||^2, hence v, non-finite, or, with v
        finite, xi = c m_new and so polar(W + xi) NaN. That last case is why v alone is not enough: a
        stored moment that is not finite (a corrupted checkpoint) with a finite gradient leaves v
        finite and W_new NaN. A finite gradient that overflows the compute dtype in W^T G or
        ||g||^2 makes v = inf (which would freeze the frame). Tested as one number, v + sum: for a
        frame on St(d, r), |sum| <= d r lies below half an ulp of the largest float, so the two cannot
        overflow together when both are finite; a frame off St is not stepped whatever this says."""
        return torch.isfinite(W_new.sum(dim=(-2, -1), dtype=torch.float32) + v_new)

    def _count_bucket(self, bucket: "_BucketStep", accepted: torch.Tensor | None) -> None:
        """skipped_steps and off_manifold_steps of a written skip_nonfinite bucket; a frame off the
        manifold is counted there only (its step is often not finite too, but as a consequence). A
        compiled step's counts are multiplied by its error-mode decision (a refused step skips nothing)."""
        skipped = (bucket.on_manifold & ~bucket.finite).sum()
        off = (~bucket.on_manifold).sum()
        if accepted is not None:
            skipped, off = skipped * accepted.to(skipped.device), off * accepted.to(off.device)
        self._count_skipped(bucket.W.device, skipped)
        self._count_off_manifold(bucket.W.device, off)

    def _frame_deviation(self, W: torch.Tensor) -> torch.Tensor:
        """||W^T W - I||_F of every frame of W (B, d, r) in the compute dtype, shape (B,): the check
        of every step (functional.frame_deviation; its rounding is within manifold_tolerance).

        Why a product of its own: the step's r x r quantities do not determine D = W^T W - I. Its
        Gram matrix is S = (W + c m)^T (W + c m) = I + D - c (D Sigma + Sigma D) + c^2 m^T m (m the
        projected moment, Sigma the symmetrised W^T(beta1 m_old + (1 - beta1) G~)), and m^T m is
        not formed; what S and the known ||m||^2 give is tr(D) - 2 c tr(D Sigma), blind to every D
        of trace zero (unit columns that are not orthogonal: a normalised weight matrix). W^T G~ and
        W^T m_old involve W only through products with unknowns. So D costs one Gram product."""
        return frame_deviation(W if W.dtype == compute_dtype(W.dtype) else W.to(compute_dtype(W.dtype)))

    def _write(self, bucket: "_BucketStep") -> None:
        """In place, as torch.optim does: references to the parameter and the state stay valid.
        A bucket whose parameters, or states, lie one after the other in one storage is written
        with one copy (its join was a view); otherwise with one foreach copy per kind."""
        layout = bucket.layout
        if layout.targets is None:
            layout.create_state(self.state)
        layout.write(bucket.W, bucket.m, bucket.v, bucket.t)

    def _refuse_nonfinite(self, steps: list) -> None:
        """ValueError naming the first parameter and frame that cannot be stepped (error mode
        only): a frame off St(d, r), else a step that is not finite."""
        for bucket in steps:
            start = 0
            for p, name in bucket.members:
                frames = _frame_count(p)
                stop = start + frames
                on_manifold, finite = bucket.on_manifold[start:stop], bucket.finite[start:stop]
                if bool((on_manifold & finite).all()):
                    start = stop
                    continue
                if not bool(on_manifold.all()):
                    index = int((~on_manifold).nonzero()[0, 0])
                    raise ValueError(_off_manifold_message(name, p, index, float(bucket.deviation[start + index])))
                if not bool(torch.isfinite(p.grad).all()):
                    raise ValueError(
                        f"{name}: gradient must be finite (found NaN or inf); no parameter or state was "
                        "changed (pass skip_nonfinite=True to skip such frames)"
                    )
                cause = self._nonfinite_setting_or_state(p)
                if cause:
                    raise ValueError(f"{name}: the step is not finite because {cause}; no parameter or state was changed")
                raise ValueError(
                    f"{name}: the step overflowed in {compute_dtype(p.dtype)} (largest gradient entry "
                    f"{float(p.grad.abs().max()):.3g}); no parameter or state was changed "
                    "(scale the loss down, or pass skip_nonfinite=True to skip such frames)"
                )

    def _nonfinite_setting_or_state(self, p: torch.Tensor) -> str | None:
        """Why p's step is not finite when its gradient is: a setting of its group that is NaN or
        inf (set in param_groups, or loaded, after the constructor checked it), or a stored moment
        that is (a corrupted checkpoint); None where neither is (an overflow of the step itself)."""
        for group in self.param_groups:
            if any(q is p for q in group["params"]):
                for key in ("lr", "eps", "weight_decay", "trust_radius"):
                    value = group.get(key)
                    if value is not None and not math.isfinite(float(value)) and not (key == "trust_radius" and float(value) == math.inf):
                        return f"its group's {key} is {float(value)!r}"
                for beta in group.get("betas", ()):
                    if not math.isfinite(float(beta)):
                        return f"its group's betas hold {float(beta)!r}"
        state = self.state.get(p, {})
        for key in ("exp_avg", "exp_avg_sq"):
            value = state.get(key)
            if torch.is_tensor(value) and not bool(torch.isfinite(value).all()):
                return f"its stored {key} is not finite (a corrupted state_dict?)"
        return None

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
                raise ValueError(f"{_parameter_name(group, index, group_index)}: StiefelAdam does not support sparse gradients")
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
            params, grads, exp_avgs, exp_avg_sqs, [], steps,
            # torch.optim refuses a tensor lr on its foreach path unless capturable
            foreach=False if torch.is_tensor(group["lr"]) else None, capturable=False, differentiable=False,
            fused=None, amsgrad=False, beta1=beta1, beta2=beta2, lr=group["lr"], weight_decay=group["weight_decay"],
            eps=group["eps"], maximize=False,
        )
        if skip:
            # a tensor whose gradient is not finite gets back its value, moments and count
            for index, grad in enumerate(grads):
                finite = torch.isfinite(grad).all()
                for kind, old in zip(tensors, before):
                    kind[index].copy_(torch.where(finite.to(kind[index].device), kind[index], old[index]))
                skipped = (~finite).to(torch.int64)
                if self._accepted is not None:  # a compiled step that its error mode refused skips nothing
                    skipped = skipped * self._accepted.to(skipped.device)
                self._count_skipped(grad.device, skipped)

    def _ordinary_tensors(self) -> tuple[list, list]:
        """(every ordinary parameter with a gradient and its AdamW state tensors, those parameters
        that have no state yet: their step creates it)."""
        tensors, fresh = [], []
        for group in self.param_groups:
            if group["manifold"] == "euclidean":
                for p in group["params"]:
                    if p.grad is not None:
                        tensors.append(p)
                        tensors.extend(value for value in self.state[p].values() if torch.is_tensor(value))
                        if not len(self.state[p]):
                            fresh.append(p)
        return tensors, fresh

    @torch.no_grad()
    def step(self, closure=None):
        """One step for every parameter with a gradient; returns closure() if given.

        Frames first, computed for every bucket before anything is written, so that in the error
        mode (skip_nonfinite=False) a step that cannot be taken leaves every parameter and state as
        it was: eagerly it raises after one wait for the device; under torch.compile (which must not
        wait) every write is made conditional on the same decision, on the device, and the
        ValueError is raised by the next eager `zero_grad()`, `state_dict()` or `step()`.
        """
        compiling = torch.compiler.is_compiling()
        if not compiling:
            self._raise_refused()
        self._calls["step"] = True  # read by a torch lr scheduler as _opt_called (see _SCHEDULER_MARK)
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        buckets = self._frame_buckets()
        steps = [self._step_bucket(settings, members) for settings, members in buckets.items()]
        checked = [bucket for bucket, settings in zip(steps, buckets) if not settings[_SKIP]]
        accepted = None
        if checked:
            # the one decision of the error mode, on one device
            flags = [bucket.stepped.all() for bucket in checked]
            accepted = flags[0] if len(flags) == 1 else torch.stack([flag.to(flags[0].device, non_blocking=True) for flag in flags]).all()
            if not compiling:
                # the one wait for the device in an eager step, and only in the error mode
                if not bool(accepted):
                    self._refuse_nonfinite(checked)
                accepted = None
        if accepted is not None:
            self._record_refusal(accepted)
            for bucket in steps:
                bucket.keep_unless(accepted)
            ordinary, fresh = self._ordinary_tensors()
            before = [x.clone() for x in ordinary]
        for bucket, settings in zip(steps, buckets):
            self._write(bucket)
            if settings[_SKIP]:  # counted once the step is known to be written (a refused step skips nothing)
                self._count_bucket(bucket, accepted)
        self._accepted = accepted
        for group_index, group in enumerate(self.param_groups):
            if group["manifold"] == "euclidean":
                self._step_euclidean(group, group_index)
        self._accepted = None
        if accepted is not None:
            for x, old in zip(ordinary, before):
                x.copy_(torch.where(accepted.to(x.device), x, old))
            # a state this step created goes back to zeros and a count of 0: AdamW's fresh state
            for value in (value for p in fresh for value in self.state[p].values() if torch.is_tensor(value)):
                value.copy_(torch.where(accepted.to(value.device), value, 0))
        return loss

    @property
    def _opt_called(self) -> bool:
        """What a torch lr scheduler reads to warn that its step() came before the optimizer's."""
        return self._calls.get("step", False)

    @_opt_called.setter
    def _opt_called(self, value: bool) -> None:
        self._calls["step"] = bool(value)

    def __getstate__(self) -> dict:
        """torch.optim's pickled state (defaults, state, param_groups) and the counts of skipped frames:
        torch.save(optimizer) and copy.deepcopy keep skipped_steps and off_manifold_steps."""
        return {**super().__getstate__(), "_counts": (self.skipped_steps, self.off_manifold_steps)}

    def __setstate__(self, state: dict) -> None:
        state = dict(state)
        skipped, off_manifold = state.pop("_counts", (0, 0))
        super().__setstate__(state)
        # an unpickled optimizer (torch.save, copy.deepcopy) has only what __getstate__ kept: the rest
        # starts as a fresh instance's; load_state_dict, which also comes here, keeps what it has
        fresh = {"_skipped": {}, "_skipped_offset": int(skipped), "_off_manifold": {}, "_off_manifold_offset": int(off_manifold),
                 "_refused": {}, "_calls": {}, "_accepted": None, "_plan": None}
        for name, value in fresh.items():
            self.__dict__.setdefault(name, value)
        for group in self.param_groups:
            # a checkpoint written before euclidean groups and skipping existed: its groups are frame groups
            group.setdefault("manifold", "stiefel")
            group.setdefault("skip_nonfinite", False)
            group.setdefault("retraction_method", "auto")

    def _record_refusal(self, accepted: torch.Tensor) -> None:
        flag = self._refused.get(accepted.device)
        self._refused[accepted.device] = ~accepted if flag is None else flag | ~accepted

    def _raise_refused(self) -> None:
        """Raise the ValueError of a compiled step that refused to step (see `step`); one wait for
        the device, made only once a compiled step has run in the error mode."""
        if not self._refused or not any(bool(flag) for flag in self._refused.values()):
            return
        for flag in self._refused.values():
            flag.zero_()
        # the refused step wrote nothing, so while the gradients are those it saw, stepping the
        # error-mode buckets again (nothing written) finds and names what it refused
        buckets = self._frame_buckets()
        self._refuse_nonfinite([self._step_bucket(settings, members) for settings, members in buckets.items() if not settings[_SKIP]])
        raise ValueError(
            "a step compiled with torch.compile was refused (a frame off St(d, r), or a step that was not finite) "
            "and wrote nothing; the gradients have changed since, so the frame cannot be named"
        )

    def zero_grad(self, set_to_none: bool = True) -> None:
        """As torch.optim.Optimizer.zero_grad; first raises the ValueError of a refused compiled step."""
        if not torch.compiler.is_compiling():
            self._raise_refused()
        super().zero_grad(set_to_none)

    def state_dict(self) -> dict:
        """As torch.optim.Optimizer.state_dict; first raises the ValueError of a refused compiled step."""
        if not torch.compiler.is_compiling():
            self._raise_refused()
        return super().state_dict()

    def load_state_dict(self, state_dict: dict) -> None:
        """As torch.optim.Optimizer.load_state_dict, but a frame's moments keep their float32 /
        float64 dtype (the base class would cast them to a bfloat16 parameter's dtype, losing the
        exact resume) and their values bit for bit; a step count saved as one int (by an earlier
        version) becomes one count per frame; the frames of a group with the same shape, dtype and
        device get their state in one buffer each (a batched step then reads and writes it in
        place). Ordinary tensors are restored as torch.optim.AdamW restores them. Every frame that
        has values is checked to be on St(d, r) (a parameter built on the meta device gets its first
        check here or at its first step)."""
        saved_groups = state_dict["param_groups"]
        saved_ids = chain.from_iterable(g["params"] for g in saved_groups)
        frame_params = chain.from_iterable(
            g["params"] if saved.get("manifold", "stiefel") == "stiefel" else [None] * len(g["params"])
            for g, saved in zip(self.param_groups, saved_groups)
        )
        id_to_param = {saved_id: p for saved_id, p in zip(saved_ids, frame_params) if p is not None}
        saved_state = state_dict["state"]
        # every frame and its saved state is checked before anything is loaded: a refused load leaves
        # the optimizer as it was, and names the parameter
        for group_index, (group, saved) in enumerate(zip(self.param_groups, saved_groups)):
            manifold = saved.get("manifold", "stiefel")
            if manifold != group.get("manifold", "stiefel"):
                raise ValueError(f"param group {group_index} is a {group.get('manifold', 'stiefel')!r} group, but the state_dict saved "
                                 f"a {manifold!r} group there: load a state_dict of an optimizer with the same groups")
            if manifold == "stiefel":
                for position, (p, saved_id) in enumerate(zip(group["params"], saved["params"])):
                    name = _parameter_name(group, position, group_index)
                    _check_frame(name, p)
                    if saved_id in saved_state:
                        _check_saved_frame_state(name, p, saved_state[saved_id])
        super().load_state_dict(state_dict)
        self._plan = None
        for group in self.param_groups:
            group["lr"], group["eps"] = _as_scalar(group["lr"]), _as_scalar(group["eps"])
        loaded = {}
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
            loaded[p] = None
        for group in self.param_groups:
            by_layout: dict = {}
            for p in group["params"]:
                if p in loaded and set(self.state[p]) >= set(FRAME_STATE):
                    by_layout.setdefault((tuple(p.shape[-2:]), p.dtype, p.device), []).append(p)
            for params in by_layout.values():
                _flatten_state(params, self.state)


# A torch lr scheduler replaces optimizer.step by a wrapper (defined in torch/optim/lr_scheduler.py,
# a module that torch.compile does not trace) that records the call in optimizer._opt_called, unless
# the step already carries this mark. StiefelAdam.step carries it and records its own calls, so that
# torch.compile(optimizer.step) is one graph without breaks whether the scheduler was made before or
# after it. The record is kept in a dict (self._calls): a dict's mutation survives a compiled step,
# an attribute assignment on the optimizer does not (torch 2.13 drops it).
_SCHEDULER_MARK = "_wrapped_by_lr_sched"
setattr(StiefelAdam.step, _SCHEDULER_MARK, True)


def _parameter_name(group: dict, position: int, group_index: int) -> str:
    """How messages name a parameter: its place, and its name where the optimizer was given named
    parameters ((name, tensor) pairs, which torch.optim keeps in the group's "param_names")."""
    place = f"params[{position}] of param group {group_index}"
    names = group.get("param_names")
    return f"{place} ({names[position]!r})" if names is not None and position < len(names) else place


def _group_settings(group: dict):
    """The bucket settings of a frame group (a tuple), None for an ordinary group."""
    return tuple(group[key] for key in BUCKET_SETTINGS) if group["manifold"] == "stiefel" else None


def _comparable(value):
    """A setting as a value that == compares without reading a tensor: a tensor by identity."""
    return ("tensor", id(value)) if torch.is_tensor(value) else value


def _settings_class(settings: list, index: int) -> int:
    """The first group with the same settings as group `index` (-1 for an ordinary group)."""
    if settings[index] is None:
        return -1
    mine = tuple(map(_comparable, settings[index]))
    return next(k for k in range(index + 1) if settings[k] is not None and tuple(map(_comparable, settings[k])) == mine)


def _parameters_signature(params: list) -> tuple:
    """What a bucket plan depends on, per parameter: identity, gradient layout, shape, dtype, device."""
    return tuple((id(p), None if p.grad is None else p.grad.layout, p.shape, p.dtype, p.device) for p in params)


def _off_manifold_message(name: str, p: torch.Tensor, index: int, deviation: float) -> str:
    d, r = p.shape[-2:]
    batch = tuple(p.shape[:-2])
    coordinates = _unravel(index, batch)
    frame = "its frame" if not batch else f"frame {coordinates[0] if len(batch) == 1 else coordinates} of its {batch} frames"
    return (
        f"{name}, {frame}: not on the Stiefel manifold St({d}, {r}): "
        f"||W^T W - I||_F = {deviation:.2e} > {manifold_tolerance(d, r, p.dtype):.2e} (the tolerance for {p.dtype}); "
        "no parameter or state was changed. It left the manifold after it was given to the optimizer (an in-place "
        "edit, a load of other weights, or a tensor never initialised): put it back with torch_impl.stiefel_project_ "
        "(the nearest frame) or torch_impl.stiefel_init_ (a new random frame), or, "
        f"{ORDINARY_WEIGHT_HINT}; pass skip_nonfinite=True to skip such frames and count them in off_manifold_steps"
    )


def _unravel(index: int, shape: tuple) -> tuple:
    coordinates = []
    for size in reversed(shape):
        index, coordinate = divmod(index, size)
        coordinates.append(coordinate)
    return tuple(reversed(coordinates))


# A bucket's key starts with these settings of its group (then (d, r), dtype and device)
BUCKET_SETTINGS = ("lr", "betas", "eps", "trust_radius", "weight_decay", "skip_nonfinite", "retraction_method")
_SKIP = BUCKET_SETTINGS.index("skip_nonfinite")
FRAME_STATE = ("step", "exp_avg", "exp_avg_sq")


def _frame_count(p: torch.Tensor) -> int:
    """Frames in a parameter of shape (..., d, r)."""
    return math.prod(p.shape[:-2])


class _BucketPlan:
    """The grouping of frame parameters into buckets, kept between steps while `signature` holds."""

    def __init__(self, signature: tuple, buckets: list):
        self.signature, self.buckets = signature, buckets


class _BucketLayout:
    """The joined tensors of one bucket, (B, d, r) frames and gradients, (B, d, r) moments m,
    (B,) second moments v and float64 counts t, and how to write the new values back.

    A tensor list whose members lie one after the other in one storage (a single contiguous
    tensor; the state of a bucket, which the optimizer allocates in one buffer; parameters the
    user allocated as slices of one tensor) is joined as a view of that storage, with no copy, and
    written back with one copy; other lists are joined with torch.cat and written back with one
    foreach copy. Under torch.compile the joins are always torch.cat (the compiler fuses them).
    A parameter without state contributes zeros here and gets its state at the write
    (`create_state`), so that a refused step leaves no state behind."""

    def __init__(self, params: list, states, compiling: bool):
        self.params = params
        d, r = params[0].shape[-2:]
        self.frames = [_frame_count(p) for p in params]
        self.values = [p.detach() for p in params]
        self.W, self.W_view = _join(self.values, (d, r), compiling)
        self.G, _ = _join([p.grad for p in params], (d, r), compiling)
        self.fresh = [p for p in params if len(states[p]) == 0]
        self.m_view = self.v_view = self.t_view = self.targets = None
        if len(self.fresh) == len(params):
            zeros = _zero_state(params[0], sum(self.frames))
            self.t, self.m, self.v = (zeros[key] for key in FRAME_STATE)
            return
        kinds = [[states[p][key] if len(states[p]) else _zero_state(p, _frame_count(p))[key] for p in params] for key in FRAME_STATE]
        self.t, self.t_view = _join(kinds[0], (), compiling)
        self.m, self.m_view = _join(kinds[1], (d, r), compiling)
        self.v, self.v_view = _join(kinds[2], (), compiling)
        if not self.fresh:
            self.targets = kinds

    def create_state(self, states) -> None:
        """State for the parameters without one: for a bucket that is all fresh, one buffer per
        kind whose slices are the parameters' state (the next join is then a view)."""
        if len(self.fresh) == len(self.params):
            for p, state in zip(self.params, _state_views(self.params, self.m, self.v, self.t)):
                states[p].update(state)
            self.t_view, self.m_view, self.v_view = self.t, self.m, self.v
        else:
            for p in self.fresh:
                zeros = _zero_state(p, _frame_count(p))
                states[p].update(_state_views([p], zeros["exp_avg"], zeros["exp_avg_sq"], zeros["step"])[0])
            self.t_view = self.m_view = self.v_view = None
        self.targets = [[states[p][key] for p in self.params] for key in FRAME_STATE]

    def write(self, W, m, v, t) -> None:
        _write_joined(W, self.W_view, self.values, self.frames)
        _write_joined(t, self.t_view, self.targets[0], self.frames)
        _write_joined(m, self.m_view, self.targets[1], self.frames)
        _write_joined(v, self.v_view, self.targets[2], self.frames)


def _zero_state(p: torch.Tensor, frames: int) -> dict:
    """Zero state of `frames` frames shaped like p's: counts (frames,) float64, m (frames, d, r)
    and v (frames,) in p's compute dtype."""
    work = compute_dtype(p.dtype)
    return {
        "step": torch.zeros(frames, dtype=torch.float64, device=p.device),
        "exp_avg": torch.zeros((frames,) + tuple(p.shape[-2:]), dtype=work, device=p.device),
        "exp_avg_sq": torch.zeros(frames, dtype=work, device=p.device),
    }


def _state_views(params: list, m: torch.Tensor, v: torch.Tensor, t: torch.Tensor) -> list:
    """Per parameter, its state as slices of the bucket's buffers m (B, d, r), v (B,), t (B,)."""
    states, start = [], 0
    for p in params:
        stop = start + _frame_count(p)
        states.append({"step": t[start:stop].view(p.shape[:-2]), "exp_avg": m[start:stop].view(p.shape),
                       "exp_avg_sq": v[start:stop].view(p.shape[:-2])})
        start = stop
    return states


def _flatten_state(params: list, states) -> None:
    """Move the state of params (one shape, dtype and device) into one buffer per kind."""
    joined = {key: torch.cat([states[p][key].reshape((-1,) + tuple(states[p][key].shape[len(p.shape) - 2:])) for p in params])
              for key in FRAME_STATE}
    for p, state in zip(params, _state_views(params, joined["exp_avg"], joined["exp_avg_sq"], joined["step"])):
        states[p].update(state)


def _join(tensors: list, tail: tuple, compiling: bool):
    """(joined, view): the tensors (each (..., *tail)) along one leading axis, and the same tensor
    when it is a view of their storage (so writing it writes them), else None."""
    if len(tensors) == 1 and (compiling or tensors[0].is_contiguous()):
        # (the tensor itself when it already has the joined shape: one dispatch less per kind)
        joined = tensors[0] if tensors[0].dim() == 1 + len(tail) else tensors[0].reshape((-1,) + tail)
        return joined, (joined if not compiling else None)
    if not compiling:
        view = _consecutive_view(tensors, tail)
        if view is not None:
            return view, view
    return torch.cat([x.reshape((-1,) + tail) for x in tensors]), None


def _consecutive_view(tensors: list, tail: tuple):
    """A (n, *tail) view spanning the tensors if they are contiguous, of one dtype, and lie one
    after the other in one storage; else None."""
    first = tensors[0]
    storage, offset, total = first.untyped_storage().data_ptr(), first.storage_offset(), 0
    for x in tensors:
        if (not x.is_contiguous() or x.dtype != first.dtype or x.untyped_storage().data_ptr() != storage
                or x.storage_offset() != offset + total):
            return None
        total += x.numel()
    size = math.prod(tail)
    return first.as_strided((total // size,) + tail, (size,) + tuple(math.prod(tail[k + 1:]) for k in range(len(tail))))


def _write_joined(new: torch.Tensor, view, targets: list, frames: list) -> None:
    if view is not None:
        view.copy_(new)
        return
    pieces, start = [], 0
    for target, count in zip(targets, frames):
        pieces.append(new[start : start + count].view(target.shape))
        start += count
    torch._foreach_copy_(targets, pieces)


class _BucketStep:
    """The result of one batched call: parameters (with names), their joined layout, the new frames,
    moments and counts (all frames of the bucket along the first axis) and which frames had a
    finite step (`finite`) and were on St(d, r) (`on_manifold`, with `deviation`, ||W^T W - I||_F)."""

    def __init__(self, members, layout, W, m, v, t, finite):
        self.members, self.layout = members, layout
        self.W, self.m, self.v, self.t, self.finite = W, m, v, t, finite
        self.on_manifold = self.deviation = self.stepped = None

    def keep_unless(self, accepted: torch.Tensor) -> None:
        """Every value back to what it was unless `accepted` (a 0-d bool on the device)."""
        layout = self.layout
        self.W = torch.where(accepted, self.W, layout.W)
        self.m = torch.where(accepted, self.m, layout.m)
        self.v = torch.where(accepted, self.v, layout.v)
        self.t = torch.where(accepted, self.t, layout.t)
