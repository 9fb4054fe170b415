"""`certify mutate`: the report built from mutation results, its section in REPORT.md, the command line.

These run without mutmut: the results are a small fake, shaped as certify.mutation.read_results
returns them.
"""

from __future__ import annotations

import json

import pytest

from certify import cli, mutation, report


def _mutant(file, function, number, status, old=None, new=None):
    entry = {"name": f"{file[:-3].replace('/', '.')}.x_{function}__mutmut_{number}", "file": file, "function": function,
             "number": number, "status": status, "seconds": 1.0}
    if status != "killed":
        entry["old"], entry["new"] = old, new
    return entry


FAKE = [
    _mutant("reference_impl/adam.py", "frobenius", 1, "killed"),
    _mutant("reference_impl/adam.py", "frobenius", 2, "killed"),
    _mutant("reference_impl/adam.py", "clip_to_trust_region", 3, "survived", "if math.isinf(trust_radius):", "if math.isinf(None):"),
    _mutant("reference_impl/adam.py", "clip_to_trust_region", 4, "timeout", "norm = frobenius(xi)", "norm = None"),
    _mutant("reference_impl/_validation.py", "check_real", 1, "survived", 'raise ValueError(f"{name} must be")', 'raise ValueError(f"XX{name} must beXX")'),
    _mutant("reference_impl/_validation.py", "check_real", 2, "killed"),
    _mutant("reference_impl/manifold.py", "sym", 1, "suspicious", "return 0.5 * (A + _transpose(A))", "return 0.5 * (A - _transpose(A))"),
]
REASONS = {
    "reference_impl/adam.py | clip_to_trust_region | if math.isinf(trust_radius): -> if math.isinf(None):":
        {"class": "equivalent", "reason": "the finite branch gives the same factor 1 when Delta = inf"},
    "reference_impl/_validation.py | check_real | *": {"class": "validation", "reason": "input validation"},
}


def _summary(tmp_path):
    mutants = [dict(m) for m in FAKE]
    mutation.classify(mutants, REASONS)
    unexecuted = {"reference_impl/_validation.py": [{"line": 12, "function": "check_real", "text": "raise ValueError(...)"}]}
    return mutation.summarize(mutants, settings={"timeout_multiplier": 5.0, "timeout_constant": 5.0, "mutate_only_covered_lines": True},
                              run_record={"wall_seconds": 70.0, "max_children": 2, "mutants_tested": 7, "fresh": True},
                              suite_seconds={"P1": 0.5, "P2": 1.5}, unexecuted=unexecuted, command="certify mutate --out x")


def test_the_summary_counts_per_module_and_scores_killed_over_total(tmp_path):
    summary = _summary(tmp_path)
    assert summary["totals"] == {"killed": 3, "survived": 2, "timeout": 1, "suspicious": 1, "other": 0, "total": 7, "score": 3 / 7, "not_tested": 0}
    assert summary["modules"]["reference_impl/adam.py"]["killed"] == 2 and summary["modules"]["reference_impl/adam.py"]["total"] == 4
    assert summary["modules"]["reference_impl/manifold.py"]["suspicious"] == 1
    assert summary["survivor_classes"] == {"equivalent": 1, "validation": 1, "control": 0, "sampler": 0, "gap": 0, "detected": 1, "unclassified": 1}
    assert summary["timing"]["seconds_per_mutant"] == pytest.approx(10.0)
    # the unexplained survivor (suspicious sym) makes the command exit 1; the timeout does not
    assert [m["function"] for m in mutation.unexplained(summary)] == ["sym"]


def test_the_markdown_report_has_the_module_table_and_every_survivor_with_its_reason(tmp_path):
    md_path, json_path = mutation.write_reports(_summary(tmp_path), tmp_path)
    text = md_path.read_text(encoding="utf-8")
    assert "**Score: 3 killed of 7 mutants = 42.9%**" in text
    assert "| reference_impl/adam.py | 2 | 1 | 1 | 0 | 0 | 4 | 50.0% |" in text
    assert "| **all** | 3 | 2 | 1 | 1 | 0 | 7 | 42.9% |" in text
    row = next(line for line in text.splitlines() if "clip_to_trust_region | 3 |" in line)
    assert "`if math.isinf(trust_radius):` -> `if math.isinf(None):`" in row and "equivalent" in row and "factor 1" in row
    assert "| manifold.py | sym | 1 | suspicious |" in text and "unclassified" in text
    assert next(line for line in text.splitlines() if "clip_to_trust_region | 4 |" in line).split(" | ")[5] == "detected"
    assert "L12 `raise ValueError(...)`" in text
    written = json.loads(json_path.read_text(encoding="utf-8"))
    assert written["totals"]["killed"] == 3 and written["kind"] == "mutation-report"


def test_report_md_shows_the_mutation_score_only_when_mutation_json_exists(tmp_path):
    path, _ = report.write_report([], tmp_path)
    assert "Mutation score" not in path.read_text(encoding="utf-8")
    mutation.write_reports(_summary(tmp_path), tmp_path)
    path, _ = report.write_report([], tmp_path)
    text = path.read_text(encoding="utf-8")
    assert "## Mutation score" in text and "3 of 7 tested mutants of reference_impl make some certificate fail: score 42.9%" in text
    (tmp_path / "mutation.json").write_text("{", encoding="utf-8")
    path, _ = report.write_report([], tmp_path)
    assert "mutation.json could not be read" in path.read_text(encoding="utf-8")


def test_repeated_identical_changes_get_distinct_keys():
    twins = [_mutant("reference_impl/adam.py", "f", 1, "survived", "a + b", "a - b"), _mutant("reference_impl/adam.py", "f", 2, "survived", "a + b", "a - b")]
    mutation.classify(twins, {"reference_impl/adam.py | f | a + b -> a - b": {"class": "gap", "reason": "first only"}})
    assert [m["key"].endswith("#2") for m in twins] == [False, True]
    assert [m["class"] for m in twins] == ["gap", "unclassified"]


def test_mutant_names_and_diffs_are_read_as_mutmut_writes_them():
    assert mutation.split_mutant_name("reference_impl.adam.xǁStiefelAdamConfigǁ__post_init____mutmut_3") == ("reference_impl.adam", "StiefelAdamConfig.__post_init__", 3)
    assert mutation.split_mutant_name("reference_impl.manifold.x__transpose__mutmut_12") == ("reference_impl.manifold", "_transpose", 12)
    diff = "--- a.py\n+++ a.py\n@@ -1,3 +1,3 @@\n def f(x):\n-    return x + 1\n+    return x - 1\n"
    assert mutation.diff_line(diff) == ("return x + 1", "return x - 1")
    assert mutation.progress_line("⠋ 12/886  🎉 9 🫥 1  ⏰ 0  🤔 0  🙁 2  🔇 0  🧙 0") == "12/886 mutants: 9 killed, 2 survived, 0 timeout, 0 suspicious, 1 without tests"


def test_the_committed_reasons_are_well_formed():
    entries = mutation.load_classifications()
    assert all(entry["class"] in mutation.CLASSES and entry["reason"] for entry in entries.values())
    assert all(key.count(" | ") >= 2 and key.startswith(("reference_impl/", "torch_impl/")) for key in entries)


def test_a_reason_without_a_class_is_refused(tmp_path):
    path = tmp_path / "reasons.json"
    path.write_text(json.dumps({"mutants": {"reference_impl/adam.py | f | a -> b": {"reason": "no class"}}}), encoding="utf-8")
    with pytest.raises(mutation.MutationError, match="needs a class"):
        mutation.load_classifications(path)


def test_certify_mutate_help_works(capsys):
    assert cli.main(["mutate", "--help"]) == 0
    text = capsys.readouterr().out
    assert "--max-children" in text and "--report-only" in text and "MUTATION.md" in text


def test_certify_mutate_without_mutmut_is_a_usage_error(tmp_path, monkeypatch, capsys):
    def missing(name):
        raise mutation.importlib.metadata.PackageNotFoundError(name)

    monkeypatch.setattr(mutation.importlib.metadata, "version", missing)
    assert cli.main(["mutate", "--report-only", "--out", str(tmp_path)]) == 2
    error = capsys.readouterr().err.strip()
    assert error.startswith("certify: error: certify mutate needs mutmut") and "\n" not in error


def test_certify_mutate_rejects_a_bad_child_count_and_contradictory_options(capsys):
    assert cli.main(["mutate", "--max-children", "0"]) == 2
    assert "positive integer" in capsys.readouterr().err
    assert cli.main(["mutate", "--report-only", "--only", "reference_impl.adam.*"]) == 2
    assert "give one of them" in capsys.readouterr().err


def test_run_mutmut_passes_the_options_logs_the_output_and_reports_progress(tmp_path, monkeypatch):
    seen = {}
    output = "Running mutation testing\r⠋ 1/3  🎉 1 🫥 0  ⏰ 0  🤔 0  🙁 0  🔇 0  🧙 0\r⠙ 3/3  🎉 2 🫥 0  ⏰ 0  🤔 0  🙁 1  🔇 0  🧙 0\n".encode()

    class FakeProcess:
        def __init__(self, command, cwd, stdout, stderr, env):
            seen.update(command=command, cwd=cwd, threads=env["OMP_NUM_THREADS"])
            meta = cwd / "mutants" / "reference_impl" / "adam.py.meta"
            meta.parent.mkdir(parents=True, exist_ok=True)
            codes = {"a__mutmut_1": 1, "a__mutmut_2": 1, "a__mutmut_3": 0, "a__mutmut_4": None}
            meta.write_text(json.dumps({"exit_code_by_key": codes, "durations_by_key": {name: 1.5 for name in codes if codes[name] is not None}}))
            import io

            self.stdout = io.BufferedReader(io.BytesIO(output))

        def wait(self):
            return seen.get("returncode", 0)

    monkeypatch.setattr(mutation.subprocess, "Popen", FakeProcess)
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    lines = []
    record = mutation.run_mutmut(tmp_path, 3, fresh=True, progress=lines.append, every_seconds=0.0, only=["reference_impl.adam.x_step*"])
    assert seen["command"][-4:] == ["run", "--max-children", "3", "reference_impl.adam.x_step*"] and seen["cwd"] == tmp_path
    assert seen["threads"] == "1"
    assert record["mutants_tested"] == 3 and record["last_progress"].startswith("3/3 mutants: 2 killed, 1 survived")
    assert lines and lines[-1].startswith("3/3 mutants")
    assert (tmp_path / "mutants" / mutation.LOG_NAME).read_bytes() == output
    assert json.loads((tmp_path / "mutants" / mutation.RUN_RECORD).read_text())["max_children"] == 3
    seen["returncode"] = 1
    with pytest.raises(mutation.MutationError, match="mutmut run exited with code 1"):
        mutation.run_mutmut(tmp_path, 3, fresh=False, progress=lines.append)


def test_an_interrupted_run_is_scored_over_the_tested_mutants_and_says_so(tmp_path):
    mutants = [dict(m) for m in FAKE] + [_mutant("reference_impl/adam.py", "frobenius", 9, "not checked")]
    mutation.classify(mutants, REASONS)
    summary = mutation.summarize(mutants, settings={}, run_record=None, suite_seconds={}, unexecuted={}, command="certify mutate")
    assert summary["totals"]["total"] == 7 and summary["totals"]["not_tested"] == 1 and summary["totals"]["score"] == 3 / 7
    assert all(m["status"] != "not checked" for m in summary["survivors"])
    md_path, _ = mutation.write_reports(summary, tmp_path)
    text = md_path.read_text(encoding="utf-8")
    assert "**Incomplete: 1 mutants were not tested**" in text and "| reference_impl/adam.py | 2 | 1 | 1 | 0 | 0 | 4 | 50.0% | 1 |" in text
    path, _ = report.write_report([], tmp_path)
    assert "incomplete: 1 mutants not tested" in path.read_text(encoding="utf-8")
