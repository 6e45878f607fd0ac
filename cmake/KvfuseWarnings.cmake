# kvfuse_project_options(<target>): warnings (and ASan + UBSan when KVFUSE_SANITIZE) for kvfuse's own
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
endfunction()

# kvfuse_tsan_options(<target>): ThreadSanitizer at -O1 with line tables (KVFUSE_TSAN: kvfuse-store-tests and the copy
# of the CPU engine it links; every other target of the build stays as it is).
function(kvfuse_tsan_options target)
  target_compile_options(${target} PRIVATE $<$<COMPILE_LANGUAGE:CXX>:-fsanitize=thread -fno-omit-frame-pointer -O1 -g1>)
  target_link_options(${target} PRIVATE -fsanitize=thread)
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

# kvfuse_bench_options(<target>): a host benchmark. With KVFUSE_BENCH_CHECK_ONLY (the ci preset) it is compiled at -O0
# only to check that it builds, and refuses to run (kvfuse/harness/bench_build.hpp); the bench preset builds it to
# measure. (The CUDA benchmarks' host code is compiled at -O0 there too: their timings are the device's, which nvcc
# optimizes either way, and scripts/bench_kernels.sh builds its own.)
function(kvfuse_bench_options target)
  kvfuse_project_options(${target})
  if(KVFUSE_BENCH_CHECK_ONLY)
    target_compile_options(${target} PRIVATE $<$<COMPILE_LANGUAGE:CXX>:-O0>)
    target_compile_definitions(${target} PRIVATE KVFUSE_BENCH_CHECK_ONLY)
  endif()
endfunction()

# kvfuse's own test binaries build at -O2 where the build is optimized at -O3 (Release): GCC took 28 % less time on
# a file that includes the CPU engine (examples/kvfuse_logits.cpp: 33 s against 46 s, 2026-11-27), which is most of
# these binaries' compile time in CI. What users run (examples, apps, measuring benchmarks) stays at -O3. Not -O1:
# the largest unity file compiled in 75 s instead of 108 s, but the real-model tests ran 2.5-3.7 times as long (the
# pipeline, selection and store code they run is compiled there; measured 2026-11-28). tests/ applies it to the
# directory; the tests beside an application or integration (server units, llama.cpp) to their targets.
set(KVFUSE_TEST_OPTIMIZATION "$<$<AND:$<CONFIG:Release>,$<COMPILE_LANGUAGE:CXX>>:-O2>")
