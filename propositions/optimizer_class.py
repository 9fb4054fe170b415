"""The optimizer class: `torch_impl.StiefelAdam` as people train with it computes the certified step.

Claim. One `StiefelAdam` instance, driven for several steps over parameters of different shapes in
param groups with different lr, betas, eps, weight_decay and trust_radius (one group added with
`add_param_group` mid-run, one of ordinary tensors with manifold="euclidean"), gives every frame
the step of `reference_impl.step` with its own group's hyper-parameters and its own step count, to
within the derived rounding bound of the precision it stores and computes in (float64, float32,
bfloat16); a parameter without a gradient is not stepped and its state does not advance; a frame
whose gradient is not finite keeps its frame, moments and count under skip_nonfinite while the
other frames of its tensor step; a state_dict saved mid-run and loaded into a fresh instance
continues bit for bit; the closure's loss is returned; and the ordinary tensors get exactly
torch.optim.AdamW's step.

Why it should hold. The class only does bookkeeping around the kernel that the cross-check holds
to the reference: which hyper-parameters and which state a frame is stepped with, which count, and
what is written back. Each of those is an exact statement, and the arithmetic is the kernel's.

How it is checked. A scripted run (below, `SCENARIO`) in each dtype, lock-step against a reference
model kept per frame in float64: before every step each frame and its state are set to the
reference's values rounded to the optimizer's dtypes (so each step is compared from the same
inputs and the bound is one step's, not a trajectory's), then `optimizer.step(closure)` runs and
every stepped frame's W+, transported m+ and v+ are compared with `reference_impl.step` from the
same inputs against the one analysis of the step (propositions/kit/step_analysis.py: the kernel's
evaluation at that dtype's unit roundoffs plus the reference's own, as in the cross-check). Its
bias-correction stage covers the class's evaluation of beta^t: one count per frame as a tensor and
torch.pow, where the reference uses Python's pow. Counts, untouched parameters, the skipped frame,
the resumed run, the closure's loss and the AdamW twin are exact equalities (0.5 ulp).

What would make it fail. Any bookkeeping change: the controls are subclasses of StiefelAdam that
each break one piece (the first group's settings for every group, a count that advances for a
skipped frame, skipping the whole tensor, stepping a parameter without a gradient, a
load_state_dict that drops the counts, an added group that takes the defaults, a dropped closure
loss, coupled decay for ordinary tensors, a refused step written before its error, skipped_steps
counting the stepped frames, later param groups left unchecked, a skipped ordinary tensor's count
advancing); each must fail a check with a margin of at least DETECTION_FACTOR.
"""

from __future__ import annotations

import copy
import math

import numpy as np

import reference_impl as ref
from propositions._common import NumericalCheck, rng_for, ulps_apart
from propositions.kit.kernel_bounds import kernel_inputs, reference_moment, step_error_bound, transport_roundoff
from propositions.kit.step_analysis import reference_quantities
from propositions.kit import step_analysis
from propositions.kit.threads import one_thread_environment
from propositions.kit.protocol import Claim, Context, Control, Evidence, Part, Symbolic

CLAIM_ID = "optimizer"
DTYPE_NAMES = ("float64", "float32", "bfloat16")

def _config(lr, betas, eps, trust_radius, weight_decay):
    return dict(lr=lr, betas=betas, eps=eps, trust_radius=trust_radius, weight_decay=weight_decay)


# The scripted run. Frame groups: (name, shapes, settings, skip_nonfinite); the group "late" is
# added with add_param_group after step ADD_AFTER; "ordinary" holds one ordinary tensor.
GROUPS = (
    # (3, 12, 4) and (2, 12, 4): two parameters of one shape and settings, stepped in one joined call
    ("first", ((3, 12, 4), (16, 3), (2, 12, 4)), _config(0.05, (0.9, 0.999), 1e-8, 0.5, 0.1), False),
    ("second", ((2, 6, 6), (8, 1)), _config(0.02, (0.8, 0.99), 1e-6, 0.3, 0.0), True),
    ("late", ((2, 9, 3),), _config(0.03, (0.95, 0.98), 0.0, 0.4, 0.0), False),  # eps = 0, no decay: ZERO_FIRST
)
ORDINARY = {"shape": (5, 7), "lr": 0.01, "betas": (0.85, 0.995), "eps": 1e-7, "weight_decay": 0.05}
ADD_AFTER = 0  # "late" joins after the first step
NO_GRADIENT = (1, "first", 1)  # (step, group, parameter index): .grad is None at that step
NONFINITE = (2, "second", 0, 1)  # (step, group, parameter index, frame): a NaN in that frame's gradient
ORDINARY_NONFINITE = 2  # the ordinary tensor's gradient is NaN at this step (its group skips it)
# before this step, a step with a NaN in the last frame of that parameter (the second of its joined
# call) must be refused
REFUSED = (3, "first", 2)
ZERO_FIRST = (ADD_AFTER + 1, "late", 0, 0)  # a zero first gradient in the eps = 0 group: v^ = 0, xi = 0, never 0/0
# skipped_steps after a run: NONFINITE's frame and the ordinary tensor at ORDINARY_NONFINITE
SKIPPED_PER_RUN = 2
SAVE_AFTER = 1  # the state_dict is saved after this step and resumed in a fresh instance
MIN_STEPS = 4


def _derivation(dtype_name: str, output: str) -> str:
    rounding = step_analysis.kernel_rounding(dtype_name, 0.5, 1, 1)
    return (f"the class's evaluation (u_c = {rounding.u_c:.3g} of {step_analysis.COMPUTE_DTYPES[dtype_name]}, u_s = "
            f"{rounding.u_W:.3g} of {dtype_name}, m and v in {step_analysis.COMPUTE_DTYPES[dtype_name]}, inputs rounded to "
            "them, the Gram route with its derived iteration count) plus the reference's (u_c = 2^-53, the SVD route); "
            + step_analysis.step_error_text(output))


def _new_checks(dtype_name: str) -> dict:
    exact = "exact equality: max |x - y| / ulp(y) over the tensors, bound 0.5 (bit for bit)"

    def check(name, description, bound_derivation):
        return NumericalCheck(f"{dtype_name}/{name}", description, bound_derivation,
                              tightness_note="an exact equality: 0 by design" if bound_derivation == exact else None)

    return {
        "W": check("frame", f"||W+_class - W+_ref||_F per stepped frame, {dtype_name}, each frame with its own group's settings", _derivation(dtype_name, "W")),
        "m": check("first_moment", f"||m+_class - m+_ref||_F per stepped frame (m+ transported), {dtype_name}", _derivation(dtype_name, "m")),
        "v": check("second_moment", f"|v+_class - v+_ref| per stepped frame, {dtype_name}", _derivation(dtype_name, "v")),
        "t": check("step_count", "|t_class - t_ref| per frame: one count per frame, advanced only by a written step", exact),
        "untouched": check("no_gradient_untouched", "a parameter whose .grad is None: parameter and state after the step against before (ulps)", exact),
        "skipped": check("nonfinite_frame_untouched", "the frame with a NaN gradient under skip_nonfinite: its frame, m and v after against before (ulps)", exact),
        "resume": check("resume_bit_for_bit", "parameters and states of a fresh instance loaded from the mid-run state_dict against the original, after the same steps (ulps)", exact),
        "closure": check("closure_loss", "the loss step(closure) returns against the closure's own (ulps; inf if not returned)", exact),
        "ordinary": check("euclidean_is_adamw", "the manifold='euclidean' tensor and its state against torch.optim.AdamW with the group's settings (ulps)", exact),
        "refused": check("refused_step_untouched", "a step with a NaN in the last frame of a parameter whose group does not skip: ValueError, and every parameter and state as before (ulps; inf if not refused)", exact),
        "skipped_count": check("skipped_count", f"|skipped_steps - {SKIPPED_PER_RUN}| after one NaN frame and one NaN ordinary tensor under skip_nonfinite", exact),
        "refusals": check("bad_groups_refused", "a second param group with lr < 0, a non-frame in a frame group or an unknown manifold, at construction and by add_param_group: ValueError (0; inf if accepted)", exact),
        "undefined": [],  # frame-steps where the analysis has no bound (not a check: dropped by dtype_part)
    }


class _ReferenceFrame:
    """One frame's reference trajectory in float64: W, the reference state (m transported), and
    the moment before its transport (what the class's state holds)."""

    def __init__(self, W: np.ndarray):
        self.W = np.array(W, dtype=np.float64)  # a copy: a float64 parameter must never share its memory
        self.state = ref.init(W)
        self.moment_in = self.state.m


def _torch_dtype(name):
    import torch

    return getattr(torch, name)


def _to_numpy(x) -> np.ndarray:
    import torch

    return x.detach().to(device="cpu", dtype=torch.float64).numpy()


def _build(optimizer_class, params: dict, dtype_name: str, with_late: bool):
    """A StiefelAdam (or a control's subclass) over the scenario's groups."""
    groups = [{"params": params[name], **settings, "skip_nonfinite": skip} for name, _, settings, skip in GROUPS if name != "late"]
    groups.append({"params": params["ordinary"], "manifold": "euclidean", "skip_nonfinite": True,
                   **{k: v for k, v in ORDINARY.items() if k != "shape"}})
    optimizer = optimizer_class(groups, lr=0.001)
    if with_late:  # in the order the original run has its groups: "late" last
        optimizer.add_param_group(_late_group(params))
    return optimizer


def _late_group(params: dict) -> dict:
    _, _, settings, skip = GROUPS[2]
    return {"params": params["late"], **settings, "skip_nonfinite": skip}


def _draw(seed: int, run: int, dtype_name: str, steps: int):
    """Initial frames (float64), gradients per step per parameter, the ordinary tensor."""
    rng = rng_for(seed, CLAIM_ID, dtype_name, run)
    frames = {name: [ref.random_point(s[-2], s[-1], rng, tuple(s[:-2])) for s in shapes] for name, shapes, _, _ in GROUPS}
    gradients = [{name: [rng.standard_normal(W.shape) for W in frames[name]] for name in frames} for _ in range(steps)]
    ordinary = rng.standard_normal(ORDINARY["shape"])
    ordinary_gradients = [rng.standard_normal(ORDINARY["shape"]) for _ in range(steps)]
    ordinary_gradients[ORDINARY_NONFINITE][0, 0] = np.nan
    step, group, index, frame = NONFINITE
    _frames_of(gradients[step][group][index])[frame, 0, 0] = np.nan
    step, group, index, frame = ZERO_FIRST
    _frames_of(gradients[step][group][index])[frame] = 0.0
    return frames, gradients, ordinary, ordinary_gradients


def _frames_of(x: np.ndarray) -> np.ndarray:
    """(B, d, r) view of an array of frames (..., d, r)."""
    return x.reshape((-1,) + x.shape[-2:])


def _closure(optimizer, params, gradients, ordinary_gradient, step, dtype, device):
    """loss = sum_p <p, G_p>: backward leaves p.grad = G_p (rounded to the parameter's dtype)."""
    import torch

    def closure():
        optimizer.zero_grad()
        loss = torch.zeros((), dtype=torch.float64, device=device)
        for name, tensors in params.items():
            sources = [ordinary_gradient] if name == "ordinary" else gradients[name]
            for p, G in zip(tensors, sources):
                loss = loss + (p * torch.tensor(G, dtype=dtype, device=device)).sum().to(torch.float64)
        loss.backward()
        no_grad_step, group, index = NO_GRADIENT
        if step == no_grad_step:
            params[group][index].grad = None
        closure.loss = loss
        return loss

    return closure


def run_scenario(seed: int, run: int, dtype_name: str, steps: int, optimizer_class, checks: dict, device: str = "cpu") -> int:
    """The scripted run in one dtype (module docstring); fills checks, returns the frames stepped."""
    import torch

    dtype = _torch_dtype(dtype_name)
    # the dtype of m and v as the certifier's analysis takes it (kit/step_analysis), not the kernel's own table
    state_dtype = _torch_dtype(step_analysis.COMPUTE_DTYPES[dtype_name])
    frames, gradients, ordinary0, ordinary_gradients = _draw(seed, run, dtype_name, steps)
    params = {name: [torch.nn.Parameter(torch.tensor(W, dtype=dtype, device=device)) for W in Ws] for name, Ws in frames.items()}
    params["ordinary"] = [torch.nn.Parameter(torch.tensor(ordinary0, dtype=dtype, device=device))]
    twin = torch.nn.Parameter(params["ordinary"][0].detach().clone())
    adamw = torch.optim.AdamW([twin], lr=ORDINARY["lr"], betas=ORDINARY["betas"], eps=ORDINARY["eps"], weight_decay=ORDINARY["weight_decay"])
    model = {name: [[_ReferenceFrame(frame) for frame in _frames_of(W)] for W in Ws] for name, Ws in frames.items()}
    settings = {name: ref.StiefelAdamConfig(**config) for name, _, config, _ in GROUPS}
    optimizer = _build(optimizer_class, params, dtype_name, with_late=False)
    stepped = 0
    key = (CLAIM_ID, dtype_name, run)
    for step in range(steps):
        active = [name for name in settings if name != "late" or step > ADD_AFTER]
        _set_inputs(optimizer, params, model, active, dtype, state_dtype, device)
        before = {id(p): (p.detach().clone(), copy.deepcopy(dict(optimizer.state[p]))) for name in active + ["ordinary"] for p in params[name]}
        live = {n: params[n] for n in active + ["ordinary"]}
        if step == REFUSED[0]:
            refused = _refused_step(optimizer, live, gradients[step], ordinary_gradients[step], step, dtype, device)
            unchanged = max(float(_tensors_ulps([p], [before[id(p)][0]], optimizer.state[p], before[id(p)][1])[0]) for ps in live.values() for p in ps)
            checks["refused"].add(np.array([unchanged if refused else math.inf]), 0.5, key=key, seed=seed, extra={"step": step + 1})
        closure = _closure(optimizer, live, gradients[step], ordinary_gradients[step], step, dtype, device)
        loss = optimizer.step(closure)
        checks["closure"].add(_ulps_or_inf(loss, closure.loss), 0.5, key=key, seed=seed, extra={"step": step + 1})
        if step != ORDINARY_NONFINITE:  # AdamW itself would write the NaN: the twin skips that step
            twin.grad = params["ordinary"][0].grad.clone()
            adamw.step()
        _compare_ordinary(optimizer, params["ordinary"][0], twin, adamw, checks["ordinary"], key, seed, step)
        for name in active:
            for index, p in enumerate(params[name]):
                stepped += _step_and_compare(
                    optimizer, p, model[name][index], gradients[step][name][index], settings[name], dtype_name,
                    (step, name, index), before.get(id(p)), checks, key, seed,
                )
        if step == ADD_AFTER:
            optimizer.add_param_group(_late_group(params))
    checks["skipped_count"].add(np.array([abs(optimizer.skipped_steps - SKIPPED_PER_RUN)]), 0.5, key=key, seed=seed, extra={"what": "skipped_steps"})
    _refusals(optimizer_class, params, checks["refusals"], key, seed)
    _resume(seed, run, dtype_name, steps, optimizer_class, checks["resume"], key, device)
    return stepped


def _refused_step(optimizer, params, gradients, ordinary_gradient, step, dtype, device) -> bool:
    """Whether a step with a NaN in the last frame of REFUSED's parameter (a group without
    skip_nonfinite) raises ValueError (the caller checks that nothing was written)."""
    _, group, index = REFUSED
    poisoned = {name: [np.array(G, copy=True) for G in Gs] for name, Gs in gradients.items()}
    _frames_of(poisoned[group][index])[-1, -1, -1] = np.nan
    try:
        optimizer.step(_closure(optimizer, params, poisoned, ordinary_gradient, step, dtype, device))
    except ValueError:
        return True
    return False


def _refusals(optimizer_class, params, check, key, seed) -> None:
    """Bad param groups are refused, whatever their place: a second group with lr < 0, a frame
    group holding a tensor that is not a frame, an unknown manifold, at construction and through
    add_param_group. Residual 0 per refusal, inf where the group was accepted."""
    import torch

    frame = params["first"][1].detach().clone()
    bad_groups = ({"params": [torch.nn.Parameter(frame.clone())], "lr": -1.0},
                  {"params": [torch.nn.Parameter(2.0 * frame)]},
                  {"params": [torch.nn.Parameter(frame.clone())], "manifold": "sphere"})
    for position, bad in enumerate(bad_groups):
        for how in ("constructor", "add_param_group"):
            first = {"params": [torch.nn.Parameter(frame.clone())]}
            try:
                if how == "constructor":
                    optimizer_class([first, dict(bad)])
                else:
                    optimizer_class([first]).add_param_group(dict(bad))
                residual = math.inf
            except ValueError:
                residual = 0.0
            check.add(np.array([residual]), 0.5, key=key, seed=seed, extra={"bad_group": position, "through": how})


def _ulps_or_inf(returned, expected) -> np.ndarray:
    import torch

    if returned is expected:
        return np.array([0.0])
    if not torch.is_tensor(returned):
        return np.array([np.inf])
    return np.atleast_1d(ulps_apart(_to_numpy(returned), _to_numpy(expected)))


def _set_inputs(optimizer, params, model, active, dtype, state_dtype, device) -> None:
    """Lock-step: every frame and its state set to the reference's, rounded (in place)."""
    import torch

    for name in active:
        for p, reference in zip(params[name], model[name]):
            W = np.stack([frame.W for frame in reference]).reshape(p.shape)
            p.data.copy_(torch.from_numpy(W).to(device=device, dtype=dtype))
            state = optimizer.state[p]
            if len(state):
                m = np.stack([frame.moment_in for frame in reference]).reshape(p.shape)
                v = np.array([frame.state.v for frame in reference], dtype=np.float64).reshape(p.shape[:-2])
                state["exp_avg"].copy_(torch.from_numpy(m).to(device=device, dtype=state_dtype))
                state["exp_avg_sq"].copy_(torch.from_numpy(v).to(device=device, dtype=state_dtype))


def _step_and_compare(optimizer, p, reference, G, config, dtype_name, where, before, checks, key, seed) -> int:
    """The reference's step of each frame of p against the class's, per the scenario's events."""
    from torch_impl import functional

    step, group, index = where
    extra = {"step": step + 1, "group": group, "parameter": index}
    if (step, group, index) == NO_GRADIENT:
        W_before, state_before = before
        residual = _tensors_ulps([p], [W_before], optimizer.state[p], state_before)
        checks["untouched"].add(residual, 0.5, key=key, seed=seed, extra=extra)
        _compare_counts(optimizer, p, reference, checks, key, seed, extra)
        return 0
    G_frames = G.reshape((-1,) + G.shape[-2:])
    state = optimizer.state[p]
    W_new = _to_numpy(p).reshape(G_frames.shape)
    m_new = _to_numpy(functional.transported_moment(p.detach().to(state["exp_avg"].dtype), state["exp_avg"])).reshape(G_frames.shape)
    v_new = _to_numpy(state["exp_avg_sq"]).reshape(-1)
    d, r = G_frames.shape[-2:]
    stepped = 0
    for k, frame in enumerate(reference):
        if (step, group, index, k) == NONFINITE:
            # against what the class held before the step (the lock-step inputs, in its own dtypes)
            W_before, state_before = _to_numpy(before[0]), before[1]
            m_before = _to_numpy(state_before["exp_avg"]).reshape(G_frames.shape)[k]
            v_before = _to_numpy(state_before["exp_avg_sq"]).reshape(-1)[k]
            m_after = _to_numpy(state["exp_avg"]).reshape(G_frames.shape)[k]
            residual = max(_max_ulps(W_new[k], W_before.reshape(G_frames.shape)[k]), _max_ulps(m_after, m_before), _max_ulps(v_new[k], v_before))
            checks["skipped"].add(np.array([residual]), 0.5, shape=(d, r), key=key, seed=seed, extra={**extra, "frame": k})
            continue
        q = reference_quantities(frame.W, G_frames[k], frame.state, config)
        W_ref, state_ref = ref.step(frame.W, G_frames[k], frame.state, config)
        rounding = step_analysis.kernel_rounding(dtype_name, config.trust_radius, d, r)
        transport = transport_roundoff(d, r, rounding.u_c, frame.moment_in)
        bound = step_error_bound(d, r, config, q, rounding, kernel_inputs(rounding, r, q, transport))
        frame_extra = {**extra, "frame": k}
        # where the analysis has no bound (sqrt(v^) + eps not above its error: a gradient that is
        # normal up to rounding, docs/algorithm.md#pitfalls) W and m are not compared, and counted
        if bool(bound["well_posed"]):
            checks["W"].add(ref.frobenius(W_new[k] - W_ref), bound["W"], shape=(d, r), key=key, seed=seed, extra=frame_extra)
            checks["m"].add(ref.frobenius(m_new[k] - state_ref.m), bound["m"], shape=(d, r), key=key, seed=seed, extra=frame_extra)
        else:
            checks["undefined"].append(frame_extra)
        checks["v"].add(np.abs(np.array([v_new[k] - state_ref.v])), bound["v"], shape=(d, r), key=key, seed=seed, extra=frame_extra)
        frame.moment_in = reference_moment(frame.W, G_frames[k], frame.state, config)
        frame.W, frame.state = W_ref, state_ref
        stepped += 1
    _compare_counts(optimizer, p, reference, checks, key, seed, extra)
    return stepped


def _compare_counts(optimizer, p, reference, checks, key, seed, extra) -> None:
    counts = _to_numpy(optimizer.state[p]["step"]).reshape(-1) if len(optimizer.state[p]) else np.zeros(len(reference))
    expected = np.array([frame.state.t for frame in reference], dtype=np.float64)
    checks["t"].add(np.abs(counts - expected), 0.5, key=key, seed=seed, extra=extra)


def _max_ulps(x: np.ndarray, y: np.ndarray) -> float:
    """max |x - y| / ulp(y) elementwise (float64), 0 when bit-identical, inf for other shapes or a NaN."""
    x, y = np.asarray(x, dtype=np.float64), np.asarray(y, dtype=np.float64)
    if x.shape != y.shape:
        return math.inf
    difference = np.abs(x - y)
    with np.errstate(invalid="ignore"):
        ratio = np.where(difference == 0, 0.0, difference / np.spacing(np.abs(y)))
    ratio = np.where(np.isnan(ratio), np.inf, ratio)
    return float(np.max(ratio, initial=0.0))


def _tensors_ulps(tensors, expected, state, state_expected) -> np.ndarray:
    """The largest ulp distance over parameters and every state entry (inf if the keys differ)."""
    import torch

    residual = max((_max_ulps(_to_numpy(x), _to_numpy(y)) for x, y in zip(tensors, expected)), default=0.0)
    if set(state) != set(state_expected):
        return np.array([math.inf])
    for name, value in state_expected.items():
        other = state[name]
        if torch.is_tensor(value):
            residual = max(residual, _max_ulps(_to_numpy(other), _to_numpy(value)))
        else:
            residual = max(residual, _max_ulps(np.asarray(float(other)), np.asarray(float(value))))
    return np.array([residual])


def _compare_ordinary(optimizer, p, twin, adamw, check, key, seed, step) -> None:
    state, twin_state = optimizer.state[p], adamw.state[twin]
    residual = _tensors_ulps([p], [twin], state, twin_state)
    check.add(residual, 0.5, key=key, seed=seed, extra={"step": step + 1})


def _free_run(optimizer_class, params, dtype_name, gradients, ordinary_gradients, steps, device, optimizer=None, start=0, save_after=None):
    """Steps start..steps-1 of the scenario without lock-step inputs; with save_after, the
    state_dict and parameter values after that step are returned too."""
    dtype = _torch_dtype(dtype_name)
    if optimizer is None:
        optimizer = _build(optimizer_class, params, dtype_name, with_late=start > ADD_AFTER)
    saved = None
    for step in range(start, steps):
        active = [name for name, _, _, _ in GROUPS if name != "late" or step > ADD_AFTER]
        live = {n: params[n] for n in active + ["ordinary"]}
        if step == REFUSED[0]:
            _refused_step(optimizer, live, gradients[step], ordinary_gradients[step], step, dtype, device)
        optimizer.step(_closure(optimizer, live, gradients[step], ordinary_gradients[step], step, dtype, device))
        if step == ADD_AFTER and start <= ADD_AFTER:
            optimizer.add_param_group(_late_group(params))
        if step == save_after:
            saved = (copy.deepcopy(optimizer.state_dict()), {n: [p.detach().clone() for p in ps] for n, ps in params.items()})
    return optimizer, saved


def _resume(seed, run, dtype_name, steps, optimizer_class, check, key, device) -> None:
    """One instance runs the whole scenario, saving its state_dict after SAVE_AFTER; a fresh
    instance over fresh parameters loads it and runs the remaining steps; both must end bit for
    bit the same (parameters and every state tensor)."""
    import torch

    dtype = _torch_dtype(dtype_name)
    frames, gradients, ordinary0, ordinary_gradients = _draw(seed, run, dtype_name, steps)

    def parameters(values):
        return {name: [torch.nn.Parameter(v.clone()) for v in vs] for name, vs in values.items()}

    initial = {name: [torch.tensor(W, dtype=dtype, device=device) for W in Ws] for name, Ws in frames.items()}
    initial["ordinary"] = [torch.tensor(ordinary0, dtype=dtype, device=device)]
    original = parameters(initial)
    optimizer, (state_dict, values) = _free_run(optimizer_class, original, dtype_name, gradients, ordinary_gradients, steps, device, save_after=SAVE_AFTER)
    fresh = parameters(values)
    resumed = _build(optimizer_class, fresh, dtype_name, with_late=SAVE_AFTER >= ADD_AFTER)
    resumed.load_state_dict(state_dict)
    _free_run(optimizer_class, fresh, dtype_name, gradients, ordinary_gradients, steps, device, optimizer=resumed, start=SAVE_AFTER + 1)
    residual = max(
        float(_tensors_ulps([p], [q], resumed.state[p], optimizer.state[q])[0])
        for name in original for p, q in zip(fresh[name], original[name])
    )
    check.add(np.array([residual]), 0.5, key=key, seed=seed, extra={"saved_after_step": SAVE_AFTER + 1})


# --------------------------------------------------------------------------------------------
# Parts, controls, the claim
# --------------------------------------------------------------------------------------------


def runs_for(profile) -> int:
    """Independent draws of the scenario per dtype: 1 quick, 3 default, 30 thorough."""
    return max(1, min(30, profile.frames // 3000))


def dtype_part(dtype_name: str, ctx: Context) -> Evidence:
    """The scenario in one dtype, runs_for(profile) times, with the class under test."""
    checks, frames = _guarded_runs(ctx, dtype_name, range(runs_for(ctx.profile)))
    undefined = checks.pop("undefined")
    compute = step_analysis.COMPUTE_DTYPES[dtype_name]
    units = step_analysis.UNIT_ROUNDOFFS
    return Evidence(
        checks=list(checks.values()),
        frames=frames,
        extra={f"unit_roundoffs_{dtype_name}": {"W": units[dtype_name], "m_v": units[compute], "compute": units[compute]},
               f"undefined_frame_steps_{dtype_name}": len(undefined)},
    )


def _guarded_runs(ctx: Context, dtype_name: str, runs) -> tuple[dict, int]:
    """The checks of the scenario's runs, with "scenario_completes": an optimizer that raises where
    the scenario expects no exception fails that check (inf) instead of stopping the claim."""
    checks = _new_checks(dtype_name)
    completes = NumericalCheck(f"{dtype_name}/scenario_completes", "the scripted run ends without an exception (0; inf if the optimizer raised)",
                               "exact: a correct optimizer raises only where the scenario expects it", tightness_note="an exact equality: 0 by design")
    steps, frames = max(MIN_STEPS, ctx.profile.steps), 0
    for run in runs:
        try:
            frames += run_scenario(ctx.seed, run, dtype_name, steps, _optimizer_class(ctx.optimizer), checks, ctx.option("device", "cpu"))
            completes.add(np.array([0.0]), 0.5)
        except Exception as error:  # a broken optimizer that breaks the scenario is caught by it
            message = str(error).splitlines()[0] if str(error) else ""
            completes.add(np.array([math.inf]), 0.5, extra={"run": run, "raised": f"{type(error).__name__}: {message}"})
    return {"completes": completes, **checks}, frames


def _part(dtype_name):
    import functools

    return Part(dtype_name, functools.partial(dtype_part, dtype_name), background=True)  # a task of its own


def _optimizer_class(name):
    from torch_impl import StiefelAdam

    if name == REAL_OPTIMIZER:
        return StiefelAdam
    return broken_optimizers()[name][0]


REAL_OPTIMIZER = "stiefel_adam"


def broken_optimizers() -> dict:
    """name -> (StiefelAdam subclass that breaks one piece of bookkeeping, description)."""
    import torch
    from torch_impl import StiefelAdam

    class FirstGroupSettings(StiefelAdam):
        def _frame_buckets(self):
            first = self.param_groups[0]
            keys = ("lr", "betas", "eps", "trust_radius", "weight_decay", "skip_nonfinite", "retraction_method")
            settings = tuple(first[key] for key in keys)
            merged: dict = {}
            for key, members in super()._frame_buckets().items():
                # the first group's lr, betas, eps, trust_radius, weight_decay; the group's own skipping
                merged.setdefault(settings[:5] + key[5:], []).extend(members)
            return merged

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
                frames = p.numel() // (p.shape[-1] * p.shape[-2])
                stop = start + frames
                if settings[5] and not bool(bucket.finite[start:stop].all()):
                    state = self.state[p]
                    bucket.W[start:stop] = p.detach().reshape(bucket.W[start:stop].shape)
                    if len(state):
                        bucket.m[start:stop] = state["exp_avg"].reshape(bucket.m[start:stop].shape)
                        bucket.v[start:stop] = state["exp_avg_sq"].reshape(-1)
                        bucket.t[start:stop] = state["step"].reshape(-1)
                start = stop
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
                if group["manifold"] == "stiefel":
                    for p in group["params"]:
                        if "step" in self.state[p]:
                            self.state[p]["step"].zero_()

    class AddedGroupTakesDefaults(StiefelAdam):
        def add_param_group(self, param_group):
            if getattr(self, "_constructed", False):
                param_group = {key: value for key, value in param_group.items() if key in ("params", "manifold")}
            super().add_param_group(param_group)

        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            self._constructed = True

    class ClosureLossDropped(StiefelAdam):
        def step(self, closure=None):
            super().step(closure)
            return None

    class CoupledDecayForOrdinary(StiefelAdam):
        def _step_euclidean(self, group, group_index):
            with torch.no_grad():
                for p in group["params"]:
                    if p.grad is not None:
                        p.grad.add_(p, alpha=group["weight_decay"])
            super()._step_euclidean({**group, "weight_decay": 0.0}, group_index)

    class WritesBeforeRefusing(StiefelAdam):
        def _refuse_nonfinite(self, steps):
            for bucket in steps:
                self._write(bucket)
            super()._refuse_nonfinite(steps)

    class CountsSteppedFrames(StiefelAdam):
        def _step_bucket(self, settings, members):
            bucket = super()._step_bucket(settings, members)
            if settings[5]:
                self._count_skipped(bucket.W.device, bucket.finite.sum() - 2 * (~bucket.finite).sum())
            return bucket

    class LaterGroupsUnchecked(StiefelAdam):
        def add_param_group(self, param_group):
            if self.param_groups:  # only the first group is checked
                torch.optim.Optimizer.add_param_group(self, param_group)
                return
            super().add_param_group(param_group)

    class OrdinaryCountAdvancesOnSkip(StiefelAdam):
        def _step_euclidean(self, group, group_index):
            nonfinite = [p for p in group["params"] if p.grad is not None and not bool(torch.isfinite(p.grad).all())]
            super()._step_euclidean(group, group_index)
            for p in nonfinite:
                self.state[p]["step"].add_(1)

    return {
        "writes_before_refusing": (WritesBeforeRefusing, "a refused step (NaN without skip_nonfinite) is written before the ValueError"),
        "skipped_count_of_stepped": (CountsSteppedFrames, "skipped_steps counts the frames that stepped, not those skipped"),
        "later_groups_unchecked": (LaterGroupsUnchecked, "only the first param group's settings and tensors are checked"),
        "ordinary_count_advances_on_skip": (OrdinaryCountAdvancesOnSkip, "a skipped ordinary tensor's AdamW step count still advances"),
        "first_group_settings": (FirstGroupSettings, "every frame stepped with the first param group's hyper-parameters"),
        "count_advances_on_skip": (CountAdvancesOnSkip, "a frame skipped for a non-finite step still advances its step count"),
        "whole_tensor_skip": (WholeTensorSkip, "one non-finite frame skips every frame of its tensor"),
        "steps_without_gradient": (StepsWithoutGradient, "a parameter whose .grad is None is stepped with a zero gradient"),
        "load_drops_counts": (LoadDropsCounts, "load_state_dict restarts the step counts (bias corrections start over)"),
        "added_group_takes_defaults": (AddedGroupTakesDefaults, "add_param_group ignores the group's own hyper-parameters"),
        "closure_loss_dropped": (ClosureLossDropped, "step(closure) returns None instead of the closure's loss"),
        "coupled_decay_for_ordinary": (CoupledDecayForOrdinary, "ordinary tensors get Adam with L2 decay (G + lambda W) instead of AdamW"),
    }


CONTROL_NAMES = (
    "first_group_settings", "count_advances_on_skip", "whole_tensor_skip", "steps_without_gradient",
    "load_drops_counts", "added_group_takes_defaults", "closure_loss_dropped", "coupled_decay_for_ordinary",
    "writes_before_refusing", "skipped_count_of_stepped", "later_groups_unchecked", "ordinary_count_advances_on_skip",
)


def control_part(ctx: Context) -> Evidence:
    """A broken class through the float64 scenario (one run): it must fail a check by DETECTION_FACTOR."""
    checks, _ = _guarded_runs(ctx, "float64", range(1))
    checks.pop("undefined")
    return Evidence(checks=list(checks.values()))


DEFAULT_OPTIONS = (("device", "cpu"),)


def _prepare(ctx: Context) -> None:
    """One-line ValueErrors for an unknown optimizer, option or device."""
    import torch

    if ctx.optimizer != REAL_OPTIMIZER and ctx.optimizer not in CONTROL_NAMES:
        raise ValueError(f"claim {CLAIM_ID}: optimizer must be {REAL_OPTIMIZER!r} or a control ({', '.join(CONTROL_NAMES)}), got {ctx.optimizer!r}")
    unknown = sorted(set(ctx.options) - {"device"})
    if unknown:
        raise ValueError(f"claim {CLAIM_ID} takes the option device, got {', '.join(unknown)}")
    device = torch.device(ctx.option("device", "cpu"))
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ValueError("device cuda was requested but torch.cuda.is_available() is False")


CLAIM = Claim(
    id=CLAIM_ID,
    title="The optimizer class StiefelAdam steps every frame as certified, in float64, float32 and bfloat16",
    statement=(
        "One torch_impl.StiefelAdam instance over parameters of different shapes in param groups with different "
        "hyper-parameters (one added mid-run, one of ordinary tensors) gives every frame reference_impl.step with its "
        "own group's settings and its own step count, within the derived rounding bound of float64, float32 and "
        "bfloat16; leaves a parameter without a gradient untouched; under skip_nonfinite keeps a frame with a "
        "non-finite gradient (frame, moments, count) while the other frames of its tensor step; resumes bit for bit "
        "from a mid-run state_dict; returns the closure's loss; and steps ordinary tensors exactly as torch.optim.AdamW."
    ),
    latex=(
        r"\|W^{+}_{\mathrm{class}} - \mathrm{step}_{\mathrm{ref}}(W, G, m, v, t; h_{\mathrm{group}})\|_F \le "
        r"\beta(d, r, u_W, u_{mv}, u_c),\quad t_{\mathrm{frame}}^{+} = t_{\mathrm{frame}} + [\mathrm{step\ finite}]"
    ),
    symbolic=Symbolic("not applicable: bookkeeping of an implementation"),
    parts=tuple(_part(name) for name in DTYPE_NAMES),
    controls=tuple(Control(name, control_part, description) for name, description in (
        ("first_group_settings", "every frame stepped with the first param group's hyper-parameters"),
        ("count_advances_on_skip", "a frame skipped for a non-finite step still advances its step count"),
        ("whole_tensor_skip", "one non-finite frame skips every frame of its tensor"),
        ("steps_without_gradient", "a parameter whose .grad is None is stepped with a zero gradient"),
        ("load_drops_counts", "load_state_dict restarts the step counts (bias corrections start over)"),
        ("added_group_takes_defaults", "add_param_group ignores the group's own hyper-parameters"),
        ("closure_loss_dropped", "step(closure) returns None instead of the closure's loss"),
        ("coupled_decay_for_ordinary", "ordinary tensors get Adam with L2 decay (G + lambda W) instead of AdamW"),
        ("writes_before_refusing", "a refused step (NaN without skip_nonfinite) is written before the ValueError"),
        ("skipped_count_of_stepped", "skipped_steps counts the frames that stepped, not those skipped"),
        ("later_groups_unchecked", "only the first param group's settings and tensors are checked"),
        ("ordinary_count_advances_on_skip", "a skipped ordinary tensor's AdamW step count still advances"),
    )),
    requires=("torch",),
    default_options=DEFAULT_OPTIONS,
    prepare=_prepare,
    environment=one_thread_environment,
)

__all__ = ["CLAIM", "broken_optimizers", "run_scenario"]
