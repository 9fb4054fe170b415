"""The precision of the optimizer under test, and what it changes in the claims' bounds.

Every bound of P1..P5 that involves the optimizer under test is a first-order rounding analysis in
the unit roundoff of that optimizer's evaluation. For the float64 reference and any float64
implementation it is u = 2^-53, as before. An implementation whose frames are stored in float32 or
bfloat16 (an adapter's `dtype`) is held to the same analyses at its own unit roundoffs:

  u_s  of the storage dtype: its inputs W, G (and a state handed to it) are rounded to it, each entry
       by a relative u_s, and its outputs W+, m+, v+ are rounded to it on the way out;
  u_c  of the compute dtype: every operation of its evaluation (float64 computes in float64, float32
       in float32; bfloat16 storage computes in float32, as PyTorch's kernels and torch_impl do).

Two ways the claims use them:

* through the one rounding analysis of the step (kit/step_analysis.step_error): `rounding()` gives its
  Rounding (u_c, u_W = u_s, the retraction route unknown) and `storage_inputs()` its InputErrors (the
  inputs' rounding to storage); the trajectory checks (kit/trajectories), the running bounds of P2 and
  P4 (kit/running_bounds) and P5's step pairs take these;
* through the claims' own first-order formulas (P1's first step, P3's step checks): each is written for
  one evaluation in which every operation rounds by at most u, with every input and output entry
  carrying at least one such rounding. A lower-precision implementation rounds each input and output
  entry once more, by u_s, and every operation by u_c: the same derivation holds with u replaced by
  `u` = u_c + u_s (the two roundings of an entry compose to (1 + d1)(1 + d2), |d1| <= u_c, |d2| <= u_s,
  within u_c + u_s to first order), provided the first-order analysis still applies, n u <= 1/16 for
  the longest sum n of the formula (gamma_n then exceeds n u by at most 7 %, and the second-order terms
  of a few such factors stay inside the factor 2 the derivations keep for them). `gamma(n)` refuses
  beyond that: the claim is then inconclusive for that precision (bfloat16's u_s = 2^-8 allows sums of
  at most 15 terms), never held to a bound whose derivation does not apply.

The gradients' per-frame scales stay inside the dtype's range: `scale_decades` is the largest k with
10^k sqrt(n) 10^3.5 below sqrt(max) for the n = d r of the claims' largest frames, so that ||g||^2 and
the second moment's division by 1 - beta2^t (>= 10^-3) do not overflow, and the squares of the smallest
entries do not fall below the smallest normal number (30 for float64, the claims' choice; 13 for
float32 and bfloat16, whose range is float32's).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from .step_analysis import COMPUTE_DTYPES, NEWTON_SCHULZ_MAX_TRUST_RADIUS, UNIT_ROUNDOFFS, InputErrors, Rounding
from .step_analysis import StepNorms, declared_rounding, frame_drift_bound, newton_schulz_iterations, reference_quantities
from .step_analysis import step_error

# the longest sum n of a first-order formula must keep n u at most this (module docstring)
FIRST_ORDER_LIMIT = 1 / 16
# the most decades of gradient scale any claim draws (float64's choice)
MAX_SCALE_DECADES = 30
# The retraction routes an implementation may declare (step_analysis.retraction_error): "any" (not
# declared: the largest bound of the routes), "svd", "eigh", and "gram" (docs/algorithm.md's Gram route
# of the PyTorch kernel: Newton-Schulz for trust_radius <= 1, with the iteration count step_analysis
# derives from the trust radius and u_c, eigh above).
ROUTES = ("any", "svd", "eigh", "gram")


class PrecisionTooCoarse(ValueError):
    """A first-order bound asked for at a precision where its derivation does not apply."""


@dataclass(frozen=True)
class Precision:
    """The storage and compute dtypes of the optimizer under test (module docstring). stages: the
    (stage, dtype) pairs of an implementation that declares how it evaluates each stage (the form of
    torch_impl.functional.declared_precision, step_analysis.declared_rounding), with state the dtype
    of its m and v; the analysis then holds it to exactly that. Without them every stage is taken at
    u_c (the generic analysis: beta^t formed in the compute dtype too)."""

    storage: str = "float64"
    compute: str = "float64"
    route: str = "any"
    stages: tuple = ()
    state: str | None = None

    def __post_init__(self):
        for dtype in (self.storage, self.compute, *(dtype for _, dtype in self.stages), self.state or "float64"):
            if dtype not in UNIT_ROUNDOFFS:
                raise ValueError(f"dtype must be one of {', '.join(UNIT_ROUNDOFFS)}, got {dtype!r}")
        if self.route not in ROUTES:
            raise ValueError(f"retraction route must be one of {', '.join(ROUTES)}, got {self.route!r}")

    @classmethod
    def declared(cls, declaration) -> "Precision":
        """The Precision of an implementation's stage-by-stage declaration ({"storage", "state", "route",
        "stages"}, or its frozen_declaration); its compute dtype is that of its retraction stage."""
        declaration = {key: dict(value) if key == "stages" else value for key, value in dict(declaration).items()}
        stages = tuple(sorted(declaration["stages"].items()))
        compute = declaration["stages"].get("retraction", declaration["state"])
        return cls(declaration["storage"], compute, declaration["route"], stages, declaration["state"])

    @property
    def is_declared(self) -> bool:
        return bool(self.stages)

    @property
    def u_s(self) -> float:
        """The storage rounding of inputs and outputs: 0 for float64 (the claims' inputs are float64)."""
        return 0.0 if self.storage == "float64" else UNIT_ROUNDOFFS[self.storage]

    @property
    def u_c(self) -> float:
        return UNIT_ROUNDOFFS[self.compute]

    @property
    def u(self) -> float:
        """The unit roundoff of the claims' own first-order formulas: u_c + u_s (module docstring)."""
        return self.u_c + self.u_s

    @property
    def is_float64(self) -> bool:
        return self.storage == "float64" and self.compute == "float64"

    def gamma(self, n: float) -> float:
        """Higham's gamma_n = n u / (1 - n u) at this precision's u; PrecisionTooCoarse past n u = 1/16."""
        nu = n * self.u
        if nu > FIRST_ORDER_LIMIT:
            raise PrecisionTooCoarse(
                f"a first-order rounding bound over sums of {int(n)} terms does not apply in {self.storage} "
                f"(n u = {nu:.3g} > {FIRST_ORDER_LIMIT}, u = u_c + u_s = {self.u:.3g})")
        return nu / (1 - nu)

    def rounding(self, trust_radius: float, d: int, r: int) -> Rounding:
        """step_analysis.Rounding of one evaluation by the optimizer under test, on its declared route
        (and at its declared stage precisions, where it declares them)."""
        if self.is_declared:
            declaration = {"storage": self.storage, "state": self.state or self.compute, "route": self.route,
                           "stages": dict(self.stages)}
            return declared_rounding(declaration, trust_radius, d, r)
        u_state = 0.0 if self.storage == "float64" else self.u_c
        if self.route == "gram" and 0 < trust_radius <= NEWTON_SCHULZ_MAX_TRUST_RADIUS:
            drift = frame_drift_bound(d, r, max(self.u_s, self.u_c), self.u_c, trust_radius)
            k = newton_schulz_iterations(trust_radius, self.u_c, drift)
            return Rounding(u_c=self.u_c, u_W=self.u_s, u_state=u_state, route="newton_schulz", iterations=k)
        route = "eigh" if self.route == "gram" else self.route
        return Rounding(u_c=self.u_c, u_W=self.u_s, u_state=u_state, route=route)

    def storage_inputs(self, W_norm, m_norm=0.0, v=0.0, m_error=0.0, v_error=0.0) -> InputErrors:
        """step_analysis.InputErrors of inputs rounded to storage (frame W, the gradient, the moments
        handed to it), on top of errors m_error, v_error the moments already carry."""
        u_s = self.u_s
        state = self.state or self.compute
        u_state = 0.0 if self.storage == "float64" and state == "float64" else UNIT_ROUNDOFFS[state]
        return InputErrors(W=u_s * np.asarray(W_norm, dtype=np.float64), G_rel=u_s,
                           m=m_error + u_state * np.asarray(m_norm, dtype=np.float64),
                           v=v_error + u_state * np.asarray(v, dtype=np.float64))

    @property
    def scale_decades(self) -> int:
        """The decades of per-frame gradient scale the claims draw at this precision (module docstring)."""
        largest = float(np.finfo(np.float32 if self.storage != "float64" else np.float64).max)
        n = 1024 * 128  # the claims' largest frames
        k = math.floor(0.5 * math.log10(largest) - 0.5 * math.log10(n) - 3.5)
        return int(min(MAX_SCALE_DECADES, k))

    def describe(self) -> dict:
        """What the certificate records: the dtypes and the unit roundoffs its bounds used."""
        described = {"storage": self.storage, "compute": self.compute, "u_s": self.u_s, "u_c": self.u_c, "u": self.u,
                     "retraction_route": self.route, "gradient_scale_decades": self.scale_decades}
        if self.is_declared:
            described["declared_stages"] = dict(self.stages)
            described["state"] = self.state or self.compute
        return described

    def text(self) -> str:
        if self.is_float64:
            return "float64 (u = 2^-53)"
        return (f"{self.storage} storage (u_s = 2^{round(math.log2(self.u_s))}), {self.compute} compute "
                f"(u_c = 2^{round(math.log2(self.u_c))}); first-order formulas at u = u_c + u_s = {self.u:.3g}")


FLOAT64 = Precision()


def frozen_declaration(declaration: dict) -> tuple:
    """A stage-by-stage declaration ({"storage", "state", "route", "stages": {stage: dtype}}) as nested
    sorted tuples, hashable, so that an implementation's description can carry it; Precision.declared
    takes either form."""
    return tuple(sorted((key, tuple(sorted(value.items())) if isinstance(value, dict) else value)
                        for key, value in declaration.items()))


def of(optimizer) -> Precision:
    """The Precision of an optimizer under test: a reference_impl variant name (float64), or an adapted
    implementation with `dtype` (storage) and optionally `compute_dtype` and `route` (its declared
    retraction, certify/outside/adapters.py), or `declaration` (its stage-by-stage declaration, Precision.declared)."""
    if isinstance(optimizer, str):
        return FLOAT64
    declaration = getattr(optimizer, "declaration", None)
    if declaration:
        return Precision.declared(declaration)
    storage = getattr(optimizer, "dtype", "float64") or "float64"
    compute = getattr(optimizer, "compute_dtype", None) or COMPUTE_DTYPES[storage]
    return Precision(storage, compute, getattr(optimizer, "route", None) or "any")


def evaluation_bound(W, G, state, config, precision: Precision) -> dict:
    """Per-frame bounds on the distance of one evaluation of the step by the optimizer under test (at
    `precision`, on its declared route, its inputs rounded to storage) from the exact step at (W, G,
    state): {"W", "m", "v"} (inf where the step is not well posed at that rounding: no bound), from
    the one analysis of the step (step_analysis.step_error) at the float64 reference's quantities.

    Two evaluations whose exact steps are equal (P5: with and without weight decay) differ by at most
    the sum of their bounds; an evaluation and a float64 quantity within B of the exact step by E + B.
    """
    d, r = W.shape[-2], W.shape[-1]
    q = reference_quantities(W, G, state, config)
    W_norm = np.sqrt(np.sum(np.asarray(W) ** 2, axis=(-2, -1)))
    norms = StepNorms(G=q["G"], W=W_norm, g=q["g"], m_in=q["m_old"], v_in=q["v_old"], m=q["m"], v=q["v"],
                      xi_raw=q["xi_unclipped"], xi=q["xi"], A=q["A"], sigma_min=q["sigma_min"], sigma_max=q["A_2"], t=q["t"])
    with np.errstate(all="ignore"):
        error = step_error(d, r, config, norms, precision.rounding(config.trust_radius, d, r),
                           precision.storage_inputs(W_norm, q["m_old"], q["v_old"]))
    posed = np.asarray(error.well_posed)
    tiny = np.finfo(np.float64).tiny
    return {"W": np.where(posed, error.W, np.inf), "m": np.maximum(np.where(posed, error.m_plus, np.inf), tiny),
            "v": np.maximum(error.v, tiny)}
