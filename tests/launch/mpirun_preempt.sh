#!/usr/bin/env bash
# launch/mpirun.sh: signals and exit statuses, with the real `wiola train`
# on 2 ranks (pp = 2; the wrapper infers -np 2 from --set parallel.pp=2):
#
#  1. an uninterrupted run: exit status 0;
#  2. the same run with checkpoints, SIGUSR1 to the wrapper's PID once some
#     steps are logged: mpirun forwards it, every rank checkpoints and exits
#     75, and the wrapper exits 75;
#  3. the same command again: resumes, exit status 0; every step once in
#     metrics.jsonl and every loss equal to run 1's (bit for bit);
#  4. a failing job (2 ranks for a 1-rank layout): the wrapper exits 1, the
#     status of `wiola train: error: ...`.
#
#   mpirun_preempt.sh WIOLA WORK BROWN_XZ TOKENIZER_JSON
set -euo pipefail
wiola=$1 work=$2 brown=$3 tokenizer=$4
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
python=${WIOLA_PYTHON:-/usr/bin/python3}
launch=$root/launch/mpirun.sh
steps=30

t_start=$SECONDS
say() { echo "[$((SECONDS - t_start))s] $*"; }
fail() { say "FAIL: $*"; exit 1; }
lines() { [ -f "$1" ] && wc -l < "$1" || echo 0; }

rm -rf "$work"; mkdir -p "$work"
xz -dc "$brown" | head -c 300000 > "$work/brown.txt" || true
"$wiola" prep --no-progress --tokenizer "$tokenizer" --output "$work/shards" "$work/brown.txt" > "$work/prep.log"
args=(--set model.preset=wiola-tiny --set model.vocab_size=32000 --set train.micro_batch=2
      --set train.grad_accum=4 --set parallel.pp=2 --set train.threads=1 --set "train.steps=$steps"
      --set "data.path=$work/shards/manifest.json" -q)
ckpt=(--set "train.run_dir=$work/pre" --set "checkpoint.dir=$work/pre-ckpt" --set checkpoint.every=4)

say "1. uninterrupted"
"$launch" -- "$wiola" train "${args[@]}" --set "train.run_dir=$work/ref" || fail "reference run exited $?"

say "2. with checkpoints, SIGUSR1 to the wrapper"
"$launch" -- "$wiola" train "${args[@]}" "${ckpt[@]}" > "$work/pre1.log" 2>&1 &
pid=$!
for ((i = 0; i < 300; i++)); do
  [ "$(lines "$work/pre/metrics.jsonl")" -ge 6 ] && break
  kill -0 $pid 2>/dev/null || break
  sleep 0.2
done
kill -USR1 $pid || fail "the run ended before it could be signalled"
say "SIGUSR1 sent at step $(lines "$work/pre/metrics.jsonl")"
set +e
wait $pid
rc=$?
set -e
cat "$work/pre1.log"
[ $rc -eq 75 ] || fail "after SIGUSR1 the wrapper exited $rc, expected 75"
grep -q "^wiola train: stopped at step" "$work/pre1.log" || fail "wiola did not report stopping at a checkpoint"
stopped=$(lines "$work/pre/metrics.jsonl")
[ "$stopped" -lt $steps ] || fail "the run had finished before SIGUSR1 arrived"
say "exit 75 at step $stopped"

say "3. the same command again: resumes"
set +e
"$launch" -- "$wiola" train "${args[@]}" "${ckpt[@]}" > "$work/pre2.log" 2>&1
rc=$?
set -e
cat "$work/pre2.log"
[ $rc -eq 0 ] || fail "the resumed run exited $rc"
grep -q "^wiola train: resuming from" "$work/pre2.log" || fail "the second run did not resume from the checkpoint"
"$python" "$here/same_losses.py" "$work/ref/metrics.jsonl" "$work/pre/metrics.jsonl" $steps

say "4. a failing job: the wrapper exits with wiola's status"
set +e
"$launch" -np 2 -- "$wiola" train "${args[@]/parallel.pp=2/parallel.pp=1}" --set "train.run_dir=$work/bad" > "$work/bad.log" 2>&1
rc=$?
set -e
grep "wiola train: error" "$work/bad.log" || true
[ $rc -eq 1 ] || { cat "$work/bad.log"; fail "a failing job: the wrapper exited $rc, expected 1"; }
say "PASS"
