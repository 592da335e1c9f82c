#!/usr/bin/env bash
# Memory and time of the training features on this machine (fsdp-cpp's trainer, MPI ranks,
# one thread each); writes bench/results/{checkpointing,accumulation,startup}.csv, which
# bench/make_report.py turns into sections of bench/RESULTS.md.
#   bench/training_features.sh [--only checkpointing|accumulation|startup]
# Peak memory is the trainer's own report: the largest peak RSS over ranks (getrusage). The
# runtime baseline is the same binary with a model of a few KB. Activation checkpointing is
# measured under glibc's malloc and, when installed (Debian: libjemalloc2), under jemalloc
# (LD_PRELOAD): glibc keeps freed activation-sized blocks in its heap, resident.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/../scripts/lib.sh"
root="$FSDP_ROOT"
build="${BUILD_DIR:-$root/build}"
out="$root/bench/results"
only=""
while [ $# -gt 0 ]; do
  case "$1" in
    --only) only="$2"; shift 2 ;;
    *) echo "usage: $0 [--only checkpointing|accumulation|startup]" >&2; exit 2 ;;
  esac
done
TRAIN="$build/bin/train_minillm"
[ -x "$TRAIN" ] || { echo "training_features: build first ($TRAIN missing)" >&2; exit 2; }
mpi=("${FSDP_MPIRUN[@]}")
fsdp_one_thread
mkdir -p "$out"
fsdp_scratch

jemalloc=/usr/lib/x86_64-linux-gnu/libjemalloc.so.2
allocators=(glibc)
if [ -e "$jemalloc" ]; then allocators+=(jemalloc); else
  echo "training_features: $jemalloc not found (apt-get install libjemalloc2): glibc only"; fi

# run WORLD ARGS...: trains (under $ALLOC), leaves the output in $tmp/log, metrics in $tmp/m.jsonl.
ALLOC=glibc
run() {
  local w="$1"; shift
  local preload=()
  [ "$ALLOC" = jemalloc ] && preload=(-x "LD_PRELOAD=$jemalloc")
  "${mpi[@]}" "${preload[@]}" -np "$w" "$TRAIN" --threads 1 --data synthetic \
    --metrics-out "$tmp/m.jsonl" "$@" > "$tmp/log" 2>&1 || { cat "$tmp/log"; exit 1; }
}
peak_mb() { sed -nE 's/^done: .*peak ([0-9]+) MiB\/rank.*/\1/p' "$tmp/log"; }
startup_mb() { sed -nE 's/^start-up: .*peak rss ([0-9]+) MiB.*/\1/p' "$tmp/log"; }
step_s() { sed -nE 's/^done: .* ([0-9.]+) s\/step.*/\1/p' "$tmp/log"; }
# The library's own accounting, rank 0, largest over steps: gathered parameters + buffers.
accounted_mb() {
  python3 - "$tmp/m.jsonl" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
print(round(max(r["peak_full_param_bytes"] + r["peak_comm_buffer_bytes"] for r in rows) / 2**20))
PY
}

declare -A baseline
for ALLOC in "${allocators[@]}"; do
  run 1 --vocab 256 --dim 8 --layers 1 --heads 1 --seq 8 --batch 1 --steps 2
  baseline[$ALLOC]=$(peak_mb)
  echo "runtime baseline ($ALLOC): ${baseline[$ALLOC]} MiB"
done
ALLOC=glibc

if [ -z "$only" ] || [ "$only" = checkpointing ]; then
  echo "== activation checkpointing: vocab 4096, dim 512, 16 layers (54.6M parameters), 2 x 128 tokens per rank"
  mem=(--vocab 4096 --dim 512 --layers 16 --heads 8 --seq 128 --steps 5)
  echo "allocator,world,checkpointing,peak_rss_mb,step_s,accounted_mb,baseline_mb,params" \
    > "$out/checkpointing.csv"
  for ALLOC in "${allocators[@]}"; do
    for w in 1 2 4; do
      for ac in off on; do
        flag=(); [ "$ac" = on ] && flag=(--activation-checkpointing)
        run "$w" "${mem[@]}" --batch $((2 * w)) "${flag[@]}"
        echo "$ALLOC,$w,$ac,$(peak_mb),$(step_s),$(accounted_mb),${baseline[$ALLOC]},54575104" \
          >> "$out/checkpointing.csv"
        tail -1 "$out/checkpointing.csv"
      done
    done
  done
  ALLOC=glibc
fi

if [ -z "$only" ] || [ "$only" = accumulation ]; then
  echo "== accumulation: the same model, world 4, 4 sequences per rank in 4 micro-batches"
  mem=(--vocab 4096 --dim 512 --layers 16 --heads 8 --seq 128 --steps 5 --batch 16)
  echo "mode,peak_rss_mb,step_s" > "$out/accumulation.csv"
  run 4 "${mem[@]}"
  echo "one batch,$(peak_mb),$(step_s)" >> "$out/accumulation.csv"
  run 4 "${mem[@]}" --grad-accum 4
  echo "4 micro-batches without sync,$(peak_mb),$(step_s)" >> "$out/accumulation.csv"
  run 4 "${mem[@]}" --grad-accum 4 --grad-accum-sync
  echo "4 micro-batches with sync each,$(peak_mb),$(step_s)" >> "$out/accumulation.csv"
  cat "$out/accumulation.csv"
fi

if [ -z "$only" ] || [ "$only" = startup ]; then
  echo "== start-up: vocab 32000, dim 1024, 16 layers (267M parameters, 1.07 GB in fp32)"
  big=(--vocab 32000 --dim 1024 --layers 16 --heads 8 --seq 8 --steps 1)
  echo "world,startup,startup_peak_mb,baseline_mb,params,root_params,block_params" > "$out/startup.csv"
  for w in 1 2 4; do
    for mode in by-block whole; do
      flag=(); [ "$mode" = whole ] && flag=(--init-full-model)
      run "$w" "${big[@]}" --batch "$w" "${flag[@]}"
      echo "$w,$mode,$(startup_mb),${baseline[glibc]},266960896,65536000,12589056" >> "$out/startup.csv"
      tail -1 "$out/startup.csv"
    done
  done
fi

py=$(sed -n 's/^FSDP_PYTHON:[A-Z]*=//p' "$build/CMakeCache.txt")  # the venv's, with matplotlib
"$root/bench/rewrite_report.sh" "$py"
