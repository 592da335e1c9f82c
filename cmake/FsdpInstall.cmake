# Install rules and the CMake package: find_package(fsdp) + target_link_libraries(app fsdp::fsdp)
# (and fsdp::models, and fsdp::text where it was built: `if(TARGET fsdp::text)`).
include(GNUInstallDirs)
include(CMakePackageConfigHelpers)

set_target_properties(fsdp PROPERTIES EXPORT_NAME fsdp)
set(_fsdp_installed fsdp fsdp_models)
if(TARGET fsdp_text)
  list(APPEND _fsdp_installed fsdp_text)  # the optional text library (cmake/FsdpText.cmake)
endif()
install(TARGETS ${_fsdp_installed} EXPORT fsdpTargets
        LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR}
        ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR}
        RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
install(DIRECTORY include/fsdp DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})

set(FSDP_CMAKE_DIR ${CMAKE_INSTALL_LIBDIR}/cmake/fsdp)
install(EXPORT fsdpTargets NAMESPACE fsdp:: DESTINATION ${FSDP_CMAKE_DIR})
configure_package_config_file(cmake/fsdpConfig.cmake.in
  ${PROJECT_BINARY_DIR}/fsdpConfig.cmake INSTALL_DESTINATION ${FSDP_CMAKE_DIR})
write_basic_package_version_file(${PROJECT_BINARY_DIR}/fsdpConfigVersion.cmake
  COMPATIBILITY SameMajorVersion)
install(FILES ${PROJECT_BINARY_DIR}/fsdpConfig.cmake ${PROJECT_BINARY_DIR}/fsdpConfigVersion.cmake
        DESTINATION ${FSDP_CMAKE_DIR})
