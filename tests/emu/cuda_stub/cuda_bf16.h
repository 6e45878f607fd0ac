#pragma once
// Stub of cuda_bf16.h (tests/emu/README.md): the bf16 pieces kvfuse's kernels use, rounding with kvfuse's RNE.
#include "kvfuse/core/dtype.hpp"

struct __nv_bfloat16 {
  unsigned short bits;
};
struct __nv_bfloat162 {
  __nv_bfloat16 x, y;
};
inline __nv_bfloat162 __floats2bfloat162_rn(float lo, float hi) {
  return {{kvfuse::to_bf16(lo).bits}, {kvfuse::to_bf16(hi).bits}};
}
inline unsigned short __bfloat16_as_ushort(__nv_bfloat16 h) { return h.bits; }
