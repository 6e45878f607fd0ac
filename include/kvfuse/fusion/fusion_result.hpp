#pragma once
// What FusionPipeline (fusion/fusion_pipeline.hpp) returns for one request, and how it loads stored chunk KV:
// FusionResult with its timings (FusionTimings) and load trace (LoadTrace, LayerLoadTiming), and LoadConfig.

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "kvfuse/core/error.hpp"
#include "kvfuse/fusion/fusion_method.hpp"
#include "kvfuse/schedule/loading_controller.hpp"
#include "kvfuse/select/focused_chunk_detector.hpp"

namespace kvfuse {

namespace detail {

[[nodiscard]] inline double ms_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace detail

// Online time of one run, split by step; ttft_ms() is their sum. With layer-pipelined loading the layer reads,
// installs and shifts happen during the prefill: load_ms is then the entries' headers (describe) and
// prefill_ms includes what the per-layer trace (FusionResult::load) splits out.
struct FusionTimings {
  double plan_ms = 0.0;           // hash the chunks, look up the store's index and Cache-Craft's variants
  double load_ms = 0.0;           // bring stored chunk KV in (store get, checks, copy into the prompt's KV)
  double shift_ms = 0.0;          // RoPE shift of loaded K to this prompt's positions
  double chunk_compute_ms = 0.0;  // isolated chunk caches recomputed because the store had none usable
  double prefill_ms = 0.0;        // the partial prefill, up to the first token's logits

  [[nodiscard]] double ttft_ms() const noexcept {
    return plan_ms + load_ms + shift_ms + chunk_compute_ms + prefill_ms;
  }
};

// How FusionPipeline brings stored chunk KV in.
struct LoadConfig {
  // Layer-pipelined loading (fusion_pipeline.hpp's header comment); needs a LayerwiseFusionBackend and a
  // RangedKVStore, and is off for other pairs. false: every block whole before layer 0.
  bool layerwise = true;
  // L_p, the layers read before layer 0 computes (Cache-Craft eq. 16). 0: from PreloadPlanner on measured times.
  std::int64_t preload_depth = 0;
  // A layer that has not arrived this long after the engine asked for it fails the entry being read (it is
  // computed instead). 0: wait as long as the store takes. A read in flight cannot be cancelled: the run returns
  // once it does, so a store's own timeout bounds a stalled read (one that never returns blocks the run).
  double layer_timeout_ms = 0.0;

  void validate() const {
    detail::require(preload_depth >= 0, "LoadConfig: preload_depth = {} must be >= 0", preload_depth);
    detail::require_finite_nonneg(layer_timeout_ms, "LoadConfig: layer_timeout_ms");
  }
};

// One layer of a layer-pipelined prefill. Times in ms.
struct LayerLoadTiming {
  double read_ms = 0.0;     // I/O thread: reading this layer of every entry (store time)
  double wait_ms = 0.0;     // engine thread: waiting for it in the hook, i.e. load time visible in TTFT
  double install_ms = 0.0;  // engine thread: load_layer_rows and shift_layer_rows
  double compute_ms = 0.0;  // engine thread: the layer's compute (hook to next hook, without the policy)
  double policy_ms = 0.0;   // engine thread: the method's policy choosing S_{l+1} after this layer

  // Read time hidden behind compute.
  [[nodiscard]] double hidden_ms() const noexcept { return read_ms > wait_ms ? read_ms - wait_ms : 0.0; }
};

// What the loading of one run did.
struct LoadTrace {
  bool layerwise = false;                 // layer-pipelined loading ran (some entry was read per layer)
  std::int64_t depth = 0;                 // L_p used
  bool depth_from_measurement = false;    // L_p from PreloadPlanner on measured times (else configured, or 1)
  double estimated_load_ms_per_layer = 0.0;     // eq. 16's T_load, when measured
  double estimated_compute_ms_per_layer = 0.0;  // eq. 16's T_prefill, when measured
  std::int64_t restarts = 0;              // prefills run again after a layer read failed or timed out
  std::vector<std::string> failures;      // why, one per failed entry
  std::vector<LayerLoadTiming> layers;    // of the prefill that produced the result

  [[nodiscard]] double wait_ms() const noexcept {
    double t = 0.0;
    for (const LayerLoadTiming& l : layers) t += l.wait_ms;
    return t;
  }
  [[nodiscard]] double read_ms() const noexcept {
    double t = 0.0;
    for (const LayerLoadTiming& l : layers) t += l.read_ms;
    return t;
  }
};

struct FusionResult {
  FusionPlan plan;
  std::vector<float> logits;                     // of the last prompt token (the prompt's KV is in the engine)
  std::vector<std::int64_t> selected_per_layer;  // |S_l|
  double recompute_fraction = 0.0;               // sum_l |S_l| / (L · n)
  FusionTimings time;
  std::int64_t rejected_entries = 0;             // planned store entries that were missing or unusable
  std::vector<std::string> put_failures;         // recomputed isolated caches the store failed to take back: why
  // Cache-Craft with focus termination, once Algorithm 1 decided: L* and F* as layout chunk indices among the
  // candidate chunks (variants with tokens to fix); other chunks are not subject to early termination.
  std::optional<FocusDecision> focus;
  LoadTrace load;
  // CacheBlend with its loading controller (cacheblend@auto), once speeds were measured: CacheBlend §5.1's
  // decision for this request (the ratio the run used is decision.ratio).
  std::optional<RatioDecision> controller;
  // On a MeasuredTierStore (TieredKVStore), once speeds were measured: CacheBlend §5.1's device choice at this
  // request's recompute ratio — the cheapest tier that loads a layer no slower than the request recomputes one;
  // the store places new entries there (none fits: every tier).
  std::optional<DeviceDecision> tier;
};

}  // namespace kvfuse
