#!/usr/bin/env bash
# GPU kit (kernels), on the GPU machine: the CUDA backend's kernels one at a
# time at wiola-360m's step shapes (bench/kernel_bench.cpp): the attention
# variants (backend options attention tc, fa2, rows; attention_bwd v1, v2,
# fa2; plain causal and ATM), each checked against the CPU before it is
# timed, in ms and TFLOP/s; every distinct GEMM of the step, aligned and
# misaligned, in TFLOP/s, then each swept (cublasGemmEx and cuBLASLt's
# candidates, split-K ones included, checked, then timed) with the winners
# written as this card's tuning table to $OUT/gemm_tuning.json (for
# kernels/cuda/gemm_tuning.json); the memory-bound ops in GB/s. One JSON line per
# result in $OUT/kernels.jsonl, written as it is measured (a time limit keeps
# what ran), and the log in $OUT/kernels.log. Extra arguments go to
# wiola_kernel_bench (e.g. --only attention, --reps 10, --peak-gbps 4800 on an H200).
set -uo pipefail
cd "$(dirname "$0")/../.."
. tests/gpu/kit_env.sh
timeout 540 "$kit_bin/wiola_kernel_bench" --json "$OUT/kernels.jsonl" --write-tuning "$OUT/gemm_tuning.json" "$@" 2>&1 | tee "$OUT/kernels.log"
exit "${PIPESTATUS[0]}"
