#!/usr/bin/env bash
# Runs `mpirun -np N COMMAND...` with every rank in a network namespace of its own, so the job's traffic
# really crosses interfaces: N namespaces, each with one end of a veth pair and an address of its own,
# the other ends on a bridge in this namespace (which holds the launcher). mpirun starts one daemon per
# namespace through an rsh agent that enters it (as ssh would reach another host), and MPI is told to
# use TCP on the bridge's subnet only (no shared memory between ranks, no loopback).
# The ranks start in this directory (the namespaces share the file system). The daemons do not share
# their hwloc topology through shared memory (rtc_hwloc_vmhole none): one segfaulted writing it while
# another job's mpirun ran on the same host, under ctest -j2.
#
#   MPIEXEC=/usr/bin/mpirun tests/cluster/netns_ranks.sh N COMMAND...
#
# After the job it prints, per rank, the bytes its veth carried ("netns: rank R sent S bytes, received
# B bytes over veth ..."), tears everything down (also on failure or a signal) and exits with mpirun's
# status. Exit 77 (skipped) before anything starts when this machine cannot create network namespaces
# (no root, no CAP_NET_ADMIN, no `ip`). For tests only: mpirun runs with allow-run-as-root.
set -uo pipefail

if [ $# -lt 2 ]; then
  echo "usage: MPIEXEC=mpirun $0 N COMMAND..." >&2
  exit 2
fi
ranks=$1
shift
mpiexec=${MPIEXEC:-mpirun}

tag="mt$$"
# A /24 of its own per job (10.213.X.0), unlikely to meet this machine's routes.
net="10.213.$(($$ % 250)).0"
prefix=${net%.0}
bridge="${tag}br"
work=$(mktemp -d "/tmp/${tag}.XXXXXX")

teardown() {
  for ((r = 0; r < ranks; ++r)); do ip netns del "${tag}r$r" 2>/dev/null; done
  ip link del "$bridge" 2>/dev/null
  rm -rf "$work"
}
trap teardown EXIT
trap 'exit 130' INT TERM

skip() {
  echo "netns_ranks: cannot create network namespaces here ($1): skipped" >&2
  exit 77
}

command -v ip > /dev/null || skip "no ip command (iproute2)"
ip netns add "${tag}probe" 2> /dev/null || skip "ip netns add failed: needs root / CAP_NET_ADMIN"
ip netns del "${tag}probe"
ip link add "$bridge" type bridge 2> /dev/null || skip "no bridge interfaces"
ip addr add "$prefix.254/24" dev "$bridge"
ip link set "$bridge" up

hosts=""
for ((r = 0; r < ranks; ++r)); do
  ns="${tag}r$r"
  ip netns add "$ns" || exit 1
  ip link add "${tag}v$r" type veth peer name "${tag}p$r" || exit 1
  ip link set "${tag}p$r" netns "$ns"
  ip link set "${tag}v$r" master "$bridge"
  ip link set "${tag}v$r" up
  ip -n "$ns" addr add "$prefix.$((r + 1))/24" dev "${tag}p$r"
  ip -n "$ns" link set "${tag}p$r" up
  ip -n "$ns" link set lo up
  hosts="${hosts:+$hosts,}$ns"
done

# A veth's carrier comes up a moment after `link set up`: a daemon started before it cannot call back.
for ((tries = 0; tries < 100; ++tries)); do
  ready=1
  for ((r = 0; r < ranks; ++r)); do
    [ "$(cat "/sys/class/net/${tag}v$r/operstate")" = up ] || ready=0
    [ "$(ip netns exec "${tag}r$r" cat "/sys/class/net/${tag}p$r/operstate")" = up ] || ready=0
  done
  [ $ready = 1 ] && break
  sleep 0.05
done
[ $ready = 1 ] || { echo "netns_ranks: the veth pairs did not come up" >&2; exit 1; }

# mpirun's rsh agent: "agent HOST COMMAND..." runs COMMAND in HOST's namespace (HOST is its name).
# Each namespace's daemon (and its rank) keeps its session directory under a temporary directory of its
# own: they all share this host's /tmp and host name, so in /tmp/ompi.HOST.UID they would make and
# remove one tree together with every other Open MPI job on the host, and one daemon's mkdir lost that
# race under ctest -j2 ("A call to mkdir was unable to create the desired directory ... File exists",
# orte_init failed, mpirun exit 213).
cat > "$work/agent" << EOF
#!/bin/sh
host=\$1
shift
mkdir -p "$work/session-\$host" || exit 1
OMPI_MCA_orte_tmpdir_base="$work/session-\$host"
export OMPI_MCA_orte_tmpdir_base
exec ip netns exec "\$host" sh -c "\$*"
EOF
chmod +x "$work/agent"

echo "netns_ranks: $ranks ranks in namespaces $hosts on $net/24 (bridge $bridge)"
"$mpiexec" --allow-run-as-root --oversubscribe -np "$ranks" -H "$hosts" --wdir "$PWD" \
  --mca plm_rsh_agent "$work/agent" --mca oob_tcp_if_include "$net/24" --mca rtc_hwloc_vmhole none \
  --mca btl tcp,self --mca btl_tcp_if_include "$net/24" "$@"
rc=$?

# The bridge's end of rank r's pair: what it transmits the rank received, and the other way round.
for ((r = 0; r < ranks; ++r)); do
  stats="/sys/class/net/${tag}v$r/statistics"
  echo "netns: rank $r sent $(cat "$stats/rx_bytes") bytes, received $(cat "$stats/tx_bytes") bytes over veth" \
    "${tag}p$r ($prefix.$((r + 1)))"
done
exit $rc
