#!/usr/bin/env bash
# Run on a Debian machine before a GPU check: copies the header-only libraries (CLI11,
# nlohmann-json) and GoogleTest's sources from Debian's packages into .gpu_deps/ (git-ignored),
# because the GPU machine has no apt and no internet, and unpacks the safetensors, torchao and
# liger-kernel wheels for its Python 3.12 into .gpu_deps/python (the reference stage writes and
# reads the initial weights with safetensors; the speed stage's float8 reference is torchao's, and
# its fused-kernels reference transformers + Liger-Kernel, Triton kernels the image's triton 3.6
# runs; gpu_check.sh puts the folder on PYTHONPATH only when that python lacks one). Carry .gpu_deps
# with the device run, beside .gpu_bundle (scripts/gpu_prebuild.sh): scripts/gpu_check.sh builds
# there from the sources only with GPU_CHECK_BUILD=1. (fmt needs no copy: libtorch ships its
# headers.)
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
root="$FSDP_ROOT"
bash "$root/scripts/install_deps.sh"
deps="$root/.gpu_deps"
rm -rf "$deps"
mkdir -p "$deps/include"
cp -r /usr/include/CLI /usr/include/nlohmann "$deps/include/"
cp -r /usr/src/googletest "$deps/googletest"
venv="$FSDP_VENV"
fsdp_scratch
wheels="$tmp"
"$venv/bin/python" -m pip download --quiet --only-binary=:all: --no-deps --python-version 3.12 \
  --platform manylinux2014_x86_64 --dest "$wheels" safetensors
"$venv/bin/python" -m zipfile -e "$wheels"/safetensors-*.whl "$deps/python"
# torchao (the speed stage's float8 reference; its float8 training is Python over torch's ops).
"$venv/bin/python" -m pip download --quiet --only-binary=:all: --no-deps --python-version 3.12 \
  --platform manylinux_2_28_x86_64 --dest "$wheels" "torchao==0.18.0"
"$venv/bin/python" -m zipfile -e "$wheels"/torchao-*.whl "$deps/python"
# Liger-Kernel (pure Python and Triton; 0.8.5 patches transformers 5's Llama).
"$venv/bin/python" -m pip download --quiet --only-binary=:all: --no-deps --dest "$wheels" \
  "liger-kernel==0.8.5"
"$venv/bin/python" -m zipfile -e "$wheels"/liger_kernel-*.whl "$deps/python"
echo "gpu_bundle_deps: $(du -sh "$deps" | cut -f1) in $deps"
