#!/usr/bin/env python3
"""same_losses.py REF/metrics.jsonl RUN/metrics.jsonl N

RUN (a run that was stopped and resumed) logged steps 1..N exactly once each,
and every loss equals REF's (an uninterrupted run) as written: the JSON
number's text, so the resumed run is bit for bit the uninterrupted one."""
import json
import sys


def losses(path):
    steps, loss = [], {}
    with open(path) as f:
        for line in f:
            rec = json.loads(line, parse_float=str)
            steps.append(rec["step"])
            loss[rec["step"]] = rec["loss"]
    return steps, loss


ref_path, run_path, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
ref_steps, ref = losses(ref_path)
steps, got = losses(run_path)
if ref_steps != list(range(1, n + 1)):
    sys.exit(f"{ref_path}: steps {ref_steps}, expected 1..{n}")
if steps != list(range(1, n + 1)):
    sys.exit(f"{run_path}: steps {steps}, expected 1..{n} once each")
bad = [s for s in steps if got[s] != ref[s]]
if bad:
    sys.exit("losses differ at steps " + ", ".join(f"{s} ({got[s]} vs {ref[s]})" for s in bad[:5]))
print(f"{run_path}: steps 1..{n} once each, every loss equal to the uninterrupted run's; final {got[n]}")
