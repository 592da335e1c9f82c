#!/usr/bin/env bash
# Builds the library and its tests with sanitizers and runs the tests of one process (thread
# ranks, the communication worker queue, the runtime, checkpoints, parsers):
#   scripts/sanitize.sh asan [ctest args]   AddressSanitizer + UndefinedBehaviorSanitizer
#   scripts/sanitize.sh tsan [ctest args]   ThreadSanitizer
# Build folders: build-asan/, build-tsan/ (BUILD_DIR overrides). libtorch itself is not
# instrumented: memory errors inside it and its own threads are out of reach; what runs in
# this project's code (and libtorch's inline headers) is checked. Multi-process tests (MPI,
# Gloo, trainer scripts) are left out: their sanitizer reports would interleave across ranks.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
root="$FSDP_ROOT"
kind="${1:-}"; shift || true
case "$kind" in
  asan) flags="-fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=undefined" ;;
  tsan) flags="-fsanitize=thread" ;;
  *) echo "usage: $0 asan|tsan [ctest args]" >&2; exit 2 ;;
esac
build="${BUILD_DIR:-$root/build-$kind}"
jobs="$(env -u OMP_NUM_THREADS -u OMP_THREAD_LIMIT nproc)"  # nproc honours OMP_NUM_THREADS
bash "$root/scripts/install_deps.sh"
cmake -S "$root" -B "$build" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DFSDP_BUILD_BENCH=OFF \
  -DFSDP_WITH_NCCL=OFF -DCMAKE_CXX_FLAGS="$flags" -DCMAKE_EXE_LINKER_FLAGS="$flags" \
  -DCMAKE_SHARED_LINKER_FLAGS="$flags"
cmake --build "$build" -j "$jobs"
fsdp_one_thread
# Leaks: libtorch's and Python's process-lifetime allocations are reported as leaks at exit.
# Errors end the test (halt_on_error) so that ctest counts them as failures.
export ASAN_OPTIONS="detect_leaks=0:halt_on_error=1:abort_on_error=1"
export UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1"
export TSAN_OPTIONS="halt_on_error=1:second_deadlock_stack=1:suppressions=$root/scripts/tsan.supp"
cd "$build"
# One-process tests only: the GoogleTest suites (label gtest; the ctest args narrow these) and
# the fuzz corpus replays. Both run; the status is a failure if either failed.
rc=0
ctest --output-on-failure -j "$jobs" --timeout 1800 -L '^gtest$' -E '^Nccl|Cuda' "$@" || rc=1
ctest --output-on-failure -j "$jobs" --timeout 900 -R '^fuzz_regress_' || rc=1
exit "$rc"
