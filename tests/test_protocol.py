"""run_claim: one way to run every recipe (propositions.kit.protocol)."""

from __future__ import annotations

import contextlib

import numpy as np
import pytest

from propositions._common import NumericalCheck, get_profile
from propositions.kit import protocol
from propositions.kit.protocol import Claim, Control, Evidence, Part, Symbolic

QUICK = get_profile("quick")


def _check(name: str, ratio: float) -> NumericalCheck:
    check = NumericalCheck(name, f"{name} residual", "a bound of 1")
    check.add([ratio], 1.0, shape=(2, 1))
    return check


def _part(name: str, ratio: float = 0.5, **evidence):
    return lambda ctx: Evidence(checks=[_check(name, ratio)], frames=1, **evidence)


def _claim(parts, controls=None, **kwargs) -> Claim:
    controls = (Control("qr_retraction", _part("caught", 1e3)),) if controls is None else controls
    return Claim("P9", "test", "s", "l", symbolic=Symbolic("none"), parts=parts, controls=controls, **kwargs)


def _background(ctx):  # a background part travels as a task: a top-level function
    return Evidence(checks=[_check("background", 0.25)], frames=2, extra={"long": 1}, notes=["from the background"])


def test_the_certificate_follows_the_declared_order_not_the_order_of_running():
    claim = _claim((Part("long", _background, background=True), Part("a", _part("a")), Part("b", _part("b"))),
                   notes=("fixed",))
    result = claim.run(0, QUICK)
    assert [c.name for c in result.checks] == ["background", "a", "b"]
    assert result.frames == 4 and result.notes == ["fixed", "from the background"]
    assert result.extra["long"] == 1 and result.extra["optimizer"] == "stiefel_adam"
    assert result.extra["control_frames"] == QUICK.control_frames
    assert {"a_s", "b_s", "long_s", "controls_s"} <= set(result.extra["timings"])
    assert result.verdict == "pass"


def test_a_control_runs_as_the_broken_variant_and_decides_the_verdict():
    seen = []

    def control(ctx):
        seen.append(ctx.optimizer)
        return Evidence(checks=[_check("caught", 2.0)], extra={"power": 3})

    result = _claim((Part("a", _part("a")),), controls=(Control("qr_retraction", control),)).run(0, QUICK)
    assert seen == ["qr_retraction"]
    assert result.controls[0].description  # the variant's own description
    assert result.extra["control_evidence"] == {"qr_retraction": {"power": 3}}
    assert result.verdict == "fail" and "control qr_retraction not detected" in result.failures()[0]


def _symbols_refused():
    raise TypeError("a symbolic value has no float value")


def test_code_the_symbolic_tier_cannot_run_leaves_the_numerical_checks_to_judge_it():
    """A step the symbolic executor cannot run (a cast to float32) used to stop the whole claim with
    no numerical check run; the tier now says nothing, and a failing check still fails the claim."""
    def claim(ratio):
        return Claim("P9", "test", "s", "l", symbolic=Symbolic("by execution", _symbols_refused),
                     parts=(Part("a", _part("a", ratio)),), controls=(Control("qr_retraction", _part("caught", 1e3)),))

    failing = claim(5.0).run(0, QUICK)
    assert failing.verdict == "fail" and "check a" in failing.failures()[0]
    assert any("symbolic tier could not be derived" in reason and "no float value" in reason for reason in failing.inconclusive)
    assert claim(0.5).run(0, QUICK).verdict == "inconclusive"  # a passing run is not a pass without its tier


def test_without_a_control_that_applies_a_certificate_cannot_pass():
    result = _claim((Part("a", _part("a")),), controls=(Control("qr_retraction", lambda ctx: None),)).run(0, QUICK)
    assert result.controls == [] and result.verdict == "inconclusive"


def test_two_parts_writing_one_key_is_an_error_not_a_silent_overwrite():
    claim = _claim((Part("a", _part("a", extra={"k": 1})), Part("b", _part("b", extra={"k": 2}))))
    with pytest.raises(RuntimeError, match="two parts write the extra key"):
        claim.run(0, QUICK)


def test_prepare_refuses_before_anything_runs_and_environment_wraps_the_run():
    ran, entered = [], []

    def part(ctx):
        ran.append(ctx.option("dtype"))
        return Evidence(checks=[_check("a", 0.5)])

    @contextlib.contextmanager
    def environment(ctx):
        entered.append(True)
        yield

    with pytest.raises(ValueError, match="unknown optimizer"):
        _claim((Part("a", part),)).run(0, QUICK, optimizer="no_such_variant")
    assert ran == []
    result = _claim((Part("a", part),), environment=environment).run(0, QUICK, dtype="float32")
    assert ran == ["float32"] and entered == [True] and result.dtype == "float32"


def test_the_symbolic_tier_is_derived_once_per_process_and_copied():
    calls = []

    def derive():
        calls.append(1)
        return [protocol.SymbolicStep("x = x", "x = x", True)]

    symbolic = Symbolic("by hand", derive)
    first, second = protocol.derive_symbolic(symbolic), protocol.derive_symbolic(symbolic)
    assert len(calls) == 1 and first.status == second.status == "proved"
    first.steps[0].reduced = False
    assert protocol.derive_symbolic(symbolic).steps[0].reduced  # a copy: the cache is not touched
    assert protocol.derive_symbolic(Symbolic("none: not applicable")).status == "not_applicable"


def test_numerical_check_copy_shares_nothing_mutable():
    """NumericalCheck.__deepcopy__ copies its pools as lists (copy.deepcopy memoised them float by
    float): every field equal, no list, dict or array shared, and the copy goes on independently."""
    import copy
    import dataclasses

    check = NumericalCheck("c", "d", "b")
    check.add(np.linspace(0.1, 0.9, 500), 1.0, shape=(3, 2), key=("k", 1), seed=0, extra={"where": [1, 2]})
    twin = copy.deepcopy(check)
    for spec in dataclasses.fields(check):
        mine, theirs = getattr(check, spec.name), getattr(twin, spec.name)
        if isinstance(mine, np.ndarray):
            assert np.array_equal(mine, theirs) and mine is not theirs, spec.name
        else:
            assert mine == theirs, spec.name
            assert not isinstance(mine, (list, dict, set)) or mine is not theirs, spec.name
    twin.worst["where"].append(3)
    twin.add([2.0], 1.0)
    assert check.worst["where"] == [1, 2] and check.samples == 500 and check.max_ratio < 1
