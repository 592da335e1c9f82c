# Sourced by the project's scripts (scripts/, bench/, tests/): what they share, in one place.
#   FSDP_ROOT    the repository
#   FSDP_VENV    the virtual environment with libtorch (scripts/install_deps.sh fills it)
#   FSDP_CACHE   downloads and builds kept between runs (default ~/.cache/fsdp-cpp)
#   FSDP_PY      its Python (FSDP_PYTHON overrides: the one CMake found, say)
#   FSDP_MPIRUN  mpirun and the flags every launch here needs (an array): --oversubscribe
#                (more ranks than cores), and --allow-run-as-root when running as root
FSDP_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
FSDP_VENV="${FSDP_VENV:-$HOME/.cache/fsdp-cpp/venv}"
FSDP_CACHE="${FSDP_CACHE:-$HOME/.cache/fsdp-cpp}"
# llama-cpp-python's source release, which vendors llama.cpp: the chat-template engine is built
# from it (cmake/FsdpLlamaJinja.cmake reads these two lines), the edge check builds llama.cpp from
# it, and the tokenizer check reads the published vocabularies in it.
LLAMA_CPP_PYTHON=0.3.36
LLAMA_CPP_PYTHON_SHA256=832db0699007f1be95a7e41ef12e88926b02ba836461e36a36372db2760c1a2e
LLAMA_CPP_SDIST="$FSDP_CACHE/llama-cpp/llama_cpp_python-$LLAMA_CPP_PYTHON.tar.gz"
FSDP_PY="${FSDP_PYTHON:-$FSDP_VENV/bin/python}"
FSDP_MPIRUN=(mpirun --oversubscribe)
if [ "$(id -u)" -eq 0 ]; then FSDP_MPIRUN+=(--allow-run-as-root); fi

# Downloads LLAMA_CPP_SDIST from PyPI with pip (PYTHON: $1) unless it is there; checks its SHA-256.
fsdp_fetch_llama_cpp_sdist() {
  local py="$1" dir
  dir=$(dirname "$LLAMA_CPP_SDIST")
  if [ ! -f "$LLAMA_CPP_SDIST" ]; then
    mkdir -p "$dir"
    "$py" -m pip download -q --disable-pip-version-check --no-deps --no-binary :all: \
      "llama-cpp-python==$LLAMA_CPP_PYTHON" -d "$dir" || return 1
  fi
  if ! echo "$LLAMA_CPP_PYTHON_SHA256  $LLAMA_CPP_SDIST" | sha256sum -c --status; then
    echo "$LLAMA_CPP_SDIST: SHA-256 differs from the pinned one; delete it and run again" >&2
    return 1
  fi
}

# --- What every script and test needs first (source this file, then call what it uses) -------
# fsdp_on_exit CMD: runs CMD (eval'd) when the script exits, after what was registered before:
# one EXIT trap for every cleanup, so that a second registration does not replace the first.
_fsdp_exit_cmds=()
_fsdp_run_exit() {
  local c
  for c in "${_fsdp_exit_cmds[@]}"; do eval "$c"; done
}
fsdp_on_exit() {
  _fsdp_exit_cmds+=("$1")
  trap _fsdp_run_exit EXIT
}

# fsdp_scratch: a new temporary folder in $tmp, removed at exit. KEEP_TMP=DIR uses DIR instead
# and keeps it (to look at what a failing test wrote).
fsdp_scratch() {
  if [ -n "${KEEP_TMP:-}" ]; then
    tmp="$KEEP_TMP"
    mkdir -p "$tmp"
  else
    tmp="$(mktemp -d)"
    fsdp_on_exit "rm -rf '$tmp'"
  fi
}

# fsdp_one_thread: one OpenMP and BLAS thread per process, for tests whose ranks share the
# machine's cores (the trainers set their own with --threads).
fsdp_one_thread() {
  export OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1
}

# fsdp_pyfork [MODULE...]: makes "$py" (the venv's Python) start in a fraction of a second: a
# server started here imports torch, transformers' Llama and tokenizers (and the MODULEs: peft,
# mlx_lm, ...) once, in the background, and $py becomes $tmp/pyfork/python, which runs each
# program in a fork of it (scripts/pyfork.py says how, and when it runs the ordinary way
# instead). Call it after fsdp_scratch and fsdp_one_thread: the server keeps the environment it
# starts with. The server stops when the script exits.
fsdp_pyfork() {
  local real sock="$tmp/pyfork/sock"
  real="$(realpath -s "$(command -v "$py")")"  # absolute (the fallback execs it), links kept
  mkdir -p "$tmp/pyfork"
  rm -f "$sock"  # a kept scratch folder (KEEP_TMP) may hold the last run's
  "$real" "$FSDP_ROOT/scripts/pyfork.py" serve "$sock" "$@" \
    < /dev/null > "$tmp/pyfork/server.log" 2>&1 &
  fsdp_on_exit "kill $! 2> /dev/null"
  # It writes $tmp/pyfork/python and listens before it imports (callers queue meanwhile): wait
  # for that, at most 5 s (a caller that finds no server runs the ordinary python).
  local i
  for i in $(seq 50); do [ -S "$sock" ] && break; sleep 0.1; done
  py="$tmp/pyfork/python"
  [ -x "$py" ] || py="$real"
}

# expect_error NEEDLE COMMAND...: COMMAND must exit non-zero and print NEEDLE (a fixed string,
# not a pattern) on stdout or stderr. Prints "refused: <the line>" when it does; otherwise
# "FAILED: ..." with what it printed, sets fail=1 and returns 1. Its log is $tmp/expect_error.log.
expect_error() {
  local needle="$1" log="${tmp:-/tmp}/expect_error.log"
  shift
  if "$@" > "$log" 2>&1; then
    echo "FAILED: exited 0, expected a refusal naming '$needle': $*"
    fail=1
    return 1
  fi
  if ! grep -qF -- "$needle" "$log"; then
    echo "FAILED: the message lacks '$needle' ($*):"
    cat "$log"
    fail=1
    return 1
  fi
  echo "refused: $(grep -F -- "$needle" "$log" | head -1 | cut -c1-160)"
}
