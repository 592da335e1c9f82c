#!/usr/bin/env bash
# A dead, stuck or failing rank ends the whole job in bounded time, under mpirun (MPI) and under
# scripts/launch.sh (Gloo), at worlds 2 and 4; prints each case's time to failure.
#   failure_modes.sh FAILING_RANK TRAIN_MINILLM MPIEXEC [MPIEXEC_FLAGS...]
# Cases (tests/comm/failing_rank.cpp): the last rank stops issuing collectives (survivors must
# raise CommError within the 5 s timeout, then the job ends), throws, is SIGKILLed, or issues
# another collective than the others (FSDP_DEBUG_DESYNC=1: every rank must name it); and the
# trainer with one rank killed by kill -9 in the middle of training, and with rank 0 failing
# alone in the middle of training (its --metrics-out on a full disk, /dev/full).
# A rank that fails with an error (throw, the full disk) must end the job at once: those cases
# run with a 600 s timeout, beyond the limit, so that survivors waiting for it fail the test.
# Under MPI, ranks leaving together (one failing after the last collective, or all failing
# alike) must all finalise, none cut short.
set -uo pipefail
failing="$1"; train="$2"; shift 2
mpiexec=("$@")
source "$(dirname "${BASH_SOURCE[0]}")/../../scripts/lib.sh"
root="$FSDP_ROOT"
launch="$root/scripts/launch.sh"
fsdp_one_thread
fsdp_scratch
timeout_s=5
long_timeout_s=600
# The bound each case must meet, seconds: generous, so that it tells a job that ended from one
# that hangs on any machine, however busy (the times are printed, and bench/ reports them).
limit=$((timeout_s + 115))
fail=0

elapsed() { awk -v a="$1" -v b="$EPOCHREALTIME" 'BEGIN { printf "%.1f", b - a }'; }

# after SECONDS COMMAND: runs COMMAND (a string, eval'd) in the background after SECONDS unless
# stopped first (kill "$after_pid"); sets after_pid. The sleep must neither hold the test's
# output open nor outlive the job: ctest waits for whoever holds the output, and a forgotten
# sleep kept this test 150 s past its end. Stopped, it ends its sleep and leaves without running
# COMMAND (which must not go on to kill a reused pid).
after() {
  local secs="$1" cmd="$2"
  ( trap 'kill "$nap" 2>/dev/null; exit 0' TERM
    sleep "$secs" & nap=$!
    wait "$nap" && eval "$cmd" ) > /dev/null 2>&1 &
  after_pid=$!
}

# run LABEL COMMAND...: runs it under a hard cap; sets rc, secs, log. A job still running at the
# limit has its processes listed into the log before the cap kills it (state, kernel wait
# channel, age), so that a hang says which process hung: once, on a 2-core machine at ctest -j 3,
# `mpirun np4 throw` outlived the three MPI_Abort calls that should have ended it.
run() {
  local label="$1"; shift
  local t0=$EPOCHREALTIME
  : > "$tmp/log"
  after "$limit" '{ echo "--- still running after ${limit} s:"
                    ps -eo pid,ppid,stat,wchan:24,etime,args |
                      grep -E "failing_rank|orted|mpirun|launch.sh" | grep -v grep; } >> "$tmp/log"'
  local lister=$after_pid
  timeout -k 5 $((limit + 30)) "$@" >> "$tmp/log" 2>&1
  rc=$?
  kill "$lister" 2>/dev/null; wait "$lister" 2>/dev/null
  secs=$(elapsed "$t0")
  log="$tmp/log"
}

check() {  # LABEL: the job failed (non-zero) within the limit
  local label="$1" detail="$2"
  local ok=1
  [ "$rc" -ne 0 ] || ok=0
  # (The hard caps fire only after the limit, so a hang fails the time check.)
  awk -v s="$secs" -v l="$limit" 'BEGIN { exit !(s < l) }' || ok=0
  if [ "$ok" -eq 1 ]; then
    printf '%-28s ended in %5.1f s (exit %d)%s\n' "$label" "$secs" "$rc" "$detail"
  else
    printf '%-28s FAILED: exit %d after %.1f s (limit %d s)\n' "$label" "$rc" "$secs" "$limit"
    tail -20 "$log"
    fail=1
  fi
}

for np in 2 4; do
  for mode in stuck throw kill desync; do
    for via in mpirun launch; do
      desync=0; [ "$mode" = desync ] && desync=1
      wait_s=$timeout_s; [ "$mode" = throw ] && wait_s=$long_timeout_s
      if [ "$via" = mpirun ]; then
        run "$via" env FSDP_DEBUG_DESYNC=$desync "${mpiexec[@]}" -n "$np" "$failing" "$mode" \
          "$wait_s"
      else
        run "$via" env FSDP_BACKEND=gloo FSDP_DEBUG_DESYNC=$desync "$launch" --nproc "$np" \
          "$failing" "$mode" "$wait_s"
      fi
      detail=""
      if [ "$mode" = throw ]; then
        # The failing rank's own error is what the job says, and no survivor waited for its
        # timeout (under MPI the failing rank does not sit in MPI_Finalize waiting for them).
        if ! grep -q "rank $((np - 1)): error: failing_rank: this rank's step failed" "$log"; then
          echo "$via np$np throw: the failing rank's error is missing"; tail -20 "$log"; fail=1
        fi
        if grep -q "did not complete within" "$log"; then
          echo "$via np$np throw: a survivor waited for its timeout"; tail -20 "$log"; fail=1
        fi
      fi
      if [ "$mode" = desync ]; then
        # Every rank names the divergent collective, none waits for the timeout.
        named=$(grep -c "CommError after .*desynchronised collectives" "$log")
        if [ "$named" -ne "$np" ]; then
          echo "$via np$np desync: $named of $np ranks named the desync"; tail -20 "$log"; fail=1
        fi
        detail=" - $(grep -m1 -o "rank[s]* [0-9,]* issued [^;]*;" "$log")"
      fi
      if [ "$mode" = stuck ]; then
        # Survivors detect it themselves: CommError naming the operation and the time waited.
        first=$(grep -m1 "CommError after" "$log")
        if [ -z "$first" ]; then
          echo "$via np$np stuck: no survivor raised CommError"; tail -20 "$log"; fail=1
        fi
        detail=" - ${first:0:160}"
      fi
      check "$via np$np $mode" "$detail"
    done
  done
done

# Leaving together (MPI): a rank failing after the last collective while the others end as
# usual (late), and every rank raising the same error (all). Every rank meets the others on its
# way out, so none is cut short (the others' lines after their groups are gone are printed, and
# every rank's error is), and none says it left the others running.
for np in 2 4; do
  for mode in late all; do
    run mpirun "${mpiexec[@]}" -n "$np" "$failing" "$mode" "$long_timeout_s"
    if [ "$mode" = late ]; then
      want=$((np - 1)); got=$(grep -c "^rank [0-9]*: finished" "$log")
    else
      want=$np; got=$(grep -c "error: failing_rank: this rank's step failed" "$log")
    fi
    if [ "$got" -ne "$want" ]; then
      echo "mpirun np$np $mode: $got of $want ranks reported"; tail -20 "$log"; fail=1
    fi
    if grep -q "leaving on an error while other ranks still run" "$log"; then
      echo "mpirun np$np $mode: a rank left without the others"; tail -20 "$log"; fail=1
    fi
    check "mpirun np$np $mode" ""
  done
done

# The way out under launchers other than Open MPI's mpirun (srun, MPICH's): the rank leaving
# alone calls MPI_Abort at exit, after printing its error. Open MPI's ranks always have the
# variable that selects mpirun's way, so FSDP_MPI_ABORT_AT_EXIT=1 selects the other. The job
# must end with the error printed, not hang in the abort at exit or lose the message. (Open
# MPI 4.1's own report of the abort comes out garbled about every other run here,
# "ORTE_ERROR_LOG: Out of resource", so it is shown, not checked.)
for np in 2 4; do
  run mpirun env FSDP_MPI_ABORT_AT_EXIT=1 "${mpiexec[@]}" -n "$np" "$failing" throw \
    "$long_timeout_s"
  if ! grep -q "rank $((np - 1)): error: failing_rank: this rank's step failed" "$log"; then
    echo "mpirun np$np abort at exit: the failing rank's error is missing"; tail -20 "$log"; fail=1
  fi
  if ! grep -q "job ends when this process exits (MPI_Abort at exit)" "$log"; then
    echo "mpirun np$np abort at exit: the rank did not take that way out"; tail -20 "$log"; fail=1
  fi
  report=" - Open MPI's report: none"
  grep -q "MPI_ABORT was invoked" "$log" && report=" - Open MPI's report: MPI_ABORT was invoked"
  grep -q "ORTE_ERROR_LOG" "$log" && report=" - Open MPI's report: garbled (ORTE_ERROR_LOG)"
  check "mpirun np$np abort at exit" "$report"
done

# The trainer, one rank killed with kill -9 in the middle of training.
for np in 2 4; do
  for via in mpirun launch; do
    # --seed 4242 marks these processes: other tests may run the trainer at the same time.
    args=(--vocab 2000 --dim 128 --layers 3 --heads 4 --seq 64 --batch 4 --steps 100000 --threads 1
          --data synthetic --comm-timeout "$timeout_s" --seed 4242)
    if [ "$via" = mpirun ]; then
      "${mpiexec[@]}" -n "$np" "$train" "${args[@]}" > "$tmp/train.log" 2>&1 &
    else
      FSDP_BACKEND=gloo "$launch" --nproc "$np" "$train" "${args[@]}" > "$tmp/train.log" 2>&1 &
    fi
    job=$!
    for _ in $(seq 1 3000); do grep -q "^step    3 " "$tmp/train.log" && break; sleep 0.1; done
    victim=$(pgrep -n -f -- "--seed 4242")
    t0=$EPOCHREALTIME
    kill -9 "$victim"
    after $((limit + 30)) 'kill -9 "$job"'
    cap=$after_pid
    wait "$job"; rc=$?
    kill "$cap" 2>/dev/null; wait "$cap" 2>/dev/null
    secs=$(elapsed "$t0")
    log="$tmp/train.log"
    check "trainer $via np$np kill -9" ""
    pkill -9 -f -- "--seed 4242" 2>/dev/null
  done
done
# The trainer, rank 0 failing alone in the middle of training: its --metrics-out is on a full
# disk (/dev/full: the first line written after step 0 fails). Rank 0 names the file and the
# cause, and the job ends at once, not after the others' collective timeout.
if [ -c /dev/full ]; then
  for np in 2 4; do
    for via in mpirun launch; do
      args=(--vocab 2000 --dim 128 --layers 3 --heads 4 --seq 64 --batch 4 --steps 1000 --threads 1
            --data synthetic --comm-timeout "$long_timeout_s" --metrics-out /dev/full)
      if [ "$via" = mpirun ]; then
        run "$via" "${mpiexec[@]}" -n "$np" "$train" "${args[@]}"
      else
        run "$via" env FSDP_BACKEND=gloo "$launch" --nproc "$np" "$train" "${args[@]}"
      fi
      expected="\[rank 0/$np\] error: writing --metrics-out /dev/full failed after step 0: No space left on device"
      if ! grep -q "$expected" "$log"; then
        echo "trainer $via np$np full disk: rank 0's error is missing"; tail -20 "$log"; fail=1
      fi
      check "trainer $via np$np full disk" ""
    done
  done
else
  echo "no /dev/full here: the trainer's full-disk case is not run"
fi
[ "$fail" -eq 0 ] && echo "failure modes: passed"
exit "$fail"
