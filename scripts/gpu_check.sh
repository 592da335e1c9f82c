#!/usr/bin/env bash
# The staged GPU check, for a machine with one H200, 16 cores, PyTorch 2.11.0+cu130 in its
# python3 and no internet, lent for 15 minutes in all: stages in order of value, each under its
# own timeout and all under one deadline (GPU_CHECK_BUDGET_S, default 480 s: 8 minutes), so that
# a rerun fits. A subset of stages runs alone (below): split the stages over two calls where one
# call's limit is tighter than the whole.
#
# Prepare here: scripts/gpu_prebuild.sh (.gpu_bundle: the programs, built against the same
# wheels, at most 64 MiB) and scripts/gpu_bundle_deps.sh (.gpu_deps: the safetensors wheel the
# reference stage imports, and the sources a build there needs). Carry both. Then, on the GPU
# machine:
#
#   scripts/gpu_check.sh                       # every stage
#   scripts/gpu_check.sh reference,two_ranks   # only these (env always runs first)
#
# Every stage after env runs with FSDP_REQUIRE_GPU=1: a CUDA test that would skip (no CUDA in
# the process: libtorch_cuda not loaded, a driver too old for the wheel) fails instead, and the
# trainer refuses to fall back to the CPU.
#
# Stages (timeout cap in seconds; a stage never runs past the deadline):
#   env         90  nvidia-smi, torch/CUDA/NCCL versions, /dev/shm, whether the bundle loads (a
#                   cold libtorch_cuda load alone can take tens of seconds)
#   build      300  only with GPU_CHECK_BUILD=1 (the wheel brings no CUDA compiler: the machine
#                   must have one): the same targets, built there with -DCMAKE_CUDA_ARCHITECTURES=90
#   nccl       150  NCCL group tests (NCCL_DEBUG=INFO); a GPU fault (a device-side assert) named
#                   as such at world 1, and at world 2 (two ranks sharing the GPU: the faulting
#                   rank names it, its peer fails within the timeout; seconds printed for each);
#                   a rank leaving on an error with an all-reduce in flight that its peer has
#                   not reached: its group aborts instead of waiting (timeout 30 s), so it
#                   reports its error within 15 s and exits 1
#   cuda_tests 120  the CUDA gtests: fully_shard against plain libtorch (fp32, bf16, bf16 with
#                   every collective delayed 20 ms), bf16 reduction bytes, CPU and optimizer-state
#                   offload, fake worlds 4 and 8; a test that crashes does not take the rest
#                   with it (scripts/gtest_isolated.py)
#   kernels     60  bench/kernels_bench at Llama-3.2-1B's shapes (8,192 tokens, bf16): each fused
#                   op's CUDA kernels (RMSNorm, residual + RMSNorm, SwiGLU, rotary embedding,
#                   float8 cast) against the ATen formula they replace, forward + backward,
#                   float8_linear against the bf16 linear at the layer's Linear shapes, and the
#                   fused linear cross-entropy against the unfused head + loss: ms, ratios
#   smoke       45  the trainer, 5 steps, bf16 (cpu-small sizes on the GPU)
#   two_ranks  100  two NCCL ranks sharing the one GPU (a host id each, sockets, P2P and SHM
#                   off): every collective at world 2, splits, fully_shard parity, HSDP; then
#                   the trainer at world 2 against world 1
#   subgroups  150  the Llama trainer on two such ranks: HSDP 2 replicas x 1 shard and 1 x 2,
#                   tensor parallelism dp 1 x tp 2 with and without --sp, each against world 1
#                   (fp32 losses, 1e-5), and tp 2's logits against world 1's (1e-5)
#   lora        70  LoRA in train_llama against PEFT under FSDP2 from the same adapters (fp32
#                   losses, 1e-5)
#   llama      300  Llama-3.2-1B's shape (random weights from transformers, seq 2048, batch 4,
#                   bf16 compute, fp32 master and reduction, fused AdamW, --nonfinite off):
#                   train_llama against transformers' LlamaForCausalLM under FSDP2 from the same
#                   weights and batches, with and without activation checkpointing: tokens/s,
#                   MFU, peak allocated memory, losses (bf16: within 1e-2)
#   reference  170  the reference preset (vocab 32000, dim 2048, 12 layers, 16 heads, 8 x 1024
#                   tokens, bf16 compute / fp32 reduce), fsdp-cpp and PyTorch FSDP2 from the same
#                   initial weights (in /dev/shm), 20 steps each: losses side by side (bf16:
#                   within 1e-2), tokens/s, MFU of 989 TFLOP/s, peak allocated memory, exposed
#                   communication. Both sides measure the same step: zero_grad, forward,
#                   backward, AdamW (fused) between two device synchronisations, no gradient
#                   clipping and no non-finite check (fsdp-cpp runs with --nonfinite off; its
#                   default adds a norm, an all-reduce and a host sync per step); the median of
#                   steps 2 onwards. fsdp-cpp runs its kernels (MiniLLM's norms and batch-first
#                   attention; minillm_speed times it without them too).
#   offload    200  the reference preset, 6 steps each: fsdp-cpp --offload all (FSDP2's CPU
#                   offload), --offload optimizer, and FSDP2 with CPUOffloadPolicy: tokens/s and
#                   peak device memory beside the reference stage's figures without offload, and
#                   the losses against the run without offload (bf16: within 1e-2)
#   profile     45  optional: one profiled step of the reference preset (CUPTI kernel table)
#   minillm_speed 360  only when named: train_minillm --fused-loss --float8, and with
#                   --float8-attention (the reference preset, bf16, 20 steps), against FSDP2's
#                   plain run (the reference stage's, or run here): tok/s ratios (issue 40's
#                   target 1.15x), peak memory, losses; the plain run with fsdp's kernels
#                   against FSDP_CUDA_KERNELS=0
#   speed      480  only when named (scripts/gpu_check.sh speed): Llama-3.2-1B's shape, 6
#                   steps each: train_llama plain, --fused-loss, --fused-loss --float8 (k, v
#                   left out), --fused-loss at twice the batch, against transformers + FSDP2
#                   eager, with torchao's float8 and with Liger-Kernel: tokens/s, MFU, peak
#                   memory, ratios, losses against the matching reference
# Optional stages run only when at least their cap is left before the deadline.
#
# Output (in $OUT, else gpu_check_out/): summary.txt, one line per stage as it ends, and
# logs.tar.gz, every log (rewritten after each stage, so a run cut short still leaves both).
# Exit status 0 when every stage that ran passed.
#
# GPU_CHECK_DRY_RUN=1 runs the same stages here, on the CPU, to check the script itself: the
# cpu-small preset instead of the reference one, no FSDP_REQUIRE_GPU (the CUDA tests then skip,
# and the summary says so), FSDP2 on gloo.
set -uo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
root="$FSDP_ROOT"
self="$root/scripts/gpu_check.sh"

if [ "${1:-}" = "--body" ]; then
  # One stage's body, run by the driver below under `timeout` with the environment it set up.
  source "$root/scripts/gpu_check_stages.sh"
  "stage_$2"
  exit $?
fi

out="${OUT:-$root/gpu_check_out}"
mkdir -p "$out"
export GPU_CHECK_LOGS="${GPU_CHECK_LOGS:-$(mktemp -d /tmp/gpu_check_logs.XXXXXX)}"
export GPU_CHECK_ROOT="$root" PYTHON="${PYTHON:-python3}"
summary="$out/summary.txt"
budget="${GPU_CHECK_BUDGET_S:-480}"
start=$(date +%s)
failed=()
all_stages="env,build,nccl,cuda_tests,kernels,smoke,two_ranks,subgroups,lora,llama,reference,offload,profile"
wanted=",env,build,${1:-$all_stages},"
# speed and minillm_speed (issue 40's comparisons) run only when named: speed alone takes most
# of a call.
all_stages="$all_stages,speed,minillm_speed"

cap_of() {
  case "$1" in
    env) echo 90 ;; build) echo 300 ;; nccl) echo 150 ;; cuda_tests) echo 120 ;; kernels) echo 60 ;;
    smoke) echo 45 ;; two_ranks) echo 100 ;; subgroups) echo 150 ;; lora) echo 70 ;;
    llama) echo 300 ;; reference) echo 170 ;; offload) echo 200 ;; profile) echo 45 ;;
    speed) echo 480 ;; minillm_speed) echo 360 ;;
  esac
}
optional() { [ "$1" = profile ]; }

archive() { tar -czf "$out/logs.tar.gz" -C "$GPU_CHECK_LOGS" . 2> /dev/null; }

record() {  # stage status seconds detail
  printf '%-11s %-8s %4ss  %s\n' "$1" "$2" "$3" "$4" | tee -a "$summary"
  archive
}

# After env, no CUDA test may skip and the trainer may not fall back to the CPU.
[ "${GPU_CHECK_DRY_RUN:-0}" = 1 ] || export FSDP_REQUIRE_GPU=1
# The checkout's HEAD, and the bundle's own record (a device copy of the tree can carry another
# HEAD than the one the bundle was built from).
bundle_commit="$(sed -n '1s/^commit \([0-9a-f]\{7\}\)[0-9a-f]*/\1/p' "$root/.gpu_bundle/MANIFEST.txt" 2> /dev/null)"
echo "gpu_check $(date -u +%FT%TZ) commit $(git -C "$root" rev-parse --short HEAD 2> /dev/null)" \
  "${bundle_commit:+bundle $bundle_commit}" \
  "budget ${budget}s stages ${1:-all}$([ "${GPU_CHECK_DRY_RUN:-0}" = 1 ] && echo " DRY RUN (CPU)")" |
  tee "$summary"
for name in ${all_stages//,/ }; do
  [[ "$wanted" == *",$name,"* ]] || continue
  now=$(date +%s)
  left=$((budget - (now - start)))
  cap=$(cap_of "$name")
  if [ "$name" = build ] && [ "${GPU_CHECK_BUILD:-0}" != 1 ]; then
    if [ -f "$GPU_CHECK_LOGS/bundle_ok" ]; then
      record build skipped 0 "the prebuilt .gpu_bundle loads"
    elif [ "${GPU_CHECK_DRY_RUN:-0}" = 1 ] && [ -x "$root/build/bin/train_llama" ]; then
      record build skipped 0 "dry run: this checkout's build/bin"
    else
      # Building there needs a CUDA compiler the wheel does not bring: opt-in only.
      record build skipped 0 "the bundle does not load; GPU_CHECK_BUILD=1 builds there (needs nvcc)"
      failed+=(build)
    fi
    continue
  fi
  if [ "$name" != env ] && [[ " ${failed[*]:-} " == *" env "* ]]; then
    record "$name" skipped 0 "the env stage failed: nothing to run with"
    continue
  fi
  if [ "$left" -le 5 ] || { optional "$name" && [ "$left" -lt "$cap" ]; }; then
    record "$name" skipped 0 "${left}s left before the deadline"
    continue
  fi
  limit=$((cap < left ? cap : left))
  t0=$(date +%s)
  timeout -k 10 "$limit" "$self" --body "$name" > "$GPU_CHECK_LOGS/$name.log" 2>&1
  rc=$?
  secs=$(($(date +%s) - t0))
  status=ok
  [ "$rc" -ne 0 ] && status="rc=$rc"
  [ "$rc" -eq 124 ] || [ "$rc" -eq 137 ] && status="timeout"
  detail="$(cat "$GPU_CHECK_LOGS/$name.detail" 2> /dev/null || tail -1 "$GPU_CHECK_LOGS/$name.log")"
  record "$name" "$status" "$secs" "$detail (cap ${limit}s)"
  [ "$status" = ok ] || failed+=("$name")
  # env hands its findings (where the programs are, the library path) to the later stages.
  [ -f "$GPU_CHECK_LOGS/env.sh" ] && source "$GPU_CHECK_LOGS/env.sh"
  [ -f "$GPU_CHECK_LOGS/$name.table" ] && cat "$GPU_CHECK_LOGS/$name.table"
done
rm -rf /dev/shm/fsdp_gpu_check_init.safetensors /tmp/fsdp_gpu_check_init.safetensors \
  /dev/shm/fsdp_gpu_check_llama /tmp/fsdp_gpu_check_llama
echo "total $(($(date +%s) - start))s of ${budget}s; failed: ${failed[*]:-none}" | tee -a "$summary"
archive
[ ${#failed[@]} -eq 0 ]
