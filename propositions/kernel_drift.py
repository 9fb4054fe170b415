"""The drift of the PyTorch kernel's frames: corrected at every step, so bounded by one step's rounding.

The kernel retracts by the polar factor of the actual A = W + xi, computed from the actual Gram
matrix A^T A: whatever drift ||W^T W - I|| the frame it receives has, the frame it returns is
orthonormal up to the rounding of that one step (step_analysis.newton_schulz_defect: fl(A^T A), the
last Newton-Schulz iteration, the product A M and the storage cast). This is the correction
property, and the drift of a run follows from it: after any number of steps the frame's drift is
bounded by the one-step bound of its last step, evaluated at that step's own A.

Two checks hold the kernel to it:

* drift_correction: frames with a planted drift ||W^T W - I||_F = PLANTED_DRIFT (4e-3, inside the
  kernel's drift allowance) get one step; the frame returned must be within the one-step bound at
  its own A (the drift enters through A's spectrum, from which the iteration's residual is taken). A retraction that
  trusts W^T W = I, (W + xi)(I + xi^T xi)^(-1/2), returns a frame with about the drift it got: 4e-3
  against a bound of about 3e-6 in float32.
* long_run_feasibility: profile.kernel_steps steps (LONG_RUN_CONFIG, small steps so that a drift
  which is not corrected random-walks instead of being damped by the xi^T xi of large steps) in
  float64, float32 and bfloat16; at each checkpoint t the drift of W_t against the one-step bound
  at the exact A of step t (its frame W_{t-1}, gradient and state as the kernel held them), so the
  bound follows the run. Uncorrected, the storage rounding of each step accumulates: in float32 about
  2e-4 after 3000 steps at (4, 2) against a bound of 3e-6; in bfloat16 0.2 to 0.6 against 0.011.

Part of the cross-check; it defines no claim.
"""

from __future__ import annotations

import time

import numpy as np

import reference_impl as ref
from propositions._common import rng_for
from propositions.kernel_variants import run_kernel, state_dtype, stored, to_numpy, to_torch
from propositions.kit import step_analysis
from propositions.kit.step_analysis import reference_quantities

CLAIM_ID = "crosscheck"

# small steps (length about lr sqrt(d r) = 0.03 at (4, 2)), inside the Newton-Schulz route's trust region
LONG_RUN_CONFIG = ref.StiefelAdamConfig(lr=0.01, betas=(0.9, 0.999), eps=1e-8, trust_radius=0.5, weight_decay=0.1)
# (batch, d, r): small frames, where the one-step bound is reached within a small factor
LONG_RUN_SHAPE = (8, 4, 2)
LONG_RUN_DTYPES = ("float64", "float32", "bfloat16")

PLANTED_DRIFT = 4e-3
DRIFT_SHAPES = ((2, 1), (3, 2), (4, 2), (8, 3), (16, 4))
DRIFT_CONFIGS = ("clip_decay", "defaults", "sharp_beta2")

DEFECT_TEXT = ("the one-step bound at the step's own A (step_analysis.gram_route_defect: the Newton-Schulz route's defect, "
               "its residual e_k iterated from A's spectrum, k derived from Delta, u_c and the frame's drift; the float64 "
               "evaluation added by evaluated_defect); " + step_analysis.stage_texts(("newton_schulz_defect",)))


def one_step_defect_bound(W, G, m, v, t, config, dtype):
    """Per frame, the bound on ||W+^T W+ - I||_F (evaluated in float64) of the kernel's step from the
    float64 values (W, G, m, v, t) it received (m before its transport): gram_route_defect at the
    exact A = W + xi of that input (reference_quantities), for a kernel whose frames are stored in
    `dtype`, with the Newton-Schulz count the certifier derives (step_analysis.kernel_rounding) and
    its residual iterated from A's own spectrum, so that a drift of the input frame enters through
    that spectrum. Where the spectrum is outside the iteration's basin (no finite residual), the
    smallest normal number: the sample fails rather than pass against a bound that does not exist.
    Returns (bound (n,), the exact step's quantities)."""
    d, r = W.shape[-2], W.shape[-1]
    state = ref.StiefelAdamState(m=ref.project_tangent(W, m, validate=False), v=np.asarray(v, dtype=np.float64), t=t)
    q = reference_quantities(W, G, state, config)
    rounding = step_analysis.kernel_rounding(dtype, config.trust_radius, d, r)
    defect = step_analysis.evaluated_defect(
        step_analysis.gram_route_defect(d, r, rounding, config.trust_radius, q["A"], q["sigma_min"], q["A_2"]), d, r)
    return np.where(np.isfinite(defect), defect, np.finfo(np.float64).tiny), q


def _drifted_frames(rng, d: int, r: int, count: int, drift: float) -> np.ndarray:
    """count frames W = Q (I + D)^(1/2), Q Haar on St(d, r), D symmetric with ||D||_F = drift: so
    W^T W - I = D exactly (before rounding to a storage dtype)."""
    Q = ref.random_point(d, r, rng, (count,))
    D = rng.standard_normal((count, r, r))
    D = D + np.swapaxes(D, -1, -2)
    D *= drift / np.linalg.norm(D, axis=(-2, -1), keepdims=True)
    eigenvalues, eigenvectors = np.linalg.eigh(np.eye(r) + D)
    root = (eigenvectors * np.sqrt(eigenvalues)[..., None, :]) @ np.swapaxes(eigenvectors, -1, -2)
    return Q @ root


def drift_correction(seed, device, dtype, variant, check, configs, count: int = 16) -> int:
    """One step from frames with drift PLANTED_DRIFT (`_drifted_frames`, stored in `dtype`), fresh
    (m = 0, v = 0, t = 0) for half the frames and warm (m tangent, v > 0, t = 5) for the rest; the
    returned frame's drift against one_step_defect_bound. configs: {name: StiefelAdamConfig}.
    Fills `check`; returns the number of frames."""
    frames = 0
    work = state_dtype(dtype)
    for d, r in DRIFT_SHAPES:
        for config_name in DRIFT_CONFIGS:
            config = configs[config_name]
            key = (CLAIM_ID, "drift_correction", d, r, config_name)
            rng = rng_for(seed, *key)
            W = stored(_drifted_frames(rng, d, r, count, PLANTED_DRIFT), dtype)
            G = stored(rng.standard_normal(W.shape), dtype)
            warm = np.arange(count) >= count // 2
            m = stored(np.where(warm[:, None, None], ref.project_tangent(W, rng.standard_normal(W.shape), validate=False), 0.0), work)
            v = stored(np.where(warm, np.sum(m * m, axis=(-2, -1)) / (d * r) * rng.uniform(0.5, 2.0, count), 0.0), work)
            drift_in = ref.feasibility(W, validate=False)
            for t, rows in ((0, ~warm), (5, warm)):
                W_out, _, _ = run_kernel(to_torch(W[rows], dtype, device), to_torch(G[rows], dtype, device),
                                         to_torch(m[rows], work, device), to_torch(v[rows], work, device), t, config, variant)
                bound, _ = one_step_defect_bound(W[rows], G[rows], m[rows], v[rows], t, config, dtype)
                check.add(ref.feasibility(to_numpy(W_out), validate=False), bound, shape=(d, r), key=key, seed=seed,
                          extra={"config": config_name, "step": t + 1, "dtype": dtype, "drift_in": float(np.max(drift_in[rows]))})
            frames += count
    return frames


def long_run(seed, steps, device, dtype, variant, check, shape=LONG_RUN_SHAPE, config=LONG_RUN_CONFIG):
    """`steps` steps of random gradients (a pool of 64, cycled) from Haar frames stored in `dtype`; at
    each of about 25 checkpoints t the drift ||W_t^T W_t - I||_F (in float64) against the one-step
    bound of step t at its own input (one_step_defect_bound, the drift of W_{t-1} measured). Fills
    `check`. Returns {"steps", "feasibility_max", "bound_max", "bound_min"} (lists over the checkpoints,
    over the batch) and the seconds the run took."""
    import torch

    batch, d, r = shape
    work = state_dtype(dtype)
    rng = rng_for(seed, CLAIM_ID, "long_run", f"torch.{dtype}", d, r)
    W = to_torch(ref.random_point(d, r, rng, (batch,)), dtype, device)
    pool = to_torch(rng.standard_normal((64,) + W.shape), work, device)
    m = torch.zeros(W.shape, dtype=work, device=device)
    v = torch.zeros(W.shape if variant == "elementwise_second_moment" else W.shape[:-2], dtype=work, device=device)
    checkpoints = set(int(round(x)) for x in np.geomspace(1, steps, num=min(25, steps)))
    record = {"steps": [], "feasibility_max": [], "bound_max": [], "bound_min": []}
    start = time.perf_counter()
    for t in range(steps):
        inputs = (W, pool[t % 64], m, v)
        W, m, v = run_kernel(*inputs, t, config, variant)
        if t + 1 in checkpoints:
            W_in, G_in, m_in, v_in = (to_numpy(x) for x in inputs)
            feasibility = ref.feasibility(to_numpy(W), validate=False)
            if v_in.ndim == 1:
                bound, _ = one_step_defect_bound(W_in, G_in, m_in, v_in, t, config, dtype)
            else:  # an elementwise second moment has no step of docs/algorithm.md to evaluate: the a-priori bound
                rounding = step_analysis.kernel_rounding(dtype, config.trust_radius, d, r)
                bound = np.full(batch, step_analysis.frame_drift_bound(d, r, rounding.u_W, rounding.u_c, config.trust_radius))
            check.add(feasibility, bound, shape=(d, r), key=(CLAIM_ID, "long_run", f"torch.{dtype}", d, r),
                      extra={"step": t + 1, "dtype": dtype})
            for name, value in (("steps", t + 1), ("feasibility_max", float(np.max(feasibility))),
                                ("bound_max", float(np.max(bound))), ("bound_min", float(np.min(bound)))):
                record[name].append(value)
    return record, time.perf_counter() - start


def long_run_steps_text(steps: int) -> str:
    batch, d, r = LONG_RUN_SHAPE
    return (f"||W^T W - I||_F over {steps} steps, batch ({batch}, {d}, {r}), lr {LONG_RUN_CONFIG.lr}, trust radius "
            f"{LONG_RUN_CONFIG.trust_radius}")


__all__ = ["DEFECT_TEXT", "LONG_RUN_CONFIG", "LONG_RUN_DTYPES", "LONG_RUN_SHAPE", "PLANTED_DRIFT", "drift_correction", "long_run",
           "long_run_steps_text", "one_step_defect_bound"]
