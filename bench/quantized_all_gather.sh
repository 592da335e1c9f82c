#!/usr/bin/env bash
# The quantized weight all-gather (fsdp::quantized_all_gather, ZeRO++'s qwZ) against the plain
# one: train_minillm --preset cpu-small at world 2 under MPI, fp32 and bf16, each with and without
# --quantize-all-gather 256, from the same seed and data. Records every step's loss (the curves
# side by side) and the all-gather input bytes per rank of two profiled steps (the engine's own
# count); no speed (every rank shares one host's memory: fewer bytes buy nothing here). Writes
# bench/results/qwz_losses.csv and qwz_summary.csv; bench/report_qwz.py makes RESULTS.md's section.
#   bench/quantized_all_gather.sh [--steps N]
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/../scripts/lib.sh"
root="$FSDP_ROOT"
build="${BUILD_DIR:-$root/build}"
out="$root/bench/results"
steps=60
while [ $# -gt 0 ]; do
  case "$1" in
    --steps) steps="$2"; shift 2 ;;
    *) echo "usage: bench/quantized_all_gather.sh [--steps N]" >&2; exit 2 ;;
  esac
done
fsdp_scratch
echo "dtype,block,step,loss" > "$out/qwz_losses.csv"
echo "dtype,block,all_gather_mib_per_step" > "$out/qwz_summary.csv"
for dtype in fp32 bf16; do
  for block in 0 256; do
    "${FSDP_MPIRUN[@]}" -np 2 "$build/bin/train_minillm" --preset cpu-small --steps "$steps" \
      --dtype "$dtype" --quantize-all-gather "$block" --metrics-out "$tmp/m.jsonl" \
      --profile-steps 2:3 --profile-dir "$tmp/prof" > "$tmp/log.txt" 2>&1 \
      || { tail -20 "$tmp/log.txt"; exit 1; }
    "$FSDP_PY" - "$tmp/m.jsonl" "$tmp/log.txt" "$dtype" "$block" "$out" <<'PY'
import json, re, sys
metrics, log, dtype, block, out = sys.argv[1:]
rows = [json.loads(l) for l in open(metrics) if l.strip()]
with open(f"{out}/qwz_losses.csv", "a") as f:
    for r in rows:
        f.write(f"{dtype},{block},{r['step']},{r['loss']:.6f}\n")
gathered = re.search(r"the process group collective inputs per rank: all-gathers ([0-9.]+) MiB",
                     open(log).read())
with open(f"{out}/qwz_summary.csv", "a") as f:
    f.write(f"{dtype},{block},{float(gathered.group(1)) / 2:.3f}\n")
PY
    echo "$dtype block $block done"
  done
done
bash "$root/bench/rewrite_report.sh" "$FSDP_PY"
