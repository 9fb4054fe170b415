"""Bugs written into a copy of a module's source, as a developer would write them: a control that no
subclass can express (a line inside a method, a module-level helper the class calls).

`edited(module_name, old, new, attribute)` compiles the module's own source with the text `old`
replaced by `new` into a fresh module object of the same package and returns its `attribute`. The
real module is never touched: the broken class lives in its own module, whose helpers are its own
copies (the edited one among them), so nothing else in the process meets the bug. `old` must occur
exactly once; a source that has moved on raises SourceEditError, naming the text, and the claim
that runs the control is then inconclusive and says which control could not be planted, while its
checks still judge the code as it is (kit/protocol.run_claim), instead of passing without it."""

from __future__ import annotations

import functools
import importlib
import inspect
import types


class SourceEditError(LookupError):
    """The text a control replaces does not occur exactly once in its module's source."""


@functools.cache
def edited(module_name: str, old: str, new: str, attribute: str):
    """`attribute` of a copy of module `module_name` whose source has `old` replaced by `new` (cached:
    one copy per edit and process)."""
    module = importlib.import_module(module_name)
    source = inspect.getsource(module)
    count = source.count(old)
    if count != 1:
        raise SourceEditError(f"the text a control replaces occurs {count} times in {module_name}, not once: {old!r}")
    copy = types.ModuleType(module_name)
    copy.__package__ = module.__package__
    copy.__file__ = module.__file__
    exec(compile(source.replace(old, new), module.__file__, "exec"), copy.__dict__)
    return getattr(copy, attribute)


__all__ = ["SourceEditError", "edited"]
