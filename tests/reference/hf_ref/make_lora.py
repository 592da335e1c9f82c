"""hf_llama.py make-lora: PEFT's LoRA adapters for a model, as PEFT initialises them, written with
save_pretrained (the same start for train_llama --lora-adapter and hf_llama.py train)."""
import torch

from .common import Fail, load_transformers


def run(a):
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


def add_parser(sub):
    """Adds the make-lora subcommand to the subparsers `sub`."""
    lo = sub.add_parser("make-lora", help="write PEFT LoRA adapters for a model (save_pretrained)")
    lo.add_argument("--hf-dir", required=True)
    lo.add_argument("--out", required=True)
    lo.add_argument("--rank", type=int, default=8)
    lo.add_argument("--alpha", type=float, default=16)
    lo.add_argument("--dropout", type=float, default=0.0)
    lo.add_argument("--targets", default="q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj")
    lo.add_argument("--seed", type=int, default=0)
    lo.set_defaults(func=run)
