"""One module per claim of the paper (docs/claims.md), each exposing a `CLAIM` registry entry.

`CLAIMS` maps an id (P1..P6) to its `Claim`; modules are imported on first use so that `certify
list` stays fast.
"""

from __future__ import annotations

import importlib

from ._common import Claim, ClaimResult, Profile, PROFILES, get_profile

MODULES = {
    "P1": "propositions.p1_steepest_descent",
    "P2": "propositions.p2_scale_independence",
    "P3": "propositions.p3_conditioning",
    "P4": "propositions.p4_equivariance",
    "P5": "propositions.p5_weight_decay",
    "P6": "propositions.p6_gauge",
}

CLAIM_IDS = tuple(MODULES)


def get_claim(claim_id: str) -> Claim:
    """The registry entry of claim_id (P1..P6); ValueError for an unknown id."""
    key = claim_id.upper()
    if key not in MODULES:
        raise ValueError(f"unknown claim id {claim_id!r}; known: {', '.join(MODULES)}")
    return importlib.import_module(MODULES[key]).CLAIM


__all__ = ["Claim", "ClaimResult", "Profile", "PROFILES", "get_profile", "get_claim", "CLAIM_IDS", "MODULES"]
