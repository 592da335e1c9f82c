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
# Each rank leads its own process group (setsid), so stopping a rank stops what it started too.
cleanup() { for p in "${pids[@]}"; do kill -- "-$p" 2>/dev/null || kill "$p" 2>/dev/null; done; }
own_group=(); command -v setsid > /dev/null && own_group=(setsid)
trap 'cleanup; exit 130' INT TERM

for ((r = 0; r < nproc; r++)); do
  RANK=$r WORLD_SIZE=$nproc LOCAL_RANK=$r LOCAL_WORLD_SIZE=$nproc \
  MASTER_ADDR=127.0.0.1 MASTER_PORT=$port "${own_group[@]}" "$@" &
  pids+=($!)
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
# The ranks not reaped yet: `wait -n` on a list naming one already reaped returns 127 at once
# (a rank "exiting with 127, pid unknown" was seen), so each is dropped once it is reaped.
declare -A alive
for p in "${pids[@]}"; do alive[$p]=1; done
while [ "${#alive[@]}" -gt 0 ]; do
  done_pid=""
  wait -n -p done_pid "${!alive[@]}" 2>/dev/null
  rc=$?
  if [ -n "${done_pid:-}" ]; then ended "$done_pid" "$rc"; continue; fi
  # `wait -n` named no rank (and unset done_pid): bash had already reaped and reported the
  # ranks that ended, as it did under load for the ranks `cleanup` had just stopped (about one
  # launch in 200 on a busy 2-core machine). `wait PID` still returns a reaped child's status;
  # a rank still running is left for the next round.
  found=0
  for p in "${!alive[@]}"; do
    if ! kill -0 "$p" 2>/dev/null; then wait "$p" 2>/dev/null; ended "$p" $?; found=1; fi
  done
  [ "$found" -eq 1 ] || sleep 0.1
done
exit "$status"
