"""What StiefelAdam keeps between steps: the grouping of frame parameters into batched calls (rebuilt
when a gradient appears or disappears, a group's settings change, a group is added or a state is
loaded) and the state of a bucket in one buffer per kind (joined and written as a view, no
torch.cat). A stale grouping or buffer would step a parameter with another group's settings, skip
one that has a gradient or write into a tensor the state no longer holds; each test compares with
parameters stepped alone."""

import collections
import copy

import pytest

torch = pytest.importorskip("torch")

from torch.utils._python_dispatch import TorchDispatchMode  # noqa: E402

from torch_impl import StiefelAdam, functional, stiefel_init_  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def _frames(shape, seed, dtype=torch.float64):
    return stiefel_init_(torch.empty(shape, dtype=torch.float64), torch.Generator().manual_seed(seed)).to(dtype)


class _Calls(TorchDispatchMode):
    """Counts the aten operators dispatched inside the block."""

    def __init__(self):
        super().__init__()
        self.counts = collections.Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.counts[str(func.overloadpacket)] += 1
        return func(*args, **(kwargs or {}))


class _Alone:
    """Each parameter's twin stepped by its own StiefelAdam with the given group settings."""

    def __init__(self, params, settings):
        self.twins = [torch.nn.Parameter(p.detach().clone()) for p in params]
        self.optimizers = [StiefelAdam([twin], **options) for twin, options in zip(self.twins, settings)]

    def step(self, grads):
        for twin, optimizer, grad in zip(self.twins, self.optimizers, grads):
            if grad is not None:
                twin.grad = grad.clone()
                optimizer.step()

    def assert_equal(self, params, optimizer):
        for p, twin, alone in zip(params, self.twins, self.optimizers):
            assert torch.equal(p.detach(), twin.detach())
            for key in ("step", "exp_avg", "exp_avg_sq"):
                if key in alone.state[twin]:
                    assert torch.equal(optimizer.state[p][key], alone.state[twin][key])


def _kernel_calls(monkeypatch):
    calls = []
    kernel = functional.stiefel_adam_step
    monkeypatch.setattr("torch_impl.optimizer.stiefel_adam_step", lambda W, *a, **k: calls.append(W.shape[0]) or kernel(W, *a, **k))
    return calls


def test_the_grouping_follows_gradients_that_appear_and_disappear(monkeypatch):
    params = [torch.nn.Parameter(_frames((2, 8, 3), seed)) for seed in range(3)]
    optimizer = StiefelAdam(params, lr=0.04)
    alone = _Alone(params, [dict(lr=0.04)] * 3)
    calls = _kernel_calls(monkeypatch)
    generator = torch.Generator().manual_seed(3)
    for present in ([1, 1, 1], [1, 0, 1], [1, 0, 1], [0, 0, 0], [0, 1, 0], [1, 1, 1]):
        grads = [torch.randn(2, 8, 3, dtype=torch.float64, generator=generator) if flag else None for flag in present]
        for p, grad in zip(params, grads):
            p.grad = None if grad is None else grad.clone()
        calls.clear()
        optimizer.step()
        assert calls == ([2 * sum(present)] if any(present) else [])
        alone.step(grads)
        alone.assert_equal(params, optimizer)


def test_the_grouping_follows_a_change_of_a_groups_settings(monkeypatch):
    """Two groups with equal settings share one call; when a scheduler (or the user) gives one of
    them another lr they are two calls with their own lr; equal again, one call."""
    params = [torch.nn.Parameter(_frames((2, 8, 3), seed)) for seed in (4, 5)]
    optimizer = StiefelAdam([{"params": params[:1]}, {"params": params[1:]}], lr=0.04)
    calls = _kernel_calls(monkeypatch)
    twins = _Alone(params, [dict(lr=0.04)] * 2)
    generator = torch.Generator().manual_seed(6)
    for lrs, expected in (((0.04, 0.04), [4]), ((0.04, 0.01), [2, 2]), ((0.02, 0.01), [2, 2]), ((0.01, 0.01), [4])):
        for group, twin_optimizer, lr in zip(optimizer.param_groups, twins.optimizers, lrs):
            group["lr"] = lr
            twin_optimizer.param_groups[0]["lr"] = lr
        grads = [torch.randn(2, 8, 3, dtype=torch.float64, generator=generator) for _ in params]
        for p, grad in zip(params, grads):
            p.grad = grad.clone()
        calls.clear()
        optimizer.step()
        assert calls == expected
        twins.step(grads)
        twins.assert_equal(params, optimizer)


def test_an_added_group_and_a_replaced_parameter_are_stepped():
    first = torch.nn.Parameter(_frames((2, 8, 3), 7))
    optimizer = StiefelAdam([first], lr=0.04)
    first.grad = torch.ones(2, 8, 3, dtype=torch.float64)
    optimizer.step()
    late = torch.nn.Parameter(_frames((2, 8, 3), 8))
    optimizer.add_param_group({"params": [late], "lr": 0.04})
    late.grad = torch.ones(2, 8, 3, dtype=torch.float64)
    optimizer.step()
    assert torch.equal(optimizer.state[late]["step"], torch.ones(2, dtype=torch.float64))
    replacement = torch.nn.Parameter(_frames((2, 8, 3), 9))
    optimizer.param_groups[1]["params"][0] = replacement
    replacement.grad = torch.ones(2, 8, 3, dtype=torch.float64)
    late.grad = None
    before = replacement.detach().clone()
    optimizer.step()
    assert not torch.equal(replacement.detach(), before)
    assert torch.equal(optimizer.state[late]["step"], torch.ones(2, dtype=torch.float64))


def test_a_buckets_state_lives_in_one_buffer_and_is_joined_without_a_copy():
    """Six parameters stepped in one call: after the first step their moments, second moments and
    counts are slices of one buffer each; from then on a step concatenates only W and G (two cat),
    and none when the parameters themselves are slices of one tensor; every result bit for bit as
    stepped alone, and references taken before the steps see the new values."""
    bank = _frames((6, 2, 8, 3), 10)
    separate = [torch.nn.Parameter(bank[k].clone()) for k in range(6)]
    storage = bank.clone()
    sliced = [torch.nn.Parameter(storage[k]) for k in range(6)]  # views of one storage
    assert all(p.untyped_storage().data_ptr() == storage.untyped_storage().data_ptr() for p in sliced)
    alone = _Alone(separate, [dict(lr=0.04)] * 6)
    generator = torch.Generator().manual_seed(11)
    grads_per_step = [[torch.randn(2, 8, 3, dtype=torch.float64, generator=generator) for _ in range(6)] for _ in range(4)]
    for params, expected_cats in ((separate, 2), (sliced, 1)):
        optimizer = StiefelAdam(params, lr=0.04)
        references = None
        for step, grads in enumerate(grads_per_step):
            for p, grad in zip(params, grads):
                p.grad = grad.clone()
            calls = _Calls()
            with calls:
                optimizer.step()
            if step == 0:
                references = [optimizer.state[p]["exp_avg"] for p in params]
                buffers = {optimizer.state[p][key].untyped_storage().data_ptr() for p in params for key in ("exp_avg", "exp_avg_sq", "step")}
                assert len(buffers) == 3
            else:
                assert calls.counts["aten.cat"] == expected_cats
        if params is separate:
            for grads in grads_per_step:
                alone.step(grads)
        alone.assert_equal(params, optimizer)
        assert all(reference is optimizer.state[p]["exp_avg"] for reference, p in zip(references, params))
    for p, q in zip(separate, sliced):
        assert torch.equal(p.detach(), q.detach())


def test_a_bucket_of_fresh_and_stepped_parameters_keeps_each_state():
    """A parameter whose first gradient comes later joins a bucket whose others have a state: each
    keeps its own moments and count (none is read as zeros), as stepped alone."""
    params = [torch.nn.Parameter(_frames((2, 8, 3), seed)) for seed in (12, 13, 14)]
    optimizer = StiefelAdam(params, lr=0.04)
    alone = _Alone(params, [dict(lr=0.04)] * 3)
    generator = torch.Generator().manual_seed(15)
    for present in ([1, 0, 1], [1, 1, 1], [1, 1, 1]):
        grads = [torch.randn(2, 8, 3, dtype=torch.float64, generator=generator) if flag else None for flag in present]
        for p, grad in zip(params, grads):
            p.grad = None if grad is None else grad.clone()
        optimizer.step()
        alone.step(grads)
        alone.assert_equal(params, optimizer)


def test_load_state_dict_puts_a_groups_frames_in_one_buffer_and_resumes_bit_for_bit():
    params = [torch.nn.Parameter(_frames((2, 8, 3), seed, torch.float32)) for seed in (16, 17, 18)]
    optimizer = StiefelAdam(params, lr=0.04)
    generator = torch.Generator().manual_seed(19)
    grads = [[torch.randn(2, 8, 3, generator=generator) for _ in params] for _ in range(4)]
    for step_grads in grads[:2]:
        for p, grad in zip(params, step_grads):
            p.grad = grad.clone()
        optimizer.step()
    saved = copy.deepcopy(optimizer.state_dict())
    values = [p.detach().clone() for p in params]
    for step_grads in grads[2:]:
        for p, grad in zip(params, step_grads):
            p.grad = grad.clone()
        optimizer.step()
    resumed = [torch.nn.Parameter(v.clone()) for v in values]
    fresh = StiefelAdam(resumed, lr=0.04)
    fresh.load_state_dict(saved)
    assert len({fresh.state[p]["exp_avg"].untyped_storage().data_ptr() for p in resumed}) == 1
    for step_grads in grads[2:]:
        for p, grad in zip(resumed, step_grads):
            p.grad = grad.clone()
        calls = _Calls()
        with calls:
            fresh.step()
        assert calls.counts["aten.cat"] == 2  # W and G only
    for p, q in zip(params, resumed):
        assert torch.equal(p.detach(), q.detach())
        for key in ("step", "exp_avg", "exp_avg_sq"):
            assert torch.equal(optimizer.state[p][key], fresh.state[q][key])


def test_a_state_replaced_by_the_user_is_the_one_stepped():
    """The join reads the state's tensors at every step: a moment the user replaces (here reset to
    zero in a new tensor) is the one the next step uses and writes."""
    params = [torch.nn.Parameter(_frames((2, 8, 3), seed)) for seed in (20, 21)]
    optimizer = StiefelAdam(params, lr=0.04)
    for p in params:
        p.grad = torch.ones(2, 8, 3, dtype=torch.float64)
    optimizer.step()
    replaced = torch.zeros(2, 8, 3, dtype=torch.float64)
    optimizer.state[params[1]]["exp_avg"] = replaced
    twin = torch.nn.Parameter(params[1].detach().clone())
    reference = StiefelAdam([twin], lr=0.04)
    reference.state[twin].update({key: value.clone() for key, value in optimizer.state[params[1]].items()})
    for p in params + [twin]:
        p.grad = torch.full((2, 8, 3), 0.5, dtype=torch.float64)
    optimizer.step(), reference.step()
    assert torch.equal(params[1].detach(), twin.detach())
    assert torch.equal(replaced, reference.state[twin]["exp_avg"])


@pytest.mark.parametrize("order", ["reversed", "gap", "transposed"])
def test_slices_of_one_tensor_out_of_order_are_not_read_as_one_view(order):
    """Parameters that share one storage but do not follow one another in the bucket's order (given
    in reverse, with a slice left out between them, or each a transposed, non-contiguous view)
    must be joined by copying: a view spanning them would step each with another one's frames."""
    bank = _frames((4, 2, 8, 3), 22)
    separate = [bank[k].clone() for k in range(4)]
    indices = [2, 1, 0] if order == "reversed" else [0, 2, 3] if order == "gap" else [0, 1, 2]
    if order == "transposed":
        storage = bank.mT.contiguous()  # (4, 2, 3, 8): each parameter storage[k].mT is (2, 8, 3), not contiguous
        sliced = [torch.nn.Parameter(storage[k].mT) for k in indices]
        assert not sliced[0].is_contiguous()
    else:
        storage = bank.clone()
        sliced = [torch.nn.Parameter(storage[k]) for k in indices]
    alone = _Alone([separate[k] for k in indices], [dict(lr=0.04)] * 3)
    optimizer = StiefelAdam(sliced, lr=0.04)
    generator = torch.Generator().manual_seed(23)
    for _ in range(3):
        grads = [torch.randn(2, 8, 3, dtype=torch.float64, generator=generator) for _ in sliced]
        for p, grad in zip(sliced, grads):
            p.grad = grad.clone()
        optimizer.step()
        alone.step(grads)
    alone.assert_equal(sliced, optimizer)
