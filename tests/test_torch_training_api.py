"""StiefelAdam as a whole model's optimizer: frames and ordinary tensors in one instance (the
ordinary ones stepped by torch.optim's AdamW, bit for bit), batched calls, options of other
optimizers refused by name, and a step that torch.compile captures in one graph."""

import copy
import math

import pytest

torch = pytest.importorskip("torch")

from torch_impl import StiefelAdam, functional, stiefel_init_  # noqa: E402


pytestmark = pytest.mark.usefixtures("one_torch_thread")


class TinyAttention(torch.nn.Module):
    """Frames W_Q, W_K (heads, d_model, d_head) and ordinary weights (value, output, bias)."""

    def __init__(self, d_model=8, heads=2, d_head=3, seed=0):
        super().__init__()
        generator = torch.Generator().manual_seed(seed)
        self.W_Q = torch.nn.Parameter(stiefel_init_(torch.empty(heads, d_model, d_head, dtype=torch.float64), generator))
        self.W_K = torch.nn.Parameter(stiefel_init_(torch.empty(heads, d_model, d_head, dtype=torch.float64), generator))
        self.value = torch.nn.Linear(d_model, heads * d_head, dtype=torch.float64)
        self.out = torch.nn.Linear(heads * d_head, d_model, dtype=torch.float64)

    def frames(self):
        return [self.W_Q, self.W_K]

    def ordinary(self):
        return [*self.value.parameters(), *self.out.parameters()]

    def forward(self, x):  # x (n, d_model)
        q = torch.einsum("nd,hdk->hnk", x, self.W_Q)
        k = torch.einsum("nd,hdk->hnk", x, self.W_K)
        attention = torch.softmax(q @ k.mT / math.sqrt(q.shape[-1]), dim=-1)
        v = self.value(x).reshape(x.shape[0], q.shape[0], -1).transpose(0, 1)
        return self.out((attention @ v).transpose(0, 1).reshape(x.shape[0], -1))


def _loss(model, generator):
    x = torch.randn(5, 8, dtype=torch.float64, generator=generator)
    return (model(x) - x.flip(-1)).square().mean()


def test_one_optimizer_trains_frames_and_ordinary_weights_and_matches_adamw_bit_for_bit():
    """Frames stepped as by separate StiefelAdam calls; ordinary weights exactly as torch.optim.AdamW
    with the group's lr, betas, eps and weight_decay; the loss goes down."""
    model, twin = TinyAttention(), TinyAttention()
    twin.load_state_dict(model.state_dict())
    groups = [
        {"params": model.frames(), "lr": 0.02},
        {"params": model.ordinary(), "manifold": "euclidean", "lr": 0.01, "betas": (0.8, 0.99), "weight_decay": 0.05},
    ]
    optimizer = StiefelAdam(groups)
    frame_optimizer = StiefelAdam(twin.frames(), lr=0.02)
    adamw = torch.optim.AdamW(twin.ordinary(), lr=0.01, betas=(0.8, 0.99), weight_decay=0.05)
    losses = []
    for step in range(30):
        for net, opts in ((model, [optimizer]), (twin, [frame_optimizer, adamw])):
            for opt in opts:
                opt.zero_grad()
            loss = _loss(net, torch.Generator().manual_seed(0))  # one batch: the loss must fall
            loss.backward()
            for opt in opts:
                opt.step()
        losses.append(float(loss.detach()))
        for a, b in zip(model.parameters(), twin.parameters()):
            assert torch.equal(a, b)
    assert torch.equal(optimizer.state[model.out.weight]["exp_avg_sq"], adamw.state[twin.out.weight]["exp_avg_sq"])
    assert losses[-1] < 0.8 * losses[0]


def test_state_dict_with_both_kinds_resumes_bit_for_bit():
    model = TinyAttention()
    make = lambda m: StiefelAdam([{"params": m.frames()}, {"params": m.ordinary(), "manifold": "euclidean", "weight_decay": 0.1}], lr=0.02)  # noqa: E731
    optimizer = make(model)

    def train(net, opt, steps):
        for step in steps:
            opt.zero_grad()
            _loss(net, torch.Generator().manual_seed(step)).backward()
            opt.step()

    train(model, optimizer, range(4))
    saved_model, saved_state = copy.deepcopy(model.state_dict()), copy.deepcopy(optimizer.state_dict())
    train(model, optimizer, range(4, 8))
    resumed = TinyAttention(seed=5)
    resumed.load_state_dict(saved_model)
    resumed_optimizer = make(resumed)
    resumed_optimizer.load_state_dict(saved_state)
    assert resumed_optimizer.state[resumed.out.weight]["step"].device.type == "cpu"  # as AdamW keeps it
    train(resumed, resumed_optimizer, range(4, 8))
    for a, b in zip(model.parameters(), resumed.parameters()):
        assert torch.equal(a, b)


def test_a_scheduler_drives_both_kinds():
    model = TinyAttention()
    optimizer = StiefelAdam([{"params": model.frames()}, {"params": model.ordinary(), "manifold": "euclidean"}], lr=0.04)
    scheduler = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=10)
    for _ in range(5):
        optimizer.zero_grad()
        _loss(model, torch.Generator().manual_seed(0)).backward()
        optimizer.step()
        scheduler.step()
    expected = 0.04 * (1 + math.cos(math.pi * 5 / 10)) / 2
    assert all(math.isclose(group["lr"], expected, rel_tol=1e-12) for group in optimizer.param_groups)


def test_an_ordinary_weight_in_a_frame_group_is_refused_with_both_ways_out():
    linear = torch.nn.Linear(4, 8)  # weight (8, 4): r = 4 <= d = 8, but not orthonormal
    with pytest.raises(ValueError, match=r"W\^T W = I.*stiefel_init_.*manifold='euclidean'"):
        StiefelAdam([linear.weight])
    with pytest.raises(ValueError, match=r"r <= d.*manifold='euclidean'"):
        StiefelAdam([torch.nn.Linear(8, 4).weight])  # (4, 8): wider than tall
    StiefelAdam([{"params": linear.parameters(), "manifold": "euclidean"}])  # accepted
    with pytest.raises(ValueError, match="manifold must be one of"):
        StiefelAdam([{"params": linear.parameters(), "manifold": "sphere"}])
    with pytest.raises(ValueError, match="floating"):
        StiefelAdam([{"params": [torch.zeros(3, dtype=torch.int64)], "manifold": "euclidean"}])


@pytest.mark.parametrize("option,value", [("amsgrad", True), ("maximize", True), ("foreach", True), ("fused", True), ("capturable", True), ("stabilize", 10)])
def test_options_of_other_optimizers_are_refused_by_name_unless_they_ask_for_nothing(option, value):
    frame = torch.nn.Parameter(stiefel_init_(torch.empty(5, 2, dtype=torch.float64)))
    with pytest.raises(ValueError, match=rf"{option}={value!r} is not supported.*takes lr, betas, eps, trust_radius"):
        StiefelAdam([frame], **{option: value})
    with pytest.raises(ValueError, match=rf"param group 0: {option}={value!r} is not supported"):
        StiefelAdam([{"params": [frame], option: value}])
    off = {"amsgrad": False, "maximize": False, "foreach": None, "fused": None, "capturable": False, "stabilize": None}[option]
    StiefelAdam([frame], **{option: off})  # geoopt's and torch.optim's defaults run unchanged
    with pytest.raises(ValueError, match=r"unknown option 'weight_decy'"):
        StiefelAdam([frame], weight_decy=0.1)
    StiefelAdam([{"params": [frame], "name": "W_Q"}])  # a group's own keys are the user's, as in torch.optim


def test_parameters_of_one_shape_and_settings_are_one_batched_call_with_the_same_result(monkeypatch):
    """Twelve (2, 16, 4) parameters in two groups with equal settings, and one of another shape:
    two kernel calls, and every parameter bit for bit as when stepped alone."""
    generator = torch.Generator().manual_seed(1)
    frames = [stiefel_init_(torch.empty(2, 16, 4, dtype=torch.float64), generator) for _ in range(12)]
    other = stiefel_init_(torch.empty(9, 3, dtype=torch.float64), generator)
    grads = [torch.randn(f.shape, dtype=torch.float64, generator=generator) for f in frames + [other]]
    params = [torch.nn.Parameter(f.clone()) for f in frames + [other]]
    optimizer = StiefelAdam([{"params": params[:6]}, {"params": params[6:]}], lr=0.03)
    calls = []
    kernel = functional.stiefel_adam_step
    monkeypatch.setattr("torch_impl.optimizer.stiefel_adam_step", lambda W, *a, **k: calls.append(W.shape) or kernel(W, *a, **k))
    for p, g in zip(params, grads):
        p.grad = g.clone()
    optimizer.step()
    assert sorted(calls) == sorted([torch.Size([24, 16, 4]), torch.Size([1, 9, 3])])
    for original, p, g in zip(frames + [other], params, grads):
        alone = torch.nn.Parameter(original.clone())
        single = StiefelAdam([alone], lr=0.03)
        alone.grad = g.clone()
        single.step()
        assert torch.equal(alone.data, p.data)
        assert torch.equal(single.state[alone]["exp_avg"], optimizer.state[p]["exp_avg"])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_skipping_is_per_frame_in_low_precision_too(dtype):
    p = torch.nn.Parameter(stiefel_init_(torch.empty(3, 8, 2, dtype=dtype), torch.Generator().manual_seed(2)))
    optimizer = StiefelAdam([p], lr=0.05, skip_nonfinite=True)
    before = p.detach().clone()
    p.grad = torch.randn(p.shape, generator=torch.Generator().manual_seed(3)).to(dtype)
    p.grad[2, 0, 0] = math.inf
    optimizer.step()
    assert optimizer.skipped_steps == 1
    assert torch.equal(p.data[2], before[2]) and not torch.equal(p.data[0], before[0]) and not torch.equal(p.data[1], before[1])
    assert optimizer.state[p]["step"].tolist() == [1.0, 1.0, 0.0]


def test_an_ordinary_tensor_with_a_nonfinite_gradient_is_skipped_whole_under_skip_nonfinite():
    weights = [torch.nn.Parameter(torch.randn(4, 3, dtype=torch.float64, generator=torch.Generator().manual_seed(k))) for k in range(2)]
    twin = torch.nn.Parameter(weights[0].detach().clone())
    optimizer = StiefelAdam([{"params": weights, "manifold": "euclidean"}], lr=0.1, skip_nonfinite=True)
    adamw = torch.optim.AdamW([twin], lr=0.1, weight_decay=0.0)
    grad = torch.randn(4, 3, dtype=torch.float64, generator=torch.Generator().manual_seed(9))
    weights[0].grad, twin.grad = grad.clone(), grad.clone()
    weights[1].grad = grad.clone()  # a finite first step: the skipped one below has a state to keep
    optimizer.step(), adamw.step()
    kept = weights[1].detach().clone(), copy.deepcopy(optimizer.state[weights[1]])
    assert kept[1]["step"] == 1.0 and kept[1]["exp_avg"].abs().sum() > 0
    weights[0].grad, twin.grad = grad.clone(), grad.clone()
    weights[1].grad = torch.full((4, 3), math.nan, dtype=torch.float64)
    optimizer.step(), adamw.step()
    assert optimizer.skipped_steps == 1
    assert torch.equal(weights[0].data, twin.data)
    assert torch.equal(weights[1].data, kept[0])
    for key, value in kept[1].items():
        assert torch.equal(optimizer.state[weights[1]][key], value)


@pytest.mark.parametrize("with_ordinary", [False, True])
def test_the_step_compiles_without_graph_breaks(with_ordinary):
    """torch._dynamo.explain over StiefelAdam.step with skip_nonfinite=True: one graph, 0 breaks."""
    model = TinyAttention()
    groups = [{"params": model.frames()}] + ([{"params": model.ordinary(), "manifold": "euclidean"}] if with_ordinary else [])
    optimizer = StiefelAdam(groups, lr=0.02, skip_nonfinite=True)
    _loss(model, torch.Generator().manual_seed(0)).backward()
    explanation = torch._dynamo.explain(optimizer.step)()
    assert explanation.graph_break_count == 0 and explanation.graph_count == 1, explanation.break_reasons


def test_every_param_group_is_checked_not_only_the_first():
    frame = stiefel_init_(torch.empty(6, 2, dtype=torch.float64))
    first = {"params": [torch.nn.Parameter(frame.clone())]}
    for bad, message in (({"lr": -1.0}, "lr"), ({"manifold": "sphere"}, "manifold"), ({"betas": (0.9, 1.5)}, "beta2")):
        with pytest.raises(ValueError, match=message):
            StiefelAdam([first, {"params": [torch.nn.Parameter(frame.clone())], **bad}])
        with pytest.raises(ValueError, match=message):
            StiefelAdam([first]).add_param_group({"params": [torch.nn.Parameter(frame.clone())], **bad})
    with pytest.raises(ValueError, match=r"params\[0\] of param group 1 must satisfy W\^T W = I"):
        StiefelAdam([first, {"params": [torch.nn.Parameter(2.0 * frame)]}])


def test_frames_of_two_dtypes_are_not_stepped_in_one_call():
    """A float32 frame next to a float64 frame of the same shape and settings is stepped in float32,
    bit for bit as alone."""
    frame = stiefel_init_(torch.empty(2, 9, 3, dtype=torch.float64), torch.Generator().manual_seed(4))
    grad = torch.randn(frame.shape, dtype=torch.float64, generator=torch.Generator().manual_seed(5))
    single = torch.nn.Parameter(frame.float())
    pair = [torch.nn.Parameter(frame.clone()), torch.nn.Parameter(frame.float())]
    alone, together = StiefelAdam([single], lr=0.05), StiefelAdam(pair, lr=0.05)
    for _ in range(3):
        single.grad, pair[0].grad, pair[1].grad = grad.float(), grad.clone(), grad.float()
        alone.step(), together.step()
    assert torch.equal(single.data, pair[1].data)
    assert torch.equal(alone.state[single]["exp_avg"], together.state[pair[1]]["exp_avg"])


def test_a_state_dict_with_one_int_count_and_a_stateless_parameter_resumes():
    """A checkpoint of an earlier version keeps one int step per parameter; a parameter that never
    had a gradient has no state. Both load: the count becomes one per frame, and the bfloat16 frame
    after the stateless parameter keeps its float32 moments (resume bit for bit)."""
    generator = torch.Generator().manual_seed(6)
    never = torch.nn.Parameter(stiefel_init_(torch.empty(5, 2, dtype=torch.float64), generator))
    frames = torch.nn.Parameter(stiefel_init_(torch.empty(3, 8, 2, dtype=torch.bfloat16), generator))
    optimizer = StiefelAdam([never, frames], lr=0.05)
    grads = [torch.randn(frames.shape, generator=generator).to(torch.bfloat16) for _ in range(4)]
    for G in grads[:2]:
        frames.grad = G.clone()
        optimizer.step()
    saved = copy.deepcopy(optimizer.state_dict())
    saved_values = (never.detach().clone(), frames.detach().clone())
    for G in grads[2:]:
        frames.grad = G.clone()
        optimizer.step()
    for old_format in (False, True):
        state_dict = copy.deepcopy(saved)
        if old_format:
            state_dict["state"][1]["step"] = 2
        resumed = [torch.nn.Parameter(v.clone()) for v in saved_values]
        fresh = StiefelAdam(resumed, lr=0.05)
        fresh.load_state_dict(state_dict)
        state = fresh.state[resumed[1]]
        assert state["exp_avg"].dtype == torch.float32 and torch.equal(state["step"], torch.full((3,), 2.0, dtype=torch.float64))
        for G in grads[2:]:
            resumed[1].grad = G.clone()
            fresh.step()
        assert torch.equal(resumed[1].data, frames.data) and torch.equal(resumed[0].data, never.data)


@pytest.mark.parametrize("skip", [False, True])
def test_a_frame_with_no_gradient_yet_and_eps_zero_takes_a_zero_step(skip):
    """v^ = 0 with eps = 0 on the per-frame-count path: xi = 0, never 0/0, and no refusal."""
    p = torch.nn.Parameter(stiefel_init_(torch.empty(2, 6, 2, dtype=torch.float64), torch.Generator().manual_seed(7)))
    before = p.detach().clone()
    optimizer = StiefelAdam([p], lr=0.05, eps=0.0, skip_nonfinite=skip)
    p.grad = torch.zeros_like(p)
    p.grad[0] = torch.randn(6, 2, dtype=torch.float64, generator=torch.Generator().manual_seed(8))
    optimizer.step()
    assert optimizer.skipped_steps == 0
    assert torch.all(optimizer.state[p]["exp_avg"][1] == 0) and optimizer.state[p]["exp_avg_sq"][1] == 0
    assert float(torch.linalg.matrix_norm(p.data[1] - before[1])) <= 1e-14
    assert float(torch.linalg.matrix_norm(p.data[0] - before[0])) > 1e-3


def test_gradients_set_only_by_the_closure_are_stepped_on_the_first_call():
    p = torch.nn.Parameter(stiefel_init_(torch.empty(6, 3, dtype=torch.float64), torch.Generator().manual_seed(9)))
    target = torch.randn(6, 3, dtype=torch.float64, generator=torch.Generator().manual_seed(10))
    optimizer = StiefelAdam([p], lr=0.05)
    before = p.detach().clone()

    def closure():
        optimizer.zero_grad()
        loss = (p * target).sum()
        loss.backward()
        return loss

    optimizer.step(closure)
    assert not torch.equal(p.data, before)
    assert torch.equal(optimizer.state[p]["step"], torch.tensor(1.0, dtype=torch.float64))


def _stepped(shape=(6, 3)):
    import torch_impl

    W = torch.nn.Parameter(torch_impl.stiefel_init_(torch.empty(*shape, dtype=torch.float64)))
    optimizer = torch_impl.StiefelAdam([W], lr=1e-3)
    W.grad = torch.randn(*shape, dtype=torch.float64)
    optimizer.step()
    return W, optimizer


@pytest.mark.parametrize("change, expected", [
    ("other_shape", "the saved exp_avg has shape (6, 3), a frame state of this parameter (7, 3) has (7, 3)"),
    ("adam_state", "the saved exp_avg_sq has shape (6, 3), a frame state of this parameter (6, 3) has ()"),
    ("no_exp_avg", "the saved state has no exp_avg"),
    ("no_step", "the saved state has no step"),
    ("euclidean_group", "param group 0 is a 'stiefel' group, but the state_dict saved a 'euclidean' group there"),
])
def test_a_state_of_another_parameter_or_optimizer_is_refused_naming_the_parameter(change, expected):
    """A load that cannot be a StiefelAdam frame state is a ValueError naming the parameter, before
    anything is loaded (it was a RuntimeError of a reshape, or a KeyError, after part of the load)."""
    import copy

    import torch_impl

    W, optimizer = _stepped()
    saved = copy.deepcopy(optimizer.state_dict())
    target = W
    if change == "other_shape":
        target = torch.nn.Parameter(torch_impl.stiefel_init_(torch.empty(7, 3, dtype=torch.float64)))
    elif change == "adam_state":
        other = torch.nn.Parameter(W.detach().clone())
        adam = torch.optim.Adam([other])
        other.grad = torch.randn_like(other)
        adam.step()
        saved = adam.state_dict()
    elif change == "no_exp_avg":
        del saved["state"][0]["exp_avg"]
    elif change == "no_step":
        del saved["state"][0]["step"]
    else:
        saved["param_groups"][0]["manifold"] = "euclidean"
    fresh = torch_impl.StiefelAdam([target], lr=1e-3)
    with pytest.raises(ValueError, match="params\\[0\\] of param group 0|param group 0 is") as refused:
        fresh.load_state_dict(saved)
    assert expected in str(refused.value)
    assert fresh.state_dict()["state"] == {}  # nothing was loaded


@pytest.mark.parametrize("key", ["exp_avg", "exp_avg_sq"])
def test_a_step_made_nonfinite_by_a_loaded_moment_says_so(key):
    """A corrupted state_dict (a moment that is inf) in the error mode: the refusal names the stored
    moment, not an overflow of the gradient."""
    import copy

    import torch_impl

    W, optimizer = _stepped()
    saved = copy.deepcopy(optimizer.state_dict())
    saved["state"][0][key] = torch.full_like(saved["state"][0][key], math.inf)
    fresh = torch_impl.StiefelAdam([W], lr=1e-3)
    fresh.load_state_dict(saved)
    W.grad = torch.randn_like(W)
    with pytest.raises(ValueError, match=f"its stored {key} is not finite"):
        fresh.step()
