"""The tensor-parallelism section of bench/RESULTS.md, from bench/tp_speed.sh's tp_speed.csv."""
import csv
import os
import statistics


def section(res):
    path = os.path.join(res, "tp_speed.csv")
    if not os.path.exists(path):
        return []
    rows = list(csv.DictReader(open(path)))

    def med(prog, layout, key):
        vals = [float(r[key]) for r in rows if r["program"] == prog and r["layout"] == layout
                and r[key]]
        return statistics.median(vals) if vals else float("nan")

    rounds = len({r["round"] for r in rows})
    lines = ["## Tensor parallelism: world 4 as dp 2 x tp 2 and 4 x 1 (bench/tp_speed.sh)", "",
             "The Llama preset of the section above (56.9M parameters, seq 256), the same global "
             "batch of 8 sequences (4 per data-parallel rank at 2 x 2, 2 per rank at 4 x 1), fp32, "
             "fused AdamW, one thread per rank. PyTorch runs its own 2-D: `parallelize_module` with "
             "TorchTitan's Llama plan on the tp dimension, `fully_shard` on the dp dimension and "
             "`loss_parallel`, over gloo; fsdp-cpp runs `train_llama --tp 2` under MPI. "
             f"{rounds} alternating rounds, medians of each run's median step. Targets: 1.3x "
             "PyTorch's tokens/s at 2 x 2, peak RSS per rank no higher.", "",
             "| layout (dp x tp) | program | tokens/s | peak RSS per rank (MiB) | fsdp-cpp speed "
             "ratio | fsdp-cpp memory ratio |", "|---|---|---|---|---|---|"]
    for layout, ref in (("2x2", "pytorch-tp-fsdp2"), ("4x1", "pytorch-fsdp2")):
        c_t, c_m = med("fsdp-cpp", layout, "tokens_per_s"), med("fsdp-cpp", layout, "peak_rss_mb")
        p_t, p_m = med(ref, layout, "tokens_per_s"), med(ref, layout, "peak_rss_mb")
        shown = layout.replace("x", " x ")
        lines.append(f"| {shown} | fsdp-cpp | {c_t:.0f} | {c_m:.0f} | | |")
        lines.append(f"| {shown} | {ref} | {p_t:.0f} | {p_m:.0f} | {c_t / p_t:.2f}x | "
                     f"{c_m / p_m:.2f}x |")
    two, four = med("fsdp-cpp", "2x2", "tokens_per_s"), med("fsdp-cpp", "4x1", "tokens_per_s")
    lines += ["", f"fsdp-cpp at 2 x 2 against itself at 4 x 1 (FSDP alone): {two / four:.2f}x the "
              "tokens/s, with more memory per rank at 2 x 2 (each rank's slices are sharded over 2 "
              "ranks instead of 4, and the activations outside the split matmuls are whole on "
              "both TP ranks). On one machine every link is the same memory; what TP buys is "
              "keeping the weights' traffic off a slow link between machines, which the planner's "
              "layouts below show and this machine cannot.", ""]
    return lines
