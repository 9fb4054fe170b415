"""Which stage of docs/algorithm.md an implementation gets wrong, at its first diverging step.

A counterexample (certify.ci.counterexample) ends at the first step whose output leaves the model's
trajectory. That step is replayed here stage by stage against the reference, from the
implementation's own input (its W_k, G_k and the state it held before the step), and the first stage
whose output differs beyond its bound is named:

  projection       (stages 1-2) g = P_W(G + lambda W)
  moments          (stages 3-4) m = beta1 m + (1 - beta1) g, v = beta2 v + (1 - beta2) ||g||^2 / (d r)
  bias correction  (stage 5)    t + 1, m^ = m / (1 - beta1^t), v^ = v / (1 - beta2^t)
  direction        (stage 6)    xi = -lr m^ / (sqrt(v^) + eps)
  cap              (stage 7)    ||xi|| <= Delta
  retraction       (stage 8)    W+ = polar(W + xi)
  transport        (stage 8)    m+ = P_{W+}(m)

Where the state is observable (a white box), the stored m+, v+ and t+ of the failing step are
compared with the reference's at the same input, with the one-step bounds of
propositions/kit/trajectories.py: v+ is stage 4's output; m+ is stage 3's output carried by the
transport, compared both with P_{W+}(m) (W+ the implementation's own, so that a retraction error is
not blamed on m) and with the untransported m. A wrong m or v is the moments (unless the direction
of a tiny first step, below, already shows a wrong g: the projection); m that matches only
untransported is the transport; t+ != t + 1 is the bias correction's counter.

Stages 5-8, and all of them for a black box, are told apart by stage probes: steps of the
implementation from the same W and state with the hyper-parameters chosen so that one stage decides
the observed W+ (certify/outside/probes.py, whose tolerances and their derivation are used unchanged):

  * a tiny step (length TINY_STEP, no cap, eps = 0) from a fresh state: any retraction is W + xi +
    O(||xi||^2), so the direction recovered by the inverse polar retraction is xi's to 1e-7 relative;
    it must be -P_W(G + lambda W) (projection); its length lr sqrt(d r) with betas (0, 0), where the
    bias correction is 1, tests the moments, and with the step's betas, the bias correction at t = 1;
  * a tiny step from the state the implementation held before the failing step: its direction must be
    the reference's -m^ and its length lr ||m^|| / (sqrt(v^) + eps) (the reference's state: the
    implementation's own for a white box, the model's run for a black box, whose hidden moments differ
    by rounding only). A white box's m, v and t were compared above, so a length that differs with
    eps = 0 is the bias correction and one that differs only with eps is the direction; for a black
    box, whose hidden m may also be wrong by its transport, a differing tiny step from a history state
    is named "moments or transport" (its direction) or "moments, bias correction or transport" (its
    length), and a first step's length with the step's betas "moments or bias correction";
  * a step of length 0.3 without cap along the tiny step's own direction u must be polar(W + a u) for
    some a (retraction);
  * the failing step itself from the held state, replayed with eps = 0 and no cap, then with its eps
    and no cap, then as it was, against the model within the trajectory check's own one-step bound
    (the retraction having fitted polar): the first to leave the model is the bias correction (for
    a black box: the moments, the bias correction or the transport), the direction (eps) or the cap.

At the implementation's precision. Every probe and comparison holds the implementation to the
analysis of its own dtype (kit/precision.py), as the claims do: the stored state and the full steps
through kit.trajectories.compare_step, the probes through `ProbeScale`. A probe's output W_1 is off
by at most rho, the one-step rounding bound of that probe step at the implementation's precision plus
the model's (one_step_bound); the inverse polar retraction carries an error dW_1 into the recovered xi
with a factor at most KAPPA = 2 near xi = 0 (its derivative there is the identity on the tangent
space and 0 across it, norm 1, plus O(||xi||) <= 0.1 here), so a probe of length s reads xi to
2 rho / s relative. In float64 the probes keep the lengths and tolerances of certify/outside/probes.py
(s = 1e-7: rounding 1e-9 relative, a retraction that is not polar bending by O(s) = 1e-7, tolerances
1e-6). In float32 and bfloat16 that s is below the storage's resolution (u_s = 6e-8, 4e-3): the
probe reads xi to e = KAPPA rho / s + BENDING s relative, both terms bounds: the first the rounding
bound carried through the inverse retraction, the second what a retraction other than polar (QR,
Cayley, the exponential: each W + xi + O(||xi||^2) with a second-order term of norm at most ||xi||^2)
adds, at most 2 ||xi||^2 from polar's. The probe takes s = sqrt(KAPPA rho / BENDING), where the two
are equal; a length differs beyond e, a direction beyond 1 - sqrt(1 - e^2) (an error of relative
size e turns xi by asin(e) at most). A float32 stage error of order one (a wrong beta, a missing
1 / (d r), the canonical gradient) then differs as its float64 twin does. The retraction is not fitted
along a tiny step's direction there (its reading e is coarser than QR's bending at 0.3): two steps of
lengths MODERATE_STEP and 2 MODERATE_STEP, recovered by the inverse polar retraction, must be
proportional (xi scales with lr exactly), to within each one's rounding bound times the inverse's
own a posteriori sensitivity; a retraction other than polar bends the second by its second-order term.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

import reference_impl as ri
from certify.outside.probes import DIRECTION_TOLERANCE, FIT_TOLERANCE, LENGTH_TOLERANCE, RETRACTIONS, TINY_STEP, _fit
from propositions._common import rng_for
from propositions.kit import observability
from propositions.kit import precision as precisions
from propositions.kit.directions import inverse_polar_retraction
from propositions.kit.model import model_step
from propositions.kit.trajectories import MODEL_ROUTE, compare_step, one_step_bound
from reference_impl.adam import moments_and_direction

KAPPA = 2.0  # the inverse polar retraction's gain on an error of W_1 near xi = 0 (module docstring)


@dataclass(frozen=True)
class ProbeScale:
    """A tiny probe's length and tolerances at the implementation's precision (module docstring):
    step, direction (on 1 - cos), length (on |ratio - 1|), and the relative error `reading` with which
    the probe reads xi (KAPPA rho / step)."""

    step: float
    direction: float
    length: float
    reading: float

    @classmethod
    def at(cls, precision, rounding) -> "ProbeScale":
        """The scale for a probe whose step of length TINY_STEP has one-step rounding bound rho =
        rounding(TINY_STEP) and one of length s has rounding(s) (a callable: the bound depends on the step)."""
        if precision.is_float64:
            return cls(TINY_STEP, DIRECTION_TOLERANCE, LENGTH_TOLERANCE, KAPPA * rounding(TINY_STEP) / TINY_STEP)
        step = max(TINY_STEP, min(MAX_PROBE_STEP, math.sqrt(KAPPA * rounding(TINY_STEP) / BENDING)))
        reading = KAPPA * rounding(step) / step
        error = reading + BENDING * step  # relative error of the xi read, a bound (module docstring)
        direction = 1.0 - math.sqrt(1.0 - error**2) if error < 1 else 1.0  # an error e turns xi by asin(e) at most
        return cls(step, max(DIRECTION_TOLERANCE, direction), max(LENGTH_TOLERANCE, error), reading)


BENDING = 2.0  # a retraction W + xi + O(||xi||^2) differs from polar by at most 2 ||xi||^2 (module docstring)
MAX_PROBE_STEP = 0.1  # the O(||xi||) terms above stay below 0.1 (KAPPA's derivation)
STAGE_NUMBERS = {"projection": "stages 1-2", "moments": "stages 3-4", "bias correction": "stage 5", "direction": "stage 6",
                 "cap": "stage 7", "retraction": "stage 8", "transport": "stage 8", "moments or bias correction": "stages 3-5",
                 "moments or transport": "stages 3-4 or 8", "moments, bias correction or transport": "stages 3-5 or 8"}
MODERATE_STEP = 0.3


def _frobenius(X):
    return np.sqrt(np.sum(X * X, axis=(-2, -1)))


def _finding(stage: str, test: str, measured: str, differs: bool) -> dict:
    return {"stage": stage, "test": test, "measured": measured, "differs": bool(differs)}


def _ratio_text(residual, bound) -> str:
    return f"{float(np.max(residual)):.3g} vs bound {float(np.min(bound)):.3g}"


def _rounding(precision, W, G, reference_state, config_of, carried=(0.0, 0.0)):
    """rho(s): the largest one-step rounding bound on W_1 over the frames of the probe step of length s
    (config_of(s) its config), at the implementation's precision plus the model's (module docstring);
    infinite where the step is not well posed or the first-order analysis does not apply."""
    m, v, t = reference_state

    def rho(length: float) -> float:
        config = config_of(length)
        try:
            with np.errstate(all="ignore"):
                model = model_step(W, G, m, v, t, config)
                held = one_step_bound(W, G, m, v, t, config, model, *carried, precision=precision)
                own = one_step_bound(W, G, m, v, t, config, model, route=MODEL_ROUTE)
        except precisions.PrecisionTooCoarse:
            return math.inf
        total = np.where(held.well_posed & own.well_posed, held.W + own.W, np.inf)
        return float(np.max(total))

    return rho


def _tolerance_text(precision, scale: ProbeScale, which: str) -> str:
    if precision.is_float64:
        return ""
    return f" (tolerance {getattr(scale, which):.3g} at {precision.storage}, probe length {scale.step:.3g})"


def state_findings(W, G, state, W_new, state_new, config, precision=precisions.FLOAT64) -> list[dict]:
    """A white box's stored m+, v+, t+ at the failing step against the reference (module docstring),
    within the trajectory check's bounds at the implementation's precision (compare_step)."""
    m, v, t = state.m, np.asarray(state.v, dtype=np.float64), int(state.t)
    with np.errstate(all="ignore"):
        compared = compare_step(True, W, G, (m, v, t), W_new, state_new, config, precision)
        g = ri.project_tangent(W, G + config.weight_decay * W, validate=False)
        m3 = config.betas[0] * m + (1 - config.betas[0]) * g
        m_new = np.asarray(state_new.m, dtype=np.float64)
        posed = compared.posed
        transported = np.where(posed, _frobenius(m_new - ri.project_tangent(np.asarray(W_new, dtype=np.float64), m3, validate=False)), 0.0)
        untransported = np.where(posed, _frobenius(m_new - m3), 0.0)
        v_residual = compared.residual["v"]
    bound_m, bound_v = compared.bound["m"], compared.bound["v"]
    m_ok, v_ok = bool(np.all(transported <= bound_m)), bool(np.all(v_residual <= bound_v))
    findings = [
        _finding("moments", "stored m+ (as P_{W+}(m)) and v+ against the reference's stages 3-4",
                 f"m+: {_ratio_text(transported, bound_m)}; v+: {_ratio_text(v_residual, bound_v)}",
                 (not m_ok and not bool(np.all(untransported <= bound_m))) or not v_ok),
        _finding("bias correction", "the stored step count t+ = t + 1", f"t = {t}, t+ = {state_new.t}", int(state_new.t) != t + 1),
    ]
    transport = not m_ok and bool(np.all(untransported <= bound_m))
    return findings, _finding("transport", "stored m+ is P_{W+}(m), not m", f"||m+ - m|| {_ratio_text(untransported, bound_m)}", transport)


def _probe_gradient(W, G, weight_decay, seed):
    """The step's own G where its tangent part is not rounding noise, else a Gaussian one.

    Not a tolerance: it only chooses the probe's input. A tangent part below 1e-3 ||G|| leaves the
    probe's direction resting on a projection that cancels most of G, whose rounding (about
    (d + r) u ||G||, the projection stage) is then 1e3 times larger relative to it; a Gaussian G
    has a tangent part of order ||G|| and no such cancellation."""
    tangent = _frobenius(ri.project_tangent(W, G + weight_decay * W, validate=False))
    if np.all(tangent > 1e-3 * np.maximum(_frobenius(G), np.finfo(float).tiny)):
        return G
    return rng_for(seed, "stage probe", *W.shape).standard_normal(W.shape)


def _recovered(W, W1):
    return inverse_polar_retraction(W, np.asarray(W1)).xi


def _cos(x, y):
    return np.sum(x * y, axis=(-2, -1)) / (_frobenius(x) * _frobenius(y))


def _config(config, **change):
    values = dict(lr=config.lr, betas=config.betas, eps=config.eps, trust_radius=config.trust_radius, weight_decay=config.weight_decay)
    return ri.StiefelAdamConfig(**{**values, **change})


def fresh_findings(variant, W, G, config, seed, white: bool = True) -> list[dict]:
    """Tiny steps from a fresh state at the failing step's W (module docstring), each of the length
    and held to the tolerances of ProbeScale at the implementation's precision."""
    d, r = W.shape[-2:]
    precision = precisions.of(variant)
    G = _probe_gradient(W, G, config.weight_decay, seed)
    expected = -ri.project_tangent(W, G + config.weight_decay * W, validate=False)
    fresh = (np.zeros_like(W), np.zeros(W.shape[:-2]), 0)
    findings = []
    # with the step's betas at t = 1, a beta taken for the other in stage 3 or 4 changes the length as a
    # wrong 1 - beta^t does: a white box's stored m and v decided stages 3-4 before this probe, a
    # black box's cannot, and the probe then names both
    third = "bias correction" if white else "moments or bias correction"
    for stage, betas in (("projection", config.betas), ("moments", (0.0, 0.0)), (third, config.betas)):
        def probe_config(length, betas=betas):
            return _config(config, lr=length / math.sqrt(d * r), betas=betas, eps=0.0, trust_radius=math.inf)

        scale = ProbeScale.at(precision, _rounding(precision, W, G, fresh, probe_config))
        W1 = variant.step(W, G, variant.init(W), probe_config(scale.step))[0]
        xi = _recovered(W, W1)
        if stage == "projection":
            worst = float(np.min(_cos(xi, expected)))
            findings.append(_finding(stage, "direction of a tiny first step: -P_W(G + lambda W)",
                                     f"min cos = {worst:.12f}{_tolerance_text(precision, scale, 'direction')}",
                                     not 1 - worst <= scale.direction))
            continue
        ratio = _frobenius(xi) / scale.step
        what = "betas (0, 0), where 1 - beta^t = 1" if stage == "moments" else f"betas {tuple(betas)} at t = 1"
        findings.append(_finding(stage, f"length of a tiny first step, {what}: lr sqrt(d r)",
                                 f"||xi|| / (lr sqrt(d r)) in [{float(np.min(ratio)):.9g}, {float(np.max(ratio)):.9g}]"
                                 f"{_tolerance_text(precision, scale, 'length')}",
                                 not float(np.max(np.abs(ratio - 1))) <= scale.length))
    return findings


def _reference_xi(W, G, reference_state, config):
    m, v, t = reference_state
    g = ri.project_tangent(W, G + config.weight_decay * W, validate=False)
    return moments_and_direction(g, ri.StiefelAdamState(m=m, v=np.asarray(v), t=t), config)[3]


def history_findings(variant, W, G, state, reference_state, config, white: bool, carried=(0.0, 0.0)) -> list[dict]:
    """Tiny steps from the state held before the failing step; eps = 0 then the step's own eps (the
    length and tolerances of ProbeScale; carried: a black box's hidden-state errors)."""
    precision = precisions.of(variant)
    findings = []
    for eps in (0.0, config.eps):
        unit = _config(config, lr=1.0, eps=eps, trust_radius=math.inf)
        length = float(np.min(_frobenius(_reference_xi(W, G, reference_state, unit))))
        if not length > 0:
            return findings
        scale = ProbeScale.at(precision, _rounding(precision, W, G, reference_state, lambda s: _config(unit, lr=s / length), carried))
        probe = _config(unit, lr=scale.step / length)
        expected = _reference_xi(W, G, reference_state, probe)
        xi = _recovered(W, variant.step(W, G, state, probe)[0])
        worst = float(np.min(_cos(xi, expected)))
        ratio = _frobenius(xi) / _frobenius(expected)
        findings.append(_finding("direction" if white else "moments or transport", f"direction of a tiny step from the held state (eps = {eps:g}): -m^",
                                 f"min cos = {worst:.12f}{_tolerance_text(precision, scale, 'direction')}",
                                 not 1 - worst <= scale.direction))
        stage = ("bias correction" if eps == 0 else "direction") if white else "moments, bias correction or transport"
        findings.append(_finding(stage, f"length of a tiny step from the held state (eps = {eps:g}): lr ||m^|| / (sqrt(v^) + eps)",
                                 f"ratio in [{float(np.min(ratio)):.9g}, {float(np.max(ratio)):.9g}]{_tolerance_text(precision, scale, 'length')}",
                                 not float(np.max(np.abs(ratio - 1))) <= scale.length))
    return findings


def retraction_finding(variant, W, G, state, reference_state, config, carried=(0.0, 0.0)) -> tuple[dict, float]:
    """A step of length MODERATE_STEP without cap, fitted by polar(W + a u) along its tiny direction u
    (float64), or two steps of lengths MODERATE_STEP and twice it held to be proportional once
    recovered by the inverse polar retraction (a coarser precision; module docstring). Returns the
    finding and the slack it leaves: 0 in float64, where a fit within 1e-5 excludes every retraction
    that differs from polar at second order (certify/outside/probes.py); at a coarser precision the
    distance by which a retraction within the test's tolerance could differ from polar on a step of
    length MODERATE_STEP, which full_step_findings scales to its step."""
    precision = precisions.of(variant)
    unit = _config(config, lr=1.0, trust_radius=math.inf)
    length = float(np.min(_frobenius(_reference_xi(W, G, reference_state, unit))))
    if not precision.is_float64:
        # from a fresh state, where xi = -lr g / (sqrt(v^) + eps) is tangent (the projection was probed
        # before): a held m that is not tangent (a transport mistake) would bend the inverse's reading
        # of a correct polar retraction and be blamed on it
        fresh = (np.zeros_like(W), np.zeros(W.shape[:-2]), 0)
        first = _config(unit, eps=0.0)
        length = float(np.min(_frobenius(_reference_xi(W, G, fresh, first))))
        return _proportional_steps(variant, W, G, variant.init(W), fresh, first, length, precision, (0.0, 0.0))
    tiny = _recovered(W, variant.step(W, G, state, _config(unit, lr=TINY_STEP / length))[0])
    direction = tiny / _frobenius(tiny)[..., None, None]
    W1 = np.asarray(variant.step(W, G, state, _config(unit, lr=MODERATE_STEP / length))[0], dtype=np.float64)
    frames = [(W, direction, W1)] if W.ndim == 2 else list(zip(W.reshape(-1, *W.shape[-2:]), direction.reshape(-1, *W.shape[-2:]),
                                                                   W1.reshape(-1, *W.shape[-2:])))
    misfit = max(_fit(RETRACTIONS["polar"], w, u, w1) for w, u, w1 in frames)
    finding = _finding("retraction", f"a step of length {MODERATE_STEP} without cap: polar(W + a u) along its own direction",
                       f"relative misfit {misfit:.3g}", not misfit <= FIT_TOLERANCE)
    return finding, 0.0


def _proportional_steps(variant, W, G, state, reference_state, unit, length, precision, carried) -> tuple[dict, float]:
    """The retraction below float64: xi_1, xi_2 recovered from steps at lr and 2 lr (lengths a and 2a,
    a = MODERATE_STEP) must satisfy xi_2 = 2 xi_1 (the step's xi is linear in lr); each is read to
    e_k = its inverse's error bound + its sensitivity times the step's rounding bound rho(a_k), so
    ||xi_2 / 2 - xi_1|| <= e_1 + e_2 / 2 for polar. Another retraction reads xi_k = a_k u + a_k^2 q +
    O(a^3) and leaves a^2 q, its second-order term at length a: beyond the tolerance it differs, and
    within it a retraction may differ from polar by that much at length a (the slack returned)."""
    rho = _rounding(precision, W, G, reference_state, lambda s: _config(unit, lr=s / length), carried)
    recovered, errors = [], []
    for multiple in (1.0, 2.0):
        W1 = np.asarray(variant.step(W, G, state, _config(unit, lr=multiple * MODERATE_STEP / length))[0], dtype=np.float64)
        inverse = inverse_polar_retraction(W, W1)
        recovered.append(inverse.xi)
        errors.append(inverse.error_bound + inverse.sensitivity * rho(multiple * MODERATE_STEP))
    with np.errstate(invalid="ignore", over="ignore"):
        misfit = _frobenius(recovered[1] / 2 - recovered[0])
        allowed = errors[0] + errors[1] / 2
    decided = np.isfinite(allowed) & np.isfinite(misfit)
    if not np.any(decided):
        return _finding("retraction", "steps of lengths a and 2a recovered by the inverse polar retraction: xi_2 = 2 xi_1",
                        "not decided: no frame's steps are within the inverse retraction's domain", False), math.inf
    worst = int(np.argmax(np.where(decided, misfit / allowed, -np.inf).ravel()))
    found, bound = float(np.ravel(misfit)[worst]), float(np.ravel(allowed)[worst])
    finding = _finding("retraction", f"steps of lengths {MODERATE_STEP} and {2 * MODERATE_STEP} without cap, recovered by the "
                       "inverse polar retraction: xi_2 = 2 xi_1",
                       f"||xi_2 / 2 - xi_1|| = {found:.3g} vs bound {bound:.3g} at {precision.storage}", not found <= bound)
    return finding, float(np.max(np.where(decided, allowed, 0.0)))


def _step_residual(variant, at: dict, config, white: bool) -> tuple[float, float]:
    """(worst residual, its bound) of the failing step replayed at `config` against the model, by the
    trajectory check's own rule at the implementation's precision (kit.trajectories.compare_step)."""
    W, G = np.asarray(at["W"]), np.asarray(at["G"])
    W1, state1 = variant.step(W, G, at["state"], config)
    compared = compare_step(white, W, G, at["reference_state"], W1, state1, config, precisions.of(variant),
                            (0.0, 0.0) if white else at["carried"])
    residual, bound = np.ravel(compared.residual["W"]), np.ravel(np.broadcast_to(compared.bound["W"], np.shape(compared.residual["W"])))
    index = int(np.argmax(residual / bound))
    return float(residual[index]), float(bound[index])


def full_step_findings(variant, at: dict, config, white: bool, slack: float = 0.0) -> list[dict]:
    """The failing step itself, from the held state, with eps = 0 and no cap, then the step's eps and
    no cap, then the step's own config: the first of these to leave the model names stage 5, 6 or 7
    (stages 1-4 and 8 having passed their probes). slack: how far a retraction within the fit's
    tolerance may be from polar on a step of length MODERATE_STEP (retraction_finding); two
    retractions of the same first order differ at second order, so on the failing step, whose frame
    moves by a, by slack (a / MODERATE_STEP)^2 to leading order, which a step must exceed besides its
    bound before a stage is named."""
    length = float(np.max(_frobenius(np.asarray(at["W_new"], dtype=np.float64) - np.asarray(at["W"], dtype=np.float64)))) if "W_new" in at else MODERATE_STEP
    allowed = slack * (length / MODERATE_STEP) ** 2
    ladder = (("bias correction" if white else "moments, bias correction or transport", dict(eps=0.0, trust_radius=math.inf), "eps = 0, no cap"),
              ("direction", dict(trust_radius=math.inf), f"eps = {config.eps:g}, no cap"),
              ("cap", {}, f"eps = {config.eps:g}, Delta = {config.trust_radius:g}"))
    findings = []
    for stage, change, what in ladder:
        residual, bound = _step_residual(variant, at, _config(config, **change), white)
        margin = f" + {allowed:.3g} (a retraction within the fit's tolerance)" if allowed else ""
        findings.append(_finding(stage, f"the failing step from the held state ({what}) against the model within its one-step bound",
                                 f"||W+ - W+_model|| = {residual:.3g} vs bound {bound:.3g}{margin}", not residual <= bound + allowed))
    return findings


def _guarded(run) -> list[dict]:
    """A probe whose step raises is itself a finding (not a stage)."""
    try:
        found = run()
        return found if isinstance(found, list) else [found]
    except Exception as error:  # the implementation's own error is the measurement
        return [{"stage": None, "test": getattr(run, "__name__", "probe"), "measured": f"the step raised: {error}", "differs": False}]


def _probes(variant, case, at: dict) -> list:
    """The findings in the order of the stages they decide (module docstring)."""
    W, G, state, reference = np.asarray(at["W"]), np.asarray(at["G"]), at["state"], at["reference_state"]
    config = case.config()
    white = observability.state_observable(variant)
    carried = (0.0, 0.0) if white else at.get("carried", (0.0, 0.0))
    stored, transport = [], None
    if white and "state_new" in at:
        stored, transport = state_findings(W, G, state, at["W_new"], at["state_new"], config, precisions.of(variant))
    if W.shape[-2] * W.shape[-1] == 1:  # St(1, 1) = {-1, 1}: no tangent direction to probe
        return stored + ([transport] if transport is not None else [])
    fresh = _guarded(lambda: fresh_findings(variant, W, G, config, case.seed, white))
    # the fresh direction decides stages 1-2 before the stored moments, which a wrong g also moves
    ordered = fresh[:1] + stored + fresh[1:]
    if reference[2] > 0:
        ordered += _guarded(lambda: history_findings(variant, W, G, state, reference, config, white, carried))
    slack = [0.0]

    def fitted():
        finding, slack[0] = retraction_finding(variant, W, G, state, reference, config, carried)
        return finding

    retraction = _guarded(fitted)
    if not any(finding["differs"] for finding in retraction):  # the full steps below take the retraction as polar, up to its slack
        ordered += _guarded(lambda: full_step_findings(variant, at, config, white, slack[0]))
    return ordered + retraction + ([transport] if transport is not None else [])


def locate(variant, case, outcome) -> dict:
    """{"stage": the first stage that differs (None: none found), "stage_number", "finding", "evidence"}
    at the outcome's first failing step (module docstring)."""
    at = outcome.at_failure
    if at is None:
        return {"stage": None, "stage_number": None, "finding": "no step failed", "evidence": []}
    if outcome.error is not None:
        return {"stage": None, "stage_number": None, "finding": outcome.error, "evidence": []}
    evidence = _probes(variant, case, at)
    first = next((f for f in evidence if f["differs"] and f["stage"]), None)
    if first is None:
        precision = precisions.of(variant)
        where = "" if precision.is_float64 else f" beyond what the analysis of {precision.storage} rounding allows each probe"
        return {"stage": None, "stage_number": None, "evidence": evidence,
                "finding": f"no stage probe differs{where} at this step: the step differs only in combination"}
    return {"stage": first["stage"], "stage_number": STAGE_NUMBERS[first["stage"]], "evidence": evidence,
            "finding": f"{first['test']}: {first['measured']}"}
