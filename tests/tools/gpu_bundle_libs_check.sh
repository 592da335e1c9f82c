#!/usr/bin/env bash
# scripts/gpu_bundle_libs.py against this build. A bundle laid out as scripts/gpu_prebuild.sh
# lays it out (train_llama, libfsdp and libfsdp_models under their sonames) without the
# tokenizer's libraries is what failed to load on the first GPU run (main at fa07643): the check
# must fail here and name them, although this machine has them. With --carry it must pass and
# the bundle must hold them.
#   gpu_bundle_libs_check.sh PYTHON TRAIN_LLAMA LIBFSDP LIBFSDP_MODELS
set -uo pipefail
py="$1" program="$2"; shift 2
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
tmp="$(mktemp -d)"; trap 'rm -rf "$tmp"' EXIT
site="$("$py" -c 'import os, torch; print(os.path.dirname(os.path.dirname(torch.__file__)))')"
mkdir -p "$tmp/bundle/bin" "$tmp/bundle/lib"
cp "$program" "$tmp/bundle/bin/"
for so in "$@"; do
  real="$(readlink -f "$so")"
  cp "$real" "$tmp/bundle/lib/$(objdump -p "$real" | awk '/SONAME/ {print $2}')"
done
# What the build's libraries need beyond the wheels and the allow-list (the tokenizer's PCRE2
# and utf8proc today): the check must name each.
expected="$(for f in "$tmp"/bundle/bin/* "$tmp"/bundle/lib/*; do objdump -p "$f"; done |
  awk '/NEEDED/ {print $2}' | grep -E '^lib(pcre2|utf8proc)' | sort -u)"
[ -n "$expected" ] || { echo "FAILED: the build needs neither PCRE2 nor utf8proc: update this test"; exit 1; }
fail=0
if "$py" "$root/scripts/gpu_bundle_libs.py" --bundle "$tmp/bundle" --site "$site" > "$tmp/check.log" 2>&1; then
  echo "FAILED: the check passed a bundle without $(echo $expected)"; fail=1
fi
for name in $expected; do
  grep -q "MISSING on the GPU machine: $name" "$tmp/check.log" && echo "named as missing: $name" ||
    { echo "FAILED: $name not named"; fail=1; }
done
"$py" "$root/scripts/gpu_bundle_libs.py" --bundle "$tmp/bundle" --site "$site" --carry \
  > "$tmp/carry.log" 2>&1 || { cat "$tmp/carry.log"; echo "FAILED: --carry did not pass"; fail=1; }
for name in $expected; do
  [ -f "$tmp/bundle/lib/$name" ] && echo "carried: $name" || { echo "FAILED: $name not carried"; fail=1; }
done
"$py" "$root/scripts/gpu_bundle_libs.py" --bundle "$tmp/bundle" --site "$site" > "$tmp/again.log" 2>&1 ||
  { cat "$tmp/again.log"; echo "FAILED: the carried bundle does not pass"; fail=1; }
tail -4 "$tmp/again.log"
exit $fail
