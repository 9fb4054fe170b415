"""The claim 'optimizer' (propositions/optimizer_class.py): the real StiefelAdam passes in float64,
float32 and bfloat16, and each broken subclass (one piece of bookkeeping wrong) fails it."""

import numpy as np
import pytest

pytest.importorskip("torch")

from propositions._common import get_profile  # noqa: E402
from propositions.optimizer_class import CLAIM, CONTROL_NAMES, bias_correction_rho, broken_optimizers  # noqa: E402


@pytest.fixture(scope="module")
def quick_result():
    return CLAIM.run(seed=3, profile=get_profile("quick"))


def test_the_class_passes_in_three_dtypes_and_every_control_is_detected(quick_result):
    result = quick_result
    assert result.verdict == "pass", result.failures()
    names = {check.name for check in result.checks}
    for dtype in ("float64", "float32", "bfloat16"):
        for check in ("frame", "first_moment", "second_moment", "step_count", "no_gradient_untouched",
                      "nonfinite_frame_untouched", "resume_bit_for_bit", "closure_loss", "euclidean_is_adamw"):
            assert f"{dtype}/{check}" in names
    assert all(check.samples > 0 for check in result.checks)
    assert sorted(control.name for control in result.controls) == sorted(CONTROL_NAMES)
    assert all(control.detected for control in result.controls)
    assert result.extra["unit_roundoffs_bfloat16"]["u_W"] == 2.0**-8


@pytest.mark.parametrize("name", CONTROL_NAMES)
def test_each_broken_class_fails_the_claim(name):
    result = CLAIM.run(seed=4, profile=get_profile("quick"), optimizer=name)
    assert result.verdict == "fail"
    assert name in broken_optimizers()


def test_the_bias_correction_term_is_largest_where_one_minus_beta_t_cancels():
    t = np.arange(1, 1001)
    rho = bias_correction_rho(0.9, 0.999, t)
    assert np.all(np.diff(rho) < 0)  # beta^t / (1 - beta^t) falls with t
    # at t = 1, 1 - 0.999 = 0.001: 2 POW_ULPS u x / (1 - x) ~ 4 * 1.1e-16 * 999 / 2 for the second moment
    assert 1e-13 < rho[0] < 1e-12
