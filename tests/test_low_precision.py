"""Float32 and bfloat16 implementations under P1..P5 (propositions/kit/precision.py): held to the
bounds at their own unit roundoffs, never refused as "not comparable"; a correct float32 NumPy step
passes, five broken ones fail with the check that names the broken stage."""

from __future__ import annotations

import math

import pytest

from certify import claims
from certify.outside import adapters
from propositions.kit import float32_step
from propositions.kit import precision as precisions

FLOAT32_STEP = "numpy:propositions.kit.float32_step"


def certify(claim_id: str, optimizer: str) -> dict:
    sealed, internal_error = claims.certify_claim(claim_id, seed=0, profile="quick", optimizer=optimizer, command="test")
    assert internal_error is None
    return sealed


def test_precision_unit_roundoffs_and_ranges():
    assert precisions.FLOAT64.u == 2.0**-53 and precisions.FLOAT64.u_s == 0.0
    single = precisions.Precision("float32", "float32", "gram")
    assert single.u_c == 2.0**-24 and single.u == 2.0**-23
    assert precisions.FLOAT64.scale_decades == 30 and single.scale_decades == 13
    # (10^13)^2 times the largest frame's d r, and the second moment's bias correction, stay in float32
    assert (10.0**13 * 5) ** 2 * 1024 * 128 * 1e3 < 3.4e38
    half = precisions.Precision("bfloat16", "float32")
    assert half.u_s == 2.0**-8 and half.rounding(0.5, 8, 3).u_W == 2.0**-8
    with pytest.raises(precisions.PrecisionTooCoarse):
        half.gamma(64)  # 64 (2^-8 + 2^-24) > 1/16: a first-order bound does not apply
    assert math.isclose(single.gamma(100), 100 * single.u / (1 - 100 * single.u))
    with pytest.raises(ValueError):
        precisions.Precision("float16")


def test_precision_of_an_adapted_implementation():
    pytest.importorskip("torch")
    variant = adapters.resolve("torch_impl-float32")
    found = precisions.of(variant)
    assert (found.storage, found.compute, found.route) == ("float32", "float32", "gram")
    assert precisions.of("stiefel_adam") is precisions.FLOAT64
    rounding = found.rounding(0.5, 16, 4)
    assert rounding.route == "newton_schulz" and rounding.iterations > 0
    assert found.rounding(2.0, 16, 4).route == "eigh"  # the kernel's route above trust radius 1


def test_the_correct_float32_numpy_step_passes():
    for claim_id in claims.IMPLEMENTATION_CLAIMS:
        sealed = certify(claim_id, f"{FLOAT32_STEP}:step")
        assert sealed["verdict"] == "pass", (claim_id, sealed["failures"], sealed["inconclusive"])
        assert sealed["extra"]["precision"]["storage"] == "float32"


@pytest.mark.parametrize("claim_id, key", [("P2", "frames_certified"), ("P4", "frames_certified")])
def test_float32_trajectories_are_compared_where_their_bound_is_informative_and_say_how_far(claim_id, key):
    """P2 and P4 at float32: the running bound of a long trajectory reaches 2 sqrt(r) on some frames
    (it then certifies nothing); those frames are compared over their first steps, the certificate
    counts them and its notes say how far the shortest went, and the verdict is a pass, not inconclusive."""
    sealed = certify(claim_id, f"{FLOAT32_STEP}:step")
    assert sealed["verdict"] == "pass", sealed["failures"] + sealed["inconclusive"]
    certified = sealed["extra"][key]
    assert certified["replayed_at_high_precision"] == 0  # the replay runs the reference's mathematics only
    assert certified["over_every_step"] > 0
    if certified["over_their_first_steps"]:
        shortest = certified["shortest_compared_run"]
        assert any(f"compared over their first steps only (as few as {shortest} of" in note for note in sealed["notes"])


@pytest.mark.parametrize("name, first_failing", [
    ("mean_square_without_1_over_dr", "first_step_is_steepest_descent"),
    ("first_moment_not_transported", "trajectory_model_m"),
    ("no_bias_correction_of_m", "first_step_is_steepest_descent"),
    ("qr_retraction", "first_step_is_steepest_descent"),
    ("step_count_not_advanced", "trajectory_model_W"),
])
def test_a_broken_float32_numpy_step_fails_at_its_stage(name, first_failing):
    assert name in float32_step.CONTROL_DESCRIPTIONS
    sealed = certify("P1", f"{FLOAT32_STEP}:{name}")
    assert sealed["verdict"] == "fail"
    assert sealed["failures"][0].startswith(f"check {first_failing}["), sealed["failures"]


def test_a_bfloat16_implementation_is_judged_never_refused():
    pytest.importorskip("torch")
    sealed = certify("P1", "torch_impl-bfloat16")
    # P1's first step and trajectories have bounds at bfloat16, and the correct kernel meets them
    assert sealed["verdict"] == "pass", sealed["failures"] + sealed["inconclusive"]
    assert sealed["extra"]["precision"]["u_s"] == 2.0**-8


def test_a_bound_that_does_not_exist_at_bfloat16_is_inconclusive_and_says_why():
    pytest.importorskip("torch")
    # P3's first-order bounds need n u < 1/16: for sums of 16 terms at bfloat16 there is none, which
    # is a statement about the analysis (inconclusive, named), not a crash of the claim
    sealed = certify("P3", "torch_impl-bfloat16")
    assert sealed["verdict"] == "inconclusive"
    assert any("no derived bound at the implementation's precision" in reason and "bfloat16" in reason
               for reason in sealed["inconclusive"]), sealed["inconclusive"]
    assert not any("raised while it ran" in reason for reason in sealed["inconclusive"])


def _located_stage(variant):
    """The stage the plugin names for `variant`'s minimal counterexample of P1 (None: none named)."""
    from certify.ci import counterexample, stages
    from certify.ci.pytest_plugin import _Failed, _property

    try:
        _property(variant, "P1")()
    except _Failed as failure:
        case, outcome = counterexample.shrink(variant, failure.case)
        return stages.locate(variant, case, outcome)
    raise AssertionError(f"{variant.name} passed P1")


@pytest.mark.parametrize("name, stage", [
    ("mean_square_without_1_over_dr", "moments"),
    ("no_bias_correction_of_m", "bias correction"),
    ("step_count_not_advanced", "bias correction"),
])
def test_a_float32_stage_error_is_named_at_its_stage(name, stage):
    """The stage probes read a float32 step at float32's resolution (certify/ci/stages.ProbeScale):
    a stage error of order one is named at its stage, as its float64 twin is, not at the first probe
    that float32 rounding moves."""
    located = _located_stage(adapters.resolve(f"{FLOAT32_STEP}:{name}"))
    assert located["stage"] == stage, located["finding"]


def test_a_float32_retraction_that_its_rounding_hides_is_never_blamed_on_another_stage():
    """QR instead of polar differs from it at second order; at float32 the fit's tolerance can hide
    that on a short step, and then the full-step probes carry the retraction's slack: no other stage
    is named for it."""
    located = _located_stage(adapters.resolve(f"{FLOAT32_STEP}:qr_retraction"))
    assert located["stage"] in (None, "retraction"), located["finding"]


def test_a_float32_certificate_runs_the_float32_controls_and_a_float64_one_does_not():
    """The float32 ports' mistakes are P1's controls wherever the implementation under test computes in
    float32: each detected by at least DETECTION_FACTOR under the bounds at float32; a float64
    certificate leaves them out (its own controls hold its bounds)."""
    from propositions._common import DETECTION_FACTOR

    sealed = certify("P1", f"{FLOAT32_STEP}:step")
    found = {c["name"]: c for c in sealed["controls"]}
    assert set(float32_step.CONTROLS) <= set(found)
    for name in float32_step.CONTROLS:
        assert found[name]["detected"] and found[name]["margin"] >= DETECTION_FACTOR, found[name]
    plain = certify("P1", "stiefel_adam")
    assert not set(float32_step.CONTROLS) & {c["name"] for c in plain["controls"]}
