"""Checks that PyTorch's FSDP2 on CPU over gloo averages gradients over ranks (pytorch issue
162338 reported sums). AdamW barely sees the difference (it divides by the gradient's scale), so
loss parity alone could hide it: this compares the gradients themselves with one process's.

  python fsdp2_gloo_averages.py [WORLD]     exits 0 when every gradient matches within 1e-5
"""
import os, sys

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "bench", "reference"))
from py_minillm import MiniLLM, synthetic_batch  # noqa: E402
from run_checked import free_port  # noqa: E402

VOCAB, DIM, LAYERS, HEADS, SEQ, PER_RANK = 512, 64, 2, 4, 16, 2


def loss_of(model, tok, tgt):
    return torch.nn.functional.cross_entropy(model(tok).reshape(-1, VOCAB).float(), tgt.view(-1))


def run(rank, world, port, result):
    torch.set_num_threads(1)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.device_mesh import init_device_mesh

    torch.manual_seed(0)
    reference = MiniLLM(VOCAB, DIM, LAYERS, HEADS)
    model = MiniLLM(VOCAB, DIM, LAYERS, HEADS)
    model.load_state_dict(reference.state_dict())
    mesh = init_device_mesh("cpu", (world,))
    for layer in model.layers:
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)

    tok, tgt = synthetic_batch(0, 0, 0, PER_RANK * world, VOCAB, SEQ)
    loss_of(reference, tok, tgt).backward()  # the whole global batch in one process
    mine = slice(rank * PER_RANK, (rank + 1) * PER_RANK)
    loss_of(model, tok[mine], tgt[mine]).backward()
    worst = 0.0
    for (name, p), (_, q) in zip(model.named_parameters(), reference.named_parameters()):
        full = p.grad.full_tensor()
        err = ((full - q.grad).abs().max() / q.grad.abs().max().clamp_min(1e-12)).item()
        worst = max(worst, err)
        if rank == 0 and err > 1e-5:
            print(f"{name}: relative error {err:.3g} (ratio of norms {full.norm() / q.grad.norm():.3f})")
    if rank == 0:
        result.put(worst)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    world = int(sys.argv[1]) if len(sys.argv) > 1 else 2
    port = free_port()
    # Forked ranks share this process's imports (spawned ones import torch again, seconds each on
    # a small machine); nothing here has run a tensor operation, so no thread pool is lost.
    result = mp.get_context("fork").SimpleQueue()
    try:
        mp.start_processes(run, args=(world, port, result), nprocs=world, start_method="fork")
    except mp.ProcessExitedException as e:
        # gloo's teardown in torch 2.11 occasionally aborts at exit, after the result is out.
        if result.empty():
            raise
        print(f"warning: a rank failed after the result was out: {e}")
    worst = result.get()
    print(f"FSDP2 on gloo, world {world}: worst relative gradient error vs one process {worst:.3g}")
    sys.exit(0 if worst < 1e-5 else 1)
