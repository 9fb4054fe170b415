#!/usr/bin/env bash
# The CUDA checks of torch_impl, in one run of under 6 minutes on one GPU:
#   1. the cross-check (torch kernel against reference_impl, P2, P4, long-run feasibility, controls)
#      on cuda in float64, float32 and bfloat16, profile "default" (quick with QUICK=1);
#   2. the claim "optimizer" (the StiefelAdam class: groups, counts, skipping, resume, AdamW group)
#      on cuda, its three dtypes and its controls;
#   3. no host synchronisation: StiefelAdam.step with skip_nonfinite=True under
#      torch.cuda.set_sync_debug_mode("error") (a synchronising call raises);
#   4. the step benchmark (bench_step.py: geoopt, AdamW, the roofline, the cost of the frame check)
#      at geoopt's (20, 10) and the three larger shapes in float32, with the compiled step, and at
#      the two large shapes in float64; bench_optimizer.py (twelve parameters against one, with
#      separate tensors and as slices of one storage; compiled against eager) at (12, 768, 64).
# Results go to ${OUT:-gpu_check_out}/: one JSON per dtype, the benchmark table, a log.
# Usage: benchmarks/gpu_check.sh            (from the repository root; PYTHON overrides the interpreter)
set -euo pipefail

cd "$(dirname "$0")/.."
PYTHON="${PYTHON:-python}"
OUT_DIR="${OUT:-gpu_check_out}"
PROFILE="default"
if [[ "${QUICK:-0}" == "1" ]]; then PROFILE="quick"; fi
mkdir -p "$OUT_DIR"

"$PYTHON" - <<'EOF'
import torch
if not torch.cuda.is_available():
    raise SystemExit("gpu_check.sh: torch.cuda.is_available() is False; nothing to check")
print("torch", torch.__version__, "cuda", torch.version.cuda, "device", torch.cuda.get_device_name(0))
EOF

status=0
for dtype in float64 float32 bfloat16; do
  echo "== crosscheck on cuda, $dtype, profile $PROFILE"
  timeout 120 "$PYTHON" - "$dtype" "$PROFILE" "$OUT_DIR" <<'EOF' || status=1
import json, sys, time
from propositions.crosscheck import CLAIM
dtype, profile, out = sys.argv[1], sys.argv[2], sys.argv[3]
start = time.perf_counter()
result = CLAIM.run(seed=0, profile=profile, device="cuda", dtype=dtype)
data = result.to_dict()
data["seconds"] = time.perf_counter() - start
with open(f"{out}/crosscheck_cuda_{dtype}.json", "w") as handle:
    json.dump(data, handle, indent=1)
print(f"verdict {result.verdict} in {data['seconds']:.1f} s; failures: {result.failures()}")
for check in data["numerical"]["checks"]:
    print(f"  {check['name']:22s} samples {check['samples']:6d}  max residual {check['residual']['max']:.3e}  max residual/bound {check['max_ratio']:.3e}")
for control in data["controls"]:
    print(f"  control {control['name']}: margin {control['margin']}, detected {control['detected']}")
for run_dtype, run in data["extra"]["long_run"].items():
    print(f"  long run {run_dtype}: ||W^T W - I|| = {run['feasibility_max'][-1]:.2e} after {run['steps'][-1]} steps "
          f"(bound {run['bound']:.2e}), {run['microseconds_per_step']:.0f} us/step")
sys.exit(0 if result.verdict == "pass" else 1)
EOF
done

echo "== the optimizer class on cuda, profile $PROFILE"
timeout 120 "$PYTHON" - "$PROFILE" "$OUT_DIR" "${DEVICE:-cuda}" <<'EOF' || status=1
import json, sys, time
from propositions._common import get_profile
from propositions.optimizer_class import CLAIM
profile, out, device = sys.argv[1], sys.argv[2], sys.argv[3]
start = time.perf_counter()
result = CLAIM.run(seed=0, profile=get_profile(profile), device=device)
data = result.to_dict()
data["seconds"] = time.perf_counter() - start
with open(f"{out}/optimizer_{device}.json", "w") as handle:
    json.dump(data, handle, indent=1)
print(f"verdict {result.verdict} in {data['seconds']:.1f} s; failures: {result.failures()}")
for check in data["numerical"]["checks"]:
    print(f"  {check['name']:34s} samples {check['samples']:5d}  max residual/bound {check['max_ratio']:.3e}")
for control in data["controls"]:
    print(f"  control {control['name']}: margin {control['margin']}, detected {control['detected']}")
sys.exit(0 if result.verdict == "pass" else 1)
EOF

echo "== no host synchronisation in StiefelAdam.step (skip_nonfinite=True)"
timeout 120 "$PYTHON" - <<'EOF' || status=1
import torch
from torch_impl import StiefelAdam, stiefel_init_
generator = torch.Generator(device="cuda").manual_seed(0)
frames = [torch.nn.Parameter(stiefel_init_(torch.empty(12, 768, 64, device="cuda"))) for _ in range(2)]
linear = torch.nn.Linear(768, 768, device="cuda")
optimizer = StiefelAdam([{"params": frames}, {"params": linear.parameters(), "manifold": "euclidean", "skip_nonfinite": False}],
                        lr=1e-3, skip_nonfinite=True)
for p in frames + list(linear.parameters()):
    p.grad = torch.randn(p.shape, device="cuda", generator=generator)
frames[0].grad[3, 0, 0] = float("nan")
optimizer.step()  # the first step allocates the state
torch.cuda.synchronize()
torch.cuda.set_sync_debug_mode("error")
try:
    for _ in range(3):
        optimizer.step()
finally:
    torch.cuda.set_sync_debug_mode(0)
torch.cuda.synchronize()
print(f"3 steps of 2 x (12, 768, 64) frames and an AdamW group with no host synchronisation; skipped frames: {optimizer.skipped_steps}")
EOF

echo "== step benchmark on cuda"
timeout 240 "$PYTHON" benchmarks/bench_step.py --device cuda --shapes 1,20,10 8,256,32 12,768,64 32,1024,128 \
  --dtype float32 --min-time 0.3 --compiled --out "$OUT_DIR/bench_cuda_float32.md" || status=1
timeout 120 "$PYTHON" benchmarks/bench_step.py --device cuda --shapes 12,768,64 32,1024,128 \
  --dtype float64 --min-time 0.5 --out "$OUT_DIR/bench_cuda_float64.md" || status=1
timeout 150 "$PYTHON" benchmarks/bench_optimizer.py --device cuda --rounds 5 --min-time 0.3 \
  --out "$OUT_DIR/bench_optimizer_cuda.md" || status=1

exit $status
