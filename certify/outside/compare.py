"""`certify compare IMPL...`: the claims on several implementations, side by side (docs/adapters.md).

Each implementation (a name of certify.outside.adapters.SHORTCUTS or reference_impl.VARIANTS, or a
numpy:/torch: spec) runs every claim of claims.IMPLEMENTATION_CLAIMS through claims.certify_claim,
exactly as `certify run ID --optimizer SPEC` would: one sealed certificate per pair, written to
OUT/compare/<label>/<claim>.json (each one verifiable with `certify verify`). The matrix of verdicts
(implementation x claim) goes into OUT/REPORT.md between two markers, replacing an earlier matrix
and leaving the rest of the file (the report of `certify all`) as it is.

A cell reads
  pass                         every check that could run passed and every control was detected
  fail: CHECK (margin M)       the failing check with the largest worst residual/bound M
  inconclusive: REASON         the claim could not run (the reason in one line)
and "; K not observable" when K checks needed the implementation's hidden state (listed below the
matrix, never counted as passed). Below the matrix, per implementation: what it is, the
hyper-parameters it ignores, and the property probes of certify.outside.probes (trust region, step length,
direction, retraction), measured on its first step, which name the property that differs.
"""

from __future__ import annotations

import re
import time
from pathlib import Path

from certify import certificate as certificate_format
from certify import claims
from certify.ci.counterexample import counterexamples_of

MATRIX_BEGIN = "<!-- certify compare: begin -->"
MATRIX_END = "<!-- certify compare: end -->"


def label(spec: str) -> str:
    """A directory name for an implementation: the name itself, or the spec with odd characters replaced."""
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", spec).strip("_") or "implementation"


def _ratio_text(value) -> str:
    ratio = certificate_format.as_float(value)
    return f"{ratio:.3g}"


def cell(certificate: dict) -> str:
    """The matrix cell of one certificate (see the module docstring)."""
    hidden = certificate.get("extra", {}).get("not_observable", [])
    suffix = f"; {len(hidden)} not observable" if hidden else ""
    verdict = certificate["verdict"]
    if verdict == claims.NOT_APPLICABLE:
        return f"not applicable: {certificate['reason']}"
    if verdict == "pass":
        return "pass" + suffix
    if verdict == "fail":
        failing = [c for c in certificate["numerical"]["checks"] if not c.get("passed", False)]
        if failing:
            worst = max(failing, key=lambda c: certificate_format.as_float(c.get("max_ratio")))
            return f"fail: {worst['name']} (margin {_ratio_text(worst.get('max_ratio'))}){suffix}"
        return f"fail: {certificate['failures'][0] if certificate['failures'] else 'see certificate'}{suffix}"
    reasons = certificate.get("inconclusive", [])
    return f"inconclusive: {reasons[0] if reasons else 'see certificate'}"


def run(specs: list[str], *, out_dir: Path, seed: int, profile: str, command: str, progress=print) -> tuple[dict, float]:
    """Certify every (implementation, claim) pair; returns ({spec: {claim: certificate}}, wall seconds)."""
    started = time.perf_counter()
    results: dict[str, dict] = {}
    for spec in specs:
        directory = out_dir / "compare" / label(spec)
        directory.mkdir(parents=True, exist_ok=True)
        results[spec] = {}
        for claim_id in claims.COMPARE_CLAIMS:
            reason = claims.not_applicable(claim_id, spec)
            if reason:  # its own outcome: no certificate, not counted in the exit status
                results[spec][claim_id] = claims.not_applicable_record(claim_id, reason)
                progress(f"{spec} {claim_id}: not applicable ({reason})")
                continue
            sealed, internal_error = claims.certify_claim(claim_id, seed=seed, profile=profile, optimizer=spec, command=command)
            if internal_error:
                progress(f"{spec} {claim_id}: {internal_error}")
            certificate_format.write(sealed, directory / f"{claim_id}.json")
            results[spec][claim_id] = sealed
            progress(f"{spec} {claim_id}: {cell(sealed)} in {certificate_format.run_record(sealed)['wall_seconds']:.2f} s")
    return results, time.perf_counter() - started


def matrix_rows(results: dict) -> list[list[str]]:
    return [[spec] + [cell(results[spec][claim_id]) for claim_id in claims.COMPARE_CLAIMS] for spec in results]


def _escape(text: str) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


def markdown(results: dict, probes: dict, *, seed: int, profile: str, wall_seconds: float, command: str) -> str:
    header = ["implementation"] + list(claims.COMPARE_CLAIMS)
    lines = [
        MATRIX_BEGIN,
        "## Implementations compared",
        "",
        f"`{command}`: seed {seed}, profile {profile}, {wall_seconds:.1f} s in all. Each cell is the certificate "
        "`compare/<implementation>/<claim>.json` beside this report (`certify verify` re-runs it), except where the "
        "claim does not apply (*not applicable*: no certificate, not counted in the exit status). "
        "*not observable*: checks that need the implementation's hidden state (m, v, t), which a black box does "
        "not expose: they are listed below and are not counted as passed. *margin*: worst residual/bound of the "
        "failing check.",
        "",
        "| " + " | ".join(header) + " |",
        "|" + "|".join("---" for _ in header) + "|",
    ]
    lines += ["| " + " | ".join(_escape(c) for c in row) + " |" for row in matrix_rows(results)]
    lines.append("")
    for spec, row in results.items():
        any_certificate = next((c for c in row.values() if c["verdict"] != claims.NOT_APPLICABLE), {})
        implementation = any_certificate.get("extra", {}).get("implementation")
        lines.append(f"### {spec}")
        lines.append("")
        if implementation:
            lines.append(
                f"{implementation['description']} (`{implementation['spec']}`); state "
                f"{'observable' if implementation['state_observable'] else 'not observable (black box: W only)'}; direction "
                f"{implementation['direction']}; dtype {implementation['dtype']}"
                + (f"; ignores {', '.join(implementation['ignored_hyperparameters'])}" if implementation["ignored_hyperparameters"] else "")
                + "."
            )
        else:
            lines.append(f"A reference_impl variant ({spec}), run as `certify run ID --optimizer {spec}`.")
        lines.append("")
        for claim_id, certificate in row.items():
            lines += _claim_lines(claim_id, certificate)
        found = probes.get(spec)
        if found:
            lines.append("")
            lines.append("Property probes (first step from a fresh state, float64; certify/outside/probes.py):")
            lines.append("")
            lines.append("| property | StiefelAdam | measured | differs |")
            lines.append("|---|---|---|---|")
            for probe in found:
                lines.append(f"| {_escape(probe['property'])} | {_escape(probe['expected'])} | {_escape(probe['measured'])} | "
                             f"{'**yes**: ' + _escape(probe['finding']) if probe['differs'] else 'no'} |")
        lines.append("")
    lines.append(MATRIX_END)
    return "\n".join(lines) + "\n"


def _claim_lines(claim_id: str, certificate: dict) -> list[str]:
    """The lines under an implementation's heading for one claim: failures and the minimal
    counterexample, the reason it does not apply or is inconclusive, the checks not observable."""
    lines = []
    failures = certificate.get("failures", [])
    hidden = certificate.get("extra", {}).get("not_observable", [])
    if failures:
        lines.append(f"- {claim_id} failures: " + "; ".join(_escape(f) for f in failures[:4]) + (" ..." if len(failures) > 4 else ""))
        for found in counterexamples_of(certificate):
            if found.get("found"):
                lines.append(f"- {claim_id} minimal counterexample: {_escape(found['summary'])}")
    if certificate["verdict"] == claims.NOT_APPLICABLE:
        lines.append(f"- {claim_id}: not applicable ({_escape(certificate['reason'])}); no certificate")
    if certificate["verdict"] == "inconclusive":
        lines.append(f"- {claim_id}: " + "; ".join(_escape(r) for r in certificate.get("inconclusive", [])[:2]))
    if hidden:
        lines.append(f"- {claim_id} not observable: " + "; ".join(_escape(e["check"]) for e in hidden))
    return lines


def write_matrix(out_dir: Path, text: str) -> Path:
    """Put the matrix into out_dir/REPORT.md: replace the text between the markers, or append it."""
    return write_section(out_dir, text, MATRIX_BEGIN, MATRIX_END)


def write_section(out_dir: Path, text: str, begin: str, end: str) -> Path:
    """Put `text` (which starts with `begin` and ends with `end`) into out_dir/REPORT.md: replace what
    lies between the markers, or append it."""
    path = out_dir / "REPORT.md"
    existing = path.read_text(encoding="utf-8") if path.exists() else "# Certificates\n\n"
    if begin in existing and end in existing:
        before, rest = existing.split(begin, 1)
        updated = before + text.rstrip("\n") + rest.split(end, 1)[1]
    else:
        updated = existing.rstrip("\n") + "\n\n" + text
    path.write_text(updated, encoding="utf-8")
    return path
