#!/usr/bin/env bash
# scripts/tokenize_text.py against the tokenizers themselves: on a generated text it trains a
# SentencePiece model and writes train.bin + val.bin whose ids are exactly that model's encoding
# of each line, file by file with the end-of-sequence id after each file, the last tenth as
# validation; the model has the documented special ids and byte fallback; given the model back
# (--sp-model) it writes the same bytes, and without end-of-sequence ids with --no-eos; a
# Hugging Face tokenizer.json (--hf-tokenizer, trained here by `tokenizers`, its end-of-sequence
# token named by tokenizer_config.json) gives that tokenizer's ids, uint32 on request; a
# missing file and a vocabulary too small are refused with a message.
#   tokenize_text.sh PYTHON
set -uo pipefail
py="$1"
source "$(dirname "${BASH_SOURCE[0]}")/../../scripts/lib.sh"
export ROOT="$FSDP_ROOT"
fsdp_scratch
cd "$tmp" || exit 1
"$py" - <<'PY'
import random
random.seed(5)
words = "the a model shard gather reduce rank tensor weight step loss train data token".split()
for name in ("one.txt", "two.txt"):
    with open(name, "w") as f:
        for _ in range(300):
            f.write(" ".join(random.choice(words) for _ in range(random.randint(3, 12))) + "\n")
        f.write("naïve ✓ 漢字 written once: only byte pieces can encode them\n")
PY
tok="$ROOT/scripts/tokenize_text.py"
"$py" "$tok" one.txt two.txt --out-dir a --vocab-size 300 || exit 1
"$py" "$tok" one.txt two.txt --out-dir b --sp-model a/tokenizer.model > /dev/null || exit 1
cmp a/train.bin b/train.bin && cmp a/val.bin b/val.bin || { echo "FAILED: --sp-model gave other bytes"; exit 1; }
"$py" - <<'PY' || exit 1
import json, os, subprocess, sys
import numpy as np, sentencepiece as spm
from tokenizers import Tokenizer, models, pre_tokenizers, trainers

def expected(encode, eos):
    ids = []
    for name in ("one.txt", "two.txt"):
        lines = [l.rstrip("\n") for l in open(name)]
        ids += [i for row in encode(lines) for i in row] + ([eos] if eos is not None else [])
    return np.array(ids)

sp = spm.SentencePieceProcessor(model_file="a/tokenizer.model")
assert sp.get_piece_size() == 300, sp.get_piece_size()
# The ids the script documents (hf_llama.py make-tiny and llama.cpp's converter rely on them),
# and byte fallback: text the pieces never saw still round-trips.
assert (sp.unk_id(), sp.bos_id(), sp.eos_id()) == (0, 1, 2), (sp.unk_id(), sp.bos_id(), sp.eos_id())
assert sp.decode(sp.encode("漢字 ✓")) == "漢字 ✓"  # seen once in the text: pieces of their own
assert sp.decode(sp.encode("Ωß")) == "Ωß"  # never seen: bytes
assert all(sp.id_to_piece(i).startswith("<0x") for i in sp.encode("Ωß")[1:])
want = expected(sp.encode, sp.eos_id())
train, val = np.fromfile("a/train.bin", "<u2"), np.fromfile("a/val.bin", "<u2")
got = np.concatenate([train, val])
assert len(val) == int(len(want) * 0.1), (len(val), len(want))
assert np.array_equal(got, want), "the token files are not SentencePiece's encoding of the lines"
assert got.max() < 300

# A Hugging Face tokenizer.json with an end-of-sequence token named by its config.
hf = Tokenizer(models.BPE(unk_token="[UNK]"))
hf.pre_tokenizer = pre_tokenizers.Whitespace()
hf.train(["one.txt", "two.txt"], trainers.BpeTrainer(vocab_size=120, special_tokens=["[UNK]", "<|done|>"], show_progress=False))
hf.save("tokenizer.json")
json.dump({"eos_token": "<|done|>"}, open("tokenizer_config.json", "w"))
subprocess.run([sys.executable, f"{os.environ['ROOT']}/scripts/tokenize_text.py", "one.txt",
                "two.txt", "--out-dir", "c", "--hf-tokenizer", ".", "--dtype", "uint32"],
               check=True, stdout=subprocess.DEVNULL)
enc = lambda lines: [e.ids for e in hf.encode_batch([l for l in lines if l], add_special_tokens=False)]
assert hf.token_to_id("<|done|>") is not None
want_hf = expected(enc, hf.token_to_id("<|done|>"))
got = np.concatenate([np.fromfile("c/train.bin", "<u4"), np.fromfile("c/val.bin", "<u4")])
assert np.array_equal(got, want_hf), "the token files are not the tokenizer.json's encoding"
# --no-eos and --val-fraction 0: the same ids without the end-of-sequence ones, all in train.bin.
subprocess.run([sys.executable, f"{os.environ['ROOT']}/scripts/tokenize_text.py", "one.txt",
                "two.txt", "--out-dir", "a", "--sp-model", "a/tokenizer.model", "--no-eos",
                "--val-fraction", "0"], check=True, stdout=subprocess.DEVNULL)
assert not os.path.exists("a/val.bin"), "val.bin left from the earlier run"
assert np.array_equal(np.fromfile("a/train.bin", "<u2"), expected(sp.encode, None))
print(f"tokenize_text: {len(want)} SentencePiece ids and {len(want_hf)} tokenizers ids, as the "
      "tokenizers themselves encode the lines")
PY
fail=0
expect_error "file not found: nope.txt" "$py" "$tok" nope.txt --out-dir d  # missing text
expect_error "--vocab-size 100" "$py" "$tok" one.txt --out-dir d --vocab-size 100  # vocabulary too small
[ "$fail" -eq 0 ] || exit 1
echo "tokenize_text: passed"
