"""`certify compare`: certificates per (implementation, claim), the matrix in REPORT.md, exit codes.

The claims are fakes injected through certify.claims.lookup_claim (as in test_cli.py): each takes one
step of the implementation under test from a fresh state and holds it to reference_impl.step, and
records its state check as not observable for a black box. The implementations are real adapters.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pytest

import reference_impl as ri
from certify import certificate as certificate_format
from certify import claims, report
from certify.outside import compare
from propositions._common import ClaimResult, ControlResult, NumericalCheck, SymbolicResult, rng_for
from propositions.kit import observability
from certify_fakes import FakeClaim, run_main

sys.path.insert(0, str(Path(__file__).resolve().parent))  # adapter_fakes


def _one_step_result(seed, optimizer) -> ClaimResult:
    variant = ri.get_variant(optimizer)
    rng = rng_for(seed, "fake-compare")
    W = ri.random_point(5, 2, rng, (8,))
    G = rng.standard_normal(W.shape)
    config = ri.StiefelAdamConfig(lr=0.05)
    W_new, state = variant.step(W, G, variant.init(W), config)
    W_ref, state_ref = ri.step(W, G, ri.init(W), config)
    step = NumericalCheck("one_step", "W_1 against reference_impl.step", "1e-12: test bound")
    step.add(np.sqrt(np.sum((W_new - W_ref) ** 2, axis=(-2, -1))), 1e-12, shape=(5, 2), key=("fake",), seed=seed)
    moment = NumericalCheck("one_step_moment", "v_1 against reference_impl.step", "1e-12: test bound")
    if observability.state_observable(variant):
        moment.add(np.abs(np.asarray(state.v) - state_ref.v), 1e-12, shape=(5, 2), key=("fake",), seed=seed)
    else:
        observability.record(moment.name, "the implementation's v is hidden")
    broken = NumericalCheck("one_step", "a broken step", "1e-12")
    broken.add(np.full(4, 1.0), 1e-12)
    return ClaimResult(SymbolicResult("none"), [step, moment], [ControlResult.from_checks("qr_retraction", "broken", [broken])], frames=8)


@pytest.fixture
def registry(monkeypatch):
    table = {claim_id: FakeClaim(claim_id, f"fake {claim_id}", "s", "l", ("qr_retraction",), lambda seed, profile, optimizer="stiefel_adam", **o: _one_step_result(seed, optimizer))
             for claim_id in claims.ALL_IDS}
    monkeypatch.setattr(claims, "lookup_claim", lambda claim_id: table[claim_id])
    monkeypatch.setattr(report, "load_figure_class", lambda: None)
    return table



def test_compare_writes_a_verifiable_certificate_per_pair_and_the_matrix(registry, capsys, tmp_path):
    (tmp_path / "REPORT.md").write_text("# Certificates\n\nthe report of certify all\n", encoding="utf-8")
    code, out, _ = run_main(capsys, "compare", "reference_impl", "qr_retraction", "--implementation", "adapter_fakes:opaque",
                            "--out", str(tmp_path))
    assert code == 1  # qr_retraction fails
    for spec in ("reference_impl", "numpy_adapter_fakes_opaque", "qr_retraction"):
        for claim_id in claims.IMPLEMENTATION_CLAIMS:
            certificate_format.load(tmp_path / "compare" / spec / f"{claim_id}.json")  # digest and schema
    text = (tmp_path / "REPORT.md").read_text(encoding="utf-8")
    assert text.startswith("# Certificates\n\nthe report of certify all")
    rows = {line.split(" | ")[0].strip("| "): line for line in text.splitlines() if line.startswith("| ")}
    # the torch bookkeeping claim does not apply to a NumPy step: its own outcome, no certificate
    assert rows["reference_impl"].count("| pass") == len(claims.IMPLEMENTATION_CLAIMS)
    assert rows["numpy:adapter_fakes:opaque"].count("pass; 1 not observable") == len(claims.IMPLEMENTATION_CLAIMS)
    for spec, folder in (("reference_impl", "reference_impl"), ("numpy:adapter_fakes:opaque", "numpy_adapter_fakes_opaque")):
        assert rows[spec].endswith("| not applicable: the implementation is not a torch optimizer (a NumPy step has no param groups or state_dict) |")
        assert not (tmp_path / "compare" / folder / f"{claims.BOOKKEEPING_ID}.json").exists()
    assert "fail: one_step (margin" in rows["qr_retraction"]
    assert "retraction" in text and "QR (sign-fixed) retraction, not the polar one" in text
    # run again: the matrix is replaced, not appended
    run_main(capsys, "compare", "reference_impl", "--out", str(tmp_path))
    text = (tmp_path / "REPORT.md").read_text(encoding="utf-8")
    assert text.count(compare.MATRIX_BEGIN) == 1 and "qr_retraction |" not in text


def test_a_compare_certificate_verifies(registry, capsys, tmp_path):
    code, _, _ = run_main(capsys, "compare", "--implementation", "adapter_fakes:opaque", "--out", str(tmp_path))
    assert code == 0
    path = tmp_path / "compare" / "numpy_adapter_fakes_opaque" / "P2.json"
    recorded = json.loads(path.read_text())
    assert recorded["provenance"]["optimizer"] == "numpy:adapter_fakes:opaque"
    assert "--optimizer numpy:adapter_fakes:opaque" in recorded["provenance"]["reproduce"]
    code, out, _ = run_main(capsys, "verify", str(path))
    assert code == 0, out


def test_compare_bad_input_exits_2_before_running(registry, capsys, tmp_path):
    code, _, err = run_main(capsys, "compare", "reference_impl", "numpy:no_such_module_here:step", "--out", str(tmp_path))
    assert code == 2 and len(err.strip().splitlines()) == 1 and "does not import" in err
    assert not (tmp_path / "compare").exists()
    code, _, err = run_main(capsys, "compare", "--out", str(tmp_path))
    assert code == 2 and "at least one implementation" in err


def test_misbehaving_implementation_is_a_failing_cell_with_its_reason(registry, capsys, tmp_path):
    code, _, _ = run_main(capsys, "compare", "--implementation", "adapter_fakes:returns_nan", "--out", str(tmp_path))
    assert code == 1
    certificate = certificate_format.load(tmp_path / "compare" / "numpy_adapter_fakes_returns_nan" / "P1.json")
    assert certificate["verdict"] == "fail" and compare.cell(certificate).startswith("fail: implementation_output")
    assert any("non-finite" in failure for failure in certificate["failures"])


def test_float32_torch_row_is_certified_never_not_comparable(registry, capsys, tmp_path):
    pytest.importorskip("torch")
    run_main(capsys, "compare", "torch_impl-float32", "--out", str(tmp_path))
    text = (tmp_path / "REPORT.md").read_text(encoding="utf-8")
    row = next(line for line in text.splitlines() if line.startswith("| torch_impl-float32 |"))
    assert "not comparable" not in row  # the fakes' 1e-12 bounds fail it: a verdict, not a refusal
