"""One module per claim of the paper (SPEC.md section 3), each exposing a `CLAIM` registry entry.

`MODULES` maps an id (P1..P6, samplers) to the module of its `Claim`; modules are imported on first use so that `certify
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
    "samplers": "propositions.samplers",
}

CLAIM_IDS = tuple(MODULES)


def get_claim(claim_id: str) -> Claim:
    """The registry entry of claim_id (P1..P6, samplers; any case); ValueError for an unknown id."""
    key = {known.lower(): known for known in MODULES}.get(claim_id.lower())
    if key is None:
        raise ValueError(f"unknown claim id {claim_id!r}; known: {', '.join(MODULES)}")
    return importlib.import_module(MODULES[key]).CLAIM


__all__ = ["Claim", "ClaimResult", "Profile", "PROFILES", "get_profile", "get_claim", "CLAIM_IDS", "MODULES"]
