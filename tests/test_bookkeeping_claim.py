"""The claim 'bookkeeping': layouts of parameters, groups and instances leave a torch optimizer's
frames unchanged; torch_impl.StiefelAdam passes, each broken subclass fails, and it runs on outside
torch optimizers through the adapter (float32 included), never 'not comparable'."""

import math

import pytest

pytest.importorskip("torch")

from certify import claims  # noqa: E402
from certify.outside import adapters
from propositions._common import get_profile  # noqa: E402
from propositions.bookkeeping import CLAIM, CONTROLS, regrouping_allowance  # noqa: E402


def test_stiefel_adam_passes_with_every_control_detected():
    result = CLAIM.run(seed=1, profile=get_profile("quick"))
    assert result.verdict == "pass", result.failures()
    assert {c.name for c in result.checks} == {"layouts_complete", "two_groups", "two_optimizers", "batched", "checkpoint", "rebuilt"}
    assert all(c.samples > 0 for c in result.checks)
    assert sorted(c.name for c in result.controls) == sorted(CONTROLS) and all(c.detected for c in result.controls)


@pytest.mark.parametrize("name,check", [("lr_over_group_size", "two_groups"), ("shared_second_moment", "batched"),
                                        ("load_drops_first_moment", "checkpoint")])
def test_each_broken_class_fails_the_layout_that_exposes_it(name, check):
    result = CLAIM.run(seed=1, profile=get_profile("quick"), optimizer=name)
    failing = {c.name for c in result.checks if not c.passed}
    assert result.verdict == "fail" and check in failing


@pytest.mark.parametrize("spec", ["torch_impl", "torch_impl-float32"])
def test_adapted_torch_optimizers_are_certified_in_their_own_dtype(spec):
    variant = adapters.resolve(spec)
    assert variant.torch_factory is not None
    sealed, internal_error = claims.certify_claim("bookkeeping", seed=0, profile="quick", optimizer=spec, command="test")
    assert internal_error is None
    assert sealed["verdict"] == "pass", sealed["failures"] + sealed["inconclusive"]


@pytest.mark.parametrize("optimizer", ["reference_impl", "qr_retraction"])
def test_a_numpy_step_is_not_applicable_not_passed(optimizer):
    # an adapted NumPy step, or a reference_impl variant named as P1..P5's controls are
    sealed, _ = claims.certify_claim("bookkeeping", seed=0, profile="quick", optimizer=optimizer, command="test")
    assert sealed["verdict"] == "inconclusive"
    assert any(reason.startswith("not applicable") for reason in sealed["inconclusive"])


def test_the_allowance_grows_with_the_steps_and_the_unit_roundoff():
    one, three = regrouping_allowance(16, 4, 2.0**-53, 1), regrouping_allowance(16, 4, 2.0**-53, 3)
    assert math.isclose(three / one, 7.0)
    # first order in u: the float32 allowance is 2^29 times the float64 one, to the gamma_n terms
    assert math.isclose(regrouping_allowance(16, 4, 2.0**-24, 1) / one, 2.0**29, rel_tol=1e-4)


def test_torch_impl_declares_its_state_and_the_claims_read_it():
    variant = adapters.resolve("torch_impl")
    assert variant.state_observable
    import numpy as np
    import reference_impl as ri

    rng = np.random.default_rng(0)
    W = ri.random_point(6, 2, rng, (3,))
    config = ri.StiefelAdamConfig(lr=0.05)
    state = variant.init(W)
    reference_state = ri.init(W)
    for _ in range(3):
        G = rng.standard_normal(W.shape)
        W_new, state = variant.step(W, G, state, config)
        W_ref, reference_state = ri.step(W, G, reference_state, config)
        assert state.t == reference_state.t
        assert np.max(np.abs(state.v - reference_state.v)) <= 1e-14 * np.max(reference_state.v)
        assert np.max(ri.frobenius(state.m - reference_state.m)) <= 1e-13
        W = W_ref  # the reference's frame, with the optimizer's state written back into it


@pytest.mark.parametrize("declaration,message", [
    ('{"m": "exp_avg", "v": "exp_avg_sq", "t": "step", "m_tangent_at": "current"}', "m is not tangent"),
    ('{"m": "exp_avg", "v": "exp_avg", "t": "step", "m_tangent_at": "previous"}', "v has shape"),
    ('{"m": "exp_avg", "v": "exp_avg_sq", "t": "count", "m_tangent_at": "previous"}', "not in optimizer.state"),
    ('{"m": "exp_avg", "v": "exp_avg_sq"}', "keys m, v, t, m_tangent_at"),
])
def test_a_wrong_state_declaration_is_refused_on_the_trial_step(declaration, message):
    with pytest.raises(adapters.AdapterError, match=message):
        adapters.resolve('torch:torch_impl:StiefelAdam:{"state": ' + declaration + "}")
