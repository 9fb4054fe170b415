"""The PyTorch kernel under the cross-check, and its broken variants (the cross-check's controls).

Each broken variant is built from the public stages of torch_impl.functional (the production kernel
has no switch for them) and replaces one stage, keeping the others. Each is a mistake of the kind a
port or a "simplification" of the kernel makes:

* elementwise_second_moment: Adam's elementwise v in place of one scalar per frame (stages 4-7);
* muon_newton_schulz: Muon's tuned Newton-Schulz coefficients as the retraction (not a polar factor);
* moments_in_storage_dtype: m and v kept in the storage dtype (bfloat16 for bfloat16 frames), where
  the kernel declares float32;
* bias_power_in_compute_dtype: beta^t and 1 - beta^t formed in the compute dtype (float32), where
  the kernel declares float64;
* drift_not_corrected: the retraction (W + xi)(I + xi^T xi)^(-1/2), which never corrects drift;
* unscaled_square: ||g||^2 formed at the gradient's scale, which overflows before v does;
* floor_on_v: v floored at the smallest normal number (a guard against 0 / 0);
* hidden_eps: 1e-30 added to the denominator whatever eps is.
* first_correction_in_float32, per_frame_counts_in_float32: 1 - beta1^t, or both corrections of the
  per-frame counts, formed in the compute dtype;
* clamped_denominator, eps_in_float32: a guard at 1e-20 on sqrt(v^) + eps; eps taken in float32;
* projection_in_storage_dtype, square_in_storage_dtype, second_moment_in_storage_dtype,
  coefficient_in_storage_dtype: one stage's result rounded to the storage dtype;
* flush_subnormal_v: a subnormal v flushed to 0;
* drift_not_corrected_in_bfloat16: drift_not_corrected's retraction for bfloat16 frames only.

Each runs through the check where it shows (propositions.crosscheck.CONTROL_RUNS): the float64
lock-step, the declared-precision lock-step in the dtype where it differs, the drift correction, or
the exponent-range scan. The tests use them from here.

A variant is called as variant(W, G, m, v, t, config) with the arguments of
functional.stiefel_adam_step (t an int or a per-frame float64 tensor) and returns (W+, m, v) as it
does. Part of the cross-check; it defines no claim.
"""

from __future__ import annotations

import math

import numpy as np

from propositions.kit import step_analysis

# torch is imported by the functions that use it: `import propositions` works without torch.

# Muon's tuned quintic (3.4445, -4.7750, 2.0315), 5 iterations on A / ||A||_F: it maps singular
# values into a band around 1 instead of to 1 (docs/algorithm.md#pitfalls); a control, never a retraction.
MUON_COEFFICIENTS = (3.4445, -4.7750, 2.0315)


def torch_dtype(dtype):
    """The torch dtype of a name ("float32"); a torch dtype passes through."""
    import torch

    return getattr(torch, dtype) if isinstance(dtype, str) else dtype


def dtype_name(dtype) -> str:
    """The name ("float32") of a torch dtype; a name passes through."""
    return dtype if isinstance(dtype, str) else str(dtype).replace("torch.", "")


def state_dtype(dtype):
    """The torch dtype of m and v for frames stored in `dtype`, as the certifier's analysis takes it
    (step_analysis.COMPUTE_DTYPES: float64 for float64, float32 otherwise)."""
    return torch_dtype(step_analysis.COMPUTE_DTYPES[dtype_name(dtype)])


def to_torch(x: np.ndarray, dtype, device):
    """A float64 array as a tensor of `dtype` (rounded to it) on `device`."""
    import torch

    return torch.from_numpy(np.ascontiguousarray(x)).to(device=device, dtype=torch_dtype(dtype))


def to_numpy(x) -> np.ndarray:
    """A tensor's values as a float64 array on the host (exact: every dtype here embeds in float64)."""
    import torch

    return x.detach().to(device="cpu", dtype=torch.float64).numpy()


def stored(x: np.ndarray, dtype) -> np.ndarray:
    """x rounded to `dtype` (a torch dtype or its name), as a float64 array: the values a kernel with
    that storage receives."""
    return to_numpy(to_torch(x, dtype, "cpu"))


def run_kernel(W, G, m, v, t, config, variant: str = "stiefel_adam"):
    """One step of the kernel variant `variant` (a name of KERNEL_VARIANTS)."""
    return KERNEL_VARIANTS[variant](W, G, m, v, t, config)


def stiefel_adam_kernel(W, G, m, v, t, config):
    """The production kernel, functional.stiefel_adam_step, with config's hyper-parameters."""
    from torch_impl.functional import stiefel_adam_step

    beta1, beta2 = config.betas
    return stiefel_adam_step(W, G, m, v, t, config.lr, beta1, beta2, config.eps, config.trust_radius, config.weight_decay)


def _stages_1_to_3(W, G, m, config):
    """The production kernel's first stages (frames as a (B, d, r) batch in the compute dtype):
    returns (W, G~, m tangent at W, W^T G~)."""
    from torch_impl import functional

    work = functional.compute_dtype(W.dtype)
    d, r = W.shape[-2], W.shape[-1]
    W_c, G_c, m_c = (x.to(work).reshape(-1, d, r) for x in (W, G, m))
    G_decayed = functional.decayed_gradient(W_c, G_c, config.weight_decay)
    m_new, WtG = functional.project_moment(W_c, G_decayed, m_c, config.betas[0])
    return W_c, G_decayed, m_new, WtG


def _second_moment(W, W_c, G_decayed, m_new, WtG, v, config):
    """The production stage 4 on the batch: v as one scalar per frame, shape (B,)."""
    from torch_impl import functional

    d, r = W.shape[-2], W.shape[-1]
    drift = functional.frame_drift_bound(d, r, W.dtype, config.trust_radius)
    return functional.updated_second_moment(W_c, G_decayed, WtG, v.to(W_c.dtype).reshape(-1), config.betas[1], drift)


def _next_count(t, batch: int):
    """t + 1 as a float64 column (B, 1, 1) for a per-frame count, or the int t + 1."""
    import torch

    return (t.reshape(-1) + 1).to(torch.float64).reshape(batch, 1, 1) if torch.is_tensor(t) else t + 1


def _elementwise_second_moment_kernel(W, G, m, v, t, config):
    """Adam's elementwise v (shape (B, d, r)) and per-entry step in place of stages 4-7."""
    import torch
    from torch_impl import functional

    beta1, beta2 = config.betas
    W_c, G_decayed, m_new, _ = _stages_1_to_3(W, G, m, config)
    g = functional.project_tangent(W_c, G_decayed)
    count = _next_count(t, W_c.shape[0])
    # a state with one v per frame (as the real kernel's) is taken entry by entry
    v_in = v.to(g.dtype).reshape(g.shape) if v.numel() == g.numel() else v.to(g.dtype).reshape(-1, 1, 1).expand_as(g)
    v_c = torch.add(v_in * beta2, g * g, alpha=1 - beta2)
    root_v_hat = torch.sqrt(v_c / (1 - beta2**count))
    xi = m_new * torch.where(root_v_hat > 0, (-config.lr / (1 - beta1**count)) / (root_v_hat + config.eps), 0.0)
    if not math.isinf(config.trust_radius):
        norm = torch.linalg.vector_norm(xi, dim=(-2, -1), keepdim=True)
        xi = xi * torch.where(norm > config.trust_radius, config.trust_radius / norm, 1.0)
    W_new = functional.polar_factor(W_c + xi, config.trust_radius)
    return W_new.to(W.dtype).reshape(W.shape), m_new.reshape(W.shape), v_c.reshape(W.shape)


def _muon_polar(A):
    import torch

    a, b, c = MUON_COEFFICIENTS
    X = A / torch.linalg.matrix_norm(A, keepdim=True)
    for _ in range(5):
        XtX = X.mT @ X
        X = X @ (a * torch.eye(X.shape[-1], dtype=X.dtype, device=X.device) + b * XtX + c * (XtX @ XtX))
    return X


def _production_coefficient(m_new, v_c, t, config):
    from torch_impl import functional

    beta1, beta2 = config.betas
    count = t.reshape(-1) + 1 if _is_tensor(t) else t + 1
    return functional.step_coefficient(m_new, v_c, count, config.lr, beta1, beta2, config.eps, config.trust_radius)


def _is_tensor(x) -> bool:
    import torch

    return torch.is_tensor(x)


def _muon_newton_schulz_kernel(W, G, m, v, t, config):
    """The production stages 1-7, then Muon's band-pushing quintic in place of the polar factor."""
    W_c, G_decayed, m_new, WtG = _stages_1_to_3(W, G, m, config)
    v_c = _second_moment(W, W_c, G_decayed, m_new, WtG, v, config)
    coefficient = _production_coefficient(m_new, v_c, t, config)
    W_new = _muon_polar(W_c + coefficient[:, None, None] * m_new)
    return W_new.to(W.dtype).reshape(W.shape), m_new.reshape(W.shape), v_c.reshape(W.shape[:-2])


def _moments_in_storage_dtype_kernel(W, G, m, v, t, config):
    """The production step, with m and v kept in the storage dtype (bfloat16 for bfloat16 frames): each
    is rounded to it on the way out, as a port that stores the state like the parameter does."""
    W_new, m_new, v_new = stiefel_adam_kernel(W, G, m, v, t, config)
    return W_new, m_new.to(W.dtype), v_new.to(W.dtype)


def _bias_power_in_compute_dtype_kernel(W, G, m, v, t, config):
    """The production stages, with beta^t and 1 - beta^t formed in the compute dtype (beta rounded to
    float32 for float32 and bfloat16 frames) instead of float64."""
    import torch
    from torch_impl import functional

    beta1, beta2 = config.betas
    W_c, G_decayed, m_new, WtG = _stages_1_to_3(W, G, m, config)
    v_c = _second_moment(W, W_c, G_decayed, m_new, WtG, v, config)
    work = v_c.dtype
    count = (t.reshape(-1) + 1).to(work) if torch.is_tensor(t) else t + 1
    bias_correction1 = 1 - torch.tensor(beta1, dtype=work, device=v_c.device) ** count
    bias_correction2 = 1 - torch.tensor(beta2, dtype=work, device=v_c.device) ** count
    root_v_hat = torch.sqrt(v_c / bias_correction2)
    coefficient = torch.where(root_v_hat > 0, (-config.lr / bias_correction1) / (root_v_hat + config.eps), 0.0)
    if not math.isinf(config.trust_radius):
        norm = torch.linalg.vector_norm(m_new, dim=(-2, -1)) * coefficient.abs()
        coefficient = coefficient * torch.where(norm > config.trust_radius, config.trust_radius / norm, 1.0)
    W_new = functional.polar_factor(torch.addcmul(W_c, m_new, coefficient[:, None, None]), config.trust_radius)
    return W_new.reshape(W.shape).to(W.dtype), m_new.reshape(W.shape), v_c.reshape(W.shape[:-2])


def _shortcut_retraction_kernel(W, G, m, v, t, config):
    """The production stages 1-7, then the retraction (W + xi)(I + xi^T xi)^(-1/2) (by eigh, in the
    compute dtype), which is the polar factor only for an exactly orthonormal W: it never corrects
    the drift of the frame it is given (docs/algorithm.md#pitfalls)."""
    import torch

    W_c, G_decayed, m_new, WtG = _stages_1_to_3(W, G, m, config)
    v_c = _second_moment(W, W_c, G_decayed, m_new, WtG, v, config)
    xi = m_new * _production_coefficient(m_new, v_c, t, config)[:, None, None]
    gram = torch.eye(xi.shape[-1], dtype=xi.dtype, device=xi.device) + xi.mT @ xi
    eigenvalues, eigenvectors = torch.linalg.eigh(gram)
    W_new = (W_c + xi) @ ((eigenvectors * eigenvalues.rsqrt().unsqueeze(-2)) @ eigenvectors.mT)
    return W_new.reshape(W.shape).to(W.dtype), m_new.reshape(W.shape), v_c.reshape(W.shape[:-2])


def _production_from_second_moment(W, W_c, m_new, v_c, t, config, eps=None):
    """The production stages 5-8 from stage 3's m and stage 4's v (frames (B, d, r), compute dtype)."""
    import torch
    from torch_impl import functional

    beta1, beta2 = config.betas
    count = t.reshape(-1) + 1 if torch.is_tensor(t) else t + 1
    coefficient = functional.step_coefficient(m_new, v_c, count, config.lr, beta1, beta2, config.eps if eps is None else eps,
                                              config.trust_radius)
    W_new = functional.polar_factor(torch.addcmul(W_c, m_new, coefficient[:, None, None]), config.trust_radius)
    return W_new.reshape(W.shape).to(W.dtype), m_new.reshape(W.shape), v_c.reshape(W.shape[:-2])


def _unscaled_square_kernel(W, G, m, v, t, config):
    """Stage 4 from ||g||^2 formed at the gradient's own scale, then multiplied by (1 - beta2) / (d r):
    the square overflows the compute dtype before v does (float32: ||g|| > 2^64)."""
    from torch_impl import functional

    d, r = W.shape[-2], W.shape[-1]
    W_c, G_decayed, m_new, WtG = _stages_1_to_3(W, G, m, config)
    drift = functional.frame_drift_bound(d, r, W.dtype, config.trust_radius)
    g_squared = functional.gradient_norm_squared(W_c, G_decayed, WtG, drift)
    v_c = functional.second_moment(v.to(W_c.dtype).reshape(-1), g_squared, config.betas[1], d * r)
    return _production_from_second_moment(W, W_c, m_new, v_c, t, config)


def _floor_on_v_kernel(W, G, m, v, t, config):
    """v floored at the compute dtype's smallest normal number, max(v, tiny): a guard against 0 / 0
    that changes every step whose v is subnormal."""
    import torch

    W_c, G_decayed, m_new, WtG = _stages_1_to_3(W, G, m, config)
    v_c = _second_moment(W, W_c, G_decayed, m_new, WtG, v, config)
    v_c = torch.clamp(v_c, min=torch.finfo(v_c.dtype).tiny)
    return _production_from_second_moment(W, W_c, m_new, v_c, t, config)


def _hidden_eps_kernel(W, G, m, v, t, config):
    """A denominator sqrt(v^) + eps + 1e-30: an eps that eps = 0 does not remove, which shortens
    every step whose sqrt(v^) is not far above 1e-30."""
    W_c, G_decayed, m_new, WtG = _stages_1_to_3(W, G, m, config)
    v_c = _second_moment(W, W_c, G_decayed, m_new, WtG, v, config)
    return _production_from_second_moment(W, W_c, m_new, v_c, t, config, eps=config.eps + 1e-30)


def _capped(m, coefficient, trust_radius):
    """Stage 7, the trust-region cap of the coefficient, as the production kernel applies it."""
    import torch

    if not math.isinf(trust_radius):
        norm = torch.linalg.vector_norm(m, dim=(-2, -1)) * coefficient.abs()
        coefficient = coefficient * torch.where(norm > trust_radius, trust_radius / norm, 1.0)
    return coefficient


def _first_correction_in_float32(m, v, count, lr, beta1, beta2, eps, trust_radius):
    """Stages 5-7 with only 1 - beta1^t formed in the compute dtype (beta2's in float64, as declared)."""
    import torch

    work = v.dtype
    t = count.to(torch.float64) if torch.is_tensor(count) else count
    power1 = torch.tensor(beta1, dtype=work, device=v.device) ** (t.to(work) if torch.is_tensor(t) else t)
    bias_correction2 = (1 - torch.pow(beta2, t)).to(work) if torch.is_tensor(t) else 1 - beta2**t
    root_v_hat = torch.sqrt(v / bias_correction2)
    return _capped(m, torch.where(root_v_hat > 0, (-lr / (1 - power1)) / (root_v_hat + eps), 0.0), trust_radius)


def _per_frame_counts_in_float32(m, v, count, lr, beta1, beta2, eps, trust_radius):
    """Stages 5-7 with the per-frame count (the optimizer's form) raised by torch.pow in the compute
    dtype; the int form as declared."""
    import torch
    from torch_impl import functional

    if not torch.is_tensor(count):
        return functional.step_coefficient(m, v, count, lr, beta1, beta2, eps, trust_radius)
    t = count.to(v.dtype)
    root_v_hat = torch.sqrt(v / (1 - torch.pow(beta2, t)))
    numerator = -lr / (1 - torch.pow(beta1, t))
    return _capped(m, torch.where(root_v_hat > 0, torch.reciprocal(root_v_hat + eps) * numerator, 0.0), trust_radius)


def _clamped_denominator(m, v, count, lr, beta1, beta2, eps, trust_radius):
    """Stages 5-7 with the denominator clamped at 1e-20, a guard against a tiny v that changes every
    step whose sqrt(v^) + eps is below it."""
    import torch

    work = v.dtype
    t = count.to(torch.float64) if torch.is_tensor(count) else count
    bias_correction1 = (1 - torch.pow(beta1, t)).to(work) if torch.is_tensor(t) else 1 - beta1**t
    bias_correction2 = (1 - torch.pow(beta2, t)).to(work) if torch.is_tensor(t) else 1 - beta2**t
    root_v_hat = torch.sqrt(v / bias_correction2)
    denominator = torch.clamp(root_v_hat + eps, min=1e-20)
    return _capped(m, torch.where(root_v_hat > 0, (-lr / bias_correction1) / denominator, 0.0), trust_radius)


def _eps_in_float32(m, v, count, lr, beta1, beta2, eps, trust_radius):
    """Stages 5-7 with eps made a float32 tensor whatever the compute dtype: 1e-8 then differs from
    the float64 eps by about 1e-16, a relative 1e-8 of the step wherever sqrt(v^) is near eps."""
    import torch
    from torch_impl import functional

    return functional.step_coefficient(m, v, count, lr, beta1, beta2, torch.tensor(eps, dtype=torch.float32), trust_radius)


def _coefficient_kernel(coefficient_function):
    """The production stages, with stages 5-7 (step_coefficient) replaced by coefficient_function."""

    def kernel(W, G, m, v, t, config):
        import torch
        from torch_impl import functional

        beta1, beta2 = config.betas
        W_c, G_decayed, m_new, WtG = _stages_1_to_3(W, G, m, config)
        v_c = _second_moment(W, W_c, G_decayed, m_new, WtG, v, config)
        count = t.reshape(-1) + 1 if torch.is_tensor(t) else t + 1
        coefficient = coefficient_function(m_new, v_c, count, config.lr, beta1, beta2, config.eps, config.trust_radius)
        W_new = functional.polar_factor(torch.addcmul(W_c, m_new, coefficient[:, None, None]), config.trust_radius)
        return W_new.reshape(W.shape).to(W.dtype), m_new.reshape(W.shape), v_c.reshape(W.shape[:-2])

    kernel.__doc__ = coefficient_function.__doc__
    return kernel


def _storage_rounding_kernel(stage: str):
    """The production step with one stage's result rounded to the storage dtype (as a port that keeps
    that value in a buffer of the parameter's dtype), where the kernel declares the compute dtype:

    * projection: W, G~ and m rounded before stage 3, and its m after it;
    * square: stage 4's increment (1 - beta2) / (d r) ||g||^2 formed from G~ and W^T G~ in storage;
    * second_moment: v after stage 4;
    * coefficient: the coefficient c of xi = c m after stage 7;
    * subnormal_v: (not a storage rounding) v flushed to 0 below the compute dtype's smallest normal
      number, as a flush-to-zero mode does;
    * retraction_bfloat16: for bfloat16 frames only, the retraction (W + xi)(I + xi^T xi)^(-1/2),
      which never corrects the drift of the frame it is given."""

    def kernel(W, G, m, v, t, config):
        import torch
        from torch_impl import functional as F

        beta1, beta2 = config.betas
        storage, work = W.dtype, F.compute_dtype(W.dtype)
        d, r = W.shape[-2], W.shape[-1]
        W_c = F._as_batch3(W.to(work))
        G_c = F.decayed_gradient(W_c, F._as_batch3(G.to(work)), config.weight_decay)
        if stage == "projection":
            m_c, WtG = F.project_moment(W_c.to(storage).to(work), G_c.to(storage).to(work), F._as_batch3(m.to(storage).to(work)), beta1)
            m_c = m_c.to(storage).to(work)
        else:
            m_c, WtG = F.project_moment(W_c, G_c, F._as_batch3(m.to(work)), beta1)
        drift = F.frame_drift_bound(d, r, storage, config.trust_radius)
        if stage == "square":
            scale = F.increment_scale(beta2, d * r)
            increment = F.gradient_norm_squared(W_c, (G_c * scale).to(storage).to(work), (WtG * scale).to(storage).to(work), drift)
            v_c = torch.add(v.to(work).reshape(-1) * beta2, increment)
        else:
            v_c = F.updated_second_moment(W_c, G_c, WtG, v.to(work).reshape(-1), beta2, drift)
        if stage == "second_moment":
            v_c = v_c.to(storage).to(work)
        if stage == "subnormal_v":
            v_c = torch.where(v_c < torch.finfo(work).tiny, torch.zeros_like(v_c), v_c)
        count = t.reshape(-1) + 1 if torch.is_tensor(t) else t + 1
        coefficient = F.step_coefficient(m_c, v_c, count, config.lr, beta1, beta2, config.eps, config.trust_radius)
        if stage == "coefficient":
            coefficient = coefficient.to(storage).to(work)
        xi = m_c * coefficient[:, None, None]
        if stage == "retraction_bfloat16" and storage == torch.bfloat16:
            eigenvalues, eigenvectors = torch.linalg.eigh(torch.eye(r, dtype=work, device=W.device) + xi.mT @ xi)
            W_new = (W_c + xi) @ ((eigenvectors * eigenvalues.rsqrt().unsqueeze(-2)) @ eigenvectors.mT)
        else:
            W_new = F.polar_factor(torch.addcmul(W_c, m_c, coefficient[:, None, None]), config.trust_radius)
        return W_new.reshape(W.shape).to(W.dtype), m_c.reshape(W.shape), v_c.reshape(W.shape[:-2])

    return kernel


REAL_KERNEL = "stiefel_adam"

KERNEL_VARIANTS = {
    REAL_KERNEL: stiefel_adam_kernel,
    "elementwise_second_moment": _elementwise_second_moment_kernel,
    "muon_newton_schulz": _muon_newton_schulz_kernel,
    "moments_in_storage_dtype": _moments_in_storage_dtype_kernel,
    "bias_power_in_compute_dtype": _bias_power_in_compute_dtype_kernel,
    "drift_not_corrected": _shortcut_retraction_kernel,
    "unscaled_square": _unscaled_square_kernel,
    "floor_on_v": _floor_on_v_kernel,
    "hidden_eps": _hidden_eps_kernel,
    "first_correction_in_float32": _coefficient_kernel(_first_correction_in_float32),
    "per_frame_counts_in_float32": _coefficient_kernel(_per_frame_counts_in_float32),
    "clamped_denominator": _coefficient_kernel(_clamped_denominator),
    "eps_in_float32": _coefficient_kernel(_eps_in_float32),
    "projection_in_storage_dtype": _storage_rounding_kernel("projection"),
    "square_in_storage_dtype": _storage_rounding_kernel("square"),
    "second_moment_in_storage_dtype": _storage_rounding_kernel("second_moment"),
    "coefficient_in_storage_dtype": _storage_rounding_kernel("coefficient"),
    "flush_subnormal_v": _storage_rounding_kernel("subnormal_v"),
    "drift_not_corrected_in_bfloat16": _storage_rounding_kernel("retraction_bfloat16"),
}

CONTROL_DESCRIPTIONS = {
    "elementwise_second_moment": "the torch kernel with Adam's elementwise second moment in place of one scalar per frame",
    "muon_newton_schulz": "the torch kernel with Muon's tuned Newton-Schulz coefficients (3.4445, -4.7750, 2.0315) as the retraction",
    "moments_in_storage_dtype": "the torch kernel keeping m and v in the storage dtype (bfloat16 for bfloat16 frames), not float32",
    "bias_power_in_compute_dtype": "the torch kernel forming beta^t and 1 - beta^t in the compute dtype (float32), not float64",
    "drift_not_corrected": ("the torch kernel retracting by (W + xi)(I + xi^T xi)^(-1/2), which trusts W^T W = I and never "
                            "corrects the stored frame's drift"),
    "unscaled_square": "the torch kernel forming ||g||^2 at the gradient's scale before (1 - beta2) / (d r): it overflows before v",
    "floor_on_v": "the torch kernel flooring v at the compute dtype's smallest normal number, max(v, tiny)",
    "hidden_eps": "the torch kernel dividing by sqrt(v^) + eps + 1e-30, an eps that eps = 0 does not remove",
    "first_correction_in_float32": "the torch kernel forming 1 - beta1^t alone in the compute dtype (float32), not float64",
    "per_frame_counts_in_float32": "the torch kernel raising beta to the per-frame step counts in the compute dtype (float32), not float64",
    "clamped_denominator": "the torch kernel clamping sqrt(v^) + eps at 1e-20, a guard against tiny v",
    "eps_in_float32": "the torch kernel taking eps as a float32 tensor whatever the compute dtype",
    "projection_in_storage_dtype": "the torch kernel projecting the first moment in the storage dtype (bfloat16 for bfloat16 frames)",
    "square_in_storage_dtype": "the torch kernel forming v's increment (1 - beta2) ||g||^2 / (d r) from inputs rounded to the storage dtype",
    "second_moment_in_storage_dtype": "the torch kernel keeping v alone in the storage dtype (bfloat16 for bfloat16 frames)",
    "coefficient_in_storage_dtype": "the torch kernel rounding the step coefficient c of xi = c m to the storage dtype",
    "flush_subnormal_v": "the torch kernel flushing a subnormal v to 0, as a flush-to-zero mode does",
    "drift_not_corrected_in_bfloat16": ("the torch kernel retracting bfloat16 frames by (W + xi)(I + xi^T xi)^(-1/2), which never "
                                        "corrects the stored frame's drift (the other dtypes as declared)"),
}

# A broken kernel is a control by being written: one left out of CONTROL_DESCRIPTIONS would never run.
if set(KERNEL_VARIANTS) - {REAL_KERNEL} != set(CONTROL_DESCRIPTIONS):
    raise RuntimeError("kernel_variants: every broken kernel needs a description (and so a control of the cross-check): "
                       f"{sorted(set(KERNEL_VARIANTS) ^ (set(CONTROL_DESCRIPTIONS) | {REAL_KERNEL}))}")
