"""examples/train_attention.py runs end to end: one optimizer for frames and ordinary weights, a
cosine schedule, clipping, bfloat16 autocast, and a checkpoint that resumes bit for bit."""

import importlib.util
import re
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from torch_impl import functional  # noqa: E402

EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "train_attention.py"


def _load():
    spec = importlib.util.spec_from_file_location("train_attention", EXAMPLE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_training_example_learns_resumes_bit_for_bit_and_keeps_frames(capsys, tmp_path):
    example = _load()
    threads = torch.get_num_threads()
    try:
        status = example.main(["--steps", "60", "--checkpoint", str(tmp_path / "half.pt")])
    finally:
        torch.set_num_threads(threads)
    out = capsys.readouterr().out
    assert status == 0 and "bit for bit the same" in out
    first, last = map(float, re.search(r"loss ([\d.]+) -> ([\d.]+)", out).groups())
    assert last < 0.1 * first  # ln 16 = 2.77 for a uniform guess: the attention pattern was learned
    drift = float(re.search(r"accuracy [\d.]+, max \|\|W\^T W - I\|\| ([\d.e+-]+)", out).group(1))
    # float32 frames: what the kernel guarantees of the frames it returns
    assert drift <= functional.frame_drift_bound(32, 8, torch.float32, 0.5)
    saved = torch.load(tmp_path / "half.pt", weights_only=True)
    kinds = [group["manifold"] for group in saved["optimizer"]["param_groups"]]
    assert kinds == ["stiefel", "euclidean"]


def test_the_shortest_runs_work_and_shorter_ones_are_refused_in_one_line(capsys):
    """Two steps (one per half) resume bit for bit; fewer are refused by the argument parser, not
    by an AttributeError after training."""
    example = _load()
    assert example.main(["--steps", "2"]) == 0
    assert "bit for bit the same" in capsys.readouterr().out
    with pytest.raises(SystemExit) as refused:
        example.main(["--steps", "1"])
    assert refused.value.code == 2 and "must be at least 2" in capsys.readouterr().err
