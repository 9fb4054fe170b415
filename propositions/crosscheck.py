"""Cross-check: the PyTorch kernel computes the step that reference_impl certifies.

Claim. For frames W on St(d, r), gradients G and states (m, v, t), one call of
`torch_impl.functional.stiefel_adam_step` returns (W+, m, v+) equal to `reference_impl.step` up to
an explicit rounding bound, in float64, float32 and bfloat16 storage, each stage held to the
precision the kernel declares for it (torch_impl.functional.declared_precision). The kernel itself
keeps P2 (gradient-scale independence, eps = 0) over each dtype's whole exponent range and P4
(O(d) x O(r) equivariance), and the frames it returns are orthonormal up to one step's rounding
whatever drift the frame it got had, so their drift over a run follows one step's bound.

Why it should hold. Both compute the same eight stages of docs/algorithm.md; they differ only in
rounding, in the retraction's algorithm (thin SVD in the reference, the Gram matrix with a
quintic Newton-Schulz or eigh in torch), in where the transport of m happens (the torch kernel
does stage 8's P_{W+}(m) inside the next step's projection of beta1 m + (1 - beta1) G~) and in
how ||g||^2 is formed (from r x r quantities where that is as accurate), all of which agree
exactly in exact arithmetic; the Gram route recomputes the polar factor from the actual W + xi.

How it is checked. Haar frames over the shape grid of propositions._common.shape_plan (r = 1,
r = d, batches, up to (1024, 128)) run multi-step reference trajectories with random gradients under
rotating configurations; at every step the torch kernel gets the reference's state rounded to its
storage dtype (W, G) and state dtype (m, v: m as its own state holds it, before the transport), the
reference steps from exactly those values, and the kernel's W+, stage 3's m and v+ are compared with
the reference's, frame by frame, against `step_error_bound`: the one rounding analysis of the step
(propositions/kit/step_analysis.py) of the kernel at the precision it declares plus that of the
reference in float64 (the transport's rounding is charged to the step that performs it,
`transport_roundoff`). The same lock-step runs in float32 and bfloat16 on small frames with every
configuration (declared_precision_part), where a stage evaluated more coarsely than declared shows
most above its bound. The frames given to the kernel are held to the drift its own frames may have
(step_analysis.frame_drift_bound); frames with a planted drift must come back within one step's
bound (propositions.kernel_drift.drift_correction), and long runs in every dtype hold each
checkpoint to the one-step bound of its own step. P2 and P4 run on the torch kernel alone in
float64, and P2 over every power of two of each dtype's exponent range (propositions.kernel_scale).
How tight each stage bound is at float32 and bfloat16 is searched and recorded
(propositions.kernel_attainment). On CPU the run uses one torch and one BLAS thread, and reports
whether two torch threads change the residuals.

What would make it fail. Any stage computed differently or more coarsely than declared: the
controls (propositions.kernel_variants) replace the scalar second moment by Adam's elementwise one,
the polar retraction by Muon's tuned Newton-Schulz coefficients or by the shortcut
(W + xi)(I + xi^T xi)^(-1/2), keep m and v in the storage dtype, form beta^t in the compute dtype,
square the unscaled gradient, floor v or hide an eps in the denominator; each must be detected with a
margin of at least DETECTION_FACTOR.
"""

from __future__ import annotations

import contextlib
import math
import platform
from dataclasses import replace

import numpy as np

import reference_impl as ref
from propositions._common import (
    DETECTION_FACTOR,
    SMALL_SHAPES,
    NumericalCheck,
    Profile,
    chunk_sizes,
    get_profile,
    rng_for,
    shape_plan,
    ulps_apart,
)
from propositions.kit import tightness
from propositions.kit import step_analysis
from propositions.kit.bounds import gram_defect_bound
from propositions.kit.step_analysis import InputErrors, Rounding, kernel_rounding, stage_texts, step_error_text
from propositions.kit.step_analysis import reference_quantities
from propositions.kit.figures import LineFigure, Series
from propositions.kit.threads import one_thread
from propositions.kit.parallel import map_tasks
from propositions.kit.kernel_bounds import reference_moment, step_error_bound, transport_roundoff
from propositions.kit.common import ControlResult
from propositions.kit.protocol import Claim, Context, Control, Counts, Evidence, Part, Symbolic
from propositions import kernel_attainment, kernel_drift, kernel_scale
from propositions.kernel_variants import CONTROL_DESCRIPTIONS, KERNEL_VARIANTS, REAL_KERNEL
from propositions.kernel_variants import dtype_name as _dtype_name, run_kernel as _kernel, state_dtype as _compute_dtype
from propositions.kernel_variants import stored as _stored, to_numpy as _to_numpy, to_torch as _to_torch
from propositions.kernel_variants import torch_dtype as _torch_dtype

# torch is imported by the functions that use it, never at module level: `import propositions` and
# the claim's registry entry work where torch is not installed.

CLAIM_ID = "crosscheck"
DTYPE_NAMES = ("float64", "float32", "bfloat16")
U64 = step_analysis.U64



# Three configurations, alternating over shapes and chunks: "clip_decay" has weight decay and takes
# first steps of length lr sqrt(d r) > Delta wherever d r > 100 (the trust region is active);
# "defaults" is docs/algorithm.md's; "no_trust_region" (Delta = inf) takes the kernel's eigh retraction
# instead of Newton-Schulz, so both paths are held to the reference. "sharp_beta1" and "sharp_beta2"
# put one beta close to 1, where 1 - beta^t formed from beta rounded to float32 is off by 22784 u32
# relative (beta = 0.99999, u32 = 2^-24), with steps of length up to lr sqrt(d r) that the trust
# region does not cap on frames up to (8, 3): the bias corrections decide the step.
CONFIGS = {
    "clip_decay": ref.StiefelAdamConfig(lr=0.05, betas=(0.9, 0.999), eps=1e-8, trust_radius=0.5, weight_decay=0.1),
    "defaults": ref.StiefelAdamConfig(),
    "no_trust_region": ref.StiefelAdamConfig(trust_radius=math.inf, weight_decay=0.1),
    "sharp_beta1": ref.StiefelAdamConfig(lr=0.1, betas=(0.99999, 0.999), eps=0.0, trust_radius=1.0, weight_decay=0.0),
    "sharp_beta2": ref.StiefelAdamConfig(lr=0.1, betas=(0.9, 0.99999), eps=0.0, trust_radius=1.0, weight_decay=0.0),
}

# --------------------------------------------------------------------------------------------
# The error analysis
# --------------------------------------------------------------------------------------------







# --------------------------------------------------------------------------------------------
# Pieces of the run
# --------------------------------------------------------------------------------------------


def _kernel_rounding(config, dtype, d: int, r: int) -> Rounding:
    """The kernel's unit roundoffs and retraction route for storage `dtype` (step_analysis.kernel_rounding:
    the Newton-Schulz iteration count derived on the certifier's side, never read from the kernel)."""
    return kernel_rounding(_dtype_name(dtype), config.trust_radius, d, r)


def _iterations(config, dtype, d: int = 1, r: int = 1) -> int:
    """The Newton-Schulz iteration count the certifier derives (0 on the eigh route)."""
    return _kernel_rounding(config, dtype, d, r).iterations





def _step_counts(t: int, size: int, per_frame: bool, device):
    """The kernel's step count: one int for every frame, or a float64 tensor with one count per
    frame (the optimizer's form, whose bias corrections are torch.pow on the device)."""
    import torch

    return torch.full((size,), float(t), dtype=torch.float64, device=device) if per_frame else t


def lockstep_crosscheck(seed, profile, frames, device, dtype, variant, checks, undefined=None, shapes=None, configs=None,
                        label="lockstep"):
    """Multi-step reference trajectories with the torch kernel compared at every step (see module
    doc). Fills checks["W"], checks["m"], checks["v"]; returns the number of frames. undefined: a
    one-element list to which the count of frame-steps where step_error is undefined is added
    (q = sqrt(v^) + eps not above its error: G = 0 with weight decay in float32 or bfloat16, where
    the rounding of P_W(lambda W) is comparable to eps; those W and m are not compared).

    At every step the kernel gets the reference's state rounded to its storage dtype (W, G) and
    state dtype (m, v), and the reference steps from exactly those values: each output is compared
    with the reference's step at the kernel's own input, so the inputs' rounding, the same on both
    sides, hides nothing, and each stage is held to the precision the kernel declares. shapes
    (default: the profile's shape plan) and configs (names of CONFIGS; default one per chunk, in
    turn) choose what runs; every other chunk (alternating over shapes, chunks and configurations)
    passes the step count as a per-frame tensor."""
    undefined = [0] if undefined is None else undefined
    plan = shape_plan(profile, frames=frames) if shapes is None else shape_plan(profile, small=shapes, large=(), frames=frames)
    frames_done = 0
    for shape_index, batch in enumerate(plan):
        for chunk_index, size in enumerate(chunk_sizes(batch.count, batch.d, batch.r, max_entries=2**19)):
            names = [list(CONFIGS)[(shape_index + chunk_index) % len(CONFIGS)]] if configs is None else configs
            for config_index, config_name in enumerate(names):
                key = (CLAIM_ID, label, batch.d, batch.r, chunk_index) + ((config_name,) if configs is not None else ())
                _lockstep_chunk(seed, key, size, config_name, _steps_for(profile, batch.d, batch.r), device, dtype, variant,
                                checks, undefined, per_frame=(shape_index + chunk_index + config_index) % 2 == 1)
                frames_done += size
    return frames_done


def _lockstep_chunk(seed, key, size, config_name, steps, device, dtype, variant, checks, undefined, per_frame):
    """One chunk of lockstep_crosscheck: `size` frames of shape key[2:4], `steps` steps."""
    import torch

    d, r = key[2], key[3]
    config = CONFIGS[config_name]
    state_dtype = _compute_dtype(dtype)
    rng = rng_for(seed, *key)
    W = ref.random_point(d, r, rng, (size,))
    state = ref.init(W)
    elementwise = variant == "elementwise_second_moment"
    v_torch_own = torch.zeros((size, d, r), dtype=state_dtype, device=device) if elementwise else None
    # the kernel's own state holds the moment before its transport (functional.stiefel_adam_step)
    moment_in = state.m
    rounding = _kernel_rounding(config, dtype, d, r)
    drift_bound = step_analysis.frame_drift_bound(d, r, rounding.u_W, rounding.u_c, config.trust_radius)
    near_eps = _near_eps_scales(seed, key, size, config, rounding.u_c)
    if config.eps > 0 and np.any(near_eps != 1.0):  # how far below and above eps the scaled frames reach
        checks["m"].reach("log2_scale_over_eps", np.log2(near_eps[near_eps != 1.0] / config.eps))
    for t in range(steps):
        G = rng.standard_normal(W.shape) * near_eps[:, None, None]
        if t == 0:
            G[0] = 0.0  # the v^ = 0 branch: xi must be exactly 0, never 0/0
        W_in, G_in = _stored(W, dtype), _stored(G, dtype)
        m_in, v_in = _stored(moment_in, state_dtype), _stored(state.v, state_dtype)
        state_in = ref.StiefelAdamState(m=ref.project_tangent(W_in, m_in, validate=False), v=v_in, t=state.t)
        q = reference_quantities(W_in, G_in, state_in, config)
        W_next, state_next = ref.adam._step(W_in, G_in, state_in, config)
        moment_next = reference_moment(W_in, G_in, state_in, config)
        v_arg = v_torch_own if elementwise else _to_torch(v_in, state_dtype, device)
        W_t, m_t, v_t = _kernel(_to_torch(W_in, dtype, device), _to_torch(G_in, dtype, device), _to_torch(m_in, state_dtype, device),
                                v_arg, _step_counts(state.t, size, per_frame, device), config, variant)
        if elementwise:
            v_torch_own = v_t
        # the kernel projects the moment it receives (the previous step's transport) in its compute
        # dtype, the reference in float64: transport_roundoff charges both to the kernel's input
        bound = step_error_bound(d, r, config, q, rounding, InputErrors(m=transport_roundoff(d, r, rounding.u_c, m_in)))
        extra = {"step": t + 1, "config": config_name, "dtype": _dtype_name(dtype), "per_frame_count": per_frame}
        # where step_error is undefined (the noise-driven step, docs/algorithm.md#pitfalls) W is not
        # compared: residual 0 against bound 1, and the frame-step is counted in `undefined`
        posed = bound["well_posed"]
        undefined[0] += int(np.count_nonzero(~posed))
        checks["W"].add(np.where(posed, ref.frobenius(_to_numpy(W_t) - W_next), 0.0), np.where(posed, bound["W"], 1.0),
                        shape=(d, r), key=key, seed=seed, extra=extra)
        checks["m"].add(ref.frobenius(_to_numpy(m_t) - moment_next), bound["moment"], shape=(d, r), key=key, seed=seed, extra=extra)
        if not elementwise:
            checks["v"].add(np.abs(_to_numpy(v_t) - state_next.v), bound["v"], shape=(d, r), key=key, seed=seed, extra=extra)
        if not math.isinf(drift_bound):
            checks["frames_in"].add(ref.frobenius(_gram_defect(W_in)), drift_bound, shape=(d, r), key=key, seed=seed, extra=extra)
        if "rounding" in checks and rounding.cast > 0:
            # before its storage cast the kernel's W+ is within the analysis without the cast: its
            # rounding to the storage dtype is decided wherever the exact W+ is farther than that from
            # a rounding boundary, and there it must be the exact W+'s own rounding
            uncast = replace(rounding, u_W=rounding.u_c)
            before_cast = step_error_bound(d, r, config, q, uncast, InputErrors(m=transport_roundoff(d, r, rounding.u_c, m_in)))
            wrong = _misrounded(_to_numpy(W_t), W_next, np.where(posed, before_cast["W"], np.inf), dtype)
            checks["rounding"].add(wrong, np.full(size, 0.5), shape=(d, r), key=key, seed=seed, extra=extra)
        moment_in, W, state = moment_next, W_next, state_next


def _near_eps_scales(seed, key, size: int, config, u_c: float) -> np.ndarray:
    """(size,) gradient scales of a lock-step chunk: 1, except every fourth frame (3, 7, ...) where
    eps > 0, which gets a power of two 2^j eps, j in [-4, 4] (its own generator: the other frames'
    draws are those of scale 1). At scale 1, sqrt(v^) is about 1 and eps = 1e-8 is far below its
    rounding, so how the kernel rounds eps (to the compute dtype, as it declares, or coarser) cannot
    show; near sqrt(v^) = eps it decides the step's length. A power of two scales G exactly. Not where
    weight decay's rounding noise would rival the gradient: P_W(lambda W) is rounding noise of about
    lambda u_c per entry, and the smallest scale drawn is 2^-4.5 eps or more, so lambda u_c <= 2^-12 eps
    keeps the noise below 2^-7 of every scaled gradient's entries (float64 with lambda = 0.1: 1.1e-17
    against 2.4e-12; float32: 6e-9, excluded). Elsewhere the step would be noise-driven
    (docs/algorithm.md#pitfalls) and not compared."""
    scales = np.ones(size)
    if config.eps <= 0 or config.weight_decay * u_c > config.eps * 2.0**-12:
        return scales
    chosen = np.arange(3, size, 4)
    exponents = rng_for(seed, *key, "near_eps").integers(-4, 5, chosen.size)
    scales[chosen] = np.ldexp(1.0, np.round(np.log2(config.eps)).astype(int) + exponents)
    return scales


def _misrounded(stored_values: np.ndarray, exact: np.ndarray, before_cast_bound: np.ndarray, dtype) -> np.ndarray:
    """Per frame, the number of entries whose rounding to the storage dtype (bfloat16) the analysis
    decides and that the kernel rounded otherwise: an entry is decided where the exact value x lies
    farther than the frame's bound on the kernel's error before the cast (Frobenius, so also on each
    entry) from both midpoints between its rounding b = fl(x) and b's neighbours, and then the kernel's
    entry must be b. stored_values, exact: (n, d, r) float64; before_cast_bound: (n,)."""
    import torch

    rounded = _stored(exact, dtype)
    bits = torch.from_numpy(rounded.astype(np.float32)).view(torch.int32)
    # a bfloat16 is the upper 16 bits of a float32: its neighbours are 2^16 units of those bits away
    neighbours = [(bits + step).view(torch.float32).double().numpy() for step in (65536, -65536)]
    distance = np.minimum(*(np.abs(exact - 0.5 * (rounded + neighbour)) for neighbour in neighbours))
    decided = distance > before_cast_bound[:, None, None]
    return np.sum(decided & (stored_values != rounded), axis=(-2, -1)).astype(np.float64)


def _gram_defect(W):
    return np.swapaxes(W, -1, -2) @ W - np.eye(W.shape[-1])





# Frames with d r >= 2^16 ((1024, 128)) take at most LARGE_FRAME_STEPS lock-step steps: the
# reference's thin SVD dominates the run time there, and two steps already exercise the trust region
# (the first step of Adam has length lr sqrt(d r) = 18 > Delta) and the transport of m.
LARGE_FRAME_ENTRIES = 2**16
LARGE_FRAME_STEPS = 2


def _steps_for(profile, d, r) -> int:
    return min(profile.steps, LARGE_FRAME_STEPS) if d * r >= LARGE_FRAME_ENTRIES else profile.steps


P2_SHAPES = ((1, 1), (3, 2), (8, 8), (16, 4), (64, 16))
P4_SHAPES = ((2, 2), (5, 3), (8, 8), (16, 4), (64, 16))


def scale_independence(seed, profile, device, variant, checks, batch=8):
    """P2 on the torch kernel (float64, eps = 0).

    Powers of two c with lambda = 0: whole trajectories under c G and G must be bit-identical
    (ulps, bound 0.5): every stage is homogeneous (m ~ c, v ~ c^2, sqrt(v) ~ c exactly, IEEE sqrt
    being correctly rounded) and scaling by 2^k is exact away from over/underflow. With lambda > 0
    the decay term lambda W does not scale, and P_W(lambda W) = 0 holds only up to rounding, so
    there (and for every c that is not a power of two) the check is bounded: one step from the
    scaled state (c m, c^2 v) against the unscaled one, each within step_error (`step_error_bound`
    without the reference's term) of the exact step from its own inputs, the scaled inputs c G, c m,
    c^2 v carrying relative rounding u, u, 2u.
    """
    import torch

    powers = (2.0**-20, 2.0**-3, 2.0**7, 2.0**30)
    others = (1e-3, 0.3, 3.0, 7.1e4)
    for d, r in P2_SHAPES:
        key = (CLAIM_ID, "P2", d, r)
        rng = rng_for(seed, *key)
        W0 = ref.random_point(d, r, rng, (batch,))
        gradients = [rng.standard_normal(W0.shape) for _ in range(profile.steps)]
        for config_name, config, scales in (
            # lambda = 0: the decay term lambda W is the one input that does not scale with c, and its
            # projection P_W(lambda W) is zero only in exact arithmetic
            ("no_decay", ref.StiefelAdamConfig(lr=0.05, eps=0.0, trust_radius=0.5, weight_decay=0.0), powers),
            ("decay", ref.StiefelAdamConfig(lr=0.05, eps=0.0, trust_radius=0.5, weight_decay=0.1), ()),
        ):
            unscaled_run = _torch_trajectory(W0, gradients, 1.0, config, device, variant)
            for c in scales:
                scaled_run = _torch_trajectory(W0, gradients, c, config, device, variant)
                for t in range(1, len(gradients) + 1):
                    checks["P2_bitwise"].add(
                        ulps_apart(_to_numpy(scaled_run[t][0]), _to_numpy(unscaled_run[t][0])), 0.5,
                        shape=(d, r), key=key, seed=seed, extra={"c": c, "step": t, "config": config_name},
                    )
            for c in others + (powers if config.weight_decay else ()):
                for t, G in enumerate(gradients):
                    W_in, m_in, v_in = unscaled_run[t]
                    W_c, _, _ = _kernel(W_in, _to_torch(c * G, torch.float64, device), c * m_in, (c * c) * v_in, t, config, variant)
                    W_np = _to_numpy(W_in)
                    # the kernel's state holds the moment before its transport; the exact step from
                    # these inputs uses the transported one, and the kernel's transport rounds
                    moment_in = _to_numpy(m_in)
                    state = ref.StiefelAdamState(m=ref.project_tangent(W_np, moment_in, validate=False), v=_to_numpy(v_in), t=t)
                    state_c = ref.StiefelAdamState(m=c * state.m, v=c * c * state.v, t=t)
                    transport = transport_roundoff(d, r, U64, moment_in)
                    rounding = _kernel_rounding(config, "float64", d, r)
                    # each run is within step_error of the exact step from its own inputs; the
                    # scaled inputs carry relative rounding u (c G, c m) and 2u (c^2 v)
                    plain = step_error_bound(d, r, config, reference_quantities(W_np, G, state, config), rounding,
                                             InputErrors(m=transport), reference=False)
                    scaled = step_error_bound(
                        d, r, config, reference_quantities(W_np, c * G, state_c, config), rounding,
                        InputErrors(G_rel=U64, m=c * (U64 * ref.frobenius(state.m) + transport), v=2 * U64 * c * c * state.v),
                        reference=False)
                    bound = _defined(plain["W"] + scaled["W"], plain["well_posed"] & scaled["well_posed"])
                    residual = ref.frobenius(_to_numpy(W_c) - _to_numpy(unscaled_run[t + 1][0]))
                    checks["P2_bounded"].add(residual, bound, shape=(d, r), key=key, seed=seed,
                                             extra={"c": c, "step": t + 1, "config": config_name})


def _defined(bound, well_posed):
    """The bound where step_error is defined; elsewhere the smallest normal number, so that a sample
    whose bound is undefined fails its check instead of passing against an infinite bound."""
    return np.where(well_posed, bound, np.finfo(np.float64).tiny)


def _torch_trajectory(W0, gradients, c, config, device, variant):
    """[(W_t, m_t, v_t) for t = 0..T] of the float64 torch kernel driven by c G_1, c G_2, ..."""
    import torch

    W = _to_torch(W0, torch.float64, device)
    m = torch.zeros_like(W)
    v = torch.zeros(W.shape[:-2] + ((W.shape[-2], W.shape[-1]) if variant == "elementwise_second_moment" else ()),
                    dtype=torch.float64, device=device)
    run = [(W, m, v)]
    for t, G in enumerate(gradients):
        W, m, v = _kernel(W, _to_torch(c * G, torch.float64, device), m, v, t, config, variant)
        run.append((W, m, v))
    return run


def equivariance(seed, profile, device, variant, checks, batch=8):
    """P4 on the torch kernel (float64): step(Q W, Q G, Q m, v) = Q step(W, G, m, v) for Haar Q in
    O(d) (both components), and step(W R, G R, m R, v) = step(W, G, m, v) R for Haar R in O(r).
    Forming Q X rounds each entry by gamma_d (|Q||X|), a relative error <= d^1.5 u in the Frobenius
    norm (|| |Q| ||_2 <= sqrt(d)); the transformed run gets those input errors, the comparison adds
    the rounding of Q W+, and each side is within step_error (`step_error_bound` without the
    reference's term) of the exact step at the plain input."""
    import torch

    config = CONFIGS["clip_decay"]
    for d, r in P4_SHAPES:
        key = (CLAIM_ID, "P4", d, r)
        rng = rng_for(seed, *key)
        W = ref.random_point(d, r, rng, (batch,))
        state = ref.init(W)
        for t in range(profile.steps):
            G = rng.standard_normal(W.shape)
            Q = ref.random_orthogonal(d, rng, (batch,))
            R = ref.random_orthogonal(r, rng, (batch,))
            q = reference_quantities(W, G, state, config)
            args = [_to_torch(x, torch.float64, device) for x in (W, G, state.m, state.v)]
            W_plain, m_plain, _ = _kernel(*args, state.t, config, variant)
            for side, n, transform in (("left", d, lambda X: Q @ X), ("right", r, lambda X: X @ R)):
                moved = [_to_torch(transform(x), torch.float64, device) for x in (W, G, state.m)]
                W_moved, _, _ = _kernel(*moved, args[3], state.t, config, variant)
                u_transform = n**1.5 * U64 * 1.01  # gamma_n sqrt(n), gamma_n = n u / (1 - n u)
                # each side's kernel also projects the incoming moment (its deferred transport)
                transport = transport_roundoff(d, r, U64, state.m)
                rounding = _kernel_rounding(config, "float64", d, r)
                plain = step_error_bound(d, r, config, q, rounding, InputErrors(m=transport), reference=False)
                moved_bound = step_error_bound(
                    d, r, config, q, rounding,
                    InputErrors(W=u_transform * math.sqrt(r), G_rel=u_transform, m=u_transform * q["m_old"] + transport),
                    reference=False)
                bound = _defined(plain["W"] + moved_bound["W"] + u_transform * math.sqrt(r),
                                 plain["well_posed"] & moved_bound["well_posed"])
                residual = ref.frobenius(_to_numpy(W_moved) - transform(_to_numpy(W_plain)))
                checks[f"P4_{side}"].add(residual, bound, shape=(d, r), key=key, seed=seed, extra={"step": t + 1})
            W, state = ref.step(W, G, state, config)


def feasibility_bound(d: int, r: int, dtype, trust_radius: float = 0.5) -> float:
    """Bound on ||W^T W - I||_F (evaluated in float64) of a frame (d, r) stored in dtype after any
    number of kernel steps: for Delta <= 1 step_analysis.frame_drift_bound (the Newton-Schulz route's
    defect, newton_schulz_defect, with the storage cast, at the spectrum a step of length <= Delta
    allows); otherwise the Gram defect (kit/bounds.gram_defect) of a frame within the eigh route's
    polar_eigh at kappa = sqrt(1 + Delta^2) (P3(b)) of an orthonormal one. Nothing in it grows with
    the number of steps: the Gram-based retraction restarts from the actual W every step."""
    rounding = _kernel_rounding(ref.StiefelAdamConfig(trust_radius=trust_radius), dtype, d, r)
    if rounding.route == "newton_schulz":
        return step_analysis.frame_drift_bound(d, r, rounding.u_W, rounding.u_c, trust_radius)
    kappa = math.sqrt(1 + trust_radius**2)  # cond(W + xi) <= sqrt(1 + Delta^2), P3(b), docs/claims.md
    distance = step_analysis.retraction_error(d, r, rounding, kappa, trust_radius) + step_analysis.storage_cast(r=r, u_s=rounding.cast)
    return float(gram_defect_bound(distance, d, r, U64))


# --------------------------------------------------------------------------------------------
# The claim
# --------------------------------------------------------------------------------------------


def torch_environment(device: str = "cpu") -> dict:
    """torch version, its CUDA / cuDNN versions, the device name and thread count."""
    import torch

    device = torch.device(device)
    env = {
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "cuda_available": torch.cuda.is_available(),
        "device": str(device),
        "num_threads": torch.get_num_threads(),
    }
    if device.type == "cuda" and torch.cuda.is_available():
        env["device_name"] = torch.cuda.get_device_name(device)
        env["cudnn"] = torch.backends.cudnn.version()
    else:
        env["device_name"] = platform.processor() or platform.machine()
    return env


def _declared_text(dtype_name: str) -> str:
    """The kernel's declaration for storage dtype_name as the checks cite it."""
    declaration = step_analysis.kernel_declaration(dtype_name)
    coarse = {}
    for stage_name, stage_dtype in declaration["stages"].items():
        coarse.setdefault(stage_dtype, []).append(stage_name)
    stages = "; ".join(f"{stage_dtype}: {', '.join(names)}" for stage_dtype, names in coarse.items())
    return (f"W and G in {declaration['storage']}, m and v in {declaration['state']}, the {declaration['route']} route; "
            f"stages evaluated in {stages}")


def _new_checks(dtype_name: str, prefix: str = "") -> dict:
    """The lock-step checks of one storage dtype, named prefix + name ("float32/frame", or "frame")."""
    rounding = step_analysis.kernel_rounding(dtype_name, 0.5, 1, 1)
    setting = (f"the reference at the kernel's own input (W, G rounded to {dtype_name}, m and v to the state dtype): the kernel's "
               f"step_error at the precision it declares ({_declared_text(dtype_name)}; u_c = {rounding.u_c:.3g}, u_s = "
               f"{rounding.u_W:.3g}; the Gram route: Newton-Schulz for Delta <= 1 with k derived from Delta and u_c, eigh otherwise) "
               "plus the reference's (u_c = 2^-53, the SVD route), no input rounding on either side; ")

    def derivation(output):
        return setting + step_error_text(output)

    def check(name, description, bound_derivation, **kwargs):
        return NumericalCheck(prefix + name, description, bound_derivation, **kwargs)

    coarse = {"rounding": check(
        "frame_rounding", f"entries of W+ ({dtype_name}) that the kernel rounded otherwise than the exact W+ rounds, among those "
        "whose rounding the analysis decides (the exact entry farther than the bound before the storage cast from a rounding "
        "boundary), per frame; bound 0.5: none", "exact: the kernel's W+ before its cast is within the analysis without the cast "
        "(" + step_error_text("W") + ", u_s = 0) of the exact W+, so a decided entry rounds as the exact one",
        tightness_note=tightness.EQUALITY)} if rounding.cast > 0 else {}
    return {**coarse,
        "W": check("frame", f"||W+_torch - W+_ref||_F per frame, {dtype_name}, lock-step over trajectories", derivation("W"),
                   tightness_note=tightness.WORST_CASE_SUMS),
        "m": check("first_moment", f"||m_torch - m_ref||_F per frame, {dtype_name}: stage 3's m, tangent at W before its transport, as "
                   "the kernel returns it (the transport is the next step's projection of it, compared there)", derivation("moment")),
        "v": check("second_moment", f"|v+_torch - v+_ref| per frame, {dtype_name}", derivation("v"), tightness_note=tightness.SAME_ROUNDING),
        "frames_in": check(
            "input_frames",
            f"||W^T W - I||_F of the frames given to the torch kernel ({dtype_name}): within the drift of the kernel's own frames",
            "step_analysis.frame_drift_bound: the Newton-Schulz route's defect at the spectrum a step of length <= Delta "
            "from a frame of that drift allows, a fixed point over the drift (u_c of the compute dtype, u_s of the storage); "
            + stage_texts(("newton_schulz_defect",)),
        ),
    }


THREAD_SAMPLE_SHAPES = ((8, 64, 16), (4, 256, 32))


def thread_sensitivity(seed: int, dtype, threads=(1, 2)) -> dict:
    """Lock-step residuals ||W+_torch - W+_ref|| of a small sample computed with each torch thread
    count in `threads` (CPU): whether they are bit-identical, and the largest relative difference.

    The torch kernel's batched matmuls may split their reductions differently with more threads;
    this measures whether the certificate's residuals depend on the thread count it pins."""
    import torch

    config = CONFIGS["clip_decay"]
    residuals = {}
    saved = torch.get_num_threads()
    try:
        for count in threads:
            torch.set_num_threads(count)
            rows = []
            for batch, d, r in THREAD_SAMPLE_SHAPES:
                rng = rng_for(seed, CLAIM_ID, "threads", d, r)
                W = ref.random_point(d, r, rng, (batch,))
                state = ref.init(W)
                for t in range(2):
                    G = rng.standard_normal(W.shape)
                    W_ref, state_ref = ref.step(W, G, state, config)
                    W_t, _, _ = _kernel(_to_torch(W, dtype, "cpu"), _to_torch(G, dtype, "cpu"),
                                        _to_torch(state.m, _compute_dtype(dtype), "cpu"),
                                        _to_torch(state.v, _compute_dtype(dtype), "cpu"), state.t, config)
                    rows.append(ref.frobenius(_to_numpy(W_t) - W_ref))
                    W, state = W_ref, state_ref
            residuals[count] = np.concatenate(rows)
    finally:
        torch.set_num_threads(saved)
    first, *others = (residuals[c] for c in threads)
    scale = np.maximum(first, np.finfo(np.float64).tiny)
    return {
        "threads": list(threads),
        "identical": all(np.array_equal(first, other) for other in others),
        "max_relative_difference": max((float(np.max(np.abs(other - first) / scale)) for other in others), default=0.0),
        "samples": int(first.size),
    }


# --------------------------------------------------------------------------------------------
# The parts of the certificate
# --------------------------------------------------------------------------------------------

DEFAULT_OPTIONS = (("device", "cpu"), ("dtype", "float64"))


def _prepare(ctx: Context) -> Context:
    """The options checked (one-line ValueErrors) and normalised: the profile as a Profile, the device
    as torch names it, and under_test: the kernel under test, which a control's context no longer names."""
    import torch

    profile = get_profile(ctx.profile) if isinstance(ctx.profile, str) else ctx.profile
    if not isinstance(profile, Profile):
        raise ValueError(f"profile must be a Profile or one of quick/default/thorough, got {profile!r}")
    if ctx.optimizer not in KERNEL_VARIANTS:
        raise ValueError(f"optimizer must be one of {', '.join(KERNEL_VARIANTS)} for the cross-check, got {ctx.optimizer!r}")
    options = {**dict(DEFAULT_OPTIONS), **ctx.options}
    unknown = sorted(set(options) - set(dict(DEFAULT_OPTIONS)))
    if unknown:
        raise ValueError(f"the cross-check takes the options device and dtype, got {', '.join(unknown)}")
    if options["dtype"] not in DTYPE_NAMES:
        raise ValueError(f"dtype must be one of {', '.join(DTYPE_NAMES)}, got {options['dtype']!r}")
    try:
        device = torch.device(options["device"])
    except (RuntimeError, TypeError):
        raise ValueError(f"device must name a torch device (cpu, cuda, cuda:N), got {options['device']!r}") from None
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ValueError("device cuda was requested but torch.cuda.is_available() is False")
    options = {"device": str(device), "dtype": options["dtype"], "under_test": ctx.optimizer}
    return replace(ctx, profile=profile, options=options)


def _environment(ctx: Context):
    """On CPU the whole run uses one torch thread and one BLAS thread (`kit.threads.one_thread`), restored after."""
    return _device_threads(ctx.option("device"))


def _sampled(checks: list[NumericalCheck]) -> list[NumericalCheck]:
    """The checks that recorded samples (a check a setting did not exercise is left out)."""
    return [c for c in checks if c.samples]


def setting_part(ctx: Context) -> Evidence:
    """Where the cross-check ran: device, storage and compute dtypes (as the bounds take them), the
    configurations, torch."""
    dtype = ctx.option("dtype")
    return Evidence(extra={
        "device": ctx.option("device"),
        "dtype": dtype,
        "compute_dtype": step_analysis.COMPUTE_DTYPES[dtype],
        "unit_roundoff_storage": step_analysis.UNIT_ROUNDOFFS[dtype],
        "configs": {name: {"lr": c.lr, "betas": list(c.betas), "eps": c.eps, "trust_radius": c.trust_radius,
                           "weight_decay": c.weight_decay} for name, c in CONFIGS.items()},
        "torch": torch_environment(ctx.option("device")),
    })


def lockstep_part(ctx: Context) -> Evidence:
    """The torch kernel in lock-step with the reference's trajectories (lockstep_crosscheck)."""
    dtype, device = ctx.option("dtype"), ctx.option("device")
    # The lock-step sample: a tenth of the profile's frame count (10^3 default), which keeps the
    # default run within a few seconds on two cores; the count is reported as `frames`.
    lockstep_frames = max(ctx.profile.frames // 10, 60)
    checks = _new_checks(dtype)
    undefined = [0]
    frames = lockstep_crosscheck(ctx.seed, ctx.profile, lockstep_frames, device, _torch_dtype(dtype), ctx.optimizer, checks,
                                 undefined)
    return Evidence(
        checks=_sampled(list(checks.values())),
        frames=frames,
        extra={"lockstep_frames": frames, "steps_per_trajectory": ctx.profile.steps, "undefined_frame_steps": undefined[0]},
        notes=[f"lock-step: {frames} frames x {ctx.profile.steps} steps on {device} in {dtype}; the torch kernel gets "
               "the reference's input rounded to the storage dtype at every step and its output is compared with the reference's",
               f"undefined: {undefined[0]} frame-steps where the step is not determined at {dtype}'s rounding level (q = sqrt(v^) + eps "
               "not above its error: a zero gradient with weight decay, whose projection P_W(lambda W) is rounding noise comparable "
               "to eps; docs/algorithm.md#pitfalls, the noise-driven step): their W and m are not compared, v is"],
    )


# The declared precision is held stage by stage on small frames, where the bounds are tightest (a
# stage evaluated more coarsely than declared shows most above them), with every configuration.
DECLARED_DTYPES = ("float32", "bfloat16")
DECLARED_SHAPES = ((2, 1), (3, 2), (4, 2), (5, 3), (8, 3), (16, 4), (32, 8))


def declared_frames(profile) -> int:
    """Frames per configuration of the declared-precision lock-step: 1/70 of the profile's (142 of
    10^4 at the default profile, 20 per shape), at least 28 (4 per shape)."""
    return max(profile.frames // 70, 28)


def _declared_task(seed, profile, frames, device, dtype, variant, configs=None) -> Evidence:
    """The lock-step in one storage dtype on DECLARED_SHAPES with the named configurations (default
    all), a task."""
    checks = _new_checks(dtype, f"{dtype}/")
    undefined = [0]
    with _device_threads(device):
        count = lockstep_crosscheck(seed, profile, frames, device, _torch_dtype(dtype), variant, checks, undefined,
                                    shapes=DECLARED_SHAPES, configs=list(CONFIGS) if configs is None else configs, label="declared")
    return Evidence(checks=_sampled(list(checks.values())), frames=count, extra={"declared_precision": {dtype: {
        "declaration": step_analysis.kernel_declaration(dtype), "counts": Counts(frames=count, undefined_frame_steps=undefined[0])}}})


def declared_precision_part(ctx: Context) -> Evidence:
    """The kernel in float32 and bfloat16 storage held to the precision it declares, stage by stage
    (torch_impl.functional.declared_precision): lock-step at the kernel's own inputs on small frames,
    with every configuration, one task per dtype and configuration."""
    frames = declared_frames(ctx.profile)
    tasks = [(ctx.seed, ctx.profile, frames, ctx.option("device"), dtype, ctx.optimizer, [name])
             for dtype in DECLARED_DTYPES for name in CONFIGS]
    runs = Evidence.merged(map_tasks(_declared_task, tasks))
    return Evidence(
        checks=runs.checks, frames=runs.frames, extra=runs.extra,
        notes=[f"declared precision: lock-step in {' and '.join(DECLARED_DTYPES)} on {len(DECLARED_SHAPES)} small shapes, "
               f"{frames} frames per configuration ({', '.join(CONFIGS)}), {ctx.profile.steps} steps; each output against the "
               "reference at the kernel's own (rounded) input, within step_error at the precision the kernel declares for each stage"],
    )


def p2_p4_part(ctx: Context) -> Evidence:
    """P2 and P4 on the torch kernel alone, in float64: properties of the real kernel; a broken one is
    already caught by the lock-step checks (and the elementwise v or Muon's off-manifold frames have
    no reference quantities), so they run only when the kernel under test is the real one."""
    checks = {
        "P2_bitwise": NumericalCheck("P2_bitwise", "torch trajectories under 2^k G vs G (eps = 0), ulps", "exact: every stage is homogeneous and scaling by 2^k is exact; bound 0.5 ulp = equality", tightness_note=tightness.EQUALITY),
        "P2_bounded": NumericalCheck("P2_bounded", "torch step under c G, c m, c^2 v vs G, m, v for c not a power of two (eps = 0)", "the kernel's step_error (float64, Newton-Schulz) at each run's inputs, the scaled one with input errors u (c G, c m) and 2u (c^2 v); " + step_error_text("W"), tightness_note=tightness.RUNNING_BOUND),
        "P4_left": NumericalCheck("P4_left", "torch step(Q W, Q G, Q m, v) vs Q step(W, G, m, v), Haar Q in O(d)", "the kernel's step_error (float64) at both inputs, the moved one with input errors d^1.5 u from forming Q X, plus the rounding of Q W+; " + step_error_text("W")),
        "P4_right": NumericalCheck("P4_right", "torch step(W R, G R, m R, v) vs step(W, G, m, v) R, Haar R in O(r)", "the kernel's step_error (float64) at both inputs, the moved one with input errors r^1.5 u from forming X R, plus the rounding of W+ R; " + step_error_text("W")),
    }
    if ctx.optimizer == REAL_KERNEL:
        scale_independence(ctx.seed, ctx.profile, ctx.option("device"), ctx.optimizer, checks)
        equivariance(ctx.seed, ctx.profile, ctx.option("device"), ctx.optimizer, checks)
    return Evidence(checks=_sampled(list(checks.values())), notes=["P2 and P4 run on the torch kernel alone in float64"])


def _long_run_check(steps: int) -> NumericalCheck:
    return NumericalCheck("long_run_feasibility", kernel_drift.long_run_steps_text(steps),
                          "each checkpoint's drift against " + kernel_drift.DEFECT_TEXT, tightness_note=tightness.WORST_CASE_SUMS)


def _drift_correction_check() -> NumericalCheck:
    return NumericalCheck(
        "drift_correction",
        f"||W+^T W+ - I||_F after one step from frames with ||W^T W - I||_F = {kernel_drift.PLANTED_DRIFT:g} (the retraction corrects "
        "the drift it is given)", "the frame returned against " + kernel_drift.DEFECT_TEXT, tightness_note=tightness.WORST_CASE_SUMS)


def _device_threads(device: str):
    """One torch thread and one BLAS thread on CPU (kit.threads.one_thread), nothing on CUDA."""
    import torch

    return one_thread() if torch.device(device).type == "cpu" else contextlib.nullcontext()


def _long_run_task(seed, steps, device, run_dtype, variant) -> Evidence:
    """One dtype's long run, a task of its own: its check, and what kernel_drift.long_run measured as
    extra["long_run"][run_dtype], with the threads of the claim's environment wherever it runs."""
    check = _long_run_check(steps)
    with _device_threads(device):
        record, seconds = kernel_drift.long_run(seed, steps, device, run_dtype, variant, check)
    return Evidence(checks=[check], extra={"long_run": {run_dtype: {
        **record, "seconds": seconds, "microseconds_per_step": 1e6 * seconds / steps}}})


def long_run_part(ctx: Context) -> Evidence:
    """Feasibility over profile.kernel_steps steps in float64, float32, bfloat16 (and the run's dtype),
    each checkpoint against the one-step bound at its own step (kernel_drift.long_run)."""
    from torch_impl import functional

    dtype, steps = ctx.option("dtype"), ctx.profile.kernel_steps
    run_dtypes = list(dict.fromkeys([*kernel_drift.LONG_RUN_DTYPES, dtype]))
    # one task per dtype (independent runs, each serial in its steps), merged in this order
    runs = Evidence.merged(map_tasks(_long_run_task, [(ctx.seed, steps, ctx.option("device"), run_dtype, ctx.optimizer)
                                                      for run_dtype in run_dtypes]))
    long_runs = runs.extra["long_run"]
    series = []
    for run_dtype in run_dtypes:
        x = [float(s) for s in long_runs[run_dtype]["steps"]]
        series += [Series(x, long_runs[run_dtype]["feasibility_max"], f"{run_dtype} drift"),
                   Series(x, long_runs[run_dtype]["bound_max"], f"{run_dtype} bound")]
    batch, d, r = kernel_drift.LONG_RUN_SHAPE
    config = kernel_drift.LONG_RUN_CONFIG
    derived = _iterations(config, dtype, d, r)
    kernel_count = functional.newton_schulz_iterations(config.trust_radius, _compute_dtype(dtype))
    ratios = {run_dtype: max(f / b for f, b in zip(long_runs[run_dtype]["feasibility_max"], long_runs[run_dtype]["bound_max"]))
              for run_dtype in run_dtypes}
    return Evidence(
        checks=_sampled(runs.checks),
        extra={"long_run": long_runs},
        figures={
            "long_run_feasibility": LineFigure(
                title=f"Drift of torch StiefelAdam frames ({batch} x {d} x {r}) over a long run, and its one-step bound",
                xlabel="step", ylabel="max ||W^T W - I||_F", series=series, single=Series(series[0].x, series[0].y),
                logx=True, logy=True,
            )
        },
        notes=[f"retraction: {functional.resolve_retraction('auto', config.trust_radius)} at trust_radius {config.trust_radius}: "
               f"the kernel runs {kernel_count} quintic iterations in the compute dtype; the bounds take the {derived} that the "
               "certifier derives from Delta, the compute dtype and the frame's drift (step_analysis.newton_schulz_iterations)",
               "long run: the drift of every checkpoint is bounded by the one-step bound of its own step (the retraction corrects "
               "the drift it is given); largest drift / bound " + ", ".join(f"{k} {v:.2g}" for k, v in ratios.items())],
    )


def drift_correction_part(ctx: Context) -> Evidence:
    """One step from frames with a planted drift, in every dtype (kernel_drift.drift_correction)."""
    check = _drift_correction_check()
    frames = sum(kernel_drift.drift_correction(ctx.seed, ctx.option("device"), run_dtype, ctx.optimizer, check, CONFIGS)
                 for run_dtype in DTYPE_NAMES)
    return Evidence(checks=[check], frames=frames,
                    notes=[f"drift correction: {frames} frames with ||W^T W - I||_F = {kernel_drift.PLANTED_DRIFT:g} stepped once in "
                           f"{', '.join(DTYPE_NAMES)}; each returned frame within the one-step bound at its own A"])


def _scale_checks(dtype: str) -> dict:
    return {
        "bitwise": NumericalCheck(f"{dtype}/P2_exponent_range",
                                  f"torch trajectories under 2^k G vs G ({dtype}, eps = 0), ulps, for every k of the predicted domain",
                                  kernel_scale.BITWISE_TEXT, tightness_note=tightness.EQUALITY),
        "band": NumericalCheck(f"{dtype}/P2_subnormal_band",
                               f"||W+(2^k G, 2^k m, 4^k v) - W+(G, m, v)||_F ({dtype}, eps = 0) where v is subnormal and not 0",
                               kernel_scale.BAND_TEXT, tightness_note=tightness.WORST_CASE_SUMS),
    }


def scale_evidence(seed, device, variant, dtypes=kernel_scale.SCALE_DTYPES) -> Evidence:
    """kernel_scale.scale_scan in each dtype: its checks and its report as extra["scale_domain"]."""
    checks, reports = [], {}
    for dtype in dtypes:
        by_kind = _scale_checks(dtype)
        reports[dtype] = kernel_scale.scale_scan(seed, device, dtype, variant, by_kind)
        checks += _sampled(list(by_kind.values()))
    return Evidence(checks=checks, extra={"scale_domain": reports})


def scale_domain_part(ctx: Context) -> Evidence:
    """P2 on the kernel over each dtype's whole exponent range (kernel_scale): a property of the real
    kernel, run when it is the kernel under test (its controls run the same scan)."""
    if ctx.optimizer != REAL_KERNEL:
        return Evidence(notes=["P2 over the exponent range runs on the real kernel"])
    evidence = scale_evidence(ctx.seed, ctx.option("device"), ctx.optimizer)
    reports = evidence.extra["scale_domain"]
    evidence.notes = [f"gradient scale c = 2^k, {dtype}: bitwise for k in {report['log2_c_bitwise_found']} (predicted "
                      f"[{report['predicted']['log2_c_low']}, {report['predicted']['log2_c_high']}], the claim checked there), "
                      + (f"v subnormal for k in {report['subnormal_band']} (held to the bound with underflow), v = 0 below, "
                         if report["subnormal_band"] else "v's subnormal band is its compute dtype's (checked in float32), ")
                      + f"non-finite from {report['log2_c_non_finite_from']}" for dtype, report in reports.items()]
    return evidence


ATTAINED = 0.1  # a bound is attained within a factor 10 when a searched input reaches a tenth of it


def attainment_part(ctx: Context) -> Evidence:
    """How tight the bounds are that decide the low-precision verdicts (kernel_attainment): each stage
    bound of the one analysis, per storage dtype, against the kernel's own evaluation of that stage,
    searched over inputs; the largest residual/bound found is recorded per stage and dtype, and every
    searched sample must be within its bound (check stage_bounds_hold). The running trajectory bound
    is searched step by step on short trajectories (kernel_attainment.RUNNING_SEARCHES), and each
    searched step must be within it too."""
    check = NumericalCheck("stage_bounds_hold", "each stage of the kernel's step, and its running trajectory bound, on searched "
                           "inputs (kernel_attainment) against its bound at the declared precision, float32 and bfloat16",
                           "the stage bounds of step_analysis and bounds (cited by the lock-step checks) and the running bound "
                           "trajectory_rounding_bound, each at its declared unit roundoffs, at the exact quantities of the "
                           "searched input", tightness_note=tightness.WORST_CASE_SUMS)
    ratios = {}
    for stage in kernel_attainment.STAGE_SEARCHES:
        for dtype in kernel_attainment.SEARCH_DTYPES:
            found = kernel_attainment.stage_ratios(ctx.seed, stage, dtype)
            check.add(found, np.ones_like(found), shape=(0, 0), key=(CLAIM_ID, "attainment", stage, dtype), seed=ctx.seed,
                      extra={"stage": stage, "dtype": dtype})
            ratios.setdefault(stage, {})[dtype] = float(np.max(found))
    running = {}
    for dtype in kernel_attainment.SEARCH_DTYPES:
        found = kernel_attainment.running_bound_samples(ctx.seed, dtype)
        check.add(found.ravel(), np.ones(found.size), shape=(0, 0), key=(CLAIM_ID, "attainment", "running_bound", dtype),
                  seed=ctx.seed, extra={"stage": "running_bound", "dtype": dtype})
        running[dtype] = [float(x) for x in np.max(found, axis=1)]
    loose = [f"{stage} ({dtype}: {value:.2g})" for stage, by_dtype in ratios.items() for dtype, value in by_dtype.items()
             if value < ATTAINED and stage != "storage_cast"]
    return Evidence(
        checks=[check],
        extra={"stage_attainment": ratios, "running_bound_attainment": running},
        notes=["attained residual/bound per stage, float32 / bfloat16 (searched inputs on frames (2, 1) to (5, 3)): "
               + "; ".join(f"{stage} {by_dtype['float32']:.2g} / {by_dtype['bfloat16']:.2g}" for stage, by_dtype in ratios.items()),
               "running trajectory bound, attained residual/bound at steps 1.." + str(len(running["float32"])) + ": "
               + "; ".join(f"{dtype} " + ", ".join(f"{x:.2g}" for x in values) for dtype, values in running.items()),
               ("stages attained within a factor 10 in every dtype" if not loose else
                "stages not attained within a factor 10: " + ", ".join(loose))],
    )


def thread_sensitivity_part(ctx: Context) -> Evidence:
    """On CPU, where the run itself used one torch thread (and one BLAS thread): what two would change."""
    import torch

    if torch.device(ctx.option("device")).type != "cpu":
        return Evidence(extra={"thread_sensitivity": None})
    threads = thread_sensitivity(ctx.seed, _torch_dtype(ctx.option("dtype")))
    return Evidence(
        extra={"thread_sensitivity": threads},
        notes=[f"threads: run with 1 torch thread and 1 BLAS thread; the lock-step residuals of {threads['samples']} frames "
               + ("are bit-identical with 2 torch threads" if threads["identical"] else
                  f"differ with 2 torch threads by at most {threads['max_relative_difference']:.1e} relative (rounding, within the bounds)")],
    )


# A control needs a clear miss, not statistics: the small shapes and two large ones (the largest
# frames' reference SVD would take most of the control's time and add nothing to a miss of 10^11)
CONTROL_SHAPES = SMALL_SHAPES + ((32, 8), (64, 16))


def kernel_control(ctx: Context) -> Evidence | None:
    """A broken kernel (ctx.optimizer, a name of CONTROL_DESCRIPTIONS) through the lock-step checks,
    in float64 storage, where the cross-check's bound is tightest: in bfloat16 (u = 2^-8) the bound
    exceeds the difference that a broken stage makes in a step of lr = 1e-3. The controls break the
    real kernel: they do not apply when another kernel is under test."""
    import torch

    if ctx.option("under_test") != REAL_KERNEL:
        return None
    frames = ctx.profile.control_frames
    profile = Profile("control", frames=frames, steps=2, long_run_steps=0, mp_dps=0, mp_samples=0, control_frames=frames)
    checks = _new_checks(ctx.option("dtype"))
    lockstep_crosscheck(ctx.seed, profile, frames, ctx.option("device"), torch.float64, ctx.optimizer, checks, shapes=CONTROL_SHAPES)
    return Evidence(checks=list(checks.values()))


# The storage dtype in which each precision control is run: where the kernel's declaration and the
# broken stage differ (m and v differ from the declaration only for bfloat16 frames).
DECLARED_CONTROL_DTYPES = {"moments_in_storage_dtype": "bfloat16", "bias_power_in_compute_dtype": "float32",
                           "first_correction_in_float32": "float32", "per_frame_counts_in_float32": "float32",
                           "projection_in_storage_dtype": "bfloat16", "square_in_storage_dtype": "bfloat16",
                           "second_moment_in_storage_dtype": "bfloat16", "coefficient_in_storage_dtype": "bfloat16"}


def declared_control(ctx: Context) -> Evidence | None:
    """A kernel that evaluates a stage more coarsely than the kernel declares, through the
    declared-precision lock-step (declared_precision_part) in the dtype where the two differ, on
    control_frames / 4 frames per configuration and two steps, configuration by configuration in
    the order of CONFIGS until the miss is clear (CLEAR_MISS)."""
    if ctx.option("under_test") != REAL_KERNEL:
        return None
    frames = max(ctx.profile.control_frames // 4, 28)
    profile = Profile("control", frames=frames, steps=2, long_run_steps=0, mp_dps=0, mp_samples=0, control_frames=frames)
    found = []
    for name in CONFIGS:
        found.append(_declared_task(ctx.seed, profile, frames, ctx.option("device"), DECLARED_CONTROL_DTYPES[ctx.optimizer],
                                    ctx.optimizer, configs=[name]))
        if ControlResult.from_checks(ctx.optimizer, "", Evidence.merged(found).checks).margin >= CLEAR_MISS * DETECTION_FACTOR:
            break
    return Evidence.merged(found)


# A control stops early only at a miss this many times the detection factor: one that is caught
# narrowly (a count of misrounded frames against 0.5) runs every configuration, so that its margin
# does not hang on the first one's draws.
CLEAR_MISS = 10


# The storage dtype of each drift control: where its retraction differs from the declared one.
DRIFT_CONTROL_DTYPES = {"drift_not_corrected": "float32"}


def drift_control(ctx: Context) -> Evidence | None:
    """A kernel whose retraction does not correct drift, through drift_correction in the dtype where
    it differs (DRIFT_CONTROL_DTYPES)."""
    if ctx.option("under_test") != REAL_KERNEL:
        return None
    check = _drift_correction_check()
    frames = kernel_drift.drift_correction(ctx.seed, ctx.option("device"), DRIFT_CONTROL_DTYPES[ctx.optimizer], ctx.optimizer,
                                           check, CONFIGS, count=4)
    return Evidence(checks=[check], frames=frames)


# A retraction that does not correct drift, in bfloat16 only: one step from a planted drift cannot
# show it there, as bfloat16's own one-step bound is of the planted drift's size. Its drift instead
# accumulates: each step adds its rounding of order u without taking the previous drift away, a
# random walk whose size after t steps is about sqrt(t) times one step's, while the bound stays at
# one step's (the real retraction's drift after any number of steps). At 1000 steps sqrt(t) = 32,
# three times the detection factor; the run takes under a second (the long run's shape, 240 us per step).
LONG_RUN_CONTROLS = {"drift_not_corrected_in_bfloat16": ("bfloat16", 1000)}


def long_run_control(ctx: Context) -> Evidence | None:
    """A kernel whose drift accumulates in one dtype, through the long run in that dtype (LONG_RUN_CONTROLS)."""
    if ctx.option("under_test") != REAL_KERNEL:
        return None
    dtype, steps = LONG_RUN_CONTROLS[ctx.optimizer]
    return _long_run_task(ctx.seed, steps, ctx.option("device"), dtype, ctx.optimizer)


def scale_control(ctx: Context) -> Evidence | None:
    """A kernel that breaks P2 far from c = 1, through the exponent-range scan, dtype by dtype in the
    order of SCALE_DTYPES and draw by draw (SCALE_CONTROL_DRAWS), stopping at the first scan that
    detects it (a control needs one clear miss; the scans after it would only cost time)."""
    if ctx.option("under_test") != REAL_KERNEL:
        return None
    found = Evidence()
    for attempt in range(SCALE_CONTROL_DRAWS):
        # the scan's own draws at the claim's seed first; then draws of their own, derived from it
        seed = ctx.seed if attempt == 0 else int(rng_for(ctx.seed, CLAIM_ID, "scale_control", attempt).integers(2**31))
        for dtype in kernel_scale.SCALE_DTYPES:
            evidence = scale_evidence(seed, ctx.option("device"), ctx.optimizer, dtypes=(dtype,))
            found = Evidence(checks=found.checks + evidence.checks)
            if ControlResult.from_checks(ctx.optimizer, "", evidence.checks).detected:
                return found
    return found


# Whether a broken stage shows in the exponent-range scan depends on the gradients it draws: ||g||^2
# formed at the gradient's scale overflows inside the predicted domain only for gradients large
# enough (at some seeds no dtype's draw is). The control scans with up to this many draws, stopping
# at the first that shows it (each scan takes a few hundredths of a second).
SCALE_CONTROL_DRAWS = 4


CONTROL_RUNS = {**dict.fromkeys(DECLARED_CONTROL_DTYPES, declared_control), **dict.fromkeys(DRIFT_CONTROL_DTYPES, drift_control),
                **dict.fromkeys(LONG_RUN_CONTROLS, long_run_control),
                **dict.fromkeys(("unscaled_square", "floor_on_v", "hidden_eps", "clamped_denominator", "flush_subnormal_v"),
                                scale_control)}


def _control(name: str) -> Control:
    return Control(name, CONTROL_RUNS.get(name, kernel_control), CONTROL_DESCRIPTIONS[name])


CLAIM = Claim(
    id=CLAIM_ID,
    title="The PyTorch StiefelAdam kernel computes the certified step",
    statement=(
        "For frames W on St(d, r), gradients G and states (m, v, t), torch_impl.functional.stiefel_adam_step "
        "returns the output of reference_impl.step to within a derived rounding bound (float64: O((d + r) sqrt(r) u); "
        "float32 and bfloat16: the same analysis with their unit roundoffs 2^-24 and 2^-8), keeps P2 (bit-identical "
        "trajectories under power-of-two gradient scaling, eps = 0) and P4 (O(d) x O(r) equivariance), and keeps "
        "||W^T W - I|| at rounding level over long runs with no growth in the number of steps."
    ),
    latex=(
        r"\|\mathrm{step}_{\mathrm{torch}}(W,G,m,v,t) - \mathrm{step}_{\mathrm{ref}}(W,G,m,v,t)\|_F \le "
        r"\beta(d,r,u,\kappa),\quad \mathrm{step}_{\mathrm{torch}}(QWR, QGR, QmR, v) = Q\,\mathrm{step}_{\mathrm{torch}}(W,G,m,v)\,R"
    ),
    symbolic=Symbolic("not applicable: an implementation cross-check"),
    parts=(
        Part("setting", setting_part),
        Part("lockstep", lockstep_part, background=True),  # a task of its own
        Part("declared_precision", declared_precision_part, background=True),
        Part("p2_p4", p2_p4_part, background=True),
        Part("long_run", long_run_part),
        Part("drift_correction", drift_correction_part),
        Part("scale_domain", scale_domain_part),
        Part("attainment", attainment_part),
        Part("thread_sensitivity", thread_sensitivity_part),
    ),
    controls=tuple(_control(name) for name in CONTROL_DESCRIPTIONS),
    requires=("torch",),
    default_options=DEFAULT_OPTIONS,
    prepare=_prepare,
    environment=_environment,
    precisions=(
        ("under test", "torch_impl's kernel in lock-step, P2 and P4", ("{dtype}",)),
        ("under test", "the kernel's long runs and gradient-scale scan", tuple(dict.fromkeys(kernel_drift.LONG_RUN_DTYPES + kernel_scale.SCALE_DTYPES))),
        ("under test", "the kernel's declared precision and attained bounds", tuple(dict.fromkeys(DECLARED_DTYPES + kernel_attainment.SEARCH_DTYPES))),
        ("reference", "reference_impl.step and the bounds", ("float64",)),
    ),
)

__all__ = ["CLAIM", "torch_environment", "step_error_bound", "feasibility_bound", "reference_quantities", "DETECTION_FACTOR"]
