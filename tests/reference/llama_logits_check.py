"""The C++ Llama model (fsdp::models::llama) against Hugging Face transformers and MLX.

  python llama_logits_check.py --cpp build/bin/llama_logits [--work DIR] [--keep]
      logits: tiny random models saved by transformers (GQA, MQA, tied and untied, vocab 1001,
      fp32/bf16/fp16 storage, sharded files, attention and MLP biases, head_dim != hidden/heads,
      rotary scaling llama3 (as Llama 3.1's files write it) and linear, Mistral, Qwen2) loaded
      by the C++ program at world 1 (and 3: sharded over thread ranks); its
      logits must be within 1e-5 relative (max |diff| / max |logit|) of transformers'.
  python llama_logits_check.py --cpp build/bin/llama_logits --export
      exports: random models built by the C++ program from a config.json (untied, tied, and
      with llama3 rotary scaling, at world 2, saved sharded by save_hf_checkpoint, fp32 and bf16) must load in transformers
      with the same logits (1e-5) and give the C++ validation loss under transformers (1e-5) and
      MLX (1e-4, when installed).

Prints one row per check and exits 1 on any failure. transformers runs in fp32 with sdpa
attention (hf_llama.load_transformers), as on the CPU the C++ model mirrors.
"""
import argparse, json, os, shutil, subprocess, sys, tempfile

import numpy as np
import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import hf_llama  # noqa: E402

SEQ, COUNT, VOCAB = 32, 4, 1001
# Llama 3.1's rotary scaling with a 64-token original context: at head size 16 and theta 10000
# the wavelengths 6.3 / 19.9, 62.8 / 199 and above fall in its three bands (< 16, 16-64, > 64).
LLAMA3_ROPE = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
               "high_freq_factor": 4.0, "original_max_position_embeddings": 64}
TOLERANCE = 1e-5
MLX_TOLERANCE = 1e-4


def write_tokens(path, n, vocab, seed):
    ids = np.random.default_rng(seed).integers(0, vocab, size=n).astype("<u2")
    ids.tofile(path)
    return path


def relative(a, b):
    return ((a - b).abs().max() / b.abs().max()).item()


def run_cpp(cpp, *args):
    cmd = [cpp] + [str(a) for a in args]
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed ({r.returncode}):\n{r.stdout}{r.stderr}")


def read_logits(path):
    from safetensors.torch import load_file
    return load_file(path)["logits"]


def transformers_logits(hf_dir, tokens_path, count):
    tokens = hf_llama.read_tokens(tokens_path)
    inputs, _ = hf_llama.val_windows(tokens, SEQ, 0, count)
    from transformers import AutoModelForCausalLM
    model = AutoModelForCausalLM.from_pretrained(hf_dir, dtype=torch.float32,
                                                 attn_implementation="sdpa").eval()
    with torch.no_grad():
        return model(input_ids=inputs, use_cache=False).logits.float()


def random_relative(model_cls, config_cls, out, seed, **kw):
    """A Mistral or Qwen2 model saved by transformers, every weight N(0, 0.1) (norms 1 + N)."""
    torch.manual_seed(seed)
    model = model_cls(config_cls(**kw))
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.copy_((1 if name.endswith("norm.weight") else 0) + 0.1 * torch.randn_like(p))
    model.save_pretrained(out)
    return out


def make_cases(work):
    small = dict(vocab=VOCAB, hidden=64, layers=2, heads=4, intermediate=160)
    cases = []

    def tiny(name, **kw):
        args = {**small, "kv_heads": None, "tied": False, "seed": len(cases) + 1, **kw}
        out = os.path.join(work, name)
        hf_llama.make_tiny(out, args.pop("vocab"), args.pop("hidden"), args.pop("layers"),
                           args.pop("heads"), args.pop("kv_heads"), args.pop("intermediate"),
                           **args)
        return out
    d = tiny("gqa_untied_fp32", kv_heads=2)
    cases += [("llama gqa untied fp32", d, 1), ("llama gqa untied fp32", d, 3)]
    cases.append(("llama tied, bf16 storage, sharded files, rope_theta 100",
                  tiny("tied_bf16_sharded", kv_heads=2, tied=True, dtype="bf16",
                       max_shard_size="100KB", rope_theta=100.0), 2))
    cases.append(("llama MQA, attention+MLP bias, head_dim 24, fp16 storage",
                  tiny("bias_headdim_fp16", kv_heads=1, head_dim=24, attention_bias=True,
                       mlp_bias=True, dtype="fp16", rms_norm_eps=1e-6), 1))
    cases.append(("llama MHA, rope_theta 500000", tiny("mha", rope_theta=500000.0), 1))
    cases.append(("llama rope_scaling llama3 (Llama 3.1's layout)",
                  tiny("rope_llama3", kv_heads=2, rope_scaling=LLAMA3_ROPE,
                       rope_key="rope_scaling"), 1))
    cases.append(("llama rope_parameters linear, factor 4",
                  tiny("rope_linear", kv_heads=2,
                       rope_scaling={"rope_type": "linear", "factor": 4.0}), 2))
    from transformers import (MistralConfig, MistralForCausalLM, Qwen2Config,
                              Qwen2ForCausalLM)
    common = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=160, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2)
    cases.append(("mistral (no sliding window), head_dim 24",
                  random_relative(MistralForCausalLM, MistralConfig, os.path.join(work, "mistral"),
                                  11, sliding_window=None, head_dim=24, **common), 1))
    cases.append(("qwen2 (q/k/v biases), tied",
                  random_relative(Qwen2ForCausalLM, Qwen2Config, os.path.join(work, "qwen2"), 12,
                                  tie_word_embeddings=True, **common), 2))
    return cases


def check_logits(cpp, work):
    tokens = write_tokens(os.path.join(work, "val.bin"), SEQ * COUNT + 1, VOCAB, 5)
    rows = []
    for name, hf_dir, world in make_cases(work):
        out = os.path.join(work, f"cpp_{len(rows)}.safetensors")
        run_cpp(cpp, "--hf-dir", hf_dir, "--tokens", tokens, "--seq", SEQ, "--count", COUNT,
                "--out", out, "--world", world)
        got, want = read_logits(out), transformers_logits(hf_dir, tokens, COUNT)
        err = relative(got, want)
        varies = want.std(-1).mean().item()
        rows.append((f"{name} (C++ world {world}) vs transformers", err, TOLERANCE,
                     err <= TOLERANCE and varies >= 0.1 and got.shape == want.shape))
    return rows


def export_config(path, tied, rope_scaling=None):
    cfg = {"model_type": "llama", "vocab_size": VOCAB, "hidden_size": 64,
           "intermediate_size": 160, "num_hidden_layers": 2, "num_attention_heads": 4,
           "num_key_value_heads": 2, "rms_norm_eps": 1e-5, "rope_theta": 5000.0,
           "initializer_range": 0.1, "tie_word_embeddings": tied}
    if rope_scaling:
        cfg["rope_scaling"] = rope_scaling
    with open(path, "w") as f:
        json.dump(cfg, f)
    return path


def loss_of(logits, tokens, count):
    """The validation loss of the C++ logits, summed as hf_llama.val_loss sums (batches of 8)."""
    _, targets = hf_llama.val_windows(tokens, SEQ, 0, count)
    total = 0.0
    for first in range(0, count, 8):
        part = slice(first, min(count, first + 8))
        total += F.cross_entropy(logits[part].reshape(-1, logits.shape[-1]),
                                 targets[part].reshape(-1), reduction="sum").double().item()
    return total / targets.numel()


def plain_mlx(hf_dir):
    """mlx_lm's loader with nothing overridden: config.json alone must say tie_word_embeddings
    and rope_theta (mlx_lm's defaults are tied and 10000)."""
    from pathlib import Path
    import mlx.core as mx
    from mlx_lm.utils import load_model
    model, _ = load_model(Path(hf_dir))
    model.set_dtype(mx.float32)
    return lambda inputs: hf_llama.mlx_logits(model, inputs)


def check_exports(cpp, work):
    windows = 6
    tokens_path = write_tokens(os.path.join(work, "val.bin"), SEQ * windows + 1, VOCAB, 6)
    tokens = hf_llama.read_tokens(tokens_path)
    try:
        import mlx.core  # noqa: F401
        have_mlx = True
    except ImportError:
        have_mlx = False
        print("MLX is not installed: the MLX rows are skipped")
    rows = []
    for label, tied, rope in (("untied", False, None), ("tied", True, None),
                              ("llama3-rope", False, LLAMA3_ROPE)):
        cfg = export_config(os.path.join(work, f"config_{label}.json"), tied, rope)
        exported = os.path.join(work, f"export_{label}")
        cpp_out = os.path.join(work, f"cpp_export_{label}.safetensors")
        run_cpp(cpp, "--config", cfg, "--seed", 3, "--world", 2, "--tokens", tokens_path,
                "--seq", SEQ, "--count", windows, "--out", cpp_out, "--export", exported,
                "--max-shard-bytes", 100000)
        files = sorted(os.listdir(exported))
        sharded = "model.safetensors.index.json" in files
        cpp_logits = read_logits(cpp_out)
        want = transformers_logits(exported, tokens_path, windows)
        err = relative(cpp_logits, want)
        rows.append((f"{label} export (sharded: {sharded}) loaded by transformers: logits", err,
                     TOLERANCE, err <= TOLERANCE and sharded))
        cpp_loss = loss_of(cpp_logits, tokens, windows)
        frameworks = ["transformers"] + (["mlx"] if have_mlx else [])
        for fw in frameworks:
            fn = plain_mlx(exported) if fw == "mlx" else hf_llama.framework(fw, exported)[1]
            loss, n = hf_llama.val_loss(fn, tokens, SEQ, 8)
            tol = TOLERANCE if fw == "transformers" else MLX_TOLERANCE
            rel = abs(loss - cpp_loss) / abs(cpp_loss)
            rows.append((f"{label} export: {fw} val loss {loss:.8f} vs C++ {cpp_loss:.8f} "
                         f"({n} windows)", rel, tol, rel <= tol and n == windows))
        # bf16 files: transformers and the C++ model loading them back agree.
        exported16 = os.path.join(work, f"export16_{label}")
        run_cpp(cpp, "--config", cfg, "--seed", 3, "--world", 1, "--tokens", tokens_path,
                "--seq", SEQ, "--count", windows, "--out", cpp_out, "--export", exported16,
                "--export-dtype", "bf16")
        with open(os.path.join(exported16, "config.json")) as f:
            dtype = json.load(f)["dtype"]
        back = os.path.join(work, f"cpp_back16_{label}.safetensors")
        run_cpp(cpp, "--hf-dir", exported16, "--tokens", tokens_path, "--seq", SEQ, "--count",
                windows, "--out", back)
        err = relative(read_logits(back), transformers_logits(exported16, tokens_path, windows))
        rows.append((f"{label} bf16 export (config dtype {dtype}) reloaded: C++ vs transformers",
                     err, TOLERANCE, err <= TOLERANCE and dtype == "bfloat16"))
    return rows


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--cpp", required=True, help="build/bin/llama_logits")
    p.add_argument("--export", action="store_true", help="check save_hf_checkpoint's exports")
    p.add_argument("--work", help="scratch directory (default: a temporary one)")
    p.add_argument("--keep", action="store_true", help="keep the scratch directory")
    a = p.parse_args()
    torch.set_num_threads(1)
    from transformers.utils import logging
    logging.set_verbosity_error()
    logging.disable_progress_bar()
    work = a.work or tempfile.mkdtemp(prefix="llama_logits_check_")
    os.makedirs(work, exist_ok=True)
    try:
        rows = check_exports(a.cpp, work) if a.export else check_logits(a.cpp, work)
    finally:
        if not a.keep and not a.work:
            shutil.rmtree(work, ignore_errors=True)
    failed = 0
    for name, err, tol, ok in rows:
        failed += not ok
        print(f"{'ok  ' if ok else 'FAIL'} {err:9.2e} (tolerance {tol:.0e})  {name}")
    print(f"{len(rows) - failed} of {len(rows)} checks passed")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
