#!/usr/bin/env bash
# The GEMM choices recorded and checked on resume (ctest emu.gemm_record_resume;
# train/gemm_record.h), on the CUDA emulator with train.cuda_gemm = auto
# (its cuBLASLt stand-in's candidates are swept and timed like a GPU's):
#  1. one step with a checkpoint: the manifest's "gemm" and report.json's
#     backend.gemm record mode auto, the table's device key and a choice per
#     swept GEMM shape, and the tuning table a resume adopts;
#  2. resumed in another run folder (no gemm_tuning.json cache there): no
#     warning, and the resumed run uses the checkpoint's choices (its report
#     records the same ones: a sweep of its own could pick others, the
#     candidates' times being the CPU's);
#  3. a checkpoint whose record names another card's table: resumed with a
#     warning naming the table key;
#  4. resumed with train.cuda_gemm = cublas: a warning naming the mode.
#
#   gemm_record_resume.sh WIOLA_EMU SHARDS WORK
set -euo pipefail
emu=$1; shards=$2; work=$3
py=${WIOLA_PYTHON:-python3}
rm -rf "${work:?}"; mkdir -p "$work"
common=(--set model.preset=wiola-tiny --set model.vocab_size=32000 --set train.micro_batch=2
        --set train.grad_accum=1 --set train.steps=2 --set train.threads=1
        --set "data.path=$shards/manifest.json" --set train.backend=cuda-fp32 -q)
warning="the resumed checkpoint's GEMMs ran other algorithms"

"$emu" train "${common[@]}" --set train.cuda_gemm=auto --set "checkpoint.dir=$work/ck" --set checkpoint.every=1 \
  --set train.max_steps=1 --set "train.run_dir=$work/run1"
mf=$work/ck/step-00000001/manifest.json
"$py" - "$mf" "$work/run1/report.json" <<'PY'
import json, sys
g = json.load(open(sys.argv[1]))["gemm"]
assert g["mode"] == "auto", g["mode"]
assert g["table_device"] and g["tuning"]["tables"][0]["device"] == g["table_device"], g["table_device"]
assert g["choices"], "no GEMM shape recorded"
assert all(v == "cublas" or v.startswith("cublaslt ") for v in g["choices"].values()), g["choices"]
r = json.load(open(sys.argv[2]))["backend"]["gemm"]
assert r["choices"] == g["choices"] and r["table_device"] == g["table_device"], "report and manifest differ"
print(f"gemm record: {len(g['choices'])} shapes on {g['table_device']}")
PY

resume() {  # resume a copy of the checkpoint in a fresh run folder; stderr to $work/$1.err
  local name=$1; shift
  rm -rf "${work:?}/ck_$name"; cp -a "$work/ck" "$work/ck_$name"
  [ -z "${TAMPER:-}" ] || "$py" -c "$TAMPER" "$work/ck_$name/step-00000001/manifest.json"
  "$emu" train "${common[@]}" --set "checkpoint.dir=$work/ck_$name" --set "train.run_dir=$work/$name" "$@" \
    2> >(tee "$work/$name.err" >&2)
}

resume same --set train.cuda_gemm=auto
if grep -q "$warning" "$work/same.err"; then echo "a resume with the same choices warned"; exit 1; fi
"$py" - "$mf" "$work/same/report.json" <<'PY'
import json, sys
g = json.load(open(sys.argv[1]))["gemm"]
r = json.load(open(sys.argv[2]))["backend"]["gemm"]
assert r["choices"] == g["choices"], f"the resumed run used other choices: {r['choices']} vs {g['choices']}"
PY

TAMPER='
import json, sys
p = sys.argv[1]; m = json.load(open(p)); g = m["gemm"]
g["table_device"] = g["tuning"]["tables"][0]["device"] = "Other GPU, sm_00, cuBLASLt 1"
json.dump(m, open(p, "w"))' resume other_card --set train.cuda_gemm=auto
grep -q "$warning.*Other GPU, sm_00" "$work/other_card.err" || { echo "no warning for another card's table"; exit 1; }

resume cublas --set train.cuda_gemm=cublas
grep -q "$warning.*mode auto then, cublas now" "$work/cublas.err" || { echo "no warning for another mode"; exit 1; }
echo "gemm_record_resume: OK"
