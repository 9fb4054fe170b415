"""What a new user meets first: documented commands that must run, an --out that cannot be written,
digests that must not depend on the working tree, and certificates that name the precision their
numbers were computed in.

These run the real claims (at the quick profile, on small claims) through the console script or
cli.main, as a user would.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from certify import certificate as certificate_format
from certify import claims, cli
from certify_fakes import run_main

PROJECT_ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture
def in_tmp(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    return tmp_path


# --------------------------------------------------------------------------------------------
# --properties without --out: a fresh folder, not a NameError
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("argv", [
    ["compare", "--properties", "qr_retraction"],
    ["run", "P4", "--properties", "--optimizer", "qr_retraction"],
])
def test_properties_without_out_write_a_fresh_folder(in_tmp, capsys, argv):
    code, out, err = run_main(capsys, *argv)
    assert "internal error" not in err
    assert code == 1, err  # qr_retraction breaks the right O(r) action: a property fails
    folders = [path for path in in_tmp.iterdir() if path.name.startswith("properties-")]
    assert len(folders) == 1, sorted(p.name for p in in_tmp.iterdir())
    assert (folders[0] / "REPORT.md").is_file()
    assert list((folders[0] / "properties").rglob("*.json"))


# --------------------------------------------------------------------------------------------
# An --out that cannot be written is refused before any work
# --------------------------------------------------------------------------------------------


def _unwritable_directory() -> str:
    """An existing directory that nobody, root included, can create files in (procfs)."""
    path = "/proc/self"
    assert os.path.isdir(path)
    return path


@pytest.mark.parametrize("argv", [
    ["run", "P1"],
    ["all"],
    ["compare", "reference_impl"],
    ["compare", "--properties", "qr_retraction"],
    ["crosscheck"],
])
def test_an_unwritable_out_is_refused_in_one_line_before_anything_runs(capsys, argv):
    started = time.perf_counter()
    code, out, err = run_main(capsys, *argv, "--out", _unwritable_directory(), "--profile", "quick") if "--properties" not in argv else \
        run_main(capsys, *argv, "--out", _unwritable_directory())
    seconds = time.perf_counter() - started
    lines = [line for line in err.splitlines() if line.strip()]
    assert code == 2 and len(lines) == 1, err
    assert lines[0].startswith(f"certify: error: --out {_unwritable_directory()}: no file can be created in {_unwritable_directory()}")
    assert "running" not in out and "passed" not in out, out
    assert seconds < 30  # refused before the claims: a real run of `all` takes longer than this


def test_an_unwritable_verify_report_is_refused_before_the_re_run(capsys, tmp_path):
    certificate = PROJECT_ROOT / "reports" / "P6.json"
    code, out, err = run_main(capsys, "verify", str(certificate), "--report", f"{_unwritable_directory()}/verification.md")
    assert code == 2 and "no file can be created" in err
    assert "re-running" not in out


def test_an_out_below_a_file_is_refused(capsys, tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("x")
    code, _, err = run_main(capsys, "run", "P1", "--out", str(blocker / "sub"), "--profile", "quick")
    assert code == 2 and "cannot be created" in err


# --------------------------------------------------------------------------------------------
# Digests do not depend on the working tree's state
# --------------------------------------------------------------------------------------------


def _project_copy(target: Path) -> None:
    """The project's code and its committed reports/ in a fresh git repository of their own (the
    working tree as it is now, committed there, so the copy is clean before the first run)."""
    for name in ("certify", "propositions", "reference_impl", "torch_impl"):
        shutil.copytree(PROJECT_ROOT / name, target / name)
    (target / "reports").mkdir()
    for name in ("P1.json", "P5.json"):
        shutil.copy(PROJECT_ROOT / "reports" / name, target / "reports" / name)
    shutil.copy(PROJECT_ROOT / "pyproject.toml", target / "pyproject.toml")
    environment = {**os.environ, "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t", "GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@t"}
    for command in (["git", "init", "-q"], ["git", "add", "-A"], ["git", "commit", "-q", "-m", "copy"]):
        subprocess.run(command, cwd=target, check=True, env=environment, capture_output=True)


def test_two_identical_runs_into_a_tracked_reports_give_the_same_digests(tmp_path):
    """The first run's certificates make the tracked reports/ dirty part-way through; the second run
    starts dirty. The digests must not see it: the tree's state is read once, before anything is
    written, and kept in the run record, outside the digest. (Before, each run sealed the state it
    read when it made its first certificate, in each process: clean in the first run, dirty in the
    second.)"""
    _project_copy(tmp_path)
    environment = {**os.environ, "PYTHONPATH": str(tmp_path), "MPLBACKEND": "Agg"}
    digests, clean = [], []
    for _ in range(2):
        completed = subprocess.run([sys.executable, "-m", "certify", "run", "P1", "P5", "--seed", "0", "--profile", "quick", "--workers", "1"],
                                   cwd=tmp_path, env=environment, capture_output=True, text=True, timeout=300)
        assert completed.returncode == 0, completed.stdout + completed.stderr
        loaded = [certificate_format.load(tmp_path / "reports" / f"{claim_id}.json") for claim_id in ("P1", "P5")]
        assert all(c["provenance"]["git_commit"] for c in loaded)  # the copy's own commit: the code ran from there
        digests.append([c["digest"]["value"] for c in loaded])
        clean.append([c["run"].get("git_tree_clean") for c in loaded])
    assert digests[0] == digests[1]
    assert clean == [[True, True], [False, False]]  # each run read the tree once, as it found it


# --------------------------------------------------------------------------------------------
# The precision, named where the numbers are
# --------------------------------------------------------------------------------------------


def test_a_float32_implementation_is_certified_in_float32_everywhere_it_is_named(capsys, tmp_path):
    code, out, err = run_main(capsys, "run", "P4", "--optimizer", "torch_impl-float32", "--profile", "quick", "--out", str(tmp_path), "--workers", "1")
    assert code == 0, out + err
    certificate = certificate_format.load(tmp_path / "P4.json")
    assert certificate["numerical"]["dtype"] == "float32"
    under_test = [part for part in certificate["numerical"]["precision"] if part["role"] == "under test"]
    assert under_test and all(part["dtypes"] == ["float32"] for part in under_test)
    report = (tmp_path / "REPORT.md").read_text()
    assert "pass, in float32" in report and "| pass | float32 |" in report
    assert "32 frames, float64" not in report and "float64, seed" not in report
    code, out, _ = run_main(capsys, "cite", str(tmp_path / "P4.json"))
    assert code == 0 and ": pass in float32, sha256" in out


@pytest.mark.parametrize("claim_id, options, expected", [
    ("optimizer", {}, "float64, float32, bfloat16"),
    ("crosscheck", {"device": "cpu", "dtype": "float32"}, "float32, float64, bfloat16"),
    ("samplers", {}, "float64, float32, bfloat16"),
    ("projection", {}, "float64, float32"),
    ("P1", {}, "float64"),
])
def test_each_claim_names_the_dtypes_it_computes_in(claim_id, options, expected):
    claim = claims.lookup_claim(claim_id)
    parts = claims.precision_parts(claim, options, {})
    named = ", ".join(dict.fromkeys(d for part in parts if part["role"] == "under test" for d in part["dtypes"]))
    assert named == expected
    assert all(d in claims.DTYPE_ORDER for part in parts for d in part["dtypes"])


# --------------------------------------------------------------------------------------------
# README's statement about running without torch
# --------------------------------------------------------------------------------------------


def test_readme_names_exactly_the_claims_that_need_torch():
    """README says which claims `certify all` skips without torch; the claims' own declarations say
    which need it. The two lists must be the same."""
    import re

    needing = {claim_id for claim_id in claims.ALL_IDS if "torch" in claims.lookup_claim(claim_id).requires}
    text = (PROJECT_ROOT / "README.md").read_text()
    found = re.search(r"Without torch,\s+`certify all`\s+skips (.+?) \(", text, re.S)
    assert found, "README has no sentence on what runs without torch"
    named = set(re.findall(r"`([A-Za-z0-9_]+)`", found.group(1)))
    assert named == needing
