"""A frame that is not on St(d, r) when a step begins is never stepped silently: the per-step check
(||W^T W - I||_F against manifold_tolerance, one batched Gram product) refuses it in the error mode
with a message naming the manifold, the group, the parameter, the frame, the deviation, the
tolerance and the way back, skips and counts it apart under skip_nonfinite, and, under
torch.compile, refuses on the device and raises at the next eager call. Parameters built on the meta
device are accepted and checked once they have values."""

import copy
import math
import re

import pytest

torch = pytest.importorskip("torch")

from torch_impl import StiefelAdam, feasibility, functional, manifold_tolerance, stiefel_init_, stiefel_project_  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def _frames(shape, seed, dtype=torch.float64):
    return stiefel_init_(torch.empty(shape, dtype=torch.float64), torch.Generator().manual_seed(seed)).to(dtype)


def _snapshot(optimizer, params):
    return [(p.detach().clone(), copy.deepcopy(dict(optimizer.state[p]))) for p in params]


def _unchanged(optimizer, params, snapshot):
    for p, (value, state) in zip(params, snapshot):
        assert torch.equal(p.detach(), value)
        assert set(optimizer.state[p]) == set(state)
        for key, old in state.items():
            assert torch.equal(optimizer.state[p][key], old)


def _two_buckets(skip, dtype=torch.float64):
    """p0 (3, 8, 3) in group 0, p1 (3, 8, 3) and p2 (6, 2) in group 1 (other lr): three buckets."""
    params = [torch.nn.Parameter(_frames(shape, seed, dtype)) for shape, seed in (((3, 8, 3), 0), ((3, 8, 3), 1), ((6, 2), 2))]
    optimizer = StiefelAdam([{"params": params[:1], "lr": 0.03}, {"params": params[1:]}], lr=0.05, skip_nonfinite=skip)
    return params, optimizer


def _gradients(params, seed):
    generator = torch.Generator().manual_seed(seed)
    for p in params:
        p.grad = torch.randn(p.shape, dtype=torch.float64, generator=generator).to(p.dtype)


def test_an_edited_frame_is_refused_by_name_and_nothing_is_written():
    params, optimizer = _two_buckets(skip=False)
    _gradients(params, 3)
    optimizer.step()
    with torch.no_grad():
        params[1][2].mul_(2.0)  # frame 2 of params[0] of group 1: W^T W = 4 I
    _gradients(params, 4)
    before = _snapshot(optimizer, params)
    tol = manifold_tolerance(8, 3, torch.float64)
    with pytest.raises(ValueError) as raised:
        optimizer.step()
    message = str(raised.value)
    assert message.startswith("params[0] of param group 1, frame 2 of its (3,) frames: not on the Stiefel manifold St(8, 3)")
    deviation = float(re.search(r"\|\|W\^T W - I\|\|_F = ([\d.e+-]+)", message).group(1))
    assert deviation == pytest.approx(3.0 * math.sqrt(3), rel=1e-2)  # ||4 I - I||_F for r = 3
    assert f"{tol:.2e} (the tolerance for torch.float64)" in message
    assert "no parameter or state was changed" in message and "torch_impl.stiefel_project_" in message
    _unchanged(optimizer, params, before)
    stiefel_project_(params[1])  # the way back: the nearest frame, here the frame before the edit
    assert float(feasibility(params[1].detach()).max()) <= tol
    assert torch.allclose(params[1].detach(), before[1][0] * torch.tensor([1.0, 1.0, 0.5], dtype=torch.float64)[:, None, None])
    optimizer.step()
    assert torch.equal(optimizer.state[params[1]]["step"], torch.full((3,), 2.0, dtype=torch.float64))


def test_under_skip_nonfinite_an_edited_frame_is_skipped_alone_and_counted_apart():
    """Frame 1 of p1 scaled, a NaN in frame 0 of p0: each keeps its frame, moments and count; every
    other frame steps exactly as alone; off_manifold_steps and skipped_steps count one each."""
    params, optimizer = _two_buckets(skip=True)
    _gradients(params, 5)
    optimizer.step()
    with torch.no_grad():
        params[1][1].mul_(1.0 + 1e-3)
    _gradients(params, 6)
    params[0].grad[0, 4, 1] = math.nan
    before = _snapshot(optimizer, params)
    expected = []
    for p, lr in zip(params, (0.03, 0.05, 0.05)):
        state = optimizer.state[p]
        expected.append(functional.stiefel_adam_step(p.detach(), p.grad, state["exp_avg"], state["exp_avg_sq"], state["step"], lr,
                                                     0.9, 0.999, 1e-8, 0.5, 0.0, sync_free=True))
    optimizer.step()
    assert optimizer.off_manifold_steps == 1 and optimizer.skipped_steps == 1
    kept = {(0, 0), (1, 1)}
    for index, (p, (W_before, state_before), (W_new, m_new, v_new)) in enumerate(zip(params, before, expected)):
        state = optimizer.state[p]
        for frame in range(p.shape[0] if p.dim() == 3 else 1):
            where = (frame,) if p.dim() == 3 else ()
            if (index, frame) in kept:
                assert torch.equal(p.detach()[where], W_before[where])
                assert torch.equal(state["exp_avg"][where], state_before["exp_avg"][where])
                assert torch.equal(state["step"][where], state_before["step"][where])
            else:
                assert torch.equal(p.detach()[where], W_new[where])
                assert torch.equal(state["exp_avg"][where], m_new[where])
                assert torch.equal(state["step"][where], state_before["step"][where] + 1)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.bfloat16])
def test_the_tolerance_tells_a_frame_just_off_from_one_on(dtype):
    """W (1 + s) has ||W^T W - I||_F = ((1 + s)^2 - 1) sqrt(r): at twice the tolerance it is
    refused, and a stored stiefel_init_ frame (at most the tolerance's rounding part) is stepped."""
    d, r = 16, 4
    tol = manifold_tolerance(d, r, dtype)
    scale = math.sqrt(1.0 + 2.0 * tol / math.sqrt(r))
    off = torch.nn.Parameter((_frames((d, r), 7) * scale).to(dtype))
    assert float(feasibility(off.detach())) > 1.5 * tol  # after rounding to dtype, still well beyond
    optimizer = StiefelAdam([torch.nn.Parameter(_frames((d, r), 7, dtype))], skip_nonfinite=True)
    optimizer.param_groups[0]["params"][0].grad = torch.randn(d, r).to(dtype)
    optimizer.step()
    assert optimizer.off_manifold_steps == 0
    refusing = StiefelAdam([torch.nn.Parameter(_frames((d, r), 7, dtype))], skip_nonfinite=True)
    with torch.no_grad():
        refusing.param_groups[0]["params"][0].copy_(off)
    refusing.param_groups[0]["params"][0].grad = torch.randn(d, r).to(dtype)
    refusing.step()
    assert refusing.off_manifold_steps == 1


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.bfloat16])
@pytest.mark.parametrize("trust_radius", [0.1, 0.5, 0.75])
def test_frames_the_kernel_returns_pass_the_check_at_every_shape(dtype, trust_radius):
    """The check never refuses the kernel's own frames: frame_drift_bound (the kernel's guarantee on
    what it returns, Newton-Schulz route) plus the check's own evaluation error (d r + r) u_c is
    within manifold_tolerance for every shape up to d = 4096."""
    u_c = functional.unit_roundoff(functional.compute_dtype(dtype))
    for d in (1, 2, 3, 5, 8, 16, 64, 256, 1024, 4096):
        for r in sorted({1, min(2, d), max(1, d // 4), d}):
            allowed = functional.frame_drift_bound(d, r, dtype, trust_radius) + (d * r + r) * u_c
            assert allowed <= manifold_tolerance(d, r, dtype), (d, r)


def test_a_long_low_precision_run_never_trips_the_check():
    for dtype in (torch.float32, torch.bfloat16):
        p = torch.nn.Parameter(_frames((4, 32, 8), 8, dtype))
        optimizer = StiefelAdam([p], lr=0.05, skip_nonfinite=True)
        generator = torch.Generator().manual_seed(9)
        for _ in range(200):
            p.grad = torch.randn(p.shape, generator=generator).to(dtype)
            optimizer.step()
        assert optimizer.off_manifold_steps == 0 and optimizer.skipped_steps == 0


def test_a_parameter_built_on_the_meta_device_is_checked_once_it_has_values():
    """Lazy initialisation: the optimizer is built over meta parameters (no values to read), the
    module is materialised with to_empty (keeping the parameter objects) and initialised; the steps
    equal those of an optimizer built on the materialised frames. Left uninitialised, the first step
    refuses it."""
    class Layer(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.W_Q = torch.nn.Parameter(torch.empty(2, 8, 3))
            self.bias = torch.nn.Parameter(torch.empty(3))

    swap = torch.__future__.get_swap_module_params_on_conversion()
    torch.__future__.set_swap_module_params_on_conversion(True)
    try:
        with torch.device("meta"):
            layers = [Layer(), Layer()]
        optimizers = [StiefelAdam([{"params": [layer.W_Q]}, {"params": [layer.bias], "manifold": "euclidean"}], lr=0.05) for layer in layers]
        for layer in layers:
            layer.to_empty(device="cpu")
    finally:
        torch.__future__.set_swap_module_params_on_conversion(swap)
    assert layers[0].W_Q is optimizers[0].param_groups[0]["params"][0] and layers[0].W_Q.device.type == "cpu"
    with torch.no_grad():
        stiefel_init_(layers[0].W_Q, torch.Generator().manual_seed(10))
        layers[0].bias.zero_()
        layers[1].W_Q.fill_(0.5)  # not a frame
    twin = torch.nn.Parameter(layers[0].W_Q.detach().clone())
    reference = StiefelAdam([twin], lr=0.05)
    for step in range(3):
        G = torch.randn(2, 8, 3, generator=torch.Generator().manual_seed(11 + step))
        layers[0].W_Q.grad, twin.grad, layers[0].bias.grad = G.clone(), G.clone(), torch.ones(3)
        optimizers[0].step(), reference.step()
    assert torch.equal(layers[0].W_Q.detach(), twin.detach())
    layers[1].W_Q.grad = torch.ones(2, 8, 3)
    with pytest.raises(ValueError, match=r"params\[0\] of param group 0, frame 0 of its \(2,\) frames: not on the Stiefel manifold St\(8, 3\)"):
        optimizers[1].step()


def test_a_meta_parameter_left_behind_by_to_empty_is_named_at_step():
    """Without swapping, Module.to_empty makes new parameters: the optimizer's are still on meta and
    would never see a gradient. The step says so instead of training nothing."""
    with torch.device("meta"):
        layer = torch.nn.Linear(4, 3)
        frames = torch.nn.Parameter(torch.empty(8, 3))
    optimizer = StiefelAdam([{"params": [frames]}, {"params": layer.parameters(), "manifold": "euclidean"}])
    layer.to_empty(device="cpu")
    with pytest.raises(ValueError, match=r"params\[0\] of param group 0 is on the meta device.*set_swap_module_params_on_conversion"):
        optimizer.step()


def test_load_state_dict_checks_the_frames_it_resumes():
    p = torch.nn.Parameter(_frames((2, 6, 2), 12))
    optimizer = StiefelAdam([p], lr=0.05)
    p.grad = torch.randn(2, 6, 2, dtype=torch.float64)
    optimizer.step()
    saved = copy.deepcopy(optimizer.state_dict())
    other = torch.nn.Parameter(_frames((2, 6, 2), 13))
    resumed = StiefelAdam([other], lr=0.05)
    with torch.no_grad():
        other.copy_(torch.randn(2, 6, 2, dtype=torch.float64))  # other weights loaded into the frame
    with pytest.raises(ValueError, match=r"params\[0\] of param group 0 must satisfy W\^T W = I.*stiefel_project_"):
        resumed.load_state_dict(saved)


@pytest.mark.parametrize("skip", [False, True])
def test_a_compiled_step_refuses_on_the_device_and_the_next_eager_call_raises(skip):
    """torch.compile(optimizer.step) (aot_eager: the functionalised graph, as inductor compiles it).
    Error mode: a NaN in one frame, then an edited frame: the compiled step writes nothing at all
    (frames, moments, counts, and the AdamW group), keeps the gradients, and zero_grad raises the
    eager step's ValueError. skip_nonfinite: the frame is skipped and counted, nothing raises."""
    params = [torch.nn.Parameter(_frames((3, 8, 3), seed, torch.float32)) for seed in (14, 15)]
    linear = torch.nn.Linear(3, 2)
    everything = params + list(linear.parameters())
    optimizer = StiefelAdam([{"params": params}, {"params": linear.parameters(), "manifold": "euclidean"}],
                            lr=torch.tensor(0.02), skip_nonfinite=skip)
    compiled = torch.compile(optimizer.step, backend="aot_eager")
    generator = torch.Generator().manual_seed(16)

    def gradients():
        for p in everything:
            p.grad = torch.randn(p.shape, generator=generator)

    for _ in range(2):
        gradients()
        compiled()
    for breakage, pattern in (("nan", r"params\[0\] of param group 0: gradient must be finite"),
                              ("edit", r"params\[1\] of param group 0, frame 1 of its \(3,\) frames: not on the Stiefel manifold")):
        gradients()
        if breakage == "nan":
            params[0].grad[2, 0, 0] = math.nan
        else:
            with torch.no_grad():
                params[1][1].mul_(1.5)
        before = _snapshot(optimizer, everything)
        compiled()
        if skip:
            assert (optimizer.skipped_steps, optimizer.off_manifold_steps) == ((1, 0) if breakage == "nan" else (1, 1))
            continue
        _unchanged(optimizer, everything, before)
        with pytest.raises(ValueError, match=pattern):
            optimizer.zero_grad()
        assert params[0].grad is not None  # raised before clearing: the refused step's gradients
        optimizer.zero_grad()  # raised once
        if breakage == "edit":
            stiefel_project_(params[1])
    gradients()
    compiled()
    optimizer.zero_grad()


def test_a_compiled_first_step_that_is_refused_leaves_fresh_state_only():
    """Refused at the very first compiled step (its state is created inside it): the frames and the
    AdamW tensors keep their values, the state that step created is the zero state with count 0,
    and the next step is the first step of a fresh optimizer, bit for bit (both compiled alike:
    torch.optim's AdamW takes another route for its bias corrections when compiled)."""
    frames = _frames((2, 8, 3), 17, torch.float32)
    weight = torch.randn(2, 3, generator=torch.Generator().manual_seed(18))
    grads = [torch.randn(2, 8, 3, generator=torch.Generator().manual_seed(19)), torch.randn(2, 3, generator=torch.Generator().manual_seed(20))]
    runs = []
    for refused_first in (True, False):
        params = [torch.nn.Parameter(frames.clone()), torch.nn.Parameter(weight.clone())]
        optimizer = StiefelAdam([{"params": params[:1]}, {"params": params[1:], "manifold": "euclidean"}], lr=torch.tensor(0.02))
        step = torch.compile(optimizer.step, backend="aot_eager")
        if refused_first:
            params[0].grad, params[1].grad = grads[0].clone(), grads[1].clone()
            params[0].grad[1, 0, 0] = math.nan
            step()
            assert torch.equal(params[0].detach(), frames) and torch.equal(params[1].detach(), weight)
            for p in params:
                assert len(optimizer.state[p]) and all(not value.any() for value in optimizer.state[p].values())
            with pytest.raises(ValueError, match="gradient must be finite"):
                optimizer.zero_grad()
        params[0].grad, params[1].grad = grads[0].clone(), grads[1].clone()
        step()
        runs.append([p.detach().clone() for p in params] + [optimizer.state[p][key].clone() for p in params for key in sorted(optimizer.state[p])])
    assert all(torch.equal(a, b) for a, b in zip(*runs))


def test_named_parameters_are_named_in_every_refusal():
    """Given (name, tensor) pairs (torch.optim keeps the names in "param_names"), a refusal names the
    parameter by its place and its name: at construction, at a step off the manifold, for a
    non-finite gradient and for a sparse one."""
    frames = [torch.nn.Parameter(stiefel_init_(torch.empty(2, 6, 3), torch.Generator().manual_seed(seed))) for seed in (1, 2)]
    with pytest.raises(ValueError, match=re.escape("params[0] of param group 0 ('layers.0.bias')")):
        StiefelAdam([("layers.0.bias", torch.nn.Parameter(torch.ones(6, 3)))])
    optimizer = StiefelAdam([("layers.0.W_Q", frames[0]), ("layers.0.W_K", frames[1])], lr=1e-3)
    with torch.no_grad():
        frames[1][1].mul_(2)
    for p in frames:
        p.grad = torch.randn(p.shape, generator=torch.Generator().manual_seed(3))
    with pytest.raises(ValueError, match=re.escape("params[1] of param group 0 ('layers.0.W_K'), frame 1")):
        optimizer.step()
    stiefel_project_(frames[1])
    frames[0].grad[0, 0, 0] = math.nan
    with pytest.raises(ValueError, match=re.escape("params[0] of param group 0 ('layers.0.W_Q'): gradient must be finite")):
        optimizer.step()
    ordinary = torch.nn.Embedding(4, 3, sparse=True)
    named = StiefelAdam([{"params": [("embedding.weight", ordinary.weight)], "manifold": "euclidean"}])
    ordinary(torch.tensor([1])).sum().backward()
    with pytest.raises(ValueError, match=re.escape("params[0] of param group 0 ('embedding.weight'): StiefelAdam does not support sparse")):
        named.step()
