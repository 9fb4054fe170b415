"""propositions.crosscheck: the claim passes on a small profile, its controls are detected, a broken
kernel fails it, and its result is JSON-able with the long-run figure in the renderer's format."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from propositions._common import Profile  # noqa: E402
from propositions.kit.protocol import Claim  # noqa: E402
from propositions import crosscheck  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent


def _modules_after(statement: str) -> set:
    """Top-level packages in sys.modules after running `statement` in a fresh interpreter."""
    code = f"import sys; {statement}; print(' '.join(sorted({{m.split('.')[0] for m in sys.modules}})))"
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
    return set(out.stdout.split())

pytestmark = pytest.mark.usefixtures("one_torch_thread")  # conftest.py


SMALL = Profile("small", frames=100, steps=3, long_run_steps=200, mp_dps=0, mp_samples=0)


@pytest.fixture(scope="module")
def float64_result():
    return crosscheck.CLAIM.run(seed=1, profile=SMALL)


def test_claim_entry():
    claim = crosscheck.CLAIM
    assert isinstance(claim, Claim) and claim.id == "crosscheck"
    assert claim.title and claim.statement and claim.latex
    assert set(claim.control_names) == set(crosscheck.CONTROL_DESCRIPTIONS)
    assert {"elementwise_second_moment", "muon_newton_schulz", "moments_in_storage_dtype", "bias_power_in_compute_dtype"} <= set(claim.control_names)


def test_float64_crosscheck_passes_and_detects_its_controls(float64_result):
    result = float64_result
    assert result.verdict == "pass", result.failures()
    names = {c.name for c in result.checks}
    assert {"frame", "first_moment", "second_moment", "P2_bitwise", "P2_bounded", "P4_left", "P4_right", "long_run_feasibility"} <= names
    assert len(result.controls) == len(crosscheck.CONTROL_DESCRIPTIONS) and all(c.detected for c in result.controls)
    assert result.frames >= 60


def test_result_is_jsonable_with_the_feasibility_figure(float64_result):
    data = json.loads(json.dumps(float64_result.to_dict()))
    assert data["symbolic"]["status"] == "not_applicable"
    figure = data["figures"]["long_run_feasibility"]
    assert len(figure["x"]) == len(figure["y"]) > 3 and figure["x"][-1] == SMALL.long_run_steps
    assert {s["label"] for s in figure["series"]} == {f"{dtype} {kind}" for dtype in ("float64", "float32", "bfloat16")
                                                      for kind in ("drift", "bound")}
    long_run = data["extra"]["long_run"]
    assert long_run["float32"]["steps"][-1] == SMALL.long_run_steps
    assert all(drift <= bound for drift, bound in zip(long_run["bfloat16"]["feasibility_max"], long_run["bfloat16"]["bound_max"]))
    assert data["extra"]["torch"]["torch"] == torch.__version__


@pytest.mark.parametrize("variant", ["elementwise_second_moment", "muon_newton_schulz"])
def test_broken_kernel_fails_the_crosscheck(variant):
    tiny = Profile("tiny", frames=60, steps=2, long_run_steps=20, mp_dps=0, mp_samples=0)
    result = crosscheck.CLAIM.run(seed=2, profile=tiny, optimizer=variant)
    assert result.verdict == "fail"
    assert any(not c.passed for c in result.checks if c.name == "frame")


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_low_precision_crosscheck_passes(dtype):
    tiny = Profile("tiny", frames=60, steps=2, long_run_steps=50, mp_dps=0, mp_samples=0)
    result = crosscheck.CLAIM.run(seed=3, profile=tiny, dtype=dtype)
    assert result.verdict == "pass", result.failures()
    assert result.extra["dtype"] == dtype and result.extra["compute_dtype"] == "float32"
    assert dtype in result.extra["long_run"]


def test_bad_arguments_raise():
    with pytest.raises(ValueError, match="dtype"):
        crosscheck.CLAIM.run(0, SMALL, dtype="float16")
    with pytest.raises(ValueError, match="optimizer"):
        crosscheck.CLAIM.run(0, SMALL, optimizer="qr_retraction")
    with pytest.raises(ValueError, match="profile"):
        crosscheck.CLAIM.run(0, "huge")
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="cuda"):
            crosscheck.CLAIM.run(0, SMALL, device="cuda")


def test_torch_environment_reports_versions():
    env = crosscheck.torch_environment("cpu")
    assert env["torch"] == torch.__version__ and env["device"] == "cpu" and "cuda" in env


def test_torch_impl_does_not_import_the_certification_layer():
    loaded = _modules_after("import torch_impl; torch_impl.StiefelAdam")
    assert "torch" in loaded and "reference_impl" in loaded
    assert "propositions" not in loaded and "certify" not in loaded


def test_the_claim_module_imports_without_torch():
    # the registry entry and its bounds need no torch; torch is imported when the claim runs
    loaded = _modules_after("import propositions.crosscheck as c; c.CLAIM.id; c.feasibility_bound")
    assert "propositions" in loaded and "torch" not in loaded


def test_thread_sensitivity_reports_the_comparison():
    threads = crosscheck.thread_sensitivity(0, "float32")
    assert threads["threads"] == [1, 2] and threads["samples"] == 2 * sum(batch for batch, _, _ in crosscheck.THREAD_SAMPLE_SHAPES)
    assert threads["identical"] == (threads["max_relative_difference"] == 0.0)


def test_unguarded_gram_identity_for_the_gradient_norm_fails_the_crosscheck(monkeypatch):
    """||G~||^2 - ||sym(W^T G~)||^2 without the accuracy test of gradient_norm_squared: the frames
    that get G = 0 (G~ = lambda W, all normal) make the identity cancel, and the second moment
    leaves its bound."""
    from torch_impl import functional

    def unguarded(W, G_decayed, WtG, drift, sync_free=False):
        sigma = 0.5 * (WtG + WtG.mT)
        return torch.linalg.vector_norm(G_decayed, dim=(-2, -1)).square() - torch.linalg.vector_norm(sigma, dim=(-2, -1)).square()

    monkeypatch.setattr(functional, "gradient_norm_squared", unguarded)
    tiny = Profile("tiny", frames=60, steps=2, long_run_steps=20, mp_dps=0, mp_samples=0)
    result = crosscheck.CLAIM.run(seed=2, profile=tiny)
    assert result.verdict == "fail"
    assert any(not c.passed for c in result.checks if c.name == "second_moment")
