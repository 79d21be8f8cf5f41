#!/usr/bin/env python3
"""Time one Wiola training step of the PyTorch reference (CPU).

forward (training mode, ATM active with tau = 0.92) + backward + global-norm
clip + AdamW update -- the same math as the C++ trainer (docs/model.md §2,
§4).  Prints ONE JSON line: {"tokens_per_s", "step_ms", "threads", "torch", ...}.

    /usr/bin/python3 bench/torch_step.py --threads 2
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "reference"))
import wiola_ref as W  # noqa: E402


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--d", type=int, default=256)
    ap.add_argument("--L", type=int, default=8)
    ap.add_argument("--H", type=int, default=8)
    ap.add_argument("--Hkv", type=int, default=4)
    ap.add_argument("--dA", type=int, default=256)
    ap.add_argument("--dB", type=int, default=1024)
    ap.add_argument("--V", type=int, default=8192)
    ap.add_argument("--T", type=int, default=256)
    ap.add_argument("--B", type=int, default=8)
    ap.add_argument("--tau", type=float, default=0.92)
    ap.add_argument("--no-atm", action="store_true")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--steps", type=int, default=5, help="timed steps")
    ap.add_argument("--warmup", type=int, default=2, help="untimed steps first")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--dtype", default="float32", choices=["float32", "float64"])
    ap.add_argument("--no-malloc-tune", action="store_true",
                    help="keep glibc malloc defaults (by default the script re-executes itself "
                         "with MALLOC_MMAP_THRESHOLD_/MALLOC_TRIM_THRESHOLD_/MALLOC_TOP_PAD_ set so "
                         "that large activation buffers are reused instead of mmap/munmap'ed and "
                         "page-faulted every step)")
    a = ap.parse_args(argv)
    if argv is None and not a.no_malloc_tune and "WIOLA_BENCH_MALLOC_TUNED" not in os.environ:
        env = dict(os.environ, WIOLA_BENCH_MALLOC_TUNED="1", MALLOC_MMAP_THRESHOLD_="4294967296",
                   MALLOC_TRIM_THRESHOLD_="68719476736", MALLOC_TOP_PAD_="1073741824")
        os.execve(sys.executable, [sys.executable, os.path.abspath(__file__)] + sys.argv[1:], env)

    W.set_threads(a.threads)
    cfg = W.WiolaConfig(d=a.d, L=a.L, H=a.H, H_kv=a.Hkv, d_A=a.dA, d_B=a.dB, V=a.V, T=a.T,
                        tau=a.tau, atm=not a.no_atm)
    oc = W.OptimConfig(t_max=1000)
    params = W.init_params(cfg, seed=a.seed, dtype=getattr(torch, a.dtype))
    names = list(params)
    plist = [params[n] for n in names]
    state = W.new_adam_state(params)
    g = torch.Generator().manual_seed(a.seed + 1)
    # random tokens with some repeats so that ATM has something to merge
    tok = torch.randint(0, cfg.V, (a.B, cfg.T + 1), generator=g)
    rep = torch.rand(a.B, cfg.T + 1, generator=g) < 0.2
    rep[:, 0] = False
    idx = torch.arange(cfg.T + 1).expand(a.B, -1)
    src = torch.cummax(torch.where(rep, torch.zeros_like(idx), idx), 1).values
    tok = torch.gather(tok, 1, src)
    inputs, targets = tok[:, :-1].contiguous(), tok[:, 1:].contiguous()

    times, merged = [], {}
    for step in range(1, a.warmup + a.steps + 1):
        t0 = time.perf_counter()
        logits, aux = W.forward(params, cfg, inputs, training=True)
        loss = W.cross_entropy_loss(logits, targets)
        grads = dict(zip(names, torch.autograd.grad(loss, plist)))
        del logits, loss
        W.clip_grads_(grads, oc.clip)
        W.adamw_update_(params, grads, state, W.lr_at(step, oc.t_max, oc.lr_max, oc.lr_min), step,
                        oc.beta1, oc.beta2, oc.eps, oc.weight_decay)
        dt = time.perf_counter() - t0
        if step > a.warmup:
            times.append(dt)
        merged = {l: round(int(mo.sum()) / mo.numel(), 4) for l, mo in aux["merge_open"].items()}
    step_s = sorted(times)[len(times) // 2] if times else float("nan")  # median
    mean_s = sum(times) / max(len(times), 1)
    out = {
        "tokens_per_s": round(a.B * cfg.T / step_s, 1),
        "step_ms": round(step_s * 1e3, 2),
        "step_ms_mean": round(mean_s * 1e3, 2),
        "threads": torch.get_num_threads(),
        "torch": torch.__version__,
        "malloc_tuned": "WIOLA_BENCH_MALLOC_TUNED" in os.environ,
        "params": W.param_count(cfg),
        "tokens_per_step": a.B * cfg.T,
        "atm_mu": merged,  # fraction of positions merged away (mu = 1 - T'/T) per ATM layer
        "config": {"d": a.d, "L": a.L, "H": a.H, "Hkv": a.Hkv, "dA": a.dA, "dB": a.dB,
                   "V": a.V, "T": a.T, "B": a.B, "tau": a.tau, "atm": not a.no_atm, "dtype": a.dtype},
    }
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
