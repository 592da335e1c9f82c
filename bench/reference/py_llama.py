"""PyTorch reference for the speed and memory of training the Llama model, to run side by side
with build/bin/train_llama: Hugging Face transformers' LlamaForCausalLM, one process (local), DDP
or FSDP2 (fully_shard on every decoder layer, then the root) over gloo on CPU, fused AdamW.

  python3 py_llama.py --mode local [--steps 8] [--batch 2]
  python3 py_llama.py --mode fsdp2 --world 2          (spawns its ranks; OMP_NUM_THREADS=1)
  python3 py_llama.py --mode ddp --world 2 --data-tokens train.bin
  python3 py_llama.py --mode fsdp2 --world 4 --tp 2     (PyTorch's TP + FSDP2 on a 2 x 2 mesh)

Preset `small` (the default): hidden 512, 8 layers, 8 heads, 2 KV heads, intermediate 1536,
vocab 32000, seq 256, untied head (56.9M parameters); `tiny` is a seconds-long smoke size.
--batch is per rank. --data-tokens uses train_llama's batches (hf_llama.py's splitmix64 draws over
a nanoGPT token file); without it, uniform random ids from a fixed seed. --hf-dir starts from a
saved model instead of a random one (its config replaces the preset's sizes). Weight decay 0.1 on
parameters with dim >= 2, betas (0.9, 0.95), constant --lr.

Every step prints `step N loss X time Ts` (loss averaged over ranks); the last line is
machine-readable, as bench/reference/py_minillm.py's:
  RESULT mode=... world=... tokens_per_s=... median_step_s=... peak_mem_mb=... mfu=0.000 \
      peak_mem_mb_ranks=a,b,... params=...
tokens_per_s is the global batch's tokens over the median step time (the first two steps left
out when there are more than four); peak_mem_mb is the largest peak RSS of a rank (MiB), and
peak_mem_mb_ranks each rank's. mfu is 0 on CPU (no peak to divide by).

On a GPU (--device cuda, NCCL, one GPU per rank, under torchrun: scripts/gpu_check.sh's llama
stage): --dtype bf16 is FSDP2's MixedPrecisionPolicy(param_dtype=bf16, reduce_dtype=fp32) with
fp32 master weights, as train_llama --dtype bf16; --activation-checkpointing wraps every decoder
layer in checkpoint_wrapper before fully_shard, as train_llama checkpoints every block;
--lora-adapter trains PEFT's adapters alone; --liger is transformers + Liger-Kernel (its
apply_liger_kernel_to_llama before the model is built: Triton kernels for RMSNorm, RoPE and
SwiGLU, and its fused linear cross-entropy, which the patched forward computes from the hidden
states given the targets as shift_labels, without the logits). A step is timed between two device
synchronisations (zero_grad, forward, backward, fused AdamW), peak_mem_mb is the largest
torch.cuda.max_memory_allocated of a rank, and mfu divides the training FLOPs per token
(train_flops_per_token in src/models/llama/model.cpp: 6 x the matmul parameters + 12 x layers x
q width x seq) by 989 TFLOP/s (dense bf16 per H100/H200).
"""
import argparse, contextlib, os, resource, statistics, sys, time

import torch
import torch.distributed as dist
import torch.nn.functional as F

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..",
                                "tests", "reference"))
import hf_llama  # noqa: E402

PRESETS = {
    "small": dict(vocab=32000, hidden=512, layers=8, heads=8, kv_heads=2, intermediate=1536,
                  seq=256, batch=2),
    "tiny": dict(vocab=1000, hidden=64, layers=2, heads=4, kv_heads=2, intermediate=160,
                 seq=64, batch=2),
}


def build_model(a):
    from transformers import LlamaConfig, LlamaForCausalLM
    from transformers.utils import logging
    logging.set_verbosity_error()
    if a.hf_dir:
        return hf_llama.load_transformers(a.hf_dir).train()
    config = LlamaConfig(vocab_size=a.vocab, hidden_size=a.hidden, num_hidden_layers=a.layers,
                         num_attention_heads=a.heads, num_key_value_heads=a.kv_heads,
                         intermediate_size=a.intermediate, max_position_embeddings=max(2048, a.seq),
                         rms_norm_eps=1e-5, tie_word_embeddings=False, initializer_range=0.02)
    config._attn_implementation = "sdpa"
    torch.manual_seed(0)
    return LlamaForCausalLM(config).train()


def train_flops_per_token(config, seq):
    """train_flops_per_token of src/models/llama/model.cpp, from a transformers LlamaConfig."""
    d, layers = config.hidden_size, config.num_hidden_layers
    head = getattr(config, "head_dim", None) or d // config.num_attention_heads
    q, kv = config.num_attention_heads * head, config.num_key_value_heads * head
    layer = d * q + 2 * d * kv + q * d + 3 * d * config.intermediate_size
    return 6.0 * (layers * layer + config.vocab_size * d) + 12.0 * layers * q * seq


def run(rank, world, a):
    torch.set_num_threads(a.threads)
    distributed = a.mode != "local"
    cuda = a.device == "cuda"
    if cuda:
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
        if "RANK" not in os.environ:
            os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(a.port))
        dist.init_process_group("nccl", rank=rank, world_size=world)
        distributed = True
    elif distributed:
        hf_llama.init_gloo(rank, world, a.port)
    if a.liger:
        # Patches transformers' Llama classes and LlamaForCausalLM.forward: before the model.
        from liger_kernel.transformers import apply_liger_kernel_to_llama
        apply_liger_kernel_to_llama(rope=True, rms_norm=True, swiglu=True, cross_entropy=False,
                                    fused_linear_cross_entropy=True)
    model = build_model(a)
    vocab = model.config.vocab_size
    flops_per_token = train_flops_per_token(model.config, a.seq)
    layers = model.model.layers
    if a.lora_adapter:
        # PEFT's LoRA: the base weights frozen, the adapters trainable; FSDP2 on the same layers.
        model = hf_llama.load_peft(model, a.lora_adapter, trainable=True).train()
    if a.float8:
        hf_llama.convert_float8(model, a.float8_skip)  # torchao's Float8Linear, before wrapping
    if cuda:
        model = model.cuda()
    params = sum(p.numel() for p in model.parameters())
    named = list(model.named_parameters())
    if a.activation_checkpointing:
        from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper
        parent = layers
        for i, layer in enumerate(list(parent)):
            parent[i] = checkpoint_wrapper(layer)
        layers = parent
    if a.mode == "ddp":
        model = torch.nn.parallel.DistributedDataParallel(model)
    elif a.mode == "fsdp2":
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import fully_shard
        if a.tp > 1:
            # PyTorch's own 2-D: parallelize_module (TorchTitan's Llama plan) on the "tp" dim,
            # fully_shard on the "dp" dim, the loss over vocabulary shards (loss_parallel).
            mesh2 = init_device_mesh("cpu", (world // a.tp, a.tp), mesh_dim_names=("dp", "tp"))
            hf_llama.apply_tensor_parallel(model, mesh2["tp"])
            mesh = mesh2["dp"]
        else:
            mesh = init_device_mesh(a.device, (world,))
        kwargs = {}
        if a.dtype == "bf16":
            from torch.distributed.fsdp import MixedPrecisionPolicy
            kwargs["mp_policy"] = MixedPrecisionPolicy(param_dtype=torch.bfloat16,
                                                       reduce_dtype=torch.float32)
        for layer in layers:
            fully_shard(layer, mesh=mesh, **kwargs)
        fully_shard(model, mesh=mesh, **kwargs)
        named = list(model.named_parameters())
    named = [(n, p) for n, p in named if p.requires_grad]  # LoRA: the adapters only
    opt = torch.optim.AdamW(hf_llama.param_groups(named, 0.1), lr=a.lr, betas=(0.9, 0.95), eps=1e-8,
                            fused=True)
    tokens = hf_llama.read_tokens(a.data_tokens, a.tokens_dtype) if a.data_tokens else None
    if tokens is not None:
        hf_llama.check_vocab(tokens, vocab, a.data_tokens)
    dp_world, dp_rank = world // a.tp, rank // a.tp  # the TP ranks of one dp rank share a batch
    g = torch.Generator().manual_seed(1 + dp_rank)
    loss_context = contextlib.nullcontext
    if a.tp > 1:
        from torch.distributed.tensor.parallel import loss_parallel
        loss_context = loss_parallel
    times = []
    for step in range(a.steps):
        if tokens is not None:
            inputs, targets = hf_llama.batch_rows(tokens, a.seed, step, dp_rank * a.batch, a.batch,
                                                  a.seq)
        else:
            rows = torch.randint(0, vocab, (a.batch, a.seq + 1), generator=g)
            inputs, targets = rows[:, :-1].contiguous(), rows[:, 1:].contiguous()
        if cuda:
            inputs, targets = inputs.cuda(), targets.cuda()
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        with loss_context():
            if a.liger:  # the targets are already shifted: shift_labels, not labels
                loss = model(input_ids=inputs, shift_labels=targets, use_cache=False).loss
            else:
                logits = model(input_ids=inputs, use_cache=False).logits
                loss = F.cross_entropy(logits.float().reshape(-1, vocab), targets.reshape(-1))
            loss.backward()
        opt.step()
        if cuda:
            torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
        if hasattr(loss, "full_tensor"):
            loss = loss.full_tensor()
        reported = loss.detach().clone()
        if distributed:
            dist.all_reduce(reported, op=dist.ReduceOp.SUM)  # gloo has no AVG
            reported /= world
        if rank == 0:
            print(f"step {step} loss {reported.item():.9g} time {times[-1]:.3f}s", flush=True)
    if cuda:
        peak = torch.cuda.max_memory_allocated() / 2**20
    else:
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB -> MiB
    peaks = [peak]
    if distributed:
        peaks = [None] * world
        dist.all_gather_object(peaks, peak)
    med = statistics.median(times[2:] if len(times) > 4 else times)
    tok_s = a.batch * a.seq * dp_world / med
    mfu = tok_s / world * flops_per_token / 989e12 if cuda else 0.0
    if rank == 0:
        print(f"RESULT mode={a.mode} world={world} tokens_per_s={tok_s:.1f} median_step_s={med:.4f} "
              f"peak_mem_mb={max(peaks):.0f} mfu={mfu:.4f} "
              f"peak_mem_mb_ranks={','.join(f'{p:.0f}' for p in peaks)} params={params}", flush=True)
    if distributed:
        dist.barrier()  # every rank gets here before any tears gloo down
        dist.destroy_process_group()


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--mode", choices=["local", "ddp", "fsdp2"], default="local")
    p.add_argument("--preset", choices=sorted(PRESETS), default="small")
    p.add_argument("--world", type=int, default=1, help="ranks to spawn when not under torchrun")
    for k in ["vocab", "hidden", "layers", "heads", "kv_heads", "intermediate", "seq", "batch"]:
        p.add_argument(f"--{k.replace('_', '-')}", dest=k, type=int)
    p.add_argument("--steps", type=int, default=8)
    p.add_argument("--tp", type=int, default=1,
                   help="with --mode fsdp2: tensor parallelism over groups of this many ranks "
                        "(a (world / tp, tp) mesh); --batch is then per data-parallel rank")
    p.add_argument("--lr", type=float, default=3e-4)
    p.add_argument("--threads", type=int, default=1, help="torch threads per rank")
    p.add_argument("--port", type=int, help="gloo rendezvous port (default from the pid)")
    p.add_argument("--hf-dir", help="start from this Hugging Face model (its sizes)")
    p.add_argument("--data-tokens", help="nanoGPT token file (train_llama's batches)")
    p.add_argument("--tokens-dtype", choices=sorted(hf_llama.TOKEN_DTYPES), default="uint16")
    p.add_argument("--seed", type=int, default=0, help="seed of the batch draws (--data-tokens)")
    p.add_argument("--device", choices=["cpu", "cuda"], default="cpu",
                   help="cuda: NCCL, a GPU per rank (LOCAL_RANK)")
    p.add_argument("--dtype", choices=["fp32", "bf16"], default="fp32",
                   help="bf16: FSDP2's bf16 compute, fp32 reduction and master weights")
    p.add_argument("--activation-checkpointing", action="store_true",
                   help="checkpoint every decoder layer (checkpoint_wrapper)")
    p.add_argument("--lora-adapter", help="PEFT adapter directory: train its adapters alone")
    p.add_argument("--float8", action="store_true",
                   help="torchao's float8 training (Float8Linear, recipe tensorwise) on the "
                        "decoder layers' Linears, as train_llama --float8")
    p.add_argument("--float8-skip", default="", help="with --float8: Linears left out (k_proj,...)")
    p.add_argument("--liger", action="store_true",
                   help="transformers + Liger-Kernel (RMSNorm, RoPE, SwiGLU, fused linear "
                        "cross-entropy; Triton: --device cuda)")
    a = p.parse_args()
    for k, v in PRESETS[a.preset].items():
        if getattr(a, k) is None:
            setattr(a, k, v)
    try:
        if a.hf_dir:
            hf_llama.hf_config(a.hf_dir)
        if a.data_tokens:
            hf_llama.read_tokens(a.data_tokens, a.tokens_dtype)
    except hf_llama.Fail as e:
        sys.exit(f"py_llama.py: error: {e}")
    if a.steps < 1 or a.batch < 1 or a.seq < 1 or a.world < 1:
        sys.exit("py_llama.py: error: --steps, --batch, --seq and --world must be positive")
    if a.dtype == "bf16" and a.mode != "fsdp2":
        sys.exit("py_llama.py: error: --dtype bf16 is FSDP2's mixed precision (--mode fsdp2)")
    if a.float8 and (a.tp > 1 or a.lora_adapter):
        sys.exit("py_llama.py: error: --float8 trains without --tp and --lora-adapter")
    if a.liger and (a.device != "cuda" or a.tp > 1 or a.float8 or a.lora_adapter):
        sys.exit("py_llama.py: error: --liger runs on a GPU (--device cuda: Triton), without "
                 "--tp, --float8 and --lora-adapter")
    if a.tp > 1 and (a.device == "cuda" or a.activation_checkpointing or a.lora_adapter):
        sys.exit("py_llama.py: error: --tp runs on the CPU without checkpointing or LoRA")
    if a.tp < 1 or a.world % a.tp or (a.tp > 1 and a.mode != "fsdp2"):
        sys.exit(f"py_llama.py: error: --tp {a.tp} must divide --world {a.world} (with --mode fsdp2)")
    if a.port is None:
        a.port = 20000 + os.getpid() % 20000
    if "RANK" in os.environ:  # under torchrun or scripts/launch.sh
        run(int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"]), a)
    elif a.mode == "local" or a.world == 1:
        if a.world != 1:
            sys.exit("py_llama.py: error: --mode local runs one process (--world 1)")
        run(0, 1, a)
    else:
        import torch.multiprocessing as mp
        mp.spawn(run, args=(a.world, a), nprocs=a.world)


if __name__ == "__main__":
    main()
