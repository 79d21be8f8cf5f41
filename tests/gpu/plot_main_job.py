#!/usr/bin/env python3
"""The main job on the GPU against its CPU curve, in one PNG (kit_train.sh's
"main" check): the two loss curves by step, and their difference with the
check's band (|difference| <= 0.02 after step 50).

    python3 tests/gpu/plot_main_job.py tests/gpu/ref/brown-small-cpu.jsonl \\
        main_gpu_metrics.jsonl main_job.png [--labels "CPU fp32" "H100 bf16"]
"""
import argparse
import json

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def losses(path):
    with open(path) as f:
        recs = [json.loads(line) for line in f if line.strip()]
    return {r["step"]: r["loss"] for r in recs if r.get("loss") is not None and "step" in r}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("cpu")
    ap.add_argument("gpu")
    ap.add_argument("out")
    ap.add_argument("--labels", nargs=2, default=["CPU (committed reference)", "GPU (bf16)"])
    ap.add_argument("--band", type=float, default=0.02)
    ap.add_argument("--after", type=int, default=50)
    a = ap.parse_args()
    cpu, gpu = losses(a.cpu), losses(a.gpu)
    common = sorted(set(cpu) & set(gpu))
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(8, 6.5), sharex=True,
                                      gridspec_kw={"height_ratios": [2, 1]})
    top.plot(sorted(cpu), [cpu[k] for k in sorted(cpu)], label=a.labels[0], lw=1.2)
    top.plot(sorted(gpu), [gpu[k] for k in sorted(gpu)], label=a.labels[1], lw=1.2, alpha=0.8)
    top.set_ylabel("training loss")
    top.set_title("wiola-small, configs/brown-small.toml: GPU against CPU")
    top.legend()
    top.grid(alpha=0.3)
    diff = [gpu[k] - cpu[k] for k in common]
    bottom.plot(common, diff, color="C2", lw=1)
    bottom.axhspan(-a.band, a.band, color="C2", alpha=0.12, label=f"|difference| <= {a.band}")
    bottom.axvline(a.after, color="grey", ls="--", lw=0.8, label=f"judged after step {a.after}")
    judged = [abs(d) for k, d in zip(common, diff) if k > a.after]
    worst = max(judged, default=float("nan"))
    bottom.set_ylabel("GPU - CPU")
    bottom.set_xlabel(f"step (worst |difference| after step {a.after}: {worst:.4f})")
    bottom.legend(loc="upper right", fontsize=8)
    bottom.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(a.out, dpi=110)
    print(f"plot_main_job: {a.out} ({len(common)} steps compared, worst after step {a.after}: {worst:.4f})")


if __name__ == "__main__":
    main()
