include(CMakePackageConfigHelpers)

set(KVFUSE_CMAKE_DIR ${CMAKE_INSTALL_LIBDIR}/cmake/kvfuse)
set(_kvfuse_targets kvfuse)
if(KVFUSE_CPU_BACKEND)
  list(APPEND _kvfuse_targets kvfuse_cpu)
endif()
if(KVFUSE_CUDA)
  list(APPEND _kvfuse_targets kvfuse_cuda)
endif()
if(KVFUSE_REDIS)
  list(APPEND _kvfuse_targets kvfuse_redis)
endif()
if(KVFUSE_CODECS)
  list(APPEND _kvfuse_targets kvfuse_codecs)
endif()

install(TARGETS ${_kvfuse_targets} EXPORT kvfuseTargets)
install(DIRECTORY include/kvfuse DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
if(KVFUSE_CUDA)
  install(DIRECTORY kernels/include/kvfuse DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
endif()

install(EXPORT kvfuseTargets NAMESPACE kvfuse:: DESTINATION ${KVFUSE_CMAKE_DIR})
# Build-tree export: find_package(kvfuse) works against the build directory too.
export(EXPORT kvfuseTargets NAMESPACE kvfuse:: FILE ${PROJECT_BINARY_DIR}/kvfuseTargets.cmake)

set(KVFUSE_HAS_CUDA ${KVFUSE_CUDA})
set(KVFUSE_HAS_CPU ${KVFUSE_CPU_BACKEND})
set(KVFUSE_HAS_REDIS ${KVFUSE_REDIS})
set(KVFUSE_HAS_CODECS ${KVFUSE_CODECS})
configure_package_config_file(cmake/kvfuseConfig.cmake.in
  ${PROJECT_BINARY_DIR}/kvfuseConfig.cmake INSTALL_DESTINATION ${KVFUSE_CMAKE_DIR})
write_basic_package_version_file(${PROJECT_BINARY_DIR}/kvfuseConfigVersion.cmake
  COMPATIBILITY SameMinorVersion ARCH_INDEPENDENT)
install(FILES ${PROJECT_BINARY_DIR}/kvfuseConfig.cmake ${PROJECT_BINARY_DIR}/kvfuseConfigVersion.cmake
  DESTINATION ${KVFUSE_CMAKE_DIR})
