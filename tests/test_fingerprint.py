"""The rounding fingerprint: deterministic, sensitive to what decides rounding, cheap, self-hashing.

`certify verify` demands bit-for-bit residuals only where the re-run's fingerprint equals the
recorded one, so a fingerprint that stayed equal across a change of kernels or thread counts would
turn rounding into false "DIFFERS" verdicts, and one that changed between two runs in the same
setting would never demand bit for bit. Both directions are tested here.
"""

from __future__ import annotations

import copy
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from certify import environment

PROJECT_ROOT = Path(__file__).resolve().parent.parent


def test_fingerprint_is_deterministic_and_hashes_itself():
    first, second = environment.rounding_fingerprint(), environment.rounding_fingerprint()
    assert first == second
    assert first["sha256"] == environment.fingerprint_digest(first)
    assert set(first) == set(environment.FINGERPRINT_FIELDS) | {"sha256"}
    assert first["torch"] is None
    assert {"numpy.matmul", "numpy.linalg.svd", "numpy.linalg.eigh", "numpy.sum", "numpy.linalg.norm"} <= set(first["computations"])
    assert environment.fingerprint_differences(first, second) == []


def test_every_field_enters_the_hash():
    fingerprint = environment.rounding_fingerprint()
    for path in (("computations", "numpy.matmul"), ("software", "numpy"), ("numpy_simd",), ("version",)):
        edited = copy.deepcopy(fingerprint)
        node = edited
        for part in path[:-1]:
            node = node[part]
        node[path[-1]] = "changed"
        assert environment.fingerprint_digest(edited) != fingerprint["sha256"], path
    if fingerprint["blas"]:
        edited = copy.deepcopy(fingerprint)
        edited["blas"][0]["architecture"] = "another core"
        assert environment.fingerprint_digest(edited) != fingerprint["sha256"]
        assert environment.fingerprint_differences(fingerprint, edited) == [
            f"blas[0].architecture {fingerprint['blas'][0]['architecture']!r} recorded, 'another core' here"
        ]


def test_a_one_ulp_change_of_an_output_changes_its_hash():
    values = np.linspace(0.1, 1.0, 64)
    nudged = values.copy()
    nudged[17] = np.nextafter(nudged[17], 2.0)
    assert environment._sha256(values) != environment._sha256(nudged)
    assert environment._sha256(values) == environment._sha256(values.copy())
    assert environment._sha256(values) != environment._sha256(values.reshape(8, 8))  # shape is hashed too


def test_blas_thread_count_is_part_of_the_fingerprint():
    threadpoolctl = pytest.importorskip("threadpoolctl")
    fingerprint = environment.rounding_fingerprint()
    if not fingerprint["blas"]:
        pytest.skip("threadpoolctl sees no BLAS library of numpy here")
    threads = fingerprint["blas"][0]["num_threads"]
    with threadpoolctl.threadpool_limits(limits=threads + 1, user_api="blas"):
        more = environment.rounding_fingerprint()
    if more["blas"][0]["num_threads"] == threads:
        pytest.skip("this BLAS build cannot raise its thread count")
    assert more["sha256"] != fingerprint["sha256"]
    assert f"blas[0].num_threads {threads} recorded, {threads + 1} here" in environment.fingerprint_differences(fingerprint, more)


def test_torch_thread_count_changes_the_fingerprint():
    torch = pytest.importorskip("torch")
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = environment.rounding_fingerprint("cpu")
        torch.set_num_threads(2)
        two = environment.rounding_fingerprint("cpu")
    finally:
        torch.set_num_threads(before)
    assert one["torch"]["num_threads"] == 1 and two["torch"]["num_threads"] == 2
    assert one["sha256"] != two["sha256"]
    assert "torch.num_threads 1 recorded, 2 here" in environment.fingerprint_differences(one, two)
    assert one["torch"]["cpu_capability"] == torch.backends.cpu.get_cpu_capability()
    assert {"torch.matmul", "torch.linalg.eigh", "torch.matmul_float32"} <= set(one["computations"])


def test_a_fingerprint_with_torch_differs_from_one_without():
    pytest.importorskip("torch")
    with_torch, without = environment.rounding_fingerprint("cpu"), environment.rounding_fingerprint()
    assert with_torch["sha256"] != without["sha256"]
    differences = environment.fingerprint_differences(with_torch, without)
    assert differences[-1].startswith("bits of torch.")


def test_fingerprint_without_torch_does_not_import_torch():
    """P1..P5 never import torch (its import alone costs seconds); their fingerprint must not either."""
    code = "import sys; from certify import environment; environment.rounding_fingerprint(); print('torch' in sys.modules)"
    completed = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=PROJECT_ROOT, timeout=120)
    assert completed.returncode == 0, completed.stderr
    assert completed.stdout.strip() == "False"


def test_fingerprint_is_the_same_in_another_process():
    """What verify relies on: a re-run in a fresh process on this machine fingerprints alike (with one
    BLAS thread, as every certify command and this test session run)."""
    code = ("from certify import environment, execution\nwith execution.limit_blas_threads():\n"
            "    print(environment.rounding_fingerprint()['sha256'])")
    completed = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=PROJECT_ROOT, timeout=120)
    assert completed.returncode == 0, completed.stderr
    assert completed.stdout.strip() == environment.rounding_fingerprint()["sha256"]


def test_missing_torch_device_is_recorded_not_raised():
    fingerprint = environment.rounding_fingerprint("no-such-device")
    assert fingerprint["torch"]["device"] == "no-such-device" and "error" in fingerprint["torch"]
    assert not any(name.startswith("torch.") for name in fingerprint["computations"])


def test_another_openblas_core_on_the_same_machine_changes_the_fingerprint():
    """The case that "same environment" could not see: same CPU string, Python, numpy and OpenBLAS,
    but another kernel. A DYNAMIC_ARCH OpenBLAS takes its core from OPENBLAS_CORETYPE when set,
    which stands in for a CPU of another generation."""
    here = environment.rounding_fingerprint()
    if not here["blas"] or here["blas"][0]["internal_api"] != "openblas":
        pytest.skip("numpy's BLAS here is not OpenBLAS")
    other_core = "Haswell" if here["blas"][0]["architecture"] == "Sandybridge" else "Sandybridge"
    code = "import json; from certify import environment; print(json.dumps(environment.rounding_fingerprint()))"
    completed = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, cwd=PROJECT_ROOT, timeout=120,
        env={**os.environ, "OPENBLAS_CORETYPE": other_core},
    )
    assert completed.returncode == 0, completed.stderr
    other = json.loads(completed.stdout)
    if other["blas"][0]["architecture"] != other_core:
        pytest.skip(f"this OpenBLAS does not honour OPENBLAS_CORETYPE={other_core}")
    assert other["sha256"] != here["sha256"]
    differences = environment.fingerprint_differences(here, other)
    assert any(d.startswith("blas[0].architecture") for d in differences)
    # Sandybridge kernels have no FMA, Haswell's do: a length-150 inner product rounds differently
    assert "numpy.matmul" in differences[-1], differences


def test_another_torch_cpu_capability_changes_the_fingerprint():
    """torch picks its CPU kernels by capability (ATEN_CPU_CAPABILITY overrides the choice); the
    cross-check's residuals differ in their last bits between capabilities, so must its fingerprint."""
    torch = pytest.importorskip("torch")
    here = environment.rounding_fingerprint("cpu")
    if torch.backends.cpu.get_cpu_capability() == "DEFAULT":
        pytest.skip("this CPU runs torch's default kernels already")
    code = "import json; from certify import environment; print(json.dumps(environment.rounding_fingerprint('cpu')))"
    completed = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, cwd=PROJECT_ROOT, timeout=300,
        env={**os.environ, "ATEN_CPU_CAPABILITY": "default"},
    )
    assert completed.returncode == 0, completed.stderr
    other = json.loads(completed.stdout)
    assert other["torch"]["cpu_capability"] == "DEFAULT"
    assert other["sha256"] != here["sha256"]
    assert f"torch.cpu_capability 'DEFAULT' recorded, {here['torch']['cpu_capability']!r} here" in environment.fingerprint_differences(other, here)
