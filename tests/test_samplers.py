"""The sampler certificate: the reference's Haar samplers pass, every broken sampler is caught."""

import math

import numpy as np
import pytest
from scipy import stats

from certify import claims
from propositions import get_claim, get_profile, samplers
from propositions._common import DETECTION_FACTOR
from reference_impl import manifold


@pytest.fixture(scope="module")
def real_result():
    return samplers.CLAIM.run(0, get_profile("quick"))


def test_reference_samplers_pass_and_every_control_is_detected(real_result):
    assert real_result.verdict == "pass", real_result.failures()
    assert {c.name for c in real_result.controls} == set(samplers.CLAIM.control_names)
    for control in real_result.controls:
        assert control.detected and control.margin >= DETECTION_FACTOR, control.to_dict()
    body = real_result.to_dict()
    assert body["extra"]["tests"] == samplers.total_tests() == sum(len(samplers.statistical_plan(s.storage)) for s in samplers.tested_samplers())
    assert math.isclose(body["extra"]["alpha_per_test"] * body["extra"]["tests"], samplers.FAMILY_WISE_ALPHA)
    # each bound is -log10 alpha_i > 0, so "residual <= bound" is "p >= alpha_i"
    for check in body["numerical"]["checks"]:
        assert check["bound"]["min"] > 0


def test_each_control_is_caught_by_the_check_that_sees_its_defect(real_result):
    caught_by = {c.name: c.check.split(":", 1)[1] for c in real_result.controls}
    assert caught_by["qr_without_sign_fix"] in ("first_entry_sign", "corner_sign_product")
    assert caught_by["normalized_not_orthogonalized"] == "orthonormality"
    assert caught_by["uniform_entries_qr"] in ("first_entry_beta", "last_entry_beta", "so3_rotation_angle")


def _checks_of_reference(seed=0):
    evidence = samplers.run_tests(samplers.reference_sampler(), seed, samplers.CONTROL_SAMPLES)
    return {c.name: c for c in evidence.checks}


def test_a_sampler_without_the_sign_fix_fails(monkeypatch):
    monkeypatch.setattr(manifold, "haar_from_gaussian", lambda Z: np.linalg.qr(Z)[0])
    checks = _checks_of_reference()
    assert not checks["first_entry_sign"].passed
    assert not checks["corner_sign_product"].passed


def test_a_sampler_folded_onto_det_plus_one_fails(monkeypatch):
    real = manifold.haar_from_gaussian

    def det_plus_one(Z):
        W = real(Z)
        if W.shape[-1] == W.shape[-2]:
            W = W.copy()
            W[..., -1] *= np.where(np.linalg.det(W) < 0, -1.0, 1.0)[..., None]
        return W

    monkeypatch.setattr(manifold, "haar_from_gaussian", det_plus_one)
    checks = _checks_of_reference()
    assert not checks["det_sign"].passed
    assert checks["first_entry_beta"].passed  # the marginals of single entries do not see it


def test_a_sampler_of_unnormalised_gaussians_fails(monkeypatch):
    monkeypatch.setattr(manifold, "haar_from_gaussian", lambda Z: Z)
    assert not _checks_of_reference()["orthonormality"].passed


def test_a_control_as_the_sampler_under_test_fails():
    result = samplers.CLAIM.run(0, get_profile("quick"), optimizer="signs_fixed_by_first_column")
    assert result.verdict == "fail"
    assert result.extra["sampler"] == "signs_fixed_by_first_column"


def test_p_values_are_scipys():
    rng = np.random.default_rng(5)
    for n in (20, 1_000, 10_000):
        values = rng.beta(0.5, 1.5, n) ** 1.05
        cdf = stats.beta(0.5, 1.5).cdf
        reference = stats.kstest(values, cdf)
        minus_log10_p, statistic = samplers.ks_residual(values, cdf)
        assert statistic == pytest.approx(reference.statistic, rel=1e-12)
        assert minus_log10_p == pytest.approx(-math.log10(reference.pvalue), rel=1e-9, abs=1e-12)
        positive = rng.random(n) < 0.53
        minus_log10_p, share = samplers.sign_residual(positive)
        exact = stats.binomtest(int(positive.sum()), n, 0.5).pvalue
        assert minus_log10_p == pytest.approx(-math.log10(exact), rel=1e-9, abs=1e-12)


def test_underflowing_p_values_give_a_proven_lower_bound():
    n = 10_000
    minus_log10_p, _ = samplers.sign_residual(np.zeros(n, dtype=bool))
    # the exact p-value is 2^(1 - n); the Chernoff bound 2 exp(-n ln 2) is the same number here
    assert minus_log10_p == pytest.approx((n - 1) * math.log10(2.0), rel=1e-12)
    values = np.linspace(0.5, 1.0, n)  # uniform on [1/2, 1] tested against uniform on [0, 1]: D = 1/2
    minus_log10_p, statistic = samplers.ks_residual(values, lambda x: x)
    assert statistic == pytest.approx(0.5)
    assert math.isfinite(minus_log10_p)
    assert minus_log10_p >= (2 * n * 0.25 - math.log(2.0)) / math.log(10.0) * (1 - 1e-12)


def test_so3_angle_law_is_a_cdf():
    theta = np.linspace(0.0, np.pi, 101)
    F = samplers.so3_angle_cdf(theta)
    assert F[0] == 0.0 and F[-1] == pytest.approx(1.0)
    assert np.all(np.diff(F) >= 0)


def test_registered_for_certify_run():
    assert claims.normalise_id("Samplers") == "samplers"
    assert "samplers" in claims.ALL_IDS
    assert get_claim("SAMPLERS") is samplers.CLAIM
    with pytest.raises(ValueError, match="unknown optimizer"):
        samplers.CLAIM.run(0, get_profile("quick"), optimizer="no_such_thing")


def test_stiefel_init_is_tested_in_every_storage_dtype(real_result):
    pytest.importorskip("torch")
    names = {check.name for check in real_result.checks}
    for dtype in samplers.TORCH_DTYPES:
        for test in ("orthonormality", "first_entry_beta", "last_entry_beta", "first_entry_sign", "corner_sign_product", "det_sign"):
            assert f"stiefel_init_{dtype}:{test}" in names
    assert "stiefel_init_float64:so3_rotation_angle" in names and "stiefel_init_bfloat16:so3_rotation_angle" not in names
    assert real_result.extra["samplers"] == ["reference"] + [f"stiefel_init_{d}" for d in samplers.TORCH_DTYPES]


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_the_rounded_law_of_an_entry_is_exact(dtype):
    """F(y) and F(y-) of a squared entry stored in a low-precision dtype, against the empirical law of
    exact Beta-distributed entries rounded to that dtype: within the DKW band of 10^5 draws."""
    torch = pytest.importorskip("torch")
    d = 3
    rng = np.random.default_rng(7)
    exact = rng.standard_normal((100_000, d))
    entry = exact[:, 0] / np.linalg.norm(exact, axis=1)
    stored = torch.tensor(entry).to(getattr(torch, dtype)).to(torch.float64).numpy()
    values = np.unique(np.abs(stored))[::97]
    at, below = samplers.rounded_cdfs(values, d, dtype)
    empirical_at = np.searchsorted(np.sort(np.abs(stored)), values, side="right") / stored.size
    empirical_below = np.searchsorted(np.sort(np.abs(stored)), values, side="left") / stored.size
    band = math.sqrt(math.log(2 / 1e-6) / (2 * stored.size))  # DKW at level 1e-6
    assert np.max(np.abs(at - empirical_at)) < band and np.max(np.abs(below - empirical_below)) < band
    assert np.all(below <= at)


def test_a_stiefel_init_by_qr_without_the_sign_fix_is_caught():
    pytest.importorskip("torch")
    evidence = samplers.broken_sampler(samplers.Context(0, get_profile("quick"), optimizer=samplers.TORCH_QR_CONTROL))
    assert max(check.max_ratio for check in evidence.checks) >= DETECTION_FACTOR


def test_a_stiefel_init_that_raises_fails_the_tests_it_could_not_run(monkeypatch):
    """stiefel_init_ written to draw in the tensor's dtype (torch's SVD has no bfloat16 kernel on CPU):
    the bfloat16 tests fail with the error as their reason, the others still run."""
    torch = pytest.importorskip("torch")
    import torch_impl

    real = torch_impl.stiefel_init_

    def in_its_dtype(tensor, generator=None):
        if tensor.dtype == torch.bfloat16:
            torch.linalg.svd(torch.ones(tensor.shape, dtype=tensor.dtype))
        return real(tensor, generator)

    monkeypatch.setattr(torch_impl, "stiefel_init_", in_its_dtype)
    evidence = samplers.run_tests("stiefel_init_bfloat16", 0, 2000, prefix="b:")
    assert all(not check.passed for check in evidence.checks if check.samples)
    assert any("raised" in note for note in evidence.notes)
    assert all(check.passed for check in samplers.run_tests("stiefel_init_float32", 0, 2000, prefix="f:").checks if check.samples)
