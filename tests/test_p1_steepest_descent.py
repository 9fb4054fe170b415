"""Tests of P1 (steepest descent): the claim passes for the real optimizer, fails for the controls it
must catch, and its pieces (the slope locator, the tangent-space basis, the bounds) do what they say."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings

import reference_impl as ri
from propositions import p1_steepest_descent as p1
from propositions._common import DETECTION_FACTOR, Profile, rng_for
from propositions.kit import float32_step
from propositions.kit.protocol import derive_symbolic
from reference_impl.manifold import project_tangent

from strategies import seeds

# A reduced profile: a few hundred frames over the whole shape plan keeps each run well under a second.
SMALL = Profile("test", frames=200, steps=2, long_run_steps=50, mp_dps=30, mp_samples=2)


@settings(max_examples=3)
@given(seed=seeds)
def test_real_optimizer_passes(seed):
    result = p1.CLAIM.run(seed, SMALL, "stiefel_adam")
    assert result.verdict == "pass", result.failures()
    assert all(control.detected for control in result.controls)
    # the float32 controls hold the bounds at float32: they apply where the optimizer computes in float32
    assert {c.name for c in result.controls} == set(p1.CLAIM.control_names) - set(float32_step.CONTROLS)


@pytest.mark.parametrize("control", [name for name in p1.CLAIM.control_names if name not in float32_step.CONTROLS])
def test_control_as_optimizer_fails_first_step_check(control):
    result = p1.CLAIM.run(3, SMALL, control)
    assert result.verdict == "fail"
    failing = {c.name for c in result.checks if not c.passed}
    # a control is another algorithm, so its trajectories also leave the model's (propositions/kit/trajectories.py)
    assert {name for name in failing if not name.startswith("trajectory_model_")} == {f"first_step_is_steepest_descent[{control}]"}
    assert f"trajectory_model_W[{control}]" in failing
    check = next(c for c in result.checks if c.name in failing)
    assert check.max_ratio > 1e6 * DETECTION_FACTOR


def test_recorded_controls_detected_with_margin():
    result = p1.CLAIM.run(5, SMALL)
    for control in result.controls:
        assert control.detected and control.margin > 1e6
    assert result.extra["control_frames"] == SMALL.control_frames  # the profile sizes the controls


def test_symbolic_derivation_reduces():
    symbolic = derive_symbolic(p1.CLAIM.symbolic)
    assert symbolic.status == "proved"
    assert len(symbolic.steps) >= 8


def test_exact_tier_passes():
    records = p1.exact_part(11)
    assert records and all(record["passed"] for record in records)


def test_locate_slope_finds_known_slope_and_window():
    s = p1.SLOPE_GRID
    noise = 1e-16 * (1 + 0.5 * np.sin(np.arange(len(s))))  # a deterministic rounding floor
    error = 0.7 * s**2 * (1 + 0.3 * s) + noise
    floor = p1.measured_floor(s, error, 1.0)
    located = p1.locate_slope(s, error, floor, expected=2.0)
    assert located["passed"]
    assert abs(located["slope"] - 2.0) < p1.SLOPE_TOL
    # the window starts above the floor: 0.7 s^2 > 100 * 1.5e-16 needs s > ~1.5e-7
    assert located["window"][0] >= 1e-7
    assert located["decades"] >= 4


def test_locate_slope_rejects_wrong_order():
    s = p1.SLOPE_GRID
    error = 0.5 * s**2 + 1e-17
    floor = p1.measured_floor(s, error, 1.0)
    located = p1.locate_slope(s, error, floor, expected=3.0)
    assert not located["passed"]
    assert abs(located["slope"] - 2.0) < p1.SLOPE_TOL


def test_locate_slope_needs_enough_decades():
    s = p1.SLOPE_GRID
    error = s**3
    # with a floor of 1e-7, only s^3 > 1e-5, i.e. s > 10^(-5/3), is usable: 1.67 decades of slope 3
    located = p1.locate_slope(s, error, 1e-7, expected=3.0)
    assert abs(located["slope"] - 3.0) < p1.SLOPE_TOL
    assert located["decades"] < p1.MIN_DECADES
    assert not located["passed"]


def test_slope_test_catches_first_order_retraction():
    """The QR retraction is first order only for r >= 2: its acceleration has a tangential part,
    so the tangential second-order test sees slope 2, not 3."""
    rng = rng_for(0, "test", "qr-slope")
    W = ri.random_point(8, 3, rng, (1,))
    xi = project_tangent(W, rng.standard_normal(W.shape), validate=False)
    xi /= np.linalg.norm(xi)
    A, B = np.zeros((1, 8, 8)), rng.standard_normal(W.shape)
    polar = p1._slope_curves(W, xi, A, B)["normal_acceleration"][0]
    qr = p1._slope_curves(W, xi, A, B, retract=lambda W, x: ri.haar_from_gaussian(W + x))["normal_acceleration"][0]
    for curve, passes in ((polar, True), (qr, False)):
        floor = p1.measured_floor(p1.SLOPE_GRID, curve, math.sqrt(3))
        assert p1.locate_slope(p1.SLOPE_GRID, curve, floor, expected=3.0)["passed"] is passes


def test_tangent_constraint_matrix_null_space_is_tangent_space():
    rng = rng_for(0, "test", "null-space")
    W = ri.random_point(5, 2, rng, (3,))
    basis, ranks = p1.null_space_batched(p1.tangent_constraint_matrix(W))
    assert np.all(ranks == 3)  # r (r + 1) / 2
    assert basis.shape == (3, 10, 7)  # d r - r (r + 1) / 2 = 7
    xi = np.swapaxes(basis, -1, -2).reshape(3, 7, 5, 2)
    constraint = np.swapaxes(W, -1, -2)[:, None] @ xi
    assert np.max(np.abs(constraint + np.swapaxes(constraint, -1, -2))) < 1e-14
    # the basis spans exactly the range of P_W: projecting a basis vector leaves it unchanged
    assert np.max(np.abs(project_tangent(np.broadcast_to(W[:, None], xi.shape), xi, validate=False) - xi)) < 1e-14


def test_projection_error_bound_covers_measured_error_and_grows():
    assert p1.projection_error_bound(1024, 128) > p1.projection_error_bound(8, 3) > 0
    rng = rng_for(0, "test", "projection-bound")
    W = ri.random_point(64, 16, rng, (4,))
    G = rng.standard_normal(W.shape)
    exact_ish = G - W @ (0.5 * (np.swapaxes(W, -1, -2) @ G + np.swapaxes(G, -1, -2) @ W))
    # the same formula by a different grouping: the two differ by at most twice the bound
    difference = np.linalg.norm(project_tangent(W, G, validate=False) - exact_ish, axis=(-2, -1)) / np.linalg.norm(G, axis=(-2, -1))
    assert np.all(difference <= 2 * p1.projection_error_bound(64, 16))


def test_figures_and_extra_are_json_ready():
    import json

    result = p1.CLAIM.run(1, SMALL)
    body = result.to_dict()
    json.dumps(body)
    names = {"first_order", "normal_acceleration", "function_expansion"}
    assert set(body["figures"]) == {f"slope_{name}" for name in names}
    for name in names:
        figure = body["figures"][f"slope_{name}"]
        assert figure["logx"] and figure["logy"]
        curves = [series for series in figure["series"] if series["label"] != "located window"]
        windows = [series for series in figure["series"] if series["label"] == "located window"]
        assert curves and len(windows) == len(curves)  # every frame's slope was located
        for curve, window in zip(curves, windows):
            assert len(curve["x"]) == len(curve["y"]) == len(p1.SLOPE_GRID)
            assert curve["x"][0] <= window["x"][0] < window["x"][-1] <= curve["x"][-1]


def test_second_order_coefficient_matches_the_curve():
    """c2 predicts the measured remainder: |f(R(s xi)) - f(W) - s <G, xi>| / s^2 -> |c2| at small s."""
    rng = rng_for(2203, "test", "curvature")
    W = ri.random_point(8, 3, rng, (2,))
    xi = project_tangent(W, rng.standard_normal(W.shape), validate=False)
    xi /= np.linalg.norm(xi, axis=(-2, -1), keepdims=True)
    A, B = p1.quadratic_with_curvature(W, xi, rng)
    c2 = p1.second_order_coefficient(W, xi, A, B)
    assert np.all(np.abs(c2) >= p1.MIN_CURVATURE)
    curve = p1._slope_curves(W, xi, A, B)["function_expansion"]
    at = np.searchsorted(p1.SLOPE_GRID, 1e-4)
    assert np.allclose(curve[:, at] / p1.SLOPE_GRID[at] ** 2, np.abs(c2), rtol=1e-3)
