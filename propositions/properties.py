"""The property each claim states, asked of any optimizer of frames as a black box.

P1..P5 certify StiefelAdam. Each also states a property that another Stiefel optimizer may or may
not have; these functions ask it of an implementation known only through init and step (a
reference_impl.Variant, an adapted NumPy step or torch optimizer), with a verdict:

  holds      every comparison within its bound;
  fails      a comparison beyond its bound: the check and its margin (residual / bound);
  vacuous    the property holds only because the implementation ignores the setting it is about;
  untested   it could not be asked: the reason (the implementation is undefined there, or its own
             feasibility or precision leaves the comparison no resolving power).

The properties and how each is asked (propositions/kit/blackbox.py holds the measurements and the
bounds, and says which assumptions a black box needs):

  P1  steepest descent in the embedded metric: the first step from a fresh state goes along
      -P_W(G) / ||P_W(G)||. Its first-order direction D (Richardson, kit/blackbox) must be a positive
      multiple of -P_W(G): residual ||D - ||D|| n||, n = -P_W(G) / ||P_W(G)||, bound twice D's error
      (D = D* + e gives ||D - ||D|| n|| <= ||e|| + | ||D|| - ||D*|| | <= 2 ||e||). Its length is
      reported: lr sqrt(d r) for a mean-square second moment at eps = 0, lr ||P_W(G)|| for SGD.
  P2  independence of gradient scale at eps = 0: trajectories under G and c G. For c a power of two
      the inputs are exactly c G and every homogeneous operation rounds the same way, so the runs are
      bit-identical where the implementation's arithmetic is homogeneous (recorded); every c is held
      to the sensitivity bound with the rounding of c G (u) as the input difference. How far the runs
      part at eps > 0, and the range of c = 2^k over which they agree, are reported.
  P3  one scalar preconditioner per frame: a step xi = -a(G) L(G) with L linear (any metric) and a a
      scalar has first-order directions D(G) with D(G_a) + D(G_b) - D(G_c) ... more exactly
      L(G_a + G_b - G_c) = L(G_a) + L(G_b) - L(G_c), so D(G_a + G_b - G_c) lies in the span of D(G_a),
      D(G_b), D(G_c); from a warm state the direction is affine in G (momentum), m0 + L G, and the same
      combination cancels m0. An entrywise or per-column preconditioner leaves the span. Residual:
      distance of D(G_a + G_b - G_c) to that span; bound 2 (e_x + sum |alpha_i| e_i) (the fitted
      coefficients alpha stand in for the exact ones). Gradients with rows and columns on different
      scales, so that a preconditioner that is not scalar shows. Asked at the first step and at the
      second from a warm state; the spread (relative span residual) reported.
  P4  O(d)-equivariance on the left, O(r) on the right, signed permutations: trajectories of
      (Q W_0, Q G_t) against Q times those of (W_0, G_t), each group its own verdict; Q Haar with both
      determinants, a signed permutation exact in every dtype (so bitwise where the implementation
      keeps the order of its sums; recorded). Bound: the sensitivity bound with the rounding of Q G
      (gamma_d) and of Q W (carried forward).
  P5  coupled weight decay leaves the step unchanged (P_W(W) = 0 on St): runs with lambda and with
      0 within the absolute sensitivity bound of the decay term's remainder lambda ||W (W^T W - I)||
      and the rounding of G + lambda W. Vacuous when the implementation ignores weight_decay: a class
      that takes no such keyword, or a step left bit for bit unchanged by weight_decay = 2^30 while
      the same term 2^30 W added to the gradient changes it (a coupled decay would have changed it,
      through the rounding of G + lambda W alone).

Each property runs its controls (reference_impl's broken variants, and a StiefelAdam that ignores
weight_decay for P5's probe): a property whose check does not reject its control by
DETECTION_FACTOR is untested for that run. Whether the implementation is StiefelAdam's step is not
asked here (certify/outside/probes.py, and the claims themselves).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace

import numpy as np

import reference_impl as ri
from propositions._common import DETECTION_FACTOR, rng_for
from propositions.kit import blackbox
from propositions.kit import precision as precisions
from propositions.kit.blackbox import Runner, frobenius, gamma
from propositions.kit.property_controls import PROPERTY_CONTROLS

# The domain trials, the determinism probe and the vacuity probes draw this many frames (the
# properties themselves draw their profile's, Regimes.frames)
FRAMES = 6
STEPS = 3
U64 = 2.0**-53
# a comparison whose bound exceeds this fraction of what it compares cannot tell a property from its
# failure (a control fails by at least DETECTION_FACTOR times its bound)
RESOLUTION = 1.0 / DETECTION_FACTOR
DECAY_PROBE = 2.0**30
PROPERTY_IDS = ("P1", "P2", "P3", "P4-left", "P4-right", "P4-signed", "P5")
PROPERTY_TEXT = {
    "P1": "the first step from a fresh state is the embedded-metric steepest-descent direction -P_W(G)/||P_W(G)||",
    "P2": "trajectories under G -> c G are identical at eps = 0",
    "P3": "one scalar preconditioner per frame: the step is a scalar times a linear (momentum: affine) map of the gradient",
    "P4-left": "left O(d)-equivariance: step(Q W, Q G) = Q step(W, G)",
    "P4-right": "right O(r)-equivariance: step(W R, G R) = step(W, G) R",
    "P4-signed": "equivariance under signed permutations on both sides",
    "P5": "coupled weight decay leaves the step unchanged (P_W(W) = 0 on St(d, r))",
}


@dataclass
class Comparison:
    """Residuals against bounds of one check, over frames and steps (float64 arrays)."""

    name: str
    description: str
    residual: list = field(default_factory=list)
    bound: list = field(default_factory=list)
    scale: list = field(default_factory=list)
    bitwise: list = field(default_factory=list)
    # per call of add: the regime tags of its runs (regime()) and how many frames it offered
    regimes: list = field(default_factory=list)

    def add(self, residual, bound, scale, ok, bitwise=None, regime=None, floor=0.0, modelled=True) -> None:
        """Frames where ok (broadcast to residual's shape) and the bound is a number (a NaN bound: no
        bound could be measured for that frame, kit/blackbox.sensitivity) are compared. regime: the
        tags of the runs compared (regime()), counted by coverage(); floor: the part of the bound that
        the declared precision alone gives (the rounding of a perfect implementation in that dtype,
        precision_floor), by which coverage() tells a step below the dtype's resolution; modelled: False
        where the untransformed run took a step beyond the black box's rounding model (within_model),
        which is not compared and is counted apart."""
        beyond = ~np.broadcast_to(modelled, np.shape(residual)) & np.broadcast_to(ok, np.shape(residual))
        ok = np.broadcast_to(ok, np.shape(residual)) & ~np.isnan(np.broadcast_to(bound, np.shape(residual))) & ~beyond
        self.regimes.append((dict(regime or {}), int(np.size(residual)), np.broadcast_to(floor, np.shape(residual))[ok].ravel(), int(np.sum(beyond))))
        self.residual.append(np.asarray(residual, dtype=np.float64)[ok].ravel())
        self.bound.append(np.broadcast_to(bound, np.shape(residual))[ok].ravel())
        self.scale.append(np.broadcast_to(scale, np.shape(residual))[ok].ravel())
        if bitwise is not None:
            self.bitwise.append(np.broadcast_to(bitwise, np.shape(residual))[ok].ravel())

    def resolved_since(self, start: int) -> tuple[int, int]:
        """(comparisons that resolve the property, comparisons) among those added since the
        `start`-th call of add (a regime's share of the check)."""
        residual, bound, scale = (np.concatenate(part[start:]) if part[start:] else np.zeros(0)
                                  for part in (self.residual, self.bound, self.scale))
        with np.errstate(divide="ignore", invalid="ignore"):
            resolved = (np.where(scale > 0, bound / scale, np.inf) <= RESOLUTION) | (residual > bound)
        return int(np.sum(resolved)), int(resolved.size)

    def coverage(self) -> dict:
        """{dimension: {value: {"offered", "compared", "resolved", "inert", "below_precision"}}} over the
        regime tags of the calls of add: offered counts the comparisons the regime asked for, compared
        those that ran and had a bound, resolved those that can tell the property from its failure
        (bound at most RESOLUTION of what they compare, or a residual beyond the bound), inert those
        where the frames did not move beyond the bound itself (a step that vanishes there: nothing to
        compare), below_precision the others whose step is below DETECTION_FACTOR times what the
        declared precision alone rounds (no implementation in that dtype could resolve them), and
        beyond_model those left uncompared because the untransformed run stepped beyond the rounding
        model of a black box (within_model)."""
        table: dict = {}
        for (tags, offered, floor, beyond), residual, bound, scale in zip(self.regimes, self.residual, self.bound, self.scale):
            with np.errstate(divide="ignore", invalid="ignore"):
                resolved = (np.where(scale > 0, bound / scale, np.inf) <= RESOLUTION) | (residual > bound)
                below = np.where(scale > 0, floor / scale, np.inf) > RESOLUTION
            inert = (scale <= bound) & (residual <= bound) & ~resolved
            for dimension, value in tags.items():
                cell = table.setdefault(dimension, {}).setdefault(value, {"offered": 0, "compared": 0, "resolved": 0, "inert": 0,
                                                                          "below_precision": 0, "beyond_model": 0})
                cell["offered"] += offered
                cell["beyond_model"] += beyond
                cell["compared"] += int(residual.size)
                cell["resolved"] += int(np.sum(resolved))
                cell["inert"] += int(np.sum(inert))
                cell["below_precision"] += int(np.sum(~resolved & ~inert & below))
        return table

    def summary(self) -> dict:
        """max_ratio, residual and bound at the worst ratio over the comparisons that can resolve the
        property (bound at most RESOLUTION of what they compare); `unresolved` counts the others,
        which decide nothing unless their residual exceeds even their bound (a failure at any bound)."""
        residual = np.concatenate(self.residual) if self.residual else np.zeros(0)
        bound = np.concatenate(self.bound) if self.bound else np.zeros(0)
        scale = np.concatenate(self.scale) if self.scale else np.zeros(0)
        with np.errstate(divide="ignore", invalid="ignore"):
            ratio = np.where(bound > 0, residual / bound, np.where(residual > 0, np.inf, 0.0))
            resolved = np.where(scale > 0, bound / scale, np.inf) <= RESOLUTION
        counted = resolved | (ratio > 1)
        out = {"name": self.name, "description": self.description, "samples": int(np.sum(counted)),
               "unresolved": int(np.sum(~counted))}
        if np.any(counted):
            worst = int(np.flatnonzero(counted)[np.argmax(ratio[counted])])
            out.update(max_ratio=float(ratio[worst]), residual=float(residual[worst]), bound=float(bound[worst]),
                       max_residual=float(np.max(residual[counted])))
        if np.any(~counted):
            with np.errstate(divide="ignore", invalid="ignore"):
                out["worst_resolution"] = float(np.max(np.where(scale > 0, bound / scale, np.inf)[~counted]))
        if self.bitwise:
            bits = np.concatenate(self.bitwise)
            out["bit_identical"] = f"{int(np.sum(bits))} of {bits.size}"
        return out


def uncovered(property_id: str, comparisons, regimes: Regimes) -> str | None:
    """Why a property was not asked in every regime its dimensions must reach, or None: the first
    regime value where no comparison of `comparisons` resolved the property, though the frames moved
    beyond the bound (an inert value, where the step vanishes, has nothing to compare) and the step
    was within the resolution of the declared precision (a float32 step of lr 1e-4 is below a tenth of
    float32's own rounding of it, for any implementation: reported, not required), or where no
    comparison could be made at all (every frame raised or had no bound)."""
    merged: dict = {}
    for comparison in comparisons:
        for dimension, values in comparison.coverage().items():
            for value, cell in values.items():
                total = merged.setdefault(dimension, {}).setdefault(value, dict.fromkeys(cell, 0))
                for key, count in cell.items():
                    total[key] += count
    for dimension in DIMENSIONS[property_id.split("-")[0]]:
        for value, cell in merged.get(dimension, {}).items():
            if cell["resolved"]:
                continue
            if not cell["compared"] and cell["beyond_model"]:
                continue  # every step there is beyond what a black box's rounding can be bounded by: reported, not required
            if not cell["compared"]:
                return f"regime {dimension} = {value}: none of its {cell['offered']} comparisons could be made (the frames raised, were not finite or had no measurable bound)"
            if cell["inert"] + cell["below_precision"] < cell["compared"]:
                return (f"regime {dimension} = {value}: none of its {cell['compared']} comparisons resolved the property "
                        f"(each bound above {RESOLUTION:g} of what it compares)")
    return None


def coverage_table(comparisons) -> dict:
    """The coverage of a property's checks by regime (Comparison.coverage), per check."""
    return {c.name: c.coverage() for c in comparisons}


def verdict(property_id: str, checks: list[dict], *, measured: dict | None = None, untested: str | None = None,
            vacuous: str | None = None, comparisons=(), regimes: Regimes | None = None) -> dict:
    """The verdict of one property from its checks (module docstring); comparisons and regimes: its
    Comparison objects and the profile's regimes, whose coverage is recorded (and a regime its
    dimensions must reach but did not makes it untested, `uncovered`)."""
    record = {"property": property_id, "statement": PROPERTY_TEXT[property_id], "checks": checks,
              "measured": dict(measured or {}), "check": None, "margin": None, "reason": ""}
    if comparisons:
        record["coverage"] = coverage_table(comparisons)
        if untested is None and regimes is not None:
            untested = uncovered(property_id, comparisons, regimes)
    if untested is None and (not checks or not all(c["samples"] for c in checks)):
        blunt = [c for c in checks if not c["samples"] and c.get("unresolved")]
        if blunt:
            untested = (f"{blunt[0]['name']}: its bound is {blunt[0]['worst_resolution']:.2g} of what it compares (more than "
                        f"{RESOLUTION:g}): at this implementation's precision and feasibility the comparison cannot tell")
        else:
            untested = "no frame could be compared (see the excluded cases)"
    failing = [c for c in checks if c["samples"] and c["max_ratio"] > 1]
    if failing:
        worst = max(failing, key=lambda c: c["max_ratio"])
        record.update(verdict="fails", check=worst["name"], margin=worst["max_ratio"],
                      reason=f"{worst['name']}: residual {worst['residual']:.3g} > bound {worst['bound']:.3g}")
    elif untested is not None:
        record.update(verdict="untested", reason=untested)
    elif vacuous is not None:
        record.update(verdict="vacuous", reason=vacuous)
    else:
        record.update(verdict="holds")
    return record


# --------------------------------------------------------------------------------------------
# Regimes: what the properties draw, by profile
# --------------------------------------------------------------------------------------------


def shape_class(d: int, r: int) -> str:
    """The class of a frame shape that a property must reach: square (d = r), a column (r = 1), tall."""
    return "square" if d == r else "column" if r == 1 else "tall"


@dataclass(frozen=True)
class Regimes:
    """What the property runs draw at one profile (docs/adapters.md#regimes).

    shapes: frame shapes, covering the three classes of shape_class; frames: Haar frames per shape;
    steps: the length of the trajectories P2, P4 and P5 compare; warm_steps: the steps that build P3's
    warm state; lrs: learning rates across the decades 1e-4 to 1, so that a cap, a clip or a trust
    region that binds only above some step size is seen binding and not binding; scale_fractions: the
    gradient scales, as fractions of the exponent range the implementation's dtype allows (+-
    Precision.scale_decades decades: 30 for float64, 13 for float32 and bfloat16), rounded to powers of
    two so that the scaled inputs are exact. Each property must reach every value of its dimensions
    (DIMENSIONS): a value where no comparison resolves the property (and the frames moved beyond the
    bound, so there was something to compare) leaves the property untested, naming it.
    """

    profile: str
    shapes: tuple
    frames: int
    steps: int
    warm_steps: int
    lrs: tuple
    scale_fractions: tuple

    def scales(self, precision=None) -> tuple:
        """The gradient scales 2^k of this profile for an implementation of `precision` (float64 if None)."""
        decades = (precision or precisions.FLOAT64).scale_decades
        return tuple(2.0 ** round(f * decades * math.log2(10.0)) for f in self.scale_fractions)

    def grid(self, scales, *, lrs=None):
        """(shape index, d, r, lr, scale) of the runs that pair learning rates with scales: every lr on
        every shape, its scale the (shape index + lr index)-th of `scales` (a Latin pairing: each lr
        meets min(shapes, scales) scales and each scale several lrs, without the full product)."""
        lrs = self.lrs if lrs is None else lrs
        for j, lr in enumerate(lrs):
            for i, (d, r) in enumerate(self.shapes):
                yield i, d, r, lr, scales[(i + j) % len(scales)]

    def describe(self, precision=None) -> dict:
        return {"profile": self.profile, "shapes": [list(s) for s in self.shapes], "shape_classes": sorted({shape_class(*s) for s in self.shapes}),
                "frames": self.frames, "steps": self.steps, "warm_steps": self.warm_steps, "lrs": list(self.lrs),
                "gradient_scales": [scale_text(c) for c in self.scales(precision)]}


REGIMES = {
    "quick": Regimes("quick", shapes=((5, 1), (4, 4), (16, 4)), frames=4, steps=3, warm_steps=10, lrs=(1e-4, 1e-2, 1.0),
                     scale_fractions=(-1.0, 0.0, 1.0)),
    "default": Regimes("default", shapes=((5, 1), (4, 4), (8, 3), (16, 4)), frames=6, steps=5, warm_steps=20,
                       lrs=(1e-4, 1e-3, 1e-2, 1e-1, 1.0), scale_fractions=(-1.0, -0.5, 0.0, 0.5, 1.0)),
    "thorough": Regimes("thorough", shapes=((5, 1), (12, 1), (4, 4), (6, 6), (8, 3), (16, 4), (32, 8)), frames=8, steps=10, warm_steps=50,
                        lrs=(1e-4, 3e-4, 1e-3, 3e-3, 1e-2, 3e-2, 0.1, 0.3, 1.0), scale_fractions=(-1.0, -0.75, -0.5, -0.25, 0.0, 0.25, 0.5, 0.75, 1.0)),
}
DEFAULT_REGIMES = REGIMES["default"]
# the dimensions of the regimes each property must reach (the shape class always)
DIMENSIONS = {"P1": ("shape", "scale"), "P2": ("shape", "lr"), "P3": ("shape", "scale"), "P4": ("shape", "lr", "scale"),
              "P5": ("shape", "lr", "scale")}


def scale_text(c: float) -> str:
    k = math.log2(c)
    return f"2^{int(k)}" if k.is_integer() else f"{c:g}"


def regime(d: int, r: int, lr: float | None = None, scale: float | None = None) -> dict:
    """The regime tags of one run: its shape class, and its lr and gradient scale where they vary."""
    tags = {"shape": shape_class(d, r)}
    if lr is not None:
        tags["lr"] = f"{lr:g}"
    if scale is not None:
        tags["scale"] = scale_text(scale)
    return tags


def within_model(run, W0) -> np.ndarray:
    """(T, frames): whether every step of `run` up to t retracted a W + xi of bounded condition
    (kit/blackbox.step_condition: a step that moved its frame by less than sqrt(2)), where the rounding
    model of a black box's output holds. A longer step (an uncapped SGD on gradients of scale 2^100)
    rounds by more than anything the box shows can bound; its comparisons are counted apart
    (beyond_model), not compared."""
    return np.isfinite(blackbox.step_condition(run, W0))


def precision_floor(runner: Runner, S, d: int, r: int) -> np.ndarray:
    """The part of a trajectory comparison's bound (kit/blackbox.comparison_bound) that the declared
    precision alone gives, shape S.shape (T, frames): the output error of each of the t steps of both
    runs at feasibility 0, 2 t (E_polar at the dtype's u), what a perfect implementation in that dtype
    rounds; a step shorter than DETECTION_FACTOR times it cannot resolve a property in that dtype."""
    steps = np.arange(1, S.shape[0] + 1).reshape((S.shape[0],) + (1,) * (S.ndim - 1))
    return np.broadcast_to(2.0 * steps * float(runner.output_error(0.0, d, r)), S.shape)


def config_for(eps: float, **changes) -> ri.StiefelAdamConfig:
    values = dict(lr=0.02, betas=(0.9, 0.999), eps=eps, trust_radius=0.5, weight_decay=0.0)
    values.update(changes)
    return ri.StiefelAdamConfig(**values)


def draw(seed: int, label: str, d: int, r: int, steps: int = 1, frames: int = FRAMES):
    """`frames` Haar frames (frames, d, r) and `steps` standard normal gradients (steps, frames, d, r)."""
    rng = rng_for(seed, "properties", label, d, r)
    W = ri.random_point(d, r, rng, (frames,))
    return W, rng.standard_normal((steps,) + W.shape), rng


def tangent_dimension_ok(d: int, r: int) -> bool:
    return d * r - r * (r + 1) // 2 >= 4


# --------------------------------------------------------------------------------------------
# P1
# --------------------------------------------------------------------------------------------


def steepest_descent(runner: Runner, seed: int, eps: float, regimes: Regimes = DEFAULT_REGIMES, scales=None) -> dict:
    check = blackbox_check("first_step_direction", "||D - ||D|| n||, n = -P_W(G)/||P_W(G)||, against twice D's error")
    lengths = {"lr sqrt(d r)": [], "lr": [], "lr ||P_W(G)||": []}
    config = config_for(eps, trust_radius=math.inf)
    for d, r in regimes.shapes:
        W, G, _ = draw(seed, "P1", d, r, frames=regimes.frames)
        for c in scales or regimes.scales():
            Gc = c * G[0]
            lr0 = blackbox.calibrated_lr(runner, W, Gc, config, case="P1")
            direction = blackbox.first_order_direction(runner, W, Gc, config, lr0, case="P1")
            g = ri.project_tangent(W, Gc, validate=False)
            n = -g / frobenius(g)[:, None, None]
            length = frobenius(direction.D)
            residual = frobenius(direction.D - length[:, None, None] * n)
            check.add(residual, 2.0 * direction.error, length, direction.ok, regime=regime(d, r, scale=c))
            ok = direction.ok
            lengths["lr sqrt(d r)"].append(length[ok] / (lr0 * math.sqrt(d * r)))
            lengths["lr"].append(length[ok] / lr0)
            lengths["lr ||P_W(G)||"].append(length[ok] / (lr0 * frobenius(g)[ok]))
    measured = {"eps": eps, **length_text(lengths)}
    return verdict("P1", [check.summary()], measured=measured, comparisons=[check], regimes=regimes)


def blackbox_check(name: str, description: str) -> Comparison:
    return Comparison(name, description)


def length_text(lengths: dict) -> dict:
    """The first step's length in the unit in which it is most nearly constant over frames and shapes:
    lr sqrt(d r) (a mean-square second moment at eps = 0), lr (a sum of squares), lr ||P_W(G)|| (SGD)."""
    spreads = {}
    for unit, values in lengths.items():
        values = np.concatenate(values) if values else np.zeros(0)
        if values.size and np.min(values) > 0:
            spreads[unit] = (float(np.max(values) / np.min(values)) - 1.0, float(np.min(values)), float(np.max(values)))
    if not spreads:
        return {"length": "not measured"}
    unit = min(spreads, key=lambda key: spreads[key][0])
    _, low, high = spreads[unit]
    return {"length": f"||xi|| = {unit} x [{low:.6g}, {high:.6g}]"}


# --------------------------------------------------------------------------------------------
# P2
# --------------------------------------------------------------------------------------------

POWER_SCALES = (2.0**-20, 0.5, 2.0, 2.0**20)
OTHER_SCALES = (3.0, 0.1)
SCAN_EXPONENTS = (50, 100, 200, 400, 600, 900)
PARTING_SCALES = (2.0**-10, 2.0**-20, 2.0**-30)


def scale_independence(runner: Runner, seed: int, eps_zero: bool, regimes: Regimes = DEFAULT_REGIMES) -> dict:
    if not eps_zero:
        return verdict("P2", [], untested="the implementation is undefined at eps = 0 (its domain), where the property is stated")
    check = Comparison("scaled_trajectories", "||W_t(c G) - W_t(G)|| against the sensitivity bound (c = 2^k: exact inputs; else rounding u)")
    scan = parting = None
    scan_lr = min(regimes.lrs, key=lambda lr: abs(math.log10(lr / 0.02)))  # the scan and the parting at the lr nearest 0.02
    for d, r in regimes.shapes:
        W, G, _ = draw(seed, "P2", d, r, regimes.steps, frames=regimes.frames)
        for lr in regimes.lrs:
            config = config_for(0.0, lr=lr)
            base = runner.run(W, G, config, case="P2")
            S = blackbox.sensitivity(runner, W, G, config, base, relative=False, seed=seed, key=("P2", d, r, lr), case="P2")
            R = blackbox.rounding_response(runner, W, G, config, base, seed=seed, key=("P2", d, r, lr))
            moved = frobenius(base.frames[1:] - W)
            for c in POWER_SCALES + OTHER_SCALES:
                scaled = runner.run(W, c * G, config, case="P2")
                exact = math.log2(c).is_integer()
                # fl(c G) = c G (1 + delta), |delta| <= u; the scaled run responds to it as the first to G delta
                # (its Jacobian is the first one's over c): a difference of at most u ||G_t||
                error = 0.0 if exact else U64 * frobenius(G)
                # fixed before the comparison: the untransformed run's feasibility only (kit/blackbox.comparison_bound)
                bound = blackbox.comparison_bound(runner, S, G, d, r, base.phi, gradient_error=error,
                                              condition=blackbox.step_condition(base, W), rounding=R)
                residual = frobenius(scaled.frames[1:] - base.frames[1:])
                check.add(residual, bound, moved, base.ok & scaled.ok, bitwise=(residual == 0) if exact else None, regime=regime(d, r, lr=lr),
                          floor=precision_floor(runner, S, d, r), modelled=within_model(base, W))
            if scan is None and lr == scan_lr:
                scan = scale_domain(runner, W, G, config, base, S, d, r)
                parting = eps_parting(runner, W, G, d, r, lr)
    ignored = eps_ignored(runner, seed)
    record = verdict("P2", [check.summary()], measured={"scale_domain": scan, "eps_parting": parting, "eps_reaches_step": ignored is None},
                     vacuous=ignored, comparisons=[check], regimes=regimes)
    if ignored is not None and record["verdict"] != "vacuous":
        record["reason"] += f"; and {ignored}"
    return record


EPS_PROBE = 2.0**10


def eps_ignored(runner: Runner, seed: int) -> str | None:
    """Why P2's eps = 0 is not what ran, or None: the step at eps = EPS_PROBE (a thousand times the
    square root of the second moment of unit gradients: StiefelAdam's step shrinks a thousandfold)
    against the step at eps = 0, repeated and compared beyond the noise (setting_reaches_step). An
    implementation that leaves its step unchanged uses an eps of its own (a constant hard-coded on
    its manifold path, say), and the property stated at eps = 0 was asked at that eps."""
    W, G, _ = draw(seed, "P2 eps probe", 8, 3)
    config = config_for(0.0)
    found = setting_reaches_step(runner, W, G, config, replace(config, eps=EPS_PROBE), G, "P2 eps probe")
    if found is None or found[0]:
        return None
    noise = found[3]
    unchanged = "bit for bit the step at eps = 0" if noise == 0 else f"the step at eps = 0 within its run-to-run noise {noise:.3g}"
    return f"eps does not reach the step: eps = 2^10 gives {unchanged}, so the property was asked at the implementation's own eps, not at eps = 0"


def scale_domain(runner: Runner, W, G, config, base, S, d, r) -> str:
    """The range of c = 2^k over which the runs agree within the bound (|k| from SCAN_EXPONENTS)."""
    reach = {}
    for sign in (-1, 1):
        reach[sign] = "all scanned"
        for k in SCAN_EXPONENTS:
            scaled = runner.run(W, 2.0 ** (sign * k) * G, config, case="P2 scan of c")
            bound = blackbox.comparison_bound(runner, S, G, d, r, base.phi)
            compared = base.ok & np.all(np.isfinite(S), axis=0)  # a frame without a measured bound is not scanned
            with np.errstate(invalid="ignore"):
                agree = scaled.ok & np.all(frobenius(scaled.frames[1:] - base.frames[1:]) <= bound, axis=0)
            if not np.all(agree[compared]):
                what = "left out (raised or not finite)" if not np.all(scaled.ok[compared]) else "parted"
                reach[sign] = f"up to 2^{sign * previous_exponent(k)}, {what} at 2^{sign * k}"
                break
    return f"c = 2^k, k < 0: {reach[-1]}; k > 0: {reach[1]} (scanned |k| in {', '.join(map(str, SCAN_EXPONENTS))})"


def previous_exponent(k: int) -> int:
    earlier = [x for x in SCAN_EXPONENTS if x < k]
    return earlier[-1] if earlier else 0


def eps_parting(runner: Runner, W, G, d, r, lr: float = 0.02) -> list:
    """How far the runs part at eps = 1e-8: max ||W_T(c G) - W_T(G)|| per c, with eps / (c rms(G))."""
    config = config_for(1e-8, lr=lr)
    base = runner.run(W, G, config, case="P2 at eps > 0")
    rows = []
    for c in PARTING_SCALES:
        scaled = runner.run(W, c * G, config, case="P2 at eps > 0")
        ok = base.ok & scaled.ok
        apart = frobenius(scaled.last - base.last)[ok]
        rows.append({"c": c, "eps_over_c_rms_G": 1e-8 / (c * float(np.sqrt(np.mean(G**2)))),
                     "max_distance": float(np.max(apart)) if apart.size else None})
    return rows


# --------------------------------------------------------------------------------------------
# P3
# --------------------------------------------------------------------------------------------


def anisotropic(rng, shape) -> np.ndarray:
    """Gradients whose rows and columns live on different scales (two decades each)."""
    d, r = shape[-2:]
    rows = 10.0 ** rng.uniform(-1, 1, size=shape[:-2] + (d, 1))
    columns = 10.0 ** np.linspace(-1, 1, r).reshape((1,) * (len(shape) - 1) + (r,))
    return rows * rng.standard_normal(shape) * columns


def span_residual(D, others, errors, error_x):
    """Distance of D (frames, d, r) to span(others) per frame, and its bound 2 (e_x + sum |alpha_i| e_i)."""
    frames = D.shape[0]
    basis = np.stack([o.reshape(frames, -1) for o in others], axis=-1)  # (frames, dr, 3)
    target = D.reshape(frames, -1)
    residual, bound = np.full(frames, np.nan), np.full(frames, np.inf)
    for index in range(frames):
        if not (np.all(np.isfinite(basis[index])) and np.all(np.isfinite(target[index]))):
            continue
        alpha, *_ = np.linalg.lstsq(basis[index], target[index], rcond=None)
        residual[index] = float(np.linalg.norm(target[index] - basis[index] @ alpha))
        bound[index] = 2.0 * (error_x[index] + float(np.sum(np.abs(alpha) * np.array([e[index] for e in errors]))))
    return residual, bound


def scalar_preconditioner(runner: Runner, seed: int, eps: float, regimes: Regimes = DEFAULT_REGIMES, scales=None) -> dict:
    checks = {phase: Comparison(f"span_{phase}", f"distance of D(G_a + G_b - G_c) to span(D(G_a), D(G_b), D(G_c)), {phase}")
              for phase in ("first_step", "warm_step")}
    ratios = []
    config = config_for(eps, trust_radius=math.inf)
    for d, r in regimes.shapes:
        if not tangent_dimension_ok(d, r):
            continue
        W, _, rng = draw(seed, "P3", d, r, frames=regimes.frames)
        Ga, Gb, Gc = (anisotropic(rng, W.shape) for _ in range(3))
        warm_gradients = anisotropic(rng, (regimes.warm_steps,) + W.shape)
        for c in scales or regimes.scales():
            warm = _warm_run(runner, W, c * warm_gradients, config)
            for phase, start, state in (("first_step", W, None), ("warm_step", warm.last, warm.state)):
                if phase == "warm_step" and not np.any(warm.ok):
                    continue
                lr0 = blackbox.calibrated_lr(runner, start, c * Ga, config, state, case="P3")
                found = [blackbox.first_order_direction(runner, start, c * G, config, lr0, state, case="P3") for G in (Ga, Gb, Gc, Ga + Gb - Gc)]
                residual, bound = span_residual(found[3].D, [f.D for f in found[:3]], [f.error for f in found[:3]], found[3].error)
                ok = np.all([f.ok for f in found], axis=0) & np.isfinite(residual)
                checks[phase].add(np.nan_to_num(residual), bound, frobenius(np.nan_to_num(found[3].D)), ok, regime=regime(d, r, scale=c))
                if phase == "first_step":
                    ratios.append(entry_ratios(start, c * Ga, found[0]))
    ratios = [x for x in ratios if x is not None]
    measured = {"relative_span_residual": {phase: span_spread(check) for phase, check in checks.items()},
                "warm_state": f"{regimes.warm_steps} steps of anisotropic gradients",
                "first_step_ratio_to_P_W(G)": (f"[{min(x[0] for x in ratios):.6g}, {max(x[1] for x in ratios):.6g}] "
                                               "(entries with |P_W(G)| >= 0.1 max)") if ratios else "not measured"}
    return verdict("P3", [c.summary() for c in checks.values()], measured=measured, comparisons=list(checks.values()), regimes=regimes)


WARM_MOVE = 0.1  # the warm start of P3: steps that move the frames by about this much each (median) at most


def _warm_run(runner: Runner, W, gradients, config):
    """The steps of `gradients` (T, frames, d, r) from W to a warm state, at config's lr or less: when
    the first step would move the frames by more than WARM_MOVE (an uncapped SGD on gradients of scale
    100 moves them by O(10), where an iterative retraction may leave St), all are taken at the lr that
    moves them by WARM_MOVE, so that the warm phase starts from a frame the implementation returns in
    ordinary use, its momentum and second moment built over tens of steps."""
    gradients = np.asarray(gradients)
    trial = runner.run(W, gradients[:1], config, case="P3 warm step")
    moved = frobenius(trial.last - W)[trial.ok]
    length = float(np.median(moved)) if moved.size else 0.0
    if math.isfinite(length) and length > WARM_MOVE:
        config = replace(config, lr=config.lr * WARM_MOVE / length)
    return runner.run(W, gradients, config, case="P3 warm step")


def span_spread(check: Comparison) -> float | None:
    """The largest residual relative to the direction compared (the spread of the preconditioner),
    over the comparisons that resolve the property only (bound at most RESOLUTION of what they
    compare): an unresolved comparison's residual is mostly the error of its own directions, and a
    spread taken over it reported that error (0.28 where the spread was 7.5e-11). None where no
    comparison resolved."""
    if not check.residual:
        return None
    residual, bound, scale = (np.concatenate(part) for part in (check.residual, check.bound, check.scale))
    with np.errstate(divide="ignore", invalid="ignore"):
        resolved = (scale > 0) & (bound / scale <= RESOLUTION)
        relative = residual[resolved] / scale[resolved]
    return float(np.max(relative)) if relative.size else None


def entry_ratios(W, G, direction):
    """min and max over entries of D / (-P_W(G)) divided by their median, where |P_W(G)| >= 0.1 max."""
    g = -ri.project_tangent(W, G, validate=False)
    lows, highs = [], []
    for index in np.flatnonzero(direction.ok):
        large = np.abs(g[index]) >= 0.1 * np.max(np.abs(g[index]))
        ratio = direction.D[index][large] / g[index][large]
        middle = np.median(ratio)
        if middle != 0:
            lows.append(float(np.min(ratio / middle)))
            highs.append(float(np.max(ratio / middle)))
    return (min(lows), max(highs)) if lows else None


# --------------------------------------------------------------------------------------------
# P4
# --------------------------------------------------------------------------------------------


# P4 is asked at the profile's learning rates, across the decades 1e-4 to 1 (Regimes.lrs): a cap, a
# clip or a trust region that binds only above some step size (a cap in a norm that rotations change)
# is then seen both binding and not. The runs carry a coupled decay of EQUIVARIANCE_DECAY times the
# gradients' scale (both sides of each comparison carry it, so the property is asked with decay on).
EQUIVARIANCE_DECAY = 0.1
SATURATION = 1.5  # halving lr shrinks a free first step by 2, a capped one by less than this


def equivariance(runner: Runner, seed: int, eps: float, regimes: Regimes = DEFAULT_REGIMES, scales=None) -> list[dict]:
    checks = {
        "P4-left": Comparison("left_trajectories", "||W_t(Q W_0, Q G) - Q W_t(W_0, G)|| against the sensitivity bound"),
        "P4-right": Comparison("right_trajectories", "||W_t(W_0 R, G R) - W_t(W_0, G) R|| against the sensitivity bound"),
        "P4-signed": Comparison("signed_permutation_trajectories", "||W_t(P W_0 S, P G S) - P W_t S|| (exact inputs)"),
    }
    scales = scales or regimes.scales()
    lengths = {}
    for lr in regimes.lrs:
        config = config_for(eps, lr=lr, trust_radius=0.3, weight_decay=EQUIVARIANCE_DECAY)
        pairs = [(d, r, c) for _, d, r, lr_, c in regimes.grid(scales) if lr_ == lr]
        lengths[f"{lr:g}"] = _equivariance_at(runner, seed, config, checks, regimes, pairs)
    return [verdict(name, [check.summary()], measured={"first step by lr": lengths}, comparisons=[check], regimes=regimes)
            for name, check in checks.items()]


def _equivariance_at(runner: Runner, seed: int, config, checks: dict, regimes: Regimes, pairs) -> str:
    """The P4 comparisons at one config's lr on the (d, r, gradient scale) of `pairs`, added to
    `checks`; returns how the first step's length answered halving lr there (a free step halves; one a
    cap, clip or trust region binds does not)."""
    saturated = compared = 0
    unscaled = config
    for d, r, c in pairs:
        W, G, rng = draw(seed, "P4", d, r, regimes.steps, frames=regimes.frames)
        G = c * G
        # the decay in proportion to the gradients' scale (as P5's): against gradients of scale 2^-100 an
        # absolute lambda = 0.1 leaves a projected gradient that is all rounding of lambda W
        config = replace(unscaled, weight_decay=unscaled.weight_decay * c)
        base = runner.run(W, G, config, case="P4")
        half = runner.run(W, G[:1], replace(config, lr=config.lr / 2), case="P4 step length")
        ok = base.ok & half.ok
        with np.errstate(divide="ignore", invalid="ignore"):
            ratio = frobenius(base.frames[1] - W) / frobenius(half.frames[1] - W)
        saturated += int(np.count_nonzero(ratio[ok] < SATURATION))
        compared += int(np.count_nonzero(ok))
        S = blackbox.sensitivity(runner, W, G, config, base, relative=False, seed=seed, key=("P4", d, r, config.lr), case="P4")
        R = blackbox.rounding_response(runner, W, G, config, base, seed=seed, key=("P4", d, r, config.lr))
        moved = frobenius(base.frames[1:] - W)
        frames = regimes.frames
        left, right = blackbox.orthogonal(d, rng, frames), blackbox.orthogonal(r, rng, frames)
        P, Sg = blackbox.signed_permutation(d, rng, frames), blackbox.signed_permutation(r, rng, frames)
        # each action, the length of its inner products (the rounding of A X is within gamma_n || |A||X| ||
        # entry by entry), and its absolute matrices (None: a signed permutation, exact)
        actions = {
            "P4-left": (lambda X: left @ X, d, lambda X: np.abs(left) @ np.abs(X)),
            "P4-right": (lambda X: X @ right, r, lambda X: np.abs(X) @ np.abs(right)),
            "P4-signed": (lambda X: P @ X @ Sg, 0, None),
        }
        for name, (act, n, magnitude) in actions.items():
            moved_run = runner.run(act(W), act(G), config, case="P4")
            rounding = gamma(n, U64) if magnitude is not None else 0.0
            gradient_error = rounding * frobenius(magnitude(G)) if magnitude is not None else 0.0
            frame_error = rounding * (frobenius(magnitude(W)) + frobenius(magnitude(base.frames[1:]))) if magnitude is not None else 0.0
            bound = blackbox.comparison_bound(runner, S, G, d, r, base.phi, gradient_error=gradient_error, frame_error=frame_error,
                                              condition=blackbox.step_condition(base, W), rounding=R)
            residual = frobenius(moved_run.frames[1:] - act(base.frames[1:]))
            checks[name].add(residual, bound, moved, base.ok & moved_run.ok, bitwise=residual == 0, regime=regime(d, r, lr=config.lr, scale=c),
                             floor=precision_floor(runner, S, d, r), modelled=within_model(base, W))
    if not compared:
        return "not measured"
    return (f"capped (a cap, clip or trust region binds) at {saturated} of {compared} frames" if saturated
            else f"proportional to lr (no cap binds) at all {compared} frames")


# --------------------------------------------------------------------------------------------
# P5
# --------------------------------------------------------------------------------------------

DECAYS = (1e-3, 1.0, 1e3, 1e6)
DECAY_STEPS = 2


def decay_blindness(runner: Runner, seed: int, eps: float, ignored=(), regimes: Regimes = DEFAULT_REGIMES, scales=None) -> dict:
    """P5 on the profile's grid of shapes, learning rates and gradient scales c, each at the decays
    DECAYS times c: the decay term lambda W against gradients of scale c is then the same relative to
    the gradient at every scale (an absolute lambda = 1e-3 against gradients of scale 2^-100 leaves a
    projected gradient that is all rounding of lambda W, where no implementation's step can show the
    property)."""
    check = Comparison("decay_trajectories", "||W_t(lambda) - W_t(0)|| against the absolute sensitivity bound of the decay's remainder")
    for _, d, r, lr, c in regimes.grid(scales or regimes.scales()):
        W, G, _ = draw(seed, "P5", d, r, DECAY_STEPS, frames=regimes.frames)
        G = c * G
        config = config_for(eps, lr=lr)
        base = runner.run(W, G, config, case="P5")
        S = blackbox.sensitivity(runner, W, G, config, base, relative=False, seed=seed, key=("P5", d, r, lr), case="P5")
        R = blackbox.rounding_response(runner, W, G, config, base, seed=seed, key=("P5", d, r, lr))
        moved = frobenius(base.frames[1:] - W)
        for decay in DECAYS:
            decay = decay * c
            decayed = runner.run(W, G, replace(config, weight_decay=decay), case="P5")
            bound = blackbox.comparison_bound(runner, S, G, d, r, base.phi, gradient_error=decay_remainder(runner, W, G, decay, base.phi, d),
                                              condition=blackbox.step_condition(base, W), rounding=R)
            check.add(frobenius(decayed.frames[1:] - base.frames[1:]), bound, moved, base.ok & decayed.ok, regime=regime(d, r, lr=lr, scale=c),
                      floor=precision_floor(runner, S, d, r), modelled=within_model(base, W))
    reason, untested = weight_decay_reaches_step(runner, seed, eps, ignored)
    return verdict("P5", [check.summary()], vacuous=reason, untested=untested, comparisons=[check], regimes=regimes)


def decay_remainder(runner: Runner, W, G, decay, phi, d) -> np.ndarray:
    """Per step, a bound on the norm by which the gradient the run with decay projects differs from
    the one without (T, frames): the projected decay term lambda W (W^T W - I) (||W||_2 <= 1 + defect,
    the defect of its input frame at most the larger of W_0's and the run without decay's phi: where the
    property holds the run with decay has that run's frames) and the rounding of
    G + lambda W, u (||G|| + lambda sqrt(r)) (its own projection's rounding is the backward error
    comparison_bound adds, here on the larger input: gamma_{2d}(u) lambda sqrt(r))."""
    r = W.shape[-1]
    defect = np.maximum(blackbox.gram_defect(W), phi)
    return (decay * defect * (1 + defect) + runner.u * (frobenius(G) + decay * math.sqrt(r))
            + 2.0 * gamma(2 * d, runner.u) * decay * math.sqrt(r))


def weight_decay_reaches_step(runner: Runner, seed: int, eps: float, ignored) -> tuple[str | None, str | None]:
    """(the vacuity reason, or None; the reason the probe could not tell, or None): module docstring."""
    if "weight_decay" in ignored:
        return "the implementation takes no weight_decay: the step cannot depend on it", None
    W, G, _ = draw(seed, "P5 probe", 8, 3)
    config = config_for(eps)
    found = setting_reaches_step(runner, W, G, config, replace(config, weight_decay=DECAY_PROBE), G + DECAY_PROBE * W[None], "P5 probe")
    if found is None:
        return None, "the decay probe could not run (see the excluded cases)"
    keyword_moves, term_moves, term_distance, noise = found
    if keyword_moves:
        return None, None
    if term_moves:
        unchanged = "bit for bit unchanged" if noise == 0 else f"unchanged beyond its run-to-run noise {noise:.3g}"
        return (f"weight_decay does not reach the step: weight_decay = 2^30 leaves it {unchanged}, while the decay term 2^30 W "
                f"added to the gradient, which a coupled decay would have been, moves it by {term_distance:.3g}"), None
    return None, "neither weight_decay = 2^30 nor the term 2^30 W in the gradient changes the step: whether weight_decay is applied cannot be seen"


PROBE_REPEATS = 2


def setting_reaches_step(runner: Runner, W, G, config, changed_config, changed_gradients, case: str):
    """Whether a setting reaches the step: (setting moves, input moves, how far the input moves it,
    noise), or None where no frame ran. Each of three runs is made PROBE_REPEATS times: with `config`;
    with `changed_config` (the setting under test); with `config` on `changed_gradients` (the input a
    setting that is applied would have changed). A deterministic implementation repeats its runs bit
    for bit, and the comparison is bit for bit; one whose repeats differ (the determinism probe, or
    these repeats) moves a run only beyond DETECTION_FACTOR times its measured noise, so that its
    randomness is never read as a setting reaching the step."""
    runs = [[runner.run(W, gradients, settings, case=case) for _ in range(PROBE_REPEATS)]
            for settings, gradients in ((config, G), (changed_config, G), (config, changed_gradients))]
    ok = np.logical_and.reduce([run.ok for repeats in runs for run in repeats])
    if not np.any(ok):
        return None
    noise = max([runner.noise] + [float(np.max(frobenius(run.last - repeats[0].last)[ok])) for repeats in runs for run in repeats[1:]])

    def apart(a, b) -> float:  # the smallest distance between a run of a and a run of b
        return min(float(np.max(frobenius(x.last - y.last)[ok])) for x in a for y in b)

    base, setting, moved = runs
    floor = DETECTION_FACTOR * noise
    setting_distance, moved_distance = apart(base, setting), apart(base, moved)
    return setting_distance > floor, moved_distance > floor, moved_distance, noise


DETERMINISM_SHAPES = ((5, 2), (8, 3))
DETERMINISM_REPEATS = 3


def determinism(runner: Runner, seed: int, eps: float) -> dict:
    """Every black box is first run DETERMINISM_REPEATS times on identical inputs (DETERMINISM_SHAPES,
    FRAMES frames, STEPS steps): {"repeats", "frames", "deterministic", "max_distance", "differing"}.
    max_distance, the largest distance between two runs of the same frame at any step, becomes the
    runner's noise, which every comparison bound carries and every vacuity probe compares against; a
    box seen to be nondeterministic has no verdict read from a bit-for-bit comparison."""
    largest, differing, compared = 0.0, 0, 0
    for d, r in DETERMINISM_SHAPES:
        W, G, _ = draw(seed, "determinism", d, r, STEPS)
        runs = [runner.run(W, G, config_for(eps), case="determinism") for _ in range(DETERMINISM_REPEATS)]
        ok = np.logical_and.reduce([run.ok for run in runs])
        for run in runs[1:]:
            distance = frobenius(run.frames[1:] - runs[0].frames[1:])[:, ok]
            if distance.size:
                largest = max(largest, float(np.max(distance)))
                differing += int(np.count_nonzero(np.any(run.frames[1:][:, ok] != runs[0].frames[1:][:, ok], axis=(-2, -1))))
                compared += distance.size
    runner.noise = largest
    return {"repeats": DETERMINISM_REPEATS, "frame_steps_compared": compared, "deterministic": differing == 0,
            "max_distance": largest, "differing": differing}


# --------------------------------------------------------------------------------------------
# Domain, controls, all properties
# --------------------------------------------------------------------------------------------

DOMAIN_CASES = ("eps = 0", "St(1, 1)", "St(1, 1) at eps = 0", "G = 0 at eps = 0")


def domain(runner: Runner, seed: int, declared=()) -> tuple[list[dict], bool]:
    """Trial steps where implementations are often undefined: [{case, frames, failed, reason}], and
    whether eps = 0 is in the domain. A case the implementation declares outside it is not tried."""
    rows = []
    rng = rng_for(seed, "properties", "domain")
    W = ri.random_point(5, 2, rng, (FRAMES,))
    G = rng.standard_normal(W.shape)
    one = np.where(rng.uniform(size=(FRAMES, 1, 1)) < 0.5, -1.0, 1.0)
    trials = {
        "eps = 0": (W, G, config_for(0.0)),
        "St(1, 1)": (one, rng.standard_normal(one.shape), config_for(1e-8)),
        "St(1, 1) at eps = 0": (one, rng.standard_normal(one.shape), config_for(0.0)),
        "G = 0 at eps = 0": (W, np.zeros_like(G), config_for(0.0)),
    }
    for case, (frames, gradient, config) in trials.items():
        if case in declared:
            rows.append({"case": case, "frames": 0, "failed": 0, "reason": "declared outside the domain: not tried"})
            continue
        before = dict(runner.excluded)
        run = runner.run(frames, gradient[None], config, case=f"domain: {case}")
        reasons = [reason for (c, reason), n in runner.excluded.items() if c == f"domain: {case}" and n != before.get((c, reason), 0)]
        rows.append({"case": case, "frames": FRAMES, "failed": int(np.sum(~run.ok)), "reason": "; ".join(reasons)})
    eps_row = rows[0]
    eps_zero = "eps = 0" not in declared and eps_row["failed"] < eps_row["frames"]
    return rows, eps_zero


def ask(variant, seed: int, *, eps_zero: bool, ignored=(), only=PROPERTY_IDS, runner: Runner | None = None,
        regimes: Regimes = DEFAULT_REGIMES) -> list[dict]:
    """The properties `only` (of PROPERTY_IDS, or claim ids: P4 is its three groups) of one variant, as
    verdict records (without controls), over `regimes` (the profile's, REGIMES); NumPy's floating-point
    warnings off, as in ask_all."""
    with np.errstate(**QUIET):
        return _ask(variant, seed, eps_zero, ignored, only, runner, regimes)


QUIET = dict(over="ignore", invalid="ignore", divide="ignore", under="ignore")


def _ask(variant, seed: int, eps_zero: bool, ignored, only, runner, regimes: Regimes) -> list[dict]:
    only = tuple(p for p in PROPERTY_IDS if p in only or p.split("-")[0] in only)
    runner = runner or runner_for(variant)
    eps = 0.0 if eps_zero else 1e-8
    scales = regimes.scales(precisions.of(variant))  # across the exponent range of the implementation's dtype
    asked = {
        "P1": lambda: [steepest_descent(runner, seed, eps, regimes, scales)],
        "P2": lambda: [scale_independence(runner, seed, eps_zero, regimes)],
        "P3": lambda: [scalar_preconditioner(runner, seed, eps, regimes, scales)],
        "P4": lambda: [v for v in equivariance(runner, seed, eps, regimes, scales) if v["property"] in only],
        "P5": lambda: [decay_blindness(runner, seed, eps, ignored, regimes, scales)],
    }
    wanted = list(dict.fromkeys(name.split("-")[0] for name in only))
    found = []
    for claim in wanted:
        runner.begin()  # each property at the feasibility its own runs show
        records = asked[claim]()
        for record in records:
            record["phi"] = _number(runner.local_phi)
        found += records
    return found


def runner_for(variant) -> Runner:
    return Runner(variant, precisions.of(variant).u)


def ask_all(variant, seed: int, *, only=PROPERTY_IDS, regimes: Regimes = DEFAULT_REGIMES) -> dict:
    """Domain trials, then the properties `only` of one variant: {"domain", "eps_zero", "phi",
    "properties", "excluded", "calls"}; every case the implementation could not run is counted in
    "excluded" with its reason, none raises here. NumPy's floating-point warnings are off meanwhile:
    the inputs reach 2^(+-k) on purpose, where an implementation's (and the model's) squares overflow,
    and what an overflow does to a step is read from its output, not from a RuntimeWarning on the
    terminal."""
    with np.errstate(**QUIET):
        return _ask_all(variant, seed, only, regimes)


def _ask_all(variant, seed: int, only, regimes: Regimes) -> dict:
    runner = runner_for(variant)
    rows, eps_zero = domain(runner, seed, tuple(getattr(variant, "domain", ()) or ()))
    repeats = determinism(runner, seed, 0.0 if eps_zero else 1e-8)
    found = ask(variant, seed, eps_zero=eps_zero, ignored=tuple(getattr(variant, "ignored", ()) or ()), only=only, runner=runner, regimes=regimes)
    for record in found:
        if record["verdict"] == "untested" and "cannot tell" in record["reason"]:
            record["reason"] += (f" (the frames of this property's runs are off St(d, r) by up to phi = {record['phi']:.2g})" if record["phi"] is not None
                                 else " (a frame of this property's runs is so far off St(d, r) that ||W^T W - I|| overflows)")
    excluded = [{"case": case, "reason": reason, "frames": count} for (case, reason), count in runner.excluded.items()
                if not case.startswith("domain: ")]
    return {"domain": rows, "eps_zero": eps_zero, "determinism": repeats, "phi": _number(runner.phi), "properties": found, "excluded": excluded,
            "calls": runner.calls, "regimes": regimes.describe(precisions.of(variant))}


def _number(value: float) -> float | None:
    """A figure as a number: None where it is not finite (a returned frame so large that W^T W
    overflows has no defect to report), never the string "inf" of a JSON record."""
    return float(value) if math.isfinite(value) else None


# The broken variants each property must reject (reference_impl.VARIANTS), and what it must say.
CONTROLS = (
    ("P1", "canonical_metric_gradient", "fails"),
    ("P2", "fixed_step_sgd", "fails"),
    ("P3", "elementwise_second_moment", "fails"),
    ("P4-left", "elementwise_second_moment", "fails"),
    ("P4-right", "qr_retraction", "fails"),
    ("P4-signed", "qr_retraction", "fails"),
    ("P5", "unprojected_decay", "fails"),
    ("P5", "ignores_weight_decay", "vacuous"),
    ("P5", "stiefel_adam", "holds"),
    # bugs a property check once let through (kit/property_controls.py): a bound that absorbs its own
    # error, one learning rate only, a bit-for-bit vacuity probe of a nondeterministic box
    ("P2", "cayley_fixed_iterations", "fails"),
    ("P4-left", "one_norm_cap", "fails"),
    ("P4-right", "one_norm_cap", "fails"),
    ("P5", "hidden_branch_without_decay", "vacuous"),
)


def _ignores_weight_decay_step(W, G, state, config):
    return ri.step(W, G, state, replace(config, weight_decay=0.0))


IGNORES_WEIGHT_DECAY = ri.Variant("ignores_weight_decay", "StiefelAdam that drops weight_decay (P5's vacuity control)", ("P5",),
                                  ri.init, _ignores_weight_decay_step)


def controls(seed: int, only=PROPERTY_IDS, regimes: Regimes = DEFAULT_REGIMES) -> list[dict]:
    """Each property of `only` on its controls (CONTROLS): [{property, control, expected, verdict, margin,
    detected}]; a "fails" control is detected when its margin reaches DETECTION_FACTOR."""
    only = tuple(p for p in PROPERTY_IDS if p in only or p.split("-")[0] in only)
    records = []
    for property_id, name, expected in CONTROLS:
        if property_id not in only:
            continue
        if name == IGNORES_WEIGHT_DECAY.name:
            variant = IGNORES_WEIGHT_DECAY
        elif name in PROPERTY_CONTROLS:
            variant = PROPERTY_CONTROLS[name]()  # a fresh one: a hidden count starts at 0 in every run
        else:
            variant = ri.VARIANTS[name]
        runner = runner_for(variant)
        determinism(runner, seed, 0.0)  # as for an implementation: its noise measured first
        (found,) = ask(variant, seed, eps_zero=True, only=(property_id,), runner=runner, regimes=regimes)
        margin = found["margin"]
        detected = found["verdict"] == expected and (expected != "fails" or margin >= DETECTION_FACTOR)
        failing = next((c for c in found["checks"] if c["name"] == found["check"]), {})
        records.append({"property": property_id, "control": name, "expected": expected, "verdict": found["verdict"],
                        "margin": margin, "detected": bool(detected), "check": found["check"], "residual": failing.get("residual"),
                        "bound": failing.get("bound"), "reason": found["reason"]})
    return records


def apply_controls(found: list[dict], control_records: list[dict]) -> list[dict]:
    """A property whose check missed one of its controls is untested in this run (module docstring),
    unless it fails: a control that escaped shows a check too blunt to tell a failure, and says
    nothing against a residual beyond its bound."""
    missed = {}
    for record in control_records:
        if not record["detected"]:
            missed.setdefault(record["property"], record)
    out = []
    for record in found:
        miss = missed.get(record["property"])
        if miss is not None and record["verdict"] != "fails":
            record = {**record, "verdict": "untested", "check": None, "margin": None,
                      "reason": f"the check did not tell its control {miss['control']} (expected {miss['expected']}, got "
                                f"{miss['verdict']}" + (f", margin {miss['margin']:.3g}" if miss["margin"] is not None else "") + ")"}
        out.append(record)
    return out


__all__ = ["CONTROLS", "DOMAIN_CASES", "determinism", "setting_reaches_step", "PROPERTY_IDS", "PROPERTY_TEXT", "apply_controls", "ask", "ask_all", "controls", "decay_blindness", "domain", "equivariance", "runner_for",
           "scalar_preconditioner", "scale_independence", "steepest_descent", "verdict"]
