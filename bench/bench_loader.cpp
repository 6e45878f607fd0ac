// Cake loader scheduling cost: one whole virtual-time schedule (16K tokens, 800 kB/token, 32 Gbps),
// reported per scheduling step (a step is one compute or fetch chunk decision + completion), and one
// token-budget scheduling step with 64 decodes and 8 prefills.
#include <benchmark/benchmark.h>

#include <numeric>

#include "kvfuse/harness/simulated.hpp"
#include "kvfuse/schedule/bidirectional_loader.hpp"
#include "kvfuse/schedule/token_budget_scheduler.hpp"

namespace {

void BM_LoaderSchedule16K(benchmark::State& state) {
  const std::int64_t n = 16384, fetch = 128;
  std::vector<kvfuse::token_id> tokens(static_cast<std::size_t>(n));
  std::iota(tokens.begin(), tokens.end(), 0);
  const auto trace = kvfuse::ResourceTrace::constant(1.0, 32);
  kvfuse::SimulatedStore store({0.0, 800'000}, trace);
  const auto keys = kvfuse::prefix_chunk_keys(0x51u, tokens, fetch);
  for (const auto& key : keys) store.put(key, kvfuse::KVBlock{fetch, {}});
  const kvfuse::BidirectionalLoader<kvfuse::SimulatedCompute, kvfuse::SimulatedStore> loader(
      {512, fetch}, {0.0714, 0.00024, 0.0262});
  std::size_t steps = 0;
  for (auto _ : state) {
    kvfuse::SimulatedCompute compute({0.0714, 0.00024, 512}, trace);
    auto result = loader.run(compute, store, tokens);
    steps = result.steps.size();
    benchmark::DoNotOptimize(result);
  }
  state.counters["steps"] = static_cast<double>(steps);
  // Seconds per scheduling step, printed with a unit prefix (e.g. 2.5us).
  state.counters["time_per_step"] = benchmark::Counter(static_cast<double>(steps),
                                                       benchmark::Counter::kIsIterationInvariantRate |
                                                           benchmark::Counter::kInvert);
}
BENCHMARK(BM_LoaderSchedule16K)->Unit(benchmark::kMicrosecond);

void BM_TokenBudgetStep(benchmark::State& state) {
  std::vector<std::uint64_t> decodes(64);
  std::iota(decodes.begin(), decodes.end(), 0);
  std::vector<kvfuse::PrefillRequest> prefills;
  for (std::uint64_t i = 0; i < 8; ++i) prefills.push_back({100 + i, 300, i == 0});
  const kvfuse::TokenBudgetScheduler scheduler;
  for (auto _ : state) benchmark::DoNotOptimize(scheduler.plan_step(decodes, prefills));
}
BENCHMARK(BM_TokenBudgetStep);

}  // namespace
