// The CPU backend's packed matrix product (detail/cpu_kernels.hpp) in each of its versions on the shapes of a
// SmolLM2-135M prefill: 64 rows (one row block) times a projection's weights (576 -> 1536, 1536 -> 576, 576 ->
// 192) and one attention head's QK^T / PV over 700 keys. GFLOP/s in the counters; the avx2 / avx512 ratio of a
// run is the speed-up of the AVX-512 product (docs/cpu-backend.md). The avx512 cases report an error on a CPU
// without AVX-512F, the avx2 ones on a CPU without AVX2 + FMA. BM_GemmBf16: the bf16 product on AMX
// (detail/cpu_amx.hpp, CpuProducts::bf16) on the three projection shapes, its A rounded to bf16 in each iteration as
// CpuLlama's projections do (B packed once, as at construction); an error on a CPU without AMX-BF16.
#include <benchmark/benchmark.h>

#include <cstdint>
#include <random>
#include <vector>

#include "kvfuse/detail/cpu_amx.hpp"
#include "kvfuse/detail/cpu_kernels.hpp"

namespace {

namespace d = kvfuse::detail;

enum class Version { portable, avx2, avx512 };

void BM_GemmPacked(benchmark::State& state, Version version) {
  const std::int64_t m = state.range(0);
  const std::int64_t k = state.range(1);
  const std::int64_t n = state.range(2);
#if KVFUSE_CPU_DISPATCH_AVX2
  if ((version == Version::avx2 && !d::cpu_uses_avx2()) || (version == Version::avx512 && !d::cpu_uses_avx512())) {
    state.SkipWithError("this CPU lacks the instructions of this version");
    return;
  }
#else
  if (version != Version::portable) {
    state.SkipWithError("not an x86-64 GCC / Clang build");
    return;
  }
#endif
  std::mt19937 rng(5);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  std::vector<float> a(static_cast<std::size_t>(m * k));
  std::vector<float> b(static_cast<std::size_t>(k * n));
  for (float& x : a) x = u(rng);
  for (float& x : b) x = u(rng);
  std::vector<float> panels(static_cast<std::size_t>(d::packed_size(k, n)));
  d::pack_rows(b.data(), n, k, n, panels.data());
  std::vector<float> c(static_cast<std::size_t>(m * n));
  for (auto _ : state) {
    switch (version) {
      case Version::portable: d::portable::gemm_packed(a.data(), k, m, k, panels.data(), n, c.data(), n); break;
#if KVFUSE_CPU_DISPATCH_AVX2
      case Version::avx2: d::avx2::gemm_packed(a.data(), k, m, k, panels.data(), n, c.data(), n); break;
      case Version::avx512: d::avx512::gemm_packed(a.data(), k, m, k, panels.data(), n, c.data(), n); break;
#else
      default: break;
#endif
    }
    benchmark::DoNotOptimize(c.data());
    benchmark::ClobberMemory();
  }
  state.counters["GFLOP/s"] =
      benchmark::Counter(static_cast<double>(2 * m * k * n) * static_cast<double>(state.iterations()) * 1e-9,
                         benchmark::Counter::kIsRate);
}

void BM_GemmBf16(benchmark::State& state) {
  const std::int64_t m = state.range(0);
  const std::int64_t k = state.range(1);
  const std::int64_t n = state.range(2);
  if (!d::cpu_uses_amx()) {
    state.SkipWithError("this CPU (or kernel) has no AMX-BF16");
    return;
  }
  std::mt19937 rng(5);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  std::vector<float> a(static_cast<std::size_t>(m * k));
  std::vector<float> w(static_cast<std::size_t>(n * k));  // W [n][k]: y = x W^T
  for (float& x : a) x = u(rng);
  for (float& x : w) x = u(rng);
  const std::int64_t kp = d::amx_padded_k(k);
  std::vector<kvfuse::bf16> panels(static_cast<std::size_t>(d::amx_packed_size(k, n)));
  std::vector<kvfuse::bf16> scratch(static_cast<std::size_t>(d::amx_pack_scratch(k)));
  d::amx_pack_transposed(w.data(), k, n, k, panels.data(), scratch.data());
  std::vector<kvfuse::bf16> rows(static_cast<std::size_t>(d::amx_padded_rows(m) * kp));
  std::vector<float> c(static_cast<std::size_t>(m * n));
  for (auto _ : state) {
    for (std::int64_t i = 0; i < m; ++i) d::amx_round_row(a.data() + i * k, k, rows.data() + i * kp);
    d::gemm_bf16(rows.data(), m, k, panels.data(), n, c.data(), n);
    benchmark::DoNotOptimize(c.data());
    benchmark::ClobberMemory();
  }
  state.counters["GFLOP/s"] =
      benchmark::Counter(static_cast<double>(2 * m * k * n) * static_cast<double>(state.iterations()) * 1e-9,
                         benchmark::Counter::kIsRate);
}

void shapes(benchmark::internal::Benchmark* b) {
  b->ArgNames({"m", "k", "n"});
  b->Args({64, 576, 1536});  // ffn_gate / ffn_up
  b->Args({64, 1536, 576});  // ffn_down
  b->Args({64, 576, 192});   // k / v projections
  b->Args({64, 64, 700});    // QK^T, one head, 700 keys
  b->Args({64, 700, 64});    // PV
}

BENCHMARK_CAPTURE(BM_GemmPacked, portable, Version::portable)->Apply(shapes);
BENCHMARK_CAPTURE(BM_GemmPacked, avx2, Version::avx2)->Apply(shapes);
BENCHMARK_CAPTURE(BM_GemmPacked, avx512, Version::avx512)->Apply(shapes);
BENCHMARK(BM_GemmBf16)->ArgNames({"m", "k", "n"})->Args({64, 576, 1536})->Args({64, 1536, 576})->Args({64, 576, 192});

}  // namespace
