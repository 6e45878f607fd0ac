# kvfuse_project_options(<target>): warnings (and sanitizers when KVFUSE_SANITIZE / KVFUSE_TSAN) for kvfuse's own
# binaries. Never applied to kvfuse::kvfuse itself, so consumers keep their own flags.
function(kvfuse_project_options target)
  target_compile_options(${target} PRIVATE
    $<$<COMPILE_LANGUAGE:CXX>:-Wall -Wextra -Wpedantic -Wshadow>
    $<$<AND:$<COMPILE_LANGUAGE:CXX>,$<BOOL:${KVFUSE_WERROR}>>:-Werror>)
  if(KVFUSE_NATIVE)
    target_compile_options(${target} PRIVATE $<$<COMPILE_LANGUAGE:CXX>:-march=native>)
  endif()
  if(KVFUSE_SANITIZE)
    target_compile_options(${target} PRIVATE
      $<$<COMPILE_LANGUAGE:CXX>:-fsanitize=address,undefined -fno-sanitize-recover=all -fno-omit-frame-pointer>)
    target_link_options(${target} PRIVATE -fsanitize=address,undefined)
  endif()
  if(KVFUSE_TSAN)
    target_compile_options(${target} PRIVATE $<$<COMPILE_LANGUAGE:CXX>:-fsanitize=thread -fno-omit-frame-pointer>)
    target_link_options(${target} PRIVATE -fsanitize=thread)
  endif()
endfunction()

# kvfuse_cuda_options(<target>): kvfuse's own CUDA binaries (GPU tests, kernel benchmarks). Code for sm_90
# plus PTX for later GPUs; nvcc and host-compiler warnings, fatal with KVFUSE_WERROR. CMake 3.25 does not
# know that nvcc 13 speaks C++20, so the standard is passed by hand.
function(kvfuse_cuda_options target)
  set_target_properties(${target} PROPERTIES CUDA_ARCHITECTURES "90-real;90-virtual")
  target_compile_options(${target} PRIVATE
    $<$<COMPILE_LANGUAGE:CUDA>:-std=c++20 -lineinfo -Xcompiler=-Wall,-Wextra>
    $<$<AND:$<COMPILE_LANGUAGE:CUDA>,$<BOOL:${KVFUSE_WERROR}>>:-Werror=all-warnings -Xcompiler=-Werror>)
endfunction()

# kvfuse_unity_groups(<target> <sources...> HEAVY <names...>): compiles a test binary's files as a few unity
# translation units instead of one per file: each file that includes the CPU backend parses it again (with the
# engine compiled once, kvfuse::cpu_compiled, still about 13 s at -O3 on two cores). The files named after HEAVY
# (file names without extension) go into two groups, the rest into a third. Each test file's body is in a namespace
# of its own, so the files do not see each other's helpers. -DKVFUSE_UNITY_TESTS=OFF compiles file by file.
function(kvfuse_unity_groups target)
  cmake_parse_arguments(PARSE_ARGV 1 arg "" "" "HEAVY")
  if(NOT KVFUSE_UNITY_TESTS)
    return()
  endif()
  set_target_properties(${target} PROPERTIES UNITY_BUILD ON UNITY_BUILD_MODE GROUP)
  set(i 0)
  foreach(src IN LISTS arg_UNPARSED_ARGUMENTS)
    get_filename_component(name ${src} NAME_WE)
    if(name IN_LIST arg_HEAVY)
      math(EXPR half "${i} % 2")
      set_source_files_properties(${src} PROPERTIES UNITY_GROUP heavy_${half})
      math(EXPR i "${i} + 1")
    else()
      set_source_files_properties(${src} PROPERTIES UNITY_GROUP light)
    endif()
  endforeach()
endfunction()
