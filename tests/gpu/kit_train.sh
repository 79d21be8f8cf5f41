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
#   documents `cuda-fp32` against the CPU with data.documents = true, 8 steps
#             on shards where every Brown paragraph is a document (about 40
#             tokens: several per window, each with its EOS target masked):
#             the bounds of "cpu"
#   nccl      bf16 with parallel.data_plane = "nccl" (single-rank NCCL
#             communicators in the trainer) against the default: bit for bit
#   decode    `wiola generate --check-greedy --backend cuda` on the bf16 run's
#             checkpoint: every cached-decoding token is the full forward's argmax
#   eval      `wiola eval` of the fp32 checkpoint on cuda-fp32 and on the CPU:
#             losses within 1e-5 relative
#   main_fp32 the main job (configs/brown-small.toml, 300 steps) on cuda-fp32
#             against its CPU curve committed in tests/gpu/ref: |loss
#             difference| <= 0.02 at every step after step 50
#   main_bf16 the same in bf16 (the default backend): <= 0.05 (below)
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
KIT_BIN=${KIT_BIN:-${KIT_TRAIN_BIN:-}}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
. tests/gpu/kit_lib.sh
exec > >(tee "$OUT/train.log") 2>&1

dry=${KIT_TRAIN_DRY:-0}
if [ "$dry" = 1 ]; then
  model=(--set model.preset=wiola-tiny --set model.vocab_size=32000 --set train.micro_batch=2)
  steps=6 every=2 term_at=2 kill_at=4 small_steps=4 half=2 text_bytes=300000 eval_bytes=3000
else
  model=(--set model.preset=wiola-small --set train.micro_batch=8)
  steps=400 every=50 term_at=100 kill_at=250 small_steps=8 half=4 text_bytes=2000000 eval_bytes=100000
fi
common=("${model[@]}" "${kit_sets[@]}" --set train.lr_max=1e-3 --set train.log_every=1
        --set train.eval_every=0 --set train.seed=1234 --set checkpoint.keep=100
        --set "data.path=$work/shards/manifest.json" -q)
train() {  # train NAME [--set ...]: run dir $work/NAME, checkpoints in $work/NAME/ck
  "$w" train "${common[@]}" --set "train.run_dir=$work/$1" --set "checkpoint.dir=$work/$1/ck" "${@:2}"
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
prep_brown "$text_bytes" || { echo "prep failed"; exit 1; }

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

# ---- documents: packed documents (data.documents) on cuda-fp32 against the CPU ----
# Shards of short documents: each paragraph (line) of the same text a document
# of its own (a blank line after each), so that most windows hold several.
echo "== documents: cuda-fp32 against cpu with data.documents = true, $small_steps steps"
sed 's/$/\n/' "$work/brown.txt" > "$work/paragraphs.txt"
"$w" prep --no-progress --tokenizer data/wiola360m/tokenizer.json --output "$work/docshards" \
  "$work/paragraphs.txt" | grep "train:"  # its tokens and documents
docs=("${fp[@]}" --set data.documents=true --set "data.path=$work/docshards/manifest.json")
train docgpu --set train.backend=cuda-fp32 "${docs[@]}" > "$work/docgpu.log" 2>&1
r1=$?
cat "$work/docgpu.log"
train doccpu --set train.backend=cpu "${docs[@]}"
r2=$?
figs=$(ckpt_diff "$work/doccpu/ck" "$work/docgpu/ck" --tol 1e-5); same=$?
lr=$(loss_rel "$work/doccpu" "$work/docgpu")
ok=0
[ "$r1" = 0 ] && [ "$r2" = 0 ] && [ "$same" = 0 ] && losses_ok "$lr" within && ok=1
record documents $ok "{\"gpu_exit\": $r1, \"cpu_exit\": $r2, \"diff\": $figs, \"losses\": $lr}"

# ---- nccl: single-rank NCCL data plane in the trainer ----
# Against the resume check's uninterrupted run (the default data plane) at one
# of its checkpoints: the same schedule (train.steps = $steps), stopped there by
# train.max_steps (the dry run: step 4; on the GPU: step $every).
nccl_steps=$((small_steps / every * every)); [ "$nccl_steps" = 0 ] && nccl_steps=$every
echo "== nccl: parallel.data_plane = nccl against the default, bf16, $nccl_steps steps"
train nccl --set train.backend=cuda --set parallel.data_plane=nccl --set train.steps=$steps \
  --set checkpoint.every=$every --set train.max_steps=$nccl_steps
nccl_rc=$?
figs=$(ckpt_diff "$work/ref/ck/$(printf 'step-%08d' "$nccl_steps")" "$work/nccl/ck" --with-optimizer); same=$?
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
head -c $eval_bytes "$work/brown.txt" > "$work/eval.txt"
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

# ---- main_fp32, main_bf16: the main job's configuration on the GPU ----
# configs/brown-small.toml (wiola-small, 300 steps on all of Brown), against
# the CPU run's losses committed in tests/gpu/ref (no CPU rerun here), at every
# logged step after step 50 (the dry run: 1 step, judged):
#   main_fp32  cuda-fp32: |loss difference| <= 0.02 (the issue's bar; the
#              CPU run on 2 threads instead of 1 stays within 2.1e-4)
#   main_bf16  cuda (bf16, the default): <= 0.05. bf16 storage alone moves the
#              curve further: the CPU backend with the GPU's bf16 storage
#              (cpu-bf16) differs from the committed fp32 CPU curve by up to
#              0.036 after step 50 (measured on the build host, 2026-11-27).
# The GPU's metrics come back in $OUT for the plot (tests/gpu/plot_main_job.py).
ref=tests/gpu/ref/brown-small-cpu.jsonl
main_steps=300 main_after=50
[ "$dry" = 1 ] && main_steps=1 main_after=0
prep_brown 0 "$work/brown_all" >/dev/null
main_check() {  # main_check NAME BACKEND BOUND
  echo "== $1: configs/brown-small.toml on $2, $main_steps steps, against $ref"
  # train.max_steps stops the run early without changing its schedule (steps = 300).
  "$w" train --config configs/brown-small.toml --set train.backend=$2 --set train.max_steps=$main_steps \
    --set "data.path=$work/brown_all/manifest.json" --set "train.run_dir=$work/$1" \
    --set "checkpoint.dir=$work/$1/ck" -q
  local rc=$? mf ok=0
  cp "$work/$1/metrics.jsonl" "$OUT/$1_gpu_metrics.jsonl" 2>/dev/null
  mf=$("$py" - "$ref" "$work/$1/metrics.jsonl" "$work/brown_all/manifest.json" "$main_after" "$3" <<'PY'
import json, sys
def losses(path):
    return {m["step"]: m["loss"] for m in map(json.loads, filter(str.strip, open(path))) if "loss" in m}
try:
    cpu, gpu = losses(sys.argv[1]), losses(sys.argv[2])
    xxh3 = json.load(open(sys.argv[3]))["splits"]["train"].get("xxh3")
except (OSError, ValueError, KeyError) as e:
    print(json.dumps({"error": str(e)}))
    sys.exit()
after, bound = int(sys.argv[4]), float(sys.argv[5])
d = {k: abs(gpu[k] - cpu[k]) for k in gpu if k in cpu}
judged = [k for k in d if k > after]
worst = max(judged, key=d.get, default=None)
print(json.dumps({"bound": bound, "data_train_xxh3": xxh3, "steps_compared": len(d), "steps_judged": len(judged),
                  "worst_after": worst and {"step": worst, "abs_diff": d[worst]},
                  "worst_any": max(d.values(), default=None), "final": {"cpu": cpu.get(max(gpu, default=0)),
                  "gpu": gpu.get(max(gpu, default=0))}, "ok": bool(judged) and d[worst] <= bound and
                  xxh3 == "9c175ec4b48c156d"}))
PY
)
  [ "$rc" = 0 ] && "$py" -c 'import json,sys; sys.exit(0 if json.loads(sys.argv[1]).get("ok") else 1)' "$mf" && ok=1
  record "$1" $ok "{\"exit\": $rc, \"against_cpu\": $mf}"
  "$py" tests/gpu/plot_main_job.py "$ref" "$work/$1/metrics.jsonl" "$OUT/$1.png" --labels "CPU fp32" "GPU $2" \
    2>/dev/null || echo "$1: no plot here (matplotlib?): tests/gpu/plot_main_job.py on $OUT/$1_gpu_metrics.jsonl"
}
# The dry run's main_fp32 runs on the CPU backend: one step of wiola-small
# in fp32 takes the emulator a minute (a third of the dry run), and cuda-fp32
# against the CPU is the "cpu" check's; the CPU step still proves the
# committed curve current (step 1: 6.5e-9 apart) and runs this function.
# Likewise its main_bf16 on the CPU backend with the GPU's bf16 storage
# (cpu-bf16: 6 s instead of the emulator's 19; bf16 training on the emulated
# GPU is the resume and nccl checks'): the step still proves the committed
# curve and the bf16 bound's script lines.
main_fp32_backend=cuda-fp32 main_bf16_backend=cuda
[ "$dry" = 1 ] && main_fp32_backend=cpu main_bf16_backend=cpu-bf16
main_check main_fp32 $main_fp32_backend 0.02
main_check main_bf16 $main_bf16_backend 0.05

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

summarise "$OUT/train.json" kit_train
