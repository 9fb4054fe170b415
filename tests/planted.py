"""Bugs planted into a copy of a module's source, as a developer would write them.

`planted(monkeypatch, "torch_impl.optimizer", old, new, "StiefelAdam")` compiles the module's own
source with the one text `old` replaced by `new` (which must occur exactly once) into a fresh module
of the same package, and patches the named attributes of the real module and of its package with
the broken ones for the test's duration: every caller that looks them up at call time (the claims
do) meets the bug, as if it had been written into the file."""

from __future__ import annotations

import importlib
import inspect
import types


def planted(monkeypatch, module_name: str, old: str, new: str, *names: str):
    module = importlib.import_module(module_name)
    source = inspect.getsource(module)
    if source.count(old) != 1:
        raise AssertionError(f"the text to replace occurs {source.count(old)} times in {module_name}, not once: {old!r}")
    broken = types.ModuleType(module_name)
    broken.__package__ = module.__package__
    broken.__file__ = module.__file__
    exec(compile(source.replace(old, new), module.__file__, "exec"), broken.__dict__)
    package = importlib.import_module(module.__package__) if module.__package__ else None
    for name in names:
        monkeypatch.setattr(module, name, getattr(broken, name))
        if package is not None and hasattr(package, name):
            monkeypatch.setattr(package, name, getattr(broken, name))
    return broken
