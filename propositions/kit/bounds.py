"""Error bounds that more than one claim uses, one function per fact, each docstring its derivation.

u = 2^-53. Inner products of length n err by at most gamma_n = n u / (1 - n u) relative to the
product of the absolute values (Higham, Accuracy and Stability of Numerical Algorithms, 2002,
sec. 3.1). Every bound is first order in u and counts its constants. A certificate's bound text is
taken from the `*_TEXT` string next to the function that gives the bound, never retyped.
"""

from __future__ import annotations

import math

import numpy as np

from reference_impl import UNIT_ROUNDOFF

u = UNIT_ROUNDOFF

# LAPACK's dbdsqr (the implicit QR iteration on the bidiagonal, called by dbdsdc for the leaves of
# the SVD that numpy's gesdd computes) stops and reports failure -- numpy raises LinAlgError --
# once its inner loop has run MAXITR n^2 times, MAXITR = 6; its counter grows by the number of
# plane rotations of each sweep, and the last sweep may overrun the cap by at most n - 1, so a
# converged n x n bidiagonal SVD applies at most (MAXITR + 1) n^2 rotations on each side. (Demmel
# and Kahan observe about two sweeps per singular value, 2 n^2 rotations, on typical matrices; a
# bound must take the cap, not the typical count.)
BIDIAGONAL_ROTATIONS_PER_R2 = 6 + 1
# A plane rotation formed and applied in floating point perturbs the two rows (or columns) it acts
# on by at most gamma_6 relative to their norm (Higham 2002, Lemma 19.8).
ROTATION_ERROR = 6


def gamma(n: float) -> float:
    """Higham's gamma_n = n u / (1 - n u): relative error bound of a length-n inner product."""
    nu = n * u
    if nu >= 1:
        raise ValueError(f"gamma_n undefined for n u >= 1 (n = {n})")
    return nu / (1 - nu)


def householder_error(m: int) -> float:
    """Relative perturbation (6 m + 13) u of a vector by one Householder reflector of length m.

    Counted for H = I - beta v v^T, v = x + sign(x_1) ||x|| e_1, beta = 2 / (v^T v) (LAPACK's dlarfg
    computes the same reflector with tau = beta), relative to the vector b it acts on:
      * v: ||x|| is a sum of m squares (gamma_m) under a square root (halved) plus the root's rounding,
        (m / 2 + 1) u; v_1 adds two same-signed numbers (u): ||v~ - v|| <= (m / 2 + 2) u ||v||. The
        reflector of v~ is exactly orthogonal and differs from H by at most 2 sqrt(2) ||v~ - v|| / ||v||
        (H = I - 2 v v^T / v^T v; the rank-one projector moves by sqrt(2) ||dv|| / ||v||): (2 m + 6) u;
      * beta~ = fl(2 / (v~^T v~)): the length-m sum and the division, (m + 1) u relative on the term
        beta v (v^T b), whose norm is at most 2 ||b||: (2 m + 2) u;
      * b - beta~ v~ (v~^T b): the length-m product (m u), the two scalings (2u), relative to the same
        term: (2 m + 4) u; the subtraction u.
    Together (6 m + 13) u (Higham 2002, Lemma 19.2: gamma~_{cm}, with its constant counted here).
    """
    return (6 * m + 13) * u


def svd_backward_error(d: int, r: int) -> float:
    """Relative backward error p u of the float64 thin SVD of a d x r matrix (d >= r), Frobenius norm.

    numpy.linalg.svd calls LAPACK's gesdd: U S V^T = A + E with U, V exactly orthonormal (the ones
    of svd_orthonormality_error) and ||E||_F <= svd_backward_error(d, r) ||A||_F, from
      * the bidiagonalisation (dgebrd): r left reflectors of length <= d act on every column
        (r householder_error(d) columnwise) and at most r right reflectors of length <= r on every
        row (r householder_error(r) rowwise): r (h(d) + h(r)) ||A||_F;
      * the bidiagonal SVD: at most BIDIAGONAL_ROTATIONS_PER_R2 r^2 = 7 r^2 plane rotations per side
        (LAPACK's iteration cap), each gamma_6 relative to the two rows it acts on, which are at most
        ||B||_F = ||A||_F (1 + O(u)): 2 * 7 r^2 * 6 u ||A||_F = 84 r^2 u ||A||_F. For r > 25 gesdd's
        divide and conquer solves leaves of size <= 25 by the same iteration and merges them by
        orthogonal updates accurate to O(r u) per level (Gu and Eisenstat 1995), inside this count.
    Together r (6 d + 6 r + 26) u + 84 r^2 u.
    """
    return r * (householder_error(d) + householder_error(r)) + 2 * BIDIAGONAL_ROTATIONS_PER_R2 * ROTATION_ERROR * r * r * u


def svd_orthonormality_error(d: int, r: int) -> float:
    """Bound on ||fl(U V^T) - U~ V~^T||_F, U~ and V~ the exactly orthonormal factors of svd_backward_error.

      * U_B, V_B (r x r) accumulate the bidiagonal SVD's rotations: at most 7 r^2 of them per side,
        each gamma_6 relative to the two unit columns it acts on (norm sqrt 2): 7 r^2 6 sqrt(2) u <=
        60 r^2 u each;
      * U = Q_L [U_B; 0] applies r reflectors of length <= d to each of the r unit columns
        (r h(d) each, sqrt(r) r h(d) in the Frobenius norm); V = Q_R V_B likewise with length r;
      * the product U V^T: length-r inner products, gamma_r ||U||_F ||V||_F = r gamma_r <= r^2 u (1 + O(u)).
    Together 121 r^2 u + sqrt(r) r (h(d) + h(r)). It does not depend on A's conditioning.
    """
    accumulate = 2 * math.ceil(BIDIAGONAL_ROTATIONS_PER_R2 * ROTATION_ERROR * math.sqrt(2)) * r * r * u
    return accumulate + math.sqrt(r) * r * (householder_error(d) + householder_error(r)) + r * gamma(r)


def polar_error_bound(d: int, r: int, cond):
    """Bound on ||fl(polar(A)) - polar(A)||_F for the reference's polar factor of a d x r matrix A.

    reference_impl.manifold.polar_retract (method "svd", the one the optimizer uses) returns
    fl(U V^T) from numpy's thin SVD of A = W + xi. cond = sigma_max(A) / sigma_min(A) (a scalar or
    an array; P3(b): cond(W + xi) <= sqrt(1 + ||xi||^2) for tangent xi at a frame).
      * Backward error: U~ S V~^T = A + E exactly with U~, V~ orthonormal and ||E||_F <= p u ||A||_F,
        p u = svd_backward_error(d, r); so U~ V~^T = polar(A + E) exactly.
      * Perturbation of the polar factor: its derivative at A = P S Q^T maps dA to P Omega Q^T +
        (I - P P^T) dA Q S^-1 with Omega_ij = (X_ij - X_ji) / (s_i + s_j), X = P^T dA Q. The two parts
        are orthogonal, ||Omega||_F <= ||skew X||_F / sigma_min <= ||P P^T dA||_F / sigma_min, so to
        first order ||polar(A + E) - polar(A)||_F <= ||E||_F / sigma_min <= p u sqrt(r) cond
        (||A||_F <= sqrt(r) sigma_max).
      * The computed U, V and the product: svd_orthonormality_error(d, r).
    Bound: svd_backward_error(d, r) sqrt(r) cond + svd_orthonormality_error(d, r), i.e.
    u [sqrt(r) cond (r (6 d + 6 r + 26) + 84 r^2) + 121 r^2 + sqrt(r) r (6 d + 6 r + 26)]: linear in
    cond, of order sqrt(r) r (d + r) u. Measured errors sit two to four decades below it (the worst
    case of every sum and of the rotation count; see the certificates' worst ratios).
    """
    return svd_backward_error(d, r) * math.sqrt(r) * np.asarray(cond, dtype=np.float64) + svd_orthonormality_error(d, r)


POLAR_ERROR_TEXT = (
    "polar_error_bound(d, r, cond) = sqrt(r) cond p u + q u (propositions/kit/bounds.py): p u = "
    "r (6d + 6r + 26) u + 84 r^2 u is the backward error of numpy's SVD (Householder bidiagonalisation, "
    "at most 7 r^2 rotations per side, LAPACK's cap), which moves the polar factor by ||E|| / sigma_min; "
    "q u = 121 r^2 u + sqrt(r) r (6d + 6r + 26) u the loss of orthonormality of U, V and the product U V^T"
)


def polar_perturbation_bound(distance, sigma_min, r: int | None = None):
    """Bound on ||polar(A) - polar(B)||_F in exact arithmetic when ||A - B||_F <= distance and every
    matrix of the segment [A, B] has smallest singular value >= sigma_min > 0 (scalars or arrays).

    The derivative of the polar factor at C = P S Q^T (thin SVD) maps dC to P Omega Q^T +
    (I - P P^T) dC Q S^-1 Q^T with Omega_ij = (X_ij - X_ji) / (s_i + s_j), X = P^T dC Q. The two terms
    are orthogonal (P^T (I - P P^T) = 0); ||Omega||_F <= ||X - X^T||_F / (2 s_min) <= ||X||_F / s_min
    and the second term is at most ||(I - P P^T) dC||_F / s_min, so ||D polar(C)[dC]||_F^2 <=
    (||P^T dC||_F^2 + ||(I - P P^T) dC||_F^2) / s_min^2 = ||dC||_F^2 / s_min^2. Integrated along the
    segment: distance / sigma_min, the one Lipschitz constant of the polar factor every bound uses.
    Where sigma_min comes from: (W + xi)^T (W + xi) = W^T W + xi^T xi for xi tangent at W, so
    sigma_min(W + xi) >= sigma_min(W), which is 1 for an orthonormal W (P3(b)) and at least 1 - a for
    a W within a of St(d, r) (Weyl); the tangent space is linear, so the segment between W + xi_a and
    W + xi_b is again of that form. (Li and Sun's 2 / (sigma_r(A) + sigma_r(B)), SIAM J. Matrix
    Anal. Appl. 25 (2003), needs no segment; it agrees where sigma_r(A) = sigma_r(B) = sigma_min.)
    With r given, the bound is also capped at 2 sqrt(r): two d x r matrices with orthonormal columns
    are at most that far apart, so where sigma_min <= 0 (no lower bound on the segment) that is the bound.
    """
    distance = np.asarray(distance, dtype=np.float64)
    sigma_min = np.asarray(sigma_min, dtype=np.float64)
    with np.errstate(divide="ignore", invalid="ignore"):
        bound = np.where(sigma_min > 0, distance / np.where(sigma_min > 0, sigma_min, 1.0), np.inf)
    return bound if r is None else np.minimum(bound, 2.0 * math.sqrt(r))


POLAR_PERTURBATION_TEXT = (
    "polar_perturbation_bound(distance, sigma_min) = distance / sigma_min (propositions/kit/bounds.py): the "
    "polar factor's derivative has Frobenius norm <= 1 / sigma_min, integrated along a segment of matrices "
    "W + tangent whose smallest singular value is >= sigma_min (1 at a frame, 1 - a within a of St(d, r)); "
    "never more than 2 sqrt(r), the largest distance of two orthonormal d x r matrices"
)


def gram_defect_bound(distance, d: int, r: int, gram_roundoff: float = u):
    """Bound on fl(||W^T W - I||_F) for a d x r matrix W within `distance` of an orthonormal Q (Frobenius).

    W = Q + D, W^T W - I = Q^T D + D^T Q + D^T D: at most 2 distance + distance^2. Forming W^T W
    in a dtype of unit roundoff gram_roundoff (length-d inner products) errs by gamma_d ||W||_F^2
    <= gamma_d r (1 + distance)^2; subtracting I and the norm add u ||W^T W - I|| (second order).
    """
    distance = np.asarray(distance, dtype=np.float64)
    gamma_d = d * gram_roundoff / (1 - d * gram_roundoff)
    return 2 * distance + distance**2 + gamma_d * r * (1 + distance) ** 2


def feasibility_bound(d: int, r: int) -> float:
    """Bound on ||W^T W - I||_F, evaluated in float64, for W = fl(U V^T) from the float64 SVD.

    fl(U V^T) is within svd_orthonormality_error(d, r) of the exactly orthonormal U~ V~^T
    (polar_error_bound), whatever A's conditioning; gram_defect_bound turns that distance into
    the Gram defect and its float64 evaluation. It does not depend on the step count: the polar
    factor is recomputed from the actual W + xi at every step.
    """
    return float(gram_defect_bound(svd_orthonormality_error(d, r), d, r))


FEASIBILITY_TEXT = (
    "feasibility_bound(d, r) = 2 q u + gamma_d r (propositions/kit/bounds.py): fl(U V^T) is within q u = "
    "svd_orthonormality_error(d, r) of an orthonormal matrix (independent of cond), the Gram defect is "
    "at most twice that, and its float64 evaluation adds gamma_d r"
)


def projection_error_bound(d: int, r: int) -> float:
    """Bound on ||fl(P_W(G)) - P_W(G)|| / ||G|| for an exactly orthonormal W (float64).

    fl(W^T G) errs by gamma_d |W|^T |G|, of Frobenius norm <= gamma_d ||W||_F ||G|| = gamma_d sqrt(r)
    ||G||; the product W S with ||S|| <= ||G|| errs by gamma_r sqrt(r) ||G||; sym, the subtraction and
    the propagation through ||W||_2 = 1 add 3 u ||G||. Total (d + r) sqrt(r) u + 3 u, rounded up.
    """
    return (gamma(d) + gamma(r)) * math.sqrt(r) + 3 * u


PROJECTION_TEXT = (
    "projection_error_bound(d, r) = (gamma_d + gamma_r) sqrt(r) + 3u relative to ||G|| "
    "(propositions/kit/bounds.py): the length-d product W^T G, the length-r product W S, sym and the subtraction"
)
