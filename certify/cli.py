"""The `certify` console script.

    certify all [--out DIR] [--seed S] [--profile quick|default|thorough] [--workers N | --scheduler ADDRESS]
    certify list
    certify run ID... [--out DIR] [--seed S] [--profile P] [--optimizer NAME | --implementation M:C | --torch-optimizer M:C[:JSON]] [--workers N | --scheduler ADDRESS]
    certify crosscheck [--device cpu|cuda] [--dtype float64|float32|bfloat16] [--out DIR] [--seed S] [--profile P]
    certify compare IMPL... [--implementation MODULE:CALLABLE]... [--torch-optimizer MODULE:CLASS[:JSON]]... [--out DIR] [--seed S] [--profile P]
    certify verify FILE... [--report FILE] [--workers N | --scheduler ADDRESS]
    certify cite FILE [--format text|markdown|bibtex]
    certify regression CERT.json... -o FILE.py
    certify mutate [--out DIR] [--max-children N] [--resume | --report-only] [--only PATTERN]...

Defaults: --out reports, --seed 0, --profile default, --optimizer stiefel_adam (the real
optimizer; any other name of reference_impl.VARIANTS runs the claim against that broken variant,
which must then fail), --workers $CERTIFY_WORKERS or the CPUs available. --workers N runs the
claims' chunk tasks (several claims: the claims themselves) in N processes, --scheduler on a dask
cluster (certify.execution); the certificates and their digests do not depend on either
(docs/certificates.md#parallel-runs). Progress: a rich display on a terminal, plain lines otherwise.

`all` runs every claim of the propositions package (P1..P6, the sampler certificate and, when
`import torch` works, the torch cross-check, last); `run` and `all` write one
certificate per claim (DIR/ID.json), DIR/REPORT.md and, with matplotlib, DIR/figures/*.png. The
report written by `run` also covers the certificates already in DIR that load cleanly.

`compare` runs P1..P5 on each implementation named (certify.adapters: reference_impl, torch_impl,
torch_impl-float32, geoopt-euclidean, geoopt-canonical, the variants, numpy:/torch: specs), writes
DIR/compare/<impl>/<claim>.json and the implementation x claim matrix into DIR/REPORT.md, with the
property probes of certify.probes naming how each implementation differs (docs/adapters.md). Its exit
code is 0 only when every pair passes.

A failing certificate of an outside implementation (--implementation, --torch-optimizer, compare)
records its minimal counterexample (certify.counterexample: the smallest case of the claim's own
parameters that still fails the same check, its first diverging step and the first stage of
docs/algorithm.md that differs), printed in one block under the certificate's line and in
REPORT.md. `regression` writes a pytest file that replays the counterexamples of the certificates
named (certify.regression; docs/ci.md).

`verify` first re-checks each file's digest, then re-runs the claim from the recorded seed,
profile, optimizer and options and compares (certify.verification): the verdict, the pass/fail
of every check, the detection of every control, counts, shapes and the reproduce command must
agree on any machine; residuals must be bit-identical only where the re-run's rounding
fingerprint is the recorded one, and are reported, never required, elsewhere. It prints, per
certificate, a verdict line, the fingerprint line and a table of every check and control
(recorded residual, re-run residual, bound, ratio, pass, bit-identical); --report FILE also writes
that as markdown; a certificate whose implementation cannot be used here (its module does not
import) is not re-run, and says so in one line. `cite` prints a citation (text: one line; markdown; bibtex) with the id,
statement, verdict, digest, project version and commit and the reproduce command.

Exit codes:
  0  every certificate passes (for verify: and its re-run agrees with it);
  1  a certificate fails or is inconclusive, a re-run disagrees with its certificate, or an
     internal error was reported;
  2  usage or input error: unknown id or option value, a file that cannot be read, is not JSON,
     is not a certificate of this schema version, or whose digest does not match its content
     (a tampered certificate is bad input, not a failed claim).
Every error is one line on stderr; there is never a traceback.
"""

from __future__ import annotations

import argparse
import shlex
import sys
import time
from pathlib import Path

import propositions
from certify import DEFAULT_PROFILE, DEFAULT_SEED
from certify import certificate as certificate_format
from certify import claims
from certify import report as report_writer
from certify import verification
from certify import execution
from propositions.kit import parallel

PROFILE_NAMES = ("quick", "default", "thorough")
CITE_FORMATS = ("text", "markdown", "bibtex")
DEFAULT_OUT = "reports"


class UsageError(ValueError):
    """Bad command-line input: reported on one line, exit code 2."""


class _Parser(argparse.ArgumentParser):
    def error(self, message):  # one line instead of argparse's usage block
        raise UsageError(f"{message} (see '{self.prog} --help')")


def _integer_at_least(minimum: int, what: str):
    """An argparse type: an integer >= minimum, else one line naming what it must be."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{what} must be {'a non-negative' if minimum == 0 else 'a positive'} integer, not {text!r}") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"{what} must be {'a non-negative' if minimum == 0 else 'a positive'} integer, not {value}")
        return value

    return parse


_seed = _integer_at_least(0, "seed")
_positive_count = _integer_at_least(1, "the count")


def default_workers() -> int:
    """The worker processes of a run when --workers is not given: $CERTIFY_WORKERS, else the CPUs
    this process may use. The certificates are bit for bit the same for any count, so the default
    is the fastest one, not the most conservative (docs/certificates.md#parallel-runs)."""
    import os

    text = os.environ.get("CERTIFY_WORKERS")
    if text:
        try:
            return _positive_count(text)
        except argparse.ArgumentTypeError as error:
            raise UsageError(f"CERTIFY_WORKERS: {error}") from None
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # no sched_getaffinity (macOS, Windows)
        return max(1, os.cpu_count() or 1)


def _add_execution_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--workers", type=_positive_count, default=None, metavar="N", help="worker processes for the claims' chunks (default: the CPUs available, or $CERTIFY_WORKERS); the certificates do not depend on N")
    parser.add_argument("--scheduler", default=None, metavar="ADDRESS", help="send the tasks to the dask.distributed cluster at ADDRESS (tcp://host:8786) instead of local processes (extra 'distributed')")


def _add_run_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--out", default=DEFAULT_OUT, metavar="DIR", help=f"directory for certificates, REPORT.md and figures/ (default {DEFAULT_OUT})")
    parser.add_argument("--seed", type=_seed, default=DEFAULT_SEED, metavar="S", help=f"seed of every random draw (default {DEFAULT_SEED})")
    parser.add_argument("--profile", choices=PROFILE_NAMES, default=DEFAULT_PROFILE, help=f"how much evidence to collect (default {DEFAULT_PROFILE})")
    _add_execution_options(parser)


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="certify", description="Certify the claims of 'Stiefel Attention' (arXiv 2609.19363) in float64.", epilog="exit codes: 0 all pass, 1 a certificate fails, 2 usage or input error")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)

    run_all = commands.add_parser("all", help="run every claim, write certificates and REPORT.md")
    _add_run_options(run_all)

    commands.add_parser("list", help="list the claims: ids, titles, controls")

    run = commands.add_parser("run", help="run the named claims")
    run.add_argument("ids", nargs="+", metavar="ID", help=f"claim ids: {', '.join(claims.ALL_IDS)}")
    _add_run_options(run)
    run.add_argument("--optimizer", default=claims.DEFAULT_OPTIMIZER, metavar="NAME", help="run against this optimizer: a variant (default stiefel_adam; a control name must make the claim fail), a name of certify.adapters.SHORTCUTS or a numpy:/torch: spec (docs/adapters.md)")
    run.add_argument("--implementation", metavar="MODULE:CALLABLE", help="a NumPy step (docs/adapters.md): the same as --optimizer numpy:MODULE:CALLABLE")
    run.add_argument("--torch-optimizer", metavar="MODULE:CLASS[:JSON]", help="a torch.optim.Optimizer (docs/adapters.md): the same as --optimizer torch:MODULE:CLASS[:JSON]")

    compare = commands.add_parser("compare", help="run P1..P5 on several implementations: certificates per pair and a matrix in REPORT.md")
    compare.add_argument("implementations", nargs="*", metavar="IMPL", help="names (reference_impl, torch_impl, torch_impl-float32, geoopt-euclidean, geoopt-canonical, stiefel_adam, the controls) or numpy:/torch: specs")
    compare.add_argument("--implementation", action="append", default=[], metavar="MODULE:CALLABLE", help="add a NumPy step (numpy:MODULE:CALLABLE)")
    compare.add_argument("--torch-optimizer", action="append", default=[], metavar="MODULE:CLASS[:JSON]", help="add a torch optimizer (torch:MODULE:CLASS[:JSON])")
    compare.add_argument("--out", default=None, metavar="DIR", help="certificates go to DIR/compare/<impl>/<claim>.json, the matrix into DIR/REPORT.md (default: a fresh folder compare-<UTC time> here, so that no report is overwritten)")
    compare.add_argument("--seed", type=_seed, default=DEFAULT_SEED, metavar="S", help=f"seed of every random draw (default {DEFAULT_SEED})")
    compare.add_argument("--profile", choices=PROFILE_NAMES, default="quick", help="how much evidence to collect (default quick)")

    crosscheck = commands.add_parser("crosscheck", help="the torch kernel against the float64 reference")
    crosscheck.add_argument("--device", choices=claims.CROSSCHECK_DEVICES, default="cpu")
    crosscheck.add_argument("--dtype", choices=claims.CROSSCHECK_DTYPES, default="float64")
    _add_run_options(crosscheck)

    verify = commands.add_parser("verify", help="check digests, re-run certificates, print the tolerance report")
    verify.add_argument("files", nargs="+", metavar="FILE")
    verify.add_argument("--report", metavar="FILE", help="also write the tolerance report as markdown to FILE")
    _add_execution_options(verify)

    regression = commands.add_parser("regression", help="write a pytest file replaying the minimal counterexamples of failing certificates")
    regression.add_argument("files", nargs="+", metavar="FILE")
    regression.add_argument("-o", "--output", required=True, metavar="FILE.py", help="the pytest file to write")

    cite = commands.add_parser("cite", help="citation of a certificate: id, statement, verdict, digest, version, reproduce command")
    cite.add_argument("file", metavar="FILE")
    cite.add_argument("--format", choices=CITE_FORMATS, default="text", help="text (one line, the default), markdown or bibtex")

    mutate = commands.add_parser(
        "mutate",
        help="mutation score of the certificates: mutate reference_impl, write MUTATION.md and mutation.json",
        description="Mutate reference_impl with mutmut (the [tool.mutmut] table of pyproject.toml) and count the mutants that make "
        "some certificate (P1..P6 and the samplers) fail (kill suite tests/mutation); writes DIR/MUTATION.md and DIR/mutation.json. "
        "Needs the 'mutation' extra (mutmut). Exit 0 when every mutant is killed, timed out or its survival is explained "
        "(certify/mutation_equivalent.json: equivalent or validation), 1 otherwise.",
    )
    mutate.add_argument("--out", default=DEFAULT_OUT, metavar="DIR", help=f"directory for MUTATION.md and mutation.json (default {DEFAULT_OUT})")
    mutate.add_argument("--max-children", type=_positive_count, default=None, metavar="N", help="mutants tested in parallel (default: the number of CPUs)")
    keep = mutate.add_mutually_exclusive_group()
    keep.add_argument("--resume", action="store_true", help="keep mutants/ of an earlier run and test only the mutants without a result")
    keep.add_argument("--report-only", action="store_true", help="write the reports from the results in mutants/ without testing mutants")
    mutate.add_argument("--only", action="append", default=[], metavar="PATTERN", help="test (again) only the mutants whose name matches (fnmatch, e.g. 'reference_impl.adam.x_step*'); the others keep their results")
    return parser


# --------------------------------------------------------------------------------------------
# Output
# --------------------------------------------------------------------------------------------


class _Output:
    """stdout for results (rich on a terminal, plain lines otherwise), stderr for errors."""

    def __init__(self):
        from rich.console import Console

        self.console = Console(file=sys.stdout)
        self.rich = self.console.is_terminal

    def line(self, text: str) -> None:
        if self.rich:
            self.console.print(text, markup=False, highlight=False)
        else:
            print(text, flush=True)

    def table(self, header: list[str], rows: list[list[str]], title: str | None = None) -> None:
        if self.rich:
            from rich.markup import escape
            from rich.table import Table

            table = Table(title=title)
            for column in header:
                table.add_column(column, overflow="fold")
            styles = {"pass": "green", "fail": "bold red", "inconclusive": "yellow"}
            for row in rows:
                table.add_row(*[f"[{styles[c]}]{c}[/]" if c in styles else escape(str(c)) for c in row])
            self.console.print(table)
            return
        widths = [max(len(str(row[i])) for row in [header, *rows]) for i in range(len(header))]
        if title:
            print(title)
        for row in [header, *rows]:
            print("  ".join(str(cell).ljust(width) for cell, width in zip(row, widths)).rstrip(), flush=True)


def error_line(message: str) -> None:
    print(f"certify: error: {message}", file=sys.stderr, flush=True)


# --------------------------------------------------------------------------------------------
# Commands
# --------------------------------------------------------------------------------------------


def _out_dir(text: str) -> Path:
    """The output directory, created now so that an unusable --out fails before any claim runs."""
    out = Path(text)
    if out.exists() and not out.is_dir():
        raise UsageError(f"--out {text}: exists and is not a directory")
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        raise UsageError(f"--out {text}: cannot be created ({error.strerror or error})") from None
    return out


def _fresh_folder(prefix: str) -> Path:
    """PREFIX-<UTC time> in the current directory, with -2, -3, ... where that name is taken."""
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    candidate, index = Path(f"{prefix}-{stamp}"), 1
    while candidate.exists():
        index += 1
        candidate = Path(f"{prefix}-{stamp}-{index}")
    return candidate


def _check_optimizer(name: str) -> None:
    if name == claims.DEFAULT_OPTIMIZER:
        return
    try:
        from reference_impl import VARIANTS
    except Exception as error:
        raise UsageError(f"--optimizer {name}: the optimizer variants cannot be loaded ({type(error).__name__}: {error})") from None
    if name not in VARIANTS:
        _resolve_implementation(name)


def _resolve_implementation(spec: str):
    """The Variant of an adapter spec; UsageError (exit 2, one line) when it cannot be used."""
    from certify import adapters

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


def _require_torch(options: dict, what: str) -> None:
    if not claims.torch_available():
        raise UsageError(f"{what} needs torch, which is not installed (pip install 'stiefel-adam-certify[torch]')")
    if options.get("device") == "cuda" and not claims.cuda_available():
        raise UsageError(f"{what} asks for device cuda, but CUDA is not available here (torch.cuda.is_available() is False)")


class _Progress:
    """Progress of a run: claims done, and the chunk tasks of the claims running now.

    On a terminal a rich progress display (one bar for the claims, one per running chunk map,
    removed when it completes); otherwise plain lines: one when a claim starts and ends, and for a
    chunk map still running after PLAIN_EVERY_SECONDS one line every PLAIN_EVERY_SECONDS, so a CI
    log shows a long thorough run advancing while a default run prints what it printed before.
    """

    PLAIN_EVERY_SECONDS = 30.0

    def __init__(self, out: _Output, claims_total: int):
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


def _forward_progress(executor, progress: _Progress):
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
    a large number for a claim that needs an optional package (the torch cross-check), else 0."""
    try:
        previous = certificate_format.load(path)
        if previous["provenance"]["profile"] == profile:
            return float(certificate_format.run_record(previous)["wall_seconds"])
    except Exception:  # no usable certificate there: fall back on the claim's kind
        pass
    return 1e6 if _requirements(claim_id) else 0.0


class _Recorder:
    """Writes each certificate as it arrives, prints its line and counts internal errors."""

    def __init__(self, out: _Output, out_dir: Path):
        self.out, self.out_dir = out, out_dir
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
            path = certificate_format.write(sealed, self.out_dir / f"{claim_id}.json")
        except OSError as error:
            raise UsageError(f"cannot write {self.out_dir / (claim_id + '.json')}: {error.strerror or error}") from None
        timing = certificate_format.run_record(sealed)
        self.out.line(f"{claim_id}: {sealed['verdict']} in {timing['wall_seconds']:.2f} s ({sealed['numerical']['frames']} frames) -> {path}")
        for reason in sealed["failures"] + sealed["inconclusive"]:
            self.out.line(f"    {reason}")
        found = sealed["extra"].get("counterexample")
        if found:
            from certify.counterexample import block

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


def _run_and_record(ids: list[str], args, out: _Output, command: str, options_for, notes: list[str], runnable=lambda claim_id: True) -> int:
    """Run claims, write their certificates and the report, print the summary; the exit code.

    runnable(id) is asked before the claims run; False skips that claim (it adds its own note).
    With one worker, or one claim, the claims run here one after another and each claim's chunk
    tasks go to the executor; with several claims and a pool or a cluster, each claim is a task
    (its chunks then run inline in its pool worker, or go back to the cluster from a dask worker).
    """
    out_dir = _out_dir(args.out)
    optimizer = getattr(args, "optimizer", claims.DEFAULT_OPTIMIZER)
    executor = parallel.current()
    started = time.perf_counter()
    recorder = _Recorder(out, out_dir)
    to_run = []
    for claim_id in ids:
        if runnable(claim_id):
            to_run.append(claim_id)
        else:
            out.line(notes[-1])
    settings = dict(seed=args.seed, profile=args.profile, optimizer=optimizer, command=command, workers=executor.workers, scheduler=executor.scheduler)

    with _Progress(out, len(to_run)) as progress, parallel.reporting(progress.chunks):
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

    out.table(report_writer.SUMMARY_HEADER, report_writer.summary_rows(certificates), title="certificates")
    out.line(f"report: {report_path}" + ("" if plotted else " (plots left out: matplotlib is not installed)"))
    counts = {verdict: sum(c["verdict"] == verdict for c in certificates) for verdict in ("pass", "fail", "inconclusive")}
    out.line(f"{counts['pass']} passed, {counts['fail']} failed, {counts['inconclusive']} inconclusive in {total_wall:.2f} s")
    all_pass = certificates and all(c["verdict"] == "pass" for c in certificates)
    return 0 if all_pass and not recorder.internal_errors else 1


def _options_for(claim_id: str) -> dict:
    try:
        return claims.default_options(claim_id)
    except Exception:  # a claim that cannot be loaded runs (and reports why) with no options
        return {}


def command_all(args, out: _Output, command: str) -> int:
    notes: list[str] = []
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


def command_run(args, out: _Output, command: str) -> int:
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
            raise UsageError(f"{claim_id} needs {', '.join(missing)}, which is not installed (pip install 'stiefel-adam-certify[{missing[0]}]')")
    return _run_and_record(ids, args, out, command, _options_for, [])


def command_crosscheck(args, out: _Output, command: str) -> int:
    options = {"device": args.device, "dtype": args.dtype}
    _require_torch(options, "crosscheck")
    return _run_and_record([claims.CROSSCHECK_ID], args, out, command, lambda claim_id: dict(options), [])


def command_list(args, out: _Output, command: str) -> int:
    rows = []
    for claim_id in claims.ALL_IDS:
        try:
            claim = claims.lookup_claim(claim_id)
        except Exception as error:
            rows.append([claim_id, f"(cannot be loaded: {claims.describe_error(error)})", "-"])
            continue
        missing = claims.missing_requirements(claim)
        title = claim.title + (f" (skipped: {', '.join(missing)} not installed)" if missing else "")
        rows.append([claim_id, title, ", ".join(claim.control_names) or "-"])
    for module, problem in propositions.discover()[1].items():
        rows.append([module, f"(cannot be imported: {problem})", "-"])
    out.table(["id", "title", "controls"], rows)
    return 0


def _report_path(text: str | None) -> Path | None:
    """The --report file, checked before any re-run: its directory must exist."""
    if text is None:
        return None
    path = Path(text)
    if path.is_dir():
        raise UsageError(f"--report {text}: is a directory, not a file")
    if not path.parent.is_dir():
        raise UsageError(f"--report {text}: directory {path.parent} does not exist")
    return path


def _rerun(recorded: dict, command: str) -> tuple[dict, str | None]:
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
        "recorded / re-run residual: the worst residual of a check (largest over its samples) or a control's deciding one; "
        "bound: the largest per-sample bound of a check; re-run ratio: worst residual/bound (at most 1 passes) or a control's "
        "margin (at least its detection factor detects).",
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
    from certify import adapters

    spec = recorded["provenance"]["optimizer"]
    if not claims.is_adapter_spec(spec):
        return None
    try:
        adapters.resolve(spec)
    except adapters.AdapterError as error:
        return f"the implementation cannot be used here: {error}"
    return None


def command_verify(args, out: _Output, command: str) -> int:
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
            raise UsageError(f"verifying {name} needs {package}, which is not installed (pip install 'stiefel-adam-certify[{package}]')")
        if recorded["id"] == claims.CROSSCHECK_ID:
            _require_torch(recorded["provenance"]["options"], f"verifying {name}")
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
    if report_path is not None:
        text = verification.markdown(entries, header=_verification_header(loaded, entries))
        try:
            report_path.write_text(text, encoding="utf-8")
        except OSError as error:
            raise UsageError(f"cannot write --report {report_path}: {error.strerror or error}") from None
        out.line(f"tolerance report: {report_path}")
    return exit_code


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
    if style == "text":
        return (
            f"{certificate['id']} ({certificate['title']}): {certificate['verdict']}, "
            f"sha256 {digest[:16]}, {source}; reproduce: {provenance['reproduce']}"
        )
    if style == "markdown":
        lines = [
            f"**{certificate['id']}: {certificate['title']}**: {certificate['statement']['text']}",
            "",
            f"Verdict **{certificate['verdict']}** · sha256 `{digest}` · {source.replace(' @ ', ', commit `') + ('`' if commit else '')} · "
            f"reproduce: `{provenance['reproduce']}`" + (f" · [{docs}]({docs})" if docs else ""),
        ]
        return "\n".join(lines)
    year = str(certificate_format.run_record(certificate).get("created_utc") or "")[:4]
    fields = {
        "title": f"{{{_bibtex_escape(certificate['id'] + ': ' + certificate['title'])}}}",
        "author": "{stiefel-adam-certify}",
        "year": f"{{{_bibtex_escape(year)}}}" if year.isdigit() else None,
        "version": f"{{{_bibtex_escape(version)}}}",
        "howpublished": f"{{certificate {certificate['id']}, verdict {certificate['verdict']}, sha256 {digest}}}",
        "note": "{" + _bibtex_escape(
            f"Statement: {certificate['statement']['text']} Verdict: {certificate['verdict']}. "
            f"stiefel-adam-certify {version}" + (f", git commit {commit}" if commit else "") + f". Reproduce: {provenance['reproduce']}"
            + (f". Documentation: {docs}" if docs else "")
        ) + "}",
    }
    key = f"stiefel-adam-certify:{certificate['id']}:{digest[:12]}"
    body = ",\n".join(f"  {name} = {value}" for name, value in fields.items() if value is not None)
    return f"@misc{{{key},\n{body}\n}}"


def command_cite(args, out: _Output, command: str) -> int:
    certificate = certificate_format.load(Path(args.file))
    for line in citation(certificate, args.format).splitlines():
        out.line(line)
    return 0 if certificate["verdict"] == "pass" else 1


def command_mutate(args, out: _Output, command: str) -> int:
    import os

    from certify import mutation

    if args.report_only and args.only:
        raise UsageError("--only tests mutants, --report-only tests none: give one of them")
    out_dir = _out_dir(args.out)
    try:
        summary = mutation.mutate(max_children=args.max_children or os.cpu_count() or 1, resume=args.resume, report_only=args.report_only, command=command, progress=out.line, only=args.only)
    except mutation.MissingTool as error:
        raise UsageError(str(error)) from None
    except (mutation.MutationError, OSError) as error:
        error_line(str(error))
        return 1
    try:
        md_path, json_path = mutation.write_reports(summary, out_dir)
    except OSError as error:
        raise UsageError(f"cannot write the mutation report in {out_dir}: {error.strerror or error}") from None
    totals, classes = summary["totals"], summary["survivor_classes"]
    out.table(["module", "killed", "survived", "timeout", "suspicious", "other", "total"], [[name, *(c[k] for k in ("killed", "survived", "timeout", "suspicious", "other", "total"))] for name, c in summary["modules"].items()], title="mutants")
    score = "-" if totals["score"] is None else f"{100 * totals['score']:.1f}%"
    out.line(f"score {totals['killed']}/{totals['total']} = {score}; not killed: {classes['equivalent']} equivalent, {classes['validation']} validation, {classes['control']} control, {classes['sampler']} sampler, {classes['gap']} gap, {classes['detected']} timeout, {classes['unclassified']} unclassified")
    out.line(f"report: {md_path} and {json_path}")
    return 0 if not mutation.unexplained(summary) else 1


def _print_counterexamples(out: _Output, results: dict) -> None:
    """The minimal counterexample of each failing pair, one block each."""
    from certify.counterexample import block

    for spec, row in results.items():
        for claim_id, certificate in row.items():
            found = certificate.get("extra", {}).get("counterexample")
            if found and found.get("found"):
                out.line(f"{spec} {claim_id}: minimal counterexample:")
                for line in block(found):
                    out.line(f"    {line}")


def command_compare(args, out: _Output, command: str) -> int:
    from certify import compare, probes

    specs = list(args.implementations) + [f"numpy:{x}" for x in args.implementation] + [f"torch:{x}" for x in args.torch_optimizer]
    if not specs:
        raise UsageError("name at least one implementation to compare (e.g. certify compare reference_impl torch_impl)")
    specs = list(dict.fromkeys(specs))
    variants = {spec: _resolve_implementation(spec) for spec in specs}  # unusable input: exit 2 before any run
    out_dir = _out_dir(args.out if args.out is not None else str(_fresh_folder("compare")))
    results, wall_seconds = compare.run(specs, out_dir=out_dir, seed=args.seed, profile=args.profile, command=command, progress=out.line)
    found = {}
    for spec, variant in variants.items():
        if getattr(variant, "dtype", "float64") == "float64":
            found[spec] = probes.probe(variant, seed=args.seed)
    text = compare.markdown(results, found, seed=args.seed, profile=args.profile, wall_seconds=wall_seconds, command=command)
    try:
        path = compare.write_matrix(out_dir, text)
    except OSError as error:
        raise UsageError(f"cannot write the report in {out_dir}: {error.strerror or error}") from None
    out.table(["implementation", *claims.COMPARE_CLAIMS], compare.matrix_rows(results), title="implementations x claims")
    _print_counterexamples(out, results)
    for spec, listed in found.items():
        differing = [f"{p['property']}: {p['finding']}" for p in listed if p["differs"]]
        if differing:
            out.line(f"{spec} differs from StiefelAdam in: " + "; ".join(differing))
    out.line(f"report: {path}; certificates under {out_dir / 'compare'} ({wall_seconds:.1f} s)")
    expected = {spec: "pass" for spec in specs}
    return 0 if all(c["verdict"] == expected[spec] for spec in specs for c in results[spec].values()) else 1


def command_regression(args, out: _Output, command: str) -> int:
    from certify import regression

    target = Path(args.output)
    if target.is_dir() or not target.parent.is_dir():
        raise UsageError(f"-o {args.output}: " + ("is a directory" if target.is_dir() else f"directory {target.parent} does not exist"))
    try:
        count = regression.write(args.files, target)
    except regression.RegressionError as error:
        raise UsageError(str(error)) from None
    except OSError as error:
        raise UsageError(f"cannot write {target}: {error.strerror or error}") from None
    out.line(f"{target}: {count} counterexample(s); run it with: python -m pytest {target}")
    return 0


COMMANDS = {
    "regression": command_regression,
    "compare": command_compare,
    "all": command_all,
    "list": command_list,
    "run": command_run,
    "crosscheck": command_crosscheck,
    "verify": command_verify,
    "cite": command_cite,
    "mutate": command_mutate,
}


def make_executor(args):
    """Where the command's tasks run (certify.execution): a dask cluster for --scheduler,
    a process pool for more than one worker, else this process."""
    if getattr(args, "scheduler", None):
        if getattr(args, "workers", None) is not None:
            raise UsageError("--workers and --scheduler exclude each other: the cluster's workers run the tasks")
        try:
            executor = execution.Dask(args.scheduler)
        except ImportError as error:
            raise UsageError(str(error)) from None
        except (OSError, TimeoutError, ValueError) as error:
            raise UsageError(f"--scheduler {args.scheduler}: cannot connect ({claims.describe_error(error)})") from None
        try:
            problems = executor.check_preconditions()
        except Exception:
            executor.close()
            raise
        if problems:
            executor.close()
            raise UsageError(f"--scheduler {args.scheduler}: {problems[0]}" + (f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""))
        return executor
    if not hasattr(args, "workers"):
        return parallel.Inline()
    workers = args.workers if args.workers is not None else default_workers()
    return parallel.Inline() if workers == 1 else execution.Pool(workers)


def main(argv: list[str] | None = None) -> int:
    """Entry point of the console script; returns the exit code (0 pass, 1 fail, 2 usage/input)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        args = build_parser().parse_args(argv)
        with execution.using(make_executor(args)):
            return COMMANDS[args.command](args, _Output(), "certify " + shlex.join(argv))
    except (UsageError, certificate_format.CertificateError) as error:
        error_line(str(error))
        return 2
    except SystemExit as exit_request:  # --help
        return exit_request.code if isinstance(exit_request.code, int) else 0
    except KeyboardInterrupt:
        error_line("interrupted")
        return 130
    except Exception as error:  # a bug here must still not end in a traceback
        error_line(f"internal error: {claims.describe_error(error)}")
        return 1


if __name__ == "__main__":
    raise SystemExit(main())
