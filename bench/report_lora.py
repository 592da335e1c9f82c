"""The LoRA section of bench/RESULTS.md, from bench/lora_memory.sh's lora_memory.csv (also run
alone: python bench/report_lora.py bench/results/lora_memory.csv prints it)."""
import csv
import os
import statistics
import sys


def section(res):
    path = os.path.join(res, "lora_memory.csv") if os.path.isdir(res) else res
    if not os.path.exists(path):
        return []
    rows = list(csv.DictReader(open(path)))
    by = {}
    for r in rows:
        by.setdefault((r["framework"], r["mode"]), []).append(r)
    med = lambda k, f: statistics.median(float(r[f]) for r in by[k])  # noqa: E731
    lines = ["## LoRA against full fine-tuning (bench/lora_memory.sh)", "",
             "SmolLM2-135M's shape (30 layers, hidden 576, tied embeddings, vocabulary 49152, "
             "random weights) at world 2 on this 2-core machine, 2 sequences of 256 tokens per "
             "rank, fp32; LoRA rank 16 on every Linear of the layers (PEFT's adapters from one "
             "file for both programs). Peak RSS of the largest rank and step time: medians over "
             f"{len(by.get(('fsdp-cpp', 'full'), []))} alternating rounds.", "",
             "| program | full: peak MiB/rank | LoRA: peak MiB/rank | LoRA / full memory | "
             "full: s/step | LoRA: s/step |",
             "|---|---|---|---|---|---|"]
    for fw in ("fsdp-cpp", "pytorch-fsdp2"):
        if (fw, "full") not in by or (fw, "lora") not in by:
            continue
        f_mem, l_mem = med((fw, "full"), "peak_rss_mib"), med((fw, "lora"), "peak_rss_mib")
        name = "fsdp-cpp (train_llama)" if fw == "fsdp-cpp" else "PyTorch FSDP2 (transformers, PEFT)"
        lines.append(f"| {name} | {f_mem:.0f} | {l_mem:.0f} | {l_mem / f_mem:.2f} | "
                     f"{med((fw, 'full'), 'step_s'):.2f} | {med((fw, 'lora'), 'step_s'):.2f} |")
    if ("fsdp-cpp", "lora") in by and ("pytorch-fsdp2", "lora") in by:
        ratio = med(("fsdp-cpp", "lora"), "peak_rss_mib") / med(("pytorch-fsdp2", "lora"), "peak_rss_mib")
        speed = med(("pytorch-fsdp2", "lora"), "step_s") / med(("fsdp-cpp", "lora"), "step_s")
        saved = med(("fsdp-cpp", "full"), "peak_rss_mib") - med(("fsdp-cpp", "lora"), "peak_rss_mib")
        lines += ["", f"With LoRA, fsdp-cpp's peak per rank is {ratio:.2f}x PyTorch's and its steps "
                  f"{speed:.2f}x as fast; {by[('fsdp-cpp', 'lora')][0]['trainable']} trainable "
                  f"parameters. LoRA saves fsdp-cpp {saved:.0f} MiB per rank at the peak: the frozen "
                  "weights get no gradient shards and no AdamW state (three fp32 copies of the "
                  "shards, 3 x 257 MiB here, not all of which coincide with the peak; the peak "
                  "has not been broken down further), and their weight gradients are not "
                  "computed, which is most of the step time saved. PyTorch's peak does not fall "
                  "with LoRA: each of its ranks loads the whole model before fully_shard, the "
                  "likely peak (not verified).", ""]
    return lines


if __name__ == "__main__":
    print("\n".join(section(sys.argv[1])))
