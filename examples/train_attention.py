"""One optimizer for a whole attention model: frames W_Q, W_K on the Stiefel manifold, ordinary
weights elsewhere, with what a real training loop uses.

A one-layer, four-head attention model learns to output, at every position, the token one place
back (a task that needs the attention pattern, so the frames must move). One `StiefelAdam` holds
two param groups, `{"params": [W_Q, W_K]}` (frames, the default manifold) and
`{"params": rest, "manifold": "euclidean", "weight_decay": 0.01}` (stepped by torch.optim's
AdamW), under one cosine schedule (its lr a 0-d tensor, as for a compiled step), with gradient
clipping over the finite frames and tensors (`clip_grad_norm_finite_`: a NaN in one head leaves
that head to skip_nonfinite instead of turning every gradient into NaN), bfloat16 autocast and
skip_nonfinite=True. Half way it saves a checkpoint (model, optimizer, scheduler), and at the end
it resumes from that checkpoint into fresh objects, trains the second half again, and checks that
the two runs end bit for bit the same.

    python examples/train_attention.py [--steps 200] [--seed 0] [--checkpoint FILE]

Prints the loss, the accuracy and max ||W^T W - I||_F of the frames; exit status 1 if the resumed
run differs. Runs on CPU in a few seconds.
"""

from __future__ import annotations

import argparse
import io
import math
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from torch_impl import StiefelAdam, clip_grad_norm_finite_, feasibility, stiefel_init_  # noqa: E402

VOCABULARY, LENGTH = 16, 12


class PreviousTokenAttention(torch.nn.Module):
    """tokens (batch, LENGTH) -> logits (batch, LENGTH, VOCABULARY); causal, four heads."""

    def __init__(self, d_model=32, heads=4, d_head=8, seed=0):
        super().__init__()
        generator = torch.Generator().manual_seed(seed)

        def gaussian(*shape):
            return torch.nn.Parameter(torch.randn(shape, generator=generator) / math.sqrt(shape[-2] if len(shape) > 1 else 1))

        self.embed = torch.nn.Parameter(torch.randn(VOCABULARY, d_model, generator=generator))
        self.position = torch.nn.Parameter(torch.randn(LENGTH, d_model, generator=generator))
        self.W_Q = torch.nn.Parameter(stiefel_init_(torch.empty(heads, d_model, d_head), generator))
        self.W_K = torch.nn.Parameter(stiefel_init_(torch.empty(heads, d_model, d_head), generator))
        self.W_V = gaussian(heads, d_model, d_head)
        self.W_O = gaussian(heads * d_head, d_model)
        self.unembed = gaussian(d_model, VOCABULARY)
        self.temperature = math.sqrt(d_head)

    def frames(self):
        return [self.W_Q, self.W_K]

    def ordinary(self):
        return [p for name, p in self.named_parameters() if name not in ("W_Q", "W_K")]

    def forward(self, tokens):
        x = self.embed[tokens] + self.position
        q = torch.einsum("bsm,hmk->bhsk", x, self.W_Q)
        k = torch.einsum("bsm,hmk->bhsk", x, self.W_K)
        v = torch.einsum("bsm,hmk->bhsk", x, self.W_V)
        # scores scaled up: a frame's columns have unit norm, so logits need the gain to sharpen
        scores = 4.0 * q @ k.transpose(-1, -2) / self.temperature
        mask = torch.ones(LENGTH, LENGTH, dtype=torch.bool).tril()
        attention = torch.softmax(scores.masked_fill(~mask, -math.inf), dim=-1)
        heads = (attention @ v).transpose(1, 2).reshape(tokens.shape[0], LENGTH, -1)
        return (x + heads @ self.W_O) @ self.unembed


def batch(step: int, size: int = 64):
    """The batch of a step, from the step number alone (so a resumed run sees the same data)."""
    tokens = torch.randint(VOCABULARY, (size, LENGTH), generator=torch.Generator().manual_seed(1000 + step))
    return tokens, tokens.roll(1, dims=1)  # target at position i: the token at i - 1 (position 0: the last)


def make(seed: int, steps: int):
    model = PreviousTokenAttention(seed=seed)
    optimizer = StiefelAdam(
        [
            {"params": model.frames()},
            {"params": model.ordinary(), "manifold": "euclidean", "weight_decay": 0.01},
        ],
        lr=torch.tensor(1e-2),  # a tensor: the scheduler fills it in place
        skip_nonfinite=True,
    )
    scheduler = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=steps)
    return model, optimizer, scheduler


def train(model, optimizer, scheduler, steps, log=None):
    """Train over the given step numbers; returns the last loss and accuracy."""
    loss = accuracy = math.nan
    for step in steps:
        tokens, targets = batch(step)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            logits = model(tokens)
        # the first position has no previous token to look at: it is not scored
        loss = torch.nn.functional.cross_entropy(logits[:, 1:].float().reshape(-1, VOCABULARY), targets[:, 1:].reshape(-1))
        optimizer.zero_grad()
        loss.backward()
        clip_grad_norm_finite_(optimizer.param_groups, max_norm=1.0)
        optimizer.step()
        scheduler.step()
        accuracy = float((logits[:, 1:].argmax(-1) == targets[:, 1:]).float().mean())
        if log is not None:
            log(step, float(loss.detach()), accuracy, model)
    return float(loss.detach()) if torch.is_tensor(loss) else loss, accuracy


def checkpoint(model, optimizer, scheduler) -> bytes:
    buffer = io.BytesIO()
    torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict(), "scheduler": scheduler.state_dict()}, buffer)
    return buffer.getvalue()


def restore(blob: bytes, seed: int, steps: int):
    saved = torch.load(io.BytesIO(blob), weights_only=True)
    model, optimizer, scheduler = make(seed + 1, steps)  # other initial values: everything must come from the file
    model.load_state_dict(saved["model"])
    optimizer.load_state_dict(saved["optimizer"])
    scheduler.load_state_dict(saved["scheduler"])
    return model, optimizer, scheduler


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0].replace("\n", " "))
    parser.add_argument("--steps", type=int, default=200, help="training steps, at least 2: a first half that ends in "
                        "the checkpoint, and a second half trained twice (default 200)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--checkpoint", type=Path, default=None, help="also write the half-way checkpoint here")
    args = parser.parse_args(argv)
    if args.steps < 2:
        parser.error(f"argument --steps: must be at least 2 (a first half ending in the checkpoint and a second half), not {args.steps}")
    torch.set_num_threads(1)  # small tensors: a thread team costs more than it saves
    half = args.steps // 2
    every = max(args.steps // 10, 1)

    def log(step, loss, accuracy, model):
        if step % every == 0 or step == args.steps - 1:
            drift = max(float(feasibility(W.detach()).max()) for W in model.frames())
            print(f"{step:5d}  loss {loss:7.4f}  accuracy {accuracy:5.2f}  max ||W^T W - I|| {drift:.1e}")

    start = time.perf_counter()
    model, optimizer, scheduler = make(args.seed, args.steps)
    first_loss, _ = train(model, optimizer, scheduler, range(0, 1))
    train(model, optimizer, scheduler, range(1, half), log)
    blob = checkpoint(model, optimizer, scheduler)
    if args.checkpoint is not None:
        args.checkpoint.write_bytes(blob)
    loss, accuracy = train(model, optimizer, scheduler, range(half, args.steps), log)
    resumed = restore(blob, args.seed, args.steps)
    train(*resumed, range(half, args.steps))
    identical = all(torch.equal(a, b) for a, b in zip(model.state_dict().values(), resumed[0].state_dict().values()))
    drift = max(float(feasibility(W.detach()).max()) for W in model.frames())
    print(f"{args.steps} steps in {time.perf_counter() - start:.1f} s: loss {first_loss:.3f} -> {loss:.3f}, "
          f"accuracy {accuracy:.2f}, max ||W^T W - I|| {drift:.1e}, skipped frames {optimizer.skipped_steps}")
    print(f"resumed from the step-{half} checkpoint: {'bit for bit the same' if identical else 'DIFFERENT'}")
    return 0 if identical else 1


if __name__ == "__main__":
    raise SystemExit(main())
