"""The shared error bounds of propositions/kit/bounds.py: positive, scaling as derived, covering the
measured error, and catching a result off by a few times the bound."""

import math

import mpmath
import numpy as np
import pytest

import reference_impl as ri
from propositions import attention
from propositions.kit import bounds
from reference_impl.highprec import polar_retract_mp

u = bounds.u

# The smallest shapes carry the largest error relative to sqrt(r) d r u (d = r: the singular values of
# W + xi come in equal pairs); the polar factor is compared with mpmath there and at a medium shape.
SHAPES = ((1, 1), (2, 1), (2, 2), (3, 3), (5, 2), (8, 8))


def _tangent_step(W, rng, length):
    xi = ri.random_tangent(W, rng)
    norm = np.linalg.norm(xi, axis=(-2, -1))
    return xi * np.where(norm > 0, length / np.where(norm > 0, norm, 1.0), 0.0)[..., None, None]


def _mp_distance(W, xi, P):
    exact = polar_retract_mp(W, xi, dps=40)
    d, r = P.shape
    return float(mpmath.sqrt(sum((exact[i, j] - float(P[i, j])) ** 2 for i in range(d) for j in range(r))))


def test_polar_error_bound_is_positive_linear_in_cond_and_grows_with_the_shape():
    assert bounds.polar_error_bound(1, 1, 1.0) > 0
    b1, b2, b3 = (float(bounds.polar_error_bound(8, 3, c)) for c in (1.0, 2.0, 3.0))
    assert b3 - b2 == pytest.approx(b2 - b1) and b2 - b1 == pytest.approx(bounds.svd_backward_error(8, 3) * math.sqrt(3))
    assert bounds.polar_error_bound(16, 3, 1.0) > bounds.polar_error_bound(8, 3, 1.0)
    assert bounds.polar_error_bound(8, 6, 1.0) > bounds.polar_error_bound(8, 3, 1.0)
    # of order sqrt(r) r (d + r) u (the derivation's shape dependence), not more
    for d, r in ((64, 16), (1024, 128)):
        ratio = float(bounds.polar_error_bound(d, r, 1.0)) / (math.sqrt(r) * r * (d + r) * u)
        assert 1 < ratio < 300


def test_polar_error_bound_covers_highprec_and_catches_a_factor_off_by_three_bounds():
    rng = np.random.default_rng(20240611)
    for d, r in SHAPES:
        W = ri.random_point(d, r, rng, (12,))
        xi = _tangent_step(W, rng, 0.5)
        P = ri.polar_retract(W, xi, validate=False)
        cond = np.linalg.cond(W + xi)
        for k in range(W.shape[0]):
            bound = float(bounds.polar_error_bound(d, r, cond[k]))
            assert _mp_distance(W[k], xi[k], P[k]) <= bound
            direction = rng.standard_normal((d, r))
            wrong = P[k] + 3 * bound * direction / np.linalg.norm(direction)
            assert _mp_distance(W[k], xi[k], wrong) > bound


def test_svd_backward_and_orthonormality_errors_cover_lapack():
    """The two parts of the polar bound, measured directly: ||U S V^T - A|| (in long double) and
    the loss of orthonormality of U and V, each within its count."""
    rng = np.random.default_rng(7)
    for d, r in ((2, 2), (8, 3), (40, 40), (128, 16)):
        A = ri.random_point(d, r, rng, (6,)) + 0.5 * rng.standard_normal((6, d, r)) / math.sqrt(d * r)
        U, S, Vh = np.linalg.svd(A, full_matrices=False)
        Ul, Sl, Vl = (x.astype(np.longdouble) for x in (U, S, Vh))
        backward = np.linalg.norm((((Ul * Sl[..., None, :]) @ Vl) - A.astype(np.longdouble)).astype(np.float64), axis=(-2, -1))
        assert np.all(backward <= bounds.svd_backward_error(d, r) * np.linalg.norm(A, axis=(-2, -1)))
        for Q in (Ul, np.swapaxes(Vl, -1, -2)):
            defect = np.linalg.norm((np.swapaxes(Q, -1, -2) @ Q - np.eye(r)).astype(np.float64), axis=(-2, -1))
            # ||Q^T Q - I|| <= 2 ||Q - Q~|| + ||Q - Q~||^2 for the orthonormal Q~ nearest
            assert np.all(defect <= 2 * bounds.svd_orthonormality_error(d, r))


def test_feasibility_bound_covers_the_retraction_and_catches_drift():
    rng = np.random.default_rng(3)
    for d, r in SHAPES + ((64, 16),):
        W = ri.random_point(d, r, rng, (50,))
        W_new = ri.polar_retract(W, _tangent_step(W, rng, 0.5), validate=False)
        bound = bounds.feasibility_bound(d, r)
        assert bound > 0 and np.all(ri.feasibility(W_new) <= bound)
        # a frame scaled by 1 + 3 bound / (2 sqrt r) has ||W^T W - I|| ~ 3 bound
        drifted = W_new * (1 + 3 * bound / (2 * math.sqrt(r)))
        assert np.all(ri.feasibility(drifted) > bound)


def test_gram_defect_bound_is_exact_to_first_order_for_a_known_distance():
    W = np.eye(4, 2) * (1 + 1e-6)  # distance 1e-6 sqrt(2) to the orthonormal eye(4, 2)
    distance = 1e-6 * math.sqrt(2)
    defect = float(np.linalg.norm(W.T @ W - np.eye(2)))
    bound = float(bounds.gram_defect_bound(distance, 4, 2))
    assert defect <= bound <= 1.01 * defect + 1e-15


def test_householder_count_is_the_documented_polynomial():
    assert bounds.householder_error(10) == (6 * 10 + 13) * u
    assert bounds.svd_backward_error(8, 3) == pytest.approx((3 * (6 * 8 + 6 * 3 + 26) + 84 * 9) * u)


def test_numpy_exp_is_within_the_softmax_analysis_ulps():
    """attention.SOFTMAX_ROUNDING counts numpy's float64 exp as accurate to EXP_ULPS ulps on the
    softmax's arguments (l - max <= 0); measured here against mpmath on a grid and random points."""
    rng = np.random.default_rng(11)
    x = np.concatenate([-np.logspace(-12, 2.8, 3000), -rng.uniform(0, 700, 3000), [0.0]])
    y = np.exp(x)
    with mpmath.workprec(120):
        exact = np.array([float(mpmath.exp(mpmath.mpf(float(v)))) for v in x])
        error = np.abs([float(mpmath.exp(mpmath.mpf(float(v))) - mpmath.mpf(float(w))) for v, w in zip(x, y)])
    ulps = error / np.spacing(exact)
    assert ulps.max() <= attention.EXP_ULPS
    assert attention.SOFTMAX_ROUNDING == 9


def _polar(A):
    U, _, Vt = np.linalg.svd(A, full_matrices=False)
    return U @ Vt


def test_polar_perturbation_bound_is_the_lipschitz_constant_and_is_attained():
    """distance / sigma_min covers finite perturbations along segments of W + tangent, is attained
    (to first order) by a skew perturbation of a square frame, and half of it is not a bound."""
    rng = np.random.default_rng(20261203)
    worst = 0.0
    for d, r in ((2, 1), (4, 4), (8, 3), (16, 5)):
        W = ri.random_point(d, r, rng, batch=(64,))
        xi_a, xi_b = (0.5 * ri.project_tangent(W, rng.standard_normal(W.shape)) for _ in range(2))
        distance = np.linalg.norm(xi_a - xi_b, axis=(-2, -1))
        moved = np.linalg.norm(_polar(W + xi_a) - _polar(W + xi_b), axis=(-2, -1))
        ratio = moved / bounds.polar_perturbation_bound(distance, 1.0 - ri.manifold_tolerance(d, r))
        assert np.all(ratio <= 1.0)
        worst = max(worst, float(ratio.max()))
    # not vacuous: on St(2, 1), the circle, short segments of w + tangent move the polar factor by
    # nearly their length (sigma_min = 1 at the frame), so some draw comes within the factor 2 that
    # the attainment test below also allows
    assert worst > 0.5
    Q = ri.random_point(4, 4, rng)
    X = rng.standard_normal((4, 4))
    dA = Q @ (X - X.T)
    dA *= 1e-7 / np.linalg.norm(dA)
    moved = np.linalg.norm(_polar(Q + dA) - Q)
    assert moved <= bounds.polar_perturbation_bound(1e-7, 1.0) * (1 + 1e-6)
    assert moved > 0.5 * bounds.polar_perturbation_bound(1e-7, 1.0)


def test_polar_perturbation_bound_without_a_singular_value_bound_is_the_diameter():
    assert bounds.polar_perturbation_bound(0.1, 0.0, r=4) == pytest.approx(4.0)
    assert bounds.polar_perturbation_bound(100.0, 1.0, r=9) == pytest.approx(6.0)
    assert np.isinf(bounds.polar_perturbation_bound(0.1, -1.0))
    assert bounds.polar_perturbation_bound(0.3, 0.5) == pytest.approx(0.6)


def test_quiet_is_left_as_it_was_when_its_block_raises():
    """bounds.quiet() spares the stages inside it their own np.errstate; a block that raises leaves it
    closed, so a stage called after it still evaluates 0/0 without a warning."""
    import warnings

    stage = bounds.Stage("quiet_probe", "X", "a/b", ("a", "b"), None)
    with pytest.raises(RuntimeError):
        with bounds.quiet():
            with bounds.quiet():
                raise RuntimeError("a stage raised inside step_error")
    assert getattr(bounds._QUIET, "depth", 0) == 0
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert np.isnan(stage(a=np.array([0.0]), b=np.array([0.0]))[0])
        with bounds.quiet():
            assert np.isnan(stage(a=np.array([0.0]), b=np.array([0.0]))[0])
