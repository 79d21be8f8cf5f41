#!/usr/bin/env bash
# GPU kit (3), on the GPU machine: the training-step benchmark, wiola-360m at
# T = 2048 (wiola_gpu_bench: bf16 and fp32), then the PyTorch baseline of the
# same model in the same run (bench/torch_gpu_step.py: bf16 eager, then
# torch.compile if it compiles within the time left). Writes $OUT/bench.json
# (all figures and the wiola/PyTorch ratios) and $OUT/bench.log. Extra
# arguments go to wiola_gpu_bench (--help lists them). KIT_TORCH_COMPILE=0
# skips the torch.compile baseline (up to 4 of the session's device minutes),
# KIT_ROWS=0 the row-attention run, KIT_BWD2=0 the run with the second form
# of the attention backward (WIOLA_CUDA_ATTENTION_BWD=v2).
set -uo pipefail
cd "$(dirname "$0")/../.."
. tests/gpu/kit_env.sh
"$kit_bin/wiola_gpu_bench" --json "$OUT/wiola_bench.json" "$@" 2>&1 | tee "$OUT/bench.log"
rc=${PIPESTATUS[0]}
# bf16 again with the row attention kernel instead of the tensor-core forward
# (KIT_ROWS=0 skips it).
if [ "${KIT_ROWS:-1}" != 0 ]; then
  echo "wiola bf16 with WIOLA_CUDA_ATTENTION=rows:" | tee -a "$OUT/bench.log"
  WIOLA_CUDA_ATTENTION=rows timeout 120 "$kit_bin/wiola_gpu_bench" --precision bf16 \
    --json "$OUT/wiola_bench_rows.json" "$@" 2>&1 | tee -a "$OUT/bench.log"
fi
# bf16 again with the second form of the tensor-core backward
# (WIOLA_CUDA_ATTENTION_BWD=v2, not yet measured; KIT_BWD2=0 skips it).
if [ "${KIT_BWD2:-1}" != 0 ]; then
  echo "wiola bf16 with WIOLA_CUDA_ATTENTION_BWD=v2:" | tee -a "$OUT/bench.log"
  bwd2_args=("$@")
  [[ " $* " == *" --precision "* ]] || bwd2_args+=(--precision bf16)
  WIOLA_CUDA_ATTENTION_BWD=v2 timeout 120 "$kit_bin/wiola_gpu_bench" --json "$OUT/wiola_bench_bwd2.json" \
    "${bwd2_args[@]}" 2>&1 | tee -a "$OUT/bench.log"
fi
py=$(command -v python3)
args=(--device cuda --dtype bf16 --d 1024 --L 16 --H 16 --Hkv 4 --dA 1024 --dB 4096 --V 32000 --T 2048 --B 4)
echo "PyTorch baseline (eager):" | tee -a "$OUT/bench.log"
timeout 180 "$py" bench/torch_gpu_step.py "${args[@]}" 2>>"$OUT/bench.log" | tail -1 > "$OUT/torch_eager.json"
cat "$OUT/torch_eager.json" | tee -a "$OUT/bench.log"
if [ "${KIT_TORCH_COMPILE:-1}" != 0 ]; then
  echo "PyTorch baseline (torch.compile):" | tee -a "$OUT/bench.log"
  timeout 240 "$py" bench/torch_gpu_step.py "${args[@]}" --compile 2>>"$OUT/bench.log" | tail -1 > "$OUT/torch_compile.json"
  cat "$OUT/torch_compile.json" | tee -a "$OUT/bench.log"
else
  echo '{"skipped": "KIT_TORCH_COMPILE=0"}' > "$OUT/torch_compile.json"
fi
"$py" - "$OUT" <<'PY' | tee -a "$OUT/bench.log"
import json, os, sys
out = sys.argv[1]
def load(name):
    try:
        with open(os.path.join(out, name)) as f:
            return json.loads(f.read().strip() or "null")
    except Exception as e:  # a run that failed or timed out
        return {"error": str(e)}
r = {"wiola": load("wiola_bench.json"), "wiola_rows_attention": load("wiola_bench_rows.json"),
     "wiola_bwd_v2": load("wiola_bench_bwd2.json"),
     "torch_eager": load("torch_eager.json"),
     "torch_compile": load("torch_compile.json")}
w = (r["wiola"] or {}).get("bf16", {}).get("tokens_per_s")
for k in ("torch_eager", "torch_compile"):
    t = (r[k] or {}).get("tokens_per_s")
    if w and t:
        r[f"ratio_vs_{k}"] = round(w / t, 3)
w2 = (r["wiola_bwd_v2"] or {}).get("bf16", {}).get("tokens_per_s")
if w and w2:
    r["ratio_bwd_v2_vs_v1"] = round(w2 / w, 3)
with open(os.path.join(out, "bench.json"), "w") as f:
    json.dump(r, f, indent=2)
print(json.dumps({k: v for k, v in r.items() if k.startswith("ratio")}))
PY
exit "$rc"
