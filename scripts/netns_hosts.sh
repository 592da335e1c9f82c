#!/usr/bin/env bash
# Pretend "hosts" on one machine: network namespaces joined through a bridge, each with its
# own address on its own eth0, for trying multi-host launches without a second machine.
#
#   scripts/netns_hosts.sh up NAME HOSTS   creates NAME-h0 .. NAME-h<HOSTS-1> (10.77.0.1, .2,
#                                          ...) and NAME-sw, the switch they hang off
#   scripts/netns_hosts.sh down NAME       removes them (and their links)
#   scripts/netns_hosts.sh exec NAME I CMD...   runs CMD on host I (hostname NAME-hI)
#   scripts/netns_hosts.sh check           exits 0 when this machine can create namespaces
#                                          (root and `ip netns`), else prints why and exits 1
#
# Nothing outside the namespaces changes: the bridge lives in NAME-sw, not on the machine's own
# network, and only the addresses 10.77.0.0/24 inside the namespaces are used. Each host has
# its own hostname; files and /dev/shm stay shared, as they would not be between real machines.
set -euo pipefail

usage() { sed -n '5,9p' "$0" >&2; exit 2; }
host_ns() { echo "$1-h$2"; }
host_addr() { echo "10.77.0.$(($1 + 1))"; }

check() {
  if [ "$(id -u)" != 0 ]; then echo "network namespaces need root (running as uid $(id -u))"; return 1; fi
  if ! command -v ip > /dev/null; then echo "no 'ip' command (Debian: apt-get install iproute2)"; return 1; fi
  local probe="fsdp-probe-$$"
  if ! ip netns add "$probe" 2> /tmp/netns_probe.$$; then
    echo "cannot create a network namespace: $(cat /tmp/netns_probe.$$)"; rm -f /tmp/netns_probe.$$; return 1
  fi
  rm -f /tmp/netns_probe.$$
  if ! ip netns exec "$probe" ip link add br0 type bridge 2> /dev/null; then
    ip netns del "$probe"; echo "cannot create a bridge inside a namespace"; return 1
  fi
  ip netns del "$probe"
}

up() {
  local name="$1" hosts="$2"
  [[ "$hosts" =~ ^[0-9]+$ ]] && [ "$hosts" -ge 2 ] && [ "$hosts" -le 200 ] \
    || { echo "netns_hosts.sh: HOSTS must be 2..200, got '$hosts'" >&2; exit 2; }
  local sw="$name-sw"
  ip netns add "$sw"
  ip -n "$sw" link add br0 type bridge
  ip -n "$sw" link set br0 up
  for ((i = 0; i < hosts; i++)); do
    local ns; ns="$(host_ns "$name" "$i")"
    ip netns add "$ns"
    # One veth pair per host: eth0 inside the host, port<i> on the switch's bridge.
    ip link add "fsdp$$h$i" netns "$ns" type veth peer name "port$i" netns "$sw"
    ip -n "$ns" link set "fsdp$$h$i" name eth0
    ip -n "$ns" addr add "$(host_addr "$i")/24" dev eth0
    ip -n "$ns" link set eth0 up
    ip -n "$ns" link set lo up
    ip -n "$sw" link set "port$i" master br0
    ip -n "$sw" link set "port$i" up
  done
}

down() {
  local name="$1"
  # Deleting a namespace deletes its end of each veth pair, and with it the other end.
  for ns in $(ip netns list | awk '{print $1}' | grep -E "^${name}-(h[0-9]+|sw)$" || true); do
    ip netns del "$ns"
  done
}

[ $# -ge 1 ] || usage
cmd="$1"; shift
case "$cmd" in
  check) check ;;
  up) [ $# -eq 2 ] || usage; up "$@" ;;
  down) [ $# -eq 1 ] || usage; down "$@" ;;
  # Each host also gets its own hostname (a UTS namespace): Open MPI names its shared-memory
  # segments after the host, and two "hosts" of one name would collide in the shared /dev/shm.
  exec) [ $# -ge 3 ] || usage; ns="$(host_ns "$1" "$2")"; shift 2
        exec ip netns exec "$ns" unshare --uts /bin/sh -c 'hostname "$0" && exec "$@"' "$ns" "$@" ;;
  *) usage ;;
esac
