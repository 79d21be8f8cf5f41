#!/usr/bin/env bash
# Installs missing dependencies (as root), builds, and runs every test with
# ctest. Extra arguments go to ctest (e.g. `scripts/test.sh -L dist`,
# `scripts/test.sh -R Tokenizer`). Exit status: ctest's. `.ci/run` calls this.
set -euo pipefail
cd "$(dirname "$0")/.."

start=$SECONDS
scripts/setup.sh
scripts/build.sh

rc=0
ctest --test-dir build --output-on-failure -j2 --timeout 900 "$@" || rc=$?
elapsed=$((SECONDS - start))
printf 'test.sh: %s after %dm%02ds (setup + build + ctest)\n' \
  "$([ "$rc" -eq 0 ] && echo passed || echo "FAILED (ctest exit $rc)")" \
  $((elapsed / 60)) $((elapsed % 60))
exit "$rc"
