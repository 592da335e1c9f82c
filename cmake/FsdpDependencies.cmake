# Finds libtorch, fmt and the optional engines; sets FSDP_HAVE_<ENGINE> for each backend built.

include(FsdpFindTorch)

# fmt: libtorch ships fmt's headers (12.1 in torch 2.11) in its include directory, ahead of
# the system's, and its own c10d headers include them; so fmt comes from there, and no other fmt
# is linked, which would mix versions. libtorch has no fmt library to link, and header-only use
# compiled fmt's implementation into every source that formats (about 3 s each): fsdp_fmt
# compiles it once (cmake/fmt_compiled.cpp), and the library and every program link it, each its
# own hidden copy (libfsdp exports none of fmt's compiled functions).
add_library(fsdp_fmt STATIC ${PROJECT_SOURCE_DIR}/cmake/fmt_compiled.cpp)
# torch's include directories and compile flags (its C++ ABI setting), not its libraries: a
# static library's link dependencies reach every program linking it, and test_nccl_comm_fake
# must link neither libtorch_cuda nor NCCL.
foreach(_p INCLUDE_DIRECTORIES COMPILE_DEFINITIONS COMPILE_OPTIONS)
  set_property(TARGET fsdp_fmt APPEND PROPERTY ${_p} $<TARGET_PROPERTY:torch,INTERFACE_${_p}>)
endforeach()
set_target_properties(fsdp_fmt PROPERTIES POSITION_INDEPENDENT_CODE ON
                                          CXX_VISIBILITY_PRESET hidden)

# FSDP_DEPS_DIR: machines without Debian's packages (the GPU machine) use header-only CLI11 and
# nlohmann-json and GoogleTest's sources copied by scripts/gpu_bundle_deps.sh.
set(FSDP_DEPS_DIR "" CACHE PATH "Bundled dependencies (scripts/gpu_bundle_deps.sh); empty: system")
if(FSDP_DEPS_DIR)
  add_library(fsdp_header_deps INTERFACE)
  target_include_directories(fsdp_header_deps SYSTEM INTERFACE ${FSDP_DEPS_DIR}/include)
  add_library(CLI11::CLI11 ALIAS fsdp_header_deps)
  add_library(nlohmann_json::nlohmann_json ALIAS fsdp_header_deps)
  set(INSTALL_GTEST OFF CACHE BOOL "" FORCE)
  add_subdirectory(${FSDP_DEPS_DIR}/googletest ${PROJECT_BINARY_DIR}/googletest EXCLUDE_FROM_ALL)
  if(NOT TARGET GTest::gtest)  # googletest 1.12 defines these aliases itself
    add_library(GTest::gtest ALIAS gtest)
    add_library(GTest::gtest_main ALIAS gtest_main)
  endif()
  # A build for one machine's checks, not a package: the bundled copies are not installed.
  set(FSDP_INSTALL OFF)
  message(STATUS "fsdp: dependencies from FSDP_DEPS_DIR=${FSDP_DEPS_DIR}; no install rules")
else()
  find_package(nlohmann_json REQUIRED)
  # Command-line parsing for the examples, benchmarks and fuzz targets.
  if(FSDP_BUILD_EXAMPLES OR FSDP_BUILD_BENCH OR FSDP_BUILD_TESTS)
    find_package(CLI11 CONFIG REQUIRED)
  endif()
  if(FSDP_BUILD_TESTS)
    find_package(GTest REQUIRED)
  endif()
  set(FSDP_INSTALL ON)
endif()
set(FSDP_BACKEND_SUMMARY "")

# A backend option: AUTO builds it when found, ON fails the configure when not found.
function(fsdp_resolve_backend name found)
  if(FSDP_WITH_${name} STREQUAL "OFF")
    set(FSDP_HAVE_${name} FALSE PARENT_SCOPE)
  elseif(${found})
    set(FSDP_HAVE_${name} TRUE PARENT_SCOPE)
    set(FSDP_BACKEND_SUMMARY "${FSDP_BACKEND_SUMMARY} ${name}" PARENT_SCOPE)
  elseif(FSDP_WITH_${name} STREQUAL "ON")
    message(FATAL_ERROR "FSDP_WITH_${name}=ON but its dependency was not found")
  else()
    set(FSDP_HAVE_${name} FALSE PARENT_SCOPE)
  endif()
endfunction()

# MPI
if(NOT FSDP_WITH_MPI STREQUAL "OFF")
  find_package(MPI COMPONENTS C)
endif()
fsdp_resolve_backend(MPI MPI_C_FOUND)

# Gloo: c10d's ProcessGroupGloo, compiled into libtorch_cpu. The wheel ships c10d's headers but
# not gloo's; src/comm/gloo/gloo_decls/ declares the few gloo names ProcessGroupGloo.hpp mentions
# (all behind pointers), so nothing else is needed (see that folder's README).
if(NOT FSDP_WITH_GLOO STREQUAL "OFF")
  set(_gloo_header "${TORCH_INSTALL_PREFIX}/include/torch/csrc/distributed/c10d/ProcessGroupGloo.hpp")
  if(EXISTS "${_gloo_header}")
    set(_gloo_found TRUE)
  endif()
endif()
fsdp_resolve_backend(GLOO _gloo_found)

# Whether this libtorch was built with CUDA (then c10/cuda headers compile and link).
set(FSDP_TORCH_HAS_CUDA FALSE)
if(TARGET torch_cuda OR TARGET c10_cuda)
  set(FSDP_TORCH_HAS_CUDA TRUE)
endif()

# NCCL: the CUDA toolkit's runtime plus nccl.h/libnccl. The wheel's own NCCL (nvidia-nccl-cu13,
# beside torch in site-packages) comes first: a process holds one libnccl.so.2, and libtorch_cuda
# already loads that one.
if(NOT FSDP_WITH_NCCL STREQUAL "OFF")
  find_package(CUDAToolkit QUIET)
  get_filename_component(_wheel_nccl "${TORCH_INSTALL_PREFIX}/../nvidia/nccl" ABSOLUTE)
  find_path(FSDP_NCCL_INCLUDE_DIR nccl.h
            HINTS ${_wheel_nccl} ENV NCCL_HOME ENV NCCL_INCLUDE_DIR ${CUDAToolkit_INCLUDE_DIRS}
            PATH_SUFFIXES include)
  find_library(FSDP_NCCL_LIBRARY NAMES nccl libnccl.so.2 NAMES_PER_DIR
               HINTS ${_wheel_nccl} ENV NCCL_HOME ENV NCCL_LIB_DIR ${CUDAToolkit_LIBRARY_DIR}
               PATH_SUFFIXES lib lib64)
  # The backend orders its work after c10's current CUDA stream: a CUDA build of libtorch.
  if(FSDP_TORCH_HAS_CUDA AND CUDAToolkit_FOUND AND FSDP_NCCL_INCLUDE_DIR AND FSDP_NCCL_LIBRARY)
    set(_nccl_found TRUE)
  endif()
endif()
fsdp_resolve_backend(NCCL _nccl_found)

# NVTX ranges for Nsight Systems / Nsight Compute (src/util/profiler_range.h): NVTX 3 is header-only
# (it loads a tool library only when one is attached), so the toolkit's headers are enough.
# With the GPU backend only: a CPU build has no GPU timeline to annotate.
set(FSDP_HAVE_NVTX FALSE)
if(FSDP_HAVE_NCCL)
  find_path(FSDP_NVTX_INCLUDE_DIR nvtx3/nvToolsExt.h HINTS ${CUDAToolkit_INCLUDE_DIRS})
  if(FSDP_NVTX_INCLUDE_DIR)
    set(FSDP_HAVE_NVTX TRUE)
  endif()
endif()

# The CUDA kernels (src/ops/cuda: fsdp/ops/fused.h): nvcc from the CUDA toolkit (or
# CMAKE_CUDA_COMPILER, e.g. pip's nvidia-cuda-nvcc) and a CUDA build of libtorch. Off: the
# fused ops run their ATen twins, as on the CPU.
set(FSDP_WITH_CUDA_KERNELS AUTO CACHE STRING "Build the CUDA kernels (AUTO/ON/OFF)")
set(FSDP_HAVE_CUDA_KERNELS FALSE)
if(NOT FSDP_WITH_CUDA_KERNELS STREQUAL "OFF" AND FSDP_TORCH_HAS_CUDA)
  # The toolkit's usual place when nvcc is not on PATH; check_language still test-compiles
  # with it, so an nvcc that cannot build here turns the kernels off instead of failing.
  if(NOT CMAKE_CUDA_COMPILER AND NOT DEFINED ENV{CUDACXX} AND EXISTS /usr/local/cuda/bin/nvcc)
    set(ENV{CUDACXX} /usr/local/cuda/bin/nvcc)
  endif()
  include(CheckLanguage)
  check_language(CUDA)
  find_package(CUDAToolkit QUIET)
  if(CMAKE_CUDA_COMPILER AND CUDAToolkit_FOUND)
    # Ampere (sm_80) and Hopper (sm_90) machine code and PTX, which later GPUs compile at load;
    # fused.cpp keeps older GPUs on the ATen twins.
    set(FSDP_CUDA_ARCHITECTURES "80;90" CACHE STRING "CUDA architectures of the kernels")
    if(NOT CMAKE_CUDA_ARCHITECTURES)
      set(CMAKE_CUDA_ARCHITECTURES ${FSDP_CUDA_ARCHITECTURES})
    endif()
    enable_language(CUDA)
    set(FSDP_HAVE_CUDA_KERNELS TRUE)
  endif()
endif()
if(FSDP_WITH_CUDA_KERNELS STREQUAL "ON" AND NOT FSDP_HAVE_CUDA_KERNELS)
  message(FATAL_ERROR "FSDP_WITH_CUDA_KERNELS=ON but nvcc, the CUDA toolkit or a CUDA libtorch "
                      "was not found")
endif()
