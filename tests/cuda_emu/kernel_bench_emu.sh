#!/usr/bin/env bash
# The GPU kit's kernel benchmark on the CUDA emulator (ctest kernel_bench_emu):
# bench/kernel_bench.cpp with --small, then its JSON lines checked: each one
# valid JSON; every attention variant present (the fa2 forward and backward at
# each tile shape among them, the forward also with 2 and 4 heads of a KV group
# a block), checked against the CPU and timed (ok, a positive time,
# its errors within their bounds), or skipped with the message of the refused
# switch value (here 4 heads a block: --small has 2 query heads a KV group); the documents row
# (forward + backward, causal against packed documents: checked, both timed, the tile count's
# expected ratio); every GEMM (aligned and
# misaligned), merged-projection comparison and memory-bound op ok with a
# positive time; the cuDNN
# reference one skipped row (kernel_bench_cudnn_emu.sh checks it); then --preset
# wiola-1.5b (d_h 128) in its tiny form, memory-bound ops only.
# usage: kernel_bench_emu.sh <wiola_kernel_bench_emu> <python> <work dir>
set -euo pipefail
bench=$1 py=$2 dir=$3
mkdir -p "$dir"
rm -f "$dir/kernels.jsonl"
rm -f "$dir/tuning.json"
"$bench" --small --json "$dir/kernels.jsonl" --write-tuning "$dir/tuning.json"
"$py" - "$dir/kernels.jsonl" "$dir/tuning.json" <<'PY'
import json, sys
rows = []
for n, line in enumerate(open(sys.argv[1]), 1):
    try:
        rows.append(json.loads(line))
    except ValueError as e:
        sys.exit(f"line {n} is not JSON ({e}): {line!r}")
assert rows and rows[0]["section"] == "meta", "the first line is not the meta line"
by_name = {r["name"]: r for r in rows[1:]}
assert len(by_name) == len(rows) - 1, "a result name appears twice"
required = [f"attention {v} {layer}" for layer in ("causal", "atm")
            for v in ("fwd tc", "fwd fa2", "fwd fa2 64x128", "fwd fa2 128x64", "fwd fa2 128x128", "fwd rows",
                      "fwd fa2 hp2", "fwd fa2 hp4", "fwd fa2 64x128 hp2", "fwd fa2 64x128 hp4",
                      "fwd fa2 128x64 hp2", "fwd fa2 128x64 hp4", "fwd fa2 128x128 hp2", "fwd fa2 128x128 hp4",
                      "bwd v1", "bwd v2", "bwd fa2", "bwd fa2 64x128", "bwd fa2 128x64", "bwd fa2 128x128",
                      "bwd rows")]
required += ["attention documents"]
required += ["gemm step total", "gemm step total misaligned"]
required += [f"gemm merge {c} {d}" for c in ("ctx k|v", "dsff up") for d in ("fwd", "bwd data", "bwd weight")]
required += ["rmsnorm_fwd", "add_rmsnorm_fwd", "rmsnorm_bwd", "add", "swiglu_fwd", "gelu_fwd", "srpe_split_fwd",
             "srpe_split_bwd", "adamw", "convert f32->bf16"]
missing = [n for n in required if n not in by_name]
assert not missing, f"missing results: {missing}"
for r in rows[1:]:
    if r["section"] == "gemm merge":  # both forms checked against each other, then timed
        assert r["check"]["max_rel"] < r["check"]["tol"] and r["merged_ms"] > 0 and r["separate_ms"] > 0, r
        assert ("merged_copies_ms" in r) == r["name"].startswith("gemm merge dsff"), r
timed = skipped = 0
for r in rows[1:]:
    if r["section"] == "gemm tuning":  # checked below
        continue
    if r.get("skipped"):
        assert r["section"] == "attention" and r.get("message"), f"skipped without a message: {r}"
        skipped += 1
        continue
    assert r.get("ok") is True, f"not ok: {r}"
    assert r.get("ms", 0) > 0, f"no positive time: {r}"
    if r["section"] == "attention":
        assert r["tflops"] > 0 and all(e < r["check"]["tol"][k] for k, e in r["check"]["max_rel"].items()), r
    timed += 1
for v in ("fwd tc", "fwd fa2 64x128", "fwd fa2 128x64", "fwd fa2 128x128", "fwd rows", "bwd v1", "bwd v2",
          "bwd fa2 64x128", "bwd fa2 128x64", "bwd fa2 128x128", "bwd rows", "fwd fa2 hp2", "fwd fa2 64x128 hp2",
          "fwd fa2 128x64 hp2", "fwd fa2 128x128 hp2"):
    for layer in ("causal", "atm"):
        assert not by_name[f"attention {v} {layer}"].get("skipped"), f"{v} {layer} skipped"
# Head packing: the rows record the option; 4 heads a block is refused at
# --small's 4 query heads on 2 KV groups (the 360m shapes, 16 on 4, take it).
for tile in ("", " 64x128", " 128x64", " 128x128"):
    for layer in ("causal", "atm"):
        hp2, hp4 = (by_name[f"attention fwd fa2{tile} hp{n} {layer}"] for n in (2, 4))
        assert hp2["options"]["attention_heads_per_block"] == "2", hp2
        assert hp4["options"]["attention_heads_per_block"] == "4", hp4
        assert hp4.get("skipped") and "train.cuda_attention_heads_per_block" in hp4["message"], hp4
assert by_name["attention fwd fa2 causal"]["options"]["attention_heads_per_block"] == "1"
# cuDNN's rows (the last section) cannot run on the emulator: one skipped row.
cudnn = [r for r in rows if r.get("variant") == "cudnn"]
assert len(cudnn) == 1 and cudnn[0]["name"] == "attention cudnn causal" and cudnn[0]["skipped"], cudnn
# Packed documents: checked against the CPU, both windows timed, the ratios
# recorded (--small's T = 64 is one key tile a window: the tile count expects 1).
docs = by_name["attention documents"]
assert all(e < docs["check"]["tol"][k] for k, e in docs["check"]["max_rel"].items()), docs
assert docs["causal_ms"] > 0 and docs["documents_ms"] > 0 and docs["ratio"] > 0, docs
assert docs["documents"] > docs["B"] and 0 < docs["tiles_documents"] <= docs["tiles_causal"], docs
assert docs["expected_ratio"] == docs["tiles_documents"] / docs["tiles_causal"], docs
atm = by_name["attention fwd tc atm"]["atm"]
assert 0.15 <= atm["merged_pair_frac"] <= 0.3, f"ATM merged {atm['merged_pair_frac']} of the pairs"
gemms = [r for r in rows if r["section"] == "gemm" and "roles" in r]
assert len(gemms) >= 2 and len(gemms) % 2 == 0, f"{len(gemms)} GEMM lines"
# The GEMM sweep: a winner per distinct GEMM, candidates with split-K among
# them, and the winners written as a tuning table.
winners = [r for r in rows if r["section"] == "gemm tuning" and "winner" in r]
assert len(winners) == len(gemms) // 2, f"{len(winners)} tuned GEMMs for {len(gemms) // 2} distinct ones"
cands = [r["candidate"] for r in rows if r["section"] == "gemm tuning" and "candidate" in r]
assert any("splitk 4" in c for c in cands), "no split-K candidate was timed"
tables = json.load(open(sys.argv[2]))["tables"]
assert len(tables) == 1 and len(tables[0]["choices"]) == len(winners), tables
print(f"kernel_bench_emu: ok ({timed} timed, {skipped} skipped, {len(gemms) // 2} distinct GEMMs)")
PY
# --preset: another model's head dim (wiola-1.5b: d_h 128), here its tiny
# form with the memory-bound ops only.
rm -f "$dir/preset.jsonl"
"$bench" --small --preset wiola-1.5b --only memory --json "$dir/preset.jsonl"
"$py" - "$dir/preset.jsonl" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
meta = rows[0]
assert meta["section"] == "meta" and meta["dh"] == 128 and meta["config"] == "kernel-bench-small-wiola-1.5b", meta
names = {r["name"] for r in rows[1:] if r.get("ok") and r.get("ms", 0) > 0}
assert {"srpe_split_fwd", "srpe_split_bwd", "rmsnorm_fwd"} <= names, names
print(f"kernel_bench_emu --preset wiola-1.5b: ok (d_h {meta['dh']}, {len(names)} memory ops)")
PY
