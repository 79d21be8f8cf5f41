#!/usr/bin/env bash
# GPU kit (5), on the GPU machine: `wiola train` end to end on the GPU, as a
# user runs it (HDF5 shards from `wiola prep`, the trainer, checkpoints,
# preemption), with the kit's `wiola` (one process: MPI as an isolated
# singleton, kit_env.sh). Each check prints PASS or FAIL with its figures:
#
#   resume    bf16 (`cuda`): a run stopped by SIGTERM (exit 75, checkpoint at
#             the agreed step), started again, killed with SIGKILL, started
#             again, equals the uninterrupted run bit for bit (`wiola ckpt diff
#             --with-optimizer`) and logs the same loss at every step
#   cpu       `cuda-fp32` against the CPU backend, 8 steps: losses within 1e-5
#             relative, parameters within the layout bounds (`ckpt diff --tol
#             1e-5`: whole model 1e-5, each tensor 1e-4)
#   gpu2cpu   a cuda-fp32 checkpoint of step 4 continued on the CPU to step 8,
#   cpu2gpu   and the reverse: each within those bounds of the other backend's
#             uninterrupted run
#   nccl      bf16 with parallel.data_plane = "nccl" (single-rank NCCL
#             communicators in the trainer) against the default: bit for bit
#   decode    `wiola generate --check-greedy --backend cuda` on the bf16 run's
#             checkpoint: every cached-decoding token is the full forward's argmax
#   eval      `wiola eval` of the fp32 checkpoint on cuda-fp32 and on the CPU:
#             losses within 1e-5 relative
#   speed     wiola-120m at T = 1024, 8 sequences a step, bf16, 30 steps with
#             a checkpoint at the end: the trainer's tokens/s, MFU and peak
#             memory (report.json), not judged
#
# Writes $OUT/train.json (every check: ok and figures) and $OUT/train.log; exit
# status 1 if a check failed. Environment: KIT_TRAIN_BIN (default the kit's
# wiola), KIT_TRAIN_DRY=1 (a short form for the CUDA emulator's wiola_emu on a
# machine without a GPU: wiola-tiny, fewer steps, no speed check),
# KIT_TRAIN_SPEED=0 skips the speed check.
set -uo pipefail
cd "$(dirname "$0")/../.."
if [ -z "${KIT_TRAIN_BIN:-}" ]; then
  . tests/gpu/kit_env.sh
  w=$kit_bin/wiola
else
  w=$KIT_TRAIN_BIN
  OUT=${OUT:-/tmp/wiola-out}; mkdir -p "$OUT"
fi
py=${WIOLA_PYTHON:-$(command -v python3)}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
exec > >(tee "$OUT/train.log") 2>&1
results=$work/results.jsonl
: > "$results"
record() {  # record NAME OK(0|1) JSON-FIGURES
  echo "{\"check\": \"$1\", \"ok\": $([ "$2" = 1 ] && echo true || echo false), \"figures\": $3}" >> "$results"
  echo "== $1: $([ "$2" = 1 ] && echo PASS || echo FAIL) $3"
}

dry=${KIT_TRAIN_DRY:-0}
if [ "$dry" = 1 ]; then
  model=(--set model.preset=wiola-tiny --set model.vocab_size=32000 --set train.micro_batch=2)
  steps=8 every=2 term_at=2 kill_at=5 small_steps=4 half=2 text_bytes=300000
else
  model=(--set model.preset=wiola-small --set train.micro_batch=8)
  steps=400 every=50 term_at=100 kill_at=250 small_steps=8 half=4 text_bytes=2000000
fi
common=("${model[@]}" --set train.lr_max=1e-3 --set train.log_every=1
        --set train.eval_every=0 --set train.seed=1234 --set checkpoint.keep=100
        --set "data.path=$work/shards/manifest.json" -q)
train() {  # train NAME [--set ...]: run dir $work/NAME, checkpoints in $work/NAME/ck
  "$w" train "${common[@]}" --set "train.run_dir=$work/$1" --set "checkpoint.dir=$work/$1/ck" "${@:2}"
}
# The worst relative loss difference between two runs' metrics.jsonl, whether
# both logged the same steps, each once, and whether every loss is identical;
# {"error": ...} when a run logged nothing.
loss_rel() {
  "$py" - "$1/metrics.jsonl" "$2/metrics.jsonl" <<'PY'
import json, sys
def losses(path):
    seen = {}
    for line in open(path):
        m = json.loads(line) if line.strip() else {}
        if "loss" in m and "step" in m:
            if m["step"] in seen:
                raise ValueError(f"{path}: step {m['step']} logged twice")
            seen[m["step"]] = m["loss"]
    return seen
try:
    a, b = losses(sys.argv[1]), losses(sys.argv[2])
except (OSError, ValueError) as e:
    print(json.dumps({"error": str(e)}))
    sys.exit()
worst = max((abs(a[k] - b[k]) / abs(a[k]) for k in a if k in b), default=float("inf"))
print(json.dumps({"steps": [len(a), len(b)], "same_steps": sorted(a) == sorted(b), "worst_loss_rel": worst,
                  "identical": a == b}))
PY
}
# Exit 0 when loss_rel's figures $1 say the runs logged the same steps and
# (with "identical") the same losses, else within 1e-5.
losses_ok() {
  "$py" -c 'import json,sys; d=json.loads(sys.argv[1]); ok=d.get("same_steps") and (d["identical"] if sys.argv[2] == "identical" else d["worst_loss_rel"] < 1e-5)
sys.exit(0 if ok else 1)' "$1" "$2"
}
# `wiola ckpt diff` figures as JSON, and its verdict.
ckpt_diff() {  # ckpt_diff A B [diff options]: prints the figures; status 0 when SAME
  "$w" ckpt diff --json "$@" > "$work/diff.json" 2> "$work/diff.err"
  local rc=$?
  "$py" -c 'import json,sys; d=json.load(open(sys.argv[1])); t=[x for x in d["tensors"] if x["differing"]]
w=max(t, key=lambda x: float(x["rel"]), default=None)
print(json.dumps({"same": d["same"], "bounds": d["bounds"], "differing": d["differing"], "elements": d["elements"],
  "model_rel": d["model_rel"], "worst_tensor": w and {"name": w["kind"] + "/" + w["name"], "rel": w["rel"]}}))' \
    "$work/diff.json" 2>/dev/null || echo "{\"error\": $("$py" -c 'import json,sys; print(json.dumps(open(sys.argv[1]).read()))' "$work/diff.err")}"
  return $rc
}
lines() { [ -f "$1/metrics.jsonl" ] && wc -l < "$1/metrics.jsonl" || echo 0; }
# Starts a run in the background and sends SIGNAL once its metrics reach
# AT steps; prints "STATUS REACHED" (REACHED 0: it ended first).
interrupt() {  # interrupt NAME SIGNAL AT
  # The binary itself in the background (not a function: $! would be a
  # subshell, and the signal would miss wiola).
  "$w" train "${common[@]}" --set "train.run_dir=$work/$1" --set "checkpoint.dir=$work/$1/ck" \
    --set train.backend=cuda --set train.steps=$steps --set checkpoint.every=$every > "$work/$1.$2.log" 2>&1 &
  local pid=$! reached=0
  while kill -0 $pid 2>/dev/null; do
    if [ "$(lines "$work/$1")" -ge "$3" ]; then kill -"$2" $pid; reached=1; break; fi
    sleep 0.01
  done
  wait $pid
  echo "$? $reached"
}

"$w" --version
echo "== data: $text_bytes bytes of Brown, wiola prep"
{ xz -dc data/brown/brown.txt.xz 2>/dev/null ||
  "$py" -c 'import lzma,sys; sys.stdout.buffer.write(lzma.open("data/brown/brown.txt.xz").read())'; } |
  head -c "$text_bytes" > "$work/brown.txt"
"$w" prep --no-progress --tokenizer data/wiola360m/tokenizer.json --output "$work/shards" "$work/brown.txt" |
  tail -2 || { echo "prep failed"; exit 1; }

# ---- resume: SIGTERM, SIGKILL, bit for bit ----
echo "== resume (cuda, bf16): $steps steps, a checkpoint every $every"
train ref --set train.backend=cuda --set train.steps=$steps --set checkpoint.every=$every ||
  echo "the uninterrupted run failed"
read -r term_rc term_hit <<< "$(interrupt int TERM $term_at)"
read -r kill_rc kill_hit <<< "$(interrupt int KILL $kill_at)"
train int --set train.backend=cuda --set train.steps=$steps --set checkpoint.every=$every
final_rc=$?
figs=$(ckpt_diff "$work/ref/ck" "$work/int/ck" --with-optimizer); same=$?
lr=$(loss_rel "$work/ref" "$work/int")
ok=0
[ "$same" = 0 ] && [ "$term_rc" = 75 ] && [ "$term_hit" = 1 ] && [ "$kill_hit" = 1 ] && [ "$final_rc" = 0 ] &&
  losses_ok "$lr" identical && ok=1
record resume $ok "{\"sigterm_exit\": $term_rc, \"sigterm_sent\": $term_hit, \"sigkill_exit\": $kill_rc, \"sigkill_sent\": $kill_hit, \"final_exit\": $final_rc, \"diff\": $figs, \"losses\": $lr}"

# ---- cpu, gpu2cpu, cpu2gpu: cuda-fp32 against the CPU backend ----
echo "== cpu: cuda-fp32 against cpu, $small_steps steps"
fp=(--set train.steps=$small_steps --set checkpoint.every=$half)
train gpu32 --set train.backend=cuda-fp32 "${fp[@]}"
train cpu32 --set train.backend=cpu "${fp[@]}"
figs=$(ckpt_diff "$work/cpu32/ck" "$work/gpu32/ck" --tol 1e-5); same=$?
lr=$(loss_rel "$work/cpu32" "$work/gpu32")
ok=0
[ "$same" = 0 ] && losses_ok "$lr" within && ok=1
record cpu $ok "{\"diff\": $figs, \"losses\": $lr}"

# One backend to step $half with a checkpoint, the other on to $small_steps;
# against the other backend's uninterrupted run.
switch() {  # switch NAME FIRST SECOND REFERENCE
  train "$1" --set train.backend=$2 "${fp[@]}" --set train.max_steps=$half > "$work/$1.first.log" 2>&1
  local r1=$?
  train "$1" --set train.backend=$3 "${fp[@]}"
  local r2=$? figs same lr ok=0
  figs=$(ckpt_diff "$work/$4/ck" "$work/$1/ck" --tol 1e-5); same=$?
  lr=$(loss_rel "$work/$4" "$work/$1")
  [ "$r1" = 0 ] && [ "$r2" = 0 ] && [ "$same" = 0 ] && losses_ok "$lr" within && ok=1
  record "$1" $ok "{\"first_exit\": $r1, \"second_exit\": $r2, \"diff\": $figs, \"losses\": $lr}"
}
echo "== gpu2cpu, cpu2gpu: a checkpoint of step $half continued on the other backend"
switch gpu2cpu cuda-fp32 cpu gpu32
switch cpu2gpu cpu cuda-fp32 cpu32

# ---- nccl: single-rank NCCL data plane in the trainer ----
echo "== nccl: parallel.data_plane = nccl against the default, bf16, $small_steps steps"
train plain --set train.backend=cuda "${fp[@]}"
train nccl --set train.backend=cuda --set parallel.data_plane=nccl "${fp[@]}"
nccl_rc=$?
figs=$(ckpt_diff "$work/plain/ck" "$work/nccl/ck" --with-optimizer); same=$?
ok=0; [ "$nccl_rc" = 0 ] && [ "$same" = 0 ] && ok=1
record nccl $ok "{\"exit\": $nccl_rc, \"diff\": $figs}"

# ---- decode, eval ----
echo "== decode: wiola generate --check-greedy --backend cuda"
"$w" generate --checkpoint "$work/ref/ck" --backend cuda --prompt "The jury said" --max-new-tokens 48 \
  --greedy --check-greedy --no-eos > "$work/decode.txt" 2> "$work/decode.err"
rc=$?
cat "$work/decode.txt" "$work/decode.err"; echo
record decode $([ $rc = 0 ] && echo 1 || echo 0) "{\"exit\": $rc}"

echo "== eval: the fp32 checkpoint on cuda-fp32 and on the CPU"
head -c $((text_bytes / 20)) "$work/brown.txt" > "$work/eval.txt"
for b in cuda-fp32 cpu; do
  "$w" eval --checkpoint "$work/gpu32/ck" --backend $b --text "$work/eval.txt" > "$work/eval.$b.txt" 2>&1
  echo "eval $b: exit $?"; cat "$work/eval.$b.txt"
done
ev=$("$py" - "$work/eval.cuda-fp32.txt" "$work/eval.cpu.txt" <<'PY'
import json, re, sys
def loss(path):  # the final line's, not the progress lines'
    try:
        m = re.search(r"targets: loss ([0-9.]+)", open(path).read())
    except OSError:
        return None
    return float(m.group(1)) if m else None
g, c = loss(sys.argv[1]), loss(sys.argv[2])
rel = abs(g - c) / abs(c) if g is not None and c else None
print(json.dumps({"cuda_fp32": g, "cpu": c, "rel": rel}))
PY
)
ok=0; "$py" -c 'import json,sys; d=json.loads(sys.argv[1]); sys.exit(0 if d["rel"] is not None and d["rel"] < 1e-5 else 1)' "$ev" && ok=1
record eval $ok "$ev"

# ---- speed: the trainer's own throughput ----
if [ "$dry" != 1 ] && [ "${KIT_TRAIN_SPEED:-1}" != 0 ]; then
  echo "== speed: wiola-120m, T = 1024, 8 sequences a step, bf16, 30 steps"
  "$w" train --set model.preset=wiola-120m --set model.seq_len=1024 --set train.micro_batch=8 --set train.steps=30 \
    --set train.backend=cuda --set train.eval_every=0 --set train.log_every=5 --set checkpoint.every=30 \
    --set "data.path=$work/shards/manifest.json" --set "train.run_dir=$work/speed" \
    --set "checkpoint.dir=$work/speed/ck"
  rc=$?
  sp=$("$py" -c 'import json,sys; r=json.load(open(sys.argv[1]))
print(json.dumps({k: r.get(k) for k in ("tokens_per_s", "time_per_step_s", "mfu", "peak", "memory_mib_per_rank")}))' \
       "$work/speed/report.json" 2>/dev/null || echo '{"error": "no report.json"}')
  record speed $([ $rc = 0 ] && echo 1 || echo 0) "{\"exit\": $rc, \"report\": $sp}"
fi

"$py" - "$results" "$OUT/train.json" <<'PY'
import json, sys
checks = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
out = {"passed": sum(c["ok"] for c in checks), "failed": [c["check"] for c in checks if not c["ok"]], "checks": checks}
json.dump(out, open(sys.argv[2], "w"), indent=1)
print(f"kit_train: {out['passed']} of {len(checks)} checks passed" + (f"; failed: {', '.join(out['failed'])}" if out["failed"] else ""))
sys.exit(1 if out["failed"] else 0)
PY
