#!/usr/bin/env python3
"""The planner against measured runs it was not fitted on (docs/performance.md).

Calibration: `wiola plan --cpu` times each layout's stage work in one
process (single-rank op timings, alone and with the other ranks' cores busy
with copies) and takes the transport from a collective microbenchmark
(`mpirun -np 2 wiola plan --calibrate-link`); no training run feeds it.
Every layout (ranks x threads <= this host's cores) is predicted and trained
in each of REPEATS rounds, round-robin, so the shared host's drifting speed
touches both; the medians are compared: step time within 15 %, traffic
bytes and bubble exact, layouts in the same order. Writes
WORK/plan_check.md, WORK/plan_check.json and WORK/plan_check.png.

Several nodes (--cluster DIR, a cluster of scripts/local_cluster.sh that is
up, 2 nodes x 2 slots): the link calibrated across it (inside a node and
between nodes, `wiola plan --calibrate-link` under launch/mpirun.sh
--hostfile), and 4-rank layouts trained across the nodes with TP inside a
node (mpirun's --map-by slot: "block") or across them (--map-by node:
"round-robin"), each predicted with its placement (`wiola plan --cpu --link
--placement`); --rates 1gbit,10gbit repeats it all at each link rate.

usage: bench/plan_check.py [--work runs/plan-check] [--repeats 5] [--steps 8] [--model wiola-small]
                           [--cluster DIR [--rates 1gbit,10gbit]]
"""
import argparse
import json
import os
import statistics
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)

# name, ranks, threads per rank, overrides (global batch 8 sequences everywhere)
LAYOUTS = [
    ("single_2t", 1, 2, ["train.grad_accum=4"]),
    ("single_1t", 1, 1, ["train.grad_accum=4"]),
    ("dp2_zero", 2, 1, ["parallel.dp=2", "train.grad_accum=2"]),
    ("dp2_nozero", 2, 1, ["parallel.dp=2", "train.grad_accum=2", "parallel.zero=false"]),
    ("tp2", 2, 1, ["parallel.tp=2", "train.grad_accum=4"]),
    ("pp2", 2, 1, ["parallel.pp=2", "train.grad_accum=4"]),
    ("pp2_gpipe", 2, 1, ["parallel.pp=2", "train.grad_accum=4", "parallel.schedule=gpipe"]),
    ("tp2_recompute", 2, 1, ["parallel.tp=2", "train.grad_accum=4", "train.recompute=true"]),
]


# Across two nodes of two ranks: name, placement, overrides (global batch 8).
CLUSTER_LAYOUTS = [
    ("tp2_dp2", "block", ["parallel.tp=2", "parallel.dp=2", "train.grad_accum=2"]),
    ("tp2_dp2_tp_across", "round-robin", ["parallel.tp=2", "parallel.dp=2", "train.grad_accum=2"]),
    ("tp2_pp2", "block", ["parallel.tp=2", "parallel.pp=2", "train.grad_accum=4"]),
    ("pp2_dp2", "block", ["parallel.pp=2", "parallel.dp=2", "train.grad_accum=2"]),
    ("dp4", "block", ["parallel.dp=4", "train.grad_accum=1"]),
]


class Cluster:
    """Commands on a scripts/local_cluster.sh cluster (None: this machine)."""

    def __init__(self, path):
        self.path = path

    def mpirun(self, n, placement="block"):
        if not self.path:
            return ["mpirun", "-np", str(n), "--bind-to", "none"]
        lc = os.path.join(ROOT, "scripts", "local_cluster.sh")
        extra = ["--map-by", "node"] if placement == "round-robin" else []
        return ["bash", lc, "exec", self.path, "node1", "bash", os.path.join(ROOT, "launch", "mpirun.sh"),
                "--hostfile", os.path.join(self.path, "hostfile"), "-np", str(n), *extra, "--"]

    def rate(self, rate):
        subprocess.run(["bash", os.path.join(ROOT, "scripts", "local_cluster.sh"), "rate", self.path, rate], check=True)


def sh(cmd, env):
    p = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if p.returncode != 0:
        sys.exit(f"FAILED: {' '.join(cmd)}\n{p.stdout[-2000:]}\n{p.stderr[-2000:]}")
    return p.stdout


def prepare_shards(a, env):
    shards = os.path.join(a.work, "shards")
    if not os.path.exists(os.path.join(shards, "manifest.json")):
        txt = os.path.join(a.work, "brown.txt")
        subprocess.run(f"xz -dc {ROOT}/data/brown/brown.txt.xz > {txt}", shell=True, check=True)
        sh([a.wiola, "prep", "--no-progress", "--tokenizer", f"{ROOT}/data/wiola360m/tokenizer.json",
            "--output", shards, txt], env)
    return shards


def run_rounds(a, env, shards, cl, link, todo, tag):
    """Round-robin: in every round each layout is predicted (a fresh
    calibration: single-rank timings only) and then trained, so the shared
    host's drifting speed touches predictions and runs alike."""
    for r in range(a.repeats):
        for name, n, t, placement, args, preds, steps, reps in todo:
            pj = os.path.join(a.work, f"{tag}{name}.plan{r}.json")
            place = ["--placement", placement] if cl.path else []
            sh([a.wiola, "plan", "--cpu", "--ranks", str(n), "--link", link, *place, "--json", pj, *args],
               dict(env, OMP_NUM_THREADS=str(t)))
            preds.append(json.load(open(pj))["predictions"][0])
            rd = os.path.join(a.work, f"{tag}{name}.run{r}")
            sh([*cl.mpirun(n, placement), a.wiola, "train", "-q", *args, "--set", f"train.run_dir={rd}",
                "--set", "checkpoint.dir="], dict(env, OMP_NUM_THREADS=str(t)))
            rep = json.load(open(os.path.join(rd, "report.json")))
            steps.append(rep["time_per_step_s"]["mean"]["total"])
            reps.append(rep)
        print(f"  round {r + 1}/{a.repeats} done", flush=True)


def compare(todo):
    rows = []
    for name, n, t, placement, args, preds, steps, reps in todo:
        meas = statistics.median(steps)
        pred = dict(preds[0], step_s=statistics.median(p["step_s"] for p in preds))
        comm = reps[0].get("comm_per_rank_per_step", {})
        traffic_ok = all(abs(comm.get(g, {}).get("measured_bytes", 0.0) - pred["traffic_bytes"][g]) < 0.5
                         for g in ("tp", "pp", "dp", "embed"))
        bubble_ok = abs(reps[0]["bubble_formula"] - pred["bubble_analytic"]) < 1e-12
        row = {"name": name, "ranks": n, "threads": t, "placement": placement,
               "links": reps[0].get("placement", {}).get("links", {}), "predicted_s": pred["step_s"],
               "predicted_all_s": [p["step_s"] for p in preds], "measured_s": meas,
               "measured_all_s": steps, "error": pred["step_s"] / meas - 1, "traffic_exact": traffic_ok,
               "bubble_exact": bubble_ok, "bubble_sim": pred["bubble_sim"],
               "bubble_measured": reps[0].get("bubble_measured", 0.0)}
        rows.append(row)
        print(f"  {name:18s} {n} x {t}: predicted {pred['step_s'] * 1e3:7.1f} ms "
              f"({', '.join(f'{p * 1e3:.0f}' for p in row['predicted_all_s'])}), measured {meas * 1e3:7.1f} ms "
              f"(runs {', '.join(f'{x * 1e3:.0f}' for x in steps)}), error {100 * row['error']:+5.1f} %, "
              f"traffic {'exact' if traffic_ok else 'DIFFERENT'}, bubble {'exact' if bubble_ok else 'DIFFERENT'}",
              flush=True)
    return rows


def ranking(rows):
    """Pairs in a different order, ignoring pairs whose measured runs overlap."""
    inversions, ties = [], 0
    for i in range(len(rows)):
        for j in range(i + 1, len(rows)):
            x, y = rows[i], rows[j]
            overlap = max(x["measured_all_s"]) >= min(y["measured_all_s"]) and max(y["measured_all_s"]) >= min(x["measured_all_s"])
            if (x["predicted_s"] < y["predicted_s"]) != (x["measured_s"] < y["measured_s"]):
                if overlap:
                    ties += 1
                else:
                    inversions.append(f"{x['name']} / {y['name']}")
    return inversions, ties


def write_report(a, rows, tag, title, link_line):
    inversions, ties = ranking(rows)
    worst = max(abs(r["error"]) for r in rows)
    ok = worst <= 0.15 and all(r["traffic_exact"] and r["bubble_exact"] for r in rows) and not inversions
    lines = [f"# Planner vs measured runs{title}", "",
             f"Host: {os.cpu_count()} cores. Model {a.model}, global batch 8, {a.steps} steps per run. {a.repeats} "
             "rounds; in each, every layout is predicted (fresh calibration: single-rank stage timings + the "
             "transport microbenchmark link.json; no training run is used) and then trained. Medians over the "
             f"rounds (measured: time per step, steps 2.., mean over ranks). {link_line}", "",
             "| layout | ranks x threads | links (tp/pp/dp) | predicted ms (rounds) | measured ms (runs) | error | traffic | bubble (p-1)/(m+p-1) | bubble sim. / meas. |",
             "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        links = "/".join(r["links"].get(k, "-") for k in ("tp", "pp", "dp")) if r["links"] else "-"
        lines.append(f"| {r['name']} | {r['ranks']} x {r['threads']} | {links} | {r['predicted_s'] * 1e3:.1f} "
                     f"({', '.join(f'{x * 1e3:.0f}' for x in r['predicted_all_s'])}) | "
                     f"{r['measured_s'] * 1e3:.1f} ({', '.join(f'{x * 1e3:.0f}' for x in r['measured_all_s'])}) | "
                     f"{100 * r['error']:+.1f} % | {'exact' if r['traffic_exact'] else 'different'} | "
                     f"{'exact' if r['bubble_exact'] else 'different'} | {r['bubble_sim']:.3f} / {r['bubble_measured']:.3f} |")
    lines += ["", f"Largest error {100 * worst:.1f} % (bar 15 %). Ranking: {len(inversions)} pair(s) in the wrong "
              f"order{': ' + ', '.join(inversions) if inversions else ''}; {ties} pair(s) swapped within the runs' "
              f"spread. Verdict: {'PASS' if ok else 'FAIL'}.", ""]
    md = "\n".join(lines)
    open(os.path.join(a.work, f"plan_check{tag}.md"), "w").write(md)
    json.dump(rows, open(os.path.join(a.work, f"plan_check{tag}.json"), "w"), indent=2)
    print(md)
    plot(rows, os.path.join(a.work, f"plan_check{tag}.png"), f"wiola plan --cpu vs measured runs{title}")
    return ok


def plot(rows, path, title):
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return
    fig, ax = plt.subplots(figsize=(8, 4))
    xs = range(len(rows))
    ax.bar([x - 0.2 for x in xs], [r["predicted_s"] * 1e3 for r in rows], 0.4, label="predicted")
    ax.bar([x + 0.2 for x in xs], [r["measured_s"] * 1e3 for r in rows], 0.4, label="measured (median)")
    ax.set_xticks(list(xs), [r["name"] for r in rows], rotation=30, ha="right")
    ax.set_ylabel("ms per step")
    ax.set_title(title)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def layout_args(a, shards, t, sets):
    args = []
    for s in [f"model.preset={a.model}", "model.vocab_size=32000", "train.micro_batch=2", f"train.threads={t}",
              f"data.path={shards}/manifest.json", "train.lr_max=1e-3", f"train.steps={a.steps}"] + sets:
        args += ["--set", s]
    return args


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--work", default=os.path.join(ROOT, "runs", "plan-check"))
    ap.add_argument("--wiola", default=os.path.join(ROOT, "build", "wiola"))
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--model", default="wiola-small")
    ap.add_argument("--cluster", default="", help="a scripts/local_cluster.sh cluster that is up (2 nodes x 2 slots)")
    ap.add_argument("--rates", default="1gbit,10gbit", help="--cluster: link rates, comma-separated")
    a = ap.parse_args()
    os.makedirs(a.work, exist_ok=True)
    env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
               OMPI_MCA_rmaps_base_oversubscribe="1")
    shards = prepare_shards(a, env)
    cl = Cluster(a.cluster)
    if not cl.path:
        link = os.path.join(a.work, "link.json")
        print("calibrating the transport (mpirun -np 2 wiola plan --calibrate-link) ...", flush=True)
        sh([*cl.mpirun(2), a.wiola, "plan", "--calibrate-link", link], env)
        todo = [(name, n, t, "block", layout_args(a, shards, t, sets), [], [], [])
                for name, n, t, sets in LAYOUTS if n * t <= os.cpu_count()]
        run_rounds(a, env, shards, cl, link, todo, "")
        return 0 if write_report(a, compare(todo), "", "", "") else 1
    ok = True
    for rate in a.rates.split(","):
        cl.rate(rate)
        tag = f"_{rate}"
        link = os.path.join(a.work, f"link{tag}.json")
        print(f"{rate}: calibrating the links across the cluster (wiola plan --calibrate-link on 4 ranks) ...",
              flush=True)
        sh([*cl.mpirun(4), a.wiola, "plan", "--calibrate-link", link], env)
        lj = json.load(open(link))
        link_line = (f"Cluster {a.cluster}, links limited to {rate}: inside a node {lj['gbs']:.2f} GB/s, "
                     f"between nodes {lj['inter']['gbs']:.2f} GB/s ({lj['inter']['latency_s'] * 1e6:.0f} us per "
                     "ring step), measured.")
        todo = [(name, 4, 1, placement, layout_args(a, shards, 1, sets), [], [], [])
                for name, placement, sets in CLUSTER_LAYOUTS]
        run_rounds(a, env, shards, cl, link, todo, f"{rate}_")
        rows = compare(todo)
        ok = write_report(a, rows, tag, f" across 2 nodes at {rate}", link_line) and ok
        by = {r["name"]: r for r in rows}
        inside, across = by["tp2_dp2"], by["tp2_dp2_tp_across"]
        right = (inside["predicted_s"] < across["predicted_s"]) == (inside["measured_s"] < across["measured_s"])
        print(f"{rate}: TP inside a node {inside['measured_s'] * 1e3:.1f} ms, across {across['measured_s'] * 1e3:.1f} ms "
              f"measured; predicted {inside['predicted_s'] * 1e3:.1f} / {across['predicted_s'] * 1e3:.1f} ms: "
              f"{'same order' if right else 'WRONG ORDER'}")
        ok = ok and right
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
