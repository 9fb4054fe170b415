"""The kill suite of `certify mutate`: every certificate P1..P6 must pass on the code under test.

A mutant of reference_impl counts as killed when it makes any claim fail, turn inconclusive or
raise; so what decides is the certificates themselves, not the unit tests. The claims run at
MUTATION_PROFILE, small enough that one run of the whole suite takes a few seconds once the
modules are imported (the mutation tool forks every mutant from a process that has run it once):
the shape grid is kept whole (every small shape gets at least one frame, every large one two), the
trajectories are three steps long (enough for the bias corrections and the transport of m to
matter) and the mpmath comparison uses one frame.

About half of that time is the sympy derivations and exact-arithmetic tiers, which do not depend on
the float64 reference at all. Each claim module's `symbolic*` and `exact*` functions are therefore
run once per process under coverage.py's tracer; one whose run executed no line of a mutated file
of reference_impl (all but the independent models highprec.py and exact.py, as in pyproject's
[tool.mutmut]) is memoised, and a fork reuses its result (a deep copy). One that reached the
reference is left alone, so a mutant can never hide behind the cache; while another tracer is
active (a coverage run) nothing is memoised.

The tests carry the `mutation` marker, which the default pytest run deselects (pyproject addopts);
run them alone with `pytest -m mutation tests/mutation`.

This module imports only `propositions` (and through it reference_impl): the mutation tool copies
those into its own tree, and nothing here may reach a copy of the code that is not mutated.
"""

from __future__ import annotations

import copy
import functools
import sys
import warnings
from pathlib import Path

import pytest

import propositions
from propositions._common import Profile

SEED = 0

MUTATION_PROFILE = Profile("mutation", frames=60, steps=3, long_run_steps=50, mp_dps=30, mp_samples=1)

# reference_impl files that are not mutated (pyproject.toml, [tool.mutmut] do_not_mutate)
NOT_MUTATED = {"highprec.py", "exact.py", "__init__.py"}
MEMO_PREFIXES = ("symbolic", "exact")


def _reference_lines(run) -> bool | None:
    """Run `run()` under coverage.py's C tracer limited to reference_impl; whether it executed a
    line of a mutated file. None (and no check) when a tracer is active already or coverage.py
    is not installed: the caller then does not memoise."""
    if sys.gettrace() is not None:
        return None
    try:
        import coverage
    except ImportError:
        return None
    import reference_impl

    directory = Path(reference_impl.__file__).resolve().parent
    tracer = coverage.Coverage(data_file=None, include=[str(directory / "*.py")], config_file=False)
    tracer.start()
    try:
        run()
    finally:
        tracer.stop()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "no data collected" is the answer we hope for, not a problem
        data = tracer.get_data()
    return any(Path(name).name not in NOT_MUTATED and data.lines(name) for name in data.measured_files())


def independent_of_reference(function):
    """Memoise `function` if its first run executes no line of a mutated reference_impl file."""
    results: dict = {}
    touched: list = []  # [whether the first run reached the reference (None: not checked)], once run

    @functools.wraps(function)
    def wrapper(*args, **kwargs):
        key = (args, tuple(sorted(kwargs.items())))
        if touched == [False] and key in results:
            return copy.deepcopy(results[key])
        if touched:
            return function(*args, **kwargs)
        outcome = []
        touched.append(_reference_lines(lambda: outcome.append(function(*args, **kwargs))))
        if touched == [None]:
            touched.clear()  # not checked this time (a tracer was active): check on a later call
        if touched == [False]:
            results[key] = copy.deepcopy(outcome[0])
        return outcome[0] if outcome else function(*args, **kwargs)

    wrapper.reaches_reference = touched
    return wrapper


def install_memos() -> dict[str, object]:
    """Wrap the symbolic/exact functions of every claim module; returns them by qualified name."""
    installed = {}
    for claim_id in propositions.CLAIM_IDS:
        module = sys.modules[propositions.get_claim(claim_id).run.__module__]
        for name, value in list(vars(module).items()):
            if name.startswith(MEMO_PREFIXES) and callable(value) and getattr(value, "__module__", None) == module.__name__:
                if not hasattr(value, "reaches_reference"):
                    setattr(module, name, independent_of_reference(value))
                installed[f"{module.__name__}.{name}"] = getattr(module, name)
    return installed


@pytest.fixture(scope="session")
def memoised_claims():
    """The memos, installed only when the kill suite runs (never in the default session)."""
    return install_memos()


@pytest.mark.mutation
@pytest.mark.parametrize("claim_id", propositions.CLAIM_IDS)
def test_certificate_passes(claim_id, memoised_claims):
    result = propositions.get_claim(claim_id).run(SEED, MUTATION_PROFILE)
    assert result.verdict == "pass", f"{claim_id}: {result.verdict}: " + "; ".join(result.failures() + result.inconclusive)


def test_the_memo_check_sees_a_call_into_the_reference():
    """The guard of the memos: a function that runs the reference is found out and never cached."""
    import numpy as np

    import reference_impl

    calls = []

    def reaches():
        calls.append(1)
        return reference_impl.sym(np.eye(2))

    def pure():
        calls.append(1)
        return sum(range(10))

    reaching, independent = independent_of_reference(reaches), independent_of_reference(pure)
    for _ in range(2):
        reaching(), independent()
    if _reference_lines(lambda: None) is None:
        pytest.skip("a tracer is active or coverage.py is missing: the memos are off here")
    assert reaching.reaches_reference == [True] and independent.reaches_reference == [False]
    assert len(calls) == 3  # reaches() ran twice, pure() once
