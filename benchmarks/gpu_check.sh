#!/usr/bin/env bash
# The CUDA checks of torch_impl, in one run of under 5 minutes on one GPU:
#   1. the cross-check (torch kernel against reference_impl, P2, P4, long-run feasibility, controls)
#      on cuda in float64, float32 and bfloat16, profile "default" (quick with QUICK=1);
#   2. the step benchmark at the two large shapes, float32 and float64.
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
    print(f"  control {control['name']}: margin {control['margin']:.3g}, detected {control['detected']}")
for run_dtype, run in data["extra"]["long_run"].items():
    print(f"  long run {run_dtype}: ||W^T W - I|| = {run['feasibility_max'][-1]:.2e} after {run['steps'][-1]} steps "
          f"(bound {run['bound']:.2e}), {run['microseconds_per_step']:.0f} us/step")
sys.exit(0 if result.verdict == "pass" else 1)
EOF
done

echo "== step benchmark on cuda, large shapes"
for dtype in float32 float64; do
  timeout 120 "$PYTHON" benchmarks/bench_step.py --device cuda --shapes 12,768,64 32,1024,128 \
    --dtype "$dtype" --min-time 0.5 --out "$OUT_DIR/bench_cuda_$dtype.md" || status=1
done

exit $status
