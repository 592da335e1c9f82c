#!/usr/bin/env bash
# scripts/pyfork.py (lib.sh's fsdp_pyfork), which the shell tests run their Python judges with,
# must behave as python itself does, or a judge's verdict could be lost: the same exit status
# (0, sys.exit's, 1 for an exception, 128 + N for a signal), stdout and stderr where the caller
# sent them, stdin, arguments, working directory and environment for each mode (script, -c, -,
# -m), the ordinary python when an import-time variable differs or no server runs, and a caller
# that dies takes its program with it. Also run_checked.py's in-process fork (the parity scripts').
#   pyfork_check.sh PYTHON
set -uo pipefail
py="$1"
source "$(dirname "${BASH_SOURCE[0]}")/../../scripts/lib.sh"
fsdp_scratch
fsdp_one_thread
real="$py"
fsdp_pyfork
fail=0
check() {  # check WHAT WANT GOT
  if [ "$2" = "$3" ]; then echo "ok: $1"; else echo "FAILED: $1: expected '$2', got '$3'"; fail=1; fi
}

# The server's pid as the programs see it: their parent's parent (program <- supervisor <- server).
server_pid() { "$py" -c "import os; print(open(f'/proc/{os.getppid()}/stat').read().split()[3])"; }
served="$(server_pid)"
check "programs run in forks of the server" "$(pgrep -o -f "pyfork.py serve $tmp/pyfork/sock")" "$served"
check "the server has one thread (nothing for a fork to lose)" 1 "$(ls "/proc/$served/task" | wc -l)"
check "a fork has torch imported already" "True" \
  "$("$py" -c "import sys; print('transformers.models.llama.modeling_llama' in sys.modules)")"

"$py" -c "import sys; sys.exit(3)"; check "sys.exit(3)" 3 $?
"$py" -c "raise ValueError('boom')" 2> "$tmp/err"; check "an exception exits 1" 1 $?
grep -q "ValueError: boom" "$tmp/err"; check "its traceback goes to stderr" 0 $?
"$py" -c "import sys; sys.exit('bad input')" 2> "$tmp/err"; check "sys.exit(TEXT) exits 1" 1 $?
check "... and prints TEXT on stderr" "bad input" "$(cat "$tmp/err")"
"$py" -c "import os, signal; os.kill(os.getpid(), signal.SIGKILL)"; check "killed by signal 9" 137 $?
check "stdout, arguments" "['-c', 'a', 'b c']" "$("$py" -c "import sys; print(sys.argv)" a "b c")"
check "stdout and stderr apart" "out" "$("$py" -c "import sys; print('out'); print('err', file=sys.stderr)" 2> /dev/null)"
check "stdin" "42" "$(echo 42 | "$py" -c "import sys; print(sys.stdin.readline().strip())")"
check "- mode: the program on stdin" "['-', 'x']" "$(echo 'import sys; print(sys.argv)' | "$py" - x)"
check "-c's code is a __main__ module of its own (its classes pickle)" "ok" \
  "$("$py" -c "import pickle
class A: pass
pickle.dumps(A()); print('ok')")"
check "python's own options (-u) run the ordinary way" "u 2" "$("$py" -u -c "import sys; print('u', end=' '); sys.exit(2)"; echo $?)"
mkdir -p "$tmp/pkg/mod" && printf 'import sys\nprint("module", sys.argv[1:])\n' > "$tmp/pkg/mod/__main__.py"
check "-m mode, working directory" "module ['y']" "$(cd "$tmp/pkg" && "$py" -m mod y)"
printf 'import os, sys\nprint(__name__, os.path.basename(sys.argv[0]), sys.argv[1:], os.environ.get("FSDP_X"))\nsys.exit(5)\n' > "$tmp/prog.py"
got="$(cd / && FSDP_X=7 "$py" "$tmp/prog.py" q)"; status=$?
check "a script: __main__, its argv and the caller's environment" "__main__ prog.py ['q'] 7" "$got"
check "... and its exit status" 5 "$status"
other="$(OMP_NUM_THREADS=2 "$py" -c "import os; print(os.getppid())")"
[ "$other" != "$served" ] && [ -n "$other" ]; check "an import-time variable that differs: ordinary python" 0 $?
( _fsdp_exit_cmds=(); tmp="$tmp/none"; py="$real"; fsdp_pyfork
  kill "$(pgrep -o -f "pyfork.py serve $tmp/pyfork/sock")"; sleep 0.2
  check "no server: ordinary python, same status" 4 "$("$py" -c "import sys; sys.exit(4)"; echo $?)" )

# A caller that dies (a timeout) stops its program: the program would write a file after 3 s.
"$py" -c "import time; time.sleep(3); open('$tmp/late', 'w').write('x')" & caller=$!
sleep 1; kill -9 "$caller"; wait "$caller" 2> /dev/null; sleep 3
[ ! -e "$tmp/late" ]; check "a killed caller's program is stopped" 0 $?

# run_checked.py's fork of the parity scripts: the same output, status and timeout as a process.
"$real" - "$FSDP_ROOT/tests/reference" <<'PY' || fail=1
import os, subprocess, sys
sys.path.insert(0, sys.argv[1])
import run_checked
cmd = [sys.executable, "-c", "import os, sys; print('out', os.environ['FSDP_X']); print('err', file=sys.stderr); sys.exit(6)"]
env = dict(os.environ, FSDP_X="8")
assert run_checked.forkable(cmd, env)
got, want = run_checked.run_forked(cmd, env, 60), subprocess.run(cmd, env=env, capture_output=True, text=True)
assert (got.returncode, got.stdout, got.stderr) == (want.returncode, want.stdout, want.stderr), (got, want)
assert not run_checked.forkable(cmd, dict(env, OMP_NUM_THREADS="4"))
try:
    run_checked.run_forked([sys.executable, "-c", "import time; time.sleep(30)"], env, 1)
    sys.exit("FAILED: run_forked did not time out")
except subprocess.TimeoutExpired:
    pass
print("ok: run_checked's fork gives subprocess.run's status, stdout and stderr, and times out")
PY
exit $fail
