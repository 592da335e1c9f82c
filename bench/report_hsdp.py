"""The hybrid-sharding section of bench/RESULTS.md, from bench/hsdp_speed.sh's hsdp.csv."""
import csv
import os
import statistics


def section(res):
    path = os.path.join(res, "hsdp.csv")
    if not os.path.exists(path):
        return []
    rows = list(csv.DictReader(open(path)))

    def med(prog, layout, key):
        vals = [float(r[key]) for r in rows if r["program"] == prog and r["layout"] == layout
                and r[key]]
        return statistics.median(vals) if vals else float("nan")

    rounds = len({r["round"] for r in rows})
    lines = ["## Hybrid sharding: world 4 as 1 x 4 and 2 x 2 (bench/hsdp_speed.sh)", "",
             f"cpu-small, 4 sequences per rank, fp32, {rounds} alternating rounds, medians. One "
             "machine has no slow link for HSDP to spare; what changes is that each rank holds "
             "half the state instead of a quarter, its gathers and reduce-scatters span 2 ranks "
             "instead of 4, and the gradients take one more collective (an all-reduce of 2).",
             "", "| program | layout | tokens/s | peak RSS per rank (MiB) |", "|---|---|---|---|"]
    for prog in ("fsdp-cpp", "pytorch-fsdp2"):
        for layout in ("1x4", "2x2"):
            lines.append(f"| {prog} | {layout.replace('x', ' x ')} | "
                         f"{med(prog, layout, 'tokens_per_s'):.0f} | "
                         f"{med(prog, layout, 'peak_rss_mb'):.0f} |")
    ratio = med("fsdp-cpp", "2x2", "tokens_per_s") / med("pytorch-fsdp2", "2x2", "tokens_per_s")
    lines += ["", f"fsdp-cpp against FSDP2, both as 2 x 2: {ratio:.2f}x the tokens/s (ratio of "
              "medians).", ""]
    return lines
