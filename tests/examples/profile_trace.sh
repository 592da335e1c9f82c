#!/usr/bin/env bash
# Profiling through the trainer at world 2 (mpiexec): --profile-steps writes one Chrome trace per
# rank; the trace parses as JSON with FSDP's ranges, named per unit ("fsdp::pre_forward
# (layers.0)"); its fsdp::comm::* ranges match the process group's own counts and carry their
# sizes; every wait of the training thread lies inside one of FSDP's phases (a unit's
# pre-forward, pre-backward or post-backward, or the end of backward); the per-unit wait table
# adds up to the exposed total read from the same ranges; and scripts/roofline.py finds the
# model's matmul FLOPs (6 x tokens x matmul parameters) and draws its plot. How much of the
# communication overlaps compute is a time and depends on the machine's load: it is reported
# here and measured in bench/, never checked.
#   profile_trace.sh TRAIN_MINILLM PYTHON MPIEXEC [MPIEXEC_FLAGS...]
set -uo pipefail
bin="$1"; py="$2"; shift 2
mpiexec=("$@")
source "$(dirname "${BASH_SOURCE[0]}")/../../scripts/lib.sh"
fsdp_scratch
fsdp_one_thread
"${mpiexec[@]}" -n 2 "$bin" --vocab 2000 --dim 128 --layers 3 --heads 4 --seq 64 --batch 4 \
  --steps 5 --threads 1 --data synthetic --profile-steps 2:3 --profile-dir "$tmp/prof" \
  > "$tmp/log" 2>&1 || { cat "$tmp/log"; exit 1; }
grep -E "^profile|^operator|^fsdp::|^aten::" "$tmp/log" | head -30
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
"$py" "$here/../../scripts/roofline.py" "$tmp/prof/rank0.json" --steps 2 --json "$tmp/roof.json" \
  --png "$tmp/roof.png" || exit 1
"$py" - "$tmp/prof/rank0.json" "$tmp/log" "$tmp/roof.json" "$tmp/roof.png" <<'PY'
import json, os, re, sys
trace, log = json.load(open(sys.argv[1])), open(sys.argv[2]).read()
events = [e for e in trace["traceEvents"] if e.get("ph") == "X"]
fsdp = [e for e in events if e["name"].startswith("fsdp::")]
base = lambda n: n.split(" (")[0]
count = lambda n: sum(1 for e in fsdp if base(e["name"]) == n)
issued = re.search(r"issued (\d+) all-gathers, (\d+) reduce-scatters, (\d+) all-reduces", log)
ag, rs, ar = map(int, issued.groups())
fail = []
for name, want in (("fsdp::comm::all_gather", ag), ("fsdp::comm::reduce_scatter", rs),
                   ("fsdp::comm::all_reduce", ar)):
    if count(name) != want:
        fail.append(f"{name}: {count(name)} ranges in the trace, the group issued {want}")
for name in ("fsdp::pre_forward", "fsdp::post_backward", "fsdp::all_gather_wait",
             "fsdp::end_of_backward", "fsdp::reduce_scatter"):
    if count(name) == 0:
        fail.append(f"no {name} range")
for name in ("fsdp::pre_forward (layers.0)", "fsdp::post_backward (layers.2)",
             "fsdp::all_gather (layers.1)", "fsdp::reduce_scatter ((root))"):
    if not any(e["name"] == name for e in fsdp):
        fail.append(f"no per-unit range {name}")
# The root's all-gather moves its embedding and head: 2 x 2000 x 128 float32 = 2048000 bytes.
sizes = {int(e["args"]["Concrete Inputs"][0]) for e in fsdp if e["name"] == "fsdp::comm::all_gather"}
if 2048000 not in sizes:
    fail.append(f"no all-gather range of the root's 2048000 bytes: sizes {sorted(sizes)}")
comm_tids = {e["tid"] for e in fsdp if e["name"].startswith("fsdp::comm::")}
main_tids = {e["tid"] for e in fsdp if base(e["name"]) == "fsdp::pre_forward"}
if comm_tids & main_tids or not comm_tids:
    fail.append(f"collectives should run on their own thread: comm {comm_tids}, main {main_tids}")
# Nesting: each wait of the training thread runs inside the phase that waits (a gather's wait
# in a pre-forward or pre-backward, a reduction's in a post-backward or the end of backward).
phases = [(e["ts"], e["ts"] + e["dur"], base(e["name"])) for e in fsdp if e["tid"] in main_tids
          and base(e["name"]) in ("fsdp::pre_forward", "fsdp::pre_backward", "fsdp::post_backward",
                                  "fsdp::end_of_backward", "fsdp::recompute")]
waits = [e for e in fsdp if e["tid"] in main_tids and base(e["name"]).endswith("_wait")]
for w in waits:
    a, b = w["ts"], w["ts"] + w["dur"]
    if not any(pa <= a and b <= pb for pa, pb, _ in phases):
        fail.append(f"{w['name']} at {a} us lies outside every FSDP phase range")
        break
if not waits:
    fail.append("no wait ranges on the training thread")
# Reported, not checked: how much of the reduce-scatters' time the training thread was not
# waiting for them (a time, which depends on the machine's load).
rs_spans = [(e["ts"], e["ts"] + e["dur"]) for e in fsdp if e["name"] == "fsdp::comm::reduce_scatter"]
rs_total = sum(b - a for a, b in rs_spans)
waited = sum(max(0, min(b, w["ts"] + w["dur"]) - max(a, w["ts"])) for a, b in rs_spans for w in waits)
hidden = 1 - waited / rs_total if rs_total else 0
print(f"trace: {len(events)} events, {len(fsdp)} fsdp ranges, {len(waits)} waits nested in phases; "
      f"reduce-scatter {rs_total / 1e3:.2f} ms on the comm thread, {100 * hidden:.0f}% of it while "
      f"the training thread was not waiting (reported)")
m = re.search(r"exposed \(training thread waiting\) ([\d.]+) ms", log)
from_trace = float(m.group(1))
# The trainer's per-unit table adds up to the exposed total (both read from the same ranges).
table = re.findall(r"^(\S+)\s+([\d.]+)\s+([\d.]+)$", log.split("waits per unit")[1], re.M)
units = {u for u, _, _ in table}
per_unit = sum(float(a) + float(b) for _, a, b in table)
if not {"layers.0", "layers.1", "layers.2"} <= units:
    fail.append(f"per-unit wait table lacks blocks: {sorted(units)}")
if abs(per_unit - from_trace) > max(0.01 * from_trace, 0.05 * len(table)):
    fail.append(f"per-unit waits add up to {per_unit:.2f} ms, the exposed total is {from_trace} ms")
# Roofline: matmul FLOPs per step are 6 x tokens x matmul parameters (forward, and backward's
# input and weight gradients): 12 d^2 per block and the head's d x vocab; 2 x 64 tokens per rank.
roof = json.load(open(sys.argv[3]))
rows = {r["cls"]: r for r in roof["rows"]}
d, vocab, layers, tokens = 128, 2000, 3, 2 * 64
want = 6 * tokens * (12 * layers * d * d + d * vocab)
got = rows.get("matmul", {}).get("flops", 0)
print(f"roofline: matmul {got / 1e9:.4f} GFLOP per step (analytic {want / 1e9:.4f}); classes {sorted(rows)}")
if abs(got - want) > 1e-3 * want:
    fail.append(f"roofline matmul FLOPs {got:.0f}, expected {want}")
for cls in ("attention", "normalisation", "elementwise", "optimizer", "communication"):
    if cls not in rows or rows[cls]["ms_per_step"] <= 0:
        fail.append(f"roofline has no time for {cls}")
if os.path.getsize(sys.argv[4]) < 10000:
    fail.append("roofline plot missing or empty")
print("\n".join(fail) if fail else "profile trace: passed")
sys.exit(1 if fail else 0)
PY
