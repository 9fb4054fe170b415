"""Run, record, verify and report the certificates of the Stiefel Adam certification suite.

`certify` is the last stage of the project (reference_impl -> propositions -> certify): it runs a
claim's `Claim.run(seed, profile, optimizer)`, wraps the `ClaimResult` into a certificate (one JSON
file per claim, validated against `certificate.schema.json` and sealed by a sha256 digest), writes
the human-readable `REPORT.md` with its figures, and re-checks certificates (`certify verify`).

Modules: `cli` (the console script: parsing and dispatch), `commands` (list, cite, compare,
properties, regression, mutate), `run` (running claims and re-running
certificates: progress, recording, summary), `render` (what the command prints), `execution`
(where tasks run: this process, a pool, a dask cluster), `claims` (which claims exist and how one is run),
`certificate` (format, digest, schema validation, citation), `environment` (software and hardware record),
`report` (REPORT.md and figures), `adapters` and `probes` (outside implementations),
`counterexample` and `stages` (the minimal counterexample of a failing outside implementation and
the stage of docs/algorithm.md it gets wrong), `regression` (pytest files replaying them),
`pytest_plugin` (the pytest11 plugin: `certify_claim`, `@pytest.mark.certify`) and `strategies`
(public hypothesis strategies); docs/ci.md.
"""

# 1.1: statement.docs and environment.rounding_fingerprint (docs/certificates.md)
# 1.2: the run record (command, created_utc, timing, workers, scheduler, host) moves from
#      provenance to `run`, which the digest does not cover: the same evidence, the same digest
# 1.3: git_tree_clean moves from provenance to `run` (read once before anything is written), and
#      numerical.precision states the dtypes of each part (numerical.dtype: the ones under test)
# 1.4: the optional `property` member of a property certificate (certify/outside/property_certificate.py):
#      a claim's property asked of an implementation, sealed and verified as the claims' certificates
SCHEMA_VERSION = "1.4"
READABLE_SCHEMA_VERSIONS = ("1.1", "1.2", "1.3", "1.4")  # `certify verify` and `cite` read all four

# The seed used when none is given on the command line: every default certificate is drawn from it.
DEFAULT_SEED = 0
DEFAULT_PROFILE = "default"
# The optimizer a claim runs against when none is named (reference_impl's StiefelAdam), and the id of
# the torch cross-check, whose reproduce command is `certify crosscheck` (certificate.reproduce_command)
DEFAULT_OPTIMIZER = "stiefel_adam"
CROSSCHECK_ID = "crosscheck"



class UsageError(ValueError):
    """Bad command-line input or an unusable file: reported on one line, exit code 2."""


__all__ = ["UsageError", "SCHEMA_VERSION", "READABLE_SCHEMA_VERSIONS", "DEFAULT_SEED", "DEFAULT_PROFILE", "DEFAULT_OPTIMIZER", "CROSSCHECK_ID"]
