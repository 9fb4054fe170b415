"""The sympy helpers decide "reduced to the identity": they must say no when it does not."""

import sympy as sp

from propositions._symbolic import is_zero_matrix, reduce_with


def test_reduction_needs_the_substitution():
    d, r = sp.symbols("d r", integer=True, positive=True)
    W, G = sp.MatrixSymbol("W", d, r), sp.MatrixSymbol("G", d, r)
    I_r = sp.Identity(r)
    P = lambda X: X - W * (W.T * X + X.T * W) / 2  # noqa: E731  (P_W as the formula)
    idempotence = P(P(G)) - P(G)
    assert not is_zero_matrix(reduce_with(idempotence, {}))  # false without W^T W = I
    assert is_zero_matrix(reduce_with(idempotence, {W.T * W: I_r}))
    assert not is_zero_matrix(reduce_with(P(G), {W.T * W: I_r}))  # P_W(G) itself is not zero


def test_scalar_zero_and_nonzero():
    x = sp.Symbol("x", positive=True)
    assert is_zero_matrix(sp.sqrt(x) ** 2 - x)
    assert not is_zero_matrix(sp.sqrt(x) - x)
