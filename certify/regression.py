"""certify.ci.regression under the name that pytest files written by `certify regression` before it
moved import (`from certify.regression import replay_recorded`): they keep running."""

from certify.ci.regression import *  # noqa: F401,F403
from certify.ci.regression import __all__, replay_recorded  # noqa: F401
