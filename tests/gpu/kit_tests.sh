#!/usr/bin/env bash
# GPU kit (1), on the GPU machine: every gpu test (each op against the CPU
# backend, the whole model step, cached decoding, bf16 vs fp32 training).
# Writes $OUT/gpu_tests.json (GoogleTest's JSON) and $OUT/gpu_tests.log.
set -uo pipefail
cd "$(dirname "$0")/../.."
. tests/gpu/kit_env.sh
"$kit/bin/test_cuda_ops" --gtest_output="json:$OUT/gpu_tests.json" 2>&1 | tee "$OUT/gpu_tests.log"
exit "${PIPESTATUS[0]}"
