"""The `certify` console script.

    certify all [--out DIR] [--seed S] [--profile quick|default|thorough] [--workers N | --scheduler ADDRESS]
    certify list
    certify run ID... [--out DIR] [--seed S] [--profile P] [--optimizer NAME | --implementation M:C | --torch-optimizer M:C[:JSON]] [--workers N | --scheduler ADDRESS]
    certify crosscheck [--device cpu|cuda] [--dtype float64|float32|bfloat16] [--out DIR] [--seed S] [--profile P]
    certify compare IMPL... [--implementation MODULE:CALLABLE]... [--torch-optimizer MODULE:CLASS[:JSON]]... [--out DIR] [--seed S] [--profile P]
    certify verify FILE... [--report FILE] [--workers N | --scheduler ADDRESS]
    certify cite FILE [--format text|markdown|bibtex]
    certify regression CERT.json... -o FILE.py
    certify mutate [--target reference_impl|torch_impl|certifier] [--out DIR] [--max-children N] [--sample N] [--seed S] [--resume | --report-only] [--only PATTERN]...

Defaults: --out reports, --seed 0, --profile $CERTIFY_PROFILE or default, --optimizer stiefel_adam (the real
optimizer; any other name of reference_impl.VARIANTS runs the claim against that broken variant,
which must then fail), --workers $CERTIFY_WORKERS or the CPUs available. --workers N runs the
claims' chunk tasks (several claims: the claims themselves) in N processes, --scheduler on a dask
cluster (certify.execution); the certificates and their digests do not depend on either
(docs/certificates.md#parallel-runs). Progress: a rich display on a terminal, plain lines otherwise.

`all` runs every claim of the propositions package (P1..P6, the sampler certificate and, when
`import torch` works, the torch cross-check, last); `run` and `all` write one
certificate per claim (DIR/ID.json), DIR/REPORT.md and, with matplotlib, DIR/figures/*.png. The
report written by `run` also covers the certificates already in DIR that load cleanly.

`compare` runs P1..P5 on each implementation named (certify.outside.adapters: reference_impl, torch_impl,
torch_impl-float32, geoopt-euclidean, geoopt-canonical, the variants, numpy:/torch: specs), writes
DIR/compare/<impl>/<claim>.json and the implementation x claim matrix into DIR/REPORT.md, with the
property probes of certify.outside.probes naming how each implementation differs (docs/adapters.md). A
claim that does not apply to an implementation (the torch bookkeeping claim on a NumPy step) is its
own outcome, "not applicable": no certificate, not counted. Its exit code is 0 when every applicable
pair passes. `run` with --implementation, --torch-optimizer or a variant (--optimizer other than
stiefel_adam) writes to a fresh folder run-<UTC time> unless --out is given: only the reference's own
run writes reports/.

A failing certificate of an outside implementation (--implementation, --torch-optimizer, compare)
records its minimal counterexample (certify.ci.counterexample: the smallest case of the claim's own
parameters that still fails the same check, its first diverging step and the first stage of
docs/algorithm.md that differs), printed in one block under the certificate's line and in
REPORT.md. `regression` writes a pytest file that replays the counterexamples of the certificates
named (certify.ci.regression; docs/ci.md).

`verify` first re-checks each file's digest, then re-runs the claim from the recorded seed,
profile, optimizer and options and compares (certify.verification): the verdict, the pass/fail
of every check, the detection of every control, counts, shapes and the reproduce command must
agree on any machine; residuals must be bit-identical only where the re-run's rounding
fingerprint is the recorded one, and are reported, never required, elsewhere. It prints, per
certificate, a verdict line, the fingerprint line and a table of every check and control
(at each check's worst sample: recorded residual, re-run residual, re-run bound, ratio, pass, bit-identical); --report FILE also writes
that as markdown; a certificate whose implementation cannot be used here (its module does not
import) is not re-run, and says so in one line. `cite` prints a citation (text: one line; markdown; bibtex) with the id,
statement, verdict, digest, project version and commit and the reproduce command.

Exit codes:
  0  every certificate passes (for verify: and its re-run agrees with it); a claim that does not
     apply to the implementation is not counted;
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

from certify import DEFAULT_PROFILE, DEFAULT_SEED, UsageError
from certify import certificate as certificate_format
from certify import claims
from certify import execution
from certify.commands import command_cite, command_compare, command_list, command_mutate, command_regression, command_run_or_properties
from certify.render import Output, error_line
from certify.run import DEFAULT_OUT, command_all, command_crosscheck, command_verify
from propositions.kit import parallel

PROFILE_NAMES = ("quick", "default", "thorough")
CITE_FORMATS = ("text", "markdown", "bibtex")
MUTATION_TARGETS = ("reference_impl", "torch_impl", "certifier")  # certify mutate --target; the first is the default


class _Parser(argparse.ArgumentParser):
    def error(self, message):  # one line instead of argparse's usage block
        raise UsageError(f"{message} (see '{self.prog} --help')")


CLAIM_IDS = "{the claim ids}"


class _ClaimIdsFormatter(argparse.HelpFormatter):
    """Writes the claim ids into a help text (CLAIM_IDS) when the help is printed: listing them
    imports every claim module, over a second that no other use of the parser needs."""

    def _get_help_string(self, action):
        text = super()._get_help_string(action)
        return text.replace(CLAIM_IDS, ", ".join(claims.ALL_IDS)) if text and CLAIM_IDS in text else text


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


def default_profile() -> str:
    """The profile of `all`, `run` and `crosscheck` when --profile is not given: $CERTIFY_PROFILE (a CI
    that wants quick runs everywhere), else the default profile. The certificate's reproduce command
    names the profile either way."""
    import os

    text = os.environ.get("CERTIFY_PROFILE")
    if text and text not in PROFILE_NAMES:
        raise UsageError(f"CERTIFY_PROFILE: must be one of {', '.join(PROFILE_NAMES)}, not {text!r}")
    return text or DEFAULT_PROFILE


def _add_execution_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--workers", type=_positive_count, default=None, metavar="N", help="worker processes for the claims' chunks (default: the CPUs available, or $CERTIFY_WORKERS); the certificates do not depend on N")
    parser.add_argument("--scheduler", default=None, metavar="ADDRESS", help="send the tasks to the dask.distributed cluster at ADDRESS (tcp://host:8786) instead of local processes (extra 'distributed')")


def _add_run_options(parser: argparse.ArgumentParser, *, optimizers: bool = False) -> None:
    fresh = "; for any optimizer but the reference's own, a fresh folder run-<UTC time> here" if optimizers else ""
    parser.add_argument("--out", default=None, metavar="DIR", help=f"directory for certificates, REPORT.md and figures/ (default {DEFAULT_OUT}{fresh})")
    parser.add_argument("--seed", type=_seed, default=DEFAULT_SEED, metavar="S", help=f"seed of every random draw (default {DEFAULT_SEED})")
    parser.add_argument("--profile", choices=PROFILE_NAMES, default=None, help=f"how much evidence to collect (default $CERTIFY_PROFILE, else {DEFAULT_PROFILE})")
    _add_execution_options(parser)


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="certify", description="Certify the claims of 'Stiefel Attention' (arXiv 2609.19363) in float64, and the implementations that train with it in their own dtypes.", epilog="exit codes: 0 all pass, 1 a certificate fails, 2 usage or input error")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)

    run_all = commands.add_parser("all", help="run every claim, write certificates and REPORT.md")
    _add_run_options(run_all)

    commands.add_parser("list", help="list the claims: ids, titles, controls")

    run = commands.add_parser("run", help="run the named claims", formatter_class=_ClaimIdsFormatter)
    run.add_argument("ids", nargs="+", metavar="ID", help=f"claim ids: {CLAIM_IDS}")
    _add_run_options(run, optimizers=True)
    run.add_argument("--optimizer", default=claims.DEFAULT_OPTIMIZER, metavar="NAME", help="run against this optimizer: a variant (default stiefel_adam; a control name must make the claim fail), a name of certify.outside.adapters.SHORTCUTS or a numpy:/torch: spec (docs/adapters.md)")
    run.add_argument("--implementation", metavar="MODULE:CALLABLE", help="a NumPy step (docs/adapters.md): the same as --optimizer numpy:MODULE:CALLABLE")
    run.add_argument("--torch-optimizer", metavar="MODULE:CLASS[:JSON]", help="a torch.optim.Optimizer (docs/adapters.md): the same as --optimizer torch:MODULE:CLASS[:JSON]")
    run.add_argument("--properties", action="store_true", help="ask each claim's property (P1..P5) of the optimizer as a black box: holds / fails / vacuous / untested (docs/adapters.md#property-verdicts); default --out a fresh folder properties-<UTC time>")

    compare = commands.add_parser("compare", help="run P1..P5 on several implementations: certificates per pair and a matrix in REPORT.md")
    compare.add_argument("implementations", nargs="*", metavar="IMPL", help="names (reference_impl, torch_impl, torch_impl-float32, geoopt-euclidean, geoopt-canonical, geoopt-sgd-euclidean, geoopt-sgd-canonical, geotorch-adam, geotorch-sgd, stiefel_adam, the controls) or numpy:/torch: specs")
    compare.add_argument("--implementation", action="append", default=[], metavar="MODULE:CALLABLE", help="add a NumPy step (numpy:MODULE:CALLABLE)")
    compare.add_argument("--torch-optimizer", action="append", default=[], metavar="MODULE:CLASS[:JSON]", help="add a torch optimizer (torch:MODULE:CLASS[:JSON])")
    compare.add_argument("--out", default=None, metavar="DIR", help="certificates go to DIR/compare/<impl>/<claim>.json, the matrix into DIR/REPORT.md (default: a fresh folder compare-<UTC time> here, so that no report is overwritten)")
    compare.add_argument("--seed", type=_seed, default=DEFAULT_SEED, metavar="S", help=f"seed of every random draw (default {DEFAULT_SEED})")
    compare.add_argument("--profile", choices=PROFILE_NAMES, default="quick", help="how much evidence to collect (default quick)")
    compare.add_argument("--properties", action="store_true", help="instead of the certificates, ask each claim's property of each implementation as a black box: the matrix of which has which property (docs/adapters.md#property-verdicts)")
    compare.add_argument("--table", metavar="FILE", help="with --properties: also write the matrix between the '<!-- certify properties table: begin/end -->' markers of FILE (README.md's table)")

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

    _add_mutate_parser(commands)
    return parser


def _add_mutate_parser(commands) -> None:
    """`certify mutate` and its options."""
    mutate = commands.add_parser(
        "mutate",
        help="mutation score of the certificates: mutate reference_impl, torch_impl or the certifier, write MUTATION.md and the target's JSON",
        description="Mutate reference_impl with mutmut (the [tool.mutmut] table of pyproject.toml) and count the mutants that make "
        "some certificate (P1..P6 and the samplers) fail (kill suite tests/mutation/test_certificates.py); writes DIR/MUTATION.md and DIR/mutation.json. "
        "--target torch_impl mutates the PyTorch optimizer instead (a seeded sample; kill suite: the certificates crosscheck, optimizer and "
        "bookkeeping; DIR/mutation-torch_impl.json), --target certifier weakens the certificates (DIR/mutation-certifier.json); MUTATION.md "
        "shows every target whose JSON is in DIR. "
        "Needs the 'mutation' extra (mutmut). Exit 0 when every mutant is killed, timed out or its survival is explained "
        "(certify/mutation_equivalent.json: equivalent or validation), 1 otherwise.",
    )
    mutate.add_argument("--target", choices=MUTATION_TARGETS, default=MUTATION_TARGETS[0],
                        help="what is mutated: reference_impl (the default; every mutant, kill suite P1..P6 and the samplers), torch_impl "
                        "(a seeded sample of mutants of the PyTorch optimizer, kill suite crosscheck, optimizer, bookkeeping) or certifier "
                        "(weakened certificates, certify.weakening)")
    mutate.add_argument("--out", default=DEFAULT_OUT, metavar="DIR", help=f"directory for MUTATION.md and the target's JSON (default {DEFAULT_OUT})")
    mutate.add_argument("--sample", type=_positive_count, default=None, metavar="N",
                        help="torch_impl and certifier: test a seeded sample of N mutants (torch_impl default 200; certifier: all)")
    mutate.add_argument("--seed", type=int, default=0, metavar="S", help="torch_impl and certifier: the seed of the sample (default 0)")
    mutate.add_argument("--max-children", type=_positive_count, default=None, metavar="N", help="mutants tested in parallel (default: the number of CPUs)")
    keep = mutate.add_mutually_exclusive_group()
    keep.add_argument("--resume", action="store_true", help="keep mutants/ of an earlier run and test only the mutants without a result")
    keep.add_argument("--report-only", action="store_true", help="write the reports from the results in mutants/ without testing mutants")
    mutate.add_argument("--only", action="append", default=[], metavar="PATTERN", help="test (again) only the mutants whose name matches (fnmatch, e.g. 'reference_impl.adam.x_step*'); the others keep their results")


COMMANDS = {
    "regression": command_regression,
    "compare": command_compare,
    "all": command_all,
    "list": command_list,
    "run": command_run_or_properties,
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
    """Entry point of the console script; returns the exit code (0 pass, 1 fail, 2 usage/input, 130
    interrupted, 141 standard output closed by its reader)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        args = build_parser().parse_args(argv)
        if getattr(args, "profile", "") is None:
            args.profile = default_profile()
        with execution.using(make_executor(args)):
            return COMMANDS[args.command](args, Output(), "certify " + shlex.join(argv))
    except (UsageError, certificate_format.CertificateError) as error:
        error_line(str(error))
        return 2
    except SystemExit as exit_request:  # --help
        return exit_request.code if isinstance(exit_request.code, int) else 0
    except KeyboardInterrupt:
        error_line("interrupted")
        return 130
    except BrokenPipeError:
        # the reader of standard output went away (certify all | head): stop as a pipeline stage
        # killed by SIGPIPE does, quietly and with its exit code; what is still buffered for the
        # closed pipe goes nowhere instead of failing once more at exit
        _discard_standard_output()
        return 128 + 13
    except Exception as error:  # a bug here must still not end in a traceback
        error_line(f"internal error: {claims.describe_error(error)}")
        return 1


def _discard_standard_output() -> None:
    import os

    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError):  # stdout is not a file descriptor (a test's capture): nothing buffered there
        pass


def console() -> None:
    """The console script `certify`: main(), then the process ends without
    the interpreter's teardown, which frees the modules of sympy, scipy and matplotlib object by
    object (about a second after the summary line of `certify all`). The exit handlers run and the
    standard streams are flushed first, as at an ordinary exit; with a thread still running (none is
    expected: the pool and the progress thread are joined) the ordinary exit waits for it."""
    code = main()
    import atexit
    import os
    import threading

    run_exit_handlers = getattr(atexit, "_run_exitfuncs", None)
    if threading.active_count() > 1 or run_exit_handlers is None:
        raise SystemExit(code)
    run_exit_handlers()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):  # a closed pipe (certify all | head): nothing more can be written
            pass
    os._exit(code)


if __name__ == "__main__":
    raise SystemExit(main())
