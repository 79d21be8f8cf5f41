#!/usr/bin/env python3
"""A fair PyTorch baseline for the GPU benchmark: one Wiola training step
(forward with ATM, backward, clip, AdamW) written the way a PyTorch user would
write it fast — the model of tests/reference/wiola_ref.py (one GEMM for Q, K,
V and the gate, one for the DSFF up-projections) with self-attention through
torch.nn.functional.scaled_dot_product_attention (GQA layout; causal flash path
in plain layers, the ATM visibility mask in ATM layers), bf16 autocast with
fp32 master weights, fused AdamW, and optionally torch.compile; compiled, the
ATM layers run on FlexAttention (torch >= 2.5) with the ATM visibility as a
block mask (--no-flex: SDPA with a dense mask), which the output's
"atm_attention" names.

    python3 bench/torch_gpu_step.py --device cuda --dtype bf16 --d 1024 --L 16 ...
    python3 bench/torch_gpu_step.py --check     # CPU, float64: same model as the reference

Prints ONE JSON line: {"tokens_per_s", "step_ms", "torch", "compile", ...}.
--check compares loss and every gradient with the reference implementation
(the attention written out) on a small config with ATM merging; on a torch
without scaled_dot_product_attention (< 2.0) the same GQA layout and mask run
through an explicit softmax instead, so the layout and the mask are what it
checks.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "reference"))
import wiola_ref as W  # noqa: E402

HAVE_SDPA = hasattr(F, "scaled_dot_product_attention")
try:  # torch >= 2.5: FlexAttention, the ATM visibility as a block mask (--flex)
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention
    HAVE_FLEX = True
except ImportError:
    HAVE_FLEX = False
# What the ATM layers run on: "sdpa" (a dense boolean mask) or "flex"
# (FlexAttention with a block mask; compiled with the step by --compile).
ATM_KERNEL = {"name": "sdpa", "error": None}


def _attend(q, k, v, allowed, causal):
    """q [B, H, T, dh] (pre-scaled), k, v [B, G, T, dh] with query head
    h = g*R + r using group g; allowed [B, 1, T, T] bool or None (causal)."""
    B, H, T, dh = q.shape
    G = k.shape[1]
    if HAVE_SDPA:
        kw = {"scale": 1.0}
        if G != H:
            try:
                return F.scaled_dot_product_attention(q, k, v, attn_mask=allowed, is_causal=causal,
                                                      enable_gqa=True, **kw)
            except TypeError:  # torch < 2.5: no enable_gqa
                k = k.repeat_interleave(H // G, dim=1)
                v = v.repeat_interleave(H // G, dim=1)
        return F.scaled_dot_product_attention(q, k, v, attn_mask=allowed, is_causal=causal, **kw)
    # Explicit softmax with the same layout and mask (old torch; --check).
    k = k.repeat_interleave(H // G, dim=1)
    v = v.repeat_interleave(H // G, dim=1)
    s = torch.matmul(q, k.transpose(-1, -2))
    if causal:
        allowed = torch.ones(T, T, dtype=torch.bool, device=q.device).tril()[None, None]
    s = s.masked_fill(~allowed, -math.inf)
    return torch.matmul(torch.softmax(s, dim=-1), v)


def _attend_flex(q, k, v, opens):
    """The ATM visibility (query t sees slot u iff u == t, or u < t and u does
    not open a pair) as FlexAttention's block mask: the causal tiles, with the
    openers of each batch row masked inside them. None (and the reason kept
    in ATM_KERNEL) when FlexAttention fails here; the caller uses SDPA."""
    B, H, T, _ = q.shape

    def visible(b, h, q_idx, kv_idx):
        return (kv_idx == q_idx) | ((kv_idx < q_idx) & ~opens[b, kv_idx])

    try:
        mask = create_block_mask(visible, B, None, T, T, device=q.device)
        return flex_attention(q, k, v, block_mask=mask, scale=1.0, enable_gqa=k.shape[1] != H)
    except Exception as e:  # noqa: BLE001 - recorded in the output, SDPA takes over
        ATM_KERNEL.update(name="sdpa", error=f"flex failed: {type(e).__name__}: {e}"[:200])
        return None


def fast_self_attention(q, k, v, R, merge_open):
    """Drop-in for wiola_ref.self_attention (same arguments and result):
    q [B, G, R*T, dh] pre-scaled (row r*T + t: head h = r*G + g), k, v
    [B, G, T, dh]. Runs in the GQA layout [B, G*R, T, dh], head index g*R + r."""
    B, G, RT, dh = q.shape
    T = k.shape[2]
    qh = q.view(B, G, R, T, dh).reshape(B, G * R, T, dh)
    if merge_open is None:
        o = _attend(qh, k, v, None, True)
    else:
        # The reference's slot form of ATM: slot u holds the group ending at u
        # (or u's raw key when u opens a pair); query t sees slot u iff
        # u < t and u does not open a pair, or u == t.
        mo = merge_open.to(device=q.device, dtype=torch.bool)
        closes = torch.zeros_like(mo)
        closes[:, 1:] = mo[:, :-1]
        cl = closes[:, None, :, None]
        k_prev = torch.cat([k[:, :, :1], k[:, :, :-1]], 2)
        v_prev = torch.cat([v[:, :, :1], v[:, :, :-1]], 2)
        ks = torch.where(cl, (k_prev + k) * 0.5, k)
        vs = torch.where(cl, (v_prev + v) * 0.5, v)
        o = _attend_flex(qh, ks, vs, mo) if ATM_KERNEL["name"] == "flex" else None
        if o is None:
            strict = torch.ones(T, T, dtype=torch.bool, device=q.device).tril(-1)
            allowed = (strict[None] & ~mo[:, None, :]) | torch.eye(T, dtype=torch.bool, device=q.device)[None]
            o = _attend(qh, ks, vs, allowed[:, None], False)
    return o.view(B, G, R, T, dh).reshape(B, G, RT, dh)


def check() -> int:
    """float64 on the CPU: loss and gradients equal the reference's."""
    torch.manual_seed(0)
    cfg = W.WiolaConfig(d=32, L=3, H=4, H_kv=2, d_A=16, d_B=64, V=50, T=12, tau=0.2, atm=True)
    params = W.init_params(cfg, seed=3, dtype=torch.float64)
    names = list(params)
    tok = torch.randint(0, cfg.V, (2, cfg.T + 1))
    tok[:, 5] = tok[:, 4]  # repeats, so ATM merges
    results = []
    ref_attn = W.self_attention
    for attn in (ref_attn, fast_self_attention):
        W.self_attention = attn
        try:
            logits, aux = W.forward(params, cfg, tok[:, :-1], training=True)
            loss = W.cross_entropy_loss(logits, tok[:, 1:])
            grads = torch.autograd.grad(loss, [params[n] for n in names])
        finally:
            W.self_attention = ref_attn
        merged = sum(int(m.sum()) for m in aux["merge_open"].values())
        results.append((float(loss), grads, merged))
    (l0, g0, m0), (l1, g1, m1) = results
    worst = max(float((a - b).abs().max() / max(a.abs().max(), 1e-30)) for a, b in zip(g0, g1))
    ok = abs(l0 - l1) <= 1e-12 * abs(l0) and worst < 1e-10 and m0 == m1 and m0 > 0
    print(json.dumps({"check": "ok" if ok else "FAILED", "sdpa": HAVE_SDPA, "loss_ref": l0, "loss_fast": l1,
                      "worst_grad_rel": worst, "merged_pairs": m0, "torch": torch.__version__}))
    return 0 if ok else 1


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    for k, dv in (("d", 1024), ("L", 16), ("H", 16), ("Hkv", 4), ("dA", 1024), ("dB", 4096), ("V", 32000),
                  ("T", 2048), ("B", 4)):
        ap.add_argument(f"--{k}", type=int, default=dv)
    ap.add_argument("--tau", type=float, default=0.92)
    ap.add_argument("--no-atm", action="store_true")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--dtype", default="bf16", choices=["bf16", "fp32"])
    ap.add_argument("--compile", action="store_true", help="torch.compile the forward + loss")
    ap.add_argument("--no-flex", action="store_true",
                    help="with --compile: ATM layers on SDPA with a dense mask, not FlexAttention's block mask")
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--check", action="store_true", help="CPU float64 self-check against the reference")
    a = ap.parse_args(argv)
    if a.check:
        return check()

    dev = torch.device(a.device)
    cfg = W.WiolaConfig(d=a.d, L=a.L, H=a.H, H_kv=a.Hkv, d_A=a.dA, d_B=a.dB, V=a.V, T=a.T, tau=a.tau,
                        atm=not a.no_atm)
    W.self_attention = fast_self_attention
    params = {n: p.detach().to(dev).requires_grad_(True) for n, p in
              W.init_params(cfg, seed=0, dtype=torch.float32).items()}
    decay = [p for n, p in params.items() if p.dim() == 2]
    no_decay = [p for n, p in params.items() if p.dim() != 2]
    fused = dev.type == "cuda"
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}],
                            lr=3e-4, betas=(0.9, 0.95), eps=1e-8, **({"fused": True} if fused else {}))
    g = torch.Generator().manual_seed(1)
    tok = torch.randint(0, cfg.V, (a.B, cfg.T + 1), generator=g)
    tok[:, 1::5] = tok[:, 0::5][:, : tok[:, 1::5].shape[1]]  # repeats so that ATM merges
    tok = tok.to(dev)

    def loss_fn(tokens):
        logits, _ = W.forward(params, cfg, tokens[:, :-1], training=True)
        return W.cross_entropy_loss(logits, tokens[:, 1:])

    compiled = "off"
    fn = loss_fn
    if a.compile and HAVE_FLEX and not a.no_flex and not a.no_atm:
        ATM_KERNEL["name"] = "flex"
    if a.compile:
        try:
            fn = torch.compile(loss_fn)
            compiled = "on"
        except Exception as e:  # noqa: BLE001 - report why, run eager
            compiled = f"failed: {type(e).__name__}: {e}"[:200]
    amp = torch.autocast(device_type=dev.type, dtype=torch.bfloat16, enabled=a.dtype == "bf16")
    times = []
    loss = float("nan")
    for step in range(a.warmup + a.steps):
        if dev.type == "cuda":
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        try:
            with amp:
                lv = fn(tok)
        except Exception as e:  # noqa: BLE001 - a failed compile falls back to eager
            if fn is loss_fn:
                raise
            compiled = f"failed: {type(e).__name__}: {e}"[:200]
            fn = loss_fn
            ATM_KERNEL["name"] = "sdpa"  # FlexAttention uncompiled would be a slow strawman
            with amp:
                lv = fn(tok)
        lv.backward()
        torch.nn.utils.clip_grad_norm_(list(params.values()), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        if dev.type == "cuda":
            torch.cuda.synchronize()
        if step >= a.warmup:
            times.append(time.perf_counter() - t0)
        loss = float(lv)
    step_s = sorted(times)[len(times) // 2]
    out = {"tokens_per_s": round(a.B * cfg.T / step_s, 1), "step_ms": round(step_s * 1e3, 2), "loss": loss,
           "torch": torch.__version__, "device": str(dev), "dtype": a.dtype, "compile": compiled, "sdpa": HAVE_SDPA,
           "atm_attention": ATM_KERNEL["name"] + (f" ({ATM_KERNEL['error']})" if ATM_KERNEL["error"] else ""),
           "peak_gib": round(torch.cuda.max_memory_allocated() / 2**30, 2) if dev.type == "cuda" else None,
           "config": {"d": a.d, "L": a.L, "H": a.H, "Hkv": a.Hkv, "dA": a.dA, "dB": a.dB, "V": a.V, "T": a.T,
                      "B": a.B, "tau": a.tau, "atm": not a.no_atm}}
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
