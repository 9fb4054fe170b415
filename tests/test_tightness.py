"""Every bound earns its place: residual/bound quantiles per check, the tightness audit, the report."""

import numpy as np
import pytest

from certify import claims, report
from certify_fakes import FakeClaim
from propositions._common import (
    TIGHTNESS_THRESHOLD,
    ClaimResult,
    ControlResult,
    NumericalCheck,
    SymbolicResult,
)


def _check(name, ratios, note=None):
    check = NumericalCheck(name, f"{name} residuals", "a bound of 2 per sample", tightness_note=note)
    check.add(2.0 * np.asarray(ratios), 2.0, shape=(3, 2))
    return check


def test_ratio_quantiles_are_those_of_residual_over_bound():
    ratios = np.linspace(0.0, 1.0, 101)  # median 0.5, 1st percentile 0.01
    body = _check("c", ratios).to_dict()
    assert body["ratio"]["median"] == pytest.approx(0.5)
    assert body["ratio"]["p01"] == pytest.approx(0.01)
    assert body["ratio"]["max"] == pytest.approx(1.0) == body["max_ratio"]
    assert body["ratio"]["pooled"] == 101
    assert body["tightness_note"] is None
    # per-sample bounds: the ratio pool divides each residual by its own bound
    check = NumericalCheck("per_sample", "", "")
    check.add([1.0, 1.0, 1.0], [10.0, 100.0, 1000.0])
    assert check.to_dict()["ratio"]["median"] == pytest.approx(0.01)


def _result(checks):
    broken = NumericalCheck("c", "", "")
    broken.add([100.0], 1.0)
    control = ControlResult.from_checks("broken", "a broken variant", [broken])
    return ClaimResult(SymbolicResult("none"), checks, [control], frames=1)


def test_audit_lists_loose_checks_without_a_note_only():
    tight = _check("tight", np.full(10, 0.3))
    loose = _check("loose", np.full(10, 1e-6))
    excused = _check("excused", np.zeros(10), note="exact equality: the residual is 0 by design")
    assert loose.loose and excused.loose and not tight.loose
    notes = _result([tight, loose, excused]).to_dict()["notes"]
    audit = [n for n in notes if n.startswith("tightness audit")]
    assert len(audit) == 1 and "check loose " in audit[0] and f"< {TIGHTNESS_THRESHOLD:g}" in audit[0]
    assert _result([tight, excused]).to_dict()["notes"] == []
    # a note, not a failure
    assert _result([tight, loose]).verdict == "pass"


def test_certificate_and_report_carry_the_ratios(tmp_path):
    def run(seed, profile, optimizer="stiefel_adam"):
        return _result([_check("tight", np.full(10, 0.3)), _check("loose", np.full(10, 1e-6)),
                        _check("excused", np.zeros(10), note="exact equality by design")])

    claim = FakeClaim("P1", "t", "s", "l", ("broken",), run)
    original = claims.lookup_claim
    claims.lookup_claim = lambda _: claim
    try:
        sealed, internal_error = claims.certify_claim("P1", seed=0, profile="quick", command="certify run P1")
    finally:
        claims.lookup_claim = original
    assert internal_error is None  # the schema accepts ratio and tightness_note
    checks = {c["name"]: c for c in sealed["numerical"]["checks"]}
    assert checks["loose"]["ratio"]["median"] == pytest.approx(1e-6)
    assert checks["excused"]["tightness_note"] == "exact equality by design"
    assert any(n.startswith("tightness audit: check loose") for n in sealed["notes"])
    path, _ = report.write_report([sealed], tmp_path)
    text = path.read_text()
    assert "median residual/bound" in text and "p01 residual/bound" in text
    rows = {line.split("|")[1].strip(): line for line in text.splitlines() if line.startswith("| ")}
    assert report.LOOSE_MARK in rows["loose"] and report.LOOSE_MARK in rows["excused"]
    assert report.LOOSE_MARK not in rows["tight"]
    assert "Tightness: exact equality by design" in text


def test_general_notes_state_no_measured_figure_and_point_to_the_recorded_worst_ratio():
    """A note is reasoning that holds for every run; how close the worst sample comes is measured, and
    the certificate records it (max_ratio, worst_case)."""
    from propositions.kit import tightness

    for note in (tightness.WORST_CASE_SUMS, tightness.RUNNING_BOUND):
        assert "decade" not in note and "max_ratio" in note


def test_bound_texts_name_where_the_bound_lives():
    from propositions import p4_equivariance as p4
    from propositions.kit import step_analysis

    texts = [check.bound_derivation for check in p4._checks("left_haar", "left").values()]
    assert all("p2_scale_independence" not in text and "propositions/kit/running_bounds.py" in text for text in texts)
    # rendered from the one analysis of the step, not retyped
    assert all(step_analysis.step_error_text("W") in text for text in texts)
