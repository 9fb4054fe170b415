"""The kernel held to the precision it declares: its declaration and its code are in step, and a
kernel that evaluates a stage more coarsely than declared, lets drift accumulate, or breaks P2 far
from scale 1 fails the cross-check by at least DETECTION_FACTOR, at the check that names the stage.

The broken kernels are the cross-check's controls (propositions.kernel_variants), used from there."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from propositions import crosscheck  # noqa: E402
from propositions._common import DETECTION_FACTOR, Profile  # noqa: E402
from propositions.kit import precision as precisions  # noqa: E402
from propositions.kit import step_analysis  # noqa: E402
from torch_impl import functional  # noqa: E402

# small enough for a test, large enough that every part runs: 4 frames per shape and configuration in
# the declared-precision lock-step, 1000 steps of long run (a drift that is not corrected reaches 37
# times its bound in bfloat16 by then)
PROFILE = Profile("planted", frames=700, steps=3, long_run_steps=1000, mp_dps=0, mp_samples=0, control_frames=64)


pytestmark = pytest.mark.usefixtures("one_torch_thread")  # conftest.py


def test_the_declaration_names_every_stage_and_the_kernels_dtypes():
    """The declaration covers every stage the analysis knows, and says what the kernel's code uses:
    compute_dtype, BIAS_POWER_DTYPE and EIGENSOLVER_DTYPE; a float32 or bfloat16 frame keeps m and
    v in float32 and returns W+ in its own dtype."""
    assert set(functional.STAGES) == set(step_analysis.DECLARED_STAGES)
    for dtype in (torch.float64, torch.float32, torch.bfloat16):
        declared = functional.declared_precision(dtype)
        work = str(functional.compute_dtype(dtype)).replace("torch.", "")
        assert declared["storage"] == str(dtype).replace("torch.", "") and declared["state"] == work
        assert declared["stages"]["bias_power"] == "float64" and declared["stages"]["eigensolver"] == "float64"
        assert {s for s, d in declared["stages"].items() if d != work} <= {"bias_power", "eigensolver"}
        W = functional.polar_factor(torch.randn(3, 6, 2, dtype=torch.float64)).to(dtype)
        W_new, m, v = functional.stiefel_adam_step(W, torch.randn(3, 6, 2, dtype=dtype), torch.zeros(3, 6, 2, dtype=getattr(torch, work)),
                                                   torch.zeros(3, dtype=getattr(torch, work)), 0)
        assert W_new.dtype == dtype and m.dtype == v.dtype == getattr(torch, declared["state"])


def test_the_analysis_holds_a_declared_stage_to_its_own_precision():
    """The bias corrections at t = 1, beta2 = 0.999: about 2000 u_c where beta^t is formed in the compute
    dtype (the generic analysis of an implementation that declares nothing), 2 u_c where it is formed
    in float64 as the kernel declares."""
    declared = precisions.Precision.declared(functional.declared_precision(torch.float32)).rounding(0.5, 8, 3)
    generic = precisions.Precision("float32", "float32", "gram").rounding(0.5, 8, 3)
    u32 = 2.0**-24

    def relative(rounding):
        return float(step_analysis.bias_correction(u_c=rounding.unit("bias_correction"), u_p=rounding.unit("bias_power"), t=1,
                                                   beta_t=0.999, log_beta=abs(float(torch.log(torch.tensor(0.999)))), x=1.0,
                                                   x_err=0.0)) * (1 - 0.999) / u32

    assert 1990 < relative(generic) < 2010
    assert 1.99 < relative(declared) < 2.01


def test_the_real_kernel_passes_at_this_profile():
    result = crosscheck.CLAIM.run(seed=0, profile=PROFILE)
    assert result.verdict == "pass", result.failures()


@pytest.mark.parametrize("name", crosscheck.CLAIM.control_names)
def test_each_broken_kernel_fails_the_check_that_names_its_stage(name):
    """Every broken kernel (propositions.kernel_variants, the cross-check's controls) is caught by the
    control run of crosscheck.CONTROL_RUNS, by at least DETECTION_FACTOR; a port's mistake in one stage
    shows at a check of that stage's dtype or of the property it breaks."""
    from propositions.kit.common import ControlResult
    from propositions.kit.protocol import Context

    control = {c.name: c for c in crosscheck.CLAIM.controls}[name]
    ctx = Context(0, PROFILE, "stiefel_adam", {})
    ctx = crosscheck._prepare(ctx) or ctx
    evidence = control.run(ctx.with_optimizer(name))
    result = ControlResult.from_checks(name, control.describe(), evidence.checks)
    assert result.detected and result.margin >= DETECTION_FACTOR, (name, result.to_dict())
    if name in crosscheck.DECLARED_CONTROL_DTYPES:
        assert result.check.startswith(crosscheck.DECLARED_CONTROL_DTYPES[name] + "/"), result.check


def test_every_broken_kernel_is_a_control_of_the_certificate():
    """No broken kernel is kept outside the certificate: every variant but the real kernel is a control,
    so the certificate fails when any of them escapes."""
    from propositions.kernel_variants import KERNEL_VARIANTS, REAL_KERNEL

    assert set(crosscheck.CLAIM.control_names) == set(KERNEL_VARIANTS) - {REAL_KERNEL}
