#!/usr/bin/env bash
# GPU kit (3), on the GPU machine: the training-step benchmark, wiola-360m at
# T = 2048 (wiola_gpu_bench), in three parts that kit_session.sh runs as
# separate steps, most valuable first (KIT_BENCH_PART):
#   main      wiola's step (bf16; fp32 too unless --precision is given), then
#             the PyTorch eager baseline of the same model
#             (bench/torch_gpu_step.py)
#   variants  the step in bf16 again with each kernel variant the backend can
#             be switched to by its options, most wanted first (new: every
#             new kernel at once, --attention fa2 --attention-bwd fa2 --gemm
#             auto, the configuration the speed bars are about; fa2: the
#             FlashAttention-2 style forward, --attention fa2; fa2_bwd: its
#             backward, --attention-bwd fa2; gemm_auto: the GEMMs tuned per
#             shape, --gemm auto; bwd_v2: the second form of the tensor-core
#             backward, --attention-bwd v2; on request rows: the row attention
#             kernels, --attention rows; gemm_lt: cuBLASLt's heuristic, --gemm
#             cublaslt; fa2_64x128, fa2_128x64, fa2_128x128: the fa2 forward
#             at another tile shape, --attention fa2 --attention-tile ...;
#             fa2_hp2, fa2_hp4, fa2_128x64_hp2, fa2_128x64_hp4, ...: the fa2
#             forward with heads of one KV group packed, at the default or
#             the named tile, --attention fa2 [--attention-tile ...]
#             --attention-heads-per-block 2|4;
#             fa2_bwd_64x128, fa2_bwd_128x64, fa2_bwd_128x128: the fa2
#             backward at another tile shape, --attention-bwd fa2
#             --attention-bwd-tile ...; the kernels of both kit_kernels.sh
#             times alone by default):
#             wiola_bench_<variant>.json;
#             then the attention references, PyTorch's SDPA with
#             FlashAttention-2's and cuDNN's kernels at the same shape
#             (bench/torch_attention_ref.py): attention_ref.jsonl
#   compile   the torch.compile baseline (up to 4 device minutes)
# Each part rewrites $OUT/bench.json from every result so far (figures and
# the ratios: wiola against PyTorch eager and torch.compile, each variant
# against the default) and appends to $OUT/bench.log. Extra arguments go to
# wiola_gpu_bench (--help lists them). KIT_VARIANTS: the variants to run
# (default "new graphs fa2 fa2_bwd gemm_auto bwd_v2"; graphs: CUDA Graphs,
# each layer's forward and backward replayed as one graph, --cuda-graphs
# layers, against the main run's step without them; new_graphs on request:
# the new variant with them).
set -uo pipefail
cd "$(dirname "$0")/../.."
. tests/gpu/kit_env.sh
py=$(command -v python3)
args=(--device cuda --dtype bf16 --d 1024 --L 16 --H 16 --Hkv 4 --dA 1024 --dB 4096 --V 32000 --T 2048 --B 4)
variant_flags() {  # the backend options that select a variant
  case "$1" in
    new) echo --attention fa2 --attention-bwd fa2 --gemm auto ;;
    rows) echo --attention rows ;;
    bwd_v2) echo --attention-bwd v2 ;;
    fa2) echo --attention fa2 ;;
    fa2_bwd) echo --attention-bwd fa2 ;;
    gemm_auto) echo --gemm auto ;;
    gemm_lt) echo --gemm cublaslt ;;
    fa2_64x128 | fa2_128x64 | fa2_128x128) echo --attention fa2 --attention-tile "${1#fa2_}" ;;
    fa2_hp2 | fa2_hp4) echo --attention fa2 --attention-heads-per-block "${1#fa2_hp}" ;;
    fa2_64x128_hp[24] | fa2_128x64_hp[24] | fa2_128x128_hp[24])
      t=${1#fa2_}
      echo --attention fa2 --attention-tile "${t%_hp*}" --attention-heads-per-block "${1##*_hp}" ;;
    fa2_bwd_64x128 | fa2_bwd_128x64 | fa2_bwd_128x128)
      echo --attention-bwd fa2 --attention-bwd-tile "${1#fa2_bwd_}" ;;
    graphs) echo --cuda-graphs layers ;;
    new_graphs) echo --attention fa2 --attention-bwd fa2 --gemm auto --cuda-graphs layers ;;
    *) echo "kit_bench: unknown variant $1" >&2; return 1 ;;
  esac
}
rc=0
case "${KIT_BENCH_PART:-main}" in
  main)
    "$kit_bin/wiola_gpu_bench" --json "$OUT/wiola_bench.json" "${kit_flags[@]}" "$@" 2>&1 | tee -a "$OUT/bench.log"
    rc=${PIPESTATUS[0]}
    echo "PyTorch baseline (eager):" | tee -a "$OUT/bench.log"
    timeout 180 "$py" bench/torch_gpu_step.py "${args[@]}" 2>>"$OUT/bench.log" | tail -1 > "$OUT/torch_eager.json"
    tee -a "$OUT/bench.log" < "$OUT/torch_eager.json" ;;
  variants)
    vargs=("$@")
    [[ " $* " == *" --precision "* ]] || vargs+=(--precision bf16)
    for v in ${KIT_VARIANTS:-new graphs fa2 fa2_bwd gemm_auto bwd_v2}; do
      f=$(variant_flags "$v") || continue
      echo "wiola bf16 with $f:" | tee -a "$OUT/bench.log"
      # shellcheck disable=SC2086  # $f: flags and their values
      timeout 120 "$kit_bin/wiola_gpu_bench" --json "$OUT/wiola_bench_$v.json" "${vargs[@]}" $f 2>&1 |
        tee -a "$OUT/bench.log"
    done
    # The references for the attention kernels: PyTorch's SDPA backends
    # (FlashAttention-2's kernels, cuDNN's) at the same shape, same card.
    echo "attention references (PyTorch SDPA backends):" | tee -a "$OUT/bench.log"
    timeout 90 "$py" bench/torch_attention_ref.py 2>>"$OUT/bench.log" > "$OUT/attention_ref.jsonl"
    tee -a "$OUT/bench.log" < "$OUT/attention_ref.jsonl" ;;
  compile)
    echo "PyTorch baseline (torch.compile):" | tee -a "$OUT/bench.log"
    timeout 240 "$py" bench/torch_gpu_step.py "${args[@]}" --compile 2>>"$OUT/bench.log" | tail -1 \
      > "$OUT/torch_compile.json"
    tee -a "$OUT/bench.log" < "$OUT/torch_compile.json" ;;
  *) echo "kit_bench: KIT_BENCH_PART must be main, variants or compile" >&2; exit 2 ;;
esac
"$py" - "$OUT" <<'PY' | tee -a "$OUT/bench.log"
import glob, json, os, sys
out = sys.argv[1]
def load(path):
    try:
        with open(path) as f:
            return json.loads(f.read().strip() or "null")
    except FileNotFoundError:
        return None  # a part that has not run
    except Exception as e:  # a run that failed or timed out
        return {"error": str(e)}
def tokens(r):
    return ((r or {}).get("bf16") or {}).get("tokens_per_s")
def load_lines(path):
    try:
        with open(path) as f:
            return [json.loads(line) for line in f if line.strip()]
    except (OSError, ValueError) as e:
        return None if isinstance(e, FileNotFoundError) else {"error": str(e)}
r = {"wiola": load(f"{out}/wiola_bench.json"), "torch_eager": load(f"{out}/torch_eager.json"),
     "attention_reference": load_lines(f"{out}/attention_ref.jsonl"),
     "torch_compile": load(f"{out}/torch_compile.json"),
     "variants": {os.path.basename(p)[len("wiola_bench_"):-5]: load(p)
                  for p in sorted(glob.glob(f"{out}/wiola_bench_*.json"))}}
w = tokens(r["wiola"])
for k in ("torch_eager", "torch_compile"):
    t = (r[k] or {}).get("tokens_per_s")
    if w and t:
        r[f"ratio_vs_{k}"] = round(w / t, 3)
for v, res in r["variants"].items():
    if w and tokens(res):
        r[f"ratio_{v}_vs_default"] = round(tokens(res) / w, 3)
with open(os.path.join(out, "bench.json"), "w") as f:
    json.dump(r, f, indent=2)
print(json.dumps({k: v for k, v in r.items() if k.startswith("ratio")}))
PY
exit "$rc"
