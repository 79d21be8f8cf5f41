#!/usr/bin/env python3
"""Plots of a `wiola bench scale` sweep from DIR/scale.csv:
DIR/throughput.png  tokens/s per configuration, with the ideal (baseline x busy cores)
DIR/breakdown.png   time per step stacked by part (mean over ranks)
DIR/memory.png      the most memory any rank holds, stacked by class, and its peak
DIR/predicted.png   the planner's predicted step beside the measured one (a sweep with --link)

usage: scale_plots.py DIR"""
import csv
import sys


def main():
    out = sys.argv[1]
    with open(f"{out}/scale.csv") as f:
        rows = [r for r in csv.DictReader(f)]
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = [r["name"] for r in rows]
    xs = list(range(len(rows)))
    ok = [r["status"] == "ok" for r in rows]
    fl = lambda r, k: float(r[k] or 0)

    fig, ax = plt.subplots(figsize=(max(6, 0.7 * len(rows) + 2), 4.5))
    tps = [fl(r, "tokens_per_s") for r in rows]
    ideal = [fl(r, "baseline_tokens_per_s") * fl(r, "ideal_speedup") for r in rows]
    ax.bar(xs, tps, color=["tab:blue" if o else "lightgray" for o in ok], label="measured")
    ax.scatter(xs, ideal, marker="_", s=600, color="black", label="ideal (baseline x busy cores)", zorder=3)
    for x, o in zip(xs, ok):
        if not o:
            ax.text(x, 0, "failed", rotation=90, ha="center", va="bottom", fontsize=8)
    ax.set_xticks(xs, names, rotation=60, ha="right", fontsize=7)
    ax.set_ylabel("tokens/s (whole job)")
    ax.set_title("Throughput per configuration")
    ax.legend()
    fig.tight_layout()
    fig.savefig(f"{out}/throughput.png", dpi=110)

    def stacked(fname, keys, suffix, ylabel, title, peak=False):
        fig, ax = plt.subplots(figsize=(max(6, 0.7 * len(rows) + 2), 4.5))
        bottom = [0.0] * len(rows)
        for k in keys:
            vals = [fl(r, k + suffix) for r in rows]
            ax.bar(xs, vals, bottom=bottom, label=k)
            bottom = [b + v for b, v in zip(bottom, vals)]
        if peak:
            ax.scatter(xs, [fl(r, "peak_mib") for r in rows], marker="_", s=600, color="black", label="peak (RSS)",
                       zorder=3)
        ax.set_xticks(xs, names, rotation=60, ha="right", fontsize=7)
        ax.set_ylabel(ylabel)
        ax.set_title(title)
        ax.legend(fontsize=8)
        fig.tight_layout()
        fig.savefig(f"{out}/{fname}", dpi=110)

    stacked("breakdown.png", ["compute", "comm", "bubble", "data", "optimizer", "checkpoint", "other"], "_ms",
            "ms per step (mean over ranks)", "Where a step's time goes")
    stacked("memory.png", ["params", "grads", "optimizer", "activations"], "_mib",
            "MiB (the fullest rank per class)", "Memory per rank by class", peak=True)
    pred = [fl(r, "step_predicted_ms") if "step_predicted_ms" in r else 0.0 for r in rows]
    if any(p > 0 for p in pred):
        fig, ax = plt.subplots(figsize=(max(6, 0.7 * len(rows) + 2), 4.5))
        ax.bar([x - 0.2 for x in xs], pred, 0.4, label="predicted (wiola plan --cpu --link)")
        ax.bar([x + 0.2 for x in xs], [fl(r, "step_measured_ms") for r in rows], 0.4, label="measured")
        for x, p, r in zip(xs, pred, rows):
            m = fl(r, "step_measured_ms")
            if p > 0 and m > 0:
                ax.text(x, max(p, m), f"{100 * (p / m - 1):+.0f}%", ha="center", va="bottom", fontsize=7)
        ax.set_xticks(xs, names, rotation=60, ha="right", fontsize=7)
        ax.set_ylabel("ms per step")
        ax.set_title("The planner's step against the measured one")
        ax.legend(fontsize=8)
        fig.tight_layout()
        fig.savefig(f"{out}/predicted.png", dpi=110)
    print(f"plots: {out}/throughput.png {out}/breakdown.png {out}/memory.png"
          f"{' ' + out + '/predicted.png' if any(p > 0 for p in pred) else ''}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
