"""run(cmd, env, finished_marker): a reference program's stdout, or exit naming the command and
its output. Shared by the parity scripts beside this file."""
import subprocess, sys


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
