"""Bookkeeping invariances of a torch optimizer of frames, whatever its algorithm.

Claim. For a torch.optim.Optimizer that steps each frame on St(d, r) by itself (as every
Riemannian Adam does: geoopt's, torch_impl.StiefelAdam), the frames it produces do not depend on
how the parameters are handed to it: one param group holding two frames, two param groups with
equal settings, or two optimizers; one (2, d, r) parameter or two (d, r) ones; one instance that
lives across the steps, one rebuilt at every step from the previous one's state_dict, or one
loaded mid-run from a state_dict into a fresh instance over fresh parameters.

Why it should hold. Each of these changes only the bookkeeping (which tensors share a call, which
object holds the state), not the mathematics of any frame's step. The statement needs no model of
the algorithm, so it applies to optimizers the other claims cannot follow bit for bit (geoopt, the
authors' code), and it catches what a comparison with a model of another algorithm cannot see: a
step count shared across parameters, an lr divided by the group size, a second moment shared by
the frames of one tensor, a state_dict that drops a moment.

How it is checked. Two frames and T gradients, drawn from the seed, are stepped under each
layout, and the frames after every step are compared with those of the reference layout (one
group of two (d, r) parameters, one instance). The restored layouts run the same calls in the same
order, so they must agree bit for bit (0.5 ulp). The regrouped and batched layouts may batch the
same products differently (a batched QR or matmul rounds differently from two single ones), so
they are held to `regrouping_allowance` (the stage `regrouping`, from the one analysis of the step):
the rounding of two evaluations of one step, propagated over the steps taken.

What would make it fail. The controls are subclasses of torch_impl.StiefelAdam with one such bug
each: the lr divided by the number of parameters of the group, a second moment averaged over the
frames of a tensor, and a load_state_dict that drops the first moment.
"""

from __future__ import annotations

import copy
import math

import numpy as np

import reference_impl as ref
from propositions._common import NumericalCheck, Profile, get_profile, rng_for, stop_at_detection
from propositions.kit import step_analysis
from propositions.kit.bounds import projection, stage
from propositions.kit.threads import one_thread_environment
from propositions.kit.protocol import Claim, Context, Control, Evidence, Part, Symbolic

CLAIM_ID = "bookkeeping"
REAL_OPTIMIZER = "stiefel_adam"
SHAPES = ((5, 2), (8, 8), (16, 4), (32, 8))
CONFIG = dict(lr=0.05, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0, trust_radius=0.5)
SAVE_AFTER = 1
LAYOUTS = ("two_groups", "two_optimizers", "batched", "checkpoint", "rebuilt")
EXACT_LAYOUTS = ("checkpoint", "rebuilt")


@stage("E_regroup", "4*(2**t - 1)*(E_P + E_polar)")
def regrouping(t, E_P, E_polar):
    """Largest ||W_a - W_b||_F per frame after t steps between two layouts whose only difference is
    how the same products are batched. One step's output is within E_P + E_polar of the exact step
    from its inputs: the projection of a unit-norm gradient (the projection stage at X = 1: the
    direction is normalised by its second moment) and the polar factor's evaluation on the slowest
    of its routes (step_analysis.retraction_error with route "any", kappa = sqrt(1 + Delta^2)); two
    evaluations differ by twice that per step, and a difference in W carries into the next step at
    most doubled (the polar factor is 1/sigma_min <= 1-Lipschitz here, and the direction moves by
    at most its own length, capped at Delta = 0.5): after t steps sum_{s < t} 2^s 2 (2 e) = 4 e (2^t - 1)."""


def regrouping_allowance(d: int, r: int, u: float, steps: int) -> float:
    """regrouping's bound for (d, r) frames in a dtype of unit roundoff u, after `steps` steps."""
    kappa = math.sqrt(1.0 + CONFIG["trust_radius"] ** 2)
    E_P = float(projection(d=d, r=r, u_c=u, X=1.0, X_err=0.0, W_err=0.0))
    E_polar = float(step_analysis.retraction_error(d, r, step_analysis.Rounding(u_c=u, route="any"), kappa, CONFIG["trust_radius"]))
    return float(regrouping(t=steps, E_P=E_P, E_polar=E_polar))


REGROUPING_TEXT = ("regrouping_allowance, at the implementation's unit roundoff u_c: "
                   + step_analysis.stage_texts(("regrouping", "projection", "polar_svd", "polar_eigh", "polar_newton_schulz")))


def _layout_checks() -> dict:
    exact = "exact: the same calls in the same order, so 0.5 ulp (bit for bit)"
    allowance = REGROUPING_TEXT
    descriptions = {
        "two_groups": "two param groups with equal settings against one group of two",
        "two_optimizers": "two optimizers, one frame each, against one optimizer",
        "batched": "one (2, d, r) parameter against two (d, r) parameters",
        "checkpoint": "a fresh instance over fresh parameters loaded from the state_dict saved after the first steps",
        "rebuilt": "an instance rebuilt at every step from the previous instance's state_dict",
    }
    return {
        layout: NumericalCheck(
            layout,
            f"frames after each step, {text}",
            exact if layout in EXACT_LAYOUTS else allowance,
            tightness_note="an exact equality or a rounding allowance between two evaluations of one algorithm: 0 where they batch alike",
        )
        for layout, text in descriptions.items()
    }


class TorchFactory:
    """How to build the optimizer under test: make(params_or_groups) -> optimizer, parameter(tensor)
    -> the parameter type it steps, dtype (a torch dtype). Adapters attach one to an AdaptedVariant
    as `torch_factory`."""

    def __init__(self, make, parameter, dtype):
        self.make, self.parameter, self.dtype = make, parameter, dtype


def _factory_for(optimizer) -> TorchFactory | None:
    import torch

    if isinstance(optimizer, str) and (optimizer == REAL_OPTIMIZER or optimizer in CONTROLS):
        optimizer_class = _real_class() if optimizer == REAL_OPTIMIZER else broken_classes()[optimizer]
        return TorchFactory(lambda params: optimizer_class(params, **CONFIG), torch.nn.Parameter, torch.float64)
    return getattr(optimizer, "torch_factory", None)


NOT_A_TORCH_OPTIMIZER = "the implementation is not a torch optimizer (a NumPy step has no param groups or state_dict)"


def not_applicable(optimizer) -> str | None:
    """Why this claim does not apply to `optimizer` (a reference_impl variant name or an adapted
    implementation), or None where it does: StiefelAdam, a control, or a torch optimizer. A claim
    that does not apply is its own outcome (certify run, compare), not an inconclusive certificate."""
    if isinstance(optimizer, str):
        return None if optimizer == REAL_OPTIMIZER or optimizer in CONTROLS else NOT_A_TORCH_OPTIMIZER
    return None if getattr(optimizer, "torch_factory", None) is not None else NOT_A_TORCH_OPTIMIZER


def _real_class():
    from torch_impl import StiefelAdam

    return StiefelAdam


def _run_layout(factory: TorchFactory, layout: str, W, gradients):
    """The two frames after each step under `layout`; W (2, d, r) and gradients float64 arrays."""
    import torch

    def fresh(values):
        return [factory.parameter(torch.tensor(v, dtype=factory.dtype)) for v in values]

    batched = layout == "batched"
    params = fresh([W]) if batched else fresh([W[0], W[1]])
    if layout == "two_groups":
        optimizers = [factory.make([{"params": [params[0]]}, {"params": [params[1]]}])]
    elif layout == "two_optimizers":
        optimizers = [factory.make([params[0]]), factory.make([params[1]])]
    else:
        optimizers = [factory.make(params)]
    history = []
    for step, G in enumerate(gradients):
        for p, g in zip(params, [G] if batched else [G[0], G[1]]):
            p.grad = torch.tensor(g, dtype=factory.dtype)
        for optimizer in optimizers:
            optimizer.step()
        history.append(np.stack([p.detach().to(torch.float64).numpy() for p in params]).reshape(W.shape))
        if layout == "rebuilt" or (layout == "checkpoint" and step == SAVE_AFTER):
            state = copy.deepcopy(optimizers[0].state_dict())
            params = fresh([p.detach().to(torch.float64).numpy() for p in params])
            optimizers = [factory.make(params)]
            optimizers[0].load_state_dict(state)
    return history


def invariance_part(ctx: Context, stop: bool = False) -> Evidence:
    """Every layout against the reference layout, over SHAPES and runs_for(profile) draws. stop: a
    control's run, which ends at its first detection (kit.common.stop_at_detection)."""
    from propositions._common import ulps_apart

    factory = _factory_for(ctx.optimizer)
    if factory is None:
        return Evidence(inconclusive=[f"not applicable: {NOT_A_TORCH_OPTIMIZER}"])
    import torch

    u = torch.finfo(factory.dtype).eps / 2
    checks = _layout_checks()
    completes = NumericalCheck("layouts_complete", "every layout runs to its last step without an exception (0; inf if the optimizer raised)",
                               "exact: a correct optimizer raises in none of these layouts", tightness_note="an exact equality: 0 by design")
    steps = max(3, ctx.profile.steps // 2)
    frames = 0
    with stop_at_detection([completes, *checks.values()], active=stop):
        for d, r in SHAPES:
            for run in range(runs_for(ctx.profile)):
                key = (CLAIM_ID, d, r, run)
                rng = rng_for(ctx.seed, *key)
                W = ref.random_point(d, r, rng, (2,))
                gradients = [rng.standard_normal(W.shape) for _ in range(steps)]
                try:
                    reference = _run_layout(factory, "one_group", W, gradients)
                    for layout in LAYOUTS:
                        history = _run_layout(factory, layout, W, gradients)
                        for t, (ours, theirs) in enumerate(zip(history, reference), start=1):
                            extra = {"step": t, "layout": layout}
                            if layout in EXACT_LAYOUTS:
                                checks[layout].add(ulps_apart(ours, theirs), 0.5, shape=(d, r), key=key, seed=ctx.seed, extra=extra)
                            else:
                                checks[layout].add(ref.frobenius(ours - theirs), regrouping_allowance(d, r, u, t), shape=(d, r), key=key, seed=ctx.seed, extra=extra)
                    completes.add(np.array([0.0]), 0.5, shape=(d, r), key=key, seed=ctx.seed)
                except Exception as error:  # an optimizer that breaks a layout fails the claim, it does not stop it
                    message = str(error).splitlines()[0] if str(error) else ""
                    completes.add(np.array([math.inf]), 0.5, shape=(d, r), key=key, seed=ctx.seed, extra={"raised": f"{type(error).__name__}: {message}"})
                frames += 2
    return Evidence(checks=[completes, *checks.values()], frames=frames, extra={"dtype": str(factory.dtype).replace("torch.", ""), "steps": steps})


def runs_for(profile: Profile) -> int:
    """Draws per shape: 1 quick, 2 default, 20 thorough."""
    return max(1, min(20, profile.frames // 5000))


def broken_classes() -> dict:
    """name -> a StiefelAdam subclass with one bookkeeping bug that some layout exposes."""
    StiefelAdam = _real_class()

    class LrOverGroupSize(StiefelAdam):
        def _frame_buckets(self):
            buckets = {}
            for key, members in super()._frame_buckets().items():
                group = next(g for g in self.param_groups if any(p is members[0][0] for p in g["params"]))
                buckets[(key[0] / len(group["params"]),) + key[1:]] = members
            return buckets

    class SharedSecondMoment(StiefelAdam):
        def step(self, closure=None):
            loss = super().step(closure)
            for state in self.state.values():
                if "exp_avg_sq" in state and state["exp_avg_sq"].dim() > 0:
                    state["exp_avg_sq"].fill_(float(state["exp_avg_sq"].mean()))
            return loss

    class LoadDropsFirstMoment(StiefelAdam):
        def load_state_dict(self, state_dict):
            super().load_state_dict(state_dict)
            for state in self.state.values():
                if "exp_avg" in state:
                    state["exp_avg"].zero_()

    return {"lr_over_group_size": LrOverGroupSize, "shared_second_moment": SharedSecondMoment, "load_drops_first_moment": LoadDropsFirstMoment}


CONTROLS = {
    "lr_over_group_size": "the lr divided by the number of parameters in the group",
    "shared_second_moment": "one second moment for all the frames of a tensor (the mean of theirs)",
    "load_drops_first_moment": "load_state_dict sets the first moment to zero",
}


def control_part(ctx: Context) -> Evidence:
    """A broken StiefelAdam (ctx.optimizer names it) through the layouts: whatever optimizer is under
    test, the controls show that these checks catch each bug."""
    return invariance_part(ctx, stop=True)


def _prepare(ctx: Context):
    """The optimizer: StiefelAdam, a control, or an adapted implementation (a NumPy one is then
    reported not applicable, as is a reference_impl variant); the profile as a Profile."""
    from dataclasses import replace

    from reference_impl import VARIANTS

    # a NumPy step of reference_impl (P1..P5's controls, by name) is reported not applicable
    named = isinstance(ctx.optimizer, str) and (ctx.optimizer == REAL_OPTIMIZER or ctx.optimizer in CONTROLS or ctx.optimizer in VARIANTS)
    if not named and not hasattr(ctx.optimizer, "spec"):
        raise ValueError(f"claim {CLAIM_ID}: optimizer must be {REAL_OPTIMIZER!r}, a control ({', '.join(CONTROLS)}), a reference_impl "
                         f"variant or an adapted implementation, got {ctx.optimizer!r}")
    return replace(ctx, profile=get_profile(ctx.profile) if isinstance(ctx.profile, str) else ctx.profile)


CLAIM = Claim(
    id=CLAIM_ID,
    title="A torch optimizer's frames do not depend on grouping, batching, checkpoints or rebuilding",
    statement=(
        "For a torch optimizer that steps each frame on St(d, r) by itself, the frames after every step are the same "
        "(bit for bit, or within the rounding of batching the same products differently) whether two frames are one "
        "param group, two groups with equal settings or two optimizers; one (2, d, r) parameter or two (d, r) ones; "
        "and whether the instance lives across steps, is rebuilt from its state_dict at every step, or is loaded "
        "mid-run into a fresh instance over fresh parameters."
    ),
    latex=r"\mathrm{opt}(\{W_0, W_1\}) = \mathrm{opt}(\{W_0\}) \sqcup \mathrm{opt}(\{W_1\}) = \mathrm{opt}([W_0; W_1])",
    symbolic=Symbolic("not applicable: bookkeeping of an implementation"),
    parts=(Part("layouts", invariance_part),),
    controls=tuple(Control(name, control_part, description) for name, description in CONTROLS.items()),
    requires=("torch",),
    prepare=_prepare,
    environment=one_thread_environment,
    precisions=(("under test", "the torch optimizer's frames", ("{dtype}",)),),
)

__all__ = ["CLAIM", "TorchFactory", "broken_classes", "regrouping_allowance"]
