"""Draws a Chrome trace written by fsdp::stop_profiling (the trainer's --profile-steps) as a
PNG timeline: one lane per thread, FSDP's ranges coloured by kind (gather, reduce-scatter,
their waits, forward/backward hooks), libtorch's top-level operators in grey.

  python3 scripts/trace_timeline.py prof/rank0.json timeline.png [--ms-from A --ms-to B]
"""
import argparse
import json

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

COLOURS = [("fsdp::comm::all_gather", "#1f77b4"), ("fsdp::comm::reduce_scatter", "#d62728"),
           ("fsdp::comm::", "#9467bd"), ("_wait", "#ff7f0e"), ("fsdp::all_gather", "#aec7e8"),
           ("fsdp::reduce_scatter", "#ff9896"), ("fsdp::recompute", "#8c564b"),
           ("fsdp::", "#2ca02c")]


def colour(name):
    for key, c in COLOURS:
        if key in name and (key != "_wait" or name.startswith("fsdp::")):
            return c
    return "#c7c7c7"


def main():
    p = argparse.ArgumentParser()
    p.add_argument("trace")
    p.add_argument("png")
    p.add_argument("--ms-from", type=float, default=0)
    p.add_argument("--ms-to", type=float, default=float("inf"))
    p.add_argument("--title", help="default: the trace's path")
    a = p.parse_args()
    events = [e for e in json.load(open(a.trace))["traceEvents"]
              if e.get("ph") == "X" and isinstance(e.get("tid"), int)]  # not the profiler's own
    t0 = min(e["ts"] for e in events)
    main_tid = next(e["tid"] for e in events if e["name"] == "fsdp::pre_forward")
    comm_tids = {e["tid"] for e in events if e["name"].startswith("fsdp::comm::")}
    lanes = sorted({e["tid"] for e in events}, key=lambda t: (t != main_tid, str(t)))
    fig, ax = plt.subplots(figsize=(14, 2.0 + 0.9 * len(lanes)))
    for lane, tid in enumerate(lanes):
        # Top-level spans of the lane in grey (everything the thread did), FSDP's on top.
        mine = sorted((e for e in events if e["tid"] == tid), key=lambda e: e["ts"])
        end = -1
        for e in mine:
            start, stop = (e["ts"] - t0) / 1e3, (e["ts"] + e["dur"] - t0) / 1e3
            if stop < a.ms_from or start > a.ms_to:
                continue
            fsdp = e["name"].startswith("fsdp::")
            if not fsdp and e["ts"] < end:
                continue  # nested in an op already drawn
            if not fsdp:
                end = e["ts"] + e["dur"]
            ax.barh(lane, stop - start, left=start, height=0.35 if fsdp else 0.7,
                    color=colour(e["name"]), edgecolor="none")
    ax.set_yticks(range(len(lanes)))
    ax.set_yticklabels(["training thread" if t == main_tid else
                        "communication thread" if t in comm_tids else f"thread {t}" for t in lanes])
    ax.invert_yaxis()
    ax.set_xlabel("ms since the first event")
    handles = [plt.Rectangle((0, 0), 1, 1, color=c) for _, c in COLOURS] + [
        plt.Rectangle((0, 0), 1, 1, color="#c7c7c7")]
    labels = ["all-gather (comm thread)", "reduce-scatter (comm thread)", "other collective",
              "waiting for a collective", "all-gather issue", "reduce-scatter issue",
              "recompute", "FSDP hooks", "libtorch ops"]
    ax.legend(handles, labels, ncol=5, fontsize=8, loc="upper center",
              bbox_to_anchor=(0.5, -0.45 if len(lanes) < 4 else -0.15))
    ax.set_title(a.title or a.trace)
    fig.tight_layout()
    fig.savefig(a.png, dpi=110)


if __name__ == "__main__":
    main()
