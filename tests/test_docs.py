"""The documentation is executed: every code block of README.md and docs/*.md runs, or says why not.

Blocks are read with markdown-it-py (the CommonMark parser rich already depends on), not by hand.
What a block is, and how it is held to the code, is said in the Markdown source itself, by an HTML
comment on the line before the fence (invisible when the page is rendered):

- no comment, fence ``sh``: every line is a command. It runs in a sandbox folder (a scratch copy
  with a package ``mypackage`` whose ``optim`` module holds a NumPy step ``init, step`` and a torch
  optimizer ``MyAdam``, the names the docs use), with ``.venv/bin/`` resolved to this environment,
  ``$CERTIFY_PROFILE=quick`` (small profiles: a command that names its profile keeps it) and one
  worker per command. It must exit 0 and write what the docs say it writes (below).
- ``<!-- docs-test: exits 0 1 ... -->``: the exit status of each command line, in order (a
  comparison with geoopt fails claims, and says so with 1).
- no comment, fence ``python``: the snippet runs (``exec`` in a fresh namespace, in the sandbox);
  a ``test_*`` function it defines is called, and a ``CLAIM`` it defines is run at the quick
  profile and must pass with every control detected.
- ``<!-- docs-test: prelude NAME -->``: a python snippet that continues an earlier one runs after
  the prelude NAME of this file (the names the earlier snippet or the prose defined).
- ``<!-- docs-test: in PATH -->``: the block is a piece of the file PATH of this repository (its
  lines appear there, in order), which other tests run.
- ``<!-- docs-test: synopsis -->``: a usage synopsis; each line's subcommand and every option it
  names must be accepted by ``certify``'s parser.
- ``<!-- docs-test: not run: REASON -->``: cannot run here (a GPU, a cluster address, a new virtual
  environment); the reason is reported. ``pip install`` lines are never run (they would change the
  environment under test): every extra they name must exist in pyproject.toml.
- fence ``text``: output or a file tree, shown, not run. A fence without a language is refused.

What a certify command writes, as README.md and docs/adapters.md say: `run`, `all`, `crosscheck` and
`compare` write DIR/REPORT.md for ``--out DIR``; without it `all` and the reference's `run` write
reports/, a `run` of another implementation a fresh run-<UTC time>/, `compare` compare-<UTC time>/,
and ``--properties`` properties-<UTC time>/; `regression -o FILE` writes FILE.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
import tomllib
from dataclasses import dataclass
from pathlib import Path

import pytest
from markdown_it import MarkdownIt

PROJECT_ROOT = Path(__file__).resolve().parent.parent
PAGES = [PROJECT_ROOT / "README.md", *sorted((PROJECT_ROOT / "docs").glob("*.md"))]
MARKER = re.compile(r"<!--\s*docs-test:\s*(.*?)\s*-->", re.S)
LANGUAGES = ("sh", "python", "text", "yaml")

# What the prose around a snippet that continues an earlier one defines (docs-test: prelude NAME).
PRELUDES = {
    "training": '''
import torch
import torch_impl
from torch_impl import StiefelAdam, stiefel_init_

torch.manual_seed(0)
W_Q = torch.nn.Parameter(stiefel_init_(torch.empty(2, 16, 4)))
W_K = torch.nn.Parameter(stiefel_init_(torch.empty(2, 16, 4)))
other_weights = [torch.nn.Parameter(torch.randn(16, 16) / 4)]
steps = 3
data = [torch.randn(8, 16) for _ in range(steps)]


def loss_of(X):
    scores = torch.softmax(X @ W_Q @ W_K.transpose(-1, -2) @ X.T / 2.0, dim=-1)
    return (scores @ X @ other_weights[0]).square().mean()
''',
}

SANDBOX_PACKAGE = '''"""The implementation the docs call mypackage.optim: a NumPy step and a torch optimizer."""
from reference_impl import init, step  # noqa: F401  (a NumPy step: init(W), step(W, G, state, config))
from torch_impl import StiefelAdam as MyAdam  # noqa: F401  (a torch.optim.Optimizer taking amsgrad=False)
'''


@dataclass
class Block:
    page: Path
    line: int
    language: str
    code: str
    marker: str | None

    @property
    def where(self) -> str:
        return f"{self.page.relative_to(PROJECT_ROOT)}:{self.line}"


def blocks_of(page: Path) -> list[Block]:
    """The fenced code blocks of a page, each with the docs-test comment just above its fence."""
    text = page.read_text(encoding="utf-8")
    lines = text.splitlines()
    found = []
    for token in MarkdownIt("commonmark").parse(text):
        if token.type != "fence":
            continue
        first = token.map[0]
        above = next((lines[k] for k in range(first - 1, -1, -1) if lines[k].strip()), "")
        marker = MARKER.search(above)
        found.append(Block(page, first + 1, token.info.strip().split(" ")[0], token.content, marker.group(1) if marker else None))
    return found


ALL_BLOCKS = [block for page in PAGES for block in blocks_of(page)]


def _id(block: Block) -> str:
    return block.where


# --------------------------------------------------------------------------------------------
# Every block is one of the kinds above
# --------------------------------------------------------------------------------------------


def test_every_block_has_a_language_and_every_marker_is_known():
    problems = []
    for block in ALL_BLOCKS:
        if block.language not in LANGUAGES:
            problems.append(f"{block.where}: fence language {block.language!r}, not one of {LANGUAGES}")
        if block.marker is not None and not re.match(r"(exits( \d+)+|prelude \w+|in \S+|synopsis|not run: .{8,})$", block.marker, re.S):
            problems.append(f"{block.where}: unknown docs-test comment {block.marker!r}")
        if block.language == "yaml" and not (block.marker or "").startswith("not run:"):
            problems.append(f"{block.where}: a yaml block is a workflow of another system: say why it is not run")
    assert not problems, "\n".join(problems)


def test_the_pages_have_runnable_blocks():
    """A parser that found nothing would pass every test below: the pages do hold commands and snippets."""
    runnable = [b for b in ALL_BLOCKS if b.language in ("sh", "python") and (b.marker is None or b.marker.startswith(("exits", "prelude")))]
    assert len([b for b in runnable if b.language == "sh"]) >= 4
    assert len([b for b in runnable if b.language == "python"]) >= 3


# --------------------------------------------------------------------------------------------
# The sandbox
# --------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def sandbox(tmp_path_factory):
    """A scratch folder where the docs' commands run: a copy of the project's sources (what `pip
    wheel .` in a checkout needs) and mypackage.optim; the commands use the installed console scripts."""
    root = tmp_path_factory.mktemp("docs")
    for name in ("certify", "propositions", "reference_impl", "torch_impl"):
        shutil.copytree(PROJECT_ROOT / name, root / name, ignore=shutil.ignore_patterns("__pycache__"))
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(PROJECT_ROOT / name, root / name)
    (root / "mypackage").mkdir()
    (root / "mypackage" / "__init__.py").write_text("")
    (root / "mypackage" / "optim.py").write_text(SANDBOX_PACKAGE)
    return root


def _environment(sandbox: Path) -> dict:
    environment = {key: value for key, value in os.environ.items() if not key.startswith("CERTIFY_")}
    environment.update(
        PATH=f"{Path(sys.executable).parent}{os.pathsep}{environment.get('PATH', '')}",
        CERTIFY_PROFILE="quick",
        CERTIFY_WORKERS="1",
        MPLBACKEND="Agg",
    )
    return environment


# --------------------------------------------------------------------------------------------
# Shell blocks
# --------------------------------------------------------------------------------------------


def _commands(block: Block) -> list[str]:
    return [line.strip() for line in block.code.splitlines() if line.strip() and not line.strip().startswith("#")]


def _extras(pyproject: dict) -> set[str]:
    return set(pyproject["project"]["optional-dependencies"])


def _check_install_line(command: str, where: str) -> None:
    """A pip install line: it installs this project from what exists (a checkout's path, a git URL or
    a wheel, never a name that no package index has), and every extra it names exists. It is not run:
    it would change the environment under test."""
    pyproject = tomllib.loads((PROJECT_ROOT / "pyproject.toml").read_text())
    for target in shlex.split(command, comments=True)[2:]:
        if target.startswith("-"):
            continue
        base = target.split("[", 1)[0]
        assert base.startswith((".", "/", "git+")) or base.endswith(".whl") or " @ git+" in target, \
            f"{where}: `{command}` installs {base!r} from a package index, which does not have this project"
    named = re.findall(r"\[([a-z,\-_ ]+)\]", command)
    assert named, f"{where}: an install line that names no extra: {command}"
    for group in named:
        for extra in group.split(","):
            assert extra.strip() in _extras(pyproject), f"{where}: extra {extra.strip()!r} is not in pyproject.toml ({command})"


def _expected_output(argv: list[str]) -> str | None:
    """Where a certify command writes its report, as the docs say (module docstring); a glob."""
    if len(argv) < 2 or argv[0] not in ("certify", "pip"):
        return None
    sub, rest = argv[1], argv[2:]
    if sub == "regression":
        return rest[rest.index("-o") + 1] if "-o" in rest else None
    if argv[:2] == ["pip", "wheel"]:
        return f"{rest[rest.index('-w') + 1]}/*.whl"
    if sub not in ("run", "all", "crosscheck", "compare"):
        return None
    if "--out" in rest:
        return f"{rest[rest.index('--out') + 1]}/REPORT.md"
    if "--properties" in rest:
        return "properties-*/REPORT.md"
    if sub == "compare":
        return "compare-*/REPORT.md"
    other = any(option in rest for option in ("--implementation", "--torch-optimizer")) or ("--optimizer" in rest and rest[rest.index("--optimizer") + 1] != "stiefel_adam")
    return "run-*/REPORT.md" if other else "reports/REPORT.md"


def _snapshot(root: Path) -> dict[str, float]:
    return {str(path.relative_to(root)): path.stat().st_mtime_ns for path in root.rglob("*") if path.is_file()}


SH_BLOCKS = [b for b in ALL_BLOCKS if b.language == "sh" and (b.marker is None or b.marker.startswith("exits"))]


def _expected_exits(block: Block) -> list[int]:
    commands = _commands(block)
    exits = [int(code) for code in block.marker.split()[1:]] if block.marker else [0] * len(commands)
    assert len(exits) == len(commands), f"{block.where}: {len(commands)} commands, {len(exits)} exit codes in its docs-test comment"
    return exits


# each command is a test of its own, so that the long ones spread over the workers; the commands of a
# block are independent of each other (each writes where it says), as every block of the docs is now
SH_COMMANDS = [(block, index) for block in SH_BLOCKS for index in range(len(_commands(block)))]


@pytest.mark.parametrize("block, index", SH_COMMANDS, ids=[f"{b.where}#{i + 1}" for b, i in SH_COMMANDS])
def test_shell_command_runs(block, index, sandbox):
    command, expected = _commands(block)[index], _expected_exits(block)[index]
    environment = _environment(sandbox)
    command = command.replace(".venv/bin/", "")
    argv = shlex.split(command, comments=True)
    if argv[:2] == ["pip", "install"]:
        _check_install_line(command, block.where)
        return
    before = _snapshot(sandbox)
    completed = subprocess.run(["bash", "-c", command], cwd=sandbox, env=environment, capture_output=True, text=True, timeout=600)
    output = completed.stdout[-3000:] + completed.stderr[-3000:]
    assert completed.returncode == expected, f"{block.where}: `{command}` exited {completed.returncode}, the docs expect {expected}\n{output}"
    assert "internal error" not in completed.stderr and "Traceback" not in completed.stderr, f"{block.where}: `{command}`\n{output}"
    target = _expected_output(argv)
    if target is not None:
        after = _snapshot(sandbox)
        written = [name for name, stamp in after.items() if before.get(name) != stamp and Path(name).match(target)]
        assert written, f"{block.where}: `{command}` wrote no {target} (wrote {sorted(set(after) - set(before))[:8]})"
        if argv[:2] == ["pip", "wheel"]:
            _check_wheel(sandbox / written[0], block)


def _check_wheel(wheel: Path, block: Block) -> None:
    """The wheel the docs build: the file they name, holding what a CI needs from it (the schema the
    certificates are checked against, the pytest plugin and its entry point)."""
    import zipfile

    assert wheel.name in block.code, f"{block.where}: the docs name another file than {wheel.name}"
    archive = zipfile.ZipFile(wheel)
    names = archive.namelist()
    assert "certify/certificate.schema.json" in names and "certify/ci/pytest_plugin.py" in names
    entry_points = next(name for name in names if name.endswith("entry_points.txt"))
    assert "certify.ci.pytest_plugin" in archive.read(entry_points).decode()


@pytest.mark.parametrize("block", [b for b in ALL_BLOCKS if b.marker == "synopsis"], ids=_id)
def test_synopsis_lines_name_real_subcommands_and_options(block):
    from certify import cli

    parser = cli.build_parser()
    subcommands = next(action for action in parser._actions if isinstance(action, type(parser._subparsers._group_actions[0]))).choices
    for line in _commands(block):
        argv = shlex.split(line, comments=True)
        assert argv[0] == "certify" and argv[1] in subcommands, f"{block.where}: {line}"
        accepted = subcommands[argv[1]]._option_string_actions
        for option in re.findall(r"(?<![\w-])(--?[a-z][a-z\-]*)", " ".join(argv)):
            assert option in accepted, f"{block.where}: `certify {argv[1]}` has no option {option} ({line})"


# --------------------------------------------------------------------------------------------
# Python blocks
# --------------------------------------------------------------------------------------------

PYTHON_BLOCKS = [b for b in ALL_BLOCKS if b.language == "python" and (b.marker is None or b.marker.startswith("prelude"))]


@pytest.mark.parametrize("block", PYTHON_BLOCKS, ids=_id)
def test_python_block_runs(block, sandbox, monkeypatch):
    monkeypatch.chdir(sandbox)
    monkeypatch.syspath_prepend(str(PROJECT_ROOT / "examples" / "ci_project"))
    monkeypatch.setenv("CERTIFY_PROFILE", "quick")
    namespace: dict = {"__name__": "docs_snippet"}
    if block.marker:
        exec(compile(PRELUDES[block.marker.split()[1]], f"<prelude {block.marker}>", "exec"), namespace)
    exec(compile(block.code, block.where, "exec"), namespace)
    for name, value in list(namespace.items()):
        if name.startswith("test_") and callable(value):
            value()
    if "CLAIM" in namespace:
        from propositions import get_profile

        result = namespace["CLAIM"].run(0, get_profile("quick")).to_dict()
        assert result["verdict"] == "pass", result.get("failures")
        assert result["controls"] and all(control["detected"] for control in result["controls"])


# --------------------------------------------------------------------------------------------
# Pieces of files, and what is not run
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("block", [b for b in ALL_BLOCKS if (b.marker or "").startswith("in ")], ids=_id)
def test_block_is_a_piece_of_the_file_it_names(block):
    path = PROJECT_ROOT / block.marker.split(maxsplit=1)[1]
    assert path.is_file(), f"{block.where}: {path} does not exist"
    text = path.read_text(encoding="utf-8")
    position = 0
    for line in (line.strip() for line in block.code.splitlines()):
        if not line or line == "...":
            continue
        found = text.find(line, position)
        assert found >= 0, f"{block.where}: {line!r} is not in {path.relative_to(PROJECT_ROOT)} (after the lines before it)"
        position = found + len(line)


def test_install_lines_of_blocks_not_run_name_real_extras():
    for block in ALL_BLOCKS:
        for command in _commands(block):
            for part in command.split("&&"):
                part = part.strip().split("run: ", 1)[-1].replace(".venv/bin/", "")
                if part.startswith("pip install"):
                    _check_install_line(part, block.where)


def test_what_is_not_run_says_why(capsys):
    """The count of blocks run and not run, with the reasons (printed for the record)."""
    not_run = [(b.where, b.marker[len("not run:"):].strip()) for b in ALL_BLOCKS if (b.marker or "").startswith("not run:")]
    counted = {
        "shell blocks run": len(SH_BLOCKS),
        "shell commands run or checked": len(SH_COMMANDS),
        "python blocks run": len(PYTHON_BLOCKS),
        "synopses checked": sum(b.marker == "synopsis" for b in ALL_BLOCKS),
        "pieces of files checked": sum((b.marker or "").startswith("in ") for b in ALL_BLOCKS),
        "text blocks": sum(b.language == "text" for b in ALL_BLOCKS),
        "not run": len(not_run),
    }
    with capsys.disabled():
        print("\ndocs blocks: " + ", ".join(f"{name} {count}" for name, count in counted.items()))
        for where, reason in not_run:
            print(f"  not run {where}: {reason}")
    assert all(len(reason) >= 8 for _, reason in not_run)


def test_ci_runs_the_readme_commands():
    """README's two set-up commands are not run here (each makes a virtual environment, one runs this
    suite): .ci/run runs them on a fresh machine, with the same extras and the same test command."""
    readme = (PROJECT_ROOT / "README.md").read_text()
    ci = (PROJECT_ROOT / ".ci" / "run").read_text()
    test_command = next(c for b in ALL_BLOCKS if b.page.name == "README.md" for c in _commands(b) if "pytest" in c)
    extras = re.search(r'pip install -e "(\.\[[^\]]+\])"', test_command).group(1)
    assert f'-e "{extras}"' in ci, f".ci/run does not install {extras} as README does"
    run_tests = test_command.rsplit("&& ", 1)[-1]
    assert run_tests.startswith(".venv/bin/python -m pytest")
    assert re.search(r"^" + re.escape(run_tests) + r"( -q)?$", ci, re.M), f".ci/run does not run `{run_tests}`"
    assert re.search(r"^\.venv/bin/certify all\b", ci, re.M) and ".venv/bin/certify all" in readme
    assert "python3 -m venv .venv" in ci


def test_ci_runs_the_documented_comparison():
    """The comparison that wrote reports/compare/ is not run here (a minute of the suite's five):
    .ci/run runs the documented line, with only --out pointed at a scratch folder, and expects its
    documented exit status."""
    block = next(b for b in ALL_BLOCKS if (b.marker or "").startswith("not run: .ci/run runs it"))
    (command,) = _commands(block)
    documented = shlex.split(command, comments=True)
    ci = (PROJECT_ROOT / ".ci" / "run").read_text()
    lines = [line for line in ci.splitlines() if line.startswith(".venv/bin/certify compare ")]
    assert lines, ".ci/run does not run the documented comparison"
    run = shlex.split(lines[0].replace(".venv/bin/", "").split(" || ")[0])
    assert run[:run.index("--out")] == documented[:documented.index("--out")]
    assert "[ \"$status\" -ne 1 ]" in ci
