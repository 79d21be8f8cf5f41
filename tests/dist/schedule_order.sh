#!/usr/bin/env bash
# Executed pipeline order (issue 37): `wiola train` under mpirun with
# WIOLA_TRACE_SCHEDULE=1 for one layout and schedule and several
# micro-batch counts (2 steps each, wiola-tiny with 8 layers), then
# schedule_trace_check compares every rank's executed actions with
# dist::to_string(schedule(pp, stage, m)) and the simulator's per-rank order
# with the same lists.
#
#   schedule_order.sh WIOLA CHECK WORK NAME SCHEDULE PP DP M...
# VSTAGES: the interleaved schedule's chunks per rank (default 2).
# TRACE=1: the runs also write the timeline of their last step
# (train.trace_steps, RUN_DIR/trace.json), which trace_check.py reads back:
# valid trace-event JSON, every rank's actions in the executed order, the
# idle share per rank within 5 points of report.json's bubble.
# WORK is tests/dist/equivalence's folder (its shards: the dist_equiv fixture).
set -euo pipefail
wiola=$1; check=$2; work=$3; name=$4; schedule=$5; pp=$6; dp=$7; shift 7
steps=2
trace=()
[ -z "${TRACE:-}" ] || trace=(--set "train.trace_steps=[[$steps, $steps]]")
for m in "$@"; do
  out="$work/order_${name}_m$m"
  rm -rf "$out"
  WIOLA_TRACE_SCHEDULE=1 "${MPIEXEC:-mpiexec}" -n $((pp * dp)) --bind-to none "$wiola" train \
    --set model.preset=wiola-tiny --set model.vocab_size=32000 --set model.n_layers=8 \
    --set train.micro_batch=1 --set train.grad_accum="$m" --set train.steps=$steps --set train.threads=1 \
    --set parallel.pp="$pp" --set parallel.dp="$dp" --set parallel.schedule="$schedule" \
    --set parallel.virtual_stages="${VSTAGES:-2}" \
    --set "data.path=$work/shards/manifest.json" --set "train.run_dir=$out" "${trace[@]}" -q
  "$check" "$out" "$schedule" "$pp" "$dp" 1 "$m" $steps "${VSTAGES:-2}"
  [ -z "${TRACE:-}" ] || "${WIOLA_PYTHON:-/usr/bin/python3}" "$(dirname "$0")/trace_check.py" "$out" \
    $((pp * dp)) "$pp" $steps
done
