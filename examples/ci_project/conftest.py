# Hypothesis profiles: derandomized in CI (the CI variable is set there), longer and random locally.
import os

from hypothesis import settings

settings.register_profile("ci", derandomize=True, max_examples=50, database=None, print_blob=True)
settings.register_profile("dev", max_examples=200)
settings.load_profile("ci" if os.environ.get("CI") else "dev")
