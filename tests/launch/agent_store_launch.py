"""Starts PROGRAM on N local ranks the way torchrun's elastic agent does: the agent (this
script) owns the c10d TCPStore, and every rank connects to it as a client with
TORCHELASTIC_USE_AGENT_STORE=True. Used by ctest because Debian's torchrun (1.13) fails under
Python 3.11 before starting any worker.

    agent_store_launch.py N PROGRAM [ARGS...]
"""
import os
import socket
import subprocess
import sys
from datetime import timedelta

from torch.distributed import TCPStore


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main():
    n, cmd = int(sys.argv[1]), sys.argv[2:]
    port = free_port()
    store = TCPStore("127.0.0.1", port, n, True, timedelta(seconds=120), wait_for_workers=False)
    procs = []
    for r in range(n):
        env = dict(os.environ, RANK=str(r), LOCAL_RANK=str(r), WORLD_SIZE=str(n),
                   LOCAL_WORLD_SIZE=str(n), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port),
                   TORCHELASTIC_USE_AGENT_STORE="True", TORCHELASTIC_RESTART_COUNT="0")
        procs.append(subprocess.Popen(cmd, env=env))
    codes = [p.wait(timeout=300) for p in procs]
    del store
    sys.exit(next((c for c in codes if c != 0), 0))


if __name__ == "__main__":
    main()
