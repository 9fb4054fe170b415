"""torch_impl.StiefelAdam and its functional step: agreement with reference_impl.step (float64, to
the bound of propositions.crosscheck.step_error_bound), the torch.optim contract (groups, closure,
state_dict resume bit for bit), bad use, non-finite gradients, low-precision feasibility."""

import copy
import math

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import reference_impl as ref  # noqa: E402
from propositions._common import rng_for  # noqa: E402
from torch_impl import StiefelAdam, feasibility, functional, manifold_tolerance, stiefel_init_  # noqa: E402
from propositions.kit.bounds import polar_svd  # noqa: E402
from propositions.kit.step_analysis import polar_eigh, polar_newton_schulz  # noqa: E402
from propositions.kit.kernel_bounds import kernel_inputs  # noqa: E402
from propositions.crosscheck import (  # noqa: E402
    CONFIGS,
    _iterations,
    _kernel_rounding,
    reference_moment,
    transport_roundoff,
    feasibility_bound,
    reference_quantities,
    step_error_bound,
)

pytestmark = pytest.mark.usefixtures("one_torch_thread")  # conftest.py


# (batch, d, r): (1, 1), r = d, r = 1, two batch axes, a larger frame
SHAPES = [((3,), 1, 1), ((2,), 4, 4), ((4,), 7, 1), ((2, 3), 5, 2), ((2,), 64, 16)]


def _frames(batch, d, r, *key, dtype=torch.float64):
    rng = rng_for(0, "test_torch_optimizer", *key)
    return torch.from_numpy(ref.random_point(d, r, rng, batch)).to(dtype), rng


def _step(W, G, m, v, t, config, **kwargs):
    beta1, beta2 = config.betas
    return functional.stiefel_adam_step(
        W, G, m, v, t, config.lr, beta1, beta2, config.eps, config.trust_radius, config.weight_decay, **kwargs
    )


@pytest.mark.parametrize("batch,d,r", SHAPES)
@pytest.mark.parametrize("config_name", list(CONFIGS))
def test_float64_step_agrees_with_reference(batch, d, r, config_name):
    """Lock-step over 5 steps (trust-region clipping and decay in "clip_decay"; frame 0 gets G = 0
    at the first step): every output within step_error_bound (error analysis in its docstring)."""
    config = CONFIGS[config_name]
    W_t, rng = _frames(batch, d, r, "agree", d, r, config_name)
    W = W_t.numpy()
    state = ref.init(W)
    moment_in = state.m  # the kernel's state: the moment before its transport
    rounding = _kernel_rounding(config, "float64", d, r)
    for t in range(5):
        G = rng.standard_normal(W.shape)
        if t == 0:
            G.reshape((-1, d, r))[0] = 0.0
        q = reference_quantities(W, G, state, config)
        W_ref, state_ref = ref.step(W, G, state, config)
        W_new, m_new, v_new = _step(*(torch.from_numpy(x) for x in (W, G, moment_in, state.v)), state.t, config)
        transport = transport_roundoff(d, r, rounding.u_c, moment_in)
        bound = step_error_bound(d, r, config, q, rounding, kernel_inputs(rounding, r, q, transport))
        assert np.all(ref.frobenius(W_new.numpy() - W_ref) <= bound["W"])
        m_transported = functional.transported_moment(W_new, m_new).numpy()
        assert np.all(ref.frobenius(m_transported - state_ref.m) <= bound["m"])
        assert np.all(np.abs(v_new.numpy() - state_ref.v) <= bound["v"])
        moment_in = reference_moment(W, G, state, config)
        W, state = W_ref, state_ref


def test_zero_gradient_gives_zero_step_not_nan():
    """v^ = 0 (no gradient yet) must give xi = 0, never 0/0, even with eps = 0: the state stays
    exactly 0 and W moves only by the retraction's rounding (feasibility_bound)."""
    W, _ = _frames((3,), 6, 2, "zero")
    for eps in (1e-8, 0.0):
        W_new, m_new, v_new = functional.stiefel_adam_step(W, torch.zeros_like(W), torch.zeros_like(W), torch.zeros(3, dtype=torch.float64), 0, eps=eps)
        assert torch.all(m_new == 0) and torch.all(v_new == 0)
        assert torch.all(torch.isfinite(W_new))
        assert float(torch.linalg.matrix_norm(W_new - W).max()) <= feasibility_bound(6, 2, torch.float64)


def test_newton_schulz_and_eigh_retractions_agree():
    """Both evaluate polar(W + xi) from the Gram matrix; each is within its route's evaluation bound
    (step_analysis.polar_newton_schulz, polar_eigh) of the exact polar factor, and the reference's SVD
    within polar_svd, so each differs from the SVD by at most the sum."""
    W, rng = _frames((4,), 32, 8, "retractions")
    xi = torch.from_numpy(ref.random_tangent(W.numpy(), rng))
    xi = xi * (0.5 / torch.linalg.matrix_norm(xi, keepdim=True))
    newton_schulz = functional.polar_retract(W, xi, 0.5, "newton_schulz")
    eigh = functional.polar_retract(W, xi, 0.5, "eigh")
    svd = torch.from_numpy(ref.polar_retract(W.numpy(), xi.numpy()))
    kappa, u = math.sqrt(1.25), ref.UNIT_ROUNDOFF
    svd_bound = float(polar_svd(d=32, r=8, u_c=u, kappa=kappa))
    k = _iterations(CONFIGS["defaults"], torch.float64, 32, 8)
    assert float(torch.linalg.matrix_norm(newton_schulz - svd).max()) <= svd_bound + float(polar_newton_schulz(d=32, r=8, u_c=u, kappa=kappa, k=k, e_k=u))
    assert float(torch.linalg.matrix_norm(eigh - svd).max()) <= svd_bound + float(polar_eigh(d=32, r=8, u_c=u, u_e=u, u_M=0.0, kappa=kappa))


def test_newton_schulz_iteration_counts_come_from_the_scalar_map():
    # any step of length 0.5 with the drift allowance: 0.8 -> 0.47 -> 0.08 -> 3.4e-4 -> 2.4e-11 -> 8.1e-33
    assert functional.newton_schulz_iterations(0.5, torch.float32) == 4
    assert functional.newton_schulz_iterations(0.5, torch.float64) == 5
    with pytest.raises(ValueError, match="trust_radius"):
        functional.newton_schulz_iterations(2.0, torch.float64)
    with pytest.raises(ValueError, match="trust_radius"):
        StiefelAdam([stiefel_init_(torch.empty(4, 2, dtype=torch.float64))], trust_radius=2.0, retraction_method="newton_schulz")


def test_optimizer_step_is_the_functional_step():
    W, rng = _frames((2,), 8, 3, "optimizer")
    parameter = torch.nn.Parameter(W.clone())
    optimizer = StiefelAdam([parameter], lr=0.05, weight_decay=0.1)
    W_f, m_f, v_f = W.clone(), torch.zeros_like(W), torch.zeros(2, dtype=torch.float64)
    config = CONFIGS["clip_decay"]
    for t in range(4):
        G = torch.from_numpy(rng.standard_normal(W.shape))
        parameter.grad = G.clone()
        optimizer.step()
        counts = torch.full((2,), float(t), dtype=torch.float64)  # the optimizer's per-frame counts
        W_f, m_f, v_f = _step(W_f, G, m_f, v_f, counts, config)
        assert torch.equal(parameter.data, W_f)
        assert torch.equal(optimizer.state[parameter]["exp_avg"], m_f)
        assert torch.equal(optimizer.state[parameter]["exp_avg_sq"], v_f)
        assert torch.equal(optimizer.state[parameter]["step"], counts + 1)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.bfloat16])
def test_per_frame_counts_and_one_count_give_the_same_step_where_pow_is_correctly_rounded(dtype):
    """The tensor form of t (one count per frame, bias corrections by torch.pow) against the int
    form (Python floats): the same operations, so equal bit for bit at every t where torch.pow
    returns Python's beta^t for both betas; elsewhere they may differ in the last bit of beta^t."""
    W, rng = _frames((3,), 7, 3, "counts", str(dtype), dtype=dtype)
    m = torch.zeros(W.shape, dtype=functional.compute_dtype(dtype))
    v = torch.zeros(3, dtype=functional.compute_dtype(dtype))
    betas, compared = (0.9, 0.999), 0
    for t in range(40):
        G = torch.from_numpy(rng.standard_normal(W.shape)).to(dtype)
        one = functional.stiefel_adam_step(W, G, m, v, t, 0.05, *betas, 1e-8, 0.5, 0.1)
        counts = torch.full((3,), float(t), dtype=torch.float64)
        per_frame = functional.stiefel_adam_step(W, G, m, v, counts, 0.05, *betas, 1e-8, 0.5, 0.1, sync_free=True)
        if all(float(torch.pow(torch.tensor(b, dtype=torch.float64), float(t + 1))) == b ** (t + 1) for b in betas):
            compared += 1
            assert all(torch.equal(x, y) for x, y in zip(one, per_frame))
        W, m, v = one
    assert compared >= 20


def test_trust_radius_inf_uses_eigh_and_stays_on_manifold():
    W, rng = _frames((2,), 8, 3, "inf")
    parameter = torch.nn.Parameter(W.clone())
    optimizer = StiefelAdam([parameter], lr=0.01, trust_radius=math.inf)
    for _ in range(5):
        parameter.grad = torch.from_numpy(rng.standard_normal(W.shape))
        optimizer.step()
    # steps of length lr sqrt(d r) ~ 0.05: cond(W + xi) <= sqrt(1 + 0.05^2), use Delta = 0.1 above it
    assert float(feasibility(parameter.data).max()) <= feasibility_bound(8, 3, torch.float64, 0.1)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.bfloat16])
def test_state_dict_round_trip_resumes_bit_for_bit(dtype):
    W, rng = _frames((3,), 16, 4, "resume", str(dtype), dtype=dtype)
    gradients = [torch.from_numpy(rng.standard_normal(W.shape)).to(dtype) for _ in range(6)]

    def run(parameter, optimizer, grads):
        for G in grads:
            parameter.grad = G.clone()
            optimizer.step()

    parameter = torch.nn.Parameter(W.clone())
    optimizer = StiefelAdam([parameter], lr=0.05, weight_decay=0.01)
    run(parameter, optimizer, gradients[:3])
    saved_parameter = parameter.detach().clone()
    saved_state = copy.deepcopy(optimizer.state_dict())  # state_dict holds references, as in torch.optim
    run(parameter, optimizer, gradients[3:])

    resumed = torch.nn.Parameter(saved_parameter.clone())
    resumed_optimizer = StiefelAdam([resumed], lr=0.05, weight_decay=0.01)
    resumed_optimizer.load_state_dict(saved_state)
    state = resumed_optimizer.state[resumed]
    assert state["exp_avg"].dtype == functional.compute_dtype(dtype)
    run(resumed, resumed_optimizer, gradients[3:])
    assert torch.equal(resumed.data, parameter.data)
    for key in ("exp_avg", "exp_avg_sq"):
        assert torch.equal(resumed_optimizer.state[resumed][key], optimizer.state[parameter][key])
    assert torch.equal(resumed_optimizer.state[resumed]["step"], torch.full((3,), 6.0, dtype=torch.float64))


def test_param_groups_have_their_own_settings():
    W1, rng = _frames((2,), 6, 2, "groups1")
    W2, _ = _frames((), 5, 5, "groups2")
    p1, p2 = torch.nn.Parameter(W1.clone()), torch.nn.Parameter(W2.clone())
    optimizer = StiefelAdam([{"params": [p1]}, {"params": [p2], "lr": 0.2, "trust_radius": 0.3}], lr=0.01)
    assert optimizer.param_groups[0]["lr"] == 0.01 and optimizer.param_groups[1]["trust_radius"] == 0.3
    G1 = torch.from_numpy(rng.standard_normal(W1.shape))
    G2 = torch.from_numpy(rng.standard_normal(W2.shape))
    p1.grad, p2.grad = G1.clone(), G2.clone()
    optimizer.step()
    zeros = lambda W: (torch.zeros_like(W), torch.zeros(W.shape[:-2], dtype=W.dtype))  # noqa: E731
    expected1 = functional.stiefel_adam_step(W1, G1, *zeros(W1), 0, lr=0.01)[0]
    expected2 = functional.stiefel_adam_step(W2, G2, *zeros(W2), 0, lr=0.2, trust_radius=0.3)[0]
    assert torch.equal(p1.data, expected1) and torch.equal(p2.data, expected2)
    # lr 0.2 on a 5 x 5 frame: first step length 0.2 * 5 = 1 is capped at 0.3
    assert not torch.equal(p2.data, functional.stiefel_adam_step(W2, G2, *zeros(W2), 0, lr=0.2)[0])


def test_closure_is_called_and_its_loss_returned():
    W, rng = _frames((2,), 6, 3, "closure")
    target = torch.from_numpy(rng.standard_normal(W.shape))
    parameter = torch.nn.Parameter(W.clone())
    optimizer = StiefelAdam([parameter], lr=0.05)
    calls = []

    def closure():
        optimizer.zero_grad()
        loss = ((parameter - target) ** 2).sum()
        loss.backward()
        calls.append(loss.item())
        return loss

    losses = [optimizer.step(closure).item() for _ in range(20)]
    assert len(calls) == 20 and losses == calls
    assert losses[-1] < losses[0]
    optimizer.zero_grad()
    assert parameter.grad is None


def test_bad_use_raises_value_error_naming_the_rule():
    frame = stiefel_init_(torch.empty(6, 2, dtype=torch.float64))
    with pytest.raises(ValueError, match=r"params\[0\].*at least 2 dims"):
        StiefelAdam([torch.nn.Parameter(torch.ones(4, dtype=torch.float64))])
    with pytest.raises(ValueError, match=r"r <= d"):
        StiefelAdam([torch.nn.Parameter(torch.zeros(2, 3, dtype=torch.float64))])
    with pytest.raises(ValueError, match=r"W\^T W = I.*stiefel_init_"):
        StiefelAdam([torch.nn.Parameter(2.0 * frame)])
    with pytest.raises(ValueError, match=r"W\^T W = I.*stiefel_init_"):
        StiefelAdam([torch.nn.Parameter(frame.to(torch.bfloat16).to(torch.float64))])
    for kwargs, name in [
        (dict(lr=0.0), "lr"), (dict(lr=math.nan), "lr"), (dict(betas=(1.0, 0.9)), "beta1"),
        (dict(betas=(0.9, -0.1)), "beta2"), (dict(betas=(0.9,)), "betas"), (dict(eps=-1.0), "eps"),
        (dict(trust_radius=0.0), "trust_radius"), (dict(weight_decay=-1e-3), "weight_decay"),
        (dict(retraction_method="qr"), "retraction_method"),
    ]:
        with pytest.raises(ValueError, match=name):
            StiefelAdam([torch.nn.Parameter(frame.clone())], **kwargs)
    with pytest.raises(ValueError, match="lr"):
        StiefelAdam([{"params": [torch.nn.Parameter(frame.clone())], "lr": -1.0}])
    parameter = torch.nn.Parameter(frame.clone())
    optimizer = StiefelAdam([parameter])
    parameter.grad = torch.zeros_like(frame).to_sparse()
    with pytest.raises(ValueError, match="sparse"):
        optimizer.step()


def test_float32_frame_passes_the_storage_dtype_tolerance():
    frame = stiefel_init_(torch.empty(64, 16, dtype=torch.float32), generator=torch.Generator().manual_seed(0))
    assert float(feasibility(frame)) <= manifold_tolerance(64, 16, torch.float32)
    StiefelAdam([torch.nn.Parameter(frame)])  # accepted
    StiefelAdam([torch.nn.Parameter(frame.to(torch.bfloat16))])  # accepted at bfloat16's tolerance


@pytest.mark.parametrize("skip", [False, True])
def test_nonfinite_gradient_in_one_frame(skip):
    """A NaN in frame 1 of p_bad: with skip_nonfinite that frame keeps its frame, moments and
    count while frame 0 of the same tensor and the other parameter step; without it, ValueError
    and nothing at all is written (not even the parameters before it)."""
    W, rng = _frames((2,), 6, 2, "nonfinite")
    p_good, p_bad = torch.nn.Parameter(W.clone()), torch.nn.Parameter(W.clone())
    # two groups with different lr, so that the two parameters are stepped in two batched calls
    optimizer = StiefelAdam([{"params": [p_good], "lr": 0.04}, {"params": [p_bad]}], lr=0.05, skip_nonfinite=skip)
    p_bad.grad = torch.from_numpy(rng.standard_normal(W.shape))
    p_good.grad = p_bad.grad.clone()
    optimizer.step()
    before = {p: (p.detach().clone(), copy.deepcopy(optimizer.state[p])) for p in (p_good, p_bad)}
    p_bad.grad = p_bad.grad.clone()
    p_bad.grad[1, 3, 0] = math.nan
    p_good.grad = torch.from_numpy(rng.standard_normal(W.shape))
    expected = {p: functional.stiefel_adam_step(
        before[p][0], p.grad, before[p][1]["exp_avg"], before[p][1]["exp_avg_sq"], before[p][1]["step"],
        lr, 0.9, 0.999, 1e-8, 0.5, 0.0) for p, lr in ((p_good, 0.04), (p_bad, 0.05))}
    if not skip:
        with pytest.raises(ValueError, match=r"params\[0\] of param group 1: gradient must be finite"):
            optimizer.step()
        for p in (p_good, p_bad):
            assert torch.equal(p.data, before[p][0])
            for key, value in before[p][1].items():
                assert torch.equal(optimizer.state[p][key], value)
        return
    optimizer.step()
    assert optimizer.skipped_steps == 1  # one frame
    W_new, m_new, v_new = expected[p_good]
    assert torch.equal(p_good.data, W_new) and torch.equal(optimizer.state[p_good]["exp_avg"], m_new)
    W_new, m_new, v_new = expected[p_bad]
    state, (W_before, state_before) = optimizer.state[p_bad], before[p_bad]
    assert torch.equal(p_bad.data[0], W_new[0]) and torch.equal(p_bad.data[1], W_before[1])
    assert torch.equal(state["exp_avg"][0], m_new[0]) and torch.equal(state["exp_avg"][1], state_before["exp_avg"][1])
    assert torch.equal(state["exp_avg_sq"], torch.stack([v_new[0], state_before["exp_avg_sq"][1]]))
    assert torch.equal(state["step"], torch.tensor([2.0, 1.0], dtype=torch.float64))
    # the skipped frame goes on from its own count: the next finite step is its second
    p_bad.grad = torch.from_numpy(rng.standard_normal(W.shape))
    W_expected = functional.stiefel_adam_step(p_bad.detach().clone(), p_bad.grad, state["exp_avg"].clone(),
                                              state["exp_avg_sq"].clone(), state["step"].clone(), 0.05)[0]
    optimizer.step()
    assert torch.equal(p_bad.data, W_expected)
    assert torch.equal(optimizer.state[p_bad]["step"], torch.tensor([3.0, 2.0], dtype=torch.float64))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_low_precision_runs_stay_on_the_manifold(dtype):
    """300 steps with clipping and decay: ||W^T W - I|| within feasibility_bound (storage rounding
    2 u_s sqrt(r) plus one retraction's error; no growth with the number of steps), and the
    moments are kept in float32."""
    batch, d, r = (3,), 32, 8
    W, rng = _frames(batch, d, r, "low", str(dtype), dtype=dtype)
    gradients = torch.from_numpy(rng.standard_normal((16,) + W.shape)).to(dtype)
    parameter = torch.nn.Parameter(W.clone())
    optimizer = StiefelAdam([parameter], lr=0.05, weight_decay=0.1)
    for t in range(300):
        parameter.grad = gradients[t % 16].clone()
        optimizer.step()
    assert parameter.dtype == dtype
    assert optimizer.state[parameter]["exp_avg"].dtype == torch.float32
    assert float(feasibility(parameter.data).max()) <= feasibility_bound(d, r, dtype)
    # the frames moved: the run did train
    assert float(torch.linalg.matrix_norm((parameter.data - W).float()).min()) > 0.1


def test_stiefel_init_is_deterministic_and_rejects_wide_tensors():
    a = stiefel_init_(torch.empty(2, 9, 4, dtype=torch.float64), generator=torch.Generator().manual_seed(3))
    b = stiefel_init_(torch.empty(2, 9, 4, dtype=torch.float64), generator=torch.Generator().manual_seed(3))
    assert torch.equal(a, b)
    assert float(feasibility(a).max()) <= manifold_tolerance(9, 4, torch.float64)
    with pytest.raises(ValueError, match="r <= d"):
        stiefel_init_(torch.empty(3, 4))


@pytest.mark.parametrize("skip", [False, True])
def test_a_finite_gradient_that_overflows_the_second_moment_is_refused_not_frozen_in(skip):
    """Entries of 1e37 are finite in float32, and so is W^T G (6 terms), but ||g||^2 is inf: the
    kernel would store v = inf, a zero step now and for ever after (v stays inf). The optimizer
    refuses that step like any other non-finite one, and a NaN is still named as such."""
    p = torch.nn.Parameter(stiefel_init_(torch.empty(2, 6, 3)))
    optimizer = StiefelAdam([p], lr=0.05, skip_nonfinite=skip)
    before = p.detach().clone()
    p.grad = torch.full_like(p, 1e37)
    if skip:
        optimizer.step()
        assert optimizer.skipped_steps == 2  # both frames
        # the state is stored (deciding otherwise would wait for the device), and is the fresh one
        state = optimizer.state[p]
        assert not state["step"].any() and not state["exp_avg"].any() and not state["exp_avg_sq"].any()
    else:
        with pytest.raises(ValueError, match="the step overflowed in torch.float32"):
            optimizer.step()
        assert len(optimizer.state[p]) == 0  # nothing written, not even a fresh state
    assert torch.equal(p.detach(), before)
    if not skip:
        p.grad = p.grad.clone()
        p.grad[0, 0, 0] = float("nan")
        with pytest.raises(ValueError, match="gradient must be finite"):
            optimizer.step()


@pytest.mark.parametrize("skip", [False, True])
def test_step_that_overflows_in_float32_leaves_parameter_and_state_untouched(skip):
    p = torch.nn.Parameter(stiefel_init_(torch.empty(2, 6, 3)))
    optimizer = StiefelAdam([p], lr=0.05, skip_nonfinite=skip)
    p.grad = torch.randn_like(p)
    optimizer.step()
    before_p = p.detach().clone()
    before_state = copy.deepcopy(optimizer.state_dict()["state"])
    p.grad = torch.full_like(p, 3e38)  # finite, but W^T G overflows float32
    if skip:
        optimizer.step()
        assert optimizer.skipped_steps == 2
    else:
        with pytest.raises(ValueError, match="the step overflowed in torch.float32"):
            optimizer.step()
    assert torch.equal(p.detach(), before_p)
    after_state = optimizer.state_dict()["state"]
    for key in ("exp_avg", "exp_avg_sq"):
        assert torch.equal(after_state[0][key], before_state[0][key])
    assert torch.equal(after_state[0]["step"], before_state[0]["step"])


def test_public_polar_retract_refuses_steps_outside_the_newton_schulz_basin():
    W = stiefel_init_(torch.empty(6, 3, dtype=torch.float64))
    xi = functional.project_tangent(W, torch.randn(6, 3, dtype=torch.float64))
    xi = 2.0 * xi / torch.linalg.matrix_norm(xi)
    with pytest.raises(ValueError, match="Newton-Schulz"):
        functional.polar_retract(W, xi, trust_radius=0.5)
    R = functional.polar_retract(W, xi, trust_radius=0.5, method="eigh")
    assert float(feasibility(R)) <= 64 * 18 * 2.0**-53 * 5.0  # cond(W + xi)^2 = 5 enters eigh's error


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("shape", [(3, 2), (8, 4), (16, 4), (6, 6)])
def test_a_noise_driven_step_keeps_its_frame_on_the_manifold(dtype, shape):
    """A zero gradient with weight decay at eps = 0: g = P_W(lambda W) is rounding noise, and the step a
    full-length step in a noise direction, about half normal (docs/algorithm.md#pitfalls). Its frame
    must stay within the manifold tolerance (on the tangent interval alone the Newton-Schulz count left
    it off St by up to 2e8 tolerances in float64, and the frame check then refused it at every step)."""
    generator = torch.Generator().manual_seed(5)
    worst = 0.0
    for _ in range(10):
        W = torch.nn.Parameter(stiefel_init_(torch.empty(*shape, dtype=dtype), generator=generator))
        optimizer = StiefelAdam([W], lr=0.07, betas=(0.8, 0.95), eps=0.0, trust_radius=0.5, weight_decay=0.01)
        for _ in range(2):
            W.grad = torch.zeros_like(W)
            optimizer.step()
        worst = max(worst, float(feasibility(W.detach())) / manifold_tolerance(*shape, dtype))
    assert worst <= 1.0
