"""clip_grad_norm_finite_: a NaN in one head of a (heads, d, r) frame parameter is left to
skip_nonfinite alone, while the other heads and the ordinary tensors are clipped by the norm over
the finite units, which is what torch.nn.utils.clip_grad_norm_ gives when nothing is NaN."""

import math

import pytest

torch = pytest.importorskip("torch")

from torch_impl import StiefelAdam, clip_grad_norm_finite_, stiefel_init_  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_torch_thread")

# the total of torch's clip_grad_norm_ and ours are the same sum of squares in another order: n
# terms of a float32 sum differ by at most about 2 n u relative (n = the number of gradient
# entries, here 2 * 4 * 16 * 4 + 12 + 4 = 528, u = 2^-24), 6.3e-5; the scaled gradients inherit it
REDUCTION_ORDER = 2 * 528 * 2.0**-24


def _model(seed=0):
    generator = torch.Generator().manual_seed(seed)
    frames = [torch.nn.Parameter(stiefel_init_(torch.empty(4, 16, 4), generator)) for _ in range(2)]
    ordinary = [torch.nn.Parameter(torch.randn(3, 4, generator=generator)), torch.nn.Parameter(torch.randn(4, generator=generator))]
    for p in frames + ordinary:
        p.grad = 3.0 * torch.randn(p.shape, generator=generator)
    return frames, ordinary


def test_without_a_nan_it_clips_as_torch_does():
    frames, ordinary = _model()
    twins = [torch.nn.Parameter(p.detach().clone()) for p in frames + ordinary]
    for twin, p in zip(twins, frames + ordinary):
        twin.grad = p.grad.clone()
    expected = torch.nn.utils.clip_grad_norm_(twins, 1.0)
    optimizer = StiefelAdam([{"params": frames}, {"params": ordinary, "manifold": "euclidean"}])
    total = clip_grad_norm_finite_(optimizer.param_groups, 1.0)
    assert float(total) == pytest.approx(float(expected), rel=REDUCTION_ORDER)
    for p, twin in zip(frames + ordinary, twins):
        assert torch.allclose(p.grad, twin.grad, rtol=REDUCTION_ORDER, atol=0.0)


@pytest.mark.parametrize("norm_type", [2.0, math.inf])
def test_one_nan_head_is_left_alone_while_the_rest_clip(norm_type):
    """Head 2 of the first frame parameter has a NaN: it keeps its gradient (NaN and all), every
    other head and tensor is scaled by max_norm / (total over the finite units), and StiefelAdam
    with skip_nonfinite then skips that head alone."""
    frames, ordinary = _model(1)
    frames[0].grad[2, 5, 1] = math.nan
    before = [p.grad.clone() for p in frames + ordinary]
    finite_units = [frames[0].grad[k] for k in (0, 1, 3)] + [frames[1].grad] + [p.grad for p in ordinary]
    expected_total = torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g, norm_type) for g in finite_units]), norm_type)
    optimizer = StiefelAdam([{"params": frames}, {"params": ordinary, "manifold": "euclidean"}], lr=0.01, skip_nonfinite=True)
    total = clip_grad_norm_finite_(optimizer.param_groups, 1.0, norm_type)
    assert math.isfinite(float(total))
    assert float(total) == pytest.approx(float(expected_total), rel=REDUCTION_ORDER)
    scale = 1.0 / (float(total) + 1e-6)
    assert scale < 0.5  # the gradients were large: clipping happened
    # the NaN head as it was (NaN != NaN: the NaN's place, then the other entries)
    assert torch.equal(torch.isnan(frames[0].grad[2]), torch.isnan(before[0][2]))
    finite_entries = ~torch.isnan(before[0][2])
    assert torch.equal(frames[0].grad[2][finite_entries], before[0][2][finite_entries])
    for k in (0, 1, 3):
        assert torch.allclose(frames[0].grad[k], before[0][k] * scale, rtol=1e-6, atol=0.0)
    for p, old in zip(frames[1:] + ordinary, before[1:]):
        assert torch.allclose(p.grad, old * scale, rtol=1e-6, atol=0.0)
    stepped = [p.detach().clone() for p in frames]
    optimizer.step()
    assert optimizer.skipped_steps == 1
    assert torch.equal(frames[0].detach()[2], stepped[0][2])
    assert all(not torch.equal(frames[0].detach()[k], stepped[0][k]) for k in (0, 1, 3))


def test_a_nonfinite_ordinary_tensor_is_one_unit_and_plain_tensors_are_units():
    frames, ordinary = _model(2)
    ordinary[0].grad[1, 1] = math.inf
    before = ordinary[0].grad.clone()

    def finite_total():
        return float(torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(p.grad) for p in frames + ordinary[1:]])))

    expected = finite_total()
    total = clip_grad_norm_finite_(frames + ordinary, 0.5)  # plain tensors: each one unit, a frame parameter too
    assert float(total) == pytest.approx(expected, rel=REDUCTION_ORDER)  # the total before clipping, as torch returns it
    assert torch.equal(ordinary[0].grad, before)
    assert finite_total() == pytest.approx(0.5, rel=1e-5)


def test_bad_arguments_are_refused():
    frames, _ = _model(3)
    with pytest.raises(ValueError, match="max_norm must be > 0"):
        clip_grad_norm_finite_(frames, 0.0)
    with pytest.raises(ValueError, match="tensors or param groups"):
        clip_grad_norm_finite_([1.0], 1.0)
    assert float(clip_grad_norm_finite_([torch.nn.Parameter(torch.zeros(3))], 1.0)) == 0.0
