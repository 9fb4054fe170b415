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
