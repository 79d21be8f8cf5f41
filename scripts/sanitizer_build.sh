# Sourced by scripts/fuzz.sh and scripts/sanitize.sh: configures build-fuzz/ (or
# the folder given, with extra cmake arguments),
# a clang build with AddressSanitizer and UndefinedBehaviorSanitizer (and
# libFuzzer's coverage) of everything (-DWIOLA_FUZZ=ON; CUDA off, the CUDA
# emulator on). As root it installs clang's runtime if it is missing.
sanitizer_configure() {
  if ! ls /usr/lib/llvm-*/lib/clang/*/lib/linux/libclang_rt.fuzzer-x86_64.a >/dev/null 2>&1 ||
     ! command -v clang++ >/dev/null; then
    if [ "$(id -u)" = 0 ]; then
      apt-get install -y --no-install-recommends clang libclang-rt-dev libomp-dev >/dev/null
    else
      echo "needs clang, libclang-rt-dev and libomp-dev (apt-get install as root)" >&2
      exit 2
    fi
  fi
  local dir=${1:-build-fuzz}
  shift || true
  if [ ! -f "$dir/build.ninja" ]; then
    CC=clang CXX=clang++ cmake -S . -B "$dir" -G Ninja -DCMAKE_BUILD_TYPE=Debug -DCMAKE_CXX_FLAGS_DEBUG="-O1 -g" \
      -DCMAKE_C_FLAGS_DEBUG="-O1 -g" -DWIOLA_FUZZ=ON -DWIOLA_CUDA=OFF "$@" >/dev/null
  fi
}
export ASAN_OPTIONS=${ASAN_OPTIONS:-abort_on_error=1:detect_leaks=1}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}
