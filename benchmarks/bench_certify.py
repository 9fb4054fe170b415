"""Frames per second of each claim, with its chunk tasks inline (N = 1) and in a pool of N processes.

    python benchmarks/bench_certify.py [--profile default] [--workers 1 2] [--claims P1 P2 ...] [--out table.md]

Each (claim, N) runs in a fresh process (no cache of an earlier run helps a later one), as
`certify run ID --workers N` runs it: its symbolic part, long runs and other sequential parts in
that process, its chunk loops as tasks of the executor (propositions.kit.parallel). The pool is
started and warmed up (every worker has imported the claims) before the clock starts, so the table
measures the work, not the start-up; the start-up is reported on its own line. frames/s = the claim's frames / wall seconds; speed-up = wall(N = 1) /
wall(N). Every run also checks that the certificate's digest is the one N = 1 gave.

The thorough profile (10^6 frames per claim; tens of minutes on two cores):

    python benchmarks/bench_certify.py --profile thorough --workers 1 2 4

`certify all --workers N` runs whole claims as tasks instead (its chunks then run inline in each
worker); its wall time is what README.md reports.

What it measured on the project's two shared cores, with the load at the time, is in
benchmarks/README.md.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from certify import claims  # noqa: E402
from certify import execution  # noqa: E402
from propositions.kit import parallel  # noqa: E402

CLAIMS = ("P1", "P2", "P3", "P4", "P5", "P6", "samplers")


def _warm() -> int:
    import propositions

    for claim_id in CLAIMS:
        propositions.get_claim(claim_id)
    return os.getpid()


def measure(claim_id: str, profile: str, executor) -> tuple[float, int, str]:
    """(wall seconds, frames, digest) of one claim on `executor`."""
    started = time.perf_counter()
    sealed, internal_error = claims.certify_claim(claim_id, seed=0, profile=profile, command="bench", workers=executor.workers)
    wall = time.perf_counter() - started
    if internal_error or sealed["verdict"] != "pass":
        raise SystemExit(f"{claim_id}: {internal_error or sealed['verdict']}")
    return wall, sealed["numerical"]["frames"], sealed["digest"]["value"]


def measure_here(claim_id: str, workers: int, profile: str) -> dict:
    """One measurement in this process: a warmed executor of `workers`, then the claim."""
    _warm()
    executor = parallel.Inline() if workers == 1 else execution.Pool(workers)
    with execution.using(executor):
        started = time.perf_counter()
        if workers > 1:
            parallel.map_tasks(_warm, [()] * (4 * workers))
        startup = time.perf_counter() - started
        wall, frames, digest = measure(claim_id, profile, executor)
    return {"wall": wall, "frames": frames, "digest": digest, "startup": startup}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--profile", default="default", choices=("quick", "default", "thorough"))
    parser.add_argument("--workers", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--claims", nargs="+", default=list(CLAIMS))
    parser.add_argument("--out", help="also write the table as markdown")
    parser.add_argument("--measure", nargs=2, metavar=("CLAIM", "N"), help=argparse.SUPPRESS)  # one run, in a child process
    args = parser.parse_args(argv)
    if args.measure:
        print(json.dumps(measure_here(args.measure[0], int(args.measure[1]), args.profile)))
        return 0

    results: dict = {}
    lines = []
    for workers in args.workers:
        startups = []
        for claim_id in args.claims:
            child = subprocess.run([sys.executable, __file__, "--profile", args.profile, "--measure", claim_id, str(workers)],
                                   capture_output=True, text=True, check=True)
            record = json.loads(child.stdout.strip().splitlines()[-1])
            results[claim_id, workers] = (record["wall"], record["frames"], record["digest"])
            startups.append(record["startup"])
            print(f"{claim_id} N={workers}: {record['wall']:.2f} s, {record['frames'] / record['wall']:.0f} frames/s", flush=True)
        if workers > 1:
            lines.append(f"N = {workers}: the pool started and warmed in {min(startups):.1f} to {max(startups):.1f} s (not counted)")

    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    header = "| claim | frames | " + " | ".join(f"N = {n}: s, frames/s" for n in args.workers) + " | speed-up | same digest |"
    table = [header, "|" + "---|" * (len(args.workers) + 4)]
    totals = {n: 0.0 for n in args.workers}
    for claim_id in args.claims:
        base_wall, frames, base_digest = results[claim_id, args.workers[0]]
        cells = []
        for n in args.workers:
            wall, _, _ = results[claim_id, n]
            totals[n] += wall
            cells.append(f"{wall:.2f}, {frames / wall:.0f}")
        last = results[claim_id, args.workers[-1]][0]
        same = all(results[claim_id, n][2] == base_digest for n in args.workers)
        table.append(f"| {claim_id} | {frames} | " + " | ".join(cells) + f" | {base_wall / last:.2f} | {'yes' if same else 'NO'} |")
    table.append("| all | | " + " | ".join(f"{totals[n]:.2f}" for n in args.workers) + f" | {totals[args.workers[0]] / totals[args.workers[-1]]:.2f} | |")
    text = "\n".join([f"profile {args.profile}, {os.cpu_count()} CPUs, load average {load:.2f} at the end, {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}", *lines, "", *table])
    print(text)
    if args.out:
        Path(args.out).write_text(text + "\n", encoding="utf-8")
    return 0 if all(results[c, n][2] == results[c, args.workers[0]][2] for c in args.claims for n in args.workers) else 1


if __name__ == "__main__":
    raise SystemExit(main())
