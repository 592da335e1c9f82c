#!/usr/bin/env bash
# Checkpoints through the trainer, under mpiexec: a run saved after 3 of 6 steps and resumed
# gives the uninterrupted run's losses (bit for bit at the same world size, within 1e-5 at
# worlds 4 and 1, and saved at 4 resumed at 2 and 1); a rank killed (SIGKILL) in the middle of a save leaves the previous
# checkpoint intact and loadable, and the resumed run still matches; the exported safetensors
# file gives PyTorch's MiniLLM the trainer's loss (within 1e-5); --metrics-out goes on across a
# resume and the flags set AdamW's settings there. Bad flags and outputs that cannot be
# written exit non-zero before training.
#   checkpoint_resume.sh TRAIN_MINILLM PYTHON MPIEXEC [MPIEXEC_FLAGS...]
set -uo pipefail
bin="$1"; py="$2"; shift 2
mpiexec=("$@")
source "$(dirname "${BASH_SOURCE[0]}")/../../scripts/lib.sh"
here="$FSDP_ROOT"
fsdp_scratch
fsdp_one_thread
args=(--vocab 300 --dim 64 --layers 2 --heads 4 --seq 32 --lr 3e-3 --threads 1 --batch 4
      --data synthetic)
fail=0
run() {  # run NP LOG ARGS...
  local np="$1" log="$2"; shift 2
  "${mpiexec[@]}" -n "$np" "$bin" "${args[@]}" "$@" > "$tmp/$log" 2>&1
}
losses() { sed -E 's/.*"loss":([-0-9.eE+]+).*/\1/' "$1"; }
# compare A B TOLERANCE LABEL: the last lines of B against the same steps of A.
compare() {
  local n; n=$(wc -l < "$2")
  paste <(losses "$1" | tail -n "$n") <(losses "$2") |
    awk -v tol="$3" -v label="$4" '{ d = $1 - $2; if (d < 0) d = -d; a = $1 < 0 ? -$1 : $1
                                     if (d > tol * a) { print label ": " $1 " vs " $2; bad = 1 } }
                                   END { exit bad }' || fail=1
  echo "$4: $(losses "$2" | tr '\n' ' ')"
}

run 2 full.log --steps 6 --metrics-out "$tmp/full.jsonl" || { cat "$tmp/full.log"; exit 1; }
run 2 first.log --steps 3 --save-dir "$tmp/ck" --keep 2 || { cat "$tmp/first.log"; exit 1; }
for w in 2 4 1; do cp -r "$tmp/ck" "$tmp/ck$w"; done
run 2 r2.log --steps 6 --save-dir "$tmp/ck2" --resume --metrics-out "$tmp/r2.jsonl" \
  || { cat "$tmp/r2.log"; exit 1; }
grep -q "resume: .*step_0000000003 (step 3, saved by 2 ranks)" "$tmp/r2.log" \
  || { echo "no resume line:"; cat "$tmp/r2.log"; fail=1; }
compare "$tmp/full.jsonl" "$tmp/r2.jsonl" 0 "resumed at world 2 (bit-identical)"
# The summary's first loss is the first step run (3), not an unset 0.
grep -q "^done: loss $(printf '%.4f' "$(losses "$tmp/r2.jsonl" | head -1)") ->" "$tmp/r2.log" \
  || { echo "summary of the resumed run:"; grep '^done' "$tmp/r2.log"; fail=1; }
run 4 r4.log --steps 6 --save-dir "$tmp/ck4" --resume --metrics-out "$tmp/r4.jsonl" \
  || { cat "$tmp/r4.log"; exit 1; }
compare "$tmp/full.jsonl" "$tmp/r4.jsonl" 1e-5 "resumed at world 4"
"$bin" "${args[@]}" --steps 6 --save-dir "$tmp/ck1" --resume --metrics-out "$tmp/r1.jsonl" \
  > "$tmp/r1.log" 2>&1 || { cat "$tmp/r1.log"; exit 1; }
compare "$tmp/full.jsonl" "$tmp/r1.jsonl" 1e-5 "resumed at world 1"

# Saved at world 4, resumed at 2 and 1.
run 4 first4.log --steps 3 --save-dir "$tmp/from4" || { cat "$tmp/first4.log"; exit 1; }
cp -r "$tmp/from4" "$tmp/from4b"
run 2 r42.log --steps 6 --save-dir "$tmp/from4" --resume --metrics-out "$tmp/r42.jsonl" \
  || { cat "$tmp/r42.log"; exit 1; }
compare "$tmp/full.jsonl" "$tmp/r42.jsonl" 1e-5 "saved at world 4, resumed at 2"
"$bin" "${args[@]}" --steps 6 --save-dir "$tmp/from4b" --resume --metrics-out "$tmp/r41.jsonl" \
  > "$tmp/r41.log" 2>&1 || { cat "$tmp/r41.log"; exit 1; }
compare "$tmp/full.jsonl" "$tmp/r41.jsonl" 1e-5 "saved at world 4, resumed at 1"

# SIGKILL in the middle of the save of step 4: step 2 stays the latest, and resuming from it
# reproduces the uninterrupted run; the next save clears the unfinished directory.
# (Open MPI's ranks on this host inherit mpiexec's environment.)
if FSDP_TEST_KILL_IN_SAVE=4 run 2 killed.log --steps 6 --save-dir "$tmp/kill" --save-every 2; then
  echo "the run killed in its save exited 0"; fail=1
fi
ls -a "$tmp/kill" | grep -q '^.tmp-step_0000000004$' || { echo "no unfinished save left:"; ls -a "$tmp/kill"; fail=1; }
run 2 rk.log --steps 6 --save-dir "$tmp/kill" --save-every 2 --resume --metrics-out "$tmp/rk.jsonl" \
  || { cat "$tmp/rk.log"; exit 1; }
grep -q "step_0000000002 (step 2" "$tmp/rk.log" || { echo "did not resume from step 2:"; cat "$tmp/rk.log"; fail=1; }
compare "$tmp/full.jsonl" "$tmp/rk.jsonl" 0 "resumed after a kill during a save"
[ "$(ls -a "$tmp/kill" | grep -c tmp)" -eq 0 ] || { echo "unfinished save not cleared"; fail=1; }

# Export, then PyTorch's MiniLLM from the exported weights: the same loss on the same batch.
run 2 export.log --steps 3 --export "$tmp/model.safetensors" || { cat "$tmp/export.log"; exit 1; }
"$bin" "${args[@]}" --steps 1 --init-from "$tmp/model.safetensors" --metrics-out "$tmp/c.jsonl" \
  > "$tmp/c.log" 2>&1 || { cat "$tmp/c.log"; exit 1; }
"$py" "$here/bench/reference/py_minillm.py" --mode local --vocab 300 --dim 64 --layers 2 --heads 4 \
  --seq 32 --batch 4 --steps 1 --data synthetic --init-from "$tmp/model.safetensors" \
  > "$tmp/py.log" 2>&1 || { cat "$tmp/py.log"; exit 1; }
cpp=$(losses "$tmp/c.jsonl"); pyl=$(sed -nE 's/^step 0 loss ([-0-9.eE+]+).*/\1/p' "$tmp/py.log")
echo "exported weights, step-0 loss: C++ $cpp, PyTorch $pyl"
awk -v a="$cpp" -v b="$pyl" 'BEGIN { d = a - b; if (d < 0) d = -d; exit !(b != "" && d <= 1e-5 * a) }' \
  || { echo "PyTorch's loss from the export differs"; cat "$tmp/py.log"; fail=1; }

# --metrics-out on --resume: the first run's lines before the step it resumes at, then the
# resumed run's (the file's steps 0-5 give the uninterrupted run's losses).
"$bin" "${args[@]}" --steps 4 --save-dir "$tmp/m" --save-every 3 --metrics-out "$tmp/m.jsonl" \
  > "$tmp/m1.log" 2>&1 || { cat "$tmp/m1.log"; exit 1; }
rm -r "$tmp/m/step_0000000004"  # as if the run had died after step 3's line
"$bin" "${args[@]}" --steps 6 --save-dir "$tmp/m" --resume --metrics-out "$tmp/m.jsonl" \
  > "$tmp/m2.log" 2>&1 || { cat "$tmp/m2.log"; exit 1; }
steps=$(sed -E 's/.*"step":([0-9]+).*/\1/' "$tmp/m.jsonl" | tr '\n' ' ')
[ "$steps" = "0 1 2 3 4 5 " ] || { echo "--metrics-out after --resume holds steps $steps"; fail=1; }
compare "$tmp/full.jsonl" "$tmp/m.jsonl" 1e-5 "--metrics-out across a resume"
# The flags set AdamW's settings on a resumed run, and say what differs from the checkpoint's.
rm -r "$tmp/m/step_0000000006"
"$bin" "${args[@]}" --steps 6 --save-dir "$tmp/m" --resume --weight-decay 0.5 > "$tmp/m3.log" 2>&1 \
  || { cat "$tmp/m3.log"; exit 1; }
grep -q "^resume: AdamW's weight decay 0.5 (saved: 0.01) as the flags say" "$tmp/m3.log" \
  || { echo "no line for the changed weight decay:"; cat "$tmp/m3.log"; fail=1; }
# A --metrics-out that is no regular file is appended to on --resume (/dev/null), and one in a
# directory that does not exist yet gets it made.
rm -r "$tmp/m/step_0000000006"
"$bin" "${args[@]}" --steps 6 --save-dir "$tmp/m" --resume --metrics-out /dev/null > "$tmp/m5.log" 2>&1 \
  || { echo "--resume --metrics-out /dev/null:"; cat "$tmp/m5.log"; fail=1; }
[ -c /dev/null ] && [ -z "$(ls /dev/null.tmp-* 2>/dev/null)" ] || { echo "/dev/null was replaced"; fail=1; }
"$bin" "${args[@]}" --steps 1 --metrics-out "$tmp/new/dir/m.jsonl" > "$tmp/m6.log" 2>&1 \
  && [ -s "$tmp/new/dir/m.jsonl" ] || { echo "--metrics-out in a new directory:"; cat "$tmp/m6.log"; fail=1; }
"$bin" "${args[@]}" --steps 5 --save-dir "$tmp/m" --resume > "$tmp/m4.log" 2>&1 \
  || { cat "$tmp/m4.log"; exit 1; }
grep -q "is at step 6, --steps 5: nothing left to train" "$tmp/m4.log" \
  || { echo "a checkpoint past --steps:"; cat "$tmp/m4.log"; fail=1; }

# What a run writes is checked before it trains: exit 2, nothing written.
expect_error "holds checkpoints already (the newest: $tmp/m/step_0000000006): add --resume" \
  "$bin" "${args[@]}" --steps 2 --save-dir "$tmp/m"
expect_error "--export $tmp/model.safetensors: exists already" \
  "$bin" "${args[@]}" --steps 1 --export "$tmp/model.safetensors"
expect_error "--save-dir $tmp/model.safetensors: is not a directory" \
  "$bin" "${args[@]}" --steps 1 --save-dir "$tmp/model.safetensors"
expect_error "--metrics-out $tmp/m: is a directory" "$bin" "${args[@]}" --metrics-out "$tmp/m"
expect_error "--export: an empty value" "$bin" "${args[@]}" --steps 1 --export ""
# The newest checkpoint without its manifest: damaged, refused (not a silent resume at step 3).
mv "$tmp/m/step_0000000006/manifest.json" "$tmp/m/manifest.json.aside"
expect_error "step_0000000006 has no manifest.json: the newest checkpoint of $tmp/m is damaged" \
  "$bin" "${args[@]}" --steps 6 --save-dir "$tmp/m" --resume

# Bad flags: clear messages, exit 2.
expect_error "need --save-dir" "$bin" --resume
expect_error "--save-every: must be >= 0, got -1" "$bin" --save-dir "$tmp/x" --save-every -1
expect_error "give one" "$bin" --save-dir "$tmp/x" --resume --init-from "$tmp/model.safetensors"
[ "$fail" -eq 0 ] && echo "checkpoint resume: passed"
exit "$fail"
