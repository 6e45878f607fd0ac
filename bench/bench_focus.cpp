// Focused-chunk detection (Cache-Craft Algorithm 1) over 30 layers for 10 chunks, the per-request host
// cost of deciding when to stop recomputing unfocused chunks; plus the eq. 16 / Algorithm 2 preload plan.
#include <benchmark/benchmark.h>

#include <cstddef>
#include <random>
#include <span>
#include <vector>

#include "kvfuse/schedule/preload_planner.hpp"
#include "kvfuse/select/focused_chunk_detector.hpp"

namespace {

constexpr std::size_t kLayers = 30;  // SmolLM2-135M depth
constexpr std::size_t kChunks = 10;  // MuSiQue: 10 passages per question

// Per-layer question -> chunk attention mass, row-major [layer][chunk]; each row sums to 1. Chunks 2,
// 5 and 7 get extra mass (focused), on top of uniform noise.
std::vector<float> make_attention(unsigned seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> noise(0.0f, 1.0f);
  std::vector<float> attn(kLayers * kChunks);
  for (std::size_t l = 0; l < kLayers; ++l) {
    float sum = 0.0f;
    for (std::size_t c = 0; c < kChunks; ++c) {
      float a = noise(rng);
      if (c == 2 || c == 5 || c == 7) a += 2.0f;
      attn[l * kChunks + c] = a;
      sum += a;
    }
    for (std::size_t c = 0; c < kChunks; ++c) attn[l * kChunks + c] /= sum;
  }
  return attn;
}

// Runs the detector until it is final; `window` = 31 > 30 layers forces all 30 layers (worst case).
void run_detection(benchmark::State& state, std::size_t window) {
  const std::vector<float> attn = make_attention(42);
  std::size_t layers = 0;
  for (auto _ : state) {
    kvfuse::FocusedChunkDetector detector(kChunks, kLayers, kvfuse::FocusedChunkConfig{window});
    for (std::size_t l = 0; l < kLayers; ++l) {
      if (detector.observe(l, std::span<const float>(attn.data() + l * kChunks, kChunks))) break;
    }
    layers = detector.layers_observed();
    benchmark::DoNotOptimize(detector.decision().cutoff_layer);
  }
  state.counters["layers"] = static_cast<double>(layers);
  state.counters["layers/s"] =
      benchmark::Counter(static_cast<double>(layers) * static_cast<double>(state.iterations()),
                         benchmark::Counter::kIsRate);
}

void BM_FocusedChunkDetector_DefaultWindow(benchmark::State& state) { run_detection(state, 5); }
void BM_FocusedChunkDetector_All30Layers(benchmark::State& state) { run_detection(state, kLayers + 1); }

void BM_PreloadPlanner_Plan32Layers(benchmark::State& state) {
  const kvfuse::PreloadPlanner planner(kvfuse::PreloadConfig{32, 1.0, 4.0});
  for (auto _ : state) {
    kvfuse::PreloadPlan plan = planner.plan();
    benchmark::DoNotOptimize(plan.makespan);
  }
}

}  // namespace

BENCHMARK(BM_FocusedChunkDetector_DefaultWindow);
BENCHMARK(BM_FocusedChunkDetector_All30Layers);
BENCHMARK(BM_PreloadPlanner_Plan32Layers);
