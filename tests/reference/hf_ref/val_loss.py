"""hf_llama.py val-loss: the validation loss over every window of a token file (transformers or
MLX; PEFT's adapters with --lora-adapter; a loss mask with --loss-mask)."""
import json, time

import numpy as np

from .common import Fail, add_tokens_dtype, check_vocab, framework, read_tokens, val_loss


def run(a):
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


def add_parser(sub):
    """Adds the val-loss subcommand to the subparsers `sub`."""
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
    v.set_defaults(func=run)
