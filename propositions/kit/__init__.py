"""The shared kit of the claims: what more than one proposition module needs, in one place.

Each module here holds one kind of thing (the claim protocol, sampling, error bounds, trajectories,
symbolic execution, figures). A claim module imports from the kit and from reference_impl, never
from another claim module.
"""
