#!/usr/bin/env bash
# GPU kit (kernels), on the GPU machine: the CUDA backend's kernels one at a
# time at wiola-360m's step shapes (bench/kernel_bench.cpp): the attention
# variants (backend options attention tc, fa2, rows; the fa2 forward at each
# tile shape attention_tile 64x64, 64x128, 128x64, 128x128, and at each again
# with heads of one KV group packed, attention_heads_per_block 2 and 4 (rows
# "fwd fa2 hp2" ... "fwd fa2 128x128 hp4"; wiola-360m has 4 query heads a KV
# group, so both run; wiola-1.5b, kit_session.sh's second call, has 2, so its
# hp4 rows say skipped); attention_bwd v1,
# v2, fa2, the fa2 backward at each tile shape attention_bwd_tile 64x64,
# 64x128, 128x64, 128x128; plain causal and ATM), each checked against the CPU before it is
# timed, in ms and TFLOP/s; the documents row ("attention documents": forward +
# backward of the causal windows against the same windows holding packed
# documents of mean length 256, checked, both timed, the measured ratio beside
# the one the 64x64 tile count expects, 0.345 at wiola-360m's B = 4, T = 2048);
# every distinct GEMM of the step, aligned and
# misaligned, in TFLOP/s, then each swept (cublasGemmEx and cuBLASLt's
# candidates, split-K ones included, checked, then timed) with the winners
# written as this card's tuning table to $OUT/gemm_tuning.json (for
# kernels/cuda/gemm_tuning.json); the projections that share an input as one
# GEMM and as several ("gemm merge": the context K|V, merged in the model, and
# DSFF's three up-projections, not merged: this run decides), each direction,
# checked, then timed with the speedup separate / merged; the memory-bound ops
# in GB/s. One JSON line per
# result in $OUT/kernels.jsonl, written as it is measured (a time limit keeps
# what ran), and the log in $OUT/kernels.log. Extra arguments go to
# wiola_kernel_bench (e.g. --only attention, --reps 10, --peak-gbps 4800 on an H200).
# KIT_KERNELS_NAME (default kernels) names the output files: kit_session.sh's
# second call, at wiola-1.5b's shapes (d_h 128: --preset wiola-1.5b --only
# attention), writes kernels_dh128.jsonl and no tuning table.
# Then, after our kernels and in a process of its own with its own limit
# (KIT_CUDNN_T seconds, default 60; 0 skips it), cuDNN's SDPA on the plain
# causal layer at the same shape (bench/cudnn_sdpa.h: rows "fwd cudnn" and
# "bwd cudnn", checked against the CPU, timed, with the ratio of our best row
# of the same file to cuDNN's), appended to the same .jsonl and .log; it is
# left out when --only names a section other than attention. libcudnn.so.9
# comes from the GPU machine (kit_env.sh: PyTorch's nvidia wheels or a CUDA
# toolkit); without it the row says skipped and why.
set -uo pipefail
cd "$(dirname "$0")/../.."
. tests/gpu/kit_env.sh
name=${KIT_KERNELS_NAME:-kernels}
tuning=(--write-tuning "$OUT/gemm_tuning.json")
[ "$name" = kernels ] || tuning=()
timeout 540 "$kit_bin/wiola_kernel_bench" --json "$OUT/$name.jsonl" "${tuning[@]}" --no-cudnn "$@" 2>&1 |
  tee "$OUT/$name.log"
rc=${PIPESTATUS[0]}
# The cuDNN rows: the same arguments less --only and --write-tuning.
cudnn_args=() only=attention
while [ $# -gt 0 ]; do
  case "$1" in
    --only) only=$2; shift 2 ;;
    --only=*) only=${1#--only=}; shift ;;
    --write-tuning) shift 2 ;;
    --write-tuning=*) shift ;;
    *) cudnn_args+=("$1"); shift ;;
  esac
done
if [ "${KIT_CUDNN_T:-60}" != 0 ] && [ "$only" = attention ]; then
  timeout "${KIT_CUDNN_T:-60}" "$kit_bin/wiola_kernel_bench" --json "$OUT/$name.jsonl" --append --only cudnn \
    "${cudnn_args[@]}" 2>&1 | tee -a "$OUT/$name.log"
  echo "kit_kernels: cuDNN rows: rc=${PIPESTATUS[0]}" | tee -a "$OUT/$name.log"
fi
exit "$rc"
