#!/usr/bin/env bash
# Side-by-side measurements of fsdp-cpp's trainer and the PyTorch reference (torch 2.11: one
# process, DDP and FSDP2 over gloo) on this machine, alternating the programs round by round; writes bench/results/*.csv and regenerates
# bench/RESULTS.md and bench/results/*.png.
#   bench/compare_pytorch.sh [--rounds N]       (default 3; BUILD_DIR overrides ./build)
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/../scripts/lib.sh"
root="$FSDP_ROOT"
build="${BUILD_DIR:-$root/build}"
out="$root/bench/results"
rounds=3
while [ $# -gt 0 ]; do
  case "$1" in
    --rounds) rounds="$2"; shift 2 ;;
    *) echo "usage: $0 [--rounds N]" >&2; exit 2 ;;
  esac
done

venv=$(bash "$root/scripts/install_deps.sh" | sed -n 's/^install_deps: libtorch venv //p')
cmake -S "$root" -B "$build" -DCMAKE_BUILD_TYPE=Release > /dev/null
cmake --build "$build" -j "$(nproc)" --target train_minillm collectives_bench overhead_bench \
  optimizer_bench

PY="$venv/bin/python"                    # the venv's: torch 2.11, the libtorch we build against
REF="$root/bench/reference/py_minillm.py"
TRAIN="$build/bin/train_minillm"
mpi=("${FSDP_MPIRUN[@]}")
fsdp_one_thread   # one thread per rank, both programs
mkdir -p "$out"
log="$out/last_run.log"; : > "$log"

# Peak RSS (KiB) of the largest process of a command, and the command's output. A failing run
# is logged and leaves its figures empty (the report shows n/a) instead of ending the script:
# PyTorch's gloo teardown occasionally aborts at exit after its results are printed.
timed() {  # timed OUTFILE CMD...
  local f="$1"; shift
  /usr/bin/time -f "MAXRSS_KB %M" "$@" > "$f" 2>&1 || echo "compare_pytorch: exit status $? from: $*" | tee -a "$log"
  cat "$f" >> "$log"
}
rss_mb() { awk '/MAXRSS_KB/ { printf "%.0f", $2 / 1024 }' "$1"; }
py_tps() { sed -nE 's/.*RESULT .*tokens_per_s=([0-9.]+).*/\1/p' "$1"; }
cpp_tps() { sed -nE 's/^done: .*median ([0-9.]+) tok\/s.*/\1/p' "$1"; }
# PyTorch runs with torch.optim.AdamW(fused=True), its fastest AdamW on CPU, as ours runs
# fsdp::FusedAdamW: the comparison is with PyTorch at its best (optimizer_bench below gives the
# default AdamW's cost too).
pyref=("$PY" "$REF" --optimizer fused-adamw)
port() { echo "--port=$((20000 + RANDOM % 20000))"; }

echo "== machine" | tee -a "$log"
{
  echo "cpu: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //')"
  echo "cores: $(nproc --all), memory: $(free -g | awk '/Mem/ {print $2}') GiB"
  echo "torch (python and libtorch): $($PY -c 'import torch; print(torch.__version__)')"
  echo "blas: $($PY -c 'import torch; c = torch.__config__.show(); print("MKL" if "BLAS_INFO=mkl" in c else c)')"
  echo "date: $(date -u +%Y-%m-%dT%H:%MZ)"
} | tee "$out/machine.txt"

echo "== single-thread fp32 matmul rate (the CPU's peak for MFU)" | tee -a "$log"
$PY - <<'PYEOF' | tee "$out/matmul.txt"
import time, statistics, torch
torch.set_num_threads(1)
n = 1024
a, b = torch.randn(n, n), torch.randn(n, n)
for _ in range(3): a @ b
t = []
for _ in range(10):
    t0 = time.perf_counter(); a @ b; t.append(time.perf_counter() - t0)
print(f"matmul_gflops {2 * n**3 / statistics.median(t) / 1e9:.2f}")
PYEOF
peak_gflops=$(awk '{print $2}' "$out/matmul.txt")

echo "== speed: cpu-small, alternating, $rounds rounds" | tee -a "$log"
echo "program,world,round,tokens_per_s,peak_rss_mb" > "$out/speed.csv"
steps=8
row() { echo "$1,$2,$3,$4,$(rss_mb "$out/t.txt")" >> "$out/speed.csv"; }
for r in $(seq 1 "$rounds"); do
  timed "$out/t.txt" "${pyref[@]}" "$(port)" --mode local --steps $steps
  row pytorch 1 "$r" "$(py_tps "$out/t.txt")"
  timed "$out/t.txt" "$TRAIN" --threads 1 --steps $steps --batch 4 --data synthetic
  row fsdp-cpp 1 "$r" "$(cpp_tps "$out/t.txt")"
  for w in 2 4; do
    timed "$out/t.txt" "${pyref[@]}" "$(port)" --mode fsdp2 --world $w --steps $steps
    row pytorch-fsdp2 $w "$r" "$(py_tps "$out/t.txt")"
    timed "$out/t.txt" "${pyref[@]}" "$(port)" --mode ddp --world $w --steps $steps
    row pytorch-ddp $w "$r" "$(py_tps "$out/t.txt")"
    timed "$out/t.txt" "${mpi[@]}" -np $w "$TRAIN" --threads 1 --steps $steps --batch $((4 * w)) \
      --data synthetic
    row fsdp-cpp $w "$r" "$(cpp_tps "$out/t.txt")"
  done
  tail -8 "$out/speed.csv"
done

echo "== memory scaling: vocab 4096, dim 512, 16 layers (54.6M parameters), 2 sequences per rank" \
  | tee -a "$log"
mem=(--vocab 4096 --dim 512 --layers 16 --heads 8 --seq 128 --steps 4)
echo "program,world,peak_rss_mb,tokens_per_s" > "$out/memory.csv"
# The runtime alone (libtorch, MPI, a model of a few KB): the floor under every rank.
timed "$out/t.txt" "${mpi[@]}" -np 1 "$TRAIN" --vocab 256 --dim 8 --layers 1 --heads 1 --seq 8 \
  --batch 1 --steps 2 --threads 1 --data synthetic
echo "runtime-baseline,1,$(rss_mb "$out/t.txt"),0" >> "$out/memory.csv"
timed "$out/t.txt" $PY -c "import torch, torch.distributed"
echo "pytorch-runtime-baseline,1,$(rss_mb "$out/t.txt"),0" >> "$out/memory.csv"
for w in 1 2 4; do
  timed "$out/t.txt" "${mpi[@]}" -np $w "$TRAIN" "${mem[@]}" --threads 1 --batch $((2 * w)) --data synthetic
  echo "fsdp-cpp,$w,$(rss_mb "$out/t.txt"),$(cpp_tps "$out/t.txt")" >> "$out/memory.csv"
  timed "$out/t.txt" "${pyref[@]}" "$(port)" --mode fsdp2 --world $w "${mem[@]}" --batch 2
  echo "pytorch-fsdp2,$w,$(rss_mb "$out/t.txt"),$(py_tps "$out/t.txt")" >> "$out/memory.csv"
  if [ "$w" -eq 1 ]; then
    timed "$out/t.txt" "${pyref[@]}" "$(port)" --mode local "${mem[@]}" --batch 2
  else
    timed "$out/t.txt" "${pyref[@]}" "$(port)" --mode ddp --world $w "${mem[@]}" --batch 2
  fi
  echo "pytorch-ddp,$w,$(rss_mb "$out/t.txt"),$(py_tps "$out/t.txt")" >> "$out/memory.csv"
  tail -3 "$out/memory.csv"
done

echo "== AdamW step, cpu-small parameters, one thread" | tee -a "$log"
{ "$build/bin/optimizer_bench" --rounds "$rounds"
  (cd "$root/bench/reference" && $PY optimizer_step.py --rounds "$rounds" | tail -3); } \
  | tee "$out/optimizer.txt"

echo "== fully_shard overhead at world size 1" | tee -a "$log"
"$build/bin/overhead_bench" --rounds "$rounds" --steps 6 --threads 1 | tee "$out/overhead.txt"

echo "== collectives" | tee -a "$log"
"${mpi[@]}" -np 2 "$build/bin/collectives_bench" | tee "$out/collectives_mpi2.txt"
"${mpi[@]}" -np 4 "$build/bin/collectives_bench" | tee "$out/collectives_mpi4.txt"
"$build/bin/collectives_bench" --backend local --world 2 | tee "$out/collectives_local2.txt"

$PY "$root/bench/make_report.py" --results "$out" --peak-gflops "$peak_gflops" \
  --report "$root/bench/RESULTS.md"
echo "compare_pytorch: wrote bench/RESULTS.md"
