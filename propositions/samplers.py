"""The Haar samplers: random_point draws Haar St(d, r), random_orthogonal draws Haar O(n), and
torch_impl.stiefel_init_ (what users initialise their frames with) is Haar in every storage dtype.

Claim
    reference_impl.random_point(d, r, rng) (the sign-fixed QR factor of a Gaussian matrix,
    Mezzadri 2007) returns frames W with W^T W = I_r to the manifold tolerance, distributed by the
    Haar measure of St(d, r); random_orthogonal(n, rng) = random_point(n, n, rng) is Haar on O(n),
    both components (det +1 and det -1) with probability 1/2 each. Every certificate that samples
    frames or orthogonal matrices (P4's equivariance over O(d), the shape plans of P1..P6) relies
    on this; nothing else checks it.

Why it is true, and the statistics whose law is exact
    Z Gaussian is invariant in law under Z -> Q Z for fixed Q in O(d); QR with diag(R) > 0 is
    unique, so Q(QZ) = Q Q(Z) and the factor is left-invariant, i.e. Haar. Consequences used here,
    each an exact finite-n law (no asymptotics):
    * every column of W is uniform on the sphere S^{d-1}, so any fixed entry satisfies
      W_ij^2 = z_1^2 / (z_1^2 + ... + z_d^2) ~ Beta(1/2, (d - 1)/2) (z Gaussian);
    * the law is invariant under W -> D1 W D2 for sign matrices D1 = diag(+-1) (d x d) and
      D2 (r x r); so sign(W_00) is +-1 with probability 1/2, and so is sign(W_00 W_{d-1,r-1})
      (flip the last row or last column: one factor changes sign, the other does not);
    * for n x n, W -> W diag(1, ..., 1, -1) swaps the two components of O(n): det W = -1 with
      probability exactly 1/2;
    * O(3) = SO(3) x {+-I}: det(Q) Q is Haar on SO(3), whose rotation angle theta
      (tr = 1 + 2 cos theta) has density (1 - cos theta)/pi on [0, pi], CDF (theta - sin theta)/pi
      (the Weyl integration formula for SO(3); Miles, Biometrika 52 (1965)).

    torch_impl.stiefel_init_ takes the polar factor of a Gaussian (left-invariant for the same reason:
    polar(Q Z) = Q polar(Z)) in float64 and rounds it to the tensor's dtype. Rounding to nearest is
    monotone and odd, so a stored entry a of W_ij stands for the interval between the midpoints to its
    neighbours: P(round(W_ij)^2 <= a^2) = F(((a + next(a))/2)^2), an exact law with atoms
    (`rounded_cdfs`), and signs and det signs are unchanged by it.

How it is checked
    For each shape of POINT_SHAPES (random_point) and each n of ORTHOGONAL_SIZES
    (random_orthogonal), N = max(CONTROL_SAMPLES, profile.frames) draws from rng_for(seed, ...):
    * orthonormality: ||W^T W - I||_F <= reference_impl.manifold_tolerance(d, r) for every draw
      (the tolerance analysis of reference_impl._validation: representation and Gram evaluation
      error of a backward-stable orthogonalisation, 32 (d r + 2 sqrt r) u);
    * Kolmogorov-Smirnov tests (scipy.stats.kstest) of W_00^2 and W_{d-1,r-1}^2 against
      Beta(1/2, (d-1)/2), and of the SO(3) rotation angle against (theta - sin theta)/pi;
    * exact binomial tests (scipy.stats.binomtest, p = 1/2) of sign(W_00), sign(W_00 W_{d-1,r-1})
      and, for square draws, of det W < 0;
    * the same for stiefel_init_ on tensors of each storage dtype (random_orthogonal: a square
      tensor), with the orthonormality tolerance widened by the storage rounding and the Beta tests
      against the rounded law (a KS test against a law with atoms keeps its level: Conover 1972); no
      rotation-angle test below float64 (`statistical_plan`).

    Statistical tests, made deterministic and family-wise: the draws come from a recorded seed, so
    every p-value is a fixed number that a re-run reproduces. A test rejects when p < alpha_i with
    alpha_i = FAMILY_WISE_ALPHA / K (Bonferroni over the K tests of the plan): the real sampler
    fails a given seed with probability at most FAMILY_WISE_ALPHA = 1e-6, whatever the dependence
    between tests (they share draws). In NumericalCheck terms the residual is -log10 p and the
    bound is -log10 alpha_i > 0, so residual/bound <= 1 is exactly "not rejected".

What would make it fail
    The controls are broken samplers (CONTROL_SAMPLERS): QR without the sign fix, signs fixed by
    the first column only, only det +1, Gaussian columns normalised but not orthogonalised, and a
    sign-fixed QR of uniform (not Gaussian) entries. A control is detected when some check misses
    its bound by DETECTION_FACTOR; for a test that means -log10 p >= 10 (-log10 alpha_i), i.e.
    p <= alpha_i^10, a p-value some sixty decades below the rejection level, not a borderline
    draw. The controls run at CONTROL_SAMPLES draws per shape, chosen so that every control reaches
    that (the certificate records each control's -log10 p: the measured power), shape by shape in
    the plan's order until a shape's test rejects it so (later shapes would not change the verdict);
    the reference's sampler is tested with at least as many draws. When scipy's p-value
    underflows to 0 the residual is a proven lower bound on -log10 p: Massart's DKW inequality
    p <= 2 exp(-2 N D^2) for KS, the Chernoff bound p <= 2 exp(-N KL(k/N || 1/2)) for the
    binomial tests.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Callable

import numpy as np

from reference_impl import VARIANTS, manifold, manifold_tolerance
from reference_impl.manifold import haar_from_gaussian

from .kit.protocol import Claim, Context, Control, Evidence, Part, Symbolic, map_evidence
from ._common import DETECTION_FACTOR, NumericalCheck, chunk_sizes, rng_for

CLAIM_ID = "samplers"

# Squares of entries need d >= 2 (W_00^2 = 1 at d = 1). r = 1, r < d and r = d, up to 16.
POINT_SHAPES: tuple[tuple[int, int], ...] = ((2, 1), (3, 2), (8, 3), (16, 4))
ORTHOGONAL_SIZES: tuple[int, ...] = (2, 3, 4, 8)
ROTATION_ANGLE_SIZE = 3

# Draws per tested shape. The controls run at CONTROL_SAMPLES: the weakest (uniform_entries_qr, KS
# distance about 0.1 at d = 8) then reaches -log10 p ~ 2 N D^2 / ln 10 ~ 100, over ten times the
# bound -log10 alpha_i ~ 8.2 (K = 146 tests with stiefel_init_ in three dtypes); sign and det
# deviations reach thousands. The reference's sampler runs at max(CONTROL_SAMPLES, profile.frames):
# never with less power than the controls demonstrate.
CONTROL_SAMPLES = 12_000

FAMILY_WISE_ALPHA = 1e-6

STATEMENT = (
    "reference_impl.random_point(d, r) is Haar on St(d, r) and random_orthogonal(n) is Haar on O(n) "
    "(both components, det -1 with probability 1/2), and so is torch_impl.stiefel_init_ in float64, float32 "
    "and bfloat16 storage (the Haar law rounded to the dtype): every draw is orthonormal to the manifold "
    "tolerance of its dtype, entries squared follow Beta(1/2, (d-1)/2) (its rounded law in float32 and "
    "bfloat16), signs and the det sign are balanced, and the SO(3) rotation angle has density "
    "(1 - cos theta)/pi; tested at family-wise level 1e-6."
)
LATEX = (
    r"W \sim \mathrm{Haar}(\mathrm{St}(d,r)):\ W^\top W = I_r,\ W_{ij}^2 \sim \mathrm{Beta}\big(\tfrac12, \tfrac{d-1}{2}\big),\ "
    r"\Pr[\operatorname{sign} W_{00} = 1] = \Pr[\det Q = -1] = \tfrac12,\ "
    r"\theta(\det(Q) Q) \sim \tfrac{1 - \cos\theta}{\pi}\,d\theta\ (n = 3)"
)


# --------------------------------------------------------------------------------------------
# Samplers: the real one and the broken ones
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Sampler:
    """A pair random_point(d, r, rng, batch), random_orthogonal(n, rng, batch) under test; storage: the
    dtype its frames are stored in (returned as float64 arrays of those values)."""

    name: str
    description: str
    random_point: Callable[..., np.ndarray]
    random_orthogonal: Callable[..., np.ndarray]
    storage: str = "float64"


def reference_sampler() -> Sampler:
    # looked up at call time, so that a change to (or a patch of) reference_impl.manifold is tested
    return Sampler(
        "reference",
        "reference_impl.random_point / random_orthogonal",
        lambda d, r, rng, batch=(): manifold.random_point(d, r, rng, batch),
        lambda n, rng, batch=(): manifold.random_orthogonal(n, rng, batch),
    )


TORCH_DTYPES = ("float64", "float32", "bfloat16")
TORCH_QR_CONTROL = "stiefel_init_qr_without_sign_fix"
TORCH_QR_CONTROL_DTYPE = "float32"


def _torch_frames(d, r, rng, batch, dtype: str, method: str = "init"):
    """Frames from torch: torch_impl.stiefel_init_ on an empty tensor of `dtype` ("init"), or a broken
    variant, its torch.Generator seeded from rng (one 63-bit draw): reproducible from the claim's seed."""
    import torch
    from torch_impl import stiefel_init_

    generator = torch.Generator().manual_seed(int(rng.integers(2**63)))
    tensor = torch.empty(_batch(batch) + (d, r), dtype=getattr(torch, dtype))
    if method == "init":
        stiefel_init_(tensor, generator=generator)
    else:  # "qr": the Q of a Gaussian's QR, signs as LAPACK leaves them
        gaussian = torch.randn(tensor.shape, dtype=torch.float64, generator=generator)
        tensor.copy_(torch.linalg.qr(gaussian)[0].to(tensor.dtype))
    return tensor.to(torch.float64).numpy()


def torch_sampler(dtype: str, method: str = "init") -> Sampler:
    """torch_impl.stiefel_init_ in a storage dtype (method "init"), or the QR control ("qr")."""
    import functools

    point = functools.partial(_torch_frames, dtype=dtype, method=method)
    name = f"stiefel_init_{dtype}" if method == "init" else f"{TORCH_QR_CONTROL}_{dtype}"
    description = (f"torch_impl.stiefel_init_ on a {dtype} tensor" if method == "init" else
                   f"a stiefel_init_ written as torch's QR of a Gaussian without the sign fix, {dtype}")
    return Sampler(name, description, point, lambda n, rng, batch=(): point(n, n, rng, batch), storage=dtype)


def torch_samplers() -> list[Sampler]:
    """stiefel_init_ in every storage dtype, where torch is installed (else none)."""
    try:
        import torch_impl  # noqa: F401
    except ImportError:
        return []
    return [torch_sampler(dtype) for dtype in TORCH_DTYPES]


def _batch(batch) -> tuple[int, ...]:
    return (int(batch),) if isinstance(batch, (int, np.integer)) else tuple(int(b) for b in batch)


def _gaussian(d, r, rng, batch):
    return rng.standard_normal(_batch(batch) + (d, r))


def _qr_without_sign_fix(d, r, rng, batch=()):
    return np.linalg.qr(_gaussian(d, r, rng, batch))[0]


def _signs_fixed_by_first_column(d, r, rng, batch=()):
    Q, R = np.linalg.qr(_gaussian(d, r, rng, batch))
    sign = np.where(R[..., 0, 0] < 0, -1.0, 1.0)
    return Q * sign[..., None, None]


def _det_plus_one_only(d, r, rng, batch=()):
    W = haar_from_gaussian(_gaussian(d, r, rng, batch))
    if d != r:
        return W
    flip = np.where(np.linalg.det(W) < 0, -1.0, 1.0)
    return np.concatenate([W[..., :-1], W[..., -1:] * flip[..., None, None]], axis=-1)


def _normalized_not_orthogonalized(d, r, rng, batch=()):
    Z = _gaussian(d, r, rng, batch)
    return Z / np.linalg.norm(Z, axis=-2, keepdims=True)


def _uniform_entries_qr(d, r, rng, batch=()):
    return haar_from_gaussian(rng.uniform(-1.0, 1.0, _batch(batch) + (d, r)))


def _broken(name, description, point):
    return Sampler(name, description, point, lambda n, rng, batch=(): point(n, n, rng, batch))


CONTROL_SAMPLERS: dict[str, Sampler] = {
    sampler.name: sampler
    for sampler in (
        _broken("qr_without_sign_fix", "Q of numpy's QR of a Gaussian, signs left as LAPACK makes them", _qr_without_sign_fix),
        _broken("signs_fixed_by_first_column", "QR of a Gaussian, every column multiplied by sign(R_00) only", _signs_fixed_by_first_column),
        _broken("det_plus_one_only", "Haar frames, but square draws folded onto det +1 (last column flipped)", _det_plus_one_only),
        _broken("normalized_not_orthogonalized", "Gaussian columns normalised to unit length, not orthogonalised", _normalized_not_orthogonalized),
        _broken("uniform_entries_qr", "sign-fixed QR of a matrix of uniform(-1, 1) entries (orthonormal, signs balanced, not Haar)", _uniform_entries_qr),
    )
}


# --------------------------------------------------------------------------------------------
# Tests with exact laws
# --------------------------------------------------------------------------------------------


def statistical_plan(storage: str = "float64") -> list[tuple[str, str, tuple[int, int]]]:
    """Every statistical test of one sampler: (check name, source, shape). The SO(3) rotation angle is
    tested in float64 storage only: rounding a rotation to float32 or bfloat16 moves an angle near pi by
    about sqrt(6 u_s), a bias the KS test would see at large N (the entry tests account for rounding
    exactly: `rounded_cdfs`)."""
    plan = []
    for source, shapes in (("point", POINT_SHAPES), ("orthogonal", tuple((n, n) for n in ORTHOGONAL_SIZES))):
        for d, r in shapes:
            plan += [("first_entry_beta", source, (d, r)), ("last_entry_beta", source, (d, r)),
                     ("first_entry_sign", source, (d, r)), ("corner_sign_product", source, (d, r))]
            if source == "orthogonal":
                plan.append(("det_sign", source, (d, r)))
                if d == ROTATION_ANGLE_SIZE and storage == "float64":
                    plan.append(("so3_rotation_angle", source, (d, r)))
    return plan


def tested_samplers() -> list[Sampler]:
    """What a default run tests: the reference's samplers and, where torch is installed,
    torch_impl.stiefel_init_ in every storage dtype."""
    return [reference_sampler()] + torch_samplers()


def total_tests() -> int:
    """K of the Bonferroni correction: every test of every sampler a default run tests (the same for
    the controls, so that a control meets the real run's threshold)."""
    return sum(len(statistical_plan(sampler.storage)) for sampler in tested_samplers())


def alpha_per_test() -> float:
    return FAMILY_WISE_ALPHA / total_tests()


def sampler_named(name: str) -> Sampler:
    """A registered sampler by name: "reference", a numpy control, stiefel_init_<dtype> or its QR control."""
    if name == "reference":
        return reference_sampler()
    if name in CONTROL_SAMPLERS:
        return CONTROL_SAMPLERS[name]
    for prefix, method in ((TORCH_QR_CONTROL + "_", "qr"), ("stiefel_init_", "init")):
        if name.startswith(prefix) and name[len(prefix):] in TORCH_DTYPES:
            return torch_sampler(name[len(prefix):], method)
    raise ValueError(f"unknown sampler {name!r}")


def storage_unit_roundoff(storage: str) -> float:
    """u_s of a storage dtype (0 for float64: the reference's tolerance already holds its rounding)."""
    return {"float64": 0.0, "float32": 2.0**-24, "bfloat16": 2.0**-8}[storage]


def orthonormality_tolerance(d: int, r: int, storage: str) -> float:
    """The manifold tolerance of a frame computed in float64 and rounded to `storage`: rounding each
    entry by a relative u_s moves W by E with ||E||_F <= u_s ||W||_F = u_s sqrt(r), and W^T W by
    W^T E + E^T W + E^T E, of norm <= 2 sqrt(r) u_s + r u_s^2; added to the float64 tolerance."""
    u_s = storage_unit_roundoff(storage)
    return manifold_tolerance(d, r) + 2.0 * math.sqrt(r) * u_s + r * u_s**2


def _neighbours(values: np.ndarray, storage: str) -> tuple[np.ndarray, np.ndarray]:
    """(previous, next) representable numbers of `storage` around each |value| (values of that dtype)."""
    a = np.abs(np.asarray(values, dtype=np.float64))
    if storage == "float32":
        x = a.astype(np.float32)
        return np.nextafter(x, np.float32(-1)).astype(np.float64), np.nextafter(x, np.float32(np.inf)).astype(np.float64)
    # bfloat16 is float32's top 16 bits: its neighbours are one unit of the 16th bit away
    bits = a.astype(np.float32).view(np.int32)
    below = np.where(bits > 0, bits - (1 << 16), bits).view(np.float32).astype(np.float64)
    above = (bits + (1 << 16)).view(np.float32).astype(np.float64)
    return below, above


def _stats():
    """scipy.stats, imported where a test runs: it takes half a second, which every process that
    loads the claims (the command's own, to list them) would otherwise pay."""
    from scipy import stats

    return stats


def rounded_cdfs(values: np.ndarray, d: int, storage: str):
    """The law of W_ij^2 when W_ij is stored in `storage` (round to nearest): at a stored value a,
    P(round(W)^2 <= a^2) = F(((a + next(a)) / 2)^2) and P(round(W)^2 < a^2) = F(((a + previous(a)) / 2)^2),
    F the Beta(1/2, (d-1)/2) CDF of the exact W_ij^2 (the rounding is monotone and symmetric in W_ij).
    Returns (F at, F below) for values = stored W_ij (any sign)."""
    beta = _stats().beta(0.5, (d - 1) / 2.0).cdf
    a = np.abs(np.asarray(values, dtype=np.float64))
    below, above = _neighbours(a, storage)
    at = beta(np.minimum(((a + above) / 2.0) ** 2, 1.0))
    under = np.where(a > 0, beta(np.minimum(((a + below) / 2.0) ** 2, 1.0)), 0.0)
    return at, under


def _log10_tail(log_bound: float) -> float:
    return max(log_bound, 0.0) / math.log(10.0)


def ks_residual(values: np.ndarray, cdf, cdf_below=None) -> tuple[float, float]:
    """(-log10 p, D) of the two-sided one-sample KS test of values against the cdf.

    D = sup |F_N - F| from the sorted sample, p = P(D_N >= D) from its exact finite-N law
    (scipy.stats.kstwo, what scipy.stats.kstest uses); the DKW lower bound when p underflows.
    For a law with atoms (values rounded to a storage dtype) cdf_below(x) = P(X < x) gives the left
    limits: D is then the exact sup over the jumps, and the continuous law's p-value is conservative
    (P(D_N >= D) is at most the continuous one's for a discontinuous F: Conover 1972), so the test
    keeps its level.
    """
    n = values.size
    ordered = np.sort(values)
    F = cdf(ordered)
    F_below = F if cdf_below is None else cdf_below(ordered)
    steps = np.arange(1, n + 1) / n
    D = float(max(np.max(steps - F), np.max(F_below - (steps - 1.0 / n))))
    pvalue = float(_stats().kstwo.sf(D, n))
    if pvalue > 0:
        return max(0.0, -math.log10(pvalue)), D
    # Massart (1990): P(sup |F_N - F| >= D) <= 2 exp(-2 N D^2)
    return _log10_tail(2.0 * n * D**2 - math.log(2.0)), D


def sign_residual(positive: np.ndarray) -> tuple[float, float]:
    """(-log10 p, share of True) of the exact two-sided binomial test of share 1/2.

    The Binomial(n, 1/2) law is symmetric, so the two-sided p-value (what scipy.stats.binomtest
    gives at p = 1/2) is min(1, 2 P(K <= min(k, n - k))); the Chernoff bound when it underflows.
    """
    n, k = int(positive.size), int(np.count_nonzero(positive))
    share = k / n
    pvalue = min(1.0, 2.0 * float(_stats().binom.cdf(min(k, n - k), n, 0.5)))
    if pvalue > 0:
        return max(0.0, -math.log10(pvalue)), share
    # Chernoff-Hoeffding: P(|K - n/2| >= |k - n/2|) <= 2 exp(-n KL(k/n || 1/2))
    kl = sum(q * math.log(q / 0.5) for q in (share, 1.0 - share) if q > 0)
    return _log10_tail(n * kl - math.log(2.0)), share


def so3_angle_cdf(theta):
    """CDF of the rotation angle of Haar SO(3): (theta - sin theta)/pi on [0, pi]."""
    return (theta - np.sin(theta)) / np.pi


# --------------------------------------------------------------------------------------------
# The run
# --------------------------------------------------------------------------------------------


def _new_checks(prefix: str) -> dict[str, NumericalCheck]:
    bound_note = ("-log10 alpha_i, alpha_i = 1e-6 / K (Bonferroni over the K tests of the plan); residual -log10 p, "
                  "p from the recorded seed, so the test is deterministic")
    checks = {
        "orthonormality": NumericalCheck(
            f"{prefix}orthonormality", "||W^T W - I_r||_F of every draw",
            "reference_impl.manifold_tolerance(d, r) = 32 (d r + 2 sqrt r) u: representation error 2 sqrt(r) u "
            "plus the Gram evaluation d r u of a backward-stable orthogonalisation (reference_impl._validation)"),
        "first_entry_beta": NumericalCheck(
            f"{prefix}first_entry_beta", "KS test of W_00^2 against Beta(1/2, (d-1)/2) (first column uniform on S^{d-1})", bound_note),
        "last_entry_beta": NumericalCheck(
            f"{prefix}last_entry_beta", "KS test of W_{d-1,r-1}^2 against Beta(1/2, (d-1)/2) (last column uniform on S^{d-1})", bound_note),
        "first_entry_sign": NumericalCheck(
            f"{prefix}first_entry_sign", "binomial test of P[W_00 > 0] = 1/2 (invariance under row sign flips)", bound_note),
        "corner_sign_product": NumericalCheck(
            f"{prefix}corner_sign_product", "binomial test of P[W_00 W_{d-1,r-1} > 0] = 1/2 (invariance under flipping the last row or column)", bound_note),
        "det_sign": NumericalCheck(
            f"{prefix}det_sign", "binomial test of P[det Q < 0] = 1/2 for random_orthogonal (both components of O(n))", bound_note),
        "so3_rotation_angle": NumericalCheck(
            f"{prefix}so3_rotation_angle", "KS test of the rotation angle of det(Q) Q, n = 3, against (theta - sin theta)/pi", bound_note),
    }
    return checks


def _draw(sampler: Sampler, source: str, d: int, r: int, count: int, seed: int, label: str):
    """Yield (key, frames) chunks of `count` draws from the sampler."""
    for chunk, size in enumerate(chunk_sizes(count, d, r, max_entries=2**22)):
        key = (CLAIM_ID, label, source, d, r, chunk)
        rng = rng_for(seed, *key)
        frames = sampler.random_point(d, r, rng, (size,)) if source == "point" else sampler.random_orthogonal(d, rng, (size,))
        yield key, np.asarray(frames, dtype=np.float64)


def _shapes() -> list[tuple[str, int, int]]:
    """(source, d, r) of every shape of the plan, the random points first: the chunks of run_tests."""
    return sorted({(source, shape[0], shape[1]) for _, source, shape in statistical_plan()}, key=lambda x: (x[0] != "point", x[1], x[2]))


def shape_tests(shape, sampler: Sampler | str, seed: int, samples: int, prefix: str = "", label: str = "real") -> Evidence:
    """Every test of the plan at one shape (source, d, r) for `sampler` (a Sampler, or a registered
    sampler's name: "reference" or a control's), `samples` draws: its checks, and its per-test
    records in extra["tests_of_sampler"]. A shape's statistics need all of its draws at once."""
    if not isinstance(sampler, Sampler):  # a name travels to a worker; a sampler's lambdas cannot
        sampler = sampler_named(sampler)
    source, d, r = shape
    checks = _new_checks(prefix)
    bound = -math.log10(alpha_per_test())
    try:
        return _shape_statistics(sampler, shape, seed, samples, prefix, label, checks, bound)
    except Exception as error:  # a sampler that raises on a valid shape fails every test of it, with the reason
        message = f"{type(error).__name__}: {str(error).splitlines()[0] if str(error) else ''}"
        for name, check in checks.items():
            if name == "orthonormality" or (name, source, (d, r)) in statistical_plan(sampler.storage):
                check.add([math.inf], 1.0, shape=(d, r), seed=seed, extra={"source": source, "raised": message})
        return Evidence(checks=list(checks.values()), notes=[f"{sampler.name} raised at ({d}, {r}): {message}"],
                        extra={"tests_of_sampler": []})


def _shape_statistics(sampler: Sampler, shape, seed: int, samples: int, prefix: str, label: str, checks: dict, bound: float) -> Evidence:
    """shape_tests' statistics on the draws of one shape."""
    source, d, r = shape
    records = []
    first, last, negative_det, angle = [], [], [], []
    first_key = None
    for key, W in _draw(sampler, source, d, r, samples, seed, label):
        first_key = first_key or key
        if W.shape[-2:] != (d, r):
            raise ValueError(f"sampler {sampler.name} returned shape {W.shape[-2:]} for ({d}, {r})")
        residual = np.linalg.norm(np.swapaxes(W, -1, -2) @ W - np.eye(r), axis=(-2, -1))
        checks["orthonormality"].add(residual, orthonormality_tolerance(d, r, sampler.storage), shape=(d, r), key=key, seed=seed)
        first.append(W[:, 0, 0])
        last.append(W[:, d - 1, r - 1])
        if d == r:
            det = np.linalg.det(W)
            negative_det.append(det < 0)
            if d == ROTATION_ANGLE_SIZE and sampler.storage == "float64":
                rotation = W * np.where(det < 0, -1.0, 1.0)[:, None, None]
                cosine = (np.trace(rotation, axis1=-2, axis2=-1) - 1.0) / 2.0
                angle.append(np.arccos(np.clip(cosine, -1.0, 1.0)))
    first, last = np.concatenate(first), np.concatenate(last)
    results = {"first_entry_beta": _entry_test(first, d, sampler.storage), "last_entry_beta": _entry_test(last, d, sampler.storage)}
    results.update({
        "first_entry_sign": sign_residual(first > 0),
        "corner_sign_product": sign_residual(first * last > 0),
    })
    if source == "orthogonal":
        results["det_sign"] = sign_residual(np.concatenate(negative_det))
        if d == ROTATION_ANGLE_SIZE and sampler.storage == "float64":
            results["so3_rotation_angle"] = ks_residual(np.concatenate(angle), so3_angle_cdf)
    for name, (minus_log10_p, statistic) in results.items():
        checks[name].add([minus_log10_p], bound, shape=(d, r), key=first_key, seed=seed,
                         extra={"source": source, "statistic": statistic, "samples": first.size})
        records.append({"check": f"{prefix}{name}", "source": source, "shape": [d, r], "samples": int(first.size),
                        "minus_log10_p": minus_log10_p, "statistic": statistic, "rejected": minus_log10_p > bound})
    return Evidence(checks=list(checks.values()), extra={"tests_of_sampler": records})


def _entry_test(entries: np.ndarray, d: int, storage: str) -> tuple[float, float]:
    """KS test of squared entries against Beta(1/2, (d-1)/2), or against its law after rounding to storage."""
    if storage == "float64":
        return ks_residual(entries**2, _stats().beta(0.5, (d - 1) / 2.0).cdf)
    # the order of entries**2 is the order of |entries|: rounded_cdfs reads the stored values back
    order = np.argsort(np.abs(entries))
    at, under = rounded_cdfs(entries[order], d, storage)
    return ks_residual(np.arange(entries.size, dtype=np.float64), lambda i: at[i.astype(np.int64)], lambda i: under[i.astype(np.int64)])


def run_tests(sampler: Sampler | str, seed: int, samples: int, prefix: str = "", label: str = "real") -> Evidence:
    """All checks of the plan for `sampler`, `samples` draws per shape (shape_tests): one task per
    shape for a registered sampler (its name), merged in shape order; a Sampler object given by the
    caller runs here, untasked."""
    if isinstance(sampler, Sampler):
        return Evidence.merged(shape_tests(shape, sampler, seed, samples, prefix, label) for shape in _shapes())
    return map_evidence(shape_tests, _shapes(), sampler, seed, samples, prefix, label, task_label="run_tests")


def resolve_sampler(optimizer: str, sampler) -> tuple[Sampler, list[str]]:
    """The sampler under test: `sampler` (a Sampler or a control name), else the control named by
    `optimizer`, else the reference's (any optimizer variant leaves the samplers unchanged)."""
    notes = []
    if isinstance(sampler, Sampler):
        return sampler, notes
    name = sampler if sampler is not None else optimizer
    if name in CONTROL_SAMPLERS:
        return CONTROL_SAMPLERS[name], notes
    if sampler is not None:
        try:
            return sampler_named(sampler), notes
        except ValueError:
            raise ValueError(f"unknown sampler {sampler!r}; known: {', '.join(CONTROL_SAMPLERS)}, "
                             f"stiefel_init_<dtype> for dtype in {', '.join(TORCH_DTYPES)}") from None
    if optimizer not in VARIANTS:
        raise ValueError(f"unknown optimizer {optimizer!r}; known: {', '.join(VARIANTS)} or a sampler control: {', '.join(CONTROL_SAMPLERS)}")
    if optimizer != "stiefel_adam":
        notes.append(f"optimizer {optimizer} does not enter this claim: the reference samplers are tested")
    return reference_sampler(), notes


def _prepare(ctx: Context) -> Context:
    """Resolve the sampler under test once (an unknown name is refused before anything runs)."""
    under_test, notes = resolve_sampler(ctx.optimizer, ctx.option("sampler"))
    return replace(ctx, options={**ctx.options, "sampler": under_test, "sampler_notes": notes,
                                 "registered": _registered(under_test, ctx.option("sampler"))})


def _registered(under_test: Sampler, given) -> bool:
    """A registered sampler (the reference's, stiefel_init_'s or a control's) travels to the chunk tasks by name."""
    if isinstance(given, Sampler):
        return False
    try:
        return sampler_named(under_test.name).name == under_test.name
    except ValueError:
        return False


def statistics_part(ctx: Context) -> Evidence:
    """Every test of the plan for the sampler under test, max(CONTROL_SAMPLES, frames) draws per shape;
    by default the reference's samplers and torch_impl.stiefel_init_ in every storage dtype."""
    under_test = ctx.option("sampler")
    samples = max(CONTROL_SAMPLES, ctx.profile.frames)
    runs = [(under_test, "")]
    if under_test.name == "reference" and ctx.option("registered"):
        runs += [(sampler, f"{sampler.name}:") for sampler in torch_samplers()]
    # the shapes are tasks of the current executor (propositions.kit.parallel)
    evidence = Evidence.merged(run_tests(sampler.name if ctx.option("registered") else sampler, ctx.seed, samples, prefix,
                                         label="real" if not prefix else f"real:{sampler.name}")
                               for sampler, prefix in runs)
    records = evidence.extra["tests_of_sampler"]
    notes = list(ctx.option("sampler_notes"))
    if under_test.name == "reference" and len(runs) == 1:
        notes.append("torch is not installed: torch_impl.stiefel_init_ was not tested")
    return Evidence(
        checks=[check for check in evidence.checks if check.samples],  # no rotation angle test in float32 or bfloat16
        frames=samples * sum(len({(source, shape) for _, source, shape in statistical_plan(s.storage)}) for s, _ in runs),
        notes=notes,
        extra={
            "sampler": under_test.name,
            "samplers": [sampler.name for sampler, _ in runs],
            "family_wise_alpha": FAMILY_WISE_ALPHA,
            "tests": total_tests(),
            "alpha_per_test": alpha_per_test(),
            "samples_per_test": samples,
            "control_samples_per_test": CONTROL_SAMPLES,
            "point_shapes": [list(shape) for shape in POINT_SHAPES],
            "orthogonal_sizes": list(ORTHOGONAL_SIZES),
            "tests_of_sampler": records,
        },
    )


def broken_sampler(ctx: Context) -> Evidence | None:
    """A control: the broken sampler named ctx.optimizer through the same tests at CONTROL_SAMPLES
    draws per shape; its extra records how many tests rejected it (the measured power). The torch
    control (a stiefel_init_ by QR without the sign fix) does not apply where torch is not installed."""
    name = ctx.optimizer
    if name == TORCH_QR_CONTROL:
        if not torch_samplers():
            return None
        name = f"{TORCH_QR_CONTROL}_{TORCH_QR_CONTROL_DTYPE}"
    # shape by shape, in the plan's order, until a test rejects the sampler at p <= alpha_i^DETECTION_FACTOR:
    # the control's verdict is decided there, and the shapes after it would only add cost
    found = []
    for shape in _shapes():
        found.append(shape_tests(shape, name, ctx.seed, CONTROL_SAMPLES, f"{name}:", f"control:{name}"))
        if any(check.samples and check.max_ratio >= DETECTION_FACTOR for check in found[-1].checks):
            break
    evidence = Evidence.merged(found)
    records = evidence.extra["tests_of_sampler"]
    return Evidence(checks=[check for check in evidence.checks if check.samples], extra={"rejected_tests": sum(record["rejected"] for record in records),
                                          "tests": len(records), "shapes_until_detected": len(found)})


CLAIM = Claim(
    id=CLAIM_ID,
    title="The frame samplers are Haar",
    statement=STATEMENT,
    latex=LATEX,
    symbolic=Symbolic("none: a distributional claim about a sampler, tested statistically"),
    parts=(Part("statistics", statistics_part),),
    controls=tuple(Control(name, broken_sampler, broken.description) for name, broken in CONTROL_SAMPLERS.items()) + (
        Control(TORCH_QR_CONTROL, broken_sampler, f"a torch_impl.stiefel_init_ written as the Q of torch's QR of a Gaussian, signs as LAPACK leaves them ({TORCH_QR_CONTROL_DTYPE})"),),
    notes=(
        "statistical checks: residual -log10 p, bound -log10 alpha_i with alpha_i = 1e-6 / K (Bonferroni); the "
        "draws come from the recorded seed, so each p-value is reproduced exactly by a re-run; a control's margin "
        "is log p / log alpha_i (DETECTION_FACTOR 10: p <= alpha_i^10); where scipy's p underflows the residual is "
        "the DKW (KS) or Chernoff (binomial) lower bound on -log10 p",
    ),
    prepare=_prepare,
    precisions=(("under test", "reference_impl.random_point and its statistics", ("float64",)), ("under test", "torch_impl.stiefel_init_", TORCH_DTYPES, "torch")),
)
