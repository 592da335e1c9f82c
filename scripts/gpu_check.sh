#!/usr/bin/env bash
# One-shot GPU check, for a machine with one NVIDIA GPU (H200), CUDA 13, PyTorch 2.11 in
# python3, and no internet. Prepare on a Debian machine with scripts/gpu_bundle_deps.sh and
# carry .gpu_deps. Budget: well under 8 minutes.
#   1. configure against that python3's libtorch (the same CMake code as everywhere: its
#      torch.utils.cmake_prefix_path; NCCL from the nvidia-nccl wheel beside torch); build
#   2. GPU tests: NCCL collectives and fully_shard at world size 1 against plain libtorch; the
#      fake group as rank 0 of 4 and 8 on CUDA (memory, counts); the CPU suites as well
#   3. MiniLLM preset reference, bf16 parameters, fp32 reduction, AdamW 3e-4, NCCL world 1,
#      20 steps, and PyTorch FSDP2 (bench/reference/py_minillm.py) from the same weights on the
#      same batches, both with the fused AdamW kernel
#   4. a table: losses side by side, tokens/s, MFU, peak memory, ratios. Logs in $OUT (or
#      gpu_check_out/).
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
[ -d "$root/.gpu_deps" ] || { echo "missing .gpu_deps: run scripts/gpu_bundle_deps.sh and carry it"; exit 2; }

step "configure and build"
gen=(); command -v ninja > /dev/null && gen=(-G Ninja)
cmake -S "$root" -B "$build" "${gen[@]}" -DCMAKE_BUILD_TYPE=Release \
  -DCMAKE_PREFIX_PATH="$torch_prefix" -DFSDP_PYTHON="$(command -v "$PY")" \
  -DFSDP_DEPS_DIR="$root/.gpu_deps" -DFSDP_WITH_NCCL=ON -DFSDP_WITH_MPI=OFF \
  -DFSDP_BUILD_BENCH=OFF > "$out/configure.log" 2>&1
status+=("configure=$?"); tail -3 "$out/configure.log"
cmake --build "$build" -j "$(nproc)" > "$out/build.log" 2>&1
status+=("build=$?"); grep -E "error|warning: unused" "$out/build.log" | head -20

step "GPU tests, then the CPU suites"
(cd "$build" && ctest -R "Nccl|Cuda" --output-on-failure --timeout 300 > "$out/ctest_gpu.log" 2>&1)
status+=("gpu_tests=$?"); grep -E "rel err|tests passed|Failed|Skipped" "$out/ctest_gpu.log"
(cd "$build" && OMP_NUM_THREADS=1 ctest -E "Nccl|Cuda" -j 8 --timeout 300 > "$out/ctest_cpu.log" 2>&1)
status+=("cpu_tests=$?"); tail -3 "$out/ctest_cpu.log"

if ! $PY -c 'import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)'; then
  echo "no GPU visible to PyTorch: stopping before the training runs (a CPU dry run)"
  echo "status: ${status[*]}" | tee "$out/summary.txt"
  exit 0
fi

step "initial weights for both programs (reference preset, fp32 safetensors)"
init="$out/init.safetensors"
(cd "$root/bench/reference" && $PY - "$init" <<'PYEOF'
import sys, torch
from safetensors.torch import save_file
from py_minillm import MiniLLM, PRESETS
p = PRESETS["reference"]
torch.manual_seed(0)
m = MiniLLM(p["vocab"], p["dim"], p["layers"], p["heads"])
save_file({k: v.contiguous() for k, v in m.state_dict().items()}, sys.argv[1])
PYEOF
)
status+=("init=$?")

step "train MiniLLM (reference preset, bf16, NCCL world 1, 20 steps)"
"$build/bin/train_minillm" --preset reference --dtype bf16 --steps 20 --data synthetic \
  --init-from "$init" --metrics-out "$out/cpp_metrics.jsonl" > "$out/cpp_train.log" 2>&1
status+=("cpp_train=$?"); tail -4 "$out/cpp_train.log"

step "PyTorch FSDP2 reference (same preset, weights and batches; bf16 params, fp32 reduce)"
torchrun --standalone --nproc_per_node 1 "$root/bench/reference/py_minillm.py" --mode fsdp2 \
  --device cuda --preset reference --steps 20 --data synthetic --init-from "$init" \
  --optimizer fused-adamw > "$out/py_train.log" 2>&1
status+=("py_train=$?"); tail -2 "$out/py_train.log"
rm -f "$init"

step "summary"
$PY - "$out" <<'PYEOF' | tee "$out/summary.txt"
import json, os, re, sys
out = sys.argv[1]
cpp = [json.loads(l) for l in open(os.path.join(out, "cpp_metrics.jsonl"))] if os.path.exists(os.path.join(out, "cpp_metrics.jsonl")) else []
py_log = open(os.path.join(out, "py_train.log")).read() if os.path.exists(os.path.join(out, "py_train.log")) else ""
py = [float(m.group(1)) for m in re.finditer(r"^step \d+ loss (\S+)", py_log, re.M)]
print(f"{'step':>4} {'FSDP2 loss':>12} {'fsdp-cpp loss':>14} {'rel diff':>9}")
for i, (a, b) in enumerate(zip(py, [c["loss"] for c in cpp])):
    print(f"{i:>4} {a:>12.6f} {b:>14.6f} {abs(a - b) / abs(a):>9.2e}")
res = dict(re.findall(r"(\w+)=([0-9.]+)", (re.findall(r"RESULT .*", py_log) or [""])[-1]))
cpp_log = open(os.path.join(out, "cpp_train.log")).read()
tps = re.search(r"median ([0-9.]+) tok/s", cpp_log)
mfu = re.search(r"MFU ([0-9.]+)%", cpp_log)
rows = [("fsdp-cpp", float(tps.group(1)) if tps else 0, float(mfu.group(1)) if mfu else 0,
         (cpp[-1]["peak_mem_bytes"] / 2**20) if cpp else 0,
         sum(c["exposed_comm_s"] for c in cpp[2:]) / max(1, len(cpp) - 2)),
        ("PyTorch FSDP2", float(res.get("tokens_per_s", 0)), 100 * float(res.get("mfu", 0)),
         float(res.get("peak_mem_mb", 0)), float("nan"))]
print(f"{'program':<14} {'tokens/s':>10} {'MFU':>7} {'peak alloc MiB':>15} {'exposed comm s':>15}")
for name, t, m, mem, comm in rows:
    print(f"{name:<14} {t:>10.0f} {m:>6.1f}% {mem:>15.0f} {comm:>15.4f}")
if rows[1][1] > 0 and rows[1][3] > 0:
    print(f"ratio fsdp-cpp / FSDP2: tokens/s {rows[0][1] / rows[1][1]:.2f}x, "
          f"peak memory {rows[0][3] / rows[1][3]:.2f}x")
PYEOF
echo "status: ${status[*]}" | tee -a "$out/summary.txt"
