"""The claim 'projection' (propositions/projection.py): reference_impl.project_to_manifold is the
nearest frame; its controls and projections written wrong the way real ones are fail it."""

import numpy as np
import pytest

import reference_impl as ref
from propositions import get_profile, projection
from propositions._common import DETECTION_FACTOR


def test_project_to_manifold_passes_and_every_control_is_detected():
    result = projection.CLAIM.run(1, get_profile("quick"))
    assert result.verdict == "pass", result.failures()
    assert {"on_manifold", "polar_symmetry", "polar_factor", "idempotent", "equivariance", "scale_free"} <= {c.name for c in result.checks}
    try:
        import torch_impl  # noqa: F401
        assert {"polar_retract", "polar_retract_refuses"} <= {c.name for c in result.checks}
    except ImportError:
        pass
    assert all(control.detected for control in result.controls)
    assert all(step.reduced for step in result.symbolic.steps)


def _eigh_polar(A):
    """polar(A) = A (A^T A)^(-1/2) by eigh: right in exact arithmetic, but forming A^T A squares the
    condition number (no digit left at cond 1e8, which the claim's graded matrices reach) and overflows
    at 2^512."""
    eigenvalues, vectors = np.linalg.eigh(np.swapaxes(A, -1, -2) @ A)
    return A @ (vectors * (1 / np.sqrt(eigenvalues))[..., None, :]) @ np.swapaxes(vectors, -1, -2)


def _transposed_factor(A):
    U, _, Vh = np.linalg.svd(A, full_matrices=False)
    return U @ np.swapaxes(Vh, -1, -2)  # V where V^T was meant


def _one_newton_step(A):
    """One Newton-Schulz step from A, as if A were already close to St(d, r)."""
    return A @ (1.5 * np.eye(A.shape[-1]) - 0.5 * np.swapaxes(A, -1, -2) @ A)


def _unscaled_qr(A):
    return np.linalg.qr(A)[0]


_polar = ref.project_to_manifold


def _near_frames_kept(A):
    """A batch whose every member is already close to St returned as it is (a shortcut)."""
    close = np.allclose(np.swapaxes(A, -1, -2) @ A, np.eye(A.shape[-1]), atol=1e-6)
    return A if close else _polar(A)


def _float32_polar(A):
    """The polar factor computed in float32 (overflows at the large scales, loses digits at all)."""
    return _polar(A.astype(np.float32)).astype(np.float64)


@pytest.mark.parametrize("broken", [_eigh_polar, _transposed_factor, _one_newton_step, _unscaled_qr, _near_frames_kept, _float32_polar])
def test_a_wrong_project_to_manifold_fails(monkeypatch, broken):
    monkeypatch.setattr(ref, "project_to_manifold", broken)
    evidence = projection.projection_checks(2, get_profile("quick"), frames=400)
    worst = max(check.max_ratio for check in evidence.checks)
    assert worst >= DETECTION_FACTOR or np.isnan(worst)
