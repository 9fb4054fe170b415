"""Small sympy helpers shared by the claim modules' symbolic parts.

MatrixSymbol algebra has no notion of "W^T W = I"; a derivation states such facts as a dict of
substitutions, and `reduce_with` expands and substitutes until the expression stops changing,
then simplifies. The test that a step "reduced to the identity" (the difference of its two sides
is the zero matrix or the scalar 0) is propositions.kit.symbolic.is_zero, the one zero test of
every derivation.

These helpers derive the formulas as written (for every d and r); no change to reference_impl can
touch them. propositions.kit.symbolic runs the code itself on exact symbolic entries, and the
claims add its steps to their derivations, so that a change to the code fails the symbolic part.
"""

from __future__ import annotations

import dataclasses

import sympy as sp

from ._common import SymbolicResult, SymbolicStep

# Each substitution pass removes at least one occurrence of a left-hand side; the derivations here
# nest at most a few products, so six passes are far more than a fixed point needs.
MAX_SUBSTITUTION_PASSES = 6


def reduce_with(expr, substitutions: dict):
    """Expand, apply the substitutions until nothing changes, simplify."""
    expr = sp.expand(expr)
    for _ in range(MAX_SUBSTITUTION_PASSES):
        new = sp.expand(expr.subs(substitutions))
        if new == expr:
            break
        expr = new
    return sp.simplify(expr)


def copied(method: str, steps) -> SymbolicResult:
    """A fresh SymbolicResult holding copies of steps (a cached, seed-independent derivation)."""
    return SymbolicResult(method, [dataclasses.replace(step) for step in steps])


__all__ = ["reduce_with", "copied", "SymbolicStep"]
