#!/usr/bin/env bash
# The planner's figures for bench/RESULTS.md: its predictions against measured runs on this
# machine (tests/tools/planner_check.sh --comm, the ctest's own script) and its plan of the
# reference preset on 8 and 64 H200 GPUs in hybrid layouts (assumed link figures, see
# docs/scale.md). Writes bench/results/planner_check.txt and plan_reference.md, then rewrites
# bench/RESULTS.md.
#   bench/planner.sh [BUILD_DIR]
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/../scripts/lib.sh"
root="$FSDP_ROOT"
build="${1:-$root/build}"
out="$root/bench/results"
mpi=("${FSDP_MPIRUN[@]}")
"$root/tests/tools/planner_check.sh" --comm "$build/bin/collectives_bench" "$build/bin/train_minillm" \
  "${mpi[@]}" | tee "$out/planner_check.txt"
fsdp_scratch
{
  echo "| GPUs | replicas x shards | params + grads + AdamW shards | gathered params | comm buffers | activations | total per GPU | all-gather | reduce-scatter | all-reduce | comm per step |"
  echo "|---|---|---|---|---|---|---|---|---|---|---|"
  for layout in "8 1" "8 2" "8 4" "8 8" "64 1" "64 8" "64 16" "64 64"; do
    read -r world replicas <<< "$layout"
    "$build/bin/fsdp_plan" minillm --preset reference --dtype bf16 --plan-world "$world" \
      --replicas "$replicas" --plan-ranks-per-host 8 --plan-json "$tmp/p.json" > /dev/null
    python3 - "$tmp/p.json" <<'PY'
import json, sys
j = json.load(open(sys.argv[1])); m = j["memory"]; G = 2**30
c = {x["op"]: x["seconds_per_step"] for x in j["collectives"]}
ms = lambda op: f"{1e3 * c[op]:.1f} ms" if op in c else "-"
print(f"| {j['world']} | {j['replicas']} x {j['shards']} "
      f"| {(m['param_shards'] + m['grad_shards'] + m['optimizer_states']) / G:.2f} GiB "
      f"| {m['gathered_params'] / G:.2f} GiB | {m['comm_buffers'] / G:.2f} GiB "
      f"| {m['activations'] / G:.2f} GiB | {m['total'] / G:.2f} GiB | {ms('all_gather')} "
      f"| {ms('reduce_scatter')} | {ms('all_reduce')} | {1e3 * j['comm_seconds_per_step']:.1f} ms |")
PY
  done
} > "$out/plan_reference.md"
py="$FSDP_PY"
"$root/bench/rewrite_report.sh" "$py"
