#!/usr/bin/env python3
"""A real checkpoint read by someone else's reader (h5py + numpy) must give
what `wiola ckpt consolidate` writes, bit for bit.

  1. tokenizes a slice of the Brown corpus (`wiola prep`) and trains a tiny
     model for 4 steps under `mpiexec -n 4` with tp 2 x dp 2 and ZeRO, a
     checkpoint every 2 steps: slices are TP-split (rows and columns) and
     ZeRO-partial (runs that start and end inside rows);
  2. opens every rank file of the newest checkpoint with h5py, checks each
     file's header against the manifest and each dataset's shape, `offset`
     and `xxh3` attribute (its value too when the xxhash module is there),
     and rebuilds every tensor of every kind from the slices the manifest
     lists, each element exactly once;
  3. compares with `wiola ckpt consolidate --with-optimizer` bit for bit,
     root attributes included;
  4. `wiola ckpt verify` (one checkpoint and --all) passes; on a copy with
     one flipped data byte it fails with exit 1 naming the file and the
     dataset, and consolidate refuses it with one error line;
  5. `wiola ckpt inspect` (text, --json, --tensors) agrees with the manifest,
     and bad input is one `wiola ckpt: error:` line with exit 1;
  6. `wiola ckpt diff`: a checkpoint against itself is bit-identical (exit 0),
     against the run's earlier one it differs (exit 1), and the same training
     in one process (grad_accum 4 instead of dp 2) is within the layout bounds
     of tests/dist (whole model 1e-5, each tensor 1e-4) though not bit for bit
     identical, read through the other layout's slices.

usage: ckpt_h5py_check.py --wiola BIN --mpiexec MPIEXEC --text BROWN.txt
                          --tokenizer tokenizer.json --work DIR
Exits 1 naming the first thing that differs."""
import argparse
import json
import os
import shutil
import subprocess
import sys

import h5py
import numpy as np

try:
    import xxhash  # optional: the hashes' values (wiola ckpt verify checks them anyway)
except ImportError:
    xxhash = None

KINDS = ("param", "exp_avg", "exp_avg_sq")


def fail(msg):
    print(f"FAIL: {msg}", file=sys.stderr)
    sys.exit(1)


def run(cmd, expect_rc=0, **kw):
    p = subprocess.run(cmd, capture_output=True, text=True, **kw)
    if expect_rc is not None and p.returncode != expect_rc:
        fail(f"{' '.join(cmd)} exited {p.returncode}, expected {expect_rc}\n"
             f"stdout:\n{p.stdout}\nstderr:\n{p.stderr}")
    return p


def train(a, work, name="ckpt", layout=("parallel.tp=2", "parallel.dp=2", "train.grad_accum=2"), np=4):
    """4 steps of a global batch of 8 sequences; the newest checkpoint's folder."""
    text = os.path.join(work, "brown.txt")
    if not os.path.exists(os.path.join(work, "shards", "manifest.json")):
        with open(a.text, "rb") as f, open(text, "wb") as g:
            g.write(f.read(300000))
        run([a.wiola, "prep", "--no-progress", "--tokenizer", a.tokenizer, "--output",
             os.path.join(work, "shards"), text])
    sets = ["model.preset=wiola-tiny", "model.vocab_size=32000", "train.micro_batch=2",
            "train.steps=4", "train.threads=1", "checkpoint.every=2",
            f"checkpoint.dir={work}/{name}", f"train.run_dir={work}/run-{name}",
            f"data.path={work}/shards/manifest.json", *layout]
    cmd = [a.mpiexec, "-n", str(np), "--bind-to", "none", a.wiola, "train", "-q"]
    for s in sets:
        cmd += ["--set", s]
    run(cmd)
    with open(os.path.join(work, name, "latest")) as f:
        return os.path.join(work, name, f.read().strip())


def check_diff(a, work, folder):
    """`wiola ckpt diff` on the tp 2 x dp 2 run's checkpoints and one process's."""
    p = run([a.wiola, "ckpt", "diff", folder, os.path.join(work, "ckpt")])
    if "SAME (bit for bit)" not in p.stdout or "parameters 0 of " not in p.stdout:
        fail(f"diff of a checkpoint with itself:\n{p.stdout}")
    earlier = os.path.join(work, "ckpt", "step-00000002")
    p = run([a.wiola, "ckpt", "diff", earlier, folder], expect_rc=1)
    for must in ("note: the checkpoints are of different steps", "largest differences (10 of ",
                 "<- beyond the bound", "DIFFERENT (bit for bit)"):
        if must not in p.stdout:
            fail(f"diff of steps 2 and 4 lacks {must!r}:\n{p.stdout}")
    single = train(a, work, "single", ("train.grad_accum=4",), np=1)
    p = run([a.wiola, "ckpt", "diff", "--json", single, folder], expect_rc=1)
    d = json.loads(p.stdout)
    if d["same"] or d["differing"] == 0:
        fail(f"tp 2 x dp 2 is bit-identical to one process: the layouts did not differ ({p.stdout[:300]})")
    p = run([a.wiola, "ckpt", "diff", "--tol", "1e-5", "--top", "3", single, folder])
    if "SAME (whole model within 1.0e-05: yes; each tensor within 1.0e-04)" not in p.stdout or \
            "tp 2 x pp 1 x dp 2" not in p.stdout:
        fail(f"tp 2 x dp 2 against one process, within the layout bounds:\n{p.stdout}")
    print(f"diff: one process against tp 2 x dp 2: {d['differing']} of {d['elements']} parameters differ, "
          f"whole model rel {d['model_rel']:.2e}, worst tensor rel "
          f"{max(t['rel'] for t in d['tensors']):.2e}")


def rebuild_and_compare(folder, consolidated):
    """Every tensor from the manifest's slices through h5py, against the
    consolidated file; returns (tp_split, partial) evidence counts."""
    with open(os.path.join(folder, "manifest.json")) as f:
        mf = json.load(f)
    files = {r["name"]: h5py.File(os.path.join(folder, r["name"]), "r") for r in mf["files"]}
    for r in mf["files"]:
        h = files[r["name"]]
        hdr = (h.attrs["run_id"].decode() if isinstance(h.attrs["run_id"], bytes) else str(h.attrs["run_id"]),
               int(h.attrs["step"][0]), int(h.attrs["rank"][0]), [int(x) for x in h.attrs["grid_coord"]])
        if hdr != (mf["run_id"], mf["step"], r["rank"], r["grid_coord"]):
            fail(f"{r['name']}: header {hdr} differs from the manifest's")
    tp_split = partial = hashed = 0
    out = h5py.File(consolidated, "r")
    for key, want in (("step", mf["step"]), ("tokens", mf["tokens"])):
        if int(out.attrs[key]) != want:
            fail(f"{consolidated}: attribute {key} = {out.attrs[key]}, the manifest says {want}")
    cfg = out.attrs["config"]
    if (cfg.decode() if isinstance(cfg, bytes) else str(cfg)) != mf["config"]:
        fail(f"{consolidated}: attribute config differs from the manifest's")
    for kind in KINDS:
        if set(out[kind].keys()) != set(mf["tensors"].keys()):
            fail(f"{consolidated}: /{kind} holds {sorted(out[kind].keys())}, the manifest lists "
                 f"{sorted(mf['tensors'].keys())}")
    for name, t in mf["tensors"].items():
        rows, cols = t["shape"]
        for kind in KINDS:
            full = np.zeros((rows, cols), np.float32)
            seen = np.zeros((rows, cols), np.int32)
            holders = set()
            for r in mf["files"]:
                for k, (r0, c0, nr, nc) in enumerate(r["slices"].get(kind, {}).get(name, [])):
                    where = f"{r['name']}:/{kind}/{name}/{k}"
                    ds = files[r["name"]][f"{kind}/{name}/{k}"]
                    if ds.shape != (nr, nc) or ds.dtype != np.float32:
                        fail(f"{where}: {ds.shape} {ds.dtype}, the manifest says ({nr}, {nc}) float32")
                    if [int(x) for x in ds.attrs["offset"]] != [r0, c0]:
                        fail(f"{where}: offset {list(ds.attrs['offset'])}, the manifest says {[r0, c0]}")
                    if "xxh3" not in ds.attrs:
                        fail(f"{where}: no xxh3 attribute")
                    data = ds[...]
                    if xxhash is not None:
                        got = xxhash.xxh3_64_intdigest(data.astype("<f4").tobytes())
                        if got != int(ds.attrs["xxh3"]):
                            fail(f"{where}: xxh3 {got:016x} != attribute {int(ds.attrs['xxh3']):016x}")
                        hashed += 1
                    full[r0:r0 + nr, c0:c0 + nc] = data
                    seen[r0:r0 + nr, c0:c0 + nc] += 1
                    holders.add(r["name"])
                    if kind == "param" and cols > 1 and (c0 > 0 or nc < cols) and nr == 1:
                        partial += 1  # a run cut inside a row: ZeRO
            if not (seen == 1).all():
                bad = np.argwhere(seen != 1)[0]
                fail(f"{kind}/{name}: element {list(bad)} stored {seen[tuple(bad)]} times")
            if kind == "param" and len(holders) > 1:
                tp_split += 1
            got = out[f"{kind}/{name}"][...]
            if got.shape != ((rows, cols) if cols > 1 else (rows,)):
                fail(f"{consolidated}:/{kind}/{name} has shape {got.shape}, the tensor is [{rows}, {cols}]")
            if not np.array_equal(got.reshape(rows, cols).view(np.uint32), full.view(np.uint32)):
                bad = np.argwhere(got.reshape(rows, cols).view(np.uint32) != full.view(np.uint32))[0]
                fail(f"{kind}/{name}: consolidated {got.reshape(rows, cols)[tuple(bad)]} at {list(bad)}, "
                     f"the shards hold {full[tuple(bad)]}")
    for h in files.values():
        h.close()
    out.close()
    print(f"rebuilt {len(mf['tensors'])} tensors x 3 kinds from {len(files)} files; equal to the consolidated "
          f"file bit for bit ({tp_split} held by several files, {partial} row-partial slices, "
          f"{'%d dataset hashes checked' % hashed if xxhash else 'xxh3 presence only: no xxhash module'})")
    if tp_split == 0 or partial == 0:
        fail("the checkpoint has no TP-split or no row-partial slices: the layout did not exercise them")
    return mf


def one_error_line(p, must_contain):
    lines = p.stderr.strip().splitlines()
    if len(lines) != 1 or not lines[0].startswith("wiola ckpt: error: ") or must_contain not in lines[0]:
        fail(f"expected one 'wiola ckpt: error:' line naming {must_contain!r}, got:\n{p.stderr}")


def main():
    ap = argparse.ArgumentParser()
    for opt in ("--wiola", "--mpiexec", "--text", "--tokenizer", "--work"):
        ap.add_argument(opt, required=True)
    a = ap.parse_args()
    work = os.path.abspath(a.work)
    shutil.rmtree(work, ignore_errors=True)
    os.makedirs(work)
    folder = train(a, work)

    consolidated = os.path.join(work, "model.h5")
    run([a.wiola, "ckpt", "consolidate", "--with-optimizer", folder, consolidated])
    mf = rebuild_and_compare(folder, consolidated)

    # verify: sound, one checkpoint and the whole directory.
    p = run([a.wiola, "ckpt", "verify", folder])
    if not p.stdout.strip().splitlines()[-1].startswith("OK: "):
        fail(f"verify printed no OK line:\n{p.stdout}")
    p = run([a.wiola, "ckpt", "verify", "--all", os.path.join(work, "ckpt")])
    if "all 2 checkpoints sound" not in p.stdout:
        fail(f"verify --all did not check both checkpoints:\n{p.stdout}")

    # inspect agrees with the manifest.
    s = json.loads(run([a.wiola, "ckpt", "inspect", "--json", "--tensors", os.path.join(work, "ckpt")]).stdout)
    if (s["step"], s["run_id"], len(s["files"]), s["tensors"]) != (
            mf["step"], mf["run_id"], len(mf["files"]), len(mf["tensors"])):
        fail(f"inspect --json disagrees with the manifest: {s['step']} {s['run_id']} {len(s['files'])}")
    params = sum(t["shape"][0] * t["shape"][1] for t in mf["tensors"].values())
    if s["parameters"] != params or any(s["elements"][k] != params for k in KINDS):
        fail(f"inspect counts {s['parameters']} parameters, elements {s['elements']}; the manifest {params}")
    if len(s["tensor_list"]) != len(mf["tensors"]) or s["tensor_list"][0]["name"] != "model.embed_tokens.weight":
        fail("inspect --tensors does not list every tensor in model order")
    text = run([a.wiola, "ckpt", "inspect", "--tensors", folder]).stdout
    for must in (f"step        {mf['step']}", "rank-00003.h5  rank 3  tp ",
                 "model.layers.0.self_attn.o_proj.weight  [64, 64]"):
        if must not in text:
            fail(f"inspect output lacks {must!r}:\n{text}")

    # A damaged copy: one flipped byte inside a dataset's data.
    bad = os.path.join(work, "damaged")
    shutil.copytree(folder, bad)
    victim = os.path.join(bad, "rank-00003.h5")
    with h5py.File(victim, "r") as h:
        name = next(iter(h["param"].keys()))
        off = h[f"param/{name}/0"].id.get_offset()
    with open(victim, "r+b") as f:
        f.seek(off)
        b = f.read(1)
        f.seek(off)
        f.write(bytes([b[0] ^ 0x40]))
    p = run([a.wiola, "ckpt", "verify", bad], expect_rc=1)
    for must in (f"{victim}: checksum mismatch", f"{victim}: /param/{name}/0: data does not match its xxh3",
                 f"DAMAGED: {bad}"):
        if must not in p.stdout:
            fail(f"verify of the damaged copy lacks {must!r}:\n{p.stdout}")
    one_error_line(run([a.wiola, "ckpt", "consolidate", bad, os.path.join(work, "bad.h5")], expect_rc=1),
                   "rank-00003.h5: checksum mismatch")
    if os.path.exists(os.path.join(work, "bad.h5")) or os.path.exists(os.path.join(work, "bad.h5.tmp")):
        fail("consolidate of a damaged checkpoint left a file behind")

    # Bad input: one line, exit 1.
    nothing = os.path.join(work, "nothing")
    one_error_line(run([a.wiola, "ckpt", "inspect", nothing], expect_rc=1), nothing)
    one_error_line(run([a.wiola, "ckpt", "verify", os.path.join(work, "shards")], expect_rc=1),
                   os.path.join(work, "shards"))
    one_error_line(run([a.wiola, "ckpt", "verify", "--all", os.path.join(work, "run")], expect_rc=1),
                   os.path.join(work, "run"))
    one_error_line(run([a.wiola, "ckpt", "explode", folder], expect_rc=1), "explode")
    one_error_line(run([a.wiola, "ckpt", "diff", folder, nothing], expect_rc=1), nothing)
    one_error_line(run([a.wiola, "ckpt", "diff", folder, os.path.join(work, "shards")], expect_rc=1),
                   os.path.join(work, "shards"))
    check_diff(a, work, folder)
    print("ckpt_h5py_check: all checks passed")


if __name__ == "__main__":
    main()
