# Finds libtorch and checks its version; sets FSDP_PYTHON (a Python with the same torch, for the
# tests and benchmarks that run the PyTorch reference) when one is known.
#
# Where libtorch comes from, first match wins:
#   1. the caller's Torch_DIR or CMAKE_PREFIX_PATH (any libtorch distribution: PyTorch's zip, a
#      wheel's torch/share/cmake, a source build);
#   2. the virtual environment scripts/install_deps.sh fills: FSDP_VENV (CMake or environment
#      variable), default $HOME/.cache/fsdp-cpp/venv.
# Supported: libtorch 2.11 (tested: 2.11.0 from PyPI, CPU and CUDA 13.0 builds). Older versions
# fail the configure; newer ones configure with a warning, untested.

set(FSDP_TORCH_MIN_VERSION 2.11)
set(FSDP_TORCH_TESTED_VERSION 2.11.0)

if(NOT FSDP_VENV)
  if(DEFINED ENV{FSDP_VENV})
    set(FSDP_VENV "$ENV{FSDP_VENV}")
  else()
    set(FSDP_VENV "$ENV{HOME}/.cache/fsdp-cpp/venv")
  endif()
endif()
set(FSDP_VENV "${FSDP_VENV}" CACHE PATH "Virtual environment with torch (scripts/install_deps.sh)")

file(GLOB _fsdp_venv_torch_cmake "${FSDP_VENV}/lib/python3*/site-packages/torch/share/cmake")
if(_fsdp_venv_torch_cmake)
  list(APPEND CMAKE_PREFIX_PATH ${_fsdp_venv_torch_cmake})
endif()

set(_fsdp_install_hint
    "Install the supported one with scripts/install_deps.sh (pip installs torch==${FSDP_TORCH_TESTED_VERSION} into ${FSDP_VENV}; FSDP_VENV picks another place), or point CMake at another libtorch ${FSDP_TORCH_MIN_VERSION}: -DCMAKE_PREFIX_PATH=<libtorch>/share/cmake (for a wheel: python3 -c 'import torch; print(torch.utils.cmake_prefix_path)').")

find_package(Torch CONFIG QUIET)
if(NOT Torch_FOUND)
  message(FATAL_ERROR
    "libtorch not found (looked in CMAKE_PREFIX_PATH and ${FSDP_VENV}). fsdp-cpp needs "
    "libtorch ${FSDP_TORCH_MIN_VERSION}. ${_fsdp_install_hint}")
endif()
if(Torch_VERSION VERSION_LESS FSDP_TORCH_MIN_VERSION)
  message(FATAL_ERROR
    "libtorch ${Torch_VERSION} found at ${Torch_DIR}; fsdp-cpp supports libtorch "
    "${FSDP_TORCH_MIN_VERSION} (tested: ${FSDP_TORCH_TESTED_VERSION}). ${_fsdp_install_hint}")
endif()
if(NOT Torch_VERSION VERSION_LESS 2.12)
  message(WARNING "libtorch ${Torch_VERSION} is newer than the tested ${FSDP_TORCH_TESTED_VERSION}")
endif()

# The Python that owns this libtorch, when libtorch came from a wheel: <site-packages>/torch.
if(NOT FSDP_PYTHON)
  get_filename_component(_fsdp_site "${TORCH_INSTALL_PREFIX}/.." ABSOLUTE)
  get_filename_component(_fsdp_env "${_fsdp_site}/../../.." ABSOLUTE)
  if(EXISTS "${_fsdp_env}/bin/python" AND EXISTS "${_fsdp_site}/torch/__init__.py")
    set(FSDP_PYTHON "${_fsdp_env}/bin/python")
  endif()
endif()
set(FSDP_PYTHON "${FSDP_PYTHON}" CACHE FILEPATH "Python with torch ${Torch_VERSION} (reference tests)")
