#!/usr/bin/env bash
# LoRA fine-tuning end to end, judged by PEFT, transformers and MLX: chat JSONL through
# scripts/tokenize_chat.py (the model's own template, a mask of the assistant turns); PEFT's
# initial adapters (hf_llama.py make-lora: every Linear of the layers, rank 8) trained by
# train_llama at world 2 (MPI) on the frozen, sharded model; then
#  - the PEFT adapter export, loaded by PEFT onto the base model, gives train_llama's masked
#    validation loss (1e-5); so does the merged export in transformers and in MLX;
#  - a run stopped at step 5 and resumed at world 1 and at world 3 (from checkpoints of the
#    adapters alone: a partial manifest, no frozen weight) gives the uninterrupted
#    run's losses (1e-5) and the same adapters;
#  - greedy generation with the adapters live (world 2) equals transformers' generate on
#    PEFT's model; --generate's and --chat's prompt ids (the chat template applied in C++)
#    equal transformers' apply_chat_template;
#  - bad input is refused by name, nothing trained or written: a target that names no module,
#    a rank above a weight's dimensions, flags that contradict the adapter directory,
#    --export-adapter without LoRA, --chat without a template or with one that does not parse,
#    a resume from adapters trained on another base model.
#   lora_finetune.sh TRAIN_LLAMA PYTHON MPIEXEC [MPIEXEC_FLAGS...]
set -uo pipefail
bin="$1"; py="$2"; shift 2
gen="$(dirname "$bin")/llama_generate"  # the program beside train_llama
mpiexec=("$@")
source "$(dirname "${BASH_SOURCE[0]}")/../../scripts/lib.sh"
root="$FSDP_ROOT"
ref="$root/tests/reference"
fsdp_scratch
fsdp_one_thread
fsdp_pyfork peft mlx_lm
fail=0

"$py" "$ref/make_chat_tokenizer.py" --out "$tmp/tok" --vocab-size 600 \
  /usr/share/common-licenses/GPL-3 > "$tmp/tok.log" 2>&1 || { cat "$tmp/tok.log"; exit 1; }
"$py" "$ref/make_chats.py" "$tmp/chats.jsonl" --count 300 --seed 2 || exit 1
head -n 260 "$tmp/chats.jsonl" > "$tmp/train.jsonl"
tail -n 40 "$tmp/chats.jsonl" > "$tmp/held_out.jsonl"
"$py" "$root/scripts/tokenize_chat.py" "$tmp/train.jsonl" --tokenizer "$tmp/tok" \
  --out-dir "$tmp/data" > /dev/null || exit 1
"$py" "$root/scripts/tokenize_chat.py" "$tmp/held_out.jsonl" --tokenizer "$tmp/tok" \
  --out-dir "$tmp/val" > /dev/null || exit 1
vocab=$("$py" -c "import transformers, sys; print(len(transformers.AutoTokenizer.from_pretrained(sys.argv[1])))" "$tmp/tok")
"$py" "$ref/hf_llama.py" make-tiny --out "$tmp/base" --vocab "$vocab" --hidden 64 --layers 2 \
  --heads 4 --kv-heads 2 --intermediate 160 --seed 7 > "$tmp/make.log" 2>&1 || { cat "$tmp/make.log"; exit 1; }
"$py" "$ref/hf_llama.py" make-lora --hf-dir "$tmp/base" --out "$tmp/init" --rank 8 --alpha 16 \
  --seed 3 > "$tmp/lora.log" 2>&1 || { cat "$tmp/lora.log"; exit 1; }

common=(--hf-dir "$tmp/base" --lora-adapter "$tmp/init" --data-tokens "$tmp/data/train.bin"
        --loss-mask "$tmp/data/train.mask" --seq 64 --batch 12 --steps 10 --lr 2e-2 --warmup 2
        --lr-schedule cosine --weight-decay 0.1 --seed 5 --threads 1 --optimizer fused-adamw)
val=(--val-tokens "$tmp/val/train.bin" --val-loss-mask "$tmp/val/train.mask")
"${mpiexec[@]}" -n 2 "$bin" "${common[@]}" "${val[@]}" --export-adapter "$tmp/adapter" \
  --export-hf "$tmp/merged" --metrics-out "$tmp/masked.jsonl" \
  > "$tmp/masked.log" 2>&1 || { cat "$tmp/masked.log"; exit 1; }
grep -E "LoRA rank" "$tmp/masked.log" | head -1
ls "$tmp/adapter"

# The exports, judged by PEFT, transformers and MLX: the masked validation loss.
cpp_val=$("$py" -c "import json,sys; print([json.loads(l)['val_loss'] for l in open(sys.argv[1]) if 'val_loss' in l][-1])" "$tmp/masked.jsonl")
val_of() {  # val_of ARGS... -> the val-loss of hf_llama.py val-loss
  "$py" "$ref/hf_llama.py" val-loss --tokens "$tmp/val/train.bin" --loss-mask "$tmp/val/train.mask" \
    --seq 64 --json "$@" 2>/dev/null | "$py" -c "import json,sys; print(json.loads(sys.stdin.read())['val_loss'])"
}
base_val=$(val_of --hf-dir "$tmp/base")
for judge in "PEFT (base + adapter):--hf-dir $tmp/base --lora-adapter $tmp/adapter" \
             "transformers (merged):--hf-dir $tmp/merged" \
             "MLX (merged):--hf-dir $tmp/merged --framework mlx"; do
  name="${judge%%:*}"; args="${judge#*:}"
  # shellcheck disable=SC2086
  got=$(val_of $args)
  if "$py" -c "import sys; a, b = map(float, sys.argv[1:]); sys.exit(0 if abs(a - b) <= 1e-5 * abs(b) else 1)" "$cpp_val" "$got"; then
    echo "$name: validation loss $got, train_llama's $cpp_val"
  else
    echo "FAILED: $name gives validation loss '$got', train_llama $cpp_val"; fail=1
  fi
done
"$py" -c "import sys; a, b = map(float, sys.argv[1:]); sys.exit(0 if a < b - 1e-3 else 1)" "$cpp_val" "$base_val" \
  && echo "the adapters lowered the validation loss: $base_val -> $cpp_val" \
  || { echo "FAILED: the validation loss did not fall ($base_val -> $cpp_val)"; fail=1; }

# Resumed at other world sizes from the checkpoint of step 5: the same losses, the same adapters.
# Without the loss mask: with it the objective is the mean of each rank's masked mean (as
# transformers + FSDP2 computes it), which depends on the world size.
common=(--hf-dir "$tmp/base" --lora-adapter "$tmp/init" --data-tokens "$tmp/data/train.bin"
        --seq 64 --batch 12 --steps 10 --lr 2e-2 --warmup 2 --lr-schedule cosine
        --weight-decay 0.1 --seed 5 --threads 1 --optimizer fused-adamw)
"${mpiexec[@]}" -n 2 "$bin" "${common[@]}" --save-dir "$tmp/ckpt" --save-every 5 \
  --export-adapter "$tmp/adapter_2" --metrics-out "$tmp/w2.jsonl" > "$tmp/w2.log" 2>&1 \
  || { cat "$tmp/w2.log"; exit 1; }
# The checkpoints hold the adapters and their AdamW state alone (the frozen weights are
# --hf-dir's): a partial manifest without a base weight.
"$py" - "$tmp/ckpt" <<'PY' || fail=1
import glob, json, os, sys
m = json.load(open(sorted(glob.glob(os.path.join(sys.argv[1], "step_*", "manifest.json")))[-1]))
names = [t["name"] for t in m["tensors"]]
frozen = [n for n in names if "lora_" not in n and not n.startswith("#")]
size = sum(os.path.getsize(f) for f in glob.glob(os.path.join(sys.argv[1], "step_*", "rank_*.bin")))
print(f"LoRA checkpoints: partial {m['partial']}, {len(names)} tensors, {size} bytes of shards in all")
sys.exit(0 if m["partial"] and not frozen and any(n.endswith("lora_A.weight#exp_avg") for n in names) else 1)
PY
for world in 1 3; do
  rm -rf "$tmp/ckpt_$world"; cp -r "$tmp/ckpt" "$tmp/ckpt_$world"
  ls "$tmp/ckpt_$world" | grep -v "step_0*5$" | while read -r d; do rm -rf "$tmp/ckpt_$world/$d"; done
  launch=("$bin"); [ "$world" -gt 1 ] && launch=("${mpiexec[@]}" -n "$world" "$bin")
  "${launch[@]}" "${common[@]}" --save-dir "$tmp/ckpt_$world" --resume \
    --export-adapter "$tmp/adapter_$world" --metrics-out "$tmp/r$world.jsonl" > "$tmp/r$world.log" 2>&1 \
    || { cat "$tmp/r$world.log"; fail=1; continue; }
  "$py" - "$tmp/w2.jsonl" "$tmp/r$world.jsonl" "$tmp/adapter_2/adapter_model.safetensors" \
    "$tmp/adapter_$world/adapter_model.safetensors" "$world" <<'PY' || fail=1
import json, sys
from safetensors.torch import load_file
load = lambda p: {json.loads(l)["step"]: json.loads(l)["loss"] for l in open(p) if '"loss"' in l}
want, got = load(sys.argv[1]), load(sys.argv[2])
assert sorted(got) == list(range(5, 10)), f"resumed steps {sorted(got)}"
worst = max(abs(got[s] - want[s]) / abs(want[s]) for s in got)
a, b = load_file(sys.argv[3]), load_file(sys.argv[4])
assert sorted(a) == sorted(b)
diff = max((a[k] - b[k]).abs().max().item() / max(a[k].abs().max().item(), 1e-12) for k in a)
print(f"resumed at world {sys.argv[5]} from step 5: losses within {worst:.2e}, adapters within {diff:.2e}")
sys.exit(0 if worst <= 1e-5 and diff <= 1e-4 else 1)
PY
done

# Greedy generation with the adapters live, sharded at world 2, against PEFT's model.
prompt="$("$py" -c "import numpy as np, sys; print(','.join(map(str, np.fromfile(sys.argv[1], '<u2')[:12])))" "$tmp/val/train.bin")"
"$py" - "$tmp/base" "$tmp/adapter" "$prompt" > "$tmp/peft_gen.txt" <<'PY' || { cat "$tmp/peft_gen.txt"; fail=1; }
import sys, torch, transformers, peft
model = transformers.AutoModelForCausalLM.from_pretrained(sys.argv[1], dtype=torch.float32)
model = peft.PeftModel.from_pretrained(model, sys.argv[2]).eval()
model.generation_config.pad_token_id = 0
prompt = torch.tensor([[int(t) for t in sys.argv[3].split(",")]])
with torch.no_grad():
    # The prompt starts with token 0, the pad id set above: an explicit mask keeps it attended.
    out = model.generate(input_ids=prompt, attention_mask=torch.ones_like(prompt),
                         max_new_tokens=24, do_sample=False)
print(" ".join(map(str, out[0, prompt.shape[1]:].tolist())))
PY
"${mpiexec[@]}" -n 2 "$gen" --hf-dir "$tmp/base" --lora-adapter "$tmp/adapter" --generate-ids "$prompt" \
  --max-new-tokens 24 --threads 1 > "$tmp/gen.log" 2>&1 || { cat "$tmp/gen.log"; fail=1; }
want="$(cat "$tmp/peft_gen.txt")"
got="$(sed -n 's/^generated [0-9]* tokens ([^)]*) in [0-9.]* s: //p' "$tmp/gen.log")"
if [ -n "$want" ] && [ "$got" = "$want" ]; then echo "generation with the adapters equals PEFT's: $got"
else echo "FAILED: generation '$got', PEFT's '$want'"; fail=1; fi

# The same from text: --generate encodes the rendered chat template with the C++ tokenizer
# (tokenizer.json) into transformers' ids, and decodes the new tokens as transformers does.
"$py" - "$tmp/tok" "$tmp/rendered.txt" "$tmp/rendered_ids.txt" <<'PY' || fail=1
import sys, transformers
t = transformers.AutoTokenizer.from_pretrained(sys.argv[1])
messages = [{"role": "user", "content": "Add 12 and 30."}]
open(sys.argv[2], "w").write(t.apply_chat_template(messages, add_generation_prompt=True, tokenize=False))
ids = t.apply_chat_template(messages, add_generation_prompt=True)["input_ids"]
open(sys.argv[3], "w").write(" ".join(map(str, ids)))
PY
cp "$tmp/tok/tokenizer.json" "$tmp/base/"
text="$(cat "$tmp/rendered.txt"; printf x)"; text="${text%x}"
"${mpiexec[@]}" -n 2 "$gen" --hf-dir "$tmp/base" --lora-adapter "$tmp/adapter" --generate "$text" \
  --max-new-tokens 24 --threads 1 > "$tmp/gen_text.log" 2>&1 || { cat "$tmp/gen_text.log"; fail=1; }
want_prompt="$(cat "$tmp/rendered_ids.txt")"
got_prompt="$(sed -n 's/^prompt: [0-9]* tokens: //p' "$tmp/gen_text.log")"
[ "$got_prompt" = "$want_prompt" ] && echo "--generate's prompt ids equal transformers' apply_chat_template" \
  || { echo "FAILED: --generate encoded '$got_prompt', transformers '$want_prompt'"; fail=1; }
"$py" - "$tmp/tok" "$tmp/gen_text.log" <<'PY' || fail=1
import json, re, sys, transformers
t = transformers.AutoTokenizer.from_pretrained(sys.argv[1])
log = open(sys.argv[2]).read()
ids = [int(i) for i in re.search(r"^generated \d+ tokens \([^)]*\) in [\d.]+ s: (.*)$", log, re.M).group(1).split()]
text = json.loads(re.search(r"^text: (.*)$", log, re.M).group(1))
want = t.decode(ids)
print(f"--generate decoded {text!r}" + ("" if text == want else f", transformers {want!r}"))
sys.exit(0 if text == want else 1)
PY

# --chat: the message goes through the directory's chat template in C++ (llama.cpp's Jinja
# engine), after a system turn: the prompt ids equal transformers' apply_chat_template.
cp "$tmp/tok/tokenizer_config.json" "$tmp/base/"
[ ! -f "$tmp/tok/chat_template.jinja" ] || cp "$tmp/tok/chat_template.jinja" "$tmp/base/"
"${mpiexec[@]}" -n 2 "$gen" --hf-dir "$tmp/base" --lora-adapter "$tmp/adapter" --chat \
  --system "Answer with a number." --generate "Add 12 and 30." --max-new-tokens 8 --threads 1 \
  > "$tmp/gen_chat.log" 2>&1 || { cat "$tmp/gen_chat.log"; fail=1; }
want_prompt="$("$py" -c "
import sys, transformers
t = transformers.AutoTokenizer.from_pretrained(sys.argv[1])
m = [{'role': 'system', 'content': 'Answer with a number.'}, {'role': 'user', 'content': 'Add 12 and 30.'}]
print(' '.join(map(str, t.apply_chat_template(m, add_generation_prompt=True)['input_ids'])))" "$tmp/tok")"
got_prompt="$(sed -n 's/^prompt: [0-9]* tokens: //p' "$tmp/gen_chat.log")"
[ -n "$want_prompt" ] && [ "$got_prompt" = "$want_prompt" ] \
  && echo "--chat's prompt ids equal transformers' apply_chat_template (system + user turns)" \
  || { echo "FAILED: --chat encoded '$got_prompt', transformers '$want_prompt'"; fail=1; }

plain=(--hf-dir "$tmp/base" --data-tokens "$tmp/data/train.bin" --seq 64 --batch 8 --steps 1
       --threads 1 --export-adapter "$tmp/bad")
expect_error "LoRA target 'qkv' names no module of the Llama model" \
  "$bin" "${plain[@]}" --lora-rank 4 --lora-targets q_proj,qkv
expect_error "LoRA rank 40 is larger than k_proj's weight allows" \
  "$bin" "${plain[@]}" --lora-rank 40 --lora-targets q_proj,k_proj
expect_error "holds rank 8 alpha 16" "$bin" "${plain[@]}" --lora-adapter "$tmp/init" --lora-rank 4
expect_error "--export-adapter needs LoRA adapters" "$bin" "${plain[@]}"
# Resuming from the adapters-only checkpoints on another base model (same shapes, other
# weights): refused by name, nothing written.
"$py" "$ref/hf_llama.py" make-tiny --out "$tmp/base2" --vocab "$vocab" --hidden 64 --layers 2 \
  --heads 4 --kv-heads 2 --intermediate 160 --seed 8 > /dev/null 2>&1 || fail=1
rm -rf "$tmp/ckpt_bad"; cp -r "$tmp/ckpt" "$tmp/ckpt_bad"; before="$(ls -R "$tmp/ckpt_bad")"
expect_error "was trained on another base model: --hf-dir $tmp/base (1 weight file)" \
  "$bin" --hf-dir "$tmp/base2" --lora-adapter "$tmp/init" --data-tokens "$tmp/data/train.bin" \
  --seq 64 --batch 12 --steps 10 --threads 1 --save-dir "$tmp/ckpt_bad" --resume
[ "$(ls -R "$tmp/ckpt_bad")" = "$before" ] || { echo "FAILED: the refused resume wrote into $tmp/ckpt_bad"; fail=1; }
expect_error "--system needs --chat" "$gen" --hf-dir "$tmp/base" --generate "Hi" --system "x"
expect_error "--chat needs --generate TEXT" "$gen" --hf-dir "$tmp/base" --chat
rm -f "$tmp/base/tokenizer_config.json" "$tmp/base/chat_template.jinja"
expect_error "has no chat template: neither chat_template.jinja nor" \
  "$gen" --hf-dir "$tmp/base" --generate "Hi" --chat
echo '{"chat_template": "{% for m in messages %}{{ m.content"}' > "$tmp/base/tokenizer_config.json"
expect_error "tokenizer_config.json: the template does not parse" \
  "$gen" --hf-dir "$tmp/base" --generate "Hi" --chat
# A conversation the template refuses (Gemma's way with a system turn): its message, before the
# weights load.
echo '{"chat_template": "{% if messages[0].role == \"system\" %}{{ raise_exception(\"System role not supported\") }}{% endif %}{{ messages[0].content }}"}' \
  > "$tmp/base/tokenizer_config.json"
expect_error "System role not supported" \
  "$gen" --hf-dir "$tmp/base" --generate "Hi" --chat --system "Be brief."
rm -f "$tmp/base/tokenizer.json" "$tmp/base/tokenizer_config.json"
expect_error "--generate needs the model's tokenizer.json" "$gen" --hf-dir "$tmp/base" --generate "Hi"
[ ! -e "$tmp/bad" ] || { echo "FAILED: a refused run wrote $tmp/bad"; fail=1; }
exit $fail
