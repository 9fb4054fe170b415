"""P2 on the PyTorch kernel across each storage dtype's whole exponent range.

With eps = 0 and no weight decay the step is homogeneous of degree 0 in the gradient's scale c
(P2): m scales by c, v by c^2, and W does not move with c. Multiplying by c = 2^k is exact and
commutes with every rounding as long as no quantity leaves the normal range of its dtype, so there
the kernel's trajectories under 2^k G and G must be bit-identical (W, m / 2^k and v / 4^k). This
is checked for every k for which 2^k is a positive finite number of the storage dtype (float64:
-1074 .. 1023; float32: -149 .. 127; bfloat16: -133 .. 127), on small frames, three steps.

Where it must hold (`predicted_domain`, from the float64 reference's exact quantities at c = 1 and
the dtype's limits, never from the kernel): every stage quantity normal and finite, with a factor
2^MARGIN_BINADES to spare (4^MARGIN_BINADES on squares) for an implementation's intermediates of
the same size: the entries of c G (storage dtype), of c G~, c g, c m, c W^T G~ and sqrt(v^) (compute
dtype), the terms (1 - beta2) c^2 x_ij^2 / (d r) of the second moment's increment for x = g and
x = G~ (each of them normal, their sums finite), v and v^, and the coefficient lr / ((1 - beta1^t)
sqrt(v^)) of degree -1. The second moment's increment is held to its own size, not to that of
||g||^2: a port that squares the unscaled gradient overflows up to sqrt(d r / (1 - beta2)) below
where v does (6.5 binades at (3, 2)), inside the domain, and fails.

Below it, where the increment's terms and v are subnormal but v is not 0 (the subnormal band, a
property of the compute dtype: float64, and float32 for float32 and bfloat16 frames),
one step from a scaled state (c G, c m, c^2 v) is held to the rounding analysis of the step with
underflow: every operation of the increment may add an absolute error of half the smallest
subnormal eta_c, (4 d r + 9) eta_c on v in all, so the bound grows as v shrinks, and a floor on v
(max(v, tiny)), a flush of subnormals to 0, or an eps hidden in the denominator fails there. Above
and below (v = 0, non-finite) is reported, not checked: the claim does not hold there, and the
certificate says where that is, next to the domain found.

Part of the cross-check; it defines no claim.
"""

from __future__ import annotations

import math

import numpy as np

import reference_impl as ref
from propositions._common import rng_for
from propositions.kernel_variants import run_kernel, state_dtype, stored, to_numpy, to_torch, torch_dtype
from propositions.kit import step_analysis
from propositions.kit.kernel_bounds import transport_roundoff
from propositions.kit.step_analysis import InputErrors, reference_quantities, step_error, step_norms_of

CLAIM_ID = "crosscheck"
SCALE_SHAPE = (3, 2)
SCALE_FRAMES = 4
SCALE_STEPS = 3
SCALE_CONFIG = ref.StiefelAdamConfig(lr=0.05, betas=(0.9, 0.999), eps=0.0, trust_radius=0.5, weight_decay=0.0)
MARGIN_BINADES = 1
SCALE_DTYPES = ("float64", "float32", "bfloat16")
# The subnormal band is where v, a number of the compute dtype, is subnormal: bfloat16 frames compute
# in float32, so their band is float32's, checked there; in bfloat16 the two runs' storage casts
# (2 u_s sqrt(r)) would dominate a bound that the rounding of the same values does not approach.
BAND_ELSEWHERE = ("bfloat16",)

BITWISE_TEXT = ("exact: inside the predicted domain every quantity is a normal number and scaling by 2^k commutes with every "
                "rounding; bound 0.5 ulp = equality (W, m / 2^k, v / 4^k, every step)")
BAND_TEXT = ("the kernel's step_error at the precision it declares for each run from its own input (the exact steps agree), "
             "the scaled run's v carrying (4 d r + 9) eta_c / (beta2 c^2) relative to c^2 (the underflow of its increment's "
             "terms, sums and products and of c^2 v itself, eta_c half the smallest subnormal); " + step_analysis.step_error_text("W"))


def exponent_range(dtype: str) -> tuple[int, int]:
    """(lowest, highest) k with 2^k a positive finite number of `dtype` (subnormals included)."""
    import torch

    return _exponents(torch.finfo(torch_dtype(dtype)))


def _exponents(info) -> tuple[int, int]:
    mantissa_bits = round(-math.log2(info.eps))
    return int(round(math.log2(info.smallest_normal))) - mantissa_bits, math.frexp(info.max)[1] - 1


def _limits(dtype: str) -> tuple[float, float, int]:
    """(smallest normal, largest finite, log2 of half the smallest subnormal eta) of a dtype (eta
    itself is not a float64 for float64)."""
    import torch

    info = torch.finfo(torch_dtype(dtype))
    low, _ = _exponents(info)
    return float(info.smallest_normal), float(info.max), low - 1


def unit_quantities(W0, gradients, config) -> dict:
    """The float64 reference's stage quantities along its trajectory at c = 1 (lists over the steps):
    entries of G, G~, g, m, W^T G~; the increment's terms and sums for g and G~; v, v^, sqrt(v^),
    and the coefficient lr / ((1 - beta1^t) sqrt(v^))."""
    beta1, beta2 = config.betas
    d, r = W0.shape[-2], W0.shape[-1]
    W, state = W0, ref.StiefelAdamState(m=np.zeros_like(W0), v=np.zeros(W0.shape[:-2]), t=0)
    out = {name: [] for name in ("c_storage", "c_compute", "c2_terms", "c2_sums", "c_inverse")}
    with np.errstate(all="ignore"):
        for t, G in enumerate(gradients, start=1):
            G_decayed = G + config.weight_decay * W
            g = ref.project_tangent(W, G_decayed, validate=False)
            m = beta1 * state.m + (1 - beta1) * g
            W, state = ref.adam._step(W, G, state, config)
            v_hat = state.v / (1 - beta2**t)
            weight = (1 - beta2) / (d * r)
            out["c_storage"].append(np.abs(G).ravel())
            out["c_compute"].append(np.abs(np.concatenate([G_decayed.ravel(), g.ravel(), m.ravel(),
                                                           (np.swapaxes(W, -1, -2) @ G_decayed).ravel(), np.sqrt(v_hat)])))
            out["c2_terms"].append(np.concatenate([weight * g.ravel() ** 2, weight * G_decayed.ravel() ** 2]))
            out["c2_sums"].append(np.concatenate([weight * np.sum(g * g, axis=(-2, -1)), weight * np.sum(G_decayed**2, axis=(-2, -1)),
                                                  state.v, v_hat]))
            out["c_inverse"].append(config.lr / (1 - beta1**t) / np.sqrt(v_hat))
    return {name: np.concatenate(value) for name, value in out.items()}


def predicted_domain(W0, gradients, config, dtype: str) -> dict:
    """The range of k in which the kernel's trajectories under 2^k G must equal those under G bit for
    bit (module docstring), and the k below which the first step's increment underflows to 0 in
    every term (v = 0: a zero step), from the float64 reference at c = 1 and the dtype's limits."""
    tiny_s, max_s, _ = _limits(dtype)
    tiny_c, max_c, log2_eta = _limits(step_analysis.COMPUTE_DTYPES[dtype])
    q = unit_quantities(W0, gradients, config)
    spare = 2.0**MARGIN_BINADES
    log2 = lambda x: math.log2(x)  # noqa: E731

    def smallest(x):
        x = x[x > 0]
        return float(np.min(x)) if x.size else math.inf

    lows = {
        "gradient_normal": log2(tiny_s * spare / smallest(q["c_storage"])),
        "stage_entries_normal": log2(tiny_c * spare / smallest(q["c_compute"])),
        "increment_terms_normal": 0.5 * log2(tiny_c * spare**2 / smallest(q["c2_terms"])),
        "moments_normal": 0.5 * log2(tiny_c * spare**2 / smallest(q["c2_sums"])),
        "coefficient_finite": log2(float(np.max(q["c_inverse"])) * spare / max_c),
    }
    highs = {
        "gradient_finite": log2(max_s / spare / float(np.max(q["c_storage"]))),
        "stage_entries_finite": log2(max_c / spare / float(np.max(q["c_compute"]))),
        "increment_finite": 0.5 * log2(max_c / spare**2 / float(np.max(q["c2_sums"]))),
        "coefficient_normal": log2(smallest(q["c_inverse"]) / (tiny_c * spare)),
    }
    first_terms = q["c2_terms"][: q["c2_terms"].size // max(len(gradients), 1)]
    return {
        "log2_c_low": math.ceil(max(lows.values())),
        "log2_c_high": math.floor(min(highs.values())),
        "log2_c_zero_step_below": math.ceil(0.5 * (log2_eta - log2(float(np.max(first_terms))))),
        "lower_limits": {name: round(value, 2) for name, value in lows.items()},
        "upper_limits": {name: round(value, 2) for name, value in highs.items()},
    }


def _kernel_runs(W0, gradients, ks, dtype, device, variant, config):
    """The kernel's trajectories under 2^k G for every k in ks at once (frames (k, n) flattened):
    [(W, m, v) as float64 arrays of shapes (K, n, d, r), (K, n, d, r), (K, n)] for t = 1..T."""
    import torch

    n_k, (count, d, r) = len(ks), W0.shape
    work = state_dtype(dtype)
    with np.errstate(over="ignore"):
        scales = np.ldexp(1.0, ks)[:, None, None, None]
    W = to_torch(np.broadcast_to(W0, (n_k,) + W0.shape).reshape(-1, d, r), dtype, device)
    m = torch.zeros(W.shape, dtype=work, device=device)
    v = torch.zeros(W.shape[0], dtype=work, device=device)
    runs = []
    for t, G in enumerate(gradients):
        with np.errstate(over="ignore", invalid="ignore"):
            scaled = (scales * G[None]).reshape(-1, d, r)
        W, m, v = run_kernel(W, to_torch(scaled, dtype, device), m, v, t, config, variant)
        runs.append(tuple(to_numpy(x).reshape((n_k, count) + x.shape[1:]) for x in (W, m, v)))
    return runs


def _ulps(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """|x - y| / ulp(|y|) entrywise (ulps of float64; 0 exactly where equal, NaN where not finite)."""
    diff = np.abs(x - y)
    return np.where(diff == 0, 0.0, diff / np.spacing(np.abs(y)))


def _bitwise_residuals(runs, ks):
    """Per k, the largest ulps between the run under 2^k G and the run under G (k = 0): W, m / 2^k,
    v / 4^k over every step and frame; NaN where a run is not finite."""
    zero = int(np.searchsorted(ks, 0))
    worst = np.zeros(len(ks))
    finite = np.ones(len(ks), dtype=bool)
    with np.errstate(all="ignore"):
        scales = np.ldexp(1.0, ks)
        for W, m, v in runs:
            pairs = ((W, W[zero]), (m / scales[:, None, None, None], m[zero]), (v / scales[:, None] ** 2, v[zero]))
            for scaled, unit in pairs:
                rows = scaled.reshape(len(ks), -1)
                finite &= np.all(np.isfinite(rows), axis=1)
                worst = np.fmax(worst, np.max(_ulps(rows, unit.reshape(1, -1)), axis=1))
    return np.where(finite, worst, np.nan)


def _found_range(ks, ok):
    """[first, last] k of the run of True around k = 0 (None where k = 0 itself fails)."""
    zero = int(np.searchsorted(ks, 0))
    if not ok[zero]:
        return None
    low, high = zero, zero
    while low > 0 and ok[low - 1]:
        low -= 1
    while high < len(ks) - 1 and ok[high + 1]:
        high += 1
    return [int(ks[low]), int(ks[high])]


def subnormal_band(W, G, m, v, t, ks, dtype, device, variant, config, check, key, seed) -> int:
    """One step from (W, 2^k G, 2^k m, 4^k v) for each k in ks (the subnormal band), against the step
    from (W, G, m, v): each run within step_error of the exact step at its own input, the scaled run's
    v with the underflow allowance of BAND_TEXT. W, G, m (n, d, r), v (n,): float64 values of the
    kernel's state at step t (m before its transport). Returns the frame-steps not well posed there
    (v's error reaching v: not compared)."""
    d, r = W.shape[-2], W.shape[-1]
    work = state_dtype(dtype)
    _, _, log2_eta = _limits(step_analysis.COMPUTE_DTYPES[dtype])
    beta2 = config.betas[1]
    state = ref.StiefelAdamState(m=ref.project_tangent(W, m, validate=False), v=v, t=t)
    q = reference_quantities(W, G, state, config)
    rounding = step_analysis.kernel_rounding(dtype, config.trust_radius, d, r)
    transport = transport_roundoff(d, r, rounding.u_c, m)
    plain = step_error(d, r, config, step_norms_of(q, r), rounding, InputErrors(m=transport))
    W_plain, _, _ = run_kernel(to_torch(W, dtype, device), to_torch(G, dtype, device), to_torch(m, work, device),
                               to_torch(v, work, device), t, config, variant)
    skipped = 0
    for k in ks:
        c = math.ldexp(1.0, int(k))
        W_c, _, _ = run_kernel(to_torch(W, dtype, device), to_torch(c * G, dtype, device), to_torch(c * m, work, device),
                               to_torch(c * c * v, work, device), t, config, variant)
        underflow = math.ldexp(4 * d * r + 9, log2_eta - 2 * int(k)) / beta2  # (4 d r + 9) eta_c / (beta2 c^2)
        scaled = step_error(d, r, config, step_norms_of(q, r), rounding, InputErrors(m=transport, v=underflow))
        posed = plain.well_posed & scaled.well_posed
        skipped += int(np.count_nonzero(~posed))
        residual = ref.frobenius(to_numpy(W_c) - to_numpy(W_plain))
        check.add(np.where(posed, residual, 0.0), np.where(posed, plain.W + scaled.W, 1.0), shape=(d, r), key=key, seed=seed,
                  extra={"log2_c": int(k), "step": t + 1, "dtype": dtype})
    return skipped


def scale_scan(seed, device, dtype, variant, checks, config=SCALE_CONFIG) -> dict:
    """The kernel's P2 over every k of `dtype`'s exponent range (module docstring). checks: {"bitwise",
    "band"} NumericalChecks, filled. Returns what the certificate records: the predicted domain, the
    range of k found bitwise around 0, where v underflowed to 0 or the run was not finite, and the
    frame-steps of the band not compared."""
    d, r = SCALE_SHAPE
    key = (CLAIM_ID, "scale", dtype, d, r)
    rng = rng_for(seed, *key)
    W0 = stored(ref.random_point(d, r, rng, (SCALE_FRAMES,)), dtype)
    gradients = stored(rng.standard_normal((SCALE_STEPS, SCALE_FRAMES, d, r)), dtype)
    predicted = predicted_domain(W0, gradients, config, dtype)
    low, high = exponent_range(dtype)
    ks = np.arange(low, high + 1)
    runs = _kernel_runs(W0, gradients, ks, dtype, device, variant, config)
    ulps = _bitwise_residuals(runs, ks)
    inside = (ks >= predicted["log2_c_low"]) & (ks <= predicted["log2_c_high"])
    for k, residual in zip(ks[inside], ulps[inside]):
        checks["bitwise"].add(np.array([np.inf if np.isnan(residual) else residual]), 0.5, shape=(d, r), key=key, seed=seed,
                              extra={"log2_c": int(k), "dtype": dtype})
    band = ks[(ks >= predicted["log2_c_zero_step_below"]) & (ks < predicted["log2_c_low"])]
    if dtype in BAND_ELSEWHERE:
        band = band[:0]
    W_prev, m_prev, v_prev = (x[int(np.searchsorted(ks, 0))] for x in runs[-2])
    skipped = subnormal_band(W_prev, gradients[-1], m_prev, v_prev, SCALE_STEPS - 1, band, dtype, device, variant, config,
                             checks["band"], key, seed) if band.size else 0
    v_last = runs[-1][2]
    return {
        "shape": [d, r], "frames": SCALE_FRAMES, "steps": SCALE_STEPS, "k_range_scanned": [int(low), int(high)],
        "predicted": predicted,
        "log2_c_bitwise_found": _found_range(ks, ulps == 0),
        "log2_c_v_zero": [int(k) for k in ks[np.any(v_last == 0, axis=1)]][-1:] or None,
        "log2_c_non_finite_from": next((int(k) for k, u in zip(ks, ulps) if np.isnan(u) and k > 0), None),
        "subnormal_band": [int(band[0]), int(band[-1])] if band.size else None,
        "subnormal_band_not_posed": skipped,
    }


__all__ = ["BAND_TEXT", "BITWISE_TEXT", "SCALE_CONFIG", "SCALE_DTYPES", "exponent_range", "predicted_domain", "scale_scan",
           "subnormal_band", "unit_quantities"]
