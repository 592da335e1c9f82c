"""run(cmd, env, finished_marker): a reference program's stdout, or exit naming the command and
its output; free_port(): a port for a gloo rendezvous. Shared by the parity scripts beside this
file."""
import socket, subprocess, sys


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
