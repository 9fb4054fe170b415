"""Hypothesis profiles: "ci" (derandomized, fixed example count) when the CI variable is set,
"dev" (a longer randomized run) otherwise. Select another with HYPOTHESIS_PROFILE=name."""

import os

# Single-threaded BLAS for the whole session, as the certify command runs (certify.execution
# limit_blas_threads): the suite batches small matrices, and rounding should not depend on the
# core count.
# threadpoolctl limits only the libraries already loaded: load numpy's and scipy's BLAS first.
import numpy  # noqa: E402,F401
import scipy.linalg  # noqa: E402,F401
from threadpoolctl import threadpool_limits

threadpool_limits(limits=1)

# One worker for `certify` commands run by the tests (certify.cli.default_workers): tests/test_cli.py
# injects fake claims into this process, which a worker process would not see. The parallel paths
# are exercised, with real claims, by tests/test_parallel.py.
os.environ.setdefault("CERTIFY_WORKERS", "1")

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


import pytest  # noqa: E402


@pytest.fixture
def one_torch_thread():
    """One intra-op torch thread for a test, restored after: small tensors, for which an OpenMP team
    on a loaded two-core machine costs milliseconds per operation."""
    torch = pytest.importorskip("torch")
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)
