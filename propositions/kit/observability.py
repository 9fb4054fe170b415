"""What a claim can see of the optimizer under test, and the record of what it could not.

The claims were written for optimizers behind the interface of reference_impl.step, whose state is a
StiefelAdamState (m, v, t) that the checker can read and build. An outside implementation (a
reviewer's NumPy step, a torch.optim.Optimizer driven through parameters and gradients,
certify.outside.adapters) may keep its state to itself. Three levels of access, and what each allows:

  trajectories  W_t from W_0 and G_1, G_2, ...: always available (P2, P4, P5, feasibility);
  direction     the xi a step applied: from the step's hook, or recovered from W_new by the inverse
                polar retraction (propositions.kit.directions): always available (P1, P3);
  state         m, v, t after each step, and steps from a state the checker builds (warm starts, a
                flipped moment): only where the state is a readable StiefelAdamState.

A black box's state is an `OpaqueState`: passing it back to the same implementation works, reading
its m, v or t raises `StateNotObservable`. A claim that meets it records the checks it could not run
(`record`) instead of passing or failing them; certify puts the record in the certificate
(extra.not_observable) and drops those checks, which hold no sample, from the verdict. A check that
reads the state without expecting a black box raises StateNotObservable out of the claim, and the
certificate is inconclusive with that reason: never a silent pass.
"""

from __future__ import annotations

import contextlib
import contextvars
from dataclasses import dataclass

from reference_impl import Variant, get_variant


class StateNotObservable(Exception):
    """A claim read m, v or t of an optimizer whose state is not observable.

    Deliberately not a ValueError: the claims treat a ValueError from a step as the step rejecting
    its input (a failure), and an unreadable state is neither a failure nor a pass.
    """


class OpaqueState:
    """The state of a black-box optimizer: handed back to it unchanged, unreadable to the checker.

    payload: whatever the adapter keeps (a torch state_dict snapshot, the implementation's own state
    object); lead: the leading axes of the frames it belongs to.
    """

    __slots__ = ("payload", "lead")

    def __init__(self, payload, lead=()):
        self.payload = payload
        self.lead = tuple(lead)

    def _unreadable(self, name):
        raise StateNotObservable(f"the optimizer's state is not observable (its {name} cannot be read)")

    @property
    def m(self):
        self._unreadable("first moment m")

    @property
    def v(self):
        self._unreadable("second moment v")

    @property
    def t(self):
        self._unreadable("step count t")

    def __repr__(self) -> str:
        return f"OpaqueState(lead={self.lead})"


@dataclass(frozen=True)
class AdaptedVariant(Variant):
    """A Variant built by an adapter (certify.outside.adapters) around an outside implementation.

    spec: the canonical text that rebuilds it (recorded in the certificate); state_observable:
    whether init/step return a readable StiefelAdamState; dtype: the storage dtype of its frames
    (float64, float32 or bfloat16: the claims' bounds take its unit roundoffs, kit/precision.py);
    compute_dtype: the dtype it computes in (None: float64 for float64, else float32); route: its
    declared retraction (kit/precision.ROUTES, "any" when not declared); declaration: the precision of
    each stage as its package declares it (torch_impl.functional.declared_precision), or None;
    ignored: hyper-parameters of
    StiefelAdamConfig the implementation does not take (e.g. trust_radius for an optimizer without a
    trust region).
    """

    spec: str = ""
    state_observable: bool = True
    dtype: str = "float64"
    compute_dtype: str | None = None
    route: str = "any"
    ignored: tuple[str, ...] = ()
    torch_factory: object = None  # a torch optimizer's builder (propositions.bookkeeping.TorchFactory)
    declaration: object = None  # its stage-by-stage precision, where its package declares one (kit/precision.Precision.declared)
    domain: tuple[str, ...] = ()  # cases its spec declares outside its domain (propositions.properties.DOMAIN_CASES)
    calling: str = "batched: frames of shape (..., d, r)"  # how the adapter passes frames (found by its trial)


def state_observable(optimizer) -> bool:
    """Whether the claims can read and build the state of `optimizer` (a name or a Variant)."""
    return bool(getattr(get_variant(optimizer), "state_observable", True))


_RECORD: contextvars.ContextVar[list | None] = contextvars.ContextVar("not_observable_record", default=None)


def record(check: str, reason: str) -> None:
    """Note that check `check` could not run on the optimizer under test, and why.

    Outside `recording()` the note has nowhere to go and the claim must not have skipped the check:
    StateNotObservable is raised so that the claim ends inconclusive rather than passing silently.
    """
    entries = _RECORD.get()
    if entries is None:
        raise StateNotObservable(f"check {check} is not observable ({reason}) and no record is being kept")
    entry = {"check": check, "reason": reason}
    if entry not in entries:
        entries.append(entry)


@contextlib.contextmanager
def recording():
    """Collect the `record` calls of one claim run: `with recording() as entries: claim.run(...)`."""
    entries: list[dict] = []
    token = _RECORD.set(entries)
    try:
        yield entries
    finally:
        _RECORD.reset(token)


__all__ = ["AdaptedVariant", "OpaqueState", "StateNotObservable", "record", "recording", "state_observable"]
