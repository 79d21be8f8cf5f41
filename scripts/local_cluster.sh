#!/usr/bin/env bash
# A throw-away cluster of N "nodes" on this machine, for multi-node launches
# (docs/launch.md "Several nodes"; tests/launch/cluster_*.sh). Each node is a
# network namespace with one interface, eth0, at 10.99.0.K/24 on a private
# bridge (itself in a namespace of its own, so the host's network is never
# touched), a rate-limited link (tc tbf, both directions), and, for every
# process started on it, a UTS namespace whose hostname is nodeK. Ranks on
# one node share memory as usual; ranks on two nodes talk TCP over the link.
#
#   scripts/local_cluster.sh up DIR [--nodes N] [--rate R] [--slots S]
#       N nodes (2..4, default 2), link rate R as tc writes it (default
#       10gbit; e.g. 1gbit, 500mbit), S MPI slots a node (default 2). Writes
#       DIR/hostfile (one address a node, slots=S), DIR/agent (Open MPI's
#       launch agent: it enters a node's namespaces where ssh would log in),
#       DIR/env (the OMPI_MCA_* settings that bind MPI's TCP to the bridge's
#       subnet and name the agent), DIR/nodes (name, namespace, address),
#       and DIR/node-local: a folder each node sees as its own (the
#       processes of node K see DIR/nodes.d/nodeK there).
#   scripts/local_cluster.sh exec DIR NODE CMD...
#       CMD on node NODE (node1, node2, ...) with DIR/env exported: e.g.
#         scripts/local_cluster.sh exec DIR node1 \
#           launch/mpirun.sh --hostfile DIR/hostfile -- wiola train ...
#       which is the multi-node command of docs/launch.md as written for a
#       real cluster, run on its first node.
#   scripts/local_cluster.sh rate DIR R      change every link's rate
#   scripts/local_cluster.sh kill DIR NODE   SIGKILL every process on NODE
#   scripts/local_cluster.sh status DIR      nodes, addresses, rates, processes
#   scripts/local_cluster.sh down DIR        kill every process on the nodes,
#                                            delete the namespaces (the links
#                                            go with them); idempotent
#
# `up` exits 77 with a one-line reason on stderr where namespaces cannot be
# made (not root, no `ip`/`tc`/`unshare`, a kernel without them), so tests
# can skip; on any other failure it removes what it made. Addresses: only
# 10.99.0.0/24 inside these namespaces (each cluster has its own, so two can
# run at once). Latency cannot be added (netem is not in every kernel).
set -uo pipefail

usage() { sed -n '10,31p' "$0" | sed 's/^# \{0,1\}//' >&2; exit 2; }
say() { echo "local_cluster: $*" >&2; }
skip() { say "cannot make a cluster here: $*"; exit 77; }
die() { say "$*"; exit 1; }

[ $# -ge 2 ] || usage
cmd=$1
case $2 in /*) dir=$2 ;; *) dir=$PWD/$2 ;; esac
dir=${dir%/}
shift 2
subnet=10.99.0
# Namespace names from DIR, so that clusters in two folders never meet.
tag=wl$(printf '%s' "$dir" | cksum | awk '{printf "%08x", $1}')
sw=$tag-sw

ns_of() { echo "$tag-n${1#node}"; }
nodes() { [ -f "$dir/nodes" ] && awk '{print $1}' "$dir/nodes"; }

# tbf burst: 1 ms of the rate (at least 32 KiB): a real link sends a
# message of a few hundred KiB at its rate too, where a larger bucket would
# let it through at memory speed.
set_rate() { # namespace device rate
  local bits bytes burst
  bits=$(tc_bits "$3") || die "bad rate '$3' (e.g. 1gbit, 500mbit)"
  bytes=$((bits / 8))
  burst=$((bytes / 1000 > 32768 ? bytes / 1000 : 32768))
  ip netns exec "$1" tc qdisc replace dev "$2" root tbf rate "$3" burst "$burst" latency 100ms
}
tc_bits() { # 10gbit -> bits per second
  local v=${1,,} n u
  [[ $v =~ ^([0-9]+)(bit|kbit|mbit|gbit)$ ]] || return 1
  n=${BASH_REMATCH[1]} u=${BASH_REMATCH[2]}
  case $u in bit) echo "$n" ;; kbit) echo $((n * 1000)) ;; mbit) echo $((n * 1000000)) ;; gbit) echo $((n * 1000000000)) ;; esac
}

kill_node() { # namespace: SIGKILL its processes until none is left (5 s at most)
  local i pids
  for i in $(seq 50); do
    pids=$(ip netns pids "$1" 2>/dev/null) || return 0
    [ -n "$pids" ] || return 0
    kill -9 $pids 2>/dev/null
    sleep 0.1
  done
  say "processes left in $1: $(ip netns pids "$1" 2>/dev/null | tr '\n' ' ')"
}

down() {
  local ns
  for ns in $(ip netns list 2>/dev/null | awk -v t="$tag-" 'index($1, t) == 1 {print $1}'); do
    kill_node "$ns"
    ip netns del "$ns" 2>/dev/null || say "could not delete namespace $ns"
  done
  rm -f "$dir/hostfile" "$dir/agent" "$dir/env" "$dir/nodes" "$dir/rate"
}

write_files() { # n slots
  local k
  : > "$dir/hostfile.tmp"
  : > "$dir/nodes.tmp"
  mkdir -p "$dir/node-local"
  for k in $(seq "$1"); do
    mkdir -p "$dir/nodes.d/node$k"
    echo "$subnet.$k slots=$2" >> "$dir/hostfile.tmp"
    echo "node$k $(ns_of $k) $subnet.$k" >> "$dir/nodes.tmp"
  done
  # Open MPI calls the agent as ssh: [options] HOST COMMAND WORDS...
  cat > "$dir/agent.tmp" <<EOF
#!/usr/bin/env bash
while [ \$# -gt 0 ] && [ "\${1#-}" != "\$1" ]; do shift; done
exec bash "$(realpath "$0")" enter "$dir" "\$@"
EOF
  chmod +x "$dir/agent.tmp"
  cat > "$dir/env.tmp" <<EOF
OMPI_MCA_plm_rsh_agent=$dir/agent
OMPI_MCA_btl_tcp_if_include=$subnet.0/24
OMPI_MCA_oob_tcp_if_include=$subnet.0/24
WIOLA_LOCAL_CLUSTER=$dir
EOF
  for k in hostfile nodes agent env; do mv "$dir/$k.tmp" "$dir/$k"; done
}

up() {
  local n=2 rate=10gbit slots=2 k ns
  while [ $# -gt 0 ]; do
    case $1 in
      --nodes) n=${2:?}; shift 2 ;;
      --rate) rate=${2:?}; shift 2 ;;
      --slots) slots=${2:?}; shift 2 ;;
      *) usage ;;
    esac
  done
  [[ $n =~ ^[2-4]$ ]] || die "--nodes must be 2, 3 or 4 (got '$n')"
  [[ $slots =~ ^[1-9][0-9]*$ ]] || die "--slots must be a positive number (got '$slots')"
  tc_bits "$rate" > /dev/null || die "bad --rate '$rate' (e.g. 1gbit, 500mbit)"
  [ "$(id -u)" -eq 0 ] || skip "not root"
  for k in ip tc unshare nsenter hostname; do command -v $k > /dev/null || skip "no '$k'"; done
  mkdir -p "$dir" || die "cannot make $dir"
  down
  trap 'say "up failed; removing what it made"; down; exit 1' ERR
  set -E
  ip netns add "$sw" 2> /dev/null || { trap - ERR; skip "ip netns add failed (no network namespaces)"; }
  ip netns exec "$sw" ip link add br0 type bridge
  ip netns exec "$sw" ip link set br0 up
  for k in $(seq "$n"); do
    ns=$(ns_of $k)
    ip netns add "$ns"
    ip netns exec "$ns" ip link set lo up
    ip link add "$tag-$k" netns "$sw" type veth peer name eth0 netns "$ns"
    ip netns exec "$sw" ip link set "$tag-$k" master br0 up
    ip netns exec "$ns" ip addr add "$subnet.$k/24" dev eth0
    ip netns exec "$ns" ip link set eth0 up
    set_rate "$ns" eth0 "$rate"
    set_rate "$sw" "$tag-$k" "$rate"
  done
  write_files "$n" "$slots"
  echo "$rate" > "$dir/rate"
  trap - ERR
  say "$n nodes up ($rate links, $slots slots each): $dir/hostfile"
}

# Runs words as a shell command on NODE (by name or address), in the node's
# network namespace and a UTS namespace named after it, with DIR/env.
enter() {
  local host=${1:?} name ns
  shift
  name=$(awk -v h="$host" '$1 == h || $3 == h {print $1}' "$dir/nodes" 2>/dev/null)
  [ -n "$name" ] || die "no node '$host' in $dir/nodes (is the cluster up?)"
  ns=$(ns_of "$name")
  # nsenter, not `ip netns exec`: that one remounts /sys for the namespace,
  # without the cgroup file systems under it (slurmd needs them).
  # DIR/node-local is each node's own folder (DIR/nodes.d/NAME bound there in
  # a mount namespace of the process): storage that nodes do not share, like
  # a real node's /tmp (Slurm's TmpFS).
  exec nsenter --net="/run/netns/$ns" unshare --uts --mount --propagation private sh -c \
    "hostname $name && mount --bind '$dir/nodes.d/$name' '$dir/node-local' && set -a && . '$dir/env' && set +a && $*"
}

case $cmd in
  up) up "$@" ;;
  down) down ;;
  enter) enter "$@" ;;
  exec)
    [ $# -ge 2 ] || usage
    node=$1
    shift
    enter "$node" "$(printf '%q ' "$@")"
    ;;
  rate)
    [ $# -eq 1 ] || usage
    for name in $(nodes); do
      set_rate "$(ns_of "$name")" eth0 "$1" && set_rate "$sw" "$tag-${name#node}" "$1" || exit 1
    done
    echo "$1" > "$dir/rate"
    ;;
  kill)
    [ $# -eq 1 ] || usage
    kill_node "$(ns_of "$1")"
    ;;
  status)
    [ -f "$dir/nodes" ] || { say "no cluster in $dir"; exit 1; }
    while read -r name ns addr; do
      echo "$name $addr $(cat "$dir/rate" 2>/dev/null) processes: $(ip netns pids "$ns" 2>/dev/null | wc -l)"
    done < "$dir/nodes"
    ;;
  *) usage ;;
esac
