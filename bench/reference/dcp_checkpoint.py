"""torch.distributed.checkpoint (DCP) saving and loading an FSDP2 MiniLLM and its AdamW state,
timed, for bench/checkpoint_bench.sh to set beside fsdp-cpp's checkpoints of the same model.

  python3 dcp_checkpoint.py --world 4 --dir /tmp/dcp --vocab 4096 --dim 512 --layers 16 --heads 8

Spawns its ranks (gloo, CPU). One training step first, so the optimizer state exists. Prints
  RESULT world=... save_s=... load_s=... bytes=...
with the slowest rank's times (the save and the load both end in a barrier).
"""
import argparse, os, shutil, time

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
import torch.multiprocessing as mp
from torch.distributed.checkpoint.state_dict import (get_model_state_dict, get_optimizer_state_dict,
                                                     set_model_state_dict, set_optimizer_state_dict)
from torch.distributed.fsdp import fully_shard

from py_minillm import MiniLLM


def run(rank, a):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(a.port))
    dist.init_process_group("gloo", rank=rank, world_size=a.world)
    torch.set_num_threads(1)
    torch.manual_seed(0)
    model = MiniLLM(a.vocab, a.dim, a.layers, a.heads)
    for layer in model.layers:
        fully_shard(layer)
    fully_shard(model)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, fused=True)
    tokens = torch.randint(a.vocab, (1, 32))
    model(tokens).float().mean().backward()
    opt.step()

    def state():
        return {"model": get_model_state_dict(model), "optim": get_optimizer_state_dict(model, opt)}

    dist.barrier()
    t0 = time.perf_counter()
    dcp.save(state(), checkpoint_id=a.dir)
    dist.barrier()
    save_s = time.perf_counter() - t0
    if rank == 0:  # read from the disk, as the C++ side's load is measured (root only)
        try:
            os.sync()
            with open("/proc/sys/vm/drop_caches", "w") as f:
                f.write("3")
        except OSError:
            pass
    dist.barrier()
    t0 = time.perf_counter()
    sd = state()
    dcp.load(sd, checkpoint_id=a.dir)
    set_model_state_dict(model, sd["model"])
    set_optimizer_state_dict(model, opt, sd["optim"])
    dist.barrier()
    load_s = time.perf_counter() - t0
    if rank == 0:
        size = sum(os.path.getsize(os.path.join(a.dir, f)) for f in os.listdir(a.dir))
        print(f"RESULT world={a.world} save_s={save_s:.3f} load_s={load_s:.3f} bytes={size}",
              flush=True)
    dist.barrier()
    dist.destroy_process_group()


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--world", type=int, default=4)
    p.add_argument("--dir", required=True)
    p.add_argument("--port", type=int, default=29531)
    for k in ("vocab", "dim", "layers", "heads"):
        p.add_argument(f"--{k}", type=int, required=True)
    a = p.parse_args()
    shutil.rmtree(a.dir, ignore_errors=True)
    mp.spawn(run, args=(a,), nprocs=a.world)
    shutil.rmtree(a.dir, ignore_errors=True)


if __name__ == "__main__":
    main()
