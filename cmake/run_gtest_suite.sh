#!/bin/sh
# run_gtest_suite.sh BINARY FILTER: runs the GoogleTest cases FILTER selects; exits with the
# binary's status, or 77 (ctest's skip code, FsdpGtestSuites.cmake) when it succeeded without
# a single case passing, i.e. every case skipped itself. A failing case always fails.
out=$("$1" --gtest_filter="$2" 2>&1)
rc=$?
printf '%s\n' "$out"
if [ "$rc" -eq 0 ] && printf '%s\n' "$out" | grep -q '^\[  PASSED  \] 0 tests'; then
  exit 77
fi
exit "$rc"
