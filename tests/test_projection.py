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


@pytest.mark.parametrize("name", list(projection.CONTROLS))
def test_a_wrong_project_to_manifold_fails(monkeypatch, name):
    """Each projection written wrong is a control of the certificate (projection.CONTROLS), used from there;
    put in project_to_manifold's place, it fails the checks by the detection factor."""
    broken = projection.CONTROLS[name][1]
    if name == "near_frames_kept":  # it falls back to the real projection, which the patch replaces
        real = ref.project_to_manifold
        broken = lambda A: A if np.allclose(np.swapaxes(A, -1, -2) @ A, np.eye(A.shape[-1]), atol=1e-6) else real(A)  # noqa: E731
    monkeypatch.setattr(ref, "project_to_manifold", broken)
    evidence = projection.projection_checks(2, get_profile("quick"), frames=400)
    worst = max(check.max_ratio for check in evidence.checks)
    assert worst >= DETECTION_FACTOR or np.isnan(worst)


def test_a_condition_range_shortened_to_1e2_lets_the_gram_control_escape(monkeypatch):
    """The claim must draw conditioning up to 1e8: shortened to 1e2 (where A (A^T A)^(-1/2) still has
    digits), its Gram-route control passes every check, and the certificate fails on it."""
    monkeypatch.setattr(projection, "CONDITION_LOG10", (0.0, 2.0))
    profile = get_profile("default")
    evidence = projection.projection_checks(0, profile, "gram_projection", "gram_projection:", profile.control_frames)  # as the certificate runs it
    assert max(check.max_ratio for check in evidence.checks) < DETECTION_FACTOR
