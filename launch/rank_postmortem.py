#!/usr/bin/env python3
"""rank_postmortem.py RUN_DIR STARTED_AT STATUS: what happened to a job's ranks.

Called by launch/mpirun.sh (and launch/wiola.sbatch) when mpirun ends with a
status other than 0 or 75. Every rank of `wiola train` keeps a small state
file, RUN_DIR/ranks/rank-R.txt (dist/rank_states.h): its host, its last phase
("stage 0 step 7 forward micro-batch 0"), when it was written, and how the
process ended: "ended" (it left in order: done, or with its own error
message), "signal N" (a signal asked it to stop: mpirun stops the survivors
of a failed job with SIGTERM), or nothing (the process vanished: killed, or
its node lost). A node all of whose ranks vanished while ranks elsewhere did
not is named as lost. Files older than STARTED_AT (seconds since the epoch)
belong to an earlier job and are ignored. Prints nothing when there is
nothing to say; always exits 0 (a diagnostic never changes the status).
"""
import os
import sys


def read_state(path):
    rec = {}
    with open(path, "rb") as f:
        text = f.read().replace(b"\0", b"\n").decode("utf-8", "replace")
    for line in text.split("\n"):
        key, _, val = line.partition(" ")
        if key in ("job", "host", "pid", "updated", "context", "wait", "signal"):
            rec[key] = val
        elif line == "ended":
            rec["ended"] = True
        elif key == "rank":
            rec["rank"] = int(val.split()[0])
    return rec


def ranks_text(ranks):
    return ", ".join(str(r) for r in sorted(ranks))


def main():
    run_dir, started, status = sys.argv[1], float(sys.argv[2]), sys.argv[3]
    states = os.path.join(run_dir, "ranks")
    if not os.path.isdir(states):
        return
    recs = []
    for name in os.listdir(states):
        if not (name.startswith("rank-") and name.endswith(".txt")):
            continue
        try:
            rec = read_state(os.path.join(states, name))
            if "rank" in rec and float(rec.get("updated", 0)) >= started - 1:
                recs.append(rec)
        except (OSError, ValueError):
            continue
    if not recs:
        return
    # The job is the one most files belong to (a rank that never started
    # keeps an earlier job's file, already dropped by its time).
    jobs = [r.get("job") for r in recs]
    job = max(set(jobs), key=jobs.count)
    recs = sorted((r for r in recs if r.get("job") == job), key=lambda r: r["rank"])
    end = max(float(r["updated"]) for r in recs)
    vanished = [r for r in recs if "signal" not in r and not r.get("ended")]
    if not vanished:
        return
    by_host = {}
    for r in recs:
        by_host.setdefault(r.get("host", "?"), []).append(r)
    print(f"mpirun.sh: the job ended with status {status}; its ranks' last states ({states}):", file=sys.stderr)
    lost = []
    for host, rs in by_host.items():
        gone = [r for r in rs if r in vanished]
        stopped = [r for r in rs if "signal" in r]
        ended = [r for r in rs if r.get("ended")]
        if gone:
            last = max(gone, key=lambda r: float(r["updated"]))
            whole = len(gone) == len(rs) and len(gone) < len(recs)
            if whole:
                lost.append((host, gone, last))
            print(f"  {host}: rank{'s' if len(gone) > 1 else ''} {ranks_text(r['rank'] for r in gone)}"
                  f"{' (every rank on the node)' if whole else ''} vanished without an error or a stop signal "
                  f"(killed, or the node was lost); last phase '{last.get('context', '?')}', "
                  f"{end - float(last['updated']):.1f} s before the job's last state", file=sys.stderr)
        if stopped:
            print(f"  {host}: rank{'s' if len(stopped) > 1 else ''} {ranks_text(r['rank'] for r in stopped)} "
                  f"stopped by a signal ({stopped[0]['signal'].strip()}: the launcher ending the job)",
                  file=sys.stderr)
        if ended:
            print(f"  {host}: rank{'s' if len(ended) > 1 else ''} {ranks_text(r['rank'] for r in ended)} "
                  f"ended on their own (their messages are above)", file=sys.stderr)
    for host, gone, last in lost:
        print(f"mpirun.sh: node {host} lost: ranks {ranks_text(r['rank'] for r in gone)} vanished at "
              f"'{last.get('context', '?')}'; resume from the last checkpoint (run the same command again)",
              file=sys.stderr)


if __name__ == "__main__":
    try:
        main()
    except Exception as e:  # a diagnostic must never hide the job's own status
        print(f"mpirun.sh: no post-mortem of the ranks ({e})", file=sys.stderr)
