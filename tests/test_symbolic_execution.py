"""Symbolic execution of the reference's code: it proves the identities of the real code, and a
changed sign, a dropped sym or an elementwise preconditioner makes the claims' symbolic part fail."""

import functools

import numpy as np
import pytest
import sympy as sp

from propositions import p1_steepest_descent as p1
from propositions import p2_scale_independence as p2
from propositions import p3_conditioning as p3
from propositions import p5_weight_decay as p5
from propositions.kit import protocol
from propositions.kit import symbolic as ks
from propositions.kit.protocol import derive_symbolic
from reference_impl import adam, manifold


@pytest.fixture(autouse=True)
def fresh_derivations():
    """run_claim caches each claim's derivation; a mutated code must be derived afresh, and not leak."""
    protocol._derived.cache_clear()
    yield
    protocol._derived.cache_clear()


def _without_sym(W, G, *, validate=True):
    return G - W @ (np.swapaxes(W, -1, -2) @ G)


def _sign_flipped(W, G, *, validate=True):
    return G + W @ manifold.sym(np.swapaxes(W, -1, -2) @ G)


# --------------------------------------------------------------------------------------------
# The algebra
# --------------------------------------------------------------------------------------------


def test_float_constants_enter_exactly():
    assert ks.exact_rational(0.1) == sp.Rational(3602879701896397, 2**55)
    assert ks.exact_rational(0.5) == sp.Rational(1, 2)
    with pytest.raises(ValueError, match="non-finite"):
        ks.exact_rational(float("inf"))


def test_square_roots_follow_the_positive_branch():
    algebra = ks.Algebra(2, 1, scalars=["c", "v", "x"], positive=["c", "v"], orthonormal=False)
    c, v, x = (algebra.scalar(name) for name in ("c", "v", "x"))
    root = np.sqrt(v + 1)
    assert algebra.equal(np.sqrt((v + 1) * c * c), root * c, on_manifold=False)  # c > 0
    assert algebra.equal(np.sqrt(v * v * 4), v * 2, on_manifold=False)
    # x has no sign: sqrt(x^2) is not x, so it becomes a fresh root, not x
    assert not algebra.equal(np.sqrt(x * x), x, on_manifold=False)


def test_reduction_is_needed_and_can_say_no():
    algebra = ks.Algebra(3, 2, matrices=[("G", 3, 2)])
    W, G = algebra.matrix("W"), algebra.matrix("G")
    P = lambda X: manifold.project_tangent(W, X, validate=False)  # noqa: E731
    assert algebra.equal(P(P(G)), P(G))
    assert not algebra.equal(P(P(G)), P(G), on_manifold=False)  # idempotence needs W^T W = I
    assert not algebra.vanishes(P(G))
    assert not algebra.vanishes(ks.tangency(W, G))  # a generic G is not tangent


def test_undecided_comparisons_follow_the_branch_and_are_recorded():
    for rule, clipped in ((ks.branch_unclipped, False), (ks.branch_clipped, True)):
        algebra = ks.Algebra(3, 2, matrices=[("X", 3, 2)], branch=rule, orthonormal=False)
        X = algebra.matrix("X")
        clipped_X = adam.clip_to_trust_region(X, 0.5)
        assert algebra.equal(clipped_X, X, on_manifold=False) is not clipped
        assert any("taken as" in note for note in algebra.assumptions)


def test_the_real_code_is_proved():
    for steps in (ks.projector_steps(), ks.weight_decay_steps(), ks.scale_steps(), ks.tangency_steps()):
        assert steps and all(step.reduced for step in steps), [s.description for s in steps if not s.reduced]


# --------------------------------------------------------------------------------------------
# Break the code, watch the claims' symbolic part fail
# --------------------------------------------------------------------------------------------


def _failed(result):
    return result.status == "failed"


@pytest.mark.parametrize("broken", [_without_sym, _sign_flipped])
def test_p1_fails_for_a_broken_projection(monkeypatch, broken):
    monkeypatch.setattr(manifold, "project_tangent", broken)
    result = derive_symbolic(p1.CLAIM.symbolic)
    assert _failed(result)
    failing = [s.description for s in result.steps if not s.reduced]
    assert any("G - W (W^T G + G^T W)/2" in text for text in failing)


def test_p1_fails_when_sym_is_dropped(monkeypatch):
    monkeypatch.setattr(manifold, "sym", lambda A: A)
    result = derive_symbolic(p1.CLAIM.symbolic)
    assert _failed(result)
    assert any("nothing else" in s.description for s in result.steps if not s.reduced)


def test_p5_fails_for_a_sign_flip(monkeypatch):
    monkeypatch.setattr(manifold, "project_tangent", _sign_flipped)
    assert _failed(derive_symbolic(p5.CLAIM.symbolic))


def test_p5_fails_when_the_projection_is_skipped(monkeypatch):
    monkeypatch.setattr(manifold, "project_tangent", lambda W, G, *, validate=True: G)
    assert _failed(derive_symbolic(p5.CLAIM.symbolic))


def test_p2_fails_for_a_fixed_step_direction(monkeypatch):
    # Riemannian SGD's direction -lr m^ is degree one in the gradient scale
    monkeypatch.setattr(adam, "scale_free_direction", lambda m_hat, v_hat, lr, eps: -lr * m_hat)
    result = derive_symbolic(p2.CLAIM.symbolic)
    assert _failed(result)
    assert any("stages 3-7" in s.description for s in result.steps if not s.reduced)


def test_p2_fails_without_the_zero_guard(monkeypatch):
    def unguarded(m_hat, v_hat, lr, eps):  # scale_free_direction without its v^ = 0 branch
        v_hat = np.asarray(v_hat)
        if v_hat.ndim < m_hat.ndim:
            v_hat = v_hat[..., None, None]
        return -lr * m_hat / (np.sqrt(v_hat) + eps)

    monkeypatch.setattr(adam, "scale_free_direction", unguarded)
    result = derive_symbolic(p2.CLAIM.symbolic)
    assert _failed(result)
    failing = [s.description for s in result.steps if not s.reduced]
    assert len(failing) == 1 and "never 0/0" in failing[0]


def test_p2_fails_for_a_squared_scale(monkeypatch):
    monkeypatch.setattr(manifold, "project_tangent", lambda W, G, *, validate=True: _sign_flipped(W, G) * 1.0)
    assert _failed(derive_symbolic(p2.CLAIM.symbolic))


def test_p3_fails_for_an_elementwise_second_moment(monkeypatch):
    monkeypatch.setattr(adam, "moments_and_direction", functools.partial(adam.moments_and_direction, elementwise=True))
    # one root per entry makes the unreduced fractions of ||xi|| grow with the product of d r
    # denominators; at St(2, 1) the defect is the same ((k_0 - k_1) w_0 m_0 != 0) and cheap
    monkeypatch.setattr(ks, "STAGE_SHAPE", (2, 1))
    result = derive_symbolic(p3.CLAIM.symbolic)
    assert _failed(result)
    failing = [s.description for s in result.steps if not s.reduced]
    assert any("one scalar" in text for text in failing) and any("lies in T_W" in text for text in failing)


def test_p3_fails_for_a_sign_flipped_projection(monkeypatch):
    monkeypatch.setattr(manifold, "project_tangent", _sign_flipped)
    assert _failed(derive_symbolic(p3.CLAIM.symbolic))
