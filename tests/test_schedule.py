"""benchmarks/schedule.py: the task times of a run, and list scheduling of them on N workers."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

_PATH = Path(__file__).resolve().parents[1] / "benchmarks" / "schedule.py"
_spec = importlib.util.spec_from_file_location("schedule", _PATH)
schedule = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(schedule)


def test_longest_first_list_scheduling():
    assert schedule.list_schedule([3, 3, 2, 2, 2], 2) == 7  # LPT's own answer (the optimum is 6)
    assert schedule.list_schedule([5, 1, 1, 1], 2) == 5  # the longest task bounds it
    assert schedule.list_schedule([1.0] * 10, 32) == 1.0
    assert schedule.list_schedule([2.0, 1.0], 1) == 3.0
    assert schedule.list_schedule([], 4) == 0.0


def test_the_tasks_of_a_run_with_each_claims_serial_work(tmp_path, capsys):
    for claim_id, tasks in (("P1", {"P1 first_step": [1.0, 2.0], "serial": [0.5]}), ("P2", {"serial": [4.0]})):
        (tmp_path / f"{claim_id}.json").write_text(json.dumps({"id": claim_id, "run": {"tasks": tasks}}), encoding="utf-8")
    (tmp_path / "mutation.json").write_text(json.dumps({"kind": "mutation-report"}), encoding="utf-8")
    assert sorted(schedule.load_tasks(tmp_path)) == [("P1 first_step", 1.0), ("P1 first_step", 2.0), ("P1 serial", 0.5), ("P2 serial", 4.0)]
    assert schedule.main([str(tmp_path), "--workers", "1", "2"]) == 0
    out = capsys.readouterr().out
    assert "longest task: P2 serial, 4.0 s = 53.33% of the total" in out
    assert "2 workers:      4.0 s" in out


def test_a_folder_without_task_records_is_refused(tmp_path, capsys):
    assert schedule.main([str(tmp_path)]) == 2
    assert "no certificate with a run.tasks record" in capsys.readouterr().err
