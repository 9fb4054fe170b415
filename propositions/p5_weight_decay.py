"""P5: coupled weight decay has identically zero Riemannian gradient on St(d, r).

Claim
    P_W(W) = W - W sym(W^T W) = 0 for every W on St(d, r), because W = W I_r lies in the normal
    space N_W = {W S : S = S^T}. Consequences: (i) the StiefelAdam step with any weight decay
    lambda equals the step with lambda = 0 (stage 2 projects G + lambda W to P_W(G)), for one step
    and along whole trajectories; (ii) a decoupled decay W <- (1 - lr lambda) W followed by the
    polar retraction returns W exactly (the polar factor of a positive multiple of a frame is the
    frame); (iii) ||W||_F^2 = tr(W^T W) = r is constant on St(d, r), hence along every trajectory.

Why it is true
    sym(W^T W) = I_r on the manifold, so W sym(W^T W) = W. P_W is linear, so P_W(G + lambda W) =
    P_W(G) + lambda P_W(W) = P_W(G). polar(alpha W) = alpha W ((alpha W)^T (alpha W))^(-1/2) =
    alpha W (alpha^2 I)^(-1/2) = W for alpha > 0.

How it is checked
    * symbolically with sympy MatrixSymbols under the substitution W^T W = I (and at explicit
      2 x 1 and 2 x 2 frames written with cos and sin);
    * exactly, with zero tolerance, at rational Stiefel points (Cayley transform,
      reference_impl.exact);
    * in float64 over shape_plan(profile): fl(P_W(W)); one step with lambda against the step with
      lambda = 0 from the same state, lambda over 1e-6 .. 1e3 and gradients over six decades;
      the same comparison at every step of multi-step trajectories (profile.steps); polar of a
      decoupled decay; | ||W_t||^2 - r | along the trajectories. Every residual is compared with
      the bound derived next to it (functions *_bound below).

What would make it fail
    A step that lets lambda W reach W: the decay term added after the projection (control
    "unprojected_decay"), or Euclidean AdamW (control "euclidean_adamw": W <- (1 - lr lambda) W
    with no projection or retraction, so ||W|| shrinks by (1 - lr lambda) per step and the step
    depends on lambda). Both are run through the same checks, and must miss the bounds by at least
    DETECTION_FACTOR. The `optimizer` argument of `CLAIM.run` puts one of them in place of the real step:
    the verdict is then "fail".
"""

from __future__ import annotations

import math

import numpy as np
import sympy as sp

from reference_impl import UNIT_ROUNDOFF, get_variant, manifold_tolerance, random_point
from reference_impl.adam import StiefelAdamConfig, StiefelAdamState, frobenius
from reference_impl.manifold import polar_retract, project_tangent

from .kit import precision as precisions
from .kit import observability, tightness
from .kit.figures import LineFigure, Series
from .kit.protocol import Claim, Context, Control, Evidence, Part, Symbolic, map_evidence
from .kit.symbolic import is_zero
from .kit.bounds import POLAR_ERROR_TEXT, PROJECTION_TEXT, gamma, polar_error_bound, polar_perturbation_bound, projection_error_bound
from .kit.trajectories import TrajectoryPlan, TrajectorySetting, trajectory_part
from ._common import LARGE_SHAPES, NumericalCheck, Profile, SymbolicStep, batch_chunks, chunk_frames, rng_for, shape_plan

u = UNIT_ROUNDOFF
CLAIM_ID = "P5"

# The optimizer's own trajectories held to the model (kit/trajectories.py), this claim's settings:
# weight decay on and off, with gradients of every kind; d = r = 1, where T_W = {0} and every
# gradient is normal (eps > 0 or a warm state: the noise-driven step of docs/algorithm.md#pitfalls)
TRAJECTORIES = TrajectoryPlan(CLAIM_ID, (
    TrajectorySetting("decay_fresh", 0.5, 1.0, 1e-8, "gaussian", "fresh", weight_decay=0.1),
    TrajectorySetting("decay_normal_gradient_warm", 0.5, 0.5, 0.0, "normal", "warm", weight_decay=10.0),
    TrajectorySetting("decay_zero_gradient_fresh", 0.5, 0.3, 1e-4, "zero", "fresh", weight_decay=1.0),
    TrajectorySetting("no_decay_warm", 0.5, 1.0, 1e-8, "gaussian", "warm"),
), ((1, 1), (2, 1), (4, 4), (5, 2), (12, 5)))

# Weight decays of the numerical part: nine decades, from negligible to a decay term that
# dominates any gradient in the plan by orders of magnitude.
LAMBDA_GRID = tuple(float(x) for x in np.logspace(-6.0, 3.0, 4))
# Gradient scale per frame: log10 uniform on [-3, 3] (gradients of wide scale).
GRADIENT_LOG10_SCALE = (-3.0, 3.0)
# Learning rate per chunk: log10 uniform on [-4, -1], capped so that lr lambda <= 1/2 (a decoupled
# decay factor 1 - lr lambda in [1/2, 1), as any AdamW user would set it; the real step does not
# care, the Euclidean AdamW control would otherwise flip the sign of W); other hyper-parameters at
# their defaults.
LR_LOG10 = (-4.0, -1.0)
MAX_DECAY_PER_STEP = 0.5
# Trajectories run on a quarter of each lambda group (at least one frame), on the shapes with
# d r^2 <= TRAJECTORY_MAX_COST: the (1024, 128) frames (one retraction ~ 0.05 s here) get the
# one-step check only, which keeps the default profile within its time budget.
TRAJECTORY_FRACTION = 4
TRAJECTORY_MAX_COST = 2**18
CONTROLS = ("euclidean_adamw", "unprojected_decay")



# --------------------------------------------------------------------------------------------
# Bounds (each from the error analysis in its docstring)
# --------------------------------------------------------------------------------------------


def decay_projection_bound(d: int, r: int) -> float:
    """Bound on ||fl(P_W(W))||_F for a float64 frame with ||W^T W - I||_F <= phi.

    In exact arithmetic on the float frame, L_W(W) = W (I - W^T W), norm <= ||W||_2 phi <=
    (1 + phi) phi; rounding adds projection_error_bound(d, r) ||W||_F <= projection_error_bound sqrt(r)
    (1 + phi). phi = manifold_tolerance(d, r) is the feasibility every frame of the reference
    satisfies (reference_impl._validation). The factor 2 covers the dropped O(u^2) terms.
    """
    phi = manifold_tolerance(d, r)
    return 2.0 * ((1.0 + phi) * phi + projection_error_bound(d, r) * math.sqrt(r) * (1.0 + phi))


def decay_gradient_difference_bound(d: int, r: int, gradient_norm, weight_decay: float):
    """Bound on ||fl(P_W(G + lambda W)) - fl(P_W(G))||_F (shape of gradient_norm).

    L_W(G + lambda W + e1) - L_W(G) = lambda L_W(W) + L_W(e1): ||lambda L_W(W)|| <= lambda (1 + phi)
    phi; e1, the rounding of G + lambda W, has ||e1|| <= u (||G|| + 2 lambda sqrt r) and
    ||L_W|| <= 1 + 3 phi. The two evaluations of P_W add projection_error_bound (||G + lambda W|| +
    ||G||) <= projection_error_bound (2 ||G|| + lambda sqrt(r) (1 + phi)).
    """
    phi = manifold_tolerance(d, r)
    root_r = math.sqrt(r)
    lam = weight_decay
    return (
        lam * (1.0 + phi) * phi
        + (1.0 + 3.0 * phi) * u * (gradient_norm + 2.0 * lam * root_r)
        + projection_error_bound(d, r) * (2.0 * gradient_norm + lam * root_r * (1.0 + phi))
    )


def step_difference_bound(W, G, state, config: StiefelAdamConfig, weight_decay: float) -> np.ndarray:
    """Bound on ||W+(lambda) - W+(0)||_F for one StiefelAdam step from the same (W, state), per frame.

    W, G: (..., d, r) float64; state: (m, v, t) before the step (a (..., d, r) second moment of a
    control is reduced to its mean: the bound is the real step's analysis evaluated at the state).

    The two steps' directions differ by at most dxi (direction_difference_bound: the moments, the
    scale-free step and the trust-region clip, stage by stage). The polar factor moves by at most
    polar_perturbation_bound(||dxi||, 1 - 2 phi) = ||dxi|| / (1 - 2 phi) (kit/bounds.py): every
    point of the segment between the two W + xi is W plus a vector tangent up to rounding, whose
    smallest singular value is at least 1 - 2 phi (P3(b) at a frame within phi), and each of the two retractions rounds by polar_error_bound (kit/bounds.py) at that condition
    number.

    d = r = 1 (the analysis divides by sqrt(v^), which is 0 there): St(1, 1) = {-1, +1} and
    T_W = {0}. A float frame w has |w^2 - 1| <= phi, so |w| >= 1 - phi. Whatever either step's xi
    is (rounding noise of P_W, amplified by the scale-free step), the trust region keeps |xi| <= Delta,
    and for Delta < 1 - phi the polar factor of w + xi is sign(w + xi) = sign(w) in both runs: the
    exact results are equal. The 1 x 1 SVD returns |a| and the signs exactly; the bound allows each
    retraction its general rounding, 2 polar_error_bound(1, 1, 1), finite and > 0. (For Delta >= 1 - phi
    the general bound applies, infinite where v^ = 0.)
    """
    d, r = W.shape[-2], W.shape[-1]
    phi = manifold_tolerance(d, r)
    dxi, xi_norm = direction_difference_bound(W, G, state, config, weight_decay)
    step_norm = np.minimum(xi_norm, config.trust_radius)
    cond = np.sqrt(1.0 + step_norm**2) / (1.0 - 2.0 * phi)
    bound = polar_perturbation_bound(dxi, 1.0 - 2.0 * phi) + 2.0 * polar_error_bound(d, r, cond)
    if d == 1 and r == 1 and config.trust_radius < 1.0 - phi:
        return np.full(np.shape(bound), 2.0 * float(polar_error_bound(1, 1, 1.0)))
    # A zero mean square (G = 0) makes the analysis vacuous; no frame of the plan has G = 0, and an
    # infinite bound would show in the statistics rather than pass silently as a small number.
    return np.where(np.isfinite(bound), bound, np.inf)


def direction_difference_bound(W, G, state, config: StiefelAdamConfig, weight_decay: float):
    """(dxi, ||xi||): a bound on ||xi(lambda) - xi(0)||_F between the clipped step directions of the
    steps with lambda and with 0 from the same (W, state), and the unclipped length ||xi(0)||, per frame.

    Stage by stage (hat quantities at lambda = 0; delta_g from decay_gradient_difference_bound):
      m^ differs by (1 - beta1) delta_g / (1 - beta1^t); v^ by (1 - beta2) (2 ||g|| delta_g +
      delta_g^2) / (d r (1 - beta2^t)). With s = sqrt(v^) + eps and s_low = sqrt(v^ - dv^) + eps,
      ||xi(lambda) - xi(0)|| <= lr (dm^ / s_low + ||m^|| dv^ / (sqrt(v^) s s_low)): the scale-free
      step turns lambda times the rounding residual of P_W(W) into a relative error of order
      delta_g / ||g||, independent of the scale of G.
      Each evaluation of xi rounds: the mean square is a length-d r sum (gamma_{dr}, halved by the
      square root), the moment updates, bias corrections, sqrt, division and lr add <= 8u, plus
      3u (beta1 ||m|| + (1 - beta1) ||g||) lr / ((1 - beta1^t) s) for m itself; twice (two steps).
      The trust-region clip is the projection onto a ball (1-Lipschitz) and rounds by
      (gamma_{dr}/2 + 3u) ||xi|| per step.
    """
    d, r = W.shape[-2], W.shape[-1]
    beta1, beta2 = config.betas
    lr, eps = config.lr, config.eps
    t = state.t + 1
    g0 = project_tangent(W, G, validate=False)
    g_norm = frobenius(g0)
    delta_g = decay_gradient_difference_bound(d, r, frobenius(G), weight_decay)
    v_state = np.asarray(state.v, dtype=np.float64)
    if v_state.ndim == W.ndim:
        v_state = v_state.mean(axis=(-2, -1))
    m_norm_state = frobenius(state.m)
    m_hat_norm = frobenius(beta1 * state.m + (1 - beta1) * g0) / (1 - beta1**t)
    v_hat = (beta2 * v_state + (1 - beta2) * g_norm**2 / (d * r)) / (1 - beta2**t)
    dm_hat = (1 - beta1) * delta_g / (1 - beta1**t)
    dv_hat = (1 - beta2) * (2.0 * g_norm * delta_g + delta_g**2) / (d * r * (1 - beta2**t))
    root_v = np.sqrt(v_hat)
    s = root_v + eps
    s_low = np.sqrt(np.maximum(v_hat - dv_hat, 0.0)) + eps
    with np.errstate(divide="ignore", invalid="ignore"):
        dxi_exact = lr * (dm_hat / s_low + m_hat_norm * dv_hat / (root_v * s * s_low))
        xi_norm = lr * m_hat_norm / s
        xi_rounding = xi_norm * (gamma(d * r) / 2 + 8 * u) + lr * 3 * u * (
            beta1 * m_norm_state + (1 - beta1) * g_norm
        ) / ((1 - beta1**t) * s)
    clip_rounding = np.minimum(xi_norm, config.trust_radius) * (gamma(d * r) / 2 + 3 * u)
    return dxi_exact + 2.0 * (xi_rounding + clip_rounding), xi_norm


def decoupled_decay_bound(d: int, r: int) -> float:
    """Bound on ||polar(fl(alpha W)) - W||_F for 0 < alpha <= 1.

    Exactly, polar(alpha W) = polar(W), and ||polar(W) - W||_F = ||Sigma - I||_F <= ||W^T W - I||_F
    <= phi (|sigma - 1| <= |sigma^2 - 1|). fl(alpha W) = alpha W + dA with |dA| <= u alpha |W|,
    ||dA||_F <= u alpha sqrt(r) (1 + phi), and every matrix of the segment [alpha W, alpha W + dA]
    has sigma_min >= alpha (1 - 2 phi): the polar factor moves by at most
    polar_perturbation_bound(u sqrt(r) (1 + phi), 1 - 2 phi) (kit/bounds.py); the retraction rounds by
    polar_error_bound (kit/bounds.py) at condition 1 + 2 phi. Factor 2 for the dropped O(u^2).
    """
    phi = manifold_tolerance(d, r)
    moved = float(polar_perturbation_bound(u * math.sqrt(r) * (1 + phi), 1 - 2 * phi))
    return 2.0 * (phi + moved + float(polar_error_bound(d, r, 1 + 2 * phi)))


def norm_constant_bound(d: int, r: int) -> float:
    """Bound on | fl(||W||_F^2) - r | for a frame returned by the polar retraction.

    ||W||^2 - r = tr(W^T W - I) <= sqrt(r) ||W^T W - I||_F <= sqrt(r) phi: each W_t is a freshly
    computed polar factor of the actual matrix W + xi, so its feasibility is that of one retraction
    (phi = manifold_tolerance(d, r)) and does not accumulate over steps. The sum of d r squares
    rounds by gamma_{dr} ||W||^2 <= gamma_{dr} r (1 + phi). Factor 2 for the dropped O(u^2).
    """
    phi = manifold_tolerance(d, r)
    return 2.0 * (math.sqrt(r) * phi + gamma(d * r) * r * (1.0 + phi))


# --------------------------------------------------------------------------------------------
# Symbolic and exact tiers
# --------------------------------------------------------------------------------------------


SYMBOLIC_METHOD = ("sympy MatrixSymbol algebra with W^T W = I_r; explicit cos/sin frames; the code's "
                   "project_tangent executed on exact symbolic entries (propositions.kit.symbolic)")


def symbolic_derivation() -> list[SymbolicStep]:
    """The derivation with MatrixSymbols (d, r symbolic) and at explicit 2 x 1 and 2 x 2 frames, then
    the code's project_tangent executed on exact symbolic entries."""
    from .kit.symbolic import weight_decay_steps

    return _matrix_symbol_steps() + _explicit_frame_steps() + weight_decay_steps()


def _matrix_symbol_steps() -> list[SymbolicStep]:
    """P_W(W) = 0, the linearity of P_W, polar(alpha W) = W and ||W||^2 = r with MatrixSymbols."""
    steps = []
    d, r = sp.symbols("d r", integer=True, positive=True)
    W = sp.MatrixSymbol("W", d, r)
    G = sp.MatrixSymbol("G", d, r)
    lam = sp.Symbol("lambda", positive=True)
    alpha = sp.Symbol("alpha", positive=True)
    identity = sp.Identity(r)

    def sym(A):
        return (A + A.T) / 2

    def project(H):
        return H - W * sym(W.T * H)

    def on_manifold(expr):
        return sp.expand(expr).subs(W.T * W, identity)

    decay_projection = on_manifold(project(W))
    steps.append(
        SymbolicStep(
            "P_W(W) = W - W sym(W^T W) = W - W I_r = 0 under W^T W = I",
            r"P_W(W) = W - W\,\mathrm{sym}(W^\top W) = W - W I_r = 0",
            is_zero(decay_projection),
        )
    )
    linearity = sp.expand(project(G + lam * W) - project(G) - lam * project(W))
    steps.append(
        SymbolicStep(
            "P_W is linear: P_W(G + lambda W) - P_W(G) - lambda P_W(W) = 0 (no constraint needed)",
            r"P_W(G + \lambda W) - P_W(G) - \lambda P_W(W) = 0",
            is_zero(linearity),
        )
    )
    step_invariance = on_manifold(project(G + lam * W) - project(G))
    steps.append(
        SymbolicStep(
            "hence the coupled decay never reaches the step: P_W(G + lambda W) = P_W(G)",
            r"P_W(G + \lambda W) - P_W(G) = \lambda P_W(W) = 0",
            is_zero(step_invariance),
        )
    )
    decayed_gram = on_manifold((alpha * W).T * (alpha * W)) - alpha**2 * identity
    inverse_root = 1 / sp.sqrt(alpha**2)
    polar_of_decayed = (alpha * W) * inverse_root - W
    steps.append(
        SymbolicStep(
            "polar(alpha W) = alpha W ((alpha W)^T alpha W)^(-1/2) = alpha W (alpha^2 I)^(-1/2) = W, alpha > 0",
            r"(\alpha W)^\top (\alpha W) = \alpha^2 I_r,\quad \alpha W (\alpha^2 I_r)^{-1/2} = W",
            is_zero(decayed_gram) and is_zero(polar_of_decayed),
        )
    )
    norm = sp.Trace(W.T * W).subs(W.T * W, identity).doit() - r
    steps.append(
        SymbolicStep(
            "||W||_F^2 = tr(W^T W) = tr(I_r) = r",
            r"\|W\|_F^2 = \operatorname{tr}(W^\top W) = \operatorname{tr}(I_r) = r",
            sp.simplify(norm) == 0,
        )
    )
    return steps


def _explicit_frame_steps() -> list[SymbolicStep]:
    """P_W(W) = 0 at explicit frames written with cos and sin."""
    theta, phi = sp.symbols("theta phi", real=True)
    column = sp.Matrix([sp.cos(theta), sp.sin(theta)])
    rotation = sp.Matrix([[sp.cos(phi), -sp.sin(phi)], [sp.sin(phi), sp.cos(phi)]])
    reflection = sp.Matrix([[sp.cos(phi), sp.sin(phi)], [sp.sin(phi), -sp.cos(phi)]])

    def explicit_projection(F):
        gram = F.T * F
        return F - F * (gram + gram.T) / 2

    explicit = [explicit_projection(F).applyfunc(sp.trigsimp) for F in (column, rotation, reflection)]
    return [
        SymbolicStep(
            "explicit frames (cos t, sin t)^T in St(2,1) and rotation / reflection in O(2) (det +1, -1): P_W(W) = 0",
            r"P_W(W) = 0\ \text{for } W = (\cos\theta, \sin\theta)^\top,\ "
            r"\begin{pmatrix}\cos\varphi & \mp\sin\varphi\\ \sin\varphi & \pm\cos\varphi\end{pmatrix}",
            all(is_zero(M) for M in explicit),
        )
    ]


EXACT_SHAPES = ((1, 1), (2, 1), (3, 2), (3, 3))
EXACT_SAMPLES_PER_SHAPE = 2


def exact_checks(seed: int) -> list[dict]:
    """The identities with zero tolerance at rational frames (Cayley transform, both components)."""
    from reference_impl import exact

    records = {
        "decay_projection_zero": "P_W(W) = 0 exactly at rational frames",
        "step_weight_decay_invariance": "P_W(G + lambda W) = P_W(G) exactly, rational G and lambda",
        "decoupled_decay_polar": "(alpha W)^T (alpha W) = alpha^2 I, so polar(alpha W) = W exactly, rational alpha",
        "norm_constant": "tr(W^T W) = r exactly",
    }
    passed = {name: True for name in records}
    samples = 0
    for d, r in EXACT_SHAPES:
        rng = rng_for(seed, CLAIM_ID, "exact", d, r)
        for _ in range(EXACT_SAMPLES_PER_SHAPE):
            W = exact.rational_point(d, r, rng)
            G = exact.rational_matrix(d, r, rng)
            lam = sp.Rational(int(rng.integers(1, 1000)), int(rng.integers(1, 50)))
            alpha = sp.Rational(int(rng.integers(1, 50)), 50)
            passed["decay_projection_zero"] &= exact.is_zero(exact.project_tangent(W, W))
            passed["step_weight_decay_invariance"] &= exact.is_zero(
                exact.project_tangent(W, G + lam * W) - exact.project_tangent(W, G)
            )
            gram = (alpha * W).T * (alpha * W)
            # the polar factor (alpha W) gram^(-1/2), with sympy's principal matrix power of the
            # exact Gram matrix (not a hand-simplified 1/alpha), must be W itself
            polar = (alpha * W) * gram ** sp.Rational(-1, 2)
            passed["decoupled_decay_polar"] &= exact.is_zero(gram - alpha**2 * sp.eye(r)) and exact.is_zero(polar - W)
            passed["norm_constant"] &= (W.T * W).trace() - r == 0
            samples += 1
    return [
        {"name": name, "description": description, "samples": samples, "passed": bool(passed[name])}
        for name, description in records.items()
    ]


# --------------------------------------------------------------------------------------------
# Numerical tier
# --------------------------------------------------------------------------------------------


def _new_checks(prefix: str = "") -> dict[str, NumericalCheck]:
    return {
        "step_weight_decay_invariance": NumericalCheck(
            prefix + "step_weight_decay_invariance",
            "||step(W, G, state; lambda) - step(W, G, state; 0)||_F, one step from a fresh state, "
            f"lambda in {list(LAMBDA_GRID)}, ||G|| over six decades",
            "step_difference_bound: lambda times the rounding residual of P_W(W) plus the rounding of "
            "two projections, relative to ||g|| in the scale-free step, through the 1-Lipschitz trust "
            "region and the 1/sigma_min-Lipschitz polar factor (polar_perturbation_bound), plus two retractions' rounding, each "
            + POLAR_ERROR_TEXT,
            tightness_note=tightness.SAME_ROUNDING,
        ),
        "trajectory_weight_decay_invariance": NumericalCheck(
            prefix + "trajectory_weight_decay_invariance",
            "at every step of a trajectory run with lambda, ||step(.; lambda) - step(.; 0)||_F from the "
            "same (W_t, state_t) (non-fresh m, v, t)",
            "step_difference_bound evaluated at the trajectory's state (same analysis as one step)",
            tightness_note=tightness.SAME_ROUNDING,
        ),
        "gradient_weight_decay_invariance": NumericalCheck(
            prefix + "gradient_weight_decay_invariance",
            "||fl(P_W(G + lambda W)) - fl(P_W(G))||_F with the reference's project_tangent, every frame of the "
            "one-step comparison",
            "decay_gradient_difference_bound: lambda times the rounding residual of P_W(W), the rounding of "
            "G + lambda W through ||L_W|| <= 1 + 3 phi, and two projections' rounding",
        ),
        "direction_weight_decay_invariance": NumericalCheck(
            prefix + "direction_weight_decay_invariance",
            "||xi(lambda) - xi(0)||_F, the clipped directions of the two steps from the same (W, state) (an "
            "optimizer whose steps expose their direction), one step and along the trajectories",
            "direction_difference_bound: the gradient difference carried through the moments, the "
            "scale-free step (a relative error of order delta_g / ||g||) and the 1-Lipschitz clip, plus "
            "each evaluation's rounding",
        ),
        "norm_constant": NumericalCheck(
            prefix + "norm_constant",
            "| ||W_t||_F^2 - r | after the first step (every frame) and along the trajectories run with lambda",
            "norm_constant_bound: sqrt(r) times one retraction's feasibility plus the rounding of a "
            "length-d r sum of squares",
        ),
    }


def _optimizer_chunk(chunk, seed: int, profile: Profile, optimizer: str, prefix: str, key: str) -> Evidence:
    """One chunk (d, r, count, chunk index, batch index) of _optimizer_checks: split into one group
    per weight decay of LAMBDA_GRID (_lambda_group), the grid entry rotating with the batch, the
    chunk and the group."""
    d, r, count, chunk_index, shape_index = chunk
    variant = get_variant(optimizer)
    checks = _new_checks(prefix)
    groups = np.array_split(np.arange(count), min(len(LAMBDA_GRID), count))
    for group_index, group in enumerate(groups):
        lam = LAMBDA_GRID[(shape_index + chunk_index + group_index) % len(LAMBDA_GRID)]
        draw_key = (CLAIM_ID, key, d, r, chunk_index, group_index)
        _lambda_group(checks, variant, seed, profile.steps, d, r, len(group), lam, draw_key)
    return Evidence(checks=list(checks.values()), frames=count)


def _optimizer_checks(seed: int, profile: Profile, optimizer: str, frames: int, prefix: str, key: str,
                      large=LARGE_SHAPES) -> Evidence:
    """Steps of `optimizer` with lambda against lambda = 0 (one step and trajectories), ||W_t||^2.

    The three checks (step, trajectory, norm) over shape_plan(profile, large=large, frames=frames),
    one task per chunk (_optimizer_chunk), merged in chunk order.
    """
    chunks = [(d, r, count, index, shape_index)
              for shape_index, batch in enumerate(shape_plan(profile, large=large, frames=frames))
              for d, r, count, index in batch_chunks([batch])]
    return map_evidence(_optimizer_chunk, chunks, seed, profile, optimizer, prefix, key, task_label="_optimizer_checks")


def _lambda_group(checks, variant, seed: int, steps: int, d: int, r: int, size: int, lam: float, draw_key: tuple) -> None:
    """One step with weight decay lam against lam = 0 on `size` fresh frames, then `steps`-step
    trajectories on a subset (TRAJECTORY_FRACTION of them, shapes with d r^2 <= TRAJECTORY_MAX_COST),
    compared at every step from the same state; every frame is drawn from rng_for(seed, *draw_key)."""
    rng = rng_for(seed, *draw_key)
    lr_log10_max = min(LR_LOG10[1], math.log10(MAX_DECAY_PER_STEP / lam))
    lr = float(10.0 ** rng.uniform(min(LR_LOG10[0], lr_log10_max), lr_log10_max))
    configs = StiefelAdamConfig(lr=lr, weight_decay=lam), StiefelAdamConfig(lr=lr, weight_decay=0.0)
    trajectory_size = max(1, -(-size // TRAJECTORY_FRACTION)) if d * r * r <= TRAJECTORY_MAX_COST else 0
    W = _random_frames(rng, d, r, size)
    scale = 10.0 ** rng.uniform(*GRADIENT_LOG10_SCALE, size=(size, 1, 1))
    record = dict(seed=seed, key=draw_key, extra={"weight_decay": lam, "lr": lr})
    observable = observability.state_observable(variant)
    # one step from a fresh state on every frame
    G = scale * rng.standard_normal(W.shape)
    state = variant.init(W)
    # a black box's fresh state is, by docs/algorithm.md's init, m = 0, v = 0, t = 0
    fresh = state if observable else StiefelAdamState(m=np.zeros_like(W), v=np.zeros(W.shape[:-2]), t=0)
    _step_pair(checks, "step_weight_decay_invariance", variant, W, G, state, fresh, configs, None, **record)
    checks["step_weight_decay_invariance"].reach("log10_weight_decay", math.log10(lam))
    checks["step_weight_decay_invariance"].reach("log10_gradient_scale", np.log10(scale))
    if trajectory_size == 0:
        return
    if not observable:  # the bound of a later step reads the state the step holds
        observability.record(checks["trajectory_weight_decay_invariance"].name,
                             "the bound of a step after the first is written in the optimizer's hidden m, v, t")
        return
    # trajectories on a subset: compare at every step from the same state
    W_t = W[:trajectory_size]
    state_t = variant.init(W_t)
    for step_index in range(steps):
        G_t = scale[:trajectory_size] * rng.standard_normal(W_t.shape)
        W_t, state_t = _step_pair(checks, "trajectory_weight_decay_invariance", variant, W_t, G_t, state_t, state_t,
                                  configs, step_index, **record)
    checks["trajectory_weight_decay_invariance"].reach("log10_weight_decay", math.log10(lam))
    checks["trajectory_weight_decay_invariance"].reach("steps", steps)


def _step_pair(checks, name: str, variant, W, G, state, bound_state, configs, step: int | None, *, seed, key, extra):
    """The steps with lambda and with 0 (configs) from the same (W, state): their distance against
    step_difference_bound at bound_state (check `name`), and | ||W+||^2 - r | of the step with lambda
    (norm_constant). step: the trajectory's step index, None for the one step from a fresh state.
    Returns the step with lambda, (W+, state+)."""
    config, config_free = configs
    d, r = W.shape[-2], W.shape[-1]
    precision = precisions.of(variant)
    hook = getattr(variant, "step_with_direction", None) if precision.is_float64 else None
    if hook is not None:
        # the same steps, with the directions they applied: the bound's stages held one by one
        W_decayed, state_decayed, xi_decayed = hook(W, G, state, config)
        W_free, _, xi_free = hook(W, G, state, config_free)
        dxi, _ = direction_difference_bound(W, G, bound_state, config, config.weight_decay)
        checks["direction_weight_decay_invariance"].add(
            frobenius(xi_decayed - xi_free), np.where(np.isfinite(dxi), dxi, np.inf),
            shape=(d, r), key=key, seed=seed, extra=extra if step is None else {**extra, "step": step},
        )
    else:
        W_decayed, state_decayed = variant.step(W, G, state, config)
        W_free, _ = variant.step(W, G, state, config_free)
        observability.record(checks["direction_weight_decay_invariance"].name,
                             "the optimizer's steps do not expose the direction they applied" if precision.is_float64 else
                             "direction_difference_bound is written for float64 evaluations")
    if step is None:
        lam = config.weight_decay
        projected = project_tangent(W, G + lam * W, validate=False) - project_tangent(W, G, validate=False)
        checks["gradient_weight_decay_invariance"].add(
            frobenius(projected), decay_gradient_difference_bound(d, r, frobenius(G), lam),
            shape=(d, r), key=key, seed=seed, extra=extra,
        )
    if precision.is_float64:
        bound, norm_bound = step_difference_bound(W, G, bound_state, config, config.weight_decay), norm_constant_bound(d, r)
    else:
        bound, norm_bound = low_precision_bounds(W, G, bound_state, configs, precision)
    checks[name].add(
        frobenius(W_decayed - W_free), bound,
        shape=(d, r), key=key, seed=seed, extra=extra if step is None else {**extra, "step": step},
    )
    checks["norm_constant"].add(
        np.abs(np.sum(W_decayed * W_decayed, axis=(-2, -1)) - r), norm_bound,
        shape=(d, r), key=key, seed=seed, extra={**extra, "step": 0 if step is None else step},
    )
    return W_decayed, state_decayed


def low_precision_bounds(W, G, state, configs, precision):
    """The bounds of _step_pair for an implementation storing in float32 or bfloat16 (kit/precision.py).

    Each evaluation is within its evaluation_bound of the exact step at the float64 (W, G, state) it
    was handed (the rounding to storage is evaluation_bound's input error); the two exact steps differ
    only through lambda P_W(W), which is rounding-level for the float64 frame W, and by at most
    step_difference_bound (the float64 analysis, which bounds two float64 evaluations and so the exact
    difference too). The distance is at most the sum of the three. The step with lambda
    is W+ = Q + D with Q the exact (orthonormal) polar factor and ||D||_F <= E: | ||W+||^2 - r | =
    |2 <Q, D> + ||D||^2| <= 2 sqrt(r) E + E^2, and the checker's float64 sum of d r squares adds
    gamma_{dr} (sqrt(r) + E)^2.
    """
    d, r = W.shape[-2], W.shape[-1]
    config, config_free = configs
    E = precisions.evaluation_bound(W, G, state, config, precision)["W"]
    E_free = precisions.evaluation_bound(W, G, state, config_free, precision)["W"]
    root_r = math.sqrt(r)
    exact_difference = step_difference_bound(W, G, state, config, config.weight_decay)
    return E + E_free + exact_difference, 2 * root_r * E + E**2 + gamma(d * r) * (root_r + E) ** 2


def _random_frames(rng: np.random.Generator, d: int, r: int, count: int) -> np.ndarray:
    """count Haar frames, shape (count, d, r), float64."""
    return random_point(d, r, rng, batch=(count,))


def _manifold_chunk(chunk, seed: int) -> Evidence:
    """fl(P_W(W)) and polar of a decoupled decay on one chunk (d, r, count, chunk index). Optimizer-independent."""
    d, r, count, chunk_index = chunk
    projection = NumericalCheck(
        "decay_projection_zero",
        "||fl(P_W(W))||_F = ||W - W sym(W^T W)||_F for float64 frames",
        "decay_projection_bound: (1 + phi) phi for the float frame's feasibility phi plus the rounding "
        "of one projection, sqrt(r) times " + PROJECTION_TEXT,
    )
    decoupled = NumericalCheck(
        "decoupled_decay_polar",
        "||polar((1 - lr lambda) W) - W||_F with lr lambda log-uniform on [1e-9, 0.9]",
        "decoupled_decay_bound: ||polar(W) - W|| <= phi, one rounding of alpha W through the polar "
        "factor, one retraction's rounding, " + POLAR_ERROR_TEXT,
        tightness_note=tightness.WORST_CASE_SUMS,
    )
    draw_key, rng, W = chunk_frames(seed, CLAIM_ID, "manifold", chunk)
    projection.add(
        frobenius(project_tangent(W, W, validate=False)), decay_projection_bound(d, r),
        shape=(d, r), key=draw_key, seed=seed,
    )
    decay = 10.0 ** rng.uniform(-9.0, math.log10(0.9), size=(count, 1, 1))
    W_decayed = (1.0 - decay) * W
    retracted = polar_retract(W_decayed, np.zeros_like(W), "svd", validate=False)
    decoupled.add(
        frobenius(retracted - W), decoupled_decay_bound(d, r),
        shape=(d, r), key=draw_key, seed=seed,
    )
    return Evidence(checks=[projection, decoupled], frames=count)


def _manifold_checks(seed: int, profile: Profile) -> Evidence:
    """fl(P_W(W)) and polar of a decoupled decay, over shape_plan(profile): one task per chunk
    (_manifold_chunk), merged in chunk order."""
    return map_evidence(_manifold_chunk, batch_chunks(shape_plan(profile)), seed, task_label="_manifold_checks")


FIGURE_SHAPE = (16, 4)
FIGURE_STEPS = 100
FIGURE_LR = 1e-2
FIGURE_WEIGHT_DECAY = 10.0


def norm_figure(seed: int, optimizer: str) -> dict:
    """||W_t||_F over FIGURE_STEPS steps: the optimizer under test against Euclidean AdamW.

    Same frame, same Gaussian gradients, lr = FIGURE_LR, lambda = FIGURE_WEIGHT_DECAY.
    """
    d, r = FIGURE_SHAPE
    rng = rng_for(seed, CLAIM_ID, "figure")
    W0 = _random_frames(rng, d, r, 1)
    gradients = rng.standard_normal((FIGURE_STEPS,) + W0.shape)
    config = StiefelAdamConfig(lr=FIGURE_LR, weight_decay=FIGURE_WEIGHT_DECAY)
    norms = {}
    for name in (optimizer, "euclidean_adamw"):
        variant = get_variant(name)
        W, state = W0, variant.init(W0)
        series = [float(frobenius(W)[0])]
        for G in gradients:
            W, state = variant.step(W, G, state, config)
            series.append(float(frobenius(W)[0]))
        norms[name] = series
    return {
        "weight_norm_step": list(range(FIGURE_STEPS + 1)),
        "weight_norm_optimizer": norms[optimizer],
        "weight_norm_euclidean_adamw": norms["euclidean_adamw"],
        "weight_norm_sqrt_r": [math.sqrt(r)] * (FIGURE_STEPS + 1),
    }


def manifold_part(ctx: Context) -> Evidence:
    """fl(P_W(W)) and polar of a decoupled decay over shape_plan (the chunks of _manifold_checks,
    merged in chunk order): properties of P_W and of the retraction, whatever the optimizer."""
    return _manifold_checks(ctx.seed, ctx.profile)


def steps_part(ctx: Context) -> Evidence:
    """The optimizer's steps with lambda against lambda = 0, one step and trajectories, and ||W_t||^2
    (the chunks of _optimizer_checks over the profile's frames)."""
    return Evidence(
        checks=_optimizer_checks(ctx.seed, ctx.profile, ctx.optimizer, ctx.profile.frames, "", "step").checks,
        extra={
            "weight_decay_grid": list(LAMBDA_GRID),
            "gradient_log10_scale": list(GRADIENT_LOG10_SCALE),
            "lr_log10": list(LR_LOG10),
            "trajectory_steps": ctx.profile.steps,
        },
    )


def figure_part(ctx: Context) -> Evidence:
    """The figure: ||W_t||_F of the optimizer under test against Euclidean AdamW (norm_figure)."""
    figures = norm_figure(ctx.seed, ctx.optimizer)
    optimizer_name = get_variant(ctx.optimizer).name  # a Variant object (an outside implementation) is named
    steps = figures["weight_norm_step"]
    return Evidence(
        extra={
            "figure_settings": {
                "shape": list(FIGURE_SHAPE), "steps": FIGURE_STEPS, "lr": FIGURE_LR,
                "weight_decay": FIGURE_WEIGHT_DECAY, "optimizer": optimizer_name,
            },
            "figure_final_norm": {
                "optimizer": figures["weight_norm_optimizer"][-1],
                "euclidean_adamw": figures["weight_norm_euclidean_adamw"][-1],
                "sqrt_r": math.sqrt(FIGURE_SHAPE[1]),
            },
        },
        figures={
            "weight_norm": LineFigure(
                title=(f"||W_t||_F under weight decay ({FIGURE_SHAPE[0]} x {FIGURE_SHAPE[1]} frame, "
                       f"lr = {FIGURE_LR:g}, lambda = {FIGURE_WEIGHT_DECAY:g})"),
                xlabel="step", ylabel="||W_t||_F",
                series=[
                    Series(steps, figures["weight_norm_optimizer"], optimizer_name),
                    Series(steps, figures["weight_norm_euclidean_adamw"], "euclidean_adamw"),
                    Series(steps, figures["weight_norm_sqrt_r"], "sqrt(r)"),
                ],
            )
        },
    )


def control_part(ctx: Context) -> Evidence:
    """A control (ctx.optimizer) through the step checks, on the small shapes only: a control has to
    miss the bound clearly, not be measured everywhere."""
    name = ctx.optimizer
    frames = ctx.profile.control_frames
    return Evidence(checks=_optimizer_checks(ctx.seed, ctx.profile, name, frames, f"{name}:", f"control:{name}", large=()).checks)


CLAIM = Claim(
    id=CLAIM_ID,
    title="Weight decay has identically zero Riemannian gradient",
    statement=(
        "P_W(W) = W - W sym(W^T W) = 0 on St(d, r). Hence the StiefelAdam step with any weight decay "
        "lambda equals the step with lambda = 0, a decoupled decay W <- (1 - lr lambda) W followed by "
        "the polar retraction returns W, and ||W||_F^2 = r is constant along every trajectory."
    ),
    latex=(
        r"P_W(W) = W - W\,\mathrm{sym}(W^\top W) = 0\ \ \forall W \in \mathrm{St}(d,r);\quad "
        r"P_W(G + \lambda W) = P_W(G);\quad \mathcal{R}_W\big((1-\eta\lambda)W - W\big) = W;\quad \|W\|_F^2 = r"
    ),
    symbolic=Symbolic(SYMBOLIC_METHOD, symbolic_derivation),
    exact=exact_checks,
    parts=(
        Part("manifold", manifold_part),
        Part("steps", steps_part),
        trajectory_part(TRAJECTORIES),
        Part("figure", figure_part),
    ),
    controls=tuple(Control(name, control_part) for name in CONTROLS),
    notes=(
        "decay_projection_zero and decoupled_decay_polar are properties of P_W and of the polar "
        "retraction; they do not depend on the optimizer under test.",
        "euclidean_adamw leaves the manifold; its step accepts any float64 matrix and its states are "
        "not re-validated as frames.",
    ),
)
