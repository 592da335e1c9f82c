#!/usr/bin/env bash
# Checkpoints across tensor-parallel layouts, through train_llama under mpiexec: a run at
# dp 2 x tp 2 (world 4) saved after 3 of 6 steps and resumed gives the uninterrupted run's losses
# bit for bit at the same layout, and within 1e-5 when resumed at dp 4 x tp 1 (FSDP alone), dp 1
# x tp 2 and one process. The checkpoint holds the full tensors (rows), whatever the layout.
# Gradient clipping by the global norm, two micro-batches and activation checkpointing are on
# throughout, so that they are checked under tensor parallelism too.
#   llama_tp_checkpoint.sh TRAIN_LLAMA PYTHON MPIEXEC [MPIEXEC_FLAGS...]
set -uo pipefail
bin="$1"; py="$2"; shift 2
mpiexec=("$@")
source "$(dirname "${BASH_SOURCE[0]}")/../../scripts/lib.sh"
root="$FSDP_ROOT"
fsdp_scratch
fsdp_one_thread
fail=0

# vocab 1001 over 2 TP ranks and then 2 or 4 data-parallel ranks: uneven everywhere.
"$py" "$root/tests/reference/hf_llama.py" make-tiny --out "$tmp/model" --vocab 1001 --hidden 64 \
  --layers 2 --heads 4 --kv-heads 2 --intermediate 160 --seed 5 > "$tmp/make.log" 2>&1 \
  || { cat "$tmp/make.log"; exit 1; }
"$py" -c "import numpy as np, sys; (np.cumsum(np.random.default_rng(4).integers(1, 4, 8000)) % 1001).astype('<u2').tofile(sys.argv[1])" "$tmp/train.bin"

args=(--hf-dir "$tmp/model" --data-tokens "$tmp/train.bin" --seq 32 --batch 8 --lr 3e-3
      --lr-schedule constant --warmup 0 --threads 1 --clip-grad-norm 0.5 --grad-accum 2
      --activation-checkpointing)
run() {  # run NP LOG ARGS...
  local np="$1" log="$2"; shift 2
  if [ "$np" -eq 1 ]; then "$bin" "${args[@]}" "$@" > "$tmp/$log" 2>&1
  else "${mpiexec[@]}" -n "$np" "$bin" "${args[@]}" "$@" > "$tmp/$log" 2>&1; fi
}
losses() { "$py" -c "import json,sys; [print(json.loads(l)['loss']) for l in open(sys.argv[1]) if '\"loss\"' in l]" "$1"; }
# compare A B TOLERANCE LABEL: the losses of B against the same (last) steps of A.
compare() {
  local n; n=$(losses "$2" | wc -l)
  [ "$n" -eq 3 ] || { echo "$4: expected 3 losses, got $n"; fail=1; return; }
  paste <(losses "$1" | tail -n "$n") <(losses "$2") |
    awk -v tol="$3" -v label="$4" '{ d = $1 - $2; if (d < 0) d = -d; a = $1 < 0 ? -$1 : $1
                                     if (d > tol * a) { print label ": " $1 " vs " $2; bad = 1 } }
                                   END { exit bad }' || fail=1
  echo "$4: $(losses "$2" | tr '\n' ' ')"
}

run 4 full.log --tp 2 --steps 6 --metrics-out "$tmp/full.jsonl" || { cat "$tmp/full.log"; exit 1; }
echo "uninterrupted at dp 2 x tp 2: $(losses "$tmp/full.jsonl" | tr '\n' ' ')"
run 4 first.log --tp 2 --steps 3 --save-dir "$tmp/ck" || { cat "$tmp/first.log"; exit 1; }
for layout in "4 2" "4 1" "2 2" "1 1"; do
  set -- $layout
  np=$1 tp=$2 name="dp$(($1 / $2))_tp$2"
  cp -r "$tmp/ck" "$tmp/ck_$name"
  run "$np" "$name.log" --tp "$tp" --steps 6 --save-dir "$tmp/ck_$name" --resume \
    --metrics-out "$tmp/$name.jsonl" || { cat "$tmp/$name.log"; fail=1; continue; }
  grep -q "resume: .*step_0000000003 (step 3, saved by 4 ranks)" "$tmp/$name.log" \
    || { echo "$name: no resume line"; cat "$tmp/$name.log"; fail=1; }
  tol=1e-5; [ "$name" = dp2_tp2 ] && tol=0
  compare "$tmp/full.jsonl" "$tmp/$name.jsonl" "$tol" "saved at dp 2 x tp 2, resumed at ${name/_/ x } (tolerance $tol)"
done
# The checkpoint's tensors are the full ones: the embedding [1001, 64], o_proj [64, 64].
"$py" - "$tmp/ck/step_0000000003/manifest.json" <<'PY' || fail=1
import json, sys
m = json.load(open(sys.argv[1]))
shapes = {t["name"]: t["shape"] for t in m["tensors"]}
want = {"model.embed_tokens.weight": [1001, 64], "model.layers.0.self_attn.o_proj.weight": [64, 64],
        "model.layers.0.mlp.down_proj.weight": [64, 160], "lm_head.weight": [1001, 64],
        "model.layers.0.mlp.down_proj.weight#exp_avg": [64, 160]}
bad = {k: (shapes.get(k), v) for k, v in want.items() if shapes.get(k) != v}
print("checkpoint shapes are the full tensors" if not bad else f"FAILED: shapes {bad}")
sys.exit(1 if bad else 0)
PY
[ "$fail" -eq 0 ] && echo "llama TP checkpoints: passed"
exit "$fail"
