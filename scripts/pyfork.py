"""A fork server for Python programs that import torch and transformers: the tests' judges.

On a 2-core machine `python hf_llama.py make-tiny ...` spends about 4.5 s importing torch and
transformers before it does a few milliseconds of work, and a shell test runs a dozen such
programs. `serve` imports those modules once; each `run` then forks that process and runs one
program in the fork, with the caller's own stdin, stdout and stderr (passed over a Unix socket),
arguments, working directory and environment, and exits with the program's status. This is
multiprocessing's forkserver idea applied to whole programs.

  python pyfork.py serve SOCKET [MODULE ...]     import COMMON and the modules, serve on SOCKET
  python -S pyfork.py run SOCKET PYTHON ARGS...  run `PYTHON ARGS...` in a fork of the server

`serve` first writes `python` beside SOCKET: a script that runs `run` with the server's own
interpreter, to call (or put first on PATH) instead of that interpreter.

ARGS are what python takes: a script and its arguments, `-c CODE ...`, `- ...` (the code on
stdin) or `-m MODULE ...`. `run` falls back to executing PYTHON itself (the ordinary way, same
result, no saving) when no server answers, or when the caller's environment differs from the
server's in a variable read when a module is imported (the thread counts, MKL's and ATen's
processor pins, Python's own): a fork cannot change what an import already read.

Why a fork is safe here: the server runs no tensor operation, so it holds no intra-op thread
pool (a fork keeps only the forking thread) and no other thread but numpy's OpenBLAS pool,
which OpenBLAS stops before a fork itself (it checks: a server whose imports started another
runs every program the ordinary way); each program runs in its own fork, which exits when the
program does. A caller that dies (a test's timeout) takes its program
down with it: the program's supervisor sees the socket close and kills it.
"""
import json, os, select, signal, socket, struct, sys

# What the tests' judges import: the server imports these, and the modules it is given.
COMMON = ("numpy", "torch", "safetensors.torch", "transformers.models.llama.modeling_llama",
          "transformers.models.auto.tokenization_auto")

# Variables read when torch, MKL or Python start: a program whose values differ runs as usual.
IMPORT_TIME = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "MKL_CBWR",
               "ATEN_CPU_CAPABILITY", "KMP_AFFINITY", "OMP_PROC_BIND", "LD_LIBRARY_PATH",
               "LD_PRELOAD", "PYTHONPATH", "PYTHONHASHSEED", "PYTHONIOENCODING", "PYTHONUTF8",
               "PYTHONUNBUFFERED", "PYTHONWARNINGS", "PYTHONDONTWRITEBYTECODE", "LANG", "LC_ALL",
               "LC_CTYPE", "HF_HOME", "HF_HUB_OFFLINE", "HF_HUB_CACHE", "TRANSFORMERS_OFFLINE")


def thread_count():
    """This process's threads (1 where /proc does not say)."""
    task = "/proc/self/task"
    return len(os.listdir(task)) if os.path.isdir(task) else 1


def send_message(conn, obj, fds=()):
    data = json.dumps(obj).encode()
    socket.send_fds(conn, [struct.pack("!I", len(data)) + data], list(fds))


def recv_message(conn):
    """One message and the file descriptors sent with it (at most 3)."""
    data, fds, _, _ = socket.recv_fds(conn, 1 << 20, 3)
    if len(data) < 4:
        raise ConnectionError("short message")
    size = struct.unpack("!I", data[:4])[0]
    data = data[4:]
    while len(data) < size:
        more = conn.recv(size - len(data))
        if not more:
            raise ConnectionError("short message")
        data += more
    return json.loads(data), fds


# ------------------------------------------------------------------------- the program's side

def fresh_state():
    """What a new interpreter would not share with this process: torch's, numpy's and random's
    generators are seeded anew (each from the operating system, as a new process's are)."""
    import random
    random.seed()
    if "numpy" in sys.modules:
        sys.modules["numpy"].random.seed()
    if "torch" in sys.modules:
        sys.modules["torch"].seed()


def run_program(args):
    """Runs python's ARGS in this process as `python ARGS` would, and returns its exit status
    (after what python does at exit: waiting for non-daemon threads, the atexit handlers, and
    120 when flushing stdout fails)."""
    import atexit, runpy, threading, traceback, types
    fresh_state()
    try:
        if args[0] in ("-", "-c"):
            code = sys.stdin.read() if args[0] == "-" else args[1]
            sys.argv = [args[0]] + args[1 if args[0] == "-" else 2:]
            sys.path[0] = ""
            main = types.ModuleType("__main__")  # a module of its own, as python's __main__ is
            main.__builtins__ = __builtins__
            sys.modules["__main__"] = main
            exec(compile(code, "<stdin>" if args[0] == "-" else "<string>", "exec"), main.__dict__)
        elif args[0] == "-m":
            sys.argv = [args[1]] + args[2:]
            sys.path[0] = os.getcwd()
            runpy.run_module(args[1], run_name="__main__", alter_sys=True)
        else:
            sys.argv = list(args)
            sys.path[0] = os.path.dirname(os.path.abspath(args[0]))
            runpy.run_path(args[0], run_name="__main__")
        status = 0
    except SystemExit as e:
        if e.code is None:
            status = 0
        elif isinstance(e.code, int):
            status = e.code & 0xFF
        else:
            print(e.code, file=sys.stderr)
            status = 1
    except BaseException:  # as python prints an uncaught exception, and exits 1
        traceback.print_exc()
        status = 1
    threading._shutdown()
    atexit._run_exitfuncs()
    try:
        sys.stdout.flush()
    except Exception:
        status = 120
    try:
        sys.stderr.flush()
    except Exception:
        pass
    return status


def start_program(request, fds):
    """In the program's process: the caller's streams, directory, environment, umask and
    signals, then the program. Never returns."""
    status = 1
    try:
        os.setsid()  # its own process group: the supervisor can stop what it started, too
        import ctypes
        # It dies with its supervisor (PR_SET_PDEATHSIG): never a program left running unseen.
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)
        for target, fd in enumerate(fds):
            os.dup2(fd, target)
            os.close(fd)
        os.chdir(request["cwd"])
        os.umask(request["umask"])
        os.environ.clear()
        os.environ.update(request["env"])
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        # A background job's shell ignores these; python's program gets its defaults.
        signal.signal(signal.SIGINT, signal.default_int_handler)
        signal.signal(signal.SIGQUIT, signal.SIG_DFL)
        status = run_program(request["args"])
    finally:
        os._exit(status)


def serve_one(conn, request, fds):
    """The supervisor (a fork of the server): forks the program, says so, waits for it, sends
    its status. Kills the program if the caller goes away first."""
    pid = os.fork()
    if pid == 0:
        conn.close()
        start_program(request, fds)
    for fd in fds:
        os.close(fd)
    send_message(conn, {"started": pid})  # from here on the caller must not run it again
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            break
        readable, _, _ = select.select([conn], [], [], 0.05)
        if readable and not conn.recv(1, socket.MSG_PEEK):  # the caller closed: stop the program
            os.killpg(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            return
    code = os.waitstatus_to_exitcode(status)
    send_message(conn, {"status": code if code >= 0 else 128 - code})


def write_wrapper(path):
    """Writes `python` beside the socket at `path`: `run` through this server, falling back to
    this interpreter (sys.executable, a virtual environment's own path)."""
    import shlex
    wrapper = os.path.join(os.path.dirname(os.path.abspath(path)), "python")
    q = [shlex.quote(x) for x in (sys.executable, os.path.abspath(__file__), path)]
    with open(wrapper, "w") as f:
        f.write(f'#!/bin/sh\nexec {q[0]} -S {q[1]} run {q[2]} {q[0]} "$@"\n')
    os.chmod(wrapper, 0o755)


def serve(path, modules):
    write_wrapper(path)
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(path)
    server.listen(64)  # callers wait in the backlog while the imports below run
    import importlib
    # A thread the imports started would be missing from every fork, which could hang waiting
    # for it (an OpenMP pool): a server with one runs every program the ordinary way. The one
    # exception is numpy's OpenBLAS pool (numpy starts it unless OPENBLAS_NUM_THREADS=1), which
    # OpenBLAS itself stops before a fork (pthread_atfork) and a fork starts anew when it needs it.
    allowed = 1
    for name in sorted(COMMON + tuple(modules), key=lambda m: m != "numpy"):
        try:
            importlib.import_module(name)
        except Exception:  # not installed (or broken) here: the programs that use it import it
            pass
        if name == "numpy":
            allowed = thread_count()
    env = {k: os.environ.get(k) for k in IMPORT_TIME}
    threads_ok = thread_count() <= allowed
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # supervisors are reaped by the kernel
    parent = os.getppid()
    server.settimeout(2)
    while True:
        try:
            conn, _ = server.accept()
        except socket.timeout:
            if os.getppid() != parent:  # the script that started it is gone (killed: no cleanup)
                return
            continue
        conn.settimeout(None)
        try:
            request, fds = recv_message(conn)
        except (ConnectionError, ValueError, OSError):
            conn.close()
            continue
        if not threads_ok or any(request["env"].get(k) != v for k, v in env.items()):
            send_message(conn, {"refused": "environment" if threads_ok else "threads"})
            conn.close()
            for fd in fds:
                os.close(fd)
            continue
        sys.stdout.flush()
        sys.stderr.flush()
        if os.fork() == 0:
            server.close()
            signal.signal(signal.SIGCHLD, signal.SIG_DFL)  # it waits for its program
            try:
                serve_one(conn, request, fds)
            finally:
                os._exit(0)
        conn.close()
        for fd in fds:
            os.close(fd)


# ---------------------------------------------------------------------------- the caller's side

def run(path, python, args):
    """Runs `python args` in a fork of the server at `path`; the ordinary way when none answers
    before the program starts. Python's own options (-u, -W, -X, ...) run the ordinary way."""
    reply = {"refused": "options"}
    if args and (args[0] in ("-", "-c", "-m") or not args[0].startswith("-")):
        try:
            conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            conn.connect(path)
            umask = os.umask(0)
            os.umask(umask)
            send_message(conn, {"args": args, "cwd": os.getcwd(), "env": dict(os.environ),
                                "umask": umask}, [0, 1, 2])
            reply, _ = recv_message(conn)
        except (OSError, ConnectionError, ValueError):
            reply = {"refused": "no server"}
        if "started" in reply:  # it runs: its status, or 1 if the supervisor is gone
            try:
                reply, _ = recv_message(conn)
            except (OSError, ConnectionError, ValueError):
                reply = {"status": 1}
    if "status" in reply:
        sys.exit(reply["status"])
    os.execv(python, [python] + args)


def main():
    if len(sys.argv) >= 3 and sys.argv[1] == "serve":
        serve(sys.argv[2], sys.argv[3:])
    elif len(sys.argv) >= 4 and sys.argv[1] == "run":
        run(sys.argv[2], sys.argv[3], sys.argv[4:])
    else:
        sys.exit(__doc__.split("\n\n")[2])


if __name__ == "__main__":
    main()
