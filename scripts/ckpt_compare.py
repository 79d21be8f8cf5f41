#!/usr/bin/env python3
"""Checks on wiola checkpoints and metrics, independent of the C++ reader.

  ckpt_compare.py tensors A B       two checkpoints (folders, or checkpoint
                                    dirs: their `latest`) hold the same step,
                                    loader state and bit for bit the same
                                    tensors (param, exp_avg, exp_avg_sq),
                                    each rebuilt from its slices through the
                                    manifest (every element exactly once)
  ckpt_compare.py verify A          every file of checkpoint A has the size
                                    and XXH3 of the manifest, or (no xxhash
                                    module) the size, and rebuilds
  ckpt_compare.py metrics RUN REF N RUN/metrics.jsonl holds steps 1..N, each
                                    exactly once and in order, with the loss
                                    and grad_norm of REF/metrics.jsonl
  ckpt_compare.py loss RUN STEP     print the loss of STEP in RUN/metrics.jsonl

Exit status 0 when the check holds, 1 (with one line per problem on
stderr) when it does not.
"""
import json
import os
import sys

import h5py
import numpy as np

KINDS = ("param", "exp_avg", "exp_avg_sq")


def fail(msg):
    print(f"ckpt_compare: {msg}", file=sys.stderr)
    sys.exit(1)


def resolve(path):
    if os.path.exists(os.path.join(path, "manifest.json")):
        return path
    latest = os.path.join(path, "latest")
    if os.path.exists(latest):
        with open(latest) as f:
            return os.path.join(path, f.read().strip())
    fail(f"{path}: neither a checkpoint nor a directory with `latest`")


def manifest(folder):
    with open(os.path.join(folder, "manifest.json")) as f:
        return json.load(f)


def rebuild(folder):
    """{(kind, name): float32 array of the global shape} from the slices."""
    mf = manifest(folder)
    shapes = {n: tuple(t["shape"]) for n, t in mf["tensors"].items()}
    out, seen = {}, {}
    for rec in mf["files"]:
        with h5py.File(os.path.join(folder, rec["name"]), "r") as h:
            for kind, by_name in rec["slices"].items():
                for name, slices in by_name.items():
                    key = (kind, name)
                    if key not in out:
                        out[key] = np.zeros(shapes[name], dtype=np.float32)
                        seen[key] = np.zeros(shapes[name], dtype=np.int32)
                    for k, (r0, c0, nr, nc) in enumerate(slices):
                        ds = h[f"/{kind}/{name}/{k}"]
                        off = list(ds.attrs["offset"])
                        if off != [r0, c0] or ds.shape != (nr, nc):
                            fail(f"{folder}/{rec['name']}: /{kind}/{name}/{k} is {ds.shape} at {off}, "
                                 f"the manifest says ({nr}, {nc}) at [{r0}, {c0}]")
                        out[key][r0:r0 + nr, c0:c0 + nc] = ds[()]
                        seen[key][r0:r0 + nr, c0:c0 + nc] += 1
    for key, s in seen.items():
        if not (s == 1).all():
            fail(f"{folder}: {key[0]}/{key[1]}: {(s == 0).sum()} elements missing, {(s > 1).sum()} written twice")
    for name in shapes:
        for kind in KINDS:
            if (kind, name) not in out:
                fail(f"{folder}: no {kind} of {name}")
    return mf, out


def cmd_tensors(a, b):
    a, b = resolve(a), resolve(b)
    ma, ta = rebuild(a)
    mb, tb = rebuild(b)
    problems = []
    for k in ("step", "tokens", "skipped", "applied_steps", "loader"):
        if ma.get(k) != mb.get(k):
            problems.append(f"{k}: {ma.get(k)} in {a}, {mb.get(k)} in {b}")
    if set(ta) != set(tb):
        problems.append(f"tensor sets differ: {sorted(set(ta) ^ set(tb))}")
    for key in sorted(set(ta) & set(tb)):
        x, y = ta[key], tb[key]
        if x.shape != y.shape:
            problems.append(f"{key[0]}/{key[1]}: shape {x.shape} vs {y.shape}")
        elif not np.array_equal(x.view(np.uint32), y.view(np.uint32)):
            n = int((x.view(np.uint32) != y.view(np.uint32)).sum())
            problems.append(f"{key[0]}/{key[1]}: {n} of {x.size} elements differ "
                            f"(max |diff| {float(np.max(np.abs(x.astype(np.float64) - y))):.3g})")
    for p in problems[:12]:
        print(f"ckpt_compare: {p}", file=sys.stderr)
    if len(problems) > 12:
        print(f"ckpt_compare: ... {len(problems) - 12} more differences", file=sys.stderr)
    if problems:
        print(f"ckpt_compare: {a} and {b} differ", file=sys.stderr)
        sys.exit(1)
    print(f"ckpt_compare: {a} and {b}: step {ma['step']}, {len(ta)} tensors, bit for bit equal")


def cmd_verify(a):
    a = resolve(a)
    mf = manifest(a)
    try:
        import xxhash  # optional
    except ImportError:
        xxhash = None
    for rec in mf["files"]:
        p = os.path.join(a, rec["name"])
        if not os.path.exists(p):
            fail(f"{p}: missing")
        if os.path.getsize(p) != rec["bytes"]:
            fail(f"{p}: {os.path.getsize(p)} bytes, the manifest says {rec['bytes']}")
        if xxhash is not None:
            with open(p, "rb") as f:
                h = xxhash.xxh3_64_hexdigest(f.read())
            if h != rec["xxh3"]:
                fail(f"{p}: checksum mismatch")
    rebuild(a)
    print(f"ckpt_compare: {a}: sound (step {mf['step']})")


def read_metrics(run):
    path = os.path.join(run, "metrics.jsonl")
    rows = []
    if not os.path.exists(path):
        fail(f"{path}: no such file")
    with open(path) as f:
        for i, line in enumerate(f, 1):
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError:
                fail(f"{path}:{i}: not JSON: {line!r}")
    return path, rows


def cmd_metrics(run, ref, n):
    n = int(n)
    path, rows = read_metrics(run)
    _, ref_rows = read_metrics(ref)
    steps = [r["step"] for r in rows]
    if steps != list(range(1, n + 1)):
        dup = sorted({s for s in steps if steps.count(s) > 1})
        missing = sorted(set(range(1, n + 1)) - set(steps))
        fail(f"{path}: steps are not 1..{n} once each (duplicates {dup}, missing {missing}, "
             f"{len(steps)} lines)")
    by_step = {r["step"]: r for r in ref_rows}
    for r in rows:
        e = by_step.get(r["step"])
        if e is None:
            fail(f"{path}: step {r['step']} is not in the reference")
        for k in ("loss", "grad_norm", "lr", "tokens"):
            if r.get(k) != e.get(k):
                fail(f"{path}: step {r['step']}: {k} {r.get(k)!r}, the reference has {e.get(k)!r}")
    print(f"ckpt_compare: {path}: steps 1..{n} once each, losses equal to the reference's")


def cmd_loss(run, step):
    _, rows = read_metrics(run)
    for r in rows:
        if r["step"] == int(step):
            print(repr(r["loss"]))
            return
    fail(f"{run}: no step {step}")


def main():
    cmds = {"tensors": (cmd_tensors, 2), "verify": (cmd_verify, 1), "metrics": (cmd_metrics, 3),
            "loss": (cmd_loss, 2)}
    if len(sys.argv) < 2 or sys.argv[1] not in cmds or len(sys.argv) - 2 != cmds[sys.argv[1]][1]:
        print(__doc__, file=sys.stderr)
        sys.exit(2)
    fn, _ = cmds[sys.argv[1]]
    fn(*sys.argv[2:])


if __name__ == "__main__":
    main()
