"""Which claims exist, how one is looked up and run, and how its result becomes a certificate.

The claims are discovered from the propositions package (`propositions.get_claim`): one module,
one claim. A claim that needs an optional package (the torch cross-check) says so in
`Claim.requires` and is skipped, with a note, where that package is missing. A claim
module that cannot be imported, that raises while it runs, or whose result does not fit the
certificate schema never stops the program: it yields an *inconclusive* certificate that says
what went wrong.
"""

from __future__ import annotations

import datetime
import importlib
import importlib.util
import math
import platform
import sys
import time
import traceback
import warnings
from pathlib import Path

import propositions
from propositions._common import decide_verdict
from propositions.kit import parallel
from certify import CROSSCHECK_ID, DEFAULT_OPTIMIZER, SCHEMA_VERSION
from certify import certificate as certificate_format
from certify import environment as environment_record
from certify import execution
from certify import verification

reproduce_command = certificate_format.reproduce_command
_CERTIFY_DIR = Path(__file__).resolve().parent
CROSSCHECK_DEVICES = ("cpu", "cuda")
CROSSCHECK_DTYPES = ("float64", "float32", "bfloat16")
DEFAULT_CROSSCHECK_OPTIONS = {"device": "cpu", "dtype": "float64"}

UnknownClaim = propositions.UnknownClaim


def __getattr__(name: str):
    # The claim list is discovered from the propositions package on first use (one file per claim):
    # ALL_IDS every claim in run order; PROPOSITION_IDS those that need nothing beyond the core
    # dependencies.
    if name == "ALL_IDS":
        return propositions.claim_ids()
    if name == "PROPOSITION_IDS":
        return tuple(claim_id for claim_id in propositions.claim_ids() if not lookup_claim(claim_id).requires)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def normalise_id(text: str) -> str:
    """'p3' -> 'P3', 'CrossCheck' -> 'crosscheck'; UnknownClaim for anything else."""
    return propositions.normalise_id(text)


def missing_requirements(claim) -> list[str]:
    """The packages of claim.requires that cannot be imported here."""
    return missing_requirements_of(claim.requires)


def missing_requirements_of(packages) -> list[str]:
    """The packages named that cannot be imported here."""
    missing = []
    for package in packages:
        if package == "torch":
            available = torch_available()
        else:
            try:
                importlib.import_module(package)
                available = True
            except Exception:
                available = False
        if not available:
            missing.append(package)
    return missing


def default_options(claim_id: str) -> dict:
    """The options a claim runs with when none are given (the cross-check: cpu, float64)."""
    return dict(lookup_claim(claim_id).default_options)


def torch_available() -> bool:
    """Whether torch is installed here. Found, not imported: importing it takes longer than a small
    claim, and the claims that use it import it in their own worker process, where an installation
    that is found but cannot be imported makes that claim fail with the import's error instead of
    being skipped as not installed."""
    if "torch" in sys.modules:
        return True
    try:
        return importlib.util.find_spec("torch") is not None
    except (ImportError, ValueError):
        return False


def cuda_available() -> bool:
    try:
        import torch

        return bool(torch.cuda.is_available())
    except Exception:
        return False


def lookup_claim(claim_id: str):
    """The registry entry (propositions._common.Claim) of a normalised id; raises what the import raises."""
    return propositions.get_claim(claim_id)


def torch_environment(device: str) -> dict | None:
    """propositions.crosscheck.torch_environment(device) (torch version, device name), or None."""
    try:
        return dict(importlib.import_module("propositions.crosscheck").torch_environment(device))
    except Exception as error:
        return {"error": f"{type(error).__name__}: {error}"}


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
    """The claim's verdict, re-derived from its own data by the claims' one rule
    (propositions._common.decide_verdict), so that a certificate cannot contradict itself."""
    reported = data.get("verdict", "inconclusive")
    verdict, failures, inconclusive = decide_verdict(data)
    failures = list(dict.fromkeys(list(data.get("failures", [])) + failures))
    inconclusive = list(dict.fromkeys(list(data.get("inconclusive", [])) + inconclusive))
    if reported not in ("pass", "fail", "inconclusive"):
        inconclusive.append(f"the claim reported an unknown verdict {reported!r}")
        if verdict == "pass":
            verdict = "inconclusive"
    elif verdict == "fail" and reported != "fail":
        failures.append(f"the claim reported verdict {reported!r} although one of its checks, controls or steps failed")
    elif verdict == "pass" and reported != "pass":
        # a claim may be stricter than the rule (inconclusive for its own reasons), never laxer
        verdict = reported
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


# Members of a claim's `extra` that time the run (wall-clock seconds): they go to the certificate's
# run record (run.claim_timings), not its evidence, wherever they sit in `extra`.
RUN_RECORD_KEYS = ("timings", "timings_s", "seconds", "seconds_per_step", "microseconds_per_step")


def split_run_record(extra):
    """(extra without the RUN_RECORD_KEYS members at any depth, those members by path "a/b/key")."""
    timings: dict = {}

    def strip(value, path):
        if isinstance(value, dict):
            kept = {}
            for key, item in value.items():
                if key in RUN_RECORD_KEYS:
                    timings["/".join(path + [str(key)])] = item
                else:
                    kept[key] = strip(item, path + [str(key)])
            return kept
        if isinstance(value, list):
            return [strip(item, path + [str(index)]) for index, item in enumerate(value)]
        return value

    return strip(extra, []), timings


def _result_without_evidence(method: str, *, verdict: str, failures: list[str] = (), inconclusive: list[str] = (), checks: list[dict] = ()) -> dict:
    """A claim result with no evidence beyond `checks`: for a claim that did not run or stopped early."""
    return {
        "verdict": verdict,
        "failures": list(failures),
        "symbolic": {"method": method, "status": "not_applicable", "steps": []},
        "exact": [],
        "numerical": {"frames": 0, "dtype": "float64", "checks": list(checks)},
        "controls": [],
        "extra": {},
        "figures": {},
        "notes": [],
        "inconclusive": list(inconclusive),
    }


def _torch_record(claim_id: str, data: dict, options: dict) -> tuple[dict | None, str | None]:
    """(torch's environment, the device whose kernels the residuals come from), None where torch was not used."""
    torch_info = torch_environment(options.get("device", "cpu")) if claim_id == CROSSCHECK_ID and data.get("numerical", {}).get("checks") else None
    # the rounding fingerprint covers torch's kernels where the residuals come from torch: the
    # cross-check, and a claim that reports that it ran torch (P6's autograd cross-check)
    uses_torch = torch_info is not None or data.get("extra", {}).get("torch_cross_check") is True
    torch_device = options.get("device", "cpu") if uses_torch else None
    return torch_info, torch_device


def _statement(claim_id: str, claim) -> dict:
    return {"text": getattr(claim, "statement", "") or "", "latex": getattr(claim, "latex", "") or "", "docs": certificate_format.docs_pointer(claim_id)}


def _provenance(reproduce: str, seed: int, profile: str, optimizer: str, options: dict, git: dict) -> dict:
    """What the evidence depends on: the code's version and commit, and the run's settings. Whether
    the working tree had local changes goes to the run record instead (_run_record)."""
    return {
        "project_version": environment_record.project_version(),
        "git_commit": git["commit"],
        "reproduce": reproduce,
        "seed": seed,
        "profile": profile,
        "optimizer": optimizer,
        "options": dict(options),
    }


def _run_record(command: str, wall_seconds: float, frames: int, workers: int | None, scheduler: str | None, claim_timings: dict, git: dict) -> dict:
    """How and when this run happened (outside the digest), with the working tree's state as the
    command found it before it wrote anything: the certificates it writes into a tracked reports/
    make the tree dirty part-way through a run, so a sealed flag would change the digests of
    identical evidence."""
    return {
        "command": command,
        "git_tree_clean": git["tree_clean"],
        "created_utc": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "wall_seconds": round(wall_seconds, 6),
        "frames_per_second": round(frames / wall_seconds, 3) if frames and wall_seconds > 0 else None,
        "workers": workers,
        "scheduler": scheduler,
        "host": platform.node(),
        "claim_timings": claim_timings,
    }


def _with_promise_coverage(claim_id: str, data: dict, options: dict) -> dict:
    """The claim's promises of the ledger (propositions/ledger.py) and their coverage in this run, in
    extra.promises; with the claim's default options (the certificate the ledger names), a promise none
    of whose checks compared anything makes the claim inconclusive, and says so."""
    from propositions import ledger

    table, reasons = ledger.coverage(claim_id, data.get("numerical", {}).get("checks", []), data.get("exact", []))
    if not any(row["checks"] for row in table.values()):
        # no check of this run is one the ledger names: not the project's claim of that id (a claim registered
        # in its place, as a test's double); tests/test_ledger.py holds the project's certificates to the ledger
        return data
    data = {**data, "extra": {**data.get("extra", {}), "promises": table}}
    if dict(options) == default_options(claim_id):
        data["inconclusive"] = list(data.get("inconclusive", [])) + reasons
    return data


def _with_coverage_contract(claim_id: str, profile: str, data: dict, options: dict, seed: int | None = None) -> dict:
    """With the claim's default options at a contracted profile, the evidence held to the coverage
    contract (propositions/coverage_contract.py): each shortfall makes the claim inconclusive, and
    extra.evidence_contract says how many checks were held to it."""
    from propositions import coverage_contract

    contract = coverage_contract.load().get(profile, {}).get(claim_id)
    if not contract or dict(options) != default_options(claim_id):
        return data
    names = {check.get("name") for check in data.get("numerical", {}).get("checks", [])}
    if not names & set(contract):
        # none of the contracted checks ran: not the project's claim of that id (a claim registered in
        # its place, as a test's double), which the contract does not describe
        return data
    reasons = coverage_contract.shortfalls(claim_id, profile, data.get("numerical", {}).get("checks", []), seed=seed)
    draws = coverage_contract.load_draws().get(profile, {}).get(claim_id) or {}
    reasons += coverage_contract.draw_shortfalls(claim_id, profile, data.get("extra", {}).get("draw_keys") or {}, seed=seed)
    reasons += coverage_contract.draw_shortfalls(claim_id, profile, data.get("extra", {}).get("control_draw_keys") or {},
                                                 section="control_draws", seed=seed)
    reasons += coverage_contract.grammar_shortfalls(claim_id, profile, data.get("extra", {}).get("grammar"))
    reasons += coverage_contract.symbolic_shortfalls(claim_id, profile, data.get("symbolic"))
    reasons += coverage_contract.figure_shortfalls(claim_id, profile, data.get("figures"))
    data = {**data, "extra": {**data.get("extra", {}), "evidence_contract": {"checks": len(contract), "draw_groups": len(draws),
                                                                           "shortfalls": len(reasons)}}}
    data["inconclusive"] = list(data.get("inconclusive", [])) + reasons
    return data


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
    workers: int | None = 1,
    scheduler: str | None = None,
    tasks: dict | None = None,
    git: dict | None = None,
) -> dict:
    """An unsealed certificate from a claim's ClaimResult.to_dict() (data), or a stub when data is None.

    problem: why there is no data (import failure, exception in run, schema violation); recorded as
    the reason the certificate is inconclusive. workers / scheduler: how the run's tasks were
    executed (certify.execution), recorded in the run record with command, date and
    wall time, which the digest does not cover. git: environment.git_state() as the command read
    it before writing anything (default: read now).
    """
    git = git if git is not None else environment_record.git_state()
    reproduce = reproduce_command(claim_id, seed, profile, optimizer, options)
    if data is None:
        data = _result_without_evidence("none (the claim did not run)", verdict="inconclusive", inconclusive=[problem or "the claim produced no result"])
    elif optimizer == DEFAULT_OPTIMIZER:
        data = _with_promise_coverage(claim_id, data, options)
        data = _with_coverage_contract(claim_id, profile, data, options, seed)
    verdict, failures, inconclusive = _audited_verdict(data)
    extra, claim_timings = split_run_record(data.get("extra", {}))
    numerical = _numerical_part(data.get("numerical", {}), seed, profile, reproduce)
    numerical["precision"] = precision_parts(claim, options, extra)
    numerical["dtype"] = ", ".join(dict.fromkeys(dtype for part in numerical["precision"] if part["role"] == "under test" for dtype in part["dtypes"]))
    torch_info, torch_device = _torch_record(claim_id, data, options)
    return {
        "schema_version": SCHEMA_VERSION,
        "id": claim_id,
        "title": getattr(claim, "title", None) or f"{claim_id} (the claim could not be loaded)",
        "statement": _statement(claim_id, claim),
        "verdict": verdict,
        "failures": failures,
        "inconclusive": inconclusive,
        "symbolic": data.get("symbolic", {}),
        "exact": data.get("exact", []),
        "numerical": numerical,
        "controls": data.get("controls", []),
        "extra": extra,
        "figures": data.get("figures", {}),
        "notes": list(data.get("notes", [])),
        "environment": environment_record.environment(torch_info, torch_device=torch_device),
        "provenance": _provenance(reproduce, seed, profile, optimizer, options, git),
        "run": {**_run_record(command, wall_seconds, numerical["frames"], workers, scheduler, claim_timings, git), **({"tasks": tasks} if tasks else {})},
    }


DTYPE_ORDER = ("float64", "float32", "bfloat16")


def precision_parts(claim, options: dict, extra: dict) -> list[dict]:
    """What the certificate's numbers were computed in, part by part: [{role, part, dtypes}].

    From the claim's declaration (Claim.precisions), with "{dtype}" the claim's dtype option (or the
    dtype its run reports in extra); for an outside implementation (extra["precision"], the unit
    roundoffs its bounds were taken at) the part under test is the implementation at its storage
    and compute dtypes, and the float64 model with its bounds is the reference.
    """
    described = extra.get("precision")
    if isinstance(described, dict) and "storage" in described:
        name = (extra.get("implementation") or {}).get("name", "the implementation")
        dtypes = list(dict.fromkeys([described["storage"], described.get("compute", described["storage"])]))
        return [{"role": "under test", "part": f"{name} (storage {described['storage']}, compute {described.get('compute', described['storage'])})", "dtypes": dtypes},
                {"role": "reference", "part": "the float64 model of the step and the bounds", "dtypes": ["float64"]}]
    declared = getattr(claim, "precisions", None) or (("under test", "every check", ("float64",)),)
    chosen = str(options.get("dtype") or extra.get("dtype") or "float64")
    parts = []
    for role, part, dtypes, *needs in declared:
        if needs and needs[0] in missing_requirements_of((needs[0],)):
            continue
        named = [chosen if dtype == "{dtype}" else dtype for dtype in dtypes]
        parts.append({"role": role, "part": part, "dtypes": sorted(dict.fromkeys(named), key=lambda d: DTYPE_ORDER.index(d) if d in DTYPE_ORDER else len(DTYPE_ORDER))})
    return parts


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


def _load_claim(claim_id: str, optimizer: str):
    """(the claim or None, the outside implementation to run or None, why the claim cannot run or None)."""
    try:
        claim = lookup_claim(claim_id)
    except Exception as error:
        return None, None, f"the claim module of {claim_id} could not be loaded: {describe_error(error)}"
    if claim is not None and is_adapter_spec(optimizer):
        # an outside implementation (certify.outside.adapters): resolved here, so that verify re-runs it too
        adapted, problem = _resolve_implementation(claim_id, optimizer)
        return claim, adapted, problem
    return claim, None, None


def _run_registered(claim, claim_id: str, seed: int, profile: str, optimizer: str, options: dict) -> dict:
    """claim.run on a reference_impl variant, as a dict, with the warnings it raised among its notes."""
    from propositions import get_profile

    # warnings (an overflow in a domain scan, say) belong in the certificate, not on the terminal
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        # the protocol hands run() the Profile itself (frames, steps, ...), named by profile;
        # its map_tasks calls run on the executor the command set up, labelled by the claim
        with parallel.labelled(claim_id):
            result = claim.run(seed, get_profile(profile), optimizer=optimizer, **options)
        data = result.to_dict()
    if not isinstance(data, dict):
        raise TypeError(f"ClaimResult.to_dict() returned {type(data).__name__}, not dict")
    return {**data, "notes": list(data.get("notes", [])) + _warning_notes(caught)}


def _run_claim(claim, adapted, claim_id: str, seed: int, profile: str, optimizer: str, options: dict) -> tuple[dict | None, str | None]:
    """(the claim's result, None), or (None, what it raised)."""
    try:
        if adapted is not None:
            return _run_adapted(claim, claim_id, seed, profile, adapted, options), None
        return _run_registered(claim, claim_id, seed, profile, optimizer, options), None
    except Exception as error:
        coarse = _too_coarse(error)
        if coarse is not None:  # not a crash: the analysis has no bound at this dtype (inconclusive)
            return None, f"{claim_id} has no derived bound at the implementation's precision: {coarse}"
        return None, f"{claim_id} raised while it ran: {describe_error(error)}"


def _too_coarse(error: Exception) -> str | None:
    """The message of a PrecisionTooCoarse (kit/precision.py), raised here or in a task; else None."""
    from propositions.kit.precision import PrecisionTooCoarse

    if isinstance(error, PrecisionTooCoarse):
        return str(error)
    if isinstance(error, parallel.TaskFailed) and error.error_type == PrecisionTooCoarse.__name__:
        return error.error_message
    return None


def _sealed_certificate(claim_id: str, data: dict | None, problem: str | None, settings: dict) -> tuple[dict, str | None]:
    """(the sealed, schema-valid certificate, None); where data does not make one, (an inconclusive
    certificate that says why, the internal-error line)."""
    try:
        sealed = certificate_format.seal(build_certificate(claim_id, data=data, problem=problem, **settings))
        certificate_format.validate(sealed)
        return sealed, None
    except Exception as error:
        internal_error = f"internal error: {describe_error(error)}"
    built = build_certificate(claim_id, data=None, problem=f"its result could not be made into a certificate: {internal_error}", **settings)
    sealed = certificate_format.seal(built)
    certificate_format.validate(sealed)
    return sealed, internal_error


def certify_claim(claim_id: str, *, seed: int, profile: str, optimizer: str = DEFAULT_OPTIMIZER, options: dict | None = None, command: str,
                  workers: int | None = 1, scheduler: str | None = None, git: dict | None = None) -> tuple[dict, str | None]:
    """Run one claim and return (sealed, schema-valid certificate, internal-error line or None).

    Never raises for a broken claim: an import failure or an exception inside run() gives an
    inconclusive certificate naming it; a result that does not fit the schema gives an
    inconclusive certificate and the internal-error line (the caller reports it on stderr).
    workers / scheduler: recorded in the run record (the tasks run on the current executor of
    propositions.kit.parallel, which the caller installs: certify.execution.using). git: the
    checkout's state as the command read it once, before it wrote anything (environment.git_state();
    default: read now, in this process).
    """
    options = dict(options or {})
    started = time.perf_counter()
    claim, adapted, problem = _load_claim(claim_id, optimizer)
    data = None
    with parallel.timing() as timings:
        if problem is None and claim is not None:
            data, problem = _run_claim(claim, adapted, claim_id, seed, profile, optimizer, options)
    wall_seconds = time.perf_counter() - started
    settings = dict(seed=seed, profile=profile, optimizer=optimizer, options=options, command=command, claim=claim, wall_seconds=wall_seconds,
                    workers=workers, scheduler=scheduler, tasks=task_record(timings, wall_seconds), git=git)
    return _sealed_certificate(claim_id, data, problem, settings)


def task_record(timings: list, wall_seconds: float) -> dict:
    """The run record's tasks: {label: [seconds of each task, in the order run]}, and under
    "serial" the claim's wall time outside its tasks (exact on one worker, where the two add up to
    the wall time; with several workers the tasks overlap and serial is 0). What benchmarks/schedule.py
    reads to find the critical path and simulate other worker counts."""
    record: dict = {}
    for label, seconds in timings:
        record.setdefault(label, []).append(round(seconds, 4))
    record["serial"] = [round(max(wall_seconds - sum(seconds for _, seconds in timings), 0.0), 4)]
    return record


def compare(recorded: dict, reproduced: dict) -> tuple[list[str], list[str]]:
    """What differs between a certificate and its re-run: (differences, notes).

    differences fail verification; notes (residual differences where the rounding fingerprints
    differ) never do. The rules are those of certify.verification.compare, which also gives the
    per-check rows of the tolerance report.
    """
    comparison = verification.compare(recorded, reproduced)
    return comparison.differences, comparison.notes


# --------------------------------------------------------------------------------------------
# Outside implementations (certify.outside.adapters, docs/adapters.md)
# --------------------------------------------------------------------------------------------

# The claims whose numerical part runs the optimizer under test. P6 is about gradients of a loss,
# the sampler certificate about the samplers and the cross-check about torch_impl's own kernel: an
# outside implementation does not enter them.
IMPLEMENTATION_CLAIMS = ("P1", "P2", "P3", "P4", "P5")
# The bookkeeping invariances (propositions/bookkeeping.py) hold for any torch optimizer, whatever
# its algorithm and precision: `certify compare` runs them beside P1..P5.
BOOKKEEPING_ID = "bookkeeping"
COMPARE_CLAIMS = IMPLEMENTATION_CLAIMS + (BOOKKEEPING_ID,)


NOT_APPLICABLE = "not applicable"


def not_applicable(claim_id: str, optimizer: str) -> str | None:
    """Why claim_id does not apply to the optimizer named `optimizer` (a variant name or an adapter
    spec), or None: only the bookkeeping claim has such implementations (a NumPy step has no torch
    param groups). An adapter spec that cannot be resolved is left to the run, which says why."""
    if claim_id != BOOKKEEPING_ID or optimizer == DEFAULT_OPTIMIZER:
        return None
    from propositions import bookkeeping

    if not is_adapter_spec(optimizer):
        return bookkeeping.not_applicable(optimizer)
    variant, _ = _resolve_implementation(claim_id, optimizer)
    return None if variant is None else bookkeeping.not_applicable(variant)


def not_applicable_record(claim_id: str, reason: str) -> dict:
    """The outcome of a claim that does not apply: no certificate, its own verdict (compare's cells)."""
    return {"id": claim_id, "verdict": NOT_APPLICABLE, "reason": reason, "failures": [], "inconclusive": [], "extra": {}}


def is_adapter_spec(optimizer) -> bool:
    """Whether `optimizer` names something other than a reference_impl variant (an adapter spec)."""
    from reference_impl import VARIANTS

    return isinstance(optimizer, str) and optimizer not in VARIANTS


def _resolve_implementation(claim_id: str, spec: str):
    """(variant, None) for an adapter spec that can run on claim_id, else (None, why not)."""
    from certify.outside import adapters

    if claim_id not in COMPARE_CLAIMS:
        return None, f"{claim_id} does not run the optimizer under test (only {', '.join(COMPARE_CLAIMS)} do)"
    try:
        variant = adapters.resolve(spec)
    except adapters.AdapterError as error:
        return None, f"the implementation cannot be used: {error}"
    # a float32 or bfloat16 implementation is held to the claims' bounds at its own unit roundoffs
    # (propositions/kit/precision.py); the adapters accept no other dtype
    return variant, None


def _implementation_failure(claim_id: str, message: str) -> dict:
    """The result of a claim whose implementation misbehaved: one failing check that says how."""
    from propositions._common import NumericalCheck, to_jsonable

    check = NumericalCheck(
        "implementation_output",
        "every frame the implementation returns is finite, of the input's shape and on St(d, r) within the "
        "reference's input tolerance 32 (d r + 2 sqrt(r)) u",
        "the tolerance at which reference_impl.step accepts a frame: an output beyond it cannot be the next step's input",
    )
    check.add([math.inf], 1.0, extra={"error": message})
    return to_jsonable(_result_without_evidence("none (the run stopped at the implementation's output)", verdict="fail",
                                                failures=[f"the implementation misbehaved: {message}"], checks=[check.to_dict()]))


def _run_adapted(claim, claim_id: str, seed: int, profile: str, variant, options: dict) -> dict:
    """claim.run with an outside implementation: its not-observable checks recorded, dropped from the
    verdict and listed in the certificate; a misbehaving implementation gives a failing result."""
    from certify.outside import adapters
    from propositions import get_profile
    from propositions.kit import observability

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            # inline: an outside implementation's not-observable records are kept in this process, and
            # the implementation need not be importable in worker processes
            with observability.recording() as hidden, execution.using(parallel.Inline()):
                chosen = get_profile(profile) if isinstance(profile, str) else profile  # a Profile object: tests
                result = claim.run(seed, chosen, optimizer=variant, **options)
                data = result.to_dict()
        except adapters.ImplementationError as error:
            data = _implementation_failure(claim_id, str(error))
            hidden = []
        except parallel.TaskFailed as error:  # raised inside a chunk task
            if error.error_type != adapters.ImplementationError.__name__:
                raise
            data = _implementation_failure(claim_id, error.error_message)
            hidden = []
    data = apply_observability(data, hidden)
    from propositions.kit import precision as precisions

    # the unit roundoffs the implementation's bounds were taken at (propositions/kit/precision.py)
    data["extra"] = {**data.get("extra", {}), "implementation": adapters.describe(variant),
                     "precision": precisions.of(variant).describe()}
    ignored = list(getattr(variant, "ignored", ()))
    notes = list(data.get("notes", []))
    if ignored:
        notes.append(f"the implementation takes no {', '.join(ignored)}: the claim's setting of it does not reach the implementation")
    data["notes"] = notes + _warning_notes(caught)
    if data.get("verdict") == "fail":
        data["extra"]["counterexample"] = _counterexample(claim_id, seed, variant, data)
    return data


def _counterexample(claim_id: str, seed: int, variant, data: dict) -> dict | None:
    """The minimal counterexample of a failing result (certify.ci.counterexample), JSON-able; its search
    time goes to the run record (extra's "timings" members do)."""
    from certify.ci import counterexample
    from propositions._common import to_jsonable

    try:
        found = counterexample.minimal_counterexample(variant, {"id": claim_id, "provenance": {"seed": seed}, **data})
    except Exception as error:  # the search must not lose the certificate: say why there is none
        found = {"found": False, "reason": f"the search raised: {describe_error(error)}"}
    return None if found is None else to_jsonable(found)


def apply_observability(data: dict, hidden: list[dict]) -> dict:
    """Drop the checks recorded as not observable (they hold no sample), list them in
    extra.not_observable and the notes, and re-derive verdict, failures and inconclusive reasons.

    A check without samples that was not recorded stays, and fails (decide_verdict): only a check the
    claim said it could not run is left out of the verdict.
    """
    names = {entry["check"] for entry in hidden}
    numerical = dict(data.get("numerical", {}))
    kept = [c for c in numerical.get("checks", []) if c.get("samples", 0) > 0 or c.get("name") not in names]
    numerical["checks"] = kept
    data = {**data, "numerical": numerical}
    data["extra"] = {**data.get("extra", {}), "not_observable": list(hidden)}
    data["notes"] = list(data.get("notes", [])) + [f"not observable: {e['check']} ({e['reason']})" for e in hidden]
    own_inconclusive = [reason for reason in data.get("inconclusive", []) if reason not in (
        "no numerical check was run",
        "no control was run, so the certificate could not have failed (docs/algorithm.md#the-controls)")]
    verdict, failures, inconclusive = decide_verdict({**data, "inconclusive": own_inconclusive})
    # reasons that are not about one check (a misbehaving implementation) are kept as they were
    failures = list(dict.fromkeys([f for f in data.get("failures", []) if not f.startswith("check ")] + failures))
    verdict = "fail" if failures else verdict
    data.update(verdict=verdict, failures=failures, inconclusive=inconclusive)
    return data
