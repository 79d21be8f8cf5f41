#!/usr/bin/env python3
"""Plot wiola training metrics (RUN_DIR/metrics.jsonl) into one PNG.

Three panels: loss (and val_loss points) against tokens, learning rate against
step, tokens/s against step. Several metrics files are overlaid, labelled by
their parent folder (the run directory).

    /usr/bin/python3 scripts/plot_metrics.py runs/brown-small/metrics.jsonl -o runs/brown-small/loss.png
    /usr/bin/python3 scripts/plot_metrics.py runs/a/metrics.jsonl runs/b/metrics.jsonl -o compare.png

With --diff, a fourth panel shows each later run's relative training-loss
difference to the first, step by step (log scale): how far two runs that
should compute the same (another layout, SIMD target or BLAS kernels) drift
apart.

metrics.jsonl holds one JSON object per line. Step records carry step, loss,
lr, grad_norm, tokens, tokens_per_s, step_ms; some also val_loss (and, in a run
on a blend of data sources, val_loss_sources: one loss per source, each
plotted with its own marker). Records
without "loss" (events) are skipped, except that a val_loss on them is still
plotted at their tokens (or at the tokens of their step).
"""
import argparse
import json
import math
import os
import sys


def read_metrics(path):
    """Returns (steps, val) for one file: steps is a list of dicts with a loss,
    val a list of (tokens, val_loss, val_loss_sources or [])."""
    steps, val_raw, bad = [], [], 0
    with open(path, encoding="utf-8") as f:
        for line in f:
            line = line.strip()
            if not line:
                continue
            try:
                rec = json.loads(line)
            except json.JSONDecodeError:
                bad += 1
                continue
            if not isinstance(rec, dict):
                bad += 1
                continue
            if "loss" in rec:
                steps.append(rec)
            if rec.get("val_loss") is not None:
                val_raw.append(rec)
    if bad:
        print(f"{path}: skipped {bad} unreadable line(s)", file=sys.stderr)
    tokens_at = {r["step"]: r["tokens"] for r in steps if "step" in r and "tokens" in r}
    val = []
    for r in val_raw:
        tok = r.get("tokens", tokens_at.get(r.get("step")))
        if tok is not None:
            val.append((tok, r["val_loss"], r.get("val_loss_sources") or []))
    return steps, val


def series(recs, x, y):
    """(xs, ys) of the records that have both fields as finite numbers."""
    xs, ys = [], []
    for r in recs:
        a, b = r.get(x), r.get(y)
        if isinstance(a, (int, float)) and isinstance(b, (int, float)) and math.isfinite(b):
            xs.append(a)
            ys.append(b)
    return xs, ys


def label_for(path):
    parent = os.path.basename(os.path.dirname(os.path.abspath(path)))
    return parent or path


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("metrics", nargs="+", help="metrics.jsonl file(s); several are overlaid")
    ap.add_argument("-o", "--output", help="PNG to write (default: loss.png beside the first file)")
    ap.add_argument("--diff", action="store_true",
                    help="add a panel: each later run's relative loss difference to the first, by step")
    args = ap.parse_args()
    out = args.output or os.path.join(os.path.dirname(os.path.abspath(args.metrics[0])), "loss.png")

    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        sys.exit("plot_metrics.py: matplotlib is not installed for this Python "
                 "(Debian: apt-get install python3-matplotlib); no plot written")

    runs = []
    for path in args.metrics:
        try:
            steps, val = read_metrics(path)
        except OSError as e:
            sys.exit(f"plot_metrics.py: {e}")
        if not steps:
            print(f"{path}: no step records with a loss", file=sys.stderr)
            continue
        runs.append((label_for(path), steps, val))
    if not runs:
        sys.exit("plot_metrics.py: nothing to plot")

    diff = args.diff and len(runs) > 1
    fig, axes = plt.subplots(1, 4 if diff else 3, figsize=(21 if diff else 16, 4.5))
    ax_loss, ax_lr, ax_tps = axes[:3]
    for i, (label, steps, val) in enumerate(runs):
        color = f"C{i}"
        x, y = series(steps, "tokens", "loss")
        ax_loss.plot(x, y, color=color, lw=1, label=f"{label} train")
        if val:
            vx, vy, per = zip(*val)
            ax_loss.plot(vx, vy, "o", color=color, ms=4, label=f"{label} val")
            for k in range(max(len(p) for p in per)):  # a blend: each source's own validation loss
                pts = [(x, p[k]) for x, p in zip(vx, per) if k < len(p) and isinstance(p[k], (int, float))]
                if pts:
                    ax_loss.plot(*zip(*pts), "^sDv<>pH"[k % 8], color=color, ms=4, mfc="none",
                                 label=f"{label} val, source {k + 1}")
        ax_lr.plot(*series(steps, "step", "lr"), color=color, lw=1, label=label)
        ax_tps.plot(*series(steps, "step", "tokens_per_s"), color=color, lw=1, label=label)

    if diff:
        ax_diff = axes[3]
        ref = dict(zip(*series(runs[0][1], "step", "loss")))
        for i, (label, steps, _) in enumerate(runs[1:], start=1):
            pts = [(st, abs(lo - ref[st]) / abs(ref[st])) for st, lo in zip(*series(steps, "step", "loss"))
                   if st in ref and ref[st] != 0]
            if pts:
                ax_diff.semilogy(*zip(*[(st, max(d, 1e-12)) for st, d in pts]), color=f"C{i}", lw=1, label=label)
        ax_diff.set(title=f"loss relative to {runs[0][0]}", xlabel="step", ylabel="|loss - ref| / ref")
        ax_diff.grid(alpha=0.3)
        ax_diff.legend(fontsize=8)
    ax_loss.set(title="loss", xlabel="tokens", ylabel="cross-entropy (nats)")
    ax_lr.set(title="learning rate", xlabel="step", ylabel="lr")
    ax_tps.set(title="throughput", xlabel="step", ylabel="tokens/s")
    for ax in (ax_loss, ax_lr, ax_tps):
        ax.grid(alpha=0.3)
    ax_loss.legend(fontsize=8)
    if len(runs) > 1:
        ax_lr.legend(fontsize=8)
        ax_tps.legend(fontsize=8)
    fig.tight_layout()
    os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
    fig.savefig(out, dpi=110)
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
