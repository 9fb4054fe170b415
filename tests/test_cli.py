"""The certify command line: exit codes, messages, verify, cite, crosscheck options.

Claims here are fakes injected through certify.claims.lookup_claim, so these tests do not depend on
the proposition modules. A fake's residuals come from its seed, so a re-run reproduces them.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from certify import certificate as certificate_format
from certify import claims, cli, environment, report
from propositions._common import ClaimResult, ControlResult, NumericalCheck, SymbolicResult, SymbolicStep
from certify_fakes import FakeClaim, run_main

PROJECT_ROOT = Path(__file__).resolve().parent.parent
DRAWING_FIGURE_LOADER = report.load_figure_class


def fake_result(seed: int, passing: bool, options: dict | None = None) -> ClaimResult:
    """A small ClaimResult with known data; passing=False puts one residual at 5x its bound."""
    rng = np.random.default_rng(seed)
    check = NumericalCheck("fake_identity", "A(x) against B(x)", "n u with n = 8")
    residual = rng.uniform(0.0, 1e-16, 200)
    if not passing:
        residual[17] = 5e-15
    check.add(residual, 1e-15, shape=(4, 2), key=("fake", 4, 2), seed=seed)
    broken = NumericalCheck("fake_identity", "A(x) against a broken B(x)", "n u with n = 8")
    broken.add(rng.uniform(1e-3, 1e-2, 50), 1e-15, shape=(4, 2), key=("fake-control", 4, 2), seed=seed)
    control = ControlResult.from_checks("qr_retraction", "a broken variant", [broken])
    symbolic = SymbolicResult("sympy", [SymbolicStep("P_W(W) = 0", r"W - W\,\mathrm{sym}(W^T W) = 0", True)])
    return ClaimResult(
        symbolic=symbolic,
        checks=[check],
        controls=[control],
        frames=200,
        exact=[{"name": "fake_exact", "description": "exact in rationals", "samples": 3, "passed": True}],
        extra={"options": dict(options or {})},
        figures={"drift": {"x": [1, 10, 100], "y": [1e-16, 2e-16, 4e-16], "logx": True, "logy": True, "xlabel": "steps"}},
        notes=["a fake claim"],
    )


def make_claim(claim_id: str, passing: bool = True) -> FakeClaim:
    def run(seed, profile, optimizer="stiefel_adam", **options):
        return fake_result(seed, passing and optimizer == "stiefel_adam", options)

    # a fake declares what the real claim does: the cross-check (and every claim that drives torch)
    # needs torch, and the cross-check runs on cpu/float64
    torch_claim = "torch" in claims.lookup_claim(claim_id).requires
    return FakeClaim(
        claim_id, f"fake claim {claim_id}", f"statement of {claim_id}", r"\forall W: f(W) = 0", ("qr_retraction",), run,
        requires=("torch",) if torch_claim else (),
        default_options=tuple(claims.DEFAULT_CROSSCHECK_OPTIONS.items()) if claim_id == claims.CROSSCHECK_ID else (),
    )


@pytest.fixture
def registry(monkeypatch):
    """A dict id -> Claim (or an exception to raise on lookup) that certify will use."""
    table: dict = {claim_id: make_claim(claim_id) for claim_id in claims.ALL_IDS}

    def lookup(claim_id):
        entry = table[claim_id]
        if isinstance(entry, BaseException):
            raise entry
        return entry

    monkeypatch.setattr(claims, "lookup_claim", lookup)
    monkeypatch.setattr(claims, "torch_available", lambda: False)
    monkeypatch.setattr(claims, "cuda_available", lambda: False)
    monkeypatch.setattr(claims, "torch_environment", lambda device: {"version": "fake", "device": device})
    # drawing is slow and is tested in test_report.py; one test below draws through the CLI
    monkeypatch.setattr(report, "load_figure_class", lambda: None)
    return table



def error_of(err: str) -> str:
    """The single stderr line of an error, checked to be one line."""
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1, err
    assert lines[0].startswith("certify: error: ")
    return lines[0]


# --- exit codes of run / all ---------------------------------------------------------------


def test_run_passing_claim_exits_0_and_writes_certificate_and_report(registry, capsys, tmp_path):
    code, out, err = run_main(capsys, "run", "p1", "--out", str(tmp_path), "--seed", "3", "--profile", "quick")
    assert code == 0, out + err
    certificate = certificate_format.load(tmp_path / "P1.json")
    assert certificate["verdict"] == "pass"
    assert certificate["provenance"]["seed"] == 3 and certificate["provenance"]["profile"] == "quick"
    assert certificate["run"]["command"] == "certify run p1 --out " + str(tmp_path) + " --seed 3 --profile quick"
    assert certificate["provenance"]["reproduce"] == "certify run P1 --seed 3 --profile quick"
    assert certificate["statement"]["docs"] == "docs/claims.md#p1"
    assert "docs/claims.md of stiefel-adam-certify" in (tmp_path / "REPORT.md").read_text()  # outside the checkout: named, not linked


def test_run_failing_claim_exits_1(registry, capsys, tmp_path):
    registry["P2"] = make_claim("P2", passing=False)
    code, out, _ = run_main(capsys, "run", "P1", "P2", "--out", str(tmp_path), "--profile", "quick")
    assert code == 1
    assert json.loads((tmp_path / "P2.json").read_text())["verdict"] == "fail"
    assert "worst residual/bound = 5" in out


def test_run_against_a_control_variant_fails(registry, capsys, tmp_path):
    code, _, _ = run_main(capsys, "run", "P1", "--out", str(tmp_path), "--profile", "quick", "--optimizer", "qr_retraction")
    assert code == 1
    assert certificate_format.load(tmp_path / "P1.json")["provenance"]["reproduce"].endswith("--optimizer qr_retraction")


def test_run_of_another_optimizer_without_out_writes_a_fresh_folder_not_reports(registry, capsys, tmp_path, monkeypatch):
    """Only the reference's own run writes reports/: a variant's certificates (a fail, here) go to a
    fresh run-<UTC time> folder unless --out names one, so the committed reports stay as they were."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "reports").mkdir()
    (tmp_path / "reports" / "P1.json").write_text("the reference's certificate", encoding="utf-8")
    code, out, _ = run_main(capsys, "run", "P1", "--profile", "quick", "--optimizer", "qr_retraction")
    assert code == 1
    assert (tmp_path / "reports" / "P1.json").read_text(encoding="utf-8") == "the reference's certificate"
    folders = sorted(tmp_path.glob("run-*"))
    assert len(folders) == 1 and certificate_format.load(folders[0] / "P1.json")["verdict"] == "fail"
    assert f"report: {folders[0].name}/REPORT.md" in out
    code, _, _ = run_main(capsys, "run", "P1", "--profile", "quick")  # the reference's own run: reports/
    assert code == 0 and certificate_format.load(tmp_path / "reports" / "P1.json")["verdict"] == "pass"


def test_all_runs_every_proposition_and_skips_crosscheck_without_torch(registry, capsys, tmp_path, monkeypatch):
    monkeypatch.setattr(report, "load_figure_class", DRAWING_FIGURE_LOADER)
    code, out, err = run_main(capsys, "all", "--out", str(tmp_path), "--profile", "quick")
    assert code == 0, out + err
    # every discovered claim that needs no optional package: P1..P6, the sampler and projection certificates
    assert sorted(p.name for p in tmp_path.glob("*.json")) == sorted(f"{claim_id}.json" for claim_id in claims.PROPOSITION_IDS)
    assert {f"P{i}" for i in range(1, 7)} | {"samplers", "projection"} == set(claims.PROPOSITION_IDS)
    assert "crosscheck skipped: torch not installed" in out
    report_text = (tmp_path / "REPORT.md").read_text()
    assert "crosscheck skipped: torch not installed" in report_text
    for claim_id in claims.PROPOSITION_IDS:
        assert f"](figures/{claim_id}_residual_over_bound.png)" in report_text
        assert (tmp_path / "figures" / f"{claim_id}_residual_over_bound.png").stat().st_size > 0
        assert (tmp_path / "figures" / f"{claim_id}_drift.png").is_file()


def test_all_includes_crosscheck_when_torch_imports(registry, capsys, tmp_path, monkeypatch):
    monkeypatch.setattr(claims, "torch_available", lambda: True)
    code, _, _ = run_main(capsys, "all", "--out", str(tmp_path), "--profile", "quick")
    assert code == 0
    crosscheck = certificate_format.load(tmp_path / "crosscheck.json")
    assert crosscheck["provenance"]["options"] == {"device": "cpu", "dtype": "float64"}
    assert crosscheck["environment"]["torch"] == {"version": "fake", "device": "cpu"}


def test_claim_that_cannot_be_imported_is_inconclusive_not_a_traceback(registry, capsys, tmp_path):
    registry["P3"] = ModuleNotFoundError("No module named 'propositions.p3_conditioning'")
    code, out, _ = run_main(capsys, "all", "--out", str(tmp_path), "--profile", "quick")
    assert code == 1
    certificate = certificate_format.load(tmp_path / "P3.json")
    assert certificate["verdict"] == "inconclusive"
    assert "could not be loaded: ModuleNotFoundError" in certificate["inconclusive"][0]
    assert certificate_format.load(tmp_path / "P4.json")["verdict"] == "pass"


def test_claim_that_raises_is_inconclusive(registry, capsys, tmp_path):
    def broken(seed, profile, optimizer="stiefel_adam"):
        raise ZeroDivisionError("division by zero")

    registry["P4"] = FakeClaim("P4", "broken", "s", "l", (), broken)
    code, out, _ = run_main(capsys, "run", "P4", "--out", str(tmp_path))
    assert code == 1
    certificate = certificate_format.load(tmp_path / "P4.json")
    assert certificate["verdict"] == "inconclusive"
    assert "raised while it ran: ZeroDivisionError: division by zero" in certificate["inconclusive"][0]


def test_result_that_breaks_the_schema_is_an_internal_error_reported_clearly(registry, capsys, tmp_path):
    class BadResult:
        def to_dict(self):
            data = fake_result(0, True).to_dict()
            data["numerical"]["checks"][0]["passed"] = "yes"  # not a boolean
            return data

    registry["P5"] = FakeClaim("P5", "bad", "s", "l", (), lambda seed, profile, optimizer="stiefel_adam": BadResult())
    code, _, err = run_main(capsys, "run", "P5", "--out", str(tmp_path))
    assert code == 1
    assert "P5: internal error: SchemaViolation: certificate P5 does not match the schema" in err
    assert certificate_format.load(tmp_path / "P5.json")["verdict"] == "inconclusive"


def test_pass_without_controls_is_inconclusive(registry, capsys, tmp_path):
    def no_controls(seed, profile, optimizer="stiefel_adam"):
        result = fake_result(seed, True)
        result.controls = []
        return result

    registry["P6"] = FakeClaim("P6", "uncontrolled", "s", "l", (), no_controls)
    code, _, _ = run_main(capsys, "run", "P6", "--out", str(tmp_path))
    assert code == 1
    assert certificate_format.load(tmp_path / "P6.json")["verdict"] == "inconclusive"


# --- usage and input errors: exit 2, one line -----------------------------------------------


@pytest.mark.parametrize(
    "argv, expected",
    [
        (["run", "P9"], "unknown claim id 'P9'"),
        (["run", "P1", "--profile", "fast"], "invalid choice: 'fast'"),
        (["run", "P1", "--seed", "-1"], "seed must be a non-negative integer"),
        (["run", "P1", "--seed", "abc"], "seed must be a non-negative integer"),
        (["run", "P1", "--optimizer", "sgd"], "unknown optimizer variant 'sgd'"),
        (["frobnicate"], "invalid choice: 'frobnicate'"),
        ([], "the following arguments are required"),
        (["crosscheck", "--dtype", "float16"], "invalid choice: 'float16'"),
        (["run", "crosscheck"], "crosscheck needs torch, which is not installed"),
    ],
)
def test_usage_errors_exit_2_with_one_line(registry, capsys, tmp_path, argv, expected):
    code, out, err = run_main(capsys, *argv)
    assert code == 2
    assert expected in error_of(err)


def test_crosscheck_on_cuda_without_cuda_exits_2(registry, capsys, monkeypatch):
    monkeypatch.setattr(claims, "torch_available", lambda: True)
    code, _, err = run_main(capsys, "crosscheck", "--device", "cuda")
    assert code == 2
    assert "CUDA is not available" in error_of(err)


def test_crosscheck_passes_device_and_dtype_to_the_claim(registry, capsys, tmp_path, monkeypatch):
    monkeypatch.setattr(claims, "torch_available", lambda: True)
    code, _, _ = run_main(capsys, "crosscheck", "--dtype", "float32", "--out", str(tmp_path))
    assert code == 0
    certificate = certificate_format.load(tmp_path / "crosscheck.json")
    assert certificate["extra"]["options"] == {"device": "cpu", "dtype": "float32"}
    assert certificate["provenance"]["reproduce"] == "certify crosscheck --device cpu --dtype float32 --seed 0 --profile default"


def test_out_that_is_a_file_exits_2(registry, capsys, tmp_path):
    target = tmp_path / "file"
    target.write_text("x")
    code, _, err = run_main(capsys, "run", "P1", "--out", str(target))
    assert code == 2 and "is not a directory" in error_of(err)


@pytest.fixture
def certified(registry, capsys, tmp_path):
    """Path of a passing P1 certificate written by `certify run`."""
    assert cli.main(["run", "P1", "--out", str(tmp_path), "--seed", "7", "--profile", "quick"]) == 0
    capsys.readouterr()
    return tmp_path / "P1.json"


def _rewrite(path: Path, change, reseal: bool) -> None:
    certificate = json.loads(path.read_text())
    change(certificate)
    if reseal:
        certificate = certificate_format.seal(certificate)
    path.write_text(json.dumps(certificate))


@pytest.mark.parametrize("command", ["verify", "cite"])
def test_bad_certificate_files_exit_2(certified, capsys, tmp_path, command):
    missing = tmp_path / "missing.json"
    code, _, err = run_main(capsys, command, str(missing))
    assert code == 2 and "no such file" in error_of(err)

    code, _, err = run_main(capsys, command, str(tmp_path))
    assert code == 2 and "is a directory" in error_of(err)

    malformed = tmp_path / "malformed.json"
    malformed.write_text('{"schema_version": "1.0", ')
    code, _, err = run_main(capsys, command, str(malformed))
    assert code == 2 and "not valid JSON" in error_of(err)

    array = tmp_path / "array.json"
    array.write_text("[1, 2]")
    code, _, err = run_main(capsys, command, str(array))
    assert code == 2 and "a JSON object was expected" in error_of(err)

    _rewrite(certified, lambda c: c.update(schema_version="0.9"), reseal=True)
    code, _, err = run_main(capsys, command, str(certified))
    assert code == 2 and "schema version '0.9'" in error_of(err)


def test_tampered_certificate_is_rejected_by_digest(certified, capsys):
    _rewrite(certified, lambda c: c["numerical"]["checks"][0]["residual"].update(max=0.0), reseal=False)
    for command in ("verify", "cite"):
        code, out, err = run_main(capsys, command, str(certified))
        assert code == 2
        assert "digest mismatch" in error_of(err)
        assert "reproduced" not in out


def test_resealed_certificate_that_breaks_the_schema_exits_2(certified, capsys):
    _rewrite(certified, lambda c: c.update(verdict="probably"), reseal=True)
    code, _, err = run_main(capsys, "verify", str(certified))
    assert code == 2 and "does not match the certificate schema" in error_of(err)


# --- verify and cite ------------------------------------------------------------------------


def test_verify_round_trip_reproduces_bit_for_bit(certified, capsys):
    code, out, err = run_main(capsys, "verify", str(certified))
    assert code == 0, out + err
    assert f"[1/1] {certified}: digest ok; re-running P1 (certify run P1 --seed 7 --profile quick)" in out
    assert "reproduced: verdict pass, 1 checks and 1 controls agree" in out
    assert "matches the recorded one: residuals must reproduce bit for bit" in out
    assert "reproduced bit for bit" in out
    recorded = json.loads(certified.read_text())
    residual = recorded["numerical"]["checks"][0]["residual"]["max"]
    row = next(line for line in out.splitlines() if line.startswith("fake_identity "))
    assert row.split() == ["fake_identity", f"{residual:.4g}", f"{residual:.4g}", "1e-15", f"{recorded['numerical']['checks'][0]['max_ratio']:.4g}", "yes", "yes"]
    assert next(line for line in out.splitlines() if line.startswith("control qr_retraction ")).split()[-2:] == ["detected", "yes"]


def _as_if_from_another_machine(certificate: dict) -> None:
    """What a machine that rounds differently would have recorded: other bits of one fixed
    computation in a consistent fingerprint, and a worst residual 1.5 times this machine's."""
    fingerprint = certificate["environment"]["rounding_fingerprint"]
    fingerprint["computations"]["numpy.matmul"] = "0" * 64
    fingerprint["sha256"] = environment.fingerprint_digest(fingerprint)
    certificate["numerical"]["checks"][0]["residual"]["max"] *= 1.5


def test_verify_on_a_machine_that_rounds_differently_notes_residuals_and_exits_0(certified, capsys):
    _rewrite(certified, _as_if_from_another_machine, reseal=True)
    code, out, err = run_main(capsys, "verify", str(certified))
    assert code == 0, out + err
    assert "reproduced: verdict pass, 1 checks and 1 controls agree" in out
    assert "(differs in bits of numpy.matmul)" in out
    assert "residuals may differ within their bounds" in out
    assert "largest relative difference 0.333 (check fake_identity)" in out
    assert "every re-run residual is within its bound (all 1 re-run checks passed)" in out
    assert next(line for line in out.splitlines() if line.startswith("fake_identity ")).split()[-1] == "no"
    assert "DIFFERS" not in out


def test_verify_with_the_same_fingerprint_rejects_a_changed_residual(certified, capsys):
    _rewrite(certified, lambda c: c["numerical"]["checks"][0]["residual"].update(max=c["numerical"]["checks"][0]["residual"]["max"] * 1.5), reseal=True)
    code, out, _ = run_main(capsys, "verify", str(certified))
    assert code == 1
    assert "DIFFERS from its re-run: residuals differ in 1 of 2 checks and controls (largest relative difference 0.333 (check fake_identity))" in out
    assert "although the rounding fingerprint matches the recorded one" in out


@pytest.mark.parametrize(
    "doctor, expected",
    [
        (lambda c: c["numerical"]["checks"][0].update(samples=10**6), "check fake_identity: samples 1000000 recorded, 200 reproduced"),
        (lambda c: c["numerical"]["checks"][0].update(shapes=[[1024, 128]]), "check fake_identity: shapes [[1024, 128]] recorded, [[4, 2]] reproduced"),
    ],
)
def test_verify_rejects_a_doctored_certificate_on_any_machine(certified, capsys, doctor, expected):
    def change(certificate):
        _as_if_from_another_machine(certificate)
        doctor(certificate)

    _rewrite(certified, change, reseal=True)
    code, out, _ = run_main(capsys, "verify", str(certified))
    assert code == 1
    assert "DIFFERS from its re-run" in out and expected in out


def test_verify_writes_the_tolerance_report_as_markdown(certified, capsys, tmp_path):
    _rewrite(certified, _as_if_from_another_machine, reseal=True)
    report_file = tmp_path / "verification.md"
    code, out, _ = run_main(capsys, "verify", str(certified), "--report", str(report_file))
    assert code == 0
    assert f"tolerance report: {report_file}" in out
    text = report_file.read_text()
    assert text.startswith("# Verification report\n")
    assert "1 of 1 certificate(s) reproduced" in text
    assert "## P1: fake claim P1" in text and "**reproduced**" in text
    assert "| check / control | recorded residual | re-run residual | re-run bound | re-run ratio | pass | bit-identical |" in text
    assert "| fake_identity |" in text and "| control qr_retraction |" in text
    assert "- note: every re-run residual is within its bound" in text


def test_verify_report_in_a_missing_directory_exits_2_before_any_rerun(certified, capsys, tmp_path):
    code, out, err = run_main(capsys, "verify", str(certified), "--report", str(tmp_path / "no" / "such.md"))
    assert code == 2 and "does not exist" in error_of(err)
    assert "re-running" not in out


def test_verify_on_a_terminal_shows_a_rich_table(certified, capsys, monkeypatch):
    monkeypatch.setenv("FORCE_COLOR", "1")
    monkeypatch.setenv("COLUMNS", "200")
    code, out, _ = run_main(capsys, "verify", str(certified))
    assert code == 0
    assert "┏" in out and "bit-identical" in out and "P1: recorded against re-run" in out
    assert "digest ok; re-ran P1" in out


def test_verify_reports_what_differs(certified, registry, capsys):
    registry["P1"] = make_claim("P1", passing=False)  # the claim now behaves differently
    code, out, _ = run_main(capsys, "verify", str(certified))
    assert code == 1
    assert "DIFFERS from its re-run" in out
    assert "verdict pass recorded, fail reproduced" in out
    assert "check fake_identity: passed True recorded, False reproduced" in out
    assert "largest relative difference" in out
    assert "although the rounding fingerprint matches the recorded one, where the re-run is bit for bit" in out
    row = next(line for line in out.splitlines() if line.startswith("fake_identity "))
    assert row.split()[-4:] == ["yes", "->", "no", "no"]  # passed recorded -> re-run, not bit-identical


def test_verify_of_a_reproduced_failing_certificate_exits_1(registry, capsys, tmp_path):
    registry["P2"] = make_claim("P2", passing=False)
    assert cli.main(["run", "P2", "--out", str(tmp_path), "--profile", "quick"]) == 1
    capsys.readouterr()
    code, out, _ = run_main(capsys, "verify", str(tmp_path / "P2.json"))
    assert code == 1 and "reproduced: verdict fail" in out


def test_verify_ends_with_a_summary_line(registry, capsys, tmp_path):
    registry["P2"] = make_claim("P2", passing=False)
    assert cli.main(["run", "P1", "P2", "--out", str(tmp_path), "--profile", "quick"]) == 1
    capsys.readouterr()
    code, out, _ = run_main(capsys, "verify", str(tmp_path / "P1.json"), str(tmp_path / "P2.json"))
    assert code == 1
    assert out.strip().splitlines()[-1] == "verified 2 certificate(s): 2 reproduced, 0 differing, 1 with a verdict other than pass"
    registry["P1"] = make_claim("P1", passing=False)  # P1 now behaves differently
    code, out, _ = run_main(capsys, "verify", str(tmp_path / "P1.json"))
    assert code == 1 and out.strip().splitlines()[-1] == "verified 1 certificate(s): 0 reproduced, 1 differing, 0 with a verdict other than pass"


def test_cite_is_one_line_with_id_digest_verdict_and_command(certified, capsys):
    code, out, _ = run_main(capsys, "cite", str(certified))
    assert code == 0
    lines = out.strip().splitlines()
    assert len(lines) == 1
    digest = json.loads(certified.read_text())["digest"]["value"]
    assert lines[0].startswith("P1 (fake claim P1): pass in float64, sha256 " + digest[:16])
    assert lines[0].endswith("reproduce: certify run P1 --seed 7 --profile quick")


def test_cite_markdown_and_bibtex(certified, capsys):
    recorded = json.loads(certified.read_text())
    digest = recorded["digest"]["value"]
    code, out, _ = run_main(capsys, "cite", str(certified), "--format", "markdown")
    assert code == 0
    assert out.startswith("**P1: fake claim P1**: statement of P1")
    assert f"Verdict **pass** in float64 · sha256 `{digest}`" in out
    assert "reproduce: `certify run P1 --seed 7 --profile quick`" in out and "[docs/claims.md#p1](docs/claims.md#p1)" in out

    code, out, _ = run_main(capsys, "cite", str(certified), "--format", "bibtex")
    assert code == 0
    lines = out.strip().splitlines()
    assert lines[0] == f"@misc{{stiefel-adam-certify:P1:{digest[:12]}," and lines[-1] == "}"
    assert f"  howpublished = {{certificate P1, verdict pass in float64, sha256 {digest}}}," in lines
    note = next(line for line in lines if line.startswith("  note = "))
    assert "Reproduce: certify run P1 --seed 7 --profile quick" in note
    assert "docs/claims.md\\#p1" in note  # LaTeX's # escaped
    commit = recorded["provenance"]["git_commit"]
    assert commit is None or f"git commit {commit}" in note


def test_list_shows_ids_titles_controls(registry, capsys):
    registry["P6"] = ImportError("broken module")
    code, out, _ = run_main(capsys, "list")
    assert code == 0
    assert "fake claim P1" in out and "qr_retraction" in out
    assert "cannot be loaded: ImportError: broken module" in out
    assert "skipped: torch not installed" in out


def test_help_exits_0(capsys):
    code, out, _ = run_main(capsys, "--help")
    assert code == 0 and "exit codes" in out


def test_console_script_never_prints_a_traceback(tmp_path):
    """Through a real process: unknown id, missing file, malformed file."""
    malformed = tmp_path / "bad.json"
    malformed.write_text("{")
    for argv in (["run", "P0"], ["verify", str(tmp_path / "none.json")], ["cite", str(malformed)]):
        completed = subprocess.run([sys.executable, "-m", "certify", *argv], capture_output=True, text=True, cwd=PROJECT_ROOT, timeout=60)
        assert completed.returncode == 2, completed.stderr
        assert "Traceback" not in completed.stderr
        assert len(completed.stderr.strip().splitlines()) == 1


def test_console_script_output_is_complete_through_a_pipe():
    """console() ends the process without the interpreter's teardown: what main printed is all
    there, and the exit code is main's."""
    console = "import sys; from certify.cli import console; sys.argv[1:] = {!r}; console()"
    completed = subprocess.run([sys.executable, "-c", console.format(["list"])], capture_output=True, text=True, cwd=PROJECT_ROOT, timeout=60)
    assert completed.returncode == 0, completed.stderr
    refused = subprocess.run([sys.executable, "-c", console.format(["run", "P0"])], capture_output=True, text=True, cwd=PROJECT_ROOT, timeout=60)
    assert refused.returncode == 2 and "P0" in refused.stderr
    in_process = subprocess.run([sys.executable, "-c", "import sys; from certify.cli import main; sys.exit(main(['list']))"],
                                capture_output=True, text=True, cwd=PROJECT_ROOT, timeout=60)
    assert completed.stdout == in_process.stdout and completed.stdout.strip()


def test_closed_standard_output_ends_quietly_with_141():
    """`certify list | head -0`: the reader is gone before the first line; no 'internal error', the
    exit code of a pipeline stage stopped by SIGPIPE."""
    console = "import sys; from certify.cli import console; sys.argv[1:] = ['list']; console()"
    child = subprocess.Popen([sys.executable, "-c", console], stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=PROJECT_ROOT)
    child.stdout.close()  # no reader: the first write fails with EPIPE
    _, err = child.communicate(timeout=60)
    assert child.returncode == 141, err
    assert b"internal error" not in err and b"Traceback" not in err


def test_rich_table_and_progress_on_a_terminal(registry, capsys, tmp_path, monkeypatch):
    monkeypatch.setenv("FORCE_COLOR", "1")  # rich then treats stdout as a terminal
    monkeypatch.setenv("COLUMNS", "200")
    code, out, _ = run_main(capsys, "run", "P1", "P2", "--out", str(tmp_path), "--profile", "quick")
    assert code == 0
    assert "┏" in out and "fake claim P2" in out  # a rich table, not plain lines
    assert "P2: pass in" in out


def test_optimizer_option_is_refused_for_crosscheck(capsys):
    code, _, err = run_main(capsys, "run", "crosscheck", "--optimizer", "qr_retraction")
    assert code == 2 and "--optimizer does not apply to crosscheck" in error_of(err)


def test_verify_skips_the_mutation_report_beside_the_certificates(registry, capsys, tmp_path):
    (tmp_path / "mutation.json").write_text(json.dumps({"kind": "mutation-report", "score": 0.5}))
    code, out, err = run_main(capsys, "verify", str(tmp_path / "mutation.json"))
    assert code == 2 and "no certificate among the files given" in error_of(err)
    assert "skipped (a mutation report" in out
    code, _, _ = run_main(capsys, "run", "P1", "--out", str(tmp_path), "--profile", "quick")
    assert code == 0
    code, out, _ = run_main(capsys, "verify", str(tmp_path / "P1.json"), str(tmp_path / "mutation.json"))
    assert code == 0 and "skipped (a mutation report" in out and "reproduced" in out


def _failing_relabelled_pass(certificate):
    """A failing certificate given verdict pass: its first check over its bound and flagged so."""
    check = certificate["numerical"]["checks"][0]
    check.update(max_ratio=3.0, passed=False)
    certificate.update(verdict="pass", failures=[], inconclusive=[])


def _flag_flipped(certificate):
    """A check over its bound whose passed flag still says True."""
    certificate["numerical"]["checks"][0].update(max_ratio=3.0, passed=True)


def _control_relabelled(certificate):
    """A control below the detection factor marked detected."""
    certificate["controls"][0].update(margin=2.0, detected=True)


def _factor_lowered(certificate):
    """A control whose detection factor was lowered until it is detected."""
    certificate["controls"][0].update(margin=2.0, detection_factor=1.0, detected=True)


@pytest.mark.parametrize("command", ["cite", "verify"])
@pytest.mark.parametrize("doctor, expected", [
    (_failing_relabelled_pass, "verdict 'pass', but its own evidence fails (check fake_identity"),
    (_flag_flipped, "check fake_identity says passed=True at worst residual/bound 3"),
    (_control_relabelled, "control qr_retraction says detected=True at margin 2"),
    (_factor_lowered, "detection factor 1, below the project's 10"),
    (lambda c: c["provenance"].update(reproduce="certify run P1 --seed 7 --profile thorough"), "reproduce command 'certify run P1 --seed 7 --profile thorough', but"),
    (lambda c: c["provenance"].update(profile="default"), "provenance.profile 'default' but numerical.profile 'quick'"),
    (lambda c: c.update(verdict="fail"), "verdict 'fail' with no failure recorded"),
    (lambda c: c.update(verdict="inconclusive"), "verdict 'inconclusive' with no reason recorded"),
    (lambda c: c.update(id="P9"), "reproduce command 'certify run P1 --seed 7 --profile quick', but its id and settings give 'certify run P9"),
    (lambda c: c["numerical"].update(dtype="bfloat16"), "numerical.dtype 'bfloat16', but its precision parts under test are 'float64'"),
    (lambda c: c["numerical"].update(dtype="float32", precision=[{"role": "under test", "part": "x", "dtypes": ["float64", "float32"]}]),
     "numerical.dtype 'float32', but its precision parts under test are 'float64, float32'"),
    (lambda c: c.update(inconclusive=["a reason"]), "verdict 'pass', but its own evidence is inconclusive"),
])
def test_a_resealed_certificate_that_contradicts_itself_is_refused_before_anything_is_shown(certified, capsys, command, doctor, expected):
    """The digest is recomputed after the edit, as anyone can: cite and verify still refuse it, in one
    line with exit 2, without printing a verdict and (verify) before re-running anything."""
    _rewrite(certified, doctor, reseal=True)
    code, out, err = run_main(capsys, command, str(certified))
    assert code == 2
    assert "contradicts itself" in error_of(err) and expected in error_of(err)
    assert "pass" not in out and "re-running" not in out


@pytest.mark.parametrize("doctor, expected", [
    (lambda c: c.update(title="Scale independence for any eps"), "title 'Scale independence for any eps' recorded"),
    (lambda c: c["statement"].update(text="it equals plain SGD"), "statement {"),
    (lambda c: c["numerical"]["precision"][0].update(dtypes=["bfloat16"]), "numerical.precision"),
])
def test_verify_finds_an_edited_title_statement_or_precision_in_the_re_run(certified, capsys, doctor, expected):
    """What a certificate says it certified, and in which dtypes, is stated anew by the re-run: a
    resealed edit of it is a difference (a consistent precision edit also edits dtype)."""
    def change(certificate):
        doctor(certificate)
        certificate["numerical"]["dtype"] = certificate_format.precision_text(certificate)

    _rewrite(certified, change, reseal=True)
    code, out, _ = run_main(capsys, "verify", str(certified))
    assert code == 1
    assert "DIFFERS from its re-run" in out and expected in out


def test_verify_shows_residual_bound_and_ratio_of_one_sample(certified, capsys, tmp_path):
    """Each row's re-run residual over its re-run bound is its re-run ratio: the worst sample's, not the
    largest residual beside the largest bound of two other samples."""
    report_file = tmp_path / "verification.md"
    code, _, _ = run_main(capsys, "verify", str(certified), "--report", str(report_file))
    assert code == 0
    rows = [line.split("|")[1:-1] for line in report_file.read_text().splitlines() if line.startswith("| fake_identity |")]
    assert len(rows) == 1
    residual, bound, ratio = (float(cell) for cell in (rows[0][2], rows[0][3], rows[0][4]))
    assert residual / bound == pytest.approx(ratio, rel=1e-3)
    recorded = json.loads(certified.read_text())["numerical"]["checks"][0]
    assert recorded["residual"]["max"] / recorded["bound"]["max"] != pytest.approx(ratio, rel=1e-3) or recorded["worst_case"]["bound"] == recorded["bound"]["max"]
