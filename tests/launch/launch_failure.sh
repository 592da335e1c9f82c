#!/usr/bin/env bash
# scripts/launch.sh must not hang when a rank fails: rank 1 exits with status 3 at once while
# rank 0 would sleep for a minute; the launcher must stop rank 0 and return 3 within seconds.
set -uo pipefail
launch="$1"
start=$SECONDS
"$launch" --nproc 2 bash -c 'if [ "$RANK" = 1 ]; then exit 3; fi; sleep 60'
rc=$?
elapsed=$((SECONDS - start))
echo "launch.sh returned $rc after ${elapsed}s"
[ "$rc" -eq 3 ] && [ "$elapsed" -lt 20 ]
