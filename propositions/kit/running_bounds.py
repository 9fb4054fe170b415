"""Running rounding bounds of whole float64 StiefelAdam trajectories, and the trajectory plumbing
that the claims comparing two trajectories share (P2 scales the gradients, P4 rotates the inputs).

`record_trajectory` runs the reference and records the norms that `trajectory_rounding_bound`
needs; `optimizer_trajectory` runs the optimizer under test; the bound is a first-order recursion over
the steps, each step bounded by the one analysis of the step (kit/step_analysis.step_error), so
two trajectories that agree in exact arithmetic are compared against the sum of their two bounds.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np

from reference_impl import adam
from reference_impl.adam import StiefelAdamConfig, frobenius
from reference_impl.controls import get_variant
from reference_impl.manifold import project_tangent

from .common import NumericalCheck, batch_chunks, chunk_sizes, u
from . import precision as precisions
from .bounds import gram
from .step_analysis import InputErrors, Rounding, StepNorms, step_error, step_error_text

# The largest frames (up to (1024, 128)) run in the main trajectory check; the other checks use
# frames up to (128, 16), which keeps one run inside its time budget.
MEDIUM_SHAPES = ((32, 8), (64, 16), (64, 64), (128, 16))

CHUNK_ENTRIES = 2**18


# --------------------------------------------------------------------------------------------
# Error analysis
# --------------------------------------------------------------------------------------------


TRAJECTORY_BOUND_TEXT = (
    "trajectory_rounding_bound (propositions/kit/running_bounds.py), the running bound on a float64 trajectory's "
    "distance to the exact one: each step's bound from the one analysis of the step, its input errors (W_err, "
    "the moments') the previous step's bounds, u_c = 2^-53, the SVD route, sigma_min = 1 and sigma_max = "
    "sqrt(1 + ||xi||^2) for the exact W + xi (P3(b)); " + step_error_text("W")
)


def exact_step_norms(norms: dict, t: int, r: int, trust_radius: float, scale=1.0) -> StepNorms:
    """The StepNorms of step t (0-based) of a recorded float64 run (`record_trajectory`), for the run
    whose gradients are scaled by `scale` (its exact m scales by c, v by c^2, W and xi do not).

    The incoming moments are bounded by the previous step's: ||P_W(m)|| <= ||m|| (a projector) and
    v_in = v_{t-1}; both 0 at the first step of a fresh run. The exact W + xi has sigma_min = 1 and
    sigma_max = sqrt(1 + ||xi||^2), ||W + xi||_F^2 = r + ||xi||^2 (xi tangent at an exact frame, P3(b))."""
    G, g, m, v, xi_raw = (norms[key][t] for key in ("G_norm", "g_norm", "m_norm", "v", "xi_norm"))
    m_in = norms["m_norm"][t - 1] if t > 0 else np.zeros_like(m)
    v_in = norms["v"][t - 1] if t > 0 else np.zeros_like(v)
    xi = np.minimum(xi_raw, trust_radius)
    c = np.asarray(scale, dtype=np.float64)
    return StepNorms(G=c * G, W=math.sqrt(r), g=c * g, m_in=c * m_in, v_in=c * c * v_in, m=c * m, v=c * c * v,
                     xi_raw=xi_raw, xi=xi, A=np.sqrt(r + xi**2), sigma_min=1.0, sigma_max=np.sqrt(1.0 + xi**2), t=t + 1)


def trajectory_rounding_bound(norms: dict, d: int, r: int, config: StiefelAdamConfig, *, scale=1.0,
                              input_relative_error=0.0, initial_distance=0.0,
                              precision: precisions.Precision = precisions.FLOAT64, rounding: Rounding | None = None) -> dict:
    """Running first-order bound on the distance of a float64 StiefelAdam trajectory to the exact one.

    norms: from `record_trajectory` (arrays of shape (T, n) from the float64 run with scale 1):
    G_norm ||G_t||, g_norm ||g_t||, m_norm ||m_t|| before transport, v, v_hat, xi_norm ||xi_t||
    before the trust region. scale: the c > 0 multiplying the gradients of the run bounded here (its
    exact trajectory has the same W_t, m_t scaled by c, v_t by c^2; norms scale alike, except the
    unscaled decay term lambda W); a scalar or one per frame (n,). input_relative_error (scalar or
    (n,)): relative error of the gradient as handed to the step (u for fl(c G); gamma_d sqrt(d) for
    a matmul Q G). initial_distance: ||W_0 - W_0*|| (n,) or scalar, the distance of the float64
    start to the exact frame.

    Returns {"W": (T, n) bound on ||W_t - W_t*||_F, "m": (T, n) bound on ||m_t - m_t*|| / scale,
    "v": (T, n) bound on |v_t - v_t*| / scale^2}.

    Each step is bounded by step_analysis.step_error (the one analysis of the step) with u_c = 2^-53,
    the SVD route, the exact step's quantities (`exact_step_norms`) and as input errors the previous
    step's bounds: a on W, b_m on m, b_v on v (and the gradient's input_relative_error):
    a+ = E_W, b_m+ = E_m+, b_v+ = E_v. The amplification per step is about 1 + 4 min(||xi||, Delta)
    ||G|| / ||m^|| (how much a tilt of W tilts the next direction): modest for the step lengths
    used, but it compounds over T steps, and the bound says so. Once a reaches 1/2, or a step is not
    well posed at its input errors (q or sigma_min not above its error), the bound is infinite
    (vacuous) from there on, never a finite number that could be mistaken for a certificate.

    precision (kit/precision.py): the trajectory of an implementation storing in float32 or bfloat16
    is bounded at its unit roundoffs (precision.rounding: u_c, u_W = u_s, its declared route), its
    gradients rounded to storage (u_s more relative input error), its start W_0 too (u_s sqrt(r) more
    initial distance); the moments it stores are rounded in its compute dtype, which u_c covers.
    rounding: another evaluation's unit roundoffs and route (the mpmath twin's, replay_pair), in place
    of float64's.
    """
    steps, count = norms["G_norm"].shape
    a = np.broadcast_to(np.asarray(initial_distance, dtype=np.float64), (count,)).copy()
    b_m = np.zeros(count)
    b_v = np.zeros(count)
    scale = np.asarray(scale, dtype=np.float64)
    bounds = {"W": np.zeros((steps, count)), "m": np.zeros((steps, count)), "v": np.zeros((steps, count))}
    if rounding is None and not precision.is_float64:
        rounding = precision.rounding(config.trust_radius, d, r)
        input_relative_error = input_relative_error + precision.u_s
        a = a + precision.u_s * math.sqrt(r)
    rounding = Rounding(u_c=u, route="svd") if rounding is None else rounding
    with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
        for t in range(steps):
            q = exact_step_norms(norms, t, r, config.trust_radius, scale)
            inside = a < 0.5
            error = step_error(d, r, config, q, rounding,
                               InputErrors(W=np.where(inside, a, 0.0), G_rel=input_relative_error, m=b_m, v=b_v))
            valid = inside & error.well_posed
            a = np.where(valid, error.W, np.inf)
            b_m = np.where(valid, error.m_plus, np.inf)
            b_v = np.where(valid, error.v, np.inf)
            bounds["W"][t], bounds["m"][t], bounds["v"][t] = a, b_m / scale, b_v / scale**2
    return bounds


# A float32 or bfloat16 implementation's trajectories (kit/precision.py): the running bound compounds
# each step's amplification (5 to 10 a step on these frames), and at float32's unit roundoffs it passes
# 2 sqrt(r) (vacuous) within 4 steps on the (64, 64), (256, 32) and (1024, 128) frames and within 8 on
# (64, 16) and (128, 16). Such an implementation runs LOW_PRECISION_STEPS steps on LOW_PRECISION_SHAPES
# (and the small shapes); a frame whose bound is vacuous still makes its claim inconclusive.
LOW_PRECISION_STEPS = 4
LOW_PRECISION_SHAPES = ((32, 8), (64, 16), (128, 16))


def low_precision_plan(profile, large, precision):
    """(profile, large shapes) for the optimizer's precision: unchanged in float64, else at most
    LOW_PRECISION_STEPS steps and the large shapes replaced by LOW_PRECISION_SHAPES (the controls' () kept)."""
    if precision.is_float64:
        return profile, large
    return (dataclasses.replace(profile, steps=min(profile.steps, LOW_PRECISION_STEPS)),
            LOW_PRECISION_SHAPES if large else large)


def _stepper(optimizer: str):
    if optimizer == "stiefel_adam":
        return adam.init, adam._step
    variant = get_variant(optimizer)
    return variant.init, variant.step


def optimizer_trajectory(optimizer: str, W0: np.ndarray, gradients: np.ndarray, config: StiefelAdamConfig):
    """W_t for t = 1..T, shape (T, n, d, r), and the final states' list, for gradients (T, n, d, r)."""
    init, step = _stepper(optimizer)
    W, state = W0, init(W0)
    frames, states = [], []
    with np.errstate(all="ignore"):
        for G in gradients:
            W, state = step(W, G, state, config)
            frames.append(W)
            states.append(state)
    return np.stack(frames), states


def record_trajectory(W0: np.ndarray, gradients: np.ndarray, config: StiefelAdamConfig):
    """The real float64 trajectory and the norms that `trajectory_rounding_bound` needs.

    W0: (n, d, r); gradients: (T, n, d, r). Returns (W (T, n, d, r), states, norms) with norms a
    dict of (T, n) arrays: G_norm, g_norm, m_norm (before transport), v, v_hat, xi_norm (before
    the trust region). The norms are recomputed from the stages of docs/algorithm.md.
    """
    beta1, beta2 = config.betas
    W, state = W0, adam.init(W0)
    frames, states = [], []
    norms = {key: [] for key in ("G_norm", "g_norm", "m_norm", "v", "v_hat", "xi_norm")}
    for t, G in enumerate(gradients, start=1):
        g = project_tangent(W, G + config.weight_decay * W, validate=False)
        m_norm = frobenius(beta1 * state.m + (1 - beta1) * g)
        W, state = adam._step(W, G, state, config)
        v_hat = state.v / (1 - beta2**t)
        with np.errstate(divide="ignore", invalid="ignore"):
            xi_norm = np.where(v_hat > 0, config.lr * m_norm / (1 - beta1**t) / (np.sqrt(v_hat) + config.eps), 0.0)
        for key, value in (("G_norm", frobenius(G)), ("g_norm", frobenius(g)), ("m_norm", m_norm),
                           ("v", state.v), ("v_hat", v_hat), ("xi_norm", xi_norm)):
            norms[key].append(value)
        frames.append(W)
        states.append(state)
    return np.stack(frames), states, {key: np.stack(value) for key, value in norms.items()}


def frame_distance(A: np.ndarray, B: np.ndarray) -> np.ndarray:
    """||A - B||_F over the last two axes; NaN where either is not finite."""
    with np.errstate(invalid="ignore", over="ignore"):
        diff = np.sqrt(np.sum((A - B) ** 2, axis=(-2, -1)))
    finite = np.all(np.isfinite(A), axis=(-2, -1)) & np.all(np.isfinite(B), axis=(-2, -1))
    return np.where(finite, diff, np.nan)


def informative_steps(bound: np.ndarray, r: int) -> np.ndarray:
    """Per frame (columns of bound (T, n)), how many leading steps have a running bound below
    2 sqrt(r), the largest distance of two frames: beyond the first step where it reaches it the bound
    certifies nothing (it only grows), so a trajectory is compared over those steps alone."""
    vacuous = ~(bound < 2.0 * math.sqrt(r))
    return np.where(vacuous.any(axis=0), np.argmax(vacuous, axis=0), bound.shape[0])


def worst_over_informative_steps(residual: np.ndarray, bound: np.ndarray, r: int):
    """Per frame, the step with the largest residual / bound among its informative steps
    (informative_steps; a NaN residual counts as infinite); returns (residual,
    bound, t, covered, compared): covered (n,) the informative steps of each frame, compared (n,) the
    frames with at least one (the others are not compared: a caller adds only worst[compared])."""
    covered = informative_steps(bound, r)
    worst_residual, worst_bound, t = worst_within(residual, bound, covered)
    return worst_residual, worst_bound, t, covered, covered > 0


def worst_within(residual: np.ndarray, bound: np.ndarray, covered: np.ndarray):
    """Per frame i, the step among its first covered[i] with the largest residual / bound (a NaN
    residual counts as infinite): (residual (n,), bound (n,), t (n,)); a frame with no covered step
    gives its step 0, which the caller leaves out."""
    inside = np.arange(bound.shape[0])[:, None] < covered[None, :]
    ratio = np.where(inside, np.where(np.isnan(residual), np.inf, residual) / bound, -np.inf)
    t = np.argmax(ratio, axis=0)
    columns = np.arange(residual.shape[1])
    return residual[t, columns], bound[t, columns], t


def coverage_text(label: str, counts: dict, steps: int, precision_text: str) -> list[str]:
    """The notes that say what a trajectory check covered where bounds became vacuous (counts: vacuous,
    replayed, truncated, uncovered, shortest)."""
    notes = []
    if counts.get("truncated"):
        notes.append(f"{label}: {counts['truncated']} frames compared over their first steps only (as few as {counts['shortest']} "
                     f"of {steps}): their running rounding bound at {precision_text} reaches 2 sqrt(r) (certifies nothing) beyond")
    if counts.get("uncovered"):
        notes.append(f"{label}: {counts['uncovered']} frames not compared: their running rounding bound at {precision_text} reaches "
                     "2 sqrt(r) at the first step (the shapes where it is informative are the ones compared)")
    return notes


def plan_chunks(plan) -> list[tuple[int, int, int, int]]:
    """(d, r, count, chunk index) for every chunk of every ShapeBatch of a shape plan (batch_chunks).

    Chunks hold at most CHUNK_ENTRIES entries per matrix, so that a trajectory of T steps keeps
    T * CHUNK_ENTRIES * 8 bytes per stacked array (32 MiB at T = 16) whatever the profile.
    """
    return batch_chunks(plan, lambda batch: chunk_sizes(batch.count, batch.d, batch.r, CHUNK_ENTRIES))


def initial_distance_to_manifold(W0):
    """Bound on ||W0 - polar(W0)||_F: ||S - I|| <= ||S^2 - I|| = ||W^T W - I|| (S the symmetric polar
    factor), from the computed defect plus the rounding of the Gram matrix (the gram stage) and of the
    subtraction and norm (2u relative)."""
    d, r = W0.shape[-2], W0.shape[-1]
    gram_matrix = np.swapaxes(W0, -1, -2) @ W0
    defect = np.linalg.norm(gram_matrix - np.eye(r), axis=(-2, -1))
    return defect * (1 + 2 * u) + gram(d=d, u_c=u, A=frobenius(W0))


# --------------------------------------------------------------------------------------------
# A frame whose float64 bound is vacuous, replayed at higher precision
# --------------------------------------------------------------------------------------------


def highprec_unit_roundoff(dps: int) -> float:
    """The unit roundoff 2^-prec of mpmath at dps decimal digits (prec its binary precision)."""
    import mpmath

    context = mpmath.mp.clone()
    context.dps = dps
    return 2.0 ** -context.prec


def replay_pair(W0: np.ndarray, gradients: np.ndarray, config: StiefelAdamConfig, dps: int, moves, output_rounding: float = 0.0):
    """One frame's two trajectories at dps digits against the claim's running bound at that precision,
    for a frame whose float64 bound is vacuous (the amplification of the step carries float64's
    rounding past 2 sqrt(r); at 10^-dps it does not).

    W0 (d, r) and gradients (T, d, r) are float64. The plain run starts from polar(W0) at dps digits
    (an exact frame) with the gradients G_t; the moved run from move_inputs(W, [G_t]) of the same
    exact values, formed at dps digits (P2: c G_t; P4: Q W, Q G_t); moves(ctx) returns (move_inputs,
    move_output) for the mpmath context ctx (highprec.context(dps)) whose matrices they take and return.
    Both follow reference_impl.highprec.trajectory_mp; their exact trajectories satisfy
    move_output(W_t) = W'_t exactly. Returns (residual (T,), bound (T,)): ||move_output(W_t) - W'_t||_F
    and the sum of the two runs' trajectory_rounding_bound at the twin's unit roundoff (the eigh route:
    its polar factor comes from mpmath's symmetric eigensolver, which iterates to its working
    precision; taken with LAPACK's counts, 30 r sweeps) from their own norms, plus output_rounding
    times sqrt(r) for forming move_output(W_t) at dps digits."""
    from reference_impl import highprec

    d, r = W0.shape
    ctx = highprec.context(dps)
    start = highprec.polar_mp(highprec.to_mp(W0, ctx), ctx=ctx)
    exact_gradients = [highprec.to_mp(G, ctx) for G in gradients]
    plain = highprec.trajectory_mp(start, exact_gradients, config, ctx)
    move_inputs, move_output = moves(ctx)
    start, moved_gradients = move_inputs(start, exact_gradients)
    moved = highprec.trajectory_mp(start, moved_gradients, config, ctx)
    rounding = Rounding(u_c=highprec_unit_roundoff(dps), route="eigh")
    bound = np.zeros(len(gradients))
    for run in (plain, moved):
        norms = {key: np.array([[step.norms[key]] for step in run]) for key in run[0].norms}
        bound += trajectory_rounding_bound(norms, d, r, config, rounding=rounding)["W"][:, 0]
    residual = np.array([float(highprec.frobenius_mp(move_output(a.W) - b.W, ctx)) for a, b in zip(plain, moved)])
    return residual, bound + output_rounding * math.sqrt(r)


REPLAY_TEXT = ("the two trajectories of a frame whose float64 bound is vacuous, replayed by reference_impl.highprec.trajectory_mp "
               "at the profile's mp_dps digits from the exact frame polar(W0) with the moved inputs formed exactly (replay_pair); "
               "bound: the sum of the two runs' running bounds at mpmath's unit roundoff 2^-prec (the eigh route), from their "
               "own norms, plus the rounding of the output's map")


# How many frames of a chunk a claim replays at high precision. A correct float64 step meets a
# vacuous running bound on no frame of the default profile's 10^4 (8 steps) and on a few frames in
# 10^6 at the thorough profile's 16 steps (the committed certificates, docs/claims.md#p2): a rate of
# order 10^-6. The budget is one frame per chunk plus REPLAY_RATE of the chunk's frames, a thousand
# times that rate. More vacuous frames than that say that the step under test amplifies its rounding
# beyond the analysis of StiefelAdam, or is not that step; replaying them would certify the frames
# through reference_impl.highprec's twin of the algorithm in place of the code under test (and each
# replay costs a second or more at mp_dps digits, so a broken step made every claim seem to hang).
# Such frames are not replayed: they are compared over their informative steps like any other
# implementation's, counted as over_budget, and the claim is inconclusive, saying why.
REPLAY_RATE = 1e-3


def replay_budget(frames: int) -> int:
    """The most frames of a chunk of `frames` frames that a claim replays (REPLAY_RATE)."""
    return 1 + int(frames * REPLAY_RATE)


def over_budget_reason(label: str, over_budget: int, frames: int) -> str:
    """The inconclusive reason of a claim whose chunks met more vacuous bounds than replay_budget."""
    return (f"{label}: {over_budget} of {frames} frames met a vacuous float64 running bound, more than the replay budget "
            f"(one frame per chunk plus {REPLAY_RATE:g} of its frames; a correct float64 step meets it on a few frames in 10^6): "
            "the step amplifies its rounding beyond the analysis of StiefelAdam, or is not that step. They were not replayed "
            "at high precision, since a replay runs reference_impl.highprec's twin of the algorithm, not the code under test")


REPLAYED_NOTE = ("{label}: {replayed} frames whose float64 running bound became vacuous were certified by replaying them in "
                 "reference_impl.highprec's mpmath twin of the algorithm at mp_dps digits: those frames certify the algorithm "
                 "through the twin, not the float64 code under test (their float64 runs are compared over their informative "
                 "steps only)")


def replayed_check(label: str) -> NumericalCheck:
    """The check of the frames of `label` replayed at higher precision (replay_vacuous)."""
    return NumericalCheck(f"{label}_replayed", f"max over t of the {label} residual at mp_dps digits, for each frame whose "
                          "float64 bound reaches 2 sqrt(r) (vacuous)", REPLAY_TEXT)


def replay_vacuous(check: NumericalCheck, frames, W0, gradients, config, dps: int, moves_of, key, seed, output_rounding=0.0,
                   extra_of=None) -> int:
    """replay_pair for each frame index in `frames` (W0 (n, d, r), gradients (T, n, d, r)); the worst
    step's residual and bound added to `check`. moves_of(i): the frame's `moves`; extra_of(i): what
    the certificate records of it. Returns the number of frames replayed."""
    d, r = W0.shape[-2], W0.shape[-1]
    for i in frames:
        residual, bound = replay_pair(W0[i], gradients[:, i], config, dps, moves_of(i), output_rounding)
        t = int(np.argmax(residual / bound))
        check.add(residual[t:t + 1], bound[t:t + 1], shape=(d, r), key=key, seed=seed,
                  extra={"frame": int(i), "step": t + 1, "dps": dps, **(extra_of(i) if extra_of else {})})
    return len(frames)
