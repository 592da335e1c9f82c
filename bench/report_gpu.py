"""The "GPU check" section of bench/RESULTS.md, from scripts/gpu_check.sh's summary.

A run on a GPU machine leaves summary.txt (and logs.tar.gz) in its output folder; copy the
summary to bench/results/gpu_check_summary.txt. Until one exists the section says so, and shows
the dry run on this machine's CPU (GPU_CHECK_DRY_RUN=1, bench/results/gpu_check_dry_run.txt),
which checks the script's stages and parsing, not the GPU.
"""
import os


def _block(path):
    return ["```", open(path).read().strip(), "```", ""]


def section(res):
    real = os.path.join(res, "gpu_check_summary.txt")
    dry = os.path.join(res, "gpu_check_dry_run.txt")
    lines = ["## GPU check (scripts/gpu_check.sh)", ""]
    if os.path.exists(real):
        lines += ["One H200, the programs prebuilt on the CPU machine (scripts/gpu_prebuild.sh); "
                  "each stage's one-line summary as the check printed it:", ""]
        lines += _block(real)
        return lines
    lines += ["Not run: no session so far was lent a GPU, so no CUDA or NCCL code of this "
              "project has run. The stages, in order: environment and NCCL version; the NCCL "
              "and CUDA tests under FSDP_REQUIRE_GPU=1 (a skip is a failure); a smoke run; the "
              "reference preset against PyTorch FSDP2 from the same weights (losses, tokens/s, "
              "MFU, peak memory, exposed communication); CPU offload (--offload all and "
              "optimizer against FSDP2's CPUOffloadPolicy); a profile; two NCCL ranks on the "
              "one GPU."]
    if os.path.exists(dry):
        lines += ["", "The dry run on this machine's CPU (GPU_CHECK_DRY_RUN=1: the cpu-small "
                  "preset, gloo instead of NCCL, CUDA tests allowed to skip), which checks the "
                  "script, not a GPU; its speeds are single runs on two busy cores, not "
                  "benchmarks:", ""]
        lines += _block(dry)
    else:
        lines += [""]
    return lines
