"""The Stiefel manifold St(d, r) with the embedded metric, in float64 (docs/mathematics.md).

Every function takes arrays of shape (..., d, r) and works frame by frame along the leading axes.
Inputs are never modified. The formulas read like docs/mathematics.md:

    sym(A)  = (A + A^T) / 2               skew(A) = (A - A^T) / 2
    P_W(G)  = G - W sym(W^T G)            R_W(xi) = polar(W + xi) = U V^T,  W + xi = U S V^T
"""

from __future__ import annotations

import numpy as np

from ._validation import (
    check_float64_array,
    check_frame,
    check_frame_shape,
    check_same_shape,
)

RETRACTION_METHODS = ("svd", "gram", "closed_form")


def _transpose(A: np.ndarray) -> np.ndarray:
    return np.swapaxes(A, -1, -2)


def sym(A: np.ndarray) -> np.ndarray:
    """Symmetric part (A + A^T)/2 of each square matrix in A, shape (..., n, n)."""
    return 0.5 * (A + _transpose(A))


def skew(A: np.ndarray) -> np.ndarray:
    """Skew-symmetric part (A - A^T)/2 of each square matrix in A, shape (..., n, n)."""
    return 0.5 * (A - _transpose(A))


def project_tangent(W: np.ndarray, G: np.ndarray, *, validate: bool = True) -> np.ndarray:
    """Orthogonal projection P_W(G) = G - W sym(W^T G) onto T_W St(d, r).

    W: (..., d, r) float64 frames; G: float64 array of the same shape. Returns a new array.
    validate=False skips the input checks (the step and the claims call it so on inputs they have
    checked already): there is one implementation, so a change to it reaches every certificate.
    """
    if validate:
        check_frame("W", W)
        check_float64_array("G", G)
        check_same_shape("G", G, "W", W.shape)
    return G - W @ sym(_transpose(W) @ G)


def _inverse_sqrt_spd(S: np.ndarray) -> np.ndarray:
    """S^(-1/2) of symmetric positive definite matrices by eigh, shape (..., n, n)."""
    eigenvalues, eigenvectors = np.linalg.eigh(S)
    return (eigenvectors / np.sqrt(eigenvalues)[..., None, :]) @ _transpose(eigenvectors)


def polar_factor(A: np.ndarray) -> np.ndarray:
    """Orthogonal polar factor U V^T of A = U S V^T (thin SVD), shape (..., d, r)."""
    U, _, Vh = np.linalg.svd(A, full_matrices=False)
    return U @ Vh


def polar_retract(W: np.ndarray, xi: np.ndarray, method: str = "svd", *, validate: bool = True) -> np.ndarray:
    """Polar retraction R_W(xi) = polar(W + xi), shape (..., d, r).

    method:
      "svd"          U V^T from the thin SVD of W + xi (the definition; the default).
      "gram"         (W + xi) ((W + xi)^T (W + xi))^(-1/2) from the actual Gram matrix, by eigh.
      "closed_form"  (W + xi) (I_r + xi^T xi)^(-1/2), equal to the others only for tangent xi and
                     exact W; it does not correct existing drift (docs/algorithm.md#pitfalls), so it is a
                     second path for checks, never the one the optimizer uses.

    xi need not be tangent (the controls retract non-tangent steps), but W + xi must have full
    column rank for the polar factor to be unique. validate=False skips the input and rank checks
    (see project_tangent).
    """
    if method not in RETRACTION_METHODS:
        raise ValueError(f"method must be one of {RETRACTION_METHODS}, got {method!r}")
    A = W + xi
    if validate:
        check_frame("W", W)
        check_float64_array("xi", xi)
        check_same_shape("xi", xi, "W", W.shape)
        singular_values = np.linalg.svd(A, compute_uv=False)
        smallest = singular_values[..., -1]
        if np.any(smallest <= singular_values[..., 0] * (W.shape[-2] * np.finfo(np.float64).eps)):
            raise ValueError("W + xi must have full column rank for the polar retraction (a singular value is 0)")
    if method == "svd":
        return polar_factor(A)
    if method == "gram":
        return A @ _inverse_sqrt_spd(_transpose(A) @ A)
    r = W.shape[-1]
    return A @ _inverse_sqrt_spd(np.eye(r) + _transpose(xi) @ xi)


def retraction_agreement(W: np.ndarray, xi: np.ndarray) -> dict[str, np.ndarray]:
    """||R_svd - R_other||_F per frame for the "gram" and "closed_form" paths (tangent xi)."""
    reference = polar_retract(W, xi, "svd")
    return {
        method: np.linalg.norm(polar_retract(W, xi, method, validate=False) - reference, axis=(-2, -1))
        for method in ("gram", "closed_form")
    }


def project_to_manifold(A: np.ndarray) -> np.ndarray:
    """Nearest frame to A in the Frobenius norm: its polar factor. A: (..., d, r), full rank."""
    check_float64_array("A", A, min_ndim=2)
    check_frame_shape("A", A)
    return polar_factor(A)


def _as_batch(batch) -> tuple[int, ...]:
    if isinstance(batch, (int, np.integer)):
        batch = (int(batch),)
    batch = tuple(int(b) for b in batch)
    if any(b < 0 for b in batch):
        raise ValueError(f"batch must be a tuple of non-negative integers, got {batch}")
    return batch


def _check_rng(rng) -> None:
    if not isinstance(rng, np.random.Generator):
        raise ValueError(
            f"rng must be a numpy.random.Generator (e.g. np.random.default_rng(seed)), got {type(rng).__name__}"
        )


def haar_from_gaussian(Z: np.ndarray) -> np.ndarray:
    """Sign-fixed QR factor of Gaussian matrices Z (..., d, r): Haar-distributed on St(d, r).

    Q is multiplied column by column by sign(diag R), zeros mapped to +1, which makes the
    factorisation unique and the distribution exactly Haar (Mezzadri 2007).
    """
    Q, R = np.linalg.qr(Z)
    signs = np.sign(np.diagonal(R, axis1=-2, axis2=-1))
    signs = np.where(signs == 0, 1.0, signs)
    return Q * signs[..., None, :]


def random_point(d: int, r: int, rng: np.random.Generator, batch=()) -> np.ndarray:
    """Haar-random frames, shape batch + (d, r), float64."""
    _check_rng(rng)
    if not (isinstance(d, (int, np.integer)) and isinstance(r, (int, np.integer))) or r < 1 or r > d:
        raise ValueError(f"need integers 1 <= r <= d, got d={d!r}, r={r!r}")
    batch = _as_batch(batch)
    return haar_from_gaussian(rng.standard_normal(batch + (int(d), int(r))))


def random_orthogonal(n: int, rng: np.random.Generator, batch=()) -> np.ndarray:
    """Haar-random matrices of O(n) (both components: det +1 and det -1), shape batch + (n, n)."""
    return random_point(n, n, rng, batch)


def random_tangent(W: np.ndarray, rng: np.random.Generator, scale: float = 1.0) -> np.ndarray:
    """P_W of a Gaussian matrix times scale: a random tangent vector at each frame of W."""
    _check_rng(rng)
    check_frame("W", W)
    return project_tangent(W, scale * rng.standard_normal(W.shape), validate=False)


def random_signed_permutation(n: int, rng: np.random.Generator, batch=()) -> np.ndarray:
    """Random signed permutation matrices, shape batch + (n, n): orthogonal and exact in float64."""
    _check_rng(rng)
    batch = _as_batch(batch)
    count = int(np.prod(batch)) if batch else 1
    out = np.zeros((count, n, n))
    for k in range(count):
        out[k, np.arange(n), rng.permutation(n)] = rng.choice([-1.0, 1.0], size=n)
    return out.reshape(batch + (n, n))


def feasibility(W: np.ndarray, *, validate: bool = True) -> np.ndarray:
    """||W^T W - I_r||_F for each frame, shape W.shape[:-2] (validate: see project_tangent)."""
    from ._validation import stiefel_residual

    if validate:
        check_float64_array("W", W, min_ndim=2)
    return stiefel_residual(W)
