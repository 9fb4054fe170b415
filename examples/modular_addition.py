"""A one-layer attention model learns (a + b) mod p with W_Q, W_K on the Stiefel manifold.

The query and key projections of every head, W_Q, W_K of shape (heads, d_model, d_head), are
frames trained by torch_impl.StiefelAdam; everything else (embeddings, W_V, W_O, the MLP, the
unembedding) by the same optimizer's manifold="euclidean" group, which is torch.optim's AdamW.
Both groups get the same weight decay. The run shows:

* the frames stay on the manifold: max ||W^T W - I||_F over heads stays at rounding level;
* decay leaves them untouched: ||W_Q||_F^2 = d_head per head throughout (its Riemannian gradient is
  zero, docs/claims.md#p5), while it shrinks the Euclidean weights, whose norms are printed over training.

    python examples/modular_addition.py [--p 23] [--steps 1500] [--out modular_addition.png]

Runs on CPU in well under a minute (full-batch training on half of the p^2 pairs).
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from torch_impl import StiefelAdam, feasibility, stiefel_init_  # noqa: E402


class OneLayerAttention(torch.nn.Module):
    """Tokens (a, b, '=') -> logits over p classes, read at the '=' position.

    Shapes: embed (p + 1, d_model), position (3, d_model), W_Q and W_K (heads, d_model, d_head)
    frames, W_V (heads, d_model, d_head), W_O (heads * d_head, d_model), MLP d_model -> 4 d_model ->
    d_model, unembed (d_model, p).
    """

    def __init__(self, p: int, d_model: int, heads: int, d_head: int, generator: torch.Generator):
        super().__init__()

        def gaussian(*shape, scale):
            return torch.nn.Parameter(torch.randn(shape, generator=generator) * scale)

        self.heads, self.d_head = heads, d_head
        self.embed = gaussian(p + 1, d_model, scale=1.0)
        self.position = gaussian(3, d_model, scale=1.0)
        self.W_Q = torch.nn.Parameter(stiefel_init_(torch.empty(heads, d_model, d_head), generator=generator))
        self.W_K = torch.nn.Parameter(stiefel_init_(torch.empty(heads, d_model, d_head), generator=generator))
        self.W_V = gaussian(heads, d_model, d_head, scale=1 / math.sqrt(d_model))
        self.W_O = gaussian(heads * d_head, d_model, scale=1 / math.sqrt(heads * d_head))
        self.mlp_in = gaussian(d_model, 4 * d_model, scale=1 / math.sqrt(d_model))
        self.mlp_out = gaussian(4 * d_model, d_model, scale=1 / math.sqrt(4 * d_model))
        self.unembed = gaussian(d_model, p, scale=1 / math.sqrt(d_model))

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.embed[tokens] + self.position  # (batch, 3, d_model)
        q = torch.einsum("bsm,hmk->bhsk", x[:, -1:], self.W_Q)  # query at '='
        k = torch.einsum("bsm,hmk->bhsk", x, self.W_K)
        v = torch.einsum("bsm,hmk->bhsk", x, self.W_V)
        attention = torch.softmax(q @ k.transpose(-1, -2) / math.sqrt(self.d_head), dim=-1)
        heads = (attention @ v).squeeze(2).reshape(x.shape[0], -1)  # (batch, heads * d_head)
        h = x[:, -1] + heads @ self.W_O
        h = h + torch.relu(h @ self.mlp_in) @ self.mlp_out
        return h @ self.unembed


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--p", type=int, default=23, help="the modulus (at least 2; default 23)")
    parser.add_argument("--steps", type=int, default=1500)
    parser.add_argument("--weight-decay", type=float, default=1.0)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=None, help="PNG of feasibility and norms (needs matplotlib)")
    args = parser.parse_args(argv)
    if args.p < 2 or args.steps < 1:
        parser.error(f"--p must be at least 2 and --steps at least 1, not {args.p} and {args.steps}")
    if args.out is not None and not args.out.parent.is_dir():
        parser.error(f"--out {args.out}: directory {args.out.parent} does not exist")
    torch.set_num_threads(1)  # tiny tensors: a thread team costs more than it saves
    generator = torch.Generator().manual_seed(args.seed)
    p = args.p
    pairs = torch.cartesian_prod(torch.arange(p), torch.arange(p))
    tokens = torch.cat([pairs, torch.full((p * p, 1), p)], dim=1)
    labels = (pairs[:, 0] + pairs[:, 1]) % p
    order = torch.randperm(p * p, generator=generator)
    train, test = order[: p * p // 2], order[p * p // 2 :]

    model = OneLayerAttention(p, d_model=64, heads=4, d_head=16, generator=generator)
    frames = [model.W_Q, model.W_K]
    euclidean = {name: param for name, param in model.named_parameters() if name not in ("W_Q", "W_K")}
    # one optimizer: the frames, and the ordinary weights in a group stepped by torch.optim's AdamW
    optimizer = StiefelAdam(
        [{"params": frames}, {"params": list(euclidean.values()), "manifold": "euclidean"}],
        lr=3e-3,
        weight_decay=args.weight_decay,
    )

    history = {"step": [], "feasibility": [], "W_Q_norm2": [], **{name: [] for name in euclidean}}
    print(f"modular addition mod {p}: {len(train)} training pairs, StiefelAdam on W_Q, W_K "
          f"(4 heads x (64, 16)), AdamW elsewhere, weight decay {args.weight_decay} on both")
    print(f"{'step':>5} {'loss':>8} {'train':>6} {'test':>6} {'max|WtW-I|':>11} {'|W_Q|^2/head':>13}  "
          + " ".join(f"{name:>9}" for name in euclidean))
    start = time.perf_counter()
    log_every = max(args.steps // 15, 1)
    for step in range(args.steps + 1):
        logits = model(tokens[train])
        loss = torch.nn.functional.cross_entropy(logits, labels[train])
        if step % log_every == 0 or step == args.steps:
            with torch.no_grad():
                train_accuracy = (logits.argmax(-1) == labels[train]).float().mean().item()
                test_accuracy = (model(tokens[test]).argmax(-1) == labels[test]).float().mean().item()
                drift = max(float(feasibility(W).max()) for W in frames)
                norm2 = torch.linalg.matrix_norm(model.W_Q.detach()).square()
                history["step"].append(step)
                history["feasibility"].append(drift)
                history["W_Q_norm2"].append(norm2.tolist())
                for name, param in euclidean.items():
                    history[name].append(float(param.detach().norm()))
            print(f"{step:5d} {loss.item():8.4f} {train_accuracy:6.2f} {test_accuracy:6.2f} {drift:11.2e} "
                  f"{float(norm2.min()):6.3f}-{float(norm2.max()):6.3f}  "
                  + " ".join(f"{history[name][-1]:9.3f}" for name in euclidean))
        if step == args.steps:
            break
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    seconds = time.perf_counter() - start
    shrink = {name: history[name][-1] / history[name][0] for name in euclidean}
    print(f"\n{args.steps} steps in {seconds:.1f} s")
    print(f"frames: max ||W^T W - I||_F over training = {max(history['feasibility']):.2e} (float32 storage, "
          f"u = 2^-24 = {2.0**-24:.1e}); ||W_Q||_F^2 per head stayed in "
          f"[{min(min(v) for v in history['W_Q_norm2']):.6f}, {max(max(v) for v in history['W_Q_norm2']):.6f}] (d_head = 16)")
    print("Euclidean weights, final / initial norm under the same decay: "
          + ", ".join(f"{name} {ratio:.2f}" for name, ratio in shrink.items()))

    if args.out is not None:
        try:
            import matplotlib

            matplotlib.use("Agg")
            import matplotlib.pyplot as plt
        except ImportError:
            print("matplotlib is not installed: no plot written", file=sys.stderr)
            return 0
        figure, (left, right) = plt.subplots(1, 2, figsize=(11, 4))
        left.semilogy(history["step"], history["feasibility"], marker="o")
        left.set(xlabel="step", ylabel="max ||W^T W - I||_F (W_Q, W_K)", title="frames stay on the manifold")
        for name in euclidean:
            right.plot(history["step"], np.array(history[name]) / history[name][0], label=name)
        right.plot(history["step"], np.mean(history["W_Q_norm2"], axis=1) / 16.0, "k--", lw=2, label="||W_Q||_F^2 / d_head")
        right.set(xlabel="step", ylabel="norm / initial norm", title=f"weight decay {args.weight_decay}: frames untouched")
        right.legend(fontsize=7)
        figure.tight_layout()
        try:
            figure.savefig(args.out, dpi=120)
        except OSError as error:
            print(f"--out {args.out}: cannot be written ({error.strerror or error})", file=sys.stderr)
            return 2
        print(f"plot written to {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
