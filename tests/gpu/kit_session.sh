#!/usr/bin/env bash
# GPU kit, a whole short device session in ONE call (tests/gpu/README.md), in
# order of value, each step with its own time limit so that what ran comes
# back when the call is cut off:
#   1. correctness: the gpu tests and the PTX probe (kit_tests.sh); `wiola
#      train` end to end (kit_train.sh: resume, CPU against GPU, NCCL data
#      plane, decoding, eval, the main job against its CPU curve, the
#      trainer's speed); several ranks sharing the GPU (kit_multi.sh)
#   2. speed: the step benchmark beside PyTorch eager (kit_bench.sh main),
#      then, with KIT_BASELINE="DIR ...", the same benchmark from older builds'
#      wiola_gpu_bench in each DIR (carry them too) for ratios on the same card
#   3. kernel variants (kit_bench.sh variants), then the kernels one at a
#      time at the step's shapes (kit_kernels.sh), and the attention kernels
#      again at wiola-1.5b's (d_h 128: kernels_dh128.jsonl)
#   4. memcheck on the op tests, the big preset, racecheck
#   5. torch.compile, only with the time left (KIT_T_COMPILE, default 0)
# If the tensor-core attention fails its tests, the later steps run with the
# row kernels (KIT_ATTENTION=rows: the backend option train.cuda_attention,
# --attention of the benchmarks; kit_env.sh, kit_lib.sh). The device tool returns at most 8 files from $OUT, so each
# step's files are packed into $OUT/kit_results.tgz after it; the log is
# $OUT/session.log; tests/gpu/kit_table.py turns the results into the table
# row for docs/gpu.md.
# KIT_T_<STEP> (TESTS, TRAIN, MULTI, BENCH, BASELINE, VARIANTS, KERNELS,
# KERNELS128, MEMCHECK, BIG, RACECHECK, COMPILE): seconds for that step, 0
# skips it.
# KIT_BIG_STEPS: timed steps of the big preset (20). KIT_FULL=1: fp32 in the
# benchmark too. KIT_DEADLINE: seconds after which no step runs (step()).
set -uo pipefail
cd "$(dirname "$0")/../.."
final=${OUT:-/tmp/wiola-out}; mkdir -p "$final"
work=$(mktemp -d); export OUT="$work"
exec > >(tee -a "$final/session.log") 2>&1
pack() { tar czf "$final/kit_results.tgz.tmp" -C "$work" . && mv "$final/kit_results.tgz.tmp" "$final/kit_results.tgz"; }
# KIT_DEADLINE (seconds, 0: none): no step runs past it, so that what ran is
# packed before the device call's own limit cuts it off.
deadline=${KIT_DEADLINE:-0} t0=$SECONDS
step() {  # step NAME SECONDS COMMAND...
  local name=$1 t=$2 left; shift 2
  [ "$t" = 0 ] && { echo "== $name: skipped"; return; }
  if [ "$deadline" != 0 ]; then
    left=$((deadline - (SECONDS - t0) - 5))
    [ "$left" -lt 10 ] && { echo "== $name: skipped (KIT_DEADLINE ${deadline}s reached)"; return; }
    [ "$t" -gt "$left" ] && t=$left
  fi
  echo "== $name (limit ${t}s) $(date +%T)"
  timeout "$t" "$@"; echo "== $name: rc=$? $(date +%T)"; pack
}
nvidia-smi || true
step tests "${KIT_T_TESTS:-60}" bash tests/gpu/kit_tests.sh
if grep -qE 'FAILED .*(AttentionTensorCores|Bf16TrainingTracksFp32)' "$work/gpu_tests.log" 2>/dev/null; then
  echo "== tensor-core attention failed its tests: the later steps run with KIT_ATTENTION=rows"
  export KIT_ATTENTION=rows
fi
step train "${KIT_T_TRAIN:-180}" bash tests/gpu/kit_train.sh
step multi "${KIT_T_MULTI:-100}" bash tests/gpu/kit_multi.sh
bench_args=(--steps 6 --warmup 2)
[ "${KIT_FULL:-0}" = 1 ] || bench_args+=(--precision bf16)
KIT_BENCH_PART=main step bench "${KIT_T_BENCH:-100}" bash tests/gpu/kit_bench.sh "${bench_args[@]}"
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
KIT_BENCH_PART=variants step variants "${KIT_T_VARIANTS:-100}" bash tests/gpu/kit_bench.sh --steps 4 --warmup 1
step kernels "${KIT_T_KERNELS:-90}" bash tests/gpu/kit_kernels.sh
KIT_KERNELS_NAME=kernels_dh128 step "kernels d_h 128" "${KIT_T_KERNELS128:-45}" bash tests/gpu/kit_kernels.sh --preset wiola-1.5b --only attention
KIT_SAN_TOOLS=memcheck step memcheck "${KIT_T_MEMCHECK:-90}" bash tests/gpu/kit_sanitizer.sh
step big "${KIT_T_BIG:-100}" bash tests/gpu/kit_big.sh
KIT_SAN_TOOLS=racecheck step racecheck "${KIT_T_RACECHECK:-120}" bash tests/gpu/kit_sanitizer.sh
KIT_BENCH_PART=compile step compile "${KIT_T_COMPILE:-0}" bash tests/gpu/kit_bench.sh
rm -rf "$work"
