#!/usr/bin/env bash
# LoRA against full fine-tuning at a published size: SmolLM2-135M's shape (30 layers, hidden
# 576, 9 heads over 3 key/value heads, tied embeddings, vocabulary 49152; random weights written
# by hf_llama.py make-tiny) at world 2 on this machine, 2 sequences of 256 tokens per rank, fp32.
# fsdp-cpp (train_llama under MPI) and PyTorch FSDP2 (transformers; PEFT for LoRA) over gloo,
# each full and with LoRA rank 16 on every Linear of the layers (PEFT's adapters, the same file
# for both), alternating, ROUNDS rounds of STEPS steps. Records the peak RSS of the largest rank
# and the median step time (fsdp-cpp: its steps after the first; PyTorch: the run's time over
# its steps, start-up excluded). Writes bench/results/lora_memory.csv; bench/report_lora.py
# makes RESULTS.md's section.
#   bench/lora_memory.sh [--rounds N] [--steps N]
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/../scripts/lib.sh"
root="$FSDP_ROOT"
build="${BUILD_DIR:-$root/build}"
out="$root/bench/results"
rounds=2
steps=4
while [ $# -gt 0 ]; do
  case "$1" in
    --rounds) rounds="$2"; shift 2 ;;
    --steps) steps="$2"; shift 2 ;;
    *) echo "usage: bench/lora_memory.sh [--rounds N] [--steps N]" >&2; exit 2 ;;
  esac
done
fsdp_scratch
fsdp_one_thread
ref="$root/tests/reference/hf_llama.py"
"$FSDP_PY" "$ref" make-tiny --out "$tmp/model" --vocab 49152 --hidden 576 --layers 30 --heads 9 \
  --kv-heads 3 --intermediate 1536 --tied --rope-theta 100000 --max-position 8192 --init-std 0.02 \
  > /dev/null
"$FSDP_PY" "$ref" make-lora --hf-dir "$tmp/model" --out "$tmp/adapter" --rank 16 --alpha 32 > /dev/null
"$FSDP_PY" -c "import numpy as np; np.random.default_rng(0).integers(0, 49152, 200000).astype('<u2').tofile('$tmp/train.bin')"
common=(--hf-dir "$tmp/model" --data-tokens "$tmp/train.bin" --seq 256 --batch 4 --steps "$steps"
        --lr 1e-4 --warmup 0)
echo "framework,mode,round,peak_rss_mib,step_s,trainable" > "$out/lora_memory.csv"
for round in $(seq 1 "$rounds"); do
  for mode in full lora; do
    extra=(); [ "$mode" = lora ] && extra=(--lora-adapter "$tmp/adapter")
    "${FSDP_MPIRUN[@]}" -np 2 "$build/bin/train_llama" "${common[@]}" "${extra[@]}" --threads 1 \
      --metrics-out "$tmp/cpp.jsonl" > "$tmp/cpp.log" 2>&1 || { tail -20 "$tmp/cpp.log"; exit 1; }
    "$FSDP_PY" - "$tmp/cpp.jsonl" "$tmp/cpp.log" "$mode" "$round" >> "$out/lora_memory.csv" <<'PY'
import json, re, statistics, sys
steps = [json.loads(l) for l in open(sys.argv[1]) if '"step_s"' in l]
log = open(sys.argv[2]).read()
m = re.search(r"(\d+) trainable parameters", log)
trainable = m.group(1) if m else re.search(r"\| ([\d.]+)M parameters", log).group(1) + "e6"
peak = max(s["peak_mem_bytes"] for s in steps) / 2**20
print(f"fsdp-cpp,{sys.argv[3]},{sys.argv[4]},{peak:.0f},{statistics.median(s['step_s'] for s in steps[1:]):.3f},{trainable}")
PY
    "$FSDP_PY" "$ref" train "${common[@]}" --world 2 --mode fsdp2 "${extra[@]}" > "$tmp/py.log" 2>&1 \
      || { tail -20 "$tmp/py.log"; exit 1; }
    "$FSDP_PY" - "$tmp/py.log" "$mode" "$round" "$steps" >> "$out/lora_memory.csv" <<'PY'
import re, sys
line = [l for l in open(sys.argv[1]) if l.startswith("RESULT ")][-1]
peak = re.search(r"peak_rss_mib=(\d+)", line).group(1)
t = float(re.search(r"time_s=([\d.]+)", line).group(1)) / int(sys.argv[4])
print(f"pytorch-fsdp2,{sys.argv[2]},{sys.argv[3]},{peak},{t:.3f},")
PY
    tail -2 "$out/lora_memory.csv"
  done
done
"$FSDP_PY" "$root/bench/report_lora.py" "$out/lora_memory.csv"
bash "$root/bench/rewrite_report.sh" "$FSDP_PY" || true
