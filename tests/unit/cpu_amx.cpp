// The bf16 products on AMX (detail/cpu_amx.hpp): the rounding and the packed layout everywhere; the product itself
// where the CPU has AMX-BF16 (Skipped elsewhere): within fp32 rounding of a double sum of the bf16-rounded
// products, and each row the same bits alone as in any batch, for every edge of the 32 x 32 blocks.
#include "kvfuse/detail/cpu_amx.hpp"

#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "../support/model_path.hpp"
#include "../support/test_util.hpp"

// Each unit test file lives in its own namespace: the files are compiled together (a unity build).
namespace unit_cpu_amx {

namespace d = kvfuse::detail;
using kvfuse::bf16;

bool same_bits(bf16 a, bf16 b) { return a.bits == b.bits; }

// A's layout for gemm_bf16: m rows a [m][k] rounded (amx_round_row), then zero rows up to a multiple of 16.
std::vector<bf16> amx_rows(const float* a, std::int64_t m, std::int64_t k) {
  const std::int64_t kp = d::amx_padded_k(k);
  std::vector<bf16> out(static_cast<std::size_t>(d::amx_padded_rows(m) * kp));
  for (std::int64_t i = 0; i < m; ++i) d::amx_round_row(a + i * k, k, out.data() + i * kp);
  return out;
}

TEST_CASE("amx_round_row gives to_bf16's bits (ties to even, subnormals, infinities, NaN) and zeros up to 32 values") {
  std::vector<float> in = {1.0f, -2.5f, 1.00390625f /* a tie: stays 1 */, 1.01171875f /* a tie: rounds up */,
                           std::numeric_limits<float>::denorm_min(), -std::numeric_limits<float>::min(),
                           std::numeric_limits<float>::max(), -std::numeric_limits<float>::infinity(),
                           std::numeric_limits<float>::quiet_NaN(), 0.0f, -0.0f, 3.0e-39f};
  std::mt19937 rng(3);
  const std::vector<float> more = kvfuse_test::random_floats(37, rng);
  in.insert(in.end(), more.begin(), more.end());  // 49 values: three SIMD groups of 16 and a scalar tail
  const auto k = static_cast<std::int64_t>(in.size());
  REQUIRE(d::amx_padded_k(k) == 64);
  std::vector<bf16> out(64, bf16{0x1234});
  d::amx_round_row(in.data(), k, out.data());
  for (std::int64_t p = 0; p < k; ++p) {
    CAPTURE(p);
    CHECK(same_bits(out[static_cast<std::size_t>(p)], kvfuse::to_bf16(in[static_cast<std::size_t>(p)])));
  }
  for (std::int64_t p = k; p < 64; ++p) CHECK(out[static_cast<std::size_t>(p)].bits == 0);
  CHECK(out[2].bits == 0x3f80);  // 1 + 2^-8 halfway between 1 and 1 + 2^-7: to the even one
  CHECK(out[3].bits == 0x3f82);  // 1 + 3 * 2^-8 halfway between 1 + 2^-7 and 1 + 2^-6: to the even one
}

TEST_CASE("amx_pack_transposed puts B[p][j] = S[j][p] at AMX's pairs of k (tile p / 32, row p % 32 / 2, column "
          "2j + p % 2), zeros past n and k") {
  for (const std::int64_t n : {1, 16, 21, 40}) {
    for (const std::int64_t k : {2, 32, 45, 96}) {
      CAPTURE(n);
      CAPTURE(k);
      const std::int64_t ld = k + 3;
      std::vector<float> s(static_cast<std::size_t>(n * ld));
      for (std::size_t i = 0; i < s.size(); ++i) s[i] = static_cast<float>(i % 251) + 1.0f;  // exact in bf16
      std::vector<bf16> panels(static_cast<std::size_t>(d::amx_packed_size(k, n)), bf16{0x7777});
      std::vector<bf16> scratch(static_cast<std::size_t>(d::amx_pack_scratch(k)));
      d::amx_pack_transposed(s.data(), ld, n, k, panels.data(), scratch.data());
      const std::int64_t kp = d::amx_padded_k(k);
      const std::int64_t columns = (n + 15) / 16 * 16;
      int wrong = 0;
      for (std::int64_t j = 0; j < columns; ++j) {
        for (std::int64_t p = 0; p < kp; ++p) {
          const std::int64_t at = j / 16 * 16 * kp + p / 32 * 512 + p % 32 / 2 * 32 + 2 * (j % 16) + p % 2;
          const float want = j < n && p < k ? s[static_cast<std::size_t>(j * ld + p)] : 0.0f;
          wrong += kvfuse::to_float(panels[static_cast<std::size_t>(at)]) != want;
        }
      }
      CHECK(wrong == 0);
    }
  }
}

TEST_CASE("gemm_bf16 sums the bf16-rounded products in fp32 (within fp32 rounding of a double sum), each row the "
          "same bits alone as in a batch and by column ranges, for every edge of the 32 x 32 blocks") {
  if (!d::cpu_uses_amx()) {
    kvfuse_test::skip("this CPU (or kernel) has no AMX-BF16: the bf16 product cannot run here");
    return;
  }
  std::mt19937 rng(17);
  int compared = 0;
  for (const std::int64_t m : {1, 2, 15, 16, 17, 31, 32, 33, 64, 70}) {
    for (const std::int64_t k : {1, 31, 32, 64, 100, 576}) {
      for (const std::int64_t n : {1, 15, 16, 17, 32, 33, 48, 100}) {
        CAPTURE(m);
        CAPTURE(k);
        CAPTURE(n);
        const std::vector<float> a = kvfuse_test::random_floats(static_cast<std::size_t>(m * k), rng);
        const std::vector<float> w = kvfuse_test::random_floats(static_cast<std::size_t>(n * k), rng);
        const std::vector<bf16> rows = amx_rows(a.data(), m, k);
        std::vector<bf16> panels(static_cast<std::size_t>(d::amx_packed_size(k, n)));
        std::vector<bf16> scratch(static_cast<std::size_t>(d::amx_pack_scratch(k)));
        d::amx_pack_transposed(w.data(), k, n, k, panels.data(), scratch.data());
        const std::int64_t ldc = n + 3;  // columns past n must stay untouched
        std::vector<float> c(static_cast<std::size_t>(m * ldc), 777.0f);
        REQUIRE(d::gemm_bf16(rows.data(), m, k, panels.data(), n, c.data(), ldc));
        const auto rounded = [](const std::vector<float>& v) {
          std::vector<double> r(v.size());
          for (std::size_t i = 0; i < v.size(); ++i) r[i] = kvfuse::to_float(kvfuse::to_bf16(v[i]));
          return r;
        };
        const std::vector<double> ra = rounded(a), rw = rounded(w);
        double worst = 0.0;
        for (std::int64_t i = 0; i < m; ++i) {
          for (std::int64_t j = 0; j < n; ++j) {
            double sum = 0.0, magnitude = 0.0;
            for (std::int64_t p = 0; p < k; ++p) {
              const double x = ra[static_cast<std::size_t>(i * k + p)] * rw[static_cast<std::size_t>(j * k + p)];
              sum += x;
              magnitude += std::fabs(x);
            }
            // k fp32 additions: each rounds by at most 2^-24 of a partial sum bounded by the magnitude.
            const double error = std::fabs(sum - c[static_cast<std::size_t>(i * ldc + j)]);
            worst = std::max(worst, error / (static_cast<double>(k) * std::ldexp(magnitude, -24) + 1e-30));
          }
          for (std::int64_t j = n; j < ldc; ++j) CHECK(c[static_cast<std::size_t>(i * ldc + j)] == 777.0f);
        }
        CHECK(worst <= 1.0);
        // Every row alone (its own padded tile) gives the bits it got in the batch.
        int differ = 0;
        std::vector<float> one(static_cast<std::size_t>(n));
        for (std::int64_t i = 0; i < m; ++i) {
          const std::vector<bf16> row = amx_rows(a.data() + i * k, 1, k);
          REQUIRE(d::gemm_bf16(row.data(), 1, k, panels.data(), n, one.data(), n));
          differ += std::memcmp(one.data(), c.data() + i * ldc, static_cast<std::size_t>(n) * sizeof(float)) != 0;
        }
        CHECK(differ == 0);
        // Column ranges of 32 (the engine's tasks: panels + c0 * kp, C's columns from c0) give the same bits too.
        std::vector<float> split(c.size(), 777.0f);
        for (std::int64_t c0 = 0; c0 < n; c0 += 32) {
          const bf16* columns = panels.data() + c0 * d::amx_padded_k(k);
          REQUIRE(d::gemm_bf16(rows.data(), m, k, columns, std::min<std::int64_t>(32, n - c0), split.data() + c0, ldc));
        }
        CHECK(split == c);
        ++compared;
      }
    }
  }
  CHECK(compared == 480);
}

}  // namespace unit_cpu_amx
