#!/usr/bin/env bash
# The kernel benchmark's cuDNN section (bench/cudnn_sdpa.h) on the CUDA
# emulator (ctest kernel_bench_cudnn_emu): `--only cudnn` must exit 0 with
# one skipped row that says why (the emulator cannot run cuDNN's kernels; and
# whether libcudnn.so.9 loaded here, and then that the frontend validates the
# forward and backward graphs for an H100 without a GPU; or why it did not
# load, or that the reference was not built),
# the same line on stdout, and nothing timed; then `--append` (the kit's
# second process) adds its row to the same file without a second meta line.
# usage: kernel_bench_cudnn_emu.sh <wiola_kernel_bench_emu> <python> <work dir>
set -euo pipefail
bench=$1 py=$2 dir=$3
mkdir -p "$dir"
rm -f "$dir/cudnn.jsonl" "$dir/cudnn.out"
"$bench" --small --only cudnn --json "$dir/cudnn.jsonl" | tee "$dir/cudnn.out"
grep -qE "^attention cudnn +causal .*: skipped: the CUDA emulator cannot run cuDNN's kernels \((libcudnn\.so\.9 loads \(cuDNN [0-9]+\.[0-9]+\.[0-9]+\); its graphs at the check and timed shapes validate for sm_90|cuDNN reference: cannot load libcudnn\.so\.9 .*|cuDNN reference: not built: no cudnn_frontend headers)\)$" \
  "$dir/cudnn.out" || { echo "kernel_bench_cudnn_emu: no skip line on stdout"; exit 1; }
"$bench" --small --only cudnn --json "$dir/cudnn.jsonl" --append > /dev/null
"$py" - "$dir/cudnn.jsonl" <<'PY'
import json, sys
rows = [json.loads(line) for line in open(sys.argv[1])]
assert [r["section"] for r in rows].count("meta") == 1 and rows[0]["section"] == "meta", rows
cudnn = rows[1:]
assert len(cudnn) == 2, f"{len(cudnn)} cuDNN rows after two runs (one each): {cudnn}"
for r in cudnn:
    assert r["name"] == "attention cudnn causal" and r["variant"] == "cudnn" and r["section"] == "attention", r
    assert r["skipped"] is True and r["ok"] is False and "ms" not in r and "tflops" not in r, r
    assert r["message"].startswith("the CUDA emulator cannot run cuDNN's kernels"), r
    assert (r["B"], r["T"], r["H"], r["Hkv"]) == (2, 64, 4, 2), r
print(f"kernel_bench_cudnn_emu: ok (skipped: {cudnn[0]['message']})")
PY
