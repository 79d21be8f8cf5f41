#!/usr/bin/env python3
"""Equivalence of two training runs (docs/model.md §5, issue 4):
  - every loss of metrics.jsonl within --tol relative (and every z-loss
    term, train.z_loss, where the reference has them);
  - the final parameters (/params_after of the step dumps) within --tol
    relative, norm-wise over the whole model: ||a-b||_2 / ||a||_2;
  - each tensor norm-wise within --tol-tensor (default 1e-4);
  - where the run scored tasks (train.eval_tasks), the reference scored them at
    the same steps: acc and acc_norm equal, the gold log-likelihood within
    --tol-tensor relative.
Why the per-tensor bound is looser: AdamW's update is ~lr whatever the
gradient's size, and m is a cancelling sum over steps, so fp32
summation-order rounding of the gradients (~1e-7) reaches ~1e-5 in a few
tensors after 10 steps. Changing only the micro-batch split inside one
process (no parallelism at all) already moves the worst tensor by 1.2e-5;
a real error (a missing reduction, a wrong shard) moves a tensor by 1e-3 or
more. Element-wise figures are printed, not judged (an element whose
gradient is nearly zero can move by up to lr). Prints the worst figures; exits 1 naming what differs.

usage: compare_runs.py REF_RUN_DIR REF_DUMP.h5 RUN_DIR DUMP.h5 [--tol 1e-5]
       [--tol-tensor 1e-4] [--atm-flips 0]"""
import argparse
import json
import sys

import h5py
import numpy as np


def losses(run_dir, key="loss"):
    """The run's losses (or another field); a non-finite one (written as
    null) or a missing one reads as NaN."""
    with open(f"{run_dir}/metrics.jsonl") as f:
        out = [json.loads(line).get(key) for line in f if line.strip()]
    return [float("nan") if x is None else x for x in out]


def task_scores(run_dir):
    """{step: {"NAME/acc": ..., ...}} of the records with task scores."""
    with open(f"{run_dir}/metrics.jsonl") as f:
        recs = [json.loads(line) for line in f if line.strip()]
    return {r["step"]: r["tasks"] for r in recs if "tasks" in r}


def compare_tasks(ref_run, run, tol, bad):
    """Appends to `bad` where the run's task scores differ from the reference's; returns a summary."""
    ref, got = task_scores(ref_run), task_scores(run)
    worst = 0.0
    for step, scores in got.items():
        if step not in ref:
            bad.append(f"step {step}: task scores here, none in the reference"); continue
        for key, v in scores.items():
            r = ref[step].get(key)
            if r is None:
                bad.append(f"step {step}: task score {key} missing in the reference")
            elif key.endswith("/gold_loglik"):
                rel = abs(v - r) / max(1.0, abs(r))
                worst = max(worst, rel)
                if not rel < tol:
                    bad.append(f"step {step}: {key} {v!r} vs reference {r!r} (rel {rel:.2e})")
            elif v != r:
                bad.append(f"step {step}: {key} {v!r} vs reference {r!r}")
    return f"; task scores at {len(got)} steps equal (gold log-likelihood worst rel {worst:.2e})" if got else ""


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("ref_run"); ap.add_argument("ref_dump")
    ap.add_argument("run"); ap.add_argument("dump")
    ap.add_argument("--tol", type=float, default=1e-5)
    ap.add_argument("--tol-tensor", type=float, default=1e-4)
    ap.add_argument("--atm-flips", type=float, default=0.0,
                    help="largest share of ATM merge decisions allowed to differ (bf16: near tau they may flip)")
    ap.add_argument("--exact", action="store_true",
                    help="bit for bit: every loss and every dataset of the dumps identical")
    a = ap.parse_args()
    if a.exact:
        return exact(a)
    bad = []
    lr, lo = losses(a.ref_run), losses(a.run)
    if len(lr) != len(lo) or not lr:
        bad.append(f"loss count: {len(lr)} reference steps, {len(lo)} here")
    worst_loss = 0.0
    for i, (x, y) in enumerate(zip(lr, lo)):
        rel = abs(x - y) / abs(x)
        worst_loss = max(worst_loss, rel)
        if not rel < a.tol:
            bad.append(f"step {i + 1}: loss {y!r} vs reference {x!r} (rel {rel:.2e})")
    zr, zo = losses(a.ref_run, "z_loss"), losses(a.run, "z_loss")
    for i, (x, y) in enumerate(zip(zr, zo)):
        if x == x and not abs(x - y) / abs(x) < a.tol:  # the reference trained with z-loss
            bad.append(f"step {i + 1}: z_loss {y!r} vs reference {x!r}")
    worst_p, worst_name, n, worst_e = 0.0, "", 0, 0.0
    sq_d, sq_r = 0.0, 0.0
    with h5py.File(a.ref_dump, "r") as fr, h5py.File(a.dump, "r") as fo:
        if int(fr["/config"].attrs["step"]) != int(fo["/config"].attrs["step"]):
            bad.append("dumps are of different steps")
        for name, ds in fr["/params_after"].items():
            if name not in fo["/params_after"]:
                bad.append(f"{name}: missing"); continue
            r = np.asarray(ds, dtype=np.float64); o = np.asarray(fo["/params_after"][name], dtype=np.float64)
            if r.shape != o.shape:
                bad.append(f"{name}: shape {o.shape} vs {r.shape}"); continue
            rel = float(np.linalg.norm(r - o) / max(np.linalg.norm(r), 1e-30))
            worst_e = max(worst_e, float(np.max(np.abs(r - o)) / max(np.max(np.abs(r)), 1e-30)))
            n += 1
            if rel > worst_p: worst_p, worst_name = rel, name
            sq_d += float(np.sum((r - o) ** 2)); sq_r += float(np.sum(r ** 2))
            if not rel < a.tol_tensor:
                bad.append(f"{name}: final parameters differ by {rel:.2e} relative")
        flips, decisions = 0, 0
        if "atm" in fr:
            for lname, ds in fr["atm"].items():
                x, y = np.asarray(ds), np.asarray(fo["atm"][lname])
                if x.shape != y.shape:
                    bad.append(f"/atm/{lname}: shape {y.shape} vs {x.shape}"); continue
                differ = int(np.count_nonzero(x != y))
                flips += differ; decisions += x.size
                if differ > a.atm_flips * x.size:
                    bad.append(f"/atm/{lname}: {differ} of {x.size} merge decisions differ")
    tasks = compare_tasks(a.ref_run, a.run, a.tol_tensor, bad)
    model_rel = (sq_d / sq_r) ** 0.5 if sq_r > 0 else 0.0
    if not model_rel < a.tol:
        bad.append(f"final parameters (whole model) differ by {model_rel:.2e} relative")
    print(f"{len(lr)} losses: worst rel {worst_loss:.2e}; final parameters (whole model, L2) rel {model_rel:.2e}; "
          f"{n} tensors: worst rel (L2) {worst_p:.2e} ({worst_name}); "
          f"element-wise max|a-b|/max|a| {worst_e:.2e}; ATM decisions differing {flips} of {decisions}{tasks}")
    if bad:
        print("NOT EQUIVALENT:\n  " + "\n  ".join(bad[:20]))
        return 1
    return 0


def exact(a):
    """Two runs that must agree bit for bit (same layout, threads and SIMD
    target on two backends, e.g. cpu and cpu-opaque)."""
    bad = []
    lr, lo = losses(a.ref_run), losses(a.run)
    if lr != lo:
        bad.append(f"losses differ: {lo} vs reference {lr}")
    n = 0
    with h5py.File(a.ref_dump, "r") as fr, h5py.File(a.dump, "r") as fo:
        names = []
        fr.visititems(lambda name, obj: names.append(name) if isinstance(obj, h5py.Dataset) else None)
        for name in names:
            n += 1
            if name not in fo:
                bad.append(f"/{name}: missing"); continue
            x, y = np.asarray(fr[name]), np.asarray(fo[name])
            if x.shape != y.shape or x.dtype != y.dtype or x.tobytes() != y.tobytes():
                bad.append(f"/{name}: differs")
    print(f"{len(lr)} losses, {n} dump datasets compared bit for bit: {len(bad)} differ")
    if bad:
        print("NOT IDENTICAL:\n  " + "\n  ".join(bad[:20]))
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
