"""The Llama section of bench/RESULTS.md, from bench/llama_speed.sh's llama_speed.csv."""
import csv
import math
import os
import statistics

TARGETS = {"pytorch-local": 1.0, "pytorch-ddp": 1.1, "pytorch-fsdp2": 1.3}


def section(res):
    path = os.path.join(res, "llama_speed.csv")
    if not os.path.exists(path):
        return []
    rows = list(csv.DictReader(open(path)))

    def med(prog, world, key):
        vals = [float(r[key]) for r in rows if r["program"] == prog and r["world"] == str(world)
                and r[key]]
        return statistics.median(vals) if vals else float("nan")

    rounds = len({r["round"] for r in rows})
    lines = ["## Llama: train_llama against transformers' LlamaForCausalLM (bench/llama_speed.sh)",
             "",
             "hidden 512, 8 layers, 8 heads, 2 KV heads, intermediate 1536, vocab 32000, untied "
             "(56.9M parameters), 256 tokens, 2 sequences per rank, fp32, fused AdamW on both "
             "sides, one thread per rank, the same token file and batches; transformers runs "
             "as one process at world 1, DDP and FSDP2 (fully_shard on every decoder layer, "
             f"then the root) over gloo at 2 and 4. {rounds} rounds, the programs alternating "
             "within each; each run's median step (the first two left out), then the median "
             "over rounds. Targets: 1.0x at world 1, 1.1x DDP and 1.3x FSDP2 at 2 and 4, "
             "peak RSS per rank at most FSDP2's.", "",
             "| world | program | tokens/s | peak RSS per rank (MiB) | fsdp-cpp speed ratio | "
             "fsdp-cpp memory ratio | speed target |",
             "|---|---|---|---|---|---|---|"]
    ceiling = {}
    for w, others in ((1, ["pytorch-local"]), (2, ["pytorch-ddp", "pytorch-fsdp2"]),
                      (4, ["pytorch-ddp", "pytorch-fsdp2"])):
        c_tps, c_mem = med("fsdp-cpp", w, "tokens_per_s"), med("fsdp-cpp", w, "peak_rss_mb")
        lines.append(f"| {w} | fsdp-cpp | {c_tps:.0f} | {c_mem:.0f} | | | |")
        for o in others:
            tps, mem = med(o, w, "tokens_per_s"), med(o, w, "peak_rss_mb")
            speed = c_tps / tps
            verdict = "met" if speed >= TARGETS[o] else "missed"
            if verdict == "missed" and round(speed, 2) >= TARGETS[o]:
                verdict += f" ({speed:.3f}x)"  # the rounded ratio alone would read as met
            lines.append(f"| {w} | {o} | {tps:.0f} | {mem:.0f} | {speed:.2f}x | "
                         f"{c_mem / mem:.2f}x | {TARGETS[o]:.1f}x: {verdict} |")
        solo = med("independent-runs", w, "tokens_per_s")
        if w > 1 and not math.isnan(solo):  # runs before the ceiling rows have none
            ceiling[w] = (c_tps / solo, med("pytorch-ddp", w, "tokens_per_s") / solo)
            lines.append(f"| {w} | {w} one-process runs at once (no communication) | {solo:.0f} "
                         f"| {med('independent-runs', w, 'peak_rss_mb'):.0f} | "
                         f"{c_tps / solo:.2f}x | | ceiling |")
    if 2 in ceiling:
        cpp2, ddp2 = ceiling[2]
        lines += ["", f"At world 2 the ceiling is two one-process runs at once, each on its own "
                  f"core with no communication at all: fsdp-cpp reaches {cpp2:.0%} of it and "
                  f"DDP {ddp2:.0%}, so 1.1x DDP would need {min(1.0, 1.1 * ddp2):.0%}. What is "
                  "lost is compute, not waiting: the trainer's exposed communication is about 2% "
                  "of a step, and keeping the blocks gathered from forward to backward "
                  "(--no-reshard-after-forward, DDP's 1x bytes instead of FSDP's 1.5x) was no "
                  "faster (548 against 550 tokens/s over 3 alternating rounds, measured apart "
                  "from this table). The collectives' "
                  "copies and MPI's shared-memory transfers run on the same two cores as the "
                  "two ranks' compute. At world 4 fsdp-cpp is ahead of DDP, whose every rank "
                  "holds and steps the whole model's AdamW state."]
    else:
        lines += ["", "Without the ceiling rows (an older run), see bench/llama_speed.sh."]
    return lines + [""]
