"""The layout of the project (docs/architecture.md): floors that import only downward, no cycles,
no claim that imports another, no execution machinery below certify, short functions in certify.

Every import statement of every module is read (ast), those inside functions included: a lazy
import is still a dependency. A failure names the module, the line and the rule it breaks.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("reference_impl", "torch_impl", "propositions", "certify")

# floor of a module: it may import modules of its own floor and below, never above
FLOORS = {"reference_impl": 0, "torch_impl": 1, "propositions.kit": 2, "propositions": 3, "certify": 4}
# where tasks run (processes, clusters) is chosen by certify; nothing below it may reach for it
EXECUTION_MODULES = ("multiprocessing", "concurrent.futures", "distributed", "dask")
MAX_FUNCTION_LINES = 60  # in certify/


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


MODULES = {_module_name(path): path for package in PACKAGES for path in sorted((ROOT / package).rglob("*.py"))}


def _floor(module: str) -> int:
    best = max((prefix for prefix in FLOORS if module == prefix or module.startswith(prefix + ".")), key=len)
    return FLOORS[best]


def _resolve(module: str, node: ast.ImportFrom) -> str:
    if not node.level:
        return node.module or ""
    package = module.split(".") if MODULES[module].name == "__init__.py" else module.split(".")[:-1]
    base = package[: len(package) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


def imports_of(module: str) -> list[tuple[str, int]]:
    """(imported module, line) for every import in the module, the project's modules resolved to
    the most specific module named (`from . import x` is the submodule x where there is one)."""
    tree = ast.parse(MODULES[module].read_text(encoding="utf-8"))
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(alias.name, node.lineno) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            target = _resolve(module, node)
            for alias in node.names:
                child = f"{target}.{alias.name}"
                # a project module by its most specific name; a library by the name it may be a
                # submodule of (`from concurrent import futures` is concurrent.futures)
                found.append((child if child in MODULES or _project(target) is None else target, node.lineno))
        elif isinstance(node, ast.Call) and _is_dynamic_import(node):
            found.append((node.args[0].value, node.lineno))
    return found


def _is_dynamic_import(node: ast.Call) -> bool:
    """importlib.import_module("name") or __import__("name") with the name written out."""
    function = node.func
    named = (isinstance(function, ast.Attribute) and function.attr == "import_module") or (
        isinstance(function, ast.Name) and function.id in ("import_module", "__import__"))
    return named and bool(node.args) and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str)


def _project(name: str) -> str | None:
    """The project module an import names (the longest known prefix), or None for a library."""
    parts = name.split(".")
    for end in range(len(parts), 0, -1):
        candidate = ".".join(parts[:end])
        if candidate in MODULES:
            return candidate
    return None


def _defines_claim(path: Path) -> bool:
    for node in ast.parse(path.read_text(encoding="utf-8")).body:
        targets = node.targets if isinstance(node, ast.Assign) else [node.target] if isinstance(node, ast.AnnAssign) else []
        if any(isinstance(target, ast.Name) and target.id == "CLAIM" for target in targets):
            return True
    return False


def _is_claim(module: str) -> bool:
    """A claim module: a public module of the propositions package that defines CLAIM (a module
    without one is a helper of the claims' floor, as propositions/__init__.py discovers them)."""
    parts = module.split(".")
    return (len(parts) == 2 and parts[0] == "propositions" and not parts[1].startswith("_") and parts[1] != "kit"
            and _defines_claim(MODULES[module]))


def _graph() -> dict[str, set[str]]:
    graph = {module: set() for module in MODULES}
    for module in MODULES:
        for name, _ in imports_of(module):
            target = _project(name)
            if target is not None and target != module:
                graph[module].add(target)
    return graph


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    index, low, stack, on_stack, components = {}, {}, [], set(), []
    counter = [0]

    def visit(node):
        index[node] = low[node] = counter[0]
        counter[0] += 1
        stack.append(node)
        on_stack.add(node)
        for nxt in sorted(graph[node]):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                components.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return components


def test_every_import_goes_down_a_floor_or_stays_on_its_own():
    upward = []
    for module in MODULES:
        for name, line in imports_of(module):
            target = _project(name)
            if target is not None and _floor(target) > _floor(module):
                upward.append(f"{MODULES[module].relative_to(ROOT)}:{line}: {module} (floor {_floor(module)}) imports {target} (floor {_floor(target)})")
    assert not upward, "\n".join(upward)


def test_no_claim_imports_another():
    crossing = [f"{module} imports {target}" for module, targets in _graph().items() if _is_claim(module)
                for target in sorted(targets) if _is_claim(target)]
    assert not crossing, "\n".join(crossing)


def test_no_import_cycle():
    cycles = _cycles(_graph())
    assert not cycles, "import cycles: " + "; ".join(" -> ".join(cycle) for cycle in cycles)


def test_execution_machinery_lives_in_certify_only():
    below = [f"{MODULES[module].relative_to(ROOT)}:{line}: {module} imports {name}" for module in MODULES if _floor(module) < FLOORS["certify"]
             for name, line in imports_of(module) if name.split(".")[0] in {m.split(".")[0] for m in EXECUTION_MODULES}
             and any(name == m or name.startswith(m + ".") for m in EXECUTION_MODULES)]
    assert not below, "\n".join(below)


def test_functions_in_certify_are_short():
    long = []
    for module, path in MODULES.items():
        if _floor(module) != FLOORS["certify"]:
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                lines = node.end_lineno - node.lineno + 1
                if lines > MAX_FUNCTION_LINES:
                    long.append(f"{path.relative_to(ROOT)}:{node.lineno}: {node.name} has {lines} lines")
    assert not long, "\n".join(long)


# the rules themselves, on small cases: a check that cannot fail guards nothing


def test_the_cycle_finder_finds_a_cycle_and_only_a_cycle():
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert _cycles({"a": {"b"}, "b": set(), "c": {"a", "b"}}) == []


@pytest.mark.parametrize("module, floor", [("reference_impl.adam", 0), ("torch_impl.functional", 1), ("propositions.kit.bounds", 2),
                                           ("propositions.p3_conditioning", 3), ("propositions", 3), ("certify.cli", 4)])
def test_the_floors(module, floor):
    assert _floor(module) == floor


def test_relative_imports_resolve_to_the_submodule():
    names = {name for name, _ in imports_of("propositions.kit.trajectories")}
    assert {"propositions.kit.observability", "propositions.kit.precision", "propositions.kit.common"} <= names
    assert _is_claim("propositions.p1_steepest_descent") and not _is_claim("propositions._common") and not _is_claim("propositions.kit")
    assert not _is_claim("propositions.attention")  # P6's model of attention: a helper, no CLAIM


def test_every_import_form_is_seen(tmp_path, monkeypatch):
    planted = tmp_path / "planted.py"
    planted.write_text("from concurrent import futures\nimport importlib\nimportlib.import_module('certify.claims')\n"
                       "__import__('distributed')\ndef f():\n    from certify import execution\n", encoding="utf-8")
    monkeypatch.setitem(MODULES, "propositions.kit.planted", planted)
    names = {name for name, _ in imports_of("propositions.kit.planted")}
    assert {"concurrent.futures", "certify.claims", "distributed", "certify.execution"} <= names
