"""`certify compare --properties IMPL...` and `certify run ID --properties`: which Stiefel optimizer has
which property (docs/adapters.md#property-verdicts).

For each implementation (resolved with its outputs unchecked, so that its feasibility and domain are
measured, not refused), propositions.properties.ask_all runs the domain trials and asks each claim's
property as a black box; the properties' controls run once per command (they do not depend on the
implementation) and a property whose check missed a control is untested in that run. Whether the
implementation is StiefelAdam's step is a separate line, from the first-step probes
(certify/outside/probes.py). Each implementation's record goes to OUT/properties/<label>.json and the
matrix into OUT/REPORT.md between the markers PROPERTIES_BEGIN and PROPERTIES_END, the rest of the
file kept.

A cell reads `holds`, `fails: CHECK (margin M)`, `vacuous: REASON` or `untested: REASON`.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

from certify.outside import adapters, probes
from certify.outside.compare import label, write_section
from propositions import properties
from propositions._common import to_jsonable
from propositions.kit import precision as precisions

PROPERTIES_BEGIN = "<!-- certify properties: begin -->"
PROPERTIES_END = "<!-- certify properties: end -->"
HEADERS = {"P1": "P1 steepest descent", "P2": "P2 scale free", "P3": "P3 scalar preconditioner", "P4-left": "P4 left O(d)",
           "P4-right": "P4 right O(r)", "P4-signed": "P4 signed permutations", "P5": "P5 blind to coupled decay"}


def properties_of(claim_ids) -> tuple[str, ...]:
    """The property ids of PROPERTY_IDS that claims `claim_ids` (P1..P5) state (P4: its three groups), and
    the property ids among `claim_ids` themselves (P4-left)."""
    wanted = set(claim_ids)
    return tuple(p for p in properties.PROPERTY_IDS if p in wanted or p.split("-")[0] in wanted)


def resolve(spec: str):
    """The unchecked Variant of a spec (a reference_impl variant as it is); AdapterError when unusable."""
    from reference_impl import VARIANTS

    return VARIANTS[spec] if spec in VARIANTS else adapters.resolve(spec, checked=False)


def stiefel_adam_line(variant, seed: int) -> dict:
    """Whether the first step is StiefelAdam's, from the probes: {"same": bool, "text", "probes"}."""
    found = probes.probe(variant, seed=seed)
    differing = [f"{p['property']}: {p['finding']}" for p in found if p["differs"]]
    text = "yes: every first-step probe agrees" if not differing else "no: " + "; ".join(differing)
    return {"same": not differing, "text": text, "probes": found}


def ask(spec: str, variant, seed: int, only, control_records: list, regimes=properties.DEFAULT_REGIMES) -> dict:
    """One implementation's record: its description, domain, determinism, verdicts (after the controls)
    and probes. What a property certificate seals of it (implementation_record) is what a run of that
    property alone finds too: nothing here depends on which other properties ran in the same runner."""
    started = time.perf_counter()
    found = properties.ask_all(variant, seed, only=only, regimes=regimes)
    found["properties"] = properties.apply_controls(found["properties"], control_records)
    described = adapters.describe(variant) if hasattr(variant, "spec") else {"name": spec, "description": variant.description}
    return {"implementation": spec, "described": described, "precision": precisions.of(variant).describe(), **found,
            "stiefel_adam_step": stiefel_adam_line(variant, seed), "seconds": time.perf_counter() - started}


def implementation_record(record: dict, property_id: str) -> dict:
    """What a property certificate records of its implementation: the description, precision, domain,
    determinism, regimes, the frames left out in this property's runs, and whether its step is
    StiefelAdam's (a separate statement)."""
    claim = property_id.split("-")[0]
    excluded = [row for row in record["excluded"] if row["case"].split(":")[0].split()[0] == claim]
    return {key: record[key] for key in ("described", "precision", "domain", "eps_zero", "determinism", "regimes", "stiefel_adam_step")} | {
        "excluded": excluded}


def run(variants: dict, *, seed: int, claim_ids, out_dir: Path, profile: str = "default", command: str = "certify compare --properties",
        git: dict | None = None, progress=print) -> tuple[dict, list, float]:
    """Ask every implementation of `variants` ({spec: unchecked Variant}) at the profile's regimes;
    write one sealed certificate per property to OUT/properties/<label>/<property>.json. Returns
    ({spec: record}, the control records, wall seconds); each record's "certificates" maps a property
    to its certificate's path."""
    from certify import certificate as certificate_format
    from certify import environment as environment_record
    from certify.outside import property_certificate

    started = time.perf_counter()
    git = git if git is not None else environment_record.git_state()
    regimes = properties.REGIMES[profile]
    only = properties_of(claim_ids)
    control_records = properties.controls(seed, only, regimes)
    missed = [c for c in control_records if not c["detected"]]
    progress(f"controls: {len(control_records) - len(missed)} of {len(control_records)} told apart"
             + (f"; missed: {', '.join(c['property'] + ' ' + c['control'] for c in missed)}" if missed else ""))
    records = {}
    for spec, variant in variants.items():
        record = ask(spec, variant, seed, only, control_records, regimes)
        record["certificates"], record["sealed"] = {}, {}
        for found in record["properties"]:
            sealed = property_certificate.build(found, implementation_record(record, found["property"]), control_records, spec=spec,
                                                variant=variant, seed=seed, profile=profile, command=command, git=git,
                                                wall_seconds=record["seconds"])
            record["sealed"][found["property"]] = sealed
            found["certificate_verdict"] = sealed["verdict"]
            if out_dir is not None:  # None: verify's re-run, which writes nothing
                path = Path(out_dir) / "properties" / label(spec) / f"{found['property']}.json"
                record["certificates"][found["property"]] = certificate_format.write(sealed, path, validated=True)
        records[spec] = record
        progress(f"{spec}: " + "; ".join(f"{v['property']} {cell(v)}" for v in record["properties"]) + f" ({record['seconds']:.1f} s)")
    return records, control_records, time.perf_counter() - started


def rerun(recorded: dict, command: str) -> tuple[dict, str | None]:
    """A property certificate made again from its recorded property, implementation, seed and profile
    (`certify verify`): (the sealed certificate, None)."""
    from certify import environment as environment_record

    provenance, property_id = recorded["provenance"], recorded["property"]["id"]
    spec = provenance["optimizer"]
    records, _, _ = run({spec: resolve(spec)}, seed=provenance["seed"], claim_ids=(property_id,), out_dir=None, profile=provenance["profile"],
                        command=command, git=environment_record.git_state(), progress=lambda line: None)
    return records[spec]["sealed"][property_id], None


def records_from_certificates(certificates: list[dict]) -> dict:
    """{implementation: record} as run() returns them, from property certificates (loaded with
    certificate.load): what the matrix and README's table are written from."""
    records: dict = {}
    for certificate in certificates:
        stated = certificate["property"]
        record = records.setdefault(stated["implementation"], {"properties": [], "stiefel_adam_step": certificate["extra"]["implementation"]["stiefel_adam_step"]})
        record["properties"].append({"property": stated["id"], "verdict": stated["verdict"], "check": stated["check"], "margin": stated["margin"],
                                     "reason": stated["reason"], "certificate_verdict": certificate["verdict"]})
    for record in records.values():
        record["properties"].sort(key=lambda v: properties.PROPERTY_IDS.index(v["property"]))
    return records


def cell(found: dict) -> str:
    """The matrix cell of one verdict record (module docstring)."""
    if found["verdict"] == "fails":
        return f"fails: {found['check']} (margin {found['margin']:.3g})"
    if found["verdict"] in ("vacuous", "untested"):
        return f"{found['verdict']}: {found['reason']}"
    return found["verdict"]


def matrix_rows(records: dict) -> list[list[str]]:
    rows = []
    for spec, record in records.items():
        rows.append([spec] + [cell(v) for v in record["properties"]] + [record["stiefel_adam_step"]["text"].split(":")[0]])
    return rows


def _escape(text) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


def markdown(records: dict, control_records: list, *, seed: int, wall_seconds: float, command: str) -> str:
    first = next(iter(records.values()), {"properties": []})
    header = ["implementation"] + [HEADERS[v["property"]] for v in first["properties"]] + ["StiefelAdam's step"]
    lines = [PROPERTIES_BEGIN, "## Which Stiefel optimizers have which property", "",
             f"`{command}`: seed {seed}, {wall_seconds:.1f} s in all. Each claim's property asked of the implementation as a "
             "black box (docs/adapters.md#property-verdicts): *holds*, *fails* (the check and its margin, residual / bound), "
             "*vacuous* (it holds because the implementation ignores the setting) or *untested* (why). The last column is "
             "not a property: whether the first step is StiefelAdam's (the probes below).", "",
             "| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(_escape(c) for c in row) + " |" for row in matrix_rows(records)]
    lines += ["", "Controls (each property's check on a broken step, which it must tell by at least 10 times its bound): "
              + "; ".join(f"{c['property']} {c['control']}: {c['verdict']}" + (f" (margin {c['margin']:.3g})" if c["margin"] is not None else "")
                          + ("" if c["detected"] else " **missed**") for c in control_records) + ".", ""]
    for spec, record in records.items():
        lines += implementation_section(spec, record)
    lines.append(PROPERTIES_END)
    return "\n".join(lines) + "\n"


def implementation_section(spec: str, record: dict) -> list[str]:
    """The details of one implementation below the matrix."""
    described = record["described"]
    lines = [f"### {spec}", "", f"{described.get('description', spec)}; {described.get('calling', 'batched')}; "
             + (f"feasibility phi = max ||W^T W - I||_F = {record['phi']:.3g}" if record["phi"] is not None else
                "feasibility phi not finite (a returned frame's W^T W overflows)") + f" over {record['calls']} step calls, "
             f"{record['seconds']:.1f} s.", ""]
    lines.append("Domain trials: " + "; ".join(f"{row['case']}: {row['failed']} of {row['frames']} frames failed"
                                               + (f" ({_escape(row['reason'])})" if row["reason"] else "") for row in record["domain"]) + ".")
    repeats = record.get("determinism")
    if repeats:
        lines.append(f"Determinism: {repeats['repeats']} runs of identical inputs, {repeats['frame_steps_compared']} frame-steps compared: "
                     + ("bit for bit the same (comparisons may be read bit for bit)." if repeats["deterministic"] else
                        f"**not deterministic**: {repeats['differing']} frame-steps differ, by up to {repeats['max_distance']:.3g}, "
                        "the noise floor every bound carries; no verdict is read from a bit-for-bit comparison."))
    for excluded in record["excluded"]:
        lines.append(f"- left out, {excluded['case']}: {excluded['frames']} frame(s): {_escape(excluded['reason'])}")
    for found in record["properties"]:
        figures = "; ".join(f"{key} {_escape(json.dumps(to_jsonable(value)))}" for key, value in found["measured"].items())
        checks = "; ".join(f"{c['name']} max ratio {c.get('max_ratio', float('nan')):.3g} over {c['samples']}"
                           + (f" ({c['unresolved']} more not resolved at this precision)" if c.get("unresolved") else "")
                           + (f", bit-identical {c['bit_identical']}" if "bit_identical" in c else "") for c in found["checks"])
        lines.append(f"- {found['property']} ({_escape(found['statement'])}): **{found['verdict']}**"
                     + (f": {_escape(found['reason'])}" if found["reason"] else "") + (f". {checks}" if checks else "")
                     + (f". {figures}" if figures else ""))
    lines += ["", f"StiefelAdam's step: {_escape(record['stiefel_adam_step']['text'])}.", ""]
    return lines


TABLE_BEGIN = "<!-- certify properties table: begin -->"
TABLE_END = "<!-- certify properties table: end -->"


def table(records: dict, *, command: str) -> str:
    """The matrix alone, between TABLE_BEGIN and TABLE_END, for a page of its own (README.md's table of
    the optimizers people install): the command that wrote it, then one row per implementation."""
    first = next(iter(records.values()), {"properties": []})
    header = ["implementation"] + [HEADERS[v["property"]] for v in first["properties"]] + ["StiefelAdam's step"]
    lines = [TABLE_BEGIN, f"<!-- written by `{command}`: do not edit by hand -->", "",
             "| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(_escape(c) for c in row) + " |" for row in matrix_rows(records)]
    return "\n".join(lines + ["", TABLE_END]) + "\n"


def write_table(path: Path, text: str) -> Path:
    """Replace what lies between the table markers of `path` by `text`; ValueError naming the markers
    where the file has none (a table is never appended to a page it was not placed in)."""
    existing = path.read_text(encoding="utf-8")
    if TABLE_BEGIN not in existing or TABLE_END not in existing:
        raise ValueError(f"{path} has no {TABLE_BEGIN} ... {TABLE_END} markers: put them where the table goes")
    before, rest = existing.split(TABLE_BEGIN, 1)
    path.write_text(before + text.rstrip("\n") + rest.split(TABLE_END, 1)[1], encoding="utf-8")
    return path


def write(out_dir: Path, text: str) -> Path:
    """Put the matrix into out_dir/REPORT.md: replace the text between the markers, or append it."""
    return write_section(out_dir, text, PROPERTIES_BEGIN, PROPERTIES_END)


__all__ = ["HEADERS", "PROPERTIES_BEGIN", "PROPERTIES_END", "TABLE_BEGIN", "TABLE_END", "table", "write_table", "cell", "markdown", "matrix_rows", "properties_of", "resolve", "run", "write"]
