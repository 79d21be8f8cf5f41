#!/usr/bin/env bash
# The GPU kit, step 0, run on THIS machine (no GPU needed): builds the
# GPU-side programs with WIOLA_CUDA=ON (the portable default -march, docs/cpu.md), and packs
# them with the shared libraries they need (OpenBLAS, libgomp, ... — not
# cuBLAS and NCCL, which the GPU machine provides) into .gpu-kit/ (git-ignored, about
# 30 MiB). Then, with the device tool, carry ".gpu-kit" and run one of
#   bash tests/gpu/kit_tests.sh       (the gpu tests -> $OUT/gpu_tests.json)
#   bash tests/gpu/kit_sanitizer.sh   (memcheck + racecheck -> $OUT/sanitizer.json)
#   bash tests/gpu/kit_bench.sh       (the step benchmark -> $OUT/bench.json)
# docs/gpu.md records what they printed, with date and device.
set -euo pipefail
cd "$(dirname "$0")/../.."
# -U: a build-gpu cache from before the portable default still says x86-64-v3.
cmake -S . -B build-gpu -G Ninja -DCMAKE_BUILD_TYPE=Release -DWIOLA_CUDA=ON -UWIOLA_MARCH >/dev/null
cmake --build build-gpu -j"$(nproc)" --target test_cuda_ops test_nccl_comm wiola_gpu_bench
rm -rf .gpu-kit && mkdir -p .gpu-kit/bin .gpu-kit/lib
cp build-gpu/tests/gpu/test_cuda_ops build-gpu/tests/gpu/test_nccl_comm build-gpu/bench/wiola_gpu_bench \
  .gpu-kit/bin/
# Non-system shared libraries the programs load (the GPU machine has glibc
# and the CUDA driver; cuBLAS comes from its PyTorch or CUDA installation).
for b in .gpu-kit/bin/*; do
  ldd "$b" | awk '/=> \// {print $3}'
done | sort -u | while read -r lib; do
  case "$(basename "$lib")" in
    libc.so*|libm.so*|libpthread.so*|libdl.so*|librt.so*|ld-linux*|libcublas*|libcudart*|libcuda.so*) ;;
    *) cp -L "$lib" .gpu-kit/lib/ ;;
  esac
done
# The device call carries 64 MiB in all, checkout included: OpenBLAS (36 MB,
# every CPU's kernels) travels gzipped and kit_env.sh unpacks it there.
gzip -9 .gpu-kit/lib/libopenblas.so.0
ex=$(git rev-parse --git-path info/exclude); mkdir -p "$(dirname "$ex")"
grep -qx '/.gpu-kit/' "$ex" 2>/dev/null || echo '/.gpu-kit/' >> "$ex"
du -sh .gpu-kit
ls .gpu-kit/bin .gpu-kit/lib
