"""The software and hardware a certificate was produced on (SPEC.md section 7: environment).

Everything here is recorded for people reading a certificate; `certify verify` never compares it,
because a certificate must be checkable on another machine.
"""

from __future__ import annotations

import functools
import importlib.metadata
import os
import platform
import subprocess
import sys
from pathlib import Path

PROJECT_DISTRIBUTION = "stiefel-adam-certify"
_PROJECT_ROOT = Path(__file__).resolve().parent.parent


def _version(distribution: str) -> str | None:
    """The installed version of a distribution (read from its metadata, nothing is imported), else None."""
    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return None


def cpu_model() -> str:
    """The CPU model name from /proc/cpuinfo where there is one, else platform.processor()."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as cpuinfo:
            for line in cpuinfo:
                if line.lower().startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown"


def blas_info() -> dict:
    """BLAS/LAPACK numpy is linked against: threadpoolctl's view when installed, else numpy's build config.

    Returns {"source": str, "libraries": list of dicts}; local file-system paths are left out.
    """
    try:
        import threadpoolctl  # optional: richer (runtime thread counts), never a dependency

        libraries = [
            {k: v for k, v in info.items() if k not in ("filepath",)}
            for info in threadpoolctl.threadpool_info()
        ]
        return {"source": "threadpoolctl", "libraries": libraries}
    except ImportError:
        pass
    import numpy

    libraries = []
    try:
        config = numpy.show_config(mode="dicts")
        dependencies = config.get("Build Dependencies", {})
        for role in ("blas", "lapack"):
            entry = dependencies.get(role, {})
            libraries.append(
                {
                    "role": role,
                    "name": entry.get("name"),
                    "version": entry.get("version"),
                    "configuration": entry.get("openblas configuration"),
                }
            )
    except Exception as error:  # old numpy without mode="dicts": say so rather than guess
        return {"source": f"unavailable ({type(error).__name__})", "libraries": []}
    return {"source": "numpy.show_config", "libraries": libraries}


@functools.lru_cache(maxsize=1)
def _base_environment() -> dict:
    return {
        "python": platform.python_version(),
        "python_implementation": platform.python_implementation(),
        "numpy": _version("numpy"),
        "scipy": _version("scipy"),
        "sympy": _version("sympy"),
        "mpmath": _version("mpmath"),
        "jsonschema": _version("jsonschema"),
        "blas": blas_info(),
        "cpu": cpu_model(),
        "cpu_count": os.cpu_count(),
        "platform": platform.platform(),
        "machine": platform.machine(),
    }


def environment(torch_info: dict | None = None) -> dict:
    """The environment record of one certificate.

    torch_info: what the torch cross-check reports about torch and its device, or None; when None
    and torch was imported by the run (a claim used autograd, say), its version is still recorded.
    """
    record = dict(_base_environment())
    if torch_info is not None:
        record["torch"] = dict(torch_info)
    elif "torch" in sys.modules:
        record["torch"] = {"version": str(getattr(sys.modules["torch"], "__version__", None))}
    else:
        record["torch"] = None
    return record


def project_version() -> str:
    """The installed version of this project, else the reference's __version__."""
    try:
        return importlib.metadata.version(PROJECT_DISTRIBUTION)
    except importlib.metadata.PackageNotFoundError:
        try:
            from reference_impl import __version__

            return str(__version__)
        except Exception:
            return "unknown"


def _git(*args: str) -> str | None:
    try:
        completed = subprocess.run(
            # --no-optional-locks: reading the state must never write the index
            ["git", "--no-optional-locks", *args],
            cwd=_PROJECT_ROOT,
            capture_output=True,
            text=True,
            timeout=10,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return completed.stdout if completed.returncode == 0 else None


@functools.lru_cache(maxsize=1)
def git_state() -> dict:
    """{"commit": hex or None, "tree_clean": bool or None} of the checkout this code runs from."""
    commit = _git("rev-parse", "HEAD")
    if commit is None:
        return {"commit": None, "tree_clean": None}
    status = _git("status", "--porcelain", "--untracked-files=no")
    return {"commit": commit.strip(), "tree_clean": None if status is None else status.strip() == ""}
