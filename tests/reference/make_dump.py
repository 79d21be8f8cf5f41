#!/usr/bin/env python3
"""Write numerics dumps (docs/model.md §7 layout + /logits) from the PyTorch
reference.

Runs k training steps of the reference from a random init (N(0, 0.02^2),
gamma = 1, delta = 0, phi = -3) on random tokens and writes one HDF5 file per
step: OUT_DIR/step_<N>.h5.  Used to self-test compare_dump.py before (and
independently of) the C++ dump writer.

    /usr/bin/python3 tests/reference/make_dump.py --out-dir /tmp/wd --steps 3
"""
from __future__ import annotations

import argparse
import os
import sys

import h5py
import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import wiola_ref as W  # noqa: E402


def write_dump(path, cfg: W.WiolaConfig, oc: W.OptimConfig, step: int, lr: float,
               tokens, params_before, grads, params_after, loss: float, grad_norm: float,
               m_before=None, v_before=None, atm_maps=None, logits=None, documents_eos=None) -> None:
    """Write one dump file in the docs/model.md §7 layout (plus /logits)."""
    def f32(t):
        return t.detach().to(torch.float32).cpu().numpy()

    with h5py.File(path, "w") as f:
        c = f.create_group("config")
        for k in W.CONFIG_INT_FIELDS:
            c.attrs[k] = np.int64(getattr(cfg, k))
        for k in W.CONFIG_FLOAT_FIELDS:
            c.attrs[k] = np.float64(getattr(cfg, k))
        c.attrs["atm"] = np.int64(1 if cfg.atm else 0)
        c.attrs["lr"] = np.float64(lr)
        c.attrs["step"] = np.int64(step)
        c.attrs["t_max"] = np.int64(oc.t_max)
        c.attrs["lr_max"] = np.float64(oc.lr_max)
        c.attrs["lr_min"] = np.float64(oc.lr_min)
        c.attrs["warmup"] = np.int64(W.warmup_steps(oc.t_max) if oc.warmup is None else oc.warmup)
        c.attrs["beta1"] = np.float64(oc.beta1)
        c.attrs["beta2"] = np.float64(oc.beta2)
        c.attrs["adam_eps"] = np.float64(oc.eps)
        c.attrs["weight_decay"] = np.float64(oc.weight_decay)
        c.attrs["clip"] = np.float64(oc.clip)
        if documents_eos is not None:  # docs/model.md §7
            c.attrs["documents"] = np.int64(1)
            c.attrs["eos_id"] = np.int64(documents_eos)
        f.create_dataset("tokens", data=np.asarray(tokens, dtype=np.int32))
        for gname, d in (("params", params_before), ("grads", grads), ("params_after", params_after)):
            g = f.create_group(gname)
            for k, t in d.items():
                g.create_dataset(k, data=f32(t))
        f.create_dataset("loss", data=np.float64(loss))
        f.create_dataset("grad_norm", data=np.float64(grad_norm))
        if step > 1 and m_before is not None:
            for gname, d in (("optim/m", m_before), ("optim/v", v_before)):
                g = f.create_group(gname)
                for k, t in d.items():
                    g.create_dataset(k, data=f32(t))
        if atm_maps:
            g = f.create_group("atm")
            for l, mo in sorted(atm_maps.items()):
                g.create_dataset(f"layer_{l}", data=mo.to(torch.uint8).cpu().numpy())
        if logits is not None:
            f.create_dataset("logits", data=f32(logits))


def random_tokens(gen: torch.Generator, B: int, T: int, V: int, repeat_prob: float) -> torch.Tensor:
    """Random tokens [B, T+1]; with probability repeat_prob a token repeats its
    predecessor (identical neighbours make ATM merge at random init)."""
    tok = torch.randint(0, V, (B, T + 1), generator=gen)
    if repeat_prob > 0:
        rep = torch.rand(B, T + 1, generator=gen) < repeat_prob
        for t in range(1, T + 1):  # tiny: data generation only
            tok[:, t] = torch.where(rep[:, t], tok[:, t - 1], tok[:, t])
    return tok


def with_documents(gen: torch.Generator, tok: torch.Tensor, eos: int, prob: float) -> torch.Tensor:
    """tokens [B, T+1] with EOS ids sprinkled in (probability prob each) and,
    in the first window, a document that is only an EOS (two EOS in a row)."""
    tok = tok.clone()
    tok[torch.rand(tok.shape, generator=gen) < prob] = eos
    tok[0, 3:5] = eos
    return tok


def build_argparser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out-dir", required=True)
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--preset", default="tiny", help="config preset (tiny, bench, wiola-120m, ...)")
    for k in ("d", "L", "H", "Hkv", "dA", "dB", "V", "T"):
        ap.add_argument("--" + k, type=int, default=None)
    ap.add_argument("--B", type=int, default=4)
    ap.add_argument("--tau", type=float, default=0.92)
    ap.add_argument("--no-atm", action="store_true")
    ap.add_argument("--repeat-prob", type=float, default=0.3)
    ap.add_argument("--lr-max", type=float, default=3e-4)
    ap.add_argument("--lr-min", type=float, default=0.0)
    ap.add_argument("--t-max", type=int, default=20)
    ap.add_argument("--clip", type=float, default=1.0)
    ap.add_argument("--weight-decay", type=float, default=0.1)
    ap.add_argument("--dtype", default="float64", choices=["float32", "float64"],
                    help="compute dtype of the reference run (dumps are fp32)")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--documents-eos", type=int, default=None,
                    help="document masking with this EOS id (docs/model.md §2 'Documents')")
    ap.add_argument("--eos-prob", type=float, default=0.12, help="with --documents-eos: share of EOS tokens")
    return ap


def main(argv=None) -> int:
    a = build_argparser().parse_args(argv)
    W.set_threads(a.threads)
    ov = {k2: getattr(a, k1) for k1, k2 in (("d", "d"), ("L", "L"), ("H", "H"), ("Hkv", "H_kv"),
                                             ("dA", "d_A"), ("dB", "d_B"), ("V", "V"), ("T", "T"))
          if getattr(a, k1) is not None}
    cfg = W.WiolaConfig.preset(a.preset, tau=a.tau, atm=not a.no_atm, **ov)
    oc = W.OptimConfig(lr_max=a.lr_max, lr_min=a.lr_min, t_max=a.t_max, clip=a.clip,
                       weight_decay=a.weight_decay)
    dtype = getattr(torch, a.dtype)
    params = W.init_params(cfg, seed=a.seed, dtype=dtype)
    state = W.new_adam_state(params)
    gen = torch.Generator().manual_seed(a.seed + 1)
    os.makedirs(a.out_dir, exist_ok=True)
    for step in range(1, a.steps + 1):
        tokens = random_tokens(gen, a.B, cfg.T, cfg.V, a.repeat_prob)
        if a.documents_eos is not None:
            tokens = with_documents(gen, tokens, a.documents_eos, a.eos_prob)
        lr = W.lr_at(step, oc.t_max, oc.lr_max, oc.lr_min, oc.warmup)
        before = {k: v.detach().clone() for k, v in params.items()}
        m_before = {k: v.clone() for k, v in state["m"].items()}
        v_before = {k: v.clone() for k, v in state["v"].items()}
        r = W.train_step(params, state, cfg, tokens, lr, step, oc, keep_logits=True, documents_eos=a.documents_eos)
        path = os.path.join(a.out_dir, f"step_{step}.h5")
        maps = r["aux"]["merge_open"]
        write_dump(path, cfg, oc, step, lr, tokens.numpy(), before, r["grads"], params,
                   r["loss"], r["grad_norm"], m_before, v_before, maps, r["logits"], a.documents_eos)
        merged = {l: int(mo.sum()) for l, mo in maps.items()}
        print(f"wrote {path}: loss {r['loss']:.6f} grad_norm {r['grad_norm']:.6f} lr {lr:.3e} "
              f"merged pairs per ATM layer {merged}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
