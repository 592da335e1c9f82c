#!/usr/bin/env bash
# train_llama --fused-loss (the head and the cross-entropy in one, fsdp/ops/linear_cross_entropy.h)
# against the unfused loss on the same layout: the same losses and validation loss (fp32, 5e-6:
# sums in other orders; 1.1e-6 measured) at worlds 1 and 2 and under tensor parallelism (dp 2 x
# tp 2 at world 4, --tp 2 --sp at world 2; --tp 2 alone and data parallelism at world 4 take no
# path of the loss that these leave out), on a tied model with a loss mask (targets left out)
# and an untied one; chunks of 7 tokens (a window of 32 splits unevenly) and the automatic size.
# Then --loss-chunk without --fused-loss is refused by name.
#   fused_loss.sh TRAIN_LLAMA PYTHON MPIEXEC [MPIEXEC_FLAGS...]
set -uo pipefail
bin="$1"; py="$2"; shift 2
mpiexec=("$@")
source "$(dirname "${BASH_SOURCE[0]}")/../../scripts/lib.sh"
root="$FSDP_ROOT"
fsdp_scratch
fsdp_one_thread
fsdp_pyfork
fail=0
for tied in "" "--tied"; do
  "$py" "$root/tests/reference/hf_llama.py" make-tiny --out "$tmp/model${tied:+_tied}" --vocab 1001 \
    --hidden 64 --layers 2 --heads 4 --kv-heads 2 --intermediate 160 --seed 7 $tied > /dev/null 2>&1 ||
    { echo "FAILED: make-tiny $tied"; exit 1; }
done
"$py" - "$tmp" <<'PY'
import sys, numpy as np
rng = np.random.default_rng(3)
walk = np.cumsum(rng.integers(1, 4, 12000)) % 1001
walk[:10000].astype("<u2").tofile(f"{sys.argv[1]}/train.bin")
walk[10000:].astype("<u2").tofile(f"{sys.argv[1]}/val.bin")
(rng.random(10000) < 0.7).astype("u1").tofile(f"{sys.argv[1]}/train.mask")  # 30% left out
PY
losses() {  # metrics file -> the training losses and the last validation loss, one per line
  "$py" -c "import json,sys; r=[json.loads(l) for l in open(sys.argv[1])]; [print(x['loss']) for x in r if 'loss' in x]; print([x['val_loss'] for x in r if 'val_loss' in x][-1])" "$1"
}
compare() {  # label want got
  "$py" - "$@" <<'PY'
import sys
label, a, b = sys.argv[1], open(sys.argv[2]).read().split(), open(sys.argv[3]).read().split()
if not a or len(a) != len(b):
    print(f"FAILED: {label}: {len(a)} and {len(b)} values"); sys.exit(1)
worst = max(abs(float(x) - float(y)) / abs(float(x)) for x, y in zip(a, b))
print(f"{label}: {len(a) - 1} losses and the validation loss, worst rel diff {worst:.1e}")
sys.exit(0 if worst <= 5e-6 else 1)
PY
}
run() {  # name ranks model extra-args...
  local name=$1 np=$2 model=$3
  shift 3
  "${mpiexec[@]}" -n "$np" "$bin" --hf-dir "$tmp/$model" --data-tokens "$tmp/train.bin" \
    --val-tokens "$tmp/val.bin" --seq 32 --batch 8 --steps 5 --lr 3e-3 --threads 1 --eval-every 5 \
    --metrics-out "$tmp/$name.jsonl" "$@" > "$tmp/$name.log" 2>&1 ||
    { echo "FAILED: $name"; tail -5 "$tmp/$name.log"; fail=1; return 1; }
  losses "$tmp/$name.jsonl" > "$tmp/$name.txt"
}
for layout in "w1:1:" "w2:2:" "dp2tp2:4:--tp 2" "tp2sp:2:--tp 2 --sp"; do
  IFS=: read -r name np flags <<< "$layout"
  for model in model model_tied; do
    mask=()
    [ "$model" = model_tied ] && mask=(--loss-mask "$tmp/train.mask")
    # shellcheck disable=SC2086
    run "${name}_${model}_unfused" "$np" "$model" $flags "${mask[@]}" || continue
    # shellcheck disable=SC2086
    run "${name}_${model}_fused" "$np" "$model" $flags "${mask[@]}" --fused-loss --loss-chunk 7 || continue
    label="untied"
    [ "$model" = model_tied ] && label="tied, masked"
    compare "$name $label fused (chunks of 7)" \
      "$tmp/${name}_${model}_unfused.txt" "$tmp/${name}_${model}_fused.txt" || fail=1
  done
done
# The automatic chunk (a vocabulary of 1001: a rank's 128 tokens in one chunk).
run w2_auto 2 model_tied --loss-mask "$tmp/train.mask" --fused-loss &&
  compare "w2 tied, masked fused (automatic chunk)" "$tmp/w2_model_tied_unfused.txt" \
    "$tmp/w2_auto.txt" || fail=1
expect_error "--loss-chunk needs --fused-loss" \
  "$bin" --hf-dir "$tmp/model" --data-tokens "$tmp/train.bin" --loss-chunk 8
exit $fail
