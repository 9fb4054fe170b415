"""The optimizer class: `torch_impl.StiefelAdam` as people train with it computes the certified step.

Claim. Over every layout and operation sequence of the scenario grammar
(propositions/optimizer_scenarios.py: 1-4 frame groups with their own lr, betas, eps,
weight_decay, trust_radius and skip_nonfinite, sibling groups that share a frame shape and differ in
one setting, parameters with 0, 1 or 2 leading axes, r = 1 to r = d, euclidean groups of several
tensors, groups added mid-run; steps with and without a closure, zero_grad both ways, an lr
scheduler, checkpoints saved and loaded into a fresh instance, into the same one and in the older
single-count format; gradients that are missing, NaN, inf, finite but overflowing, or zero at
eps = 0), in float64, float32 and bfloat16, one `StiefelAdam` instance gives every frame that must
step `reference_impl.step` with its own group's current settings and its own count, to within the
rounding bound of the precision it stores and computes in; leaves a parameter without a gradient
untouched; under skip_nonfinite keeps a frame whose step is not finite (frame, moments, count) while
every other frame of its call steps; refuses, in a group that does not skip, a step with a
non-finite frame by a ValueError that names a parameter at fault, with nothing written; counts what
it skipped; keeps one float64 count per frame, past 256 steps; restores on load exactly what it
saved, so that checkpoints change nothing; calls the closure once and returns its loss; steps ordinary tensors
exactly as torch.optim.AdamW; `functional.transported_moment` gives the certified m+; and every
option it does not implement, every bad hyper-parameter and every bad tensor is refused with a
ValueError that names it, wherever it comes (constructor, a later param group, add_param_group).

Why it should hold. The class does bookkeeping around the kernel that the cross-check holds to the
reference: which settings, state and count a frame is stepped with, and what is written back. Each
of those is an exact statement; the arithmetic is the kernel's.

How it is checked. Each dtype draws its runs from the seed (`optimizer_scenarios.draw_plan`): the
first is long (past 256 steps, small frames), the others are drawn with the features still missing
until every feature of the grammar is exercised, and the certificate records the coverage of each
feature (times, runs) per dtype; zero coverage of one makes the claim inconclusive. A run is
lock-step against a float64 reference model per frame: before every step each frame and its state
are set to the model's values rounded to the class's dtypes, and after it every frame that must step
is compared with `reference_impl.step` from the same inputs, against the one analysis of the step
(kit/step_analysis: the class's evaluation at that dtype's unit roundoffs plus the reference's, as in
the cross-check). Counts, untouched and skipped frames, refused steps, skipped_steps, loaded state,
the closure's loss and the AdamW twin are exact equalities (0.5 ulp; a mismatch counts its ulps, so
an off-by-one count misses its bound by about 2^44). Each run is also replayed twice without the
lock-step, with and without its checkpoints, and must end bit for bit the same. A failing run of the
class is shrunk to the shortest operation sequence and smallest layout that still fails the same
check (`shrink`), recorded in the certificate, and `certify regression` replays it.

What would make it fail. Any bookkeeping change: the controls are subclasses of StiefelAdam that
each break one piece (CONTROLS), each of which must fail a check by at least DETECTION_FACTOR.
"""

from __future__ import annotations

import contextlib
import copy
import functools
import itertools
import math
import time
import warnings
from dataclasses import dataclass, field, replace

import numpy as np

import reference_impl as ref
from propositions._common import NumericalCheck, rng_for, stop_at_detection
from propositions.kit import step_analysis
from propositions.kit.kernel_bounds import kernel_inputs, reference_moment, step_error_bound, transport_roundoff
from propositions.kit.protocol import Claim, Context, Control, Evidence, Part, Symbolic
from propositions.kit.step_analysis import clip_bound, reference_quantities
from propositions.kit.threads import one_thread_environment

from . import optimizer_scenarios as grammar
from .optimizer_scenarios import older_format as _older_format
from .optimizer_scenarios import NONFINITE, Scenario, StepPlan, frame_count

CLAIM_ID = "optimizer"
DTYPE_NAMES = grammar.DTYPES
REAL_OPTIMIZER = "stiefel_adam"
COUNT_DTYPE = "float64"  # the documented dtype of state["step"] (torch_impl/optimizer.py)
EXACT = "exact equality: max |x - y| / ulp(y) over the compared values, bound 0.5 (bit for bit)"
MAX_REPLAYS = 150  # the shrinker's budget of scenario replays
MAX_SHRINK_SECONDS = 60.0


# --------------------------------------------------------------------------------------------
# Checks
# --------------------------------------------------------------------------------------------


def _derivation(dtype_name: str, output: str) -> str:
    rounding = step_analysis.kernel_rounding(dtype_name, 0.5, 1, 1)
    return (f"the class's evaluation (u_c = {rounding.u_c:.3g} of {step_analysis.COMPUTE_DTYPES[dtype_name]}, u_s = "
            f"{rounding.u_W:.3g} of {dtype_name}, m and v in {step_analysis.COMPUTE_DTYPES[dtype_name]}, inputs rounded to "
            "them, the Gram route with its derived iteration count) plus the reference's (u_c = 2^-53, the SVD route); "
            + step_analysis.step_error_text(output))


def projection_bound(d: int, r: int, dtype_name: str, cond):
    """||stiefel_project_(X) - project_to_manifold(X)||_F for stored values X of condition number cond:
    both compute the polar factor in float64 by LAPACK's SVD (each within polar_svd at cond of the
    exact one: kit/bounds.py), and the class rounds it to its dtype (||E||_F <= u_s ||X||_F = u_s sqrt(r))."""
    from propositions.kit.bounds import polar_error_bound

    u_s = step_analysis.UNIT_ROUNDOFFS[dtype_name] if dtype_name != "float64" else 0.0
    return 2.0 * polar_error_bound(d, r, cond) + u_s * math.sqrt(r)


CHECKS = (
    ("completes", "scenario_completes", "the run ends without an exception where none is expected (0; inf if the class raised)",
     "exact: a correct class raises only where the scenario expects it"),
    ("W", "frame", "||W+_class - W+_ref||_F per frame that must step, its own group's current settings", None),
    ("m", "first_moment", "||transported_moment(W+, m)_class - m+_ref||_F per frame that must step (functional.transported_moment)", None),
    ("v", "second_moment", "|v+_class - v+_ref| per frame that must step", None),
    ("t", "step_count", "the count of every frame in the optimizer after every step against the model's (ulps)", EXACT),
    ("count_dtype", "count_dtype", f"state['step'] of every frame parameter is a {COUNT_DTYPE} tensor with one count per frame (0; inf otherwise)",
     "exact: the documented dtype and shape"),
    ("untouched", "no_gradient_untouched", "a parameter whose .grad is None: parameter and state after the step against before (ulps)", EXACT),
    ("skipped", "nonfinite_frame_untouched", "a frame whose step is not finite, or that is off St(d, r), under skip_nonfinite: frame, m, v "
     "and count against before (ulps)", EXACT),
    ("refused", "refused_step_untouched", "a step with a non-finite frame in a group that does not skip: ValueError, and every parameter, state "
     "and skipped_steps as before (ulps; inf if not refused)", EXACT),
    ("refusal_names", "refusal_names_parameter", "the refusal's message names a parameter at fault as 'params[i] of param group g' (0; inf otherwise)",
     "exact: the documented message"),
    ("skipped_count", "skipped_count", "skipped_steps and off_manifold_steps after every step against the frames and tensors the model "
     "skipped since construction (ulps)", EXACT),
    ("closure", "closure_loss", "the loss step(closure) returns against the closure's own (0 if the same object; else ulps; inf if none, "
     "or if step called the closure other than once); a step without a closure returns None (0; inf otherwise)", EXACT),
    ("ordinary", "euclidean_is_adamw", "every manifold='euclidean' tensor and its state against torch.optim.AdamW with its group's current "
     "settings, skipped whole when not finite under skip_nonfinite (a state AdamW never made taken as its fresh one) (ulps)", EXACT),
    ("round_trip", "checkpoint_round_trip", "after a load: every parameter's state (keys, dtypes, values) and every group's settings against "
     "what was saved, an older-format count expanded to one per frame (ulps; inf for another key or dtype)", EXACT),
    ("projected", "stiefel_project", "||stiefel_project_(X) - project_to_manifold(X)||_F per frame of a projected parameter",
     " ".join(projection_bound.__doc__.split())),
    ("clip", "clip_grad_norm_finite", "clip_grad_norm_finite_ over the param groups: per finite unit (a frame; a whole ordinary tensor) "
     "||G_clipped - c G|| / (c ||G||), c = min(1, max_norm / (total + 1e-6)) from the finite units' exact norms; a unit that is not "
     "finite untouched (ulps)", " ".join(clip_bound.__doc__.split())),
    ("resume", "checkpoints_change_nothing", "the run replayed without the lock-step, with and without its checkpoints: parameters and states at "
     "the end (ulps)", EXACT),
)
BOUNDED = {"W", "m", "v"}  # held to the step analysis; "projected" and "clip" to their own bounds above


def _new_checks(dtype_name: str) -> dict:
    checks = {}
    for key, name, description, derivation in CHECKS:
        if key in BOUNDED:
            derivation = _derivation(dtype_name, key)
        note = ("an exact equality: 0 by design" if derivation == EXACT or derivation.startswith("exact") else
                "units not clipped (c = 1) and units that are not finite are exact equalities: 0 by design" if key == "clip" else None)
        checks[key] = NumericalCheck(f"{dtype_name}/{name}", description, derivation, tightness_note=note)
    return checks


class _Batch:
    """Per-step samples of each check, added to the checks once per step (the worst sample's extra kept)."""

    def __init__(self):
        self.samples: dict = {}

    def add(self, key: str, residual, bound, extra: dict) -> None:
        residual = np.atleast_1d(np.asarray(residual, dtype=np.float64)).ravel()
        bound = np.broadcast_to(np.asarray(bound, dtype=np.float64), residual.shape)
        self.samples.setdefault(key, []).append((residual, bound, extra))

    def flush(self, checks: dict, seed: int, key: tuple) -> None:
        for name, entries in self.samples.items():
            residual = np.concatenate([r for r, _, _ in entries])
            bound = np.concatenate([b for _, b, _ in entries])
            ratio = np.where(np.isnan(residual), np.inf, residual) / bound
            worst, offset = int(np.argmax(ratio)), 0
            for r, _, extra in entries:
                if worst < offset + r.size:
                    break
                offset += r.size
            checks[name].add(residual, bound, key=key, seed=seed, extra=extra)
        self.samples = {}


# --------------------------------------------------------------------------------------------
# Small exact comparisons
# --------------------------------------------------------------------------------------------


def _torch_dtype(name):
    import torch

    return getattr(torch, name)


def _to_numpy(x) -> np.ndarray:
    """A float64 copy (never a view: the class writes its tensors in place)."""
    import torch

    return x.detach().to(device="cpu", dtype=torch.float64, copy=True).numpy()


def _max_ulps(x, y) -> float:
    """max |x - y| / ulp(y) elementwise in float64: 0 when bit-identical (NaN equal to NaN), inf for another shape."""
    x, y = np.asarray(x, dtype=np.float64), np.asarray(y, dtype=np.float64)
    if x.shape != y.shape:
        return math.inf
    if np.array_equal(x, y):  # the usual outcome of an exact comparison: 0 without the ulp arithmetic
        return 0.0
    same = (x == y) | (np.isnan(x) & np.isnan(y))
    with np.errstate(invalid="ignore", over="ignore"):
        ratio = np.where(same, 0.0, np.abs(x - y) / np.spacing(np.abs(y)))
    return float(np.max(np.where(np.isnan(ratio), np.inf, ratio), initial=0.0))


def _state_ulps(state: dict, expected: dict) -> float:
    """The largest ulp distance over every state entry; inf for other keys, dtypes or shapes."""
    import torch

    if set(state) != set(expected):
        return math.inf
    worst = 0.0
    for name, value in expected.items():
        other = state[name]
        if torch.is_tensor(value) != torch.is_tensor(other):
            return math.inf
        if torch.is_tensor(value):
            if value.dtype != other.dtype:
                return math.inf
            worst = max(worst, _max_ulps(_to_numpy(other), _to_numpy(value)))
        else:
            worst = max(worst, _max_ulps(float(other), float(value)))
    return worst


def _snapshot(p, state: dict):
    import torch

    return p.detach().clone(), {k: (v.detach().clone() if torch.is_tensor(v) else copy.deepcopy(v)) for k, v in state.items()}


# --------------------------------------------------------------------------------------------
# The reference model of one frame parameter
# --------------------------------------------------------------------------------------------


class _Frames:
    """The float64 reference of every frame of one parameter: W, the reference state (m transported,
    v, t per frame) and the moment before its transport (what the class's state holds)."""

    def __init__(self, W: np.ndarray):
        self.shape = W.shape
        d, r = W.shape[-2:]
        self.W = np.array(W, dtype=np.float64).reshape(-1, d, r)
        count = self.W.shape[0]
        self.drifted = np.zeros(count, dtype=bool)  # sent off the manifold, not projected back yet
        self.m = np.zeros_like(self.W)
        self.moment_in = np.zeros_like(self.W)
        self.v = np.zeros(count)
        self.t = np.zeros(count, dtype=np.int64)

    def step(self, indices, G: np.ndarray, config, dtype_name: str) -> list:
        """Step frames `indices` from the model's inputs; returns, per count, (indices, W_ref, state_ref,
        moment, q, rounding, inputs): the reference step and what its bound is evaluated from
        (_PendingBounds evaluates the bounds of many steps at once)."""
        d, r = self.W.shape[-2:]
        results = []
        indices = np.asarray(indices, dtype=np.int64)
        rounding = step_analysis.kernel_rounding(dtype_name, config.trust_radius, d, r)
        for t in sorted(set(self.t[indices].tolist())):
            chosen = indices[self.t[indices] == t]
            state = ref.StiefelAdamState(m=self.m[chosen], v=self.v[chosen], t=int(t))
            q = reference_quantities(self.W[chosen], G[chosen], state, config)
            W_ref, state_ref = ref.step(self.W[chosen], G[chosen], state, config)
            transport = transport_roundoff(d, r, rounding.u_c, self.moment_in[chosen])
            moment = reference_moment(self.W[chosen], G[chosen], state, config)
            results.append((chosen, W_ref, state_ref, moment, q, rounding, kernel_inputs(rounding, r, q, transport)))
        return results

    def advance(self, chosen, W_ref, state_ref, moment) -> None:
        self.W[chosen], self.m[chosen], self.v[chosen] = W_ref, state_ref.m, state_ref.v
        self.t[chosen] += 1
        self.moment_in[chosen] = moment


def _joined(values: list, sizes: list) -> np.ndarray:
    """Per-frame values of several steps in one array: a step's scalar (its t, a unit roundoff) is
    repeated for each of its frames."""
    if all(np.ndim(value) == 0 for value in values):
        return np.repeat(np.asarray(values, dtype=np.float64), sizes)
    return np.concatenate([np.full(n, value, dtype=np.float64) if np.ndim(value) == 0 else np.asarray(value, dtype=np.float64).reshape(n)
                           for value, n in zip(values, sizes)])


class _PendingBounds:
    """The W, m and v samples of the steps since the last settle, with what their bounds are evaluated
    from. step_error costs the same for one frame as for hundreds (a few hundred small array
    operations), and a run steps a few frames at a time, so the bounds of all pending steps that share
    (d, r, settings, rounding) are evaluated in one call when the run settles (at its end; after every
    op when a stop predicate watches the checks). Elementwise the same evaluation as one call per step,
    except beta^t: NumPy's array power and Python's scalar one differ by an ulp for a few t (27 of
    t = 1..399 at beta = 0.999), so a bound can move in its last bit; the residuals do not move."""

    QUANTITIES = ("G", "g", "m_old", "m", "v_old", "v", "t", "xi_unclipped", "xi", "A", "A_2", "sigma_min")

    def __init__(self):
        self.groups: dict = {}

    def add(self, key: tuple, q: dict, inputs, residuals: dict, extra: dict, frames) -> None:
        self.groups.setdefault(key, []).append((q, inputs, residuals, extra, frames))

    def settle(self, batch: "_Batch", undefined: list) -> None:
        """Every pending sample into `batch`, with its bound; frames whose step is not well posed at the
        kernel's rounding (docs/algorithm.md#pitfalls) get no W or m sample and go to `undefined`."""
        for (d, r, config, rounding), items in self.groups.items():
            sizes = [len(frames) for *_, frames in items]
            q = {name: _joined([item[0][name] for item in items], sizes) for name in self.QUANTITIES}
            inputs = step_analysis.InputErrors(**{field_name: _joined([getattr(item[1], field_name) for item in items], sizes)
                                                  for field_name in ("W", "G_rel", "m", "v")})
            bound = step_error_bound(d, r, config, q, rounding, inputs)
            offset = 0
            for (_, _, residuals, extra, frames), n in zip(items, sizes):
                part = slice(offset, offset + n)
                offset += n
                posed = np.asarray(bound["well_posed"][part], dtype=bool)
                if posed.any():
                    batch.add("W", residuals["W"][posed], bound["W"][part][posed], extra)
                    batch.add("m", residuals["m"][posed], bound["m"][part][posed], extra)
                for k in np.asarray(frames)[~posed]:  # no bound where sqrt(v^) + eps is not above its error
                    undefined.append({**{k_: v_ for k_, v_ in extra.items() if k_ != "frames"}, "frame": int(k)})
                batch.add("v", residuals["v"], bound["v"][part], extra)
        self.groups = {}


# --------------------------------------------------------------------------------------------
# One run of a scenario
# --------------------------------------------------------------------------------------------


@dataclass
class Subject:
    """What is under test: the optimizer class and the public functions users call beside it
    (functional.transported_moment, clip_grad_norm_finite_, stiefel_init_, stiefel_project_)."""

    optimizer_class: type
    transported_moment: object
    clip: object = None
    init: object = None
    project: object = None
    name: str = REAL_OPTIMIZER
    kernel: object = None  # functional.stiefel_adam_step, whose sync_free route the promises part compares
    # torch_impl.functional (or a namespace of its names): the rules its docstrings state (the route test of
    # ||g||^2, the drift bound, the Newton-Schulz count) and polar_retract, which the promises part holds to them
    functional: object = None


def real_subject() -> Subject:
    import torch_impl
    from torch_impl.functional import stiefel_adam_step, transported_moment

    return Subject(torch_impl.StiefelAdam, transported_moment, torch_impl.clip_grad_norm_finite_, torch_impl.stiefel_init_,
                   torch_impl.stiefel_project_, kernel=stiefel_adam_step, functional=torch_impl.functional)


def _overflow_exponent(dtype_name: str) -> int:
    """2^k per entry overflows the square of the gradient in the compute dtype: k = 0.6 emax
    (squares reach 2^(1.2 emax) > max), the entries themselves stay finite in the storage dtype."""
    compute = step_analysis.COMPUTE_DTYPES[dtype_name]
    emax = {"float64": 1024, "float32": 128}[compute]
    return int(0.6 * emax)


class _RunLayout:
    """The job of building a scenario's run: its parameters and initial frames, the optimizer under test
    and the torch.optim.AdamW twin of its ordinary groups, the groups added later, and the drawn
    gradients with their planted events. ScenarioRun's attributes (scenario, seed, subject, params,
    active, lr, optimizer, twin, twin_params) are set by its constructor."""

    # construction -------------------------------------------------------------------------

    def _initial(self, group, p, shape) -> np.ndarray:
        rng = rng_for(self.seed, CLAIM_ID, "initial", self.dtype_name, self.scenario.label, group.name, p, *shape)
        if group.frames:
            return ref.random_point(shape[-2], shape[-1], rng, tuple(shape[:-2]))
        return rng.standard_normal(shape)

    def _group_options(self, name: str) -> dict:
        group = self.scenario.group(name)
        params = [self.params[(name, p)] for p in range(len(group.shapes))]
        options = group.settings.as_options()
        if group.frames:
            return {"params": params, **options}
        options.pop("trust_radius")
        return {"params": params, "manifold": "euclidean", **options}

    def _build(self, names):
        groups = [self._group_options(name) for name in names]
        return self.subject.optimizer_class(groups, lr=1e-3)

    def _build_twin(self):
        import torch

        twin_params = {key: torch.nn.Parameter(p.detach().clone()) for key, p in self.params.items()
                       if not self.scenario.group(key[0]).frames}
        groups = [self._twin_group(name, twin_params) for name in self.active if not self.scenario.group(name).frames]
        return (torch.optim.AdamW(groups) if groups else None), twin_params

    def _twin_group(self, name, twin_params) -> dict:
        import torch

        group = self.scenario.group(name)
        s = group.settings
        lr = torch.tensor(self.lr[name], dtype=torch.float64) if s.lr_tensor else self.lr[name]
        return {"params": [twin_params[(name, p)] for p in range(len(group.shapes))], "lr": lr, "betas": s.betas,
                "eps": s.eps, "weight_decay": s.weight_decay}

    # draws --------------------------------------------------------------------------------

    def gradient(self, op, plan: StepPlan, key) -> np.ndarray | None:
        """The float64 gradient of parameter `key` at a step-like op, with its events planted (None: no gradient)."""
        kind = plan.gradients[key]
        if kind is None:
            return None
        group, p = key
        shape = self.scenario.group(group).shapes[p]
        if kind == "zero":
            return np.zeros(shape)
        G = rng_for(self.seed, CLAIM_ID, "gradient", self.dtype_name, self.scenario.label, op.id, group, p, *shape).standard_normal(shape)
        frames = self.scenario.group(group).frames
        view = G.reshape((-1,) + tuple(shape[-2:])) if frames else G.reshape(1, -1)
        for event in plan.events.get(key, ()):
            target = view[event.frame].reshape(-1)
            if event.kind == "nan":
                target[event.entry] = np.nan
            elif event.kind == "inf":
                target[event.entry] = -np.inf if event.entry % 2 else np.inf
            elif event.kind == "overflow":
                view[event.frame] *= 2.0 ** _overflow_exponent(self.dtype_name)
            elif event.kind == "zero":
                view[event.frame] = 0.0
        return G

    def _add_group(self, name: str) -> None:
        self.optimizer.add_param_group(self._group_options(name))
        self.active.append(name)
        if not self.scenario.group(name).frames:
            group = self._twin_group(name, self.twin_params)
            if self.twin is None:
                import torch

                self.twin = torch.optim.AdamW([group])
            else:
                self.twin.add_param_group(group)


    def _live_params(self):
        for name in self.active:
            for p in range(len(self.scenario.group(name).shapes)):
                yield (name, p), self.params[(name, p)]


class _RunOperations:
    """The job of carrying out each operation of the grammar on the optimizer under test: schedules,
    checkpoints and their loads, projections, steps (plain, with a closure, after a clip, after
    zero_grad), the planted drift of frames, and keeping the float64 model in lock-step (ScenarioRun
    holds the state, _RunComparisons the comparisons each operation hands its results to)."""

    def _schedule(self, factor) -> None:
        """A MultiplicativeLR step: every lr times `factor`, or (a dict) each named group's times its
        own factor and the others' times 1 (one lr_lambda per param group, in the groups' order)."""
        import torch

        factors = {name: (factor.get(name, 1.0) if isinstance(factor, dict) else factor) for name in self.active}
        lambdas = [lambda _, f=factors[name]: f for name in self.active]
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # "lr_scheduler.step() before optimizer.step()": intended here
            scheduler = torch.optim.lr_scheduler.MultiplicativeLR(self.optimizer, lr_lambda=lambdas)
            scheduler.step()
        for name in self.active:
            self.lr[name] = self.lr[name] * factors[name]
        if self.twin is not None:
            ordinary = [name for name in self.active if not self.scenario.group(name).frames]
            for name, group in zip(ordinary, self.twin.param_groups):
                if torch.is_tensor(group["lr"]):
                    group["lr"].mul_(factors[name])  # as the scheduler updates a tensor lr: in place, in float64
                else:
                    group["lr"] = group["lr"] * factors[name]

    def _checkpoint(self, op, plan, checks) -> None:
        """Save and load (op.option: fresh, same, old_format); the loaded state must equal the saved.
        While a frame is off the manifold the load (or the fresh instance's constructor) must refuse
        it with a ValueError and change nothing."""
        saved = copy.deepcopy(self.optimizer.state_dict())
        before = {key: _snapshot(p, self.optimizer.state[p])[1] for key, p in self._live_params()}
        groups_before = [{k: v for k, v in g.items() if k != "params"} for g in self.optimizer.param_groups]
        try:
            self._load(op, saved)
            refused = False
        except ValueError:
            if not plan.refused:
                raise
            refused = True
        if checks is None:
            return
        batch = _Batch()
        if plan.refused:
            batch.add("round_trip", 0.0 if refused else math.inf, 0.5, {"op": op.id, "checkpoint": op.option, "expected": "refused: a frame off St"})
        for key, p in self._live_params():
            batch.add("round_trip", _state_ulps(self.optimizer.state[p], before[key]), 0.5,
                      {"op": op.id, "checkpoint": op.option, "parameter": f"{key[0]}.{key[1]}"})
        groups_after = [{k: v for k, v in g.items() if k != "params"} for g in self.optimizer.param_groups]
        mismatched = [i for i, (a, b) in enumerate(zip(groups_after, groups_before)) if a != b] + (
            [-1] if len(groups_after) != len(groups_before) else [])
        batch.add("round_trip", math.inf if mismatched else 0.0, 0.5, {"op": op.id, "checkpoint": op.option, "groups_differ": mismatched})
        batch.flush(checks, self.seed, self.key)

    def _load(self, op, saved: dict) -> None:
        if op.option == "same":
            self.optimizer.load_state_dict(saved)
            return
        if op.option == "old_format":
            saved = _older_format(saved, self.optimizer)
        params = {key: _cloned(p) for key, p in self.params.items()}
        kept, self.params = self.params, params
        try:
            fresh = self.subject.optimizer_class([self._group_options(name) for name in self.active], lr=1e-3)
            fresh.load_state_dict(saved)
        except ValueError:
            self.params = kept
            raise
        self.optimizer = fresh
        self.skipped = self.off_manifold = 0  # the counters count since construction

    def _project(self, op, checks) -> None:
        """torch_impl.stiefel_project_ on one parameter: every frame against the nearest frame of its
        stored values (reference_impl.project_to_manifold of them, float64); the model's frames that
        were off the manifold go back to the nearest frame."""
        key = tuple(op.option)
        p = self.params[key]
        d, r = p.shape[-2:]
        stored = _to_numpy(p).reshape(-1, d, r)
        self.subject.project(p.data)
        model = self.models[key]
        if model.drifted.any():
            # the frame moved: the moment the class holds is transported to the new frame by the next
            # step's projection (docs/algorithm.md, stage 8), so the model's m+ is P_W(m) at the new W
            moved = model.drifted
            model.W[moved] = ref.project_to_manifold(model.W[moved])
            model.m[moved] = ref.project_tangent(model.W[moved], model.moment_in[moved])
            model.drifted[:] = False
        if checks is None:
            return
        expected = ref.project_to_manifold(stored)
        singular = np.linalg.svd(stored, compute_uv=False)
        bound = projection_bound(d, r, self.dtype_name, singular[:, 0] / singular[:, -1])
        batch = _Batch()
        batch.add("projected", ref.frobenius(_to_numpy(p).reshape(-1, d, r) - expected), bound, {"op": op.id, "parameter": f"{key[0]}.{key[1]}"})
        batch.flush(checks, self.seed, self.key)

    # a step ---------------------------------------------------------------------------------

    def _step(self, op, plan: StepPlan, checks) -> None:
        import torch

        gradients = {key: self.gradient(op, plan, key) for key in plan.gradients}
        if op.kind in ("step", "clip_step"):
            for key, G in gradients.items():
                p = self.params[key]
                p.grad = None if G is None else torch.tensor(G, dtype=self.dtype, device=self.device)
        if checks is not None:
            self._set_inputs()
        self._drift(plan, lockstep=checks is not None)
        if op.kind == "clip_step":
            gradients = self._clip(op, plan, checks)
        before = {key: _snapshot(p, self.optimizer.state[p]) for key, p in self._live_params()}
        skipped_before = self.subject_counts()
        closure = self._closure(gradients) if op.kind == "closure_step" else None
        raised = None
        try:
            if op.kind == "zero_grad":
                self.optimizer.zero_grad(set_to_none=bool(op.option))
            loss = self.optimizer.step(closure) if closure is not None else self.optimizer.step()
        except ValueError as error:
            if not plan.refused:
                raise
            raised = error
        if plan.refused:
            if checks is not None:
                self._compare_refused(op, plan, before, skipped_before, raised, checks)
            return
        self._step_twin(plan, gradients)
        self.skipped += sum(1 for what in plan.frames.values() if what == "skip") + sum(1 for what in plan.euclidean.values() if what == "skip")
        self.off_manifold += sum(1 for what in plan.frames.values() if what == "off")
        if checks is None:
            return
        batch = _Batch()
        if closure is not None:
            # once, as torch.optim's steps do: a second call is a second forward and backward, which a
            # closure that draws (dropout) or accumulates would see, though a deterministic one returns
            # an equal loss and leaves equal gradients
            batch.add("closure", _closure_ulps(loss, closure.loss) if closure.calls == 1 else math.inf, 0.5,
                      {"op": op.id, "closure_calls": closure.calls})
        else:  # torch.optim's contract: the closure's loss, else None
            batch.add("closure", 0.0 if loss is None else math.inf, 0.5, {"op": op.id, "returned": None if loss is None else repr(loss)[:40]})
        for key, p in self._live_params():
            group = self.scenario.group(key[0])
            if group.frames:
                self._compare_frames(op, plan, key, gradients[key], before[key], batch)
            else:
                self._compare_euclidean(op, key, batch)
        counts = self.subject_counts()
        batch.add("skipped_count", max(_max_ulps(counts[0], self.skipped), _max_ulps(counts[1], self.off_manifold)), 0.5,
                  {"op": op.id, "expected": [self.skipped, self.off_manifold], "counted": list(counts)})
        batch.flush(checks, self.seed, self.key)

    def subject_counts(self) -> tuple:
        """(skipped_steps, off_manifold_steps) of the class (reading them waits for the device)."""
        return int(self.optimizer.skipped_steps), int(getattr(self.optimizer, "off_manifold_steps", 0))

    def _drift(self, plan: StepPlan, lockstep: bool) -> None:
        """off_manifold events: the frame W becomes (1 + DRIFT) W + E in place, E Gaussian of Frobenius
        norm about DRIFT (drawn from the op's key: a scaled frame alone would have the same polar and QR
        factors), the model's too (it stays so, and is not stepped, until a project op)."""
        import torch

        for (name, p), planted in plan.events.items():
            for event in planted:
                if event.kind != "off_manifold":
                    continue
                param = self.params[(name, p)]
                d, r = param.shape[-2:]
                frames = param.data.view(-1, d, r)
                noise = rng_for(self.seed, CLAIM_ID, "drift", self.dtype_name, self.scenario.label, plan.op.id, name, p, event.frame)
                E = noise.standard_normal((d, r)) * (grammar.DRIFT / math.sqrt(d * r))
                if lockstep:
                    model = self.models[(name, p)]
                    model.W[event.frame] = (1.0 + grammar.DRIFT) * model.W[event.frame] + E
                    model.drifted[event.frame] = True
                    frames[event.frame].copy_(torch.from_numpy(model.W[event.frame]).to(dtype=self.dtype, device=self.device))
                else:
                    moved = (1.0 + grammar.DRIFT) * _to_numpy(frames[event.frame]) + E
                    frames[event.frame].copy_(torch.from_numpy(moved).to(dtype=self.dtype, device=self.device))

    def _clip(self, op, plan: StepPlan, checks) -> dict:
        """clip_grad_norm_finite_ over the optimizer's param groups, against c G from the exact norms
        of the gradients the class holds; returns the gradients the step then sees (float64)."""
        held = {key: (None if self.params[key].grad is None else _to_numpy(self.params[key].grad)) for key in plan.gradients}
        max_norm, norm_type = grammar.clip_option(op.option)
        self.subject.clip(self.optimizer.param_groups, max_norm, norm_type=norm_type)
        after = {key: (None if self.params[key].grad is None else _to_numpy(self.params[key].grad)) for key in plan.gradients}
        if checks is None:
            return after
        units = {key: _units(G, self.scenario.group(key[0]).frames) for key, G in held.items() if G is not None}
        clipped = {key: _units(after[key], self.scenario.group(key[0]).frames) for key in units}
        batch = _Batch()
        clip_samples(units, clipped, max_norm, self.dtype_name, batch, {"op": op.id, "norm_type": norm_type}, norm_type)
        batch.flush(checks, self.seed, self.key)
        return after

    def _closure(self, gradients: dict):
        """loss = sum_p <p, G_p> over the parameters with a drawn gradient: backward leaves p.grad = G_p
        (rounded to p's dtype); a no_grad event sets its .grad back to None after backward."""
        import torch

        def closure():
            self.optimizer.zero_grad()
            loss = torch.zeros((), dtype=torch.float64, device=self.device)
            for key, G in gradients.items():
                if G is not None:
                    p = self.params[key]
                    loss = loss + (p * torch.tensor(G, dtype=self.dtype, device=self.device)).sum().to(torch.float64)
            if loss.requires_grad:  # every parameter may be without a gradient in this step
                loss.backward()
            for key, G in gradients.items():
                if G is None:
                    self.params[key].grad = None
            closure.loss = loss
            closure.calls += 1
            return loss

        closure.calls = 0
        return closure

    def _set_inputs(self) -> None:
        """Lock-step: every frame in the optimizer and its state set to the model's, rounded (in place)."""
        import torch

        for key, p in self._live_params():
            model = self.models.get(key)
            if model is None:
                continue
            p.data.copy_(torch.from_numpy(model.W.reshape(p.shape)).to(device=self.device, dtype=self.dtype))
            state = self.optimizer.state[p]
            if len(state):
                state["exp_avg"].copy_(torch.from_numpy(model.moment_in.reshape(p.shape)).to(device=self.device, dtype=self.state_dtype))
                state["exp_avg_sq"].copy_(torch.from_numpy(model.v.reshape(p.shape[:-2])).to(device=self.device, dtype=self.state_dtype))


class _RunComparisons:
    """The job of holding what an operation did to the model: a refused step left everything as it
    was, each stepped frame against the float64 reference step within its bound, each ordinary tensor
    against the AdamW twin bit for bit, and the final values that the free runs compare."""

    def _compare_refused(self, op, plan, before, skipped_before, raised, checks) -> None:
        batch = _Batch()
        unchanged = max((max(_max_ulps(_to_numpy(p), _to_numpy(before[key][0])), _state_ulps(self.optimizer.state[p], before[key][1]))
                         for key, p in self._live_params()), default=0.0)
        unchanged = max(unchanged, _max_ulps(np.array(self.subject_counts(), dtype=float), np.array(skipped_before, dtype=float)))
        batch.add("refused", unchanged if raised is not None else math.inf, 0.5, {"op": op.id})
        names = {f"params[{p}] of param group {self._group_position(g)}" for g, p in plan.offenders}
        named = raised is not None and any(name in str(raised) for name in names)
        batch.add("refusal_names", 0.0 if named else math.inf, 0.5,
                  {"op": op.id, "message": str(raised).splitlines()[0] if raised is not None else None, "expected_one_of": sorted(names)})
        batch.flush(checks, self.seed, self.key)

    def _group_position(self, scenario_index: int) -> int:
        """The param group index of the scenario's group number `scenario_index` in the optimizer."""
        return self.active.index(self.scenario.groups[scenario_index].name)

    def _compare_frames(self, op, plan, key, G, before, batch: _Batch) -> None:
        import torch

        p = self.params[key]
        model = self.models[key]
        state = self.optimizer.state[p]
        extra = {"op": op.id, "parameter": f"{key[0]}.{key[1]}"}
        frames = model.W.shape[0]
        counts = state.get("step")
        good_counts = torch.is_tensor(counts) and str(counts.dtype) == f"torch.{COUNT_DTYPE}" and tuple(counts.shape) == tuple(p.shape[:-2])
        if len(state):
            batch.add("count_dtype", 0.0 if good_counts else math.inf, 0.5, {**extra, "dtype": str(getattr(counts, "dtype", type(counts)))})
        what = [plan.frames[(key[0], key[1], k)] for k in range(frames)]
        stepping = [k for k in range(frames) if what[k] == "step"]
        W_before, state_before = before
        d, r = model.W.shape[-2:]
        W_now = _to_numpy(p).reshape(-1, d, r)
        W_then = _to_numpy(W_before).reshape(-1, d, r) if len(stepping) < frames else None
        for k in range(frames):
            if what[k] == "step":
                continue
            residual = _max_ulps(W_now[k], W_then[k])
            if len(state_before):
                residual = max(residual, _frame_state_ulps(state, state_before, k, d, r))
            elif len(state):  # a first step that is skipped must not leave a state behind with a count
                residual = max(residual, _max_ulps(_to_numpy(state["step"]).reshape(-1)[k], 0.0))
            batch.add("skipped" if what[k] in ("skip", "off") else "untouched", residual, 0.5, {**extra, "frame": k, "kept": what[k]})
        if stepping:
            self._compare_stepped(key, G, stepping, extra, batch)
        if len(state) or stepping:
            counts_now = _to_numpy(state["step"]).reshape(-1) if "step" in state else np.zeros(frames)
            batch.add("t", [_max_ulps(c, t) for c, t in zip(counts_now, model.t)], 0.5, extra)

    def _compare_stepped(self, key, G, stepping, extra, batch: _Batch) -> None:
        p = self.params[key]
        model = self.models[key]
        state = self.optimizer.state[p]
        d, r = model.W.shape[-2:]
        if not {"exp_avg", "exp_avg_sq", "step"} <= set(state):
            batch.add("W", math.inf, 1.0, {**extra, "state_keys": sorted(state)})  # a frame that must step left no state
            return
        config = self._config(key[0])
        G_frames = G.reshape(-1, d, r)
        W_new = _to_numpy(p).reshape(-1, d, r)
        m_new = _to_numpy(self.subject.transported_moment(p.detach().to(state["exp_avg"].dtype), state["exp_avg"])).reshape(-1, d, r)
        v_new = _to_numpy(state["exp_avg_sq"]).reshape(-1)
        for chosen, W_ref, state_ref, moment, q, rounding, inputs in model.step(stepping, G_frames, config, self.dtype_name):
            residuals = {"W": ref.frobenius(W_new[chosen] - W_ref), "m": ref.frobenius(m_new[chosen] - state_ref.m),
                         "v": np.abs(v_new[chosen] - state_ref.v)}
            self.pending.add((d, r, config, rounding), q, inputs, residuals,
                             {**extra, "frames": chosen.tolist(), "t": int(state_ref.t)}, chosen)
            model.advance(chosen, W_ref, state_ref, moment)
            self.stepped += len(chosen)

    def _config(self, name: str) -> ref.StiefelAdamConfig:
        s = self.scenario.group(name).settings
        return ref.StiefelAdamConfig(lr=self.lr[name], betas=s.betas, eps=s.eps, trust_radius=s.trust_radius, weight_decay=s.weight_decay)

    def _step_twin(self, plan: StepPlan, gradients: dict) -> None:
        """AdamW over the twins with the gradients the class was given (rounded to the dtype); a
        tensor the class must skip or keep gets no gradient, so AdamW leaves it and its count."""
        import torch

        if self.twin is None:
            return
        for key, twin in self.twin_params.items():
            G = gradients.get(key)
            twin.grad = (torch.tensor(G, dtype=self.dtype, device=self.device)
                         if plan.euclidean.get(key) == "step" and G is not None else None)
        self.twin.step()

    def _compare_euclidean(self, op, key, batch: _Batch) -> None:
        import torch

        p, twin = self.params[key], self.twin_params[key]
        expected = self.twin.state[twin]
        if not expected and self.optimizer.state[p]:
            # AdamW keeps no state for a tensor it never stepped; a fresh state (count 0, zero moments)
            # is the same for its next step
            expected = {"step": torch.tensor(0.0), "exp_avg": torch.zeros_like(twin), "exp_avg_sq": torch.zeros_like(twin)}
        residual = max(_max_ulps(_to_numpy(p), _to_numpy(twin)), _state_ulps(self.optimizer.state[p], expected))
        batch.add("ordinary", residual, 0.5, {"op": op.id, "parameter": f"{key[0]}.{key[1]}"})

    def final_values(self) -> dict:
        """Every parameter and state at the end (float64 copies): what the free runs compare."""
        out = {}
        for key, p in self.params.items():
            state = self.optimizer.state[p] if key[0] in self.active else {}
            out[key] = (_to_numpy(p), {k: (str(v.dtype), _to_numpy(v)) if hasattr(v, "dtype") else (type(v).__name__, np.asarray(float(v)))
                                       for k, v in state.items()})
        return out


class ScenarioRun(_RunLayout, _RunOperations, _RunComparisons):
    """One scenario against one Subject, lock-step against the float64 model (module docstring).

    lockstep=False runs the class alone (no model, no checks): the free runs of the resume check."""

    def __init__(self, scenario: Scenario, seed: int, subject: Subject, device: str = "cpu", lockstep: bool = True):
        import torch

        self.scenario, self.seed, self.subject, self.device, self.lockstep = scenario, seed, subject, device, lockstep
        self.dtype_name = scenario.dtype
        self.dtype = _torch_dtype(scenario.dtype)
        self.state_dtype = _torch_dtype(step_analysis.COMPUTE_DTYPES[scenario.dtype])
        self.key = (CLAIM_ID, scenario.dtype, scenario.label)
        self.params: dict = {}
        self.models: dict = {}
        for group in scenario.groups:
            for p, shape in enumerate(group.shapes):
                initial = self._initial(group, p, shape)
                self.params[(group.name, p)] = torch.nn.Parameter(torch.tensor(initial, dtype=self.dtype, device=device))
                if group.frames:
                    self.models[(group.name, p)] = _Frames(initial)
        self.active = [g.name for g in scenario.groups if not g.late]
        self.lr = {g.name: g.settings.lr for g in scenario.groups}
        self.skipped = self.off_manifold = 0
        self.stepped = 0
        self.optimizer = self._build(self.active)
        self.twin, self.twin_params = self._build_twin()
        self.undefined: list = []
        self.pending = _PendingBounds()

    # the run --------------------------------------------------------------------------------

    def run(self, checks: dict | None, coverage: dict | None, stop=None) -> bool:
        """Every op of the scenario; with checks, lock-step comparisons after each step. stop: a
        predicate on the checks, asked after each op; the run ends there when it holds. Returns
        whether every op ran."""
        with np.errstate(over="ignore", invalid="ignore"):  # the model meets the overflowing gradients too
            return self._run(checks, coverage, stop)

    def _run(self, checks, coverage, stop=None) -> bool:
        try:
            return self._ops(checks, coverage, stop)
        finally:
            self.settle(checks)

    def settle(self, checks) -> None:
        """The pending steps' samples into the checks (_PendingBounds)."""
        if checks is None or not self.pending.groups:
            return
        batch = _Batch()
        self.pending.settle(batch, self.undefined)
        batch.flush(checks, self.seed, self.key)

    def _ops(self, checks, coverage, stop=None) -> bool:
        for op, plan in grammar.walk(self.scenario):
            if stop is not None:
                self.settle(checks)
                if stop(checks):
                    return False
            if coverage is not None:
                for name in plan.features:
                    coverage[name] = coverage.get(name, 0) + 1
            if op.kind == "add_group":
                self._add_group(op.option)
            elif op.kind == "schedule":
                self._schedule(op.option)
            elif op.kind == "schedule_groups":
                self._schedule(dict(op.option))
            elif op.kind == "checkpoint":
                self._checkpoint(op, plan, checks)
            elif op.kind == "project":
                self._project(op, checks)
            else:
                self._step(op, plan, checks)
        return True



def _cloned(p):
    """A new parameter object with p's value and gradient (what a resume from a checkpoint rebuilds)."""
    import torch

    clone = torch.nn.Parameter(p.detach().clone())
    clone.grad = None if p.grad is None else p.grad.detach().clone()
    return clone


def _units(G: np.ndarray, frames: bool) -> list:
    """The clip units of one gradient (float64 values of its dtype): its frames, or the whole tensor."""
    return list(G.reshape((-1, G.shape[-2] * G.shape[-1])) if frames else G.reshape(1, -1))


def _p_norm(values, p: float) -> float:
    """The p-norm of nonnegative or signed values (p >= 1 or inf), scaled so that no power overflows."""
    magnitudes = np.abs(np.asarray(values, dtype=np.float64)).ravel()
    scale = float(np.max(magnitudes)) if magnitudes.size else 0.0
    if scale == 0.0 or math.isinf(p):
        return scale
    return scale * math.fsum((magnitudes / scale) ** p) ** (1.0 / p)


def _unit_norm(values: np.ndarray, dtype_name: str, p: float = 2.0):
    """The exact p-norm of one unit, or None where it is not finite: a NaN or inf entry, or a sum of
    p-th powers beyond the largest number of the dtype the norm is accumulated in (float64 for float64,
    else float32: an overflowing gradient is left to the optimizer, which skips its step; a maximum,
    the inf-norm, never overflows)."""
    if not np.all(np.isfinite(values)):
        return None
    norm = _p_norm(values, p)
    if norm == 0.0 or math.isinf(p):
        return norm
    largest = np.finfo(np.float64 if dtype_name == "float64" else np.float32).max
    return norm if p * math.log2(norm) < math.log2(largest) else None


def clip_samples(units: dict, clipped: dict, max_norm: float, dtype_name: str, batch: "_Batch", extra: dict, norm_type: float = 2.0) -> None:
    """The clip check: units / clipped map a tensor to its units before / after clip_grad_norm_finite_;
    c = min(1, max_norm / (total + 1e-6)) from the exact norm_type-norms of the finite units (the total
    their norm_type-norm). A finite unit's relative distance to c G against clip_bound, exact where
    c = 1 or G = 0; a unit that is not finite untouched."""
    norms = {key: [_unit_norm(values, dtype_name, norm_type) for values in pieces] for key, pieces in units.items()}
    finite = [n for ns in norms.values() for n in ns if n is not None]
    total = _p_norm(finite, norm_type)
    c = min(1.0, max_norm / (total + 1e-6))
    bound = clip_bound(max((values.size for pieces in units.values() for values in pieces), default=1), len(finite), dtype_name)
    for key, pieces in units.items():
        for index, (values, norm) in enumerate(zip(pieces, norms[key])):
            where = {**extra, "tensor": str(key), "unit": index, "coefficient": c}
            after = clipped[key][index]
            if norm is None or norm == 0.0 or c == 1.0:  # untouched: exactly
                batch.add("clip", _max_ulps(after, values), 0.5, {**where, "finite": norm is not None})
            else:
                batch.add("clip", np.linalg.norm(after - c * values) / (c * norm), bound, where)


def _frame_state_ulps(state: dict, before: dict, k: int, d: int, r: int) -> float:
    """ulps between frame k's m, v and count now and before."""
    worst = 0.0
    for name, shape in (("exp_avg", (-1, d, r)), ("exp_avg_sq", (-1,)), ("step", (-1,))):
        if name not in state or name not in before:
            return math.inf
        worst = max(worst, _max_ulps(_to_numpy(state[name]).reshape(shape)[k], _to_numpy(before[name]).reshape(shape)[k]))
    return worst


def _closure_ulps(returned, expected) -> float:
    import torch

    if returned is expected:
        return 0.0
    if not torch.is_tensor(returned):
        return math.inf
    return _max_ulps(_to_numpy(returned), _to_numpy(expected))




# --------------------------------------------------------------------------------------------
# A run with its checks, the free runs, coverage
# --------------------------------------------------------------------------------------------


@dataclass
class RunOutcome:
    checks: dict
    coverage: dict
    stepped: int
    undefined: list = field(default_factory=list)
    raised: str | None = None

    def failing(self) -> list[str]:
        """Names of the checks this run fails (in CHECKS order)."""
        return [c.name for c in self.checks.values() if c.samples and not c.passed]


def run_scenario(scenario: Scenario, seed: int, subject: Subject | None = None, device: str = "cpu", stop=None) -> RunOutcome:
    """One scenario against the subject (default the real class): its checks, coverage and frames
    stepped. stop: a predicate on the checks (ScenarioRun.run); where it ends the run, the resume
    check and scenario_completes are not asked (a control's verdict is decided there)."""
    subject = subject or real_subject()
    checks = _new_checks(scenario.dtype)
    coverage = {name: 1 for name in grammar.layout_features(scenario)}
    run = None
    try:
        run = ScenarioRun(scenario, seed, subject, device)
        if not run.run(checks, coverage, stop) or (stop is not None and stop(checks)):
            return RunOutcome(checks, coverage, run.stepped, run.undefined, None)
        _resume_check(scenario, seed, subject, device, checks["resume"])
        checks["completes"].add([0.0], 0.5)
        raised = None
    except Exception as error:  # a class that raises where the scenario expects nothing fails scenario_completes
        message = str(error).splitlines()[0] if str(error) else ""
        raised = f"{type(error).__name__}: {message}"
        checks["completes"].add([math.inf], 0.5, key=(CLAIM_ID, scenario.dtype, scenario.label), seed=seed,
                                extra={"raised": raised, "raised_at": _where(error)})
    return RunOutcome(checks, coverage, run.stepped if run else 0, run.undefined if run else [], raised)


def _where(error: BaseException) -> str:
    """file:line of the innermost frame that raised (the class's, or the claim's own if it broke)."""
    import traceback

    frames = traceback.extract_tb(error.__traceback__)
    if not frames:
        return "?"
    parts = frames[-1].filename.replace("\\", "/").split("/")
    return "/".join(parts[-2:]) + f":{frames[-1].lineno}"


def _resume_check(scenario: Scenario, seed: int, subject: Subject, device: str, check: NumericalCheck) -> None:
    """The run without the lock-step, with and without its checkpoints: the ends must be bit for bit the same."""
    if not any(op.kind == "checkpoint" for op in scenario.ops):
        return
    plain = grammar.without_ops(scenario, {i for i, op in enumerate(scenario.ops) if op.kind == "checkpoint"})
    ends = []
    for variant in (scenario, plain):
        run = ScenarioRun(variant, seed, subject, device, lockstep=False)
        run.run(None, None)
        ends.append(run.final_values())
    residual = 0.0
    for key, (value, state) in ends[0].items():
        other_value, other_state = ends[1][key]
        residual = max(residual, _max_ulps(value, other_value))
        if set(state) != set(other_state) or any(state[k][0] != other_state[k][0] for k in state):
            residual = math.inf
            continue
        for k in state:
            residual = max(residual, _max_ulps(state[k][1], other_state[k][1]))
    check.add([residual], 0.5, key=(CLAIM_ID, scenario.dtype, scenario.label), seed=seed,
              extra={"checkpoints": [op.option for op in scenario.ops if op.kind == "checkpoint"]})


# --------------------------------------------------------------------------------------------
# Shrinking
# --------------------------------------------------------------------------------------------


@dataclass
class Shrunk:
    scenario: Scenario
    check: str
    replays: int
    complete: bool
    seconds: float


def shrink(scenario: Scenario, seed: int, check: str, subject: Subject | None = None, device: str = "cpu") -> Shrunk:
    """The shortest operation sequence and smallest layout, from `scenario`, that still fails `check`.

    Deterministic: the shortest failing prefix first (bisection), then ops removed in halving chunks
    from the end, then events removed, then the layout simplified (a group, a parameter, a leading
    axis or a frame fewer, a smaller frame), repeated until nothing simpler fails or the budget
    (MAX_REPLAYS replays, MAX_SHRINK_SECONDS) is spent."""
    subject = subject or real_subject()
    started, replays = time.perf_counter(), 0

    def fails(candidate: Scenario) -> bool:
        nonlocal replays
        replays += 1
        return check in run_scenario(candidate, seed, subject, device).failing()

    def budget() -> bool:
        return replays < MAX_REPLAYS and time.perf_counter() - started < MAX_SHRINK_SECONDS

    best = _shortest_prefix(scenario, fails)
    exhausted = False
    while not exhausted:
        for candidate in _candidates(best):
            if not budget():
                exhausted = True
                break
            if candidate.size() < best.size() and fails(candidate):
                best = candidate
                break
        else:  # no simpler candidate fails: minimal in the order of _candidates
            break
    return Shrunk(best, check, replays, not exhausted, time.perf_counter() - started)


def _shortest_prefix(scenario: Scenario, fails) -> Scenario:
    low, high = 1, len(scenario.ops)
    while low < high:
        middle = (low + high) // 2
        if fails(replace(scenario, ops=scenario.ops[:middle])):
            high = middle
        else:
            low = middle + 1
    return replace(scenario, ops=scenario.ops[:high])


def _candidates(scenario: Scenario):
    """Simpler scenarios in the order they are tried: chunks of ops, single ops, events, the layout."""
    count = len(scenario.ops)
    size = count // 2
    while size >= 1:
        for start in range(count - size, -1, -size):
            yield _cleaned(grammar.without_ops(scenario, set(range(start, start + size))))
        size //= 2
    yield from (_cleaned(s) for s in grammar.simpler_events(scenario))
    yield from (_cleaned(s) for s in grammar.simpler_layouts(scenario))


def _cleaned(scenario: Scenario) -> Scenario:
    """Drop add_group ops of groups that are not late, and events of parameters that no longer exist."""
    late = {g.name for g in scenario.groups if g.late}
    names = {g.name: len(g.shapes) for g in scenario.groups}
    ops = tuple(replace(op, events=tuple(e for e in op.events if e.param < names.get(e.group, 0)))
                for op in scenario.ops if op.kind != "add_group" or op.option in late)
    return replace(scenario, ops=ops)


def counterexample_record(shrunk: Shrunk, seed: int, outcome: RunOutcome) -> dict:
    """The certificate's record of a shrunk failing run (read back by certify regression)."""
    worst = outcome.checks and next((c.worst for c in outcome.checks.values() if c.name == shrunk.check), None)
    summary = (f"{shrunk.check} fails on a run of {len(shrunk.scenario.ops)} operation(s): {shrunk.scenario.describe()}")
    return {"found": True, "replayed_check": shrunk.check, "summary": summary,
            "replay": {"quantity": "scenario", "seed": seed, "check": shrunk.check, "scenario": shrunk.scenario.to_dict()},
            "worst": worst, "replays": shrunk.replays, "minimal": shrunk.complete, "seconds": shrunk.seconds}


@dataclass
class ReplayOutcome:
    """What `certify regression` reads of a replayed scenario."""

    fails: bool
    step: int | None
    residual: float
    bound: float
    error: str | None


def replay(recorded: dict, subject: Subject | None = None) -> ReplayOutcome:
    """Run a recorded scenario (counterexample_record's "replay") against the subject: fails while its check fails."""
    scenario = grammar.scenario_from_dict(recorded["scenario"])
    outcome = run_scenario(scenario, int(recorded["seed"]), subject)
    check = next(c for c in outcome.checks.values() if c.name == recorded["check"])
    worst = check.worst or {}
    failed = bool(check.samples) and not check.passed
    return ReplayOutcome(failed, worst.get("op"), float(worst.get("residual", 0.0)), float(worst.get("bound", 0.5)),
                         outcome.raised if recorded["check"].endswith("scenario_completes") else None)


# --------------------------------------------------------------------------------------------
# Parts, controls, the claim
# --------------------------------------------------------------------------------------------


@functools.lru_cache(maxsize=16)
def _plan(seed: int, dtype_name: str, settings) -> tuple[tuple, tuple]:
    """grammar.draw_plan, drawn once per process for a seed, dtype and plan: every control walks the
    plan of its dtype (drawing one, with the feature steering, takes about 0.1 s)."""
    runs, missing = grammar.draw_plan(seed, dtype_name, settings, rng_for)
    return tuple(runs), tuple(missing)


def dtype_part(dtype_name: str, ctx: Context) -> Evidence:
    """Every run of one dtype's plan against the class: checks, coverage, and a shrunk counterexample
    if the class (not a control) fails."""
    subject = _subject(ctx.optimizer)
    runs, missing = (list(x) for x in _plan(ctx.seed, dtype_name, grammar.plan_settings(ctx.profile)))
    checks = _new_checks(dtype_name)
    coverage: dict = {}
    stepped, undefined, outcomes = 0, 0, []
    device = ctx.option("device", "cpu")
    for scenario in runs:
        outcome = run_scenario(scenario, ctx.seed, subject, device)
        for key, check in outcome.checks.items():
            checks[key].merge(check)
        for name, count in outcome.coverage.items():
            entry = coverage.setdefault(name, {"count": 0, "runs": 0})
            entry["count"] += count
            entry["runs"] += 1
        stepped += outcome.stepped
        undefined += len(outcome.undefined)
        outcomes.append((scenario, outcome))
    evidence = Evidence(
        checks=list(checks.values()), frames=stepped,
        extra={f"coverage_{dtype_name}": {name: coverage.get(name, {"count": 0, "runs": 0}) for name in grammar.FEATURES},
               f"runs_{dtype_name}": {"runs": len(runs), "operations": sum(len(s.ops) for s in runs),
                                      "steps": sum(1 for s in runs for op in s.ops if op.kind in grammar.STEP_KINDS),
                                      "longest_run_steps": max(sum(1 for op in s.ops if op.kind in grammar.STEP_KINDS) for s in runs)},
               f"undefined_frame_steps_{dtype_name}": undefined,
               f"unit_roundoffs_{dtype_name}": _unit_roundoffs(dtype_name)})
    uncovered = [name for name in grammar.FEATURES if not coverage.get(name)]
    if uncovered:
        evidence.inconclusive.append(f"{dtype_name}: {len(uncovered)} feature(s) of the scenario grammar not exercised: {', '.join(uncovered)}")
    if ctx.optimizer == REAL_OPTIMIZER:
        evidence.extra.update(_shrunk_failure(outcomes, ctx.seed, subject, device, dtype_name))
    return evidence


# The factors of the pairwise coverage: a feature of the grammar's operations and events, the storage
# dtype, the retraction route of a frame group, and each layout value. Every pair of values of two
# factors is one pair to reach; a scenario reaches the pairs of everything it exercises together.
ROUTE_VALUES = ("eigh_route", "newton_schulz_route")
PAIR_FACTORS = {
    "feature": grammar.OPERATION_FEATURES + grammar.EVENT_FEATURES,
    "dtype": DTYPE_NAMES,
    "route": ROUTE_VALUES,
    "layout": tuple(f for f in grammar.LAYOUT_FEATURES if f not in ROUTE_VALUES),
}


def pairwise_coverage(seed: int, profile) -> dict:
    """Which pairs of factor values (PAIR_FACTORS) the drawn plans of every dtype exercise together in
    one run: per pair of factors the pairs reached, of how many, and those missed (read from the
    plans, which every run carries out unless a check fails, and then the claim fails anyway)."""
    settings = grammar.plan_settings(profile)
    exercised = [(dtype, _features(scenario) | {dtype}) for dtype in DTYPE_NAMES for scenario in _plan(seed, dtype, settings)[0]]
    table = {}
    for (a_name, a_values), (b_name, b_values) in itertools.combinations(PAIR_FACTORS.items(), 2):
        reached = {(a, b) for _, found in exercised for a in a_values if a in found for b in b_values if b in found}
        wanted = [(a, b) for a in a_values for b in b_values]
        table[f"{a_name} x {b_name}"] = {"reached": len(reached), "of": len(wanted),
                                         "missed": [f"{a} / {b}" for a, b in wanted if (a, b) not in reached]}
    return {"factors": {name: len(values) for name, values in PAIR_FACTORS.items()}, "runs": len(exercised),
            "reached": sum(t["reached"] for t in table.values()), "of": sum(t["of"] for t in table.values()), "pairs": table}


def pairwise_part(ctx: Context) -> Evidence:
    """The pairwise coverage of the drawn plans (pairwise_coverage), recorded and stated in a note."""
    found = pairwise_coverage(ctx.seed, ctx.profile)
    worst = min(found["pairs"].items(), key=lambda item: item[1]["reached"] / item[1]["of"])
    from . import optimizer_scenarios as grammar

    # the alphabets the scenarios draw from, for the coverage contract to hold (a shape or a leading
    # axis taken out of them is then a shortfall, not a quieter pass)
    alphabets = {"frame_shapes": [list(s) for s in grammar.FRAME_SHAPES], "leading": [list(s) for s in grammar.LEADING],
                 "euclidean_shapes": [list(s) for s in grammar.EUCLIDEAN_SHAPES],
                 **{f"choices_{name}": [repr(v) for v in values] for name, values in grammar.CHOICES.items()},
                 "features": list(grammar.FEATURES)}
    return Evidence(extra={"pairwise_coverage": found, "grammar": alphabets},
                    notes=[f"pairwise coverage: {found['reached']} of {found['of']} pairs of feature, dtype, route and layout values "
                           f"({found['reached'] / found['of']:.1%}) are exercised together in one of {found['runs']} runs; the least "
                           f"covered factors are {worst[0]}, {worst[1]['reached']} of {worst[1]['of']}"])


def _unit_roundoffs(dtype_name: str) -> dict:
    compute = step_analysis.COMPUTE_DTYPES[dtype_name]
    units = step_analysis.UNIT_ROUNDOFFS
    return {"W": units[dtype_name], "m_v": units[compute], "compute": units[compute]}


def _shrunk_failure(outcomes, seed, subject, device, dtype_name) -> dict:
    """The first failing check (in CHECKS order) of the first run that fails it, shrunk; {} when all pass."""
    for key, name, _, _ in CHECKS:
        check = f"{dtype_name}/{name}"
        for scenario, outcome in outcomes:
            if check in outcome.failing():
                shrunk = shrink(scenario, seed, check, subject, device)
                replayed = run_scenario(shrunk.scenario, seed, subject, device)
                return {f"counterexample_{dtype_name}": counterexample_record(shrunk, seed, replayed)}
    return {}


def _part(dtype_name):
    return Part(dtype_name, functools.partial(dtype_part, dtype_name), background=True)  # a task of its own


def _subject(name) -> Subject:
    if isinstance(name, Subject):
        return name
    if name == REAL_OPTIMIZER:
        return real_subject()
    return broken_subjects()[name]


# --------------------------------------------------------------------------------------------
# Refusals: every option the class does not implement, every bad setting and tensor
# --------------------------------------------------------------------------------------------


# Options of torch.optim.Adam / AdamW and geoopt's RiemannianAdam that ask for something StiefelAdam
# does not do (written here, not read from the class: a class that forgets one must fail).
FOREIGN_ASKING = (("amsgrad", True), ("maximize", True), ("foreach", True), ("fused", True), ("capturable", True),
                  ("differentiable", True), ("decoupled_weight_decay", True), ("stabilize", 10))
# The values of those options that ask for nothing: code written for AdamW or geoopt runs unchanged.
FOREIGN_BENIGN = (("amsgrad", False), ("maximize", False), ("foreach", None), ("fused", None), ("capturable", False),
                  ("differentiable", False), ("decoupled_weight_decay", False), ("stabilize", None),
                  # a value equal to it but another object (0 == False), as configuration files give it
                  ("amsgrad", 0), ("foreach", 0))
# Settings that only frame groups use (an ordinary group has no retraction), and the manifold itself.
FRAME_ONLY_SETTINGS = ("trust_radius", "retraction_method", "manifold")
BAD_SETTINGS = (("lr", -1.0), ("lr", 0.0), ("lr", math.nan), ("betas", (1.0, 0.999)), ("betas", (0.9, -0.1)), ("betas", (0.9,)),
                ("eps", -1e-8), ("eps", math.nan), ("trust_radius", 0.0), ("trust_radius", -0.5), ("weight_decay", -0.1),
                ("retraction_method", "qr"), ("manifold", "sphere"))


def _bad_tensors():
    """(label, tensor) that a frame group must refuse: not on St (twice a frame, and a frame whose
    ||W^T W - I|| is 100 times torch_impl.manifold_tolerance of its shape and dtype, in float64 and
    float32), wide, 1-D, an integer and a float16 tensor."""
    import torch
    from torch_impl import manifold_tolerance

    frame = torch.linalg.qr(torch.randn(5, 3, dtype=torch.float64, generator=torch.Generator().manual_seed(0)))[0]
    drifted = {}
    for dtype in (torch.float64, torch.float32):
        # W (1 + s) has W^T W - I = (2 s + s^2) I, of Frobenius norm sqrt(3) (2 s + s^2)
        target = 100.0 * manifold_tolerance(5, 3, dtype)
        s = math.sqrt(1.0 + target / math.sqrt(3.0)) - 1.0
        drifted[dtype] = (frame * (1.0 + s)).to(dtype)
    return (("not_a_frame", 2.0 * frame), ("drifted_float64", drifted[torch.float64]), ("drifted_float32", drifted[torch.float32]),
            ("wide", frame.mT.contiguous()), ("one_dimensional", frame[:, 0].contiguous()),
            ("integer", torch.zeros(5, 3, dtype=torch.int64)), ("float16", frame.to(torch.float16)))


# settings made NaN after the constructor checked them (as a scheduler or an edit of param_groups could):
# the step is then not finite and must be refused, naming the setting (torch_impl/optimizer.py,
# _nonfinite_setting_or_state). Not trust_radius: a NaN radius compares false, caps nothing, and the
# step stays finite.
NONFINITE_SETTINGS = (("lr", math.nan), ("eps", math.nan), ("weight_decay", math.nan), ("betas", (math.nan, 0.999)))


def _raised(call) -> Exception | None:
    """The exception call() raised (any kind: which kind it is, is what a refusal check judges), or None."""
    try:
        call()
    except Exception as error:  # the kind of exception is what is checked
        return error
    return None


def _names(error: BaseException, what) -> bool:
    """Whether the message of `error` names `what` (a text, or a tuple of texts that must all occur), each as
    a whole: not inside a longer word ("betas" is not named by "XXbetasXX", nor "lr" by "lr_typo")."""
    import re

    message = str(error)
    texts = (what,) if isinstance(what, str) else tuple(what)
    return all(re.search(rf"(?<![\w]){re.escape(text)}(?![\w])", message) for text in texts)


def _later_refusals(subject, good):
    """(label, what the message must name, attempt) for refusals that come after the constructor: a setting
    made non-finite before a step, and a checkpoint that is not a StiefelAdam frame state of its parameter
    (torch.optim.Adam's, or one with a key missing or a count of the wrong shape), each refused naming the
    parameter's place and what is wrong, before anything is written."""
    import torch

    def stepped():
        p = torch.nn.Parameter(torch.stack([good, good]).clone())
        optimizer = subject.optimizer_class([p], lr=0.01)
        p.grad = torch.ones_like(p)
        return p, optimizer

    def nonfinite(key, value):
        def attempt():
            p, optimizer = stepped()
            optimizer.param_groups[0][key] = value
            return _raised(optimizer.step)
        return attempt

    def loaded(edit):
        def attempt():
            p, optimizer = stepped()
            optimizer.step()
            saved = optimizer.state_dict()
            edit(saved, p)
            return _raised(lambda: subject.optimizer_class([torch.nn.Parameter(p.detach().clone())], lr=0.01).load_state_dict(saved))
        return attempt

    def adam_state(saved, p):
        adam = torch.optim.Adam([torch.nn.Parameter(p.detach().clone())])
        adam.param_groups[0]["params"][0].grad = torch.ones_like(p)
        adam.step()
        saved["state"] = adam.state_dict()["state"]

    def without(key):
        return lambda saved, p: saved["state"][0].pop(key)

    def wrong_count(saved, p):
        saved["state"][0]["step"] = torch.zeros(3, dtype=torch.float64)

    for key, value in NONFINITE_SETTINGS:
        yield f"nonfinite_{key}", key, nonfinite(key, value)

    def overflow(after: int):
        # docs/algorithm.md: "a finite gradient [that] overflows the compute dtype" is refused like any
        # non-finite step: at the first step (the parameter has no state yet) and after `after` steps
        def attempt():
            p = torch.nn.Parameter(good.to(torch.float32).clone())
            optimizer = subject.optimizer_class([p], lr=0.01)
            for _ in range(after):
                p.grad = torch.ones_like(p)
                optimizer.step()
            p.grad = torch.full_like(p, 1e30)
            return _raised(optimizer.step)
        return attempt

    # the message says that the step overflowed, not another cause (its stored moments are finite)
    yield "nonfinite_step_of_finite_gradient", ("params[0]", "overflowed"), overflow(0)
    yield "nonfinite_later_step_of_finite_gradient", ("params[0]", "overflowed"), overflow(2)

    def off_in_batch(batch, index):
        # a frame of a batched parameter moved off St(d, r) after the constructor: the refusal names which
        # frame, by its coordinates in the batch, and the batch's shape
        def attempt():
            p = torch.nn.Parameter(good.expand(*batch, *good.shape).clone())
            optimizer = subject.optimizer_class([p], lr=0.01)
            with torch.no_grad():
                p.view(-1, *good.shape)[index].mul_(2.0)
            p.grad = torch.ones_like(p)
            return _raised(optimizer.step)
        return attempt

    yield "frame_off", ("params[0]", "its frame"), off_in_batch((), 0)
    yield "frame_off_in_batch", ("params[0]", "frame 2 of its (4,) frames"), off_in_batch((4,), 2)
    yield "frame_off_in_batch_of_two_axes", ("params[0]", "frame (1, 2) of its (2, 3) frames"), off_in_batch((2, 3), 5)
    def off_without_state():
        # a frame that never stepped (no saved state) and was then changed off St(d, r): "Every frame that has
        # values is checked to be on St(d, r)" by load_state_dict
        stepped_p, frame_p = torch.nn.Parameter(good.clone()), torch.nn.Parameter(good.clone())
        optimizer = subject.optimizer_class([stepped_p, frame_p], lr=0.01)
        stepped_p.grad = torch.ones_like(stepped_p)
        optimizer.step()
        saved = optimizer.state_dict()
        fresh = [torch.nn.Parameter(stepped_p.detach().clone()), torch.nn.Parameter(good.clone())]
        target = subject.optimizer_class(fresh, lr=0.01)
        with torch.no_grad():
            fresh[1].mul_(2.0)
        return _raised(lambda: target.load_state_dict(saved))

    yield "off_frame_without_state", "params[1]", off_without_state
    # the message names the shape it found (torch.optim.Adam's exp_avg_sq has the parameter's, (2, d, r))
    yield "adam_state", ("exp_avg_sq", f"shape {(2, *good.shape)}"), loaded(adam_state)
    yield "state_without_exp_avg_sq", "exp_avg_sq", loaded(without("exp_avg_sq"))
    yield "count_of_wrong_shape", "step", loaded(wrong_count)
    # a saved moment that is not a tensor: the message names the type it found
    yield "moment_not_a_tensor", ("exp_avg", "list"), loaded(lambda saved, p: saved["state"][0].__setitem__("exp_avg", [0.0]))


def _public_refusals(subject):
    """(label, what the message must name, call) for the public functions' refusals of bad input:
    a tensor that is not (..., d, r) given to stiefel_init_ or stiefel_project_ (named by its parameter,
    "tensor"), a frame group's 1-d parameter given to clip_grad_norm_finite_ (the shape it wants), and a
    max_norm that is not positive (named)."""
    import torch

    def clipped(members, max_norm):
        for p in members:
            p.grad = torch.ones_like(p)
        return lambda: subject.clip([{"params": members, "manifold": "stiefel"}], max_norm)

    from .optimizer_promises import DOCUMENTED

    # an unknown option is refused naming it and every option the class takes (the documented table and the
    # docstring's skip_nonfinite, retraction_method and manifold), each as a whole word
    taken = (*DOCUMENTED, "skip_nonfinite", "retraction_method", "manifold")
    yield "unknown_option", ("learning_rate", *taken), lambda: subject.optimizer_class(
        [torch.nn.Parameter(torch.linalg.qr(torch.randn(6, 2, dtype=torch.float64, generator=torch.Generator().manual_seed(1)))[0])],
        learning_rate=0.01)
    yield "init_one_dimensional", "tensor", lambda: subject.init(torch.empty(5, dtype=torch.float64))
    yield "project_one_dimensional", "tensor", lambda: subject.project(torch.ones(5, dtype=torch.float64))
    # a wide tensor (r > d) has no orthonormal columns: refused by its shape, the message saying 1 <= r <= d
    yield "init_wide", ("tensor", "r <= d"), lambda: subject.init(torch.empty(2, 5, dtype=torch.float64))
    yield "project_wide", ("tensor", "r <= d"), lambda: subject.project(torch.eye(2, 5, dtype=torch.float64))
    yield "clip_one_dimensional_frame", "(..., d, r)", clipped([torch.nn.Parameter(torch.ones(5, dtype=torch.float64))], 1.0)
    yield "clip_max_norm_zero", "max_norm", clipped([torch.nn.Parameter(torch.ones(2, 5, 2, dtype=torch.float64))], 0.0)


def _zero_frames_step(subject, good) -> None:
    """A (0, d, r) parameter beside a frame: constructed, stepped and left empty (raises otherwise)."""
    import torch

    empty, frame = torch.nn.Parameter(torch.empty(0, *good.shape, dtype=good.dtype)), torch.nn.Parameter(good.clone())
    optimizer = subject.optimizer_class([empty, frame], lr=0.01)
    empty.grad, frame.grad = torch.zeros_like(empty), torch.ones_like(frame)
    optimizer.step()
    if empty.shape != (0, *good.shape):
        raise ValueError(f"the empty parameter became {tuple(empty.shape)}")


def _fill_refusals(subject, seed: int, refused: NumericalCheck, accepted: NumericalCheck) -> None:
    """The refusal part's cases, each added to `refused` or `accepted`."""
    import torch

    good = torch.linalg.qr(torch.randn(6, 2, dtype=torch.float64, generator=torch.Generator().manual_seed(1)))[0]
    for label, value, name in _bad_cases():
        for place in ("constructor", "first_group", "later_group", "add_param_group", "euclidean_group"):
            if label == "tensor" and place in ("constructor", "euclidean_group"):
                continue
            if place == "euclidean_group" and name in FRAME_ONLY_SETTINGS:
                continue
            error = _attempt(subject.optimizer_class, good, label, name, value, place)
            ok = isinstance(error, ValueError) and _names(error, name.split(":")[-1])
            refused.add([0.0 if ok else math.inf], 0.5, key=(CLAIM_ID, "refusals"), seed=seed,
                        extra={"option": name, "value": repr(value) if label != "tensor" else name, "place": place,
                               "raised": None if error is None else f"{type(error).__name__}: {str(error).splitlines()[0]}"})
    for label, name, attempt in _later_refusals(subject, good):
        error = attempt()
        ok = isinstance(error, ValueError) and _names(error, name) and "param group 0" in str(error)
        refused.add([0.0 if ok else math.inf], 0.5, key=(CLAIM_ID, "refusals", label), seed=seed,
                    extra={"option": name if isinstance(name, str) else list(name), "value": label,
                           "place": "step" if label.startswith(("nonfinite", "frame_")) else "load_state_dict",
                           "raised": None if error is None else f"{type(error).__name__}: {str(error).splitlines()[0]}"})
    for label, name, attempt in _public_refusals(subject):
        error = _raised(attempt)
        ok = isinstance(error, ValueError) and _names(error, name)
        refused.add([0.0 if ok else math.inf], 0.5, key=(CLAIM_ID, "refusals", label), seed=seed,
                    extra={"option": name if isinstance(name, str) else list(name), "value": label, "place": "public function",
                           "raised": None if error is None else f"{type(error).__name__}: {str(error).splitlines()[0]}"})
    for name, value in FOREIGN_BENIGN:
        for place in ("constructor", "later_group"):
            error = _attempt(subject.optimizer_class, good, "option", name, value, place)
            accepted.add([0.0 if error is None else math.inf], 0.5, key=(CLAIM_ID, "benign"), seed=seed,
                         extra={"option": name, "value": repr(value), "place": place,
                                "raised": None if error is None else f"{type(error).__name__}: {error}"})
    # a param group may carry the user's own keys, as in torch.optim; a parameter of zero frames is a frame parameter
    for label, make in (("user_key_in_group", lambda: subject.optimizer_class([{"params": [torch.nn.Parameter(good.clone())], "name": "attention"}])),
                        ("user_key_in_added_group", lambda: subject.optimizer_class([torch.nn.Parameter(good.clone())]).add_param_group(
                            {"params": [torch.nn.Parameter(good.clone())], "name": "late"})),
                        ("zero_frames", lambda: _zero_frames_step(subject, good))):
        try:
            make()
            error = None
        except Exception as raised:  # refusing what torch.optim accepts is the failure this records
            error = raised
        accepted.add([0.0 if error is None else math.inf], 0.5, key=(CLAIM_ID, label), seed=seed,
                     extra={"case": label, "raised": None if error is None else f"{type(error).__name__}: {error}"})
    for dtype in ("float64", "float32", "bfloat16"):  # what users initialise frames with is a frame, in every dtype
        try:
            frames = subject.init(torch.empty(4, 9, 3, dtype=getattr(torch, dtype)), generator=torch.Generator().manual_seed(seed))
            subject.optimizer_class([torch.nn.Parameter(frames)])
            error = None
        except Exception as raised:  # refusing a stiefel_init_ frame is the failure this records
            error = raised
        accepted.add([0.0 if error is None else math.inf], 0.5, key=(CLAIM_ID, "stiefel_init"), seed=seed,
                     extra={"tensor": f"stiefel_init_ (4, 9, 3) {dtype}", "raised": None if error is None else f"{type(error).__name__}: {error}"})


def refusal_part(ctx: Context, stop: bool = False) -> Evidence:
    """Every bad option and tensor at every place must raise ValueError naming it; every benign option is accepted.
    stop: a control's run, which ends at its first detection (kit.common.stop_at_detection)."""
    subject = _subject(ctx.optimizer)
    refused = NumericalCheck("bad_options_refused", "each foreign option asking for something, bad setting (alone, or retraction_method "
                             "'newton_schulz' beyond its basin, trust_radius 2; or made non-finite after the constructor, refused at the "
                             "step) or bad tensor, and a checkpoint that is not a frame state of its parameter (torch.optim.Adam's, a key "
                             "missing, a count of the wrong shape, refused at the load), and bad input of the public functions "
                             "(stiefel_init_, stiefel_project_, clip_grad_norm_finite_), in the "
                             "constructor, in the first or a later param group and through add_param_group: ValueError naming it "
                             "(0; inf if accepted, another exception or a message that does not name it)",
                             "exact: the documented refusal", tightness_note="an exact equality: 0 by design")
    accepted = NumericalCheck("benign_options_accepted", "each foreign option at the value that asks for nothing, in the constructor "
                              "and in a param group, a group carrying a user's key (as torch.optim allows), a parameter of zero frames "
                              "(stepped), and stiefel_init_ frames of every dtype: accepted (0; inf if refused)",
                              "exact: the documented acceptance",
                              tightness_note="an exact equality: 0 by design")
    with stop_at_detection([refused, accepted], active=stop):
        _fill_refusals(subject, ctx.seed, refused, accepted)
    return Evidence(checks=[refused, accepted])


def promises_part(ctx: Context) -> Evidence:
    """The promises torch_impl's documentation states bit for bit or against torch: a float against a
    tensor lr, the sync-free against the default route, clip_grad_norm_finite_ against torch's for every
    norm type and dtype mix, a refused meta parameter (propositions/optimizer_promises.py)."""
    from .optimizer_promises import promise_checks

    return Evidence(checks=promise_checks(_subject(ctx.optimizer), ctx.seed))


def public_functions_part(ctx: Context) -> Evidence:
    """The public functions beside the class, as users call them outside its own groups:
    clip_grad_norm_finite_ on another optimizer's param groups (no "manifold" key: every tensor one
    unit) and on a list of tensors, with a NaN tensor among them, in every dtype, against c G as in
    the scenarios; stiefel_init_ with a seeded generator, twice the same frames and another seed others."""
    import torch

    subject = _subject(ctx.optimizer)
    clip = {"clip": NumericalCheck("clip_grad_norm_finite_other_groups", "clip_grad_norm_finite_ on torch.optim.AdamW's param "
                                   "groups and on a list of tensors (1-3 dims, one tensor with a NaN or an inf): per finite tensor ||G_clipped - c G|| / "
                                   "(c ||G||); a tensor that is not finite untouched (ulps)", " ".join(clip_bound.__doc__.split()),
                                   tightness_note="tensors not clipped (c = 1) or not finite are exact equalities: 0 by design")}
    seeded = NumericalCheck("stiefel_init_reproducible", "stiefel_init_ with torch.Generator().manual_seed(s): two calls with the same s "
                            "against each other (ulps), and a call with s + 1 (0 if its frames differ, inf if identical)",
                            "exact: a seeded generator fixes the draw", tightness_note="an exact equality: 0 by design")
    for dtype_name in DTYPE_NAMES:
        dtype = getattr(torch, dtype_name)
        generator = torch.Generator().manual_seed(ctx.seed)
        for form in ("optimizer_groups", "tensor_list"):
            tensors = [torch.nn.Parameter(torch.randn(shape, generator=generator).to(dtype)) for shape in ((5,), (3, 4), (2, 3, 2), (6,))]
            for index, p in enumerate(tensors):
                p.grad = torch.randn(p.shape, generator=generator).to(dtype)
                if index == 3:
                    p.grad.view(-1)[1] = math.nan if form == "tensor_list" else math.inf
            held = {index: _units(_to_numpy(p.grad), False) for index, p in enumerate(tensors)}
            target = torch.optim.AdamW(tensors).param_groups if form == "optimizer_groups" else tensors
            _public_call(clip["clip"], lambda: subject.clip(target, 0.5), {"form": form, "dtype": dtype_name})
            after = {index: _units(_to_numpy(p.grad), False) for index, p in enumerate(tensors)}
            batch = _Batch()
            clip_samples(held, after, 0.5, dtype_name, batch, {"form": form, "dtype": dtype_name})
            batch.flush(clip, ctx.seed, (CLAIM_ID, "clip", dtype_name, form))
        draws = []
        # the global generator seeded from the claim's seed meanwhile (and restored after): an init that
        # ignores its generator draws from it, and its residual must not depend on what ran before in
        # the process (a re-run by certify verify starts from another global state)
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(int(rng_for(ctx.seed, CLAIM_ID, "global_generator", dtype_name).integers(2**62)))
            for seed in (ctx.seed, ctx.seed, ctx.seed + 1):
                frames = _public_call(seeded, lambda: subject.init(torch.empty(3, 6, 2, dtype=dtype), generator=torch.Generator().manual_seed(seed)),
                                      {"dtype": dtype_name})
                draws.append(None if frames is None else _to_numpy(frames))
        if all(draw is not None for draw in draws):
            seeded.add([_max_ulps(draws[1], draws[0]), 0.0 if _max_ulps(draws[2], draws[0]) > 0 else math.inf], 0.5,
                       key=(CLAIM_ID, "stiefel_init", dtype_name), seed=ctx.seed, extra={"dtype": dtype_name})
    return Evidence(checks=[clip["clip"], seeded, _corrupted_state_check(subject, ctx.seed)])


CORRUPTED_KEYS = ("exp_avg", "exp_avg_sq")


def _corrupted_state_check(subject: Subject, seed: int) -> NumericalCheck:
    """A checkpoint whose state holds a NaN for one frame (its moment m, or its v; the middle frame of
    the second of two parameters stepped in one call), loaded with load_state_dict, then a step with
    finite gradients: under skip_nonfinite that frame keeps its value, m, v and count and every other
    frame steps; in the error mode the step raises ValueError and nothing is written. The drawn scenarios never store a non-finite state (their non-finite
    steps come from gradients, which make v non-finite too); this is the case where v is finite
    and only the frame is not."""
    import torch

    check = NumericalCheck("corrupted_state_not_stepped", "a NaN in one frame's stored m or v (a loaded checkpoint) and a finite "
                           "gradient, per dtype and mode: skip_nonfinite keeps that frame (value, m, v, count) and steps the "
                           "others; the error mode raises ValueError and writes nothing (ulps of what must be kept; inf for a wrong outcome)",
                           "exact: the documented skip and refusal", tightness_note="an exact equality: 0 by design")
    for dtype_name in DTYPE_NAMES:
        dtype = getattr(torch, dtype_name)
        for key in CORRUPTED_KEYS:
            for skip in (True, False):
                generator = torch.Generator().manual_seed(seed)
                # two parameters joined in one call, the second's middle frame corrupted (neither the
                # first nor the last frame of the call); frames by QR, not subject.init, so that this
                # check neither depends on the init nor draws through it
                params = [torch.nn.Parameter(torch.linalg.qr(torch.randn(frames, 8, 4, dtype=torch.float64, generator=generator))[0].to(dtype))
                          for frames in (2, 3)]
                optimizer = subject.optimizer_class(params, lr=0.05, skip_nonfinite=skip)
                for p in params:
                    p.grad = torch.randn(p.shape, generator=generator).to(dtype)
                optimizer.step()
                saved = optimizer.state_dict()
                saved["state"][1][key].view(3, -1)[1, 0] = math.nan
                optimizer.load_state_dict(saved)
                for p in params:
                    p.grad = torch.randn(p.shape, generator=generator).to(dtype)
                kinds = ("exp_avg", "exp_avg_sq", "step")

                def held():
                    # per kind, the frames of both parameters along one axis (frame 3 is the corrupted one)
                    return [np.concatenate([_to_numpy(p if k is None else optimizer.state[p][k]) for p in params]) for k in (None,) + kinds]

                before = held()
                try:
                    optimizer.step()
                    raised = None
                except ValueError as error:
                    raised = error
                after = held()
                # ulps between the frames that must keep everything (the corrupted one, or all of them
                # in the error mode) and what they held; inf for a wrong outcome of the others
                kept, others = ([3], [0, 1, 2, 4]) if skip else (slice(None), [])
                residual = max(_max_ulps(x[kept], y[kept]) for x, y in zip(after, before))
                if (raised is None) != skip:
                    residual = math.inf
                elif not skip and not _names(raised, ("params[1]", key)):
                    residual = math.inf  # the refusal names the parameter and the stored moment that is not finite
                elif skip and not (np.array_equal(after[3][others], before[3][others] + 1) and
                                   all(_max_ulps(after[0][[k]], before[0][[k]]) > 0 for k in others)):
                    residual = math.inf  # every other frame must step: its count advances and it moves
                check.add([residual], 0.5, key=(CLAIM_ID, "corrupted_state", dtype_name, key, skip), seed=seed,
                          extra={"dtype": dtype_name, "corrupted": key, "skip_nonfinite": skip,
                                 "raised": None if raised is None else f"{type(raised).__name__}: {str(raised).splitlines()[0]}"})
    return check


def _public_call(check: NumericalCheck, call, extra: dict):
    """call(); where it raises, the check fails (inf) with the error, and None is returned."""
    try:
        return call()
    except Exception as error:  # a public function that raises on valid input fails its check
        check.add([math.inf], 0.5, extra={**extra, "raised": f"{type(error).__name__}: {error}", "raised_at": _where(error)})
        return None


# Settings bad only together: the Newton-Schulz retraction asked for beyond its basin (trust_radius <= 0.75),
# which a group must refuse, naming trust_radius, rather than step into nonsense (torch_impl/functional.py)
BAD_PAIRS = (("trust_radius", {"retraction_method": "newton_schulz", "trust_radius": 2.0}),)


def _bad_cases():
    import torch

    for name, value in FOREIGN_ASKING + BAD_SETTINGS:
        yield "option", value, name
    # only lr and eps may be tensors (docs/algorithm.md): the others enter the step as host numbers
    for name, value in (("betas", (torch.tensor(0.9), 0.999)), ("trust_radius", torch.tensor(0.5)), ("weight_decay", torch.tensor(0.0))):
        yield "option", value, name
    for name, value in BAD_PAIRS:
        yield "pair", value, name
    for label, tensor in _bad_tensors():
        yield "tensor", tensor, f"tensor:params[0]"


def _attempt(optimizer_class, good, label, name, value, place):
    """Construct (and add a group) with one bad thing at `place`; the exception raised, or None if accepted."""
    import torch

    def param(x):
        return torch.nn.Parameter(x.clone())

    base = {"params": [param(good)]}
    settings = dict(value) if label == "pair" else {name: value}
    if place == "euclidean_group":  # an AdamW group holding an ordinary tensor, after a frame group
        bad_group = {"params": [param(good[:, 0])], "manifold": "euclidean", **settings}
        place = "later_group"
    elif label == "pair":
        bad_group = {"params": [param(good)], **settings}
    elif label == "tensor":
        bad_group = {"params": [param(value) if value.is_floating_point() else torch.nn.Parameter(value.clone(), requires_grad=False)]}
    else:
        bad_group = {"params": [param(good)], name: value}
    try:
        if place == "constructor":
            optimizer_class([base], **settings)
        elif place == "first_group":
            optimizer_class([bad_group, base])
        elif place == "later_group":
            optimizer_class([base, bad_group])
        else:
            optimizer_class([base]).add_param_group(bad_group)
    except Exception as error:  # the kind of exception is what is checked
        return error
    return None


# --------------------------------------------------------------------------------------------
# Controls
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ControlSpec:
    description: str
    dtype: str = "float64"
    part: str = "runs"  # "runs": the dtype's plan, run by run until detected; "refusals": the refusal part
    # a feature of the grammar without which the runs cannot show the break: the runs that have it go
    # first (an order only: every run is still there to detect it)
    feature: str | None = None
    # part "promises": the promise (optimizer_promises.PROMISES) whose sibling runs show the break, run alone
    promise: str | None = None


def control_part(ctx: Context) -> Evidence:
    """A broken subject through the claim's checks: the dtype's runs in order (the long run last), until
    one check misses its bound by DETECTION_FACTOR."""
    from propositions._common import DETECTION_FACTOR

    spec = CONTROLS[ctx.optimizer]
    if spec.part == "refusals":
        return refusal_part(ctx, stop=True)
    if spec.part == "public":
        return public_functions_part(ctx)
    if spec.part == "promises":
        from .optimizer_promises import promise_checks

        return Evidence(checks=promise_checks(_subject(ctx.optimizer), ctx.seed, only=spec.promise, stop=True))
    subject = _subject(ctx.optimizer)
    runs = list(_plan(ctx.seed, spec.dtype, grammar.plan_settings(ctx.profile))[0])
    checks = _new_checks(spec.dtype)

    def detected(found: dict) -> bool:
        return any(c.samples and c.max_ratio >= DETECTION_FACTOR for c in found.values())

    ordered = runs[1:] + runs[:1]
    if spec.feature is not None:
        ordered.sort(key=lambda scenario: spec.feature not in _features(scenario))  # stable: the long run stays last among equals
    for scenario in ordered:
        # the run stops at the first op after which a check misses by DETECTION_FACTOR: the control's
        # verdict is decided there, and the rest of the run (its resume check above all) adds nothing
        outcome = run_scenario(scenario, ctx.seed, subject, ctx.option("device", "cpu"), stop=detected)
        for key, check in outcome.checks.items():
            checks[key].merge(check)
        if detected(checks):
            break
    return Evidence(checks=[c for c in checks.values() if c.samples])


@functools.lru_cache(maxsize=None)
def _features(scenario: Scenario) -> frozenset:
    """The grammar features a scenario exercises, read from its plan without running it (kept per
    scenario: a frozen value, and every control that orders the runs by a feature asks again)."""
    found = set(grammar.layout_features(scenario))
    for _, plan in grammar.walk(scenario):
        found.update(plan.features)
    return frozenset(found)


def broken_subjects() -> dict:
    """name -> Subject with one piece of bookkeeping broken (CONTROLS says what)."""
    from ._optimizer_controls import broken_classes

    from ._optimizer_controls import broken_functions

    real = real_subject()
    subjects = {name: replace(real, optimizer_class=cls, name=name) for name, cls in broken_classes().items()}
    for name, (field_name, function) in broken_functions().items():
        subjects[name] = replace(real, name=name, **{field_name: function})
    # a broken subject is a control by being written: one left out of CONTROLS would never run, and
    # the certificate would pass without it (every control run raises instead)
    orphans = sorted(set(subjects) - set(CONTROLS))
    if orphans:
        raise RuntimeError(f"broken subjects without a ControlSpec in optimizer_class.CONTROLS (so never run): {', '.join(orphans)}")
    return subjects


CONTROLS = {
    # the promises the documentation states bit for bit, or against torch (propositions/optimizer_promises.py)
    "tensor_lr_in_parameter_dtype": ControlSpec("a 0-d tensor lr is rounded to the parameter's dtype before the product: a float lr and a "
                                                "tensor lr of the same value give different bfloat16 steps", part="promises", promise="lr"),
    "meta_skipped_without_gradient": ControlSpec("a parameter still on the meta device without a gradient is skipped without a word",
                                                 part="promises", promise="meta"),
    "meta_refused_in_frame_groups_only": ControlSpec("a parameter on the meta device is refused in a frame group only: in a "
                                                     "manifold='euclidean' group it is left out without a word", part="promises", promise="meta"),
    "zero_grad_keeps_zeros": ControlSpec("zero_grad() fills the gradients with zeros unless asked (torch's default is None): a frame "
                                         "without a new gradient is then stepped", part="promises", promise="zero_grad"),
    "clip_total_in_gradient_dtype": ControlSpec("clip_grad_norm_finite_ forms and returns the total in the gradients' own dtype: "
                                                "bfloat16 gradients alone give a bfloat16 total (documented: float32)", part="promises",
                                                promise="clip"),
    "clip_group_tensor_by_rows": ControlSpec("clip_grad_norm_finite_ reads a param group whose 'params' is one tensor row by row: "
                                             "the rows have no gradient, so the group is neither counted nor clipped", part="promises",
                                             promise="clip"),
    "retraction_method_ignored": ControlSpec("the group's retraction_method is not passed to the kernel: a group asking for 'eigh' "
                                             "retracts by the 'auto' route (both within the reference's bounds)", part="promises",
                                             promise="kernel"),
    "tolerance_storage_term_over_sqrt_r": ControlSpec("the manifold tolerance's storage term 4 sqrt(r) u_s written 4 u_s / sqrt(r): "
                                                      "bfloat16 frames within the documented tolerance are skipped", part="promises",
                                                      promise="tolerance"),
    "named_load_without_position": ControlSpec("load_state_dict names a frame without its position: a checkpoint of an optimizer built "
                                               "from named parameters cannot be loaded", part="promises", promise="named"),
    "refusal_without_name": ControlSpec("refusals name a parameter by its place only, not by the name it was given", part="promises",
                                        promise="named"),
    "older_checkpoint_skips": ControlSpec("a checkpoint written before skip_nonfinite existed loads with skipping on (its groups "
                                          "skip non-finite steps instead of refusing them)", part="promises", promise="older"),
    "step_returns_empty_string": ControlSpec("step() without a closure returns '' instead of None"),
    "kernel_default_beta1": ControlSpec("functional.stiefel_adam_step's default beta1 is 0.95, not the documented 0.9 (every "
                                        "caller that passes its betas is unaffected)", part="promises", promise="defaults"),
    "unpickled_without_call_record": ControlSpec("an unpickled StiefelAdam (torch.save, copy.deepcopy) lacks the record of its "
                                                 "step calls: the copy cannot step", part="promises", promise="pickle"),
    "step_not_marked_for_scheduler": ControlSpec("step() does not record that it ran: a scheduler stepped after it warns that it "
                                                 "stepped first", part="promises", promise="scheduler"),
    "basin_unchecked_in_groups": ControlSpec("a group's retraction_method is not checked against its trust_radius: 'newton_schulz' "
                                             "beyond its basin is accepted", part="refusals"),
    "user_keys_refused_in_added_groups": ControlSpec("add_param_group refuses a group carrying the user's own key (torch.optim "
                                                     "accepts it)", part="refusals"),
    "nonfinite_lr_unnamed": ControlSpec("a step refused for an lr made NaN after the constructor does not name lr (only the "
                                        "overflow)", part="refusals"),
    "load_checks_stepped_frames_only": ControlSpec("load_state_dict checks only the frames that have saved state: a frame "
                                                   "that never stepped and was changed off St(d, r) is loaded", part="refusals"),
    "buckets_ignore_dtype": ControlSpec("parameters of one (d, r) but different dtypes are joined into one batched call",
                                        part="promises", promise="mixed"),
    "off_manifold_also_skipped": ControlSpec("a frame off the manifold whose step is also not finite is counted in skipped_steps "
                                             "too", part="promises", promise="counts"),
    "project_refusal_unnamed": ControlSpec("stiefel_project_ refuses a tensor that is not (..., d, r) without naming it", part="refusals"),
    "foreign_state_loaded": ControlSpec("load_state_dict takes a saved exp_avg or exp_avg_sq of another shape (torch.optim.Adam's "
                                        "elementwise exp_avg_sq) without refusing it", part="refusals"),
    "zero_frame_parameter_refused": ControlSpec("a parameter of zero frames (shape (0, d, r)) is taken as off the manifold and "
                                                "refused", part="refusals"),
    "off_manifold_message_batch_of_two_axes": ControlSpec("the refusal of a frame off St(d, r) reads the batch as the parameter's "
                                                          "first two axes: a (B, d, r) parameter's frame is named by wrong "
                                                          "coordinates of a wrong batch", part="refusals"),
    "clip_total_of_nothing_is_one": ControlSpec("clip_grad_norm_finite_ over parameters none of which has a gradient returns 1, not the "
                                                "documented 0 (torch's)", part="promises", promise="edges"),
    "drift_bound_kappa_cubed": ControlSpec("frame_drift_bound takes kappa = sqrt(1 + Delta^3) for its docstring's sqrt(1 + Delta^2): "
                                           "a bound a few per cent off, within every rounding bound of the step", part="promises",
                                           promise="constants"),
    "newton_schulz_count_from_two": ControlSpec("newton_schulz_iterations measures the upper end's deviation from 2, not 1: another "
                                                "iteration count, the iteration still converging", part="promises", promise="constants"),
    "route_rule_sigma_four_times": ControlSpec("gram_identity_worth_testing takes ||Sigma||^2 of a typical gradient as 2 r (r + 1), "
                                               "not r (r + 1) / 2: the route test made at fewer shapes than documented (both routes "
                                               "within the bounds)", part="promises", promise="route"),
    "clip_beyond_its_bound": ControlSpec("clip_grad_norm_finite_ off by 30 times the clip check's own bound: a sentinel that holds "
                                         "the bound to its stated size (loosened by ten, it lets the sentinel through)", feature="clip_step"),
    "clip_ignores_norm_type": ControlSpec("clip_grad_norm_finite_ forms the 2-norm total whatever norm_type asks", part="promises",
                                          promise="clip"),
    "clip_norm_type_lost_when_masking": ControlSpec("clip_grad_norm_finite_ forms the total with the 2-norm whatever norm_type "
                                                    "asks once some unit is not finite (its masked path): only a clip with "
                                                    "another norm type beside a non-finite unit shows it", feature="clip_norm_with_nonfinite_unit"),
    "sync_free_without_sharper_test": ControlSpec("the sync-free route drops the sharper route test: its values differ from the default "
                                                  "route's where the route test runs", part="promises", promise="sync"),
    "first_group_settings": ControlSpec("every frame stepped with the first param group's hyper-parameters"),
    "bucket_ignores_eps": ControlSpec("parameters of groups that differ only in eps are joined into one call with the first one's eps", feature="siblings_differ_in_eps"),
    "count_advances_on_skip": ControlSpec("a frame skipped for a non-finite step still advances its step count", feature="nan_frame"),
    "whole_tensor_skip": ControlSpec("one non-finite frame skips every frame of its tensor", feature="nonfinite_frame_not_last_of_call"),
    "skip_stops_later_frames": ControlSpec("a non-finite frame also keeps every frame after it in its batched call", feature="nonfinite_frame_not_last_of_call"),
    "steps_without_gradient": ControlSpec("a parameter whose .grad is None is stepped with a zero gradient"),
    "load_drops_counts": ControlSpec("load_state_dict restarts the step counts (bias corrections start over)"),
    "load_casts_moments": ControlSpec("load_state_dict casts the moments to a bfloat16 parameter's dtype (torch.optim's default)", dtype="bfloat16"),
    "added_group_takes_defaults": ControlSpec("add_param_group ignores the group's own hyper-parameters", feature="add_group"),
    "closure_loss_dropped": ControlSpec("step(closure) returns None instead of the closure's loss", feature="closure_step"),
    "closure_called_twice": ControlSpec("step(closure) evaluates the closure a second time (the same loss and gradients for a "
                                        "deterministic closure)", feature="closure_step"),
    "coupled_decay_for_ordinary": ControlSpec("ordinary tensors get Adam with L2 decay (G + lambda W) instead of AdamW"),
    "euclidean_group_skips_whole": ControlSpec("one non-finite ordinary tensor skips every tensor of its group", feature="nonfinite_euclidean_beside_finite"),
    "writes_before_refusing": ControlSpec("a refused step (non-finite, no skip_nonfinite) is written before the ValueError"),
    "refusal_names_first_parameter": ControlSpec("the refusal always names params[0] of param group 0"),
    "skipped_count_of_stepped": ControlSpec("skipped_steps counts the frames that stepped, not those skipped", feature="nan_frame"),
    "overflow_not_skipped": ControlSpec("only a NaN or inf gradient is screened: a finite gradient whose square overflows is stepped (v = inf)", feature="overflow_frame"),
    "count_in_parameter_dtype": ControlSpec("the step count is kept in the parameter's dtype (bfloat16 stops counting at 256)", dtype="bfloat16"),
    "foreign_options_unchecked_in_groups": ControlSpec("foreign options (amsgrad=True, ...) are refused in the constructor only, "
                                                       "accepted silently in param groups", part="refusals"),
    "later_groups_unchecked": ControlSpec("only the first param group's settings and tensors are checked", part="refusals"),
    "ordinary_count_advances_on_skip": ControlSpec("a skipped ordinary tensor's AdamW step count still advances", feature="nonfinite_euclidean"),
    "untransported_moment_reported": ControlSpec("functional.transported_moment returns the moment untransported (tangent at the previous frame)"),
    "euclidean_groups_unchecked": ControlSpec("the settings of a manifold='euclidean' group are not checked (lr < 0 accepted there)", part="refusals"),
    "clip_counts_inf_units": ControlSpec("clip_grad_norm_finite_ leaves out NaN units only: an inf unit makes the total inf and clips "
                                         "every other unit to zero", part="public"),
    "clip_groups_default_to_frames": ControlSpec("clip_grad_norm_finite_ takes a param group without a 'manifold' key for a frame "
                                                 "group (another optimizer's groups are cut into frames)", part="public"),
    "finite_by_v_only": ControlSpec("a step is taken as finite when v is: a stored moment that is not finite (a corrupted "
                                    "checkpoint) with a finite gradient writes a NaN frame", part="public"),
    "init_ignores_generator": ControlSpec("stiefel_init_ draws from torch's global generator, not the one it is given", part="public"),
    "init_takes_wide": ControlSpec("stiefel_init_ has no shape test for r > d: a wide tensor is filled with orthonormal rows, not "
                                   "refused", part="refusals"),
    "counts_on_default_device": ControlSpec("a fresh state's step counts are made on torch's default device, not the parameter's "
                                            "(on a GPU: counts on the CPU beside frames on the GPU)", part="promises", promise="device"),
    "ordinary_moment_on_default_device": ControlSpec("an ordinary tensor's AdamW exp_avg is made on torch's default device, not "
                                                     "the parameter's", part="promises", promise="device"),
    "benign_option_by_identity": ControlSpec("a foreign option is accepted only as the very object that asks for nothing: "
                                             "amsgrad=0 (equal to False) is refused", part="refusals"),
    "corrupted_second_moment_unnamed": ControlSpec("a step refused for a stored exp_avg_sq that is not finite (a corrupted "
                                                   "checkpoint) says that the step overflowed, not which moment is corrupted",
                                                   part="public"),
    "project_by_qr": ControlSpec("stiefel_project_ takes the sign-fixed QR factor: a frame, not the nearest one"),
    "old_count_loaded_as_is": ControlSpec("load_state_dict keeps an older checkpoint's int step count as it is, where the class "
                                          "keeps a float64 count per frame", feature="checkpoint_old_format"),
    "euclidean_group_stops_at_no_grad": ControlSpec("an ordinary tensor without a gradient ends its group's step: the tensors after "
                                                    "it are not stepped", feature="no_grad_euclidean_not_last"),
    "bucket_plan_ignores_settings_classes": ControlSpec("the class keeps its grouping of frames into calls while the number of "
                                                        "groups is unchanged: groups a per-group scheduler splits stay in one call",
                                                        feature="schedule_splits_joined_groups"),
    "joined_view_ignores_gap": ControlSpec("the states of one call are joined without copying even when a parameter without a "
                                           "gradient lies between two in their buffer", part="promises", promise="gap"),
}
CONTROL_NAMES = tuple(CONTROLS)


def _prepare(ctx: Context) -> None:
    """One-line ValueErrors for an unknown optimizer, option or device."""
    import torch

    if not isinstance(ctx.optimizer, Subject) and ctx.optimizer != REAL_OPTIMIZER and ctx.optimizer not in CONTROLS:
        raise ValueError(f"claim {CLAIM_ID}: optimizer must be {REAL_OPTIMIZER!r} or a control ({', '.join(CONTROLS)}), got {ctx.optimizer!r}")
    unknown = sorted(set(ctx.options) - {"device"})
    if unknown:
        raise ValueError(f"claim {CLAIM_ID} takes the option device, got {', '.join(unknown)}")
    device = torch.device(ctx.option("device", "cpu"))
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ValueError("device cuda was requested but torch.cuda.is_available() is False")


DEFAULT_OPTIONS = (("device", "cpu"),)

CLAIM = Claim(
    id=CLAIM_ID,
    title="The optimizer class StiefelAdam steps every frame as certified, in float64, float32 and bfloat16",
    statement=(
        "Over drawn scenarios (1-4 frame groups with their own settings, sibling groups that differ in one setting, "
        "0-2 leading axes, r = 1 to r = d, euclidean groups of several tensors, groups added mid-run; steps with and "
        "without a closure, zero_grad both ways, an lr scheduler, checkpoints into a fresh instance, the same one and "
        "the older format; missing, NaN, inf, overflowing and zero gradients; runs past 256 steps), one "
        "torch_impl.StiefelAdam gives every frame reference_impl.step with its own group's current settings and count "
        "within the derived rounding bound of float64, float32 and bfloat16; leaves frames without a gradient "
        "untouched; skips exactly the non-finite frames under skip_nonfinite and refuses, naming a parameter, a "
        "non-finite step in a group that does not skip, with nothing written; counts what it skipped in one float64 "
        "count per frame; restores on load exactly what it saved; calls the closure once and returns its loss; steps ordinary tensors "
        "exactly as torch.optim.AdamW; refuses every option it does not implement and every bad setting or tensor "
        "with a ValueError naming it; and keeps the promises its documentation states bit for bit or against torch: a float "
        "and a tensor lr give the same step, the sync-free route the default route's values, clip_grad_norm_finite_ "
        "torch's total for every norm type, and a parameter on the meta device is refused."
    ),
    latex=(
        r"\|W^{+}_{\mathrm{class}} - \mathrm{step}_{\mathrm{ref}}(W, G, m, v, t; h_{\mathrm{group}})\|_F \le "
        r"\beta(d, r, u_W, u_{mv}, u_c),\quad t_{\mathrm{frame}}^{+} = t_{\mathrm{frame}} + [\mathrm{step\ finite}]"
    ),
    symbolic=Symbolic("not applicable: bookkeeping of an implementation"),
    parts=tuple(_part(name) for name in DTYPE_NAMES) + (Part("refusals", refusal_part), Part("public_functions", public_functions_part),
                                                         Part("promises", promises_part), Part("pairwise", pairwise_part)),
    controls=tuple(Control(name, control_part, spec.description) for name, spec in CONTROLS.items()),
    requires=("torch",),
    default_options=DEFAULT_OPTIONS,
    prepare=_prepare,
    environment=one_thread_environment,
    precisions=(("under test", "torch_impl.StiefelAdam over the drawn scenarios", DTYPE_NAMES),
                ("reference", "the float64 model of the step and the bounds", ("float64",))),
)

__all__ = ["CLAIM", "CONTROL_NAMES", "CONTROLS", "ScenarioRun", "Subject", "broken_subjects", "real_subject", "refusal_part",
           "replay", "run_scenario", "shrink"]
