"""REPORT.md: the human-readable companion of the certificates, with figures.

`write_report(certificates, out_dir)` writes `out_dir/REPORT.md` and, when matplotlib can be
imported, PNG figures into `out_dir/figures/` (drawn off-screen with the Agg canvas; no display is
needed). Without matplotlib the report is written all the same and says that the plots were left
out.

The report holds a summary table (id, title, verdict, frames, wall time, frames per second, worst
residual/bound, smallest control margin), then per claim: the statement, the symbolic derivation
(LaTeX in $$ blocks), the exact checks, the numerical checks (residual, bound, the median, 1st
percentile and max of residual/bound, loose bounds marked), the
controls (margin, detected), failures, notes and figures.

Figures
-------
Every claim gets a *residual-over-bound histogram*, drawn from each check's
`"ratio_histogram": {"log10_edges": [e_0, ..., e_n], "counts": [c_0, ..., c_{n+1}], "zeros": z}`
(c_0 counts log10(residual/bound) below e_0; c_k for 1 <= k <= n counts [e_{k-1}, e_k); c_{n+1}
counts above e_n; z the residuals that are exactly 0, which have no logarithm and are counted apart).
Everything right of 0 is over its bound. Each check with a residual that is not exactly 0 is one
legend entry with its median residual/bound and its exact zeros; the checks whose every residual is
exactly 0 (nothing to draw on a log axis) share one legend line that counts them, and the claim's
section lists each of them: it tabulates the distribution per decade with the medians
(`_distribution_lines`).

A claim may add figures of its own in `ClaimResult.figures`, a dict from a figure name (used in the
file name) to a JSON-able entry. The report recognises two kinds of entry:

* **Line plot**: a dict with `"x"` and `"y"` (lists of numbers of equal length) and/or
  `"series"` (a list of `{"x": [...], "y": [...], "label": str}`), with optional
  `"title"` (str), `"xlabel"` (str), `"ylabel"` (str), `"logx"` (bool), `"logy"` (bool) and
  `"label"` (str, the legend entry of the top-level x/y). Each series is one line; points that are
  not finite (the strings "inf"/"nan" included), or not positive on a log axis, are left out.
  Example: `{"x": [1, 10, 100], "y": [1e-16, 3e-16, 2e-15], "xlabel": "steps",
  "ylabel": "||W^T W - I||", "logx": true, "logy": true, "title": "feasibility drift"}`.
* **Histogram**: a dict with `"log10_edges"` and `"counts"` as in the checks above, with optional
  `"title"` and `"xlabel"`.

Any other entry is listed in the report as data (its JSON, shortened when long), never dropped.
"""

from __future__ import annotations

import datetime
import json
import math
import re
from pathlib import Path

from certify import certificate as certificate_format
from certify.certificate import as_float
from propositions.kit.common import DETECTION_FACTOR

REPORT_NAME = "REPORT.md"
FIGURES_DIR = "figures"
_DATA_PREVIEW_CHARS = 1500


# --------------------------------------------------------------------------------------------
# Formatting
# --------------------------------------------------------------------------------------------


def format_number(value, digits: int = 3) -> str:
    """A certificate number for people: 3 significant digits, 'inf'/'nan' kept, None as '-'."""
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    number = as_float(value)
    if math.isnan(number):
        return "nan"
    if math.isinf(number):
        return "inf" if number > 0 else "-inf"
    if isinstance(value, int) and abs(value) < 10**7:
        return str(value)
    return f"{number:.{digits}g}"


def _cell(text) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


def _table(header: list[str], rows: list[list]) -> list[str]:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(_cell(value) for value in row) + " |" for row in rows]
    return lines


def worst_ratio(certificate: dict) -> float | None:
    """Largest worst-case residual/bound over the certificate's checks (None without checks)."""
    ratios = [as_float(check.get("max_ratio")) for check in certificate["numerical"]["checks"] if check.get("samples", 0) > 0]
    ratios = [ratio for ratio in ratios if not math.isnan(ratio)]
    return max(ratios) if ratios else None


def smallest_margin(certificate: dict) -> float | None:
    """Smallest control margin (residual/bound of the broken variant), None without controls."""
    margins = [as_float(control.get("margin")) for control in certificate["controls"]]
    margins = [margin for margin in margins if not math.isnan(margin)]
    return min(margins) if margins else None


precision_text = certificate_format.precision_text


def precision_lines(certificate: dict) -> list[str]:
    """One bullet per part of numerical.precision: what ran in which dtypes, under test or as reference."""
    return [f"- {part['part']}: {', '.join(part['dtypes'])}" + (" (reference)" if part["role"] == "reference" else "")
            for part in certificate["numerical"].get("precision", [])]


def summary_rows(certificates: list[dict]) -> list[list[str]]:
    """One row per certificate: id, title, verdict, precision, frames, wall s, frames/s, worst ratio, margin."""
    rows = []
    for certificate in certificates:
        timing = certificate_format.run_record(certificate)
        rows.append(
            [
                certificate["id"],
                certificate["title"],
                certificate["verdict"],
                precision_text(certificate),
                format_number(certificate["numerical"]["frames"]),
                f"{timing['wall_seconds']:.2f}",
                format_number(timing.get("frames_per_second")),
                format_number(worst_ratio(certificate)),
                format_number(smallest_margin(certificate)),
            ]
        )
    return rows


SUMMARY_HEADER = ["id", "title", "verdict", "precision", "frames", "wall s", "frames/s", "worst residual/bound", "smallest control margin"]


# --------------------------------------------------------------------------------------------
# Figures
# --------------------------------------------------------------------------------------------


def load_figure_class():
    """matplotlib.figure.Figure, or None when matplotlib cannot be imported.

    Figure objects are drawn with the Agg canvas directly (no pyplot, no backend, no display).
    """
    try:
        from matplotlib.figure import Figure
    except ImportError:
        return None
    return Figure


def _file_stem(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", str(text)).strip("_") or "figure"


def _is_number_list(value) -> bool:
    return isinstance(value, list) and all(isinstance(item, (int, float, str)) and not isinstance(item, bool) for item in value)


def _as_series(entry: dict) -> list[dict] | None:
    """The line-plot series of a figure entry, or None when it is not a line plot."""
    series = []
    if "x" in entry or "y" in entry:
        if not (_is_number_list(entry.get("x")) and _is_number_list(entry.get("y")) and len(entry["x"]) == len(entry["y"])):
            return None
        series.append({"x": entry["x"], "y": entry["y"], "label": entry.get("label")})
    if "series" in entry:
        if not isinstance(entry["series"], list):
            return None
        for item in entry["series"]:
            if not (isinstance(item, dict) and _is_number_list(item.get("x")) and _is_number_list(item.get("y")) and len(item["x"]) == len(item["y"])):
                return None
            series.append({"x": item["x"], "y": item["y"], "label": item.get("label")})
    return series or None


def _is_histogram(entry) -> bool:
    return (
        isinstance(entry, dict)
        and _is_number_list(entry.get("log10_edges"))
        and isinstance(entry.get("counts"), list)
        and len(entry["counts"]) == len(entry["log10_edges"]) + 1
    )


FIGURE_KINDS = ("line", "histogram", "data")  # propositions/kit/figures.py


def figure_kind(entry) -> str:
    """'line', 'histogram' or 'data' for one entry of a claim's figures dict.

    A figure built by propositions/kit/figures.py says its kind; the report takes it. Certificates
    written before figures were typed carry no `kind`: their layout is recognised as before (a
    series list or x / y lists: a line; log10_edges with one count more: a histogram), so that the
    committed certificates keep their figures without being regenerated.
    """
    if isinstance(entry, dict) and "kind" in entry:
        return entry["kind"] if entry["kind"] in FIGURE_KINDS else "data"
    if isinstance(entry, dict) and _as_series(entry) is not None:
        return "line"
    if _is_histogram(entry):
        return "histogram"
    return "data"


def _finite_points(xs, ys, logx: bool, logy: bool) -> tuple[list[float], list[float]]:
    kept_x, kept_y = [], []
    for x, y in zip(xs, ys):
        try:
            x, y = as_float(x), as_float(y)
        except (TypeError, ValueError):
            continue
        if not (math.isfinite(x) and math.isfinite(y)) or (logx and x <= 0) or (logy and y <= 0):
            continue
        kept_x.append(x)
        kept_y.append(y)
    return kept_x, kept_y


def _draw_line(Figure, entry: dict, name: str, path: Path) -> None:
    from matplotlib.ticker import LogFormatter, NullLocator

    figure = Figure(figsize=(6.4, 4.0))
    figure.subplots_adjust(left=0.12, right=0.97, bottom=0.12, top=0.9)
    axes = figure.subplots()
    logx, logy = bool(entry.get("logx")), bool(entry.get("logy"))
    labelled = False
    for series in _as_series(entry):
        xs, ys = _finite_points(series["x"], series["y"], logx, logy)
        axes.plot(xs, ys, marker="o", markersize=3, label=series.get("label"))
        labelled = labelled or bool(series.get("label"))
    # log axes labelled as plain text (10^-3 drawn by mathtext cost a quarter of the drawing time)
    if logx:
        axes.set_xscale("log")
        axes.xaxis.set_major_formatter(LogFormatter(labelOnlyBase=True))
        axes.xaxis.set_minor_locator(NullLocator())
    if logy:
        axes.set_yscale("log")
        axes.yaxis.set_major_formatter(LogFormatter(labelOnlyBase=True))
        axes.yaxis.set_minor_locator(NullLocator())
    axes.set_xlabel(str(entry.get("xlabel", "")))
    axes.set_ylabel(str(entry.get("ylabel", "")))
    # the title at a fixed height: matplotlib's automatic placement measures every tick label first
    axes.set_title(str(entry.get("title", name)), y=1.0, pad=6)
    axes.grid(True, alpha=0.3)
    if labelled:
        axes.legend(fontsize="small")
    figure.savefig(path, dpi=110, pil_kwargs={"compress_level": 3})


def _zeros(histogram: dict) -> int:
    """Exact zeros counted apart from the histogram (certificates before they were kept apart: 0)."""
    return max(int(histogram.get("zeros", 0) or 0), 0)


def _stairs(axes, histogram: dict, label: str | None) -> None:
    edges = [as_float(edge) for edge in histogram["log10_edges"]]
    counts = [max(int(count), 0) for count in histogram["counts"]]
    zeros = _zeros(histogram)
    total = sum(counts) + zeros
    if total == 0 or len(edges) < 2:
        return
    width = edges[1] - edges[0]
    # the two outer bins (below the first edge, above the last) drawn one bin wide; exact zeros are
    # not drawn (log10 0 has no place on the axis): the legend counts them
    extended = [edges[0] - width] + edges + [edges[-1] + width]
    over = sum(count for count, left in zip(counts, extended) if left >= 0.0)
    if label is not None:
        label = f"{label} ({over} of {total} over the bound)" if over else label
    if sum(counts) == 0:
        axes.plot([], [], label=label)  # all exact zeros: a legend entry, nothing to draw
        return
    axes.stairs([count / total for count in counts], extended, label=label, baseline=None)


def _occupied_range(histograms: list[tuple[str | None, dict]]) -> tuple[float, float] | None:
    """The log10 range of the bins that hold samples (0, the bound, always included), or None."""
    low, high = 0.0, 0.0
    found = False
    for _, histogram in histograms:
        edges = [as_float(edge) for edge in histogram["log10_edges"]]
        if len(edges) < 2:
            continue
        width = edges[1] - edges[0]
        lower = [edges[0] - width] + edges
        for count, left in zip(histogram["counts"], lower):
            if int(count) > 0:
                found = True
                low, high = min(low, left), max(high, left + width)
    return (low - 0.5, high + 0.5) if found else None


def _draw_histograms(Figure, histograms: list[tuple[str | None, dict]], title: str, xlabel: str, path: Path) -> None:
    from matplotlib.ticker import LogFormatter, NullLocator

    labelled = sum(1 for label, _ in histograms if label)
    # the figure is sized to its legend (one line per check below the axes) instead of measured by
    # bbox_inches="tight", whose text layout of every legend line cost more than the drawing: inches
    # for the title (top), the tick labels and x label (bottom), LEGEND_LINE per legend line
    below = 0.55 + (0.2 + LEGEND_LINE * labelled if labelled > 1 else 0.0)
    height = 0.45 + 3.0 + below
    figure = Figure(figsize=(7.0, height))
    figure.subplots_adjust(left=0.13, right=0.97, top=1 - 0.45 / height, bottom=below / height)
    axes = figure.subplots()
    styles = ("-", "--", ":", "-.")
    for index, (label, histogram) in enumerate(histograms):
        _stairs(axes, histogram, label)
        if axes.patches:
            axes.patches[-1].set_linestyle(styles[(index // 10) % len(styles)])
    axes.axvline(0.0, color="black", linestyle="--", linewidth=1, label="bound")
    span = _occupied_range(histograms)
    axes.set_xlabel(xlabel)
    if span is not None:
        axes.set_xlim(*span)
        # log scale: a single sample over the bound must be as visible as the bulk (tick labels as
        # plain text: mathtext's parser was a third of the drawing time)
        axes.set_yscale("log")
        axes.yaxis.set_major_formatter(LogFormatter(labelOnlyBase=True))
        axes.yaxis.set_minor_locator(NullLocator())
    else:  # every residual is exactly 0: nothing to draw on a log axis, the legend counts them
        axes.set_xlim(-1.0, 1.0)
        axes.text(0.5, 0.5, "every residual is exactly 0", transform=axes.transAxes, ha="center")
    axes.set_ylabel("fraction of samples")
    axes.set_title(title, y=1.0, pad=6)
    axes.grid(True, alpha=0.3)
    if labelled > 1:
        # below the axes, one line per check, so that the legend never hides a histogram
        axes.legend(fontsize="x-small", loc="upper left", bbox_to_anchor=(0.0, -0.55 / 3.0), ncol=1, frameon=False,
                    borderaxespad=0.0, borderpad=0.0, labelspacing=0.3)
    else:
        axes.legend(fontsize="x-small")
    figure.savefig(path, dpi=110, pil_kwargs={"compress_level": 3})


LEGEND_LINE = 0.14  # inches per legend line at fontsize x-small (7 pt) with labelspacing 0.3


def _all_exact_zeros(histogram: dict) -> bool:
    """Every sample of the histogram is an exact zero (nothing to draw on a log axis)."""
    return _zeros(histogram) > 0 and not any(int(count) > 0 for count in histogram.get("counts", ()))


def _legend_label(check: dict) -> str:
    """A check's legend entry: its name, median residual/bound and exact zeros."""
    zeros = _zeros(check.get("ratio_histogram") or {})
    median = format_number((check.get("ratio") or {}).get("median"))
    return f"{check.get('name')}: median {median}" + (f", {zeros} exact zeros" if zeros else "")


def residual_series(checks: list[dict]) -> list[tuple[str, dict]]:
    """(legend label, ratio histogram) per check drawn in a claim's residual-over-bound figure. A check
    whose every residual is exactly 0 has nothing to draw on a log axis: such checks share one last
    series, whose label counts them and their samples (the claim's distribution table lists each), so
    that the legend holds the checks that draw something."""
    checks = [check for check in checks if _is_histogram(check.get("ratio_histogram"))]
    series = [(_legend_label(check), check["ratio_histogram"]) for check in checks if not _all_exact_zeros(check["ratio_histogram"])]
    exact = [check["ratio_histogram"] for check in checks if _all_exact_zeros(check["ratio_histogram"])]
    if exact:
        samples = sum(_zeros(histogram) for histogram in exact)
        label = (f"{len(exact)} check{'s' if len(exact) > 1 else ''} whose every residual is exactly 0 ({samples} samples; "
                 "not drawn, listed in the distribution table)")
        series.append((label, {**exact[0], "counts": [0] * len(exact[0]["counts"]), "zeros": samples}))
    return series


def draw_figures(certificate: dict, figures_dir: Path, Figure) -> tuple[list[tuple[str, str]], list[tuple[str, object]]]:
    """Draw one certificate's figures; returns ([(caption, file name)], [(name, entry) listed as data]).

    Figure is matplotlib.figure.Figure, or None: then nothing is drawn and every figure entry
    that would have been drawn is left out (the report says so), the others are listed as data.
    """
    claim_id = certificate["id"]
    drawn: list[tuple[str, str]] = []
    as_data: list[tuple[str, object]] = []
    histograms = residual_series(certificate["numerical"]["checks"])
    if Figure is not None and (histograms or any(figure_kind(entry) != "data" for entry in certificate.get("figures", {}).values())):
        figures_dir.mkdir(parents=True, exist_ok=True)
    if Figure is not None and histograms:
        file_name = f"{claim_id}_residual_over_bound.png"
        _draw_histograms(Figure, histograms, f"{claim_id}: residual / bound per check", "log10(residual / bound)", figures_dir / file_name)
        drawn.append((f"{claim_id}: log10(residual/bound) of every sample, per check, with its median in the legend; right of the dashed line is over the bound, the leftmost bin holds ratios below its edge; exact zeros (residual 0) are not drawn, the legend counts them, and the checks whose every residual is 0 share one legend line", file_name))
    for name, entry in certificate.get("figures", {}).items():
        kind = figure_kind(entry)
        if kind == "data":
            as_data.append((name, entry))
            continue
        if Figure is None:
            continue
        file_name = f"{claim_id}_{_file_stem(name)}.png"
        try:
            if kind == "line":
                _draw_line(Figure, entry, name, figures_dir / file_name)
            else:
                _draw_histograms(Figure, [(None, entry)], str(entry.get("title", name)), str(entry.get("xlabel", "log10 value")), figures_dir / file_name)
        except Exception as error:  # a figure that cannot be drawn is shown as data, never fatal
            as_data.append((f"{name} (could not be drawn: {type(error).__name__}: {error})", entry))
            continue
        caption = entry.get("title", name) if isinstance(entry, dict) else name
        drawn.append((f"{claim_id}: {caption}", file_name))
    return drawn, as_data


# --------------------------------------------------------------------------------------------
# Markdown
# --------------------------------------------------------------------------------------------


def _latex_block(latex: str) -> list[str]:
    latex = (latex or "").strip()
    if not latex:
        return []
    if latex.startswith("$$"):
        return [latex, ""]
    return ["$$", latex.strip("$").strip(), "$$", ""]


# The threshold of propositions._common.TIGHTNESS_THRESHOLD (the report reads certificates only).
TIGHTNESS_THRESHOLD = 1e-3
LOOSE_MARK = "(loose)"


def _is_loose(check: dict) -> bool:
    median = as_float((check.get("ratio") or {}).get("median"))
    return check.get("samples", 0) > 0 and median < TIGHTNESS_THRESHOLD


def _median_ratio_cell(check: dict) -> str:
    text = format_number((check.get("ratio") or {}).get("median"))
    return f"{text} {LOOSE_MARK}" if _is_loose(check) else text


def _opening_lines(certificate: dict) -> list[str]:
    """The claim's heading, verdict line, statement and its failures / inconclusive reasons."""
    provenance = certificate["provenance"]
    run = certificate_format.run_record(certificate)
    lines = [f"## {certificate['id']}: {certificate['title']}", ""]
    lines += [
        f"**Verdict: {certificate['verdict']}** · digest `{certificate['digest']['value'][:16]}` · "
        f"reproduce: `{provenance['reproduce']}` · {run['wall_seconds']:.2f} s, "
        f"{format_number(run.get('frames_per_second'))} frames/s",
        "",
    ]
    if certificate["statement"]["text"]:
        lines += [certificate["statement"]["text"], ""]
    lines += _latex_block(certificate["statement"]["latex"])
    if certificate["numerical"].get("precision"):
        lines += ["Computed in:", ""] + precision_lines(certificate) + [""]
    for heading, items in (("Failures", certificate["failures"]), ("Inconclusive", certificate["inconclusive"])):
        if items:
            lines += [f"**{heading}:**", ""] + [f"- {item}" for item in items] + [""]
    return lines + counterexample_lines(certificate)


def counterexample_lines(certificate: dict) -> list[str]:
    """The minimal counterexample of a failing certificate (certify.ci.counterexample) as one block."""
    from certify.ci.counterexample import block, counterexamples_of

    lines = []
    for found in counterexamples_of(certificate):
        lines += ["**Minimal counterexample:**", "", "```", *block(found), "```", ""]
    return lines


def _symbolic_lines(symbolic: dict) -> list[str]:
    """### Symbolic derivation: one numbered item per step, with its LaTeX."""
    lines = [f"### Symbolic derivation ({symbolic.get('status')}; {symbolic.get('method')})", ""]
    for number, step in enumerate(symbolic.get("steps", []), start=1):
        mark = "reduces to the identity" if step.get("reduced") else "DID NOT REDUCE"
        lines += [f"{number}. {step.get('description', '')} ({mark})", ""]
        lines += _latex_block(step.get("latex", ""))
    if not symbolic.get("steps"):
        lines += ["No symbolic steps.", ""]
    return lines


def _exact_lines(exact: list[dict]) -> list[str]:
    """### Exact checks as a table; nothing when the claim has none."""
    if not exact:
        return []
    rows = [[e.get("name"), e.get("description", ""), format_number(e.get("samples")), format_number(bool(e.get("passed")))] for e in exact]
    return ["### Exact checks", ""] + _table(["check", "description", "samples", "passed"], rows) + [""]


def _check_row(check: dict) -> list:
    """One row of the numerical table: the check's residuals, bound and ratios."""
    return [
        check.get("name"),
        format_number(check.get("samples")),
        format_number(check["residual"].get("max")),
        format_number(check["residual"].get("median")),
        format_number(check["bound"].get("max")),
        _median_ratio_cell(check),
        format_number((check.get("ratio") or {}).get("p01")),
        format_number(check.get("max_ratio")),
        format_number(bool(check.get("passed"))),
    ]


def _check_description(check: dict) -> str:
    """One bullet: what the check measures, where its bound comes from, how tight it is."""
    tightness = f" Tightness: {check['tightness_note']}" if check.get("tightness_note") else ""
    return f"- **{check.get('name')}**: {check.get('description', '').rstrip('.')}; bound: {check.get('bound_derivation', '')}{tightness}"


def _worst_case_lines(worst: dict | None) -> list[str]:
    """Where the largest residual/bound was drawn and how to reproduce it; nothing without one."""
    if not worst:
        return []
    where = ", ".join(f"{key} {json.dumps(worst[key])}" for key in ("shape", "key", "index_in_draw") if worst.get(key) is not None)
    return [f"Worst case: check `{worst['check']}`, residual/bound {format_number(worst.get('ratio'))}" + (f" ({where})" if where else "") + f"; reproduce with `{worst['reproduce']}`.", ""]


def _numerical_lines(numerical: dict) -> list[str]:
    """### Numerical checks: the table, the loose-bound note, one bullet per check and the worst case."""
    lines = [f"### Numerical checks ({format_number(numerical['frames'])} frames, {numerical['dtype']}, seed {numerical['seed']}, profile {numerical['profile']})", ""]
    checks = numerical["checks"]
    if not checks:
        return lines + ["No numerical checks.", ""]
    lines += _table(["check", "samples", "max residual", "median residual", "bound (max)", "median residual/bound", "p01 residual/bound", "worst residual/bound", "passed"],
                    [_check_row(check) for check in checks])
    lines += [""]
    if any(_is_loose(check) for check in checks):
        lines += [f"{LOOSE_MARK} median residual/bound below {TIGHTNESS_THRESHOLD:g}: the bound is over three decades above the typical residual (its tightness note, or the audit in the notes, says so).", ""]
    lines += [_check_description(check) for check in checks] + [""]
    return lines + _worst_case_lines(numerical.get("worst_case"))


# Decades of residual/bound for the distribution table: (label, lower log10 edge, upper log10 edge).
DISTRIBUTION_DECADES = (("< 1e-12", -math.inf, -12.0), ("1e-12..1e-9", -12.0, -9.0), ("1e-9..1e-6", -9.0, -6.0),
                        ("1e-6..1e-4", -6.0, -4.0), ("1e-4..1e-3", -4.0, -3.0), ("1e-3..1e-2", -3.0, -2.0),
                        ("1e-2..0.1", -2.0, -1.0), ("0.1..1", -1.0, 0.0), ("> 1", 0.0, math.inf))


def _decade_counts(histogram: dict) -> list[int]:
    """The histogram's counts gathered into DISTRIBUTION_DECADES (bins lie inside one decade each)."""
    edges = [as_float(edge) for edge in histogram["log10_edges"]]
    lower = [-math.inf] + edges
    totals = [0] * len(DISTRIBUTION_DECADES)
    for count, left in zip(histogram["counts"], lower):
        for k, (_, low, high) in enumerate(DISTRIBUTION_DECADES):
            if low <= left < high or (left == -math.inf and k == 0):
                totals[k] += max(int(count), 0)
                break
    return totals


def _pooled_median(histograms: list[dict]) -> str:
    """The decade that holds the median of all samples of the claim's checks (zeros first)."""
    zeros = sum(_zeros(h) for h in histograms)
    decades = [sum(column) for column in zip(*(_decade_counts(h) for h in histograms))]
    total = zeros + sum(decades)
    if total == 0:
        return "-"
    half, running = total / 2, zeros
    if running >= half:
        return "0 (exact zeros)"
    for (label, _, _), count in zip(DISTRIBUTION_DECADES, decades):
        running += count
        if running >= half:
            return label
    return DISTRIBUTION_DECADES[-1][0]


def _distribution_lines(numerical: dict) -> list[str]:
    """### Distribution of residual/bound: per check (and all checks pooled) the exact zeros, the
    samples in each decade of residual/bound, and the median."""
    checks = [c for c in numerical["checks"] if _is_histogram(c.get("ratio_histogram"))]
    if not checks:
        return []
    header = ["check", "exact zeros"] + [label for label, _, _ in DISTRIBUTION_DECADES] + ["median"]
    rows = [[c.get("name"), _zeros(c["ratio_histogram"])] + _decade_counts(c["ratio_histogram"]) + [_median_ratio_cell(c)]
            for c in checks]
    histograms = [c["ratio_histogram"] for c in checks]
    pooled = [sum(column) for column in zip(*(_decade_counts(h) for h in histograms))]
    rows.append(["all checks", sum(_zeros(h) for h in histograms)] + pooled + [f"in {_pooled_median(histograms)}"])
    return (["### Distribution of residual/bound", "",
             "Samples per decade of residual/bound (exact zeros apart); the median of each check, and the decade that "
             "holds the median of all the claim's samples.", ""]
            + _table(header, rows) + [""])


def _control_lines(controls: list[dict]) -> list[str]:
    """### Controls: one row per broken variant and whether a check caught it."""
    if not controls:
        return ["### Controls", "", "No controls were run.", ""]
    rows = [
        [c.get("name"), c.get("description", ""), c.get("check"), format_number(c.get("residual")), format_number(c.get("bound")), format_number(c.get("margin")), format_number(bool(c.get("detected")))]
        for c in controls
    ]
    return ["### Controls", ""] + _table(["control", "description", "caught by", "residual", "bound", "margin", "detected"], rows) + [""]


def _notes_lines(notes: list[str]) -> list[str]:
    if not notes:
        return []
    return ["### Notes", ""] + [f"- {note}" for note in notes] + [""]


def _figure_data_lines(claim_id: str, name: str, entry) -> list[str]:
    """A figure that is not drawn, as (a preview of) its JSON."""
    columns = {key: value for key, value in entry.items() if key != "kind"} if isinstance(entry, dict) else entry
    text = json.dumps(columns, sort_keys=True)
    if len(text) > _DATA_PREVIEW_CHARS:
        text = text[:_DATA_PREVIEW_CHARS] + f" ... ({len(text)} characters in all; the full data is in {claim_id}.json)"
    typed = isinstance(entry, dict) and entry.get("kind") == "data"
    return [f"Figure data `{name}`" + ("" if typed else " (not a recognised plot)") + ":", "", "```json", text, "```", ""]


def _figure_lines(claim_id: str, drawn, as_data, plots_available: bool) -> list[str]:
    """### Figures: the drawn ones as images, the others as data."""
    lines: list[str] = []
    if drawn or as_data or not plots_available:
        lines += ["### Figures", ""]
    if not plots_available:
        lines += ["Plots were left out: matplotlib is not installed (`pip install matplotlib` and re-run to draw them).", ""]
    for caption, file_name in drawn:
        lines += [f"![{_cell(caption)}]({FIGURES_DIR}/{file_name})", "", f"*{caption}*", ""]
    for name, entry in as_data:
        lines += _figure_data_lines(claim_id, name, entry)
    return lines


def coverage_lines(certificate: dict) -> list[str]:
    """### Coverage: a drawn-scenario claim's features, times exercised (runs), per dtype (extra["coverage_<dtype>"])."""
    extra = certificate.get("extra", {}) or {}
    dtypes = [key[len("coverage_"):] for key in extra if key.startswith("coverage_")]
    if not dtypes:
        return []
    features = list(extra[f"coverage_{dtypes[0]}"])
    runs = [extra.get(f"runs_{dtype}", {}) for dtype in dtypes]
    lines = ["### Coverage", "", "Each feature of the scenario grammar: times exercised (in how many runs), per dtype; "
             "zero makes the claim inconclusive.", ""]
    lines += ["runs: " + "; ".join(f"{dtype} {r.get('runs')} runs, {r.get('steps')} steps (longest {r.get('longest_run_steps')})"
                                   for dtype, r in zip(dtypes, runs)), ""]
    rows = [[feature] + [f"{extra[f'coverage_{d}'].get(feature, {}).get('count', 0)} ({extra[f'coverage_{d}'].get(feature, {}).get('runs', 0)})"
                         for d in dtypes] for feature in features]
    return lines + _table(["feature"] + dtypes, rows) + [""]


def _claim_section(certificate: dict, drawn, as_data, plots_available: bool) -> list[str]:
    """The claim's part of REPORT.md: its opening, then, folded in a details block that a reader opens
    when she wants them, one subsection per tier, the notes and the figures."""
    checks, controls = certificate["numerical"]["checks"], certificate["controls"]
    summary = f"{len(checks)} checks, {len(controls)} controls: tables, distribution, notes and figures"
    return (
        _opening_lines(certificate)
        + ["<details>", f"<summary>{summary}</summary>", ""]
        + _symbolic_lines(certificate["symbolic"])
        + _exact_lines(certificate["exact"])
        + _numerical_lines(certificate["numerical"])
        + coverage_lines(certificate)
        + _distribution_lines(certificate["numerical"])
        + _control_lines(certificate["controls"])
        + _notes_lines(certificate["notes"])
        + _figure_lines(certificate["id"], drawn, as_data, plots_available)
        + ["</details>", ""]
    )


def claim_lines(certificates: list[dict]) -> list[str]:
    """One line per claim: what was certified, at which precision, and how it came out."""
    lines = []
    for certificate in certificates:
        checks, controls = certificate["numerical"]["checks"], certificate["controls"]
        detected = sum(bool(control.get("detected")) for control in controls)
        lines.append(f"- [**{certificate['id']}**](#{_anchor(certificate)}) {certificate['verdict']}, in {precision_text(certificate)}: "
                     f"{certificate['title']} ({len(checks)} checks, worst residual/bound {format_number(worst_ratio(certificate))}; "
                     f"{detected} of {len(controls)} controls detected, smallest margin {format_number(smallest_margin(certificate))})")
    return lines


def _anchor(certificate: dict) -> str:
    """GitHub's anchor of the claim's heading "## ID: title"."""
    heading = f"{certificate['id']}: {certificate['title']}".lower()
    return re.sub(r"[^\w\- ]", "", heading).replace(" ", "-")


DOCS_DIR = Path(__file__).resolve().parent.parent / "docs"


def docs_link(page: str, out_dir: Path | None) -> str:
    """A link to docs/PAGE from a report written in out_dir: relative, where the project's docs/ lie
    beside this code (a checkout) and out_dir is under the same root; else the page named as text
    (an installed wheel has no docs/, and a report under /tmp would link nowhere)."""
    import os

    target = DOCS_DIR / page
    if out_dir is not None and target.is_file():
        out = Path(out_dir).resolve()
        if DOCS_DIR.parent in out.parents or out == DOCS_DIR.parent:
            return f"[docs/{page}]({Path(os.path.relpath(target, out)).as_posix()})"
    return f"docs/{page} of stiefel-adam-certify"


def render_markdown(certificates: list[dict], sections: dict, *, plots_available: bool, notes: list[str] = (), total_wall_seconds: float | None = None,
                    out_dir: Path | None = None) -> str:
    """The text of REPORT.md. sections maps a claim id to (drawn figures, data entries) from draw_figures;
    out_dir: where it is written (its links to docs/ are relative to it)."""
    lines = ["# Certification report: Stiefel Adam (arXiv 2609.19363)", ""]
    lines += [
        f"What each claim states and how it is certified: {docs_link('claims.md', out_dir)} (the mathematics in "
        f"{docs_link('mathematics.md', out_dir)}, the algorithm in {docs_link('algorithm.md', out_dir)}); "
        f"the certificate format, `certify verify` and citation: {docs_link('certificates.md', out_dir)}.",
        "",
    ]
    if certificates:
        first = certificates[0]
        environment = first["environment"]
        provenance = first["provenance"]
        commit = provenance.get("git_commit")
        clean = certificate_format.run_record(first).get("git_tree_clean", provenance.get("git_tree_clean"))
        lines += [
            f"stiefel-adam-certify {provenance['project_version']}"
            + (f", commit `{commit[:12]}`" + ("" if clean in (True, None) else " (with local changes)") if commit else ", not a git checkout")
            + f"; Python {environment['python']}, numpy {environment['numpy']}, scipy {environment['scipy']}, sympy {environment['sympy']}, mpmath {environment['mpmath']}"
            + f"; {environment['cpu']} ({environment.get('cpu_count')} logical CPUs), {environment['platform']}.",
            "",
        ]
    written = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    total = sum(certificate_format.run_record(certificate)["wall_seconds"] for certificate in certificates)
    frames = sum(certificate["numerical"]["frames"] for certificate in certificates)
    wall_text = f"{total_wall_seconds:.2f} s in all" if total_wall_seconds is not None else f"{total:.2f} s in the claims"
    counts = {verdict: sum(c["verdict"] == verdict for c in certificates) for verdict in ("pass", "fail", "inconclusive")}
    lines += ["## Summary", ""]
    lines += [f"{counts['pass']} passed, {counts['fail']} failed, {counts['inconclusive']} inconclusive. "
              f"Written {written}: {len(certificates)} certificate(s), {frames} frames, {wall_text}.", ""]
    lines += [f"**Detection factor {DETECTION_FACTOR:g}.** A check passes when its worst residual is at most its bound "
              f"(residual/bound <= 1); a control (a deliberately broken variant) counts as detected only when its residual is at "
              f"least {DETECTION_FACTOR:g} times its bound, and a certificate with an undetected control fails.", ""]
    lines += claim_lines(certificates) + [""]
    lines += _table(SUMMARY_HEADER, summary_rows(certificates)) + [""]
    lines += [
        "precision: the dtypes the code under test computed in (each claim's section lists its parts, the float64 "
        "reference among them); worst residual/bound: the largest residual over its bound in any check (at most 1 to pass); "
        "smallest control margin: the residual/bound of the least broken control (at least the "
        "detection factor to be detected). Each claim's tables and figures are folded under its section.",
        "",
    ]
    if not plots_available:
        lines += ["Plots were left out: matplotlib is not installed.", ""]
    for note in notes:
        lines += [f"- {note}"]
    if notes:
        lines += [""]
    for certificate in certificates:
        drawn, as_data = sections.get(certificate["id"], ([], []))
        lines += _claim_section(certificate, drawn, as_data, plots_available)
    return "\n".join(lines).rstrip() + "\n"


def mutation_section(out_dir: Path) -> str:
    """A short section on the certificates' mutation score when out_dir/mutation.json exists.

    mutation.json is written by `certify mutate` (certify/mutation.py); '' when there is none.
    """
    path = Path(out_dir) / "mutation.json"
    if not path.exists():
        return ""
    try:
        summary = json.loads(path.read_text(encoding="utf-8"))
        totals, classes = summary["totals"], summary["survivor_classes"]
        score = f"{100 * totals['score']:.1f}%" if isinstance(totals.get("score"), (int, float)) else "-"
        text = (
            f"{totals['killed']} of {totals['total']} tested mutants of reference_impl make some certificate fail: score {score} "
            f"({summary.get('tool', 'mutmut')}, {summary.get('written', 'date unknown')}). Not killed: {totals['survived']} survived, "
            f"{totals['timeout']} timeout, {totals['suspicious']} suspicious, {totals['other']} other; of these {classes['equivalent']} "
            f"equivalent, {classes['validation']} input validation (out of the certificates' scope), {classes.get('control', 0)} changed "
            f"controls (still broken and detected), {classes.get('sampler', 0)} differently drawn random inputs, {classes['gap']} gaps of the certificates, {classes.get('detected', 0)} timed out, {classes['unclassified']} unclassified. "
            "Every mutant not killed is listed in MUTATION.md."
        )
        if totals.get("not_tested"):
            text += f" The run is incomplete: {totals['not_tested']} mutants not tested."
    except (OSError, ValueError, KeyError, TypeError) as error:
        text = f"{path.name} could not be read ({type(error).__name__}: {error}); run `certify mutate --report-only` to write it again."
    return "\n".join(["", "## Mutation score", "", text, ""])


def write_report(certificates: list[dict], out_dir: Path, *, notes: list[str] = (), total_wall_seconds: float | None = None, drawn: dict | None = None) -> tuple[Path, bool]:
    """Write out_dir/REPORT.md (and the figures); returns (its path, whether plots were drawn).

    drawn: {claim id: what draw_figures returned} for certificates whose figures are already drawn
    (the CLI draws each as it arrives); the others are drawn here.
    """
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    Figure = load_figure_class()
    drawn = drawn or {}
    sections = {certificate["id"]: drawn.get(certificate["id"]) or draw_figures(certificate, out_dir / FIGURES_DIR, Figure) for certificate in certificates}
    text = render_markdown(certificates, sections, plots_available=Figure is not None, notes=list(notes), total_wall_seconds=total_wall_seconds,
                           out_dir=out_dir)
    text += mutation_section(out_dir)
    path = out_dir / REPORT_NAME
    path.write_text(text, encoding="utf-8")
    return path, Figure is not None
