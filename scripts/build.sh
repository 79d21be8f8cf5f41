#!/usr/bin/env bash
# Configures (once) and builds wiola in build/ (Release, Ninja), from the repo
# root whatever the current directory. The CUDA backend is built whenever
# nvcc is present (it compiles without a GPU, so CI keeps it building);
# WIOLA_CUDA=0 in the environment turns that off. Extra arguments go to
# `cmake --build` (e.g. `scripts/build.sh --target wiola`).
set -euo pipefail
cd "$(dirname "$0")/.."

cuda=OFF
if [ "${WIOLA_CUDA:-1}" != 0 ] && { command -v nvcc >/dev/null 2>&1 || [ -x /usr/local/cuda/bin/nvcc ]; }; then
  cuda=ON
fi
# WIOLA_CUDA_ARCHS (CMake's architecture list) replaces the default "90a;80"
# when the build is configured; scripts/test.sh sets it for the test build.
archs=()
[ -n "${WIOLA_CUDA_ARCHS:-}" ] && archs=("-DWIOLA_CUDA_ARCHS=$WIOLA_CUDA_ARCHS")
if [ ! -f build/build.ninja ]; then
  cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release -DWIOLA_CUDA=$cuda "${archs[@]}"
fi
cmake --build build -j"$(nproc)" "$@"
