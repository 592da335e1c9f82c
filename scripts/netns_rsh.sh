#!/usr/bin/env bash
# Open MPI's remote-shell agent for the namespace "hosts" of scripts/netns_hosts.sh: mpirun
# calls `netns_rsh.sh [OPTIONS] HOST COMMAND...` where ssh would be used; this runs COMMAND in
# the namespace that owns HOST's address (10.77.0.<i+1> is host i), as ssh would on HOST.
#   FSDP_NETNS_NAME=NAME mpirun --mca plm_rsh_agent scripts/netns_rsh.sh --host 10.77.0.1:2,...
set -euo pipefail
while [ $# -gt 0 ] && [ "${1#-}" != "$1" ]; do shift; done  # ssh-style options, if any
[ $# -ge 2 ] || { echo "netns_rsh.sh: usage: netns_rsh.sh HOST COMMAND..." >&2; exit 2; }
host="$1"; shift
: "${FSDP_NETNS_NAME:?netns_rsh.sh: set FSDP_NETNS_NAME to the name given to netns_hosts.sh up}"
if [[ ! "$host" =~ ^10\.77\.0\.([0-9]+)$ ]]; then
  echo "netns_rsh.sh: '$host' is not a namespace host address (10.77.0.N)" >&2; exit 2
fi
ns="${FSDP_NETNS_NAME}-h$((BASH_REMATCH[1] - 1))"
# ssh hands the command line to a shell on the remote side; do the same, under the host's own
# hostname (netns_hosts.sh exec does the same for commands started there).
exec ip netns exec "$ns" unshare --uts /bin/sh -c "hostname $ns && $*"
