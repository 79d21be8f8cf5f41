#!/usr/bin/env bash
# The CUDA compiler launcher of wiola_cuda (kernels/cuda/CMakeLists.txt): runs
# the compile ("$@", ending in -o OBJECT) with ptxas's resource report
# (--resource-usage) and keeps the report beside the object, in OBJECT.ptxas,
# for ctest ptxas_budget (tests/gpu/ptxas_budget.py --reports): the budgets are
# checked on the objects the build made, without compiling every kernel file
# again. Everything else the compiler says goes to stderr as before.
set -uo pipefail
out=
prev=
for a in "$@"; do
  [ "$prev" = -o ] && out=$a
  prev=$a
done
[ -n "$out" ] || exec "$@"
"$@" --resource-usage 2>"$out.ptxas.all"
rc=$?
# ptxas's report: its "ptxas info" lines and the indented figures under them.
grep -E '^ptxas info|^    [0-9]+ bytes stack frame' "$out.ptxas.all" >"$out.ptxas.tmp"
grep -v -E '^ptxas info|^    [0-9]+ bytes stack frame' "$out.ptxas.all" >&2
mv "$out.ptxas.tmp" "$out.ptxas"
rm -f "$out.ptxas.all"
exit "$rc"
