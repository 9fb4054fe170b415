"""What the `certify` command prints: results on stdout (a rich display on a terminal, plain lines
otherwise), errors as one line on stderr, and the minimal counterexamples of failing pairs."""

from __future__ import annotations

import sys


class Output:
    """stdout for results (rich on a terminal, plain lines otherwise), stderr for errors."""

    def __init__(self):
        from rich.console import Console

        self.console = Console(file=sys.stdout)
        self.rich = self.console.is_terminal

    def line(self, text: str) -> None:
        if self.rich:
            self.console.print(text, markup=False, highlight=False)
        else:
            print(text, flush=True)

    def table(self, header: list[str], rows: list[list[str]], title: str | None = None) -> None:
        if self.rich:
            from rich.markup import escape
            from rich.table import Table

            table = Table(title=title)
            for column in header:
                table.add_column(column, overflow="fold")
            styles = {"pass": "green", "fail": "bold red", "inconclusive": "yellow"}
            for row in rows:
                table.add_row(*[f"[{styles[c]}]{c}[/]" if c in styles else escape(str(c)) for c in row])
            self.console.print(table)
            return
        widths = [max(len(str(row[i])) for row in [header, *rows]) for i in range(len(header))]
        if title:
            print(title)
        for row in [header, *rows]:
            print("  ".join(str(cell).ljust(width) for cell, width in zip(row, widths)).rstrip(), flush=True)


def error_line(message: str) -> None:
    print(f"certify: error: {message}", file=sys.stderr, flush=True)


def print_counterexamples(out: Output, results: dict) -> None:
    """The minimal counterexample of each failing pair, one block each."""
    from certify.ci.counterexample import block, counterexamples_of

    for spec, row in results.items():
        for claim_id, certificate in row.items():
            for found in counterexamples_of(certificate):
                if found.get("found"):
                    out.line(f"{spec} {claim_id}: minimal counterexample:")
                    for line in block(found):
                        out.line(f"    {line}")


__all__ = ["Output", "error_line", "print_counterexamples"]
