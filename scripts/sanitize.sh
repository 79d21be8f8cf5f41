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
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/sanitizer_build.sh
export ASAN_OPTIONS=detect_leaks=0:abort_on_error=1
export OMP_WAIT_POLICY=passive
sanitizer_configure
cmake --build build-fuzz -j"$(nproc)"
[ $# -gt 0 ] || set -- -LE "python|reference|hf"
cd build-fuzz && exec ctest -j"$(nproc)" --timeout 1200 --output-on-failure "$@"
