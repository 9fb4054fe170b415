"""Symbolic execution of the reference's own code: the derivation is about the code, not a re-typed formula.

The claims' MatrixSymbol derivations (reduce_with, below) prove the formulas of docs/mathematics.md; no
change to reference_impl can touch them. Here the reference's functions themselves
(project_tangent, sym, skew, moments_and_direction, scale_free_direction, clip_to_trust_region)
run on NumPy object arrays whose entries are exact symbolic values, so a changed sign, a dropped
sym or a wrong constant in the code changes the symbolic result and the step that uses it fails.

The algebra
    `Algebra(d, r, ...)` is the field of rational functions over QQ (sympy.polys) in the entries
    w_ij of a generic d x r matrix W, in the entries of named generic matrices (G, M, ...), in named
    scalars (c, lambda, v, ...; declared positive or not) and in a reserve of "root" generators.
    Elements are wrapped in `Element`, which gives NumPy what it asks of an object array: + - * /
    with Python numbers (every float constant of the code enters as its exact binary value,
    sympy.Rational(float)), `.sqrt()` for np.sqrt, and comparisons.

    W^T W = I_r is imposed by reduction: a Groebner basis of the r(r+1)/2 polynomials of
    W^T W - I_r (in the ring's own monomial order), and an identity holds on St(d, r) when the
    numerator of (left - right) reduces to 0 modulo it. That is sound: a remainder 0 puts the
    numerator in the ideal, so it vanishes at every frame where the denominators do not. For
    r = d the ideal is that of all of O(d), both components.

    Square roots: sqrt(x) returns q * s_k when x = q^2 B_k for an already registered radicand B_k
    and q a monomial in positive symbols (so sqrt(c^2 v) = c sqrt(v) for c > 0, exactly as the
    positive branch requires); otherwise it registers x and returns the next root generator s_k,
    a *free* symbol. Reduction never uses s_k^2 = B_k: an identity proved with free roots holds
    for the actual roots (sound), and one that needed s_k^2 = B_k is reported as not reduced
    (conservative).

    Comparisons: `x > c` is decided exactly when both sides are constants, and x > 0 for a
    monomial with positive coefficient in positive symbols; otherwise the Algebra's `branch`
    callable decides, and the decision is recorded in `assumptions` (the clipped or unclipped
    regime of the trust region, say). `x == 0` is True only for the zero element: the generic
    branch (v^ != 0) is the one executed, and that too is recorded.

Zero tests of sympy expressions
    `is_zero(expr)` is the one test that a sympy expression (a scalar, an explicit Matrix or a
    MatrixSymbol expression) is identically zero, used by every claim's derivation: it evaluates
    unevaluated objects (doit), then tries expand and, where that leaves a remainder, simplify,
    entry by entry for an explicit matrix. It is sound (True only for an expression sympy proves
    to be 0) and conservative (an identity that neither reduces to 0 is reported as not shown).

What cannot be executed symbolically
    np.linalg.svd / eigh / qr on object arrays: polar_retract, polar_factor, haar_from_gaussian
    and hence `step` as a whole. Stage 8 (the transport m+ = P_{W+}(m)) runs as project_tangent at
    a second generic frame; the retraction stays a derivation about the formula.
"""

from __future__ import annotations

import numbers
from typing import Callable, Iterable

import numpy as np
import sympy as sp
from sympy.polys.rings import ring
from sympy.polys.groebnertools import groebner
from sympy.polys.orderings import grevlex


def _reduced_zero(value) -> bool:
    return value == 0 or isinstance(value, sp.ZeroMatrix) or bool(getattr(value, "is_ZeroMatrix", False))


def is_zero(expr) -> bool:
    """True when the sympy expression expr (scalar, Matrix or matrix expression) is identically 0.

    doit() first (Trace, Transpose, MatMul of explicit matrices), then entry by entry for an explicit
    Matrix; each value is expanded and, only if that leaves something, simplified (module docstring).
    """
    value = expr.doit() if hasattr(expr, "doit") else expr
    if isinstance(value, sp.MatrixBase):
        return all(is_zero(entry) for entry in value)
    if _reduced_zero(value):
        return True
    if _reduced_zero(sp.expand(value)):
        return True
    return _reduced_zero(sp.simplify(value))


# Each substitution pass removes at least one occurrence of a left-hand side; the MatrixSymbol
# derivations of the claims nest at most a few products, so six passes are far more than a fixed
# point needs.
MAX_SUBSTITUTION_PASSES = 6


def reduce_with(expr, substitutions: dict):
    """Expand, apply the substitutions until nothing changes, simplify.

    MatrixSymbol algebra has no notion of "W^T W = I"; a derivation written for every d and r
    states such facts as a dict of substitutions ({W.T * W: Identity(r)}) and reduces with them.
    """
    expr = sp.expand(expr)
    for _ in range(MAX_SUBSTITUTION_PASSES):
        new = sp.expand(expr.subs(substitutions))
        if new == expr:
            break
        expr = new
    return sp.simplify(expr)


def exact_rational(value) -> sp.Rational:
    """A Python/NumPy number as the exact rational it stores (0.9 -> 8106479329266893/2^53)."""
    if isinstance(value, (bool, np.bool_)):
        return sp.Integer(int(value))
    if isinstance(value, (numbers.Integral, np.integer)):
        return sp.Integer(int(value))
    if isinstance(value, (float, np.floating)):
        if not np.isfinite(value):
            raise ValueError(f"cannot take the non-finite constant {value!r} into the symbolic algebra")
        return sp.Rational(float(value))
    raise TypeError(f"cannot take {type(value).__name__} into the symbolic algebra")


class Value:
    """An exact rational function num / den of the Algebra's ring, kept without gcd cancellation.

    Multivariate gcds with the code's 53-bit constants (0.999 = 8998192055486251/2^53) dominate
    the cost of a fraction field; nothing here needs a reduced fraction, because every test
    cross-multiplies (x = y iff num_x den_y = num_y den_x) or reduces the numerator alone.
    """

    __slots__ = ("num", "den")

    def __init__(self, num, den):
        if den == 0:
            raise ZeroDivisionError("symbolic division by zero")
        self.num, self.den = num, den

    def __add__(self, other):
        if self.den == other.den:
            return Value(self.num + other.num, self.den)
        return Value(self.num * other.den + other.num * self.den, self.den * other.den)

    def __sub__(self, other):
        if self.den == other.den:
            return Value(self.num - other.num, self.den)
        return Value(self.num * other.den - other.num * self.den, self.den * other.den)

    def __mul__(self, other):
        return Value(self.num * other.num, self.den * other.den)

    def __truediv__(self, other):
        return Value(self.num * other.den, self.den * other.num)

    def __neg__(self):
        return Value(-self.num, self.den)

    def __pow__(self, exponent: int):
        if exponent < 0:
            return Value(self.den ** -exponent, self.num ** -exponent)
        return Value(self.num ** exponent, self.den ** exponent)

    def is_zero(self) -> bool:
        return self.num == 0

    def as_expr(self):
        return self.num.as_expr() / self.den.as_expr()


class Element:
    """One exact value of an Algebra, with the arithmetic NumPy object arrays need."""

    __slots__ = ("algebra", "value")

    def __init__(self, algebra: "Algebra", value: Value):
        self.algebra = algebra
        self.value = value

    def _lift(self, other) -> Value | None:
        """other as a Value; None for an array (the operator then returns NotImplemented, and
        NumPy applies the operation entry by entry)."""
        if isinstance(other, np.ndarray):
            return None
        if isinstance(other, Element):
            return other.value
        return self.algebra.value_of(other)

    def __add__(self, other):
        other = self._lift(other)
        return NotImplemented if other is None else Element(self.algebra, self.value + other)

    __radd__ = __add__

    def __sub__(self, other):
        other = self._lift(other)
        return NotImplemented if other is None else Element(self.algebra, self.value - other)

    def __rsub__(self, other):
        other = self._lift(other)
        return NotImplemented if other is None else Element(self.algebra, other - self.value)

    def __mul__(self, other):
        other = self._lift(other)
        return NotImplemented if other is None else Element(self.algebra, self.value * other)

    __rmul__ = __mul__

    def __truediv__(self, other):
        other = self._lift(other)
        return NotImplemented if other is None else Element(self.algebra, self.value / other)

    def __rtruediv__(self, other):
        other = self._lift(other)
        return NotImplemented if other is None else Element(self.algebra, other / self.value)

    def __neg__(self):
        return Element(self.algebra, -self.value)

    def __pos__(self):
        return self

    def __pow__(self, exponent):
        if not isinstance(exponent, (numbers.Integral, np.integer)):
            raise TypeError("only integer powers are executed symbolically (np.sqrt calls .sqrt())")
        return Element(self.algebra, self.value ** int(exponent))

    def sqrt(self):
        return Element(self.algebra, self.algebra.sqrt(self.value))

    # comparisons: exact where decidable, else the algebra's branch (recorded)
    def _compare(self, other, op: str) -> bool:
        other_value = self._lift(other)
        if other_value is None:
            return NotImplemented
        return self.algebra.compare(self.value, other_value, op)

    def __gt__(self, other):
        return self._compare(other, ">")

    def __ge__(self, other):
        return self._compare(other, ">=")

    def __lt__(self, other):
        return self._compare(other, "<")

    def __le__(self, other):
        return self._compare(other, "<=")

    def __eq__(self, other):
        if not isinstance(other, (Element, numbers.Number, np.number)):
            return NotImplemented  # arrays compare entry by entry
        difference = self.value - self._lift(other)
        if not difference.is_zero():
            self.algebra.note(f"a symbolic value == {other if not isinstance(other, Element) else 'a value'} is not an identity, "
                              "so the generic branch (unequal) is executed")
        return difference.is_zero()

    def __ne__(self, other):
        result = self.__eq__(other)
        return result if result is NotImplemented else not result

    __hash__ = None

    def __float__(self):
        raise TypeError("a symbolic value has no float value")

    def __repr__(self):
        return f"Element({self.algebra.expr(self.value)})"


BranchRule = Callable[[object, object, str], bool]


def branch_unclipped(lhs, rhs, op: str) -> bool:
    """x > 0 holds (a non-zero step), x > Delta does not: the trust region is not active."""
    return op in (">", ">=") and rhs.is_zero()


def branch_clipped(lhs, rhs, op: str) -> bool:
    """Every undecided x > c holds: a non-zero step longer than the trust radius."""
    return op in (">", ">=")


class Algebra:
    """Generic frame W (d x r), generic matrices and scalars, W^T W = I by Groebner reduction.

    matrices: (name, rows, cols) of generic matrices (entries name_ij); symmetric: (name, n) of
    generic symmetric n x n matrices; scalars: names of generic scalars; positive: which scalars
    are > 0 (used by sqrt and comparisons); roots: how many square roots the execution may take;
    frames: names of the generic d x r frames, each with its own W^T W = I; orthonormal=False
    leaves them generic matrices (no Groebner basis: identities that hold for every W).
    """

    def __init__(self, d: int, r: int, *, matrices: Iterable[tuple[str, int, int]] = (), symmetric: Iterable[tuple[str, int]] = (),
                 scalars: Iterable[str] = (), positive: Iterable[str] = (), roots: int = 4, frames: Iterable[str] = ("W",),
                 branch: BranchRule = branch_unclipped, orthonormal: bool = True):
        self.d, self.r = d, r
        self.frames = tuple(frames)
        matrices = [(name, d, r) for name in self.frames] + list(matrices)
        symmetric = list(symmetric)
        scalars, positive = list(scalars), set(positive)
        names: list[str] = []
        for name, rows, cols in matrices:
            names += [f"{name}_{i}{j}" for i in range(rows) for j in range(cols)]
        for name, n in symmetric:
            names += [f"{name}_{i}{j}" for i in range(n) for j in range(i, n)]
        names += scalars
        root_names = [f"root_{k}" for k in range(roots)]
        names += root_names
        self.ring, *generators = ring(",".join(names), sp.QQ, grevlex)
        self._by_name = dict(zip(names, generators))
        self._positive = {self.ring.gens[names.index(n)] for n in list(positive) + root_names}
        self._roots = [self._by_name[n] for n in root_names]
        self._radicands: list = []
        self._matrices = {}
        for name, rows, cols in matrices:
            self._matrices[name] = self._array([[self._by_name[f"{name}_{i}{j}"] for j in range(cols)] for i in range(rows)])
        for name, n in symmetric:
            self._matrices[name] = self._array(
                [[self._by_name[f"{name}_{min(i, j)}{max(i, j)}"] for j in range(n)] for i in range(n)])
        relations = []
        for name in self.frames if orthonormal else ():
            gram = np.swapaxes(self._matrices[name], -1, -2) @ self._matrices[name]
            relations += [(gram[i, j] - (1 if i == j else 0)).value.num for i in range(r) for j in range(i, r)]
        self._basis = groebner(relations, self.ring) if relations else []
        self.branch = branch
        self.assumptions: list[str] = []

    # construction ------------------------------------------------------------------------
    def _array(self, rows) -> np.ndarray:
        out = np.empty((len(rows), len(rows[0])), dtype=object)
        for i, row in enumerate(rows):
            for j, value in enumerate(row):
                out[i, j] = Element(self, Value(value, self.ring.one))
        return out

    def matrix(self, name: str) -> np.ndarray:
        """The generic matrix (or frame) called name, as a fresh object array of Elements."""
        return self._matrices[name].copy()

    def scalar(self, name: str) -> Element:
        return Element(self, Value(self._by_name[name], self.ring.one))

    def value_of(self, number) -> Value:
        return Value(self.ring(exact_rational(number)), self.ring.one)

    def constant(self, number) -> Element:
        return Element(self, self.value_of(number))

    def expr(self, value):
        return sp.cancel(value.as_expr()) if isinstance(value, Value) else value

    def note(self, text: str) -> None:
        if text not in self.assumptions:
            self.assumptions.append(text)

    # square roots and comparisons ----------------------------------------------------------
    def _monomial_root(self, value: Value) -> Value | None:
        """sqrt(value) when value is c x^(2a) / (c' y^(2b)) with c, c' rational squares and x, y positive symbols."""
        if value.is_zero():
            return value
        parts = []
        for poly in (value.num, value.den):
            if len(poly.terms()) != 1:
                return None
            (monom, coefficient), = poly.terms()
            if coefficient < 0 or any(e % 2 or (e and self.ring.gens[k] not in self._positive) for k, e in enumerate(monom)):
                return None
            root = sp.sqrt(sp.Rational(coefficient))
            if not root.is_Rational:
                return None
            parts.append(self.ring({tuple(e // 2 for e in monom): self.ring.domain.convert(root)}))
        return Value(parts[0], parts[1])

    def _monomial_ratio(self, value: Value, radicand: Value) -> Value | None:
        """value / radicand when it is a monomial (one term over one term), else None.

        With N1 = num(value) den(radicand) and N2 = num(radicand) den(value), the ratio is a
        monomial q exactly when N1 = q N2, and then q is the ratio of their leading terms. Fractions
        are not reduced, so a monomial ratio hidden behind different term counts is missed: the
        value then gets a fresh root, which can only make a step fail to reduce, never pass.
        """
        # the ratios this recognises are x q over x (a radicand scaled by a monomial, as in
        # sqrt(c^2 v)): same term counts above and below; anything else gets a fresh root
        if len(value.num) != len(radicand.num) or len(value.den) != len(radicand.den):
            return None
        N1 = value.num * radicand.den
        N2 = radicand.num * value.den
        if N2 == 0 or len(N1) != len(N2):
            return None
        (m1, c1), (m2, c2) = N1.LT, N2.LT
        up = tuple(max(a - b, 0) for a, b in zip(m1, m2))
        down = tuple(max(b - a, 0) for a, b in zip(m1, m2))
        numer = self.ring({up: self.ring.domain.quo(c1, c2)})
        denom = self.ring({down: self.ring.domain.one})
        if N1 * denom != N2 * numer:
            return None
        return Value(numer, denom)

    def sqrt(self, value: Value) -> Value:
        direct = self._monomial_root(value)
        if direct is not None:
            return direct
        for radicand, root in self._radicands:
            ratio = self._monomial_ratio(value, radicand)
            factor = None if ratio is None else self._monomial_root(ratio)
            if factor is not None:
                return factor * Value(root, self.ring.one)
        if len(self._radicands) == len(self._roots):
            raise ValueError(f"the execution takes more than {len(self._roots)} square roots; raise roots=")
        root = self._roots[len(self._radicands)]
        self._radicands.append((value, root))
        self.note(f"{root} = sqrt of a symbolic radicand, > 0 (a free symbol in the reduction)")
        return Value(root, self.ring.one)

    def _positive_monomial(self, value: Value) -> bool:
        for poly in (value.num, value.den):
            if len(poly.terms()) != 1:
                return False
            (monom, coefficient), = poly.terms()
            if coefficient <= 0 or any(e and self.ring.gens[k] not in self._positive for k, e in enumerate(monom)):
                return False
        return True

    def compare(self, lhs: Value, rhs: Value, op: str) -> bool:
        difference = lhs - rhs
        if difference.num.is_ground and difference.den.is_ground:
            number = sp.Rational(difference.num.LC if difference.num else 0) / sp.Rational(difference.den.LC)
            return {">": number > 0, ">=": number >= 0, "<": number < 0, "<=": number <= 0}[op]
        if rhs.is_zero() and op in (">", ">=") and self._positive_monomial(lhs):
            return True
        decided = bool(self.branch(lhs, rhs, op))
        self.note(f"a symbolic value {op} {self.expr(rhs)} taken as {decided} ({getattr(self.branch, '__name__', 'branch rule')})")
        return decided

    # the test ------------------------------------------------------------------------------
    def reduce(self, value: Value):
        """The numerator of value reduced modulo the Groebner basis of W^T W = I (0 iff in the ideal)."""
        return value.num.rem(self._basis) if self._basis else value.num

    def vanishes(self, x, *, on_manifold: bool = True) -> bool:
        """Every entry of x (an Element, an object array or a number) is 0 (on St(d, r) when on_manifold)."""
        for entry in np.ravel(np.asarray(x, dtype=object)):
            value = entry.value if isinstance(entry, Element) else self.value_of(entry)
            if value.is_zero():
                continue
            if not on_manifold or self.reduce(value) != 0:
                return False
        return True

    def equal(self, x, y, *, on_manifold: bool = True) -> bool:
        x, y = np.asarray(x, dtype=object), np.asarray(y, dtype=object)
        return x.shape == y.shape and self.vanishes(x - y, on_manifold=on_manifold)


def transpose(A: np.ndarray) -> np.ndarray:
    """The transpose of the last two axes (the kit's own, independent of the code under test)."""
    return np.swapaxes(A, -1, -2)


def trace_inner(A: np.ndarray, B: np.ndarray):
    """<A, B> = tr(A^T B) = sum of the entrywise products."""
    return np.sum(A * B)


def tangency(W: np.ndarray, X: np.ndarray) -> np.ndarray:
    """W^T X + X^T W, zero exactly for X in T_W (the kit's own formula)."""
    return transpose(W) @ X + transpose(X) @ W


def projection_formula(W: np.ndarray, G: np.ndarray) -> np.ndarray:
    """G - W (W^T G + G^T W)/2, docs/mathematics.md written here, to hold the code to."""
    S = transpose(W) @ G
    return G - W @ ((S + transpose(S)) / 2)


# --------------------------------------------------------------------------------------------
# Derivations about the code, one list of SymbolicStep per claim
# --------------------------------------------------------------------------------------------
#
# Every function below looks the code up at call time (reference_impl.manifold.project_tangent,
# reference_impl.adam.moments_and_direction, ...), so the derivation follows the code as it is,
# and the tests can change it and watch the steps fail. The identities are checked at small
# generic sizes: an identity of the code is a polynomial identity in the entries, and one that
# fails fails at a generic point.

EXECUTION_NOTE = "the code run on exact symbolic entries (propositions.kit.symbolic)"
MANIFOLD_SHAPES = ((3, 2), (2, 2))  # a tall frame, and O(2) with both components
FORMULA_SHAPES = ((1, 1), (3, 1), (2, 2), (3, 2), (4, 3))
STAGE_SHAPE = (3, 2)
STAGE_STEP = 3  # t before the step: bias corrections 1 - beta^4 are exercised, not only t = 1
# square roots a stage execution may take: sqrt(v^) and the norm of xi, or one per entry plus the
# norm when a variant keeps v entrywise (d r + 1 = 7 at 3 x 2)
STAGE_ROOTS = 8


def _step(description: str, latex: str, reduced: bool):
    from .common import SymbolicStep

    return SymbolicStep(description, latex, bool(reduced))


def _project(W):
    from reference_impl import manifold

    return lambda X: manifold.project_tangent(W, X, validate=False)


def _shapes_text(shapes) -> str:
    return ", ".join(f"{d} x {r}" for d, r in shapes)


def projector_steps() -> list:
    """P1: the code's sym, skew and project_tangent; P_W idempotent, self-adjoint, range T_W, kernel N_W."""
    from reference_impl import manifold

    steps = []
    algebra = Algebra(3, 3, matrices=[("A", 3, 3)], frames=())
    A = algebra.matrix("A")
    S, K = manifold.sym(A), manifold.skew(A)
    steps.append(_step(
        f"the code's sym and skew are the symmetric and skew parts: sym(A) + skew(A) = A, sym(A)^T = sym(A), "
        f"skew(A)^T = -skew(A) (generic 3 x 3 A; {EXECUTION_NOTE})",
        r"\mathrm{sym}(A) + \mathrm{skew}(A) = A,\ \mathrm{sym}(A)^\top = \mathrm{sym}(A),\ \mathrm{skew}(A)^\top = -\mathrm{skew}(A)",
        algebra.equal(S + K, A, on_manifold=False) and algebra.equal(transpose(S), S, on_manifold=False)
        and algebra.equal(transpose(K), -K, on_manifold=False)))

    agrees = True
    for d, r in FORMULA_SHAPES:
        algebra = Algebra(d, r, matrices=[("G", d, r)], orthonormal=False)
        W, G = algebra.matrix("W"), algebra.matrix("G")
        agrees &= algebra.equal(_project(W)(G), projection_formula(W, G), on_manifold=False)
    steps.append(_step(
        f"the code's project_tangent(W, G) is G - W (W^T G + G^T W)/2 entry by entry, for every W and G "
        f"(generic entries, shapes {_shapes_text(FORMULA_SHAPES)}; {EXECUTION_NOTE})",
        r"\texttt{project\_tangent}(W, G) = G - W\,\tfrac12(W^\top G + G^\top W)", agrees))

    checks = {"nonzero": True, "idempotent": True, "adjoint": True, "range": True, "kernel": True, "normal": True}
    for d, r in MANIFOLD_SHAPES:
        algebra = Algebra(d, r, matrices=[("G", d, r), ("B", d, r)], symmetric=[("S", r)])
        W, G, B, S = (algebra.matrix(name) for name in ("W", "G", "B", "S"))
        P = _project(W)
        PG = P(G)
        normal_part = G - PG
        coefficient = transpose(W) @ normal_part
        checks["nonzero"] &= not algebra.vanishes(PG)
        checks["idempotent"] &= algebra.equal(P(PG), PG)
        checks["adjoint"] &= algebra.vanishes(trace_inner(PG, B) - trace_inner(G, P(B)))
        checks["range"] &= algebra.vanishes(tangency(W, PG))
        checks["kernel"] &= algebra.vanishes(P(W @ S))
        checks["normal"] &= algebra.equal(normal_part, W @ coefficient) and algebra.equal(coefficient, transpose(coefficient))
    where = f"generic W on St(d, r) by Groebner reduction of W^T W = I, shapes {_shapes_text(MANIFOLD_SHAPES)}; {EXECUTION_NOTE}"
    steps += [
        _step(f"the code's P_W(G) is not identically 0 on St(d, r): the reduction can say no ({where})",
              r"\texttt{project\_tangent}(W, G) \not\equiv 0", checks["nonzero"]),
        _step(f"the code's P_W is idempotent: P_W(P_W(G)) = P_W(G) ({where})",
              r"P_W(P_W(G)) = P_W(G)", checks["idempotent"]),
        _step(f"the code's P_W is self-adjoint: <P_W(G), B> = <G, P_W(B)> ({where})",
              r"\langle P_W(G), B\rangle = \langle G, P_W(B)\rangle", checks["adjoint"]),
        _step(f"the code's P_W maps into T_W: W^T P_W(G) + P_W(G)^T W = 0 ({where})",
              r"W^\top P_W(G) + P_W(G)^\top W = 0", checks["range"]),
        _step(f"the code's P_W annihilates N_W: P_W(W S) = 0 for symmetric S ({where})",
              r"P_W(WS) = 0,\ S = S^\top", checks["kernel"]),
        _step(f"and nothing else: G - P_W(G) = W S' with S' = W^T (G - P_W(G)) symmetric, so ker P_W = N_W ({where})",
              r"G - P_W(G) = W S',\ S' = W^\top(G - P_W(G)) = S'^\top", checks["normal"]),
    ]
    return steps


def weight_decay_steps() -> list:
    """P5: the code's project_tangent(W, W) = 0 and P_W(G + lambda W) = P_W(G) on St(d, r)."""
    annihilated, invariant = True, True
    shapes = MANIFOLD_SHAPES
    for d, r in shapes:
        algebra = Algebra(d, r, matrices=[("G", d, r)], scalars=["lambda"], positive=["lambda"])
        W, G = algebra.matrix("W"), algebra.matrix("G")
        P = _project(W)
        annihilated &= algebra.vanishes(P(W)) and not algebra.vanishes(P(G))
        invariant &= algebra.equal(P(G + W * algebra.scalar("lambda")), P(G))
    where = f"generic W on St(d, r) by Groebner reduction of W^T W = I, shapes {_shapes_text(shapes)} (2 x 2: both components of O(2)); {EXECUTION_NOTE}"
    return [
        _step(f"the code's project_tangent(W, W) = 0 on St(d, r), while project_tangent(W, G) is not identically 0 ({where})",
              r"\texttt{project\_tangent}(W, W) = 0", annihilated),
        _step(f"hence the code's stage 2 ignores coupled decay: project_tangent(W, G + lambda W) = project_tangent(W, G) ({where})",
              r"\texttt{project\_tangent}(W, G + \lambda W) = \texttt{project\_tangent}(W, G)", invariant),
    ]


def _stage_config(eps: float):
    from reference_impl.adam import StiefelAdamConfig

    return StiefelAdamConfig(lr=0.05, betas=(0.9, 0.999), eps=eps, trust_radius=0.5, weight_decay=0.0)


def _moments(algebra: Algebra, g, m, v, config):
    from reference_impl import adam
    from reference_impl.adam import StiefelAdamState

    return adam.moments_and_direction(g, StiefelAdamState(m=m, v=v, t=STAGE_STEP), config)


def scale_steps() -> list:
    """P2: the code's stages are homogeneous in the gradient scale c (eps = 0)."""
    d, r = STAGE_SHAPE
    steps = []
    algebra = Algebra(d, r, matrices=[("G", d, r)], scalars=["c", "lambda"], positive=["c", "lambda"])
    W, G = algebra.matrix("W"), algebra.matrix("G")
    c, lam = algebra.scalar("c"), algebra.scalar("lambda")
    P = _project(W)
    steps.append(_step(
        f"stages 1-2 of the code: project_tangent(W, c G + lambda W) = c project_tangent(W, G) on St(d, r) "
        f"(generic W by Groebner reduction, d = {d}, r = {r}; {EXECUTION_NOTE})",
        r"\texttt{project\_tangent}(W, cG + \lambda W) = c\,\texttt{project\_tangent}(W, G)",
        algebra.equal(P(G * c + W * lam), P(G) * c)))
    config = _stage_config(0.0)
    for name, rule in (("inside the trust region", branch_unclipped), ("clipped to the trust radius", branch_clipped)):
        algebra = Algebra(d, r, matrices=[("G", d, r), ("M", d, r)], scalars=["c", "v"], positive=["c", "v"], branch=rule, roots=STAGE_ROOTS)
        W, G, M = algebra.matrix("W"), algebra.matrix("G"), algebra.matrix("M")
        c, v = algebra.scalar("c"), algebra.scalar("v")
        g = _project(W)(G)
        m1, v1, _, xi1 = _moments(algebra, g, M, v, config)
        mc, vc, _, xic = _moments(algebra, g * c, M * c, v * c * c, config)
        homogeneous = (algebra.equal(mc, m1 * c, on_manifold=False) and algebra.equal(np.asarray(vc), np.asarray(v1) * c * c, on_manifold=False)
                       and algebra.equal(xic, xi1, on_manifold=False) and not algebra.vanishes(xi1))
        steps.append(_step(
            f"stages 3-7 of the code (moments_and_direction, scale_free_direction, clip_to_trust_region; eps = 0, "
            f"t = {STAGE_STEP} -> {STAGE_STEP + 1}, {name}): from (c g, c m, c^2 v) they give (c m+, c^2 v+) and the same "
            f"xi, a non-zero step (generic g = project_tangent(W, G), m, v > 0, c > 0; sqrt(c^2 x) = c sqrt(x); "
            f"{EXECUTION_NOTE}; assumptions: {'; '.join(algebra.assumptions)})",
            r"(m_+, v_+, \xi)(cg, cm, c^2 v) = (c\,m_+, c^2 v_+, \xi)(g, m, v)", homogeneous))
    # the branch v^ = 0 (a zero gradient from a fresh state) with eps = 0: the code must give
    # xi = 0, never 0/0 (an exact division by zero raises here and fails the step)
    algebra = Algebra(d, r, matrices=[("G", d, r)])
    zero = algebra.matrix("G") * 0
    try:
        _, v_zero, _, xi_zero = _moments(algebra, zero, zero, algebra.constant(0), config)
        zero_branch = algebra.vanishes(np.asarray(v_zero), on_manifold=False) and algebra.vanishes(xi_zero, on_manifold=False)
    except ZeroDivisionError:
        zero_branch = False
    steps.append(_step(
        f"stage 6 of the code at v^ = 0 (zero gradient, fresh state, eps = 0): xi = 0 exactly, never 0/0 ({EXECUTION_NOTE})",
        r"\hat v = 0 \Rightarrow \xi = 0", zero_branch))
    algebra = Algebra(d, r, matrices=[("M", d, r)], scalars=["c"], positive=["c"], orthonormal=False)
    W_new, M = algebra.matrix("W"), algebra.matrix("M")
    P_new = _project(W_new)
    steps.append(_step(
        f"stage 8 of the code (transport): project_tangent(W+, c m) = c project_tangent(W+, m) (generic W+, m; {EXECUTION_NOTE})",
        r"\texttt{project\_tangent}(W_+, c\,m) = c\,\texttt{project\_tangent}(W_+, m)",
        algebra.equal(P_new(M * algebra.scalar("c")), P_new(M) * algebra.scalar("c"), on_manifold=False)))
    return steps


def tangency_steps() -> list:
    """P3: the code's xi is a scalar multiple of m^ and lies in T_W (eps > 0, both trust-region branches)."""
    d, r = STAGE_SHAPE
    steps = []
    config = _stage_config(1e-8)
    for name, rule in (("inside the trust region", branch_unclipped), ("clipped to the trust radius", branch_clipped)):
        algebra = Algebra(d, r, matrices=[("G", d, r), ("M", d, r)], scalars=["v"], positive=["v"], branch=rule, roots=STAGE_ROOTS)
        W, G, M = algebra.matrix("W"), algebra.matrix("G"), algebra.matrix("M")
        P = _project(W)
        m, _, _, xi = _moments(algebra, P(G), P(M), algebra.scalar("v"), config)
        # one scalar: xi_ij m_00 = xi_00 m_ij for every entry (m_00 is not identically 0)
        scalar = algebra.vanishes(xi * m[0, 0] - m * xi[0, 0], on_manifold=False) and not algebra.vanishes(m[0, 0], on_manifold=False)
        where = (f"generic W on St({d}, {r}) by Groebner reduction, tangent g = project_tangent(W, G), m = project_tangent(W, M), "
                 f"v > 0, eps = 1e-8, t = {STAGE_STEP} -> {STAGE_STEP + 1}, {name}; {EXECUTION_NOTE}; assumptions: {'; '.join(algebra.assumptions)}")
        steps.append(_step(
            f"the code's preconditioner is one scalar: xi = k m+ with the same k for every entry, condition number 1 ({where})",
            r"\xi = k\,\hat m_+,\ k \in \mathbb{R}", scalar))
        steps.append(_step(
            f"the code's xi lies in T_W with no re-projection: W^T xi + xi^T W = 0 ({where})",
            r"W^\top \xi + \xi^\top W = 0", algebra.vanishes(tangency(W, xi)) and not algebra.vanishes(xi)))
    return steps
