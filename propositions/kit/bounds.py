"""The stage bounds of the rounding analysis, one function per fact, each docstring its derivation.

Every bound here is a `Stage`: a sympy formula in named symbols, which the code evaluates (through
sympy.lambdify) and which the certificates print (through sympy.sstr): the text a certificate
cites is the formula the code evaluates, never retyped. `Stage.text()` gives "E = {formula}";
tests/test_bound_texts.py parses every such block back out of every certificate and checks it
against the stage that computes the bound.

Unit roundoffs are arguments (u_c the dtype a result is computed in), so the same stage serves
float64, float32 and bfloat16. Inner products of length n err by at most gamma_n = n u / (1 - n u)
relative to the product of the absolute values (Higham, Accuracy and Stability of Numerical
Algorithms, 2002, sec. 3.1), written gamma_n(n, u_c) in the formulas. Every bound is first order in
u and counts its constants. The stages that compose into the whole step (docs/algorithm.md) are in
propositions/kit/step_analysis.py; those here are the primitives that other claims use as well.
"""

from __future__ import annotations

import contextlib
import math
import threading

import numpy as np
import sympy

from reference_impl import UNIT_ROUNDOFF

u = UNIT_ROUNDOFF

GAMMA = sympy.Function("gamma_n")


def _gamma_numeric(n, unit):
    if type(n) is int and type(unit) is float and n * unit < 1:
        # the same IEEE operations on Python floats (n < 2^53 converts exactly): no arrays for scalars
        nu = n * unit
        return nu / (1 - nu)
    n, unit = np.asarray(n, dtype=np.float64), np.asarray(unit, dtype=np.float64)
    return n * unit / (1 - n * unit)


_QUIET = threading.local()


@contextlib.contextmanager
def quiet():
    """Evaluate the stages called inside without numpy's warnings, as each call does alone, but with
    one np.errstate for the block (a composition such as step_analysis.step_error calls twenty)."""
    depth = getattr(_QUIET, "depth", 0)
    _QUIET.depth = depth + 1
    try:
        with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
            yield
    finally:
        _QUIET.depth = depth


# sympy's Min / Max print as numpy.minimum / maximum, which propagate a NaN from a branch that does
# not apply (0 / 0 where the other branch is 0); fmin / fmax take the other branch.
_MODULES = [{"gamma_n": _gamma_numeric, "minimum": np.fmin, "maximum": np.fmax}, "numpy"]


class Stage:
    """One stage bound: its formula as data (`expr`, a sympy expression in `params`), evaluated by
    calling the stage with every parameter as a keyword (scalars or arrays that broadcast)."""

    def __init__(self, name: str, symbol: str, formula: str, params: tuple[str, ...], doc: str | None):
        self.name = name
        self.symbol = symbol
        self.params = params
        self.symbols = {p: sympy.Symbol(p) for p in params}
        self._param_set = frozenset(params)
        self.expr = sympy.sympify(formula, locals={**self.symbols, "gamma_n": GAMMA})
        unknown = {str(s) for s in self.expr.free_symbols} - set(params)
        if unknown:
            raise ValueError(f"stage {name}: formula uses {sorted(unknown)}, not among its parameters")
        self._compiled = None  # sympy.lambdify of expr, made at the first evaluation (a process that only cites the formula never needs it)
        self.__doc__ = doc
        self.__name__ = name
        self._text = None

    def __call__(self, **values):
        if values.keys() != self._param_set:
            missing = [p for p in self.params if p not in values]
            extra = sorted(set(values) - set(self.params))
            raise TypeError(f"stage {self.name} takes {', '.join(self.params)}; missing {missing}, unexpected {extra}")
        if getattr(_QUIET, "depth", 0):
            return self._evaluate(*[values[p] for p in self.params])
        with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
            return self._evaluate(*[values[p] for p in self.params])

    @property
    def _evaluate(self):
        if self._compiled is None:
            self._compiled = sympy.lambdify([self.symbols[p] for p in self.params], self.expr, modules=_MODULES)
        return self._compiled

    def text(self) -> str:
        """'name: SYMBOL = {formula}': the formula exactly as the code evaluates it (sympy.sstr; printed
        once, the expression being immutable: certificates cite it hundreds of times)."""
        if self._text is None:
            self._text = f"{self.name}: {self.symbol} = {{{sympy.sstr(self.expr)}}}"
        return self._text

    def latex(self) -> str:
        return f"{self.symbol} = {sympy.latex(self.expr)}"

    def __repr__(self) -> str:
        return f"Stage({self.name}: {self.text()})"


STAGES: dict[str, Stage] = {}


def stage(symbol: str, formula: str):
    """Decorator: the function's parameters name the formula's symbols, its docstring is the
    derivation; the function becomes the Stage (its body is never run)."""

    def wrap(function) -> Stage:
        params = tuple(function.__code__.co_varnames[: function.__code__.co_argcount])
        built = Stage(function.__name__, symbol, formula, params, function.__doc__)
        if built.name in STAGES:
            raise ValueError(f"stage {built.name} defined twice")
        STAGES[built.name] = built
        return built

    return wrap


def gamma(n: float) -> float:
    """Higham's gamma_n = n u / (1 - n u) in float64: relative error bound of a length-n inner product."""
    nu = n * u
    if nu >= 1:
        raise ValueError(f"gamma_n undefined for n u >= 1 (n = {n})")
    return nu / (1 - nu)


# --------------------------------------------------------------------------------------------
# Primitive stages
# --------------------------------------------------------------------------------------------


@stage("E_P", "X_err + ((gamma_n(d, u_c) + gamma_n(r, u_c))*sqrt(r) + 3*u_c)*X + 2*W_err*X")
def projection(d, r, u_c, X, X_err, W_err):
    """Bound on ||fl(P_W'(X')) - P_W(X)||_F: the projection X - W sym(W^T X) of a d x r matrix X with
    ||X||_F <= X, evaluated in a dtype of unit roundoff u_c at inputs W' = W + dW, X' = X + dX with
    ||dW||_F <= W_err (a frame off the exact one) and ||dX||_F <= X_err.

      * rounding (W orthonormal to first order, ||W||_2 = 1, ||W||_F = sqrt(r)): fl(W^T X) errs by
        gamma_d |W|^T |X|, of Frobenius norm <= gamma_d ||W||_F ||X||_F = gamma_d sqrt(r) X; the product
        W S with ||S|| <= X errs by gamma_r sqrt(r) X; sym (a sum and a halving), the subtraction and
        the propagation of S's error through ||W||_2 = 1 add 3 u_c X;
      * the input X': P_W is an orthogonal projector, norm 1, so dX passes with factor 1;
      * the input W': P_W is quadratic in W, ||P_W' X - P_W X|| <= ||dW sym(W^T X)|| +
        ||W sym(dW^T X)|| <= 2 ||dW|| ||X|| to first order.
    """


@stage("E_Pij", "u_c*G_abs + 2*gamma_n(d + r + 4, u_c)*M_abs")
def projection_entrywise(d, r, u_c, G_abs, M_abs):
    """Entrywise bound on |fl(P_W(G)) - (G - W sym(W^T G))| for a float frame W (no orthonormality
    used: the exact formula at the float W), G_abs = |G| and M_abs = |W| sym(|W|^T |G|) entrywise,
    in a dtype of unit roundoff u_c: fl(W^T G) errs by gamma_d |W|^T |G| entrywise, sym and the
    halving by u_c |.|; fl(W S) by gamma_r |W| |S|; the final subtraction by u_c (|G| + |W S|). Every
    term is at most (gamma_d + gamma_r + 4 u_c)(1 + gamma_d + u_c) M_abs + u_c |G|, doubled for the
    dropped O(u_c^2) terms: u_c |G| + 2 gamma_{d + r + 4} M_abs. The projection stage is the same
    count in the Frobenius norm at an orthonormal frame (|| |W| ||_F = sqrt(r), ||W||_2 = 1)."""


def entrywise_projection_bound(W: np.ndarray, G: np.ndarray, u_c: float = u) -> np.ndarray:
    """The projection_entrywise stage at frames W and matrices G (..., d, r), float64 arrays; shape of G."""
    d, r = W.shape[-2], W.shape[-1]
    absW = np.abs(W)
    inner = np.swapaxes(absW, -1, -2) @ np.abs(G)
    M_abs = absW @ (0.5 * (inner + np.swapaxes(inner, -1, -2)))
    return np.asarray(projection_entrywise(d=d, r=r, u_c=u_c, G_abs=np.abs(G), M_abs=M_abs), dtype=np.float64)


@stage("E_Gram", "gamma_n(d, u_c)*A**2")
def gram(d, u_c, A):
    """Bound on ||fl(A^T A) - A^T A||_F for a d x r matrix A with ||A||_F <= A, in a dtype of unit
    roundoff u_c: entry (i, j) is a length-d inner product and errs by gamma_d |a_i|^T |a_j| <=
    gamma_d ||a_i|| ||a_j|| (Cauchy-Schwarz); the Frobenius norm of the matrix (||a_i|| ||a_j||)_ij
    is sum_i ||a_i||^2 = ||A||_F^2. Independent of r apart from ||A||_F."""


@stage("E_sqrt", "Min(x_err/(2*sqrt(x)), sqrt(x_err)) + u_c*sqrt(x)")
def square_root(u_c, x, x_err):
    """Bound on |fl(sqrt(x')) - sqrt(x)| for x >= 0 and |x' - x| <= x_err, sqrt correctly rounded
    (IEEE 754) in a dtype of unit roundoff u_c.

      * propagation: |sqrt(x') - sqrt(x)| = |x' - x| / (sqrt(x') + sqrt(x)) <= x_err / (2 sqrt(x))
        when x' >= x, and always <= sqrt(|x' - x|) (sqrt is 1/2-Hoelder with constant 1); the
        smaller of the two (only the second where x = 0);
      * rounding: fl(sqrt(y)) = sqrt(y)(1 + delta), |delta| <= u_c: u_c sqrt(x) to first order.
    """


@stage("E_polar", "Min(dA/sigma_lo, 2*sqrt(r))")
def polar_perturbation(r, dA, sigma_lo):
    """Bound on ||polar(A) - polar(B)||_F in exact arithmetic when ||A - B||_F <= dA and every matrix
    of the segment [A, B] has smallest singular value >= sigma_lo > 0.

    The derivative of the polar factor at C = P S Q^T (thin SVD) maps dC to P Omega Q^T +
    (I - P P^T) dC Q S^-1 Q^T with Omega_ij = (X_ij - X_ji) / (s_i + s_j), X = P^T dC Q. The two terms
    are orthogonal (P^T (I - P P^T) = 0); ||Omega||_F <= ||X - X^T||_F / (2 s_min) <= ||X||_F / s_min
    and the second term is at most ||(I - P P^T) dC||_F / s_min, so ||D polar(C)[dC]||_F^2 <=
    (||P^T dC||_F^2 + ||(I - P P^T) dC||_F^2) / s_min^2 = ||dC||_F^2 / s_min^2. Integrated along the
    segment: dA / sigma_lo. Where sigma_lo comes from: (W + xi)^T (W + xi) = W^T W + xi^T xi for xi
    tangent at W, so sigma_min(W + xi) >= sigma_min(W), 1 at a frame and >= 1 - a within a of
    St(d, r); for a computed A and an exact A* within dA of it, Weyl gives sigma_lo = sigma_min(A) -
    dA on the segment. (Li and Sun's 2 / (sigma_r(A) + sigma_r(B)), SIAM J. Matrix Anal. Appl. 25
    (2003), agrees where sigma_r(A) = sigma_r(B).) Never more than 2 sqrt(r), the largest distance
    of two d x r matrices with orthonormal columns, which is the bound where sigma_lo <= 0.
    """


def polar_perturbation_bound(distance, sigma_min, r: int | None = None):
    """The polar_perturbation stage at (distance, sigma_min), arrays allowed; where sigma_min <= 0 the
    stage's 2 sqrt(r) (inf when r is not given, the uncapped dA / sigma_lo having no meaning)."""
    distance = np.asarray(distance, dtype=np.float64)
    sigma_min = np.asarray(sigma_min, dtype=np.float64)
    cap = np.inf if r is None else r
    # r = inf makes the stage's cap 2 sqrt(r) inactive: the uncapped distance / sigma_min
    value = np.asarray(polar_perturbation(r=cap, dA=distance, sigma_lo=np.where(sigma_min > 0, sigma_min, 1.0)), dtype=np.float64)
    fallback = np.inf if r is None else 2.0 * math.sqrt(r)
    return np.where(sigma_min > 0, value, fallback)


# --------------------------------------------------------------------------------------------
# The SVD route of the polar factor (the reference's retraction)
# --------------------------------------------------------------------------------------------

# LAPACK's dbdsqr (the implicit QR iteration on the bidiagonal, called by dbdsdc for the leaves of
# the SVD that numpy's gesdd computes) stops and reports failure -- numpy raises LinAlgError --
# once its inner loop has run MAXITR n^2 times, MAXITR = 6; its counter grows by the number of
# plane rotations of each sweep, and the last sweep may overrun the cap by at most n - 1, so a
# converged n x n bidiagonal SVD applies at most (MAXITR + 1) n^2 rotations on each side. (Demmel
# and Kahan observe about two sweeps per singular value, 2 n^2 rotations, on typical matrices; a
# bound must take the cap, not the typical count.) A plane rotation formed and applied in floating
# point perturbs the two rows (or columns) it acts on by at most gamma_6 relative to their norm
# (Higham 2002, Lemma 19.8). Both numbers enter the formulas below: 2 sides x 7 r^2 rotations x 6 u
# = 84 r^2 u (backward), and 2 ceil(7 * 6 sqrt 2) r^2 u = 120 r^2 u (accumulated U_B, V_B).


@stage("E_H", "(6*m + 13)*u_c")
def householder(m, u_c):
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


_H_D = "(6*d + 13)*u_c"
_H_R = "(6*r + 13)*u_c"
_SVD_BACKWARD = f"(r*({_H_D} + {_H_R}) + 84*r**2*u_c)"
_SVD_ORTHONORMALITY = f"(120*r**2*u_c + sqrt(r)*r*({_H_D} + {_H_R}) + r*gamma_n(r, u_c))"


@stage("E_svd_backward", _SVD_BACKWARD)
def svd_backward(d, r, u_c):
    """Relative backward error of the thin SVD of a d x r matrix (d >= r) by LAPACK's gesdd, Frobenius
    norm: U S V^T = A + E with U, V exactly orthonormal and ||E||_F <= E_svd_backward ||A||_F, from
      * the bidiagonalisation (dgebrd): r left reflectors of length <= d act on every column
        (r householder(d) columnwise) and at most r right reflectors of length <= r on every
        row (r householder(r) rowwise);
      * the bidiagonal SVD: at most 7 r^2 plane rotations per side (LAPACK's iteration cap), each
        gamma_6 relative to the two rows it acts on, which are at most ||B||_F = ||A||_F (1 + O(u)):
        2 * 7 r^2 * 6 u = 84 r^2 u. For r > 25 gesdd's divide and conquer solves leaves of size <= 25
        by the same iteration and merges them by orthogonal updates accurate to O(r u) per level (Gu
        and Eisenstat 1995), inside this count.
    """


@stage("E_svd_orth", _SVD_ORTHONORMALITY)
def svd_orthonormality(d, r, u_c):
    """Bound on ||fl(U V^T) - U~ V~^T||_F, U~ and V~ the exactly orthonormal factors of svd_backward.

      * U_B, V_B (r x r) accumulate the bidiagonal SVD's rotations: at most 7 r^2 of them per side,
        each gamma_6 relative to the two unit columns it acts on (norm sqrt 2): 7 r^2 6 sqrt(2) u <=
        60 r^2 u each, 120 r^2 u for the two;
      * U = Q_L [U_B; 0] applies r reflectors of length <= d to each of the r unit columns
        (r householder(d) each, sqrt(r) r householder(d) in the Frobenius norm); V = Q_R V_B likewise
        with length r;
      * the product U V^T: length-r inner products, gamma_r ||U||_F ||V||_F = r gamma_r.
    It does not depend on A's conditioning.
    """


@stage("E_svd", f"sqrt(r)*kappa*{_SVD_BACKWARD} + {_SVD_ORTHONORMALITY}")
def polar_svd(d, r, u_c, kappa):
    """Bound on ||fl(polar(A)) - polar(A)||_F for the polar factor fl(U V^T) from the thin SVD of a
    d x r matrix A with sigma_max(A) / sigma_min(A) <= kappa (reference_impl.polar_retract).
      * backward error: U~ S V~^T = A + E exactly, ||E||_F <= E_svd_backward ||A||_F, so U~ V~^T =
        polar(A + E); the polar factor moves by at most ||E||_F / sigma_min (polar_perturbation)
        <= E_svd_backward sqrt(r) kappa (||A||_F <= sqrt(r) sigma_max);
      * the computed U, V and their product: svd_orthonormality.
    Linear in kappa, of order sqrt(r) r (d + r) u.
    """


def householder_error(m: int) -> float:
    """The householder stage in float64."""
    return float(householder(m=m, u_c=u))


def svd_backward_error(d: int, r: int) -> float:
    """The svd_backward stage in float64."""
    return float(svd_backward(d=d, r=r, u_c=u))


def svd_orthonormality_error(d: int, r: int) -> float:
    """The svd_orthonormality stage in float64."""
    return float(svd_orthonormality(d=d, r=r, u_c=u))


def polar_error_bound(d: int, r: int, cond, u_c: float = u):
    """The polar_svd stage at condition number cond (a scalar or an array), in float64 unless u_c is given."""
    return np.asarray(polar_svd(d=d, r=r, u_c=u_c, kappa=np.asarray(cond, dtype=np.float64)), dtype=np.float64)


# --------------------------------------------------------------------------------------------
# Feasibility
# --------------------------------------------------------------------------------------------


@stage("E_feas", "2*a + a**2 + gamma_n(d, u_c)*r*(1 + a)**2")
def gram_defect(d, r, u_c, a):
    """Bound on fl(||W^T W - I||_F) for a d x r matrix W within a of an orthonormal Q (Frobenius),
    evaluated in a dtype of unit roundoff u_c.

    W = Q + D, W^T W - I = Q^T D + D^T Q + D^T D: at most 2 a + a^2. Forming W^T W errs by the gram
    stage at ||W||_F^2 <= r (1 + a)^2; subtracting I and the norm add u ||W^T W - I|| (second order).
    """


def gram_defect_bound(distance, d: int, r: int, gram_roundoff: float = u):
    """The gram_defect stage at `distance`, computed in a dtype of unit roundoff gram_roundoff."""
    return np.asarray(gram_defect(d=d, r=r, u_c=gram_roundoff, a=np.asarray(distance, dtype=np.float64)), dtype=np.float64)


def feasibility_bound(d: int, r: int) -> float:
    """Bound on ||W^T W - I||_F, evaluated in float64, for W = fl(U V^T) from the float64 SVD:
    gram_defect at the distance svd_orthonormality of fl(U V^T) to an orthonormal matrix (whatever
    A's conditioning). It does not depend on the step count: the polar factor is recomputed from the
    actual W + xi at every step."""
    return float(gram_defect_bound(svd_orthonormality_error(d, r), d, r))


def projection_error_bound(d: int, r: int, u_c: float = u) -> float:
    """The projection stage at an exact frame, relative to ||X|| (X = 1, no input error), in float64
    unless u_c is given."""
    return float(projection(d=d, r=r, u_c=u_c, X=1.0, X_err=0.0, W_err=0.0))


POLAR_ERROR_TEXT = (
    "the SVD route's rounding at cond kappa (propositions/kit/bounds.py), " + polar_svd.text()
    + " (backward error of numpy's gesdd, moved by 1/sigma_min, plus the loss of orthonormality of U, V and U V^T)"
)

POLAR_PERTURBATION_TEXT = (
    "the polar factor's Lipschitz bound (propositions/kit/bounds.py), " + polar_perturbation.text()
    + " (the polar factor's derivative has norm <= 1/sigma_min along a segment whose smallest singular value is >= sigma_lo)"
)

FEASIBILITY_TEXT = (
    "the Gram defect at a = E_svd_orth (propositions/kit/bounds.py), " + gram_defect.text() + ", with "
    + svd_orthonormality.text() + " (independent of cond and of the step count)"
)

PROJECTION_TEXT = "the projection's rounding at X = 1 (relative to ||G||), an exact frame (propositions/kit/bounds.py), " + projection.text()
