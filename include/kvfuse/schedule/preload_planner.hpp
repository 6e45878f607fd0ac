#pragma once
// PreloadPlanner — Cache-Craft's layer-wise preloading of chunk-caches (Cache-Craft section 3.4.2,
// eq. 16, Algorithm 2, Fig. 19). While the GPU computes layer l, the chunk-caches of later layers are
// loaded from host memory or SSD into an HBM read buffer. When loading a layer takes longer than
// computing one, loading only one layer ahead leaves the GPU waiting between layers; preloading L_p
// layers before the first layer runs lets the remaining L - L_p layers load during the computation of
// the first L - 1 layers, so the layers then run back to back:
//   L_p = max(1, (L - 1) (1 - T_prefill / T_load) + 1)          (eq. 16, Algorithm 2 line 1)
// The planner gives L_p and a plain-data timeline of Algorithm 2 (when each layer's load is issued,
// starts and finishes, and when its compute starts and finishes).
//
// When to use:
//   - Chunk-caches kept in a slower tier (CPU memory, SSD; section 3.5) and reused through a layer-wise
//     partial prefill. For SSD loads, which the paper measures at 0.59 s for 5 chunk-caches against
//     0.03 s from CPU memory (section 5.3.2), the depth matters most: preloading 24 of 32 layers cut the
//     SSD overhead from 0.27 s to 0.12 s there.
//   - Caches already in GPU memory: no loading, T_load = 0, L_p = 1; the planner is not needed.
//   - Loading at least as fast as computing (T_prefill >= T_load): L_p = 1, one layer ahead suffices.
//   - The read buffer must hold L_p + 1 layers of chunk-caches (Algorithm 2 lines 3-4 keep layers
//     i..i+L_p in flight). Where HBM is short, plan(depth) with a smaller depth shows the gaps it costs.
//   - initial_wait (the preloading before layer 0 runs) is what asynchronous preloading during the
//     queue wait (section 3.5) can hide; it is not part of this plan.
//
// Defaults:
//   - num_layers = 32: LLaMA-3-8B, the model of the preloading experiment (section 5.3.2, Fig. 29).
//   - compute_time_per_layer = load_time_per_layer = 0: no timing known, so L_p = 1, the paper's
//     baseline of loading layer l+1 while layer l computes.
//
// Decisions where the paper is silent:
//   - T_prefill and T_load are per layer. Eq. 16 uses only their ratio, so totals over all layers give
//     the same L_p; the timeline needs per-layer times.
//   - Eq. 16 is real-valued; the planner preloads ceil(L_p) layers, the fewest with no gaps
//     ((L - n) T_load <= (L - 1) T_prefill). The ceiling treats an L_p within a relative 1e-9 above an
//     integer as that integer (detail::tolerant_ceil), so floating-point noise in measured times does not
//     cost a whole layer of buffer: L = 10, T_prefill : T_load = 1 : 3 gives 7 (the eq. 16 expression
//     evaluates to 7.000000000000001), and L = 4, 0.3 : 0.9 gives 3 (3 * 0.3 < 0.9 in doubles). A
//     shortfall that small shows as a gap of ~1e-16 in the timeline.
//   - Timeline model: one load stream (layers in order, one at a time, T_load each) and one compute
//     stream (T_prefill each). Iteration i of Algorithm 2 begins when layer i-1 has been computed and
//     released (line 6) and issues the loads of layers i..min(i+L_p, L) (lines 3-4); a load starts
//     once issued and the previous load is done. Layer 0 computes once the first L_p layers are loaded
//     ("preload L_p layers", eq. 16); every later layer computes as soon as it is loaded and the
//     previous layer is done. Layers are 0-based. Fig. 19 (L = 5, 1 : 2, L_p = 3) comes out gap-free.
//   - Zero times are valid: T_load = 0 gives L_p = 1; T_prefill = 0 < T_load gives L_p = L.

#include <algorithm>
#include <cstddef>
#include <vector>

#include "kvfuse/core/error.hpp"
#include "kvfuse/detail/math.hpp"

namespace kvfuse {

struct PreloadConfig {
  std::size_t num_layers = 32;          // L
  double compute_time_per_layer = 0.0;  // T_prefill: prefill of C_miss chunks + recomputation in C_hit
  double load_time_per_layer = 0.0;     // T_load: loading one layer of the C_hit chunk-caches

  void validate() const {
    detail::require(num_layers >= 1, "PreloadConfig: num_layers = {} must be >= 1", num_layers);
    detail::require_finite_nonneg(compute_time_per_layer, "PreloadConfig: compute_time_per_layer");
    detail::require_finite_nonneg(load_time_per_layer, "PreloadConfig: load_time_per_layer");
  }
};

// One layer of the Algorithm 2 timeline. Times in the unit of the config's times, from 0.
struct PreloadLayerTiming {
  std::size_t layer = 0;      // 0-based
  double load_issue = 0.0;    // Algorithm 2 line 4 asks for this layer (start of its issuing iteration)
  double load_start = 0.0;
  double load_finish = 0.0;
  double compute_start = 0.0;
  double compute_finish = 0.0;
};

struct PreloadPlan {
  std::size_t depth = 1;          // L_p: layers loaded before layer 0 computes
  std::size_t buffer_layers = 1;  // HBM read buffer in layers: min(L_p + 1, L) (Algorithm 2 lines 3-4)
  std::vector<PreloadLayerTiming> layers;
  double initial_wait = 0.0;      // compute start of layer 0
  double gap_time = 0.0;          // sum of compute idle time between consecutive layers
  double makespan = 0.0;          // compute finish of the last layer
};

class PreloadPlanner {
 public:
  explicit PreloadPlanner(PreloadConfig config = {}) : config_(config) { config_.validate(); }

  [[nodiscard]] const PreloadConfig& config() const noexcept { return config_; }

  // Eq. 16 with Algorithm 2 line 1's max(1, .), real-valued.
  [[nodiscard]] double exact_depth() const {
    const double p = config_.compute_time_per_layer;
    const double t = config_.load_time_per_layer;
    if (t <= p) return 1.0;  // T_prefill >= T_load: one layer ahead (also covers T_load = 0)
    return std::max(1.0, static_cast<double>(config_.num_layers - 1) * (1.0 - p / t) + 1.0);
  }

  // ceil(exact_depth()): the fewest preloaded layers n with (L - n) T_load <= (L - 1) T_prefill. The ceiling
  // is detail::tolerant_ceil, which absorbs rounding of measured times (0.3 * 3 < 0.9 in doubles).
  [[nodiscard]] std::size_t depth() const {
    const auto layers = static_cast<double>(config_.num_layers);
    return static_cast<std::size_t>(std::clamp(detail::tolerant_ceil(exact_depth()), 1.0, layers));
  }

  // Algorithm 2 with L_p = depth().
  [[nodiscard]] PreloadPlan plan() const { return plan(depth()); }

  // Algorithm 2 with a given L_p in [1, L], e.g. one capped by the HBM read buffer.
  [[nodiscard]] PreloadPlan plan(std::size_t depth) const {
    const std::size_t L = config_.num_layers;
    detail::require(depth >= 1 && depth <= L, "PreloadPlanner: depth = {} must be in [1, num_layers = {}]", depth,
                    L);
    const double p = config_.compute_time_per_layer;
    const double t = config_.load_time_per_layer;

    PreloadPlan out;
    out.depth = depth;
    out.buffer_layers = std::min(depth + 1, L);
    out.layers.resize(L);
    std::vector<PreloadLayerTiming>& ls = out.layers;

    // Iteration i of Algorithm 2 begins once layer i-1 is computed and released (line 6).
    const auto iteration_begin = [&ls](std::size_t i) { return i == 0 ? 0.0 : ls[i - 1].compute_finish; };

    double load_free = 0.0;  // the load stream is busy until then
    std::size_t next_compute = 0;
    for (std::size_t j = 0; j < L; ++j) {
      PreloadLayerTiming& lj = ls[j];
      lj.layer = j;
      lj.load_issue = iteration_begin(j >= depth ? j - depth : 0);  // lines 2-4: iteration i issues i..i+L_p
      lj.load_start = std::max(lj.load_issue, load_free);
      lj.load_finish = lj.load_start + t;
      load_free = lj.load_finish;
      // Line 5: layer 0 waits for the L_p preloaded layers, later layers for their own load.
      // Every load issue above only needs computes of layers < j - L_p, already placed here.
      while (next_compute <= j && j + 1 >= depth) {
        PreloadLayerTiming& li = ls[next_compute];
        li.compute_start = next_compute == 0 ? ls[depth - 1].load_finish
                                             : std::max(ls[next_compute - 1].compute_finish, li.load_finish);
        li.compute_finish = li.compute_start + p;
        ++next_compute;
      }
    }

    out.initial_wait = ls.front().compute_start;
    for (std::size_t i = 1; i < L; ++i) out.gap_time += ls[i].compute_start - ls[i - 1].compute_finish;
    out.makespan = ls.back().compute_finish;
    return out;
  }

 private:
  PreloadConfig config_;
};

}  // namespace kvfuse
