"""Time of one torch.optim.AdamW step over MiniLLM's parameters in PyTorch: the CPU default
(single-tensor loop), foreach=True and fused=True, alternating, medians; the counterpart of
build/bin/optimizer_bench.
  python optimizer_step.py [--dim 256 --layers 4 --vocab 32000 --rounds 5 --steps 10 --threads 1]
"""
import argparse, statistics, time

import torch

from py_minillm import MiniLLM


def main():
    p = argparse.ArgumentParser()
    for k, v in dict(vocab=32000, dim=256, layers=4, heads=8, rounds=5, steps=10, threads=1).items():
        p.add_argument(f"--{k}", type=int, default=v)
    a = p.parse_args()
    torch.set_num_threads(a.threads)
    kinds = {"default": {}, "foreach": dict(foreach=True), "fused": dict(fused=True)}
    opts = {}
    for name, kw in kinds.items():
        torch.manual_seed(0)
        m = MiniLLM(a.vocab, a.dim, a.layers, a.heads)
        for q in m.parameters():
            q.grad = torch.randn_like(q)
        opts[name] = torch.optim.AdamW(m.parameters(), lr=3e-4, **kw)
        opts[name].step()  # creates the state
    times = {name: [] for name in kinds}
    for _ in range(a.rounds):
        for name, opt in opts.items():
            t0 = time.perf_counter()
            for _ in range(a.steps):
                opt.step()
            times[name].append((time.perf_counter() - t0) / a.steps)
    n = sum(q.numel() for q in m.parameters())
    print(f"params {n / 1e6:.2f}M, {a.threads} thread(s), median of {a.rounds} rounds x {a.steps} steps")
    for name in kinds:
        print(f"adamw_ms torch.optim.AdamW({name}) {1e3 * statistics.median(times[name]):.2f}")


if __name__ == "__main__":
    main()
