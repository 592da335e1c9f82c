#!/usr/bin/env bash
# Checks that every static array of src/ops/cuda's kernels (their __shared__ memory, a function's
# static under the emulator) lies in the section the emulator fills with 0xff bytes before each
# block: GCC ignores the section of a static in a function template, and such an array would
# start zeroed and keep the previous block's values, hiding a read before any write.
# Usage: check_shared_section.sh <test_cuda_kernels_emulated>
set -euo pipefail
bin=$1
symbol_address() {
  nm "$bin" | awk -v name="$1" '$3 == name { print $1 }'
}
start=$(symbol_address __start_fsdp_emulated_shared)
stop=$(symbol_address __stop_fsdp_emulated_shared)
if [ -z "$start" ] || [ -z "$stop" ]; then
  echo "check_shared_section: $bin has no fsdp_emulated_shared section" >&2
  exit 1
fi
# A function's static: a demangled name ending in ")::name".
found=0 outside=0
while read -r address _ name; do
  found=$((found + 1))
  if (( 16#$address < 16#$start || 16#$address >= 16#$stop )); then
    echo "check_shared_section: $name is outside the section the emulator poisons" \
      "(a __shared__ array in a function template? declare it in a function that is not one)" >&2
    outside=$((outside + 1))
  fi
# (b, d: internal or local data; u, V, v: a template's, unique or weak, which is what lands
# outside the section.)
done < <(nm -C "$bin" | grep -E '^[0-9a-f]+ [bBdDuVv] fsdp::ops::cuda::.*\)::[A-Za-z_][A-Za-z_0-9]*$')
# The kernels have 6 (RMSNorm's block sum and the dw sum, the cross-entropy's merge, float8's
# block maximum and transpose tile): fewer found means the pattern no longer matches.
if (( found < 6 )); then
  echo "check_shared_section: found $found kernel statics, expected at least 6" >&2
  exit 1
fi
echo "check_shared_section: $found kernel statics, $outside outside the poisoned section"
(( outside == 0 ))
