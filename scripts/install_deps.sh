#!/usr/bin/env bash
# Installs, with apt-get, only the Debian packages this project needs that are missing.
# Idempotent: a second run installs nothing and prints one line.
set -euo pipefail

packages=(
  g++ cmake make pkg-config
  libtorch-dev          # libtorch 1.13 (CPU) with c10d's TCPStore and ProcessGroupGloo
  libgloo-dev           # headers for the libgloo that Debian's libtorch links
  libopenblas0-pthread  # without it libtorch uses the reference BLAS: ~15x slower training step
  libopenmpi-dev openmpi-bin
  libfmt-dev libgtest-dev libgmock-dev
  libcli11-dev          # command-line parsing for the examples and benchmarks
  nlohmann-json3-dev    # JSON lines for metrics
  python3-torch         # PyTorch reference for bench/, and the torchrun agent-store test
)

missing=()
for p in "${packages[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done

if [ ${#missing[@]} -eq 0 ]; then
  echo "install_deps: all ${#packages[@]} packages present"
  exit 0
fi

sudo=""
if [ "$(id -u)" -ne 0 ]; then sudo="sudo"; fi
echo "install_deps: installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
# A fresh machine has no package lists; update only when a package cannot be found.
if ! $sudo apt-get install -y -q "${missing[@]}" >/tmp/fsdp_apt.log 2>&1; then
  echo "install_deps: package not found in current lists, running apt-get update"
  $sudo apt-get update -q >>/tmp/fsdp_apt.log 2>&1
  $sudo apt-get install -y -q "${missing[@]}" >>/tmp/fsdp_apt.log 2>&1 || {
    echo "install_deps: apt-get install failed; see /tmp/fsdp_apt.log" >&2
    tail -20 /tmp/fsdp_apt.log >&2
    exit 1
  }
fi
echo "install_deps: done"
