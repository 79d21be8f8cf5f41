#!/usr/bin/env bash
# Installs what wiola needs on Debian 12. Idempotent and quiet when nothing is
# missing. As root: apt-get installs the missing packages, then pip installs
# for /usr/bin/python3 Hugging Face `tokenizers` (the tokenizer comparison
# tests and bench/tokenizer_bench.py) and `transformers` 4.46.3 (loading
# `wiola export` folders: tests/hf, tests/infer/hf_logits.py), and more below
# (pyarrow, tensorboard, the cuDNN frontend's headers); the tests and parts
# that need them skip without them.
# Not root: prints what is missing and the command to install it, exits 1.
set -euo pipefail

PACKAGES=(
  build-essential cmake ninja-build g++ pkg-config git
  libopenmpi-dev openmpi-bin libhdf5-dev hdf5-tools libopenblas-dev
  libtomlplusplus-dev libcli11-dev nlohmann-json3-dev libpcre2-dev
  libgtest-dev libgmock-dev googletest libbenchmark-dev libxxhash-dev libhwy-dev
  zlib1g-dev libzstd-dev  # compressed prep inputs (.gz, .zst)
  libssl-dev  # SHA-256 (data/sha256.cpp) from OpenSSL's libcrypto
  python3 python3-torch python3-h5py python3-numpy python3-matplotlib python3-pip python3-xxhash
  valgrind xz-utils
  slurm-wlm munge libpmix-dev  # Slurm for the launch tests (scripts/slurm_local.sh)
  iproute2 util-linux  # namespace nodes (ip, tc, nsenter, unshare: scripts/local_cluster.sh)
)
PY=/usr/bin/python3

is_root() { [ "$(id -u)" -eq 0 ]; }

if ! command -v dpkg-query >/dev/null 2>&1; then
  echo "setup.sh: no dpkg-query (not Debian?); make sure the equivalents of these are installed:" >&2
  echo "  ${PACKAGES[*]}" >&2
  exit 0
fi

missing=()
for p in "${PACKAGES[@]}"; do
  status=$(dpkg-query -W -f='${db:Status-Status}' "$p" 2>/dev/null || true)
  [ "$status" = installed ] || missing+=("$p")
done

if [ ${#missing[@]} -gt 0 ]; then
  if is_root; then
    echo "setup.sh: installing ${missing[*]}"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update
    apt-get install -y --no-install-recommends "${missing[@]}"
  else
    echo "setup.sh: missing Debian packages: ${missing[*]}" >&2
    echo "install them as root with:" >&2
    echo "  apt-get update && apt-get install -y --no-install-recommends ${missing[*]}" >&2
    exit 1
  fi
fi

# pip_install MODULE WHAT PACKAGE...: installs PACKAGEs for $PY unless MODULE
# imports; WHAT says which tests skip without it.
pip_install() {
  local module=$1 what=$2
  shift 2
  "$PY" -c "import $module" >/dev/null 2>&1 && return 0
  local cmd=("$PY" -m pip install --break-system-packages "$@")
  if is_root; then
    echo "setup.sh: installing $* for $PY (pip)"
    PIP_ROOT_USER_ACTION=ignore "${cmd[@]}" --disable-pip-version-check -q ||
      echo "setup.sh: warning: pip could not install $*; $what will be skipped" >&2
  else
    echo "setup.sh: note: $module is not installed for $PY; $what will be skipped (install: ${cmd[*]})" >&2
  fi
}

pip_install tokenizers "the Hugging Face tokenizer comparison tests" tokenizers
# transformers 4.46.3 is the newest release that runs on Debian's torch 1.13;
# "numpy<2" keeps Debian's numpy 1.24 (a plain install pulls numpy 2, and then
# the import fails). It pins tokenizers<0.21, replacing a newer one.
pip_install transformers "the Hugging Face export tests" "transformers==4.46.3" "numpy<2"
# pyarrow's wheel ships Apache Arrow's C++ libraries and headers: the build's
# Parquet prep input (WIOLA_PARQUET=AUTO turns it on when found) and the test
# that writes a Parquet file. 17.x: manylinux_2_28, the C++11 ABI (docs/data.md).
pip_install pyarrow "Parquet prep input and its test" "pyarrow<18"
# TensorBoard's own event reader checks the event files of train.tensorboard
# (ctest monitor_tensorboard); it needs only numpy>=1.12, so Debian's stays.
pip_install tensorboard "the TensorBoard event file test" tensorboard
# NVIDIA's header-only cuDNN frontend (its C++ headers ship in the wheel): the
# cuDNN SDPA reference rows of wiola_kernel_bench in CUDA builds
# (bench/cudnn_sdpa.h, CMake option WIOLA_CUDNN_FRONTEND). Headers only, so
# without its Python package's dependencies (CUTLASS DSL, TVM FFI).
pip_install cudnn "the kernel bench's cuDNN reference (CUDA builds)" --no-deps "nvidia-cudnn-frontend==1.32.0"
# lizard (pure Python) measures every function of the production folders for
# the function-length check (ctest arch.function_length, scripts/check_function_length.py).
pip_install lizard "the function-length check" "lizard==1.24.3"
