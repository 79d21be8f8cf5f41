#!/usr/bin/env bash
# GPU kit (2), on the GPU machine: compute-sanitizer memcheck and racecheck
# over the op tests (not the model tests: too slow under the sanitizer), with
# the allocator's cache off (WIOLA_CUDA_NO_CACHE=1): each buffer is its own
# exact-size cudaMalloc, so memcheck sees its bounds.
# Writes $OUT/sanitizer.json: per tool, exit status and error count.
# KIT_SAN_TOOLS="memcheck" (or "racecheck") runs one: sanitizer_memcheck.json.
set -uo pipefail
cd "$(dirname "$0")/../.."
. tests/gpu/kit_env.sh
san=$(command -v compute-sanitizer || ls /usr/local/cuda*/bin/compute-sanitizer 2>/dev/null | head -1)
[ -n "$san" ] || { echo '{"error": "compute-sanitizer not found"}' > "$OUT/sanitizer.json"; exit 2; }
rc_all=0
json='{'
for tool in ${KIT_SAN_TOOLS:-memcheck racecheck}; do
  WIOLA_CUDA_NO_CACHE=1 "$san" --tool "$tool" --error-exitcode 9 "$kit_bin/test_cuda_ops" --gtest_filter='CudaOps.*' \
    > "$OUT/sanitizer_$tool.log" 2>&1
  rc=$?
  errs=$(grep -E '^========= (Invalid|Error|Race|.*hazard)' "$OUT/sanitizer_$tool.log" | grep -vc 'SUMMARY' || true)
  echo "sanitizer $tool: exit $rc, $errs reports (log: sanitizer_$tool.log)"
  json+="\"$tool\": {\"exit\": $rc, \"reports\": $errs},"
  [ "$rc" -eq 0 ] || rc_all=1
done
name=sanitizer; [ -n "${KIT_SAN_TOOLS:-}" ] && name="sanitizer_${KIT_SAN_TOOLS// /_}"
echo "${json%,}}" > "$OUT/$name.json"
cat "$OUT/$name.json"
exit $rc_all
