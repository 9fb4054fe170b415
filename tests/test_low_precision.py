"""Float32 and bfloat16 implementations under P1..P5 (propositions/kit/precision.py): held to the
bounds at their own unit roundoffs, never refused as "not comparable"; a correct float32 NumPy step
passes, five broken ones fail with the check that names the broken stage."""

from __future__ import annotations

import math
import sys
from pathlib import Path

import pytest

from certify import claims
from certify.outside import adapters
from propositions.kit import precision as precisions

sys.path.insert(0, str(Path(__file__).resolve().parent))  # float32_step
import float32_step  # noqa: E402


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
    for claim_id in ("P1", "P5"):
        sealed = certify(claim_id, "numpy:float32_step:step")
        assert sealed["verdict"] == "pass", (claim_id, sealed["failures"], sealed["inconclusive"])
        assert sealed["extra"]["precision"]["storage"] == "float32"


@pytest.mark.parametrize("name, first_failing", [
    ("mean_square_without_1_over_dr", "first_step_is_steepest_descent"),
    ("first_moment_not_transported", "trajectory_model_m"),
    ("no_bias_correction_of_m", "first_step_is_steepest_descent"),
    ("qr_retraction", "first_step_is_steepest_descent"),
    ("step_count_not_advanced", "trajectory_model_W"),
])
def test_a_broken_float32_numpy_step_fails_at_its_stage(name, first_failing):
    assert name in float32_step.BROKEN
    sealed = certify("P1", f"numpy:float32_step:{name}")
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
