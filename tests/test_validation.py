"""Every bad input raises ValueError with a message that names the argument and the rule."""

from __future__ import annotations

import math

import numpy as np
import pytest

import reference_impl as ri
from reference_impl import StiefelAdamConfig

rng = np.random.default_rng(0)
W = ri.random_point(5, 2, rng, (3,))
G = rng.standard_normal(W.shape)
STATE = ri.init(W)
CONFIG = StiefelAdamConfig()


@pytest.mark.parametrize(
    "kwargs,pattern",
    [
        (dict(lr=0.0), r"lr must satisfy 0 < lr"),
        (dict(lr=-1e-3), r"lr must satisfy"),
        (dict(lr=math.inf), r"lr must satisfy"),
        (dict(lr=math.nan), r"lr must satisfy"),
        (dict(lr="0.1"), r"lr must be a real number"),
        (dict(betas=(1.0, 0.999)), r"beta1.*0 <= beta1 < 1"),
        (dict(betas=(-0.1, 0.999)), r"beta1"),
        (dict(betas=(0.9, 1.0)), r"beta2.*0 <= beta2 < 1"),
        (dict(betas=(0.9,)), r"betas must be a pair"),
        (dict(eps=-1e-8), r"eps must satisfy 0 <= eps"),
        (dict(trust_radius=0.0), r"trust_radius must satisfy 0 < trust_radius"),
        (dict(trust_radius=-1.0), r"trust_radius"),
        (dict(weight_decay=-0.1), r"weight_decay must satisfy 0 <= weight_decay"),
        (dict(weight_decay=True), r"weight_decay must be a real number"),
    ],
)
def test_config_rejects_out_of_range(kwargs, pattern):
    with pytest.raises(ValueError, match=pattern):
        StiefelAdamConfig(**kwargs)


def test_config_accepts_the_edges():
    StiefelAdamConfig(betas=(0.0, 0.0), eps=0.0, trust_radius=math.inf, weight_decay=0.0)


@pytest.mark.parametrize("fn", ["init", "step", "project_tangent", "polar_retract"])
def test_frame_checks(fn):
    call = {
        "init": lambda W_: ri.init(W_),
        # W is validated before the state, so any state will do here
        "step": lambda W_: ri.step(W_, np.zeros_like(W_), STATE, CONFIG),
        "project_tangent": lambda W_: ri.project_tangent(W_, np.zeros_like(W_)),
        "polar_retract": lambda W_: ri.polar_retract(W_, np.zeros_like(W_)),
    }[fn]
    with pytest.raises(ValueError, match=r"W must have at least 2 dimensions"):
        call(np.ones(3))
    with pytest.raises(ValueError, match=r"W must have dtype float64, got float32"):
        call(W.astype(np.float32))
    with pytest.raises(ValueError, match=r"W must have r <= d"):
        call(np.eye(5)[:2, :])
    bad = W.copy()
    bad[1, 0, 0] = np.nan
    with pytest.raises(ValueError, match=r"W must be finite, found 1 non-finite"):
        call(bad)
    with pytest.raises(ValueError, match=r"W must satisfy W\^T W = I .*batch index \(1,\).*project_to_manifold"):
        drifted = W.copy()
        drifted[1] *= 1 + 1e-6
        call(drifted)
    with pytest.raises(ValueError, match=r"W must be a numpy.ndarray"):
        call([[1.0], [0.0]])


def test_float32_frame_cast_to_float64_is_rejected():
    W32 = W.astype(np.float32).astype(np.float64)
    with pytest.raises(ValueError, match=r"W must satisfy W\^T W = I"):
        ri.init(W32)
    ri.init(ri.project_to_manifold(W32))


def test_manifold_tolerance_accepts_own_points_and_is_tight_enough():
    for d, r in [(1, 1), (8, 8), (64, 16), (1024, 128)]:
        X = ri.random_point(d, r, rng, (2,))
        assert np.max(ri.feasibility(X)) <= ri.manifold_tolerance(d, r)
        assert ri.manifold_tolerance(d, r) < 1e-7  # a float32 frame (~1e-7) is always rejected


def test_step_gradient_checks():
    with pytest.raises(ValueError, match=r"G must have the shape of W"):
        ri.step(W, G[:, :4], STATE, CONFIG)
    with pytest.raises(ValueError, match=r"G must have dtype float64"):
        ri.step(W, G.astype(np.float32), STATE, CONFIG)
    G_bad = G.copy()
    G_bad[0, 0, 0] = np.inf
    with pytest.raises(ValueError, match=r"G must be finite"):
        ri.step(W, G_bad, STATE, CONFIG)


def test_step_state_checks():
    with pytest.raises(ValueError, match=r"state must be a StiefelAdamState"):
        ri.step(W, G, (STATE.m, STATE.v, 0), CONFIG)
    with pytest.raises(ValueError, match=r"state.m must have the shape of W"):
        ri.step(W, G, STATE._replace(m=np.zeros((5, 2))), CONFIG)
    with pytest.raises(ValueError, match=r"state.v must have shape \(3,\)"):
        ri.step(W, G, STATE._replace(v=np.zeros(W.shape)), CONFIG)
    with pytest.raises(ValueError, match=r"state.v must be >= 0"):
        ri.step(W, G, STATE._replace(v=-np.ones(3)), CONFIG)
    with pytest.raises(ValueError, match=r"state.t must be a non-negative integer"):
        ri.step(W, G, STATE._replace(t=-1), CONFIG)
    with pytest.raises(ValueError, match=r"state.t must be a non-negative integer"):
        ri.step(W, G, STATE._replace(t=1.5), CONFIG)
    with pytest.raises(ValueError, match=r"config must be a StiefelAdamConfig"):
        ri.step(W, G, STATE, {"lr": 0.1})


def test_project_and_retract_argument_checks():
    with pytest.raises(ValueError, match=r"G must have the shape of W"):
        ri.project_tangent(W, G[0])
    with pytest.raises(ValueError, match=r"xi must have dtype float64"):
        ri.polar_retract(W, G.astype(np.float16))
    with pytest.raises(ValueError, match=r"method must be one of"):
        ri.polar_retract(W, np.zeros_like(W), method="qr")
    with pytest.raises(ValueError, match=r"full column rank"):
        ri.polar_retract(W, -W)


def test_random_constructors_check_arguments():
    with pytest.raises(ValueError, match=r"rng must be a numpy.random.Generator"):
        ri.random_point(3, 2, 0)
    with pytest.raises(ValueError, match=r"1 <= r <= d"):
        ri.random_point(2, 3, rng)
    with pytest.raises(ValueError, match=r"batch must be"):
        ri.random_point(3, 2, rng, (-1,))
    with pytest.raises(ValueError, match=r"A must have r <= d"):
        ri.project_to_manifold(np.ones((2, 3)))
