"""The claim registry: a claim is one file in the propositions package.

A toy claim P7, written as one module into a directory that the test appends to the package's
search path, is discovered, listed, run, accepted by the certificate schema and shown in the report,
with no other change anywhere.
"""

from __future__ import annotations

import textwrap

import pytest

import propositions
from certify import certificate as certificate_format
from certify import cli

TOY_CLAIM = textwrap.dedent(
    '''
    """P7 (toy): sym(A) is symmetric."""
    import numpy as np

    from propositions._common import NumericalCheck, rng_for
    from propositions.kit.protocol import Claim, Control, Evidence, Part, Symbolic
    from reference_impl import sym


    def symmetry(ctx, symmetrise=sym):
        rng = rng_for(ctx.seed, "P7", "sym")
        A = rng.standard_normal((ctx.profile.frames, 3, 3))
        check = NumericalCheck("symmetric", "||S - S^T||_max for S = sym(A)", "exact: the two sums are the same sums")
        S = symmetrise(A)
        check.add(np.abs(S - np.swapaxes(S, -1, -2)).max(axis=(-2, -1)), 1e-300, shape=(3, 3), key=("P7", "sym"), seed=ctx.seed)
        return Evidence(checks=[check], frames=ctx.profile.frames)


    def no_sym(ctx):
        return symmetry(ctx, symmetrise=lambda A: A)


    CLAIM = Claim(
        "P7", "toy: sym is symmetric", "sym(A) = sym(A)^T", r"\\mathrm{sym}(A) = \\mathrm{sym}(A)^T",
        symbolic=Symbolic("none: a toy"),
        parts=(Part("symmetry", symmetry),),
        controls=(Control("no_sym", no_sym, "A itself in place of sym(A)"),),
    )
    '''
)


@pytest.fixture
def toy_claim(tmp_path, monkeypatch):
    package = tmp_path / "extra"
    package.mkdir()
    (package / "p7_toy.py").write_text(TOY_CLAIM)
    monkeypatch.setattr(propositions, "__path__", [*propositions.__path__, str(package)])
    propositions.discover.cache_clear()
    yield
    propositions.discover.cache_clear()


def test_a_claim_is_one_file(toy_claim, tmp_path, capsys):
    assert "P7" in propositions.claim_ids()
    assert propositions.claim_ids().index("P7") == propositions.claim_ids().index("P6") + 1
    assert propositions.normalise_id("p7") == "P7"

    assert cli.main(["list"]) == 0
    assert "toy: sym is symmetric" in capsys.readouterr().out

    out = tmp_path / "out"
    assert cli.main(["run", "P7", "--profile", "quick", "--out", str(out)]) == 0
    certificate = certificate_format.load(out / "P7.json")  # validated against the schema
    assert certificate["id"] == "P7" and certificate["verdict"] == "pass"
    assert certificate["controls"][0]["detected"]
    assert "P7" in (out / "REPORT.md").read_text()


def test_unknown_claim_lists_the_discovered_ids(capsys):
    assert cli.main(["run", "P9"]) == 2
    err = capsys.readouterr().err
    assert "unknown claim id 'P9'" in err and "P1" in err and "P6" in err


def test_every_module_of_the_package_imports():
    """A claim module that fails to import is listed by `certify list`, never silently dropped;
    in the project itself there is none."""
    propositions.discover.cache_clear()
    claims, broken = propositions.discover()
    assert broken == {}
    assert {"P1", "P2", "P3", "P4", "P5", "P6", "crosscheck", "samplers"} <= set(claims)


def test_profiles_size_the_controls():
    """Profile.control_frames is the one control sample size of every claim: positive, far below the
    claim's own frames, growing with the profile."""
    from propositions._common import PROFILES

    sizes = [PROFILES[name].control_frames for name in ("quick", "default", "thorough")]
    assert all(0 < size < PROFILES[name].frames // 2 for size, name in zip(sizes, ("quick", "default", "thorough")))
    assert sizes == sorted(sizes) and sizes[0] < sizes[-1]
