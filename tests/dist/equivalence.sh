#!/usr/bin/env bash
# Layout equivalence (docs/model.md §5, issue 4): a 10-step run of a small
# Wiola with ATM active (τ = 0.7: about a third of the pairs merge in layer 2, half in
# layer 3) under a process layout must match the single-process run: every
# loss and every final parameter tensor within 1e-5 relative
# (compare_runs.py), and identical ATM merge decisions at the dumped step.
#
#   equivalence.sh setup WIOLA WORK           tokenize a Brown slice, run the
#                                             single-process reference
#   equivalence.sh setup_ref WIOLA WORK NAME [--set ...]
#                                             another single-process reference
#                                             (a model with more layers: the
#                                             chunked schedules' runs); REF=NAME
#                                             compares run and reshard with it
#   equivalence.sh run WIOLA WORK NAME NP [--set ...]
#                                             run NAME on NP ranks and compare
#                                             (EXACT_VS=REF: also bit for bit
#                                             against run REF;
#                                             EXPECT_BLAS_CHOSEN_BY: who chose
#                                             its BLAS kernels, report.json)
#   equivalence.sh resume WIOLA WORK NAME NP [--set ...]
#                                             (docs/checkpoints.md) the layout
#                                             of run NAME: 5 steps with
#                                             checkpoints every 2, stop, resume
#                                             to step 10; bit for bit equal to
#                                             run NAME (uninterrupted)
#   equivalence.sh resume_packed WIOLA WORK NAME NP [--set ...]
#                                             as resume, but the first 5 steps
#                                             lay the parameters out packed
#                                             (WIOLA_PARAM_ALIGN=1: the layout
#                                             before tensors were aligned):
#                                             its checkpoint continues aligned
#                                             bit for bit like run NAME
#   equivalence.sh reshard WIOLA WORK NAME NP1 [--set ...] -- NP2 [--set ...]
#                                             5 steps on layout 1, resume on
#                                             layout 2: within 1e-5 of the
#                                             single-process run
# TOL, TOL_TENSOR, ATM_FLIPS: the bounds against the single-process run
# (default 1e-5, 1e-4 and no differing ATM decision; compare_runs.py); bf16
# runs are compared with wider ones.
# A passing test deletes its dump and checkpoints (50-80 MB each: the suite
# would leave over 5 GB here) unless KEEP=1, which CMake sets on a run that a
# later test reads (wiola_equiv_reads), or WIOLA_TEST_KEEP=1; a failing test
# leaves everything for inspection.
set -euo pipefail
mode=$1; wiola=$2; work=$3; shift 3
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
python=${WIOLA_PYTHON:-/usr/bin/python3}
tols=(--tol "${TOL:-1e-5}" --tol-tensor "${TOL_TENSOR:-1e-4}" --atm-flips "${ATM_FLIPS:-0}")
common=(--set model.preset=wiola-tiny --set model.vocab_size=32000 --set model.atm_tau=0.7
        --set train.micro_batch=2 --set train.grad_accum=4 --set train.steps=10
        --set train.lr_max=1e-3 --set train.threads=1 --set "data.path=$work/shards/manifest.json" -q)
# The references score the task at steps 5 and 10; a layout given --tasks
# too, and compare_runs.py holds its scores to theirs.
tasks=(--set "train.eval_tasks=[\"$work/tasks.jsonl\"]" --set train.eval_tasks_every=5)
args=()
for x in "$@"; do if [ "$x" = --tasks ]; then args+=("${tasks[@]}"); else args+=("$x"); fi; done
set -- "${args[@]}"
if [ "$mode" = setup ]; then
  rm -rf "$work"; mkdir -p "$work"
  xz -dc "$root/data/brown/brown.txt.xz" > "$work/full.txt"
  head -c 300000 "$work/full.txt" > "$work/brown.txt"; rm "$work/full.txt"
  "$wiola" prep --no-progress --tokenizer "$root/data/wiola360m/tokenizer.json" \
    --output "$work/shards" "$work/brown.txt" > "$work/prep.log"
  # Short documents for the runs with data.documents (docs/model.md §2
  # "Documents"; the 8-layer runs): one per line, every third cut to four
  # words, every seventh only "<eos>" (an EOS-only document: --parse-special).
  awk '{ if (NR % 7 == 0) print "<eos>"; else if (NR % 3 == 0) print $1, $2, $3, $4; else print; print "" }' \
    "$work/brown.txt" > "$work/docs.txt"
  "$wiola" prep --no-progress --parse-special --tokenizer "$root/data/wiola360m/tokenizer.json" \
    --output "$work/docs_shards" "$work/docs.txt" > "$work/prep_docs.log"
  # A small multiple-choice task (docs/inference.md "Downstream tasks") for
  # the runs given --tasks: 8 lines of the text, each its first 8 words and
  # three 4-word continuations, its own among them.
  "$python" - "$work/brown.txt" "$work/tasks.jsonl" <<'PY'
import json, sys
lines = [l.split() for l in open(sys.argv[1], encoding="utf-8") if len(l.split()) >= 12][:10]
with open(sys.argv[2], "w", encoding="utf-8") as f:
    for i in range(8):
        conts = [" ".join(lines[(i + k) % 10][8:12]) for k in range(3)]
        gold = i % 3
        conts[0], conts[gold] = conts[gold], conts[0]
        f.write(json.dumps({"task": "brown", "context": " ".join(lines[i][:8]), "choices": conts, "gold": gold}) + "\n")
PY
  "$wiola" train "${common[@]}" "${tasks[@]}" --set "train.run_dir=$work/single" --dump-step "10:$work/single.h5"
  exit 0
fi
if [ "$mode" = setup_ref ]; then
  name=$1; shift
  rm -rf "${work:?}/$name" "$work/$name.h5"
  "$wiola" train "${common[@]}" "${tasks[@]}" "$@" --set "train.run_dir=$work/$name" --dump-step "10:$work/$name.h5"
  exit 0
fi
ref=${REF:-single}
drop_passed() { [ -n "${KEEP:-}${WIOLA_TEST_KEEP:-}" ] || rm -rf "$@"; }
mpirun_() { "${MPIEXEC:-mpiexec}" -n "$1" --bind-to none "$wiola" train "${common[@]}" "${@:2}"; }
if [ "$mode" = resume ] || [ "$mode" = resume_packed ] || [ "$mode" = reshard ]; then
  name=$1; np1=$2; shift 2
  first=(); second=()
  while [ $# -gt 0 ] && [ "$1" != -- ]; do first+=("$1"); shift; done
  np2=$np1; second=("${first[@]}")
  if [ "$mode" = reshard ]; then shift; np2=$1; shift; second=("$@"); fi
  out="$work/ckpt_$name"
  # resume_packed: the first part writes its checkpoints from the packed layout.
  if [ "$mode" = resume_packed ]; then out="$work/ckpt_packed_$name"; export WIOLA_PARAM_ALIGN=1; fi
  rm -rf "$out" "$out.h5"
  where=(--set "train.run_dir=$out" --set "checkpoint.dir=$out/ck")
  mpirun_ "$np1" "${first[@]}" "${where[@]}" --set train.max_steps=5 --set checkpoint.every=2
  unset WIOLA_PARAM_ALIGN
  cp "$out/report.json" "$out/report_part1.json"
  ls "$out/ck"
  mpirun_ "$np2" "${second[@]}" "${where[@]}" --dump-step "10:$out.h5"
  if [ "$mode" = resume_packed ]; then  # the first part really had no padding
    "$python" - "$out/report_part1.json" "$out/report.json" <<'PY'
import json, sys
packed, aligned = ([m["grads"] for m in json.load(open(f))["memory_mib_per_rank"]] for f in sys.argv[1:])
print("gradient buffers per rank (MiB): packed", packed, "aligned", aligned)
assert all(p < a for p, a in zip(packed, aligned)), "the first part's buffers are not the packed layout's"
PY
  fi
  if [ "$mode" = resume ] || [ "$mode" = resume_packed ]; then
    "$python" "$here/compare_runs.py" --exact "$work/$name" "$work/$name.h5" "$out" "$out.h5"
  else
    "$python" "$here/compare_runs.py" "${tols[@]}" "$work/$ref" "$work/$ref.h5" "$out" "$out.h5"
  fi
  drop_passed "$out/ck" "$out.h5"
  exit 0
fi
name=$1; np=$2; shift 2
rm -rf "${work:?}/$name" "$work/$name.h5"
"${MPIEXEC:-mpiexec}" -n "$np" --bind-to none "$wiola" train "${common[@]}" "$@" \
  --set "train.run_dir=$work/$name" --dump-step "10:$work/$name.h5"
"$python" "$here/compare_runs.py" "${tols[@]}" "$work/$ref" "$work/$ref.h5" "$work/$name" "$work/$name.h5"
# EXPECT_BLAS_CHOSEN_BY: who chose the run's BLAS kernels (report.json).
if [ -n "${EXPECT_BLAS_CHOSEN_BY:-}" ]; then
  "$python" - "$work/$name/report.json" "$EXPECT_BLAS_CHOSEN_BY" <<'PY'
import json, sys
blas = json.load(open(sys.argv[1]))["backend"]["blas"]
print("BLAS:", blas["summary"])
assert blas["chosen_by"] == sys.argv[2], blas
PY
fi
# EXACT_VS=REF: also bit for bit against the run REF of the same layout (a
# run on another backend: cpu-opaque must compute exactly what cpu does).
if [ -n "${EXACT_VS:-}" ]; then
  "$python" "$here/compare_runs.py" --exact "$work/$EXACT_VS" "$work/$EXACT_VS.h5" "$work/$name" "$work/$name.h5"
fi
drop_passed "$work/$name.h5"
