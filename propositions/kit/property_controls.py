"""Broken optimizers that the property verdicts (propositions/properties.py) must tell apart: each
one a bug that a property check once let through, kept here as a control of that check, so that a
later change that blunts the check (a bound that grows with the error it bounds, one learning rate
only, a bit-for-bit vacuity probe) makes the control escape and the property untested.

  cayley_fixed_iterations  StiefelAdam's moments and direction retracted by a Cayley transform
      computed with three fixed-point iterations Y <- W + (A/2)(W + Y), A = P W^T - W P^T with
      P = xi - W (W^T xi) / 2 (so that A W = xi), started from W + m, its raw first moment: a point
      that moves with the gradient's scale, as an iterative Cayley Adam's does. The iteration's error
      is (||A|| / 2)^3 ||m||, about 1e-12 at unit gradients and 1e-6 at c = 2^20, so its runs under
      c G part and leave St by as much. P2 must fail; a bound that took the scaled run's own
      feasibility grew with that error and read "holds".
  one_norm_cap             StiefelAdam without its trust region, its step capped so that the entrywise
      1-norm sum |xi_ij| is at most 10 (as one Cayley Adam code caps it): a norm that neither side's
      rotations keep, binding at lr 1 and not at lr 0.05. P4 left and right must fail; probed at one
      learning rate they read "holds".
  hidden_branch_without_decay  StiefelAdam that drops weight_decay and re-orthonormalises its output by
      the sign-fixed QR on every second call (a counter the caller cannot see, standing for an
      unseeded random branch): its runs of identical inputs differ in the last bits. P5 must read
      vacuous; a bit-for-bit vacuity probe read the branch as weight_decay reaching the step.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np

import reference_impl as ri
from reference_impl.adam import moments_and_direction
from reference_impl.manifold import polar_factor, project_tangent


def _transpose(A):
    return np.swapaxes(A, -1, -2)


def cayley_fixed_iterations_step(W, G, state, config):
    g = project_tangent(W, G + config.weight_decay * W, validate=False)
    m, v, t, xi = moments_and_direction(g, state, config)
    P = xi - 0.5 * W @ (_transpose(W) @ xi)
    A = P @ _transpose(W) - W @ _transpose(P)
    Y = W + m
    for _ in range(3):
        Y = W + 0.5 * A @ (W + Y)
    return Y, ri.StiefelAdamState(m=project_tangent(Y, m, validate=False), v=v, t=t)


def one_norm_cap_step(W, G, state, config):
    g = project_tangent(W, G + config.weight_decay * W, validate=False)
    m, v, t, xi = moments_and_direction(g, state, replace(config, trust_radius=float("inf")))
    one_norm = np.sum(np.abs(xi), axis=(-2, -1))
    xi = xi * np.minimum(1.0, 10.0 / np.where(one_norm > 0, one_norm, 1.0))[..., None, None]
    W_new = polar_factor(W + xi)
    return W_new, ri.StiefelAdamState(m=project_tangent(W_new, m, validate=False), v=v, t=t)


def sign_fixed_qr(A):
    """The Q of A = Q R with diag(R) >= 0 (a zero diagonal entry counts as positive)."""
    Q, R = np.linalg.qr(A)
    signs = np.where(np.diagonal(R, axis1=-2, axis2=-1) < 0, -1.0, 1.0)
    return Q * signs[..., None, :]


class HiddenBranch:
    """StiefelAdam without weight_decay whose every `every`-th call takes the QR branch; a fresh
    instance starts its count at 0, so that a control is the same in every run of the command."""

    def __init__(self, every: int = 5):
        self.every, self.calls = every, 0

    def step(self, W, G, state, config):
        W_new, state_new = ri.step(W, G, state, replace(config, weight_decay=0.0))
        self.calls += 1
        if self.calls % self.every == 0:
            W_new = sign_fixed_qr(W_new)
        return W_new, state_new


def cayley_fixed_iterations() -> ri.Variant:
    return ri.Variant("cayley_fixed_iterations", "a Cayley Adam by three fixed-point iterations from W + m (P2's bound control)",
                      ("P2",), ri.init, cayley_fixed_iterations_step)


def one_norm_cap() -> ri.Variant:
    return ri.Variant("one_norm_cap", "StiefelAdam capped in the entrywise 1-norm instead of its trust region (P4's regime control)",
                      ("P4-left", "P4-right"), ri.init, one_norm_cap_step)


def hidden_branch_without_decay() -> ri.Variant:
    return ri.Variant("hidden_branch_without_decay", "StiefelAdam without weight_decay and a hidden QR branch (P5's noise control)",
                      ("P5",), ri.init, HiddenBranch(every=2).step)


# name -> a function making a fresh variant (a control with a count of its own starts it anew)
PROPERTY_CONTROLS = {
    "cayley_fixed_iterations": cayley_fixed_iterations,
    "one_norm_cap": one_norm_cap,
    "hidden_branch_without_decay": hidden_branch_without_decay,
}

__all__ = ["PROPERTY_CONTROLS", "HiddenBranch", "cayley_fixed_iterations_step", "one_norm_cap_step", "sign_fixed_qr"]
