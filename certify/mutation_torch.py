"""`certify mutate --target torch_impl`: sampled mutants of the PyTorch optimizer.

The kill suite is the certificates that drive torch_impl, `crosscheck`, `optimizer` and
`bookkeeping` (tests/mutation/test_torch_certificates.py, at the small profile of the reference's
kill suite): a mutant is killed when any of their verdicts is not "pass" or a claim raises.

mutmut reads [tool.mutmut] from the pyproject.toml of its working directory, so the run happens
in a scratch copy of the project, SCRATCH under the checkout (ignored by git, as mutants/ is):
torch_impl (mutated), reference_impl and propositions (copied), tests/conftest.py and
tests/mutation, and a pyproject.toml whose [tool.mutmut] table is rewritten for torch_impl.
mutmut's mutants and its cache live in SCRATCH/mutants.

mutmut 3.8.1 leaves every decorated function alone but for @staticmethod and @classmethod
(decorators run at definition time). torch_impl decorates its step (`stiefel_adam_step`,
`StiefelAdam.step`) with @torch.no_grad() and its scalar helpers with @memoized; in the scratch
copy those decorators are applied by an assignment after the definition instead
(`f = torch.no_grad()(f)`), which is the same function at run time and lets mutmut mutate the
body. The kill suite empties the memos before each certificate. @property and its setters stay
decorated (mutmut cannot mutate them) and are listed in the report as not mutated.

mutmut generates every mutant (of the lines the kill suite executes); a seeded sample of them is
tested (numpy default_rng(SeedSequence(seed)), names drawn without replacement) and the sample's
score is given with its exact binomial (Clopper-Pearson) 95% interval.
"""

from __future__ import annotations

import ast
import datetime
import json
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable

from certify import mutation

TARGET = "torch_impl"
REPORT_JSON = "mutation-torch_impl.json"
REPORT_KIND = "mutation-report"
SCRATCH = "mutants-torch_impl"
KILL_SUITE = "tests/mutation/test_torch_certificates.py"
KILL_CLAIMS = ("crosscheck", "optimizer", "bookkeeping")
DEFAULT_SAMPLE = 200
DEFAULT_SEED = 0
RETEST_FACTOR = 4.0  # a mutant that timed out is tested once more with this many times the limit (a loaded machine is slow)
MOVED_FILE = "certify-moved-decorators.json"  # inside SCRATCH: the functions whose decorators prepare_scratch moved
SAMPLE_FILE = "certify-mutate-sample.json"  # inside SCRATCH/mutants: population, seed and the names drawn
MOVED_DECORATORS = ("memoized", "torch.no_grad()")
NOTES = (
    "The optimizer claim's controls write a bug into a copy of torch_impl.optimizer's source (propositions.kit.source_edits); in mutmut's "
    "tree a module holds every mutant of a function beside the original, so the kill suite hands them the unmutated source of the scratch "
    "copy (CERTIFY_MUTATION_ORIGINAL): a control stays a broken variant of the unmutated optimizer, while the certificates' real subject "
    "runs the mutant.",
    "torch runs on one thread in the kill suite, whatever a claim asks (torch.set_num_threads pinned): a torch thread team started in "
    "mutmut's fork hangs, and the cross-check's thread-sensitivity part (a measurement that only writes a note) asks for two threads; "
    "there it compares one thread with one thread. torch_impl's memos are emptied before each certificate, so that a mutant of a "
    "memoized helper is computed afresh.",
)
COPIED = ("torch_impl", "reference_impl", "propositions", "tests/conftest.py", "tests/mutation")


def scratch_settings(base: dict) -> dict:
    """The [tool.mutmut] table of the scratch copy: the reference's, retargeted at torch_impl."""
    settings = {key: base[key] for key in ("timeout_constant", "pytest_add_cli_args") if key in base}
    settings.update({
        # a survivor runs the three claims (about 15 s); past 3x that plus the constant, the mutant is a timeout
        "timeout_multiplier": 3.0,
        "source_paths": ["torch_impl"],
        "do_not_mutate": [],
        "also_copy": ["propositions", "reference_impl"],
        "pytest_add_cli_args_test_selection": [KILL_SUITE],
        "mutate_only_covered_lines": True,
        "use_git_change_detection": False,
        "process_isolation": "fork",
    })
    return settings


def _toml_value(value) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_toml_value(item) for item in value) + "]"
    return json.dumps(value)  # strings and numbers: JSON's spelling is TOML's


def scratch_pyproject(text: str, settings: dict) -> str:
    """pyproject.toml's text with its [tool.mutmut] table replaced by `settings`."""
    table = "[tool.mutmut]\n" + "".join(f"{key} = {_toml_value(value)}\n" for key, value in settings.items())
    pattern = re.compile(r"^\[tool\.mutmut\]\n(?:(?!^\[).*\n?)*", re.MULTILINE)
    if not pattern.search(text):
        return text.rstrip("\n") + "\n\n" + table
    return pattern.sub(lambda _: table, text, count=1)


def move_decorators(source: str) -> tuple[str, list[str]]:
    """The source with @memoized / @torch.no_grad() applied after each definition instead of above it.

    Only a function whose decorators are all of MOVED_DECORATORS is rewritten; returns the new
    text and the qualified names of the functions rewritten.
    """
    lines = source.splitlines(keepends=True)
    edits = []  # (first decorator line, def line, end line, indent, name, decorators), 1-based

    def visit(node, prefix):
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.ClassDef):
                visit(child, prefix + child.name + ".")
            elif isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                names = [ast.unparse(d) for d in child.decorator_list]
                if names and all(name in MOVED_DECORATORS for name in names):
                    indent = lines[child.lineno - 1][: child.col_offset]
                    edits.append((child.decorator_list[0].lineno, child.lineno, child.end_lineno, indent, prefix + child.name, names))

    visit(ast.parse(source), "")
    for first, def_line, end, indent, qualified, names in sorted(edits, reverse=True):
        name = qualified.rpartition(".")[2]
        applied = name
        for decorator in reversed(names):
            applied = f"{decorator}({applied})"
        lines[end:end] = [f"{indent}{name} = {applied}\n"]
        del lines[first - 1:def_line - 1]
    return "".join(lines), sorted(edit[4] for edit in edits)


def prepare_scratch(root: Path, scratch: Path, fresh: bool) -> list[str]:
    """Copy what the kill suite needs into scratch (mutants/ kept unless fresh); returns the
    functions whose decorators were moved."""
    if fresh and scratch.exists():
        shutil.rmtree(scratch)
    scratch.mkdir(parents=True, exist_ok=True)
    for name in COPIED:
        source, target = root / name, scratch / name
        if target.is_dir():
            shutil.rmtree(target)
        target.parent.mkdir(parents=True, exist_ok=True)
        if source.is_dir():
            shutil.copytree(source, target, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
        else:
            shutil.copy2(source, target)
    moved = []
    for path in sorted((scratch / "torch_impl").rglob("*.py")):
        text, names = move_decorators(path.read_text(encoding="utf-8"))
        if names:
            path.write_text(text, encoding="utf-8")
            moved += [f"{path.relative_to(scratch)}: {name}" for name in names]
    base = mutation.mutmut_settings(root)
    text = (root / "pyproject.toml").read_text(encoding="utf-8")
    (scratch / "pyproject.toml").write_text(scratch_pyproject(text, scratch_settings(base)), encoding="utf-8")
    (scratch / MOVED_FILE).write_text(json.dumps(moved, indent=1), encoding="utf-8")
    return moved


# --------------------------------------------------------------------------------------------
# The sample, and mutmut in the scratch copy
# --------------------------------------------------------------------------------------------


def draw_sample(population: list[str], size: int | None, seed: int) -> list[str]:
    """`size` names drawn without replacement from the sorted population (all for None)."""
    import numpy as np

    names = sorted(population)
    if size is None or size >= len(names):
        return names
    rng = np.random.default_rng(np.random.SeedSequence(seed))
    return sorted(names[i] for i in rng.choice(len(names), size=size, replace=False))


DRIVER = r'''
import json, sys
from os import makedirs
from pathlib import Path
import mutmut.__main__ as m

sample_path, max_children, RETEST = Path(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3])
record = json.loads(sample_path.read_text())
if record.get("names") is None:
    # generate every mutant (mutmut's own first phase), then draw the sample from them
    m.set_mutant_under_test("mutant_generation")
    makedirs("mutants", exist_ok=True)
    m.copy_src_dir(); m.copy_also_copy_files(); m.setup_source_paths(); m.store_lines_covered_by_tests()
    m.create_mutants(max_children)
    population = []
    for path in m.walk_mutatable_files():
        data = m.SourceFileMutationData(path=path); data.load(); population += list(data.exit_code_by_key)
    from certify.mutation_torch import draw_sample
    record.update(population=len(population), names=draw_sample(population, record["size"], record["seed"]))
    sample_path.write_text(json.dumps(record, indent=1))
    print(f"population {len(population)}, sample {len(record['names'])}", flush=True)

def tests_for_mutant_names(names):
    # mutmut's own raises KeyError for a function no test reached; such a mutant is 'no tests'
    found = set()
    for name in names:
        found |= set(m.state().tests_by_mangled_function_name.get(m.mangled_name_from_mutant_name(name), set()))
    return found

m.tests_for_mutant_names = tests_for_mutant_names

def results():
    found = {}
    for path in m.walk_mutatable_files():
        data = m.SourceFileMutationData(path=path); data.load(); found.update(data.exit_code_by_key)
    return found

todo = [name for name in record["names"] if results().get(name) is None]  # a resumed run tests what has no result
print(f"testing {len(todo)} of the {len(record['names'])} mutants drawn", flush=True)
if todo:
    m._run(todo, max_children)
# a timeout may be a slow machine rather than a slow mutant: each is tested once more, with RETEST times the limit
found = results()
timeouts = [name for name in record["names"] if m.status_by_exit_code.get(found.get(name)) == "timeout" and name not in record.get("retested", [])]
if timeouts:
    print(f"testing again {len(timeouts)} mutants that timed out, with {RETEST} times the limit", flush=True)
    m.config().timeout_multiplier *= RETEST
    m._run(timeouts, max_children)
    record["retested"] = sorted(set(record.get("retested", [])) | set(timeouts))
    sample_path.write_text(json.dumps(record, indent=1))
'''


def run_sample(scratch: Path, *, sample: int | None, seed: int, max_children: int, fresh: bool,
               progress: Callable[[str], None]) -> dict:
    """Generate the mutants, draw the sample (unless one is recorded) and test it; the run record."""
    mutants = scratch / "mutants"
    mutants.mkdir(exist_ok=True)
    sample_path = mutants / SAMPLE_FILE
    if fresh or not sample_path.exists():
        sample_path.write_text(json.dumps({"size": sample, "seed": seed, "names": None}), encoding="utf-8")
    command = [sys.executable, "-c", DRIVER, str(sample_path), str(max_children), str(RETEST_FACTOR)]
    environment = dict(mutation._thread_environment(), CERTIFY_MUTATION_ORIGINAL=str(scratch))  # the kill suite's unmutated sources
    earlier = {}
    if not fresh:
        try:
            earlier = json.loads((mutants / mutation.RUN_RECORD).read_text(encoding="utf-8"))
        except (OSError, ValueError):
            earlier = {}
    record = _stream(command, scratch, mutants / mutation.LOG_NAME, progress, environment, append=not fresh)
    record.update(max_children=max_children, fresh=fresh)
    if earlier.get("wall_seconds") is not None:  # a resumed run: the wall time of every part of it
        record["earlier_wall_seconds"] = earlier["wall_seconds"] + earlier.get("earlier_wall_seconds", 0.0)
    (mutants / mutation.RUN_RECORD).write_text(json.dumps(record, indent=2), encoding="utf-8")
    return record


def _stream(command: list[str], cwd: Path, log_path: Path, progress: Callable[[str], None], environment: dict,
            append: bool = False, every_seconds: float = 30.0) -> dict:
    """Run command in cwd, its output to log_path, mutmut's progress line every_seconds."""
    started = last = time.perf_counter()
    tail, final = "", None
    with open(log_path, "ab" if append else "wb") as log:
        process = subprocess.Popen(command, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=environment)
        while chunk := process.stdout.read1(65536):
            log.write(chunk)
            log.flush()
            text = chunk.decode("utf-8", "replace")
            for line in re.findall(r"population \d+, sample \d+|testing \d+ of the \d+ mutants drawn|testing again \d+ mutants that timed out[^\n]*", text):
                progress(line)
            tail = (tail + text)[-4000:]
            final = mutation.progress_line(tail) or final
            if time.perf_counter() - last >= every_seconds and final:
                last = time.perf_counter()
                progress(f"{final} ({last - started:.0f} s)")
        returncode = process.wait()
    wall = time.perf_counter() - started
    if returncode != 0:
        lines = [line.strip() for line in re.split(r"[\r\n]", tail) if line.strip()]
        raise mutation.MutationError(f"mutmut exited with code {returncode} ({lines[-1] if lines else 'no output'}); its output is in {log_path}")
    return {"wall_seconds": wall, "last_progress": final}


# --------------------------------------------------------------------------------------------
# The summary and its section of MUTATION.md
# --------------------------------------------------------------------------------------------


def binomial_interval(killed: int, total: int, level: float = 0.95) -> tuple[float, float] | None:
    """Exact (Clopper-Pearson) interval of a proportion killed / total; None for total 0."""
    if total <= 0:
        return None
    from scipy.stats import beta

    alpha = 1 - level
    lower = 0.0 if killed == 0 else float(beta.ppf(alpha / 2, killed, total - killed + 1))
    upper = 1.0 if killed == total else float(beta.ppf(1 - alpha / 2, killed + 1, total - killed))
    return lower, upper


def headline(killed: int, total: int, equivalent: int) -> dict:
    """The sample's scores: over all tested mutants and over the non-equivalent ones, with intervals."""
    relevant = total - equivalent
    return {
        "score": killed / total if total else None,
        "score_interval": binomial_interval(killed, total),
        "score_non_equivalent": killed / relevant if relevant > 0 else None,
        "score_non_equivalent_interval": binomial_interval(killed, relevant),
    }


def summarize(mutants: list[dict], sample_record: dict, *, run_record: dict | None, settings: dict, moved: list[str],
              suite_seconds: dict[str, float], command: str) -> dict:
    """The content of mutation-torch_impl.json from the sampled mutants' results."""
    drawn = set(sample_record.get("names") or ())
    tested = [m for m in mutants if m["name"] in drawn]
    base = mutation.summarize(tested, settings=settings, run_record=run_record, suite_seconds=suite_seconds, unexecuted={}, command=command)
    totals, classes = base["totals"], base["survivor_classes"]
    summary = {
        "kind": REPORT_KIND,
        "target": TARGET,
        "tool": base["tool"],
        "command": command,
        "written": base["written"],
        "scope": {"mutated": base["scope"]["mutated"], "kill_suite": KILL_SUITE, "claims": list(KILL_CLAIMS),
                  "only_executed_lines": True, "decorators_moved": moved, "notes": list(NOTES),
                  "not_mutated": "functions decorated with @property or its setters (mutmut 3.8.1 mutates no decorated function but "
                                 "@staticmethod/@classmethod ones); module-level constants; lines the kill suite does not execute"},
        "sample": {"population": sample_record.get("population"), "size": len(drawn), "seed": sample_record.get("seed"),
                   "timeouts_retested": len(sample_record.get("retested", [])), "retest_factor": RETEST_FACTOR,
                   "population_now": len(mutants), "drawn_but_gone": len(drawn - {m["name"] for m in mutants}),
                   "method": "numpy default_rng(SeedSequence(seed)).choice over the sorted mutant names, without replacement"},
        "settings": base["settings"],
        "timing": base["timing"],
        "totals": totals,
        "modules": base["modules"],
        "survivor_classes": classes,
        "survivors": base["survivors"],
        "killed": totals["killed"],
        "survived": totals["total"] - totals["killed"],
        "total": totals["total"],
        "equivalent": classes["equivalent"],
        "explained": sum(classes.get(name, 0) for name in mutation.EXPLAINED + ("detected",)),  # a timeout is noticed
        "gaps": classes["gap"],
        "unclassified": classes["unclassified"],
    }
    summary.update(headline(totals["killed"], totals["total"], classes["equivalent"]))
    return summary


def _interval(pair) -> str:
    return "-" if not pair else f"{100 * pair[0]:.1f}% to {100 * pair[1]:.1f}%"


def render_section(summary: dict) -> str:
    """The torch_impl section of MUTATION.md ("## torch_impl ...")."""
    totals, sample, classes = summary["totals"], summary["sample"], summary["survivor_classes"]
    relevant = summary["total"] - summary["equivalent"]
    lines = [
        "## torch_impl: the PyTorch optimizer (sampled)",
        "",
        f"Written {summary['written']} by `{summary['command']}` ({summary['tool']}).",
        "",
        f"**Sample score: {summary['killed']} killed of {summary['total']} = {mutation._percent(summary['score'])}** "
        f"(95% interval {_interval(summary['score_interval'])}); over the non-equivalent mutants {summary['killed']} / "
        f"({summary['total']} - {summary['equivalent']}) = {summary['killed']} / {relevant} = {mutation._percent(summary['score_non_equivalent'])} "
        f"(95% interval {_interval(summary['score_non_equivalent_interval'])}). {totals['survived']} survived, {totals['timeout']} timeout, "
        f"{totals['suspicious']} suspicious, {totals['other']} other.",
        "",
        f"Sample: {sample['size']} of a population of {sample['population']} mutants, seed {sample['seed']} ({sample['method']}); "
        "the intervals are exact binomial (Clopper-Pearson) intervals of the population's score, from the sample."
        + (f" {sample['timeouts_retested']} mutants that ran past the per-mutant limit were tested once more with {sample['retest_factor']:g} "
           "times the limit (a loaded machine is slow); their second result stands." if sample.get("timeouts_retested") else ""),
        "",
        f"A mutant is one small change to torch_impl. It is killed when one of the certificates {', '.join(summary['scope']['claims'])} "
        f"(kill suite `{summary['scope']['kill_suite']}`, every claim at a small profile) does not pass or raises. Only lines that the "
        f"kill suite executes are mutated. Not mutated: {summary['scope']['not_mutated']}.",
    ]
    if sample.get("drawn_but_gone"):
        lines += ["", f"**{sample['drawn_but_gone']} of the {sample['size']} mutants drawn no longer exist**: mutmut generated the mutants "
                  f"again when the run was resumed and now makes {sample['population_now']} (it mutates only the lines the kill suite "
                  "executes, and the kill suite changed in between); the scores cover the drawn mutants that remain."]
    if totals.get("not_tested"):
        lines += ["", f"**Incomplete: {totals['not_tested']} mutants of the sample were not tested** (an interrupted run); the scores cover "
                  f"the {totals['total']} tested. `certify mutate --target torch_impl --resume` tests the rest."]
    if summary["scope"]["decorators_moved"]:
        lines += ["", "mutmut cannot mutate a decorated function; in the scratch copy the decorators @torch.no_grad() and @memoized are "
                  "applied by an assignment after the definition instead (the same function at run time), so these are mutated too: "
                  + ", ".join(f"`{name}`" for name in summary["scope"]["decorators_moved"]) + "."]
    lines += [""] + [note + "\n" for note in summary["scope"].get("notes", ())]
    lines += [line.replace("## ", "### ", 1) if line.startswith("## ") else line for line in mutation._module_lines(summary)]
    lines += [line.replace("## ", "### ", 1) if line.startswith("## ") else line for line in mutation._timing_lines(summary)]
    earlier = summary["timing"].get("earlier_wall_seconds")
    if earlier is not None and summary["timing"].get("wall_seconds") is not None:
        lines += [f"The run was resumed: its earlier part took {earlier:.0f} s wall, the last {summary['timing']['wall_seconds']:.0f} s; "
                  f"{earlier + summary['timing']['wall_seconds']:.0f} s in all.", ""]
    lines += _survivor_lines(summary, classes)
    return "\n".join(lines).rstrip() + "\n"


def _survivor_lines(summary: dict, classes: dict) -> list[str]:
    lines = ["### Mutants not killed", "",
             f"{sum(classes.values())} in all: {classes['equivalent']} equivalent (compute the same thing), {classes['validation']} validation "
             f"(input checks, out of the certificates' scope), {classes['gap']} gap (the certificates miss a change in what is computed; the "
             f"reason says what a certificate would need to kill it), {classes.get('detected', 0)} detected by a timeout, "
             f"{classes['unclassified']} unclassified. Reasons: certify/mutation_equivalent.json.", ""]
    order = {name: index for index, name in enumerate(("gap", "unclassified", "detected") + mutation.EXPLAINED)}
    survivors = sorted(summary["survivors"], key=lambda m: (order.get(m["class"], 9), m["file"], m["function"], m["name"]))
    rows = [[m["file"].removeprefix("torch_impl/"), m["function"], m["name"].rpartition("__mutmut_")[2], m["status"],
             f"{mutation._code(m['old'])} -> {mutation._code(m['new'])}", m["class"], m["reason"]] for m in survivors]
    if rows:
        lines += mutation._table(["file", "function", "#", "status", "diff", "class", "reason"], rows) + [""]
    return lines


def write_report(summary: dict, out_dir: Path) -> Path:
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    stored = dict(summary, markdown=render_section(summary))
    path = out_dir / REPORT_JSON
    path.write_text(json.dumps(stored, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    return path


# --------------------------------------------------------------------------------------------
# The command
# --------------------------------------------------------------------------------------------


def mutate(*, sample: int | None, seed: int, max_children: int, resume: bool, report_only: bool, command: str,
           progress: Callable[[str], None], root: Path | None = None) -> dict:
    """Run the sampled mutants of torch_impl in the scratch copy (unless report_only); the summary."""
    mutation.require_mutmut()
    root = mutation.project_root() if root is None else Path(root)
    scratch = root / SCRATCH
    run_record = None
    if report_only:
        moved = prepare_moved_names(scratch)
        try:
            run_record = json.loads((scratch / "mutants" / mutation.RUN_RECORD).read_text(encoding="utf-8"))
        except (OSError, ValueError):
            run_record = None
    else:
        moved = prepare_scratch(root, scratch, fresh=not resume)
        progress(f"mutating torch_impl with mutmut {mutation.MUTMUT_VERSION} in {scratch}, {max_children} children, a sample of "
                 f"{sample if sample is not None else 'all'} (seed {seed}); mutmut's output: {scratch / 'mutants' / mutation.LOG_NAME}")
        run_record = run_sample(scratch, sample=sample, seed=seed, max_children=max_children, fresh=not resume, progress=progress)
    try:
        sample_record = json.loads((scratch / "mutants" / SAMPLE_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        raise mutation.MutationError(f"no sampled mutation run in {scratch} (run certify mutate --target torch_impl without --report-only first)") from None
    mutants = mutation.read_results(scratch)
    mutation.classify(mutants, mutation.load_classifications())
    if run_record is not None:
        run_record["mutants_tested"] = sum(1 for m in mutants if m["name"] in set(sample_record["names"]) and m["status"] != mutation.NOT_TESTED)
    settings = mutation.mutmut_settings(scratch)
    return summarize(mutants, sample_record, run_record=run_record, settings=settings, moved=moved,
                     suite_seconds=mutation.kill_suite_seconds(scratch), command=command)


def prepare_moved_names(scratch: Path) -> list[str]:
    """The functions whose decorators the scratch copy moved, as prepare_scratch recorded them (for --report-only)."""
    try:
        return json.loads((scratch / MOVED_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return []
