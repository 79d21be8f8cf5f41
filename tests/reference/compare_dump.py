#!/usr/bin/env python3
"""Compare numerics dumps (docs/model.md §7 + /logits) against the PyTorch
reference.

    compare_dump.py DUMP1.h5 [DUMP2.h5 ...] [--tol-grad 1e-4] [--tol-param 1e-5]
                    [--tol-logits 1e-4] [--tol-loss 1e-5] [--dtype float32]
                    [--threads 2] [--verbose]

The dumps are consecutive steps k, k+1, ... of one run.  The reference starts
from /params (and /optim/m, /optim/v when the first step is > 1) of the first
dump and then carries its OWN parameters and AdamW state from step to step, so
drift accumulates over the steps.  For every dump it uses /tokens and injects
the /atm/layer_<l> merge maps (it also computes its own maps and reports the
agreement), computes loss/logits/gradients by autograd and checks

  * /logits (max abs, relative ||a-b||/||b||)      < tol-logits (relative)
  * /loss (relative)                               < tol-loss
  * every /grads tensor (relative, per tensor)     < tol-grad
  * /grad_norm (relative)                          < tol-grad
  * /params_after after its own clip + AdamW       < tol-param per tensor
  * for dumps after the first: /params vs its carried parameters (< tol-param)
    and /optim/m, /optim/v vs its own AdamW state (< tol-grad)
  * /config lr against the docs/model.md §4 schedule (relative < 1e-6)

Exit status 0 iff everything is within tolerance; 1 on a tolerance failure;
2 when a dump is unreadable or inconsistent.
"""
from __future__ import annotations

import argparse
import math
import os
import sys
from typing import Dict, List, Optional

import h5py
import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import wiola_ref as W  # noqa: E402


class DumpError(Exception):
    pass


# --------------------------------------------------------------------------
# Reading
# --------------------------------------------------------------------------
def _scalar(v):
    if isinstance(v, bytes):
        v = v.decode()
    if isinstance(v, str):
        return float(v)
    a = np.asarray(v)
    if a.size != 1:
        raise DumpError(f"expected a scalar, got shape {a.shape}")
    return a.reshape(-1)[0].item()


def read_attr(attrs, key, cast, default=None, required=True):
    keys = {k.lower(): k for k in attrs.keys()}
    k = key if key in attrs else keys.get(key.lower())
    if k is None:
        if required and default is None:
            raise DumpError(f"/config attribute '{key}' missing")
        return default
    v = _scalar(attrs[k])
    if cast is int:
        fv = float(v)
        if fv != round(fv):
            raise DumpError(f"/config attribute '{key}' = {v} is not an integer")
        return int(round(fv))
    if cast is bool:
        return bool(int(round(float(v))))
    return float(v)


def read_config(f) -> (W.WiolaConfig, dict):
    if "config" not in f:
        raise DumpError("group /config missing")
    a = f["config"].attrs
    kw = {k: read_attr(a, k, int) for k in W.CONFIG_INT_FIELDS}
    kw.update({k: read_attr(a, k, float) for k in W.CONFIG_FLOAT_FIELDS})
    kw["atm"] = read_attr(a, "atm", bool)
    cfg = W.WiolaConfig(**kw)
    hp = dict(
        lr=read_attr(a, "lr", float), step=read_attr(a, "step", int),
        adam_step=read_attr(a, "adam_step", int, required=False),
        t_max=read_attr(a, "t_max", int), lr_max=read_attr(a, "lr_max", float),
        lr_min=read_attr(a, "lr_min", float, default=0.0),
        warmup=read_attr(a, "warmup", int, required=False),
        beta1=read_attr(a, "beta1", float), beta2=read_attr(a, "beta2", float),
        adam_eps=read_attr(a, "adam_eps", float),
        weight_decay=read_attr(a, "weight_decay", float), clip=read_attr(a, "clip", float))
    # Documents (docs/model.md §2, §7): the EOS id, or None (each window one document).
    docs = read_attr(a, "documents", int, default=0, required=False)
    hp["documents_eos"] = read_attr(a, "eos_id", int) if docs else None
    # z-loss (train.z_loss, docs/model.md §4, §7): the coefficient, and the step's mean term.
    hp["z_loss"] = read_attr(a, "z_loss", float, default=0.0, required=False)
    hp["z_loss_term"] = read_attr(a, "z_loss_term", float, default=0.0, required=False)
    return cfg, hp


def read_group(f, gname: str, shapes, dtype) -> Dict[str, torch.Tensor]:
    if gname not in f:
        raise DumpError(f"group /{gname} missing")
    g = f[gname]
    missing = [n for n in shapes if n not in g]
    extra = [n for n in g.keys() if n not in shapes]
    if missing:
        raise DumpError(f"/{gname}: {len(missing)} tensors missing, e.g. {missing[:3]}")
    if extra:
        raise DumpError(f"/{gname}: unexpected tensors {extra[:5]}")
    out = {}
    for n, sh in shapes.items():
        arr = np.asarray(g[n][()])
        if tuple(arr.shape) != tuple(sh):
            if arr.size == math.prod(sh) and len(sh) == 1:
                arr = arr.reshape(sh)  # e.g. phi stored as a 0-d scalar
            else:
                raise DumpError(f"/{gname}/{n}: shape {arr.shape}, expected {tuple(sh)}")
        out[n] = torch.from_numpy(np.ascontiguousarray(arr)).to(dtype)
    return out


def read_scalar(f, name: str) -> float:
    if name not in f:
        raise DumpError(f"dataset /{name} missing")
    return float(_scalar(f[name][()]))


# --------------------------------------------------------------------------
# Metrics / table
# --------------------------------------------------------------------------
def rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    """||a - b|| / ||b|| in float64 (absolute ||a|| when ||b|| = 0)."""
    a = a.detach().to(torch.float64)
    b = b.detach().to(torch.float64)
    nb = float(b.norm())
    nd = float((a - b).norm())
    if nb == 0.0:
        return nd
    return nd / nb


class Report:
    def __init__(self, verbose: bool):
        self.rows: List[tuple] = []
        self.failures: List[str] = []
        self.verbose = verbose

    def check(self, step: int, what: str, metric: str, value: float, tol: Optional[float],
              detail: str = "") -> bool:
        ok = True if tol is None else (math.isfinite(value) and value < tol)
        self.rows.append((what, metric, value, tol, ok, detail))
        if not ok:
            self.failures.append(f"step {step}: {what} {metric} = {value:.3e} >= tol {tol:.1e} {detail}".rstrip())
        return ok

    def info(self, what: str, metric: str, text: str) -> None:
        self.rows.append((what, metric, text, None, None, ""))

    def tensors(self, step: int, what: str, errs: Dict[str, float], tol: float,
                scalar_tol: Optional[Dict[str, float]] = None) -> None:
        """scalar_tol: per-name tolerance overriding tol (single-element tensors)."""
        tols = {k: (scalar_tol or {}).get(k, tol) for k in errs}
        worst = max(errs, key=lambda k: errs[k] / tols[k])
        bad = [k for k, e in errs.items() if not (math.isfinite(e) and e < tols[k])]
        self.rows.append((f"{what} ({len(errs)} tensors)", "max rel", errs[worst], tols[worst], not bad, worst))
        for k in bad:
            self.failures.append(f"step {step}: {what}/{k} rel = {errs[k]:.3e} >= tol {tols[k]:.1e}")
        if self.verbose or bad:
            for k, e in errs.items():
                if self.verbose or k in bad:
                    self.rows.append((f"  {what}/{k}", "rel", e, tols[k], e < tols[k], ""))

    def flush(self, header: str) -> None:
        print(header)
        print(f"  {'check':<44} {'metric':<10} {'value':>12} {'tol':>9}  ok")
        for what, metric, value, tol, ok, detail in self.rows:
            v = f"{value:12.3e}" if isinstance(value, float) else f"{value:>12}"
            t = f"{tol:9.1e}" if tol is not None else f"{'-':>9}"
            o = "" if ok is None else ("OK" if ok else "FAIL")
            print(f"  {what:<44} {metric:<10} {v} {t}  {o:<4} {detail}".rstrip())
        self.rows = []


# --------------------------------------------------------------------------
# Main
# --------------------------------------------------------------------------
def build_argparser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("dumps", nargs="+")
    ap.add_argument("--tol-grad", type=float, default=1e-4)
    ap.add_argument("--tol-scalar-grad", type=float, default=None,
                    help="tolerance for single-element gradients and moments (the ctx gate "
                         "logit phi: its gradient is a cancelling sum over B*T*H*d_h products, "
                         "so fp32 rounding is amplified); default: --tol-grad")
    ap.add_argument("--tol-param", type=float, default=1e-5)
    ap.add_argument("--tol-logits", type=float, default=1e-4)
    ap.add_argument("--tol-loss", type=float, default=1e-5)
    ap.add_argument("--tol-lr", type=float, default=1e-6)
    ap.add_argument("--dtype", default="float32", choices=["float32", "float64"])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--verbose", "-v", action="store_true", help="print every tensor")
    return ap


def run(a) -> int:
    W.set_threads(a.threads)
    dtype = getattr(torch, a.dtype)
    rep = Report(a.verbose)
    cfg = None
    params = state = None
    prev_step = None
    for di, path in enumerate(a.dumps):
        with h5py.File(path, "r") as f:
            dcfg, hp = read_config(f)
            step = hp["step"]
            if cfg is None:
                cfg = dcfg
                shapes = W.param_shapes(cfg)
                print(f"config: {W.dataclasses.asdict(cfg)}  params: {W.param_count(cfg):,}  "
                      f"dtype: {a.dtype}  ATM layers: {list(cfg.atm_layers) if cfg.atm else 'off'}")
                params = {k: v.requires_grad_(True) for k, v in read_group(f, "params", shapes, dtype).items()}
                if step > 1:
                    if "optim" not in f:
                        raise DumpError(f"{path}: step {step} > 1 but /optim missing")
                    state = {"m": read_group(f, "optim/m", shapes, dtype),
                             "v": read_group(f, "optim/v", shapes, dtype)}
                else:
                    state = W.new_adam_state(params)
            else:
                if W.dataclasses.asdict(dcfg) != W.dataclasses.asdict(cfg):
                    raise DumpError(f"{path}: model config differs from the first dump")
                if step != prev_step + 1:
                    raise DumpError(f"{path}: step {step} does not follow step {prev_step}")
            prev_step = step

            stol = {k: (a.tol_scalar_grad if a.tol_scalar_grad is not None else a.tol_grad)
                    for k, sh in shapes.items() if math.prod(sh) == 1}
            tokens = torch.from_numpy(np.asarray(f["tokens"][()]).astype(np.int64))
            if tokens.ndim != 2 or tokens.shape[1] != cfg.T + 1:
                raise DumpError(f"{path}: /tokens shape {tuple(tokens.shape)}, expected [B, {cfg.T + 1}]")
            if int(tokens.min()) < 0 or int(tokens.max()) >= cfg.V:
                raise DumpError(f"{path}: token id out of range [0, {cfg.V})")
            B = tokens.shape[0]
            d_params = read_group(f, "params", shapes, dtype)
            d_grads = read_group(f, "grads", shapes, torch.float64)
            d_after = read_group(f, "params_after", shapes, torch.float64)
            d_loss = read_scalar(f, "loss")
            d_norm = read_scalar(f, "grad_norm")
            d_logits = torch.from_numpy(np.asarray(f["logits"][()])) if "logits" in f else None
            d_starts = np.asarray(f["doc_start"][()]) if "doc_start" in f else None
            d_m = d_v = None
            if step > 1 and di > 0:
                if "optim" not in f:
                    raise DumpError(f"{path}: step {step} > 1 but /optim missing")
                d_m = read_group(f, "optim/m", shapes, torch.float64)
                d_v = read_group(f, "optim/v", shapes, torch.float64)
            inject = {}
            if cfg.atm:
                g = f["atm"] if "atm" in f else {}
                for l in cfg.atm_layers:
                    key = f"layer_{l}"
                    if key not in g:
                        raise DumpError(f"{path}: /atm/{key} missing (ATM is on)")
                    mo = np.asarray(g[key][()])
                    if mo.shape != (B, cfg.T):
                        raise DumpError(f"{path}: /atm/{key} shape {mo.shape}, expected {(B, cfg.T)}")
                    inject[l] = torch.from_numpy(mo.astype(np.bool_))
                    W.validate_merge_open(inject[l])
                extra = [k for k in g.keys() if k not in {f"layer_{l}" for l in cfg.atm_layers}]
                if extra:
                    raise DumpError(f"{path}: /atm has entries for non-ATM layers: {extra}")

        # ---- consistency of the carried state (dumps after the first) ----
        if di > 0:
            rep.tensors(step, "params (carried vs dump)",
                        {k: rel_err(params[k], d_params[k]) for k in shapes}, a.tol_param)
            if d_m is not None:
                rep.tensors(step, "optim/m", {k: rel_err(state["m"][k], d_m[k]) for k in shapes}, a.tol_grad, stol)
                rep.tensors(step, "optim/v", {k: rel_err(state["v"][k], d_v[k]) for k in shapes}, a.tol_grad, stol)

        # ---- forward / backward with the dump's merge decisions ----
        inputs, targets = tokens[:, :-1], tokens[:, 1:]
        eos = hp["documents_eos"]
        if eos is None:
            logits, aux = W.forward(params, cfg, inputs, training=True, merge_open=inject or None)
            loss = W.cross_entropy_loss(logits, targets)
        else:  # each document alone; the mean over the counted targets
            logits, aux = W.forward_documents(params, cfg, inputs, eos, training=True, merge_open=inject or None)
            loss, counted = W.documents_loss(logits, inputs, targets, eos)
            lens = [(e - s, int(row[s]) == eos) for row in inputs for s, e in W.document_spans(row, eos)]
            if d_starts is not None:  # the dump's document starts (docs/model.md §7) vs the reference's
                want = np.zeros(tuple(inputs.shape), dtype=np.int64)
                for b, row in enumerate(inputs):
                    for s0, e0 in W.document_spans(row, eos):
                        want[b, s0:e0] = s0
                bad = int((d_starts.astype(np.int64) != want).sum()) if d_starts.shape == want.shape else want.size
                rep.check(step, "doc_start", "mismatches", float(bad), 0.5)
            rep.info("documents", "count", f"eos {eos}: {len(lens)} documents in {B} windows "
                     f"(lengths {min(n for n, _ in lens)}..{max(n for n, _ in lens)}, "
                     f"{sum(1 for n, e in lens if n == 1 and e)} only an EOS), "
                     f"{counted}/{inputs.numel()} targets counted")
        objective = loss
        if hp["z_loss"] > 0:  # the z-loss term over the same counted targets, beside the CE
            zt = W.z_loss_term(logits, None if eos is None else inputs != eos)
            objective = loss + hp["z_loss"] * zt
            zv, dz = hp["z_loss"] * float(zt.detach()), hp["z_loss_term"]
            rep.check(step, "z_loss term", "rel", abs(zv - dz) / max(abs(dz), 1e-30), a.tol_loss,
                      f"ref {zv:.8f} dump {dz:.8f} (z = {hp['z_loss']:g})")
        names = list(shapes)
        grads = dict(zip(names, torch.autograd.grad(objective, [params[n] for n in names])))

        for l in sorted(inject):
            own = aux["own_merge_open"][l]
            agree = int((own == inject[l]).sum())
            rep.info(f"atm layer {l} merge decisions", "agree",
                     f"{agree}/{own.numel()} ({100.0 * agree / own.numel():.2f}%) "
                     f"pairs dump {int(inject[l].sum())} own {int(own.sum())}")
        if d_logits is not None:
            if tuple(d_logits.shape) != tuple(logits.shape):
                raise DumpError(f"{path}: /logits shape {tuple(d_logits.shape)}, expected {tuple(logits.shape)}")
            rep.info("logits", "max abs", f"{float((logits.detach().double() - d_logits.double()).abs().max()):.3e}")
            rep.check(step, "logits", "rel", rel_err(logits, d_logits), a.tol_logits)
        else:
            rep.info("logits", "-", "no /logits in dump")
        lv = float(loss.detach())
        rep.check(step, "loss", "rel", abs(lv - d_loss) / max(abs(d_loss), 1e-30), a.tol_loss,
                  f"ref {lv:.8f} dump {d_loss:.8f}")
        rep.tensors(step, "grads", {k: rel_err(grads[k], d_grads[k]) for k in shapes}, a.tol_grad, stol)
        tot = math.sqrt(sum(float((grads[k].double() - d_grads[k]).pow(2).sum()) for k in shapes))
        rep.info("grads (all, concatenated)", "rel", f"{tot / max(d_norm, 1e-30):.3e}")

        # ---- clip + AdamW with the dump's hyper-parameters ----
        lr_sched = W.lr_at(step, hp["t_max"], hp["lr_max"], hp["lr_min"], hp["warmup"])
        rep.check(step, "lr vs docs/model.md §4 schedule", "rel",
                  abs(hp["lr"] - lr_sched) / max(abs(lr_sched), 1e-30) if lr_sched else abs(hp["lr"]),
                  a.tol_lr, f"dump {hp['lr']:.6e} schedule {lr_sched:.6e}")
        gcl = {k: g.detach().clone() for k, g in grads.items()}
        norm, coef = W.clip_grads_(gcl, hp["clip"])
        rep.check(step, "grad_norm", "rel", abs(norm - d_norm) / max(abs(d_norm), 1e-30), a.tol_grad,
                  f"ref {norm:.6e} dump {d_norm:.6e} clip coef {coef:.4f}")
        if math.isfinite(norm):
            # Bias correction counts applied updates (a skipped step does not count).
            adam_t = hp["adam_step"] if hp["adam_step"] is not None else step
            W.adamw_update_(params, gcl, state, hp["lr"], adam_t, hp["beta1"], hp["beta2"],
                            hp["adam_eps"], hp["weight_decay"])
        else:
            rep.info("update", "-", "non-finite gradient norm: step skipped")
        rep.tensors(step, "params_after", {k: rel_err(params[k], d_after[k]) for k in shapes}, a.tol_param)
        mad = max(float((params[k].detach().double() - d_after[k]).abs().max()) for k in shapes)
        rep.info("params_after (all)", "max abs", f"{mad:.3e} = {mad / hp['lr'] if hp['lr'] else 0.0:.3f} lr")
        rep.flush(f"== step {step}: {os.path.basename(path)}  B={B} T={cfg.T} lr={hp['lr']:.4e} "
                  f"loss={lv:.6f} ==")
    if rep.failures:
        print(f"\nFAIL: {len(rep.failures)} check(s) out of tolerance:")
        for m in rep.failures[:50]:
            print("  " + m)
        if len(rep.failures) > 50:
            print(f"  ... and {len(rep.failures) - 50} more")
        return 1
    print(f"\nPASS: {len(a.dumps)} step(s) within tolerance "
          f"(grad {a.tol_grad:.0e}, param {a.tol_param:.0e}, logits {a.tol_logits:.0e}, loss {a.tol_loss:.0e})")
    return 0


def main(argv=None) -> int:
    a = build_argparser().parse_args(argv)
    try:
        return run(a)
    except (DumpError, KeyError, OSError, ValueError) as e:
        print(f"ERROR: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
