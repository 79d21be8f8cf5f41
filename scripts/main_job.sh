#!/usr/bin/env bash
# The main job: install missing dependencies (as root), build, tokenize the
# bundled Brown corpus once, train wiola-small on the CPU (configs/brown-small.toml)
# and plot the metrics. Extra arguments go to `wiola train`, e.g.
#   scripts/main_job.sh --set train.steps=50
set -euo pipefail
cd "$(dirname "$0")/.."

scripts/setup.sh
scripts/build.sh --target wiola   # tests are built by scripts/test.sh

# Single-process Open MPI as root needs these (harmless otherwise).
if [ "$(id -u)" -eq 0 ]; then
  export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
fi

CONFIG=configs/brown-small.toml
SHARDS=runs/brown-shards

# ---- data: Brown corpus -> HDF5 token shards (once) ----
if [ ! -f "$SHARDS/manifest.json" ]; then
  tokenizer="data/wiola360m/tokenizer.json"   # bundled (MIT, see its README)
  if [ ! -f "$tokenizer" ]; then
    echo "main_job.sh: tokenizer not found: $tokenizer" >&2
    exit 1
  fi
  mkdir -p runs
  echo "main_job.sh: tokenizing data/brown/brown.txt.xz into $SHARDS"
  xz -dc data/brown/brown.txt.xz > runs/brown.txt.tmp
  mv runs/brown.txt.tmp runs/brown.txt
  build/wiola prep --no-progress --tokenizer "$tokenizer" --output "$SHARDS" runs/brown.txt
fi

# ---- where this run writes: train.run_dir of the config, or a --set override ----
run_dir=$(sed -n 's/^[[:space:]]*run_dir[[:space:]]*=[[:space:]]*["'\'']\([^"'\'']*\)["'\''].*/\1/p' \
          "$CONFIG" 2>/dev/null | head -n 1)
for arg in "$@"; do
  arg=${arg#--set=}
  case "$arg" in
    train.run_dir=*)
      run_dir=${arg#train.run_dir=}
      run_dir=${run_dir#[\"\']}
      run_dir=${run_dir%[\"\']}
      ;;
  esac
done
run_dir=${run_dir:-runs/brown-small}

# ---- train ----
build/wiola train --config "$CONFIG" "$@"

# ---- plot (optional: needs matplotlib) ----
metrics="$run_dir/metrics.jsonl"
plot="$run_dir/loss.png"
if /usr/bin/python3 scripts/plot_metrics.py "$metrics" -o "$plot"; then
  plot_note="$plot"
else
  plot_note="(not written: plot_metrics.py failed, see above)"
fi
echo
echo "metrics: $metrics"
echo "config:  $run_dir/config.toml"
echo "plot:    $plot_note"
