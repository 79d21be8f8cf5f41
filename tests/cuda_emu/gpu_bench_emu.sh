#!/usr/bin/env bash
# The GPU kit's step benchmark on the CUDA emulator (ctest gpu_bench_emu):
# wiola-tiny at T = 64, bf16 and fp32, then bf16 with activation recompute,
# then bf16 with kit_bench.sh's "new" variant (FlashAttention-2 style
# attention where the head dimension allows, GEMMs tuned per shape), then
# bf16 with CUDA Graphs (--cuda-graphs layers: the same loss, bit for bit).
# Checks the JSON that tests/gpu/kit_bench.sh reads: every figure present,
# losses finite, and bf16 within 1 % of fp32 (same initialisation and data).
# usage: gpu_bench_emu.sh <wiola_gpu_bench_emu> <python> <work dir>
set -euo pipefail
bench=$1 py=$2 dir=$3
mkdir -p "$dir"
"$bench" --preset wiola-tiny --batch 1 --seq-len 64 --steps 1 --warmup 1 --precision both --json "$dir/both.json"
"$bench" --preset wiola-tiny --batch 1 --seq-len 64 --steps 1 --warmup 1 --precision bf16 --recompute \
  --json "$dir/recompute.json"
"$bench" --preset wiola-tiny --batch 1 --seq-len 64 --steps 1 --warmup 1 --precision bf16 \
  --attention fa2 --attention-bwd fa2 --gemm auto --json "$dir/new.json"
"$bench" --preset wiola-tiny --batch 1 --seq-len 64 --steps 1 --warmup 1 --precision bf16 --cuda-graphs layers \
  --json "$dir/graphs.json"
"$py" - "$dir/both.json" "$dir/recompute.json" "$dir/new.json" "$dir/graphs.json" <<'PY'
import json, math, sys
both, rec, new, graphs = (json.load(open(p)) for p in sys.argv[1:5])
keys = ["loss", "mfu", "op_class_ms", "peak_gib", "step_ms", "tflops", "tokens_per_s"]
for name, run in [("bf16", both["bf16"]), ("fp32", both["fp32"]), ("bf16 recompute", rec["bf16"]),
                  ("bf16 new variant", new["bf16"])]:
    missing = [k for k in keys if k not in run]
    assert not missing, f"{name}: missing {missing}"
    assert math.isfinite(run["loss"]) and run["tokens_per_s"] > 0 and run["step_ms"] > 0, f"{name}: {run}"
rel = abs(both["bf16"]["loss"] - both["fp32"]["loss"]) / both["fp32"]["loss"]
assert rel < 0.01, f"bf16 loss {both['bf16']['loss']} vs fp32 {both['fp32']['loss']}"
assert rec["recompute"] and abs(rec["bf16"]["loss"] - both["bf16"]["loss"]) < 1e-6 * both["bf16"]["loss"], \
    f"recompute changed the loss: {rec['bf16']['loss']} vs {both['bf16']['loss']}"
assert new["backend_options"] == {"attention": "fa2", "attention_bwd": "fa2", "attention_tile": "64x64",
                                 "attention_bwd_tile": "64x64", "attention_heads_per_block": "1", "gemm": "auto",
                                 "cuda_graphs": "off"}, \
    new["backend_options"]
assert abs(new["bf16"]["loss"] - both["bf16"]["loss"]) < 0.01 * both["bf16"]["loss"], \
    f"the new variant's loss {new['bf16']['loss']} vs {both['bf16']['loss']}"
# CUDA Graphs: the timed step (the second) is the one recorded and replayed;
# the same bits as launched op by op.
assert graphs["backend_options"]["cuda_graphs"] == "layers", graphs["backend_options"]
assert graphs["bf16"]["cuda_graphs"]["recorded"] > 0 and graphs["bf16"]["cuda_graphs"]["launches"] > 0, \
    graphs["bf16"]["cuda_graphs"]
assert graphs["bf16"]["loss"] == both["bf16"]["loss"], \
    f"cuda_graphs = layers changed the loss: {graphs['bf16']['loss']} vs {both['bf16']['loss']}"
print(f"gpu_bench_emu: ok (loss bf16 {both['bf16']['loss']:.6f}, fp32 {both['fp32']['loss']:.6f}, "
      f"bf16 with recompute {rec['bf16']['loss']:.6f})")
PY
