"""Copies of torch_impl.functional's step with one precision or scale mistake each, of the kinds a
float32/bfloat16 port or a "simplification" of the kernel makes. Each is installed over the real
function it replaces (`install(monkeypatch, name)`), so the cross-check runs the broken kernel
wherever it calls the real one. BUGS: name -> (function replaced, replacement, the check that must
catch it). Some are the cross-check's own controls written differently; the others are held out
from its controls (the certificate never saw them)."""

from __future__ import annotations

import math

import torch

from torch_impl import functional as F


def _cap(m, coefficient, trust_radius):
    if not math.isinf(trust_radius):
        norm = torch.linalg.vector_norm(m, dim=(-2, -1)) * coefficient.abs()
        coefficient = coefficient * torch.where(norm > trust_radius, trust_radius / norm, 1.0)
    return coefficient


def bias_corrections_in_float32(m, v, step_count, lr, beta1, beta2, eps, trust_radius):
    """step_coefficient with beta^t and 1 - beta^t formed from beta as a float32 tensor."""
    work = v.dtype
    count = step_count.to(work) if torch.is_tensor(step_count) else step_count
    bias_correction1 = 1 - torch.tensor(beta1, dtype=work) ** count
    bias_correction2 = 1 - torch.tensor(beta2, dtype=work) ** count
    root_v_hat = torch.sqrt(v / bias_correction2)
    return _cap(m, torch.where(root_v_hat > 0, (-lr / bias_correction1) / (root_v_hat + eps), 0.0), trust_radius)


def first_correction_in_float32(m, v, step_count, lr, beta1, beta2, eps, trust_radius):
    """Only 1 - beta1^t formed in the compute dtype (beta2's in float64, as declared)."""
    work = v.dtype
    t = step_count.to(torch.float64) if torch.is_tensor(step_count) else step_count
    bias_correction1 = (1 - torch.tensor(beta1, dtype=work) ** t.to(work) if torch.is_tensor(t) else 1 - torch.tensor(beta1, dtype=work) ** t)
    bias_correction2 = (1 - torch.pow(beta2, t)).to(work) if torch.is_tensor(t) else 1 - beta2**t
    root_v_hat = torch.sqrt(v / bias_correction2)
    return _cap(m, torch.where(root_v_hat > 0, (-lr / bias_correction1) / (root_v_hat + eps), 0.0), trust_radius)


def per_frame_counts_in_float32(m, v, step_count, lr, beta1, beta2, eps, trust_radius):
    """The per-frame count path (the optimizer's) with torch.pow in the compute dtype; the int path as declared."""
    if not torch.is_tensor(step_count):
        return _real["step_coefficient"](m, v, step_count, lr, beta1, beta2, eps, trust_radius)
    count = step_count.to(v.dtype)
    root_v_hat = torch.sqrt(v / (1 - torch.pow(beta2, count)))
    numerator = -lr / (1 - torch.pow(beta1, count))
    return _cap(m, torch.where(root_v_hat > 0, torch.reciprocal(root_v_hat + eps) * numerator, 0.0), trust_radius)


def _step(W, G, m, v, t, lr=1e-3, beta1=0.9, beta2=0.999, eps=1e-8, trust_radius=0.5, weight_decay=0.0, *, bug,
          retraction_method="auto", sync_free=False):
    """functional.stiefel_adam_step written out, with `bug` changing one line of it."""
    work = F.compute_dtype(W.dtype)
    storage = W.dtype
    batch_shape = W.shape[:-2]
    d, r = W.shape[-2], W.shape[-1]
    W_c = F._as_batch3(W.to(work))
    G_c = F.decayed_gradient(W_c, F._as_batch3(G.to(work)), weight_decay)
    if bug == "projection_in_storage_dtype":
        m_c, WtG = F.project_moment(W_c.to(storage).to(work), G_c.to(storage).to(work), F._as_batch3(m.to(storage).to(work)), beta1)
        m_c = m_c.to(storage).to(work)
    else:
        m_c, WtG = F.project_moment(W_c, G_c, F._as_batch3(m.to(work)), beta1)
    drift = F.frame_drift_bound(d, r, W.dtype, trust_radius, retraction_method)
    if bug == "square_in_storage_dtype":
        scale = F.increment_scale(beta2, d * r)
        increment = F.gradient_norm_squared(W_c, (G_c * scale).to(storage).to(work), (WtG * scale).to(storage).to(work), drift)
        v_c = torch.add(v.to(work).reshape(-1) * beta2, increment)
    else:
        v_c = F.updated_second_moment(W_c, G_c, WtG, v.to(work).reshape(-1), beta2, drift, sync_free)
    if bug in ("moments_in_storage_dtype", "second_moment_in_storage_dtype"):
        v_c = v_c.to(storage).to(work)
        if bug == "moments_in_storage_dtype":
            m_c = m_c.to(storage).to(work)
    if bug == "flush_subnormal_v":
        v_c = torch.where(v_c < torch.finfo(work).tiny, torch.zeros_like(v_c), v_c)
    step_count = t.reshape(-1) + 1 if torch.is_tensor(t) else t + 1
    coefficient = F.step_coefficient(m_c, v_c, step_count, lr, beta1, beta2, eps, trust_radius)
    if bug == "coefficient_in_storage_dtype":
        coefficient = coefficient.to(storage).to(work)
    xi = m_c * coefficient[:, None, None]
    if bug in ("shortcut_retraction", "shortcut_retraction_bfloat16") and (bug == "shortcut_retraction" or storage == torch.bfloat16):
        eigenvalues, eigenvectors = torch.linalg.eigh(torch.eye(r, dtype=work) + xi.mT @ xi)
        W_new = (W_c + xi) @ ((eigenvectors * eigenvalues.rsqrt().unsqueeze(-2)) @ eigenvectors.mT)
    else:
        W_new = F.polar_factor(torch.addcmul(W_c, m_c, coefficient[:, None, None]), trust_radius, retraction_method)
    return W_new.reshape(W.shape).to(W.dtype), m_c.reshape(W.shape), v_c.reshape(batch_shape)


def _step_with(bug):
    def step(*args, **kwargs):
        return _step(*args, bug=bug, **kwargs)

    return torch.no_grad()(step)


def unscaled_square(W, G_decayed, WtG, v, beta2, drift, sync_free=False):
    """updated_second_moment from ||g||^2 at the gradient's own scale (it overflows before v does)."""
    g_squared = F.gradient_norm_squared(W, G_decayed, WtG, drift, sync_free)
    return torch.add(v * beta2, g_squared, alpha=(1 - beta2) / (W.shape[-2] * W.shape[-1]))


def floor_at_tiny(W, G_decayed, WtG, v, beta2, drift, sync_free=False):
    """updated_second_moment floored at the compute dtype's smallest normal number."""
    updated = _real["updated_second_moment"](W, G_decayed, WtG, v, beta2, drift, sync_free)
    return torch.clamp(updated, min=torch.finfo(updated.dtype).tiny)


def eps_floor(m, v, step_count, lr, beta1, beta2, eps, trust_radius):
    """step_coefficient dividing by sqrt(v^) + eps + 1e-30."""
    return _real["step_coefficient"](m, v, step_count, lr, beta1, beta2, eps + 1e-30, trust_radius)


def clamped_denominator(m, v, step_count, lr, beta1, beta2, eps, trust_radius):
    """step_coefficient with the denominator clamped at 1e-20 (a guard against tiny v)."""
    work = v.dtype
    t = step_count.to(torch.float64) if torch.is_tensor(step_count) else step_count
    bias_correction1 = (1 - torch.pow(beta1, t)).to(work) if torch.is_tensor(t) else 1 - beta1**t
    bias_correction2 = (1 - torch.pow(beta2, t)).to(work) if torch.is_tensor(t) else 1 - beta2**t
    root_v_hat = torch.sqrt(v / bias_correction2)
    denominator = torch.clamp(root_v_hat + eps, min=1e-20)
    return _cap(m, torch.where(root_v_hat > 0, (-lr / bias_correction1) / denominator, 0.0), trust_radius)


def eps_in_float32(m, v, step_count, lr, beta1, beta2, eps, trust_radius):
    """step_coefficient with eps made a float32 tensor whatever the compute dtype (eps = 1e-8 then
    differs from the float64 eps by about 1e-16: nothing at sqrt(v^) = 1, a relative 1e-8 of the
    step where sqrt(v^) is near eps)."""
    if not torch.is_tensor(eps):
        eps = torch.tensor(eps, dtype=torch.float32)
    return _real["step_coefficient"](m, v, step_count, lr, beta1, beta2, eps, trust_radius)


_real = {"step_coefficient": F.step_coefficient, "updated_second_moment": F.updated_second_moment}

# name -> (the function of torch_impl.functional replaced, the replacement, the check that must catch it)
BUGS = {
    "bias_corrections_in_float32": ("step_coefficient", bias_corrections_in_float32, "float32/frame"),
    "first_correction_in_float32": ("step_coefficient", first_correction_in_float32, "float32/frame"),
    "per_frame_counts_in_float32": ("step_coefficient", per_frame_counts_in_float32, "float32/frame"),
    "moments_in_storage_dtype": ("stiefel_adam_step", _step_with("moments_in_storage_dtype"), "bfloat16/second_moment"),
    "second_moment_in_storage_dtype": ("stiefel_adam_step", _step_with("second_moment_in_storage_dtype"), "bfloat16/second_moment"),
    "projection_in_storage_dtype": ("stiefel_adam_step", _step_with("projection_in_storage_dtype"), "bfloat16/first_moment"),
    "square_in_storage_dtype": ("stiefel_adam_step", _step_with("square_in_storage_dtype"), "bfloat16/second_moment"),
    "coefficient_in_storage_dtype": ("stiefel_adam_step", _step_with("coefficient_in_storage_dtype"), "bfloat16/frame_rounding"),
    "shortcut_retraction": ("stiefel_adam_step", _step_with("shortcut_retraction"), "drift_correction"),
    "shortcut_retraction_bfloat16": ("stiefel_adam_step", _step_with("shortcut_retraction_bfloat16"), "long_run_feasibility"),
    # the scan's (3, 2) frames form g itself (no Gram identity, whose ||G~||^2 is larger): in float32 the
    # bug's ||g||^2 stays finite up to the predicted domain's end (k = 62) and no step differs there;
    # in float64 it overflows at k = 511, inside the domain
    "unscaled_square": ("updated_second_moment", unscaled_square, "float64/P2_exponent_range"),
    "floor_at_tiny": ("updated_second_moment", floor_at_tiny, "float32/P2_subnormal_band"),
    "flush_subnormal_v": ("stiefel_adam_step", _step_with("flush_subnormal_v"), "float32/P2_subnormal_band"),
    "eps_floor": ("step_coefficient", eps_floor, "float64/P2_exponent_range"),
    "clamped_denominator": ("step_coefficient", clamped_denominator, "float64/P2_exponent_range"),
    "eps_in_float32": ("step_coefficient", eps_in_float32, "frame"),
}


def install(monkeypatch, name: str) -> str:
    """Replace the function of torch_impl.functional that bug `name` breaks; returns the check that
    must catch it."""
    target, replacement, check = BUGS[name]
    monkeypatch.setattr(F, target, replacement)
    return check
