"""Bugs in the optimizer class and the public functions, written into a copy of their source the way
they were found in the wild (each passed the scripted scenario the optimizer claim used to run):
the drawn scenarios of the claim `optimizer` and the sampler certificate must fail on each, with a
fail verdict (a check's residual above its bound), never an error of the claim's own code, and a
failing run of the class shrinks to a short one."""

import pytest

pytest.importorskip("torch")

from planted import planted  # noqa: E402
from propositions import get_profile, samplers  # noqa: E402
from propositions.kit.protocol import Context  # noqa: E402
from propositions.optimizer_class import dtype_part, refusal_part  # noqa: E402

QUICK = get_profile("quick")


def _fails(evidence) -> list[str]:
    return [check.name for check in evidence.checks if check.samples and not check.passed]


def _class_bug(monkeypatch, old, new):
    planted(monkeypatch, "torch_impl.optimizer", old, new, "StiefelAdam")


def test_a_euclidean_group_skipped_by_one_flag_fails(monkeypatch):
    """One NaN tensor freezes every tensor of its euclidean group: the flag is the group's, not the tensor's."""
    _class_bug(monkeypatch, "                finite = torch.isfinite(grad).all()\n",
               "                finite = torch.stack([torch.isfinite(g).all() for g in grads]).all()\n")
    evidence = dtype_part("float64", Context(0, QUICK))
    assert "float64/euclidean_is_adamw" in _fails(evidence)
    found = evidence.extra["counterexample_float64"]
    assert found["found"] and len(found["replay"]["scenario"]["ops"]) <= 3, found["summary"]


def test_a_nan_frame_that_stops_the_later_frames_of_its_call_fails(monkeypatch):
    """'finite so far': the first non-finite frame of a batched call keeps every frame after it."""
    _class_bug(monkeypatch, "        stepped = finite & on_manifold\n",
               "        stepped = torch.cumprod((finite & on_manifold).to(torch.int64), 0).to(torch.bool)\n")
    evidence = dtype_part("float32", Context(0, QUICK))
    assert set(_fails(evidence)) & {"float32/step_count", "float32/frame", "float32/nonfinite_frame_untouched"}
    assert evidence.extra["counterexample_float32"]["found"]


def test_an_older_checkpoint_that_raises_on_the_next_step_fails(monkeypatch):
    """The older format's int count loaded as it is (an int where a tensor per frame is expected)."""
    _class_bug(monkeypatch, "                    count = value if torch.is_tensor(value) else torch.tensor(float(value))\n"
                            "                    state[key] = count.to(device=p.device, dtype=torch.float64, copy=True).expand(p.shape[:-2]).clone()\n",
               "                    state[key] = value if not torch.is_tensor(value) else value.to(device=p.device, dtype=torch.float64, copy=True)\n")
    evidence = dtype_part("bfloat16", Context(0, QUICK))
    assert set(_fails(evidence)) & {"bfloat16/scenario_completes", "bfloat16/checkpoint_round_trip"}
    found = evidence.extra["counterexample_bfloat16"]
    assert any(op["kind"] == "checkpoint" and op["option"] == "old_format" for op in found["replay"]["scenario"]["ops"])


def test_amsgrad_accepted_silently_in_a_param_group_fails(monkeypatch):
    _class_bug(monkeypatch, '        _check_foreign_options(param_group, f"param group {index}", unknown_ok=True)\n',
               '        _check_foreign_options({k: v for k, v in param_group.items() if k not in FOREIGN_OPTIONS}, f"param group {index}", unknown_ok=True)\n')
    assert "bad_options_refused" in _fails(refusal_part(Context(0, QUICK)))


def test_stiefel_init_by_qr_without_the_sign_fix_fails(monkeypatch):
    planted(monkeypatch, "torch_impl.optimizer",
            "    U, _, Vh = torch.linalg.svd(gaussian, full_matrices=False)\n    tensor.copy_((U @ Vh).to(tensor.dtype))\n",
            "    tensor.copy_(torch.linalg.qr(gaussian)[0].to(tensor.dtype))\n", "stiefel_init_")
    evidence = samplers.run_tests("stiefel_init_bfloat16", 0, samplers.CONTROL_SAMPLES, prefix="x:")
    assert any(name.endswith("sign") or name.endswith("sign_product") for name in _fails(evidence))


def test_a_tensor_without_gradient_that_stops_the_rest_of_its_euclidean_group_fails(monkeypatch):
    _class_bug(monkeypatch, "            if p.grad is None:\n                continue\n            if p.grad.is_sparse:\n"
                            "                raise ValueError(f\"{_parameter_name(group, index, group_index)}: StiefelAdam does not support sparse gradients\")\n"
                            "            state = self.state[p]\n",
               "            if p.grad is None:\n                break\n            if p.grad.is_sparse:\n"
               "                raise ValueError(f\"{_parameter_name(group, index, group_index)}: StiefelAdam does not support sparse gradients\")\n"
               "            state = self.state[p]\n")
    assert "float32/euclidean_is_adamw" in _fails(dtype_part("float32", Context(1, QUICK)))


def test_a_joined_view_that_ignores_a_gap_between_states_fails(monkeypatch):
    """The no-copy join of states that lie in one buffer, without its offset test: a parameter
    without a gradient between two that have one gets their state."""
    _class_bug(monkeypatch, "                or x.storage_offset() != offset + total):", "                ):")
    assert set(_fails(dtype_part("float64", Context(2, QUICK)))) & {"float64/step_count", "float64/frame", "float64/no_gradient_untouched"}


def test_the_settings_of_a_euclidean_group_left_unchecked_fail(monkeypatch):
    _class_bug(monkeypatch, "        _check_hyperparameters(group[\"lr\"], group[\"betas\"], group[\"eps\"], group[\"trust_radius\"], group[\"weight_decay\"])\n",
               "        if group[\"manifold\"] == \"stiefel\":\n"
               "            _check_hyperparameters(group[\"lr\"], group[\"betas\"], group[\"eps\"], group[\"trust_radius\"], group[\"weight_decay\"])\n")
    assert "bad_options_refused" in _fails(refusal_part(Context(0, QUICK)))


def test_a_closure_evaluated_twice_fails(monkeypatch):
    """A second forward and backward in step(closure): a deterministic closure returns an equal loss
    and leaves equal gradients, so only the number of calls shows it."""
    _class_bug(monkeypatch, "            with torch.enable_grad():\n                loss = closure()\n",
               "            with torch.enable_grad():\n                loss = closure()\n                loss = closure()\n")
    assert "float64/closure_loss" in _fails(dtype_part("float64", Context(0, QUICK)))
