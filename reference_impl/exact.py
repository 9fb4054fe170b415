"""Exact tier: rational points on St(d, r) and exact evaluation of the algebraic identities.

The Cayley transform of a skew matrix A,

    Q = (I - A)(I + A)^(-1),

is orthogonal (Q^T Q = (I + A)^-T (I - A)^T (I - A) (I + A)^-1 = (I - A)^-1 (I + A)(I - A)(I + A)^-1
= I, because I + A and I - A commute), and I + A is invertible for every real skew A (its
eigenvalues are 1 + i lambda). For rational A, Q is rational. Cayley matrices have det +1 and no
eigenvalue -1; multiplying by a diagonal of signs D gives det(Q D) = det(D), so both components of
O(n) are reached. The first r columns of a rational orthogonal d x d matrix are a rational frame.

On these points an identity such as P_W(W) = 0 or W^T P_W(G) skew can be checked with zero
tolerance: every operation below is exact rational arithmetic (sympy Rational matrices).
"""

from __future__ import annotations

import numpy as np
import sympy

Matrix = sympy.Matrix


def _check_rng(rng) -> None:
    if not isinstance(rng, np.random.Generator):
        raise ValueError(f"rng must be a numpy.random.Generator, got {type(rng).__name__}")


def _rational(rng: np.random.Generator, max_numerator: int, max_denominator: int) -> sympy.Rational:
    numerator = int(rng.integers(-max_numerator, max_numerator + 1))
    denominator = int(rng.integers(1, max_denominator + 1))
    return sympy.Rational(numerator, denominator)


def rational_matrix(rows: int, cols: int, rng: np.random.Generator, max_numerator: int = 9, max_denominator: int = 7) -> Matrix:
    """A random rows x cols matrix of small rationals p/q, |p| <= max_numerator, 1 <= q <= max_denominator."""
    _check_rng(rng)
    return Matrix(rows, cols, lambda i, j: _rational(rng, max_numerator, max_denominator))


def rational_skew(n: int, rng: np.random.Generator, max_numerator: int = 5, max_denominator: int = 4) -> Matrix:
    """A random n x n skew-symmetric matrix of small rationals."""
    upper = rational_matrix(n, n, rng, max_numerator, max_denominator)
    return Matrix(n, n, lambda i, j: upper[i, j] if i < j else (-upper[j, i] if i > j else 0))


def cayley(A: Matrix) -> Matrix:
    """(I - A)(I + A)^(-1) for a skew matrix A: an exact orthogonal matrix of determinant +1."""
    if A.shape[0] != A.shape[1] or (A + A.T) != sympy.zeros(*A.shape):
        raise ValueError("A must be a square skew-symmetric matrix")
    identity = sympy.eye(A.shape[0])
    return (identity - A) * (identity + A).inv()


def rational_orthogonal(n: int, rng: np.random.Generator, det: int | None = None) -> Matrix:
    """A random rational orthogonal n x n matrix; det = +1, -1, or None for a fair coin."""
    _check_rng(rng)
    if det is None:
        det = 1 if rng.integers(0, 2) == 0 else -1
    if det not in (1, -1):
        raise ValueError(f"det must be +1, -1 or None, got {det!r}")
    signs = [int(s) for s in rng.choice([-1, 1], size=n)]
    if int(np.prod(signs)) != det:
        signs[0] = -signs[0]
    return cayley(rational_skew(n, rng)) * sympy.diag(*signs)


def rational_point(d: int, r: int, rng: np.random.Generator) -> Matrix:
    """A random rational frame on St(d, r): the first r columns of a rational orthogonal matrix."""
    if not 1 <= r <= d:
        raise ValueError(f"need 1 <= r <= d, got d={d}, r={r}")
    return rational_orthogonal(d, rng)[:, :r]


def sym(A: Matrix) -> Matrix:
    return (A + A.T) / 2


def skew(A: Matrix) -> Matrix:
    return (A - A.T) / 2


def project_tangent(W: Matrix, G: Matrix) -> Matrix:
    """P_W(G) = G - W sym(W^T G), exactly."""
    return G - W * sym(W.T * G)


def is_zero(M: Matrix) -> bool:
    """True exactly when every entry of M is the rational 0 (no tolerance)."""
    return all(sympy.nsimplify(entry) == 0 for entry in M)


def is_on_manifold(W: Matrix) -> bool:
    return is_zero(W.T * W - sympy.eye(W.shape[1]))


def to_float64(M: Matrix) -> np.ndarray:
    """Nearest float64 of each entry (a rational rounds with relative error at most u)."""
    return np.array([[float(M[i, j]) for j in range(M.shape[1])] for i in range(M.shape[0])], dtype=np.float64)
