"""Text files -> token files for train_llama (nanoGPT's raw format: little-endian uint16 ids, uint32
when the vocabulary does not fit in 16 bits or with --dtype uint32).

  python scripts/tokenize_text.py TEXT [TEXT ...] --out-dir DIR [--val-fraction 0.1] \
      [--sp-model tokenizer.model | --hf-tokenizer DIR_or_tokenizer.json | --vocab-size 1000] \
      [--dtype auto|uint16|uint32] [--no-eos]

With --sp-model the text is encoded by that SentencePiece model; with --hf-tokenizer by a Hugging
Face `tokenizers` tokenizer.json (or a directory holding one); with neither, a SentencePiece BPE
model of --vocab-size pieces (ids: <unk> 0, <s> 1, </s> 2; byte fallback, so any text encodes) is
trained on the text and written as DIR/tokenizer.model, the file that hf_llama.py make-tiny
--tokenizer and llama.cpp's convert_hf_to_gguf.py read.

Every file is encoded line by line (a newline is not a token: the pieces of consecutive lines
follow each other) and ends with the end-of-sequence id when the tokenizer has one (--no-eos:
not). The last --val-fraction of the token stream is DIR/val.bin, the rest DIR/train.bin.
Prints the counts; exits 1 with a message on a missing file, an empty result or a vocabulary too
large for --dtype uint16.
"""
import argparse
import json
import os
import sys
import tempfile
import time

import numpy as np


def fail(msg):
    sys.exit(f"tokenize_text.py: error: {msg}")


def read_lines(paths):
    for path in paths:
        with open(path, encoding="utf-8", errors="replace") as f:
            yield path, [line.rstrip("\n") for line in f]


def train_sentencepiece(paths, vocab_size, out_dir, threads):
    import sentencepiece as spm
    prefix = os.path.join(out_dir, "tokenizer")
    with tempfile.NamedTemporaryFile("w", suffix=".txt", delete=False, encoding="utf-8") as f:
        for _, lines in read_lines(paths):
            for line in lines:
                if line.strip():
                    f.write(line + "\n")
        corpus = f.name
    try:
        spm.SentencePieceTrainer.train(
            input=corpus, model_prefix=prefix, vocab_size=vocab_size, model_type="bpe",
            character_coverage=1.0, byte_fallback=True, unk_id=0, bos_id=1, eos_id=2, pad_id=-1,
            num_threads=threads, input_sentence_size=2_000_000, shuffle_input_sentence=True,
            minloglevel=2)
    except RuntimeError as e:
        fail(f"SentencePiece could not train a {vocab_size}-piece model on this text: {e} "
             f"(a smaller --vocab-size, or more text)")
    finally:
        os.unlink(corpus)
    os.remove(prefix + ".vocab")
    return prefix + ".model"


class SentencePiece:
    def __init__(self, path):
        import sentencepiece as spm
        self.sp = spm.SentencePieceProcessor(model_file=path)
        self.vocab = self.sp.get_piece_size()
        self.eos = self.sp.eos_id() if self.sp.eos_id() >= 0 else None
        self.name = f"SentencePiece {path}"

    def encode(self, lines):
        return self.sp.encode(lines)


class HFTokenizer:
    EOS_NAMES = ["</s>", "<|endoftext|>", "<|end_of_text|>", "<eos>", "[SEP]"]

    def __init__(self, path):
        from tokenizers import Tokenizer
        file = os.path.join(path, "tokenizer.json") if os.path.isdir(path) else path
        if not os.path.isfile(file):
            fail(f"no tokenizer.json at {path}")
        self.tok = Tokenizer.from_file(file)
        self.vocab = self.tok.get_vocab_size(with_added_tokens=True)
        ids = [self.tok.token_to_id(n) for n in self.EOS_NAMES]
        config = os.path.join(os.path.dirname(file), "tokenizer_config.json")
        if os.path.isfile(config):  # the end-of-sequence token the tokenizer's config names
            with open(config) as f:
                eos = json.load(f).get("eos_token")
            if isinstance(eos, dict):
                eos = eos.get("content")
            if eos is not None and self.tok.token_to_id(eos) is not None:
                ids = [self.tok.token_to_id(eos)]
        self.eos = next((i for i in ids if i is not None), None)
        self.name = f"tokenizers {file}"

    def encode(self, lines):
        return [e.ids for e in self.tok.encode_batch(lines, add_special_tokens=False)]


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("text", nargs="+", help="UTF-8 text files")
    p.add_argument("--out-dir", required=True)
    p.add_argument("--val-fraction", type=float, default=0.1)
    which = p.add_mutually_exclusive_group()
    which.add_argument("--sp-model", help="a SentencePiece tokenizer.model")
    which.add_argument("--hf-tokenizer", help="a tokenizer.json, or a directory holding one")
    p.add_argument("--vocab-size", type=int, default=1000,
                   help="pieces of the SentencePiece BPE model trained when no tokenizer is given")
    p.add_argument("--dtype", choices=["auto", "uint16", "uint32"], default="auto")
    p.add_argument("--no-eos", action="store_true", help="no end-of-sequence id after each file")
    p.add_argument("--threads", type=int, default=2, help="SentencePiece training threads")
    a = p.parse_args()
    for path in a.text + [x for x in [a.sp_model] if x]:
        if not os.path.isfile(path):
            fail(f"file not found: {path}")
    if not 0 <= a.val_fraction < 1:
        fail(f"--val-fraction {a.val_fraction} is not in [0, 1)")
    if a.vocab_size < 260 and not (a.sp_model or a.hf_tokenizer):
        fail(f"--vocab-size {a.vocab_size}: byte fallback alone needs 259 pieces; give at least 260")
    os.makedirs(a.out_dir, exist_ok=True)

    t0 = time.perf_counter()
    sp_model = a.sp_model
    if not (sp_model or a.hf_tokenizer):
        sp_model = train_sentencepiece(a.text, a.vocab_size, a.out_dir, a.threads)
        print(f"trained a {a.vocab_size}-piece SentencePiece BPE model: {sp_model} "
              f"({time.perf_counter() - t0:.1f}s)")
    tok = SentencePiece(sp_model) if sp_model else HFTokenizer(a.hf_tokenizer)

    dtype = a.dtype
    if dtype == "auto":
        dtype = "uint16" if tok.vocab <= 1 << 16 else "uint32"
    elif dtype == "uint16" and tok.vocab > 1 << 16:
        fail(f"the vocabulary has {tok.vocab} ids, too many for uint16 (ids up to 65535): "
             f"use --dtype uint32 (and train_llama --tokens-dtype uint32)")

    pieces, lines_seen = [], 0
    for path, lines in read_lines(a.text):
        ids = [i for row in tok.encode([line for line in lines if line]) for i in row]
        lines_seen += len(lines)
        if tok.eos is not None and not a.no_eos:
            ids.append(tok.eos)
        print(f"{path}: {len(lines)} lines, {len(ids)} tokens")
        pieces.append(np.asarray(ids, dtype=np.int64))
    tokens = np.concatenate(pieces)
    if len(tokens) == 0:
        fail("the text encodes to no tokens")
    if tokens.max() >= tok.vocab:
        fail(f"token id {tokens.max()} >= the vocabulary's {tok.vocab}")
    n_val = int(len(tokens) * a.val_fraction)
    train, val = tokens[:len(tokens) - n_val], tokens[len(tokens) - n_val:]
    np_dtype = {"uint16": "<u2", "uint32": "<u4"}[dtype]
    train.astype(np_dtype).tofile(os.path.join(a.out_dir, "train.bin"))
    written = [f"train.bin {len(train)}"]
    if n_val:
        val.astype(np_dtype).tofile(os.path.join(a.out_dir, "val.bin"))
        written.append(f"val.bin {len(val)}")
    elif os.path.exists(os.path.join(a.out_dir, "val.bin")):
        os.remove(os.path.join(a.out_dir, "val.bin"))  # not left from an earlier run
    print(f"{tok.name}: vocab {tok.vocab}, {len(tokens)} tokens from {lines_seen} lines "
          f"({time.perf_counter() - t0:.1f}s); wrote {dtype} {', '.join(written)} in {a.out_dir}")


if __name__ == "__main__":
    main()
