"""fsdp::models::Tokenizer (C++) against Hugging Face's `tokenizers`: the same ids, and decoding
that gives the text back, on texts with ASCII, accents, CJK, emoji, digits, contractions, runs
of spaces and newlines and the special tokens written out. Two byte-level BPEs trained here
offline: GPT-2's form (ByteLevel with its regex: make_chat_tokenizer.py's, as SmolLM2 ships) and
Llama 3's (Split by Llama 3's regex, then ByteLevel without one; a TemplateProcessing that adds
<|begin_of_text|>; ignore_merges), SmolLM2's (Digits one by one, then GPT-2's ByteLevel) and
Qwen2's (an NFC normalizer, Split by its regex). Settings the C++ side does not implement (an
NFKC normalizer, add_prefix_space, no decoder, lstrip) must be refused by name.

  python tokenizer_check.py --cpp build/bin/tokenizer_encode
Exits 0 when every id agrees, 1 otherwise.
"""
import argparse, json, os, subprocess, sys, tempfile
from scratch import scratch_dir

HERE = os.path.dirname(os.path.abspath(__file__))
QWEN2_PATTERN = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
                 r"|\s*[\r\n]+|\s+(?!\S)|\s+")
LLAMA3_PATTERN = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+"
                  r"[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
SPECIAL = ["<|begin_of_text|>", "<|end_of_text|>", "<|start_header_id|>", "<|end_header_id|>",
           "<|eot_id|>"]
TEXTS = [
    "Hello world",
    "  leading spaces and trailing   ",
    "It's what we'll do; they've gone, I'd say, you're RIGHT, DON'T.",
    "Numbers: 1234567 and 3.14159, 2026-12-02, 1,000,000.",
    "Café naïve résumé — Ünïcödé façade.",
    "日本語のテキストと中文字符。",
    "Emoji 🙂🚀 and symbols ∑∫√ ≠ ≤ «quotes»",
    "line one\nline two\n\n\tindented\r\nwindows",
    "<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nWhat is 2+2?<|eot_id|>",
    "special<|eot_id|>glued<|eot_id|><|eot_id|>",
    "",
    " ",
    "a",
    "ends in an emoji 🙂",  # without its last id, a character cut half-way (U+FFFD)
    "中",
    "decomposed: Cafe\u0301 nai\u0308ve A\u030a",  # NFC composes these (Qwen2's normalizer)
    "digits 20261202 and 3.14",
]


def corpus():
    files = ["/usr/share/common-licenses/GPL-3", "/usr/share/common-licenses/Apache-2.0"]
    extra = os.path.join(scratch_dir("tokenizer_check_"), "extra.txt")
    with open(extra, "w") as f:
        f.write("\n".join(TEXTS) * 20)
    return [p for p in files if os.path.isfile(p)] + [extra]


def train(kind, out):
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from tokenizers import normalizers
    tok = Tokenizer(models.BPE(ignore_merges=(kind in ("llama3", "qwen2"))))
    if kind == "gpt2":
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    elif kind == "smollm2":  # SmolLM2's: every digit alone, then GPT-2's ByteLevel
        tok.pre_tokenizer = pre_tokenizers.Sequence([
            pre_tokenizers.Digits(individual_digits=True),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)])
    elif kind == "qwen2":  # Qwen2's: NFC, its regex (single digits), ByteLevel without one
        tok.normalizer = normalizers.NFC()
        tok.pre_tokenizer = pre_tokenizers.Sequence([
            pre_tokenizers.Split(Regex(QWEN2_PATTERN), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    else:
        tok.pre_tokenizer = pre_tokenizers.Sequence([
            pre_tokenizers.Split(Regex(LLAMA3_PATTERN), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=800, special_tokens=SPECIAL,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train(corpus(), trainer)
    if kind == "llama3":
        bos = tok.token_to_id("<|begin_of_text|>")
        tok.post_processor = processors.Sequence([
            processors.ByteLevel(trim_offsets=False),
            processors.TemplateProcessing(single="<|begin_of_text|> $A",
                                          pair="<|begin_of_text|> $A <|begin_of_text|> $B",
                                          special_tokens=[("<|begin_of_text|>", bos)])])
    tok.save(out)
    return tok


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--cpp", required=True, help="the tokenizer_encode binary")
    a = p.parse_args()
    ok = True
    with tempfile.TemporaryDirectory() as tmp:
        texts_path = os.path.join(tmp, "texts.json")
        texts = TEXTS + [open("/usr/share/common-licenses/GPL-3").read()[:5000]]
        with open(texts_path, "w") as f:
            json.dump(texts, f)
        for kind in ("gpt2", "llama3", "smollm2", "qwen2"):
            path = os.path.join(tmp, f"{kind}.json")
            tok = train(kind, path)
            for special in (True, False):
                args = [a.cpp, path, texts_path] + ([] if special else ["--no-special"])
                r = subprocess.run(args, capture_output=True, text=True)
                if r.returncode != 0:
                    print(f"FAILED: {kind}: tokenizer_encode exited {r.returncode}: {r.stderr}")
                    ok = False
                    continue
                got = json.loads(r.stdout)
                bad = 0
                for text, ids, decoded, cut in zip(texts, got["ids"], got["decoded"],
                                                   got["decoded_cut"]):
                    if cut != tok.decode(ids[:-1], skip_special_tokens=False):
                        bad += 1
                        print(f"FAILED: {kind}: decoding all but the last id of {text[:40]!r}: "
                              f"{cut[-20:]!r}, tokenizers {tok.decode(ids[:-1])[-20:]!r}")
                    want = tok.encode(text, add_special_tokens=special).ids
                    if ids != want:
                        bad += 1
                        print(f"FAILED: {kind}: {text[:40]!r}: C++ {ids[:12]}..., tokenizers {want[:12]}...")
                    expect_text = tok.decode(want, skip_special_tokens=False)
                    if decoded != expect_text:
                        bad += 1
                        print(f"FAILED: {kind}: decoding {text[:40]!r} gave {decoded[:40]!r}, "
                              f"tokenizers {expect_text[:40]!r}")
                n = sum(len(i) for i in got["ids"])
                print(f"{kind} (add_special={special}): {len(texts)} texts, {n} ids, "
                      f"{'equal' if not bad else f'{bad} differ'}; vocab {got['vocab_size']}")
                ok = ok and not bad
        # Refused by name: a normalizer the C++ tokenizer does not implement.
        spec = json.load(open(os.path.join(tmp, "gpt2.json")))
        refused = [("normalizer", dict(spec, normalizer={"type": "NFKC"})),
                   ("add_prefix_space", dict(spec, pre_tokenizer=dict(spec["pre_tokenizer"],
                                                                      add_prefix_space=True))),
                   ("decoder", dict(spec, decoder=None)),
                   ("lstrip", dict(spec, added_tokens=[dict(spec["added_tokens"][0], lstrip=True)]
                                   + spec["added_tokens"][1:]))]
        for needle, bad_spec in refused:
            path = os.path.join(tmp, f"bad_{needle}.json")
            json.dump(bad_spec, open(path, "w"))
            r = subprocess.run([a.cpp, path, texts_path], capture_output=True, text=True)
            if r.returncode == 0 or needle not in r.stderr:
                print(f"FAILED: {needle} was not refused by name: {r.returncode} {r.stderr}")
                ok = False
            else:
                print(f"refused: {r.stderr.strip()[:160]}")
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
