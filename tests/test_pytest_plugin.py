"""The pytest plugin (certify.ci.pytest_plugin, entry point pytest11 in pyproject.toml), run through
pytester: a failing implementation fails the test with its minimal counterexample, a correct one
passes, an unusable one fails in one line, and hypothesis' settings come from the user's profile."""

from __future__ import annotations

import os
import tomllib
from pathlib import Path

import pytest

pytest_plugins = ["pytester"]

ROOT = Path(__file__).resolve().parents[1]


def _plugin_arguments(request) -> list[str]:
    """-p certify.ci.pytest_plugin unless the installed entry point loaded it already."""
    return [] if request.config.pluginmanager.has_plugin("certify") else ["-p", "certify.ci.pytest_plugin"]


def in_subprocess(pytester, monkeypatch, request, *arguments):
    """A pytest run in its own interpreter. Runs that drive torch go there: an in-process run's
    imports are undone afterwards (pytester restores sys.modules), and torch's native extensions
    cannot be imported twice into one process."""
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(ROOT), str(ROOT / "tests"), os.environ.get("PYTHONPATH", "")]))
    return pytester.runpytest_subprocess(*_plugin_arguments(request), "-p", "no:cacheprovider", *arguments)


def test_the_plugin_is_declared_as_a_pytest11_entry_point():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert project["entry-points"]["pytest11"] == {"certify": "certify.ci.pytest_plugin"}


def test_fixture_fails_with_the_minimal_counterexample_and_passes_the_fixed_code(pytester, request):
    pytester.makepyfile(test_user="""
        def test_broken(certify_claim):
            certify_claim("P1", implementation="broken_impls:bias_from_step_2")

        def test_fixed(certify_claim):
            certify_claim("p1", implementation="broken_impls:fixed_step")
    """)
    result = pytester.runpytest_inprocess(*_plugin_arguments(request), "-p", "no:cacheprovider")
    result.assert_outcomes(passed=1, failed=1)
    result.stdout.fnmatch_lines([
        "*numpy:broken_impls:bias_from_step_2 fails P1; minimal counterexample:*",
        "*P1 trajectory_model_W fails at d=2, r=1, a bare frame, 2 steps*first diverging step 2*bias correction (stage 5)*",
    ])


def test_marker_runs_the_claim_before_the_body(pytester, request, monkeypatch):
    pytest.importorskip("torch")
    pytester.makepyfile(test_marked="""
        import pytest

        @pytest.mark.certify("P1", torch_optimizer="broken_torch:SumSquaresAdam")
        def test_torch_optimizer():
            pass

        @pytest.mark.certify("P1", torch_optimizer="broken_torch:FixedAdam")
        def test_fixed():
            pass
    """)
    result = in_subprocess(pytester, monkeypatch, request)
    result.assert_outcomes(passed=1, failed=1)
    result.stdout.fnmatch_lines(["*first stage that differs: moments (stages 3-4)*"])


def test_an_implementation_that_does_not_import_fails_in_one_line(pytester, request):
    pytester.makepyfile(test_missing="""
        def test_missing(certify_claim):
            certify_claim("P2", implementation="no_such_module_here:step")
    """)
    result = pytester.runpytest_inprocess(*_plugin_arguments(request), "-p", "no:cacheprovider")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["certify: numpy:no_such_module_here:step: module 'no_such_module_here' does not import*"])
    assert "During handling" not in result.stdout.str()


def test_hypothesis_settings_come_from_the_users_profile(pytester, request):
    """A profile of one example runs the property once: the plugin takes the loaded profile."""
    pytester.makeconftest("""
        from hypothesis import settings
        settings.register_profile("tiny", max_examples=1, derandomize=True, database=None)
        settings.load_profile("tiny")
    """)
    pytester.makepyfile(counting="""
        import reference_impl as ri
        CALLS = []

        def step(W, G, state, config):
            CALLS.append(W.shape)
            return ri.step(W, G, state, config)
    """, test_count="""
        import counting

        def test_count(certify_claim):
            certify_claim("P1", implementation="counting:step")
            cases = [shape for shape in counting.CALLS if shape != (5, 2) and shape != (2, 5, 2)]
            # one example: at most 4 checks (W, m, v, t) of at most 8 steps; the default 100 would be hundreds
            assert 1 <= len(cases) <= 32, counting.CALLS
    """)
    result = pytester.runpytest_inprocess(*_plugin_arguments(request), "-p", "no:cacheprovider")
    result.assert_outcomes(passed=1)


def test_a_claim_without_an_optimizer_is_refused(pytester, request):
    pytester.makepyfile(test_p6="""
        def test_p6(certify_claim):
            certify_claim("P6", implementation="broken_impls:fixed_step")
    """)
    result = pytester.runpytest_inprocess(*_plugin_arguments(request), "-p", "no:cacheprovider")
    assert result.ret != 0
    result.stdout.fnmatch_lines(["*P6*does not run an optimizer*"])
