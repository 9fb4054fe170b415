"""How low can an eager step of one small frame go? StiefelAdam at one (20, 10) float32 frame against
the same stages written out with the fewest torch calls, against geoopt and AdamW.

    python benchmarks/bench_small_floor.py [--rounds 5] [--steps 2000] [--threads 1]

"stripped" is the step of docs/algorithm.md for one frame with everything that is not a stage taken
out: g formed at once, the per-frame counts' bias corrections, the trust-region cap, the
Newton-Schulz iterations of the kernel (as many as it takes), the frame check and the one
finiteness test with its wait for the device, and no state written, no grouping, no optimizer
wrapper. Its arithmetic is not certified and it is not for training: it is a floor for an eager
step made of torch operations. "kernel" is torch_impl.functional.stiefel_adam_step alone (the
certified kernel, no bookkeeping). Best of `rounds` repeats of `steps` calls each, the contenders
interleaved; microseconds per step.
"""

from __future__ import annotations

import argparse
import math
import sys
import timeit
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from torch_impl import StiefelAdam, functional, stiefel_init_  # noqa: E402

try:
    import geoopt
except ImportError:  # optional baseline
    geoopt = None

D, R = 20, 10


def _parameter(generator, manifold=None):
    data = stiefel_init_(torch.empty(1, D, R, dtype=torch.float64), generator=generator).float()
    parameter = geoopt.ManifoldParameter(data, manifold=manifold) if manifold is not None else torch.nn.Parameter(data)
    parameter.grad = torch.randn(1, D, R, dtype=torch.float64, generator=generator).float()
    return parameter


def stripped_step(W, G, m, v, t, lr=1e-3, beta1=0.9, beta2=0.999, eps=1e-8, trust_radius=0.5):
    """The stages of one step of frames W (B, D, R) float32 with the fewest calls (see the module docstring)."""
    a, b, c = functional.QUINTIC_COEFFICIENTS
    scale = functional.newton_schulz_scale(trust_radius)
    a_identity = a * torch.eye(R)
    Wt = W.mT
    WtG = torch.bmm(Wt, G)
    K = torch.bmm(Wt, m).mul_(beta1).add_(WtG, alpha=1 - beta1)
    m_new = (m * beta1).add_(G, alpha=1 - beta1).baddbmm_(W, K.add(K.mT).mul_(0.5), alpha=-1)
    g = torch.baddbmm(G, W, WtG.add(WtG.mT).mul_(0.5), alpha=-1)
    v_new = torch.linalg.vector_norm(g, dim=(-2, -1)).square_().mul_((1 - beta2) / (D * R)).add_(v, alpha=beta2)
    count = t + 1
    bias2 = (1 - torch.pow(beta2, count)).float()
    numerator = (-lr / (1 - torch.pow(beta1, count))).float()
    root = torch.sqrt(v_new / bias2)
    coefficient = torch.where(root > 0, torch.reciprocal(root + eps) * numerator, 0.0)
    norm = torch.linalg.vector_norm(m_new, dim=(-2, -1)) * coefficient.abs()
    coefficient = coefficient * torch.where(norm > trust_radius, trust_radius / norm, 1.0)
    A = torch.addcmul(W, m_new, coefficient[:, None, None])
    S = torch.bmm(A.mT, A)
    X = S / scale
    M = torch.baddbmm(torch.add(a_identity, X, alpha=b), X, X, alpha=c).mul_(1 / math.sqrt(scale))
    for _ in range(functional.newton_schulz_iterations(trust_radius, torch.float32) - 1):
        X = torch.bmm(torch.bmm(M, S), M)
        M = torch.bmm(M, torch.baddbmm(torch.add(a_identity, X, alpha=b), X, X, alpha=c))
    W_new = torch.bmm(A, M)
    deviation = torch.linalg.vector_norm(torch.baddbmm(-torch.eye(R), Wt, W), dim=(-2, -1))
    if not bool((torch.isfinite(v_new + W_new.sum(dim=(-2, -1))) & (deviation <= 1e-3)).all()):
        raise ValueError("not a finite step of a frame")
    return W_new, m_new, v_new


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--steps", type=int, default=2000)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    generator = torch.Generator().manual_seed(0)
    frame = _parameter(generator)
    W, G = frame.detach(), frame.grad
    m, v, t = torch.zeros_like(W), torch.zeros(1), torch.zeros(1, dtype=torch.float64)
    contenders = {
        "StiefelAdam.step": StiefelAdam([_parameter(generator)], lr=1e-3).step,
        "kernel": lambda: functional.stiefel_adam_step(W, G, m, v, t, 1e-3),
        "stripped": lambda: stripped_step(W, G, m, v, t),
    }
    if geoopt is not None:
        contenders["geoopt RiemannianAdam"] = geoopt.optim.RiemannianAdam([_parameter(generator, geoopt.EuclideanStiefel())], lr=1e-3).step
    contenders["AdamW"] = torch.optim.AdamW([_parameter(generator)], lr=1e-3).step
    for function in contenders.values():
        function()
    best = {name: math.inf for name in contenders}
    for _ in range(args.rounds):
        for name, function in contenders.items():
            best[name] = min(best[name], timeit.timeit(function, number=args.steps) / args.steps)
    print(f"one ({D}, {R}) float32 frame, torch {torch.__version__}, {args.threads} thread(s), best of {args.rounds} x {args.steps} calls")
    for name, seconds in best.items():
        print(f"{name:24s} {1e6 * seconds:8.1f} us")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
