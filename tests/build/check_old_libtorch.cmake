# ctest's configure_rejects_old_libtorch: configures the project against a stand-in libtorch that
# reports version 1.13.1 and expects the configure to fail with a message naming the version
# found, the version supported and the command that installs it.
#   cmake -DSOURCE_DIR=... -DWORK_DIR=... -P check_old_libtorch.cmake
file(REMOVE_RECURSE ${WORK_DIR})
file(WRITE ${WORK_DIR}/torch/TorchConfig.cmake "set(Torch_FOUND TRUE)\n")
file(WRITE ${WORK_DIR}/torch/TorchConfigVersion.cmake
     "set(PACKAGE_VERSION \"1.13.1\")\nset(PACKAGE_VERSION_COMPATIBLE TRUE)\n")
execute_process(COMMAND ${CMAKE_COMMAND} -S ${SOURCE_DIR} -B ${WORK_DIR}/build
                        -DTorch_DIR=${WORK_DIR}/torch -DFSDP_BUILD_TESTS=OFF
                RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE out)
string(REGEX REPLACE "[ \n]+" " " flat "${out}")
if(rc EQUAL 0)
  message(FATAL_ERROR "configure succeeded against libtorch 1.13.1:\n${out}")
endif()
foreach(needle "libtorch 1.13.1 found" "supports libtorch 2.11" "scripts/install_deps.sh")
  string(FIND "${flat}" "${needle}" at)
  if(at EQUAL -1)
    message(FATAL_ERROR "the configure error does not say '${needle}':\n${out}")
  endif()
endforeach()
message(STATUS "configure failed as expected")
