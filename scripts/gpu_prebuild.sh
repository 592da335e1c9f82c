#!/usr/bin/env bash
# Run here (Debian, no GPU needed) before a GPU check: builds what scripts/gpu_check.sh runs
# (the library, the trainer, the CUDA tests, the two-rank and GPU-fault programs, the kernels
# benchmark) against this machine's libtorch 2.11 wheel, stripped, into .gpu_bundle/
# (git-ignored), which travels with the working tree to the GPU machine (carry .gpu_bundle; the
# device tool moves 64 MiB at most).
#
# The GPU machine has the same wheels (torch 2.11.0+cu130, nvidia-nccl-cu13) in another place:
# its python3 is /opt/torch/.venv (Python 3.12). The binaries' run path names that place
# ($GPU_SITE_PACKAGES), and gpu_check.sh also sets LD_LIBRARY_PATH from the python3 it finds, so
# either way they load that machine's libtorch, CUDA runtime and NCCL (one libnccl.so.2 per
# process: the wheel's, which libtorch_cuda loads too). Without MPI (none there).
#
# Built without the text library (-DFSDP_WITH_TEXT=OFF: the tokenizer and chat templates, whose
# PCRE2 and utf8proc the GPU image lacks; the first GPU run did not load when they were part of
# the models), so the programs need nothing beyond the wheels: the check resolves every library
# they need against the bundle, the wheels and an allow-list, never against this machine's
# system folders (scripts/gpu_bundle_libs.py), and fails if anything else is needed.
#
#   scripts/gpu_prebuild.sh            # build, strip, copy, check
#   scripts/gpu_prebuild.sh --check    # only the check of an existing bundle
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
root="$FSDP_ROOT"
build="$root/build-gpu-bundle"
bundle="$root/.gpu_bundle"
gpu_site="${GPU_SITE_PACKAGES:-/opt/torch/.venv/lib/python3.12/site-packages}"
venv="$FSDP_VENV"
jobs="${JOBS:-2}"
programs=(train_minillm train_llama llama_dump_logits test_cuda nccl_two_ranks nccl_gpu_fault
  failing_rank kernels_bench)

# The wheels' library folders under a site-packages folder, as a search path.
wheel_path() {
  echo "$1/torch/lib:$1/nvidia/nccl/lib:$1/nvidia/cu13/lib:$1/nvidia/cudnn/lib"
}

check_bundle() {
  local site
  site="$("$venv/bin/python" -c 'import site; print(site.getsitepackages()[0])')"
  local bad=0
  echo "== every NEEDED library in the bundle, a wheel or the allow-list (not this machine's)"
  "$venv/bin/python" "$root/scripts/gpu_bundle_libs.py" --bundle "$bundle" --site "$site" || bad=1
  echo "== ldd with this machine's wheels in LD_LIBRARY_PATH (as gpu_check.sh sets it)"
  for f in "$bundle"/bin/* "$bundle"/lib/*.so*; do
    local out
    out="$(env -u LD_LIBRARY_PATH LD_LIBRARY_PATH="$(wheel_path "$site")" ldd "$f")"
    if grep -q "not found" <<< "$out"; then
      echo "$f:"; grep "not found" <<< "$out"; bad=1
    fi
    # Nothing may come from this machine's CUDA toolkit or from a build tree.
    if grep -E "=> (/usr/local/cuda|$root/build)" <<< "$out"; then bad=1; fi
  done
  env LD_LIBRARY_PATH="$(wheel_path "$site")" ldd "$bundle/bin/train_minillm" |
    grep -E "fsdp|torch_cuda|nccl|cudart|c10" | sed 's/^/  /'
  # libtorch_cuda must be a NEEDED entry of libfsdp: a linker with --as-needed drops it when no
  # symbol of it is referenced, and then CUDA is never registered in the process: every CUDA test
  # skips and the trainer runs on the CPU, silently.
  local lib headers
  lib="$(ls "$bundle"/lib/libfsdp.so* | head -1)"
  # Read whole before the match: `objdump | grep -q` under pipefail fails when grep stops early
  # (objdump gets SIGPIPE), which called a good bundle bad.
  headers="$(objdump -p "$lib")"
  if grep -q "NEEDED.*libtorch_cuda.so" <<< "$headers"; then
    echo "== $(basename "$lib") needs libtorch_cuda.so"
  else
    echo "== $(basename "$lib") does NOT need libtorch_cuda.so (CUDA would not load there)"
    bad=1
  fi
  # The device tool carries 64 MiB at most, .gpu_bundle and .gpu_deps together.
  local bytes
  local carried=("$bundle")
  [ -d "$root/.gpu_deps" ] && carried+=("$root/.gpu_deps")
  bytes="$(du -scb "${carried[@]}" | tail -1 | cut -f1)"
  echo "== carried: $((bytes / 1048576)) MiB (.gpu_bundle + .gpu_deps) of at most 64 MiB"
  [ "$bytes" -le $((64 * 1048576)) ] || bad=1
  echo "== --help and the test list"
  local help cases
  help="$(env LD_LIBRARY_PATH="$(wheel_path "$site")" "$bundle/bin/train_minillm" --help)" || bad=1
  echo "  ${help%%$'\n'*}"
  cases="$(env LD_LIBRARY_PATH="$(wheel_path "$site")" "$bundle/bin/test_cuda" --gtest_list_tests)" ||
    bad=1
  echo "  test_cuda cases: $(grep -c "^  " <<< "$cases")"
  # The run path alone, as on the GPU machine when LD_LIBRARY_PATH is not set: in a private
  # mount namespace (root), /opt holds only the GPU machine's venv path, pointing at this venv.
  if [ "$(id -u)" = 0 ] && [[ "$gpu_site" == /opt/* ]] && unshare -m true 2> /dev/null; then
    echo "== run path only: $gpu_site -> $site (private mount namespace)"
    unshare -m bash -c '
      set -e
      mount -t tmpfs none /opt
      mkdir -p "$(dirname "$1")" && ln -s "$2" "$1"
      ldd "$3/bin/train_minillm" | grep -E "not found|fsdp|torch_cuda|nccl|cudart" | sed "s/^/  /"
      ! ldd "$3"/bin/* "$3"/lib/*.so* | grep -q "not found"
      env -u LD_LIBRARY_PATH "$3/bin/train_minillm" --help > /dev/null
      env -u LD_LIBRARY_PATH "$3/bin/test_cuda" > /tmp/gpu_prebuild_test_cuda.log 2>&1
      echo "  train_minillm --help: ok; test_cuda: $(grep -E "(PASSED|SKIPPED) +\] [0-9]+ test" \
        /tmp/gpu_prebuild_test_cuda.log | tr "\n" " ")"
    ' _ "$gpu_site" "$site" "$bundle" || bad=1
  fi
  echo "== glibc and libstdc++ versions the binaries need (the GPU image: Ubuntu 24.04's python)"
  local versions
  versions="$(objdump -T "$bundle"/bin/* "$bundle"/lib/*.so* 2> /dev/null |
    grep -oE "(GLIBC|GLIBCXX|CXXABI)_[0-9.]+" | sort -u)"
  for v in GLIBC GLIBCXX CXXABI; do
    echo "  newest $v: $(grep "^${v}_" <<< "$versions" | sort -t_ -k2 -V | tail -1)"
  done
  return $bad
}

if [ "${1:-}" = "--check" ]; then
  check_bundle
  exit $?
fi

torch_prefix="$("$venv/bin/python" -c 'import torch; print(torch.utils.cmake_prefix_path)')"
rpath="\$ORIGIN/../lib:$(wheel_path "$gpu_site")"
# The run path is the GPU machine's from the start (BUILD_WITH_INSTALL_RPATH): these binaries
# are not run here except through check_bundle. GoogleTest's discovery waits for ctest (it would
# run the binaries at build time).
cmake -S "$root" -B "$build" -DCMAKE_BUILD_TYPE=Release -DCMAKE_PREFIX_PATH="$torch_prefix" \
  -DFSDP_WITH_MPI=OFF -DFSDP_WITH_GLOO=ON -DFSDP_WITH_NCCL=ON -DFSDP_BUILD_BENCH=ON \
  -DFSDP_WITH_TEXT=OFF \
  -DFSDP_WARNINGS_AS_ERRORS=ON -DCMAKE_CUDA_ARCHITECTURES=90 \
  -DCMAKE_BUILD_WITH_INSTALL_RPATH=ON -DCMAKE_INSTALL_RPATH="$rpath" \
  -DCMAKE_GTEST_DISCOVER_TESTS_DISCOVERY_MODE=PRE_TEST > /tmp/gpu_prebuild_configure.log 2>&1 ||
  { tail -20 /tmp/gpu_prebuild_configure.log; exit 1; }
cmake --build "$build" -j "$jobs" --target "${programs[@]}"

rm -rf "$bundle"
mkdir -p "$bundle/bin" "$bundle/lib"
for p in "${programs[@]}"; do cp "$build/bin/$p" "$bundle/bin/"; done
# The libraries under their sonames (what the programs ask for).
for l in fsdp fsdp_models; do
  so="$(readlink -f "$build/lib/lib$l.so")"
  soname="$(objdump -p "$so" | awk '/SONAME/ {print $2}')"
  cp "$so" "$bundle/lib/$soname"
done
strip --strip-unneeded "$bundle"/bin/* "$bundle"/lib/*
{
  echo "commit $(git -C "$root" rev-parse HEAD)$(git -C "$root" diff HEAD --quiet || echo ' (with changes)')"
  echo "built $(date -u +%FT%TZ) on $(uname -n) against torch $("$venv/bin/python" -c 'import torch; print(torch.__version__)')"
  echo "run path $rpath"
  (cd "$bundle" && find bin lib -type f -exec ls -l {} + | awk '{print $5, $9}')
} > "$bundle/MANIFEST.txt"
du -sh "$bundle"
check_bundle
