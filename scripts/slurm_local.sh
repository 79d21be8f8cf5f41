#!/usr/bin/env bash
# A throw-away one-node Slurm cluster on localhost, for tests of the Slurm
# launch path (launch/wiola.sbatch, tests/launch/slurm_preempt.sh).
#
#   scripts/slurm_local.sh up DIR      start munged, slurmctld and slurmd with
#                                      everything (config, state, spool, logs,
#                                      sockets) under DIR; prints one line,
#                                      SLURM_CONF=DIR/slurm.conf, on stdout:
#                                        export "$(scripts/slurm_local.sh up /tmp/s)"
#   scripts/slurm_local.sh status DIR  daemons, node and queue; exit 0 when up
#   scripts/slurm_local.sh down DIR    cancel every job, stop the daemons, kill
#                                      leftover slurmstepd; idempotent
#
# Several nodes: with CLUSTER=DIR2, a cluster made by scripts/local_cluster.sh
# (network namespaces node1..nodeN at 10.99.0.K), `up` declares one Slurm
# node a namespace node (NodeName=nodeK NodeAddr=10.99.0.K) and starts
# slurmctld on node1 and one slurmd on each node, inside its namespaces, so
# `sbatch -N 2` allocates two nodes and srun/mpirun start ranks on both.
# Clients must then run on a node: `scripts/local_cluster.sh exec DIR2 node1
# sbatch ...` (the printed SLURM_CONF line is the same).
#
# `up` exits 77 with a one-line reason on stderr when Slurm cannot run here
# (not root, packages missing, a daemon does not come up), so tests can skip.
# It needs root (the daemons run as root, no cgroups) and the Debian packages
# slurm-wlm, munge and libpmix-dev (scripts/setup.sh installs them).
#
# The node is declared with at least SLURM_LOCAL_CPUS (default 4) CPUs,
# whatever the machine has (SlurmdParameters=config_overrides), so 4-rank
# jobs start on a 2-core machine. Authentication is munge with a fresh key
# on a private socket (no system munged needed, and no other local user can
# talk to this cluster). Ports: the first free pair from 6817/6818 upwards.
# DIR should be short (unix socket paths are limited to ~108 bytes); a
# mktemp -d under /tmp is ideal.
set -uo pipefail

usage() { echo "usage: $0 up|down|status DIR" >&2; exit 2; }
[ $# -eq 2 ] || usage
cmd=$1
case $2 in /*) dir=$2 ;; *) dir=$PWD/$2 ;; esac
dir=${dir%/}
conf=$dir/slurm.conf
marker="WIOLA_SLURM_LOCAL=$dir"
want_cpus=${SLURM_LOCAL_CPUS:-4}
cluster=${CLUSTER:-}
[ -z "$cluster" ] || [ -f "$cluster/nodes" ] || { echo "slurm_local: CLUSTER=$cluster is not a cluster that is up (no $cluster/nodes)" >&2; exit 2; }
lc=$(dirname "$0")/local_cluster.sh

# A client command (squeue, scancel, ...): on node1 when the cluster is
# several namespace nodes (the controller's address is only there).
client() {
  if [ -n "$cluster" ]; then bash "$lc" exec "$cluster" node1 "$@"; else "$@"; fi
}
# The Slurm node names and addresses: "localhost 127.0.0.1", or one line a
# namespace node.
slurm_nodes() {
  if [ -n "$cluster" ]; then awk '{print $1, $3}' "$cluster/nodes"; else echo "localhost 127.0.0.1"; fi
}

say() { echo "slurm_local: $*" >&2; }
skip() { say "cannot start Slurm here: $*"; exit 77; }

alive() { # PID is running (a zombie is not: kill -0 would say it is)
  local st
  st=$(cat "/proc/$1/stat" 2>/dev/null) || return 1
  st=${st##*) }
  [ "${st%% *}" != Z ]
}

pid_of() { # pid file -> pid if that process is alive
  local p
  [ -s "$1" ] || return 1
  p=$(cat "$1" 2>/dev/null) || return 1
  [[ $p =~ ^[0-9]+$ ]] && alive "$p" && echo "$p"
}

# PIDs of this cluster's leftovers, never this shell or its ancestors:
# processes whose initial environment holds the marker the daemons were
# started with (slurmstepd inherits it from slurmd), or names our slurm.conf
# and our cluster (the processes of its jobs).
leftover_pids() {
  local p q=$$ anc=" " env e mark job
  while [ -n "$q" ] && [ "$q" -gt 1 ]; do
    anc+="$q "
    q=$(awk '/^PPid:/ {print $2}' "/proc/$q/status" 2>/dev/null)
  done
  for p in /proc/[0-9]*; do
    p=${p#/proc/}
    [[ $anc == *" $p "* ]] && continue
    mapfile -d '' -t env 2>/dev/null < "/proc/$p/environ" || continue
    mark=0 job=0
    for e in "${env[@]}"; do
      case $e in
        "$marker") mark=1 ;;
        "SLURM_CONF=$conf") job=$((job | 1)) ;;
        SLURM_CLUSTER_NAME=wiolalocal) job=$((job | 2)) ;;
      esac
    done
    { [ $mark = 1 ] || [ $job = 3 ]; } && echo "$p"
  done
}

stop_pids() { # SIGTERM to all, wait up to 10 s for all, then SIGKILL
  local p i live
  [ $# -gt 0 ] || return 0
  kill -TERM "$@" 2>/dev/null
  for ((i = 0; i < 100; i++)); do
    live=0
    for p; do alive "$p" && live=1; done
    [ $live = 1 ] || return 0
    sleep 0.1
  done
  kill -KILL "$@" 2>/dev/null
  return 0
}

do_down() {
  local p i
  export SLURM_CONF=$conf
  if [ -f "$conf" ] && pid_of "$dir/slurmctld.pid" >/dev/null; then
    # Cancel every job (this cluster is ours alone) and wait for an empty queue.
    client timeout 5 scancel --quiet --partition=local 2>/dev/null
    for ((i = 0; i < 150; i++)); do
      [ -z "$(client timeout 5 squeue -h -o %i 2>/dev/null)" ] && break
      sleep 0.2
    done
  fi
  # The three daemons stop together.
  local daemons=()
  for f in "$dir"/slurmd*.pid "$dir/slurmctld.pid" "$dir/munge/munged.pid"; do
    p=$(pid_of "$f") && daemons+=("$p")
  done
  stop_pids ${daemons[@]+"${daemons[@]}"}
  # Leftovers (slurmstepd, job processes), by PID.
  for p in $(leftover_pids); do kill -KILL "$p" 2>/dev/null; done
  rm -f "$dir"/slurmd*.pid "$dir/slurmctld.pid" "$dir/munge/munged.pid" "$dir/munge/munge.sock"
  return 0
}

do_status() {
  local ok=0 p f
  local files=(munge/munged.pid slurmctld.pid) name addr
  while read -r name addr; do files+=("$(slurmd_pid_file "$name")"); done < <(slurm_nodes)
  for f in "${files[@]}"; do
    if p=$(pid_of "$dir/$f"); then echo "${f#munge/}: running (pid $p)"; else echo "${f#munge/}: not running"; ok=1; fi
  done
  [ $ok -eq 0 ] || return 1
  export SLURM_CONF=$conf
  client timeout 5 scontrol ping | head -1 || return 1
  client timeout 5 sinfo -N -o '%N %T %c' || return 1
  client timeout 5 squeue -o '%i %j %T %r %M' || return 1
  echo "SLURM_CONF=$conf"
}

# slurmd's pid file (SlurmdPidFile=DIR/slurmd-%n.pid): one a node.
slurmd_pid_file() { [ "$1" = localhost ] && echo slurmd.pid || echo "slurmd-$1.pid"; }

port_free() { ! (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }

do_up() {
  local c missing=() p
  [ "$(id -u)" -eq 0 ] || skip "needs root (the local cluster runs its daemons as root)"
  for c in slurmctld slurmd munged sbatch srun scontrol squeue sinfo scancel; do
    command -v "$c" >/dev/null 2>&1 || missing+=("$c")
  done
  [ ${#missing[@]} -eq 0 ] || skip "missing ${missing[*]} (apt-get install slurm-wlm munge)"
  [[ $(ldconfig -p 2>/dev/null) == *'libpmix.so '* ]] ||
    skip "no unversioned libpmix.so for srun --mpi=pmix (apt-get install libpmix-dev)"
  [ ${#dir} -le 70 ] || skip "DIR '$dir' is too long for unix socket paths (use a short path, e.g. mktemp -d)"
  if do_status >/dev/null 2>&1; then echo "SLURM_CONF=$conf"; return 0; fi
  do_down

  local hw cpus b s cores t mem
  hw=$(slurmd -C 2>/dev/null | head -1) || skip "slurmd -C failed"
  field() { sed -n "s/.* $1=\([0-9]*\).*/\1/p" <<<"$hw"; }
  cpus=$(field CPUs); b=$(field Boards); s=$(field SocketsPerBoard); cores=$(field CoresPerSocket)
  t=$(field ThreadsPerCore); mem=$(field RealMemory)
  [ -n "$cpus" ] && [ -n "$b" ] && [ -n "$s" ] && [ -n "$cores" ] && [ -n "$t" ] && [ -n "$mem" ] ||
    skip "cannot parse 'slurmd -C': $hw"
  # Declare at least $want_cpus CPUs: more cores per socket, same topology shape.
  while [ $((b * s * cores * t)) -lt "$want_cpus" ]; do cores=$((cores + 1)); done
  cpus=$((b * s * cores * t))

  local ctl_host=localhost slurmd_pid=slurmd.pid slurmd_log=slurmd.log spool_sub="" tmpfs=$dir/tmp name addr
  if [ -n "$cluster" ]; then
    ctl_host="node1($(awk '$1 == "node1" {print $3}' "$cluster/nodes"))"
    slurmd_pid='slurmd-%n.pid' slurmd_log='slurmd-%n.log' spool_sub='/%n'
    tmpfs=$cluster/node-local  # each node's own, as PMIx needs
    while read -r name addr; do mkdir -p "$dir/spool/$name"; done < <(slurm_nodes)
  fi
  local pc=6817
  # Namespace nodes are fresh: their ports are free.
  while [ -z "$cluster" ] && ! { port_free $pc && port_free $((pc + 1)); }; do
    pc=$((pc + 2)); [ $pc -lt 6917 ] || skip "no free port pair in 6817..6916"
  done

  mkdir -p "$dir"/{state,spool,log,munge,tmp} || skip "cannot create $dir"
  chmod 700 "$dir/munge" "$dir/state" "$dir/spool"
  chmod 1777 "$dir/tmp"
  rm -f "$dir"/log/*.log
  : > "$dir/plugstack.conf"
  cat > "$conf" <<EOF
# Generated by scripts/slurm_local.sh: a one-node test cluster (root, no cgroups).
ClusterName=wiolalocal
SlurmctldHost=$ctl_host
SlurmctldPort=$pc
SlurmdPort=$((pc + 1))
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=$dir/munge/munge.sock
StateSaveLocation=$dir/state
SlurmdSpoolDir=$dir/spool$spool_sub
# Slurm's PMIx plugin makes spmix_appdir_UID_JOB.STEP under TmpFS; in /tmp a
# leftover of an earlier cluster (job ids restart at 1) breaks the launch.
TmpFS=$tmpfs
SlurmctldPidFile=$dir/slurmctld.pid
SlurmdPidFile=$dir/$slurmd_pid
SlurmctldLogFile=$dir/log/slurmctld.log
SlurmdLogFile=$dir/log/$slurmd_log
PlugStackConfig=$dir/plugstack.conf
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
MpiDefault=pmix
SlurmdParameters=config_overrides
ReturnToService=2
MinJobAge=4
KillWait=10
MailProg=/bin/true
EOF
  local name addr names=""
  while read -r name addr; do
    echo "NodeName=$name NodeAddr=$addr CPUs=$cpus Boards=$b SocketsPerBoard=$s CoresPerSocket=$cores ThreadsPerCore=$t RealMemory=$mem State=UNKNOWN" >> "$conf"
    names+=${names:+,}$name
  done < <(slurm_nodes)
  echo "PartitionName=local Nodes=$names Default=YES MaxTime=INFINITE State=UP" >> "$conf"

  fail() { # reason; last log lines; tear down; 77
    say "$1"
    for f in "$dir"/log/*.log "$dir"/munge/munged.log; do
      [ -s "$f" ] && { say "--- tail of $f"; tail -n 5 "$f" >&2; }
    done
    do_down; skip "$1"
  }
  # Munge: a fresh key for this cluster only, on a private socket.
  head -c 1024 /dev/urandom > "$dir/munge/munge.key" && chmod 400 "$dir/munge/munge.key"
  env "$marker" munged --force --socket="$dir/munge/munge.sock" --key-file="$dir/munge/munge.key" \
    --pid-file="$dir/munge/munged.pid" --log-file="$dir/munge/munged.log" \
    --seed-file="$dir/munge/munged.seed" 2>>"$dir/munge/munged.log" ||
    fail "munged did not start"
  on_node() { # NODE CMD...: on that namespace node (the cluster), else here
    local node=$1
    shift
    if [ -n "$cluster" ]; then bash "$lc" exec "$cluster" "$node" "$@"; else "$@"; fi
  }
  on_node node1 env "$marker" SLURM_CONF="$conf" slurmctld -c -f "$conf" 2>>"$dir/log/slurmctld.log" ||
    fail "slurmctld did not start"
  local n_nodes=0
  while read -r name addr; do
    on_node "$name" env "$marker" SLURM_CONF="$conf" slurmd -f "$conf" -N "$name" 2>>"$dir/log/slurmd.log" ||
      fail "slurmd of $name did not start"
    n_nodes=$((n_nodes + 1))
  done < <(slurm_nodes)

  export SLURM_CONF=$conf
  local i idle=0
  for ((i = 0; i < 150; i++)); do
    idle=$(client timeout 5 sinfo -h -N -o %T 2>/dev/null | grep -c '^idle$')
    [ "$idle" -ge "$n_nodes" ] && break
    sleep 0.2
  done
  [ "$idle" -ge "$n_nodes" ] ||
    fail "$((n_nodes - idle)) of $n_nodes node(s) did not become idle within 30 s: $(client timeout 5 sinfo -h -N -o '%N %T' 2>/dev/null | tr '\n' ' ')"
  say "up: $(slurm_nodes | awk '{print $1}' | tr '\n' ' ')with $cpus CPUs declared each, ports $pc/$((pc + 1)), logs in $dir/log"
  echo "SLURM_CONF=$conf"
}

case $cmd in
  up) do_up ;;
  down) do_down ;;
  status) do_status ;;
  *) usage ;;
esac
