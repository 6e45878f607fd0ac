// One HKVD selection step of CacheBlend's gradual filtering on the first check layer of a SmolLM2-135M-shaped
// model (3 KV heads x 64 dims): the per-token V deviation of every token, then the top-k selection.
#include <benchmark/benchmark.h>

#include <algorithm>
#include <cstdint>
#include <vector>

#include "kvfuse/detail/kv_deviation.hpp"
#include "kvfuse/select/hkvd_selector.hpp"

namespace {

constexpr std::int64_t kKVHeads = 3;
constexpr std::int64_t kHeadDim = 64;
constexpr std::int64_t kWidth = kKVHeads * kHeadDim;
constexpr std::int64_t kChunk = 512;  // passage length
constexpr std::int64_t kQuery = 64;

void BM_HKVDSelectStep(benchmark::State& state) {
  const std::int64_t n = state.range(0);
  std::vector<std::int64_t> chunks;
  for (std::int64_t left = n - kQuery; left > 0; left -= kChunk) chunks.push_back(std::min(left, kChunk));
  const kvfuse::HKVDSelector selector(kvfuse::HKVDConfig{}, kvfuse::PromptLayout::from_lengths(chunks, kQuery), 30);

  // Cached K/V uniform in [-1, 1), recomputed = cached + up to +-0.1 (a cheap LCG keeps set-up short).
  std::uint64_t seed = 42;
  const auto uniform = [&seed] {
    seed = seed * 6364136223846793005ull + 1442695040888963407ull;
    return static_cast<float>(seed >> 40) / static_cast<float>(1ull << 23) - 1.0f;
  };
  std::vector<float> cached(static_cast<std::size_t>(n * kWidth));
  std::vector<float> recomputed(cached.size());
  for (std::size_t i = 0; i < cached.size(); ++i) {
    cached[i] = uniform();
    recomputed[i] = cached[i] + 0.1f * uniform();
  }
  const kvfuse::TokenSet current = selector.initial();  // check layer 1 sees every token
  std::vector<float> deviation(current.size());

  for (auto _ : state) {
    kvfuse::detail::kv_deviation(recomputed, cached, kWidth, kKVHeads, kHeadDim, current, deviation);
    kvfuse::TokenSet next = selector.select(1, current, deviation);
    benchmark::DoNotOptimize(next.data());
    benchmark::ClobberMemory();
  }
  state.SetItemsProcessed(state.iterations() * n);
  state.SetBytesProcessed(state.iterations() * n * kWidth * 2 * static_cast<std::int64_t>(sizeof(float)));
}

}  // namespace

BENCHMARK(BM_HKVDSelectStep)->Arg(4096)->Arg(32768)->Arg(131072)->Unit(benchmark::kMicrosecond);
