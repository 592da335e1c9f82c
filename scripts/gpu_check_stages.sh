# The stages of scripts/gpu_check.sh (sourced there; each runs as its own process under its own
# timeout). A stage writes its log to stdout, one summary line to $L/<stage>.detail, and may leave
# a table in $L/<stage>.table; env (and build) leave $L/env.sh for the stages after them.
# shellcheck shell=bash

L="$GPU_CHECK_LOGS"
ROOT="$GPU_CHECK_ROOT"
STAGE="${2:-}"

detail() { echo "$*" > "$L/$STAGE.detail"; }

# GPU_CHECK_DRY_RUN=1 (gpu_check.sh's header): the same stages on this machine's CPU.
if [ "${GPU_CHECK_DRY_RUN:-0}" = 1 ]; then
  PRESET=cpu-small PY_DEVICE=cpu
else
  PRESET=reference PY_DEVICE=cuda
fi

# gtest's verdict line: "12 passed, 0 failed, 0 skipped" (under FSDP_REQUIRE_GPU a skip fails);
# gtest_isolated.py's own when it ran the binary (it adds the tests that crashed).
gtest_counts() {
  local isolated
  isolated="$(sed -n 's/^gtest_isolated: //p' "$1" | tail -1)"
  [ -n "$isolated" ] && { echo "$isolated"; return; }
  local passed failed skipped
  passed="$(grep -oE '\[  PASSED  \] [0-9]+' "$1" | grep -oE '[0-9]+$' | tail -1)"
  failed="$(grep -oE '\[  FAILED  \] [0-9]+ test' "$1" | grep -oE '[0-9]+' | tail -1)"
  skipped="$(grep -oE '\[  SKIPPED \] [0-9]+ test' "$1" | grep -oE '[0-9]+' | tail -1)"
  echo "${passed:-0} passed, ${failed:-0} failed, ${skipped:-0} skipped"
}

free_port() {
  "$PYTHON" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

stage_env() {
  STAGE=env
  local gpu="no nvidia-smi"
  if command -v nvidia-smi > /dev/null; then
    nvidia-smi || true
    gpu="$(nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>&1 | head -1)"
  fi
  "$PYTHON" - > "$L/env_python.txt" 2>&1 << 'EOF'
import os, torch
try:  # the wheel's NCCL; needs no GPU, but a CPU-only wheel has none
    nccl = ".".join(map(str, torch.cuda.nccl.version()))
except Exception:
    nccl = "?"
name = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "no GPU visible"
print(f"VERSIONS torch {torch.__version__} | CUDA {torch.version.cuda} | NCCL {nccl} | {name}")
print("SITE", os.path.dirname(os.path.dirname(torch.__file__)))
EOF
  cat "$L/env_python.txt"
  local site versions libpath
  site="$(awk '/^SITE/ {print $2}' "$L/env_python.txt")"
  versions="$(sed -n 's/^VERSIONS //p' "$L/env_python.txt")"
  [ -n "$site" ] || { detail "python3 has no torch: $(tail -1 "$L/env_python.txt")"; return 1; }
  libpath="$site/torch/lib:$site/nvidia/nccl/lib:$site/nvidia/cu13/lib:$site/nvidia/cudnn/lib"
  echo "cores $(nproc)"; free -g; df -h /dev/shm /tmp
  # The initial weights (2.9 GB) go to memory, not to the output folder.
  local init=/dev/shm/fsdp_gpu_check_init.safetensors
  local shm_free
  shm_free="$(df --output=avail -B1G /dev/shm 2> /dev/null | tail -1 | tr -d ' ')"
  [ "${shm_free:-0}" -ge 8 ] || init=/tmp/fsdp_gpu_check_init.safetensors
  # The reference stage writes and reads safetensors; the GPU machine's python may lack the
  # package: .gpu_deps/python has its wheel unpacked (scripts/gpu_bundle_deps.sh).
  # The speed stage's references import torchao (float8) and liger_kernel, carried there too.
  local pythonpath=""
  if ! "$PYTHON" -c "import safetensors.torch, torchao.float8, liger_kernel.transformers" \
    2> /dev/null; then
    pythonpath="$ROOT/.gpu_deps/python"
    if PYTHONPATH="$pythonpath" "$PYTHON" -c "import safetensors.torch"; then
      echo "safetensors: from $pythonpath"
    else
      echo "safetensors: missing (the reference stage will fail; run scripts/gpu_bundle_deps.sh)"
    fi
    PYTHONPATH="$pythonpath" "$PYTHON" -c "import torchao.float8" 2> /dev/null ||
      echo "torchao: missing (the speed stage's float8 reference will fail)"
    PYTHONPATH="$pythonpath" "$PYTHON" -c "import liger_kernel.transformers" 2> /dev/null ||
      echo "liger_kernel: missing (the speed stage's Liger-Kernel reference will fail)"
  fi
  local bin="$ROOT/.gpu_bundle/bin"
  # A dry run without a bundle runs this checkout's own build.
  [ "${GPU_CHECK_DRY_RUN:-0}" = 1 ] && [ ! -x "$bin/train_minillm" ] && bin="$ROOT/build/bin"
  {
    echo "export LD_LIBRARY_PATH='$libpath'\${LD_LIBRARY_PATH:+:\$LD_LIBRARY_PATH}"
    echo "export GPU_CHECK_INIT='$init'"
    echo "export FSDP_GPU_BIN='$bin'"
    [ -n "$pythonpath" ] && echo "export PYTHONPATH='$pythonpath'\${PYTHONPATH:+:\$PYTHONPATH}"
  } > "$L/env.sh"
  # Whether the prebuilt programs load here: every library found, and they start.
  local bundle="$ROOT/.gpu_bundle" how="no bundle: build there"
  if [ -x "$bundle/bin/train_minillm" ]; then
    cat "$bundle/MANIFEST.txt" 2> /dev/null
    local missing
    missing="$(for f in "$bundle"/bin/* "$bundle"/lib/*; do
      LD_LIBRARY_PATH="$libpath" ldd "$f" | grep "not found"; done | sort -u)"
    LD_LIBRARY_PATH="$libpath" ldd "$bundle/bin/train_minillm"
    if [ -z "$missing" ] &&
      LD_LIBRARY_PATH="$libpath" "$bundle/bin/train_minillm" --help > /dev/null &&
      LD_LIBRARY_PATH="$libpath" "$bundle/bin/test_cuda" --gtest_list_tests > /dev/null; then
      touch "$L/bundle_ok"
      how="bundle loads"
    else
      how="bundle does not load (${missing:-a program failed to start}): build there"
    fi
  fi
  detail "$gpu | $versions | $how"
}

stage_build() {
  STAGE=build
  local build=/tmp/fsdp_gpu_build torch_prefix gen=()
  [ -d "$ROOT/.gpu_deps" ] || { detail "no .gpu_deps (scripts/gpu_bundle_deps.sh) to build with"; return 2; }
  torch_prefix="$("$PYTHON" -c 'import torch; print(torch.utils.cmake_prefix_path)')"
  command -v ninja > /dev/null && gen=(-G Ninja)
  cmake -S "$ROOT" -B "$build" "${gen[@]}" -DCMAKE_BUILD_TYPE=Release \
    -DCMAKE_PREFIX_PATH="$torch_prefix" -DFSDP_PYTHON="$(command -v "$PYTHON")" \
    -DFSDP_DEPS_DIR="$ROOT/.gpu_deps" -DFSDP_WITH_NCCL=ON -DFSDP_WITH_MPI=OFF \
    -DFSDP_BUILD_BENCH=OFF -DCMAKE_CUDA_ARCHITECTURES=90 \
    -DFSDP_WITH_CHAT_TEMPLATES=OFF \
    -DCMAKE_GTEST_DISCOVER_TESTS_DISCOVERY_MODE=PRE_TEST || { detail "configure failed"; return 1; }
  cmake --build "$build" -j "$(nproc)" --target train_minillm test_cuda nccl_two_ranks \
    nccl_gpu_fault failing_rank || { detail "build failed (build.log)"; return 1; }
  echo "export FSDP_GPU_BIN='$build/bin'" >> "$L/env.sh"
  detail "built train_minillm, test_cuda, nccl_two_ranks, nccl_gpu_fault, failing_rank in $build"
}

# Two processes on cuda:0: NCCL refuses two ranks of one host on one GPU, so each names its own
# host and they talk over loopback sockets. run_pair LOG-PREFIX SECONDS PROGRAM ARGS...
# start_rank R PORT LOG SECONDS PROGRAM ARGS...: one of the two, in the background ($!).
start_rank() {
  local r=$1 port=$2 log=$3 secs=$4 backend=gloo
  shift 4
  [ "$PY_DEVICE" = cuda ] && backend=nccl
  env WORLD_SIZE=2 LOCAL_RANK=0 LOCAL_WORLD_SIZE=1 MASTER_ADDR=127.0.0.1 FSDP_BACKEND="$backend" \
    NCCL_P2P_DISABLE=1 NCCL_SHM_DISABLE=1 NCCL_NET=Socket NCCL_IB_DISABLE=1 \
    NCCL_SOCKET_IFNAME=lo NCCL_NVLS_ENABLE=0 NCCL_DEBUG="${NCCL_DEBUG:-WARN}" \
    RANK="$r" MASTER_PORT="$port" NCCL_HOSTID="fsdp-gpu-check-$r" \
    timeout "$secs" "$@" > "$log" 2>&1 &
}

run_pair() {
  local prefix=$1 secs=$2 port pids=() rc=0 r
  shift 2
  port="$(free_port)"
  for r in 0 1; do
    start_rank "$r" "$port" "$L/${prefix}_rank$r.log" "$secs" "$@"
    pids+=($!)
  done
  for r in "${pids[@]}"; do wait "$r" || rc=$?; done
  return $rc
}

# leave_pair LOG-PREFIX SECONDS PROGRAM ARGS...: the two ranks, but only rank 1 is waited for;
# rank 0 (left waiting by it) is stopped then. Returns rank 1's exit status.
leave_pair() {
  local prefix=$1 secs=$2 port waiting rc
  shift 2
  port="$(free_port)"
  start_rank 0 "$port" "$L/${prefix}_rank0.log" "$secs" "$@"
  waiting=$!
  start_rank 1 "$port" "$L/${prefix}_rank1.log" "$secs" "$@"
  wait $!
  rc=$?
  kill "$waiting" 2> /dev/null
  wait "$waiting" 2> /dev/null
  return "$rc"
}

stage_nccl() {
  STAGE=nccl
  NCCL_DEBUG=INFO timeout 40 "$PYTHON" "$ROOT/scripts/gtest_isolated.py" "$L/nccl_gtest.log" \
    "$FSDP_GPU_BIN/test_cuda" --gtest_filter='NcclGroup.*' > /dev/null
  local rc=$?
  cat "$L/nccl_gtest.log"
  # The GPU fault alone (one rank), then with a peer: two ranks sharing the GPU, rank 0 faults.
  timeout 25 "$FSDP_GPU_BIN/nccl_gpu_fault" > "$L/nccl_fault.log" 2>&1
  local fault=$? verdict
  verdict="$([ $fault -eq 0 ] && echo named || echo "NOT named (rc $fault)")"
  # 77: no GPU to fault, a skip; allowed only in a dry run (FSDP_REQUIRE_GPU makes it 1).
  local pair=0 pair_verdict="skipped (no GPU)"
  if [ "$fault" -eq 77 ] && [ "${GPU_CHECK_DRY_RUN:-0}" = 1 ]; then
    fault=0 verdict="skipped (no GPU)"
  else
    run_pair nccl_fault2 60 "$FSDP_GPU_BIN/nccl_gpu_fault"
    pair=$?
    local secs
    secs="$(grep -h "error after" "$L"/nccl_fault2_rank*.log | sed 's/ error after / /' |
      awk '{printf "rank %s %.1f s, ", $2, $3}')"
    pair_verdict="$([ $pair -eq 0 ] && echo "ok" || echo "FAILED (rc $pair)"): ${secs%, }"
    cat "$L"/nccl_fault2_rank*.log
  fi
  cat "$L/nccl_fault.log"
  local said
  said="$(grep -m1 "after the fault" "$L/nccl_fault.log" | cut -c1-160)"
  # A rank leaving on an error with a collective in flight that its peer has not reached (rank
  # 1 issues an all-reduce and throws past its group's scope; rank 0 is busy for 60 s): its
  # group aborts the communicator instead of waiting for the collective and finalising (the
  # 30 s timeout), so it must report its error within 15 s of raising it (the leaving limit is
  # 10 s) and exit with status 1. Rank 0 is stopped then. The dry run's Gloo has no such
  # abort: there rank 1 throws with nothing in flight.
  local mode=pending
  [ "${GPU_CHECK_DRY_RUN:-0}" = 1 ] && mode=throw
  leave_pair nccl_throw 45 "$FSDP_GPU_BIN/failing_rank" "$mode" 30
  local left_rc=$? left left_verdict
  left="$(sed -n 's/.*this rank.s step failed (reported \([0-9.e+-]*\) s after.*/\1/p' \
    "$L/nccl_throw_rank1.log" | head -1)"
  [ -n "$left" ] && left="$(printf '%.1f' "$left")"
  if [ "$left_rc" -eq 1 ] && [ -n "$left" ] && awk -v s="$left" 'BEGIN { exit !(s < 15) }'; then
    left_verdict="ok: reported ${left} s after its error, exit 1"
  else
    left_verdict="FAILED: ${left:+reported ${left} s after its error, }exit $left_rc"
  fi
  cat "$L"/nccl_throw_rank*.log
  detail "NcclGroup: $(gtest_counts "$L/nccl_gtest.log") | GPU fault: $verdict${said:+: $said}" \
    "| with a peer: $pair_verdict | a rank leaving on an error ($mode): $left_verdict"
  [ "$rc" -eq 0 ] && [ "$fault" -eq 0 ] && [ "$pair" -eq 0 ] && [[ "$left_verdict" == ok* ]]
}

stage_cuda_tests() {
  STAGE=cuda_tests
  # One test that crashes must not take the rest with it (gtest_isolated.py).
  "$PYTHON" "$ROOT/scripts/gtest_isolated.py" "$L/cuda_gtest.log" "$FSDP_GPU_BIN/test_cuda" \
    --gtest_filter='-NcclGroup.*' > /dev/null
  local rc=$?
  cat "$L/cuda_gtest.log"
  detail "$(gtest_counts "$L/cuda_gtest.log") | $(grep -h "rel err" "$L/cuda_gtest.log" | tr '\n' ' ')"
  return "$rc"
}

stage_kernels() {
  STAGE=kernels
  local sizes=()
  # The dry run: a small shape (the CPU runs ATen in both columns: a check of the program).
  [ "${GPU_CHECK_DRY_RUN:-0}" = 1 ] && sizes=(--tokens 256 --hidden 256 --heads 4
    --intermediate 512 --vocab 4096 --iters 3 --repeats 3)
  "$FSDP_GPU_BIN/kernels_bench" --device "$PY_DEVICE" "${sizes[@]}" --json "$L/kernels.json"
  local rc=$?
  # "rms_norm 1.9x, ..., float8 down_proj 8192x2048 1.3x": ATen / fused.
  detail "$("$PYTHON" - "$L/kernels.json" 2> /dev/null << 'PY'
import json, sys
rows = json.load(open(sys.argv[1]))
print(", ".join("%s %.2fx" % (r["op"], r["aten_ms"] / r["fused_ms"]) for r in rows))
PY
)"
  return "$rc"
}

stage_smoke() {
  STAGE=smoke
  "$FSDP_GPU_BIN/train_minillm" --dtype bf16 --steps 5 --data synthetic --batch 8 \
    --metrics-out "$L/smoke_metrics.jsonl"
  local rc=$?
  detail "$(grep -E "^done" "$L/smoke.log" 2> /dev/null ||
    grep -m1 "error" "$L/smoke.log" | cut -c1-200 || echo "no summary line")"
  return "$rc"
}

# PyTorch FSDP2 on one rank (py_minillm.py), bf16 compute, fused AdamW: log-name seconds args...
fsdp2() {
  local name=$1 secs=$2
  shift 2
  (cd "$ROOT/bench/reference" &&
    timeout "$secs" "$PYTHON" -m torch.distributed.run --standalone --nproc_per_node 1 \
      py_minillm.py --mode fsdp2 --device "$PY_DEVICE" --dtype bf16 --optimizer fused-adamw "$@") \
    > "$L/$name.log" 2>&1
}

# The reference preset's initial weights, from PyTorch's own MiniLLM (bench/reference).
write_init() {
  [ -f "$GPU_CHECK_INIT" ] && return 0
  (cd "$ROOT/bench/reference" && "$PYTHON" - "$GPU_CHECK_INIT" "$PRESET" << 'EOF'
import sys, time, torch
from safetensors.torch import save_file
from py_minillm import MiniLLM, PRESETS
t0 = time.time()
p = PRESETS[sys.argv[2]]
torch.manual_seed(0)
m = MiniLLM(p["vocab"], p["dim"], p["layers"], p["heads"])
save_file({k: v.contiguous() for k, v in m.state_dict().items()}, sys.argv[1])
print(f"initial weights: {sys.argv[1]} in {time.time() - t0:.1f} s")
EOF
  )
}

stage_reference() {
  STAGE=reference
  write_init || { detail "could not write the initial weights"; return 1; }
  local common=(--preset "$PRESET" --steps 20 --data synthetic --init-from "$GPU_CHECK_INIT")
  # The same step on both sides (gpu_check.sh's header): no non-finite check here.
  timeout 65 "$FSDP_GPU_BIN/train_minillm" "${common[@]}" --dtype bf16 --nonfinite off \
    --metrics-out "$L/reference_cpp.jsonl" > "$L/reference_cpp.log" 2>&1
  local cpp=$?
  tail -5 "$L/reference_cpp.log"
  fsdp2 reference_fsdp2 65 "${common[@]}"
  local py=$?
  tail -3 "$L/reference_fsdp2.log"
  "$PYTHON" - "$L" > "$L/reference.table" << 'EOF'
import json, os, re, sys
L = sys.argv[1]
def read(name):
    p = os.path.join(L, name)
    return open(p).read() if os.path.exists(p) else ""
cpp = [json.loads(l) for l in read("reference_cpp.jsonl").splitlines() if l.strip()]
py_log = read("reference_fsdp2.log")
py = [float(m.group(1)) for m in re.finditer(r"^step \d+ loss (\S+)", py_log, re.M)]
print(f"{'step':>4} {'FSDP2 loss':>12} {'fsdp-cpp loss':>14} {'rel diff':>9}")
worst = 0.0
for i, (a, b) in enumerate(zip(py, [c["loss"] for c in cpp])):
    d = abs(a - b) / abs(a)
    worst = max(worst, d)
    print(f"{i:>4} {a:>12.6f} {b:>14.6f} {d:>9.2e}")
res = dict(re.findall(r"(\w+)=([0-9.]+)", (re.findall(r"RESULT .*", py_log) or [""])[-1]))
cpp_log = read("reference_cpp.log")
tps = re.search(r"median ([0-9.]+) tok/s", cpp_log)
mfu = re.search(r"MFU ([0-9.]+)%", cpp_log)
late = cpp[2:] if len(cpp) > 4 else cpp
rows = [("fsdp-cpp", float(tps.group(1)) if tps else 0, float(mfu.group(1)) if mfu else 0,
         max((c["peak_mem_bytes"] for c in cpp), default=0) / 2**20,
         1e3 * sum(c["exposed_comm_s"] for c in late) / max(1, len(late))),
        ("PyTorch FSDP2", float(res.get("tokens_per_s", 0)), 100 * float(res.get("mfu", 0)),
         float(res.get("peak_mem_mb", 0)), float("nan"))]
print(f"{'program':<14} {'tokens/s':>10} {'MFU':>7} {'peak alloc MiB':>15} {'exposed comm ms/step':>21}")
for name, t, m, mem, comm in rows:
    print(f"{name:<14} {t:>10.0f} {m:>6.1f}% {mem:>15.0f} {comm:>21.2f}")
ok = len(py) == len(cpp) and len(cpp) > 0 and worst < 1e-2
line = (f"losses {len(cpp)} steps, worst rel diff {worst:.1e} ({'within' if ok else 'NOT within'} 1e-2)"
        f" | fsdp-cpp {rows[0][1]:.0f} tok/s MFU {rows[0][2]:.1f}% peak {rows[0][3]:.0f} MiB"
        f" exposed {rows[0][4]:.2f} ms/step | FSDP2 {rows[1][1]:.0f} tok/s MFU {rows[1][2]:.1f}%"
        f" peak {rows[1][3]:.0f} MiB")
if rows[1][1] > 0 and rows[1][3] > 0:
    line += f" | ratio tok/s {rows[0][1] / rows[1][1]:.2f}x, memory {rows[0][3] / rows[1][3]:.2f}x"
open(os.path.join(L, "reference.detail"), "w").write(line + "\n")
sys.exit(0 if ok else 1)
EOF
  local cmp=$?
  cat "$L/reference.table"
  [ "$cpp" -eq 0 ] && [ "$py" -eq 0 ] && [ "$cmp" -eq 0 ]
}

# Issue 40's MiniLLM target (>= 1.15x FSDP2's tok/s): train_minillm with --fused-loss and
# --float8 (tensorwise, the feed-forward Linears) against FSDP2's plain run of the reference stage
# (run here when that stage has not run in this call), from the same weights; and the plain run
# with fsdp's kernels against it without them (FSDP_CUDA_KERNELS=0).
stage_minillm_speed() {
  STAGE=minillm_speed
  write_init || { detail "could not write the initial weights"; return 1; }
  local common=(--preset "$PRESET" --steps 20 --data synthetic --init-from "$GPU_CHECK_INIT")
  timeout 65 "$FSDP_GPU_BIN/train_minillm" "${common[@]}" --dtype bf16 --nonfinite off \
    --fused-loss --float8 --metrics-out "$L/minillm_fast.jsonl" > "$L/minillm_fast.log" 2>&1
  local cpp=$?
  tail -3 "$L/minillm_fast.log"
  # The attention's projections in float8 too (beyond torchao's conversion of this model).
  timeout 65 "$FSDP_GPU_BIN/train_minillm" "${common[@]}" --dtype bf16 --nonfinite off \
    --fused-loss --float8 --float8-attention --metrics-out "$L/minillm_fast_attn.jsonl" \
    > "$L/minillm_fast_attn.log" 2>&1 || cpp=1
  tail -3 "$L/minillm_fast_attn.log"
  # What the kernels alone buy MiniLLM (its norms, the residual add fused with norm2, the
  # batch-first attention): the plain run without them (FSDP2's kernels) against the reference
  # stage's plain run, or a plain run here.
  FSDP_CUDA_KERNELS=0 timeout 65 "$FSDP_GPU_BIN/train_minillm" "${common[@]}" --dtype bf16 \
    --nonfinite off --metrics-out "$L/minillm_nokernels.jsonl" > "$L/minillm_nokernels.log" 2>&1 ||
    cpp=1
  tail -3 "$L/minillm_nokernels.log"
  if ! grep -q "median" "$L/reference_cpp.log" 2> /dev/null; then
    timeout 65 "$FSDP_GPU_BIN/train_minillm" "${common[@]}" --dtype bf16 --nonfinite off \
      --metrics-out "$L/reference_cpp.jsonl" > "$L/reference_cpp.log" 2>&1 || cpp=1
  fi
  local py=0
  if ! grep -q "^RESULT" "$L/reference_fsdp2.log" 2> /dev/null; then
    fsdp2 reference_fsdp2 65 "${common[@]}"
    py=$?
  fi
  detail "$("$PYTHON" - "$L" 2> /dev/null << 'PY'
import json, os, re, sys
L = sys.argv[1]
def read(name):
    p = os.path.join(L, name)
    return open(p).read() if os.path.exists(p) else ""
def tok_s(name):  # the trainer's median tokens/s in its log, 0 if it has none
    m = re.search(r"median ([0-9.]+) tok/s", read(name))
    return float(m.group(1)) if m else 0.0
fast = [json.loads(l) for l in read("minillm_fast.jsonl").splitlines() if l.strip()]
attn = [json.loads(l) for l in read("minillm_fast_attn.jsonl").splitlines() if l.strip()]
res = dict(re.findall(r"(\w+)=([0-9.]+)", (re.findall(r"RESULT .*", read("reference_fsdp2.log")) or [""])[-1]))
py = [float(m.group(1)) for m in re.finditer(r"^step \d+ loss (\S+)", read("reference_fsdp2.log"), re.M)]
worst = max((abs(a - b["loss"]) / abs(a) for run in (fast, attn) for a, b in zip(py, run)),
            default=float("nan"))
mine, theirs = tok_s("minillm_fast.log"), float(res.get("tokens_per_s", 0))
mine_attn = tok_s("minillm_fast_attn.log")
peak = max((c["peak_mem_bytes"] for c in fast), default=0) / 2**20
peak_attn = max((c["peak_mem_bytes"] for c in attn), default=0) / 2**20
plain, bare = tok_s("reference_cpp.log"), tok_s("minillm_nokernels.log")
print(f"kernels {plain:.0f} tok/s, without {bare:.0f}: {plain / bare if bare else 0:.2f}x; "
      f"FSDP2 {theirs:.0f} | ", end="")
print(f"fused loss + float8 {mine:.0f} tok/s, FSDP2 {theirs:.0f}: "
      f"{mine / theirs if theirs else 0:.2f}x (target 1.15x); with float8 attention "
      f"{mine_attn / theirs if theirs else 0:.2f}x | peak {peak:.0f} MiB ({peak_attn:.0f} with "
      f"float8 attention), FSDP2 "
      f"{float(res.get('peak_mem_mb', 0)):.0f} | losses worst rel diff {worst:.1e} (float8's rounding)")
PY
)"
  [ "$cpp" -eq 0 ] && [ "$py" -eq 0 ]
}

stage_offload() {
  STAGE=offload
  write_init || { detail "could not write the initial weights"; return 1; }
  local common=(--preset "$PRESET" --steps 6 --data synthetic --init-from "$GPU_CHECK_INIT")
  local rc=0 mode
  # Each run's own limit fits what it runs: about 10 s of start-up and 6 steps of up to 1.3 s
  # for fsdp-cpp; FSDP2's CPU offload needed about 60 s on the first run (pinning the host
  # copies and 6 steps of 1.26 s).
  for mode in all optimizer; do
    timeout 60 "$FSDP_GPU_BIN/train_minillm" "${common[@]}" --dtype bf16 --nonfinite off \
      --offload "$mode" --metrics-out "$L/offload_${mode}.jsonl" > "$L/offload_${mode}.log" 2>&1 ||
      rc=1
    tail -3 "$L/offload_${mode}.log"
  done
  fsdp2 offload_fsdp2 110 "${common[@]}" --offload || rc=1
  tail -3 "$L/offload_fsdp2.log"
  "$PYTHON" - "$L" > "$L/offload.table" << 'EOF'
import json, os, re, sys
L = sys.argv[1]
def read(name):
    p = os.path.join(L, name)
    return open(p).read() if os.path.exists(p) else ""
def cpp(name):  # tokens/s (the trainer's median), peak device MiB, steps
    log = read(name + ".log")
    tps = re.search(r"median ([0-9.]+) tok/s", log)
    rows = [json.loads(l) for l in read(name + ".jsonl").splitlines() if l.strip()]
    return (float(tps.group(1)) if tps else 0.0,
            max((r["peak_mem_bytes"] for r in rows), default=0) / 2**20, len(rows))
def py(name):
    log = read(name + ".log")
    res = dict(re.findall(r"(\w+)=([0-9.]+)", (re.findall(r"RESULT .*", log) or [""])[-1]))
    steps = len(re.findall(r"^step \d+ loss ", log, re.M))
    return (float(res.get("tokens_per_s", 0)), float(res.get("peak_mem_mb", 0)), steps)
def losses(name):
    return [json.loads(l)["loss"] for l in read(name + ".jsonl").splitlines() if l.strip()]
# The same weights, data and steps: the losses of the run without offload, to bf16 rounding (the
# optimizer steps on the CPU's kernel instead of CUDA's).
base_losses = losses("reference_cpp")
worst = {}
for mode in ("all", "optimizer"):
    got = losses("offload_" + mode)
    pairs = list(zip(base_losses, got))
    worst[mode] = max((abs(a - b) / abs(a) for a, b in pairs), default=float("inf"))
rows = [("fsdp-cpp, no offload (reference stage)", cpp("reference_cpp")),
        ("fsdp-cpp --offload all", cpp("offload_all")),
        ("fsdp-cpp --offload optimizer", cpp("offload_optimizer")),
        ("FSDP2, no offload (reference stage)", py("reference_fsdp2")),
        ("FSDP2 CPUOffloadPolicy", py("offload_fsdp2"))]
print(f"{'program':<40} {'tokens/s':>10} {'peak device MiB':>16} {'steps':>6}")
for name, (t, mem, n) in rows:
    print(f"{name:<40} {t:>10.0f} {mem:>16.0f} {n:>6}")
base, full, opt, pbase, pfull = (r[1] for r in rows)
def ratio(a, b, i):
    return f"{a[i] / b[i]:.2f}x" if b[i] > 0 else "?"
line = (f"offload all: {full[0]:.0f} tok/s ({ratio(full, base, 0)} of none), peak {full[1]:.0f} MiB"
        f" ({ratio(full, base, 1)}) | optimizer: {opt[0]:.0f} tok/s ({ratio(opt, base, 0)}), peak"
        f" {opt[1]:.0f} MiB ({ratio(opt, base, 1)}) | FSDP2 offload: {pfull[0]:.0f} tok/s, peak"
        f" {pfull[1]:.0f} MiB | fsdp-cpp/FSDP2 with offload: tok/s {ratio(full, pfull, 0)},"
        f" memory {ratio(full, pfull, 1)} | losses vs no offload: worst rel diff all"
        f" {worst['all']:.1e}, optimizer {worst['optimizer']:.1e} (within 1e-2:"
        f" {'yes' if max(worst.values()) < 1e-2 else 'NO'})")
open(os.path.join(L, "offload.detail"), "w").write(line + "\n")
sys.exit(0 if full[2] > 0 and opt[2] > 0 and pfull[2] > 0 and max(worst.values()) < 1e-2
         else 1)
EOF
  local cmp=$?
  cat "$L/offload.table"
  [ "$rc" -eq 0 ] && [ "$cmp" -eq 0 ]
}

stage_profile() {
  STAGE=profile
  write_init || return 1
  timeout 40 "$FSDP_GPU_BIN/train_minillm" --preset "$PRESET" --dtype bf16 --steps 4 \
    --data synthetic --init-from "$GPU_CHECK_INIT" --profile-steps 2:2 \
    --profile-dir "$L/profile"
  local rc=$?
  # The CPU's profile prints "profile: compute ..."; a GPU's its kernel table and exposed wait.
  local top
  top="$(grep -A1 "^device kernel" "$L/profile.log" | tail -1 | awk '{print $1, $NF}')"
  detail "$(grep -m1 -E "^profile: (compute|exposed)" "$L/profile.log" | cut -c1-160)" \
    "${top:+| top kernel: $top}"
  return "$rc"
}

stage_two_ranks() {
  STAGE=two_ranks
  NCCL_DEBUG=INFO run_pair two_ranks_tests 60 "$FSDP_GPU_BIN/nccl_two_ranks"
  local tests=$?
  cat "$L/two_ranks_tests_rank0.log"
  run_pair two_ranks_trainer 30 "$FSDP_GPU_BIN/train_minillm" --dtype bf16 --steps 5 \
    --data synthetic --batch 8 --metrics-out "$L/two_ranks_metrics.jsonl"
  local trainer=$?
  tail -3 "$L/two_ranks_trainer_rank0.log"
  local cmp
  cmp="$(compare_losses "$L/smoke_metrics.jsonl" "$L/two_ranks_metrics.jsonl" 1e-2)"
  detail "nccl_two_ranks: $(gtest_counts "$L/two_ranks_tests_rank0.log") (rc $tests) |" \
    "trainer world 2 vs 1 (bf16): $cmp (rc $trainer)"
  [ "$tests" -eq 0 ] && [ "$trainer" -eq 0 ]
}

# A tiny Llama (vocab 1001: uneven shards) and a random walk over its vocabulary, for the
# subgroup and LoRA stages: $L/tiny (the model), $L/tiny_train.bin, $L/tiny_val.bin.
make_tiny_llama() {
  [ -f "$L/tiny/config.json" ] && return 0
  "$PYTHON" "$ROOT/tests/reference/hf_llama.py" make-tiny --out "$L/tiny" --vocab 1001 \
    --hidden 64 --layers 2 --heads 4 --kv-heads 2 --intermediate 160 --seed 7 || return 1
  "$PYTHON" - "$L" << 'EOF'
import sys, numpy as np
rng = np.random.default_rng(3)
walk = np.cumsum(rng.integers(1, 4, 12000)) % 1001
walk[:10000].astype("<u2").tofile(f"{sys.argv[1]}/tiny_train.bin")
walk[10000:].astype("<u2").tofile(f"{sys.argv[1]}/tiny_val.bin")
EOF
}

# The losses of two metrics files (train_llama --metrics-out): prints "worst rel diff X over N
# steps"; exit 1 beyond the tolerance or when either has none. compare_losses WANT GOT TOLERANCE
compare_losses() {
  "$PYTHON" - "$@" << 'EOF'
import json, sys
def losses(p):
    try:
        return [json.loads(l)["loss"] for l in open(p) if '"loss"' in l]
    except OSError:
        return []
a, b, tol = losses(sys.argv[1]), losses(sys.argv[2]), float(sys.argv[3])
if not a or len(a) != len(b):
    print(f"no losses to compare ({len(a)} and {len(b)} steps)")
    sys.exit(1)
worst = max(abs(x - y) / abs(x) for x, y in zip(a, b))
print(f"worst rel diff {worst:.1e} over {len(a)} steps")
sys.exit(0 if worst <= tol else 1)
EOF
}

# HSDP's and tensor parallelism's NCCL subgroups (ProcessGroup::split: the first GPU run crashed
# on every one) in the Llama trainer on two ranks sharing the GPU, against world 1, fp32:
# 2 replicas x 1 shard, 1 x 2, and dp 1 x tp 2 with and without sequence parallelism (losses,
# 1e-5); tp 2's logits against world 1's (1e-5).
stage_subgroups() {
  STAGE=subgroups
  make_tiny_llama || { detail "could not write the tiny model"; return 1; }
  local run=("$FSDP_GPU_BIN/train_llama" --hf-dir "$L/tiny" --data-tokens "$L/tiny_train.bin"
    --seq 32 --batch 8 --steps 6 --lr 3e-3 --warmup 2 --threads 2)
  local rc=0 line="" layout name cmp
  timeout 40 "${run[@]}" --metrics-out "$L/sub_world1.jsonl" > "$L/sub_world1.log" 2>&1 || rc=1
  tail -2 "$L/sub_world1.log"
  for layout in "2x1:--replicas 2" "1x2:--replicas 1" "tp2:--tp 2" "tp2sp:--tp 2 --sp"; do
    name="${layout%%:*}"
    # shellcheck disable=SC2086
    run_pair "sub_$name" 45 "${run[@]}" ${layout#*:} --metrics-out "$L/sub_$name.jsonl" || rc=1
    tail -2 "$L/sub_${name}_rank0.log"
    cmp="$(compare_losses "$L/sub_world1.jsonl" "$L/sub_$name.jsonl" 1e-5)" || rc=1
    line+="$name: $cmp; "
  done
  # (llama_dump_logits: the tests' tool, train_llama's model from the same flags.)
  local dump=(--hf-dir "$L/tiny" --val-tokens "$L/tiny_val.bin" --seq 32 --threads 2)
  timeout 40 "$FSDP_GPU_BIN/llama_dump_logits" "$L/sub_whole.safetensors" 3 "${dump[@]}" \
    > "$L/sub_dump1.log" 2>&1 || rc=1
  run_pair sub_dump_tp2 45 "$FSDP_GPU_BIN/llama_dump_logits" "$L/sub_split.safetensors" 3 \
    "${dump[@]}" --tp 2 || rc=1
  local logits
  logits="$("$PYTHON" - "$L/sub_whole.safetensors" "$L/sub_split.safetensors" << 'EOF'
import sys
try:
    from safetensors.torch import load_file
    a, b = (load_file(p)["logits"] for p in sys.argv[1:])
except Exception as e:
    print(f"no logits to compare ({e})")
    sys.exit(1)
err = ((a - b).abs().max() / a.abs().max()).item()
print(f"tp2 logits {list(b.shape)}: rel diff {err:.1e}")
sys.exit(0 if a.shape == b.shape and err <= 1e-5 else 1)
EOF
)" || rc=1
  detail "vs world 1 (fp32, tolerance 1e-5): ${line}${logits}"
  return $rc
}

# LoRA on the GPU against PEFT under FSDP2, from the same initial adapters (hf_llama.py
# make-lora) on the same batches, world 1, fp32: the losses (1e-5).
stage_lora() {
  STAGE=lora
  make_tiny_llama || { detail "could not write the tiny model"; return 1; }
  "$PYTHON" "$ROOT/tests/reference/hf_llama.py" make-lora --hf-dir "$L/tiny" --out "$L/tiny_lora" \
    --rank 8 --alpha 16 --seed 3 || { detail "could not write the adapters"; return 1; }
  local common=(--hf-dir "$L/tiny" --data-tokens "$L/tiny_train.bin" --seq 32 --batch 8 --steps 6
    --lr 2e-2 --lora-adapter "$L/tiny_lora" --threads 2)
  local rc=0
  timeout 40 "$FSDP_GPU_BIN/train_llama" "${common[@]}" --lr-schedule constant --weight-decay 0.1 \
    --beta2 0.95 --metrics-out "$L/lora_cpp.jsonl" > "$L/lora_cpp.log" 2>&1 || rc=1
  tail -2 "$L/lora_cpp.log"
  (cd "$ROOT/bench/reference" && timeout 60 "$PYTHON" -m torch.distributed.run --standalone \
    --nproc_per_node 1 py_llama.py --mode fsdp2 --device "$PY_DEVICE" "${common[@]}") \
    > "$L/lora_peft.log" 2>&1 || rc=1
  tail -2 "$L/lora_peft.log"
  # py_llama prints "step N loss X": as a metrics file for compare_losses.
  sed -nE 's/^step ([0-9]+) loss ([^ ]+).*/{"step": \1, "loss": \2}/p' "$L/lora_peft.log" \
    > "$L/lora_peft.jsonl"
  local cmp
  cmp="$(compare_losses "$L/lora_peft.jsonl" "$L/lora_cpp.jsonl" 1e-5)" || rc=1
  detail "train_llama LoRA vs PEFT + FSDP2 (fp32, tolerance 1e-5): $cmp"
  return $rc
}

# Llama-3.2-1B's shape (random weights from transformers, written beside the initial weights:
# /dev/shm when it has room, else /tmp), or a tiny Llama on the CPU in a dry run, and 1 Mi
# random uint32 tokens in $L/NAME_tokens.bin. Sets the caller's locals dir, seq, batch, steps
# (bash's dynamic scope).
#   llama_1b_model NAME
llama_1b_model() {
  local size=(--vocab 128256 --hidden 2048 --layers 16 --heads 32 --kv-heads 8
    --intermediate 8192 --tied --rope-theta 500000 --max-position 131072 --init-std 0.02
    --rope-scaling '{"rope_type": "llama3", "factor": 32.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}')
  local vocab=128256
  dir="$(dirname "$GPU_CHECK_INIT")/fsdp_gpu_check_llama" seq=2048 batch=4 steps=6
  if [ "${GPU_CHECK_DRY_RUN:-0}" = 1 ]; then
    dir="$L/$1_dry" seq=64 batch=2 steps=4 vocab=70000
    size=(--vocab 70000 --hidden 64 --layers 2 --heads 4 --kv-heads 2 --intermediate 128 --tied
      --init-std 0.02)
  fi
  rm -rf "$dir"
  "$PYTHON" "$ROOT/tests/reference/hf_llama.py" make-tiny --out "$dir" "${size[@]}" --seed 1 \
    --device "$PY_DEVICE" || { detail "could not write the model"; return 1; }
  "$PYTHON" - "$L/$1_tokens.bin" "$vocab" << 'EOF'
import sys, numpy as np
np.random.default_rng(5).integers(0, int(sys.argv[2]), 1 << 20).astype("<u4").tofile(sys.argv[1])
EOF
}

# Llama-3.2-1B's shape (vocab 128256, hidden 2048, 16 layers, 32 heads, 8 KV heads, intermediate
# 8192, tied, Llama 3's rope scaling; random weights): train_llama against transformers'
# LlamaForCausalLM under FSDP2 from the same weights on the same batches, seq 2048, batch 4,
# bf16 compute with fp32 master weights and reduction, fused AdamW, no non-finite check, with
# and without activation checkpointing: tokens/s, MFU, peak allocated memory and the losses
# (bf16: within 1e-2). A dry run does the same at a tiny size on the CPU.
stage_llama() {
  STAGE=llama
  local dir seq batch steps
  llama_1b_model llama || return 1
  local common=(--hf-dir "$dir" --data-tokens "$L/llama_tokens.bin" --tokens-dtype uint32
    --seq "$seq" --batch "$batch" --steps "$steps" --lr 3e-4)
  local rc=0 ac tag
  for ac in "" "--activation-checkpointing"; do
    tag="${ac:+_ac}"
    # shellcheck disable=SC2086
    timeout 90 "$FSDP_GPU_BIN/train_llama" "${common[@]}" $ac --dtype bf16 --optimizer fused-adamw \
      --lr-schedule constant --weight-decay 0.1 --beta2 0.95 --nonfinite off \
      --metrics-out "$L/llama_cpp$tag.jsonl" > "$L/llama_cpp$tag.log" 2>&1 || rc=1
    tail -3 "$L/llama_cpp$tag.log"
    # shellcheck disable=SC2086
    (cd "$ROOT/bench/reference" && timeout 120 "$PYTHON" -m torch.distributed.run --standalone \
      --nproc_per_node 1 py_llama.py --mode fsdp2 --device "$PY_DEVICE" --dtype bf16 \
      "${common[@]}" $ac) > "$L/llama_fsdp2$tag.log" 2>&1 || rc=1
    tail -3 "$L/llama_fsdp2$tag.log"
  done
  rm -rf "$dir"
  "$PYTHON" - "$L" > "$L/llama.table" << 'EOF' || rc=1
import json, os, re, sys
L = sys.argv[1]
def read(name):
    p = os.path.join(L, name)
    return open(p).read() if os.path.exists(p) else ""
rows, worst = [], {}
for tag, label in (("", "no checkpointing"), ("_ac", "activation checkpointing")):
    cpp_log, py_log = read(f"llama_cpp{tag}.log"), read(f"llama_fsdp2{tag}.log")
    cpp = [json.loads(l) for l in read(f"llama_cpp{tag}.jsonl").splitlines() if l.strip()]
    py = [float(m.group(1)) for m in re.finditer(r"^step \d+ loss (\S+)", py_log, re.M)]
    tps = re.search(r"median ([0-9.]+) tok/s", cpp_log)
    mfu = re.search(r"MFU ([0-9.]+)%", cpp_log)
    res = dict(re.findall(r"(\w+)=([0-9.]+)", (re.findall(r"RESULT .*", py_log) or [""])[-1]))
    c = (float(tps.group(1)) if tps else 0.0, float(mfu.group(1)) if mfu else 0.0,
         max((r.get("peak_mem_bytes", 0) for r in cpp), default=0) / 2**20)
    p = (float(res.get("tokens_per_s", 0)), 100 * float(res.get("mfu", 0)),
         float(res.get("peak_mem_mb", 0)))
    losses = [r["loss"] for r in cpp if "loss" in r]
    worst[label] = max((abs(a - b) / abs(a) for a, b in zip(py, losses)), default=float("inf"))
    if len(py) != len(losses):
        worst[label] = float("inf")
    rows.append((f"train_llama, {label}", c, worst[label]))
    rows.append((f"transformers + FSDP2, {label}", p, None))
print(f"{'program':<48} {'tokens/s':>9} {'MFU':>6} {'peak alloc MiB':>15} {'loss rel diff':>14}")
for name, (t, m, mem), w in rows:
    print(f"{name:<48} {t:>9.0f} {m:>5.1f}% {mem:>15.0f} {'' if w is None else f'{w:.1e}':>14}")
def ratio(i, k):
    a, b = rows[i][1][k], rows[i + 1][1][k]
    return f"{a / b:.2f}x" if b > 0 else "?"
ok = all(w <= 1e-2 for w in worst.values())
line = (f"train_llama vs transformers + FSDP2: tok/s {ratio(0, 0)}, memory {ratio(0, 2)} "
        f"({rows[0][1][0]:.0f} vs {rows[1][1][0]:.0f} tok/s, MFU {rows[0][1][1]:.1f}% vs "
        f"{rows[1][1][1]:.1f}%); with checkpointing tok/s {ratio(2, 0)}, memory {ratio(2, 2)} | "
        f"losses worst rel diff {max(worst.values()):.1e} ({'within' if ok else 'NOT within'} 1e-2)")
open(os.path.join(L, "llama.detail"), "w").write(line + "\n")
sys.exit(0 if ok and all(r[1][0] > 0 for r in rows) else 1)
EOF
  cat "$L/llama.table"
  return $rc
}

# Faster than FSDP2 (issue 40), runnable alone (scripts/gpu_check.sh speed; not in the default
# set): Llama-3.2-1B's shape as the llama stage (seq 2048, batch 4, bf16 compute, fp32 master
# and reduction, fused AdamW, from the same random weights and batches), 6 steps each:
# train_llama plain, with --fused-loss, with --fused-loss --float8 (k and v projections left
# out: 2048 x 512 GEMMs gain nothing in float8), and with --fused-loss at batch 8 (the memory it
# saves spent on the batch); transformers + FSDP2 eager, with torchao's float8 (the same
# Linears), and with Liger-Kernel (its RMSNorm, RoPE, SwiGLU and fused linear cross-entropy).
# tokens/s, MFU, peak allocated memory, ratios against transformers + FSDP2 (and the fused
# loss's against Liger's), and each loss curve against its reference (bf16: within 1e-2; float8
# against torchao's float8; Liger's against transformers'). A dry run does the same at a tiny
# size on the CPU, without Liger (Triton needs a GPU).
stage_speed() {
  STAGE=speed
  local dir seq batch steps
  llama_1b_model speed || return 1
  local common=(--hf-dir "$dir" --data-tokens "$L/speed_tokens.bin" --tokens-dtype uint32
    --seq "$seq" --steps "$steps" --lr 3e-4)
  local rc=0 run name
  # Each run's limit (60 s here, 75 s for Python's) keeps the seven inside the stage's cap: the
  # first GPU run did such a run in about 20 s. The last: the memory the fused loss saves spent
  # on twice the batch (its losses are another batch's: not compared).
  for run in "cpp_plain:" "cpp_fused:--fused-loss" \
    "cpp_fused_float8:--fused-loss --float8 --float8-skip k_proj,v_proj" \
    "cpp_fused_batch2x:--fused-loss"; do
    name="${run%%:*}"
    local rows="$batch"
    [ "$name" = cpp_fused_batch2x ] && rows=$((2 * batch))
    # shellcheck disable=SC2086
    timeout 60 "$FSDP_GPU_BIN/train_llama" "${common[@]}" --batch "$rows" ${run#*:} --dtype bf16 \
      --optimizer fused-adamw --lr-schedule constant --weight-decay 0.1 --beta2 0.95 \
      --nonfinite off --metrics-out "$L/speed_$name.jsonl" > "$L/speed_$name.log" 2>&1 || rc=1
    tail -2 "$L/speed_$name.log"
  done
  for run in "py_plain:" "py_float8:--float8 --float8-skip k_proj,v_proj" "py_liger:--liger"; do
    name="${run%%:*}"
    if [ "$name" = py_liger ] && [ "$PY_DEVICE" != cuda ]; then  # Triton: a GPU only
      echo "SKIPPED: Liger-Kernel runs on a GPU only" > "$L/speed_$name.log"
      continue
    fi
    # shellcheck disable=SC2086
    (cd "$ROOT/bench/reference" && timeout 75 "$PYTHON" -m torch.distributed.run --standalone \
      --nproc_per_node 1 py_llama.py --mode fsdp2 --device "$PY_DEVICE" --dtype bf16 \
      "${common[@]}" --batch "$batch" ${run#*:}) > "$L/speed_$name.log" 2>&1 || rc=1
    tail -2 "$L/speed_$name.log"
  done
  rm -rf "$dir"
  "$PYTHON" - "$L" > "$L/speed.table" << 'PY' || rc=1
import json, os, re, sys
L = sys.argv[1]
def read(name):
    p = os.path.join(L, name)
    return open(p).read() if os.path.exists(p) else ""
def cpp(name):
    log = read(f"speed_{name}.log")
    rows = [json.loads(l) for l in read(f"speed_{name}.jsonl").splitlines() if l.strip()]
    tps, mfu = re.search(r"median ([0-9.]+) tok/s", log), re.search(r"MFU ([0-9.]+)%", log)
    return dict(tps=float(tps.group(1)) if tps else 0.0, mfu=float(mfu.group(1)) if mfu else 0.0,
                mem=max((r.get("peak_mem_bytes", 0) for r in rows), default=0) / 2**20,
                losses=[r["loss"] for r in rows if "loss" in r])
def py(name):
    log = read(f"speed_{name}.log")
    res = dict(re.findall(r"(\w+)=([0-9.]+)", (re.findall(r"RESULT .*", log) or [""])[-1]))
    return dict(tps=float(res.get("tokens_per_s", 0)), mfu=100 * float(res.get("mfu", 0)),
                mem=float(res.get("peak_mem_mb", 0)),
                losses=[float(m.group(1)) for m in re.finditer(r"^step \d+ loss (\S+)", log, re.M)])
skipped = "SKIPPED" in read("speed_py_liger.log")
runs = [("train_llama", cpp("cpp_plain"), "py_plain"),
        ("train_llama --fused-loss", cpp("cpp_fused"), "py_plain"),
        ("train_llama --fused-loss --float8", cpp("cpp_fused_float8"), "py_float8"),
        ("train_llama --fused-loss, batch x2", cpp("cpp_fused_batch2x"), None),
        ("transformers + FSDP2", py("py_plain"), None),
        ("transformers + torchao float8 + FSDP2", py("py_float8"), None),
        ("transformers + Liger-Kernel + FSDP2", py("py_liger"), "py_plain")]
ref = {"py_plain": runs[4][1], "py_float8": runs[5][1]}
base, liger = runs[4][1], runs[6][1]
def worst(a, b):
    if not a or len(a) != len(b):
        return float("inf")
    return max(abs(x - y) / abs(y) for x, y in zip(a, b))
def ratio(a, b):
    return f"{a / b:.2f}x" if b > 0 else "?"
print(f"{'program':<40} {'tokens/s':>9} {'vs FSDP2':>9} {'MFU':>6} {'peak MiB':>9} "
      f"{'vs FSDP2':>9} {'loss rel diff':>14}")
ok, errs = True, {}
for name, r, against in runs:
    if skipped and r is liger:
        print(f"{name:<40} skipped (a GPU only)")
        continue
    w = worst(r["losses"], ref[against]["losses"]) if against else None
    if w is not None:
        errs[name] = w
        ok = ok and w <= 1e-2
    ok = ok and r["tps"] > 0
    print(f"{name:<40} {r['tps']:>9.0f} {ratio(r['tps'], base['tps']):>9} {r['mfu']:>5.1f}% "
          f"{r['mem']:>9.0f} {ratio(r['mem'], base['mem']):>9} "
          f"{'' if w is None else f'{w:.1e}':>14}")
best, fused, big = runs[2][1], runs[1][1], runs[3][1]
against_liger = ("Liger not run (a GPU only)" if skipped else
                 f"{ratio(fused['tps'], liger['tps'])} Liger's (Liger {ratio(liger['tps'], base['tps'])} "
                 f"FSDP2's at {ratio(liger['mem'], base['mem'])})")
line = (f"fused+float8 {ratio(best['tps'], base['tps'])} FSDP2's tok/s at "
        f"{ratio(best['mem'], base['mem'])} its memory; fused {ratio(fused['tps'], base['tps'])} "
        f"at {ratio(fused['mem'], base['mem'])}, {against_liger}; "
        f"fused batch x2 {ratio(big['tps'], base['tps'])} at {ratio(big['mem'], base['mem'])}; "
        f"torchao float8 {ratio(runs[5][1]['tps'], base['tps'])} | losses worst rel diff "
        f"{max(errs.values()):.1e} ({'within' if ok else 'NOT within'} 1e-2)")
open(os.path.join(L, "speed.detail"), "w").write(line + "\n")
sys.exit(0 if ok else 1)
PY
  cat "$L/speed.table"
  return $rc
}
