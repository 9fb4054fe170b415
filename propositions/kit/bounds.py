"""Error bounds that more than one claim uses, one function per fact, each docstring its derivation.

u = 2^-53. Inner products of length n err by at most gamma_n = n u / (1 - n u) relative to the
product of the absolute values (Higham, Accuracy and Stability of Numerical Algorithms, sec. 3.1).
A certificate's bound text names the function that gives it.
"""

from __future__ import annotations

import math

from reference_impl import UNIT_ROUNDOFF

u = UNIT_ROUNDOFF


def gamma(n: float) -> float:
    """Higham's gamma_n = n u / (1 - n u): relative error bound of a length-n inner product."""
    nu = n * u
    if nu >= 1:
        raise ValueError(f"gamma_n undefined for n u >= 1 (n = {n})")
    return nu / (1 - nu)


def projection_error_bound(d: int, r: int) -> float:
    """Bound on ||fl(P_W(G)) - P_W(G)|| / ||G|| for an exactly orthonormal W (float64).

    fl(W^T G) errs by gamma_d |W|^T |G|, of Frobenius norm <= gamma_d ||W||_F ||G|| = gamma_d sqrt(r)
    ||G||; the product W S with ||S|| <= ||G|| errs by gamma_r sqrt(r) ||G||; sym, the subtraction and
    the propagation through ||W||_2 = 1 add 3 u ||G||. Total (d + r) sqrt(r) u + 3 u, rounded up.
    """
    return (gamma(d) + gamma(r)) * math.sqrt(r) + 3 * u


def polar_error_bound(d: int, r: int, cond: float) -> float:
    """Bound on ||fl(polar(A)) - polar(A)||_F for A = W + xi (d x r) with cond(A) = cond, sigma_min >= ~1.

    With p = d r (the LAPACK backward-error polynomial, bounded as in reference_impl's manifold
    tolerance) and Frobenius norms of r-column matrices at most sqrt(r) times their 2-norms:
      * fl(W + xi) rounds each entry: ||dA||_F <= u ||A||_F <= sqrt(r) u sigma_max;
      * the SVD is backward stable, U S V^T = A + E with ||E||_2 <= p u sigma_max, so
        ||E||_F <= sqrt(r) p u sigma_max;
      * the polar factor moves by <= 2 ||dA||_F / sigma_min (perturbation of the polar factor,
        Higham, Functions of Matrices, ch. 8): 2 sqrt(r) (p + 1) u cond in all;
      * the computed U and V are orthonormal to p u in the 2-norm, so U V^T is off by
        <= 2 sqrt(r) p u, and the product's rounding adds gamma_r ||U||_F ||V||_F = gamma_r r
        <= sqrt(r) p u.
    Together (2 (p + 1) cond + 3 p) sqrt(r) u <= 5 cond sqrt(r) (d r + 1) u.
    """
    return 5.0 * cond * math.sqrt(r) * (d * r + 1) * u


def feasibility_bound(d: int, r: int) -> float:
    """Bound on ||W^T W - I||_F, evaluated in float64, for W = fl(U V^T) from the float64 SVD.

    As in polar_error_bound, W is within delta = 3 sqrt(r) p u (p = d r) of an exactly orthonormal
    matrix, so ||W^T W - I||_F <= 2 delta + delta^2; evaluating the Gram matrix adds
    gamma_d ||W||_F^2 = gamma_d r <= sqrt(r) p u. Together <= 7 sqrt(r) (d r + 1) u. It does not
    depend on the step count: the polar factor is recomputed from the actual W + xi at every step.
    """
    return 7.0 * math.sqrt(r) * (d * r + 1) * u
