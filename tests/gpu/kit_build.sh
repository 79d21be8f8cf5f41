#!/usr/bin/env bash
# The GPU kit, step 0, run on THIS machine (no GPU needed): builds the
# GPU-side programs with WIOLA_CUDA=ON (the portable default -march, docs/cpu.md)
# and packs them, gzipped, with the shared libraries they need (OpenBLAS,
# libgomp, HDF5, Open MPI and its plugins, ... — not glibc, cuBLAS and NCCL,
# which the GPU machine provides) into .gpu-kit/ (git-ignored, about 25 MiB).
# wiola_kernel_bench has cuDNN's SDPA reference rows when the cuDNN
# frontend's headers are found here (pip nvidia-cudnn-frontend; under 1 MiB
# more, gzipped); cuDNN itself is loaded there at run time, never carried
# (about 490 MB: kit_env.sh finds the GPU machine's, docs/gpu.md).
# kit_env.sh unpacks it there. Then, with the device tool, carry ".gpu-kit" and
# run tests/gpu/kit_session.sh (or one of the kit_*.sh steps it runs).
# docs/gpu.md records what they printed, with date and device.
#
# Programs: test_cuda_ops, test_nccl_comm, wiola_gpu_bench and
# wiola_kernel_bench (no MPI, no HDF5), and `wiola` itself for kit_train.sh:
# a single process, MPI as a singleton in Open MPI's isolated mode (no
# mpirun, no orted), which loads its plugins from the kit.
set -euo pipefail
cd "$(dirname "$0")/../.."
# -U: a build-gpu cache from before the portable default still says x86-64-v3.
# No Parquet input: the kit's wiola would carry pyarrow's Arrow libraries.
cmake -S . -B build-gpu -G Ninja -DCMAKE_BUILD_TYPE=Release -DWIOLA_CUDA=ON -DWIOLA_PARQUET=OFF -UWIOLA_MARCH >/dev/null
cmake --build build-gpu -j"$(nproc)" --target test_cuda_ops test_nccl_comm wiola_gpu_bench wiola_kernel_bench wiola
rm -rf .gpu-kit && mkdir -p .gpu-kit/bin .gpu-kit/lib .gpu-kit/openmpi
cp build-gpu/tests/gpu/test_cuda_ops build-gpu/tests/gpu/test_nccl_comm build-gpu/bench/wiola_gpu_bench \
  build-gpu/bench/wiola_kernel_bench build-gpu/wiola .gpu-kit/bin/

# The PTX probe (tests/gpu/ptx_probe.cu): ptx_probe for the GPU, and the dump
# of the same program on the CUDA emulator (ptx_probe_emu, from this build-gpu
# tree), which kit_tests.sh has the GPU's registers compared with.
cmake --build build-gpu -j"$(nproc)" --target ptx_probe ptx_probe_emu
cp build-gpu/tests/gpu/ptx_probe .gpu-kit/bin/
build-gpu/tests/cuda_emu/ptx_probe_emu --dump .gpu-kit/ptx_probe_emu.txt

# Open MPI's plugins, for a singleton and for mpirun on one host: those whose
# libraries are all here or in glibc (not the ones for InfiniBand, UCX or PSM,
# which one host never selects and which would drag in their stacks).
ompi_plugins=$(dirname "$(ldd build-gpu/wiola | awk '/libmpi\.so/ {print $3}')")/openmpi/lib/openmpi3
[ -d "$ompi_plugins" ] || ompi_plugins=/usr/lib/x86_64-linux-gnu/openmpi/lib/openmpi3
for p in "$ompi_plugins"/mca_*.so; do
  if ldd "$p" | grep -qE 'not found|lib(fabric|uc[pts]|psm|infinipath|ibverbs|rdmacm|efa|nl-)'; then
    continue
  fi
  cp "$p" .gpu-kit/openmpi/
done

# mpirun for several ranks on the GPU machine's one GPU (kit_multi.sh): Open
# MPI's launcher and daemon, PMIx's plugins and both help-file folders, laid
# out under mpi/ as under their install prefixes (/usr and PMIx's), so that
# OPAL_PREFIX and PMIX_PREFIX relocate them (kit_env.sh). Packed as one
# tarball; its programs' and plugins' libraries join lib/ below.
pmix_prefix=/usr/lib/x86_64-linux-gnu/pmix2
mpi=$(mktemp -d)
mkdir -p "$mpi/mpi/bin" "$mpi/mpi/share" "$mpi/mpi/lib"
cp "$(readlink -f /usr/bin/mpirun)" "$mpi/mpi/bin/mpirun"
cp /usr/bin/orted "$mpi/mpi/bin/orted"
cp -r /usr/share/openmpi "$mpi/mpi/share/openmpi"
cp -r "$pmix_prefix/share/pmix" "$mpi/mpi/share/pmix"
cp -r "$pmix_prefix/lib/pmix" "$mpi/mpi/lib/pmix"

# Non-system shared libraries the programs and plugins load. glibc's own
# libraries stay the GPU machine's; cuBLAS, cudart and the driver come from
# its PyTorch or CUDA installation.
for b in .gpu-kit/bin/* .gpu-kit/openmpi/* "$mpi"/mpi/bin/* "$mpi"/mpi/lib/pmix/*.so; do
  ldd "$b" | awk '/=> \// {print $3}'
done | sort -u | while read -r lib; do
  case "$(basename "$lib")" in
    libc.so*|libm.so*|libpthread.so*|libdl.so*|librt.so*|libresolv.so*|libutil.so*|libanl.so*|libnsl.so*|\
    libnss_*|ld-linux*|libcublas*|libcudart*|libcuda.so*) ;;
    *) cp -L "$lib" .gpu-kit/lib/ ;;
  esac
done
# The device call carries 64 MiB in all, checkout included: everything
# travels gzipped (about a third of its size) and kit_env.sh unpacks it there.
gzip -9 .gpu-kit/bin/* .gpu-kit/lib/* .gpu-kit/openmpi/*
tar czf .gpu-kit/mpi.tgz -C "$mpi" mpi && rm -rf "$mpi"
ex=$(git rev-parse --git-path info/exclude); mkdir -p "$(dirname "$ex")"
grep -qx '/.gpu-kit/' "$ex" 2>/dev/null || echo '/.gpu-kit/' >> "$ex"
du -sh .gpu-kit
ls .gpu-kit/bin .gpu-kit/lib | tr '\n' ' '; echo
echo "Open MPI plugins: $(ls .gpu-kit/openmpi | wc -l)"
# The kit as the device will see it, with the system's copies hidden.
bash tests/gpu/kit_selftest.sh
