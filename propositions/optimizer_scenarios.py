"""Drawn scenarios of the optimizer class: a layout and a sequence of operations from a small grammar.

A helper of the claim `optimizer` (propositions/optimizer_class.py; it defines no CLAIM). The claim
runs `torch_impl.StiefelAdam` through scenarios drawn from the seed, in the manner of hypothesis'
stateful testing (a run of an object with state is a drawn sequence of rules, checked after each,
and a failing run shrinks to a shortest one): what is exercised is drawn, as the other claims draw
their frames, so a bug that needs a second group, a frame that is not the last, a later step or a
rarer event meets a scenario that has it.

The grammar
-----------
A *layout* is a tuple of `Group`s: frame groups (manifold "stiefel") holding parameters of shape
lead + (d, r) with 0, 1 or 2 leading axes, r = 1, 1 < r < d and r = d among the shapes, and
euclidean groups holding ordinary tensors of different shapes. Every group has its own settings
(lr, betas, eps, trust_radius, weight_decay, skip_nonfinite). A *sibling* group shares a frame
shape (d, r) with an earlier group and differs from it in exactly one setting: the class may join
the parameters of groups with equal settings into one batched call, and only such a pair tells a
call keyed on too few settings from a correct one. A group may be *late*: added by an
`add_group` operation.

An *operation* (`Op`) is one of OP_KINDS:

  step          every parameter in the optimizer gets a fresh gradient (p.grad set), then step()
  closure_step  step(closure): the closure zeroes the gradients and back-propagates a loss whose
                gradient is the drawn one
  zero_grad     zero_grad(set_to_none=option), then step() on what is left (nothing, or zeros)
  add_group     add_param_group(the late group named by option)
  schedule      a torch.optim.lr_scheduler.MultiplicativeLR step multiplying every lr by option
  schedule_groups  the same scheduler with one factor per group (option: (group, factor) pairs, 1 for
                the others): before the first step it makes two frame groups that differed in lr
                only equal bit for bit (lr_joining_factors), and splits them again between the
                run's first two steps, plain ones
  checkpoint    state_dict saved and loaded: option "fresh" into a new instance over new parameter
                objects, "same" into the same instance, "old_format" into a new instance in the
                older format the class loads (frame groups without "manifold", one int step count
                per parameter)

and a step-like operation carries `Event`s (EVENT_KINDS) planted in one parameter's gradient (one
frame's, for frames): "no_grad" (.grad None), "nan", "inf", "overflow" (a finite gradient whose
square overflows the compute dtype: 2^0.6 emax per entry), "zero" (an exactly zero gradient: with
eps = 0 and lambda = 0 at v = 0 the v^ = 0 branch, xi = 0 never 0/0).

Gradients and initial frames are drawn from keys of stable labels (the op's id, the group's name,
the parameter's index and shape), never from positions, so removing an operation or a parameter
while shrinking leaves every other draw as it was.

Coverage
--------
`walk` replays a scenario's bookkeeping without numbers (which groups are in the optimizer, which
parameters have a gradient, which frames step, are skipped or refused, each frame's count and
whether its v is still 0): the claim's expectations and the coverage `features` come from it, and
the drawing uses the same walk to steer later runs toward the features still missing (`draw_plan`),
so every feature of FEATURES is exercised at every profile, in every dtype, by construction.
"""

from __future__ import annotations

import copy
import itertools
import math
from dataclasses import asdict, dataclass, field, replace

import numpy as np

CLAIM_ID = "optimizer"
DTYPES = ("float64", "float32", "bfloat16")
SETTING_NAMES = ("lr", "betas", "eps", "trust_radius", "weight_decay", "skip_nonfinite", "lr_tensor")

# Frame shapes (d, r): r = 1, r = d and between, small so that long runs stay cheap.
FRAME_SHAPES: tuple[tuple[int, int], ...] = ((1, 1), (3, 1), (6, 1), (2, 2), (4, 4), (4, 2), (5, 3), (7, 2), (6, 4))
LEADING: tuple[tuple[int, ...], ...] = ((), (2,), (3,), (2, 2), (1, 3))
EUCLIDEAN_SHAPES: tuple[tuple[int, ...], ...] = ((5,), (3, 4), (2, 3, 2), (6,), (4, 1), (2, 2, 2))

# Setting values. lr keeps steps of length lr sqrt(d r) at most about 0.6 (inside trust radii);
# beta 0 (no averaging) and eps 0 (scale-free) are legal edge values; trust radii above 1 take the
# kernel's eigh route, at or below 1 Newton-Schulz.
CHOICES = {
    "lr": (0.003, 0.02, 0.07),
    "betas": ((0.9, 0.999), (0.8, 0.95), (0.0, 0.99), (0.5, 0.0)),
    "eps": (0.0, 1e-8, 1e-3),
    "trust_radius": (0.002, 0.2, 0.5, 1.0, 3.0, math.inf),
    "weight_decay": (0.0, 0.01, 0.1),
    "skip_nonfinite": (True, False),
    "lr_tensor": (False, True),  # lr given as a 0-d float64 tensor (what compiled steps and schedulers use)
}
EUCLIDEAN_EPS = (1e-8, 1e-6)  # AdamW divides by sqrt(v^) + eps: eps = 0 at a zero gradient is 0/0
SCHEDULE_FACTORS = (0.5, 0.8, 1.25)
CLIP_NORMS = (0.5, 2.0, 1e6)  # max_norm of a clip_step: mostly clipping, sometimes not
# norm_type of a clip_step, as labels (JSON-safe: "inf"); its option is (max_norm, label). A step with
# an overflowing gradient takes "2" or "3": a 1- or inf-norm of entries 2^(0.6 emax) is finite, so the
# clip would scale that gradient back into range and the frame would step instead of being skipped.
CLIP_NORM_TYPES = ("2", "1", "3", "inf")
CLIP_NORM_TYPES_OVERFLOW = ("2", "3")


def clip_option(option) -> tuple[float, float]:
    """(max_norm, norm_type) of a clip_step's option: (max_norm, label), or a bare max_norm (norm 2)."""
    if isinstance(option, (tuple, list)):
        return float(option[0]), float(option[1])
    return float(option), 2.0
CHECKPOINT_KINDS = ("fresh", "same", "old_format")
OP_KINDS = ("step", "closure_step", "clip_step", "zero_grad", "add_group", "schedule", "schedule_groups", "checkpoint", "project")
STEP_KINDS = ("step", "closure_step", "clip_step", "zero_grad")
EVENT_KINDS = ("no_grad", "nan", "inf", "overflow", "zero", "off_manifold")
NONFINITE = ("nan", "inf", "overflow")
DRIFT = 0.1  # an off_manifold event: W -> (1 + DRIFT) W + E, ||E||_F about DRIFT: far beyond any manifold tolerance

# A long run per dtype: past 256 steps, where a count kept in bfloat16 (8 significant bits) stops
# counting (257 rounds to 256) and a count kept in a uint8 wraps.
LONG_RUN_STEPS = 300
COUNT_LIMIT = 256

# Every feature a run can exercise; zero coverage of one, in some dtype, makes the claim inconclusive.
LAYOUT_FEATURES = (
    "frame_groups_1", "frame_groups_2", "frame_groups_3", "frame_groups_4",
    "leading_axes_0", "leading_axes_1", "leading_axes_2", "r_is_1", "r_between", "r_is_d",
    "joined_call", "euclidean_several_shapes", "eigh_route", "newton_schulz_route",
)
OPERATION_FEATURES = tuple(f"siblings_differ_in_{name}" for name in SETTING_NAMES) + (
    "weight_decay_frames", "euclidean_weight_decay", "tensor_lr", "late_group_stepped", "clip_step", "clip_with_nonfinite_unit",
    "clip_norm_1", "clip_norm_3", "clip_norm_inf", "clip_norm_with_nonfinite_unit", "project",
    "step", "closure_step", "zero_grad_set_to_none", "zero_grad_zeros", "add_group", "schedule",
    "checkpoint_fresh", "checkpoint_same", "checkpoint_old_format", "refused_step", "refused_step_not_first_parameter",
    "count_past_256", "schedule_joins_groups", "schedule_splits_joined_groups",
)
EVENT_FEATURES = (
    "no_grad_frames", "no_grad_euclidean", "nan_frame", "inf_frame", "overflow_frame",
    "nonfinite_frame_not_last_of_call", "nonfinite_euclidean", "nonfinite_euclidean_beside_finite", "zero_gradient_at_v_zero",
    "skipped_frame", "off_manifold_frame", "off_manifold_refused", "no_grad_between_joined_parameters",
    "no_grad_euclidean_not_last",
)
FEATURES = LAYOUT_FEATURES + OPERATION_FEATURES + EVENT_FEATURES


# --------------------------------------------------------------------------------------------
# The grammar's objects (frozen, JSON-able through to_dict / scenario_from_dict)
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Settings:
    lr: float
    betas: tuple
    eps: float
    trust_radius: float
    weight_decay: float
    skip_nonfinite: bool
    lr_tensor: bool = False

    def replaced(self, name: str, value) -> "Settings":
        return replace(self, **{name: value})

    def as_options(self) -> dict:
        """The group's options as the class takes them (lr a 0-d float64 tensor where lr_tensor)."""
        lr = self.lr
        if self.lr_tensor:
            import torch

            lr = torch.tensor(self.lr, dtype=torch.float64)
        return {"lr": lr, "betas": tuple(self.betas), "eps": self.eps, "trust_radius": self.trust_radius,
                "weight_decay": self.weight_decay, "skip_nonfinite": self.skip_nonfinite}


@dataclass(frozen=True)
class Group:
    name: str  # stable: "f<k>" frame groups, "e<k>" euclidean groups (keys the draws)
    manifold: str  # "stiefel" or "euclidean"
    shapes: tuple[tuple[int, ...], ...]
    settings: Settings
    late: bool = False  # added by an add_group operation, not at construction

    @property
    def frames(self) -> bool:
        return self.manifold == "stiefel"


@dataclass(frozen=True)
class Event:
    kind: str  # EVENT_KINDS
    group: str
    param: int
    frame: int = 0  # flat frame index of a frame parameter (0 for a euclidean tensor)
    entry: int = 0  # flat entry within the frame (or tensor) that gets the planted value


@dataclass(frozen=True)
class Op:
    id: int  # stable: keys the op's gradients
    kind: str
    events: tuple[Event, ...] = ()
    option: object = None


@dataclass(frozen=True)
class Scenario:
    dtype: str
    label: str  # the run's name in its plan ("run-3"): keys its draws
    groups: tuple[Group, ...]
    ops: tuple[Op, ...]

    def group(self, name: str) -> Group:
        return next(g for g in self.groups if g.name == name)

    def to_dict(self) -> dict:
        return {"dtype": self.dtype, "label": self.label, "groups": [asdict(g) for g in self.groups],
                "ops": [{**asdict(op), "events": [asdict(e) for e in op.events]} for op in self.ops]}

    def size(self) -> tuple:
        """The order the shrinker minimises: operations, then events, then frames, then parameters."""
        frames = sum(math.prod(s[:-2]) if g.frames else 1 for g in self.groups for s in g.shapes)
        entries = sum(math.prod(s) for g in self.groups for s in g.shapes)
        return (len(self.ops), sum(len(op.events) for op in self.ops), len(self.groups),
                sum(len(g.shapes) for g in self.groups), frames, entries)

    def describe(self) -> str:
        """One line: the layout and the operations."""
        layout = "; ".join(f"{g.name}{' (late)' if g.late else ''} {g.manifold} {[list(s) for s in g.shapes]} "
                           f"{_settings_text(g.settings)}" for g in self.groups)
        ops = ", ".join(_op_text(op) for op in self.ops)
        return f"{self.dtype}: [{layout}] ops: {ops}"


def _settings_text(s: Settings) -> str:
    return (f"lr={s.lr:g}{' (tensor)' if s.lr_tensor else ''} betas=({s.betas[0]:g}, {s.betas[1]:g}) eps={s.eps:g} "
            f"trust_radius={s.trust_radius:g} weight_decay={s.weight_decay:g} skip_nonfinite={s.skip_nonfinite}")


def _op_text(op: Op) -> str:
    option = "" if op.option is None else f"({op.option})"
    events = "".join(f" [{e.kind} {e.group}.{e.param}#{e.frame}]" for e in op.events)
    return f"{op.kind}{option}{events}"


def scenario_from_dict(data: dict) -> Scenario:
    """The Scenario of Scenario.to_dict (a certificate's counterexample; non-finite floats may come back as strings)."""
    def number(x):
        return float(x)

    groups = tuple(Group(g["name"], g["manifold"], tuple(tuple(int(n) for n in s) for s in g["shapes"]),
                         Settings(number(g["settings"]["lr"]), tuple(number(b) for b in g["settings"]["betas"]),
                                  number(g["settings"]["eps"]), number(g["settings"]["trust_radius"]),
                                  number(g["settings"]["weight_decay"]), bool(g["settings"]["skip_nonfinite"]),
                                  bool(g["settings"].get("lr_tensor", False))),
                         bool(g["late"])) for g in data["groups"])
    ops = tuple(Op(int(o["id"]), o["kind"], tuple(Event(**e) for e in o["events"]), _option(o["kind"], o["option"]))
                for o in data["ops"])
    return Scenario(data["dtype"], data["label"], groups, ops)


def _option(kind: str, option):
    if kind == "clip_step":
        return (float(option[0]), str(option[1])) if isinstance(option, (tuple, list)) else float(option)
    if kind == "schedule":
        return float(option)
    if kind == "schedule_groups":
        return tuple((str(name), float(factor)) for name, factor in option)
    if kind == "zero_grad":
        return bool(option)
    if kind == "project":
        return (str(option[0]), int(option[1]))
    return option


# --------------------------------------------------------------------------------------------
# The walk: the scenario's bookkeeping without numbers
# --------------------------------------------------------------------------------------------


@dataclass
class FrameBook:
    """One frame's bookkeeping: its count, whether its second moment is still exactly 0, and whether
    an off_manifold event left it off St(d, r) (until a project op)."""

    t: int = 0
    v_zero: bool = True
    drifted: bool = False
    has_state: bool = False  # the class keeps a state for its parameter (a written step with a gradient)
    # which buffer the class keeps that state in: the states a step creates together share one buffer, and
    # a load puts a group's states of one shape in one buffer (torch_impl/optimizer.py's load_state_dict)
    buffer: tuple | None = None


@dataclass
class StepPlan:
    """What one step-like operation must do, decided by the walk.

    gradients: (group, param) -> "drawn", "zero" (zero_grad with zeros) or None (no gradient);
    events: (group, param) -> the events planted in that gradient (or, off_manifold, in that frame);
    refused: the step must raise ValueError and change nothing (a non-finite or off-manifold frame
    in a group that does not skip); frames: (group, param, frame) -> "step", "skip" (not finite),
    "off" (off the manifold) or "keep" (no gradient); euclidean: (group, param) -> "step", "skip" or
    "keep"; offenders: (scenario group index, param index) of the frames that refuse."""

    op: Op
    gradients: dict
    events: dict
    refused: bool = False
    frames: dict = field(default_factory=dict)
    euclidean: dict = field(default_factory=dict)
    offenders: list = field(default_factory=list)
    features: list = field(default_factory=list)


@dataclass
class OpPlan:
    """What another operation must do: refused, for a checkpoint while a frame is off the manifold
    (the fresh instance's constructor or the load refuses it, and nothing changes)."""

    op: Op
    refused: bool = False
    features: list = field(default_factory=list)


def frame_count(shape) -> int:
    return math.prod(shape[:-2])


def walk(scenario: Scenario):
    """Yield (op, plan) for every operation: a StepPlan for step-like operations, else an OpPlan.

    The books (per frame) are updated as the class must update them; a plan's `features` are the
    coverage features the operation exercises."""
    active = [g.name for g in scenario.groups if not g.late]
    books = {(g.name, p, k): FrameBook() for g in scenario.groups if g.frames for p, s in enumerate(g.shapes) for k in range(frame_count(s))}
    has_grad: dict = {}
    for op in scenario.ops:
        if op.kind in STEP_KINDS:
            yield op, _plan_step(scenario, op, active, has_grad, books)
            continue
        plan = OpPlan(op)
        if op.kind == "add_group":
            if op.option not in active:
                active.append(op.option)
            plan.features.append("add_group")
        elif op.kind in ("schedule", "schedule_groups"):
            plan.features.append("schedule")
            scenario, changed = _scheduled(scenario, op, active)
            plan.features += changed
        elif op.kind == "checkpoint":
            plan.refused = any(book.drifted for key, book in books.items() if key[0] in active)
            if plan.refused:
                plan.features.append("checkpoint_refused_off_manifold")
            elif op.option != "old_format" or _older_counts(scenario, books, active):
                plan.features.append(f"checkpoint_{op.option}")
            if not plan.refused:
                for key, book in books.items():
                    if book.has_state:
                        book.buffer = ("load", op.id, key[0], tuple(scenario.group(key[0]).shapes[key[1]][-2:]))
        elif op.kind == "project":
            for key, book in books.items():
                if key[:2] == tuple(op.option):
                    book.drifted = False
            plan.features.append("project")
        yield op, plan


def _scheduled(scenario: Scenario, op: Op, active: list) -> tuple[Scenario, list]:
    """The scenario with its groups' lr as the schedule op leaves them (every lr times op.option, or
    each named group's times its factor: a per-group scheduler; only the groups the optimizer has),
    and the features of what changed:
    two active frame groups whose settings were equal and now differ (they were stepped in one call
    and must now be stepped apart), or differed and are now equal. The later plans read the settings
    from the scenario returned, as the class reads them from its groups."""
    # a scheduler scales the groups the optimizer has: a late group added afterwards keeps its own lr
    factors = dict(op.option) if op.kind == "schedule_groups" else {name: op.option for name in active}
    groups = tuple(replace(g, settings=g.settings.replaced("lr", g.settings.lr * factors[g.name]))
                   if g.name in factors and g.name in active else g for g in scenario.groups)
    after = replace(scenario, groups=groups)
    frames = [name for name in active if scenario.group(name).frames]
    changed = []
    for a, b in itertools.combinations(frames, 2):
        if not joinable(scenario.group(a), scenario.group(b)):
            continue
        before_equal = scenario.group(a).settings == scenario.group(b).settings
        after_equal = after.group(a).settings == after.group(b).settings
        if before_equal and not after_equal:
            changed.append("schedule_splits_joined_groups")
        elif after_equal and not before_equal:
            changed.append("schedule_joins_groups")
    return after, sorted(set(changed))


def joinable(a: Group, b: Group) -> bool:
    """Whether the class would step frames of groups a and b in one call once their settings are equal:
    a frame shape (d, r) in common, and float lrs (groups with tensor lrs are never joined)."""
    return (not a.settings.lr_tensor and not b.settings.lr_tensor
            and bool({tuple(s[-2:]) for s in a.shapes} & {tuple(s[-2:]) for s in b.shapes}))


def lr_joining_factors(a: Group, b: Group) -> tuple[tuple[str, float], ...] | None:
    """Per-group factors that make the lrs of frame groups a and b (which differ in lr only) equal bit
    for bit: a's lr times 2^k lr_b and b's times 2^k lr_a are the same product lr_a lr_b 2^k, rounded
    once either way (2^k exact; k brings the product back near lr_a). None when their other settings differ."""
    if a.settings.replaced("lr", b.settings.lr) != b.settings or a.settings.lr == b.settings.lr:
        return None
    k = -round(math.log2(b.settings.lr))
    return ((a.name, math.ldexp(b.settings.lr, k)), (b.name, math.ldexp(a.settings.lr, k)))


def _older_counts(scenario: Scenario, books: dict, active: list) -> bool:
    """Whether the older format holds an int count here: a frame parameter with a state (it had a
    gradient at a step that was written) whose frames all have the same count."""
    for name in active:
        group = scenario.group(name)
        if not group.frames:
            continue
        for p in range(len(group.shapes)):
            counts = {book.t for key, book in books.items() if key[:2] == (name, p)}
            if books[(name, p, 0)].has_state and len(counts) == 1:
                return True
    return False


def _plan_step(scenario: Scenario, op: Op, active: list, has_grad: dict, books: dict) -> StepPlan:
    """The StepPlan of a step-like op; updates has_grad (the .grad state left behind) and books."""
    events: dict = {}
    for event in op.events:
        if event.group in active:
            events.setdefault((event.group, event.param), []).append(event)
            if event.kind == "off_manifold":
                books[(event.group, event.param, event.frame)].drifted = True
    gradients = {}
    for name in active:
        for p in range(len(scenario.group(name).shapes)):
            key = (name, p)
            if op.kind != "zero_grad":
                gradients[key] = None if any(e.kind == "no_grad" for e in events.get(key, ())) else "drawn"
            else:  # zero_grad: None stays None; a gradient becomes zeros unless set to None
                gradients[key] = None if (op.option or has_grad.get(key) is None) else "zero"
    if op.kind == "zero_grad":
        events = {}
    has_grad.clear()
    has_grad.update(gradients)
    plan = StepPlan(op, gradients, events)
    plan.features.append(op.kind if op.kind != "zero_grad" else ("zero_grad_set_to_none" if op.option else "zero_grad_zeros"))
    _plan_frames(scenario, plan, active, books)
    _plan_euclidean(scenario, plan, active)
    if op.kind == "clip_step" and any(e.kind in ("nan", "inf") for key, planted in events.items() if gradients[key] for e in planted):
        plan.features.append("clip_with_nonfinite_unit")
    if op.kind == "clip_step" and isinstance(op.option, tuple) and op.option[1] != "2":
        plan.features.append(f"clip_norm_{op.option[1]}")
        if "clip_with_nonfinite_unit" in plan.features:
            plan.features.append("clip_norm_with_nonfinite_unit")
    if plan.refused:  # a refused step exercises the refusal and its events, nothing that steps
        kept = ("nan_frame", "inf_frame", "overflow_frame", "off_manifold_refused", "clip_with_nonfinite_unit", "clip_norm_with_nonfinite_unit")
        plan.features = ["refused_step"] + [f for f in plan.features if f in kept]
        first = (scenario.groups.index(scenario.group(active[0])), 0)
        if first not in plan.offenders:
            plan.features.append("refused_step_not_first_parameter")
        plan.frames = {key: "keep" for key in plan.frames}
        plan.euclidean = {key: "keep" for key in plan.euclidean}
        return plan
    plan.features += _setting_features(scenario, plan)
    for key, what in plan.frames.items():
        book = books[key]
        if what != "keep" and not book.has_state:
            book.buffer = ("step", op.id, key[0], tuple(scenario.group(key[0]).shapes[key[1]][-2:]))
        book.has_state = book.has_state or what != "keep"
        if what == "step":
            book.t += 1
            group = scenario.group(key[0])
            zero = plan.gradients[key[:2]] == "zero" or any(e.kind == "zero" and e.frame == key[2] for e in plan.events.get(key[:2], ()))
            exactly_zero = zero and group.settings.weight_decay == 0.0
            if exactly_zero and book.v_zero and group.settings.eps == 0.0:
                plan.features.append("zero_gradient_at_v_zero")
            book.v_zero = book.v_zero and exactly_zero
            if book.t > COUNT_LIMIT and "count_past_256" not in plan.features:
                plan.features.append("count_past_256")
    return plan


def _setting_features(scenario: Scenario, plan: StepPlan) -> list[str]:
    """siblings_differ_in_<setting>: two groups that differ only in that setting step frames of one
    shape (d, r) in this step, with drawn gradients, on a shape whose tangent space is not {0} (on
    1 x 1 frames g = 0, so no setting changes the step); weight_decay_frames, euclidean_weight_decay:
    a frame or an ordinary tensor stepped with lambda > 0; tensor_lr: one stepped with a tensor lr."""
    stepping: dict = {}
    for (name, p, k), what in plan.frames.items():
        shape = scenario.group(name).shapes[p][-2:]
        drawn = plan.gradients[(name, p)] == "drawn" and not any(e.frame == k for e in plan.events.get((name, p), ()))
        if what == "step" and drawn and tuple(shape) != (1, 1):  # a drawn gradient: g is not rounding noise
            stepping.setdefault(name, set()).add(tuple(shape))
    found = []
    names = list(stepping)
    for i, a in enumerate(names):
        for b in names[i + 1:]:
            if stepping[a] & stepping[b]:
                sa, sb = scenario.group(a).settings, scenario.group(b).settings
                differing = [n for n in SETTING_NAMES if getattr(sa, n) != getattr(sb, n)]
                # two tensor lrs are two objects: the class never joins their groups, whatever else is equal
                joinable = differing == ["lr_tensor"] or not (sa.lr_tensor or sb.lr_tensor)
                if len(differing) == 1 and joinable:
                    found.append(f"siblings_differ_in_{differing[0]}")
    stepped_euclidean = [name for (name, _), what in plan.euclidean.items() if what == "step"]
    if any(scenario.group(name).settings.weight_decay > 0 for name in stepping):
        found.append("weight_decay_frames")
    if any(scenario.group(name).settings.weight_decay > 0 for name in stepped_euclidean):
        found.append("euclidean_weight_decay")
    if any(scenario.group(name).settings.lr_tensor for name in list(stepping) + stepped_euclidean):
        found.append("tensor_lr")
    stepped_frames = {name for (name, _, _), what in plan.frames.items() if what == "step"}
    if any(scenario.group(name).late for name in stepped_frames | set(stepped_euclidean)):
        found.append("late_group_stepped")  # an added group stepped with its own settings
    return sorted(set(found))


def _plan_frames(scenario: Scenario, plan: StepPlan, active: list, books: dict) -> None:
    """Which frames step, skip, stay off the manifold or keep; whether the step is refused; the event features."""
    calls: dict = {}  # the batched calls a correct class may form: frames in call order
    for name in active:
        group = scenario.group(name)
        if not group.frames:
            continue
        for p, shape in enumerate(group.shapes):
            key = (name, p)
            planted = plan.events.get(key, ())
            if plan.gradients[key] is None:
                plan.features.append("no_grad_frames")
            for k in range(frame_count(shape)):
                bad = [e for e in planted if e.frame == k and nonfinite_step(e.kind, shape)]
                if plan.gradients[key] is None:
                    plan.frames[(name, p, k)] = "keep"
                    continue
                plan.features += [f"{e.kind}_frame" for e in bad]
                off = books[(name, p, k)].drifted
                if (off or bad) and not group.settings.skip_nonfinite:
                    plan.frames[(name, p, k)] = "step"
                    plan.refused = True
                    plan.offenders.append((scenario.groups.index(group), p))
                    if off:
                        plan.features.append("off_manifold_refused")
                elif off:  # off the manifold first: the class counts it there, whatever its step
                    plan.frames[(name, p, k)] = "off"
                    plan.features.append("off_manifold_frame")
                elif bad:
                    plan.frames[(name, p, k)] = "skip"
                    plan.features.append("skipped_frame")
                else:
                    plan.frames[(name, p, k)] = "step"
                calls.setdefault((shape[-2:], group.settings), []).append((name, p, k))
    for members in calls.values():
        for key in members[:-1]:
            if plan.frames[key] == "skip":
                plan.features.append("nonfinite_frame_not_last_of_call")
                break
    _between_features(scenario, plan, active, books)


def _between_features(scenario: Scenario, plan: StepPlan, active: list, books: dict) -> None:
    """no_grad_between_joined_parameters: in a frame group, a parameter without a gradient between two
    of the same shape that have one, all three with a state in one buffer (created by one step, or put
    there by a load), at a shape other than 1 x 1."""
    for name in active:
        group = scenario.group(name)
        if not group.frames:
            continue
        for p in range(1, len(group.shapes) - 1):
            tails = {tuple(group.shapes[q][-2:]) for q in (p - 1, p, p + 1)}
            with_state = (all(books[(name, q, 0)].has_state for q in (p - 1, p, p + 1))
                          and len({books[(name, q, 0)].buffer for q in (p - 1, p, p + 1)}) == 1)
            # not at 1 x 1, whose tangent space is {0}: every state there is m = 0, v = 0, and one state read for another is equal
            if (len(tails) == 1 and tails != {(1, 1)} and with_state and plan.gradients[(name, p)] is None
                    and plan.gradients[(name, p - 1)] is not None and plan.gradients[(name, p + 1)] is not None):
                plan.features.append("no_grad_between_joined_parameters")


def nonfinite_step(kind: str, shape) -> bool:
    """Whether an event of `kind` makes a frame's step not finite: NaN and inf always; an overflowing
    finite gradient unless the frame is 1 x 1, whose tangent space is {0} (g = G - W W^T G = 0 exactly)."""
    return kind in ("nan", "inf") or (kind == "overflow" and tuple(shape[-2:]) != (1, 1))


def _plan_euclidean(scenario: Scenario, plan: StepPlan, active: list) -> None:
    for name in active:
        group = scenario.group(name)
        if group.frames:
            continue
        for p in range(len(group.shapes)):
            key = (name, p)
            if plan.gradients[key] is None:
                plan.euclidean[key] = "keep"
                plan.features.append("no_grad_euclidean")
            elif any(e.kind in ("nan", "inf") for e in plan.events.get(key, ())) and group.settings.skip_nonfinite:
                # (an overflowing finite gradient is AdamW's to step: its v becomes inf, as torch.optim.AdamW's would)
                plan.euclidean[key] = "skip"
                plan.features.append("nonfinite_euclidean")
            else:
                plan.euclidean[key] = "step"
        kinds = [plan.euclidean[(name, p)] for p in range(len(group.shapes))]
        if "skip" in kinds and "step" in kinds:
            plan.features.append("nonfinite_euclidean_beside_finite")
        if any(kinds[p] == "keep" and "step" in kinds[p + 1:] for p in range(len(kinds))):
            plan.features.append("no_grad_euclidean_not_last")


def layout_features(scenario: Scenario) -> list[str]:
    """The layout features of a scenario (each once)."""
    frame_groups = [g for g in scenario.groups if g.frames]
    found = {f"frame_groups_{len(frame_groups)}"} if 1 <= len(frame_groups) <= 4 else set()
    for g in frame_groups:
        for s in g.shapes:
            found.add(f"leading_axes_{len(s) - 2}")
            d, r = s[-2:]
            found.add("r_is_1" if r == 1 else "r_is_d" if r == d else "r_between")
        if len({s[-2:] for s in g.shapes}) < len(g.shapes):
            found.add("joined_call")
        found.add("eigh_route" if g.settings.trust_radius > 1.0 else "newton_schulz_route")
    for a_index, a in enumerate(frame_groups):
        for b in frame_groups[a_index + 1:]:
            if {s[-2:] for s in a.shapes} & {s[-2:] for s in b.shapes} and a.settings == b.settings:
                found.add("joined_call")
    for g in scenario.groups:
        if not g.frames and len(set(g.shapes)) >= 2:
            found.add("euclidean_several_shapes")
    return sorted(found)


def features(scenario: Scenario) -> dict[str, int]:
    """Coverage of one scenario: feature -> times exercised (layout features count once)."""
    counts = {name: 1 for name in layout_features(scenario)}
    for _, plan in walk(scenario):
        for name in plan.features:
            counts[name] = counts.get(name, 0) + 1
    return counts


# --------------------------------------------------------------------------------------------
# Drawing
# --------------------------------------------------------------------------------------------


def _pick(rng: np.random.Generator, options):
    return options[int(rng.integers(len(options)))]


def _settings(rng: np.random.Generator, euclidean: bool = False) -> Settings:
    values = {name: _pick(rng, CHOICES[name]) for name in SETTING_NAMES}
    if euclidean:
        values["eps"] = _pick(rng, EUCLIDEAN_EPS)
        values["trust_radius"] = 0.5  # not an AdamW setting: the group keeps the default
    return Settings(**values)


def _sibling_value(rng: np.random.Generator, name: str, current):
    """Another value of one setting, chosen so that the two groups' steps differ: a trust radius that
    clips (0.002) beside one that mostly does not, an eps of 1e-3 beside 0 or 1e-8."""
    if name == "trust_radius":
        return 0.002 if current >= 0.2 else math.inf
    if name == "eps":
        return 1e-3 if current < 1e-3 else 0.0
    return _pick(rng, [value for value in CHOICES[name] if value != current])


def _frame_shape(rng, lead_wanted, shape_wanted) -> tuple[int, ...]:
    return tuple(lead_wanted) + tuple(shape_wanted)


def draw_layout(rng: np.random.Generator, missing: set, long: bool) -> tuple[Group, ...]:
    """Frame groups (1-4, siblings and joined calls as missing features ask) and 0-2 euclidean groups."""
    if long:  # small and cheap: one or two groups of few frames
        count = int(rng.integers(1, 3))
    else:
        wanted_counts = [n for n in (1, 2, 3, 4) if f"frame_groups_{n}" in missing]
        sibling_kinds = [n for n in SETTING_NAMES if f"siblings_differ_in_{n}" in missing]
        count = _pick(rng, wanted_counts) if wanted_counts else int(rng.integers(1, 5))
        if sibling_kinds and count < 2:
            count = int(rng.integers(2, 5))
    sibling_kinds = [n for n in SETTING_NAMES if f"siblings_differ_in_{n}" in missing]
    if not long and {"schedule_joins_groups", "schedule_splits_joined_groups"} & missing:
        sibling_kinds.insert(0, "lr")  # a pair that differs in lr only, for a per-group scheduler to join and split
        count = max(count, 2)
    groups: list[Group] = []
    leads = [tuple(lead) for lead in LEADING]
    for index in range(count):
        bases = [g for g in groups if any(tuple(s[-2:]) != (1, 1) for s in g.shapes)]
        name = sibling_kinds[0] if sibling_kinds else _pick(rng, SETTING_NAMES)
        if name in ("lr", "eps", "betas"):
            # a trust region that clips both groups' steps would hide lr, eps and betas (xi = Delta m / ||m||)
            bases = [g for g in bases if g.settings.trust_radius >= 0.5]
        if name != "lr_tensor":  # groups with tensor lrs are never joined: a sibling pair needs float lrs
            bases = [g for g in bases if not g.settings.lr_tensor]
        if bases and rng.random() < (0.8 if sibling_kinds else 0.4):
            if sibling_kinds:
                sibling_kinds.pop(0)
            base = _pick(rng, bases)
            settings = base.settings.replaced(name, _sibling_value(rng, name, getattr(base.settings, name)))
            shared = _pick(rng, [s[-2:] for s in base.shapes if tuple(s[-2:]) != (1, 1)])
        else:
            settings = _settings(rng)
            if sibling_kinds:  # a base for the siblings still wanted: a shape with g != 0, a radius that rarely clips, a float lr
                settings = settings.replaced("trust_radius", _pick(rng, (0.5, 1.0, 3.0, math.inf))).replaced("lr_tensor", False)
            shared = _pick(rng, FRAME_SHAPES if not sibling_kinds else FRAME_SHAPES[1:])
        params = 1 if long else int(rng.integers(1, 4))
        three = index == 0 and "no_grad_between_joined_parameters" in missing and not long
        params = 3 if three else params
        shapes = [_frame_shape(rng, _pick(rng, leads), shared)]
        for _ in range(params - 1):
            joined = three or rng.random() < (0.7 if "joined_call" in missing else 0.35)
            shapes.append(_frame_shape(rng, _pick(rng, leads), shared if joined else _pick(rng, FRAME_SHAPES)))
        if long:
            shapes = [tuple(_pick(rng, ((2,), (3,)))) + tuple(_pick(rng, ((3, 1), (4, 2), (2, 2))))]
        if index == 0 and "zero_gradient_at_v_zero" in missing:
            settings = settings.replaced("eps", 0.0).replaced("weight_decay", 0.0)  # where G = 0 gives v^ = 0 exactly
        late = bool(index > 0 and rng.random() < (0.5 if "late_group_stepped" in missing else 0.25))
        groups.append(Group(f"f{index}", "stiefel", tuple(shapes), settings, late))
    euclidean = 0 if long else int(rng.integers(0, 3))
    wanted = {"euclidean_several_shapes", "nonfinite_euclidean", "nonfinite_euclidean_beside_finite", "no_grad_euclidean",
              "euclidean_weight_decay"}
    if not long and wanted & missing:
        euclidean = max(euclidean, 1)
    for index in range(euclidean):
        several = {"euclidean_several_shapes", "nonfinite_euclidean_beside_finite"} & missing
        size = int(rng.integers(2, 4)) if several else int(rng.integers(1, 4))
        picks = rng.permutation(len(EUCLIDEAN_SHAPES))[:size]
        settings = _settings(rng, euclidean=True)
        if {"nonfinite_euclidean", "nonfinite_euclidean_beside_finite"} & missing and index == 0:
            settings = settings.replaced("skip_nonfinite", True)
        if "euclidean_weight_decay" in missing and index == 0 and settings.weight_decay == 0:
            settings = settings.replaced("weight_decay", 0.1)
        groups.append(Group(f"e{index}", "euclidean", tuple(EUCLIDEAN_SHAPES[i] for i in picks), settings,
                            bool(rng.random() < 0.2)))
    return tuple(groups)


def _frame_event(rng, groups, kind: str, prefer_not_last: bool, avoid: str | None = None) -> Event | None:
    """An event in a random frame of a random frame parameter (a non-last frame of a call when asked;
    not the first parameter of group `avoid`)."""
    frame_groups = [g for g in groups if g.frames]
    if not frame_groups:
        return None
    group = _pick(rng, frame_groups)
    p = int(rng.integers(1 if group.name == avoid and len(group.shapes) > 1 else 0, len(group.shapes)))
    shape = group.shapes[p]
    frames = frame_count(shape)
    if prefer_not_last and frames == 1 and len(group.shapes) > 1 and group.name != avoid:
        p = int(rng.integers(len(group.shapes) - 1))  # an earlier parameter of the group: not the call's last frame
        shape = group.shapes[p]
        frames = frame_count(shape)
    frame = int(rng.integers(max(1, frames - 1))) if prefer_not_last and frames > 1 else int(rng.integers(frames))
    if kind == "overflow" and not nonfinite_step(kind, shape):
        kind = "nan"  # a 1 x 1 frame's step stays finite whatever its gradient
    return Event(kind, group.name, p, frame, int(rng.integers(math.prod(shape[-2:]))))


def _euclidean_event(rng, groups, kind: str, not_last: bool = False) -> Event | None:
    """An event in one ordinary tensor (a tensor that is not its group's last one when asked)."""
    euclidean = [g for g in groups if not g.frames and (kind not in NONFINITE or g.settings.skip_nonfinite)]
    several = [g for g in euclidean if len(g.shapes) > 1]
    euclidean = several if several and (kind in NONFINITE or not_last) else euclidean
    if not euclidean:
        return None
    group = _pick(rng, euclidean)
    p = int(rng.integers(max(1, len(group.shapes) - 1))) if not_last else int(rng.integers(len(group.shapes)))
    return Event(kind, group.name, p, 0, int(rng.integers(math.prod(group.shapes[p]))))


def _between_event(rng, groups) -> Event | None:
    """No gradient for a frame parameter that has joined parameters before and after it: the call then
    joins parameters whose states lie in one buffer with a gap."""
    choices = []
    for g in groups:
        if not g.frames or g.late:
            continue
        for p in range(1, len(g.shapes) - 1):
            tail = tuple(g.shapes[p][-2:])
            if tuple(g.shapes[p - 1][-2:]) == tail == tuple(g.shapes[p + 1][-2:]):
                choices.append((g.name, p))
    if not choices:
        return None
    name, p = _pick(rng, choices)
    return Event("no_grad", name, p)


EVENT_TARGETS = ("nan_frame", "inf_frame", "overflow_frame", "no_grad_frames", "no_grad_euclidean", "nonfinite_euclidean",
                 "nonfinite_euclidean_beside_finite", "nonfinite_frame_not_last_of_call", "refused_step",
                 "refused_step_not_first_parameter", "off_manifold_frame", "off_manifold_refused",
                 "no_grad_between_joined_parameters", "no_grad_euclidean_not_last")
RANDOM_EVENT_KINDS = ("no_grad", "nan", "inf", "overflow", "zero")  # off_manifold only when wanted or rarely


def _event_kind(rng, target) -> str:
    if target in ("off_manifold_frame", "off_manifold_refused"):
        return "off_manifold"
    if target in ("nonfinite_frame_not_last_of_call", "refused_step", "refused_step_not_first_parameter"):
        return _pick(rng, NONFINITE)
    fixed = {"nan_frame": "nan", "inf_frame": "inf", "overflow_frame": "overflow", "no_grad_frames": "no_grad", "zero_gradient_at_v_zero": "zero",
             "no_grad_between_joined_parameters": "no_grad"}
    if target in fixed:
        return fixed[target]
    return "off_manifold" if rng.random() < 0.04 else _pick(rng, RANDOM_EVENT_KINDS)


def _event_groups(groups, target):
    """The frame groups an event for `target` may land in."""
    frames = [g for g in groups if g.frames and not g.late]
    if target == "zero_gradient_at_v_zero":
        return [g for g in frames if g.settings.eps == 0 and g.settings.weight_decay == 0]
    if target in ("refused_step", "refused_step_not_first_parameter", "off_manifold_refused"):
        chosen = [g for g in frames if not g.settings.skip_nonfinite] or groups
        if target == "refused_step_not_first_parameter":
            chosen = [g for g in chosen if g is not groups[0] or len(g.shapes) > 1] or chosen
        return chosen
    if target == "off_manifold_frame":
        return [g for g in frames if g.settings.skip_nonfinite] or groups
    return groups


def _events(rng, groups, missing: set, first: bool) -> tuple[Event, ...]:
    """0-3 events for one step, steered toward the missing event features (a zero gradient at v = 0
    only at the first step, where every frame's v is still 0); a target drawn for is taken out of
    `missing` (the run's own copy), so that one run does not repeat it at every step."""
    events = []
    # a zero gradient at v = 0 only at the first step; a missing gradient between joined parameters
    # only after it (their states must exist)
    wanted = (["zero_gradient_at_v_zero"] if first and "zero_gradient_at_v_zero" in missing else []) + [
        name for name in EVENT_TARGETS if name in missing and not (first and name == "no_grad_between_joined_parameters")]
    count = int(rng.choice([0, 0, 1, 1, 2, 3])) + (1 if wanted else 0)
    for _ in range(count):
        target = wanted.pop(0) if wanted else None
        missing.discard(target)
        if target in ("no_grad_euclidean", "no_grad_euclidean_not_last", "nonfinite_euclidean", "nonfinite_euclidean_beside_finite"):
            kind = "no_grad" if target.startswith("no_grad") else _pick(rng, ("nan", "inf"))
            event = _euclidean_event(rng, groups, kind, not_last=target == "no_grad_euclidean_not_last")
        elif target == "no_grad_between_joined_parameters":
            event = _between_event(rng, groups)
        else:
            kind = _event_kind(rng, target)
            event = _frame_event(rng, _event_groups(groups, target), kind,
                                 prefer_not_last=target == "nonfinite_frame_not_last_of_call" or rng.random() < 0.3,
                                 avoid=groups[0].name if target == "refused_step_not_first_parameter" else None)
            if event is None and target is None and kind != "off_manifold":
                event = _euclidean_event(rng, groups, kind)
        # one event per frame, and none beside a missing gradient: the walk reads each planted value alone
        taken = {(e.group, e.param, e.frame) for e in events} | {(e.group, e.param, None) for e in events if e.kind == "no_grad"}
        if event is not None and (event.group, event.param, event.frame) not in taken and (event.group, event.param, None) not in taken:
            if event.kind != "no_grad" or not any((e.group, e.param) == (event.group, event.param) for e in events):
                events.append(event)
    return tuple(events)


def draw_ops(rng: np.random.Generator, groups: tuple[Group, ...], missing: set, steps: int) -> tuple[Op, ...]:
    """`steps` step-like operations interleaved with the others; late groups added at random places;
    a frame sent off the manifold is projected back (stiefel_project_) one to three steps later."""
    ops: list[Op] = []
    missing = set(missing)  # this run's copy: _events takes out what it has drawn for
    wanted_kinds = [k for k in ("closure_step", "clip_step", "zero_grad_set_to_none", "zero_grad_zeros", "schedule",
                                "checkpoint_fresh", "checkpoint_same", "checkpoint_old_format") if k in missing]
    wanted_norms = [label for label in CLIP_NORM_TYPES if f"clip_norm_{label}" in missing]
    if wanted_norms and "clip_step" not in wanted_kinds:
        wanted_kinds.append("clip_step")
    if {"schedule_joins_groups", "schedule_splits_joined_groups"} & missing:
        # two frame groups that differ in lr only are made equal before the first step, so that the
        # class's first grouping puts them in one call, and split again (one lr halved) between two
        # plain steps, before any event: the same parameters have gradients and no step is refused, so
        # nothing but the settings can make the class group its frames anew, and a class that keeps
        # its grouping from before a schedule steps them with each other's settings
        pairs = [(a, b) for a, b in itertools.combinations([g for g in groups if g.frames and not g.late], 2)
                 if joinable(a, b) and lr_joining_factors(a, b) is not None]
        if pairs:
            a, b = pairs[int(rng.integers(len(pairs)))]
            ops += [Op(0, "schedule_groups", option=lr_joining_factors(a, b)), Op(1, "step"),
                    Op(2, "schedule_groups", option=((a.name, 0.5),)), Op(3, "step")]
    late = [g.name for g in groups if g.late]
    additions: dict = {}  # step index -> late groups added before that step
    for name in late:
        additions.setdefault(int(rng.integers(0, max(1, min(steps, 6) - 1)) + 1), []).append(name)
    projections: dict = {}  # step index -> parameters projected back before that step
    step_index = 0
    while step_index < steps:
        for name in additions.pop(step_index, []):
            ops.append(Op(len(ops), "add_group", option=name))
        for target in projections.pop(step_index, []):
            ops.append(Op(len(ops), "project", option=target))
        roll = rng.random()
        if step_index >= 8 and roll < 0.9:  # past the first steps, plain steps (a long run's bulk)
            ops.append(Op(len(ops), "step"))
            step_index += 1
            continue
        if wanted_kinds and roll < 0.35:
            kind = wanted_kinds.pop(0)
        elif roll < 0.5:
            kind = _pick(rng, ("schedule", "checkpoint_fresh", "checkpoint_same", "checkpoint_old_format", "closure_step",
                               "clip_step", "zero_grad_set_to_none", "zero_grad_zeros"))
        else:
            kind = "step"
        if kind.startswith("checkpoint_"):
            ops.append(Op(len(ops), "checkpoint", option=kind[len("checkpoint_"):]))
            continue
        if kind == "schedule":
            ops.append(Op(len(ops), "schedule", option=float(_pick(rng, SCHEDULE_FACTORS))))
            continue
        if kind.startswith("zero_grad"):
            ops.append(Op(len(ops), "zero_grad", option=kind == "zero_grad_set_to_none"))
            step_index += 1
            continue
        events = _events(rng, groups, missing if step_index < 8 else set(), step_index == 0) if (step_index < 8 or rng.random() < 0.05) else ()
        if kind == "clip_step" and {"clip_with_nonfinite_unit", "clip_norm_with_nonfinite_unit"} & missing and not any(e.kind in ("nan", "inf") for e in events):
            extra = _frame_event(rng, groups, "nan", prefer_not_last=False)
            if extra is not None and all((e.group, e.param) != (extra.group, extra.param) for e in events):
                events = events + (extra,)
        option = None
        if kind == "clip_step":
            allowed = CLIP_NORM_TYPES_OVERFLOW if any(e.kind == "overflow" for e in events) else CLIP_NORM_TYPES
            if "clip_norm_with_nonfinite_unit" in missing and any(e.kind in ("nan", "inf") for e in events):
                allowed = tuple(label for label in allowed if label != "2")  # another norm type beside a unit left out
                missing.discard("clip_norm_with_nonfinite_unit")
            wanted = [label for label in wanted_norms if label in allowed]
            label = wanted[0] if wanted else str(_pick(rng, allowed))
            if label in wanted_norms:
                wanted_norms.remove(label)
            option = (float(_pick(rng, CLIP_NORMS)), label)
        ops.append(Op(len(ops), kind, events=events, option=option))
        for event in events:
            if event.kind == "off_manifold":
                projections.setdefault(step_index + int(rng.integers(1, 4)), []).append((event.group, event.param))
        step_index += 1
    for targets in projections.values():  # a frame still off the manifold at the end is projected back
        ops += [Op(len(ops) + i, "project", option=target) for i, target in enumerate(targets)]
    return tuple(ops)


def draw_run(seed: int, dtype: str, index: int, missing: set, steps: int, long: bool, rng_for) -> Scenario:
    """Run `index` of a dtype's plan: its layout and operations from rng_for(seed, CLAIM_ID, "scenario", dtype, index)."""
    rng = rng_for(seed, CLAIM_ID, "scenario", dtype, index)
    groups = draw_layout(rng, missing, long)
    ops = draw_ops(rng, groups, missing, LONG_RUN_STEPS if long else steps)
    return Scenario(dtype, f"run-{index}", groups, ops)


@dataclass(frozen=True)
class PlanSettings:
    """How many runs a dtype's plan has: at least `runs` (the first of them long), more while a
    feature is missing, at most `max_runs`; `steps` step-like operations per ordinary run."""

    runs: int
    steps: int
    max_runs: int = 40


def plan_settings(profile) -> PlanSettings:
    """quick: 2 runs of 6 steps; default: 8 runs of 8; thorough: 40 runs of 12 (plus runs while a feature is missing)."""
    runs = {"quick": 2, "default": 8}.get(profile.name, max(2, min(40, profile.frames // 25_000)))
    steps = {"quick": 6, "default": 8}.get(profile.name, max(6, min(12, profile.steps)))
    return PlanSettings(runs=runs, steps=steps, max_runs=max(40, runs + 20))


def draw_plan(seed: int, dtype: str, settings: PlanSettings, rng_for) -> tuple[list[Scenario], list[str]]:
    """The runs of one dtype and the features none of them exercises (empty unless max_runs ran out).

    Run 0 is the long run; each later run is drawn with the features still missing, which steer
    its layout, events and operations toward them (deterministic: the same seed gives the same plan)."""
    runs: list[Scenario] = []
    missing = set(FEATURES)
    index = 0
    while index < settings.runs or (missing and index < settings.max_runs):
        scenario = draw_run(seed, dtype, index, missing, settings.steps, index == 0, rng_for)
        runs.append(scenario)
        missing -= set(features(scenario))
        index += 1
    return runs, sorted(missing, key=FEATURES.index)


# --------------------------------------------------------------------------------------------
# Shrinking: simpler scenarios, in the order they are tried
# --------------------------------------------------------------------------------------------


def without_ops(scenario: Scenario, drop: set) -> Scenario:
    """The scenario without the ops whose positions are in `drop` (an add_group dropped makes its
    group an initial one; the groups a shrunk scenario no longer uses are kept by the layout pass)."""
    kept = tuple(op for i, op in enumerate(scenario.ops) if i not in drop)
    added = {op.option for op in kept if op.kind == "add_group"}
    groups = tuple(replace(g, late=g.late and g.name in added) for g in scenario.groups)
    return replace(scenario, groups=groups, ops=kept)


def simpler_layouts(scenario: Scenario):
    """Scenarios with one group, parameter, leading axis or frame fewer, or a smaller frame shape."""
    for g in scenario.groups:
        if len(scenario.groups) > 1:
            yield _without_group(scenario, g.name)
    for g in scenario.groups:
        for p in range(len(g.shapes)):
            if len(g.shapes) > 1:
                yield _without_param(scenario, g.name, p)
    for g in scenario.groups:
        for p, shape in enumerate(g.shapes):
            lead, tail = shape[:-2] if g.frames else shape, shape[-2:] if g.frames else ()
            for smaller in _smaller_leads(lead):
                yield _with_shape(scenario, g.name, p, tuple(smaller) + tuple(tail))
            if g.frames:
                d, r = tail
                for d2, r2 in ((d - 1, min(r, d - 1)), (d, r - 1)):
                    if d2 >= 1 and r2 >= 1:
                        yield _with_shape(scenario, g.name, p, tuple(lead) + (d2, r2))


def _smaller_leads(lead: tuple) -> list[tuple]:
    out = []
    if lead:
        out.append(lead[1:])
        for i, n in enumerate(lead):
            if n > 1:
                out.append(lead[:i] + (n - 1,) + lead[i + 1:])
    return out


def simpler_events(scenario: Scenario):
    """Scenarios with one event fewer (last op first), or with an op's events moved to frame 0 / entry 0."""
    for i in reversed(range(len(scenario.ops))):
        op = scenario.ops[i]
        for j in range(len(op.events)):
            events = op.events[:j] + op.events[j + 1:]
            yield replace(scenario, ops=scenario.ops[:i] + (replace(op, events=events),) + scenario.ops[i + 1:])


def _without_group(scenario: Scenario, name: str) -> Scenario:
    ops = tuple(replace(op, events=tuple(e for e in op.events if e.group != name)) for op in scenario.ops
                if not (op.kind == "add_group" and op.option == name))
    return replace(scenario, groups=tuple(g for g in scenario.groups if g.name != name), ops=ops)


def _without_param(scenario: Scenario, name: str, p: int) -> Scenario:
    groups = tuple(replace(g, shapes=g.shapes[:p] + g.shapes[p + 1:]) if g.name == name else g for g in scenario.groups)

    def moved(e: Event):
        if e.group != name or e.param < p:
            return e
        return replace(e, param=e.param - 1)

    ops = tuple(replace(op, events=tuple(moved(e) for e in op.events if not (e.group == name and e.param == p))) for op in scenario.ops)
    return replace(scenario, groups=groups, ops=ops)


def _with_shape(scenario: Scenario, name: str, p: int, shape: tuple) -> Scenario:
    group = scenario.group(name)
    groups = tuple(replace(g, shapes=g.shapes[:p] + (shape,) + g.shapes[p + 1:]) if g.name == name else g for g in scenario.groups)
    frames = frame_count(shape) if group.frames else 1
    entries = math.prod(shape[-2:]) if group.frames else math.prod(shape)

    def fitted(e: Event):
        if e.group != name or e.param != p:
            return e
        return replace(e, frame=min(e.frame, frames - 1), entry=min(e.entry, entries - 1))

    ops = tuple(replace(op, events=tuple(fitted(e) for e in op.events)) for op in scenario.ops)
    return replace(scenario, groups=groups, ops=ops)


__all__ = [
    "CLAIM_ID", "DTYPES", "EVENT_KINDS", "Event", "FEATURES", "Group", "LONG_RUN_STEPS", "OP_KINDS", "Op", "PlanSettings",
    "OLDER_FORMAT_DEFAULTS", "Scenario", "Settings", "StepPlan", "clip_option", "draw_plan", "draw_run", "features", "frame_count", "layout_features",
    "older_format", "plan_settings", "scenario_from_dict", "simpler_events", "simpler_layouts", "walk", "without_ops",
]


# --------------------------------------------------------------------------------------------
# Checkpoints
# --------------------------------------------------------------------------------------------


# Group settings the older format did not have, and the value a group of that format then has: a
# group holding that value loses the key (a group with another value could not be saved in that format).
OLDER_FORMAT_DEFAULTS = (("skip_nonfinite", False), ("retraction_method", "auto"))


def older_format(saved: dict, optimizer=None) -> dict:
    """The state_dict as the class's older format holds it (the format its load_state_dict promises to
    read): frame groups without the keys "manifold", "skip_nonfinite" and "retraction_method" (that
    format's groups stepped frames, refused a step that was not finite, and retracted by the "auto"
    route), and one int step count per frame parameter (a parameter whose frames have different counts
    could not be saved in that format: kept per frame)."""
    import torch

    converted = copy.deepcopy(saved)
    frame_ids = set()
    for group in converted["param_groups"]:
        if group.get("manifold", "stiefel") == "stiefel":
            group.pop("manifold", None)
            for key, value in OLDER_FORMAT_DEFAULTS:
                if key in group and group[key] == value:
                    del group[key]
            frame_ids.update(group["params"])
    for saved_id, state in converted["state"].items():
        count = state.get("step")
        if saved_id in frame_ids and torch.is_tensor(count) and count.numel() and bool((count == count.reshape(-1)[0]).all()):
            state["step"] = int(count.reshape(-1)[0])
    return converted
