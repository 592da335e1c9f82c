#!/usr/bin/env bash
# What the debugging aids cost: the trainer's step time (cpu-small, world 2, MPI, one thread
# per rank) with nothing on, with profiling on (shapes and FLOPs recorded, the default), on
# without shapes, and with desync detection (FSDP_DEBUG_DESYNC=1), alternating runs; and, for
# profiling off, the bound from the ranges themselves: ns per disabled range
# (bench/range_cost.cpp) x FSDP ranges per step (counted in a trace) / step time. Writes
# bench/results/debug_cost.csv and prints the ratios of medians.
#   bench/debug_cost.sh [--rounds 3]
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/../scripts/lib.sh"
root="$FSDP_ROOT"
build="${BUILD_DIR:-$root/build}"
rounds=3
while [ $# -gt 0 ]; do
  case "$1" in
    --rounds) rounds="$2"; shift 2 ;;
    *) echo "usage: $0 [--rounds N]" >&2; exit 2 ;;
  esac
done
TRAIN="$build/bin/train_minillm"
COST="$build/bin/range_cost"
PY="$FSDP_PY"
for f in "$TRAIN" "$COST"; do
  [ -x "$f" ] || { echo "profiler_cost: build first ($f missing)" >&2; exit 2; }
done
mpi=("${FSDP_MPIRUN[@]}" -n 2)
fsdp_one_thread
fsdp_scratch
out="$root/bench/results/debug_cost.csv"
echo "mode,round,median_step_s" > "$out"
# Steps 2..11 are measured in every mode; "on" profiles exactly those steps.
common=(--preset cpu-small --steps 12 --threads 1 --data synthetic)
for round in $(seq 1 "$rounds"); do
  for mode in off on on-no-shapes desync; do
    extra=()
    desync=0
    case "$mode" in
      desync) desync=1 ;;
      on) extra=(--profile-steps 2:11 --profile-dir "$tmp/prof") ;;
      on-no-shapes) extra=(--profile-steps 2:11 --profile-dir "$tmp/prof_ns" --no-profile-shapes) ;;
    esac
    FSDP_DEBUG_DESYNC=$desync "${mpi[@]}" "$TRAIN" "${common[@]}" "${extra[@]}" --metrics-out "$tmp/m.jsonl" > "$tmp/log" 2>&1 ||
      { cat "$tmp/log"; exit 1; }
    med=$("$PY" -c '
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
print(statistics.median(r["step_s"] for r in rows if 2 <= r["step"] <= 11))' "$tmp/m.jsonl")
    echo "$mode,$round,$med" >> "$out"
    echo "round $round $mode: median step $med s"
  done
done
ns=$("$COST" | tee /dev/stderr | awk '/^range_cost_ns/ {print $2}')
"$PY" - "$out" "$tmp/prof/rank0.json" "$ns" <<'PY' | tee "$root/bench/results/debug_cost.txt"
import csv, json, statistics, sys
rows = list(csv.DictReader(open(sys.argv[1])))
med = {m: statistics.median(float(r["median_step_s"]) for r in rows if r["mode"] == m)
       for m in ("off", "on", "on-no-shapes", "desync")}
trace = json.load(open(sys.argv[2]))
ranges = sum(1 for e in trace["traceEvents"] if e.get("ph") == "X" and e["name"].startswith("fsdp::"))
per_step = ranges / 10  # steps 2..11, rank 0 (both of its threads)
ns = float(sys.argv[3])
off_bound = per_step * ns * 1e-9 / med["off"]
print(f"profiling on (shapes + FLOPs): {med['on'] / med['off']:.3f}x the step time off; "
      f"on without shapes: {med['on-no-shapes'] / med['off']:.3f}x "
      f"(medians of {len(rows) // 4} alternating runs; off {med['off']:.3f} s/step)")
print(f"desync detection (FSDP_DEBUG_DESYNC=1): {med['desync'] / med['off']:.3f}x the step time")
print(f"profiling off: {per_step:.0f} FSDP ranges per step x {ns:.1f} ns = "
      f"{per_step * ns / 1e3:.1f} us per step, {100 * off_bound:.4f}% of the step")
PY
"$root/bench/rewrite_report.sh" "$PY"
