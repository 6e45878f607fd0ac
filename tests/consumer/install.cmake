# cmake -DBUILD_DIR=<kvfuse build tree> -DPREFIX=<dir> [-DCONFIG=<cfg>] -P install.cmake
# A fresh `cmake --install` of kvfuse into PREFIX (the old prefix is removed so no stale header survives).
foreach(var BUILD_DIR PREFIX)
  if(NOT ${var})
    message(FATAL_ERROR "install.cmake: ${var} is not set")
  endif()
endforeach()
file(REMOVE_RECURSE "${PREFIX}")
set(config_args)
if(CONFIG)
  set(config_args --config "${CONFIG}")
endif()
execute_process(COMMAND "${CMAKE_COMMAND}" --install "${BUILD_DIR}" --prefix "${PREFIX}" ${config_args}
                COMMAND_ERROR_IS_FATAL ANY)
