"""Input checks shared by the reference.

Every public function of the reference calls these before it computes anything, so that a wrong
shape, dtype or a point off the manifold is reported in terms of the caller's argument instead of
surfacing later as a NaN or a LinAlgError.

The manifold tolerance
----------------------
A frame W handed to the reference is a float64 matrix that should satisfy W^T W = I_r. The
smallest honest test of that is ||W^T W - I_r||_F <= tol(d, r). Two sources of error separate a
float64 frame from an exact one:

* representation: if W = fl(W*) for an exact frame W*, then W = W* + E with |E_ij| <= u |W*_ij|,
  so ||W^T W - I|| <= 2 ||E|| + ||E||^2 <= 2 u sqrt(r) + O(u^2);
* evaluation of the Gram matrix: each entry of fl(W^T W) is an inner product of length d of unit
  columns, with error at most gamma_d ~ d u (Higham, Accuracy and Stability, sec. 3.1), so the
  r x r matrix of errors has Frobenius norm at most r d u.

Frames produced by a backward-stable orthogonalisation (Householder QR, the SVD polar factor) carry
an orthogonality error of the same order, p(d, r) u with p a low-degree polynomial bounded by d r
in the LAPACK error bounds. Hence

    tol(d, r) = MANIFOLD_TOL_FACTOR * (d r + 2 sqrt(r)) * u,   MANIFOLD_TOL_FACTOR = 32,

accepts every frame that the reference itself produces (those bounds are worst cases; the typical
error is about sqrt(d) r u) and rejects a float32 frame cast to float64 (error ~ 1e-7) or a frame
that drifted. `project_to_manifold` returns the nearest frame (the polar factor) for a point that
failed the test.
"""

from __future__ import annotations

import math
import numbers

import numpy as np

UNIT_ROUNDOFF = 2.0**-53
MANIFOLD_TOL_FACTOR = 32.0


def manifold_tolerance(d: int, r: int) -> float:
    """Largest accepted ||W^T W - I_r||_F for a float64 frame of shape (d, r); see module doc."""
    return MANIFOLD_TOL_FACTOR * (d * r + 2.0 * math.sqrt(r)) * UNIT_ROUNDOFF


def check_float64_array(name: str, x, min_ndim: int = 0) -> np.ndarray:
    """Return x as an ndarray after checking its dtype (float64), ndim and finiteness."""
    if not isinstance(x, np.ndarray):
        raise ValueError(f"{name} must be a numpy.ndarray of dtype float64, got {type(x).__name__}")
    if x.dtype != np.float64:
        raise ValueError(f"{name} must have dtype float64, got {x.dtype}")
    if x.ndim < min_ndim:
        raise ValueError(
            f"{name} must have at least {min_ndim} dimensions (shape (..., d, r)), got shape {x.shape}"
        )
    if not np.all(np.isfinite(x)):
        bad = int(np.size(x) - np.count_nonzero(np.isfinite(x)))
        raise ValueError(f"{name} must be finite, found {bad} non-finite entries")
    return x


def check_frame_shape(name: str, W: np.ndarray) -> tuple[int, int]:
    d, r = W.shape[-2], W.shape[-1]
    if r < 1 or d < 1:
        raise ValueError(f"{name} must have d >= 1 and r >= 1, got shape {W.shape}")
    if r > d:
        raise ValueError(f"{name} must have r <= d (a frame of r orthonormal columns in R^d), got d={d}, r={r}")
    return d, r


def stiefel_residual(W: np.ndarray) -> np.ndarray:
    """||W^T W - I_r||_F for each frame along the leading axes; shape W.shape[:-2]."""
    r = W.shape[-1]
    gram = np.swapaxes(W, -1, -2) @ W
    return np.linalg.norm(gram - np.eye(r), axis=(-2, -1))


def check_on_manifold(name: str, W: np.ndarray, atol: float | None = None) -> None:
    d, r = W.shape[-2], W.shape[-1]
    tol = manifold_tolerance(d, r) if atol is None else atol
    residual = stiefel_residual(W)
    worst = float(np.max(residual)) if residual.size else 0.0
    if worst > tol:
        where = ""
        if residual.ndim:
            index = np.unravel_index(int(np.argmax(residual)), residual.shape)
            where = f" at batch index {tuple(int(i) for i in index)}"
        raise ValueError(
            f"{name} must satisfy W^T W = I (||W^T W - I|| = {worst:.1e} > {tol:.1e}{where}); "
            "use reference_impl.project_to_manifold to re-project a point that drifted"
        )


def check_frame(name: str, W, atol: float | None = None) -> tuple[int, int]:
    W = check_float64_array(name, W, min_ndim=2)
    d, r = check_frame_shape(name, W)
    check_on_manifold(name, W, atol)
    return d, r


def check_same_shape(name: str, x: np.ndarray, reference_name: str, shape: tuple[int, ...]) -> None:
    if x.shape != shape:
        raise ValueError(f"{name} must have the shape of {reference_name} {shape}, got {x.shape}")


def check_real(name: str, value, rule: str, ok) -> float:
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise ValueError(f"{name} must be a real number, got {value!r}")
    value = float(value)
    if math.isnan(value) or not ok(value):
        raise ValueError(f"{name} must satisfy {rule}, got {value!r}")
    return value
