"""Adapters (certify.outside.adapters): outside implementations through the claims.

The claims run at a tiny profile here (a few hundred frames): enough for every check to meet the
regime it tests, small enough for a test. The fakes (tests/adapter_fakes.py) each break one claim's
property in the regime only that claim probes, so each must fail exactly that claim.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

import reference_impl as ri
from certify import claims
from certify.outside import adapters
from propositions import get_claim
from propositions._common import NumericalCheck, Profile
from propositions.kit import observability

sys.path.insert(0, str(Path(__file__).resolve().parent))  # adapter_fakes, loaded by name as a reviewer's module would be

TINY = Profile("tiny", frames=200, steps=4, long_run_steps=50, mp_dps=30, mp_samples=1)


def verdicts(spec: str, claim_ids=claims.IMPLEMENTATION_CLAIMS) -> dict:
    variant = adapters.resolve(spec) if claims.is_adapter_spec(spec) else spec
    out = {}
    for claim_id in claim_ids:
        if claims.is_adapter_spec(spec):
            data = claims._run_adapted(get_claim(claim_id), claim_id, 0, TINY, variant, {})
        else:
            data = get_claim(claim_id).run(0, TINY, optimizer=variant).to_dict()
        out[claim_id] = (data["verdict"], data["failures"])
    return out



# --- each claim catches the fake that breaks it, and only that one --------------------------------
#
# A fake is reference_impl.step verbatim outside its regime. So "fails exactly its claim" is: the fake
# fails its claim, its regime is met by its claim and by no other (recorded through
# adapter_fakes.recorder), and the reference through the adapter passes every claim.

import adapter_fakes  # noqa: E402
from certify_fakes import run_main


@pytest.fixture(scope="module")
def reference_run():
    """Verdicts of the reference through the adapter (the recorder), and the regimes each claim met."""
    variant = adapters.resolve("numpy:adapter_fakes:init,recorder")
    found, hits = {}, {}
    for claim_id in claims.IMPLEMENTATION_CLAIMS:
        adapter_fakes.HITS.clear()
        data = claims._run_adapted(get_claim(claim_id), claim_id, 0, TINY, variant, {})
        found[claim_id] = (data["verdict"], data["failures"])
        hits[claim_id] = set(adapter_fakes.HITS)
    return found, hits


@pytest.mark.parametrize("claim_id", claims.IMPLEMENTATION_CLAIMS)
def test_fake_breaking_one_claim_fails_exactly_that_claim(claim_id, reference_run):
    found, hits = reference_run
    assert hits[claim_id] == {claim_id}, hits  # its regime is met by its claim, no other regime is
    assert [other for other, met in hits.items() if claim_id in met] == [claim_id]
    verdict, failures = verdicts(f"numpy:adapter_fakes:break_{claim_id.lower()}", (claim_id,))[claim_id]
    assert verdict == "fail", failures


def test_the_reference_through_the_adapter_gets_the_builtin_verdicts(reference_run):
    through = {claim_id: verdict for claim_id, (verdict, _) in reference_run[0].items()}
    builtin = {claim_id: verdict for claim_id, (verdict, _) in verdicts("stiefel_adam").items()}
    assert through == builtin == {claim_id: "pass" for claim_id in claims.IMPLEMENTATION_CLAIMS}, reference_run[0]


def test_reference_shortcut_reads_the_state_and_recovers_the_direction():
    described = adapters.describe(adapters.resolve("reference_impl"))
    assert described["state_observable"] and described["direction"].startswith("recovered")


# --- bad input: exit 2 with one line; a misbehaving implementation: a failing certificate ---------


@pytest.mark.parametrize("spec, message", [
    ("numpy:no_such_module_here:step", "does not import"),
    ("numpy:adapter_fakes:no_such_name", "has no attribute"),
    ("numpy:adapter_fakes:wrong_signature", "does not take step(W, G, state, config)"),
    ("numpy:adapter_fakes", "expected numpy:MODULE:ATTRS"),
    ("numpy:adapter_fakes:break_p1:sideways", "unknown flag"),
    ("torch:torch_impl:NoSuchOptimizer", "has no attribute"),
    ("torch:torch_impl:StiefelAdam:{not json", "does not parse"),
    ("no-such-implementation", "unknown optimizer variant"),
])
def test_unusable_implementation_exits_2_with_one_line(capsys, tmp_path, spec, message):
    if spec.startswith("torch:"):
        pytest.importorskip("torch")
    code, _, err = run_main(capsys, "run", "P1", "--optimizer", spec, "--out", str(tmp_path))
    lines = [line for line in err.splitlines() if line.strip()]
    assert code == 2 and len(lines) == 1 and message in lines[0], err


def test_implementation_flag_and_a_claim_it_does_not_enter_are_usage_errors(capsys, tmp_path):
    code, _, err = run_main(capsys, "run", "P6", "--implementation", "adapter_fakes:break_p1", "--out", str(tmp_path))
    assert code == 2 and "does not run the optimizer under test" in err
    code, _, err = run_main(capsys, "run", "P1", "--implementation", "adapter_fakes:break_p1",
                            "--optimizer", "qr_retraction", "--out", str(tmp_path))
    assert code == 2 and "give one of" in err


@pytest.mark.parametrize("fake, reason", [("returns_nan", "non-finite"), ("leaves_manifold", "off St(")])
def test_misbehaving_implementation_gives_a_failing_certificate_with_its_reason(fake, reason):
    sealed, internal_error = claims.certify_claim("P1", seed=0, profile="quick", optimizer=f"numpy:adapter_fakes:{fake}", command="test")
    assert internal_error is None
    assert sealed["verdict"] == "fail"
    assert any(reason in failure for failure in sealed["failures"]), sealed["failures"]


def test_per_frame_step_is_detected_and_looped():
    variant = adapters.resolve("numpy:adapter_fakes:per_frame_step")
    rng = np.random.default_rng(1)
    W = ri.random_point(5, 2, rng, (3, 2))
    G = rng.standard_normal(W.shape)
    config = ri.StiefelAdamConfig(lr=0.1)
    W_new, state = variant.step(W, G, variant.init(W), config)
    W_ref, state_ref = ri.step(W, G, ri.init(W), config)
    assert np.array_equal(W_new, W_ref) and np.array_equal(state.v, state_ref.v) and state.t == 1


def test_opaque_state_is_a_black_box_and_its_hidden_checks_are_recorded():
    variant = adapters.resolve("numpy:adapter_fakes:opaque")
    assert not observability.state_observable(variant)
    state = variant.init(ri.random_point(4, 2, np.random.default_rng(2)))
    with pytest.raises(observability.StateNotObservable):
        state.m
    data = claims._run_adapted(get_claim("P4"), "P4", 0, TINY, variant, {})
    hidden = {entry["check"] for entry in data["extra"]["not_observable"]}
    assert data["verdict"] == "pass"
    assert "left_haar_first_moment" in hidden and "sign_flip_second_moment_bitwise" in hidden
    assert not hidden & {c["name"] for c in data["numerical"]["checks"]}  # recorded, never counted as passed


def test_a_check_without_samples_that_was_not_recorded_still_fails():
    empty = NumericalCheck("silently_skipped", "never ran", "n/a").to_dict()
    data = {"symbolic": {"status": "not_applicable", "steps": []}, "exact": [], "numerical": {"checks": [empty]},
            "controls": [], "inconclusive": [], "notes": [], "extra": {}}
    assert claims.apply_observability(data, [])["verdict"] == "fail"
    assert claims.apply_observability(data, [{"check": "silently_skipped", "reason": "hidden"}])["verdict"] != "fail"


def test_recording_outside_a_run_raises_rather_than_passing():
    with pytest.raises(observability.StateNotObservable):
        observability.record("some_check", "hidden")


# --- torch optimizers --------------------------------------------------------------------------


def test_torch_impl_through_the_optimizer_adapter_passes():
    pytest.importorskip("torch")
    found = verdicts("torch_impl", ("P1", "P4"))
    assert all(verdict == "pass" for verdict, _ in found.values()), found


def test_float32_storage_is_held_to_float32_bounds():
    pytest.importorskip("torch")
    sealed, _ = claims.certify_claim("P4", seed=0, profile="quick", optimizer="torch_impl-float32", command="test")
    assert sealed["verdict"] == "pass", sealed["failures"] + sealed["inconclusive"]
    assert sealed["extra"]["precision"]["u_c"] == 2.0**-24 and sealed["extra"]["precision"]["storage"] == "float32"


def test_torch_state_is_reusable_and_the_input_untouched():
    pytest.importorskip("torch")
    variant = adapters.resolve("torch_impl")
    rng = np.random.default_rng(3)
    W = ri.random_point(6, 3, rng, (2,))
    G = rng.standard_normal(W.shape)
    W_copy, G_copy = W.copy(), G.copy()
    state = variant.init(W)
    config = ri.StiefelAdamConfig(lr=0.05)
    first, _ = variant.step(W, G, state, config)
    again, _ = variant.step(W, G, state, config)
    assert np.array_equal(first, again) and np.array_equal(W, W_copy) and np.array_equal(G, G_copy)


def test_geoopt_differences_are_measured_and_named():
    pytest.importorskip("geoopt")
    from certify.outside import probes

    euclidean = {p["property"]: p for p in probes.probe(adapters.resolve("geoopt-euclidean"))}
    assert euclidean["trust region"]["differs"] and "no trust region" in euclidean["trust region"]["finding"]
    assert euclidean["retraction"]["finding"].startswith("QR")
    assert "sum of squares" in euclidean["first-step length"]["finding"]
    assert not euclidean["first-step direction"]["differs"]
    canonical = {p["property"]: p for p in probes.probe(adapters.resolve("geoopt-canonical"))}
    assert canonical["retraction"]["finding"].startswith("Cayley")
    assert canonical["first-step direction"]["differs"]
    assert adapters.describe(adapters.resolve("geoopt-euclidean"))["ignored_hyperparameters"] == ["trust_radius"]


def test_probes_of_the_reference_find_no_difference():
    from certify.outside import probes

    assert not [p for p in probes.probe(adapters.resolve("reference_impl")) if p["differs"]]
    assert [p["property"] for p in probes.probe(adapters.resolve("qr_retraction")) if p["differs"]] == ["retraction"]


def test_zero_gradient_probe_sees_a_step_without_the_v_hat_guard():
    from certify.outside import probes

    found = {p["property"]: p for p in probes.probe(adapters.resolve("numpy:adapter_fakes:unguarded"))}
    assert found["G = 0, eps = 0"]["differs"] and "0 by 0" in found["G = 0, eps = 0"]["finding"]
    assert not found["first-step direction"]["differs"]


def test_probes_of_a_step_undefined_at_eps_zero_run_at_a_small_eps_and_say_so():
    from certify.outside import probes

    found = {p["property"]: p for p in probes.probe(adapters.resolve("numpy:adapter_fakes:nan_at_eps_zero"))}
    for name in ("first-step direction", "first-step length", "trust region", "retraction"):
        assert not found[name]["differs"], found[name]
        assert "at eps = 1e-08: its step is not finite at eps = 0" in found[name]["measured"]
    assert found["G = 0, eps = 0"]["differs"] and "0 by 0" in found["G = 0, eps = 0"]["finding"]


def test_a_nan_frame_is_a_finding_never_read_as_no_move_and_the_probe_s_own_errors_are_not_the_step_s():
    from certify.outside import probes

    checked = {p["property"]: p for p in probes.probe(adapters.resolve("numpy:adapter_fakes:uncapped_nan"))}
    assert checked["trust region"]["differs"] and "the step's output is refused" in checked["trust region"]["finding"]
    # the property verdicts hand the probes the implementation's outputs unchecked
    found = {p["property"]: p for p in probes.probe(adapters.resolve("numpy:adapter_fakes:uncapped_nan", checked=False))}
    assert found["trust region"]["differs"] and "not finite" in found["trust region"]["finding"]
    assert not found["first-step direction"]["differs"]

    class Broken(probes._Probes):
        def retraction(self):
            raise RuntimeError("a bug of the probe")

    record = probes._guarded("retraction", "polar", Broken(adapters.resolve("reference_impl"), 0).retraction)
    assert not record["differs"] and record["measured"].startswith("not measured: the probe itself failed (RuntimeError")


def test_a_torch_step_from_a_loaded_state_runs_at_the_hyperparameters_it_is_asked_for():
    """load_state_dict restores the param groups saved with the state; the adapter sets the step's own
    lr (and the rest) again, so a second step from one state at lr and lr / 10 moves the frame ten times
    less (property verdicts take their directions from a warm state at several lr)."""
    pytest.importorskip("torch")
    variant = adapters.resolve("torch:torch_impl:StiefelAdam")
    rng = np.random.default_rng(3)
    W = ri.random_point(6, 2, rng, (2,))
    G1, G2 = rng.standard_normal(W.shape), rng.standard_normal(W.shape)
    W1, state = variant.step(W, G1, variant.init(W), ri.StiefelAdamConfig(lr=0.01, trust_radius=float("inf")))
    moved = [ri.frobenius(variant.step(W1, G2, state, ri.StiefelAdamConfig(lr=lr, trust_radius=float("inf")))[0] - W1)
             for lr in (1e-3, 1e-4)]
    np.testing.assert_allclose(moved[0] / moved[1], 10.0, rtol=1e-3)
