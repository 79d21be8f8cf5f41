#!/usr/bin/env python3
"""Reads back a run's timeline (train.trace_steps, RUN_DIR/trace.json) and
checks it (issue 47):

* it is trace-event JSON as the Trace Event Format defines it (the JSON
  Object Format: {"traceEvents": [...], ...}): every "X" (complete) event
  has a string name, numeric ts and dur >= 0 (microseconds), integer pid and
  tid, a string cat and an object args where present; every "M" (metadata)
  event names a process or thread (process_name, thread_name: args.name a
  string; process_sort_index: args.sort_index an integer); every (pid, tid)
  with events has a process and thread name, and the spans of one thread
  nest (no two overlap partly: a viewer draws them as a stack);
* every rank (pid = world rank) of the job is there, and on every traced
  step its schedule actions (cat "compute", named as dist::to_string writes
  them) are, in time order, exactly the actions the rank executed
  (RUN_DIR/schedule_trace/rank<R>.txt, WIOLA_TRACE_SCHEDULE=1, which
  schedule_trace_check holds against the schedule's own list); with more
  than one stage each rank has its sends and receives ("p2p") and every rank
  its optimizer span;
* each rank's idle share of the schedule on the traced steps (1 - compute /
  schedule) is within 5 points of the run report's bubble for that rank
  (report.json bubble_measured_per_rank; the report measures steps 2..,
  so trace those).

Usage: trace_check.py RUN_DIR RANKS STAGES STEP...
"""
import json
import sys
from collections import defaultdict

failures = []


def fail(msg):
    failures.append(msg)
    print("MISMATCH:", msg, file=sys.stderr)


def is_num(x):
    return isinstance(x, (int, float)) and not isinstance(x, bool)


def is_int(x):
    return isinstance(x, int) and not isinstance(x, bool)


def check_format(trace):
    """The Trace Event Format's required fields and types; returns the X events."""
    if not isinstance(trace, dict) or not isinstance(trace.get("traceEvents"), list):
        fail("not the JSON Object Format: no traceEvents list")
        return []
    if trace.get("displayTimeUnit", "ms") not in ("ms", "ns"):
        fail(f"displayTimeUnit {trace.get('displayTimeUnit')!r}")
    spans, pnames, tnames = [], set(), set()
    for i, e in enumerate(trace["traceEvents"]):
        where = f"event {i} {e.get('name')!r}" if isinstance(e, dict) else f"event {i}"
        if not isinstance(e, dict) or not isinstance(e.get("name"), str) or e.get("ph") not in ("X", "M"):
            fail(f"{where}: not an object with a string name and ph X or M")
            continue
        if not is_int(e.get("pid")) or not is_int(e.get("tid")):
            fail(f"{where}: pid and tid must be integers")
            continue
        if "args" in e and not isinstance(e["args"], dict):
            fail(f"{where}: args must be an object")
            continue
        if e["ph"] == "M":
            a = e.get("args", {})
            if e["name"] in ("process_name", "thread_name") and isinstance(a.get("name"), str):
                (pnames if e["name"] == "process_name" else tnames).add(
                    e["pid"] if e["name"] == "process_name" else (e["pid"], e["tid"]))
            elif not (e["name"] in ("process_sort_index", "thread_sort_index") and is_int(a.get("sort_index"))):
                fail(f"{where}: a metadata event names a process or thread or sorts it")
            continue
        if not is_num(e.get("ts")) or not is_num(e.get("dur")) or e["dur"] < 0:
            fail(f"{where}: ts and dur must be numbers, dur >= 0")
            continue
        if "cat" in e and not isinstance(e["cat"], str):
            fail(f"{where}: cat must be a string")
            continue
        spans.append(e)
    for e in spans:
        if e["pid"] not in pnames or (e["pid"], e["tid"]) not in tnames:
            fail(f"pid {e['pid']} tid {e['tid']}: no process_name or thread_name metadata event")
            break
    check_nesting(spans)
    return spans


def check_nesting(spans):
    by_thread = defaultdict(list)
    for e in spans:
        by_thread[(e["pid"], e["tid"])].append(e)
    eps = 0.01  # microseconds: rounding of the conversions
    for key, es in by_thread.items():
        stack = []
        for e in sorted(es, key=lambda e: (e["ts"], -e["dur"])):
            while stack and stack[-1]["ts"] + stack[-1]["dur"] <= e["ts"] + eps:
                stack.pop()
            if stack and e["ts"] + e["dur"] > stack[-1]["ts"] + stack[-1]["dur"] + eps:
                fail(f"pid {key[0]} tid {key[1]}: {e['name']!r} overlaps {stack[-1]['name']!r} partly")
                return
            stack.append(e)


def executed(run_dir, rank, step):
    with open(f"{run_dir}/schedule_trace/rank{rank}.txt") as f:
        for line in f:
            head, _, acts = line.partition(": ")
            if head.split()[:2] == ["step", str(step)]:
                return acts.split()
    fail(f"rank {rank}: no step {step} in schedule_trace/rank{rank}.txt")
    return []


def main():
    run_dir, ranks, stages, steps = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), [int(s) for s in sys.argv[4:]]
    with open(f"{run_dir}/trace.json") as f:
        spans = check_format(json.load(f))
    with open(f"{run_dir}/report.json") as f:
        bubble = json.load(f).get("bubble_measured_per_rank")
    if stages > 1 and (not isinstance(bubble, list) or len(bubble) != ranks):
        fail(f"report.json: bubble_measured_per_rank {bubble!r}, expected {ranks} values")
        bubble = None
    for r in range(ranks):
        mine = [e for e in spans if e["pid"] == r]
        busy = sched = 0.0
        for t in steps:
            at = [e for e in mine if e.get("args", {}).get("step") == t]
            acts = [e["name"] for e in sorted(at, key=lambda e: e["ts"]) if e.get("cat") == "compute"]
            want = executed(run_dir, r, t)
            if acts != want:
                fail(f"rank {r} step {t}: trace actions {' '.join(acts)} != executed {' '.join(want)}")
            busy += sum(e["dur"] for e in at if e.get("cat") == "compute")
            sched += sum(e["dur"] for e in at if e.get("cat") == "phase" and e["name"] == "schedule")
            cats = {e.get("cat") for e in at}
            if stages > 1 and "p2p" not in cats:
                fail(f"rank {r} step {t}: no send or receive")
            if not any(e["name"] == "optimizer" for e in at):
                fail(f"rank {r} step {t}: no optimizer span")
        idle = 1.0 - busy / sched if sched > 0 else float("nan")
        line = f"rank {r}: idle share of the schedule {idle:.4f}"
        if bubble is not None:
            line += f", report {bubble[r]:.4f}"
            if not abs(idle - bubble[r]) <= 0.05:
                fail(f"rank {r}: trace idle {idle:.4f} vs report bubble {bubble[r]:.4f}: over 5 points apart")
        print(line)
    print(f"{len(spans)} spans of {ranks} ranks" + (f"; {len(failures)} FAILURES" if failures else ": OK"))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
