"""A property verdict as a certificate (docs/certificates.md#property-certificates).

`certify compare --properties` and `certify run ID --properties` ask each claim's property of an
implementation as a black box (propositions/properties.py). Each verdict is written as a certificate
of the claims' schema family (schema 1.4), sealed by the same digest, read by the same `load`, cited by
`cite` and re-run by `verify`:

  id          the property: P1, P2, P3, P4-left, P4-right, P4-signed, P5
  title       "<property> (claim <claim>) of <implementation>: <what it states>"
  property    {id, claim, implementation, verdict, reason, check, margin}: the verdict of the property
              itself, holds / fails / vacuous / untested, beside the certificate's verdict
  verdict     pass where the property holds, fail where it fails or a control of its check escaped,
              inconclusive where it is vacuous or untested (the reason first in `inconclusive`)
  numerical   the property's checks (residual, bound and margin at the worst comparison, samples,
              unresolved comparisons), the seed and profile, the precision of the implementation
  controls    the controls of its check that must fail (a broken step, by at least the detection
              factor); a control that must read vacuous or holds is an exact check (`exact`)
  extra       the coverage of the profile's regimes, the measured figures, and what was found of the
              implementation: domain, determinism, feasibility, whether its step is StiefelAdam's
              (a separate statement, never the property's verdict)
  provenance  reproduce: `certify run <property> --properties --seed S --profile P [--optimizer SPEC]`

Nothing here asks whether the implementation is StiefelAdam's step: an equivariant SGD's P4-left
certificate reads pass (the property holds), and the first-step probes that tell it is not StiefelAdam
are recorded beside it, in extra.implementation.stiefel_adam_step.
"""

from __future__ import annotations

import platform
import time

from certify import SCHEMA_VERSION
from certify import certificate as certificate_format
from certify.certificate import property_contradictions
from certify.certificate import property_reproduce_command as reproduce_command
from certify import environment as environment_record
from propositions import properties
from propositions._common import DETECTION_FACTOR, to_jsonable
from propositions.kit import precision as precisions
from propositions.kit.common import decide_verdict

DOCS = "docs/adapters.md#property-verdicts"
# the certificate's verdict for each property verdict (a missed control makes it fail, whatever the property's)
VERDICTS = {"holds": "pass", "fails": "fail", "vacuous": "inconclusive", "untested": "inconclusive"}
BOUND_DERIVATIONS = {
    "first_step_direction": "twice the error of the Richardson-extrapolated first-order direction D (propositions/kit/blackbox.py, "
                            "first_order_direction): D = D* + e gives ||D - ||D|| n|| <= 2 ||e||",
    "scaled_trajectories": "the sensitivity bound (propositions/kit/blackbox.py, comparison_bound) of the untransformed run: its measured "
                           "Jacobian norm times the rounding that separates the inputs (0 for c = 2^k, u ||G|| otherwise), each run's "
                           "backward error gamma_2d(u) ||G_t||, and twice its output error per step at its own feasibility; fixed "
                           "before the scaled run is compared, never of a quantity of the scaled run",
    "span_first_step": "2 (e_x + sum |alpha_i| e_i): the errors of the four first-order directions, the fitted coefficients for the exact ones",
    "span_warm_step": "2 (e_x + sum |alpha_i| e_i): the errors of the four first-order directions from the warm state",
    "left_trajectories": "the sensitivity bound of the untransformed run with the rounding of Q G and Q W (gamma_d || |Q| |X| ||)",
    "right_trajectories": "the sensitivity bound of the untransformed run with the rounding of G R and W R (gamma_r || |X| |R| ||)",
    "signed_permutation_trajectories": "the sensitivity bound of the untransformed run (a signed permutation is exact: no input rounding)",
    "decay_trajectories": "the absolute sensitivity bound of the run without decay times the decay's remainder lambda ||W (W^T W - I)|| "
                          "and the rounding of G + lambda W (propositions/properties.py, decay_remainder)",
}
NO_SYMBOLIC = {"method": "none: a property of a black box is measured, not derived", "status": "not_applicable", "steps": []}


def title(property_id: str, spec: str) -> str:
    claim = property_id.split("-")[0]
    return f"{property_id} (claim {claim}) of {spec}: {properties.PROPERTY_TEXT[property_id]}"


def _check(summary: dict) -> dict:
    """A property check (Comparison.summary) in the certificate's check form."""
    samples = int(summary["samples"])
    ratio = summary.get("max_ratio", 0.0) if samples else 0.0
    check = {
        "name": summary["name"],
        "description": summary["description"],
        "bound_derivation": BOUND_DERIVATIONS.get(summary["name"], "propositions/properties.py"),
        "samples": samples,
        "residual": {"max": summary.get("max_residual", 0.0)},
        "bound": {"max": summary.get("bound", 0.0), "min": None},
        "max_ratio": ratio,
        "passed": bool(ratio <= 1.0),
        # the comparison of largest residual/bound, so that residual / bound = max_ratio on one row
        "worst_case": {"residual": summary["residual"], "bound": summary["bound"]} if samples else None,
        "unresolved": int(summary.get("unresolved", 0)),
    }
    if "worst_resolution" in summary:
        check["worst_resolution"] = summary["worst_resolution"]
    if "bit_identical" in summary:
        check["bit_identical"] = summary["bit_identical"]
    return check


def _controls(property_id: str, control_records: list) -> tuple[list, list]:
    """(controls, exact checks) of one property from properties.controls' records: a control that must
    fail is a control with its margin; one that must read vacuous or holds is an exact check."""
    controls, exact = [], []
    for record in control_records:
        if record["property"] != property_id:
            continue
        if record["expected"] == "fails":
            margin = record["margin"] if record["margin"] is not None else 0.0
            controls.append({"name": record["control"], "description": f"{property_id} on the control {record['control']}: must fail by the detection factor",
                             "check": record.get("check") or "", "residual": record.get("residual") if record.get("residual") is not None else "nan",
                             "bound": record.get("bound") if record.get("bound") is not None else "nan", "margin": margin,
                             "detection_factor": DETECTION_FACTOR, "detected": bool(margin >= DETECTION_FACTOR and record["verdict"] == "fails")})
        else:
            exact.append({"name": f"control {record['control']}", "samples": 1, "passed": bool(record["detected"]),
                          "description": f"{property_id} on the control {record['control']} must read {record['expected']}; read {record['verdict']}"
                                         + (f" ({record['reason']})" if record.get("reason") else "")})
    return controls, exact


def _environment(variant) -> dict:
    """The environment record; torch's version where the implementation is a torch optimizer."""
    uses_torch = getattr(variant, "torch_factory", None) is not None or str(getattr(variant, "spec", "")).startswith("torch:")
    return environment_record.environment(None, torch_device="cpu" if uses_torch else None)


def build(found: dict, implementation: dict, control_records: list, *, spec: str, variant, seed: int, profile: str, command: str,
          git: dict, wall_seconds: float) -> dict:
    """The sealed certificate of one property verdict `found` (properties.verdict's record, after the
    controls were applied) of the implementation `spec`; implementation: what was found of it
    (certify.outside.properties.ask, without its verdicts)."""
    property_id = found["property"]
    checks = [_check(summary) for summary in found["checks"]]
    controls, exact = _controls(property_id, control_records)
    inconclusive = [f"{found['verdict']}: {found['reason']}"] if found["verdict"] in ("vacuous", "untested") else []
    body = {"symbolic": NO_SYMBOLIC, "exact": exact, "numerical": {"checks": checks}, "controls": controls, "inconclusive": inconclusive}
    verdict, failures, inconclusive = decide_verdict(body)
    precision = precisions.of(variant)
    dtypes = list(dict.fromkeys((precision.storage, precision.compute)))
    worst = max((c for c in checks if c["samples"]), key=lambda c: c["max_ratio"], default=None)
    regimes = implementation.get("regimes", {})
    certificate = {
        "schema_version": SCHEMA_VERSION,
        "id": property_id,
        "title": title(property_id, spec),
        "statement": {"text": properties.PROPERTY_TEXT[property_id], "latex": "", "docs": DOCS},
        "verdict": verdict,
        "failures": failures,
        "inconclusive": inconclusive,
        "symbolic": NO_SYMBOLIC,
        "exact": exact,
        "numerical": {
            "frames": int(sum(c["samples"] + c["unresolved"] for c in checks)),
            "dtype": ", ".join(dtypes),
            "precision": [{"role": "under test", "part": f"the steps of {spec}", "dtypes": dtypes}],
            "seed": seed,
            "profile": profile,
            "samples": int(sum(c["samples"] for c in checks)),
            "shapes": regimes.get("shapes", []),
            "checks": checks,
            "worst_case": {"check": worst["name"], "ratio": worst["max_ratio"], "reproduce": reproduce_command(property_id, seed, profile, spec)} if worst else None,
        },
        "controls": controls,
        "extra": to_jsonable({"coverage": found.get("coverage", {}), "measured": found.get("measured", {}), "phi": found.get("phi"),
                              "implementation": implementation}),
        "figures": {},
        "notes": ["Whether the implementation is StiefelAdam's step is not this certificate's question: extra.implementation.stiefel_adam_step "
                  "records the first-step probes, separately."],
        "environment": _environment(variant),
        "provenance": {"project_version": environment_record.project_version(), "git_commit": git["commit"],
                       "reproduce": reproduce_command(property_id, seed, profile, spec), "seed": seed, "profile": profile, "optimizer": spec,
                       "options": {}},
        "run": {"command": command, "git_tree_clean": git["tree_clean"], "created_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                "wall_seconds": round(wall_seconds, 6), "frames_per_second": None, "workers": 1, "scheduler": None,
                "host": platform.node(), "claim_timings": {}},
        "property": {"id": property_id, "claim": property_id.split("-")[0], "implementation": spec, "verdict": found["verdict"],
                     "reason": found["reason"], "check": found["check"], "margin": found["margin"]},
    }
    sealed = certificate_format.seal(to_jsonable(certificate))
    certificate_format.validate(sealed)
    return sealed


__all__ = ["BOUND_DERIVATIONS", "DOCS", "VERDICTS", "build", "property_contradictions", "reproduce_command", "title"]
