"""One module per claim of the paper (docs/claims.md), each exposing a `CLAIM` registry entry.

A claim is one file: any module of this package whose name does not start with an underscore and
that defines `CLAIM` (a `Claim`) is discovered, listed by `certify list`, run by `certify all` and
accepted by the certificate schema. Modules without `CLAIM` (shared helpers) are skipped; the shared
kit lives in the subpackage `kit`.

Order: the paper's propositions P1, P2, ... by number, then the other claims by id.
"""

from __future__ import annotations

import functools
import importlib
import pkgutil
import re

from ._common import ClaimResult, Profile, PROFILES, get_profile
from .kit.protocol import Claim


class UnknownClaim(ValueError):
    """An id that names no claim."""


def _order(claim_id: str):
    numbered = re.fullmatch(r"P(\d+)", claim_id)
    return (0, int(numbered.group(1)), "") if numbered else (1, 0, claim_id)


@functools.cache
def discover() -> tuple[dict[str, str], dict[str, str]]:
    """(id -> module name in run order, module name -> import error for modules that failed).

    Imports every public module of the package once per process (a claim module keeps optional
    dependencies such as torch behind its run(), so importing it is cheap and always works).
    """
    found: dict[str, str] = {}
    broken: dict[str, str] = {}
    for info in pkgutil.iter_modules(__path__):
        if info.name.startswith("_") or info.ispkg:
            continue
        name = f"{__name__}.{info.name}"
        try:
            module = importlib.import_module(name)
        except Exception as error:
            broken[name] = f"{type(error).__name__}: {error}"
            continue
        claim = getattr(module, "CLAIM", None)
        if isinstance(claim, Claim):
            if claim.id in found:
                raise RuntimeError(f"claim id {claim.id!r} is defined twice: {found[claim.id]} and {name}")
            found[claim.id] = name
    ordered = {claim_id: found[claim_id] for claim_id in sorted(found, key=_order)}
    return ordered, broken


def claim_ids() -> tuple[str, ...]:
    """Every discovered claim id, in run order."""
    return tuple(discover()[0])


def normalise_id(text: str) -> str:
    """The registered spelling of a claim id, matched without regard to case ('p3' -> 'P3')."""
    by_lower = {claim_id.lower(): claim_id for claim_id in claim_ids()}
    try:
        return by_lower[str(text).lower()]
    except KeyError:
        raise UnknownClaim(f"unknown claim id {text!r}; known: {', '.join(claim_ids())}") from None


def get_claim(claim_id: str) -> Claim:
    """The registry entry of claim_id (any case); UnknownClaim (a ValueError) for an unknown id."""
    return importlib.import_module(discover()[0][normalise_id(claim_id)]).CLAIM


def trajectory_plans() -> dict:
    """{claim id: its TrajectoryPlan} for the claims that hold their optimizer's trajectories to
    the model (a module-level `TRAJECTORIES`, propositions.kit.trajectories), in run order."""
    plans = {}
    for claim_id, module_name in discover()[0].items():
        plan = getattr(importlib.import_module(module_name), "TRAJECTORIES", None)
        if plan is not None:
            plans[claim_id] = plan
    return plans


def __getattr__(name: str):
    # CLAIM_IDS is computed on first use: discovery imports the claim modules
    if name == "CLAIM_IDS":
        return claim_ids()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = ["Claim", "ClaimResult", "Profile", "PROFILES", "get_profile", "get_claim", "claim_ids", "normalise_id", "discover", "trajectory_plans", "UnknownClaim"]
