#pragma once
// QueryProbeSelector: which reused rows QueryProbe's second pass recomputes, from the query's attention on every
// layer of its probe pass.
//
// Inspiration. ProphetKV (2026) recomputes the tokens the user query needs rather than the globally salient ones
// ("crowding-out": salient but query-irrelevant tokens fill a KV-deviation budget), with a dual-stage pipeline
// that fuses the query's layer-wise attention into one set. This is kvfuse's reading of that idea, not a
// reimplementation of the paper: the probe pass is naive reuse (the reused rows as stored, the query and the
// chunks without cache computed), and on each layer l the engine reports the query's attention on every row
// (LayerReport::row_query_mass: the softmax weight the query rows put on row t, summed over them and over the
// query heads; without the window on a sliding-window layer).
//
// Fusion. Per layer, the candidates' masses are divided by their sum over the candidates, so that every layer
// weighs the same whatever share the query rows keep for themselves or the computed rows; a token's score is the
// mean of those shares over the layers:
//     score(t) = (1 / L) · Σ_l  w_l(t) / Σ_{c ∈ candidates} w_l(c)
// A layer whose candidates get no weight at all adds nothing. QueryAwareSelector, by contrast, sees the
// query's attention on CacheBlend's check layers 1-3 only, where the question attends mostly to what is near it.
//
// Selection. The keep_count(r, |candidates|) candidates of highest score (detail::ranks_before: ties to the
// lower row, NaN first: a corrupt row is recomputed, not kept).

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <span>
#include <utility>
#include <vector>

#include "kvfuse/core/error.hpp"
#include "kvfuse/core/types.hpp"
#include "kvfuse/detail/math.hpp"

namespace kvfuse {

class QueryProbeSelector {
 public:
  // candidates: the reused rows the second pass may recompute (sorted); ratio: r in [0, 1].
  QueryProbeSelector(TokenSet candidates, double ratio, std::int64_t num_layers)
      : candidates_(std::move(candidates)), ratio_(ratio), num_layers_(num_layers),
        score_(candidates_.size(), 0.0) {
    detail::require(ratio >= 0.0 && ratio <= 1.0, "QueryProbeSelector: ratio {} is not in [0, 1]", ratio);
    detail::require(num_layers >= 1, "QueryProbeSelector: num_layers = {} must be >= 1", num_layers);
    detail::require(std::is_sorted(candidates_.begin(), candidates_.end()) &&
                        std::adjacent_find(candidates_.begin(), candidates_.end()) == candidates_.end(),
                    "QueryProbeSelector: the candidate rows are not sorted and distinct");
  }

  // One layer's LayerReport::row_query_mass (one value per row of the prompt).
  void observe(std::int64_t layer, std::span<const float> row_mass) {
    detail::require(layer == layers_seen_, "QueryProbeSelector: layer {} observed after {} layers", layer,
                    layers_seen_);
    detail::require(candidates_.empty() || (!row_mass.empty() && static_cast<std::int64_t>(row_mass.size()) >
                                                                     candidates_.back()),
                    "QueryProbeSelector: layer {} reported the query's attention on {} rows; candidate row {} "
                    "needs more (was the query mass asked for?)",
                    layer, row_mass.size(), candidates_.empty() ? 0 : candidates_.back());
    ++layers_seen_;
    double total = 0.0;
    for (std::int64_t t : candidates_) {
      const double w = row_mass[static_cast<std::size_t>(t)];
      if (w == w) total += w;  // NaN rows stay NaN in their own score, not in everyone's
    }
    if (!(total > 0.0)) return;
    for (std::size_t i = 0; i < candidates_.size(); ++i)
      score_[i] += static_cast<double>(row_mass[static_cast<std::size_t>(candidates_[i])]) / total /
                   static_cast<double>(num_layers_);
  }

  [[nodiscard]] std::int64_t layers_seen() const noexcept { return layers_seen_; }

  // The chosen rows, sorted: keep_count(r, |candidates|) of highest score.
  [[nodiscard]] TokenSet select() const {
    std::vector<std::size_t> order(candidates_.size());
    for (std::size_t i = 0; i < order.size(); ++i) order[i] = i;
    const auto keep = static_cast<std::size_t>(detail::keep_count(ratio_, static_cast<std::int64_t>(order.size())));
    detail::partition_top_k(std::span<std::size_t>(order), score_.data(), keep);
    TokenSet out;
    for (std::size_t i = 0; i < keep; ++i) out.push_back(candidates_[order[i]]);
    std::sort(out.begin(), out.end());
    return out;
  }

 private:
  TokenSet candidates_;
  double ratio_;
  std::int64_t num_layers_;
  std::vector<double> score_;  // per candidate: the mean over the layers seen of its share
  std::int64_t layers_seen_ = 0;
};

}  // namespace kvfuse
