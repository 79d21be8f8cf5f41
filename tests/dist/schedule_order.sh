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
# WORK is tests/dist/equivalence's folder (its shards: the dist_equiv fixture).
set -euo pipefail
wiola=$1; check=$2; work=$3; name=$4; schedule=$5; pp=$6; dp=$7; shift 7
steps=2
for m in "$@"; do
  out="$work/order_${name}_m$m"
  rm -rf "$out"
  WIOLA_TRACE_SCHEDULE=1 "${MPIEXEC:-mpiexec}" -n $((pp * dp)) --bind-to none "$wiola" train \
    --set model.preset=wiola-tiny --set model.vocab_size=32000 --set model.n_layers=8 \
    --set train.micro_batch=1 --set train.grad_accum="$m" --set train.steps=$steps --set train.threads=1 \
    --set parallel.pp="$pp" --set parallel.dp="$dp" --set parallel.schedule="$schedule" \
    --set parallel.virtual_stages="${VSTAGES:-2}" \
    --set "data.path=$work/shards/manifest.json" --set "train.run_dir=$out" -q
  "$check" "$out" "$schedule" "$pp" "$dp" 1 "$m" $steps "${VSTAGES:-2}"
done
