"""Minimal counterexamples (certify.ci.counterexample, certify.ci.stages) and regression files
(certify.ci.regression), on five implementations each broken in one stage (tests/broken_impls.py,
tests/broken_torch.py): the certificate records a small case, names its first diverging step and the
stage that was broken, and the regression file fails on the broken code and passes on the fixed code
and on the reference."""

from __future__ import annotations

import json
import math
import os
from pathlib import Path

import pytest

from certify import cli

from certify.ci import counterexample
from certify.ci import regression
from certify_fakes import run_main

pytest_plugins = ["pytester"]

ROOT = Path(__file__).resolve().parents[1]

# (spec, the stage that is broken, the first step at which the mistake shows, the fixed spec)
BROKEN = {
    "bias": ("numpy:broken_impls:bias_from_step_2", "bias correction", 2, "numpy:broken_impls:fixed_step"),
    "projection": ("numpy:broken_impls:projection_no_sym", "projection", 1, "numpy:broken_impls:fixed_step"),
    "cap": ("numpy:broken_impls:cap_by_max_entry", "cap", 1, "numpy:broken_impls:fixed_step"),
    "moments": ("torch:broken_torch:SumSquaresAdam", "moments", 1, "torch:broken_torch:FixedAdam"),
    "retraction": ("torch:broken_torch:QRRetractionAdam", "retraction", 1, "torch:broken_torch:FixedAdam"),
}


@pytest.fixture(scope="module")
def certificates(tmp_path_factory):
    """P1 at the quick profile on each broken implementation, through the command line."""
    made = {}
    for name, (spec, *_rest) in BROKEN.items():
        if spec.startswith("torch:"):
            pytest.importorskip("torch")
        out = tmp_path_factory.mktemp(name)
        assert cli.main(["run", "P1", "--optimizer", spec, "--profile", "quick", "--out", str(out)]) == 1
        made[name] = out / "P1.json"
    return made


@pytest.mark.parametrize("name", list(BROKEN))
def test_counterexample_is_small_and_names_the_broken_stage(certificates, name):
    spec, stage, step, _ = BROKEN[name]
    found = json.loads(certificates[name].read_text())["extra"]["counterexample"]
    parameters = found["parameters"]
    assert found["found"] and found["claim"] == "P1"
    assert parameters["d"] * parameters["r"] <= 8 and parameters["steps"] <= 3
    assert found["first_diverging_step"] == step == parameters["steps"]
    assert found["stage"] == stage, found["stage_evidence"]
    assert found["residual"] > found["bound"] > 0
    assert found["first_failing_check"] is not None
    assert found["summary"].startswith(f"P1 {found['replayed_check']} fails at d={parameters['d']}, r={parameters['r']}")


def test_the_counterexample_is_printed_and_reported(certificates, capsys):
    report = (certificates["cap"].parent / "REPORT.md").read_text()
    found = json.loads(certificates["cap"].read_text())["extra"]["counterexample"]
    assert "**Minimal counterexample:**" in report and found["summary"] in report


def test_shrink_time_is_in_the_run_record_not_the_evidence(certificates):
    certificate = json.loads(certificates["bias"].read_text())
    assert "timings" not in certificate["extra"]["counterexample"]
    assert certificate["run"]["claim_timings"]["counterexample/timings"]["shrink_s"] > 0


@pytest.mark.parametrize("name", list(BROKEN))
def test_regression_file_fails_on_the_broken_code_and_passes_on_the_fixed_code(certificates, name, pytester, monkeypatch):
    spec, _, _, fixed = BROKEN[name]
    target = pytester.path / f"test_regression_{name}.py"
    assert cli.main(["regression", str(certificates[name]), "-o", str(target)]) == 0
    monkeypatch.delenv(regression.ENVIRONMENT_VARIABLE, raising=False)
    broken = _run_file(pytester, monkeypatch, target, spec)
    broken.assert_outcomes(failed=1)
    broken.stdout.fnmatch_lines(["*fails at d=*first diverging step*"])
    for other in (fixed, "reference_impl"):
        monkeypatch.setenv(regression.ENVIRONMENT_VARIABLE, other)
        _run_file(pytester, monkeypatch, target, other).assert_outcomes(passed=1)


def _run_file(pytester, monkeypatch, target, spec):
    """The regression file replayed on `spec`: on a torch optimizer in its own interpreter
    (tests/test_pytest_plugin.py in_subprocess says why), on a NumPy step in this one."""
    if not spec.startswith("torch:"):
        return pytester.runpytest_inprocess(str(target), "-p", "no:cacheprovider")
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(ROOT), str(ROOT / "tests"), os.environ.get("PYTHONPATH", "")]))
    return pytester.runpytest_subprocess(str(target), "-p", "no:cacheprovider")


def test_regression_refuses_a_certificate_without_counterexample(tmp_path, capsys):
    code, _, _ = run_main(capsys, "run", "P1", "--profile", "quick", "--optimizer", "reference_impl", "--out", str(tmp_path))
    assert code == 0
    code, _, err = run_main(capsys, "regression", str(tmp_path / "P1.json"), "-o", str(tmp_path / "test_r.py"))
    assert code == 2 and "no minimal counterexample" in err and len(err.strip().splitlines()) == 1


def test_the_reference_has_no_counterexample_and_replays_clean():
    from certify.outside import adapters

    variant = adapters.resolve("reference_impl")
    start = counterexample.Case("P1", "W", 2, 1, 0, 3, "fresh", "gaussian", 0, 0.4, (0.9, 0.999), 0.0, 0.1, 0.0, 0)
    assert counterexample.shrink(variant, start) is None
    assert not counterexample.replay(variant, start).fails


def test_a_warm_case_is_refused_for_a_black_box():
    from certify.outside import adapters

    variant = adapters.resolve("numpy:adapter_fakes:opaque")
    warm = counterexample.Case("P1", "W", 2, 1, 0, 1, "warm", "gaussian", 0, 1.0, (0.9, 0.999), 1e-8, 0.5, 0.0, 0)
    with pytest.raises(ValueError, match="black box"):
        counterexample.replay(variant, warm)
    with pytest.raises(ValueError, match="trajectory_model_m"):
        counterexample.replay(variant, counterexample.Case(**{**warm.__dict__, "start": "fresh", "quantity": "m"}))


def test_shrinking_reaches_the_smallest_shape_the_mistake_needs():
    """projection_no_sym is right for r = 1 (W^T G is a scalar there): the search stops at r = 2."""
    from certify.outside import adapters

    variant = adapters.resolve("numpy:broken_impls:projection_no_sym")
    start = counterexample.Case("P1", "W", 8, 3, 2, 8, "warm", "gaussian", 5, 1.0, (0.5, 0.9), 1e-8, 0.5, 0.1, 3)
    case, outcome = counterexample.shrink(variant, start)
    assert (case.d, case.r, case.batch, case.steps, case.start) == (2, 2, 0, 1, "fresh")
    assert outcome.fails and not math.isinf(outcome.residual)


@pytest.mark.parametrize("spec, quantity, stage", [
    ("numpy:broken_impls:eps_inside_sqrt", "W", "direction"),
    ("numpy:broken_impls:untransported", "m", "transport"),
    ("numpy:broken_impls:bias_from_step_2:black_box", "W", "moments, bias correction or transport"),
    ("numpy:reference_impl.controls:fixed_step_sgd_step", "W", "moments"),  # no moments at all: the direction is right
])
def test_the_other_stages_are_named(spec, quantity, stage):
    """Stage 6 (eps) and the transport, and what a black box's hidden moments leave open."""
    from certify.outside import adapters

    check = {"name": f"trajectory_model_{quantity}[x]", "passed": False, "worst_case": {}}
    found = counterexample.minimal_counterexample(adapters.resolve(spec), {"id": "P1", "provenance": {"seed": 0}, "numerical": {"checks": [check]}})
    assert found["found"] and found["stage"] == stage, found["stage_evidence"]
    assert found["parameters"]["d"] * found["parameters"]["r"] <= 8 and found["parameters"]["steps"] <= 3


def test_verify_reproduces_the_counterexample_and_notices_a_different_one(certificates, capsys, tmp_path):
    from certify import certificate as certificate_format

    code, out, _ = run_main(capsys, "verify", str(certificates["cap"]))
    assert code == 1 and "reproduced" in out and "minimal counterexample" not in out
    doctored = json.loads(certificates["cap"].read_text())
    doctored["extra"]["counterexample"]["stage"] = "retraction"
    path = certificate_format.write(certificate_format.seal(doctored), tmp_path / "P1.json")
    code, out, _ = run_main(capsys, "verify", str(path))
    assert code == 1 and "minimal counterexample: stage 'retraction' recorded, 'cap' reproduced" in out
