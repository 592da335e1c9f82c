#!/usr/bin/env bash
# Installs what this project needs and is missing; idempotent, and quick when all is there.
#   1. Debian packages (apt-get): compiler, CMake, Open MPI, fmt, GoogleTest, CLI11, nlohmann-json,
#      iproute2.
#   2. libtorch: PyTorch 2.11.0 from PyPI, with the Python packages the tests and benchmarks use
#      (safetensors, numpy, matplotlib, and the outside programs the Llama model is checked
#      against: transformers, tokenizers, sentencepiece, mlx), in a virtual environment outside
#      the source tree:
#        FSDP_VENV (default: $HOME/.cache/fsdp-cpp/venv)
#      PyPI's default Linux wheel of torch 2.11.0 is the CUDA 13.0 build (about 3 GB to download,
#      5.5 GB installed); its CPU tensors work on machines without a GPU. CMake finds libtorch
#      through this environment (cmake/FsdpFindTorch.cmake).
#   3. llama-cpp-python's source release from PyPI (not installed: CMake builds llama.cpp's Jinja
#      engine, for chat templates, from it), into $FSDP_CACHE/llama-cpp.
# Prints the venv path as its last line: "install_deps: libtorch venv <path>".
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

torch_version=2.11.0
uv_version=0.13.10  # the installer of the Python packages (below)
venv="$FSDP_VENV"

packages=(
  g++ cmake make pkg-config
  libopenmpi-dev openmpi-bin
  libgtest-dev libgmock-dev
  libcli11-dev          # command-line parsing for the examples and benchmarks
  nlohmann-json3-dev    # JSON: metrics lines, safetensors headers
  iproute2              # `ip netns`: the multi-host test's namespace "hosts"
  ccache                # keeps compiled objects across builds (used when present)
  libpcre2-dev          # the tokenizer's pre-tokenizer regexes (Unicode properties)
  libutf8proc-dev       # the tokenizer's NFC normalizer (Qwen2's)
)
python_packages=(
  "torch==${torch_version}"
  safetensors           # weights exchanged with the PyTorch reference (FSDP2 parity test)
  numpy                 # torch warns without it; safetensors' numpy API
  matplotlib            # bench/ plots
  # The outside programs the Llama model is checked against (tests/reference/hf_llama.py):
  "transformers==5.24.0"  # LlamaForCausalLM, the reference model and trainer (FSDP2 on gloo)
  "tokenizers==0.23.3" "sentencepiece==0.2.3"  # scripts/tokenize_text.py
  "mlx[cpu]==0.32.4" "mlx-lm==0.32.2"            # MLX loads the exported directories
  "peft==0.21.2"        # LoRA: the reference adapters (tests/reference/llama_parity.py --lora)
  "torchao==0.18.0"     # float8: Float8Linear, the reference of train_llama --float8 (3 MB)
)
# Their dist-info names, to tell a complete venv by a directory listing.
python_dists=(safetensors numpy matplotlib transformers tokenizers sentencepiece mlx mlx_lm peft
              torchao)

missing=()
for p in "${packages[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done
# A Python to build the venv with: any python3 that has the venv module.
python=$(command -v python3 || true)
if [ -z "$python" ] || ! "$python" -c "import venv, ensurepip" 2>/dev/null; then
  missing+=(python3 python3-venv)
  python=/usr/bin/python3
fi

if [ ${#missing[@]} -gt 0 ]; then
  sudo=""
  if [ "$(id -u)" -ne 0 ]; then sudo="sudo"; fi
  echo "install_deps: installing ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  # A fresh machine has no package lists; update only when a package cannot be found.
  if ! $sudo apt-get install -y -q "${missing[@]}" >/tmp/fsdp_apt.log 2>&1; then
    echo "install_deps: package not found in current lists, running apt-get update"
    $sudo apt-get update -q >>/tmp/fsdp_apt.log 2>&1
    $sudo apt-get install -y -q "${missing[@]}" >>/tmp/fsdp_apt.log 2>&1 || {
      echo "install_deps: apt-get install failed; see /tmp/fsdp_apt.log" >&2
      tail -20 /tmp/fsdp_apt.log >&2
      exit 1
    }
  fi
else
  echo "install_deps: all ${#packages[@]} Debian packages present"
fi

# The venv is complete when every package's metadata is there at the pinned torch version:
# a directory test, so a second run costs milliseconds instead of importing torch.
venv_complete() {
  local site
  site=$(ls -d "$venv"/lib/python3*/site-packages 2>/dev/null | head -1) || return 1
  [ -n "$site" ] || return 1
  ls -d "$site/torch-${torch_version}.dist-info" > /dev/null 2>&1 || return 1
  for p in "${python_dists[@]}"; do
    ls -d "$site/$p"-*.dist-info > /dev/null 2>&1 || return 1
  done
}

if venv_complete; then
  echo "install_deps: torch ${torch_version} present in $venv"
else
  echo "install_deps: installing torch ${torch_version} and ${python_packages[*]:1} into $venv"
  echo "install_deps: (the CUDA 13.0 wheel and its nvidia-* libraries: about 3 GB to download)"
  [ -x "$venv/bin/python" ] || "$python" -m venv "$venv"
  # uv (PyPI's, pinned) installs the same packages as pip, downloading in parallel: measured on
  # a 2-core machine with nothing cached, 26 s against pip's 78 s. pip installs them where uv
  # cannot be had or fails, and where pip is configured with an index of its own (a mirror: uv
  # does not read pip's configuration). --compile-bytecode, as pip does: uv does not by
  # default, and where PYTHONDONTWRITEBYTECODE is set (CI's machines) every Python start then
  # compiled torch afresh: import torch took 3.0 s instead of 1.5, and ctest 40% longer.
  : > /tmp/fsdp_pip.log
  installed=""
  if ! "$venv/bin/python" -m pip config list 2>/dev/null | grep -q "index-url" &&
    "$venv/bin/python" -m pip install -q --disable-pip-version-check "uv==$uv_version" \
      >>/tmp/fsdp_pip.log 2>&1; then
    "$venv/bin/uv" pip install -q --compile-bytecode --system-certs --python "$venv/bin/python" \
      "${python_packages[@]}" >>/tmp/fsdp_pip.log 2>&1 && installed=uv ||
      echo "install_deps: uv failed (/tmp/fsdp_pip.log); installing with pip"
  fi
  if [ -z "$installed" ]; then
    "$venv/bin/python" -m pip install -q --disable-pip-version-check "${python_packages[@]}" \
      >>/tmp/fsdp_pip.log 2>&1 || {
      echo "install_deps: pip install failed; see /tmp/fsdp_pip.log" >&2
      tail -20 /tmp/fsdp_pip.log >&2
      exit 1
    }
  fi
  venv_complete || { echo "install_deps: $venv is incomplete after pip install" >&2; exit 1; }
fi
# llama-cpp-python's source release (76 MB): the chat-template engine is built from the llama.cpp
# it vendors (cmake/FsdpLlamaJinja.cmake).
if [ -f "$LLAMA_CPP_SDIST" ]; then
  echo "install_deps: llama-cpp-python $LLAMA_CPP_PYTHON source present"
else
  echo "install_deps: downloading llama-cpp-python $LLAMA_CPP_PYTHON's source release (76 MB)"
fi
fsdp_fetch_llama_cpp_sdist "$venv/bin/python" || {
  echo "install_deps: pip download of llama-cpp-python $LLAMA_CPP_PYTHON failed" >&2
  exit 1
}
echo "install_deps: libtorch venv $venv"
