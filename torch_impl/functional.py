"""The StiefelAdam step of docs/algorithm.md as one batched PyTorch function (CPU and CUDA).

    1. G~ = G + lambda W
    2. g  = P_W(G~) = G~ - W sym(W^T G~)
    3. m  = beta1 m + (1 - beta1) g
    4. v  = beta2 v + (1 - beta2) ||g||^2 / (d r)          one scalar per frame
    5. t  = t + 1;  m^ = m / (1 - beta1^t);  v^ = v / (1 - beta2^t)
    6. xi = -lr m^ / (sqrt(v^) + eps);  xi = 0 where v^ = 0 (never 0/0)
    7. if ||xi||_F > Delta: xi = xi Delta / ||xi||_F       per frame, Frobenius norm
    8. W+ = polar(W + xi);  m+ = P_{W+}(m)

Products. The step's cost is its d x r^2 matrix products; it takes five: W^T m and W^T G~,
W sym(.) for the projection of beta1 m + (1 - beta1) G~ (stage 8's transport of the previous
step and stages 2-3 of this one share it: P_W is linear), the Gram matrix (W + xi)^T (W + xi) and
(W + xi) S^(-1/2). ||g||^2 comes from r x r quantities (`gradient_norm_squared`) where that is as
accurate as forming g, else g is formed (a sixth; at once, without the test, for shapes where
random gradients fail it, `gram_identity_worth_testing`). The moment that the step returns is therefore
stage 3's m, tangent at the old frame; `transported_moment` gives stage 8's m+.

Every frame along the leading axes of W (..., d, r) is one independent problem: all stages are
batched tensor operations, with no Python loop over frames. Storage dtypes float64, float32 and
bfloat16 are accepted; float64 computes in float64, the others compute in float32 and keep the
state (m, v) in float32, because bfloat16's 8-bit significand cannot hold an Adam moment.

The retraction
--------------
polar(A), A = W + xi (d x r), is computed from the *actual* r x r Gram matrix S = A^T A as
A S^(-1/2), never from the shortcut (I + xi^T xi)^(-1/2): the shortcut assumes W^T W = I exactly and
so lets storage rounding accumulate into drift (docs/algorithm.md#pitfalls), while A S^(-1/2) is orthonormal
to rounding whatever W^T W was. A thin d x r SVD is avoided: it is the slowest batched factorisation
on both CPU and GPU, and only the r x r matrix S^(-1/2) is needed.

S^(-1/2) is evaluated by one of two methods (``retraction_method``):

* "newton_schulz" (used when Delta <= NEWTON_SCHULZ_MAX_TRUST_RADIUS): the convergent quintic
  polar iteration X <- X (15/8 I - 5/4 X^T X + 3/8 (X^T X)^2), started at X_0 = A / sqrt(c), run on
  the r x r factor M with X_k = A M_k (so X_k^T X_k = M_k S M_k): matmuls only, fast on GPUs where
  batched eigh is slow, and about twice as fast as eigh on CPU at r = 128. It converges only in a
  basin, and the trust region puts S there: for tangent xi with ||xi|| <= Delta, S = I + xi^T xi
  has its spectrum in [1, 1 + Delta^2] (P3(b), docs/claims.md); but a step is tangent only up to the
  rounding of its projection, which for a gradient that is normal up to rounding at eps = 0 (the
  noise-driven step) is all of it, so the basin is taken for any xi with ||xi||_F <= Delta:
  singular values of A in [sqrt(1 - a) - Delta, sqrt(1 + a) + Delta] (`newton_schulz_interval`, a the
  drift allowance), c the middle of the squared interval. One iteration maps x to x p(x)^2 with
  1 - x p(x)^2 = 5/8 (1 - x)^3 + O((1 - x)^4), so the error cubes each time;
  `newton_schulz_iterations` iterates this scalar map exactly from the two ends of the interval and
  returns the first count that brings |1 - x| below the compute dtype's unit roundoff: at
  Delta = 0.5, 5 iterations in float64 and 4 in float32 (on the tangent interval alone 3 and 2 had
  sufficed, and a noise-driven step left its frame off St by up to 1e-5 in float64). Delta <= 0.75
  keeps the count at most 6. The remaining error is rounding, O((d + r) u) as for eigh. Muon's tuned coefficients are *not* used: they only
  push singular values into a band and do not give a polar factor.
* "eigh" (used otherwise, e.g. Delta = inf or Delta > 0.75, where the spectrum of S is unbounded):
  S = Q diag(lambda) Q^T by a batched torch.linalg.eigh and S^(-1/2) = Q diag(lambda^-1/2) Q^T, the
  r x r eigenproblem solved in float64 for every storage dtype (EIGENSOLVER_DTYPE). The orthogonality error of A S^(-1/2) is about cond(A)^2 u = (1 + ||xi||_2^2) u: fine for the
  moderate steps that Adam takes (length about lr sqrt(d r)); for steps with ||xi||_2 >> 1, which
  only trust_radius = inf allows, it degrades as cond^2, and a finite trust radius is the remedy.
"""

from __future__ import annotations

import functools
import math

import torch

NEWTON_SCHULZ_MAX_TRUST_RADIUS = 0.75

# Quintic polar iteration X <- X (a I + b X^T X + c (X^T X)^2): the coefficients of the Taylor
# polynomial of (X^T X)^(-1/2) about I to second order, p(x) = 15/8 - 5/4 x + 3/8 x^2, which makes
# x = 1 a fixed point of x p(x)^2 of order three (convergent; not Muon's band-pushing 3.4445, ...).
QUINTIC_COEFFICIENTS = (15.0 / 8.0, -5.0 / 4.0, 3.0 / 8.0)

# Allowance for eigenvalues of S outside [1, 1 + Delta^2]: W^T W = I + D with ||D|| the storage
# drift (bfloat16 storage rounds a frame with relative error u_s = 2^-8 per entry, so
# ||D||_2 <= 2 u_s (1 + sqrt(r/d)) ~ 8e-3 at worst, below this allowance) and
# the rounding of W^T xi + xi^T W. The iteration counts below hold for any drift up to this value.
DRIFT_ALLOWANCE = 1e-2

RETRACTION_METHODS = ("auto", "newton_schulz", "eigh")


def memoized(function):
    """function with its results kept per argument tuple (pure scalar helpers that the step calls
    with a few distinct arguments: iteration counts, bounds, tolerances). Under torch.compile the
    function is called directly: the compiler evaluates it once while tracing, and would warn about
    a cache it cannot see through."""
    cache: dict = {}

    @functools.wraps(function)
    def cached(*args):
        if torch.compiler.is_compiling():
            return function(*args)
        try:
            return cache[args]
        except KeyError:
            value = cache[args] = function(*args)
            return value

    return cached


def compute_dtype(dtype: torch.dtype) -> torch.dtype:
    """float64 storage computes in float64; float32 and bfloat16 (and float16) in float32."""
    return torch.float64 if dtype == torch.float64 else torch.float32


# beta^t and 1 - beta^t are formed in float64 whatever the storage: 1 - beta^t cancels, and beta
# rounded to float32 alone moves 1 - beta2 by 216 u (beta2 = 0.999) to 22784 u (0.99999) relative
BIAS_POWER_DTYPE = torch.float64

# The eigh route's r x r eigenproblem is solved in float64 whatever the storage: it costs r^3 per
# frame against the d r^2 of the Gram matrix, and the eigensolver's own rounding (its Householder
# reflectors and up to 30 r^2 rotations) would otherwise dominate the retraction's error in float32
EIGENSOLVER_DTYPE = torch.float64

# The stages of docs/algorithm.md in the order the step evaluates them, by the names of the
# certifier's rounding analysis; "bias_power" is beta^t and 1 - beta^t, "bias_correction" the
# divisions m / (1 - beta1^t), v / (1 - beta2^t) that apply them; "retraction" the Gram matrix, the
# Newton-Schulz iteration and A S^(-1/2), "eigensolver" the eigh route's r x r eigenproblem and
# S^(-1/2) = V diag(lambda^-1/2) V^T.
STAGES = ("decay", "projection", "first_moment", "mean_square", "second_moment", "bias_power",
          "bias_correction", "square_root", "denominator", "direction", "trust_region", "step_sum", "retraction",
          "eigensolver")


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).replace("torch.", "")


def declared_precision(dtype: torch.dtype) -> dict:
    """How this kernel evaluates the step for frames stored in `dtype`, stage by stage: what the
    certifier's rounding analysis holds it to (propositions/kit/precision.py reads it; a stage
    evaluated more coarsely than declared fails the cross-check).

    Returns {"storage": the dtype W and G are received in and W+ is returned in, "state": the dtype
    of m and v as received and returned, "route": "gram" (the polar factor from the actual Gram
    matrix: Newton-Schulz for trust_radius <= 0.75, eigh above), "stages": {stage: dtype}} with every
    name of STAGES: the dtype that stage's operations round in. Every stage computes in
    `compute_dtype(dtype)` except bias_power, formed in BIAS_POWER_DTYPE and rounded once to the
    compute dtype where it is applied, and the eigensolver, in EIGENSOLVER_DTYPE with S^(-1/2)
    rounded once to the compute dtype. Dtypes are named as torch names them ("float32").
    """
    work = _dtype_name(compute_dtype(dtype))
    stages = {stage: work for stage in STAGES}
    stages["bias_power"] = _dtype_name(BIAS_POWER_DTYPE)
    stages["eigensolver"] = _dtype_name(EIGENSOLVER_DTYPE)
    return {"storage": _dtype_name(dtype), "state": work, "route": "gram", "stages": stages}


def unit_roundoff(dtype: torch.dtype) -> float:
    """u = eps/2 of a floating dtype: 2^-53 float64, 2^-24 float32, 2^-8 bfloat16, 2^-11 float16."""
    return torch.finfo(dtype).eps / 2.0


@memoized
def newton_schulz_iterations(trust_radius: float, dtype: torch.dtype) -> int:
    """Quintic iterations that bring every eigenvalue of X^T X to 1 within unit_roundoff(dtype).

    Iterates the exact scalar map x -> x p(x)^2 from both ends of the interval that contains the
    eigenvalues of S / c (see the module docstring), widened by DRIFT_ALLOWANCE; raises ValueError
    for trust radii outside the basin (use the eigh method there).
    """
    if not (0 < trust_radius <= NEWTON_SCHULZ_MAX_TRUST_RADIUS):
        raise ValueError(
            f"trust_radius must satisfy 0 < trust_radius <= {NEWTON_SCHULZ_MAX_TRUST_RADIUS} for the "
            f"Newton-Schulz retraction, got {trust_radius!r}"
        )
    low, high = newton_schulz_interval(trust_radius)
    scale = (low + high) / 2.0
    # deviations delta = 1 - x at the two ends of the interval of eigenvalues of S / c
    deviations = [1.0 - low / scale, high / scale - 1.0]
    target = unit_roundoff(dtype)
    for iterations in range(1, 16):
        # 1 - x p(x)^2 at x = 1 - delta, expanded exactly (no cancellation in floating point):
        # (1 - delta)(1 + delta/2 + 3 delta^2/8)^2 = 1 - 5/8 delta^3 - 15/64 delta^4 - 9/64 delta^5
        deviations = [5 / 8 * e**3 + 15 / 64 * e**4 + 9 / 64 * e**5 for e in deviations]
        if max(abs(e) for e in deviations) <= target:
            return iterations
    raise AssertionError("the quintic iteration failed to converge inside its basin")  # unreachable


def newton_schulz_interval(trust_radius: float) -> tuple[float, float]:
    """[low, high], an interval that holds every eigenvalue of S = A^T A for A = W + xi with
    ||xi||_F <= Delta in any direction and ||W^T W - I||_2 <= DRIFT_ALLOWANCE: by Weyl the singular
    values of A lie in [sqrt(1 - a) - Delta, sqrt(1 + a) + Delta]. Any direction, not only tangent
    ones: a step is tangent only up to the rounding of its projection, and for a gradient that is
    normal up to rounding at eps = 0 (the noise-driven step, docs/algorithm.md#pitfalls) that rounding
    is all of it, a full-length step half normal; on the tangent interval [1, 1 + Delta^2] alone the
    iteration then stopped short and left such a frame off St(d, r) by up to 1e-5 in float64."""
    return (math.sqrt(1.0 - DRIFT_ALLOWANCE) - trust_radius) ** 2, (math.sqrt(1.0 + DRIFT_ALLOWANCE) + trust_radius) ** 2


def newton_schulz_scale(trust_radius: float) -> float:
    """c of the first iterate X_0 = A / sqrt(c): the middle of newton_schulz_interval."""
    low, high = newton_schulz_interval(trust_radius)
    return (low + high) / 2.0


@memoized
def resolve_retraction(method: str, trust_radius: float) -> str:
    if method not in RETRACTION_METHODS:
        raise ValueError(f"retraction_method must be one of {RETRACTION_METHODS}, got {method!r}")
    if method == "auto":
        return "newton_schulz" if trust_radius <= NEWTON_SCHULZ_MAX_TRUST_RADIUS else "eigh"
    if method == "newton_schulz":
        newton_schulz_iterations(trust_radius, torch.float64)  # raises outside the basin
    return method


def _identity_like(S: torch.Tensor) -> torch.Tensor:
    return torch.eye(S.shape[-1], dtype=S.dtype, device=S.device)


@memoized
def _scaled_identity(value: float, r: int, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """value I_r (r, r), kept per arguments (never written to: the iteration only reads it)."""
    return value * torch.eye(r, dtype=dtype, device=device)


def _inverse_sqrt_newton_schulz(S: torch.Tensor, trust_radius: float) -> torch.Tensor:
    """M ~ S^(-1/2) for Gram matrices S (B, r, r) with spectrum in newton_schulz_interval(Delta)."""
    a, b, c = QUINTIC_COEFFICIENTS
    scale = newton_schulz_scale(trust_radius)
    a_identity = _scaled_identity(a, S.shape[-1], S.dtype, S.device)  # broadcast over the batch
    # the first iterate X_0 = A / sqrt(c) is M_0 = I / sqrt(c): start from its closed form
    XtX = S / scale
    M = torch.add(a_identity, XtX, alpha=b)
    M = torch.baddbmm(M, XtX, XtX, alpha=c).mul_(1.0 / math.sqrt(scale))
    for _ in range(newton_schulz_iterations(trust_radius, S.dtype) - 1):
        # X^T X for X = A M, formed as M S M (M is symmetric up to rounding); keeping the actual
        # Gram of the iterate, not S M^2, makes each iteration correct the previous one's rounding.
        XtX = torch.bmm(torch.bmm(M, S), M)
        polynomial = torch.baddbmm(torch.add(a_identity, XtX, alpha=b), XtX, XtX, alpha=c)
        M = torch.bmm(M, polynomial)
    return M


def _inverse_sqrt_eigh(S: torch.Tensor) -> torch.Tensor:
    """S^(-1/2) by the symmetric eigensolver in EIGENSOLVER_DTYPE, rounded back to S's dtype.

    A frame whose step is not finite (a NaN gradient under skip_nonfinite) gives a non-finite S, on
    which LAPACK's eigh raises for the whole batch: it is decomposed as I instead and its result
    made NaN, so that the caller sees that frame, and only it, as not finite."""
    finite = torch.isfinite(S).all(dim=-1).all(dim=-1)[:, None, None]
    eigenvalues, eigenvectors = torch.linalg.eigh(torch.where(finite, S, _identity_like(S)).to(EIGENSOLVER_DTYPE))
    inverse_sqrt = ((eigenvectors * eigenvalues.rsqrt().unsqueeze(-2)) @ eigenvectors.mT).to(S.dtype)
    return torch.where(finite, inverse_sqrt, math.nan)


def _in_dtype(x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """x as dtype (x itself, without a dispatch, when it already is)."""
    return x if x.dtype == dtype else x.to(dtype)


def _shaped(x: torch.Tensor, shape) -> torch.Tensor:
    """x.reshape(shape), or x itself where a 1-d x is reshaped to (-1,) or x has that shape already."""
    if tuple(shape) == (-1,):
        return x if x.dim() == 1 else x.reshape(-1)
    return x if x.shape == shape else x.reshape(shape)


def _as_batch3(x: torch.Tensor) -> torch.Tensor:
    # (x itself, without a dispatch, when it already is (B, d, r): a small step's calls are its cost)
    return x if x.dim() == 3 else x.reshape((-1,) + tuple(x.shape[-2:]))


def polar_retract(W: torch.Tensor, xi: torch.Tensor, trust_radius: float = 0.5, method: str = "auto") -> torch.Tensor:
    """polar(W + xi) from the actual Gram matrix, shape (..., d, r), dtype of W (float32/float64).

    method "auto" picks Newton-Schulz when trust_radius <= 0.75 (the step must then satisfy
    ||xi||_F <= trust_radius, as the optimizer guarantees) and eigh otherwise. On the eigh route a
    frame whose Gram matrix is not finite comes back NaN in every entry, and only that frame.
    """
    if resolve_retraction(method, trust_radius) == "newton_schulz":
        # outside the trust region the spectrum of the Gram matrix leaves the iteration's basin
        # and the result is not a frame: refuse rather than return it
        largest = float(torch.linalg.matrix_norm(xi.to(torch.float64)).max()) if xi.numel() else 0.0
        if largest > trust_radius * (1 + DRIFT_ALLOWANCE):
            raise ValueError(
                f"xi must satisfy ||xi||_F <= trust_radius = {trust_radius:g} for the Newton-Schulz "
                f"retraction, got {largest:.3g}; pass method='eigh' for longer steps"
            )
    return polar_factor(W + xi, trust_radius, method)


def polar_factor(A: torch.Tensor, trust_radius: float = 0.5, method: str = "auto") -> torch.Tensor:
    """polar(A) = A (A^T A)^(-1/2) for A = W + xi with ||xi||_F <= trust_radius, shape (..., d, r).

    Unchecked: the caller guarantees the trust region when the method resolves to Newton-Schulz.
    """
    shape = A.shape
    A = _as_batch3(A)
    S = torch.bmm(A.mT, A)
    if resolve_retraction(method, trust_radius) == "newton_schulz":
        M = _inverse_sqrt_newton_schulz(S, trust_radius)
    else:
        M = _inverse_sqrt_eigh(S)
    return _shaped(torch.bmm(A, M), shape)


def project_tangent(W: torch.Tensor, G: torch.Tensor) -> torch.Tensor:
    """P_W(G) = G - W sym(W^T G), shapes (..., d, r)."""
    W3, G3 = _as_batch3(W), _as_batch3(G)
    WtG = torch.bmm(W3.mT, G3)
    # G - W (WtG + WtG^T) / 2 as one fused multiply-add
    return torch.baddbmm(G3, W3, torch.add(WtG, WtG.mT), alpha=-0.5).reshape(G.shape)


def feasibility(W: torch.Tensor) -> torch.Tensor:
    """||W^T W - I_r||_F per frame, computed in float64; shape W.shape[:-2]."""
    W64 = W.to(torch.float64)
    gram = W64.mT @ W64
    return torch.linalg.matrix_norm(gram - _identity_like(gram))


def frame_deviation(W: torch.Tensor) -> torch.Tensor:
    """||fl(W^T W) - I_r||_F per frame, in W's dtype: one batched r x r Gram product, the check
    that the optimizer makes of every frame at every step. W: (B, d, r), float32 or float64;
    returns (B,). Its own error: fl(W^T W) errs by gamma_d |W|^T |W| entrywise, of Frobenius norm
    at most d u ||W||_F^2 = d r u for a frame (plus u per subtraction of the identity), which the
    manifold tolerance's d r u term already holds (optimizer.manifold_tolerance). A NaN or inf
    entry of W gives a non-finite deviation."""
    # -I + W^T W in one call (the identity is kept per (r, dtype, device), broadcast over the batch)
    deviation = torch.baddbmm(_scaled_identity(-1.0, W.shape[-1], W.dtype, W.device), W.mT, W)
    return torch.linalg.vector_norm(deviation, dim=(-2, -1))


def decayed_gradient(W: torch.Tensor, G: torch.Tensor, weight_decay: float = 0.0) -> torch.Tensor:
    """Stage 1: G~ = G + lambda W, shapes (..., d, r) in one compute dtype."""
    return torch.add(G, W, alpha=weight_decay) if weight_decay != 0 else G


def _sym(K: torch.Tensor) -> torch.Tensor:
    return torch.add(K, K.mT).mul_(0.5)


def project_moment(W: torch.Tensor, G_decayed: torch.Tensor, m: torch.Tensor, beta1: float):
    """Stages 2-3 with the previous step's transport: P_W(beta1 m + (1 - beta1) G~).

    m is the moment that the previous step left (tangent at the previous frame, not yet
    transported); P_W is linear, so beta1 P_W(m) + (1 - beta1) P_W(G~), the transported moment
    plus the projected gradient, is one projection: W^T m and W^T G~ (two d x r^2 products, the
    second kept for ||P_W G~||^2) and one W sym(.) product. beta1 and 1 - beta1 are each rounded
    from float64 (torch.lerp would form 1 - beta1 in the compute dtype, a relative error
    u beta / (1 - beta) in the update). Returns (m_new tangent at W, W^T G~), shapes (B, d, r),
    (B, r, r) for batched W (B, d, r).
    """
    WtG = torch.bmm(W.mT, G_decayed)
    if beta1 == 0:
        return torch.baddbmm(G_decayed, W, _sym(WtG), alpha=-1.0), WtG
    combined = _sym(torch.add(torch.bmm(W.mT, m).mul_(beta1), WtG, alpha=1 - beta1))
    m_new = (m * beta1).add_(G_decayed, alpha=1 - beta1)
    return m_new.baddbmm_(W, combined, alpha=-1.0), WtG


@memoized
def frame_drift_bound(d: int, r: int, dtype: torch.dtype, trust_radius: float, method: str = "auto") -> float:
    """Bound on ||W^T W - I||_F for a frame that this kernel returned (the precondition under
    which `gradient_norm_squared` may use its r x r identity); inf for the eigh retraction.

    W = fl_s(fl(A M)) with S = A^T A, M ~ S^(-1/2). fl(S) errs by gamma_d |A|^T |A|, of Frobenius
    norm <= d u ||A||_F^2 <= d (r + Delta^2) u, and ||M||_2 <= 1 (S >= I up to drift), so
    M fl(S) M - I moves by at most that; the Newton-Schulz iterate leaves |1 - x| <= u per
    eigenvalue (sqrt(r) u) and the r x r products of its last iteration 7 r^1.5 u: each iteration
    forms the Gram matrix of its own iterate and corrects it, so the earlier iterations' rounding
    does not stay in the defect (the distance to the polar factor is another matter: it does, and
    the certifier counts it there); the product A M (length-r inner products) errs by
    r u || |A| |M| ||_F <= r u ||A||_F <= r^1.5 kappa u, which moves W^T W by twice that; storing W
    in a dtype of unit roundoff u_s adds 2 sqrt(r) u_s (||E||_F <= u_s ||W||_F). First order in u.
    """
    if resolve_retraction(method, trust_radius) != "newton_schulz":
        return math.inf
    work = compute_dtype(dtype)
    u_c, u_s = unit_roundoff(work), unit_roundoff(dtype)
    kappa = math.sqrt(1.0 + trust_radius**2)
    return (d * (r + trust_radius**2) + (2 * kappa + 7) * r**1.5 + math.sqrt(r)) * u_c + 2 * math.sqrt(r) * u_s


def gradient_norm_squared(
    W: torch.Tensor, G_decayed: torch.Tensor, WtG: torch.Tensor, drift: float, sync_free: bool = False
) -> torch.Tensor:
    """||P_W(G~)||^2 per frame, from r x r quantities where that is as accurate as forming P_W(G~).

    With Sigma = sym(W^T G~) and D = W^T W - I, ||G~ - W Sigma||^2 = ||G~||^2 - ||Sigma||^2 +
    <D, Sigma^2>, so the norm needs only ||G~||^2 (one pass) and the r x r Sigma. Its rounding
    (u the compute dtype's, first order): ||G~||^2 sums d r squares, (d r + 3) u ||G~||^2 with the
    norm's square root and squaring; fl(W^T G~) errs by gamma_d |W|^T |G~|, Frobenius norm
    <= d sqrt(r) u ||G~||, and symmetrising by u ||Sigma||, which moves ||Sigma||^2 by
    2 (d + 2) sqrt(r) u ||Sigma|| ||G~||; ||Sigma||^2 sums r^2 squares, (r^2 + 3) u ||Sigma||^2;
    the difference rounds by u ||g||^2; and the drift term is at most
    ||D||_F ||Sigma^2||_F <= `drift` ||Sigma||_F^2 (`drift` bounds ||D||_F: `frame_drift_bound`).
    The identity cancels when G~ is mostly normal (||Sigma|| ~ ||G~||), so it is used only when
    this total is at most the rounding that step_error_bound allows the explicit route
    ||fl(G~ - W Sigma)||^2: d r u ||g||^2 + 2 (d + r + 2) sqrt(r) u ||g|| ||G~|| (the sum of squares
    and the projection error). Where the coarse drift term ||Sigma||_F^2 is what fails, the sharper
    ||Sigma^2||_F (one r x r product, r / d of a d x r^2 one) is tried; otherwise g = G~ - W Sigma is formed
    (one more d x r^2 product, for the batch when any frame needs it) and used for those frames.
    Shapes where the test is not expected to pass form g at once (`gram_identity_worth_testing`). Shapes: W, G~ (B, d, r),
    WtG (B, r, r); returns (B,).

    sync_free=True makes the same per-frame choice without asking the host whether any frame needs
    the sharper test or the explicit g (each `bool(...)` below waits for the device): both are
    always evaluated and `torch.where` picks, so the values are bit for bit those of the default
    route, at the price of the sixth product on every call.
    """
    d, r = W.shape[-2], W.shape[-1]
    # the route test compares rounding errors divided by u: a product u * (square) would underflow
    # about 24 binades (float32) before the square itself does, and the test would then change with
    # the gradient's scale where every quantity of the step is still a normal number
    drift_per_u = drift / unit_roundoff(W.dtype)
    sigma = _sym(WtG)
    if not gram_identity_worth_testing(d, r, drift_per_u):
        return torch.linalg.vector_norm(torch.baddbmm(G_decayed, W, sigma, alpha=-1.0), dim=(-2, -1)).square()
    gradient_norm = torch.linalg.vector_norm(G_decayed, dim=(-2, -1))
    sigma_norm = torch.linalg.vector_norm(sigma, dim=(-2, -1))
    gradient_sq, sigma_sq = gradient_norm.square(), sigma_norm.square()
    identity = gradient_sq - sigma_sq
    # every term of the route test is of degree 2 in G~ (no product of two squares, which underflows
    # for |log2 scale| > ~250), so the test, like the step, is exactly invariant under G~ -> 2^k G~
    cross = sigma_norm * gradient_norm
    rounding = (d * r + 3) * gradient_sq + 2 * (d + 2) * math.sqrt(r) * cross + (r * r + 3) * sigma_sq + identity.abs()
    explicit_error = d * r * identity + 2 * (d + r + 2) * math.sqrt(r) * identity.clamp(min=0).sqrt() * gradient_norm
    # the route is chosen per frame, from that frame's quantities only: a frame's result must not
    # depend on the other frames of its batch (a shared decision made a frame at scale 2^-120
    # round differently when another frame of the batch had scale 2^-300)
    identity_ok = rounding + drift_per_u * sigma_sq <= explicit_error
    if sync_free:
        sharper = ~identity_ok & (rounding < explicit_error)
        sigma_squared_sq = _norm_of_square(sigma, sigma_norm)
        identity_ok = identity_ok | (sharper & (rounding + drift_per_u * sigma_squared_sq <= explicit_error))
        g = torch.baddbmm(G_decayed, W, sigma, alpha=-1.0)
        return torch.where(identity_ok, identity, torch.linalg.vector_norm(g, dim=(-2, -1)).square())
    if bool(identity_ok.all()):
        return identity
    sharper = ~identity_ok & (rounding < explicit_error)
    if bool(sharper.any()):
        sigma_squared_sq = _norm_of_square(sigma, sigma_norm)
        identity_ok = identity_ok | (sharper & (rounding + drift_per_u * sigma_squared_sq <= explicit_error))
        if bool(identity_ok.all()):
            return identity
    g = torch.baddbmm(G_decayed, W, sigma, alpha=-1.0)
    return torch.where(identity_ok, identity, torch.linalg.vector_norm(g, dim=(-2, -1)).square())


# Below this many multiply-adds per frame (d r^2) one d x r^2 product costs less than the route
# test's two dozen small operations (a few microseconds each) at a batch of one frame
GRAM_IDENTITY_MIN_PRODUCT = 2**20


@memoized
def gram_identity_worth_testing(d: int, r: int, drift_per_u: float) -> bool:
    """Whether `gradient_norm_squared` tests the Gram identity for (d, r) frames at all, or forms g
    at once. A choice of speed only (both routes are within the explicit route's rounding, which is
    what the step is certified to), made from (d, r) and the drift bound, never from the batch or
    the gradient, so that a frame's value does not depend on the other frames of its batch or on
    its gradient's scale.

    The test is two dozen small operations (norms, the rounding terms, one r x r product and a
    wait for the device); where it fails, g is formed anyway. It is made where a gradient of
    independent entries is expected to pass it: ||G~||^2 = d r, ||Sigma||^2 = r (r + 1) / 2,
    ||Sigma^2||_F = r^1.5 / sqrt(2) (Sigma the symmetric part of an r x r Gaussian matrix, whose
    eigenvalues fill a semicircle of radius sqrt(2 r)), put into the sharper form of the test. That
    fails where r is not small against d (in float32 and float64 at (4, 2), (8, 4), (20, 10),
    (16, 16), (64, 32), and for bfloat16 storage, whose drift bound is 2^16 times larger, at every
    shape below the size limit): there, of 32 frames with Gaussian gradients, 0 to 10 took the
    identity (10 at (4, 2), 3 at (20, 10) in float32), where the rule makes the test 31 or 32 did,
    and at one (20, 10) frame the test cost a third of the eager step (tests/test_torch_functional.py
    holds the rule to this measurement). It is also made
    wherever one product costs more than the test (d r^2 >= GRAM_IDENTITY_MIN_PRODUCT), so that a
    large frame whose gradients are mostly tangent keeps the identity."""
    if d * r * r >= GRAM_IDENTITY_MIN_PRODUCT:
        return True
    gradient_sq, sigma_sq, square_norm = d * r, r * (r + 1) / 2, r**1.5 / math.sqrt(2.0)
    identity = gradient_sq - sigma_sq
    if identity <= 0:
        return False
    cross = math.sqrt(sigma_sq * gradient_sq)
    rounding = (d * r + 3) * gradient_sq + 2 * (d + 2) * math.sqrt(r) * cross + (r * r + 3) * sigma_sq + identity
    explicit_error = d * r * identity + 2 * (d + r + 2) * math.sqrt(r) * math.sqrt(identity * gradient_sq)
    return rounding + drift_per_u * square_norm <= explicit_error


def _norm_of_square(sigma: torch.Tensor, sigma_norm: torch.Tensor) -> torch.Tensor:
    """||Sigma^2||_F per frame as ||(Sigma / ||Sigma||)^2||_F ||Sigma||^2: of degree 2 in G~ exactly.

    The direct vector_norm(Sigma Sigma) has entries of order ||G~||^2, and for ||G~|| >= 2^256 or so
    those squares leave float64's range, where vector_norm rescales internally and stops being
    exactly homogeneous: the route test (and so ||g||^2, by a rounding) then changed under
    G~ -> 2^k G~, breaking P2's bit-identical trajectories. The normalised form has entries <= 1,
    and dividing and multiplying by exact powers of two commute with the scaling."""
    divisor = torch.where(sigma_norm > 0, sigma_norm, 1.0)[:, None, None]
    unit = sigma / divisor
    return torch.linalg.vector_norm(torch.bmm(unit, unit), dim=(-2, -1)) * sigma_norm.square()


def second_moment(v: torch.Tensor, g_squared: torch.Tensor, beta2: float, size: int) -> torch.Tensor:
    """Stage 4: beta2 v + (1 - beta2) ||g||^2 / (d r), one scalar per frame (size = d r), from ||g||^2."""
    return torch.add(v * beta2, g_squared, alpha=(1 - beta2) / size)


def increment_scale(beta2: float, size: int) -> float:
    """s = sqrt((1 - beta2) / size): the second moment's increment (1 - beta2) ||g||^2 / (d r) is ||s g||^2."""
    return math.sqrt((1 - beta2) / size)


def updated_second_moment(W, G_decayed, WtG, v, beta2: float, drift: float, sync_free: bool = False) -> torch.Tensor:
    """Stage 4 as the step computes it: beta2 v + ||s g||^2 with s = increment_scale(beta2, d r), the
    norm formed from s G~ and s W^T G~ (gradient_norm_squared). Scaling before squaring keeps every
    square at the size of v itself: ||g||^2 alone overflows the compute dtype (float32: ||g|| > 2^64)
    up to sqrt(d r / (1 - beta2)) times (6.5 binades at d r = 8, beta2 = 0.999) below the gradient
    scale at which v does, and scaling by s commutes with scaling by 2^k, so P2 stays exact.
    Shapes: W, G~ (B, d, r), WtG (B, r, r), v (B,); returns (B,)."""
    scale = increment_scale(beta2, W.shape[-2] * W.shape[-1])
    increment = gradient_norm_squared(W, G_decayed * scale, WtG * scale, drift, sync_free)
    return torch.add(v * beta2, increment)


def step_coefficient(m, v, step_count, lr, beta1, beta2, eps, trust_radius) -> torch.Tensor:
    """Stages 5-7: the per-frame scalar c with xi = c m (shape m.shape[:-2]).

    c = -lr / (1 - beta1^t) / (sqrt(v / (1 - beta2^t)) + eps), capped so that ||c m||_F <= Delta;
    v^ = 0 means g = 0 since the start (so m = 0) and gives c = 0, never 0/0 (docs/algorithm.md#pitfalls).

    step_count is t, either one int for every frame (the bias corrections are then Python floats,
    correctly rounded) or a float64 tensor of shape m.shape[:-2], one count per frame (what the
    optimizer keeps, so that a skipped frame keeps its own count without a host sync); the
    corrections are then `torch.pow` on the device, which is accurate to about one ulp of
    beta^t but not always correctly rounded, so the two forms can differ in the last bit of
    beta^t. Otherwise the two forms evaluate the same operations in the same order.

    lr and eps may be Python numbers or 0-d tensors (so that a scheduler's new lr is data, not a
    constant that torch.compile specialises on). A tensor gives bit for bit the coefficient of the
    number of the same value: lr is converted to float64 exactly (every float32 or bfloat16 value
    is a float64), -lr / (1 - beta1^t) is then the same float64 division either way, and eps
    enters `root_v_hat + eps` as a scalar operand, rounded to the compute dtype as a number is.
    """
    lr_tensor = torch.is_tensor(lr)
    if lr_tensor:
        lr = _float64_scalar(lr, v.device)
    if torch.is_tensor(step_count):
        work = v.dtype
        count = step_count if step_count.dtype == BIAS_POWER_DTYPE and step_count.device == v.device else \
            step_count.to(device=v.device, dtype=BIAS_POWER_DTYPE)
        # the operations of the int form, elementwise: `scalar / tensor` is torch's
        # reciprocal(tensor) * scalar, `tensor / scalar` a division in the compute dtype
        bias_correction2 = (1 - torch.pow(beta2, count)).to(work)
        negative_lr = torch.neg(lr) if lr_tensor else torch.full_like(count, -lr)
        numerator = (negative_lr / (1 - torch.pow(beta1, count))).to(work)  # as Python's -lr / bc1
        root_v_hat = torch.sqrt(v / bias_correction2)
        coefficient = torch.where(root_v_hat > 0, torch.reciprocal(root_v_hat + eps) * numerator, 0.0)
    else:
        bias_correction1 = 1 - beta1**step_count
        bias_correction2 = 1 - beta2**step_count
        root_v_hat = torch.sqrt(v / bias_correction2)
        if lr_tensor:
            # float64 tensor / float64 tensor (a true division, as Python's), then Python's
            # `number / tensor`, which is reciprocal(tensor) * number
            numerator = torch.neg(lr) / torch.tensor(bias_correction1, dtype=torch.float64, device=lr.device)
            coefficient = torch.where(root_v_hat > 0, torch.reciprocal(root_v_hat + eps) * numerator, 0.0)
        else:
            coefficient = torch.where(root_v_hat > 0, (-lr / bias_correction1) / (root_v_hat + eps), 0.0)
    if not math.isinf(trust_radius):
        # Frobenius norm, a rotation-invariant cap: keeps the step O(d) x O(r) equivariant
        norm = torch.linalg.vector_norm(m, dim=(-2, -1)) * coefficient.abs()
        coefficient = coefficient * torch.where(norm > trust_radius, trust_radius / norm, 1.0)
    return coefficient


def _float64_scalar(value: torch.Tensor, device: torch.device) -> torch.Tensor:
    """A 0-d hyper-parameter tensor as float64 (exact for every floating dtype). A 0-d tensor on
    the CPU stays there: torch reads such an operand as a scalar in a kernel on any device, with
    no copy to the device and no wait; one on another device is moved to `device`."""
    if value.device.type != "cpu" and value.device != device:
        value = value.to(device)
    return value.to(torch.float64)


def transported_moment(W: torch.Tensor, m: torch.Tensor) -> torch.Tensor:
    """Stage 8's m+ = P_{W+}(m) for a state (W+, m) that stiefel_adam_step returned: the moment
    tangent at W+, as docs/algorithm.md's state holds it (the step itself defers this projection)."""
    return project_tangent(W, m)


@torch.no_grad()
def stiefel_adam_step(
    W: torch.Tensor,
    G: torch.Tensor,
    m: torch.Tensor,
    v: torch.Tensor,
    t: int,
    lr: float = 1e-3,
    beta1: float = 0.9,
    beta2: float = 0.999,
    eps: float = 1e-8,
    trust_radius: float = 0.5,
    weight_decay: float = 0.0,
    *,
    retraction_method: str = "auto",
    sync_free: bool = False,
):
    """One StiefelAdam step (docs/algorithm.md) for frames W (..., d, r). Pure: inputs unchanged.

    W: frames, float64 / float32 / bfloat16, on any device, with ||W^T W - I|| within
    `frame_drift_bound` (as stiefel_init_ and this function leave them); G: Euclidean gradient,
    same shape (any floating dtype, cast to the compute dtype); m: first moment (..., d, r) as the
    previous call returned it (or 0), v: second moment (...) (one scalar per frame), both in the
    state dtype (float64 for float64 W, float32 otherwise); t: steps taken so far, one int for
    every frame or a tensor of shape (...), one count per frame (`step_coefficient`).
    Returns (W_new in W's dtype, m_new, v_new in the state dtype).

    m_new is stage 3's moment, tangent at W, not yet transported to W_new: the transport
    P_{W_new}(m_new) is done by the next call, inside its own projection (one projection of
    beta1 m + (1 - beta1) G~ instead of two), and `transported_moment(W_new, m_new)` gives
    docs/algorithm.md's m+. retraction_method: "auto", "newton_schulz" or "eigh" (module docstring).
    sync_free=True: nothing in the call waits for the device (no `bool(tensor)`), so that it can be
    captured by torch.compile or a CUDA graph; the values are the same bit for bit
    (`gradient_norm_squared`).
    """
    work = compute_dtype(W.dtype)
    batch_shape = W.shape[:-2]
    d, r = W.shape[-2], W.shape[-1]
    W_c = _as_batch3(_in_dtype(W, work))
    G_c = decayed_gradient(W_c, _as_batch3(_in_dtype(G, work)), weight_decay)
    m_c, WtG = project_moment(W_c, G_c, _as_batch3(_in_dtype(m, work)), beta1)
    drift = frame_drift_bound(d, r, W.dtype, trust_radius, retraction_method)
    v_c = updated_second_moment(W_c, G_c, WtG, _shaped(_in_dtype(v, work), (-1,)), beta2, drift, sync_free)
    step_count = _shaped(t, (-1,)) + 1 if torch.is_tensor(t) else t + 1
    coefficient = step_coefficient(m_c, v_c, step_count, lr, beta1, beta2, eps, trust_radius)
    W_new = polar_factor(torch.addcmul(W_c, m_c, coefficient[:, None, None]), trust_radius, retraction_method)
    return _in_dtype(_shaped(W_new, W.shape), W.dtype), _shaped(m_c, W.shape), _shaped(v_c, batch_shape)
