"""Minimal counterexamples: the smallest case that still fails a certificate's failing check.

A claim that fails on an implementation says which check failed and on which draw (the worst case);
this module turns that into a case a person can debug. Only the trajectory checks are replayed here
(trajectory_model_W, _m, _v, _bookkeeping of propositions/kit/trajectories.py, run by every claim
P1..P5 on the optimizer under test): each compares one step of the implementation with the model
at the implementation's own input, so a case is small, cheap and needs nothing of the claim but its
parameters. The check is the same, by the same code: kit.trajectories.compare_step, the model of
docs/algorithm.md and the implementation's one-step bound at its own precision (kit/precision.py)
plus the model's, the carried bound of a black box, a well-posed step failing when its residual
exceeds its bound.

A case is the claim's own parameters (`Case`): the shape (d, r), a batch of frames or a bare frame,
the number of steps, a fresh or a warm start, the kind and power-of-ten scale of the gradients, the
hyper-parameters (step length lr sqrt(d r), betas, eps, trust radius, weight decay) and the seed
from which W_0, the warm state and the gradients are drawn (numpy SeedSequence, via rng_for).

The search (`shrink`) is deterministic: it starts from the failing draw's setting (then from the
claim's other settings and shapes, in their declared order, where that draw does not fail here)
and repeatedly takes the first simpler case, in a fixed order, that still fails the same check,
until no simpler case fails; "simpler" is an order on the parameters (fewer entries d r first, then
fewer steps, a smaller batch, a smaller d, more hyper-parameters at their plain values, a smaller
seed). The result records the parameters, the inputs that replay it (W_0, the warm state, the
gradients the implementation saw), the residual and the bound at the first failing step, and the
first stage of docs/algorithm.md that differs (certify.ci.stages).
"""

from __future__ import annotations

import math
import time
from dataclasses import asdict, dataclass, replace

import numpy as np

import reference_impl as ri
from propositions._common import rng_for
from propositions.kit import observability
from propositions import trajectory_plans
from propositions.kit import precision as precisions
from propositions.kit.trajectories import MIN_STEPS, checked_step, compare_step, trajectory_gradient, state_shapes_fit, warm_state

QUANTITIES = ("W", "m", "v", "bookkeeping")
CHECK_PREFIX = "trajectory_model_"
GRADIENT_KINDS = ("gaussian", "normal", "zero")
PLAIN = {"eps": 0.0, "weight_decay": 0.0, "trust_radius": math.inf, "betas": (0.9, 0.999), "scale_exponent": 0}
MAX_REPLAYS = 600  # the search's budget; each replay is a few small steps
WIDE_EXPONENT = 20  # a "wide" setting (10^U(-30, 30)) starts from gradients of scale 10^20


def wide_exponent(variant) -> int:
    """The largest power of ten of gradient scale a case draws for `variant`: WIDE_EXPONENT, or fewer
    decades where its storage dtype's range holds fewer (kit/precision.Precision.scale_decades: 13 in
    float32 and bfloat16), as the claims' own draws do."""
    return min(WIDE_EXPONENT, precisions.of(variant).scale_decades)


@dataclass(frozen=True)
class Case:
    """One replayable draw of a trajectory check. batch 0: a bare (d, r) frame, else (batch, d, r)."""

    claim: str
    quantity: str  # W, m, v or bookkeeping: the check trajectory_model_<quantity>
    d: int
    r: int
    batch: int
    steps: int
    start: str
    gradients: str
    scale_exponent: int
    step_length: float
    betas: tuple
    eps: float
    trust_radius: float
    weight_decay: float
    seed: int

    @property
    def lead(self) -> tuple:
        return () if self.batch == 0 else (self.batch,)

    def config(self) -> ri.StiefelAdamConfig:
        return ri.StiefelAdamConfig(lr=self.step_length / math.sqrt(self.d * self.r), betas=tuple(self.betas), eps=self.eps,
                                    trust_radius=self.trust_radius, weight_decay=self.weight_decay)

    def plain_count(self) -> int:
        """How many of the hyper-parameters and the gradients are at their plain values."""
        plain = sum(getattr(self, name) == value for name, value in PLAIN.items())
        return plain + (self.start == "fresh") + (self.gradients == "gaussian")

    def order(self) -> tuple:
        """Smaller is simpler (the module docstring)."""
        return (self.d * self.r, self.steps, self.batch, self.d, -self.plain_count(), self.seed)


@dataclass
class Outcome:
    """A replay: the first failing step (None: none failed), its residual and bound (the worst frame),
    and what a stage replay needs of that step (inputs, the implementation's state before it)."""

    step: int | None
    residual: float
    bound: float
    error: str | None
    inputs: dict
    at_failure: dict | None = None

    @property
    def fails(self) -> bool:
        return self.step is not None


def _draw(case: Case):
    """(W_0, the warm state or None, gradient(k, W) -> G_k+1) from the case's seed."""
    rng = rng_for(case.seed, "counterexample", case.d, case.r, case.batch)
    W = ri.random_point(case.d, case.r, rng, case.lead)
    scales = np.full(case.lead, 10.0 ** case.scale_exponent)
    warm = warm_state(W, scales, rng) if case.start == "warm" else None
    return W, warm, lambda k, W_k: trajectory_gradient(case.gradients, W_k, scales, rng)


def replay(variant, case: Case) -> Outcome:
    """Run the case on `variant` (a reference_impl Variant, adapted or not) against the model, at the
    variant's own precision (kit/precision.py), as `certify run` holds it."""
    W, warm, gradient = _draw(case)
    if warm is not None and not observability.state_observable(variant):
        raise ValueError("a warm start hands the optimizer a state built by the checker; a black box takes only its own")
    return replay_inputs(variant, case.quantity, W, warm, gradient, case.config(), case.steps)


def _watched(white: bool, W, G, state):
    return (W, G, state.m, state.v) if white else (W, G)


def replay_inputs(variant, quantity: str, W, warm, gradients, config, steps: int) -> Outcome:
    """The replay of given inputs: W_0, a warm state (or None: the variant's init), the gradients
    (a list, or gradient(k, W_k)) and the config; the check trajectory_model_<quantity>, by the rule
    of the claims' own trajectories (kit.trajectories.compare_step) at the variant's precision."""
    white = observability.state_observable(variant)
    precision = precisions.of(variant)
    if quantity not in QUANTITIES or (not white and quantity != "W"):
        raise ValueError(f"no replayable check trajectory_model_{quantity} for {'a white' if white else 'a black'} box")
    state = variant.init(W) if warm is None else warm
    model_state = (np.zeros_like(W), np.zeros(W.shape[:-2]), 0)
    carried = (np.zeros(W.shape[:-2]), np.zeros(W.shape[:-2]))
    inputs = {"W0": np.array(W), "state0": warm, "gradients": [], "config": config}
    if white and warm is None and quantity == "bookkeeping" and not _fresh(state, W):
        return Outcome(0, math.inf, 0.5, "init returned a state that is not m = 0, v = 0, t = 0", inputs)
    worst = (0.0, 1.0)
    for k in range(steps):
        G = gradients[k] if isinstance(gradients, (list, tuple)) else gradients(k, W)
        inputs["gradients"].append(np.array(G))
        W_new, state_new, error = checked_step(variant, W, G, state, config, k, watched=_watched(white, W, G, state))
        if error is None and white and not state_shapes_fit(state_new, W):
            error = f"step {k + 1} returned a state of the wrong shape"
        before = {"W": W, "G": G, "state": state, "reference_state": _reference_state(white, state, model_state), "carried": carried}
        if error is not None:
            return Outcome(k + 1, math.inf, 1.0, error, inputs, before)
        residual, bound, model, carried = _compare(white, quantity, W, G, W_new, state_new, before, config, precision)
        ratio = _worst_ratio(residual, bound)
        if ratio[0] > ratio[1]:
            return Outcome(k + 1, ratio[0], ratio[1], None, inputs, {**before, "W_new": W_new, "state_new": state_new})
        worst = max(worst, ratio, key=lambda pair: pair[0] / pair[1])
        W, state, model_state = np.asarray(W_new), state_new, (model.m, model.v, model.t)
    return Outcome(None, worst[0], worst[1], None, inputs)


def _fresh(state, W) -> bool:
    try:
        return np.shape(state.m) == W.shape and not np.any(state.m) and not np.any(state.v) and state.t == 0
    except AttributeError:
        return False


def _reference_state(white: bool, state, model_state):
    """The state the model is fed: the optimizer's own (white box) or the model's run (black box)."""
    return (state.m, np.asarray(state.v, dtype=np.float64), int(state.t)) if white else model_state


def _frobenius(X):
    return np.sqrt(np.sum(X * X, axis=(-2, -1)))


def _compare(white, quantity, W, G, W_new, state_new, before, config, precision):
    """(residuals, bounds, the model's step, the carried state error) of one step: the rule of the
    claims' trajectories (kit.trajectories.compare_step), the bookkeeping an exact count."""
    compared = compare_step(white, W, G, before["reference_state"], W_new, state_new, config, precision, before["carried"])
    model = compared.model
    if quantity == "bookkeeping":
        residual = np.full(W.shape[:-2], float(abs(int(state_new.t) - model.t)))
        return residual, np.full(np.shape(residual), 0.5), model, compared.carried
    residual = compared.residual[quantity]
    return residual, np.broadcast_to(compared.bound[quantity], np.shape(residual)), model, compared.carried


def _worst_ratio(residual, bound) -> tuple[float, float]:
    residual = np.where(np.isnan(residual), np.inf, np.ravel(residual))
    bound = np.ravel(bound)
    index = int(np.argmax(residual / bound))
    return float(residual[index]), float(bound[index])


# --------------------------------------------------------------------------------------------
# The search
# --------------------------------------------------------------------------------------------


def failing_quantity(certificate: dict) -> str | None:
    """The quantity of the certificate's first failing trajectory_model_ check, or None."""
    for check in certificate.get("numerical", {}).get("checks", []):
        name = str(check.get("name", ""))
        if not check.get("passed", True) and name.startswith(CHECK_PREFIX):
            quantity = name[len(CHECK_PREFIX):].split("[")[0]
            if quantity in QUANTITIES:
                return quantity
    return None


def first_failing_check(certificate: dict) -> str | None:
    for check in certificate.get("numerical", {}).get("checks", []):
        if not check.get("passed", True):
            return str(check.get("name"))
    return None


def _case_from_setting(claim: str, quantity: str, setting, d: int, r: int, batch: int, seed: int, limit: int = WIDE_EXPONENT) -> Case:
    exponent = limit if setting.gradients == "wide" else 0
    kind = "gaussian" if setting.gradients == "wide" else setting.gradients
    return Case(claim, quantity, d, r, batch, MIN_STEPS, setting.start, kind, exponent, setting.step_length,
                tuple(setting.betas), setting.eps, setting.trust_radius, setting.weight_decay, seed)


def starting_cases(claim: str, quantity: str, worst: dict | None, seed: int, white: bool, limit: int = WIDE_EXPONENT):
    """The failing draw's setting and shape first, then every setting and shape of the claim, each
    with a batch of two frames and a bare frame (a black box: fresh starts only)."""
    plan = trajectory_plans()[claim]
    settings, shapes = plan.settings, plan.shapes
    ordered = sorted(settings, key=lambda s: s.name != (worst or {}).get("setting"))
    first = tuple((worst or {}).get("shape") or ())
    for setting in ordered:
        if setting.start == "warm" and not white:
            continue
        for d, r in sorted(shapes, key=lambda shape: tuple(shape) != first):
            for batch in (2, 0):
                yield _case_from_setting(claim, quantity, setting, d, r, batch, seed, limit)


def _simpler(case: Case):
    """Candidate simplifications of a failing case, most wanted first."""
    for d in range(1, case.d + 1):
        for r in range(1, d + 1):
            if (d * r, d) < (case.d * case.r, case.d):
                yield replace(case, d=d, r=r)
    for steps in range(1, case.steps):
        yield replace(case, steps=steps)
    for batch in range(case.batch):
        yield replace(case, batch=batch)
    if case.start != "fresh":
        yield replace(case, start="fresh")
    if case.gradients != "gaussian":
        yield replace(case, gradients="gaussian")
    for name, value in PLAIN.items():
        yield replace(case, **{name: value})
    if case.scale_exponent:
        yield replace(case, scale_exponent=int(case.scale_exponent / 2))
    for seed in range(min(case.seed, 4)):
        yield replace(case, seed=seed)


class _Search:
    """Replays with a budget; a case that raises (bad parameters for this implementation) does not fail."""

    def __init__(self, variant):
        self.variant, self.replays = variant, 0

    def outcome(self, case: Case) -> Outcome | None:
        if self.replays >= MAX_REPLAYS:
            return None
        self.replays += 1
        try:
            found = replay(self.variant, case)
        except ValueError:
            return None
        return found if found.fails else None


def shrink(variant, start: Case, search: _Search | None = None) -> tuple[Case, Outcome] | None:
    """The simplest case reachable from `start` that still fails (None when `start` does not)."""
    search = search or _Search(variant)
    outcome = search.outcome(start)
    if outcome is None:
        return None
    case = replace(start, steps=max(outcome.step, 1))
    improved = True
    while improved:
        improved = False
        for candidate in _simpler(case):
            if candidate.order() >= case.order():
                continue
            found = search.outcome(candidate)
            if found is not None:
                case, outcome, improved = replace(candidate, steps=max(found.step, 1)), found, True
                break
    return case, replay(variant, case)


def minimal_counterexample(variant, certificate: dict) -> dict | None:
    """The record of the minimal counterexample of a failing certificate (None: nothing to shrink)."""
    quantity = failing_quantity(certificate)
    if certificate.get("id") not in trajectory_plans():
        return None
    if quantity is None:
        return {"found": False, "check": first_failing_check(certificate),
                "reason": "no trajectory check failed: the failing checks have no replayable small case (see the certificate's worst case)"}
    started = time.perf_counter()
    white = observability.state_observable(variant)
    check = next(c for c in certificate["numerical"]["checks"] if str(c.get("name", "")).startswith(CHECK_PREFIX + quantity))
    seed = int(certificate.get("provenance", {}).get("seed", 0))
    search = _Search(variant)
    found = None
    for start in starting_cases(certificate["id"], quantity if white else "W", check.get("worst_case"), seed, white, wide_exponent(variant)):
        found = shrink(variant, start, search)
        if found is not None or search.replays >= MAX_REPLAYS:
            break
    if found is None:
        return {"found": False, "check": check.get("name"), "replays": search.replays,
                "reason": f"no case of {certificate['id']}'s trajectory settings failed {check.get('name')} in {search.replays} replays",
                "timings": {"shrink_s": time.perf_counter() - started}}
    from certify.ci import stages

    case, outcome = found
    located = stages.locate(variant, case, outcome)
    return record(case, outcome, located, check.get("name"), first_failing_check(certificate), search.replays,
                  time.perf_counter() - started)


# --------------------------------------------------------------------------------------------
# The record and its text
# --------------------------------------------------------------------------------------------


def _state_record(state) -> dict | None:
    if state is None:
        return None
    return {"m": np.asarray(state.m).tolist(), "v": np.asarray(state.v).tolist(), "t": int(state.t)}


def _parameters(case: Case) -> dict:
    return {**{k: v for k, v in asdict(case).items() if k not in ("claim", "quantity")}, "betas": list(case.betas),
            "lr": case.config().lr}


def record(case: Case, outcome: Outcome, located: dict, check_name, first_failing, replays: int, seconds: float) -> dict:
    """The certificate's record of a minimal counterexample (JSON-able but for non-finite floats)."""
    config = outcome.inputs["config"]
    found = {
        "found": True,
        "claim": case.claim,
        "check": check_name,
        "replayed_check": CHECK_PREFIX + case.quantity,
        "first_failing_check": first_failing,
        "parameters": _parameters(case),
        "first_diverging_step": outcome.step,
        "residual": outcome.residual,
        "bound": outcome.bound,
        "error": outcome.error,
        "stage": located["stage"],
        "stage_number": located["stage_number"],
        "stage_finding": located["finding"],
        "stage_evidence": located["evidence"],
        "replay": {
            "quantity": case.quantity,
            "W0": outcome.inputs["W0"].tolist(),
            "state0": _state_record(outcome.inputs["state0"]),
            "gradients": [G.tolist() for G in outcome.inputs["gradients"]],
            "config": {"lr": config.lr, "betas": list(config.betas), "eps": config.eps, "trust_radius": config.trust_radius,
                       "weight_decay": config.weight_decay},
        },
        "replays": replays,
        "timings": {"shrink_s": seconds},
    }
    found["summary"] = summary_line(found)
    return found


def _number(value) -> str:
    value = float(value)
    return "inf" if math.isinf(value) else f"{value:.3g}"


def summary_line(found: dict) -> str:
    """"P1 trajectory_model_W fails at d=2, r=1, a bare frame, 2 steps (...): step 2, residual ..., bound ..."."""
    p = found["parameters"]
    frames = "a bare frame" if p["batch"] == 0 else f"a batch of {p['batch']}"
    steps = "one step" if p["steps"] == 1 else f"{p['steps']} steps"
    setting = (f"{p['start']} start, {p['gradients']} G x 1e{p['scale_exponent']}, lr={_number(p['lr'])}, betas=({_number(p['betas'][0])}, "
               f"{_number(p['betas'][1])}), eps={_number(p['eps'])}, Delta={_number(p['trust_radius'])}, lambda={_number(p['weight_decay'])}, seed {p['seed']}")
    outcome = found["error"] or f"residual {_number(found['residual'])}, bound {_number(found['bound'])}"
    stage = f"; first stage that differs: {found['stage']} ({found['stage_number']})" if found["stage"] else (
        "" if found["error"] else "; no single stage differs")
    return (f"{found['claim']} {found['replayed_check']} fails at d={p['d']}, r={p['r']}, {frames}, {steps} ({setting}): "
            f"first diverging step {found['first_diverging_step']}, {outcome}{stage}")


def counterexamples_of(certificate: dict) -> list[dict]:
    """Every counterexample a certificate records: extra["counterexample"] (an outside implementation's
    trajectory case) and extra["counterexample_<dtype>"] (the optimizer claim's shrunk scenario runs)."""
    extra = certificate.get("extra", {}) or {}
    return [extra[key] for key in sorted(extra) if (key == "counterexample" or key.startswith("counterexample_")) and extra[key]]


def block(found: dict) -> list[str]:
    """The counterexample as a few lines for the terminal and REPORT.md."""
    if not found.get("found"):
        return [f"no minimal counterexample: {found.get('reason')}"]
    if found["replay"].get("quantity") == "scenario":  # a shrunk run of the optimizer class
        lines = [found["summary"]]
        worst = found.get("worst") or {}
        if worst:
            lines.append("  at " + ", ".join(f"{key} {worst[key]}" for key in ("op", "parameter", "frame", "raised", "residual", "bound")
                                             if worst.get(key) is not None))
        lines.append(f"  ({found['replays']} replays, {'minimal' if found.get('minimal') else 'the search budget ran out'})")
        return lines
    k, gradients = found["first_diverging_step"], found["replay"]["gradients"]
    lines = [found["summary"]]
    if 1 <= k <= len(gradients):
        G = np.asarray(gradients[k - 1], dtype=np.float64)
        lines.append(f"  G_{k} = " + np.array2string(G, precision=4, separator=", ", max_line_width=1000).replace("\n", ""))
    if found.get("stage_finding"):
        lines.append(f"  {found['stage_finding']}")
    if found.get("first_failing_check") and found["first_failing_check"] != found["check"]:
        lines.append(f"  (first failing check of the certificate: {found['first_failing_check']})")
    return lines
