"""Projection to the manifold: reference_impl.project_to_manifold returns the nearest frame.

Claim
    For every full-rank A in R^{d x r}, X = project_to_manifold(A) is the point of St(d, r) nearest to
    A in the Frobenius norm: the polar factor of A. Equivalently X^T X = I and X^T A = H is symmetric
    positive definite, with eigenvalues the singular values of A. Consequences: project_to_manifold
    is idempotent (a frame is its own nearest frame), O(d) x O(r)-equivariant
    (project(Q A R) = Q project(A) R) and scale free (project(c A) = project(A), c > 0). This is
    what a user calls to put a frame that drifted back on the manifold, and what the polar retraction
    R_W(xi) = project(W + xi) is.

Why it is true
    For Y on St(d, r), ||A - Y||_F^2 = ||A||_F^2 - 2 tr(Y^T A) + r, so the nearest Y maximises
    tr(Y^T A). With A = U S V^T (thin SVD), tr(Y^T A) = tr(S V^T Y^T U) <= tr(S) (each diagonal
    entry of the r x r matrix V^T Y^T U is at most 1 in absolute value), with equality exactly at
    Y = U V^T when S > 0: the polar factor, for which X^T A = V S V^T. Q A R = (Q U) S (R^T V)^T gives
    the equivariance, c A = U (c S) V^T the scale freedom, and a frame's singular values are all 1.

How it is checked
    * symbolically: the expansion of ||A - Y||^2 at an orthonormal Y (explicit entries), and the
      nearest unit vector to a column a (d = 2, r = 1) is a / ||a||;
    * in float64 over the claim's shape plan, with A a frame plus a perturbation of relative size
      10^U(-12, 0) (a frame that drifted, or one far off), a Gaussian matrix, or a graded matrix
      (singular values from 1 down to 10^-U(0, 8): a route through A^T A has no digit left there),
      times a power of two in 2^U(-300, 300) or left at its scale, and chunks of frames drifted
      alike by 10^U(-12, -2) (a stack of frames projected back): X on St(d, r) (`on_manifold`), skew(X^T A) = 0 (`polar_symmetry`, first-order
      optimality), the eigenvalues of sym(X^T A) against the singular values of A (`polar_factor`:
      the symmetric factor is positive definite, second-order optimality), project(X) against X
      (`idempotent`), project(Q A R) against Q project(A) R for Haar Q, R of both determinants
      (`equivariance`), project(2^k A) against project(A) (`scale_free`). Each bound is derived next to
      its check from the one analysis (propositions/kit/bounds.py: the SVD route of the polar factor,
      its perturbation, the Gram defect).

What would make it fail
    A projection that is a frame but not the nearest one: the sign-fixed QR factor (`qr_projection`:
    X^T A = R is triangular, not symmetric, and the right action is lost), or one that is not a frame:
    columns normalised one by one (`normalized_columns`). Each must miss a bound by DETECTION_FACTOR.
"""

from __future__ import annotations

import math

import numpy as np
import sympy as sp

import reference_impl as ref
from reference_impl import UNIT_ROUNDOFF

from .kit.bounds import feasibility_bound, gamma, polar_error_bound, polar_perturbation_bound, svd_backward_error
from .kit.protocol import Claim, Context, Control, Evidence, Part, Symbolic, map_evidence
from ._common import NumericalCheck, SymbolicStep, batch_chunks, rng_for, shape_plan

u = UNIT_ROUNDOFF
CLAIM_ID = "projection"
RELATIVE_PERTURBATION_LOG10 = (-12.0, 0.0)
SCALE_LOG2 = (-300, 300)
GAUSSIAN_SHARE = 0.25  # of each chunk: A Gaussian, the rest a frame plus a perturbation or a graded matrix
GRADED_SHARE = 0.25  # of each chunk: A = W diag(s) V with singular values s from 1 down to 10^-k
UNSCALED_SHARE = 0.5  # of each chunk: k = 0, matrices at the scale the optimizer hands over (W + xi), where a
# shortcut for inputs already near a frame would act (2^k for k in SCALE_LOG2 hardly ever leaves one there)
NEAR_FRAME_PERIOD = 4  # every 4th chunk of the plan: drifted frames only, unscaled
DRIFT_LOG10 = (-12.0, -2.0)  # their drift: float64 rounding's up to a bfloat16 frame's
DRIFT_BANDS = 5  # taken in turn by the drifted chunks (_matrices)
CONDITION_LOG10 = (0.0, 8.0)  # k: conditioning up to 10^8, where a route through A^T A (cond^2 = 1e16,
# about 1 / u) has no digit left while the SVD route's bounds, which carry cond, stay informative


def _qr_projection(A: np.ndarray) -> np.ndarray:
    return ref.haar_from_gaussian(A)  # the sign-fixed QR factor


def _normalized_columns(A: np.ndarray) -> np.ndarray:
    return A / np.linalg.norm(A, axis=-2, keepdims=True)


def _gram_projection(A: np.ndarray) -> np.ndarray:
    """A (A^T A)^(-1/2) by the eigendecomposition of the Gram matrix in float64: the nearest frame in
    exact arithmetic, but the Gram matrix squares the condition number, so at cond 1e8 (1e16, about
    1 / u) no digit of its small eigenvalues is left; at cond 1e2 it is as good as the SVD route. It
    is told apart only where the claim draws conditioning near 1e8 (CONDITION_LOG10): a range
    shortened to 1e2 lets it pass."""
    values, vectors = np.linalg.eigh(np.swapaxes(A, -1, -2) @ A)
    inverse_root = (vectors / np.sqrt(np.maximum(values, np.finfo(np.float64).tiny))[..., None, :]) @ np.swapaxes(vectors, -1, -2)
    return A @ inverse_root


def _transposed_factor(A: np.ndarray) -> np.ndarray:
    U, _, Vh = np.linalg.svd(A, full_matrices=False)
    return U @ np.swapaxes(Vh, -1, -2)  # V where V^T was meant


def _one_newton_step(A: np.ndarray) -> np.ndarray:
    """One Newton-Schulz step from A, as if A were already close to St(d, r)."""
    return A @ (1.5 * np.eye(A.shape[-1]) - 0.5 * np.swapaxes(A, -1, -2) @ A)


def _unscaled_qr(A: np.ndarray) -> np.ndarray:
    return np.linalg.qr(A)[0]


def _near_frames_kept(A: np.ndarray) -> np.ndarray:
    """A batch whose every member is already close to St returned as it is (a shortcut)."""
    close = np.allclose(np.swapaxes(A, -1, -2) @ A, np.eye(A.shape[-1]), atol=1e-6)
    return A if close else ref.project_to_manifold(A)


def _float32_polar(A: np.ndarray) -> np.ndarray:
    """The polar factor computed in float32 (overflows at the large scales, loses digits at all)."""
    return ref.project_to_manifold(A.astype(np.float32)).astype(np.float64)


CONTROLS = {
    "qr_projection": ("the sign-fixed QR factor of A: a frame, but not the nearest one (X^T A is triangular)", _qr_projection),
    "normalized_columns": ("the columns of A normalised one by one: not a frame", _normalized_columns),
    "gram_projection": ("A (A^T A)^(-1/2) through the Gram matrix's eigendecomposition: the nearest frame in exact arithmetic, "
                        "no digit left at cond 1e8 (the range the claim must draw)", _gram_projection),
    # projections written wrong the way real ones are, each a bug a check must catch
    "transposed_factor": ("U V where U V^T was meant: a frame only where V is symmetric", _transposed_factor),
    "one_newton_step": ("one Newton-Schulz step from A, as if A were already near St(d, r)", _one_newton_step),
    "unscaled_qr": ("numpy's QR factor without the sign fix: a frame, not the nearest, not equivariant", _unscaled_qr),
    "near_frames_kept": ("a batch whose every member is within 1e-6 of St returned as it is (a shortcut for drifted frames)", _near_frames_kept),
    "float32_polar": ("the polar factor computed in float32: digits lost at every scale, overflow at 2^128", _float32_polar),
}


def _projection(name: str):
    return ref.project_to_manifold if name == "reference" else CONTROLS[name][1]


# --------------------------------------------------------------------------------------------
# Symbolic
# --------------------------------------------------------------------------------------------


def symbolic_derivation() -> list[SymbolicStep]:
    steps = []
    a = sp.Matrix(3, 2, sp.symbols("a0:6", real=True))
    theta = sp.symbols("theta", real=True)
    # an orthonormal 3 x 2 frame with explicit entries: two columns of a rotation about the z axis
    Y = sp.Matrix([[sp.cos(theta), -sp.sin(theta)], [sp.sin(theta), sp.cos(theta)], [0, 0]])
    expansion = ((a - Y).T * (a - Y)).trace() - ((a.T * a).trace() - 2 * (Y.T * a).trace() + 2)
    residual = sp.trigsimp(sp.expand(expansion))
    steps.append(SymbolicStep("||A - Y||^2 = ||A||^2 - 2 tr(Y^T A) + r for orthonormal Y (d = 3, r = 2, explicit entries)",
                              sp.latex(sp.Eq(sp.Symbol(r"\|A - Y\|_F^2 - \|A\|_F^2 + 2\,\mathrm{tr}(Y^\top A) - r"), residual)),
                              residual == 0))
    a1, a2, t = sp.symbols("a1 a2 t", real=True)
    norm = sp.sqrt(a1**2 + a2**2)
    distance = (a1 - sp.cos(t)) ** 2 + (a2 - sp.sin(t)) ** 2
    stationary = sp.simplify(sp.diff(distance, t).subs({sp.cos(t): a1 / norm, sp.sin(t): a2 / norm}))
    curvature = sp.simplify(sp.diff(distance, t, 2).subs({sp.cos(t): a1 / norm, sp.sin(t): a2 / norm}))
    steps.append(SymbolicStep("d = 2, r = 1: y = a / ||a|| is stationary for ||a - y||^2 on the unit circle, and a minimum (second derivative 2 ||a|| > 0)",
                              sp.latex(sp.Eq(sp.Symbol(r"\partial_t \|a - y(t)\|^2|_{y = a/\|a\|}"), stationary)) + r",\quad "
                              + sp.latex(sp.Eq(sp.Symbol(r"\partial_t^2 \|a - y(t)\|^2|_{y = a/\|a\|}"), curvature)),
                              stationary == 0 and sp.simplify(curvature - 2 * norm) == 0))
    return steps


# --------------------------------------------------------------------------------------------
# Bounds, each next to its derivation
# --------------------------------------------------------------------------------------------


def on_manifold_bound(d: int, r: int) -> float:
    """||X^T X - I||_F of X = fl(U V^T) from the float64 SVD: the Gram defect at the distance of the
    computed polar factor to an orthonormal matrix, whatever A's conditioning (kit.bounds.feasibility_bound)."""
    return feasibility_bound(d, r)


def symmetry_bound(d: int, r: int, A_2, A_F, cond):
    """||skew(fl(X^T A))||_F: X = X* + D with X*^T A = H symmetric and ||D||_F <= polar_svd(kappa), so
    skew(X^T A) = skew(D^T A), at most ||D||_F ||A||_2; forming X^T A in float64 adds gamma_d |X|^T |A|,
    of Frobenius norm at most gamma_d ||X||_F ||A||_F = gamma_d sqrt(r) ||A||_F (first order), which
    skew does not enlarge."""
    return polar_error_bound(d, r, cond) * A_2 + gamma(d) * math.sqrt(r) * A_F


def factor_bound(d: int, r: int, A_2, A_F, cond):
    """max_i |lambda_i(sym(fl(X^T A))) - fl(sigma_i(A))|: sym(X^T A) = H + sym(D^T A) + the product's
    rounding, so by Weyl its eigenvalues are within ||D||_F ||A||_2 + gamma_d sqrt(r) ||A||_F of those of
    H, the singular values of A; numpy's eigvalsh of the r x r matrix (backward stable, the
    svd_backward count at d = r) and its svd of A (svd_backward) each add their backward error
    times the norm of what they factor (<= sqrt(r) ||A||_2 and ||A||_F)."""
    return (symmetry_bound(d, r, A_2, A_F, cond) + svd_backward_error(r, r) * math.sqrt(r) * A_2
            + svd_backward_error(d, r) * A_F)


def idempotent_bound(d: int, r: int, defect):
    """||fl(project(X)) - X||_F for X with ||X^T X - I||_F = defect (measured, < 1): with X = U S V^T,
    X - polar(X) = U (S - I) V^T and |s - 1| = |s^2 - 1| / (s + 1) <= |s^2 - 1|, so the exact distance is
    at most ||S^2 - I||_F = defect; computing polar(X) errs by polar_svd at kappa(X) <= sqrt((1 + defect) / (1 - defect))."""
    kappa = np.sqrt((1.0 + defect) / (1.0 - defect))
    return defect + polar_error_bound(d, r, kappa)


def product_rounding(d: int, r: int, norm_F):
    """||fl(Q M R) - Q M R||_F for orthogonal Q (d x d), R (r x r) and M of Frobenius norm norm_F:
    each entry of Q M is a length-d inner product, |fl - exact| <= gamma_d (|Q| |M|), and
    || |Q| |M| ||_F <= || |Q| ||_2 ||M||_F <= sqrt(d) ||M||_F; then (Q M) R likewise with gamma_r sqrt(r)."""
    return (gamma(d) * math.sqrt(d) + gamma(r) * math.sqrt(r)) * norm_F * (1 + 2 * gamma(d) * math.sqrt(d))


def equivariance_bound(d: int, r: int, A_F, sigma_min, cond):
    """||fl(project(fl(Q A R))) - fl(Q fl(project(A)) R)||_F: B = fl(Q A R) is within
    e_B = product_rounding(||A||_F) of Q A R, so polar(B) is within polar_perturbation(e_B, sigma_min - e_B)
    of Q polar(A) R = polar(Q A R); each computed polar factor errs by polar_svd at its kappa (B's
    within the perturbation of A's: kappa(A) (sigma_min + e_B) / (sigma_min - e_B)); Q X R is formed with
    product_rounding(||X||_F = sqrt(r) (1 + defect))."""
    e_B = product_rounding(d, r, A_F)
    cond_B = cond * (sigma_min + e_B) / np.maximum(sigma_min - e_B, 1e-300)
    return (polar_perturbation_bound(e_B, sigma_min - e_B, r) + polar_error_bound(d, r, cond_B) + polar_error_bound(d, r, cond)
            + product_rounding(d, r, math.sqrt(r) * 1.01))


def scale_bound(d: int, r: int, cond):
    """||fl(project(2^k A)) - fl(project(A))||_F: 2^k A is exact (no overflow or underflow in the drawn
    range), polar(2^k A) = polar(A), so the two computed factors differ by at most twice polar_svd at kappa."""
    return 2.0 * polar_error_bound(d, r, cond)


# --------------------------------------------------------------------------------------------
# Draws and checks
# --------------------------------------------------------------------------------------------


def _matrices(rng: np.random.Generator, d: int, r: int, count: int, position: int = 0) -> np.ndarray:
    """count matrices (count, d, r): a Haar frame plus a perturbation of relative size 10^U(-12, 0), or
    (a GAUSSIAN_SHARE of them) a Gaussian matrix, or (a GRADED_SHARE) a Haar frame times singular
    values graded geometrically from 1 to 10^-k, k ~ U(CONDITION_LOG10), times a Haar O(r) matrix
    (Gaussian and perturbed matrices are well conditioned but for rare draws); each times 2^k, k
    uniform in SCALE_LOG2, or (an UNSCALED_SHARE) k = 0. Every NEAR_FRAME_PERIOD-th chunk of the plan
    (position: the chunk's place in it) holds frames drifted by one relative size only, at k = 0: a
    projection that treats a batch of near-frames apart (a shortcut taken when every member is close
    to St) meets one there. The drift's log10 is uniform in one of DRIFT_BANDS equal bands of
    DRIFT_LOG10, the bands taken in turn by those chunks, so that a plan of NEAR_FRAME_PERIOD *
    DRIFT_BANDS chunks meets every band whatever the seed (a drift drawn at random per chunk missed
    the shortcut's range, 1e-12 .. 1e-6, in about one seed in ten)."""
    W = ref.random_point(d, r, rng, (count,))
    E = rng.standard_normal((count, d, r))
    size = 10.0 ** rng.uniform(*RELATIVE_PERTURBATION_LOG10, size=count)
    perturbed = W + E * (size * math.sqrt(r) / np.linalg.norm(E, axis=(-2, -1)))[:, None, None]
    kind = rng.random(count)
    singular = 10.0 ** -(rng.uniform(*CONDITION_LOG10, size=count)[:, None] * np.linspace(0.0, 1.0, r))
    graded = (W * singular[:, None, :]) @ ref.random_orthogonal(r, rng, (count,))
    A = np.where((kind < GAUSSIAN_SHARE)[:, None, None], E,
                 np.where((kind < GAUSSIAN_SHARE + GRADED_SHARE)[:, None, None], graded, perturbed))
    exponent = rng.integers(SCALE_LOG2[0], SCALE_LOG2[1] + 1, size=count)
    exponent = np.where(rng.random(count) < UNSCALED_SHARE, 0, exponent)
    if position % NEAR_FRAME_PERIOD == NEAR_FRAME_PERIOD - 1:
        # the whole batch frames drifted alike (one size per chunk, as the frames of one dtype drift),
        # unscaled, as a user projects a stack of them back
        band = (position // NEAR_FRAME_PERIOD) % DRIFT_BANDS
        width = (DRIFT_LOG10[1] - DRIFT_LOG10[0]) / DRIFT_BANDS
        drift = 10.0 ** (DRIFT_LOG10[0] + width * (band + rng.uniform()))
        return W + E * (drift * math.sqrt(r) / np.linalg.norm(E, axis=(-2, -1)))[:, None, None]
    return A * np.ldexp(1.0, exponent)[:, None, None]


def _text(function) -> str:
    return " ".join(function.__doc__.split())


def _new_checks(prefix: str) -> dict[str, NumericalCheck]:
    def check(name, description, function):
        return NumericalCheck(f"{prefix}{name}", description, _text(function))

    return {
        "on_manifold": check("on_manifold", "||X^T X - I||_F, X = project_to_manifold(A)", on_manifold_bound),
        "symmetry": check("polar_symmetry", "||skew(X^T A)||_F (first-order optimality of the nearest frame)", symmetry_bound),
        "factor": check("polar_factor", "max_i |lambda_i(sym(X^T A)) - sigma_i(A)| (the symmetric factor is (A^T A)^(1/2), positive definite)",
                        factor_bound),
        "idempotent": check("idempotent", "||project(X) - X||_F", idempotent_bound),
        "equivariance": check("equivariance", "||project(Q A R) - Q project(A) R||_F, Q, R Haar with both determinants",
                              equivariance_bound),
        "scale": check("scale_free", "||project(2^k A) - project(A)||_F, k uniform in [-300, 300]", scale_bound),
    }


def _applied(project, M: np.ndarray, errors: list) -> np.ndarray:
    """project(M), or NaN where it raised (the error recorded): a projection that fails on a valid
    input fails the checks that need its output, with the reason, instead of stopping the claim."""
    try:
        out = np.asarray(project(M), dtype=np.float64)
        if out.shape != M.shape:
            raise ValueError(f"returned shape {out.shape} for input shape {M.shape}")
        return out
    except Exception as error:  # any exception of the function under test is its failure
        errors.append(f"{type(error).__name__}: {str(error).splitlines()[0] if str(error) else ''}")
        return np.full(M.shape, np.nan)


def _eigenvalues(S: np.ndarray) -> np.ndarray:
    """Descending eigenvalues of symmetric S (count, r, r); NaN for a matrix that is not finite."""
    finite = np.all(np.isfinite(S), axis=(-2, -1))
    values = np.full(S.shape[:-1], np.nan)
    if finite.any():
        values[finite] = np.linalg.eigvalsh(S[finite])[:, ::-1]
    return values


def chunk_checks(chunk, seed: int, name: str, prefix: str) -> Evidence:
    """Every check on one chunk (d, r, count, index, position in the plan) of matrices for the projection `name`."""
    d, r, count, index, position = chunk
    key = (CLAIM_ID, name, d, r, index)
    rng = rng_for(seed, *key)
    A = _matrices(rng, d, r, count, position)
    project = _projection(name)
    checks = _new_checks(prefix)
    errors: list = []
    with np.errstate(all="ignore"):
        X = _applied(project, A, errors)
        singular = np.linalg.svd(A, compute_uv=False)
        A_2, sigma_min = singular[:, 0], singular[:, -1]
        A_F = np.linalg.norm(A, axis=(-2, -1))
        cond = A_2 / sigma_min
        XtA = np.swapaxes(X, -1, -2) @ A
        defect = np.linalg.norm(np.swapaxes(X, -1, -2) @ X - np.eye(r), axis=(-2, -1))
        checks["on_manifold"].add(defect, on_manifold_bound(d, r), shape=(d, r), key=key, seed=seed)
        for check in ("on_manifold", "symmetry", "factor"):
            checks[check].reach("log10_cond", np.log10(cond[np.isfinite(cond)]))
            checks[check].reach("log2_norm", np.log2(A_F[A_F > 0]))
        checks["symmetry"].add(np.linalg.norm(XtA - np.swapaxes(XtA, -1, -2), axis=(-2, -1)) / 2.0,
                               symmetry_bound(d, r, A_2, A_F, cond), shape=(d, r), key=key, seed=seed)
        eigenvalues = _eigenvalues((XtA + np.swapaxes(XtA, -1, -2)) / 2.0)
        checks["factor"].add(np.max(np.abs(eigenvalues - singular), axis=-1), factor_bound(d, r, A_2, A_F, cond),
                             shape=(d, r), key=key, seed=seed)
        usable = defect < 0.5  # idempotence of a frame: asked of outputs that are frames (a NaN defect is not)
        again = _applied(project, X, errors)
        checks["idempotent"].add(np.where(usable, np.linalg.norm(again - X, axis=(-2, -1)), np.inf),
                                 idempotent_bound(d, r, np.where(usable, defect, 0.5)), shape=(d, r), key=key, seed=seed)
        Q, R = ref.random_orthogonal(d, rng, (count,)), ref.random_orthogonal(r, rng, (count,))
        moved = _applied(project, Q @ A @ R, errors) - Q @ X @ R
        checks["equivariance"].add(np.linalg.norm(moved, axis=(-2, -1)), equivariance_bound(d, r, A_F, sigma_min, cond),
                                   shape=(d, r), key=key, seed=seed)
        shift = rng.integers(-200, 201, size=count)  # |k| <= 500: 2^k A stays far inside float64's range
        scaled = _applied(project, A * np.ldexp(1.0, shift)[:, None, None], errors)
        checks["scale"].add(np.linalg.norm(scaled - X, axis=(-2, -1)), scale_bound(d, r, cond), shape=(d, r), key=key, seed=seed)
        checks["scale"].reach("log2_scale", shift)
    return Evidence(checks=list(checks.values()), frames=count,
                    notes=[f"{name} raised on a chunk of ({d}, {r}) matrices: {error}" for error in dict.fromkeys(errors)])


def projection_checks(seed: int, profile, name: str = "reference", prefix: str = "", frames: int | None = None) -> Evidence:
    """Every check over the claim's shape plan (chunks as tasks of the current executor)."""
    plan = shape_plan(profile, large=((32, 8), (64, 16), (128, 16)), frames=frames)
    chunks = [(*chunk, position) for position, chunk in enumerate(batch_chunks(plan))]
    return map_evidence(chunk_checks, chunks, seed, name, prefix, task_label="projection_checks")


RETRACT_DTYPES = ("float64", "float32")
RETRACT_TRUST_RADII = (0.2, 0.5, 0.75)
RETRACT_SHAPES = ((2, 1), (3, 2), (6, 3), (5, 5), (16, 4))


def retract_bound(d: int, r: int, dtype_name: str, trust_radius: float, A_F, sigma_min, sigma_max):
    """||torch polar_retract(W, xi) - project_to_manifold(W + xi)||_F, W and xi the stored values: the
    kernel forms A = fl(W + xi) in its dtype (each entry within u_c: ||dA||_F <= u_c ||A||_F, which
    moves the polar factor by polar_perturbation at sigma_min - dA) and evaluates polar(A) on its
    declared route (kit.step_analysis.retraction_error at the kernel's declared rounding, the
    Newton-Schulz residual from A's own spectrum); the reference's float64 sum and SVD add their
    own rounding (u ||A||_F through polar_perturbation, and polar_svd)."""
    from .kit import step_analysis

    rounding = step_analysis.kernel_rounding(dtype_name, trust_radius, d, r)
    u_c = rounding.unit("retraction")
    kappa = sigma_max / sigma_min
    evaluation = step_analysis.retraction_error(d, r, rounding, kappa, trust_radius, (A_F, sigma_min, sigma_max))
    summed = polar_perturbation_bound((u_c + u) * A_F, sigma_min - (u_c + u) * A_F, r)
    return evaluation + summed + polar_error_bound(d, r, kappa)


def _shortcut_retract(W, xi, trust_radius=0.5):
    """(W + xi)(I + xi^T xi)^(-1/2): the polar factor only where W^T W = I and xi is tangent."""
    import torch

    gram = torch.eye(W.shape[-1], dtype=torch.float64) + xi.double().mT @ xi.double()
    values, vectors = torch.linalg.eigh(gram)
    return ((W + xi).double() @ (vectors * values.rsqrt().unsqueeze(-2)) @ vectors.mT).to(W.dtype)


def retract_checks(seed: int, profile, retract=None, prefix: str = "", per_shape: int | None = None) -> Evidence:
    """torch_impl.polar_retract in float64 and float32 at trust radii 0.2, 0.5 and 0.75: from frames W
    and steps xi of length up to the radius, tangent for half of them and in any direction for the
    others (the kernel's Newton-Schulz basin holds both), against project_to_manifold(W + xi) of the
    stored values; and a step longer than the radius refused with a ValueError naming trust_radius."""
    import torch

    if retract is None:
        from torch_impl import polar_retract as retract
    checks = {"retract": NumericalCheck(f"{prefix}polar_retract", "||polar_retract(W, xi) - project_to_manifold(W + xi)||_F (torch_impl, "
                                        "Newton-Schulz route), xi tangent or not, ||xi||_F <= trust_radius",
                                        _text(retract_bound)),
              "refused": NumericalCheck(f"{prefix}polar_retract_refuses", "a step longer than the trust radius on the Newton-Schulz route, alone and as the "
                                        "last frame of a batch whose other steps are within it: "
                                        "ValueError naming trust_radius (0; inf if returned)", "exact: the documented refusal",
                                        tightness_note="an exact equality: 0 by design"),
              "isolated": NumericalCheck(f"{prefix}polar_retract_nonfinite_isolated",
                                         "eigh route (trust_radius 2): a frame whose Gram matrix is not finite (a step that overflows "
                                         "it, or a NaN) comes back NaN in every entry, and every other frame of the batch bit-identical "
                                         "to the same call with that frame's step replaced by a finite one (0; inf otherwise)",
                                         "exact: the documented isolation of a non-finite frame", tightness_note="an exact equality: 0 by design")}
    count = per_shape or max(8, profile.frames // 500)
    for dtype_name in RETRACT_DTYPES:
        for radius in RETRACT_TRUST_RADII:
            for d, r in RETRACT_SHAPES:
                key = (CLAIM_ID, "polar_retract", dtype_name, radius, d, r)
                rng = rng_for(seed, *key)
                dtype = getattr(torch, dtype_name)
                W = torch.tensor(ref.random_point(d, r, rng, (count,))).to(dtype)
                W64 = W.to(torch.float64).numpy()
                direction = rng.standard_normal(W64.shape)
                tangent = (np.arange(count) % 2 == 0)[:, None, None]
                direction = np.where(tangent, ref.project_tangent(W64, direction, validate=False), direction)
                length = radius * rng.uniform(0.0, 1.0, (count, 1, 1))
                xi = torch.tensor(direction * length / np.linalg.norm(direction, axis=(-2, -1), keepdims=True)).to(dtype)
                # the drawn steps, then the basin's edges (a drifted frame and a full-length step along
                # its extreme direction); the refusal below takes the drawn steps, of full rank
                for edge, (W_in, xi_in) in enumerate(((W, xi), _basin_edges(rng, d, r, count, radius, dtype))):
                    A = W_in.to(torch.float64).numpy() + xi_in.to(torch.float64).numpy()
                    singular = np.linalg.svd(A, compute_uv=False)
                    computed = retract(W_in, xi_in, radius).to(torch.float64).numpy()
                    checks["retract"].add(np.linalg.norm(computed - ref.project_to_manifold(A), axis=(-2, -1)),
                                          retract_bound(d, r, dtype_name, radius, np.linalg.norm(A, axis=(-2, -1)), singular[:, -1], singular[:, 0]),
                                          shape=(d, r), key=key, seed=seed, extra={"dtype": dtype_name, "trust_radius": radius, "basin_edge": bool(edge)})
                # one frame too long, alone and as the last of a batch whose other steps are within the radius
                norms = torch.linalg.matrix_norm(xi.double()).to(xi.dtype)[..., None, None]
                batch = xi * (0.5 * radius / norms)
                batch[-1] = xi[-1] * (1.5 * radius / float(norms[-1]))
                for label, (W_long, xi_long) in (("alone", (W[:1], xi[:1] * (1.5 * radius / float(norms[0])))), ("last_of_batch", (W, batch))):
                    try:
                        retract(W_long, xi_long, radius)
                        refused = False
                    except ValueError as error:
                        refused = "trust_radius" in str(error)
                    checks["refused"].add([0.0 if refused else math.inf], 0.5, key=key, seed=seed,
                                          extra={"dtype": dtype_name, "trust_radius": radius, "frames": label})
                if radius == RETRACT_TRUST_RADII[-1]:  # once per dtype and shape (the check's own radius is EIGH_RADIUS)
                    checks["isolated"].add([_nonfinite_isolated(retract, W, xi, torch.finfo(dtype).max)], 0.5, shape=(d, r), key=key,
                                           seed=seed, extra={"dtype": dtype_name, "trust_radius": EIGH_RADIUS})
    return Evidence(checks=list(checks.values()))


# The Newton-Schulz route's basin (torch_impl.functional.newton_schulz_interval): a frame W with
# ||W^T W - I||_2 up to the kernel's DRIFT_ALLOWANCE and a step of length up to Delta in any direction
# (a step is tangent only up to its projection's rounding, all of it for the noise-driven step), so
# the singular values of W + xi reach sqrt(1 -+ a) -+ Delta. EDGE_DRIFT: the share of the allowance
# planted, near enough to the edge that an interval without the allowance leaves the iteration short.
EDGE_DRIFT = 0.9


def _basin_edges(rng, d: int, r: int, count: int, radius: float, dtype):
    """count pairs (W, xi) at the edges of the Newton-Schulz basin, in `dtype`: W = Q (I + D)^(1/2),
    D = -+ a e_1 e_1^T (a = EDGE_DRIFT times DRIFT_ALLOWANCE), so sigma_1(W) = sqrt(1 -+ a); xi = -+ L
    w_1 e_1^T / ||w_1|| (L just inside Delta after rounding: the kernel refuses a step longer than
    Delta (1 + allowance)), shrinking or stretching that same direction, so sigma(W + xi) reaches
    sqrt(1 - a) - L or sqrt(1 + a) + L; alternate frames take the lower and the upper edge."""
    import torch
    from torch_impl.functional import DRIFT_ALLOWANCE

    Q = ref.random_point(d, r, rng, (count,))
    sign = np.where(np.arange(count) % 2 == 0, -1.0, 1.0)
    a = EDGE_DRIFT * DRIFT_ALLOWANCE
    scale = np.ones((count, r))
    scale[:, 0] = np.sqrt(1.0 + sign * a)
    W = Q * scale[:, None, :]
    column = W[:, :, :1] / np.linalg.norm(W[:, :, :1], axis=-2, keepdims=True)
    xi = np.zeros_like(W)
    xi[:, :, :1] = sign[:, None, None] * radius * (1 - 1e-3) * column
    return torch.tensor(W).to(getattr(torch, dtype) if isinstance(dtype, str) else dtype), \
        torch.tensor(xi).to(getattr(torch, dtype) if isinstance(dtype, str) else dtype)


EIGH_RADIUS = 2.0  # a trust radius above 0.75: the kernel's eigh route, which takes steps of any length


def _nonfinite_isolated(retract, W, xi, largest: float) -> float:
    """0 if retract(W, xi, EIGH_RADIUS) returns frame 0 (its step overflowing the Gram matrix: an entry
    of largest^(3/4), whose square is inf while W + xi stays finite) and frame 1 (a NaN in its step)
    NaN in every entry, and the other frames bit-identical to the call whose steps 0 and 1 are finite;
    inf otherwise (also where the call raises)."""
    import torch

    if W.shape[0] < 3:
        return 0.0
    broken = xi.clone()
    broken[0, 0, 0] = largest ** 0.75
    broken[1, -1, -1] = math.nan
    try:
        out, clean = retract(W, broken, EIGH_RADIUS), retract(W, xi, EIGH_RADIUS)
    except Exception:
        return math.inf
    isolated = bool(torch.isnan(out[:2]).all()) and torch.equal(out[2:], clean[2:])
    return 0.0 if isolated else math.inf


# Frames s Q (Q a Haar frame, every singular value s) put ||W^T W - I||_F = |s^2 - 1| sqrt(r) where
# wanted; at r = 9 a Frobenius defect of 1.5 tol is a spectral defect of 0.5 tol, so a check that
# measures the wrong norm accepts it. BOUNDARY_FACTORS: defect / tolerance, and whether it is accepted.
BOUNDARY_FACTORS = ((0.5, True), (1.5, False), (2.0, False))
BOUNDARY_SHAPES = ((12, 9), (9, 9), (16, 4), (5, 1))


def feasibility_rounding(d: int, r: int, s: float, defect: float) -> float:
    """|fl(||W^T W - I||_F) - ||W^T W - I||_F| for W = s Q, Q a float64 frame within phi of St: each of
    the r^2 entries of W^T W is a length-d dot product of entries of size <= s, within gamma_d s^2 of
    its exact value, so the matrix within gamma_d s^2 r in the Frobenius norm; the subtraction of I, the
    squares, the sum of r^2 terms and the square root add (gamma_{r^2} + 2u) defect; and Q's own
    distance from St, at most phi = manifold_tolerance(d, r) (a Haar frame of the reference), s^2 phi."""
    return gamma(d) * s * s * r + (gamma(r * r) + 2 * UNIT_ROUNDOFF) * defect + s * s * ref.manifold_tolerance(d, r)


def boundary_checks(seed: int, feasibility=None, check_frame=None, prefix: str = "") -> Evidence:
    """reference_impl.feasibility (||W^T W - I_r||_F, the Frobenius norm) against |s^2 - 1| sqrt(r) for
    frames s Q, and the reference's manifold check (reference_impl.step refuses a W off St) at its
    tolerance: accepted at half of manifold_tolerance(d, r), refused at 1.5 and 2 times it."""
    from reference_impl._validation import check_on_manifold

    feasibility = ref.feasibility if feasibility is None else feasibility
    check_frame = check_on_manifold if check_frame is None else check_frame
    value = NumericalCheck(f"{prefix}feasibility_is_frobenius", "|reference_impl.feasibility(s Q) - |s^2 - 1| sqrt(r)|, the defect "
                           "set to 0.5, 1.5 and 2 times manifold_tolerance(d, r) with every singular value equal",
                           _text(feasibility_rounding))
    verdict = NumericalCheck(f"{prefix}manifold_check_at_tolerance", "the reference's manifold check on s Q: accepted at 0.5 "
                             "manifold_tolerance(d, r), a ValueError naming W^T W at 1.5 and 2 times it (0; inf otherwise)",
                             "exact: the documented tolerance", tightness_note="an exact equality: 0 by design")
    for d, r in BOUNDARY_SHAPES:
        key = (CLAIM_ID, "manifold_boundary", d, r)
        Q = ref.random_point(d, r, rng_for(seed, *key), (len(BOUNDARY_FACTORS),))
        tol = ref.manifold_tolerance(d, r)
        for index, (factor, accepted) in enumerate(BOUNDARY_FACTORS):
            defect = factor * tol
            s = math.sqrt(1.0 + defect / math.sqrt(r))
            W = s * Q[index]
            value.add([abs(float(feasibility(W)) - defect)], feasibility_rounding(d, r, s, defect), shape=(d, r), key=key, seed=seed,
                      extra={"defect_over_tolerance": factor})
            try:
                check_frame("W", W)
                right = accepted
            except ValueError as error:
                right = not accepted and "W^T W" in str(error)
            verdict.add([0.0 if right else math.inf], 0.5, shape=(d, r), key=key, seed=seed, extra={"defect_over_tolerance": factor})
    return Evidence(checks=[value, verdict])


def boundary_part(ctx: Context) -> Evidence:
    return boundary_checks(ctx.seed)


def retract_part(ctx: Context) -> Evidence:
    try:
        import torch_impl  # noqa: F401
    except ImportError:
        return Evidence(notes=["torch is not installed: torch_impl.polar_retract was not tested"])
    return retract_checks(ctx.seed, ctx.profile)


def projection_part(ctx: Context) -> Evidence:
    evidence = projection_checks(ctx.seed, ctx.profile)
    evidence.extra.update({"relative_perturbation_log10": list(RELATIVE_PERTURBATION_LOG10), "scale_log2": list(SCALE_LOG2),
                           "gaussian_share": GAUSSIAN_SHARE})
    return evidence


# Bugs written into a copy of a module's source (kit/source_edits): name -> (module, the text, the text
# written in its place, what the control replaces, description).
EDITED_CONTROLS = {
    "nonfinite_frame_zeroed": ("torch_impl.functional", "    return torch.where(finite, inverse_sqrt, math.nan)\n",
                               "    return torch.where(finite, inverse_sqrt, 0.0)\n", "polar_retract",
                               "a polar_retract whose eigh route returns S^(-1/2) = 0 for a frame with a non-finite Gram matrix: its "
                               "result is the zero matrix, which looks finite"),
    "refusal_in_spectral_norm": ("torch_impl.functional",
                                 "largest = float(torch.linalg.matrix_norm(xi.to(torch.float64)).max()) if xi.numel() else 0.0",
                                 "largest = float(torch.linalg.matrix_norm(xi.to(torch.float64), ord=2).max()) if xi.numel() else 0.0",
                                 "polar_retract", "a polar_retract that measures the step in the spectral norm before refusing it: a step "
                                 "longer than the trust radius in the Frobenius norm, of rank above one, is taken"),
    "spectral_feasibility": ("reference_impl._validation", "    return np.linalg.norm(gram - np.eye(r), axis=(-2, -1))\n",
                             "    return np.linalg.norm(gram - np.eye(r), ord=2, axis=(-2, -1))\n", "stiefel_residual",
                             "the reference measuring ||W^T W - I|| in the spectral norm (feasibility and the manifold check), "
                             "where the Frobenius norm is documented"),
}


def _edited(name: str, attribute: str | None = None):
    from .kit.source_edits import edited

    module, before, after, replaced, _ = EDITED_CONTROLS[name]
    return edited(module, before, after, attribute or replaced)


def control_part(ctx: Context) -> Evidence | None:
    name = ctx.optimizer
    if name in ("shortcut_retract", "nonfinite_frame_zeroed", "refusal_in_spectral_norm"):
        try:
            import torch_impl  # noqa: F401
        except ImportError:
            return None
        retract = _shortcut_retract if name == "shortcut_retract" else _edited(name)
        return Evidence(checks=retract_checks(ctx.seed, ctx.profile, retract, f"{name}:", per_shape=4).checks)
    if name == "spectral_feasibility":
        return boundary_checks(ctx.seed, _edited(name), _edited(name, "check_on_manifold"), f"{name}:")
    return Evidence(checks=projection_checks(ctx.seed, ctx.profile, name, f"{name}:", ctx.profile.control_frames).checks)


def _prepare(ctx: Context) -> None:
    if ctx.optimizer not in CONTROLS and ctx.optimizer not in EDITED_CONTROLS and ctx.optimizer != "shortcut_retract":
        ref.get_variant(ctx.optimizer)  # an unknown name is refused; any optimizer leaves project_to_manifold as it is


CLAIM = Claim(
    id=CLAIM_ID,
    title="project_to_manifold returns the nearest frame: the polar factor",
    statement=(
        "For every full-rank A in R^{d x r}, reference_impl.project_to_manifold(A) is the nearest point of St(d, r) "
        "in the Frobenius norm, the polar factor X with X^T A symmetric positive definite (its eigenvalues the "
        "singular values of A); hence it is idempotent, O(d) x O(r)-equivariant and scale free. torch_impl.polar_retract(W, xi) "
        "is project_to_manifold(W + xi) within its declared rounding for every step of length at most the trust radius, "
        "and refuses a longer one on its Newton-Schulz route."
    ),
    latex=(
        r"X = \operatorname*{arg\,min}_{Y \in \mathrm{St}(d,r)} \|A - Y\|_F = \mathrm{polar}(A):\quad X^\top X = I_r,\ "
        r"X^\top A = (A^\top A)^{1/2} \succ 0;\quad X(QAR) = Q\,X(A)\,R,\ X(cA) = X(A),\ X(X) = X"
    ),
    symbolic=Symbolic("sympy: the distance expansion at an orthonormal frame (explicit entries) and the nearest unit vector", symbolic_derivation),
    parts=(Part("projection", projection_part), Part("polar_retract", retract_part), Part("manifold_boundary", boundary_part)),
    controls=tuple(Control(name, control_part, description) for name, (description, _) in CONTROLS.items()) + (
        Control("shortcut_retract", control_part, "a polar_retract by (W + xi)(I + xi^T xi)^(-1/2): the polar factor only for tangent "
                "xi at an exact frame"),) + tuple(Control(name, control_part, spec[4]) for name, spec in EDITED_CONTROLS.items()),
    prepare=_prepare,
    precisions=(("under test", "reference_impl.project_to_manifold", ("float64",)), ("under test", "torch_impl.polar_retract", RETRACT_DTYPES, "torch"), ("reference", "the nearest frame in mpmath and the bounds", ("float64",))),
)
