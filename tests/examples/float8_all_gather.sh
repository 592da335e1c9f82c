#!/usr/bin/env bash
# train_llama --float8 --float8-all-gather (the float8 Linears' weights gathered in float8,
# fsdp/ops/float8_all_gather.h) against --float8 alone: the same losses, bit for bit, at worlds
# 1, 2 and 3 (rows that split unevenly), in fp32 and in bf16 compute, with k_proj left out of
# float8 (gathered in the compute dtype beside the float8 weights); the all-gathers' input bytes
# the profile prints fall. Then --float8-all-gather without --float8, and with
# --quantize-all-gather, are refused by name.
#   float8_all_gather.sh TRAIN_LLAMA PYTHON MPIEXEC [MPIEXEC_FLAGS...]
set -uo pipefail
bin="$1"; py="$2"; shift 2
mpiexec=("$@")
source "$(dirname "${BASH_SOURCE[0]}")/../../scripts/lib.sh"
root="$FSDP_ROOT"
fsdp_scratch
fsdp_one_thread
fail=0
"$py" "$root/tests/reference/hf_llama.py" make-tiny --out "$tmp/model" --vocab 1001 --hidden 64 \
  --layers 2 --heads 4 --kv-heads 2 --intermediate 160 --seed 7 > /dev/null 2>&1 ||
  { echo "FAILED: make-tiny"; exit 1; }
"$py" -c "import numpy as np; (np.cumsum(np.random.default_rng(3).integers(1, 4, 12000)) % 1001).astype('<u2').tofile('$tmp/train.bin')"
run() {  # name ranks extra-args...
  local name=$1 np=$2
  shift 2
  "${mpiexec[@]}" -n "$np" "$bin" --hf-dir "$tmp/model" --data-tokens "$tmp/train.bin" --seq 16 \
    --batch 6 --steps 4 --lr 1e-2 --threads 1 --float8 --float8-skip k_proj \
    --metrics-out "$tmp/$name.jsonl" "$@" > "$tmp/$name.log" 2>&1 ||
    { echo "FAILED: $name"; tail -5 "$tmp/$name.log"; fail=1; return 1; }
}
losses() { "$py" -c "import json,sys; print(' '.join(repr(json.loads(l)['loss']) for l in open(sys.argv[1]) if 'loss' in l))" "$1"; }
gathered_mib() { sed -n 's/.*collective inputs per rank: all-gathers \([0-9.]*\) MiB.*/\1/p' "$1" | head -1; }
for dtype in fp32 bf16; do
  for np in 1 2 3; do
    name="${dtype}_w$np"
    run "${name}_plain" "$np" --dtype "$dtype" --profile-steps 1:1 --profile-dir "$tmp/p1" || continue
    run "${name}_gathered" "$np" --dtype "$dtype" --float8-all-gather --profile-steps 1:1 \
      --profile-dir "$tmp/p2" || continue
    a="$(losses "$tmp/${name}_plain.jsonl")" b="$(losses "$tmp/${name}_gathered.jsonl")"
    plain_mib="$(gathered_mib "$tmp/${name}_plain.log")"
    f8_mib="$(gathered_mib "$tmp/${name}_gathered.log")"
    if [ -z "$a" ] || [ "$a" != "$b" ]; then
      echo "FAILED: $name: losses $a (--float8) and $b (--float8-all-gather)"; fail=1
    elif [ "$np" -gt 1 ] && ! "$py" -c "import sys; sys.exit(0 if float('$f8_mib') < float('$plain_mib') else 1)"; then
      echo "FAILED: $name: all-gathers moved $f8_mib MiB with float8, $plain_mib MiB without"; fail=1
    else
      echo "$name: the same 4 losses ($b); all-gather inputs $plain_mib -> $f8_mib MiB per rank"
    fi
  done
done
# --float8-all-gather without --float8
expect_error "--float8-all-gather needs --float8" \
  "$bin" --hf-dir "$tmp/model" --data-tokens "$tmp/train.bin" --float8-all-gather
# --float8-all-gather with rowwise scaling (a gathered weight has one scale)
expect_error "--float8-all-gather casts each weight with one scale: it needs --float8-recipe tensorwise" \
  "$bin" --hf-dir "$tmp/model" --data-tokens "$tmp/train.bin" --float8 --float8-all-gather \
  --float8-recipe rowwise
# --float8-all-gather with --quantize-all-gather
expect_error "give one" \
  "$bin" --hf-dir "$tmp/model" --data-tokens "$tmp/train.bin" --float8 --float8-all-gather \
  --quantize-all-gather 256
exit $fail
