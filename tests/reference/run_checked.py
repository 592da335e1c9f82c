"""run(cmd, env, finished_marker): a reference program's stdout, or exit naming the command and
its output; free_port(): a port for a gloo rendezvous. Shared by the parity scripts beside this
file."""
import os, socket, subprocess, sys, tempfile, time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__)))), "scripts"))
import pyfork  # noqa: E402


def free_port():
    """A TCP port free on 127.0.0.1 now, chosen by the kernel. (Ports derived from the pid fell in
    the ephemeral range and collided with other tests' connections under ctest -j.)"""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run(cmd, env, finished_marker=None):
    """The command's stdout; exits on failure. A PyTorch run that printed `finished_marker` (its
    RESULT line, after the last step) and then failed is accepted with a warning: gloo's teardown
    in torch 2.11 occasionally aborts at exit (std::terminate), after all results are out."""
    try:
        if forkable(cmd, env):
            done = run_forked(cmd, env, timeout=600)
        else:
            done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
    except FileNotFoundError:
        sys.exit(f"not found: {cmd[0]}")
    if done.returncode != 0:
        if finished_marker and finished_marker in done.stdout:
            print(f"warning: exit status {done.returncode} after the run finished: "
                  f"{done.stderr.strip().splitlines()[-1:]}")
        else:
            sys.exit(f"failed ({done.returncode}): {' '.join(cmd)}\n{done.stdout}\n{done.stderr}")
    return done.stdout


def forkable(cmd, env):
    """Whether `cmd` may run in a fork of this process instead of a new one: it is a program of
    this Python, and this process computes on one thread (OMP_NUM_THREADS=1, as the tests run:
    then no intra-op thread pool exists for a fork to lose) and has no other, with the variables
    an import reads as they were when this process started (scripts/pyfork.py)."""
    return (cmd[0] == sys.executable and os.environ.get("OMP_NUM_THREADS") == "1"
            and pyfork.thread_count() == 1
            and all(env.get(k) == os.environ.get(k) for k in pyfork.IMPORT_TIME))


def run_forked(cmd, env, timeout):
    """subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout) for a Python
    program, run in a fork of this process: what this process imported (torch, transformers:
    about 4.5 s on a 2-core machine) is not imported again."""
    sys.stdout.flush()
    sys.stderr.flush()
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        pid = os.fork()
        if pid == 0:
            status = 1
            try:
                os.setpgid(0, 0)  # a timeout below stops the program and what it started
                os.dup2(out.fileno(), 1)
                os.dup2(err.fileno(), 2)
                os.environ.clear()
                os.environ.update(env)
                import atexit
                atexit._clear()  # this script's exit handlers are not the program's
                status = pyfork.run_program(cmd[1:])
            finally:
                os._exit(status)
        deadline = time.monotonic() + timeout
        while True:
            done, status = os.waitpid(pid, os.WNOHANG)
            if done:
                break
            if time.monotonic() > deadline:
                os.killpg(pid, 9)
                os.waitpid(pid, 0)
                raise subprocess.TimeoutExpired(cmd, timeout)
            time.sleep(0.02)
        code = os.waitstatus_to_exitcode(status)
        out.seek(0)
        err.seek(0)
        return subprocess.CompletedProcess(cmd, code, out.read().decode(errors="replace"),
                                           err.read().decode(errors="replace"))
