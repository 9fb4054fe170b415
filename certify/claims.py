"""Which claims exist, how one is looked up and run, and how its result becomes a certificate.

The propositions P1..P6 come from `propositions.get_claim`; the torch cross-check from
`torch_impl.crosscheck.CLAIM`, imported only when it is asked for (torch is optional). A claim
module that cannot be imported, that raises while it runs, or whose result does not fit the
certificate schema never stops the program: it yields an *inconclusive* certificate that says
what went wrong.
"""

from __future__ import annotations

import datetime
import importlib
import math
import time
import traceback
import warnings
from pathlib import Path

from certify import SCHEMA_VERSION
from certify import certificate as certificate_format
from certify import environment as environment_record

PROPOSITION_IDS = ("P1", "P2", "P3", "P4", "P5", "P6")
# claims beyond the paper's propositions: `certify run ID` runs them, `certify all` does not (yet)
EXTRA_IDS = ("samplers",)
CROSSCHECK_ID = "crosscheck"
ALL_IDS = PROPOSITION_IDS + EXTRA_IDS + (CROSSCHECK_ID,)
DEFAULT_OPTIMIZER = "stiefel_adam"
_CERTIFY_DIR = Path(__file__).resolve().parent
CROSSCHECK_DEVICES = ("cpu", "cuda")
CROSSCHECK_DTYPES = ("float64", "float32", "bfloat16")
DEFAULT_CROSSCHECK_OPTIONS = {"device": "cpu", "dtype": "float64"}


class UnknownClaim(ValueError):
    """An id that names no claim."""


def normalise_id(text: str) -> str:
    """'p3' -> 'P3', 'CrossCheck' -> 'crosscheck', 'Samplers' -> 'samplers'; UnknownClaim for anything else."""
    if text.lower() == CROSSCHECK_ID:
        return CROSSCHECK_ID
    if text.upper() in PROPOSITION_IDS:
        return text.upper()
    if text.lower() in EXTRA_IDS:
        return text.lower()
    raise UnknownClaim(f"unknown claim id {text!r}; known: {', '.join(ALL_IDS)}")


def torch_available() -> bool:
    """Whether `import torch` works here (imports it: only on the paths that need torch)."""
    try:
        import torch  # noqa: F401
    except Exception:
        return False
    return True


def cuda_available() -> bool:
    try:
        import torch

        return bool(torch.cuda.is_available())
    except Exception:
        return False


def lookup_claim(claim_id: str):
    """The registry entry (propositions._common.Claim) of a normalised id; raises what the import raises."""
    if claim_id == CROSSCHECK_ID:
        return importlib.import_module("torch_impl.crosscheck").CLAIM
    from propositions import get_claim

    return get_claim(claim_id)


def torch_environment(device: str) -> dict | None:
    """torch_impl.crosscheck.torch_environment(device) (torch version, device name), or None."""
    try:
        return dict(importlib.import_module("torch_impl.crosscheck").torch_environment(device))
    except Exception as error:
        return {"error": f"{type(error).__name__}: {error}"}


def reproduce_command(claim_id: str, seed: int, profile: str, optimizer: str, options: dict) -> str:
    """The command line that re-creates a certificate with these settings."""
    if claim_id == CROSSCHECK_ID:
        command = f"certify crosscheck --device {options.get('device', 'cpu')} --dtype {options.get('dtype', 'float64')}"
    else:
        command = f"certify run {claim_id}"
    command += f" --seed {seed} --profile {profile}"
    if optimizer != DEFAULT_OPTIMIZER:
        command += f" --optimizer {optimizer}"
    return command


def describe_error(error: BaseException) -> str:
    """'ExcType: message (at file:line)' with the innermost frame, short enough for one line."""
    # the innermost frame outside certify and the import machinery is where the claim broke
    frames = [
        frame for frame in traceback.extract_tb(error.__traceback__)
        if not frame.filename.startswith("<frozen") and Path(frame.filename).resolve().parent != _CERTIFY_DIR
    ]
    where = f" (at {Path(frames[-1].filename).name}:{frames[-1].lineno})" if frames else ""
    message = str(error).strip().splitlines()[0] if str(error).strip() else ""
    return f"{type(error).__name__}: {message}{where}" if message else f"{type(error).__name__}{where}"


def _ratio(value) -> float:
    ratio = certificate_format.as_float(value)
    return -math.inf if math.isnan(ratio) else ratio


def _audited_verdict(data: dict) -> tuple[str, list[str], list[str]]:
    """The claim's verdict, re-derived from its own data so that a certificate cannot contradict itself.

    A check that did not pass, a control not detected, a failed exact check or symbolic step all
    make it "fail"; a "pass" with no control at all is "inconclusive" (SPEC.md section 4: a
    certificate that cannot fail is worthless).
    """
    verdict = data.get("verdict", "inconclusive")
    failures = list(data.get("failures", []))
    inconclusive = list(data.get("inconclusive", []))
    checks = data.get("numerical", {}).get("checks", [])
    controls = data.get("controls", [])
    contradicted = (
        any(not check.get("passed", False) for check in checks)
        or any(not control.get("detected", False) for control in controls)
        or any(not exact.get("passed", False) for exact in data.get("exact", []))
        or data.get("symbolic", {}).get("status") == "failed"
    )
    if contradicted and verdict != "fail":
        failures.append(f"the claim reported verdict {verdict!r} although one of its checks, controls or steps failed")
        verdict = "fail"
    if verdict == "pass" and not controls:
        inconclusive.append("no control was run, so the certificate could not have failed (SPEC.md section 4)")
        verdict = "inconclusive"
    if verdict not in ("pass", "fail", "inconclusive"):
        inconclusive.append(f"the claim reported an unknown verdict {verdict!r}")
        verdict = "inconclusive"
    return verdict, failures, inconclusive


def _numerical_part(numerical: dict, seed: int, profile: str, reproduce: str) -> dict:
    checks = list(numerical.get("checks", []))
    shapes: list = []
    for check in checks:
        for shape in check.get("shapes", []):
            if shape not in shapes:
                shapes.append(shape)
    worst_case = None
    scored = [check for check in checks if check.get("samples", 0) > 0]
    if scored:
        worst = max(scored, key=lambda check: _ratio(check.get("max_ratio")))
        worst_case = {
            **(worst.get("worst_case") or {}),
            "check": worst.get("name", "?"),
            "ratio": worst.get("max_ratio"),
            "reproduce": reproduce,
        }
    return {
        **numerical,
        "frames": int(numerical.get("frames", 0)),
        "dtype": numerical.get("dtype", "float64"),
        "seed": seed,
        "profile": profile,
        "samples": int(sum(check.get("samples", 0) for check in checks)),
        "shapes": shapes,
        "checks": checks,
        "worst_case": worst_case,
    }


def build_certificate(
    claim_id: str,
    *,
    seed: int,
    profile: str,
    optimizer: str,
    options: dict,
    command: str,
    data: dict | None,
    claim=None,
    wall_seconds: float,
    problem: str | None = None,
) -> dict:
    """An unsealed certificate from a claim's ClaimResult.to_dict() (data), or a stub when data is None.

    problem: why there is no data (import failure, exception in run, schema violation); recorded as
    the reason the certificate is inconclusive.
    """
    reproduce = reproduce_command(claim_id, seed, profile, optimizer, options)
    if data is None:
        data = {
            "verdict": "inconclusive",
            "failures": [],
            "symbolic": {"method": "none (the claim did not run)", "status": "not_applicable", "steps": []},
            "exact": [],
            "numerical": {"frames": 0, "dtype": "float64", "checks": []},
            "controls": [],
            "extra": {},
            "figures": {},
            "notes": [],
            "inconclusive": [problem or "the claim produced no result"],
        }
    verdict, failures, inconclusive = _audited_verdict(data)
    numerical = _numerical_part(data.get("numerical", {}), seed, profile, reproduce)
    frames = numerical["frames"]
    torch_info = torch_environment(options.get("device", "cpu")) if claim_id == CROSSCHECK_ID and data.get("numerical", {}).get("checks") else None
    git = environment_record.git_state()
    return {
        "schema_version": SCHEMA_VERSION,
        "id": claim_id,
        "title": getattr(claim, "title", None) or f"{claim_id} (the claim could not be loaded)",
        "statement": {"text": getattr(claim, "statement", "") or "", "latex": getattr(claim, "latex", "") or ""},
        "verdict": verdict,
        "failures": failures,
        "inconclusive": inconclusive,
        "symbolic": data.get("symbolic", {}),
        "exact": data.get("exact", []),
        "numerical": numerical,
        "controls": data.get("controls", []),
        "extra": data.get("extra", {}),
        "figures": data.get("figures", {}),
        "notes": list(data.get("notes", [])),
        "environment": environment_record.environment(torch_info),
        "provenance": {
            "project_version": environment_record.project_version(),
            "git_commit": git["commit"],
            "git_tree_clean": git["tree_clean"],
            "command": command,
            "reproduce": reproduce,
            "seed": seed,
            "profile": profile,
            "optimizer": optimizer,
            "options": dict(options),
            "created_utc": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
            "timing": {
                "wall_seconds": round(wall_seconds, 6),
                "frames_per_second": round(frames / wall_seconds, 3) if frames and wall_seconds > 0 else None,
            },
        },
    }


_MAX_WARNING_NOTES = 10


def _warning_notes(caught: list) -> list[str]:
    """Distinct warnings raised during a run, as certificate notes (at most _MAX_WARNING_NOTES)."""
    distinct: list[str] = []
    for record in caught:
        text = f"warning during the run: {record.category.__name__}: {record.message} ({Path(record.filename).name}:{record.lineno})"
        if text not in distinct:
            distinct.append(text)
    if len(distinct) > _MAX_WARNING_NOTES:
        distinct = distinct[:_MAX_WARNING_NOTES] + [f"... and {len(distinct) - _MAX_WARNING_NOTES} more distinct warnings"]
    return distinct


def certify_claim(claim_id: str, *, seed: int, profile: str, optimizer: str = DEFAULT_OPTIMIZER, options: dict | None = None, command: str) -> tuple[dict, str | None]:
    """Run one claim and return (sealed, schema-valid certificate, internal-error line or None).

    Never raises for a broken claim: an import failure or an exception inside run() gives an
    inconclusive certificate naming it; a result that does not fit the schema gives an
    inconclusive certificate and the internal-error line (the caller reports it on stderr).
    """
    options = dict(options or {})
    started = time.perf_counter()
    claim = None
    data = None
    problem = None
    try:
        claim = lookup_claim(claim_id)
    except Exception as error:
        problem = f"the claim module of {claim_id} could not be loaded: {describe_error(error)}"
    if claim is not None:
        try:
            from propositions import get_profile

            # warnings (an overflow in a domain scan, say) belong in the certificate, not on the terminal
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                # the protocol hands run() the Profile itself (frames, steps, ...), named by profile
                result = claim.run(seed, get_profile(profile), optimizer=optimizer, **options)
                data = result.to_dict()
            if not isinstance(data, dict):
                raise TypeError(f"ClaimResult.to_dict() returned {type(data).__name__}, not dict")
            data = {**data, "notes": list(data.get("notes", [])) + _warning_notes(caught)}
        except Exception as error:
            data = None
            problem = f"{claim_id} raised while it ran: {describe_error(error)}"
    wall_seconds = time.perf_counter() - started
    settings = dict(seed=seed, profile=profile, optimizer=optimizer, options=options, command=command, claim=claim, wall_seconds=wall_seconds)
    internal_error = None
    try:
        built = build_certificate(claim_id, data=data, problem=problem, **settings)
        sealed = certificate_format.seal(built)
        certificate_format.validate(sealed)
    except Exception as error:
        internal_error = f"internal error: {describe_error(error)}"
        built = build_certificate(claim_id, data=None, problem=f"its result could not be made into a certificate: {internal_error}", **settings)
        sealed = certificate_format.seal(built)
        certificate_format.validate(sealed)
    return sealed, internal_error


def compare(recorded: dict, reproduced: dict) -> tuple[list[str], list[str]]:
    """What differs between a certificate and its re-run: (differences, residual notes).

    differences (each fails verification): verdict, the pass/fail of every check, the detection of
    every control, exact checks, the symbolic status, checks or controls present on one side only,
    and what the seed and profile fix on any machine (frames, samples and shapes per check, the
    check that caught each control, the reproduce command). Residual values must be equal only
    when the environment is the same as recorded (the run is deterministic); elsewhere another
    BLAS rounds differently, and their largest relative difference is reported in the notes.
    Timing is never compared.
    """
    differences: list[str] = []
    if recorded["verdict"] != reproduced["verdict"]:
        differences.append(f"verdict {recorded['verdict']} recorded, {reproduced['verdict']} reproduced")
    if recorded["symbolic"].get("status") != reproduced["symbolic"].get("status"):
        differences.append(f"symbolic status {recorded['symbolic'].get('status')} recorded, {reproduced['symbolic'].get('status')} reproduced")

    def by_name(items):
        return {item.get("name"): item for item in items}

    pairs = (
        ("check", by_name(recorded["numerical"]["checks"]), by_name(reproduced["numerical"]["checks"]), "passed"),
        ("control", by_name(recorded["controls"]), by_name(reproduced["controls"]), "detected"),
        ("exact check", by_name(recorded["exact"]), by_name(reproduced["exact"]), "passed"),
    )
    for kind, old, new, flag in pairs:
        for name in old.keys() - new.keys():
            differences.append(f"{kind} {name} recorded but not reproduced")
        for name in new.keys() - old.keys():
            differences.append(f"{kind} {name} reproduced but not recorded")
        for name in old.keys() & new.keys():
            if bool(old[name].get(flag)) != bool(new[name].get(flag)):
                differences.append(f"{kind} {name}: {flag} {bool(old[name].get(flag))} recorded, {bool(new[name].get(flag))} reproduced")

    # What the seed and profile fix on every machine: how much evidence, over which shapes, and the
    # command that reproduces it. A re-sealed certificate with doctored counts or command fails here.
    for field in ("frames", "seed", "profile"):
        if recorded["numerical"].get(field) != reproduced["numerical"].get(field):
            differences.append(f"numerical.{field} {recorded['numerical'].get(field)!r} recorded, {reproduced['numerical'].get(field)!r} reproduced")
    if recorded["provenance"].get("reproduce") != reproduced["provenance"].get("reproduce"):
        differences.append(f"reproduce command {recorded['provenance'].get('reproduce')!r} recorded, {reproduced['provenance'].get('reproduce')!r} reproduced")
    old_checks, new_checks = pairs[0][1], pairs[0][2]
    for name in sorted(old_checks.keys() & new_checks.keys(), key=str):
        for field in ("samples", "shapes"):
            if old_checks[name].get(field) != new_checks[name].get(field):
                differences.append(f"check {name}: {field} {old_checks[name].get(field)!r} recorded, {new_checks[name].get(field)!r} reproduced")
    old_controls, new_controls = pairs[1][1], pairs[1][2]
    for name in sorted(old_controls.keys() & new_controls.keys(), key=str):
        if old_controls[name].get("check") != new_controls[name].get("check"):
            differences.append(f"control {name}: caught by {old_controls[name].get('check')!r} recorded, {new_controls[name].get('check')!r} reproduced")

    same_environment = recorded.get("environment") == reproduced.get("environment")
    notes: list[str] = []
    largest = (0.0, None)
    compared = 0
    for kind, old, new, _ in pairs[:2]:
        for name in sorted(old.keys() & new.keys(), key=str):
            if kind == "check":
                values = (old[name].get("residual", {}).get("max"), new[name].get("residual", {}).get("max"))
            else:
                values = (old[name].get("residual"), new[name].get("residual"))
            before, after = (certificate_format.as_float(value) for value in values)
            compared += 1
            if before == after or (math.isnan(before) and math.isnan(after)):
                continue
            scale = max(abs(before), abs(after))
            relative = abs(before - after) / scale if math.isfinite(scale) and scale > 0 else math.inf
            if relative > largest[0]:
                largest = (relative, f"{kind} {name}")
    if compared:
        if largest[1] is None:
            notes.append(f"all {compared} worst residuals reproduced bit for bit")
        elif same_environment:
            # same Python, libraries, BLAS and CPU: the run is deterministic, so any change is a
            # change of the recorded numbers, not of rounding
            differences.append(
                f"worst residuals differ (largest relative difference {largest[0]:.3g}, {largest[1]}) although the "
                "environment is the same as recorded, where the re-run is bit for bit"
            )
        else:
            notes.append(
                f"worst residuals differ: largest relative difference {largest[0]:.3g} ({largest[1]}); "
                "the environment differs from the recorded one"
            )
    return differences, notes
