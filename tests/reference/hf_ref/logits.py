"""hf_llama.py logits: the fp32 logits of the first validation windows (transformers or MLX),
written to a safetensors file."""
import torch

from .common import Fail, add_tokens_dtype, check_vocab, framework, read_tokens, val_window_count, \
    val_windows


def run(a):
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


def add_parser(sub):
    """Adds the logits subcommand to the subparsers `sub`."""
    g = sub.add_parser("logits", help="fp32 logits of the first K validation windows")
    g.add_argument("--hf-dir", required=True)
    g.add_argument("--tokens", required=True)
    add_tokens_dtype(g)
    g.add_argument("--seq", type=int, required=True)
    g.add_argument("--count", type=int, required=True)
    g.add_argument("--out", required=True, help="safetensors file with 'logits' [K, seq, vocab]")
    g.add_argument("--framework", choices=["transformers", "mlx"], default="transformers")
    g.add_argument("--batch", type=int, default=8, help="windows per forward")
    g.set_defaults(func=run)
