// Cache-Craft metadata path: CCI profiling and scoring (sections 3.1-3.2.1) and variant lookup (section 3.3)
// for a SmolLM2-135M-like model (30 layers) and a 10-chunk RAG prompt.
#include <benchmark/benchmark.h>

#include <algorithm>
#include <cstdint>
#include <numeric>
#include <random>
#include <span>
#include <vector>

#include "kvfuse/cache/variant_cache.hpp"
#include "kvfuse/select/cci_scorer.hpp"

namespace {

constexpr std::size_t kChunks = 10;
constexpr std::size_t kLayers = 30;      // SmolLM2-135M
constexpr std::int64_t kChunkTokens = 128;
constexpr std::int64_t kVariants = 5;    // Cache-Craft M

// Random but causal chunk-level statistics of a 10-chunk prompt.
kvfuse::ChunkAttention synthetic_stats(std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<double> u(0.0, 1.0);
  kvfuse::ChunkAttention s;
  for (std::size_t i = 0; i < kChunks; ++i) {
    s.chunk_ids.push_back(1000 + i);
    s.chunk_sizes.push_back(kChunkTokens);
    std::vector<double> tokens(static_cast<std::size_t>(kChunkTokens));
    for (double& t : tokens) t = i == 0 ? 0.0 : u(rng);
    s.token_prefix_attention.push_back(std::move(tokens));
  }
  s.layer_mass.assign(kLayers, std::vector<double>(kChunks * kChunks, 0.0));
  for (auto& layer : s.layer_mass)
    for (std::size_t i = 0; i < kChunks; ++i)
      for (std::size_t j = 0; j <= i; ++j) layer[i * kChunks + j] = u(rng) * static_cast<double>(kChunkTokens);
  return s;
}

// The same chunk ids in a new order (a 100% hit with reordered chunks).
std::vector<std::uint64_t> shuffled_prompt(std::uint64_t seed) {
  std::vector<std::uint64_t> ids(kChunks);
  std::iota(ids.begin(), ids.end(), std::uint64_t{1000});
  std::mt19937_64 rng(seed);
  std::shuffle(ids.begin(), ids.end(), rng);
  return ids;
}

// Offline half: eq. 9-11 and the eq. 14 ranking for all 10 chunks over 30 layers.
void BM_CCIScorerProfile_10Chunks30Layers(benchmark::State& state) {
  const kvfuse::CCIScorer scorer;
  const auto stats = synthetic_stats(1);
  for (auto _ : state) benchmark::DoNotOptimize(scorer.profile(stats));
  state.SetItemsProcessed(state.iterations() * static_cast<std::int64_t>(kChunks));
}
BENCHMARK(BM_CCIScorerProfile_10Chunks30Layers);

// Online half: β, γ, β', CFO, N and the tokens for all 10 chunks behind a reordered prompt.
void BM_CCIScorerScore_10Chunks(benchmark::State& state) {
  const kvfuse::CCIScorer scorer;
  const auto profiles = scorer.profile(synthetic_stats(1));
  const auto prompt = shuffled_prompt(2);
  for (auto _ : state) benchmark::DoNotOptimize(scorer.score(profiles, prompt));
  state.SetItemsProcessed(state.iterations() * static_cast<std::int64_t>(kChunks));
}
BENCHMARK(BM_CCIScorerScore_10Chunks);

// Variant lookup: 10 chunks x M = 5 variants (from 5 differently ordered prompts); one lookup per chunk of
// a new reordered prompt, each scoring 5 variants and updating f_r.
void BM_VariantCacheLookup_10Chunks5Variants(benchmark::State& state) {
  const kvfuse::CCIScorer scorer;
  kvfuse::VariantCache cache;
  for (std::int64_t v = 0; v < kVariants; ++v) {
    const auto order = shuffled_prompt(100 + static_cast<std::uint64_t>(v));
    auto stats = synthetic_stats(10 + static_cast<std::uint64_t>(v));
    stats.chunk_ids = order;
    for (const auto& p : scorer.profile(stats))
      cache.insert(p, kvfuse::KVKey{1, p.chunk_id * 16 + static_cast<std::uint64_t>(v)});
  }
  const auto prompt = shuffled_prompt(7);
  for (auto _ : state) {
    for (std::size_t i = 0; i < kChunks; ++i)
      benchmark::DoNotOptimize(cache.lookup(prompt[i], std::span<const std::uint64_t>(prompt.data(), i), {1.0}));
  }
  state.SetItemsProcessed(state.iterations() * static_cast<std::int64_t>(kChunks));
}
BENCHMARK(BM_VariantCacheLookup_10Chunks5Variants);

}  // namespace
