"""docs/ci.md end to end, as a user's CI would run it: the example project (examples/ci_project: a
NumPy step and a torch optimizer) passes; broken once, its plugin tests fail with a minimal
counterexample naming the broken stage, `certify run` records it, the regression file written from
the certificate fails; fixed, both pass. Then the user-facing rough edges of outside implementations:
a module in the current directory imports without PYTHONPATH, `certify verify` says in one line
that the implementation cannot be used, `certify compare` writes to a fresh folder."""

from __future__ import annotations

import importlib.metadata
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from certify.ci import regression
from certify_fakes import run_main

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "ci_project"
# the one mistake docs/ci.md makes: v without its 1 / (d r) (stage 4)
CORRECT_LINE = "v = beta2 * state.v + (1 - beta2) * np.sum(g * g, axis=(-2, -1)) / (d * r)"
BROKEN_LINE = "v = beta2 * state.v + (1 - beta2) * np.sum(g * g, axis=(-2, -1))"


def _plugin_arguments() -> list[str]:
    installed = any(entry.value == "certify.ci.pytest_plugin" for entry in importlib.metadata.entry_points(group="pytest11"))
    return [] if installed else ["-p", "certify.ci.pytest_plugin"]


def _certify_command() -> list[str]:
    """The console script beside this interpreter (its sys.path starts at bin/, not at the current directory)."""
    script = Path(sys.executable).with_name("certify")
    return [str(script)] if script.exists() else [sys.executable, "-m", "certify"]


def _run(command: list[str], cwd: Path) -> subprocess.CompletedProcess:
    env = {key: value for key, value in os.environ.items() if key != regression.ENVIRONMENT_VARIABLE}
    env.update(PYTHONPATH=str(ROOT), CI="1", MPLBACKEND="Agg")
    return subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True, timeout=600)


def _pytest(project: Path, *paths: str) -> subprocess.CompletedProcess:
    return _run([sys.executable, "-m", "pytest", *_plugin_arguments(), "-q", "-p", "no:cacheprovider", *paths], project)


def test_the_ci_example_fails_with_a_counterexample_when_broken_and_passes_when_fixed(tmp_path):
    pytest.importorskip("torch")
    project = tmp_path / "project"
    shutil.copytree(EXAMPLE, project)
    step_file = project / "mystep.py"
    correct = step_file.read_text()
    assert CORRECT_LINE in correct
    assert _pytest(project).returncode == 0

    step_file.write_text(correct.replace(CORRECT_LINE, BROKEN_LINE))
    failing = _pytest(project)
    assert failing.returncode == 1, failing.stdout + failing.stderr
    assert "2 failed, 4 passed" in failing.stdout
    assert "numpy:mystep:init,step fails P1; minimal counterexample:" in failing.stdout
    assert "P1 trajectory_model_W fails at d=2, r=1, a bare frame, one step" in failing.stdout
    assert "first stage that differs: moments (stages 3-4)" in failing.stdout
    for line in _documented_block("certify: numpy:mystep:init,step fails P1"):
        assert line.strip() in failing.stdout, f"docs/ci.md shows {line.strip()!r}, which pytest did not print"

    run = _run([*_certify_command(), "run", "P1", "--implementation", "mystep:init,step", "--profile", "quick", "--out", "certificates"], project)
    assert run.returncode == 1 and "minimal counterexample:" in run.stdout, run.stdout + run.stderr
    written = _run([*_certify_command(), "regression", "certificates/P1.json", "-o", "tests/test_regressions.py"], project)
    assert written.returncode == 0, written.stderr
    replayed = _pytest(project, "tests/test_regressions.py")
    assert replayed.returncode == 1 and "1 failed" in replayed.stdout, replayed.stdout
    documented = re.search(r"# fails: (step 1, residual \S+ > bound \S+)", DOCS.read_text()).group(1)
    assert documented in replayed.stdout, f"docs/ci.md says the regression file fails with {documented!r}"

    step_file.write_text(correct)
    fixed = _pytest(project)
    assert fixed.returncode == 0 and "7 passed" in fixed.stdout, fixed.stdout + fixed.stderr


DOCS = Path(__file__).resolve().parent.parent / "docs" / "ci.md"


def _documented_block(first_line: str) -> list[str]:
    """The lines of the text block of docs/ci.md that starts with first_line (what the docs show pytest printing)."""
    text = DOCS.read_text()
    start = text.index(first_line)
    return text[start:text.index("```", start)].strip().splitlines()


# the float32 port (mystep32.py) with the bias correction of v^ taken from beta1 (stage 5)
CORRECT_32 = "m_hat, v_hat = m / F(1 - beta1**t), v / F(1 - beta2**t)"
BROKEN_32 = "m_hat, v_hat = m / F(1 - beta1**t), v / F(1 - beta1**t)"


def test_a_float32_step_is_held_to_float32_and_its_typo_is_named_as_in_float64(tmp_path):
    """The plugin, `certify run` and the regression file hold a float32 step to the analysis of
    float32 (kit/precision.py), one rule whoever asks: the correct port passes; with a typo in stage 5
    the plugin fails naming stages 3-5 (the port's own state type makes it a black box, whose first
    step cannot tell a beta swapped in stage 4 from one in stage 5), as it names the float64 twin,
    the regression file written
    from the certificate fails, and after the fix both pass."""
    project = tmp_path / "project"
    shutil.copytree(EXAMPLE, project)
    step_file = project / "mystep32.py"
    correct = step_file.read_text()
    assert CORRECT_32 in correct
    passing = _pytest(project, "-k", "float32")
    assert passing.returncode == 0 and "2 passed" in passing.stdout, passing.stdout + passing.stderr

    step_file.write_text(correct.replace(CORRECT_32, BROKEN_32))
    failing = _pytest(project, "-k", "float32")
    assert failing.returncode == 1 and "2 failed" in failing.stdout, failing.stdout + failing.stderr
    assert "numpy:mystep32:init,step fails P1; minimal counterexample:" in failing.stdout
    assert "first stage that differs: moments or bias correction (stages 3-5)" in failing.stdout
    assert "at float32" in failing.stdout  # the probe's tolerance at the step's own precision

    run = _run([*_certify_command(), "run", "P1", "--implementation", "mystep32:init,step", "--profile", "quick", "--out", "certificates"], project)
    assert run.returncode == 1 and "minimal counterexample:" in run.stdout, run.stdout + run.stderr
    written = _run([*_certify_command(), "regression", "certificates/P1.json", "-o", "tests/test_regressions.py"], project)
    assert written.returncode == 0, written.stderr
    replayed = _pytest(project, "tests/test_regressions.py")
    assert replayed.returncode == 1 and "1 failed" in replayed.stdout and "moments or bias correction (stages 3-5)" in replayed.stdout, replayed.stdout

    step_file.write_text(correct)
    fixed = _pytest(project, "tests/test_regressions.py")
    assert fixed.returncode == 0 and "1 passed" in fixed.stdout, fixed.stdout + fixed.stderr


def test_verify_says_in_one_line_that_the_implementation_cannot_be_used(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "vanishing_step.py").write_text("from reference_impl import step\n")
    monkeypatch.setattr(sys, "path", [entry for entry in sys.path if entry not in ("", ".", str(tmp_path))])
    code, out, _ = run_main(capsys, "run", "P1", "--implementation", "vanishing_step:step", "--profile", "quick", "--out", "out")
    assert code == 0, out
    (tmp_path / "vanishing_step.py").unlink()
    monkeypatch.delitem(sys.modules, "vanishing_step")
    code, out, _ = run_main(capsys, "verify", "out/P1.json")
    lines = [line for line in out.splitlines() if "vanishing_step" in line]
    assert code == 1 and len(lines) == 1
    assert "not re-run: the implementation cannot be used here" in lines[0] and "does not import" in lines[0]
    assert "DIFFERS" not in out


def test_compare_writes_to_a_fresh_folder_unless_out_names_one(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    code, out, _ = run_main(capsys, "compare", "fixed_step_sgd")
    assert code == 1
    folders = sorted(tmp_path.glob("compare-*"))
    assert len(folders) == 1 and (folders[0] / "REPORT.md").exists() and not (tmp_path / "reports").exists()
    assert f"report: {folders[0].name}/REPORT.md" in out
