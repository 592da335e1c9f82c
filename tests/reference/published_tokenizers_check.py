"""fsdp::models::Tokenizer (C++) on published models' vocabularies: llama-cpp-python's source
release carries llama.cpp's tokenizer test data, models/ggml-vocab-NAME.gguf (the vocabulary and
merges of a published model's tokenizer, converted from its tokenizer.json) with
ggml-vocab-NAME.gguf.inp (test texts: whitespace runs, digits, emoji sequences, Khmer, Cyrillic,
CJK, contractions, code) and .out (the ids the model's Hugging Face tokenizer gave for them,
encode(text, add_special_tokens=False), written by convert_hf_to_gguf_update.py).

For each vocabulary this rebuilds the model's tokenizer.json with the `tokenizers` library: the
GGUF's tokens and merges, its control and user-defined tokens as added tokens, and the
normalizer and pre-tokenizer the model's tokenizer.json has (FORMS below; the GGUF names only a
pre-tokenizer type). The rebuilt file is first checked by `tokenizers` itself against .out (the
rebuild is right when the published ids come out), then fsdp::models::Tokenizer must give the
same ids and decode them back to the text.

  python published_tokenizers_check.py --cpp build/bin/tokenizer_encode --sdist llama_cpp_python-0.3.36.tar.gz
Exits 0 when every vocabulary agrees, 1 otherwise.

  python published_tokenizers_check.py --sdist ... --write-dir llama-bpe OUT
writes a model directory's tokenizer files for that vocabulary instead: tokenizer.json (with the
post-processor the model's has: Llama 3's adds <|begin_of_text|>), tokenizer_config.json (its
special tokens, and for Llama 3 the chat template of Llama 3.1 Instruct from llama.cpp's
models/templates). tests/examples/published_tokenizer_export.sh trains and exports with it.
"""
import argparse, json, os, struct, subprocess, sys, tarfile, time
from scratch import scratch_dir

LLAMA3 = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+"
          r"[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
QWEN2 = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
         r"|\s*[\r\n]+|\s+(?!\S)|\s+")
# The published tokenizers (the model convert_hf_to_gguf_update.py took each from) and the parts
# of their tokenizer.json that a GGUF does not carry.
FORMS = {
    "llama-bpe": dict(model="meta-llama/Meta-Llama-3-8B", split=LLAMA3, ignore_merges=True,
                      bos="<|begin_of_text|>", eos="<|eot_id|>", add_bos=True,
                      template="meta-llama-Llama-3.1-8B-Instruct"),
    "qwen2": dict(model="Qwen/Qwen1.5-7B", nfc=True, split=QWEN2, eos="<|im_end|>",
                  template="Qwen-Qwen2.5-7B-Instruct"),
    "gpt-2": dict(model="openai-community/gpt2"),
    "starcoder": dict(model="bigcode/starcoder2-3b", digits=True),
    "refact": dict(model="smallcloudai/Refact-1_6-base", digits=True),
    "mpt": dict(model="mosaicml/mpt-7b", nfc=True),
    "command-r": dict(model="CohereForAI/c4ai-command-r-v01", nfc=True, digits=True),
}
CONTROL, USER_DEFINED = 3, 4  # llama.cpp's token types


def extract(sdist, names, out, templates=()):
    """The .gguf, .inp, .out files of `names` and the chat templates named, from the source
    release."""
    want = {f"ggml-vocab-{n}.gguf{s}" for n in names for s in ("", ".inp", ".out")}
    want |= {f"{t}.jinja" for t in templates}
    with tarfile.open(sdist) as tar:
        for m in tar:
            parts = m.name.split("/")
            if m.isfile() and parts[-1] in want and parts[-2] in ("models", "templates"):
                with open(os.path.join(out, parts[-1]), "wb") as f:
                    f.write(tar.extractfile(m).read())


# GGUF's value types (llama.cpp's gguf.h, GGUF_TYPE_*): struct formats of the fixed-size ones.
GGUF_FIXED = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q",
              12: "d"}
GGUF_STRING, GGUF_ARRAY = 8, 9


def read_gguf_fields(path):
    """The key-value fields of a GGUF file (version 2 or 3, little-endian), arrays as lists.
    gguf-py's GGUFReader, which llama.cpp's source release also carries, gives the same but
    builds a numpy view per string: 9 s for one 128K-token vocabulary, this 0.3 s. What it
    reads is checked by the published ids (`tokenizers` must give them from the rebuild)."""
    data = open(path, "rb").read()
    magic, version, _tensors, count = struct.unpack_from("<4sIQQ", data, 0)
    if magic != b"GGUF" or version not in (2, 3):
        raise ValueError(f"{path}: not a GGUF file of version 2 or 3")
    pos = 24

    def string():
        nonlocal pos
        (n,) = struct.unpack_from("<Q", data, pos)
        pos += 8 + n
        return data[pos - n:pos].decode("utf-8")

    def value(kind):
        nonlocal pos
        if kind == GGUF_STRING:
            return string()
        if kind == GGUF_ARRAY:
            item, n = struct.unpack_from("<IQ", data, pos)
            pos += 12
            if item in GGUF_FIXED:
                fmt = f"<{n}{GGUF_FIXED[item]}"
                items = list(struct.unpack_from(fmt, data, pos))
                pos += struct.calcsize(fmt)
                return items
            return [value(item) for _ in range(n)]
        if kind not in GGUF_FIXED:
            raise ValueError(f"{path}: unknown GGUF value type {kind} at byte {pos}")
        fmt = "<" + GGUF_FIXED[kind]
        (v,) = struct.unpack_from(fmt, data, pos)
        pos += struct.calcsize(fmt)
        return v

    fields = {}
    for _ in range(count):
        key = string()
        (kind,) = struct.unpack_from("<I", data, pos)
        pos += 4
        fields[key] = value(kind)
    return fields


def rebuild(gguf_path, form, out_path):
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers
    from tokenizers import pre_tokenizers
    fields = read_gguf_fields(gguf_path)
    tokens = fields["tokenizer.ggml.tokens"]
    types = fields["tokenizer.ggml.token_type"]
    merges = [tuple(m.split(" ", 1)) for m in fields["tokenizer.ggml.merges"]]
    vocab = {t: i for i, t in enumerate(tokens)}
    tok = Tokenizer(models.BPE(vocab=vocab, merges=merges,
                               ignore_merges=form.get("ignore_merges", False)))
    if form.get("nfc"):
        tok.normalizer = normalizers.NFC()
    pre = []
    if form.get("digits"):
        pre.append(pre_tokenizers.Digits(individual_digits=True))
    if form.get("split"):
        pre.append(pre_tokenizers.Split(Regex(form["split"]), behavior="isolated"))
        pre.append(pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False))
    else:
        pre.append(pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True))
    tok.pre_tokenizer = pre[0] if len(pre) == 1 else pre_tokenizers.Sequence(pre)
    tok.decoder = decoders.ByteLevel()
    added = [AddedToken(t, special=(ty == CONTROL), normalized=False)
             for t, ty in zip(tokens, types) if ty in (CONTROL, USER_DEFINED)]
    tok.add_tokens(added)
    tok.save(out_path)
    return tok, len(tokens), len(merges), len(added)


def write_dir(sdist, name, out):
    """The tokenizer files of a model directory for the published vocabulary `name`."""
    from tokenizers import processors
    form = FORMS[name]
    work = scratch_dir("published_tokenizer_dir_")
    extract(sdist, [name], work, [form["template"]] if "template" in form else [])
    os.makedirs(out, exist_ok=True)
    path = os.path.join(out, "tokenizer.json")
    tok, *_ = rebuild(os.path.join(work, f"ggml-vocab-{name}.gguf"), form, path)
    steps = [processors.ByteLevel(trim_offsets=False)]
    if form.get("add_bos"):
        bos = form["bos"]
        steps.append(processors.TemplateProcessing(single=f"{bos} $A", pair=f"{bos} $A {bos} $B",
                                                   special_tokens=[(bos, tok.token_to_id(bos))]))
    tok.post_processor = processors.Sequence(steps)
    tok.save(path)
    config = {"tokenizer_class": "PreTrainedTokenizerFast", "model_max_length": 131072,
              "clean_up_tokenization_spaces": False}
    for key in ("bos", "eos"):
        if key in form:
            config[f"{key}_token"] = form[key]
    if "template" in form:
        config["chat_template"] = open(os.path.join(work, form["template"] + ".jinja")).read()
    with open(os.path.join(out, "tokenizer_config.json"), "w") as f:
        json.dump(config, f, indent=1)
    print(f"wrote {out}: {form['model']}'s tokenizer ({tok.get_vocab_size()} ids)"
          + (f", {form['template']}'s chat template" if "template" in form else ""))
    return 0


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--cpp", help="the tokenizer_encode program")
    p.add_argument("--sdist", required=True, help="llama-cpp-python's source release")
    p.add_argument("--write-dir", nargs=2, metavar=("NAME", "OUT"),
                   help="write the tokenizer files of vocabulary NAME into OUT instead")
    a = p.parse_args()
    if a.write_dir:
        return write_dir(a.sdist, *a.write_dir)
    if not a.cpp:
        p.error("--cpp is needed to check")
    work = scratch_dir("published_tokenizers_")
    extract(a.sdist, FORMS, work)
    failed = []
    for name, form in FORMS.items():
        path = os.path.join(work, f"ggml-vocab-{name}.gguf")
        if not os.path.isfile(path + ".inp"):
            print(f"FAIL  {name}: not in {a.sdist}")
            failed.append(name)
            continue
        texts = open(path + ".inp", encoding="utf-8").read().split("\n__ggml_vocab_test__\n")[:-1]
        want = [[int(i) for i in line.split()] for line in
                open(path + ".out").read().split("\n")[:len(texts)]]
        tj = os.path.join(work, f"{name}.json")
        tok, n_tokens, n_merges, n_added = rebuild(path, form, tj)
        ref = [tok.encode(t, add_special_tokens=False).ids for t in texts]
        bad_ref = [i for i, (x, y) in enumerate(zip(ref, want)) if x != y]
        if bad_ref:
            print(f"FAIL  {name}: the rebuilt tokenizer.json does not give the published ids "
                  f"(texts {bad_ref[:5]}: {texts[bad_ref[0]]!r} -> {ref[bad_ref[0]]}, published "
                  f"{want[bad_ref[0]]})")
            failed.append(name)
            continue
        texts_path = os.path.join(work, f"{name}.texts.json")
        with open(texts_path, "w") as f:
            json.dump(texts, f)
        t0 = time.perf_counter()
        r = subprocess.run([a.cpp, tj, texts_path, "--no-special"], capture_output=True, text=True)
        took = time.perf_counter() - t0
        if r.returncode != 0:
            print(f"FAIL  {name}: tokenizer_encode refused it: {r.stderr.strip()[-500:]}")
            failed.append(name)
            continue
        got = json.loads(r.stdout)
        bad = [i for i, (x, y) in enumerate(zip(got["ids"], want)) if x != y]
        undecoded = [i for i, (d, t) in enumerate(zip(got["decoded"], texts))
                     if d != tok.decode(want[i], skip_special_tokens=False)]
        if bad or undecoded or len(got["ids"]) != len(want):
            i = (bad or undecoded or [0])[0]
            print(f"FAIL  {name} ({form['model']}): {len(bad)} of {len(texts)} texts encode "
                  f"differently, {len(undecoded)} decode differently; first {texts[i]!r}: C++ "
                  f"{got['ids'][i]} {got['decoded'][i]!r}, published {want[i]}")
            failed.append(name)
            continue
        print(f"ok    {name} ({form['model']}: {n_tokens} tokens, {n_merges} merges, "
              f"{n_added} added): {len(texts)} texts, {sum(map(len, want))} ids equal the "
              f"published ones, decoded as tokenizers decodes ({took:.1f}s with loading)")
    print(f"{len(FORMS) - len(failed)} of {len(FORMS)} published vocabularies agree"
          + (f"; failed: {', '.join(failed)}" if failed else ""))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
