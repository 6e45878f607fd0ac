// The AVX-512 matrix product (detail/cpu_kernels.hpp, avx512::gemm_packed) against the AVX2 one: bit for bit,
// for every tile height and one or two panels, so that a machine with AVX-512 computes the same KV and logits as
// one without. Its own file so that a CPU without AVX-512 reports this test Skipped and nothing else.
#include "kvfuse/detail/cpu_kernels.hpp"

#include <doctest/doctest.h>

#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "../support/model_path.hpp"
#include "../support/test_util.hpp"

// Each unit test file lives in its own namespace: the files are compiled together (a unity build).
namespace unit_cpu_kernels_avx512 {

namespace d = kvfuse::detail;

TEST_CASE("avx512 gemm_packed is bit-identical to avx2's for every tile height, one or two panels, an ldc past n, "
          "a panel_stride, wider panels") {
#if KVFUSE_CPU_DISPATCH_AVX2
  if (!d::cpu_uses_avx512()) {
    kvfuse_test::skip("this CPU has no AVX-512F (or no AVX2 + FMA): the avx512 product cannot run here");
    return;
  }
  std::mt19937 rng(11);
  int compared = 0;
  // m: every remainder of the 8-row tile, several 64-row blocks; n: partial, whole and odd panel counts.
  for (const std::int64_t m : {1, 2, 3, 4, 5, 6, 7, 8, 9, 15, 17, 63, 64, 65, 130}) {
    for (const std::int64_t k : {1, 8, 33, 64, 576}) {
      for (const std::int64_t n : {1, 15, 16, 17, 31, 32, 33, 48, 100}) {
        const std::vector<float> a = kvfuse_test::random_floats(static_cast<std::size_t>(m * k), rng);
        const std::vector<float> b = kvfuse_test::random_floats(static_cast<std::size_t>(k * n), rng);
        std::vector<float> panels(static_cast<std::size_t>(d::packed_size(k, n)));
        d::pack_rows(b.data(), n, k, n, panels.data());
        const std::int64_t ldc = n + 5;  // columns past n must stay untouched
        std::vector<float> wide(static_cast<std::size_t>(m * ldc), 777.0f);
        std::vector<float> narrow(wide.size(), 777.0f);
        d::avx512::gemm_packed(a.data(), k, m, k, panels.data(), n, wide.data(), ldc);
        d::avx2::gemm_packed(a.data(), k, m, k, panels.data(), n, narrow.data(), ldc);
        INFO("m " << m << " k " << k << " n " << n);
        CHECK(std::memcmp(wide.data(), narrow.data(), wide.size() * sizeof(float)) == 0);
        // The same B as the first k rows of panels packed for k + 3 rows (gemm_packed's panel_stride).
        std::vector<float> b_longer(b);
        b_longer.resize(static_cast<std::size_t>((k + 3) * n), 5.0f);
        std::vector<float> longer(static_cast<std::size_t>(d::packed_size(k + 3, n)));
        d::pack_rows(b_longer.data(), n, k + 3, n, longer.data());
        std::vector<float> strided(wide.size(), 777.0f);
        d::avx512::gemm_packed(a.data(), k, m, k, longer.data(), n, strided.data(), ldc, d::kPanelWidth * (k + 3));
        CHECK(std::memcmp(strided.data(), narrow.data(), wide.size() * sizeof(float)) == 0);
        // The same B as the first n columns of panels packed for n + 7 (their padding columns hold values).
        const std::vector<float> b_wider = kvfuse_test::widened(b, k, n, n + 7, 3.0f);
        std::vector<float> wider(static_cast<std::size_t>(d::packed_size(k, n + 7)));
        d::pack_rows(b_wider.data(), n + 7, k, n + 7, wider.data());
        std::vector<float> from_wider(wide.size(), 777.0f);
        d::avx512::gemm_packed(a.data(), k, m, k, wider.data(), n, from_wider.data(), ldc);
        CHECK(std::memcmp(from_wider.data(), narrow.data(), wide.size() * sizeof(float)) == 0);
        ++compared;
      }
    }
  }
  CHECK(compared == 15 * 5 * 9);
#else
  kvfuse_test::skip("not an x86-64 GCC / Clang build: no AVX-512 kernels");
#endif
}

}  // namespace unit_cpu_kernels_avx512
