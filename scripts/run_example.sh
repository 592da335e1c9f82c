#!/usr/bin/env bash
# From a fresh machine to a finished MiniLLM run: installs what is missing, builds, and trains
# the cpu-small preset on 2 CPU ranks (MPI) on real text, printing the loss as it falls.
#   scripts/run_example.sh [extra train_minillm flags]      (BUILD_DIR overrides ./build)
# FSDP_EXAMPLE_PREBUILT=1 skips the install and the build (the build exists: README's check,
# scripts/readme_outputs.py, runs it so).
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
root="$FSDP_ROOT"
build="${BUILD_DIR:-$root/build}"

if [ "${FSDP_EXAMPLE_PREBUILT:-0}" != 1 ]; then
  bash "$root/scripts/install_deps.sh"
  cmake -S "$root" -B "$build" -DCMAKE_BUILD_TYPE=Release > /dev/null
  cmake --build "$build" -j "$(nproc)" --target train_minillm
fi

# Two ranks on two cores: one intra-op thread each, or they fight for the cores.
fsdp_one_thread
exec "${FSDP_MPIRUN[@]}" -np 2 "$build/bin/train_minillm" --preset cpu-small "$@"
