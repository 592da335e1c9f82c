"""Chat data (JSONL) -> a token file and a loss mask for train_llama --data-tokens/--loss-mask.

  python scripts/tokenize_chat.py CHATS.jsonl [MORE.jsonl ...] --tokenizer MODEL_DIR --out-dir DIR \
      [--train-on-prompt] [--dtype auto|uint16|uint32]

Each line is one conversation, either {"messages": [{"role": "system"|"user"|"assistant",
"content": "..."}, ...]} or {"prompt": "...", "completion": "..."} (a user turn and an assistant
turn). The model's own chat template renders it (transformers' apply_chat_template with the
template of MODEL_DIR's tokenizer_config.json or chat_template.jinja, the tokenizer.json
tokenizer), and the ids of every conversation follow one another in DIR/train.bin (nanoGPT's
raw format: little-endian uint16, or uint32 for larger vocabularies).

DIR/train.mask holds one byte per token: 1 for the tokens of assistant turns (what the template
renders for each assistant message after its header: the text and what the template closes the
turn with, its end-of-turn token and, for ChatML templates, the newline after it), 0 for the rest
(system and user turns, the template's headers); with --train-on-prompt every token is 1. The
trainer's loss is then the mean over counted targets, transformers' labels of -100 elsewhere. An
assistant turn's tokens are found by rendering the conversation up to it with the generation
prompt and up to its end: the template must render each conversation as a prefix of its
continuation. Llama 3's, ChatML's (Qwen2, SmolLM2) and most do; some refuse multi-turn data this
way (templates that move the system prompt to the last user turn, or drop earlier reasoning),
and such conversations are refused by name. A conversation must not start with an assistant
turn. The template's own errors (roles that must alternate, an unsupported system role) are
reported with the file and line.

Validation: run it on held-out conversations too and give train_llama --val-tokens DIR2/train.bin
--val-loss-mask DIR2/train.mask: the validation loss then counts their assistant turns alone.

Packing: conversations are concatenated; a training window of --seq tokens may span two of them,
and attention then reaches across (positions do not restart per conversation). Masks still
count only assistant tokens. Exits 1 with a message naming the file and line on bad input: not
JSON, no assistant turn, an unknown role or empty content, a tokenizer without a chat template.
"""
import argparse
import json
import os
import sys
import time

import numpy as np


def fail(msg):
    sys.exit(f"tokenize_chat.py: error: {msg}")


def conversations(paths):
    for path in paths:
        if not os.path.isfile(path):
            fail(f"{path}: no such file")
        with open(path, encoding="utf-8") as f:
            for n, line in enumerate(f, 1):
                if not line.strip():
                    continue
                where = f"{path}:{n}"
                try:
                    record = json.loads(line)
                except json.JSONDecodeError as e:
                    fail(f"{where}: not JSON ({e})")
                yield where, messages_of(record, where)


def messages_of(record, where):
    if isinstance(record, dict) and "messages" in record:
        messages = record["messages"]
    elif isinstance(record, dict) and "prompt" in record and "completion" in record:
        messages = [{"role": "user", "content": record["prompt"]},
                    {"role": "assistant", "content": record["completion"]}]
    else:
        fail(f"{where}: expected {{\"messages\": [...]}} or {{\"prompt\": ..., \"completion\": ...}}")
    if not isinstance(messages, list) or not messages:
        fail(f"{where}: \"messages\" must be a non-empty list")
    for i, m in enumerate(messages):
        if not isinstance(m, dict) or m.get("role") not in ("system", "user", "assistant"):
            fail(f"{where}: message {i} needs a role of system, user or assistant")
        if not isinstance(m.get("content"), str) or not m["content"]:
            fail(f"{where}: message {i} ({m['role']}) has no content")
    if not any(m["role"] == "assistant" for m in messages):
        fail(f"{where}: the conversation has no assistant turn (nothing to train on)")
    return [{"role": m["role"], "content": m["content"]} for m in messages]


def render(tokenizer, messages, where, generation_prompt=False):
    try:
        out = tokenizer.apply_chat_template(messages, tokenize=True,
                                            add_generation_prompt=generation_prompt)
    except Exception as e:  # noqa: BLE001 (jinja's TemplateError and the template's own raises)
        fail(f"{where}: the chat template refused the conversation: {e}")
    if isinstance(out, dict) or hasattr(out, "keys"):  # a BatchEncoding in newer transformers
        out = out["input_ids"]
    return list(out)


def encode(tokenizer, messages, where, train_on_prompt):
    if messages[0]["role"] == "assistant":
        fail(f"{where}: the conversation starts with an assistant turn; start with a system or "
             f"user turn (the template's opening cannot be told from the answer otherwise)")
    ids = render(tokenizer, messages, where)
    mask = np.ones(len(ids), dtype=np.uint8) if train_on_prompt else np.zeros(len(ids), np.uint8)
    for i, m in enumerate(messages):
        if m["role"] != "assistant":
            continue
        before = render(tokenizer, messages[:i], where, generation_prompt=True)
        upto = render(tokenizer, messages[:i + 1], where)
        if ids[:len(upto)] != upto or upto[:len(before)] != before:
            fail(f"{where}: the chat template does not render the conversation up to message {i} "
                 f"as a prefix of the whole; its assistant tokens cannot be found")
        mask[len(before):len(upto)] = 1
    return ids, mask


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("chats", nargs="+", help="JSONL files of conversations")
    p.add_argument("--tokenizer", required=True,
                   help="the model's directory (tokenizer.json, tokenizer_config.json with a "
                        "chat_template, or chat_template.jinja)")
    p.add_argument("--out-dir", required=True)
    p.add_argument("--train-on-prompt", action="store_true",
                   help="count every token, not only the assistant turns'")
    p.add_argument("--dtype", choices=["auto", "uint16", "uint32"], default="auto")
    a = p.parse_args(argv)
    t0 = time.perf_counter()
    if not os.path.exists(a.tokenizer):
        fail(f"--tokenizer {a.tokenizer}: no such file or directory")
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    import transformers
    try:
        tokenizer = transformers.AutoTokenizer.from_pretrained(a.tokenizer)
    except Exception as e:  # noqa: BLE001 (the loader's own message names the cause)
        fail(f"--tokenizer {a.tokenizer}: {e}")
    if not getattr(tokenizer, "chat_template", None):
        fail(f"--tokenizer {a.tokenizer}: the tokenizer has no chat template (neither "
             f"tokenizer_config.json's \"chat_template\" nor chat_template.jinja)")
    vocab = len(tokenizer)
    dtype = a.dtype if a.dtype != "auto" else ("uint16" if vocab <= 65536 else "uint32")
    if dtype == "uint16" and vocab > 65536:
        fail(f"the tokenizer has {vocab} ids: they do not fit uint16 (use --dtype uint32)")
    all_ids, all_mask, count = [], [], 0
    for where, messages in conversations(a.chats):
        ids, mask = encode(tokenizer, messages, where, a.train_on_prompt)
        all_ids.append(np.asarray(ids, dtype=np.int64))
        all_mask.append(mask)
        count += 1
    if not count:
        fail("no conversations in " + ", ".join(a.chats))
    ids = np.concatenate(all_ids)
    mask = np.concatenate(all_mask)
    os.makedirs(a.out_dir, exist_ok=True)
    ids.astype("<u2" if dtype == "uint16" else "<u4").tofile(os.path.join(a.out_dir, "train.bin"))
    mask.tofile(os.path.join(a.out_dir, "train.mask"))
    print(f"{count} conversations, {len(ids)} tokens ({dtype}), {int(mask.sum())} counted "
          f"({100 * mask.mean():.1f}%: {'every token' if a.train_on_prompt else 'assistant turns'}); "
          f"wrote train.bin and train.mask in {a.out_dir} ({time.perf_counter() - t0:.1f}s)")
    # Packing: when every conversation starts with one token (the template's begin-of-text) that
    # appears nowhere else, train_llama --document-start-id keeps each conversation to itself.
    first = {int(c[0]) for c in all_ids}
    if len(first) == 1:
        start = first.pop()
        if int((ids == start).sum()) == count:
            print(f"every conversation starts with token {start} "
                  f"({tokenizer.convert_ids_to_tokens(start)}) and nothing else does: "
                  f"train_llama --document-start-id {start} packs them (positions restart, "
                  f"attention stays inside each)")


if __name__ == "__main__":
    main()
