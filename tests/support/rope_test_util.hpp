#pragma once
// Helpers the RoPE tests share: the CPU test of the references (tests/unit/rope_kernels_ref.cpp, doctest)
// and the GPU test of the kernels (tests/gpu/rope.cu, nvcc). Plain C++: no doctest, no CUDA.

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include "kvfuse/core/dtype.hpp"
#include "kvfuse/harness/ref/rope.hpp"

namespace kvfuse::test {

// A 16-byte aligned host buffer (the references check alignment as the launchers do) whose bytes all
// start as `fill`, so writes outside a view show up.
class AlignedBuffer {
 public:
  AlignedBuffer(std::size_t bytes, std::uint8_t fill) : bytes_(bytes), words_(bytes / 8 + 4) {
    std::memset(words_.data(), fill, words_.size() * 8);
    offset_ = (16 - reinterpret_cast<std::uintptr_t>(words_.data()) % 16) % 16;
  }
  void* data() { return reinterpret_cast<std::uint8_t*>(words_.data()) + offset_; }
  const std::uint8_t* bytes() const { return reinterpret_cast<const std::uint8_t*>(words_.data()) + offset_; }
  std::size_t size() const { return bytes_; }

 private:
  std::size_t bytes_;
  std::vector<std::uint64_t> words_;
  std::size_t offset_ = 0;
};

// Element i of a tensor of storage type t, widened exactly.
inline double load(DType t, const void* base, std::int64_t i) {
  switch (t) {
    case DType::f32: return static_cast<const float*>(base)[i];
    case DType::f16: return kvfuse::to_float(static_cast<const kvfuse::f16*>(base)[i]);
    case DType::bf16: return kvfuse::to_float(static_cast<const kvfuse::bf16*>(base)[i]);
  }
  return NAN;
}

// Stores v into element i, rounded to nearest even.
inline void store(DType t, void* base, std::int64_t i, float v) {
  switch (t) {
    case DType::f32: static_cast<float*>(base)[i] = v; break;
    case DType::f16: static_cast<kvfuse::f16*>(base)[i] = kvfuse::to_f16(v); break;
    case DType::bf16: static_cast<kvfuse::bf16*>(base)[i] = kvfuse::to_bf16(v); break;
  }
}

// Spacing of storage values of type t at magnitude |v| (normal range; the subnormal spacing below it).
inline double storage_ulp(DType t, double v) {
  const int mantissa_bits = t == DType::f32 ? 23 : (t == DType::f16 ? 10 : 7);
  const int min_exponent = t == DType::f32 ? -126 : (t == DType::f16 ? -14 : -126);
  const int e = v == 0 ? min_exponent : std::max(min_exponent, std::ilogb(std::fabs(v)));
  return std::ldexp(1.0, e - mantissa_bits);
}

enum class Layout { nhd, hnd };

// Strides of `layout` with one 16-byte vector of padding after each token row (NHD) or head plane (HND)
// and after each layer, so writes outside the view show up in the padding.
inline RopeStrides padded_strides(Layout layout, DType t, std::int64_t n, std::int64_t h, std::int64_t d) {
  const std::int64_t pad = 16 / kvfuse::dtype_size(t);
  if (layout == Layout::nhd) {
    const std::int64_t token = h * d + pad;
    return {token, d, n * token + pad};
  }
  const std::int64_t head = n * d + pad;
  return {d, head, h * head + pad};
}

// Element offset of head h of token t in layer l.
inline std::int64_t offset(const RopeStrides& s, std::int64_t l, std::int64_t t, std::int64_t h) {
  return l * s.layer + t * s.token + h * s.head;
}

// The CPU reference of `op`.
inline Status run_ref(RopeOp op, const RopeArgs& a) {
  switch (op) {
    case RopeOp::apply: return kvfuse::ref::rope_apply(a);
    case RopeOp::inverse: return kvfuse::ref::rope_inverse(a);
    case RopeOp::shift: return kvfuse::ref::rope_shift(a);
  }
  return Status::unsupported;
}

}  // namespace kvfuse::test
