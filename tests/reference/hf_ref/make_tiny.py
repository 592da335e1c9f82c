"""hf_llama.py make-tiny: a random LlamaForCausalLM (every weight drawn, none at its default value)
written with save_pretrained, optionally with a SentencePiece tokenizer and its
tokenizer_config.json."""
import json, os, shutil

import numpy as np
import torch

from .common import Fail


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


def run(a):
    make_tiny(a.out, a.vocab, a.hidden, a.layers, a.heads, a.kv_heads, a.intermediate, a.tied, a.seed,
              a.dtype, a.max_shard_size, a.tokenizer, a.head_dim, a.rope_theta, a.attention_bias,
              a.mlp_bias, a.init_std, a.max_position, a.rms_norm_eps, a.force,
              json.loads(a.rope_scaling) if a.rope_scaling else None, a.rope_key, a.device)
    files = sorted(os.listdir(a.out))
    n = hf_parameter_count(a.out)
    print(f"wrote {a.out}: {n} parameters, {', '.join(files)}")


def add_parser(sub):
    """Adds the make-tiny subcommand to the subparsers `sub`."""
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
    m.set_defaults(func=run)
