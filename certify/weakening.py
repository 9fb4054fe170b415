"""Mutation target "certifier": sampled weakenings of propositions/ that some certificate must notice.

`certify mutate` (certify/mutation.py) asks whether the certificates see a change in what the
reference step computes. This module asks the converse question of the certifier itself: can what
the certificates check be narrowed without any certificate noticing? Each mutant is one weakening of
propositions/ (the claim modules and propositions/kit/), applied to a fresh copy of the committed
tree (`git archive HEAD`, so that nobody's uncommitted edits leak in); `certify all` runs on that
copy, and the mutant is *killed* when the command exits nonzero and at least one certificate's
verdict is not pass (the certificates and the first failing check of each are recorded).

The weakenings (operators), each found by parsing the source with `ast`, so that new code is
covered without a list of lines to keep up to date:

* range shortened: a module-level numeric constant, tuple of numbers or linspace/logspace whose
  name says it sets a range or an amount of drawn conditions (RANGE_NAMES: *_LOG10, *DECADES*,
  *STEPS*, *FRAMES*, *GRID*, ...), a numeric keyword of that kind in a module-level call (the
  profile being run: `frames=`, `steps=`, ...) and a function's numeric default of that kind: an
  interval (lo, hi) is shrunk four times towards its point nearest 0, a set of values keeps its
  first half, a count or a scalar is halved;
* bound loosened: a module-level tolerance, factor or bound (BOUND_NAMES) multiplied by 10, or
  divided by 10 where a smaller value is the weaker one (DIVIDE_NAMES: the detection factor a
  control must exceed, a significance level, the attainment and tightness thresholds); and the
  value returned by a function named *bound*, *tolerance* or *allowance* multiplied by 10 (the first
  member of a returned tuple, every value of a returned dict, every numeric argument of a returned
  record);
* shape dropped: one element removed from a tuple of int tuples (shapes) in a module-level value;
* dtype dropped: one element removed from a tuple of dtype names in a module-level value;
* draws dependent: the SeedSequence of `rng_for` without its spawn key (every generator the same),
  and each `rng_for(seed, ...)` call site without the parts of its key that vary per shape, chunk
  or frame (`*key` keeps its claim and label: every chunk of a label draws the same numbers);
  `SeedSequence(...).spawn(k)` would give k copies of one child;
* self comparison: in a function of propositions/kit/ that compares an actual array with an expected
  one (COMPARISON_NAMES: compare*, *apart, *distance*, *residual*), a difference `a - b` becomes
  `a - a`: the run compared with itself.

Sites inside functions are mutated only on lines that the unmutated run executes (coverage.py over
one `certify all`; a line no certificate runs cannot be seen by one), module-level sites only in
modules it imports; the others are listed as not reached. Each mutant's stable key is
"FILE | OPERATOR | OLD STATEMENT -> NEW STATEMENT" (the statement on one line, blanks collapsed;
" #2" for a repeated identical change), so reasons survive edits elsewhere in the file.

A mutant is *invalid* when the edit does not compile, the command leaves no certificate, or every
certificate that does not pass says only that its claim module could not be loaded. A run past the
per-mutant limit (TIMEOUT_FACTOR times the unmutated run) is a *timeout*. Survivors are classified
in certify/weakening_classes.json by key ("FILE | OPERATOR | *" covers an operator in a file):
equivalent (the weakening does not narrow what is checked), out of scope, or gap (a real
narrowing that no certificate notices; the reason says what would catch it).
"""

from __future__ import annotations

import argparse
import ast
import bisect
import json
import math
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Callable

TARGET = "certifier"
REPORT_KIND = "mutation-report"
REPORT_JSON = "mutation-certifier.json"
CLASSES_FILE = Path(__file__).with_name("weakening_classes.json")
SCOPE = "propositions"
USERS = (SCOPE, "certify")  # where the constants of propositions/ are read (and what coverage measures)
PROFILE = "quick"
TIMEOUT_FACTOR = 5.0
MIN_TIMEOUT_S = 120.0
CLASSES = ("equivalent", "out of scope", "gap")

RANGE = "range shortened"
BOUND = "bound loosened"
SHAPE = "shape dropped"
DTYPE = "dtype dropped"
DRAWS = "draws dependent"
SELF = "self comparison"
OPERATORS = {
    RANGE: "a range or amount of drawn conditions cut: an interval shrunk 4x towards its point nearest 0, a set of values halved "
           "(first half kept), a count or scalar halved",
    BOUND: "a tolerance, factor or bound constant x10 (/10 where smaller is weaker: detection factor, alpha, thresholds), "
           "or the value returned by a *bound*/*tolerance*/*allowance* function x10",
    SHAPE: "one shape removed from a tuple of shapes",
    DTYPE: "one dtype removed from a tuple of dtype names",
    DRAWS: "generators made dependent: rng_for's SeedSequence without its spawn key, or an rng_for call site without the "
           "key parts that vary per shape, chunk or frame",
    SELF: "a comparison helper of propositions/kit computes a - a for a - b: the run compared with itself",
}

RANGE_NAMES = re.compile(r"LOG10|LOG2|RANGE|DECADE|SCALES|EXPONENT|FRAMES|STEPS|GRID|DELTAS|CHECKPOINTS|COUNTS|DRAWS|"
                         r"SAMPLES|TRIALS|REPEATS|DECAYS|RADII|SIZES")
INTERVAL_NAMES = re.compile(r"LOG10|LOG2|RANGE")
BOUND_NAMES = re.compile(r"FACTOR|TOL|BOUND|DETECTION|SAFETY|ALLOWANCE|ALPHA|MARGIN|THRESHOLD|ATTAINED")
DIVIDE_NAMES = re.compile(r"DETECTION|ALPHA|ATTAINED|THRESHOLD")
BOUND_FUNCTIONS = re.compile(r"bound|toleran|allowance")
COMPARISON_NAMES = re.compile(r"compar|apart|distance|residual|agree|mismatch|discrepan")
DTYPE_WORDS = {"float64", "float32", "bfloat16", "float16", "half", "double"}
SPACE_CALLS = {"linspace", "logspace"}
LOAD_FAILURE = "could not be loaded"


class WeakeningError(Exception):
    """A weakening run that could not be carried out; the message is one line for people."""


# --------------------------------------------------------------------------------------------
# Sites
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Site:
    """One mutant: `edits` (start byte, end byte, new text) applied to `file` (posix, relative)."""

    file: str
    operator: str
    line: int  # first line of the statement: it must have run for the site to be reachable (not in the key)
    module_level: bool
    edits: tuple
    old: str
    new: str
    key: str = ""
    name: str | None = None  # the module-level name assigned, whose readers make the site reachable
    uses: tuple = ()  # (file, line) of the statements that read it; a site with a name and none is never read

    @property
    def diff(self) -> str:
        return f"{self.old} -> {self.new}"


class _Source:
    """A file's text as bytes, with ast positions (UTF-8 byte columns) turned into offsets."""

    def __init__(self, rel: str, data: bytes):
        self.rel, self.data = rel, data
        self.starts = [0]
        for index, byte in enumerate(data):
            if byte == 10:
                self.starts.append(index + 1)
        self.tree = ast.parse(data)
        self.parents = {child: node for node in ast.walk(self.tree) for child in ast.iter_child_nodes(node)}

    def span(self, node) -> tuple[int, int]:
        return self.starts[node.lineno - 1] + node.col_offset, self.starts[node.end_lineno - 1] + node.end_col_offset

    def text(self, node) -> str:
        start, end = self.span(node)
        return self.data[start:end].decode("utf-8")

    def statement(self, node):
        while not isinstance(node, ast.stmt):
            node = self.parents[node]
        return node

    def statement_span(self, statement) -> tuple[int, int]:
        """The span of a simple statement; of a compound one (def, for, if, with), its header alone."""
        start, end = self.span(statement)
        body = getattr(statement, "body", None)
        if isinstance(body, list) and body and body[0].lineno > statement.lineno:
            end = self.starts[body[0].lineno - 1]
        return start, end

    def site(self, operator: str, node, edits: list, module_level: bool) -> Site:
        """The Site of `edits` [(node, new text)] inside the statement around `node` (its header for a
        compound statement)."""
        statement = self.statement(node)
        start, end = self.statement_span(statement)
        spans = sorted((self.span(target) + (text,) for target, text in edits), key=lambda e: e[0])
        # the text of the key: the lines the edits touch; a statement's first line before them, if they do not include it
        first = max(start, self.starts[bisect.bisect_right(self.starts, spans[0][0]) - 1])
        following = bisect.bisect_right(self.starts, max(b for _, b, _ in spans))
        last = min(end, self.starts[following] if following < len(self.starts) else len(self.data))
        head = b""
        if first > start:
            head = self.data[start:self.starts[bisect.bisect_right(self.starts, start)]].rstrip() + b" ... "
        before = self.data[first:last]
        after = apply_edits(before, [(a - first, b - first, text) for a, b, text in spans])
        return Site(self.rel, operator, statement.lineno, module_level, tuple(spans), _one_line(head + before), _one_line(head + after))


def _one_line(data: bytes) -> str:
    return " ".join(data.decode("utf-8").split())


def apply_edits(data: bytes, edits) -> bytes:
    """data with each (start, end, text) replaced, the edits sorted and disjoint."""
    out, position = [], 0
    for start, end, text in sorted(edits, key=lambda e: e[0]):
        out += [data[position:start], text.encode("utf-8")]
        position = end
    return b"".join(out + [data[position:]])


def mutated_source(root: Path, site: Site) -> bytes:
    return apply_edits((root / site.file).read_bytes(), site.edits)


# --------------------------------------------------------------------------------------------
# Numbers and literals
# --------------------------------------------------------------------------------------------


def number(node):
    """The value of a numeric literal expression (constants, unary minus, + - * / **), else None."""
    if isinstance(node, ast.Constant) and isinstance(node.value, (int, float)) and not isinstance(node.value, bool):
        return node.value
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
        value = number(node.operand)
        return None if value is None else (-value if isinstance(node.op, ast.USub) else value)
    if isinstance(node, ast.BinOp):
        left, right = number(node.left), number(node.right)
        operations = {ast.Add: lambda a, b: a + b, ast.Sub: lambda a, b: a - b, ast.Mult: lambda a, b: a * b,
                      ast.Div: lambda a, b: a / b, ast.Pow: lambda a, b: a**b}
        if left is not None and right is not None and type(node.op) in operations:
            try:
                return operations[type(node.op)](left, right)
            except (ArithmeticError, ValueError):
                return None
    return None


def literal(value) -> str:
    if isinstance(value, int):
        return str(value)
    return repr(float(value))


def tuple_text(values) -> str:
    items = [literal(v) if isinstance(v, (int, float)) else v for v in values]
    return "(" + ", ".join(items) + ("," if len(items) == 1 else "") + ")"


def halved(value):
    """Half a count (an int >= 2) or a scalar; None where nothing is left to halve."""
    if isinstance(value, int):
        return value // 2 if value >= 2 else None
    return value / 2.0 if value else None


def shrunk(lo, hi):
    """(lo, hi) cut to a quarter of its length towards its point nearest 0 (ints stay ints)."""
    anchor = min(max(0, lo), hi)
    new = [anchor + (x - anchor) / 4.0 for x in (lo, hi)]
    if isinstance(lo, int) and isinstance(hi, int):
        new = [int(round(x)) for x in new]
    return None if new == [lo, hi] else new


def _int_tuple(node) -> bool:
    return isinstance(node, ast.Tuple) and all(isinstance(e, ast.Constant) and type(e.value) is int for e in node.elts)


def _dtype_item(node) -> bool:
    if isinstance(node, ast.Constant):
        return node.value in DTYPE_WORDS
    return isinstance(node, ast.Tuple) and bool(node.elts) and all(_dtype_item(e) for e in node.elts)


def _without(source: _Source, node, index: int) -> str:
    items = [source.text(e) for k, e in enumerate(node.elts) if k != index]
    if isinstance(node, ast.List):
        return "[" + ", ".join(items) + "]"
    return "(" + ", ".join(items) + ("," if len(items) == 1 else "") + ")"


# --------------------------------------------------------------------------------------------
# Module-level operators: range shortened, bound loosened, shape dropped, dtype dropped
# --------------------------------------------------------------------------------------------


def _module_assignments(source: _Source):
    """(name, value node) of every module-level assignment to one name."""
    for node in source.tree.body:
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            yield node.targets[0].id, node.value
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and node.value is not None:
            yield node.target.id, node.value


def _range_edit(source: _Source, name: str, value):
    """(node, new text) shortening the range `value` of the setting `name`, or None."""
    upper = name.upper()
    if not RANGE_NAMES.search(upper):
        return None
    scalar = number(value)
    if scalar is not None:
        new = halved(scalar)
        return None if new is None else (value, literal(new))
    if isinstance(value, (ast.Tuple, ast.List)) and value.elts and not ("SHAPE" in upper and _int_tuple(value)):
        values = [number(e) for e in value.elts]
        if any(v is None for v in values):
            return None
        if len(values) == 2 and INTERVAL_NAMES.search(upper):
            new = shrunk(*values)
            return None if new is None else (value, tuple_text(new))
        if len(values) >= 2:
            return value, tuple_text(values[: math.ceil(len(values) / 2)])
    return None


def _space_edits(source: _Source, name: str, value) -> list:
    """linspace/logspace(lo, hi, n) inside a range setting: (lo, hi) shrunk 4x."""
    if not RANGE_NAMES.search(name.upper()):
        return []
    edits = []
    for node in ast.walk(value):
        if isinstance(node, ast.Call) and getattr(node.func, "attr", getattr(node.func, "id", None)) in SPACE_CALLS and len(node.args) >= 2:
            lo, hi = number(node.args[0]), number(node.args[1])
            new = None if lo is None or hi is None else shrunk(lo, hi)
            if new is not None:
                edits.append([(node.args[0], literal(new[0])), (node.args[1], literal(new[1]))])
    return edits


def _bound_edit(name: str, value):
    upper = name.upper()
    scalar = number(value)
    if not BOUND_NAMES.search(upper) or scalar is None or not scalar:
        return None
    new = scalar / 10 if DIVIDE_NAMES.search(upper) else scalar * 10
    if isinstance(scalar, int) and not DIVIDE_NAMES.search(upper):
        new = int(new)
    return value, literal(new)


def _other_profile(node, profile: str) -> bool:
    """A profile's own settings other than the one being run: `Profile("default", ...)` or a dict
    entry keyed "default"; the run never reads them."""
    from_call = isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant)
    name = node.args[0].value if from_call else None
    return isinstance(name, str) and name in _PROFILE_NAMES and name != profile


_PROFILE_NAMES = ("quick", "default", "thorough")


def _walk_value(value, profile: str):
    """ast.walk of a module-level value, leaving out other profiles' settings."""
    stack = [value]
    while stack:
        node = stack.pop()
        if _other_profile(node, profile):
            continue
        if isinstance(node, ast.Dict):
            children = [v for k, v in zip(node.keys, node.values)
                        if not (isinstance(k, ast.Constant) and k.value in _PROFILE_NAMES and k.value != profile)]
            stack.extend(reversed(children))
        else:
            stack.extend(reversed(list(ast.iter_child_nodes(node))))
        yield node


def _module_sites(source: _Source, profile: str) -> list[Site]:
    sites = []
    for name, value in _module_assignments(source):
        found = [source.site(RANGE, value, [edit], True) for edit in filter(None, [_range_edit(source, name, value)])]
        found += [source.site(RANGE, value, edits, True) for edits in _space_edits(source, name, value)]
        found += [source.site(BOUND, value, [edit], True) for edit in filter(None, [_bound_edit(name, value)])]
        found += _nested_sites(source, value, profile)
        sites += [replace(site, name=name) for site in found]
    return sites


def _nested_sites(source: _Source, value, profile: str) -> list[Site]:
    """Shape and dtype drops anywhere in a module-level value, and the range keywords of its calls."""
    sites = []
    for node in _walk_value(value, profile):
        if isinstance(node, (ast.Tuple, ast.List)) and len(node.elts) >= 2:
            if all(_int_tuple(e) for e in node.elts):
                sites += [source.site(SHAPE, node, [(node, _without(source, node, k))], True) for k in range(len(node.elts))]
            elif all(_dtype_item(e) for e in node.elts):
                sites += [source.site(DTYPE, node, [(node, _without(source, node, k))], True) for k in range(len(node.elts))]
        if isinstance(node, ast.Call):
            for keyword in node.keywords:
                edit = _range_edit(source, keyword.arg, keyword.value) if keyword.arg else None
                if edit is not None and number(keyword.value) is not None:
                    sites.append(source.site(RANGE, keyword.value, [edit], True))
    return sites


# --------------------------------------------------------------------------------------------
# Function-level operators
# --------------------------------------------------------------------------------------------


def _functions(source: _Source):
    return [node for node in ast.walk(source.tree) if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))]


def _default_sites(source: _Source) -> list[Site]:
    """Numeric defaults of parameters named like a range or a bound (`decades: int = 30`)."""
    sites = []
    for function in _functions(source):
        arguments = function.args
        positional = arguments.posonlyargs + arguments.args
        pairs = list(zip(positional[len(positional) - len(arguments.defaults):], arguments.defaults))
        pairs += [(a, d) for a, d in zip(arguments.kwonlyargs, arguments.kw_defaults) if d is not None]
        for argument, default in pairs:
            if number(default) is None:
                continue
            body = ((source.rel, _first_statement(function).lineno),)  # a default matters where the function runs
            edit = _range_edit(source, argument.arg, default)
            if edit is not None:
                sites.append(replace(source.site(RANGE, default, [edit], False), uses=body))
            edit = _bound_edit(argument.arg, default)
            if edit is not None:
                sites.append(replace(source.site(BOUND, default, [edit], False), uses=body))
    return sites


def _first_statement(function):
    """The first statement of a function's body after its docstring (what coverage counts as run)."""
    body = function.body
    docstring = isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant) and isinstance(body[0].value.value, str)
    return body[1] if docstring and len(body) > 1 else body[0]


def _own_returns(function):
    """The return statements of `function` itself (not of functions nested in it)."""
    stack, found = list(function.body), []
    while stack:
        node = stack.pop()
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.ClassDef)):
            continue
        if isinstance(node, ast.Return) and node.value is not None:
            found.append(node)
        stack.extend(ast.iter_child_nodes(node))
    return sorted(found, key=lambda n: (n.lineno, n.col_offset))


def _assigned_dicts(function) -> set[str]:
    return {target.id for node in ast.walk(function) if isinstance(node, ast.Assign) and isinstance(node.value, ast.Dict)
            for target in node.targets if isinstance(target, ast.Name)}


def _times_ten(source: _Source, node) -> str:
    return f"10.0 * ({source.text(node)})"


def _return_edits(source: _Source, value, dicts: set[str]) -> list:
    """[(node, new text)] multiplying a returned bound by 10; [] where the value is not a number."""
    if isinstance(value, ast.Tuple) and value.elts:
        return _return_edits(source, value.elts[0], dicts)
    if isinstance(value, ast.Dict):
        return [(v, _times_ten(source, v)) for k, v in zip(value.keys, value.values)
                if not (isinstance(k, ast.Constant) and "posed" in str(k.value))]
    if isinstance(value, ast.Name):
        if value.id in dicts:
            return [(value, f"{{key: 10.0 * item for key, item in {value.id}.items()}}")]
        return [(value, _times_ten(source, value))]
    if isinstance(value, ast.Call):
        callee = value.func.attr if isinstance(value.func, ast.Attribute) else getattr(value.func, "id", "")
        if not callee[:1].isupper():
            return [(value, _times_ten(source, value))]
        arguments = list(value.args) + [k.value for k in value.keywords if k.arg and "posed" not in k.arg]
        if any(isinstance(a, (ast.Constant, ast.JoinedStr)) for a in arguments):
            return []  # a record of texts (a SymbolicStep), not of numbers
        return [(a, _times_ten(source, a)) for a in arguments]
    if isinstance(value, (ast.BinOp, ast.UnaryOp, ast.Subscript)):
        return [(value, _times_ten(source, value))]
    return []  # constants and attributes (math.inf): nothing to loosen


def _bound_return_sites(source: _Source) -> list[Site]:
    sites = []
    for function in _functions(source):
        if not BOUND_FUNCTIONS.search(function.name):
            continue
        dicts = _assigned_dicts(function)
        for statement in _own_returns(function):
            edits = _return_edits(source, statement.value, dicts)
            if edits:
                sites.append(source.site(BOUND, statement.value, edits, False))
    return sites


def _callee(node) -> str:
    return node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", "")


def _label(node) -> bool:
    """A fixed label of a generator key: a literal or a module constant (CLAIM_ID)."""
    return isinstance(node, ast.Constant) or (isinstance(node, ast.Name) and node.id.isupper())


def _draw_sites(source: _Source) -> list[Site]:
    sites = []
    for node in ast.walk(source.tree):
        if not isinstance(node, ast.Call):
            continue
        name = _callee(node)
        if name == "SeedSequence":
            for keyword in node.keywords:
                if keyword.arg == "spawn_key" and not (isinstance(keyword.value, ast.List) and not keyword.value.elts):
                    sites.append(source.site(DRAWS, node, [(keyword.value, "[]")], False))
        elif name == "spawn" and isinstance(node.func, ast.Attribute) and len(node.args) == 1:
            sites.append(source.site(DRAWS, node, [(node, f"[{source.text(node.func.value)}] * ({source.text(node.args[0])})")], False))
        elif name == "rng_for" and len(node.args) >= 2:
            kept = [source.text(node.args[0])]
            for argument in node.args[1:]:
                if isinstance(argument, ast.Starred):
                    kept.append(f"*{source.text(argument.value)}[:2]")
                elif _label(argument):
                    kept.append(source.text(argument))
            new = f"{source.text(node.func)}({', '.join(kept)})"
            if new != source.text(node):
                sites.append(source.site(DRAWS, node, [(node, new)], False))
    return sites


def _plain(node) -> bool:
    return not isinstance(node, (ast.Constant, ast.BinOp, ast.UnaryOp))


def _self_comparison_sites(source: _Source) -> list[Site]:
    if not source.rel.startswith(f"{SCOPE}/kit/"):
        return []
    sites = []
    for function in source.tree.body:  # the kit's functions, not methods
        if not isinstance(function, ast.FunctionDef) or not COMPARISON_NAMES.search(function.name) or "bound" in function.name:
            continue
        for node in ast.walk(function):
            if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Sub) and _plain(node.left) and _plain(node.right):
                left = source.text(node.left)
                if left != source.text(node.right):
                    sites.append(source.site(SELF, node, [(node.right, left)], False))
    return sites


# --------------------------------------------------------------------------------------------
# Discovery and sampling
# --------------------------------------------------------------------------------------------

ORDER = (RANGE, BOUND, SHAPE, DTYPE, DRAWS, SELF)


def file_sites(rel: str, data: bytes, profile: str = PROFILE) -> list[Site]:
    """Every weakening site of one file, keyed, in a stable order."""
    source = _Source(rel, data)
    found = _module_sites(source, profile) + _default_sites(source) + _bound_return_sites(source)
    found += _draw_sites(source) + _self_comparison_sites(source)
    found.sort(key=lambda s: (ORDER.index(s.operator), s.edits[0][0]))
    seen: dict[str, int] = {}
    keyed = []
    for site in found:
        key = f"{site.file} | {site.operator} | {site.diff}"
        seen[key] = seen.get(key, 0) + 1
        keyed.append(_with_key(site, key if seen[key] == 1 else f"{key} #{seen[key]}"))
    return keyed


def _with_key(site: Site, key: str) -> Site:
    return replace(site, key=key)


def readers(root: Path) -> dict[str, list[tuple[str, int]]]:
    """name -> (file, first line of the statement) of every read of the name (a Name or an attribute)
    in the modules of propositions/ and certify/."""
    found: dict[str, list[tuple[str, int]]] = {}
    for package in USERS:
        for path in sorted((Path(root) / package).rglob("*.py")):
            source = _Source(path.relative_to(root).as_posix(), path.read_bytes())
            for node in ast.walk(source.tree):
                name = node.id if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Load) else getattr(node, "attr", None)
                if isinstance(node, (ast.Name, ast.Attribute)) and name:
                    found.setdefault(name, []).append((source.rel, source.statement(node).lineno))
    return found



def discover(root: Path, profile: str = PROFILE) -> list[Site]:
    """Every site of every module under root/propositions, in a stable order (file, operator, place);
    a module-level site carries the statements that read its name (`uses`)."""
    sites = []
    for path in sorted((Path(root) / SCOPE).rglob("*.py")):
        rel = path.relative_to(root).as_posix()
        sites += file_sites(rel, path.read_bytes(), profile)
    read = readers(root)
    return [replace(s, uses=tuple(read.get(s.name, ()))) if s.name else s for s in sites]


def reachable(site: Site, executed: dict[str, set[int]] | None) -> bool:
    """Whether the unmutated run reached the site (executed: file -> lines run; None: unknown, all
    count): its statement ran and, for a module-level name or a default, a statement reading it ran
    (the function body, for a default)."""
    if executed is None:
        return True
    if site.line not in executed.get(site.file, set()):
        return False
    if site.name is None and not site.uses:
        return True
    return any(line in executed.get(file, set()) for file, line in site.uses)


def sample_sites(sites: list[Site], sample: int | None, seed: int) -> list[Site]:
    """`sample` of the sites (all when None or not fewer), drawn with default_rng(SeedSequence(seed)):
    first up to sample // (2 * operators) of each operator, so that every operator is represented,
    then the rest uniformly from what is left; returned in the population's order."""
    import numpy as np

    if sample is None or sample >= len(sites):
        return list(sites)
    rng = np.random.default_rng(np.random.SeedSequence(seed))
    operators = sorted({s.operator for s in sites}, key=ORDER.index)
    floor = max(1, sample // (2 * max(1, len(operators))))
    chosen: set[int] = set()
    for operator in operators:
        indices = [k for k, s in enumerate(sites) if s.operator == operator]
        take = min(len(indices), floor, sample - len(chosen))
        chosen.update(int(k) for k in rng.choice(indices, size=take, replace=False))
    rest = [k for k in range(len(sites)) if k not in chosen]
    chosen.update(int(k) for k in rng.choice(rest, size=sample - len(chosen), replace=False))
    return [sites[k] for k in sorted(chosen)]


# --------------------------------------------------------------------------------------------
# Running certify all on a copy
# --------------------------------------------------------------------------------------------


def committed_tree(repository: Path, destination: Path) -> Path:
    """A fresh copy of the committed tree (HEAD) of `repository` in `destination`."""
    destination.mkdir(parents=True, exist_ok=True)
    archive = subprocess.run(["git", "-C", str(repository), "archive", "HEAD"], capture_output=True, check=False)
    if archive.returncode != 0:
        raise WeakeningError(f"git archive HEAD failed in {repository}: {archive.stderr.decode(errors='replace').strip()}")
    unpack = subprocess.run(["tar", "-x", "-C", str(destination)], input=archive.stdout, capture_output=True, check=False)
    if unpack.returncode != 0:
        raise WeakeningError(f"tar could not unpack the committed tree: {unpack.stderr.decode(errors='replace').strip()}")
    return destination


def _environment(tree: Path) -> dict:
    env = dict(os.environ)
    env.update(PYTHONPATH=str(tree), MPLBACKEND="Agg", OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1",
               MKL_NUM_THREADS="1", PYTHONDONTWRITEBYTECODE="1", CERTIFY_WORKERS="1")
    for name in ("COVERAGE_PROCESS_START", "COVERAGE_PROCESS_CONFIG", "CERTIFY_PROFILE"):
        env.pop(name, None)
    return env


def certify_command(out: Path, profile: str, prefix: list[str] | None = None) -> list[str]:
    return [sys.executable] + (prefix or []) + ["-m", "certify", "all", "--profile", profile, "--out", str(out), "--workers", "1"]


def run_command(command: list[str], tree: Path, timeout: float | None) -> tuple[int | None, float, str]:
    """(exit code or None on timeout, seconds, the output's tail); a timed-out command's process
    group is killed."""
    started = time.perf_counter()
    with open(tree / "weakening-run.log", "w+b") as log:
        process = subprocess.Popen(command, cwd=tree, env=_environment(tree), stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            code = process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
            code = None
        log.seek(0)
        tail = log.read().decode("utf-8", errors="replace")[-2000:]
    return code, time.perf_counter() - started, tail


def certificates(out: Path) -> list[dict]:
    found = []
    for path in sorted(out.glob("*.json")) if out.is_dir() else []:
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            continue
        if isinstance(data, dict) and "verdict" in data and "id" in data:
            found.append(data)
    return found


def first_failing_check(certificate: dict) -> str:
    """The first thing that keeps a certificate from passing: a symbolic step, an exact check, a
    numerical check, a control, else its first failure or inconclusive reason."""
    for step in (certificate.get("symbolic") or {}).get("steps") or []:
        if step.get("reduced") is False:
            return f"symbolic: {step.get('description', '?')}"
    for check in certificate.get("exact") or []:
        if check.get("passed") is False:
            return f"exact: {check.get('name', '?')}"
    for check in (certificate.get("numerical") or {}).get("checks") or []:
        if check.get("passed") is False:
            return f"numerical: {check.get('name', '?')} (max residual/bound {check.get('max_ratio')}, {check.get('samples')} samples)"
    for control in certificate.get("controls") or []:
        if control.get("detected") is False:
            return f"control: {control.get('name', '?')} not detected by {control.get('check')} (margin {control.get('margin')})"
    reasons = (certificate.get("failures") or []) + (certificate.get("inconclusive") or [])
    return f"{certificate.get('verdict')}: {reasons[0]}" if reasons else str(certificate.get("verdict"))


def judge(code: int | None, found: list[dict]) -> tuple[str, list[dict]]:
    """(status, the certificates that did not pass with their first failing check)."""
    if code is None:
        return "timeout", []
    if not found:
        return "invalid", []
    failing = [{"id": c["id"], "verdict": c["verdict"], "first_failing_check": first_failing_check(c)}
               for c in found if c["verdict"] != "pass"]
    if failing and all(LOAD_FAILURE in item["first_failing_check"] for item in failing):
        return "invalid", failing
    return ("killed" if code != 0 and failing else "survived"), failing


@dataclass
class _Run:
    pristine: Path
    work: Path
    profile: str
    timeout: float
    progress: Callable[[str], None]
    total: int
    done: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)

    def report(self, line: str) -> None:
        with self.lock:
            self.done += 1
            self.progress(f"[{self.done}/{self.total}] {line}")


def run_mutant(site: Site, run: _Run) -> dict:
    """Apply one site to a fresh copy of the committed tree and run certify all there."""
    tree = Path(tempfile.mkdtemp(prefix="mutant-", dir=run.work))
    try:
        shutil.copytree(run.pristine, tree, dirs_exist_ok=True)
        source = mutated_source(tree, site)
        (tree / site.file).write_bytes(source)
        try:
            compile(source, site.file, "exec")
        except SyntaxError as error:
            return _entry(site, "invalid", [], 0.0, f"the edit does not compile: {error}")
        code, seconds, tail = run_command(certify_command(tree / "out", run.profile), tree, run.timeout)
        status, failing = judge(code, certificates(tree / "out"))
        note = None if status in ("killed", "survived") else tail.strip().splitlines()[-1:] or None
        entry = _entry(site, status, failing, seconds, note[0] if note else None)
        entry["returncode"] = code
        return entry
    finally:
        shutil.rmtree(tree, ignore_errors=True)


def _entry(site: Site, status: str, failing: list[dict], seconds: float, note: str | None) -> dict:
    return {"key": site.key, "file": site.file, "operator": site.operator, "line": site.line, "diff": site.diff,
            "status": status, "killing_certificates": failing if status == "killed" else [],
            "first_failing_check": (f"{failing[0]['id']}: {failing[0]['first_failing_check']}" if status == "killed" and failing else None),
            "seconds": round(seconds, 2), "class": None, "reason": None, "note": note}


# --------------------------------------------------------------------------------------------
# The unmutated run
# --------------------------------------------------------------------------------------------


def executed_lines(tree: Path) -> dict[str, set[int]] | None:
    """file -> executed lines from the coverage run's JSON report in `tree` (None without one)."""
    report = tree / "weakening-coverage.json"
    try:
        files = json.loads(report.read_text(encoding="utf-8"))["files"]
    except (OSError, ValueError, KeyError):
        return None
    executed = {}
    for name, data in files.items():
        path = Path(name)
        rel = (path.relative_to(tree) if path.is_absolute() else path).as_posix()
        executed[rel] = set(data.get("executed_lines", []))
    return executed


def baseline(work: Path, pristine: Path, profile: str) -> dict:
    """The unmutated run (must pass) and, beside it, the same run under coverage.py for the lines it
    executes; both at once, so the timing is taken on a machine as busy as the mutants will keep it."""
    plain = pristine.parent / "baseline"
    covered = pristine.parent / "coverage"
    for tree in (plain, covered):
        shutil.copytree(pristine, tree)
    coverage = ["-m", "coverage", "run", f"--source={','.join(USERS)}", f"--data-file={covered / '.coverage'}"]
    with ThreadPoolExecutor(2) as pool:
        timed = pool.submit(run_command, certify_command(plain / "out", profile), plain, None)
        traced = pool.submit(run_command, certify_command(covered / "out", profile, coverage), covered, None)
        code, seconds, tail = timed.result()
        traced.result()
    verdicts = {c["id"]: c["verdict"] for c in certificates(plain / "out")}
    if code != 0 or not verdicts or any(v != "pass" for v in verdicts.values()):
        raise WeakeningError(f"the unmutated committed tree does not pass certify all --profile {profile} (exit {code}, verdicts {verdicts}): {tail[-400:]}")
    subprocess.run([sys.executable, "-m", "coverage", "json", "--ignore-errors", f"--data-file={covered / '.coverage'}",
                    "-o", str(covered / "weakening-coverage.json")], cwd=covered, env=_environment(covered), capture_output=True, check=False)
    return {"seconds": seconds, "verdicts": verdicts, "executed": executed_lines(covered)}


# --------------------------------------------------------------------------------------------
# Classes and the report
# --------------------------------------------------------------------------------------------


def load_classes(path: Path = CLASSES_FILE) -> dict:
    try:
        return json.loads(path.read_text(encoding="utf-8")).get("mutants", {})
    except (OSError, ValueError):
        return {}


def classify(entry: dict, classes: dict) -> None:
    """Set a survivor's class and reason from the classes file (exact key, else FILE | OPERATOR | *)."""
    if entry["status"] != "survived":
        return
    base = entry["key"].rsplit(" #", 1)[0] if re.search(r" #\d+$", entry["key"]) else entry["key"]
    found = classes.get(entry["key"]) or classes.get(base) or classes.get(f"{entry['file']} | {entry['operator']} | *")
    entry["class"], entry["reason"] = (found["class"], found["reason"]) if found else ("unclassified", None)


def tally(entries: list[dict]) -> dict:
    counts = {status: sum(e["status"] == status for e in entries) for status in ("killed", "survived", "invalid", "timeout")}
    counts["total"] = len(entries)
    counts["equivalent"] = sum(e["class"] == "equivalent" for e in entries)
    counts["out_of_scope"] = sum(e["class"] == "out of scope" for e in entries)
    counts["gaps"] = sum(e["class"] == "gap" for e in entries)
    counts["unclassified"] = sum(e["class"] == "unclassified" for e in entries)
    denominator = counts["total"] - counts["equivalent"] - counts["invalid"]
    counts["score"] = round(counts["killed"] / denominator, 4) if denominator else None
    return counts


def _cell(text) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


def _short(text: str, limit: int = 160) -> str:
    return text if len(text) <= limit else text[: limit - 3] + "..."


def markdown(record: dict) -> str:
    counts, lines = record, []
    score = "n/a" if counts["score"] is None else f"{100 * counts['score']:.1f}%"
    lines += ["## Certifier weakenings", "",
              f"Written by `{record['command']}` ({record['wall_seconds']:.0f} s wall, {record['max_children']} children). "
              f"Each mutant weakens propositions/ in a fresh copy of the committed tree and runs `certify all --profile {record['profile']} "
              f"--workers 1` there (the unmutated run: {record['baseline_seconds']:.1f} s, all {len(record['baseline_verdicts'])} certificates pass; "
              f"per-mutant limit {record['timeout_seconds']:.0f} s). Killed: exit status nonzero and some certificate not pass.", "",
              f"**Score: {counts['killed']} killed of {counts['total'] - counts['equivalent'] - counts['invalid']} = {score}** "
              f"(sample of {counts['total']} from a population of {counts['population']} reachable sites, seed {record['seed']}; "
              f"{counts['survived']} survived: {counts['equivalent']} equivalent, {counts['out_of_scope']} out of scope, {counts['gaps']} gaps, "
              f"{counts['unclassified']} unclassified; {counts['invalid']} invalid, {counts['timeout']} timeout). "
              "score = killed / (total - equivalent - invalid).", ""]
    earlier = record.get("earlier")
    if earlier:
        lines += [f"The same {earlier['total']} weakenings (by key) at the earlier run of `{earlier['command']}`: {earlier['killed']} killed "
                  f"({100 * earlier['score']:.1f}%), {earlier['gaps']} gaps; that run's record is {earlier['file']}.", ""]
    lines += ["### Operators", "",
              "| operator | what it does | sites | not reached | sampled | killed | survived | invalid | timeout | score |", "|---|---|---|---|---|---|---|---|---|---|"]
    for operator, row in record["operators"].items():
        share = "n/a" if row["score"] is None else f"{100 * row['score']:.0f}%"
        lines.append(f"| {operator} | {_cell(OPERATORS[operator])} | {row['sites']} | {row['not_reached']} | {row['sampled']} | {row['killed']} | "
                     f"{row['survived']} | {row['invalid']} | {row['timeout']} | {share} |")
    lines += ["", "Sites are found with `ast` over propositions/ (certify/weakening.py); a site inside a function counts only where the "
              "unmutated run executes its line (coverage.py), a module-level one only in a module the run imports. Sampling takes "
              "every operator's share first, so per-operator scores are the informative ones.", "", "### Survivors", ""]
    killed = [e for e in record["mutants"] if e["status"] == "killed"]
    if killed:
        lines[-3:-3] = ["", "### Killed", "", "| file | operator | weakening | first failing check |", "|---|---|---|---|"] + [
            f"| {e['file']} | {e['operator']} | `{_cell(_short(e['diff'], 160))}` | {_cell(e['first_failing_check'])} |" for e in killed]
    survivors = [e for e in record["mutants"] if e["status"] not in ("killed",)]
    if not survivors:
        lines.append("None.")
    else:
        lines += ["| file | operator | weakening | status | class | reason |", "|---|---|---|---|---|---|"]
        for e in survivors:
            lines.append(f"| {e['file']} | {e['operator']} | `{_cell(_short(e['diff'], 220))}` | {e['status']} | {e['class'] or ''} | "
                         f"{_cell(e['reason'] or e.get('note') or '')} |")
    return "\n".join(lines) + "\n"


def operator_rows(population: list[Site], unreached: list[Site], entries: list[dict]) -> dict:
    rows = {}
    for operator in ORDER:
        mine = [e for e in entries if e["operator"] == operator]
        row = {"sites": sum(s.operator == operator for s in population), "not_reached": sum(s.operator == operator for s in unreached),
               "sampled": len(mine)}
        row.update({k: v for k, v in tally(mine).items() if k in ("killed", "survived", "invalid", "timeout", "score")})
        rows[operator] = row
    return rows


# --------------------------------------------------------------------------------------------
# The run
# --------------------------------------------------------------------------------------------


def run(out_dir: Path, *, max_children: int, sample: int | None, seed: int, progress: Callable[[str], None],
        profile: str = PROFILE, repository: Path | None = None, same_as: Path | None = None) -> dict:
    """Run the certifier's weakening mutants and write out_dir/mutation-certifier.json; returns its record.
    same_as: an earlier report whose mutants (by key) are run again instead of a sample, to measure
    what a change of the certificates kills of the same weakenings (a key no longer found is listed)."""
    started = time.perf_counter()
    repository = Path(repository) if repository is not None else Path(__file__).resolve().parents[1]
    work = Path(tempfile.mkdtemp(prefix="certify-weakening-"))
    try:
        pristine = committed_tree(repository, work / "pristine")
        progress(f"unmutated run of the committed tree (certify all --profile {profile}), with coverage beside it")
        base = baseline(work, pristine, profile)
        timeout = max(MIN_TIMEOUT_S, TIMEOUT_FACTOR * base["seconds"])
        every = discover(pristine, profile)
        population = [s for s in every if reachable(s, base["executed"])]
        unreached = [s for s in every if not reachable(s, base["executed"])]
        if same_as is not None:
            keys = [entry["key"] for entry in json.loads(Path(same_as).read_text(encoding="utf-8"))["mutants"]]
            by_key = {site.key: site for site in every}
            chosen = [by_key[key] for key in keys if key in by_key]
            for key in (key for key in keys if key not in by_key):
                progress(f"no longer found: {key}")
        else:
            chosen = sample_sites(population, sample, seed)
        progress(f"unmutated: pass in {base['seconds']:.1f} s; {len(population)} reachable sites ({len(unreached)} not reached), "
                 f"running {len(chosen)} mutants, {max_children} at a time, limit {timeout:.0f} s each")
        state = _Run(pristine, work, profile, timeout, progress, len(chosen))

        def one(site: Site) -> dict:
            entry = run_mutant(site, state)
            state.report(f"{entry['status']:8s} {entry['seconds']:6.1f} s  {_short(site.key, 150)}")
            return entry

        with ThreadPoolExecutor(max(1, max_children)) as pool:
            entries = list(pool.map(one, chosen))
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return _write(out_dir, entries, population, unreached, base, timeout, dict(seed=seed, sample=sample, profile=profile,
                  max_children=max_children, wall_seconds=time.perf_counter() - started, same_as=same_as))


def _write(out_dir: Path, entries, population, unreached, base, timeout, settings) -> dict:
    classes = load_classes()
    for entry in entries:
        classify(entry, classes)
    counts = tally(entries)
    chosen = (f"--same-as {settings['same_as']}" if settings.get("same_as") is not None
              else f"--sample {settings['sample']} --seed {settings['seed']}")
    command = (f"python -m certify.weakening --out {out_dir} {chosen} "
               f"--max-children {settings['max_children']}") + ("" if settings["profile"] == PROFILE else f" --profile {settings['profile']}")
    record = {"target": TARGET, "kind": REPORT_KIND, "seed": settings["seed"], "sample": settings["sample"], "population": len(population),
              **{k: counts[k] for k in ("killed", "survived", "invalid", "timeout", "total", "equivalent", "gaps", "score")},
              "out_of_scope": counts["out_of_scope"], "unclassified": counts["unclassified"], "command": command,
              "profile": settings["profile"], "max_children": settings["max_children"], "wall_seconds": round(settings["wall_seconds"], 1),
              "baseline_seconds": round(base["seconds"], 2), "baseline_verdicts": base["verdicts"], "timeout_seconds": round(timeout, 1),
              "coverage": base["executed"] is not None, "operators": operator_rows(population, unreached, entries),
              "not_reached": [s.key for s in unreached], "mutants": entries}
    record["markdown"] = markdown(record)
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / REPORT_JSON).write_text(json.dumps(record, indent=1) + "\n", encoding="utf-8")
    return record


def reclassify(out_dir: Path) -> dict:
    """Apply the current classes file to the report already in out_dir (no mutant is re-run)."""
    path = Path(out_dir) / REPORT_JSON
    record = json.loads(path.read_text(encoding="utf-8"))
    classes = load_classes()
    for entry in record["mutants"]:
        entry["class"], entry["reason"] = None, None
        classify(entry, classes)
    counts = tally(record["mutants"])
    record.update({k: counts[k] for k in ("killed", "survived", "invalid", "timeout", "total", "equivalent", "gaps", "score")})
    record.update(out_of_scope=counts["out_of_scope"], unclassified=counts["unclassified"])
    for operator, row in record["operators"].items():
        mine = tally([e for e in record["mutants"] if e["operator"] == operator])
        row.update({k: mine[k] for k in ("killed", "survived", "invalid", "timeout", "score")})
    record["markdown"] = markdown(record)
    path.write_text(json.dumps(record, indent=1) + "\n", encoding="utf-8")
    return record


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m certify.weakening", description="The certifier's weakening mutants (mutation target 'certifier').")
    parser.add_argument("--out", type=Path, default=Path("reports"), help="folder for mutation-certifier.json (default reports)")
    parser.add_argument("--sample", type=int, default=None, help="how many mutants to run (default: all)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the sample (default 0)")
    parser.add_argument("--max-children", type=int, default=2, help="mutants run at once (default 2)")
    parser.add_argument("--profile", default=PROFILE, choices=_PROFILE_NAMES, help=f"profile of each certify all (default {PROFILE})")
    parser.add_argument("--reclassify", action="store_true", help="only apply certify/weakening_classes.json to the report in --out")
    parser.add_argument("--same-as", type=Path, default=None, metavar="REPORT",
                        help="run the mutants of an earlier mutation-certifier.json again (by key) instead of a sample")
    args = parser.parse_args(argv)
    if args.reclassify:
        print(reclassify(args.out)["markdown"])
        return 0
    try:
        record = run(args.out, max_children=args.max_children, sample=args.sample, seed=args.seed, progress=lambda line: print(line, flush=True),
                     profile=args.profile, same_as=args.same_as)
    except WeakeningError as error:
        print(f"certify.weakening: {error}", file=sys.stderr)
        return 2
    print(record["markdown"])
    return 0


if __name__ == "__main__":
    sys.exit(main())
