#!/usr/bin/env bash
# Per-layout figures for distributed training (issue 4): trains the same model
# and global batch under each process layout and collects every run's
# report.json (tokens/s, measured and analytic communication bytes per rank
# per step, predicted and measured pipeline bubble, peak RSS per rank) into
# one table and plot (bench/dist_report.py).
#
#   bench/dist_layouts.sh [WORK_DIR] [--set key=value ...]
#
# Defaults: wiola-small (d=128, L=6, V=32000, T=128), micro-batch 2 x 4
# micro-batches (global batch 8 for every layout), 12 steps (figures from
# steps 2..12), on the bundled Brown corpus. The OpenMP threads per rank are
# cores / ranks, so every layout uses the same cores; with more ranks than
# cores (4 ranks on this 2-core machine) the ranks time-share and tokens/s
# says nothing about scaling, only the communication and bubble figures do.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/.." && pwd)
work=${1:-$root/runs/dist-bench}; shift || true
wiola=$root/build/wiola
cores=$(nproc)
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
mkdir -p "$work"
if [ ! -f "$work/shards/manifest.json" ]; then
  xz -dc "$root/data/brown/brown.txt.xz" > "$work/brown.txt"
  "$wiola" prep --no-progress --tokenizer "$root/data/wiola360m/tokenizer.json" \
    --output "$work/shards" "$work/brown.txt" > "$work/prep.log"
fi
common=(--set model.preset=wiola-small --set train.micro_batch=2 --set train.grad_accum=4
        --set train.steps=12 --set train.lr_max=1e-3 --set "data.path=$work/shards/manifest.json" -q "$@")
layouts=(
  "single|1|"
  "dp2|2|parallel.dp=2 train.grad_accum=2"
  "dp2_nooverlap|2|parallel.dp=2 train.grad_accum=2 parallel.overlap=false"
  "dp2_nozero|2|parallel.dp=2 train.grad_accum=2 parallel.zero=false"
  "tp2|2|parallel.tp=2"
  "pp2|2|parallel.pp=2"
  "pp2_gpipe|2|parallel.pp=2 parallel.schedule=gpipe"
  "pp2_layers|2|parallel.pp=2 parallel.stage_balance=layers"
  "pp4|4|parallel.pp=4"
  "pp4_layers|4|parallel.pp=4 parallel.stage_balance=layers"
  "tp2_pp2|4|parallel.tp=2 parallel.pp=2"
  "tp2_dp2|4|parallel.tp=2 parallel.dp=2 train.grad_accum=2"
  "pp2_dp2|4|parallel.pp=2 parallel.dp=2 train.grad_accum=2"
)
for spec in "${layouts[@]}"; do
  IFS='|' read -r name np sets <<< "$spec"
  threads=$(( cores / np )); [ "$threads" -ge 1 ] || threads=1
  args=()
  for s in $sets; do args+=(--set "$s"); done
  echo "== $name ($np ranks, $threads threads each)"
  OMP_NUM_THREADS=$threads mpirun -np "$np" --bind-to none "$wiola" train "${common[@]}" "${args[@]}" \
    --set train.threads="$threads" --set "train.run_dir=$work/$name" > "$work/$name.log" 2>&1 \
    || { echo "   FAILED (see $work/$name.log)"; tail -3 "$work/$name.log"; exit 1; }
  grep -E "^done:|pipeline:" "$work/$name.log" | sed 's/^/   /'
done
/usr/bin/python3 "$here/dist_report.py" "$work" "${layouts[@]%%|*}"
