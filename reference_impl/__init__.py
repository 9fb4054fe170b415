"""Pure-NumPy float64 reference of StiefelAdam (docs/mathematics.md and docs/algorithm.md).

Pure functions on float64 arrays of shape (..., d, r), batched over the leading axes; inputs are
never modified; bad input raises ValueError naming the argument and the rule. The reference never
imports torch.
"""

from ._validation import UNIT_ROUNDOFF, manifold_tolerance
from .adam import (
    StiefelAdamConfig,
    StiefelAdamState,
    clip_to_trust_region,
    frobenius,
    init,
    run_trajectory,
    scale_free_direction,
    step,
    step_with_direction,
)
from .controls import CONTROL_NAMES, VARIANTS, Variant, get_variant, riemannian_gradient
from .manifold import (
    RETRACTION_METHODS,
    feasibility,
    haar_from_gaussian,
    polar_factor,
    polar_retract,
    project_tangent,
    project_to_manifold,
    random_orthogonal,
    random_point,
    random_signed_permutation,
    random_tangent,
    retraction_agreement,
    skew,
    sym,
)

__version__ = "0.1.0"

__all__ = [
    "UNIT_ROUNDOFF",
    "manifold_tolerance",
    "StiefelAdamConfig",
    "StiefelAdamState",
    "init",
    "step",
    "step_with_direction",
    "run_trajectory",
    "scale_free_direction",
    "clip_to_trust_region",
    "frobenius",
    "CONTROL_NAMES",
    "VARIANTS",
    "Variant",
    "get_variant",
    "riemannian_gradient",
    "RETRACTION_METHODS",
    "feasibility",
    "haar_from_gaussian",
    "polar_factor",
    "polar_retract",
    "project_tangent",
    "project_to_manifold",
    "random_orthogonal",
    "random_point",
    "random_signed_permutation",
    "random_tangent",
    "retraction_agreement",
    "skew",
    "sym",
]
