"""The certifier's weakening mutants (certify/weakening.py): site discovery, the operators, keys,
sampling, judging a run and the report, without running `certify all` (fast)."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest

from certify import weakening as w

ROOT = Path(__file__).resolve().parents[1]

SYNTHETIC = b'''"""A claim module."""
import numpy as np

from .kit.common import rng_for

CLAIM_ID = "PX"
LOG10_C_RANGE = (-120.0, 120.0)
CONDITION_LOG10 = (0.0, 8.0)
LOG2_RANGE = (-300, 300)
SCALE_FRAMES = 4
SCALE_SHAPE = (3, 2)
SLOPE_GRID = 10.0 ** np.linspace(-14.0, 0.0, 57)
TOKEN_COUNTS = (2, 5, 16)
DETECTION_FACTOR = 10.0
SLOPE_TOL = 0.1
FAMILY_WISE_ALPHA = 1e-6
SHAPES = ((1, 1), (3, 2), (8, 3))
DTYPES = ("float64", "float32", "bfloat16")
NAMES = ("a", "b")
PROFILES = {
    "quick": Profile("quick", frames=1_000, steps=4),
    "default": Profile("default", frames=10_000, steps=8),
}


def error_bound(d, r):
    return 2.0 * d * r


def pair_bounds(d):
    return d * 1e-16, d


def scan(seed, d, r, index, decades: int = 30):
    rng = rng_for(seed, CLAIM_ID, "label", d, r, index)
    again = rng_for(seed, *(CLAIM_ID, "chunk", d, r))
    return rng, again


def children(seed):
    return np.random.SeedSequence(seed).spawn(4)
'''

KIT = b'''import numpy as np


def ulps_apart(x, y):
    return np.abs(np.asarray(x) - np.asarray(y)) / np.spacing(np.abs(y))


def newton_residual(d, u):
    return 1.0 - d * u


def rng_for(seed, *key):
    return np.random.Generator(np.random.PCG64(np.random.SeedSequence(int(seed), spawn_key=spawn_key(*key))))


class Checker:
    def compare(self, lhs, rhs):
        return lhs - rhs
'''


def _sites(data: bytes = SYNTHETIC, rel: str = "propositions/px.py"):
    return w.file_sites(rel, data)


def _diffs(sites, operator):
    return [s.diff for s in sites if s.operator == operator]


def _mutated(data: bytes, site: w.Site) -> bytes:
    return w.apply_edits(data, site.edits)


def test_range_shortened():
    diffs = _diffs(_sites(), w.RANGE)
    assert "LOG10_C_RANGE = (-120.0, 120.0) -> LOG10_C_RANGE = (-30.0, 30.0)" in diffs
    assert "CONDITION_LOG10 = (0.0, 8.0) -> CONDITION_LOG10 = (0.0, 2.0)" in diffs  # towards its point nearest 0
    assert "LOG2_RANGE = (-300, 300) -> LOG2_RANGE = (-75, 75)" in diffs  # ints stay ints
    assert "SCALE_FRAMES = 4 -> SCALE_FRAMES = 2" in diffs
    assert "SLOPE_GRID = 10.0 ** np.linspace(-14.0, 0.0, 57) -> SLOPE_GRID = 10.0 ** np.linspace(-3.5, 0.0, 57)" in diffs
    assert "TOKEN_COUNTS = (2, 5, 16) -> TOKEN_COUNTS = (2, 5)" in diffs
    assert any("decades: int = 30" in d and "decades: int = 15" in d for d in diffs)
    # the profile being run (quick) has its counts halved; the others are never read by the run
    assert any('Profile("quick", frames=500, steps=4)' in d for d in diffs)
    assert any('Profile("quick", frames=1_000, steps=2)' in d for d in diffs)
    assert not any('Profile("default"' in d.split(" -> ")[1] for d in diffs)
    assert not any(d.startswith("SCALE_SHAPE") for d in diffs)  # a shape, not a range


def test_bound_loosened():
    diffs = _diffs(_sites(), w.BOUND)
    assert "DETECTION_FACTOR = 10.0 -> DETECTION_FACTOR = 1.0" in diffs  # a control must exceed it: smaller is weaker
    assert "SLOPE_TOL = 0.1 -> SLOPE_TOL = 1.0" in diffs
    assert "FAMILY_WISE_ALPHA = 1e-6 -> FAMILY_WISE_ALPHA = 1e-07" in diffs
    assert "return 2.0 * d * r -> return 10.0 * (2.0 * d * r)" in diffs
    assert "return d * 1e-16, d -> return 10.0 * (d * 1e-16), d" in diffs  # the bound, not what comes with it


def test_shape_and_dtype_dropped():
    sites = _sites()
    assert _diffs(sites, w.SHAPE) == [
        "SHAPES = ((1, 1), (3, 2), (8, 3)) -> SHAPES = ((3, 2), (8, 3))",
        "SHAPES = ((1, 1), (3, 2), (8, 3)) -> SHAPES = ((1, 1), (8, 3))",
        "SHAPES = ((1, 1), (3, 2), (8, 3)) -> SHAPES = ((1, 1), (3, 2))",
    ]
    assert len(_diffs(sites, w.DTYPE)) == 3
    assert 'DTYPES = ("float64", "float32", "bfloat16") -> DTYPES = ("float64", "bfloat16")' in _diffs(sites, w.DTYPE)
    assert not any("NAMES" in d for d in _diffs(sites, w.DTYPE))


def test_draws_dependent():
    diffs = _diffs(_sites(), w.DRAWS)
    assert 'rng = rng_for(seed, CLAIM_ID, "label", d, r, index) -> rng = rng_for(seed, CLAIM_ID, "label")' in diffs
    assert 'again = rng_for(seed, *(CLAIM_ID, "chunk", d, r)) -> again = rng_for(seed, *(CLAIM_ID, "chunk", d, r)[:2])' in diffs
    assert "return np.random.SeedSequence(seed).spawn(4) -> return [np.random.SeedSequence(seed)] * (4)" in diffs
    kit = _diffs(_sites(KIT, "propositions/kit/x.py"), w.DRAWS)
    assert any("spawn_key=spawn_key(*key)" in d and d.endswith("spawn_key=[])))") for d in kit)


def test_self_comparison_only_in_kit_functions():
    sites = _sites(KIT, "propositions/kit/x.py")
    assert _diffs(sites, w.SELF) == [
        "return np.abs(np.asarray(x) - np.asarray(y)) / np.spacing(np.abs(y)) -> "
        "return np.abs(np.asarray(x) - np.asarray(x)) / np.spacing(np.abs(y))"]
    # not outside the kit, not a method, not arithmetic with a constant
    assert not _diffs(_sites(KIT, "propositions/px.py"), w.SELF)


def test_every_synthetic_site_compiles_and_differs():
    for data, rel in ((SYNTHETIC, "propositions/px.py"), (KIT, "propositions/kit/x.py")):
        for site in _sites(data, rel):
            mutated = _mutated(data, site)
            assert mutated != data, site.key
            compile(mutated, rel, "exec")


@pytest.fixture(scope="module")
def tree_sites():
    return w.discover(ROOT)


def test_discovery_on_the_project(tree_sites):
    counts = Counter(site.operator for site in tree_sites)
    assert set(counts) == set(w.OPERATORS), counts
    keys = [site.key for site in tree_sites]
    assert len(keys) == len(set(keys))
    for site in tree_sites:
        assert site.key.startswith(f"{site.file} | {site.operator} | ") and site.file.startswith("propositions/")
    # known sites of the real code
    assert any(s.key.endswith("DETECTION_FACTOR = 10.0 -> DETECTION_FACTOR = 1.0") for s in tree_sites)
    assert any(s.file == "propositions/kit/common.py" and s.operator == w.DRAWS and "spawn_key=[]" in s.new for s in tree_sites)
    assert any(s.file == "propositions/kit/common.py" and s.operator == w.SELF for s in tree_sites)


def test_every_project_site_compiles_and_differs(tree_sites):
    sources = {}
    for site in tree_sites:
        data = sources.setdefault(site.file, (ROOT / site.file).read_bytes())
        mutated = _mutated(data, site)
        assert mutated != data, site.key
        compile(mutated, site.file, "exec")


def test_keys_do_not_depend_on_line_numbers():
    moved = b"# a comment\n\n\n" + SYNTHETIC.replace(b"CLAIM_ID = ", b"# another\nCLAIM_ID = ", 1)
    before, after = _sites(), _sites(moved)
    assert [s.key for s in before] == [s.key for s in after]
    assert [s.line for s in before] != [s.line for s in after]


def test_sampling_is_deterministic(tree_sites):
    first = w.sample_sites(tree_sites, 30, seed=0)
    assert [s.key for s in first] == [s.key for s in w.sample_sites(tree_sites, 30, seed=0)]
    assert [s.key for s in first] != [s.key for s in w.sample_sites(tree_sites, 30, seed=1)]
    assert len(first) == 30 and len({s.key for s in first}) == 30
    assert {s.operator for s in first} == set(w.OPERATORS)  # every operator gets its share first
    assert w.sample_sites(tree_sites, None, seed=0) == tree_sites
    assert w.sample_sites(tree_sites, 10**6, seed=0) == tree_sites


def test_reachable_needs_the_statement_and_a_reader_run():
    sites = _sites()
    inside = next(s for s in sites if s.operator == w.DRAWS and s.name is None)
    assert w.reachable(inside, None)
    assert w.reachable(inside, {inside.file: {inside.line}})
    assert not w.reachable(inside, {inside.file: set()})
    constant = next(s for s in sites if s.name == "SLOPE_TOL")
    assert not w.reachable(constant, {constant.file: {constant.line}})  # assigned, never read
    read = w.replace(constant, uses=(("propositions/other.py", 7),))
    assert w.reachable(read, {constant.file: {constant.line}, "propositions/other.py": {7}})
    assert not w.reachable(read, {constant.file: {constant.line}, "propositions/other.py": {8}})
    default = next(s for s in sites if "decades" in s.old)
    assert default.uses and default.uses[0][1] > default.line  # the body of the function must run


def test_readers_of_a_project_constant(tree_sites):
    detection = next(s for s in tree_sites if s.name == "DETECTION_FACTOR")
    assert any(file != detection.file for file, _ in detection.uses)


def _certificate(claim, verdict, **parts):
    return {"id": claim, "verdict": verdict, "failures": [], "inconclusive": [], **parts}


def test_judge_and_first_failing_check():
    failing = _certificate("P2", "fail", numerical={"checks": [{"name": "ok", "passed": True},
                                                             {"name": "scaled_trajectories", "passed": False, "max_ratio": 3.5, "samples": 10}]})
    passing = _certificate("P1", "pass")
    status, killing = w.judge(1, [passing, failing])
    assert status == "killed" and killing[0]["id"] == "P2"
    assert killing[0]["first_failing_check"].startswith("numerical: scaled_trajectories")
    assert w.judge(0, [passing]) == ("survived", [])
    assert w.judge(None, []) == ("timeout", [])
    assert w.judge(1, [])[0] == "invalid"
    loaded = _certificate("P3", "inconclusive", inconclusive=["the claim module of P3 could not be loaded: SyntaxError"])
    assert w.judge(1, [passing, loaded])[0] == "invalid"
    control = _certificate("P4", "fail", controls=[{"name": "c", "detected": False, "check": "x", "margin": 2.0}])
    assert w.first_failing_check(control).startswith("control: c not detected")
    symbolic = _certificate("P5", "fail", symbolic={"steps": [{"description": "identity", "reduced": False}]}, exact=[{"name": "e", "passed": False}])
    assert w.first_failing_check(symbolic) == "symbolic: identity"


def test_classes_file_is_valid():
    data = json.loads(w.CLASSES_FILE.read_text(encoding="utf-8"))
    for key, entry in data["mutants"].items():
        assert entry["class"] in w.CLASSES, key
        assert entry["reason"].strip(), key
        assert key.split(" | ")[1] in w.OPERATORS, key


def test_classify_tally_and_markdown():
    entries = [w._entry(site, status, [], 1.0, None) for site, status in zip(_sites()[:4], ("killed", "survived", "survived", "invalid"))]
    classes = {entries[1]["key"]: {"class": "gap", "reason": "no control"},
               f"{entries[2]['file']} | {entries[2]['operator']} | *": {"class": "equivalent", "reason": "same"}}
    for entry in entries:
        w.classify(entry, classes)
    assert [e["class"] for e in entries] == [None, "gap", "equivalent", None]
    counts = w.tally(entries)
    assert counts["killed"] == 1 and counts["gaps"] == 1 and counts["equivalent"] == 1
    assert counts["score"] == pytest.approx(1 / (4 - 1 - 1))
    record = {**counts, "population": 10, "seed": 0, "command": "python -m certify.weakening", "wall_seconds": 1.0, "max_children": 2,
              "profile": "quick", "baseline_seconds": 40.0, "baseline_verdicts": {"P1": "pass"}, "timeout_seconds": 200.0,
              "operators": w.operator_rows(_sites(), [], entries), "mutants": entries}
    text = w.markdown(record)
    assert text.startswith("## Certifier weakenings") and "no control" in text and "| range shortened |" in text


def test_command_line_help(capsys):
    with pytest.raises(SystemExit) as stop:
        w.main(["--help"])
    assert stop.value.code == 0
    assert "--max-children" in capsys.readouterr().out
