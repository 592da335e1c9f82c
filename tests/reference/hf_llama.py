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

This file is the command line; the subcommands live in the hf_ref package beside it, one module
each (hf_ref/make_tiny.py, train.py, ...), what they share in hf_ref/common.py. The functions
other scripts use (read_tokens, val_loss, make_tiny, load_transformers, ...) are importable from
here as before.
"""
import argparse, importlib, os, sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from hf_ref import COMMANDS  # noqa: E402
# What other scripts import from here (import hf_llama; hf_llama.read_tokens, ...).
from hf_ref.common import (  # noqa: E402,F401
    MASK64, TOKEN_DTYPES, TOKENIZER_FILES, Fail, add_tokens_dtype, batch_rows, check_vocab,
    convert_float8, draw, framework, free_port, hf_config, load_mlx, load_peft, load_transformers,
    lr_at, mix, mlx_logits, packed_arguments, read_tokens, transformers_logits, val_loss,
    val_window_count, val_windows)
from hf_ref.fsdp2_grads import grads_worker  # noqa: E402,F401
from hf_ref.make_tiny import hf_parameter_count, make_tiny, write_tokenizer_config  # noqa: E402,F401
from hf_ref.train import (  # noqa: E402,F401
    apply_tensor_parallel, evaluate, init_gloo, param_groups, save_final, train_worker)


def parser():
    """The command line: one subcommand per module of hf_ref, each adding its own arguments."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="command", required=True)
    for name in COMMANDS:
        importlib.import_module(f"hf_ref.{name}").add_parser(sub)
    return p


def main(argv=None):
    a = parser().parse_args(argv)
    try:
        a.func(a)
    except Fail as e:
        sys.exit(f"hf_llama.py {a.command}: error: {e}")


if __name__ == "__main__":
    main()
