"""The controls of the claim `optimizer`: subclasses of torch_impl.StiefelAdam that each break one
piece of bookkeeping the way a real bug would (a helper of propositions/optimizer_class.py; it defines
no CLAIM). Each must fail one of the claim's checks by at least DETECTION_FACTOR."""

from __future__ import annotations

import math

from propositions.kit.source_edits import edited


def broken_classes() -> dict:
    """name -> StiefelAdam subclass (propositions.optimizer_class.CONTROLS describes each)."""
    import torch
    from torch_impl import StiefelAdam
    from torch_impl import optimizer as module

    settings_keys = module.BUCKET_SETTINGS

    class FirstGroupSettings(StiefelAdam):
        def _frame_buckets(self):
            first = self.param_groups[0]
            settings = tuple(first[key] for key in settings_keys)
            merged: dict = {}
            for key, members in super()._frame_buckets().items():
                merged.setdefault(settings[:5] + key[5:], []).extend(members)
            return merged

    class BucketIgnoresEps(StiefelAdam):
        def _frame_buckets(self):
            eps = settings_keys.index("eps")
            merged: dict = {}
            firsts: dict = {}
            for key, members in super()._frame_buckets().items():
                without = key[:eps] + key[eps + 1:]
                first = firsts.setdefault(without, key)  # the call is keyed without eps: the first group's eps wins
                merged.setdefault(first, []).extend(members)
            return merged

    class FiniteByVOnly(StiefelAdam):
        def _finite_steps(self, W_new, v_new):
            return torch.isfinite(v_new)

    class CountAdvancesOnSkip(StiefelAdam):
        def _step_bucket(self, settings, members):
            bucket = super()._step_bucket(settings, members)
            bucket.t = bucket.t + (~bucket.finite)
            return bucket

    class WholeTensorSkip(StiefelAdam):
        def _step_bucket(self, settings, members):
            bucket = super()._step_bucket(settings, members)
            start = 0
            for p, _ in members:
                stop = start + module._frame_count(p)
                if settings[5] and not bool(bucket.finite[start:stop].all()):
                    state = self.state[p]
                    bucket.W[start:stop] = p.detach().reshape(bucket.W[start:stop].shape)
                    if len(state):
                        bucket.m[start:stop] = state["exp_avg"].reshape(bucket.m[start:stop].shape)
                        bucket.v[start:stop] = state["exp_avg_sq"].reshape(-1)
                        bucket.t[start:stop] = state["step"].reshape(-1)
                start = stop
            return bucket

    class SkipStopsLaterFrames(StiefelAdam):
        def _step_bucket(self, settings, members):
            bucket = super()._step_bucket(settings, members)
            if settings[5]:
                # "finite so far": the first non-finite frame stops every frame after it in the call
                later = torch.cumprod(bucket.finite.to(torch.int64), 0).to(torch.bool)
                keep, layout = later[:, None, None], bucket.layout
                bucket.W = torch.where(keep, bucket.W, layout.W)
                bucket.m = torch.where(keep, bucket.m, layout.m)
                bucket.v = torch.where(later, bucket.v, layout.v)
                bucket.t = torch.where(later, bucket.t, layout.t)
            return bucket

    class StepsWithoutGradient(StiefelAdam):
        def _frame_buckets(self):
            for group in self.param_groups:
                if group["manifold"] == "stiefel":
                    for p in group["params"]:
                        if p.grad is None:
                            p.grad = torch.zeros_like(p)
            return super()._frame_buckets()

    class LoadDropsCounts(StiefelAdam):
        def load_state_dict(self, state_dict):
            super().load_state_dict(state_dict)
            for group in self.param_groups:
                if group.get("manifold", "stiefel") == "stiefel":
                    for p in group["params"]:
                        if "step" in self.state[p]:
                            self.state[p]["step"].zero_()

    class LoadCastsMoments(StiefelAdam):
        def load_state_dict(self, state_dict):
            torch.optim.Optimizer.load_state_dict(self, state_dict)

    class AddedGroupTakesDefaults(StiefelAdam):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            self._constructed = True

        def add_param_group(self, param_group):
            if getattr(self, "_constructed", False):
                param_group = {key: value for key, value in param_group.items() if key in ("params", "manifold")}
            super().add_param_group(param_group)

    class ClosureLossDropped(StiefelAdam):
        def step(self, closure=None):
            super().step(closure)
            return None

    class ClosureCalledTwice(StiefelAdam):
        def step(self, closure=None):
            if closure is not None:
                with torch.enable_grad():
                    closure()
            return super().step(closure)

    class CoupledDecayForOrdinary(StiefelAdam):
        def _step_euclidean(self, group, group_index):
            with torch.no_grad():
                for p in group["params"]:
                    if p.grad is not None:
                        p.grad.add_(p, alpha=group["weight_decay"])
            super()._step_euclidean({**group, "weight_decay": 0.0}, group_index)

    class EuclideanGroupSkipsWhole(StiefelAdam):
        def _step_euclidean(self, group, group_index):
            grads = [p.grad for p in group["params"] if p.grad is not None]
            if group["skip_nonfinite"] and grads and not all(bool(torch.isfinite(g).all()) for g in grads):
                for g in grads:  # one flag for the group: every tensor of it is skipped
                    g.fill_(float("nan"))
            super()._step_euclidean(group, group_index)

    class WritesBeforeRefusing(StiefelAdam):
        def _refuse_nonfinite(self, steps):
            for bucket in steps:
                self._write(bucket)
            super()._refuse_nonfinite(steps)

    class RefusalNamesFirstParameter(StiefelAdam):
        def _refuse_nonfinite(self, steps):
            try:
                super()._refuse_nonfinite(steps)
            except ValueError as error:
                message = str(error)
                raise ValueError("params[0] of param group 0" + message[message.index(":"):]) from None

    class CountsSteppedFrames(StiefelAdam):
        def _step_bucket(self, settings, members):
            bucket = super()._step_bucket(settings, members)
            if settings[5]:
                self._count_skipped(bucket.W.device, bucket.finite.sum() - 2 * (~bucket.finite).sum())
            return bucket

    class OverflowNotSkipped(StiefelAdam):
        def _step_bucket(self, settings, members):
            skip = settings[5]
            bucket = super()._step_bucket(settings[:5] + (False,) + settings[6:], members)
            # screened for NaN and inf in the gradient only, as a first port of the check would be
            finite = torch.isfinite(bucket.layout.G).all(dim=-1).all(dim=-1)
            if skip:
                keep, layout = finite[:, None, None], bucket.layout
                bucket.W = torch.where(keep, bucket.W, layout.W)
                bucket.m = torch.where(keep, bucket.m, layout.m)
                bucket.v = torch.where(finite, bucket.v, layout.v)
                bucket.t = torch.where(finite, layout.t + 1, layout.t)
            bucket.finite = finite
            bucket.stepped = finite & bucket.on_manifold  # the error mode's decision too
            return bucket

    class CountInParameterDtype(StiefelAdam):
        def _write(self, bucket):
            super()._write(bucket)
            for p, _ in bucket.members:  # the count kept in the parameter's dtype from its first step on
                state = self.state[p]
                if state["step"].dtype != p.dtype:
                    state["step"] = state["step"].to(p.dtype)

    class ForeignOptionsUncheckedInGroups(StiefelAdam):
        def add_param_group(self, param_group):
            foreign = {key: param_group[key] for key in module.FOREIGN_OPTIONS if key in param_group}
            super().add_param_group({key: value for key, value in param_group.items() if key not in foreign})
            self.param_groups[-1].update(foreign)  # kept, and ignored

    class LaterGroupsUnchecked(StiefelAdam):
        def add_param_group(self, param_group):
            if self.param_groups:  # only the first group is checked
                torch.optim.Optimizer.add_param_group(self, param_group)
                return
            super().add_param_group(param_group)

    class EuclideanGroupsUnchecked(StiefelAdam):
        def add_param_group(self, param_group):
            if param_group.get("manifold") == "euclidean":  # settings checked for frame groups only
                torch.optim.Optimizer.add_param_group(self, param_group)
                self.param_groups[-1]["betas"] = tuple(self.param_groups[-1]["betas"])
                return
            super().add_param_group(param_group)

    class OrdinaryCountAdvancesOnSkip(StiefelAdam):
        def _step_euclidean(self, group, group_index):
            nonfinite = [p for p in group["params"] if p.grad is not None and not bool(torch.isfinite(p.grad).all())]
            super()._step_euclidean(group, group_index)
            for p in nonfinite:
                self.state[p]["step"].add_(1)

    class TensorLrInParameterDtype(StiefelAdam):
        # a 0-d tensor lr rounded to the parameter's dtype before the product (a float lr is not)
        def step(self, closure=None):
            saved = [(group, group["lr"]) for group in self.param_groups if torch.is_tensor(group["lr"]) and group["params"]]
            for group, lr in saved:
                group["lr"] = lr.to(group["params"][0].dtype)
            try:
                return super().step(closure)
            finally:
                for group, lr in saved:
                    group["lr"] = lr

    class ParametersLeftOut(StiefelAdam):
        # the parameters `left_out` says, left out of the step without a word
        def left_out(self, group, p) -> bool:
            raise NotImplementedError

        def step(self, closure=None):
            saved = [(group, group["params"]) for group in self.param_groups]
            for group, params in saved:
                group["params"] = [p for p in params if not self.left_out(group, p)]
            try:
                return super().step(closure)
            finally:
                for group, params in saved:
                    group["params"] = params

    class MetaSkippedWithoutGradient(ParametersLeftOut):
        # a parameter on the meta device without a gradient
        def left_out(self, group, p) -> bool:
            return p.device.type == "meta" and p.grad is None

    class MetaRefusedInFrameGroupsOnly(ParametersLeftOut):
        # a parameter on the meta device in a manifold="euclidean" group
        def left_out(self, group, p) -> bool:
            return group.get("manifold") == "euclidean" and p.device.type == "meta"

    class StepReturnsEmptyString(StiefelAdam):
        # step() without a closure returns "" (a loss accumulator's start value) instead of None
        def step(self, closure=None):
            loss = super().step(closure)
            return "" if closure is None else loss

    class ZeroGradKeepsZeros(StiefelAdam):
        # zero_grad() fills the gradients with zeros (set_to_none=False) unless asked: the next step moves frames
        def zero_grad(self, set_to_none: bool = False) -> None:
            super().zero_grad(set_to_none=set_to_none)

    return {
        "meta_refused_in_frame_groups_only": MetaRefusedInFrameGroupsOnly,
        "zero_grad_keeps_zeros": ZeroGradKeepsZeros,
        "step_returns_empty_string": StepReturnsEmptyString,
        "tensor_lr_in_parameter_dtype": TensorLrInParameterDtype,
        "meta_skipped_without_gradient": MetaSkippedWithoutGradient,
        "first_group_settings": FirstGroupSettings,
        "bucket_ignores_eps": BucketIgnoresEps,
        "count_advances_on_skip": CountAdvancesOnSkip,
        "finite_by_v_only": FiniteByVOnly,
        "whole_tensor_skip": WholeTensorSkip,
        "skip_stops_later_frames": SkipStopsLaterFrames,
        "steps_without_gradient": StepsWithoutGradient,
        "load_drops_counts": LoadDropsCounts,
        "load_casts_moments": LoadCastsMoments,
        "added_group_takes_defaults": AddedGroupTakesDefaults,
        "closure_loss_dropped": ClosureLossDropped,
        "closure_called_twice": ClosureCalledTwice,
        "coupled_decay_for_ordinary": CoupledDecayForOrdinary,
        "euclidean_group_skips_whole": EuclideanGroupSkipsWhole,
        "writes_before_refusing": WritesBeforeRefusing,
        "refusal_names_first_parameter": RefusalNamesFirstParameter,
        "skipped_count_of_stepped": CountsSteppedFrames,
        "overflow_not_skipped": OverflowNotSkipped,
        "count_in_parameter_dtype": CountInParameterDtype,
        "foreign_options_unchecked_in_groups": ForeignOptionsUncheckedInGroups,
        "later_groups_unchecked": LaterGroupsUnchecked,
        "euclidean_groups_unchecked": EuclideanGroupsUnchecked,
        "ordinary_count_advances_on_skip": OrdinaryCountAdvancesOnSkip,
        **{name: edited("torch_impl.optimizer", before, after, "StiefelAdam") for name, (before, after) in SOURCE_EDITS.items()},
    }


# The clip sentinel's distance from a correct clip, in units of the clip check's bound: three times
# the detection factor, so that the bound loosened by ten lets it escape (margin 3 < 10).
CLIP_SENTINEL = 30.0


# Bugs inside a method or a module-level helper of torch_impl/optimizer.py, which no subclass can
# plant: name -> (the text of the source, the text written in its place) (kit/source_edits.py)
SOURCE_EDITS = {
    # a fresh state's counts made on torch's default device, not the parameter's
    "counts_on_default_device": (
        '"step": torch.zeros(frames, dtype=torch.float64, device=p.device),',
        '"step": torch.zeros(frames, dtype=torch.float64),'),
    # an ordinary tensor's AdamW first moment made on torch's default device, not the parameter's
    "ordinary_moment_on_default_device": (
        'state["exp_avg"] = torch.zeros_like(p, memory_format=torch.preserve_format)',
        'state["exp_avg"] = torch.zeros(p.shape, dtype=p.dtype)'),
    # a foreign option compared with the value that asks for nothing by identity only: amsgrad=0 refused
    "benign_option_by_identity": (
        "value is off or (off is not None and value == off)",
        "value is off"),
    # a stored exp_avg_sq that is not finite left out of the causes a refusal names: it says the step overflowed
    "corrupted_second_moment_unnamed": (
        '        for key in ("exp_avg", "exp_avg_sq"):\n            value = state.get(key)',
        '        for key in ("exp_avg",):\n            value = state.get(key)'),
    # the older format's int count loaded as it is, where a float64 tensor per frame is expected
    "old_count_loaded_as_is": (
        "                    count = value if torch.is_tensor(value) else torch.tensor(float(value))\n"
        "                    state[key] = count.to(device=p.device, dtype=torch.float64, copy=True).expand(p.shape[:-2]).clone()\n",
        "                    state[key] = value if not torch.is_tensor(value) else value.to(device=p.device, dtype=torch.float64, copy=True)\n"),
    # `break` for `continue`: a tensor without a gradient ends its euclidean group's loop
    "euclidean_group_stops_at_no_grad": (
        "            if p.grad is None:\n                continue\n            if p.grad.is_sparse:\n",
        "            if p.grad is None:\n                break\n            if p.grad.is_sparse:\n"),
    # the cached bucket plan keyed by the number of groups, not by which groups have equal settings: a
    # per-group scheduler that splits two joined groups leaves them stepped with one group's settings
    "bucket_plan_ignores_settings_classes": (
        "        signature = (tuple(classes), tuple(_parameters_signature(group[\"params\"]) for group in groups))\n",
        "        signature = (len(groups), tuple(_parameters_signature(group[\"params\"]) for group in groups))\n"),
    # the no-copy join of states in one buffer without its offset test: a parameter without a
    # gradient between two that have one gives them the wrong slices
    "joined_view_ignores_gap": (
        "                or x.storage_offset() != offset + total):",
        "                ):"),
    # the group's retraction_method not passed to the kernel: every group retracts by the "auto" route
    "retraction_method_ignored": (
        "            retraction_method=method, sync_free=skip or compiling,\n",
        "            sync_free=skip or compiling,\n"),
    # the storage term of the manifold tolerance divided by sqrt(r) instead of multiplied: frames within the
    # documented tolerance are refused (skipped) where the storage rounding dominates it (bfloat16, r > 1)
    "tolerance_storage_term_over_sqrt_r": (
        "+ 4.0 * math.sqrt(r) * unit_roundoff(dtype)",
        "+ 4.0 / math.sqrt(r) * unit_roundoff(dtype)"),
    # a checkpoint written before skip_nonfinite existed loads with skipping on: its non-finite steps are skipped, not refused
    "older_checkpoint_skips": (
        'group.setdefault("skip_nonfinite", False)',
        'group.setdefault("skip_nonfinite", True)'),
    # load_state_dict names a frame without its position: loading into an optimizer built from named parameters raises
    "named_load_without_position": (
        "name = _parameter_name(group, position, group_index)",
        "name = _parameter_name(group, None, group_index)"),
    # refusals give a parameter's place only, not the name it was given
    "refusal_without_name": (
        'names = group.get("param_names")',
        "names = None"),
}

SOURCE_EDITS.update({
    # an unpickled optimizer (torch.save, copy.deepcopy) without the record of its step calls
    "unpickled_without_call_record": ('"_refused": {}, "_calls": {},', '"_refused": {},'),
    # step() no longer records that it ran (a torch lr scheduler reads it as _opt_called)
    "step_not_marked_for_scheduler": ('self._calls["step"] = True', 'self._calls["step"] = False'),
    # a group's retraction route not resolved when it is added: Newton-Schulz beyond its basin goes unrefused
    "basin_unchecked_in_groups": ('        resolve_retraction(group["retraction_method"], group["trust_radius"])\n', ''),
    # user keys refused in groups added later (torch.optim keeps them)
    "user_keys_refused_in_added_groups": ('_check_foreign_options(param_group, f"param group {index}", unknown_ok=True)',
                                          '_check_foreign_options(param_group, f"param group {index}", unknown_ok=len(self.param_groups) == 0)'),
    # a non-finite lr set after the constructor is not named as the cause of the refused step
    "nonfinite_lr_unnamed": ('for key in ("lr", "eps", "weight_decay", "trust_radius"):', 'for key in ("eps", "weight_decay", "trust_radius"):'),
    # the shapes of a saved frame state not checked: another optimizer's state is loaded as it is
    "foreign_state_loaded": ("if not torch.is_tensor(value) or tuple(value.shape) != shape:", "if not torch.is_tensor(value):"),
    # load_state_dict checks only frames with saved state
    "load_checks_stepped_frames_only": ("                    _check_frame(name, p)\n                    if saved_id in saved_state:\n"
                                        "                        _check_saved_frame_state(name, p, saved_state[saved_id])\n",
                                        "                    if saved_id in saved_state:\n                        _check_frame(name, p)\n"
                                        "                        _check_saved_frame_state(name, p, saved_state[saved_id])\n"),
    # the bucket key without the dtype: frames of one shape in different dtypes share one call
    "buckets_ignore_dtype": ("key = (classes[group_index], tuple(p.shape[-2:]), p.dtype, p.device)",
                             "key = (classes[group_index], tuple(p.shape[-2:]), p.device)"),
    # a frame off the manifold with a non-finite step counted as skipped too
    "off_manifold_also_skipped": ("skipped = (bucket.on_manifold & ~bucket.finite).sum()", "skipped = (~bucket.finite).sum()"),
    # the batch of an off-manifold refusal read as the first two axes: a (B, d, r) parameter's frame named by (b, i) of (B, d)
    "off_manifold_message_batch_of_two_axes": ("batch = tuple(p.shape[:-2])", "batch = tuple(p.shape[:2])"),
    # the largest deviation of a parameter with no frames taken as 1 (off the manifold) instead of 0
    "zero_frame_parameter_refused": ("worst = float(residual.max()) if residual.numel() else 0.0",
                                     "worst = float(residual.max()) if residual.numel() else 1.0"),
})

# Bugs inside torch_impl/clipping.py: name -> (the text of the source, the text written in its place)
CLIP_EDITS = {
    # the total formed and returned in the gradients' own dtype: bfloat16 gradients alone give a bfloat16 total
    "clip_total_in_gradient_dtype": (
        "dtype = torch.float64 if any(g.dtype == torch.float64 for g in grads) else torch.float32",
        "dtype = None"),
    # no gradient at all: the total returned as 1 instead of the documented 0
    "clip_total_of_nothing_is_one": ("return torch.tensor(0.0)", "return torch.tensor(1.0)"),
    # a param group whose "params" is one tensor read row by row: rows have no .grad, so the group is neither counted nor clipped
    "clip_group_tensor_by_rows": (
        "members = [members] if isinstance(members, torch.Tensor) else list(members)",
        "members = list(members)"),
}


# Bugs inside torch_impl/functional.py's documented rules: name -> (the text of the source, the text written in its
# place); the subject's `functional` becomes the edited copy of the module
FUNCTIONAL_EDITS = {
    # Delta^3 for Delta^2 in kappa: the drift bound a few per cent smaller than its docstring derives
    "drift_bound_kappa_cubed": ("kappa = math.sqrt(1.0 + trust_radius**2)", "kappa = math.sqrt(1.0 + trust_radius**3)"),
    # ||Sigma||^2 of a typical gradient taken as 2 r (r + 1): the route test made for fewer shapes than documented
    "route_rule_sigma_four_times": ("gradient_sq, sigma_sq, square_norm = d * r, r * (r + 1) / 2, r**1.5 / math.sqrt(2.0)",
                                    "gradient_sq, sigma_sq, square_norm = d * r, r * (r + 1) * 2, r**1.5 / math.sqrt(2.0)"),
    # the Newton-Schulz count from the upper end's deviation measured from 2, not 1
    "newton_schulz_count_from_two": ("deviations = [1.0 - low / scale, high / scale - 1.0]",
                                     "deviations = [1.0 - low / scale, high / scale - 2.0]"),
}


def _quiet(function):
    """function with its warnings silenced: a control's bug (a tensor's rows read for their .grad) must not
    print torch's warning about it into the certificate run's output."""
    import functools
    import warnings

    @functools.wraps(function)
    def quiet(*args, **kwargs):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return function(*args, **kwargs)

    return quiet


def broken_functions() -> dict:
    """name -> (the Subject field it replaces, a public function written wrong)."""
    import torch
    import torch_impl
    from torch_impl import clipping
    from torch_impl import functional as functional_module

    def clip_counts_inf_units(parameters, max_norm, norm_type=2.0):
        # units screened for NaN only: an inf norm enters the total
        grads, frames = clipping._gradients(parameters)
        norms = [clipping._unit_norms(g, norm_type, f) for g, f in zip(grads, frames)]
        counted = [~torch.isnan(norm) for norm in norms]
        total = torch.linalg.vector_norm(torch.cat([torch.where(ok, n, 0.0).reshape(-1).double() for n, ok in zip(norms, counted)]), norm_type)
        coefficient = torch.clamp(max_norm / (total + 1e-6), max=1.0)
        for g, ok, f in zip(grads, counted, frames):
            factor = torch.where(ok, coefficient, 1.0).to(g.dtype)
            g.mul_(factor[..., None, None] if f else factor)
        return total

    def clip_groups_default_to_frames(parameters, max_norm, norm_type=2.0):
        # a group without the key taken for a frame group
        items = [dict(item, manifold=item.get("manifold", "stiefel")) if isinstance(item, dict) else item for item in parameters]
        return torch_impl.clip_grad_norm_finite_(items, max_norm, norm_type)

    def init_ignores_generator(tensor, generator=None):
        return torch_impl.stiefel_init_(tensor)

    def init_takes_wide(tensor, generator=None):
        # no shape test for r > d: a wide tensor is filled with orthonormal rows
        if tensor.dim() >= 2 and tensor.shape[-1] > tensor.shape[-2]:
            gaussian = torch.randn(tensor.shape, dtype=torch.float64, generator=generator)
            U, _, Vh = torch.linalg.svd(gaussian, full_matrices=False)
            return tensor.copy_((U @ Vh).to(tensor.dtype))
        return torch_impl.stiefel_init_(tensor, generator)

    def project_refusal_unnamed(tensor):
        # the shape refused with a message that does not say which argument is wrong
        if tensor.dim() < 2:
            raise ValueError(f"expected at least 2 dims, got shape {tuple(tensor.shape)}")
        return torch_impl.stiefel_project_(tensor)

    @torch.no_grad()
    def project_by_qr(tensor):
        Q, R = torch.linalg.qr(tensor.detach().to(torch.float64))
        signs = torch.where(torch.diagonal(R, dim1=-2, dim2=-1) < 0, -1.0, 1.0).to(torch.float64)
        tensor.copy_((Q * signs[..., None, :]).to(tensor.dtype))
        return tensor

    def untransported(W, m):
        return m

    real_clip = clipping.clip_grad_norm_finite_
    real_kernel = functional_module.stiefel_adam_step

    def kernel_default_beta1(W, G, m, v, t, lr=1e-3, beta1=0.95, *args, **kwargs):
        # the documented default beta1 is 0.9
        return real_kernel(W, G, m, v, t, lr, beta1, *args, **kwargs)

    def clip_norm_type_lost_when_masking(parameters, max_norm, norm_type=2.0):
        # the masked path (some unit not finite) forms its total with the 2-norm, whatever norm_type asks
        parameters = list(parameters) if not isinstance(parameters, (torch.Tensor, dict)) else [parameters]
        grads, frames = clipping._gradients(parameters)
        masked = not all(bool(torch.isfinite(clipping._unit_norms(g, norm_type, f)).all()) for g, f in zip(grads, frames))
        return real_clip(parameters, max_norm, 2.0 if masked else norm_type)

    def clip_ignores_norm_type(parameters, max_norm, norm_type=2.0):
        # the total always the 2-norm, whatever norm_type asks
        return torch_impl.clip_grad_norm_finite_(parameters, max_norm, 2.0)

    from torch_impl import functional

    def gradient_norm_squared_without_sharper_test(W, G_decayed, WtG, drift, sync_free=False):
        # the sync-free route without the sharper test: more frames take the explicit g than on the default route
        if not sync_free:
            return real_gradient_norm_squared(W, G_decayed, WtG, drift, sync_free)
        d, r = W.shape[-2], W.shape[-1]
        drift_per_u = drift / functional.unit_roundoff(W.dtype)
        sigma = functional._sym(WtG)
        if not functional.gram_identity_worth_testing(d, r, drift_per_u):
            return torch.linalg.vector_norm(torch.baddbmm(G_decayed, W, sigma, alpha=-1.0), dim=(-2, -1)).square()
        gradient_norm = torch.linalg.vector_norm(G_decayed, dim=(-2, -1))
        sigma_norm = torch.linalg.vector_norm(sigma, dim=(-2, -1))
        gradient_sq, sigma_sq = gradient_norm.square(), sigma_norm.square()
        identity = gradient_sq - sigma_sq
        rounding = (d * r + 3) * gradient_sq + 2 * (d + 2) * math.sqrt(r) * sigma_norm * gradient_norm + (r * r + 3) * sigma_sq + identity.abs()
        explicit_error = d * r * identity + 2 * (d + r + 2) * math.sqrt(r) * identity.clamp(min=0).sqrt() * gradient_norm
        identity_ok = rounding + drift_per_u * sigma_sq <= explicit_error
        g = torch.baddbmm(G_decayed, W, sigma, alpha=-1.0)
        return torch.where(identity_ok, identity, torch.linalg.vector_norm(g, dim=(-2, -1)).square())

    real_gradient_norm_squared = functional.gradient_norm_squared

    def sync_free_without_sharper_test(*args, **kwargs):
        functional.gradient_norm_squared = gradient_norm_squared_without_sharper_test
        try:
            return functional.stiefel_adam_step(*args, **kwargs)
        finally:
            functional.gradient_norm_squared = real_gradient_norm_squared

    def clip_beyond_its_bound(parameters, max_norm, norm_type=2.0):
        # a bound sentinel: the real clip, then every finite unit it scaled moved by CLIP_SENTINEL times
        # the clip check's own bound (kit.step_analysis.clip_bound at the check's arguments): caught by
        # that factor over DETECTION_FACTOR, it escapes once the check's bound is loosened by ten
        from propositions.kit.step_analysis import clip_bound

        grads, frames = clipping._gradients(parameters)
        units = [g.detach().reshape(-1, g.shape[-2] * g.shape[-1]) if f else g.detach().reshape(1, -1) for g, f in zip(grads, frames)]
        finite = [torch.isfinite(u).all(dim=1) for u in units]
        before = [g.detach().clone() for g in grads]
        total = clipping.clip_grad_norm_finite_(parameters, max_norm, norm_type)
        grads, _ = clipping._gradients(parameters)  # the gradients as the clip left them
        entries, count = max((u.shape[1] for u in units), default=1), sum(int(f.sum()) for f in finite)
        for g, b, unit_finite in zip(grads, before, finite):
            if torch.equal(g, b):  # not clipped (c = 1): untouched, as the check wants it exactly
                continue
            delta = CLIP_SENTINEL * clip_bound(entries, count, str(g.dtype).replace("torch.", ""))
            one = torch.ones(unit_finite.shape, dtype=torch.float64, device=g.device)
            scale = torch.where(unit_finite, one + delta, one)  # in float64: 1 + delta rounds to 1 in float32
            g.copy_((g.to(torch.float64).reshape(unit_finite.shape[0], -1) * scale[:, None]).reshape(g.shape).to(g.dtype))
        return total

    import types

    return {
        **{name: ("clip", _quiet(edited("torch_impl.clipping", before, after, "clip_grad_norm_finite_"))) for name, (before, after) in CLIP_EDITS.items()},
        **{name: ("functional", types.SimpleNamespace(**edited("torch_impl.functional", before, after, "__dict__")))
           for name, (before, after) in FUNCTIONAL_EDITS.items()},
        "clip_beyond_its_bound": ("clip", clip_beyond_its_bound),
        "clip_ignores_norm_type": ("clip", clip_ignores_norm_type),
        "clip_norm_type_lost_when_masking": ("clip", clip_norm_type_lost_when_masking),
        "kernel_default_beta1": ("kernel", kernel_default_beta1),
        "sync_free_without_sharper_test": ("kernel", sync_free_without_sharper_test),
        "untransported_moment_reported": ("transported_moment", untransported),
        "clip_counts_inf_units": ("clip", clip_counts_inf_units),
        "clip_groups_default_to_frames": ("clip", clip_groups_default_to_frames),
        "init_ignores_generator": ("init", init_ignores_generator),
        "init_takes_wide": ("init", init_takes_wide),
        "project_by_qr": ("project", project_by_qr),
        "project_refusal_unnamed": ("project", project_refusal_unnamed),
    }
