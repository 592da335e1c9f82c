"""Verdict of bench/soak.sh from its samples (soak.csv: t_s, pid, rss_kib, fds, threads,
step): after the warm-up (the first 20% of the run), each process's resident memory must not
grow by 2% or more, and its open file descriptors and threads must not grow at all. RSS
moves within a step (activations come and go), so the median of the first fifth of the
samples after warm-up is compared with the median of the last fifth; a checkpoint being
written holds a file open for a moment, so descriptors and threads compare the fewest seen in
the first and in the last fifth (a leak raises that floor)."""
import csv
import statistics
import sys

rows = list(csv.DictReader(open(sys.argv[1])))
t_end = max(int(r["t_s"]) for r in rows)
warm = 0.2 * t_end
fail = []
for pid in sorted({r["pid"] for r in rows}):
    mine = [r for r in rows if r["pid"] == pid and int(r["t_s"]) >= warm]
    fifth = max(1, len(mine) // 5)
    first = statistics.median(int(r["rss_kib"]) for r in mine[:fifth])
    last = statistics.median(int(r["rss_kib"]) for r in mine[-fifth:])
    peak = max(int(r["rss_kib"]) for r in mine)
    growth = (last - first) / first
    def floors(key):
        return (min(int(r[key]) for r in mine[:fifth]), min(int(r[key]) for r in mine[-fifth:]),
                max(int(r[key]) for r in mine))
    fds, threads = floors("fds"), floors("threads")
    print(f"pid {pid}: RSS {first / 1024:.0f} -> {last / 1024:.0f} MiB (medians of the first and "
          f"last fifth after warm-up, {100 * growth:+.2f}%; peak {peak / 1024:.0f} MiB); "
          f"fds {fds[0]} -> {fds[1]} (at most {fds[2]}); threads {threads[0]} -> {threads[1]} "
          f"(at most {threads[2]})")
    if growth >= 0.02:
        fail.append(f"pid {pid}: RSS grew {100 * growth:.2f}%")
    if fds[1] > fds[0]:
        fail.append(f"pid {pid}: file descriptors grew from {fds[0]} to {fds[1]}")
    if threads[1] > threads[0]:
        fail.append(f"pid {pid}: threads grew from {threads[0]} to {threads[1]}")
steps = max(int(r["step"]) for r in rows)
print(f"soak: {t_end / 60:.1f} min, {steps} steps, a checkpoint every 5 steps; "
      + ("; ".join(fail) if fail else "RSS within 2% after warm-up, no fd or thread growth"))
sys.exit(1 if fail else 0)
