"""`certify mutate --target`: the three targets' JSON composed into one MUTATION.md, the torch_impl
target's scratch settings, sample and interval, and the command line. None of these runs mutmut."""

from __future__ import annotations

import json
import sys
import tomllib
import types
from pathlib import Path

import pytest

from certify import cli, mutation, mutation_torch

from test_mutation_report import FAKE, REASONS, _mutant, _summary

ROOT = Path(__file__).resolve().parents[1]

TORCH_FAKE = [
    _mutant("torch_impl/functional.py", "project_tangent", 1, "killed"),
    _mutant("torch_impl/functional.py", "project_tangent", 2, "killed"),
    _mutant("torch_impl/functional.py", "project_tangent", 3, "killed"),
    _mutant("torch_impl/optimizer.py", "_check_frame", 1, "survived", 'raise ValueError(f"{name} x")', 'raise ValueError(f"XX{name} xXX")'),
    _mutant("torch_impl/optimizer.py", "step", 2, "survived", "a + b", "a - b"),
    _mutant("torch_impl/optimizer.py", "step", 3, "survived", "x = 1", "x = 2"),
    _mutant("torch_impl/optimizer.py", "step", 4, "not checked"),  # drawn by no sample below: left out
]
TORCH_REASONS = {
    "torch_impl/optimizer.py | _check_frame | *": {"class": "validation", "reason": "an error message"},
    "torch_impl/optimizer.py | step | x = 1 -> x = 2": {"class": "equivalent", "reason": "x is never read"},
    "torch_impl/optimizer.py | step | a + b -> a - b": {"class": "gap", "reason": "a certificate would need b != 0"},
}


def _torch_summary():
    mutants = [dict(m) for m in TORCH_FAKE]
    mutation.classify(mutants, TORCH_REASONS)
    sample = {"population": 40, "seed": 3, "names": [m["name"] for m in TORCH_FAKE[:6]]}
    return mutation_torch.summarize(mutants, sample, run_record={"wall_seconds": 60.0, "max_children": 2, "mutants_tested": 6},
                                    settings={"timeout_multiplier": 3.0, "timeout_constant": 5.0}, moved=["torch_impl/optimizer.py: StiefelAdam.step"],
                                    suite_seconds={"crosscheck": 3.0}, command="certify mutate --target torch_impl")


def test_the_torch_summary_scores_the_sample_over_non_equivalent_mutants_with_intervals():
    summary = _torch_summary()
    assert (summary["killed"], summary["survived"], summary["total"], summary["equivalent"], summary["gaps"], summary["explained"]) == (3, 3, 6, 1, 1, 2)
    assert summary["sample"]["size"] == 6 and summary["sample"]["population"] == 40 and summary["sample"]["seed"] == 3
    assert summary["score"] == 0.5 and summary["score_non_equivalent"] == 3 / 5
    low, high = summary["score_interval"]
    assert low < 0.5 < high and low == pytest.approx(0.1181, abs=1e-4) and high == pytest.approx(0.8819, abs=1e-4)
    assert [m["class"] for m in mutation.unexplained(summary)] == ["gap"]


def test_the_binomial_interval_is_clopper_pearson():
    assert mutation_torch.binomial_interval(0, 10)[0] == 0.0 and mutation_torch.binomial_interval(0, 10)[1] == pytest.approx(0.30850, abs=1e-5)
    assert mutation_torch.binomial_interval(10, 10) == (pytest.approx(0.69150, abs=1e-5), 1.0)
    assert mutation_torch.binomial_interval(0, 0) is None


def test_the_sample_is_seeded_sorted_and_without_replacement():
    population = [f"torch_impl.functional.x_f__mutmut_{i}" for i in range(100)]
    first = mutation_torch.draw_sample(population, 10, 0)
    assert first == mutation_torch.draw_sample(list(reversed(population)), 10, 0) and first == sorted(first)
    assert len(set(first)) == 10 and set(first) <= set(population)
    assert first != mutation_torch.draw_sample(population, 10, 1)
    assert mutation_torch.draw_sample(population, None, 0) == sorted(population) == mutation_torch.draw_sample(population, 500, 0)


def test_mutation_md_shows_every_target_present_and_keeps_the_others_when_one_is_written_again(tmp_path):
    mutation.write_reports(_summary(tmp_path), tmp_path)
    text = (tmp_path / "MUTATION.md").read_text(encoding="utf-8")
    assert "| torch_impl | not run |" in text and "| certifier | not run |" in text
    mutation_torch.write_report(_torch_summary(), tmp_path)
    certifier = {"target": "certifier", "killed": 8, "survived": 2, "total": 10, "score": 0.8, "markdown": "## certifier: weakened certificates\n\nEight of ten.\n"}
    (tmp_path / "mutation-certifier.json").write_text(json.dumps(certifier), encoding="utf-8")
    mutation.write_page(tmp_path)
    mutation.write_reports(_summary(tmp_path), tmp_path)  # reference_impl again: the others' sections stay
    text = (tmp_path / "MUTATION.md").read_text(encoding="utf-8")
    assert text.startswith("# Mutation score of the certifier") and text.count("\n# ") == 0
    assert "| target | killed | survived | not-killed-explained | gaps | score over non-equivalent mutants |" in text
    assert "| reference_impl | 3 | 4 | 3 | 0 | 3 / (7 - 1) = 50.0% |" in text
    assert "| torch_impl | 3 | 3 | 2 | 1 | 3 / (6 - 1) = 60.0% |" in text
    assert "| certifier | 8 | 2 | - | - | 8 / (10 - 0) = 80.0% |" in text
    sections = [line for line in text.splitlines() if line.startswith("## ")]
    assert [line.split(":")[0] for line in sections] == ["## reference_impl", "## torch_impl", "## certifier"]
    assert "**Score: 3 killed of 7 mutants = 42.9%**" in text and "Eight of ten." in text
    assert "Sample: 6 of a population of 40 mutants, seed 3" in text and "(95% interval 11.8% to 88.2%)" in text
    gap_row = next(line for line in text.splitlines() if "`a + b` -> `a - b`" in line)
    assert "| gap |" in gap_row and "b != 0" in gap_row
    assert "`torch_impl/optimizer.py: StiefelAdam.step`" in text
    written = json.loads((tmp_path / "mutation-torch_impl.json").read_text(encoding="utf-8"))
    assert written["target"] == "torch_impl" and written["markdown"].startswith("## torch_impl")


def test_an_unreadable_target_json_is_said_so_in_the_table(tmp_path):
    (tmp_path / "mutation-torch_impl.json").write_text("{", encoding="utf-8")
    assert "| torch_impl | mutation-torch_impl.json could not be read" in mutation.render_page(tmp_path)


def test_the_scratch_pyproject_retargets_mutmut_at_torch_impl_only():
    text = (ROOT / "pyproject.toml").read_text(encoding="utf-8")
    settings = mutation_torch.scratch_settings(tomllib.loads(text)["tool"]["mutmut"])
    rewritten = tomllib.loads(mutation_torch.scratch_pyproject(text, settings))
    table = rewritten["tool"]["mutmut"]
    assert table["source_paths"] == ["torch_impl"] and table["pytest_add_cli_args_test_selection"] == [mutation_torch.KILL_SUITE]
    assert set(table["also_copy"]) == {"propositions", "reference_impl"} and table["mutate_only_covered_lines"] is True
    assert rewritten["project"] == tomllib.loads(text)["project"] and rewritten["tool"]["pytest"] == tomllib.loads(text)["tool"]["pytest"]
    # the reference's own kill suite does not pick up the torch kill suite
    assert tomllib.loads(text)["tool"]["mutmut"]["pytest_add_cli_args_test_selection"] == [mutation.KILL_SUITE]
    assert mutation.KILL_SUITE != mutation_torch.KILL_SUITE and (ROOT / mutation_torch.KILL_SUITE).is_file()
    assert f"/{mutation_torch.SCRATCH}/" in (ROOT / ".gitignore").read_text(encoding="utf-8")


def test_moved_decorators_give_the_same_functions_and_leave_others_alone():
    source = (
        "import torch\n\ndef memoized(f):\n    return f\n\n@memoized\ndef a(x):\n    return x + 1\n\n"
        "class C:\n    @torch.no_grad()\n    def step(self):\n        return torch.is_grad_enabled()\n\n    @property\n    def p(self):\n        return 1\n"
    )
    text, moved = mutation_torch.move_decorators(source)
    assert moved == ["C.step", "a"]
    assert "@memoized" not in text and "@torch.no_grad()" not in text and "@property" in text
    assert "    step = torch.no_grad()(step)\n" in text and "a = memoized(a)\n" in text
    torch = pytest.importorskip("torch")
    namespace = {}
    exec(compile(text, "moved", "exec"), namespace)
    assert namespace["a"](1) == 2 and namespace["C"]().step() is False and namespace["C"]().p == 1 and torch.is_grad_enabled()


def test_certify_mutate_target_option_and_its_refusals(capsys):
    assert cli.main(["mutate", "--target", "numpy"]) == 2
    assert "invalid choice" in capsys.readouterr().err
    assert cli.main(["mutate", "--target", "torch_impl", "--only", "torch_impl.*"]) == 2
    assert "does not go with --target torch_impl" in capsys.readouterr().err
    assert cli.main(["mutate", "--sample", "5"]) == 2
    assert "reference_impl's run tests every mutant" in capsys.readouterr().err
    assert cli.main(["mutate", "--help"]) == 0
    assert "--target" in capsys.readouterr().out


def test_certify_mutate_torch_impl_writes_its_json_and_the_page(tmp_path, monkeypatch, capsys):
    seen = {}

    def fake_mutate(**options):
        seen.update(options)
        return _torch_summary()

    monkeypatch.setattr(mutation_torch, "mutate", fake_mutate)
    code = cli.main(["mutate", "--target", "torch_impl", "--report-only", "--seed", "3", "--out", str(tmp_path)])
    assert code == 1  # one gap
    assert seen["sample"] == mutation_torch.DEFAULT_SAMPLE and seen["seed"] == 3 and seen["report_only"]
    out = capsys.readouterr().out
    assert "sample 6 of 40 (seed 3): score 3/6 = 50.0%" in out and "1 gap" in out
    assert (tmp_path / "mutation-torch_impl.json").is_file() and "## torch_impl" in (tmp_path / "MUTATION.md").read_text(encoding="utf-8")


def test_certify_mutate_certifier_calls_certify_weakening_lazily(tmp_path, monkeypatch, capsys):
    calls = []

    def run(out_dir, *, max_children, sample, seed, progress):
        calls.append((out_dir, max_children, sample, seed))
        progress("weakening")
        data = {"target": "certifier", "killed": 4, "survived": 0, "total": 4, "score": 1.0, "markdown": "## certifier: all killed\n"}
        (out_dir / "mutation-certifier.json").write_text(json.dumps(data), encoding="utf-8")
        return data

    monkeypatch.setitem(sys.modules, "certify.weakening", types.SimpleNamespace(run=run))
    import certify

    monkeypatch.setattr(certify, "weakening", sys.modules["certify.weakening"], raising=False)
    code = cli.main(["mutate", "--target", "certifier", "--sample", "7", "--seed", "2", "--max-children", "1", "--out", str(tmp_path)])
    assert code == 0 and calls == [(tmp_path, 1, 7, 2)]
    assert "weakening" in capsys.readouterr().out
    text = (tmp_path / "MUTATION.md").read_text(encoding="utf-8")
    assert "| certifier | 4 | 0 | - | - | 4 / (4 - 0) = 100.0% |" in text and "## certifier: all killed" in text


def test_the_committed_reasons_of_torch_impl_name_real_classes():
    entries = {key: entry for key, entry in mutation.load_classifications().items() if key.startswith("torch_impl/")}
    assert all(entry["class"] in ("equivalent", "validation", "gap") for entry in entries.values())


def test_the_reference_fake_is_unchanged_by_the_torch_target():
    assert all(m["file"].startswith("reference_impl/") for m in FAKE) and REASONS


def test_the_scratch_copy_holds_the_kill_suite_and_the_retargeted_settings(tmp_path):
    scratch = tmp_path / "scratch"
    moved = mutation_torch.prepare_scratch(ROOT, scratch, fresh=True)
    assert "torch_impl/functional.py: stiefel_adam_step" in moved and "torch_impl/optimizer.py: StiefelAdam.step" in moved
    assert mutation_torch.prepare_moved_names(scratch) == moved
    assert (scratch / mutation_torch.KILL_SUITE).is_file() and (scratch / "reference_impl").is_dir() and not (scratch / "certify").exists()
    assert "@torch.no_grad()" not in (scratch / "torch_impl" / "functional.py").read_text(encoding="utf-8")
    assert mutation.mutmut_settings(scratch)["source_paths"] == ["torch_impl"]
    compile(mutation_torch.DRIVER, "driver", "exec")  # the script run in the scratch copy
