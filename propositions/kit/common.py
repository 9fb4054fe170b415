"""The bookkeeping of a certificate that every proposition module shares.

A proposition module exposes one `Claim` (propositions.kit.protocol: a declarative recipe run by
`run_claim`). `Claim.run(seed, profile, optimizer)` returns a `ClaimResult`: the symbolic derivation, the exact-arithmetic tier, the
numerical checks, the controls and any proposition-specific evidence, all JSON-able through
`ClaimResult.to_dict()`. The `certify` package wraps that into a certificate; nothing here knows
about files, digests or the command line.

Conventions that keep every certificate honest and reproducible:

* Randomness: every draw comes from `rng_for(seed, *key)`, a PCG64 generator seeded by
  `numpy.random.SeedSequence(seed, spawn_key=...)` with the key derived from readable labels
  (claim id, check name, shape, chunk). The key is recorded next to the worst case, so one frame
  can be regenerated without re-running everything.
* Residuals and bounds: a `NumericalCheck` accumulates per-sample residuals and per-sample bounds
  (each bound from the error analysis written next to the check). It passes when every residual
  is at most its bound. Bounds are > 0 always (docs/claims.md#tolerances). Bitwise checks measure the
  residual in ulps and use the bound 0.5, i.e. they require exact equality.
* Tightness: every check also pools residual/bound; its median and 1st percentile are recorded,
  and a check whose median is below TIGHTNESS_THRESHOLD must say why in its tightness_note or is
  listed in the certificate's notes by the claim-level audit (ClaimResult.tightness_audit).
* Controls: a control is detected when a check that the real optimizer passes fails for the
  control with margin (worst residual / bound) of at least DETECTION_FACTOR. An undetected control
  fails the certificate.
"""

from __future__ import annotations

import copy
import functools
import hashlib
import math
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Iterator

import numpy as np

from reference_impl import UNIT_ROUNDOFF, random_point

from .figures import figures_to_dict
from .parallel import note_draw

u = UNIT_ROUNDOFF

# A control must break the claim by at least this factor over the bound: well clear of any
# borderline rounding effect, so "detected" never depends on a lucky draw.
DETECTION_FACTOR = 10.0

# Histogram of log10(residual / bound) kept by every check, for the residual-over-bound figure.
RATIO_BINS = np.linspace(-20.0, 4.0, 49)

# Samples kept per check for the quantiles of residual and of residual/bound (the first ones added).
QUANTILE_POOL_SIZE = 200_000

# Every bound earns its place: a check whose median residual/bound is below this is three decades
# looser than what it measures; unless its tightness_note says why the bound cannot be tighter,
# the claim's certificate lists it (a note, not a failure: a loose bound is weak, not wrong).
TIGHTNESS_THRESHOLD = 1e-3


def wide_scale_gradients(rng: np.random.Generator, shape: tuple[int, ...], decades: int = 30) -> np.ndarray:
    """Gaussian matrices of `shape` (..., d, r) times 10^k per frame, k uniform in [-decades, decades]
    (30; an implementation storing in float32 or bfloat16 gets the decades its range holds,
    kit/precision.Precision.scale_decades)."""
    scale = 10.0 ** rng.uniform(-float(decades), float(decades), size=shape[:-2])
    return rng.standard_normal(shape) * scale[..., None, None]


# --------------------------------------------------------------------------------------------
# Profiles and shape plans
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Profile:
    """How much evidence a run collects.

    frames: at least this many random frames per numerical claim (>= 10^4 default,
    >= 10^6 thorough); steps: length of multi-step trajectories; long_run_steps: steps of the
    feasibility-drift runs; mp_dps / mp_samples: digits and frames for the mpmath comparisons;
    control_frames: frames (summed over the shapes of the control's plan) that each control, a
    deliberately broken variant, runs through the checks that must catch it. A control needs a
    clear miss, not statistics, so it runs on far fewer frames than the claim; every claim takes
    this one number (default 64, the quick profile's, for profiles built by hand);
    kernel_long_run_steps: steps of the kernel's long runs (the cross-check, one per dtype, each
    checkpoint against the one-step bound at its own input, so the length adds no bound; the drift
    settles within the first steps in every dtype), long_run_steps where None.
    """

    name: str
    frames: int
    steps: int
    long_run_steps: int
    mp_dps: int
    mp_samples: int
    control_frames: int = 64
    kernel_long_run_steps: int | None = None

    @property
    def kernel_steps(self) -> int:
        return self.long_run_steps if self.kernel_long_run_steps is None else self.kernel_long_run_steps


PROFILES: dict[str, Profile] = {
    "quick": Profile("quick", frames=1_000, steps=4, long_run_steps=1_000, mp_dps=40, mp_samples=3, control_frames=64),
    "default": Profile("default", frames=10_000, steps=8, long_run_steps=10_000, mp_dps=50, mp_samples=8,
                       control_frames=256, kernel_long_run_steps=2_000),
    "thorough": Profile("thorough", frames=1_000_000, steps=16, long_run_steps=100_000, mp_dps=60, mp_samples=32,
                        control_frames=4_096),
}


def get_profile(name: str) -> Profile:
    try:
        return PROFILES[name]
    except KeyError:
        raise ValueError(f"unknown profile {name!r}; known: {', '.join(PROFILES)}") from None


# The shape grid: r = 1, r = d, square and tall frames up to (1024, 128). Small frames carry most of
# the sample count (they are cheap and rounding behaves differently there); large frames get a few
# each so that the bounds' dependence on d and r is exercised.
SMALL_SHAPES: tuple[tuple[int, int], ...] = (
    (1, 1), (2, 1), (2, 2), (3, 1), (3, 2), (3, 3), (4, 4), (5, 2), (6, 6),
    (8, 1), (8, 3), (8, 8), (12, 5), (16, 4), (16, 16),
)
LARGE_SHAPES: tuple[tuple[int, int], ...] = ((32, 8), (64, 16), (64, 64), (128, 16), (256, 32), (1024, 128))


@dataclass(frozen=True)
class ShapeBatch:
    d: int
    r: int
    count: int


def shape_plan(
    profile: Profile,
    small: Iterable[tuple[int, int]] = SMALL_SHAPES,
    large: Iterable[tuple[int, int]] = LARGE_SHAPES,
    frames: int | None = None,
) -> list[ShapeBatch]:
    """Frames per shape so that the total is at least `frames` (default profile.frames).

    Large shapes get count proportional to 1 / (d r^2) (their per-frame cost), at least 2; the
    small shapes share the rest equally.
    """
    total = profile.frames if frames is None else frames
    small, large = list(small), list(large)
    plan = []
    for d, r in large:
        # about frames * 64 / (d r^2) frames: 10^4 default -> 2 at (1024, 128), 39 at (64, 16)
        count = max(2, min(total // 20, int(total * 64 / (d * r * r))))
        plan.append(ShapeBatch(d, r, count))
    used = sum(b.count for b in plan)
    per_small = max(1, math.ceil(max(total - used, 0) / max(len(small), 1)))
    plan = [ShapeBatch(d, r, per_small) for d, r in small] + plan
    return plan


def chunk_sizes(count: int, d: int, r: int, max_entries: int = 2**21) -> Iterator[int]:
    """Split `count` frames of shape (d, r) into chunks of at most max_entries matrix entries."""
    per_chunk = max(1, max_entries // (d * max(r, d)))
    done = 0
    while done < count:
        size = min(per_chunk, count - done)
        yield size
        done += size


def batch_chunks(batches: Iterable, sizes: Callable[[Any], Iterable[int]] | None = None) -> list[tuple[int, int, int, int]]:
    """(d, r, count, chunk index) for every chunk of every ShapeBatch of `batches`, in order: the
    chunks a claim maps as tasks (kit.parallel.map_chunks). sizes(batch): the batch's chunk sizes
    (default chunk_sizes(batch.count, batch.d, batch.r))."""
    sizes = sizes or (lambda batch: chunk_sizes(batch.count, batch.d, batch.r))
    return [(batch.d, batch.r, count, index) for batch in batches for index, count in enumerate(sizes(batch))]


# --------------------------------------------------------------------------------------------
# Reproducible randomness
# --------------------------------------------------------------------------------------------


def _key_word(part: Any) -> int:
    if isinstance(part, (int, np.integer)) and part >= 0:
        return int(part)
    digest = hashlib.sha256(str(part).encode()).digest()
    return int.from_bytes(digest[:4], "little")


def spawn_key(*key: Any) -> list[int]:
    """The integer spawn key of SeedSequence for a tuple of readable labels."""
    return [_key_word(part) for part in key]


def draw_group(*key: Any) -> str:
    """The group a draw key is counted under in the draw ledger: its first two labels (the claim or
    tool, and the part or label), as in "P5/decay"."""
    return "/".join(str(part) for part in key[:2])


def rng_for(seed: int, *key: Any) -> np.random.Generator:
    """Generator for the draw identified by (seed, key): independent streams for distinct keys.

    Each call is noted in the draw ledger (kit.parallel.drawing): a claim's certificate counts the
    distinct keys each group asked for, and the coverage contract holds that count."""
    words = spawn_key(*key)
    note_draw(draw_group(*key), (int(seed), *words))
    return np.random.Generator(np.random.PCG64(np.random.SeedSequence(int(seed), spawn_key=words)))


def chunk_frames(seed: int, claim_id: str, label: str, chunk) -> tuple[tuple, np.random.Generator, np.ndarray]:
    """The frames of one chunk (d, r, count, chunk index): (key, rng, W) with key = (claim_id, label,
    d, r, chunk index), rng = rng_for(seed, *key) and W (count, d, r) Haar frames drawn first from
    rng; the caller draws the chunk's other inputs on from rng."""
    d, r, count, index = chunk[:4]
    key = (claim_id, label, d, r, index)
    rng = rng_for(seed, *key)
    return key, rng, random_point(d, r, rng, (count,))


def chunk_trajectories(seed: int, claim_id: str, label: str, chunk, steps: int) -> tuple[np.random.Generator, np.ndarray, np.ndarray]:
    """The start frames and Gaussian gradients of one chunk's trajectories: (rng, W0 (count, d, r),
    gradients (steps, count, d, r)), drawn in that order after chunk_frames."""
    d, r, count, _ = chunk[:4]
    _, rng, W0 = chunk_frames(seed, claim_id, label, chunk)
    return rng, W0, rng.standard_normal((steps, count, d, r))


# --------------------------------------------------------------------------------------------
# Checks, controls, results
# --------------------------------------------------------------------------------------------


def ulps_apart(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """max |x - y| / ulp(|y|) per frame (leading axes); 0 exactly when the arrays are bit-identical."""
    diff = np.abs(np.asarray(x) - np.asarray(y))
    ulp = np.spacing(np.abs(np.asarray(y)))
    ratio = np.where(diff == 0, 0.0, diff / ulp)
    return ratio.reshape(ratio.shape[:-2] + (-1,)).max(axis=-1) if ratio.ndim >= 2 else ratio


# distinct residual values an add needs before its residuals are fingerprinted (NumericalCheck._fingerprint)
FINGERPRINT_VALUES = 16


@dataclass
class NumericalCheck:
    """Residuals of one check against their derived bounds, accumulated over shapes and chunks.

    name: short identifier; description: what is compared; bound_derivation: the error analysis
    that gives the bound (docs/claims.md#tolerances), in a sentence or two. tightness_note: for a check
    whose median residual/bound is below TIGHTNESS_THRESHOLD, why the bound cannot be tighter
    (e.g. an exact-equality check whose residual is 0 by design); recorded in the certificate.
    """

    name: str
    description: str
    bound_derivation: str
    samples: int = 0
    shapes: list = field(default_factory=list)
    _max_residual: float = 0.0
    _sum_residual: float = 0.0
    # the float sum of each add(), in order: merge() replays them, so a merged check's sum is the
    # sequential one bit for bit however the adds were split between partial checks
    _sum_terms: list = field(default_factory=list)
    _max_ratio: float = -math.inf
    _max_bound: float = 0.0
    _min_bound: float = math.inf
    _ratio_hist: np.ndarray = field(default_factory=lambda: np.zeros(len(RATIO_BINS) + 1, dtype=np.int64))
    # residuals that are exactly 0 are counted here, not in the histogram of log10(residual/bound)
    _zeros: int = 0
    _quantile_pool: list = field(default_factory=list)
    _ratio_pool: list = field(default_factory=list)
    worst: dict | None = None
    tightness_note: str | None = None
    # fingerprints of the residual arrays added (repeated_draws): digest -> where it was first added
    _draws: dict = field(default_factory=dict)
    repeated: list = field(default_factory=list)  # [(first place, second place)] of residual arrays added twice
    # how far each named drawn parameter reached (reach): name -> [smallest, largest]
    extent: dict = field(default_factory=dict)

    # which values each named categorical parameter took (cover): name -> set of labels
    categories: dict = field(default_factory=dict)

    def cover(self, name: str, value) -> None:
        """Record that a categorical parameter of this check (a dtype mix, a norm type, a layout) took
        `value`: the certificate lists them and the coverage contract holds the list (one dropped from
        the claim's loop is missing)."""
        self.categories.setdefault(name, set()).add(str(value))

    def reach(self, name: str, values) -> None:
        """Record the values a drawn or gridded parameter of this check took (a weight decay, the log10
        of a scale or of a condition number, a step count): the certificate keeps the smallest and the
        largest, and the coverage contract holds them (a range cut short reaches less far)."""
        values = np.asarray(values, dtype=np.float64)
        if values.size == 0:
            return
        low, high = float(np.min(values)), float(np.max(values))
        known = self.extent.get(name)
        self.extent[name] = [low, high] if known is None else [min(known[0], low), max(known[1], high)]

    def _fingerprint(self, residual: np.ndarray, shape, key) -> None:
        """Remember the residuals of one add. Two adds of the same non-integer residuals, bit for bit,
        mean the same draws twice (float residuals of different draws do not coincide): draws made
        dependent, or a chunk run twice in place of two. Integer-valued residuals (ulps, counts) and
        single samples coincide by chance and are not fingerprinted, nor are arrays of fewer than
        FINGERPRINT_VALUES distinct values (residuals at rounding level take a few multiples of an ulp,
        and a residual fixed by the settings alone repeats by design)."""
        if residual.size < FINGERPRINT_VALUES or np.unique(residual[np.isfinite(residual)]).size < FINGERPRINT_VALUES:
            return
        digest = hashlib.blake2b(residual.tobytes(), digest_size=12).hexdigest()
        place = f"shape {None if shape is None else tuple(shape)}, key {'/'.join(str(k) for k in key) if key is not None else None}"
        first = self._draws.setdefault(digest, place)
        if first is not place and len(self.repeated) < 3:
            self.repeated.append((first, place))

    def add(self, residual, bound, *, shape=None, key=None, seed=None, extra=None) -> None:
        """Record per-sample residuals (array) and bounds (array or scalar, > 0).

        shape: the (d, r) of these samples; key: the rng_for key that drew them; seed: the run seed.
        The worst sample (largest residual/bound) keeps shape, key and its index in the chunk.
        """
        residual = np.asarray(residual, dtype=np.float64).ravel()
        if residual.size == 1 and np.size(bound) == 1:
            self._add_one(float(residual[0]), float(np.asarray(bound, dtype=np.float64).ravel()[0]), shape, key, seed, extra)
        else:
            self._add_array(residual, bound, shape, key, seed, extra)

    def _add_array(self, residual: np.ndarray, bound, shape, key, seed, extra) -> None:
        """add() of a flat float64 array of residuals."""
        bound = np.broadcast_to(np.asarray(bound, dtype=np.float64), residual.shape).ravel() if residual.size else np.asarray(bound, dtype=np.float64).ravel()
        if residual.size == 0:
            return
        if not np.all(bound > 0):
            raise ValueError(f"check {self.name}: every bound must be > 0 (docs/claims.md#tolerances)")
        residual_for_ratio = np.where(np.isnan(residual), np.inf, residual)
        ratio = residual_for_ratio / bound
        self._fingerprint(residual, shape, key)
        self.samples += residual.size
        if shape is not None and list(shape) not in self.shapes:
            self.shapes.append(list(shape))
        self._max_residual = max(self._max_residual, float(np.max(residual_for_ratio)))
        term = float(np.sum(np.where(np.isfinite(residual_for_ratio), residual_for_ratio, 0.0)))
        self._sum_residual += term
        self._sum_terms.append(term)
        self._max_bound = max(self._max_bound, float(np.max(bound)))
        self._min_bound = min(self._min_bound, float(np.min(bound)))
        zero = ratio == 0
        self._zeros += int(np.count_nonzero(zero))
        log_ratio = np.log10(ratio[~zero])
        self._ratio_hist += np.bincount(np.searchsorted(RATIO_BINS, log_ratio), minlength=len(RATIO_BINS) + 1)
        if len(self._quantile_pool) < QUANTILE_POOL_SIZE:
            self._quantile_pool.extend(residual_for_ratio[: QUANTILE_POOL_SIZE - len(self._quantile_pool)].tolist())
        if len(self._ratio_pool) < QUANTILE_POOL_SIZE:
            self._ratio_pool.extend(ratio[: QUANTILE_POOL_SIZE - len(self._ratio_pool)].tolist())
        index = int(np.argmax(ratio))
        if ratio[index] > self._max_ratio:
            self._max_ratio = float(ratio[index])
            self.worst = {
                "residual": float(residual_for_ratio[index]),
                "bound": float(bound[index]),
                "ratio": float(ratio[index]),
                "shape": None if shape is None else list(shape),
                "index_in_draw": index,
                "seed": seed,
                "spawn_key": None if key is None else spawn_key(*key),
                "key": None if key is None else [str(k) for k in key],
                **({} if extra is None else dict(extra)),
            }

    def _add_one(self, residual: float, bound: float, shape, key, seed, extra) -> None:
        """add() of one sample, on Python floats: the same IEEE operations as the array path (a
        quotient, a maximum, a sum of one term; the bin from numpy's log10 of the same float64), so
        the same record, without a dozen array calls for one number (most adds are of one sample).
        One sample is never fingerprinted (fewer than FINGERPRINT_VALUES values)."""
        if not bound > 0:
            raise ValueError(f"check {self.name}: every bound must be > 0 (docs/claims.md#tolerances)")
        for_ratio = math.inf if math.isnan(residual) else residual
        ratio = for_ratio / bound
        self.samples += 1
        if shape is not None and list(shape) not in self.shapes:
            self.shapes.append(list(shape))
        self._max_residual = max(self._max_residual, for_ratio)
        term = for_ratio if math.isfinite(for_ratio) else 0.0
        self._sum_residual += term
        self._sum_terms.append(term)
        self._max_bound = max(self._max_bound, bound)
        self._min_bound = min(self._min_bound, bound)
        if ratio == 0:
            self._zeros += 1
        else:
            self._ratio_hist[int(np.searchsorted(RATIO_BINS, np.log10(np.float64(ratio))))] += 1
        if len(self._quantile_pool) < QUANTILE_POOL_SIZE:
            self._quantile_pool.append(for_ratio)
        if len(self._ratio_pool) < QUANTILE_POOL_SIZE:
            self._ratio_pool.append(ratio)
        if ratio > self._max_ratio:
            self._max_ratio = ratio
            self.worst = {
                "residual": for_ratio,
                "bound": bound,
                "ratio": ratio,
                "shape": None if shape is None else list(shape),
                "index_in_draw": 0,
                "seed": seed,
                "spawn_key": None if key is None else spawn_key(*key),
                "key": None if key is None else [str(k) for k in key],
                **({} if extra is None else dict(extra)),
            }

    def exceeding(self) -> int:
        """How many samples have residual / bound > 1 (from the ratio histogram, whose edges hold log10
        ratio 0)."""
        above = int(np.searchsorted(RATIO_BINS, 0.0)) + 1
        return int(self._ratio_hist[above:].sum())

    def merge(self, other: "NumericalCheck") -> "NumericalCheck":
        """Fold in `other`, a partial check of the same name filled by later adds; returns self.

        Gives exactly what the adds of `other` made after those of `self` would have given: counts
        and histogram add, maxima and minima combine, the residual sum replays other's per-add sums
        in order, the quantile pools are filled in order up to QUANTILE_POOL_SIZE, the shapes keep
        their first-seen order, and the worst case is the first largest ratio (other's only when
        strictly larger). Merging partial checks in task order therefore reproduces the sequential
        loop whatever the split (propositions.kit.parallel).
        """
        if other.name != self.name:
            raise ValueError(f"cannot merge check {other.name!r} into check {self.name!r}")
        for name, (low, high) in other.extent.items():
            self.reach(name, [low, high])
        for name, values in other.categories.items():
            self.categories.setdefault(name, set()).update(values)
        if not other.samples:
            return self
        self.samples += other.samples
        for shape in other.shapes:
            if shape not in self.shapes:
                self.shapes.append(list(shape))
        self._max_residual = max(self._max_residual, other._max_residual)
        for term in other._sum_terms:
            self._sum_residual += term
            self._sum_terms.append(term)
        self._max_bound = max(self._max_bound, other._max_bound)
        self._min_bound = min(self._min_bound, other._min_bound)
        self._ratio_hist = self._ratio_hist + other._ratio_hist
        self._zeros += other._zeros
        self._quantile_pool.extend(other._quantile_pool[: max(QUANTILE_POOL_SIZE - len(self._quantile_pool), 0)])
        self._ratio_pool.extend(other._ratio_pool[: max(QUANTILE_POOL_SIZE - len(self._ratio_pool), 0)])
        if other._max_ratio > self._max_ratio:
            self._max_ratio = other._max_ratio
            self.worst = None if other.worst is None else dict(other.worst)
        self.repeated = (self.repeated + other.repeated)[:3]
        for digest, place in other._draws.items():
            first = self._draws.setdefault(digest, place)
            if first is not place and len(self.repeated) < 3:
                self.repeated.append((first, place))
        return self

    def __deepcopy__(self, memo: dict) -> "NumericalCheck":
        """A copy that shares nothing mutable with self. The pools hold up to QUANTILE_POOL_SIZE
        floats each, which copy.deepcopy would memoise one by one (most of the time of merging a
        claim's chunks): they, the sum terms and the shapes are copied as lists of immutable values."""
        twin = copy.copy(self)
        memo[id(self)] = twin
        twin.shapes = [list(shape) for shape in self.shapes]
        twin._sum_terms = list(self._sum_terms)
        twin._ratio_hist = self._ratio_hist.copy()
        twin._quantile_pool = list(self._quantile_pool)
        twin._ratio_pool = list(self._ratio_pool)
        twin._draws = dict(self._draws)
        twin.repeated = list(self.repeated)
        twin.extent = {name: list(span) for name, span in self.extent.items()}
        twin.categories = {name: set(values) for name, values in self.categories.items()}
        twin.worst = copy.deepcopy(self.worst, memo)
        return twin

    @property
    def max_ratio(self) -> float:
        return self._max_ratio if self.samples else math.nan

    @property
    def passed(self) -> bool:
        return self.samples > 0 and self._max_ratio <= 1.0

    @property
    def median_ratio(self) -> float:
        """Median of residual/bound over the pooled samples (nan before any sample)."""
        return self._quantile(np.asarray(self._ratio_pool), 0.5) if self._ratio_pool else math.nan

    @property
    def loose(self) -> bool:
        """The median residual/bound is below TIGHTNESS_THRESHOLD (the bound is three decades loose)."""
        return self.samples > 0 and self.median_ratio < TIGHTNESS_THRESHOLD

    @staticmethod
    def _quantile(values: np.ndarray, q: float) -> float:
        """np.quantile, where two infinite neighbours (inf - inf in the interpolation) give inf, the
        quantile they bracket, not NaN and a RuntimeWarning in the certificate's notes."""
        with np.errstate(invalid="ignore"):
            found = float(np.quantile(values, q))
        return math.inf if math.isnan(found) and np.any(np.isposinf(values)) and not np.any(np.isnan(values)) else found

    def to_dict(self) -> dict:
        pool = np.asarray(self._quantile_pool) if self._quantile_pool else np.zeros(1)
        ratios = np.asarray(self._ratio_pool) if self._ratio_pool else np.full(1, math.nan)
        return {
            "name": self.name,
            "description": self.description,
            "bound_derivation": self.bound_derivation,
            "samples": self.samples,
            "shapes": self.shapes,
            "residual": {
                "max": self._max_residual,
                "mean": self._sum_residual / max(self.samples, 1),
                "median": self._quantile(pool, 0.5),
                "p99": self._quantile(pool, 0.99),
            },
            "bound": {"min": self._min_bound if self.samples else None, "max": self._max_bound},
            "max_ratio": self.max_ratio,
            "ratio": {
                "median": self._quantile(ratios, 0.5),
                "p01": self._quantile(ratios, 0.01),
                "max": self.max_ratio,
                "pooled": int(ratios.size if self._ratio_pool else 0),
            },
            "tightness_note": self.tightness_note,
            "passed": self.passed,
            "worst_case": self.worst,
            "ratio_histogram": {"log10_edges": RATIO_BINS.tolist(), "counts": self._ratio_hist.tolist(), "zeros": self._zeros},
            **({"reach": {name: list(span) for name, span in sorted(self.extent.items())}} if self.extent else {}),
            **({"covers": {name: sorted(values) for name, values in sorted(self.categories.items())}} if self.categories else {}),
        }


@dataclass
class ControlResult:
    """A deliberately wrong variant and whether the claim's checks caught it."""

    name: str
    description: str
    check: str  # the check that caught it (or the one that came closest)
    residual: float
    bound: float

    @property
    def margin(self) -> float:
        return self.residual / self.bound

    @property
    def detected(self) -> bool:
        return self.margin >= DETECTION_FACTOR

    @classmethod
    def from_checks(cls, name: str, description: str, checks: Iterable[NumericalCheck]) -> "ControlResult":
        """The check with the largest worst-case ratio decides (it is the one that detects)."""
        checks = [c for c in checks if c.samples]
        if not checks:
            raise ValueError(f"control {name}: no check recorded any sample")
        best = max(checks, key=lambda c: c.max_ratio)
        return cls(name, description, best.name, best.worst["residual"], best.worst["bound"])

    def to_dict(self) -> dict:
        return {
            "name": self.name,
            "description": self.description,
            "check": self.check,
            "residual": self.residual,
            "bound": self.bound,
            "margin": self.margin,
            "detection_factor": DETECTION_FACTOR,
            "detected": self.detected,
        }


@dataclass
class SymbolicStep:
    description: str
    latex: str
    reduced: bool  # the expression reduced to the identity (difference simplified to zero)

    def to_dict(self) -> dict:
        return {"description": self.description, "latex": self.latex, "reduced": bool(self.reduced)}


@dataclass
class SymbolicResult:
    method: str
    steps: list[SymbolicStep] = field(default_factory=list)

    @property
    def status(self) -> str:
        if not self.steps:
            return "not_applicable"
        return "proved" if all(s.reduced for s in self.steps) else "failed"

    def to_dict(self) -> dict:
        return {"method": self.method, "status": self.status, "steps": [s.to_dict() for s in self.steps]}


@dataclass
class ClaimResult:
    """Everything a claim's run produced. `extra` and `figures` hold JSON-able data only."""

    symbolic: SymbolicResult
    checks: list[NumericalCheck]
    controls: list[ControlResult]
    frames: int  # random float64 frames examined by the numerical part
    exact: list[dict] = field(default_factory=list)  # {"name", "description", "samples", "passed"}
    extra: dict = field(default_factory=dict)
    figures: dict = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    inconclusive: list[str] = field(default_factory=list)
    dtype: str = "float64"  # the storage dtype the numerical part ran in

    @property
    def verdict(self) -> str:
        return decide_verdict(self._record())[0]

    def failures(self) -> list[str]:
        return decide_verdict(self._record())[1]

    def _record(self) -> dict:
        return {
            "symbolic": self.symbolic.to_dict(),
            "exact": self.exact,
            "numerical": {"checks": [c.to_dict() for c in self.checks]},
            "controls": [c.to_dict() for c in self.controls],
            "inconclusive": self.inconclusive,
        }

    def tightness_audit(self) -> list[str]:
        """One note per check whose median residual/bound is below TIGHTNESS_THRESHOLD and that
        says nothing (tightness_note) about why its bound cannot be tighter."""
        return [
            f"tightness audit: check {c.name} has median residual/bound {c.median_ratio:.3g} < {TIGHTNESS_THRESHOLD:g} "
            "and no tightness_note saying why its bound cannot be tighter"
            for c in self.checks
            if c.loose and not c.tightness_note
        ]

    def to_dict(self) -> dict:
        verdict, failures, inconclusive = decide_verdict(self._record())
        return to_jsonable(
            {
                "verdict": verdict,
                "failures": failures,
                "symbolic": self.symbolic.to_dict(),
                "exact": self.exact,
                "numerical": {"frames": self.frames, "dtype": self.dtype, "checks": [c.to_dict() for c in self.checks]},
                "controls": [c.to_dict() for c in self.controls],
                "extra": self.extra,
                "figures": figures_to_dict(self.figures),
                "notes": list(self.notes) + self.tightness_audit(),
                "inconclusive": inconclusive,
            }
        )


def decide_verdict(record: dict) -> tuple[str, list[str], list[str]]:
    """The one rule that turns a claim's record into (verdict, failures, inconclusive reasons).

    record: the dict form of a claim's result or certificate (keys symbolic, exact, numerical.checks,
    controls, inconclusive). "fail" when a symbolic step did not reduce, a check's worst
    residual/bound exceeds 1, a control is not detected or an exact check failed; otherwise
    "inconclusive" when the claim gave a reason, ran no numerical check, or ran no control (a
    certificate that could not have failed is worth nothing); otherwise "pass". Used by ClaimResult
    and, on the certificate itself, by certify, so a certificate cannot contradict its own data.
    """
    symbolic = record.get("symbolic", {}) or {}
    checks = record.get("numerical", {}).get("checks", [])
    controls = record.get("controls", [])
    exact = record.get("exact", [])
    failures: list[str] = []
    if symbolic.get("status") == "failed":
        failures += [f"symbolic step did not reduce: {step.get('description')}" for step in symbolic.get("steps", []) if not step.get("reduced")]
        failures += [] if failures else ["the symbolic derivation failed"]
    failures += [f"check {c.get('name')}: worst residual/bound = {_ratio_text(c.get('max_ratio'))} > 1" for c in checks if not c.get("passed", False)]
    failures += [f"control {c.get('name')} not detected (margin {_ratio_text(c.get('margin'))} < {DETECTION_FACTOR:g})" for c in controls if not c.get("detected", False)]
    failures += [f"exact check {e.get('name')} failed" for e in exact if not e.get("passed", False)]
    inconclusive = list(record.get("inconclusive", []))
    if failures:
        return "fail", failures, inconclusive
    if not checks:
        inconclusive.append("no numerical check was run")
    elif not controls:
        inconclusive.append("no control was run, so the certificate could not have failed (docs/algorithm.md#the-controls)")
    return ("inconclusive" if inconclusive else "pass"), failures, inconclusive


def _ratio_text(value) -> str:
    try:
        return f"{float(value):.3g}"
    except (TypeError, ValueError):
        return str(value)


def to_jsonable(obj):
    """numpy scalars/arrays to Python; non-finite floats to the strings 'inf', '-inf', 'nan'."""
    if isinstance(obj, dict):
        return {str(k): to_jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [to_jsonable(v) for v in obj]
    if isinstance(obj, np.ndarray):
        return to_jsonable(obj.tolist())
    if isinstance(obj, (np.bool_, bool)):
        return bool(obj)
    if isinstance(obj, (np.integer,)):
        return int(obj)
    if isinstance(obj, (float, np.floating)):
        value = float(obj)
        if math.isnan(value):
            return "nan"
        if math.isinf(value):
            return "inf" if value > 0 else "-inf"
        return value
    return obj


class _Detected(BaseException):
    """Raised inside stop_at_detection once a check misses its bound by DETECTION_FACTOR (a BaseException:
    the blocks it ends catch Exception to record a call that raised, and must not record this)."""


def _add_then_stop(check: "NumericalCheck", *args, **kwargs) -> None:
    NumericalCheck.add(check, *args, **kwargs)
    if check.samples and check.max_ratio >= DETECTION_FACTOR:
        raise _Detected(check.name)


class stop_at_detection:
    """A control's run of a block of checks: the first add that makes one of `checks` miss its bound by
    DETECTION_FACTOR ends the block (the control's verdict is decided there, and the rest of the block
    could only add to a margin already past the factor). Inactive (active=False) it changes nothing:
    the claim's own run fills every check. The checks keep what was added before the stop."""

    def __init__(self, checks, active: bool = True):
        self.checks, self.active = list(checks), active

    def __enter__(self):
        if self.active:
            for check in self.checks:
                check.add = functools.partial(_add_then_stop, check)
        return self

    def __exit__(self, kind, error, traceback) -> bool:
        for check in self.checks:
            check.__dict__.pop("add", None)
        return kind is _Detected


__all__ = [
    'stop_at_detection',
    'u', 'DETECTION_FACTOR', 'RATIO_BINS', 'QUANTILE_POOL_SIZE', 'TIGHTNESS_THRESHOLD',
    'wide_scale_gradients', 'Profile', 'PROFILES', 'get_profile', 'SMALL_SHAPES', 'LARGE_SHAPES',
    'ShapeBatch', 'shape_plan', 'chunk_sizes', 'batch_chunks', 'chunk_frames', 'chunk_trajectories', 'spawn_key', 'rng_for', 'ulps_apart',
    'NumericalCheck', 'ControlResult', 'SymbolicStep', 'SymbolicResult', 'ClaimResult',
    'decide_verdict', 'to_jsonable',
]
