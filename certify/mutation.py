"""`certify mutate`: the certifier's own mutation score.

A certificate's "pass" is earned only if changing what the reference step computes makes some
certificate fail. This module measures that with mutmut 3: it mutates reference_impl/ one small
change at a time (an operator, a constant, a call argument), runs the kill suite tests/mutation
(every claim without an optional package, P1..P6 and the samplers, at a small profile; a mutant is killed when any verdict is not "pass" or a
claim raises) and writes DIR/MUTATION.md and DIR/mutation.json: killed / survived / timeout /
suspicious per module, the score killed / total and every mutant that was not killed, with its
diff on one line and the reason it survives.

What is mutated (the [tool.mutmut] table of pyproject.toml):

* reference_impl/ except highprec.py and exact.py: those are the independent models (the mpmath
  twin of P3, the exact rational arithmetic of P4 and P5) that the float64 reference is held to;
  mutating an oracle asks another question than whether the certificates see a change in the
  step. Module-level constants (UNIT_ROUNDOFF, MANIFOLD_TOL_FACTOR, RETRACTION_METHODS) are not
  mutated either: mutmut 3 mutates function bodies only.
* only lines that the kill suite executes (mutmut's mutate_only_covered_lines). A changed line
  that no certificate runs cannot be seen by one; running it would only confirm a survivor. Those
  lines are listed in the report instead (coverage.py over the kill suite), function by function,
  so that nothing is hidden.

Each mutant runs in a process forked from one that has run the kill suite once, with mutmut's
limit of (estimated time of its tests + timeout_constant) * timeout_multiplier wall seconds (twice
that in CPU seconds); past it the mutant counts as a timeout.

Reasons survive re-runs: certify/mutation_equivalent.json maps a stable description of a mutant,
"FILE | FUNCTION | OLD -> NEW" (the mutated line before and after, stripped of surrounding
blanks), to a class and a reason; "FILE | FUNCTION | *" covers every mutant of a function. The
classes:

* equivalent: the mutant computes what the original does on every input the step can receive
  (the reason says why);
* validation: the mutant weakens or rewords an input check; the certificates run on valid input
  by construction, so input validation is out of their scope (tests/test_validation.py covers it);
* control: the mutant changes one of the deliberately broken variants (reference_impl.controls),
  which stays broken and is still detected by the claims that run it, so the certificates are
  right to pass;
* sampler: the mutant changes how a random input of the certificates is drawn (random_point,
  haar_from_gaussian, random_signed_permutation, ...) while the draw stays a valid input; every
  claim holds for every input, so the certificates are right to pass (the distribution itself
  is tested in tests/test_manifold.py); the reason says when the evidence gets weaker;
* gap: the mutant changes what is computed and no certificate notices; the reason says what a
  certificate would need to kill it.

A survivor without an entry is listed as unclassified.

This module is the reference_impl target of `certify mutate` (the default); `--target torch_impl`
(certify.mutation_torch) mutates a seeded sample of the PyTorch optimizer's mutants and `--target
certifier` (certify.weakening) weakens the certificates. Each target writes its own JSON in the
report folder (TARGETS); DIR/MUTATION.md is composed from the JSON files present (`write_page`):
a table of every target's score, killed / (total - equivalent), then one section per target, so
running one target writes the page again without losing the others' sections.
"""

from __future__ import annotations

import ast
import contextlib
import datetime
import importlib.metadata
import json
import math
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Callable

MUTMUT_VERSION = "3.8.1"
REPORT_MD = "MUTATION.md"
REPORT_JSON = "mutation.json"
REPORT_KIND = "mutation-report"  # not a certificate: lets a reader of DIR/*.json tell the two apart
EQUIVALENT_FILE = Path(__file__).with_name("mutation_equivalent.json")
RUN_RECORD = "certify-mutate-run.json"  # inside mutants/: timing of the last run, for --report-only
LOG_NAME = "certify-mutate.log"  # inside mutants/: mutmut's own output
KILL_SUITE = "tests/mutation/test_certificates.py"  # tests/mutation/test_torch_certificates.py is the torch_impl target's (certify.mutation_torch)

CLASSES = ("equivalent", "validation", "control", "sampler", "gap")
EXPLAINED = ("equivalent", "validation", "control", "sampler")  # a survivor of these classes is not a weakness of the certificates
TIMEOUT_REASON = ("the certificates ran past the per-mutant limit, so the change is noticed (a run that does not finish is no "
                  "pass), though the score counts only kills")
COUNTED = ("killed", "survived", "timeout", "suspicious")  # every other mutmut status is "other"
NOT_TESTED = "not checked"  # mutmut's status of a mutant an interrupted run did not reach
NOT_MUTATED = {
    "reference_impl/highprec.py": "independent model (mpmath twin) the reference is held to in P3",
    "reference_impl/exact.py": "independent model (exact rational arithmetic) of the exact tiers of P4 and P5",
}
PROGRESS = re.compile(r"(\d+)/(\d+)\s+\S+\s*(\d+)\s+\S+\s*(\d+)\s+\S+\s*(\d+)\s+\S+\s*(\d+)\s+\S+\s*(\d+)")


class MutationError(Exception):
    """A mutation run that could not be carried out; the message is one line for people."""


class MissingTool(MutationError):
    """mutmut is not installed (or not the version whose results this module reads)."""


def project_root() -> Path:
    """The checkout that holds this package (pyproject.toml with the [tool.mutmut] table)."""
    return Path(__file__).resolve().parents[1]


def require_mutmut() -> None:
    try:
        version = importlib.metadata.version("mutmut")
    except importlib.metadata.PackageNotFoundError:
        raise MissingTool(f"certify mutate needs mutmut {MUTMUT_VERSION}, which is not installed (the 'mutation' extra: pip install -e '.[mutation]' in this project's checkout)") from None
    if version != MUTMUT_VERSION:
        raise MissingTool(f"certify mutate reads the results of mutmut {MUTMUT_VERSION}, found mutmut {version} (pip install 'mutmut=={MUTMUT_VERSION}')")


def mutmut_settings(root: Path) -> dict:
    import tomllib

    try:
        return tomllib.loads((root / "pyproject.toml").read_text(encoding="utf-8"))["tool"]["mutmut"]
    except (OSError, KeyError, tomllib.TOMLDecodeError):
        raise MutationError(f"{root / 'pyproject.toml'} has no [tool.mutmut] table") from None


# --------------------------------------------------------------------------------------------
# Running mutmut
# --------------------------------------------------------------------------------------------


def _thread_environment() -> dict:
    environment = dict(os.environ)
    for variable in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        environment.setdefault(variable, "1")  # as certify/__init__.py: one BLAS thread per mutant
    return environment


def run_mutmut(root: Path, max_children: int, fresh: bool, progress: Callable[[str], None], every_seconds: float = 30.0,
               only: list[str] = ()) -> dict:
    """Run `mutmut run` in root; returns the run record (wall seconds, children, mutants run).

    fresh=True starts from a new mutants/ tree; otherwise mutmut keeps the results it has and
    tests only the mutants without one (and those of functions that changed). only: mutant name
    patterns (fnmatch, e.g. 'reference_impl.adam.x_step*'); those are tested again, the others
    keep their results.
    """
    mutants = root / "mutants"
    if fresh and mutants.exists():
        shutil.rmtree(mutants)
    mutants.mkdir(exist_ok=True)
    before = result_snapshot(root)
    log_path = mutants / LOG_NAME
    command = [sys.executable, "-m", "mutmut", "run", "--max-children", str(max_children), *only]
    started = time.perf_counter()
    last_report = started
    tail = ""
    final = None
    with open(log_path, "wb") as log:
        process = subprocess.Popen(command, cwd=root, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=_thread_environment())
        while True:
            chunk = process.stdout.read1(65536) if hasattr(process.stdout, "read1") else process.stdout.read(4096)
            if not chunk:
                break
            log.write(chunk)
            tail = (tail + chunk.decode("utf-8", "replace"))[-4000:]
            final = progress_line(tail) or final
            now = time.perf_counter()
            if now - last_report >= every_seconds and final:
                last_report = now
                progress(f"{final} ({now - started:.0f} s)")
        returncode = process.wait()
    wall = time.perf_counter() - started
    if returncode != 0:
        last = [line.strip() for line in re.split(r"[\r\n]", tail) if line.strip()]
        raise MutationError(f"mutmut run exited with code {returncode} ({last[-1] if last else 'no output'}); its output is in {log_path}")
    after = result_snapshot(root)
    tested = sum(1 for name, result in after.items() if result[0] is not None and before.get(name) != result)
    record = {"wall_seconds": wall, "max_children": max_children, "mutants_tested": tested, "fresh": fresh, "only": list(only), "last_progress": final}
    (mutants / RUN_RECORD).write_text(json.dumps(record, indent=2), encoding="utf-8")
    return record


def result_snapshot(root: Path) -> dict[str, tuple]:
    """{mutant name: (exit code, duration)} from mutmut's .meta files under root/mutants."""
    snapshot = {}
    for meta in (root / "mutants").rglob("*.py.meta"):
        try:
            data = json.loads(meta.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            continue
        durations = data.get("durations_by_key", {})
        for name, exit_code in data.get("exit_code_by_key", {}).items():
            snapshot[name] = (exit_code, durations.get(name))
    return snapshot


def progress_line(text: str) -> str | None:
    """'done/total: k killed, s survived, ...' from the last progress line of mutmut's output."""
    found = PROGRESS.findall(text)
    if not found:
        return None
    done, total, killed, no_tests, timeout, suspicious, survived = (int(x) for x in found[-1])
    return f"{done}/{total} mutants: {killed} killed, {survived} survived, {timeout} timeout, {suspicious} suspicious, {no_tests} without tests"


# --------------------------------------------------------------------------------------------
# Reading the results
# --------------------------------------------------------------------------------------------


@contextlib.contextmanager
def _inside(root: Path):
    previous = Path.cwd()
    os.chdir(root)
    try:
        yield
    finally:
        os.chdir(previous)


def split_mutant_name(name: str) -> tuple[str, str, int]:
    """'reference_impl.adam.xǁStiefelAdamConfigǁ__post_init____mutmut_3' ->
    ('reference_impl.adam', 'StiefelAdamConfig.__post_init__', 3)."""
    mangled, _, number = name.rpartition("__mutmut_")
    module, _, function = mangled.rpartition(".")
    if function.startswith("xǁ"):
        function = ".".join(part for part in function[2:].split("ǁ") if part)
    elif function.startswith("x_"):
        function = function[2:]
    return module, function, int(number) if number.isdigit() else -1


def diff_line(diff: str) -> tuple[str, str]:
    """(old, new): the removed and the added lines of a unified diff, stripped, joined by ' / '."""
    removed, added = [], []
    for line in diff.splitlines():
        if line.startswith(("---", "+++", "@@")):
            continue
        if line.startswith("-"):
            removed.append(line[1:].strip())
        elif line.startswith("+"):
            added.append(line[1:].strip())
    return " / ".join(removed), " / ".join(added)


def stable_key(path: str, function: str, old: str, new: str) -> str:
    return f"{path} | {function} | {old} -> {new}"


def read_results(root: Path) -> list[dict]:
    """Every mutant mutmut knows in root/mutants: name, file, function, status, diff (not killed)."""
    if not (root / "mutants").is_dir():
        raise MutationError(f"no mutation results in {root / 'mutants'} (run certify mutate without --report-only first)")
    with _inside(root):
        from mutmut.configuration import reset_config
        from mutmut.mutation.data import SourceFileMutationData
        from mutmut.mutation.diff_apply import get_diff_for_mutant
        from mutmut.stats import status_by_exit_code
        from mutmut.utils.file_utils import walk_mutatable_files

        reset_config()
        mutants = []
        for path in sorted(walk_mutatable_files()):
            data = SourceFileMutationData(path=path)
            data.load()
            for name, exit_code in data.exit_code_by_key.items():
                status = status_by_exit_code[exit_code]
                module, function, number = split_mutant_name(name)
                entry = {"name": name, "file": str(path), "function": function, "number": number, "status": status,
                         "seconds": data.durations_by_key.get(name)}
                if status not in ("killed", NOT_TESTED):
                    entry["old"], entry["new"] = diff_line(get_diff_for_mutant(name, path=path))
                mutants.append(entry)
    mutants.sort(key=lambda m: (m["file"], m["function"], m["number"]))
    return mutants


def kill_suite_seconds(root: Path) -> dict[str, float]:
    """Duration of each kill-suite test in mutmut's stats run (the one run every fork starts from)."""
    try:
        stats = json.loads((root / "mutants" / "mutmut-stats.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return {name.rpartition("[")[2].rstrip("]") or name: float(seconds) for name, seconds in stats.get("duration_by_test", {}).items()}


# --------------------------------------------------------------------------------------------
# Lines no certificate executes
# --------------------------------------------------------------------------------------------


def _function_spans(source: str) -> list[tuple[int, int, str]]:
    spans = []

    def visit(node, prefix):
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                spans.append((child.lineno, child.end_lineno, prefix + child.name))
                visit(child, prefix + child.name + ".")
            elif isinstance(child, ast.ClassDef):
                visit(child, prefix + child.name + ".")

    visit(ast.parse(source), "")
    return spans


def unexecuted_lines(root: Path, files: list[str]) -> dict[str, list[dict]]:
    """Statements inside functions of `files` that the kill suite never executes (coverage.py).

    Runs the kill suite once more, under coverage, on the code as it is (not mutated).
    """
    import coverage

    with tempfile.TemporaryDirectory(prefix="certify-mutate-") as scratch:
        data_file = str(Path(scratch) / "coverage")
        command = [sys.executable, "-m", "coverage", "run", f"--data-file={data_file}", "--include=reference_impl/*",
                   "-m", "pytest", "-q", "-p", "no:cacheprovider", "-m", "mutation", KILL_SUITE]
        finished = subprocess.run(command, cwd=root, capture_output=True, text=True, env=_thread_environment())
        if finished.returncode != 0:
            last = [line for line in (finished.stdout + finished.stderr).splitlines() if line.strip()]
            raise MutationError(f"the kill suite fails on the code as it is ({last[-1] if last else 'no output'}): fix that before measuring mutants")
        cov = coverage.Coverage(data_file=data_file)
        cov.load()
        missing_by_file = {}
        for name in files:
            path = root / name
            _, _, _, missing, _ = cov.analysis2(str(path))
            source = path.read_text(encoding="utf-8")
            lines = source.splitlines()
            spans = _function_spans(source)
            entries = []
            for line in sorted(missing):
                inside = [(start, end, function) for start, end, function in spans if start <= line <= end]
                if not inside:
                    continue  # module level: never mutated
                function = max(inside)[2]  # the innermost (latest-starting) function
                entries.append({"line": line, "function": function, "text": lines[line - 1].strip()})
            missing_by_file[name] = entries
    return missing_by_file


# --------------------------------------------------------------------------------------------
# Classification and the report data
# --------------------------------------------------------------------------------------------


def load_classifications(path: Path = EQUIVALENT_FILE) -> dict[str, dict]:
    """The committed reasons: {key: {"class": ..., "reason": ...}} (see the module docstring)."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return {}
    except ValueError as error:
        raise MutationError(f"{path}: not valid JSON ({error})") from None
    entries = data.get("mutants", {})
    for key, entry in entries.items():
        if entry.get("class") not in CLASSES or not entry.get("reason"):
            raise MutationError(f"{path}: entry {key!r} needs a class ({', '.join(CLASSES)}) and a reason")
    return entries


def classify(mutants: list[dict], classifications: dict[str, dict]) -> None:
    """Attach key, class and reason to every mutant that was not killed (in place).

    A repeated identical change within one function gets '#2', '#3', ... on its key, so that two
    mutants never share a reason by accident.
    """
    seen: Counter = Counter()
    for mutant in mutants:
        if mutant["status"] in ("killed", NOT_TESTED):
            continue
        key = stable_key(mutant["file"], mutant["function"], mutant["old"], mutant["new"])
        seen[key] += 1
        if seen[key] > 1:
            key = f"{key} #{seen[key]}"
        mutant["key"] = key
        entry = classifications.get(key) or classifications.get(f"{mutant['file']} | {mutant['function']} | *")
        if entry:
            mutant["class"], mutant["reason"] = entry["class"], entry["reason"]
        elif mutant["status"] == "timeout":
            mutant["class"], mutant["reason"] = "detected", TIMEOUT_REASON
        else:
            mutant["class"], mutant["reason"] = "unclassified", ""


def _counts(mutants: list[dict]) -> dict:
    """Counts by status; total and score cover the tested mutants ("not tested" is apart)."""
    tested = [m for m in mutants if m["status"] != NOT_TESTED]
    statuses = Counter(m["status"] if m["status"] in COUNTED else "other" for m in tested)
    counts = {status: statuses.get(status, 0) for status in COUNTED + ("other",)}
    counts["total"] = len(tested)
    counts["score"] = counts["killed"] / len(tested) if tested else None
    counts["not_tested"] = len(mutants) - len(tested)
    return counts


def _median(values: list[float]) -> float | None:
    values = sorted(v for v in values if v is not None)
    if not values:
        return None
    middle = len(values) // 2
    return values[middle] if len(values) % 2 else (values[middle - 1] + values[middle]) / 2


def summarize(mutants: list[dict], *, settings: dict, run_record: dict | None, suite_seconds: dict[str, float],
              unexecuted: dict[str, list[dict]], command: str) -> dict:
    """The content of mutation.json."""
    files = sorted({m["file"] for m in mutants} | set(unexecuted))
    survivors = [m for m in mutants if m["status"] not in ("killed", NOT_TESTED)]
    classes = Counter(m["class"] for m in survivors)
    timing = dict(run_record or {})
    tested = timing.get("mutants_tested")
    if timing.get("wall_seconds") and tested:
        timing["seconds_per_mutant"] = timing["wall_seconds"] / tested
    timing["kill_suite_seconds"] = suite_seconds
    timing["median_seconds_killed"] = _median([m["seconds"] for m in mutants if m["status"] == "killed"])
    timing["median_seconds_survived"] = _median([m["seconds"] for m in mutants if m["status"] == "survived"])
    return {
        "kind": REPORT_KIND,
        "tool": f"mutmut {MUTMUT_VERSION}",
        "command": command,
        "written": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "scope": {
            "mutated": files,
            "not_mutated": NOT_MUTATED,
            "only_executed_lines": bool(settings.get("mutate_only_covered_lines", False)),
            "kill_suite": KILL_SUITE,
        },
        "settings": {key: settings[key] for key in ("timeout_multiplier", "timeout_constant") if key in settings},
        "timing": timing,
        "totals": _counts(mutants),
        "modules": {name: _counts([m for m in mutants if m["file"] == name]) for name in files},
        "survivor_classes": {name: classes.get(name, 0) for name in CLASSES + ("detected", "unclassified")},
        "survivors": [{key: m.get(key) for key in ("name", "file", "function", "status", "old", "new", "key", "class", "reason")} for m in survivors],
        "unexecuted_lines": unexecuted,
    }


# --------------------------------------------------------------------------------------------
# MUTATION.md
# --------------------------------------------------------------------------------------------


def _cell(text) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


def _code(text: str) -> str:
    text = str(text).replace("`", "'")
    return f"`{text}`" if text else "(nothing)"


def _table(header: list[str], rows: list[list]) -> list[str]:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    return lines + ["| " + " | ".join(_cell(value) for value in row) + " |" for row in rows]


def _percent(score) -> str:
    return "-" if score is None or (isinstance(score, float) and math.isnan(score)) else f"{100 * score:.1f}%"


def _opening_lines(summary: dict) -> list[str]:
    """The title, the score and the scope of the mutation run."""
    totals = summary["totals"]
    lines = [
        f"Written {summary['written']} by `{summary['command']}` ({summary['tool']}).",
        "",
        f"**Score: {totals['killed']} killed of {totals['total']} mutants = {_percent(totals['score'])}** "
        f"({totals['survived']} survived, {totals['timeout']} timeout, {totals['suspicious']} suspicious, {totals['other']} other"
        f" such as 'no tests': no certificate calls the function).",
        "",
    ]
    if totals.get("not_tested"):
        lines += [
            f"**Incomplete: {totals['not_tested']} mutants were not tested** (an interrupted run); the score covers the "
            f"{totals['total']} tested. `certify mutate --resume` tests the rest.",
            "",
        ]
    lines += [
        "A mutant is one small change to reference_impl (an operator, a constant, an argument). It is "
        f"killed when some certificate (P1..P6, the samplers) of the kill suite `{summary['scope']['kill_suite']}` (every claim at a "
        "small profile) does not pass or raises. Not mutated: "
        + "; ".join(f"`{name}` ({why})" for name, why in summary["scope"]["not_mutated"].items())
        + "; module-level constants (mutmut mutates function bodies only)."
        + (" Only lines that the kill suite executes are mutated; the others are listed at the end." if summary["scope"]["only_executed_lines"] else ""),
        "",
    ]
    return lines


def _module_lines(summary: dict) -> list[str]:
    """## Per module: the counts of each mutated module and of all together."""
    totals = summary["totals"]
    header = ["module", "killed", "survived", "timeout", "suspicious", "other", "total", "score"]
    incomplete = bool(totals.get("not_tested"))
    if incomplete:
        header.append("not tested")

    def row(name, c):
        cells = [name, c["killed"], c["survived"], c["timeout"], c["suspicious"], c["other"], c["total"], _percent(c["score"])]
        return cells + [c.get("not_tested", 0)] if incomplete else cells

    rows = [row(name, c) for name, c in summary["modules"].items()] + [row("**all**", totals)]
    return ["## Per module", ""] + _table(header, rows) + [""]


def _wall_time_line(timing: dict) -> str:
    """How many mutants were tested in what wall time, or why there is no timing."""
    if timing.get("wall_seconds") is None:
        return "No timing: the report was written from results of an earlier run."
    per = timing.get("seconds_per_mutant")
    return (
        f"{timing.get('mutants_tested', '?')} mutants tested in {timing['wall_seconds']:.0f} s wall with {timing.get('max_children', '?')} "
        f"parallel children" + (f" ({per:.2f} s per mutant)" if per else "")
        + ("" if timing.get("fresh", True) else "; results kept from an earlier run were not re-tested") + "."
    )


def _timing_lines(summary: dict) -> list[str]:
    """## Timing: the run's wall time, the medians per mutant, the kill suite and the per-mutant limit."""
    timing = summary["timing"]
    lines = ["## Timing", "", _wall_time_line(timing)]
    medians = [f"{timing[key]:.2f} s per {what} mutant" for key, what in (("median_seconds_killed", "killed"), ("median_seconds_survived", "surviving"))
               if timing.get(key) is not None]
    if medians:
        lines += ["", "Median wall time of one mutant's tests in its fork: " + ", ".join(medians)
                  + " (a survivor runs every certificate that reaches the mutated function; a kill stops at the first failing one)."]
    suite = timing.get("kill_suite_seconds") or {}
    if suite:
        lines += ["", "Kill suite, the one cold run every fork starts from (imports, first evaluation of the memoised symbolic and exact "
                  "tiers), s: " + ", ".join(f"{name} {seconds:.2f}" for name, seconds in sorted(suite.items())) + f"; {sum(suite.values()):.2f} in all."]
    settings = summary["settings"]
    if settings:
        lines += ["", f"Per-mutant limit: (estimated time of its tests + {settings.get('timeout_constant')} s) x {settings.get('timeout_multiplier')} wall, twice that in CPU time."]
    return lines + [""]


def _survivor_lines(summary: dict) -> list[str]:
    """## Mutants not killed: the count of each class, then one row per mutant, the gaps first."""
    classes = summary["survivor_classes"]
    lines = [
        "## Mutants not killed",
        "",
        f"{sum(classes.values())} in all: {classes['equivalent']} equivalent (compute the same thing), {classes['validation']} validation "
        f"(input checks: out of the certificates' scope, covered by tests/test_validation.py), {classes['control']} control (a broken "
        f"variant changed, still broken and detected), {classes['sampler']} sampler (a random input drawn differently, still valid), {classes['gap']} gap (the certificates miss a change in what is computed), "
        f"{classes.get('detected', 0)} detected by a timeout, {classes['unclassified']} unclassified.",
        "",
        "Reasons live in certify/mutation_equivalent.json, keyed by the `key` of the mutant in mutation.json "
        "(file | function | old line -> new line), so they survive a re-run.",
        "",
    ]
    order = {name: index for index, name in enumerate(("gap", "unclassified", "detected") + EXPLAINED)}
    survivors = sorted(summary["survivors"], key=lambda m: (order.get(m["class"], 9), m["file"], m["function"], m["name"]))
    rows = [[m["file"].removeprefix("reference_impl/"), m["function"], m["name"].rpartition("__mutmut_")[2], m["status"],
             f"{_code(m['old'])} -> {_code(m['new'])}", m["class"], m["reason"]] for m in survivors]
    if rows:
        lines += _table(["file", "function", "#", "status", "diff", "class", "reason"], rows) + [""]
    return lines


def _unexecuted_section(summary: dict) -> list[str]:
    """## Lines no certificate executes, grouped by file and function; nothing when there are none."""
    unexecuted = {name: entries for name, entries in summary["unexecuted_lines"].items() if entries}
    if not unexecuted:
        return []
    count = sum(len(entries) for entries in unexecuted.values())
    lines = [
        "## Lines no certificate executes",
        "",
        f"{count} statements inside functions of the mutated files never run in the kill suite: no mutant was made there, since "
        "no certificate could see one. Most are the raise branches of input checks; the others are paths that no certificate "
        "takes (an option or a helper the claims never use), which a certificate would have to exercise before a change there could count.",
        "",
    ]
    for name, entries in unexecuted.items():
        by_function: dict[str, list[dict]] = {}
        for entry in entries:
            by_function.setdefault(entry["function"], []).append(entry)
        for function, items in by_function.items():
            lines.append(f"- `{name}` {function}: " + "; ".join(f"L{item['line']} {_code(item['text'][:80])}" for item in items))
    return lines + [""]


def render_markdown(summary: dict) -> str:
    """The reference_impl section of MUTATION.md ("## reference_impl ...") from the summary of `summarize`."""
    lines = (_opening_lines(summary) + _module_lines(summary) + _timing_lines(summary)
             + _survivor_lines(summary) + _unexecuted_section(summary))
    lines = [line.replace("## ", "### ", 1) if line.startswith("## ") else line for line in lines]
    return "\n".join(["## reference_impl: the NumPy reference step", ""] + lines).rstrip() + "\n"


# The targets of MUTATION.md, in its order: (target, its JSON in the report folder, what is mutated)
TARGETS = (
    ("reference_impl", REPORT_JSON, "the NumPy reference step, every mutant; kill suite P1..P6 and the samplers"),
    ("torch_impl", "mutation-torch_impl.json", "the PyTorch optimizer, a seeded sample; kill suite crosscheck, optimizer, bookkeeping"),
    ("certifier", "mutation-certifier.json", "the certificates themselves, weakened (certify.weakening)"),
)


def target_row(target: str, data: dict) -> dict:
    """killed, survived (not killed), explained, gaps, equivalent, total of one target's JSON."""
    if target == "reference_impl":
        totals, classes = data["totals"], data["survivor_classes"]
        survivors = data.get("survivors", [])
        return {"killed": totals["killed"], "survived": totals["total"] - totals["killed"], "total": totals["total"],
                "explained": sum(1 for m in survivors if m.get("class") in EXPLAINED or m.get("status") == "timeout"),
                "gaps": classes.get("gap", 0), "equivalent": classes.get("equivalent", 0)}
    total, killed = data.get("total"), data.get("killed")
    survived = data.get("survived", None if total is None or killed is None else total - killed)
    explained = data.get("explained")
    if explained is None and "out_of_scope" in data:  # the certifier target: equivalent and out-of-scope weakenings
        explained = (data.get("equivalent") or 0) + (data.get("out_of_scope") or 0) + (data.get("timeout") or 0)
    return {"killed": killed, "survived": survived, "total": total, "explained": explained,
            "gaps": data.get("gaps"), "equivalent": data.get("equivalent", 0)}


def _score_cell(row: dict) -> str:
    killed, total, equivalent = row["killed"], row["total"], row["equivalent"] or 0
    if killed is None or not total or total - equivalent <= 0:
        return "-"
    return f"{killed} / ({total} - {equivalent}) = {_percent(killed / (total - equivalent))}"


def _missing(value) -> str:
    return "-" if value is None else str(value)


def render_page(out_dir: Path) -> str:
    """MUTATION.md from the targets' JSON files in out_dir: the score table, then one section per target."""
    out_dir = Path(out_dir)
    rows, sections = [], []
    for target, name, what in TARGETS:
        try:
            data = json.loads((out_dir / name).read_text(encoding="utf-8"))
        except FileNotFoundError:
            rows.append([target, "not run", "", "", "", f"`certify mutate --target {target}` writes {name}"])
            continue
        except (OSError, ValueError) as error:
            rows.append([target, f"{name} could not be read ({error.__class__.__name__})", "", "", "", ""])
            continue
        row = target_row(target, data)
        rows.append([target, _missing(row["killed"]), _missing(row["survived"]), _missing(row["explained"]), _missing(row["gaps"]), _score_cell(row)])
        sections.append(render_markdown(data) if target == "reference_impl" else str(data.get("markdown", f"## {target}\n")).rstrip() + "\n")
    lines = ["# Mutation score of the certifier", "",
             "Three targets, each with its own JSON in this folder: " + "; ".join(f"{target} ({what}; {name})" for target, name, what in TARGETS) + ". "
             "Survived counts every mutant not killed; not-killed-explained those of them with a reason that is no weakness of the "
             "certificates (equivalent, validation, control, sampler, or a timeout); gaps the changes no certificate notices. "
             "Score: killed / (total - equivalent).", ""]
    lines += _table(["target", "killed", "survived", "not-killed-explained", "gaps", "score over non-equivalent mutants"], rows) + [""]
    return "\n".join(lines) + "\n" + "\n".join(sections)


def write_json(summary: dict, out_dir: Path) -> Path:
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    json_path = out_dir / REPORT_JSON
    json_path.write_text(json.dumps(summary, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    return json_path


def write_page(out_dir: Path) -> Path:
    """Compose out_dir/MUTATION.md from the targets' JSON files present there."""
    md_path = Path(out_dir) / REPORT_MD
    md_path.write_text(render_page(out_dir), encoding="utf-8")
    return md_path


def write_reports(summary: dict, out_dir: Path) -> tuple[Path, Path]:
    """mutation.json of reference_impl, and MUTATION.md composed again with the other targets present."""
    json_path = write_json(summary, out_dir)
    return write_page(out_dir), json_path


# --------------------------------------------------------------------------------------------
# The command
# --------------------------------------------------------------------------------------------


def unexplained(summary: dict) -> list[dict]:
    """Mutants that survived (or are suspicious) without an equivalent/validation reason.

    A timeout is not among them: a change that makes the certificates run past the limit is
    noticed, though it is not counted as killed in the score.
    """
    return [m for m in summary["survivors"] if m["status"] != "timeout" and m["class"] not in EXPLAINED]


def mutate(*, max_children: int, resume: bool, report_only: bool, command: str,
           progress: Callable[[str], None], root: Path | None = None, only: list[str] = ()) -> dict:
    """Run mutmut over reference_impl (unless report_only); returns the summary for the reports.

    only: mutant name patterns to test (again); implies resume for all the others.
    """
    require_mutmut()
    root = project_root() if root is None else Path(root)
    settings = mutmut_settings(root)
    run_record = None
    if not report_only:
        progress(f"mutating reference_impl with mutmut {MUTMUT_VERSION}, {max_children} children; mutmut's output: {root / 'mutants' / LOG_NAME}")
        run_record = run_mutmut(root, max_children, fresh=not (resume or only), progress=progress, only=list(only))
    else:
        try:
            run_record = json.loads((root / "mutants" / RUN_RECORD).read_text(encoding="utf-8"))
        except (OSError, ValueError):
            run_record = None
    mutants = read_results(root)
    classify(mutants, load_classifications())
    files = sorted({m["file"] for m in mutants})
    progress("listing the lines that no certificate executes (the kill suite once more, under coverage)")
    unexecuted = unexecuted_lines(root, files)
    return summarize(mutants, settings=settings, run_record=run_record, suite_seconds=kill_suite_seconds(root), unexecuted=unexecuted, command=command)
