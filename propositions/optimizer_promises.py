"""Promises of torch_impl that its documentation states bit for bit, or against torch: each checked at
the strength it is stated, on the sibling runs that the documentation says agree (a part of the
optimizer claim, propositions/optimizer_class.py).

  lr_tensor_bit_for_bit     docs/algorithm.md, functional.step_coefficient: "A tensor gives the step of
                            the number of the same value bit for bit". Two StiefelAdam instances on the
                            same frames and gradients, one with lr (and eps) floats, the other with 0-d
                            tensors of the same values, in every parameter dtype and every tensor dtype
                            (float64, float32, bfloat16; the float is the tensor's value), three steps:
                            every parameter and state bit for bit (ulps, bound 0.5).
  sync_free_bit_for_bit     functional.stiefel_adam_step: "sync_free=True ... the values are the same bit
                            for bit". The kernel with and without sync_free, in every dtype, at every
                            shape class (square, column, tall) and at shapes where the route test of
                            gradient_norm_squared runs, on gradients from mostly tangent to mostly normal
                            (so that the identity, its sharper test and the explicit route are each
                            taken): W, m and v bit for bit.
  clip_matches_torch        clipping.clip_grad_norm_finite_: "the total that torch.nn.utils.clip_grad_norm_
                            computes when every unit is finite (up to the order of the reduction)". Both
                            on copies of the same finite gradients, as tensors, as a frame group (units the
                            (d, r) slices) and as one group per tensor ({"params": tensor}), for norm_type 1, 2,
                            3 and inf and the dtype mixes float64, float32, bfloat16, float32 + bfloat16,
                            float64 + float32: the totals within their rounding (below) and every clipped
                            gradient within it too.
  clip_total_dtype          clipping.clip_grad_norm_finite_: "Returns the total, a 0-d tensor (float64 if any
                            gradient is float64, else float32)": the dtype and shape of the total each
                            clip_matches_torch call returned (bfloat16 gradients alone included).
  class_is_kernel           torch_impl/optimizer.py: a frame group's parameter is "stepped by
                            torch_impl.functional.stiefel_adam_step" with its group's settings and the state the
                            module docstring lays out. The class against the kernel called with the same
                            settings on the same frames, gradients and documented state, in every dtype, every
                            retraction_method and with and without skip_nonfinite, three steps: W, m, v and the
                            counts bit for bit.
  tolerance_decides         docs/algorithm.md: a frame is stepped when its ||W^T W - I||_F is at most
                            manifold_tolerance(d, r, dtype) = 32 d r u_c + 4 sqrt(r) u_s, else not (skipped and
                            counted under skip_nonfinite). Frames W = Q (I + D)^(1/2), ||D||_F set to 0.5 to
                            2 times that formula (u from the IEEE formats, not from the code), rounded to the
                            storage dtype; each frame's defect measured on its stored values in float64 decides
                            whether it must be stepped. The check's own evaluation errs by at most
                            (d r + r) u_c (functional.frame_deviation), under 0.07 of the tolerance for d >= 2,
                            so a frame within a tenth of the tolerance of it decides nothing and is not
                            counted.
  named_parameters          README.md: a refusal names the parameter "by its place ("params[1] of param group 0")
                            and, when the optimizer was given `(name, tensor)` pairs ..., by its name too"; and
                            a checkpoint of an optimizer built from named parameters loads into another built so,
                            every state value bit for bit.
  older_checkpoint_defaults torch_impl/optimizer.py, StiefelAdam.load_state_dict: a checkpoint of the older format
                            (groups without the keys manifold, skip_nonfinite and retraction_method, one int
                            count per parameter) loads with the settings that format's groups had (frames, no
                            skipping, the "auto" retraction): the settings, the state and a further step bit
                            for bit against the instance that saved it, and a non-finite step refused.
  documented_defaults       docs/algorithm.md's table of hyper-parameters and the docstrings' defaults: each public
                            call with its defaults against the same call with those values written out, and
                            retraction_method "auto" against the route it documents, bit for bit.
  pickle_round_trip         torch/optim's Optimizer pickles (torch.save(optimizer), copy.deepcopy): a deep copy
                            of a StiefelAdam that has stepped steps as the original, bit for bit.
  scheduler_sees_step       a torch lr scheduler made before the first step and stepped after each
                            optimizer.step() gives no warning that it stepped first, and sets its lr.
  mixed_dtypes              torch_impl/optimizer.py: parameters are joined into one batched call only when they
                            share (d, r), dtype and device: frames of one shape in three dtypes, in one group
                            or a group each, step as each does alone, bit for bit.
  counts_each_frame_once    torch_impl/optimizer.py: a frame off the manifold is counted in off_manifold_steps
                            only, even when its step is also not finite; a NaN step in skipped_steps.
  joined_states_with_gap    torch_impl/functional.py: "a frame's result must not depend on the other frames of its
                            batch": three parameters of one shape whose states share one buffer, the middle one
                            without a gradient at one step, against one optimizer per parameter, bit for bit.
  meta_parameter_refused    docs/algorithm.md: "a step over a parameter still on the meta device raises a
                            ValueError that says so, instead of training nothing": in a frame group and in a
                            manifold="euclidean" one, with and without a gradient, beside a parameter that
                            has values.
  zero_grad_sets_none       StiefelAdam.zero_grad: "As torch.optim.Optimizer.zero_grad": with no argument the
                            gradients become None, and the next step leaves the parameter untouched.

Bound of clip_matches_torch. Both sum the same N = sum of entries |x_i|^p terms in the accumulation
dtype of unit roundoff u (float32 for a float32 or bfloat16 gradient, float64 for float64), in two
orders (one (d, r) slice, or one tensor, at a time against torch's per-tensor norms), then the
total's p-norm over the units in the total's dtype (u_t); each sum errs relatively by at most gamma_N(u)
(Higham 4.3), the p-th root divides that by p and adds u_t, so the two totals differ relatively by
at most 2 (gamma_N(u) + 2 u_t). Two roundings more where the gradients are bfloat16: a unit's norm
is returned in its gradient's dtype, so where a unit is one slice of a bfloat16 tensor of several
frames, each side rounds a different norm to bfloat16 (ours the slice's, torch's the tensor's): 2 u_b
more (u_b = 2^-8; a p-norm of values each within u_b relative is within u_b relative); and where
every gradient is bfloat16 torch returns its total in bfloat16: u_b more. The inf-norm is a maximum
of the same entries: exact, so the totals must agree within half a unit roundoff of the total's dtype
(that is, bit for bit). A clipped gradient is the gradient times min(1, max_norm / (total + 1e-6)),
which moves relatively with the total, plus one rounding to the gradient's dtype on each side (2 u_g),
and where torch's total is bfloat16 its coefficient's division and sum round there twice (2 u_b).
"""

from __future__ import annotations

import math

import numpy as np

from propositions._common import NumericalCheck
from propositions.kit.common import ulps_apart

EXACT = "exact equality: max |x - y| / ulp(y) over the compared values, bound 0.5 (bit for bit)"
DTYPES = ("float64", "float32", "bfloat16")
NORM_TYPES = (1.0, 2.0, 3.0, math.inf)
DTYPE_MIXES = (("float64",), ("float32",), ("bfloat16",), ("float32", "bfloat16"), ("float64", "float32"))
# clip_grad_norm_finite_ on a list of tensors (each one unit), on a frame group (each (d, r) slice one unit) and on
# one frame group per tensor whose "params" is that tensor itself, not a list (a param group torch.optim accepts)
CLIP_FORMS = ("tensors", "frame_group", "tensor_groups")
# shape classes, and shapes where gradient_norm_squared runs its route test in float64 and float32
# (gram_identity_worth_testing: r small against d), checked by sync_free_bit_for_bit to be so
SYNC_SHAPES = ((4, 4), (6, 1), (9, 3), (16, 4), (64, 2), (32, 8))
SYNC_FRAMES = 24
UNIT = {"float64": 2.0**-53, "float32": 2.0**-24, "bfloat16": 2.0**-8}


def _checks() -> dict:
    return {
        "lr": NumericalCheck("promise/lr_tensor_bit_for_bit", "a float lr and eps against 0-d tensors of the same values, every parameter "
                             "and tensor dtype, three steps: every parameter and state, per parameter (ulps); and the kernel with an int "
                             "count against the float lr (ulps)", EXACT,
                             tightness_note="an exact equality: 0 by design"),
        "sync": NumericalCheck("promise/sync_free_bit_for_bit", "functional.stiefel_adam_step with sync_free=True against the default, every "
                               "dtype, shape class and route-testing shape: W, m, v (ulps)", EXACT,
                               tightness_note="an exact equality: 0 by design"),
        "clip": NumericalCheck("promise/clip_matches_torch", "clip_grad_norm_finite_ against torch.nn.utils.clip_grad_norm_ on copies of "
                               "the same finite gradients, norm_type 1, 2, 3, inf, five dtype mixes, three forms of param group: |total - total_torch| / "
                               "total and ||G - G_torch|| / ||G_torch|| per tensor", "2 (gamma_N(u) + 2 u_t) for the totals (the inf-norm exact: u_t / 2), "
                               "plus 2 u_b where a unit is one slice of a bfloat16 tensor of several frames and u_b where torch's total is "
                               "bfloat16; plus 2 u_g (and 2 u_b for torch's bfloat16 coefficient) for a clipped gradient (module docstring)"),
        "clip_dtype": NumericalCheck("promise/clip_total_dtype", "the total clip_grad_norm_finite_ returns in every call of "
                                     "clip_matches_torch: a 0-d tensor, float64 if any gradient is float64, else float32 (0; inf otherwise)",
                                     "exact: the documented dtype", tightness_note="an exact equality: 0 by design"),
        "kernel": NumericalCheck("promise/class_is_kernel", "StiefelAdam against functional.stiefel_adam_step called with its group's settings "
                                 "on the documented state, every dtype, retraction_method and skip_nonfinite, three steps: W, m, v, step "
                                 "per parameter (ulps)",
                                 EXACT, tightness_note="an exact equality: 0 by design"),
        "tolerance": NumericalCheck("promise/tolerance_decides", "frames with ||W^T W - I||_F from 0.5 to 2 times 32 d r u_c + 4 sqrt(r) u_s "
                                    "(measured on the stored values) under skip_nonfinite: stepped exactly when within it (0; inf otherwise)",
                                    "exact: the documented tolerance, frames within a tenth of it not counted (module docstring)",
                                    tightness_note="an exact equality: 0 by design"),
        "named_refusal": NumericalCheck("promise/named_refusal", "a refused step of an optimizer built from (name, tensor) pairs: a "
                                        "ValueError naming the parameter's place and its name (0; inf otherwise)", "exact: the documented refusal",
                                        tightness_note="an exact equality: 0 by design"),
        "named_checkpoint": NumericalCheck("promise/named_checkpoint", "state_dict of an optimizer built from (name, tensor) pairs loaded "
                                           "into another built so: every state value (ulps; inf if the load raises)", EXACT,
                                           tightness_note="an exact equality: 0 by design"),
        "older": NumericalCheck("promise/older_checkpoint_defaults", "a checkpoint in the older format (no manifold, skip_nonfinite or "
                                "retraction_method key, one int count per parameter) loaded into a fresh instance: its groups' settings "
                                "the documented defaults, its state and a further step bit for bit against the instance that saved it, and "
                                "a non-finite step then refused (ulps; inf otherwise)", EXACT, tightness_note="an exact equality: 0 by design"),
        "defaults": NumericalCheck("promise/documented_defaults", "StiefelAdam(params), stiefel_adam_step(W, G, m, v, t), polar_factor(A), "
                                   "polar_retract(W, xi) and clip_grad_norm_finite_(params, max_norm) against the same calls with the "
                                   "documented defaults written out (docs/algorithm.md's table, the docstrings); and the 'auto' route "
                                   "against the one it documents (Newton-Schulz for trust_radius <= 0.75, eigh above) (ulps)", EXACT,
                                   tightness_note="an exact equality: 0 by design"),
        "pickle": NumericalCheck("promise/pickle_round_trip", "copy.deepcopy of a StiefelAdam that has stepped and skipped a frame (torch.optim's "
                                 "pickling: __getstate__ / __setstate__): its counts, then both stepped on the same gradients: parameters and "
                                 "state (ulps; inf if the copy cannot step or its counts differ)", EXACT, tightness_note="an exact equality: 0 by design"),
        "scheduler": NumericalCheck("promise/scheduler_sees_step", "an lr scheduler made before the first step and stepped after each "
                                    "optimizer.step(): no warning that the scheduler stepped first, and the lr it set (0; inf otherwise)",
                                    "exact: torch.optim's scheduler contract", tightness_note="an exact equality: 0 by design"),
        "mixed": NumericalCheck("promise/mixed_dtypes", "one StiefelAdam over frames of one shape in float64, float32 and bfloat16 (one "
                                "group, and a group each) against one optimizer per parameter, three steps: every parameter and state "
                                "(ulps)", EXACT, tightness_note="an exact equality: 0 by design"),
        "counts": NumericalCheck("promise/counts_each_frame_once", "under skip_nonfinite, a frame off St(d, r) whose gradient is also NaN "
                                 "beside a frame with a NaN gradient only: skipped_steps and off_manifold_steps against 1 and 1, and "
                                 "neither frame written (0; inf otherwise)", "exact: the documented counts",
                                 tightness_note="an exact equality: 0 by design"),
        "gap": NumericalCheck("promise/joined_states_with_gap", "three parameters of one shape in one group, whose states the first step "
                              "puts in one buffer, stepped with the middle one's gradient None between steps with all three, against one "
                              "optimizer per parameter, in every dtype: every parameter and state (ulps)", EXACT,
                              tightness_note="an exact equality: 0 by design"),
        "meta": NumericalCheck("promise/meta_parameter_refused", "step() over a parameter on the meta device, in a frame group and in a "
                               "manifold='euclidean' group, with and without a gradient, beside one with values: a ValueError that names the "
                               "meta device (0; inf otherwise)", "exact: the documented refusal", tightness_note="an exact equality: 0 by design"),
        "route": NumericalCheck("promise/route_test_as_documented", "gram_identity_worth_testing and gradient_norm_squared (both "
                                "routes) probed 1e-10 of the test's terms below and above their own threshold of drift / u, computed in "
                                "50 digits from the terms their docstrings document, on nine shapes and on frames whose gradients go from "
                                "mostly tangent to mostly normal: the identity taken exactly where documented (0; inf otherwise)",
                                "exact: the documented rule, probed where the code's rounding cannot decide it otherwise (module constants)",
                                tightness_note="an exact equality: 0 by design"),
        "constants": NumericalCheck("promise/derived_constants", "frame_drift_bound against its docstring's formula (every dtype, "
                                    "trust_radius 0.25 to 1, relative difference), and newton_schulz_iterations against the fewest "
                                    "iterations of the exact quintic map from the documented interval (60 digits) and the counts "
                                    "docs/algorithm.md quotes (0; inf otherwise)", "32 u_64: the same dozen positive terms in another order "
                                    "(the counts exact)", tightness_note="an exact equality up to the order of a sum"),
        "edges": NumericalCheck("promise/edge_inputs", "clip_grad_norm_finite_ without any gradient (total 0 as torch's, nothing "
                                "touched), polar_retract of a step as long as the trust radius and of a batch of no frames, and stiefel_adam_step with int64 and "
                                "float32 counts against float64 ones, two steps, every dtype (ulps; inf if refused or different)", EXACT,
                                tightness_note="an exact equality: 0 by design"),
        "device": NumericalCheck("promise/state_on_parameter_device", "a run of every dtype and an ordinary tensor, both "
                                 "skip_nonfinite modes, a checkpoint loaded and stepped, stiefel_init_ and stiefel_project_, with torch's "
                                 "default device the meta device against the CPU, the parameters on the CPU: every value (ulps; inf if "
                                 "a run raises or a state tensor is not on its parameter's device)", EXACT,
                                 tightness_note="an exact equality: 0 by design"),
        "zero_grad": NumericalCheck("promise/zero_grad_sets_none", "zero_grad() with no argument leaves .grad None, and the next step leaves "
                                    "the parameter untouched (0; inf otherwise)", "exact: torch.optim.Optimizer.zero_grad's default",
                                    tightness_note="an exact equality: 0 by design"),
    }


def _frames(torch, shape, dtype, generator):
    import torch_impl

    return torch_impl.stiefel_init_(torch.empty(shape, dtype=torch.float64), generator=generator).to(dtype)


def lr_tensor_bit_for_bit(subject, check, seed: int) -> None:
    import torch

    for dtype_name in DTYPES:
        for tensor_dtype in DTYPES:
            generator = torch.Generator().manual_seed(seed)
            shapes = ((3, 5, 2), (4, 4), (6, 1))
            frames = [_frames(torch, shape, getattr(torch, dtype_name), generator) for shape in shapes]
            gradients = [[torch.randn(shape, generator=generator, dtype=torch.float64).to(getattr(torch, dtype_name)) for shape in shapes]
                         for _ in range(3)]
            # 2/15: not a number of bfloat16 or float32 (rounding it moves it by 1e-3 and 1e-8), and below the trust
            # radius's cap for these frames (lr sqrt(d r) < 0.5), where lr reaches the step
            lr = torch.tensor(2.0 / 15.0, dtype=getattr(torch, tensor_dtype))
            eps = torch.tensor(1e-8, dtype=getattr(torch, tensor_dtype))
            runs = []
            for as_tensor in (False, True):
                params = [torch.nn.Parameter(f.clone()) for f in frames]
                optimizer = subject.optimizer_class(params, lr=lr.clone() if as_tensor else float(lr), eps=eps.clone() if as_tensor else float(eps))
                for step in gradients:
                    for p, g in zip(params, step):
                        p.grad = g.clone()
                    optimizer.step()
                runs.append((params, optimizer))
            for shape, p, q in zip(shapes, runs[0][0], runs[1][0]):
                residual = _ulps(p, q)
                for key in ("exp_avg", "exp_avg_sq", "step"):
                    a, b = runs[0][1].state[p].get(key), runs[1][1].state[q].get(key)
                    residual = max(residual, _ulps(a, b) if a is not None and b is not None else math.inf)
                check.add([residual], 0.5, shape=shape[-2:], key=("promise", "lr", dtype_name, tensor_dtype), seed=seed,
                          extra={"parameter_dtype": dtype_name, "tensor_dtype": tensor_dtype, "shape": list(shape)})
            check.reach("steps", len(gradients))
            check.cover("dtypes", f"{dtype_name} parameter, {tensor_dtype} lr")
            # the kernel itself, with an int count (the class passes per-frame counts): a 0-d tensor lr against its float
            _kernel_lr_tensor(subject, check, seed, dtype_name, lr)


def _kernel_lr_tensor(subject, check, seed: int, dtype_name: str, lr) -> None:
    """functional.stiefel_adam_step with t an int (one count for every frame) and lr a 0-d tensor against
    the float of the same value, three steps: W, m, v bit for bit."""
    import torch

    dtype = getattr(torch, dtype_name)
    state_dtype = torch.float64 if dtype == torch.float64 else torch.float32
    generator = torch.Generator().manual_seed(seed)
    W = _frames(torch, (3, 6, 2), dtype, generator)
    gradients = [torch.randn(W.shape, generator=generator, dtype=torch.float64).to(dtype) for _ in range(3)]
    outputs = []
    for given in (float(lr), lr.clone()):
        Wk, mk, vk = W.clone(), torch.zeros(W.shape, dtype=state_dtype), torch.zeros(W.shape[:-2], dtype=state_dtype)
        for t, G in enumerate(gradients):
            Wk, mk, vk = subject.kernel(Wk, G, mk, vk, t, lr=given, trust_radius=0.5)
        outputs.append((Wk, mk, vk))
    residual = max(_ulps(a, b) for a, b in zip(*outputs))
    check.add([residual], 0.5, shape=(6, 2), key=("promise", "lr_kernel", dtype_name, str(lr.dtype)), seed=seed,
              extra={"parameter_dtype": dtype_name, "tensor_dtype": str(lr.dtype), "kernel": True, "count": "int"})


def _same_as(p, optimizer, q, expected) -> float:
    """ulps between parameter p, with its state in `optimizer`, and q with its state in `expected`: the
    values and every key of q's state (inf where p's state lacks one)."""
    state, wanted = optimizer.state[p], expected.state[q]
    return max(_ulps(p, q), *(_ulps(state[key], wanted[key]) if key in state else math.inf for key in wanted))


def _ulps(a, b) -> float:
    import torch

    x = a.detach().to(torch.float64).cpu().numpy().reshape(1, -1) if a.dim() else np.array([[float(a)]])
    y = b.detach().to(torch.float64).cpu().numpy().reshape(1, -1) if b.dim() else np.array([[float(b)]])
    if x.shape != y.shape:
        return math.inf
    both_nan = np.isnan(x) & np.isnan(y)
    return float(np.max(np.where(both_nan, 0.0, np.nan_to_num(ulps_apart(x[None], y[None]), nan=math.inf)))) if x.size else 0.0


def _mixed_gradients(torch, W, generator, frames: int):
    """Gradients from mostly tangent to mostly normal: G = P_W(A) + s W, s from 0.1 to 10 over the
    frames, so that the Gram identity, its sharper test (which helps where Sigma = sym(W^T G) has equal
    eigenvalues: ||Sigma^2||_F = ||Sigma||_F^2 / sqrt(r)) and the explicit route are each taken by some
    frame at the route-testing shapes (one frame in 24 takes the sharper test at (9, 3), (16, 4),
    (64, 2) and (32, 8) in float64 and float32)."""
    A = torch.randn(W.shape, generator=generator, dtype=torch.float64)
    Wd = W.to(torch.float64)
    tangent = A - Wd @ (0.5 * (Wd.mT @ A + A.mT @ Wd))
    s = torch.logspace(-1, 1, frames, dtype=torch.float64).reshape((frames, 1, 1))
    return (tangent + s * Wd).to(W.dtype)


def sync_free_bit_for_bit(subject, check, seed: int) -> None:
    import torch

    from torch_impl import functional

    for dtype_name in DTYPES:
        dtype = getattr(torch, dtype_name)
        state_dtype = torch.float64 if dtype == torch.float64 else torch.float32
        for d, r in SYNC_SHAPES:
            generator = torch.Generator().manual_seed(seed)
            frames = SYNC_FRAMES
            W = _frames(torch, (frames, d, r), dtype, generator)
            G = _mixed_gradients(torch, W, generator, frames)
            m = torch.zeros((frames, d, r), dtype=state_dtype)
            v = torch.zeros((frames,), dtype=state_dtype)
            outputs = []
            for sync_free in (False, True):
                Wk, mk, vk = W.clone(), m.clone(), v.clone()
                for t in range(3):
                    Wk, mk, vk = subject.kernel(Wk, G, mk, vk, t, lr=0.01, trust_radius=0.5, sync_free=sync_free)
                outputs.append((Wk, mk, vk))
            residual = max(_ulps(a, b) for a, b in zip(*outputs))
            check.add([residual], 0.5, shape=(d, r), key=("promise", "sync", dtype_name, d, r), seed=seed,
                      extra={"dtype": dtype_name, "shape": [d, r], "route_test_runs": bool(_route_test_runs(functional, d, r, dtype))})
            check.reach("frames", frames)
            check.cover("dtype", dtype_name)


def _route_test_runs(functional, d: int, r: int, dtype) -> bool:
    drift = functional.frame_drift_bound(d, r, dtype, 0.5, "auto")
    return functional.gram_identity_worth_testing(d, r, drift / functional.unit_roundoff(dtype))


def clip_matches_torch(subject, check, dtype_check, seed: int) -> None:
    import torch

    for mix, norm_type, form in ((m, n, f) for m in DTYPE_MIXES for n in NORM_TYPES for f in CLIP_FORMS):
        generator = torch.Generator().manual_seed(seed)
        # a frame group's units are its (d, r) slices; the norm of their p-norms is the p-norm of all entries, torch's total
        shapes = ((5,), (3, 4), (2, 3, 2), (7, 3)) if form == "tensors" else ((2, 5, 2), (4, 4), (3, 6, 1))
        dtypes = [getattr(torch, mix[i % len(mix)]) for i in range(len(shapes))]
        values = [(torch.randn(shape, generator=generator, dtype=torch.float64) * 3.0).to(dt) for shape, dt in zip(shapes, dtypes)]
        gradients = [(torch.randn(shape, generator=generator, dtype=torch.float64) * 4.0).to(dt) for shape, dt in zip(shapes, dtypes)]
        runs = []
        for clip in (subject.clip, torch.nn.utils.clip_grad_norm_):
            params = [torch.nn.Parameter(v.clone()) for v in values]
            for p, g in zip(params, gradients):
                p.grad = g.clone()
            given = params
            if clip is subject.clip and form == "frame_group":
                given = [{"params": params, "manifold": "stiefel"}]
            elif clip is subject.clip and form == "tensor_groups":
                given = [{"params": p, "manifold": "stiefel"} for p in params]
            total = clip(given, 1.0, norm_type=norm_type)
            runs.append((total, [p.grad.to(torch.float64).numpy().copy() for p in params]))
        (returned, grads), (returned_torch, grads_torch) = runs
        total, total_torch = float(returned), float(returned_torch)
        entries = sum(int(np.prod(shape)) for shape in shapes)
        u = max(UNIT["float32" if name != "float64" else "float64"] for name in mix)
        u_t = UNIT["float64" if "float64" in mix else "float32"]
        gamma = entries * u / (1 - entries * u)
        # bfloat16 unit norms rounded on each side to different values (a slice's against its tensor's), and torch's
        # total (and its coefficient) in bfloat16 where every gradient is (module docstring)
        sliced = form != "tensors" and any(dt == torch.bfloat16 and len(shape) > 2 and shape[0] > 1 for shape, dt in zip(shapes, dtypes))
        slice_term = 2.0 * UNIT["bfloat16"] if sliced else 0.0
        torch_term = UNIT["bfloat16"] if set(mix) == {"bfloat16"} else 0.0
        # the inf-norm is a maximum of the same entries: exact, so the totals are equal (half a unit roundoff of the total's dtype)
        total_bound = 0.5 * u_t if math.isinf(norm_type) else 2.0 * (gamma + 2.0 * u_t) + slice_term + torch_term
        relative = abs(total - total_torch) / total_torch if total_torch > 0 else abs(total)
        extra = {"dtypes": list(mix), "norm_type": norm_type, "form": form}
        check.add([relative], total_bound, key=("promise", "clip_total", mix, norm_type, form), seed=seed, extra={**extra, "compared": "total"})
        check.cover("dtype_mix", "+".join(mix))
        check.cover("norm_type", norm_type)
        check.cover("form", form)
        for g, g_torch, dt in zip(grads, grads_torch, dtypes):
            u_g = UNIT[str(dt).split(".")[-1]]
            scale = float(np.linalg.norm(g_torch)) or 1.0
            check.add([float(np.linalg.norm(g - g_torch)) / scale], total_bound + 2.0 * u_g + 2.0 * torch_term,
                      key=("promise", "clip_grad", mix, norm_type, form), seed=seed, extra={**extra, "compared": "gradient"})
        documented = torch.float64 if "float64" in mix else torch.float32
        right = torch.is_tensor(returned) and returned.dtype == documented and returned.dim() == 0
        dtype_check.add([0.0 if right else math.inf], 0.5, key=("promise", "clip_dtype", mix, norm_type, form), seed=seed,
                        extra={**extra, "documented": str(documented), "returned": str(getattr(returned, "dtype", type(returned).__name__))})
        dtype_check.cover("dtype_mix", "+".join(mix))


def class_is_kernel(subject, check, seed: int) -> None:
    """The class's step of a frame group against the kernel it is documented to call, with the group's
    settings, on the state laid out in torch_impl/optimizer.py's docstring (m and v zero in the state
    dtype, one float64 count per frame); one parameter per shape, so each is one batched call."""
    import torch

    settings = {"lr": 0.05, "betas": (0.9, 0.99), "eps": 1e-8, "trust_radius": 0.5, "weight_decay": 0.01}
    shapes = ((3, 5, 2), (4, 4), (2, 6, 1))
    for dtype_name in DTYPES:
        dtype = getattr(torch, dtype_name)
        state_dtype = torch.float64 if dtype == torch.float64 else torch.float32
        for method in ("auto", "newton_schulz", "eigh"):
            for skip in (False, True):
                generator = torch.Generator().manual_seed(seed)
                frames = [_frames(torch, shape, dtype, generator) for shape in shapes]
                steps = [[torch.randn(shape, generator=generator, dtype=torch.float64).to(dtype) for shape in shapes] for _ in range(3)]
                params = [torch.nn.Parameter(f.clone()) for f in frames]
                optimizer = subject.optimizer_class(params, retraction_method=method, skip_nonfinite=skip, **settings)
                expected = [[f.clone(), torch.zeros(f.shape, dtype=state_dtype), torch.zeros(f.shape[:-2], dtype=state_dtype),
                             torch.zeros(f.shape[:-2], dtype=torch.float64)] for f in frames]
                for gradients in steps:
                    for p, g in zip(params, gradients):
                        p.grad = g.clone()
                    optimizer.step()
                    for values, g in zip(expected, gradients):
                        W, m, v, t = values
                        values[:3] = subject.kernel(W, g, m, v, t, settings["lr"], *settings["betas"], settings["eps"],
                                                    settings["trust_radius"], settings["weight_decay"], retraction_method=method,
                                                    sync_free=skip)
                        values[3] = t + 1
                for shape, p, (W, m, v, t) in zip(shapes, params, expected):
                    state = optimizer.state[p]
                    residual = max(_ulps(p, W), *(_ulps(state[key], value) if key in state else math.inf
                                                  for key, value in (("exp_avg", m), ("exp_avg_sq", v), ("step", t))))
                    check.add([residual], 0.5, shape=shape[-2:], key=("promise", "kernel", dtype_name, method, skip), seed=seed,
                              extra={"dtype": dtype_name, "retraction_method": method, "skip_nonfinite": skip, "shape": list(shape)})
                check.reach("steps", len(steps))
                check.cover("retraction_method", method)
                check.cover("dtype", dtype_name)


TOLERANCE_FACTORS = (0.5, 0.7, 0.85, 1.15, 1.4, 2.0)
TOLERANCE_SHAPES = ((6, 1), (8, 4), (12, 3))
TOLERANCE_FRAMES = 4  # per factor
EVALUATION_SHARE = 0.1  # a tenth of the tolerance: above the check's own (d r + r) u_c, under 0.07 of it for d >= 2


def documented_tolerance(d: int, r: int, dtype_name: str) -> float:
    """32 d r u_c + 4 sqrt(r) u_s (docs/algorithm.md), u from the IEEE formats."""
    u_c = UNIT["float64" if dtype_name == "float64" else "float32"]
    return 32.0 * d * r * u_c + 4.0 * math.sqrt(r) * UNIT[dtype_name]


def tolerance_decides(subject, check, seed: int) -> None:
    import torch

    from propositions.kit.common import rng_for

    for dtype_name in DTYPES:
        dtype = getattr(torch, dtype_name)
        for d, r in TOLERANCE_SHAPES:
            rng = rng_for(seed, "optimizer", "tolerance", dtype_name, d, r)
            tol = documented_tolerance(d, r, dtype_name)
            count = len(TOLERANCE_FACTORS) * TOLERANCE_FRAMES
            Q = np.linalg.qr(rng.standard_normal((count, d, r)))[0]
            D = rng.standard_normal((count, r, r))
            D = D + np.swapaxes(D, -1, -2)
            factors = np.repeat(TOLERANCE_FACTORS, TOLERANCE_FRAMES)
            D *= (factors * tol / np.linalg.norm(D, axis=(-2, -1)))[:, None, None]
            lam, V = np.linalg.eigh(D)
            root = (V * np.sqrt(1.0 + lam)[:, None, :]) @ np.swapaxes(V, -1, -2)  # (I + D)^(1/2): (Q root)^T (Q root) = I + D
            stored = torch.tensor(Q @ root).to(dtype)
            values = stored.to(torch.float64).numpy()
            measured = np.linalg.norm(np.swapaxes(values, -1, -2) @ values - np.eye(r), axis=(-2, -1)) / tol
            decides = np.abs(measured - 1.0) > EVALUATION_SHARE
            p = torch.nn.Parameter(_frames(torch, (count, d, r), dtype, torch.Generator().manual_seed(seed)))
            optimizer = subject.optimizer_class([p], lr=0.01, skip_nonfinite=True)
            with torch.no_grad():
                p.copy_(stored)  # the frames changed after the optimizer was given them, as an edit or a load would
            p.grad = torch.randn(p.shape, generator=torch.Generator().manual_seed(seed), dtype=torch.float64).to(dtype)
            optimizer.step()
            count_after = optimizer.state[p].get("step") if p in optimizer.state else None
            stepped = (np.zeros(count) if count_after is None else count_after.to(torch.float64).numpy().reshape(count)) > 0
            wrong = decides & (stepped != (measured <= 1.0))
            check.add([math.inf if wrong.any() else 0.0], 0.5, shape=(d, r), key=("promise", "tolerance", dtype_name, d, r), seed=seed,
                      extra={"dtype": dtype_name, "deciding_frames": int(decides.sum()), "within": int((decides & (measured <= 1.0)).sum()),
                             "wrong_at_defect_over_tolerance": [round(float(x), 3) for x in measured[wrong]]})
            check.reach("defect_over_tolerance", measured[decides])
            check.cover("dtype", dtype_name)


def older_checkpoint_defaults(subject, check, seed: int) -> None:
    """A checkpoint of the older format, which its load_state_dict promises to read: what that format's
    groups did (frames, no skipping, the "auto" retraction) is what the loaded groups do."""
    import torch

    from .optimizer_scenarios import older_format

    generator = torch.Generator().manual_seed(seed)
    shapes = ((2, 5, 2), (4, 3))
    frames = [_frames(torch, shape, torch.float64, generator) for shape in shapes]
    steps = [[torch.randn(shape, generator=generator, dtype=torch.float64) for shape in shapes] for _ in range(3)]
    params = [torch.nn.Parameter(f.clone()) for f in frames]
    optimizer = subject.optimizer_class([{"params": [params[0]]}, {"params": [params[1]], "lr": 0.02}], lr=0.05)
    for gradients in steps[:2]:
        for p, g in zip(params, gradients):
            p.grad = g.clone()
        optimizer.step()
    older = older_format(optimizer.state_dict(), optimizer)
    fresh_params = [torch.nn.Parameter(p.detach().clone()) for p in params]
    fresh = subject.optimizer_class([{"params": [fresh_params[0]]}, {"params": [fresh_params[1]]}], lr=1e-3)
    residual, raised = 0.0, None
    try:
        fresh.load_state_dict(older)
        documented = {"manifold": "stiefel", "skip_nonfinite": False, "retraction_method": "auto"}
        if any(group.get(key) != value for group in fresh.param_groups for key, value in documented.items()):
            residual = math.inf
        for p, q, g in zip(params, fresh_params, steps[2]):
            p.grad, q.grad = g.clone(), g.clone()
        optimizer.step()
        fresh.step()
        residual = max(residual, *(_same_as(q, fresh, p, optimizer) for p, q in zip(params, fresh_params)))
        bad = torch.randn(shapes[0], generator=generator, dtype=torch.float64)
        bad[1, 0, 0] = math.nan
        fresh_params[0].grad = bad
        try:
            fresh.step()
            residual = math.inf  # the older format's groups did not skip: the step must be refused
        except ValueError:
            pass
    except Exception as caught:  # a valid older checkpoint that cannot be loaded or stepped fails the check
        residual, raised = math.inf, f"{type(caught).__name__}: {caught}"
    check.add([residual], 0.5, key=("promise", "older"), seed=seed, extra={"raised": raised})


# docs/algorithm.md's table of hyper-parameters (lr, betas, eps, trust_radius, weight_decay) and the
# docstrings' defaults (retraction_method "auto", manifold "stiefel", skip_nonfinite False; norm_type 2)
DOCUMENTED = {"lr": 1e-3, "betas": (0.9, 0.999), "eps": 1e-8, "trust_radius": 0.5, "weight_decay": 0.0}


def documented_defaults(subject, check, seed: int) -> None:
    """Each public call with its defaults against the same call with the documented values written out."""
    import torch

    from torch_impl import functional

    generator = torch.Generator().manual_seed(seed)
    W = _frames(torch, (3, 6, 2), torch.float64, generator)
    G = torch.randn(W.shape, generator=generator, dtype=torch.float64)
    m, v, t = torch.zeros_like(W), torch.zeros(W.shape[:-2], dtype=torch.float64), torch.zeros(W.shape[:-2], dtype=torch.float64)

    def compare(label, implicit, explicit):
        try:
            a, b = implicit(), explicit()
            a, b = (a if isinstance(a, tuple) else (a,)), (b if isinstance(b, tuple) else (b,))
            residual = max(_ulps(x, y) for x, y in zip(a, b)) if len(a) == len(b) else math.inf
            raised = None
        except Exception as error:  # a default that makes a valid call fail fails the check
            residual, raised = math.inf, f"{type(error).__name__}: {error}"
        check.add([residual], 0.5, key=("promise", "defaults", label), seed=seed, extra={"call": label, "raised": raised})

    def class_step(**settings):
        p = torch.nn.Parameter(W.clone())
        optimizer = subject.optimizer_class([p], **settings)
        for _ in range(2):
            p.grad = G.clone()
            optimizer.step()
        state = optimizer.state[p]
        return (p.detach(), state["exp_avg"], state["exp_avg_sq"])

    compare("StiefelAdam", class_step, lambda: class_step(**DOCUMENTED, retraction_method="auto", skip_nonfinite=False, manifold="stiefel"))
    kernel = subject.kernel
    compare("stiefel_adam_step", lambda: kernel(W, G, m, v, t),
            lambda: kernel(W, G, m, v, t, DOCUMENTED["lr"], *DOCUMENTED["betas"], DOCUMENTED["eps"], DOCUMENTED["trust_radius"],
                           DOCUMENTED["weight_decay"], retraction_method="auto", sync_free=False))
    xi = 0.3 * functional.project_tangent(W, G) / torch.linalg.matrix_norm(functional.project_tangent(W, G))[..., None, None]
    compare("polar_factor", lambda: functional.polar_factor(W + xi), lambda: functional.polar_factor(W + xi, 0.5, "auto"))
    compare("polar_retract", lambda: functional.polar_retract(W, xi), lambda: functional.polar_retract(W, xi, 0.5, "auto"))
    # "auto" is Newton-Schulz for trust_radius <= 0.75 and eigh above (torch_impl/functional.py's docstring)
    compare("auto_is_newton_schulz", lambda: kernel(W, G, m, v, t, trust_radius=0.5, retraction_method="auto"),
            lambda: kernel(W, G, m, v, t, trust_radius=0.5, retraction_method="newton_schulz"))
    compare("auto_is_eigh", lambda: kernel(W, G, m, v, t, trust_radius=1.0, retraction_method="auto"),
            lambda: kernel(W, G, m, v, t, trust_radius=1.0, retraction_method="eigh"))

    def clipped(**given):
        params = [torch.nn.Parameter(W.clone())]
        params[0].grad = (5.0 * G).clone()
        total = subject.clip(params, 1.0, **given)
        return (total, params[0].grad)

    compare("clip_grad_norm_finite_", clipped, lambda: clipped(norm_type=2.0))


def pickle_round_trip(subject, check, seed: int) -> None:
    """torch.optim's optimizers pickle (torch.save(optimizer), copy.deepcopy): the copy steps as the original."""
    import copy as copying

    import torch

    generator = torch.Generator().manual_seed(seed)
    shapes = ((2, 5, 2), (4, 3))
    params = [torch.nn.Parameter(_frames(torch, shape, torch.float64, generator)) for shape in shapes]
    steps = [[torch.randn(shape, generator=generator, dtype=torch.float64) for shape in shapes] for _ in range(3)]
    optimizer = subject.optimizer_class(params, lr=0.05, skip_nonfinite=True)
    steps[0][0][1, 0, 0] = math.nan  # one frame skipped before the copy: its count must come along
    for p, g in zip(params, steps[0]):
        p.grad = g.clone()
    optimizer.step()
    residual, raised = 0.0, None
    try:
        twin = copying.deepcopy(optimizer)
        if (twin.skipped_steps, twin.off_manifold_steps) != (optimizer.skipped_steps, optimizer.off_manifold_steps):
            residual = math.inf
        twin_params = [p for group in twin.param_groups for p in group["params"]]
        for gradients in steps[1:]:
            for p, q, g in zip(params, twin_params, gradients):
                p.grad, q.grad = g.clone(), g.clone()
            optimizer.step()
            twin.step()
        residual = max(residual, *(_same_as(q, twin, p, optimizer) for p, q in zip(params, twin_params)))
    except Exception as error:  # a copy that cannot step fails the check
        residual, raised = math.inf, f"{type(error).__name__}: {error}"
    check.add([residual], 0.5, key=("promise", "pickle"), seed=seed, extra={"raised": raised})


def scheduler_sees_step(subject, check, seed: int) -> None:
    """The usual loop: a scheduler made before the first step, optimizer.step() then scheduler.step()."""
    import warnings

    import torch

    p = torch.nn.Parameter(_frames(torch, (2, 5, 2), torch.float64, torch.Generator().manual_seed(seed)))
    optimizer = subject.optimizer_class([p], lr=0.05)
    scheduler = torch.optim.lr_scheduler.MultiplicativeLR(optimizer, lr_lambda=lambda _: 0.5)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in range(2):
            p.grad = torch.randn(p.shape, generator=torch.Generator().manual_seed(seed + 1), dtype=torch.float64)
            optimizer.step()
            scheduler.step()
    about_order = [str(w.message) for w in caught if "lr_scheduler.step()" in str(w.message)]
    ok = not about_order and optimizer.param_groups[0]["lr"] == 0.05 * 0.5 * 0.5
    check.add([0.0 if ok else math.inf], 0.5, key=("promise", "scheduler"), seed=seed,
              extra={"warnings": about_order[:1], "lr": float(optimizer.param_groups[0]["lr"])})


def mixed_dtypes(subject, check, seed: int) -> None:
    """Frames of one shape in three dtypes in one optimizer step as each does alone: the batched calls
    join parameters of one (d, r), dtype and device only (torch_impl/optimizer.py's docstring)."""
    import torch

    generator = torch.Generator().manual_seed(seed)
    dtypes = [getattr(torch, name) for name in DTYPES]
    frames = [_frames(torch, (2, 5, 2), dtype, generator) for dtype in dtypes]
    steps = [[torch.randn(f.shape, generator=generator, dtype=torch.float64).to(f.dtype) for f in frames] for _ in range(3)]
    for layout in ("one_group", "group_each"):
        together = [torch.nn.Parameter(f.clone()) for f in frames]
        groups = together if layout == "one_group" else [{"params": [p]} for p in together]
        joint = subject.optimizer_class(groups, lr=0.05)
        alone = [torch.nn.Parameter(f.clone()) for f in frames]
        singles = [subject.optimizer_class([p], lr=0.05) for p in alone]
        try:
            for gradients in steps:
                for p, q, g in zip(together, alone, gradients):
                    p.grad, q.grad = g.clone(), g.clone()
                joint.step()
                for optimizer in singles:
                    optimizer.step()
            raised = None
        except Exception as error:  # a valid mixture that cannot step fails the check
            raised = f"{type(error).__name__}: {error}"
        for p, q, optimizer, dtype in zip(together, alone, singles, DTYPES):
            residual = math.inf if raised else _same_as(p, joint, q, optimizer)
            check.add([residual], 0.5, shape=(5, 2), key=("promise", "mixed", layout, dtype), seed=seed,
                      extra={"layout": layout, "dtype": dtype, "raised": raised})
            check.cover("dtype", dtype)


def counts_each_frame_once(subject, check, seed: int) -> None:
    """A frame off the manifold is counted in off_manifold_steps only, even when its step is also not
    finite ("a frame off the manifold is counted there only"), and a NaN step in skipped_steps."""
    import torch

    W = _frames(torch, (3, 5, 2), torch.float64, torch.Generator().manual_seed(seed))
    p = torch.nn.Parameter(W.clone())
    optimizer = subject.optimizer_class([p], lr=0.05, skip_nonfinite=True)
    G = torch.randn(W.shape, generator=torch.Generator().manual_seed(seed + 3), dtype=torch.float64)
    G[0, 0, 0] = G[1, 0, 0] = math.nan
    with torch.no_grad():
        p[0].mul_(1.1)  # frame 0 off St(d, r), as an edit would leave it
    before = p.detach().clone()
    p.grad = G
    try:
        optimizer.step()
        counts = (optimizer.skipped_steps, optimizer.off_manifold_steps)
        ok = counts == (1, 1) and _ulps(p[:2], before[:2]) == 0 and _ulps(p[2:], before[2:]) > 0
        raised = None
    except Exception as error:  # skip_nonfinite must not raise here
        counts, ok, raised = None, False, f"{type(error).__name__}: {error}"
    check.add([0.0 if ok else math.inf], 0.5, key=("promise", "counts"), seed=seed, extra={"counts": counts, "expected": [1, 1], "raised": raised})


def joined_states_with_gap(subject, check, seed: int) -> None:
    """The batched call reads and writes the states of its parameters in place where they lie one after
    the other in one buffer; a parameter without a gradient between two that have one breaks that
    order. Each frame's step must still be its own ("a frame's result must not depend on the other
    frames of its batch", torch_impl/functional.py): the joined run against one optimizer per parameter."""
    import torch

    for dtype_name in DTYPES:
        dtype = getattr(torch, dtype_name)
        generator = torch.Generator().manual_seed(seed)
        frames = [_frames(torch, (2, 5, 2), dtype, generator) for _ in range(3)]
        steps = [[torch.randn(f.shape, generator=generator, dtype=torch.float64).to(dtype) for f in frames] for _ in range(4)]
        together = [torch.nn.Parameter(f.clone()) for f in frames]
        joint = subject.optimizer_class(together, lr=0.05)
        alone = [torch.nn.Parameter(f.clone()) for f in frames]
        singles = [subject.optimizer_class([q], lr=0.05) for q in alone]
        for index, gradients in enumerate(steps):
            for position, (p, q, g) in enumerate(zip(together, alone, gradients)):
                given = None if index == 1 and position == 1 else g  # the middle one without a gradient at the second step
                p.grad, q.grad = (None, None) if given is None else (given.clone(), given.clone())
            joint.step()
            for optimizer in singles:
                optimizer.step()
        for position, (p, q, optimizer) in enumerate(zip(together, alone, singles)):
            residual = _same_as(p, joint, q, optimizer)
            check.add([residual], 0.5, shape=(5, 2), key=("promise", "gap", dtype_name, position), seed=seed,
                      extra={"dtype": dtype_name, "parameter": position})
        check.cover("dtype", dtype_name)


NAMES = ("attention.query", "attention.key")


def named_parameters(subject, refusal, checkpoint, seed: int) -> None:
    """An optimizer built from (name, tensor) pairs, as from model.named_parameters(): a refused step names
    the parameter at fault by its place and name; a checkpoint loads into a fresh such optimizer."""
    import torch

    generator = torch.Generator().manual_seed(seed)
    frames = [_frames(torch, shape, torch.float64, generator) for shape in ((2, 5, 2), (4, 3))]
    gradients = [torch.randn(f.shape, generator=generator, dtype=torch.float64) for f in frames]
    params = [torch.nn.Parameter(f.clone()) for f in frames]
    optimizer = subject.optimizer_class(list(zip(NAMES, params)), lr=0.05)
    for p, g in zip(params, gradients):
        p.grad = g.clone()
    with torch.no_grad():
        params[1].mul_(2.0)  # off St(d, r): the step must refuse it, naming it
    error = None
    try:
        optimizer.step()
    except Exception as caught:  # what a user would meet
        error = caught
    message = str(error) if error is not None else ""
    ok = isinstance(error, ValueError) and "params[1] of param group 0" in message and NAMES[1] in message
    refusal.add([0.0 if ok else math.inf], 0.5, key=("promise", "named_refusal"), seed=seed,
                extra={"raised": None if error is None else f"{type(error).__name__}: {message.splitlines()[0] if message else ''}"})
    with torch.no_grad():
        params[1].copy_(frames[1])
    for _ in range(2):
        optimizer.step()
    saved = optimizer.state_dict()
    fresh_params = [torch.nn.Parameter(p.detach().clone()) for p in params]
    fresh = subject.optimizer_class(list(zip(NAMES, fresh_params)), lr=1e-3)
    try:
        fresh.load_state_dict(saved)
        residual = max(_same_as(q, fresh, p, optimizer) for p, q in zip(params, fresh_params))
        raised = None
    except Exception as caught:  # a load that raises on a valid checkpoint fails the check
        residual, raised = math.inf, f"{type(caught).__name__}: {caught}"
    checkpoint.add([residual], 0.5, key=("promise", "named_checkpoint"), seed=seed, extra={"raised": raised})


def meta_parameter_refused(subject, check, seed: int) -> None:
    import torch

    for manifold in ("stiefel", "euclidean"):
        for with_gradient in (False, True):
            meta = torch.nn.Parameter(torch.empty(5, 2, device="meta", dtype=torch.float64))
            if with_gradient:
                meta.grad = torch.empty(5, 2, device="meta", dtype=torch.float64)
            real = torch.nn.Parameter(_frames(torch, (5, 2), torch.float64, torch.Generator().manual_seed(seed)))
            real.grad = torch.randn(5, 2, dtype=torch.float64, generator=torch.Generator().manual_seed(seed + 1))
            error = None
            try:
                subject.optimizer_class([{"params": [real]}, {"params": [meta], "manifold": manifold}], lr=0.01).step()
            except Exception as caught:  # what a user would meet
                error = caught
            ok = isinstance(error, ValueError) and "meta" in str(error)
            check.add([0.0 if ok else math.inf], 0.5, key=("promise", "meta", manifold, with_gradient), seed=seed,
                      extra={"manifold": manifold, "gradient": with_gradient,
                             "raised": None if error is None else f"{type(error).__name__}: {str(error).splitlines()[0]}"})


def zero_grad_sets_none(subject, check, seed: int) -> None:
    """zero_grad() as torch.optim.Optimizer.zero_grad: set_to_none=True unless asked, so that a frame whose
    gradient is then not set again is left untouched by the next step (not stepped with a zero gradient)."""
    import torch

    W = _frames(torch, (2, 5, 2), torch.float64, torch.Generator().manual_seed(seed))
    p = torch.nn.Parameter(W.clone())
    optimizer = subject.optimizer_class([p], lr=0.05)
    p.grad = torch.randn(p.shape, dtype=torch.float64, generator=torch.Generator().manual_seed(seed + 2))
    optimizer.step()
    optimizer.zero_grad()
    after_zero = p.detach().clone()
    none = p.grad is None
    optimizer.step()
    moved = _ulps(p, after_zero)
    check.add([0.0 if none and moved == 0 else math.inf], 0.5, key=("promise", "zero_grad"), seed=seed,
              extra={"grad_is_none": none, "ulps_moved_by_the_next_step": moved})


# --------------------------------------------------------------------------------------------
# The rules torch_impl/functional.py's docstrings state, and its calls on empty and integer input
# --------------------------------------------------------------------------------------------

# (d, r) of the route test's rule: r small against d (the test runs for typical gradients), r not small
# (it never runs), r = 1, and d r^2 = 2^20 (it always runs, whatever the drift)
RULE_SHAPES = ((6, 1), (16, 2), (64, 2), (128, 4), (32, 8), (200, 3), (20, 10), (16, 16), (4096, 16))
# frames whose route is probed on each side of their own threshold, per shape (float64)
ROUTE_SHAPES = ((16, 2), (64, 2), (32, 4))
ROUTE_FRAMES = 12
# the probes sit this far (relative to the test's terms R + E) from the threshold: far above the float64
# evaluation of the test's terms ((d r + 10) u per term, under 1e-13 here), far below any change of a constant
PROBE_SHARE = 1e-10
# the frames' own defect ||W^T W - I||_F: the identity and the explicit ||g||^2 then differ by <D, Sigma^2>, about
# 1e-3 ||Sigma||^2, so which of the two a call returned is read off its value
ROUTE_DEFECT = 1e-3
DRIFT_RADII = (0.25, 0.5, 0.75, 1.0)
DRIFT_SHAPES = ((6, 1), (8, 4), (40, 5), (64, 32))
# the drift bound evaluated by the check and by the code: a dozen positive terms each, in another order: at
# most 12 u_64 apart each, relative
DRIFT_EVALUATION = 32 * UNIT["float64"]
NEWTON_SCHULZ_RADII = (0.05, 0.25, 0.5, 0.6, 0.75)


def _documented_route_rule(d: int, r: int, drift_per_u: float) -> tuple[float, float, float]:
    """gram_identity_worth_testing's docstring: the test of gradient_norm_squared's docstring at ||G~||^2 = d r,
    ||Sigma||^2 = r (r + 1) / 2, ||Sigma^2||_F = r^1.5 / sqrt(2), in 50 digits: (R, E, Q) with the rule
    R + drift_per_u Q <= E (R the identity's rounding terms, E the explicit route's, in units of u)."""
    import mpmath

    with mpmath.workdps(50):
        gradient_sq, sigma_sq = mpmath.mpf(d * r), mpmath.mpf(r * (r + 1)) / 2
        square_norm = mpmath.mpf(r) ** 1.5 / mpmath.sqrt(2)
        identity = gradient_sq - sigma_sq
        cross = mpmath.sqrt(sigma_sq * gradient_sq)
        rounding = (d * r + 3) * gradient_sq + 2 * (d + 2) * mpmath.sqrt(r) * cross + (r * r + 3) * sigma_sq + abs(identity)
        explicit = d * r * identity + 2 * (d + r + 2) * mpmath.sqrt(r) * mpmath.sqrt(max(identity, 0) * gradient_sq)
        return float(rounding), float(explicit), float(square_norm)


def _documented_worth_testing(d: int, r: int, drift_per_u: float) -> bool:
    if d * r * r >= 2**20:  # "wherever one product costs more than the test (d r^2 >= GRAM_IDENTITY_MIN_PRODUCT)"
        return True
    if d * r <= r * (r + 1) / 2:  # ||g||^2 of a typical gradient is 0: nothing to test
        return False
    rounding, explicit, square_norm = _documented_route_rule(d, r, drift_per_u)
    return rounding + drift_per_u * square_norm <= explicit


def route_test_as_documented(subject, check, seed: int) -> None:
    """gradient_norm_squared takes the Gram identity for a frame exactly where its docstring's test says, and
    gram_identity_worth_testing makes the test exactly where its docstring's rule says: each probed on both
    sides of its own threshold of drift_per_u (the drift bound over u), the threshold computed here in 50
    digits from the documented terms."""
    import torch

    from propositions.kit.common import rng_for

    functional = subject.functional
    for d, r in RULE_SHAPES:
        rounding, explicit, square_norm = _documented_route_rule(d, r, 0.0)
        threshold = (explicit - rounding) / square_norm
        probes = [0.0, 1e30] if d * r * r >= 2**20 or threshold <= 0 else \
            [threshold - PROBE_SHARE * (rounding + explicit) / square_norm, threshold + PROBE_SHARE * (rounding + explicit) / square_norm]
        for drift_per_u in probes:
            expected = _documented_worth_testing(d, r, drift_per_u)
            try:
                got = bool(functional.gram_identity_worth_testing(d, r, drift_per_u))
                raised = None
            except Exception as error:  # a rule that cannot be evaluated fails the check
                got, raised = None, f"{type(error).__name__}: {error}"
            check.add([0.0 if got == expected else math.inf], 0.5, shape=(d, r), key=("promise", "worth_testing", d, r), seed=seed,
                      extra={"rule": "gram_identity_worth_testing", "drift_per_u": drift_per_u, "threshold": threshold,
                             "documented": expected, "returned": got, "raised": raised})
        check.cover("worth_testing", "always" if d * r * r >= 2**20 else "never" if threshold <= 0 else "below a drift")
    u = UNIT["float64"]
    for d, r in ROUTE_SHAPES:
        rng = rng_for(seed, "optimizer", "route_rule", d, r)
        Q = np.linalg.qr(rng.standard_normal((ROUTE_FRAMES, d, r)))[0]
        D = rng.standard_normal((ROUTE_FRAMES, r, r))
        D = D + np.swapaxes(D, -1, -2)
        D *= (ROUTE_DEFECT / np.linalg.norm(D, axis=(-2, -1)))[:, None, None]
        lam, V = np.linalg.eigh(D)
        W = Q @ ((V * np.sqrt(1.0 + lam)[:, None, :]) @ np.swapaxes(V, -1, -2))  # W^T W = I + D
        # gradients from mostly tangent to mostly normal: W (skew + share * sym) + normal part
        share = np.linspace(0.0, 3.0, ROUTE_FRAMES)
        A = rng.standard_normal((ROUTE_FRAMES, r, r))
        normal = rng.standard_normal((ROUTE_FRAMES, d, r))
        normal -= Q @ (np.swapaxes(Q, -1, -2) @ normal)
        G = W @ (A - np.swapaxes(A, -1, -2) + share[:, None, None] * (A + np.swapaxes(A, -1, -2))) + normal
        for index in range(ROUTE_FRAMES):
            w, g = W[index], G[index]
            sigma = 0.5 * (w.T @ g + g.T @ w)
            gradient_norm, sigma_norm = np.linalg.norm(g), np.linalg.norm(sigma)
            identity = gradient_norm**2 - sigma_norm**2
            exact_explicit = np.linalg.norm(g - w @ sigma) ** 2
            rounding = (d * r + 3) * gradient_norm**2 + 2 * (d + 2) * math.sqrt(r) * sigma_norm * gradient_norm + (r * r + 3) * sigma_norm**2 + abs(identity)
            explicit = d * r * identity + 2 * (d + r + 2) * math.sqrt(r) * math.sqrt(max(identity, 0.0)) * gradient_norm
            square = np.linalg.norm(sigma @ sigma)
            if explicit <= rounding:  # the identity is never taken for this frame: probe at no drift
                probes = [0.0]
            else:
                threshold = (explicit - rounding) / square
                probes = [threshold - PROBE_SHARE * (rounding + explicit) / square, threshold + PROBE_SHARE * (rounding + explicit) / square]
            for drift_per_u in probes:
                # the docstring: the coarse test with ||Sigma||^2, then (where the identity's terms are below the explicit
                # route's) the sharper one with ||Sigma^2||_F; inside the shapes worth testing at that drift
                takes = _documented_worth_testing(d, r, drift_per_u) and (
                    rounding + drift_per_u * sigma_norm**2 <= explicit or (rounding < explicit and rounding + drift_per_u * square <= explicit))
                for sync_free in (False, True):
                    tensors = [torch.tensor(x[None]) for x in (w, g, w.T @ g)]
                    try:
                        value = float(functional.gradient_norm_squared(*tensors, drift_per_u * u, sync_free)[0])
                        took = abs(value - identity) < abs(value - exact_explicit)
                        raised = None
                    except Exception as error:  # a call that fails fails the check
                        took, raised = None, f"{type(error).__name__}: {error}"
                    check.add([0.0 if took == takes else math.inf], 0.5, shape=(d, r), key=("promise", "route", d, r, index), seed=seed,
                              extra={"rule": "gradient_norm_squared", "frame": index, "drift_per_u": drift_per_u, "sync_free": sync_free,
                                     "documented_identity": takes, "returned_identity": took, "raised": raised})
                    check.cover("route", "identity" if takes else "explicit")
                    check.cover("sync_free", sync_free)


def _documented_drift_bound(d: int, r: int, dtype_name: str, trust_radius: float) -> float:
    """frame_drift_bound's docstring: (d (r + Delta^2) + (2 kappa + 7) r^1.5 + sqrt(r)) u_c + 2 sqrt(r) u_s, kappa =
    sqrt(1 + Delta^2), on the Newton-Schulz route (trust_radius <= 0.75); inf on the eigh route."""
    if trust_radius > 0.75:
        return math.inf
    u_c, u_s = UNIT["float64" if dtype_name == "float64" else "float32"], UNIT[dtype_name]
    kappa = math.sqrt(1.0 + trust_radius * trust_radius)
    return (d * (r + trust_radius * trust_radius) + (2.0 * kappa + 7.0) * r * math.sqrt(r) + math.sqrt(r)) * u_c + 2.0 * math.sqrt(r) * u_s


def _documented_newton_schulz_count(trust_radius: float, dtype_name: str, allowance: float) -> tuple[int, float]:
    """newton_schulz_iterations' docstring: the fewest iterations of the exact scalar map x -> x p(x)^2,
    p(x) = 15/8 - 5/4 x + 3/8 x^2, that bring both ends of [(sqrt(1 - a) - Delta)^2, (sqrt(1 + a) + Delta)^2]
    divided by its midpoint within u of 1, in 60 digits; and how close the last deviation came to u (the ratio,
    to leave out a count that the code's float64 evaluation could decide either way)."""
    import mpmath

    with mpmath.workdps(60):
        low = (mpmath.sqrt(1 - mpmath.mpf(allowance)) - mpmath.mpf(trust_radius)) ** 2
        high = (mpmath.sqrt(1 + mpmath.mpf(allowance)) + mpmath.mpf(trust_radius)) ** 2
        ends = [low * 2 / (low + high), high * 2 / (low + high)]
        target = mpmath.mpf(UNIT[dtype_name])
        for count in range(1, 16):
            ends = [x * (mpmath.mpf(15) / 8 - mpmath.mpf(5) / 4 * x + mpmath.mpf(3) / 8 * x * x) ** 2 for x in ends]
            worst = max(abs(1 - x) for x in ends)
            if worst <= target:
                return count, float(worst / target)
    raise AssertionError("the quintic map does not converge from the documented interval")


def derived_constants(subject, check, seed: int) -> None:
    """frame_drift_bound and newton_schulz_iterations against the formulas their docstrings derive, evaluated
    here (u from the IEEE formats), and the counts docs/algorithm.md quotes (5 in float64, 4 in float32 at
    Delta = 0.5)."""
    import torch

    functional = subject.functional
    for d, r in DRIFT_SHAPES:
        for dtype_name in DTYPES:
            for radius in DRIFT_RADII:
                documented = _documented_drift_bound(d, r, dtype_name, radius)
                try:
                    returned = float(functional.frame_drift_bound(d, r, getattr(torch, dtype_name), radius, "auto"))
                    raised = None
                except Exception as error:  # a bound that cannot be evaluated fails the check
                    returned, raised = math.nan, f"{type(error).__name__}: {error}"
                relative = (0.0 if returned == documented else math.inf) if math.isinf(documented) else abs(returned - documented) / documented
                check.add([relative], DRIFT_EVALUATION, shape=(d, r), key=("promise", "drift_bound", dtype_name, radius), seed=seed,
                          extra={"constant": "frame_drift_bound", "dtype": dtype_name, "trust_radius": radius, "documented": documented,
                                 "returned": returned, "raised": raised})
                check.cover("dtype", dtype_name)
    allowance = float(functional.DRIFT_ALLOWANCE)
    quoted = {("float64", 0.5): 5, ("float32", 0.5): 4}
    for dtype_name in ("float64", "float32"):  # the compute dtypes
        for radius in NEWTON_SCHULZ_RADII:
            count, closeness = _documented_newton_schulz_count(radius, dtype_name, allowance)
            if abs(closeness - 1.0) < 1e-6:  # the last deviation is u itself, up to the code's rounding: undecided
                continue
            try:
                returned = int(functional.newton_schulz_iterations(radius, getattr(torch, dtype_name)))
                raised = None
            except Exception as error:  # a count that cannot be evaluated fails the check
                returned, raised = None, f"{type(error).__name__}: {error}"
            right = returned == count and quoted.get((dtype_name, radius), count) == count
            check.add([0.0 if right else math.inf], DRIFT_EVALUATION, key=("promise", "newton_schulz", dtype_name, radius), seed=seed,
                      extra={"constant": "newton_schulz_iterations", "dtype": dtype_name, "trust_radius": radius, "documented": count,
                             "quoted": quoted.get((dtype_name, radius)), "returned": returned, "raised": raised})
            check.reach("trust_radius", [radius])


def edge_inputs(subject, check, seed: int) -> None:
    """Calls at the edges of what the public functions take: clip_grad_norm_finite_ over parameters none of
    which has a gradient (documented: the total is 0, as torch.nn.utils.clip_grad_norm_'s, a float32 0-d tensor,
    and nothing is touched); polar_retract of a step as long as trust_radius (retracted: the docstring asks
    ||xi||_F <= trust_radius) and of a batch of no frames, on both routes (an empty batch back); and
    stiefel_adam_step with its per-frame count t as an int64 or a float32 tensor, against the float64 tensor of
    the same counts, two steps, bit for bit (t is "a tensor of shape (...)", of any dtype that holds the counts)."""
    import torch

    generator = torch.Generator().manual_seed(seed)
    params = [torch.nn.Parameter(_frames(torch, (2, 5, 2), torch.float64, generator)), torch.nn.Parameter(torch.ones(3, dtype=torch.float32))]
    before = [p.detach().clone() for p in params]
    try:
        total = subject.clip(params, 1.0)
        reference = torch.nn.utils.clip_grad_norm_([p.detach().clone().requires_grad_() for p in params], 1.0)
        right = (torch.is_tensor(total) and total.dim() == 0 and total.dtype == reference.dtype and float(total) == float(reference)
                 and all(p.grad is None and torch.equal(p.detach(), b) for p, b in zip(params, before)))
        raised = None
    except Exception as error:  # refusing a valid call fails the check
        right, raised = False, f"{type(error).__name__}: {error}"
    check.add([0.0 if right else math.inf], 0.5, key=("promise", "edge", "clip_without_gradients"), seed=seed,
              extra={"call": "clip_grad_norm_finite_ without gradients", "raised": raised})
    check.cover("edge", "clip_without_gradients")
    # a step of length trust_radius itself, the longest the optimizer takes: "the step must then satisfy ||xi||_F <=
    # trust_radius" (polar_retract's docstring), so it is retracted, not refused, on the Newton-Schulz route
    W = _frames(torch, (3, 6, 2), torch.float64, generator)
    direction = torch.randn(W.shape, generator=generator, dtype=torch.float64)
    direction = direction - W @ (0.5 * (W.mT @ direction + direction.mT @ W))
    for radius in (0.25, 0.5, 0.75):
        xi = direction * (radius / torch.linalg.matrix_norm(direction))[..., None, None]
        try:
            out = subject.functional.polar_retract(W, xi, radius)
            right, raised = bool(torch.isfinite(out).all()) and tuple(out.shape) == tuple(W.shape), None
        except Exception as error:  # refusing a step within the trust region fails the check
            right, raised = False, f"{type(error).__name__}: {error}"
        check.add([0.0 if right else math.inf], 0.5, key=("promise", "edge", "retract_at_radius", radius), seed=seed,
                  extra={"call": f"polar_retract of a step of length {radius} at trust_radius {radius}", "raised": raised})
        check.cover("edge", f"retract_at_radius_{radius}")
    for radius in (0.5, 1.0):
        W = torch.empty(0, 6, 2, dtype=torch.float64)
        try:
            out = subject.functional.polar_retract(W, torch.zeros_like(W), radius)
            right, raised = tuple(out.shape) == (0, 6, 2), None
        except Exception as error:  # refusing an empty batch fails the check
            right, raised = False, f"{type(error).__name__}: {error}"
        check.add([0.0 if right else math.inf], 0.5, key=("promise", "edge", "retract_empty", radius), seed=seed,
                  extra={"call": f"polar_retract of (0, 6, 2) at trust_radius {radius}", "raised": raised})
        check.cover("edge", f"retract_empty_{radius}")
    for dtype_name in DTYPES:
        dtype = getattr(torch, dtype_name)
        W = _frames(torch, (3, 6, 2), dtype, generator)
        gradients = [torch.randn(W.shape, generator=generator, dtype=torch.float64).to(dtype) for _ in range(2)]
        work = torch.float64 if dtype == torch.float64 else torch.float32
        runs = {}
        for count_dtype in (torch.float64, torch.int64, torch.float32):
            w, m, v, t = W.clone(), torch.zeros(W.shape, dtype=work), torch.zeros(W.shape[:-2], dtype=work), torch.zeros(W.shape[:-2], dtype=count_dtype)
            try:
                for G in gradients:
                    w, m, v = subject.kernel(w, G, m, v, t, 0.05)
                    t = t + 1
                runs[count_dtype] = (w, m, v)
            except Exception as error:  # a count the docstring allows that the call refuses fails the check
                runs[count_dtype] = f"{type(error).__name__}: {error}"
        for count_dtype in (torch.int64, torch.float32):
            got, want = runs[count_dtype], runs[torch.float64]
            residual = max(_ulps(a, b) for a, b in zip(got, want)) if not isinstance(got, str) and not isinstance(want, str) else math.inf
            check.add([residual], 0.5, key=("promise", "edge", "count_dtype", dtype_name, str(count_dtype)), seed=seed,
                      extra={"call": f"stiefel_adam_step with t a {count_dtype} tensor", "dtype": dtype_name,
                             "raised": got if isinstance(got, str) else None})
            check.cover("count_dtype", str(count_dtype).replace("torch.", ""))


def _run_on_parameter_device(subject, seed: int, default: str) -> dict:
    """A run whose parameters live on the CPU, made with torch's default device set to `default`
    (a `with torch.device(default)` block): frames of every dtype and an ordinary tensor, with a
    tensor lr, under skip_nonfinite and not, two steps (the second with a NaN in the ordinary
    tensor's gradient where it is skipped), the state saved and loaded into a fresh instance that
    steps once; stiefel_init_ with a seeded generator and stiefel_project_ of a frame scaled off
    St(d, r). Returns name -> tensor (everything kept) and the devices the state was found on."""
    import torch

    out, devices = {}, set()
    with torch.device(default):
        generator = torch.Generator().manual_seed(seed)
        for skip in (False, True):
            # a shape per dtype: each its own batched call (mixed_dtypes holds how dtypes are joined)
            params = [torch.nn.Parameter(subject.init(torch.empty(2, 6 + index, 2, dtype=getattr(torch, name), device="cpu"),
                                                      generator=generator)) for index, name in enumerate(DTYPES)]
            ordinary = torch.nn.Parameter(torch.ones(4, dtype=torch.float32, device="cpu"))
            groups = [{"params": params}, {"params": [ordinary], "manifold": "euclidean"}]
            lr = torch.tensor(0.02, dtype=torch.float64, device="cpu")
            optimizer = subject.optimizer_class(groups, lr=lr, skip_nonfinite=skip)
            for step in range(2):
                for p in params + [ordinary]:
                    p.grad = torch.randn(p.shape, generator=generator, dtype=torch.float64, device="cpu").to(p.dtype)
                if skip and step == 1:
                    ordinary.grad[0] = math.nan
                optimizer.step()
            # the state each step made, and the state a load made: both on the parameters' device
            devices.update((key, str(value.device)) for state in optimizer.state.values() for key, value in state.items() if torch.is_tensor(value))
            fresh = subject.optimizer_class(groups, lr=lr, skip_nonfinite=skip)
            fresh.load_state_dict(optimizer.state_dict())
            for p in params + [ordinary]:
                p.grad = torch.randn(p.shape, generator=generator, dtype=torch.float64, device="cpu").to(p.dtype)
            fresh.step()
            for index, p in enumerate(params + [ordinary]):
                out[f"skip={skip} params[{index}]"] = p.detach().clone()
                for key, value in fresh.state[p].items():
                    if torch.is_tensor(value):
                        out[f"skip={skip} params[{index}] {key}"] = value
                        devices.add((key, str(value.device)))
        for name in DTYPES:
            frame = subject.init(torch.empty(3, 5, 2, dtype=getattr(torch, name), device="cpu"), generator=torch.Generator().manual_seed(seed))
            out[f"stiefel_init_ {name}"] = frame
            out[f"stiefel_project_ {name}"] = subject.project((frame.to(torch.float64) * 1.5).to(frame.dtype))
    return out, devices


def state_on_parameter_device(subject, check, seed: int) -> None:
    """docs/algorithm.md: "every tensor the optimizer makes (its state, a loaded checkpoint's moments and
    counts, stiefel_init_'s draw) is made on its parameter's device, never on torch's default device".
    The same run with torch's default device the CPU and the meta device (a `with torch.device("meta")`
    block, as lazy initialisation opens; the parameters on the CPU): every parameter, state value and
    init or projection bit for bit, every state tensor on the CPU (ulps; inf if a run raises or a state
    tensor is elsewhere). The meta device stands in for any device other than the parameters': a
    tensor made there has no values, so a step that reads one raises, and one kept shows its device."""
    runs = {}
    for default in ("cpu", "meta"):
        try:
            runs[default] = _run_on_parameter_device(subject, seed, default)
        except Exception as error:  # a run that raises under another default device fails the check
            runs[default] = f"{type(error).__name__}: {str(error).splitlines()[0] if str(error) else ''}"
    for default, run in runs.items():
        if isinstance(run, str):
            check.add([math.inf], 0.5, key=("promise", "device", default), seed=seed, extra={"default_device": default, "raised": run})
            return
    (expected, _), (got, devices) = runs["cpu"], runs["meta"]
    elsewhere = sorted(f"{key} on {device}" for key, device in devices if device != "cpu")
    for name, value in expected.items():
        residual = _ulps(got[name], value) if name in got and got[name].device.type == "cpu" else math.inf
        check.add([residual], 0.5, key=("promise", "device", name), seed=seed, extra={"value": name, "default_device": "meta"})
    check.add([math.inf if elsewhere else 0.0], 0.5, key=("promise", "device", "state"), seed=seed,
              extra={"value": "state devices", "default_device": "meta", "elsewhere": elsewhere[:4]})


PROMISES = {"lr": lr_tensor_bit_for_bit, "sync": sync_free_bit_for_bit, "clip": clip_matches_torch, "kernel": class_is_kernel,
            "tolerance": tolerance_decides, "named": named_parameters, "older": older_checkpoint_defaults,
            "defaults": documented_defaults, "pickle": pickle_round_trip, "scheduler": scheduler_sees_step,
            "mixed": mixed_dtypes, "counts": counts_each_frame_once, "gap": joined_states_with_gap, "meta": meta_parameter_refused, "zero_grad": zero_grad_sets_none,
            "route": route_test_as_documented, "constants": derived_constants, "edges": edge_inputs,
            "device": state_on_parameter_device}
# the checks each promise's run fills, where it fills more than the one of its own key
FILLS = {"clip": ("clip", "clip_dtype"), "named": ("named_refusal", "named_checkpoint")}


def promise_checks(subject, seed: int, only: str | None = None, stop: bool = False) -> list:
    """Every promise's check on `subject` (optimizer_class.Subject), in the order of PROMISES; with
    `only` (a key of PROMISES), that promise's checks alone (a control's regime). stop: a control's
    run, which ends at its first detection (kit.common.stop_at_detection)."""
    from propositions._common import stop_at_detection

    checks = _checks()
    for key, run in PROMISES.items():
        if only is None or key == only:
            filled = [checks[name] for name in FILLS.get(key, (key,))]
            with stop_at_detection(filled, active=stop):
                run(subject, *filled, seed)
    names = FILLS.get(only, (only,)) if only is not None else tuple(checks)
    return [checks[name] for name in names]


__all__ = ["DTYPE_MIXES", "NORM_TYPES", "PROMISES", "SYNC_SHAPES", "promise_checks"]
