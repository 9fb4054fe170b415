"""P1: the first StiefelAdam step is a steepest-descent step of the embedded metric.

Claim
    For every frame W in St(d, r) and every G with P_W(G) != 0, the unit tangent vector
    xi* = -P_W(G) / ||P_W(G)|| is the unique minimiser of <G, xi> over xi in T_W with ||xi|| = 1.
    Hence the first StiefelAdam step from a fresh state with eps = 0 is the steepest-descent step
    -min(lr sqrt(d r), Delta) P_W(G) / ||P_W(G)||, and because the polar retraction R_W is a
    (second-order) retraction, f(R_W(s xi)) = f(W) + s <G, xi> + O(s^2) for smooth f.

Why it is true
    P_W(G) = G - W sym(W^T G) is the orthogonal projector onto T_W (idempotent, self-adjoint, range
    T_W, kernel N_W = {W S : S = S^T}). For tangent xi, <G, xi> = <P_W(G), xi> >= -||P_W(G)|| by
    Cauchy-Schwarz, and the gap is exactly  <G, xi> - <G, xi*> = ||P_W(G)|| ||xi - xi*||^2 / 2,
    which is zero only at xi = xi*: the minimiser is unique. At t = 1 from m = 0, v = 0 the moments
    are m^ = g and v^ = ||g||^2 / (d r), so xi = -lr sqrt(d r) g / ||g||, clipped to length Delta.
    For tangent xi, R_W(s xi) = (W + s xi)(I + s^2 xi^T xi)^(-1/2) = W + s xi - s^2 W xi^T xi / 2
    + O(s^3): R_W(0) = W, dR_W(0) = id, and the acceleration -W xi^T xi lies in N_W.

How it is checked
    * symbolically (sympy): generic MatrixSymbol algebra with W^T W = I for idempotence, range and
      kernel; explicit entries at small sizes for self-adjointness and the series of R_W(s xi); the
      first-step length with positive symbols;
    * exactly at rational Stiefel points (Cayley tier): the projector identities with zero tolerance;
    * in float64 over shape_plan(profile): the projector identities, the gap identity above, the
      minimiser from an independent orthonormal basis of T_W (null space of xi -> W^T xi + xi^T W,
      by batched SVD, which never forms P_W; shapes with d r <= MINIMISER_MAX_DR only, since the basis costs O((d r)^3) per frame), and the first step of
      the optimizer under test against R_W(-min(lr sqrt(d r), Delta) P_W(G)/||P_W(G)||);
    * slope tests with a self-located window: ||R_W(s xi) - W - s xi|| ~ s^2 (first order),
      ||P_W(R_W(s xi) - W - s xi)|| ~ s^3 (normal acceleration) and
      |f(R_W(s xi)) - f(W) - s <G, xi>| ~ s^2 for a quadratic f (`locate_slope`).

What would make it fail
    A gradient map that is not the orthogonal projection (projection without sym, the canonical
    metric gradient G - W G^T W) makes the first step leave the steepest-descent direction, and the
    first-step check fails by many orders of magnitude (controls). A retraction that is only first
    order would show slope 2 instead of 3 in the tangential second-order test.
"""

from __future__ import annotations

import math
from typing import Iterator

import numpy as np
import sympy as sp

import reference_impl as ri
from reference_impl import StiefelAdamConfig, get_variant, manifold_tolerance
from reference_impl.adam import frobenius
from reference_impl.manifold import feasibility, polar_retract, project_tangent

from ._common import LARGE_SHAPES, SMALL_SHAPES, NumericalCheck, Profile, SymbolicStep
from ._common import batch_chunks, chunk_frames, chunk_sizes, rng_for, shape_plan, u, wide_scale_gradients
from .kit import float32_step
from .kit import precision as precisions
from .kit import tightness
from .kit.bounds import gamma, polar_error_bound, polar_perturbation_bound, projection_error_bound
from .kit.figures import LineFigure, Series
from .kit.protocol import Claim, Context, Control, Evidence, Part, Symbolic, map_evidence
from .kit.symbolic import is_zero, reduce_with
from .kit.common import ControlResult
from .kit.trajectories import TrajectoryPlan, TrajectorySetting, trajectory_evidence, trajectory_part

CLAIM_ID = "P1"

# The optimizer's own trajectories held to the model (kit/trajectories.py), this claim's settings:
# steepest descent: the trust-region regimes of the step, from fresh states as in the claim
TRAJECTORIES = TrajectoryPlan(CLAIM_ID, (
    TrajectorySetting("fresh_capped_0.1", 0.1, 0.4, 0.0, "gaussian", "fresh"),
    TrajectorySetting("fresh_uncapped_0.5", 0.5, 0.05, 1e-8, "gaussian", "fresh"),
    TrajectorySetting("warm_capped_0.5", 0.5, 1.0, 1e-8, "gaussian", "warm"),
), ((2, 1), (5, 2), (4, 4), (8, 3), (16, 4)))

# The basis of T_W costs an SVD of a (r(r+1)/2) x (d r) matrix with full V, O((d r)^3) per frame;
# above this the independent minimiser is skipped (the projector checks still cover those shapes).
MINIMISER_MAX_DR = 64

# Slope tests. s runs over a log grid of many decades; points within FLOOR_FACTOR of the measured
# rounding floor are masked. A point 100 times above the floor carries at most 1 % rounding, which
# moves a local slope over a quarter-decade step by at most 2 * 0.01 / (0.25 ln 10) ~ 0.035, so
# SLOPE_TOL = 0.1 absorbs rounding and a 5 % higher-order term, while an error one order lower (slope
# off by 1) misses it tenfold. The window must span MIN_DECADES = 3 decades: a higher-order term
# that competes with the leading one bends the curve within about one decade, so three decades of
# a constant local slope cannot come from a crossover between two orders.
SLOPE_GRID = 10.0 ** np.linspace(-14.0, 0.0, 57)
FLOOR_REGION_MAX_S = 1e-11  # below this every tested quantity is < 1e-20 in exact arithmetic
FLOOR_FACTOR = 100.0
SLOPE_TOL = 0.1
MIN_DECADES = 3.0
SLOPE_SHAPES = ((3, 1), (4, 4), (8, 3), (32, 8))

# Two configurations so that both branches of the trust region are exercised: with the first,
# lr sqrt(d r) < Delta for every planned shape; with the second the cap binds once d r >= 3.
# A control only has to be caught: its runs use a tenth of the frames and the cheaper large shapes.
CONTROL_LARGE_SHAPES = LARGE_SHAPES[:2]

FIRST_STEP_CONFIGS = (
    StiefelAdamConfig(lr=1e-3, betas=(0.9, 0.999), eps=0.0, trust_radius=0.5),
    StiefelAdamConfig(lr=0.2, betas=(0.5, 0.9), eps=0.0, trust_radius=0.3),
)

STATEMENT = (
    "For every W in St(d,r) and G with P_W(G) != 0, -P_W(G)/||P_W(G)|| is the unique minimiser of "
    "<G, xi> over unit tangent vectors xi in T_W; the first StiefelAdam step from a fresh state "
    "(eps = 0) is the steepest-descent step -min(lr sqrt(d r), Delta) P_W(G)/||P_W(G)||, and "
    "f(R_W(s xi)) = f(W) + s <G, xi> + O(s^2)."
)
LATEX = (
    r"-\frac{P_W(G)}{\|P_W(G)\|} = \operatorname*{arg\,min}_{\xi \in T_W,\ \|\xi\| = 1} \langle G, \xi \rangle,"
    r"\quad \xi_1 = -\min(\eta\sqrt{dr}, \Delta)\,\frac{P_W(G)}{\|P_W(G)\|},"
    r"\quad f(R_W(s\xi)) = f(W) + s\langle G, \xi\rangle + O(s^2)"
)


def _inner(A: np.ndarray, B: np.ndarray) -> np.ndarray:
    return np.sum(A * B, axis=(-2, -1))


# --------------------------------------------------------------------------------------------
# Slope tests
# --------------------------------------------------------------------------------------------


def locate_slope(
    s: np.ndarray,
    error: np.ndarray,
    floor: float,
    expected: float,
    *,
    tol: float = SLOPE_TOL,
    floor_factor: float = FLOOR_FACTOR,
    min_decades: float = MIN_DECADES,
) -> dict:
    """Self-located slope of log error against log s.

    s: (n,) increasing positive grid; error: (n,) non-negative; floor: the rounding floor (> 0).
    Points with error <= floor_factor * floor (or non-finite) are masked. The window is the longest
    run of consecutive unmasked grid points whose local slopes (between neighbours) stay within a
    band of width 2 tol; its slope is the least-squares slope over that window only. Passes when the
    window spans >= min_decades decades and |slope - expected| <= tol. Returns a JSON-able dict.
    """
    s = np.asarray(s, dtype=np.float64)
    error = np.asarray(error, dtype=np.float64)
    usable = np.isfinite(error) & (error > floor_factor * floor)
    log_s = np.log10(s)
    log_e = np.log10(np.where(usable, error, 1.0))
    local = np.diff(log_e) / np.diff(log_s)
    best = (0, 0)  # [start, stop) point indices of the best window
    n = len(s)
    for start in range(n - 1):
        if not (usable[start] and usable[start + 1]):
            continue
        low = high = local[start]
        stop = start + 2
        while stop < n and usable[stop]:
            low, high = min(low, local[stop - 1]), max(high, local[stop - 1])
            if high - low > 2 * tol:
                break
            stop += 1
        if log_s[stop - 1] - log_s[start] > (log_s[best[1] - 1] - log_s[best[0]] if best[1] > best[0] else -1):
            best = (start, stop)
    start, stop = best
    if stop - start < 2:
        return {"slope": math.nan, "window": [math.nan, math.nan], "decades": 0.0, "expected": expected,
                "slope_error": math.inf, "passed": False, "masked": int(np.count_nonzero(~usable))}
    fit = float(np.polyfit(log_s[start:stop], log_e[start:stop], 1)[0])
    decades = float(log_s[stop - 1] - log_s[start])
    slope_error = abs(fit - expected)
    return {
        "slope": fit,
        "window": [float(s[start]), float(s[stop - 1])],
        "decades": decades,
        "expected": expected,
        "slope_error": slope_error,
        "slope_margin": tol - slope_error,
        "decades_margin": decades - min_decades,
        "passed": bool(decades >= min_decades and slope_error <= tol),
        "masked": int(np.count_nonzero(~usable)),
    }


def measured_floor(s: np.ndarray, error: np.ndarray, scale: float) -> float:
    """Rounding floor: the largest error where the exact quantity is below 1e-20 (s <= 1e-11),
    and never below u * scale (scale: the size of the quantities whose difference is taken)."""
    in_floor = s <= FLOOR_REGION_MAX_S
    observed = float(np.max(error[in_floor])) if np.any(in_floor) else 0.0
    return max(observed, u * scale)


def _slope_curves(W: np.ndarray, xi: np.ndarray, A: np.ndarray, B: np.ndarray, retract=None) -> dict[str, np.ndarray]:
    """The three slope-test curves for frames W (n, d, r), unit tangents xi, quadratic f.

    f(X) = <X, A X>/2 + <B, X> with A (n, d, d) symmetric, so G = nabla f(W) = A W + B.
    retract(W, xi) -> R_W(xi), batched; default the polar retraction of the reference.
    Returns arrays of shape (n, len(SLOPE_GRID)).
    """
    retract = (lambda W, xi: polar_retract(W, xi, "svd", validate=False)) if retract is None else retract
    s = SLOPE_GRID[None, :, None, None]
    Wb, xib = W[:, None], xi[:, None]
    retracted = retract(np.broadcast_to(Wb, (W.shape[0], len(SLOPE_GRID)) + W.shape[1:]), s * xib)
    deviation = retracted - Wb - s * xib
    f = lambda X: 0.5 * _inner(X, A[:, None] @ X) + _inner(B[:, None], X)  # noqa: E731
    G = A @ W + B
    f_W = 0.5 * _inner(W, A @ W) + _inner(B, W)
    return {
        "first_order": frobenius(deviation),
        "normal_acceleration": frobenius(project_tangent(np.broadcast_to(Wb, deviation.shape), deviation, validate=False)),
        "function_expansion": np.abs(f(retracted) - f_W[:, None] - SLOPE_GRID[None, :] * _inner(G, xi)[:, None]),
        "_f_scale": np.abs(f_W) + frobenius(G) * 1.0,
    }


# The quadratic test function must have a second-order term along xi, or the expansion's remainder
# starts at s^3 and the s^2 law is not exercised: |c2| >= MIN_CURVATURE (c2 below) with ||xi|| = 1 puts
# c2 s^2 above a floor of ~1e-15 |f| from s ~ 1e-6 and ahead of the O(1) cubic term up to s ~ 0.1.
MIN_CURVATURE = 0.1
MAX_DRAWS = 16


def second_order_coefficient(W: np.ndarray, xi: np.ndarray, A: np.ndarray, B: np.ndarray) -> np.ndarray:
    """c2 in f(R_W(s xi)) = f(W) + s <G, xi> + c2 s^2 + O(s^3) for f(X) = <X, A X>/2 + <B, X>.

    R_W(s xi) = W + s xi - s^2 W xi^T xi / 2 + O(s^3), so c2 = (<xi, A xi> - <W^T G, xi^T xi>) / 2 with
    G = A W + B. Shapes: W, xi, B (n, d, r); A (n, d, d). Returns (n,).
    """
    G = A @ W + B
    return 0.5 * (_inner(xi, A @ xi) - _inner(np.swapaxes(W, -1, -2) @ G, np.swapaxes(xi, -1, -2) @ xi))


def quadratic_with_curvature(W: np.ndarray, xi: np.ndarray, rng: np.random.Generator):
    """(A, B) of a random quadratic f(X) = <X, A X>/2 + <B, X> per frame with |c2| >= MIN_CURVATURE.

    A (n, d, d) symmetric with entries of size 1/sqrt(d), B (n, d, r) Gaussian; frames whose draw
    falls below the curvature threshold are redrawn, at most MAX_DRAWS times (a frame that never
    reaches it keeps its last draw, and its slope test then shows it).
    """
    n, d, _ = W.shape
    A = np.zeros((n, d, d))
    B = np.zeros(W.shape)
    pending = np.ones(n, dtype=bool)
    for _ in range(MAX_DRAWS):
        candidate_A = rng.standard_normal((n, d, d))
        candidate_A = (candidate_A + np.swapaxes(candidate_A, -1, -2)) / (2 * math.sqrt(d))
        candidate_B = rng.standard_normal(W.shape)
        A[pending], B[pending] = candidate_A[pending], candidate_B[pending]
        pending &= np.abs(second_order_coefficient(W, xi, A, B)) < MIN_CURVATURE
        if not pending.any():
            break
    return A, B


def slope_tests(seed: int, profile: Profile) -> tuple[list[NumericalCheck], list[dict], dict]:
    """Run the slope tests on SLOPE_SHAPES (a few frames each); return checks, figure curves, summary."""
    expected = {"first_order": 2.0, "normal_acceleration": 3.0, "function_expansion": 2.0}
    descriptions = {
        "first_order": "||R_W(s xi) - W - s xi|| ~ s^2: R_W(0) = W and dR_W(0) = id",
        "normal_acceleration": "||P_W(R_W(s xi) - W - s xi)|| ~ s^3: the acceleration of R_W at 0 is normal",
        "function_expansion": "|f(R_W(s xi)) - f(W) - s <G, xi>| ~ s^2 for f(X) = <X, A X>/2 + <B, X>",
    }
    checks = {
        name: NumericalCheck(
            f"slope_{name}",
            descriptions[name],
            "residual = |located slope - expected slope| over a self-located window of >= "
            f"{MIN_DECADES:g} decades (infinite if no such window), bound = SLOPE_TOL = {SLOPE_TOL:g}: "
            "rounding within FLOOR_FACTOR of the measured floor is masked and perturbs a local slope by "
            "<= 0.035; a wrong order shifts the slope by 1.",
        )
        for name in expected
    }
    curves, summary = [], {name: [] for name in expected}
    frames_per_shape = 2
    for d, r in SLOPE_SHAPES:
        key = (CLAIM_ID, "slope", d, r)
        rng = rng_for(seed, *key)
        W = ri.random_point(d, r, rng, (frames_per_shape,))
        xi = project_tangent(W, rng.standard_normal(W.shape), validate=False)
        xi = xi / frobenius(xi)[:, None, None]
        A, B = quadratic_with_curvature(W, xi, rng)
        data = _slope_curves(W, xi, A, B)
        for name in expected:
            for k in range(frames_per_shape):
                # scale of the quantities subtracted: ||W|| = sqrt(r) for the retraction tests, |f| + ||G||
                # for the expansion of f
                scale = math.sqrt(r) if name != "function_expansion" else float(data["_f_scale"][k])
                floor = measured_floor(SLOPE_GRID, data[name][k], scale)
                located = locate_slope(SLOPE_GRID, data[name][k], floor, expected[name])
                residual = located["slope_error"] if located["decades"] >= MIN_DECADES else math.inf
                checks[name].add(np.array([residual]), SLOPE_TOL, shape=(d, r), key=key, seed=seed,
                                 extra={"frame": k, "window": located["window"], "slope": located["slope"]})
                checks[name].reach("log10_s", np.log10(SLOPE_GRID))
                summary[name].append({"shape": [d, r], "frame": k, **located, "floor": floor})
                if k == 0:
                    curves.append({
                        "name": name,
                        "shape": [d, r],
                        "expected_slope": expected[name],
                        "s": SLOPE_GRID.tolist(),
                        "error": data[name][k].tolist(),
                        "floor": floor,
                        "floor_factor": FLOOR_FACTOR,
                        "window": located["window"],
                        "slope": located["slope"],
                        "decades": located["decades"],
                    })
    return list(checks.values()), curves, summary


# --------------------------------------------------------------------------------------------
# Symbolic part
# --------------------------------------------------------------------------------------------


SYMBOLIC_METHOD = ("sympy: MatrixSymbol algebra with W^T W = I; explicit entries at small sizes; the code's sym, skew and "
                   "project_tangent executed on exact symbolic entries (propositions.kit.symbolic)")


def _projector_algebra() -> list[SymbolicStep]:
    """Idempotence, range and kernel of P_W for every d, r (MatrixSymbols with W^T W = I)."""
    d, r = sp.symbols("d r", integer=True, positive=True)
    W, G, S = sp.MatrixSymbol("W", d, r), sp.MatrixSymbol("G", d, r), sp.MatrixSymbol("S", r, r)
    I_r = sp.Identity(r)

    def P(X):
        return X - W * (W.T * X + X.T * W) / 2

    orthonormal = {W.T * W: I_r}
    PG = P(G)
    idempotent = reduce_with(P(PG) - PG, orthonormal)
    in_range = reduce_with(W.T * PG + PG.T * W, orthonormal)
    # kernel: S symmetric, so S^T is replaced by S
    kernel = reduce_with(P(W * S).subs(S.T, S), {**orthonormal, S.T: S})
    return [
        SymbolicStep("P_W is idempotent: P_W(P_W(G)) - P_W(G) = 0 given W^T W = I",
                     r"P_W(P_W(G)) - P_W(G) = 0", is_zero(idempotent)),
        SymbolicStep("range in T_W: W^T P_W(G) + P_W(G)^T W = 0",
                     r"W^\top P_W(G) + P_W(G)^\top W = 0", is_zero(in_range)),
        SymbolicStep("kernel N_W: P_W(W S) = 0 for S = S^T", r"P_W(WS) = 0,\ S = S^\top", is_zero(kernel)),
    ]


def _adjoint_and_gap() -> list[SymbolicStep]:
    """Self-adjointness and the gap identity, which need traces: at d = 3, r = 2 with explicit
    symbolic entries and an exact rational frame (the Cayley transform of a fixed skew matrix)."""
    A_skew = sp.Matrix([[0, sp.Rational(1, 2), -1], [-sp.Rational(1, 2), 0, sp.Rational(1, 3)], [1, -sp.Rational(1, 3), 0]])
    Q = (sp.eye(3) - A_skew) * (sp.eye(3) + A_skew).inv()
    Wc = Q[:, :2]
    Ga = sp.Matrix(3, 2, sp.symbols("a0:6"))
    Gb = sp.Matrix(3, 2, sp.symbols("b0:6"))

    def Pc(X):
        return X - Wc * (Wc.T * X + X.T * Wc) / 2

    adjoint = sp.expand((Pc(Ga).T * Gb).trace() - (Ga.T * Pc(Gb)).trace())
    # Gap identity, in two steps. (i) The normal part of G annihilates tangents: <G - P_W(G), P_W(B)> = 0
    # and <G - P_W(G), P_W(G)> = 0, polynomial identities in the explicit entries. (ii) Hence for a unit
    # tangent z, with p = ||P_W(G)||, xi* = -P_W(G)/p and q = <P_W(G), z>: <G, z> = q, <G, xi*> = -p and
    # ||z - xi*||^2 = 2 + 2 q / p, so <G, z> - <G, xi*> - p ||z - xi*||^2 / 2 = 0.
    PGc, z = Pc(Ga), Pc(Gb)
    normal = Ga - PGc
    annihilates = (sp.expand((normal.T * z).trace()) == 0) and (sp.expand((normal.T * PGc).trace()) == 0)
    p_norm, q = sp.Symbol("p", positive=True), sp.Symbol("q", real=True)
    gap = q - (-p_norm) - p_norm / 2 * (2 + 2 * q / p_norm)
    return [
        SymbolicStep("self-adjoint: <P_W(A), B> = <A, P_W(B)> (d = 3, r = 2, explicit entries)",
                     r"\operatorname{tr}(P_W(A)^\top B) - \operatorname{tr}(A^\top P_W(B)) = 0",
                     adjoint == 0),
        SymbolicStep(
            "the normal part G - P_W(G) is orthogonal to T_W: <G - P_W G, P_W B> = 0 = <G - P_W G, P_W G> (d = 3, r = 2)",
            r"\langle G - P_W(G), P_W(B)\rangle = 0", annihilates),
        SymbolicStep(
            "gap identity: <G, z> - <G, xi*> = ||P_W G|| ||z - xi*||^2 / 2 for unit tangent z, so xi* = -P_W G/||P_W G|| "
            "is the unique minimiser",
            r"\langle G, z\rangle - \langle G, \xi^*\rangle = \tfrac{1}{2}\|P_W(G)\|\,\|z - \xi^*\|^2",
            sp.simplify(gap) == 0),
    ]


def _first_step_length() -> SymbolicStep:
    """First step from a fresh state: m^ = g, v^ = ||g||^2/(d r), xi = -lr sqrt(d r) g/||g||."""
    lr, b1, b2, n, dr = sp.symbols("eta beta1 beta2 n dr", positive=True)
    m = (1 - b1) * 1  # coefficient of g
    v = (1 - b2) * n**2 / dr
    m_hat, v_hat = m / (1 - b1), v / (1 - b2)
    coefficient = -lr * m_hat / sp.sqrt(v_hat)  # xi = coefficient * g
    return SymbolicStep(
        "first step: xi = -lr m^/sqrt(v^) = -lr sqrt(d r) g/||g|| (then clipped to length Delta)",
        r"-\eta\,\hat m_1/\sqrt{\hat v_1} = -\eta\sqrt{dr}\,g/\|g\|",
        sp.simplify(coefficient - (-lr * sp.sqrt(dr) / n)) == 0)


def _retraction_series() -> list[SymbolicStep]:
    """Retraction series, r = 1 (d = 3, xi orthogonal to W) and d = r = 2 (xi = W Omega): in both cases
    xi^T xi = c I, so (I + s^2 xi^T xi)^(-1/2) is the scalar (1 + c s^2)^(-1/2)."""
    s = sp.Symbol("s", real=True)
    a, b_, c_ = sp.symbols("a b c", real=True)
    cases = [
        ("d = 3, r = 1", sp.Matrix([1, 0, 0]), sp.Matrix([0, b_, c_])),
        ("d = r = 2", sp.Matrix([[sp.Rational(3, 5), -sp.Rational(4, 5)], [sp.Rational(4, 5), sp.Rational(3, 5)]]), None),
    ]
    steps = []
    for label, Wm, xi in cases:
        if xi is None:
            xi = Wm * sp.Matrix([[0, -a], [a, 0]])
        gram = sp.simplify(xi.T * xi)
        c = gram[0, 0]
        # (1 + c s^2)^(-1/2) is one scalar: expand it once, then truncate the product at s^2
        factor = sp.series((1 + c * s**2) ** sp.Rational(-1, 2), s, 0, 3).removeO()
        series = ((Wm + s * xi) * factor).applyfunc(
            lambda entry: sum(sp.expand(entry).coeff(s, k) * s**k for k in range(3)))
        expected = Wm + s * xi - s**2 / 2 * Wm * gram
        first_second = sp.simplify(series - expected) == sp.zeros(*Wm.shape)
        acceleration = -Wm * gram
        normal = sp.simplify(Wm.T * acceleration - (Wm.T * acceleration).T) == sp.zeros(Wm.shape[1], Wm.shape[1])
        steps.append(SymbolicStep(
            f"R_W(s xi) = W + s xi - s^2 W xi^T xi / 2 + O(s^3) and the acceleration -W xi^T xi is normal ({label})",
            r"R_W(s\xi) = W + s\xi - \tfrac{s^2}{2} W\xi^\top\xi + O(s^3),\ W^\top(-W\xi^\top\xi)\ \text{symmetric}",
            bool(first_second and normal)))
    return steps


def symbolic_derivation() -> list[SymbolicStep]:
    """The derivation's steps (seed-independent: run_claim derives them once per process). The steps
    of the formulas come first; propositions.kit.symbolic.projector_steps then run the code itself
    (a change to it fails them)."""
    from .kit.symbolic import projector_steps

    return [*_projector_algebra(), *_adjoint_and_gap(), _first_step_length(), *_retraction_series(), *projector_steps()]


# --------------------------------------------------------------------------------------------
# Exact part
# --------------------------------------------------------------------------------------------


def exact_part(seed: int) -> list[dict]:
    """Projector identities at rational Stiefel points, zero tolerance (reference_impl.exact)."""
    from reference_impl import exact

    shapes = ((3, 1), (3, 2), (4, 4), (5, 3))
    passed = {"idempotent": True, "range": True, "kernel": True, "self_adjoint": True}
    for d, r in shapes:
        rng = rng_for(seed, CLAIM_ID, "exact", d, r)
        W = exact.rational_point(d, r, rng)
        A, B = exact.rational_matrix(d, r, rng), exact.rational_matrix(d, r, rng)
        S = exact.sym(exact.rational_matrix(r, r, rng))
        PA, PB = exact.project_tangent(W, A), exact.project_tangent(W, B)
        passed["idempotent"] &= exact.is_zero(exact.project_tangent(W, PA) - PA)
        passed["range"] &= exact.is_zero(W.T * PA + PA.T * W)
        passed["kernel"] &= exact.is_zero(exact.project_tangent(W, W * S))
        passed["self_adjoint"] &= exact.is_zero(sp.Matrix([[(PA.T * B).trace() - (A.T * PB).trace()]]))
    descriptions = {
        "idempotent": "P_W(P_W(A)) = P_W(A)",
        "range": "W^T P_W(A) + P_W(A)^T W = 0",
        "kernel": "P_W(W S) = 0 for rational symmetric S",
        "self_adjoint": "<P_W(A), B> = <A, P_W(B)>",
    }
    return [
        {"name": f"exact_{name}", "description": descriptions[name] + f" at rational frames of shapes {list(shapes)}",
         "samples": len(shapes), "passed": bool(ok)}
        for name, ok in passed.items()
    ]


# --------------------------------------------------------------------------------------------
# Numerical part
# --------------------------------------------------------------------------------------------


def tangent_dimension(d: int, r: int) -> int:
    """dim T_W = d r - r (r + 1) / 2 (zero for d = r = 1, where P_W(G) = 0 for every G)."""
    return d * r - r * (r + 1) // 2


def _frame_draws(seed: int, label: str, chunk, decades: int = 30):
    """The draws of one chunk (d, r, count, chunk index) of batch_chunks: (key, rng, W, G), key =
    (CLAIM_ID, label, d, r, chunk index), rng = rng_for(seed, *key), W (count, d, r) Haar frames and
    G wide-scale gradients of W's shape (`decades`) drawn from rng in that order (the caller draws on from rng)."""
    key, rng, W = chunk_frames(seed, CLAIM_ID, label, chunk)
    return key, rng, W, wide_scale_gradients(rng, W.shape, decades)


def _projector_check_set() -> tuple[NumericalCheck, ...]:
    """The empty checks of projector_checks: idempotent, self-adjoint, range, kernel, gap."""
    bound_note = (
        "e_P(d, r) = ((gamma_d + gamma_r) sqrt(r) + 3u) bounds the error of one float64 projection "
        "relative to ||G|| (projection_error_bound); feas = ||W^T W - I|| (measured per frame) bounds the "
        "failure of the exact formula to be a projector at a float64 frame."
    )
    idempotent = NumericalCheck("projector_idempotent", "||P_W(P_W(G)) - P_W(G)|| over ||G|| scale",
                                bound_note + " Bound 4 (e_P + feas) ||G||: two projections, each erring by e_P ||G||.")
    self_adjoint = NumericalCheck("projector_self_adjoint", "|<P_W(A), B> - <A, P_W(B)>|",
                                  bound_note + " Bound 4 (e_P + gamma_{dr} + feas) ||A|| ||B||: two projections "
                                  "and two inner products of length d r.", tightness_note=tightness.WORST_CASE_SUMS)
    in_range = NumericalCheck("projector_range", "||W^T P_W(G) + P_W(G)^T W||",
                              bound_note + " Bound 4 (e_P + gamma_d sqrt(r) + feas) ||G||: the projection error "
                              "times ||W||_2 = 1, twice, plus the product W^T P_W(G).")
    kernel = NumericalCheck("projector_kernel", "||P_W(W S)|| for symmetric S",
                            bound_note + " Bound 4 (e_P + gamma_r sqrt(r) + feas) ||S||: fl(W S) errs by "
                            "gamma_r sqrt(r) ||S||, then one projection.")
    gap = NumericalCheck(
        "minimum_gap_identity",
        "|<G, z> - <G, xi*> - ||P_W G|| ||z - xi*||^2 / 2| for a random unit tangent z, xi* = -P_W G/||P_W G||",
        bound_note + " z = P_W(Z)/||P_W(Z)|| and xi* = -P_W(G)/||P_W(G)|| have normal components of relative "
        "size (e_P + feas) rho_Z and (e_P + feas) rho_G (rho_X = ||X|| / ||P_W X||, the normalisation "
        "magnifies the projection error), which the normal part of G (<= ||G||) turns into errors of "
        "<G, z> and <G, xi*>; the inner products of length d r err by gamma_{dr} ||G||, and the squared "
        "distance <= 4 multiplies ||P_W G|| <= ||G|| by relative error gamma_{dr}. Bound "
        "8 ((e_P + feas)(rho_Z + rho_G) + gamma_{dr}) ||G||.",
    )
    return idempotent, self_adjoint, in_range, kernel, gap


def _projector_sample(checks, d: int, r: int, W, G, rng: np.random.Generator, **where) -> None:
    """Add one chunk's frames W (count, d, r) and gradients G to the five projector checks; draws the
    chunk's B, S (and Z where T_W != {0}) from rng. where: the check's shape, key and seed."""
    idempotent, self_adjoint, in_range, kernel, gap = checks
    count = W.shape[0]
    e_P = projection_error_bound(d, r)
    B = wide_scale_gradients(rng, W.shape)
    S = rng.standard_normal((count, r, r))
    S = S + np.swapaxes(S, -1, -2)
    feas = feasibility(W, validate=False)
    PG = project_tangent(W, G, validate=False)
    PB = project_tangent(W, B, validate=False)
    nG, nB, nS, nPG = frobenius(G), frobenius(B), frobenius(S), frobenius(PG)
    idempotent.add(frobenius(project_tangent(W, PG, validate=False) - PG), 4 * (e_P + feas) * nG, **where)
    self_adjoint.add(np.abs(_inner(PG, B) - _inner(G, PB)), 4 * (e_P + gamma(d * r) + feas) * nG * nB, **where)
    WtPG = np.swapaxes(W, -1, -2) @ PG
    in_range.add(frobenius(WtPG + np.swapaxes(WtPG, -1, -2)), 4 * (e_P + gamma(d) * math.sqrt(r) + feas) * nG, **where)
    kernel.add(frobenius(project_tangent(W, W @ S, validate=False)), 4 * (e_P + gamma(r) * math.sqrt(r) + feas) * nS,
               **where)
    # gap identity, skipping frames with P_W(G) = 0 exactly (d = r = 1: T_W = {0})
    if tangent_dimension(d, r) > 0:
        Z = rng.standard_normal(W.shape)
        z = project_tangent(W, Z, validate=False)
        rho_Z, rho_G = frobenius(Z) / frobenius(z), nG / nPG
        z = z / frobenius(z)[:, None, None]
        xi_star = -PG / nPG[:, None, None]
        lhs = _inner(G, z) - _inner(G, xi_star)
        rhs = 0.5 * nPG * frobenius(z - xi_star) ** 2
        gap.add(np.abs(lhs - rhs), 8 * ((e_P + feas) * (rho_Z + rho_G) + gamma(d * r)) * nG, **where)


def projector_chunk(chunk, seed: int) -> Evidence:
    """P_W idempotent, self-adjoint, range T_W, kernel N_W, and the gap identity on one chunk
    (d, r, count, chunk index) of the shape plan."""
    d, r, count, _ = chunk
    checks = _projector_check_set()
    key, rng, W, G = _frame_draws(seed, "projector", chunk)
    _projector_sample(checks, d, r, W, G, rng, shape=(d, r), key=key, seed=seed)
    return Evidence(checks=list(checks), frames=count)


def projector_checks(seed: int, profile: Profile) -> Evidence:
    """The projector identities and the gap identity over shape_plan(profile): one task per chunk
    (projector_chunk), merged in chunk order."""
    return map_evidence(projector_chunk, batch_chunks(shape_plan(profile)), seed, task_label="projector_checks")


def tangent_constraint_matrix(W: np.ndarray) -> np.ndarray:
    """Matrix of xi -> upper triangle of W^T xi + xi^T W in row-major vec(xi) coordinates.

    W: (n, d, r) float64. Returns (n, r (r + 1) / 2, d r). Entries are W[i, a] + W[i, b] delta_ab
    terms, each exact in float64 (a sum of at most two equal entries), so the map is represented
    without rounding; its null space is T_W exactly.
    """
    n, d, r = W.shape
    eye_r = np.eye(r)
    # (W^T E_ij)_{ab} = W[i, a] delta_{jb};  (E_ij^T W)_{ab} = delta_{ja} W[i, b]
    full = np.einsum("nia,jb->nabij", W, eye_r) + np.einsum("nib,ja->nabij", W, eye_r)
    rows, cols = np.triu_indices(r)
    return full[:, rows, cols].reshape(n, len(rows), d * r)


def null_space_batched(M: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Orthonormal null-space bases of M (n, k, m) by batched SVD, with scipy.linalg.null_space's
    rank rule (singular values <= max(k, m) eps s_max count as zero). Returns (bases (n, m, m - rank),
    ranks (n,)) with rank the largest rank found; a frame of lower rank shows in `ranks`, which the
    dimension check compares with r (r + 1) / 2."""
    _, singular, Vh = np.linalg.svd(M, full_matrices=True)
    k, m = M.shape[-2:]
    tol = singular[..., :1] * max(k, m) * np.finfo(np.float64).eps
    ranks = np.sum(singular > tol, axis=-1)
    rank = int(ranks.max())
    return np.swapaxes(Vh[:, rank:, :], -1, -2), ranks


def _minimiser_checks() -> tuple[NumericalCheck, NumericalCheck]:
    """The empty checks of minimiser_check: the agreement and the dimension of T_W."""
    agreement = NumericalCheck(
        "minimiser_independent_basis",
        "||xi_basis - (-P_W(G)/||P_W(G)||)||, xi_basis = -B B^T g/||B^T g|| with B an orthonormal null-space "
        "basis of xi -> W^T xi + xi^T W",
        "The constraint matrix M (exact in float64) has ||M||_2 = 2 and nonzero singular values >= sqrt 2; "
        "its SVD is backward stable with error <= d r u ||M|| (the LAPACK polynomial bounded by d r), so the "
        "basis' subspace is off by <= sqrt(2) d r u (Wedin) and B B^T g by <= 2 sqrt(2) d r u ||G|| plus "
        "gamma_{dr} ||G|| for the products; the float64 P_W(G) errs by e_P ||G|| and the frame's "
        "feasibility feas moves T_W by feas ||G||. Normalising doubles relative errors: bound "
        "8 (d r u + gamma_{dr} + e_P + feas) ||G|| / ||P_W(G)||.",
    )
    dimension = NumericalCheck(
        "tangent_basis_dimension",
        "|rank deficiency of the null space - (d r - r(r+1)/2)|: T_W has the stated dimension",
        "An integer comparison; bound 0.5 requires equality.",
        tightness_note=tightness.EQUALITY,
    )
    return agreement, dimension


def minimiser_chunk(chunk, seed: int) -> Evidence:
    """Independent minimiser of <G, xi> over unit xi in T_W from an orthonormal basis of T_W, on one
    chunk (d, r, count, chunk index)."""
    d, r, count, _ = chunk
    agreement, dimension = _minimiser_checks()
    key, _, W, G = _frame_draws(seed, "minimiser", chunk)
    e_P = projection_error_bound(d, r)
    expected_dim = tangent_dimension(d, r)
    M = tangent_constraint_matrix(W)
    basis, ranks = null_space_batched(M)
    dimension.add(np.abs((d * r - ranks) - expected_dim).astype(np.float64), 0.5, shape=(d, r), key=key, seed=seed)
    g = G.reshape(count, d * r)
    coefficients = np.einsum("nmk,nm->nk", basis, g)
    xi_basis = -np.einsum("nmk,nk->nm", basis, coefficients) / np.linalg.norm(coefficients, axis=-1)[:, None]
    PG = project_tangent(W, G, validate=False)
    xi_star = -(PG / frobenius(PG)[:, None, None]).reshape(count, d * r)
    feas = feasibility(W, validate=False)
    bound = 8 * (d * r * u + gamma(d * r) + e_P + feas) * frobenius(G) / frobenius(PG)
    agreement.add(np.linalg.norm(xi_basis - xi_star, axis=-1), bound, shape=(d, r), key=key, seed=seed)
    return Evidence(checks=[agreement, dimension], frames=count)


def minimiser_check(seed: int, profile: Profile) -> Evidence:
    """The independent minimiser over the small shapes with d r <= MINIMISER_MAX_DR and T_W != {0}:
    one task per chunk (minimiser_chunk), merged in chunk order; extra["minimiser"] says where it ran."""
    batches = [batch for batch in shape_plan(profile) if _has_minimiser(batch.d, batch.r)]
    evidence = map_evidence(minimiser_chunk, batch_chunks(batches, _by_basis), seed, task_label="minimiser_check")
    covered = [[batch.d, batch.r] for batch in batches]
    evidence.extra["minimiser"] = {"shapes": covered, "frames": evidence.frames, "max_dr": MINIMISER_MAX_DR}
    return evidence


def _has_minimiser(d: int, r: int) -> bool:
    """The shapes of the independent minimiser: small, d r <= MINIMISER_MAX_DR, T_W != {0}."""
    return (d, r) in SMALL_SHAPES and d * r <= MINIMISER_MAX_DR and tangent_dimension(d, r) > 0


def _by_basis(batch) -> Iterator[int]:
    # the SVD keeps a (d r) x (d r) V per frame: chunk by that size, not by the frame's
    return chunk_sizes(batch.count, batch.d * batch.r, batch.d * batch.r)


def _first_step_check(optimizer) -> NumericalCheck:
    """The empty check of first_step_check for the optimizer under test."""
    variant = get_variant(optimizer)
    precision = precisions.of(variant)
    check = NumericalCheck(
        f"first_step_is_steepest_descent[{variant.name}]",
        "||W_1 - R_W(-min(lr sqrt(d r), Delta) P_W(G)/||P_W(G)||)||, W_1 the first step of the optimizer "
        "under test from a fresh state with eps = 0 (two configurations: cap inactive and active)",
        "Both sides project G identically; the step's length lr sqrt(d r)/||g|| or Delta/||xi|| carries "
        "the relative error of a length-(d r) sum plus a few operations, gamma_{dr} + 8u, so the two "
        "tangent vectors differ by (gamma_{dr} + 8u) L (L the step length); the polar factor moves by "
        "polar_perturbation_bound((gamma_{dr} + 8u) L, 1 - 2 phi) (distance / sigma_min along the segment of "
        "W + tangent, W a frame within phi = manifold_tolerance(d, r)), and each float64 polar factor errs by "
        "polar_error_bound(d, r, sqrt(1 + L^2)). Bound 2 polar_error_bound + 2 polar_perturbation_bound "
        "(factor 2 for the dropped second-order terms).",
        tightness_note=tightness.SAME_ROUNDING,
    )
    if not precision.is_float64:
        check.bound_derivation += (
            f" The optimizer under test at {precision.text()}: its step is within evaluation_bound "
            "(propositions/kit/precision.py: step_error at its unit roundoffs and route, its inputs rounded to "
            "storage) of the exact step, which the float64 bound above holds to the expected frame: the sum.")
    return check


def first_step_chunk(chunk, seed: int, optimizer) -> Evidence:
    """The first step of `optimizer` on one chunk (d, r, count, chunk index), its frames split in
    halves, one per configuration of FIRST_STEP_CONFIGS (first_step_check)."""
    d, r, count, _ = chunk
    variant = get_variant(optimizer)
    precision = precisions.of(variant)
    check = _first_step_check(optimizer)
    key, _, W_all, G_all = _frame_draws(seed, "first_step", chunk, precision.scale_decades)
    halves = np.array_split(np.arange(count), len(FIRST_STEP_CONFIGS))
    for config_index, (config, frames_of_config) in enumerate(zip(FIRST_STEP_CONFIGS, halves)):
        if frames_of_config.size == 0:
            continue
        W, G = W_all[frames_of_config], G_all[frames_of_config]
        PG = project_tangent(W, G, validate=False)
        with np.errstate(divide="ignore", invalid="ignore"):
            direction = PG / frobenius(PG)[:, None, None]
        length = min(config.lr * math.sqrt(d * r), config.trust_radius)
        W_step, _ = variant.step(W, G, variant.init(W), config)
        # a projection under test that annihilates G (a broken one does, at square frames) leaves no
        # direction: the expected frame is NaN there, its residual counts as infinite, and the check
        # fails instead of the SVD raising on a NaN input
        defined = np.all(np.isfinite(direction), axis=(-2, -1))
        W_expected = np.full_like(W, np.nan)
        W_expected[defined] = polar_retract(W[defined], -length * direction[defined], "svd", validate=False)
        phi = manifold_tolerance(d, r)
        bound = (2 * polar_error_bound(d, r, math.sqrt(1 + length**2))
                 + 2 * polar_perturbation_bound((gamma(d * r) + 8 * u) * length, 1 - 2 * phi))
        if not precision.is_float64:
            bound = bound + precisions.evaluation_bound(W, G, ri.init(W), config, precision)["W"]
        check.add(frobenius(W_step - W_expected), bound, shape=(d, r), key=key, seed=seed,
                  extra={"config": config_index, "first_frame_of_config": int(frames_of_config[0])})
    return Evidence(checks=[check], frames=count)


def first_step_check(seed: int, profile: Profile, optimizer, frames: int | None = None, large=LARGE_SHAPES) -> Evidence:
    """The first step of `optimizer` from a fresh state against R_W(-min(lr sqrt(d r), Delta) P_W(G)/||P_W(G)||).

    Each chunk of frames is split in halves, one per configuration of FIRST_STEP_CONFIGS; one task
    per chunk (first_step_chunk), merged in chunk order. frames / large: the shape plan's total and
    large shapes (controls run on a smaller plan). d = r = 1 (T_W = {0}: P_W(G) = 0) is outside the
    claim's hypothesis and left out.
    """
    batches = [batch for batch in shape_plan(profile, frames=frames, large=large) if tangent_dimension(batch.d, batch.r) > 0]
    evidence = map_evidence(first_step_chunk, batch_chunks(batches, _two_or_more), seed, optimizer, task_label="first_step_check")
    if not evidence.checks:  # no chunk: the check says so with no samples
        evidence.checks.append(_first_step_check(optimizer))
    return evidence


def _two_or_more(batch) -> Iterator[int]:
    return chunk_sizes(max(batch.count, 2), batch.d, batch.r)


def slope_figures(curves: list[dict]) -> dict:
    """The report's slope plot: one log-log figure per slope test, each frame's error curve and the
    window its slope was located in (kit.figures.LineFigure)."""
    figures = {}
    for name in dict.fromkeys(c["name"] for c in curves):
        series = []
        for curve in (c for c in curves if c["name"] == name):
            s_values, errors = np.asarray(curve["s"]), np.asarray(curve["error"], dtype=float)
            label = f"{tuple(curve['shape'])}: slope {curve['slope']:.3g} over {curve['decades']:.3g} decades"
            series.append(Series(s_values.tolist(), errors.tolist(), label))
            low, high = curve["window"]  # nan when no window was found: nothing is marked
            inside = (s_values >= low) & (s_values <= high)
            if inside.any():
                series.append(Series(s_values[inside].tolist(), errors[inside].tolist(), "located window"))
        figures[f"slope_{name}"] = LineFigure(
            title=f"slope test: {name} (expected slope {next(c['expected_slope'] for c in curves if c['name'] == name)})",
            xlabel="s", ylabel="error", series=series, logx=True, logy=True,
        )
    return figures


# --------------------------------------------------------------------------------------------
# The claim
# --------------------------------------------------------------------------------------------


def projector_part(ctx: Context) -> Evidence:
    """The projector identities and the gap identity (projector_checks)."""
    return projector_checks(ctx.seed, ctx.profile)


def minimiser_part(ctx: Context) -> Evidence:
    """The minimiser from an independent basis of T_W (minimiser_check)."""
    return minimiser_check(ctx.seed, ctx.profile)


def first_step_part(ctx: Context) -> Evidence:
    """The first step of the optimizer under test against the steepest-descent step."""
    evidence = first_step_check(ctx.seed, ctx.profile, ctx.optimizer)
    evidence.extra["first_step_configs"] = [{"lr": c.lr, "betas": list(c.betas), "eps": c.eps, "trust_radius": c.trust_radius}
                                            for c in FIRST_STEP_CONFIGS]
    return evidence


def slope_part(ctx: Context) -> Evidence:
    """The three slope tests of the retraction and of the expansion of f, with their figures."""
    slopes, curves, slope_summary = slope_tests(ctx.seed, ctx.profile)
    grid = {"min": float(SLOPE_GRID[0]), "max": float(SLOPE_GRID[-1]), "points": len(SLOPE_GRID)}
    return Evidence(
        checks=slopes,
        figures=slope_figures(curves),
        extra={"slope_tests": {"grid": grid, "slope_tol": SLOPE_TOL, "min_decades": MIN_DECADES,
                               "floor_factor": FLOOR_FACTOR, "results": slope_summary}},
    )


def first_step_control(ctx: Context) -> Evidence:
    """A control (ctx.optimizer) through the first-step check on the control plan: a tenth of the
    frames and the cheaper large shapes (CONTROL_LARGE_SHAPES)."""
    evidence = first_step_check(ctx.seed, ctx.profile, ctx.optimizer, frames=ctx.profile.control_frames, large=CONTROL_LARGE_SHAPES)
    return Evidence(checks=evidence.checks)


def float32_control(ctx: Context) -> Evidence | None:
    """A float32 port's mistake (kit/float32_step.CONTROLS), run where the optimizer under test is held
    to bounds at float32 (compute dtype float32): through the first-step check on the control plan,
    then, where that does not detect it (a mistake that shows from the second step on), through the
    trajectories against the model on P1's plan. Not run for a float64 optimizer, whose bounds the
    float64 controls hold."""
    under_test = precisions.of(get_variant(ctx.under_test)) if ctx.under_test is not None else precisions.FLOAT64
    if under_test.compute != "float32":
        return None
    variant = float32_step.CONTROLS[ctx.optimizer]
    found = first_step_check(ctx.seed, ctx.profile, variant, frames=ctx.profile.control_frames, large=CONTROL_LARGE_SHAPES)
    if ControlResult.from_checks(variant.name, "", found.checks).detected:
        return Evidence(checks=found.checks)
    trajectories = trajectory_evidence(ctx.with_optimizer(variant), TRAJECTORIES)
    return Evidence(checks=found.checks + trajectories.checks)


CLAIM = Claim(
    id=CLAIM_ID,
    title="Steepest descent in the embedded metric",
    statement=STATEMENT,
    latex=LATEX,
    symbolic=Symbolic(SYMBOLIC_METHOD, symbolic_derivation),
    exact=exact_part,
    parts=(
        Part("projector", projector_part),
        Part("minimiser", minimiser_part),
        Part("first_step", first_step_part),
        Part("slopes", slope_part),
        trajectory_part(TRAJECTORIES),  # the optimizer's own trajectories against the model
    ),
    controls=(
        Control("canonical_metric_gradient", first_step_control),
        Control("projection_without_sym", first_step_control),
        *(Control(name, float32_control, variant.description) for name, variant in float32_step.CONTROLS.items()),
    ),
    notes=(
        f"The independent minimiser (null-space basis of T_W) runs on the small shapes with d r <= "
        f"{MINIMISER_MAX_DR}; its cost is O((d r)^3) per frame. Larger shapes are covered by the "
        "projector checks, the gap identity and the first-step check.",
        "d = r = 1 has T_W = {0}: P_W(G) = 0 for every G, outside the claim's hypothesis; it is "
        "covered by the projector identities only.",
    ),
)
