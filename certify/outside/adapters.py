"""Adapters: put any optimizer of frames on St(d, r) behind the interface the claims run (docs/adapters.md).

The claims run an optimizer through `reference_impl.Variant`: `init(W) -> state` and
`step(W, G, state, config) -> (W_new, state_new)` on float64 arrays of shape (..., d, r), with the
hyper-parameters in a `StiefelAdamConfig`. An adapter builds such a Variant around outside code:

  numpy:MODULE:ATTRS[:FLAGS]   a NumPy step with the signature of reference_impl.step. ATTRS is
                               `init,step` (two callables of MODULE), `step` (init is then
                               reference_impl.init: m = 0, v = 0 per frame, t = 0) or one object with
                               `.init` and `.step` attributes (a module, a class instance).
                               FLAGS (comma separated): `per_frame` (the step takes one (d, r) frame;
                               the adapter loops over the leading axes), `batched` (it takes
                               (..., d, r); no trial), `black_box` (W only: its state is not read
                               even if it is a StiefelAdamState), and cases outside its domain that
                               the property verdicts do not try (DOMAIN_FLAGS: `no_eps_zero`,
                               `no_st11`, `no_st11_eps_zero`, `no_zero_gradient`). Without
                               per_frame/batched the adapter tries a batch of two frames once and
                               falls back to per frame when the step raises or returns the wrong shape.
  torch:MODULE:CLASS[:JSON]    a torch.optim.Optimizer driven only through a parameter, its gradient
                               and step(). JSON holds constructor keywords; four keys are the
                               adapter's own: "dtype" ("float64" default, "float32", "bfloat16"), "route" (the
                               retraction the claims' bounds assume: "any" default, "svd", "eigh", "gram"), "manifold"
                               ("module:Class", e.g. "geoopt:EuclideanStiefel": the parameter is then
                               a geoopt.ManifoldParameter on that manifold), "batched" (true: one
                               parameter of shape (..., d, r); false: one parameter per frame; not
                               given: batched, or per frame where a batched trial step raises),
                               "domain" (cases outside its domain, as DOMAIN_FLAGS names them) and
                               "state" (how its state maps to m, v, t, below). lr, betas,
                               eps, weight_decay and trust_radius come from the claim's config; those
                               the class does not take are recorded as ignored.

A torch optimizer may declare its state: "state": {"m": KEY, "v": KEY, "t": KEY, "m_tangent_at":
"previous" | "current"} names the keys of optimizer.state[p] that hold the first moment (shape of
W), the second moment (one scalar per frame) and the step count, and at which frame m is tangent
("previous": the frame before the step, as torch_impl keeps it, so the adapter transports it,
P_{W+}(m), as stage 8 does). The declaration is checked on the trial step (shapes, t = 1 after one
step from a fresh state, m tangent where declared); the optimizer is then no black box: the claims
read and build its state (warm starts write m, v, t into those keys) and run their moment checks.

and the named shortcuts of SHORTCUTS (reference_impl, torch_impl, torch_impl-float32,
torch_impl-bfloat16, geoopt-euclidean, geoopt-canonical, geoopt-sgd-euclidean, geoopt-sgd-canonical,
geotorch-adam, geotorch-sgd, and every name of reference_impl.VARIANTS: the real step
"stiefel_adam" and its controls).

Observability (propositions.kit.observability): a NumPy implementation whose init returns a
reference_impl.StiefelAdamState is run with its state read (m, v, t compared with the model, warm
starts built by the checker); any other implementation, and every torch optimizer (whose state layout
is its own: torch_impl keeps m untransported until the next step), is a black box: W only, and the
checks that need its state are recorded as not observable.

Errors: `AdapterError` (a ValueError) for unusable input: a module that does not import, a name
that is not there, a callable with the wrong signature, a trial step that cannot run; the command
line reports it in one line and exits 2. `ImplementationError` (a ValueError) for an implementation
that misbehaves while a claim runs: a frame that is not finite, has the wrong shape, or is off
St(d, r) beyond the tolerance at which the reference itself accepts an input; the claim's
certificate then fails with that line as its reason.
"""

from __future__ import annotations

import copy
import importlib
import inspect
import json
import os
import sys

import numpy as np

import reference_impl as ri
from propositions.kit import precision as precisions
from propositions.kit import step_analysis
from propositions.kit.observability import AdaptedVariant, OpaqueState, StateNotObservable
from reference_impl import StiefelAdamState, Variant
from reference_impl._validation import check_frame


class AdapterError(ValueError):
    """The implementation cannot be used at all (one line for the command line, exit 2)."""


class ImplementationError(ValueError):
    """The implementation misbehaved during a claim's run (its certificate fails with this line)."""


# torch_impl.StiefelAdam's state (torch_impl/optimizer.py): m before its transport, one count per frame
TORCH_IMPL_STATE = '{"m": "exp_avg", "v": "exp_avg_sq", "t": "step", "m_tangent_at": "previous"}'
SHORTCUTS: dict[str, tuple[str, str]] = {
    "reference_impl": ("numpy:reference_impl:init,step", "reference_impl.init / reference_impl.step through the NumPy adapter"),
    "torch_impl": ('torch:torch_impl:StiefelAdam:{"state": ' + TORCH_IMPL_STATE + '}', "torch_impl.StiefelAdam, float64 parameters"),
    "torch_impl-float32": ('torch:torch_impl:StiefelAdam:{"dtype": "float32", "route": "gram", "state": ' + TORCH_IMPL_STATE + '}',
                           "torch_impl.StiefelAdam, float32 parameters"),
    "torch_impl-bfloat16": ('torch:torch_impl:StiefelAdam:{"dtype": "bfloat16", "route": "gram", "state": ' + TORCH_IMPL_STATE + '}',
                            "torch_impl.StiefelAdam, bfloat16 parameters (computing in float32)"),
    "geoopt-euclidean": (
        'torch:geoopt.optim:RiemannianAdam:{"manifold": "geoopt:EuclideanStiefel"}',
        "geoopt RiemannianAdam on a ManifoldParameter of geoopt.EuclideanStiefel (float64)",
    ),
    "geoopt-canonical": (
        'torch:geoopt.optim:RiemannianAdam:{"manifold": "geoopt:CanonicalStiefel"}',
        "geoopt RiemannianAdam on a ManifoldParameter of geoopt.CanonicalStiefel (float64)",
    ),
    "geoopt-sgd-euclidean": (
        'torch:geoopt.optim:RiemannianSGD:{"manifold": "geoopt:EuclideanStiefel"}',
        "geoopt RiemannianSGD on a ManifoldParameter of geoopt.EuclideanStiefel (float64)",
    ),
    "geoopt-sgd-canonical": (
        'torch:geoopt.optim:RiemannianSGD:{"manifold": "geoopt:CanonicalStiefel"}',
        "geoopt RiemannianSGD on a ManifoldParameter of geoopt.CanonicalStiefel (float64)",
    ),
    # geotorch keeps the frame on St by a parametrisation, under a plain torch optimizer (certify/outside/geotorch_steps.py)
    "geotorch-adam": ("numpy:certify.outside.geotorch_steps:adam:per_frame,black_box",
                      "geotorch.orthogonal (matrix exponential) under torch.optim.Adam, the gradient through the parametrisation (float64)"),
    "geotorch-sgd": ("numpy:certify.outside.geotorch_steps:sgd:per_frame,black_box",
                     "geotorch.orthogonal (matrix exponential) under torch.optim.SGD, the gradient through the parametrisation (float64)"),
}

TORCH_DTYPES = ("float64", "float32", "bfloat16")
# the retraction an implementation may declare ("route"), as the claims' bounds take it
ROUTES = ("any", "svd", "eigh", "gram")
CONFIG_FIELDS = ("lr", "betas", "eps", "weight_decay", "trust_radius")
# flags that declare a case outside the step's domain (propositions.properties.DOMAIN_CASES): not tried
DOMAIN_FLAGS = {"no_eps_zero": "eps = 0", "no_st11": "St(1, 1)", "no_st11_eps_zero": "St(1, 1) at eps = 0", "no_zero_gradient": "G = 0 at eps = 0"}
NUMPY_FLAGS = ("per_frame", "batched", "black_box") + tuple(DOMAIN_FLAGS)


def known_names() -> list[str]:
    return list(SHORTCUTS) + [name for name in ri.VARIANTS]


def canonical_spec(text: str) -> str:
    """The spec a name or spec stands for: a VARIANTS name or a shortcut stays as it is; a spec
    without a kind prefix is taken as numpy:..."""
    text = str(text).strip()
    if text in ri.VARIANTS or text in SHORTCUTS or text.startswith(("numpy:", "torch:")):
        return text
    raise AdapterError(
        f"unknown optimizer variant {text!r}; known: {', '.join(known_names())}, or numpy:MODULE:CALLABLE, torch:MODULE:CLASS[:JSON]"
    )


def resolve(spec: str, *, checked: bool = True) -> Variant:
    """The Variant for a spec (see the module docstring); AdapterError when it cannot be used.

    checked=False: the step's frames come back as the implementation returned them (as float64),
    without the output checks that raise ImplementationError (finite, on St(d, r) within the
    reference's input tolerance): the property verdicts (certify/outside/properties.py) measure
    an implementation's feasibility and domain instead of refusing it."""
    spec = canonical_spec(spec)
    if spec in ri.VARIANTS:
        return ri.VARIANTS[spec]
    name = spec
    if spec in SHORTCUTS:
        spec = SHORTCUTS[spec][0]
    kind, _, rest = spec.partition(":")
    if kind == "numpy":
        return _numpy_variant(name, spec, rest, checked)
    return _torch_variant(name, spec, rest, checked)


def describe(variant) -> dict:
    """What the certificate records about the implementation under test."""
    return {
        "name": variant.name,
        "spec": getattr(variant, "spec", variant.name),
        "description": variant.description,
        "state_observable": bool(getattr(variant, "state_observable", True)),
        "direction": "the step's own (hook)" if variant.step_with_direction is not None else "recovered by the inverse polar retraction",
        "dtype": getattr(variant, "dtype", "float64"),
        "ignored_hyperparameters": list(getattr(variant, "ignored", ())),
        "calling": getattr(variant, "calling", "batched: frames of shape (..., d, r)"),
        "declared_outside_domain": list(getattr(variant, "domain", ())),
    }


# --------------------------------------------------------------------------------------------
# Loading
# --------------------------------------------------------------------------------------------


def _current_directory_importable() -> None:
    """A user's module in the current directory imports, as under `python -m` and pytest: the console
    script's sys.path starts at its own bin directory, not at the directory it was run from."""
    here = os.getcwd()
    if not any(os.path.abspath(entry or os.curdir) == here for entry in sys.path):
        sys.path.insert(0, here)


def _import(module_name: str, spec: str):
    if not module_name:
        raise AdapterError(f"{spec}: no module named (expected MODULE:CALLABLE)")
    _current_directory_importable()
    try:
        return importlib.import_module(module_name)
    except Exception as error:  # any import failure is the user's input, reported in one line
        message = str(error).strip().splitlines()[0] if str(error).strip() else ""
        extra = {"geoopt": "bench", "torch": "torch"}.get(module_name.split(".")[0])
        hint = f"; the '{extra}' extra: pip install -e '.[{extra}]' in this project's checkout" if extra and isinstance(error, ImportError) else ""
        raise AdapterError(f"{spec}: module {module_name!r} does not import ({type(error).__name__}: {message}){hint}") from None


def _attribute(module, name: str, spec: str):
    value = module
    for part in name.split("."):
        if not part or not hasattr(value, part):
            raise AdapterError(f"{spec}: {module.__name__} has no attribute {name!r}")
        value = getattr(value, part)
    return value


def _check_signature(function, expected: str, arity: int, spec: str) -> None:
    if not callable(function):
        raise AdapterError(f"{spec}: {expected.split('(')[0]} is not callable")
    try:
        inspect.signature(function).bind(*range(arity))
    except TypeError:
        raise AdapterError(f"{spec}: {getattr(function, '__name__', 'the callable')}{_signature_text(function)} does not take {expected}") from None
    except ValueError:  # no signature (a builtin): the trial step decides
        pass


def _signature_text(function) -> str:
    try:
        return str(inspect.signature(function))
    except (TypeError, ValueError):
        return "(...)"


def _trial_frames(lead=()):
    rng = np.random.Generator(np.random.PCG64(np.random.SeedSequence(20260901)))
    W = ri.random_point(5, 2, rng, lead)
    return W, rng.standard_normal(W.shape)


TRIAL_CONFIG = ri.StiefelAdamConfig(lr=0.05, trust_radius=0.5)


def _one_line(error: BaseException) -> str:
    message = str(error).strip().splitlines()[0] if str(error).strip() else ""
    return f"{type(error).__name__}: {message}" if message else type(error).__name__


# --------------------------------------------------------------------------------------------
# Output checks (shared)
# --------------------------------------------------------------------------------------------


def _output_tolerance(d: int, r: int, dtype: str) -> float:
    """The largest ||W^T W - I|| accepted for a frame the implementation returns.

    For float64 it is the reference's own input tolerance (reference_impl.manifold_tolerance,
    32 (d r + 2 sqrt(r)) u): a frame beyond it could not be the next step's input of the reference.
    For float32 or bfloat16 storage it is the same formula at the storage's unit roundoff (2^-24,
    2^-8): an acceptance tolerance for the next step's input, not a bound; the claims hold such
    an implementation's outputs to the bounds at its unit roundoffs (propositions/kit/precision.py).
    """
    if dtype == "float64":
        return ri.manifold_tolerance(d, r)
    return ri.manifold_tolerance(d, r) * (step_analysis.UNIT_ROUNDOFFS[dtype] / step_analysis.U64)


def _check_output(name: str, W: np.ndarray, W_new, dtype: str) -> np.ndarray:
    try:
        W_new = np.asarray(W_new)
    except Exception as error:
        raise ImplementationError(f"{name}: the step returned a frame that is not an array ({_one_line(error)})") from None
    if W_new.shape != W.shape:
        raise ImplementationError(f"{name}: the step returned a frame of shape {W_new.shape} for input {W.shape}")
    if not np.issubdtype(W_new.dtype, np.floating):
        raise ImplementationError(f"{name}: the step returned a frame of dtype {W_new.dtype}, not floating point")
    W_new = W_new.astype(np.float64, copy=False)
    if not np.all(np.isfinite(W_new)):
        bad = int(np.sum(~np.all(np.isfinite(W_new), axis=(-2, -1)))) if W_new.ndim > 2 else 1
        raise ImplementationError(f"{name}: the step returned a non-finite frame (NaN or inf) in {bad} frame(s)")
    d, r = W.shape[-2:]
    gram = np.swapaxes(W_new, -1, -2) @ W_new - np.eye(r)
    drift = float(np.max(np.sqrt(np.sum(gram * gram, axis=(-2, -1)))))
    tolerance = _output_tolerance(d, r, dtype)
    if drift > tolerance:
        raise ImplementationError(
            f"{name}: the step moved the frame off St({d}, {r}): ||W^T W - I|| = {drift:.3g} > {tolerance:.3g} (the reference's input tolerance)"
        )
    return W_new


# --------------------------------------------------------------------------------------------
# NumPy implementations
# --------------------------------------------------------------------------------------------


def _numpy_parts(spec: str, rest: str):
    parts = rest.split(":")
    if len(parts) not in (2, 3):
        raise AdapterError(f"{spec}: expected numpy:MODULE:ATTRS[:FLAGS] (ATTRS: step, init,step or an object with .init and .step)")
    module_name, attrs = parts[0], parts[1]
    flags = tuple(flag for flag in (parts[2].split(",") if len(parts) == 3 else []) if flag)
    unknown = [flag for flag in flags if flag not in NUMPY_FLAGS]
    if unknown:
        raise AdapterError(f"{spec}: unknown flag {unknown[0]!r}; known: {', '.join(NUMPY_FLAGS)}")
    if "per_frame" in flags and "batched" in flags:
        raise AdapterError(f"{spec}: give per_frame or batched, not both")
    return module_name, attrs, flags


def _numpy_variant(name: str, spec: str, rest: str, checked: bool = True) -> AdaptedVariant:
    module_name, attrs, flags = _numpy_parts(spec, rest)
    module = _import(module_name, spec)
    names = [a for a in attrs.split(",")]
    if len(names) == 2:
        init, step = (_attribute(module, n, spec) for n in names)
    elif len(names) == 1:
        target = _attribute(module, names[0], spec)
        if hasattr(target, "init") and hasattr(target, "step") and not inspect.isfunction(target):
            init, step = target.init, target.step
        else:
            init, step = ri.init, target
    else:
        raise AdapterError(f"{spec}: ATTRS must be step, init,step or one object with .init and .step")
    _check_signature(init, "init(W)", 1, spec)
    _check_signature(step, "step(W, G, state, config)", 4, spec)
    adapter = _NumpyStepper(name, init, step, flags, checked)  # messages name the implementation as the user did
    adapter.trial()
    domain = tuple(case for flag, case in DOMAIN_FLAGS.items() if flag in flags)
    return AdaptedVariant(
        name, SHORTCUTS.get(name, (None, f"NumPy implementation {module_name}:{attrs}"))[1], (), adapter.init,
        adapter.step, spec=spec, state_observable=adapter.observable, dtype=adapter.dtype, domain=domain, calling=adapter.calling,
    )


class _NumpyStepper:
    """init/step of a NumPy implementation, batched or looped over the leading axes."""

    def __init__(self, spec, init, step, flags, checked=True):
        self.spec, self.checked = spec, checked
        self._init, self._step = init, step
        self.per_frame = "per_frame" in flags
        self.black_box = "black_box" in flags
        self.observable = False
        self.dtype = "float64"

    # the trial decides, once, how the implementation is called; it is part of resolving the spec
    def trial(self) -> None:
        W, G = _trial_frames()
        try:
            state = self._init(W)
            out = self._step(W, G, state, TRIAL_CONFIG)
        except Exception as error:
            raise AdapterError(f"{self.spec}: a step on one (5, 2) frame failed: {_one_line(error)}") from None
        if not isinstance(out, tuple) or len(out) != 2:
            raise AdapterError(f"{self.spec}: step must return (W_new, state_new), got {type(out).__name__}")
        W_new = np.asarray(out[0])
        if W_new.shape != W.shape:
            raise AdapterError(f"{self.spec}: step returned a frame of shape {W_new.shape} for input {W.shape}")
        self.dtype = "float64" if W_new.dtype == np.float64 else str(W_new.dtype)
        if self.dtype not in step_analysis.UNIT_ROUNDOFFS:
            raise AdapterError(f"{self.spec}: step returned frames of dtype {self.dtype}; the claims' bounds are derived for "
                               f"{', '.join(step_analysis.UNIT_ROUNDOFFS)} storage")
        self.observable = not self.black_box and isinstance(state, StiefelAdamState) and isinstance(out[1], StiefelAdamState)
        self.calling = "one (d, r) frame a call (declared)" if self.per_frame else "batched: frames of shape (..., d, r)"
        if self.per_frame:
            return
        W2, G2 = _trial_frames((2,))
        try:
            state2 = self._init(W2)
            W2_new, state2_new = self._step(W2, G2, state2, TRIAL_CONFIG)
            batched_ok = np.shape(W2_new) == W2.shape
            if batched_ok and self.observable:
                batched_ok = np.shape(state2_new.v) == (2,) and np.shape(state2_new.m) == W2.shape
        except Exception:
            batched_ok = False
        self.per_frame = not batched_ok
        if self.per_frame:
            self.calling = "one (d, r) frame a call (a step on a batch of two frames failed)"

    def init(self, W):
        W = np.asarray(W)
        if W.ndim == 2 or not self.per_frame:
            state = self._init(W)
            return state if self.observable else OpaqueState(state, W.shape[:-2])
        lead = W.shape[:-2]
        states = [self._init(W[index]) for index in np.ndindex(*lead)]
        return self._join(states, lead)

    def step(self, W, G, state, config):
        W = np.asarray(W)
        if W.ndim == 2 or not self.per_frame:
            inner = state if self.observable else self._payload(state, W.shape[:-2])
            W_new, state_new = self._call(W, G, inner, config)
            W_new = self._output(W, W_new)
            return W_new, state_new if self.observable else OpaqueState(state_new, W.shape[:-2])
        lead = W.shape[:-2]
        frames = self._split(state, lead)
        results = [self._call(W[index], G[index], frame_state, config) for index, frame_state in zip(np.ndindex(*lead), frames)]
        W_new = np.stack([np.asarray(w) for w, _ in results]).reshape(W.shape) if results else np.array(W, copy=True)
        return self._output(W, W_new), self._join([s for _, s in results], lead)

    def _output(self, W, W_new):
        if self.checked:
            return _check_output(self.spec, W, W_new, self.dtype)
        W_new = np.asarray(W_new, dtype=np.float64)
        if W_new.shape != np.shape(W):
            raise ImplementationError(f"{self.spec}: the step returned a frame of shape {W_new.shape} for input {np.shape(W)}")
        return W_new

    def _call(self, W, G, state, config):
        out = self._step(W, G, state, config)
        if not isinstance(out, tuple) or len(out) != 2:
            raise ImplementationError(f"{self.spec}: step returned {type(out).__name__}, not (W_new, state_new)")
        return out

    def _payload(self, state, lead):
        if not isinstance(state, OpaqueState):
            raise StateNotObservable("a state built by the checker was handed to a black-box implementation")
        if state.lead != tuple(lead):
            raise StateNotObservable(f"a state of leading axes {state.lead} was used with frames of leading axes {tuple(lead)}")
        return state.payload

    def _split(self, state, lead):
        if self.observable:
            m, v = np.asarray(state.m), np.asarray(state.v)
            return [StiefelAdamState(m=m[index], v=v[index] if v.shape[: len(lead)] == lead else v, t=state.t) for index in np.ndindex(*lead)]
        return list(self._payload(state, lead))

    def _join(self, states, lead):
        if not self.observable:
            return OpaqueState(states, lead)
        if not states:
            return StiefelAdamState(m=np.zeros(lead + (0, 0)), v=np.zeros(lead), t=0)
        m = np.stack([np.asarray(s.m) for s in states])
        v = np.stack([np.asarray(s.v) for s in states])
        return StiefelAdamState(m=m.reshape(lead + m.shape[1:]), v=v.reshape(lead + v.shape[1:]), t=states[0].t)


# --------------------------------------------------------------------------------------------
# torch optimizers
# --------------------------------------------------------------------------------------------


def _torch_parts(spec: str, rest: str):
    module_name, _, tail = rest.partition(":")
    class_name, _, options_text = tail.partition(":")
    if not module_name or not class_name:
        raise AdapterError(f"{spec}: expected torch:MODULE:CLASS[:JSON]")
    options = {}
    if options_text:
        try:
            options = json.loads(options_text)
        except json.JSONDecodeError as error:
            raise AdapterError(f"{spec}: the keyword JSON does not parse ({error.msg} at character {error.pos})") from None
        if not isinstance(options, dict):
            raise AdapterError(f"{spec}: the keyword JSON must be an object, got {type(options).__name__}")
    return module_name, class_name, options


def _torch_variant(name: str, spec: str, rest: str, checked: bool = True) -> AdaptedVariant:
    try:
        import torch
    except Exception:
        raise AdapterError(f"{spec}: needs torch, which is not installed (the 'torch' extra: pip install -e '.[torch]' in this project's checkout)") from None
    module_name, class_name, options = _torch_parts(spec, rest)
    settings = _TorchSettings.pop_from(dict(options), spec)
    module = _import(module_name, spec)
    optimizer_class = _attribute(module, class_name, spec)
    # a package that states how it evaluates each stage (torch_impl.declared_precision) is held to it
    declare = getattr(module, "declared_precision", None)
    declaration = precisions.frozen_declaration(declare(getattr(torch, settings.dtype))) if callable(declare) else None
    if not (isinstance(optimizer_class, type) and issubclass(optimizer_class, torch.optim.Optimizer)):
        raise AdapterError(f"{spec}: {module_name}.{class_name} is not a torch.optim.Optimizer class")
    builder = _TorchBuilder(name, optimizer_class, settings.options, getattr(torch, settings.dtype), _manifold(settings.manifold, spec))
    adapter = _TorchStepper(name, builder, settings.batched, settings.state_map, checked)
    adapter.trial()
    description = SHORTCUTS.get(name, (None, f"torch optimizer {module_name}.{class_name} ({settings.dtype})"))[1]
    return AdaptedVariant(name, description, (), adapter.init, adapter.step, spec=spec, state_observable=settings.state_map is not None,
                          dtype=settings.dtype, route=settings.route, ignored=builder.ignored, torch_factory=builder.factory(),
                          declaration=declaration, domain=settings.domain, calling=adapter.calling)


class _TorchSettings:
    """The adapter's own keys of a torch spec's JSON (module docstring), checked; `options` keeps the
    constructor keywords."""

    def __init__(self, options, dtype, route, manifold, batched, state_map, domain):
        self.options, self.dtype, self.route, self.manifold = options, dtype, route, manifold
        self.batched, self.state_map, self.domain = batched, state_map, domain

    @classmethod
    def pop_from(cls, options: dict, spec: str) -> "_TorchSettings":
        dtype = options.pop("dtype", "float64")
        if dtype not in TORCH_DTYPES:
            raise AdapterError(f"{spec}: dtype must be one of {', '.join(TORCH_DTYPES)}, got {dtype!r}")
        route = options.pop("route", "any")
        if route not in ROUTES:
            raise AdapterError(f"{spec}: route must be one of {', '.join(ROUTES)}, got {route!r}")
        batched = options.pop("batched", None)  # None: batched, or frame by frame where a batched trial fails
        if batched is not None and not isinstance(batched, bool):
            raise AdapterError(f"{spec}: batched must be true or false, got {batched!r}")
        state_map = _state_map(options.pop("state", None), spec, batched is not False)
        domain = _declared_domain(options.pop("domain", []), spec)
        manifold = options.pop("manifold", None)
        return cls(options, dtype, route, manifold, batched, state_map, domain)


def _declared_domain(declared, spec: str) -> tuple[str, ...]:
    """The cases a spec declares outside the implementation's domain (propositions.properties.DOMAIN_CASES)."""
    from propositions.properties import DOMAIN_CASES

    if not isinstance(declared, list) or any(case not in DOMAIN_CASES for case in declared):
        raise AdapterError(f"{spec}: domain must be a list of cases outside the domain, each one of {', '.join(map(repr, DOMAIN_CASES))}; "
                           f"got {declared!r}")
    return tuple(declared)


def _manifold(manifold_name, spec: str):
    """The geoopt manifold instance a spec names ("module:Class"), or None."""
    if manifold_name is None:
        return None
    manifold_module, _, manifold_class = str(manifold_name).partition(":")
    manifold_type = _attribute(_import(manifold_module, spec), manifold_class or "?", spec)
    try:
        return manifold_type()
    except Exception as error:
        raise AdapterError(f"{spec}: manifold {manifold_name} cannot be made: {_one_line(error)}") from None


STATE_KEYS = ("m", "v", "t", "m_tangent_at")


def _state_map(declared, spec: str, batched: bool) -> dict | None:
    """The checked "state" declaration of a torch spec (module docstring), or None."""
    if declared is None:
        return None
    if not isinstance(declared, dict) or set(declared) != set(STATE_KEYS):
        raise AdapterError(f"{spec}: state must be an object with the keys {', '.join(STATE_KEYS)}, got {declared!r}")
    if declared["m_tangent_at"] not in ("previous", "current"):
        raise AdapterError(f"{spec}: state.m_tangent_at must be 'previous' or 'current', got {declared['m_tangent_at']!r}")
    if not batched:
        raise AdapterError(f"{spec}: a state declaration needs batched=true (one parameter holds every frame)")
    return dict(declared)


class _TorchBuilder:
    """Builds the optimizer and its parameters: the class, its keywords, the storage dtype, a geoopt
    manifold where one is named, and the hyper-parameters the class rejects (`ignored`, found by the
    first construction)."""

    def __init__(self, spec, optimizer_class, options, dtype, manifold):
        self.spec, self.optimizer_class, self.options = spec, optimizer_class, options
        self.dtype, self.manifold = dtype, manifold
        self.dtype_name = str(dtype).replace("torch.", "")
        # the moments in the compute dtype (float64 for float64 frames, else float32), as torch_impl keeps them
        self.moment_dtype_name = "float64" if self.dtype_name == "float64" else "float32"
        self.ignored: tuple[str, ...] = ()

    def parameter(self, data):
        if self.manifold is not None:
            import geoopt

            return geoopt.ManifoldParameter(data, manifold=self.manifold)
        import torch

        return torch.nn.Parameter(data)

    def parameters(self, frames) -> list:
        import torch

        return [self.parameter(torch.tensor(np.array(frame, dtype=np.float64), dtype=self.dtype)) for frame in frames]

    def hyperparameters(self, config) -> dict:
        values = {"lr": config.lr, "betas": tuple(config.betas), "eps": config.eps,
                  "weight_decay": config.weight_decay, "trust_radius": config.trust_radius}
        return {key: value for key, value in values.items() if key not in self.ignored}

    def optimizer(self, parameters, config):
        return self.optimizer_class(parameters, **self.hyperparameters(config), **self.options)

    def set_hyperparameters(self, optimizer, config) -> None:
        """The config's hyper-parameters in every param group: load_state_dict restores the groups'
        settings saved with the state, and a step must run at the settings it is asked for."""
        for group in optimizer.param_groups:
            group.update(self.hyperparameters(config))

    def factory(self):
        """The builder the bookkeeping claim drives the optimizer with (its own layouts of parameters,
        groups and instances), at the trial's hyper-parameters."""
        from propositions.bookkeeping import TorchFactory

        return TorchFactory(lambda params: self.optimizer(params, TRIAL_CONFIG), self.parameter, self.dtype)

    def find_ignored(self, W) -> None:
        """Construct once; a keyword the class rejects (a TypeError naming it) is dropped and recorded."""
        ignored = []
        for _ in range(len(CONFIG_FIELDS) + 1):
            try:
                self.optimizer(self.parameters([W]), TRIAL_CONFIG)
                return
            except TypeError as error:
                rejected = [key for key in CONFIG_FIELDS if key not in ignored and f"'{key}'" in str(error)]
                if not rejected:
                    raise AdapterError(f"{self.spec}: the optimizer cannot be made: {_one_line(error)}") from None
                ignored.append(rejected[0])
                self.ignored = tuple(ignored)
            except Exception as error:
                raise AdapterError(f"{self.spec}: the optimizer cannot be made: {_one_line(error)}") from None


class _DeclaredState:
    """m, v, t of a torch optimizer whose spec declares where they are (module docstring): written into
    the declared keys before a step, read after it, and checked on the trial step."""

    def __init__(self, spec, state_map, builder):
        self.spec, self.keys, self.builder = spec, state_map, builder
        self.count_kind = None  # how the optimizer stores t: learned on the trial step

    def write(self, optimizer, parameter, state) -> None:
        """m, v, t into the declared keys, in the types the optimizer keeps them (seen on the trial)."""
        import torch

        moment_dtype = getattr(torch, self.builder.moment_dtype_name)
        if self.count_kind is None or self.count_kind == "int":
            value = int(state.t)
        else:
            layout, dtype = self.count_kind
            value = torch.full(parameter.shape[:-2] if layout == "per_frame" else (), float(state.t), dtype=dtype)
        optimizer.state[parameter] = {
            self.keys["m"]: torch.tensor(np.asarray(state.m, dtype=np.float64), dtype=moment_dtype),
            self.keys["v"]: torch.tensor(np.asarray(state.v, dtype=np.float64), dtype=moment_dtype),
            self.keys["t"]: value,
        }

    def _count(self, count, parameter) -> int:
        import torch

        if not torch.is_tensor(count):
            self.count_kind = "int"
            return int(count)
        counts = count.detach().to(torch.float64).reshape(-1).numpy()
        lead = tuple(parameter.shape[:-2])
        if lead:  # one frame cannot tell one count per frame from one per parameter
            self.count_kind = ("per_frame" if tuple(count.shape) == lead else "scalar", count.dtype)
        elif self.count_kind is None:
            self.count_kind = ("scalar", count.dtype)
        if counts.size and not np.all(counts == counts[0]):
            raise ImplementationError(f"{self.spec}: the frames of one parameter have different step counts {sorted(set(counts.tolist()))}")
        return int(counts[0]) if counts.size else 0

    def read(self, optimizer, parameter, W_new):
        """The StiefelAdamState the declared keys hold after a step (m transported where declared)."""
        import torch

        held = optimizer.state[parameter]
        missing = [self.keys[name] for name in ("m", "v", "t") if self.keys[name] not in held]
        if missing:
            raise AdapterError(f"{self.spec}: the declared state key(s) {missing} are not in optimizer.state (it holds {sorted(held)})")
        t = self._count(held[self.keys["t"]], parameter)
        m = held[self.keys["m"]].detach().to(torch.float64).numpy().copy()
        v = held[self.keys["v"]].detach().to(torch.float64).numpy().copy()
        if self.keys["m_tangent_at"] == "previous" and m.shape == W_new.shape:
            # stage 8's transport P_{W+}(m) = m - W+ sym(W+^T m), written out: reference_impl's
            # project_tangent would refuse a float32 frame at float64's manifold tolerance
            normal = np.swapaxes(W_new, -1, -2) @ m
            m = m - W_new @ (0.5 * (normal + np.swapaxes(normal, -1, -2)))
        return ri.StiefelAdamState(m=m, v=v, t=t)

    def _tangency_tolerance(self, W_new, m):
        """Largest ||W^T m + m^T W|| per frame for an m tangent at W = W_new up to rounding.

        With D = W^T W - I (the stored frame is orthonormal only to its own rounding), an exact
        projection m = P_W(x) has sym(W^T m) = -sym(D S), S = sym(W^T x), of norm <= ||D|| ||W||_2
        ||x||, ||W||_2 <= sqrt(1 + ||D||). The projection's own rounding is the projection stage
        (kit/bounds.py) at X = ||m||: in float64 where the adapter transports m ("previous"), in the
        moment's storage where the optimizer left it tangent ("current", the storage rounding as
        X_err); W^T carries it twice. Evaluating W^T m here adds gamma_d sqrt(r) ||m|| twice."""
        from propositions.kit.bounds import gamma, projection

        d, r = W_new.shape[-2:]
        drift = ri.frobenius(np.swapaxes(W_new, -1, -2) @ W_new - np.eye(r))
        norm = ri.frobenius(m)
        transported = self.keys["m_tangent_at"] == "previous"
        u = 2.0**-53 if transported or self.builder.dtype_name == "float64" else step_analysis.UNIT_ROUNDOFFS[self.builder.moment_dtype_name]
        rounding = projection(d=d, r=r, u_c=u, X=norm, X_err=0.0 if transported else u * norm, W_err=0.0)
        spectral = np.sqrt(1.0 + drift)
        return 2.0 * spectral * (drift * spectral * norm + rounding) + 2.0 * gamma(d) * np.sqrt(r) * norm

    def check(self, W, W_new, state) -> None:
        """The declared m, v, t after one step from a fresh state: t = 1, v one scalar per frame
        and positive (G is random), m of W's shape and tangent at W_new (after the transport)."""
        problems = []
        if state.t != 1:
            problems.append(f"t = {state.t} after one step, not 1")
        if np.shape(state.v) != W.shape[:-2] or not np.all(np.asarray(state.v) > 0):
            problems.append(f"v has shape {np.shape(state.v)} (one positive scalar per frame has shape {W.shape[:-2]})")
        if np.shape(state.m) != W.shape:
            problems.append(f"m has shape {np.shape(state.m)}, not {W.shape}")
        else:
            normal = np.swapaxes(W_new, -1, -2) @ state.m
            defect = ri.frobenius(normal + np.swapaxes(normal, -1, -2))
            if not np.all(defect <= self._tangency_tolerance(W_new, state.m)):
                problems.append("m is not tangent at the new frame (W^T m + m^T W != 0): m_tangent_at does not fit")
        if problems:
            raise AdapterError(f"{self.spec}: the declared state does not fit the optimizer: " + "; ".join(problems))


class _single_thread:
    """One intra-op thread while a step runs, as certify runs BLAS (certify.execution.limit_blas_threads):
    the frames here are small, and a thread pool on a shared machine costs more than it gives."""

    def __enter__(self):
        import torch

        self.threads = torch.get_num_threads()
        torch.set_num_threads(1)

    def __exit__(self, *exc):
        import torch

        torch.set_num_threads(self.threads)
        return False


class _TorchStepper:
    """A torch.optim.Optimizer as a pure step: each call builds the parameters and the optimizer
    (_TorchBuilder), loads the state snapshot the previous call returned (or writes the declared
    state, _DeclaredState), sets .grad and calls step(); the new snapshot (a deep copy of
    state_dict()) is the returned OpaqueState. A state can so be reused (P5 takes two steps from one
    state), and the optimizer sees only parameters, gradients and step(). The trial decides how the
    frames are passed: one parameter of shape (..., d, r), or where the optimizer takes only (d, r)
    parameters (a batched trial step raises), one parameter per frame."""

    def __init__(self, spec, builder: _TorchBuilder, batched, state_map=None, checked=True):
        self.spec, self.builder, self.checked = spec, builder, checked
        self.batched = batched is not False
        self.fallback = batched is None and state_map is None
        self.declared = _DeclaredState(spec, state_map, builder) if state_map is not None else None
        self.calling = "batched: one parameter of shape (..., d, r)" if self.batched else "one parameter per (d, r) frame (declared)"

    def trial(self) -> None:
        """Find the keywords the class takes and take one step, so that unusable input is reported
        before any claim runs; a batched step that raises is tried again frame by frame."""
        W, G = _trial_frames((2,))
        self.builder.find_ignored(W[0])
        try:
            self._trial_step(W, G)
        except AdapterError as error:
            if not (self.fallback and self.batched):
                raise
            self.batched = False
            self._trial_step(W, G)
            self.calling = f"one parameter per (d, r) frame (a batched step failed: {str(error).split('failed: ', 1)[-1]})"

    def _trial_step(self, W, G) -> None:
        try:
            W_new, state = self.step(W, G, self.init(W), TRIAL_CONFIG)
        except ImplementationError:
            return  # it runs; misbehaving output is for the claims to report
        except AdapterError:
            raise
        except Exception as error:
            raise AdapterError(f"{self.spec}: a trial step failed: {_one_line(error)}") from None
        if self.declared is not None:
            self.declared.check(W, W_new, state)

    def init(self, W):
        check_frame("W", W)
        if self.declared is not None:
            return ri.init(np.asarray(W, dtype=np.float64))
        return OpaqueState(None, np.shape(W)[:-2])

    def _frames(self, X):
        return [X] if self.batched else [X[index] for index in np.ndindex(*X.shape[:-2])]

    def step(self, W, G, state, config):
        import torch

        W, G = np.asarray(W), np.asarray(G)
        if self.declared is not None:
            return self._step_declared(W, G, state, config)
        if not isinstance(state, OpaqueState):
            raise StateNotObservable("a state built by the checker was handed to a torch optimizer (black box)")
        if state.lead != W.shape[:-2]:
            raise StateNotObservable(f"a state of leading axes {state.lead} was used with frames of leading axes {W.shape[:-2]}")
        with _single_thread():
            parameters = self.builder.parameters(self._frames(W))
            optimizer = self.builder.optimizer(parameters, config)
            if state.payload is not None:
                optimizer.load_state_dict(copy.deepcopy(state.payload))
                self.builder.set_hyperparameters(optimizer, config)
            for parameter, gradient in zip(parameters, self._frames(G)):
                parameter.grad = torch.tensor(np.array(gradient, dtype=np.float64), dtype=self.builder.dtype)
            optimizer.step()
        with torch.no_grad():
            values = [p.detach().to(torch.float64).cpu().numpy() for p in parameters]
        W_new = values[0].copy() if self.batched else (np.stack(values).reshape(W.shape) if values else np.array(W, copy=True))
        return self._output(W, W_new), OpaqueState(copy.deepcopy(optimizer.state_dict()), W.shape[:-2])

    def _output(self, W, W_new):
        if self.checked:
            return _check_output(self.spec, W, W_new, self.builder.dtype_name)
        return np.asarray(W_new, dtype=np.float64)

    def _step_declared(self, W, G, state, config):
        """One step with the state written into, and read from, the declared keys."""
        import torch

        if not isinstance(state, StiefelAdamState):
            raise ValueError(f"state must be a StiefelAdamState (from init), got {type(state).__name__}")
        with _single_thread():
            (parameter,) = self.builder.parameters([W])
            optimizer = self.builder.optimizer([parameter], config)
            if state.t > 0:
                self.declared.write(optimizer, parameter, state)
            parameter.grad = torch.tensor(np.array(G, dtype=np.float64), dtype=self.builder.dtype)
            optimizer.step()
        W_new = self._output(W, parameter.detach().to(torch.float64).numpy().copy())
        return W_new, self.declared.read(optimizer, parameter, W_new)


__all__ = ["AdapterError", "ImplementationError", "SHORTCUTS", "canonical_spec", "describe", "known_names", "resolve"]
