"""How `certify verify` decides whether a re-run reproduces its certificate, and its tolerance report.

A certificate is re-run from its recorded seed, profile, optimizer and options, and the two are
compared in two tiers (docs/certificates.md, "How verify decides"):

* On every machine: the verdict, the symbolic status, the pass/fail of every check and exact check,
  the detection of every control and the check that caught it, the checks and controls present,
  and what the seed and profile fix (frames, samples and shapes per check, the reproduce
  command). The recorded certificate must also agree with itself: a check marked passed has its
  worst residual/bound at most 1, a control marked detected has its margin at least its detection
  factor, the rounding fingerprint hashes to its own sha256. Any difference fails verification.
  Every re-run check that passed has every residual within its bound, so "the re-run passes where
  the certificate says it passes" is the tolerance statement that holds across machines.
* Only where the rounding fingerprint of the re-run equals the recorded one (same kernels, same
  thread counts, same library versions: certify.environment.rounding_fingerprint): every residual
  statistic, bound and ratio must be bit-identical, since the run is deterministic. Elsewhere the
  residual differences are reported as notes, never as a failure.

The run record (`run`, or the timing in a 1.1 certificate's provenance) and the environment description are never
compared.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field

from certify import certificate as certificate_format
from certify import environment as environment_record



@dataclass
class Row:
    """One line of the tolerance report: a check or a control, recorded against re-run.

    kind: "check" or "control"; residual: the worst residual (max over samples of a check, the
    deciding sample of a control); bound: the check's largest per-sample bound, the control's bound
    at its deciding sample; ratio: worst residual/bound of a check, margin of a control; passed:
    passed of a check, detected of a control; None where the side does not have the item.
    """

    kind: str
    name: str
    recorded_residual: object = None
    rerun_residual: object = None
    recorded_bound: object = None
    rerun_bound: object = None
    recorded_ratio: object = None
    rerun_ratio: object = None
    recorded_passed: bool | None = None
    rerun_passed: bool | None = None
    bit_identical: bool = False
    # the residuals and the re-run bound at the sample that decides (a check's largest residual/bound,
    # a control's deciding sample): what the tolerance table shows, so residual / bound = ratio on a row
    recorded_deciding_residual: object = None
    rerun_deciding_residual: object = None
    rerun_deciding_bound: object = None


@dataclass
class Comparison:
    """The outcome of comparing a certificate with its re-run.

    differences: each fails verification; notes: reported, never a failure; fingerprint_match:
    whether the re-run's rounding fingerprint is the recorded one (bit for bit then required);
    fingerprint_differences: what differs between the two fingerprints, for people.
    """

    differences: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    fingerprint_match: bool = False
    fingerprint_differences: list[str] = field(default_factory=list)
    rows: list[Row] = field(default_factory=list)

    @property
    def agrees(self) -> bool:
        return not self.differences


def _canonical(value) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"))


def _by_name(items) -> dict:
    return {item.get("name"): item for item in items}


def _outcome_differences(recorded: dict, reproduced: dict) -> list[str]:
    """Verdicts, flags, counts, shapes and command: what must agree on every machine."""
    differences: list[str] = []
    if recorded["verdict"] != reproduced["verdict"]:
        differences.append(f"verdict {recorded['verdict']} recorded, {reproduced['verdict']} reproduced")
    # what the certificate says it certified, and in which precision: the re-run states it anew
    for name, old, new in (("id", recorded.get("id"), reproduced.get("id")), ("title", recorded.get("title"), reproduced.get("title")),
                           ("statement", recorded.get("statement"), reproduced.get("statement"))):
        if _canonical(old) != _canonical(new):
            differences.append(f"{name} {old!r} recorded, {new!r} reproduced")
    if "precision" in recorded["numerical"]:  # schema 1.3
        for name in ("dtype", "precision"):
            if _canonical(recorded["numerical"].get(name)) != _canonical(reproduced["numerical"].get(name)):
                differences.append(f"numerical.{name} {recorded['numerical'].get(name)!r} recorded, {reproduced['numerical'].get(name)!r} reproduced")
    # a property certificate: which property of which implementation, and the property's own verdict
    for member in ("id", "claim", "implementation", "verdict", "check"):
        old, new = (recorded.get("property") or {}).get(member), (reproduced.get("property") or {}).get(member)
        if old != new:
            differences.append(f"property {member} {old!r} recorded, {new!r} reproduced")
    if recorded["symbolic"].get("status") != reproduced["symbolic"].get("status"):
        differences.append(f"symbolic status {recorded['symbolic'].get('status')} recorded, {reproduced['symbolic'].get('status')} reproduced")
    pairs = (
        ("check", _by_name(recorded["numerical"]["checks"]), _by_name(reproduced["numerical"]["checks"]), "passed"),
        ("control", _by_name(recorded["controls"]), _by_name(reproduced["controls"]), "detected"),
        ("exact check", _by_name(recorded["exact"]), _by_name(reproduced["exact"]), "passed"),
    )
    for kind, old, new, flag in pairs:
        for name in sorted(old.keys() - new.keys(), key=str):
            differences.append(f"{kind} {name} recorded but not reproduced")
        for name in sorted(new.keys() - old.keys(), key=str):
            differences.append(f"{kind} {name} reproduced but not recorded")
        for name in sorted(old.keys() & new.keys(), key=str):
            if bool(old[name].get(flag)) != bool(new[name].get(flag)):
                differences.append(f"{kind} {name}: {flag} {bool(old[name].get(flag))} recorded, {bool(new[name].get(flag))} reproduced")

    # What the seed and profile fix on every machine: how much evidence, over which shapes, and the
    # command that reproduces it. A re-sealed certificate with doctored counts or command fails here.
    for name in ("frames", "seed", "profile"):
        if recorded["numerical"].get(name) != reproduced["numerical"].get(name):
            differences.append(f"numerical.{name} {recorded['numerical'].get(name)!r} recorded, {reproduced['numerical'].get(name)!r} reproduced")
    if recorded["provenance"].get("reproduce") != reproduced["provenance"].get("reproduce"):
        differences.append(f"reproduce command {recorded['provenance'].get('reproduce')!r} recorded, {reproduced['provenance'].get('reproduce')!r} reproduced")
    old_checks, new_checks = pairs[0][1], pairs[0][2]
    for name in sorted(old_checks.keys() & new_checks.keys(), key=str):
        for member in ("samples", "shapes"):
            if old_checks[name].get(member) != new_checks[name].get(member):
                differences.append(f"check {name}: {member} {old_checks[name].get(member)!r} recorded, {new_checks[name].get(member)!r} reproduced")
    old_controls, new_controls = pairs[1][1], pairs[1][2]
    for name in sorted(old_controls.keys() & new_controls.keys(), key=str):
        if old_controls[name].get("check") != new_controls[name].get("check"):
            differences.append(f"control {name}: caught by {old_controls[name].get('check')!r} recorded, {new_controls[name].get('check')!r} reproduced")
    return differences + _counterexample_differences(recorded, reproduced)


# The decisions of the counterexample search (certify.ci.counterexample): deterministic for a seed, and
# taken on residual/bound comparisons, so they agree on every machine as the checks' pass/fail do.
COUNTEREXAMPLE_DECISIONS = ("found", "replayed_check", "parameters", "first_diverging_step", "stage")


def _counterexample_differences(recorded: dict, reproduced: dict) -> list[str]:
    """The search's decisions, per recorded counterexample (a shrunk scenario's decision is the scenario itself)."""
    keys = sorted({k for c in (recorded, reproduced) for k in (c.get("extra") or {}) if k == "counterexample" or k.startswith("counterexample_")})
    differences = []
    for key in keys:
        old = recorded.get("extra", {}).get(key) or {}
        new = reproduced.get("extra", {}).get(key) or {}
        pairs = [(member, old.get(member), new.get(member)) for member in COUNTEREXAMPLE_DECISIONS]
        pairs.append(("scenario", (old.get("replay") or {}).get("scenario"), (new.get("replay") or {}).get("scenario")))
        label = "minimal counterexample" + ("" if key == "counterexample" else f" ({key[len('counterexample_'):]})")
        differences += [f"{label}: {member} {a!r} recorded, {b!r} reproduced" for member, a, b in pairs if _canonical(a) != _canonical(b)]
    return differences


def _self_contradictions(recorded: dict) -> list[str]:
    """Where a (re-sealed) certificate contradicts its own numbers; each is a difference. load()
    already refuses such a certificate (certificate.contradictions); this also holds for one built
    in memory, and checks that the rounding fingerprint hashes to its recorded sha256."""
    found = certificate_format.contradictions(recorded)
    fingerprint = recorded.get("environment", {}).get("rounding_fingerprint")
    if isinstance(fingerprint, dict) and fingerprint.get("sha256") != environment_record.fingerprint_digest(fingerprint):
        found.append("the recorded rounding fingerprint does not hash to its recorded sha256 (it was edited after it was taken)")
    return found


def _at_worst(check: dict, member: str):
    """A check's residual or bound at its worst sample (the one of largest residual/bound), so that the
    row's residual, bound and ratio belong together; a check that records no worst sample gives its
    largest residual and largest bound, which may come from two samples."""
    worst = check.get("worst_case") or {}
    if member in worst:
        return worst[member]
    return (check.get(member) or {}).get("max")


def _rows(recorded: dict, reproduced: dict) -> list[Row]:
    rows = []
    old, new = _by_name(recorded["numerical"]["checks"]), _by_name(reproduced["numerical"]["checks"])
    for name in list(old) + [name for name in new if name not in old]:
        before, after = old.get(name, {}), new.get(name, {})
        numbers = lambda check: [check.get("residual"), check.get("bound"), check.get("max_ratio")]  # noqa: E731
        rows.append(Row(
            "check", name,
            (before.get("residual") or {}).get("max"), (after.get("residual") or {}).get("max"),
            (before.get("bound") or {}).get("max"), (after.get("bound") or {}).get("max"),
            before.get("max_ratio"), after.get("max_ratio"),
            before.get("passed") if before else None, after.get("passed") if after else None,
            bool(before) and bool(after) and _canonical(numbers(before)) == _canonical(numbers(after)),
            _at_worst(before, "residual"), _at_worst(after, "residual"), _at_worst(after, "bound"),
        ))
    old, new = _by_name(recorded["controls"]), _by_name(reproduced["controls"])
    for name in list(old) + [name for name in new if name not in old]:
        before, after = old.get(name, {}), new.get(name, {})
        numbers = lambda control: [control.get("residual"), control.get("bound"), control.get("margin")]  # noqa: E731
        rows.append(Row(
            "control", name,
            before.get("residual"), after.get("residual"),
            before.get("bound"), after.get("bound"),
            before.get("margin"), after.get("margin"),
            before.get("detected") if before else None, after.get("detected") if after else None,
            bool(before) and bool(after) and _canonical(numbers(before)) == _canonical(numbers(after)),
            before.get("residual"), after.get("residual"), after.get("bound"),
        ))
    return rows


def _largest_relative_difference(rows: list[Row]) -> tuple[float, str | None]:
    """The largest relative difference of the worst residuals, and which row has it."""
    largest = (0.0, None)
    for row in rows:
        if row.recorded_passed is None or row.rerun_passed is None:
            continue
        before, after = certificate_format.as_float(row.recorded_residual), certificate_format.as_float(row.rerun_residual)
        if before == after or (math.isnan(before) and math.isnan(after)):
            continue
        scale = max(abs(before), abs(after))
        relative = abs(before - after) / scale if math.isfinite(scale) and scale > 0 else math.inf
        if relative > largest[0] or largest[1] is None:
            largest = (relative, f"{row.kind} {row.name}")
    return largest


def compare(recorded: dict, reproduced: dict) -> Comparison:
    """Compare a certificate with its re-run (see the module docstring for what is required where)."""
    comparison = Comparison(rows=_rows(recorded, reproduced))
    comparison.differences = _outcome_differences(recorded, reproduced) + _self_contradictions(recorded)

    old_fingerprint = recorded.get("environment", {}).get("rounding_fingerprint")
    new_fingerprint = reproduced.get("environment", {}).get("rounding_fingerprint")
    comparison.fingerprint_match = (
        isinstance(old_fingerprint, dict) and isinstance(new_fingerprint, dict)
        and old_fingerprint.get("sha256") == new_fingerprint.get("sha256")
        and old_fingerprint.get("sha256") == environment_record.fingerprint_digest(old_fingerprint)
    )
    if not comparison.fingerprint_match:
        comparison.fingerprint_differences = environment_record.fingerprint_differences(old_fingerprint, new_fingerprint)

    compared = [row for row in comparison.rows if row.recorded_passed is not None and row.rerun_passed is not None]
    if not compared:
        return comparison
    identical = sum(row.bit_identical for row in compared)
    relative, where = _largest_relative_difference(compared)
    if identical == len(compared):
        comparison.notes.append(f"all {len(compared)} worst residuals reproduced bit for bit")
        return comparison
    spread = f"largest relative difference {relative:.3g} ({where})" if where else "worst residuals equal, other statistics differ"
    if comparison.fingerprint_match:
        # same kernels on the same inputs with the same threads and versions: the run is
        # deterministic, so a changed number is a changed certificate, not rounding
        comparison.differences.append(
            f"residuals differ in {len(compared) - identical} of {len(compared)} checks and controls ({spread}) although the "
            "rounding fingerprint matches the recorded one, where the re-run is bit for bit"
        )
        return comparison
    checks = [row for row in compared if row.kind == "check"]
    within = [row for row in checks if row.rerun_passed]
    comparison.notes.append(
        f"residuals differ in {len(compared) - identical} of {len(compared)} checks and controls ({spread}); the rounding "
        "fingerprint differs from the recorded one, so they are not required bit for bit"
    )
    if len(within) == len(checks):
        comparison.notes.append(f"every re-run residual is within its bound (all {len(checks)} re-run checks passed)")
    else:
        over = ", ".join(row.name for row in checks if not row.rerun_passed)
        comparison.notes.append(f"{len(within)} of {len(checks)} re-run checks have every residual within its bound; over it: {over}")
    return comparison


# --------------------------------------------------------------------------------------------
# The tolerance report
# --------------------------------------------------------------------------------------------

TABLE_HEADER = ["check / control", "recorded residual", "re-run residual", "re-run bound", "re-run ratio", "pass", "bit-identical"]


def _number(value) -> str:
    if value is None:
        return "-"
    number = certificate_format.as_float(value)
    return str(value) if not math.isfinite(number) else f"{number:.4g}"


def _flag(recorded: bool | None, rerun: bool | None, yes: str) -> str:
    def word(flag):
        return "-" if flag is None else (yes if flag else "no")

    return word(rerun) if recorded == rerun else f"{word(recorded)} -> {word(rerun)}"


def table_rows(comparison: Comparison) -> list[list[str]]:
    """The rows of the tolerance table (TABLE_HEADER): one per check and control.

    ratio: re-run worst residual/bound of a check (<= 1 passes), re-run margin of a control
    (>= its detection factor detects); pass: passed / detected, "recorded -> re-run" when they differ.
    """
    rows = []
    for row in comparison.rows:
        label = row.name if row.kind == "check" else f"control {row.name}"
        rows.append([
            label,
            _number(row.recorded_deciding_residual),
            _number(row.rerun_deciding_residual),
            _number(row.rerun_deciding_bound),
            _number(row.rerun_ratio),
            _flag(row.recorded_passed, row.rerun_passed, "yes" if row.kind == "check" else "detected"),
            "yes" if row.bit_identical else "no",
        ])
    return rows


def fingerprint_line(comparison: Comparison, recorded: dict, reproduced: dict) -> str:
    """One line: whether the fingerprints match, what that requires, and what differs."""
    old = (recorded.get("environment", {}).get("rounding_fingerprint") or {}).get("sha256")
    new = (reproduced.get("environment", {}).get("rounding_fingerprint") or {}).get("sha256")
    if comparison.fingerprint_match:
        return f"rounding fingerprint {str(new)[:12]} matches the recorded one: residuals must reproduce bit for bit"
    what = "; ".join(comparison.fingerprint_differences) or "its hash"
    return (
        f"rounding fingerprint {str(new)[:12]} here, {str(old)[:12]} recorded (differs in {what}): verdicts, pass/fail, "
        "detections, counts and shapes must agree, residuals may differ within their bounds"
    )


def verdict_line(name: str, recorded: dict, comparison: Comparison) -> str:
    """The short per-certificate verdict: reproduced or DIFFERS, with counts."""
    checks, controls = len(recorded["numerical"]["checks"]), len(recorded["controls"])
    if comparison.differences:
        return f"{name}: DIFFERS from its re-run: " + "; ".join(comparison.differences)
    return f"{name}: reproduced: verdict {recorded['verdict']}, {checks} checks and {controls} controls agree"


def markdown(entries: list[tuple[str, dict, dict, Comparison]], *, header: list[str]) -> str:
    """The tolerance report as markdown: entries are (file name, recorded, re-run, comparison)."""
    lines = ["# Verification report", "", *header, ""]
    for name, recorded, reproduced, comparison in entries:
        outcome = "DIFFERS from its re-run" if comparison.differences else "reproduced"
        lines += [f"## {recorded['id']}: {recorded['title']}", ""]
        lines += [
            f"`{name}` · recorded verdict **{recorded['verdict']}**, re-run verdict **{reproduced['verdict']}** · **{outcome}** · "
            f"digest `{recorded['digest']['value'][:16]}` · reproduce: `{recorded['provenance']['reproduce']}`",
            "",
            fingerprint_line(comparison, recorded, reproduced) + ".",
            "",
        ]
        rows = table_rows(comparison)
        if rows:
            lines += ["| " + " | ".join(TABLE_HEADER) + " |", "|" + "---|" * len(TABLE_HEADER)]
            lines += ["| " + " | ".join(cell.replace("|", "\\|") for cell in row) + " |" for row in rows]
            lines += [""]
        for difference in comparison.differences:
            lines.append(f"- difference: {difference}")
        for note in comparison.notes:
            lines.append(f"- note: {note}")
        if comparison.differences or comparison.notes:
            lines.append("")
    return "\n".join(lines).rstrip() + "\n"
