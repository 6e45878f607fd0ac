#pragma once
// RoPE element math (the rotation of core/rope.hpp's pairs by p · θ_i), shared by the CPU Llama backend
// (backend/cpu/llama.hpp), the CUDA kernels (kernels/include/kvfuse/cuda/rope.cuh) and their CPU
// references (kernel_args/rope.hpp). θ_i always comes from the one table, kvfuse::rope_frequencies (core/rope.hpp).
//
// Rotations compose: R(φ1) R(φ2) = R(φ1 + φ2) and R(−φ) = R(φ)⁻¹. So K rotated at position p and then
// rotated by Δ·θ_i equals K rotated at p + Δ: a cached chunk moves to new positions with ONE rotation
// by Δ = new − old (CacheBlend App. A, positional recovery; CpuLlama::rope_shift, ref::rope_shift,
// cuda::rope_shift), without undoing the old rotation first. A negative multiplier is the inverse.
//
// Every caller pairs elements with rope_pair. The angle and the rotation come in two precisions, one per
// consumer; nothing else differs:
//   CPU backend  rope_cos_sin: θ_i in double (rope_frequencies' double output), the angle p · θ_i and its
//                cos / sin in double, rounded to float once; rope_rotate_head / rope_rotate_pair rotate in
//                float. Why double (the one deliberate difference): llama.cpp conformance and shift
//                exactness. The backend's logits are what the llama.cpp / numpy conformance data and the
//                independent double-precision forward are checked against, and with the double angle
//                rope_shift(p → p + Δ) equals RoPE at p + Δ to the float rounding of the rotation alone, at
//                any position. (llama.cpp forms the angle in float, θ_i by repeated float multiplication:
//                off by ~|p·θ_i| · 2^-24 rad, a few 1e-4 rad at position 6000.)
//   kernels      rope_cos_sin_f32 / rope_rotate_pair_f32 (below): everything in float, θ_i rounded to float
//                once, the product p · θ exact as hi + lo, explicit fmas, so the host references and the
//                device kernels agree bit for bit (up to sinf / cosf versus the device sincosf).
//
// Everything here is KVFUSE_HOST_DEVICE, fmt-free and allocation-free (pointer + sizes), so a CUDA kernel
// runs the very functions the CPU backend and the tests run. Callers validate their inputs (head_dim even
// and >= 2, θ from rope_frequencies); these functions do not check.

#include <cmath>
#include <cstdint>

#include "kvfuse/core/config.hpp"
#include "kvfuse/core/rope.hpp"

namespace kvfuse::detail {

// Element indices (first, second) of pair i.
KVFUSE_HOST_DEVICE void rope_pair(RopePairing pairing, std::int64_t head_dim, std::int64_t i, std::int64_t& first,
                                  std::int64_t& second) {
  if (pairing == RopePairing::interleaved) {
    first = 2 * i;
    second = 2 * i + 1;
  } else {
    first = i;
    second = i + head_dim / 2;
  }
}

// ---------------------------------------------------------------------------------------------------
// Double-angle RoPE: the CPU backend's (see the top of this header for why double).

// (a, b) -> (a cos − b sin, a sin + b cos) in float: rotation of one pair by the angle whose cos / sin are
// given.
KVFUSE_HOST_DEVICE void rope_rotate_pair(float& a, float& b, float cos_phi, float sin_phi) {
  const float x = a;
  const float y = b;
  a = x * cos_phi - y * sin_phi;
  b = x * sin_phi + y * cos_phi;
}

// cos / sin of the angle position · θ_i of each pair i (`pairs` entries each): θ_i from
// rope_frequencies(config, double*), the product and cos / sin in double, rounded to float once.
// `position` may be negative (an inverse rotation) or a position difference Δ (a shift).
KVFUSE_HOST_DEVICE void rope_cos_sin(const double* theta, std::int64_t pairs, double position, float* cos_out,
                                     float* sin_out) {
  for (std::int64_t i = 0; i < pairs; ++i) {
    const double angle = position * theta[i];
    cos_out[i] = static_cast<float>(std::cos(angle));
    sin_out[i] = static_cast<float>(std::sin(angle));
  }
}

// Rotates every pair of the head vector x (head_dim floats) by the angles whose cos / sin are given
// (head_dim / 2 entries each, from rope_cos_sin): one table per position serves every head.
KVFUSE_HOST_DEVICE void rope_rotate_head(float* x, std::int64_t head_dim, RopePairing pairing, const float* cos_phi,
                                         const float* sin_phi) {
  const std::int64_t pairs = head_dim / 2;
  for (std::int64_t i = 0; i < pairs; ++i) {
    std::int64_t first = 0;
    std::int64_t second = 0;
    rope_pair(pairing, head_dim, i, first, second);
    rope_rotate_pair(x[first], x[second], cos_phi[i], sin_phi[i]);
  }
}

// ---------------------------------------------------------------------------------------------------
// fp32-angle RoPE: the element math of the CUDA kernels (kernels/include/kvfuse/cuda/rope.cuh) and of
// their CPU references (kvfuse::ref, the test harness). The functions above keep double angles for the CPU
// Llama backend; these evaluate everything in float, yet stay accurate at any position below 2^24:
//
//   θ_f    the frequency θ_i of rope_frequencies rounded to float ONCE on the host (its float overload,
//          kernel_args/rope.hpp), the value an engine's inv_freq buffer holds;
//   p·θ_f  evaluated exactly as hi + lo: p is an integer with |p| < 2^24, exact in float, and
//          lo = fma(p, θ_f, −hi) is the exact rounding error of hi = p·θ_f;
//   reduction mod 2π by Cody–Waite with 2π = C1 + C2: k = rint(hi / 2π), hi − k·C1 is exact (fma, and
//          the difference fits in 24 bits), so r = (hi − k·C1 − k·C2) + lo is p·θ_f mod 2π within
//          ~2.4e-7 rad for every |p| < 2^24 (a naive float(p)·θ_f at p = 131072 is off by up to 0.008 rad);
//   sin / cos of |r| ≲ π in float: sincosf on the device (≤ 2 ulp, not __sincosf), sinf / cosf on the host.
//
// So rotating by p·θ_f and then by Δ·θ_f equals rotating by (p + Δ)·θ_f to float rounding at 128K tokens,
// and the inverse (angle −p) is exactly the transposed rotation: the reduction is odd in p.
// The rotation itself uses explicit fmas, so host and device round it identically; only sinf / cosf
// versus the device sincosf may differ by an ulp.

// Largest |position| (and |new − old| of a shift) for which the float angle above is exact: 2^24 − 1.
inline constexpr std::int32_t rope_max_position = (1 << 24) - 1;

namespace rope_f32 {

KVFUSE_HOST_DEVICE float fma(float a, float b, float c) {
#if defined(__CUDA_ARCH__)
  return fmaf(a, b, c);
#else
  return std::fma(a, b, c);
#endif
}

KVFUSE_HOST_DEVICE float rint(float x) {
#if defined(__CUDA_ARCH__)
  return rintf(x);
#else
  return std::rint(x);
#endif
}

}  // namespace rope_f32

// cos / sin of the angle position · theta (theta a float frequency θ_f), with the exact product and the
// Cody–Waite reduction described above. |position| <= rope_max_position.
KVFUSE_HOST_DEVICE void rope_cos_sin_f32(std::int32_t position, float theta, float& cos_out, float& sin_out) {
  constexpr float two_pi_hi = 6.28318548202514648438f;       // float(2π)
  constexpr float two_pi_lo = -1.74845553146951715e-07f;     // float(2π − float(2π))
  constexpr float inv_two_pi = 0.159154943091895335769f;     // float(1 / 2π)
  const float p = static_cast<float>(position);
  const float hi = p * theta;
  const float lo = rope_f32::fma(p, theta, -hi);
  const float k = rope_f32::rint(hi * inv_two_pi);
  const float r = rope_f32::fma(-k, two_pi_lo, rope_f32::fma(-k, two_pi_hi, hi)) + lo;
#if defined(__CUDA_ARCH__)
  sincosf(r, &sin_out, &cos_out);
#else
  cos_out = std::cos(r);
  sin_out = std::sin(r);
#endif
}

// (a, b) -> (a cos − b sin, a sin + b cos) with explicit fmas: the same float result on host and device
// whatever the compiler's contraction setting.
KVFUSE_HOST_DEVICE void rope_rotate_pair_f32(float& a, float& b, float cos_phi, float sin_phi) {
  const float x = a;
  const float y = b;
  a = rope_f32::fma(x, cos_phi, -(y * sin_phi));
  b = rope_f32::fma(x, sin_phi, y * cos_phi);
}

}  // namespace kvfuse::detail
