#!/usr/bin/env bash
# Multi-host runs on one machine: two "hosts" (network namespaces, scripts/netns_hosts.sh) with
# two ranks each train MiniLLM
#   - launched torchrun-style on each host (Gloo over the hosts' eth0 addresses),
#   - launched by mpirun across the hosts (Open MPI's rsh agent set to scripts/netns_rsh.sh,
#     TCP between hosts restricted to eth0),
# each plainly sharded over 4 ranks and as 2 replicas, one per host (hybrid sharding); every
# run's losses equal the single-host run's to 1e-5. Exits 77 (ctest: skipped), saying why, where
# namespaces cannot be made (not root, no `ip`, no permission).
#   multihost_netns.sh TRAIN_MINILLM MPIEXEC [MPIEXEC_FLAGS...]
set -uo pipefail
bin="$1"; shift
mpiexec=("$@")
source "$(dirname "${BASH_SOURCE[0]}")/../../scripts/lib.sh"
here="$FSDP_ROOT"
hosts="$here/scripts/netns_hosts.sh"
if ! why="$("$hosts" check 2>&1)"; then
  echo "SKIPPED: multi-host test needs network namespaces: $why"
  exit 77
fi
name="fsdp$$"
fsdp_scratch
fsdp_on_exit '"$hosts" down "$name"'
"$hosts" up "$name" 2 || { echo "could not set up the namespaces"; exit 1; }
fsdp_one_thread
args=(--vocab 300 --dim 64 --layers 2 --heads 4 --seq 32 --steps 5 --lr 3e-3 --threads 1 --batch 8
      --comm-timeout 60)
fail=0

# The reference: 4 ranks on this (one) host.
"${mpiexec[@]}" -n 4 "$bin" "${args[@]}" --metrics-out "$tmp/single.jsonl" > "$tmp/single.log" 2>&1 \
  || { cat "$tmp/single.log"; exit 1; }

# torchrun-style: each host starts its two ranks; rank 0's host (10.77.0.1) holds the store.
gloo_run() {  # gloo_run TAG [TRAINER FLAGS...]
  local tag="$1"; shift
  local pids=() rc=0
  for h in 0 1; do
    for l in 0 1; do
      "$hosts" exec "$name" "$h" env GLOO_SOCKET_IFNAME=eth0 FSDP_BACKEND=gloo \
        MASTER_ADDR=10.77.0.1 MASTER_PORT=29517 WORLD_SIZE=4 RANK=$((2 * h + l)) LOCAL_RANK=$l \
        LOCAL_WORLD_SIZE=2 "$bin" "${args[@]}" "$@" --metrics-out "$tmp/$tag.jsonl" \
        > "$tmp/$tag.$h.$l.log" 2>&1 &
      pids+=($!)
    done
  done
  for p in "${pids[@]}"; do wait "$p" || rc=1; done
  if [ "$rc" -ne 0 ]; then echo "gloo run '$tag' failed:"; tail -n 20 "$tmp/$tag".*.log; fail=1; fi
}

# mpirun inside host 0, reaching host 1 through the rsh agent; ranks 0-1 on host 0, 2-3 on 1.
mpi_run() {  # mpi_run TAG [TRAINER FLAGS...]
  local tag="$1"; shift
  if ! "$hosts" exec "$name" 0 env FSDP_NETNS_NAME="$name" "${mpiexec[@]}" -n 4 \
      --host 10.77.0.1:2,10.77.0.2:2 --mca plm_rsh_agent "$here/scripts/netns_rsh.sh" \
      --mca oob_tcp_if_include eth0 --mca btl_tcp_if_include eth0 \
      -x OMP_NUM_THREADS -x OPENBLAS_NUM_THREADS "$@" > "$tmp/$tag.log" 2>&1; then
    echo "mpirun run '$tag' failed:"; tail -n 30 "$tmp/$tag.log"; fail=1
  fi
}

gloo_run gloo
gloo_run gloo_hsdp --replicas 2
mpi_run where sh -c 'echo "$OMPI_COMM_WORLD_RANK $(readlink /proc/self/ns/net)"'
mpi_run mpi "$bin" "${args[@]}" --metrics-out "$tmp/mpi.jsonl"
mpi_run mpi_hsdp "$bin" "${args[@]}" --replicas 2 --metrics-out "$tmp/mpi_hsdp.jsonl"

# mpirun really placed ranks 2 and 3 on the second host.
for h in 0 1; do
  want="$("$hosts" exec "$name" "$h" readlink /proc/self/ns/net)"
  for r in $((2 * h)) $((2 * h + 1)); do
    grep -qxF "$r $want" "$tmp/where.log" \
      || { echo "rank $r did not run on host $h ($want):"; cat "$tmp/where.log"; fail=1; }
  done
done
grep -q "as 2 replicas x 2 shards" "$tmp/gloo_hsdp.0.0.log" \
  || { echo "the hybrid run's header lacks its layout:"; cat "$tmp/gloo_hsdp.0.0.log"; fail=1; }

losses() { [ -s "$1" ] && sed -E 's/.*"loss":([-0-9.eE+]+).*/\1/' "$1"; }
for tag in gloo gloo_hsdp mpi mpi_hsdp; do
  paste <(losses "$tmp/single.jsonl") <(losses "$tmp/$tag.jsonl") > "$tmp/pairs.$tag"
  if ! awk 'function off(a, b) { d = a - b; if (d < 0) d = -d; return d > 1e-5 * (a < 0 ? -a : a) }
            NF != 2 || off($1, $2) { bad = 1 } END { exit bad || NR != 5 }' "$tmp/pairs.$tag"; then
    echo "losses of '$tag' differ from the single-host run (single, $tag):"; cat "$tmp/pairs.$tag"; fail=1
  fi
done
echo "losses: single host | gloo over 2 hosts | gloo, 2 replicas | mpirun over 2 hosts | mpirun, 2 replicas"
paste <(losses "$tmp/single.jsonl") <(losses "$tmp/gloo.jsonl") <(losses "$tmp/gloo_hsdp.jsonl") \
  <(losses "$tmp/mpi.jsonl") <(losses "$tmp/mpi_hsdp.jsonl")
[ "$fail" -eq 0 ] && echo "multi-host over network namespaces: passed"
exit "$fail"
