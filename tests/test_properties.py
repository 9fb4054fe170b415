"""Property verdicts (propositions/properties.py, certify/outside/properties.py) on optimizers written
for them (tests/property_fakes.py): each verdict must be the one its mathematics gives, the domain
and feasibility must be measured, not crash the certifier, and a check that is broken must show.
"""

from __future__ import annotations

import json
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

import reference_impl as ri
from certify import certificate as certificate_format
from certify.outside import properties as outside
from propositions import properties
from propositions.kit import blackbox
from propositions._common import DETECTION_FACTOR
from certify_fakes import run_main

sys.path.insert(0, str(Path(__file__).resolve().parent))  # property_fakes, loaded by name as a user's module would be

H, F, V, U = "holds", "fails", "vacuous", "untested"
ALL_HOLD = dict.fromkeys(properties.PROPERTY_IDS, H)

# what each optimizer's mathematics says (tests/property_fakes.py's docstring)
EXPECTED = {
    "numpy:property_fakes:init,polar_sgd": {**ALL_HOLD, "P2": F},
    "numpy:property_fakes:init,loose_sgd": {**ALL_HOLD, "P2": F},
    "numpy:property_fakes:entrywise_adam": {**ALL_HOLD, "P1": F, "P3": F, "P4-left": F, "P4-right": F},
    "numpy:property_fakes:ignores_decay": {**ALL_HOLD, "P5": V},
    "numpy:property_fakes:qr_adam": {**ALL_HOLD, "P4-right": F, "P4-signed": F},
    "numpy:property_fakes:no_eps_zero": {**ALL_HOLD, "P2": U},
    "numpy:property_fakes:no_st11": ALL_HOLD,
    "numpy:property_fakes:off_manifold": ALL_HOLD,
    "stiefel_adam": ALL_HOLD,
    "fixed_step_sgd": {**ALL_HOLD, "P2": F},
    "canonical_metric_gradient": {**ALL_HOLD, "P1": F},
}


@pytest.fixture(scope="module")
def asked():
    return {spec: properties.ask_all(outside.resolve(spec), 0) for spec in EXPECTED}


@pytest.mark.parametrize("spec", list(EXPECTED))
def test_verdicts_agree_with_the_optimizers_mathematics(spec, asked):
    found = {v["property"]: v["verdict"] for v in asked[spec]["properties"]}
    assert found == EXPECTED[spec], {v["property"]: (v["verdict"], v["reason"]) for v in asked[spec]["properties"]}
    for verdict in asked[spec]["properties"]:
        if verdict["verdict"] == F:  # a failure is far beyond its bound, not at its edge
            assert verdict["margin"] >= 1e3, verdict
        if verdict["verdict"] == H:  # every check compared frames within its bound, and reached every regime of the profile:
            # each value of each dimension resolved somewhere, or nothing there could be: the step vanishes (an SGD on
            # gradients of scale 2^-100 does not move) or leaves the rounding model (at 2^100 it retracts W + xi of condition 2^100)
            assert all(c["samples"] > 0 and c["max_ratio"] <= 1 for c in verdict["checks"])
            dimensions = properties.DIMENSIONS[verdict["property"].split("-")[0]]
            for table in verdict["coverage"].values():
                assert set(dimensions) <= set(table), (verdict["property"], table)
                for dimension in dimensions:
                    for value, cell in table[dimension].items():
                        assert cell["resolved"] or (cell["compared"] == cell["inert"] + cell["below_precision"]
                                                    and cell["compared"] + cell["beyond_model"] > 0), (dimension, value, cell)


def test_the_domain_is_found_by_trials_and_reported_with_counts(asked):
    rows = {row["case"]: row for row in asked["numpy:property_fakes:no_eps_zero"]["domain"]}
    assert rows["eps = 0"]["failed"] == rows["eps = 0"]["frames"] == properties.FRAMES
    assert "eps must be positive" in rows["eps = 0"]["reason"]
    assert not asked["numpy:property_fakes:no_eps_zero"]["eps_zero"]
    p2 = next(v for v in asked["numpy:property_fakes:no_eps_zero"]["properties"] if v["property"] == "P2")
    assert "undefined at eps = 0" in p2["reason"]
    rows = {row["case"]: row for row in asked["numpy:property_fakes:no_st11"]["domain"]}
    assert rows["St(1, 1)"]["failed"] == properties.FRAMES and "St(1, 1) are not supported" in rows["St(1, 1)"]["reason"]
    assert rows["eps = 0"]["failed"] == 0


def test_a_declared_domain_is_not_tried():
    variant = outside.resolve("numpy:property_fakes:no_eps_zero:no_eps_zero")
    found = properties.ask_all(variant, 0, only=("P2",))
    row = next(r for r in found["domain"] if r["case"] == "eps = 0")
    assert row["frames"] == 0 and "declared" in row["reason"]
    assert found["properties"][0]["verdict"] == U


def test_an_implementation_off_st_is_tested_at_its_own_feasibility(asked):
    phi = asked["numpy:property_fakes:off_manifold"]["phi"]
    assert 1e-9 < phi < 2e-8  # its 5e-9 normal offset, measured (||W^T W - I|| about twice it)
    assert asked["stiefel_adam"]["phi"] < 1e-13


def test_nan_and_raising_frames_are_left_out_with_a_reason():
    runner = blackbox.Runner(outside.resolve("numpy:adapter_fakes:unguarded"), 2.0**-53)
    W = ri.random_point(5, 2, np.random.default_rng(1), (3,))
    run = runner.run(W, np.zeros((1,) + W.shape), ri.StiefelAdamConfig(eps=0.0), case="zero gradient")
    assert not np.any(run.ok)
    assert runner.excluded == {("zero gradient", "the step returned a frame that is not finite (NaN or inf)"): 3}
    raising = blackbox.Runner(outside.resolve("numpy:property_fakes:no_st11"), 2.0**-53)
    run = raising.run(np.ones((2, 1, 1)), np.ones((1, 2, 1, 1)), ri.StiefelAdamConfig(), case="St(1, 1)")
    assert not np.any(run.ok) and list(raising.excluded.values()) == [2]


def test_every_control_is_told_apart():
    records = properties.controls(0)
    assert [r for r in records if not r["detected"]] == []
    assert {r["property"] for r in records} == set(properties.PROPERTY_IDS)


def test_a_blunted_check_misses_its_controls_and_leaves_its_property_untested(monkeypatch):
    """Break the trajectory comparisons (a bound a million times too large): the controls of P2, P4 and P5
    are missed, and apply_controls turns their verdicts into untested; P1 and P3 (directions) are not affected."""
    original = blackbox.comparison_bound
    monkeypatch.setattr(blackbox, "comparison_bound", lambda *a, **k: 1e6 * original(*a, **k) + 1.0)
    records = properties.controls(0)
    missed = {r["property"] for r in records if not r["detected"]}
    assert missed == {"P2", "P4-left", "P4-right", "P4-signed", "P5"}, records
    found = properties.apply_controls(properties.ask(ri.VARIANTS["stiefel_adam"], 0, eps_zero=True), records)
    assert {v["property"]: v["verdict"] for v in found} == {**dict.fromkeys(missed, U), "P1": H, "P3": H}


def test_a_broken_direction_check_misses_its_control(monkeypatch):
    """P1's residual compared with the wrong direction's own norm (a check that cannot fail): its control slips."""
    monkeypatch.setattr(properties, "frobenius", lambda A: np.full(np.shape(A)[:-2], 1e-300))
    records = [r for r in properties.controls(0, only=("P1",))]
    assert records and not records[0]["detected"]


def test_the_vacuity_probe_needs_a_decay_term_that_would_move_the_step():
    found = properties.ask_all(properties.IGNORES_WEIGHT_DECAY, 0, only=("P5",))["properties"][0]
    assert found["verdict"] == V and "2^30" in found["reason"]
    torch = pytest.importorskip("torch")  # noqa: F841
    geoopt_like = properties.ask(ri.VARIANTS["stiefel_adam"], 0, eps_zero=True, only=("P5",), ignored=("weight_decay",))[0]
    assert geoopt_like["verdict"] == V and "takes no weight_decay" in geoopt_like["reason"]


def test_float32_is_held_where_its_precision_resolves_the_property():
    """torch_impl in float32 at the default profile: P1, P2, P4 and P5 hold, decided where float32
    resolves them: at lr 1e-4 a step is below a tenth of what float32 rounds of it, for any
    implementation, and those comparisons are counted as below the precision, never as coverage; P3
    is untested, naming the square frames, where the span of float32 directions is never resolved
    although float32 could."""
    pytest.importorskip("torch")
    found = {v["property"]: v for v in properties.ask_all(outside.resolve("torch_impl-float32"), 0)["properties"]}
    assert {k: v["verdict"] for k, v in found.items()} == {**ALL_HOLD, "P3": U}
    check = found["P1"]["checks"][0]
    assert check["samples"] > 0 and check["unresolved"] > 0 and check["max_ratio"] <= 1
    assert found["P3"]["reason"].startswith("regime shape = square: none of its")
    for name in ("P2", "P4-left", "P4-right", "P4-signed", "P5"):
        (table,) = found[name]["coverage"].values()
        slow = table["lr"]["0.0001"]
        assert slow["resolved"] == 0 and slow["below_precision"] > 0 and slow["inert"] + slow["below_precision"] == slow["compared"]
        assert all(table["lr"][lr]["resolved"] > 0 for lr in ("0.001", "0.01", "0.1", "1"))


def test_a_torch_optimizer_for_two_dimensional_frames_runs_frame_by_frame():
    pytest.importorskip("torch")
    variant = outside.resolve("torch:property_fakes:TwoDimensionalStiefelAdam")
    assert "one parameter per (d, r) frame" in variant.calling and "(2, 5, 2)" in variant.calling
    found = properties.ask_all(variant, 0, only=("P1", "P4"))
    assert {v["property"]: v["verdict"] for v in found["properties"]} == {"P1": H, "P4-left": H, "P4-right": H, "P4-signed": H}


def test_compare_properties_writes_the_matrix_and_a_record_per_implementation(capsys, tmp_path):
    (tmp_path / "REPORT.md").write_text("# Certificates\n\nthe report of certify all\n", encoding="utf-8")
    code, out, _ = run_main(capsys, "compare", "--properties", "stiefel_adam", "--implementation", "property_fakes:init,polar_sgd",
                            "--implementation", "property_fakes:ignores_decay", "--out", str(tmp_path))
    assert code == 1  # polar SGD fails P2, ignores_decay is vacuous on P5
    text = (tmp_path / "REPORT.md").read_text(encoding="utf-8")
    assert text.startswith("# Certificates\n\nthe report of certify all") and outside.PROPERTIES_BEGIN in text
    rows = {line.split(" | ")[0].strip("| "): line for line in text.splitlines() if line.startswith("| ")}
    assert rows["stiefel_adam"].count("| holds") == len(properties.PROPERTY_IDS) and rows["stiefel_adam"].endswith("| yes |")
    assert "fails: scaled_trajectories (margin" in rows["numpy:property_fakes:init,polar_sgd"]
    assert "vacuous: weight_decay does not reach the step" in rows["numpy:property_fakes:ignores_decay"]
    folder = tmp_path / "properties" / "numpy_property_fakes_init_polar_sgd"
    assert sorted(path.stem for path in folder.glob("*.json")) == sorted(properties.PROPERTY_IDS)
    sealed = certificate_format.load(folder / "P2.json")  # a sealed certificate, read as the claims' are
    assert sealed["provenance"]["seed"] == 0 and sealed["extra"]["implementation"]["stiefel_adam_step"]["same"] is False
    assert sealed["property"]["verdict"] == F and sealed["verdict"] == "fail" and all(c["detected"] for c in sealed["controls"])
    run_main(capsys, "compare", "--properties", "stiefel_adam", "--out", str(tmp_path))
    assert (tmp_path / "REPORT.md").read_text(encoding="utf-8").count(outside.PROPERTIES_BEGIN) == 1


def test_run_properties_asks_the_claims_named(capsys, tmp_path):
    code, out, _ = run_main(capsys, "run", "P5", "p4", "--properties", "--implementation", "property_fakes:ignores_decay",
                            "--out", str(tmp_path))
    assert code == 1
    (folder,) = (tmp_path / "properties").iterdir()
    found = {path.stem: certificate_format.load(path) for path in folder.glob("*.json")}
    assert sorted(found) == ["P4-left", "P4-right", "P4-signed", "P5"]
    assert found["P5"]["property"]["verdict"] == V and found["P5"]["verdict"] == "inconclusive"
    code, out, _ = run_main(capsys, "run", "p4-LEFT", "--properties", "--implementation", "property_fakes:ignores_decay",
                            "--out", str(tmp_path / "one"), "--profile", "quick")
    assert code == 0 and [path.name for path in (tmp_path / "one" / "properties").rglob("*.json")] == ["P4-left.json"]
    code, _, err = run_main(capsys, "run", "P6", "--properties", "--out", str(tmp_path))
    assert code == 2 and "states no property" in err
    code, _, err = run_main(capsys, "compare", "--properties", "numpy:no_such_module_here:step", "--out", str(tmp_path))
    assert code == 2 and "does not import" in err


@pytest.mark.parametrize("seed", range(10))
def test_a_bound_that_cannot_absorb_the_error_it_bounds_fails_a_fixed_count_iteration_at_every_seed(seed):
    """A Cayley retraction by three fixed-point iterations from W + m (the raw first moment, which
    scales with the gradient) leaves St by an amount that grows with c: its runs under 2^20 G part by
    about 1e-6 and leave St by as much. The bound is fixed before the comparison (the untransformed
    run's feasibility), so P2 fails at every seed; the range of c reported is where the runs agree."""
    (found,) = properties.ask(outside.resolve("numpy:property_fakes:init,cayley_fixed_adam"), seed, eps_zero=True, only=("P2",))
    assert found["verdict"] == F and found["margin"] >= DETECTION_FACTOR, (found["verdict"], found["reason"])
    assert "k > 0: up to 2^" in found["measured"]["scale_domain"], found["measured"]["scale_domain"]


@pytest.mark.parametrize("seed", range(10))
def test_an_ignored_eps_is_said_and_a_random_branch_is_not_read_as_a_setting(seed):
    """Two hyper-parameters that never reach the step, at every seed 0-9: an eps hard-coded to 1e-10
    (P2 fails, and says that eps never reached the step), and a weight_decay dropped by a box whose
    repeated runs differ in the last bits (P5 vacuous, measured beyond that noise; the determinism
    probe reports the noise)."""
    eps = properties.ask_all(outside.resolve("numpy:property_fakes:init,hardcoded_eps_adam"), seed, only=("P2",))
    (p2,) = eps["properties"]
    assert p2["verdict"] == F and "eps does not reach the step" in p2["reason"], p2["reason"]
    assert p2["measured"]["eps_reaches_step"] is False
    branching = properties.ask_all(outside.resolve("numpy:property_fakes:init,branching_adam_without_decay"), seed, only=("P5",))
    (p5,) = branching["properties"]
    assert p5["verdict"] == V and "weight_decay does not reach the step" in p5["reason"], (p5["verdict"], p5["reason"])
    assert branching["determinism"]["deterministic"] is False and branching["determinism"]["max_distance"] > 0


def test_a_deterministic_box_is_reported_so_and_compared_bit_for_bit():
    found = properties.ask_all(outside.resolve("stiefel_adam"), 0, only=("P5",))
    assert found["determinism"] == {**found["determinism"], "deterministic": True, "max_distance": 0.0, "differing": 0}
    assert found["determinism"]["frame_steps_compared"] > 0
    (p5,) = found["properties"]
    assert p5["verdict"] == H


def test_figures_come_from_resolved_comparisons_and_are_numbers():
    """P3's spread is taken over the comparisons that resolve the property only (an unresolved one's
    residual is its own directions' error); a feasibility that is not finite is None, not "inf"."""
    check = properties.Comparison("span_warm_step", "test")
    check.add(np.array([1e-12, 0.3]), np.array([1e-10, 0.5]), np.array([1.0, 1.0]), np.array([True, True]))
    assert properties.span_spread(check) == pytest.approx(1e-12)
    unresolved = properties.Comparison("span_warm_step", "test")
    unresolved.add(np.array([0.3]), np.array([0.5]), np.array([1.0]), np.array([True]))
    assert properties.span_spread(unresolved) is None
    assert properties._number(float("inf")) is None and properties._number(0.25) == 0.25


@pytest.mark.parametrize("seed", range(10))
def test_a_cap_in_a_norm_that_rotations_change_fails_p4_where_it_binds(seed):
    """P4 is asked at lr 1e-4, 0.05 and 1: a 1-norm cap that binds at 1 only breaks the left and right
    actions (at 0.05 alone it read "holds"), and the record says at which lr the first step was capped."""
    found = {v["property"]: v for v in properties.ask(outside.resolve("numpy:property_fakes:init,one_norm_capped_adam"), seed,
                                                       eps_zero=True, only=("P4",))}
    assert found["P4-left"]["verdict"] == F and found["P4-right"]["verdict"] == F and found["P4-signed"]["verdict"] == H
    assert found["P4-left"]["margin"] >= DETECTION_FACTOR
    regimes = found["P4-left"]["measured"]["first step by lr"]
    assert regimes["0.0001"].startswith("proportional") and regimes["1"].startswith("capped")


def test_readme_table_is_the_one_the_committed_records_give():
    """README's table of the optimizers people install is written by the command above it
    (--table README.md), never by hand: its rows are those of reports/properties/*.json."""
    root = Path(__file__).resolve().parent.parent
    readme = (root / "README.md").read_text()
    section = readme.split(outside.TABLE_BEGIN, 1)[1].split(outside.TABLE_END, 1)[0]
    rows = [line for line in section.splitlines() if line.startswith("| ") and not line.startswith("| implementation")]
    specs = [row.split(" | ")[0][2:] for row in rows]
    records = outside.records_from_certificates([certificate_format.load(path) for spec in specs
                                                 for path in sorted((root / "reports" / "properties" / outside.label(spec)).glob("*.json"))])
    assert list(records) == specs or sorted(records) == sorted(specs)
    expected = [line for line in outside.table({spec: records[spec] for spec in specs}, command="x").splitlines()
                if line.startswith("| ") and not line.startswith("| implementation")]
    assert rows == expected and len(rows) >= 5


def test_table_refuses_a_page_without_its_markers(tmp_path, capsys):
    page = tmp_path / "page.md"
    page.write_text("# no markers here\n")
    code, out, err = run_main(capsys, "compare", "--properties", "qr_retraction", "--out", str(tmp_path / "o"), "--table", str(page))
    assert code == 2 and "has no <!-- certify properties table: begin -->" in err and "running" not in out
    code, _, err = run_main(capsys, "compare", "qr_retraction", "--table", str(page))
    assert code == 2 and "give it with --properties" in err


def test_a_p4_probed_at_one_learning_rate_lets_its_cap_control_escape(monkeypatch):
    """The 1-norm cap is a control of P4 (kit/property_controls.py): asking P4 at lr 0.05 alone, as
    before, lets it read "holds", so the control escapes and P4 is untested for that run."""
    one_lr = replace(properties.DEFAULT_REGIMES, lrs=(0.05,))
    missed = [r for r in properties.controls(0, only=("P4-left",), regimes=one_lr) if not r["detected"]]
    assert [(r["control"], r["verdict"]) for r in missed] == [("one_norm_cap", H)]
    found = properties.apply_controls([{"property": "P4-left", "verdict": H, "check": None, "margin": None, "reason": ""}], missed)
    assert found[0]["verdict"] == U and "one_norm_cap" in found[0]["reason"]


def test_a_bit_for_bit_vacuity_probe_lets_its_noise_control_escape(monkeypatch):
    """The hidden QR branch is a control of P5's vacuity probe: a probe that runs once and compares
    bit for bit (no repeats, no measured noise) reads the branch as weight_decay reaching the step."""
    monkeypatch.setattr(properties, "PROBE_REPEATS", 1)
    monkeypatch.setattr(properties, "determinism", lambda runner, seed, eps: {})
    (record,) = [r for r in properties.controls(0, only=("P5",)) if r["control"] == "hidden_branch_without_decay"]
    assert record["verdict"] == H and not record["detected"]
