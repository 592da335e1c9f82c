"""Checks a model that the C++ trainer exported in Hugging Face format: transformers'
LlamaForCausalLM and MLX's mlx_lm llama load the directory and compute the validation loss, which
must equal the loss the trainer printed for the same windows.

  python llama_export_check.py --hf-dir EXPORTED --val-tokens val.bin --seq 64 --expect 5.1234567 \
      [--frameworks transformers,mlx] [--tokens-dtype uint16|uint32]

Windows are tokens[i*seq : i*seq+seq+1], i = 0 .. (n-1)//seq - 1; the loss is the mean next-token
cross entropy over every prediction (hf_llama.py val-loss). Tolerances (relative to --expect):
transformers 1e-5, MLX 1e-4 (--tolerance NAME=VALUE changes one). Prints a table; exits 0 when every
framework agrees, 1 on a mismatch or a framework that cannot load the directory, 2 on a usage error.
"""
import argparse, os, sys, time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import hf_llama  # noqa: E402

TOLERANCE = {"transformers": 1e-5, "mlx": 1e-4}


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--hf-dir", required=True, help="the exported model directory")
    p.add_argument("--val-tokens", required=True)
    p.add_argument("--tokens-dtype", choices=sorted(hf_llama.TOKEN_DTYPES), default="uint16")
    p.add_argument("--seq", type=int, required=True)
    p.add_argument("--expect", type=float, required=True, help="the trainer's validation loss")
    p.add_argument("--frameworks", default="transformers,mlx")
    p.add_argument("--tolerance", action="append", default=[], metavar="NAME=VALUE")
    p.add_argument("--batch", type=int, default=8, help="windows per forward")
    a = p.parse_args()
    frameworks = [f for f in a.frameworks.split(",") if f]
    unknown = [f for f in frameworks if f not in TOLERANCE]
    if unknown or not frameworks:
        p.error(f"--frameworks: unknown {unknown}; choose from {sorted(TOLERANCE)}")
    tolerance = dict(TOLERANCE)
    for item in a.tolerance:
        name, _, value = item.partition("=")
        if name not in tolerance:
            p.error(f"--tolerance {item}: unknown framework {name!r}")
        try:
            tolerance[name] = float(value)
        except ValueError:
            p.error(f"--tolerance {item}: {value!r} is not a number")
    if a.seq < 1:
        p.error("--seq must be positive")
    try:
        cfg = hf_llama.hf_config(a.hf_dir)
        tokens = hf_llama.read_tokens(a.val_tokens, a.tokens_dtype)
        hf_llama.check_vocab(tokens, cfg["vocab_size"], a.val_tokens)
    except hf_llama.Fail as e:
        sys.exit(f"llama_export_check.py: error: {e}")

    rows = []
    for name in frameworks:
        t0 = time.perf_counter()
        try:
            _, logits_fn = hf_llama.framework(name, a.hf_dir)
            loss, windows = hf_llama.val_loss(logits_fn, tokens, a.seq, a.batch)
            rows.append((name, loss, windows, time.perf_counter() - t0, None))
        except Exception as e:  # a framework that cannot load the export is a failed check
            rows.append((name, None, 0, time.perf_counter() - t0, f"{type(e).__name__}: {e}"))

    tied = cfg.get("tie_word_embeddings", False)
    print(f"{a.hf_dir}: vocab {cfg['vocab_size']}, hidden {cfg['hidden_size']}, "
          f"{cfg['num_hidden_layers']} layers, {'tied' if tied else 'untied'} head; "
          f"expected val loss {a.expect:.9g}")
    print(f"{'framework':<13} {'val loss':>14} {'rel err':>10} {'tolerance':>10} {'windows':>8} "
          f"{'time':>7}  result")
    failed = 0
    for name, loss, windows, took, error in rows:
        if loss is None:
            failed += 1
            print(f"{name:<13} {'-':>14} {'-':>10} {tolerance[name]:>10.0e} {'-':>8} {took:>6.1f}s  "
                  f"FAIL  {error}")
            continue
        err = abs(loss - a.expect) / abs(a.expect)
        ok = err <= tolerance[name]
        failed += not ok
        print(f"{name:<13} {loss:>14.9g} {err:>10.2e} {tolerance[name]:>10.0e} {windows:>8} "
              f"{took:>6.1f}s  {'ok' if ok else 'FAIL'}")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
