#!/usr/bin/env bash
# train_llama end to end at world 2 (mpiexec), against the outside programs: a tiny Llama saved by
# transformers is fine-tuned on token files, validated and exported; transformers and MLX load
# the export and give the trainer's validation loss (1e-5, 1e-4); --eval-only at world 1 on the
# export gives it again. Then bad input, each a clear error and a non-zero exit with nothing
# written: a missing and a corrupted weight file, a config that does not match the weights, an
# unsupported rope_scaling, a token id beyond the vocabulary, a truncated token file, an
# existing export directory, an unknown --preset, tensor-parallel degrees that do not divide the
# world or the heads. Tensor parallelism (--tp 2) gives the same validation loss and logits,
# and its export gives transformers and MLX that loss.
#   llama_trainer.sh TRAIN_LLAMA PYTHON MPIEXEC [MPIEXEC_FLAGS...]
set -uo pipefail
bin="$1"; py="$2"; shift 2
mpiexec=("$@")
source "$(dirname "${BASH_SOURCE[0]}")/../../scripts/lib.sh"
root="$FSDP_ROOT"
ref="$root/tests/reference"
fsdp_scratch
fsdp_one_thread
fsdp_pyfork mlx_lm
fail=0

# A tiny GQA model (vocab 1001: uneven shards at world 2), and token files of a random walk
# over the vocabulary (learnable: the loss falls).
"$py" "$ref/hf_llama.py" make-tiny --out "$tmp/model" --vocab 1001 --hidden 64 --layers 2 \
  --heads 4 --kv-heads 2 --intermediate 160 --seed 7 > "$tmp/make.log" 2>&1 || { cat "$tmp/make.log"; exit 1; }
"$py" - "$tmp" <<'PY'
import sys, numpy as np
rng = np.random.default_rng(3)
walk = np.cumsum(rng.integers(1, 4, 12000)) % 1001
walk[:10000].astype("<u2").tofile(f"{sys.argv[1]}/train.bin")
walk[10000:].astype("<u2").tofile(f"{sys.argv[1]}/val.bin")
PY

run=("$bin" --hf-dir "$tmp/model" --data-tokens "$tmp/train.bin" --val-tokens "$tmp/val.bin"
     --seq 32 --batch 8 --steps 6 --lr 3e-3 --warmup 2 --threads 1 --eval-every 3)
"${mpiexec[@]}" -n 2 "${run[@]}" --export-hf "$tmp/export" --metrics-out "$tmp/m.jsonl" \
  > "$tmp/train.log" 2>&1 || { cat "$tmp/train.log"; exit 1; }
grep -E "^validation|^exported" "$tmp/train.log"
val=$("$py" -c "import json,sys; print([json.loads(l)['val_loss'] for l in open(sys.argv[1]) if 'val_loss' in l][-1])" "$tmp/m.jsonl")
evals=$(grep -c val_loss "$tmp/m.jsonl")
[ "$evals" -eq 2 ] || { echo "FAILED: expected 2 validations (step 3 and the last), got $evals"; fail=1; }
"$py" "$ref/llama_export_check.py" --hf-dir "$tmp/export" --val-tokens "$tmp/val.bin" --seq 32 \
  --expect "$val" || fail=1
"$bin" --hf-dir "$tmp/export" --val-tokens "$tmp/val.bin" --seq 32 --eval-only --threads 1 \
  > "$tmp/eval.log" 2>&1 || { cat "$tmp/eval.log"; fail=1; }
again=$(sed -n 's/.*val_loss \([0-9.e+-]*\).*/\1/p' "$tmp/eval.log")
"$py" -c "import sys; a, b = map(float, sys.argv[1:]); sys.exit(0 if abs(a - b) <= 1e-6 * abs(b) else 1)" \
  "$again" "$val" || { echo "FAILED: --eval-only on the export gave $again, training said $val"; fail=1; }

# Tensor parallelism at world 2 (--tp 2: one data-parallel rank): the same training gives the
# same validation loss (1e-5), and the logits dump gathers the vocabulary's chunks into the
# logits the unsplit model writes (1e-5).
"${mpiexec[@]}" -n 2 "${run[@]}" --tp 2 --metrics-out "$tmp/tp.jsonl" --export-hf "$tmp/tp_export" \
  > "$tmp/tp.log" 2>&1 || { cat "$tmp/tp.log"; exit 1; }
grep -E "^Llama" "$tmp/tp.log"
tp_val=$("$py" -c "import json,sys; print([json.loads(l)['val_loss'] for l in open(sys.argv[1]) if 'val_loss' in l][-1])" "$tmp/tp.jsonl")
"$py" -c "import sys; a, b = map(float, sys.argv[1:]); sys.exit(0 if abs(a - b) <= 1e-5 * abs(b) else 1)" \
  "$tp_val" "$val" && echo "--tp 2: validation loss $tp_val, without TP $val" \
  || { echo "FAILED: --tp 2 validation loss $tp_val, without TP $val"; fail=1; }
# The export of the TP run (each tensor gathered whole, written once): transformers and MLX.
"$py" "$ref/llama_export_check.py" --hf-dir "$tmp/tp_export" --val-tokens "$tmp/val.bin" --seq 32 \
  --expect "$tp_val" || fail=1
# (llama_dump_logits, the tests' tool beside train_llama: its model from the same flags.)
dump=(--hf-dir "$tmp/model" --val-tokens "$tmp/val.bin" --seq 32 --threads 1)
logits="$(dirname "$bin")/llama_dump_logits"
"$logits" "$tmp/whole.safetensors" 3 "${dump[@]}" > /dev/null 2>&1 || fail=1
"${mpiexec[@]}" -n 2 "$logits" "$tmp/split.safetensors" 3 "${dump[@]}" --tp 2 \
  > "$tmp/dump.log" 2>&1 || { cat "$tmp/dump.log"; fail=1; }
"$py" - "$tmp/whole.safetensors" "$tmp/split.safetensors" <<'PY' || fail=1
import sys
from safetensors.torch import load_file
a, b = (load_file(p)["logits"] for p in sys.argv[1:])
err = ((a - b).abs().max() / a.abs().max()).item()
print(f"--tp 2 logits: shape {list(b.shape)}, relative difference {err:.2e}")
sys.exit(0 if a.shape == b.shape and err <= 1e-5 else 1)
PY
# 0.2.0's way, train_llama --eval-only --dump-logits (deprecated): the same logits, bit for bit,
# and its deprecation line.
"$bin" "${dump[@]}" --eval-only --dump-logits "$tmp/old.safetensors" --count 3 > "$tmp/old.log" 2>&1 \
  || { cat "$tmp/old.log"; fail=1; }
grep -q "warning: train_llama --dump-logits is deprecated" "$tmp/old.log" \
  || { echo "FAILED: train_llama --dump-logits printed no deprecation line"; fail=1; }
"$py" - "$tmp/whole.safetensors" "$tmp/old.safetensors" <<'PY' || fail=1
import sys
from safetensors.torch import load_file
a, b = (load_file(p)["logits"] for p in sys.argv[1:])
print(f"train_llama --dump-logits (deprecated): the same logits: {bool(a.shape == b.shape and a.equal(b))}")
sys.exit(0 if a.shape == b.shape and a.equal(b) else 1)
PY

# Bad input, each refused by name (expect_error: scripts/lib.sh).
small=(--data-tokens "$tmp/train.bin" --seq 32 --batch 4 --steps 1 --threads 1)
cp -r "$tmp/model" "$tmp/broken"
rm "$tmp/broken/model.safetensors"
# missing weights
expect_error "model.safetensors" "$bin" --hf-dir "$tmp/broken" "${small[@]}"
cp "$tmp/model/model.safetensors" "$tmp/broken/model.safetensors"
truncate -s 1000 "$tmp/broken/model.safetensors"
# truncated weights
expect_error "model.safetensors" "$bin" --hf-dir "$tmp/broken" "${small[@]}"
cp "$tmp/model/model.safetensors" "$tmp/broken/model.safetensors"
"$py" - "$tmp/broken/config.json" <<'PY'
import json, sys
c = json.load(open(sys.argv[1])); c["intermediate_size"] = 128
json.dump(c, open(sys.argv[1], "w"))
PY
# config against weights
expect_error "mlp.gate_proj.weight" "$bin" --hf-dir "$tmp/broken" "${small[@]}"
"$py" - "$tmp/broken/config.json" <<'PY'
import json, sys
c = json.load(open(sys.argv[1])); c["intermediate_size"] = 160
c["rope_scaling"] = {"rope_type": "yarn", "factor": 8.0}
json.dump(c, open(sys.argv[1], "w"))
PY
# rope_scaling
expect_error 'rope type "yarn" is not implemented' "$bin" --hf-dir "$tmp/broken" "${small[@]}"
"$py" -c "import numpy as np, sys; np.array([5, 7, 4000, 9] * 20, dtype='<u2').tofile(sys.argv[1])" "$tmp/big_id.bin"
# token id beyond the vocabulary
expect_error "4000" "$bin" --hf-dir "$tmp/model" \
  --data-tokens "$tmp/big_id.bin" --seq 8 --batch 4 --steps 1 --threads 1
head -c 2001 "$tmp/train.bin" > "$tmp/odd.bin"
# truncated token file
expect_error "odd.bin" "$bin" --hf-dir "$tmp/model" \
  --data-tokens "$tmp/odd.bin" "${small[@]:2}"
mkdir "$tmp/taken"; echo keep > "$tmp/taken/mine.txt"
# existing export directory
expect_error "exists already" "$bin" --hf-dir "$tmp/model" \
  "${small[@]}" --export-hf "$tmp/taken"
[ "$(cat "$tmp/taken/mine.txt")" = keep ] || { echo "FAILED: the existing directory changed"; fail=1; }
# a config.json that is not JSON, read while the flags are checked: exit 2, not an abort (134)
mkdir "$tmp/badjson"; echo '{"vocab_size": 5' > "$tmp/badjson/config.json"
expect_error "config.json: not valid JSON" "$bin" --hf-dir "$tmp/badjson" "${small[@]}" \
  --document-start-id 1
grep -q "terminate called" "${tmp}/expect_error.log" && { echo "FAILED: an abort"; fail=1; }
"$bin" --hf-dir "$tmp/badjson" "${small[@]}" --document-start-id 1 > /dev/null 2>&1
[ $? -eq 2 ] || { echo "FAILED: a config.json that is not JSON did not exit 2"; fail=1; }
# export directories: the same one twice, or under a file
expect_error "--export-adapter and --export-hf are both $tmp/newdir" "$bin" --hf-dir "$tmp/model" \
  "${small[@]}" --lora-rank 2 --export-adapter "$tmp/newdir" --export-hf "$tmp/newdir"
expect_error "--export-hf $tmp/odd.bin/out: $tmp/odd.bin is not a directory" "$bin" \
  --hf-dir "$tmp/model" "${small[@]}" --export-hf "$tmp/odd.bin/out"
# a tokenizer directory without tokenizer files: refused before training, not at the export
mkdir "$tmp/no_tokenizer"
expect_error "--tokenizer $tmp/no_tokenizer: the directory holds none of tokenizer.model" "$bin" \
  --hf-dir "$tmp/model" "${small[@]}" --export-hf "$tmp/with_tok" --tokenizer "$tmp/no_tokenizer"
[ -e "$tmp/with_tok" ] && { echo "FAILED: the refused run exported"; fail=1; }
# unknown preset
expect_error "expected one of llama2-7b, llama3-8b, llama3-70b, llama3.1-8b, llama3.2-1b" "$bin" \
  --preset llama4 --plan
# Tensor-parallel layouts that cannot be: refused on every rank before any communication.
# --tp not dividing the world
expect_error "--tp 3 must divide the world of 2 ranks" \
  "${mpiexec[@]}" -n 2 "$bin" --hf-dir "$tmp/model" "${small[@]}" --tp 3
# --tp not dividing the heads
expect_error "must divide the attention heads (4) and the key/value heads (2)" \
  "${mpiexec[@]}" -n 4 "$bin" --hf-dir "$tmp/model" "${small[@]}" --tp 4
# float8 options that cannot be (fsdp/models/float8_options.h): refused before any weight loads.
# --float8-skip without --float8
expect_error "--float8-skip needs --float8" \
  "$bin" --hf-dir "$tmp/model" "${small[@]}" --float8-skip k_proj
# --float8-recipe without --float8, and a recipe that is none of torchao's two
expect_error "--float8-recipe needs --float8" \
  "$bin" --hf-dir "$tmp/model" "${small[@]}" --float8-recipe rowwise
expect_error "--float8-recipe: tensorwise_gw not in {tensorwise,rowwise}" \
  "$bin" --hf-dir "$tmp/model" "${small[@]}" --float8 --float8-recipe tensorwise_gw
# --float8 skipping no Linear
expect_error "'qkv' to skip names no Linear of a decoder layer" \
  "$bin" --hf-dir "$tmp/model" "${small[@]}" --float8 --float8-skip qkv
# --float8 with --tp
expect_error "--float8: tensor parallelism (degree 2) is not supported" \
  "${mpiexec[@]}" -n 2 "$bin" --hf-dir "$tmp/model" "${small[@]}" --float8 --tp 2

[ "$fail" -eq 0 ] && echo "llama trainer: passed"
exit "$fail"
