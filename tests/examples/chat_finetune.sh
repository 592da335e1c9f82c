#!/usr/bin/env bash
# Chat data end to end: conversations (JSONL, both forms) through scripts/tokenize_chat.py with a
# model's own chat template (a byte-level BPE tokenizer.json with Llama 3's template) into a
# token file and a loss mask that counts only the assistant turns; train_llama --loss-mask at
# world 2 (MPI) then gives the losses transformers trained by PyTorch FSDP2 over gloo gives with
# labels of -100 outside the assistant turns (1e-5). Bad input is refused by name, nothing
# written or trained: a conversation without an assistant turn, a tokenizer without a chat
# template, a loss mask of the wrong length.
#   chat_finetune.sh TRAIN_LLAMA PYTHON MPIEXEC [MPIEXEC_FLAGS...]
set -uo pipefail
bin="$1"; py="$2"; shift 2
mpiexec=("$@")
source "$(dirname "${BASH_SOURCE[0]}")/../../scripts/lib.sh"
root="$FSDP_ROOT"
ref="$root/tests/reference"
fsdp_scratch
fsdp_one_thread
fsdp_pyfork
fail=0

"$py" "$ref/make_chat_tokenizer.py" --out "$tmp/model" --vocab-size 600 \
  /usr/share/common-licenses/GPL-3 > "$tmp/tok.log" 2>&1 || { cat "$tmp/tok.log"; exit 1; }
"$py" "$ref/make_chats.py" "$tmp/chats.jsonl" --count 300 --seed 1 || exit 1
# The first 260 conversations train; the last 40 are held out as masked validation data.
head -n 260 "$tmp/chats.jsonl" > "$tmp/train.jsonl"
tail -n 40 "$tmp/chats.jsonl" > "$tmp/held_out.jsonl"
"$py" "$root/scripts/tokenize_chat.py" "$tmp/train.jsonl" --tokenizer "$tmp/model" \
  --out-dir "$tmp/data" > "$tmp/tokenize.log" || { cat "$tmp/tokenize.log"; exit 1; }
cat "$tmp/tokenize.log"
"$py" "$root/scripts/tokenize_chat.py" "$tmp/held_out.jsonl" --tokenizer "$tmp/model" \
  --out-dir "$tmp/val" > /dev/null || exit 1
# The mask counts the assistant turns' text and end-of-turn tokens, and nothing of the prompts.
"$py" - "$tmp" <<'PY' || fail=1
import sys, numpy as np, transformers
d = sys.argv[1]
t = transformers.AutoTokenizer.from_pretrained(f"{d}/model")
ids, mask = np.fromfile(f"{d}/data/train.bin", "<u2"), np.fromfile(f"{d}/data/train.mask", "u1")
counted = t.decode(ids[mask == 1])
first = t.decode(ids[:200][mask[:200] == 1])
assert first.startswith("The sum is "), first
assert "What is" not in counted and "You add numbers" not in counted and "Add " not in counted, counted[:300]
# 130 prompt/completion pairs (one assistant turn) and 130 conversations of two.
assert counted.count("<|eot_id|>") == 130 + 2 * 130, counted.count("<|eot_id|>")
print(f"mask: {int(mask.sum())} of {len(ids)} tokens counted, the assistant turns only")
PY

vocab=$("$py" -c "import transformers, sys; print(len(transformers.AutoTokenizer.from_pretrained(sys.argv[1])))" "$tmp/model")
"$py" "$ref/hf_llama.py" make-tiny --out "$tmp/base" --vocab "$vocab" --hidden 64 --layers 2 \
  --heads 4 --kv-heads 2 --intermediate 160 --seed 7 > "$tmp/make.log" 2>&1 || { cat "$tmp/make.log"; exit 1; }
common=(--hf-dir "$tmp/base" --data-tokens "$tmp/data/train.bin" --loss-mask "$tmp/data/train.mask"
        --seq 64 --batch 8 --steps 10 --lr 3e-3 --warmup 2 --lr-schedule cosine --weight-decay 0.1
        --seed 5)
"$py" "$ref/hf_llama.py" train "${common[@]}" --world 2 --mode fsdp2 --metrics-out "$tmp/ref.jsonl" \
  > "$tmp/ref.log" 2>&1 || { cat "$tmp/ref.log"; exit 1; }
"${mpiexec[@]}" -n 2 "$bin" "${common[@]}" --threads 1 --optimizer fused-adamw \
  --val-tokens "$tmp/val/train.bin" --val-loss-mask "$tmp/val/train.mask" \
  --export-hf "$tmp/tuned" --metrics-out "$tmp/cpp.jsonl" > "$tmp/cpp.log" 2>&1 \
  || { cat "$tmp/cpp.log"; exit 1; }
# The masked validation loss (assistant turns of held-out conversations) is transformers' on the
# export with labels -100 elsewhere.
val=$("$py" -c "import json,sys; print([json.loads(l)['val_loss'] for l in open(sys.argv[1]) if 'val_loss' in l][-1])" "$tmp/cpp.jsonl")
ref_val=$("$py" "$ref/hf_llama.py" val-loss --hf-dir "$tmp/tuned" --tokens "$tmp/val/train.bin" \
  --loss-mask "$tmp/val/train.mask" --seq 64 --json 2>/dev/null | "$py" -c "import json,sys; print(json.loads(sys.stdin.read())['val_loss'])")
"$py" -c "import sys; a, b = map(float, sys.argv[1:]); sys.exit(0 if abs(a - b) <= 1e-5 * abs(b) else 1)" \
  "$val" "$ref_val" && echo "masked validation loss $val, transformers $ref_val" \
  || { echo "FAILED: masked validation loss $val, transformers on the export $ref_val"; fail=1; }
grep -E "^data:" "$tmp/cpp.log"
# Gradient accumulation splits each rank's batch in two; the objective stays the mean over the
# rank's counted targets (not a mean of the halves' means): the same losses within rounding.
"${mpiexec[@]}" -n 2 "$bin" "${common[@]}" --threads 1 --optimizer fused-adamw --grad-accum 2 \
  --metrics-out "$tmp/accum.jsonl" > "$tmp/accum.log" 2>&1 || { cat "$tmp/accum.log"; exit 1; }
"$py" - "$tmp/ref.jsonl" "$tmp/accum.jsonl" <<'PY' || fail=1
import json, sys
load = lambda p: [json.loads(l)["loss"] for l in open(p) if '"loss"' in l]
want, got = load(sys.argv[1]), load(sys.argv[2])
worst = max(abs(g - w) / abs(w) for w, g in zip(want, got))
print(f"--grad-accum 2: worst relative difference {worst:.2e} against the reference without it")
sys.exit(0 if len(got) == len(want) and worst <= 1e-5 else 1)
PY
# Packed: each conversation starts with <|begin_of_text|> (tokenize_chat.py says its id), so
# --document-start-id keeps every conversation to itself; transformers with position_ids that
# restart and a block-causal mask gives the same losses.
start=$(sed -n 's/^every conversation starts with token \([0-9]*\) .*/\1/p' "$tmp/tokenize.log")
[ -n "$start" ] || { echo "FAILED: tokenize_chat.py named no document start"; fail=1; start=0; }
"$py" "$ref/hf_llama.py" train "${common[@]}" --world 2 --mode fsdp2 --document-start-id "$start" \
  --metrics-out "$tmp/ref_packed.jsonl" > "$tmp/ref_packed.log" 2>&1 || { cat "$tmp/ref_packed.log"; exit 1; }
"${mpiexec[@]}" -n 2 "$bin" "${common[@]}" --threads 1 --optimizer fused-adamw --document-start-id "$start" \
  --metrics-out "$tmp/packed.jsonl" > "$tmp/packed.log" 2>&1 || { cat "$tmp/packed.log"; exit 1; }
"$py" - "$tmp/ref_packed.jsonl" "$tmp/packed.jsonl" "$tmp/cpp.jsonl" <<'PY' || fail=1
import json, sys
load = lambda p: [json.loads(l)["loss"] for l in open(p) if '"loss"' in l]
want, got, unpacked = load(sys.argv[1]), load(sys.argv[2]), load(sys.argv[3])
worst = max(abs(g - w) / abs(w) for w, g in zip(want, got))
moved = max(abs(g - u) / abs(u) for u, g in zip(unpacked, got))
print(f"packed conversations: worst relative difference {worst:.2e} against transformers + FSDP2 "
      f"(packing itself changes the losses by up to {moved:.2e})")
sys.exit(0 if len(got) == len(want) == 10 and worst <= 1e-5 and moved > 1e-4 else 1)
PY
"$py" - "$tmp/ref.jsonl" "$tmp/cpp.jsonl" <<'PY' || fail=1
import json, sys
load = lambda p: [json.loads(l)["loss"] for l in open(p) if '"loss"' in l]
want, got = load(sys.argv[1]), load(sys.argv[2])
assert len(want) == len(got) == 10, (len(want), len(got))
worst = max(abs(g - w) / abs(w) for w, g in zip(want, got))
print("step  transformers+FSDP2 x2   fsdp-cpp x2 (masked loss)")
for i, (w, g) in enumerate(zip(want, got)):
    print(f"{i:>4}  {w:>20.9f}  {g:>12.9f}")
print(f"worst relative difference {worst:.2e} (tolerance 1e-5); loss {want[0]:.4f} -> {want[-1]:.4f}")
sys.exit(0 if worst <= 1e-5 and abs(want[-1] - want[0]) > 1e-3 * want[0] else 1)
PY

printf '%s\n' '{"messages": [{"role": "assistant", "content": "hi"}]}' > "$tmp/first.jsonl"
expect_error "first.jsonl:1: the conversation starts with an assistant turn" \
  "$py" "$root/scripts/tokenize_chat.py" "$tmp/first.jsonl" --tokenizer "$tmp/model" --out-dir "$tmp/bad"
printf '%s\n' '{"messages": [{"role": "user", "content": "hi"}]}' > "$tmp/bad.jsonl"
expect_error "bad.jsonl:1: the conversation has no assistant turn" \
  "$py" "$root/scripts/tokenize_chat.py" "$tmp/bad.jsonl" --tokenizer "$tmp/model" --out-dir "$tmp/bad"
[ ! -e "$tmp/bad" ] || { echo "FAILED: a refused input wrote $tmp/bad"; fail=1; }
"$py" "$ref/make_chat_tokenizer.py" --out "$tmp/plain" --vocab-size 300 --no-template \
  /usr/share/common-licenses/GPL-3 > /dev/null 2>&1 || fail=1
expect_error "the tokenizer has no chat template" \
  "$py" "$root/scripts/tokenize_chat.py" "$tmp/chats.jsonl" --tokenizer "$tmp/plain" --out-dir "$tmp/bad"
head -c 100 "$tmp/data/train.mask" > "$tmp/short.mask"
expect_error "one byte per token expected" "$bin" --hf-dir "$tmp/base" --data-tokens \
  "$tmp/data/train.bin" --loss-mask "$tmp/short.mask" --seq 64 --batch 8 --steps 1 --threads 1
exit $fail
