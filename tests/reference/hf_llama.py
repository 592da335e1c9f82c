"""Reference programs for the Llama-family model: Hugging Face transformers' LlamaForCausalLM (and
MLX's mlx_lm llama) running the exact rules that build/bin/train_llama follows, so the C++ trainer
can be checked against the real outside programs.

  python hf_llama.py make-tiny --out DIR --vocab 1001 --hidden 64 --layers 2 --heads 4 \
      --kv-heads 2 --intermediate 128 [--tied] [--seed 0] [--dtype fp32|bf16|fp16] \
      [--max-shard-size 200KB] [--tokenizer tokenizer.model] [--head-dim D] [--rope-theta T] \
      [--attention-bias] [--mlp-bias] [--init-std 0.1] [--force] \
      [--rope-scaling '{"rope_type": "llama3", "factor": 8, ...}' [--rope-key rope_scaling]]
  python hf_llama.py logits --hf-dir DIR --tokens val.bin --seq 32 --count 4 --out logits.safetensors \
      [--framework transformers|mlx] [--tokens-dtype uint16|uint32]
  python hf_llama.py val-loss --framework transformers|mlx --hf-dir DIR --tokens val.bin --seq 32 [--json]
  python hf_llama.py generate --hf-dir DIR [--lora-adapter A] (--chat TEXT [--system S] | --ids 1,2)
      [--max-new-tokens N]
  python hf_llama.py fsdp2-grads --hf-dir DIR --data-tokens train.bin [--world 2] [--seq 32] [--batch 8]
  python hf_llama.py train --hf-dir DIR --data-tokens train.bin --seq 32 --batch 8 --steps 10 \
      --lr 1e-2 [--warmup 0] [--lr-schedule cosine|constant] [--lr-min 0] [--weight-decay 0.1] \
      [--seed 0] [--world W] [--mode local|fsdp2|ddp] [--tp T] [--metrics-out F] \
      [--save-final DIR] [--val-tokens val.bin --eval-every N]

The contract (shared with train_llama):
- Token files are nanoGPT's raw format: little-endian uint16 ids (uint32 with --tokens-dtype uint32).
- Batches: sequence i (global index 0..B-1) of step s starts at draw(seed, s, i) % (n_tokens - seq),
  draw = splitmix64 nested (draw() below); inputs tokens[start:start+seq], targets shifted by one.
  Rank r of W takes sequences [r*B/W, (r+1)*B/W).
- Loss: cross entropy on fp32 logits, the mean over the rank's predictions; gradients averaged over
  ranks (so the global mean). The printed loss is the mean over ranks. With --tp T the ranks form a
  (W / T, T) mesh: data-parallel rank r // T takes sequences as rank r // T of W / T above.
- AdamW(fused=True, betas=(0.9, 0.95), eps=1e-8); weight decay only on parameters with dim >= 2;
  groups in named_parameters() order, the decay group first.
- LR of step s: warmup lr*(s+1)/warmup for s < warmup, then constant lr or cosine
  lr_min + 0.5*(lr-lr_min)*(1+cos(pi*(s-warmup)/max(1, steps-warmup))).
- Validation: windows tokens[i*seq : i*seq+seq+1], i = 0 .. (n-1)//seq - 1; the loss is the sum of
  every prediction's cross entropy over their count.

train prints `step S loss X lr Y` per step (loss to 9 significant digits), `val_loss X` at
evaluations, and a last line `RESULT steps=... final_loss=... [val_loss=...] time_s=...
peak_rss_mib=...` (the largest rank's); --metrics-out
writes the same as JSONL ({"step", "loss", "lr"} and {"step", "val_loss"}). At W > 1 it spawns W
processes on gloo (CPU): fsdp2 applies torch.distributed.fsdp.fully_shard to every decoder layer
then to the root, ddp wraps in DistributedDataParallel. Exits non-zero on any error.

Models compute in fp32 whatever the stored dtype. make-tiny draws every weight from N(0, init_std)
(norm weights 1 + N(0, init_std), biases N(0, init_std)) so that no weight has a default value a
loader bug could hide behind, and writes rope_theta both in transformers 5's rope_parameters and at
the top level of config.json (mlx_lm's llama reads only the latter).
"""
import argparse, contextlib, json, math, os, shutil, sys, time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from run_checked import free_port  # noqa: E402
import torch
import torch.nn.functional as F

MASK64 = (1 << 64) - 1
TOKEN_DTYPES = {"uint16": "<u2", "uint32": "<u4"}
TOKENIZER_FILES = ["tokenizer.model", "tokenizer.json", "tokenizer_config.json",
                   "special_tokens_map.json", "added_tokens.json", "chat_template.jinja",
                   "vocab.json", "merges.txt"]


class Fail(Exception):
    """A user-facing error: main() prints it and exits 1."""


# ---------------------------------------------------------------- data: the shared contract

def mix(x):
    """splitmix64's finaliser, all arithmetic mod 2^64."""
    x = (x + 0x9E3779B97F4A7C15) & MASK64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & MASK64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & MASK64
    return x ^ (x >> 31)


def draw(seed, step, index):
    return mix(mix(mix(seed & MASK64) ^ step) ^ index)


def read_tokens(path, dtype="uint16"):
    """The token file as a 1-D numpy array (nanoGPT raw format, little endian)."""
    if not os.path.isfile(path):
        raise Fail(f"token file not found: {path}")
    size = os.path.getsize(path)
    item = np.dtype(TOKEN_DTYPES[dtype]).itemsize
    if size % item:
        raise Fail(f"{path}: {size} bytes is not a whole number of {dtype} tokens "
                   f"(wrong --tokens-dtype?)")
    if size == 0:
        raise Fail(f"{path}: empty token file")
    return np.fromfile(path, dtype=TOKEN_DTYPES[dtype])


def check_vocab(tokens, vocab, path):
    top = int(tokens.max())
    if top >= vocab:
        raise Fail(f"{path}: token id {top} >= the model's vocab_size {vocab} "
                   f"(wrong tokenizer or --tokens-dtype?)")


def batch_rows(tokens, seed, step, first, count, seq, mask=None):
    """Sequences [first, first+count) of step's global batch: (inputs, targets), int64 [count, seq].
    With a loss mask (one byte per token), targets whose mask byte is 0 are -100 (transformers'
    ignored labels)."""
    n = len(tokens)
    if n <= seq:
        raise Fail(f"the token file has {n} tokens, need more than seq={seq}")
    rows, masks = [], []
    for i in range(first, first + count):
        start = draw(seed, step, i) % (n - seq)
        rows.append(tokens[start:start + seq + 1].astype(np.int64))
        if mask is not None:
            masks.append(mask[start + 1:start + seq + 1])
    t = torch.from_numpy(np.stack(rows))
    inputs, targets = t[:, :-1].contiguous(), t[:, 1:].contiguous()
    if mask is not None:
        targets[torch.from_numpy(np.stack(masks)) == 0] = -100
    return inputs, targets


def val_window_count(n_tokens, seq):
    return (n_tokens - 1) // seq


def val_windows(tokens, seq, first, count):
    """Validation windows [first, first+count): (inputs, targets), int64 [count, seq]."""
    rows = [tokens[i * seq:i * seq + seq + 1].astype(np.int64) for i in range(first, first + count)]
    t = torch.from_numpy(np.stack(rows))
    return t[:, :-1].contiguous(), t[:, 1:].contiguous()


def lr_at(step, steps, lr, warmup, schedule, lr_min):
    if step < warmup:
        return lr * (step + 1) / warmup
    if schedule == "constant":
        return lr
    progress = (step - warmup) / max(1, steps - warmup)
    return lr_min + 0.5 * (lr - lr_min) * (1 + math.cos(math.pi * progress))


# ---------------------------------------------------------------- models

def hf_config(hf_dir):
    """config.json of a Hugging Face model directory, after checking the weights are there."""
    if not os.path.isdir(hf_dir):
        raise Fail(f"model directory not found: {hf_dir}")
    cfg_path = os.path.join(hf_dir, "config.json")
    if not os.path.isfile(cfg_path):
        raise Fail(f"{hf_dir}: no config.json")
    if not any(os.path.isfile(os.path.join(hf_dir, f))
               for f in ["model.safetensors", "model.safetensors.index.json"]):
        raise Fail(f"{hf_dir}: neither model.safetensors nor model.safetensors.index.json")
    with open(cfg_path) as f:
        cfg = json.load(f)
    if cfg.get("model_type") != "llama":
        raise Fail(f"{cfg_path}: model_type {cfg.get('model_type')!r}, expected 'llama'")
    return cfg


def load_transformers(hf_dir):
    """LlamaForCausalLM in fp32 with PyTorch's scaled_dot_product_attention (transformers' sdpa)."""
    hf_config(hf_dir)
    from transformers import LlamaForCausalLM
    from transformers.utils import logging
    logging.set_verbosity_error()
    logging.disable_progress_bar()
    model = LlamaForCausalLM.from_pretrained(hf_dir, dtype=torch.float32, attn_implementation="sdpa")
    return model.eval()


def convert_float8(model, skip, all_gather=False):
    """torchao's float8 training (recipe "tensorwise", its default) on the decoder layers'
    Linears but those named in `skip`, as train_llama --float8 [--float8-skip] converts them: the
    head stays (TorchTitan's filter_fqns=["output"]). all_gather: FSDP2 gathers those weights in
    float8 (enable_fsdp_float8_all_gather), as train_llama --float8-all-gather."""
    from torchao.float8 import Float8LinearConfig, convert_to_float8_training
    skip = [s for s in skip.split(",") if s]

    def convert(module, fqn):
        return ".layers." in f".{fqn}" and fqn.split(".")[-1] not in skip
    config = Float8LinearConfig(enable_fsdp_float8_all_gather=all_gather)
    convert_to_float8_training(model, config=config, module_filter_fn=convert)


def transformers_logits(model, inputs):
    return model(input_ids=inputs, use_cache=False).logits.float()


def packed_arguments(inputs, start_id):
    """Packing as a collator does it: position_ids restarting at every `start_id` (and at the
    window's first token) and a 4-D boolean mask [batch, 1, seq, seq] that is causal within each
    document, for model(input_ids, position_ids=..., attention_mask=...)."""
    batch, seq = inputs.shape
    index = torch.arange(seq).expand(batch, seq)
    starts = inputs == start_id
    first = torch.where(starts, index, torch.zeros_like(index)).cummax(dim=1).values
    document = starts.long().cumsum(dim=1)
    mask = (document[:, :, None] == document[:, None, :]) & torch.ones(seq, seq, dtype=torch.bool).tril()
    return dict(position_ids=index - first, attention_mask=mask[:, None])


def load_mlx(hf_dir):
    """mlx_lm's llama in fp32. tie_word_embeddings, rope_theta and rope_scaling are passed
    explicitly: mlx_lm defaults tie_word_embeddings to True (transformers to False) and reads
    only a top-level rope_theta and rope_scaling (transformers 5 writes rope_parameters)."""
    cfg = hf_config(hf_dir)
    try:
        import mlx.core as mx
        from mlx_lm.utils import load_model
    except ImportError as e:
        raise Fail(f"MLX is not installed ({e}): pip install 'mlx[cpu]' mlx-lm")
    from pathlib import Path
    override = {"tie_word_embeddings": bool(cfg.get("tie_word_embeddings", False))}
    # transformers takes rope_scaling whole when given, else rope_parameters.
    rope = cfg.get("rope_scaling") or cfg.get("rope_parameters") or {}
    if "rope_theta" in rope:
        override["rope_theta"] = rope["rope_theta"]
    if rope.get("rope_type", rope.get("type", "default")) != "default":
        override["rope_scaling"] = rope
    model, _ = load_model(Path(hf_dir), model_config=override)
    model.set_dtype(mx.float32)
    mx.eval(model.parameters())
    return model


def mlx_logits(model, inputs):
    import mlx.core as mx
    out = model(mx.array(inputs.numpy().astype(np.int32)))
    mx.eval(out)
    return torch.from_numpy(np.array(out.astype(mx.float32)))


def load_peft(model, adapter_dir, trainable=False):
    """transformers' model with PEFT's adapters from `adapter_dir` (PeftModel.from_pretrained)."""
    try:
        from peft import PeftModel
    except ImportError as e:
        raise Fail(f"PEFT is not installed ({e}): pip install peft")
    return PeftModel.from_pretrained(model, adapter_dir, is_trainable=trainable)


def framework(name, hf_dir, adapter=None):
    """(config, logits function inputs[int64 B, L] -> fp32 torch [B, L, V]); with `adapter`,
    PEFT's adapters on the transformers model."""
    cfg = hf_config(hf_dir)
    if adapter and name != "transformers":
        raise Fail("--lora-adapter needs --framework transformers (PEFT)")
    if name == "transformers":
        model = load_transformers(hf_dir)
        if adapter:
            model = load_peft(model, adapter).eval()

        def run(inputs):
            with torch.no_grad():
                return transformers_logits(model, inputs)
        return cfg, run
    model = load_mlx(hf_dir)
    return cfg, lambda inputs: mlx_logits(model, inputs)


def val_loss(logits_fn, tokens, seq, batch, mask=None):
    """(mean cross entropy over every prediction of every window, number of windows); with a
    loss mask (one byte per token) over the targets whose byte is 1 (the others -100)."""
    n = val_window_count(len(tokens), seq)
    if n < 1:
        raise Fail(f"{len(tokens)} validation tokens hold no window of seq={seq} (+1) tokens")
    total, count = 0.0, 0
    for first in range(0, n, batch):
        inputs, targets = val_windows(tokens, seq, first, min(batch, n - first))
        if mask is not None:
            m = np.stack([mask[i * seq + 1:i * seq + seq + 1]
                          for i in range(first, first + len(targets))])
            targets[torch.from_numpy(m) == 0] = -100
        logits = logits_fn(inputs)
        total += F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1),
                                 reduction="sum").double().item()
        count += int((targets != -100).sum())
    return total / count, n


# ---------------------------------------------------------------- make-lora

def cmd_make_lora(a):
    """PEFT's LoRA adapters for the model in --hf-dir, as PEFT initialises them (A from
    nn.Linear's kaiming-uniform init under torch.manual_seed(--seed), B zero), saved with
    save_pretrained: the same start for both trainers."""
    try:
        from peft import LoraConfig, get_peft_model
    except ImportError as e:
        raise Fail(f"PEFT is not installed ({e}): pip install peft")
    torch.manual_seed(a.seed)
    model = load_transformers(a.hf_dir)
    config = LoraConfig(r=a.rank, lora_alpha=a.alpha, lora_dropout=a.dropout,
                        target_modules=a.targets.split(","), task_type="CAUSAL_LM")
    peft_model = get_peft_model(model, config)
    peft_model.save_pretrained(a.out)
    trainable = sum(p.numel() for p in peft_model.parameters() if p.requires_grad)
    print(f"wrote {a.out}: LoRA rank {a.rank} alpha {a.alpha:g} on {a.targets}, "
          f"{trainable} trainable parameters")


# ---------------------------------------------------------------- make-tiny

def make_tiny(out, vocab, hidden, layers, heads, kv_heads, intermediate, tied=False, seed=0,
              dtype="fp32", max_shard_size=None, tokenizer=None, head_dim=None, rope_theta=10000.0,
              attention_bias=False, mlp_bias=False, init_std=0.1, max_position=2048,
              rms_norm_eps=1e-5, force=False, rope_scaling=None, rope_key="rope_parameters",
              device="cpu"):
    """Writes a random LlamaForCausalLM to `out` with save_pretrained (safetensors); returns out.
    rope_scaling: a rotary scaling ({"rope_type": "llama3", "factor": ...}); rope_key
    "rope_scaling" writes it as Llama 3.1's files do (transformers 4's key beside a top-level
    rope_theta, no rope_parameters) instead of transformers 5's rope_parameters. device: where
    the weights are drawn (cuda: a billion parameters in seconds; other values than CPU's)."""
    from transformers import LlamaConfig, LlamaForCausalLM
    from transformers.utils import logging
    logging.set_verbosity_error()
    logging.disable_progress_bar()
    kv_heads = kv_heads or heads
    if head_dim is None and hidden % heads:
        raise Fail(f"--hidden {hidden} does not divide by --heads {heads} (or give --head-dim)")
    if heads % kv_heads:
        raise Fail(f"--heads {heads} does not divide by --kv-heads {kv_heads}")
    special = {"bos_token_id": 1, "eos_token_id": 2}
    if tokenizer:
        if not os.path.isfile(tokenizer):
            raise Fail(f"tokenizer not found: {tokenizer}")
        import sentencepiece as spm
        sp = spm.SentencePieceProcessor(model_file=tokenizer)
        if vocab is None:
            vocab = sp.get_piece_size()
        elif vocab < sp.get_piece_size():
            raise Fail(f"--vocab {vocab} is smaller than the tokenizer's {sp.get_piece_size()} pieces")
        special = {"bos_token_id": sp.bos_id() if sp.bos_id() >= 0 else None,
                   "eos_token_id": sp.eos_id() if sp.eos_id() >= 0 else None}
    if vocab is None:
        raise Fail("give --vocab (or --tokenizer to take its size)")
    if os.path.exists(os.path.join(out, "config.json")) and not force:
        raise Fail(f"{out} already holds a model (--force to overwrite)")
    config = LlamaConfig(
        vocab_size=vocab, hidden_size=hidden, num_hidden_layers=layers, num_attention_heads=heads,
        num_key_value_heads=kv_heads, intermediate_size=intermediate, head_dim=head_dim,
        tie_word_embeddings=tied, attention_bias=attention_bias,
        rope_parameters={"rope_type": "default", **(rope_scaling or {}), "rope_theta": rope_theta},
        mlp_bias=mlp_bias, initializer_range=init_std, max_position_embeddings=max_position,
        rms_norm_eps=rms_norm_eps, **special)
    torch.manual_seed(seed)
    with torch.device(device):
        model = LlamaForCausalLM(config)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.copy_(1 + init_std * torch.randn_like(p))
            elif name.endswith(".bias"):
                p.copy_(init_std * torch.randn_like(p))
            else:
                p.copy_(init_std * torch.randn_like(p))
    torch_dtype = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}[dtype]
    model = model.to(torch_dtype)
    os.makedirs(out, exist_ok=True)
    kwargs = {"max_shard_size": max_shard_size} if max_shard_size else {}
    model.save_pretrained(out, **kwargs)
    cfg_path = os.path.join(out, "config.json")
    with open(cfg_path) as f:
        cfg = json.load(f)
    cfg["rope_theta"] = float(rope_theta)
    cfg["tie_word_embeddings"] = bool(tied)
    if rope_key == "rope_scaling":
        del cfg["rope_parameters"]
        cfg["rope_scaling"] = dict(rope_scaling)
    with open(cfg_path, "w") as f:
        json.dump(cfg, f, indent=2, sort_keys=True)
        f.write("\n")
    if tokenizer:
        shutil.copy(tokenizer, os.path.join(out, "tokenizer.model"))
        write_tokenizer_config(out, tokenizer)
    return out


def write_tokenizer_config(out, sp_model):
    """A tokenizer_config.json naming the SentencePiece model's special pieces, for transformers'
    LlamaTokenizer and llama.cpp's converter (which reads add_bos_token and the special tokens)."""
    import sentencepiece as spm
    sp = spm.SentencePieceProcessor(model_file=sp_model)

    def piece(i):
        return sp.id_to_piece(i) if i >= 0 else None
    cfg = {"tokenizer_class": "LlamaTokenizer", "add_bos_token": True, "add_eos_token": False,
           "bos_token": piece(sp.bos_id()), "eos_token": piece(sp.eos_id()),
           "unk_token": piece(sp.unk_id()), "pad_token": piece(sp.pad_id()),
           "model_max_length": 1 << 30, "legacy": False}
    with open(os.path.join(out, "tokenizer_config.json"), "w") as f:
        json.dump({k: v for k, v in cfg.items() if v is not None}, f, indent=2)
        f.write("\n")


# ---------------------------------------------------------------- train

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
        convert_float8(model, a.float8_skip, a.float8_all_gather)
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


def cmd_train(a):
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
        done = mp.get_context("spawn").SimpleQueue()
        try:
            mp.spawn(train_worker, args=(a.world, a, done), nprocs=a.world)
        except mp.ProcessExitedException as e:
            # gloo's teardown in torch 2.11 occasionally aborts at exit, after results are out.
            if done.empty():
                raise
            print(f"warning: a rank failed after the run finished: {e}", file=sys.stderr)


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


def cmd_fsdp2_grads(a):
    hf_config(a.hf_dir)
    read_tokens(a.data_tokens, a.tokens_dtype)
    if a.world < 2 or a.batch % a.world:
        raise Fail(f"--world must be >= 2 and divide --batch {a.batch}")
    a.port = a.port or free_port()
    import torch.multiprocessing as mp
    result = mp.get_context("spawn").SimpleQueue()
    try:
        mp.spawn(grads_worker, args=(a.world, a, result), nprocs=a.world)
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


# ---------------------------------------------------------------- CLI

def hf_parameter_count(hf_dir):
    """Parameters in a directory's safetensors files, read from their headers (no weights)."""
    import struct
    n = 0
    for name in os.listdir(hf_dir):
        if name.endswith(".safetensors"):
            with open(os.path.join(hf_dir, name), "rb") as f:
                header = json.loads(f.read(struct.unpack("<Q", f.read(8))[0]))
            for key, t in header.items():
                if key != "__metadata__":
                    n += int(np.prod(t["shape"]))
    return n


def cmd_make_tiny(a):
    make_tiny(a.out, a.vocab, a.hidden, a.layers, a.heads, a.kv_heads, a.intermediate, a.tied, a.seed,
              a.dtype, a.max_shard_size, a.tokenizer, a.head_dim, a.rope_theta, a.attention_bias,
              a.mlp_bias, a.init_std, a.max_position, a.rms_norm_eps, a.force,
              json.loads(a.rope_scaling) if a.rope_scaling else None, a.rope_key, a.device)
    files = sorted(os.listdir(a.out))
    n = hf_parameter_count(a.out)
    print(f"wrote {a.out}: {n} parameters, {', '.join(files)}")


def cmd_logits(a):
    cfg, logits_fn = framework(a.framework, a.hf_dir)
    tokens = read_tokens(a.tokens, a.tokens_dtype)
    check_vocab(tokens, cfg["vocab_size"], a.tokens)
    n = val_window_count(len(tokens), a.seq)
    if a.count < 1 or a.count > n:
        raise Fail(f"--count {a.count}: the token file holds {n} windows of seq={a.seq}")
    parts = []
    for first in range(0, a.count, a.batch):
        inputs, _ = val_windows(tokens, a.seq, first, min(a.batch, a.count - first))
        parts.append(logits_fn(inputs))
    logits = torch.cat(parts).contiguous()
    from safetensors.torch import save_file
    save_file({"logits": logits}, a.out)
    print(f"wrote {a.out}: logits {list(logits.shape)} fp32 ({a.framework}), "
          f"max |logit| {logits.abs().max().item():.6g}")


def cmd_val_loss(a):
    cfg, logits_fn = framework(a.framework, a.hf_dir, a.lora_adapter)
    tokens = read_tokens(a.tokens, a.tokens_dtype)
    check_vocab(tokens, cfg["vocab_size"], a.tokens)
    mask = np.fromfile(a.loss_mask, dtype=np.uint8) if a.loss_mask else None
    if mask is not None and len(mask) != len(tokens):
        raise Fail(f"--loss-mask {a.loss_mask}: {len(mask)} bytes for {len(tokens)} tokens")
    t0 = time.perf_counter()
    loss, windows = val_loss(logits_fn, tokens, a.seq, a.batch, mask)
    took = time.perf_counter() - t0
    if a.json:
        print(json.dumps({"framework": a.framework, "val_loss": loss, "windows": windows,
                          "predictions": windows * a.seq, "seq": a.seq, "time_s": round(took, 3)}))
    else:
        print(f"val_loss {loss:.10g} ({a.framework}, {windows} windows of {a.seq}, {took:.2f}s)")


def cmd_generate(a):
    """Greedy generation by transformers' generate (PEFT's model with --lora-adapter), printed as
    train_llama prints it: the prompt ids, the new ids, their text."""
    if (a.chat is None) == (a.ids is None):
        raise Fail("give --chat TEXT (the user's turn, through the chat template) or --ids IDS")
    model = load_transformers(a.hf_dir)
    if a.lora_adapter:
        model = load_peft(model, a.lora_adapter)
    model = model.eval()
    tok = None
    if a.chat is not None:
        import transformers
        tok = transformers.AutoTokenizer.from_pretrained(a.hf_dir)
        messages = ([{"role": "system", "content": a.system}] if a.system else []) + \
            [{"role": "user", "content": a.chat}]
        prompt = tok.apply_chat_template(messages, add_generation_prompt=True)["input_ids"]
    else:
        prompt = [int(t) for t in a.ids.split(",")]
    ids = torch.tensor([prompt])
    print(f"prompt: {len(prompt)} tokens: {' '.join(map(str, prompt))}")
    with torch.no_grad():
        # An explicit mask: a prompt may start with the id generate would take for padding.
        out = model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), do_sample=False,
                             max_new_tokens=a.max_new_tokens,
                             pad_token_id=model.generation_config.pad_token_id or 0)
    new = out[0, len(prompt):].tolist()
    print(f"generated {len(new)} tokens (greedy, transformers{' + PEFT' if a.lora_adapter else ''}): "
          f"{' '.join(map(str, new))}")
    if tok is not None:
        print(f"text: {json.dumps(tok.decode(new))}")


def add_tokens_dtype(p):
    p.add_argument("--tokens-dtype", choices=sorted(TOKEN_DTYPES), default="uint16")


def parser():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="command", required=True)

    lo = sub.add_parser("make-lora", help="write PEFT LoRA adapters for a model (save_pretrained)")
    lo.add_argument("--hf-dir", required=True)
    lo.add_argument("--out", required=True)
    lo.add_argument("--rank", type=int, default=8)
    lo.add_argument("--alpha", type=float, default=16)
    lo.add_argument("--dropout", type=float, default=0.0)
    lo.add_argument("--targets", default="q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj")
    lo.add_argument("--seed", type=int, default=0)
    lo.set_defaults(func=cmd_make_lora)

    m = sub.add_parser("make-tiny", help="write a random LlamaForCausalLM (save_pretrained)")
    m.add_argument("--out", required=True)
    m.add_argument("--vocab", type=int, help="default: the --tokenizer's size")
    m.add_argument("--hidden", type=int, required=True)
    m.add_argument("--layers", type=int, required=True)
    m.add_argument("--heads", type=int, required=True)
    m.add_argument("--kv-heads", type=int, help="default: --heads (no GQA)")
    m.add_argument("--intermediate", type=int, required=True)
    m.add_argument("--head-dim", type=int)
    m.add_argument("--tied", action="store_true", help="tie lm_head to the embedding")
    m.add_argument("--seed", type=int, default=0)
    m.add_argument("--dtype", choices=["fp32", "bf16", "fp16"], default="fp32")
    m.add_argument("--max-shard-size", help="e.g. 200KB: forces sharded files and an index")
    m.add_argument("--tokenizer", help="a SentencePiece tokenizer.model to copy in")
    m.add_argument("--rope-theta", type=float, default=10000.0)
    m.add_argument("--rope-scaling", help="a rotary scaling as JSON, e.g. Llama 3.1's "
                   "'{\"rope_type\": \"llama3\", \"factor\": 8.0, \"low_freq_factor\": 1.0, "
                   "\"high_freq_factor\": 4.0, \"original_max_position_embeddings\": 8192}'")
    m.add_argument("--rope-key", choices=["rope_parameters", "rope_scaling"],
                   default="rope_parameters", help="where config.json holds it: transformers 5's "
                   "rope_parameters, or rope_scaling beside a top-level rope_theta as Llama 3.1's "
                   "files do")
    m.add_argument("--attention-bias", action="store_true")
    m.add_argument("--mlp-bias", action="store_true")
    m.add_argument("--init-std", type=float, default=0.1)
    m.add_argument("--max-position", type=int, default=2048)
    m.add_argument("--rms-norm-eps", type=float, default=1e-5)
    m.add_argument("--force", action="store_true", help="overwrite a model already in --out")
    m.add_argument("--device", default="cpu", help="where to draw the weights (cuda: fast for big ones)")
    m.set_defaults(func=cmd_make_tiny)

    g = sub.add_parser("logits", help="fp32 logits of the first K validation windows")
    g.add_argument("--hf-dir", required=True)
    g.add_argument("--tokens", required=True)
    add_tokens_dtype(g)
    g.add_argument("--seq", type=int, required=True)
    g.add_argument("--count", type=int, required=True)
    g.add_argument("--out", required=True, help="safetensors file with 'logits' [K, seq, vocab]")
    g.add_argument("--framework", choices=["transformers", "mlx"], default="transformers")
    g.add_argument("--batch", type=int, default=8, help="windows per forward")
    g.set_defaults(func=cmd_logits)

    v = sub.add_parser("val-loss", help="validation loss over every window")
    v.add_argument("--framework", choices=["transformers", "mlx"], default="transformers")
    v.add_argument("--hf-dir", required=True)
    v.add_argument("--tokens", required=True)
    v.add_argument("--loss-mask", default="",
                   help="one byte per token: the mean over targets whose byte is 1")
    add_tokens_dtype(v)
    v.add_argument("--seq", type=int, required=True)
    v.add_argument("--batch", type=int, default=8, help="windows per forward")
    v.add_argument("--json", action="store_true")
    v.add_argument("--lora-adapter", help="PEFT adapter directory loaded onto the model")
    v.set_defaults(func=cmd_val_loss)

    ge = sub.add_parser("generate", help="greedy tokens from transformers' generate")
    ge.add_argument("--hf-dir", required=True)
    ge.add_argument("--lora-adapter", help="PEFT adapter directory loaded onto the model")
    ge.add_argument("--chat", help="the user's turn, rendered by the tokenizer's chat template")
    ge.add_argument("--system", help="with --chat: a system turn before it")
    ge.add_argument("--ids", help="prompt token ids, comma separated")
    ge.add_argument("--max-new-tokens", type=int, default=32)
    ge.set_defaults(func=cmd_generate)

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
    t.set_defaults(func=cmd_train)

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
    d.set_defaults(func=cmd_fsdp2_grads)
    return p


def main(argv=None):
    a = parser().parse_args(argv)
    try:
        a.func(a)
    except Fail as e:
        sys.exit(f"hf_llama.py {a.command}: error: {e}")


if __name__ == "__main__":
    main()
