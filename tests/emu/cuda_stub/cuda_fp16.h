#pragma once
// Stub of cuda_fp16.h (tests/emu/README.md): the fp16 pieces kvfuse's kernels use, rounding with kvfuse's RNE.
#include "cuda_runtime.h"
#include "kvfuse/core/dtype.hpp"

struct __half {
  unsigned short bits;
};
struct __half2 {
  __half x, y;
};
inline __half2 __floats2half2_rn(float lo, float hi) { return {{kvfuse::to_f16(lo).bits}, {kvfuse::to_f16(hi).bits}}; }
inline unsigned short __half_as_ushort(__half h) { return h.bits; }
inline __half __ushort_as_half(unsigned short u) { return {u}; }
inline float __half2float(__half h) { return kvfuse::to_float(kvfuse::f16{h.bits}); }
inline __half2 __halves2half2(__half lo, __half hi) { return {lo, hi}; }
inline float2 __half22float2(__half2 h) { return {__half2float(h.x), __half2float(h.y)}; }
