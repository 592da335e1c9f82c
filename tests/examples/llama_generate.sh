#!/usr/bin/env bash
# llama_generate --generate-ids against transformers' generate: a tiny GQA Llama trained a few
# steps on a cyclic token stream (by train_llama at world 2) and exported; from the export, 32
# greedy tokens of transformers' generate (with and without its cache) equal llama_generate's at
# world 1 with and without the cache, sharded at world 2, and split at --tp 2. Sampling
# (temperature, top-k, top-p, a seed) draws the same tokens at world 1 and 2. 0.2.0's way,
# train_llama --generate-ids, still gives the same tokens, with its deprecation line. Bad flags
# are refused by name. llama_generate is the program beside train_llama.
#   llama_generate.sh TRAIN_LLAMA PYTHON MPIEXEC [MPIEXEC_FLAGS...]
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
trainer="$bin"
bin="$(dirname "$trainer")/llama_generate"

"$py" "$ref/hf_llama.py" make-tiny --out "$tmp/model" --vocab 301 --hidden 64 --layers 2 \
  --heads 4 --kv-heads 2 --intermediate 160 --seed 7 > "$tmp/make.log" 2>&1 || { cat "$tmp/make.log"; exit 1; }
"$py" - "$tmp" <<'PY'
import sys, numpy as np
rng = np.random.default_rng(5)
cycle = rng.permutation(301)[:61]  # a cycle of 61 tokens: each next token is determined
np.tile(cycle, 200).astype("<u2").tofile(f"{sys.argv[1]}/train.bin")
PY
"${mpiexec[@]}" -n 2 "$trainer" --hf-dir "$tmp/model" --data-tokens "$tmp/train.bin" --seq 32 \
  --batch 8 --steps 30 --lr 3e-3 --threads 1 --export-hf "$tmp/trained" > "$tmp/train.log" 2>&1 \
  || { cat "$tmp/train.log"; exit 1; }
prompt="$("$py" -c "import numpy as np, sys; print(','.join(map(str, np.fromfile(sys.argv[1], '<u2')[5:12])))" "$tmp/train.bin")"

# transformers: greedy, with and without its cache (the two must agree with each other too).
"$py" - "$tmp/trained" "$prompt" > "$tmp/hf.txt" <<'PY' || { cat "$tmp/hf.txt"; exit 1; }
import sys, torch, transformers
model = transformers.AutoModelForCausalLM.from_pretrained(sys.argv[1], dtype=torch.float32).eval()
model.generation_config.pad_token_id = 0  # (its eos is the config's: both stop there)
prompt = torch.tensor([[int(t) for t in sys.argv[2].split(",")]])
outs = []
for cache in (True, False):
    with torch.no_grad():
        out = model.generate(prompt, max_new_tokens=32, do_sample=False, use_cache=cache)
    outs.append(" ".join(map(str, out[0, prompt.shape[1]:].tolist())))
assert outs[0] == outs[1], f"transformers with and without its cache differ: {outs}"
print(outs[0])
PY
want="$(cat "$tmp/hf.txt")"
echo "transformers' greedy tokens: $want"
[ "$(echo "$want" | wc -w)" -eq 32 ] || { echo "FAILED: transformers stopped early (an end-of-sequence id): '$want'"; fail=1; }
gen=(--hf-dir "$tmp/trained" --generate-ids "$prompt" --max-new-tokens 32 --threads 1)
got_of() { sed -n 's/^generated [0-9]* tokens ([^)]*) in [0-9.]* s: //p' "$1"; }
check() {  # check NAME LOG
  local got; got="$(got_of "$2")"
  if [ "$got" = "$want" ]; then echo "$1: equal"; else echo "FAILED: $1 gave '$got'"; fail=1; fi
}
"$bin" "${gen[@]}" > "$tmp/w1.log" 2>&1 || { cat "$tmp/w1.log"; fail=1; }
check "world 1, cache" "$tmp/w1.log"
"$bin" "${gen[@]}" --no-cache > "$tmp/w1n.log" 2>&1 || { cat "$tmp/w1n.log"; fail=1; }
check "world 1, no cache" "$tmp/w1n.log"
"${mpiexec[@]}" -n 2 "$bin" "${gen[@]}" > "$tmp/w2.log" 2>&1 || { cat "$tmp/w2.log"; fail=1; }
check "world 2 (sharded), cache" "$tmp/w2.log"
"${mpiexec[@]}" -n 2 "$bin" "${gen[@]}" --tp 2 > "$tmp/tp.log" 2>&1 || { cat "$tmp/tp.log"; fail=1; }
check "world 2 --tp 2, cache" "$tmp/tp.log"
"$trainer" "${gen[@]}" > "$tmp/old.log" 2>&1 || { cat "$tmp/old.log"; fail=1; }
check "train_llama --generate-ids (deprecated)" "$tmp/old.log"
grep -q "warning: train_llama --generate-ids, --generate and --chat are deprecated: llama_generate" \
  "$tmp/old.log" || { echo "FAILED: train_llama --generate-ids printed no deprecation line"; fail=1; }

# Sampling: the same seed draws the same tokens at world 1 and sharded at world 2.
# A high temperature, so that the draws leave the greedy path.
sample=(--temperature 4 --top-k 50 --top-p 0.95 --seed 11)
"$bin" "${gen[@]}" "${sample[@]}" > "$tmp/s1.log" 2>&1 || { cat "$tmp/s1.log"; fail=1; }
"${mpiexec[@]}" -n 2 "$bin" "${gen[@]}" "${sample[@]}" > "$tmp/s2.log" 2>&1 || { cat "$tmp/s2.log"; fail=1; }
s1="$(got_of "$tmp/s1.log")"; s2="$(got_of "$tmp/s2.log")"
if [ -n "$s1" ] && [ "$s1" = "$s2" ] && [ "$s1" != "$want" ]; then
  echo "sampled (world 1 = world 2): $s1"
else
  echo "FAILED: sampling gave '$s1' at world 1 and '$s2' at world 2 (greedy: '$want')"; fail=1
fi

expect_error "outside the vocabulary of 301" "$bin" --hf-dir "$tmp/trained" --generate-ids 5,301 --threads 1
expect_error "--top-p: must be in (0, 1], got 0" "$bin" "${gen[@]}" --temperature 1 --top-p 0
expect_error "--max-new-tokens: must be >= 0, got -1" "$bin" --hf-dir "$tmp/trained" --generate-ids 1 --max-new-tokens -1
expect_error "--temperature: must be >= 0 (0: greedy), got -1" "$bin" "${gen[@]}" --temperature -1
expect_error "give the model as --hf-dir" "$bin" --generate-ids 1,2
expect_error "give a prompt: --generate-ids IDS, or --generate TEXT" "$bin" --hf-dir "$tmp/trained"
expect_error "not expected: 3 --steps" "$bin" "${gen[@]}" --steps 3
exit $fail
