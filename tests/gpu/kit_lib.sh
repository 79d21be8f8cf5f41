# Sourced by the kit's end-to-end checks (kit_train.sh, kit_multi.sh): where
# `wiola` and the launcher come from, the data, and the figures every check
# records. The caller sets $work (a scratch folder) before sourcing, and may
# set KIT_BIN (a wiola built elsewhere, e.g. the emulator's wiola_emu) and
# MPIEXEC (a launcher other than the kit's mpirun).
if [ -z "${KIT_BIN:-}" ]; then
  . tests/gpu/kit_env.sh
  w=$kit_bin/wiola
  mpirun_bin=${MPIEXEC:-$kit_bin/mpirun}
else
  w=$KIT_BIN
  mpirun_bin=${MPIEXEC:-mpiexec}
  OUT=${OUT:-/tmp/wiola-out}; mkdir -p "$OUT"
fi
py=${WIOLA_PYTHON:-$(command -v python3)}
# KIT_ATTENTION (kit_session.sh sets rows when the tensor-core attention
# failed its tests): the backend option of every run.
kit_sets=()
[ -n "${KIT_ATTENTION:-}" ] && kit_sets=(--set "train.cuda_attention=$KIT_ATTENTION")
results=$work/results.jsonl
: > "$results"

# Each check's line says how long it took (since the previous record), so that
# a session sees where its device time went.
record_since=$SECONDS
record() {  # record NAME OK(0|1) JSON-FIGURES
  echo "{\"check\": \"$1\", \"ok\": $([ "$2" = 1 ] && echo true || echo false), \"figures\": $3}" >> "$results"
  echo "== $1: $([ "$2" = 1 ] && echo PASS || echo FAIL) ($((SECONDS - record_since)) s) $3"
  record_since=$SECONDS
}

# $1 bytes of Brown (0: all of it) tokenized into $2 (default $work/shards).
prep_brown() {
  local bytes=$1 dir=${2:-$work/shards}
  [ "$bytes" = 0 ] && bytes=1000000000
  echo "== data: $1 bytes of Brown (0: all), wiola prep into $dir"
  { xz -dc data/brown/brown.txt.xz 2>/dev/null ||
    "$py" -c 'import lzma,sys; sys.stdout.buffer.write(lzma.open("data/brown/brown.txt.xz").read())'; } |
    head -c "$bytes" > "$work/brown.txt"
  "$w" prep --no-progress --tokenizer data/wiola360m/tokenizer.json --output "$dir" "$work/brown.txt" | tail -2
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
# (with "identical") the same losses, else within $3 (default 1e-5).
losses_ok() {
  "$py" -c 'import json,sys; d=json.loads(sys.argv[1]); ok=d.get("same_steps") and (d["identical"] if sys.argv[2] == "identical" else d["worst_loss_rel"] < float(sys.argv[3]))
sys.exit(0 if ok else 1)' "$1" "$2" "${3:-1e-5}"
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

# Writes $1 (JSON: passed, failed, every check) from the recorded checks and
# prints the tally as "NAME: N of M checks passed"; exit 1 if one failed.
summarise() {  # summarise OUT.json NAME
  "$py" - "$results" "$1" "$2" <<'PY'
import json, sys
checks = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
out = {"passed": sum(c["ok"] for c in checks), "failed": [c["check"] for c in checks if not c["ok"]], "checks": checks}
json.dump(out, open(sys.argv[2], "w"), indent=1)
print(f"{sys.argv[3]}: {out['passed']} of {len(checks)} checks passed" + (f"; failed: {', '.join(out['failed'])}" if out["failed"] else ""))
sys.exit(1 if out["failed"] or not checks else 0)
PY
}
