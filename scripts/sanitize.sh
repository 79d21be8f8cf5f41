#!/usr/bin/env bash
# Runs the test suite under AddressSanitizer and UndefinedBehaviorSanitizer
# in the clang build that scripts/fuzz.sh also uses (build-fuzz/;
# docs/testing.md). Arguments go to ctest; by default every test except the
# PyTorch comparisons (labels python, reference, hf: their C++ side runs
# in the other labels). Leak checking is off: Open MPI and OpenMP keep
# memory to the end by design.
#
#   scripts/sanitize.sh                 # on 2 cores: ~5 min to build, ~20 min of tests
#   scripts/sanitize.sh -L data
#   scripts/sanitize.sh --ci            # CI's subset (scripts/test.sh): ~4 min on 2 cores
#
# --ci builds only what its subset needs, in build-asan/ (CUDA emulator and
# Parquet off): every fuzz target replaying its corpus (each file format a
# user hands wiola), the CPU op tests (test_ops, the bf16 storage and
# attention tests) and the run-config and checkpoint unit tests. A compile
# error under clang fails it too, so the sanitizer build cannot rot.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/sanitizer_build.sh
export ASAN_OPTIONS=detect_leaks=0:abort_on_error=1
export OMP_WAIT_POLICY=passive
if [ "${1:-}" = --ci ]; then
  # At -O0: the subset is mostly build (3 min of two cores at -O1, its tests
  # 10 s), and clang with the sanitizers compiles at -O0 in half the time
  # (infer/hf_export.cpp 35.8 s -> 17.5 s; 2026-11-29, Zen 5).
  sanitizer_configure build-asan -DWIOLA_CUDA_EMU=OFF -DWIOLA_PARQUET=OFF -DCMAKE_CXX_FLAGS_DEBUG="-O0 -g" \
    -DCMAKE_C_FLAGS_DEBUG="-O0 -g"
  targets=(test_ops test_blas test_bf16_storage test_attention train_tests checkpoint_tests spike_detector_tests)
  for f in tests/fuzz/corpus/*/; do targets+=("fuzz_$(basename "$f")"); done
  cmake --build build-asan -j"$(nproc)" --target "${targets[@]}"
  # Only the built programs' tests are discovered; the shell tests of these
  # labels (and config_docs, which asks the wiola program for its schema)
  # need programs the subset does not build.
  cd build-asan && exec ctest -j"$(nproc)" --timeout 600 --output-on-failure -L 'fuzz|kernels|train' \
    -E '^ckpt_|^ops_simd_|^config_docs$'
fi
sanitizer_configure build-fuzz
cmake --build build-fuzz -j"$(nproc)"
[ $# -gt 0 ] || set -- -LE "python|reference|hf"
cd build-fuzz && exec ctest -j"$(nproc)" --timeout 1200 --output-on-failure "$@"
