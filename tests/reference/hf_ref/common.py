"""What the subcommands of hf_llama.py share: the contract with build/bin/train_llama (token
files, batch draws, validation windows, the learning-rate schedule; hf_llama.py's docstring states
it), the errors shown to the user (Fail), and the models: transformers' LlamaForCausalLM, mlx_lm's
llama, PEFT's adapters, torchao's float8 conversion, and the validation loss over a model."""
import json, math, os, sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from run_checked import free_port  # noqa: E402,F401  (the subcommands' gloo ports)
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

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


def spawn_ranks(worker, args, world, preload=()):
    """Runs worker(rank, *args) in `world` processes forked from this one, and waits for them.
    Forked, not spawned: a spawned rank imports torch and transformers again (about 4 s of CPU
    each on a 2-core machine), a forked one shares this process's. `preload` names the modules
    the ranks use, imported here first. Safe because nothing here has run a tensor operation yet:
    no intra-op thread pool exists to be lost by the fork (the parity tests' references each
    fork before touching data)."""
    import importlib
    import torch.multiprocessing as mp
    for name in preload:
        importlib.import_module(name)
    mp.start_processes(worker, args=args, nprocs=world, start_method="fork")


def load_transformers(hf_dir):
    """LlamaForCausalLM in fp32 with PyTorch's scaled_dot_product_attention (transformers' sdpa)."""
    hf_config(hf_dir)
    from transformers import LlamaForCausalLM
    from transformers.utils import logging
    logging.set_verbosity_error()
    logging.disable_progress_bar()
    model = LlamaForCausalLM.from_pretrained(hf_dir, dtype=torch.float32, attn_implementation="sdpa")
    return model.eval()


def convert_float8(model, skip, all_gather=False, recipe="tensorwise"):
    """torchao's float8 training (recipe "tensorwise", its default, or `recipe`) on the decoder
    layers' Linears but those named in `skip`, as train_llama --float8 [--float8-skip]
    [--float8-recipe] converts them: the head stays (TorchTitan's filter_fqns=["output"]).
    all_gather: FSDP2 gathers those weights in float8 (enable_fsdp_float8_all_gather), as
    train_llama --float8-all-gather. Rowwise on the CPU runs torchao's emulation (emulate=True:
    the CPU's _scaled_mm takes tensorwise scales only), as train_llama does there."""
    import dataclasses
    from torchao.float8 import Float8LinearConfig, convert_to_float8_training
    skip = [s for s in skip.split(",") if s]

    def convert(module, fqn):
        return ".layers." in f".{fqn}" and fqn.split(".")[-1] not in skip
    config = Float8LinearConfig.from_recipe_name(recipe)
    on_cpu = next(model.parameters()).device.type == "cpu"
    config = dataclasses.replace(config, enable_fsdp_float8_all_gather=all_gather,
                                 emulate=recipe == "rowwise" and on_cpu)
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


# ---------------------------------------------------------------- command lines

def add_tokens_dtype(p):
    p.add_argument("--tokens-dtype", choices=sorted(TOKEN_DTYPES), default="uint16")
