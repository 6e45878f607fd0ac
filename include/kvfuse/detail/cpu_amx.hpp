#pragma once
// bf16 matrix products on Intel AMX (AMX-TILE + AMX-BF16: Sapphire Rapids and later) for the reference CPU backend's
// weight projections when CpuLlamaOptions::products is CpuProducts::bf16 (backend/cpu/llama.hpp).
//
// C [m][n] = A [m][k] · B [k][n] with A and B rounded to bf16 (to_bf16: round to nearest even) and every product
// summed in fp32 by TDPBF16PS (a bf16 × bf16 product is exact in fp32), 32 values of k per instruction, the tiles
// in k order (within a tile the hardware's own order of additions: not the sequential chain of the fp32 products, so
// the last bits differ from those of fp32 products of the rounded values).
// Each element of C depends only on its row of A and its column of B: a row's result does not depend on how many
// rows are multiplied with it or where in a tile it sits, so batched == alone holds as for the fp32 products.
// Inputs and results that are fp32 subnormals are flushed to zero by the instruction.
//
// Layouts, k padded with zeros to a multiple of 32 (kp = amx_padded_k(k)):
//   A  bf16 rows of kp values (amx_round_row), m padded with zero rows to a multiple of 16;
//   B  panels of 16 columns (amx_pack_transposed from row-major weight rows S [n][k], B[p][j] = S[j][p]), each
//      kp / 32 tiles of 16 rows × 32 values: tile t holds B[32t + 2r + e][j] at 32r + 2j + e (AMX's pairs of k;
//      zero past column n), the tiles of a panel one after the other.
// The caller needs cpu_uses_amx() (CPUID and the kernel's permission for the tile data, asked for once).
//
// fmt-free and Eigen-free.

#include <algorithm>
#include <cstdint>
#include <cstring>

#include "kvfuse/core/dtype.hpp"
#include "kvfuse/detail/cpu_kernels.hpp"

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__)) && !defined(__CUDACC__) && defined(__linux__)
#define KVFUSE_CPU_DISPATCH_AMX 1
#include <cpuid.h>
#include <immintrin.h>
#include <sys/syscall.h>
#include <unistd.h>
#define KVFUSE_TARGET_AMX __attribute__((target("amx-tile,amx-bf16")))
#else
#define KVFUSE_CPU_DISPATCH_AMX 0
#endif

namespace kvfuse::detail {

inline constexpr std::int64_t kAmxTileRows = 16;  // rows of A (and C) per tile
inline constexpr std::int64_t kAmxTileK = 32;     // values of k per tile
inline constexpr std::int64_t kAmxPanel = 16;     // columns of B (and C) per panel

[[nodiscard]] inline std::int64_t amx_padded_k(std::int64_t k) { return (k + kAmxTileK - 1) / kAmxTileK * kAmxTileK; }
[[nodiscard]] inline std::int64_t amx_padded_rows(std::int64_t m) {
  return (m + kAmxTileRows - 1) / kAmxTileRows * kAmxTileRows;
}
// bf16 values of the panels of n columns (whole panels).
[[nodiscard]] inline std::int64_t amx_packed_size(std::int64_t k, std::int64_t n) {
  return (n + kAmxPanel - 1) / kAmxPanel * kAmxPanel * amx_padded_k(k);
}

// Whether the CPU has AMX-TILE and AMX-BF16 and the kernel lets this process use the tile data
// (arch_prctl ARCH_REQ_XCOMP_PERM, Linux 5.16+: asked for once, for every thread of the process). Decided once.
inline bool cpu_uses_amx() noexcept {
#if KVFUSE_CPU_DISPATCH_AMX
  static const bool yes = [] {
    unsigned a = 0, b = 0, c = 0, d = 0;
    if (__get_cpuid_count(7, 0, &a, &b, &c, &d) == 0) return false;
    const bool tile = (d >> 24) & 1u, dot_bf16 = (d >> 22) & 1u;
    constexpr long kReqXcompPerm = 0x1023, kXtileData = 18;
    return tile && dot_bf16 && syscall(SYS_arch_prctl, kReqXcompPerm, kXtileData) == 0;
  }();
  return yes;
#else
  return false;
#endif
}

#if KVFUSE_CPU_DISPATCH_AMX
namespace amx {
// to_bf16 of 16 values: the same bits (round to nearest even, NaN kept quiet). The zero-masked forms: GCC 12 warns
// that the unmasked ones' undefined source is uninitialized.
__attribute__((target("avx512f"))) inline void round16(const float* in, bf16* out) {
  constexpr __mmask16 all = 0xffff;
  const __m512i x = _mm512_loadu_si512(in);
  const __m512i high = _mm512_maskz_srli_epi32(all, x, 16);
  const __m512i lsb = _mm512_and_si512(high, _mm512_set1_epi32(1));
  __m512i r = _mm512_maskz_srli_epi32(all, _mm512_add_epi32(_mm512_add_epi32(x, _mm512_set1_epi32(0x7fff)), lsb), 16);
  const __mmask16 nan = _mm512_cmpgt_epu32_mask(_mm512_and_si512(x, _mm512_set1_epi32(0x7fffffff)),
                                                _mm512_set1_epi32(0x7f800000));
  r = _mm512_mask_or_epi32(r, nan, high, _mm512_set1_epi32(0x40));
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(out), _mm512_maskz_cvtepi32_epi16(all, r));
}
}  // namespace amx
#endif

// to_bf16 of a row of k values into out, then zeros up to amx_padded_k(k).
inline void amx_round_row(const float* in, std::int64_t k, bf16* out) {
  std::int64_t p = 0;
#if KVFUSE_CPU_DISPATCH_AMX
  if (cpu_uses_avx512())
    for (; p + 16 <= k; p += 16) amx::round16(in + p, out + p);
#endif
  for (; p < k; ++p) out[p] = to_bf16(in[p]);
  std::fill(out + k, out + amx_padded_k(k), bf16{});
}

#if KVFUSE_CPU_DISPATCH_AMX
namespace amx {
// out[q] = word q of every in[j]: a 16 x 16 transpose of 32-bit words (two bf16 values of k each). Unpacks make 4 x 4
// blocks in each 128-bit lane, two rounds of lane shuffles put the lanes in place.
__attribute__((target("avx512f"))) inline void transpose16(const bf16* in, std::int64_t in_stride, bf16* out) {
  constexpr __mmask16 all16 = 0xffff;  // the zero-masked forms, as in round16
  constexpr __mmask8 all8 = 0xff;
  __m512i r[16], t[16];
  for (int j = 0; j < 16; ++j) r[j] = _mm512_loadu_si512(in + j * in_stride);
  for (int i = 0; i < 8; ++i) {
    t[2 * i] = _mm512_maskz_unpacklo_epi32(all16, r[2 * i], r[2 * i + 1]);
    t[2 * i + 1] = _mm512_maskz_unpackhi_epi32(all16, r[2 * i], r[2 * i + 1]);
  }
  for (int i = 0; i < 4; ++i) {  // r[4i + c], lane L: words 4L + c of rows 4i .. 4i + 3
    r[4 * i] = _mm512_maskz_unpacklo_epi64(all8, t[4 * i], t[4 * i + 2]);
    r[4 * i + 1] = _mm512_maskz_unpackhi_epi64(all8, t[4 * i], t[4 * i + 2]);
    r[4 * i + 2] = _mm512_maskz_unpacklo_epi64(all8, t[4 * i + 1], t[4 * i + 3]);
    r[4 * i + 3] = _mm512_maskz_unpackhi_epi64(all8, t[4 * i + 1], t[4 * i + 3]);
  }
  for (int c = 0; c < 4; ++c) {
    const __m512i u0 = _mm512_maskz_shuffle_i32x4(all16, r[c], r[4 + c], 0x44);  // lanes 0, 1 of each
    const __m512i u1 = _mm512_maskz_shuffle_i32x4(all16, r[c], r[4 + c], 0xee);  // lanes 2, 3 of each
    const __m512i u2 = _mm512_maskz_shuffle_i32x4(all16, r[8 + c], r[12 + c], 0x44);
    const __m512i u3 = _mm512_maskz_shuffle_i32x4(all16, r[8 + c], r[12 + c], 0xee);
    _mm512_storeu_si512(out + 32 * c, _mm512_maskz_shuffle_i32x4(all16, u0, u2, 0x88));
    _mm512_storeu_si512(out + 32 * (4 + c), _mm512_maskz_shuffle_i32x4(all16, u0, u2, 0xdd));
    _mm512_storeu_si512(out + 32 * (8 + c), _mm512_maskz_shuffle_i32x4(all16, u1, u3, 0x88));
    _mm512_storeu_si512(out + 32 * (12 + c), _mm512_maskz_shuffle_i32x4(all16, u1, u3, 0xdd));
  }
}
}  // namespace amx
#endif

// Values of amx_pack_transposed's scratch.
[[nodiscard]] inline std::int64_t amx_pack_scratch(std::int64_t k) { return kAmxPanel * amx_padded_k(k); }

// B's panels from row-major fp32 rows s [n][k] (row stride ld_s): B[p][j] = s[j][p]. A panel's 16 rows are rounded
// into `scratch` (amx_pack_scratch(k) values), then each tile's 16 x 16 pairs of k are transposed into place.
inline void amx_pack_transposed(const float* s, std::int64_t ld_s, std::int64_t n, std::int64_t k, bf16* panels,
                                bf16* scratch) {
  const std::int64_t kp = amx_padded_k(k);
  for (std::int64_t j0 = 0; j0 < n; j0 += kAmxPanel) {
    const std::int64_t nj = std::min(kAmxPanel, n - j0);
    for (std::int64_t j = 0; j < nj; ++j) amx_round_row(s + (j0 + j) * ld_s, k, scratch + j * kp);
    std::fill(scratch + nj * kp, scratch + kAmxPanel * kp, bf16{});
    // Pair q (values 2q, 2q + 1) of column j: tile q / 16, row q % 16, values 2j and 2j + 1, so at 2 (16 q + j).
    bf16* panel = panels + j0 * kp;
#if KVFUSE_CPU_DISPATCH_AMX
    if (cpu_uses_avx512()) {
      for (std::int64_t p = 0; p < kp; p += kAmxTileK) amx::transpose16(scratch + p, kp, panel + p * kAmxPanel);
      continue;
    }
#endif
    for (std::int64_t j = 0; j < kAmxPanel; ++j)
      for (std::int64_t q = 0; q < kp / 2; ++q)
        std::memcpy(panel + 2 * (kAmxPanel * q + j), scratch + j * kp + 2 * q, 2 * sizeof(bf16));
  }
}

#if KVFUSE_CPU_DISPATCH_AMX
namespace amx {

struct alignas(64) TileConfig {
  std::uint8_t palette = 1;
  std::uint8_t start_row = 0;
  std::uint8_t reserved[14] = {};
  std::uint16_t colsb[16] = {};
  std::uint8_t rows[16] = {};
};

// C rows [0, mc) and columns [0, nc) of an RT x CT block of 16 x 16 tiles; A: RT tiles of 16 rows (rows kp values
// apart); B: CT panels, panel_stride values apart. Accumulators in tiles 0-3, A in 4-5, B in 6-7.
template <int RT, int CT>
KVFUSE_TARGET_AMX inline void block(const bf16* a, std::int64_t kp, const bf16* b, std::int64_t panel_stride, float* c,
                                    std::int64_t ldc, std::int64_t mc, std::int64_t nc) {
  _tile_zero(0);
  if constexpr (CT == 2) _tile_zero(1);
  if constexpr (RT == 2) _tile_zero(2);
  if constexpr (RT == 2 && CT == 2) _tile_zero(3);
  const std::int64_t a_stride = kp * 2;  // bytes
  const bf16* a1 = a + kAmxTileRows * kp;
  const bf16* b1 = b + panel_stride;
  for (std::int64_t p = 0; p < kp; p += kAmxTileK) {
    const std::int64_t t = p * kAmxPanel;  // the k tile's offset in a panel
    _tile_loadd(4, a + p, a_stride);
    _tile_loadd(6, b + t, 64);
    if constexpr (CT == 2) _tile_loadd(7, b1 + t, 64);
    if constexpr (RT == 2) _tile_loadd(5, a1 + p, a_stride);
    _tile_dpbf16ps(0, 4, 6);
    if constexpr (CT == 2) _tile_dpbf16ps(1, 4, 7);
    if constexpr (RT == 2) _tile_dpbf16ps(2, 5, 6);
    if constexpr (RT == 2 && CT == 2) _tile_dpbf16ps(3, 5, 7);
  }
  // A tile whose rows and columns are all in C is stored in place; one at C's edge through buf. (GCC's tile
  // intrinsics paste the tile number into the instruction: literals only.)
  alignas(64) float buf[kAmxTileRows * kAmxPanel];
  const auto at = [&](std::int64_t r, std::int64_t q) { return c + r * kAmxTileRows * ldc + q * kAmxPanel; };
  const auto whole = [&](std::int64_t r, std::int64_t q) {
    return mc >= (r + 1) * kAmxTileRows && nc >= (q + 1) * kAmxPanel;
  };
  const auto copy = [&](std::int64_t r, std::int64_t q) {
    const std::int64_t rows = std::min(kAmxTileRows, mc - r * kAmxTileRows);
    const std::int64_t cols = std::min(kAmxPanel, nc - q * kAmxPanel);
    for (std::int64_t i = 0; i < rows; ++i)
      std::memcpy(at(r, q) + i * ldc, buf + i * kAmxPanel, static_cast<std::size_t>(cols) * sizeof(float));
  };
  const std::int64_t c_stride = ldc * 4;  // bytes
  if (whole(0, 0)) _tile_stored(0, at(0, 0), c_stride);
  else { _tile_stored(0, buf, 64); copy(0, 0); }
  if constexpr (CT == 2) {
    if (whole(0, 1)) _tile_stored(1, at(0, 1), c_stride);
    else { _tile_stored(1, buf, 64); copy(0, 1); }
  }
  if constexpr (RT == 2) {
    if (whole(1, 0)) _tile_stored(2, at(1, 0), c_stride);
    else { _tile_stored(2, buf, 64); copy(1, 0); }
  }
  if constexpr (RT == 2 && CT == 2) {
    if (whole(1, 1)) _tile_stored(3, at(1, 1), c_stride);
    else { _tile_stored(3, buf, 64); copy(1, 1); }
  }
}

// C [m][n] (row stride ldc) = A · B, A in amx_round_row's rows (kp = amx_padded_k(k) values a row), B the panels of
// amx_pack_transposed for columns [0, n). Blocks of 32 x 32, a block column's panels kept in cache while A streams.
KVFUSE_TARGET_AMX inline void gemm(const bf16* a, std::int64_t m, std::int64_t k, const bf16* panels, std::int64_t n,
                                   float* c, std::int64_t ldc) {
  // GCC's tile loads and stores are asm that names no memory: the barriers keep the caller's stores to A and B before
  // them and its reads of C after them, should this function be inlined (an AMX-enabled -march).
  asm volatile("" ::: "memory");
  const std::int64_t kp = amx_padded_k(k);
  const std::int64_t panel_stride = kAmxPanel * kp;
  TileConfig config;
  for (int t = 0; t < 8; ++t) {
    config.rows[t] = kAmxTileRows;
    config.colsb[t] = 64;
  }
  _tile_loadconfig(&config);
  for (std::int64_t j = 0; j < n; j += 2 * kAmxPanel) {
    const bf16* b = panels + j / kAmxPanel * panel_stride;
    const std::int64_t nc = std::min(2 * kAmxPanel, n - j);
    for (std::int64_t i = 0; i < m; i += 2 * kAmxTileRows) {
      const std::int64_t mc = std::min(2 * kAmxTileRows, m - i);
      const bf16* ai = a + i * kp;
      float* ci = c + i * ldc + j;
      if (mc > kAmxTileRows) {
        if (nc > kAmxPanel) block<2, 2>(ai, kp, b, panel_stride, ci, ldc, mc, nc);
        else block<2, 1>(ai, kp, b, panel_stride, ci, ldc, mc, nc);
      } else {
        if (nc > kAmxPanel) block<1, 2>(ai, kp, b, panel_stride, ci, ldc, mc, nc);
        else block<1, 1>(ai, kp, b, panel_stride, ci, ldc, mc, nc);
      }
    }
  }
  _tile_release();
  asm volatile("" ::: "memory");
}

}  // namespace amx
#endif

// amx::gemm where cpu_uses_amx(); a caller that has not checked it gets false and C untouched.
inline bool gemm_bf16(const bf16* a, std::int64_t m, std::int64_t k, const bf16* panels, std::int64_t n, float* c,
                      std::int64_t ldc) {
#if KVFUSE_CPU_DISPATCH_AMX
  if (!cpu_uses_amx()) return false;
  amx::gemm(a, m, k, panels, n, c, ldc);
  return true;
#else
  (void)a, (void)m, (void)k, (void)panels, (void)n, (void)c, (void)ldc;
  return false;
#endif
}

}  // namespace kvfuse::detail
