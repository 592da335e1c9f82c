# Helpers for the project's own programs (examples, tests, benchmarks, fuzz replays) and tests.
#
# Most of a build's time is the compiler parsing libtorch's headers, once per translation unit.
# Every program reuses one precompiled header of what they all include (fsdp/fsdp.h, which
# brings libtorch's tensor, module and optimizer headers), and the library has its own; ccache,
# when installed, caches the rest. Measured on the 2-core machine: a test file took 10.7 s
# without a precompiled header, 11.3 s with one of <torch/torch.h> (a 700 MB file whose loading
# alone takes 5.5 s), 5.1 s with this one (543 MB, 3.5 s to load).

option(FSDP_PCH "Precompile libtorch's headers for the library and the programs" ON)

# Object libraries compile the programs' precompiled headers once; programs reuse them
# (REUSE_FROM needs the same flags and definitions, which fsdp_program gives every program):
# one for programs, one with GoogleTest (whose target adds definitions) for tests.
function(fsdp_setup_program_pch)
  if(NOT FSDP_PCH)
    return()
  endif()
  add_library(fsdp_program_pch OBJECT ${PROJECT_SOURCE_DIR}/cmake/pch.cpp)
  target_link_libraries(fsdp_program_pch PRIVATE fsdp::fsdp)
  fsdp_program_flags(fsdp_program_pch)
  target_precompile_headers(fsdp_program_pch PRIVATE "${PROJECT_SOURCE_DIR}/include/fsdp/fsdp.h"
                            <fmt/format.h>)
  if(FSDP_BUILD_TESTS)
    add_library(fsdp_test_pch OBJECT ${PROJECT_SOURCE_DIR}/cmake/pch.cpp)
    target_link_libraries(fsdp_test_pch PRIVATE fsdp::fsdp GTest::gtest)
    fsdp_program_flags(fsdp_test_pch)
    target_precompile_headers(fsdp_test_pch PRIVATE "${PROJECT_SOURCE_DIR}/include/fsdp/fsdp.h"
                              <fmt/format.h> <gtest/gtest.h>)
  endif()
endfunction()

function(fsdp_program_flags target)
  # fmt's headers from libtorch's include directory, its compiled part from fsdp_fmt
  # (FsdpDependencies.cmake).
  target_link_libraries(${target} PRIVATE fsdp_fmt)
  # The models' headers leave out libtorch's umbrella header (fsdp/models/torch_modules.h): this
  # project's sources include what they use.
  target_compile_definitions(${target} PRIVATE FSDP_LEAN_HEADERS)
  target_compile_options(${target} PRIVATE -Wall -Wextra
                                           $<$<BOOL:${FSDP_WARNINGS_AS_ERRORS}>:-Werror>)
endfunction()

# fsdp_program(<target> [TEST]): a program of this project, linked to the library, with the
# shared flags and precompiled header (TEST: the one with GoogleTest, for programs linking it).
function(fsdp_program target)
  target_link_libraries(${target} PRIVATE fsdp::fsdp)
  fsdp_program_flags(${target})
  set(_pch fsdp_program_pch)
  if("${ARGN}" STREQUAL "TEST")
    set(_pch fsdp_test_pch)
    target_link_libraries(${target} PRIVATE GTest::gtest)
  endif()
  if(TARGET ${_pch})
    target_precompile_headers(${target} REUSE_FROM ${_pch})
  endif()
endfunction()

# fsdp_add_test(<name> <kind> ...): the one way to add a test.
#
#   fsdp_add_test(<target> GTEST SOURCES <src>... [LIBS <lib>...])
#       a GoogleTest binary built from SOURCES; one ctest entry per test suite.
#   fsdp_add_test(<name> MPI TARGET <target> NP <n>... [ARGS <arg>...])
#       <target> under mpiexec -n <n>, one entry per n: <name>_np<n>.
#   fsdp_add_test(<name> LAUNCH TARGET <target> NP <n>... [ARGS <arg>...])
#       <target> under scripts/launch.sh --nproc <n> (torchrun's variables, Gloo): <name>_np<n>.
#   fsdp_add_test(<name> COMMAND <command> <arg>...)
#       any command: a script, a Python reference, a program.
#
# Every kind takes [TIMEOUT <s>] [PROCESSORS <n>] [ENV <k=v>...] [SKIP_RETURN_CODE <c>]
# [RUN_SERIAL]. Tests run with one intra-op thread per process: ranks share the cores, and on the
# CPU (FSDP_DEVICE=cpu: init_from_env's automatic choice would take a GPU where one is visible);
# a test meant for a GPU passes ENV FSDP_DEVICE=auto or names its device itself.
function(fsdp_add_test name kind)
  cmake_parse_arguments(T "RUN_SERIAL" "TARGET;TIMEOUT;PROCESSORS;SKIP_RETURN_CODE"
                        "SOURCES;LIBS;NP;ARGS;ENV;COMMAND" ${ARGN})
  if(kind STREQUAL "COMMAND")
    set(T_COMMAND ${T_UNPARSED_ARGUMENTS} ${T_COMMAND})
  endif()
  set(_env OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 FSDP_DEVICE=cpu ${T_ENV})
  set(_env_text "ENVIRONMENT [==[${_env}]==]")
  # One ENVIRONMENT value holding a list: its separators escaped inside the property list.
  string(REPLACE ";" "\\;" _env "${_env}")
  set(_props ENVIRONMENT "${_env}")
  set(_props_text "${_env_text}")
  foreach(p TIMEOUT PROCESSORS SKIP_RETURN_CODE)
    if(T_${p})
      list(APPEND _props ${p} ${T_${p}})
      string(APPEND _props_text " ${p} ${T_${p}}")
    endif()
  endforeach()
  if(T_RUN_SERIAL)
    list(APPEND _props RUN_SERIAL TRUE)
    string(APPEND _props_text " RUN_SERIAL TRUE")
  endif()

  if(kind STREQUAL "GTEST")
    add_executable(${name} ${T_SOURCES})
    fsdp_program(${name} TEST)
    target_link_libraries(${name} PRIVATE ${T_LIBS} GTest::gtest GTest::gtest_main)
    target_include_directories(${name} PRIVATE ${PROJECT_SOURCE_DIR}/tests)
    if(FSDP_UNITY)
      # Test files share their precompiled header's 3.5 s load and their instantiations: 8 to
      # a file (4 took 44 s more CPU time in a cold build: test_runtime 66 s -> 39 s).
      set_target_properties(${name} PROPERTIES UNITY_BUILD ON UNITY_BUILD_BATCH_SIZE 8)
    endif()
    # One ctest entry per test suite, listed by ctest from the binary when it is newer than the
    # list (FsdpGtestSuites.cmake says why per suite, and why not at build time).
    set(_base ${CMAKE_CURRENT_BINARY_DIR}/${name})
    file(GENERATE OUTPUT ${_base}_properties.txt CONTENT "${_props_text}")
    set(_list_script ${PROJECT_SOURCE_DIR}/cmake/FsdpGtestSuites.cmake)
    set(_runner ${PROJECT_SOURCE_DIR}/cmake/run_gtest_suite.sh)
    string(CONFIGURE [==[
set(_fsdp_bin [=[$<TARGET_FILE:@name@>]=])
set(_fsdp_list [=[@_base@_suites.cmake]=])
set(_fsdp_props [=[@_base@_properties.txt]=])
set(_fsdp_args -D "TEST_BINARY=${_fsdp_bin}" -D "PROPERTIES_FILE=${_fsdp_props}"
    -D [=[RUNNER=@_runner@]=] -D "OUTPUT=${_fsdp_list}" -P [=[@_list_script@]=])
if(NOT EXISTS "${_fsdp_bin}")
  add_test([=[@name@_NOT_BUILT]=] [=[@name@_NOT_BUILT]=])
else()
  if(NOT EXISTS "${_fsdp_list}" OR "${_fsdp_bin}" IS_NEWER_THAN "${_fsdp_list}"
     OR "${_fsdp_props}" IS_NEWER_THAN "${_fsdp_list}")
    execute_process(COMMAND [=[@CMAKE_COMMAND@]=] ${_fsdp_args} OUTPUT_QUIET ERROR_QUIET)
  endif()
  if(EXISTS "${_fsdp_list}")
    include("${_fsdp_list}")
  else()
    # The listing failed: an entry that runs it again, so that its error is seen and fails.
    add_test([=[@name@_NOT_LISTED]=] [=[@CMAKE_COMMAND@]=] ${_fsdp_args})
  endif()
endif()
]==] _include @ONLY)
    file(GENERATE OUTPUT ${_base}_include.cmake CONTENT "${_include}")
    set_property(DIRECTORY APPEND PROPERTY TEST_INCLUDE_FILES ${_base}_include.cmake)
  elseif(kind STREQUAL "MPI" OR kind STREQUAL "LAUNCH")
    foreach(np ${T_NP})
      if(kind STREQUAL "MPI")
        set(_launcher ${MPIEXEC_EXECUTABLE} ${FSDP_MPIEXEC_FLAGS} -n ${np})
      else()
        set(_launcher ${PROJECT_SOURCE_DIR}/scripts/launch.sh --nproc ${np})
      endif()
      add_test(NAME ${name}_np${np} COMMAND ${_launcher} $<TARGET_FILE:${T_TARGET}> ${T_ARGS})
      set_tests_properties(${name}_np${np} PROPERTIES ${_props})
    endforeach()
  elseif(kind STREQUAL "COMMAND")
    add_test(NAME ${name} COMMAND ${T_COMMAND})
    set_tests_properties(${name} PROPERTIES ${_props})
  else()
    message(FATAL_ERROR "fsdp_add_test(${name}): unknown kind ${kind}")
  endif()
endfunction()

# fsdp_test_program(<target> <src>... [LIBS <lib>...]): a test binary with its own main (run
# by fsdp_add_test's MPI, LAUNCH or COMMAND kinds), with GoogleTest.
function(fsdp_test_program target)
  cmake_parse_arguments(P "" "" "LIBS" ${ARGN})
  add_executable(${target} ${P_UNPARSED_ARGUMENTS})
  fsdp_program(${target} TEST)
  target_link_libraries(${target} PRIVATE ${P_LIBS})
  target_include_directories(${target} PRIVATE ${PROJECT_SOURCE_DIR}/tests)
endfunction()
