#!/usr/bin/env python3
"""Table and plot of per-layout training figures from RUN/report.json files
written by `wiola train` (bench/dist_layouts.sh).

usage: dist_report.py WORK_DIR NAME [NAME ...]
writes WORK_DIR/layouts.md and WORK_DIR/layouts.png"""
import json
import sys


def mib(b):
    return f"{b / 1048576:.2f}"


def main():
    work, names = sys.argv[1], sys.argv[2:]
    rows = []
    for n in names:
        with open(f"{work}/{n}/report.json") as f:
            rows.append((n, json.load(f)))
    groups = ["tp", "pp", "dp", "embed"]
    head = ("| layout | ranks | tokens/s | vs single | " +
            " | ".join(f"{g} MiB/rank/step meas. / analytic" for g in groups) +
            " | bubble pred. / meas. | peak RSS MiB per rank |")
    lines = [head, "|" + "---|" * (5 + len(groups) + 1)]
    base = rows[0][1]["tokens_per_s"]
    for n, r in rows:
        comm = r.get("comm_per_rank_per_step", {})
        cells = []
        for g in groups:
            c = comm.get(g)
            cells.append(f"{mib(c['measured_bytes'])} / {mib(c['analytic_bytes'])}" if c else "-")
        bub = f"{r['bubble_predicted']:.3f} / {r['bubble_measured']:.3f}" if "bubble_measured" in r else "-"
        rss = " ".join(f"{x:.0f}" for x in r["peak_rss_mib"])
        lines.append(f"| {n} | {r['world']} | {r['tokens_per_s']:.0f} | {r['tokens_per_s'] / base:.2f} | "
                     + " | ".join(cells) + f" | {bub} | {rss} |")
    table = "\n".join(lines) + "\n"
    with open(f"{work}/layouts.md", "w") as f:
        f.write(table)
    print(table)
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("(matplotlib missing: no plot)")
        return 0
    fig, ax = plt.subplots(1, 2, figsize=(12, 4.5))
    xs = range(len(rows))
    ax[0].bar(xs, [r["tokens_per_s"] for _, r in rows], color="tab:blue")
    ax[0].set_xticks(list(xs), [n for n, _ in rows], rotation=45, ha="right")
    ax[0].set_ylabel("tokens/s (whole job)")
    ax[0].set_title("Throughput per layout (same cores, same global batch)")
    bottom = [0.0] * len(rows)
    for g, col in zip(groups, ["tab:orange", "tab:green", "tab:red", "tab:purple"]):
        vals = [r.get("comm_per_rank_per_step", {}).get(g, {}).get("measured_bytes", 0) / 1048576 for _, r in rows]
        ax[1].bar(xs, vals, bottom=bottom, label=g, color=col)
        bottom = [b + v for b, v in zip(bottom, vals)]
    ax[1].set_xticks(list(xs), [n for n, _ in rows], rotation=45, ha="right")
    ax[1].set_ylabel("MiB on the wire per rank per step (max over ranks)")
    ax[1].set_title("Communication per group")
    ax[1].legend()
    fig.tight_layout()
    fig.savefig(f"{work}/layouts.png", dpi=110)
    print(f"plot: {work}/layouts.png")
    return 0


if __name__ == "__main__":
    sys.exit(main())
