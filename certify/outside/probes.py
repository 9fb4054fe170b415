"""Property probes: which property of StiefelAdam an implementation's first step has, measured.

The claims say *that* an implementation differs (a check fails, with its margin); these probes say
*how*, each from the implementation's own first step from a fresh state (float64 frames, a few shapes,
seeded draws), through init/step only:

  direction     A tiny step (lr sqrt(d r) = 1e-7, eps = 0, no cap): its direction xi, recovered by
                the inverse polar retraction, against -P_W(G) (the embedded-metric gradient,
                StiefelAdam) and against -(G - W G^T W) (the canonical-metric gradient). A retraction
                that is not polar bends the recovered xi by O(step) = 1e-7 relative, rounding by
                about u / 1e-7 ~ 1e-9, so 1 - cos above 1e-6 is a different direction.
  step length   The same step: ||xi|| / (lr sqrt(d r)) is 1 for the mean-square second moment
                ||g||^2 / (d r); a sum of squares ||g||^2 gives 1 / sqrt(d r).
  trust region  lr sqrt(d r) = 100 with Delta = 0.1: a polar step of length <= Delta moves W by at most
                2 Delta (the polar factor of W + xi is the nearest frame to it, so
                ||W_1 - W|| <= ||W_1 - (W + xi)|| + ||xi|| <= 2 ||xi||); without a cap the frame moves
                by O(sqrt(2 r)).
  retraction    A step of moderate length (lr sqrt(d r) = 0.3, no cap) against three retractions along
                the step's own tiny-step direction u: polar(W + a u), the sign-fixed QR factor qf(W + a u)
                and the Cayley retraction with velocity u; a is fitted per frame (bounded Brent search).
                The direction is known to about 1e-7 relative, so the right retraction fits to about
                1e-7 ||W_1 - W||; a fit below 1e-5 ||W_1 - W|| names it.
  v^ = 0        G = 0 from a fresh state with eps = 0: StiefelAdam's xi is 0 where v^ = 0 (never 0/0),
                so W_1 = polar(W), within the polar factor's rounding of W.

Every kind of implementation is probed (float64, float32 and bfloat16 storage, NumPy steps and torch
optimizers) at its own unit roundoff u = u_c + u_s (propositions/kit/precision.py): the figures above
are float64's (u = 2^-53). Below float64 the tiny step is sqrt(u) instead of 1e-7, which balances its
two errors (O(step) from the retraction, u / step from rounding), and the direction, length and fit
tolerances grow by the same factor sqrt(u) / 1e-7 (about 3500 for float32); the zero-gradient
allowance takes u in place of float64's.

Where the implementation is undefined at eps = 0 (declared in its spec, or its first step there is not
finite), the probes other than the last run at eps = 1e-8 and say so: with unit-scale gradients that
moves the first step's length by about 1e-8 relative and its direction not at all. A frame that is
not finite is a finding (never read as "no move"); a step that raises, or whose output the adapter
refuses, is the measurement; an error of a probe's own code is reported as "not measured".

These are diagnostics for the compare report, not certificates: the verdicts are the claims'.
"""

from __future__ import annotations

import math

import numpy as np
from scipy.optimize import minimize_scalar

import reference_impl as ri
from propositions._common import rng_for
from propositions.kit.bounds import polar_error_bound
from propositions.kit import precision as precisions
from propositions.kit.directions import inverse_polar_retraction

PROBE_SHAPES = ((5, 2), (8, 3), (16, 4))
PROBE_FRAMES = 6
TINY_STEP = 1e-7
DIRECTION_TOLERANCE = 1e-6
LENGTH_TOLERANCE = 1e-6
FIT_TOLERANCE = 1e-5


def _frobenius(A):
    return np.sqrt(np.sum(A * A, axis=(-2, -1)))


def _inner(A, B):
    return np.sum(A * B, axis=(-2, -1))


def _draw(seed, d, r, label):
    rng = rng_for(seed, "probe", label, d, r)
    W = ri.random_point(d, r, rng, (PROBE_FRAMES,))
    return W, rng.standard_normal(W.shape)


class StepProblem(Exception):
    """The implementation's own step failed on a probe's input: it raised, or the adapter refused its
    output (a frame that is not finite or is off St(d, r)). Its message is the probe's measurement;
    any other error is the probe's own, and is reported as "not measured"."""


def _first_step(variant, W, G, config):
    from certify.outside.adapters import ImplementationError

    try:
        W1 = variant.step(W, G, variant.init(W), config)[0]
    except ImplementationError as error:
        raise StepProblem(f"the step's output is refused: {_one_line(error)}") from None
    except Exception as error:  # the implementation's own error is the measurement
        raise StepProblem(f"the step raised {type(error).__name__}: {_one_line(error)}") from None
    return np.asarray(W1, dtype=np.float64)


def _one_line(error) -> str:
    text = str(error).strip()
    return text.splitlines()[0] if text else type(error).__name__


def _scale(variant) -> float:
    """How much coarser than float64's the probes' tiny step and tolerances are (module docstring)."""
    u = precisions.of(variant).u
    return max(1.0, math.sqrt(u) / TINY_STEP)


def _config(d, r, step_length, trust_radius=math.inf, eps=0.0):
    return ri.StiefelAdamConfig(lr=step_length / math.sqrt(d * r), betas=(0.9, 0.999), eps=eps, trust_radius=trust_radius)


# the probes' eps where the implementation is undefined at eps = 0 (declared, or its step there is not
# finite): with gradients of unit scale sqrt(v^) is about 1, so the first step's length moves by
# about 1e-8 relative, below the length tolerance, and its direction not at all (eps scales it)
FALLBACK_EPS = 1e-8


def _qr(A):
    Q, R = np.linalg.qr(A)
    signs = np.where(np.diagonal(R) < 0, -1.0, 1.0)
    return Q * signs[None, :]


def _cayley(W, u, a):
    d = W.shape[0]
    v = u - 0.5 * W @ (W.T @ u)  # A W = u for tangent u (Wen-Yin): A = v W^T - W v^T
    A = v @ W.T - W @ v.T
    return np.linalg.solve(np.eye(d) - 0.5 * a * A, (np.eye(d) + 0.5 * a * A) @ W)


RETRACTIONS = {
    "polar": lambda W, u, a: ri.polar_factor(W + a * u),
    "QR (sign-fixed)": lambda W, u, a: _qr(W + a * u),
    "Cayley": _cayley,
}


def _fit(retraction, W, u, W1) -> float:
    """min over a of ||W1 - R_W(a u)|| / ||W1 - W||, for one frame (infinite where W1 or u is not finite)."""
    if not (np.all(np.isfinite(W1)) and np.all(np.isfinite(u))):
        return math.inf
    scale = float(np.linalg.norm(W1 - W))
    if scale == 0:
        return 0.0
    best = minimize_scalar(lambda a: float(np.linalg.norm(W1 - retraction(W, u, a))), bounds=(0.0, 4.0 * scale + 1e-12),
                           method="bounded", options={"xatol": 1e-15 * max(scale, 1.0), "maxiter": 500})
    return float(best.fun) / scale


def _guarded(name: str, expected: str, body) -> dict:
    """One probe's record; a step that raises or whose output is refused is itself the measurement
    (its one-line reason); an error of the probe's own is "not measured", never blamed on the step."""
    try:
        return {"property": name, "expected": expected, **body()}
    except StepProblem as problem:
        return {"property": name, "expected": expected, "measured": str(problem), "differs": True, "finding": str(problem)}
    except Exception as error:
        return {"property": name, "expected": expected, "differs": False, "finding": "",
                "measured": f"not measured: the probe itself failed ({type(error).__name__}: {_one_line(error)})"}


def _not_finite(*arrays) -> bool:
    return not all(np.all(np.isfinite(a)) for a in arrays)


class _Probes:
    """The probes of one variant; the direction probe's frames and lengths serve the length and
    retraction probes after it."""

    def __init__(self, variant, seed: int):
        self.variant, self.seed = variant, seed
        self.scale = _scale(variant)
        self.tiny = TINY_STEP * self.scale
        self.directions: dict = {}
        self.lengths: list | None = None
        self.eps = self._eps()
        self.at = "" if self.eps == 0 else f" (at eps = {self.eps:g}: {self.eps_reason})"

    def _eps(self) -> float:
        """0, or FALLBACK_EPS where the implementation declares eps = 0 outside its domain or its
        first step at eps = 0 is not finite there (the probes then say so)."""
        if "eps = 0" in tuple(getattr(self.variant, "domain", ()) or ()):
            self.eps_reason = "eps = 0 is declared outside its domain"
            return FALLBACK_EPS
        d, r = PROBE_SHAPES[0]
        W, G = _draw(self.seed, d, r, "direction")
        try:
            finite = not _not_finite(_first_step(self.variant, W, G, _config(d, r, self.tiny)))
        except StepProblem:
            finite = False
        self.eps_reason = "its step is not finite at eps = 0"
        return 0.0 if finite else FALLBACK_EPS

    def _direction_and_length(self):
        cos_embedded, cos_canonical, lengths = [], [], []
        for d, r in PROBE_SHAPES:
            W, G = _draw(self.seed, d, r, "direction")
            W1 = _first_step(self.variant, W, G, _config(d, r, self.tiny, eps=self.eps))
            if _not_finite(W1):
                raise StepProblem(f"the step returned a frame that is not finite at eps = {self.eps:g}")
            xi = inverse_polar_retraction(W, W1).xi
            self.directions[(d, r)] = (W, G, xi / _frobenius(xi)[:, None, None])
            embedded = -ri.project_tangent(W, G, validate=False)
            canonical = -(G - W @ np.swapaxes(G, -1, -2) @ W)
            norm_xi = _frobenius(xi)
            cos_embedded.append(_inner(xi, embedded) / (norm_xi * _frobenius(embedded)))
            cos_canonical.append(_inner(xi, canonical) / (norm_xi * _frobenius(canonical)))
            lengths.append(norm_xi / self.tiny)
        return np.concatenate(cos_embedded), np.concatenate(cos_canonical), lengths

    def direction(self) -> dict:
        cos_e, cos_c, self.lengths = self._direction_and_length()
        worst = float(np.min(cos_e))
        differs = not 1.0 - worst <= DIRECTION_TOLERANCE * self.scale
        finding = ""
        if differs:
            if 1.0 - float(np.min(cos_c)) <= DIRECTION_TOLERANCE * self.scale:
                finding = "the step follows the canonical-metric gradient G - W G^T W, not P_W(G)"
            else:
                finding = "the first step is along neither -P_W(G) nor the canonical gradient -(G - W G^T W)"
        return {"measured": f"min cos(xi, -P_W(G)) = {worst:.9f}; min cos(xi, -(G - W G^T W)) = {float(np.min(cos_c)):.9f}{self.at}",
                "differs": differs, "finding": finding}

    def step_length(self) -> dict:
        if self.lengths is None:
            raise RuntimeError("the direction probe did not run")
        ratios = np.concatenate(self.lengths)
        sum_form = np.concatenate([length * math.sqrt(d * r) for length, (d, r) in zip(self.lengths, PROBE_SHAPES)])
        low, high = float(np.min(ratios)), float(np.max(ratios))
        differs = not max(abs(low - 1), abs(high - 1)) <= LENGTH_TOLERANCE * self.scale
        finding = ""
        if differs:
            if float(np.max(np.abs(sum_form - 1))) <= LENGTH_TOLERANCE * self.scale:
                finding = "v is the sum of squares ||g||^2, not the mean square ||g||^2 / (d r): the first step has length lr, not lr sqrt(d r)"
            else:
                finding = f"the first step's length is not lr sqrt(d r) (ratio in [{low:.4g}, {high:.4g}])"
        return {"measured": f"||xi|| / (lr sqrt(d r)) in [{low:.9g}, {high:.9g}]{self.at}", "differs": differs, "finding": finding}

    def trust_region(self) -> dict:
        delta = 0.1
        worst = 0.0
        for d, r in PROBE_SHAPES:
            W, G = _draw(self.seed, d, r, "trust")
            W1 = _first_step(self.variant, W, G, _config(d, r, 100.0, delta, eps=self.eps))
            if _not_finite(W1):  # max() would pass a NaN over as if it were no move
                raise StepProblem(f"the step returned a frame that is not finite (Delta = {delta}, lr sqrt(d r) = 100)")
            worst = max(worst, float(np.max(_frobenius(W1 - W))) / delta)
        differs = worst > 2.0 * (1 + 1e-12)
        return {"measured": f"max ||W_1 - W|| / Delta = {worst:.4g} (Delta = {delta}, lr sqrt(d r) = 100){self.at}", "differs": differs,
                "finding": "no trust region: the step is not capped at Delta" if differs else ""}

    def retraction(self) -> dict:
        if not self.directions:
            raise RuntimeError("the direction probe did not run")
        fits = {name: 0.0 for name in RETRACTIONS}
        for d, r in PROBE_SHAPES:
            W, G, u = self.directions[(d, r)]
            W1 = _first_step(self.variant, W, G, _config(d, r, 0.3, eps=self.eps))
            if _not_finite(W1):
                raise StepProblem("the step returned a frame that is not finite (a step of length 0.3)")
            for name, retraction_map in RETRACTIONS.items():
                fits[name] = max(fits[name], max(_fit(retraction_map, W[i], u[i], W1[i]) for i in range(W.shape[0])))
        best = min(fits, key=fits.get)
        text = "; ".join(f"{name} {value:.2g}" for name, value in fits.items())
        if not fits[best] <= FIT_TOLERANCE * self.scale:
            return {"measured": f"relative misfit: {text}", "differs": True,
                    "finding": "the retraction is none of polar, QR, Cayley along the step's own direction"}
        return {"measured": f"relative misfit: {text}{self.at}", "differs": best != "polar",
                "finding": f"{best} retraction, not the polar one" if best != "polar" else ""}

    def zero_gradient(self) -> dict:
        if "G = 0 at eps = 0" in tuple(getattr(self.variant, "domain", ()) or ()) or "eps = 0" in tuple(getattr(self.variant, "domain", ()) or ()):
            return {"measured": "not tried: G = 0 at eps = 0 is declared outside the implementation's domain", "differs": False, "finding": ""}
        worst = 0.0
        u_ratio = precisions.of(self.variant).u / 2.0**-53
        for d, r in PROBE_SHAPES:
            W, _ = _draw(self.seed, d, r, "zero")
            try:
                W1 = _first_step(self.variant, W, np.zeros_like(W), _config(d, r, 0.3))
            except StepProblem as problem:
                if "not finite" not in str(problem) and "non-finite" not in str(problem):
                    raise
                W1 = np.full_like(W, np.nan)
            if not np.all(np.isfinite(W1)):
                return {"measured": "W_1 is NaN", "differs": True, "finding": "no guard where v^ = 0: the step divides 0 by 0"}
            # xi = 0: W_1 = polar(W), within the polar factor's rounding at cond(W) <= (1 + phi) /
            # (1 - phi) of W, plus W's own distance phi to St(d, r); both at the implementation's u
            phi = ri.manifold_tolerance(d, r) * u_ratio
            allowed = float(polar_error_bound(d, r, (1 + phi) / (1 - phi))) * u_ratio + phi
            worst = max(worst, float(np.max(_frobenius(W1 - W))) / allowed)
        return {"measured": f"max ||W_1 - W|| / rounding allowance = {worst:.3g}", "differs": worst > 1.0,
                "finding": "the step moves W with a zero gradient" if worst > 1.0 else ""}


# (property, what the paper's step does, the _Probes method that measures it), in run order
PROBES = (
    ("first-step direction", "-P_W(G) (embedded metric)", "direction"),
    ("first-step length", "lr sqrt(d r) (v = ||g||^2 / (d r))", "step_length"),
    ("trust region", "||xi|| <= Delta", "trust_region"),
    ("retraction", "polar", "retraction"),
    ("G = 0, eps = 0", "W_1 = polar(W) (xi = 0 where v^ = 0)", "zero_gradient"),
)


def probe(variant, seed: int = 0) -> list[dict]:
    """The probes of the module docstring for a Variant; each a dict (property, expected, measured,
    differs, finding). A probe whose step raises reports the one-line reason as its measurement."""
    probes = _Probes(variant, seed)
    return [_guarded(name, expected, getattr(probes, method)) for name, expected, method in PROBES]
