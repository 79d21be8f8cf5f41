#!/usr/bin/env python3
"""Run monitoring end to end (docs/performance.md): TensorBoard event files,
straggler warnings and the timeout diagnostic's view of every rank.

  monitor_test.py --wiola W --work DIR setup         two small blend sources
  monitor_test.py --wiola W --work DIR tensorboard   every metrics.jsonl scalar
                                                     in TensorBoard, read with
                                                     the tensorboard package
                                                     (exit 77: not installed)
  monitor_test.py --wiola W --work DIR tensorboard_rewind
                                                     a loss-spike rewind and a
                                                     resume from an older
                                                     checkpoint: TensorBoard
                                                     shows metrics.jsonl's rows
                                                     (each step once)
  monitor_test.py ... --mpiexec M straggler          WIOLA_SLOW_RANK=1: rank 1
                                                     named in the log and report
  monitor_test.py ... --mpiexec M stall              a rank that stops: the
                                                     timeout names every rank's
                                                     last phase and wait
"""
import argparse
import json
import math
import os
import re
import shutil
import struct
import subprocess
import sys
import time

ap = argparse.ArgumentParser()
ap.add_argument("--wiola", required=True)
ap.add_argument("--work", required=True)
ap.add_argument("--text", help="plain text to take the sources from (setup)")
ap.add_argument("--tokenizer", help="tokenizer.json (setup)")
ap.add_argument("--mpiexec", default="mpiexec")
ap.add_argument("mode", choices=["setup", "tensorboard", "tensorboard_rewind", "straggler", "stall"])
args = ap.parse_args()
work = args.work
COMMON = ["--set", "model.preset=wiola-tiny", "--set", "model.vocab_size=32000", "--set", "train.micro_batch=2",
          "--set", "train.threads=1", "--set", "train.lr_max=1e-3"]
BLEND = "data.blend=[{path=\"%s/sa\", weight=1}, {path=\"%s/sb\", weight=2}]" % (work, work)


def run(cmd, env=None, check=True):
    t0 = time.time()
    p = subprocess.run(cmd, capture_output=True, text=True, env=env)
    print("$", " ".join(cmd), "-> exit", p.returncode, "in %.1f s" % (time.time() - t0))
    if check and p.returncode != 0:
        print(p.stdout, p.stderr)
        sys.exit("FAIL: the command failed")
    return p


def setup():
    os.makedirs(work, exist_ok=True)
    text = open(args.text, encoding="utf-8").read()
    for name, part in (("a", text[:120000]), ("b", text[-120000:])):
        with open(os.path.join(work, name + ".txt"), "w", encoding="utf-8") as f:
            f.write(part)
        run([args.wiola, "prep", "--no-progress", "--fresh", "--val-fraction", "0.1", "--tokenizer", args.tokenizer,
             "--output", os.path.join(work, "s" + name), os.path.join(work, name + ".txt")])


# metrics.jsonl key -> TensorBoard tag (train/tensorboard.h, docs/performance.md)
TAGS = {"loss": "train/loss", "lr": "train/lr", "grad_norm": "train/grad_norm", "tokens": "train/tokens",
        "skipped": "train/skipped_steps", "tokens_per_s": "perf/tokens_per_s", "step_ms": "perf/step_ms",
        "checkpoint_ms": "perf/checkpoint_ms", "mfu": "perf/mfu", "atm_mu": "atm/mu",
        "atm_saved_attention_gflop": "atm/saved_attention_gflop", "peak_mem_mib": "memory/peak_mib",
        "val_loss": "val/loss"}


def is_scalar(x):  # what train/tensorboard.cpp writes: numbers and null, not booleans, strings or lists
    return x is None or (isinstance(x, (int, float)) and not isinstance(x, bool))


def expected_scalars(rec, sources):
    out = {}
    for k, v in rec.items():
        if k == "step":
            continue
        if k == "val_loss_sources":
            for i, x in enumerate(v):
                out["val/%d-%s/loss" % (i + 1, sources[i])] = x
        elif isinstance(v, dict):
            for sub, x in v.items():
                if is_scalar(x):
                    out[("time_ms/" if k == "time_ms" else "metrics/%s/" % k) + sub] = x
        elif is_scalar(v):
            out[TAGS.get(k, "metrics/" + k)] = v
    return out


def f32(x):
    return float("nan") if x is None else struct.unpack("<f", struct.pack("<f", float(x)))[0]


def require_tensorboard():
    """Skips (exit 77) where the tensorboard package is missing."""
    try:
        import tensorboard.backend.event_processing.event_accumulator  # noqa: F401
    except ImportError as e:
        print("SKIP: the tensorboard Python package is not installed (%s); scripts/setup.sh installs it" % e)
        sys.exit(77)


def tensorboard():
    require_tensorboard()
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    from tensorboard.compat.proto import event_pb2
    from tensorboard.compat.tensorflow_stub.pywrap_tensorflow import masked_crc32c
    rd = os.path.join(work, "tb_run")
    shutil.rmtree(rd, ignore_errors=True)
    # An earlier run in the same folder: its event file stays, and
    # TensorBoard must drop it at the new file's session START (step 1), as
    # metrics.jsonl starts anew.
    run([args.wiola, "train", *COMMON, "--set", "data.path=%s/sa" % work, "--set", "train.steps=4", "--set",
         "train.seed=9", "--set", "train.tensorboard=true", "--set", "train.run_dir=" + rd, "-q"])
    time.sleep(1.1)  # event files are named by the second they were made in
    run([args.wiola, "train", *COMMON, "--set", BLEND, "--set", "train.steps=6", "--set", "train.eval_every=3",
         "--set", "train.eval_batches=1", "--set", "train.tensorboard=true", "--set", "train.run_dir=" + rd, "-q"])
    tbdir = os.path.join(rd, "tensorboard")
    files = sorted(f for f in os.listdir(tbdir) if f.startswith("events.out.tfevents."))
    assert len(files) == 2, files
    # The framing, checked here byte by byte: lengths, both masked CRC32Cs,
    # the first record's file_version.
    raw = open(os.path.join(tbdir, files[-1]), "rb").read()
    pos, events = 0, []
    while pos < len(raw):
        hdr = raw[pos:pos + 8]
        (n,) = struct.unpack("<Q", hdr)
        (hcrc,) = struct.unpack("<I", raw[pos + 8:pos + 12])
        assert hcrc == masked_crc32c(hdr), "length CRC at byte %d" % pos
        data = raw[pos + 12:pos + 12 + n]
        (dcrc,) = struct.unpack("<I", raw[pos + 12 + n:pos + 16 + n])
        assert dcrc == masked_crc32c(data), "data CRC at byte %d" % pos
        ev = event_pb2.Event()
        ev.ParseFromString(data)
        events.append(ev)
        pos += 16 + n
    assert events[0].file_version == "brain.Event:2", events[0]
    assert events[1].session_log.status == event_pb2.SessionLog.START and events[1].step == 1, events[1]
    print("%d records, CRCs and file_version good" % len(events))
    tb, n = same_as_metrics(rd, ["sa", "sb"])
    for tag in ("train/loss", "perf/mfu", "time_ms/compute", "memory/peak_mib", "atm/mu", "val/1-sa/loss",
                "val/2-sb/loss"):
        assert tag in tb, tag
    assert sorted(tb["val/2-sb/loss"]) == [3, 6]
    print("OK: %d scalars under %d tags equal metrics.jsonl (float32)" % (n, len(tb)))


def same_as_metrics(rd, sources):
    """Every scalar of RUN_DIR's metrics.jsonl, through TensorBoard's own
    reader (which drops orphaned events at a session START): each tag's
    events, in order, are metrics.jsonl's rows, each step once."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    ea = EventAccumulator(os.path.join(rd, "tensorboard"), size_guidance={"scalars": 0}, purge_orphaned_data=True)
    ea.Reload()
    tb = {tag: [(e.step, e.value) for e in ea.Scalars(tag)] for tag in ea.Tags()["scalars"]}
    records = [json.loads(line) for line in open(os.path.join(rd, "metrics.jsonl"))]
    steps = [r["step"] for r in records]
    assert steps == sorted(set(steps)), "metrics.jsonl: steps %s" % steps
    want = {}
    for rec in records:
        for tag, v in expected_scalars(rec, sources).items():
            want.setdefault(tag, []).append((rec["step"], v))
    assert set(tb) == set(want), "tags differ: only in TensorBoard %s, only in metrics.jsonl %s" % (
        sorted(set(tb) - set(want)), sorted(set(want) - set(tb)))
    n = 0
    for tag, rows in want.items():
        assert [s for s, _ in tb[tag]] == [s for s, _ in rows], (tag, [s for s, _ in tb[tag]], [s for s, _ in rows])
        for (step, got), (_, v) in zip(tb[tag], rows):
            exp = f32(v)
            assert got == exp or (math.isnan(got) and math.isnan(exp)), (tag, step, got, v)
            n += 1
    return {tag: dict(rows) for tag, rows in tb.items()}, n


def tensorboard_rewind():
    require_tensorboard()
    rd = os.path.join(work, "tb_rewind")
    shutil.rmtree(rd, ignore_errors=True)
    ck = os.path.join(rd, "ck")
    spike = ["--set", "data.path=%s/sa" % work, "--set", "train.tensorboard=true", "--set", "train.run_dir=" + rd,
             "--set", "checkpoint.dir=" + ck, "--set", "checkpoint.every=3", "--set", "checkpoint.keep=10",
             "--set", "train.spike_sigma=3", "--set", "train.spike_window=3", "-q"]
    # Step 5's loss looks 1000 times larger: rewind to checkpoint 3, skip
    # steps 4..5. The first steps 4 and 5 (trained) were in the event file.
    p = run([args.wiola, "train", *COMMON, *spike, "--set", "train.steps=8"],
            env=dict(os.environ, WIOLA_INJECT_LOSS_SPIKE="5"))
    assert "rewinding to" in p.stdout and "(step 3)" in p.stdout, p.stdout
    rows = [json.loads(line) for line in open(os.path.join(rd, "metrics.jsonl"))]
    assert [r.get("data_skipped", False) for r in rows] == [False] * 3 + [True] * 2 + [False] * 3, rows
    tb, n = same_as_metrics(rd, [])
    assert math.isnan(tb["train/loss"][4]) and math.isfinite(tb["train/loss"][6]), tb["train/loss"]
    assert tb["metrics/rewind/detected_at"] == {4: 5.0}, tb["metrics/rewind/detected_at"]
    print("OK after the rewind: %d scalars, each step once, equal metrics.jsonl" % n)
    # Checkpoint 8 lost (say, damaged), and the run extended to 10 steps: it
    # resumes from step 6 in a new event file; TensorBoard drops the first
    # file's steps 7 and 8 there, as metrics.jsonl is cut back.
    before = {s: v for s, v in tb["train/loss"].items()}
    shutil.rmtree(os.path.join(ck, "step-00000008"))
    with open(os.path.join(ck, "latest"), "w") as f:
        f.write("step-00000006\n")
    time.sleep(1.1)  # event files are named by the second they were made in
    p = run([args.wiola, "train", *COMMON, *spike, "--set", "train.steps=10"])
    assert "resuming from" in p.stdout and "step-00000006" in p.stdout, p.stdout
    files = sorted(f for f in os.listdir(os.path.join(rd, "tensorboard")) if f.startswith("events.out.tfevents."))
    assert len(files) == 2, files
    tb, n = same_as_metrics(rd, [])
    assert sorted(tb["train/loss"]) == list(range(1, 11)), sorted(tb["train/loss"])
    for s in range(1, 7):  # the first file's steps up to the checkpoint stay
        a, b = before[s], tb["train/loss"][s]
        assert a == b or (math.isnan(a) and math.isnan(b)), (s, a, b)
    # 10 steps instead of 8 change the LR schedule from step 7's update on,
    # so step 8's loss differs: the one shown is the second file's.
    assert tb["train/loss"][8] != before[8], (tb["train/loss"], before)
    print("OK after a resume from step 6: %d scalars, each step once, equal metrics.jsonl" % n)


def mpirun(np_, extra, env_add, check=True):
    env = dict(os.environ, **env_add)
    return run([args.mpiexec, "-n", str(np_), "--bind-to", "none", args.wiola, "train", *COMMON, "--set",
                "data.path=%s/sa" % work, *extra, "-q"], env=env, check=check)


def straggler():
    rd = os.path.join(work, "straggler_run")
    p = mpirun(2, ["--set", "parallel.dp=2", "--set", "train.steps=8", "--set", "train.log_every=2",
                   "--set", "train.run_dir=" + rd], {"WIOLA_SLOW_RANK": "1:80"})
    print(p.stderr)
    warn = [l for l in p.stderr.splitlines() if "warning: straggler" in l]
    assert warn, "no straggler warning in the log"
    assert re.search(r"straggler at step \d+: rank 1 \(stage 0\): [0-9.]+ ms", warn[0]), warn[0]
    assert "rank 0" not in warn[0], warn[0]
    rep = json.load(open(os.path.join(rd, "report.json")))["step_time_per_rank"]
    print(json.dumps(rep))
    assert rep["stragglers"] == [1], rep
    assert rep["straggler_share"] == 0.2
    own = rep["median_own_s"]
    assert own[1] > own[0] + 0.06, own  # the injected 80 ms
    print("OK: rank 1 named in the log and report.json")


def stall():
    rd = os.path.join(work, "stall_run")
    p = mpirun(2, ["--set", "parallel.pp=2", "--set", "train.grad_accum=2", "--set", "train.steps=10",
                   "--set", "train.run_dir=" + rd, "--set", "parallel.comm_timeout_s=2"], {"WIOLA_FAULT": "stall:1:3"},
               check=False)
    print(p.stderr)
    assert p.returncode != 0
    err = p.stderr
    assert re.search(r"communication timeout: world rank 0 .* in irecv on group 'pp'", err), "no timeout line"
    assert "last published state of every rank" in err
    assert re.search(r"rank 0 \([^)]*\): stage 0 step 3 backward micro-batch 0; blocked for [0-9.]+ s in irecv "
                     r"on group 'pp' \(rank 0 of 2\)", err), "rank 0's state"
    assert re.search(r"rank 1 \([^)]*\): stage 1 step 3 data; not blocked in a communication wait", err), \
        "rank 1's state"
    print("OK: the timeout shows both ranks' last phase and wait")


{"setup": setup, "tensorboard": tensorboard, "tensorboard_rewind": tensorboard_rewind, "straggler": straggler,
 "stall": stall}[args.mode]()
