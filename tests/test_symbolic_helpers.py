"""The sympy helpers decide "reduced to the identity": they must say no when it does not.

propositions.kit.symbolic.is_zero is the one zero test of every claim's derivation (P1..P6)."""

import sympy as sp

from propositions import p1_steepest_descent, p2_scale_independence, p3_conditioning, p4_equivariance, p5_weight_decay, p6_gauge
from propositions.kit.symbolic import reduce_with
from propositions.kit.symbolic import is_zero


def test_reduction_needs_the_substitution():
    d, r = sp.symbols("d r", integer=True, positive=True)
    W, G = sp.MatrixSymbol("W", d, r), sp.MatrixSymbol("G", d, r)
    I_r = sp.Identity(r)
    P = lambda X: X - W * (W.T * X + X.T * W) / 2  # noqa: E731  (P_W as the formula)
    idempotence = P(P(G)) - P(G)
    assert not is_zero(reduce_with(idempotence, {}))  # false without W^T W = I
    assert is_zero(reduce_with(idempotence, {W.T * W: I_r}))
    assert not is_zero(reduce_with(P(G), {W.T * W: I_r}))  # P_W(G) itself is not zero


def test_scalar_zero_and_nonzero():
    x = sp.Symbol("x", positive=True)
    assert is_zero(sp.sqrt(x) ** 2 - x)
    assert not is_zero(sp.sqrt(x) - x)
    # zero only after simplify (expand leaves it), and a near miss that is not zero
    assert is_zero(sp.sin(x) ** 2 + sp.cos(x) ** 2 - 1)
    assert not is_zero(sp.sin(x) ** 2 + sp.cos(x) ** 2 - 1 + x**3 / 10**9)


def test_explicit_and_unevaluated_matrices():
    a, b = sp.symbols("a b")
    M = sp.Matrix([[a, b], [b, a]])
    assert is_zero(M - M.T)
    assert not is_zero(sp.Matrix([[a, b], [-b, a]]) - sp.Matrix([[a, b], [-b, a]]).T)  # skew part 2b != 0
    assert is_zero(sp.Trace(M * M.T) - sp.Trace(M.T * M))  # unevaluated: doit first
    assert not is_zero(sp.Trace(M) - 2 * b)
    assert not is_zero(sp.Matrix([[0, 0], [0, 1e-30]]))  # one nonzero entry is enough


def test_every_claim_uses_the_one_helper():
    for module in (p1_steepest_descent, p2_scale_independence, p3_conditioning, p4_equivariance, p5_weight_decay, p6_gauge):
        assert module.is_zero is is_zero
        for name in ("is_zero_matrix", "_is_zero_matrix", "_zero", "reduces_to_zero"):
            assert not hasattr(module, name), (module.__name__, name)
