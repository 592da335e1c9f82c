"""The "Checkpoints" section of bench/RESULTS.md, from bench/checkpoint_bench.sh's
checkpoint.csv: save and load throughput of fsdp-cpp and of torch.distributed.checkpoint on
the same model, against the disk's sequential speed."""
import csv
import os
import statistics


def section(results):
    path = os.path.join(results, "checkpoint.csv")
    if not os.path.exists(path):
        return []
    with open(path) as f:
        rows = list(csv.DictReader(f))

    def med(program, key):
        vals = [float(r[key]) for r in rows if r["program"] == program and r[key]]
        return statistics.median(vals) if vals else float("nan")

    def gbps(program, key):
        return med(program, "bytes") / med(program, key) / 1e9

    caches = {r["read_cache"] for r in rows}
    lines = ["## Checkpoints: the 54.6M-parameter model with its AdamW state, world 4", "",
             "`bench/checkpoint_bench.sh`: fsdp-cpp's trainer (`--save-dir`, then `--resume`) "
             "under mpirun, PyTorch 2.11's `torch.distributed.checkpoint` on the same model "
             "under FSDP2 (`bench/reference/dcp_checkpoint.py`, gloo), and `dd` writing 1 GiB "
             "with fsync and reading it back, alternating; medians of "
             f"{len({r['round'] for r in rows})} rounds. Throughput is the checkpoint's bytes "
             "over the wall time of the slowest rank, all 4 ranks sharing one disk. Reads "
             + ("start from a cold page cache (dropped before each load)."
                if caches == {"cold"} else f"page cache: {', '.join(sorted(caches))}."), "",
             "| | save (s) | load (s) | bytes | save GB/s | load GB/s |", "|---|---|---|---|---|---|"]
    for program, name in (("fsdp-cpp", "**fsdp-cpp**"), ("pytorch-dcp", "PyTorch DCP"),
                          ("dd", "disk (dd)")):
        lines.append(f"| {name} | {med(program, 'save_s'):.2f} | {med(program, 'load_s'):.2f} | "
                     f"{med(program, 'bytes') / 1e6:.0f} MB | {gbps(program, 'save_s'):.2f} | "
                     f"{gbps(program, 'load_s'):.2f} |")
    save_vs_disk = gbps("fsdp-cpp", "save_s") / gbps("dd", "save_s")
    load_vs_disk = gbps("fsdp-cpp", "load_s") / gbps("dd", "load_s")
    lines += ["", "| target | measured | wanted | met |", "|---|---|---|---|",
              f"| save throughput vs the disk's sequential write | {save_vs_disk:.2f}x | >= 0.5x | "
              f"{'yes' if save_vs_disk >= 0.5 else 'no'} |",
              f"| load throughput vs the disk's sequential read | {load_vs_disk:.2f}x | >= 0.5x | "
              f"{'yes' if load_vs_disk >= 0.5 else 'no'} |",
              f"| save time vs PyTorch DCP | {med('fsdp-cpp', 'save_s') / med('pytorch-dcp', 'save_s'):.2f}x "
              f"| < 1x | {'yes' if med('fsdp-cpp', 'save_s') < med('pytorch-dcp', 'save_s') else 'no'} |",
              f"| load time vs PyTorch DCP | {med('fsdp-cpp', 'load_s') / med('pytorch-dcp', 'load_s'):.2f}x "
              f"| < 1x | {'yes' if med('fsdp-cpp', 'load_s') < med('pytorch-dcp', 'load_s') else 'no'} |",
              "", "Saving faster than `dd` writes is possible: four ranks write four files at "
              "once, and each fsyncs only its own; `dd` is one stream. DCP's times include "
              "building the state dicts (`get_model_state_dict`, `get_optimizer_state_dict`) "
              "and, for the load, setting them, as a training script must.", ""]
    return lines
