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
