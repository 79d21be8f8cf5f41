#!/usr/bin/env bash
# Preemption under Slurm, end to end, on a two-node cluster of network
# namespaces (scripts/local_cluster.sh + scripts/slurm_local.sh with
# CLUSTER=: `sbatch -N 2`, one rank a node, DP across the nodes), or on a
# one-node cluster on localhost where namespaces cannot be made (exits 77,
# "skipped", where Slurm cannot run):
#
#  1. an uninterrupted 2-rank run (dp = 2) through launch/wiola.sbatch,
#     `sbatch --wait`: exit status 0 comes back;
#  2. the same run with checkpoints: once it has logged some steps,
#     `scancel --signal=USR1 --batch` (what --signal=B:USR1@120 does before
#     the time limit); the ranks checkpoint and exit 75, the batch script
#     requeues the job (Restarts=1), the test starts it at once (Slurm would
#     wait ~2 minutes), and it resumes from the checkpoint and finishes:
#     every step appears once in metrics.jsonl and every loss equals run 1's,
#     as a string (bit for bit);
#  3. a plain `scancel` of a third run: cancelled, not requeued.
#
#   slurm_preempt.sh WIOLA WORK BROWN_XZ TOKENIZER_JSON
set -euo pipefail
wiola=$1 work=$2 brown=$3 tokenizer=$4
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
python=${WIOLA_PYTHON:-/usr/bin/python3}
sbatch_script=$root/launch/wiola.sbatch
steps=40

t_start=$SECONDS
say() { echo "[$((SECONDS - t_start))s] $*"; }
fail() { say "FAIL: $*"; exit 1; }

rm -rf "$work"; mkdir -p "$work"
# The cluster's scratch goes under /tmp: unix socket paths must stay short.
slurm=$(mktemp -d /tmp/wiola-slurm.XXXXXX)
cluster=$slurm/cluster
lc=$root/scripts/local_cluster.sh
cleanup() {
  local rc=$?
  say "tearing Slurm down"
  "$root/scripts/slurm_local.sh" down "$slurm" || true
  [ -n "${CLUSTER:-}" ] && bash "$lc" down "$cluster"
  say "Slurm down"
  cp -r "$slurm/log" "$work/slurm-log" 2>/dev/null || true
  rm -rf "$slurm"
  exit $rc
}
trap cleanup EXIT
trap 'exit 1' INT TERM

set +e
bash "$lc" up "$cluster" --nodes 2 --rate 10gbit --slots 1
rc=$?
set -e
nodes=(-n 2)
if [ $rc -eq 0 ]; then
  export CLUSTER=$cluster
  nodes=(-N 2 --ntasks-per-node=1)
  say "two namespace nodes up: the jobs run one rank on each"
else
  say "no namespace nodes here (local_cluster.sh exited $rc): one node"
fi
# Slurm's clients run on node1 (the controller's address is only there).
on1=(env)
[ -z "${CLUSTER:-}" ] || on1=(bash "$lc" exec "$cluster" node1)

say "bringing up Slurm in $slurm"
set +e
conf_line=$("$root/scripts/slurm_local.sh" up "$slurm")
rc=$?
set -e
[ $rc -eq 77 ] && exit 77
[ $rc -eq 0 ] || fail "slurm_local.sh up exited $rc"
export SLURM_CONF=${conf_line#SLURM_CONF=}
say "Slurm up ($conf_line)"

xz -dc "$brown" | head -c 300000 > "$work/brown.txt" || true
"$wiola" prep --no-progress --tokenizer "$tokenizer" --output "$work/shards" "$work/brown.txt" > "$work/prep.log"

export WIOLA=$wiola
args=(--set model.preset=wiola-tiny --set model.vocab_size=32000 --set train.micro_batch=2
      --set train.grad_accum=2 --set parallel.dp=2 --set train.threads=1 --set "train.steps=$steps"
      --set "data.path=$work/shards/manifest.json" -q)

job_field() { # JOBID FIELD -> value from scontrol show job ("" once the job is gone)
  local out
  out=$("${on1[@]}" scontrol show job "$1" 2>/dev/null) || return 0
  tr ' ' '\n' <<<"$out" | sed -n "s/^$2=//p" | head -1
}
lines() { [ -f "$1" ] && wc -l < "$1" || echo 0; }
wait_lines() { # FILE N BOUND_S JOBID: until FILE has N lines, the job running
  local i
  for ((i = 0; i < $3 * 5; i++)); do
    [ "$(lines "$1")" -ge "$2" ] && return 0
    case $(job_field "$4" JobState) in COMPLETED | FAILED | CANCELLED | "") fail "job $4 ended before $2 steps";; esac
    sleep 0.2
  done
  fail "$1 has fewer than $2 lines after $3 s"
}

# 1. Reference: uninterrupted, exit status through sbatch --wait.
say "run 1: uninterrupted reference ($steps steps, 2 ranks)"
set +e
timeout 120 "${on1[@]}" sbatch --wait --quiet "${nodes[@]}" -o "$work/ref.out" "$sbatch_script" "${args[@]}" \
  --set "train.run_dir=$work/ref"
rc=$?
set -e
cat "$work/ref.out"
[ $rc -eq 0 ] || fail "reference job: sbatch --wait exited $rc"
# (Slurm 22.05's srun exits 0 even when its tasks fail to launch: count steps.)
[ "$(lines "$work/ref/metrics.jsonl")" -eq $steps ] || fail "reference job: $work/ref/metrics.jsonl lacks $steps steps"
if [ -n "${CLUSTER:-}" ]; then  # one rank a node: DP across the nodes
  "$python" - "$work/ref/report.json" <<'PY' || fail "reference job: not placed one rank a node"
import json, sys
p = json.load(open(sys.argv[1]))["placement"]
print("placement:", p)
assert p["rank_node"] == ["node1", "node2"] and p["links"]["dp"] == "inter", p
PY
fi

# 2. Preempted and requeued.
say "run 2: with checkpoints, preempted by USR1"
job=$("${on1[@]}" sbatch --parsable "${nodes[@]}" -o "$work/pre.out" "$sbatch_script" "${args[@]}" \
  --set "train.run_dir=$work/pre" --set "checkpoint.dir=$work/pre-ckpt" --set checkpoint.every=5)
wait_lines "$work/pre/metrics.jsonl" 8 60 "$job"
at=$(lines "$work/pre/metrics.jsonl")
say "job $job at step $at: scancel --signal=USR1 --batch $job"
"${on1[@]}" scancel --signal=USR1 --batch "$job"
requeued=0
for ((i = 0; i < 300; i++)); do
  if [ "$(job_field "$job" Restarts)" = 1 ] && [ "$(job_field "$job" JobState)" = PENDING ]; then
    requeued=1; break
  fi
  sleep 0.2
done
[ $requeued = 1 ] || { "${on1[@]}" scontrol show job "$job" || true; cat "$work/pre.out"; fail "job $job was not requeued within 60 s"; }
stopped=$(lines "$work/pre/metrics.jsonl")
say "requeued (Restarts=1, $(job_field "$job" Reason)) after stopping at step $stopped; starting it now"
[ "$stopped" -lt $steps ] || fail "the run had finished before it was preempted; nothing was tested"
# slurmd refuses a job whose credential was issued in the same second as
# the previous run's revocation ("Job credential revoked": the job FAILS);
# Slurm's own ~2 minute delay of requeued jobs avoids that, so the test only
# waits a couple of seconds.
sleep 2
"${on1[@]}" scontrol update JobId="$job" StartTime=now
state=""
for ((i = 0; i < 600; i++)); do
  state=$(job_field "$job" JobState)
  case $state in COMPLETED | FAILED | CANCELLED | TIMEOUT | NODE_FAIL | OUT_OF_MEMORY | "") break ;; esac
  sleep 0.2
done
exit_code=$(job_field "$job" ExitCode)
cat "$work/pre.out"
[ "$state" = COMPLETED ] || fail "job $job ended in state '${state:-gone}' (exit code ${exit_code:-?})"
[ "$exit_code" = 0:0 ] || fail "job $job exit code $exit_code"
grep -q "restart 1:" "$work/pre.out" || fail "the job output has no second start (restart 1)"
grep -q "ranks finished with exit status 75" "$work/pre.out" || fail "the first start did not end with exit status 75"
grep -q "^wiola train: stopped at step" "$work/pre.out" || fail "wiola did not report stopping at a checkpoint"
grep -q "^wiola train: resuming from" "$work/pre.out" || fail "the second start did not resume from the checkpoint"
"$python" "$here/same_losses.py" "$work/ref/metrics.jsonl" "$work/pre/metrics.jsonl" $steps

# 3. A plain scancel (SIGTERM): cancelled, never requeued.
say "run 3: plain scancel"
job=$("${on1[@]}" sbatch --parsable "${nodes[@]}" -o "$work/cancel.out" "$sbatch_script" "${args[@]}" \
  --set "train.run_dir=$work/cancel" --set "checkpoint.dir=$work/cancel-ckpt" --set checkpoint.every=100)
wait_lines "$work/cancel/metrics.jsonl" 3 60 "$job"
"${on1[@]}" scancel "$job"
state=""
for ((i = 0; i < 150; i++)); do
  state=$(job_field "$job" JobState)
  case $state in CANCELLED | COMPLETED | FAILED | PENDING | "") break ;; esac
  sleep 0.2
done
sleep 3   # a requeue would show by now
later=$(job_field "$job" JobState) restarts=$(job_field "$job" Restarts)
cat "$work/cancel.out"
[ "$state" != PENDING ] && [ "$later" != PENDING ] && [ "${restarts:-0}" = 0 ] ||
  fail "the cancelled job $job was requeued (state $state, then ${later:-gone}, restarts ${restarts:-?})"
grep -q "restart 1:" "$work/cancel.out" && fail "the cancelled job started again"
say "cancelled job $job: ${state:-gone}, not requeued; $(grep -o 'ranks finished with exit status [0-9]*' "$work/cancel.out" || echo 'batch script killed')"
say "PASS"
