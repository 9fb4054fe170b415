"""P6 (negative result): gauge directions carry no gradient.

Claim
    Let a loss depend on (W_Q, W_K) only through W_Q W_K^T, as attention does through its logits
    L = X W_Q W_K^T X^T / sqrt(r). For every skew Omega in R^{r x r} the directional derivative
    along the gauge direction (W_Q Omega, W_K Omega) vanishes:
        <G_Q, W_Q Omega> + <G_K, W_K Omega> = <W_Q^T G_Q + W_K^T G_K, Omega> = 0,
    i.e. skew(W_Q^T G_Q + W_K^T G_K) = 0. The gauge direction is tangent to St(d, r) x St(d, r)
    and the projection is self-adjoint, so the Riemannian gradient (P_{W_Q} G_Q, P_{W_K} G_K) is
    already orthogonal to every gauge direction: "removing the gauge" from it changes nothing.

Why it is true
    (W_Q + t W_Q Omega)(W_K + t W_K Omega)^T = W_Q W_K^T + t W_Q (Omega + Omega^T) W_K^T + O(t^2)
    and Omega + Omega^T = 0. In matrix form, with Gbar = dloss/dL (any n x n matrix),
    G_Q = X^T Gbar X W_K / sqrt r and G_K = X^T Gbar^T X W_Q / sqrt r, so
    W_Q^T G_Q + W_K^T G_K = M + M^T with M = (X W_Q)^T Gbar (X W_K) / sqrt r: symmetric.

How it is checked
    * symbolically: the first-order expansion of the logits with MatrixSymbols and Omega^T =
      -Omega; the symmetry of M + M^T from the chain rule with MatrixSymbols; the same with explicit
      entries at n = d = r = 2 for an arbitrary loss of the logits (its partial derivatives as
      free symbols); <S, Omega> = 0 for explicit symmetric S and skew Omega (r = 2, 3); and
      <P_W(G), W Omega> = <G, W Omega> at an explicit rotation frame;
    * exactly, with zero tolerance, at rational frames (reference_impl.exact) with rational X and
      an arbitrary rational Gbar;
    * numerically on a real softmax attention layer (propositions.attention: tokens X (n, d),
      frames W_Q, W_K (d, r), values W_V, a least-squares loss on the attention output), batched
      over shape_plan(profile) with one random layer per frame: the hand-written gradients against
      central finite differences (step h ~ u^(1/3), bound from truncation + rounding) and, in the
      thorough profile, against torch autograd in float64; ||skew(W_Q^T G_Q + W_K^T G_K)||_F
      against the bound from the rounding of the gradients; the inner product of the Riemannian
      gradients with random unit gauge directions against its bound.

What would make it fail
    A loss that is not gauge invariant. The claim-specific control "anchored_query_loss" adds
    1/2 ||W_Q - A||^2 for a fixed A to the attention loss: its gauge component is
    -skew(W_Q^T A) != 0 (r >= 2), which must exceed the bounds by DETECTION_FACTOR.

The `optimizer` argument
    P6 is a statement about gradients, not about steps: `optimizer` only selects the gradient map
    riemannian_gradient(W, G, 0, variant=optimizer) used in the gauge-orthogonality check. Every
    gradient map of reference_impl (P_W, the canonical-metric gradient, the projection without sym)
    is gauge-orthogonal for a gauge-invariant loss, so P6 is meant to pass for every variant; its
    control is the loss, not the optimizer.
"""

from __future__ import annotations

import math

import numpy as np
import sympy as sp

from reference_impl import UNIT_ROUNDOFF, feasibility, manifold_tolerance, random_point, riemannian_gradient

from .kit import tightness
from .kit.figures import HistogramFigure
from .kit.symbolic import is_zero
from . import attention
from .kit.protocol import Claim, Context, Control, Evidence, Part, Symbolic, map_evidence
from .kit.bounds import gamma
from ._common import NumericalCheck, Profile, SymbolicStep, chunk_sizes, rng_for, shape_plan

u = UNIT_ROUNDOFF
CLAIM_ID = "P6"

# Tokens per layer; every shape gets each count. n = 1 is left out: a one-token softmax is the
# constant 1, so G_Q = G_K = 0 exactly and the gauge residual would be zero by construction.
# Value width d_v.
TOKEN_COUNTS = (2, 5, 16)
VALUE_DIM = 3
# Per-layer scales: tokens 10^U(-1, 0.5) (from nearly uniform to saturated softmax rows), values
# and targets 10^U(-3, 3) (gradients over twelve decades).
TOKEN_LOG10_SCALE = (-1.0, 0.5)
VALUE_LOG10_SCALE = (-3.0, 3.0)


# --------------------------------------------------------------------------------------------
# Bounds
# --------------------------------------------------------------------------------------------


def gauge_residual_bound(
    X, W_Q, W_K, fwd: attention.AttentionForward, grads: attention.AttentionGradients
) -> np.ndarray:
    """Bound on ||fl(skew(W_Q^T G_Q + W_K^T G_K))||_F per layer for the hand-written gradients.

    The identity holds for any Gbar, so the rounding of the softmax and of Gbar does not enter;
    only the products that follow Gbar, and the pairing of the computed Q = fl(X W_Q) with the exact
    one, do. With P_Q = |W_Q|^T |X|^T |Gbar| |K| / sqrt r and P_K = |W_K|^T |X|^T |Gbar|^T |Q| / sqrt r:
    Gbar K (length n, gamma_n), the division by sqrt r (2u), X^T (Gbar K) (length n, gamma_n),
    W_Q^T G_Q (length d, gamma_d) each contribute at most their constant times P_Q entrywise, and
    W_Q^T X^T = Q^T only up to fl(X W_Q) = Q + dQ, |dQ| <= gamma_d |X| |W_Q|, which adds gamma_d P_Q
    (Q^T Gbar K + K^T Gbar^T Q is exactly symmetric for the computed Q, K). The same for the key
    side; the sum and the skew part round by 2u. The skew part of an error is no larger than the
    error, so ||skew|| <= (2 gamma_n + 2 gamma_d + 4u)(||P_Q||_F + ||P_K||_F); factor 2 for O(u^2).
    """
    n, d = X.shape[-2], X.shape[-1]
    r = W_Q.shape[-1]
    aX_t = np.swapaxes(np.abs(X), -1, -2)
    a_gbar = np.abs(grads.logits)
    P_Q = np.swapaxes(np.abs(W_Q), -1, -2) @ (aX_t @ (a_gbar @ np.abs(fwd.K))) / math.sqrt(r)
    P_K = np.swapaxes(np.abs(W_K), -1, -2) @ (aX_t @ (np.swapaxes(a_gbar, -1, -2) @ np.abs(fwd.Q))) / math.sqrt(r)
    constant = 2 * gamma(n) + 2 * gamma(d) + 4 * u
    bound = 2 * constant * (np.linalg.norm(P_Q, axis=(-2, -1)) + np.linalg.norm(P_K, axis=(-2, -1)))
    # r = 1 makes every term zero (a 1 x 1 skew part is 0 exactly, and so is the residual);
    # comparisons against zero need an absolute bound > 0, so there, and only there, it is u.
    return np.where(bound > 0, bound, u)


def gauge_inner_product_bound(d: int, r: int, gauge_bound, G_Q, G_K, omega_norm, W_Q=None, W_K=None) -> np.ndarray:
    """Bound on |<g_Q, W_Q Omega> + <g_K, W_K Omega>| for the Riemannian gradients g = map(W, G).

    For every gradient map of reference_impl, g = G - W N with N = sym(W^T G), W^T G or G^T W, so
    in exact arithmetic on the float frames <g, W Omega> = c <skew(W^T G), Omega> - <(W^T W - I) N',
    Omega> with c in {0, 1, 2} and ||N'|| <= ||G||: summed over the two frames at most
    ||Omega|| (2 gauge_bound + (1 + phi) phi (||G_Q|| + ||G_K||)), phi the frames' feasibility
    ||W^T W - I||_F. Given the frames, phi is their measured feasibility per sample (the larger of
    the two) plus the rounding of evaluating it, gamma_d r (each Gram entry is a length-d inner
    product of columns of norm ~1, plus the subtraction of I); without them, the worst case any
    frame of the reference satisfies, manifold_tolerance(d, r), which is about 32 sqrt(r) times
    looser for Haar frames.
    Rounding: the map itself (one length-d and one length-r product, as P_W:
    ((gamma_d + gamma_r) sqrt r + 3u) ||G||), W Omega (gamma_r sqrt r ||Omega||), the two inner
    products of length d r (gamma_{dr}) and their sum (u). Factor 2 for the dropped O(u^2).
    """
    if W_Q is None or W_K is None:
        phi = manifold_tolerance(d, r)
    else:
        phi = np.maximum(feasibility(W_Q, validate=False), feasibility(W_K, validate=False)) + gamma(d) * r + u
    gradient_norm = np.linalg.norm(G_Q, axis=(-2, -1)) + np.linalg.norm(G_K, axis=(-2, -1))
    map_rounding = (gamma(d) + gamma(r)) * math.sqrt(r) + 3 * u
    per_norm = (
        (1 + phi) * phi
        + map_rounding * (1 + phi)
        + gamma(r) * math.sqrt(r)
        + gamma(d * r) * (1 + phi) * (1 + map_rounding)
        + u
    )
    bound = 2 * omega_norm * (2 * gauge_bound + gradient_norm * per_norm)
    return np.where(bound > 0, bound, u)  # an absolute bound > 0 only where the derived one is 0


def torch_bound(errors: attention.RoundingBounds, name: str) -> np.ndarray:
    """Bound on ||G_hand - G_torch||_F: both evaluate the same formulas in float64 (torch's softmax
    and its backward A * (dA - rowsum(dA * A)) included), so each is within the running error bound
    e_G of attention.rounding_bounds; twice that for the two, factor 2 for O(u^2)."""
    bound = 4 * np.linalg.norm(getattr(errors, name), axis=(-2, -1))
    return np.where(bound > 0, bound, u)  # an absolute bound > 0 only where the derived one is 0


# --------------------------------------------------------------------------------------------
# Symbolic tier
# --------------------------------------------------------------------------------------------


SYMBOLIC_METHOD = "sympy MatrixSymbol algebra with Omega^T = -Omega; explicit entries at n = d = r = 2"


def _matrix_symbol_steps() -> list[SymbolicStep]:
    """For every n, d, r (MatrixSymbol algebra): the logits do not move along the gauge, and the
    chain rule makes W_Q^T G_Q + W_K^T G_K symmetric."""
    n, d, r = sp.symbols("n d r", integer=True, positive=True)
    X = sp.MatrixSymbol("X", n, d)
    W_Q = sp.MatrixSymbol("W_Q", d, r)
    W_K = sp.MatrixSymbol("W_K", d, r)
    Gbar = sp.MatrixSymbol("Gbar", n, n)
    Omega = sp.MatrixSymbol("Omega", r, r)
    t = sp.Symbol("t")
    s = sp.Symbol("s", positive=True)  # 1 / sqrt(r)
    moved = sp.expand((W_Q + t * W_Q * Omega) * (W_K + t * W_K * Omega).T)
    first_order = sp.expand(sp.diff(moved, t).subs(t, 0)).subs(Omega.T, -Omega)
    G_Q = s * X.T * Gbar * X * W_K
    G_K = s * X.T * Gbar.T * X * W_Q
    M = W_Q.T * G_Q + W_K.T * G_K
    return [
        SymbolicStep(
            "the logits do not move to first order along (W_Q Omega, W_K Omega): d/dt (W_Q + t W_Q Omega)"
            "(W_K + t W_K Omega)^T at t = 0 is W_Q (Omega + Omega^T) W_K^T = 0 for skew Omega",
            r"\tfrac{d}{dt}\big|_0 (W_Q + tW_Q\Omega)(W_K + tW_K\Omega)^\top = W_Q(\Omega + \Omega^\top)W_K^\top = 0",
            is_zero(first_order),
        ),
        SymbolicStep(
            "chain rule G_Q = X^T Gbar X W_K / sqrt r, G_K = X^T Gbar^T X W_Q / sqrt r: "
            "W_Q^T G_Q + W_K^T G_K is symmetric for every Gbar, so its skew part vanishes",
            r"W_Q^\top G_Q + W_K^\top G_K = \tfrac{1}{\sqrt r}\big(Q^\top \bar G K + K^\top \bar G^\top Q\big)"
            r" = \big(W_Q^\top G_Q + W_K^\top G_K\big)^\top",
            is_zero(sp.expand(M - M.T)),
        ),
    ]


def _explicit_loss_step() -> SymbolicStep:
    """n = d = r = 2 with explicit entries and an arbitrary loss of the logits (partials g_ij free)."""
    size = 2
    Xe = sp.Matrix(size, size, lambda i, j: sp.Symbol(f"x_{i}{j}"))
    Qe = sp.Matrix(size, size, lambda i, j: sp.Symbol(f"q_{i}{j}"))
    Ke = sp.Matrix(size, size, lambda i, j: sp.Symbol(f"k_{i}{j}"))
    partials = sp.Matrix(size, size, lambda i, j: sp.Symbol(f"g_{i}{j}"))
    logits = Xe * Qe * Ke.T * Xe.T / sp.sqrt(size)

    def gradient(W):
        return sp.Matrix(
            size, size, lambda a, b: sum(partials[k] * sp.diff(logits[k], W[a, b]) for k in range(size * size))
        )

    Me = Qe.T * gradient(Qe) + Ke.T * gradient(Ke)
    return SymbolicStep(
        "explicit entries, n = d = r = 2, loss an arbitrary function of the logits (dloss/dL_ij = g_ij): "
        "skew(W_Q^T G_Q + W_K^T G_K) = 0 entry by entry",
        r"\mathrm{skew}\Big(\textstyle\sum_{ij} g_{ij}\big(W_Q^\top \partial_{W_Q} L_{ij}"
        r" + W_K^\top \partial_{W_K} L_{ij}\big)\Big) = 0",
        is_zero((Me - Me.T) / 2),
    )


def _pairing_step() -> SymbolicStep:
    """<S, Omega> = 0 for symmetric S and skew Omega, explicit r = 2, 3."""
    pairing_zero = True
    for k in (2, 3):
        S = sp.Matrix(k, k, lambda i, j: sp.Symbol(f"s_{min(i, j)}{max(i, j)}"))
        upper = sp.Matrix(k, k, lambda i, j: sp.Symbol(f"w_{i}{j}") if i < j else 0)
        pairing_zero &= is_zero((S.T * (upper - upper.T)).trace())
    return SymbolicStep(
        "hence the gauge derivative <W_Q^T G_Q + W_K^T G_K, Omega> vanishes: <S, Omega> = 0 for symmetric S, "
        "skew Omega (explicit r = 2, 3)",
        r"\langle S, \Omega\rangle = \operatorname{tr}(S^\top\Omega) = 0,\ S = S^\top,\ \Omega = -\Omega^\top",
        pairing_zero,
    )


def _riemannian_gauge_step() -> SymbolicStep:
    """<P_W(G), W Omega> = <G, W Omega> at an explicit rotation frame of O(2)."""
    phi, w = sp.symbols("phi w", real=True)
    rotation = sp.Matrix([[sp.cos(phi), -sp.sin(phi)], [sp.sin(phi), sp.cos(phi)]])
    Ge = sp.Matrix(2, 2, lambda i, j: sp.Symbol(f"G_{i}{j}"))
    Om = sp.Matrix([[0, w], [-w, 0]])
    gram = rotation.T * Ge
    projected = Ge - rotation * (gram + gram.T) / 2
    gauge = rotation * Om
    difference = sp.trigsimp(sp.expand((projected.T * gauge).trace() - (Ge.T * gauge).trace()))
    return SymbolicStep(
        "the gauge direction W Omega is tangent and P_W is self-adjoint: <P_W(G), W Omega> = <G, W Omega> "
        "(explicit rotation frame in O(2)), so the Riemannian gradient has the same (zero) gauge component",
        r"\langle P_W(G), W\Omega\rangle = \langle G, W\Omega\rangle",
        sp.simplify(difference) == 0,
    )


def symbolic_derivation() -> list[SymbolicStep]:
    """The derivation's steps (seed-independent: run_claim derives them once per process)."""
    return _matrix_symbol_steps() + [_explicit_loss_step(), _pairing_step(), _riemannian_gauge_step()]


EXACT_CASES = ((2, 2, 2), (3, 3, 2), (4, 4, 3))  # (n, d, r)


def exact_checks(seed: int) -> list[dict]:
    """The chain-rule identity with zero tolerance at rational frames and rational X, Gbar.

    Gbar stands for any dloss/dL (the identity holds for every n x n matrix), Omega is a rational
    skew matrix; 1/sqrt(r) is kept exact (sympy surd).
    """
    from reference_impl import exact

    symmetric, tangent_pairing, control_nonzero = True, True, True
    samples = 0
    for n, d, r in EXACT_CASES:
        rng = rng_for(seed, CLAIM_ID, "exact", n, d, r)
        W_Q, W_K = exact.rational_point(d, r, rng), exact.rational_point(d, r, rng)
        X = exact.rational_matrix(n, d, rng)
        Gbar = exact.rational_matrix(n, n, rng)
        omega = exact.rational_skew(r, rng)
        scale = 1 / sp.sqrt(r)
        G_Q = scale * X.T * Gbar * X * W_K
        G_K = scale * X.T * Gbar.T * X * W_Q
        symmetric &= exact.is_zero(exact.skew(W_Q.T * G_Q + W_K.T * G_K))
        riemannian_pairing = (exact.project_tangent(W_Q, G_Q).T * (W_Q * omega)).trace() + (
            exact.project_tangent(W_K, G_K).T * (W_K * omega)
        ).trace()
        tangent_pairing &= sp.simplify(riemannian_pairing) == 0
        anchor = exact.rational_matrix(d, r, rng)
        if exact.is_zero(exact.skew(W_Q.T * anchor)):
            # a draw of small rationals can make W_Q^T A symmetric (seen at (2, 2, 2)): the anchor is
            # then moved by W_Q E, E the unit skew matrix of the first two axes, so W_Q^T A gains E
            unit = sp.zeros(r, r)
            unit[0, 1], unit[1, 0] = 1, -1
            anchor = anchor + W_Q * unit
        # the control: the anchored loss adds W_Q - A to G_Q, whose gauge part -skew(W_Q^T A) is not 0
        control_nonzero &= not exact.is_zero(exact.skew(W_Q.T * (G_Q + W_Q - anchor) + W_K.T * G_K))
        samples += 1
    return [
        {"name": "gauge_residual", "description": "skew(W_Q^T G_Q + W_K^T G_K) = 0 exactly, rational W, X, Gbar",
         "samples": samples, "passed": bool(symmetric)},
        {"name": "gauge_inner_product",
         "description": "<P_{W_Q} G_Q, W_Q Omega> + <P_{W_K} G_K, W_K Omega> = 0 exactly, rational skew Omega",
         "samples": samples, "passed": bool(tangent_pairing)},
        {"name": "anchored_query_loss_nonzero",
         "description": "control: the anchored loss has a non-zero exact gauge component (r >= 2)",
         "samples": samples, "passed": bool(control_nonzero)},
    ]


# --------------------------------------------------------------------------------------------
# Numerical tier
# --------------------------------------------------------------------------------------------


def random_layers(rng: np.random.Generator, count: int, n: int, d: int, r: int, scales: dict | None = None):
    """count random attention layers: X (count, n, d), W_Q, W_K (count, d, r) Haar frames,
    W_V (count, d, VALUE_DIM), Y (count, n, VALUE_DIM), float64, with per-layer scales (their log10
    put in `scales` where given, for the checks' reach)."""
    token_log10 = rng.uniform(*TOKEN_LOG10_SCALE, size=(count, 1, 1))
    value_log10 = rng.uniform(*VALUE_LOG10_SCALE, size=(count, 1, 1))
    token_scale, value_scale = 10.0 ** token_log10, 10.0 ** value_log10
    if scales is not None:
        scales.update(log10_token_scale=token_log10.ravel(), log10_value_scale=value_log10.ravel())
    X = token_scale * rng.standard_normal((count, n, d))
    W_Q = random_point(d, r, rng, batch=(count,))
    W_K = random_point(d, r, rng, batch=(count,))
    W_V = value_scale * rng.standard_normal((count, d, VALUE_DIM)) / math.sqrt(d)
    Y = value_scale * rng.standard_normal((count, n, VALUE_DIM))
    return X, W_Q, W_K, W_V, Y


def random_skew(rng: np.random.Generator, count: int, r: int) -> tuple[np.ndarray, np.ndarray]:
    """Unit-Frobenius skew matrices (count, r, r) and their norms (0 for r = 1: no gauge group)."""
    Z = rng.standard_normal((count, r, r))
    omega = 0.5 * (Z - np.swapaxes(Z, -1, -2))
    norm = np.linalg.norm(omega, axis=(-2, -1))
    omega = omega / np.where(norm > 0, norm, 1.0)[..., None, None]
    return omega, np.where(norm > 0, 1.0, 0.0)


def _unit(rng: np.random.Generator, shape) -> np.ndarray:
    E = rng.standard_normal(shape)
    return E / np.linalg.norm(E, axis=(-2, -1), keepdims=True)


def _gauge_checks(prefix: str) -> dict[str, NumericalCheck]:
    return {
        "gauge_residual": NumericalCheck(
            prefix + "gauge_residual",
            "||skew(W_Q^T G_Q + W_K^T G_K)||_F for the hand-written gradients of the attention loss",
            "gauge_residual_bound: (2 gamma_n + 2 gamma_d + 4u)(||P_Q|| + ||P_K||) times 2, P_Q = "
            "|W_Q|^T |X|^T |Gbar| |K| / sqrt r (only the products after Gbar and fl(X W) enter)",
            tightness_note=tightness.WORST_CASE_SUMS,
        ),
        "gauge_inner_product": NumericalCheck(
            prefix + "gauge_inner_product",
            "|<g_Q, W_Q Omega> + <g_K, W_K Omega>| for the Riemannian gradients and a random unit skew Omega",
            "gauge_inner_product_bound: 2 gauge_residual_bound + phi ||G|| from the measured feasibility of the "
            "frames (plus its evaluation rounding) + rounding of the gradient map, of W Omega and of two length-d r inner products",
            tightness_note=tightness.RANDOM_DIRECTION,
        ),
    }


def _gauge_sample(checks, optimizer, X, W_Q, W_K, G_Q, G_K, fwd, grads, omega, omega_norm, *, shape, key, seed):
    d, r = W_Q.shape[-2], W_Q.shape[-1]
    W_Q_t, W_K_t = np.swapaxes(W_Q, -1, -2), np.swapaxes(W_K, -1, -2)
    S = W_Q_t @ G_Q + W_K_t @ G_K
    residual = np.linalg.norm(0.5 * (S - np.swapaxes(S, -1, -2)), axis=(-2, -1))
    bound = gauge_residual_bound(X, W_Q, W_K, fwd, grads)
    checks["gauge_residual"].add(residual, bound, shape=(d, r), key=key, seed=seed)
    g_Q = riemannian_gradient(W_Q, G_Q, 0.0, variant=optimizer)
    g_K = riemannian_gradient(W_K, G_K, 0.0, variant=optimizer)
    inner = np.sum(g_Q * (W_Q @ omega), axis=(-2, -1)) + np.sum(g_K * (W_K @ omega), axis=(-2, -1))
    checks["gauge_inner_product"].add(
        np.abs(inner), gauge_inner_product_bound(d, r, bound, G_Q, G_K, omega_norm, W_Q, W_K), shape=(d, r), key=key, seed=seed
    )


def _plan(profile: Profile, frames: int | None = None, large=None):
    """(d, r, n, chunk_index, count) over shape_plan; chunks also bounded by the n x n logits."""
    kwargs = {} if large is None else {"large": large}
    largest_n = max(TOKEN_COUNTS)
    for batch in shape_plan(profile, frames=frames, **kwargs):
        chunks = chunk_sizes(batch.count, max(batch.d, largest_n), max(batch.r, largest_n))
        for chunk_index, count in enumerate(chunks):
            # every shape meets every token count: split each chunk between them
            parts = np.array_split(np.arange(count), len(TOKEN_COUNTS))
            for part_index, (n, part) in enumerate(zip(TOKEN_COUNTS, parts)):
                if part.size:
                    yield batch.d, batch.r, n, chunk_index * len(TOKEN_COUNTS) + part_index, part.size


def layer_chunk(chunk, seed: int, optimizer: str, use_torch: bool) -> Evidence:
    """The gauge checks, finite differences and (use_torch) torch autograd over the random attention
    layers of one chunk (d, r, n, chunk index, count) of _plan: the checks [gauge_residual,
    gauge_inner_product, finite_difference, torch_autograd_gradient]; extra["torch_available"]
    (None: not tried)."""
    d, r, n, chunk_index, count = chunk
    checks = _gauge_checks("")
    finite_difference = NumericalCheck(
        "finite_difference_gradient",
        f"|central difference (h = 2^{int(math.log2(attention.FD_STEP))}) - <G, E>| along unit directions E "
        "in W_Q, W_K, W_V, for the hand-written gradients",
        "attention.finite_difference_check: h^2 M3 / 6 (a priori third-derivative bound of the softmax "
        "loss) + 2 eps_f / h + 2 u ||W|| ||G|| / h + the gradient's running error bound; h = 2^round(log2 "
        "u^(1/3)) balances truncation O(h^2) and rounding O(u / h)",
    )
    torch_check = NumericalCheck(
        "torch_autograd_gradient",
        "||G_hand - G_torch||_F per parameter, torch autograd in float64",
        "torch_bound: both within the running error bound e_G of attention.rounding_bounds; 4 ||e_G||_F",
    )
    key = (CLAIM_ID, "layers", d, r, n, chunk_index)
    rng = rng_for(seed, *key)
    scales: dict = {}
    X, W_Q, W_K, W_V, Y = random_layers(rng, count, n, d, r, scales)
    _, grads, fwd = attention.loss_and_gradients(X, W_Q, W_K, W_V, Y)
    omega, omega_norm = random_skew(rng, count, r)
    _gauge_sample(checks, optimizer, X, W_Q, W_K, grads.W_Q, grads.W_K, fwd, grads, omega, omega_norm,
                  shape=(d, r), key=key, seed=seed)
    for name, values in scales.items():
        checks["gauge_residual"].reach(name, values)
        finite_difference.reach(name, values)
    directions = {"W_Q": _unit(rng, W_Q.shape), "W_K": _unit(rng, W_K.shape), "W_V": _unit(rng, W_V.shape)}
    for name, (residual, bound) in attention.finite_difference_check(X, W_Q, W_K, W_V, Y, directions).items():
        finite_difference.add(
            residual, bound, shape=(d, r), key=key, seed=seed, extra={"parameter": name, "n": n}
        )
    torch_available = None
    if use_torch:
        torch_grads = attention.torch_gradients(X, W_Q, W_K, W_V, Y)
        torch_available = torch_grads is not None
        if torch_available:
            errors = attention.rounding_bounds(X, W_Q, W_K, W_V, fwd, grads)
            for name in ("W_Q", "W_K", "W_V"):
                difference = np.linalg.norm(getattr(grads, name) - getattr(torch_grads, name), axis=(-2, -1))
                torch_check.add(difference, torch_bound(errors, name), shape=(d, r), key=key, seed=seed,
                                extra={"parameter": name, "n": n})
    return Evidence(checks=[checks["gauge_residual"], checks["gauge_inner_product"], finite_difference, torch_check],
                    frames=count, extra={"torch_available": torch_available})


def layer_checks(seed: int, profile: Profile, optimizer: str, use_torch: bool) -> Evidence:
    """The gauge checks, finite differences and (use_torch) torch autograd over random attention
    layers: one task per chunk of _plan(profile) (layer_chunk), merged in chunk order."""
    return map_evidence(layer_chunk, list(_plan(profile)), seed, optimizer, use_torch, task_label="layer_checks")


def layers_part(ctx: Context) -> Evidence:
    """The gauge checks, finite differences and, in the thorough profile, torch autograd over random
    attention layers (the chunks of layer_checks, merged in chunk order)."""
    use_torch = ctx.profile.name == "thorough"
    evidence = layer_checks(ctx.seed, ctx.profile, ctx.optimizer, use_torch)
    gauge_residual, gauge_inner_product, finite_difference, torch_check = evidence.checks
    torch_available = evidence.extra["torch_available"]
    checks = [gauge_residual, gauge_inner_product, finite_difference]
    if use_torch and torch_available:
        checks.append(torch_check)
        note = "torch autograd cross-checks the hand-written gradients (thorough profile)."
    elif use_torch:
        note = "torch is not importable: the autograd cross-check was skipped (finite differences remain)."
    else:
        note = (
            "the torch autograd cross-check runs in the thorough profile only (importing torch alone "
            "exceeds the time budget of the quick and default profiles); finite differences check the "
            "gradients in every profile."
        )
    return Evidence(
        checks=checks,
        frames=evidence.frames,
        notes=[note],
        extra={
            "gradient_map": f"riemannian_gradient(W, G, 0, variant={getattr(ctx.optimizer, 'name', ctx.optimizer)!r})",
            "token_counts": list(TOKEN_COUNTS),
            "value_dim": VALUE_DIM,
            "token_log10_scale": list(TOKEN_LOG10_SCALE),
            "value_log10_scale": list(VALUE_LOG10_SCALE),
            "finite_difference_step": attention.FD_STEP,
            "torch_cross_check": bool(use_torch and torch_available),
        },
    )


def anchored_query_loss(ctx: Context) -> Evidence:
    """The control: the attention loss + 1/2 ||W_Q - A||^2 (not gauge invariant) through the same
    gauge checks, with the real gradient map (P6's control is the loss, not the optimizer)."""
    checks = _gauge_checks("anchored_query_loss:")
    for d, r, n, chunk_index, count in _plan(ctx.profile, frames=ctx.profile.control_frames, large=()):
        key = (CLAIM_ID, "control", d, r, n, chunk_index)
        rng = rng_for(ctx.seed, *key)
        X, W_Q, W_K, W_V, Y = random_layers(rng, count, n, d, r)
        _, grads, fwd = attention.loss_and_gradients(X, W_Q, W_K, W_V, Y)
        omega, omega_norm = random_skew(rng, count, r)
        anchor = rng.standard_normal(W_Q.shape)
        # the loss + 1/2 ||W_Q - A||^2: its gradient in W_Q gains W_Q - A
        G_Q = grads.W_Q + (W_Q - anchor)
        _gauge_sample(checks, "stiefel_adam", X, W_Q, W_K, G_Q, grads.W_K, fwd, grads, omega, omega_norm,
                      shape=(d, r), key=key, seed=ctx.seed)
    return Evidence(
        checks=list(checks.values()),
        extra={"gauge_residual_max": checks["gauge_residual"].to_dict()["residual"]["max"]},
        figures={
            "control_gauge_residual": HistogramFigure.of(
                checks["gauge_residual"].to_dict()["ratio_histogram"],
                "gauge residual over its bound for the non-invariant loss (control)", "log10(residual / bound)",
            ),
        },
    )


CLAIM = Claim(
    id=CLAIM_ID,
    title="Negative result: gauge directions carry no gradient",
    statement=(
        "For any loss that depends on (W_Q, W_K) only through W_Q W_K^T (attention logits "
        "X W_Q W_K^T X^T / sqrt(r)) and every skew Omega, the derivative along the gauge direction "
        "(W_Q Omega, W_K Omega) is zero: skew(W_Q^T G_Q + W_K^T G_K) = 0. The Riemannian gradient is "
        "already gauge-orthogonal, so removing the gauge changes nothing."
    ),
    latex=(
        r"\mathrm{skew}\big(W_Q^\top G_Q + W_K^\top G_K\big) = 0,\quad "
        r"\langle \operatorname{grad}_{W_Q} f, W_Q\Omega\rangle"
        r" + \langle \operatorname{grad}_{W_K} f, W_K\Omega\rangle = 0"
        r"\ \ \forall\,\Omega = -\Omega^\top"
    ),
    symbolic=Symbolic(SYMBOLIC_METHOD, symbolic_derivation),
    exact=exact_checks,
    parts=(Part("layers", layers_part),),
    controls=(
        Control(
            "anchored_query_loss",
            anchored_query_loss,
            "attention loss + 1/2 ||W_Q - A||^2 for a fixed Gaussian A: not gauge invariant, gauge "
            "component -skew(W_Q^T A)",
        ),
    ),
    notes=(
        "r = 1 frames have no gauge group (every 1 x 1 skew matrix is 0): their residuals are 0 exactly.",
        "optimizer selects the gradient map riemannian_gradient(W, G, 0, variant) of the gauge-orthogonality "
        "check only; P6 is about gradients, not steps.",
    ),
    precisions=(("under test", "the attention layer's hand-written gradients, finite differences and torch autograd", ("float64",)),),
)
