#!/usr/bin/env bash
# scripts/gpu_bundle_libs.py against this build, with bundles laid out as scripts/gpu_prebuild.sh
# lays them out (programs in bin/, libraries in lib/ under their sonames).
#  1. libfsdp and libfsdp_models need nothing beyond the wheels and the allow-list (but MPI,
#     which this build may have and the GPU bundle's has not).
#  2. With the text library (libfsdp_text, and train_llama linking it), what failed to load on
#     the first GPU run (main at fa07643, when the tokenizer was inside libfsdp_models): the
#     check must fail and name PCRE2 and utf8proc, although this machine has them; with --carry
#     it must pass and the bundle must hold them.
#   gpu_bundle_libs_check.sh PYTHON LIBFSDP LIBFSDP_MODELS [TRAIN_LLAMA LIBFSDP_TEXT]
set -uo pipefail
py="$1" libfsdp="$2" libmodels="$3" program="${4:-}" libtext="${5:-}"
source "$(dirname "${BASH_SOURCE[0]}")/../../scripts/lib.sh"
root="$FSDP_ROOT"
fsdp_scratch
site="$("$py" -c 'import os, torch; print(os.path.dirname(os.path.dirname(torch.__file__)))')"
check() { "$py" "$root/scripts/gpu_bundle_libs.py" --bundle "$1" --site "$site" "${@:2}"; }
add_lib() {  # add_lib BUNDLE SO
  local real; real="$(readlink -f "$2")"
  cp "$real" "$1/lib/$(objdump -p "$real" | awk '/SONAME/ {print $2}')"
}
fail=0

mkdir -p "$tmp/core/bin" "$tmp/core/lib"
add_lib "$tmp/core" "$libfsdp"
add_lib "$tmp/core" "$libmodels"
# This build may link MPI (the GPU bundle is built without it): libfsdp's MPI libraries are the
# only names the check may call missing here.
check "$tmp/core" > "$tmp/core.log" 2>&1
if grep "^MISSING" "$tmp/core.log" | grep -v "^MISSING on the GPU machine: libmpi[^ ]* (needed by lib/libfsdp.so.0)"; then
  echo "FAILED: libfsdp or libfsdp_models needs a library the GPU machine lacks"; fail=1
else
  echo "the library and the models need nothing beyond the wheels and the allow-list (MPI aside)"
fi
if objdump -p "$libmodels" | grep -E "NEEDED.*lib(pcre2|utf8proc|fsdp_text)"; then
  echo "FAILED: libfsdp_models needs the text library or its dependencies"; fail=1
fi

if [ -z "$libtext" ]; then
  echo "(no text library in this build: part 2 skipped)"
  exit $fail
fi
mkdir -p "$tmp/bundle/bin" "$tmp/bundle/lib"
cp "$program" "$tmp/bundle/bin/"
for so in "$libfsdp" "$libmodels" "$libtext"; do add_lib "$tmp/bundle" "$so"; done
expected="$(for f in "$tmp"/bundle/bin/* "$tmp"/bundle/lib/*; do objdump -p "$f"; done |
  awk '/NEEDED/ {print $2}' | grep -E '^lib(pcre2|utf8proc)' | sort -u)"
[ -n "$expected" ] || { echo "FAILED: the text library needs neither PCRE2 nor utf8proc: update this test"; exit 1; }
if check "$tmp/bundle" > "$tmp/check.log" 2>&1; then
  echo "FAILED: the check passed a bundle without $(echo $expected)"; fail=1
fi
for name in $expected; do
  grep -q "MISSING on the GPU machine: $name" "$tmp/check.log" && echo "named as missing: $name" ||
    { echo "FAILED: $name not named"; fail=1; }
done
check "$tmp/bundle" --carry > "$tmp/carry.log" 2>&1 ||
  { cat "$tmp/carry.log"; echo "FAILED: --carry did not pass"; fail=1; }
for name in $expected; do
  [ -f "$tmp/bundle/lib/$name" ] && echo "carried: $name" || { echo "FAILED: $name not carried"; fail=1; }
done
check "$tmp/bundle" > "$tmp/again.log" 2>&1 ||
  { cat "$tmp/again.log"; echo "FAILED: the carried bundle does not pass"; fail=1; }
tail -4 "$tmp/again.log"
exit $fail
