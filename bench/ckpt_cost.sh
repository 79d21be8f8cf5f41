#!/usr/bin/env bash
# What a checkpoint costs the step loop (docs/checkpoints.md): the same run
# three times in one go (no checkpoints, checkpoint.every=K with blocking
# writes, and with background writes).
#
#   bench/ckpt_cost.sh [WIOLA] [extra --set ...]
#
# Defaults: wiola-small (V = 32000, d = 128: a 71 MB checkpoint of
# parameters + AdamW moments), micro-batch 8, 24 steps, a save every 4 steps,
# 2 threads, one process. Prints how long the step loop waits per save
# (metrics.jsonl's checkpoint_ms) with blocking and with background writes,
# and the step time while a background write runs against the same step
# without checkpoints. Timings on a shared machine are noisy: compare the
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
  (xz -dc data/brown/brown.txt.xz || true) | head -c 2000000 > "$work/brown.txt"  # xz stops on SIGPIPE
  "$wiola" prep --no-progress --tokenizer data/wiola360m/tokenizer.json --output "$work/shards" "$work/brown.txt" \
    > /dev/null
fi
common=(--set model.preset=wiola-small --set train.micro_batch=8 --set "train.steps=$steps" --set train.threads=2
        --set "data.path=$work/shards/manifest.json" -q "$@")
run() {  # name, extra args...
  local name=$1; shift
  rm -rf "${work:?}/$name"
  "$wiola" train "${common[@]}" --set "train.run_dir=$work/$name" "$@" > "$work/$name.log"
}
run none
run sync --set "checkpoint.dir=$work/sync/ck" --set "checkpoint.every=$every" --set checkpoint.async=false
run async --set "checkpoint.dir=$work/async/ck" --set "checkpoint.every=$every" --set checkpoint.async=true
"$python" - "$work" "$every" <<'EOF'
import json, os, statistics, sys
work, every = sys.argv[1], int(sys.argv[2])
rows = {n: [json.loads(l) for l in open(f"{work}/{n}/metrics.jsonl")] for n in ("none", "sync", "async")}
def size_mb(name):
    ck = f"{work}/{name}/ck"
    newest = sorted(d for d in os.listdir(ck) if d.startswith("step-"))[-1]
    return sum(os.path.getsize(f"{ck}/{newest}/{f}") for f in os.listdir(f"{ck}/{newest}")) / 1e6
def med(xs):
    return statistics.median(xs) if xs else float("nan")
# The loop's wait after a save step (checkpoint_ms: snapshot + write for
# blocking saves; the snapshot, plus any wait for the previous write, for
# background ones; the last step is left out: it always waits for its
# write), and the step time while a background write runs (the step after
# each save) against the same steps of the run without checkpoints.
n = len(rows["none"])
saves = [r["step"] for r in rows["sync"] if r["step"] % every == 0 and r["step"] < n]
wait = {v: [r["checkpoint_ms"] for r in rows[v] if r["step"] in saves] for v in ("sync", "async")}
after = [s + 1 for s in saves]
step_ms = {v: med([r["step_ms"] for r in rows[v] if r["step"] in after]) for v in rows}
print(f"ckpt_cost: wiola-small, {n} steps, a save every {every} steps ({size_mb('sync'):.1f} MB each); "
      f"medians over {len(saves)} saves")
print(f"  loop waits per save: blocking {med(wait['sync']):.0f} ms, background {med(wait['async']):.0f} ms "
      f"(background/blocking {med(wait['async']) / med(wait['sync']):.3f})")
print(f"  step after a save: none {step_ms['none']:.0f} ms, blocking {step_ms['sync']:.0f} ms, "
      f"background {step_ms['async']:.0f} ms ({step_ms['async'] / step_ms['none']:.3f}x none)")
print("  median step overall: " + ", ".join(f"{v} {med([r['step_ms'] for r in rows[v]]):.0f} ms" for v in rows))
EOF
