"""The promise ledger: every promise the documentation and the public docstrings make of a public
function, method or parameter, at the strength it is stated, and the checks that certify it there.

A promise (`Promise`) has an id; the public parameters it is about ("torch_impl.StiefelAdam.lr",
"reference_impl.step.W"; a callable without parameters by its name alone); where it is stated (a file
of this repository) and a phrase of that statement, which must still be there; its strength:

  bit for bit     two runs the documentation says are identical are compared exactly (bound 0.5 ulp);
  bound           a residual within a derived rounding or statistical bound;
  refused         bad input raises a ValueError that names it.

and the checks that certify it, as the certificates name them: "CLAIM:PATTERN", PATTERN matched
(fnmatch) against a certificate's numerical check names and its exact checks as "exact:NAME".

tests/test_ledger.py holds the ledger to the code: every public callable of torch_impl and
reference_impl and every parameter of its signature is in some promise (a parameter added without
a promise fails it); every promise's phrase is in its file; every pattern matches a check of the
committed certificate of its claim; every check of those certificates is matched by some promise;
and a bit-for-bit promise's checks are exact ones. Each certificate of the real optimizer records the
coverage of its claim's promises (`coverage`): a promise none of whose checks compared anything makes
the claim inconclusive, and says so.
"""

from __future__ import annotations

import fnmatch
from dataclasses import dataclass

STRENGTHS = ("bit for bit", "bound", "refused")


@dataclass(frozen=True)
class Promise:
    id: str
    parameters: tuple
    source: str
    quote: str
    strength: str
    checks: tuple


def _p(id, parameters, source, quote, strength, checks) -> Promise:
    return Promise(id, tuple(parameters.split()), source, quote, strength, tuple(checks.split()))


TI = "torch_impl."
RI = "reference_impl."
ALGO = "docs/algorithm.md"
OPT = "torch_impl/optimizer.py"
FUNC = "torch_impl/functional.py"
CLIP = "torch_impl/clipping.py"
ADAM = "reference_impl/adam.py"
MAN = "reference_impl/manifold.py"

PROMISES = (
    # ---- torch_impl.StiefelAdam: the step, per group, in every dtype
    _p("class-steps-as-certified",
       "torch_impl.StiefelAdam.params torch_impl.StiefelAdam.lr torch_impl.StiefelAdam.betas torch_impl.StiefelAdam.eps "
       "torch_impl.StiefelAdam.trust_radius torch_impl.StiefelAdam.weight_decay torch_impl.StiefelAdam.retraction_method "
       "torch_impl.StiefelAdam.step torch_impl.StiefelAdam.step.closure",
       OPT, "Riemannian Adam on the Stiefel manifold with one scalar second moment per frame", "bound",
       "optimizer:*/frame optimizer:*/first_moment optimizer:*/second_moment optimizer:*/scenario_completes "
       "bookkeeping:two_groups bookkeeping:batched bookkeeping:layouts_complete bookkeeping:two_optimizers"),
    _p("class-counts", "torch_impl.StiefelAdam.step torch_impl.StiefelAdam.skipped_steps torch_impl.StiefelAdam.off_manifold_steps",
       OPT, "`skipped_steps` counts the frames (and ordinary tensors)", "bit for bit",
       "optimizer:*/step_count optimizer:*/count_dtype optimizer:*/skipped_count"),
    _p("class-skips-nonfinite", "torch_impl.StiefelAdam.skip_nonfinite", OPT,
       "keeps its frame, moments and step count while the other frames of the same tensor step", "bit for bit",
       "optimizer:*/nonfinite_frame_untouched optimizer:corrupted_state_not_stepped"),
    _p("class-refuses-nonfinite", "torch_impl.StiefelAdam.skip_nonfinite", OPT,
       "a step that fails either check raises ValueError before\n    anything is written", "refused",
       "optimizer:*/refused_step_untouched optimizer:*/refusal_names_parameter"),
    _p("class-no-gradient-untouched", "torch_impl.StiefelAdam.step", OPT, "One step for every parameter with a gradient",
       "bit for bit", "optimizer:*/no_gradient_untouched"),
    _p("class-closure", "torch_impl.StiefelAdam.step.closure", OPT, "returns closure() if given", "bit for bit", "optimizer:*/closure_loss"),
    _p("class-ordinary-is-adamw", "torch_impl.StiefelAdam.manifold", ALGO, "the same numbers bit for bit", "bit for bit",
       "optimizer:*/euclidean_is_adamw"),
    _p("class-checkpoints", "torch_impl.StiefelAdam.state_dict torch_impl.StiefelAdam.load_state_dict "
       "torch_impl.StiefelAdam.load_state_dict.state_dict", OPT, "their values bit for bit", "bit for bit",
       "optimizer:*/checkpoint_round_trip optimizer:*/checkpoints_change_nothing bookkeeping:checkpoint bookkeeping:rebuilt "
       "optimizer:promise/named_checkpoint optimizer:promise/older_checkpoint_defaults"),
    _p("documented-defaults", "torch_impl.StiefelAdam.lr torch_impl.StiefelAdam.betas torch_impl.StiefelAdam.eps torch_impl.StiefelAdam.trust_radius "
       "torch_impl.StiefelAdam.weight_decay torch_impl.stiefel_adam_step.beta1 torch_impl.stiefel_adam_step.beta2 torch_impl.polar_factor.trust_radius "
       "torch_impl.polar_retract.trust_radius torch_impl.clip_grad_norm_finite_.norm_type", ALGO,
       "| `betas` | (beta1, beta2) | each in [0, 1) | (0.9, 0.999) |", "bit for bit", "optimizer:promise/documented_defaults"),
    _p("optimizer-pickles", "torch_impl.StiefelAdam.skipped_steps torch_impl.StiefelAdam.off_manifold_steps", OPT,
       "StiefelAdam as a torch.optim.Optimizer (the API of torch/optim/adamw.py)", "bit for bit", "optimizer:promise/pickle_round_trip"),
    _p("scheduler-sees-step", "torch_impl.StiefelAdam.step", OPT, "read by a torch lr scheduler as _opt_called", "bit for bit",
       "optimizer:promise/scheduler_sees_step"),
    _p("joined-by-shape-dtype-device", "torch_impl.StiefelAdam.params", OPT, "Parameters of one (d, r), dtype and device with the same hyper-parameters",
       "bit for bit", "optimizer:promise/mixed_dtypes"),
    _p("counted-once", "torch_impl.StiefelAdam.skipped_steps torch_impl.StiefelAdam.off_manifold_steps", OPT,
       "manifold is counted there only (its step is often not finite too", "bit for bit", "optimizer:promise/counts_each_frame_once"),
    _p("frame-independent-of-batch", "torch_impl.StiefelAdam.step torch_impl.stiefel_adam_step.W", FUNC,
       "a frame's result must not\n    # depend on the other frames of its batch", "bit for bit", "optimizer:promise/joined_states_with_gap"),
    _p("class-is-kernel", "torch_impl.StiefelAdam.retraction_method torch_impl.StiefelAdam.trust_radius torch_impl.StiefelAdam.skip_nonfinite",
       OPT, "`torch_impl.functional.stiefel_adam_step`. Its state is", "bit for bit", "optimizer:promise/class_is_kernel"),
    _p("tolerance-decides", "torch_impl.manifold_tolerance.d torch_impl.manifold_tolerance.r torch_impl.manifold_tolerance.dtype", ALGO,
       "32 d r u_c + 4 sqrt(r) u_s", "refused", "optimizer:promise/tolerance_decides"),
    _p("refusal-names-named-parameter", "torch_impl.StiefelAdam.params", "README.md",
       "pairs such as `model.named_parameters()`, by its name too", "refused", "optimizer:promise/named_refusal"),
    _p("zero-grad-as-torch", "torch_impl.StiefelAdam.zero_grad torch_impl.StiefelAdam.zero_grad.set_to_none", OPT,
       "As torch.optim.Optimizer.zero_grad", "bit for bit", "optimizer:promise/zero_grad_sets_none"),
    _p("class-refuses-options", "torch_impl.StiefelAdam.options torch_impl.StiefelAdam.add_param_group "
       "torch_impl.StiefelAdam.add_param_group.param_group",
       OPT, "are accepted only with the value that asks for nothing; any other raises", "refused",
       "optimizer:bad_options_refused optimizer:benign_options_accepted"),
    _p("lr-tensor-bit-for-bit", "torch_impl.StiefelAdam.lr torch_impl.StiefelAdam.eps", ALGO,
       "A tensor gives the step of the number of the same\nvalue bit for bit", "bit for bit", "optimizer:promise/lr_tensor_bit_for_bit"),
    _p("meta-parameter-refused", "torch_impl.StiefelAdam.params", ALGO, "a step over a parameter still on the meta device raises a\nValueError",
       "refused", "optimizer:promise/meta_parameter_refused"),
    _p("state-on-parameter-device", "torch_impl.StiefelAdam.params torch_impl.stiefel_init_.tensor", ALGO,
       "is made on its parameter's device, never on torch's default device", "bit for bit",
       "optimizer:promise/state_on_parameter_device"),
    _p("benign-option-equal-value", "torch_impl.StiefelAdam.options", ALGO, "or a value equal to it (`amsgrad=0`", "refused",
       "optimizer:benign_options_accepted"),
    _p("route-test-as-documented", "torch_impl.stiefel_adam_step.G torch_impl.stiefel_adam_step.sync_free", FUNC,
       "put into the sharper form of the test", "bit for bit", "optimizer:promise/route_test_as_documented"),
    _p("drift-bound-as-derived", "torch_impl.stiefel_adam_step.trust_radius torch_impl.stiefel_adam_step.W", FUNC,
       "Bound on ||W^T W - I||_F for a frame that this kernel returned", "bound", "optimizer:promise/derived_constants"),
    _p("newton-schulz-count", "torch_impl.stiefel_adam_step.trust_radius torch_impl.polar_retract.trust_radius", FUNC,
       "Quintic iterations that bring every eigenvalue of X^T X to 1 within unit_roundoff(dtype)", "bound",
       "optimizer:promise/derived_constants"),
    _p("edge-inputs", "torch_impl.clip_grad_norm_finite_.parameters torch_impl.polar_retract.W torch_impl.stiefel_adam_step.t", CLIP,
       "0 where no unit is finite or there is no gradient", "bit for bit", "optimizer:promise/edge_inputs"),
    # ---- public functions of torch_impl
    _p("clip-finite-units", "torch_impl.clip_grad_norm_finite_.parameters torch_impl.clip_grad_norm_finite_.max_norm", CLIP,
       "Scale the finite gradients so that their total norm is at most max_norm", "bound",
       "optimizer:*/clip_grad_norm_finite optimizer:clip_grad_norm_finite_other_groups"),
    _p("clip-matches-torch", "torch_impl.clip_grad_norm_finite_.norm_type torch_impl.clip_grad_norm_finite_.parameters", CLIP,
       "the total that torch.nn.utils.clip_grad_norm_ computes when every unit is finite", "bound", "optimizer:promise/clip_matches_torch"),
    _p("clip-total-dtype", "torch_impl.clip_grad_norm_finite_.parameters", CLIP, "float64 if any gradient is float64, else float32", "bit for bit",
       "optimizer:promise/clip_total_dtype"),
    _p("init-haar", "torch_impl.stiefel_init_.tensor torch_impl.stiefel_init_.generator", OPT, "in place with Haar-random frames", "bound",
       "samplers:stiefel_init_* optimizer:stiefel_init_reproducible"),
    _p("project-nearest", "torch_impl.stiefel_project_.tensor", OPT, "by its polar factor U V^T", "bound", "optimizer:*/stiefel_project"),
    _p("tolerance", "torch_impl.manifold_tolerance.d torch_impl.manifold_tolerance.r torch_impl.manifold_tolerance.dtype", OPT,
       "Largest accepted ||W^T W - I_r||_F for a frame of shape (d, r) stored in dtype", "refused", "optimizer:bad_options_refused"),
    _p("kernel-step", "torch_impl.stiefel_adam_step.W torch_impl.stiefel_adam_step.G torch_impl.stiefel_adam_step.m "
       "torch_impl.stiefel_adam_step.v torch_impl.stiefel_adam_step.t torch_impl.stiefel_adam_step.lr torch_impl.stiefel_adam_step.beta1 "
       "torch_impl.stiefel_adam_step.beta2 torch_impl.stiefel_adam_step.eps torch_impl.stiefel_adam_step.trust_radius "
       "torch_impl.stiefel_adam_step.weight_decay torch_impl.stiefel_adam_step.retraction_method", FUNC,
       "One StiefelAdam step (docs/algorithm.md) for frames W", "bound",
       "crosscheck:frame crosscheck:first_moment crosscheck:second_moment crosscheck:*/frame crosscheck:*/first_moment crosscheck:*/second_moment "
       "crosscheck:*/frame_rounding crosscheck:input_frames crosscheck:*/input_frames crosscheck:stage_bounds_hold crosscheck:drift_correction "
       "crosscheck:long_run_feasibility crosscheck:P4_left crosscheck:P4_right"),
    _p("kernel-scale-free-bitwise", "torch_impl.stiefel_adam_step.G", "docs/claims.md",
       "bit-identical wherever\nthe predicted domain says every stage quantity is normal and finite", "bit for bit",
       "crosscheck:P2_bitwise crosscheck:*/P2_exponent_range"),
    _p("kernel-scale-free", "torch_impl.stiefel_adam_step.G", "docs/claims.md", "P2 and P4 on the kernel", "bound",
       "crosscheck:P2_bounded crosscheck:*/P2_subnormal_band"),
    _p("sync-free-bit-for-bit", "torch_impl.stiefel_adam_step.sync_free", FUNC, "the values are the same bit for bit", "bit for bit",
       "optimizer:promise/sync_free_bit_for_bit"),
    _p("kernel-functions", "torch_impl.polar_factor.A torch_impl.polar_factor.trust_radius torch_impl.polar_factor.method "
       "torch_impl.project_tangent.W torch_impl.project_tangent.G torch_impl.feasibility.W", "docs/claims.md",
       "`torch_impl.stiefel_adam_step`, `polar_factor`, `project_tangent`, `feasibility`", "bound",
       "crosscheck:stage_bounds_hold crosscheck:long_run_feasibility"),
    _p("polar-retract", "torch_impl.polar_retract.W torch_impl.polar_retract.xi torch_impl.polar_retract.trust_radius torch_impl.polar_retract.method",
       FUNC, "polar(W + xi) from the actual Gram matrix", "bound", "projection:polar_retract projection:polar_retract_refuses"),
    _p("declared-precision", "torch_impl.declared_precision.dtype", FUNC, "How this kernel evaluates the step for frames stored in `dtype`, stage by stage",
       "bound", "crosscheck:stage_bounds_hold"),
    # ---- reference_impl: the step and its claims
    _p("reference-step", "reference_impl.step.W reference_impl.step.G reference_impl.step.state reference_impl.step.config reference_impl.init.W "
       "reference_impl.StiefelAdamState.m reference_impl.StiefelAdamState.v reference_impl.StiefelAdamState.t "
       "reference_impl.step_with_direction.W reference_impl.step_with_direction.G reference_impl.step_with_direction.state "
       "reference_impl.step_with_direction.config reference_impl.run_trajectory.W reference_impl.run_trajectory.gradients "
       "reference_impl.run_trajectory.config reference_impl.run_trajectory.state reference_impl.run_trajectory.step_fn "
       "reference_impl.StiefelAdamConfig.lr reference_impl.StiefelAdamConfig.betas reference_impl.StiefelAdamConfig.eps "
       "reference_impl.StiefelAdamConfig.trust_radius reference_impl.StiefelAdamConfig.weight_decay", ADAM,
       "One StiefelAdam step (docs/algorithm.md). Returns (W_new, state_new); inputs unchanged.", "bound",
       "P[1-5]:trajectory_model_* P3:model_highprec P3:trajectory_highprec* P3:direction_matches_state* P3:state_stays_tangent* "
       "P3:step_stays_tangent* P3:step_reconstruction* P3:long_run_feasibility*"),
    _p("P1-steepest-descent", "reference_impl.project_tangent.W reference_impl.project_tangent.G reference_impl.project_tangent.validate "
       "reference_impl.sym.A reference_impl.skew.A reference_impl.riemannian_gradient.W reference_impl.riemannian_gradient.G "
       "reference_impl.riemannian_gradient.weight_decay reference_impl.riemannian_gradient.variant", MAN,
       "Orthogonal projection P_W(G) = G - W sym(W^T G) onto T_W St(d, r).", "bound",
       "P1:projector_* P1:exact:exact_* P1:first_step_is_steepest_descent* P1:minimiser_independent_basis P1:minimum_gap_identity "
       "P1:slope_* P1:tangent_basis_dimension"),
    _p("P2-scale-free", "reference_impl.scale_free_direction.m_hat reference_impl.scale_free_direction.v_hat "
       "reference_impl.scale_free_direction.lr reference_impl.scale_free_direction.eps", ADAM, "and 0 where v^ = 0 (never 0/0)", "bound",
       "P2:trajectory_scale_invariance* P2:eps_deviation P2:exact:scaled_projection_rational"),
    _p("P2-powers-of-two-bitwise", "reference_impl.step.G", "docs/claims.md", "For c a power of two the float64 trajectories are bit-identical",
       "bit for bit", "P2:power_of_two_bitwise P2:power_of_two_moments_bitwise"),
    _p("P3-conditioning", "reference_impl.clip_to_trust_region.xi reference_impl.clip_to_trust_region.trust_radius reference_impl.frobenius.A "
       "reference_impl.polar_retract.W reference_impl.polar_retract.xi reference_impl.polar_retract.method reference_impl.polar_retract.validate "
       "reference_impl.polar_factor.A reference_impl.retraction_agreement.W reference_impl.retraction_agreement.xi "
       "reference_impl.feasibility.W reference_impl.feasibility.validate", ADAM, "for frames with ||xi||_F > Delta; others unchanged.", "bound",
       "P3:condition_number_bound P3:gram_identity P3:exact:exact_* P3:preconditioner_spread* P3:rank_one_attains_bound P3:retraction_vs_highprec "
       "P3:singular_values_in_range P3:step_conditioning*"),
    _p("P4-equivariance", "reference_impl.random_signed_permutation.n reference_impl.random_signed_permutation.rng "
       "reference_impl.random_signed_permutation.batch reference_impl.random_orthogonal.n reference_impl.random_orthogonal.rng "
       "reference_impl.random_orthogonal.batch", MAN, "orthogonal and exact in float64", "bound",
       "P4:left_* P4:right_* P4:sign_flip_* P4:exact:left_projection_rational P4:exact:norm_invariance_rational "
       "P4:exact:right_projection_rational"),
    _p("P5-weight-decay", "reference_impl.StiefelAdamConfig.weight_decay", "docs/claims.md", "## P5: weight decay has identically zero Riemannian gradient",
       "bound", "P5:decay_projection_zero P5:decoupled_decay_polar P5:norm_constant P5:step_weight_decay_invariance "
       "P5:trajectory_weight_decay_invariance P5:gradient_weight_decay_invariance P5:direction_weight_decay_invariance "
       "P5:exact:decay_projection_zero P5:exact:decoupled_decay_polar P5:exact:norm_constant "
       "P5:exact:step_weight_decay_invariance"),
    _p("P6-gauge", "reference_impl.random_tangent.W reference_impl.random_tangent.rng reference_impl.random_tangent.scale", "docs/claims.md",
       "## P6 (negative result): gauge directions carry no gradient", "bound",
       "P6:finite_difference_gradient P6:gauge_inner_product P6:gauge_residual P6:exact:anchored_query_loss_nonzero P6:exact:gauge_inner_product "
       "P6:exact:gauge_residual"),
    _p("projection-nearest", "reference_impl.project_to_manifold.A", MAN, "Nearest frame to A in the Frobenius norm: its polar factor.", "bound",
       "projection:on_manifold projection:polar_symmetry projection:polar_factor projection:idempotent projection:equivariance projection:scale_free"),
    _p("samplers-haar", "reference_impl.random_point.d reference_impl.random_point.r reference_impl.random_point.rng reference_impl.random_point.batch "
       "reference_impl.haar_from_gaussian.Z reference_impl.manifold_tolerance.d reference_impl.manifold_tolerance.r", MAN,
       "Haar-random frames, shape batch + (d, r), float64.", "bound",
       "samplers:corner_sign_product samplers:det_sign samplers:first_entry_* samplers:last_entry_beta samplers:orthonormality "
       "samplers:so3_rotation_angle"),
    _p("polar-retract-nonfinite", "torch_impl.polar_retract.xi", FUNC, "frame whose Gram matrix is not finite comes back NaN in every entry",
       "bit for bit", "projection:polar_retract_nonfinite_isolated"),
    _p("feasibility-frobenius", "reference_impl.feasibility.W", MAN, "||W^T W - I_r||_F for each frame", "bound",
       "projection:feasibility_is_frobenius"),
    _p("manifold-check-tolerance", "reference_impl.manifold_tolerance.d reference_impl.manifold_tolerance.r", "reference_impl/_validation.py",
       "Largest accepted ||W^T W - I_r||_F for a float64 frame of shape (d, r)", "refused", "projection:manifold_check_at_tolerance"),
    _p("variants-are-controls", "reference_impl.Variant.name reference_impl.Variant.description reference_impl.Variant.breaks "
       "reference_impl.Variant.init reference_impl.Variant.step reference_impl.Variant.step_with_direction reference_impl.get_variant.name",
       "reference_impl/controls.py", "An optimizer behind the interface of `reference_impl.step`.", "bound", "P1:trajectory_model_W*"),
)


def public_parameters() -> list[str]:
    """Every public callable of torch_impl and reference_impl (their __all__, and StiefelAdam's public
    methods and properties) and every parameter of its signature, as "module.callable[.method].parameter"
    (a callable without parameters by its own name)."""
    import inspect

    import reference_impl
    import torch_impl

    found = []

    def add(prefix: str, function) -> None:
        try:
            parameters = [name for name in inspect.signature(function).parameters if name != "self"]
        except (TypeError, ValueError):
            parameters = []
        found.extend(f"{prefix}.{name}" for name in parameters) if parameters else found.append(prefix)

    for module in (torch_impl, reference_impl):
        for name in module.__all__:
            obj = getattr(module, name)
            if inspect.ismodule(obj) or not callable(obj):
                continue
            add(f"{module.__name__}.{name}", obj)
            if name == "StiefelAdam":
                for member, value in vars(obj).items():
                    if member.startswith("_"):
                        continue
                    if isinstance(value, property):
                        found.append(f"torch_impl.StiefelAdam.{member}")
                    elif callable(value):
                        add(f"torch_impl.StiefelAdam.{member}", value)
    return found


def check_names(certificate: dict) -> list[str]:
    """The names a promise's patterns match in one certificate: its numerical checks, and its exact
    checks as "exact:NAME"."""
    return [c["name"] for c in certificate["numerical"]["checks"]] + [f"exact:{e['name']}" for e in certificate.get("exact", [])]


def matches(pattern: str, claim_id: str, names) -> list[str]:
    """The names of `names` (of claim_id's certificate) that a promise's "CLAIM:PATTERN" matches."""
    claim, _, name_pattern = pattern.partition(":")
    if not fnmatch.fnmatchcase(claim_id, claim):
        return []
    return [name for name in names if fnmatch.fnmatchcase(name, name_pattern)]


def coverage(claim_id: str, checks: list[dict], exact: list[dict]) -> tuple[dict, list[str]]:
    """The promises of `claim_id` and their coverage in one run ({promise id: {"strength", "checks",
    "samples"}}), and a reason for each promise none of whose checks compared anything."""
    samples = {c["name"]: int(c.get("samples", 0)) for c in checks}
    samples.update({f"exact:{e['name']}": int(e.get("samples", 1) or 1) for e in exact})
    table, reasons = {}, []
    for promise in PROMISES:
        patterns = [p for p in promise.checks if fnmatch.fnmatchcase(claim_id, p.partition(":")[0])]
        if not patterns:
            continue
        matched = sorted({name for p in patterns for name in matches(p, claim_id, samples)})
        total = sum(samples[name] for name in matched)
        table[promise.id] = {"strength": promise.strength, "checks": matched, "samples": total}
        if total == 0:
            reasons.append(f"promise {promise.id} ({promise.strength}) has zero coverage: none of its checks ({', '.join(patterns)}) compared anything")
    return table, reasons


__all__ = ["PROMISES", "STRENGTHS", "Promise", "check_names", "coverage", "matches", "public_parameters"]
