#!/usr/bin/env bash
# Multi-GPU check for a node with 2-8 GPUs, MPI, HDF5 and a CUDA build of
# wiola (scripts/build.sh with nvcc present). NOT YET RUN ON GPUs: the machines
# this project has been lent have one GPU, where NCCL refuses two ranks. It
# runs end to end on the CUDA emulator in CI (ctest emu.multi_gpu_dry_run;
# docs/gpu.md "Several GPUs" says what was verified where).
#
#   tests/gpu/multi_gpu.sh [WIOLA] [WORK]      (defaults: build/wiola, /tmp/wiola-multi-gpu)
#
# 0. The communicator contract on NCCL across ranks: test_mpi_comm's
#    MpiComm.NcclDataPlaneMatchesMpi (every collective, in-place forms and a
#    point-to-point ring against MPI on host buffers) on 2 and on all GPUs.
# 1. Equivalence, cuda-fp32 (TF32 off), NCCL data plane: a 10-step run of a
#    small Wiola with ATM active under dp2, tp2, pp2 and tp2 x pp2 (layouts
#    needing more GPUs than the node has are skipped and named) against the
#    one-GPU run: every loss and final parameter within 1e-4 relative
#    (compare_runs.py; GPU reductions change order with the layout, so the
#    bound is the CPU equivalence tests' 1e-5 widened by fp32 GEMM rounding),
#    identical ATM decisions at the dumped step.
# 2. Checkpoints move across: 5 steps under tp2 x pp2 (or the widest layout
#    run), resumed to step 10 on ONE CPU process: within 1e-4 of the one-GPU
#    run.
# 3. Throughput, bf16 (the training default): wiola-120m at T=1024 for 20
#    steps per layout (one GPU, dp2..dpN, tp2, pp2, tp2 x pp2): tokens/s,
#    MFU and the exposed against hidden communication per step from each
#    run's report.json, into $OUT/multi_gpu.json and a table on stdout.
# Exit status: non-zero when any equivalence or checkpoint check fails.
#
# A dry run on the CUDA emulator (ctest emu.multi_gpu_dry_run) sets, instead
# of the defaults: WIOLA_GPU_COUNT (the GPUs, without nvidia-smi), CONTRACT
# (the contract test binary), STEPS (10; the checkpoint is taken at half) and
# TPUT_PRESET, TPUT_SEQ, TPUT_MICRO, TPUT_ACCUM, TPUT_STEPS (wiola-120m, 1024,
# 4, 8, 20), TPUT_EXTRA (more --set words) and TPUT_LAYOUTS (the layouts to
# time, comma-separated; default all) for the throughput runs.
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
wiola=${1:-$root/build/wiola}
work=${2:-/tmp/wiola-multi-gpu}
OUT=${OUT:-$work/out}
python=${WIOLA_PYTHON:-/usr/bin/python3}
mpirun_=("${MPIEXEC:-mpirun}" --bind-to none)
[ "$(id -u)" = 0 ] && export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
ngpu=${WIOLA_GPU_COUNT:-$(nvidia-smi -L 2>/dev/null | grep -c '^GPU' || true)}
steps=${STEPS:-10}
if [ "${ngpu:-0}" -lt 2 ]; then
  echo "multi_gpu: this node has ${ngpu:-0} GPU(s); the check needs 2 or more" >&2
  exit 77
fi
rm -rf "$work"; mkdir -p "$work" "$OUT"
echo "multi_gpu: $ngpu GPUs; $("$wiola" --version | head -1); work $work"
[ -z "${WIOLA_GPU_COUNT:-}" ] &&
  nvidia-smi --query-gpu=index,name,memory.total --format=csv,noheader | sed 's/^/multi_gpu:   /'

xz -dc "$root/data/brown/brown.txt.xz" > "$work/brown.txt"
"$wiola" prep --no-progress --tokenizer "$root/data/wiola360m/tokenizer.json" \
  --output "$work/shards" "$work/brown.txt" > "$work/prep.log" || exit 1
small=(--set model.preset=wiola-tiny --set model.vocab_size=32000 --set model.atm_tau=0.7
       --set train.micro_batch=2 --set train.grad_accum=4 --set train.steps=$steps --set train.lr_max=1e-3
       --set "data.path=$work/shards/manifest.json" --set train.backend=cuda-fp32 -q)
nccl=(--set parallel.data_plane=nccl)
fails=0
check() {  # check NAME CMD...: runs, records pass/fail
  local name=$1; shift
  if "$@" > "$work/$name.log" 2>&1; then echo "multi_gpu: PASS $name"
  else echo "multi_gpu: FAIL $name (log: $work/$name.log)"; tail -5 "$work/$name.log"; fails=$((fails + 1)); fi
}

# ---- 0. the contract ----
contract=${CONTRACT:-$(dirname "$wiola")/tests/dist/test_mpi_comm}
for np in 2 "$ngpu"; do
  check "contract_np$np" "${mpirun_[@]}" -n "$np" "$contract" --gtest_filter=MpiComm.NcclDataPlaneMatchesMpi
  grep -q SKIPPED "$work/contract_np$np.log" && { echo "multi_gpu: FAIL contract_np$np skipped"; fails=$((fails + 1)); }
  [ "$ngpu" = 2 ] && break
done

# ---- 1. equivalence ----
"$wiola" train "${small[@]}" --set "train.run_dir=$work/single" --dump-step "$steps:$work/single.h5" \
  > "$work/single.log" 2>&1 || { echo "multi_gpu: the one-GPU reference failed"; tail "$work/single.log"; exit 1; }
# The global batch stays 8 (micro 2 x accum 4 x dp 1): dp2 halves the accumulation.
declare -A layouts=([dp2]="2 --set parallel.dp=2 --set train.grad_accum=2" [tp2]="2 --set parallel.tp=2"
                    [pp2]="2 --set parallel.pp=2" [tp2pp2]="4 --set parallel.tp=2 --set parallel.pp=2"
                    [dp2tp2]="4 --set parallel.dp=2 --set parallel.tp=2 --set train.grad_accum=2")
widest=""
for name in dp2 tp2 pp2 tp2pp2 dp2tp2; do
  read -r np args <<< "${layouts[$name]}"
  if [ "$np" -gt "$ngpu" ]; then echo "multi_gpu: SKIP $name (needs $np GPUs)"; continue; fi
  # shellcheck disable=SC2086
  run() { "${mpirun_[@]}" -n "$np" "$wiola" train "${small[@]}" "${nccl[@]}" $args \
            --set "train.run_dir=$work/$name" --dump-step "$steps:$work/$name.h5" &&
          "$python" "$root/tests/dist/compare_runs.py" --tol 1e-4 "$work/single" "$work/single.h5" \
            "$work/$name" "$work/$name.h5"; }
  check "equiv_$name" run
  widest=$name
done

# ---- 2. a multi-GPU checkpoint resumed on one CPU process ----
read -r np args <<< "${layouts[$widest]}"
# shellcheck disable=SC2086
resume() {
  local out=$work/ckpt_$widest
  "${mpirun_[@]}" -n "$np" "$wiola" train "${small[@]}" "${nccl[@]}" $args --set "train.run_dir=$out" \
    --set "checkpoint.dir=$out/ck" --set train.max_steps=$((steps / 2)) --set checkpoint.every=$((steps / 2)) &&
  "$wiola" train "${small[@]}" --set train.backend=cpu --set "train.run_dir=$out" --set "checkpoint.dir=$out/ck" \
    --dump-step "$steps:$out.h5" &&
  "$python" "$root/tests/dist/compare_runs.py" --tol 1e-4 "$work/single" "$work/single.h5" "$out" "$out.h5"
}
check "checkpoint_${widest}_to_cpu" resume

# ---- 3. throughput per layout (bf16) ----
big=(--set "model.preset=${TPUT_PRESET:-wiola-120m}" --set "model.seq_len=${TPUT_SEQ:-1024}"
     --set "train.micro_batch=${TPUT_MICRO:-4}" --set "train.grad_accum=${TPUT_ACCUM:-8}"
     --set "train.steps=${TPUT_STEPS:-20}" --set "data.path=$work/shards/manifest.json" --set train.backend=cuda -q)
# shellcheck disable=SC2206
big+=(${TPUT_EXTRA:-})
tp_layouts=("1 one_gpu" "2 dp2 --set parallel.dp=2" "2 tp2 --set parallel.tp=2" "2 pp2 --set parallel.pp=2"
            "4 tp2pp2 --set parallel.tp=2 --set parallel.pp=2" "$ngpu dp$ngpu --set parallel.dp=$ngpu")
for spec in "${tp_layouts[@]}"; do
  read -r np name args <<< "$spec"
  [ "$np" -gt "$ngpu" ] && continue
  [ -n "${TPUT_LAYOUTS:-}" ] && [[ ",$TPUT_LAYOUTS," != *",$name,"* ]] && continue
  # shellcheck disable=SC2086
  "${mpirun_[@]}" -n "$np" "$wiola" train "${big[@]}" "${nccl[@]}" $args --set "train.run_dir=$work/tput_$name" \
    > "$work/tput_$name.log" 2>&1 || echo "multi_gpu: throughput run $name failed (log: $work/tput_$name.log)"
done
"$python" - "$work" "$OUT/multi_gpu.json" <<'PY'
import json, pathlib, sys
work, out = pathlib.Path(sys.argv[1]), sys.argv[2]
rows = []
for d in sorted(work.glob("tput_*")):
    rep = d / "report.json"
    if not rep.is_file():
        continue
    r = json.loads(rep.read_text())
    t = r.get("time_per_step_s", {}).get("mean", {})
    rows.append({"layout": d.name[5:], "tokens_per_s": r.get("tokens_per_s"), "mfu": r.get("mfu"),
                 "step_s": t.get("total"), "comm_exposed_s": t.get("comm"), "comm_hidden_s": t.get("comm_hidden"),
                 "bubble_s": t.get("bubble")})
json.dump(rows, open(out, "w"), indent=1)
print(f"{'layout':10} {'tokens/s':>10} {'MFU':>6} {'step ms':>8} {'exposed ms':>11} {'hidden ms':>10} {'bubble ms':>10}")
ms = lambda x: f"{1e3 * x:.1f}" if isinstance(x, (int, float)) else "-"
for w in rows:
    print(f"{w['layout']:10} {w['tokens_per_s'] or 0:10.0f} {100 * (w['mfu'] or 0):5.1f}% {ms(w['step_s']):>8} "
          f"{ms(w['comm_exposed_s']):>11} {ms(w['comm_hidden_s']):>10} {ms(w['bubble_s']):>10}")
PY
echo "multi_gpu: $fails check(s) failed; figures in $OUT/multi_gpu.json"
[ "$fails" = 0 ]
