"""The certificate format: digest, schema, loading, and the certificate built from a claim."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import numpy as np
import pytest

from certify import SCHEMA_VERSION, claims, environment, verification
from certify import certificate as certificate_format
from propositions._common import ClaimResult, ControlResult, NumericalCheck, SymbolicResult, SymbolicStep
from certify_fakes import FakeClaim

PROJECT_ROOT = Path(__file__).resolve().parent.parent


def _result(seed: int, passing: bool) -> ClaimResult:
    rng = np.random.default_rng(seed)
    check = NumericalCheck("identity", "A against B", "8 u")
    residual = rng.uniform(0.0, 1e-16, 64)
    if not passing:
        residual[5] = np.inf  # an overflow: must be recorded as "inf", and fail
    check.add(residual, 1e-15, shape=(3, 2), key=("identity", 3, 2), seed=seed)
    broken = NumericalCheck("identity", "A against broken B", "8 u")
    broken.add(rng.uniform(1e-6, 1e-5, 16), 1e-15, shape=(3, 2), key=("control", 3, 2), seed=seed)
    return ClaimResult(
        symbolic=SymbolicResult("sympy", [SymbolicStep("step", "a = a", True)]),
        checks=[check],
        controls=[ControlResult.from_checks("qr_retraction", "broken", [broken])],
        frames=64,
        figures={"curve": {"x": [1, 2], "y": [3, 4]}},
    )


def _certify(claim_id: str, lookup, seed: int = 0) -> dict:
    """certify_claim with the registry lookup replaced by `lookup` (id -> Claim) for this call only."""
    original = claims.lookup_claim
    claims.lookup_claim = lookup
    try:
        sealed, internal_error = claims.certify_claim(claim_id, seed=seed, profile="quick", command=f"certify run {claim_id}")
    finally:
        claims.lookup_claim = original
    assert internal_error is None
    return sealed


def _certificate(seed=1, passing=True, claim_id="P1") -> dict:
    claim = FakeClaim(claim_id, "a claim", "text", "x = x", ("qr_retraction",), lambda s, p, optimizer="stiefel_adam": _result(s, passing))
    return _certify(claim_id, lambda _: claim, seed)


def _leaf_paths(node, prefix=()):
    if isinstance(node, dict):
        for key, value in node.items():
            yield from _leaf_paths(value, prefix + (key,))
    elif isinstance(node, list) and node:
        for index, value in enumerate(node):
            yield from _leaf_paths(value, prefix + (index,))
    else:
        yield prefix


def _changed(value):
    if isinstance(value, bool):
        return not value
    if isinstance(value, (int, float)):
        return value + 1 if value == value else 0.0
    if isinstance(value, str):
        return value + "x"
    if value is None:
        return 0
    return None  # an empty list or dict


def test_digest_changes_when_any_field_changes():
    """Every field but the run record (command, date, wall time, workers, host) is sealed."""
    sealed = _certificate()
    body = {k: v for k, v in sealed.items() if k not in ("digest", "run")}
    original = certificate_format.compute_digest(body)
    assert original == sealed["digest"]["value"]
    paths = [path for path in _leaf_paths(body) if path]
    assert len(paths) > 100  # the walk reached the nested numerical data
    for path in paths:
        edited = copy.deepcopy(body)
        node = edited
        for part in path[:-1]:
            node = node[part]
        node[path[-1]] = _changed(node[path[-1]])
        assert certificate_format.compute_digest(edited) != original, path
    for path in [path for path in _leaf_paths({"run": sealed["run"]}) if len(path) > 1]:
        edited = copy.deepcopy(sealed)
        node = edited
        for part in path[:-1]:
            node = node[part]
        node[path[-1]] = _changed(node[path[-1]])
        assert certificate_format.compute_digest(edited) == original, path


def test_digest_ignores_key_order_and_only_the_digest_member():
    sealed = _certificate()
    reordered = dict(reversed(list(sealed.items())))
    assert certificate_format.compute_digest(reordered) == sealed["digest"]["value"]
    assert certificate_format.canonical_json({"b": 1, "a": "é"}) == b'{"a":"\\u00e9","b":1}'


def test_written_certificate_validates_and_loads(tmp_path):
    sealed = _certificate()
    path = certificate_format.write(sealed, tmp_path / "P1.json")
    assert certificate_format.schema_errors(json.loads(path.read_text())) == []
    loaded = certificate_format.load(path)
    assert loaded == sealed
    assert loaded["schema_version"] == SCHEMA_VERSION
    for member in ("environment", "provenance", "numerical", "controls", "statement", "symbolic"):
        assert member in loaded
    for member in ("python", "numpy", "scipy", "sympy", "mpmath", "blas", "cpu", "platform"):
        assert loaded["environment"][member] is not None
    timing = loaded["run"]
    assert timing["wall_seconds"] >= 0 and timing["frames_per_second"] > 0


def test_numerical_part_records_seed_shapes_samples_and_worst_case():
    numerical = _certificate(seed=5)["numerical"]
    assert numerical["seed"] == 5 and numerical["profile"] == "quick" and numerical["dtype"] == "float64"
    assert numerical["samples"] == 64 and numerical["shapes"] == [[3, 2]]
    worst = numerical["worst_case"]
    assert worst["check"] == "identity" and worst["key"] == ["identity", "3", "2"] and worst["seed"] == 5
    assert worst["reproduce"] == "certify run P1 --seed 5 --profile quick"


def test_non_finite_residual_is_a_string_and_fails():
    sealed = _certificate(passing=False)
    assert sealed["verdict"] == "fail"
    check = sealed["numerical"]["checks"][0]
    assert check["residual"]["max"] == "inf" and check["max_ratio"] == "inf"
    certificate_format.validate(sealed)
    certificate_format.canonical_json(sealed)  # strict JSON: allow_nan=False does not raise


def test_invalid_certificate_is_not_written(tmp_path):
    sealed = _certificate()
    del sealed["controls"]
    with pytest.raises(certificate_format.SchemaViolation, match="certificate P1 does not match the schema.*controls"):
        certificate_format.write(sealed, tmp_path / "P1.json")
    assert not (tmp_path / "P1.json").exists()


@pytest.mark.parametrize(
    "edit, message",
    [
        (lambda c: c.update(id="7 bad"), "does not match '"),
        (lambda c: c.update(verdict="maybe"), "is not one of"),
        (lambda c: c["numerical"]["checks"][0].update(passed=1), "is not of type 'boolean'"),
        (lambda c: c.update(unexpected=1), "Additional properties"),
        (lambda c: c["provenance"].pop("seed"), "'seed' is a required property"),
    ],
)
def test_schema_rejects_malformed_members(edit, message):
    sealed = _certificate()
    edit(sealed)
    errors = certificate_format.schema_errors(certificate_format.seal(sealed))
    assert errors and any(message in error for error in errors), errors


def test_load_checks_version_before_digest_and_digest_before_schema(tmp_path):
    sealed = _certificate()
    path = tmp_path / "c.json"

    other_version = dict(sealed, schema_version="2.0", verdict="nonsense")  # digest also wrong
    path.write_text(json.dumps(other_version))
    with pytest.raises(certificate_format.CertificateError, match="schema version '2.0'"):
        certificate_format.load(path)

    tampered = dict(sealed, verdict="fail")
    path.write_text(json.dumps(tampered))
    with pytest.raises(certificate_format.CertificateError, match="digest mismatch"):
        certificate_format.load(path)

    path.write_text(json.dumps(dict(sealed, digest={"algorithm": "md5", "value": "0"})))
    with pytest.raises(certificate_format.CertificateError, match="has no sha256 digest"):
        certificate_format.load(path)

    path.write_text('{"schema_version": "1.0", "x": NaN}')
    with pytest.raises(certificate_format.CertificateError, match="not valid JSON"):
        certificate_format.load(path)


def test_stub_certificate_for_a_missing_claim_module_validates():
    def missing(_):
        raise ImportError("no module named propositions.p3_conditioning")

    sealed = _certify("P3", missing)
    assert sealed["verdict"] == "inconclusive"
    assert sealed["numerical"]["worst_case"] is None
    certificate_format.validate(sealed)


def test_claim_verdict_contradicted_by_its_data_is_a_fail():
    class Lying:
        def to_dict(self):
            data = _result(0, False).to_dict()
            data["verdict"], data["failures"] = "pass", []
            return data

    claim = FakeClaim("P2", "t", "s", "l", (), lambda s, p, optimizer="stiefel_adam": Lying())
    sealed = _certify("P2", lambda _: claim)
    assert sealed["verdict"] == "fail"
    assert "reported verdict 'pass' although" in sealed["failures"][-1]


def other_machine(certificate: dict) -> dict:
    """The certificate as recorded on a machine that rounds differently: another BLAS core and
    other bits of one fixed computation, the fingerprint's hash taken again (a consistent one)."""
    fingerprint = certificate["environment"]["rounding_fingerprint"]
    fingerprint["blas"] = [dict(library, architecture=f"not {library['architecture']}") for library in fingerprint["blas"]]
    fingerprint["computations"]["numpy.linalg.svd"] = "0" * 64
    fingerprint["sha256"] = environment.fingerprint_digest(fingerprint)
    return certificate


def test_compare_ignores_timing_and_the_environment_description():
    recorded = _certificate(seed=2)
    rerun = copy.deepcopy(recorded)
    rerun["run"]["wall_seconds"] += 100.0
    rerun["environment"]["cpu"] = "another machine"
    rerun["environment"]["platform"] = "another platform"
    differences, notes = claims.compare(recorded, rerun)
    assert differences == [] and notes == ["all 2 worst residuals reproduced bit for bit"]

    # the description differs but the rounding fingerprint is the same: bit for bit is required
    rerun["numerical"]["checks"][0]["residual"]["max"] *= 1.5
    differences, _ = claims.compare(recorded, rerun)
    assert len(differences) == 1
    assert "largest relative difference 0.333 (check identity)" in differences[0]
    assert "although the rounding fingerprint matches the recorded one" in differences[0]


def test_compare_where_the_fingerprint_differs_reports_residuals_as_notes_but_not_outcomes():
    recorded = other_machine(_certificate(seed=2))
    rerun = _certificate(seed=2)
    rerun["numerical"]["checks"][0]["residual"]["max"] *= 1.5
    rerun["controls"][0]["residual"] *= 0.5
    comparison = verification.compare(recorded, rerun)
    assert comparison.differences == [] and not comparison.fingerprint_match
    assert "largest relative difference 0.5 (control qr_retraction)" in comparison.notes[0]
    assert "the rounding fingerprint differs from the recorded one" in comparison.notes[0]
    assert comparison.notes[1] == "every re-run residual is within its bound (all 1 re-run checks passed)"
    core = rerun["environment"]["rounding_fingerprint"]["blas"][0]["architecture"]
    assert f"blas[0].architecture 'not {core}' recorded, '{core}' here" in comparison.fingerprint_differences
    assert "bits of numpy.linalg.svd" in comparison.fingerprint_differences
    assert [row.bit_identical for row in comparison.rows] == [False, False]

    rerun["controls"][0]["detected"] = False
    differences, _ = claims.compare(recorded, rerun)
    assert differences == ["control qr_retraction: detected True recorded, False reproduced"]


def test_compare_without_a_recorded_fingerprint_requires_no_bits():
    recorded = _certificate(seed=2)
    del recorded["environment"]["rounding_fingerprint"]
    rerun = _certificate(seed=2)
    rerun["numerical"]["checks"][0]["residual"]["max"] *= 1.5
    comparison = verification.compare(recorded, rerun)
    assert comparison.differences == []
    assert comparison.fingerprint_differences == ["the certificate records no rounding fingerprint"]


def test_warnings_of_a_run_become_notes():
    def noisy(seed, profile, optimizer="stiefel_adam"):
        with np.errstate(over="warn"):
            np.float64(1e300) * np.float64(1e300)
        return _result(seed, True)

    claim = FakeClaim("P2", "t", "s", "l", ("qr_retraction",), noisy)
    sealed = _certify("P2", lambda _: claim)
    assert sealed["verdict"] == "pass"
    assert any(note.startswith("warning during the run: RuntimeWarning: overflow") for note in sealed["notes"])


@pytest.mark.parametrize("machine", ["same", "other"])
def test_compare_rejects_doctored_counts_and_commands_on_any_machine(machine):
    recorded = _certificate(seed=2)
    if machine == "other":
        other_machine(recorded)
    for mutate, expected in [
        (lambda c: c["numerical"].__setitem__("frames", 10**9), "numerical.frames"),
        (lambda c: c["numerical"]["checks"][0].__setitem__("samples", 10**9), "samples"),
        (lambda c: c["numerical"]["checks"][0].__setitem__("shapes", [[1, 1]]), "shapes"),
        (lambda c: c["provenance"].__setitem__("reproduce", "rm -rf /"), "reproduce command"),
        (lambda c: c["controls"][0].__setitem__("check", "another"), "caught by"),
        (lambda c: c.__setitem__("verdict", "fail"), "verdict fail recorded"),
    ]:
        doctored = copy.deepcopy(recorded)
        mutate(doctored)
        differences, _ = claims.compare(doctored, _certificate(seed=2))
        assert any(expected in d for d in differences), (expected, differences)


def test_compare_requires_every_number_bit_for_bit_where_the_fingerprints_match():
    recorded = _certificate(seed=2)
    for mutate, where in [
        (lambda c: c["numerical"]["checks"][0]["residual"].__setitem__("max", c["numerical"]["checks"][0]["residual"]["max"] * 1.5), "check identity"),
        (lambda c: c["numerical"]["checks"][0]["residual"].__setitem__("mean", 0.0), "other statistics differ"),
        (lambda c: c["numerical"]["checks"][0]["bound"].__setitem__("max", 2e-15), "other statistics differ"),
        (lambda c: c["controls"][0].__setitem__("residual", c["controls"][0]["residual"] * 2), "control qr_retraction"),
    ]:
        doctored = copy.deepcopy(recorded)
        mutate(doctored)
        comparison = verification.compare(doctored, recorded)
        assert comparison.fingerprint_match
        assert len(comparison.differences) == 1 and where in comparison.differences[0], comparison.differences
        assert "rounding fingerprint matches the recorded one" in comparison.differences[0]


def test_compare_rejects_a_certificate_that_contradicts_its_own_numbers():
    recorded = _certificate(seed=2)
    rerun = _certificate(seed=2)
    for mutate, expected in [
        (lambda c: c["numerical"]["checks"][0].__setitem__("max_ratio", 5.0), "check identity says passed=True at worst residual/bound 5"),
        (lambda c: c["controls"][0].__setitem__("margin", 2.0), "control qr_retraction says detected=True at margin 2 (factor 10)"),
        (lambda c: c["environment"]["rounding_fingerprint"]["computations"].__setitem__("numpy.matmul", "0" * 64),
         "the recorded rounding fingerprint does not hash to its recorded sha256"),
    ]:
        doctored = other_machine(copy.deepcopy(recorded))
        mutate(doctored)
        differences, _ = claims.compare(doctored, rerun)
        assert any(expected in d for d in differences), (expected, differences)


def test_certificate_points_at_the_docs_and_records_a_fingerprint():
    sealed = _certificate(claim_id="P3")
    assert sealed["statement"]["docs"] == "docs/claims.md#p3"
    fingerprint = sealed["environment"]["rounding_fingerprint"]
    assert fingerprint["sha256"] == environment.fingerprint_digest(fingerprint)
    assert fingerprint["torch"] is None  # P3 does not use torch
    assert "numpy.linalg.svd" in fingerprint["computations"]
    broken = copy.deepcopy(sealed)
    broken["environment"]["rounding_fingerprint"]["sha256"] = "not a hash"
    assert any("rounding_fingerprint/sha256" in error for error in certificate_format.schema_errors(broken))
    broken = copy.deepcopy(sealed)
    broken["statement"]["docs"] = "../shared/SPEC.md"
    assert any("statement/docs" in error for error in certificate_format.schema_errors(broken))


def test_docs_pointers_name_anchors_that_exist():
    text = (PROJECT_ROOT / "docs" / "claims.md").read_text(encoding="utf-8")
    for claim_id in claims.ALL_IDS:
        page, anchor = certificate_format.docs_pointer(claim_id).split("#")
        assert page == "docs/claims.md"
        assert f'<a id="{anchor}"></a>' in text, anchor


def test_readme_and_docs_links_resolve_within_the_project():
    """The project documents itself: every relative link of README.md and docs/ names a file of the
    checkout (and an anchor that exists there), and none points outside it."""
    import re

    pages = [PROJECT_ROOT / "README.md", *sorted((PROJECT_ROOT / "docs").glob("*.md"))]
    assert {page.name for page in pages} >= {"README.md", "mathematics.md", "algorithm.md", "claims.md", "certificates.md"}
    for page in pages:
        text = page.read_text(encoding="utf-8")
        assert "SPEC.md" not in text and "../shared" not in text, page
        for target in re.findall(r"\]\(([^)#:]*)(?:#([^)]*))?\)", text):
            path, anchor = target
            linked = (page.parent / path).resolve() if path else page
            assert linked.is_file() and PROJECT_ROOT in linked.parents, (page.name, path)
            if anchor:
                linked_text = linked.read_text(encoding="utf-8")
                slugs = {re.sub(r"[^a-z0-9 _-]", "", heading.lower()).replace(" ", "-") for heading in re.findall(r"^#+ (.*)$", linked_text, re.M)}
                assert anchor in slugs or f'<a id="{anchor}"></a>' in linked_text, (page.name, path, anchor)


def _as_schema_1_1(certificate: dict) -> dict:
    """The certificate in the layout of schema 1.1: the run record inside provenance, under the digest."""
    old = copy.deepcopy(certificate)
    run = old.pop("run")
    old["schema_version"] = "1.1"
    old["numerical"].pop("precision")
    old["provenance"].update(command=run["command"], created_utc=run["created_utc"], git_tree_clean=run["git_tree_clean"],
                             timing={"wall_seconds": run["wall_seconds"], "frames_per_second": run["frames_per_second"]})
    return certificate_format.seal(old)


def test_a_schema_1_1_certificate_is_still_read_and_compared(tmp_path):
    current = _certificate(seed=2)
    old = _as_schema_1_1(current)
    path = tmp_path / "P1.json"
    path.write_text(json.dumps(old))
    loaded = certificate_format.load(path)
    assert certificate_format.run_record(loaded)["wall_seconds"] == current["run"]["wall_seconds"]
    differences, notes = claims.compare(loaded, current)
    assert differences == [] and notes == ["all 2 worst residuals reproduced bit for bit"]
    # 1.1 sealed its run record: an edited wall time there is a tampered certificate
    old["provenance"]["timing"]["wall_seconds"] += 1.0
    path.write_text(json.dumps(old))
    with pytest.raises(certificate_format.CertificateError, match="digest mismatch"):
        certificate_format.load(path)
    # and a 1.2 certificate in the 1.1 layout does not pass for either
    bad = copy.deepcopy(_as_schema_1_1(current))
    bad["schema_version"] = SCHEMA_VERSION
    path.write_text(json.dumps(certificate_format.seal(bad)))
    with pytest.raises(certificate_format.CertificateError, match="does not match the certificate schema"):
        certificate_format.load(path)


@pytest.mark.parametrize("version", ["1.1", "1.2"])
def test_an_older_certificate_that_contradicts_itself_is_refused_too(tmp_path, version):
    """The consistency check reads every schema version: a 1.1 or 1.2 certificate relabelled pass
    and sealed again is refused like a 1.3 one."""
    current = _certificate(seed=2)
    old = _as_schema_1_1(current)
    if version == "1.2":
        old = copy.deepcopy(current)
        run = old["run"]
        old["schema_version"] = "1.2"
        old["numerical"].pop("precision")
        old["provenance"]["git_tree_clean"] = run.pop("git_tree_clean")
    old["numerical"]["checks"][0].update(max_ratio=3.0, passed=False)
    old.update(verdict="pass", failures=[], inconclusive=[])
    path = tmp_path / "P1.json"
    path.write_text(json.dumps(certificate_format.seal(old)))
    with pytest.raises(certificate_format.CertificateError, match="contradicts itself"):
        certificate_format.load(path)


def test_a_certificate_records_the_git_state_it_is_given_not_the_one_it_finds():
    """The command reads the tree's state once, before writing, and passes it to every claim's
    certificate (also in pool workers, where a fresh read would see the certificates written since)."""
    given = {"commit": "ab" * 20, "tree_clean": False}
    built = claims.build_certificate("P1", seed=0, profile="quick", optimizer="stiefel_adam", options={}, command="test", data=None,
                                     wall_seconds=0.0, git=given)
    assert built["provenance"]["git_commit"] == given["commit"] and built["run"]["git_tree_clean"] is False
