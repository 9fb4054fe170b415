"""Measurements of an optimizer of frames that is known only through init and step (a black box).

The property verdicts (propositions/properties.py) ask each claim's property of an implementation
whose algorithm, state and rounding are its own. What they can use is what a run shows: its output
frames, how far they are from St(d, r), and how its output moves when its inputs move. This module
holds those measurements and the bounds built from them.

Running (`Runner`). Every call of the implementation goes through one runner, which keeps its
domain: a batched call that raises is repeated frame by frame (an implementation that takes only
(d, r) frames, or one that fails on some frames), a frame whose call raises or whose output is not
finite is left out and counted with a one-line reason, never raised into the caller. The runner
also keeps the implementation's feasibility phi: the largest ||W^T W - I||_F of any frame it
returned. An implementation is tested at its own phi (a frame off St by phi may be off along the
normal space by up to about phi, and nothing in a black box says its tangent error is smaller).

Output rounding. A frame the implementation returns carries its feasibility defect and the rounding
of the retraction that made it: `output_error` = phi_frame + E_polar, with E_polar the rounding bound
of a polar factor by the SVD (kit/bounds.polar_error_bound) at condition 2 (W + xi for a step of
length up to sqrt(3); the runs here take shorter ones) at u = u_c + u_s of the implementation's dtypes
(kit/precision.py). This is borrowed from StiefelAdam's analysis as the model of a retraction's
rounding (the polar factor is the most expensive of the retractions in use: QR, Cayley and
Newton-Schulz iterations round no worse at this condition); a black box's own retraction could round
differently, and nothing it shows can bound that.

First-order directions (`first_order_direction`). The direction of a step is the limit of
(W_1(lr) - W) / lr as lr -> 0, whatever the retraction (every retraction agrees with W + xi to first
order). It is taken by Richardson extrapolation from three step sizes lr0, lr0/2, lr0/4: with
E_k = (W_1(lr0 2^-k) - W) 2^k = a + b h_k + c h_k^2 + O(h^3) (h_k = 2^-k), D1 = 2 E_1 - E_0 and
D2 = 2 E_2 - E_1 both equal a up to -c h^2 / 2 and -c h^2 / 8, so D2's truncation error is
|D1 - D2| / 3; |D1 - D2| is kept (a factor 3 for the O(h^3) remainder). Rounding: E_k carries
output_error / h_k, so D2 carries 2 * 4 e + 2 e = 10 e (e the output error at the step size of
lr0). The step size lr0 balances the two: a step of length s = 4 e^(1/3), at most 0.25.

Sensitivity bounds (`sensitivity`, `comparison_bound`). Two runs whose inputs agree in exact
arithmetic (G and 2^k G at eps = 0, Q W and W, with and without a decay term that the projection
removes) differ by the implementation's response to the rounding that separates their inputs,
plus the rounding of each run. For a differentiable run map Phi of the gradients, a perturbation
with |dG_i| <= rho |G_i| in each of N entries moves the output by at most
||J diag(G) dz|| <= rho sum_i |G_i| ||J e_i|| <= rho sqrt(N) ||J diag(G)||_F (Cauchy-Schwarz); and
||J delta|| <= ||J||_2 ||delta|| <= ||J||_F ||delta|| for an absolute one. The Frobenius norms are
measured: E||J diag(G) z||^2 = ||J diag(G)||_F^2 for z of independent random signs (Hutchinson's
estimator), from finite differences at relative step eta = 2^-20 over PROBES draws of z; the bound
takes twice the estimate (the estimate of a sum of squares from two draws is below a quarter of it
with small probability, and sqrt(N) is already the worst case over sign patterns that rounding does
not attain). Each run's own rounding is taken as a backward error of gamma_{2d}(u) relative in each
gradient entry (its products of length at most 2d), and a frame's rounding as carried forward from
step to step, not amplified (a step moves a frame by the step, whatever small error it carries):
t steps add t output errors. These are the model of a black box, stated here because nothing in a
black box can prove them; no bound of StiefelAdam's own analysis is used.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field, replace

import numpy as np

from reference_impl import polar_factor

from .common import rng_for

FINITE_DIFFERENCE_STEP = 2.0**-20
PROBES = 2
LINEARITY = 4.0
OUTPUT_CONDITION = 2.0
RICHARDSON_STEPS = 3


def gamma(n: float, u: float) -> float:
    """Higham's gamma_n = n u / (1 - n u): the relative error of a sum of n products."""
    return n * u / (1.0 - n * u)


def frobenius(A) -> np.ndarray:
    """||A||_F per frame, shape A.shape[:-2]."""
    return np.sqrt(np.sum(np.asarray(A) ** 2, axis=(-2, -1)))


def gram_defect(W) -> np.ndarray:
    """||W^T W - I||_F per frame (shape W.shape[:-2]); inf where W is not finite."""
    W = np.asarray(W, dtype=np.float64)
    with np.errstate(all="ignore"):
        defect = frobenius(np.swapaxes(W, -1, -2) @ W - np.eye(W.shape[-1]))
    return np.where(np.isfinite(defect), defect, np.inf)


def one_line(error: BaseException) -> str:
    text = str(error).strip().splitlines()[0] if str(error).strip() else ""
    return f"{type(error).__name__}: {text}" if text else type(error).__name__


@dataclass
class Run:
    """A trajectory of the implementation: frames (T + 1, *lead, d, r) float64 (NaN where a frame was
    left out), its final state (the implementation's own; a list of per-frame states after a frame by
    frame run), ok (lead,) the frames that ran every step, phi (lead,) each frame's largest defect."""

    frames: np.ndarray
    state: object
    ok: np.ndarray
    phi: np.ndarray

    @property
    def last(self) -> np.ndarray:
        return self.frames[-1]


class PerFrameStates(list):
    """The states of a run taken frame by frame: the next run with it goes frame by frame too."""


@dataclass
class Runner:
    """Every call of one implementation (a reference_impl.Variant: init, step), with its domain kept
    (module docstring). u: the unit roundoff of its first-order rounding (u_c + u_s)."""

    variant: object
    u: float
    phi: float = 0.0  # the largest defect of any frame returned in this runner's life (reported)
    excluded: dict = field(default_factory=dict)  # (case, reason) -> frames left out
    calls: int = 0
    local_phi: float = 0.0  # the same since the last `begin`: the feasibility a property is tested at
    # the largest distance between two runs of identical inputs (properties.determinism): 0 for a
    # deterministic implementation; else the noise floor that every comparison bound carries
    noise: float = 0.0

    def begin(self) -> None:
        """Start a property: its step sizes and its reason for an untested verdict use the feasibility
        of the frames returned from now on, not that of another property's extreme inputs (P2's c =
        2^20 may push an implementation off St that stays on it at P3's steps)."""
        self.local_phi = 0.0

    def _exclude(self, case: str, reason: str, frames: int) -> None:
        """Count frames left out; reasons that differ only in their figures count together, under the
        first one seen."""
        pattern = re.sub(r"[-+]?\d[\d.]*(e[-+]?\d+)?", "#", reason)
        for (known_case, known), count in self.excluded.items():
            if known_case == case and re.sub(r"[-+]?\d[\d.]*(e[-+]?\d+)?", "#", known) == pattern:
                self.excluded[(known_case, known)] = count + int(frames)
                return
        self.excluded[(case, reason)] = int(frames)

    def _steps(self, W0, gradients, config, state):
        W = np.asarray(W0, dtype=np.float64)
        if state is None:
            state = self.variant.init(W)
        frames = [W]
        for G in gradients:
            self.calls += 1
            W_new, state = self.variant.step(W, G, state, config)
            W = np.asarray(W_new, dtype=np.float64)
            if W.shape != np.shape(W0):
                raise ValueError(f"the step returned a frame of shape {W.shape} for input {np.shape(W0)}")
            frames.append(W)
        return np.stack(frames), state

    def run(self, W0, gradients, config, state=None, case: str = "") -> Run:
        """The trajectory from W0 (*lead, d, r) under gradients (T, *lead, d, r) at config, from a fresh
        state or `state` (one this runner returned for the same frames)."""
        W0 = np.asarray(W0, dtype=np.float64)
        gradients = np.asarray(gradients, dtype=np.float64)
        lead = W0.shape[:-2]
        if not isinstance(state, PerFrameStates):
            try:
                frames, final = self._steps(W0, gradients, config, state)
                return self._finish(frames, final, lead, case)
            except Exception as error:
                # one frame, or a state that cannot be split by frame: nothing to repeat frame by frame
                if not lead or state is not None:
                    self._exclude(case, f"the step raised: {one_line(error)}", int(np.prod(lead, dtype=int)))
                    return self._empty(W0, gradients, lead)
        return self._frame_by_frame(W0, gradients, config, state, case)

    def _frame_by_frame(self, W0, gradients, config, state, case) -> Run:
        lead = W0.shape[:-2]
        frames = np.full((len(gradients) + 1,) + W0.shape, np.nan)
        states = PerFrameStates()
        raised = np.zeros(lead, dtype=bool)
        for position, index in enumerate(np.ndindex(*lead)):
            own = state[position] if isinstance(state, PerFrameStates) else None
            try:
                frame_run, final = self._steps(W0[index], gradients[(slice(None),) + index], config, own)
                frames[(slice(None),) + index] = frame_run
            except Exception as error:
                self._exclude(case, f"the step raised: {one_line(error)}", 1)
                raised[index] = True
                final = None
            states.append(final)
        return self._finish(frames, states, lead, case, raised)

    def _finish(self, frames, state, lead, case, raised=False) -> Run:
        finite = np.all(np.isfinite(frames), axis=(0, -2, -1))
        bad = int(np.sum(~finite & ~raised))
        if bad:
            self._exclude(case, "the step returned a frame that is not finite (NaN or inf)", bad)
        phi = np.max(gram_defect(frames[1:]), axis=0) if len(frames) > 1 else np.zeros(lead)
        phi = np.where(finite, phi, np.inf)
        if np.any(finite):
            self.phi = max(self.phi, float(np.max(phi[finite])))
            self.local_phi = max(self.local_phi, float(np.max(phi[finite])))
        return Run(np.where(finite[None, ..., None, None], frames, np.nan), state, finite, phi)

    def _empty(self, W0, gradients, lead) -> Run:
        frames = np.full((len(gradients) + 1,) + W0.shape, np.nan)
        return Run(frames, None, np.zeros(lead, dtype=bool), np.full(lead, np.inf))

    def output_error(self, phi, d: int, r: int, condition=OUTPUT_CONDITION):
        """A returned frame's error beyond the exact step (module docstring), per frame; condition: that
        of W + xi (step_condition), OUTPUT_CONDITION unless a step's length says it is larger."""
        from .bounds import polar_error_bound

        if np.ndim(condition) == 0:
            return np.asarray(phi) + float(polar_error_bound(d, r, condition, u_c=self.u))
        return np.asarray(phi) + polar_error_bound(d, r, np.asarray(condition, dtype=np.float64), u_c=self.u)

    def step_size(self, d: int, r: int, phi: float | None = None) -> float:
        """The step length s of the first-order directions on (d, r) frames: 4 e^(1/3), e the output
        error at feasibility phi (default: that of the current property's frames, local_phi; module
        docstring), capped at 0.25."""
        phi = self.local_phi if phi is None else phi
        return min(0.25, 4.0 * float(self.output_error(phi, d, r)) ** (1.0 / 3.0))


@dataclass
class Direction:
    """A first-order direction per frame: D (*lead, d, r) (the step at lr0, to first order), error
    (lead,) a bound on ||D - D_exact||, ok (lead,) the frames that ran, lr0 the step's learning rate."""

    D: np.ndarray
    error: np.ndarray
    ok: np.ndarray
    lr0: float


CALIBRATION_TRIALS = 12


def calibrated_lr(runner: Runner, W, G, config, state=None, case: str = "") -> float:
    """The lr at which one step moves the frames by about runner.step_size() s (the median over
    frames), so that the directions' two errors balance. A trial step at lr = s / sqrt(d r) is
    rescaled by s over the length it moved, and tried again until it moves by s within a factor 2 (at
    most CALIBRATION_TRIALS trials): one rescaling suffices where the step is proportional to lr, but a
    step that the retraction saturates (an SGD on gradients of scale 2^50 moves the frames by O(1)
    whatever its lr) shrinks by the factor s / O(1) per trial until it is proportional again."""
    d, r = W.shape[-2:]
    # the feasibility that decides s is that of these frames at this step: the start's own defect,
    # then the outputs of a trial step (an implementation that leaves St only for long steps, or only
    # in another property's runs, is not held to that here)
    start = float(np.max(gram_defect(W))) if np.size(W) else 0.0
    s = runner.step_size(d, r, phi=start)
    lr = s / math.sqrt(d * r)
    for _ in range(CALIBRATION_TRIALS):
        run = runner.run(W, G[None], replace(config, lr=lr), state, case)
        if np.any(run.ok):
            s = runner.step_size(d, r, phi=max(start, float(np.max(run.phi[run.ok]))))
        moved = frobenius(run.last - W)[run.ok]
        length = float(np.median(moved)) if moved.size else 0.0
        if not (length > 0 and math.isfinite(length)):
            return lr
        lr = lr * s / length
        if 0.5 * s <= length <= 2.0 * s:
            break
    return lr


def first_order_direction(runner: Runner, W, G, config, lr0: float, state=None, case: str = "") -> Direction:
    """The Richardson-extrapolated first-order direction of one step at lr0 (module docstring)."""
    d, r = W.shape[-2:]
    E, errors, ok = [], [], np.ones(W.shape[:-2], dtype=bool)
    for k in range(RICHARDSON_STEPS):
        h = 2.0**-k
        run = runner.run(W, G[None], replace(config, lr=lr0 * h), state, case)
        E.append((run.last - W) / h)
        errors.append(runner.output_error(run.phi, d, r) / h)
        ok &= run.ok
    D1, D2 = 2 * E[1] - E[0], 2 * E[2] - E[1]
    with np.errstate(invalid="ignore"):
        error = frobenius(D1 - D2) + 2 * errors[2] + errors[1]
    return Direction(np.where(ok[..., None, None], D2, np.nan), np.where(ok, error, np.inf), ok, lr0)


def sensitivity(runner: Runner, W0, gradients, config, base: Run, *, relative: bool, seed: int, key: tuple, state=None,
                case: str = "") -> np.ndarray:
    """Twice Hutchinson's estimate of ||J_t diag(G)||_F (relative) or ||J_t||_F (absolute) for the map
    from the gradients G_1..G_t to W_t, for every step t: shape (T, *lead); module docstring.

    The estimate is a derivative only where the run responds linearly: the first probe is repeated at
    2^-10 of the step, and a frame whose two responses (per unit of perturbation) differ by more than
    a factor LINEARITY is not differentiable at rounding scale (a step driven by rounding noise, as
    the scale-free step of a gradient normal up to rounding at eps = 0): it is left out (its bound is
    NaN, and `runner` counts it), never given a bound the measurement does not support. Responses are
    compared above the rounding of the two runs (2 output errors over the perturbation's size at the
    smaller step): a step that does not depend on G to rounding is linear, with derivative ~0."""
    gradients = np.asarray(gradients, dtype=np.float64)
    scale = np.sqrt(np.mean(gradients**2, axis=(0, -2, -1), keepdims=True)) if not relative else None
    total = np.zeros((len(gradients),) + base.ok.shape)
    linear = np.ones(base.ok.shape, dtype=bool)
    for probe in range(PROBES):
        signs = rng_for(seed, "sensitivity", *key, probe).choice([-1.0, 1.0], size=gradients.shape)
        direction = gradients * signs if relative else scale * signs
        response = _response(runner, W0, gradients, direction, FINITE_DIFFERENCE_STEP, config, base, state)
        if probe == 0:
            small_step = FINITE_DIFFERENCE_STEP * 2.0**-10
            smaller = _response(runner, W0, gradients, direction, small_step, config, base, state)
            # a response within the two runs' rounding (2 output errors over the step) is no response:
            # a derivative that is zero to rounding (a step that does not depend on G there) is linear
            floor = 2.0 * runner.output_error(base.phi, *np.shape(W0)[-2:])
            with np.errstate(invalid="ignore", divide="ignore"):
                ratio = np.maximum(smaller, floor / small_step) / np.maximum(response, floor / small_step)
            linear &= np.all((ratio <= LINEARITY) & (ratio >= 1.0 / LINEARITY), axis=0)
        total += response**2
    estimate = 2.0 * np.sqrt(total / PROBES)
    if not relative:
        estimate = estimate / np.squeeze(scale, axis=(0, -2, -1))
    usable = linear & np.all(np.isfinite(estimate), axis=0) & base.ok
    dropped = int(np.sum(base.ok & ~usable))
    if dropped:
        runner._exclude(f"{case}: sensitivity", "the run is not differentiable at rounding scale (its response to perturbations of "
                        "2^-20 and 2^-30 relative differs by more than a factor 4): no bound can be measured", dropped)
    return np.where(usable[None], estimate, np.nan)


ROUNDING_PROBE_ULPS = 4.0


def rounding_response(runner: Runner, W0, gradients, config, base: Run, *, seed: int, key: tuple, state=None) -> np.ndarray:
    """(T, *lead): how far the run moves when each gradient entry moves by about its own rounding, a
    relative 4 u (the implementation's u) with random signs: ||W_t(G (1 + 4 u z)) - W_t(G)||.

    comparison_bound models each run's rounding as a backward error of gamma_2d(u) in its gradient
    entries and the polar factor's rounding of its output. An implementation that rounds so is moved
    here by its sensitivity times the perturbation, far below the bound. One whose own rounding
    errors exceed the model shows them here instead: two runs whose inputs differ by a rounding part
    by the difference of their own errors (a gradient through torch's matrix_exp backward errs
    relatively by about u times the cotangent's norm, 6e-10 at a gradient of scale 2^20, where the
    model allows 1e-15). The probe runs on the untransformed run, in the regime of the comparison, so
    that it is fixed before the comparison and never grows with a transformed run's deviation."""
    gradients = np.asarray(gradients, dtype=np.float64)
    signs = rng_for(seed, "rounding", *key).choice([-1.0, 1.0], size=gradients.shape)
    moved = runner.run(W0, gradients * (1.0 + ROUNDING_PROBE_ULPS * runner.u * signs), config, state, case="rounding response")
    with np.errstate(invalid="ignore"):
        return frobenius(moved.frames[1:] - base.frames[1:])


def _response(runner, W0, gradients, direction, eta, config, base, state) -> np.ndarray:
    moved = runner.run(W0, gradients + eta * direction, config, state, case="finite differences")
    with np.errstate(invalid="ignore"):
        return frobenius(moved.frames[1:] - base.frames[1:]) / eta


def step_condition(run: Run, W0) -> np.ndarray:
    """(T, *lead): the condition of W + xi that each step of `run` retracted, as its length shows, at
    least OUTPUT_CONDITION: the polar retraction (the model of a returned frame's rounding) moves W by
    m = ||R_W(xi) - W||_F >= (2 (1 - cos theta))^(1/2) for the largest principal angle theta =
    arctan ||xi||_2, so cos theta >= 1 - m^2 / 2 and cond(W + xi) <= sqrt(1 + tan^2 theta) = 1 / cos
    theta <= 1 / (1 - m^2 / 2); a step of m <= 1 is within OUTPUT_CONDITION = 2, one of m >= sqrt(2)
    has no bounded condition (inf: an uncapped SGD on gradients of scale 2^100 retracts W + xi of
    condition about 2^100), and no rounding bound of it can be given. A step is never shorter than
    its predecessors' conditions make it: the condition of step t is the largest up to t."""
    frames = np.concatenate([np.asarray(W0, dtype=np.float64)[None], run.frames[1:]])
    with np.errstate(invalid="ignore", divide="ignore"):
        m = frobenius(np.diff(frames, axis=0))
        cosine = 1.0 - 0.5 * m**2
        condition = np.where(cosine > 0, 1.0 / cosine, np.inf)
    condition = np.where(np.isnan(condition), np.inf, np.maximum(condition, OUTPUT_CONDITION))
    return np.maximum.accumulate(condition, axis=0)


def comparison_bound(runner: Runner, S, gradients, d: int, r: int, phi, *, gradient_error=0.0, frame_error=0.0, condition=None,
                     rounding=0.0) -> np.ndarray:
    """Bound on ||W_t - W'_t|| for two runs of the same frames (module docstring), shape (T, *lead):

    S (T, *lead) the absolute sensitivity ||J_t||_F of W_t to the gradients G_1..G_t (`sensitivity`,
    relative=False); gradients (T, *lead, d, r) those of the run S was measured on; gradient_error
    (T, *lead) or a scalar: the norm by which the other run's gradients differ from them at each step,
    in the coordinates of that run (a transformation's rounding, measured back through it); each
    run's own rounding adds a backward error gamma_{2d}(u) ||G_t||; the differences of steps 1..t
    add in quadrature (they are entries of one perturbation of (G_1, ..., G_t)). frame_error: an
    absolute difference of the frames, carried forward; phi (lead,) the feasibility of the
    untransformed run (the one S was measured on): each step's output error, of both runs, carried
    forward too, at OUTPUT_CONDITION or, where condition (step_condition of the untransformed run) is
    given, at the condition each step's length shows (NaN, no bound, past the model's reach);
    rounding (T, *lead): rounding_response of the untransformed run, twice, for an implementation whose
    own rounding exceeds the model.

    The bound is fixed before the comparison: it is made of the inputs' rounding, the untransformed
    run's measurements (S, phi) and the declared precision (u), never of a quantity of the other run.
    Where the property holds, the other run's frames are the untransformed run's (moved by the
    transformation, which keeps ||W^T W - I||), so its feasibility is phi up to its rounding, which
    output_error's E_polar carries. Where it does not hold, the other run's distance from St grows
    with the very deviation being bounded (a fixed-count iterative retraction started from a point
    that scales with the gradient leaves St by an amount that grows with c): a bound that took the
    larger of the two runs' phi would grow with the error and read "holds"."""
    T = S.shape[0]
    steps = np.arange(1, T + 1).reshape((T,) + (1,) * (S.ndim - 1))
    per_step = np.broadcast_to(gradient_error, S.shape) + 2.0 * gamma(2 * d, runner.u) * frobenius(gradients)
    # a nondeterministic implementation's two runs differ by up to its measured noise with identical
    # inputs; twice that, as a measurement of a few repeats sees less than the worst
    if condition is None:
        carried = 2.0 * steps * runner.output_error(phi, d, r)
    else:  # each step's output error at the condition its length shows (step_condition)
        with np.errstate(invalid="ignore"):
            carried = 2.0 * np.cumsum(runner.output_error(phi, d, r, np.where(np.isfinite(condition), condition, OUTPUT_CONDITION)), axis=0)
        carried = np.where(np.isfinite(condition), carried, np.nan)  # no bound beyond the model
    # rounding: the untransformed run's measured response to a rounding of its inputs (rounding_response),
    # twice, as for the noise: where the implementation rounds beyond the model, its own errors
    return S * np.sqrt(np.cumsum(per_step**2, axis=0)) + carried + frame_error + 2.0 * runner.noise + 2.0 * np.asarray(rounding)


def absolute_product_norm(A, B) -> np.ndarray:
    """|| |A| |B| ||_F per frame: with gamma_n, the bound on the rounding of the product A B (inner
    products of length n), entry by entry."""
    return frobenius(np.abs(A) @ np.abs(B))


def orthogonal(n: int, rng: np.random.Generator, count: int) -> np.ndarray:
    """count Haar-random matrices of O(n) (count, n, n), every second one with determinant -1 (O(n)
    has two components; a column sign flip keeps the Haar measure and changes the determinant)."""
    Q = polar_factor(rng.standard_normal((count, n, n)))
    dets = np.linalg.det(Q)
    want = np.where(np.arange(count) % 2 == 0, 1.0, -1.0)
    Q[..., :, 0] *= np.where(np.sign(dets) == want, 1.0, -1.0)[:, None]
    return Q


def signed_permutation(n: int, rng: np.random.Generator, count: int) -> np.ndarray:
    """count random signed permutation matrices (count, n, n): exact in every dtype."""
    P = np.zeros((count, n, n))
    for index in range(count):
        P[index, np.arange(n), rng.permutation(n)] = rng.choice([-1.0, 1.0], size=n)
    return P


__all__ = ["Direction", "PerFrameStates", "Run", "Runner", "calibrated_lr", "comparison_bound", "first_order_direction",
           "absolute_product_norm", "frobenius", "gamma", "gram_defect", "orthogonal", "sensitivity", "signed_permutation"]
