#!/usr/bin/env bash
# Process layouts on the CUDA emulator (ctest emu.layout_*): wiola_emu trains
# wiola-tiny with train.backend = cuda-fp32, one emulated device per rank,
# the tensors between ranks on the emulated NCCL (parallel.data_plane =
# "nccl"), 2 steps of 2 micro-batches of 2 sequences, ATM merging 10-35 % of
# the keys (tau = 0.3: the CPU tests' 0.7 merges nothing by step 2); each layout
# must match the one-process run on the same backend within the layout
# bounds of tests/dist (compare_runs.py: losses 1e-5, any tensor 1e-4, no
# differing ATM decision). The CPU layouts' own tests prove the trainer's
# logic; these prove the GPU path under it: the NCCL communicator across
# ranks, its streams and waits, TP split sums, pipeline lanes and ZeRO on
# device buffers.
#
#   emu_layouts.sh single WIOLA_EMU WIOLA SHARDS WORK NAME [--set ...]
#                          a one-process reference
#   emu_layouts.sh run WIOLA_EMU WIOLA SHARDS WORK NAME NP [--set ...]
#                          NAME on NP ranks, compared with the reference
#                          REF (default "single")
#   emu_layouts.sh cpu_resume WIOLA_EMU WIOLA SHARDS WORK NAME NP [--set ...]
#                          NAME's first step with a checkpoint, continued for
#                          the second by `wiola train` on the CPU backend in
#                          one process: within the same bounds (a checkpoint
#                          of a GPU layout loads on any layout, CPU included)
#   emu_layouts.sh from_cpu WIOLA_EMU WIOLA SHARDS WORK NAME NP [--set ...]
#                          the reverse: the first step on the CPU in one
#                          process, the second on NP emulated GPUs
#   emu_layouts.sh resume WIOLA_EMU WIOLA SHARDS WORK NAME NP [--set ...]
#                          NAME stopped after its first step and resumed on
#                          the same layout: bit for bit the uninterrupted run
#                          NAME (which must have run)
# TOL, TOL_TENSOR, ATM_FLIPS: the bounds (compare_runs.py; wider for bf16).
# PLANE: the data plane report.json must name (run mode).
# A passing test deletes its dump and checkpoints unless KEEP=1 (a run that a
# resume reads) or WIOLA_TEST_KEEP=1, as in tests/dist/equivalence.sh.
set -euo pipefail
mode=$1; emu=$2; wiola=$3; shards=$4; work=$5; shift 5
here=$(cd "$(dirname "$0")" && pwd)
compare=(${WIOLA_PYTHON:-/usr/bin/python3} "$here/../dist/compare_runs.py" --tol "${TOL:-1e-5}"
         --tol-tensor "${TOL_TENSOR:-1e-4}" --atm-flips "${ATM_FLIPS:-0}")
common=(--set model.preset=wiola-tiny --set model.vocab_size=32000 --set model.atm_tau=0.3
        --set train.micro_batch=2 --set train.grad_accum=2 --set train.steps=2 --set train.lr_max=1e-3
        --set train.threads=1 --set "data.path=$shards/manifest.json" -q)
gpu=(--set train.backend=cuda-fp32 --set parallel.data_plane=nccl)
mpirun_() { "${MPIEXEC:-mpiexec}" -n "$1" --bind-to none "${@:2}"; }
drop_passed() { [ -n "${KEEP:-}${WIOLA_TEST_KEEP:-}" ] || rm -rf "$@"; }

if [ "$mode" = single ]; then
  name=$1; shift
  rm -rf "${work:?}/$name" "$work/$name.h5"; mkdir -p "$work"
  "$emu" train "${common[@]}" --set train.backend=cuda-fp32 "$@" --set "train.run_dir=$work/$name" \
    --dump-step "2:$work/$name.h5"
  exit 0
fi
name=$1; np=$2; shift 2
ref=$work/${REF:-single}
out="$work/$name"
[ "$mode" = resume ] && out="$work/${name}_resume"
rm -rf "$out" "$out.h5"
# The first step, with a checkpoint; then the second from it.
ck=(--set "train.run_dir=$out" --set "checkpoint.dir=$out/ck")
first=(--set checkpoint.every=1 --set train.max_steps=1)
on_gpus() { mpirun_ "$np" "$emu" train "${common[@]}" "${gpu[@]}" "$@"; }
case "$mode" in
  run) on_gpus "$@" --set "train.run_dir=$out" --dump-step "2:$out.h5" ;;
  cpu_resume)
    on_gpus "$@" "${ck[@]}" "${first[@]}"
    "$wiola" train "${common[@]}" "${ck[@]}" --dump-step "2:$out.h5" ;;
  from_cpu)
    "$wiola" train "${common[@]}" "${ck[@]}" "${first[@]}"
    on_gpus "$@" "${ck[@]}" --dump-step "2:$out.h5" ;;
  resume)
    on_gpus "$@" "${ck[@]}" "${first[@]}"
    on_gpus "$@" "${ck[@]}" --dump-step "2:$out.h5"
    "${compare[@]}" --exact "$work/$name" "$work/$name.h5" "$out" "$out.h5"
    drop_passed "$out/ck" "$out.h5"
    exit 0 ;;
  *) echo "emu_layouts.sh: unknown mode '$mode'" >&2; exit 2 ;;
esac
"${compare[@]}" "$ref" "$ref.h5" "$out" "$out.h5"
if [ -n "${PLANE:-}" ]; then
  ${WIOLA_PYTHON:-/usr/bin/python3} - "$out/report.json" "$PLANE" <<'PY'
import json, sys
got = json.load(open(sys.argv[1]))["data_plane"]
print("data plane:", got)
assert got == sys.argv[2], f"data plane {got!r}, expected {sys.argv[2]!r}"
PY
fi
drop_passed "$out/ck" "$out.h5"
