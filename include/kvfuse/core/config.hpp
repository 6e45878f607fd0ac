#pragma once
// Compiler glue shared by host code and CUDA kernels.
//
// KVFUSE_HOST_DEVICE marks element math that the CPU references and the CUDA kernels share: under
// nvcc it is __host__ __device__, elsewhere plain inline, so the same function is tested on the CPU.

#if defined(__CUDACC__)
#define KVFUSE_HOST_DEVICE __host__ __device__ inline
#else
#define KVFUSE_HOST_DEVICE inline
#endif

// KVFUSE_CPU_INLINE marks the out-of-class definitions of the CPU engine (backend/cpu/*_impl.hpp): inline, so the
// engine is header-only, unless KVFUSE_CPU_SEPARATE_COMPILATION is defined; then the headers leave the definitions
// out and one translation unit that includes the *_impl.hpp files compiles them once (src/cpu.cpp).
#if defined(KVFUSE_CPU_SEPARATE_COMPILATION)
#define KVFUSE_CPU_INLINE
#else
#define KVFUSE_CPU_INLINE inline
#endif

// The version of kvfuse, defined here only (CMakeLists.txt and conanfile.py read these lines).
#define KVFUSE_VERSION_MAJOR 0
#define KVFUSE_VERSION_MINOR 1
#define KVFUSE_VERSION_PATCH 0
