"""The software and hardware a certificate was produced on, and its rounding fingerprint.

The description (Python, library versions, BLAS, CPU name) is recorded for people reading a
certificate; `certify verify` never compares it, because two machines of the same description can
still round differently: a DYNAMIC_ARCH OpenBLAS, numpy's SIMD dispatch and torch each pick their
kernels by the CPU they find at run time, and a thread count changes how a reduction is split.

What verify compares instead is the *rounding fingerprint* (`rounding_fingerprint`): a short fixed
computation on fixed inputs (matmul, batched Gram matrices, SVD, QR, eigh, einsum, the sums over
axes and the norms the claims use, exp and log; with `with_torch`, torch's matmul, batched Gram,
eigh and reductions on the certificate's device), each output hashed bit for bit with sha256,
together with the library versions, the BLAS core and thread count that threadpoolctl reports,
numpy's enabled SIMD targets and torch's CPU capability and thread count. Two runs whose
fingerprints hash alike ran the same kernels on the same inputs to the same bits, so a
deterministic claim must reproduce its residuals bit for bit there; anywhere else only what
holds on every machine is required (docs/certificates.md, "How verify decides").
"""

from __future__ import annotations

import functools
import hashlib
import importlib.metadata
import json
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
        import threadpoolctl  # a dependency; numpy's build configuration below only where it is missing

        import numpy
        import scipy.linalg  # noqa: F401 (loads scipy's own BLAS, which every claim uses)

        # numpy's and scipy's own libraries only, sorted: what else a process happens to have
        # loaded (torch's OpenMP after an earlier claim, in a worker that ran it) and the order of
        # loading must not change the record, which the digest covers (docs/certificates.md)
        roots = tuple(str(Path(module.__file__).resolve().parent.parent / name) for module in (numpy, scipy.linalg) for name in ("numpy", "numpy.libs", "scipy", "scipy.libs"))
        found = threadpoolctl.threadpool_info()
        own = [info for info in found if str(info.get("filepath", "")).startswith(roots)] or found
        libraries = sorted(({k: v for k, v in info.items() if k not in ("filepath",)} for info in own), key=lambda info: json.dumps(info, sort_keys=True))
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


def environment(torch_info: dict | None = None, *, torch_device: str | None = None) -> dict:
    """The environment record of one certificate, with its rounding fingerprint.

    torch_info: what the torch cross-check reports about torch and its device, or None; when None
    and the claim used torch (torch_device given: P6's autograd cross-check), its version is recorded.
    torch_device: the device ("cpu", "cuda") of a claim whose residuals come from torch; its
    fingerprint then covers torch's kernels there too. None for a claim that does not use torch.
    """
    record = dict(_base_environment())
    if torch_info is not None:
        record["torch"] = dict(torch_info)
    elif torch_device is not None and "torch" in sys.modules:
        # only for a claim that used torch: whether an earlier claim in the same process imported
        # it depends on which claims a worker happened to run (propositions.kit.parallel)
        record["torch"] = {"version": str(getattr(sys.modules["torch"], "__version__", None))}
    else:
        record["torch"] = None
    record["rounding_fingerprint"] = rounding_fingerprint(torch_device)
    return record


# --------------------------------------------------------------------------------------------
# The rounding fingerprint
# --------------------------------------------------------------------------------------------

FINGERPRINT_VERSION = 1
# Entropy of the SeedSequence that draws the fingerprint's inputs; fixed forever (a new value
# would be a new FINGERPRINT_VERSION).
FINGERPRINT_SEED = 0x5717EF1
# What a fingerprint holds besides its own hash; everything here enters the hash.
FINGERPRINT_FIELDS = ("version", "software", "blas", "numpy_simd", "torch", "computations")


def _sha256(*arrays) -> str:
    """sha256 of the bytes of the arrays (C order, little-endian), dtype and shape included."""
    import numpy as np

    digest = hashlib.sha256()
    for array in arrays:
        array = np.ascontiguousarray(array)
        array = array.astype(array.dtype.newbyteorder("<"), copy=False)
        digest.update(f"{array.dtype.str}{array.shape}".encode("ascii"))
        digest.update(array.tobytes())
    return digest.hexdigest()


def _fingerprint_inputs() -> dict:
    """The fixed float64 inputs, uniform in [-1/2, 1/2): uniform doubles are k 2^-53 for integers k
    from PCG64, so the inputs are the same bits on every platform (no libm in their making)."""
    import numpy as np

    rng = np.random.Generator(np.random.PCG64(np.random.SeedSequence(FINGERPRINT_SEED)))

    def draw(*shape):
        return rng.random(shape) - 0.5

    symmetric = draw(12, 24, 24)
    return {
        # a product long enough for the BLAS kernel's blocking and FMA order to show (k = 150)
        "A": draw(200, 150),
        "B": draw(150, 120),
        # a batch of tall frames, as the claims batch them: Gram matrices, SVD, QR, sums, norms
        "F": draw(16, 64, 12),
        "S": symmetric + np.swapaxes(symmetric, -1, -2),
        "x": draw(4096) + 1.0,  # positive, for log
    }


def _numpy_computations(inputs: dict) -> dict:
    import numpy as np

    A, B, F, S, x = (inputs[name] for name in ("A", "B", "F", "S", "x"))
    U, sigma, Vh = np.linalg.svd(F, full_matrices=False)
    Q, R = np.linalg.qr(F)
    eigenvalues, eigenvectors = np.linalg.eigh(S)
    return {
        "numpy.matmul": _sha256(A @ B),
        "numpy.matmul_batched_gram": _sha256(np.swapaxes(F, -1, -2) @ F),
        "numpy.einsum": _sha256(np.einsum("nia,nib->nab", F, F)),
        "numpy.linalg.svd": _sha256(U, sigma, Vh),
        "numpy.linalg.qr": _sha256(Q, R),
        "numpy.linalg.eigh": _sha256(eigenvalues, eigenvectors),
        "numpy.sum": _sha256(np.sum(F, axis=-1), np.sum(F, axis=-2), np.sum(F, axis=(-2, -1)), np.sum(F, axis=0), np.sum(x)),
        "numpy.linalg.norm": _sha256(
            np.linalg.norm(F, axis=(-2, -1)), np.linalg.norm(F, axis=-1), np.linalg.norm(F, ord=2, axis=(-2, -1)), np.linalg.norm(x)
        ),
        "numpy.exp_log": _sha256(np.exp(x), np.log(x)),
    }


def _torch_computations(inputs: dict, device: str) -> tuple[dict, dict]:
    """(hashes, description) of torch's kernels on `device`, on the same inputs."""
    import torch

    A, B, F, S = (torch.from_numpy(inputs[name]).to(device) for name in ("A", "B", "F", "S"))
    eigenvalues, eigenvectors = torch.linalg.eigh(S)
    gram = F.mT @ F

    def numpy(*tensors):
        return [tensor.detach().cpu().numpy() for tensor in tensors]

    hashes = {
        "torch.matmul": _sha256(*numpy(A @ B)),
        "torch.matmul_float32": _sha256(*numpy(A.float() @ B.float())),
        "torch.matmul_batched_gram": _sha256(*numpy(gram)),
        "torch.linalg.eigh": _sha256(*numpy(eigenvalues, eigenvectors)),
        "torch.sum_norm": _sha256(*numpy(F.sum(dim=-1), F.sum(dim=(-2, -1)), torch.linalg.matrix_norm(F), torch.linalg.vector_norm(F, dim=-1))),
    }
    description = {
        "version": str(torch.__version__),
        "device": str(device),
        "cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "num_threads": torch.get_num_threads(),
    }
    if torch.device(device).type == "cuda":
        description["device_name"] = torch.cuda.get_device_name(device)
        description["device_capability"] = list(torch.cuda.get_device_capability(device))
        description["cuda"] = torch.version.cuda
    return hashes, description


def _numpy_blas() -> list[dict]:
    """numpy's BLAS as threadpoolctl sees it now: implementation, version, core, threads.

    Only the libraries loaded from numpy's own installation (its wheel's numpy.libs) when there are
    such, so that a BLAS another package happened to load does not change the fingerprint.
    """
    import numpy
    import threadpoolctl

    numpy_dir = Path(numpy.__file__).resolve().parent
    roots = (str(numpy_dir), str(numpy_dir.parent / "numpy.libs"))
    libraries = [info for info in threadpoolctl.threadpool_info() if info.get("user_api") == "blas"]
    own = [info for info in libraries if str(info.get("filepath", "")).startswith(roots)]
    keys = ("internal_api", "prefix", "version", "architecture", "threading_layer", "num_threads")
    described = [{key: info.get(key) for key in keys} for info in (own or libraries)]
    return sorted(described, key=lambda info: json.dumps(info, sort_keys=True))


def _numpy_simd() -> list[str]:
    """The SIMD targets numpy dispatches to on this CPU (baseline and enabled dispatch targets)."""
    try:
        from numpy._core import _multiarray_umath as umath
    except ImportError:  # numpy < 2
        from numpy.core import _multiarray_umath as umath
    features = getattr(umath, "__cpu_features__", {})
    baseline = list(getattr(umath, "__cpu_baseline__", []))
    return baseline + [target for target in getattr(umath, "__cpu_dispatch__", []) if features.get(target)]


def fingerprint_digest(fingerprint: dict) -> str:
    """sha256 over the canonical JSON of the fingerprint's fields (FINGERPRINT_FIELDS)."""
    body = {key: fingerprint.get(key) for key in FINGERPRINT_FIELDS}
    canonical = json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=True, allow_nan=False)
    return hashlib.sha256(canonical.encode("ascii")).hexdigest()


def rounding_fingerprint(torch_device: str | None = None) -> dict:
    """The rounding fingerprint of this process now (see the module docstring).

    torch_device: also hash torch's kernels on this device ("cpu", "cuda"); None leaves torch out
    (and does not import it). Returns {"version", "software", "blas", "numpy_simd", "torch",
    "computations", "sha256"}; "sha256" = fingerprint_digest of the rest. Takes a few milliseconds.
    """
    import numpy

    inputs = _fingerprint_inputs()
    computations = _numpy_computations(inputs)
    torch_description = None
    if torch_device is not None:
        try:
            torch_hashes, torch_description = _torch_computations(inputs, torch_device)
            computations.update(torch_hashes)
        except Exception as error:  # no torch, or no such device: say so (it then matches nothing that ran torch)
            torch_description = {"device": str(torch_device), "error": f"{type(error).__name__}: {error}".strip()}
    fingerprint = {
        "version": FINGERPRINT_VERSION,
        # another version of a library runs other code, whatever the bits of this small sample say
        "software": {"python": platform.python_version(), "numpy": numpy.__version__, "scipy": _version("scipy")},
        "blas": _numpy_blas(),
        "numpy_simd": _numpy_simd(),
        "torch": torch_description,
        "computations": computations,
    }
    fingerprint["sha256"] = fingerprint_digest(fingerprint)
    return fingerprint


def _flatten(value, prefix: str) -> dict:
    """{"blas[0].architecture": "Haswell", ...}: every leaf of a JSON value under its path."""
    if isinstance(value, dict):
        items = [(f"{prefix}.{key}", item) for key, item in value.items()]
    elif isinstance(value, list):
        items = [(f"{prefix}[{index}]", item) for index, item in enumerate(value)]
    else:
        return {prefix: value}
    flat = {}
    for path, item in items:
        flat.update(_flatten(item, path))
    return flat


def fingerprint_differences(recorded: dict | None, here: dict | None) -> list[str]:
    """What differs between two fingerprints, one short phrase per field, for people."""
    if not isinstance(recorded, dict):
        return ["the certificate records no rounding fingerprint"]
    if not isinstance(here, dict):
        return ["no rounding fingerprint was taken here"]
    differences = []
    changed = sorted(
        name for name in (recorded.get("computations") or {}).keys() | (here.get("computations") or {}).keys()
        if (recorded.get("computations") or {}).get(name) != (here.get("computations") or {}).get(name)
    )
    for key in FINGERPRINT_FIELDS:
        if key == "computations" or recorded.get(key) == here.get(key):
            continue
        old, new = _flatten(recorded.get(key), key), _flatten(here.get(key), key)
        if set(old) != set(new):  # a part present on one side only: show both whole
            differences.append(f"{key}: {json.dumps(recorded.get(key), sort_keys=True)} recorded, {json.dumps(here.get(key), sort_keys=True)} here")
            continue
        differences += [f"{name} {old[name]!r} recorded, {new[name]!r} here" for name in sorted(old) if old[name] != new[name]]
    if changed:
        differences.append("bits of " + ", ".join(changed))
    return differences


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
