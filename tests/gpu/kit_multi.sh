#!/usr/bin/env bash
# GPU kit (6), on the GPU machine: several ranks sharing its one GPU, launched
# by the kit's mpirun. NCCL refuses two ranks on one device, so the trainer's
# "auto" data plane passes tensors through host memory there ("mpi-staged"):
# this checks the multi-rank GPU path (each rank's streams and asynchronous
# copies, the TP sums, the pipeline's stage links with the GCLA summaries,
# ZeRO's buckets, checkpoint slices) on any one-GPU host. NCCL across ranks
# stays unproven until a multi-GPU node runs tests/gpu/multi_gpu.sh.
#
# Every layout runs wiola-small (the dry run: wiola-tiny) for $steps steps of
# 2 micro-batches with a checkpoint at the end, and is compared with the
# one-process GPU run of the same backend, as the CPU layout tests compare
# (tests/dist): losses within TOL relative, `wiola ckpt diff --tol TOL`
# (whole model TOL, each tensor 10 TOL):
#   fp32_dp2 fp32_tp2 fp32_pp2 fp32_tp2_pp2   cuda-fp32, TOL 1e-5 (dp2: ZeRO)
#   fp32_pp2_il2 fp32_pp2_zbv                 cuda-fp32, TOL 1e-5: the chunked
#                    pipeline schedules (interleaved with 2 chunks per rank,
#                    ZB-V), each rank's chunks in one parameter store
#   bf16_dp2 bf16_tp2_pp2                     cuda (bf16), TOL 5e-3
#   tp2_pp2_to_cpu   cuda-fp32 tp2 x pp2 to step $half with a checkpoint,
#                    continued as one CPU process: against the one-process
#                    GPU run, TOL 1e-5
#   cpu_to_tp2_pp2   the reverse: one CPU process to step $half, continued on
#                    tp2 x pp2 on the GPU
#   plane            every multi-rank run said its ranks share the GPU and
#                    chose the staged data plane
#   nccl_refused     parallel.data_plane = "nccl" on ranks sharing the GPU
#                    stops at once with one message saying why
#
# Writes $OUT/multi.json and $OUT/multi.log; exit status 1 if a check failed.
# Environment: KIT_BIN (default the kit's wiola) and MPIEXEC (default the
# kit's mpirun), KIT_MULTI_DRY=1 (the short form CI runs on the CUDA emulator
# with one emulated device: WIOLA_EMU_DEVICES=1).
set -uo pipefail
cd "$(dirname "$0")/../.."
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
. tests/gpu/kit_lib.sh
exec > >(tee "$OUT/multi.log") 2>&1

# The layouts sharing the GPU: NAME NP TP PP DP BACKEND TOL [SCHEDULE].
layouts=("fp32_dp2 2 1 1 2 cuda-fp32 1e-5" "fp32_tp2 2 2 1 1 cuda-fp32 1e-5" "fp32_pp2 2 1 2 1 cuda-fp32 1e-5"
         "fp32_tp2_pp2 4 2 2 1 cuda-fp32 1e-5" "bf16_dp2 2 1 1 2 cuda 5e-3" "bf16_tp2_pp2 4 2 2 1 cuda 5e-3"
         "fp32_pp2_il2 2 1 2 1 cuda-fp32 1e-5 interleaved" "fp32_pp2_zbv 2 1 2 1 cuda-fp32 1e-5 zb-v")
if [ "${KIT_MULTI_DRY:-0}" = 1 ]; then
  model=(--set model.preset=wiola-tiny --set model.vocab_size=32000 --set model.atm_tau=0.3
         --set train.micro_batch=2)
  steps=2 half=1 text_bytes=300000
  # Three layouts run every line of the loop (4 ranks with TP and PP, bf16
  # with DP's accumulation, a named schedule); the others are the same lines,
  # and each of them runs on the emulator, on devices of its own, in
  # ctest's emu.layout_* tests.
  layouts=("${layouts[3]}" "${layouts[4]}" "${layouts[7]}")
else
  model=(--set model.preset=wiola-small --set model.atm_tau=0.3 --set train.micro_batch=4)
  steps=8 half=4 text_bytes=2000000
fi
common=("${model[@]}" "${kit_sets[@]}" --set train.grad_accum=2 --set train.steps=$steps --set train.lr_max=1e-3
        --set train.log_every=1 --set train.eval_every=0 --set train.seed=1234 --set train.threads=1
        --set checkpoint.keep=100 --set "data.path=$work/shards/manifest.json" -q)
run() {  # run NAME NP [--set ...]: NAME on NP ranks (1: no launcher), its stderr in $work/NAME.err
  local name=$1 np=$2; shift 2
  local args=(train "${common[@]}" --set "train.run_dir=$work/$name" --set "checkpoint.dir=$work/$name/ck" "$@")
  if [ "$np" = 1 ]; then
    "$w" "${args[@]}" 2> "$work/$name.err"
  else
    "$mpirun_bin" -n "$np" --bind-to none "$w" "${args[@]}" 2> "$work/$name.err"
  fi
  local rc=$?
  [ "$rc" = 0 ] || { echo "$name: exit $rc"; tail -5 "$work/$name.err"; }
  return $rc
}
layout() {  # layout NP TP PP DP: the --set flags of a layout
  echo --set parallel.tp=$2 --set parallel.pp=$3 --set parallel.dp=$4
}
# compare NAME REF TOL EXIT: NAME's losses and final checkpoint against REF's.
compare() {
  local figs same lr ok=0
  figs=$(ckpt_diff "$work/$2/ck" "$work/$1/ck" --tol "$3"); same=$?
  lr=$(loss_rel "$work/$2" "$work/$1")
  [ "$4" = 0 ] && [ "$same" = 0 ] && losses_ok "$lr" within "$3" && ok=1
  record "$1" $ok "{\"exit\": $4, \"ranks\": $5, \"tol\": $3, \"diff\": $figs, \"losses\": $lr}"
}

"$w" --version | head -1
prep_brown "$text_bytes" || { echo "prep failed"; exit 1; }

echo "== one process on the GPU: the references"
run single_fp32 1 --set train.backend=cuda-fp32
run single_bf16 1 --set train.backend=cuda

echo "== layouts sharing the GPU"
multi=()
for spec in "${layouts[@]}"; do
  read -r name np tp pp dp backend tol schedule <<< "$spec"
  # dp2 halves the micro-batches per rank: the same global batch.
  accum=(); [ "$dp" = 2 ] && accum=(--set train.grad_accum=1)
  sched=(); [ -n "$schedule" ] && sched=(--set parallel.schedule="$schedule")
  # shellcheck disable=SC2046
  run "$name" "$np" --set train.backend=$backend $(layout "$np" "$tp" "$pp" "$dp") "${accum[@]}" "${sched[@]}"
  rc=$?
  ref=single_fp32; [ "$backend" = cuda ] && ref=single_bf16
  compare "$name" "$ref" "$tol" "$rc" "$np"
  multi+=("$name")
done

echo "== checkpoints between a tp2 x pp2 GPU run and one CPU process"
# shellcheck disable=SC2046
run tp2_pp2_to_cpu 4 --set train.backend=cuda-fp32 $(layout 4 2 2 1) --set checkpoint.every=$half \
  --set train.max_steps=$half && run tp2_pp2_to_cpu 1 --set train.backend=cpu
compare tp2_pp2_to_cpu single_fp32 1e-5 $? 4
run cpu_to_tp2_pp2 1 --set train.backend=cpu --set checkpoint.every=$half --set train.max_steps=$half &&
  # shellcheck disable=SC2046
  run cpu_to_tp2_pp2 4 --set train.backend=cuda-fp32 $(layout 4 2 2 1)
compare cpu_to_tp2_pp2 single_fp32 1e-5 $? 4
multi+=(cpu_to_tp2_pp2)

# The trainer's own word on its data plane, from every multi-rank run.
said=0 staged=()
for name in "${multi[@]}"; do
  grep -q "share GPU .*: tensors between ranks go through host memory" "$work/$name.err" && said=$((said + 1)) &&
    staged+=("\"$name\"")
done
record plane $([ "$said" = "${#multi[@]}" ] && echo 1 || echo 0) \
  "{\"runs\": ${#multi[@]}, \"staged\": [$(IFS=,; echo "${staged[*]}")]}"

echo "== parallel.data_plane = nccl on ranks sharing the GPU"
start=$SECONDS
# shellcheck disable=SC2046
run nccl_refused 2 --set train.backend=cuda $(layout 2 2 1 1) --set parallel.data_plane=nccl
rc=$?
msg=$(grep -m1 "share GPU" "$work/nccl_refused.err" | "$py" -c 'import json,sys; print(json.dumps(sys.stdin.read().strip()))')
ok=0; [ "$rc" != 0 ] && [ "$msg" != '""' ] && ok=1
record nccl_refused $ok "{\"exit\": $rc, \"seconds\": $((SECONDS - start)), \"message\": $msg}"

summarise "$OUT/multi.json" kit_multi
