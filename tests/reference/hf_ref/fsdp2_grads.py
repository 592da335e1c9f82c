"""hf_llama.py fsdp2-grads: are FSDP2's gradients on gloo averaged over the ranks (pytorch issue
162338)? The gradients of W ranks against one process's on the whole global batch."""
import os, sys

import torch
import torch.nn.functional as F

from .common import Fail, add_tokens_dtype, batch_rows, free_port, hf_config, load_transformers, \
    read_tokens, spawn_ranks


def grads_worker(rank, world, a, result):
    """FSDP2's gradients at `world` ranks against one process's on the whole global batch."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    torch.set_num_threads(1)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(a.port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    tokens = read_tokens(a.data_tokens, a.tokens_dtype)
    reference, model = load_transformers(a.hf_dir).train(), load_transformers(a.hf_dir).train()
    vocab = model.config.vocab_size
    mesh = init_device_mesh("cpu", (world,))
    for layer in model.model.layers:
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    inputs, targets = batch_rows(tokens, a.seed, 0, 0, a.batch, a.seq)

    def loss_of(m, x, y):
        return F.cross_entropy(m(input_ids=x, use_cache=False).logits.float().reshape(-1, vocab),
                               y.reshape(-1))
    loss_of(reference, inputs, targets).backward()
    per = a.batch // world
    mine = slice(rank * per, (rank + 1) * per)
    loss_of(model, inputs[mine], targets[mine]).backward()
    worst, ratios = 0.0, []
    for (name, p), (_, q) in zip(model.named_parameters(), reference.named_parameters()):
        full = p.grad.full_tensor()
        err = ((full - q.grad).abs().max() / q.grad.abs().max().clamp_min(1e-30)).item()
        worst = max(worst, err)
        ratios.append((full.norm() / q.grad.norm()).item())
        if rank == 0 and err > 1e-5:
            print(f"{name}: relative error {err:.3g} (ratio of norms {ratios[-1]:.4f})")
    if rank == 0:
        result.put((worst, min(ratios), max(ratios)))
    dist.barrier()
    dist.destroy_process_group()


def run(a):
    hf_config(a.hf_dir)
    read_tokens(a.data_tokens, a.tokens_dtype)
    if a.world < 2 or a.batch % a.world:
        raise Fail(f"--world must be >= 2 and divide --batch {a.batch}")
    a.port = a.port or free_port()
    import torch.multiprocessing as mp
    result = mp.get_context("fork").SimpleQueue()
    try:
        spawn_ranks(grads_worker, (a.world, a, result), a.world,
                    ["torch.distributed.fsdp", "transformers.models.llama.modeling_llama"])
    except mp.ProcessExitedException as e:
        if result.empty():
            raise
        print(f"warning: a rank failed after the result was out: {e}", file=sys.stderr)
    worst, low, high = result.get()
    print(f"FSDP2 on gloo, world {a.world}: worst relative gradient error vs one process "
          f"{worst:.3g}; ratio of gradient norms {low:.6f} .. {high:.6f} (1 = averaged, "
          f"{a.world} = summed)")
    if worst > 1e-5:
        raise Fail("FSDP2's gradients differ from one process's (tolerance 1e-5)")


def add_parser(sub):
    """Adds the fsdp2-grads subcommand to the subparsers `sub`."""
    d = sub.add_parser("fsdp2-grads", help="FSDP2 on gloo: are gradients averaged over ranks? "
                       "(pytorch issue 162338)")
    d.add_argument("--hf-dir", required=True)
    d.add_argument("--data-tokens", required=True)
    add_tokens_dtype(d)
    d.add_argument("--seq", type=int, default=32)
    d.add_argument("--batch", type=int, default=8, help="global batch")
    d.add_argument("--seed", type=int, default=0)
    d.add_argument("--world", type=int, default=2)
    d.add_argument("--port", type=int)
    d.set_defaults(func=run)
