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
import dataclasses
import functools
import inspect
import sys
import warnings
from pathlib import Path

import pytest

import propositions
from propositions._common import PROFILES

SEED = 0

# The quick profile cut down; a field added to Profile later keeps its quick value.
MUTATION_PROFILE = dataclasses.replace(PROFILES["quick"], name="mutation", frames=60, steps=3, long_run_steps=50, mp_dps=30, mp_samples=1)

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


# The certificates that judge a mutant of reference_impl: every claim that needs no optional package.
# The cross-check (torch) is left out: the tool forks a process per mutant, and torch's thread pools
# do not survive a fork (the forked run can hang until its timeout).
KILL_SUITE_IDS = tuple(claim_id for claim_id in propositions.CLAIM_IDS if not propositions.get_claim(claim_id).requires)


def install_memos() -> dict[str, object]:
    """Wrap the symbolic/exact functions of every claim module; returns them by qualified name."""
    installed = {}
    for claim_id in KILL_SUITE_IDS:
        module = sys.modules[propositions.get_claim(claim_id).run.__module__]
        for name, value in list(vars(module).items()):
            if name.startswith(MEMO_PREFIXES) and callable(value) and getattr(value, "__module__", None) == module.__name__:
                if not hasattr(value, "reaches_reference"):
                    setattr(module, name, independent_of_reference(value))
                installed[f"{module.__name__}.{name}"] = getattr(module, name)
    return installed


def _is_default(default, value) -> bool:
    if default is value:
        return True
    return isinstance(value, (str, int, float, bool)) and type(default) is type(value) and default == value


def rebuild_variants() -> list[str]:
    """Build the registered optimizer variants again, with whatever code is active now.

    reference_impl.VARIANTS is filled when reference_impl.controls is imported: the controls that
    swap one stage of the step are closures made by a factory (`_riemannian_step(gradient_map,
    second_moment=..., retraction=...)`). The mutation tool imports the reference once, before any
    mutant is switched on, so a mutant of the factory would never reach a certificate. Here every
    such closure is made again by calling its factory (the trampoline under the tool) with the
    arguments that differ from the factory's defaults, as the registry's calls pass them, and the
    variant is replaced in the registry in place. Returns the names rebuilt.
    """
    from reference_impl import VARIANTS

    rebuilt = []
    for name, variant in list(VARIANTS.items()):
        # a variant built from a direction hook derives its step from the hook: the hook is the
        # factory's closure
        step = variant.step_with_direction or variant.step
        if not step.__closure__ or ".<locals>." not in step.__qualname__:
            continue
        factory_name = step.__qualname__.split(".<locals>.")[0]
        if factory_name.startswith("x_") and "__mutmut_" in factory_name:  # the tool's copy of the original
            factory_name = factory_name[2:].rpartition("__mutmut_")[0]
        factory = getattr(sys.modules[step.__module__], factory_name, None)
        if not callable(factory):
            continue
        parameters = inspect.signature(factory).parameters
        cells = dict(zip(step.__code__.co_freevars, (cell.cell_contents for cell in step.__closure__)))
        if not set(cells) <= set(parameters):
            continue
        arguments = {key: value for key, value in cells.items() if not _is_default(parameters[key].default, value)}
        if variant.step_with_direction is not None:
            VARIANTS[name] = dataclasses.replace(variant, step=None, step_with_direction=factory(**arguments))
        else:
            VARIANTS[name] = dataclasses.replace(variant, step=factory(**arguments))
        rebuilt.append(name)
    return rebuilt


@pytest.fixture
def code_under_test():
    """Before every certificate: the memos (installed once; never in the default session, which
    deselects these tests) and the variants rebuilt with the active code. Function-scoped, so that
    the tool attributes the factory to every certificate, each of which may use a control."""
    install_memos()
    rebuild_variants()


@pytest.mark.mutation
@pytest.mark.parametrize("claim_id", KILL_SUITE_IDS)
def test_certificate_passes(claim_id, code_under_test):
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


def test_rebuilding_the_variants_calls_the_factory_as_the_registry_does(monkeypatch):
    """A control rebuilt from its factory computes what the registered one does; and a changed
    factory reaches the registry (the point of rebuilding), with the registry's arguments."""
    import numpy as np

    import reference_impl
    from reference_impl import controls

    for name in list(reference_impl.VARIANTS):
        monkeypatch.setitem(reference_impl.VARIANTS, name, reference_impl.VARIANTS[name])
    originals = dict(reference_impl.VARIANTS)
    rebuilt = rebuild_variants()
    assert set(rebuilt) == {"elementwise_second_moment", "qr_retraction", "projection_without_sym", "unprojected_decay", "canonical_metric_gradient"}
    rng = np.random.default_rng(0)
    W = reference_impl.random_point(5, 3, rng)
    G = rng.standard_normal(W.shape)
    config = reference_impl.StiefelAdamConfig(lr=0.1)
    for name in rebuilt:
        variant, original = reference_impl.VARIANTS[name], originals[name]
        assert variant.step is not original.step
        W_new, _ = variant.step(W, G, variant.init(W), config)
        W_old, _ = original.step(W, G, original.init(W), config)
        assert np.array_equal(W_new, W_old), name

    calls = []

    def changed_factory(gradient_map, second_moment="scalar", retraction="polar"):
        calls.append((second_moment, retraction))
        return lambda W, G, state, config: (W, state, 0 * W)  # a hook: (W_new, state_new, xi)

    monkeypatch.setattr(controls, "_riemannian_step", changed_factory)
    rebuild_variants()
    assert sorted(calls) == sorted([("elementwise", "polar"), ("scalar", "qr"), ("scalar", "polar"), ("scalar", "polar"), ("scalar", "polar")])
    W_same, _ = reference_impl.VARIANTS["qr_retraction"].step(W, G, None, config)
    assert W_same is W
