# ctest's install_consumer: installs the build into a scratch prefix, then configures, builds
# and runs tests/consumer against that prefix only. Run with -DBUILD_DIR -DSOURCE_DIR -DWORK_DIR.
file(REMOVE_RECURSE ${WORK_DIR})
set(prefix ${WORK_DIR}/prefix)
function(run)
  execute_process(COMMAND ${ARGN} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE out)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "failed (${rc}): ${ARGN}\n${out}")
  endif()
  message(STATUS "${out}")
  set(run_output "${out}" PARENT_SCOPE)
endfunction()
run(${CMAKE_COMMAND} --install ${BUILD_DIR} --prefix ${prefix})
run(${CMAKE_COMMAND} -S ${SOURCE_DIR} -B ${WORK_DIR}/build -DCMAKE_PREFIX_PATH=${prefix})
run(${CMAKE_COMMAND} --build ${WORK_DIR}/build --target consumer)
run(${WORK_DIR}/build/consumer)
# 0.1.0's API: it must build (deprecated, so with warnings) and run. A build without any
# deprecation warning means the aliases lost their [[deprecated]] markers.
run(${CMAKE_COMMAND} --build ${WORK_DIR}/build --target previous_api)
if(NOT run_output MATCHES "deprecated")
  message(FATAL_ERROR "previous_api built without deprecation warnings:\n${run_output}")
endif()
run(${WORK_DIR}/build/previous_api)
