#!/usr/bin/env bash
# GPU kit (1), on the GPU machine: every gpu test (each op against the CPU
# backend, the whole model step, cached decoding, bf16 vs fp32 training).
# Writes $OUT/gpu_tests.json (GoogleTest's JSON) and $OUT/gpu_tests.log, then
# the NCCL data plane's tests to $OUT/nccl_tests.json and .log.
set -uo pipefail
cd "$(dirname "$0")/../.."
. tests/gpu/kit_env.sh
"$kit_bin/test_cuda_ops" --gtest_output="json:$OUT/gpu_tests.json" 2>&1 | tee "$OUT/gpu_tests.log"
rc=${PIPESTATUS[0]}
# The NCCL data plane on single-rank communicators (issue: multi-GPU).
"$kit_bin/test_nccl_comm" --gtest_output="json:$OUT/nccl_tests.json" 2>&1 | tee "$OUT/nccl_tests.log"
rc2=${PIPESTATUS[0]}
[ "$rc" = 0 ] && exit "$rc2"
exit "$rc"
