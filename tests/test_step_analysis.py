"""The one rounding analysis of the step (propositions/kit/step_analysis.py): what it assumes about
the retraction routes and the iteration count, derived on the certifier's side, and that it rejects
a step off by a little more than rounding."""

from __future__ import annotations

import math

import numpy as np
import pytest

import reference_impl as ri
from propositions.kit import step_analysis as sa
from propositions.kit.model import model_step
from propositions.kit.trajectories import MODEL_ROUTE, one_step_bound

U64, U32 = sa.U64, sa.U32


def _rng(*key):
    return np.random.Generator(np.random.PCG64(np.random.SeedSequence([17, *key])))


def test_newton_schulz_count_is_the_scalar_maps():
    # any step of length 0.5: 0.8 -> 0.47 -> 0.08 -> 3.4e-4 -> 2.4e-11 -> 8.1e-33: five reach 2^-53, four 2^-24
    assert sa.newton_schulz_iterations(0.5, U64) == 5
    assert sa.newton_schulz_iterations(0.5, U32) == 4
    assert sa.newton_schulz_iterations(0.75, U64) > sa.newton_schulz_iterations(0.1, U64)
    with pytest.raises(ValueError, match="trust_radius"):
        sa.newton_schulz_iterations(2.0, U64)


def test_kernel_rounding_reads_nothing_from_the_kernel():
    rounding = sa.kernel_rounding("bfloat16", 0.5, 64, 8)
    assert (rounding.u_c, rounding.u_W, rounding.u_state, rounding.route) == (U32, 2.0**-8, U32, "newton_schulz")
    assert rounding.cast == 2.0**-8 and sa.kernel_rounding("float32", 0.5, 64, 8).cast == 0.0
    assert sa.kernel_rounding("float64", math.inf, 8, 3).route == "eigh"


def test_any_route_covers_each_route():
    config = ri.StiefelAdamConfig(trust_radius=0.5)
    for d, r in ((8, 3), (64, 16)):
        kappa = math.sqrt(1.25)
        any_route = sa.retraction_error(d, r, sa.Rounding(route="any"), kappa, config.trust_radius)
        for route, k in (("svd", 0), ("eigh", 0), ("newton_schulz", sa.newton_schulz_iterations(0.5, U64, 0.01))):
            assert any_route >= sa.retraction_error(d, r, sa.Rounding(route=route, iterations=k), kappa, 0.5)


def test_exact_arithmetic_leaves_only_the_input_errors():
    """u_c = 0, no input error: the bound is 0 on every output (no stage adds anything of its own);
    an input frame error alone gives a positive bound."""
    rng = _rng(1)
    W = ri.random_point(8, 3, rng, (4,))
    G = rng.standard_normal(W.shape)
    state = ri.init(W)
    config = ri.StiefelAdamConfig(lr=0.05)
    model = model_step(W, G, state.m, state.v, state.t, config)
    norms = sa.StepNorms(G=np.linalg.norm(G, axis=(-2, -1)), W=math.sqrt(3), g=model.g_norm, m_in=0.0, v_in=0.0,
                         m=model.m_norm, v=model.v, xi_raw=model.xi_raw_norm, xi=model.xi_norm,
                         A=math.sqrt(3) + model.xi_norm, sigma_min=model.sigma_min, sigma_max=model.sigma_max, t=1)
    exact = sa.step_error(8, 3, config, norms, sa.Rounding(u_c=0.0, route="svd"))
    assert np.all(exact.W == 0) and np.all(exact.m_plus == 0) and np.all(exact.v == 0)
    moved = sa.step_error(8, 3, config, norms, sa.Rounding(u_c=0.0, route="svd"), sa.InputErrors(W=1e-12))
    assert np.all(moved.W > 1e-12) and np.all(moved.W < 1e-10)


def test_kernel_frames_stay_within_the_derived_drift():
    """The torch kernel's own frames (float32, bfloat16 storage) after 200 steps are within the
    drift that the certifier derives for them (frame_drift_bound), which is not vacuous: a frame
    rounded to bfloat16 and then scaled by 1 + 4 bound / sqrt(r) is outside it."""
    torch = pytest.importorskip("torch")
    from torch_impl import functional

    rng = _rng(2)
    for dtype, name in ((torch.float32, "float32"), (torch.bfloat16, "bfloat16")):
        d, r = 32, 8
        W = torch.from_numpy(ri.random_point(d, r, rng, (4,))).to(dtype)
        m = torch.zeros(W.shape, dtype=torch.float32)
        v = torch.zeros(4, dtype=torch.float32)
        for t in range(200):
            G = torch.from_numpy(rng.standard_normal(W.shape)).to(dtype)
            W, m, v = functional.stiefel_adam_step(W, G, m, v, t, 0.05, 0.9, 0.999, 1e-8, 0.5, 0.1)
        rounding = sa.kernel_rounding(name, 0.5, d, r)
        bound = sa.frame_drift_bound(d, r, rounding.u_W, rounding.u_c, 0.5)
        W64 = W.to(torch.float64).numpy()
        assert np.all(ri.feasibility(W64) <= bound)
        assert np.all(ri.feasibility(W64 * (1 + 4 * bound / math.sqrt(r))) > bound)


@pytest.mark.parametrize("exponent,caught", [(36, True), (50, False)])
def test_a_step_off_by_more_than_rounding_is_rejected(exponent, caught):
    """The reference's step with xi scaled by 1 + 2^-36 (about 2^17 u) leaves the model comparison's
    bound; scaled by 1 + 2^-50 (8 u, rounding level) it stays inside."""
    rng = _rng(3, exponent)
    config = ri.StiefelAdamConfig(lr=0.1, trust_radius=0.5)
    W = ri.random_point(6, 3, rng, (16,))
    G = rng.standard_normal(W.shape)
    state = ri.init(W)
    _, _, xi = ri.adam._step_with_direction(W, G, state, config)
    W_off = ri.polar_retract(W, xi * (1 + 2.0**-exponent), "svd", validate=False)
    model = model_step(W, G, state.m, state.v, state.t, config)
    bound = (one_step_bound(W, G, state.m, state.v, state.t, config, model).W
             + one_step_bound(W, G, state.m, state.v, state.t, config, model, route=MODEL_ROUTE).W)
    ratio = np.linalg.norm(W_off - model.W, axis=(-2, -1)) / bound
    assert bool(np.any(ratio > 1)) == caught


def test_lockstep_has_no_undefined_step_in_float64_and_counts_them_in_float32():
    """The cross-check's frame-steps where step_error is undefined (the noise-driven step at G = 0
    with weight decay) do not occur in float64, where the projection's rounding of lambda W is far
    below eps; in float32 they can, and are counted, never compared against an infinite bound."""
    torch = pytest.importorskip("torch")
    from propositions import crosscheck
    from propositions._common import Profile

    profile = Profile("t", frames=60, steps=2, long_run_steps=0, mp_dps=0, mp_samples=0, control_frames=60)
    counts = {}
    for dtype in (torch.float64, torch.float32):
        undefined = [0]
        checks = crosscheck._new_checks(str(dtype).replace("torch.", ""))
        crosscheck.lockstep_crosscheck(0, profile, 60, "cpu", dtype, "stiefel_adam", checks, undefined)
        assert checks["W"].passed and checks["m"].passed
        counts[dtype] = undefined[0]
    assert counts[torch.float64] == 0
    assert counts[torch.float32] <= checks["W"].samples // 10


def test_every_output_has_the_common_shape_of_the_norms():
    """step_error returns every field at one common shape, that of its inputs: a norm at (5,) beside norms
    at (1,) gives (5,) outputs, whichever norm it is (but xi, which the bound does not read: it takes the
    unclipped xi_raw); an output already at that shape is kept as it is, the others broadcast."""
    config = ri.StiefelAdamConfig(lr=1e-3, betas=(0.9, 0.999), eps=1e-8, trust_radius=0.5, weight_decay=0.01)
    d, r = 8, 3
    base = dict(G=1.0, W=math.sqrt(r), g=0.9, m_in=0.1, v_in=0.01, m=0.2, v=0.02, xi_raw=0.1, xi=0.1, A=math.sqrt(r) + 0.01,
                sigma_min=0.99, sigma_max=1.01)
    fields = ("g", "m", "v", "m_hat", "v_hat", "q", "xi", "A", "W", "m_plus", "well_posed")
    alone = {name: getattr(sa.step_error(d, r, config, sa.StepNorms(t=3, **base)), name) for name in fields}
    for wide in base:
        norms = {name: np.full((5,) if name == wide else (1,), value) for name, value in base.items()}
        error = sa.step_error(d, r, config, sa.StepNorms(t=3, **norms))
        shape = (1,) if wide == "xi" else (5,)
        for name in fields:
            value = getattr(error, name)
            assert np.shape(value) == shape, (wide, name, np.shape(value))
            assert np.array_equal(value, np.broadcast_to(alone[name], shape)), (wide, name)
