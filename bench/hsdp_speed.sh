#!/usr/bin/env bash
# Hybrid sharding against plain FSDP, fsdp-cpp and PyTorch FSDP2 side by side: cpu-small at
# world 4 as 1 x 4 (plain) and 2 x 2 (HSDP), the four programs alternating round by round;
# writes bench/results/hsdp.csv (program,layout,round,tokens_per_s,peak_rss_mb) and rewrites
# bench/RESULTS.md. On one machine HSDP has no slow link to spare: this measures what the
# layout itself costs or saves (1/2 instead of 1/4 of the state per rank, collectives of 2
# ranks instead of 4, plus an all-reduce), not its gain between machines.
#   bench/hsdp_speed.sh [--rounds N]
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/../scripts/lib.sh"
root="$FSDP_ROOT"
build="${BUILD_DIR:-$root/build}"
out="$root/bench/results"
rounds=3
[ "${1:-}" = "--rounds" ] && rounds="$2"
py="$FSDP_PY"
mpi=("${FSDP_MPIRUN[@]}")
fsdp_one_thread
steps=10
fsdp_scratch
echo "program,layout,round,tokens_per_s,peak_rss_mb" > "$out/hsdp.csv"
rss() { awk '/MAXRSS_KB/ { printf "%.0f", $2 / 1024 }' "$1"; }
for ((r = 0; r < rounds; r++)); do
  for replicas in 1 2; do
    layout="${replicas}x$((4 / replicas))"
    /usr/bin/time -f "MAXRSS_KB %M" "${mpi[@]}" -np 4 "$build/bin/train_minillm" --threads 1 \
      --steps $steps --batch 16 --data synthetic --replicas "$replicas" > "$tmp/c.txt" 2>&1 \
      || { tail -20 "$tmp/c.txt"; exit 1; }
    tps=$(sed -nE 's/^done: .*median ([0-9.]+) tok\/s.*/\1/p' "$tmp/c.txt")
    echo "fsdp-cpp,$layout,$r,$tps,$(rss "$tmp/c.txt")" >> "$out/hsdp.csv"
    /usr/bin/time -f "MAXRSS_KB %M" "$py" "$root/bench/reference/py_minillm.py" --mode fsdp2 \
      --world 4 --replicas "$replicas" --steps $steps --batch 4 --data synthetic \
      --optimizer fused-adamw --port=$((20000 + RANDOM % 20000)) > "$tmp/p.txt" 2>&1 || true
    tps=$(sed -nE 's/.*RESULT .*tokens_per_s=([0-9.]+).*/\1/p' "$tmp/p.txt")
    echo "pytorch-fsdp2,$layout,$r,$tps,$(rss "$tmp/p.txt")" >> "$out/hsdp.csv"
  done
done
cat "$out/hsdp.csv"
"$root/bench/rewrite_report.sh" "$py"
