"""Running claims for the `certify` command: progress, certificates written as they arrive, the
report, the summary and the exit code (`all`, `run`, `crosscheck`), and re-running certificates
(`verify`). Where the tasks run is certify.execution's business; what a claim computes is the
claim's (propositions).
"""

from __future__ import annotations

import json
import time
from pathlib import Path

from certify import UsageError
from certify import certificate as certificate_format
from certify import claims
from certify import report as report_writer
from certify import verification
from certify.render import Output, error_line
from propositions.kit import parallel


DEFAULT_OUT = "reports"


def fresh_folder(prefix: str) -> Path:
    """PREFIX-<UTC time> in the current directory, with -2, -3, ... where that name is taken."""
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    candidate, index = Path(f"{prefix}-{stamp}"), 1
    while candidate.exists():
        index += 1
        candidate = Path(f"{prefix}-{stamp}-{index}")
    return candidate


def default_out(optimizer: str) -> Path:
    """Where a run without --out writes: reports/ for the reference's own certificates; a fresh
    run-<UTC time> folder here for any other optimizer (a variant, --implementation,
    --torch-optimizer), so that its certificates never replace the reference's committed ones."""
    return Path(DEFAULT_OUT) if optimizer == claims.DEFAULT_OPTIMIZER else fresh_folder("run")


def output_folder(text: str) -> Path:
    """The output directory, created and written to once now, so that an unusable --out (not a
    directory, not creatable, read-only) fails in one line before any claim runs, not after."""
    out = Path(text)
    if out.exists() and not out.is_dir():
        raise UsageError(f"--out {text}: exists and is not a directory")
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        raise UsageError(f"--out {text}: cannot be created ({error.strerror or error})") from None
    check_writable(out, f"--out {text}")
    return out


def check_writable(directory: Path, what: str) -> None:
    """UsageError (one line, exit 2) unless a file can be created in `directory`: tried with a
    temporary file, as root may write where the permission bits say no and a read-only mount or a
    pseudo file system (procfs) refuses whatever they say."""
    import tempfile

    try:
        with tempfile.NamedTemporaryFile(dir=directory, prefix=".certify-write-check-"):
            pass
    except OSError as error:
        raise UsageError(f"{what}: no file can be created in {directory} ({error.strerror or error})") from None


class Progress:
    """Progress of a run: claims done, and the chunk tasks of the claims running now.

    On a terminal a rich progress display (one bar for the claims, one per running chunk map,
    removed when it completes); otherwise plain lines: one when a claim starts and ends, and for a
    chunk map still running after PLAIN_EVERY_SECONDS one line every PLAIN_EVERY_SECONDS, so a CI
    log shows a long thorough run advancing while a default run prints what it printed before.
    """

    PLAIN_EVERY_SECONDS = 30.0

    def __init__(self, out: Output, claims_total: int):
        import threading

        self.out = out
        self.lock = threading.Lock()
        self.bars: dict = {}
        self.last_line: dict = {}
        self.display = None
        if out.rich:
            from rich.progress import BarColumn, MofNCompleteColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

            self.display = Progress(SpinnerColumn(), TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(), console=out.console, transient=True)
            self.claims = self.display.add_task("certifying", total=claims_total)

    def __enter__(self):
        if self.display is not None:
            self.display.__enter__()
        return self

    def __exit__(self, *exc):
        if self.display is not None:
            self.display.__exit__(*exc)

    def claim_started(self, claim_id: str, line: str, *, alone: bool = True) -> None:
        """alone: the claim runs by itself (else several run at once and the bar names none)."""
        if self.display is not None:
            if alone:
                self.display.update(self.claims, description=f"certifying {claim_id}")
        else:
            self.out.line(line)

    def claim_done(self) -> None:
        if self.display is not None:
            self.display.advance(self.claims)

    def chunks(self, label: str, done: int, total: int) -> None:
        """A chunk map advanced: `done` of `total` tasks of `label` ("P3 step_checks")."""
        with self.lock:
            if self.display is not None:
                if label not in self.bars:
                    from rich.markup import escape

                    self.bars[label] = self.display.add_task(escape(f"  {label}"), total=total)
                self.display.update(self.bars[label], completed=done, total=total)
                if done >= total:
                    self.display.remove_task(self.bars.pop(label))
                return
            now = time.monotonic()
            if done == 0 or label not in self.last_line:
                self.last_line[label] = now
            elif done >= total:
                self.last_line.pop(label)
            elif now - self.last_line[label] >= self.PLAIN_EVERY_SECONDS:
                self.last_line[label] = now
                self.out.line(f"    {label}: {done}/{total} chunks")


def _forward_progress(executor, progress: Progress):
    """A thread that hands the chunk progress of claims running in pool workers to `progress`;
    returns a function that stops it."""
    import queue
    import threading

    source = getattr(executor, "progress_queue", None)
    if source is None:
        return lambda: None
    stop = threading.Event()

    def forward():
        while not stop.is_set():
            try:
                label, done, total = source.get(timeout=0.1)
            except queue.Empty:
                continue
            except (EOFError, OSError):
                return
            progress.chunks(label, done, total)

    thread = threading.Thread(target=forward, daemon=True)
    thread.start()

    def halt():
        stop.set()
        thread.join()

    return halt


def _expected_seconds(path: Path, claim_id: str, profile: str) -> float:
    """How long a claim is expected to take: its last certificate's wall time at this profile, else
    the committed reports/ certificate's (the default profile: the claims' times keep their order
    across profiles, which is all the schedule needs), else a large number for a claim that needs an
    optional package (the torch cross-check), else 0."""
    for candidate, same_profile in ((path, True), (COMMITTED_REPORTS / path.name, False)):
        try:
            # a hint for the order, read as plain JSON: loading checks digest and schema (a tenth of
            # a second per certificate, before the first task starts), and a wrong time only costs order
            previous = json.loads(candidate.read_text(encoding="utf-8"))
            if previous["provenance"]["profile"] == profile or not same_profile:
                return float(certificate_format.run_record(previous)["wall_seconds"])
        except Exception:  # no usable certificate there: fall back on the next
            pass
    return 1e6 if _requirements(claim_id) else 0.0


COMMITTED_REPORTS = Path(__file__).resolve().parent.parent / "reports"


def question(claim_id: str, optimizer: str) -> str:
    """What a claim's certificate answers: for StiefelAdam the claim itself ("P4"); for any other
    optimizer whether it is StiefelAdam's step in that claim ("P4, is X StiefelAdam's step?"), which
    an equivariant SGD fails while it has the property (its property certificates say so)."""
    if optimizer == claims.DEFAULT_OPTIMIZER or claim_id not in claims.IMPLEMENTATION_CLAIMS:
        return claim_id
    return f"{claim_id}, is {optimizer} StiefelAdam's step?"


class _Recorder:
    """Writes each certificate as it arrives, prints its line and counts internal errors."""

    def __init__(self, out: Output, out_dir: Path, optimizer: str = claims.DEFAULT_OPTIMIZER):
        self.out, self.out_dir = out, out_dir
        self.optimizer = optimizer
        self.by_id: dict[str, dict] = {}
        # each certificate's figures, drawn as it arrives: with a pool, while the other claims run
        self.drawn: dict[str, tuple] = {}
        self.internal_errors = 0

    def error(self, line: str) -> None:
        self.internal_errors += 1
        error_line(line)

    def record(self, claim_id: str, sealed: dict, internal_error: str | None) -> None:
        if internal_error:
            self.error(f"{claim_id}: {internal_error}")
        try:
            # certify_claim validated it as sealed, in the worker that made it
            path = certificate_format.write(sealed, self.out_dir / f"{claim_id}.json", validated=True)
        except OSError as error:
            raise UsageError(f"cannot write {self.out_dir / (claim_id + '.json')}: {error.strerror or error}") from None
        timing = certificate_format.run_record(sealed)
        self.out.line(f"{question(claim_id, self.optimizer)}: {sealed['verdict']} in {timing['wall_seconds']:.2f} s ({sealed['numerical']['frames']} frames) -> {path}")
        for reason in sealed["failures"] + sealed["inconclusive"]:
            self.out.line(f"    {reason}")
        from certify.ci.counterexample import block, counterexamples_of

        for found in counterexamples_of(sealed):
            self.out.line("    minimal counterexample:")
            for line in block(found):
                self.out.line(f"      {line}")
        self.by_id[claim_id] = sealed
        try:
            self.drawn[claim_id] = report_writer.draw_figures(sealed, self.out_dir / report_writer.FIGURES_DIR, report_writer.load_figure_class())
        except OSError:  # write_report draws it again and reports the error
            pass


def _run_claims_as_tasks(to_run: list[str], args, recorder: _Recorder, progress, executor, settings: dict, options_for) -> None:
    """Each claim one task of the pool or the cluster, longest first (the wall time of the
    certificate already in DIR for this profile, else the claims that need an optional package, the
    cross-check's long runs, first), so that the longest claim does not start last; the
    certificates do not depend on the order."""
    halt = _forward_progress(executor, progress)
    where = f"the dask cluster at {executor.scheduler}" if executor.scheduler else f"{executor.workers} worker processes"
    recorder.out.line(f"running {len(to_run)} claims on {where} (seed {args.seed}, profile {args.profile})")
    for claim_id in to_run:
        progress.claim_started(claim_id, f"{claim_id}: running (seed {args.seed}, profile {args.profile})", alone=False)

    def finished(index: int, outcome) -> None:
        claim_id = to_run[index]
        progress.claim_done()
        if outcome.error is not None:
            recorder.error(f"{claim_id}: internal error in its worker: {outcome.error}")
            return
        recorder.record(claim_id, *outcome.result)

    order = sorted(range(len(to_run)), key=lambda index: -_expected_seconds(recorder.out_dir / f"{to_run[index]}.json", to_run[index], args.profile))
    try:
        calls = [((to_run[index],), dict(options=options_for(to_run[index]), **settings)) for index in order]
        executor.submit_each(claims.certify_claim, calls, lambda position, outcome: finished(order[position], outcome))
    except parallel.TaskFailed as error:
        recorder.error(str(error))
    finally:
        halt()


def _with_existing_certificates(certificates: list[dict], out_dir: Path, notes: list[str]) -> list[dict]:
    """The report of a partial run (`certify run`) also shows the certificates already beside it."""
    reported = list(certificates)
    ran = {c["id"] for c in certificates}
    for claim_id in claims.ALL_IDS:
        path = out_dir / f"{claim_id}.json"
        if claim_id in ran or not path.exists():
            continue
        try:
            reported.append(certificate_format.load(path))
            notes.append(f"{claim_id}: from the existing {path.name} (not re-run by this command)")
        except certificate_format.CertificateError as error:
            notes.append(f"{claim_id}: existing {path.name} left out of the report: {error}")
    order = {claim_id: index for index, claim_id in enumerate(claims.ALL_IDS)}
    return sorted(reported, key=lambda c: order[c["id"]])


def _run_and_record(ids: list[str], args, out: Output, command: str, options_for, notes: list[str], runnable=lambda claim_id: True) -> int:
    """Run claims, write their certificates and the report, print the summary; the exit code.

    runnable(id) is asked before the claims run; False skips that claim (it adds its own note).
    With one worker, or one claim, the claims run here one after another and each claim's chunk
    tasks go to the executor; with several claims and a pool or a cluster, each claim is a task
    (its chunks then run inline in its pool worker, or go back to the cluster from a dask worker).
    """
    optimizer = getattr(args, "optimizer", claims.DEFAULT_OPTIMIZER)
    from certify import environment as environment_record

    git = environment_record.git_state()  # read once, before this command writes anything
    out_dir = output_folder(str(args.out if args.out is not None else default_out(optimizer)))
    executor = parallel.current()
    started = time.perf_counter()
    recorder = _Recorder(out, out_dir, optimizer)
    to_run, not_applicable = [], []
    for claim_id in ids:
        reason = claims.not_applicable(claim_id, optimizer)
        if reason:
            not_applicable.append(claim_id)
            notes.append(f"{claim_id}: not applicable to {optimizer}: {reason}")
            out.line(notes[-1])
        elif runnable(claim_id):
            to_run.append(claim_id)
        else:
            out.line(notes[-1])
    settings = dict(seed=args.seed, profile=args.profile, optimizer=optimizer, command=command, workers=executor.workers, scheduler=executor.scheduler, git=git)

    with Progress(out, len(to_run)) as progress, parallel.reporting(progress.chunks):
        if len(to_run) > 1 and not isinstance(executor, parallel.Inline):
            _run_claims_as_tasks(to_run, args, recorder, progress, executor, settings, options_for)
        else:
            for claim_id in to_run:
                progress.claim_started(claim_id, f"{claim_id}: running (seed {args.seed}, profile {args.profile})")
                recorder.record(claim_id, *claims.certify_claim(claim_id, options=options_for(claim_id), **settings))
                progress.claim_done()
    certificates = [recorder.by_id[claim_id] for claim_id in to_run if claim_id in recorder.by_id]
    total_wall = time.perf_counter() - started

    reported = _with_existing_certificates(certificates, out_dir, notes) if args.command == "run" else certificates
    try:
        report_path, plotted = report_writer.write_report(reported, out_dir, notes=notes, total_wall_seconds=total_wall if args.command == "all" else None, drawn=recorder.drawn)
    except OSError as error:
        raise UsageError(f"cannot write the report in {out_dir}: {error.strerror or error}") from None

    rows = report_writer.summary_rows(certificates)
    for row in rows:
        row[0] = question(row[0], optimizer)
    out.table(report_writer.SUMMARY_HEADER, rows, title="certificates")
    out.line(f"report: {report_path}" + ("" if plotted else " (plots left out: matplotlib is not installed)"))
    counts = {verdict: sum(c["verdict"] == verdict for c in certificates) for verdict in ("pass", "fail", "inconclusive")}
    outside = f", {len(not_applicable)} not applicable" if not_applicable else ""
    out.line(f"{counts['pass']} passed, {counts['fail']} failed, {counts['inconclusive']} inconclusive{outside} in {total_wall:.2f} s")
    # a claim that does not apply is its own outcome: the exit status is that of the claims that do
    all_pass = (certificates or not_applicable) and all(c["verdict"] == "pass" for c in certificates)
    return 0 if all_pass and not recorder.internal_errors else 1


def _options_for(claim_id: str) -> dict:
    try:
        return claims.default_options(claim_id)
    except Exception:  # a claim that cannot be loaded runs (and reports why) with no options
        return {}


def command_all(args, out: Output, command: str) -> int:
    notes: list[str] = []
    warm = getattr(parallel.current(), "warm", None)
    if warm is not None:  # a pool's workers start while this process finds the claims
        warm()
    # claims that need an optional package (torch) run last, so that the environment of the others
    # records such a package only if they used it
    ids = sorted(claims.ALL_IDS, key=lambda claim_id: bool(_requirements(claim_id)))

    def runnable(claim_id: str) -> bool:
        missing = _missing(claim_id)
        if missing:
            notes.append(f"{claim_id} skipped: {', '.join(missing)} not installed")
            return False
        return True

    return _run_and_record(ids, args, out, command, _options_for, notes, runnable)


def _requirements(claim_id: str) -> tuple[str, ...]:
    try:
        return tuple(claims.lookup_claim(claim_id).requires)
    except Exception:
        return ()


def _missing(claim_id: str) -> list[str]:
    try:
        return claims.missing_requirements(claims.lookup_claim(claim_id))
    except Exception:  # cannot be loaded: it runs and its certificate says why
        return []


def command_run(args, out: Output, command: str) -> int:
    ids: list[str] = []
    for text in args.ids:
        try:
            claim_id = claims.normalise_id(text)
        except claims.UnknownClaim as error:
            raise UsageError(str(error)) from None
        if claim_id not in ids:
            ids.append(claim_id)
    args.optimizer = _optimizer_from_args(args)
    _check_optimizer(args.optimizer)
    if args.out is None and args.optimizer != claims.DEFAULT_OPTIMIZER:
        args.out = str(default_out(args.optimizer))  # one fresh folder for the certificates and the property certificates beside them
    if claims.is_adapter_spec(args.optimizer):
        outside = [claim_id for claim_id in ids if claim_id not in claims.COMPARE_CLAIMS]
        if outside:
            raise UsageError(f"{outside[0]} does not run the optimizer under test; an implementation runs on {', '.join(claims.COMPARE_CLAIMS)}")
    if claims.CROSSCHECK_ID in ids and args.optimizer != claims.DEFAULT_OPTIMIZER:
        # the cross-check tests the torch kernel, not a reference variant, and `certify crosscheck`
        # (its reproduce command) has no --optimizer: its kernel controls run in every certificate
        raise UsageError("--optimizer does not apply to crosscheck (its kernel controls run in every crosscheck certificate)")
    for claim_id in ids:
        missing = _missing(claim_id)
        if missing:
            raise UsageError(f"{claim_id} needs {', '.join(missing)}, which is not installed (the '{missing[0]}' extra: pip install -e '.[{missing[0]}]' in this project's checkout)")
    code = _run_and_record(ids, args, out, command, _options_for, [])
    stated = [claim_id for claim_id in ids if claim_id in claims.IMPLEMENTATION_CLAIMS]
    if args.optimizer == claims.DEFAULT_OPTIMIZER or not stated:
        return code
    return max(code, _properties_beside(stated, args, out, command))


def _properties_beside(claim_ids: list[str], args, out: Output, command: str) -> int:
    """For an optimizer other than StiefelAdam, each claim's property asked of it as well, stated apart
    from whether it is StiefelAdam's step (docs/adapters.md#property-verdicts): one property
    certificate each, under OUT/properties/<implementation>/; 0 when every property holds."""
    from certify import environment as environment_record
    from certify.outside import adapters, properties

    spec = adapters.canonical_spec(args.optimizer)
    out_dir = output_folder(str(args.out if args.out is not None else default_out(args.optimizer)))
    records, _, seconds = properties.run({spec: properties.resolve(spec)}, seed=args.seed, claim_ids=tuple(claim_ids), out_dir=out_dir,
                                         profile=args.profile, command=command, git=environment_record.git_state(), progress=lambda line: None)
    record = records[spec]
    for claim_id in claim_ids:
        found = [v for v in record["properties"] if v["property"].split("-")[0] == claim_id]
        out.line(f"{claim_id}, its property of {spec}: " + "; ".join(f"{v['property']} {properties.cell(v)}" for v in found))
    out.line(f"properties: certificates under {out_dir / 'properties' / properties.label(spec)} ({seconds:.1f} s); StiefelAdam's step: "
             f"{record['stiefel_adam_step']['text']}")
    return 0 if all(v["verdict"] == "holds" for v in record["properties"]) else 1


def command_crosscheck(args, out: Output, command: str) -> int:
    options = {"device": args.device, "dtype": args.dtype}
    require_torch(options, "crosscheck")
    return _run_and_record([claims.CROSSCHECK_ID], args, out, command, lambda claim_id: dict(options), [])


def require_torch(options: dict, what: str) -> None:
    if not claims.torch_available():
        raise UsageError(f"{what} needs torch, which is not installed (the 'torch' extra: pip install -e '.[torch]' in this project's checkout)")
    if options.get("device") == "cuda" and not claims.cuda_available():
        raise UsageError(f"{what} asks for device cuda, but CUDA is not available here (torch.cuda.is_available() is False)")


def _check_optimizer(name: str) -> None:
    if name == claims.DEFAULT_OPTIMIZER:
        return
    try:
        from reference_impl import VARIANTS
    except Exception as error:
        raise UsageError(f"--optimizer {name}: the optimizer variants cannot be loaded ({type(error).__name__}: {error})") from None
    if name not in VARIANTS:
        resolve_implementation(name)


def resolve_implementation(spec: str):
    """The Variant of an adapter spec; UsageError (exit 2, one line) when it cannot be used."""
    from certify.outside import adapters

    try:
        return adapters.resolve(spec)
    except adapters.AdapterError as error:
        raise UsageError(str(error)) from None


def _optimizer_from_args(args) -> str:
    """--optimizer, --implementation and --torch-optimizer as one spec (at most one of them)."""
    given = [text for text in (args.optimizer if args.optimizer != claims.DEFAULT_OPTIMIZER else None,
                               f"numpy:{args.implementation}" if args.implementation else None,
                               f"torch:{args.torch_optimizer}" if args.torch_optimizer else None) if text]
    if len(given) > 1:
        raise UsageError("give one of --optimizer, --implementation, --torch-optimizer")
    return given[0] if given else claims.DEFAULT_OPTIMIZER


def _report_path(text: str | None) -> Path | None:
    """The --report file, checked before any re-run: its directory must exist."""
    if text is None:
        return None
    path = Path(text)
    if path.is_dir():
        raise UsageError(f"--report {text}: is a directory, not a file")
    if not path.parent.is_dir():
        raise UsageError(f"--report {text}: directory {path.parent} does not exist")
    check_writable(path.parent, f"--report {text}")
    return path


def _rerun(recorded: dict, command: str) -> tuple[dict, str | None]:
    if "property" in recorded:  # a property certificate: the property asked again of its implementation
        from certify.outside import properties

        return properties.rerun(recorded, command)
    provenance = recorded["provenance"]
    executor = parallel.current()
    return claims.certify_claim(recorded["id"], seed=provenance["seed"], profile=provenance["profile"], optimizer=provenance["optimizer"], options=provenance["options"], command=command,
                                workers=executor.workers, scheduler=executor.scheduler)


def _verification_header(loaded: list, entries: list) -> list[str]:
    """Who verified what, where: the first lines of the markdown tolerance report."""
    from certify import environment as environment_record

    git = environment_record.git_state()
    here = f"certify {environment_record.project_version()}" + (f" at commit `{git['commit'][:12]}`" if git["commit"] else "")
    agreed = sum(not comparison.differences for _, _, _, comparison in entries)
    return [
        f"Verified {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())} with {here}: {agreed} of {len(loaded)} certificate(s) reproduced.",
        "",
        "Each re-run starts from the certificate's recorded seed, profile, optimizer and options. Verdicts, the pass/fail of "
        "every check, the detection of every control, counts, shapes and the reproduce command must agree on any machine; "
        "residuals must be bit-identical only where the rounding fingerprint matches the recorded one (docs/certificates.md). "
        "Each row is one sample: a check's worst one (largest residual/bound) or a control's deciding one; recorded / re-run "
        "residual: its residual; re-run bound: its bound in the re-run; re-run ratio: re-run residual / re-run bound, the "
        "worst residual/bound of a check (at most 1 passes) or a control's margin (at least its detection factor detects).",
    ]


def _is_mutation_report(path: Path) -> bool:
    import json

    try:
        return json.loads(path.read_text(encoding="utf-8")).get("kind") == "mutation-report"
    except Exception:  # not readable or not JSON: certificate_format.load says why
        return False


def _unusable_implementation(recorded: dict) -> str | None:
    """Why the outside implementation a certificate ran cannot be re-run here (it does not import,
    say), or None; a re-run would only end inconclusive and read as an irreproducible certificate."""
    from certify.outside import adapters

    spec = recorded["provenance"]["optimizer"]
    if not claims.is_adapter_spec(spec):
        return None
    try:
        adapters.resolve(spec)
    except adapters.AdapterError as error:
        return f"the implementation cannot be used here: {error}"
    return None


def command_verify(args, out: Output, command: str) -> int:
    report_path = _report_path(args.report)
    loaded = []
    for name in args.files:
        if _is_mutation_report(Path(name)):
            # `certify verify reports/*.json` meets the mutation report beside the certificates
            out.line(f"{name}: skipped (a mutation report written by certify mutate, not a certificate)")
            continue
        loaded.append((name, certificate_format.load(Path(name))))  # CertificateError: exit 2 before any re-run
    if not loaded:
        raise UsageError("no certificate among the files given")
    for name, recorded in loaded:
        for package in claims.missing_requirements(claims.lookup_claim(recorded["id"])) if recorded["id"] in claims.ALL_IDS else []:
            raise UsageError(f"verifying {name} needs {package}, which is not installed (the '{package}' extra: pip install -e '.[{package}]' in this project's checkout)")
        if recorded["id"] == claims.CROSSCHECK_ID:
            require_torch(recorded["provenance"]["options"], f"verifying {name}")
    exit_code = 0
    entries = []
    for index, (name, recorded) in enumerate(loaded, start=1):
        unusable = _unusable_implementation(recorded)
        if unusable:
            out.line(f"[{index}/{len(loaded)}] {name}: digest ok; not re-run: {unusable}")
            exit_code = 1
            continue
        what = f"re-running {recorded['id']} ({recorded['provenance']['reproduce']})"
        if out.rich:
            with out.console.status(f"[{index}/{len(loaded)}] {name}: digest ok; {what}", spinner="dots"):
                reproduced, internal_error = _rerun(recorded, command)
            out.line(f"[{index}/{len(loaded)}] {name}: digest ok; re-ran {recorded['id']}")
        else:
            out.line(f"[{index}/{len(loaded)}] {name}: digest ok; {what}")
            reproduced, internal_error = _rerun(recorded, command)
        if internal_error:
            error_line(f"{recorded['id']}: {internal_error}")
        comparison = verification.compare(recorded, reproduced)
        entries.append((name, recorded, reproduced, comparison))
        if comparison.differences or recorded["verdict"] != "pass":
            exit_code = 1
        out.line(verification.verdict_line(name, recorded, comparison))
        out.line(f"{name}: {verification.fingerprint_line(comparison, recorded, reproduced)}")
        out.table(verification.TABLE_HEADER, verification.table_rows(comparison), title=f"{recorded['id']}: recorded against re-run")
        for note in comparison.notes:
            out.line(f"{name}: {note}")
    reproduced = sum(not comparison.differences for _, _, _, comparison in entries)
    failed = sum(recorded["verdict"] != "pass" for _, recorded, _, _ in entries)
    skipped = len(loaded) - len(entries)
    out.line(f"verified {len(loaded)} certificate(s): {reproduced} reproduced, {len(entries) - reproduced} differing, "
             f"{failed} with a verdict other than pass" + (f", {skipped} not re-run" if skipped else ""))
    if report_path is not None:
        text = verification.markdown(entries, header=_verification_header(loaded, entries))
        try:
            report_path.write_text(text, encoding="utf-8")
        except OSError as error:
            raise UsageError(f"cannot write --report {report_path}: {error.strerror or error}") from None
        out.line(f"tolerance report: {report_path}")
    return exit_code
