#!/usr/bin/env bash
# GPU kit (4, optional), on the GPU machine: the largest preset on one GPU.
# wiola-1.5b (2.18 B parameters) at T = 2048, one sequence per step, with
# activation recompute, 20 timed steps in bf16: step time, MFU, peak device
# memory and the time per op class. Writes $OUT/big.json and $OUT/big.log.
# KIT_BIG_STEPS sets the timed steps; extra arguments go to wiola_gpu_bench.
set -uo pipefail
cd "$(dirname "$0")/../.."
. tests/gpu/kit_env.sh
timeout 540 "$kit_bin/wiola_gpu_bench" --preset wiola-1.5b --batch 1 --recompute --precision bf16 \
  --steps "${KIT_BIG_STEPS:-20}" --warmup 1 --json "$OUT/big.json" "${kit_flags[@]}" "$@" 2>&1 | tee "$OUT/big.log"
exit "${PIPESTATUS[0]}"
