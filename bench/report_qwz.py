"""The quantized all-gather section of bench/RESULTS.md, from bench/quantized_all_gather.sh."""
import csv
import os


def section(res):
    losses_path = os.path.join(res, "qwz_losses.csv")
    summary_path = os.path.join(res, "qwz_summary.csv")
    if not (os.path.exists(losses_path) and os.path.exists(summary_path)):
        return []
    curves = {}
    for r in csv.DictReader(open(losses_path)):
        curves.setdefault((r["dtype"], r["block"]), {})[int(r["step"])] = float(r["loss"])
    summary = {(r["dtype"], r["block"]): r for r in csv.DictReader(open(summary_path))}
    lines = ["## Quantized weight all-gather (bench/quantized_all_gather.sh)", "",
             "`train_minillm --preset cpu-small` at world 2 under MPI, the same seed and data, "
             "with and without `--quantize-all-gather 256` (`fsdp::quantized_all_gather`, "
             "ZeRO++'s qwZ: every unit's all-gather sends int8 blocks of 256 elements with one "
             "float32 scale each, dequantized into the compute dtype; shards, gradients and AdamW "
             "keep full precision). Bytes are the engine's count of all-gather input per rank "
             "per step (two profiled steps).", "",
             "| dtype | all-gather | MiB per rank per step | bytes against unquantized | "
             "final loss | worst relative loss difference |",
             "|---|---|---|---|---|---|"]
    for dtype in ("fp32", "bf16"):
        base, quant = summary.get((dtype, "0")), summary.get((dtype, "256"))
        if not base or not quant:
            continue
        b, q = curves[(dtype, "0")], curves[(dtype, "256")]
        steps = sorted(set(b) & set(q))
        worst = max(abs(q[s] - b[s]) / abs(b[s]) for s in steps)
        ratio = float(quant["all_gather_mib_per_step"]) / float(base["all_gather_mib_per_step"])
        lines.append(f"| {dtype} | {dtype} | {float(base['all_gather_mib_per_step']):.2f} | 1 | "
                     f"{b[steps[-1]]:.4f} | |")
        lines.append(f"| {dtype} | int8, blocks of 256 | "
                     f"{float(quant['all_gather_mib_per_step']):.2f} | {ratio:.3f} | "
                     f"{q[steps[-1]]:.4f} | {worst:.2e} |")
    lines += ["", "The loss curves side by side (every 5th step):", "",
              "| step | fp32 | fp32, int8 gather | bf16 | bf16, int8 gather |",
              "|---|---|---|---|---|"]
    keys = [("fp32", "0"), ("fp32", "256"), ("bf16", "0"), ("bf16", "256")]
    if all(k in curves for k in keys):
        last = max(curves[keys[0]])
        for s in sorted(set(range(0, last + 1, 5)) | {last}):
            cells = " | ".join(f"{curves[k][s]:.4f}" if s in curves[k] else "" for k in keys)
            lines.append(f"| {s} | {cells} |")
    lines += ["", "On this machine the all-gathers cross no wire (every rank is on one host's "
              "memory), so a quarter of the bytes buys no time and the quantize and dequantize "
              "kernels cost some; the point of qwZ is a link between machines, where the gather's "
              "bytes are the step's time (the planner's `--plan` shows which layouts are bound by "
              "it).", ""]
    return lines
