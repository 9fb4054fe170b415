"""`certify regression CERT.json... -o FILE.py`: a pytest file that replays each recorded minimal
counterexample (certify.ci.counterexample) against the implementation the certificate ran.

The file is self-contained: the inputs of every counterexample (W_0, the warm state, the gradients,
the hyper-parameters) are written into it as numbers (float repr, so they are read back bit for bit)
and it needs only this package installed. Each test replays its inputs through the same check
(the implementation against the model, step by step, with the one-step bound of
propositions/kit/trajectories.py) and fails while some step exceeds its bound: it fails while the
mistake is there and passes once it is fixed, and on the reference. The environment variable
CERTIFY_REGRESSION_IMPLEMENTATION names another implementation spec to replay the same inputs on.
"""

from __future__ import annotations

import pprint
from pathlib import Path

import numpy as np

ENVIRONMENT_VARIABLE = "CERTIFY_REGRESSION_IMPLEMENTATION"

TEMPLATE = '''"""Regression tests written by `certify regression` from {sources}.

Each test replays one minimal counterexample against {spec!r} (or the implementation named by
${variable}): the implementation and the model of docs/algorithm.md are fed the same inputs
step by step, and every step must stay within its one-step bound.
"""

import os

import pytest

from certify.ci.regression import replay_recorded

IMPLEMENTATION = os.environ.get({variable!r}, {spec!r})

COUNTEREXAMPLES = {cases}


@pytest.mark.parametrize("counterexample", COUNTEREXAMPLES, ids=[c["id"] for c in COUNTEREXAMPLES])
def test_counterexample(counterexample):
    outcome = replay_recorded(IMPLEMENTATION, counterexample)
    if outcome.fails:
        pytest.fail(f"{{counterexample['summary']}}\\nreplayed on {{IMPLEMENTATION}}: step {{outcome.step}}, "
                    f"{{outcome.error or f'residual {{outcome.residual:.3g}} > bound {{outcome.bound:.3g}}'}}", pytrace=False)
    assert outcome.residual <= outcome.bound
'''


class RegressionError(ValueError):
    """A certificate without a counterexample to replay: reported on one line."""


def _float(value) -> float:
    return float(value)  # a certificate writes a non-finite float as the string "inf"


def cases_of(certificate: dict, source: str) -> list[dict]:
    """The replayable counterexample of one certificate (zero or one), as written into the file."""
    from certify.ci.counterexample import counterexamples_of

    return [{"id": f"{certificate['id']}-{found['replayed_check']}-{source}", "claim": certificate["id"], "summary": found["summary"],
             "implementation": certificate["provenance"]["optimizer"], **found["replay"]}
            for found in counterexamples_of(certificate) if found.get("found")]


def _why_none(path: str, certificate: dict) -> str:
    """Why a certificate records no counterexample to replay, in a clause."""
    from certify.ci.counterexample import counterexamples_of

    if certificate.get("verdict") != "pass" and not _outside(certificate):
        return f"{path} (a certificate of the reference or one of its variants: only an outside implementation's records one)"
    if certificate.get("verdict") == "pass":
        return f"{path} (it passes)"
    recorded = [found for found in counterexamples_of(certificate)]
    if recorded:
        return f"{path} (its search found none: {recorded[0].get('reason', 'no smaller case fails')})"
    failing = [c["name"] for c in certificate.get("numerical", {}).get("checks", []) if not c.get("passed", True)]
    return (f"{path} (it fails {', '.join(failing[:3]) or 'no check'}, not a trajectory check of the implementation against "
            "the model, the only checks a counterexample is searched for)")


def _outside(certificate: dict) -> bool:
    from certify import claims

    return claims.is_adapter_spec(certificate.get("provenance", {}).get("optimizer", ""))


def render(certificates: list[tuple[str, dict]]) -> str:
    """The text of the pytest file for (path, certificate) pairs of one implementation."""
    cases, specs = [], []
    for path, certificate in certificates:
        cases += cases_of(certificate, Path(path).stem)
        specs.append(certificate["provenance"]["optimizer"])
    if not cases:
        raise RegressionError("no minimal counterexample in " + "; ".join(_why_none(p, c) for p, c in certificates))
    if len(set(specs)) > 1:
        raise RegressionError(f"the certificates ran different implementations ({', '.join(sorted(set(specs)))}): one file per implementation")
    return TEMPLATE.format(sources=", ".join(Path(p).name for p, _ in certificates), spec=specs[0], variable=ENVIRONMENT_VARIABLE,
                           cases=pprint.pformat(cases, width=120, sort_dicts=False))


def replay_recorded(spec: str, recorded: dict):
    """Replay a written counterexample on the implementation `spec` (certify.ci.counterexample.Outcome)."""
    import reference_impl as ri
    from certify.outside import adapters
    from certify.ci.counterexample import replay_inputs

    if recorded.get("quantity") == "scenario":  # a shrunk run of the optimizer class (propositions/optimizer_class.py)
        from propositions.optimizer_class import replay

        return replay(recorded)
    variant = adapters.resolve(spec)
    config = recorded["config"]
    config = ri.StiefelAdamConfig(lr=_float(config["lr"]), betas=tuple(config["betas"]), eps=_float(config["eps"]),
                                  trust_radius=_float(config["trust_radius"]), weight_decay=_float(config["weight_decay"]))
    W = np.asarray(recorded["W0"], dtype=np.float64)
    state = recorded.get("state0")
    warm = None if state is None else ri.StiefelAdamState(m=np.asarray(state["m"], dtype=np.float64), v=np.asarray(state["v"], dtype=np.float64), t=int(state["t"]))
    gradients = [np.asarray(G, dtype=np.float64) for G in recorded["gradients"]]
    from propositions.kit import observability

    quantity = recorded["quantity"] if observability.state_observable(variant) else "W"
    if warm is not None and not observability.state_observable(variant):
        raise RegressionError(f"{spec}: this counterexample starts from a warm state, which a black box cannot take")
    return replay_inputs(variant, quantity, W, warm, gradients, config, len(gradients))


def write(paths: list[str], out: Path) -> int:
    """Write the file; returns the number of counterexamples in it."""
    from certify import certificate as certificate_format

    certificates = [(p, certificate_format.load(Path(p))) for p in paths]
    out.write_text(render(certificates), encoding="utf-8")
    return sum(len(cases_of(c, Path(p).stem)) for p, c in certificates)


__all__ = ["ENVIRONMENT_VARIABLE", "RegressionError", "render", "replay_recorded", "write"]
