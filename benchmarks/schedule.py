"""The task times of a certify run: total work, the longest task, and the wall time of other worker counts.

    python benchmarks/schedule.py DIR [--workers 1 2 32]

Reads the certificates in DIR (run.tasks: the seconds of every task each claim ran, and its serial
work outside tasks; certify/claims.task_record) and prints

* the total task time (the sum of every task and every claim's serial work),
* the longest task and its share of the total: no number of workers finishes before it ends,
* per worker count, the wall time of list scheduling (each task, longest first, to the worker
  that is free first) of the same tasks: what a pool or a cluster of that size would reach if
  every task could start at once. A claim's serial work is one task; a claim's tasks do depend on
  the serial work that starts them, so the simulated time is a lower bound, near when the serial
  work is small.

The times are those of the run that wrote DIR; run it with --workers 1 (or as `certify all` does
with a pool: each claim in one worker, its tasks inline) for task times free of contention.
"""

from __future__ import annotations

import argparse
import heapq
import json
import sys
from pathlib import Path


def load_tasks(folder: Path) -> list[tuple[str, float]]:
    """(claim id + task label, seconds) of every task recorded by the certificates in folder."""
    tasks = []
    for path in sorted(folder.glob("*.json")):
        try:
            certificate = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            continue
        recorded = (certificate.get("run") or {}).get("tasks")
        if not isinstance(recorded, dict):
            continue
        for label, seconds in recorded.items():
            name = f"{certificate.get('id')} serial" if label == "serial" else label
            tasks += [(name, float(s)) for s in seconds]
    return tasks


def list_schedule(times: list[float], workers: int) -> float:
    """The makespan of longest-first list scheduling of independent tasks on `workers` workers."""
    free = [0.0] * workers
    heapq.heapify(free)
    for seconds in sorted(times, reverse=True):
        heapq.heappush(free, heapq.heappop(free) + seconds)
    return max(free) if times else 0.0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("folder", type=Path)
    parser.add_argument("--workers", type=int, nargs="+", default=[1, 2, 32])
    parser.add_argument("--top", type=int, default=10, help="longest tasks listed")
    args = parser.parse_args(argv)
    tasks = load_tasks(args.folder)
    if not tasks:
        print(f"{args.folder}: no certificate with a run.tasks record", file=sys.stderr)
        return 2
    total = sum(seconds for _, seconds in tasks)
    longest = max(tasks, key=lambda task: task[1])
    print(f"{len(tasks)} tasks, {total:.1f} s of work in all")
    print(f"longest task: {longest[0]}, {longest[1]:.1f} s = {100 * longest[1] / total:.2f}% of the total")
    print(f"longest {args.top}:")
    for name, seconds in sorted(tasks, key=lambda task: -task[1])[: args.top]:
        print(f"  {seconds:8.2f} s  {name}")
    for workers in args.workers:
        makespan = list_schedule([seconds for _, seconds in tasks], workers)
        print(f"{workers:4d} workers: {makespan:8.1f} s by list scheduling (lower bounds: total / workers {total / workers:.1f} s, longest task {longest[1]:.1f} s)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
