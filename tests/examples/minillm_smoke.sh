#!/usr/bin/env bash
# Smoke test of train_minillm at a tiny size: world 1 and world 2 (mpiexec) agree on every
# step's loss to 1e-5, also with the training features on (accumulation without sync,
# activation checkpointing, the whole-model start-up), as 2 replicas (hybrid sharding) and with
# CPU offload (--offload all, --offload optimizer: on this machine the host is the device, the
# same copies run); with the quantized all-gather near them; float8 on the attention's
# projections near fp32 and apart from float8 on the feed-forward alone; the loss falls; bad
# flags exit non-zero with a message naming them; and fsdp_plan minillm (the program beside it)
# prints the plan of train_minillm's flags, as the deprecated train_minillm --plan still does.
#   minillm_smoke.sh TRAIN_MINILLM MPIEXEC [MPIEXEC_FLAGS...]
set -uo pipefail
bin="$1"; shift
mpiexec=("$@")
source "$(dirname "${BASH_SOURCE[0]}")/../../scripts/lib.sh"
fsdp_scratch
fsdp_one_thread
sizes=(--vocab 300 --dim 64 --layers 2 --heads 4 --seq 32 --steps 6 --lr 3e-3 --threads 1)
args=("${sizes[@]}" --batch 4)
fail=0

"$bin" "${args[@]}" --metrics-out "$tmp/w1.jsonl" > "$tmp/w1.log" 2>&1 || { cat "$tmp/w1.log"; exit 1; }
"${mpiexec[@]}" -n 2 "$bin" "${args[@]}" --metrics-out "$tmp/w2.jsonl" > "$tmp/w2.log" 2>&1 \
  || { cat "$tmp/w2.log"; exit 1; }
features=(--grad-accum 2 --activation-checkpointing --init-full-model)
"${mpiexec[@]}" -n 2 "$bin" "${args[@]}" "${features[@]}" --metrics-out "$tmp/w2f.jsonl" \
  > "$tmp/w2f.log" 2>&1 || { cat "$tmp/w2f.log"; exit 1; }
"${mpiexec[@]}" -n 2 "$bin" "${args[@]}" --replicas 2 --metrics-out "$tmp/w2r.jsonl" \
  > "$tmp/w2r.log" 2>&1 || { cat "$tmp/w2r.log"; exit 1; }
for mode in all optimizer; do
  "${mpiexec[@]}" -n 2 "$bin" "${args[@]}" --offload "$mode" --metrics-out "$tmp/w2o$mode.jsonl" \
    > "$tmp/w2o$mode.log" 2>&1 || { cat "$tmp/w2o$mode.log"; exit 1; }
done
losses() { sed -E 's/.*"loss":([-0-9.eE+]+).*/\1/' "$1"; }
paste <(losses "$tmp/w1.jsonl") <(losses "$tmp/w2.jsonl") <(losses "$tmp/w2f.jsonl") \
  <(losses "$tmp/w2r.jsonl") <(losses "$tmp/w2oall.jsonl") <(losses "$tmp/w2ooptimizer.jsonl") \
  > "$tmp/pairs"
[ "$(wc -l < "$tmp/pairs")" -eq 6 ] || { echo "expected 6 metrics lines per run"; cat "$tmp"/*.log; exit 1; }
if ! awk 'function off(a, b) { d = a - b; if (d < 0) d = -d; return d > 1e-5 * (a < 0 ? -a : a) }
          { if (off($1, $2)) bad = "world 2"; if (off($1, $3)) bad = "world 2 with " features
            if (off($1, $4)) bad = "world 2 as 2 replicas"
            if (off($1, $5)) bad = "world 2 with --offload all"
            if (off($1, $6)) bad = "world 2 with --offload optimizer" }
          NR == 1 { first = $1 } { last = $1 }
          END { if (bad) { print "world 1 and " bad " losses differ"; exit 1 }
                if (!(last < first)) { print "loss did not fall"; exit 1 } }' \
     features="${features[*]}" "$tmp/pairs"; then
  cat "$tmp/pairs"; fail=1
fi
echo "losses (world 1, world 2, world 2 with ${features[*]}, world 2 as 2 replicas," \
  "world 2 with --offload all, with --offload optimizer):"
cat "$tmp/pairs"
grep -q "as 2 replicas x 1 shards (hybrid sharding)" "$tmp/w2r.log" \
  || { echo "the header does not show the layout:"; cat "$tmp/w2r.log"; fail=1; }
grep -q "in 2 micro-batches" "$tmp/w2f.log" && grep -q "activation checkpointing" "$tmp/w2f.log" \
  || { echo "the header does not show the features:"; cat "$tmp/w2f.log"; fail=1; }

grep -q "| offload all" "$tmp/w2oall.log" \
  || { echo "the header does not show the offload:"; cat "$tmp/w2oall.log"; fail=1; }

# The quantized weight all-gather: int8 weights in the forward and backward, so the losses stay
# near world 1's unquantized ones without equalling them, and the header says so.
"${mpiexec[@]}" -n 2 "$bin" "${args[@]}" --quantize-all-gather 64 --metrics-out "$tmp/w2q.jsonl" \
  > "$tmp/w2q.log" 2>&1 || { cat "$tmp/w2q.log"; exit 1; }
# near_but_moved FILE COL OTHER WHAT: column COL of FILE within 2% of column 1 (the reference
# losses) at every step, and apart from column OTHER at some step.
near_but_moved() {
  if ! awk -v c="$2" -v o="$3" -v what="$4" \
       '{ d = $1 - $c; if (d < 0) d = -d; if (d > 2e-2 * $1) far = 1; if ($c != $o) moved = 1 }
        END { if (far) { print what " losses far from the reference"; exit 1 }
              if (!moved) { print what " losses equal those they should differ from"; exit 1 } }' \
       "$1"; then
    cat "$1"; fail=1
  fi
}
paste <(losses "$tmp/w1.jsonl") <(losses "$tmp/w2q.jsonl") > "$tmp/qpairs"
near_but_moved "$tmp/qpairs" 2 1 "quantized"
grep -q "| int8 all-gather, blocks of 64" "$tmp/w2q.log" \
  || { echo "the header does not show the quantized all-gather:"; cat "$tmp/w2q.log"; fail=1; }

# float8 on the attention's projections too (--float8-attention): near the fp32 losses (float8's
# rounding) without equalling those of float8 on the feed-forward alone; the header says so.
for run in "f8:--float8" "f8a:--float8 --float8-attention"; do
  # shellcheck disable=SC2086
  "$bin" "${args[@]}" ${run#*:} --metrics-out "$tmp/${run%%:*}.jsonl" > "$tmp/${run%%:*}.log" 2>&1 \
    || { cat "$tmp/${run%%:*}.log"; exit 1; }
done
paste <(losses "$tmp/w1.jsonl") <(losses "$tmp/f8.jsonl") <(losses "$tmp/f8a.jsonl") > "$tmp/f8pairs"
near_but_moved "$tmp/f8pairs" 3 2 "float8 attention"
grep -q "float8 feed-forward and attention (tensorwise)" "$tmp/f8a.log" \
  || { echo "the header does not show float8 attention:"; cat "$tmp/f8a.log"; fail=1; }

expect_error "--dim: must be > 0, got 0" "$bin" --dim 0
expect_error "--heads must divide --dim" "$bin" --dim 64 --heads 5
expect_error "no such file" "$bin" --data /nonexistent/text.txt
expect_error "The following argument was not expected: --bogus" "$bin" --bogus
expect_error "--loss-chunk needs --fused-loss" "$bin" --loss-chunk 8
expect_error "--float8-recipe needs --float8" "$bin" --float8-recipe rowwise
expect_error "--float8-attention needs --float8" "$bin" --float8-attention
expect_error "need --dim a multiple of 16" "$bin" --float8 --dim 40 --heads 4
expect_error "--clip-grad-norm: must be >= 0 (0: off), got -1" "$bin" --clip-grad-norm -1
expect_error "--clip-grad-norm: must be a finite number >= 0 (0: off), got inf" "$bin" --clip-grad-norm inf
expect_error "--lr: must be a finite number > 0, got nan" "$bin" --lr nan
expect_error "--init-from /nonexistent.safetensors: no such file" "$bin" --init-from /nonexistent.safetensors
expect_error "--steps: must be > 0, got -3" "$bin" --steps -3
expect_error "--grad-accum: must be > 0, got 0" "$bin" --grad-accum 0
expect_error "--beta2: must be in [0, 1), got 1" "$bin" --beta2 1
expect_error "Could not convert: --steps = many" "$bin" --steps many
expect_error "--replicas 2 must divide the world of 1 ranks" "$bin" --replicas 2
expect_error "--replicas 0 must divide the world of 1 ranks" "$bin" --replicas 0
expect_error "--offload optimizer keeps fsdp::FusedAdamW's state on the host" "$bin" --offload optimizer \
  --optimizer adamw
expect_error "--offload: bogus not in" "$bin" --offload bogus
expect_error "--quantize-all-gather: must be a block size, a multiple of 4" "$bin" --quantize-all-gather 6
expect_error "--grad-accum 3 must divide the 4 sequences each rank trains on" "$bin" "${args[@]}" --grad-accum 3
# Files the run writes: a --metrics-out it cannot write is refused while the flags are checked
# (by rank 0, which alone writes it; the launcher ends the others), a --profile-dir it cannot
# write fails before training on every rank alike (rank 1 names rank 0's failure); a write that
# fails later (a full disk) stops the run naming the file and the cause, never silently, and an
# error inside a profiled window still exits with status 1 (a profiler left running crashed
# libtorch's teardown: 139).
touch "$tmp/a_file"
expect_error "error: --metrics-out $tmp/a_file/m.jsonl: $tmp/a_file is not a directory" \
  "${mpiexec[@]}" -n 2 "$bin" "${args[@]}" --metrics-out "$tmp/a_file/m.jsonl"
expect_error "[rank 1/2] error: --profile-dir: rank 0: cannot create directory $tmp/a_file/x: Not a directory; rank 1:" \
  "${mpiexec[@]}" -n 2 "$bin" "${args[@]}" --profile-steps 1:2 --profile-dir "$tmp/a_file/x"
# A --resume from inside the --profile-steps window profiles the rest of the window.
short=(--vocab 300 --dim 64 --layers 2 --heads 4 --seq 32 --threads 1 --batch 4)
"$bin" "${short[@]}" --steps 2 --save-dir "$tmp/resume_prof" > "$tmp/rp1.log" 2>&1 &&
  "$bin" "${short[@]}" --steps 4 --save-dir "$tmp/resume_prof" --resume --profile-steps 1:2 \
    --profile-dir "$tmp/resume_prof/traces" > "$tmp/rp2.log" 2>&1 &&
  grep -q "^profile: steps 2..2 -> " "$tmp/rp2.log" ||
  { echo "FAILED: a resume inside the profile window"; cat "$tmp/rp1.log" "$tmp/rp2.log"; fail=1; }
if [ -c /dev/full ]; then
  expect_error "writing --metrics-out /dev/full failed after step 0: No space left on device" \
    "$bin" "${args[@]}" --metrics-out /dev/full
  "$bin" "${args[@]}" --profile-steps 0:2 --profile-dir "$tmp/prof" --metrics-out /dev/full \
    > "$tmp/prof_err.log" 2>&1
  status=$?
  if [ "$status" -ne 1 ]; then
    echo "FAILED: an error in a profiled window exited $status, expected 1"; cat "$tmp/prof_err.log"
    fail=1
  fi
fi
# A global batch that does not split over the ranks: every rank exits, none hangs.
if timeout 60 "${mpiexec[@]}" -n 2 "$bin" "${sizes[@]}" --batch 3 > "$tmp/split.log" 2>&1; then
  echo "expected --batch 3 to fail on 2 ranks"; fail=1
elif ! grep -q "must split evenly over the 2 ranks" "$tmp/split.log"; then
  echo "missing batch split message:"; cat "$tmp/split.log"; fail=1
fi
# A learning rate that blows the weights up: the next loss is not finite. --nonfinite stop
# (the default) ends the run naming the step, on both ranks; skip goes on, counting.
blowup=(--vocab 300 --dim 64 --layers 2 --heads 4 --seq 32 --steps 6 --threads 1 --batch 4 --lr 1e30)
if "${mpiexec[@]}" -n 2 "$bin" "${blowup[@]}" > "$tmp/nan.log" 2>&1; then
  echo "expected --lr 1e30 to stop on a non-finite step"; fail=1
elif ! grep -q "step 1: the loss or the gradient norm is not finite" "$tmp/nan.log"; then
  echo "missing non-finite stop message:"; cat "$tmp/nan.log"; fail=1
fi
"${mpiexec[@]}" -n 2 "$bin" "${blowup[@]}" --nonfinite skip > "$tmp/skip.log" 2>&1 \
  || { echo "--nonfinite skip failed:"; cat "$tmp/skip.log"; fail=1; }
grep -q "skipped 5 of 6 optimizer steps" "$tmp/skip.log" \
  || { echo "missing skip count:"; cat "$tmp/skip.log"; fail=1; }
# Planning: fsdp_plan minillm FLAGS is 0.2.0's train_minillm FLAGS --plan, byte for byte on
# stdout; the old way also warns on stderr, naming the new program. A plan reads no file the
# run names (the run may be for another machine).
planner="$(dirname "$bin")/fsdp_plan"
plan=(--preset reference --dtype bf16 --plan-world 64 --replicas 8 --plan-ranks-per-host 8)
elsewhere=(--data /nonexistent/text.txt --init-from /nonexistent/init.safetensors)
"$planner" minillm "${plan[@]}" "${elsewhere[@]}" > "$tmp/plan.log" 2> "$tmp/plan.err" ||
  { cat "$tmp/plan.err"; fail=1; }
"$bin" "${plan[@]}" --plan > "$tmp/old_plan.log" 2> "$tmp/old_plan.err" ||
  { cat "$tmp/old_plan.err"; fail=1; }
total="$(grep -E 'total \(peak\) +[0-9.]+ GiB' "$tmp/plan.log" | tr -s ' ')"
if [ -n "$total" ] && cmp -s "$tmp/plan.log" "$tmp/old_plan.log" && [ ! -s "$tmp/plan.err" ] &&
  grep -q "warning: train_minillm --plan is deprecated: fsdp_plan minillm" "$tmp/old_plan.err"; then
  echo "fsdp_plan minillm:$total, as train_minillm --plan (deprecated: it says so)"
else
  echo "FAILED: fsdp_plan minillm differs from train_minillm --plan, or no deprecation line"
  diff "$tmp/plan.log" "$tmp/old_plan.log" | head; cat "$tmp/plan.err" "$tmp/old_plan.err"; fail=1
fi
# The model named or not, a Llama plan is the same (a published preset: no file needed).
llama=(--preset llama3-8b --dtype bf16 --plan-world 8)
if "$planner" "${llama[@]}" > "$tmp/llama.log" 2>&1 &&
  "$planner" llama "${llama[@]}" > "$tmp/llama_named.log" 2>&1 &&
  grep -q "total (peak)" "$tmp/llama.log" && cmp -s "$tmp/llama.log" "$tmp/llama_named.log"; then
  echo "fsdp_plan llama: the same plan as fsdp_plan"
else
  echo "FAILED: fsdp_plan llama and fsdp_plan differ"; cat "$tmp/llama.log" "$tmp/llama_named.log"
  fail=1
fi
expect_error "fsdp_plan gpt2: unknown model; expected llama" "$planner" gpt2 --preset x
expect_error "The following argument was not expected: --plan" "$planner" minillm --plan
expect_error "--heads must divide --dim" "$planner" minillm --dim 64 --heads 5
if [ -c /dev/full ]; then
  expect_error "cannot write --plan-json /dev/full: No space left on device" \
    "$planner" minillm "${plan[@]}" --plan-json /dev/full
fi

[ "$fail" -eq 0 ] && echo "minillm smoke: passed"
exit "$fail"
