#!/usr/bin/env bash
# A published tokenizer end to end: Llama 3's (its 128,256-token vocabulary and merges rebuilt
# into tokenizer.json from llama.cpp's test data, with Llama 3.1 Instruct's chat template;
# published_tokenizers_check.py --write-dir) through tokenizing (tokenize_text.py, uint32 ids),
# training a tied Llama at world 2, export and generation:
#  - transformers on the export gives train_llama's validation loss (1e-5);
#  - llama_generate --chat renders Llama 3.1's template (its system lines with the dates) and its
#    prompt ids and greedy tokens equal transformers' apply_chat_template and generate;
#  - llama.cpp's converter (convert_hf_to_gguf.py from the same source release) recognizes the
#    exported tokenizer as Llama 3's ("llama-bpe", not "BPE pre-tokenizer was not recognized")
#    and writes a GGUF with its 128,256 tokens.
#   published_tokenizer_export.sh TRAIN_LLAMA PYTHON SDIST MPIEXEC [MPIEXEC_FLAGS...]
set -uo pipefail
bin="$1"; py="$2"; sdist="$3"; shift 3
mpiexec=("$@")
source "$(dirname "${BASH_SOURCE[0]}")/../../scripts/lib.sh"
root="$FSDP_ROOT"
ref="$root/tests/reference"
fsdp_scratch
fsdp_one_thread
fsdp_pyfork
fail=0

"$py" "$ref/published_tokenizers_check.py" --sdist "$sdist" --write-dir llama-bpe "$tmp/tok" || exit 1
"$py" "$root/scripts/tokenize_text.py" /usr/share/common-licenses/{GPL-3,Apache-2.0} \
  --hf-tokenizer "$tmp/tok" --out-dir "$tmp/data" --dtype uint32 || exit 1
"$py" "$ref/hf_llama.py" make-tiny --out "$tmp/base" --vocab 128256 --hidden 32 --layers 2 \
  --heads 4 --kv-heads 2 --intermediate 64 --tied --seed 3 > "$tmp/make.log" 2>&1 \
  || { cat "$tmp/make.log"; exit 1; }
cp "$tmp/tok/"* "$tmp/base/"
"${mpiexec[@]}" -n 2 "$bin" --hf-dir "$tmp/base" --data-tokens "$tmp/data/train.bin" \
  --val-tokens "$tmp/data/val.bin" --tokens-dtype uint32 --seq 64 --batch 4 --steps 6 --lr 1e-2 \
  --threads 1 --export-hf "$tmp/out" --tokenizer "$tmp/tok" --metrics-out "$tmp/m.jsonl" \
  > "$tmp/train.log" 2>&1 || { cat "$tmp/train.log"; exit 1; }
grep -E "^model:|^done:" "$tmp/train.log"

# transformers on the export: train_llama's validation loss.
cpp_val=$("$py" -c "import json,sys; print([json.loads(l)['val_loss'] for l in open(sys.argv[1]) if 'val_loss' in l][-1])" "$tmp/m.jsonl")
hf_val=$("$py" "$ref/hf_llama.py" val-loss --hf-dir "$tmp/out" --tokens "$tmp/data/val.bin" \
  --tokens-dtype uint32 --seq 64 --json 2>/dev/null | "$py" -c "import json,sys; print(json.loads(sys.stdin.read())['val_loss'])")
if "$py" -c "import sys; a, b = map(float, sys.argv[1:]); sys.exit(0 if abs(a - b) <= 1e-5 * abs(b) else 1)" "$cpp_val" "$hf_val"; then
  echo "transformers on the export: validation loss $hf_val, train_llama's $cpp_val"
else
  echo "FAILED: transformers gives validation loss '$hf_val', train_llama $cpp_val"; fail=1
fi

# --chat with Llama 3.1's template, against transformers.
question="What does FSDP shard?"
"${mpiexec[@]}" -n 2 "$(dirname "$bin")/llama_generate" --hf-dir "$tmp/out" --chat --generate "$question" --max-new-tokens 8 \
  --threads 1 > "$tmp/chat.log" 2>&1 || { cat "$tmp/chat.log"; fail=1; }
"$py" "$ref/hf_llama.py" generate --hf-dir "$tmp/out" --chat "$question" --max-new-tokens 8 \
  > "$tmp/hf_chat.log" 2> "$tmp/hf_chat.err" || { cat "$tmp/hf_chat.log" "$tmp/hf_chat.err"; fail=1; }
for what in "prompt: [0-9]* tokens: " "generated [0-9]* tokens ([^)]*)[^:]*: "; do
  got="$(sed -n "s/^$what//p" "$tmp/chat.log")"; want="$(sed -n "s/^$what//p" "$tmp/hf_chat.log")"
  if [ -n "$want" ] && [ "$got" = "$want" ]; then echo "--chat ${what%% *} equal to transformers' ($(echo "$got" | wc -w) ids)"
  else echo "FAILED: --chat ${what%% *} '$got', transformers '$want'"; fail=1; fi
done

# llama.cpp's converter recognizes the tokenizer.
conv="$tmp/llama.cpp"; mkdir -p "$conv"
vendor="$(tar tzf "$sdist" | grep -m1 '/vendor/llama.cpp/convert_hf_to_gguf.py$')"; vendor="${vendor%/convert_hf_to_gguf.py}"
tar xzf "$sdist" -C "$conv" --strip-components=3 "$vendor/convert_hf_to_gguf.py" "$vendor/conversion" \
  "$vendor/gguf-py" || { echo "FAILED: $sdist has no converter"; exit 1; }
PYTHONPATH="$conv/gguf-py:$conv" "$py" "$conv/convert_hf_to_gguf.py" "$tmp/out" --outtype f32 \
  --outfile "$tmp/model.gguf" > "$tmp/convert.log" 2>&1 || { tail -20 "$tmp/convert.log"; fail=1; }
if grep -q "not recognized" "$tmp/convert.log"; then echo "FAILED: the converter did not recognize the tokenizer"; fail=1; fi
PYTHONPATH="$ref" "$py" - "$tmp/model.gguf" <<'PY' || fail=1
import sys
from published_tokenizers_check import read_gguf_fields
fields = read_gguf_fields(sys.argv[1])
pre = fields["tokenizer.ggml.pre"]
n = len(fields["tokenizer.ggml.tokens"])
print(f"llama.cpp's converter: tokenizer.ggml.pre {pre!r}, {n} tokens")
sys.exit(0 if pre == "llama-bpe" and n == 128256 else 1)
PY
exit $fail
