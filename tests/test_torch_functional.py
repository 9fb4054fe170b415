"""torch_impl.functional's stages: the step's d x r^2 product count, the r x r ||P_W G~||^2 and its
fallback (and that the fallback is needed), the deferred transport of the moment, and the frame
drift bound that the r x r identity relies on."""

import math

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import reference_impl as ref  # noqa: E402
from propositions._common import rng_for  # noqa: E402
from torch.utils._python_dispatch import TorchDispatchMode  # noqa: E402
from torch_impl import StiefelAdam, feasibility, functional  # noqa: E402


pytestmark = pytest.mark.usefixtures("one_torch_thread")  # conftest.py


class _CountProducts(TorchDispatchMode):
    """Counts batched matmuls with an operand of d rows (the d x r^2 products; r x r ones are not)."""

    def __init__(self, d):
        super().__init__()
        self.d, self.count = d, 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func in (torch.ops.aten.bmm.default, torch.ops.aten.baddbmm.default, torch.ops.aten.baddbmm_.default):
            if any(torch.is_tensor(a) and a.dim() == 3 and self.d in a.shape[-2:] for a in args):
                self.count += 1
        return func(*args, **(kwargs or {}))


def _frames(batch, d, r, *key, dtype=torch.float32):
    rng = rng_for(0, "test_torch_functional", *key)
    return torch.from_numpy(ref.random_point(d, r, rng, (batch,))).to(dtype), rng


def _products_of_one_step(W, G, m, v):
    counter = _CountProducts(W.shape[-2])
    with counter:
        functional.stiefel_adam_step(W, G, m, v, 3, lr=1e-2)
    return counter.count


def test_the_step_takes_five_products_and_six_for_a_mostly_normal_gradient():
    W, rng = _frames(4, 96, 12, "count")
    tangent = functional.project_tangent(W, torch.from_numpy(rng.standard_normal(W.shape)).float())
    m, v = 0.1 * tangent, torch.full((4,), 1e-2)
    G = torch.from_numpy(rng.standard_normal(W.shape)).float()
    assert _products_of_one_step(W, G, m, v) == 5
    symmetric = torch.from_numpy(rng.standard_normal((4, 12, 12))).float()
    normal = W @ (symmetric + symmetric.mT)
    assert _products_of_one_step(W, normal + 1e-4 * tangent, m, v) == 6


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_gram_identity_is_used_for_a_random_gradient_and_is_accurate(dtype):
    """The r x r value is within the rounding that step_error_bound allows the explicit route."""
    d, r = 256, 32
    W, rng = _frames(6, d, r, "identity", str(dtype), dtype=dtype)
    G = torch.from_numpy(rng.standard_normal(W.shape)).to(dtype)
    WtG = W.mT @ G
    drift = functional.frame_drift_bound(d, r, dtype, 0.5)
    counter = _CountProducts(d)
    with counter:
        value = functional.gradient_norm_squared(W, G, WtG, drift)
    assert counter.count == 0  # no d x r^2 product: the identity was used
    W64, G64 = W.double(), G.double()
    exact = torch.linalg.vector_norm(functional.project_tangent(W64, G64), dim=(-2, -1)).square()
    u = functional.unit_roundoff(dtype)
    g_norm, G_norm = exact.sqrt(), torch.linalg.vector_norm(G64, dim=(-2, -1))
    allowance = u * (d * r * exact + 2 * (d + r + 2) * math.sqrt(r) * g_norm * G_norm)
    assert torch.all((value.double() - exact).abs() <= allowance)


def test_gram_identity_falls_back_where_it_would_break_the_bound():
    """G~ = W S + a small tangent part (weight decay, or a loss flat along the frame): the
    identity ||G~||^2 - ||Sigma||^2 cancels, and its error exceeds the explicit route's allowance;
    the stage must form g instead (and then meets the allowance)."""
    d, r = 128, 16
    W, rng = _frames(4, d, r, "fallback")
    symmetric = torch.from_numpy(rng.standard_normal((4, r, r))).float()
    tangent = functional.project_tangent(W, torch.from_numpy(rng.standard_normal(W.shape)).float())
    G = W @ (symmetric + symmetric.mT) + 1e-3 * tangent
    WtG = W.mT @ G
    value = functional.gradient_norm_squared(W, G, WtG, functional.frame_drift_bound(d, r, torch.float32, 0.5))
    exact = torch.linalg.vector_norm(functional.project_tangent(W.double(), G.double()), dim=(-2, -1)).square()
    u = functional.unit_roundoff(torch.float32)
    G_norm = torch.linalg.vector_norm(G.double(), dim=(-2, -1))
    allowance = u * (d * r * exact + 2 * (d + r + 2) * math.sqrt(r) * exact.sqrt() * G_norm)
    assert torch.all((value.double() - exact).abs() <= allowance)
    sigma = 0.5 * (WtG + WtG.mT)
    identity = torch.linalg.vector_norm(G, dim=(-2, -1)).square() - torch.linalg.vector_norm(sigma, dim=(-2, -1)).square()
    assert torch.any((identity.double() - exact).abs() > allowance)


def test_the_returned_moment_is_transported_by_the_next_step():
    """m_new is tangent at the old frame; the next step's projection of beta1 m + (1 - beta1) G~
    equals beta1 P_{W+}(m) + (1 - beta1) P_{W+}(G~) (float64, to rounding)."""
    W, rng = _frames(3, 20, 5, "transport", dtype=torch.float64)
    G = torch.from_numpy(rng.standard_normal(W.shape))
    zeros = (torch.zeros_like(W), torch.zeros(3, dtype=torch.float64))
    W1, m1, v1 = functional.stiefel_adam_step(W, G, *zeros, 0, lr=0.05)
    assert float(torch.linalg.matrix_norm(functional.project_tangent(W, m1) - m1).max()) <= 1e-14  # tangent at W
    assert float(torch.linalg.matrix_norm(functional.project_tangent(W1, m1) - m1).min()) > 1e-3  # not tangent at W1
    G2 = torch.from_numpy(rng.standard_normal(W.shape))
    m2, _ = functional.project_moment(W1, G2, m1, 0.9)
    expected = 0.9 * functional.transported_moment(W1, m1) + 0.1 * functional.project_tangent(W1, G2)
    assert float(torch.linalg.matrix_norm(m2 - expected).max()) <= 1e-13


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_frames_stay_within_the_drift_bound_the_identity_relies_on(dtype):
    """500 optimizer steps (clipping, decay): every frame within frame_drift_bound; the bound is
    what gradient_norm_squared assumes of its input frames."""
    batch, d, r = 3, 48, 6
    W, rng = _frames(batch, d, r, "drift", str(dtype), dtype=dtype)
    gradients = torch.from_numpy(rng.standard_normal((16,) + W.shape)).to(dtype)
    parameter = torch.nn.Parameter(W.clone())
    optimizer = StiefelAdam([parameter], lr=0.05, weight_decay=0.1)
    bound = functional.frame_drift_bound(d, r, dtype, 0.5)
    worst = 0.0
    for t in range(500):
        parameter.grad = gradients[t % 16].clone()
        optimizer.step()
        worst = max(worst, float(feasibility(parameter.data).max()))
    assert worst <= bound
    # a frame rounded to bfloat16 is outside the float32 bound: the bound is not vacuous
    assert float(feasibility(parameter.data.to(torch.bfloat16)).max()) > functional.frame_drift_bound(d, r, torch.float32, 0.5)


def test_drift_bound_is_infinite_for_the_eigh_retraction():
    assert math.isinf(functional.frame_drift_bound(64, 8, torch.float32, math.inf))
    assert math.isinf(functional.frame_drift_bound(64, 8, torch.float32, 0.5, "eigh"))
    assert np.isfinite(functional.frame_drift_bound(64, 8, torch.float32, 0.5))


def test_sharper_drift_term_is_tried_before_forming_g():
    """With a drift bound between what ||Sigma||_F^2 and ||Sigma^2||_F allow, the identity is kept
    (no d x r^2 product); with a larger one, g is formed."""
    d, r = 128, 16
    W, rng = _frames(4, d, r, "sharp")
    G = torch.from_numpy(rng.standard_normal(W.shape)).float()
    WtG = W.mT @ G
    u = functional.unit_roundoff(torch.float32)
    sigma = 0.5 * (WtG + WtG.mT)
    q_G = torch.linalg.vector_norm(G, dim=(-2, -1)).square()
    q_S = torch.linalg.vector_norm(sigma, dim=(-2, -1)).square()
    identity = q_G - q_S
    rounding = u * ((d * r + 3) * q_G + 2 * (d + 2) * math.sqrt(r) * (q_S * q_G).sqrt() + (r * r + 3) * q_S + identity.abs())
    explicit = u * (d * r * identity + 2 * (d + r + 2) * math.sqrt(r) * (identity * q_G).sqrt())
    coarse_limit = float(((explicit - rounding) / q_S).min())
    sharp_limit = float(((explicit - rounding) / torch.linalg.vector_norm(sigma @ sigma, dim=(-2, -1))).min())
    assert 0 < coarse_limit < sharp_limit
    for drift, products in ((0.5 * coarse_limit, 0), (0.5 * (coarse_limit + sharp_limit), 0), (2 * sharp_limit, 1)):
        counter = _CountProducts(d)
        with counter:
            functional.gradient_norm_squared(W, G, WtG, drift)
        assert counter.count == products, drift


def test_a_frames_step_does_not_depend_on_the_other_frames_of_its_batch():
    """The route of ||P_W G~||^2 is chosen per frame: a frame whose gradient forces the explicit
    route (a mostly normal G~) must leave its neighbours' steps bit for bit as they are alone."""
    d, r = 32, 4
    W, rng = _frames(3, d, r, "per-frame route")
    W = W.double()
    G = torch.from_numpy(rng.standard_normal(W.shape))
    symmetric = torch.from_numpy(rng.standard_normal((r, r)))
    # frame 2: G~ = W S + a tiny tangent part, where the r x r identity would cancel
    G[2] = W[2] @ (symmetric + symmetric.mT) + 1e-9 * functional.project_tangent(W[2:3], G[2:3])[0]
    m, v = torch.zeros_like(W), torch.zeros(3, dtype=torch.float64)
    together = functional.stiefel_adam_step(W, G, m, v, 0)
    alone = functional.stiefel_adam_step(W[:2], G[:2], m[:2], v[:2], 0)
    for batch_result, alone_result in zip(together, alone):
        assert torch.equal(batch_result[:2], alone_result)


@pytest.mark.parametrize("shape", [(20, 10), (5, 2), (32, 4)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_a_frame_stepped_alone_equals_it_in_a_batch_of_sixteen(shape, dtype):
    """Whether the Gram identity is tested must not depend on the batch (gram_identity_worth_testing
    is a rule of (d, r)): each of 16 frames, half of them with a tangent gradient (which passes the
    test wherever it is made), stepped alone equals the same frame in the batch, bit for bit, at
    shapes where the rule makes no test and where it does."""
    d, r = shape
    W, rng = _frames(16, d, r, "alone", str(dtype), dtype=dtype)
    G = torch.from_numpy(rng.standard_normal(W.shape)).to(dtype)
    G[::2] = functional.project_tangent(W[::2], G[::2])
    m, v = torch.zeros_like(W), torch.zeros(16, dtype=dtype)
    together = functional.stiefel_adam_step(W, G, m, v, 0)
    for k in range(16):
        alone = functional.stiefel_adam_step(W[k:k + 1], G[k:k + 1], m[k:k + 1], v[k:k + 1], 0)
        for batch_result, alone_result in zip(together, alone):
            assert torch.equal(batch_result[k:k + 1], alone_result), (k, shape)


@pytest.mark.parametrize("k", [-200, -100, 100, 200])
def test_the_step_is_bitwise_invariant_under_power_of_two_gradient_scales(k):
    """eps = 0: W+ of 2^k G equals W+ of G bit for bit and m scales by 2^k exactly, for a batch of
    frames at scales 1, 2^-200, 2^200, 10^-3 (P2 through the torch kernel). Every quantity of degree
    2 in the gradient stays a normal float64 (|exponent| <= 800 < 1022); one of degree 4 would not."""
    d, r = 16, 4
    W, rng = _frames(4, d, r, "power of two")
    W = W.double()
    scales = torch.tensor([1.0, 2.0**-200, 2.0**200, 1e-3], dtype=torch.float64)[:, None, None]
    G = torch.from_numpy(rng.standard_normal(W.shape)) * scales
    m, v = torch.zeros_like(W), torch.zeros(4, dtype=torch.float64)
    W1, m1, v1 = functional.stiefel_adam_step(W, G, m, v, 0, eps=0.0)
    W2, m2, v2 = functional.stiefel_adam_step(W, G * 2.0**k, m, v, 0, eps=0.0)
    assert torch.equal(W2, W1)
    assert torch.equal(m2, m1 * 2.0**k)


_RULE_SHAPES = ((4, 2), (8, 4), (20, 10), (16, 16), (64, 32), (32, 8), (64, 8), (64, 16), (128, 16), (128, 32), (256, 32))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_the_gram_identity_is_tested_where_random_gradients_pass_it(dtype, monkeypatch):
    """gram_identity_worth_testing, a speed rule from (d, r) alone, against a measurement: with the
    test forced on, 32 frames with Gaussian gradients, each stepped alone, take the identity (no
    d x r^2 product) in the majority exactly where the rule makes the test."""
    rule = {shape: functional.gram_identity_worth_testing(
        *shape, functional.frame_drift_bound(*shape, dtype, 0.5) / functional.unit_roundoff(dtype)) for shape in _RULE_SHAPES}
    monkeypatch.setattr(functional, "gram_identity_worth_testing", lambda d, r, drift_per_u: True)
    for d, r in _RULE_SHAPES:
        W, rng = _frames(32, d, r, "rule", str(dtype), dtype=dtype)
        G = torch.from_numpy(rng.standard_normal(W.shape)).to(dtype)
        drift = functional.frame_drift_bound(d, r, dtype, 0.5)
        identity = 0
        WtG = W.mT @ G
        for k in range(32):
            counter = _CountProducts(d)
            with counter:
                functional.gradient_norm_squared(W[k:k + 1], G[k:k + 1], WtG[k:k + 1], drift)
            identity += counter.count == 0
        assert (identity > 16) == rule[(d, r)], ((d, r), identity)
    assert not rule[(20, 10)] and rule[(256, 32)]


def test_where_the_identity_is_not_tested_g_is_formed_at_once():
    """At one (20, 10) frame (d r^2 = 2000) the step forms g without the test, even for a tangent
    gradient (which would pass it): six d x r^2 products, no r x r product of the sharper test, no
    wait for the device; the value is the explicit route's, bit for bit."""
    d, r = 20, 10
    W, rng = _frames(1, d, r, "no test")
    G = functional.project_tangent(W, torch.from_numpy(rng.standard_normal(W.shape)).float())
    assert not functional.gram_identity_worth_testing(d, r, functional.frame_drift_bound(d, r, torch.float32, 0.5) / 2.0**-24)
    m, v = torch.zeros_like(W), torch.zeros(1)
    assert _products_of_one_step(W, G, m, v) == 6
    WtG = W.mT @ G

    class _NoWait(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            assert func not in (torch.ops.aten.is_nonzero.default, torch.ops.aten._local_scalar_dense.default), func
            return func(*args, **(kwargs or {}))

    with _NoWait():
        value = functional.gradient_norm_squared(W, G, WtG, functional.frame_drift_bound(d, r, torch.float32, 0.5))
    explicit = torch.linalg.vector_norm(torch.baddbmm(G, W, 0.5 * (WtG + WtG.mT), alpha=-1.0), dim=(-2, -1)).square()
    assert torch.equal(value, explicit)
