"""The names every claim module shares, gathered in one place for the claims (and certify, tests).

They live in the kit floor, propositions/kit/common.py (the certificate's bookkeeping: checks,
results, profiles, seeds, verdicts); this module only re-exports them, so that a claim writes
`from ._common import NumericalCheck, rng_for` and the kit never imports upward.
"""

from .kit.common import *  # noqa: F401,F403
from .kit.common import __all__  # noqa: F401
