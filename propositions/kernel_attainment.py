"""How tight the bounds are that decide the kernel's low-precision verdicts: each stage bound of the
one analysis of the step (propositions/kit/step_analysis.py, kit/bounds.py), at the precision the
kernel declares, against the kernel's own evaluation of that stage, searched over inputs.

For each stage and each storage dtype (float32 and bfloat16; both compute in float32), a seeded
search draws batches of small frames ((2, 1) to (5, 3), where the gamma_n of short sums are reached
by aligned roundings) with inputs shaped to make that stage's rounding the largest it can be
(nearly normal gradients for the projection, betas near 1 and t = 1 for the bias corrections, steps
at the trust radius for the cap, ...), evaluates the stage with the kernel's public stage functions
(torch_impl.functional) on the values the kernel would hold, and compares it with the exact value
(float64 arithmetic on the same values, exact to about 2^-53 relative, far below the float32
roundings measured). Each search returns the residual/bound of every sample: the largest is the
stage's attained ratio, and none may exceed 1 (the search doubles as a check that each stage bound
holds). The running trajectory bound (kit/running_bounds) is searched the same way on short float32
trajectories, step by step. The cross-check records the ratios per stage and dtype.

Part of the cross-check; it defines no claim.
"""

from __future__ import annotations

import math

import numpy as np

import reference_impl as ref
from propositions._common import rng_for
from propositions.kernel_variants import state_dtype, stored, to_numpy, to_torch, torch_dtype
from propositions.kit import bounds, step_analysis
from propositions.kit import precision as precisions
from propositions.kit.running_bounds import initial_distance_to_manifold, record_trajectory, trajectory_rounding_bound

CLAIM_ID = "crosscheck"
SEARCH_SHAPES = ((2, 1), (3, 1), (3, 2), (4, 2), (5, 3))
SEARCH_DTYPES = ("float32", "bfloat16")
U64 = step_analysis.U64


def _frobenius(x):
    return np.sqrt(np.sum(np.asarray(x, dtype=np.float64) ** 2, axis=(-2, -1)))


def _project(W, X):
    """X - W sym(W^T X) in float64 at the given (not necessarily orthonormal) W."""
    WtX = np.swapaxes(W, -1, -2) @ X
    return X - W @ (0.5 * (WtX + np.swapaxes(WtX, -1, -2)))


def _inputs(rng, dtype, d, r, count):
    """count frames stored in `dtype` and nearly normal gradients X = W S + 2^-j T (S symmetric, T
    tangent, j in [0, 20)), as the float64 values the kernel's compute dtype holds."""
    W = stored(ref.random_point(d, r, rng, (count,)), dtype)
    S = rng.standard_normal((count, r, r))
    X = W @ (S + np.swapaxes(S, -1, -2)) + np.ldexp(1.0, -rng.integers(0, 20, (count, 1, 1))) * rng.standard_normal((count, d, r))
    return W, stored(X * np.ldexp(1.0, rng.integers(-4, 5, (count, 1, 1))), dtype)


def _torch_work(*arrays, dtype):
    return [to_torch(a, state_dtype(dtype), "cpu") for a in arrays]


def decay_search(rng, dtype, d, r, count):
    from torch_impl import functional

    W, X = _inputs(rng, dtype, d, r, count)
    lam = float(rng.uniform(0.01, 3.0))
    computed = to_numpy(functional.decayed_gradient(*_torch_work(W, X, dtype=dtype), lam))
    u_c = step_analysis.kernel_rounding(dtype, 0.5, d, r).unit("decay")
    return _frobenius(computed - (X + lam * W)), step_analysis.decay(u_c=u_c, G=_frobenius(X), lam=lam, W=_frobenius(W), G_rel=0.0, W_err=0.0)


def projection_search(rng, dtype, d, r, count):
    from torch_impl import functional

    W, X = _inputs(rng, dtype, d, r, count)
    W_t, X_t = _torch_work(W, X, dtype=dtype)
    computed = to_numpy(functional.project_moment(W_t, X_t, X_t * 0, 0.0)[0])
    u_c = step_analysis.kernel_rounding(dtype, 0.5, d, r).unit("projection")
    return _frobenius(computed - _project(W, X)), bounds.projection(d=d, r=r, u_c=u_c, X=_frobenius(X), X_err=0.0, W_err=0.0)


def first_moment_search(rng, dtype, d, r, count):
    from torch_impl import functional

    W, X = _inputs(rng, dtype, d, r, count)
    m_in = stored(rng.standard_normal(W.shape) * np.ldexp(1.0, rng.integers(-3, 4, (count, 1, 1))), state_dtype(dtype))
    beta1 = float(rng.choice([0.5, 0.9, 0.99]))
    computed = to_numpy(functional.project_moment(*_torch_work(W, X, m_in, dtype=dtype), beta1)[0])
    Pm, g = _project(W, m_in), _project(W, X)
    rounding = step_analysis.kernel_rounding(dtype, 0.5, d, r)
    u_p = rounding.unit("projection")
    bound = step_analysis.first_moment(
        u_c=rounding.unit("first_moment"), beta1=beta1, m_in=_frobenius(Pm),
        m_in_err=bounds.projection(d=d, r=r, u_c=u_p, X=_frobenius(m_in), X_err=0.0, W_err=0.0), g=_frobenius(g),
        g_err=bounds.projection(d=d, r=r, u_c=u_p, X=_frobenius(X), X_err=0.0, W_err=0.0))
    return _frobenius(computed - (beta1 * Pm + (1 - beta1) * g)), bound


def second_moment_search(rng, dtype, d, r, count):
    from torch_impl import functional

    W, X = _inputs(rng, dtype, d, r, count)
    g = _project(W, X)
    n = d * r
    v_in = stored(rng.uniform(0.0, 2.0, count) * np.sum(g * g, axis=(-2, -1)) / n, state_dtype(dtype))
    beta2 = float(rng.choice([0.9, 0.999, 0.99999]))
    W_t, X_t, v_t = _torch_work(W, X, v_in, dtype=dtype)
    _, WtX = functional.project_moment(W_t, X_t, X_t * 0, 0.0)
    drift = functional.frame_drift_bound(d, r, torch_dtype(dtype), 0.5)
    computed = to_numpy(functional.updated_second_moment(W_t, X_t, WtX, v_t, beta2, drift))
    rounding = step_analysis.kernel_rounding(dtype, 0.5, d, r)
    g_norm, X_norm = _frobenius(g), _frobenius(X)
    E_g = bounds.projection(d=d, r=r, u_c=rounding.unit("projection"), X=X_norm, X_err=0.0, W_err=0.0)
    E_s = step_analysis.mean_square(n=n, u_c=rounding.unit("mean_square"), g=g_norm, g_err=E_g, X=X_norm)
    bound = step_analysis.second_moment(u_c=rounding.unit("second_moment"), beta2=beta2, v_in=v_in, v_in_err=0.0,
                                        s=g_norm**2 / n, s_err=E_s)
    return np.abs(computed - (beta2 * v_in + (1 - beta2) * g_norm**2 / n)), bound


def _direction_bound(rounding, lr, t, betas, m_norm, v, xi_norm):
    """step_analysis's stages 5-6 at exact m, v: E_xi0 (bias corrections at the declared bias power)."""
    beta1, beta2 = betas
    hats = [step_analysis.bias_correction(u_c=rounding.unit("bias_correction"), u_p=rounding.unit("bias_power"), t=t,
                                          beta_t=beta**t, log_beta=abs(math.log(beta)), x=x, x_err=0.0)
            for beta, x in ((beta1, m_norm), (beta2, v))]
    v_hat = v / (1 - beta2**t)
    q = np.sqrt(v_hat)
    E_q = step_analysis.denominator(u_c=rounding.unit("denominator"), q=q,
                                    sqrt_err=bounds.square_root(u_c=rounding.unit("square_root"), x=v_hat, x_err=hats[1]))
    return step_analysis.direction(u_c=rounding.unit("direction"), lr=lr, xi=xi_norm, q=q, q_err=E_q, m_hat_err=hats[0])


def _coefficient_inputs(rng, dtype, d, r, count):
    m = stored(rng.standard_normal((count, d, r)) * np.ldexp(1.0, rng.integers(-3, 4, (count, 1, 1))), state_dtype(dtype))
    v = stored(np.sum(m * m, axis=(-2, -1)) / (d * r) * rng.uniform(0.2, 5.0, count), state_dtype(dtype))
    betas = [(0.9, 0.999), (0.99999, 0.999), (0.9, 0.99999), (0.9999, 0.9999)][int(rng.integers(4))]
    t = int(rng.choice([1, 2, 10, 1000]))
    return m, v, betas, t


def bias_correction_search(rng, dtype, d, r, count):
    """Stages 5-6 (the bias corrections, the square root, the denominator and the direction), with
    betas up to 0.99999 and t from 1: the kernel's xi = m c for its coefficient c, no cap."""
    import torch
    from torch_impl import functional

    m, v, betas, t = _coefficient_inputs(rng, dtype, d, r, count)
    lr = 1e-3
    m_t, v_t = _torch_work(m, v, dtype=dtype)
    count_arg = torch.full((count,), float(t), dtype=torch.float64) if rng.integers(2) else t
    xi = to_numpy(m_t * functional.step_coefficient(m_t, v_t, count_arg, lr, *betas, 0.0, math.inf)[:, None, None])
    exact = -lr / (1 - betas[0]**t) / np.sqrt(v / (1 - betas[1]**t))
    xi_exact = exact[:, None, None] * m
    rounding = step_analysis.kernel_rounding(dtype, 0.5, d, r)
    return _frobenius(xi - xi_exact), _direction_bound(rounding, lr, t, betas, _frobenius(m), v, _frobenius(xi_exact))


def trust_region_search(rng, dtype, d, r, count):
    """Stage 7 with the cap active (steps of length 2 to 20 Delta): xi = m c against Delta m / ||m||."""
    from torch_impl import functional

    m, v, betas, t = _coefficient_inputs(rng, dtype, d, r, count)
    delta = 0.5
    lr = float(rng.uniform(2.0, 20.0)) * delta / math.sqrt(d * r)
    m_t, v_t = _torch_work(m, v, dtype=dtype)
    xi = to_numpy(m_t * functional.step_coefficient(m_t, v_t, t, lr, *betas, 0.0, delta)[:, None, None])
    raw = lr / (1 - betas[0]**t) / np.sqrt(v / (1 - betas[1]**t)) * _frobenius(m)
    rounding = step_analysis.kernel_rounding(dtype, delta, d, r)
    E_xi0 = _direction_bound(rounding, lr, t, betas, _frobenius(m), v, raw)
    bound = step_analysis.trust_region(n=d * r, u_c=rounding.unit("trust_region"), xi_err=E_xi0, cap=np.minimum(raw, delta), raw=raw,
                                       radius=delta)
    exact = -np.minimum(raw, delta)[:, None, None] * m / _frobenius(m)[:, None, None]
    return _frobenius(xi - exact), bound


def _steps_at(rng, dtype, d, r, count, trust_radius):
    """Frames (stored in dtype) and steps of length up to the trust radius (or 1.5 for inf),
    tangent for half of them and in any direction for the others (the noise-driven step of a
    gradient normal up to rounding, whose spectrum the Newton-Schulz route must hold too), and
    A = W + xi as the compute dtype holds it."""
    W = stored(ref.random_point(d, r, rng, (count,)), dtype)
    direction = rng.standard_normal(W.shape)
    tangent = np.arange(count)[:, None, None] % 2 == 0
    xi = np.where(tangent, _project(W, direction), direction)
    length = min(trust_radius, 1.5) * rng.uniform(0.0, 1.0, (count, 1, 1))
    A = stored(W + xi * length / _frobenius(xi)[:, None, None], state_dtype(dtype))
    return W, A


def step_sum_search(rng, dtype, d, r, count):
    """Stage 8's A = W + m c (torch.addcmul, as the kernel forms it) against W + xi exactly."""
    import torch
    from torch_impl import functional

    W = stored(ref.random_point(d, r, rng, (count,)), dtype)
    m, v, betas, t = _coefficient_inputs(rng, dtype, d, r, count)
    m = stored(_project(W, m), state_dtype(dtype))
    lr = 0.05
    W_t, m_t, v_t = _torch_work(W, m, v, dtype=dtype)
    coefficient = functional.step_coefficient(m_t, v_t, t, lr, *betas, 0.0, 0.5)
    A = to_numpy(torch.addcmul(W_t, m_t, coefficient[:, None, None]))
    raw = lr / (1 - betas[0]**t) / np.sqrt(v / (1 - betas[1]**t)) * _frobenius(m)
    xi_exact = -np.minimum(raw, 0.5)[:, None, None] * m / _frobenius(m)[:, None, None]
    rounding = step_analysis.kernel_rounding(dtype, 0.5, d, r)
    E_xi = step_analysis.trust_region(n=d * r, u_c=rounding.unit("trust_region"), cap=np.minimum(raw, 0.5), raw=raw, radius=0.5,
                                      xi_err=_direction_bound(rounding, lr, t, betas, _frobenius(m), v, raw))
    bound = step_analysis.step_sum(u_c=rounding.unit("step_sum"), A=_frobenius(W + xi_exact), W_err=0.0, xi_err=E_xi)
    return _frobenius(A - (W + xi_exact)), bound


def _polar(A):
    U, s, Vt = np.linalg.svd(A, full_matrices=False)
    return U @ Vt, s


def polar_search(rng, dtype, d, r, count, trust_radius=0.5):
    """The retraction's evaluation (polar_factor: Newton-Schulz for Delta <= 1, eigh above) against
    the exact polar factor of the same A."""
    from torch_impl import functional

    _, A = _steps_at(rng, dtype, d, r, count, trust_radius)
    computed = to_numpy(functional.polar_factor(to_torch(A, state_dtype(dtype), "cpu"), trust_radius))
    exact, s = _polar(A)
    rounding = step_analysis.kernel_rounding(dtype, trust_radius, d, r)
    bound = step_analysis.retraction_error(d, r, rounding, s[:, 0] / s[:, -1], trust_radius, (_frobenius(A), s[:, -1], s[:, 0]))
    return _frobenius(computed - exact), bound


def polar_eigh_search(rng, dtype, d, r, count):
    return polar_search(rng, dtype, d, r, count, trust_radius=math.inf)


def gram_search(rng, dtype, d, r, count):
    """fl(A^T A) in the compute dtype (the retraction's first product) against A^T A."""
    _, A = _steps_at(rng, dtype, d, r, count, 0.5)
    A_t = to_torch(A, state_dtype(dtype), "cpu")
    computed = to_numpy(A_t.mT @ A_t)
    u_c = step_analysis.kernel_rounding(dtype, 0.5, d, r).unit("retraction")
    return _frobenius(computed - np.swapaxes(A, -1, -2) @ A), bounds.gram(d=d, u_c=u_c, A=_frobenius(A))


def storage_cast_search(rng, dtype, d, r, count):
    """W+ (a float32 polar factor) rounded to the storage dtype (none for float32: residual 0)."""
    W = stored(ref.random_point(d, r, rng, (count,)), "float32")
    rounding = step_analysis.kernel_rounding(dtype, 0.5, d, r)
    return _frobenius(stored(W, dtype) - W), np.full(count, float(step_analysis.storage_cast(r=r, u_s=rounding.cast)) or 1.0)


def frame_defect_search(rng, dtype, d, r, count):
    """The drift ||W+^T W+ - I||_F of the frame the retraction returns (stored in dtype) against
    gram_route_defect at A's own spectrum (the long run's one-step bound)."""
    from torch_impl import functional

    _, A = _steps_at(rng, dtype, d, r, count, 0.5)
    W_new = stored(to_numpy(functional.polar_factor(to_torch(A, state_dtype(dtype), "cpu"), 0.5)), dtype)
    _, s = _polar(A)
    rounding = step_analysis.kernel_rounding(dtype, 0.5, d, r)
    bound = step_analysis.evaluated_defect(step_analysis.gram_route_defect(d, r, rounding, 0.5, _frobenius(A), s[:, -1], s[:, 0]), d, r)
    return ref.feasibility(W_new, validate=False), bound


# The stages searched, in the order of docs/algorithm.md; each name is the stage bound it measures
# (bias_correction covers stages 5-6: the kernel exposes only its coefficient).
STAGE_SEARCHES = {
    "decay": decay_search,
    "projection": projection_search,
    "first_moment": first_moment_search,
    "second_moment": second_moment_search,
    "bias_correction": bias_correction_search,
    "trust_region": trust_region_search,
    "step_sum": step_sum_search,
    "gram": gram_search,
    "polar_newton_schulz": polar_search,
    "polar_eigh": polar_eigh_search,
    "storage_cast": storage_cast_search,
    "newton_schulz_defect": frame_defect_search,
}


def stage_ratios(seed: int, stage: str, dtype: str, count: int = 64) -> np.ndarray:
    """residual / bound of every sample of one stage's search in one dtype (SEARCH_SHAPES, count
    frames each, seeded by rng_for(seed, "crosscheck", "attainment", stage, dtype, d, r))."""
    ratios = []
    for d, r in SEARCH_SHAPES:
        rng = rng_for(seed, CLAIM_ID, "attainment", stage, dtype, d, r)
        residual, bound = STAGE_SEARCHES[stage](rng, dtype, d, r, count)
        ratios.append(np.asarray(residual, dtype=np.float64) / np.asarray(bound, dtype=np.float64))
    return np.concatenate(ratios)


def _tilting_gradients(rng, W0, steps, config):
    """(steps, n, d, r) gradients a W_t S + T along the reference's own trajectory from W0 (S
    symmetric, T Gaussian, a = 0 for half the frames and 2^j, j in [0, 12), for the others): nearly
    normal gradients, for which a tilt of the frame tilts the next direction most (the running
    bound's amplification), and plain Gaussian ones."""
    count, d, r = W0.shape
    weights = np.where(np.arange(count)[:, None, None] % 2 == 0, 0.0, np.ldexp(1.0, rng.integers(0, 12, (count, 1, 1))))
    W, state = W0, ref.StiefelAdamState(m=np.zeros_like(W0), v=np.zeros(count), t=0)
    gradients = []
    for _ in range(steps):
        S = rng.standard_normal((count, r, r))
        G = weights * (W @ (S + np.swapaxes(S, -1, -2))) + rng.standard_normal(W.shape)
        gradients.append(G)
        W, state = ref.adam._step(W, G, state, config)
    return np.stack(gradients)


def _steady_gradients(rng, W0, steps, config):
    """(steps, n, d, r): one Gaussian gradient per frame, the same at every step. With an lr far below
    the frame's entries (RUNNING_SEARCHES' "steady" family) the exact step hardly amplifies an error
    (the running bound's per-step growth is then its local roundings), and the kernel's successive
    steps see nearly the same inputs, so their roundings add up instead of averaging out."""
    G = rng.standard_normal(W0.shape)
    return np.stack([G] * steps)


# The running bound's searches: (family, lr, gradients, frames per shape). "tilting" reaches the bound
# where the exact step amplifies a tilt most (the first step); "steady" where the bound's growth is
# its sum of local roundings (the later steps, float32: 0.08-0.1 at steps 3-6 against 0.02-0.04 for
# "tilting").
RUNNING_SEARCHES = (("tilting", 0.05, _tilting_gradients, 256), ("steady", 3e-6, _steady_gradients, 256))


def running_bound_samples(seed: int, dtype: str = "float32", steps: int = 6) -> np.ndarray:
    """The running trajectory bound (kit/running_bounds.trajectory_rounding_bound at the kernel's
    declared precision) against the kernel's own trajectories: (steps, samples) residual/bound of
    every searched trajectory at each step (0 where the bound is vacuous), over RUNNING_SEARCHES and
    SEARCH_SHAPES, eps = 0 or 1e-8, fresh starts; the exact trajectory is the float64 reference's from
    the float64 inputs, which the kernel receives rounded to its storage dtype."""
    import torch
    from torch_impl import functional

    declaration = step_analysis.kernel_declaration(dtype)
    precision = precisions.Precision.declared(declaration)
    found = []
    for family, lr, gradients_of, count in RUNNING_SEARCHES:
        for d, r in SEARCH_SHAPES:
            key = (CLAIM_ID, "attainment", "running_bound", dtype, d, r) + (() if family == "tilting" else (family,))
            rng = rng_for(seed, *key)
            config = ref.StiefelAdamConfig(lr=lr, eps=float(rng.choice([0.0, 1e-8])), trust_radius=0.5)
            W0 = ref.random_point(d, r, rng, (count,))
            gradients = gradients_of(rng, W0, steps, config)
            # the float64 reference from the float64 inputs; the kernel gets them rounded to its storage,
            # which the running bound charges at the declared precision (u_s on W_0 and on every G)
            W_exact, _, norms = record_trajectory(W0, gradients, config)
            bound = trajectory_rounding_bound(norms, d, r, config, precision=precision, initial_distance=initial_distance_to_manifold(W0))["W"]
            W = to_torch(W0, dtype, "cpu")
            m = torch.zeros(W.shape, dtype=state_dtype(dtype))
            v = torch.zeros(count, dtype=state_dtype(dtype))
            ratios = np.zeros((steps, count))
            for t in range(steps):
                W, m, v = functional.stiefel_adam_step(W, to_torch(gradients[t], dtype, "cpu"), m, v, t, config.lr, *config.betas,
                                                       config.eps, config.trust_radius, config.weight_decay)
                ratio = _frobenius(to_numpy(W) - W_exact[t]) / bound[t]
                ratios[t] = np.where(np.isfinite(bound[t]), ratio, 0.0)
            found.append(ratios)
    return np.concatenate(found, axis=1)


def running_bound_ratios(seed: int, dtype: str = "float32", steps: int = 6) -> np.ndarray:
    """(steps,) the largest residual/bound of running_bound_samples at each step."""
    return np.max(running_bound_samples(seed, dtype, steps), axis=1)


__all__ = ["RUNNING_SEARCHES", "SEARCH_DTYPES", "SEARCH_SHAPES", "STAGE_SEARCHES", "running_bound_ratios", "running_bound_samples",
           "stage_ratios"]
