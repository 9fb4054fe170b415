"""A second float64 statement of StiefelAdam, written from docs/algorithm.md and nothing else.

The certificates compare the optimizer under test with this model step by step (kit.trajectories).
The comparison is only worth something if the two cannot share a mistake, so this module imports
nothing from reference_impl and takes other routes where the reference has a choice:

* every frame product is an explicit `einsum` over a frames axis (the reference uses matmul and
  swapaxes over any leading axes): the leading axes are flattened to one frames axis first, so a
  mistake in handling several leading axes cannot be shared;
* the polar factor comes from the eigendecomposition of the actual Gram matrix,
  polar(A) = A (A^T A)^(-1/2) with A^T A = V diag(lambda) V^T (LAPACK syevd), where the reference takes
  U V^T from the thin SVD (gesdd);
* the bias corrections are 1 - beta^t = -expm1(t log beta), where the reference evaluates 1 - beta**t.

The eight stages, one frame (docs/algorithm.md), as the code below writes them:

    1. G~ = G + lambda W
    2. g  = P_W(G~) = G~ - W sym(W^T G~)
    3. m  = beta1 m + (1 - beta1) g
    4. v  = beta2 v + (1 - beta2) ||g||^2 / (d r)
    5. t  = t + 1;  m^ = m / (1 - beta1^t);  v^ = v / (1 - beta2^t)
    6. xi = -lr m^ / (sqrt(v^) + eps), and xi = 0 where v^ = 0
    7. xi = xi Delta / ||xi|| where ||xi|| > Delta
    8. W+ = polar(W + xi);  m+ = P_{W+}(m)

`model_step` also returns the intermediate quantities that the error bound of the comparison is
written in (kit.trajectories.one_step_bound).
"""

from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np


class ModelStep(NamedTuple):
    """One model step for frames of shape lead + (d, r); arrays are float64.

    W, m: lead + (d, r) the new frame and the transported first moment; v: lead, the new second
    moment; t: the new step count. The rest are per frame (shape lead) and describe the step:
    g_norm = ||g||, m_norm = ||m|| before transport, v_hat, xi_raw_norm = ||xi|| before the cap,
    xi_norm after it, clipped (bool), sigma_min / sigma_max of W + xi; bias1, bias2 are the
    scalars 1 - beta1^t, 1 - beta2^t.
    """

    W: np.ndarray
    m: np.ndarray
    v: np.ndarray
    t: int
    g_norm: np.ndarray
    m_norm: np.ndarray
    v_hat: np.ndarray
    xi_raw_norm: np.ndarray
    xi_norm: np.ndarray
    clipped: np.ndarray
    sigma_min: np.ndarray
    sigma_max: np.ndarray
    bias1: float
    bias2: float


def tangent_part(W: np.ndarray, X: np.ndarray) -> np.ndarray:
    """P_W(X) = X - W sym(W^T X) for frames W, X of shape (n, d, r)."""
    WtX = np.einsum("nki,nkj->nij", W, X)
    symmetric = 0.5 * (WtX + np.transpose(WtX, (0, 2, 1)))
    return X - np.einsum("nik,nkj->nij", W, symmetric)


def frame_norm(X: np.ndarray) -> np.ndarray:
    """Frobenius norm of each frame of X (n, d, r), shape (n,)."""
    return np.sqrt(np.einsum("nij,nij->n", X, X))


def polar_by_gram(A: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """polar(A) = A (A^T A)^(-1/2) for full-rank A (n, d, r), and the eigenvalues of A^T A (n, r).

    The inverse square root is V diag(lambda^-1/2) V^T from the symmetric eigensolver; a rank-deficient
    A has no unique polar factor and gives non-finite entries here, which the comparison reports.
    """
    gram = np.einsum("nki,nkj->nij", A, A)
    eigenvalues, V = np.linalg.eigh(gram)
    with np.errstate(divide="ignore", invalid="ignore"):
        scaled = V / np.sqrt(eigenvalues)[:, None, :]
    inverse_sqrt = np.einsum("nik,njk->nij", scaled, V)
    return np.einsum("nik,nkj->nij", A, inverse_sqrt), eigenvalues


def bias_correction(beta: float, t: int) -> float:
    """1 - beta^t, as -expm1(t log beta) (1 for beta = 0)."""
    if beta == 0.0:
        return 1.0
    return -math.expm1(t * math.log(beta))


def model_step(W, G, m, v, t, config) -> ModelStep:
    """docs/algorithm.md on frames W, G, m of shape lead + (d, r), v of shape lead, integer t >= 0.

    config: any object with lr, betas, eps, trust_radius, weight_decay (a StiefelAdamConfig).
    Inputs are not checked beyond their shapes (ValueError when they disagree) and not modified.
    """
    W, G, m = (np.asarray(x, dtype=np.float64) for x in (W, G, m))
    v = np.asarray(v, dtype=np.float64)
    lead, (d, r) = W.shape[:-2], W.shape[-2:]
    if G.shape != W.shape or m.shape != W.shape or v.shape != lead:
        raise ValueError(f"model_step needs G, m of shape {W.shape} and v of shape {lead}, "
                         f"got {G.shape}, {m.shape}, {v.shape}")
    n = int(np.prod(lead, dtype=np.int64))
    W, G, m, v = W.reshape(n, d, r), G.reshape(n, d, r), m.reshape(n, d, r), v.reshape(n)
    lr, (beta1, beta2), eps = config.lr, config.betas, config.eps
    trust_radius, weight_decay = config.trust_radius, config.weight_decay

    g = tangent_part(W, G + weight_decay * W)  # 1, 2
    m_new = beta1 * m + (1.0 - beta1) * g  # 3
    mean_square = np.einsum("nij,nij->n", g, g) / (d * r)
    v_new = beta2 * v + (1.0 - beta2) * mean_square  # 4
    t_new = int(t) + 1  # 5
    bias1, bias2 = bias_correction(beta1, t_new), bias_correction(beta2, t_new)
    m_hat = m_new / bias1
    v_hat = v_new / bias2
    moves = v_hat > 0  # 6: no step where v^ = 0
    denominator = np.where(moves, np.sqrt(v_hat) + eps, 1.0)
    xi = np.where(moves[:, None, None], (-lr / denominator)[:, None, None] * m_hat, 0.0)
    xi_raw_norm = frame_norm(xi)
    clipped = xi_raw_norm > trust_radius  # 7 (never for Delta = inf)
    scale = np.where(clipped, trust_radius / np.where(clipped, xi_raw_norm, 1.0), 1.0)
    xi = xi * scale[:, None, None]
    W_plus, eigenvalues = polar_by_gram(W + xi)  # 8
    m_plus = tangent_part(W_plus, m_new)

    def shaped(x, tail=()):
        return x.reshape(lead + tail)

    with np.errstate(invalid="ignore"):
        sigma = np.sqrt(np.maximum(eigenvalues, 0.0))
    return ModelStep(
        W=shaped(W_plus, (d, r)), m=shaped(m_plus, (d, r)), v=shaped(v_new), t=t_new,
        g_norm=shaped(frame_norm(g)), m_norm=shaped(frame_norm(m_new)), v_hat=shaped(v_hat),
        xi_raw_norm=shaped(xi_raw_norm), xi_norm=shaped(frame_norm(xi)), clipped=shaped(clipped),
        sigma_min=shaped(sigma[:, 0]), sigma_max=shaped(sigma[:, -1]), bias1=bias1, bias2=bias2,
    )
