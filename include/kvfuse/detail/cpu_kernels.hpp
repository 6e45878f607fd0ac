#pragma once
// The hot loops of the reference CPU backend (backend/cpu/llama.hpp) — matrix products, the attention mask and
// softmax — in fp32 with fp32 accumulation, each in two versions chosen once at run time:
//   portable  plain C++, compiled for whatever the including program targets (SSE2 on a plain x86-64 build)
//   avx2      the same computation in AVX2 + FMA intrinsics, compiled with __attribute__((target("avx2,fma")))
//             on x86-64 GCC / Clang, used when __builtin_cpu_supports says the CPU has both
// and the matrix product in a third, avx512 (AVX-512F, 32 columns a tile), used where the CPU has it: the same
// bits as avx2's, each element of C the same chain of fused multiply-adds.
// Why by hand: kvfuse is header-only, so its code is compiled with the flags of each program that includes it,
// and Eigen fixes its SIMD width at compile time from those flags: a program built without -march flags would
// run Eigen at SSE2 width even on an AVX2 machine, and one built with -march=native would not run on an older
// CPU. Per-function target attributes give one binary that does both. The two versions may differ in the
// order of their additions (and the avx2 softmax in the last bits of its exp2), nothing else.
//
// Matrix products multiply a row-major A [m][k] by a matrix B [k][n] stored in panels of 16 columns: panel t
// holds B[p][16t + j] at panel[p * 16 + j] for p < k, j < 16 (zero past column n), panels kPanelWidth * k
// floats apart (or gemm_packed's panel_stride: B the first k rows of panels packed for more). The packers build
// panels from a row-major source, the product reads them (a panel stays in cache while a block of A's rows streams
// past it).
//
// fmt-free and Eigen-free.

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>

#include "kvfuse/detail/attention.hpp"

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__)) && !defined(__CUDACC__)
#define KVFUSE_CPU_DISPATCH_AVX2 1
#include <immintrin.h>
#define KVFUSE_TARGET_AVX2 __attribute__((target("avx2,fma")))
#else
#define KVFUSE_CPU_DISPATCH_AVX2 0
#endif

namespace kvfuse::detail {

inline constexpr std::int64_t kPanelWidth = 16;  // columns of B per packed panel
inline constexpr std::int64_t kRowBlock = 64;    // rows of A that pass a panel while it stays in cache

// Floats that the panels of a k x n matrix B occupy.
inline std::int64_t packed_size(std::int64_t k, std::int64_t n) {
  return (n + kPanelWidth - 1) / kPanelWidth * kPanelWidth * k;
}

// Panels of B = S for a row-major S [k][n] with row stride ld_s (value rows V, the B of P V).
inline void pack_rows(const float* s, std::int64_t ld_s, std::int64_t k, std::int64_t n, float* panels) {
  for (std::int64_t j0 = 0; j0 < n; j0 += kPanelWidth) {
    float* panel = panels + j0 * k;
    const std::int64_t nj = std::min(kPanelWidth, n - j0);
    for (std::int64_t p = 0; p < k; ++p) {
      const float* src = s + p * ld_s + j0;
      float* dst = panel + p * kPanelWidth;
      for (std::int64_t j = 0; j < nj; ++j) dst[j] = src[j];
      for (std::int64_t j = nj; j < kPanelWidth; ++j) dst[j] = 0.0f;
    }
  }
}

namespace portable {

// Panels of B = S^T for a row-major S [n][k] with row stride ld_s (B[p][j] = S[j][p]): weight rows W [out][in]
// become the B of y = x W^T, key rows the B of q K^T.
inline void pack_transposed(const float* s, std::int64_t ld_s, std::int64_t n, std::int64_t k, float* panels) {
  for (std::int64_t j0 = 0; j0 < n; j0 += kPanelWidth) {
    float* panel = panels + j0 * k;
    const std::int64_t nj = std::min(kPanelWidth, n - j0);
    for (std::int64_t j = 0; j < nj; ++j) {
      const float* row = s + (j0 + j) * ld_s;
      for (std::int64_t p = 0; p < k; ++p) panel[p * kPanelWidth + j] = row[p];
    }
    for (std::int64_t j = nj; j < kPanelWidth; ++j)
      for (std::int64_t p = 0; p < k; ++p) panel[p * kPanelWidth + j] = 0.0f;
  }
}

// C[i][j] = Σ_p A[i][p] B[p][j] for MR rows of A and one panel of B, j < nc (<= 16) stored.
template <int MR>
inline void gemm_tile(const float* a, std::int64_t lda, const float* panel, std::int64_t k, float* c, std::int64_t ldc,
                      std::int64_t nc) {
  float acc[MR][kPanelWidth] = {};
  for (std::int64_t p = 0; p < k; ++p) {
    const float* b = panel + p * kPanelWidth;
    for (int r = 0; r < MR; ++r) {
      const float av = a[r * lda + p];
      for (std::int64_t j = 0; j < kPanelWidth; ++j) acc[r][j] += av * b[j];
    }
  }
  for (int r = 0; r < MR; ++r)
    for (std::int64_t j = 0; j < nc; ++j) c[r * ldc + j] = acc[r][j];
}

inline constexpr int kTileRows = 4;

// C [m][n] (row stride ldc) = A [m][k] (row stride lda) · B [k][n] (packed panels, panel_stride floats apart; 0:
// kPanelWidth * k, one after the other).
inline void gemm_packed(const float* a, std::int64_t lda, std::int64_t m, std::int64_t k, const float* panels,
                        std::int64_t n, float* c, std::int64_t ldc, std::int64_t panel_stride = 0) {
  const std::int64_t stride = panel_stride == 0 ? kPanelWidth * k : panel_stride;
  for (std::int64_t i0 = 0; i0 < m; i0 += kRowBlock) {
    const std::int64_t i1 = std::min(m, i0 + kRowBlock);
    for (std::int64_t j0 = 0; j0 < n; j0 += kPanelWidth) {
      const float* panel = panels + j0 / kPanelWidth * stride;
      const std::int64_t nc = std::min(kPanelWidth, n - j0);
      std::int64_t i = i0;
      for (; i + kTileRows <= i1; i += kTileRows) gemm_tile<kTileRows>(a + i * lda, lda, panel, k, c + i * ldc + j0, ldc, nc);
      for (; i < i1; ++i) gemm_tile<1>(a + i * lda, lda, panel, k, c + i * ldc + j0, ldc, nc);
    }
  }
}

// y[j] = Σ_p W[j][p] x[p] for the n rows of a row-major W [n][k] (row stride ldw).
inline void gemv(const float* w, std::int64_t ldw, std::int64_t n, std::int64_t k, const float* x, float* y) {
  for (std::int64_t j = 0; j < n; ++j) {
    const float* row = w + j * ldw;
    float sum = 0.0f;
    for (std::int64_t p = 0; p < k; ++p) sum += row[p] * x[p];
    y[j] = sum;
  }
}

// Softmax of one row of n base-2 scores in place: detail::attention_softmax_row (detail/attention.hpp).
inline void softmax_row(float* scores, std::int64_t n) { attention_softmax_row(scores, n); }

// Raw dot products w[0..n) of a query at position qpos against keys at positions pos[0..n) -> base-2 scores:
// w · factor where the key is visible (detail::attention_visible, the exact windowed causal mask by position), −inf
// elsewhere.
inline void mask_scale_row(float* w, const std::int64_t* pos, std::int64_t n, std::int64_t qpos, std::int64_t window,
                           float factor) {
  for (std::int64_t r = 0; r < n; ++r)
    w[r] = attention_visible(pos[r], qpos, window) ? w[r] * factor : attention_neg_inf();
}

}  // namespace portable

#if KVFUSE_CPU_DISPATCH_AVX2
namespace avx2 {

// portable::gemm_tile with 6 rows x 16 columns of C in 12 ymm accumulators.
template <int MR>
KVFUSE_TARGET_AVX2 inline void gemm_tile(const float* a, std::int64_t lda, const float* panel, std::int64_t k, float* c,
                                         std::int64_t ldc, std::int64_t nc) {
  __m256 lo[MR];
  __m256 hi[MR];
#pragma GCC unroll 6
  for (int r = 0; r < MR; ++r) lo[r] = hi[r] = _mm256_setzero_ps();
  for (std::int64_t p = 0; p < k; ++p) {
    const __m256 b0 = _mm256_loadu_ps(panel + p * kPanelWidth);
    const __m256 b1 = _mm256_loadu_ps(panel + p * kPanelWidth + 8);
#pragma GCC unroll 6
    for (int r = 0; r < MR; ++r) {
      const __m256 av = _mm256_broadcast_ss(a + r * lda + p);
      lo[r] = _mm256_fmadd_ps(av, b0, lo[r]);
      hi[r] = _mm256_fmadd_ps(av, b1, hi[r]);
    }
  }
#pragma GCC unroll 6
  for (int r = 0; r < MR; ++r) {
    float* dst = c + r * ldc;
    if (nc == kPanelWidth) {
      _mm256_storeu_ps(dst, lo[r]);
      _mm256_storeu_ps(dst + 8, hi[r]);
    } else {
      alignas(32) float row[kPanelWidth];
      _mm256_store_ps(row, lo[r]);
      _mm256_store_ps(row + 8, hi[r]);
      for (std::int64_t j = 0; j < nc; ++j) dst[j] = row[j];
    }
  }
}

inline constexpr int kTileRows = 6;

KVFUSE_TARGET_AVX2 inline void gemm_packed(const float* a, std::int64_t lda, std::int64_t m, std::int64_t k,
                                           const float* panels, std::int64_t n, float* c, std::int64_t ldc,
                                           std::int64_t panel_stride = 0) {
  const std::int64_t stride = panel_stride == 0 ? kPanelWidth * k : panel_stride;
  for (std::int64_t i0 = 0; i0 < m; i0 += kRowBlock) {
    const std::int64_t i1 = std::min(m, i0 + kRowBlock);
    for (std::int64_t j0 = 0; j0 < n; j0 += kPanelWidth) {
      const float* panel = panels + j0 / kPanelWidth * stride;
      const std::int64_t nc = std::min(kPanelWidth, n - j0);
      float* cj = c + j0;
      std::int64_t i = i0;
      for (; i + kTileRows <= i1; i += kTileRows) gemm_tile<kTileRows>(a + i * lda, lda, panel, k, cj + i * ldc, ldc, nc);
      switch (i1 - i) {
        case 5: gemm_tile<5>(a + i * lda, lda, panel, k, cj + i * ldc, ldc, nc); break;
        case 4: gemm_tile<4>(a + i * lda, lda, panel, k, cj + i * ldc, ldc, nc); break;
        case 3: gemm_tile<3>(a + i * lda, lda, panel, k, cj + i * ldc, ldc, nc); break;
        case 2: gemm_tile<2>(a + i * lda, lda, panel, k, cj + i * ldc, ldc, nc); break;
        case 1: gemm_tile<1>(a + i * lda, lda, panel, k, cj + i * ldc, ldc, nc); break;
        default: break;
      }
    }
  }
}

// portable::pack_transposed (the same floats, only moved) with 8 x 8 blocks transposed in registers: whole
// panels of 16 rows with k a multiple of 8; anything else the portable loop.
KVFUSE_TARGET_AVX2 inline void pack_transposed(const float* s, std::int64_t ld_s, std::int64_t n, std::int64_t k,
                                               float* panels) {
  if (k % 8 != 0) return portable::pack_transposed(s, ld_s, n, k, panels);
  const std::int64_t whole = n / kPanelWidth * kPanelWidth;
  for (std::int64_t j0 = 0; j0 < whole; j0 += kPanelWidth) {
    float* panel = panels + j0 * k;
    for (std::int64_t half = 0; half < kPanelWidth; half += 8) {
      const float* rows = s + (j0 + half) * ld_s;
      for (std::int64_t p = 0; p < k; p += 8) {
        __m256 r[8];
#pragma GCC unroll 8
        for (int i = 0; i < 8; ++i) r[i] = _mm256_loadu_ps(rows + i * ld_s + p);
        const __m256 t0 = _mm256_unpacklo_ps(r[0], r[1]), t1 = _mm256_unpackhi_ps(r[0], r[1]);
        const __m256 t2 = _mm256_unpacklo_ps(r[2], r[3]), t3 = _mm256_unpackhi_ps(r[2], r[3]);
        const __m256 t4 = _mm256_unpacklo_ps(r[4], r[5]), t5 = _mm256_unpackhi_ps(r[4], r[5]);
        const __m256 t6 = _mm256_unpacklo_ps(r[6], r[7]), t7 = _mm256_unpackhi_ps(r[6], r[7]);
        const __m256 u0 = _mm256_shuffle_ps(t0, t2, 0x44), u1 = _mm256_shuffle_ps(t0, t2, 0xee);
        const __m256 u2 = _mm256_shuffle_ps(t1, t3, 0x44), u3 = _mm256_shuffle_ps(t1, t3, 0xee);
        const __m256 u4 = _mm256_shuffle_ps(t4, t6, 0x44), u5 = _mm256_shuffle_ps(t4, t6, 0xee);
        const __m256 u6 = _mm256_shuffle_ps(t5, t7, 0x44), u7 = _mm256_shuffle_ps(t5, t7, 0xee);
        float* dst = panel + p * kPanelWidth + half;  // column p + i of the 8 rows: panel row p + i
        _mm256_storeu_ps(dst + 0 * kPanelWidth, _mm256_permute2f128_ps(u0, u4, 0x20));
        _mm256_storeu_ps(dst + 1 * kPanelWidth, _mm256_permute2f128_ps(u1, u5, 0x20));
        _mm256_storeu_ps(dst + 2 * kPanelWidth, _mm256_permute2f128_ps(u2, u6, 0x20));
        _mm256_storeu_ps(dst + 3 * kPanelWidth, _mm256_permute2f128_ps(u3, u7, 0x20));
        _mm256_storeu_ps(dst + 4 * kPanelWidth, _mm256_permute2f128_ps(u0, u4, 0x31));
        _mm256_storeu_ps(dst + 5 * kPanelWidth, _mm256_permute2f128_ps(u1, u5, 0x31));
        _mm256_storeu_ps(dst + 6 * kPanelWidth, _mm256_permute2f128_ps(u2, u6, 0x31));
        _mm256_storeu_ps(dst + 7 * kPanelWidth, _mm256_permute2f128_ps(u3, u7, 0x31));
      }
    }
  }
  if (whole < n) portable::pack_transposed(s + whole * ld_s, ld_s, n - whole, k, panels + whole * k);
}

// Horizontal sum of the 8 lanes.
KVFUSE_TARGET_AVX2 inline float hsum(__m256 v) {
  const __m128 s4 = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  const __m128 s2 = _mm_add_ps(s4, _mm_movehl_ps(s4, s4));
  return _mm_cvtss_f32(_mm_add_ss(s2, _mm_shuffle_ps(s2, s2, 1)));
}

KVFUSE_TARGET_AVX2 inline void gemv(const float* w, std::int64_t ldw, std::int64_t n, std::int64_t k, const float* x,
                                    float* y) {
  const std::int64_t k8 = k / 8 * 8;
  for (std::int64_t j = 0; j < n; ++j) {
    const float* row = w + j * ldw;
    __m256 acc0 = _mm256_setzero_ps();
    __m256 acc1 = _mm256_setzero_ps();
    std::int64_t p = 0;
    for (; p + 16 <= k8; p += 16) {
      acc0 = _mm256_fmadd_ps(_mm256_loadu_ps(row + p), _mm256_loadu_ps(x + p), acc0);
      acc1 = _mm256_fmadd_ps(_mm256_loadu_ps(row + p + 8), _mm256_loadu_ps(x + p + 8), acc1);
    }
    if (p < k8) acc0 = _mm256_fmadd_ps(_mm256_loadu_ps(row + p), _mm256_loadu_ps(x + p), acc0);
    float sum = hsum(_mm256_add_ps(acc0, acc1));
    for (p = k8; p < k; ++p) sum += row[p] * x[p];
    y[j] = sum;
  }
}

// 2^x for 8 lanes, x <= 0 or −inf (base-2 scores minus their row maximum): 2^floor(x) from the exponent bits
// times a degree-6 polynomial of the fraction (a relative-error fit on [0, 1): error < 1e-7, under one float ulp); 0 below −126.
KVFUSE_TARGET_AVX2 inline __m256 exp2_nonpositive(__m256 x) {
  const __m256 clamped = _mm256_max_ps(x, _mm256_set1_ps(-126.0f));
  const __m256 fl = _mm256_floor_ps(clamped);
  const __m256 f = _mm256_sub_ps(clamped, fl);  // [0, 1)
  __m256 poly = _mm256_set1_ps(2.161394423e-4f);
  poly = _mm256_fmadd_ps(poly, f, _mm256_set1_ps(1.246734070e-3f));
  poly = _mm256_fmadd_ps(poly, f, _mm256_set1_ps(9.675536063e-3f));
  poly = _mm256_fmadd_ps(poly, f, _mm256_set1_ps(5.548521868e-2f));
  poly = _mm256_fmadd_ps(poly, f, _mm256_set1_ps(2.402293254e-1f));
  poly = _mm256_fmadd_ps(poly, f, _mm256_set1_ps(6.931470423e-1f));
  poly = _mm256_fmadd_ps(poly, f, _mm256_set1_ps(1.0f));
  const __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(fl), _mm256_set1_epi32(127)), 23);
  const __m256 r = _mm256_mul_ps(poly, _mm256_castsi256_ps(e));
  return _mm256_and_ps(r, _mm256_cmp_ps(x, _mm256_set1_ps(-126.0f), _CMP_GE_OQ));
}

// portable::softmax_row with 8 lanes: the same maximum, weights 2^(s − m) (exp2_nonpositive), sum, 1 / sum.
KVFUSE_TARGET_AVX2 inline void softmax_row(float* scores, std::int64_t n) {
  const std::int64_t n8 = n / 8 * 8;
  __m256 vmax = _mm256_set1_ps(attention_neg_inf());
  for (std::int64_t j = 0; j < n8; j += 8) vmax = _mm256_max_ps(vmax, _mm256_loadu_ps(scores + j));
  alignas(32) float lanes[8];
  _mm256_store_ps(lanes, vmax);
  float block_max = attention_neg_inf();
  for (const float v : lanes) block_max = v > block_max ? v : block_max;
  for (std::int64_t j = n8; j < n; ++j) block_max = scores[j] > block_max ? scores[j] : block_max;
  float m = attention_neg_inf();
  softmax_advance(m, block_max);
  const float shift = softmax_shift(m);
  const __m256 vshift = _mm256_set1_ps(shift);
  __m256 vsum = _mm256_setzero_ps();
  for (std::int64_t j = 0; j < n8; j += 8) {
    const __m256 w = exp2_nonpositive(_mm256_sub_ps(_mm256_loadu_ps(scores + j), vshift));
    _mm256_storeu_ps(scores + j, w);
    vsum = _mm256_add_ps(vsum, w);
  }
  float l = hsum(vsum);
  for (std::int64_t j = n8; j < n; ++j) {
    scores[j] = exp2f(scores[j] - shift);
    l += scores[j];
  }
  const float inv = attention_output_scale(l);
  const __m256 vinv = _mm256_set1_ps(inv);
  for (std::int64_t j = 0; j < n8; j += 8) _mm256_storeu_ps(scores + j, _mm256_mul_ps(_mm256_loadu_ps(scores + j), vinv));
  for (std::int64_t j = n8; j < n; ++j) scores[j] *= inv;
}

// portable::mask_scale_row 8 keys at a time: the same products, the same −inf. A key is visible iff
// lo < pos <= qpos with lo = qpos − window (no window: the lowest int64), attention_visible's condition for every
// position above the lowest int64 (the engine's are >= 0).
KVFUSE_TARGET_AVX2 inline void mask_scale_row(float* w, const std::int64_t* pos, std::int64_t n, std::int64_t qpos,
                                              std::int64_t window, float factor) {
  const std::int64_t lo = window > 0 ? qpos - window : std::numeric_limits<std::int64_t>::min();
  const __m256i vq = _mm256_set1_epi64x(qpos);
  const __m256i vlo = _mm256_set1_epi64x(lo);
  const __m256i low_halves = _mm256_setr_epi32(0, 2, 4, 6, 1, 3, 5, 7);  // lane i's low 32 bits to lane i / 2
  const __m256 vf = _mm256_set1_ps(factor);
  const __m256 vinf = _mm256_set1_ps(attention_neg_inf());
  std::int64_t r = 0;
  for (; r + 8 <= n; r += 8) {
    const __m256i p0 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(pos + r));
    const __m256i p1 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(pos + r + 4));
    const __m256i v0 = _mm256_andnot_si256(_mm256_cmpgt_epi64(p0, vq), _mm256_cmpgt_epi64(p0, vlo));
    const __m256i v1 = _mm256_andnot_si256(_mm256_cmpgt_epi64(p1, vq), _mm256_cmpgt_epi64(p1, vlo));
    const __m256i visible = _mm256_permute2x128_si256(_mm256_permutevar8x32_epi32(v0, low_halves),
                                                      _mm256_permutevar8x32_epi32(v1, low_halves), 0x20);
    const __m256 scaled = _mm256_mul_ps(_mm256_loadu_ps(w + r), vf);
    _mm256_storeu_ps(w + r, _mm256_blendv_ps(vinf, scaled, _mm256_castsi256_ps(visible)));
  }
  portable::mask_scale_row(w + r, pos + r, n - r, qpos, window, factor);
}

}  // namespace avx2

#define KVFUSE_TARGET_AVX512 __attribute__((target("avx512f,fma")))
namespace avx512 {

// avx2::gemm_tile for MR rows x NP adjacent panels (16 columns each, panel_stride floats apart) of C in MR * NP
// zmm accumulators. Each element of C is the same chain of fused multiply-adds over p, in the same order, as in
// avx2::gemm_tile, so the products are bit-identical to avx2's whatever the tiling.
template <int MR, int NP>
KVFUSE_TARGET_AVX512 inline void gemm_tile(const float* a, std::int64_t lda, const float* panel,
                                           std::int64_t panel_stride, std::int64_t k, float* c, std::int64_t ldc,
                                           std::int64_t nc) {
  __m512 acc[MR][NP];
#pragma GCC unroll 12
  for (int r = 0; r < MR; ++r)
    for (int q = 0; q < NP; ++q) acc[r][q] = _mm512_setzero_ps();
  for (std::int64_t p = 0; p < k; ++p) {
    __m512 b[NP];
    for (int q = 0; q < NP; ++q) b[q] = _mm512_loadu_ps(panel + q * panel_stride + p * kPanelWidth);
#pragma GCC unroll 12
    for (int r = 0; r < MR; ++r) {
      const __m512 av = _mm512_set1_ps(a[r * lda + p]);
      for (int q = 0; q < NP; ++q) acc[r][q] = _mm512_fmadd_ps(av, b[q], acc[r][q]);
    }
  }
  for (int q = 0; q < NP; ++q) {
    const std::int64_t cols = std::min(kPanelWidth, nc - q * kPanelWidth);
    const auto mask = static_cast<__mmask16>((1u << cols) - 1u);
#pragma GCC unroll 12
    for (int r = 0; r < MR; ++r) _mm512_mask_storeu_ps(c + r * ldc + q * kPanelWidth, mask, acc[r][q]);
  }
}

inline constexpr int kTileRows = 8;

// The rows i0 .. i1 of C for NP adjacent panels: tiles of kTileRows rows, then one tile of the rest.
template <int NP>
KVFUSE_TARGET_AVX512 inline void gemm_rows(const float* a, std::int64_t lda, std::int64_t i0, std::int64_t i1,
                                           const float* panel, std::int64_t stride, std::int64_t k, float* c,
                                           std::int64_t ldc, std::int64_t nc) {
  std::int64_t i = i0;
  for (; i + kTileRows <= i1; i += kTileRows) gemm_tile<kTileRows, NP>(a + i * lda, lda, panel, stride, k, c + i * ldc, ldc, nc);
  const float* ai = a + i * lda;
  float* ci = c + i * ldc;
  switch (i1 - i) {
    case 7: gemm_tile<7, NP>(ai, lda, panel, stride, k, ci, ldc, nc); break;
    case 6: gemm_tile<6, NP>(ai, lda, panel, stride, k, ci, ldc, nc); break;
    case 5: gemm_tile<5, NP>(ai, lda, panel, stride, k, ci, ldc, nc); break;
    case 4: gemm_tile<4, NP>(ai, lda, panel, stride, k, ci, ldc, nc); break;
    case 3: gemm_tile<3, NP>(ai, lda, panel, stride, k, ci, ldc, nc); break;
    case 2: gemm_tile<2, NP>(ai, lda, panel, stride, k, ci, ldc, nc); break;
    case 1: gemm_tile<1, NP>(ai, lda, panel, stride, k, ci, ldc, nc); break;
    default: break;
  }
}

// avx2::gemm_packed two panels (32 columns) at a time: the same bits.
KVFUSE_TARGET_AVX512 inline void gemm_packed(const float* a, std::int64_t lda, std::int64_t m, std::int64_t k,
                                             const float* panels, std::int64_t n, float* c, std::int64_t ldc,
                                             std::int64_t panel_stride = 0) {
  const std::int64_t stride = panel_stride == 0 ? kPanelWidth * k : panel_stride;
  for (std::int64_t i0 = 0; i0 < m; i0 += kRowBlock) {
    const std::int64_t i1 = std::min(m, i0 + kRowBlock);
    for (std::int64_t j0 = 0; j0 < n; j0 += 2 * kPanelWidth) {
      const std::int64_t nc = std::min(2 * kPanelWidth, n - j0);
      const float* panel = panels + j0 / kPanelWidth * stride;
      if (nc > kPanelWidth) gemm_rows<2>(a, lda, i0, i1, panel, stride, k, c + j0, ldc, nc);
      else gemm_rows<1>(a, lda, i0, i1, panel, stride, k, c + j0, ldc, nc);
    }
  }
}

}  // namespace avx512
#endif

// Whether the avx2 versions run: an x86-64 GCC / Clang build on a CPU with AVX2 and FMA. Decided once.
inline bool cpu_uses_avx2() noexcept {
#if KVFUSE_CPU_DISPATCH_AVX2
  static const bool yes = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  return yes;
#else
  return false;
#endif
}

// Whether gemm_packed runs avx512's version (the same bits as avx2's): cpu_uses_avx2() and AVX-512F. Decided once.
inline bool cpu_uses_avx512() noexcept {
#if KVFUSE_CPU_DISPATCH_AVX2
  static const bool yes = cpu_uses_avx2() && __builtin_cpu_supports("avx512f");
  return yes;
#else
  return false;
#endif
}

// The dispatched kernels: the avx2 version where cpu_uses_avx2(), else the portable one (gemm_packed: avx512's
// before both where cpu_uses_avx512()).

// Panels of B = S^T for a row-major S [n][k] with row stride ld_s (B[p][j] = S[j][p]): weight rows W [out][in]
// become the B of y = x W^T, key rows the B of q K^T.
inline void pack_transposed(const float* s, std::int64_t ld_s, std::int64_t n, std::int64_t k, float* panels) {
#if KVFUSE_CPU_DISPATCH_AVX2
  if (cpu_uses_avx2()) return avx2::pack_transposed(s, ld_s, n, k, panels);
#endif
  portable::pack_transposed(s, ld_s, n, k, panels);
}

// C [m][n] (row stride ldc) = A [m][k] (row stride lda) · B [k][n] (packed panels, see the header; panel_stride
// floats apart, 0: kPanelWidth * k, as the packers write them for k rows — more when B is the first k rows of
// panels packed for more).
inline void gemm_packed(const float* a, std::int64_t lda, std::int64_t m, std::int64_t k, const float* panels,
                        std::int64_t n, float* c, std::int64_t ldc, std::int64_t panel_stride = 0) {
#if KVFUSE_CPU_DISPATCH_AVX2
  if (cpu_uses_avx512()) return avx512::gemm_packed(a, lda, m, k, panels, n, c, ldc, panel_stride);
  if (cpu_uses_avx2()) return avx2::gemm_packed(a, lda, m, k, panels, n, c, ldc, panel_stride);
#endif
  portable::gemm_packed(a, lda, m, k, panels, n, c, ldc, panel_stride);
}

// y[j] = Σ_p W[j][p] x[p] for the n rows of a row-major W [n][k] (row stride ldw).
inline void gemv(const float* w, std::int64_t ldw, std::int64_t n, std::int64_t k, const float* x, float* y) {
#if KVFUSE_CPU_DISPATCH_AVX2
  if (cpu_uses_avx2()) return avx2::gemv(w, ldw, n, k, x, y);
#endif
  portable::gemv(w, ldw, n, k, x, y);
}

// Softmax of a row of n base-2 scores in place (masked scores −inf get probability 0), as
// detail::attention_softmax_row.
inline void softmax_row(float* scores, std::int64_t n) {
#if KVFUSE_CPU_DISPATCH_AVX2
  if (cpu_uses_avx2()) return avx2::softmax_row(scores, n);
#endif
  portable::softmax_row(scores, n);
}

// Raw dot products of a query at position qpos -> base-2 scores, w · factor where attention_visible(pos[r], qpos,
// window), −inf elsewhere (portable::mask_scale_row).
inline void mask_scale_row(float* w, const std::int64_t* pos, std::int64_t n, std::int64_t qpos, std::int64_t window,
                           float factor) {
#if KVFUSE_CPU_DISPATCH_AVX2
  if (cpu_uses_avx2()) return avx2::mask_scale_row(w, pos, n, qpos, window, factor);
#endif
  portable::mask_scale_row(w, pos, n, qpos, window, factor);
}

}  // namespace kvfuse::detail
