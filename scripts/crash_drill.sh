#!/usr/bin/env bash
# Crash drill for resumable checkpoints (train/checkpointer.h).
#
# Trains a small multi-rank run with frequent asynchronous checkpoints, and an
# uninterrupted reference run with the same settings. Then starts the run,
# waits a random time and `kill -9`s ONE random rank (a child of mpirun, not
# mpirun itself), lets mpirun tear the job down, and starts it again; KILLS
# times, then lets it finish. Kill moments are drawn from three plans:
#   startup  during MPI start-up, model build, checkpoint verify and load
#   step     a random moment after a random step
#   write    soon after a checkpoint write begins (.tmp-step-N appears): 0-250
#            ms (during the background write) or 0.75-1.25 steps later
#            (around the commit, at the next step's control all-reduce)
# At the end the final checkpoint must equal the reference's bit for bit
# (scripts/ckpt_compare.py rebuilds every tensor from its slices through the
# manifests) and metrics.jsonl must hold every step exactly once, with the
# reference's losses. Prints a tally; exit status 0 when the run survived.
#
#   scripts/crash_drill.sh [-n KILLS] [--np 2|4] [--layout dp2|pp2|tp2|pp2dp2]
#                          [--steps N] [--every K] [--seed S] [--wiola PATH]
#                          [--shards DIR] [--work DIR] [--keep] [--set KEY=VALUE ...]
#
#   -n KILLS     kills before the run may finish (default 5)
#   --np N       ranks (default 2; 4 picks pp2dp2)
#   --layout L   dp2 (default for 2 ranks: dp=2, grad_accum=2, ZeRO), pp2, tp2,
#                pp2dp2 (4 ranks)
#   --steps N    train.steps (default 36)
#   --every K    checkpoint.every (default 2)
#   --seed S     seed of the drill's random choices (default: random; printed)
#   --wiola P    the binary (default build/wiola)
#   --shards D   an existing `wiola prep` output (default: prep 300 kB of Brown)
#   --work D     working folder (default: a fresh one under /tmp, removed on
#                success; a given one keeps only its logs) unless --keep
#   --set K=V    extra `wiola train --set` for both runs
# Environment: MPIEXEC (default mpiexec), WIOLA_PYTHON (python with h5py).
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/.." && pwd)

kills_wanted=5 np=2 layout="" steps=36 every=2 seed="" wiola="$root/build/wiola" shards="" work="" keep=0
extra=()
while [ $# -gt 0 ]; do
  case $1 in
    -n) kills_wanted=$2; shift 2 ;;
    --np) np=$2; shift 2 ;;
    --layout) layout=$2; shift 2 ;;
    --steps) steps=$2; shift 2 ;;
    --every) every=$2; shift 2 ;;
    --seed) seed=$2; shift 2 ;;
    --wiola) wiola=$2; shift 2 ;;
    --shards) shards=$2; shift 2 ;;
    --work) work=$2; shift 2 ;;
    --keep) keep=1; shift ;;
    --set) extra+=(--set "$2"); shift 2 ;;
    -h|--help) sed -n '2,/^set -uo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) echo "crash_drill: unknown argument '$1' (see --help)" >&2; exit 2 ;;
  esac
done
die() { echo "crash_drill: $*" >&2; exit 2; }
[[ $kills_wanted =~ ^[0-9]+$ ]] || die "-n wants a count, got '$kills_wanted'"
[[ $steps =~ ^[0-9]+$ && $steps -ge 4 ]] || die "--steps wants a number >= 4"
[[ $every =~ ^[0-9]+$ && $every -ge 1 ]] || die "--every wants a number >= 1"
[ -x "$wiola" ] || die "no wiola binary at $wiola (build it, or pass --wiola)"
[ -z "$layout" ] && { [ "$np" = 4 ] && layout=pp2dp2 || layout=dp2; }
case $layout in
  dp2) lnp=2; lsets=(--set parallel.dp=2 --set train.grad_accum=2) ;;
  pp2) lnp=2; lsets=(--set parallel.pp=2) ;;
  tp2) lnp=2; lsets=(--set parallel.tp=2) ;;
  pp2dp2) lnp=4; lsets=(--set parallel.pp=2 --set parallel.dp=2 --set train.grad_accum=2) ;;
  *) die "unknown --layout '$layout' (dp2, pp2, tp2, pp2dp2)" ;;
esac
[ "$np" = "$lnp" ] || die "--layout $layout runs on $lnp ranks, not --np $np"
[ -n "$seed" ] || seed=$(( $(date +%s%N) % 100000 ))
RANDOM=$seed
python=${WIOLA_PYTHON:-/usr/bin/python3}
"$python" -c 'import h5py' 2>/dev/null || python=python3
"$python" -c 'import h5py' 2>/dev/null || die "no python with h5py (set WIOLA_PYTHON)"
mpiexec=${MPIEXEC:-mpiexec}
if [ "$(id -u)" = 0 ]; then
  export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
fi
export OMPI_MCA_rmaps_base_oversubscribe=1 OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1
created_work=0
if [ -z "$work" ]; then work=$(mktemp -d /tmp/crash-drill.XXXXXX); created_work=1; fi
mkdir -p "$work/logs"
t_begin=$SECONDS

# ---- data and the reference run --------------------------------------------------
if [ -z "$shards" ]; then
  shards=$work/shards
  if [ ! -f "$shards/manifest.json" ]; then
    xz -dc "$root/data/brown/brown.txt.xz" | head -c 300000 > "$work/brown.txt"
    "$wiola" prep --no-progress --tokenizer "$root/data/wiola360m/tokenizer.json" --output "$shards" \
      "$work/brown.txt" > "$work/logs/prep.log" 2>&1 || die "wiola prep failed (see $work/logs/prep.log)"
  fi
fi
common=(--set model.preset=wiola-tiny --set model.vocab_size=32000 --set train.micro_batch=2
        --set train.grad_accum=4 --set train.threads=1 --set "train.steps=$steps"
        --set "data.path=$shards/manifest.json" --set "checkpoint.every=$every"
        --set checkpoint.async=true --set checkpoint.keep=2 "${lsets[@]}" "${extra[@]}")

echo "crash_drill: seed $seed, $kills_wanted kills, layout $layout on $np ranks, $steps steps," \
     "checkpoint every $every (async), work $work"
rm -rf "$work/ref" "$work/drill"
t0=$(date +%s.%N)
"$mpiexec" -n "$np" --bind-to none "$wiola" train "${common[@]}" --set "train.run_dir=$work/ref/run" \
  --set "checkpoint.dir=$work/ref/ck" > "$work/logs/ref.out" 2> "$work/logs/ref.err" ||
  { cat "$work/logs/ref.err" >&2; die "the reference run failed"; }
ref_s=$(echo "$(date +%s.%N) - $t0" | bc)
# Step time (ms) from the reference's metrics; start-up = the rest.
step_ms=$("$python" -c "
import json,sys
r=[json.loads(l) for l in open('$work/ref/run/metrics.jsonl')]
print(int(sorted(x['step_ms'] for x in r)[len(r)//2]))")
startup_s=$(echo "$ref_s - $steps * $step_ms / 1000" | bc -l)
printf 'crash_drill: reference run %.1f s (median step %d ms, start-up and checkpoints ~%.1f s)\n' \
  "$ref_s" "$step_ms" "$startup_s"

# ---- the drill --------------------------------------------------------------------
run_dir=$work/drill
ck=$run_dir/ck
now() { date +%s.%N; }
elapsed_since() { echo "$(now) - $1" | bc -l; }
rand_ms() { echo $(( (RANDOM * 32768 + RANDOM) % ($1 + 1) )); }  # 0..$1
sleep_ms() { sleep "$(echo "scale=3; $1 / 1000" | bc)"; }
# The last "step N/M" progress line of this attempt's stdout (0: none yet).
attempt_step() { grep -oE '^step +[0-9]+/' "$1" 2>/dev/null | tail -1 | grep -oE '[0-9]+' || echo 0; }
latest_step() { [ -f "$ck/latest" ] && sed -n 's/^step-0*\([0-9][0-9]*\)$/\1/p' "$ck/latest" || echo 0; }
tmp_dirs() { (cd "$ck" 2>/dev/null && ls -d .tmp-step-* 2>/dev/null | sed 's/^.tmp-step-0*//' | tr '\n' ' '); }
alive() { kill -0 "$1" 2>/dev/null; }
# kill_job PID: mpirun (started with setsid: its session) and every process of its session.
kill_job() { pkill -9 -s "$1" 2>/dev/null; kill -9 "$1" 2>/dev/null; wait "$1" 2>/dev/null; }
# The wiola ranks: children of mpirun whose command is wiola.
rank_pids() { pgrep -P "$1" -x wiola 2>/dev/null | tr '\n' ' '; }
rank_of() { tr '\0' '\n' < "/proc/$1/environ" 2>/dev/null | sed -n 's/^OMPI_COMM_WORLD_RANK=//p'; }

mpid=""
trap 'if [ -n "$mpid" ]; then kill_job "$mpid"; fi; echo "crash_drill: interrupted" >&2; exit 130' INT TERM
kills=0 attempts=0 fallbacks=0 result=FAILED reason=""
resumes=() tally=()
attempt_limit=$(echo "($ref_s * 3 + 60) / 1" | bc)
while :; do
  attempts=$((attempts + 1))
  out=$work/logs/attempt-$attempts.out err=$work/logs/attempt-$attempts.err
  base=$(latest_step)
  setsid "$mpiexec" -n "$np" --bind-to none "$wiola" train "${common[@]}" --set "train.run_dir=$run_dir/run" \
    --set "checkpoint.dir=$ck" > "$out" 2> "$err" &
  mpid=$!
  t_start=$(now)
  if [ "$kills" -lt "$kills_wanted" ]; then
    # Plan this kill: a random advance past the last checkpoint, about twice
    # the fair share of the steps left per kill left, so that the wanted
    # kills happen before the run can finish; near the end only kills that
    # cannot let a checkpoint complete.
    left=$((kills_wanted - kills))
    remaining=$((steps - base))
    share=$(( 2 * remaining / (left + 1) )); [ "$share" -lt 1 ] && share=1
    r=$((RANDOM % 100))
    if [ "$remaining" -le $((2 * every + 1)) ]; then
      if [ "$r" -lt 30 ]; then plan=startup; else plan=step; fi
      target=$((base + 1)); short=1
    else
      if [ "$r" -lt 15 ]; then plan=startup; elif [ "$r" -lt 50 ]; then plan=step; else plan="write"; fi
      target=$((base + 1 + RANDOM % share)); short=0
      cap=$((steps - 2 * every - 1)); [ "$target" -gt "$cap" ] && target=$cap
    fi
    case $plan in
      startup)
        sleep_ms "$(rand_ms "$(echo "$startup_s * 1000 / 1" | bc)")" ;;
      step)
        while alive "$mpid" && [ "$(attempt_step "$out")" -lt "$target" ]; do sleep 0.02; done
        # A random moment of the next step (its first half only when no
        # checkpoint may complete).
        if [ "$short" = 1 ]; then sleep_ms "$(rand_ms $((step_ms / 2)))"; else sleep_ms "$(rand_ms "$step_ms")"; fi ;;
      write)
        while alive "$mpid" && [ "$(attempt_step "$out")" -lt "$target" ]; do sleep 0.02; done
        # Then the next checkpoint write to begin.
        before=$(tmp_dirs)
        while alive "$mpid"; do
          cur=$(tmp_dirs)
          [ -n "$cur" ] && [ "$cur" != "$before" ] && break
          [ -z "$cur" ] && before=""
          sleep 0.005
        done
        # Mostly during the background write; else around the commit (at the
        # next step's control all-reduce, about one step later).
        if [ $((RANDOM % 100)) -lt 60 ]; then sleep_ms "$(rand_ms 250)"
        else sleep_ms $((step_ms * 3 / 4 + $(rand_ms $((step_ms / 2))))); fi ;;
    esac
    if ! alive "$mpid"; then
      wait "$mpid"; rc=$?
      if [ "$rc" -eq 0 ]; then
        tally+=("attempt $attempts: the run finished before kill $((kills + 1)) (plan $plan)")
        break
      fi
      reason="attempt $attempts ended by itself with exit status $rc before the kill (see $err)"
      break
    fi
    read -ra pids <<< "$(rank_pids "$mpid")"
    if [ ${#pids[@]} -eq 0 ]; then
      # mpirun has not forked the ranks yet: wait for them briefly.
      for _ in $(seq 100); do read -ra pids <<< "$(rank_pids "$mpid")"; [ ${#pids[@]} -gt 0 ] && break; sleep 0.01; done
    fi
    if [ ${#pids[@]} -eq 0 ]; then
      reason="attempt $attempts: no wiola rank under mpirun pid $mpid"; kill_job "$mpid"; break
    fi
    victim=${pids[$((RANDOM % ${#pids[@]}))]}
    vrank=$(rank_of "$victim")
    at_step=$(attempt_step "$out")
    writing=$(tmp_dirs)
    [ "$at_step" -eq 0 ] && writing=""  # leftovers of the last attempt: no save before step 1
    at_s=$(elapsed_since "$t_start")
    kill -9 "$victim" 2>/dev/null
    kills=$((kills + 1))
    # mpirun must notice and tear the job down.
    for _ in $(seq 600); do alive "$mpid" || break; sleep 0.05; done
    if alive "$mpid"; then
      reason="attempt $attempts: mpirun still running 30 s after rank $vrank was killed (hang)"
      kill_job "$mpid"; break
    fi
    wait "$mpid"; rc=$?
    pkill -9 -s "$mpid" 2>/dev/null  # any straggler of this session
    desc="kill $kills: rank ${vrank:-?} (pid $victim) at $(printf '%.2f' "$at_s") s, plan $plan"
    if [ "$at_step" -eq 0 ]; then desc+=", before the first step"; else desc+=", after step $at_step"; fi
    if [ -n "$writing" ]; then desc+=", during the write of step ${writing% }"; else desc+=", no write in flight"; fi
    desc+="; mpirun exit $rc; latest now step $(latest_step)"
  else
    deadline=$(( SECONDS + attempt_limit ))
    while alive "$mpid" && [ $SECONDS -lt $deadline ]; do sleep 0.1; done
    if alive "$mpid"; then
      reason="attempt $attempts: still running after ${attempt_limit} s (hang)"
      kill_job "$mpid"; break
    fi
    wait "$mpid"; rc=$?
    desc="final attempt: exit $rc"
  fi
  res=$(sed -n 's/^wiola train: resuming from .* (step \([0-9]*\),.*/\1/p' "$out" | head -1)
  fb=$(grep -c 'is damaged' "$err")
  fallbacks=$((fallbacks + fb))
  [ -n "$res" ] && { resumes+=("$res"); desc="attempt $attempts (resumed from step $res): $desc"; } ||
    desc="attempt $attempts (fresh start or killed before resuming): $desc"
  [ "$fb" -gt 0 ] && desc+="; $fb fallback(s): $(grep 'is damaged' "$err" | head -2 | tr '\n' ' ')"
  tally+=("$desc")
  if [ "$kills" -ge "$kills_wanted" ] && [[ $desc == *"final attempt"* ]]; then
    if [ "$rc" -ne 0 ]; then reason="the final attempt failed with exit status $rc:
$(tail -5 "$err")"; fi
    break
  fi
done

# ---- verdict ------------------------------------------------------------------------
final=$(printf 'step-%08d' "$steps")
checks=()
if [ -z "$reason" ]; then
  if [ ! -f "$ck/$final/manifest.json" ]; then
    reason="no final checkpoint $ck/$final"
  elif ! cmp_out=$("$python" "$here/ckpt_compare.py" tensors "$work/ref/ck/$final" "$ck/$final" 2>&1); then
    reason="final checkpoint differs from the reference's:
$cmp_out"
  else
    checks+=("$cmp_out")
    if ! m_out=$("$python" "$here/ckpt_compare.py" metrics "$run_dir/run" "$work/ref/run" "$steps" 2>&1); then
      reason="metrics.jsonl: $m_out"
    else
      checks+=("$m_out")
      result=PASSED
    fi
  fi
fi
[ "$kills" -lt "$kills_wanted" ] && [ "$result" = PASSED ] &&
  checks+=("note: only $kills of $kills_wanted kills happened before the run finished")

echo "crash_drill: tally"
for line in "${tally[@]}"; do echo "  $line"; done
during=$(printf '%s\n' "${tally[@]}" | grep -c 'during the write')
echo "  kills: $kills ($during during a checkpoint write), attempts: $attempts," \
     "resumed from steps: ${resumes[*]:-none}, fallbacks past damaged checkpoints: $fallbacks"
for c in "${checks[@]}"; do echo "  $c"; done
echo "crash_drill: $result after $((SECONDS - t_begin)) s${reason:+: $reason}"
if [ "$result" = PASSED ]; then
  if [ "$keep" = 0 ]; then
    if [ "$created_work" = 1 ]; then rm -rf "$work"; else rm -rf "$work/ref" "$work/drill"; fi
  fi
  exit 0
fi
echo "crash_drill: logs kept in $work/logs" >&2
exit 1
