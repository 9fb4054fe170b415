"""Typed figures of a claim's result: what certify/report.py draws, said by the claim, not guessed.

A claim puts these into ClaimResult.figures (name -> figure). Each serialises (to_dict) to the
JSON layout the certificates have always had, plus a `kind` field ("line", "histogram" or
"data") on which the report dispatches:

    LineFigure       {"kind": "line", "series": [{"x", "y", "label"}, ...], "title", "xlabel", "ylabel",
                      optional "logx", "logy", and optionally one top-level "x", "y", "label" series}
    HistogramFigure  {"kind": "histogram", "log10_edges", "counts", "title", "xlabel"}: counts has one
                      entry more than the edges (below the first edge, between edges, above the last)
    DataFigure       {"kind": "data", ...the named lists}: a table of numbers the report lists as data

Optional fields left as None are not written, so each figure keeps exactly the keys it had.
"""

from __future__ import annotations

from dataclasses import dataclass, field

FIGURE_KINDS = ("line", "histogram", "data")


@dataclass
class Series:
    """One line of a LineFigure: y against x (equal lengths), with its legend label."""

    x: list
    y: list
    label: str | None = None

    def __post_init__(self):
        self.x, self.y = list(self.x), list(self.y)
        if len(self.x) != len(self.y):
            raise ValueError(f"series {self.label!r}: x has {len(self.x)} points, y has {len(self.y)}")

    def to_dict(self) -> dict:
        return {"x": self.x, "y": self.y, "label": self.label}


@dataclass
class LineFigure:
    """Lines y(x) on common axes. `single` is a series written at the top level (x, y, label), the
    older single-line layout; `series` the list of lines."""

    title: str
    xlabel: str
    ylabel: str
    series: list[Series] = field(default_factory=list)
    logx: bool | None = None
    logy: bool | None = None
    single: Series | None = None
    kind: str = field(default="line", init=False)

    def __post_init__(self):
        if not self.series and self.single is None:
            raise ValueError(f"line figure {self.title!r} has no series")

    def to_dict(self) -> dict:
        out = {"kind": self.kind, "title": self.title, "xlabel": self.xlabel, "ylabel": self.ylabel}
        if self.single is not None:
            out.update({"x": self.single.x, "y": self.single.y})
            if self.single.label is not None:
                out["label"] = self.single.label
        if self.series:
            out["series"] = [s.to_dict() for s in self.series]
        for key in ("logx", "logy"):
            if getattr(self, key) is not None:
                out[key] = getattr(self, key)
        return out


@dataclass
class HistogramFigure:
    """Counts of log10 values in bins: len(counts) == len(log10_edges) + 1 (the two outer bins)."""

    log10_edges: list
    counts: list
    title: str
    xlabel: str
    kind: str = field(default="histogram", init=False)

    def __post_init__(self):
        self.log10_edges, self.counts = list(self.log10_edges), list(self.counts)
        if len(self.counts) != len(self.log10_edges) + 1:
            raise ValueError(f"histogram {self.title!r}: {len(self.counts)} counts for {len(self.log10_edges)} edges "
                             "(need one more count than edges)")

    @classmethod
    def of(cls, histogram: dict, title: str, xlabel: str) -> "HistogramFigure":
        """From a NumericalCheck's ratio_histogram ({"log10_edges", "counts"})."""
        return cls(histogram["log10_edges"], histogram["counts"], title, xlabel)

    def to_dict(self) -> dict:
        return {"kind": self.kind, "log10_edges": self.log10_edges, "counts": self.counts, "title": self.title,
                "xlabel": self.xlabel}


@dataclass
class DataFigure:
    """Named columns of numbers (or labels) that the report lists as data rather than draws."""

    columns: dict
    kind: str = field(default="data", init=False)

    def __post_init__(self):
        if "kind" in self.columns:
            raise ValueError("a data figure's column may not be called 'kind'")

    def to_dict(self) -> dict:
        return {"kind": self.kind, **self.columns}


def figures_to_dict(figures: dict) -> dict:
    """name -> figure.to_dict(); a plain dict (a claim that builds no typed figure) passes unchanged."""
    return {name: (figure.to_dict() if hasattr(figure, "to_dict") else figure) for name, figure in figures.items()}
