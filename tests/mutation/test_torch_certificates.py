"""The kill suite of `certify mutate --target torch_impl`: the certificates that drive torch_impl.

A mutant of torch_impl (the PyTorch optimizer) counts as killed when it makes the cross-check, the
optimizer-class claim or the bookkeeping claim fail, turn inconclusive or raise. The claims run at
the same small profile as the kill suite of reference_impl (tests/mutation/test_certificates.py).

The mutation tool forks every mutant from a process that has run this suite once. torch's intra-op
thread pool does not survive a fork, so torch runs on one thread here (set before the first torch
operation: the pool is never started). torch_impl keeps the results of a few pure scalar helpers
(`torch_impl.functional.memoized`); a mutant of such a helper would hide behind the values the
clean run cached, so every memo of torch_impl is emptied before each certificate.

The tests carry the `mutation` marker, which the default pytest run deselects (pyproject addopts);
run them alone with `pytest -m mutation tests/mutation/test_torch_certificates.py`. They are skipped
without torch.

This module imports only `propositions` and torch_impl: the mutation tool copies those into its
own tree, and nothing here may reach a copy of the code that is not mutated.
"""

from __future__ import annotations

import dataclasses
import os
import sys
import types
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
torch.set_num_threads(1)

import propositions  # noqa: E402
from propositions._common import PROFILES  # noqa: E402

SEED = 0

# The profile of tests/mutation/test_certificates.py (the quick profile cut down).
MUTATION_PROFILE = dataclasses.replace(PROFILES["quick"], name="mutation", frames=60, steps=3, long_run_steps=50, mp_dps=30, mp_samples=1)

# The claims that drive torch_impl (`certify list`: the ones that need torch).
KILL_SUITE_IDS = ("crosscheck", "optimizer", "bookkeeping")


def torch_impl_memos() -> list[dict]:
    """The caches of every memoized function of torch_impl's modules (the `cache` cell of the
    closure that `torch_impl.functional.memoized` makes)."""
    caches = []
    for name, module in list(sys.modules.items()):
        if not (name == "torch_impl" or name.startswith("torch_impl.")) or module is None:
            continue
        for value in list(vars(module).values()):
            code = getattr(value, "__code__", None)
            if code is None or not value.__closure__ or "cache" not in code.co_freevars:
                continue
            cell = value.__closure__[code.co_freevars.index("cache")].cell_contents
            if isinstance(cell, dict) and all(cache is not cell for cache in caches):
                caches.append(cell)
    return caches


# The folder above the unmutated torch_impl, set by `certify mutate --target torch_impl` (the
# scratch copy); unset, the modules' own source is the unmutated one.
ORIGINAL = "CERTIFY_MUTATION_ORIGINAL"


class _OriginalSource:
    """`inspect` as propositions.kit.source_edits sees it, but for a torch_impl module it returns the
    unmutated source: the optimizer claim's controls write a bug into a copy of torch_impl.optimizer's
    source (`edited`), and mutmut's copy of a module holds every mutant of a function beside the
    original, so the text to replace no longer occurs once. A control stays the broken variant of
    the unmutated optimizer; the mutant is what the certificates' real subject runs."""

    def __init__(self, inspect_module, folder: str):
        self._inspect, self._folder = inspect_module, folder

    def __getattr__(self, name):
        return getattr(self._inspect, name)

    def getsource(self, thing):
        name = getattr(thing, "__name__", "")
        if isinstance(thing, types.ModuleType) and (name == "torch_impl" or name.startswith("torch_impl.")):
            path = Path(self._folder, *name.split("."))
            path = path / "__init__.py" if path.is_dir() else path.with_suffix(".py")
            return path.read_text(encoding="utf-8")
        return self._inspect.getsource(thing)


def use_original_sources() -> bool:
    """Point source_edits at the unmutated torch_impl when the mutation run says where it is."""
    from propositions.kit import source_edits

    folder = os.environ.get(ORIGINAL)
    if not folder or isinstance(source_edits.inspect, _OriginalSource):
        return bool(folder)
    source_edits.inspect = _OriginalSource(source_edits.inspect, folder)
    return True


_SET_NUM_THREADS = torch.set_num_threads


def _one_thread(count: int) -> None:
    """torch.set_num_threads as the kill suite allows it: one thread, whatever is asked."""
    _SET_NUM_THREADS(1)


def pin_one_thread() -> None:
    """torch on one thread for the rest of the process. The mutation tool forks every mutant from
    a process that has run this suite, and a torch thread team started in a fork waits forever on
    a lock of the parent's threads: the cross-check's thread-sensitivity part (a measurement that
    only writes a note: how the residuals change with two torch threads) would hang every mutant
    that reaches it. Here it measures one thread against one thread."""
    torch.set_num_threads = _one_thread
    _SET_NUM_THREADS(1)


@pytest.fixture
def code_under_test():
    """Before every certificate: torch on one thread, torch_impl's memos emptied, so the active code
    computes afresh; the controls' source edits made on the unmutated source."""
    pin_one_thread()
    use_original_sources()
    for cache in torch_impl_memos():
        cache.clear()


@pytest.mark.mutation
@pytest.mark.parametrize("claim_id", KILL_SUITE_IDS)
def test_torch_certificate_passes(claim_id, code_under_test):
    result = propositions.get_claim(claim_id).run(SEED, MUTATION_PROFILE)
    assert result.verdict == "pass", f"{claim_id}: {result.verdict}: " + "; ".join(result.failures() + result.inconclusive)


def test_the_memos_of_torch_impl_are_found_and_emptied():
    from torch_impl import functional

    functional.newton_schulz_iterations(0.5, torch.float64)
    caches = torch_impl_memos()
    assert any(caches) and len(caches) >= 5
    for cache in caches:
        cache.clear()
    assert not any(torch_impl_memos())


def test_the_controls_edit_the_unmutated_source_when_the_run_names_it(tmp_path, monkeypatch):
    from propositions.kit import source_edits

    import torch_impl.optimizer

    (tmp_path / "torch_impl").mkdir()
    (tmp_path / "torch_impl" / "optimizer.py").write_text("# the unmutated source\n", encoding="utf-8")
    monkeypatch.setattr(source_edits, "inspect", source_edits.inspect)
    monkeypatch.delenv(ORIGINAL, raising=False)
    assert not use_original_sources() and not isinstance(source_edits.inspect, _OriginalSource)
    monkeypatch.setenv(ORIGINAL, str(tmp_path))
    assert use_original_sources() and use_original_sources()  # once installed, it stays
    assert source_edits.inspect.getsource(torch_impl.optimizer) == "# the unmutated source\n"
    assert "def edited" in source_edits.inspect.getsource(source_edits)  # any other module: its own source
