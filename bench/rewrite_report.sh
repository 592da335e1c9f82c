#!/usr/bin/env bash
# Rewrites bench/RESULTS.md from bench/results/ with bench/make_report.py, when the results of
# bench/compare_pytorch.sh (the report's base: speed.csv, matmul.txt) are there. Sourced or run
# by the benchmark scripts after they update their own results.
#   bench/rewrite_report.sh PYTHON
set -uo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
out="$root/bench/results"
py="${1:-}"
peak=$(awk '{print $2}' "$out/matmul.txt" 2>/dev/null || true)
if [ -n "$peak" ] && [ -e "$out/speed.csv" ] && [ -x "$py" ]; then
  "$py" "$root/bench/make_report.py" --results "$out" --peak-gflops "$peak" \
    --report "$root/bench/RESULTS.md" && echo "rewrote bench/RESULTS.md"
else
  echo "bench/RESULTS.md not rewritten: run bench/compare_pytorch.sh once first" >&2
fi
