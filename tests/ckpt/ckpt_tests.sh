#!/usr/bin/env bash
# Checkpoints with bad input, damage, signals and kill -9 (train/checkpointer.h).
#
#   ckpt_tests.sh setup WIOLA WORK   shards (300 kB of Brown), a second shard set
#                                    from the next 300 kB, one made with a
#                                    byte-different tokenizer.json; the
#                                    uninterrupted reference runs ref1 (single
#                                    process) and ref2 (dp=2 on 2 ranks): 8
#                                    steps, a checkpoint every 2, all kept
#   ckpt_tests.sh CASE WIOLA WORK    one case (the list: `grep '^case_' $0`)
#
# Exit status 0: the case holds; 1: it does not (the reason on stderr);
# 77: skipped (the reason on stdout), e.g. mount not permitted.
# Environment: MPIEXEC, WIOLA_PYTHON (python with h5py), and the Open MPI
# settings of WIOLA_MPI_ENV (tests/CMakeLists.txt).
set -uo pipefail
what=$1; wiola=$2; work=$3
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
python=${WIOLA_PYTHON:-/usr/bin/python3}
mpiexec=${MPIEXEC:-mpiexec}
compare=("$python" "$root/scripts/ckpt_compare.py")
shards=$work/shards
steps=8
common=(--set model.preset=wiola-tiny --set model.vocab_size=32000 --set train.micro_batch=2
        --set train.grad_accum=4 --set train.threads=1 --set "train.steps=$steps"
        --set "data.path=$shards/manifest.json" --set checkpoint.every=2 --set checkpoint.keep=10 -q)
dp2=(--set parallel.dp=2 --set train.grad_accum=2)
limit=120  # seconds per wiola command: a hang fails the case

fail() { echo "FAIL: $what: $*" >&2; exit 1; }
skip() { echo "SKIP: $what: $*"; exit 77; }
note() { echo "$what: $*"; }
# train1 ARGS: single process; train2 ARGS: 2 ranks, dp=2 (same global batch).
train1() { timeout -k 5 "$limit" "$wiola" train "${common[@]}" "$@"; }
train2() { timeout -k 5 "$limit" "$mpiexec" -n 2 --bind-to none "$wiola" train "${common[@]}" "${dp2[@]}" "$@"; }
# where DIR: run dir and checkpoint dir under DIR.
where() { echo --set "train.run_dir=$1/run" --set "checkpoint.dir=$1/ck"; }
step_dir() { printf '%s/step-%08d' "$1" "$2"; }

# expect_fail NAME REGEX CMD...: CMD exits non-zero (not by timeout) and its
# stderr matches REGEX; NAME.out / NAME.err are kept in the case folder.
expect_fail() {
  local name=$1 regex=$2; shift 2
  "$@" > "$t/$name.out" 2> "$t/$name.err"
  local rc=$?
  sed "s/^/  [$name stderr] /" "$t/$name.err" >&2
  [ "$rc" -ne 124 ] && [ "$rc" -ne 137 ] || fail "$name: timed out (hang)"
  [ "$rc" -ne 0 ] || fail "$name: exit status 0, expected an error"
  [ "$rc" -lt 128 ] && ! grep -q "Segmentation fault\|signal 11" "$t/$name.err" ||
    fail "$name: exit status $rc: killed by a signal (crash)"
  grep -Eq -- "$regex" "$t/$name.err" || fail "$name: stderr does not match: $regex"
}
# one_error FILE: exactly one error line (single process: the whole of stderr;
# under mpirun: one "rank R: ..." line besides Open MPI's abort banner).
one_error() {
  local n
  n=$(grep -cE '^(wiola train: error: |rank [0-9]+: )' "$1")
  [ "$n" -eq 1 ] || fail "$(basename "$1"): $n error lines, expected one"
}
# same_error FILE: at least one error line, and every rank's is the same
# message (a refusal every rank meets is today reported by each of them:
# see case_refuse_reported_once).
same_error() {
  local n; n=$(grep -E '^(wiola train: error: |rank [0-9]+: )' "$1" | sed -E 's/^rank [0-9]+: //' | sort -u | wc -l)
  [ "$n" -eq 1 ] || fail "$(basename "$1"): $n different error messages, expected one"
}
one_line() { [ "$(wc -l < "$1")" -eq 1 ] || fail "$(basename "$1"): $(wc -l < "$1") lines on stderr, expected one"; }
# expect_ok NAME CMD...: CMD exits 0.
expect_ok() {
  local name=$1; shift
  "$@" > "$t/$name.out" 2> "$t/$name.err"
  local rc=$?
  [ "$rc" -eq 0 ] || { cat "$t/$name.err" >&2; fail "$name: exit status $rc"; }
}
# A listing of a checkpoint dir (names, sizes, checksums) to show nothing changed.
listing() { (cd "$1" && find . -type f -print0 | sort -z | xargs -0 md5sum); }
# same_as_ref RUN REF: metrics 1..steps once each with REF's losses, and the
# final checkpoint bit for bit REF's.
same_as_ref() {
  "${compare[@]}" metrics "$1/run" "$2/run" "$steps" || fail "metrics.jsonl differs from the uninterrupted run's"
  "${compare[@]}" tensors "$(step_dir "$2/ck" $steps)" "$(step_dir "$1/ck" $steps)" ||
    fail "the final checkpoint differs from the uninterrupted run's"
}
# after_step7 REF DEST: DEST looks like REF's run killed during step 8:
# checkpoints 2, 4, 6 (latest 6) and metrics of steps 1..7.
after_step7() {
  mkdir -p "$2/ck" "$2/run"
  for s in 2 4 6; do cp -a "$(step_dir "$1/ck" $s)" "$2/ck/"; done
  echo step-00000006 > "$2/ck/latest"
  head -n 7 "$1/run/metrics.jsonl" > "$2/run/metrics.jsonl"
}
# job_of PID: the job under PID (a background function: bash, timeout, then
# wiola or mpirun), the process to signal.
descendants() { local p; for p in $(pgrep -P "$1"); do echo "$p"; descendants "$p"; done; }
job_of() {
  local p
  for p in $(descendants "$1"); do
    case $(cat "/proc/$p/comm" 2>/dev/null) in timeout|bash|"") ;; *) echo "$p"; return 0 ;; esac
  done
  fail "no job under pid $1"
}
# lines FILE: its line count (0 when absent).
lines() { if [ -f "$1" ]; then wc -l < "$1"; else echo 0; fi; }
wait_lines() {  # wait_lines FILE N PID: until FILE has N lines (fails if PID ends first)
  local i
  for i in $(seq 1200); do
    [ "$(lines "$1")" -ge "$2" ] && return 0
    kill -0 "$3" 2>/dev/null || fail "the run ended before step $2"
    sleep 0.05
  done
  fail "no step $2 after 60 s"
}

# unmount_under DIR: this script's tmpfs mounts left under DIR by a case that
# was killed before its trap ran.
unmount_under() {
  local m
  for m in $(findmnt -rn -o TARGET 2>/dev/null | grep -F "$1/" | sort -r); do umount "$m" 2>/dev/null; done
}

# ---- fixture --------------------------------------------------------------------
if [ "$what" = setup ]; then
  unmount_under "$work"
  rm -rf "$work"; mkdir -p "$work"
  xz -dc "$root/data/brown/brown.txt.xz" > "$work/full.txt"
  head -c 300000 "$work/full.txt" > "$work/brown.txt"
  tail -c +300001 "$work/full.txt" | head -c 300000 > "$work/other.txt"
  rm "$work/full.txt"
  tok=$root/data/wiola360m/tokenizer.json
  # The same tokenizer, one byte longer: another sha256, the same tokens.
  { cat "$tok"; echo; } > "$work/tokenizer-edited.json"
  prep() { "$wiola" prep --no-progress --tokenizer "$1" --output "$2" "$3" > "$2.log" 2>&1 || { cat "$2.log"; exit 1; }; }
  prep "$tok" "$shards" "$work/brown.txt"
  prep "$tok" "$work/shards_other" "$work/other.txt"
  prep "$work/tokenizer-edited.json" "$work/shards_tok" "$work/brown.txt"
  t=$work
  # shellcheck disable=SC2046
  expect_ok ref1 train1 $(where "$work/ref1")
  # shellcheck disable=SC2046
  expect_ok ref2 train2 $(where "$work/ref2")
  ls "$work/ref1/ck" "$work/ref2/ck"
  exit 0
fi

t=$work/$what
unmount_under "$t"
rm -rf "$t"; mkdir -p "$t"
ref1=$work/ref1 ref2=$work/ref2
[ -f "$(step_dir "$ref2/ck" $steps)/manifest.json" ] || fail "no fixture in $work (run the setup first)"

# ---- resume refused when the identity changed ------------------------------------
# A copy of the reference's newest checkpoint (or REFUSED_FROM's); the refusal names the key,
# leaves the checkpoint untouched and trains nothing.
refused() {  # refused NAME REGEX TRAINFN ARGS...
  local name=$1 regex=$2 fn=$3; shift 3
  rm -rf "${t:?}/$name"; mkdir -p "$t/$name/ck"
  cp -a "$(step_dir "${REFUSED_FROM:-$ref1}/ck" $steps)" "$t/$name/ck/"
  local before; before=$(listing "$t/$name/ck")
  # shellcheck disable=SC2046
  expect_fail "$name" "$regex" "$fn" $(where "$t/$name") "$@"
  if [ "$fn" = train1 ] || [ "${STRICT_ONCE:-0}" = 1 ]; then one_error "$t/$name.err"; else same_error "$t/$name.err"; fi
  [ "$fn" = train1 ] && one_line "$t/$name.err"
  [ "$(listing "$t/$name/ck")" = "$before" ] || fail "$name: the checkpoint dir changed"
  [ ! -e "$t/$name/run/metrics.jsonl" ] || fail "$name: metrics.jsonl written: it trained"
  note "$name refused as expected"
}
cannot="cannot resume from '.*step-0000000$steps': "
case_refuse_model() {
  refused d "^wiola train: error: ${cannot}model\\.d = 64 in the checkpoint, 96 in this run\\. These may not change" \
    train1 --set model.d=96
  refused layers "^wiola train: error: ${cannot}model\\.n_layers = 6 in the checkpoint, 4 in this run\\." \
    train1 --set model.n_layers=4
}
case_refuse_batch() {  # under mpirun (every rank reports it today: see case_refuse_reported_once)
  refused batch "^(rank [01]|wiola train: error): ${cannot}global_batch = 8 in the checkpoint, 4 in this run\\." \
    train2 --set train.grad_accum=1
}
case_refuse_seed() {
  refused seed "^wiola train: error: ${cannot}.*train\\.seed = 1234 in the checkpoint, 7 in this run" \
    train1 --set train.seed=7
  # Document masking (data.documents) changes the loss: a resume may not switch it.
  refused documents "^wiola train: error: ${cannot}data\\.documents = false in the checkpoint, true in this run" \
    train1 --set data.documents=true
}
case_refuse_data() {
  refused data "^wiola train: error: ${cannot}.*data\\.train_tokens = [0-9]+ in the checkpoint, [0-9]+ in this run" \
    train1 --set "data.path=$work/shards_other/manifest.json"
}
case_refuse_tokenizer() {
  refused tokenizer "^wiola train: error: ${cannot}data\\.tokenizer_sha256 = \"[0-9a-f]{64}\" in the checkpoint, \"[0-9a-f]{64}\" in this run\\." \
    train1 --set "data.path=$work/shards_tok/manifest.json"
}

# ---- the newest checkpoint damaged: warning, the previous one, same result ------
# 2 ranks (dp=2, ZeRO: each rank writes half): rank 1's file is verified by
# rank 1. The run was killed during step 8; step 6 is damaged.
damaged() {  # damaged PROBLEM_REGEX DAMAGE_COMMAND...
  local regex=$1; shift
  after_step7 "$ref2" "$t"
  ( cd "$(step_dir "$t/ck" 6)" && "$@" ) || fail "could not damage the checkpoint"
  # shellcheck disable=SC2046
  expect_ok resume train2 $(where "$t")
  cat "$t/resume.err"
  grep -Eq "^wiola train: warning: checkpoint .*/step-00000006 is damaged \\($regex\\); trying an older one" \
    "$t/resume.err" || fail "no 'is damaged' warning matching: $regex"
  [ "$(grep -c 'is damaged' "$t/resume.err")" -eq 1 ] || fail "expected one warning"
  grep -q "^wiola train: resuming from .*/step-00000004 (step 4," "$t/resume.out" ||
    fail "did not resume from step 4: $(grep resuming "$t/resume.out")"
  same_as_ref "$t" "$ref2"
}
flip_byte() {  # flip_byte FILE OFFSET
  local b; b=$(od -An -tu1 -j "$2" -N1 "$1" | tr -d ' ')
  printf "$(printf '\\%03o' $(( b ^ 0xff )))" | dd of="$1" bs=1 seek="$2" conv=notrunc status=none
}
case_damaged_truncated() {
  damaged "rank-00001\\.h5: 4096 bytes, the manifest says [0-9]+ \\(truncated or replaced\\)" truncate -s 4096 rank-00001.h5
}
case_damaged_bitflip() {
  damaged "rank-00001\\.h5: checksum mismatch \\(corrupt\\)" flip_byte rank-00001.h5 5000000
}
case_damaged_missing_rank() {
  damaged "rank-00000\\.h5: missing" rm rank-00000.h5
}
case_damaged_manifest() {
  # The manifest's size of rank 1's file off by one.
  damaged "rank-00001\\.h5: [0-9]+ bytes, the manifest says [0-9]+ \\(truncated or replaced\\)" \
    "$python" -c '
import json
m = json.load(open("manifest.json"))
f = [f for f in m["files"] if f["name"] == "rank-00001.h5"][0]
f["bytes"] += 1
json.dump(m, open("manifest.json", "w"), indent=1)'
}

case_damaged_manifest_names_absent() {
  # The manifest names rank-00002.h5 where rank 1's file is listed: a file
  # that is not there.
  damaged "rank-00002\\.h5: missing" "$python" -c '
import json
m = json.load(open("manifest.json"))
[f for f in m["files"] if f["name"] == "rank-00001.h5"][0]["name"] = "rank-00002.h5"
json.dump(m, open("manifest.json", "w"), indent=1)'
}
case_damaged_truncated_consistent() {
  # Rank 1's file cut in half, and the manifest's size and hash made to
  # match it: only HDF5 sees the damage (the file ends before its data).
  "$python" -c 'import xxhash' 2> /dev/null || skip "no xxhash module in $python"
  damaged "rank-00001\\.h5: not a readable HDF5 file" "$python" -c '
import json, os, xxhash
f = "rank-00001.h5"
os.truncate(f, os.path.getsize(f) // 2)
m = json.load(open("manifest.json"))
r = [r for r in m["files"] if r["name"] == f][0]
r["bytes"] = os.path.getsize(f)
r["xxh3"] = xxhash.xxh3_64(open(f, "rb").read()).hexdigest()
json.dump(m, open("manifest.json", "w"), indent=1)'
}

# ---- every checkpoint damaged: an error, nothing deleted ---------------------------
case_all_damaged() {
  after_step7 "$ref2" "$t"
  truncate -s 100 "$(step_dir "$t/ck" 6)/rank-00000.h5"
  flip_byte "$(step_dir "$t/ck" 4)/rank-00001.h5" 1000
  rm "$(step_dir "$t/ck" 2)/rank-00001.h5"
  local before; before=$(listing "$t/ck")
  # shellcheck disable=SC2046
  expect_fail resume "^(rank 0|wiola train: error): checkpoint\\.dir '.*/ck' holds checkpoints but none is sound \\(see the warnings above\\); nothing was deleted" \
    train2 $(where "$t")
  one_error "$t/resume.err"
  [ "$(grep -c 'is damaged' "$t/resume.err")" -eq 3 ] || fail "expected 3 'is damaged' warnings"
  [ "$(listing "$t/ck")" = "$before" ] || fail "the checkpoint dir changed"
  [ "$(lines "$t/run/metrics.jsonl")" -eq 7 ] || fail "metrics.jsonl changed"
  note "refused, all 3 damaged checkpoints still there"
}

# ---- checkpoint.dir unusable: one error before training ----------------------------
case_dir_is_file() {
  echo "not a directory" > "$t/file"
  expect_fail file "^wiola train: error: checkpoint\\.dir '$t/file': cannot create: Not a directory" \
    train1 --set "checkpoint.dir=$t/file" --set "train.run_dir=$t/run"
  one_line "$t/file.err"
  expect_fail under "^wiola train: error: checkpoint\\.dir '$t/file/ck': cannot create: Not a directory" \
    train1 --set "checkpoint.dir=$t/file/ck" --set "train.run_dir=$t/run"
  one_line "$t/under.err"
  [ ! -e "$t/run" ] || fail "the run started (its run_dir exists)"
  [ "$(cat "$t/file")" = "not a directory" ] || fail "the file changed"
}
case_dir_readonly() {
  mkdir -p "$t/ro"
  if [ "$(id -u)" = 0 ]; then
    # chmod does not stop root: a read-only tmpfs does.
    mount -t tmpfs -o ro,size=1m tmpfs "$t/ro" 2>"$t/mount.err" ||
      skip "root cannot mount a read-only tmpfs here ($(cat "$t/mount.err")); chmod does not stop root"
    trap 'umount "$t/ro"' EXIT
  else
    chmod 555 "$t/ro"
  fi
  expect_fail ro "^wiola train: error: checkpoint\\.dir '$t/ro' is not writable \\(.*(Read-only file system|Permission denied)\\)" \
    train1 --set "checkpoint.dir=$t/ro" --set "train.run_dir=$t/run"
  one_line "$t/ro.err"
  expect_fail ro_sub "^wiola train: error: checkpoint\\.dir '$t/ro/ck': cannot create: (Read-only file system|Permission denied)" \
    train1 --set "checkpoint.dir=$t/ro/ck" --set "train.run_dir=$t/run"
  one_line "$t/ro_sub.err"
  [ ! -e "$t/run" ] || fail "the run started (its run_dir exists)"
}

# ---- the disk fills up: an error naming the path, earlier checkpoints intact ------
# A real full disk: a tmpfs with room for 1.5 checkpoints holds step 2, then
# every save fails. Each failure is one warning and training goes on; the
# final save's failure ends the run with an error (no crash); step 2 and
# `latest` are as they were and no temporary folder is left; the run resumed
# from step 2 (on a disk with room) equals the uninterrupted one bit for bit.
disk_full() {  # disk_full TRAINFN REF
  local fn=$1 ref=$2
  [ "$(id -u)" = 0 ] || skip "mounting a small tmpfs needs root"
  mkdir -p "$t/disk"
  local one; one=$(du -sb "$(step_dir "$ref/ck" 2)" | cut -f1)
  mount -t tmpfs -o size=$(( one * 3 / 2 )) tmpfs "$t/disk" 2>"$t/mount.err" ||
    skip "mount -t tmpfs is not permitted here: $(cat "$t/mount.err")"
  trap 'umount "$t/disk"' EXIT
  expect_fail full "^(wiola train: error|rank 0): checkpoint step 8 not saved \\((rank [01]: )?$t/disk/ck/\\.tmp-step-00000008/rank-0000[01]\\.h5\\.tmp: write failed: No space left on device\\); the newest checkpoint in $t/disk/ck is still step 2; this was the run's final checkpoint" \
    "$fn" --set "checkpoint.dir=$t/disk/ck" --set "train.run_dir=$t/run"
  one_error "$t/full.err"
  failed_saves_left "$t/disk/ck" "$t/full.err" "$t/disk/ck/\\.tmp-step-0000000[46]/rank-0000[01]\\.h5\\.tmp: write failed: No space left on device"
  cp -a "$t/disk/ck" "$t/ck"
  resumes_from_step2 "$fn" "$ref"
}
case_disk_full() { disk_full train1 "$ref1"; }
case_disk_full_mpirun() { disk_full train2 "$ref2"; }

# ---- wiola ckpt consolidate onto a full disk ------------------------------------------
# A tmpfs too small for the consolidated file, sized so that the write fails
# at the first tensor, in the middle of the moments and at the final flush
# of HDF5's metadata: each time exit status 1 with one line naming the file,
# the stage and the reason, no crash (HDF5's exit handlers included: a file
# left half closed by a failed flush crashed them), nothing left on the
# disk; with room, the same command writes the file.
case_consolidate_disk_full() {
  [ "$(id -u)" = 0 ] || skip "mounting a small tmpfs needs root"
  local src; src=$(step_dir "$ref1/ck" $steps)
  expect_ok whole "$wiola" ckpt consolidate "$src" "$t/whole.h5"
  expect_ok whole_opt "$wiola" ckpt consolidate --with-optimizer "$src" "$t/whole_opt.h5"
  local p o; p=$(stat -c %s "$t/whole.h5"); o=$(stat -c %s "$t/whole_opt.h5")
  rm "$t/whole.h5" "$t/whole_opt.h5"
  mkdir -p "$t/disk"
  trap 'umount "$t/disk" 2> /dev/null' EXIT
  local size opt stage name
  # size (bytes), --with-optimizer or not, the stage named
  for c in "$(( 1 << 20 )) - param/model\.embed_tokens\.weight" \
           "$(( o / 2 )) --with-optimizer exp_avg/model\.[a-z0-9_.]+" \
           "$(( p * 9 / 10 )) - flush"; do
    read -r size opt stage <<< "$c"
    [ "$opt" = - ] && opt=
    mount -t tmpfs -o size="$size" tmpfs "$t/disk" 2> "$t/mount.err" ||
      skip "mount -t tmpfs is not permitted here: $(cat "$t/mount.err")"
    name=full_$size
    # shellcheck disable=SC2086
    expect_fail "$name" "^wiola ckpt: error: $t/disk/out\.h5\.tmp: write failed at $stage: No space left on device\$" \
      "$wiola" ckpt consolidate $opt "$src" "$t/disk/out.h5"
    one_line "$t/$name.err"
    [ -z "$(ls -A "$t/disk")" ] || fail "$name: left on the disk: $(ls -A "$t/disk")"
    umount "$t/disk"
    note "$size bytes${opt:+ $opt}: $(cat "$t/$name.err")"
  done
  trap - EXIT
}

# ---- a save that fails on purpose at each stage (WIOLA_CKPT_FAIL_AT) -----------------
# failed_saves_left CK ERR CAUSE: after a run whose saves of steps 4, 6
# and 8 failed: one warning each for steps 4 and 6 (CAUSE names the path and
# the reason), training went on to step 8, CK holds step 2 (sound: the
# caller resumes from it), `latest` names it, and nothing else is left behind.
failed_saves_left() {
  local ck=$1 err=$2 cause=$3 s
  for s in 4 6; do
    grep -Eq "^wiola train: warning: checkpoint step $s not saved \\((rank [01]: )?$cause.*\\); the newest checkpoint in $ck is still step 2; training goes on" \
      "$err" || fail "no warning for step $s matching: $cause"
  done
  [ "$(grep -c 'warning: checkpoint step' "$err")" -eq 2 ] || fail "expected two warnings"
  # Step 8 ran (its save was tried), but its metrics line was still to come.
  [ "$(lines "$t/run/metrics.jsonl")" -eq $((steps - 1)) ] || fail "training did not go on to step $steps"
  [ "$(cd "$ck" && echo * .tmp* .old*)" = "latest step-00000002 .tmp* .old*" ] || fail "left in $ck: $(ls -A "$ck")"
  [ "$(cat "$ck/latest")" = step-00000002 ] || fail "latest is not step 2"
}
# resumes_from_step2 TRAINFN REF: the run in $t resumed (saving only at its
# end) goes on from step 2 and ends as REF did, bit for bit.
resumes_from_step2() {
  # shellcheck disable=SC2046
  expect_ok resume "$1" $(where "$t") --set checkpoint.every=0
  grep -q "^wiola train: resuming from .*/step-00000002 (step 2," "$t/resume.out" || fail "did not resume from step 2"
  same_as_ref "$t" "$2"
}
# fails_at STAGE CAUSE TRAINFN REF [RANK]: every save from step 4 on fails at
# STAGE (on RANK only, when given): see failed_saves_left; the final save's
# failure is one error and a non-zero exit status; resumed from step 2, the
# run equals the uninterrupted one bit for bit.
fails_at() {
  local stage=$1 cause=$2 fn=$3 ref=$4 rank=${5:+:$5}
  export WIOLA_CKPT_FAIL_AT="$stage:4-$rank"
  # shellcheck disable=SC2046
  expect_fail failing "^(wiola train: error|rank 0): checkpoint step 8 not saved \\((rank [01]: )?$cause.*\\); the newest checkpoint in $t/ck is still step 2; this was the run's final checkpoint" \
    "$fn" $(where "$t")
  unset WIOLA_CKPT_FAIL_AT
  one_error "$t/failing.err"
  failed_saves_left "$t/ck" "$t/failing.err" "$cause"
  resumes_from_step2 "$fn" "$ref"
}
enospc="No space left on device \\(WIOLA_CKPT_FAIL_AT=[a-z]+:4-(:[01])?\\)"
tmpN="$work/[a-z0-9_]+/ck/\\.tmp-step-0000000[468]"
rank_tmp="$tmpN/rank-0000[01]\\.h5\\.tmp"
case_fail_at_mkdir() { fails_at mkdir "$tmpN: mkdir failed: $enospc" train1 "$ref1"; }
case_fail_at_create() { fails_at create "$rank_tmp: create failed: $enospc" train1 "$ref1"; }
case_fail_at_write() { fails_at write "$rank_tmp: write failed: $enospc" train1 "$ref1"; }
case_fail_at_close() { fails_at close "$rank_tmp: close failed: $enospc" train1 "$ref1"; }
case_fail_at_rename() { fails_at rename "$tmpN/rank-00000\\.h5: rename failed: $enospc" train1 "$ref1"; }
case_fail_at_tokenizer() { fails_at tokenizer "$tmpN/tokenizer\\.json: tokenizer failed: $enospc" train1 "$ref1"; }
case_fail_at_manifest() { fails_at manifest "$tmpN/manifest\\.json: manifest failed: $enospc" train1 "$ref1"; }
case_fail_at_commit() { fails_at commit "$work/[a-z0-9_]+/ck/step-0000000[468]: commit failed: $enospc" train1 "$ref1"; }
case_fail_at_latest() { fails_at latest "$work/[a-z0-9_]+/ck/latest: latest failed: $enospc" train1 "$ref1"; }
# 2 ranks, only rank 1's write fails: every rank treats the save as failed,
# nobody waits for anybody, and the run ends with rank 0's one message.
case_fail_at_close_rank1_mpirun() {
  fails_at close "rank 1: $tmpN/rank-00001\\.h5\\.tmp: close failed: $enospc" train2 "$ref2" 1
}
# Only step 4's save fails (rank 0 of 2): the saves after it succeed, and the
# run ends as the uninterrupted one did, bit for bit.
case_fail_once_mpirun() {
  export WIOLA_CKPT_FAIL_AT=write:4:0
  # shellcheck disable=SC2046
  expect_ok once train2 $(where "$t")
  unset WIOLA_CKPT_FAIL_AT
  cat "$t/once.err"
  grep -Eq "^wiola train: warning: checkpoint step 4 not saved \\(rank 0: $rank_tmp: write failed: No space left on device \\(WIOLA_CKPT_FAIL_AT=write:4:0\\)\\); the newest checkpoint in $t/ck is still step 2; training goes on" \
    "$t/once.err" || fail "no warning for step 4"
  [ "$(grep -c 'warning: checkpoint' "$t/once.err")" -eq 1 ] || fail "expected one warning"
  [ "$(cd "$t/ck" && echo * .tmp*)" = "latest step-00000002 step-00000006 step-00000008 .tmp*" ] ||
    fail "left in $t/ck: $(ls -A "$t/ck")"
  same_as_ref "$t" "$ref2"
}
# SIGTERM: the stop's save fails too, so the run ends with the error and
# exit status 1, not 75 (it did not stop where a checkpoint says).
case_fail_on_sigterm() {
  export WIOLA_CKPT_FAIL_AT=write
  # shellcheck disable=SC2046
  train1 $(where "$t") > "$t/stop.out" 2> "$t/stop.err" &
  local pid=$!
  wait_lines "$t/run/metrics.jsonl" 3 "$pid"
  kill -TERM "$(job_of "$pid")"
  wait "$pid"; local rc=$?
  unset WIOLA_CKPT_FAIL_AT
  cat "$t/stop.err"
  [ "$rc" -eq 1 ] || fail "exit status $rc after SIGTERM with failing saves, expected 1"
  local n; n=$(sed -n "s/^wiola train: error: checkpoint step \([0-9]*\) not saved (.*write failed: No space left on device.*); $(echo "$t/ck" | sed 's/[.[\/*^$]/\\&/g') holds no checkpoint of this run; this was the run's final checkpoint.*/\1/p" "$t/stop.err")
  [ -n "$n" ] || fail "no error for the stop's save"
  [ "$n" -lt $steps ] || fail "the run was not stopped (its last step's save failed at step $n)"
  one_error "$t/stop.err"
  grep -q "stopped at step" "$t/stop.out" && fail "reported as stopped with a checkpoint"
  return 0
}
# checkpoint.max_failed_minutes: 0 stops at the first failed save (written
# in the foreground: checkpoint.async = false); a tiny limit, at the second
# (the first one starts the clock).
stopped_after() {  # stopped_after DIR STEP WHAT: the run stopped once step STEP's save was seen to fail
  # A background save is committed at the end of a later step, the next one
  # or the one after, whose metrics line then never comes.
  local n; n=$(lines "$1/run/metrics.jsonl")
  [ "$n" -ge "$2" ] && [ "$n" -le $(( $2 + 1 )) ] || fail "$3: stopped after step $n, expected $2 or $(( $2 + 1 ))"
}
case_fail_give_up() {
  export WIOLA_CKPT_FAIL_AT=write:4-
  # shellcheck disable=SC2046
  expect_fail first "^wiola train: error: checkpoint step 4 not saved \\(.*\\); the newest checkpoint in $t/first/ck is still step 2; checkpoints have failed since step 4 \\([0-9.e-]+ min, checkpoint\\.max_failed_minutes = 0\\): the run stops" \
    train1 $(where "$t/first") --set checkpoint.max_failed_minutes=0 --set checkpoint.async=false
  one_line "$t/first.err"
  stopped_after "$t/first" 4 "max_failed_minutes = 0"
  # shellcheck disable=SC2046
  expect_fail second "^wiola train: error: checkpoint step 6 not saved \\(.*\\); .*checkpoints have failed since step 4 \\([0-9.e-]+ min, checkpoint\\.max_failed_minutes = 1e-05\\): the run stops" \
    train1 $(where "$t/second") --set checkpoint.max_failed_minutes=0.00001
  unset WIOLA_CKPT_FAIL_AT
  stopped_after "$t/second" 6 "max_failed_minutes = 1e-05"
}

# ---- checkpoint.init_from (weights only) --------------------------------------------
case_init_from_other_model() {
  expect_fail other "^wiola train: error: checkpoint '.*/ref1/ck/step-0000000$steps' is of another model: model\\.d = 64 in the checkpoint, 96 in this run" \
    train1 --set "checkpoint.init_from=$ref1/ck" --set model.d=96 --set "train.run_dir=$t/run"
  one_line "$t/other.err"
}
case_init_from() {
  # Another seed and batch are fine for a weights-only start; the model is not.
  expect_ok tune train1 --set "checkpoint.init_from=$ref1/ck" --set train.steps=2 --set "train.run_dir=$t/run"
  grep -q "^wiola train: weights from .*/ref1/ck/step-0000000$steps (new optimizer state" "$t/tune.out" ||
    fail "no 'weights from' line"
  "$python" - "$t/run/metrics.jsonl" "$ref1/run/metrics.jsonl" <<'EOF' || fail "first loss not lower than a fresh run's"
import json, sys
tuned = [json.loads(l) for l in open(sys.argv[1])]
fresh = [json.loads(l) for l in open(sys.argv[2])]
assert [r["step"] for r in tuned] == [1, 2], f"steps {[r['step'] for r in tuned]}, expected 1, 2"
a, b = tuned[0]["loss"], fresh[0]["loss"]
print(f"first loss: {a} from the checkpoint's weights, {b} fresh (same first batch)")
assert a < b - 0.05, "the checkpoint's weights were not used"
EOF
}

# ---- SIGUSR1: stop at a checkpoint, exit 75, resume ---------------------------------
stop_and_resume() {  # stop_and_resume REF TRAINFN: signal the PID that TRAINFN's job runs as
  local ref=$1 fn=$2
  # shellcheck disable=SC2046
  $fn $(where "$t") > "$t/stop.out" 2> "$t/stop.err" &
  local pid=$!
  wait_lines "$t/run/metrics.jsonl" 3 "$pid"
  local job; job=$(job_of "$pid")
  note "SIGUSR1 to pid $job ($(cat "/proc/$job/comm")) after step $(lines "$t/run/metrics.jsonl")"
  kill -USR1 "$job"
  wait "$pid"; local rc=$?
  cat "$t/stop.out" "$t/stop.err"
  [ "$rc" -eq 75 ] || fail "exit status $rc after SIGUSR1, expected 75"
  local n; n=$(sed -n 's/^wiola train: stopped at step \([0-9]*\) on request.*exit status 75)$/\1/p' "$t/stop.out")
  [ -n "$n" ] || fail "no 'stopped at step N' line"
  [ "$n" -ge 3 ] && [ "$n" -lt $steps ] || fail "stopped at step $n"
  [ "$(lines "$t/run/metrics.jsonl")" -eq "$n" ] || fail "metrics.jsonl holds $(lines "$t/run/metrics.jsonl") steps, stopped at $n"
  [ "$(cat "$t/ck/latest")" = "$(basename "$(step_dir "$t/ck" "$n")")" ] || fail "latest is not step $n"
  "${compare[@]}" verify "$(step_dir "$t/ck" "$n")" || fail "the checkpoint of step $n is not sound"
  # shellcheck disable=SC2046
  expect_ok resume "$fn" $(where "$t")
  grep -q "^wiola train: resuming from .*/step-$(printf %08d "$n") (step $n," "$t/resume.out" || fail "did not resume from step $n"
  same_as_ref "$t" "$ref"
}
case_sigusr1_single() { stop_and_resume "$ref1" train1; }
case_sigusr1_mpirun() {
  stop_and_resume "$ref2" train2
  grep -q "Forwarding signal 10" "$t/stop.err" && note "mpirun forwarded SIGUSR1 to the ranks"
  return 0
}

# ---- kill -9 and resume: metrics.jsonl holds each step once -------------------------
case_kill9_metrics() {
  # shellcheck disable=SC2046
  train1 $(where "$t") > "$t/killed.out" 2> "$t/killed.err" &
  local pid=$!
  wait_lines "$t/run/metrics.jsonl" 5 "$pid"
  kill -9 "$(job_of "$pid")"
  wait "$pid"
  local logged; logged=$(lines "$t/run/metrics.jsonl")
  # A line torn by the kill (as if it came mid-write).
  printf '{"grad_norm":1.0,"loss":9.9,"lr":0' >> "$t/run/metrics.jsonl"
  # The newest complete checkpoint (the kill may fall between a save's
  # rename and its move of `latest`: resume takes the newest all the same).
  local latest; latest=$(cd "$t/ck" && ls -d step-*/manifest.json | sort | tail -n 1 | sed 's|^step-0*||; s|/.*||')
  note "killed after step $logged was logged; latest checkpoint: step $latest"
  [ "$logged" -gt "$latest" ] || fail "nothing to cut back (logged $logged, checkpoint $latest)"
  # shellcheck disable=SC2046
  expect_ok resume train1 $(where "$t")
  grep -q "^wiola train: resuming from .*(step $latest," "$t/resume.out" || fail "did not resume from step $latest"
  same_as_ref "$t" "$ref1"
}

# ---- problems found by these tests, fixed (prune, init_from verification, one
# report per refusal, step folders without a manifest); the last is a known gap
# (registered DISABLED) ----------------
case_prune_keeps_new() {
  # A damaged checkpoint of a later step than the one resumed from counts
  # among the `keep` newest: with keep = 1 the checkpoints this run writes
  # are pruned as soon as they are committed, and `latest` dangles.
  after_step7 "$ref1" "$t"
  cp -a "$(step_dir "$ref1/ck" 8)" "$t/ck/"
  truncate -s 100 "$(step_dir "$t/ck" 8)/rank-00000.h5" "$(step_dir "$t/ck" 6)/rank-00000.h5"
  # shellcheck disable=SC2046
  expect_ok resume train1 $(where "$t") --set checkpoint.keep=1 --set train.max_steps=7
  local l; l=$(cat "$t/ck/latest")
  ls "$t/ck"
  [ -f "$t/ck/$l/manifest.json" ] || fail "latest names $l, which was pruned"
}
case_fresh_in_used_dir() {
  # checkpoint.resume = false in a dir holding checkpoints would mix two runs
  # (a later resume takes the newest step, whichever run wrote it): refused
  # before training, with one message, and nothing in the dir changes.
  after_step7 "$ref1" "$t"
  local before; before=$(listing "$t/ck")
  # shellcheck disable=SC2046
  expect_fail fresh "^wiola train: error: checkpoint.resume = false, but checkpoint.dir .* already holds checkpoints" \
    train1 $(where "$t") --set checkpoint.resume=false --set train.max_steps=3
  one_line "$t/fresh.err"
  [ "$(listing "$t/ck")" = "$before" ] || fail "the checkpoint dir changed"
}
case_init_from_damaged() {
  # checkpoint.init_from loads without verifying the files: a corrupt value
  # in a parameter is loaded silently (resume refuses the same checkpoint).
  mkdir -p "$t/ck"
  cp -a "$(step_dir "$ref1/ck" 8)" "$t/ck/"
  local f; f=$(step_dir "$t/ck" 8)/rank-00000.h5
  local off; off=$("$python" -c "import h5py; print(h5py.File('$f', 'r')['/param/model.norm.weight/0'].id.get_offset())")
  printf '\x00\x00\x80\x40' | dd of="$f" bs=1 seek="$off" conv=notrunc status=none
  expect_fail tune "checkpoint .*step-00000008.*(damaged|corrupt|checksum)" \
    train1 --set "checkpoint.init_from=$t/ck" --set train.steps=2 --set "train.run_dir=$t/run"
}
case_damaged_no_manifest() {
  # A step folder without its manifest.json is skipped silently (not counted
  # as damaged): with no other checkpoint the run starts over at step 1
  # without a word; here it should warn and resume from step 4.
  damaged ".*manifest\\.json.*" rm manifest.json
}
case_other_cpu_kernels() {
  # A checkpoint written on Prescott kernels (WIOLA_TEST_BLAS=forced:Prescott)
  # resumes on the same kernels without a word, and on others with one note
  # that it continues within float rounding (docs/cpu.md#determinism); both
  # resumes run to the end.
  WIOLA_TEST_BLAS=forced:Prescott train1 $(where "$t/a") --set train.max_steps=4 > "$t/first.out" 2>&1 ||
    fail "first part failed: $(tail -3 "$t/first.out")"
  cp -r "$t/a" "$t/b"
  WIOLA_TEST_BLAS=forced:Prescott train1 $(where "$t/a") > "$t/same.out" 2>&1 || fail "resume on Prescott failed"
  grep -q "resuming from .*step-00000004" "$t/same.out" || fail "the resume on Prescott did not resume"
  ! grep -q "note: the checkpoint was computed" "$t/same.out" || fail "a note on the same kernels"
  WIOLA_TEST_BLAS=library:Prescott train1 $(where "$t/b") > "$t/other.out" 2>&1 || fail "resume on other kernels failed"
  grep -Eq "^wiola train: note: the checkpoint was computed on SIMD [a-z0-9]+ and OpenBLAS's Prescott kernels, this run computes on [a-z0-9]+ and (SkylakeX|Haswell): it continues within float rounding, not bit for bit" \
    "$t/other.out" || fail "no note on other kernels: $(grep -i 'resum\|note' "$t/other.out")"
  note "same kernels: no note; other kernels: $(grep -o 'this run computes on [a-z0-9]* and [A-Za-z]*' "$t/other.out")"
}
case_refuse_reported_once() {
  # Every rank reads the manifest and meets the identity mismatch, and each
  # reports it ("rank 0: cannot resume...", "rank 1: cannot resume...", as
  # many as get to print before MPI_Abort); a setup error should be reported
  # once (dist/agree.h).
  STRICT_ONCE=1
  for i in 1 2 3; do
    refused "batch$i" "^(rank 0|wiola train: error): ${cannot}global_batch = 8 in the checkpoint, 4 in this run\\." \
      train2 --set train.grad_accum=1
  done
}
case_refuse_data_reordered() {
  # The same documents in another order: the same tokenizer, token and
  # document counts, but another content hash of the training split.
  "$python" - "$work/brown.txt" "$t/swapped.txt" <<'EOF'
import sys
docs = open(sys.argv[1]).read().split("\n\n")
docs[0], docs[1] = docs[1], docs[0]
open(sys.argv[2], "w").write("\n\n".join(docs))
EOF
  "$wiola" prep --no-progress --tokenizer "$root/data/wiola360m/tokenizer.json" --output "$t/shards" \
    "$t/swapped.txt" > /dev/null || fail "prep failed"
  refused reordered "^wiola train: error: ${cannot}data\\.train_xxh3 = \"[0-9a-f]{16}\" in the checkpoint, \"[0-9a-f]{16}\" in this run\\. These" \
    train1 --set "data.path=$t/shards/manifest.json"
}
case_hash_compat() {
  # The content hash is compared only where both sides record it: a
  # checkpoint written before it existed resumes on data that has it, and
  # data prepped before it resumes a checkpoint that has it; each run then
  # equals the uninterrupted one bit for bit. (The checkpoint is also one
  # from before data.documents: it counts as trained without documents.)
  after_step7 "$ref2" "$t/old_ckpt"
  for s in 2 4 6; do
    "$python" - "$(step_dir "$t/old_ckpt/ck" $s)/manifest.json" <<'EOF'
import json, sys
m = json.load(open(sys.argv[1]))
assert "data.train_xxh3" in m["identity"], "the checkpoint records no content hash"
del m["identity"]["data.train_xxh3"]
assert m["identity"].pop("data.documents") is False, "the checkpoint records no data.documents = false"
json.dump(m, open(sys.argv[1], "w"), indent=1)
EOF
  done
  # shellcheck disable=SC2046
  expect_ok old_ckpt train2 $(where "$t/old_ckpt")
  same_as_ref "$t/old_ckpt" "$ref2"
  cp -a "$shards" "$t/old_data"
  "$python" - "$t/old_data/manifest.json" <<'EOF'
import json, sys
m = json.load(open(sys.argv[1]))
for split in m["splits"].values():
    assert "xxh3" in split, "the data manifest records no content hash"
    del split["xxh3"]
    for sh in split["shards"]:
        del sh["xxh3"]
json.dump(m, open(sys.argv[1], "w"), indent=1)
EOF
  after_step7 "$ref2" "$t/old_data_run"
  # shellcheck disable=SC2046
  expect_ok old_data train2 $(where "$t/old_data_run") --set "data.path=$t/old_data/manifest.json"
  same_as_ref "$t/old_data_run" "$ref2"
  note "checkpoints and data without content hashes resume bit for bit"
}

# ---- a blend of two sources (docs/data.md): resume, layouts, refusals --------------
# shards and a second source with a val split (other.txt, 10 % held out) at
# 1:3. Resumed from step 4 it equals the uninterrupted run bit for bit; on
# dp=2 every step draws the same samples (the loader state of step 8 is
# equal) and the losses agree to 1e-5; validation uses the source that has a
# val split; a resume with other weights or without the blend is refused.
case_blend() {
  prep_val() {  # prep_val OUT TEXT: shards with 10 % of the documents held out for validation
    "$wiola" prep --no-progress --val-fraction 0.1 --tokenizer "$root/data/wiola360m/tokenizer.json" \
      --output "$1" "$2" > "$t/prep.log" 2>&1 || { cat "$t/prep.log"; fail "prep of $2 failed"; }
  }
  prep_val "$t/other" "$work/other.txt"
  local b=(--set 'data.path=""' --set "data.blend=[{path=\"$shards\", weight=1}, {path=\"$t/other\", weight=3}]"
           --set train.eval_every=4)
  # shellcheck disable=SC2046
  expect_ok full train1 $(where "$t/full") "${b[@]}"
  grep -q "source 2: $t/other/manifest.json, share 0.7500" "$t/full.out" || fail "no blend in the banner"
  grep -q "^wiola train: warning: validation leaves out blend source 1: .*split 'val' holds 0 tokens" "$t/full.err" ||
    fail "no warning that source 1 has no val split"
  "$python" - "$t/full" "$steps" <<'EOF2' || fail "the loader state or validation of step $steps"
import json, sys
d, n = sys.argv[1], int(sys.argv[2])
ld = json.load(open(f"{d}/ck/step-{n:08d}/manifest.json"))["loader"]
drawn = [c["drawn"] for c in ld["blend"]]
assert drawn == [16, 48], f"samples drawn {drawn}, expected [16, 48] (64 at 1:3)"
rows = [json.loads(l) for l in open(f"{d}/run/metrics.jsonl")]
assert [i for i, r in enumerate(rows) if "val_loss" in r] == [3, 7], "validation at steps 4 and 8 only"
for r in (rows[3], rows[7]):  # source 1 has no val split: the blend's loss is source 2's
    per = r["val_loss_sources"]
    assert per[0] is None and per[1] > 0, per
    assert abs(r["val_loss"] - per[1]) <= 1e-12 * per[1], (r["val_loss"], per)
EOF2
  # Killed after step 5: resume from step 4.
  mkdir -p "$t/res/ck" "$t/res/run"
  cp -a "$(step_dir "$t/full/ck" 4)" "$t/res/ck/"
  echo step-00000004 > "$t/res/ck/latest"
  head -n 4 "$t/full/run/metrics.jsonl" > "$t/res/run/metrics.jsonl"
  # shellcheck disable=SC2046
  expect_ok resume train1 $(where "$t/res") "${b[@]}"
  grep -q "resuming from .*/step-00000004" "$t/resume.out" || fail "did not resume from step 4"
  same_as_ref "$t/res" "$t/full"
  # dp=2: the same samples, the same losses up to summation order.
  # shellcheck disable=SC2046
  expect_ok dp2 train2 $(where "$t/dp2") "${b[@]}"
  "$python" - "$t/full" "$t/dp2" "$steps" <<'EOF2' || fail "dp=2 differs from one process"
import json, sys
ref, run, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
def rows(d): return [json.loads(l) for l in open(f"{d}/run/metrics.jsonl")]
a, b = rows(ref), rows(run)
assert len(a) == len(b) == n, (len(a), len(b))
worst = max(abs(x[k] - y[k]) / abs(x[k]) for x, y in zip(a, b) for k in ("loss", "val_loss") if x.get(k))
assert worst < 1e-5, f"worst loss difference {worst:.2e}"
m = lambda d: json.load(open(f"{d}/ck/step-{n:08d}/manifest.json"))["loader"]
assert m(ref) == m(run), (m(ref), m(run))
print(f"dp2: losses within {worst:.1e} of one process; the same loader state at step {n}")
EOF2
  # Two sources with val splits: each is evaluated on its own, and the blend's
  # val_loss is their share-weighted mean.
  prep_val "$t/one" "$work/brown.txt"
  expect_ok two_val timeout -k 5 "$limit" "$wiola" train --set model.preset=wiola-tiny --set model.vocab_size=32000 \
    --set train.micro_batch=2 --set train.threads=1 --set train.steps=2 --set train.eval_every=2 \
    --set train.run_dir="$t/two_val" \
    --set 'data.path=""' --set "data.blend=[{path=\"$t/one\", weight=1}, {path=\"$t/other\", weight=3}]"
  grep -q "| val [0-9.]* (1: [0-9.]*, 2: [0-9.]*)" "$t/two_val.out" || fail "no per-source validation in the log"
  "$python" - "$t/two_val" <<'EOF2' || fail "the blend's validation loss is not the share-weighted mean"
import json, sys
r = [json.loads(l) for l in open(f"{sys.argv[1]}/metrics.jsonl")][1]
a, b = r["val_loss_sources"]
assert a > 0 and b > 0 and a != b, (a, b)
assert abs(r["val_loss"] - (0.25 * a + 0.75 * b)) <= 1e-12 * r["val_loss"], (r["val_loss"], a, b)
print(f"validation: source 1 {a:.6f}, source 2 {b:.6f}, blend {r['val_loss']:.6f} = 0.25 a + 0.75 b")
EOF2
  # wiola eval --as-training reproduces one source's validation, not a blend's.
  expect_fail eval_as_training "--as-training reproduces the validation of one source" \
    "$wiola" eval --checkpoint "$t/full/ck" --data "$t/other" --as-training
  # No source with a val split: an error before any step.
  expect_fail noval "^wiola train: error: train.eval_every is set, but no source of data.blend has a usable \"val\" split" \
    train1 $(where "$t/noval") --set 'data.path=""' --set train.eval_every=4 \
    --set "data.blend=[{path=\"$shards\", weight=1}, {path=\"$work/shards_other\", weight=1}]"
  # What may not change on a resume: the shares, and the blend itself.
  REFUSED_FROM=$t/full refused weights "^wiola train: error: ${cannot}data\\.blend\\[0\\]\\.share = 0\\.25 in the checkpoint, 0\\.333+ in this run; data\\.blend\\[1\\]\\.share = 0\\.75 in the checkpoint, 0\\.666+7? in this run\\. These" \
    train1 --set 'data.path=""' --set "data.blend=[{path=\"$shards\", weight=1}, {path=\"$t/other\", weight=2}]"
  REFUSED_FROM=$t/full refused unblended "^wiola train: error: ${cannot}.*data\\.blend = \\[.*\\] in the checkpoint, \"\\(absent\\)\" in this run" \
    train1 --set "data.path=$shards"
}

# ---- loss spikes: rewind to the last checkpoint, skip the data window -----------------
# WIOLA_INJECT_LOSS_SPIKE=5 makes step 5's loss look 1000 times larger to the
# detection (train.spike_sigma over a window of 3 steps): the run rewinds to
# checkpoint 3 and skips the data of steps 4..5. It must then be, bit for bit,
# a run told to skip that window (train.skip_batches) from the start.
spike=(--set checkpoint.every=3 --set train.spike_sigma=3 --set train.spike_window=3)
# spike_same RUN REF: same final checkpoint (parameters and AdamW moments, bit
# for bit; `wiola ckpt diff` needs no h5py), the same step, tokens, skipped
# count, applied steps, loader state and skip list in its manifest, and
# metrics of steps 1..8 once each with the same losses.
spike_same() {
  "$wiola" ckpt diff --with-optimizer "$2/ck" "$1/ck" > "$t/diff.out" 2>&1 ||
    { cat "$t/diff.out" >&2; fail "the final checkpoint of $(basename "$1") differs from $(basename "$2")'s"; }
  "$python" - "$(step_dir "$1/ck" $steps)" "$(step_dir "$2/ck" $steps)" "$1/run" "$2/run" "$steps" <<'EOF2' ||
import json, sys
a, b = (json.load(open(f"{d}/manifest.json")) for d in sys.argv[1:3])
for k in ("step", "tokens", "skipped", "applied_steps", "loader"):
    assert a[k] == b[k], f"manifest {k}: {a[k]} vs {b[k]}"
assert a["spike"]["skip_batches"] == b["spike"]["skip_batches"] == [[4, 5]], (a["spike"], b["spike"])
n = int(sys.argv[5])
ra, rb = ([json.loads(l) for l in open(f"{d}/metrics.jsonl")] for d in sys.argv[3:5])
for rows in (ra, rb):
    assert [r["step"] for r in rows] == list(range(1, n + 1)), [r["step"] for r in rows]
for x, y in zip(ra, rb):
    assert x.get("loss") == y.get("loss") and x.get("grad_norm") == y.get("grad_norm"), (x["step"], x, y)
    assert x.get("data_skipped", False) == y.get("data_skipped", False) == (x["step"] in (4, 5)), x
print(f"manifests and metrics 1..{n} equal; steps 4, 5 skipped in both")
EOF2
    fail "manifest or metrics differ"
}
case_spike_rewind() {
  # shellcheck disable=SC2046
  WIOLA_INJECT_LOSS_SPIKE=5 expect_ok spike train1 $(where "$t/spike") "${spike[@]}"
  grep -q "^wiola train: loss spike: .* at step 5: rewinding to .*/step-00000003 (step 3) and skipping the data of steps 4\.\.5 (rewind 1 of at most 3)$" \
    "$t/spike.out" || { cat "$t/spike.out" >&2; fail "no rewind line"; }
  # shellcheck disable=SC2046
  expect_ok told train1 $(where "$t/told") "${spike[@]}" --set "train.skip_batches=[[4, 5]]"
  grep -q "rewinding" "$t/told.out" && fail "the run told to skip the window rewound"
  spike_same "$t/spike" "$t/told"
  # The rewind is recorded: metrics (step 4's record), manifest, config.toml.
  "$python" - "$t/spike" <<'EOF2' || fail "the rewind is not recorded"
import json, sys
d = sys.argv[1]
rows = [json.loads(l) for l in open(f"{d}/run/metrics.jsonl")]
rw = [r for r in rows if "rewind" in r]
assert len(rw) == 1 and rw[0]["step"] == 4, rw
e = rw[0]["rewind"]
assert e["detected_at"] == 5 and e["checkpoint_step"] == 3 and e["window"] == [4, 5] and e["rewinds"] == 1, e
sp = json.load(open(f"{d}/ck/step-00000008/manifest.json"))["spike"]
assert sp["rewinds"] == 1 and sp["skip_batches"] == [[4, 5]], sp
assert "skip_batches = [[4, 5]]" in open(f"{d}/run/config.toml").read()
print("rewind recorded:", e)
EOF2
}
case_spike_resume() {
  # The rewind in a run that stops at step 6 (train.max_steps); the resume
  # continues with the manifest's skip list and ends where the told run does.
  # shellcheck disable=SC2046
  WIOLA_INJECT_LOSS_SPIKE=5 expect_ok part train1 $(where "$t/run") "${spike[@]}" --set train.max_steps=6
  grep -q "rewinding to .*(step 3)" "$t/part.out" || fail "no rewind in the first part"
  # shellcheck disable=SC2046
  expect_ok rest train1 $(where "$t/run") "${spike[@]}"
  grep -q "^wiola train: resuming from .*step-00000006" "$t/rest.out" || fail "the second part did not resume"
  grep -q "skip_batches = \[\[4, 5\]\]" "$t/run/run/config.toml" || fail "the resume lost the skip list"
  # shellcheck disable=SC2046
  expect_ok told train1 $(where "$t/told") "${spike[@]}" --set "train.skip_batches=[[4, 5]]"
  spike_same "$t/run" "$t/told"
}
case_spike_rewind_mpirun() {
  # The same on 2 ranks (dp=2): rank 0's decision, the rewind collective.
  # shellcheck disable=SC2046
  WIOLA_INJECT_LOSS_SPIKE=5 expect_ok spike train2 $(where "$t/spike") "${spike[@]}"
  grep -q "rewinding to .*(step 3) and skipping the data of steps 4\.\.5" "$t/spike.out" || fail "no rewind line"
  # shellcheck disable=SC2046
  expect_ok told train2 $(where "$t/told") "${spike[@]}" --set "train.skip_batches=[[4, 5]]"
  spike_same "$t/spike" "$t/told"
}
case_spike_refusals() {
  # shellcheck disable=SC2046
  WIOLA_INJECT_LOSS_SPIKE=5 expect_fail nockpt "^wiola train: error: loss spike: .* at step 5: no checkpoint in .* to rewind to" \
    train1 $(where "$t/nockpt") "${spike[@]}" --set checkpoint.every=0
  # shellcheck disable=SC2046
  WIOLA_INJECT_LOSS_SPIKE=5 expect_fail norewind "at step 5: not rewinding again, 0 rewinds made already \(train.spike_max_rewinds = 0\)" \
    train1 $(where "$t/norewind") "${spike[@]}" --set train.spike_max_rewinds=0
  # Skipped steps: lr 1e30 breaks the model at step 1, every later step is
  # skipped (non-finite gradient norm); 2 in a row rewind, 3 times, then stop.
  # shellcheck disable=SC2046
  expect_fail nonfinite "2 consecutive skipped steps \(train.spike_skipped = 2\) at step 6: not rewinding again, 3 rewinds made already" \
    train1 $(where "$t/nonfinite") --set checkpoint.every=2 --set train.spike_skipped=2 --set train.lr_max=1e30 --set train.clip=0
  [ "$(grep -c "^wiola train: 2 consecutive skipped steps .* rewinding to" "$t/nonfinite.out")" -eq 3 ] ||
    fail "expected 3 rewinds before the error"
  expect_fail nodir "train.spike_sigma / train.spike_skipped rewind to a checkpoint: set checkpoint.dir" \
    train1 --set "train.run_dir=$t/nodir" --set train.spike_sigma=3
  # shellcheck disable=SC2046
  expect_fail unsorted "train.skip_batches: window 2 \[2, 3\] must start after window 1 ends" \
    train1 $(where "$t/unsorted") --set "train.skip_batches=[[4, 5], [2, 3]]"
  # shellcheck disable=SC2046
  expect_fail badpair "train.skip_batches: window 1 of 1: expected \[from, to\], two integers" \
    train1 $(where "$t/badpair") --set "train.skip_batches=[[4]]"
}

# ---- WSD schedules: extending and branching a run (docs/model.md §4) -------------
# steps 1..2 warmup, stable to T_max - round(0.2 T_max): 8 steps decay from 6, 16 from 13.
wsd=(--set train.lr_schedule=wsd --set train.warmup=2 --set checkpoint.every=4)
case_wsd_extend() {
  # A run of 8 steps stopped at step 4 (stable), extended to 16: steps 5..8
  # equal bit for bit a run told 16 from the start (the old decay began at 6).
  # shellcheck disable=SC2046
  expect_ok short train1 $(where "$t/ext") "${wsd[@]}" --set train.max_steps=4
  # shellcheck disable=SC2046
  expect_ok extended train1 $(where "$t/ext") "${wsd[@]}" --set train.steps=16 --set train.max_steps=8
  grep -q "resuming from .*/step-00000004" "$t/extended.out" || fail "did not resume from step 4"
  # shellcheck disable=SC2046
  expect_ok long train1 $(where "$t/long") "${wsd[@]}" --set train.steps=16 --set train.max_steps=8
  same_as_ref "$t/ext" "$t/long"
  "$python" - "$t/ext/run" "$t/long/run" <<'EOF2' || fail "the learning rates differ"
import json, sys
a, b = ([json.loads(l)["lr"] for l in open(f"{d}/metrics.jsonl")] for d in sys.argv[1:])
assert a == b and a[1] == a[7] == 3e-4 and a[0] == 1.5e-4, (a, b)
EOF2
  # A decay branched off the stable checkpoint at step 4 into its own folders
  # (steps 5..6), and one that would have begun before it: refused naming the keys.
  mkdir -p "$t/branch/ck" "$t/early/ck"
  cp -a "$(step_dir "$t/ext/ck" 4)" "$t/branch/ck/"
  cp -a "$(step_dir "$t/ext/ck" 4)" "$t/early/ck/"
  # shellcheck disable=SC2046
  expect_ok branch train1 $(where "$t/branch") "${wsd[@]}" --set train.steps=6 --set train.decay_steps=2
  "$python" - "$t/branch/run" <<'EOF2' || fail "the branch did not decay over steps 5..6"
import json, sys
rows = [json.loads(l) for l in open(f"{sys.argv[1]}/metrics.jsonl")]
assert [r["step"] for r in rows] == [5, 6] and 0 < rows[0]["lr"] < 3e-4 and rows[1]["lr"] == 0, rows
EOF2
  # shellcheck disable=SC2046
  expect_fail early "cannot resume from .*step-00000004': the learning rate at step 4 would jump from 0.0003 to .*T_max \(train.steps / train.tokens\) 8 -> 6.*the decay's start \(train.decay_steps / train.decay_share\) step 6 -> 3" \
    train1 $(where "$t/early") "${wsd[@]}" --set train.steps=6 --set train.decay_steps=3
  one_error "$t/early.err"
}

# ---- data stages: other shares from a step on (docs/data.md) -------------------
# Two sources at 1:1 for steps 1..3, then an anneal on source 2 alone with a
# WSD decay over the same steps: one config, the optimizer state kept.
stages=(--set 'data.path=""' --set "data.blend=[{path=\"$shards\", weight=1}, {path=\"$work/shards_other\", weight=1}]"
        --set 'data.stages=[{from=4, weights=[0, 1]}]' --set train.lr_schedule=wsd --set train.decay_steps=5)
case_stages() {
  # shellcheck disable=SC2046
  expect_ok full train1 $(where "$t/full") "${stages[@]}"
  grep -q "data stage 1 from step 4: weights 0 1" "$t/full.out" || fail "no stage in the banner"
  "$python" - "$t/full" "$steps" <<'EOF2' || fail "the stages' samples or metrics"
import json, sys
d, n = sys.argv[1], int(sys.argv[2])
rows = [json.loads(l) for l in open(f"{d}/run/metrics.jsonl")]
assert [r["data_stage"] for r in rows] == [0, 0, 0, 1, 1, 1, 1, 1], [r.get("data_stage") for r in rows]
assert rows[2]["lr"] == 3e-4 > rows[3]["lr"] > rows[6]["lr"] > rows[7]["lr"] == 0, [r["lr"] for r in rows]
drawn = lambda s: [c["drawn"] for c in json.load(open(f"{d}/ck/step-{s:08d}/manifest.json"))["loader"]["blend"]]
assert drawn(2) == [8, 8] and drawn(4) == [12, 20] and drawn(n) == [12, 52], (drawn(2), drawn(4), drawn(n))
EOF2
  # Killed inside either stage: resumed from step 2 (stage 0) and step 6 (stage 1).
  local s
  for s in 2 6; do
    mkdir -p "$t/res$s/ck" "$t/res$s/run"
    cp -a "$(step_dir "$t/full/ck" $s)" "$t/res$s/ck/"
    head -n $s "$t/full/run/metrics.jsonl" > "$t/res$s/run/metrics.jsonl"
    # shellcheck disable=SC2046
    expect_ok "resume$s" train1 $(where "$t/res$s") "${stages[@]}"
    grep -q "resuming from .*/step-0000000$s" "$t/resume$s.out" || fail "did not resume from step $s"
    same_as_ref "$t/res$s" "$t/full"
  done
  # The same from step 6 on pp2 x dp2 (4 ranks, resharded; CI runs at most 4
  # ranks: tp2 x pp2 x dp2 is LAYOUT=tp2pp2dp2 NP=8): the same samples, the
  # same losses up to summation order.
  local lay=${LAYOUT:-pp2dp2} np=${NP:-4}
  local par=(--set parallel.pp=2)
  [ "$lay" = tp2pp2dp2 ] && par+=(--set parallel.tp=2)
  mkdir -p "$t/$lay/ck"
  cp -a "$(step_dir "$t/full/ck" 6)" "$t/$lay/ck/"
  # shellcheck disable=SC2046
  expect_ok "$lay" timeout -k 5 "$limit" "$mpiexec" -n "$np" --bind-to none "$wiola" train "${common[@]}" "${dp2[@]}" \
    "${par[@]}" $(where "$t/$lay") "${stages[@]}"
  "$python" - "$t/full" "$t/$lay" "$steps" <<'EOF2' || fail "$lay differs from one process"
import json, sys
ref, run, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
a, b = ([json.loads(l) for l in open(f"{d}/run/metrics.jsonl")] for d in (ref, run))
assert [r["step"] for r in b] == list(range(7, n + 1)), [r["step"] for r in b]
worst = max(abs(x["loss"] - y["loss"]) / x["loss"] for x, y in zip(a[6:], b))
assert worst < 1e-5, f"worst loss difference {worst:.2e}"
m = lambda d: json.load(open(f"{d}/ck/step-{n:08d}/manifest.json"))["loader"]
assert m(ref) == m(run), (m(ref), m(run))
EOF2
  # A stage may be added or changed after the checkpoint's step, not at or before it.
  REFUSED_FROM=$t/full refused moved "^wiola train: error: ${cannot}data.stages that began by its step 8 differ: \[\{\"from\":4,\"weights\":\[0.0,1.0\]\}\] in the checkpoint, \[\{\"from\":5," \
    train1 "${stages[@]}" --set 'data.stages=[{from=5, weights=[0, 1]}]' --set train.decay_steps=4
}

fn=case_$what
declare -F "$fn" > /dev/null || { echo "ckpt_tests.sh: unknown case '$what'" >&2; exit 2; }
start=$SECONDS
"$fn"
echo "OK: $what ($((SECONDS - start)) s)"
# The case's checkpoints are big (30 MB each): kept only when it fails.
trap - EXIT
unmount_under "$t"
[ "$(findmnt -rn -o TARGET | grep -cF "$t")" -eq 0 ] && rm -rf "$t"
exit 0
