#!/usr/bin/env bash
# Installs what is missing, configures, builds and runs every test.
#   scripts/test.sh [extra ctest args]      (BUILD_DIR overrides ./build)
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
root="$FSDP_ROOT"
build="${BUILD_DIR:-$root/build}"
# The cores, read before OMP_NUM_THREADS is set below: nproc honours OMP_NUM_THREADS, and with
# it set to 1 ctest ran every test one after another.
jobs="$(env -u OMP_NUM_THREADS -u OMP_THREAD_LIMIT nproc)"

# Where the time went, printed last (also when a step fails): CI's 15-minute budget is spent in
# these four, and a fresh machine differs from a warm one mostly in the first and the third.
phases=""
phase_start=$SECONDS
phase() {  # phase NAME: the step that just ended
  phases+="$1 $((SECONDS - phase_start)) s, "
  phase_start=$SECONDS
}
fsdp_on_exit 'echo "test.sh: ${phases}total $SECONDS s"'

bash "$root/scripts/install_deps.sh"
phase install
# install_deps.sh provides MPI and Gloo: require them, so a broken install fails here instead
# of silently skipping their tests. NCCL is required where the CUDA toolkit with NCCL is present
# (these CPU machines have it), so the GPU code is compiled and linked on every run.
engines=(-DFSDP_WITH_MPI=ON -DFSDP_WITH_GLOO=ON)
if [ -f /usr/local/cuda/include/nccl.h ]; then engines+=(-DFSDP_WITH_NCCL=ON); fi
cmake -S "$root" -B "$build" -DCMAKE_BUILD_TYPE=Release -DFSDP_WARNINGS_AS_ERRORS=ON "${engines[@]}"
phase configure
cmake --build "$build" -j "$jobs"
phase build
# One intra-op thread per rank: several ranks share two cores in the multi-rank tests.
fsdp_one_thread
cd "$build"
rc=0
ctest --output-on-failure -j "$jobs" --timeout 600 "$@" || rc=$?
phase ctest
exit "$rc"
