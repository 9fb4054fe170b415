"""Names that do not exist are found before a user runs the line that uses them.

A command documented in docs/adapters.md ended in "internal error: NameError" because a helper was
renamed and one caller kept the old name; no test ran that path. pyflakes reads every module of the
package and reports each name used but never defined (and each name in an __all__ that the module
does not define), wherever the line sits.
"""

from __future__ import annotations

from pathlib import Path

import pytest

pyflakes_api = pytest.importorskip("pyflakes.api")
from pyflakes import messages  # noqa: E402
from pyflakes.reporter import Reporter  # noqa: E402

PROJECT_ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("certify", "propositions", "reference_impl", "torch_impl")
UNDEFINED = (messages.UndefinedName, messages.UndefinedExport, messages.UndefinedLocal)


class _Collect(Reporter):
    def __init__(self):
        self.found = []

    def flake(self, message):
        if isinstance(message, UNDEFINED):
            self.found.append(str(message))

    def unexpectedError(self, filename, message):
        self.found.append(f"{filename}: {message}")

    def syntaxError(self, filename, message, lineno, offset, text):
        self.found.append(f"{filename}:{lineno}: {message}")


def test_no_module_uses_a_name_it_does_not_define():
    reporter = _Collect()
    files = [path for package in PACKAGES for path in sorted((PROJECT_ROOT / package).rglob("*.py"))]
    assert len(files) > 50
    for path in files:
        pyflakes_api.check(path.read_text(encoding="utf-8"), str(path.relative_to(PROJECT_ROOT)), reporter)
    assert not reporter.found, "\n".join(reporter.found)


def test_the_check_sees_an_undefined_name():
    reporter = _Collect()
    pyflakes_api.check("def command(args):\n    return str(_fresh_folder('x'))\n", "example.py", reporter)
    assert reporter.found and "_fresh_folder" in reporter.found[0]
