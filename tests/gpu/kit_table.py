#!/usr/bin/env python3
"""The rows for docs/gpu.md's Results table from what a kit session brought
back (tests/gpu/README.md): one row per check, PASS/FAIL and its figure.

    python3 tests/gpu/kit_table.py DIR --card "H100 80GB HBM3" --build abc1234 [--date 2026-11-27]

DIR is the folder that kit_session.sh's $OUT came back in (kit_results.tgz is
unpacked into it when its files are not there yet). Missing parts are left
out; a part that failed to write its JSON shows as FAIL with the reason."""
import argparse
import datetime
import json
import os
import tarfile


def load(folder, name):
    path = os.path.join(folder, name)
    if not os.path.exists(path):
        return None
    try:
        with open(path) as f:
            return json.loads(f.read().strip() or "null")
    except ValueError as e:
        return {"error": f"{name}: {e}"}


def gtest_rows(folder, name, label):
    d = load(folder, name)
    if d is None:
        return []
    if "error" in d:
        return [(label, False, d["error"])]
    tests, failed = d.get("tests", 0), d.get("failures", 0)
    skipped = sum(1 for s in d.get("testsuites", []) for t in s.get("testsuite", [])
                  if t.get("result") == "SKIPPED")
    names = [f"{s['name']}.{t['name']}" for s in d.get("testsuites", []) for t in s.get("testsuite", [])
             if t.get("failures")]
    fig = f"{tests - failed - skipped} of {tests} pass" + (f", {skipped} skipped" if skipped else "")
    return [(label, failed == 0 and tests > skipped, fig + (f"; failed: {', '.join(names)}" if names else ""))]


def short(fig):
    """A check's figures in a few words: bit-for-bit or the diff's model and
    worst-tensor rel, the worst loss difference, an exit status that failed,
    and any scalar figure as it is."""
    out = []
    for k, v in fig.items():
        if k == "diff" and isinstance(v, dict):
            if "error" in v:
                out.append(f"diff error: {v['error'][:80]}")
            elif v.get("bounds") is None or v.get("differing") == 0:
                out.append("bit for bit" if v.get("same") else f"differs ({v.get('differing')} elements)")
            else:
                wt = v.get("worst_tensor") or {}
                out.append(f"model rel {float(v['model_rel']):.2g}, worst tensor {float(wt.get('rel', 0)):.2g}")
        elif k == "losses" and isinstance(v, dict):
            out.append("losses identical" if v.get("identical") else f"losses rel {v.get('worst_loss_rel', 'n/a'):.2g}"
                       if isinstance(v.get("worst_loss_rel"), float) else f"losses {v}")
        elif k.endswith("exit") and v not in (0, 75):
            out.append(f"{k} {v}")
        elif isinstance(v, (int, float, str)) and not k.endswith("exit") and k not in ("ranks", "tol", "sent"):
            out.append(f"{k} {v}")
        elif isinstance(v, dict) and k not in ("diff", "losses"):
            out.append(f"{k} " + ", ".join(f"{a}={b}" for a, b in v.items() if not isinstance(b, (dict, list)))[:160])
    return "; ".join(out)


def checks_rows(folder, name, prefix):
    d = load(folder, name)
    if d is None:
        return []
    if "checks" not in d:
        return [(prefix, False, d.get("error", "no checks"))]
    return [(f"{prefix}: {c['check']}", c["ok"], short(c["figures"])) for c in d["checks"]]


def bench_rows(folder):
    d = load(folder, "bench.json")
    if not d:
        return []
    rows = []
    w = ((d.get("wiola") or {}).get("bf16") or {})
    if w:
        rows.append(("step, wiola-360m bf16 T=2048 B=4", True,
                     f"{w.get('time_per_step_ms', w.get('step_ms'))} ms, {w.get('tokens_per_s')} tokens/s, "
                     f"MFU {w.get('mfu')}"))
    for k, v in d.items():
        if k.startswith("ratio"):
            rows.append((k, True, str(v)))
    return rows


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("dir")
    ap.add_argument("--card", required=True)
    ap.add_argument("--build", required=True)
    ap.add_argument("--date", default=datetime.date.today().isoformat())
    a = ap.parse_args()
    tgz = os.path.join(a.dir, "kit_results.tgz")
    if os.path.exists(tgz) and not os.path.exists(os.path.join(a.dir, "gpu_tests.json")):
        with tarfile.open(tgz) as t:
            t.extractall(a.dir, filter="data")
    rows = (gtest_rows(a.dir, "gpu_tests.json", "gpu tests") + gtest_rows(a.dir, "nccl_tests.json", "NCCL single-rank")
            + checks_rows(a.dir, "train.json", "train") + checks_rows(a.dir, "multi.json", "multi")
            + bench_rows(a.dir))
    for tool in ("memcheck", "racecheck"):
        d = load(a.dir, f"sanitizer_{tool}.json")
        if d is not None:
            r = (d or {}).get(tool, {})
            rows.append((f"compute-sanitizer {tool}", r.get("exit") == 0 and r.get("reports") == 0,
                         f"{r.get('reports')} reports, exit {r.get('exit')}"))
    for check, ok, fig in rows:
        print(f"| {a.date} | {a.card} | `{a.build}` | {check} | {'PASS' if ok else 'FAIL'} | {fig} |")


if __name__ == "__main__":
    main()
