#pragma once
// Rotary position embedding (RoPE) math shared by the CPU reference backend and the CUDA kernels
// (apply, inverse, and the position shift the fusion loop uses to move cached K to new positions).
//
// RoPE rotates pairs (a, b) of a head vector by an angle that grows linearly with the token position:
//   pair i of a head of dimension d is rotated by angle(p, i) = position_scale · p · θ_i,
//   θ_i = base^(−2i/d) / freq_factor_i,   i = 0 .. d/2 − 1,
//   (a, b) -> (a cos φ − b sin φ,  a sin φ + b cos φ).
// Two conventions choose which elements form pair i:
//   RopePairing::interleaved  (x[2i], x[2i+1]) — llama.cpp LLAMA_ROPE_TYPE_NORM. GGUF Llama models use it:
//                             the HF→GGUF converter permutes the rows of W_q and W_k so that the adjacent
//                             pairing on GGUF weights equals the half-split pairing on the HF weights.
//   RopePairing::half_split   (x[i], x[i + d/2]) — "neox" / Hugging Face rotate_half (LLAMA_ROPE_TYPE_NEOX).
// position_scale is 1 / factor of linear RoPE scaling (llama.cpp freq_scale); freq_factors are the optional
// per-pair divisors of the θ_i (GGUF tensor rope_freqs.weight, which Llama 3.1 uses for its long-context
// frequency scaling); pass nullptr for none.
//
// Rotations compose: R(φ1) R(φ2) = R(φ1 + φ2) and R(−φ) = R(φ)⁻¹. So K rotated at position p and then
// rotated by Δ·θ_i equals K rotated at p + Δ: a cached chunk moves to new positions with ONE rotation
// by Δ = new − old (rope_shift), without undoing the old rotation first.
//
// Precision: θ_i, the angle position · θ_i and its cos / sin are evaluated in double and rounded to float
// once; the rotation itself runs in float. llama.cpp evaluates the angle in float (θ_i by repeated float
// multiplication), which loses ~|angle| · 2^-24 radians at large positions (5e-4 rad at position 8192 for
// θ_0 = 1); the double angle makes apply(p + Δ) and apply(p) followed by shift(Δ) agree to float rounding
// of the rotation alone, at any position.
//
// Everything here is KVFUSE_HOST_DEVICE, fmt-free and allocation-free (pointer + sizes), so a CUDA kernel
// runs the very functions the CPU backend and the tests run. Callers validate their inputs (head_dim even
// and >= 2, base > 0); these functions do not check.

#include <cmath>
#include <cstdint>

#include "kvfuse/core/config.hpp"

namespace kvfuse::detail {

enum class RopePairing : int {
  interleaved = 0,  // (x[2i], x[2i+1]), llama.cpp LLAMA_ROPE_TYPE_NORM (GGUF Llama)
  half_split = 1,   // (x[i], x[i + d/2]), "neox" / HF rotate_half
};

struct RopeParams {
  std::int64_t head_dim = 0;            // d: rotated dimensions of a head (even)
  double base = 10000.0;                // frequency base (GGUF {arch}.rope.freq_base)
  double position_scale = 1.0;          // linear scaling: 1 / rope.scaling.factor
  const float* freq_factors = nullptr;  // d/2 divisors of θ_i (rope_freqs.weight), or nullptr
  RopePairing pairing = RopePairing::interleaved;
};

// θ_i = base^(−2i/d) / freq_factor_i, in double.
KVFUSE_HOST_DEVICE double rope_theta(const RopeParams& p, std::int64_t i) {
  const double theta = std::pow(p.base, -2.0 * static_cast<double>(i) / static_cast<double>(p.head_dim));
  return p.freq_factors != nullptr ? theta / static_cast<double>(p.freq_factors[i]) : theta;
}

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

// (a, b) -> (a cos − b sin, a sin + b cos): rotation of one pair by the angle whose cos / sin are given.
KVFUSE_HOST_DEVICE void rope_rotate_pair(float& a, float& b, float cos_phi, float sin_phi) {
  const float x = a;
  const float y = b;
  a = x * cos_phi - y * sin_phi;
  b = x * sin_phi + y * cos_phi;
}

// cos / sin of the angle position_scale · position · θ_i of each pair i (d/2 entries each), rounded from
// double. `position` may be negative (an inverse rotation) or a position difference (a shift).
KVFUSE_HOST_DEVICE void rope_cos_sin(const RopeParams& p, double position, float* cos_out, float* sin_out) {
  const std::int64_t pairs = p.head_dim / 2;
  for (std::int64_t i = 0; i < pairs; ++i) {
    const double angle = p.position_scale * position * rope_theta(p, i);
    cos_out[i] = static_cast<float>(std::cos(angle));
    sin_out[i] = static_cast<float>(std::sin(angle));
  }
}

// Rotates every pair of the head vector x (head_dim floats) by the angles whose cos / sin are given
// (d/2 entries each, from rope_cos_sin): the form the CPU backend uses, one table per position for all heads.
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

// Rotates the head vector x by position · θ_i per pair, computing each angle on the fly (no table).
KVFUSE_HOST_DEVICE void rope_rotate(float* x, const RopeParams& p, double position) {
  const std::int64_t pairs = p.head_dim / 2;
  for (std::int64_t i = 0; i < pairs; ++i) {
    const double angle = p.position_scale * position * rope_theta(p, i);
    std::int64_t first = 0;
    std::int64_t second = 0;
    rope_pair(p.pairing, p.head_dim, i, first, second);
    rope_rotate_pair(x[first], x[second], static_cast<float>(std::cos(angle)), static_cast<float>(std::sin(angle)));
  }
}

// RoPE of a head vector at `position` (what a Q or K projection gets before attention).
KVFUSE_HOST_DEVICE void rope_apply(float* x, const RopeParams& p, std::int64_t position) {
  rope_rotate(x, p, static_cast<double>(position));
}

// Undoes rope_apply(x, p, position).
KVFUSE_HOST_DEVICE void rope_inverse(float* x, const RopeParams& p, std::int64_t position) {
  rope_rotate(x, p, -static_cast<double>(position));
}

// Moves a head vector rotated at position `from` to position `to` with one rotation by Δ = to − from.
KVFUSE_HOST_DEVICE void rope_shift(float* x, const RopeParams& p, std::int64_t from, std::int64_t to) {
  rope_rotate(x, p, static_cast<double>(to - from));
}

// ---------------------------------------------------------------------------------------------------
// fp32-angle RoPE: the element math of the CUDA kernels (kernels/include/kvfuse/cuda/rope.cuh) and of
// their CPU references (include/kvfuse/ref/rope.hpp). The functions above keep double angles for the CPU
// Llama backend; these evaluate everything in float, yet stay accurate at any position below 2^24:
//
//   θ_f    the frequency θ_i rounded to float ONCE on the host (ref::rope_frequencies), the value an
//          engine's inv_freq buffer holds;
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
