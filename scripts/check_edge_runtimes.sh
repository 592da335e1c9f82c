#!/usr/bin/env bash
# Checks a Llama model exported in Hugging Face format (by train_llama, or hf_llama.py) under edge
# runtimes: the validation perplexity under llama.cpp (f32 and f16 GGUF, on its CPU backend and
# on its Vulkan backend) and ExecuTorch (portable and XNNPACK .pte) must equal exp(EXPECTED_LOSS),
# the loss the trainer printed, within 1%; Vulkan's must equal the CPU backend's within 1e-3.
#
#   scripts/check_edge_runtimes.sh HF_DIR VAL_TOKENS SEQ EXPECTED_LOSS [--tokenizer tokenizer.model|tokenizer.json]
#       [--tokens-dtype uint16|uint32] [--skip-llamacpp] [--skip-vulkan] [--skip-executorch]
#       [--work DIR]
#       [--max-windows N]
#
# llama.cpp: llama-cpp-python's source release (which vendors llama.cpp and its
# convert_hf_to_gguf.py) is downloaded once into $FSDP_CACHE/llama-cpp, built into a wheel once
# (CPU only; 16 to 18 minutes measured on a busy 2-core machine) and installed into the
# project's venv; a later run reuses the wheel. The converter needs a SentencePiece
# tokenizer.model beside the weights: --tokenizer copies one in (scripts/tokenize_text.py writes one
# when it trains its own), or a published model's byte-level BPE tokenizer.json (Llama 3's,
# Qwen2's: the converter recognizes it by the ids it gives a test text).
# llama.cpp on Vulkan: a second wheel of the same source with -DGGML_VULKAN=ON (Debian's glslc,
# libvulkan-dev and spirv-headers, installed here when missing and apt-get is usable; one
# instance-creation block patched for Debian 12's older Vulkan headers by
# scripts/patch_llamacpp_vulkan.py; MINUTES minutes on 2 cores), installed into its own venv,
# $FSDP_CACHE/llamacpp-vulkan-venv, which sees the project venv through a .pth file. Every layer
# is offloaded; on a machine without a GPU the device is Mesa's software rasterizer lavapipe
# (mesa-vulkan-drivers), whose name the table shows.
# ExecuTorch: executorch 1.2.0 (the release built against torch 2.11) goes into a separate venv,
# $FSDP_CACHE/executorch-venv, that sees the project venv's torch and transformers through a .pth
# file; its XNNPACK backend needs the flatbuffers compiler flatc (Debian: flatbuffers-compiler,
# installed here when missing and apt-get is usable).
#
# Environment: FSDP_VENV (default $HOME/.cache/fsdp-cpp/venv), FSDP_CACHE (default
# $HOME/.cache/fsdp-cpp). Prints a table (runtime, dtype, val loss, ppl, exp(expected), rel err)
# and exits 0 when every runtime agrees, 1 when one does not, 2 on a usage error.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

EXECUTORCH=1.2.0 TORCHAO=0.17.0
root="$FSDP_ROOT"
here="$root/scripts"
helper="$root/tests/reference/edge_runtimes.py"

usage() { sed -n '2,33p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//' >&2; exit 2; }
die() { echo "check_edge_runtimes: $*" >&2; exit 1; }

positional=() tokenizer="" dtype=uint16 skip_llamacpp=0 skip_vulkan=0 skip_executorch=0 work=""
max_windows=""
while [ $# -gt 0 ]; do
  case "$1" in
    --tokenizer) tokenizer="${2:?--tokenizer needs a file}"; shift 2 ;;
    --tokens-dtype) dtype="${2:?}"; shift 2 ;;
    --skip-llamacpp) skip_llamacpp=1; shift ;;
    --skip-vulkan) skip_vulkan=1; shift ;;
    --skip-executorch) skip_executorch=1; shift ;;
    --work) work="${2:?}"; shift 2 ;;
    --max-windows) max_windows="${2:?}"; shift 2 ;;
    -h|--help) usage ;;
    -*) echo "check_edge_runtimes: unknown option $1" >&2; usage ;;
    *) positional+=("$1"); shift ;;
  esac
done
[ ${#positional[@]} -eq 4 ] || usage
hf_dir=$(realpath "${positional[0]}") val=$(realpath "${positional[1]}")
seq=${positional[2]} expect=${positional[3]}
[ -f "$hf_dir/config.json" ] || die "$hf_dir: no config.json (not a Hugging Face model directory)"
[ -f "$val" ] || die "validation tokens not found: $val"
[[ "$seq" =~ ^[1-9][0-9]*$ ]] || die "SEQ must be a positive integer, got '$seq'"
python3 -c "import sys; float(sys.argv[1])" "$expect" 2>/dev/null || die "EXPECTED_LOSS '$expect' is not a number"
[ -z "$tokenizer" ] || [ -f "$tokenizer" ] || die "tokenizer not found: $tokenizer"

venv="$FSDP_VENV"
cache="$FSDP_CACHE"
py="$venv/bin/python"
[ -x "$py" ] || die "no venv at $venv (scripts/install_deps.sh makes it)"
"$py" -c "import torch, transformers, safetensors, sentencepiece" 2>/dev/null ||
  die "the venv lacks torch/transformers/safetensors/sentencepiece: $venv/bin/pip install transformers sentencepiece"
if [ -z "$work" ]; then fsdp_scratch; work="$tmp"; fi
mkdir -p "$work"
rows="$work/rows.jsonl"; : > "$rows"
common=(--val-tokens "$val" --tokens-dtype "$dtype" --seq "$seq" --expect "$expect" --rows "$rows")
[ -z "$max_windows" ] || common+=(--max-windows "$max_windows")
now() { date +%s.%N; }
since() { python3 -c "import sys; print(f'{float(sys.argv[2]) - float(sys.argv[1]):.1f}s')" "$1" "$(now)"; }

if [ "$skip_llamacpp" = 0 ]; then
  lc="$cache/llama-cpp"; mkdir -p "$lc/wheels"
  sdist="$LLAMA_CPP_SDIST"
  fsdp_fetch_llama_cpp_sdist "$py" || die "pip download of llama-cpp-python $LLAMA_CPP_PYTHON failed"
  wheel=$(ls "$lc/wheels/llama_cpp_python-$LLAMA_CPP_PYTHON-"*.whl 2>/dev/null | head -1 || true)
  if [ -z "$wheel" ]; then
    echo "== building llama-cpp-python $LLAMA_CPP_PYTHON (CPU; ~16-18 min on 2 busy cores; log $lc/build.log)"
    t0=$(now)
    CMAKE_ARGS="-DGGML_CUDA=OFF -DLLAMA_CURL=OFF" CMAKE_BUILD_PARALLEL_LEVEL=$(nproc) \
      "$py" -m pip wheel --no-deps -w "$lc/wheels" "$sdist" > "$lc/build.log" 2>&1 ||
      { tail -20 "$lc/build.log" >&2; die "building llama-cpp-python failed (log $lc/build.log)"; }
    wheel=$(ls "$lc/wheels/llama_cpp_python-$LLAMA_CPP_PYTHON-"*.whl | head -1)
    echo "built $wheel in $(since "$t0")"
  fi
  if ! "$py" -c "import llama_cpp, sys; sys.exit(llama_cpp.__version__ != '$LLAMA_CPP_PYTHON')" 2>/dev/null; then
    echo "== installing $(basename "$wheel") into $venv"
    "$py" -m pip install -q --no-deps "$wheel" diskcache jinja2 typing-extensions ||
      die "installing llama-cpp-python failed"
  fi
  src="$lc/src-$LLAMA_CPP_PYTHON"
  if [ ! -f "$src/convert_hf_to_gguf.py" ]; then
    vendor="llama_cpp_python-$LLAMA_CPP_PYTHON/vendor/llama.cpp"
    mkdir -p "$src.tmp"
    tar xzf "$sdist" -C "$src.tmp" --strip-components=3 "$vendor/convert_hf_to_gguf.py" \
      "$vendor/conversion" "$vendor/gguf-py" || die "the source release has no $vendor/convert_hf_to_gguf.py"
    rm -rf "$src"; mv "$src.tmp" "$src"
  fi

  # The converter reads the directory: a copy of the model with the tokenizer beside it.
  model="$work/hf"; rm -rf "$model"; mkdir -p "$model"
  cp -r "$hf_dir"/. "$model"/
  if [ -n "$tokenizer" ]; then
    case "$tokenizer" in
      *.json) cp "$tokenizer" "$model/tokenizer.json" ;;
      *) cp "$tokenizer" "$model/tokenizer.model" ;;
    esac
  fi
  # A byte-level BPE tokenizer.json (Llama 3's, Qwen2's, ...) is converted when llama.cpp
  # recognizes its pre-tokenizer (a published model's); a SentencePiece tokenizer.model always.
  [ -f "$model/tokenizer.model" ] || [ -f "$model/tokenizer.json" ] ||
    die "llama.cpp's converter needs a SentencePiece tokenizer.model or a published model's tokenizer.json in $hf_dir (or --tokenizer FILE)"
  if [ ! -f "$model/tokenizer_config.json" ]; then
    "$py" -c "import sys; sys.path.insert(0, sys.argv[1]); import hf_llama; hf_llama.write_tokenizer_config(sys.argv[2], sys.argv[2] + '/tokenizer.model')" \
      "$root/tests/reference" "$model"
  fi
  ggufs=()
  for t in f32 f16; do
    t0=$(now)
    PYTHONPATH="$src/gguf-py:$src" "$py" "$src/convert_hf_to_gguf.py" "$model" --outtype "$t" \
      --outfile "$work/model-$t.gguf" > "$work/convert-$t.log" 2>&1 ||
      { tail -20 "$work/convert-$t.log" >&2; die "convert_hf_to_gguf.py --outtype $t failed"; }
    echo "converted to $t GGUF in $(since "$t0") ($(du -h "$work/model-$t.gguf" | cut -f1))"
    ggufs+=(--gguf "$t=$work/model-$t.gguf")
  done
  echo "== llama.cpp"
  "$py" "$helper" llamacpp "${ggufs[@]}" "${common[@]}" || die "the llama.cpp evaluation failed"

  if [ "$skip_vulkan" = 0 ]; then
    missing=()
    command -v glslc >/dev/null || missing+=(glslc)
    [ -f /usr/include/vulkan/vulkan.h ] || missing+=(libvulkan-dev)
    [ -d /usr/share/cmake/SPIRV-Headers ] || missing+=(spirv-headers)
    ls /usr/share/vulkan/icd.d/*.json >/dev/null 2>&1 || missing+=(mesa-vulkan-drivers)
    if [ ${#missing[@]} -gt 0 ]; then
      if command -v apt-get >/dev/null && [ "$(id -u)" = 0 ]; then
        echo "== installing ${missing[*]} for llama.cpp's Vulkan backend"
        apt-get install -y -qq "${missing[@]}" >/dev/null 2>&1 ||
          { apt-get update -qq >/dev/null 2>&1 && apt-get install -y -qq "${missing[@]}" >/dev/null 2>&1; } ||
          die "could not install ${missing[*]} (or give --skip-vulkan)"
      else
        die "llama.cpp's Vulkan backend needs ${missing[*]} (apt-get install them, or give --skip-vulkan)"
      fi
    fi
    vk_wheel=$(ls "$lc/wheels-vulkan/llama_cpp_python-$LLAMA_CPP_PYTHON-"*.whl 2>/dev/null | head -1 || true)
    if [ -z "$vk_wheel" ]; then
      echo "== building llama-cpp-python $LLAMA_CPP_PYTHON with Vulkan (log $lc/build-vulkan.log)"
      t0=$(now)
      # The same source, patched to build against Debian 12's Vulkan headers
      # (scripts/patch_llamacpp_vulkan.py says what it changes).
      rm -rf "$lc/vulkan-src"; mkdir -p "$lc/vulkan-src"
      tar xzf "$sdist" -C "$lc/vulkan-src"
      python3 "$here/patch_llamacpp_vulkan.py" "$lc/vulkan-src/llama_cpp_python-$LLAMA_CPP_PYTHON" ||
        die "could not patch llama.cpp's Vulkan backend for these headers"
      CMAKE_ARGS="-DGGML_VULKAN=ON -DGGML_CUDA=OFF -DLLAMA_CURL=OFF" CMAKE_BUILD_PARALLEL_LEVEL=$(nproc) \
        "$py" -m pip wheel --no-deps -w "$lc/wheels-vulkan" "$lc/vulkan-src/llama_cpp_python-$LLAMA_CPP_PYTHON" \
        > "$lc/build-vulkan.log" 2>&1 ||
        { tail -20 "$lc/build-vulkan.log" >&2; die "building llama-cpp-python with Vulkan failed (log $lc/build-vulkan.log)"; }
      vk_wheel=$(ls "$lc/wheels-vulkan/llama_cpp_python-$LLAMA_CPP_PYTHON-"*.whl | head -1)
      echo "built $vk_wheel in $(since "$t0")"
    fi
    vk="$cache/llamacpp-vulkan-venv"
    if ! "$vk/bin/python" -c "import llama_cpp, sys; sys.exit(llama_cpp.__version__ != '$LLAMA_CPP_PYTHON' or not llama_cpp.__file__.startswith('$vk/'))" 2>/dev/null; then
      echo "== installing the Vulkan build into $vk"
      rm -rf "$vk"
      "$py" -m venv "$vk" || die "could not make the venv $vk"
      # Installed before the project venv is made visible: pip would otherwise find its CPU
      # build there and install nothing.
      "$vk/bin/python" -m pip install -q --no-deps "$vk_wheel" diskcache jinja2 typing-extensions ||
        die "installing the Vulkan build of llama-cpp-python failed"
      vk_site=$("$vk/bin/python" -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")
      # The venv's own llama_cpp comes before the project venv's (the .pth path is appended).
      "$py" -c "import sysconfig; print(sysconfig.get_paths()['purelib'])" > "$vk_site/zz_fsdp_main_venv.pth"
    fi
    echo "== llama.cpp on Vulkan"
    "$vk/bin/python" "$helper" llamacpp --device vulkan "${ggufs[@]}" "${common[@]}" ||
      die "the llama.cpp evaluation on Vulkan failed"
  fi
fi

if [ "$skip_executorch" = 0 ]; then
  ev="$cache/executorch-venv"
  if ! "$ev/bin/python" -c "import executorch.runtime, torchao, sys; from executorch.version import __version__ as v; sys.exit(not v.startswith('$EXECUTORCH'))" 2>/dev/null; then
    echo "== setting up ExecuTorch $EXECUTORCH in $ev (torch from $venv)"
    torch_version=$("$py" -c "import torch; print(torch.__version__.split('+')[0])")
    case "$torch_version" in
      2.11.*) ;;
      *) echo "warning: executorch $EXECUTORCH was built against torch 2.11, the venv has $torch_version" >&2 ;;
    esac
    [ -x "$ev/bin/python" ] || "$py" -m venv "$ev" || die "could not make the venv $ev"
    site=$("$ev/bin/python" -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")
    main_site=$("$py" -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")
    echo "$main_site" > "$site/zz_fsdp_main_venv.pth"
    # --no-deps: nothing may replace the torch the .pth file shows (pip would see it as installed).
    "$ev/bin/python" -m pip install -q --no-deps "executorch==$EXECUTORCH" "torchao==$TORCHAO" \
      ruamel.yaml flatbuffers tabulate || die "installing executorch $EXECUTORCH failed"
  fi
  backends=portable
  if ! command -v flatc >/dev/null && command -v apt-get >/dev/null && [ "$(id -u)" = 0 ]; then
    echo "== installing flatc (flatbuffers-compiler) for ExecuTorch's XNNPACK backend"
    apt-get install -y -qq flatbuffers-compiler >/dev/null 2>&1 ||
      { apt-get update -qq >/dev/null 2>&1 && apt-get install -y -qq flatbuffers-compiler >/dev/null 2>&1; } || true
  fi
  if command -v flatc >/dev/null; then backends=portable,xnnpack
  else echo "warning: no flatc: ExecuTorch's XNNPACK backend is not checked" >&2; fi
  echo "== ExecuTorch"
  "$ev/bin/python" "$helper" executorch --hf-dir "$hf_dir" --backends "$backends" --work "$work" \
    "${common[@]}" 2>"$work/executorch.log" ||
    { grep -v '^\[' "$work/executorch.log" | tail -20 >&2; die "the ExecuTorch evaluation failed"; }
fi

echo
"$py" "$helper" table --rows "$rows" --expect "$expect"
