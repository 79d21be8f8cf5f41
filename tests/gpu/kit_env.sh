# Sourced by the kit scripts on the GPU machine: unpacks the kit (which
# kit_build.sh gzipped to fit the device call's 64 MiB) outside the checkout,
# once per kit build; sets $kit_bin (its programs), LD_LIBRARY_PATH (its
# libraries, then cuBLAS and NCCL from PyTorch's nvidia wheels or a CUDA
# toolkit), Open MPI's singleton settings and $OUT. Prints what it found.
kit=${WIOLA_KIT:-.gpu-kit}
if [ ! -e "$kit/bin/test_cuda_ops.gz" ]; then
  echo "kit: $kit/bin/test_cuda_ops.gz not found: run tests/gpu/kit_build.sh here first and carry .gpu-kit" >&2
  exit 2
fi
gunzip_to() {  # gunzip_to FILE.gz OUT: python's gzip where gzip is missing
  gzip -dc "$1" > "$2.tmp" 2>/dev/null ||
    python3 -c 'import gzip,shutil,sys; shutil.copyfileobj(gzip.open(sys.argv[1]), open(sys.argv[2],"wb"))' "$1" "$2.tmp"
}
unpacked=${TMPDIR:-/tmp}/wiola-kit.$(id -u)
mkdir -p "$unpacked/bin" "$unpacked/lib" "$unpacked/openmpi"
for part in bin lib openmpi; do
  for z in "$kit/$part"/*.gz; do
    [ -e "$z" ] || continue
    out="$unpacked/$part/$(basename "${z%.gz}")"
    [ -e "$out" ] && [ ! "$z" -nt "$out" ] && continue
    gunzip_to "$z" "$out" && mv "$out.tmp" "$out"
  done
done
chmod +x "$unpacked"/bin/*
kit_bin=$unpacked/bin
# KIT_ATTENTION (kit_session.sh sets rows when the tensor-core attention
# failed its tests): the benchmarks' --attention.
kit_flags=()
[ -n "${KIT_ATTENTION:-}" ] && kit_flags=(--attention "$KIT_ATTENTION")
# mpirun, its daemon, PMIx's plugins and the help files (kit_build.sh).
if [ -e "$kit/mpi.tgz" ] && { [ ! -e "$unpacked/mpi" ] || [ "$kit/mpi.tgz" -nt "$unpacked/mpi" ]; }; then
  rm -rf "$unpacked/mpi" && tar xzf "$kit/mpi.tgz" -C "$unpacked" && touch "$unpacked/mpi"
fi
kit_mpirun=$unpacked/mpi/bin/mpirun
# Also cuDNN for the kernel bench's reference rows (kit_kernels.sh: libcudnn.so.9
# and its parts beside it, NVRTC for its run-time compiled engines, and the
# CUDA runtime the cuDNN frontend opens for itself): not carried, about 490 MB.
cublas_dirs=$(find / \( -name 'libcublas.so.13' -o -name 'libcublasLt.so.13' -o -name 'libnccl.so.2' \
              -o -name 'libcudnn.so.9' -o -name 'libnvrtc.so.13' -o -name 'libcudart.so.13' \) 2>/dev/null \
              -not -path '*/proc/*' | xargs -r -n1 dirname | sort -u | tr '\n' ':')
export LD_LIBRARY_PATH="$unpacked/lib:${cublas_dirs}${LD_LIBRARY_PATH:-}"
# `wiola` is an MPI program run without mpirun: Open MPI's isolated
# singleton starts no orted, and loads its plugins from the kit.
export OMPI_MCA_ess_singleton_isolated=1 OMPI_MCA_mca_base_component_path="$unpacked/openmpi"
export OMPI_MCA_mca_base_component_show_load_errors=0 OMPI_MCA_pml=ob1
# Several ranks on one host (the kit's mpirun): shared memory between them,
# copied through a buffer (CMA needs ptrace rights a VM may not grant), and
# Open MPI and PMIx relocated to the kit (help files, PMIx's plugins); PMIx's
# plain hash store (its shared-memory one is the fragile part in a VM).
export OMPI_MCA_btl=self,vader OMPI_MCA_btl_vader_single_copy_mechanism=none
export OPAL_PREFIX="$unpacked/mpi" PMIX_PREFIX="$unpacked/mpi" PMIX_MCA_gds=hash
export PMIX_MCA_mca_base_component_path="$unpacked/mpi/lib/pmix"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
# hwloc (under Open MPI) needs none of its plugins (GL, OpenCL, PCI, XML).
mkdir -p "$unpacked/hwloc" && export HWLOC_PLUGINS_PATH="$unpacked/hwloc"
OUT=${OUT:-/tmp/wiola-out}
mkdir -p "$OUT"
echo "kit: cuBLAS, NCCL and cuDNN from ${cublas_dirs:-NOT FOUND}"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>&1 | sed 's/^/kit: GPU /' || true
