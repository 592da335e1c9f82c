"""A small Hugging Face tokenizer with a chat template, for tests on this offline machine: a
GPT-2-style byte-level BPE (the kind Llama 3, SmolLM2 and Qwen2 ship as tokenizer.json) trained
on the given text files, with Llama 3's special tokens and chat template, saved as
tokenizer.json + tokenizer_config.json (transformers' save_pretrained).

  python tests/reference/make_chat_tokenizer.py --out DIR --vocab-size 600 TEXT [TEXT ...]
"""
import argparse
import sys

# Llama 3's template (its header and end-of-turn tokens), without the date lines of 3.1.
TEMPLATE = (
    "{{ bos_token }}{% for message in messages %}"
    "{{ '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n' + message['content'] "
    "| trim + '<|eot_id|>' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}"
    "{% endif %}")
SPECIAL = ["<|begin_of_text|>", "<|end_of_text|>", "<|start_header_id|>", "<|end_header_id|>",
           "<|eot_id|>"]


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("texts", nargs="+")
    p.add_argument("--out", required=True)
    p.add_argument("--vocab-size", type=int, default=600)
    p.add_argument("--no-template", action="store_true", help="save without a chat template")
    a = p.parse_args()
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    import transformers
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=a.vocab_size, special_tokens=SPECIAL,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train(a.texts, trainer)
    fast = transformers.PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token="<|begin_of_text|>", eos_token="<|eot_id|>",
        pad_token="<|end_of_text|>")
    if not a.no_template:
        fast.chat_template = TEMPLATE
    fast.save_pretrained(a.out)
    print(f"wrote {a.out}: byte-level BPE of {len(fast)} ids"
          f"{'' if a.no_template else ', Llama 3 chat template'}")


if __name__ == "__main__":
    sys.exit(main())
