#pragma once
// dequantize_blocks_cpu: ggml blocks to fp32 on the CPU, bit-identical to ggml's reference dequantizers
// (detail::dequantize_blocks, model/ggml_quant.hpp), with AVX2 versions of the types that hold most of the weights
// of the models kvfuse runs (SmolLM2: Q4_1 and Q8_0; Gemma 3 and Qwen2: Q8_0, Q5_0, Q4_K and Q6_K), chosen at run
// time like the kernels of detail/cpu_kernels.hpp. The other types run the reference.
//
// Same bits: each element is ggml's fp32 arithmetic in ggml's order — Q4_1 q·d + m with the product rounded
// first, Q5_0 (q − 16)·d, Q8_0 q·d, Q4_K (d·sc)·q − dmin·m with the product rounded first, Q6_K (d·sc)·(q − 32) —
// one rounding per operation in 8 lanes. The AVX2 functions are compiled for "avx2" without "fma", so the compiler
// cannot contract a product and a sum into one fused operation; the scales are converted from fp16 by the
// reference's exact conversion and combined in scalar code as the reference combines them.
//
// The Q5_0 and Q8_0 blocks are also read into registers (block_q5_0, block_q8_0) by the fused products of
// backend/cpu/quantized_gemv.hpp: those values are products only, which no compiler contracts into a later FMA.

#include <cstdint>

#include "kvfuse/detail/cpu_kernels.hpp"
#include "kvfuse/model/ggml_quant.hpp"
#include "kvfuse/model/ggml_type.hpp"

namespace kvfuse::detail {

#if KVFUSE_CPU_DISPATCH_AVX2
namespace avx2 {

#define KVFUSE_TARGET_AVX2_NO_FMA __attribute__((target("avx2")))

// The 32 unsigned nibbles of 16 bytes: element j < 16 the low nibble of qs[j], element 16 + j its high nibble
// (ggml's order), as two vectors of 16 bytes.
KVFUSE_TARGET_AVX2_NO_FMA inline void nibbles(const std::uint8_t* qs, __m128i& lo, __m128i& hi) {
  const __m128i bytes = _mm_loadu_si128(reinterpret_cast<const __m128i*>(qs));
  const __m128i mask = _mm_set1_epi8(0x0f);
  lo = _mm_and_si128(bytes, mask);
  hi = _mm_and_si128(_mm_srli_epi16(bytes, 4), mask);
}

// The 8 signed bytes of the low half of `b` as floats (exact).
KVFUSE_TARGET_AVX2_NO_FMA inline __m256 bytes_to_float(__m128i b) { return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(b)); }

// The 32 signed bytes of `q` as floats, 8 per vector in element order.
KVFUSE_TARGET_AVX2_NO_FMA inline void bytes_to_floats(__m256i q, __m256 v[4]) {
  const __m128i q0 = _mm256_castsi256_si128(q);
  const __m128i q1 = _mm256_extracti128_si256(q, 1);
  v[0] = bytes_to_float(q0);
  v[1] = bytes_to_float(_mm_srli_si128(q0, 8));
  v[2] = bytes_to_float(q1);
  v[3] = bytes_to_float(_mm_srli_si128(q1, 8));
}

// Q4_1: y = q·d + m (product rounded, then the sum).
KVFUSE_TARGET_AVX2_NO_FMA inline void dequantize_q4_1(const std::uint8_t* x, std::int64_t n_blocks, float* y) {
  for (std::int64_t b = 0; b < n_blocks; ++b, x += 20, y += 32) {
    const __m256 d = _mm256_set1_ps(load_f16le(x));
    const __m256 m = _mm256_set1_ps(load_f16le(x + 2));
    __m128i lo, hi;
    nibbles(x + 4, lo, hi);
    _mm256_storeu_ps(y, _mm256_add_ps(_mm256_mul_ps(bytes_to_float(lo), d), m));
    _mm256_storeu_ps(y + 8, _mm256_add_ps(_mm256_mul_ps(bytes_to_float(_mm_srli_si128(lo, 8)), d), m));
    _mm256_storeu_ps(y + 16, _mm256_add_ps(_mm256_mul_ps(bytes_to_float(hi), d), m));
    _mm256_storeu_ps(y + 24, _mm256_add_ps(_mm256_mul_ps(bytes_to_float(_mm_srli_si128(hi, 8)), d), m));
  }
}

// One Q5_0 block (22 bytes) into v[0..3], 8 elements each: ((nibble | bit 4 from qh) − 16)·d; bit 4 of element
// j is bit j of qh.
KVFUSE_TARGET_AVX2_NO_FMA inline void block_q5_0(const std::uint8_t* x, __m256 v[4]) {
  // Byte i of the spread qh: bit (i mod 8) of byte (i div 8) of qh, as 0x10 or 0.
  const __m256i shuffle = _mm256_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 2, 2, 2, 2, 2, 2, 3, 3,
                                           3, 3, 3, 3, 3, 3);
  const __m256i bit = _mm256_set1_epi64x(static_cast<long long>(0x8040201008040201ull));
  const __m256i sixteen = _mm256_set1_epi8(16);
  const __m256 d = _mm256_set1_ps(load_f16le(x));
  const __m256i qh = _mm256_shuffle_epi8(_mm256_set1_epi32(static_cast<int>(load_u32le(x + 2))), shuffle);
  const __m256i high = _mm256_and_si256(_mm256_cmpeq_epi8(_mm256_and_si256(qh, bit), bit), sixteen);
  __m128i lo, hi;
  nibbles(x + 6, lo, hi);
  bytes_to_floats(_mm256_sub_epi8(_mm256_or_si256(_mm256_set_m128i(hi, lo), high), sixteen), v);
  for (int i = 0; i < 4; ++i) v[i] = _mm256_mul_ps(v[i], d);
}

// One Q8_0 block (34 bytes) into v[0..3]: q·d.
KVFUSE_TARGET_AVX2_NO_FMA inline void block_q8_0(const std::uint8_t* x, __m256 v[4]) {
  const __m256 d = _mm256_set1_ps(load_f16le(x));
  for (int i = 0; i < 4; ++i)
    v[i] = _mm256_mul_ps(bytes_to_float(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(x + 2 + 8 * i))), d);
}

// n_blocks blocks of `block_bytes` bytes, each read by `block` (block_q5_0, block_q8_0), stored.
template <void (*block)(const std::uint8_t*, __m256*)>
KVFUSE_TARGET_AVX2_NO_FMA inline void dequantize_each(const std::uint8_t* x, std::int64_t n_blocks, std::int64_t block_bytes,
                                                      float* y) {
  for (std::int64_t b = 0; b < n_blocks; ++b, x += block_bytes, y += 32) {
    __m256 v[4];
    block(x, v);
    for (int i = 0; i < 4; ++i) _mm256_storeu_ps(y + 8 * i, v[i]);
  }
}

// Q4_K: 8 sub-blocks of 32 with 6-bit scales and mins; y = (d·sc)·q − dmin·m, the product rounded first (the
// reference's d1 * q + (−m1)).
KVFUSE_TARGET_AVX2_NO_FMA inline void dequantize_q4_k(const std::uint8_t* x, std::int64_t n_blocks, float* y) {
  const __m256i mask = _mm256_set1_epi8(0x0f);
  for (std::int64_t b = 0; b < n_blocks; ++b, x += 144) {
    const float d = load_f16le(x);
    const float min = load_f16le(x + 2);
    const std::uint8_t* q = x + 16;
    for (int is = 0; is < 8; is += 2, q += 32) {
      const __m256i bytes = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(q));
      const __m256i halves[2] = {_mm256_and_si256(bytes, mask), _mm256_and_si256(_mm256_srli_epi16(bytes, 4), mask)};
      for (int h = 0; h < 2; ++h, y += 32) {
        std::uint8_t sc = 0;
        std::uint8_t m = 0;
        scale_min_k4(is + h, x + 4, sc, m);
        const __m256 dv = _mm256_set1_ps(d * static_cast<float>(sc));
        const __m256 neg_m = _mm256_set1_ps(-(min * static_cast<float>(m)));
        __m256 v[4];
        bytes_to_floats(halves[h], v);  // nibbles 0..15: signed and unsigned bytes agree
        for (int i = 0; i < 4; ++i) _mm256_storeu_ps(y + 8 * i, _mm256_add_ps(_mm256_mul_ps(dv, v[i]), neg_m));
      }
    }
  }
}

// Q6_K: 16 groups of 16 with int8 scales; 6-bit quants (4 low bits from ql, 2 high bits from qh) minus 32;
// y = (d·scale)·q. Each half of 128 elements: four runs of 32 (ql[0..31] low nibbles, ql[32..63] low nibbles,
// ql[0..31] high nibbles, ql[32..63] high nibbles, with bits 0-1, 2-3, 4-5, 6-7 of qh[0..31] on top).
KVFUSE_TARGET_AVX2_NO_FMA inline void dequantize_q6_k(const std::uint8_t* x, std::int64_t n_blocks, float* y) {
  const __m256i low4 = _mm256_set1_epi8(0x0f);
  const __m256i bits45 = _mm256_set1_epi8(0x30);
  const __m256i thirty_two = _mm256_set1_epi8(32);
  for (std::int64_t b = 0; b < n_blocks; ++b, x += 210) {
    const float d = load_f16le(x + 208);
    for (int half = 0; half < 2; ++half) {
      const std::uint8_t* ql = x + 64 * half;
      const std::uint8_t* qh = x + 128 + 32 * half;
      const std::uint8_t* sc = x + 192 + 8 * half;
      const __m256i a = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(ql));
      const __m256i c = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(ql + 32));
      const __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(qh));
      const __m256i q[4] = {
          _mm256_or_si256(_mm256_and_si256(a, low4), _mm256_and_si256(_mm256_slli_epi16(h, 4), bits45)),
          _mm256_or_si256(_mm256_and_si256(c, low4), _mm256_and_si256(_mm256_slli_epi16(h, 2), bits45)),
          _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(a, 4), low4), _mm256_and_si256(h, bits45)),
          _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(c, 4), low4),
                          _mm256_and_si256(_mm256_srli_epi16(h, 2), bits45))};
      for (int run = 0; run < 4; ++run, y += 32) {
        __m256 v[4];
        bytes_to_floats(_mm256_sub_epi8(q[run], thirty_two), v);
        for (int i = 0; i < 4; ++i) {  // elements 0..15 of the run take scale 2·run, 16..31 scale 2·run + 1
          const auto scale = static_cast<float>(static_cast<std::int8_t>(sc[2 * run + i / 2]));
          _mm256_storeu_ps(y + 8 * i, _mm256_mul_ps(_mm256_set1_ps(d * scale), v[i]));
        }
      }
    }
  }
}

#undef KVFUSE_TARGET_AVX2_NO_FMA

}  // namespace avx2
#endif

// detail::dequantize_blocks with the AVX2 versions above where the CPU has AVX2 (cpu_uses_avx2): the same bits.
inline bool dequantize_blocks_cpu(GGMLType type, const std::uint8_t* x, std::int64_t n_blocks, float* y) {
#if KVFUSE_CPU_DISPATCH_AVX2
  if (cpu_uses_avx2()) {
    switch (type) {
      case GGMLType::q4_1: avx2::dequantize_q4_1(x, n_blocks, y); return true;
      case GGMLType::q5_0: avx2::dequantize_each<avx2::block_q5_0>(x, n_blocks, 22, y); return true;
      case GGMLType::q8_0: avx2::dequantize_each<avx2::block_q8_0>(x, n_blocks, 34, y); return true;
      case GGMLType::q4_k: avx2::dequantize_q4_k(x, n_blocks, y); return true;
      case GGMLType::q6_k: avx2::dequantize_q6_k(x, n_blocks, y); return true;
      default: break;
    }
  }
#endif
  return dequantize_blocks(type, x, n_blocks, y);
}

}  // namespace kvfuse::detail
