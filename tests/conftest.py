"""Hypothesis profiles: "ci" (derandomized, fixed example count) when the CI variable is set,
"dev" (a longer randomized run) otherwise. Select another with HYPOTHESIS_PROFILE=name."""

import os

# Single-threaded BLAS, as the certify command uses (see certify/__init__.py): the suite batches
# small matrices, and a re-run's rounding should not depend on the core count.
for _variable in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_variable, "1")

from hypothesis import HealthCheck, settings

settings.register_profile(
    "ci",
    derandomize=True,
    max_examples=25,
    deadline=None,
    print_blob=True,
    database=None,
    suppress_health_check=[HealthCheck.too_slow],
)
settings.register_profile("dev", max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.register_profile("long", max_examples=1000, deadline=None, suppress_health_check=[HealthCheck.too_slow])

_default = "ci" if os.environ.get("CI") else "dev"
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", _default))
