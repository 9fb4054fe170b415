"""The certificate: one JSON document per claim (docs/certificates.md), its schema and its digest.

A certificate is a JSON object with the members required by `certificate.schema.json` (shipped
beside this module). It is sealed by `digest`: sha256 over the *canonical JSON* of every other
member except `run` (the record of how this run went: command line, date, wall time, workers,
host; the evidence does not depend on it, so it is neither sealed nor compared), i.e. `json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=True,
allow_nan=False)` encoded as ASCII. Any edit of any other member, however small, changes the digest, and
`certify verify` rejects a file whose recorded digest does not match its content.

Schema 1.1 (the layout before `run`: command, created_utc and timing in `provenance`, under the
digest) is still read: its schema file is certificate.schema-1.1.json and its digest is computed
the same way (a 1.1 certificate has no `run` member to leave out).

Non-finite numbers never reach the JSON: they are the strings "inf", "-inf", "nan"
(propositions._common.to_jsonable), so every certificate is strict JSON.
"""

from __future__ import annotations

import hashlib
import json
import math
import shlex
from functools import lru_cache
from importlib import resources
from pathlib import Path

from certify import CROSSCHECK_ID, DEFAULT_OPTIMIZER, READABLE_SCHEMA_VERSIONS, SCHEMA_VERSION

DIGEST_ALGORITHM = "sha256"
# Members the digest does not cover: the digest itself and the run record.
UNSEALED_MEMBERS = ("digest", "run")
DOCS_PAGE = "docs/claims.md"


def docs_pointer(claim_id: str) -> str:
    """Where the project's documentation states and explains a claim: 'docs/claims.md#p3'."""
    return f"{DOCS_PAGE}#{claim_id.lower()}"


class CertificateError(ValueError):
    """A certificate file that cannot be used: unreadable, malformed, tampered or of another schema."""


class SchemaViolation(RuntimeError):
    """A certificate built by this program that does not match its own schema (an internal error)."""


def canonical_json(body: dict) -> bytes:
    """The canonical byte string that the digest covers (sorted keys, compact, ASCII, no NaN)."""
    return json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=True, allow_nan=False).encode("ascii")


def compute_digest(certificate: dict) -> str:
    """sha256 hex digest over the canonical JSON of the certificate without its 'digest' and 'run' members."""
    body = {key: value for key, value in certificate.items() if key not in UNSEALED_MEMBERS}
    return hashlib.sha256(canonical_json(body)).hexdigest()


def seal(certificate: dict) -> dict:
    """A copy of the certificate with its digest member set to the digest of the rest."""
    sealed = {key: value for key, value in certificate.items() if key != "digest"}
    sealed["digest"] = {"algorithm": DIGEST_ALGORITHM, "value": compute_digest(sealed)}
    return sealed


def run_record(certificate: dict) -> dict:
    """wall_seconds, frames_per_second, command, created_utc and git_tree_clean of any layout (1.2 and 1.3: `run`; 1.1: `provenance`)."""
    if "run" in certificate:
        # 1.2 sealed git_tree_clean in provenance; 1.3 records it here
        return {"git_tree_clean": certificate.get("provenance", {}).get("git_tree_clean"), **certificate["run"]}
    provenance = certificate.get("provenance", {})
    return {**provenance.get("timing", {}), "command": provenance.get("command"), "created_utc": provenance.get("created_utc"),
            "git_tree_clean": provenance.get("git_tree_clean")}


@lru_cache(maxsize=None)
def schema(version: str = SCHEMA_VERSION) -> dict:
    """The JSON Schema of a certificate (certify/certificate.schema.json; older versions beside it)."""
    name = "certificate.schema.json" if version == SCHEMA_VERSION else f"certificate.schema-{version}.json"
    text = resources.files("certify").joinpath(name).read_text(encoding="utf-8")
    return json.loads(text)


@lru_cache(maxsize=None)
def _validator(version: str = SCHEMA_VERSION):
    import jsonschema

    schema_document = schema(version)
    validator_class = jsonschema.validators.validator_for(schema_document)
    validator_class.check_schema(schema_document)
    return validator_class(schema_document)


def schema_errors(certificate: object, version: str = SCHEMA_VERSION) -> list[str]:
    """Every way the certificate departs from the schema (of `version`), one readable line each (empty: valid)."""
    errors = sorted(_validator(version).iter_errors(certificate), key=lambda error: list(error.absolute_path))
    lines = []
    for error in errors:
        where = "/".join(str(part) for part in error.absolute_path) or "(top level)"
        lines.append(f"{where}: {error.message}")
    return lines


def validate(certificate: dict) -> None:
    """SchemaViolation naming the first problem (and how many there are) when the schema is not met."""
    errors = schema_errors(certificate)
    if errors:
        more = f" (and {len(errors) - 1} more)" if len(errors) > 1 else ""
        raise SchemaViolation(f"certificate {certificate.get('id', '?')} does not match the schema: {errors[0]}{more}")


def _reject_constant(name: str):
    raise ValueError(f"non-standard JSON constant {name}")


def write(certificate: dict, path: Path, *, validated: bool = False) -> Path:
    """Validate, seal and write one certificate; returns the path. SchemaViolation if invalid.

    validated: the caller already validated this certificate as sealed here (claims.certify_claim
    does, in the worker that made it; the schema check is a tenth of a second of CPU per
    certificate). The file is written to a temporary name and renamed, so a reader never sees half
    a certificate.
    """
    sealed = seal(certificate)
    if not validated or sealed["digest"] != certificate.get("digest"):
        validate(sealed)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = path.with_name(path.name + ".tmp")
    temporary.write_text(json.dumps(sealed, indent=2, sort_keys=True, ensure_ascii=True, allow_nan=False) + "\n", encoding="ascii")
    temporary.replace(path)
    return path


def load(path: Path) -> dict:
    """Read a certificate and check, in this order, JSON, schema version, digest and schema.

    Raises CertificateError with one line saying what is wrong with which file.
    """
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise CertificateError(f"{path}: no such file") from None
    except IsADirectoryError:
        raise CertificateError(f"{path}: is a directory, not a certificate file") from None
    except (OSError, UnicodeDecodeError) as error:
        raise CertificateError(f"{path}: cannot be read ({error.__class__.__name__}: {error})") from None
    try:
        certificate = json.loads(text, parse_constant=_reject_constant)
    except (json.JSONDecodeError, ValueError) as error:
        raise CertificateError(f"{path}: not valid JSON ({error})") from None
    if not isinstance(certificate, dict):
        raise CertificateError(f"{path}: not a certificate (a JSON object was expected, found {type(certificate).__name__})")
    if "schema_version" not in certificate:
        raise CertificateError(f"{path}: not a certificate (no schema_version member)")
    version = certificate["schema_version"]
    if version not in READABLE_SCHEMA_VERSIONS:
        raise CertificateError(f"{path}: certificate of schema version {version!r}; this certify reads schema versions {', '.join(map(repr, READABLE_SCHEMA_VERSIONS))}")
    digest = certificate.get("digest")
    if not isinstance(digest, dict) or digest.get("algorithm") != DIGEST_ALGORITHM or not isinstance(digest.get("value"), str):
        raise CertificateError(f"{path}: certificate has no {DIGEST_ALGORITHM} digest")
    try:
        actual = compute_digest(certificate)
    except (TypeError, ValueError) as error:
        raise CertificateError(f"{path}: content cannot be put in canonical form ({error})") from None
    if actual != digest["value"]:
        raise CertificateError(
            f"{path}: digest mismatch: the content was changed after it was certified "
            f"(recorded {digest['value'][:12]}..., content hashes to {actual[:12]}...)"
        )
    errors = schema_errors(certificate, version)
    if errors:
        more = f" (and {len(errors) - 1} more)" if len(errors) > 1 else ""
        raise CertificateError(f"{path}: does not match the certificate schema: {errors[0]}{more}")
    found = contradictions(certificate)
    if found:
        more = f" (and {len(found) - 1} more)" if len(found) > 1 else ""
        raise CertificateError(f"{path}: contradicts itself: {found[0]}{more}; refused, although its digest matches")
    return certificate


def reproduce_command(claim_id: str, seed: int, profile: str, optimizer: str, options: dict) -> str:
    """The command line that re-creates a certificate with these settings (its provenance.reproduce)."""
    if claim_id == CROSSCHECK_ID:
        command = f"certify crosscheck --device {options.get('device', 'cpu')} --dtype {options.get('dtype', 'float64')}"
    else:
        command = f"certify run {claim_id}"
    command += f" --seed {seed} --profile {profile}"
    if optimizer != DEFAULT_OPTIMIZER:
        command += f" --optimizer {shlex.quote(optimizer)}"
    return command


def property_reproduce_command(property_id: str, seed: int, profile: str, optimizer: str) -> str:
    """The command line that re-creates a property certificate (certify/outside/property_certificate.py)."""
    command = f"certify run {property_id} --properties --seed {seed} --profile {profile}"
    if optimizer != DEFAULT_OPTIMIZER:
        command += f" --optimizer {shlex.quote(optimizer)}"
    return command


def property_contradictions(certificate: dict) -> list[str]:
    """Where a property certificate's own members disagree (certificate.contradictions calls this): the
    property's id and claim against the certificate's id; its verdict against the certificate's verdict
    (holds: pass; fails: fail, with the failing check and margin it names among the checks; vacuous:
    inconclusive; untested: inconclusive, or fail where a control escaped and no check failed)."""
    record = certificate.get("property")
    if record is None:
        return []
    found = []
    if record.get("id") != certificate.get("id") or record.get("claim") != str(certificate.get("id")).split("-")[0]:
        found.append(f"property {record.get('id')!r} of claim {record.get('claim')!r} in a certificate of id {certificate.get('id')!r}")
    if record.get("implementation") != certificate.get("provenance", {}).get("optimizer"):
        found.append(f"property of {record.get('implementation')!r}, but the certificate ran {certificate.get('provenance', {}).get('optimizer')!r}")
    verdict, stated = certificate.get("verdict"), record.get("verdict")
    checks = certificate.get("numerical", {}).get("checks", [])
    failing = [c for c in checks if c.get("samples", 0) > 0 and as_float(c.get("max_ratio")) > 1.0]
    escaped = [c for c in certificate.get("controls", []) if not c.get("detected")] + [e for e in certificate.get("exact", []) if not e.get("passed")]
    if stated == "fails":
        named = [c for c in failing if c.get("name") == record.get("check")]
        if verdict != "fail" or not named:
            found.append(f"property verdict 'fails' at check {record.get('check')!r}, but the certificate reads {verdict!r} and its failing checks are "
                         f"{[c.get('name') for c in failing]}")
        elif as_float(record.get("margin")) != max(as_float(c.get("max_ratio")) for c in failing):
            found.append(f"property margin {record.get('margin')!r}, but its failing checks' worst residual/bound is "
                         f"{max(as_float(c.get('max_ratio')) for c in failing)!r}")
    elif failing:
        found.append(f"property verdict {stated!r} beside a failing check {failing[0].get('name')} (residual/bound {failing[0].get('max_ratio')})")
    elif stated == "holds" and verdict != "pass":
        found.append(f"property verdict 'holds', but the certificate reads {verdict!r}")
    elif stated in ("vacuous", "untested"):
        if verdict == "pass" or (verdict == "fail" and not (stated == "untested" and escaped)):
            found.append(f"property verdict {stated!r}, but the certificate reads {verdict!r}")
        elif verdict == "inconclusive" and not any(str(reason).startswith(stated) for reason in certificate.get("inconclusive", [])):
            found.append(f"property verdict {stated!r}, but no reason of the certificate says so")
    return found


def _settings_contradictions(certificate: dict) -> list[str]:
    """The settings a certificate states twice must agree: the seed and profile of its provenance and
    of its numerical part, its id and settings and the reproduce command that `verify` prints (and
    re-runs from the settings), its precision parts and the dtype word that `cite` prints."""
    found = []
    provenance, numerical = certificate.get("provenance", {}), certificate.get("numerical", {})
    for name in ("seed", "profile"):
        if provenance.get(name) != numerical.get(name):
            found.append(f"provenance.{name} {provenance.get(name)!r} but numerical.{name} {numerical.get(name)!r}")
    try:
        if "property" in certificate:  # a property certificate (certify/outside/property_certificate.py)
            expected = property_reproduce_command(certificate["id"], provenance["seed"], provenance["profile"], provenance["optimizer"])
        else:
            expected = reproduce_command(certificate["id"], provenance["seed"], provenance["profile"], provenance["optimizer"], provenance.get("options", {}))
    except (KeyError, TypeError):
        expected = None
    if expected is not None and provenance.get("reproduce") != expected:
        found.append(f"reproduce command {provenance.get('reproduce')!r}, but its id and settings give {expected!r}")
    if numerical.get("precision") and numerical.get("dtype") != precision_text(certificate):
        found.append(f"numerical.dtype {numerical.get('dtype')!r}, but its precision parts under test are {precision_text(certificate)!r}")
    return found


def contradictions(certificate: dict) -> list[str]:
    """Every way a certificate's verdict and flags disagree with its own numbers, one line each (empty: none).

    A digest proves that nothing changed since the digest was computed, not who computed it: anyone
    can edit a certificate and seal it again (docs/certificates.md). So what a reader is shown is
    first re-derived from the evidence inside, by the rule that made it:
    - each check passes exactly when its worst residual/bound is at most 1;
    - each control is detected exactly when its margin reaches its detection factor, and no factor
      is below the project's (DETECTION_FACTOR): a lowered factor would let any control pass;
    - the verdict is the one propositions.kit.common.decide_verdict gives from the checks, controls,
      exact checks and symbolic steps (a claim may be stricter, inconclusive for reasons of its own,
      never laxer), a pass lists no failure and no reason to be inconclusive, a fail lists a
      failure and an inconclusive verdict a reason;
    - the settings stated twice agree (_settings_contradictions);
    - a property certificate's property verdict agrees with its verdict and checks
      (property_contradictions).
    """
    from propositions.kit.common import DETECTION_FACTOR, decide_verdict

    found: list[str] = []
    for check in certificate.get("numerical", {}).get("checks", []):
        ratio = as_float(check.get("max_ratio"))
        if check.get("samples", 0) > 0 and check.get("passed") is not (ratio <= 1.0):
            found.append(f"check {check.get('name')} says passed={check.get('passed')} at worst residual/bound {ratio:.3g}")
    for control in certificate.get("controls", []):
        margin, factor = as_float(control.get("margin")), as_float(control.get("detection_factor", DETECTION_FACTOR))
        if factor < DETECTION_FACTOR:
            found.append(f"control {control.get('name')} has detection factor {factor:g}, below the project's {DETECTION_FACTOR:g}")
        if control.get("detected") is not (margin >= factor):
            found.append(f"control {control.get('name')} says detected={control.get('detected')} at margin {margin:.3g} (factor {factor:g})")
    found += _settings_contradictions(certificate)
    found += property_contradictions(certificate)
    derived, failures, _ = decide_verdict(certificate)
    verdict = certificate.get("verdict")
    if verdict == "fail" and not certificate.get("failures"):
        found.append("verdict 'fail' with no failure recorded")
    if verdict == "inconclusive" and not certificate.get("inconclusive"):
        found.append("verdict 'inconclusive' with no reason recorded")
    if derived == "fail" and verdict != "fail":
        found.append(f"verdict {verdict!r}, but its own evidence fails ({failures[0]})")
    elif derived == "inconclusive" and verdict == "pass":
        found.append("verdict 'pass', but its own evidence is inconclusive")
    if verdict == "pass" and (certificate.get("failures") or certificate.get("inconclusive")):
        listed = (certificate.get("failures") or certificate.get("inconclusive"))[0]
        found.append(f"verdict 'pass' beside a recorded failure or reason: {listed}")
    return found


def as_float(value) -> float:
    """A certificate number (float, int or 'inf'/'-inf'/'nan') as a Python float; None -> nan."""
    if value is None:
        return math.nan
    if isinstance(value, str):
        return float(value)  # "inf", "-inf", "nan" are exactly what float() reads
    return float(value)


def precision_text(certificate: dict) -> str:
    """The dtypes the certificate's numbers under test were computed in ("float32"; "float64, float32,
    bfloat16"), from numerical.precision (schema 1.3; older certificates: numerical.dtype)."""
    parts = certificate["numerical"].get("precision")
    if not parts:
        return certificate["numerical"].get("dtype", "float64")
    return ", ".join(dict.fromkeys(dtype for part in parts if part["role"] == "under test" for dtype in part["dtypes"]))


# --------------------------------------------------------------------------------------------
# Citation (certify cite)
# --------------------------------------------------------------------------------------------


def _bibtex_escape(text: str) -> str:
    """Text safe inside a BibTeX field: LaTeX's special characters escaped."""
    replacements = {"\\": r"\textbackslash{}", "{": r"\{", "}": r"\}", "%": r"\%", "&": r"\&", "$": r"\$", "#": r"\#", "_": r"\_", "^": r"\^{}", "~": r"\~{}"}
    return "".join(replacements.get(character, character) for character in text)


def citation(certificate: dict, style: str = "text") -> str:
    """A citation of a certificate: id, statement, verdict, digest, version and commit, reproduce command.

    style "text": one line; "markdown": a short paragraph; "bibtex": a @misc entry whose key holds
    the id and the first 12 hex digits of the digest.
    """
    provenance = certificate["provenance"]
    commit = provenance.get("git_commit")
    digest = certificate["digest"]["value"]
    version = provenance["project_version"]
    source = f"stiefel-adam-certify {version}" + (f" @ {commit[:12]}" if commit else "")
    docs = certificate["statement"].get("docs")
    precision = precision_text(certificate)
    stated = certificate.get("property")
    if stated:  # a property certificate: the property's own verdict first, the title names claim, property and implementation
        verdict_words = f"the property {stated['verdict']} (certificate {certificate['verdict']})"
    else:
        verdict_words = certificate["verdict"]
    if style == "text":
        if stated:
            return (f"{certificate['title']}: {verdict_words} in {precision}, sha256 {digest[:16]}, {source}; "
                    f"reproduce: {provenance['reproduce']}")
        return (
            f"{certificate['id']} ({certificate['title']}): {certificate['verdict']} in {precision}, "
            f"sha256 {digest[:16]}, {source}; reproduce: {provenance['reproduce']}"
        )
    if style == "markdown":
        lines = [
            f"**{certificate['id']}: {certificate['title']}**: {certificate['statement']['text']}",
            "",
            f"Verdict **{verdict_words}** in {precision} · sha256 `{digest}` · {source.replace(' @ ', ', commit `') + ('`' if commit else '')} · "
            f"reproduce: `{provenance['reproduce']}`" + (f" · [{docs}]({docs})" if docs else ""),
        ]
        return "\n".join(lines)
    year = str(run_record(certificate).get("created_utc") or "")[:4]
    fields = {
        "title": f"{{{_bibtex_escape(certificate['id'] + ': ' + certificate['title'])}}}",
        "author": "{stiefel-adam-certify}",
        "year": f"{{{_bibtex_escape(year)}}}" if year.isdigit() else None,
        "version": f"{{{_bibtex_escape(version)}}}",
        "howpublished": f"{{certificate {certificate['id']}, verdict {_bibtex_escape(verdict_words)} in {precision}, sha256 {digest}}}",
        "note": "{" + _bibtex_escape(
            f"Statement: {certificate['statement']['text']} Verdict: {verdict_words}, computed in {precision}. "
            f"stiefel-adam-certify {version}" + (f", git commit {commit}" if commit else "") + f". Reproduce: {provenance['reproduce']}"
            + (f". Documentation: {docs}" if docs else "")
        ) + "}",
    }
    key = f"stiefel-adam-certify:{certificate['id']}:{digest[:12]}"
    body = ",\n".join(f"  {name} = {value}" for name, value in fields.items() if value is not None)
    return f"@misc{{{key},\n{body}\n}}"
