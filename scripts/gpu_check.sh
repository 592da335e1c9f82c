#!/usr/bin/env bash
# One-shot GPU check, for a machine with one NVIDIA GPU (H200), CUDA 13, PyTorch 2.x in
# python3, and no internet. Prepare on a Debian machine with scripts/gpu_bundle_deps.sh and
# carry .gpu_deps. Budget: well under 8 minutes.
#   1. configure against the PyTorch wheel's libtorch and the nvidia-nccl wheel; build
#   2. GPU tests: NCCL collectives and fully_shard at world size 1 against plain libtorch; the
#      fake group as rank 0 of 4 and 8 on CUDA (memory, counts); the CPU suites as well
#   3. MiniLLM preset reference, bf16, NCCL world 1, 20 steps; the PyTorch FSDP2 reference
#      (bench/reference/py_minillm.py) side by side
#   4. a table: tokens/s, MFU, peak memory, ratios. Logs in $OUT (or gpu_check_out/).
set -uo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
out="${OUT:-$root/gpu_check_out}"
build="$root/build-gpu"
mkdir -p "$out"
PY="${PYTHON:-python3}"
status=()
step() { echo; echo "== $(date +%T) $*"; }

step "environment"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee "$out/gpu.txt"
torch_prefix="$($PY -c 'import torch; print(torch.utils.cmake_prefix_path)')"
$PY -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda)' | tee -a "$out/gpu.txt"
nccl_home="$($PY -c 'import nvidia.nccl as m; print(list(m.__path__)[0])' 2>/dev/null || true)"
echo "nccl wheel: ${nccl_home:-not found, using the CUDA toolkit copy}" | tee -a "$out/gpu.txt"
[ -d "$root/.gpu_deps" ] || { echo "missing .gpu_deps: run scripts/gpu_bundle_deps.sh and carry it"; exit 2; }

step "configure and build"
gen=(); command -v ninja > /dev/null && gen=(-G Ninja)
NCCL_HOME="$nccl_home" cmake -S "$root" -B "$build" "${gen[@]}" -DCMAKE_BUILD_TYPE=Release \
  -DCMAKE_PREFIX_PATH="$torch_prefix" -DFSDP_DEPS_DIR="$root/.gpu_deps" \
  -DFSDP_WITH_NCCL=ON -DFSDP_WITH_MPI=OFF -DFSDP_BUILD_BENCH=OFF > "$out/configure.log" 2>&1
status+=("configure=$?"); tail -3 "$out/configure.log"
cmake --build "$build" -j "$(nproc)" > "$out/build.log" 2>&1
status+=("build=$?"); grep -E "error|warning: unused" "$out/build.log" | head -20

step "GPU tests, then the CPU suites"
export LD_LIBRARY_PATH="${nccl_home:+$nccl_home/lib:}${LD_LIBRARY_PATH:-}"
(cd "$build" && ctest -R "Nccl|Cuda" --output-on-failure --timeout 300 > "$out/ctest_gpu.log" 2>&1)
status+=("gpu_tests=$?"); grep -E "rel err|tests passed|Failed|Skipped" "$out/ctest_gpu.log"
(cd "$build" && OMP_NUM_THREADS=1 ctest -E "Nccl|Cuda" -j 8 --timeout 300 > "$out/ctest_cpu.log" 2>&1)
status+=("cpu_tests=$?"); tail -3 "$out/ctest_cpu.log"

if ! $PY -c 'import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)'; then
  echo "no GPU visible to PyTorch: stopping before the training runs (a CPU dry run)"
  echo "status: ${status[*]}" | tee "$out/summary.txt"
  exit 0
fi

step "train MiniLLM (reference preset, bf16, NCCL world 1, 20 steps)"
"$build/bin/train_minillm" --preset reference --dtype bf16 --steps 20 --data synthetic \
  --metrics-out "$out/cpp_metrics.jsonl" > "$out/cpp_train.log" 2>&1
status+=("cpp_train=$?"); tail -4 "$out/cpp_train.log"

step "PyTorch FSDP2 reference (same preset, bf16 params, fp32 reduce)"
torchrun --nproc_per_node 1 "$root/bench/reference/py_minillm.py" --mode fsdp2 --device cuda \
  --preset reference --steps 20 > "$out/py_train.log" 2>&1
status+=("py_train=$?"); tail -2 "$out/py_train.log"

step "summary"
cpp_tps=$(sed -nE 's/^done: .*median ([0-9.]+) tok\/s.*/\1/p' "$out/cpp_train.log")
cpp_mfu=$(sed -nE 's/^MFU ([0-9.]+)%.*/\1/p' "$out/cpp_train.log")
cpp_mem=$(tail -1 "$out/cpp_metrics.jsonl" 2>/dev/null | sed -nE 's/.*"peak_mem_bytes":([0-9]+).*/\1/p')
py_tps=$(sed -nE 's/.*RESULT .*tokens_per_s=([0-9.]+).*/\1/p' "$out/py_train.log")
py_mfu=$(sed -nE 's/.*RESULT .*mfu=([0-9.]+).*/\1/p' "$out/py_train.log")
py_mem=$(sed -nE 's/.*RESULT .*peak_mem_mb=([0-9.]+).*/\1/p' "$out/py_train.log")
awk -v ct="${cpp_tps:-0}" -v cm="${cpp_mfu:-0}" -v cb="${cpp_mem:-0}" \
    -v pt="${py_tps:-0}" -v pm="${py_mfu:-0}" -v pb="${py_mem:-0}" 'BEGIN {
  printf "%-22s %12s %8s %16s\n", "program", "tokens/s", "MFU", "peak alloc MiB"
  printf "%-22s %12.0f %7.1f%% %16.0f\n", "fsdp-cpp", ct, cm, cb / 1048576
  printf "%-22s %12.0f %7.1f%% %16.0f\n", "PyTorch FSDP2", pt, pm * 100, pb
  if (pt > 0 && pb > 0) printf "%-22s %11.2fx %8s %15.2fx\n", "ratio fsdp-cpp/PyTorch", ct / pt, "", (cb / 1048576) / pb
}' | tee "$out/summary.txt"
echo "status: ${status[*]}" | tee -a "$out/summary.txt"
