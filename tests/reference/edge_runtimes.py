"""Validation loss of a Llama model under edge runtimes, against the loss the C++ trainer printed:
llama.cpp (through llama-cpp-python, on GGUF files made by llama.cpp's convert_hf_to_gguf.py; on
its CPU backend, and with --device vulkan on its Vulkan backend, whose perplexity must also equal
the CPU backend's within 1e-3) and
ExecuTorch (a .pte exported from transformers' LlamaForCausalLM, run by ExecuTorch's runtime).
scripts/check_edge_runtimes.sh prepares both and calls this; each subcommand appends one JSON row
per runtime to --rows, and `table` prints them and sets the exit status.

  python edge_runtimes.py llamacpp --gguf f32=model-f32.gguf --gguf f16=model-f16.gguf \
      --val-tokens val.bin --seq 64 --expect 5.123 --rows rows.jsonl [--tokens-dtype uint16]
  python edge_runtimes.py executorch --hf-dir DIR --val-tokens val.bin --seq 64 --expect 5.123 \
      --rows rows.jsonl [--backends portable,xnnpack] [--work DIR]
  python edge_runtimes.py table --rows rows.jsonl --expect 5.123

The windows are hf_llama.py's validation windows (tokens[i*seq : i*seq+seq+1]); every position's
logits are evaluated (llama.cpp: Llama(logits_all=True), one window per context, reset between),
the loss is the mean next-token cross entropy and ppl = exp(loss). A runtime passes when
|ppl / exp(expected) - 1| <= --tolerance (default 1%); ExecuTorch's logits of the first window must
also agree with transformers' within 1e-4 (max |diff| / max |logit|).
"""
import argparse, json, math, os, sys, time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import hf_llama  # noqa: E402

LOGITS_TOLERANCE = 1e-4
# llama.cpp's Vulkan backend against its CPU backend on the same file (relative, on ppl).
VULKAN_TOLERANCE = 1e-3


def nll_sum(logits, targets):
    """Sum over positions of the cross entropy, in float64: logits [L, V], targets [L]."""
    s = np.asarray(logits, dtype=np.float64)
    top = s.max(axis=-1, keepdims=True)
    lse = top[:, 0] + np.log(np.exp(s - top).sum(axis=-1))
    return float((lse - s[np.arange(len(targets)), targets]).sum())


def add_row(path, row):
    with open(path, "a") as f:
        f.write(json.dumps(row) + "\n")


def windows(a):
    tokens = hf_llama.read_tokens(a.val_tokens, a.tokens_dtype)
    n = hf_llama.val_window_count(len(tokens), a.seq)
    if n < 1:
        raise hf_llama.Fail(f"{len(tokens)} validation tokens hold no window of seq={a.seq} (+1)")
    if a.max_windows:
        n = min(n, a.max_windows)
    return tokens, n


VULKAN_DEVICES = []


class captured_stderr:
    """The process's stderr (fd 2, where llama.cpp logs) into a buffer: `.text` after."""

    def __enter__(self):
        import tempfile
        self.file = tempfile.TemporaryFile(mode="w+b")
        sys.stderr.flush()
        self.saved = os.dup(2)
        os.dup2(self.file.fileno(), 2)
        return self

    def __exit__(self, *exc):
        sys.stderr.flush()
        os.dup2(self.saved, 2)
        os.close(self.saved)
        self.file.seek(0)
        self.text = self.file.read().decode(errors="replace")
        self.file.close()
        return False


def open_llama(Llama, path, a):
    """llama-cpp-python's Llama on `path`; on --device vulkan every layer offloaded, and the
    Vulkan device's name read from llama.cpp's log (ggml_vulkan: 0 = NAME | ...), which is
    written to the process's stderr: captured around the load."""
    # The KV cache in f32 (type 0): llama.cpp's default f16 cache would round the keys and
    # values of an f32 model (and its f16 path measured 20x slower on this CPU).
    kwargs = dict(model_path=path, n_ctx=a.seq, n_batch=a.seq, n_ubatch=a.seq, logits_all=True,
                  n_threads=a.threads, n_threads_batch=a.threads, type_k=0, type_v=0)
    if a.device == "cpu":
        return Llama(verbose=False, **kwargs), "CPU"
    import re
    with captured_stderr() as log:
        llm = Llama(verbose=True, n_gpu_layers=-1, **kwargs)
    text = log.text
    # ggml lists the devices once per process, at the first load.
    VULKAN_DEVICES.extend(d.strip() for d in re.findall(r"ggml_vulkan: \d+ = ([^|\n]+)", text))
    devices = VULKAN_DEVICES
    placed = re.findall(r"layer +\d+ assigned to device (\w+)", text)
    if not devices:
        raise hf_llama.Fail("llama.cpp found no Vulkan device (is this llama-cpp-python built "
                            "with -DGGML_VULKAN=ON, and is a Vulkan driver installed: "
                            "mesa-vulkan-drivers for lavapipe?)")
    if not placed or any(not d.startswith("Vulkan") for d in placed):
        raise hf_llama.Fail(f"llama.cpp did not put every layer on Vulkan: {placed}")
    return llm, f"Vulkan: {devices[0].strip()}, {len(placed)} layers on it"


def cmd_llamacpp(a):
    if a.device == "vulkan":
        # ggml leaves out Vulkan devices of the CPU type (Mesa's lavapipe on a machine without a
        # GPU) unless they are named: the first device, unless the caller names others.
        os.environ.setdefault("GGML_VK_VISIBLE_DEVICES", "0")
    try:
        import llama_cpp
        from llama_cpp import Llama
    except ImportError as e:
        raise hf_llama.Fail(f"llama-cpp-python is not installed ({e}): "
                            f"scripts/check_edge_runtimes.sh builds and installs it")
    tokens, n = windows(a)
    for spec in a.gguf:
        label, _, path = spec.partition("=")
        if not path or not os.path.isfile(path):
            raise hf_llama.Fail(f"--gguf {spec}: expected LABEL=FILE of an existing GGUF file")
        t0 = time.perf_counter()
        llm, device = open_llama(Llama, path, a)
        if int(tokens[:n * a.seq + 1].max()) >= llm.n_vocab():
            raise hf_llama.Fail(f"token id {int(tokens.max())} >= the GGUF vocabulary {llm.n_vocab()}")
        total = 0.0
        for i in range(n):
            w = tokens[i * a.seq:i * a.seq + a.seq + 1].astype(np.int64)
            llm.reset()
            llm.eval(w[:-1].tolist())
            total += nll_sum(llm.scores[:a.seq], w[1:])
        loss = total / (n * a.seq)
        took = time.perf_counter() - t0
        backend = "" if a.device == "cpu" else " Vulkan"
        row = dict(runtime=f"llama.cpp {llama_cpp.__version__}{backend}", dtype=label,
                   val_loss=loss, windows=n, time_s=round(took, 2), tolerance=a.tolerance,
                   note=f"{os.path.basename(path)} ({device})", backend=a.device)
        add_row(a.rows, row)
        print(f"llama.cpp {label} on {device}: val_loss {loss:.9g} over {n} windows "
              f"({took:.1f}s)", flush=True)
        with captured_stderr():  # a verbose model logs its teardown
            del llm


def export_pte(model, seq, backend, path):
    import torch
    from executorch.exir import to_edge_transform_and_lower

    class Logits(torch.nn.Module):
        def __init__(self, m):
            super().__init__()
            self.m = m

        def forward(self, ids):
            return self.m(input_ids=ids, use_cache=False).logits

    example = (torch.zeros(1, seq, dtype=torch.long),)
    program = torch.export.export(Logits(model).eval(), example, strict=False)
    partitioner = []
    if backend == "xnnpack":
        from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner
        partitioner = [XnnpackPartitioner()]
    et = to_edge_transform_and_lower(program, partitioner=partitioner).to_executorch()
    with open(path, "wb") as f:
        f.write(et.buffer)
    return len(et.buffer)


def cmd_executorch(a):
    import torch
    try:
        from executorch.runtime import Runtime
    except ImportError as e:
        raise hf_llama.Fail(f"ExecuTorch is not installed ({e}): scripts/check_edge_runtimes.sh "
                            f"sets up its venv")
    from executorch.version import __version__ as version
    tokens, n = windows(a)
    model = hf_llama.load_transformers(a.hf_dir)
    if int(tokens[:n * a.seq + 1].max()) >= model.config.vocab_size:
        raise hf_llama.Fail(f"token id {int(tokens.max())} >= the model's vocab_size")
    os.makedirs(a.work, exist_ok=True)
    runtime = Runtime.get()
    for backend in a.backends.split(","):
        t0 = time.perf_counter()
        path = os.path.join(a.work, f"model-{backend}.pte")
        try:
            size = export_pte(model, a.seq, backend, path)
        except Exception as e:  # recorded as a failed row, the other backends still run
            add_row(a.rows, dict(runtime=f"executorch {version} {backend}", dtype="fp32",
                                 val_loss=None, windows=0, time_s=0, tolerance=a.tolerance,
                                 note=f"export failed: {type(e).__name__}: {str(e)[:200]}"))
            print(f"executorch {backend}: export failed: {e}", flush=True)
            continue
        exported = time.perf_counter() - t0
        method = runtime.load_program(path).load_method("forward")
        total, logits_err = 0.0, None
        for i in range(n):
            w = torch.from_numpy(tokens[i * a.seq:i * a.seq + a.seq + 1].astype(np.int64))
            out = method.execute([w[:-1].unsqueeze(0).contiguous()])[0][0]
            total += nll_sum(out.float().numpy(), w[1:].numpy())
            if i == 0:
                with torch.no_grad():
                    want = hf_llama.transformers_logits(model, w[:-1].unsqueeze(0))[0]
                logits_err = ((out.float() - want).abs().max() / want.abs().max()).item()
        loss = total / (n * a.seq)
        took = time.perf_counter() - t0
        add_row(a.rows, dict(runtime=f"executorch {version} {backend}", dtype="fp32", val_loss=loss,
                             windows=n, time_s=round(took, 2), tolerance=a.tolerance,
                             logits_rel_err=logits_err, logits_tolerance=LOGITS_TOLERANCE,
                             note=f"{size // 1024} KiB .pte, export {exported:.1f}s, "
                                  f"logits vs transformers {logits_err:.2e}"))
        print(f"executorch {backend}: val_loss {loss:.9g} over {n} windows, logits vs transformers "
              f"{logits_err:.3g} ({took:.1f}s)", flush=True)


def cmd_table(a):
    if not os.path.isfile(a.rows):
        raise hf_llama.Fail(f"no results in {a.rows}")
    with open(a.rows) as f:
        rows = [json.loads(line) for line in f if line.strip()]
    if not rows:
        raise hf_llama.Fail(f"no results in {a.rows}")
    want = math.exp(a.expect)
    print(f"expected val loss {a.expect:.9g} (the trainer's), exp = {want:.6g}")
    print(f"{'runtime':<30} {'dtype':<6} {'val loss':>12} {'ppl':>12} {'exp(expected)':>14} "
          f"{'rel err':>9} {'time':>7}  result")
    failed = 0
    for r in rows:
        if r["val_loss"] is None:
            failed += 1
            print(f"{r['runtime']:<30} {r['dtype']:<6} {'-':>12} {'-':>12} {want:>14.6g} {'-':>9} "
                  f"{'-':>7}  FAIL  {r['note']}")
            continue
        ppl = math.exp(r["val_loss"])
        err = abs(ppl / want - 1)
        ok = err <= r["tolerance"]
        if r.get("logits_rel_err") is not None:
            ok = ok and r["logits_rel_err"] <= r["logits_tolerance"]
        failed += not ok
        print(f"{r['runtime']:<30} {r['dtype']:<6} {r['val_loss']:>12.7f} {ppl:>12.6g} {want:>14.6g} "
              f"{err:>9.2e} {r['time_s']:>6.1f}s  {'ok' if ok else 'FAIL'}  {r.get('note', '')}")
    # The Vulkan backend against the CPU backend on the same GGUF file: the same perplexity.
    cpu = {r["dtype"]: r for r in rows if r.get("backend") == "cpu" and r["val_loss"] is not None}
    checks = len(rows)
    for r in rows:
        if r.get("backend") != "vulkan" or r["val_loss"] is None or r["dtype"] not in cpu:
            continue
        diff = abs(math.exp(r["val_loss"]) / math.exp(cpu[r["dtype"]]["val_loss"]) - 1)
        ok = diff <= VULKAN_TOLERANCE
        checks += 1
        failed += not ok
        print(f"llama.cpp {r['dtype']}: Vulkan's ppl against the CPU backend's: relative "
              f"difference {diff:.2e} (tolerance {VULKAN_TOLERANCE:g})  {'ok' if ok else 'FAIL'}")
    print(f"{checks - failed} of {checks} checks agree (tolerance on ppl "
          f"{rows[0]['tolerance']:.0%})")
    if failed:
        sys.exit(1)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="command", required=True)

    def common(s):
        s.add_argument("--val-tokens", required=True)
        s.add_argument("--tokens-dtype", choices=sorted(hf_llama.TOKEN_DTYPES), default="uint16")
        s.add_argument("--seq", type=int, required=True)
        s.add_argument("--expect", type=float, required=True, help="the trainer's validation loss")
        s.add_argument("--rows", required=True, help="JSONL file the result rows are appended to")
        s.add_argument("--tolerance", type=float, default=0.01, help="on ppl, relative")
        s.add_argument("--max-windows", type=int, help="evaluate only the first N windows")
        s.add_argument("--threads", type=int, default=1, help="llama.cpp threads (n_threads and "
                       "n_threads_batch; 2 spinning ggml threads on a busy 2-core machine measured "
                       "70x slower than 1 on a tiny model)")

    s = sub.add_parser("llamacpp", help="GGUF files under llama-cpp-python")
    s.add_argument("--gguf", action="append", required=True, help="LABEL=FILE, e.g. f16=model.gguf")
    s.add_argument("--device", choices=["cpu", "vulkan"], default="cpu",
                   help="vulkan: every layer on llama.cpp's Vulkan backend (a build with "
                        "-DGGML_VULKAN=ON), the device's name in the row")
    common(s)
    s.set_defaults(func=cmd_llamacpp)
    s = sub.add_parser("executorch", help="export to .pte and run with ExecuTorch's runtime")
    s.add_argument("--hf-dir", required=True)
    s.add_argument("--backends", default="portable,xnnpack")
    s.add_argument("--work", default=".", help="where the .pte files go")
    common(s)
    s.set_defaults(func=cmd_executorch)
    s = sub.add_parser("table", help="print the rows; exit 1 if any runtime disagrees")
    s.add_argument("--rows", required=True)
    s.add_argument("--expect", type=float, required=True)
    s.set_defaults(func=cmd_table)
    a = p.parse_args()
    try:
        a.func(a)
    except hf_llama.Fail as e:
        sys.exit(f"edge_runtimes.py {a.command}: error: {e}")


if __name__ == "__main__":
    main()
