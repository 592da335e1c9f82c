#!/usr/bin/env bash
# Tensor parallelism's speed and memory on this machine: train_llama at dp 2 x tp 2 against
# PyTorch's own 2-D (bench/reference/py_llama.py --tp 2: parallelize_module with TorchTitan's
# Llama plan, fully_shard on the dp dimension, loss_parallel, over gloo), and both beside FSDP
# alone at 4 x 1 (train_llama, and PyTorch FSDP2). The preset of bench/llama_speed.sh (hidden
# 512, 8 layers, 8 heads, 2 KV heads, intermediate 1536, vocab 32000, seq 256: 56.9M
# parameters), the same global batch of 8 sequences (4 per data-parallel rank at 2 x 2, 2 per
# rank at 4 x 1), fused AdamW, one thread per rank, the same token file. The programs alternate
# within each round; the table gives medians over rounds of each run's median tokens/s (the
# first two steps left out) and its peak RSS per rank. Writes bench/results/tp_speed.csv.
#   bench/tp_speed.sh [--rounds N] [--steps N]
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/../scripts/lib.sh"
root="$FSDP_ROOT"
build="${BUILD_DIR:-$root/build}"
out="$root/bench/results"
rounds=3 steps=6
while [ $# -gt 0 ]; do
  case "$1" in
    --rounds) rounds="$2"; shift 2 ;;
    --steps) steps="$2"; shift 2 ;;
    *) echo "usage: bench/tp_speed.sh [--rounds N] [--steps N]" >&2; exit 2 ;;
  esac
done
fsdp_one_thread
fsdp_scratch
"$FSDP_PY" "$root/bench/llama_bench_inputs.py" "$tmp"
csv="$out/tp_speed.csv"
echo "program,layout,round,tokens_per_s,peak_rss_mb" > "$csv"
cpp() {  # tp
  "${FSDP_MPIRUN[@]}" -np 4 "$build/bin/train_llama" --config "$tmp/config.json" \
    --data-tokens "$tmp/tokens.bin" --seq 256 --batch 8 --tp "$1" --steps "$steps" --threads 1 \
    --lr 3e-4 --lr-schedule constant --nonfinite off --optimizer fused-adamw > "$tmp/c.txt" 2>&1 \
    || { tail -20 "$tmp/c.txt"; exit 1; }
  sed -nE 's/^done: .*median ([0-9.]+) tok\/s.*peak ([0-9]+) MiB\/rank.*/\1,\2/p' "$tmp/c.txt"
}
py() {  # tp
  "$FSDP_PY" "$root/bench/reference/py_llama.py" --mode fsdp2 --world 4 --tp "$1" \
    --batch $((8 * $1 / 4)) --steps "$steps" --data-tokens "$tmp/tokens.bin" > "$tmp/p.txt" 2>&1 \
    || { tail -20 "$tmp/p.txt"; exit 1; }
  sed -nE 's/.*RESULT .*tokens_per_s=([0-9.]+).*peak_mem_mb=([0-9.]+).*/\1,\2/p' "$tmp/p.txt"
}
for ((r = 0; r < rounds; r++)); do
  echo "fsdp-cpp,2x2,$r,$(cpp 2)" >> "$csv"
  echo "pytorch-tp-fsdp2,2x2,$r,$(py 2)" >> "$csv"
  echo "fsdp-cpp,4x1,$r,$(cpp 1)" >> "$csv"
  echo "pytorch-fsdp2,4x1,$r,$(py 1)" >> "$csv"
  echo "round $((r + 1)) of $rounds done"
done
"$FSDP_PY" - "$csv" <<'PY'
import csv, statistics, sys
rows = list(csv.DictReader(open(sys.argv[1])))
med = {}
for key in sorted({(r["program"], r["layout"]) for r in rows}):
    sel = [r for r in rows if (r["program"], r["layout"]) == key]
    med[key] = (statistics.median(float(r["tokens_per_s"]) for r in sel),
                statistics.median(float(r["peak_rss_mb"]) for r in sel), len(sel))
print("| layout (dp x tp) | program | tokens/s | peak RSS per rank (MiB) | fsdp-cpp speed ratio | fsdp-cpp memory ratio |")
print("|---|---|---|---|---|---|")
for layout, ref in [("2x2", "pytorch-tp-fsdp2"), ("4x1", "pytorch-fsdp2")]:
    c = med[("fsdp-cpp", layout)]
    p = med[(ref, layout)]
    print(f"| {layout.replace('x', ' x ')} | fsdp-cpp | {c[0]:.0f} | {c[1]:.0f} | | |")
    print(f"| {layout.replace('x', ' x ')} | {ref} | {p[0]:.0f} | {p[1]:.0f} | {c[0] / p[0]:.2f}x | {c[1] / p[1]:.2f}x |")
print(f"rounds: {med[('fsdp-cpp', '2x2')][2]}")
PY
