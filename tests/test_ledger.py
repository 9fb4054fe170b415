"""The promise ledger (propositions/ledger.py) against the code, the docs and the committed
certificates: every public parameter has a promise, every promise is still stated where it says,
names checks that exist and is certified at its strength, and every check certifies some promise."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from propositions import ledger

ROOT = Path(__file__).resolve().parent.parent
CLAIMS = ("P1", "P2", "P3", "P4", "P5", "P6", "projection", "samplers", "bookkeeping", "crosscheck", "optimizer")


@pytest.fixture(scope="module")
def certificates():
    return {claim: json.loads((ROOT / "reports" / f"{claim}.json").read_text()) for claim in CLAIMS}


def _squash(text: str) -> str:
    return re.sub(r"\s+", " ", text)


def test_every_public_parameter_has_a_promise():
    pytest.importorskip("torch")
    promised = {parameter for promise in ledger.PROMISES for parameter in promise.parameters}
    missing = [parameter for parameter in ledger.public_parameters() if parameter not in promised]
    assert missing == [], f"public parameters without a promise in propositions/ledger.py: {missing}"


def test_a_new_public_parameter_without_a_promise_is_found(monkeypatch):
    """The ledger is read against the signatures: a parameter added to a public function shows."""
    pytest.importorskip("torch")
    import torch_impl

    def clip_grad_norm_finite_(parameters, max_norm, norm_type=2.0, error_if_nonfinite=False):
        return None

    monkeypatch.setattr(torch_impl, "clip_grad_norm_finite_", clip_grad_norm_finite_)
    promised = {parameter for promise in ledger.PROMISES for parameter in promise.parameters}
    assert [p for p in ledger.public_parameters() if p not in promised] == ["torch_impl.clip_grad_norm_finite_.error_if_nonfinite"]


def test_every_promise_is_stated_where_the_ledger_says():
    for promise in ledger.PROMISES:
        assert promise.strength in ledger.STRENGTHS, promise.id
        text = _squash((ROOT / promise.source).read_text(encoding="utf-8"))
        assert _squash(promise.quote) in text, f"{promise.id}: {promise.quote!r} is not in {promise.source}"
    assert len({promise.id for promise in ledger.PROMISES}) == len(ledger.PROMISES)


def test_every_promise_names_checks_that_exist(certificates):
    for promise in ledger.PROMISES:
        for pattern in promise.checks:
            found = [name for claim, certificate in certificates.items() for name in ledger.matches(pattern, claim, ledger.check_names(certificate))]
            assert found, f"{promise.id}: {pattern} matches no check of the committed certificates"


def test_every_check_certifies_some_promise(certificates):
    orphans = []
    for claim, certificate in certificates.items():
        for name in ledger.check_names(certificate):
            if not any(ledger.matches(pattern, claim, [name]) for promise in ledger.PROMISES for pattern in promise.checks):
                orphans.append(f"{claim}:{name}")
    assert orphans == [], f"checks that certify no promise of propositions/ledger.py: {orphans}"


def test_a_bit_for_bit_promise_is_checked_exactly(certificates):
    """A promise stated bit for bit is held by exact checks (bound 0.5 ulp, or an exact tier)."""
    for promise in ledger.PROMISES:
        if promise.strength != "bit for bit":
            continue
        for pattern in promise.checks:
            for claim, certificate in certificates.items():
                for check in certificate["numerical"]["checks"]:
                    if ledger.matches(pattern, claim, [check["name"]]):
                        assert check["bound_derivation"].startswith("exact") or "bitwise" in check["name"] or "bit" in check["description"], \
                            f"{promise.id}: {claim}:{check['name']} is not an exact check ({check['bound_derivation'][:80]})"


def test_each_certificate_reports_its_promises_and_zero_coverage_is_inconclusive(certificates):
    for claim, certificate in certificates.items():
        table = certificate["extra"].get("promises")
        assert table, f"{claim}: no promise coverage in the certificate"
        assert all(row["samples"] > 0 for row in table.values()), (claim, table)
    checks = [dict(c, samples=0) if c["name"].startswith("promise/sync_free") else c for c in certificates["optimizer"]["numerical"]["checks"]]
    _, reasons = ledger.coverage("optimizer", checks, certificates["optimizer"]["exact"])
    assert reasons == ["promise sync-free-bit-for-bit (bit for bit) has zero coverage: none of its checks (optimizer:promise/sync_free_bit_for_bit) "
                       "compared anything"]
