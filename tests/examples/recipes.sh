#!/usr/bin/env bash
# The recipes (recipes/*.toml, train_llama --recipe, fsdp_plan --recipe): each parses and
# validates, and
#  - the CPU one (SmolLM2-135M chat LoRA on 2 ranks) trains at world 2 on a small stand-in
#    model and chat data, its paths and length overridden on the command line: the adapters it
#    writes have the recipe's rank, alpha and targets, and a flag given on the command line
#    overrides the recipe's (--lora-rank 4);
#  - the GPU ones plan (fsdp_plan, the program beside train_llama) for their worlds and fit an
#    80 GB GPU (--plan-capacity-gib 80);
#  - a recipe with a key that is no flag, a key in another section than its flag's, a key outside
#    any section, or a path that does not exist is refused by name before anything runs.
#   recipes.sh TRAIN_LLAMA PYTHON MPIEXEC [MPIEXEC_FLAGS...]
set -uo pipefail
bin="$1"; py="$2"; shift 2
mpiexec=("$@")
source "$(dirname "${BASH_SOURCE[0]}")/../../scripts/lib.sh"
root="$FSDP_ROOT"
ref="$root/tests/reference"
recipes="$root/recipes"
fsdp_scratch
fsdp_one_thread
fsdp_pyfork
fail=0
planner="$(dirname "$bin")/fsdp_plan"

# Every recipe in the folder is one of the three below: a new one needs its check here.
for r in "$recipes"/*.toml; do
  case "$(basename "$r")" in
    smollm2-135m-chat-lora-2cpu.toml | llama3.2-1b-pretrain-8gpu.toml | llama3-70b-64gpu-dp8-tp8.toml) ;;
    *) echo "FAILED: $(basename "$r") is checked by no test (add it to $0)"; fail=1 ;;
  esac
done

# The GPU recipes: the plan of the run each describes, for its world, fits 80 GB.
plan() {  # plan RECIPE FLAGS...
  local r="$1"; shift
  if "$planner" --recipe "$recipes/$r" --plan-capacity-gib 80 "$@" > "$tmp/$r.log" 2>&1; then
    echo "$r: $(grep -E '^plan:|total \(peak\)' "$tmp/$r.log" | tr -s ' ' | paste -sd ';')"
  else
    echo "FAILED: $r does not plan:"; cat "$tmp/$r.log"; fail=1
  fi
}
plan llama3.2-1b-pretrain-8gpu.toml --plan-world 8
plan llama3-70b-64gpu-dp8-tp8.toml --plan-world 64 --plan-ranks-per-host 8
grep -q "tp 8" "$tmp/llama3-70b-64gpu-dp8-tp8.toml.log" ||
  { echo "FAILED: the 70B recipe's plan is not dp 8 x tp 8"; fail=1; }
# 0.2.0's way, train_llama --plan, prints the same plan after its deprecation line.
"$bin" --recipe "$recipes/llama3.2-1b-pretrain-8gpu.toml" --plan --plan-capacity-gib 80 \
  --plan-world 8 > "$tmp/old_plan.log" 2> "$tmp/old_plan.err" || { cat "$tmp/old_plan.err"; fail=1; }
if cmp -s "$tmp/old_plan.log" "$tmp/llama3.2-1b-pretrain-8gpu.toml.log" &&
  grep -q "warning: train_llama --plan is deprecated: fsdp_plan" "$tmp/old_plan.err"; then
  echo "train_llama --plan (deprecated): the same plan as fsdp_plan, with its deprecation line"
else
  echo "FAILED: train_llama --plan differs from fsdp_plan or printed no deprecation line"
  diff "$tmp/old_plan.log" "$tmp/llama3.2-1b-pretrain-8gpu.toml.log" | head; cat "$tmp/old_plan.err"; fail=1
fi

# The CPU recipe on a stand-in: chat data in a small chat tokenizer's ids, a 2-layer model.
"$py" "$ref/make_chat_tokenizer.py" --out "$tmp/tok" --vocab-size 600 \
  /usr/share/common-licenses/GPL-3 > "$tmp/tok.log" 2>&1 || { cat "$tmp/tok.log"; exit 1; }
"$py" "$ref/make_chats.py" "$tmp/chats.jsonl" --count 100 --seed 3 || exit 1
"$py" "$root/scripts/tokenize_chat.py" "$tmp/chats.jsonl" --tokenizer "$tmp/tok" \
  --out-dir "$tmp/chat" > /dev/null || exit 1
vocab=$("$py" -c "import transformers, sys; print(len(transformers.AutoTokenizer.from_pretrained(sys.argv[1])))" "$tmp/tok")
"$py" "$ref/hf_llama.py" make-tiny --out "$tmp/base" --vocab "$vocab" --hidden 64 --layers 2 \
  --heads 4 --kv-heads 2 --intermediate 160 --seed 7 > "$tmp/make.log" 2>&1 || { cat "$tmp/make.log"; exit 1; }
# A model on the command line replaces the recipe's (the 70B recipe's documented use is
# --recipe ... --hf-dir DIR): the 1B recipe's --preset gives way to --hf-dir.
if "$planner" --recipe "$recipes/llama3.2-1b-pretrain-8gpu.toml" --hf-dir "$tmp/base" \
    --plan-world 8 > "$tmp/override.log" 2>&1 &&
    grep -q "^Llama hidden 64 layers 2 " "$tmp/override.log"; then
  echo "command line over recipe: --hf-dir replaces the recipe's --preset: $(head -1 "$tmp/override.log")"
else
  echo "FAILED: --hf-dir on the command line did not replace the recipe's --preset:"
  cat "$tmp/override.log"; fail=1
fi
cpu="$recipes/smollm2-135m-chat-lora-2cpu.toml"
run_cpu() {  # run_cpu OUT FLAGS...: the recipe at world 2 with the stand-in's paths
  local out="$1"; shift
  "${mpiexec[@]}" -n 2 "$bin" --recipe "$cpu" --hf-dir "$tmp/base" \
    --data-tokens "$tmp/chat/train.bin" --loss-mask "$tmp/chat/train.mask" --tokenizer "$tmp/tok" \
    --seq 64 --steps 2 --save-dir "$tmp/$out/ckpt" --export-adapter "$tmp/$out/adapter" \
    --export-hf "$tmp/$out/merged" "$@" > "$tmp/$out.log" 2>&1
}
adapter() {  # adapter DIR: "r alpha targets" of its adapter_config.json
  "$py" -c "import json, sys; c = json.load(open(sys.argv[1] + '/adapter_config.json')); print(c['r'], float(c['lora_alpha']), ','.join(sorted(c['target_modules'])))" "$1"
}
want="16 32.0 down_proj,gate_proj,k_proj,o_proj,q_proj,up_proj,v_proj"
mkdir -p "$tmp/a" "$tmp/b"
if run_cpu a; then
  got="$(adapter "$tmp/a/adapter")"
  [ "$got" = "$want" ] && echo "CPU recipe: trained 2 steps at world 2; adapters r alpha targets: $got" ||
    { echo "FAILED: the adapters are '$got', the recipe says '$want'"; fail=1; }
  [ -f "$tmp/a/merged/config.json" ] || { echo "FAILED: no merged export"; fail=1; }
else
  echo "FAILED: the CPU recipe did not train:"; cat "$tmp/a.log"; fail=1
fi
if run_cpu b --lora-rank 4; then
  got="$(adapter "$tmp/b/adapter")"
  [ "${got%% *}" = 4 ] && echo "command line over recipe: --lora-rank 4 gives r $got" ||
    { echo "FAILED: --lora-rank 4 on the command line gave '$got'"; fail=1; }
else
  echo "FAILED: the CPU recipe with --lora-rank 4 did not train:"; cat "$tmp/b.log"; fail=1
fi

# Bad recipes, refused by name before anything runs.
printf '[parallelism]\nflux = 2\n' > "$tmp/unknown.toml"
expect_error "'flux' in [parallelism] is not a flag of this program" "$planner" --recipe "$tmp/unknown.toml" --preset llama3.2-1b
printf '[data]\ntp = 2\n' > "$tmp/section.toml"
expect_error "'tp' belongs in [parallelism], not [data]" "$planner" --recipe "$tmp/section.toml" --preset llama3.2-1b
printf 'tp = 2\n' > "$tmp/top.toml"
expect_error "'tp' belongs in [parallelism] (every key stands in its section's table)" "$planner" --recipe "$tmp/top.toml" --preset llama3.2-1b
printf '[optimizer]\nlr = "fast"\n' > "$tmp/value.toml"
expect_error "--lr" "$planner" --recipe "$tmp/value.toml" --preset llama3.2-1b
# A recipe's value goes through the flag's own range check, as on the command line.
printf '[optimizer]\nlr = -0.5\n' > "$tmp/range.toml"
expect_error "--lr: must be > 0, got -0.5" "$planner" --recipe "$tmp/range.toml" --preset llama3.2-1b
expect_error "nope.toml" "$planner" --recipe "$tmp/nope.toml" --preset llama3.2-1b

[ "$fail" -eq 0 ] && echo "recipes: passed"
exit "$fail"
