"""The training API's two speed questions, each as ratios measured within one run:

    python benchmarks/bench_optimizer.py [--shape 12,768,64] [--dtype float32] [--rounds 7]
                                         [--min-time 0.3] [--device cpu|cuda] [--no-compile]

1. Batched parameters: twelve (heads, d, r) parameters (one per layer, the same settings) against one
   (12 heads, d, r) parameter holding the same frames. StiefelAdam steps the twelve in one batched
   call, with their state in one buffer per kind (read and written in place); "twelve / one" is
   the price of what remains around it: joining the twelve frames and gradients (torch.cat) and
   writing the frames back (one foreach copy). "twelve slices / one": the twelve parameters are
   slices of one tensor (allocated so by the user), which the step joins as a view and writes in
   place: only the gradients are joined.
2. Compiled step: `torch.compile(optimizer.step)` (inductor) against the eager step, both with
   skip_nonfinite=True (the sync-free route that compiles in one graph) and, for reference, the
   eager step with skip_nonfinite=False (the default route, which asks the device once per step
   and skips the sixth product when the Gram identity is accurate).

The contenders are interleaved: every round times each of them once (in an order rotated from
round to round), so a change in the machine's load hits all alike, and each ratio is the median of
the per-round ratios, with its min - max spread. Compilation happens before the clock starts.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from torch_impl import StiefelAdam, stiefel_init_  # noqa: E402

DTYPES = {"float32": torch.float32, "float64": torch.float64, "bfloat16": torch.bfloat16}


def _parameters(count, shape, dtype, device, seed=0, slices=False):
    """count parameters of shape, each its own tensor, or (slices=True) slices of one tensor."""
    generator = torch.Generator().manual_seed(seed)
    data = stiefel_init_(torch.empty((count,) + tuple(shape), dtype=torch.float64), generator=generator).to(device=device, dtype=dtype)
    params = [torch.nn.Parameter(data[k] if slices else data[k].clone()) for k in range(count)]
    for p in params:
        p.grad = torch.randn(shape, dtype=torch.float64, generator=generator).to(device=device, dtype=dtype)
    return params


def _timer(step, device, min_time):
    """Seconds per call of step, over at least min_time (after one warm call)."""
    def measure():
        step()
        if device == "cuda":
            torch.cuda.synchronize()
        calls, start = 0, time.perf_counter()
        while True:
            step()
            calls += 1
            if device == "cuda":
                torch.cuda.synchronize()
            elapsed = time.perf_counter() - start
            if elapsed >= min_time:
                return elapsed / calls
    return measure


def contenders(heads, d, r, dtype, device, compile_step):
    layers = 12
    twelve = StiefelAdam(_parameters(layers, (heads, d, r), dtype, device), lr=1e-3, skip_nonfinite=True)
    slices = StiefelAdam(_parameters(layers, (heads, d, r), dtype, device, slices=True), lr=1e-3, skip_nonfinite=True)
    one = StiefelAdam(_parameters(1, (layers * heads, d, r), dtype, device), lr=1e-3, skip_nonfinite=True)
    sync_free = StiefelAdam(_parameters(1, (heads, d, r), dtype, device), lr=1e-3, skip_nonfinite=True)
    default = StiefelAdam(_parameters(1, (heads, d, r), dtype, device), lr=1e-3)
    steps = {
        f"twelve ({heads},{d},{r})": twelve.step,
        f"one ({layers * heads},{d},{r})": one.step,
        f"twelve slices of one tensor ({heads},{d},{r})": slices.step,
        "eager, skip_nonfinite": sync_free.step,
        "eager, default": default.step,
    }
    if compile_step:
        compiled_optimizer = StiefelAdam(_parameters(1, (heads, d, r), dtype, device), lr=torch.tensor(1e-3, device=device), skip_nonfinite=True)
        compiled = torch.compile(compiled_optimizer.step)
        start = time.perf_counter()
        compiled()
        print(f"compiled in {time.perf_counter() - start:.1f} s", file=sys.stderr)
        steps["compiled, skip_nonfinite"] = compiled
    return steps


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shape", default="12,768,64")
    parser.add_argument("--dtype", choices=sorted(DTYPES), default="float32")
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--min-time", type=float, default=0.3)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--no-compile", action="store_true")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args(argv)
    heads, d, r = (int(x) for x in args.shape.split(","))
    steps = contenders(heads, d, r, DTYPES[args.dtype], args.device, not args.no_compile)
    timers = {name: _timer(step, args.device, args.min_time) for name, step in steps.items()}
    names, times = list(timers), {name: [] for name in timers}
    for round_index in range(args.rounds):
        order = names[round_index % len(names):] + names[: round_index % len(names)]
        for name in order:
            times[name].append(timers[name]())
    ratios = {
        "twelve / one (batched parameters)": (names[0], names[1]),
        "twelve slices / one (batched parameters in one storage)": (names[2], names[1]),
        "eager skip_nonfinite / eager default": (names[3], names[4]),
    }
    if "compiled, skip_nonfinite" in times:
        ratios["compiled / eager (both skip_nonfinite)"] = ("compiled, skip_nonfinite", names[3])
    lines = [
        f"torch {torch.__version__}, {args.device}, {args.dtype}, {torch.get_num_threads()} threads, {args.rounds} rounds",
        "",
        "| step | median ms |",
        "|---|---|",
        *[f"| {name} | {1e3 * statistics.median(values):.2f} |" for name, values in times.items()],
        "",
        "| ratio | median | min - max |",
        "|---|---|---|",
    ]
    for label, (a, b) in ratios.items():
        per_round = [x / y for x, y in zip(times[a], times[b])]
        lines.append(f"| {label} | {statistics.median(per_round):.3f} | {min(per_round):.3f} - {max(per_round):.3f} |")
    text = "\n".join(lines)
    print(text)
    if args.out:
        args.out.write_text(text + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
