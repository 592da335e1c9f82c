#!/usr/bin/env python3
"""Roofline summary of a profiled step, from a Chrome trace written by fsdp::stop_profiling
(the trainer's --profile-steps, with shapes recorded, its default).

    scripts/roofline.py TRACE.json [--steps N] [--threads T] [--png OUT.png] [--json OUT.json]

Per op class (matmul, attention, normalisation, elementwise, optimizer, communication, other)
it prints the self time, the FLOPs and bytes moved, the achieved FLOP/s and bytes/s, and
whether the class is compute- or memory-bound against ceilings measured on this machine:
  - matmul peak: the best of several fp32 1024x1024 matmuls on T threads (default 1: the
    trainer's per-rank --threads on a small machine);
  - memory bandwidth: copying a 256 MiB tensor (read + write counted), T threads.
A class is memory-bound when its arithmetic intensity (FLOP/byte) lies left of the ridge
point (peak / bandwidth). --png draws the roofline with one point per class.

How the figures are counted (estimates of compulsory work, each tensor read or written once):
  - time: each operator's self time (its duration less that of operators inside it, on the
    same thread); the training thread's ops, plus the communication thread's fsdp::comm::*
    ranges for the communication class. Everything else on the training thread is "other".
  - FLOPs: matmuls 2*M*K*N from the recorded shapes (mm, addmm, bmm, baddbmm, mv);
    attention 4*B*H*L*S*D forward and 8*B*H*L*S*D backward (halved when causal);
    layer norm 8 (forward) and 16 (backward) per element; fused AdamW 16 per parameter element
    (bytes as recorded by FusedAdamW's range), libtorch's AdamW as its elementwise ops;
    reductions inside collectives 1 per input element; other elementwise ops 1 per output
    element.
  - bytes: the inputs' sizes from the recorded shapes and dtypes, plus the output (the
    matmul's M x N, otherwise the largest input); collectives their larger buffer (recorded
    as the range's input).
"""
import argparse
import json
import math
import sys
import time
from collections import defaultdict

DTYPE_BYTES = {
    "float": 4, "double": 8, "c10::Half": 2, "c10::BFloat16": 2, "long int": 8, "int": 4,
    "bool": 1, "unsigned char": 1, "signed char": 1, "short int": 2, "Float": 4, "BFloat16": 2,
    "Half": 2, "Long": 8, "Int": 4, "Bool": 1,
}
CLASSES = ["matmul", "attention", "normalisation", "elementwise", "optimizer", "communication",
           "waiting", "other"]
MATMUL = {"aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm", "aten::addmv", "aten::mv"}
MATMUL_COMPOSITE = {"aten::linear", "aten::matmul", "aten::einsum"}
NORM_FWD = {"aten::native_layer_norm", "aten::_fused_rms_norm", "aten::native_batch_norm"}
NORM_BWD = {"aten::native_layer_norm_backward", "aten::_fused_rms_norm_backward",
            "aten::native_batch_norm_backward"}
NORM_COMPOSITE = {"aten::layer_norm", "aten::rms_norm", "aten::batch_norm", "aten::group_norm"}
# Ops that only change metadata or allocate: no data moved.
NO_DATA = {"aten::view", "aten::reshape", "aten::t", "aten::transpose", "aten::permute",
           "aten::as_strided", "aten::empty", "aten::empty_strided", "aten::expand",
           "aten::slice", "aten::select", "aten::narrow", "aten::unsqueeze", "aten::squeeze",
           "aten::detach", "aten::alias", "aten::_unsafe_view", "aten::split", "aten::chunk",
           "aten::unbind", "aten::resize_", "aten::set_", "aten::empty_like", "aten::lift_fresh",
           "aten::contiguous", "aten::to", "aten::result_type", "aten::_reshape_alias",
           "aten::split_with_sizes", "aten::view_as", "aten::unflatten", "aten::flatten",
           "aten::is_nonzero", "aten::item", "aten::_local_scalar_dense", "detach"}


def numel(dims):
    return math.prod(dims) if dims else 1


def tensor_bytes(dims_list, types):
    """Bytes of every tensor input (lists of tensors counted element by element)."""
    total = 0
    for dims, ty in zip(dims_list, types):
        size = DTYPE_BYTES.get(ty)
        if size is None and ty.startswith("TensorList"):
            size = 4
        if size is None or dims is None:
            continue
        if dims and isinstance(dims[0], list):  # a TensorList: one shape per tensor
            total += sum(numel(d) for d in dims) * size
        else:
            total += numel(dims) * size
    return total


def largest_input(dims_list, types):
    best = 0
    for dims, ty in zip(dims_list, types):
        size = DTYPE_BYTES.get(ty)
        if size and dims is not None and not (dims and isinstance(dims[0], list)):
            best = max(best, numel(dims) * size)
    return best


def self_times(events):
    """Per event index: duration less that of the events directly inside it (same thread)."""
    by_tid = defaultdict(list)
    for i, e in enumerate(events):
        by_tid[(e.get("pid"), e.get("tid"))].append(i)
    self_us = [e["dur"] for e in events]
    parent = [None] * len(events)
    for idx in by_tid.values():
        idx.sort(key=lambda i: (events[i]["ts"], -events[i]["dur"]))
        stack = []
        for i in idx:
            start = events[i]["ts"]
            while stack and events[stack[-1]]["ts"] + events[stack[-1]]["dur"] <= start:
                stack.pop()
            if stack:
                self_us[stack[-1]] -= events[i]["dur"]
                parent[i] = stack[-1]
            stack.append(i)
    return [max(0.0, s) for s in self_us], parent


def attention_flops(name, dims):
    # q, k, v: [B, H, L, D], [B, H, S, D]; the backward's inputs start with grad_out [B,H,L,D].
    if len(dims) < 3 or not dims[0] or len(dims[0]) != 4:
        return 0
    b, h, l, d = dims[0]
    s = dims[1][2] if dims[1] and len(dims[1]) == 4 else l
    per = 8 if "backward" in name else 4
    return per * b * h * l * s * d


def classify(events, trace_meta):
    self_us, parent = self_times(events)

    def under_optimizer(i):
        p = parent[i]
        while p is not None:
            n = events[p]["name"]
            if "optimizer" in n.lower() or n.startswith("Optimizer."):
                return True
            p = parent[p]
        return False

    comm_tids = {(e.get("pid"), e.get("tid")) for e in events
                 if e["name"].startswith("fsdp::comm::")}
    stats = {c: {"us": 0.0, "flops": 0.0, "bytes": 0.0, "calls": 0} for c in CLASSES}
    for i, e in enumerate(events):
        name = e["name"]
        args = e.get("args", {})
        dims = args.get("Input Dims", [])
        types = args.get("Input type", [])
        on_comm_thread = (e.get("pid"), e.get("tid")) in comm_tids
        flops = 0.0
        nbytes = 0.0
        if name.startswith("fsdp::comm::"):
            cls = "communication"
            concrete = args.get("Concrete Inputs", [])
            nbytes = float(concrete[0]) if concrete and str(concrete[0]).lstrip("-").isdigit() else 0
            if "reduce" in name:
                flops = nbytes / 4  # one add per (fp32) input element
        elif on_comm_thread:
            continue  # the collective's own ops (copies, sums) are inside its range
        elif name.startswith("fsdp::optimizer::"):
            # FusedAdamW records the bytes its kernel moves (7 per parameter byte: parameters,
            # gradients and two moments read, three written); its aten::_fused_adamw_ inside
            # carries no shapes when its lists are long.
            cls = "optimizer"
            concrete = args.get("Concrete Inputs", [])
            nbytes = float(concrete[0]) if concrete and str(concrete[0]).isdigit() else 0
            flops = 16.0 * nbytes / 28  # 16 FLOPs per fp32 element, 28 bytes moved per element
        elif name.startswith("fsdp::") and name.split(" (")[0].endswith("_wait"):
            cls = "waiting"  # the training thread blocked on a collective: exposed communication
        elif name.startswith("fsdp::"):
            cls = "other"  # FSDP's bookkeeping outside its copies and collectives
        elif under_optimizer(i) or name == "aten::_fused_adamw_":
            cls = "optimizer"
            if name.startswith("aten::") and name not in NO_DATA and name != "aten::_fused_adamw_":
                nbytes = tensor_bytes(dims, types) + largest_input(dims, types)
                flops = largest_input(dims, types) / 4
        elif name in MATMUL:
            cls = "matmul"
            m_dims = [d for d in dims if d and not isinstance(d[0], list)]
            out = 0
            if len(m_dims) >= 2:
                a, b = m_dims[-2], m_dims[-1]  # [..., M, K] x [..., K, N] (mv: N = 1)
                n = b[-1] if len(b) >= 2 else 1
                out = numel(a[:-1]) * n * DTYPE_BYTES.get(types[-1], 4)
                flops = 2.0 * numel(a) * n
            nbytes = tensor_bytes(dims, types) + out
        elif name in MATMUL_COMPOSITE:
            cls = "matmul"
        elif "scaled_dot_product" in name or "flash_attention" in name:
            cls = "attention"
            if name.startswith("aten::_scaled_dot_product"):
                flops = attention_flops(name, dims)
                if trace_meta.get("causal", True):
                    flops /= 2
                nbytes = tensor_bytes(dims, types) + largest_input(dims, types)
        elif name in NORM_FWD or name in NORM_BWD:
            cls = "normalisation"
            elems = numel(dims[0]) if dims and dims[0] else 0
            flops = (16 if name in NORM_BWD else 8) * elems
            nbytes = tensor_bytes(dims, types) + largest_input(dims, types)
        elif name in NORM_COMPOSITE:
            cls = "normalisation"
        elif name.startswith("aten::") and name not in NO_DATA:
            cls = "elementwise"
            out = largest_input(dims, types)
            if name in ("aten::fill_", "aten::zero_"):
                nbytes = out  # written only
            elif name == "aten::copy_":
                nbytes = 2 * out  # the source read, the destination written
            else:
                nbytes = tensor_bytes(dims, types) + out
            flops = out / 4
        else:
            cls = "other"
        st = stats[cls]
        st["us"] += e["dur"] if cls == "communication" else self_us[i]
        st["flops"] += flops
        st["bytes"] += nbytes
        st["calls"] += 1
    return stats


def measure_ceilings(threads):
    import torch
    torch.set_num_threads(threads)
    a, b = torch.randn(1024, 1024), torch.randn(1024, 1024)
    best = float("inf")
    for _ in range(8):
        t0 = time.perf_counter()
        torch.mm(a, b)
        best = min(best, time.perf_counter() - t0)
    peak = 2 * 1024 ** 3 / best
    src = torch.ones(64 * 1024 * 1024)  # 256 MiB
    dst = torch.empty_like(src)
    best = float("inf")
    for _ in range(5):
        t0 = time.perf_counter()
        dst.copy_(src)
        best = min(best, time.perf_counter() - t0)
    bandwidth = 2 * src.numel() * 4 / best
    return peak, bandwidth


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("trace")
    ap.add_argument("--steps", type=int, default=1, help="steps the trace covers (per-step figures)")
    ap.add_argument("--threads", type=int, default=1, help="threads for the ceiling probes")
    ap.add_argument("--png", help="draw the roofline plot here")
    ap.add_argument("--json", help="write the figures here")
    ap.add_argument("--not-causal", action="store_true", help="attention is not causal")
    a = ap.parse_args()
    try:
        trace = json.load(open(a.trace))
    except (OSError, ValueError) as err:
        sys.exit(f"roofline: cannot read {a.trace} as a Chrome trace: {err}")
    events = [e for e in trace.get("traceEvents", [])
              if e.get("ph") == "X" and e.get("cat") in ("cpu_op", "user_annotation")]
    if not events:
        sys.exit(f"roofline: {a.trace} has no operator events")
    if not any("Input Dims" in e.get("args", {}) for e in events):
        sys.exit(f"roofline: {a.trace} has no shapes; profile without --no-profile-shapes")
    stats = classify(events, {"causal": not a.not_causal})
    peak, bw = measure_ceilings(a.threads)
    ridge = peak / bw
    total_us = sum(s["us"] for c, s in stats.items() if c != "communication")
    print(f"ceilings ({a.threads} thread{'s' if a.threads > 1 else ''}): matmul peak "
          f"{peak / 1e9:.1f} GFLOP/s, memory bandwidth {bw / 1e9:.1f} GB/s, ridge {ridge:.1f} FLOP/B")
    print(f"{'class':<14} {'ms/step':>8} {'share':>6} {'GFLOP':>8} {'GB':>7} {'GFLOP/s':>8} "
          f"{'GB/s':>6} {'FLOP/B':>7} {'% roof':>6}  bound")
    rows = []
    for c in CLASSES:
        s = stats[c]
        if s["calls"] == 0:
            continue
        sec = s["us"] / 1e6
        fps = s["flops"] / sec if sec > 0 else 0
        bps = s["bytes"] / sec if sec > 0 else 0
        intensity = s["flops"] / s["bytes"] if s["bytes"] > 0 else None
        if intensity is None:
            bound, roof = "-", None
        else:
            bound = "compute" if intensity >= ridge else "memory"
            roof = min(peak, intensity * bw)
        share = s["us"] / total_us if total_us and c != "communication" else None
        rows.append(dict(cls=c, ms_per_step=s["us"] / 1e3 / a.steps, share=share,
                         flops=s["flops"] / a.steps, bytes=s["bytes"] / a.steps,
                         flops_per_s=fps, bytes_per_s=bps, intensity=intensity,
                         of_roof=(fps / roof if roof else None), bound=bound, calls=s["calls"]))
        r = rows[-1]
        share_s = f"{100 * share:.0f}%" if share is not None else "comm"
        intensity_s = f"{intensity:.2f}" if intensity is not None else "-"
        roof_s = f"{100 * r['of_roof']:.0f}%" if r["of_roof"] is not None else "-"
        print(f"{c:<14} {r['ms_per_step']:>8.2f} {share_s:>6} {r['flops'] / 1e9:>8.3f} "
              f"{r['bytes'] / 1e9:>7.3f} {fps / 1e9:>8.2f} {bps / 1e9:>6.2f} {intensity_s:>7} "
              f"{roof_s:>6}  {bound}")
    print("share: of the training thread's op time; communication runs on its own thread.\n"
          "% roof above 100: the data stayed in cache, faster than the memory-bandwidth probe.")
    if a.json:
        json.dump({"peak_flops": peak, "bandwidth": bw, "threads": a.threads, "rows": rows},
                  open(a.json, "w"), indent=1)
    if a.png:
        draw(rows, peak, bw, a.png)
        print(f"roofline plot: {a.png}")


def draw(rows, peak, bw, path):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(7, 4.5), dpi=110)
    xs = [r["intensity"] for r in rows if r["intensity"]]
    lo = min(xs + [0.05]) / 2
    hi = max(xs + [peak / bw * 4]) * 2
    grid = [lo * (hi / lo) ** (i / 200) for i in range(201)]
    ax.plot(grid, [min(peak, x * bw) / 1e9 for x in grid], color="black", lw=1.5)
    ax.annotate(f"matmul peak {peak / 1e9:.0f} GFLOP/s", (hi / 1.5, peak / 1e9), ha="right",
                va="bottom", fontsize=8)
    ax.annotate(f"memory {bw / 1e9:.1f} GB/s", (lo * 1.2, lo * 1.2 * bw / 1e9), fontsize=8,
                va="bottom")
    for r in rows:
        if not r["intensity"] or not r["flops_per_s"]:
            continue
        ax.scatter([r["intensity"]], [r["flops_per_s"] / 1e9], s=30 + 400 * (r["share"] or 0.05))
        ax.annotate(f"{r['cls']} ({r['ms_per_step']:.1f} ms)", (r["intensity"], r["flops_per_s"] / 1e9),
                    textcoords="offset points", xytext=(6, -10), fontsize=8)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("arithmetic intensity (FLOP/byte)")
    ax.set_ylabel("achieved GFLOP/s")
    ax.set_title("Roofline of the profiled steps, by op class (marker size: time share)", fontsize=9)
    ax.grid(True, which="both", alpha=0.3)
    fig.tight_layout()
    fig.savefig(path)


if __name__ == "__main__":
    main()
