"""The optimizer's own trajectories, step by step, against an independently written model.

What is checked
    The optimizer under test (a reference_impl Variant: its own init and step) runs T = max(8,
    profile.steps) steps, from a fresh state (its init) and from warm states (a random valid state
    with t > 0: W Haar, m tangent at W, v > 0, t in [1, 100)). At every step k the model
    (kit.model.model_step, a second float64 statement of docs/algorithm.md that shares no code with
    reference_impl) is fed the optimizer's own input (W_k, m_k, v_k, t_k, G_k), and its output is
    compared with the optimizer's (W_k+1, m_k+1, v_k+1, t_k+1): W, m and v each against the one-step
    bound below, t exactly, and the fresh state against m = 0, v = 0 (one per frame), t = 0.

Why one step at a time
    Feeding the model the optimizer's own state keeps every comparison a one-step comparison, so the
    bound is the rounding of one step and does not depend on how the map amplifies earlier rounding
    (the scale-free step divides by sqrt(v^) and is not uniformly Lipschitz: following two separate
    trajectories would need a bound on that amplification, which for noise-driven steps does not
    exist). It loses nothing: a mistake in the step shows in the first step whose input exposes it,
    and bookkeeping mistakes (a stored m^ instead of m, m not transported, t not incremented, the
    cap or the bias correction applied to the stored moments, v without its 1/(d r)) change the
    state that step returns, which is compared at every step. The warm states reach t > 1 and
    v, m unrelated to the current gradient at once; the fresh runs reach them through the
    optimizer's own earlier steps.

The one-step bound (first order in u = 2^-53; every quantity evaluated at the model's values)
    One float64 evaluation of the step differs from the exact step at the same float64 input by at
    most propositions/kit/step_analysis.step_error, the one rounding analysis of the step (its
    stages, each a formula with its derivation, are cited by the checks' texts): `one_step_bound`
    evaluates it with the optimizer's retraction route unknown ("any": the largest of the SVD, the
    Gram-by-eigh and the Gram-by-Newton-Schulz evaluation bounds) and with the model's (eigh). The
    optimizer and the model are each within their bound of the exact step at the shared input, so
    ||W_opt - W_model|| <= E_W(any) + E_W(eigh), likewise m+ and v, and t must agree exactly.
    Where q = sqrt(v^) + eps is not above its error, or sigma_min(W + xi) not above the error of
    W + xi, the step is undefined at this rounding level (docs/algorithm.md#pitfalls: the
    noise-driven step): the sample is counted by the well-posed check instead of being compared.
    The derivatives are evaluated at the model's values, which differ from the exact ones by a
    relative O(n u): a second-order change.
    The mpmath twin (reference_impl.highprec.step_mp, exact to about 10^-dps) is compared with the
    optimizer and with the model on bare frames of a few small shapes: each is within its E of the
    exact step, plus (u + 10^(2 - dps)) times the norm for rounding the twin to float64 and its own error.

What would make it fail
    Any stage computed differently from docs/algorithm.md: the bookkeeping mistakes above; a retraction that
    is accurate only for small steps ((W + xi)(I - xi^T xi / 2), one Newton-Schulz iteration: their
    error is O(||xi||^4), visible at the trust radii 0.1 to inf used here); batching mistakes
    (statistics over the wrong axes, v shared across frames): bare (d, r) frames, one and two
    leading axes, and per-frame gradient scales that differ across a batch; a state of the wrong
    shape (an elementwise v), a step that raises on a valid state or modifies its input: residual inf.
    A retraction (W + xi)(I + xi^T xi)^(-1/2) that trusts W^T W = I and W^T xi = -xi^T W is the polar
    factor for tangent xi at an exact frame, so it is caught only where rounding leaves xi a normal
    part that is not small against xi: noise-driven steps (G in the normal space, P2's settings)
    and strong weight decay (P5's). Elsewhere it differs by the input's own drift, which the
    optimizer's input check keeps below 32 (d r + 2 sqrt(r)) u, the size of the bound itself.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from typing import Sequence

import numpy as np

import reference_impl as ri
from reference_impl import StiefelAdamConfig, get_variant

from . import observability, tightness
from . import precision as precisions
from .common import NumericalCheck, Profile, rng_for, u
from .step_analysis import InputErrors, Rounding, StepNorms, step_error, step_error_text
from .model import ModelStep, model_step, tangent_part
from .protocol import Context, Evidence, Part

MIN_STEPS = 8
TINY = np.finfo(np.float64).tiny


@dataclass(frozen=True)
class TrajectorySetting:
    """One family of trajectories.

    step_length: lr = step_length / sqrt(d r), so that the first step from a fresh state has
    ||xi|| ~ step_length before the cap (the cap is active when step_length > trust_radius).
    gradients: "gaussian" (per-frame scale 10^U(-1, 1)), "wide" (10^U(-30, 30)), "normal"
    (G = W S, S symmetric: P_W(G) = 0 up to rounding) or "zero". start: "fresh" (the optimizer's
    init) or "warm" (a random valid state, t in [1, 100)). leads: the leading axes of the batches,
    "k" standing for the profile's frame count.
    """

    name: str
    trust_radius: float
    step_length: float
    eps: float
    gradients: str
    start: str
    weight_decay: float = 0.0
    betas: tuple[float, float] = (0.9, 0.999)
    leads: tuple = ((), ("k",))

    def config(self, d: int, r: int) -> StiefelAdamConfig:
        return StiefelAdamConfig(lr=self.step_length / math.sqrt(d * r), betas=self.betas, eps=self.eps,
                                 trust_radius=self.trust_radius, weight_decay=self.weight_decay)


INF = math.inf


@dataclass(frozen=True)
class TrajectoryPlan:
    """The trajectories one claim holds to the model: its settings, at each of its shapes.

    claim: the id in the draws' keys; twins: whether the mpmath twin (model_highprec,
    trajectory_highprec) follows some of its bare trajectories. Each claim module defines its own
    (`TRAJECTORIES`); together they cover trust radii 0.1, 0.5, 1, 2 and inf, the cap active and
    not, fresh and warm states, bare frames, one and two leading axes, r = 1 and r = d, zero and
    normal-only gradients, weight decay on and off.
    """

    claim: str
    settings: tuple[TrajectorySetting, ...]
    shapes: tuple[tuple[int, int], ...]
    twins: bool = False


# The mpmath twin follows bare frames of a plan's trajectories (P3's) at these shapes (about 5 ms a step).
TWIN_SHAPES = ((2, 2), (5, 2), (3, 3))


def frames_per_batch(profile: Profile) -> int:
    """The "k" of TrajectorySetting.leads: 2 (quick), 4 (default), 64 (thorough)."""
    return max(2, min(64, profile.frames // 2500))


# --------------------------------------------------------------------------------------------
# The bound
# --------------------------------------------------------------------------------------------


def _frobenius(X: np.ndarray) -> np.ndarray:
    return np.sqrt(np.sum(X * X, axis=(-2, -1)))


@dataclass
class OneStepBound:
    """Per-frame bounds (shape lead) on one evaluation's distance from the exact step."""

    W: np.ndarray
    m: np.ndarray
    v: np.ndarray
    well_posed: np.ndarray


# The retraction's route: the optimizer under test may take any (the reference the SVD, torch_impl the
# Gram matrix with Newton-Schulz, others eigh); the model takes the Gram matrix by eigh (kit.model).
OPTIMIZER_ROUTE = "any"
MODEL_ROUTE = "eigh"


def one_step_bound(W, G, m_in, v_in, t_in: int, config: StiefelAdamConfig, model: ModelStep,
                   m_in_error=0.0, v_in_error=0.0, route: str = OPTIMIZER_ROUTE,
                   precision: precisions.Precision = precisions.FLOAT64) -> OneStepBound:
    """step_analysis.step_error of one evaluation of the step at (W, G, m_in, v_in, t_in), with the
    retraction's `route`, its quantities taken from the model's evaluation (module docstring), at the
    unit roundoffs of `precision` (kit/precision.py: float64 for the model; an implementation storing
    in float32 or bfloat16 rounds W, G and the moments handed to it to storage, the input errors here).

    m_in_error, v_in_error (per frame, default 0): bounds on how far the state the step actually
    holds may be from (m_in, v_in) (a black box's hidden state, see `_run_black_box`): the input
    errors of the moments in step_error. The result bounds the distance of the step at the hidden
    state from the exact step at (m_in, v_in).
    """
    d, r = W.shape[-2:]
    W_norm = _frobenius(W)
    norms = StepNorms(G=_frobenius(G), W=W_norm, g=model.g_norm, m_in=_frobenius(m_in), v_in=np.asarray(v_in, dtype=np.float64),
                      m=model.m_norm, v=model.v, xi_raw=model.xi_raw_norm, xi=model.xi_norm, A=W_norm + model.xi_norm,
                      sigma_min=model.sigma_min, sigma_max=model.sigma_max, t=t_in + 1)
    if precision.is_float64:
        rounding, inputs = Rounding(u_c=u, route=route), InputErrors(m=m_in_error, v=v_in_error)
    else:
        rounding = precision.rounding(config.trust_radius, d, r)
        inputs = precision.storage_inputs(W_norm, norms.m_in, norms.v_in, m_in_error, v_in_error)
    error = step_error(d, r, config, norms, rounding, inputs)
    # Where a bound is 0 its derivation says the step is exact (g = 0, v_in = 0 or m = 0 exactly):
    # the smallest normal float64 keeps the bound > 0 and still asks for exact agreement.
    return OneStepBound(W=np.maximum(error.W, TINY), m=np.maximum(error.m_plus, TINY), v=np.maximum(error.v, TINY),
                        well_posed=error.well_posed)


@dataclass
class StepComparison:
    """One step of the implementation against the model (`compare_step`): residuals and bounds per
    quantity ("W", "m", "v"; a black box has "W" only), whether the step is well posed (where it is
    not, residual 0 and bound 1: counted, not compared), the model's step, and a black box's carried
    state errors for the next step."""

    residual: dict
    bound: dict
    posed: np.ndarray
    model: ModelStep
    carried: tuple


def compare_step(white: bool, W, G, reference_state, W_new, state_new, config: StiefelAdamConfig,
                 precision: precisions.Precision = precisions.FLOAT64, carried=(0.0, 0.0)) -> StepComparison:
    """The one rule by which an implementation's step is held to the model, whoever asks (the claims'
    trajectories, the minimal counterexample, the pytest plugin, regression files): the model steps
    from reference_state (m, v, t) at the model's own route; the implementation's evaluation is within
    one_step_bound at its `precision` (kit/precision.py), the model's within one_step_bound at float64,
    so their distance is at most the sum. A white box is compared from its own state (W, m, v); a
    black box on W only, from the model's state, with the errors `carried` from the earlier steps as
    the input errors of its hidden moments (_run_black_box)."""
    m, v, t = reference_state
    with np.errstate(all="ignore"):
        model = model_step(W, G, m, v, t, config)
        own = one_step_bound(W, G, m, v, t, config, model, route=MODEL_ROUTE)
        if white:
            held = one_step_bound(W, G, m, v, t, config, model, precision=precision)
            residual = {"W": _frobenius(np.asarray(W_new) - model.W), "m": _frobenius(np.asarray(state_new.m) - model.m),
                        "v": np.abs(np.asarray(state_new.v, dtype=np.float64) - model.v)}
            bound = {name: getattr(held, name) + getattr(own, name) for name in residual}
            next_carried = carried
        else:
            held = one_step_bound(W, G, m, v, t, config, model, *carried, precision=precision)
            residual, bound = {"W": _frobenius(np.asarray(W_new) - model.W)}, {"W": held.W + own.W}
            # carried without the TINY floor of one_step_bound: a bound at the floor is an exact step
            # (g = 0, m = 0), whose state both runs hold exactly
            next_carried = tuple(np.where(a > TINY, a, 0.0) + np.where(b > TINY, b, 0.0) for a, b in ((held.m, own.m), (held.v, own.v)))
        # a step is judged only where both bounds exist: well posed, and every bound compared finite
        # (a bound that is not, an infinite retraction bound at a coarse precision, certifies nothing)
        finite = np.logical_and.reduce([np.isfinite(value) for value in bound.values()])
        posed = np.asarray(held.well_posed & own.well_posed & finite)
    residual = {name: np.where(posed, value, 0.0) for name, value in residual.items()}
    bound = {name: np.where(posed, value, 1.0) for name, value in bound.items()}
    return StepComparison(residual, bound, posed, model, next_carried)


# --------------------------------------------------------------------------------------------
# Running the trajectories
# --------------------------------------------------------------------------------------------


class _Checks:
    """The checks of one run and the coverage they record."""

    def __init__(self, label: str, seed: int):
        self.seed = seed
        self.label = label
        self.black_box = False
        self.precision = precisions.FLOAT64
        self.unposed: dict = {}  # (d, r) -> frame-steps not well posed there (a coarse precision's reason)
        self.W = NumericalCheck(
            f"trajectory_model_W[{label}]",
            "||W_opt - W_model|| after each step of the optimizer's own trajectories, the model fed the optimizer's input",
            "E_W(route any, the optimizer) + E_W(route eigh, the model), u_c = 2^-53: each float64 evaluation is within "
            "its E_W of the exact step; " + step_error_text("W"),
            tightness_note=tightness.WORST_CASE_SUMS,
        )
        self.m = NumericalCheck(
            f"trajectory_model_m[{label}]",
            "||m_opt - m_model|| for the stored (transported) first moment after each step",
            "E_m+(any) + E_m+(eigh), u_c = 2^-53; " + step_error_text("m"),
            tightness_note=tightness.WORST_CASE_SUMS,
        )
        self.v = NumericalCheck(
            f"trajectory_model_v[{label}]",
            "|v_opt - v_model| for the stored second moment (one scalar per frame) after each step",
            "E_v(any) + E_v(eigh), u_c = 2^-53; " + step_error_text("v"),
            tightness_note=tightness.SAME_ROUNDING,
        )
        self.bookkeeping = NumericalCheck(
            f"trajectory_model_bookkeeping[{label}]",
            "|t_opt - t_model| after each step, and the fresh state (0 when m = 0, v = 0 of shape lead, t = 0; "
            "inf otherwise); inf when a state has the wrong shape, or the step raises on a valid state or modifies its input",
            "Integers and exact zeros: bound 0.5 (exact agreement).",
            tightness_note=tightness.EQUALITY,
        )
        self.well_posed = NumericalCheck(
            f"trajectory_model_well_posed[{label}]",
            "1 where the one-step bound is undefined (q = sqrt(v^) + eps not above its rounding, or "
            "sigma_min(W + xi) not above the error of W + xi), else 0",
            "A count: bound 0.5. The settings give the noise-driven step (G in the normal space) eps > 0 "
            "or a warm state, so the real optimizer has no undefined step.",
            tightness_note=tightness.INDICATOR,
        )
        self.twin = NumericalCheck(
            f"trajectory_highprec[{label}]",
            "W, m and v of the optimizer's step against the mpmath twin (reference_impl.highprec) at its input",
            "One evaluation's bound E_W, E_m+, E_v (route any) of step_error (propositions/kit/step_analysis.py), plus "
            "(u + 10^(2 - dps)) ||.|| for rounding the twin to float64 and for the twin's own error at dps digits.",
            tightness_note=tightness.WORST_CASE_SUMS,
        )
        self.model_twin = NumericalCheck(
            "model_highprec",
            "W, m and v of the model's step against the mpmath twin at the same input (the model itself)",
            "As trajectory_highprec with the model's route (eigh): the model is one float64 evaluation, within its E of the exact step.",
            tightness_note=tightness.WORST_CASE_SUMS,
        )
        self.steps = 0
        self.clipped = 0
        self.leads: set = set()
        self.trust_radii: set = set()

    def fail_all(self, residual_shape, key, shape, error: str | None) -> None:
        extra = None if error is None else {"error": error}
        inf = np.full(residual_shape, np.inf)
        for check in (self.W, self.m, self.v, self.bookkeeping):
            check.add(inf, 1.0 if check is not self.bookkeeping else 0.5, shape=shape, key=key, seed=self.seed, extra=extra)

    def count_unposed(self, shape, flags) -> None:
        """Add the frame-steps flagged not well posed (flags: arrays of 0 / 1) to shape's count."""
        count = int(sum(np.count_nonzero(f) for f in flags))
        if count:
            self.unposed[tuple(shape)] = self.unposed.get(tuple(shape), 0) + count

    def list(self) -> list[NumericalCheck]:
        # a black box's m, v and t are not observable: those checks hold no sample and are recorded
        checks = [self.W, self.m, self.v, self.bookkeeping, self.well_posed]
        if self.black_box:  # m, v and t are not observable: recorded by _run_black_box, no sample here
            checks = [self.W, self.well_posed]
        checks += [c for c in (self.twin, self.model_twin) if c.samples]
        if not self.precision.is_float64:
            for check in (self.W, self.m, self.v, self.twin):
                check.bound_derivation += (f" The optimizer under test at {self.precision.text()}: its term of the bound is "
                                     "step_error at u_c, u_W = u_s, with its inputs rounded to storage (InputErrors).")
        radii = ", ".join("inf" if math.isinf(x) else f"{x:g}" for x in sorted(self.trust_radii))
        leads = ", ".join(str(tuple(x)) for x in sorted(self.leads, key=lambda x: (len(x), x)))
        self.W.description += (f" ({self.steps} frame-steps, {self.clipped} with the cap active; trust radii {radii};"
                               f" leading axes {leads})")
        return checks


def state_shapes_fit(state, W) -> bool:
    try:
        m, v, t = state.m, state.v, state.t
    except AttributeError:
        return False
    integer = isinstance(t, (int, np.integer)) and not isinstance(t, bool)
    return np.shape(m) == W.shape and np.shape(v) == W.shape[:-2] and integer


def trajectory_gradient(kind: str, W: np.ndarray, scales: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    if kind == "zero":
        return np.zeros_like(W)
    if kind == "normal":
        r = W.shape[-1]
        S = rng.standard_normal(W.shape[:-2] + (r, r))
        return (W @ (S + np.swapaxes(S, -1, -2))) * scales[..., None, None]
    return rng.standard_normal(W.shape) * scales[..., None, None]


def _scales(kind: str, lead: tuple, rng: np.random.Generator, decades: int = precisions.MAX_SCALE_DECADES) -> np.ndarray:
    # "wide": as many decades as the optimizer's dtype holds (kit/precision.py), 30 in float64
    low, high = (-float(decades), float(decades)) if kind == "wide" else (-1.0, 1.0)
    return 10.0 ** rng.uniform(low, high, size=lead)


def warm_state(W: np.ndarray, scales: np.ndarray, rng: np.random.Generator) -> ri.StiefelAdamState:
    """m tangent at W of size ~ the gradient's, v > 0 of the gradient's mean square, t in [1, 100)."""
    d, r = W.shape[-2:]
    lead = W.shape[:-2]
    flat = W.reshape(-1, d, r)
    m = tangent_part(flat, rng.standard_normal(flat.shape)).reshape(W.shape) * (0.5 * scales)[..., None, None]
    v = np.asarray(scales**2 * rng.uniform(0.25, 4.0, size=lead), dtype=np.float64)
    return ri.StiefelAdamState(m=m, v=v, t=int(rng.integers(1, 100)))


def _fresh_state_residual(state, W) -> float:
    if not state_shapes_fit(state, W):
        return math.inf
    fresh = np.all(np.asarray(state.m) == 0) and np.all(np.asarray(state.v) == 0) and state.t == 0
    return 0.0 if fresh else math.inf


def _compare_with_twin(checks: _Checks, W, G, state, config, out, model, bounds, dps, key, shape):
    """The optimizer's step (bounds[0], its route) and the model's (bounds[1], eigh) against the mpmath twin."""
    from reference_impl import highprec

    W_mp, state_mp = highprec.step_mp(W, G, ri.StiefelAdamState(m=state.m, v=np.asarray(state.v), t=state.t), config, dps,
                                      validate=checks.precision.is_float64)
    W_twin, m_twin = highprec.to_float64(W_mp), highprec.to_float64(state_mp.m)
    v_twin = float(state_mp.v)
    rounding = u + 10.0 ** (2 - dps)  # the twin rounded to float64, and its own error at dps digits
    for check, (W_x, m_x, v_x), bound in ((checks.twin, out, bounds[0]), (checks.model_twin, (model.W, model.m, model.v), bounds[1])):
        W_bound = float(bound.W) + rounding * float(_frobenius(W_twin))
        m_bound = float(bound.m) + rounding * float(_frobenius(m_twin))
        v_bound = float(bound.v) + rounding * abs(v_twin)
        residuals = [float(_frobenius(W_x - W_twin)), float(_frobenius(m_x - m_twin)), abs(float(v_x) - v_twin)]
        check.add(residuals, [W_bound, m_bound, v_bound], shape=shape, key=key, seed=checks.seed,
                  extra={"quantities": ["W", "m", "v"]})
        # which quantities ever differed from the twin: each does at rounding level, and a comparison of
        # one quantity with itself (0 for ever) leaves the others' ratios, and so the check's, as they were
        for quantity, residual in zip("Wmv", residuals):
            if residual != 0.0:
                check.cover("differs_from_twin", quantity)


def _start_batch(checks: _Checks, setting: TrajectorySetting, d: int, r: int, lead: tuple, key: tuple):
    """The draws and the record of one batch of trajectories, white box or black box alike:
    (rng, config, W_0, gradient scales, frame count, the worst case's extra fields)."""
    rng = rng_for(checks.seed, *key)
    config = setting.config(d, r)
    W = ri.random_point(d, r, rng, lead)
    scales = _scales(setting.gradients, lead, rng, checks.precision.scale_decades)
    checks.leads.add(lead)
    checks.trust_radii.add(setting.trust_radius)
    extra = {"setting": setting.name, "start": setting.start, "gradients": setting.gradients, "lead": list(lead),
             "lr": config.lr, "betas": list(config.betas), "eps": config.eps, "trust_radius": config.trust_radius,
             "weight_decay": config.weight_decay, "index_layout": "(step - 1) * frames + frame"}
    return rng, config, W, scales, int(np.prod(lead, dtype=np.int64)), extra


def _compare_with_model(checks: _Checks, variant, setting: TrajectorySetting, d: int, r: int, lead: tuple,
                    steps: int, key: tuple, twin_dps: int | None) -> None:
    """One batch of trajectories; its samples are added once, in the order (step, frame)."""
    if not observability.state_observable(variant):
        _run_black_box(checks, variant, setting, d, r, lead, steps, key)
        return
    rng, config, W, scales, frames, extra = _start_batch(checks, setting, d, r, lead, key)
    shape = (d, r)
    collected = {name: ([], []) for name in ("W", "m", "v", "bookkeeping", "well_posed")}
    error = None
    if setting.start == "fresh":
        try:
            state = variant.init(W)
            if not state_shapes_fit(state, W):
                error = "init returned a state of the wrong shape"
            checks.bookkeeping.add([_fresh_state_residual(state, W)], 0.5, shape=shape, key=key, seed=checks.seed,
                                   extra={**extra, "index_layout": "the fresh state"})
        except (ValueError, ArithmeticError) as exception:
            error = f"init raised {type(exception).__name__}: {exception}"
    else:
        state = warm_state(W, scales, rng)
    for k in range(0 if error else steps):
        G = trajectory_gradient(setting.gradients, W, scales, rng)
        W_new, state_new, error = checked_step(variant, W, G, state, config, k, watched=(W, G, state.m, state.v))
        if error is None and not state_shapes_fit(state_new, W):
            error = f"step {k + 1} returned a state of the wrong shape"
        if error is not None:
            break
        compared = compare_step(True, W, G, (state.m, state.v, state.t), W_new, state_new, config, checks.precision)
        model = compared.model
        posed = np.broadcast_to(compared.posed, lead).ravel()
        for name in ("W", "m", "v"):
            # steps whose bound is undefined are counted by _well_posed, not compared
            collected[name][0].append(np.broadcast_to(compared.residual[name], lead).ravel())
            collected[name][1].append(np.broadcast_to(compared.bound[name], lead).ravel())
        collected["bookkeeping"][0].append(np.full(frames, float(abs(int(state_new.t) - model.t))))
        collected["well_posed"][0].append(np.where(posed, 0.0, 1.0))
        checks.steps += frames
        checks.clipped += int(np.count_nonzero(model.clipped))
        if twin_dps is not None and bool(np.all(posed)):
            with np.errstate(all="ignore"):
                bounds = (one_step_bound(W, G, state.m, state.v, state.t, config, model, precision=checks.precision),
                          one_step_bound(W, G, state.m, state.v, state.t, config, model, route=MODEL_ROUTE))
            _compare_with_twin(checks, W, G, state, config, (W_new, state_new.m, state_new.v), model, bounds, twin_dps, key + (k,), shape)
        W, state = np.asarray(W_new), state_new
    checks.count_unposed(shape, collected["well_posed"][0])
    for name, (residuals, bounds) in collected.items():
        if residuals:
            check = getattr(checks, name)
            check.add(np.concatenate(residuals), np.concatenate(bounds) if bounds else 0.5,
                      shape=shape, key=key, seed=checks.seed, extra=extra)
    if error is not None:
        checks.fail_all((frames,), key, shape, error)


def checked_step(variant, W, G, state, config, k: int, watched):
    """(W_new, state_new, None) for one step of the optimizer under test, or (None, None, reason)
    when it raises, modifies one of the `watched` inputs or returns a frame of the wrong shape."""
    before = [np.array(x, copy=True) for x in watched]
    try:
        with np.errstate(all="ignore"):
            W_new, state_new = variant.step(W, G, state, config)
    except (ValueError, ArithmeticError) as exception:
        return None, None, f"step {k + 1} raised {type(exception).__name__}: {exception}"
    if not all(np.array_equal(x, y) for x, y in zip(before, watched)):
        return None, None, f"step {k + 1} modified its input (docs/algorithm.md: inputs are never modified)"
    if np.shape(W_new) != W.shape:
        return None, None, f"step {k + 1} returned a frame of the wrong shape"
    return W_new, state_new, None


def _run_black_box(checks: _Checks, variant, setting: TrajectorySetting, d: int, r: int, lead: tuple,
                   steps: int, key: tuple) -> None:
    """The trajectories of an optimizer whose state is not observable: W only.

    A warm start needs a state built by the checker, which a black box cannot take: those settings
    are recorded as not observable. From a fresh state the optimizer runs on its own; the model is fed
    the optimizer's W_k and the same G_k, and keeps its own m, v, t (from m = 0, v = 0, t = 0). The
    optimizer's hidden (m_k, v_k) then differ from the model's by the rounding of both runs so far,
    bounded recursively: with e_k >= ||m_k^opt - m_k^model|| and f_k >= |v_k^opt - v_k^model|
    (e_0 = f_0 = 0: both fresh), the optimizer's step at its hidden state is within E(e_k, f_k) of
    the exact step at the model's input (one_step_bound with the input errors: beta1 e_k and beta2 f_k
    enter stages 3 and 4 and are propagated as rounding is), and the model's step within E(0, 0). So
        ||W_opt - W_model|| <= E_W(e_k, f_k) + E_W(0, 0),
        e_k+1 = E_m+(e_k, f_k) + E_m+(0, 0),  f_k+1 = E_v(e_k, f_k) + E_v(0, 0).
    The bound grows with k (the move of the transport P_W+ with W+ feeds back into e), and stays
    first order in u over the MIN_STEPS to profile.steps steps run here.
    """
    shape = (d, r)
    # a warm setting would hand the optimizer a state built by the checker, and a black box takes only
    # its own: it runs the setting from its own fresh state (its moments warm up over the run), so
    # that the setting's hyper-parameters (a trust radius, a step length) are not left untried
    for name in ("m", "v", "bookkeeping"):
        observability.record(f"trajectory_model_{name}[{checks.label}]",
                             "m, v and t are the optimizer's hidden state (W is compared, with the model keeping its own m, v, t)")
    rng, config, W, scales, frames, extra = _start_batch(checks, setting, d, r, lead, key)
    extra["state"] = "not observable: the model keeps its own m, v, t"
    extra["start"] = "fresh"
    residuals, bounds, posed_flags = [], [], []
    error = None
    try:
        state = variant.init(W)
    except (ValueError, ArithmeticError) as exception:
        error = f"init raised {type(exception).__name__}: {exception}"
    m_model, v_model, t_model = np.zeros_like(W), np.zeros(lead), 0
    m_error, v_error = np.zeros(lead), np.zeros(lead)
    for k in range(0 if error else steps):
        G = trajectory_gradient(setting.gradients, W, scales, rng)
        # a black box's state is its own: only W and G are watched
        W_new, state_new, error = checked_step(variant, W, G, state, config, k, watched=(W, G))
        if error is not None:
            break
        compared = compare_step(False, W, G, (m_model, v_model, t_model), W_new, state_new, config, checks.precision,
                                (m_error, v_error))
        model, posed = compared.model, np.broadcast_to(compared.posed, lead).ravel()
        residuals.append(np.broadcast_to(compared.residual["W"], lead).ravel())
        bounds.append(np.broadcast_to(compared.bound["W"], lead).ravel())
        posed_flags.append(np.where(posed, 0.0, 1.0))
        checks.steps += frames
        checks.clipped += int(np.count_nonzero(model.clipped))
        m_error, v_error = compared.carried
        m_model, v_model, t_model = model.m, model.v, model.t
        W, state = np.asarray(W_new), state_new
    if residuals:
        checks.W.add(np.concatenate(residuals), np.concatenate(bounds), shape=shape, key=key, seed=checks.seed, extra=extra)
        checks.well_posed.add(np.concatenate(posed_flags), 0.5, shape=shape, key=key, seed=checks.seed, extra=extra)
        checks.count_unposed(shape, posed_flags)
    if error is not None:
        checks.W.add(np.full(frames, np.inf), 1.0, shape=shape, key=key, seed=checks.seed, extra={**extra, "error": error})


def _twin_plan(settings: int, profile: Profile) -> set:
    """(setting index, shape) of the bare trajectories the mpmath twin follows: max(1, mp_samples // 2)
    of them (1 quick, 4 default, 12 thorough), every setting before any setting twice."""
    budget = min(max(1, profile.mp_samples // 2), settings * len(TWIN_SHAPES))
    return {(i % settings, TWIN_SHAPES[(i + i // settings) % len(TWIN_SHAPES)]) for i in range(budget)}


def trajectory_agreement(seed: int, profile: Profile, optimizer, plans: TrajectoryPlan | Sequence[TrajectoryPlan]) -> list[NumericalCheck]:
    """The checks of _agreement (its docstring)."""
    return _agreement(seed, profile, optimizer, plans).list()


def _agreement(seed: int, profile: Profile, optimizer, plans: TrajectoryPlan | Sequence[TrajectoryPlan]) -> _Checks:
    """Compare the optimizer's own trajectories with the model, step by step (see the module docstring).

    optimizer: a reference_impl.VARIANTS name or a Variant. plans: the claims' TrajectoryPlan (one,
    or several run in order). Returns the checks trajectory_model_W, _m, _v, _bookkeeping,
    _well_posed, and where a plan has twins trajectory_highprec and model_highprec.
    """
    variant = get_variant(optimizer)
    plans = (plans,) if isinstance(plans, TrajectoryPlan) else tuple(plans)
    checks = _Checks(variant.name, seed)
    checks.black_box = not observability.state_observable(variant)
    checks.precision = precisions.of(variant)
    steps = max(MIN_STEPS, profile.steps)
    k = frames_per_batch(profile)
    for plan in plans:
        twins = _twin_plan(len(plan.settings), profile) if plan.twins else set()
        for index, setting in enumerate(plan.settings):
            for d, r in plan.shapes:
                for lead in setting.leads:
                    lead = tuple(k if x == "k" else x for x in lead)
                    key = ("trajectories", plan.claim, setting.name, d, r, "x".join(map(str, lead)) or "bare")
                    twin_dps = profile.mp_dps if lead == () and (index, (d, r)) in twins else None
                    _compare_with_model(checks, variant, setting, d, r, lead, steps, key, twin_dps)
    return checks


def trajectory_evidence(ctx: Context, plan: TrajectoryPlan) -> Evidence:
    """The trajectory checks of one claim's settings as a part's Evidence (trajectory_agreement).

    In float64 the settings make every step of a correct optimizer well posed, and a step that is not
    fails trajectory_model_well_posed. At a coarser precision (kit/precision.py) the step may be
    undefined at the implementation's own rounding level (q or sigma_min not above its error, or a
    bound that is not finite): those frame-steps are not compared, and the certificate names how
    many, at which shapes, and one case (a note), instead of failing an implementation that the
    analysis cannot judge there; it is inconclusive only where no step at all was compared."""
    found = _agreement(ctx.seed, ctx.profile, ctx.optimizer, plan)
    checks = found.list()
    if precisions.of(get_variant(ctx.optimizer)).is_float64:
        return Evidence(checks=checks)
    undefined = [c for c in checks if c.name.startswith("trajectory_model_well_posed[") and not c.passed]
    precision = precisions.of(get_variant(ctx.optimizer))
    where = ", ".join(f"{count} at ({d}, {r})" for (d, r), count in found.unposed.items())
    texts = [f"{c.name}: {c.exceeding()} of {c.samples} frame-steps are not well posed at the implementation's rounding "
             f"({precision.storage}: q = sqrt(v^) + eps or sigma_min(W + xi) not above its own error, or a bound that is "
             f"not finite) and were not compared ({where}); one case: {_case_text(c.worst)}" for c in undefined]
    # the steps where the analysis judges this dtype are compared and the others are named (notes);
    # only a check that compared no step at all leaves the claim without evidence (inconclusive)
    empty = [text for c, text in zip(undefined, texts) if c.exceeding() >= c.samples]
    return Evidence(checks=[c for c in checks if c not in undefined], notes=[t for t in texts if t not in empty], inconclusive=empty)


def _case_text(worst: dict) -> str:
    """One reproducing case of a trajectory check's worst sample: the setting, the shape, the frame
    and the step (index_layout (step - 1) * frames + frame), the seed."""
    lead = tuple(worst.get("lead") or ())
    frames = int(np.prod(lead)) if lead else 1
    step, frame = divmod(int(worst["index_in_draw"]), frames)
    where = "a bare frame" if not lead else f"frame {frame} of a batch {lead}"
    return (f"setting {worst['setting']} (lr {worst['lr']:g}, betas {tuple(worst['betas'])}, eps {worst['eps']:g}, "
            f"Delta {worst['trust_radius']:g}, lambda {worst['weight_decay']:g}), shape ({worst['shape'][0]}, {worst['shape'][1]}), "
            f"{where}, step {step + 1}, seed {worst['seed']} (key {'/'.join(worst['key'])})")


def trajectory_part(plan: TrajectoryPlan) -> Part:
    """The optimizer's own trajectories against the model, step by step, with a claim's plan: a
    background part of each of the claims P1..P5."""
    return Part("trajectories", functools.partial(trajectory_evidence, plan=plan), background=True)
