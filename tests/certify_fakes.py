"""What the tests of the `certify` command share: a fake registry entry and a main() runner.

FakeClaim has the registry interface that certify uses (id, title, statement, latex,
control_names, run, requires, default_options), with a `run` that returns a hand-made ClaimResult,
so that certify's handling of results that no real recipe produces (lying verdicts, wrong types,
no controls, failing runs) can be tested without running a claim.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from certify import cli


@dataclass(frozen=True)
class FakeClaim:
    id: str
    title: str
    statement: str
    latex: str
    control_names: tuple[str, ...]
    run: Callable
    requires: tuple[str, ...] = ()
    default_options: tuple[tuple[str, str], ...] = ()


def run_main(capsys, *argv):
    """cli.main(argv) -> (exit code, stdout, stderr), checked to print no traceback."""
    code = cli.main(list(argv))
    captured = capsys.readouterr()
    assert "Traceback" not in captured.out + captured.err
    return code, captured.out, captured.err
