"""The claim 'optimizer' (propositions/optimizer_class.py) over drawn scenarios
(propositions/optimizer_scenarios.py): the real StiefelAdam passes in float64, float32 and bfloat16
with every feature of the grammar covered, each broken subclass fails it, a feature left uncovered
makes it inconclusive, and a failing run shrinks to a short one that `certify regression` replays."""

from dataclasses import replace

import pytest

pytest.importorskip("torch")

from propositions import optimizer_scenarios as grammar  # noqa: E402
from propositions._common import get_profile, rng_for  # noqa: E402
from propositions.optimizer_class import CLAIM, CONTROL_NAMES, CONTROLS, broken_subjects, replay, run_scenario, shrink  # noqa: E402
from propositions.optimizer_class import counterexample_record  # noqa: E402


@pytest.fixture(scope="module")
def quick_result():
    return CLAIM.run(seed=3, profile=get_profile("quick"))


def test_the_class_passes_in_three_dtypes_with_every_feature_covered(quick_result):
    result = quick_result
    assert result.verdict == "pass", result.failures() + result.inconclusive
    names = {check.name for check in result.checks}
    for dtype in grammar.DTYPES:
        for check in ("frame", "first_moment", "second_moment", "step_count", "count_dtype", "no_gradient_untouched",
                      "nonfinite_frame_untouched", "refused_step_untouched", "refusal_names_parameter", "skipped_count",
                      "closure_loss", "euclidean_is_adamw", "checkpoint_round_trip", "checkpoints_change_nothing"):
            assert f"{dtype}/{check}" in names
        coverage = result.extra[f"coverage_{dtype}"]
        assert set(coverage) == set(grammar.FEATURES)
        assert all(entry["count"] >= 1 and entry["runs"] >= 1 for entry in coverage.values()), coverage
        assert result.extra[f"runs_{dtype}"]["longest_run_steps"] > grammar.COUNT_LIMIT
    assert all(check.samples > 0 for check in result.checks)
    assert sorted(control.name for control in result.controls) == sorted(CONTROL_NAMES)
    assert all(control.detected for control in result.controls)
    assert result.extra["unit_roundoffs_bfloat16"] == {"W": 2.0**-8, "m_v": 2.0**-24, "compute": 2.0**-24}


@pytest.mark.parametrize("name", CONTROL_NAMES)
def test_each_broken_class_fails_a_check_of_the_claim_by_the_detection_factor(name):
    """The claim's own control part, at another seed than the claim's run above."""
    from propositions._common import DETECTION_FACTOR
    from propositions.kit.protocol import Context
    from propositions.optimizer_class import control_part

    evidence = control_part(Context(4, get_profile("quick"), optimizer=name))
    assert max(check.max_ratio for check in evidence.checks if check.samples) >= DETECTION_FACTOR
    assert name in broken_subjects() or CONTROLS[name].part == "refusals"
    # a control is caught by the class it breaks, never by an error of the claim's own code
    for check in evidence.checks:
        if check.name.endswith("scenario_completes") and check.worst and check.worst.get("raised_at"):
            assert not check.worst["raised_at"].startswith("propositions/"), check.worst


def test_the_plan_is_deterministic_and_covers_every_feature_for_many_seeds():
    settings = grammar.plan_settings(get_profile("quick"))
    for seed in range(12):
        for dtype in grammar.DTYPES:
            runs, missing = grammar.draw_plan(seed, dtype, settings, rng_for)
            assert missing == []
            again, _ = grammar.draw_plan(seed, dtype, settings, rng_for)
            assert [s.to_dict() for s in runs] == [s.to_dict() for s in again]
            assert sum(1 for op in runs[0].ops if op.kind in grammar.STEP_KINDS) >= grammar.LONG_RUN_STEPS


def test_a_feature_left_out_makes_the_claim_inconclusive_and_names_it(monkeypatch):
    """Without checkpoint operations in the grammar the coverage of checkpoint_old_format is zero."""
    original = grammar.draw_ops

    def without_old_checkpoints(rng, groups, missing, steps):
        ops = original(rng, groups, missing, steps)
        kept = tuple(op for op in ops if not (op.kind == "checkpoint" and op.option == "old_format"))
        return tuple(replace(op, id=i) for i, op in enumerate(kept))

    monkeypatch.setattr(grammar, "draw_ops", without_old_checkpoints)
    monkeypatch.setattr(grammar, "plan_settings", lambda profile: grammar.PlanSettings(runs=2, steps=6, max_runs=3))
    from propositions.optimizer_class import dtype_part
    from propositions.kit.protocol import Context

    evidence = dtype_part("float64", Context(0, get_profile("quick")))
    assert evidence.extra["coverage_float64"]["checkpoint_old_format"] == {"count": 0, "runs": 0}
    assert any("checkpoint_old_format" in reason for reason in evidence.inconclusive)


def test_scenarios_round_trip_through_json():
    runs, _ = grammar.draw_plan(5, "bfloat16", grammar.plan_settings(get_profile("quick")), rng_for)
    for scenario in runs:
        data = scenario.to_dict()
        assert grammar.scenario_from_dict(data) == scenario
        assert grammar.scenario_from_dict(__import__("json").loads(__import__("json").dumps(data))) == scenario


def test_a_failing_run_shrinks_and_the_record_replays():
    """A class whose skipped frames still advance their counts: the shrunk run is short, still fails
    the same check, and replays (the record `certify regression` writes) fail on it and pass on the real class."""
    subject = broken_subjects()["count_advances_on_skip"]
    runs, _ = grammar.draw_plan(2, "float64", grammar.plan_settings(get_profile("quick")), rng_for)
    failing = next(s for s in runs[1:] if "float64/step_count" in run_scenario(s, 2, subject).failing())
    shrunk = shrink(failing, 2, "float64/step_count", subject)
    assert shrunk.complete
    assert len(shrunk.scenario.ops) <= 3 and shrunk.scenario.size() < failing.size()
    assert "float64/step_count" in run_scenario(shrunk.scenario, 2, subject).failing()
    record = counterexample_record(shrunk, 2, run_scenario(shrunk.scenario, 2, subject))
    assert replay(record["replay"], subject).fails
    assert not replay(record["replay"]).fails
    kinds = [event.kind for op in shrunk.scenario.ops for event in op.events]
    assert any(kind in grammar.NONFINITE for kind in kinds)


def test_the_walk_tells_skipped_refused_and_untouched_frames_apart():
    settings = grammar.Settings(0.02, (0.9, 0.999), 1e-8, 0.5, 0.0, True)
    groups = (grammar.Group("f0", "stiefel", ((3, 4, 2), (4, 2)), settings),
              grammar.Group("f1", "stiefel", ((2, 4, 2),), replace(settings, skip_nonfinite=False)))
    ops = (grammar.Op(0, "step", (grammar.Event("nan", "f0", 0, 1, 0), grammar.Event("no_grad", "f0", 1))),
           grammar.Op(1, "step", (grammar.Event("inf", "f1", 0, 1, 3), grammar.Event("nan", "f0", 0, 0, 0))))
    plans = [plan for _, plan in grammar.walk(grammar.Scenario("float64", "t", groups, ops))]
    first, second = plans
    assert first.frames[("f0", 0, 1)] == "skip" and first.frames[("f0", 0, 0)] == "step" and first.frames[("f0", 1, 0)] == "keep"
    assert "nonfinite_frame_not_last_of_call" in first.features and not first.refused
    assert second.refused and second.offenders == [(1, 0)] and "refused_step_not_first_parameter" in second.features
    assert set(second.frames.values()) == {"keep"}


def test_an_overflowing_gradient_on_a_one_by_one_frame_is_a_finite_step():
    """St(1, 1) has the tangent space {0}: g = G - W W^T G = 0 whatever G, so nothing overflows."""
    assert not grammar.nonfinite_step("overflow", (3, 1, 1))
    assert grammar.nonfinite_step("overflow", (2, 1)) and grammar.nonfinite_step("nan", (1, 1))


def test_the_refusals_cover_every_foreign_option_the_adamw_and_geoopt_apis_have():
    from propositions import optimizer_class

    names = {name for name, _ in optimizer_class.FOREIGN_ASKING}
    assert names == {"amsgrad", "maximize", "foreach", "fused", "capturable", "differentiable", "decoupled_weight_decay", "stabilize"}
    assert {name for name, _ in optimizer_class.FOREIGN_BENIGN} == names


def test_the_walk_keeps_a_frame_off_the_manifold_until_it_is_projected_and_refuses_its_checkpoint():
    settings = grammar.Settings(0.02, (0.9, 0.999), 1e-8, 0.5, 0.0, True)
    groups = (grammar.Group("f0", "stiefel", ((2, 4, 2),), settings),
              grammar.Group("f1", "stiefel", ((4, 2),), replace(settings, skip_nonfinite=False)))
    ops = (grammar.Op(0, "step", (grammar.Event("off_manifold", "f0", 0, 1),)),
           grammar.Op(1, "step"),
           grammar.Op(2, "checkpoint", option="same"),
           grammar.Op(3, "project", option=("f0", 0)),
           grammar.Op(4, "checkpoint", option="fresh"),
           grammar.Op(5, "clip_step", (grammar.Event("off_manifold", "f1", 0, 0), grammar.Event("nan", "f0", 0, 0, 2)), option=0.5))
    plans = [plan for _, plan in grammar.walk(grammar.Scenario("float64", "t", groups, ops))]
    assert plans[0].frames[("f0", 0, 1)] == "off" and plans[0].frames[("f0", 0, 0)] == "step"
    assert plans[1].frames[("f0", 0, 1)] == "off" and "off_manifold_frame" in plans[1].features
    assert plans[2].refused and "checkpoint_refused_off_manifold" in plans[2].features
    assert "project" in plans[3].features and not plans[4].refused
    assert plans[5].refused and "off_manifold_refused" in plans[5].features and "clip_with_nonfinite_unit" in plans[5].features


def test_a_drifted_frame_run_checks_the_projection_and_the_counters():
    """The real class on the scenario above, in bfloat16: every check of the run passes and the
    projection, off-manifold counter and clip checks have samples."""
    settings = grammar.Settings(0.02, (0.9, 0.999), 1e-8, 0.5, 0.0, True)
    groups = (grammar.Group("f0", "stiefel", ((2, 4, 2),), settings),
              grammar.Group("f1", "stiefel", ((4, 2),), replace(settings, skip_nonfinite=False)),
              grammar.Group("e0", "euclidean", ((3,), (2, 2)), replace(settings, lr_tensor=True)))
    ops = (grammar.Op(0, "step", (grammar.Event("off_manifold", "f0", 0, 1),)), grammar.Op(1, "clip_step", option=0.5),
           grammar.Op(2, "checkpoint", option="same"), grammar.Op(3, "project", option=("f0", 0)), grammar.Op(4, "step"),
           grammar.Op(5, "checkpoint", option="fresh"), grammar.Op(6, "schedule", option=0.5), grammar.Op(7, "step"))
    outcome = run_scenario(grammar.Scenario("bfloat16", "t", groups, ops), 0)
    assert outcome.failing() == [] and outcome.raised is None
    for name in ("stiefel_project", "clip_grad_norm_finite", "skipped_count", "checkpoint_round_trip", "euclidean_is_adamw"):
        assert outcome.checks[[k for k, c in outcome.checks.items() if c.name == f"bfloat16/{name}"][0]].samples > 0


def test_a_control_that_ignores_its_generator_reads_the_same_whatever_ran_before():
    """certify verify re-runs a certificate in a fresh process: the control whose stiefel_init_ draws
    from torch's global generator must give the same residual from any global state (the claim seeds
    that generator from its seed while it draws), and the caller's global state is left as it was."""
    import torch

    from propositions.kit.protocol import Context

    control = next(c for c in CLAIM.controls if c.name == "init_ignores_generator")
    residuals = []
    for before in (0, 5):
        torch.manual_seed(before)
        expected_next = torch.randn(3, generator=torch.Generator().manual_seed(before))
        torch.manual_seed(before)
        found = control.run(Context(seed=0, profile=get_profile("quick"), optimizer=control.name))
        assert torch.equal(torch.randn(3), expected_next)  # the global generator restored
        check = next(c for c in found.checks if c.name == "stiefel_init_reproducible")
        assert check.max_ratio >= 10
        residuals.append(check.worst["residual"])
    assert residuals[0] == residuals[1]


def test_pending_bounds_are_the_bounds_of_each_step():
    """_PendingBounds.settle evaluates the bounds of many steps in one step_error call: each step's
    samples must meet the bound that its own evaluation gives, in its own order and with its own
    extra. The steps here have different counts (t = 1, 2, 3 in one settle: the frames stepped
    earlier are ahead), and a frame with a zero gradient at eps = 0 (v^ = 0, the step exactly 0)."""
    import numpy as np

    import reference_impl as ref
    from propositions.kit.kernel_bounds import step_error_bound
    from propositions.optimizer_class import _Batch, _Frames, _PendingBounds

    rng = np.random.default_rng(5)
    d, r = 5, 2
    frames = _Frames(ref.random_point(d, r, rng, batch=(4,)))
    config = ref.StiefelAdamConfig(lr=0.01, betas=(0.9, 0.999), eps=0.0, trust_radius=0.5)
    pending, expected = _PendingBounds(), []
    for step, stepping in enumerate(([0, 1], [0, 1, 2], [0, 1, 2, 3])):
        G = rng.standard_normal((4, d, r))
        G[3] = 0.0  # frame 3: g = 0, v^ = 0, exactly still
        for chosen, W_ref, state_ref, moment, q, rounding, inputs in frames.step(stepping, G, config, "bfloat16"):
            own = step_error_bound(d, r, config, q, rounding, inputs)
            residuals = {name: rng.random(len(chosen)) for name in ("W", "m", "v")}
            extra = {"step": step, "frames": chosen.tolist(), "t": int(state_ref.t)}
            pending.add((d, r, config, rounding), q, inputs, residuals, extra, chosen)
            expected.append((own, residuals, extra, chosen))
            frames.advance(chosen, W_ref, state_ref, moment)
    assert sorted({e[2]["t"] for e in expected}) == [1, 2, 3]
    batch, undefined = _Batch(), []
    pending.settle(batch, undefined)
    entries = {name: list(batch.samples[name]) for name in ("W", "m", "v")}
    not_posed = []
    for own, residuals, extra, chosen in expected:
        posed = np.asarray(own["well_posed"], dtype=bool)
        names = ("W", "m", "v") if posed.any() else ("v",)
        for name in names:
            residual, bound, found_extra = entries[name].pop(0)
            keep = posed if name != "v" else np.ones_like(posed)
            assert found_extra is extra
            np.testing.assert_array_equal(residual, residuals[name][keep])
            # the same evaluation but for beta^t, an array power here and a scalar one per step (one ulp
            # apart for a few t); through the stages that moves a bound by a few ulps, far below 1e-12
            np.testing.assert_allclose(bound, own[name][keep], rtol=1e-12, atol=0)
        not_posed += [int(k) for k in np.asarray(chosen)[~posed]]
    assert all(not rest for rest in entries.values())
    assert [u["frame"] for u in undefined] == not_posed


def test_the_pairwise_coverage_counts_the_pairs_the_plans_exercise_together():
    """Every feature is drawn in every dtype (the claim requires it), so feature x dtype is complete;
    the counts add up, and a missed pair is named."""
    from propositions.optimizer_class import PAIR_FACTORS, pairwise_coverage

    found = pairwise_coverage(0, get_profile("quick"))
    assert found["pairs"]["feature x dtype"]["reached"] == found["pairs"]["feature x dtype"]["of"] == \
        len(PAIR_FACTORS["feature"]) * len(PAIR_FACTORS["dtype"])
    assert found["reached"] == sum(t["reached"] for t in found["pairs"].values()) <= found["of"]
    for table in found["pairs"].values():
        assert table["reached"] + len(table["missed"]) == table["of"]


def test_max_ulps_counts_a_nan_only_where_both_hold_one():
    import math

    import numpy as np

    from propositions.optimizer_class import _max_ulps

    assert _max_ulps([1.0, math.nan], [1.0, 2.0]) == math.inf and _max_ulps([1.0, 2.0], [1.0, math.nan]) == math.inf
    assert _max_ulps([math.nan, 1.0], [1.0, math.nan]) == math.inf
    assert _max_ulps([1.0, math.nan], [1.0, math.nan]) == 0.0 and _max_ulps(np.ones(3), np.ones(3)) == 0.0
    assert _max_ulps([1.0], [np.nextafter(1.0, 2.0)]) == 1.0  # one ulp apart, in ulps of y
