#!/usr/bin/env bash
# Configures (once) and builds wiola in build/ (Release, Ninja), from the repo
# root whatever the current directory. Extra arguments go to `cmake --build`
# (e.g. `scripts/build.sh --target wiola`).
set -euo pipefail
cd "$(dirname "$0")/.."

if [ ! -f build/build.ninja ]; then
  cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release
fi
cmake --build build -j"$(nproc)" "$@"
