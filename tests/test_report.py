"""REPORT.md and its figures, with and without matplotlib."""

from __future__ import annotations

import sys

import numpy as np
import pytest

from certify import claims, report
from propositions._common import ClaimResult, ControlResult, NumericalCheck, SymbolicResult, SymbolicStep
from propositions.kit.figures import DataFigure, HistogramFigure, LineFigure, Series
from certify_fakes import FakeClaim

FIGURES = {
    "drift": {"x": [1, 10, 100], "y": [1e-16, "inf", 4e-16], "xlabel": "steps", "ylabel": "||W^T W - I||", "logx": True, "logy": True, "title": "feasibility drift"},
    "two_lines": {"series": [{"x": [0, 1], "y": [0, 1], "label": "a"}, {"x": [0, 1], "y": [1, 0], "label": "b"}]},
    "spread": {"log10_edges": [-2.0, -1.0, 0.0], "counts": [1, 2, 3, 0]},
    "domain_of_c": {"low": 1e-150, "high": 1e150},
    "ragged": {"x": [1, 2], "y": [1]},
}


def _certificate(claim_id: str, passing: bool, figures: dict = FIGURES) -> dict:
    # a double of the claim: its check is none the ledger names (propositions/ledger.py), so no promise coverage is asked of it
    def run(seed, profile, optimizer="stiefel_adam"):
        rng = np.random.default_rng(seed)
        check = NumericalCheck("fake_idempotent", "P(P(G)) against P(G)", "2 gamma_n with n = d")
        residual = rng.uniform(0.0, 1e-16, 32)
        if not passing:
            residual[0] = 1e-12
        check.add(residual, 1e-15, shape=(4, 2), key=("p", 4, 2), seed=seed)
        broken = NumericalCheck("fake_idempotent", "broken", "same")
        broken.add(np.full(4, 1e-3), 1e-15, shape=(4, 2), key=("c", 4, 2), seed=seed)
        return ClaimResult(
            symbolic=SymbolicResult("sympy", [SymbolicStep("idempotent", r"P_W(P_W(G)) - P_W(G) = 0", True)]),
            checks=[check],
            controls=[ControlResult.from_checks("projection_without_sym", "G - W W^T G", [broken])],
            frames=32,
            figures=figures,
            notes=["the note of " + claim_id],
        )

    claim = FakeClaim(claim_id, f"title | of {claim_id}", f"The statement of {claim_id}.", r"P_W^2 = P_W", ("projection_without_sym",), run)
    original = claims.lookup_claim
    claims.lookup_claim = lambda _: claim
    try:
        sealed, _ = claims.certify_claim(claim_id, seed=0, profile="quick", command=f"certify run {claim_id}")
    finally:
        claims.lookup_claim = original
    return sealed


@pytest.fixture(scope="module")
def certificates():
    return [_certificate("P1", True), _certificate("P2", False)]


def test_figure_kinds_follow_the_published_convention():
    assert report.figure_kind(FIGURES["drift"]) == "line"
    assert report.figure_kind(FIGURES["two_lines"]) == "line"
    assert report.figure_kind(FIGURES["spread"]) == "histogram"
    assert report.figure_kind(FIGURES["domain_of_c"]) == "data"
    assert report.figure_kind(FIGURES["ragged"]) == "data"
    assert report.figure_kind([1, 2, 3]) == "data"
    assert report.figure_kind({"x": [1], "y": [2], "series": "not a list"}) == "data"


TYPED = {
    "typed_line": LineFigure("a typed line", "step", "value", series=[Series([1, 2, 3], [3.0, 2.0, 1.0], "down")], logy=True),
    "typed_histogram": HistogramFigure([-1.0, 0.0], [4, 5, 0], "a typed histogram", "log10 ratio"),
    # a data figure whose columns happen to look like a line: the kind decides, not the layout
    "typed_data": DataFigure({"x": [1, 2], "y": [3, 4]}),
}


def test_report_dispatches_on_the_kind_of_typed_figures(tmp_path):
    certificate = _certificate("P3", True, TYPED)
    assert {name: entry["kind"] for name, entry in certificate["figures"].items()} == {
        "typed_line": "line", "typed_histogram": "histogram", "typed_data": "data"}
    assert [report.figure_kind(entry) for entry in certificate["figures"].values()] == ["line", "histogram", "data"]
    assert report.figure_kind({"kind": "spiral", "x": [1], "y": [1]}) == "data"  # an unknown kind is listed, not guessed
    path, plotted = report.write_report([certificate], tmp_path)
    assert plotted
    text = path.read_text()
    for name in ("typed_line", "typed_histogram"):
        assert (tmp_path / "figures" / f"P3_{name}.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        assert f"](figures/P3_{name}.png)" in text
    assert not (tmp_path / "figures" / "P3_typed_data.png").exists()
    assert "Figure data `typed_data`:" in text and '{"x": [1, 2], "y": [3, 4]}' in text


def test_report_with_matplotlib_draws_every_plot(certificates, tmp_path):
    path, plotted = report.write_report(certificates, tmp_path, notes=["crosscheck skipped: torch not installed"], total_wall_seconds=1.5)
    assert plotted
    text = path.read_text()
    figures = tmp_path / "figures"
    for claim_id in ("P1", "P2"):
        for name in ("residual_over_bound", "drift", "two_lines", "spread"):
            png = figures / f"{claim_id}_{name}.png"
            assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
            assert f"](figures/{png.name})" in text
        assert not (figures / f"{claim_id}_domain_of_c.png").exists()
    assert "Figure data `domain_of_c` (not a recognised plot)" in text
    assert "Figure data `ragged`" in text
    assert "Plots were left out" not in text


def test_report_contents(certificates, tmp_path, monkeypatch):
    monkeypatch.setattr(report, "load_figure_class", lambda: None)  # the text only; drawing is tested above
    text = report.write_report(certificates, tmp_path, total_wall_seconds=1.5)[0].read_text()
    assert "| id | title | verdict | precision | frames | wall s | frames/s | worst residual/bound | smallest control margin |" in text
    assert "| P1 | title \\| of P1 | pass | float64 | 32 |" in text
    assert "| P2 | title \\| of P2 | fail | float64 | 32 |" in text
    assert "1.5 s in all" in text or "1.50 s in all" in text
    assert "The statement of P1." in text
    assert "$$\nP_W^2 = P_W\n$$" in text
    assert "$$\nP_W(P_W(G)) - P_W(G) = 0\n$$" in text
    assert "| fake_idempotent | 32 |" in text
    assert "| projection_without_sym | G - W W^T G | fake_idempotent | 0.001 | 1e-15 | 1e+12 | yes |" in text
    assert "check fake_idempotent: worst residual/bound = 1e+03 > 1" in text
    assert "- the note of P2" in text
    assert "reproduce: `certify run P1 --seed 0 --profile quick`" in text


def test_report_without_matplotlib_says_plots_were_left_out(certificates, tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    monkeypatch.setitem(sys.modules, "matplotlib.figure", None)
    assert report.load_figure_class() is None
    path, plotted = report.write_report(certificates, tmp_path)
    assert not plotted
    text = path.read_text()
    assert "Plots were left out: matplotlib is not installed" in text
    assert not (tmp_path / "figures").exists()
    assert "Figure data `domain_of_c`" in text  # data entries are listed all the same
    assert "](figures/" not in text


def test_summary_numbers(certificates):
    passing, failing = certificates
    assert report.worst_ratio(passing) < 1 < report.worst_ratio(failing)
    assert report.smallest_margin(passing) == pytest.approx(1e12)
    assert report.format_number("inf") == "inf" and report.format_number(None) == "-" and report.format_number(12345) == "12345"


def test_exact_zeros_are_counted_apart_and_every_check_has_its_median():
    from propositions._common import NumericalCheck

    check = NumericalCheck("c", "d", "b")
    check.add(np.array([0.0, 0.0, 0.0, 1e-3, 1e-2]), 1.0)
    entry = check.to_dict()
    assert entry["ratio_histogram"]["zeros"] == 3
    assert sum(entry["ratio_histogram"]["counts"]) == 2  # the zeros are not piled into the first bin
    label = report._legend_label(entry)
    assert "c: median 0" in label and "3 exact zeros" in label
    lines = "\n".join(report._distribution_lines({"checks": [entry]}))
    assert "### Distribution of residual/bound" in lines and "| all checks | 3 |" in lines
    assert report._pooled_median([entry["ratio_histogram"]]) == "0 (exact zeros)"


def test_checks_whose_residuals_are_all_exact_zeros_share_one_legend_line():
    from propositions._common import NumericalCheck

    checks = []
    for name, residuals in (("drawn", [0.0, 1e-3, 1e-2]), ("exact_a", [0.0, 0.0]), ("exact_b", [0.0] * 5), ("drawn_too", [0.5])):
        check = NumericalCheck(name, "d", "b")
        check.add(np.array(residuals), 1.0)
        checks.append(check.to_dict())
    series = report.residual_series(checks)
    assert [label.split(":")[0] for label, _ in series[:2]] == ["drawn", "drawn_too"]
    label, histogram = series[2]
    assert len(series) == 3 and label.startswith("2 checks whose every residual is exactly 0 (7 samples")
    assert histogram["zeros"] == 7 and sum(histogram["counts"]) == 0 and len(histogram["counts"]) == len(histogram["log10_edges"]) + 1


def test_a_claim_whose_residuals_are_all_exact_zeros_still_gets_its_figure(tmp_path):
    Figure = report.load_figure_class()
    if Figure is None:
        pytest.skip("matplotlib is not installed")
    check = NumericalCheck("zero", "d", "b")
    check.add(np.zeros(4), 1.0)
    certificate = {"id": "Z", "numerical": {"checks": [check.to_dict()]}, "figures": {}}
    drawn, _ = report.draw_figures(certificate, tmp_path, Figure)
    assert (tmp_path / drawn[0][1]).stat().st_size > 0


def test_the_links_to_the_docs_resolve_from_where_the_report_is_written(certificates, tmp_path, monkeypatch):
    """reports/REPORT.md links ../docs/...; a report two levels down links ../../docs/...; one outside
    the checkout names the pages as text (a link there would lead nowhere)."""
    import re as regex

    monkeypatch.setattr(report, "load_figure_class", lambda: None)
    root = report.DOCS_DIR.parent
    assert "[docs/claims.md](../docs/claims.md)" in (root / "reports" / "REPORT.md").read_text()
    nested = root / "reports" / "nested-link-test" / "out"
    try:
        text = report.write_report(certificates, nested)[0].read_text()
        targets = regex.findall(r"\]\((\.\./[^)]+\.md)\)", text)
        assert targets and all((nested / target).resolve().is_file() for target in targets)
    finally:
        import shutil

        shutil.rmtree(root / "reports" / "nested-link-test")
    outside = report.write_report(certificates, tmp_path)[0].read_text()
    assert "docs/claims.md of stiefel-adam-certify" in outside and "](../docs/" not in outside
