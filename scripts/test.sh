#!/usr/bin/env bash
# Installs missing dependencies (as root), builds, and runs every test with
# ctest. Extra arguments go to ctest (e.g. `scripts/test.sh -L dist`,
# `scripts/test.sh -R Tokenizer`). Exit status: ctest's. `.ci/run` calls this.
set -euo pipefail
cd "$(dirname "$0")/.."

start=$SECONDS
# The suite writes about 5.3 GB under the checkout (build/, its tests'
# outputs, build-asan/; a fresh clone, 2026-11-27). Where less is free, say
# so first: a full disk then names itself before the failures it causes.
need_mib=$((6 * 1024))
free_mib() { df -Pm . | awk 'NR == 2 {print $4}'; }
if [ "$(free_mib)" -lt "$need_mib" ]; then
  echo "test.sh: warning: $(free_mib) MiB free here; the suite needs about $need_mib MiB" >&2
fi
scripts/setup.sh
# The tests need the CUDA code compiled, linked and checked for both
# architectures, not run: sm_90a as machine code (ptxas, whose budgets
# ptxas_budget holds), sm_80 to PTX only (nvcc's front end and code generation
# for the A100, without its ptxas pass: 40 % of the CUDA backend's compile
# time, measured on attention_tc.cu 20.4 s -> 12.4 s). A build configured
# before keeps its own architectures; the GPU kit builds its own.
export WIOLA_CUDA_ARCHS=${WIOLA_CUDA_ARCHS:-"90a-real;80-virtual"}
scripts/build.sh

# ctest runs two tests at once on a 2-core machine, and several use two
# threads: OpenMP threads that spin at their barriers would take the
# neighbour's core (measured: infer_cli beside one busy core, 44 s spinning,
# 31 s passive; alone 22 s).
export OMP_WAIT_POLICY=${OMP_WAIT_POLICY:-passive}
rc=0
ctest --test-dir build --output-on-failure -j2 --timeout 900 "$@" || rc=$?
# The whole suite (no ctest arguments, as in CI) also builds a subset with
# clang under AddressSanitizer and UndefinedBehaviorSanitizer and runs it
# (scripts/sanitize.sh --ci: the fuzz corpus, the CPU op tests, the run-config
# and checkpoint unit tests), so that the sanitizer build cannot rot.
asan_rc=0
if [ $# -eq 0 ] && [ "${WIOLA_SKIP_SANITIZER:-0}" != 1 ]; then
  asan_start=$SECONDS
  scripts/sanitize.sh --ci || asan_rc=$?
  printf 'test.sh: sanitizer subset %s in %ds\n' "$([ "$asan_rc" -eq 0 ] && echo passed || echo FAILED)" \
    $((SECONDS - asan_start))
fi
elapsed=$((SECONDS - start))
printf 'test.sh: %s after %dm%02ds (setup + build + ctest + sanitizer subset)\n' \
  "$([ "$rc" -eq 0 ] && [ "$asan_rc" -eq 0 ] && echo passed || echo "FAILED (ctest exit $rc, sanitizer subset exit $asan_rc)")" \
  $((elapsed / 60)) $((elapsed % 60))
[ "$rc" -ne 0 ] || [ "$asan_rc" -ne 0 ] && echo "test.sh: $(free_mib) MiB free here at the end"
[ "$rc" -ne 0 ] && exit "$rc"
exit "$asan_rc"
