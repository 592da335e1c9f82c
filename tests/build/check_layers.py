#!/usr/bin/env python3
"""The house's floors: the folder-level include graph of src/ and include/fsdp/ has no edge
running back up; inside src/runtime/, the files form floors too (RUNTIME_FILES) and no include of
a private runtime header runs back up; and no two sources of the library and its programs share
a file name (so that a stack trace or a build log names one file).

A folder is a layer: src/X and include/fsdp/X are the same layer X. Each layer may include only
the layers listed under it in LAYERS (and itself); every edge found is checked, and for the
layers that build against public headers only (models), every include of a private src/ header
of another layer fails too. Run by ctest (include_graph_layers); exits 1 listing each offending
#include with its file.

    tests/build/check_layers.py [REPO]
"""
import os
import re
import sys

# Each layer and the layers below it that it may include. Bottom first.
LAYERS = {
    "util": set(),
    "detail": set(),  # include/fsdp/detail: the templates of fully_shard.h's Unit
    "comm": {"util"},
    "io": {"util"},
    "data": {"util", "io"},
    "launch": {"util", "comm"},
    "parallel": {"util", "comm"},  # tensor parallelism's collectives and loss
    "runtime": {"util", "comm", "detail"},
    # Fused operations (the linear cross-entropy, float8; float8's all-gather is a runtime hook).
    "ops": {"util", "comm", "parallel", "runtime"},
    "optim": {"util", "comm", "parallel", "runtime"},
    "checkpoint": {"util", "comm", "io", "parallel", "runtime"},
    "tools": {"util", "runtime"},
    "models": {"comm", "io", "data", "parallel", "ops", "runtime", "checkpoint", "optim", "tools"},
    # The optional text library (fsdp::text: tokenizer, chat templates): beside the models, not
    # under them, so that the models and the trainers build without it.
    "text": {"util", "io"},
}
# Layers that see some layers (None: every other) through their public headers only
# (include/fsdp/): the models library builds as a user's would, and checkpoints, optimizer
# state and clipping read the runtime through its public shard view.
PUBLIC_ONLY = {"models": None, "text": None, "checkpoint": {"runtime"}, "optim": {"runtime"}}
# Headers every layer may include: the errors, the umbrella's pieces are layers themselves.
ANYWHERE = {"fsdp/errors.h"}
# Deprecated headers that only forward to where their contents moved (CHANGELOG's Deprecated),
# with the edge they may have: the old place, the new one.
FORWARDERS = {
    "include/fsdp/models/tokenizer.h": "fsdp/text/tokenizer.h",
    "include/fsdp/models/chat_template.h": "fsdp/text/chat_template.h",
}
INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"')

# The files of src/runtime/ (X.h and X.cpp are the file X), bottom first: a file may include the
# private headers ("runtime/Y.h") of the files before it only. The order is the runtime's
# one-way inside (docs/design.md, "Who owns what in the runtime"): the pieces that move bytes,
# the CommContext that holds what a tree shares (its reductions in flight driven by reduce),
# the lifecycle of one unit (param_group, deciding its end of backward with backward_end),
# the tree of units, a unit's wiring, and the entry points. A new file must be placed here.
RUNTIME_FILES = [
    "layout", "lifecycle", "finish_after", "post_backward_function",  # no private headers
    "buffer_pool", "collectives", "quantized_all_gather", "fsdp_param", "all_gather",
    "comm_context", "reduce",
    "backward_end", "param_group",
    "tree",
    "unit_state",
    "activation_checkpoint", "forward", "shard_view", "fully_shard",
]
# Includes that run back up, each named with why it stays: (file, included header).
RUNTIME_EXCEPTIONS = {
    # The tree walks its units: the root's lazy init (children, names, world sizes), the end of
    # backward and the reset call each unit. FSDP2's FSDPStateContext holds its FSDPStates the
    # same way; going one-way needs an interface the units implement (issue 41, item 4).
    ("src/runtime/tree.cpp", "runtime/unit_state.h"),
}


def runtime_order_problems(repo):
    """Each include of a private runtime header inside src/runtime/ that runs back up."""
    rank = {name: i for i, name in enumerate(RUNTIME_FILES)}
    problems, base = [], os.path.join(repo, "src", "runtime")
    for f in sorted(os.listdir(base)):
        if not f.endswith((".h", ".cpp")):
            continue
        rel, stem = f"src/runtime/{f}", os.path.splitext(f)[0]
        if stem not in rank:
            problems.append(f"{rel}: not placed in RUNTIME_FILES of {__file__}")
            continue
        for line in open(os.path.join(base, f), errors="replace"):
            m = INCLUDE.match(line)
            if not m or not m.group(1).startswith("runtime/"):
                continue
            inc = m.group(1)
            dep = os.path.splitext(inc[len("runtime/"):])[0]
            if dep == stem or (rel, inc) in RUNTIME_EXCEPTIONS:
                continue
            if dep not in rank:
                problems.append(f"{rel}: #include \"{inc}\": not placed in RUNTIME_FILES")
            elif rank[dep] > rank[stem]:
                problems.append(f"{rel}: #include \"{inc}\": runtime file {stem} may not include "
                                f"{dep}, which lies above it in RUNTIME_FILES")
    return problems


def layer_of(rel):
    parts = rel.split("/")
    if parts[0] == "include" and len(parts) > 3:
        return parts[2]
    if parts[0] == "src" and len(parts) > 2:
        return parts[1]
    return None


def main():
    repo = os.path.abspath(sys.argv[1] if len(sys.argv) > 1 else
                           os.path.join(os.path.dirname(__file__), "..", ".."))
    problems, edges = [], set()
    for base in ("src", "include"):
        for d, _, files in os.walk(os.path.join(repo, base)):
            for f in files:
                if not f.endswith((".h", ".cpp")):
                    continue
                rel = os.path.relpath(os.path.join(d, f), repo)
                if "gloo_decls" in rel:  # a vendored engine's declarations
                    continue
                a = layer_of(rel)
                if a is None:
                    continue
                if a not in LAYERS:
                    problems.append(f"{rel}: folder '{a}' is not a layer of {__file__}")
                    continue
                for line in open(os.path.join(repo, rel), errors="replace"):
                    m = INCLUDE.match(line)
                    if not m:
                        continue
                    inc = m.group(1)
                    if inc in ANYWHERE or FORWARDERS.get(rel) == inc:
                        continue
                    public = inc.startswith("fsdp/")
                    b = layer_of("include/" + inc) if public else (
                        inc.split("/")[0] if "/" in inc else None)
                    if b is None or b == a:
                        continue
                    if b not in LAYERS:
                        continue  # a library's own private folder (models' llama/)
                    edges.add((a, b))
                    if b not in LAYERS[a]:
                        problems.append(f"{rel}: #include \"{inc}\": {a} may not include {b} "
                                        f"(it may include {', '.join(sorted(LAYERS[a])) or 'nothing'})")
                    elif (not public and a in PUBLIC_ONLY and
                          (PUBLIC_ONLY[a] is None or b in PUBLIC_ONLY[a])):
                        problems.append(f"{rel}: #include \"{inc}\": {a} sees {b} through its "
                                        "public headers only (include/fsdp/)")
    problems += runtime_order_problems(repo)
    names = {}
    for base in ("src", "examples"):
        for d, _, files in os.walk(os.path.join(repo, base)):
            for f in files:
                if f.endswith(".cpp"):
                    names.setdefault(f, []).append(os.path.relpath(os.path.join(d, f), repo))
    for f, paths in sorted(names.items()):
        if len(paths) > 1:
            problems.append(f"{f} names {len(paths)} sources: {', '.join(sorted(paths))}")
    for a, b in sorted(edges):
        print(f"{a} -> {b}")
    for p in problems:
        print("FAILED:", p)
    if not problems:
        print(f"include_graph_layers: {len(edges)} folder edges, none running back up; "
              f"{len(RUNTIME_FILES)} runtime files in order, named exceptions: "
              f"{len(RUNTIME_EXCEPTIONS)}")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
