#!/usr/bin/env bash
# What a checkpoint costs the step loop (docs/checkpoints.md): the same run
# three times in one go — no checkpoints, checkpoint.every=K with blocking
# writes, and with background writes — and the time the loop lost per save.
#
#   bench/ckpt_cost.sh [WIOLA] [extra --set ...]
#
# Defaults: wiola-small (V = 32000, d = 128: a 70 MB checkpoint of
# parameters + AdamW moments), micro-batch 8, 24 steps, a save every 4 steps,
# 2 threads, one process. Prints the loop's wall time per variant, the
# cost per save (loop time minus the no-checkpoint loop, over the saves) and
# the async/sync ratio. Timings on a shared machine are noisy: compare the
# variants of one invocation, not across invocations.
set -euo pipefail
cd "$(dirname "$0")/.."
wiola=${1:-build/wiola}
shift || true
work=${WORK:-runs/ckpt-cost}
steps=${STEPS:-24}
every=${EVERY:-4}
python=${WIOLA_PYTHON:-/usr/bin/python3}
mkdir -p "$work"
if [ ! -f "$work/shards/manifest.json" ]; then
  xz -dc data/brown/brown.txt.xz | head -c 2000000 > "$work/brown.txt"
  "$wiola" prep --no-progress --tokenizer data/wiola360m/tokenizer.json --output "$work/shards" "$work/brown.txt" \
    > /dev/null
fi
common=(--set model.preset=wiola-small --set train.micro_batch=8 --set "train.steps=$steps" --set train.threads=2
        --set "data.path=$work/shards/manifest.json" -q "$@")
run() {  # name, extra args...
  local name=$1; shift
  rm -rf "${work:?}/$name"
  local t0; t0=$(date +%s%N)
  "$wiola" train "${common[@]}" --set "train.run_dir=$work/$name" "$@" > "$work/$name.log"
  echo $(( $(date +%s%N) - t0 )) > "$work/$name.wall"  # ns
}
run none
run sync --set "checkpoint.dir=$work/sync/ck" --set "checkpoint.every=$every" --set checkpoint.async=false
run async --set "checkpoint.dir=$work/async/ck" --set "checkpoint.every=$every" --set checkpoint.async=true
"$python" - "$work" "$steps" "$every" <<'EOF'
import json, os, sys
work, steps, every = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
def loop_s(name):
    # Sum of step times + the time between steps (saves happen after a step's
    # timer stops): the span from the first step's start to the last's end.
    rows = [json.loads(l) for l in open(f"{work}/{name}/metrics.jsonl")]
    return sum(r["step_ms"] for r in rows) / 1e3, len(rows)
def size_mb(name):
    ck = f"{work}/{name}/ck"
    newest = sorted(d for d in os.listdir(ck) if d.startswith("step-"))[-1]
    return sum(os.path.getsize(f"{ck}/{newest}/{f}") for f in os.listdir(f"{ck}/{newest}")) / 1e6
saves = steps // every + (0 if steps % every == 0 else 1)
base_steps, _ = loop_s("none")
wall = {n: float(open(f"{work}/{n}.wall").read()) / 1e9 for n in ("none", "sync", "async")}
print(f"ckpt_cost: wiola-small, {steps} steps, a save every {every} steps ({saves} saves, "
      f"{size_mb('sync'):.1f} MB each)")
print(f"  {'variant':8s} {'wall s':>8s} {'sum of step times s':>20s} {'lost per save s':>16s}")
lost = {}
for n in ("none", "sync", "async"):
    s, _ = loop_s(n)
    lost[n] = (wall[n] - wall["none"]) / saves if n != "none" else 0.0
    print(f"  {n:8s} {wall[n]:8.1f} {s:20.2f} {lost[n]:16.2f}")
if lost["sync"] > 0:
    print(f"  async/sync cost per save: {lost['async'] / lost['sync']:.2f} "
          f"(step-time slowdown while writing in the background: "
          f"{loop_s('async')[0] / base_steps:.3f}x the no-checkpoint steps)")
EOF
