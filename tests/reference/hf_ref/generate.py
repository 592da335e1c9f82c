"""hf_llama.py generate: greedy tokens from transformers' generate (PEFT's model with
--lora-adapter), from token ids or a user's turn through the tokenizer's chat template."""
import json

import torch

from .common import Fail, load_peft, load_transformers


def run(a):
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


def add_parser(sub):
    """Adds the generate subcommand to the subparsers `sub`."""
    ge = sub.add_parser("generate", help="greedy tokens from transformers' generate")
    ge.add_argument("--hf-dir", required=True)
    ge.add_argument("--lora-adapter", help="PEFT adapter directory loaded onto the model")
    ge.add_argument("--chat", help="the user's turn, rendered by the tokenizer's chat template")
    ge.add_argument("--system", help="with --chat: a system turn before it")
    ge.add_argument("--ids", help="prompt token ids, comma separated")
    ge.add_argument("--max-new-tokens", type=int, default=32)
    ge.set_defaults(func=run)
