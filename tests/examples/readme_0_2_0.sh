#!/usr/bin/env bash
# 0.2.0's documented commands still run (never break a user's program): command lines of
# README.md, examples/minillm/README.md and examples/llama/README.md as released in 0.2.0 (commit
# 360a408; the line numbers below are those files'), copied here word for word, run against
# today's programs from build/bin. Every line that runs a trainer on one machine, and the
# fine-tune chain, except: the MLX evaluation and scripts/check_edge_runtimes.sh (README 137,
# 139: minutes of llama.cpp builds; docs/finetune.md's block runs them), the two-machine launch
# lines (242, 246: a template with <placeholders>; ctest multihost_netns runs them),
# scripts/roofline.py (550), the --preset reference run meant for a GPU (minillm/README 28), and
# the launch lines of minillm/README 25-27 (README 86-88's own) and llama/README 23-25 (those
# launchers with "..." for the flags).
#  - Each ends as it did: 0, or the kill the checkpoint walkthrough injects, then its resume.
#  - What moved prints its deprecation line naming the new program (train_llama --plan:
#    fsdp_plan; train_minillm --plan: fsdp_plan minillm).
#  - The plans print 0.2.0's figures (its tables' totals per GPU).
#  - The fine-tune chain exports a model transformers evaluates to the trainer's val_loss.
#  - A resume from the killed run repeats its losses.
# To keep ctest short, long training runs are cut to 2 steps: `--steps N` over 10 becomes
# `--steps 2`, and runs without --steps get it (train_minillm's default is 1000). Nothing else in
# a command changes.
#   readme_0_2_0.sh BIN_DIR PYTHON
set -uo pipefail
bindir="$(cd "$1" && pwd)"; py="$2"
source "$(dirname "${BASH_SOURCE[0]}")/../../scripts/lib.sh"
root="$FSDP_ROOT"
fsdp_scratch
fsdp_one_thread
torchrun="$(dirname "$py")/torchrun"
fsdp_pyfork  # the python below is scripts/pyfork.py's: the same programs, started in a fork
fail=0

# The commands run in a folder laid out as the README assumes: the repository's scripts/ and
# tests/, the build's bin/ as build/bin, and python and mpirun as the README's reader has them.
ln -s "$root/scripts" "$tmp/scripts"
ln -s "$root/tests" "$tmp/tests"
mkdir -p "$tmp/build" "$tmp/path"
ln -s "$bindir" "$tmp/build/bin"
# (a script, not a link: a virtual environment's python finds its packages from its own path)
printf '#!/usr/bin/env bash\nexec %s "$@"\n' "$py" > "$tmp/path/python"
chmod +x "$tmp/path/python"
# mpirun as the README prints it: --oversubscribe (more ranks than these cores) and, as root,
# --allow-run-as-root (the README says to add them on such machines).
real_mpirun="$(command -v mpirun)" || { echo "no mpirun on PATH"; exit 1; }
printf '#!/usr/bin/env bash\nexec %s %s "$@"\n' "$real_mpirun" "${FSDP_MPIRUN[*]:1}" > "$tmp/path/mpirun"
chmod +x "$tmp/path/mpirun"
export PATH="$tmp/path:$PATH"
cd "$tmp" || exit 1

# run WHERE EXPECT_RC 'COMMAND': the command as printed, step counts cut; output in $tmp/printed.
run() {
  local where="$1" want="$2" cmd="$3"
  case "$cmd" in
    *train_minillm*|*train_llama*)
      case "$cmd" in
        *--help*|*--plan*) ;;
        *--steps\ *) cmd="$(perl -pe 's/--steps (\d+)/"--steps " . ($1 > 10 ? 2 : $1)/e' <<< "$cmd")" ;;
        *) cmd="$cmd --steps 2" ;;
      esac ;;
  esac
  bash -c "$cmd" > "$tmp/printed" 2>&1
  local rc=$?
  if { [ "$want" = 0 ] && [ "$rc" -ne 0 ]; } || { [ "$want" != 0 ] && [ "$rc" -eq 0 ]; }; then
    echo "FAILED ($where): exit $rc, expected $([ "$want" = 0 ] && echo 0 || echo non-zero): $cmd"
    tail -15 "$tmp/printed"
    fail=1
    return 1
  fi
  echo "ok ($where): $cmd"
}

expect_line() {  # expect_line WHERE REGEX: the last command printed a line matching it
  if ! grep -qE -- "$2" "$tmp/printed"; then
    echo "FAILED ($1): no line matching '$2' in:"; tail -15 "$tmp/printed"; fail=1
  fi
}

# README.md 85-89, "Other sizes and launchers".
run README:85 0 'build/bin/train_minillm --help'
expect_line README:85 '--batch'
run README:86 0 'mpirun -np 4 --oversubscribe build/bin/train_minillm --batch 8'
expect_line README:86 '^done: loss'
run README:87 0 'scripts/launch.sh --nproc 2 build/bin/train_minillm'
expect_line README:87 '^done: loss'
if [ -x "$torchrun" ]; then
  ln -s "$torchrun" "$tmp/path/torchrun"
  # (its --log-dir, from the environment, in ours: by default torchrun leaves a torchelastic_*
  # folder in /tmp)
  PET_LOG_DIR="$tmp/torchrun_logs" run README:88 0 'torchrun --no-python --nproc-per-node 2 build/bin/train_minillm'
  expect_line README:88 '^done: loss'
else
  echo "skipped README:88: no $torchrun"
fi
run README:89 0 'build/bin/train_minillm --dtype bf16 --data synthetic --steps 50'
expect_line README:89 '^done: loss'

# README.md 110-135, the fine-tune chain (text to tokens, a tiny model, 4 ranks, export).
run README:110 0 'python scripts/tokenize_text.py /usr/share/common-licenses/{GPL-3,LGPL-2.1,Apache-2.0,MPL-2.0} \
    --out-dir data --vocab-size 1000'
run README:114 0 'python tests/reference/hf_llama.py make-tiny --out base --hidden 128 --layers 4 --heads 4 \
    --kv-heads 2 --intermediate 384 --init-std 0.02 --tokenizer data/tokenizer.model'
run README:117 0 'mpirun -np 4 build/bin/train_llama --hf-dir base --data-tokens data/train.bin \
    --val-tokens data/val.bin --seq 128 --batch 16 --steps 200 --lr 3e-3 --warmup 20 \
    --eval-every 50 --threads 1 --export-hf tuned --tokenizer data/tokenizer.model'
expect_line README:117 '^exported tuned'
ours="$(grep -oE 'val_loss [0-9.]+' "$tmp/printed" | tail -1 | cut -d' ' -f2)"
run README:133 0 'ls tuned'
for f in config.json generation_config.json model.safetensors tokenizer.model; do
  expect_line README:133 "^$f\$"
done
run README:135 0 'python tests/reference/hf_llama.py val-loss --framework transformers --hf-dir tuned --tokens data/val.bin --seq 128'
theirs="$(grep -oE 'val_loss [0-9.]+' "$tmp/printed" | cut -d' ' -f2)"
if awk -v a="${ours:-nan}" -v b="${theirs:-nan}" 'BEGIN { d = a - b; exit !(a > 0 && d < 1e-5 && d > -1e-5) }'; then
  echo "transformers' val_loss of the export $theirs, the trainer's $ours"
else
  echo "FAILED (README:135): transformers' val_loss '$theirs' is not the trainer's '$ours'"; fail=1
fi

# README.md 276-277 and 305-306, planning: 0.2.0's tables give 14.82 and 163.41 GiB per GPU.
run README:276 0 'build/bin/train_minillm --preset reference --dtype bf16 --plan --plan-world 64 --replicas 8 \
    --plan-ranks-per-host 8'
expect_line README:276 'total \(peak\) +14\.82[0-9] GiB'
expect_line README:276 'train_minillm --plan is deprecated: fsdp_plan minillm'
run README:305 0 'build/bin/train_llama --preset llama3-70b --dtype bf16 --seq 4096 --batch 64 \
    --activation-checkpointing --plan --plan-world 64 --replicas 8 --plan-ranks-per-host 8'
expect_line README:305 'total \(peak\) +163\.41[0-9] GiB'
expect_line README:305 'train_llama --plan is deprecated: fsdp_plan'

# README.md 483-494, a rank killed in the middle of a save, then 4 ranks resume and export.
run README:483 kill 'FSDP_TEST_KILL_IN_SAVE=4 mpirun -np 2 build/bin/train_minillm --dim 64 --layers 2 --heads 4 \
    --seq 32 --batch 4 --steps 6 --save-every 2 --save-dir ckpt'
grep -E '^step    [23] ' "$tmp/printed" | cut -d'|' -f1-2 > "$tmp/before"
run README:491 0 'ls -a ckpt'
expect_line README:491 '^step_0000000002$'
run README:493 0 'mpirun -np 4 build/bin/train_minillm --dim 64 --layers 2 --heads 4 --seq 32 --batch 4 \
    --steps 6 --save-every 2 --save-dir ckpt --resume --export model.safetensors'
expect_line README:493 '^resume: ckpt/step_0000000002 \(step 2, saved by 2 ranks\)'
expect_line README:493 '^exported model.safetensors'
grep -E '^step    [23] ' "$tmp/printed" | cut -d'|' -f1-2 > "$tmp/after"
if [ -s "$tmp/before" ] && cmp -s "$tmp/before" "$tmp/after"; then
  echo "the resumed run repeats the killed run's losses: $(paste -sd';' "$tmp/after")"
else
  echo "FAILED (README:493): the resumed losses differ from the killed run's"
  paste "$tmp/before" "$tmp/after"; fail=1
fi

# README.md 524, profiling.
run README:524 0 'mpirun -np 2 build/bin/train_minillm --threads 1 --steps 6 --batch 8 --profile-steps 3:4 --profile-dir prof'
expect_line README:524 '^profile: steps'

# examples/minillm/README.md 24, 80-81 and examples/llama/README.md 21-22.
run minillm/README:24 0 'mpirun -np 2 build/bin/train_minillm                                 # the README run'
run minillm/README:80 0 'build/bin/train_minillm --batch 4 --steps 5 --dim 64 --layers 2 --heads 4 --seq 32'
run minillm/README:81 0 'mpirun -np 2 build/bin/train_minillm --batch 4 --steps 5 --dim 64 --layers 2 --heads 4 --seq 32'
cp data/train.bin train.bin; cp data/val.bin val.bin; ln -s base DIR
run llama/README:21 0 'build/bin/train_llama --hf-dir DIR --data-tokens train.bin --val-tokens val.bin \
    --seq 256 --batch 16 --steps 1000 --warmup 50 --export-hf out          # one process'
expect_line llama/README:21 '^exported out'

[ "$fail" -eq 0 ] && echo "0.2.0's README commands: passed"
exit "$fail"
