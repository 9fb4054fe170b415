"""A float32 NumPy StiefelAdam step (docs/algorithm.md, every stage in float32), and five broken
variants of it, each a mistake of the kind a port to float32 makes.

The correct step is an implementation to certify like any other ("numpy:propositions.kit.float32_step:step"
for certify's adapters). The broken ones are P1's precision controls (CONTROLS, AdaptedVariants
stored in float32): a certificate of an implementation under test at float32 runs them, so that the
bounds taken at float32's unit roundoff are shown to catch a port's mistakes, not only the float64
ones (propositions/p1_steepest_descent.float32_control)."""

from __future__ import annotations

import numpy as np

import reference_impl as ri

from .observability import AdaptedVariant

F = np.float32


def _sym(A):
    return 0.5 * (A + np.swapaxes(A, -1, -2))


def _project(W, X):
    return X - W @ _sym(np.swapaxes(W, -1, -2) @ X)


def _polar(A):
    U, _, Vh = np.linalg.svd(A, full_matrices=False)
    return U @ Vh


def _qr(A):
    Q, R = np.linalg.qr(A)
    signs = np.sign(np.diagonal(R, axis1=-2, axis2=-1))
    return Q * np.where(signs == 0, 1, signs)[..., None, :].astype(A.dtype)


def make_step(*, mean_square_divisor=True, transport=True, bias_correct_m=True, retraction=_polar, clip_factor=1.0,
              count_steps=True):
    """A float32 step; the keywords break one stage each (the defaults give the correct step)."""

    def step(W, G, state, config):
        W = np.asarray(W, dtype=F)
        G = np.asarray(G, dtype=F)
        m_in = np.asarray(state.m, dtype=F)
        v_in = np.asarray(state.v, dtype=F)
        beta1, beta2 = (F(b) for b in config.betas)
        # 1 - beta formed in float64, then rounded: F(1) - F(0.999) would carry F(0.999)'s rounding,
        # u / (1 - beta2) = 1000 u relative, which the analysis (stage 4) does not allow
        one_minus_beta1, one_minus_beta2 = F(1 - config.betas[0]), F(1 - config.betas[1])
        d, r = W.shape[-2:]
        t = state.t + 1 if count_steps else max(state.t, 1)
        g = _project(W, G + F(config.weight_decay) * W)
        m = beta1 * m_in + one_minus_beta1 * g
        square = np.sum(g * g, axis=(-2, -1))
        v = beta2 * v_in + one_minus_beta2 * (square / F(d * r) if mean_square_divisor else square)
        m_hat = m / F(1 - config.betas[0] ** t) if bias_correct_m else m
        v_hat = v / F(1 - config.betas[1] ** t)
        q = np.sqrt(v_hat) + F(config.eps)
        with np.errstate(divide="ignore", invalid="ignore"):
            xi = np.where((v_hat > 0)[..., None, None], -F(config.lr) * m_hat / q[..., None, None], F(0))
        norm = np.sqrt(np.sum(xi * xi, axis=(-2, -1)))
        radius = F(config.trust_radius * clip_factor) if np.isfinite(config.trust_radius) else np.inf
        with np.errstate(divide="ignore", invalid="ignore"):
            scale = np.where(norm > radius, radius / norm, F(1)).astype(F)
        xi = xi * scale[..., None, None]
        W_new = retraction(W + xi).astype(F)
        m_new = _project(W_new, m) if transport else m
        return W_new, ri.StiefelAdamState(m=m_new.astype(np.float64), v=np.asarray(v, dtype=np.float64), t=t)

    return step


step = make_step()

BROKEN = {
    "mean_square_without_1_over_dr": make_step(mean_square_divisor=False),
    "first_moment_not_transported": make_step(transport=False),
    "no_bias_correction_of_m": make_step(bias_correct_m=False),
    "qr_retraction": make_step(retraction=_qr),
    "step_count_not_advanced": make_step(count_steps=False),
}
mean_square_without_1_over_dr = BROKEN["mean_square_without_1_over_dr"]
first_moment_not_transported = BROKEN["first_moment_not_transported"]
no_bias_correction_of_m = BROKEN["no_bias_correction_of_m"]
qr_retraction = BROKEN["qr_retraction"]
step_count_not_advanced = BROKEN["step_count_not_advanced"]


def _control(name: str, description: str) -> AdaptedVariant:
    return AdaptedVariant(f"float32_{name}", description, (), ri.init, BROKEN[name],
                          spec=f"numpy:propositions.kit.float32_step:{name}", dtype="float32")


CONTROL_DESCRIPTIONS = {
    "mean_square_without_1_over_dr": "a float32 NumPy step whose second moment takes ||g||^2, not ||g||^2 / (d r)",
    "first_moment_not_transported": "a float32 NumPy step that keeps m at the old frame instead of projecting it onto the new one",
    "no_bias_correction_of_m": "a float32 NumPy step without m's bias correction 1 / (1 - beta1^t)",
    "qr_retraction": "a float32 NumPy step retracting by the sign-fixed QR factor, not the polar factor",
    "step_count_not_advanced": "a float32 NumPy step whose count t stays at 1, so the bias corrections never decay",
}
CONTROLS = {f"float32_{name}": _control(name, text) for name, text in CONTROL_DESCRIPTIONS.items()}
