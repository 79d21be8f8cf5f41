#!/usr/bin/env bash
# Several nodes (issue 48, docs/launch.md "Several nodes"): a cluster of two
# network-namespace nodes with 1 Gbit/s links (scripts/local_cluster.sh),
# `wiola train` started as on a real cluster, from the first node with
# `launch/mpirun.sh --hostfile`, two ranks a node:
#
#  1. tp2 x dp2 (TP inside a node, DP across) and tp2 x pp2 (PP across):
#     every loss and the final parameters within the layout bounds of the
#     single-process run (tests/dist/equivalence.sh, compare_runs.py); the
#     run report places ranks 0-1 on node1 and 2-3 on node2, TP intra and
#     DP / PP inter;
#  2. a node lost: every process of node2 killed mid-run (SIGKILL). The job
#     ends within parallel.comm_timeout_s + 10 s, the launcher names node2
#     and its ranks 2, 3; the same command again resumes from the last
#     checkpoint and ends with every loss equal (bit for bit) to the
#     uninterrupted tp2 x dp2 run of part 1.
#
# The cluster is removed on every exit path (trap). Exit 77 (skipped) where
# namespaces cannot be made.
#
#   cluster_mpirun.sh WIOLA EQ_WORK     (EQ_WORK: the dist_equiv fixture's)
set -uo pipefail
wiola=$1 work=$2
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
python=${WIOLA_PYTHON:-/usr/bin/python3}
cluster=$work/cluster
lc=("$root/scripts/local_cluster.sh")

t_start=$SECONDS
say() { echo "[$((SECONDS - t_start))s] $*"; }
fail() { say "FAIL: $*"; exit 1; }

bash "${lc[@]}" up "$cluster" --nodes 2 --rate 1gbit --slots 2
rc=$?
[ $rc = 77 ] && exit 77
[ $rc = 0 ] || fail "the cluster did not come up"
trap 'bash "${lc[@]}" down "$cluster"' EXIT
trap 'exit 130' INT TERM

# equivalence.sh's launcher: the multi-node command, on node1.
cat > "$cluster/mpiexec" <<EOF
#!/usr/bin/env bash
# mpiexec -n N [--bind-to none] COMMAND...
np=\$2; shift 2
[ "\$1" = --bind-to ] && shift 2
exec bash "$root/scripts/local_cluster.sh" exec "$cluster" node1 \\
  bash "$root/launch/mpirun.sh" --hostfile "$cluster/hostfile" -np "\$np" -- "\$@"
EOF
chmod +x "$cluster/mpiexec"
export MPIEXEC=$cluster/mpiexec

placement() { # RUN EXPECTED_LINKS_JSON
  "$python" - "$1/report.json" "$2" <<'PY'
import json, sys
p = json.load(open(sys.argv[1]))["placement"]
want = json.loads(sys.argv[2])
print("placement:", p)
assert p["rank_node"] == ["node1", "node1", "node2", "node2"], p
assert p["links"] == want, (p["links"], want)
PY
}

say "1. tp2 x dp2 and tp2 x pp2 across two nodes against one process"
bash "$root/tests/dist/equivalence.sh" run "$wiola" "$work" cluster_tp2_dp2 4 --set parallel.tp=2 \
  --set parallel.dp=2 --set train.grad_accum=2 || fail "tp2 x dp2 across nodes"
placement "$work/cluster_tp2_dp2" '{"tp": "intra", "dp": "inter", "pp": "none"}' || fail "tp2 x dp2 placement"
bash "$root/tests/dist/equivalence.sh" run "$wiola" "$work" cluster_tp2_pp2 4 --set parallel.tp=2 \
  --set parallel.pp=2 || fail "tp2 x pp2 across nodes"
placement "$work/cluster_tp2_pp2" '{"tp": "intra", "dp": "none", "pp": "inter"}' || fail "tp2 x pp2 placement"

say "2. node2 lost mid-run, then the same command again"
out=$work/cluster_lost
rm -rf "$out"
timeout_s=30
cmd=("$MPIEXEC" -n 4 "$wiola" train --set model.preset=wiola-tiny --set model.vocab_size=32000
     --set model.atm_tau=0.7 --set train.micro_batch=2 --set train.grad_accum=2 --set train.steps=10
     --set train.lr_max=1e-3 --set train.threads=1 --set "data.path=$work/shards/manifest.json" -q
     --set parallel.tp=2 --set parallel.dp=2 --set "parallel.comm_timeout_s=$timeout_s"
     --set "train.run_dir=$out" --set "checkpoint.dir=$out/ck" --set checkpoint.every=2)
# Rank 3 sleeps 400 ms a step (a test hook: no effect on the numbers), so
# the kill lands mid-run.
WIOLA_SLOW_RANK=3:400 "${cmd[@]}" > "$out.log" 2>&1 &
job=$!
for _ in $(seq 600); do
  [ -f "$out/metrics.jsonl" ] && [ "$(wc -l < "$out/metrics.jsonl")" -ge 4 ] && break
  kill -0 $job 2>/dev/null || break
  sleep 0.1
done
[ -f "$out/metrics.jsonl" ] && [ "$(wc -l < "$out/metrics.jsonl")" -ge 4 ] || { cat "$out.log"; fail "no steps logged"; }
kill -0 $job 2>/dev/null || { cat "$out.log"; fail "the job ended before the kill"; }
t_kill=$SECONDS
bash "${lc[@]}" kill "$cluster" node2
wait $job
status=$?
took=$((SECONDS - t_kill))
grep -v '^\*\|^ *$' "$out.log" | tail -6
[ $status -ne 0 ] || fail "the job went on without node2 (status 0)"
[ $took -le $((timeout_s + 10)) ] || fail "the job took $took s to end after the kill (bound $((timeout_s + 10)) s)"
grep -q "node node2 lost: ranks 2, 3 vanished at 'stage 0 step" "$out.log" ||
  fail "the launcher did not name the lost node and its ranks"
say "ended $took s after the kill (status $status), node2 and its ranks named"
"${cmd[@]}" > "$out.resume.log" 2>&1 || { cat "$out.resume.log"; fail "the resumed run failed"; }
grep -q "resum" "$out.resume.log" || say "note: no 'resum' in the resumed run's log"
"$python" "$here/same_losses.py" "$work/cluster_tp2_dp2/metrics.jsonl" "$out/metrics.jsonl" 10 ||
  fail "the resumed run differs from the uninterrupted one"
rm -rf "$out/ck"
say "PASS"
