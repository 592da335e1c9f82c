#!/usr/bin/env bash
# The runtime's own cost: a Llama whose work is mostly the framework's, 48 tiny decoder layers
# (hidden 64, 4 heads, 2 KV heads, intermediate 160, vocab 1000: 1.2M parameters), every layer a
# unit, 16 tokens per rank (one sequence of 16), one thread per rank, fp32, fused AdamW on both
# sides. train_llama against transformers' LlamaForCausalLM (bench/reference/py_llama.py) in one
# process (plain PyTorch) at world 1 and under FSDP2 over gloo at worlds 1 and 2 (fully_shard on
# every layer, then the root, as train_llama shards). The programs alternate within each round;
# the table gives medians over rounds of each run's median tokens/s (the first two steps left
# out), and the ratios. Per unit and step FSDP2 runs Python hooks (pre/post forward, pre/post
# backward) around tiny kernels: what a C++ runtime should win here is that overhead. Writes
# bench/results/tiny_units.csv and the "Tiny units" section of bench/RESULTS.md
# (bench/report_tiny_units.py).
#   bench/tiny_units.sh [--rounds N] [--steps N]
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/../scripts/lib.sh"
root="$FSDP_ROOT"
build="${BUILD_DIR:-$root/build}"
out="$root/bench/results"
rounds=3 steps=40
while [ $# -gt 0 ]; do
  case "$1" in
    --rounds) rounds="$2"; shift 2 ;;
    --steps) steps="$2"; shift 2 ;;
    *) echo "usage: bench/tiny_units.sh [--rounds N] [--steps N]" >&2; exit 2 ;;
  esac
done
mkdir -p "$out"
fsdp_one_thread
fsdp_scratch
shape=(--vocab 1000 --hidden 64 --layers 48 --heads 4 --kv-heads 2 --intermediate 160)
"$FSDP_PY" - "$tmp" <<'PY'
import json, sys, numpy as np
config = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": 1000,
          "hidden_size": 64, "intermediate_size": 160, "num_hidden_layers": 48,
          "num_attention_heads": 4, "num_key_value_heads": 2, "max_position_embeddings": 2048,
          "rms_norm_eps": 1e-5, "rope_theta": 10000.0, "tie_word_embeddings": False,
          "hidden_act": "silu", "initializer_range": 0.02}
json.dump(config, open(f"{sys.argv[1]}/config.json", "w"))
np.random.default_rng(0).integers(0, 1000, 1_000_000).astype("<u2").tofile(f"{sys.argv[1]}/tokens.bin")
PY
csv="$out/tiny_units.csv"
echo "program,world,round,tokens_per_s" > "$csv"
cpp() {  # world
  local w="$1" launch=()
  [ "$w" -gt 1 ] && launch=("${FSDP_MPIRUN[@]}" -np "$w")
  "${launch[@]}" "$build/bin/train_llama" --config "$tmp/config.json" \
    --data-tokens "$tmp/tokens.bin" --seq 16 --batch "$w" --steps "$steps" --threads 1 \
    --lr 3e-4 --lr-schedule constant --nonfinite off > "$tmp/c.txt" 2>&1 \
    || { tail -20 "$tmp/c.txt"; exit 1; }
  sed -nE 's/^done: .*median ([0-9.]+) tok\/s.*/\1/p' "$tmp/c.txt"
}
py() {  # mode world
  "$FSDP_PY" "$root/bench/reference/py_llama.py" --mode "$1" --world "$2" "${shape[@]}" \
    --seq 16 --batch 1 --steps "$steps" --data-tokens "$tmp/tokens.bin" > "$tmp/p.txt" 2>&1 \
    || { tail -20 "$tmp/p.txt"; exit 1; }
  sed -nE 's/.*RESULT .*tokens_per_s=([0-9.]+).*/\1/p' "$tmp/p.txt"
}
for ((r = 0; r < rounds; r++)); do
  echo "fsdp-cpp,1,$r,$(cpp 1)" >> "$csv"
  echo "pytorch-local,1,$r,$(py local 1)" >> "$csv"
  echo "pytorch-fsdp2,1,$r,$(py fsdp2 1)" >> "$csv"
  echo "fsdp-cpp,2,$r,$(cpp 2)" >> "$csv"
  echo "pytorch-fsdp2,2,$r,$(py fsdp2 2)" >> "$csv"
  echo "round $((r + 1)) of $rounds done"
done
bash "$root/bench/rewrite_report.sh" "$FSDP_PY"
"$FSDP_PY" -c "import sys; sys.path.insert(0, sys.argv[1]); import report_tiny_units; print('\\n'.join(report_tiny_units.section(sys.argv[2])))" "$root/bench" "$out"
