"""Time per optimizer step: torch_impl.StiefelAdam against geoopt and against its own roofline.

    python benchmarks/bench_step.py [--shapes 1,20,10 8,256,32 12,768,64 32,1024,128] [--dtype float32]
                                    [--rounds 7] [--min-time 0.2] [--threads N] [--device cpu|cuda]
                                    [--compiled] [--out table.md]

For each (heads, d, r): one parameter of shape (heads, d, r) with a fixed random gradient, stepped by
StiefelAdam (default mode), StiefelAdam without its per-step frame check (a subclass whose check
returns 0: what the check costs), geoopt's RiemannianAdam on EuclideanStiefel (skipped with a
message when geoopt is not installed), torch.optim.AdamW (Euclidean, no manifold: a floor) and,
with --compiled, `torch.compile(optimizer.step)` of a StiefelAdam with a tensor lr (compiled before
the clock starts). (1, 20, 10) is geoopt's own test shape, where the per-call overhead dominates.
The implementations are interleaved: each round times every one of them (in an order rotated from
round to round), so a change in the machine's load hits all of them alike, and every ratio is
formed within a round. The table gives the median ratio over the rounds and its spread (min - max).

Roofline. StiefelAdam's cost is its d x r^2 matrix products; the script counts them in one step
(a dispatch-mode counter: batched matmuls with an operand of d rows), split into the two shapes
that occur, W^T X (r x r result) and X M (d x r result), and times one batched matmul of each
shape in every round. roofline = n_WtX t_WtX + n_XM t_XM; "x roofline" = step time / roofline,
the overhead of everything else (elementwise passes, the r x r Newton-Schulz, the optimizer's
checks and copies). The r x r products of the Newton-Schulz iteration are counted too and timed as
one batched r x r matmul; "x roofline with r x r" adds them, which leaves the elementwise passes,
the checks and the copies as the remaining overhead.
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
import time
from pathlib import Path

import torch
from torch.utils._python_dispatch import TorchDispatchMode

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from torch_impl import StiefelAdam, stiefel_init_  # noqa: E402

try:
    import geoopt
except ImportError:  # optional baseline
    geoopt = None

DEFAULT_SHAPES = ((1, 20, 10), (8, 256, 32), (12, 768, 64), (32, 1024, 128))
DTYPES = {"float32": torch.float32, "float64": torch.float64, "bfloat16": torch.bfloat16}
MATMULS = (torch.ops.aten.bmm.default, torch.ops.aten.baddbmm.default, torch.ops.aten.baddbmm_.default)


class ProductCounter(TorchDispatchMode):
    """Counts the d x r^2 products (batched matmuls with an operand of d rows) by result shape, and
    the r x r x r products of the Newton-Schulz iteration (every operand r x r)."""

    def __init__(self, d: int, r: int):
        super().__init__()
        self.d, self.r = d, r
        self.counts = {"WtX": 0, "XM": 0, "rr": 0}

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        result = func(*args, **(kwargs or {}))
        if func in MATMULS:
            matrices = [a for a in args if torch.is_tensor(a) and a.dim() == 3]
            if any(self.d in a.shape[-2:] for a in matrices):
                self.counts["XM" if result.shape[-2] == self.d else "WtX"] += 1
            elif all(tuple(a.shape[-2:]) == (self.r, self.r) for a in matrices):
                self.counts["rr"] += 1
        return result


def make_parameter(shape, dtype, generator, device, manifold=None):
    data = stiefel_init_(torch.empty(shape, dtype=torch.float64), generator=generator).to(device=device, dtype=dtype)
    parameter = geoopt.ManifoldParameter(data, manifold=manifold) if manifold is not None else torch.nn.Parameter(data)
    parameter.grad = torch.randn(shape, dtype=torch.float64, generator=generator).to(device=device, dtype=dtype)
    return parameter


def count_products(shape, dtype, generator, device) -> dict:
    """d x r^2 products of one StiefelAdam step (the second, so that the moment is not zero)."""
    parameter = make_parameter(shape, dtype, generator, device)
    optimizer = StiefelAdam([parameter], lr=1e-3)
    optimizer.step()
    counter = ProductCounter(shape[1], shape[2])
    with counter:
        optimizer.step()
    return counter.counts


def _per_step(function, repetitions: int, device) -> float:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    start = time.perf_counter()
    for _ in range(repetitions):
        function()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return (time.perf_counter() - start) / repetitions


class WithoutFrameCheck(StiefelAdam):
    """StiefelAdam whose per-step check ||W^T W - I|| <= tol is skipped (every frame reads as on
    the manifold): the step minus the check, to time the check. Not for training."""

    def _frame_deviation(self, W):
        return torch.zeros(W.shape[0], dtype=torch.float32, device=W.device)


def bench_shape(shape, dtype, rounds: int, min_time: float, generator, device, compiled: bool = False) -> dict:
    heads, d, r = shape
    contenders = {"StiefelAdam": StiefelAdam([make_parameter(shape, dtype, generator, device)], lr=1e-3).step}
    contenders["StiefelAdam without frame check"] = WithoutFrameCheck([make_parameter(shape, dtype, generator, device)], lr=1e-3).step
    if compiled:
        lr = torch.tensor(1e-3, device=device)
        contenders["StiefelAdam compiled"] = torch.compile(StiefelAdam([make_parameter(shape, dtype, generator, device)], lr=lr).step)
    if geoopt is not None:
        manifold = geoopt.EuclideanStiefel()
        contenders["geoopt EuclideanStiefel"] = geoopt.optim.RiemannianAdam([make_parameter(shape, dtype, generator, device, manifold)], lr=1e-3).step
    contenders["AdamW"] = torch.optim.AdamW([make_parameter(shape, dtype, generator, device)], lr=1e-3).step
    compute = torch.float64 if dtype == torch.float64 else torch.float32
    X = torch.randn((heads, d, r), dtype=compute, generator=generator).to(device)
    M = torch.randn((heads, r, r), dtype=compute, generator=generator).to(device)
    contenders["matmul W^T X"] = lambda: torch.bmm(X.mT, X)
    contenders["matmul X M"] = lambda: torch.bmm(X, M)
    contenders["matmul M M"] = lambda: torch.bmm(M, M)
    # warm up (three calls: a compiled step compiles at the first, which creates the state, and
    # once more at the second), then choose repetitions per round so that each entry runs about min_time
    repetitions = {}
    for name, function in contenders.items():
        for _ in range(3):
            function()
        repetitions[name] = max(1, math.ceil(min_time / max(_per_step(function, 1, device), 1e-6)))
    times = {name: [] for name in contenders}
    names = list(contenders)
    for index in range(rounds):
        for name in names[index % len(names):] + names[: index % len(names)]:
            times[name].append(_per_step(contenders[name], repetitions[name], device))
    return times


def _summary(values) -> str:
    return f"{statistics.median(values):.2f} ({min(values):.2f} - {max(values):.2f})"


def _percent(values) -> str:
    return f"{100 * statistics.median(values):+.1f}% ({100 * min(values):+.1f} - {100 * max(values):+.1f})"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shapes", nargs="*", default=[",".join(map(str, s)) for s in DEFAULT_SHAPES], help="heads,d,r triples")
    parser.add_argument("--dtype", default="float32", choices=list(DTYPES))
    parser.add_argument("--rounds", type=int, default=7, help="interleaved rounds (ratios are formed within a round)")
    parser.add_argument("--min-time", type=float, default=0.2, help="seconds per entry and round (at least one step)")
    parser.add_argument("--threads", type=int, default=None, help="torch.set_num_threads (default: torch's)")
    parser.add_argument("--device", default="cpu", help="cpu or cuda")
    parser.add_argument("--compiled", action="store_true", help="also time torch.compile(optimizer.step) (inductor)")
    parser.add_argument("--out", type=Path, default=None, help="also write the Markdown table here")
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    if geoopt is None:
        print("geoopt is not installed: its RiemannianAdam baseline is skipped (pip install geoopt)", file=sys.stderr)
    dtype = DTYPES[args.dtype]
    device = torch.device(args.device)
    generator = torch.Generator().manual_seed(0)
    lines = [
        f"StiefelAdam step, torch {torch.__version__}, {device}, {torch.get_num_threads()} CPU threads, {args.dtype}, "
        f"{args.rounds} interleaved rounds; ratios: median (min - max) over rounds",
        "",
        "| heads, d, r | products (W^T X + X M) | r x r products | StiefelAdam ms | geoopt ms | geoopt / StiefelAdam "
        "| StiefelAdam / roofline | StiefelAdam / roofline with r x r | StiefelAdam / AdamW | frame check cost "
        "| compiled ms | geoopt / compiled |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for text in args.shapes:
        shape = tuple(int(x) for x in text.split(","))
        counts = count_products(shape, dtype, generator, device)
        times = bench_shape(shape, dtype, args.rounds, args.min_time, generator, device, args.compiled)
        ours = times["StiefelAdam"]
        compiled = times.get("StiefelAdam compiled")
        roofline = [counts["WtX"] * a + counts["XM"] * b for a, b in zip(times["matmul W^T X"], times["matmul X M"])]
        with_rr = [f + counts["rr"] * c for f, c in zip(roofline, times["matmul M M"])]
        geo = times.get("geoopt EuclideanStiefel")
        row = [
            str(shape),
            f"{counts['WtX'] + counts['XM']} ({counts['WtX']} + {counts['XM']})",
            str(counts["rr"]),
            f"{1e3 * statistics.median(ours):.3f}",
            f"{1e3 * statistics.median(geo):.3f}" if geo else "-",
            _summary([g / s for g, s in zip(geo, ours)]) if geo else "-",
            _summary([s / f for s, f in zip(ours, roofline)]),
            _summary([s / f for s, f in zip(ours, with_rr)]),
            _summary([s / a for s, a in zip(ours, times["AdamW"])]),
            _percent([s / n - 1 for s, n in zip(ours, times["StiefelAdam without frame check"])]),
            f"{1e3 * statistics.median(compiled):.3f}" if compiled else "-",
            _summary([g / c for g, c in zip(geo, compiled)]) if geo and compiled else "-",
        ]
        lines.append("| " + " | ".join(row) + " |")
        print(lines[-1], flush=True)
    table = "\n".join(lines)
    print()
    print(table)
    if args.out:
        args.out.write_text(table + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
