"""The StiefelAdam step of SPEC.md section 2 as one batched PyTorch function (CPU and CUDA).

    1. G~ = G + lambda W
    2. g  = P_W(G~) = G~ - W sym(W^T G~)
    3. m  = beta1 m + (1 - beta1) g
    4. v  = beta2 v + (1 - beta2) ||g||^2 / (d r)          one scalar per frame
    5. t  = t + 1;  m^ = m / (1 - beta1^t);  v^ = v / (1 - beta2^t)
    6. xi = -lr m^ / (sqrt(v^) + eps);  xi = 0 where v^ = 0 (never 0/0)
    7. if ||xi||_F > Delta: xi = xi Delta / ||xi||_F       per frame, Frobenius norm
    8. W+ = polar(W + xi);  m+ = P_{W+}(m)

Every frame along the leading axes of W (..., d, r) is one independent problem: all stages are
batched tensor operations, with no Python loop over frames. Storage dtypes float64, float32 and
bfloat16 are accepted; float64 computes in float64, the others compute in float32 and keep the
state (m, v) in float32, because bfloat16's 8-bit significand cannot hold an Adam moment.

The retraction
--------------
polar(A), A = W + xi (d x r), is computed from the *actual* r x r Gram matrix S = A^T A as
A S^(-1/2), never from the shortcut (I + xi^T xi)^(-1/2): the shortcut assumes W^T W = I exactly and
so lets storage rounding accumulate into drift (SPEC.md section 8), while A S^(-1/2) is orthonormal
to rounding whatever W^T W was. A thin d x r SVD is avoided: it is the slowest batched factorisation
on both CPU and GPU, and only the r x r matrix S^(-1/2) is needed.

S^(-1/2) is evaluated by one of two methods (``retraction_method``):

* "newton_schulz" (used when Delta <= NEWTON_SCHULZ_MAX_TRUST_RADIUS): the convergent quintic
  polar iteration X <- X (15/8 I - 5/4 X^T X + 3/8 (X^T X)^2), started at X_0 = A / sqrt(c), run on
  the r x r factor M with X_k = A M_k (so X_k^T X_k = M_k S M_k): matmuls only, fast on GPUs where
  batched eigh is slow, and about twice as fast as eigh on CPU at r = 128. It converges only in a
  basin, and the trust region puts S there: for tangent xi with ||xi|| <= Delta,
  S = I + xi^T xi, so every eigenvalue of S lies in [1, 1 + Delta^2] (SPEC.md P3(b)). With
  c = 1 + Delta^2 / 2 the eigenvalues x of S / c satisfy |1 - x| <= Delta^2 / (2 + Delta^2)
  (= 1/9 at Delta = 0.5). One iteration maps x to x p(x)^2 with 1 - x p(x)^2 = 5/8 (1 - x)^3 +
  O((1 - x)^4), so the error cubes each time; `newton_schulz_iterations` iterates this scalar map
  exactly from the two ends of the interval (widened by a drift allowance) and returns the first
  count that brings |1 - x| below the compute dtype's unit roundoff: at Delta = 0.5, 3 iterations in
  float64 and 2 in float32 (the third, for float64, takes 8.6e-4 -> 4e-10 -> 4e-29). The remaining
  error is rounding, O((d + r) u) as for eigh. Muon's tuned coefficients are *not* used: they only
  push singular values into a band and do not give a polar factor.
* "eigh" (used otherwise, e.g. Delta = inf or Delta > 1, where the spectrum of S is unbounded):
  S = Q diag(lambda) Q^T by a batched torch.linalg.eigh and S^(-1/2) = Q diag(lambda^-1/2) Q^T.
  The orthogonality error of A S^(-1/2) is about cond(A)^2 u = (1 + ||xi||_2^2) u: fine for the
  moderate steps that Adam takes (length about lr sqrt(d r)); for steps with ||xi||_2 >> 1, which
  only trust_radius = inf allows, it degrades as cond^2, and a finite trust radius is the remedy.
"""

from __future__ import annotations

import math

import torch

NEWTON_SCHULZ_MAX_TRUST_RADIUS = 1.0

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


def compute_dtype(dtype: torch.dtype) -> torch.dtype:
    """float64 storage computes in float64; float32 and bfloat16 (and float16) in float32."""
    return torch.float64 if dtype == torch.float64 else torch.float32


def unit_roundoff(dtype: torch.dtype) -> float:
    """u = eps/2 of a floating dtype: 2^-53 float64, 2^-24 float32, 2^-8 bfloat16, 2^-11 float16."""
    return torch.finfo(dtype).eps / 2.0


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
    scale = 1.0 + trust_radius**2 / 2.0
    # deviations delta = 1 - x at the two ends of the interval of eigenvalues of S / c
    deviations = [1.0 - (1.0 - DRIFT_ALLOWANCE) / scale, (1.0 + trust_radius**2 + DRIFT_ALLOWANCE) / scale - 1.0]
    target = unit_roundoff(dtype)
    for iterations in range(1, 16):
        # 1 - x p(x)^2 at x = 1 - delta, expanded exactly (no cancellation in floating point):
        # (1 - delta)(1 + delta/2 + 3 delta^2/8)^2 = 1 - 5/8 delta^3 - 15/64 delta^4 - 9/64 delta^5
        deviations = [5 / 8 * e**3 + 15 / 64 * e**4 + 9 / 64 * e**5 for e in deviations]
        if max(abs(e) for e in deviations) <= target:
            return iterations
    raise AssertionError("the quintic iteration failed to converge inside its basin")  # unreachable


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


def _inverse_sqrt_newton_schulz(S: torch.Tensor, trust_radius: float) -> torch.Tensor:
    """M ~ S^(-1/2) for Gram matrices S (B, r, r) with spectrum in [1, 1 + Delta^2]."""
    a, b, c = QUINTIC_COEFFICIENTS
    scale = 1.0 + trust_radius**2 / 2.0
    identity = _identity_like(S)
    a_identity = (a * identity).expand_as(S)
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
    eigenvalues, eigenvectors = torch.linalg.eigh(S)
    return (eigenvectors * eigenvalues.rsqrt().unsqueeze(-2)) @ eigenvectors.mT


def _as_batch3(x: torch.Tensor) -> torch.Tensor:
    return x.reshape((-1,) + tuple(x.shape[-2:]))


def polar_retract(W: torch.Tensor, xi: torch.Tensor, trust_radius: float = 0.5, method: str = "auto") -> torch.Tensor:
    """polar(W + xi) from the actual Gram matrix, shape (..., d, r), dtype of W (float32/float64).

    method "auto" picks Newton-Schulz when trust_radius <= 1 (the step must then satisfy
    ||xi||_F <= trust_radius, as the optimizer guarantees) and eigh otherwise.
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
    return torch.bmm(A, M).reshape(shape)


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


def riemannian_gradient(W: torch.Tensor, G: torch.Tensor, weight_decay: float = 0.0) -> torch.Tensor:
    """Stages 1-2: g = P_W(G + lambda W), shapes (..., d, r) in one compute dtype."""
    if weight_decay != 0:
        G = torch.add(G, W, alpha=weight_decay)
    return project_tangent(W, G)


def first_moment(m: torch.Tensor, g: torch.Tensor, beta1: float) -> torch.Tensor:
    """Stage 3: beta1 m + (1 - beta1) g, both coefficients rounded from float64.

    torch.lerp would round beta1 to the compute dtype and form 1 - beta1 there, a relative error
    u beta / (1 - beta) in the update (1000 u, i.e. 6e-5 in float32, for beta = 0.999).
    """
    return torch.add(m * beta1, g, alpha=1 - beta1) if beta1 != 0 else g


def second_moment(v: torch.Tensor, g: torch.Tensor, beta2: float) -> torch.Tensor:
    """Stage 4: beta2 v + (1 - beta2) ||g||^2 / (d r), one scalar per frame; v has shape g.shape[:-2]."""
    d, r = g.shape[-2], g.shape[-1]
    return torch.add(v * beta2, torch.sum(g * g, dim=(-2, -1)), alpha=(1 - beta2) / (d * r))


def step_coefficient(m, v, step_count, lr, beta1, beta2, eps, trust_radius) -> torch.Tensor:
    """Stages 5-7: the per-frame scalar c with xi = c m (shape m.shape[:-2]).

    c = -lr / (1 - beta1^t) / (sqrt(v / (1 - beta2^t)) + eps), capped so that ||c m||_F <= Delta;
    v^ = 0 means g = 0 since the start (so m = 0) and gives c = 0, never 0/0 (SPEC.md section 8).
    """
    bias_correction1 = 1 - beta1**step_count
    bias_correction2 = 1 - beta2**step_count
    root_v_hat = torch.sqrt(v / bias_correction2)
    coefficient = torch.where(root_v_hat > 0, (-lr / bias_correction1) / (root_v_hat + eps), 0.0)
    if not math.isinf(trust_radius):
        # Frobenius norm, a rotation-invariant cap: keeps the step O(d) x O(r) equivariant
        norm = torch.linalg.vector_norm(m, dim=(-2, -1)) * coefficient.abs()
        coefficient = coefficient * torch.where(norm > trust_radius, trust_radius / norm, 1.0)
    return coefficient


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
):
    """One StiefelAdam step (SPEC.md section 2) for frames W (..., d, r). Pure: inputs unchanged.

    W: frames, float64 / float32 / bfloat16, on any device; G: Euclidean gradient, same shape
    (any floating dtype, cast to the compute dtype); m: first moment (..., d, r) and v: second
    moment (...) (one scalar per frame), both in the state dtype (float64 for float64 W, float32
    otherwise); t: steps taken so far (the returned state has taken t + 1).
    Returns (W_new in W's dtype, m_new, v_new in the state dtype).
    retraction_method: "auto", "newton_schulz" or "eigh" (module docstring).
    """
    work = compute_dtype(W.dtype)
    batch_shape = W.shape[:-2]
    W_c = _as_batch3(W.to(work))
    G_c = _as_batch3(G.to(work))
    m_c = _as_batch3(m.to(work))
    v_c = v.to(work).reshape(-1)
    g = riemannian_gradient(W_c, G_c, weight_decay)
    m_c = first_moment(m_c, g, beta1)
    v_c = second_moment(v_c, g, beta2)
    coefficient = step_coefficient(m_c, v_c, t + 1, lr, beta1, beta2, eps, trust_radius)
    W_new = polar_factor(torch.addcmul(W_c, m_c, coefficient[:, None, None]), trust_radius, retraction_method)
    m_new = project_tangent(W_new, m_c)
    return W_new.reshape(W.shape).to(W.dtype), m_new.reshape(W.shape), v_c.reshape(batch_shape)
