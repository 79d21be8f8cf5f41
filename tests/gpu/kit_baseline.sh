#!/usr/bin/env bash
# The build before, for the kit's ratios on the same card: builds REV's
# wiola_gpu_bench (a git worktree of this checkout, CUDA on, the portable
# -march) and packs it gzipped into .gpu-kit-base/ (git-ignored through
# .git/info/exclude), which kit_session.sh times beside the new build when
# called with KIT_BASELINE=.gpu-kit-base (carry it too).
#   bash tests/gpu/kit_baseline.sh REV      # e.g. the commit before a change
set -euo pipefail
cd "$(dirname "$0")/../.."
rev=$(git rev-parse --short "${1:?usage: kit_baseline.sh REV}")
tree=${TMPDIR:-/tmp}/wiola-base-$rev
[ -d "$tree" ] || git worktree add --detach "$tree" "$rev" >/dev/null
cmake -S "$tree" -B "$tree/build-gpu" -G Ninja -DCMAKE_BUILD_TYPE=Release -DWIOLA_CUDA=ON -DWIOLA_CUDA_EMU=OFF \
  >/dev/null
cmake --build "$tree/build-gpu" -j"$(nproc)" --target wiola_gpu_bench
mkdir -p .gpu-kit-base
gzip -9c "$tree/build-gpu/bench/wiola_gpu_bench" > .gpu-kit-base/wiola_gpu_bench.gz.tmp
mv .gpu-kit-base/wiola_gpu_bench.gz.tmp .gpu-kit-base/wiola_gpu_bench.gz
echo "$rev" > .gpu-kit-base/REV
ex=$(git rev-parse --git-path info/exclude); mkdir -p "$(dirname "$ex")"
grep -qx '/.gpu-kit-base/' "$ex" 2>/dev/null || echo '/.gpu-kit-base/' >> "$ex"
git worktree remove --force "$tree"
echo "kit_baseline: .gpu-kit-base/wiola_gpu_bench.gz is $rev's ($(du -h .gpu-kit-base/wiola_gpu_bench.gz | cut -f1))"
