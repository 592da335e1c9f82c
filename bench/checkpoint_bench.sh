#!/usr/bin/env bash
# Checkpoint throughput on this machine: fsdp-cpp's save and load of the 54.6M-parameter model
# with its AdamW state at world 4 (MPI), the disk's sequential write (dd, fsync) and read
# speed, and PyTorch's torch.distributed.checkpoint saving and loading the same model under
# FSDP2 at world 4 (gloo). Alternates the programs, --rounds times; writes
# bench/results/checkpoint.csv (bench/make_report.py adds it to bench/RESULTS.md).
#   bench/checkpoint_bench.sh [--rounds N] [--dir DIR]   (DIR: where checkpoints go; /tmp)
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/../scripts/lib.sh"
root="$FSDP_ROOT"
build="${BUILD_DIR:-$root/build}"
out="$root/bench/results"
rounds=3
base=/tmp
while [ $# -gt 0 ]; do
  case "$1" in
    --rounds) rounds="$2"; shift 2 ;;
    --dir) base="$2"; shift 2 ;;
    *) echo "usage: $0 [--rounds N] [--dir DIR]" >&2; exit 2 ;;
  esac
done
TRAIN="$build/bin/train_minillm"
py=$(sed -n 's/^FSDP_PYTHON:[A-Z]*=//p' "$build/CMakeCache.txt")
[ -x "$TRAIN" ] && [ -x "$py" ] || { echo "checkpoint_bench: build first" >&2; exit 2; }
mpi=("${FSDP_MPIRUN[@]}")
fsdp_one_thread
work="$base/fsdp_checkpoint_bench.$$"; mkdir -p "$work"; fsdp_on_exit 'rm -rf "$work"'
model=(--vocab 4096 --dim 512 --layers 16 --heads 8)
drop_caches() { sync; echo 3 > /proc/sys/vm/drop_caches 2>/dev/null && echo cold || echo warm; }

echo "round,program,save_s,load_s,bytes,read_cache" > "$out/checkpoint.csv"
for r in $(seq 1 "$rounds"); do
  # The disk: 1 GiB written sequentially and fsynced, then read back.
  dd if=/dev/zero of="$work/dd" bs=4M count=256 conv=fsync 2> "$work/dd.log"
  write_s=$(sed -nE 's/.* copied, ([0-9.]+) s.*/\1/p' "$work/dd.log")
  cache=$(drop_caches)
  dd if="$work/dd" of=/dev/null bs=4M 2> "$work/dd.log"
  read_s=$(sed -nE 's/.* copied, ([0-9.]+) s.*/\1/p' "$work/dd.log")
  rm -f "$work/dd"
  echo "$r,dd,$write_s,$read_s,1073741824,$cache" >> "$out/checkpoint.csv"

  rm -rf "$work/ck"
  "${mpi[@]}" -np 4 "$TRAIN" "${model[@]}" --seq 32 --batch 4 --steps 1 --threads 1 \
    --data synthetic --save-dir "$work/ck" > "$work/save.log" 2>&1 || { cat "$work/save.log"; exit 1; }
  save_s=$(sed -nE 's/^saved .* in ([0-9.]+) s/\1/p' "$work/save.log")
  bytes=$(du -sb "$work/ck" | cut -f1)
  cache=$(drop_caches)
  "${mpi[@]}" -np 4 "$TRAIN" "${model[@]}" --seq 32 --batch 4 --steps 1 --threads 1 \
    --data synthetic --save-dir "$work/ck" --resume > "$work/load.log" 2>&1 || { cat "$work/load.log"; exit 1; }
  load_s=$(sed -nE 's/^resume: .* loaded in ([0-9.]+) s/\1/p' "$work/load.log")
  echo "$r,fsdp-cpp,$save_s,$load_s,$bytes,$cache" >> "$out/checkpoint.csv"

  (cd "$root/bench/reference" && "$py" dcp_checkpoint.py --world 4 --dir "$work/dcp" \
     --port $((20000 + RANDOM % 20000)) "${model[@]}") > "$work/dcp.log" 2>&1 \
     || { cat "$work/dcp.log"; exit 1; }
  sed -nE "s/^RESULT world=4 save_s=([0-9.]+) load_s=([0-9.]+) bytes=([0-9]+)/$r,pytorch-dcp,\1,\2,\3,warm/p" \
    "$work/dcp.log" | sed "s/,warm\$/,$(drop_caches)/" >> "$out/checkpoint.csv"
  tail -3 "$out/checkpoint.csv"
done

"$root/bench/rewrite_report.sh" "$py"
