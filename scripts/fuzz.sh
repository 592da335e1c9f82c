#!/usr/bin/env bash
# Builds the fuzz targets with clang under libFuzzer, AddressSanitizer and UBSan (the whole
# library instrumented, in build-fuzz/) and runs each for SECONDS (default 600), starting
# from the seeds kept in fuzz/corpus/<target>/ plus what earlier runs found
# (build-fuzz/corpus/<target>/, which grows from run to run and is not committed).
# A crash leaves its input in build-fuzz/crashes/<target>/ and fails the script; fix it and
# copy the input into fuzz/corpus/<target>/, where ctest's fuzz_regress_<target> replays it
# from then on.
#   scripts/fuzz.sh [--seconds S] [--jobs J] [TARGET...]   (targets: launch_env trainer_flags
#                                                           manifest safetensors; default all)
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
root="$FSDP_ROOT"
build="${BUILD_DIR:-$root/build-fuzz}"
seconds=600
jobs=1
targets=()
while [ $# -gt 0 ]; do
  case "$1" in
    --seconds) seconds="$2"; shift 2 ;;
    --jobs) jobs="$2"; shift 2 ;;
    -h|--help) sed -n 2,9p "$0"; exit 0 ;;
    *) targets+=("$1"); shift ;;
  esac
done
[ ${#targets[@]} -gt 0 ] || targets=(launch_env trainer_flags manifest safetensors)
command -v clang++ > /dev/null || { echo "fuzz.sh: needs clang++ (apt-get install clang)" >&2; exit 2; }
bash "$root/scripts/install_deps.sh"
flags="-fsanitize=fuzzer-no-link,address,undefined -fno-omit-frame-pointer"
cmake -S "$root" -B "$build" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_C_COMPILER=clang \
  -DCMAKE_CXX_COMPILER=clang++ -DFSDP_FUZZ=ON -DFSDP_BUILD_TESTS=OFF -DFSDP_BUILD_BENCH=OFF \
  -DFSDP_BUILD_EXAMPLES=OFF -DFSDP_WITH_NCCL=OFF -DCMAKE_CXX_FLAGS="$flags" \
  -DCMAKE_SHARED_LINKER_FLAGS="-fsanitize=address,undefined" \
  -DCMAKE_EXE_LINKER_FLAGS="-fsanitize=address,undefined"
cmake --build "$build" -j "$(nproc)" --target $(printf 'fuzz_%s ' "${targets[@]}")
export ASAN_OPTIONS="detect_leaks=0:abort_on_error=1" UBSAN_OPTIONS="halt_on_error=1:print_stacktrace=1"
fsdp_one_thread
status=0
for t in "${targets[@]}"; do
  corpus="$root/fuzz/corpus/$t"
  work="$build/corpus/$t"; crashes="$build/crashes/$t"
  mkdir -p "$work" "$crashes"
  cp -n "$corpus"/* "$work"/ 2>/dev/null || true
  echo "== fuzz_$t: $seconds s"
  parallel=()
  [ "$jobs" -gt 1 ] && parallel=(-jobs="$jobs" -workers="$jobs")
  # From the build folder: libFuzzer writes its per-job logs into the working directory.
  (cd "$build" && "$build/bin/fuzz_$t" "$work" -max_total_time="$seconds" "${parallel[@]}" \
    -artifact_prefix="$crashes/" -max_len=4096 -print_final_stats=1 2>&1 |
    tee "$build/fuzz_$t.log" | grep -E "DONE|ERROR|SUMMARY|stat::|Done") || true
  found=$(find "$crashes" -type f | wc -l)
  if [ "$found" -gt 0 ]; then
    echo "fuzz_$t: $found crashing inputs in $crashes"; status=1
  fi
  echo "fuzz_$t: working corpus $(ls "$work" | wc -l) inputs"
done
exit "$status"
