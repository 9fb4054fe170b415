"""The certify pytest plugin (entry point pytest11 "certify"): a claim as a test of a user's own code.

    def test_my_optimizer(certify_claim):
        certify_claim("P1", implementation="mypkg.optim:step")

    def test_my_optimizer_is_equivariant(certify_property):
        certify_property("P4-left", implementation="mypkg.optim:step")

    @pytest.mark.certify("P3", torch_optimizer="mypkg.optim:MyAdam")
    def test_my_torch_optimizer():
        pass

Either form holds the implementation to the claim's trajectory checks (propositions/kit/
trajectories.py: the implementation against the model of docs/algorithm.md, step by step, within
the one-step bound at the implementation's own precision, by kit.trajectories.compare_step, the
rule `certify run` applies: a float32 or bfloat16 implementation is held to the analysis of its
dtype, and its cases draw gradients within that dtype's range) on cases that hypothesis draws from
the claim's own settings (certify.ci.strategies.cases), under the hypothesis settings in force: the user's loaded profile
(max_examples, derandomize, database, ...; a CI profile should derandomize). The deadline is
lifted, as a first torch step pays for imports. A failing case is shrunk by hypothesis, then by the
deterministic search of certify.ci.counterexample, and the test fails with the minimal counterexample,
its first diverging step and the first stage of docs/algorithm.md that differs. An implementation
that cannot be used (a module that does not import, a wrong signature) fails the test in one line.
The full certificate stays `certify run ID --implementation ...`.

`certify_property` asks one claim's property of the implementation instead (whether it holds, not
whether the implementation is StiefelAdam's step: propositions/properties.py), at a profile's regimes
with the property's controls, and fails the test with the verdict and its reason (fails, vacuous,
untested) unless the property holds; it returns the sealed property certificate.
"""

from __future__ import annotations

from dataclasses import replace

import pytest

MARKER = "certify(claim, implementation=None, torch_optimizer=None, optimizer=None): hold an implementation to a claim's trajectory checks (certify.ci.pytest_plugin)"


def pytest_configure(config):
    config.addinivalue_line("markers", MARKER)


def _spec(implementation, torch_optimizer, optimizer) -> str:
    given = [s for s in (f"numpy:{implementation}" if implementation else None, f"torch:{torch_optimizer}" if torch_optimizer else None,
                         optimizer) if s]
    if len(given) != 1:
        raise pytest.UsageError("certify_claim: give exactly one of implementation=, torch_optimizer=, optimizer=")
    return given[0]


def _variant(spec: str):
    from certify.outside import adapters

    try:
        return adapters.resolve(spec)
    except adapters.AdapterError as error:
        problem = str(error)
    pytest.fail(f"certify: {problem}", pytrace=False)


class _Failed(AssertionError):
    """Raised inside the hypothesis property: the case and the quantity that failed."""

    def __init__(self, case):
        super().__init__(f"trajectory_model_{case.quantity} fails at {case}")  # hypothesis prints it while it shrinks
        self.case = case


def _property(variant, claim: str):
    from hypothesis import given, settings

    from certify.ci import counterexample, strategies
    from propositions.kit import observability

    white = observability.state_observable(variant)
    quantities = ("W", "m", "v", "bookkeeping") if white else ("W",)

    @settings(settings.default, deadline=None)
    @given(strategies.cases(claim, black_box=not white, max_exponent=counterexample.wide_exponent(variant)))
    def holds(case):
        for quantity in quantities:
            if counterexample.replay(variant, replace(case, quantity=quantity)).fails:
                raise _Failed(replace(case, quantity=quantity))

    # hypothesis keys a derandomized run (and its database) by the test function's digest, which is
    # this one function's for every claim: the claim and the implementation go into it, so that five
    # tests draw five sequences of cases, not one sequence five times
    holds.hypothesis.inner_test._hypothesis_internal_add_digest = f"{claim} {getattr(variant, 'spec', variant.name)}".encode()
    return holds


def run_claim(claim: str, spec: str) -> None:
    """Run the property; on failure, pytest.fail with the minimal counterexample's block."""
    import time

    from certify.ci import counterexample, stages

    claim = claim.upper()
    if claim not in ("P1", "P2", "P3", "P4", "P5"):
        raise pytest.UsageError(f"certify_claim: {claim!r} does not run an optimizer; one of P1, P2, P3, P4, P5")
    variant = _variant(spec)
    started = time.perf_counter()
    try:
        _property(variant, claim)()
        return
    except _Failed as failure:
        failing = failure.case
    case, outcome = counterexample.shrink(variant, failing)
    found = counterexample.record(case, outcome, stages.locate(variant, case, outcome), f"trajectory_model_{case.quantity}",
                                  None, 0, time.perf_counter() - started)
    pytest.fail("\n".join([f"certify: {spec} fails {claim}; minimal counterexample:", *counterexample.block(found)]), pytrace=False)


@pytest.fixture
def certify_claim():
    """certify_claim(claim, implementation="mod:step" | torch_optimizer="mod:Class[:JSON]" | optimizer=SPEC):
    fail the test with the minimal counterexample where the implementation breaks the claim."""

    def certify(claim: str, implementation: str | None = None, torch_optimizer: str | None = None, optimizer: str | None = None) -> None:
        run_claim(claim, _spec(implementation, torch_optimizer, optimizer))

    return certify


def run_property(property_id: str, spec: str, *, profile: str = "quick", seed: int = 0) -> dict:
    """Ask one property (P1, P2, P3, P4-left, P4-right, P4-signed, P5) of the implementation, at the
    profile's regimes, with its controls; pytest.fail with the verdict and its reason unless it holds.
    Returns the sealed property certificate (certify.outside.property_certificate), which a test may
    write with certify.certificate.write and `certify verify` re-runs."""
    from certify.outside import adapters, properties
    from propositions.properties import PROPERTY_IDS, REGIMES

    wanted = next((p for p in PROPERTY_IDS if p.lower() == str(property_id).lower()), None)
    if wanted is None:
        raise pytest.UsageError(f"certify_property: {property_id!r} is not a property; one of {', '.join(PROPERTY_IDS)}")
    if profile not in REGIMES:
        raise pytest.UsageError(f"certify_property: profile {profile!r}; one of {', '.join(REGIMES)}")
    try:
        variant = properties.resolve(spec)
    except adapters.AdapterError as error:
        pytest.fail(f"certify: {error}", pytrace=False)
    records, _, _ = properties.run({spec: variant}, seed=seed, claim_ids=(wanted,), out_dir=None, profile=profile,
                                   command=f"certify_property({wanted!r}, optimizer={spec!r}, profile={profile!r}, seed={seed})",
                                   progress=lambda line: None)
    (found,) = records[spec]["properties"]
    sealed = records[spec]["sealed"][wanted]
    if found["verdict"] != "holds":
        pytest.fail(f"certify: {spec}: property {wanted} {properties.cell(found)} (certificate {sealed['verdict']}, "
                    f"reproduce: {sealed['provenance']['reproduce']})", pytrace=False)
    return sealed


@pytest.fixture
def certify_property():
    """certify_property(property, implementation="mod:step" | torch_optimizer="mod:Class[:JSON]" | optimizer=SPEC,
    profile="quick", seed=0): fail the test unless the implementation has the property (docs/ci.md);
    returns its sealed property certificate."""

    def certify(property_id: str, implementation: str | None = None, torch_optimizer: str | None = None, optimizer: str | None = None,
                profile: str = "quick", seed: int = 0) -> dict:
        return run_property(property_id, _spec(implementation, torch_optimizer, optimizer), profile=profile, seed=seed)

    return certify


@pytest.hookimpl(tryfirst=True)
def pytest_pyfunc_call(pyfuncitem):
    """A test marked certify(...) first holds its implementation to the claim, then runs its body."""
    marker = pyfuncitem.get_closest_marker("certify")
    if marker is not None:
        if not marker.args:
            raise pytest.UsageError("@pytest.mark.certify needs the claim id as its first argument")
        run_claim(marker.args[0], _spec(marker.kwargs.get("implementation"), marker.kwargs.get("torch_optimizer"), marker.kwargs.get("optimizer")))
