"""Shared by the CLI tests of tests/infer: running wiola, expecting one error
line, and a small trained checkpoint of the Brown corpus (made once by
trained_checkpoint.py, the ctest fixture infer_checkpoint, and read by every
test)."""
import argparse
import json
import os
import shutil
import subprocess
import sys


def parse_args():
    """The arguments every CLI test of tests/infer takes; a fresh --work folder."""
    ap = argparse.ArgumentParser()
    for k in ("wiola", "text", "tokenizer", "config", "work", "trained"):
        ap.add_argument("--" + k, required=True)
    a = ap.parse_args()
    shutil.rmtree(a.work, ignore_errors=True)
    os.makedirs(a.work)
    return a


def fail(msg):
    print(f"FAIL: {msg}", file=sys.stderr)
    sys.exit(1)


def run(cmd, expect_rc=0):
    p = subprocess.run(cmd, capture_output=True, text=True)
    if expect_rc is not None and p.returncode != expect_rc:
        fail(f"{' '.join(cmd)} exited {p.returncode}, expected {expect_rc}\n"
             f"stdout:\n{p.stdout[-3000:]}\nstderr:\n{p.stderr[-3000:]}")
    return p


def expect_error(cmd, needle):
    """One `wiola SUB: error:` line naming the problem, exit 1."""
    p = run(cmd, expect_rc=1)
    errs = [l for l in p.stderr.splitlines() if ": error:" in l]
    if len(errs) != 1 or needle not in p.stderr:
        fail(f"{' '.join(cmd)}: expected one error line with {needle!r}, got:\n{p.stderr}")
    print(f"  refused: {errs[0][:160]}")


def trained(a):
    """The fixture's (text, shards, checkpoint dir), from --trained; read only."""
    paths = tuple(os.path.join(a.trained, n) for n in ("brown.txt", "shards", "ck"))
    if not all(os.path.exists(p) for p in paths):
        fail(f"{a.trained} holds no trained checkpoint: run the fixture first "
             "(ctest -R infer_checkpoint, or tests/infer/trained_checkpoint.py)")
    return paths


def train(a, work):
    """wiola-small (configs/brown-small.toml) for 30 steps on 400 kB of Brown; a
    checkpoint and a validation figure at steps 15 and 30, the scores of
    tasks_common's task files (converted into WORK/tasks/) at the last. Returns (text, shards,
    checkpoint dir)."""
    with open(a.text, "rb") as f:
        data = f.read()
    text = os.path.join(work, "brown.txt")
    with open(text, "wb") as g:
        g.write(data[:400000])
    shards = os.path.join(work, "shards")
    run([a.wiola, "prep", "--no-progress", "--val-fraction", "0.1", "--tokenizer", a.tokenizer, "--output", shards,
         text])
    ck = os.path.join(work, "ck")
    from tasks_common import make_task_files  # noqa: E402 - it imports this module
    tasks = make_task_files(work)
    run([a.wiola, "train", "--config", a.config, "--set", f"data.path={shards}/manifest.json",
         "--set", "train.steps=30", "--set", "train.micro_batch=4", "--set", "train.eval_every=15",
         "--set", "train.eval_batches=2", "--set", f"train.run_dir={work}/run", "--set", "train.threads=2",
         "--set", f"checkpoint.dir={ck}", "--set", "checkpoint.every=15", "--set", "train.log_every=15",
         "--set", "train.eval_tasks=[" + ", ".join(json.dumps(t) for t in tasks) + "]",
         "--set", "train.tensorboard=true"])
    return text, shards, ck
