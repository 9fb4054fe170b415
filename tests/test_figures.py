"""Typed figures serialise to the layout the certificates have always had, plus their kind."""

import json
from pathlib import Path

import pytest

from certify import report
from propositions.kit.figures import DataFigure, HistogramFigure, LineFigure, Series, figures_to_dict

REPORTS = Path(__file__).resolve().parents[1] / "reports"


def _without_kind(entry: dict) -> dict:
    return {key: value for key, value in entry.items() if key != "kind"}


def test_line_figures_round_trip_to_the_untyped_layouts():
    # P1's slope plots, P2's c plots, P3's: series with both log axes
    series = LineFigure("t", "s", "error", series=[Series([1, 2], [3, 4], "a")], logx=True, logy=True).to_dict()
    assert series["kind"] == "line"
    assert _without_kind(series) == {"series": [{"x": [1, 2], "y": [3, 4], "label": "a"}], "title": "t", "xlabel": "s",
                                     "ylabel": "error", "logx": True, "logy": True}
    # P5's weight norm: no log axes, so no logx / logy keys
    assert "logx" not in LineFigure("t", "step", "norm", series=[Series([1], [2], "b")]).to_dict()
    # P2's domain scan: one top-level series with its label, logy only
    single = LineFigure("t", "log2 c", "residual", single=Series([0, 1], [1e-16, 2e-16], "residual"), logy=True).to_dict()
    assert _without_kind(single) == {"x": [0, 1], "y": [1e-16, 2e-16], "label": "residual", "title": "t",
                                     "xlabel": "log2 c", "ylabel": "residual", "logy": True}
    # the cross-check's long run: the first series also at the top level, without a label
    both = LineFigure("t", "step", "f", series=[Series([1], [2], "float64")], single=Series([1], [2]), logx=True, logy=True).to_dict()
    assert both["x"] == [1] and "label" not in both and both["series"][0]["label"] == "float64"
    # the untyped guess of the report agrees with the kind
    for entry in (series, single, both):
        assert report.figure_kind(_without_kind(entry)) == "line" == report.figure_kind(entry)


def test_histogram_and_data_figures_round_trip():
    histogram = HistogramFigure.of({"log10_edges": [-1.0, 0.0], "counts": [1, 2, 3]}, "h", "log10(r)").to_dict()
    assert _without_kind(histogram) == {"log10_edges": [-1.0, 0.0], "counts": [1, 2, 3], "title": "h", "xlabel": "log10(r)"}
    assert report.figure_kind(_without_kind(histogram)) == "histogram" == report.figure_kind(histogram)
    data = DataFigure({"check": ["a"], "max_ratio": [0.5]}).to_dict()
    assert data == {"kind": "data", "check": ["a"], "max_ratio": [0.5]}
    assert figures_to_dict({"d": DataFigure({"n": [1]}), "legacy": {"n": [2]}}) == {"d": {"kind": "data", "n": [1]}, "legacy": {"n": [2]}}


def test_malformed_figures_are_refused():
    with pytest.raises(ValueError, match="x has 2 points, y has 1"):
        Series([1, 2], [1])
    with pytest.raises(ValueError, match="one more count"):
        HistogramFigure([0.0, 1.0], [1, 2], "h", "x")
    with pytest.raises(ValueError, match="no series"):
        LineFigure("t", "x", "y")
    with pytest.raises(ValueError, match="kind"):
        DataFigure({"kind": [1]})


@pytest.mark.skipif(not (REPORTS / "P6.json").exists(), reason="no committed certificates")
def test_committed_certificates_without_kind_keep_their_figure_kinds():
    """The certificates committed before figures were typed carry no kind: the report still draws them
    as what the claims now build (the claims' kinds, listed here, against the layout guess)."""
    expected = {"P1": "line", "P2": "line", "P3": "line", "P5": "line", "P6": "histogram", "P4": "data"}
    for claim_id, kind in expected.items():
        path = REPORTS / f"{claim_id}.json"
        if not path.exists():
            continue
        for entry in json.loads(path.read_text())["figures"].values():
            assert report.figure_kind(entry) == kind
