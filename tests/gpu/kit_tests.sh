#!/usr/bin/env bash
# GPU kit (1), on the GPU machine: every gpu test (each op against the CPU
# backend, the whole model step, cached decoding, bf16 vs fp32 training).
# First the PTX probe: this GPU's registers for mma.sync, ldmatrix and
# cp.async against the CUDA emulator's (the kit's ptx_probe_emu.txt), to
# $OUT/ptx_probe.log. Then writes $OUT/gpu_tests.json (GoogleTest's JSON) and
# $OUT/gpu_tests.log, then the NCCL data plane's tests to $OUT/nccl_tests.json
# and .log. Exits with the first failure's status.
set -uo pipefail
cd "$(dirname "$0")/../.."
. tests/gpu/kit_env.sh
# The emulator's fragment layouts (tools/cuda_emu/emu_ptx.cpp) against the
# GPU's: every difference is printed; exit 1 on any.
"$kit_bin/ptx_probe" --compare "$kit/ptx_probe_emu.txt" 2>&1 | tee "$OUT/ptx_probe.log"
rc_probe=${PIPESTATUS[0]}
"$kit_bin/test_cuda_ops" --gtest_output="json:$OUT/gpu_tests.json" 2>&1 | tee "$OUT/gpu_tests.log"
rc=${PIPESTATUS[0]}
# The NCCL data plane on single-rank communicators (issue: multi-GPU).
"$kit_bin/test_nccl_comm" --gtest_output="json:$OUT/nccl_tests.json" 2>&1 | tee "$OUT/nccl_tests.log"
rc2=${PIPESTATUS[0]}
for r in "$rc_probe" "$rc" "$rc2"; do
  [ "$r" = 0 ] || exit "$r"
done
exit 0
