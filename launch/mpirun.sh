#!/usr/bin/env bash
# Starts a wiola job under Open MPI's mpirun (docs/launch.md).
#
#   launch/mpirun.sh [-np N] [--threads T] [--bind none|socket] [--gpu-per-rank]
#                    [mpirun options ...] -- wiola train --config FILE [--set ...]
#
#   -np N           ranks; default: parallel.tp x pp x dp of the command's
#                   --config and --set parallel.* (1 x 1 x 1 without them)
#   --threads T     OpenMP threads per rank, exported as OMP_NUM_THREADS (used
#                   when the config leaves train.threads = 0); default: the
#                   OMP_NUM_THREADS already set, else this machine's cores / N
#   --bind MODE     none (default): ranks are not pinned, their OpenMP threads
#                   spread over the cores (mpirun's own default, one core per
#                   rank for 2 ranks or less, would squeeze them onto one);
#                   socket: rank i on socket i mod sockets, bound to it
#                   (one rank per socket, T = cores per socket)
#   --gpu-per-rank  rank i of a node sees only GPU i of that node
#                   (CUDA_VISIBLE_DEVICES; the CUDA backend uses device 0)
#   other options before `--` go to mpirun as they are (--hostfile FILE,
#   --host a,b, --mca k v, -x VAR, ...)
#
# Its exit status is mpirun's: 0, or the first non-zero status of a rank
# (75: every rank stopped at a checkpoint after SIGUSR1 or SIGTERM; run the
# same command again to resume). Signals sent to it reach mpirun, which
# forwards SIGUSR1 and SIGUSR2 to every rank; on SIGTERM mpirun ends the job
# itself (the ranks get SIGTERM about a second later and SIGKILL a second
# after that), so prefer SIGUSR1 to stop a run cleanly. When a job fails
# (any other status) it prints which ranks vanished and where, from the
# ranks' state files (launch/rank_postmortem.py): a node whose every rank
# vanished is named as lost.
# As root it sets OMPI_ALLOW_RUN_AS_ROOT{,_CONFIRM}; with more ranks than
# cores on one machine (no --hostfile/--host) it adds --oversubscribe.
set -euo pipefail

usage() { sed -n '4,5p' "$0" | sed 's/^# //' >&2; exit 2; }
np="" threads="" bind=none gpu=0 opts=()
while [ $# -gt 0 ]; do
  case $1 in
    -np | -n | --np) np=${2:?}; shift 2 ;;
    --threads) threads=${2:?}; shift 2 ;;
    --bind) bind=${2:?}; shift 2 ;;
    --gpu-per-rank) gpu=1; shift ;;
    --) shift; break ;;
    -h | --help) usage ;;
    *) opts+=("$1"); shift ;;
  esac
done
[ $# -gt 0 ] || usage

# From the command line of `wiola train`: the ranks (its --config file's
# [parallel] tp, pp, dp, then --set parallel.{tp,pp,dp}=V overrides) and the
# run folder (train.run_dir, for the post-mortem of a failed job).
guess="" run_dir="" why=$(mktemp)
read -r guess run_dir < <(/usr/bin/env python3 - "$@" 2>"$why" <<'EOF' || true
import sys, tomllib
args, cfg, sets = sys.argv[1:], None, []
if "train" not in args: sys.exit("mpirun.sh: the command is not `wiola train ...`")
args = args[args.index("train") + 1:]
for i, a in enumerate(args):
    nxt = args[i + 1] if i + 1 < len(args) else None
    if a in ("-c", "--config") and nxt: cfg = nxt
    elif a.startswith("--config="): cfg = a.split("=", 1)[1]
    elif a == "--set" and nxt: sets.append(nxt)
    elif a.startswith("--set="): sets.append(a.split("=", 1)[1])
try:
    conf = {}
    if cfg:
        with open(cfg, "rb") as f:
            conf = tomllib.load(f)
    def key(section, k, default):
        v = conf.get(section, {}).get(k, default)
        for s in sets:
            if s.startswith(f"{section}.{k}="): v = s.split("=", 1)[1].strip('"')
        return v
    n = 1
    for k in ("tp", "pp", "dp"):
        n *= int(key("parallel", k, 1))
    print(n, key("train", "run_dir", "runs/default"))
except Exception as e:
    sys.exit(f"mpirun.sh: {e}")
EOF
) || true
if [ -z "$np" ]; then
  np=$guess
  [ -n "$np" ] || { cat "$why" >&2; rm -f "$why"; echo "mpirun.sh: cannot infer the number of ranks from the command; give -np N" >&2; exit 2; }
fi
rm -f "$why"

cores=$(nproc)
if [ -z "$threads" ]; then
  threads=${OMP_NUM_THREADS:-$((cores / np > 0 ? cores / np : 1))}
fi
export OMP_NUM_THREADS=$threads

case $bind in
  none) opts+=(--bind-to none) ;;
  socket) opts+=(--map-by socket --bind-to socket) ;;
  *) echo "mpirun.sh: --bind must be none or socket" >&2; exit 2 ;;
esac

if [ "$(id -u)" -eq 0 ]; then
  export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
fi
hosts=0
for o in "${opts[@]}"; do
  case $o in --hostfile* | -hostfile | --machinefile* | -machinefile | --host* | -host | -H) hosts=1 ;; esac
done
if [ "$np" -gt "$cores" ] && [ $hosts = 0 ] && [ -z "${SLURM_JOB_ID:-}" ]; then
  opts+=(--oversubscribe)
fi

# Environment for the ranks on other hosts (mpirun passes only what -x names).
for v in OMP_NUM_THREADS $(compgen -e | grep -E '^(NCCL_|WIOLA_)' || true); do opts+=(-x "$v"); done

cmd=("$@")
if [ $gpu = 1 ]; then
  # The i-th entry of CUDA_VISIBLE_DEVICES when it lists several, else GPU i.
  cmd=(bash -c 'lr=${OMPI_COMM_WORLD_LOCAL_RANK:-0}
IFS=, read -ra d <<< "${CUDA_VISIBLE_DEVICES:-}"
if [ ${#d[@]} -gt 1 ]; then export CUDA_VISIBLE_DEVICES=${d[lr]:-none}
elif [ ${#d[@]} -eq 0 ]; then export CUDA_VISIBLE_DEVICES=$lr; fi
exec "$@"' wiola-rank "${cmd[@]}")
fi

echo "mpirun.sh: $np ranks, $threads thread(s) per rank, bind $bind" >&2
# mpirun runs as a child so that a failed job gets a post-mortem; the signals
# this script receives go on to mpirun (it forwards USR1 and USR2 to every
# rank, and ends the job on TERM and INT).
started=$(date +%s.%N)
mpirun -np "$np" "${opts[@]}" "${cmd[@]}" &
pid=$!
for sig in USR1 USR2 TERM INT; do trap "kill -$sig $pid 2>/dev/null" "$sig"; done
status=0
while :; do
  status=0
  wait "$pid" || status=$?
  kill -0 "$pid" 2>/dev/null || break  # a trapped signal interrupted the wait
done
trap - USR1 USR2 TERM INT
# Which ranks vanished and where (a lost node), from the ranks' state files.
if [ "$status" -ne 0 ] && [ "$status" -ne 75 ] && [ -n "${run_dir:-}" ]; then
  /usr/bin/env python3 "$(dirname "$0")/rank_postmortem.py" "$run_dir" "$started" "$status" || true
fi
exit "$status"
