"""The bounds that hold one kernel step to the float64 reference step, frame by frame.

A kernel (torch_impl's functional step, or the optimizer class that calls it) evaluates the step at
its own unit roundoffs and on its own retraction route, from inputs that differ from the
reference's by their storage rounding and by the transport of the first moment, which the kernel
performs itself. `step_error_bound` adds the one rounding analysis of the step
(kit/step_analysis.step_error) for the kernel and for the reference: their outputs are within the
sum. Used by the cross-check and by the optimizer-class claim; nothing here is taken from the
kernel under test.
"""

from __future__ import annotations

import math

import numpy as np

import reference_impl as ref

from . import step_analysis
from .bounds import projection
from .step_analysis import InputErrors, Rounding, step_error
from .step_analysis import step_norms_of as _step_norms

U64 = step_analysis.U64


def step_error_bound(d, r, config, quantities, rounding: Rounding, inputs: InputErrors = InputErrors(), *, reference=True):
    """Bounds per frame on ||W+ - W+_ref||_F, ||m+ - m+_ref||_F, |v+ - v+_ref| and, for stage 3's m
(before its transport, as the kernel returns it), ||m - m_ref||_F ("moment") of a kernel step.

    The kernel's evaluation (unit roundoffs and route of `rounding`, at an input within `inputs` of
    the reference's: its storage rounding, the transport it performs itself) is within
    step_analysis.step_error of the exact step at the reference's input, and so is the reference's own
    float64 evaluation (the SVD route, exact input): their distance is at most the sum (reference=False:
    the kernel's term alone, for two kernel runs compared with each other's exact steps). quantities:
    `reference_quantities`. "e_ret" is the kernel's retraction term alone.

    A zero reference output that the kernel must reproduce exactly (v^ = 0, m = 0) gets the
    smallest positive normal number as its bound (docs/claims.md, tolerances: bounds are > 0).
    """
    norms = _step_norms(quantities, r)
    kernel = step_error(d, r, config, norms, rounding, inputs)
    total = {"W": kernel.W, "m": kernel.m_plus, "v": kernel.v, "moment": kernel.m}
    if reference:
        own = step_error(d, r, config, norms, Rounding(u_c=U64, route="svd"))
        total = {"W": total["W"] + own.W, "m": total["m"] + own.m_plus, "v": total["v"] + own.v, "moment": total["moment"] + own.m}
    tiny = np.finfo(np.float64).tiny
    with np.errstate(invalid="ignore", divide="ignore"):
        kappa = quantities["A_2"] / (quantities["sigma_min"] - kernel.A)
    return {
        "W": np.where(kernel.well_posed, total["W"], np.inf),
        "m": np.maximum(np.where(kernel.well_posed, total["m"], np.inf), tiny),
        "v": np.maximum(total["v"], tiny),
        "moment": np.maximum(total["moment"], tiny),
        "e_ret": step_analysis.retraction_error(d, r, rounding, kappa, config.trust_radius),
        "well_posed": kernel.well_posed,
    }


def kernel_inputs(rounding: Rounding, r: int, q: dict, moment_error) -> InputErrors:
    """The kernel's input errors: W, G rounded to the storage dtype (none in float64), m and v to the
    state dtype (none in float64), and the moment's transport (`transport_roundoff`)."""
    u_W = rounding.u_W if rounding.u_W > U64 else 0.0
    u_state = rounding.u_state if rounding.u_state > U64 else 0.0
    return InputErrors(W=u_W * math.sqrt(r), G_rel=u_W, m=u_state * q["m_old"] + moment_error, v=u_state * q["v_old"])


def reference_moment(W, G, state, config):
    """Stage 3's m of the reference step (before its transport): beta1 m + (1 - beta1) P_W(G~)."""
    beta1 = config.betas[0]
    return beta1 * state.m + (1 - beta1) * ref.project_tangent(W, G + config.weight_decay * W, validate=False)


def transport_roundoff(d, r, u_c, moment_in):
    """The input error of m for a kernel that transports its incoming moment itself
    (functional.project_moment), per frame.

    Stage 8's m+ = P_W(m_pre) is rounded once by the reference (float64) and once more inside the
    kernel's projection of beta1 m_pre + (1 - beta1) G~ (compute roundoff u_c): the kernel's m differs
    from the reference's by at most the two projections' rounding (the projection stage at X =
    ||m_pre||). This is the transport that step_error charges to m+ at the end of a step, charged where
    the kernel performs it. 0 where m_pre = 0."""
    norm_in = ref.frobenius(np.asarray(moment_in))
    return sum(np.asarray(projection(d=d, r=r, u_c=unit, X=norm_in, X_err=0.0, W_err=0.0)) for unit in (u_c, U64))


__all__ = ["step_error_bound", "kernel_inputs", "reference_moment", "transport_roundoff", "U64"]
