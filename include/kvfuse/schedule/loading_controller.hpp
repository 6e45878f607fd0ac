#pragma once
// LoadingController: CacheBlend's choice of the recompute ratio and of the storage device for chunk caches
// (CacheBlend section 5.1 "Loading Controller", footnotes 5 and 6, Figure 10).
//
// What it does. CacheBlend pipelines the selective recompute of layer l with loading the KV cache of layer
// l + 1, so recompute adds no delay to time-to-first-token while it is not slower than loading one layer
// (section 5, "Basic insight"). Per layer, for a context of L tokens,
//   T_recompute(r)      = r * Prefill(LLM, L)                                   (footnote 5)
//   T_load(device)      = latency + PerTokenKVSize(LLM) * L / Throughput(device) (footnote 6, + latency)
// and the controller answers the two questions of section 5.1:
//   choose_ratio   for a fixed device: r = max(r*, r_match) with T_recompute(r_match) = T_load, capped at 1:
//                  recompute as much as the loading hides, never less than the quality floor r*;
//   choose_device  for a fixed ratio (default r*): the cheapest device with T_recompute >= T_load, i.e. the
//                  cheapest one that adds no delay. Ties go to the faster device, then to the earlier one.
//                  When no device fits the result says so (device empty) and names the fastest device;
//                  it does not throw, since "every tier is too slow" is an answer, not a bad input.
//
// When to use it. Before a blended prefill whose chunk caches sit on a tier slower than compute (CPU RAM,
// SSD, remote or cloud storage): feed choose_ratio's ratio into HKVDConfig::recompute_ratio. Offline, use
// choose_device to decide where to keep the caches. With every cache already in GPU memory loading is
// free and the answer is simply r*; Cake's BidirectionalLoader is the better tool when the choice is
// between loading a prefix cache and recomputing it, not selective recompute of fused chunks.
//
// Defaults. r* = 0.15, the minimal quality-preserving ratio (section 5.1: "we found r*% to be 15% from
// Figure 16"). Units: seconds, bytes, bytes per second; storage cost per GB = 10^9 bytes.

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "kvfuse/backend/concepts.hpp"
#include "kvfuse/core/error.hpp"

namespace kvfuse {

struct LoadingControllerConfig {
  double min_ratio = 0.15;  // r*: the minimal recompute ratio with negligible quality drop

  void validate() const {
    detail::require(min_ratio >= 0.0 && min_ratio <= 1.0, "LoadingControllerConfig: min_ratio {} is not in [0, 1]",
                    min_ratio);
  }
};

// One blended prefill as the delay estimators see it.
struct LoadingRequest {
  std::int64_t context_tokens = 0;          // L: tokens whose KV cache is loaded
  int num_layers = 1;                       // layers of the model (for the storage size)
  double kv_bytes_per_token_per_layer = 0;  // PerTokenKVSize(LLM) of one layer: K and V of all KV heads
  double prefill_seconds_per_layer = 0;     // Prefill(LLM, L) of one layer, profiled offline

  void validate() const {
    detail::require(context_tokens >= 0, "LoadingRequest: context_tokens {} is negative", context_tokens);
    detail::require(num_layers >= 1, "LoadingRequest: num_layers {} must be at least 1", num_layers);
    detail::require_finite_nonneg(kv_bytes_per_token_per_layer, "LoadingRequest: kv_bytes_per_token_per_layer");
    detail::require_finite_nonneg(prefill_seconds_per_layer, "LoadingRequest: prefill_seconds_per_layer");
  }

  // Bytes of KV cache loaded per layer: PerTokenKVSize(LLM) * L.
  [[nodiscard]] double kv_bytes_per_layer() const {
    return kv_bytes_per_token_per_layer * static_cast<double>(context_tokens);
  }
};

// T_recompute(r%, LLM, L) = r% * Prefill(LLM, L), per layer (CacheBlend footnote 5).
[[nodiscard]] inline double recompute_delay(const LoadingRequest& request, double ratio) {
  request.validate();
  detail::require(ratio >= 0.0 && ratio <= 1.0, "recompute_delay: ratio {} is not in [0, 1]", ratio);
  return ratio * request.prefill_seconds_per_layer;
}

// T_load(LLM, L, device) = latency + PerTokenKVSize(LLM) * L / Throughput(device), per layer
// (CacheBlend footnote 6, plus the device's fixed latency).
[[nodiscard]] inline double load_delay(const LoadingRequest& request, const StorageDevice& device) {
  request.validate();
  device.validate();
  return device.latency_s + request.kv_bytes_per_layer() / device.bandwidth_bytes_per_s;
}

// C_store(LLM, L, T, device): all layers of the context's KV cache at the device's price per GB.
[[nodiscard]] inline double storage_cost(const LoadingRequest& request, const StorageDevice& device) {
  request.validate();
  device.validate();
  return device.cost_per_gb * request.kv_bytes_per_layer() * static_cast<double>(request.num_layers) / 1e9;
}

struct RatioDecision {
  double load_seconds = 0;         // T_load of one layer on the device
  double matching_ratio = 0;       // largest r in [0, 1] with T_recompute(r) <= T_load
  double ratio = 0;                // max(r*, matching_ratio): the recompute ratio to use
  double recompute_seconds = 0;    // T_recompute(ratio)
  double extra_delay_seconds = 0;  // max(0, T_recompute(ratio) - T_load): delay per layer loading cannot hide
  bool loading_bound = false;      // true when loading is the bottleneck and the ratio rose above r*
};

struct DeviceOption {
  double load_seconds = 0;      // T_load of one layer
  double storage_cost = 0;      // C_store of the whole context
  bool no_extra_delay = false;  // T_load <= T_recompute(ratio)
};

struct DeviceDecision {
  double ratio = 0;                   // the fixed recompute ratio
  double recompute_seconds = 0;       // T_recompute(ratio)
  std::vector<DeviceOption> options;  // one per device, in the given order
  std::optional<std::size_t> device;  // cheapest device with no extra delay; empty when none has
  std::size_t fastest = 0;            // device with the lowest T_load (the fallback when none fits)
};

class LoadingController {
 public:
  explicit LoadingController(LoadingControllerConfig config = {}) : config_(config) { config_.validate(); }

  [[nodiscard]] const LoadingControllerConfig& config() const noexcept { return config_; }

  // Section 5.1, first question: the recompute ratio for a fixed storage device.
  [[nodiscard]] RatioDecision choose_ratio(const LoadingRequest& request, const StorageDevice& device) const {
    RatioDecision d;
    d.load_seconds = load_delay(request, device);
    // T_recompute(r) = r * Prefill is linear in r, so T_recompute(r_match) = T_load gives
    // r_match = T_load / Prefill; free recompute (Prefill = 0) hides under any loading: r_match = 1.
    const double prefill = request.prefill_seconds_per_layer;
    d.matching_ratio = prefill > 0.0 ? std::min(1.0, d.load_seconds / prefill) : 1.0;
    d.ratio = std::max(config_.min_ratio, d.matching_ratio);  // max(r%, r*%)
    d.recompute_seconds = recompute_delay(request, d.ratio);
    d.extra_delay_seconds = std::max(0.0, d.recompute_seconds - d.load_seconds);
    d.loading_bound = d.matching_ratio > config_.min_ratio;
    return d;
  }

  // Section 5.1, second question: the cheapest device that adds no delay at ratio r*.
  [[nodiscard]] DeviceDecision choose_device(const LoadingRequest& request,
                                             std::span<const StorageDevice> devices) const {
    return choose_device(request, devices, config_.min_ratio);
  }

  // The same for an explicit recompute ratio.
  [[nodiscard]] DeviceDecision choose_device(const LoadingRequest& request, std::span<const StorageDevice> devices,
                                             double ratio) const {
    detail::require(!devices.empty(), "LoadingController::choose_device: the device list is empty");
    detail::require(ratio >= 0.0 && ratio <= 1.0, "LoadingController::choose_device: ratio {} is not in [0, 1]",
                    ratio);
    DeviceDecision d;
    d.ratio = ratio;
    d.recompute_seconds = recompute_delay(request, ratio);
    for (std::size_t i = 0; i < devices.size(); ++i) {
      DeviceOption o;
      o.load_seconds = load_delay(request, devices[i]);
      o.storage_cost = storage_cost(request, devices[i]);
      o.no_extra_delay = o.load_seconds <= d.recompute_seconds;  // T_recompute >= T_load
      d.options.push_back(o);
    }
    for (std::size_t i = 0; i < devices.size(); ++i) {
      const DeviceOption& o = d.options[i];
      if (o.load_seconds < d.options[d.fastest].load_seconds) d.fastest = i;
      if (!o.no_extra_delay) continue;
      if (!d.device) {
        d.device = i;
        continue;
      }
      const DeviceOption& best = d.options[*d.device];
      if (o.storage_cost < best.storage_cost ||
          (o.storage_cost == best.storage_cost && o.load_seconds < best.load_seconds)) {
        d.device = i;
      }
    }
    return d;
  }

 private:
  LoadingControllerConfig config_;
};

}  // namespace kvfuse
