"""Every public name of reference_impl and torch_impl is in docs/claims.md's table of public functions,
with the claim that certifies it, and that claim's module uses it."""

import re
from pathlib import Path

import pytest

import reference_impl

ROOT = Path(__file__).resolve().parent.parent
CLAIM_MODULES = {"optimizer": ["optimizer_class", "optimizer_scenarios", "_optimizer_controls"], "samplers": ["samplers"],
                 "projection": ["projection"], "crosscheck": ["crosscheck", "kernel_variants", "kernel_drift", "kernel_scale", "kernel_attainment"],
                 "bookkeeping": ["bookkeeping"]}


def _table() -> dict[str, str]:
    """name -> the 'certified by' cell of the row that lists it."""
    text = (ROOT / "docs" / "claims.md").read_text()
    section = text[text.index('<a id="public-functions"></a>'):]
    section = section[: section.index("\n<a id=", 10)] if "\n<a id=" in section[10:] else section
    rows = {}
    for line in section.splitlines():
        if line.startswith("| `"):
            names_cell, claim_cell = line.split("|")[1:3]
            for name in re.findall(r"`([^`]+)`", names_cell):
                rows[name.split(".")[-1].split("(")[0]] = claim_cell
    return rows


def _public_names() -> list[tuple[str, str]]:
    names = [("reference_impl", name) for name in reference_impl.__all__]
    try:
        import torch_impl
    except ImportError:
        return names
    return names + [("torch_impl", name) for name in torch_impl.__all__ if name != "functional"] + [("torch_impl.functional", "transported_moment")]


def test_every_public_name_is_listed_with_its_claim():
    table = _table()
    missing = [f"{package}.{name}" for package, name in _public_names() if name not in table]
    assert not missing, f"not in docs/claims.md#public-functions: {missing}"


def _first_claim(cell: str) -> str | None:
    found = re.search(r"\[[^\]]+\]\(#([\w-]+)\)", cell)
    return found.group(1) if found else None


def test_the_claim_named_first_for_a_torch_function_uses_it():
    """A torch_impl function is called (or named) in the modules of the first claim its row links to."""
    pytest.importorskip("torch")
    import torch_impl

    table = _table()
    unused = []
    for name in [n for n in torch_impl.__all__ if n != "functional"] + ["transported_moment"]:
        claim = _first_claim(table.get(name, ""))
        if claim in CLAIM_MODULES:
            source = "".join((ROOT / "propositions" / f"{module}.py").read_text() for module in CLAIM_MODULES[claim])
            if not re.search(rf"\b{re.escape(name)}\b", source):
                unused.append(f"{name} ({claim})")
    assert not unused, f"listed as certified by a claim whose modules never name it: {unused}"
