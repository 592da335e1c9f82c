#!/usr/bin/env bash
# scripts/launch.sh must not hang when a rank fails: rank 1 exits with status 3 at once while
# rank 0 would sleep for 10 minutes; the launcher must stop rank 0 and return 3. The bound (2
# minutes) tells "stopped" from "waited for the sleeper" on any machine, however busy: it is a
# hang check, not a speed check.
set -uo pipefail
launch="$1"
start=$SECONDS
"$launch" --nproc 2 bash -c 'if [ "$RANK" = 1 ]; then exit 3; fi; sleep 600'
rc=$?
elapsed=$((SECONDS - start))
echo "launch.sh returned $rc after ${elapsed}s"
[ "$rc" -eq 3 ] && [ "$elapsed" -lt 120 ]
