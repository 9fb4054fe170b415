"""Property verdicts as certificates (certify/outside/property_certificate.py): sealed, read, cited and
re-run like the claims' certificates; a verdict edited and sealed again is refused; `certify run P4`
of an equivariant optimizer that is not StiefelAdam states the two things apart; the plugin's property
mode."""

from __future__ import annotations

import copy
import json
import sys
from pathlib import Path

import pytest

from certify import certificate as certificate_format
from certify.ci import pytest_plugin
from certify.outside import properties as outside
from certify_fakes import run_main

sys.path.insert(0, str(Path(__file__).resolve().parent))  # property_fakes, loaded by name as a user's module would be

POLAR_SGD = "numpy:property_fakes:init,polar_sgd"  # deterministic, equivariant on every side, not StiefelAdam
P4 = ("P4-left", "P4-right", "P4-signed")


def _certificates(spec: str, seed: int, folder: Path, claim_ids=("P4",), profile="quick") -> dict:
    outside.run({spec: outside.resolve(spec)}, seed=seed, claim_ids=claim_ids, out_dir=folder, profile=profile, progress=lambda line: None)
    directory = folder / "properties" / outside.label(spec)
    return {path.stem: certificate_format.load(path) for path in directory.glob("*.json")}


@pytest.mark.parametrize("seed", range(10))
def test_an_equivariant_optimizer_that_is_not_stiefel_adam_reads_holds_in_a_sealed_certificate(seed, tmp_path):
    found = _certificates(POLAR_SGD, seed, tmp_path)
    assert sorted(found) == sorted(P4)
    for certificate in found.values():
        assert certificate["property"]["verdict"] == "holds" and certificate["verdict"] == "pass", certificate["property"]
        assert certificate["extra"]["implementation"]["stiefel_adam_step"]["same"] is False
        assert all(control["detected"] for control in certificate["controls"]) and certificate["controls"]


@pytest.mark.parametrize("seed", range(10))
def test_stiefel_adam_reads_holds_and_is_stiefel_adams_step(seed, tmp_path):
    found = _certificates("stiefel_adam", seed, tmp_path)
    for certificate in found.values():
        assert certificate["property"]["verdict"] == "holds" and certificate["verdict"] == "pass", certificate["property"]
        assert certificate["extra"]["implementation"]["stiefel_adam_step"]["same"] is True


@pytest.fixture(scope="module")
def sealed(tmp_path_factory):
    folder = tmp_path_factory.mktemp("sealed")
    found = _certificates("numpy:property_fakes:qr_adam", 0, folder, claim_ids=("P4",))
    found.update(_certificates("numpy:property_fakes:ignores_decay", 0, folder, claim_ids=("P5",)))  # vacuous
    return folder, found


def test_a_property_certificate_verifies_and_cites_like_a_claims(sealed, capsys):
    folder, found = sealed
    assert found["P4-left"]["property"]["verdict"] == "holds" and found["P4-right"]["property"]["verdict"] == "fails"
    assert found["P4-right"]["verdict"] == "fail" and found["P4-right"]["property"]["check"] == "right_trajectories"
    assert "P4-right (claim P4) of numpy:property_fakes:qr_adam" in found["P4-right"]["title"]
    paths = sorted(str(path) for path in (folder / "properties").rglob("P4-*.json"))
    code, out, _ = run_main(capsys, "verify", *paths)
    assert code == 1 and "verified 3 certificate(s): 3 reproduced, 0 differing, 2 with a verdict other than pass" in out  # right and signed fail
    code, out, _ = run_main(capsys, "cite", paths[0])
    assert code == 0 and "the property holds (certificate pass) in float64" in out
    assert "reproduce: certify run P4-left --properties --seed 0 --profile quick --optimizer numpy:property_fakes:qr_adam" in out


EDITS = {
    "a failing property relabelled holds": ("P4-right", lambda c: c["property"].update(verdict="holds")),
    "a failing certificate relabelled pass": ("P4-right", lambda c: c.update(verdict="pass", failures=[])),
    "a holding property relabelled fails": ("P4-left", lambda c: c["property"].update(verdict="fails", check="left_trajectories", margin=12.0)),
    "a margin edited": ("P4-right", lambda c: c["property"].update(margin=c["property"]["margin"] / 2)),
    "the property moved to another implementation": ("P4-left", lambda c: c["property"].update(implementation="torch_impl")),
    "a property of another claim": ("P4-left", lambda c: c["property"].update(id="P5", claim="P5")),
    "a check's residual lowered under its bound": ("P4-right", lambda c: c["numerical"]["checks"][0].update(max_ratio=0.5, passed=True)),
    "a vacuous verdict without its reason": ("P5", lambda c: c.update(inconclusive=["untested: edited"])),
    "its reproduce command dropped --properties": ("P4-left", lambda c: c["provenance"].update(
        reproduce=c["provenance"]["reproduce"].replace(" --properties", ""))),
}


@pytest.mark.parametrize("edit", list(EDITS))
def test_a_property_verdict_edited_and_sealed_again_is_refused(sealed, tmp_path, edit):
    _, found = sealed
    property_id, change = EDITS[edit]
    certificate = copy.deepcopy(found[property_id])
    change(certificate)
    path = tmp_path / "edited.json"
    path.write_text(json.dumps(certificate_format.seal(certificate)))
    with pytest.raises(certificate_format.CertificateError, match="contradicts itself"):
        certificate_format.load(path)


def test_run_of_an_equivariant_sgd_states_both_things_apart(capsys, tmp_path):
    code, out, _ = run_main(capsys, "run", "P4", "--optimizer", POLAR_SGD, "--profile", "quick", "--out", str(tmp_path))
    assert code == 1  # it is not StiefelAdam's step
    lines = out.splitlines()
    assert not any(line.startswith("P4: fail") or line.split()[:2] == ["P4", "Exact"] for line in lines), out
    assert any(line.startswith(f"P4, is {POLAR_SGD} StiefelAdam's step?: fail") for line in lines), out
    assert f"P4, its property of {POLAR_SGD}: P4-left holds; P4-right holds; P4-signed holds" in lines
    written = sorted(path.name for path in (tmp_path / "properties").rglob("*.json"))
    assert written == ["P4-left.json", "P4-right.json", "P4-signed.json"]


def test_the_plugin_asks_a_property_and_returns_its_certificate():
    sealed = pytest_plugin.run_property("p4-left", POLAR_SGD)
    assert sealed["property"]["verdict"] == "holds" and sealed["id"] == "P4-left" and sealed["provenance"]["profile"] == "quick"
    with pytest.raises(pytest.fail.Exception, match="property P4-right fails: right_trajectories"):
        pytest_plugin.run_property("P4-right", "numpy:property_fakes:qr_adam")
    with pytest.raises(pytest.UsageError, match="not a property"):
        pytest_plugin.run_property("P6", POLAR_SGD)


def test_the_worked_adapter_of_the_docs_gives_the_verdicts_of_its_mathematics(tmp_path, monkeypatch):
    """examples/transposed_frames.py (docs/adapters.md#a-worked-adapter): momentum SGD on frames stored
    as tagged (r, d) rows, polar retraction: steepest descent, not scale free, no preconditioner,
    equivariant on every side, blind to coupled decay; and the tag it asks for is set."""
    pytest.importorskip("torch")
    monkeypatch.syspath_prepend(str(Path(__file__).resolve().parent.parent / "examples"))
    spec = "numpy:transposed_frames:adapter:per_frame,black_box"
    found = _certificates(spec, 0, tmp_path, claim_ids=("P1", "P2", "P3", "P4", "P5"))
    verdicts = {key: certificate["property"]["verdict"] for key, certificate in found.items()}
    assert verdicts == {"P1": "holds", "P2": "fails", "P3": "holds", "P4-left": "holds", "P4-right": "holds", "P4-signed": "holds",
                        "P5": "holds"}, {key: c["property"]["reason"] for key, c in found.items()}
    import numpy as np
    import torch
    import transposed_frames

    state = transposed_frames.adapter.init(np.eye(4, 2))
    assert tuple(state["parameter"].shape) == (2, 4) and state["parameter"].manifold == "stiefel_rows"
    state["parameter"].manifold = None  # the optimizer refuses what the adapter must tag
    state["parameter"].grad = torch.zeros(2, 4, dtype=torch.float64)
    with pytest.raises(ValueError, match="tagged"):
        state["optimizer"].step()
