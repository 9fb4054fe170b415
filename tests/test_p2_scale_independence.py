"""P2 (independence of gradient scale): the claim passes for the real step, fails for the control it
must catch, and its bounds and domain scan behave as their derivations say."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings

import reference_impl as ri
from reference_impl.adam import clip_to_trust_region, moments_and_direction
from propositions import get_claim
from propositions._common import Profile
from propositions import p2_scale_independence as p2

from strategies import seeds

u = 2.0**-53

# Small enough for a few hypothesis examples; still every check, shape class and control runs.
SMALL = Profile("test", frames=300, steps=3, long_run_steps=10, mp_dps=30, mp_samples=1)


@pytest.fixture(scope="module")
def real_run():
    return get_claim("P2").run(0, SMALL)


def test_real_step_passes_with_every_part_present(real_run):
    result = real_run.to_dict()
    assert result["verdict"] == "pass", result["failures"]
    assert result["symbolic"]["status"] == "proved"
    assert all(e["passed"] for e in result["exact"])
    names = {c["name"] for c in result["numerical"]["checks"]}
    assert {"trajectory_scale_invariance", "trajectory_scale_invariance_decay", "power_of_two_bitwise", "eps_deviation"} <= names
    assert real_run.frames >= SMALL.frames * 0.9
    shapes = {tuple(s) for c in real_run.checks for s in c.shapes}
    assert (1024, 128) in shapes and (1, 1) in shapes and (16, 16) in shapes


def test_real_run_records_the_controls_detected(real_run):
    assert [control.name for control in real_run.controls] == ["fixed_step_sgd", "hidden_eps"]
    assert all(control.detected and control.margin > 1e6 for control in real_run.controls)


def test_hidden_eps_escapes_a_shortened_exponent_range(monkeypatch):
    """The control that holds power_of_two_bitwise to its whole range: k cut to [-30, 30] lets it through."""
    from propositions import p2_scale_independence as p2
    from propositions.kit.common import ControlResult
    from propositions.kit.protocol import Context

    def margin():
        evidence = p2.hidden_eps(Context(0, SMALL, "hidden_eps"))
        return ControlResult.from_checks("hidden_eps", "", evidence.checks).margin

    assert margin() > 1e6
    monkeypatch.setattr(p2, "LOG2_C_RANGE_BITWISE", (-30, 30))
    assert margin() < 1


@settings(max_examples=3, deadline=None)
@given(seed=seeds)
def test_passes_for_any_seed(seed):
    result = get_claim("P2").run(seed, SMALL)
    assert result.verdict == "pass", result.failures()


def test_fixed_step_sgd_fails():
    result = get_claim("P2").run(1, SMALL, optimizer="fixed_step_sgd")
    assert result.verdict == "fail"
    failed = {c.name for c in result.checks if not c.passed}
    assert "trajectory_scale_invariance" in failed and "power_of_two_bitwise" in failed


def test_eps_deviation_bound_limits():
    xi = np.array([0.1, 0.1, 2.0, 2.0])
    v_hat = np.array([1.0, 1.0, 1.0, 0.0])
    bound = p2.eps_deviation_bound(xi, v_hat, scale=np.array([1e30, 1e-30, 1e-30, 1.0]), eps=1e-8, trust_radius=0.5)
    # x -> 0: no deviation; x -> inf: at most the whole (clipped) step; v^ = 0: both steps are zero.
    assert bound[0] == pytest.approx(0.1 * 1e-38, rel=1e-6)
    assert bound[1] == pytest.approx(0.1, rel=1e-12)
    assert bound[2] == pytest.approx(0.5, rel=1e-12)
    assert bound[3] == 0.0


def test_eps_deviation_bound_holds_for_one_step():
    rng = np.random.default_rng(3)
    W = ri.random_point(6, 2, rng, (200,))
    G = rng.standard_normal(W.shape)
    c = 10.0 ** rng.uniform(-12, 0, size=200)
    zero = ri.StiefelAdamConfig(lr=0.05, eps=0.0)
    with_eps = ri.StiefelAdamConfig(lr=0.05, eps=1e-8)
    W_zero, _, norms = p2.record_trajectory(W, G[None], zero)
    W_eps, _ = ri.step(W, c[:, None, None] * G, ri.init(W), with_eps)
    deviation = np.linalg.norm(W_eps - W_zero[0], axis=(-2, -1))
    bound = p2.eps_deviation_bound(norms["xi_norm"][0], norms["v_hat"][0], c, 1e-8, 0.5)
    # exact-arithmetic bound plus a rounding allowance of 10^3 u (two steps of a (6, 2) frame)
    assert np.all(deviation <= bound + 1e3 * u)
    # and it is not loose where eps matters: within a factor 2 where the deviation is large
    large = bound > 1e-6
    assert np.all(deviation[large] >= 0.5 * bound[large])


def test_rounding_bound_grows_with_steps_size_and_small_scale_under_decay():
    rng = np.random.default_rng(4)
    config = ri.StiefelAdamConfig(lr=0.02, eps=0.0, weight_decay=0.1)
    bounds = {}
    for d, r in ((4, 2), (64, 16)):
        W = ri.random_point(d, r, rng, (8,))
        _, _, norms = p2.record_trajectory(W, rng.standard_normal((5, 8, d, r)), config)
        bound = p2.trajectory_rounding_bound(norms, d, r, config)["W"]
        assert np.all(bound > 0) and np.all(np.diff(bound, axis=0) > 0)
        bounds[d] = bound
        small_c = p2.trajectory_rounding_bound(norms, d, r, config, scale=1e-6)["W"]
        assert np.all(small_c > bound)  # the unscaled lambda W rounds relative to c ||g||
    assert np.all(bounds[64].min() > bounds[4].max())


def test_rounding_bound_is_infinite_once_vacuous():
    norms = {key: np.ones((3, 1)) for key in ("G_norm", "g_norm", "m_norm", "v", "v_hat", "xi_norm")}
    bound = p2.trajectory_rounding_bound(norms, 3, 2, p2.CONFIG, initial_distance=0.6)["W"]
    assert np.all(np.isinf(bound))


def test_domain_scan_finds_the_predicted_float64_limits():
    scan = p2.domain_scan(0)
    low, high = scan["log2_c_bitwise"]
    predicted = scan["predicted"]
    assert low < -400 and high > 400
    # the found limits sit where the float64 analysis puts them (within the slack of using the first
    # step's g for all steps: a few binades)
    assert abs(low - predicted["log2_c_bitwise_low"]) <= 8
    assert abs(high - predicted["log2_c_bitwise_high"]) <= 8
    statuses = set(scan["status"])
    assert "v underflowed to 0 (zero step)" in statuses
    assert "non-finite" in statuses or "||g||^2 overflowed (zero step)" in statuses
    k = np.array(scan["log2_c"])
    status = np.array(scan["status"])
    assert np.all(status[(k >= low) & (k <= high)] == "bitwise")


def test_normal_space_pitfall_is_a_full_step_without_eps():
    pitfall = p2.normal_space_pitfall(0)
    for row in pitfall["shapes"]:
        assert row["riemannian_gradient_norm_median"] < 1e3 * u * row["euclidean_gradient_norm_median"]
        assert row["xi_norm_eps0_median"] == pytest.approx(row["full_step_length"], rel=1e-10)
        assert row["step_eps0_median"] > 1e6 * row["step_eps_default_median"]


def test_bitwise_power_of_two_one_step():
    rng = np.random.default_rng(5)
    W = ri.random_point(5, 3, rng, (10,))
    G = rng.standard_normal(W.shape)
    W1, s1 = ri.step(W, G, ri.init(W), p2.CONFIG)
    W2, s2 = ri.step(W, math.ldexp(1.0, -77) * G, ri.init(W), p2.CONFIG)
    assert np.array_equal(W1, W2)
    assert np.array_equal(s2.v, math.ldexp(1.0, -154) * s1.v)


def test_symbolic_reduction_detects_a_non_identity():
    import sympy as sp

    W, G = sp.MatrixSymbol("W", 4, 2), sp.MatrixSymbol("G", 4, 2)
    c, lr = sp.symbols("c lr", positive=True)
    projection = G - W * (W.T * G + G.T * W) / 2
    assert not p2.is_zero(projection)
    # the fixed-step SGD direction is not degree 0 in c: xi(c) - xi(1) does not vanish
    assert not p2.is_zero(-lr * c * projection + lr * projection)
    assert p2.is_zero(-lr * c * projection / c + lr * projection)


def test_vacuous_decay_bounds_are_replayed_at_high_precision(monkeypatch):
    """Below c = 10^-2 the carried decay bound reaches 2 sqrt(r) for some frames: each is replayed at
    the profile's mp_dps digits against the same claim (kit/running_bounds.replay_pair) and certified
    there; without the mpmath tier (mp_dps = 0) each is compared over the steps where its bound is
    informative, and the certificate counts them and says how far the shortest went."""
    import dataclasses

    from propositions import get_profile

    from propositions.kit import running_bounds

    monkeypatch.setattr(p2, "LOG10_C_RANGE_DECAY", (-6.0, 6.0))
    monkeypatch.setattr(p2, "MEDIUM_SHAPES", ())  # small frames: a replay at 30 digits takes milliseconds there
    # c down to 10^-6 with decay, beyond the claim's range, meets vacuous bounds more often than the
    # replay budget of the claim's own regime allows (the next test): the machinery is tested with it lifted
    monkeypatch.setattr(running_bounds, "REPLAY_RATE", 1.0)
    profile = dataclasses.replace(get_profile("quick"), mp_dps=30)
    result = p2.CLAIM.run(2, profile)
    vacuous = result.extra["vacuous_bounds"]
    assert vacuous > 0
    assert result.extra["frames_certified"]["replayed_at_high_precision"] == vacuous
    assert result.extra["frames_certified"]["over_their_first_steps"] == result.extra["frames_certified"]["not_compared"] == 0
    replayed = [c for c in result.checks if c.name.endswith("_replayed")]
    assert sum(c.samples for c in replayed) == vacuous and all(c.passed for c in replayed)
    assert result.verdict == "pass", result.failures() + result.inconclusive
    without = p2.CLAIM.run(2, dataclasses.replace(profile, mp_dps=0))
    assert without.verdict == "pass", without.failures() + without.inconclusive
    certified = without.extra["frames_certified"]
    assert certified["replayed_at_high_precision"] == 0
    assert certified["over_their_first_steps"] + certified["not_compared"] == vacuous
    assert 0 < certified["shortest_compared_run"] < profile.steps
    assert any(f"compared over their first steps only (as few as {certified['shortest_compared_run']} of {profile.steps})" in note
               for note in without.notes)


def test_more_vacuous_frames_than_the_budget_are_not_replayed_and_make_the_claim_inconclusive(monkeypatch):
    """The same extended regime at the claim's own replay budget (one frame per chunk plus 10^-3 of its
    frames): a chunk with more vacuous frames replays none of them, since a replay certifies the mpmath
    twin of the algorithm, not the code under test; the claim is inconclusive and says so."""
    import dataclasses

    from propositions import get_profile

    monkeypatch.setattr(p2, "LOG10_C_RANGE_DECAY", (-6.0, 6.0))
    monkeypatch.setattr(p2, "MEDIUM_SHAPES", ())
    result = p2.CLAIM.run(2, dataclasses.replace(get_profile("quick"), mp_dps=30))
    certified = result.extra["frames_certified"]
    assert 0 < certified["replayed_at_high_precision"] < result.extra["vacuous_bounds"]
    assert result.verdict == "inconclusive"
    (reason,) = [text for text in result.inconclusive if "replay budget" in text]
    assert "not the code under test" in reason
    assert any("certify the algorithm through the twin, not the float64 code under test" in note for note in result.notes)


def test_a_projection_without_sym_in_the_reference_fails_without_replaying_a_frame(monkeypatch):
    """A broken reference (g = G - W W^T G) makes nearly every running bound vacuous. No frame is
    replayed in the mpmath twin (which would certify its correct algorithm in place of the broken
    code, a second or more a frame): the claim fails on its model comparison, at once."""
    from propositions import get_profile
    from reference_impl import adam, manifold

    def without_sym(W, G, *, validate=True):
        return G - W @ (np.swapaxes(W, -1, -2) @ G)

    monkeypatch.setattr(manifold, "project_tangent", without_sym)
    monkeypatch.setattr(adam, "project_tangent", without_sym)
    result = p2.CLAIM.run(0, get_profile("quick"))
    assert result.verdict == "fail"
    assert result.extra["frames_certified"]["replayed_at_high_precision"] == 0
    assert any("replay budget" in text for text in result.inconclusive)
    assert any(name.startswith("trajectory_model_W") for name in (c.name for c in result.checks if not c.passed))


# Broken steps built here: plausible mistakes that the earlier checks (W_t only; an eps bound that
# allowed any deviation up to min(||xi||, Delta) x / (1 + x)) let through.


def _moments(W, G, state, config):
    g = ri.project_tangent(W, G + config.weight_decay * W, validate=False)
    return moments_and_direction(g, state, config)


def _normalized_eps_step(W, G, state, config):
    """eps added to the normalised step, xi = -lr (m^ / sqrt(v^)) / (1 + eps): scale-free, so with
    eps dominating (c sqrt(v^) << eps) it takes a full step where the claim predicts a tiny one."""
    plain = ri.StiefelAdamConfig(lr=config.lr, betas=config.betas, eps=0.0, trust_radius=config.trust_radius,
                                 weight_decay=config.weight_decay)
    m, v, t, xi = _moments(W, G, state, plain)
    xi = xi / (1.0 + config.eps)
    W_new = ri.polar_retract(W, xi, validate=False)
    return W_new, ri.StiefelAdamState(m=ri.project_tangent(W_new, m, validate=False), v=v, t=t)


def _eps_inside_sqrt_step(W, G, state, config):
    """xi = -lr m^ / sqrt(v^ + eps): moves less than the claim predicts where c sqrt(v^) ~ sqrt(eps)."""
    beta1, beta2 = config.betas
    g = ri.project_tangent(W, G + config.weight_decay * W, validate=False)
    d, r = W.shape[-2:]
    m = beta1 * state.m + (1 - beta1) * g
    v = beta2 * state.v + (1 - beta2) * np.sum(g * g, axis=(-2, -1)) / (d * r)
    t = state.t + 1
    m_hat, v_hat = m / (1 - beta1**t), v / (1 - beta2**t)
    xi = np.where((v_hat > 0)[..., None, None], -config.lr * m_hat / np.sqrt(v_hat + config.eps)[..., None, None], 0.0)
    xi = clip_to_trust_region(xi, config.trust_radius)
    W_new = ri.polar_retract(W, xi, validate=False)
    return W_new, ri.StiefelAdamState(m=ri.project_tangent(W_new, m, validate=False), v=v, t=t)


def _normalized_moment_step(W, G, state, config):
    """Stores the first moment in units of sqrt(v) (m / sqrt(v)) and restores it on the next step:
    every W_t is right, the stored m is not c m (it does not scale at all)."""
    v_previous = np.asarray(state.v)
    scale_in = np.where(v_previous > 0, np.sqrt(v_previous), 1.0)[..., None, None]
    restored = ri.StiefelAdamState(m=state.m * scale_in, v=state.v, t=state.t)
    m, v, t, xi = _moments(W, G, restored, config)
    W_new = ri.polar_retract(W, xi, validate=False)
    scale_out = np.where(v > 0, np.sqrt(v), 1.0)[..., None, None]
    return W_new, ri.StiefelAdamState(m=ri.project_tangent(W_new, m, validate=False) / scale_out, v=v, t=t)


def test_eps_check_is_two_sided_and_tight_where_eps_dominates():
    evidence = p2.eps_check(0, SMALL, "stiefel_adam", frames=200)
    check = evidence.check("eps_deviation")
    assert check.passed and evidence.frames >= 200
    # rounding-level bounds, not ~ ||xi||: the largest bound is at least six decades below the
    # shortest step of the plan (min(lr sqrt(d r), Delta) >= lr at d = r = 1), so a step of the wrong
    # length by any visible fraction fails
    assert check.to_dict()["bound"]["max"] < 1e-6 * min(p2.CONFIG.lr, p2.CONFIG.trust_radius)


def test_eps_added_to_the_normalised_step_fails_the_eps_check():
    variant = ri.Variant("normalized_eps", "eps on the normalised step", ("P2",), ri.init, _normalized_eps_step)
    check = p2.eps_check(1, SMALL, variant, frames=200).check("eps_deviation")
    assert check.max_ratio > 1e6


def test_eps_inside_the_square_root_fails_the_eps_check():
    variant = ri.Variant("eps_in_sqrt", "eps inside the square root", ("P2",), ri.init, _eps_inside_sqrt_step)
    check = p2.eps_check(1, SMALL, variant, frames=200).check("eps_deviation")
    assert check.max_ratio > 1e6


def test_a_first_moment_that_does_not_scale_fails_though_every_frame_is_right():
    variant = ri.Variant("normalized_moment", "m stored as m / sqrt(v)", ("P2",), ri.init, _normalized_moment_step)
    result = p2.CLAIM.run(0, SMALL, variant)
    by_name = {c.name: c for c in result.checks}
    assert result.verdict == "fail"
    assert by_name["trajectory_scale_invariance"].passed
    assert by_name["trajectory_scale_invariance_first_moment"].max_ratio > 1e6
    assert by_name["trajectory_scale_invariance_second_moment"].passed
    assert not by_name["power_of_two_moments_bitwise"].passed


def test_moment_checks_pass_for_the_real_step(real_run):
    by_name = {c.name: c for c in real_run.checks}
    for name in ("trajectory_scale_invariance_first_moment", "trajectory_scale_invariance_second_moment",
                 "trajectory_scale_invariance_decay_first_moment", "trajectory_scale_invariance_decay_second_moment"):
        assert by_name[name].passed and by_name[name].samples > 0
    assert by_name["power_of_two_moments_bitwise"].passed and by_name["power_of_two_moments_bitwise"].max_ratio == 0


def test_vacuous_frames_are_counted_in_every_chunk(monkeypatch):
    """A frame whose bound reaches 2 sqrt(r) is counted wherever its chunk falls: with bounds made
    vacuous everywhere and several chunks per shape, every frame is counted once."""
    from propositions.kit import running_bounds

    monkeypatch.setattr(running_bounds, "CHUNK_ENTRIES", 64)
    original = p2._rounding_bounds

    def vacuous(*args, **kwargs):
        one, scaled, power = original(*args, **kwargs)
        return {**one, "W": one["W"] + 10.0}, scaled, power

    monkeypatch.setattr(p2, "_rounding_bounds", vacuous)
    profile = Profile("test", frames=60, steps=2, long_run_steps=10, mp_dps=30, mp_samples=1)
    plan = p2.shape_plan(profile, frames=60, large=())
    assert len(running_bounds.plan_chunks(plan)) > 2 * len(plan)  # several chunks per shape
    evidence = p2.trajectory_check(0, profile, "stiefel_adam", weight_decay=0.0, frames=60, label="t",
                                   log10_c_range=p2.LOG10_C_RANGE, large=())
    assert evidence.extra["counts"]["vacuous"] == evidence.frames >= 60


def test_figure_points_stop_once_the_figure_is_full():
    def chunks(count, size):
        return p2.Evidence(extra={"figure_points": [{"c": [1.0] * size, "x": [2.0] * size} for _ in range(count)]})

    assert len(p2._figure_points(chunks(3, 300), ("c", "x"))["x"]) == 600  # a chunk is appended while < FIGURE_POINTS
    assert len(p2._figure_points(chunks(5, 100), ("c", "x"))["c"]) == p2.FIGURE_POINTS == 400
    assert p2._figure_points(chunks(0, 1), ("c",)) == {"c": []}
