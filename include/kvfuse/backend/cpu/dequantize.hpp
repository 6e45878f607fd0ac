#pragma once
// dequantize_blocks_cpu: ggml blocks to fp32 on the CPU, bit-identical to ggml's reference dequantizers
// (detail::dequantize_blocks, model/ggml_quant.hpp), with AVX2 versions of the types that hold most of the weights
// of the models kvfuse runs (SmolLM2: Q4_1 and Q8_0; Gemma 3 and Qwen2: Q8_0 and Q5_0), chosen at run time like
// the kernels of detail/cpu_kernels.hpp. The other types run the reference.
//
// Same bits: each element is ggml's fp32 arithmetic in ggml's order — Q4_1 q·d + m with the product rounded
// first, Q5_0 (q − 16)·d, Q8_0 q·d — one rounding per operation in 8 lanes. The AVX2 functions are compiled for
// "avx2" without "fma", so the compiler cannot contract q·d + m into one fused operation; the scales d and m
// are converted from fp16 by the reference's exact conversion.

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

// Q5_0: y = ((nibble | bit 4 from qh) − 16)·d; bit 4 of element j is bit j of qh.
KVFUSE_TARGET_AVX2_NO_FMA inline void dequantize_q5_0(const std::uint8_t* x, std::int64_t n_blocks, float* y) {
  // Byte i of the spread qh: bit (i mod 8) of byte (i div 8) of qh, as 0x10 or 0.
  const __m256i shuffle = _mm256_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 2, 2, 2, 2, 2, 2, 3, 3,
                                           3, 3, 3, 3, 3, 3);
  const __m256i bit = _mm256_set1_epi64x(static_cast<long long>(0x8040201008040201ull));
  const __m256i sixteen = _mm256_set1_epi8(16);
  for (std::int64_t b = 0; b < n_blocks; ++b, x += 22, y += 32) {
    const __m256 d = _mm256_set1_ps(load_f16le(x));
    const __m256i qh = _mm256_shuffle_epi8(_mm256_set1_epi32(static_cast<int>(load_u32le(x + 2))), shuffle);
    const __m256i high = _mm256_and_si256(_mm256_cmpeq_epi8(_mm256_and_si256(qh, bit), bit), sixteen);
    __m128i lo, hi;
    nibbles(x + 6, lo, hi);
    const __m256i q = _mm256_sub_epi8(_mm256_or_si256(_mm256_set_m128i(hi, lo), high), sixteen);
    const __m128i q0 = _mm256_castsi256_si128(q);
    const __m128i q1 = _mm256_extracti128_si256(q, 1);
    _mm256_storeu_ps(y, _mm256_mul_ps(bytes_to_float(q0), d));
    _mm256_storeu_ps(y + 8, _mm256_mul_ps(bytes_to_float(_mm_srli_si128(q0, 8)), d));
    _mm256_storeu_ps(y + 16, _mm256_mul_ps(bytes_to_float(q1), d));
    _mm256_storeu_ps(y + 24, _mm256_mul_ps(bytes_to_float(_mm_srli_si128(q1, 8)), d));
  }
}

// Q8_0: y = q·d.
KVFUSE_TARGET_AVX2_NO_FMA inline void dequantize_q8_0(const std::uint8_t* x, std::int64_t n_blocks, float* y) {
  for (std::int64_t b = 0; b < n_blocks; ++b, x += 34, y += 32) {
    const __m256 d = _mm256_set1_ps(load_f16le(x));
    for (int i = 0; i < 4; ++i) {
      const __m128i q = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(x + 2 + 8 * i));
      _mm256_storeu_ps(y + 8 * i, _mm256_mul_ps(bytes_to_float(q), d));
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
      case GGMLType::q5_0: avx2::dequantize_q5_0(x, n_blocks, y); return true;
      case GGMLType::q8_0: avx2::dequantize_q8_0(x, n_blocks, y); return true;
      default: break;
    }
  }
#endif
  return dequantize_blocks(type, x, n_blocks, y);
}

}  // namespace kvfuse::detail
