#!/usr/bin/env python3
"""Reference attention rates on the GPU, for the attention kernels' bars
(docs/gpu.md): PyTorch's scaled_dot_product_attention with each of its fused
backends, forced one at a time — FLASH_ATTENTION (FlashAttention-2's kernels),
CUDNN_ATTENTION (cuDNN's SDPA) and EFFICIENT_ATTENTION — at wiola-360m's
attention shape (B = 4, H = 16 query heads, T = 2048, d_h = 64, causal, bf16).
Measured references, not dependencies of the step: the kit runs this beside
wiola's own kernels in the same call (tests/gpu/kit_bench.sh, variants).
wiola_kernel_bench also times cuDNN's SDPA itself, without PyTorch, at its own
shapes and with GQA (bench/cudnn_sdpa.h: its "fwd cudnn" and "bwd cudnn" rows).

K and V are given all H heads (the GQA groups repeated beforehand, outside the
timing), so that every backend takes the same call. FLOPs are counted as
FlashAttention counts them: a causal forward is 4 B H T^2 d_h / 2, a backward
2.5 times that. Prints one JSON line per backend: forward and backward
milliseconds (median of --reps after --warmup), TFLOP/s, or why it was
skipped.

    python3 bench/torch_attention_ref.py [--B 4 --H 16 --T 2048 --dh 64 --reps 20]
"""
import argparse
import json
import statistics
import sys


def timed(fn, reps, warmup):
    import torch
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        torch.cuda.synchronize()
        times.append(a.elapsed_time(b))
    return statistics.median(times)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--B", type=int, default=4)
    ap.add_argument("--H", type=int, default=16)
    ap.add_argument("--T", type=int, default=2048)
    ap.add_argument("--dh", type=int, default=64)
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=5)
    a = ap.parse_args()
    try:
        import torch
        import torch.nn.functional as F
        from torch.nn.attention import SDPBackend, sdpa_kernel
    except ImportError as e:
        print(json.dumps({"skipped": f"needs torch >= 2.3 with torch.nn.attention: {e}"}))
        return
    if not torch.cuda.is_available():
        print(json.dumps({"skipped": "no CUDA device"}))
        return
    fwd_flops = 4 * a.B * a.H * a.T * a.T * a.dh / 2
    shape = (a.B, a.H, a.T, a.dh)
    q, k, v = (torch.randn(shape, device="cuda", dtype=torch.bfloat16, requires_grad=True) for _ in range(3))
    dout = torch.randn(shape, device="cuda", dtype=torch.bfloat16)
    for name in ("FLASH_ATTENTION", "CUDNN_ATTENTION", "EFFICIENT_ATTENTION"):
        rec = {"backend": name, "torch": torch.__version__, "device": torch.cuda.get_device_name(),
               "shape": {"B": a.B, "H": a.H, "T": a.T, "dh": a.dh}, "flops": "FlashAttention count (causal)"}
        backend = getattr(SDPBackend, name, None)
        if backend is None:
            rec["skipped"] = f"this torch has no SDPBackend.{name}"
            print(json.dumps(rec), flush=True)
            continue
        try:
            with sdpa_kernel(backend):
                def fwd():
                    with torch.no_grad():
                        F.scaled_dot_product_attention(q, k, v, is_causal=True)

                def fwd_bwd():
                    o = F.scaled_dot_product_attention(q, k, v, is_causal=True)
                    o.backward(dout)

                t_fwd = timed(fwd, a.reps, a.warmup)
                t_all = timed(fwd_bwd, a.reps, a.warmup)
            t_bwd = max(t_all - t_fwd, 1e-9)
            rec.update({"fwd_ms": round(t_fwd, 4), "bwd_ms": round(t_bwd, 4),
                        "fwd_tflops": round(fwd_flops / t_fwd / 1e9, 1),
                        "bwd_tflops": round(2.5 * fwd_flops / t_bwd / 1e9, 1)})
        except Exception as e:  # a backend this card, dtype or shape does not support
            rec["skipped"] = f"{type(e).__name__}: {str(e)[:300]}"
        print(json.dumps(rec), flush=True)


if __name__ == "__main__":
    sys.exit(main())
