"""P4 (O(d)- and O(r)-equivariance): the claim passes for the real step, fails for each control it
must catch (elementwise second moment: the Haar-Q check; QR retraction: the Haar-R check), and its
pieces (signed permutations by indexing, the product rounding, the bitwise tier) do what they say."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings

import reference_impl as ri
from reference_impl.adam import moments_and_direction
from propositions import get_claim
from propositions._common import Profile
from propositions import p4_equivariance as p4

from strategies import seeds

u = 2.0**-53

SMALL = Profile("test", frames=300, steps=3, long_run_steps=10, mp_dps=30, mp_samples=1)


@pytest.fixture(scope="module")
def real_run():
    return get_claim("P4").run(0, SMALL)


def test_real_step_passes_with_every_part_present(real_run):
    result = real_run.to_dict()
    assert result["verdict"] == "pass", result["failures"]
    assert result["symbolic"]["status"] == "proved"
    assert len(result["exact"]) == 3 and all(e["passed"] for e in result["exact"])
    haar = result["extra"]["haar_draws"]
    assert haar["det_minus_one"] > 0 and haar["det_plus_one"] > 0 and haar["square_frames"] > 0
    shapes = {tuple(s) for c in real_run.checks if c.name.startswith("right_haar") for s in c.shapes}
    assert (1024, 128) in shapes and (1, 1) in shapes


def test_real_run_records_both_controls_detected(real_run):
    by_name = {c.name: c for c in real_run.controls}
    assert set(by_name) == {"elementwise_second_moment", "qr_retraction"}
    # elementwise v breaks both actions (the Haar-Q check alone is asserted in its own test below)
    assert by_name["elementwise_second_moment"].detected
    assert by_name["qr_retraction"].detected and by_name["qr_retraction"].check == "right_haar_frames"


@settings(max_examples=3, deadline=None)
@given(seed=seeds)
def test_passes_for_any_seed(seed):
    result = get_claim("P4").run(seed, SMALL)
    assert result.verdict == "pass", result.failures()


def test_elementwise_second_moment_fails_on_the_haar_q_check():
    result = get_claim("P4").run(1, SMALL, optimizer="elementwise_second_moment")
    assert result.verdict == "fail"
    failed = {c.name for c in result.checks if not c.passed}
    assert "left_haar_frames" in failed
    # invariant under signed permutations: the bitwise tier of sign flips does not catch it
    assert "sign_flip_second_moment_bitwise" not in failed


def test_qr_retraction_fails_on_the_haar_r_check():
    result = get_claim("P4").run(1, SMALL, optimizer="qr_retraction")
    assert result.verdict == "fail"
    failed = {c.name for c in result.checks if not c.passed}
    assert "right_haar_frames" in failed
    assert "left_haar_frames" not in failed  # qf(Q A) = Q qf(A): the left action does not see it


@pytest.mark.parametrize("side", ["left", "right"])
def test_signed_permutation_action_equals_the_matmul_bitwise(side):
    rng = np.random.default_rng(7)
    P = ri.random_signed_permutation(5, rng, (4,))
    A = rng.standard_normal((3, 4, 5, 2) if side == "left" else (3, 4, 2, 5))
    act = p4.signed_permutation_action(P, side)
    expected = P @ A if side == "left" else A @ P
    assert np.array_equal(act(A), expected)


def test_product_rounding_bounds_a_haar_product():
    rng = np.random.default_rng(8)
    for n in (1, 3, 64):
        assert p4.product_rounding(n) == (0.0 if n == 1 else pytest.approx(n * math.sqrt(n) * u, rel=1e-9))
        Q = ri.random_orthogonal(n, rng, (20,))
        A = rng.standard_normal((20, n, 4))
        exact_product = np.einsum("bij,bjk->bik", Q.astype(np.longdouble), A.astype(np.longdouble))
        error = np.sqrt(np.sum((Q @ A - exact_product) ** 2, axis=(-2, -1))).astype(np.float64)
        assert np.all(error <= max(p4.product_rounding(n), u) * np.linalg.norm(A, axis=(-2, -1)))


def test_sign_flips_are_bitwise_on_the_certified_stages_and_permutations_are_not():
    evidence = p4.sign_flip_bitwise(0, 200, SMALL, "stiefel_adam")
    checks, frames, fractions = evidence.checks, evidence.frames, evidence.extra["bitwise_fractions"]
    assert [c.name for c in checks] == ["sign_flip_direction_bitwise", "sign_flip_second_moment_bitwise"]
    assert frames >= 200 and all(c.passed and c.max_ratio == 0 for c in checks)
    # the honest part: a general signed permutation changes the summation order of W^T G
    assert fractions["projection_signed_permutation_left"]["fraction"] < 1.0


def _directed_rounding_step(W, G, state, config):
    """StiefelAdam whose update is stored with rounding toward -inf (one ulp off, sign-dependent)."""
    g = ri.project_tangent(W, G + config.weight_decay * W, validate=False)
    m, v, t, xi = moments_and_direction(g, state, config)
    xi = np.nextafter(xi, -np.inf)
    W_new = ri.polar_retract(W, xi, validate=False)
    return W_new, ri.StiefelAdamState(m=ri.project_tangent(W_new, m, validate=False), v=v, t=t), xi


def test_a_sign_dependent_step_fails_the_bitwise_tier_through_the_step():
    """One ulp of sign-dependent rounding is far below the float64 bounds of the Haar and permutation
    checks; the projection called on its own is exact. Only the step's own xi shows it."""
    variant = ri.Variant("directed_rounding", "update rounded toward -inf", ("P4",), ri.init,
                         step_with_direction=_directed_rounding_step)
    result = p4.CLAIM.run(0, SMALL, variant)
    by_name = {c.name: c for c in result.checks}
    assert result.verdict == "fail"
    assert not by_name["sign_flip_direction_bitwise"].passed
    assert by_name["sign_flip_second_moment_bitwise"].passed
    assert all(c.passed for name, c in by_name.items() if not name.startswith("sign_flip"))


def test_a_sampler_without_det_minus_one_makes_the_certificate_inconclusive(monkeypatch):
    original = ri.random_orthogonal

    def rotations_only(n, rng, batch=()):
        Q = original(n, rng, batch)
        flip = np.where(np.linalg.slogdet(Q)[0] < 0, -1.0, 1.0)
        Q = Q.copy()
        Q[..., :, 0] *= flip[..., None]
        return Q

    monkeypatch.setattr(ri, "random_orthogonal", rotations_only)
    result = p4.CLAIM.run(0, SMALL)
    assert result.verdict == "inconclusive"
    assert any("det -1" in reason for reason in result.inconclusive)
    assert result.extra["haar_draws"]["det_minus_one"] == 0


def test_every_haar_shape_holds_both_components(real_run):
    by_shape = real_run.extra["haar_draws"]["by_shape"]
    assert by_shape and all(negative > 0 and (positive > 0 or negative < 2) for negative, positive, _ in by_shape.values())
    assert p4.component_coverage(real_run.extra["haar_draws"]) == []


def test_exact_tier_covers_both_determinants():
    exact = p4.exact_part(0)
    assert all(e["passed"] for e in exact)
    assert "-1" in exact[0]["description"]


def test_sign_flips_of_a_step_without_hook_are_held_to_the_inverse_bound():
    plain = ri.Variant("plain", "the real step without its hook", (), ri.init, ri.step)
    evidence = p4.sign_flip_bitwise(0, 100, SMALL, plain)
    checks, frames = evidence.checks, evidence.frames
    by_name = {c.name: c for c in checks}
    assert by_name["sign_flip_direction"].passed and by_name["sign_flip_direction"].samples == 2 * frames
    assert by_name["sign_flip_second_moment_bitwise"].passed


@pytest.mark.parametrize("side, label", [("left", "left_haar"), ("right", "right_haar")])
def test_chunk_tasks_draw_what_a_sequential_run_draws(monkeypatch, side, label):
    # one frame per chunk: a chunk's Haar draws depend on the determinant signs its shape's earlier
    # chunks met, which a task that runs one chunk replays (_replay_draws); every chunk must draw
    # the matrices that one loop over the chunks, carrying the signs seen, draws
    from propositions.kit import running_bounds

    monkeypatch.setattr(running_bounds, "CHUNK_ENTRIES", 16)
    small = Profile("test", frames=60, steps=2, long_run_steps=10, mp_dps=30, mp_samples=1)
    sequential, seen = [], {}
    for d, r, count, index in running_bounds.plan_chunks(p4.shape_plan(small, frames=60, large=())):
        n = d if side == "left" else r
        rng, _, _ = p4._draw(0, d, r, count, small.steps, label, index)
        _, _, O, resampled, _ = p4._transform(side, "haar", n, rng, count, seen.setdefault((d, r), set()))
        sequential.append((d, r, index, O.tobytes(), resampled))
    drawn = []
    record = p4._record_draws

    def recording(name, O, resampled, square):
        drawn.append((O.tobytes(), resampled))
        return record(name, O, resampled, square)

    monkeypatch.setattr(p4, "_record_draws", recording)
    evidence = p4.action_check(0, small, "stiefel_adam", side, 60, (), label)
    assert sum(resampled for *_, resampled in sequential) > 0  # the replay matters here
    assert drawn == [(O, resampled) for *_, O, resampled in sequential]
    assert evidence.extra["haar_draws"]["by_shape"]
    assert all(check.samples for check in evidence.checks if not check.name.endswith("_replayed"))
