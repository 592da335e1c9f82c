# Finds libtorch, fmt and the optional engines; sets FSDP_HAVE_<ENGINE> for each backend built.

find_package(Torch REQUIRED)

# FSDP_DEPS_DIR: machines without Debian's packages (the GPU machine) use header-only fmt,
# CLI11 and nlohmann-json and GoogleTest's sources copied by scripts/gpu_bundle_deps.sh.
set(FSDP_DEPS_DIR "" CACHE PATH "Bundled dependencies (scripts/gpu_bundle_deps.sh); empty: system")
if(FSDP_DEPS_DIR)
  add_library(fsdp_fmt_header_only INTERFACE)
  target_include_directories(fsdp_fmt_header_only SYSTEM INTERFACE ${FSDP_DEPS_DIR}/include)
  target_compile_definitions(fsdp_fmt_header_only INTERFACE FMT_HEADER_ONLY)
  add_library(fmt::fmt ALIAS fsdp_fmt_header_only)
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
  set(FSDP_INSTALL OFF)  # bundled header-only fmt cannot be exported with the package
else()
  find_package(fmt REQUIRED)
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

# Gloo: libtorch links libgloo, but ships its headers only in some distributions.
if(NOT FSDP_WITH_GLOO STREQUAL "OFF")
  find_path(FSDP_GLOO_INCLUDE_DIR gloo/algorithm.h HINTS ${TORCH_INCLUDE_DIRS})
  find_library(FSDP_GLOO_LIBRARY NAMES gloo HINTS ${TORCH_INSTALL_PREFIX}/lib)
  if(FSDP_GLOO_INCLUDE_DIR AND EXISTS
     "${TORCH_INSTALL_PREFIX}/include/torch/csrc/distributed/c10d/ProcessGroupGloo.hpp")
    set(_gloo_found TRUE)
  endif()
  if(NOT FSDP_GLOO_LIBRARY)
    # PyTorch wheels link gloo statically into libtorch_cpu: nothing more to link.
    set(FSDP_GLOO_LIBRARY "")
  endif()
endif()
fsdp_resolve_backend(GLOO _gloo_found)

# NCCL: the CUDA toolkit's runtime plus nccl.h/libnccl (in the toolkit or a pip wheel).
if(NOT FSDP_WITH_NCCL STREQUAL "OFF")
  find_package(CUDAToolkit QUIET)
  find_path(FSDP_NCCL_INCLUDE_DIR nccl.h
            HINTS ${CUDAToolkit_INCLUDE_DIRS} ENV NCCL_HOME ENV NCCL_INCLUDE_DIR
            PATH_SUFFIXES include)
  find_library(FSDP_NCCL_LIBRARY NAMES nccl libnccl.so.2
               HINTS ${CUDAToolkit_LIBRARY_DIR} ENV NCCL_HOME ENV NCCL_LIB_DIR
               PATH_SUFFIXES lib lib64)
  if(CUDAToolkit_FOUND AND FSDP_NCCL_INCLUDE_DIR AND FSDP_NCCL_LIBRARY)
    set(_nccl_found TRUE)
  endif()
endif()
fsdp_resolve_backend(NCCL _nccl_found)

# Whether this libtorch was built with CUDA (then c10/cuda headers compile and link).
set(FSDP_TORCH_HAS_CUDA FALSE)
if(TARGET torch_cuda OR TARGET c10_cuda)
  set(FSDP_TORCH_HAS_CUDA TRUE)
endif()
