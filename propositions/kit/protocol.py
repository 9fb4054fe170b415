"""A claim as a declarative recipe, and the one function that runs every recipe.

A claim module states *what* its certificate holds; `run_claim` decides *how* it is run, in one
place for every claim:

    CLAIM = Claim(
        id="P7", title=..., statement=..., latex=...,
        symbolic=Symbolic(METHOD, derive),          # derive() -> SymbolicSteps; cached per process
        exact=exact_part,                           # exact_part(seed) -> list of exact-check dicts
        parts=(Part("projector", projector_part),   # part(ctx) -> Evidence
               trajectory_part(TRAJECTORIES)),      # TrajectoryPlan("P7", ...): started first, collected last
        controls=(Control("no_sym", control_part),),# control(ctx) -> Evidence, ctx.optimizer = "no_sym"
        notes=("...",),
    )

What `run_claim` does, in this order:

1. `prepare(ctx)` (optional) checks the options and may return a normalised context.
2. The symbolic derivation and every `background` part are started as tasks of the current executor
   (propositions.kit.parallel), so that they run beside the chunk maps on a pool.
3. The exact tier runs, then each foreground part in the order declared (a part maps its chunks
   over the executor itself).
4. Each control runs in a context whose optimizer is the control's name; a control that returns
   None does not apply in this context (the cross-check's controls break the real kernel only).
   A control's checks decide its ControlResult; its extra goes to extra["control_evidence"][name],
   its figures and notes beside the parts'.
5. The background parts are collected. Checks, frames, extra, figures, notes and inconclusive
   reasons are put together in the *declared* order of the parts (never in completion order), so a
   certificate does not depend on where or when its parts ran.

The extra of a certificate always holds `optimizer` (the variant under test), `control_frames` when
a control ran, and `timings` (seconds per stage: the run record, outside the digest). Two parts
that write the same extra or figure key are a programming error, raised at once.
"""

from __future__ import annotations

import contextlib
import copy
import functools
import math
import time
from dataclasses import dataclass, field, replace
from typing import Any, Callable, ContextManager, Iterable, Sequence

from .common import ClaimResult, ControlResult, NumericalCheck, Profile, SymbolicResult, SymbolicStep
from .source_edits import SourceEditError
from .parallel import TaskFailed, drawing, map_chunks
from .parallel import start as start_task
from .parallel import start_named


@dataclass(frozen=True)
class Context:
    """Where a claim runs: the seed of every draw, the profile, the optimizer under test (a variant
    name of reference_impl.VARIANTS, or a Variant object) and the claim's own options."""

    seed: int
    profile: Profile
    optimizer: Any = "stiefel_adam"
    options: dict = field(default_factory=dict)
    under_test: Any = None  # in a control's run: the optimizer the claim certifies (the control is ctx.optimizer)

    def option(self, name: str, default=None):
        return self.options.get(name, default)

    def with_optimizer(self, optimizer) -> "Context":
        return replace(self, optimizer=optimizer)

    def for_control(self, name: str) -> "Context":
        """The context of the control `name`: it is the optimizer, and under_test keeps the one the
        claim certifies (a control that applies only at some precision reads it there)."""
        return replace(self, optimizer=name, under_test=self.optimizer)


class Counts(dict):
    """Tallies that add up when evidence merges (Evidence.merge): a number adds, a list of numbers
    adds entry by entry, a nested Counts merges the same way. A plain dict in an extra is not a
    tally: its keys merge one by one."""

    def add(self, other: dict) -> "Counts":
        """Add the tallies of `other` into self; returns self."""
        for key, value in other.items():
            mine = self.get(key)
            if mine is None:
                self[key] = Counts().add(value) if isinstance(value, dict) else list(value) if isinstance(value, list) else value
            elif isinstance(mine, Counts):
                mine.add(value)
            elif isinstance(mine, list):
                if len(mine) != len(value):
                    raise ValueError(f"cannot add a tally of {len(value)} entries to one of {len(mine)} ({key!r})")
                self[key] = [a + b for a, b in zip(mine, value)]
            else:
                self[key] = mine + value
        return self


def _merge_extra(mine: dict, theirs: dict, where: str = "extra") -> None:
    """Fold the extra `theirs` into `mine` (Evidence.merge): Counts add, lists concatenate, dicts
    merge key by key, anything else must be equal in both (a chunk that disagrees is a bug)."""
    for key, value in theirs.items():
        if key not in mine:  # a copy: a later merge must not change the chunk's own evidence
            if isinstance(value, Counts):
                mine[key] = Counts().add(value)
            elif isinstance(value, dict):
                mine[key] = {}
                _merge_extra(mine[key], value, f"{where}[{key!r}]")
            else:
                mine[key] = list(value) if isinstance(value, list) else value
            continue
        here = mine[key]
        if _kind(here) is not _kind(value):
            raise ValueError(f"cannot merge {where}[{key!r}]: a {type(here).__name__} in one chunk, a "
                             f"{type(value).__name__} in a later one")
        if isinstance(here, Counts):
            here.add(value)
        elif isinstance(here, list):
            here.extend(value)
        elif isinstance(here, dict):
            _merge_extra(here, value, f"{where}[{key!r}]")
        elif not _same(here, value):
            raise ValueError(f"cannot merge {where}[{key!r}]: {here!r} in one chunk, {value!r} in a later one")


def _kind(value) -> type | None:
    """How a value of an extra merges: as Counts, as a list, as a dict, or by equality (None)."""
    return next((kind for kind in (Counts, list, dict) if isinstance(value, kind)), None)


def _same(a, b) -> bool:
    """Equal values, NaN equal to NaN."""
    if isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b):
        return True
    return bool(a == b)


@dataclass
class Evidence:
    """What one part of a claim (or one control), or one chunk of a part, produced.

    The chunks of a part (propositions.kit.parallel.map_chunks) each return an Evidence, and
    `Evidence.merged` folds them in chunk order into the part's: the same Evidence that one loop
    over every chunk would have produced, however the chunks were split between tasks.
    """

    checks: list[NumericalCheck] = field(default_factory=list)
    frames: int = 0  # random frames this part drew (independent of every other part's)
    extra: dict = field(default_factory=dict)
    figures: dict = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    inconclusive: list[str] = field(default_factory=list)

    def merge(self, other: "Evidence") -> "Evidence":
        """Fold in `other`, the evidence of a later chunk; returns self.

        checks: one of the same name merges (NumericalCheck.merge reproduces the sequential adds),
        a new name is appended as a copy (`other` is never changed by this or a later merge); frames
        add; extra merges key by key (Counts add, lists concatenate, dicts merge, other values must
        agree); figures must not share a name; notes and reasons for inconclusive are appended,
        each once.
        """
        by_name = {check.name: check for check in self.checks}
        for check in other.checks:
            if check.name in by_name:
                by_name[check.name].merge(check)
            else:
                self.checks.append(copy.deepcopy(check))
                by_name[check.name] = self.checks[-1]
        self.frames += other.frames
        _merge_extra(self.extra, other.extra)
        clash = set(self.figures) & set(other.figures)
        if clash:
            raise ValueError(f"two chunks draw the figure(s) {sorted(clash)}")
        self.figures.update(other.figures)
        self.notes += [note for note in dict.fromkeys(other.notes) if note not in self.notes]
        self.inconclusive += [reason for reason in dict.fromkeys(other.inconclusive) if reason not in self.inconclusive]
        return self

    @classmethod
    def merged(cls, partials: Iterable["Evidence"]) -> "Evidence":
        """The partials folded in order into a fresh Evidence (empty when there are none)."""
        total = cls()
        for partial in partials:
            total.merge(partial)
        return total

    def check(self, name: str) -> NumericalCheck:
        """The check called `name` (KeyError naming the checks there are)."""
        for check in self.checks:
            if check.name == name:
                return check
        raise KeyError(f"no check {name!r} (there are {[check.name for check in self.checks]})")


def map_evidence(fn: Callable, chunks: Sequence, *args, task_label: str | None = None, **kwargs) -> Evidence:
    """fn(chunk, *args, **kwargs) -> Evidence for every chunk of `chunks`, as tasks of the current
    executor (kit.parallel.map_chunks), merged in chunk order (Evidence.merged)."""
    return Evidence.merged(map_chunks(fn, chunks, *args, task_label=task_label, **kwargs))


@dataclass(frozen=True)
class Part:
    """A named piece of numerical evidence: run(ctx) -> Evidence.

    background: started as one task before the exact tier and the foreground parts, collected at
    the end (a sequential long run, or a part with chunk maps of its own). run must then be a
    top-level function (or a functools.partial of one) so that it can travel to a worker.
    """

    name: str
    run: Callable[[Context], Evidence]
    background: bool = False


@dataclass(frozen=True)
class Control:
    """A deliberately broken variant the claim's checks must catch: run(ctx) with ctx.optimizer =
    name returns the Evidence of the checks it ran (or None where the control does not apply).
    description: default the variant's own (reference_impl.get_variant(name).description)."""

    name: str
    run: Callable[[Context], Evidence | None]
    description: str | None = None

    def describe(self) -> str:
        if self.description is not None:
            return self.description
        from reference_impl import get_variant

        return get_variant(self.name).description


@dataclass(frozen=True)
class Symbolic:
    """The symbolic tier: `derive()` returns the SymbolicSteps (seed-independent, so derived once
    per process and copied into each result); no `derive` means the tier does not apply and
    `method` says why."""

    method: str
    derive: Callable[[], Iterable[SymbolicStep]] | None = None


@functools.cache
def _derived(derive: Callable) -> tuple[SymbolicStep, ...]:
    return tuple(derive())


def derive_symbolic(symbolic: Symbolic) -> SymbolicResult:
    """The SymbolicResult of a Symbolic tier (a fresh copy of the cached steps)."""
    if symbolic.derive is None:
        return SymbolicResult(symbolic.method)
    return SymbolicResult(symbolic.method, [replace(step) for step in _derived(symbolic.derive)])


def known_variant(ctx: Context) -> None:
    """The default `prepare`: an optimizer that names no variant of reference_impl.VARIANTS (and is
    no Variant object) is refused at once, with reference_impl's one-line ValueError."""
    from reference_impl import get_variant

    get_variant(ctx.optimizer)


@dataclass(frozen=True)
class Claim:
    """A registry entry and the recipe of its certificate; run(seed, profile, optimizer, **options).

    optimizer names a variant of reference_impl.VARIANTS that takes the place of the real step in
    the numerical part (the tests run every claim against the controls it must catch).
    requires: importable packages the run needs beyond the core dependencies (a claim whose
    requirement is missing is skipped by `certify all` with a note, never failed).
    default_options: the keyword options run() takes and their defaults.
    prepare(ctx): checks the options before anything runs and may return a normalised context
    (default known_variant: the optimizer must be a variant of reference_impl).
    environment(ctx): a context manager the whole run happens inside (e.g. one thread), and each
    background part wherever its task runs: a module-level function (a task's arguments are pickled).
    precisions: what the claim computes, part by part: (role, part, dtypes[, package]) with role
    "under test" (the code the certificate is about) or "reference" (the float64 model and the bounds
    it is held to); "{dtype}" in dtypes stands for the claim's dtype option; a part that runs only
    where an optional package imports names it, and is left out of the certificate where it does not. The certificate states them
    (numerical.precision), and its numerical.dtype names the dtypes under test.
    """

    id: str
    title: str
    statement: str
    latex: str
    symbolic: Symbolic
    parts: tuple[Part, ...]
    controls: tuple[Control, ...]
    exact: Callable[[int], list[dict]] | None = None
    notes: tuple[str, ...] = ()
    requires: tuple[str, ...] = ()
    default_options: tuple[tuple[str, str], ...] = ()
    prepare: Callable[[Context], Context | None] | None = known_variant
    environment: Callable[[Context], ContextManager] | None = None
    precisions: tuple[tuple, ...] = (("under test", "reference_impl's step and every check", ("float64",)),)

    @property
    def control_names(self) -> tuple[str, ...]:
        return tuple(control.name for control in self.controls)

    def run(self, seed: int, profile: Profile, optimizer="stiefel_adam", **options) -> ClaimResult:
        return run_claim(self, Context(seed, profile, optimizer, dict(options)))


def _merge_into(target: dict, source: dict, what: str, claim_id: str) -> None:
    clash = set(target) & set(source)
    if clash:
        raise RuntimeError(f"claim {claim_id}: two parts write the {what} key(s) {sorted(clash)}")
    target.update(source)


def _timed(timings: dict, name: str, fn, *args):
    started = time.perf_counter()
    try:
        return fn(*args)
    finally:
        timings[f"{name}_s"] = timings.get(f"{name}_s", 0.0) + time.perf_counter() - started


def _in_environment(environment, run: Callable[[Context], Evidence], ctx: Context) -> Evidence:
    """A background part as a task: it runs inside the claim's environment wherever it runs (a
    worker process has not entered the claim's)."""
    with environment(ctx) if environment is not None else contextlib.nullcontext():
        return run(ctx)


def run_claim(claim: Claim, ctx: Context) -> ClaimResult:
    """Run the recipe `claim` in context `ctx` and put its ClaimResult together (module docstring)."""
    if claim.prepare is not None:
        ctx = claim.prepare(ctx) or ctx
    environment = claim.environment(ctx) if claim.environment is not None else contextlib.nullcontext()
    with environment:
        return _run(claim, ctx)


def _run(claim: Claim, ctx: Context) -> ClaimResult:
    # the distinct draw keys of the claim's own tiers and parts, per group (the draw ledger; the
    # controls' draws are their own: a control redraws the checks' frames on purpose)
    with drawing() as drawn:
        result = _run_drawn(claim, ctx)
    result.extra["draw_keys"] = draw_counts(drawn)
    return result


def draw_counts(drawn: Iterable) -> dict[str, int]:
    """{group: distinct draw keys} of a drawing() frame, in group order."""
    counts: dict[str, int] = {}
    for group, _ in drawn:
        counts[group] = counts.get(group, 0) + 1
    return dict(sorted(counts.items()))


def _run_drawn(claim: Claim, ctx: Context) -> ClaimResult:
    timings: dict[str, float] = {}
    # a tier with nothing to derive is not worth a task
    symbolic = start_task(derive_symbolic, claim.symbolic) if claim.symbolic.derive is not None else None
    pending = {part.name: start_named(part.name, _in_environment, claim.environment, part.run, ctx) for part in claim.parts if part.background}
    exact = _timed(timings, "exact", claim.exact, ctx.seed) if claim.exact is not None else []

    evidence: dict[str, Evidence] = {}
    for part in claim.parts:
        if not part.background:
            evidence[part.name] = _timed(timings, part.name, part.run, ctx)

    controls, control_evidence, unplanted = [], [], []
    control_drawn: set = set()  # the controls' own draw ledger, beside the claim's
    for control in claim.controls:
        try:
            with drawing() as drawn:
                found = _timed(timings, "controls", control.run, ctx.for_control(control.name))
            control_drawn |= drawn
        except SourceEditError as error:
            # a bug written into the source as it was: that source has changed, and the control says so
            # (the claim is inconclusive) while the checks still judge the code as it is
            unplanted.append(f"control {control.name} could not be planted: {error}")
            continue
        if found is None:
            continue
        controls.append(ControlResult.from_checks(control.name, control.describe(), found.checks))
        control_evidence.append((control.name, found))

    for name, task in pending.items():
        evidence[name] = _timed(timings, name, task.result)
    symbolic_failed = []
    try:
        symbolic_result = _timed(timings, "symbolic_wait", symbolic.result) if symbolic else derive_symbolic(claim.symbolic)
    except TaskFailed as error:
        # code the symbolic executor cannot run (a cast to float32, a library call on symbols): that
        # tier says nothing, and the numerical checks, already run, still judge the code
        symbolic_result = SymbolicResult(claim.symbolic.method)
        symbolic_failed.append(f"the symbolic tier could not be derived: {error}")

    result = _assemble(claim, ctx, symbolic_result, exact, evidence, controls, control_evidence, timings)
    result.inconclusive += unplanted + symbolic_failed
    if control_drawn:
        # held by the coverage contract as the claim's are: a control whose key lost its chunk runs on fewer layers
        result.extra["control_draw_keys"] = draw_counts(control_drawn)
    return result


def _stream_defects(seed: int, claim_id: str) -> list[str]:
    """Every draw of a claim comes from rng_for(seed, *key), one stream per key: a reason for
    inconclusive where two keys give the same stream, or one key two streams (then the claim's
    chunks, shapes and labels would not draw independently, or not reproducibly)."""
    from .common import rng_for

    keys = [(claim_id, "stream_probe", index) for index in range(4)]
    first = [tuple(rng_for(seed, *key).integers(0, 2**62, size=4)) for key in keys]
    again = tuple(rng_for(seed, *keys[0]).integers(0, 2**62, size=4))
    reasons = []
    if len(set(first)) < len(first):
        reasons.append("rng_for gives the same stream for different keys: the claim's draws are not independent")
    if again != first[0]:
        reasons.append("rng_for gives two streams for one key: the claim's draws are not reproducible")
    return reasons


def _assemble(claim: Claim, ctx: Context, symbolic_result, exact, evidence: dict, controls: list,
              control_evidence: list, timings: dict) -> ClaimResult:
    """The ClaimResult, its parts' evidence put together in the declared order."""
    checks, frames, figures, inconclusive = [], 0, {}, []
    notes = list(claim.notes)
    extra: dict = {"optimizer": getattr(ctx.optimizer, "name", ctx.optimizer)}
    for part in claim.parts:
        found = evidence[part.name]
        checks += found.checks
        frames += found.frames
        _merge_into(extra, found.extra, "extra", claim.id)
        _merge_into(figures, found.figures, "figure", claim.id)
        notes += found.notes
        inconclusive += found.inconclusive
    with drawing():  # the probe's keys are not the claim's draws
        inconclusive += _stream_defects(ctx.seed, claim.id)
    # the same float residuals added twice: the same draws twice, where the check counts them as two
    inconclusive += [f"check {check.name}: the same residuals were added twice ({first}; then {second}): its draws are not "
                     "independent, so it holds fewer distinct samples than it counts" for check in checks for first, second in check.repeated[:1]]
    if controls:
        extra["control_frames"] = ctx.profile.control_frames
    control_extra = {name: found.extra for name, found in control_evidence if found.extra}
    if control_extra:
        extra["control_evidence"] = control_extra
    for _, found in control_evidence:
        _merge_into(figures, found.figures, "figure", claim.id)
        notes += found.notes
    extra["timings"] = timings
    return ClaimResult(
        symbolic=symbolic_result,
        checks=checks,
        controls=controls,
        frames=frames,
        exact=exact,
        extra=extra,
        figures=figures,
        notes=notes,
        inconclusive=inconclusive,
        dtype=str(ctx.option("dtype", "float64")),
    )


__all__ = ["Claim", "Context", "Control", "Counts", "Evidence", "map_evidence", "Part", "Symbolic", "derive_symbolic", "known_variant", "run_claim"]
