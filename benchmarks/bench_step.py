"""Time per optimizer step: torch_impl.StiefelAdam against torch.optim.AdamW and geoopt.

For each (heads, d, r) and dtype, one parameter of shape (heads, d, r) (the W_Q of all heads of a
layer) with a fixed random gradient; each optimizer's `step()` is timed alone (warm-up first, then
the median over repetitions), and every ratio is between medians measured in the same run:

    python benchmarks/bench_step.py [--shapes 1,64,16 8,256,32 ...] [--dtypes float32 float64]
                                    [--device cpu|cuda] [--min-time 1.0] [--out table.md]

Baselines: AdamW default, foreach=True and fused=True (Euclidean, no manifold: the floor of what a
step on these parameters can cost), and geoopt's RiemannianAdam on EuclideanStiefel and
CanonicalStiefel (skipped with a message when geoopt is not installed).
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

try:
    import geoopt
except ImportError:  # optional baseline
    geoopt = None

DEFAULT_SHAPES = ((1, 64, 16), (8, 256, 32), (12, 768, 64), (32, 1024, 128))
DTYPES = {"float32": torch.float32, "float64": torch.float64, "bfloat16": torch.bfloat16}


def _synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def time_step(optimizer, device, min_time: float, min_reps: int = 5, max_reps: int = 200) -> float:
    """Median seconds of optimizer.step() after 3 warm-up steps."""
    for _ in range(3):
        optimizer.step()
    _synchronize(device)
    times = []
    total = 0.0
    while (total < min_time or len(times) < min_reps) and len(times) < max_reps:
        start = time.perf_counter()
        optimizer.step()
        _synchronize(device)
        elapsed = time.perf_counter() - start
        times.append(elapsed)
        total += elapsed
    return statistics.median(times)


def make_parameter(shape, dtype, device, generator, manifold=None):
    data = stiefel_init_(torch.empty(shape, dtype=torch.float64, device=device), generator=generator).to(dtype)
    if manifold is not None:
        parameter = geoopt.ManifoldParameter(data, manifold=manifold)
    else:
        parameter = torch.nn.Parameter(data)
    parameter.grad = torch.randn(shape, dtype=torch.float64, device=device, generator=generator).to(dtype)
    return parameter


def optimizers_for(shape, dtype, device, generator):
    """(name, optimizer) pairs; geoopt's are left out (with a message) if it is missing."""
    out = []
    out.append(("StiefelAdam", StiefelAdam([make_parameter(shape, dtype, device, generator)], lr=1e-3)))
    out.append(("AdamW default", torch.optim.AdamW([make_parameter(shape, dtype, device, generator)], lr=1e-3)))
    out.append(("AdamW foreach", torch.optim.AdamW([make_parameter(shape, dtype, device, generator)], lr=1e-3, foreach=True)))
    if dtype != torch.bfloat16 or device.type == "cuda":
        out.append(("AdamW fused", torch.optim.AdamW([make_parameter(shape, dtype, device, generator)], lr=1e-3, fused=True)))
    if geoopt is not None:
        for name, manifold in (("geoopt EuclideanStiefel", geoopt.EuclideanStiefel()), ("geoopt CanonicalStiefel", geoopt.CanonicalStiefel())):
            out.append((name, geoopt.optim.RiemannianAdam([make_parameter(shape, dtype, device, generator, manifold)], lr=1e-3)))
    return out


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shapes", nargs="*", default=[",".join(map(str, s)) for s in DEFAULT_SHAPES],
                        help="heads,d,r triples")
    parser.add_argument("--dtypes", nargs="*", default=["float32", "float64"], choices=list(DTYPES))
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--min-time", type=float, default=1.0, help="seconds of timed steps per entry (at least 5 steps)")
    parser.add_argument("--threads", type=int, default=None, help="torch.set_num_threads (default: torch's)")
    parser.add_argument("--out", type=Path, default=None, help="also write the Markdown table here")
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    shapes = [tuple(int(x) for x in s.split(",")) for s in args.shapes]
    if geoopt is None:
        print("geoopt is not installed: its RiemannianAdam baselines are skipped (pip install geoopt)", file=sys.stderr)

    lines = [
        f"StiefelAdam step time, torch {torch.__version__}, device {device}, {torch.get_num_threads()} threads; "
        "median over repetitions, ratios from the same run",
        "",
        "| heads, d, r | dtype | optimizer | ms / step | x AdamW default | geoopt EuclideanStiefel / this |",
        "|---|---|---|---:|---:|---:|",
    ]
    generator = torch.Generator(device=device).manual_seed(0)
    for shape in shapes:
        for dtype_name in args.dtypes:
            dtype = DTYPES[dtype_name]
            medians = {}
            for name, optimizer in optimizers_for(shape, dtype, device, generator):
                try:
                    medians[name] = time_step(optimizer, device, args.min_time)
                except Exception as error:  # a baseline that does not support this dtype/shape
                    print(f"{name} at {shape} {dtype_name}: {type(error).__name__}: {error}", file=sys.stderr)
            adamw = medians.get("AdamW default")
            geoopt_euclidean = medians.get("geoopt EuclideanStiefel")
            for name, seconds in medians.items():
                versus_adamw = f"{seconds / adamw:.2f}" if adamw else "-"
                speedup = f"{geoopt_euclidean / seconds:.2f}" if geoopt_euclidean and name == "StiefelAdam" else ""
                lines.append(f"| {shape} | {dtype_name} | {name} | {1e3 * seconds:.3f} | {versus_adamw} | {speedup} |")
            print(lines[-len(medians):] and "\n".join(lines[-len(medians):]), flush=True)
    table = "\n".join(lines)
    print()
    print(table)
    if args.out:
        args.out.write_text(table + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
