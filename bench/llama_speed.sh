#!/usr/bin/env bash
# The Llama model's speed and memory beside PyTorch's: train_llama against transformers'
# LlamaForCausalLM (bench/reference/py_llama.py: one process at world 1, DDP and FSDP2 over gloo
# at 2 and 4), fused AdamW on both sides, the same preset (hidden 512, 8 layers, 8 heads, 2 KV
# heads, intermediate 1536, vocab 32000, seq 256: 56.9M parameters), 2 sequences per rank, one
# thread per rank, the same token file. The programs alternate within each round; the table
# gives medians over rounds of each run's median tokens/s (the first two steps left out) and its
# peak RSS per rank, and the ratios. At worlds 2 and 4 it also runs that many one-process runs
# at once (no communication): the ceiling this machine's cores and memory allow. Writes
# bench/results/llama_speed.csv, and the "Llama" section of bench/RESULTS.md
# (bench/report_llama.py).
#   bench/llama_speed.sh [--rounds N] [--steps N]
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
    *) echo "usage: bench/llama_speed.sh [--rounds N] [--steps N]" >&2; exit 2 ;;
  esac
done
fsdp_one_thread
fsdp_scratch
"$FSDP_PY" "$root/bench/llama_bench_inputs.py" "$tmp"
csv="$out/llama_speed.csv"
echo "program,world,round,tokens_per_s,peak_rss_mb" > "$csv"
cpp() {  # world
  local w="$1" launch=()
  [ "$w" -gt 1 ] && launch=("${FSDP_MPIRUN[@]}" -np "$w")
  "${launch[@]}" "$build/bin/train_llama" --config "$tmp/config.json" --data-tokens "$tmp/tokens.bin" \
    --seq 256 --batch $((2 * w)) --steps "$steps" --threads 1 --lr 3e-4 --lr-schedule constant \
    --nonfinite off > "$tmp/c.txt" 2>&1 || { tail -20 "$tmp/c.txt"; exit 1; }
  sed -nE 's/^done: .*median ([0-9.]+) tok\/s.*peak ([0-9]+) MiB\/rank.*/\1,\2/p' "$tmp/c.txt"
}
solo() {  # world: that many one-process runs at once, 2 sequences each, no communication at all:
  # the most `world` ranks can do on this machine. Their tokens/s summed, the largest peak RSS.
  local w="$1" pids=() i
  for ((i = 0; i < w; i++)); do
    "$build/bin/train_llama" --config "$tmp/config.json" --data-tokens "$tmp/tokens.bin" \
      --seq 256 --batch 2 --steps "$steps" --threads 1 --lr 3e-4 --lr-schedule constant \
      --nonfinite off > "$tmp/s$i.txt" 2>&1 &
    pids+=($!)
  done
  for i in "${!pids[@]}"; do wait "${pids[$i]}" || { tail -20 "$tmp/s$i.txt"; exit 1; }; done
  for ((i = 0; i < w; i++)); do
    sed -nE 's/^done: .*median ([0-9.]+) tok\/s.*peak ([0-9]+) MiB\/rank.*/\1 \2/p' "$tmp/s$i.txt"
  done | awk '{ t += $1; if ($2 > m) m = $2 } END { printf "%.1f,%d\n", t, m }'
}
py() {  # mode world
  "$FSDP_PY" "$root/bench/reference/py_llama.py" --mode "$1" --world "$2" --batch 2 --steps "$steps" \
    --data-tokens "$tmp/tokens.bin" > "$tmp/p.txt" 2>&1 || { tail -20 "$tmp/p.txt"; exit 1; }
  sed -nE 's/.*RESULT .*tokens_per_s=([0-9.]+).*peak_mem_mb=([0-9.]+).*/\1,\2/p' "$tmp/p.txt"
}
for ((r = 0; r < rounds; r++)); do
  echo "fsdp-cpp,1,$r,$(cpp 1)" >> "$csv"
  echo "pytorch-local,1,$r,$(py local 1)" >> "$csv"
  for w in 2 4; do
    echo "fsdp-cpp,$w,$r,$(cpp "$w")" >> "$csv"
    echo "pytorch-ddp,$w,$r,$(py ddp "$w")" >> "$csv"
    echo "pytorch-fsdp2,$w,$r,$(py fsdp2 "$w")" >> "$csv"
    echo "independent-runs,$w,$r,$(solo "$w")" >> "$csv"
  done
  echo "round $((r + 1)) of $rounds done"
done
bash "$root/bench/rewrite_report.sh" "$FSDP_PY"
"$FSDP_PY" -c "import sys; sys.path.insert(0, sys.argv[1]); import report_llama; print('\\n'.join(report_llama.section(sys.argv[2])))" "$root/bench" "$out"
