#!/usr/bin/env bash
# Fuzzes every file format wiola reads (tests/fuzz/, docs/testing.md) with
# libFuzzer under AddressSanitizer and UndefinedBehaviorSanitizer, in a clang
# build of its own (build-fuzz/). Each target runs SECONDS (default 60) from
# the committed seeds plus what earlier runs found (build-fuzz/corpus/, kept
# between runs). A finding is written to build-fuzz/findings/TARGET-crash-*
# (or leak-, timeout-, oom-) and the script exits 1 after the other targets.
#
#   scripts/fuzz.sh [SECONDS] [TARGET...]     e.g. scripts/fuzz.sh 300 safetensors
#
# Reproduce a finding: build-fuzz/tests/fuzz/fuzz_TARGET FILE. Once fixed,
# copy the file to tests/fuzz/corpus/TARGET/bug-NAME so ctest replays it.
set -euo pipefail
cd "$(dirname "$0")/.."
secs=${1:-60}
shift || true
all=(tokenizer_json tokenizer_encode documents data_manifest safetensors safetensors_index run_config
     checkpoint_manifest)
targets=("$@")
[ ${#targets[@]} -eq 0 ] && targets=("${all[@]}")

source scripts/sanitizer_build.sh
sanitizer_configure
cmake --build build-fuzz -j"$(nproc)" --target "${targets[@]/#/fuzz_}"

mkdir -p build-fuzz/findings
status=0
printf '%-20s %10s %8s %8s  %s\n' target execs cov corpus findings
for t in "${targets[@]}"; do
  work=build-fuzz/corpus/$t
  mkdir -p "$work"
  log=build-fuzz/findings/$t.log
  dict=(-dict=tests/fuzz/json.dict)  # a dictionary of the format's keys and edge values
  [ "$t" = run_config ] && dict=(-dict=tests/fuzz/toml.dict)
  [ "$t" = tokenizer_encode ] && dict=()  # plain text
  # Inputs up to 64 KiB; 10 s or 2 GiB for one input is a finding too.
  rc=0
  build-fuzz/tests/fuzz/fuzz_"$t" -max_total_time="$secs" -max_len=65536 -timeout=10 -rss_limit_mb=2048 \
    -malloc_limit_mb=1024 -print_final_stats=1 -artifact_prefix=build-fuzz/findings/"$t"- "${dict[@]}" \
    "$work" tests/fuzz/corpus/"$t" >"$log" 2>&1 || rc=$?
  [ $rc = 0 ] || status=1
  execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -1)
  cov=$(grep -o 'cov: [0-9]*' "$log" | tail -1 | cut -d' ' -f2)
  found=$(ls build-fuzz/findings/ | grep -c "^$t-" || true)
  [ $rc = 0 ] || found="$found (exit $rc)"
  printf '%-20s %10s %8s %8s  %s\n' "$t" "${execs:-?}" "${cov:-?}" "$(ls "$work" | wc -l)" "$found"
done
[ $status = 0 ] || echo "fuzz.sh: findings in build-fuzz/findings/ (logs: build-fuzz/findings/TARGET.log)" >&2
exit $status
