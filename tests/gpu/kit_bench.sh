#!/usr/bin/env bash
# GPU kit (3), on the GPU machine: the training-step benchmark (wiola-360m,
# T = 2048, bf16, then fp32) -> $OUT/bench.json and $OUT/bench.log. Extra
# arguments go to wiola_gpu_bench (--help lists them).
set -uo pipefail
cd "$(dirname "$0")/../.."
. tests/gpu/kit_env.sh
"$kit/bin/wiola_gpu_bench" --json "$OUT/bench.json" "$@" 2>&1 | tee "$OUT/bench.log"
exit "${PIPESTATUS[0]}"
