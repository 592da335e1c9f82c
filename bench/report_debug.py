"""The "Debugging aids" and "Soak" sections of bench/RESULTS.md: what profiling and desync
detection cost (bench/debug_cost.sh: debug_cost.csv, debug_cost.txt) and what a long run with
checkpoints did to memory, file descriptors and threads (bench/soak.sh: soak.txt)."""
import csv
import os
import statistics


def section(results):
    lines = []
    path = os.path.join(results, "debug_cost.csv")
    if os.path.exists(path):
        with open(path) as f:
            rows = list(csv.DictReader(f))
        med = {m: statistics.median(float(r["median_step_s"]) for r in rows if r["mode"] == m)
               for m in sorted({r["mode"] for r in rows})}
        rounds = len({r["round"] for r in rows})
        lines += ["## Debugging aids: what they cost", "",
                  "`bench/debug_cost.sh`: the trainer, preset cpu-small at world 2 (MPI, one "
                  "thread per rank), median step time of steps 2-11, medians over "
                  f"{rounds} alternating rounds.", "",
                  "| mode | s/step | vs off |", "|---|---|---|"]
        names = {"off": "nothing on", "on": "profiling (shapes and FLOPs recorded)",
                 "on-no-shapes": "profiling, `--no-profile-shapes`",
                 "desync": "desync detection (`FSDP_DEBUG_DESYNC=1`)"}
        for mode in ("off", "on", "on-no-shapes", "desync"):
            if mode in med:
                lines.append(f"| {names[mode]} | {med[mode]:.3f} | {med[mode] / med['off']:.3f}x |")
        txt = os.path.join(results, "debug_cost.txt")
        if os.path.exists(txt):
            lines += ["", "```", open(txt).read().strip(), "```"]
        off = [float(r["median_step_s"]) for r in rows if r["mode"] == "off"]
        lines += ["", f"The rounds with nothing on ranged from {min(off):.3f} to {max(off):.3f} "
                  "s/step: differences of that size are noise on this machine, not resolved. "
                  "The cost of the ranges with no profiler running is bounded from their "
                  "measured cost per call instead (`bench/range_cost.cpp`).", ""]
    txt = os.path.join(results, "soak.txt")
    if os.path.exists(txt):
        lines += ["## Soak: world 4, checkpoints every 5 steps", "",
                  "`bench/soak.sh`: the trainer (cpu-small, MPI, 4 ranks, one thread each, "
                  "saving every 5 steps and keeping 2), sampled every 10 s from /proc; growth "
                  "is measured after the first 20% of the run.", "",
                  "```", open(txt).read().strip(), "```", ""]
    return lines
