"""lr and eps as 0-d tensors (what a compiled or capturable training step uses, so that a scheduler's
new lr is data and not a constant the compiler specialises on): the same step bit for bit as the
numbers of the same value, a scheduler that fills them in place, no recompilation over a schedule,
no graph break in either mode, and the hyper-parameters that must stay numbers refused by name."""

import math

import pytest

torch = pytest.importorskip("torch")

from torch_impl import StiefelAdam, functional, stiefel_init_  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def _frames(seed, dtype=torch.float32, shape=(3, 8, 3)):
    return stiefel_init_(torch.empty(shape, dtype=torch.float64), torch.Generator().manual_seed(seed)).to(dtype)


def _gradients(shape, steps, seed, dtype):
    generator = torch.Generator().manual_seed(seed)
    return [torch.randn(shape, dtype=torch.float64, generator=generator).to(dtype) for _ in range(steps)]


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.bfloat16])
@pytest.mark.parametrize("lr_dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("skip", [False, True])
def test_a_tensor_lr_and_eps_step_bit_for_bit_as_the_numbers_of_the_same_value(dtype, lr_dtype, skip):
    """lr a tensor filled by a cosine schedule (which computes in the tensor's dtype: its values
    are numbers of that dtype), eps a float64 tensor: every frame, moment and count after 8 steps
    equals the run given the same values as Python numbers."""
    frames = _frames(0, dtype)
    p = torch.nn.Parameter(frames.clone())
    optimizer = StiefelAdam([p], lr=torch.tensor(0.0123456789, dtype=lr_dtype), eps=torch.tensor(1e-6, dtype=torch.float64),
                            weight_decay=0.1, skip_nonfinite=skip)
    scheduler = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=8)
    twin = torch.nn.Parameter(frames.clone())
    numbers = StiefelAdam([twin], lr=1.0, eps=1e-6, weight_decay=0.1, skip_nonfinite=skip)
    lrs = set()
    for G in _gradients(p.shape, 8, 1, dtype):
        numbers.param_groups[0]["lr"] = float(optimizer.param_groups[0]["lr"])
        lrs.add(numbers.param_groups[0]["lr"])
        p.grad, twin.grad = G.clone(), G.clone()
        optimizer.step(), numbers.step()
        scheduler.step()
    assert torch.is_tensor(optimizer.param_groups[0]["lr"]) and len(lrs) == 8
    assert torch.equal(p.detach(), twin.detach())
    for key in ("step", "exp_avg", "exp_avg_sq"):
        assert torch.equal(optimizer.state[p][key], numbers.state[twin][key])


def test_the_functional_step_with_one_count_takes_a_tensor_lr_bit_for_bit():
    """The int form of t (the cross-check's) with a tensor lr: the same float64 division and the
    same `number / tensor` as with the number."""
    W = _frames(2, torch.float64)
    m, v = torch.zeros_like(W), torch.zeros(3, dtype=torch.float64)
    for t, G in enumerate(_gradients(W.shape, 5, 3, torch.float64)):
        number = functional.stiefel_adam_step(W, G, m, v, t, 0.07, 0.9, 0.999, 1e-8, 0.5, 0.0)
        tensor = functional.stiefel_adam_step(W, G, m, v, t, torch.tensor(0.07, dtype=torch.float64), 0.9, 0.999,
                                              torch.tensor(1e-8, dtype=torch.float64), 0.5, 0.0)
        assert all(torch.equal(a, b) for a, b in zip(number, tensor))
        W, m, v = number


def _scheduled_run(lr, skip, compile_step, steps=12):
    """Frames and an AdamW group under a cosine schedule, the step compiled or not (dynamo with the
    eager backend: what recompiles is decided by dynamo's guards, not by the backend); returns
    (unique graphs, the frames after the run)."""
    from torch._dynamo.utils import counters

    torch._dynamo.reset()
    counters.clear()
    params = [torch.nn.Parameter(_frames(seed)) for seed in (4, 5)]
    linear = torch.nn.Linear(3, 2)
    optimizer = StiefelAdam([{"params": params}, {"params": linear.parameters(), "manifold": "euclidean"}], lr=lr, skip_nonfinite=skip)
    scheduler = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=steps)
    step = torch.compile(optimizer.step, backend="eager") if compile_step else optimizer.step
    generator = torch.Generator().manual_seed(6)
    for _ in range(steps):
        for p in params + list(linear.parameters()):
            p.grad = torch.randn(p.shape, generator=generator)
        step()
        scheduler.step()
    graphs = counters["stats"]["unique_graphs"]
    torch._dynamo.reset()
    return graphs, [p.detach().clone() for p in params]


@pytest.mark.parametrize("skip", [False, True])
def test_a_scheduler_filling_a_tensor_lr_does_not_recompile_the_compiled_step(skip):
    """Two graphs over a 12-step cosine schedule: the first step's (which creates the state) and
    the one every later step reuses; with a float lr each new value is a new graph (until dynamo's
    recompile limit). The compiled run equals the eager one bit for bit."""
    graphs, frames = _scheduled_run(torch.tensor(0.02), skip, compile_step=True)
    assert graphs == 2
    float_graphs, _ = _scheduled_run(0.02, skip, compile_step=True)
    assert float_graphs > 2
    _, eager_frames = _scheduled_run(torch.tensor(0.02), skip, compile_step=False)
    assert all(torch.equal(a, b) for a, b in zip(frames, eager_frames))


@pytest.mark.parametrize("lr", [0.02, "tensor"])
@pytest.mark.parametrize("skip", [False, True])
def test_the_step_is_one_graph_without_breaks_in_both_modes(skip, lr):
    """torch._dynamo.explain over StiefelAdam.step (frames and an AdamW group): one graph, no break,
    with and without skip_nonfinite: the error mode makes its decision on the device when compiled."""
    params = [torch.nn.Parameter(_frames(seed)) for seed in (7, 8)]
    linear = torch.nn.Linear(3, 2)
    optimizer = StiefelAdam([{"params": params}, {"params": linear.parameters(), "manifold": "euclidean"}],
                            lr=torch.tensor(0.02) if lr == "tensor" else lr, skip_nonfinite=skip)
    for p in params + list(linear.parameters()):
        p.grad = torch.randn(p.shape, generator=torch.Generator().manual_seed(9))
    optimizer.step()  # the state exists: the graph is the one every later step runs
    explanation = torch._dynamo.explain(optimizer.step)()
    assert explanation.graph_break_count == 0 and explanation.graph_count == 1, explanation.break_reasons


@pytest.mark.parametrize("scheduler_first", [True, False])
@pytest.mark.parametrize("skip", [False, True])
def test_a_compiled_step_and_a_scheduler_make_one_graph_without_breaks_or_warnings_in_either_order(skip, scheduler_first):
    """A torch scheduler wraps optimizer.step in a function that dynamo does not trace (one break at
    the top of every compiled step) unless the step carries its mark and records its own calls:
    with StiefelAdam's, two graphs and no break over a 12-step schedule, whichever of scheduler and
    compiled step is made first, and the scheduler does not warn that it stepped first."""
    import warnings

    from torch._dynamo.utils import counters

    torch._dynamo.reset()
    counters.clear()
    params = [torch.nn.Parameter(_frames(seed)) for seed in (11, 12)]
    linear = torch.nn.Linear(3, 2)
    optimizer = StiefelAdam([{"params": params}, {"params": linear.parameters(), "manifold": "euclidean"}],
                            lr=torch.tensor(0.02), skip_nonfinite=skip)
    make_scheduler = lambda: torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=12)  # noqa: E731
    scheduler = make_scheduler() if scheduler_first else None
    step = torch.compile(optimizer.step, backend="eager")
    scheduler = scheduler or make_scheduler()
    generator = torch.Generator().manual_seed(13)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for _ in range(12):
            for p in params + list(linear.parameters()):
                p.grad = torch.randn(p.shape, generator=generator)
            step()
            scheduler.step()
    graphs, breaks = counters["stats"]["unique_graphs"], sum(counters["graph_break"].values())
    torch._dynamo.reset()
    assert (graphs, breaks) == (2, 0), dict(counters["graph_break"])


def test_a_scheduler_stepped_before_the_optimizer_still_warns():
    optimizer = StiefelAdam([torch.nn.Parameter(_frames(14))], lr=torch.tensor(0.02))
    scheduler = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=4)
    assert not optimizer._opt_called
    with pytest.warns(UserWarning, match="before `optimizer.step"):
        scheduler.step()
    # an optimizer pickled before the record existed
    older = StiefelAdam.__new__(StiefelAdam)
    older.__setstate__({key: value for key, value in optimizer.__dict__.items() if key != "_calls"})
    assert older._opt_called is False


def test_hyperparameters_that_must_be_numbers_are_refused_by_name():
    frame = torch.nn.Parameter(_frames(10))
    for kwargs, pattern in [
        (dict(betas=(torch.tensor(0.9), torch.tensor(0.999))), "betas must be Python numbers.*only lr and eps"),
        (dict(weight_decay=torch.tensor(0.1)), "weight_decay must be Python numbers"),
        (dict(trust_radius=torch.tensor(0.5)), "trust_radius must be Python numbers"),
        (dict(lr=torch.tensor([0.1, 0.2])), "lr must be a real number or a 1-element floating tensor"),
        (dict(lr=torch.tensor(1, dtype=torch.int64)), "lr must be a real number or a 1-element floating tensor"),
        (dict(lr=torch.tensor(0.1, requires_grad=True)), "requires grad"),
        (dict(lr=torch.tensor(-0.1)), "lr"),
        (dict(eps=torch.tensor(-1.0)), "eps"),
    ]:
        with pytest.raises(ValueError, match=pattern):
            StiefelAdam([frame], **kwargs)
        with pytest.raises(ValueError, match=pattern):
            StiefelAdam([{"params": [torch.nn.Parameter(_frames(10))], **kwargs}])
    optimizer = StiefelAdam([frame], lr=torch.tensor([0.1]))  # a 1-element tensor becomes 0-d, as in torch.optim
    assert optimizer.param_groups[0]["lr"].dim() == 0
    assert not math.isnan(float(optimizer.param_groups[0]["lr"]))
