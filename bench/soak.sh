#!/usr/bin/env bash
# Soak: the trainer at world 4 (MPI, cpu-small, one thread per rank) for MINUTES (default 30),
# saving a checkpoint every 5 steps (the last 2 kept), while every 10 s each rank's resident
# memory, open file descriptors and threads are sampled from /proc. Reports growth after the
# warm-up (the first 20% of the run) and writes bench/results/soak.csv.
#   bench/soak.sh [--minutes M]
set -uo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/../scripts/lib.sh"
root="$FSDP_ROOT"
build="${BUILD_DIR:-$root/build}"
minutes=30
while [ $# -gt 0 ]; do
  case "$1" in
    --minutes) minutes="$2"; shift 2 ;;
    *) echo "usage: $0 [--minutes M]" >&2; exit 2 ;;
  esac
done
TRAIN="$build/bin/train_minillm"
PY="$FSDP_PY"
[ -x "$TRAIN" ] || { echo "soak: build first ($TRAIN missing)" >&2; exit 2; }
mpi=("${FSDP_MPIRUN[@]}" -n 4)
fsdp_one_thread
# The trainer is stopped before its folder is removed (the exit steps run in this order).
job=""
fsdp_on_exit '[ -z "$job" ] || kill "$job" 2>/dev/null || true'
fsdp_scratch
out="$root/bench/results/soak.csv"
"${mpi[@]}" "$TRAIN" --preset cpu-small --threads 1 --steps 1000000 --save-dir "$tmp/ckpt" \
  --save-every 5 --keep 2 > "$tmp/log" 2>&1 &
job=$!
echo "t_s,pid,rss_kib,fds,threads,step" > "$out"
end=$((SECONDS + minutes * 60))
while [ $SECONDS -lt $end ] && kill -0 "$job" 2>/dev/null; do
  sleep 10
  step=$(grep -o "^step *[0-9]*" "$tmp/log" | tail -1 | awk '{print $2}')
  for pid in $(pgrep -f "$TRAIN --preset cpu-small"); do
    [ -r "/proc/$pid/status" ] || continue
    rss=$(awk '/^VmRSS/ {print $2}' "/proc/$pid/status")
    thr=$(awk '/^Threads/ {print $2}' "/proc/$pid/status")
    fds=$(ls "/proc/$pid/fd" 2>/dev/null | wc -l)
    echo "$SECONDS,$pid,$rss,$fds,$thr,${step:-0}" >> "$out"
  done
done
kill -0 "$job" 2>/dev/null || { echo "soak: the trainer stopped early"; tail -20 "$tmp/log"; exit 1; }
kill "$job"; wait "$job" 2>/dev/null || true
"$PY" "$root/bench/soak_verdict.py" "$out" | tee "$root/bench/results/soak.txt"
verdict=${PIPESTATUS[0]}
"$root/bench/rewrite_report.sh" "$PY"
exit "$verdict"
