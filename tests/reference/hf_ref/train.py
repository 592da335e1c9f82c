"""hf_llama.py train: the reference training run, train_llama's rules in transformers: one process,
or W processes on gloo under FSDP2 (fully_shard per decoder layer, then the root), DDP, or FSDP2
with PyTorch's tensor parallelism; PEFT's LoRA, torchao's float8 and packed documents as options.
Prints the losses per step, the evaluations and a RESULT line; can save the trained model."""
import contextlib, json, os, shutil, sys, time

import numpy as np
import torch
import torch.nn.functional as F

from .common import TOKENIZER_FILES, Fail, add_tokens_dtype, batch_rows, check_vocab, \
    convert_float8, free_port, hf_config, load_peft, load_transformers, lr_at, packed_arguments, \
    read_tokens, spawn_ranks, transformers_logits, val_loss


def param_groups(named, weight_decay):
    decay = [p for _, p in named if p.dim() >= 2]
    no_decay = [p for _, p in named if p.dim() < 2]
    groups = [{"params": decay, "weight_decay": weight_decay},
              {"params": no_decay, "weight_decay": 0.0}]
    return [g for g in groups if g["params"]]


def evaluate(model, tokens, seq, batch):
    model.eval()
    with torch.no_grad():
        loss, _ = val_loss(lambda inputs: transformers_logits(model, inputs), tokens, seq, batch)
    model.train()
    return loss


def init_gloo(rank, world, port):
    """Joins the gloo group of `world` ranks: at torchrun's address when it launched this
    process (RANK set), else at 127.0.0.1:`port` for ranks spawned here."""
    import torch.distributed as dist
    if "RANK" not in os.environ:
        os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)


def apply_tensor_parallel(model, tp_mesh):
    """PyTorch's own tensor parallelism on transformers' LlamaForCausalLM, as TorchTitan's Llama
    plan (and transformers' base_model_tp_plan): q, k, v, gate, up column-wise, o and down
    row-wise; the embedding row-wise over the vocabulary; the head column-wise with its logits
    left sharded over the vocabulary for loss_parallel. The heads each rank computes are whole
    (transformers' attention reshapes with -1 heads)."""
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.parallel import (ColwiseParallel, RowwiseParallel,
                                                   parallelize_module)
    tied = model.config.tie_word_embeddings
    parallelize_module(model, tp_mesh, {
        "model.embed_tokens": RowwiseParallel(input_layouts=Replicate()),
        "lm_head": ColwiseParallel(output_layouts=Shard(-1), use_local_output=False),
    })
    if tied:  # parallelize_module made two parameters of the one tensor: the same placement
        model.lm_head.weight = model.model.embed_tokens.weight
    for layer in model.model.layers:
        parallelize_module(layer, tp_mesh, {
            "self_attn.q_proj": ColwiseParallel(), "self_attn.k_proj": ColwiseParallel(),
            "self_attn.v_proj": ColwiseParallel(), "self_attn.o_proj": RowwiseParallel(),
            "mlp.gate_proj": ColwiseParallel(), "mlp.up_proj": ColwiseParallel(),
            "mlp.down_proj": RowwiseParallel(),
        })


def train_worker(rank, world, a, done):
    import torch.distributed as dist
    torch.set_num_threads(a.threads)
    distributed = a.mode != "local"
    if distributed:
        init_gloo(rank, world, a.port)
    tokens = read_tokens(a.data_tokens, a.tokens_dtype)
    mask = np.fromfile(a.loss_mask, dtype=np.uint8) if a.loss_mask else None
    if mask is not None and len(mask) != len(tokens):
        raise Fail(f"--loss-mask {a.loss_mask}: {len(mask)} bytes for {len(tokens)} tokens")
    val_tokens = read_tokens(a.val_tokens, a.tokens_dtype) if a.val_tokens else None
    model = load_transformers(a.hf_dir).train()
    vocab = model.config.vocab_size
    layers = model.model.layers
    if a.lora_adapter:
        # PEFT's LoRA: the base weights frozen, the adapters trainable; FSDP2 on the same layers.
        model = load_peft(model, a.lora_adapter, trainable=True).train()
    if a.float8:
        convert_float8(model, a.float8_skip, a.float8_all_gather, a.float8_recipe)
    check_vocab(tokens, vocab, a.data_tokens)
    if val_tokens is not None:
        check_vocab(val_tokens, vocab, a.val_tokens)
    named = list(model.named_parameters())  # names and order before wrapping
    dp_world, dp_rank = world // a.tp, rank // a.tp  # the TP ranks of one dp rank share a batch
    loss_context = contextlib.nullcontext
    if a.mode == "fsdp2":
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import fully_shard
        if a.tp > 1:
            from torch.distributed.tensor.parallel import loss_parallel
            mesh2 = init_device_mesh("cpu", (dp_world, a.tp), mesh_dim_names=("dp", "tp"))
            apply_tensor_parallel(model, mesh2["tp"])
            mesh = mesh2["dp"]
            loss_context = loss_parallel
        else:
            mesh = init_device_mesh("cpu", (world,))
        for layer in layers:
            fully_shard(layer, mesh=mesh)
        fully_shard(model, mesh=mesh)
        named = list(model.named_parameters())  # the same names, now DTensor shards
    elif a.mode == "ddp":
        model = torch.nn.parallel.DistributedDataParallel(model)
        named = list(model.module.named_parameters())
    named = [(n, p) for n, p in named if p.requires_grad]  # LoRA: the adapters only
    opt = torch.optim.AdamW(param_groups(named, a.weight_decay), lr=a.lr, betas=(0.9, 0.95),
                            eps=1e-8, fused=True)
    per_rank = a.batch // dp_world
    metrics = open(a.metrics_out, "w") if a.metrics_out and rank == 0 else None

    def emit(line, record):
        if rank == 0:
            print(line, flush=True)
            if metrics:
                metrics.write(json.dumps(record) + "\n")
                metrics.flush()

    t0 = time.perf_counter()
    loss_value = val_value = None
    for step in range(a.steps):
        lr = lr_at(step, a.steps, a.lr, a.warmup, a.lr_schedule, a.lr_min)
        for g in opt.param_groups:
            g["lr"] = lr
        inputs, targets = batch_rows(tokens, a.seed, step, dp_rank * per_rank, per_rank, a.seq,
                                     mask)
        opt.zero_grad(set_to_none=True)
        with loss_context():
            packed = {} if a.document_start_id is None else packed_arguments(inputs, a.document_start_id)
            logits = model(input_ids=inputs, use_cache=False, **packed).logits
            if mask is not None and not bool((targets != -100).any()):
                loss = logits.sum() * 0  # nothing counted: zero, as the trainer does
            else:
                loss = F.cross_entropy(logits.float().reshape(-1, vocab), targets.reshape(-1))
            loss.backward()
        opt.step()
        if hasattr(loss, "full_tensor"):  # a DTensor under loss_parallel
            loss = loss.full_tensor()
        reported = loss.detach().clone()
        if distributed:
            dist.all_reduce(reported, op=dist.ReduceOp.SUM)  # gloo has no AVG
            reported /= world
        loss_value = reported.item()
        emit(f"step {step} loss {loss_value:.9g} lr {lr:.9g}",
             {"step": step, "loss": loss_value, "lr": lr})
        last = step == a.steps - 1
        if val_tokens is not None and ((a.eval_every and (step + 1) % a.eval_every == 0) or last):
            val_value = evaluate(model, val_tokens, a.seq, a.eval_batch)
            emit(f"val_loss {val_value:.9g} step {step}", {"step": step, "val_loss": val_value})
    elapsed = time.perf_counter() - t0
    # Peak resident memory, the largest over ranks (ru_maxrss: KiB on Linux).
    import resource
    peak = torch.tensor([resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0])
    if distributed:
        dist.all_reduce(peak, op=dist.ReduceOp.MAX)
    if a.save_final:
        save_final(model, a, rank)
    if rank == 0:
        val = f" val_loss={val_value:.9g}" if val_value is not None else ""
        print(f"RESULT steps={a.steps} final_loss={loss_value:.9g}{val} time_s={elapsed:.2f} "
              f"peak_rss_mib={peak.item():.0f}",
              flush=True)
        if metrics:
            metrics.close()
        if done is not None:
            done.put(True)
    if distributed:
        # Every rank gets here before any tears gloo down (a rank destroying its group while a
        # peer's gloo thread is still busy was seen to abort at exit in torch 2.11).
        dist.barrier()
        dist.destroy_process_group()


def save_final(model, a, rank):
    """The trained weights as a Hugging Face directory (fp32), with the source's tokenizer files."""
    if a.mode == "fsdp2":
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict
        state = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True,
                                                                     cpu_offload=True))
        inner = model
    else:
        inner = model.module if a.mode == "ddp" else model
        state = inner.state_dict()
    if rank != 0:
        return
    from transformers import LlamaForCausalLM
    fresh = LlamaForCausalLM(inner.config)
    missing, unexpected = fresh.load_state_dict(state, strict=False)
    if inner.config.tie_word_embeddings:
        missing = [k for k in missing if k != "lm_head.weight"]
    if missing or unexpected:
        raise Fail(f"--save-final: missing {missing}, unexpected {unexpected}")
    os.makedirs(a.save_final, exist_ok=True)
    fresh.to(torch.float32).save_pretrained(a.save_final)
    cfg_path = os.path.join(a.save_final, "config.json")
    with open(cfg_path) as f:
        cfg = json.load(f)
    with open(os.path.join(a.hf_dir, "config.json")) as f:
        src = json.load(f)
    for k in ["rope_theta", "rope_scaling", "tie_word_embeddings"]:  # keep what mlx_lm reads
        if k in src:
            cfg[k] = src[k]
    with open(cfg_path, "w") as f:
        json.dump(cfg, f, indent=2, sort_keys=True)
        f.write("\n")
    for name in TOKENIZER_FILES:
        if os.path.isfile(os.path.join(a.hf_dir, name)):
            shutil.copy(os.path.join(a.hf_dir, name), os.path.join(a.save_final, name))
    print(f"saved the final weights to {a.save_final}", flush=True)


def run(a):
    hf_config(a.hf_dir)
    read_tokens(a.data_tokens, a.tokens_dtype)  # fail early, in this process
    if a.val_tokens:
        read_tokens(a.val_tokens, a.tokens_dtype)
    if "RANK" in os.environ:  # under torchrun or scripts/launch.sh: the launcher's world
        a.world = int(os.environ["WORLD_SIZE"])
    if a.world < 1 or a.batch < 1 or a.steps < 1 or a.seq < 1:
        raise Fail("--world, --batch, --steps and --seq must be positive")
    if a.batch % a.world:
        raise Fail(f"--batch {a.batch} (global) does not divide by --world {a.world}")
    if a.mode is None:
        a.mode = "local" if a.world == 1 else "fsdp2"
    if a.mode == "local" and a.world != 1:
        raise Fail("--mode local runs one process: use --mode fsdp2 or ddp for --world > 1")
    if a.tp < 1 or a.world % a.tp or a.batch % (a.world // a.tp):
        raise Fail(f"--tp {a.tp} must divide --world {a.world}, and the data-parallel ranks "
                   f"(world / tp) the global --batch {a.batch}")
    if a.tp > 1 and (a.val_tokens or a.save_final):
        raise Fail("--tp trains only here: no --val-tokens or --save-final")
    if a.document_start_id is not None and a.val_tokens:
        raise Fail("--document-start-id packs the training windows only (no --val-tokens)")
    if a.lora_adapter and (a.tp > 1 or a.save_final):
        raise Fail("--lora-adapter trains without --tp and --save-final")
    if a.float8 and (a.tp > 1 or a.lora_adapter or a.save_final):
        raise Fail("--float8 trains without --tp, --lora-adapter and --save-final")
    if a.tp > 1 and a.mode != "fsdp2":
        raise Fail("--tp needs --mode fsdp2 (PyTorch's tensor parallelism under fully_shard)")
    if a.port is None:
        a.port = free_port()
    if "RANK" in os.environ:  # under torchrun or scripts/launch.sh
        train_worker(int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"]), a, None)
    elif a.world == 1:
        train_worker(0, 1, a, None)
    else:
        import torch.multiprocessing as mp
        done = mp.get_context("fork").SimpleQueue()
        preload = ["torch.distributed.fsdp", "transformers.models.llama.modeling_llama"]
        preload += ["peft"] if a.lora_adapter else []
        preload += ["torchao.float8"] if a.float8 else []
        try:
            spawn_ranks(train_worker, (a.world, a, done), a.world, preload)
        except mp.ProcessExitedException as e:
            # gloo's teardown in torch 2.11 occasionally aborts at exit, after results are out.
            if done.empty():
                raise
            print(f"warning: a rank failed after the run finished: {e}", file=sys.stderr)


def add_parser(sub):
    """Adds the train subcommand to the subparsers `sub`."""
    t = sub.add_parser("train", help="the reference training run")
    t.add_argument("--hf-dir", required=True)
    t.add_argument("--data-tokens", required=True)
    t.add_argument("--loss-mask", default="",
                   help="one byte per token: 0 leaves the target out (labels -100)")
    add_tokens_dtype(t)
    t.add_argument("--seq", type=int, required=True)
    t.add_argument("--batch", type=int, required=True, help="global batch (sequences per step)")
    t.add_argument("--steps", type=int, required=True)
    t.add_argument("--lr", type=float, default=1e-3)
    t.add_argument("--warmup", type=int, default=0)
    t.add_argument("--lr-schedule", choices=["cosine", "constant"], default="cosine")
    t.add_argument("--lr-min", type=float, default=0.0)
    t.add_argument("--weight-decay", type=float, default=0.1)
    t.add_argument("--seed", type=int, default=0, help="seed of the batch draws")
    t.add_argument("--world", type=int, default=1, help="ranks to spawn (unless under torchrun)")
    t.add_argument("--mode", choices=["local", "fsdp2", "ddp"],
                   help="default: local at --world 1, fsdp2 above")
    t.add_argument("--metrics-out", help="JSONL of the per-step losses and evaluations")
    t.add_argument("--save-final", help="write the trained model here (Hugging Face format)")
    t.add_argument("--val-tokens", help="validation token file")
    t.add_argument("--eval-every", type=int, default=0, help="steps between evaluations "
                   "(0: only after the last step; needs --val-tokens)")
    t.add_argument("--eval-batch", type=int, default=8)
    t.add_argument("--threads", type=int, default=1, help="torch threads per rank")
    t.add_argument("--port", type=int, help="gloo rendezvous port (default: a free one)")
    t.add_argument("--document-start-id", type=int,
                   help="packing: positions restart and attention stays within each document at "
                        "this token id (position_ids and a 4-D block-causal attention mask)")
    t.add_argument("--lora-adapter", help="PEFT adapter directory (make-lora): train its "
                   "adapters on the frozen model")
    t.add_argument("--tp", type=int, default=1,
                   help="tensor parallelism (fsdp2 only): PyTorch's parallelize_module on a "
                        "(world / tp, tp) mesh, loss_parallel")
    t.add_argument("--float8", action="store_true",
                   help="torchao's float8 training (Float8Linear, recipe tensorwise) on the "
                        "decoder layers' Linears")
    t.add_argument("--float8-skip", default="",
                   help="with --float8: Linears left out, by name (k_proj,v_proj)")
    t.add_argument("--float8-all-gather", action="store_true",
                   help="with --float8: FSDP2 all-gathers those weights in float8 (torchao's "
                        "enable_fsdp_float8_all_gather)")
    t.add_argument("--float8-recipe", choices=["tensorwise", "rowwise"], default="tensorwise",
                   help="with --float8: torchao's recipe (rowwise on the CPU: its emulation)")
    t.set_defaults(func=run)
