#!/usr/bin/env bash
# Starts N local ranks of PROGRAM with torchrun's variables (RANK, WORLD_SIZE, LOCAL_RANK,
# LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT), for users without torchrun.
#   scripts/launch.sh --nproc N [--port P] PROGRAM [ARGS...]
# If any rank fails, the others are stopped and the first failing exit code is returned, so a
# dead peer ends the run instead of hanging it.
set -uo pipefail

usage() { echo "usage: $0 --nproc N [--port P] PROGRAM [ARGS...]" >&2; exit 2; }

nproc="" port=""
while [ $# -gt 0 ]; do
  case "$1" in
    --nproc) nproc="${2:-}"; shift 2 || usage ;;
    --nproc=*) nproc="${1#*=}"; shift ;;
    --port) port="${2:-}"; shift 2 || usage ;;
    --port=*) port="${1#*=}"; shift ;;
    -h|--help) usage ;;
    --) shift; break ;;
    *) break ;;
  esac
done
[ $# -ge 1 ] || { echo "launch.sh: no PROGRAM given" >&2; usage; }
if ! [[ "$nproc" =~ ^[1-9][0-9]*$ ]]; then
  echo "launch.sh: --nproc must be a positive integer, got '${nproc}'" >&2; exit 2
fi

port_free() { ! (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }
if [ -z "$port" ]; then
  # A free port in the ephemeral-free range, so parallel launches do not collide.
  for _ in $(seq 1 50); do
    port=$((20000 + RANDOM % 20000))
    port_free "$port" && break
  done
fi
if ! [[ "$port" =~ ^[0-9]+$ ]] || [ "$port" -lt 1 ] || [ "$port" -gt 65535 ]; then
  echo "launch.sh: --port must be in 1..65535, got '${port}'" >&2; exit 2
fi

pids=()
# The ranks not yet seen to end, by pid.
declare -A alive
# Each rank leads its own process group (setsid), so stopping a rank stops what it started too.
# A rank already seen to end is stopped only through its group (what it started may still run):
# its pid may belong to another process by now, but a group's id is not reused while it has a
# member.
cleanup() {
  for p in "${pids[@]}"; do
    kill -- "-$p" 2> /dev/null || { [ -n "${alive[$p]:-}" ] && kill "$p" 2> /dev/null; }
  done
}
own_group=(); command -v setsid > /dev/null && own_group=(setsid)
trap 'cleanup; exit 130' INT TERM

for ((r = 0; r < nproc; r++)); do
  RANK=$r WORLD_SIZE=$nproc LOCAL_RANK=$r LOCAL_WORLD_SIZE=$nproc \
  MASTER_ADDR=127.0.0.1 MASTER_PORT=$port "${own_group[@]}" "$@" &
  pids+=($!)
  alive[$!]=1
done

status=0
# A rank that has ended: its status is noted, and the first failure stops the others.
ended() {
  unset "alive[$1]"
  if [ "$2" -ne 0 ] && [ "$status" -eq 0 ]; then
    status=$2
    echo "launch.sh: a rank (pid $1) exited with status $2; stopping the others" >&2
    cleanup
  fi
}
# Polled, not `wait -n`: bash 5.2's `wait -n PIDS` skips a rank that bash has already reaped
# and reported. That happens to a rank killed by a signal while `wait -n` returns another:
# the launcher then waited for the rest instead of stopping them. When none of PIDS is
# running, `wait -n` names none and unsets -p's variable: "done_pid: unbound variable" and
# status 1 in CI. bash reaps a rank as soon as it ends, so a rank that is no longer a process
# has ended, and `wait PID` returns its status from the statuses bash keeps.
# The naps grow from 10 ms to 100 ms, so that ranks which end at once are seen at once.
naps=(0.01 0.02 0.05 0.1)
nap=0
while [ "${#alive[@]}" -gt 0 ]; do
  for p in "${!alive[@]}"; do
    kill -0 "$p" 2> /dev/null && continue
    wait "$p" 2> /dev/null
    ended "$p" $?
  done
  [ "${#alive[@]}" -gt 0 ] || break
  sleep "${naps[nap]}"
  [ "$nap" -eq $((${#naps[@]} - 1)) ] || nap=$((nap + 1))
done
exit "$status"
