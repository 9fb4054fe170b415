"""The hypothesis strategies of certify.ci.strategies under the name users import them by
(`from certify import strategies as cs`, docs/ci.md)."""

from certify.ci.strategies import *  # noqa: F401,F403
from certify.ci.strategies import __all__  # noqa: F401
