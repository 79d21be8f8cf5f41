#!/usr/bin/env bash
# GPU kit, a whole short device session in ONE call (docs/gpu.md), in order of
# value: the gpu tests; the step benchmark in bf16 (with the row attention
# kernel if the tensor-core one failed its tests; fp32 and the row-kernel run
# only with KIT_FULL=1), then, with KIT_BASELINE="DIR ...", the same benchmark
# from older builds' wiola_gpu_bench in each DIR (carry them too) for ratios on
# the same card; the PyTorch eager baseline is part of the bench step; `wiola
# train` end to end (kit_train.sh: resume, CPU against GPU, NCCL data plane,
# decoding, eval, the trainer's speed); memcheck on the op tests; the big
# preset; racecheck. Each step has its own time limit, so what
# ran comes back when the call is cut off. The device tool returns at most 8
# files from $OUT, so each step's files are packed into $OUT/kit_results.tgz
# after it; the log is $OUT/session.log.
# KIT_T_<STEP> (TESTS, BENCH, BASELINE, TRAIN, MEMCHECK, BIG, RACECHECK): seconds for
# that step, 0 skips it. KIT_BIG_STEPS: timed steps of the big preset (20).
set -uo pipefail
cd "$(dirname "$0")/../.."
final=${OUT:-/tmp/wiola-out}; mkdir -p "$final"
work=$(mktemp -d); export OUT="$work"
exec > >(tee -a "$final/session.log") 2>&1
pack() { tar czf "$final/kit_results.tgz.tmp" -C "$work" . && mv "$final/kit_results.tgz.tmp" "$final/kit_results.tgz"; }
step() {  # step NAME SECONDS COMMAND...
  local name=$1 t=$2; shift 2
  [ "$t" = 0 ] && { echo "== $name: skipped"; return; }
  echo "== $name (limit ${t}s) $(date +%T)"
  timeout "$t" "$@"; echo "== $name: rc=$? $(date +%T)"; pack
}
nvidia-smi || true
step tests "${KIT_T_TESTS:-60}" bash tests/gpu/kit_tests.sh
if grep -qE 'FAILED .*(AttentionTensorCores|Bf16TrainingTracksFp32)' "$work/gpu_tests.log" 2>/dev/null; then
  echo "== tensor-core attention failed its tests: benchmarking with WIOLA_CUDA_ATTENTION=rows"
  export WIOLA_CUDA_ATTENTION=rows
fi
bench_args=(--steps 6 --warmup 2)
[ "${KIT_FULL:-0}" = 1 ] || bench_args+=(--precision bf16)
KIT_ROWS=${KIT_FULL:-0} KIT_TORCH_COMPILE=${KIT_TORCH_COMPILE:-0} \
  step bench "${KIT_T_BENCH:-150}" bash tests/gpu/kit_bench.sh "${bench_args[@]}"
for base in ${KIT_BASELINE:-}; do  # each an older build's wiola_gpu_bench(.gz) folder
  name=$(basename "$base")
  step "baseline $name" "${KIT_T_BASELINE:-70}" bash -c '. tests/gpu/kit_env.sh >/dev/null && bin=$0/wiola_gpu_bench
    if [ ! -x "$bin" ]; then  # as kit_build.sh packs it
      gunzip_to "$bin.gz" "$kit_bin/baseline_$1" && mv "$kit_bin/baseline_$1.tmp" "$kit_bin/baseline_$1" &&
        chmod +x "$kit_bin/baseline_$1" && bin=$kit_bin/baseline_$1
    fi
    "$bin" --json "$OUT/baseline_$1.json" "${@:2}" 2>&1 | tee "$OUT/baseline_$1.log"' \
    "$base" "$name" --precision bf16 --steps 4 --warmup 1
done
step train "${KIT_T_TRAIN:-180}" bash tests/gpu/kit_train.sh
KIT_SAN_TOOLS=memcheck step memcheck "${KIT_T_MEMCHECK:-90}" bash tests/gpu/kit_sanitizer.sh
step big "${KIT_T_BIG:-100}" bash tests/gpu/kit_big.sh
KIT_SAN_TOOLS=racecheck step racecheck "${KIT_T_RACECHECK:-120}" bash tests/gpu/kit_sanitizer.sh
rm -rf "$work"
