#pragma once
// gemv_blocks_cpu: products of rows of ggml blocks with fp32 vectors, the blocks dequantized in registers —
// bit for bit detail::gemv (detail/cpu_kernels.hpp) of the rows dequantize_blocks_cpu (backend/cpu/dequantize.hpp)
// writes, without writing them. The output head of a decode step reads every weight of the head once for a few
// rows of activations: storing the dequantized floats and reading them back doubles its memory traffic.
//
// Same bits: avx2::gemv accumulates elements p ≡ 0..7 (mod 16) of a row in acc0 and p ≡ 8..15 in acc1, one FMA
// each in increasing p, and returns hsum(acc0 + acc1); here a block of 32 elements arrives as four vectors of 8
// (elements 0-7, 8-15, 16-23, 24-31) that go to acc0, acc1, acc0, acc1 in that order: the same FMAs on the same
// values. The block readers return products q·d only (Q5_0, Q8_0), which no compiler contracts into the FMA that
// consumes them. Other types, and CPUs without AVX2, return false: the caller dequantizes and runs detail::gemv.

#include <algorithm>
#include <cstdint>

#include "kvfuse/backend/cpu/dequantize.hpp"
#include "kvfuse/detail/cpu_kernels.hpp"
#include "kvfuse/model/ggml_type.hpp"

namespace kvfuse::detail {

#if KVFUSE_CPU_DISPATCH_AVX2
namespace avx2 {

// ys[i][j] = W[j] · xs[i] for M vectors xs and the n rows of W (row_bytes apart, k / 32 blocks each).
template <void (*block)(const std::uint8_t*, __m256*), int M>
KVFUSE_TARGET_AVX2 inline void gemv_blocks(const std::uint8_t* w, std::int64_t row_bytes, std::int64_t block_bytes,
                                           std::int64_t n, std::int64_t k, const float* const* xs, float* const* ys) {
  for (std::int64_t j = 0; j < n; ++j) {
    const std::uint8_t* row = w + j * row_bytes;
    __m256 acc0[M];
    __m256 acc1[M];
    for (int i = 0; i < M; ++i) acc0[i] = acc1[i] = _mm256_setzero_ps();
    for (std::int64_t p = 0; p < k; p += 32, row += block_bytes) {
      __m256 v[4];
      block(row, v);
      for (int i = 0; i < M; ++i) {
        const float* x = xs[i] + p;
        acc0[i] = _mm256_fmadd_ps(v[0], _mm256_loadu_ps(x), acc0[i]);
        acc1[i] = _mm256_fmadd_ps(v[1], _mm256_loadu_ps(x + 8), acc1[i]);
        acc0[i] = _mm256_fmadd_ps(v[2], _mm256_loadu_ps(x + 16), acc0[i]);
        acc1[i] = _mm256_fmadd_ps(v[3], _mm256_loadu_ps(x + 24), acc1[i]);
      }
    }
    for (int i = 0; i < M; ++i) ys[i][j] = hsum(_mm256_add_ps(acc0[i], acc1[i]));
  }
}

// All m vectors, up to four per pass over W.
template <void (*block)(const std::uint8_t*, __m256*)>
inline void gemv_blocks_any(const std::uint8_t* w, std::int64_t row_bytes, std::int64_t block_bytes, std::int64_t n,
                            std::int64_t k, const float* const* xs, std::int64_t m, float* const* ys) {
  for (std::int64_t i = 0; i < m; i += 4) {
    switch (std::min<std::int64_t>(4, m - i)) {
      case 4: gemv_blocks<block, 4>(w, row_bytes, block_bytes, n, k, xs + i, ys + i); break;
      case 3: gemv_blocks<block, 3>(w, row_bytes, block_bytes, n, k, xs + i, ys + i); break;
      case 2: gemv_blocks<block, 2>(w, row_bytes, block_bytes, n, k, xs + i, ys + i); break;
      default: gemv_blocks<block, 1>(w, row_bytes, block_bytes, n, k, xs + i, ys + i); break;
    }
  }
}

}  // namespace avx2
#endif

// ys[i][j] = Σ_p W[j][p] xs[i][p] for i < m and the n rows of W (k values each, row_bytes apart, blocks of
// `type`), bit for bit detail::gemv of the dequantized rows. Returns false, writing nothing, where the fused path
// does not exist (a type other than Q5_0 and Q8_0, a CPU without AVX2).
inline bool gemv_blocks_cpu(GGMLType type, const std::uint8_t* w, std::int64_t row_bytes, std::int64_t n,
                            std::int64_t k, const float* const* xs, std::int64_t m, float* const* ys) {
#if KVFUSE_CPU_DISPATCH_AVX2
  if (cpu_uses_avx2()) {
    switch (type) {
      case GGMLType::q5_0: avx2::gemv_blocks_any<avx2::block_q5_0>(w, row_bytes, 22, n, k, xs, m, ys); return true;
      case GGMLType::q8_0: avx2::gemv_blocks_any<avx2::block_q8_0>(w, row_bytes, 34, n, k, xs, m, ys); return true;
      default: break;
    }
  }
#endif
  (void)type, (void)w, (void)row_bytes, (void)n, (void)k, (void)xs, (void)m, (void)ys;
  return false;
}

}  // namespace kvfuse::detail
