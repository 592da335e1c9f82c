#!/usr/bin/env bash
# Run on a Debian machine before a GPU check: copies the header-only libraries (CLI11,
# nlohmann-json) and GoogleTest's sources from Debian's packages into .gpu_deps/ (git-ignored),
# because the GPU machine has no apt and no internet. Carry .gpu_deps with the device run, beside
# .gpu_bundle (scripts/gpu_prebuild.sh): scripts/gpu_check.sh builds there from these only when
# the prebuilt programs do not load. (fmt needs no copy: libtorch ships its headers.)
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
bash "$root/scripts/install_deps.sh"
deps="$root/.gpu_deps"
rm -rf "$deps"
mkdir -p "$deps/include"
cp -r /usr/include/CLI /usr/include/nlohmann "$deps/include/"
cp -r /usr/src/googletest "$deps/googletest"
echo "gpu_bundle_deps: $(du -sh "$deps" | cut -f1) in $deps"
