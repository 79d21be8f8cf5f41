# Sourced by the kit scripts on the GPU machine: where the kit's programs and
# libraries are, where cuBLAS is (PyTorch's nvidia wheels or a CUDA toolkit),
# and $OUT. Prints what it found.
kit=${WIOLA_KIT:-.gpu-kit}
if [ ! -x "$kit/bin/test_cuda_ops" ]; then
  echo "kit: $kit/bin/test_cuda_ops not found: run tests/gpu/kit_build.sh here first and carry .gpu-kit" >&2
  exit 2
fi
# Libraries kit_build.sh gzipped to fit the device call's 64 MiB, unpacked
# outside the kit (which must stay small enough to carry), once per kit build.
unpacked=${TMPDIR:-/tmp}/wiola-kit-lib.$(id -u)
mkdir -p "$unpacked"
for z in "$kit"/lib/*.gz; do
  [ -e "$z" ] || continue
  out="$unpacked/$(basename "${z%.gz}")"
  [ -e "$out" ] && [ ! "$z" -nt "$out" ] && continue
  { gzip -dc "$z" > "$out.tmp" 2>/dev/null ||
    python3 -c 'import gzip,shutil,sys; shutil.copyfileobj(gzip.open(sys.argv[1]), open(sys.argv[2],"wb"))' \
      "$z" "$out.tmp"; } && mv "$out.tmp" "$out"
done
cublas_dirs=$(find / \( -name 'libcublas.so.13' -o -name 'libcublasLt.so.13' -o -name 'libnccl.so.2' \) 2>/dev/null \
              -not -path '*/proc/*' | xargs -r -n1 dirname | sort -u | tr '\n' ':')
export LD_LIBRARY_PATH="$kit/lib:$unpacked:${cublas_dirs}${LD_LIBRARY_PATH:-}"
OUT=${OUT:-/tmp/wiola-out}
mkdir -p "$OUT"
echo "kit: cuBLAS and NCCL from ${cublas_dirs:-NOT FOUND}"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>&1 | sed 's/^/kit: GPU /'
