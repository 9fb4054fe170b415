"""The coverage contract (propositions/coverage_contract.py): a narrowed claim holds less evidence
than the contract says, and its certificate is inconclusive."""

from __future__ import annotations

import copy
import json

from propositions import coverage_contract as cc
from propositions._common import PROFILES


def _check(name, shapes, samples, max_ratio):
    return {"name": name, "shapes": [list(s) for s in shapes], "samples": samples, "max_ratio": max_ratio}


def _certificate(*checks):
    return {"numerical": {"checks": list(checks)}}


def _contract():
    return cc.written([_certificate(_check("a", [(3, 2), (5, 1)], 40, 0.5), _check("b", [(3, 2)], 10 + seed, 0.0))
                       for seed in range(3)])


def test_a_fixed_count_and_a_stable_ratio_are_contracted_a_moving_count_is_held_to_one():
    contract = _contract()
    assert contract["a"] == {"shapes": ["3x2", "5x1"], "samples": 40, "fixed": True, "max_ratio_at_least": 0.5 / cc.RATIO_SLACK}
    assert contract["b"] == {"shapes": ["3x2"], "samples": 1, "fixed": False}


def test_a_largest_ratio_that_moves_between_seeds_is_held_loosely_and_zero_residuals_still_fall_short():
    contract = cc.written([_certificate(_check("a", [(3, 2)], 40, ratio)) for ratio in (0.01, 0.03, 0.02)])
    assert contract["a"]["max_ratio_at_least"] == 0.01 / cc.UNSTABLE_SLACK
    wanted = {"quick": {"P9": contract}}
    assert cc.shortfalls("P9", "quick", [_check("a", [(3, 2)], 40, 0.004)], wanted) == []
    assert cc.shortfalls("P9", "quick", [_check("a", [(3, 2)], 40, 0.0)], wanted)


def test_each_narrowing_is_a_shortfall_and_the_full_run_is_none():
    contract = {"quick": {"P9": _contract()}}
    full = [_check("a", [(3, 2), (5, 1)], 40, 0.4), _check("b", [(3, 2)], 3, 0.0)]
    assert cc.shortfalls("P9", "quick", full, contract) == []
    narrowed = {
        "a shape dropped": [_check("a", [(3, 2)], 40, 0.4), full[1]],
        "half the samples": [_check("a", [(3, 2), (5, 1)], 20, 0.4), full[1]],
        "a bound loosened tenfold": [_check("a", [(3, 2), (5, 1)], 40, 0.04), full[1]],
        "a check gone": [full[0]],
    }
    for what, checks in narrowed.items():
        assert cc.shortfalls("P9", "quick", checks, contract), what
    assert cc.shortfalls("P9", "thorough", narrowed["a check gone"], contract) == []  # no contract at that profile


def test_the_committed_contract_covers_every_claim_at_quick_and_default():
    profiles = cc.load()
    assert set(profiles) == {"quick", "default"} <= set(PROFILES)
    for claims in profiles.values():
        assert {"P1", "P2", "P3", "P4", "P5", "P6", "crosscheck", "optimizer", "bookkeeping", "projection", "samplers"} <= set(claims)
        assert all(entry["samples"] >= 1 for checks in claims.values() for entry in checks.values())


def test_the_committed_certificates_meet_the_contract():
    from pathlib import Path

    for path in sorted(Path(__file__).resolve().parents[1].glob("reports/*.json")):
        certificate = json.loads(path.read_text(encoding="utf-8"))
        if "numerical" not in certificate or certificate["numerical"].get("profile") != "default":
            continue
        assert cc.shortfalls(certificate["id"], "default", certificate["numerical"]["checks"]) == [], path.name
        # and a copy with one contracted shape taken out of a check falls short
        wanted = cc.load()["default"][certificate["id"]]
        named = [c for c in certificate["numerical"]["checks"] if wanted.get(c["name"], {}).get("shapes")]
        if named:
            narrowed = copy.deepcopy(certificate["numerical"]["checks"])
            target = next(c for c in narrowed if c["name"] == named[0]["name"])
            target["shapes"] = target["shapes"][1:] if target["shapes"][0] == [int(n) for n in wanted[target["name"]]["shapes"][0].split("x")] \
                else [s for s in target["shapes"] if "x".join(map(str, s)) != wanted[target["name"]]["shapes"][0]]
            assert cc.shortfalls(certificate["id"], "default", narrowed), path.name


def test_the_same_residuals_added_twice_are_named_and_fresh_ones_are_not():
    import numpy as np

    from propositions._common import NumericalCheck

    residuals = np.random.default_rng(0).uniform(0.0, 1e-16, 32)
    check = NumericalCheck("c", "d", "b")
    check.add(residuals, 1e-15, shape=(3, 2), key=("P9", "x", 3, 2, 0))
    check.add(residuals * 1.5, 1e-15, shape=(3, 2), key=("P9", "x", 3, 2, 1))
    assert check.repeated == []
    check.add(residuals, 1e-15, shape=(3, 2), key=("P9", "x", 3, 2, 2))  # chunk 2 drew what chunk 0 drew
    assert len(check.repeated) == 1 and "P9/x/3/2/0" in check.repeated[0][0]
    # rounding-level residuals take a few values and coincide by chance: not fingerprinted
    quantized = NumericalCheck("q", "d", "b")
    for index in range(2):
        quantized.add(np.array([0.0, 1.1e-16, 2.2e-16] * 8), 1e-15, key=("P9", "q", index))
    assert quantized.repeated == []
    # a merge of partial checks sees a repeat across them too
    first, second = NumericalCheck("m", "d", "b"), NumericalCheck("m", "d", "b")
    first.add(residuals, 1e-15, key=("P9", "m", 0))
    second.add(residuals, 1e-15, key=("P9", "m", 1))
    assert first.merge(second).repeated


def test_a_key_that_no_longer_separates_streams_makes_every_claim_inconclusive(monkeypatch):
    import numpy as np

    from propositions.kit import common, protocol

    assert protocol._stream_defects(0, "P9") == []
    monkeypatch.setattr(common, "rng_for", lambda seed, *key: np.random.Generator(np.random.PCG64(np.random.SeedSequence(int(seed)))))
    assert any("same stream for different keys" in reason for reason in protocol._stream_defects(0, "P9"))


def test_the_draw_ledger_counts_distinct_keys_per_group_wherever_the_tasks_ran():
    from propositions.kit.common import rng_for
    from propositions.kit.parallel import drawing, map_tasks
    from propositions.kit.protocol import draw_counts

    with drawing() as drawn:
        rng_for(0, "P9", "x", 3, 2, 0)
        rng_for(0, "P9", "x", 3, 2, 0)  # the same stream asked twice counts once
        map_tasks(_draw_in_a_task, [(index,) for index in range(3)])
        with drawing():  # an inner frame keeps its own (a control's redraws)
            rng_for(0, "P9", "x", 9, 9, 9)
    assert draw_counts(drawn) == {"P9/x": 1, "P9/y": 3}
    rng_for(0, "P9", "z")  # outside any frame: nothing is recorded, nothing fails


def _draw_in_a_task(index):
    from propositions.kit.common import rng_for

    return rng_for(0, "P9", "y", index).standard_normal()


def test_a_key_cut_short_or_a_group_gone_is_a_draw_shortfall():
    certificates = [{"extra": {"draw_keys": {"P9/x": 12, "P9/y": 30 + seed}}} for seed in range(3)]
    contract = cc.written_draws(certificates)
    assert contract == {"P9/x": {"keys": 12, "fixed": True}, "P9/y": {"keys": int(30 // cc.STABLE), "fixed": False}}
    wanted = {"quick": {"P9": contract}}
    assert cc.draw_shortfalls("P9", "quick", {"P9/x": 12, "P9/y": 16}, wanted) == []
    for what, found in {"a key without its chunk index": {"P9/x": 4, "P9/y": 31},
                        "every key of a group one stream": {"P9/x": 12, "P9/y": 1},
                        "a group gone": {"P9/y": 31}}.items():
        assert cc.draw_shortfalls("P9", "quick", found, wanted), what
    assert cc.draw_shortfalls("P9", "thorough", {}, wanted) == []


def test_a_range_cut_short_is_a_reach_shortfall_and_draws_near_the_ends_are_not():
    def certificate(low, high):
        return _certificate({**_check("a", [(3, 2)], 40, 0.5), "reach": {"log10_lambda": [low, high], "steps": [8.0, 8.0]}})

    contract = cc.written([certificate(-6.0 + 0.01 * seed, 3.0 - 0.02 * seed) for seed in range(3)])
    reach = contract["a"]["reach"]
    assert reach["steps"] == {"low_at_most": 8.0, "high_at_least": 8.0}
    assert reach["log10_lambda"]["low_at_most"] < -5.0 and reach["log10_lambda"]["high_at_least"] > 2.0
    wanted = {"quick": {"P9": contract}}

    def found(low, high, steps=8.0):
        return [{**_check("a", [(3, 2)], 40, 0.5), "reach": {"log10_lambda": [low, high], "steps": [steps, steps]}}]

    assert cc.shortfalls("P9", "quick", found(-5.97, 2.95), wanted) == []
    for what, checks in {"the range cut to a quarter of its span": found(-2.6, 0.4),
                         "its top end cut": found(-6.0, 0.75),
                         "fewer steps": found(-6.0, 3.0, steps=4.0),
                         "no reach recorded": [_check("a", [(3, 2)], 40, 0.5)]}.items():
        assert any("range was cut" in reason for reason in cc.shortfalls("P9", "quick", checks, wanted)), what
    # seeds whose ends disagree (a few draws of a wide range) are not held to them
    assert set(cc.written([certificate(-6.0 + 2.0 * seed, 3.0) for seed in range(3)])["a"]["reach"]) == {"steps"}


def test_a_check_merges_the_reach_of_its_partial_checks():
    from propositions._common import NumericalCheck

    first, second = NumericalCheck("m", "d", "b"), NumericalCheck("m", "d", "b")
    first.add([1e-17], 1e-15)
    first.reach("log10_c", [-3.0, 1.0])
    second.add([1e-17], 1e-15)
    second.reach("log10_c", [2.5])
    assert first.merge(second).to_dict()["reach"] == {"log10_c": [-3.0, 2.5]}


def test_a_value_dropped_from_a_loop_or_from_the_scenarios_alphabet_is_a_shortfall():
    def certificate(mixes):
        return _certificate({**_check("a", [(3, 2)], 40, 0.5), "covers": {"dtype_mix": mixes}})

    contract = cc.written([certificate(["float64", "float32+bfloat16"]) for _ in range(3)])
    assert contract["a"]["covers"] == {"dtype_mix": ["float32+bfloat16", "float64"]}
    wanted = {"quick": {"P9": contract}}
    full = [{**_check("a", [(3, 2)], 40, 0.5), "covers": {"dtype_mix": ["float64", "float32+bfloat16"]}}]
    assert cc.shortfalls("P9", "quick", full, wanted) == []
    dropped = [{**_check("a", [(3, 2)], 40, 0.5), "covers": {"dtype_mix": ["float64"]}}]
    assert any("float32+bfloat16" in reason for reason in cc.shortfalls("P9", "quick", dropped, wanted))

    grammar = {"frame_shapes": [[1, 1], [3, 1]], "leading": [[], [2]]}
    written = cc.written_grammar([{"extra": {"grammar": grammar}} for _ in range(3)])
    wanted = {"quick": {"P9": written}}
    assert cc.grammar_shortfalls("P9", "quick", grammar, wanted) == []
    assert cc.grammar_shortfalls("P9", "quick", {**grammar, "frame_shapes": [[3, 1]]}, wanted)
    assert cc.grammar_shortfalls("P9", "quick", None, wanted)
    # seeds that disagree on the alphabet (a claim that draws it) are not held to one
    assert cc.written_grammar([{"extra": {"grammar": {"leading": [[seed]]}}} for seed in range(3)]) == {}


def test_a_check_merges_the_values_its_partial_checks_covered():
    from propositions._common import NumericalCheck

    first, second = NumericalCheck("m", "d", "b"), NumericalCheck("m", "d", "b")
    first.add([1e-17], 1e-15)
    first.cover("norm_type", 2.0)
    second.add([1e-17], 1e-15)
    second.cover("norm_type", float("inf"))
    assert first.merge(second).to_dict()["covers"] == {"norm_type": ["2.0", "inf"]}


def _bounded(name, low, high):
    return {**_check(name, [(3, 2)], 40, 0.0), "bound": {"min": low, "max": high}}


def test_a_bound_the_code_fixes_is_held_to_its_value_and_a_drawn_one_to_four_times_the_largest():
    contract = cc.written([_certificate(_bounded("fixed", 0.5, 8.2), _bounded("drawn", 1e-14 * (1 + seed / 4), 3e-13)) for seed in range(3)])
    assert contract["fixed"]["bound"] == {"min_at_most": 0.5 * (1 + cc.FIXED_BOUND_SLACK), "max_at_most": 8.2 * (1 + cc.FIXED_BOUND_SLACK)}
    assert contract["drawn"]["bound"]["min_at_most"] == 1.5e-14 * cc.RATIO_SLACK
    wanted = {"quick": {"P9": contract}}
    assert cc.shortfalls("P9", "quick", [_bounded("fixed", 0.5, 8.2), _bounded("drawn", 2e-14, 3e-13)], wanted) == []
    looser = {
        "an exact check's half ulp made 5": [_bounded("fixed", 5.0, 8.2), _bounded("drawn", 2e-14, 3e-13)],
        # -log10 of a significance level ten times smaller: 9.2 for 8.2, a rise no residual shows
        "a significance level lowered tenfold": [_bounded("fixed", 0.5, 9.2), _bounded("drawn", 2e-14, 3e-13)],
        "a drawn bound loosened tenfold": [_bounded("fixed", 0.5, 8.2), _bounded("drawn", 2e-13, 3e-12)],
    }
    for what, checks in looser.items():
        assert cc.shortfalls("P9", "quick", checks, wanted), what


def test_a_symbolic_step_derived_at_fewer_shapes_or_removed_is_a_shortfall():
    steps = ["P_W is idempotent (shapes 3 x 2, 2 x 2)", "P_W(W) = 0 (shapes 3 x 2, 2 x 2)"]
    contract = {"quick": {"P9": cc.written_symbolic([{"symbolic": {"steps": [{"description": d} for d in steps]}}] * 3)}}
    assert cc.symbolic_shortfalls("P9", "quick", {"steps": [{"description": d} for d in steps]}, contract) == []
    narrowed = {"a shape dropped": [steps[0], "P_W(W) = 0 (shapes 3 x 2)"], "a step removed": steps[:1]}
    for what, stated in narrowed.items():
        assert cc.symbolic_shortfalls("P9", "quick", {"steps": [{"description": d} for d in stated]}, contract), what


def test_a_control_whose_key_lost_its_chunk_is_a_control_draw_shortfall():
    certificates = [{"extra": {"control_draw_keys": {"P9/control": 6}}} for _ in range(3)]
    contract = {"quick": {"P9": cc.written_draws(certificates, "control_draw_keys")}}
    assert cc.draw_shortfalls("P9", "quick", {"P9/control": 6}, contract, section="control_draws") == []
    assert cc.draw_shortfalls("P9", "quick", {"P9/control": 1}, contract, section="control_draws")


def test_at_a_seed_the_contract_was_written_from_its_own_counts_and_bounds_are_held():
    """Drawn scenarios move counts and bounds between seeds (held loosely); at one of those seeds they
    reproduce, and a few per cent fewer draws or a looser bound fall short there."""
    certificates = [{"numerical": {"seed": seed, "checks": [{**_bounded("a", 1e-14, 3e-13 * (1 + seed)), "samples": 3000 + 100 * seed}]},
                     "extra": {"draw_keys": {"P9/gradient": 3079 + 50 * seed}}} for seed in range(3)]
    contract = {"quick": {"P9": cc.written(certificates)}}
    draws = {"quick": {"P9": cc.written_draws(certificates)}}
    same = [{**_bounded("a", 1e-14, 3e-13), "samples": 3000}]
    assert cc.shortfalls("P9", "quick", same, contract, seed=0) == []
    assert cc.shortfalls("P9", "quick", [{**_bounded("a", 1e-14, 3e-12), "samples": 3000}], contract, seed=0)
    assert cc.shortfalls("P9", "quick", [{**_bounded("a", 1e-14, 3e-13), "samples": 2900}], contract, seed=0)
    assert cc.shortfalls("P9", "quick", [{**_bounded("a", 1e-14, 3e-12), "samples": 3000}], contract, seed=7) == []  # not a contract seed
    assert cc.draw_shortfalls("P9", "quick", {"P9/gradient": 3079}, draws, seed=0) == []
    assert cc.draw_shortfalls("P9", "quick", {"P9/gradient": 2996}, draws, seed=0)
    assert cc.draw_shortfalls("P9", "quick", {"P9/gradient": 2996}, draws, seed=7) == []


def test_a_figure_cut_short_or_missing_falls_short():
    """The figures' term: a series with fewer points than every seed gave, or a series gone, is a shortfall;
    a figure whose size moves from seed to seed is not contracted."""
    from propositions.coverage_contract import figure_shortfalls, written_figures

    def figure(points, label="decay"):
        return {"weight_norm": {"kind": "line", "series": [{"label": label, "x": list(range(points)), "y": [0.0] * points}]},
                "scan": {"kind": "line", "x": list(range(points // 2)), "y": [0.0] * (points // 2)}}

    seeds = [{"figures": figure(101)}, {"figures": figure(101)}, {"figures": {**figure(101), "scan": {"x": [0.0], "y": [0.0]}}}]
    contract = {"default": {"P5": written_figures(seeds)}}
    assert contract["default"]["P5"] == {"weight_norm/decay": 101}
    assert figure_shortfalls("P5", "default", figure(101), contract) == []
    assert figure_shortfalls("P5", "default", figure(120), contract) == []
    assert figure_shortfalls("P5", "default", figure(51), contract) == [
        "coverage contract: the figure series 'weight_norm/decay' has 51 points, fewer than 101"]
    assert figure_shortfalls("P5", "default", figure(101, label="other"), contract) == [
        "coverage contract: the figure series 'weight_norm/decay' is missing"]
    assert figure_shortfalls("P5", "quick", figure(51), contract) == []


def test_a_control_run_stops_at_its_first_detection():
    """kit.common.stop_at_detection: a block of adds ends at the first that misses by DETECTION_FACTOR, keeps what
    came before, and leaves the checks' add as it was; inactive, it runs the whole block."""
    from propositions._common import DETECTION_FACTOR, NumericalCheck, stop_at_detection

    def fill(active):
        check = NumericalCheck("c", "d", "b")
        added = []
        with stop_at_detection([check], active=active):
            for residual in (0.1, 0.2, 2.0 * DETECTION_FACTOR, 0.3):
                check.add([residual], 1.0)
                added.append(residual)
        return check, added

    check, added = fill(True)
    assert added == [0.1, 0.2] and check.samples == 3 and check.max_ratio == 2.0 * DETECTION_FACTOR
    assert "add" not in vars(check)
    check, added = fill(False)
    assert added == [0.1, 0.2, 2.0 * DETECTION_FACTOR, 0.3] and check.samples == 4
