#pragma once
// FusionPipeline's loading decisions from measured speeds (fusion/fusion_pipeline.hpp): the load and compute
// times per layer its last layer-pipelined run measured, and what they decide for the next request —
//   L_p         Cache-Craft eq. 16 (PreloadPlanner) on those times, scaled to the request's bytes and rows
//   r           CacheBlend §5.1's loading controller (cacheblend@auto): the ratio whose recompute of a layer takes
//               as long as loading it, never below r*
//   the tier    CacheBlend §5.1's device choice on a MeasuredTierStore: the cheapest tier that loads a layer no
//               slower than the request recomputes one; new entries go there

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <map>
#include <optional>
#include <span>
#include <string>
#include <variant>
#include <vector>

#include "kvfuse/fusion/fusion_method.hpp"
#include "kvfuse/fusion/fusion_result.hpp"
#include "kvfuse/schedule/loading_controller.hpp"
#include "kvfuse/schedule/preload_planner.hpp"

namespace kvfuse::detail {

class MeasuredLoad {
 public:
  // The engine's size: L and the bytes of one row of one layer of a stored block (a double: eq. 16's and §5.1's
  // estimates are real-valued).
  MeasuredLoad(std::int64_t num_layers, double kv_bytes_per_token_per_layer)
      : num_layers_(num_layers), kv_bytes_per_token_per_layer_(kv_bytes_per_token_per_layer) {}

  [[nodiscard]] bool valid() const noexcept { return valid_; }

  // L_p into trace (depth, depth_from_measurement and eq. 16's estimates): `configured` when > 0 (at most L),
  // else eq. 16 on this plan's `layer_bytes` per layer and rows once a run was measured, else 1.
  void choose_depth(const FusionPlan& plan, std::uint64_t layer_bytes, std::int64_t configured,
                    LoadTrace& trace) const {
    trace.depth = configured > 0 ? std::min(configured, num_layers_) : 1;
    trace.depth_from_measurement = configured == 0 && valid_;
    if (!trace.depth_from_measurement) return;
    trace.estimated_load_ms_per_layer = load_ms_per_byte_ * static_cast<double>(layer_bytes);
    // Rows per layer: |S_0| scaled by this method's mean |S_l| / |S_0| when it ran before; |S_0| otherwise (an
    // overestimate for methods that filter: it can only make L_p smaller, which costs waits between layers but
    // never the waiting up front for layers whose compute would have hidden them).
    const auto rows = rows_per_initial_.find(plan.method);
    trace.estimated_compute_ms_per_layer = compute_ms_per_row_ * static_cast<double>(plan.initial.size()) *
                                           (rows == rows_per_initial_.end() ? 1.0 : rows->second);
    trace.depth = static_cast<std::int64_t>(
        PreloadPlanner({static_cast<std::size_t>(num_layers_), trace.estimated_compute_ms_per_layer,
                        trace.estimated_load_ms_per_layer})
            .depth());
  }

  // After a layer-pipelined prefill of `plan` that read `layer_bytes` per layer and computed |S_l| rows on layer l:
  // the speeds of its reads and its compute, from the trace.
  void record(const FusionPlan& plan, const LoadTrace& trace, std::span<const std::int64_t> selected_per_layer,
              std::uint64_t layer_bytes) {
    double read = 0.0;
    double compute = 0.0;
    for (const LayerLoadTiming& t : trace.layers) {
      read += t.read_ms;
      compute += t.compute_ms;
    }
    std::int64_t rows = 0;
    for (std::int64_t sel : selected_per_layer) rows += sel;
    const auto layers = static_cast<double>(num_layers_);
    valid_ = true;
    load_ms_per_byte_ = read / (static_cast<double>(layer_bytes) * layers);
    compute_ms_per_row_ = compute / static_cast<double>(rows);
    rows_per_initial_[plan.method] = static_cast<double>(rows) / (layers * static_cast<double>(plan.initial.size()));
  }

  // CacheBlend §5.1: with the loading controller on and speeds measured, CacheBlend at the ratio whose recompute of
  // a layer takes as long as loading it (never below r*), from this plan's loaded tokens; the decision into
  // out.controller. Any other method, or nothing measured yet: `method` itself.
  [[nodiscard]] FusionMethod control(const FusionMethod& method, const FusionPlan& plan, FusionResult& out) const {
    const auto* blend = std::get_if<CacheBlend>(&method);
    if (blend == nullptr || !blend->loading_controller || !valid_ || !(load_ms_per_byte_ > 0.0)) return method;
    const StorageDevice device{"store", 0.0, 1e3 / load_ms_per_byte_, 0.0};
    out.controller = LoadingController({blend->config.recompute_ratio}).choose_ratio(loading_request(plan), device);
    CacheBlend chosen = with_recompute_ratio(*blend, out.controller->ratio);
    chosen.loading_controller = false;
    return chosen;
  }

  // CacheBlend §5.1's second question, once speeds were measured and every tier's read speed is known: the
  // cheapest of `tiers` that loads a layer of this request no slower than it recomputes one, at the request's
  // ratio (the r of CacheBlend's or QueryAware's gradual filtering, else |S_0| / n).
  [[nodiscard]] std::optional<DeviceDecision> choose_tier(const FusionMethod& method, const FusionPlan& plan,
                                                          const std::vector<StorageDevice>& tiers) const {
    if (!valid_) return std::nullopt;
    if (std::any_of(tiers.begin(), tiers.end(), [](const StorageDevice& d) { return d.bandwidth_bytes_per_s <= 0; }))
      return std::nullopt;  // a tier not measured yet
    const auto* blend = std::get_if<CacheBlend>(&method);
    const auto* aware = std::get_if<QueryAware>(&method);
    const double ratio = blend != nullptr   ? blend->config.recompute_ratio
                         : aware != nullptr ? aware->config.recompute_ratio
                                            : static_cast<double>(plan.initial.size()) /
                                                  static_cast<double>(plan.layout.num_tokens());
    return LoadingController({0.0}).choose_device(loading_request(plan), tiers, ratio);
  }

 private:
  // The request as CacheBlend §5.1's delay estimators see it: the tokens loaded, their bytes per layer, and
  // Prefill(LLM, L) of one layer (every row of the prompt) from the measured compute speed.
  [[nodiscard]] LoadingRequest loading_request(const FusionPlan& plan) const {
    LoadingRequest request;
    for (const ChunkPlan& c : plan.chunks)
      if (c.source != KVSource::compute) request.context_tokens += c.range.size();
    request.num_layers = static_cast<int>(num_layers_);
    request.kv_bytes_per_token_per_layer = kv_bytes_per_token_per_layer_;
    request.prefill_seconds_per_layer = compute_ms_per_row_ * static_cast<double>(plan.layout.num_tokens()) / 1e3;
    return request;
  }

  std::int64_t num_layers_;
  double kv_bytes_per_token_per_layer_;
  bool valid_ = false;
  double load_ms_per_byte_ = 0.0;    // of the last layer-pipelined run's reads
  double compute_ms_per_row_ = 0.0;  // per row computed on one layer, of the same run
  std::map<std::string, double> rows_per_initial_;  // per method name: mean |S_l| / |S_0| of its last run
};

}  // namespace kvfuse::detail
