#!/usr/bin/env python3
"""The planner's exact figures against real runs (issue: predicted traffic
bytes and bubble exact). For each layout: a short `wiola train` under
mpirun, and `wiola plan --cpu` with the same config overrides. Checked:
  - wire bytes per rank per step of every group (tp, pp, dp, embed): the
    communicators' count (report.json) equals the plan's, max over ranks;
  - the predicted pipeline bubble's formula ((p-1)/(m+p-1); interleaved:
    ((p-1)/v)/(m+(p-1)/v)) is the plan's;
  - memory per rank by class: the cost model's figures (the plan's fullest
    rank, and report.json's predicted column) equal what the ranks allocated;
  - report.json carries MFU, a time breakdown whose parts add up to the step,
    and an accounting share below 1 %.
Timing predictions are checked by bench/plan_check.py (a benchmark)."""
import argparse
import json
import os
import subprocess
import sys

LAYOUTS = [  # name, ranks, overrides
    ("tp2", 2, ["parallel.tp=2", "train.grad_accum=2"]),
    ("pp2", 2, ["parallel.pp=2", "train.grad_accum=4"]),
    ("dp2_zero", 2, ["parallel.dp=2", "train.grad_accum=2"]),
    ("dp2_nozero_recompute", 2, ["parallel.dp=2", "parallel.zero=false", "train.recompute=true"]),
    ("tp2_pp2", 4, ["parallel.tp=2", "parallel.pp=2", "train.grad_accum=3"]),
    ("pp4_gpipe", 4, ["parallel.pp=4", "parallel.schedule=gpipe", "train.grad_accum=4"]),
    # The chunked schedules (issue 37) on 8 layers: chunks' messages (none
    # between two chunks of one rank), the embedding's ends, per-chunk slots.
    ("pp2_interleaved", 2, ["model.n_layers=8", "parallel.pp=2", "parallel.schedule=interleaved",
                            "train.grad_accum=4"]),
    ("tp2_pp2_zbv", 4, ["model.n_layers=8", "parallel.tp=2", "parallel.pp=2", "parallel.schedule=zb-v",
                        "train.grad_accum=3"]),
]


def run(cmd, env):
    p = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if p.returncode != 0:
        sys.exit(f"FAILED ({p.returncode}): {' '.join(cmd)}\n{p.stdout[-3000:]}\n{p.stderr[-3000:]}")
    return p.stdout


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--wiola", required=True)
    ap.add_argument("--text", required=True)
    ap.add_argument("--tokenizer", required=True)
    ap.add_argument("--work", required=True)
    a = ap.parse_args()
    os.makedirs(a.work, exist_ok=True)
    env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
               OMPI_MCA_rmaps_base_oversubscribe="1", OMP_NUM_THREADS="1")
    text = os.path.join(a.work, "slice.txt")
    with open(a.text, encoding="utf-8") as f, open(text, "w", encoding="utf-8") as g:
        g.write(f.read(400_000))
    shards = os.path.join(a.work, "shards")
    if not os.path.exists(os.path.join(shards, "manifest.json")):
        run([a.wiola, "prep", "--no-progress", "--tokenizer", a.tokenizer, "--output", shards, text], env)
    common = ["model.preset=wiola-tiny", "model.vocab_size=32000", "train.micro_batch=2", "train.steps=4",
              "train.threads=1", "train.lr_max=1e-3", f"data.path={shards}/manifest.json"]
    failures = []
    for name, n, sets in LAYOUTS:
        run_dir = os.path.join(a.work, name)
        args = []
        for s in common + sets:
            args += ["--set", s]
        run(["mpirun", "-np", str(n), "--bind-to", "none", a.wiola, "train", "-q", *args,
             "--set", f"train.run_dir={run_dir}"], env)
        plan_json = os.path.join(a.work, name + ".plan.json")
        run([a.wiola, "plan", "--cpu", "--reps", "1", "--json", plan_json, *args], env)
        rep = json.load(open(os.path.join(run_dir, "report.json")))
        plan = json.load(open(plan_json))["predictions"][0]

        def check(what, got, want, rel=1e-9):
            ok = abs(got - want) <= rel * max(abs(want), 1.0)
            print(f"  {name:22s} {what:28s} run {got:16.6f}  plan {want:16.6f}  {'ok' if ok else 'DIFFERENT'}")
            if not ok:
                failures.append(f"{name}: {what}: run {got} plan {want}")

        comm = rep.get("comm_per_rank_per_step", {})
        for g in ["tp", "pp", "dp", "embed"]:
            got = comm.get(g, {}).get("measured_bytes", 0.0)
            check(f"{g} wire bytes/step", got, plan["traffic_bytes"][g])
        check("bubble formula", rep["bubble_formula"], plan["bubble_analytic"])
        mem = rep["memory_mib_per_rank"]
        fullest = max(sum(r[k] for k in ("params", "grads", "optimizer", "activations")) for r in mem)
        check("memory MiB, fullest rank", fullest, plan["memory_gib"]["total"] * 1024)
        for i, r in enumerate(mem):
            for k in ("params", "grads", "optimizer", "activations"):
                check(f"rank {i} {k} MiB (cost model)", r[k], r["predicted"][k])
        # The accounting: MFU, parts that add up, its own cost.
        tm = rep["time_per_step_s"]["mean"]
        parts = sum(tm[k] for k in ("compute", "comm", "bubble", "data", "optimizer", "checkpoint", "other"))
        check("breakdown parts = total", parts, tm["total"], rel=1e-6)
        if not (0 < rep["mfu"] <= 1.0):  # the CPU peak bounds the step (issue 47)
            failures.append(f"{name}: MFU {rep['mfu']} out of range")
        if not rep["accounting_share"] < 0.01:
            failures.append(f"{name}: accounting took {100 * rep['accounting_share']:.2f} % of the step")
        if "pp" in name and not tm["bubble"] > 0:
            failures.append(f"{name}: no bubble measured in a pipeline run")
    if failures:
        print("FAILED:\n  " + "\n  ".join(failures))
        return 1
    print(f"plan_vs_run: {len(LAYOUTS)} layouts: traffic, bubble and memory exact")
    return 0


if __name__ == "__main__":
    sys.exit(main())
