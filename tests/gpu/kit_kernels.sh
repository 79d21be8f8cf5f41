#!/usr/bin/env bash
# GPU kit (kernels), on the GPU machine: the CUDA backend's kernels one at a
# time at wiola-360m's step shapes (bench/kernel_bench.cpp): the attention
# variants (backend options attention tc, fa2, rows; the fa2 forward at each
# tile shape attention_tile 64x64, 64x128, 128x64, 128x128; attention_bwd v1,
# v2, fa2; plain causal and ATM), each checked against the CPU before it is
# timed, in ms and TFLOP/s; every distinct GEMM of the step, aligned and
# misaligned, in TFLOP/s, then each swept (cublasGemmEx and cuBLASLt's
# candidates, split-K ones included, checked, then timed) with the winners
# written as this card's tuning table to $OUT/gemm_tuning.json (for
# kernels/cuda/gemm_tuning.json); the memory-bound ops in GB/s. One JSON line per
# result in $OUT/kernels.jsonl, written as it is measured (a time limit keeps
# what ran), and the log in $OUT/kernels.log. Extra arguments go to
# wiola_kernel_bench (e.g. --only attention, --reps 10, --peak-gbps 4800 on an H200).
# KIT_KERNELS_NAME (default kernels) names the output files: kit_session.sh's
# second call, at wiola-1.5b's shapes (d_h 128: --preset wiola-1.5b --only
# attention), writes kernels_dh128.jsonl and no tuning table.
set -uo pipefail
cd "$(dirname "$0")/../.."
. tests/gpu/kit_env.sh
name=${KIT_KERNELS_NAME:-kernels}
tuning=(--write-tuning "$OUT/gemm_tuning.json")
[ "$name" = kernels ] || tuning=()
timeout 540 "$kit_bin/wiola_kernel_bench" --json "$OUT/$name.jsonl" "${tuning[@]}" "$@" 2>&1 | tee "$OUT/$name.log"
exit "${PIPESTATUS[0]}"
