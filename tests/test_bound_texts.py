"""The bound texts of the certificates are rendered from the formulas the code evaluates.

Every stage bound (propositions/kit/bounds.py, propositions/kit/step_analysis.py) carries its
formula as a sympy expression; a certificate cites it as "name: SYMBOL = {formula}". Here every
such block in every claim's texts (the checks the claims build, and every committed certificate
under reports/) is parsed back and compared with the stage: the same symbol, the same printed
formula, and the same value at random arguments as the code's evaluation. A stale constant in a
text (one the code no longer uses) fails this test."""

from __future__ import annotations

import functools
import json
import re
from pathlib import Path

import numpy as np
import pytest
import sympy

from propositions.kit import bounds, step_analysis
from propositions.kit.bounds import GAMMA, STAGES

REPORTS = Path(__file__).resolve().parent.parent / "reports"
BLOCK = re.compile(r"(\w+): (E_\w+) = \{([^{}]*)\}")

# What the three analyses of the step used to say, which the code no longer evaluates anywhere.
RETIRED = ("3/sigma_min", "3 ||dA|| / sigma", "(d + r + 5) u", "(d + r + 2) sqrt(r) u", "4 (d + (4k + 2) r)",
           "5 kappa^3", "POLAR_PERTURBATION")


def _values(stage, rng) -> dict:
    """Random positive arguments, integers where the formula wants shapes or counts."""
    values = {}
    for name in stage.params:
        if name in ("d", "r", "n", "m", "k", "t"):
            values[name] = int(rng.integers(1, 40))
        elif name.startswith("u"):
            values[name] = float(2.0 ** -rng.integers(20, 53))
        elif name.startswith("beta"):
            values[name] = float(rng.uniform(0.0, 0.99))
        else:
            values[name] = float(rng.uniform(0.1, 3.0))
    if "q" in values and "q_err" in values:
        values["q_err"] = values["q"] / 4  # a well-posed denominator
    return values


def check_blocks(text: str) -> int:
    """Assert that every stage block of `text` is its stage's rendered formula and evaluates to the
    stage's value; returns the number of blocks."""
    blocks = BLOCK.findall(text)
    for name, symbol, formula in blocks:
        _check_block(name, symbol, formula)
    return len(blocks)


@functools.lru_cache(maxsize=None)
def _check_block(name: str, symbol: str, formula: str) -> None:
    """One stage block (texts repeat the same blocks: each distinct one is simplified and evaluated once,
    at three points drawn from a seed of its own)."""
    assert name in STAGES, f"the text cites a stage {name!r} that no code defines"
    stage = STAGES[name]
    assert symbol == stage.symbol, f"{name}: text says {symbol}, code {stage.symbol}"
    assert formula == sympy.sstr(stage.expr), f"{name}: the text's formula {formula!r} is not the code's {sympy.sstr(stage.expr)!r}"
    parsed = sympy.sympify(formula, locals={**stage.symbols, "gamma_n": GAMMA})
    assert sympy.simplify(parsed - stage.expr) == 0
    rng = np.random.Generator(np.random.PCG64(np.random.SeedSequence(17)))
    for _ in range(3):
        values = _values(stage, rng)
        by_text = parsed.subs({stage.symbols[p]: v for p, v in values.items()}).replace(
            GAMMA, lambda n, unit: n * unit / (1 - n * unit))
        assert float(stage(**values)) == pytest.approx(float(by_text), rel=1e-12)


def _claim_texts() -> dict[str, str]:
    """The bound texts the claims build (without running them), by check name."""
    from propositions import crosscheck, p2_scale_independence as p2, p4_equivariance as p4
    from propositions.kit import running_bounds, trajectories

    checks = list(vars(trajectories._Checks("x", 0)).values())
    for dtype in crosscheck.DTYPE_NAMES:
        checks += list(crosscheck._new_checks(dtype).values())
    checks += list(p4._checks("left_haar", "left").values())
    checks += list(p2._trajectory_checks("scale", 4, 0.1, (-2, 2)))
    checks.append(p2._eps_deviation_check())
    from propositions import bookkeeping, optimizer_class

    for dtype in optimizer_class.DTYPE_NAMES:
        checks += [c for c in optimizer_class._new_checks(dtype).values() if hasattr(c, "bound_derivation")]
    checks += list(bookkeeping._layout_checks().values())
    texts = {c.name + f"#{i}": c.bound_derivation for i, c in enumerate(checks) if hasattr(c, "bound_derivation")}
    texts.update({"TRAJECTORY_BOUND_TEXT": running_bounds.TRAJECTORY_BOUND_TEXT, "STEP_ERROR_TEXT": step_analysis.STEP_ERROR_TEXT,
                  "POLAR_ERROR_TEXT": bounds.POLAR_ERROR_TEXT, "FEASIBILITY_TEXT": bounds.FEASIBILITY_TEXT,
                  "PROJECTION_TEXT": bounds.PROJECTION_TEXT, "POLAR_PERTURBATION_TEXT": bounds.POLAR_PERTURBATION_TEXT})
    return texts


def _certificate_texts() -> dict[str, str]:
    texts = {}
    for path in sorted(REPORTS.glob("*.json")) + sorted(REPORTS.glob("compare/*/*.json")):
        certificate = json.loads(path.read_text())
        for check in (certificate.get("numerical") or {}).get("checks", []):
            texts[f"{path.relative_to(REPORTS)}:{check['name']}"] = check.get("bound_derivation", "")
        for control in certificate.get("controls", []):
            for check in control.get("checks", []) or []:
                texts[f"{path.relative_to(REPORTS)}:{control['name']}:{check.get('name')}"] = check.get("bound_derivation", "")
    return texts


def test_every_stage_renders_and_parses_back():
    for name, stage in STAGES.items():
        assert check_blocks(stage.text()) == 1, name
        assert stage.__doc__ and len(stage.__doc__) > 80, f"{name} has no derivation"


def test_the_step_texts_cite_every_stage_the_bound_composes():
    cited = {name for name, _, _ in BLOCK.findall(step_analysis.STEP_ERROR_TEXT)}
    assert cited == set(step_analysis.STEP_STAGES)


@pytest.mark.parametrize("source", ["claims", "certificates"])
def test_every_text_names_only_constants_the_code_evaluates(source):
    texts = _claim_texts() if source == "claims" else _certificate_texts()
    assert texts
    blocks = 0
    # many checks share one derivation text (every chunk's copy, every dtype's): each distinct text is
    # parsed once, and a failure names the first place it appears
    first_place = {}
    for where, text in texts.items():
        first_place.setdefault(text, where)
    for text, where in first_place.items():
        for retired in RETIRED:
            assert retired not in text, f"{where}: cites {retired!r}, which no code evaluates"
        blocks += check_blocks(text)
    assert blocks >= len(step_analysis.STEP_STAGES)
    if source == "certificates":
        cited = {name for text in texts.values() for name, _, _ in BLOCK.findall(text)}
        assert set(step_analysis.STEP_STAGES) <= cited


def test_a_stale_formula_is_caught():
    """A text printed before a constant changed (3 u_c -> 4 u_c in the projection) is rejected."""
    stale = bounds.projection.text().replace("3*u_c", "4*u_c")
    assert stale != bounds.projection.text()
    with pytest.raises(AssertionError, match="not the code's"):
        check_blocks(stale)
    with pytest.raises(AssertionError, match="no code defines"):
        check_blocks("polar_shortcut: E_x = {3*dA}")
