#pragma once
// Storage element types of K, V, Q and O tensors that the CUDA kernels and their CPU references read and
// write: fp32, fp16 (IEEE binary16) and bf16 (bfloat16). Kernels load a storage element, compute in fp32
// and round back once; the conversions below are that rounding (round to nearest, ties to even), written
// once as KVFUSE_HOST_DEVICE functions so a CPU reference rounds bit for bit as the kernel does.
//
// `bf16` and `f16` are two-byte wrappers of the bit pattern, layout-compatible with CUDA's __nv_bfloat16 and
// __half, so host code needs no CUDA header to fill a tensor a kernel will read. fmt-free: kernels include it.

#include <cstdint>
#include <cstring>

#include "kvfuse/core/config.hpp"

namespace kvfuse {

enum class DType : int { f32 = 0, f16 = 1, bf16 = 2 };

struct bf16 {
  std::uint16_t bits = 0;
};
struct f16 {
  std::uint16_t bits = 0;
};
static_assert(sizeof(bf16) == 2 && sizeof(f16) == 2);

// Bytes of one element.
KVFUSE_HOST_DEVICE int dtype_size(DType t) { return t == DType::f32 ? 4 : 2; }

// "f32", "f16", "bf16", or "unknown dtype" for a value outside the enum.
KVFUSE_HOST_DEVICE const char* dtype_name(DType t) {
  switch (t) {
    case DType::f32: return "f32";
    case DType::f16: return "f16";
    case DType::bf16: return "bf16";
  }
  return "unknown dtype";
}

namespace detail {

KVFUSE_HOST_DEVICE std::uint32_t float_bits(float f) {
#if defined(__CUDA_ARCH__)
  return __float_as_uint(f);
#else
  std::uint32_t u = 0;
  std::memcpy(&u, &f, sizeof u);
  return u;
#endif
}

KVFUSE_HOST_DEVICE float bits_float(std::uint32_t u) {
#if defined(__CUDA_ARCH__)
  return __uint_as_float(u);
#else
  float f = 0;
  std::memcpy(&f, &u, sizeof f);
  return f;
#endif
}

template <class T>
inline constexpr bool is_bf16 = false;
template <>
inline constexpr bool is_bf16<bf16> = true;

}  // namespace detail

// bf16 -> fp32 is exact: the bf16 bits are the top half of the float.
KVFUSE_HOST_DEVICE float to_float(bf16 v) { return detail::bits_float(static_cast<std::uint32_t>(v.bits) << 16); }

// fp32 -> bf16, round to nearest even; NaN stays a (quiet) NaN, overflow becomes ±inf.
KVFUSE_HOST_DEVICE bf16 to_bf16(float f) {
  const std::uint32_t x = detail::float_bits(f);
  if ((x & 0x7fffffffu) > 0x7f800000u) return bf16{static_cast<std::uint16_t>((x >> 16) | 0x40u)};
  const std::uint32_t lsb = (x >> 16) & 1u;
  return bf16{static_cast<std::uint16_t>((x + 0x7fffu + lsb) >> 16)};
}

// fp16 -> fp32 is exact (subnormal halves become normal floats).
KVFUSE_HOST_DEVICE float to_float(f16 v) {
  const std::uint32_t h = v.bits;
  const std::uint32_t sign = (h & 0x8000u) << 16;
  const std::uint32_t exponent = (h >> 10) & 0x1fu;
  const std::uint32_t mantissa = h & 0x3ffu;
  if (exponent == 0) {
    const float magnitude = static_cast<float>(mantissa) * 5.9604644775390625e-8f;  // mantissa * 2^-24, exact
    return sign != 0 ? -magnitude : magnitude;
  }
  if (exponent == 31) return detail::bits_float(sign | 0x7f800000u | (mantissa << 13));
  return detail::bits_float(sign | ((exponent + 112u) << 23) | (mantissa << 13));
}

// fp32 -> fp16, round to nearest even, with subnormal halves; |f| >= 65520 becomes ±inf, NaN a quiet NaN.
KVFUSE_HOST_DEVICE f16 to_f16(float f) {
  const std::uint32_t x = detail::float_bits(f);
  const auto sign = static_cast<std::uint16_t>((x >> 16) & 0x8000u);
  const std::uint32_t mag = x & 0x7fffffffu;
  if (mag > 0x7f800000u) return f16{static_cast<std::uint16_t>(sign | 0x7e00u)};
  if (mag >= 0x477ff000u) return f16{static_cast<std::uint16_t>(sign | 0x7c00u)};  // >= 65520: inf
  if (mag < 0x38800000u) {                                                            // below 2^-14: subnormal
    if (mag <= 0x33000000u) return f16{sign};                                         // <= 2^-25 rounds to 0
    const std::uint32_t exponent = mag >> 23;
    const std::uint32_t mantissa = (mag & 0x7fffffu) | 0x800000u;
    const std::uint32_t shift = 126u - exponent;  // value = mantissa * 2^(exponent-150) = h * 2^-24
    std::uint32_t h = mantissa >> shift;
    const std::uint32_t rem = mantissa & ((1u << shift) - 1u);
    const std::uint32_t half = 1u << (shift - 1u);
    if (rem > half || (rem == half && (h & 1u) != 0)) ++h;
    return f16{static_cast<std::uint16_t>(sign | h)};
  }
  std::uint32_t h = (mag >> 13) - (112u << 10);  // rebias the exponent from 127 to 15
  const std::uint32_t rem = mag & 0x1fffu;
  if (rem > 0x1000u || (rem == 0x1000u && (h & 1u) != 0)) ++h;
  return f16{static_cast<std::uint16_t>(sign | h)};
}

KVFUSE_HOST_DEVICE float to_float(float v) { return v; }

// Rounds an fp32 value to storage type T (float, f16 or bf16).
template <class T>
KVFUSE_HOST_DEVICE T from_float(float v) {
  if constexpr (sizeof(T) == 4) {
    return v;
  } else if constexpr (detail::is_bf16<T>) {
    return to_bf16(v);
  } else {
    return to_f16(v);
  }
}

// The value an fp32 number has after rounding to `t` and back (what storing it as `t` keeps).
KVFUSE_HOST_DEVICE float round_to(DType t, float v) {
  switch (t) {
    case DType::f16: return to_float(to_f16(v));
    case DType::bf16: return to_float(to_bf16(v));
    case DType::f32: break;
  }
  return v;
}

}  // namespace kvfuse
