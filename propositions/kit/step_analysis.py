"""One rounding analysis of the StiefelAdam step, stage by stage as in docs/algorithm.md.

`step_error` bounds the distance of one evaluation of the step from the exact step at the exact
input, for any precision: `Rounding` holds the unit roundoffs (u_c of the computation, u_W of W's
storage, u_state of m and v) and the retraction's route; `InputErrors` how far the input the
evaluation received is from the exact one (a frame off the manifold or rounded to storage, a
gradient rounded, a moment that differs from the model's). Every stage is a `Stage` of
propositions/kit/bounds.py (the primitives: projection, gram, square_root, polar_perturbation,
polar_svd) or of this module (the rest), one function each with its derivation as docstring; the
composition below adds nothing of its own. Its callers:

  * kit/running_bounds.trajectory_rounding_bound: float64 trajectories, the errors of one step fed
    as the input errors of the next (P2, P4);
  * kit/trajectories.one_step_bound: the optimizer under test (any implementation, through the
    adapters) against the independent model, one step at a time (P1..P5);
  * propositions/crosscheck.step_error_bound: the torch kernel in float64, float32 and bfloat16
    against the reference.

Nothing here is taken from the implementations it bounds: the Newton-Schulz iteration count and the
drift of the kernel's frames are derived below from the hyper-parameters and the dtype.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import numpy as np

import reference_impl as ri

from .bounds import STAGES, Stage, polar_perturbation, polar_svd, projection, quiet, square_root, stage

TINY = np.finfo(np.float64).tiny
U64 = 2.0**-53
U32 = 2.0**-24
U_BF16 = 2.0**-8


# --------------------------------------------------------------------------------------------
# Stages 1-7
# --------------------------------------------------------------------------------------------


@stage("E_Gd", "2*u_c*(G + lam*W) + G_rel*G + lam*W_err")
def decay(u_c, G, lam, W, G_rel, W_err):
    """Stage 1, G~ = G + lambda W, with ||G|| <= G, ||W||_F <= W: the product lambda W and the sum
    round by u_c each, 2 u_c (G + lambda W); the gradient as received errs by G_rel ||G|| (its
    storage rounding); a frame W' = W + dW gives lambda ||dW|| <= lambda W_err."""


@stage("E_m", "beta1*m_in_err + (1 - beta1)*g_err + 3*u_c*(beta1*m_in + (1 - beta1)*g)")
def first_moment(u_c, beta1, m_in, m_in_err, g, g_err):
    """Stage 3, m = beta1 m_in + (1 - beta1) g: the exact change of m is beta1 dm_in + (1 - beta1) dg;
    each product rounds by u_c, the sum by u_c, and 1 - beta1 formed (or stored) in the compute
    dtype by u_c: at most 3 u_c on each term."""


@stage("E_s", "(2*g*g_err + g_err**2)/n + ((n + 4)*g + 2*X)*u_c*g/n")
def mean_square(n, u_c, g, g_err, X):
    """Stage 4's ||g||^2 / n, n = d r, with ||G~|| <= X: ||g + dg||^2 - ||g||^2 <= 2 ||g|| ||dg|| +
    ||dg||^2; the sum of n squares errs by gamma_n ||g||^2; the squares, a norm's square root and
    its square add 3 u_c; the scaling by 1 / n (a division, or, to keep the squares at the size of
    v, the factor s = sqrt((1 - beta2) / n) rounded to the compute dtype, 2 u_c on s^2, applied to
    the entries of G~ before the projection's sums, a relative u_c on G~ that moves ||g||^2 by at
    most 2 u_c ||g|| ||G~||) adds 1 u_c and 2 u_c ||g|| X: (n + 4) u_c ||g||^2 + 2 u_c ||g|| X."""


@stage("E_v", "beta2*v_in_err + (1 - beta2)*s_err + 3*u_c*(beta2*v_in + (1 - beta2)*s)")
def second_moment(u_c, beta2, v_in, v_in_err, s, s_err):
    """Stage 4, v = beta2 v_in + (1 - beta2) s with s the mean square: as first_moment, a scalar."""


_BIAS_POWER = "(2*t*Max(1, Abs(log_beta))*beta_t/(1 - beta_t) + 1)*u_p"


@stage("E_pow", _BIAS_POWER)
def bias_power(u_p, t, beta_t, log_beta):
    """Relative error of 1 - beta^t, beta_t = beta^t, formed in a dtype of unit roundoff u_p: beta^t
    errs by t u_p relative by repeated products, or by 2 t |log beta| u_p by the -expm1(t log beta)
    route (a library pow within an ulp is inside either), which the subtraction 1 - beta^t amplifies
    by beta^t / (1 - beta^t) and rounds by u_p: (2 t max(1, |log beta|) beta^t / (1 - beta^t) + 1) u_p."""


@stage("E_hat", f"(x_err + ({_BIAS_POWER} + 2*u_c)*x)/(1 - beta_t)")
def bias_correction(u_c, u_p, t, beta_t, log_beta, x, x_err):
    """Stage 5, x^ = x / (1 - beta^t), beta_t = beta^t, with beta^t and 1 - beta^t formed in a dtype of
    unit roundoff u_p (bias_power) and applied in the compute dtype (u_c): rounding 1 - beta^t to the
    compute dtype and the division add 2 u_c. A kernel that forms beta^t in float64 and computes in
    float32 has u_p = 2^-53, u_c = 2^-24; an implementation that declares nothing is taken to form it
    at u_p = u_c (about 2000 u_c at t = 1 for beta = 0.999)."""


@stage("E_mv", "u_state*x")
def moment_cast(u_state, x):
    """m (Frobenius norm x) or v (x) returned in a state dtype of unit roundoff u_state coarser than
    the dtype it was computed in: u_state x (0 where the state is kept in the compute dtype)."""


@stage("E_q", "sqrt_err + u_c*q")
def denominator(u_c, q, sqrt_err):
    """Stage 6's q = sqrt(v^) + eps: the square root's error (square_root) and the sum's rounding."""


@stage("E_xi0", "(lr*m_hat_err + xi*q_err)/(q - q_err) + 3*u_c*xi")
def direction(u_c, lr, xi, q, q_err, m_hat_err):
    """Stage 6, xi = -lr m^ / q with ||xi|| <= xi: d(m / q) = dm / q' - m dq / (q q') with q' >= q - dq,
    so ||dxi|| <= (lr ||dm^|| + ||xi|| |dq|) / (q - |dq|); the scalar -lr / q (a division, a
    product) and the product with m^ round by 3 u_c. Needs q > q_err (well posed)."""


@stage("E_xi0", "lr*(m_hat + m_hat_err)/(q - q_err)")
def direction_undetermined(lr, m_hat, m_hat_err, q, q_err):
    """Stage 6 where the exact v^ may be 0 (its error reaches v^): the exact xi may be 0 and the
    computed one has norm at most lr (||m^|| + ||dm^||) / (q - |dq|); their distance is at most that."""


@stage("E_xi", "xi_err*Min(1, radius/Max(raw - xi_err, radius)) + (n + 4)*u_c*cap")
def trust_region(n, u_c, xi_err, cap, raw, radius):
    """Stage 7, x -> x min(1, Delta / ||x||) with Delta = radius, for a step of exact length raw:
    the projection onto the ball of radius Delta is 1-Lipschitz, so the error of xi passes with
    factor at most 1; where raw - xi_err > Delta the segment from the exact to the computed step
    lies outside the ball of radius raw - xi_err (triangle inequality), where the projection is
    x -> Delta x / ||x||, of derivative norm Delta / ||x||: the error passes with factor
    Delta / (raw - xi_err) < 1 (its component along xi is removed by the cap). The computed cap (a
    norm of n squares with its square root, the ratio and the scaling) rounds by (n + 4) u_c on a
    step of length cap = min(raw, Delta) (0 where there is no cap, Delta = inf)."""


@stage("E_A", "W_err + xi_err + u_c*A")
def step_sum(u_c, A, W_err, xi_err):
    """Stage 8's A = W + xi, ||A||_F <= A: the errors of W and xi add, the sum rounds by u_c ||A||."""


# --------------------------------------------------------------------------------------------
# Stage 8: the retraction's evaluation by the Gram routes, and storage
# --------------------------------------------------------------------------------------------


@stage("E_NS", "r*kappa**2*gamma_n(d, u_c)/2 + (7*(1 + (k - 1)*Min(r - 1, 1)) + 1)*r*gamma_n(r, u_c)*kappa + sqrt(r)*e_k")
def polar_newton_schulz(d, r, u_c, kappa, k, e_k):
    """Bound on ||fl(A M) - polar(A)||_F for the Gram route with k quintic Newton-Schulz iterations
    (torch_impl's retraction for Delta <= 1), A d x r with sigma_max / sigma_min <= kappa. With
    S = A^T A and Q = A S^(-1/2) = polar(A), A X = Q S^(1/2) X for any r x r X:
      * fl(S) = S + E with ||E||_F <= gamma_d ||A||_F^2 <= gamma_d r sigma_max^2 (gram). The exact
        inverse square root of S + E moves Q S^(1/2) (.) by at most ||E||_F / (2 lambda_min(S)): in
        S's eigenbasis the divided differences of x^(-1/2), times sqrt(lambda_i), are
        1 / (sqrt(lambda_j) (sqrt(lambda_i) + sqrt(lambda_j))) <= 1 / (2 lambda_min). Together
        r kappa^2 gamma_d / 2;
      * each iteration forms X^T X = M S M (two r x r products), its square (one) and M p(X^T X) (one):
        each length-r product errs by gamma_r ||X||_F ||Y||_F, r gamma_r relative to the spectral
        norms (about 1 for S / c and 1 / sigma_min for M), and the polynomial's derivative (at most
        5/4 + 3/4 |x| <= 2 on the basin) doubles the error of X^T X: at most 7 r gamma_r per
        iteration relative to ||M||_2, all k counted for r >= 2 (a rounding error of M moves the
        polar factor of A M through its skew part, which later iterations do not undo); for r = 1 the
        iterates A M_j are positive multiples of A, whose polar factor A / ||A|| no rounding of the
        scalar M_j moves, and only the last iteration's rounding of the length remains; the final A M
        adds r gamma_r; through ||A||_2 <= sigma_max these are (7 (1 + (k - 1) [r > 1]) + 1) r gamma_r kappa;
      * after k iterations every eigenvalue x of M S M is within e_k of 1 (newton_schulz_residual,
        from A's spectrum where it is known; u_c where only the trust region's interval is, the
        target newton_schulz_iterations reaches), so S^(1/2) M has singular values within e_k / 2
        of 1: sqrt(r) e_k.
    """


@stage("E_eigh", "r*kappa**2*(gamma_n(d, u_c) + r*(6*r + 13)*u_e + 360*r**2*u_e)/2"
                 " + kappa*(2*sqrt(r)*r*(6*r + 13)*u_e + 510*r**2*u_e + 2*sqrt(r)*u_e + r*gamma_n(r, u_e) + sqrt(r)*u_M"
                 " + r*gamma_n(r, u_c))")
def polar_eigh(d, r, u_c, u_e, u_M, kappa):
    """Bound on ||fl(A V diag(lambda^-1/2) V^T) - polar(A)||_F for the Gram route by the symmetric
    eigensolver (LAPACK syevd, as numpy.linalg.eigh and torch.linalg.eigh call it), kappa as above,
    S = A^T A and A M formed in u_c, the eigensolver and M = V D V^T in u_e (torch_impl solves the
    r x r eigenproblem in float64 whatever it computes in), M rounded to the compute dtype by u_M
    (0 where u_e = u_c).
      * fl(S) as in polar_newton_schulz: r kappa^2 gamma_d / 2;
      * syevd's backward error: the tridiagonalisation applies r reflectors of length <= r (r
        householder(r) relative to ||S||_F <= r sigma_max^2), and the implicit QL/QR iteration of
        dsteqr (dstedc's solver for r <= 25, the leaves above) stops after 30 r sweeps of at most r
        rotations, 30 r^2 rotations applied on both sides, each gamma_6: 360 r^2 u relative; an
        error F of S moves Q by at most ||F||_F / (2 lambda_min) as above: r kappa^2 (r householder(r) +
        360 r^2 u_e) / 2;
      * V's loss of orthonormality: the reflectors accumulated (sqrt(r) r householder(r)) and 30 r^2
        rotations of unit columns (30 6 sqrt(2) r^2 u <= 255 r^2 u), which enter M = V D V^T twice,
        each through ||A D||_2 <= kappa: 2 (sqrt(r) r householder(r) + 255 r^2 u_e) kappa;
      * lambda^(-1/2) (a square root and a division, 2 u_e relative): 2 sqrt(r) u_e kappa; the product
        V D V^T, length r: r gamma_r(u_e) kappa; M rounded to the compute dtype, ||dM||_F <=
        u_M ||M||_F <= u_M sqrt(r) / sigma_min: sqrt(r) u_M kappa; the product A M in u_c:
        r gamma_r(u_c) kappa.
    """


@stage("E_cast", "u_s*sqrt(r)")
def storage_cast(r, u_s):
    """W+ (||W+||_F = sqrt(r)) rounded to a storage dtype of unit roundoff u_s coarser than the one it
    was computed in: u_s ||W+||_F (0 where the storage is the compute dtype: u_s = 0)."""


# --------------------------------------------------------------------------------------------
# Derived on the certifier's side: iteration count and frame drift
# --------------------------------------------------------------------------------------------

NEWTON_SCHULZ_MAX_TRUST_RADIUS = 0.75
# The kernel's starting scale c is the middle of the squared singular value interval of A = W + xi
# for any xi with ||xi||_F <= Delta and a frame within its drift allowance a = 1e-2 (docs/algorithm.md,
# the PyTorch kernel): part of its algorithm, restated here, not read from it.
KERNEL_DRIFT_ALLOWANCE = 1e-2


def newton_schulz_scale(trust_radius: float) -> float:
    """c of the kernel's first iterate X_0 = A / sqrt(c): ((sqrt(1 - a) - Delta)^2 + (sqrt(1 + a) + Delta)^2) / 2."""
    a = KERNEL_DRIFT_ALLOWANCE
    return ((math.sqrt(1.0 - a) - trust_radius) ** 2 + (math.sqrt(1.0 + a) + trust_radius) ** 2) / 2.0


@functools.lru_cache(maxsize=4096)  # a pure function of three numbers, asked at every step of a run
def newton_schulz_iterations(trust_radius: float, u_c: float, drift: float = 0.0) -> int:
    """Quintic Newton-Schulz iterations X <- X (15/8 - 5/4 X^T X + 3/8 (X^T X)^2) that bring every
    eigenvalue of X^T X within u_c of 1, started at X_0 = A / sqrt(c), c = newton_schulz_scale(Delta),
    for A = W + xi with ||xi||_F <= Delta in any direction and ||W^T W - I|| <= drift.

    The singular values of A lie in [sqrt(1 - drift) - Delta, sqrt(1 + drift) + Delta] (Weyl), the
    eigenvalues of S = A^T A in their squares, those of S / c within delta_0 of 1; one iteration maps
    1 - x to 5/8 e^3 + 15/64 e^4 + 9/64 e^5 (e = 1 - x, the polynomial expanded exactly). Iterated from
    both ends of the interval until below u_c. Any direction, since a step is tangent only up to the
    rounding of its projection (all of it, for the noise-driven step of a gradient normal up to rounding)."""
    if not (0 < trust_radius <= NEWTON_SCHULZ_MAX_TRUST_RADIUS):
        raise ValueError(f"the Newton-Schulz route needs 0 < trust_radius <= {NEWTON_SCHULZ_MAX_TRUST_RADIUS}, got {trust_radius!r}")
    scale = newton_schulz_scale(trust_radius)
    low, high = (math.sqrt(1.0 - drift) - trust_radius) ** 2, (math.sqrt(1.0 + drift) + trust_radius) ** 2
    deviations = [1.0 - low / scale, high / scale - 1.0]
    for iterations in range(1, 32):
        deviations = [5 / 8 * e**3 + 15 / 64 * e**4 + 9 / 64 * e**5 for e in deviations]
        if max(abs(e) for e in deviations) <= u_c:
            return iterations
    raise ValueError(f"the quintic iteration does not converge from trust_radius {trust_radius} and drift {drift}")


def newton_schulz_distance(d: int, r: int, u_c: float, trust_radius: float, drift: float) -> float:
    """Distance of a frame the Gram route returns (Newton-Schulz, computed in u_c) to an orthonormal
    matrix: polar_newton_schulz at kappa = sqrt(1 + Delta^2) (1 + drift) / (1 - drift)."""
    kappa = math.sqrt(1.0 + trust_radius**2) * (1.0 + drift) / (1.0 - drift)
    k = newton_schulz_iterations(trust_radius, u_c, drift)
    return float(polar_newton_schulz(d=d, r=r, u_c=u_c, kappa=kappa, k=k, e_k=u_c))


@stage("E_defect", "gamma_n(d, u_c)*A_F**2/sigma_min**2 + (2*kappa**2 + 4*kappa + 3/4)*r*gamma_n(r, u_c) + 7*sqrt(r)*u_c"
                   " + sqrt(r)*e_k + 2*sqrt(r)*u_s + r*u_s**2")
def newton_schulz_defect(d, r, u_c, u_s, A_F, sigma_min, kappa, e_k):
    """Bound on ||W^T W - I||_F for W = fl_s(fl(A M_k)), the Gram route's frame after k quintic
    Newton-Schulz iterations computed in u_c and stored in u_s (0 where the storage is the compute
    dtype), A d x r with ||A||_F <= A_F, smallest singular value sigma_min and cond(A) <= kappa.
    The defect, unlike the distance to the polar factor (polar_newton_schulz), does not remember
    the earlier iterations: each iteration forms the Gram matrix of its own iterate (Y = M^T fl(S) M)
    and corrects it, so only fl(S), the last iteration, the product A M_k and the storage count.
      * fl(S) = S + E, ||E||_F <= gamma_d ||A||_F^2 (gram); the iteration converges on fl(S), so
        (A M_k)^T (A M_k) - I = (M_k^T fl(S) M_k - I) - M_k^T E M_k, the second at most
        gamma_d A_F^2 / sigma_min^2 (||M_k||_2 = 1 / sigma_min to first order);
      * the last iteration from M: Z = fl(fl(M fl(S)) M) errs by 2 r gamma_r ||M||_2^2 ||S||_2 =
        2 r gamma_r kappa^2 (two length-r products, ||X Y||_F <= ||X||_F ||Y||_F <= r ||X||_2 ||Y||_2);
        since p(1) = 1 and p'(1) = -1/2, P^T Z P - I moves by 2 p p' = -1 times that; P = fl(p(Z)) =
        fl(fl(a I + b Z) + c fl(Z Z)) errs by c r gamma_r (the square) and 3.25 sqrt(r) u_c (four
        roundings on entries of |b Z| + |a I + b Z| + |c Z^2| + |P| ~ (5/4 + 5/8 + 3/8 + 1) per
        diagonal entry), entering twice: (3/4) r gamma_r + 7 sqrt(r) u_c; M_k = fl(M P) errs by
        r gamma_r ||M||_2 ||P||_2, entering as 2 ||F|| ||fl(S) M P||_2: 2 r gamma_r kappa;
      * the iteration itself: every eigenvalue of M_k^T fl(S) M_k within e_k of 1
        (newton_schulz_residual, from the actual spectrum): sqrt(r) e_k;
      * W_c = fl(A M_k) errs by gamma_r ||A||_F ||M_k||_F <= r gamma_r kappa, entering twice: 2 r
        gamma_r kappa (with the above, 4 kappa);
      * the storage W = W_c + F, ||F||_F <= u_s sqrt(r): 2 sqrt(r) u_s + r u_s^2.
    First order in u_c. Attained within a small factor on small frames (tests/test_stage_attainment.py),
    where the gamma_n of length-d and length-r sums are reached by aligned roundings."""


def _quintic_deviation(e):
    """1 - x p(x)^2 at x = 1 - e, expanded exactly (no cancellation in floating point)."""
    return 5 / 8 * e**3 + 15 / 64 * e**4 + 9 / 64 * e**5


def newton_schulz_residual(d: int, r: int, u_c: float, trust_radius: float, k: int, A_F, sigma_min, sigma_max):
    """Bound e_k on |1 - x| over the eigenvalues x of M_k^T fl(S) M_k after k quintic iterations from
    the actual spectrum of S = A^T A (per frame; arrays allowed): the exact scalar map from the two
    ends of [sigma_min^2, sigma_max^2] / c (c = newton_schulz_scale(Delta)), widened by fl(S)'s error gamma_d
    A_F^2 / c; each iteration but the last perturbs the next iterate's eigenvalues by its rounding
    rho = (2 kappa^2 + 2 kappa + 3/4) r gamma_r + 7 sqrt(r) u_c (newton_schulz_defect's terms of one
    iteration), which the next iteration cubes; the last iteration's rounding is newton_schulz_defect's."""
    scale = newton_schulz_scale(trust_radius)
    sigma_min, sigma_max = np.asarray(sigma_min, dtype=np.float64), np.asarray(sigma_max, dtype=np.float64)
    kappa = sigma_max / sigma_min
    gamma_d, gamma_r = d * u_c / (1 - d * u_c), r * u_c / (1 - r * u_c)
    gram_error = gamma_d * np.asarray(A_F, dtype=np.float64) ** 2 / scale + u_c
    deviation = np.maximum(np.abs(1.0 - sigma_min**2 / scale), np.abs(sigma_max**2 / scale - 1.0)) + gram_error
    rho = (2 * kappa**2 + 2 * kappa + 0.75) * r * gamma_r + 7 * math.sqrt(r) * u_c
    with np.errstate(over="ignore", invalid="ignore"):
        for iteration in range(k):
            # the map contracts only for deviations below 1: outside, no finite residual (inf)
            deviation = np.where(deviation < 1.0, _quintic_deviation(deviation) + (rho if iteration < k - 1 else 0.0), np.inf)
    return deviation


def gram_route_defect(d: int, r: int, rounding: "Rounding", trust_radius: float, A_F, sigma_min, sigma_max):
    """Bound on the exact ||W^T W - I||_F of the frame that `rounding`'s retraction returns from A
    (||A||_F = A_F, singular values in [sigma_min, sigma_max]; per frame, arrays allowed): on the
    Newton-Schulz route newton_schulz_defect with its residual from A's own spectrum; on the other
    routes the Gram defect of a frame within the route's evaluation error (and the storage cast) of
    an orthonormal one."""
    from .bounds import gram_defect_bound

    sigma_min, sigma_max = np.asarray(sigma_min, dtype=np.float64), np.asarray(sigma_max, dtype=np.float64)
    kappa = sigma_max / sigma_min
    u_c, u_s = rounding.unit("retraction"), rounding.cast
    if rounding.route == "newton_schulz":
        e_k = newton_schulz_residual(d, r, u_c, trust_radius, rounding.iterations, A_F, sigma_min, sigma_max)
        return np.asarray(newton_schulz_defect(d=d, r=r, u_c=u_c, u_s=u_s, A_F=A_F, sigma_min=sigma_min, kappa=kappa, e_k=e_k),
                          dtype=np.float64)
    distance = retraction_error(d, r, rounding, kappa, trust_radius) + storage_cast(r=r, u_s=u_s)
    return gram_defect_bound(distance, d, r, 0.0)


def evaluated_defect(defect, d: int, r: int):
    """A bound on the exact ||W^T W - I||_F turned into one on its float64 evaluation (the certifier's
    ref.feasibility): the gram stage at ||W||_F^2 <= r (1 + defect) in float64, and 2 u relative for the
    subtraction and the norm."""
    defect = np.asarray(defect, dtype=np.float64)
    return defect * (1 + 2 * U64) + (d * U64 / (1 - d * U64)) * r * (1 + defect)


@functools.lru_cache(maxsize=4096)  # a pure function of five numbers (a fixed-point search), asked at every step of a run
def frame_drift_bound(d: int, r: int, u_s: float, u_c: float, trust_radius: float) -> float:
    """Bound on ||W^T W - I||_F (evaluated in float64) of a frame computed by the Gram route with
    Newton-Schulz in u_c and stored in u_s, whatever frame it was computed from (the correction
    property): newton_schulz_defect at the spectrum a tangent step of length <= Delta from a frame of
    drift delta allows, sigma^2 in [1 - delta, 1 + delta + Delta^2] and ||A||_F^2 <= r + sqrt(r) delta
    + Delta^2 (W^T W + xi^T xi, P3(b), Weyl), k derived from Delta, u_c and delta. The bound is a fixed
    point (the output's drift is the next input's), reached from delta = 0 in a few rounds because
    the defect depends on delta only through the spectrum and k. inf outside Delta <= 1."""
    if not (0 < trust_radius <= NEWTON_SCHULZ_MAX_TRUST_RADIUS):
        return math.inf
    drift = 0.0
    for _ in range(4):
        k = newton_schulz_iterations(trust_radius, u_c, drift)
        rounding = Rounding(u_c=u_c, u_W=u_s, route="newton_schulz", iterations=k)
        A_F = math.sqrt(r + math.sqrt(r) * drift + trust_radius**2)
        sigma_min, sigma_max = math.sqrt(1.0 - drift), math.sqrt(1.0 + drift + trust_radius**2)
        drift = float(evaluated_defect(gram_route_defect(d, r, rounding, trust_radius, A_F, sigma_min, sigma_max), d, r))
    return drift


# --------------------------------------------------------------------------------------------
# The step
# --------------------------------------------------------------------------------------------

# Unit roundoffs of the storage dtypes (IEEE 754 binary64 and binary32: 2^-53, 2^-24; bfloat16's
# 8-bit significand: 2^-8), and the dtype each computes in (docs/algorithm.md, the PyTorch kernel:
# float64 computes in float64, float32 and bfloat16 in float32 and keep m and v in float32).
UNIT_ROUNDOFFS = {"float64": U64, "float32": U32, "bfloat16": U_BF16}
COMPUTE_DTYPES = {"float64": "float64", "float32": "float32", "bfloat16": "float32"}


@dataclass(frozen=True)
class Rounding:
    """Unit roundoffs of one evaluation of the step: u_c of the computation, u_W of W's storage (W+
    is rounded to it where it is coarser than u_c), u_state of m and v (as received and returned);
    route of the retraction: "svd" (the reference), "newton_schulz" (k iterations:
    newton_schulz_iterations), "eigh" (the Gram route by the eigensolver, the model's), or "any"
    (the largest of them: an implementation whose route is not known). stage_units: (stage, unit
    roundoff) pairs for the stages an implementation declares it evaluates at another precision
    than u_c (kit/precision.py), by the names of STEP_STAGES and "bias_power"; every other stage at
    u_c."""

    u_c: float = U64
    u_W: float = 0.0
    u_state: float = 0.0
    route: str = "svd"
    iterations: int = 0
    stage_units: tuple = ()

    def unit(self, stage_name: str) -> float:
        """The unit roundoff the stage `stage_name` is evaluated at."""
        return dict(self.stage_units).get(stage_name, self.u_c)

    @property
    def cast(self) -> float:
        return self.u_W if self.u_W > self.unit("retraction") else 0.0

    def state_cast(self, stage_name: str) -> float:
        """The rounding of m (stage_name "first_moment") or v ("second_moment") into the state dtype,
        where that is coarser than the stage's own precision."""
        return self.u_state if self.u_state > self.unit(stage_name) else 0.0


@dataclass(frozen=True)
class InputErrors:
    """How far the input of the evaluation is from the exact input (per frame or scalars): W (Frobenius,
    a frame off the exact one), G_rel (relative, the gradient's rounding), m (Frobenius), v (absolute)."""

    W: object = 0.0
    G_rel: object = 0.0
    m: object = 0.0
    v: object = 0.0


@dataclass
class StepNorms:
    """Per-frame quantities of the step (from a float64 evaluation, or bounds on the exact ones):
    G = ||G||, W = ||W||_F, g = ||g||, m_in, v_in the incoming state, m = ||m|| and v after stages 3-4,
    xi_raw = ||xi|| before the cap, xi after it, A = ||W + xi||_F, sigma_min / sigma_max of W + xi,
    t the step count after stage 5."""

    G: np.ndarray
    W: np.ndarray
    g: np.ndarray
    m_in: np.ndarray
    v_in: np.ndarray
    m: np.ndarray
    v: np.ndarray
    xi_raw: np.ndarray
    xi: np.ndarray
    A: np.ndarray
    sigma_min: np.ndarray
    sigma_max: np.ndarray
    t: int


@dataclass
class StepError:
    """Bounds per frame: g, m (stage 3), v, m_hat, v_hat, q, xi (after the cap), A, W (W+), m_plus
    (transported), and well_posed (False where q or sigma_min is not above its error: no bound)."""

    g: np.ndarray
    m: np.ndarray
    v: np.ndarray
    m_hat: np.ndarray
    v_hat: np.ndarray
    q: np.ndarray
    xi: np.ndarray
    A: np.ndarray
    W: np.ndarray
    m_plus: np.ndarray
    well_posed: np.ndarray


def declared_rounding(declaration: dict, trust_radius: float, d: int, r: int) -> Rounding:
    """The Rounding of an implementation that declares its precision stage by stage (the form of
    torch_impl.functional.declared_precision: {"storage", "state", "route", "stages": {stage: dtype}},
    dtypes named as in UNIT_ROUNDOFFS): u_c the unit roundoff of its retraction stage (the dtype it
    computes in), u_W of its storage, u_state of its state, and every stage at its declared unit
    roundoff. The route "gram" is the Gram matrix with Newton-Schulz for Delta <= 1, its iteration
    count derived here from Delta, u_c and the drift of the implementation's own frames
    (frame_drift_bound), else eigh; "svd" and "eigh" are taken as declared."""
    stages = declaration["stages"]
    unknown = sorted(set(stages) - set(DECLARED_STAGES))
    if unknown:
        raise ValueError(f"declaration names stages {unknown} that the analysis does not know; known: {', '.join(DECLARED_STAGES)}")
    units = {name: UNIT_ROUNDOFFS[dtype] for name, dtype in stages.items()}
    u_c = units.get("retraction", UNIT_ROUNDOFFS[declaration["state"]])
    u_W, u_state = UNIT_ROUNDOFFS[declaration["storage"]], UNIT_ROUNDOFFS[declaration["state"]]
    stage_units = tuple(sorted((name, unit) for name, unit in units.items() if unit != u_c))
    route = declaration["route"]
    if route == "gram":
        if 0 < trust_radius <= NEWTON_SCHULZ_MAX_TRUST_RADIUS:
            drift = frame_drift_bound(d, r, u_W, u_c, trust_radius)
            k = newton_schulz_iterations(trust_radius, u_c, drift)
            return Rounding(u_c=u_c, u_W=u_W, u_state=u_state, route="newton_schulz", iterations=k, stage_units=stage_units)
        route = "eigh"
    return Rounding(u_c=u_c, u_W=u_W, u_state=u_state, route=route, stage_units=stage_units)


def kernel_declaration(dtype: str) -> dict:
    """torch_impl.functional.declared_precision for storage `dtype` (a name of UNIT_ROUNDOFFS): how
    the PyTorch kernel says it evaluates each stage, the statement its analysis holds it to."""
    import torch
    from torch_impl import functional

    return functional.declared_precision(getattr(torch, dtype))


def kernel_rounding(dtype: str, trust_radius: float, d: int, r: int) -> Rounding:
    """The Rounding of the PyTorch kernel with storage `dtype` (a name of UNIT_ROUNDOFFS), from its
    declaration (kernel_declaration, declared_rounding): u_c of its compute dtype, u_W of the storage,
    u_state and every stage as declared (beta^t in float64); the Gram route with Newton-Schulz for
    Delta <= 1 (docs/algorithm.md), the iteration count derived on the certifier's side, else eigh."""
    return declared_rounding(kernel_declaration(dtype), trust_radius, d, r)


def retraction_error(d: int, r: int, rounding: Rounding, kappa, trust_radius: float, spectrum=None):
    """The evaluation error of polar(A) on the route of `rounding` (polar_svd, polar_newton_schulz,
    polar_eigh, or for "any" the largest of the routes an implementation may take). spectrum: (A_F,
    sigma_min, sigma_max) of A per frame where known: the Newton-Schulz residual is then iterated
    from A's own spectrum (newton_schulz_residual), else taken at the target u_c that the iteration
    count reaches on the trust region's interval."""
    u_c, u_e = rounding.unit("retraction"), rounding.unit("eigensolver")
    u_M = u_c if u_e < u_c else 0.0

    def newton_schulz(k):
        e_k = u_c if spectrum is None else newton_schulz_residual(d, r, u_c, trust_radius, k, *spectrum)
        return polar_newton_schulz(d=d, r=r, u_c=u_c, kappa=kappa, k=k, e_k=e_k)

    routes = {"svd": lambda: polar_svd(d=d, r=r, u_c=u_c, kappa=kappa),
              "eigh": lambda: polar_eigh(d=d, r=r, u_c=u_c, u_e=u_e, u_M=u_M, kappa=kappa),
              "newton_schulz": lambda: newton_schulz(rounding.iterations)}
    if rounding.route in routes:
        return np.asarray(routes[rounding.route](), dtype=np.float64)
    if rounding.route != "any":
        raise ValueError(f"route must be one of svd, eigh, newton_schulz, any; got {rounding.route!r}")
    values = [routes["svd"](), routes["eigh"]()]
    if 0 < trust_radius <= NEWTON_SCHULZ_MAX_TRUST_RADIUS:
        values.append(newton_schulz(newton_schulz_iterations(trust_radius, u_c, drift=0.01)))
    return np.maximum.reduce([np.asarray(v, dtype=np.float64) for v in values])


def step_error(d: int, r: int, config, q: StepNorms, rounding: Rounding = Rounding(), inputs: InputErrors = InputErrors()) -> StepError:
    """Bound on the distance of one evaluation of the step (unit roundoffs and route of `rounding`,
    at an input within `inputs` of the exact one) from the exact step at the exact input; every
    stage bound is one Stage (module docstring), evaluated at the quantities q."""
    beta1, beta2 = config.betas
    lam, lr, eps, delta = config.weight_decay, config.lr, config.eps, config.trust_radius
    n = d * r
    unit = rounding.unit
    with quiet():
        E_Gd = decay(u_c=unit("decay"), G=q.G, lam=lam, W=q.W, G_rel=inputs.G_rel, W_err=inputs.W)
        E_g = projection(d=d, r=r, u_c=unit("projection"), X=q.G + lam * q.W, X_err=E_Gd, W_err=inputs.W)
        E_m = first_moment(u_c=unit("first_moment"), beta1=beta1, m_in=q.m_in, m_in_err=inputs.m, g=q.g, g_err=E_g)
        E_m = E_m + moment_cast(u_state=rounding.state_cast("first_moment"), x=q.m)
        s = q.g**2 / n
        E_s = mean_square(n=n, u_c=unit("mean_square"), g=q.g, g_err=E_g, X=q.G + lam * q.W)
        E_v = second_moment(u_c=unit("second_moment"), beta2=beta2, v_in=q.v_in, v_in_err=inputs.v, s=s, s_err=E_s)
        E_v = E_v + moment_cast(u_state=rounding.state_cast("second_moment"), x=q.v)
        hats = []
        for beta, x, x_err in ((beta1, q.m, E_m), (beta2, q.v, E_v)):
            beta_t = beta**q.t
            log_beta = abs(math.log(beta)) if beta > 0 else 0.0
            hats.append(bias_correction(u_c=unit("bias_correction"), u_p=unit("bias_power"), t=q.t, beta_t=beta_t,
                                        log_beta=log_beta, x=x, x_err=x_err))
        E_mh, E_vh = hats
        b1, b2 = 1 - beta1**q.t, 1 - beta2**q.t
        v_hat = q.v / b2
        root = np.sqrt(v_hat)
        qd = root + eps
        E_q = denominator(u_c=unit("denominator"), q=qd, sqrt_err=square_root(u_c=unit("square_root"), x=v_hat, x_err=E_vh))
        margin = qd - E_q
        # xi = 0 exactly on both sides: where the computed v^ is 0 and its error is 0 (g = 0, v_in = 0
        # exactly), or where T_W = {0} (d = r = 1): the exact step is 0 at every input, and the computed
        # one is 0 wherever the computed v^ is (xi = 0 where v^ = 0, stage 6)
        exactly_still = (v_hat == 0) & ((E_vh == 0) | (d * r - r * (r + 1) // 2 == 0))
        possibly_still = (E_vh >= v_hat) & ~exactly_still
        E_xi0 = direction(u_c=unit("direction"), lr=lr, xi=q.xi_raw, q=qd, q_err=E_q, m_hat_err=E_mh)
        undetermined = direction_undetermined(lr=lr, m_hat=q.m / b1, m_hat_err=E_mh, q=qd, q_err=E_q)
        E_xi0 = np.where(possibly_still, np.fmax(E_xi0, undetermined), E_xi0)
        E_xi0 = np.where(exactly_still, 0.0, E_xi0)
        # q not above its error: the direction is not determined at this rounding level (no bound on
        # xi); E_W is then the 2 sqrt(r) of polar_perturbation's sigma_lo <= 0 and well_posed is False
        E_xi0 = np.where(exactly_still | (margin > 0), E_xi0, np.inf)
        cap = 0.0 if math.isinf(delta) else np.minimum(q.xi_raw, delta)
        E_xi = trust_region(n=n, u_c=unit("trust_region"), xi_err=E_xi0, cap=cap, raw=q.xi_raw, radius=delta)
        E_A = step_sum(u_c=unit("step_sum"), A=q.A, W_err=inputs.W, xi_err=E_xi)
        sigma_lo = q.sigma_min - E_A
        well_posed = (exactly_still | (margin > 0)) & (sigma_lo > 0) & np.isfinite(E_xi)
        sigma_lo_positive = np.where(sigma_lo > 0, sigma_lo, np.nan)
        kappa = (q.sigma_max + E_A) / sigma_lo_positive
        # the computed A's spectrum lies within E_A of the exact A's (Weyl)
        spectrum = (q.A + E_A, sigma_lo_positive, q.sigma_max + E_A)
        E_W = (polar_perturbation(r=r, dA=E_A, sigma_lo=np.where(sigma_lo > 0, sigma_lo, 0.0))
               + retraction_error(d, r, rounding, kappa, delta, spectrum) + storage_cast(r=r, u_s=rounding.cast))
        E_W = np.where(sigma_lo > 0, E_W, 2 * math.sqrt(r))
        E_m_plus = projection(d=d, r=r, u_c=unit("projection"), X=q.m, X_err=E_m, W_err=E_W)
    shape = np.broadcast_shapes(*(np.shape(x) for x in (E_W, E_m_plus, E_v, well_posed)))

    def b(x):  # every output at the common shape (already there: as it is, no view made)
        x = np.asarray(x, dtype=np.float64)
        return x if x.shape == shape else np.broadcast_to(x, shape)

    return StepError(g=b(E_g), m=b(E_m), v=b(E_v), m_hat=b(E_mh), v_hat=b(E_vh), q=b(E_q), xi=b(E_xi), A=b(E_A),
                     W=b(E_W), m_plus=b(E_m_plus), well_posed=np.broadcast_to(well_posed, shape))


# The stages step_error composes, in the order of docs/algorithm.md (the texts cite them all).
# The stages an implementation may declare a precision for (torch_impl.functional.STAGES).
DECLARED_STAGES = ("decay", "projection", "first_moment", "mean_square", "second_moment", "bias_power", "bias_correction",
                   "square_root", "denominator", "direction", "trust_region", "step_sum", "retraction", "eigensolver")

STEP_STAGES = ("decay", "projection", "first_moment", "mean_square", "second_moment", "moment_cast", "bias_power", "bias_correction",
               "square_root", "denominator", "direction", "direction_undetermined", "trust_region", "step_sum",
               "polar_perturbation", "polar_svd", "polar_newton_schulz", "polar_eigh", "storage_cast")


def stage_texts(names=STEP_STAGES) -> str:
    """The rendered formulas of the named stages, '; '-separated: what a certificate cites."""
    return "; ".join(STAGES[name].text() for name in names)


# The stages each output's bound passes through: W+ all of them, the transported m+ those of g and m
# and then the projection again (X = ||m||, X_err = E_m, W_err = E_W), v those of g and v.
MOMENT_STAGES = ("decay", "projection", "first_moment", "moment_cast")
SECOND_MOMENT_STAGES = ("decay", "projection", "mean_square", "second_moment", "moment_cast")

_PREAMBLE = ("step_error (propositions/kit/step_analysis.py), one stage bound per stage of docs/algorithm.md, each "
             "propagating the errors of its inputs (u_c the compute dtype's unit roundoff, u_s the storage's, "
             "W_err the input frame's error)")


def step_error_text(output: str = "W") -> str:
    """The citation of step_error's bound on one output ("W", "m" the transported m+, "moment" stage 3's
    m, or "v"), its stages rendered."""
    if output == "W":
        return f"{_PREAMBLE}: {stage_texts()}"
    if output == "m":
        return (f"{_PREAMBLE}, for m+ = P_W+(m): {stage_texts(MOMENT_STAGES)}; then the projection again at X = ||m||, "
                "X_err = E_m, W_err = E_W (the bound on W+)")
    if output == "v":
        return f"{_PREAMBLE}, for v: {stage_texts(SECOND_MOMENT_STAGES)}"
    if output == "moment":
        return f"{_PREAMBLE}, for stage 3's m (before its transport): {stage_texts(MOMENT_STAGES)}"
    raise ValueError(f"output must be W, m, moment or v, got {output!r}")


STEP_ERROR_TEXT = step_error_text("W")


def clip_bound(entries: int, units: int, dtype_name: str) -> float:
    """Relative error of one unit's clipped gradient against c G, c = min(1, max_norm / (total + 1e-6))
    from the exact norms of the gradients the class holds: each unit's norm sums `entries` squares
    (gamma_n, accumulated in the compute dtype u_c: float32 for a float32 or bfloat16 gradient) and is
    returned in the gradient's dtype (u_g); the total sums `units` squares of them (u_t: float64 if any
    gradient is float64, else float32) with its root; adding 1e-6 and dividing round by u_t each; the
    product c G rounds once to the gradient's dtype. First order: (entries + 2) u_c + u_g + (units + 4) u_t + u_g.
    The same bound holds for the other norm types clip_grad_norm_finite_ takes: for p = 1 and 3 each
    |x|^p errs by at most 4 u (a pow within 4 ulps), the sum by gamma_n, and the p-th root divides the
    relative error by p and adds its own few ulps: ((n + 4) / p + 2) u <= (n + 2) u for n >= 1 and
    p >= 1, and likewise (units + 4) u_t for the total; the inf-norm is a maximum of the same entries,
    exact but for the rounding of each unit's norm to the gradient's dtype."""
    u_g = UNIT_ROUNDOFFS[dtype_name]
    u_c = UNIT_ROUNDOFFS[COMPUTE_DTYPES[dtype_name]]
    u_t = UNIT_ROUNDOFFS["float64" if dtype_name == "float64" else "float32"]
    return (entries + 2) * u_c + 2 * u_g + (units + 4) * u_t


__all__ = ["InputErrors", "Rounding", "StepError", "StepNorms", "Stage", "STEP_STAGES", "STEP_ERROR_TEXT", "step_error_text",
           "frame_drift_bound", "gram_route_defect", "evaluated_defect", "newton_schulz_residual", "kernel_rounding", "declared_rounding", "kernel_declaration", "DECLARED_STAGES", "newton_schulz_iterations", "UNIT_ROUNDOFFS", "COMPUTE_DTYPES", "retraction_error", "stage_texts", "step_error",
           "reference_quantities", "step_norms_of", "clip_bound"]


# --------------------------------------------------------------------------------------------
# The quantities of the step at a point, from the float64 reference
# --------------------------------------------------------------------------------------------


def step_norms_of(q: dict, r: int) -> StepNorms:
    """The StepNorms of `reference_quantities` (W at an exact frame: ||W||_F = sqrt(r))."""
    return StepNorms(G=q["G"], W=math.sqrt(r), g=q["g"], m_in=q["m_old"], v_in=q["v_old"], m=q["m"], v=q["v"],
                     xi_raw=q["xi_unclipped"], xi=q["xi"], A=q["A"], sigma_min=q["sigma_min"], sigma_max=q["A_2"], t=q["t"])


def reference_quantities(W, G, state, config):
    """Per-frame norms of the reference step's intermediates (float64, shape W.shape[:-2])."""
    beta1, beta2 = config.betas
    d, r = W.shape[-2], W.shape[-1]
    G_decayed = G + config.weight_decay * W
    g = ri.project_tangent(W, G_decayed, validate=False)  # also at a kernel frame (P2 on the kernel)
    m = beta1 * state.m + (1 - beta1) * g
    v = beta2 * state.v + (1 - beta2) * np.sum(g * g, axis=(-2, -1)) / (d * r)
    t = state.t + 1
    bc1, bc2 = 1 - beta1**t, 1 - beta2**t
    xi_unclipped = ri.scale_free_direction(m / bc1, v / bc2, config.lr, config.eps)
    xi = ri.clip_to_trust_region(xi_unclipped, config.trust_radius)
    A = W + xi
    # singular values of A from the r x r Gram matrix: only sigma_max and sigma_min in [~1, ~1.1]
    # are needed, to relative accuracy far better than the bounds' constants
    gram_eigenvalues = np.linalg.eigvalsh(np.swapaxes(A, -1, -2) @ A)
    singular_values = np.sqrt(np.maximum(gram_eigenvalues, 0.0))[..., ::-1]
    return {
        "G": ri.frobenius(G),
        "G_decayed": ri.frobenius(G_decayed),
        "g": ri.frobenius(g),
        "m_old": ri.frobenius(state.m),
        "m": ri.frobenius(m),
        "v_old": np.asarray(state.v, dtype=np.float64),
        "v": v,
        "t": t,
        "bc1": bc1,
        "bc2": bc2,
        "root_v_hat": np.sqrt(v / bc2),
        "xi_unclipped": ri.frobenius(xi_unclipped),
        "xi": ri.frobenius(xi),
        "A": ri.frobenius(A),
        "A_2": singular_values[..., 0],
        "sigma_min": singular_values[..., -1],
    }
