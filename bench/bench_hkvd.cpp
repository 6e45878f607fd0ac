// One HKVD selection step of CacheBlend's gradual filtering on the first check layer of a SmolLM2-135M-shaped
// model (3 KV heads x 64 dims): the per-token V deviation of every token, then the top-k selection.
#include <benchmark/benchmark.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <vector>

#include "kvfuse/select/hkvd_selector.hpp"

namespace {

constexpr std::int64_t kKVHeads = 3;
constexpr std::int64_t kHeadDim = 64;
constexpr std::int64_t kWidth = kKVHeads * kHeadDim;
constexpr std::int64_t kChunk = 512;  // passage length
constexpr std::int64_t kQuery = 64;

struct Layer {
  kvfuse::HKVDSelector selector;
  std::vector<float> cached, recomputed;
  kvfuse::TokenSet current;
  std::vector<float> deviation;
};

Layer make_layer(std::int64_t n) {
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
  kvfuse::TokenSet current = selector.initial();  // check layer 1 sees every token
  std::vector<float> deviation(current.size());
  kvfuse::kv_deviation(recomputed, cached, kWidth, kKVHeads, kHeadDim, current, deviation);
  return {selector, std::move(cached), std::move(recomputed), std::move(current), std::move(deviation)};
}

void set_counters(benchmark::State& state, std::int64_t n) {
  state.SetItemsProcessed(state.iterations() * n);
  state.SetBytesProcessed(state.iterations() * n * kWidth * 2 * static_cast<std::int64_t>(sizeof(float)));
}

// The whole step: deviation of every token, then top-k (gradual filtering's first check).
void BM_HKVDSelectStep(benchmark::State& state) {
  Layer l = make_layer(state.range(0));
  for (auto _ : state) {
    kvfuse::kv_deviation(l.recomputed, l.cached, kWidth, kKVHeads, kHeadDim, l.current, l.deviation);
    kvfuse::TokenSet next = l.selector.select(1, l.current, l.deviation);
    benchmark::DoNotOptimize(next.data());
    benchmark::ClobberMemory();
  }
  set_counters(state, state.range(0));
}

// Baseline for the deviation part: memcpy of the same two K/V arrays (the machine's copy bandwidth).
void BM_CopySameBytes(benchmark::State& state) {
  Layer l = make_layer(state.range(0));
  std::vector<float> sink(l.cached.size());
  for (auto _ : state) {
    std::memcpy(sink.data(), l.cached.data(), sink.size() * sizeof(float));
    std::memcpy(sink.data(), l.recomputed.data(), sink.size() * sizeof(float));
    benchmark::DoNotOptimize(sink.data());
    benchmark::ClobberMemory();
  }
  set_counters(state, state.range(0));
}

// The selection part alone (top-k by nth_element, ties to the lower position).
void BM_HKVDSelectOnly(benchmark::State& state) {
  Layer l = make_layer(state.range(0));
  for (auto _ : state) {
    kvfuse::TokenSet next = l.selector.select(1, l.current, l.deviation);
    benchmark::DoNotOptimize(next.data());
  }
  state.SetItemsProcessed(state.iterations() * state.range(0));
}

// Baseline for the selection part: a full sort by (deviation desc, position asc), as a naive top-k does.
void BM_FullSortBaseline(benchmark::State& state) {
  Layer l = make_layer(state.range(0));
  std::vector<std::int64_t> order(l.current.size());
  for (auto _ : state) {
    std::copy(l.current.begin(), l.current.end(), order.begin());
    std::sort(order.begin(), order.end(), [&](std::int64_t a, std::int64_t b) {
      const float da = l.deviation[static_cast<std::size_t>(a)], db = l.deviation[static_cast<std::size_t>(b)];
      return da != db ? da > db : a < b;
    });
    benchmark::DoNotOptimize(order.data());
  }
  state.SetItemsProcessed(state.iterations() * state.range(0));
}

}  // namespace

BENCHMARK(BM_HKVDSelectStep)->Arg(4096)->Arg(32768)->Arg(131072)->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_CopySameBytes)->Arg(4096)->Arg(32768)->Arg(131072)->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_HKVDSelectOnly)->Arg(4096)->Arg(32768)->Arg(131072)->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_FullSortBaseline)->Arg(4096)->Arg(32768)->Arg(131072)->Unit(benchmark::kMicrosecond);
