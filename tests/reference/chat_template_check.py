"""fsdp::models::ChatTemplate (C++, llama.cpp's Jinja engine) against transformers'
apply_chat_template, on the published chat templates llama.cpp ships in models/templates of
llama-cpp-python's source release (Llama 3.1-3.3, Qwen2.5, Qwen3, SmolLM3, Gemma 2, Phi-3.5,
Mistral, DeepSeek R1 distills, Granite, ...). Each template goes into a model directory with a
byte-level BPE tokenizer.json trained here (offline), in one of the forms a Hugging Face
directory holds it (chat_template.jinja; tokenizer_config.json's chat_template as a string or
as named templates; special tokens as AddedToken dicts in special_tokens_map.json), and
transformers' AutoTokenizer loads that directory. On every conversation (a system turn or not,
several turns, with and without the generation prompt, Unicode, surrounding whitespace) the
rendered text and its ids must be equal, or both sides must refuse the conversation (a template
that raises on a system turn, say). Templates listed in KNOWN_DIFFERENT are reported, not
failed, with the reason; a template that agrees is never allowed to stop agreeing.

  python chat_template_check.py --cpp build/bin/chat_render --sdist llama_cpp_python-0.3.36.tar.gz
Exits 0 when every template outside KNOWN_DIFFERENT agrees, 1 otherwise.
"""
import argparse, json, os, subprocess, sys, tarfile
from scratch import scratch_dir

CONVERSATIONS = [
    {"messages": [{"role": "system", "content": "You are a terse assistant."},
                  {"role": "user", "content": "What is the capital of France?"}],
     "add_generation_prompt": True},
    {"messages": [{"role": "user", "content": "Hello!"}], "add_generation_prompt": True},
    {"messages": [{"role": "user", "content": "Count to three."},
                  {"role": "assistant", "content": "One, two, three."},
                  {"role": "user", "content": "  Now backwards, please.\n"}],
     "add_generation_prompt": True},
    {"messages": [{"role": "system", "content": "Answer in French."},
                  {"role": "user", "content": "Thanks"},
                  {"role": "assistant", "content": "De rien !"}],
     "add_generation_prompt": False},
    {"messages": [{"role": "user", "content": "Café, naïve, 日本語, emoji 🙂\n\nsecond paragraph"},
                  {"role": "assistant", "content": "\n Noted. \n"}],
     "add_generation_prompt": False},
    {"messages": [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"},
                  {"role": "user", "content": "c"}, {"role": "assistant", "content": "d"}],
     "add_generation_prompt": True},
]
# Templates the two engines treat differently, with why. Only that difference is accepted for
# them (transformers refuses, C++ renders); any other fails.
KNOWN_DIFFERENT = {
    "fireworks-ai-llama-3-firefunction-v2": "a function-calling template called without "
    "`functions` (a variable transformers does not pass): jinja2 refuses to iterate an undefined, "
    "llama.cpp's engine iterates nothing and renders",
}
# The templates of the models this project trains (the Llama family and the Qwen2 and
# SmolLM): these must be present in the archive and agree on every conversation.
REQUIRED = ["meta-llama-Llama-3.1-8B-Instruct", "meta-llama-Llama-3.2-3B-Instruct",
            "meta-llama-Llama-3.3-70B-Instruct", "Qwen-Qwen2.5-7B-Instruct", "Qwen-Qwen3-0.6B",
            "HuggingFaceTB-SmolLM3-3B", "deepseek-ai-DeepSeek-R1-Distill-Llama-8B"]
SPECIAL = ["<s>", "</s>", "<unk>", "<pad>", "<|begin_of_text|>", "<|eot_id|>",
           "<|start_header_id|>", "<|end_header_id|>", "<|im_start|>", "<|im_end|>",
           "<start_of_turn>", "<end_of_turn>", "[INST]", "[/INST]", "<|user|>", "<|assistant|>",
           "<|system|>", "<|end|>"]


def templates_from(sdist):
    out = {}
    with tarfile.open(sdist) as tar:
        for m in tar:
            parts = m.name.split("/")
            if (m.isfile() and m.name.endswith(".jinja") and len(parts) >= 4
                    and parts[-2] == "templates" and parts[-3] == "models"
                    and parts[-4] == "llama.cpp"):
                out[parts[-1][:-len(".jinja")]] = tar.extractfile(m).read().decode()
    return out


def train_tokenizer(path):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    texts = [t for c in CONVERSATIONS for m in c["messages"] for t in [m["content"]]]
    corpus = [p for p in ["/usr/share/common-licenses/GPL-3"] if os.path.isfile(p)]
    trainer = trainers.BpeTrainer(vocab_size=800, special_tokens=SPECIAL,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    if corpus:
        tok.train(corpus, trainer)
    else:
        tok.train_from_iterator(texts * 50, trainer)
    tok.save(path)


def write_directory(d, name, source, form, tokenizer_json):
    os.makedirs(d)
    with open(tokenizer_json) as f, open(os.path.join(d, "tokenizer.json"), "w") as g:
        g.write(f.read())
    config = {"tokenizer_class": "PreTrainedTokenizerFast", "model_max_length": 4096}
    special = {"bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>", "pad_token": "<pad>"}
    if form == "jinja":  # transformers 5's save_pretrained: the template in its own file
        with open(os.path.join(d, "chat_template.jinja"), "w") as f:
            f.write(source)
        config.update(special)
    elif form == "string":
        config.update(special, chat_template=source)
    elif form == "named":  # several named templates (tool-use models), "default" is used
        config.update(special, chat_template=[{"name": "tool_use", "template": "unused"},
                                              {"name": "default", "template": source}])
    else:  # "map": special tokens as AddedToken dicts in the legacy special_tokens_map.json
        config["chat_template"] = source
        with open(os.path.join(d, "special_tokens_map.json"), "w") as f:
            json.dump({k: {"content": v, "lstrip": False, "normalized": False, "rstrip": False,
                           "single_word": False} for k, v in special.items()}, f)
    with open(os.path.join(d, "tokenizer_config.json"), "w") as f:
        json.dump(config, f)


def reference(d):
    import transformers
    tok = transformers.AutoTokenizer.from_pretrained(d)
    results = []
    for c in CONVERSATIONS:
        try:
            text = tok.apply_chat_template(c["messages"], tokenize=False,
                                           add_generation_prompt=c["add_generation_prompt"])
            ids = tok.apply_chat_template(c["messages"], tokenize=True, return_dict=False,
                                          add_generation_prompt=c["add_generation_prompt"])
            results.append({"text": text, "ids": list(ids)})
        except Exception as e:  # the template refused the conversation (raise_exception)
            results.append({"error": f"{type(e).__name__}: {e}"})
    return results


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--cpp", required=True, help="the chat_render program")
    p.add_argument("--sdist", required=True, help="llama-cpp-python's source release")
    a = p.parse_args()
    templates = templates_from(a.sdist)
    missing = [n for n in REQUIRED if n not in templates]
    if missing:
        print(f"FAIL: {a.sdist} lacks the templates {missing}")
        return 1
    work = scratch_dir("chat_template_check_")
    tokenizer_json = os.path.join(work, "tokenizer.json")
    train_tokenizer(tokenizer_json)
    forms = ["jinja", "string", "named", "map"]
    dirs = {}
    for i, (name, source) in enumerate(sorted(templates.items())):
        dirs[name] = os.path.join(work, name)
        write_directory(dirs[name], name, source, forms[i % len(forms)], tokenizer_json)
    conv_path = os.path.join(work, "conversations.json")
    with open(conv_path, "w") as f:
        json.dump(CONVERSATIONS, f)
    r = subprocess.run([a.cpp, conv_path] + list(dirs.values()), capture_output=True, text=True)
    if r.returncode != 0:
        print(f"FAIL: chat_render exited {r.returncode}: {r.stderr[-2000:]}")
        return 1
    cpp = json.loads(r.stdout)
    failed, counts = [], {"equal": 0, "both refuse": 0}
    lenient = []  # a KNOWN_DIFFERENT template's accepted difference
    for i, (name, d) in enumerate(sorted(dirs.items())):
        ref = reference(d)
        got = cpp[d]
        problems = []
        if "error" in got:
            problems.append(f"C++ refused the directory: {got['error'][:300]}")
        else:
            for k, (x, y) in enumerate(zip(ref, got["results"])):
                if "error" in x and "error" in y:
                    # A template's own raise_exception: the same message on both sides.
                    said = x["error"].split(": ", 1)[1] if x["error"].startswith("TemplateError") else ""
                    if said not in y["error"]:
                        problems.append(f"conversation {k}: both refuse, transformers with "
                                        f"{said!r}, C++ with {y['error'][:300]!r}")
                    else:
                        counts["both refuse"] += 1
                elif "error" in x and name in KNOWN_DIFFERENT:
                    lenient.append(name)
                elif "error" in x or "error" in y:
                    problems.append(f"conversation {k}: transformers: "
                                    f"{x.get('error', 'renders')[:200]!r}; C++: "
                                    f"{y.get('error', 'renders')[:300]!r}")
                elif x["text"] != y["text"]:
                    at = next((j for j, (u, v) in enumerate(zip(x["text"], y["text"])) if u != v),
                              min(len(x["text"]), len(y["text"])))
                    problems.append(f"conversation {k}: texts differ at {at}: transformers "
                                    f"{x['text'][max(0, at - 40):at + 40]!r}, C++ "
                                    f"{y['text'][max(0, at - 40):at + 40]!r}")
                elif x["ids"] != y["ids"]:
                    problems.append(f"conversation {k}: equal texts, different ids")
                else:
                    counts["equal"] += 1
        form = forms[i % len(forms)]
        if not problems and name in lenient:
            print(f"known {name} ({form}): {KNOWN_DIFFERENT[name]} "
                  f"({lenient.count(name)} conversations)")
        elif not problems:
            print(f"ok    {name} ({form})")
        else:
            failed.append(name)
            print(f"FAIL  {name} ({form}):\n      " + "\n      ".join(problems[:3]))
    print(f"{len(templates)} templates x {len(CONVERSATIONS)} conversations: "
          f"{counts['equal']} rendered equal (text and ids), {counts['both refuse']} refused by "
          f"both, {len(lenient)} refused by transformers only (known ones); {len(failed)} templates "
          f"differ{': ' + ', '.join(failed) if failed else ''}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
