#pragma once
// QueryAwareSelector: kvfuse's query-aware choice of the reused tokens to recompute -- the tokens the prompt's
// question attends to -- on CacheBlend's gradual-filtering schedule (HKVDSelector, CacheBlend section 4.3).
//
// Inspiration. ProphetKV (2026) reports 96-101 % of full-prefill accuracy at 20 % recompute by recomputing the
// tokens the query will attend to rather than those whose KV deviates most. This is kvfuse's variant of that
// idea, not a reimplementation of the paper: the query's attention is measured during the partial prefill
// itself, on CacheBlend's check layers, and feeds CacheBlend's budgets and schedule unchanged.
//
// What it does. Layer 0 computes every token, as CacheBlend does, so S_{l+1} ⊆ S_l holds from the first check
// on. On a check layer l the engine reports, per token of S_l, its query mass: the softmax weight the query
// rows (PromptLayout::query) put on it on layer l, summed over the query rows and over all query heads
// (LayerReport::query_mass, taken from the attention the layer computes anyway: |query| x n weights per head; on
// a sliding-window layer the engine computes those weights without the window, which would otherwise hide all
// but the last few hundred positions: Gemma 3's checks on layers 1-3 all fall on local layers).
// Each reusable token of S_l (a candidate: a token of a cached chunk) gets the score
//     s = λ · q / Σq + (1 − λ) · d / Σd
// with q its query mass, d its KV deviation (CacheBlend section 4.1) and the sums over the candidates. Each
// term is divided by its sum so that both are shares of 1 over the same tokens and λ weighs comparable
// quantities (the query mass of a layer sums to at most |query| · heads, the deviation has the units of the
// squared K or V). HKVDSelector then keeps the candidates of highest score with its budgets (detail::keep_count)
// and its order (detail::ranks_before: ties to the lower position, NaN first); the query and chunks without
// cache are mandatory, so the query rows and the last row always stay.
//
// Defaults and why.
//   - λ = 1 (the query mass alone): the idea this method exists for. λ = 0 ranks the deviation alone and is
//     CacheBlend's selection exactly: with one term left, dividing by a positive sum changes no order, so the
//     raw values are ranked (a float division could round two distinct deviations to one value and let the
//     position break a tie CacheBlend does not have).
//   - sums over the non-NaN values of the candidates; a sum of 0 (nothing attended, nothing deviates) leaves
//     the term 0. A NaN value stays NaN and an infinite one becomes NaN (∞ / ∞): the token ranks first, as a
//     corrupt row does in CacheBlend (it is recomputed, not kept).
//   - the schedule (r, check layers, margins) is HKVDConfig's: r = 0.15 and checks on layers 1, 2, 3.

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <span>
#include <utility>
#include <vector>

#include "kvfuse/core/error.hpp"
#include "kvfuse/core/prompt.hpp"
#include "kvfuse/select/hkvd_selector.hpp"

namespace kvfuse {

class QueryAwareSelector {
 public:
  // `query_weight` is λ in [0, 1].
  QueryAwareSelector(HKVDConfig config, PromptLayout layout, int num_layers, double query_weight = 1.0)
      : schedule_(std::move(config), std::move(layout), num_layers), query_weight_(query_weight) {
    detail::require(query_weight_ >= 0.0 && query_weight_ <= 1.0,
                    "QueryAwareSelector: query_weight (lambda) = {} is not in [0, 1]", query_weight_);
  }

  // The gradual-filtering schedule: check layers, keep counts, S_0, the set sizes per layer (HKVDPlan).
  [[nodiscard]] const HKVDSelector& schedule() const noexcept { return schedule_; }
  [[nodiscard]] double query_weight() const noexcept { return query_weight_; }
  // The inputs select reads on a check layer (the other may be empty).
  [[nodiscard]] bool reads_query_mass() const noexcept { return query_weight_ > 0.0; }
  [[nodiscard]] bool reads_deviation() const noexcept { return query_weight_ < 1.0; }

  // The score of each entry of `current` (see the header comment); 0 for the mandatory entries. query_mass[i]
  // and deviation[i] belong to current[i]; an input select does not read is not read here either (it may be
  // empty). The candidates' values must be >= 0 or NaN.
  [[nodiscard]] std::vector<float> scores(const TokenSet& current, std::span<const float> query_mass,
                                          std::span<const float> deviation) const {
    std::vector<float> out(current.size(), 0.0f);
    if (!reads_deviation() || !reads_query_mass()) {  // one term: its raw values (see the header comment)
      const std::span<const float> term = reads_query_mass() ? query_mass : deviation;
      (void)weight_of(current, term, reads_query_mass() ? "query mass" : "deviation", 1.0);
      for (std::size_t i = 0; i < current.size(); ++i)
        if (schedule_.is_reusable(current[i])) out[i] = term[i];
      return out;
    }
    const double q = weight_of(current, query_mass, "query mass", query_weight_);
    const double d = weight_of(current, deviation, "deviation", 1.0 - query_weight_);
    for (std::size_t i = 0; i < current.size(); ++i)
      if (schedule_.is_reusable(current[i])) out[i] = static_cast<float>(q * query_mass[i] + d * deviation[i]);
    return out;
  }

  // S_{l+1} from S_l = `current`: on a check layer the mandatory tokens of `current` and its
  // schedule().keep_count(layer) candidates of highest score; on other layers `current`, nothing read.
  [[nodiscard]] TokenSet select(int layer, const TokenSet& current, std::span<const float> query_mass,
                                std::span<const float> deviation) const {
    if (!schedule_.is_check_layer(layer)) return schedule_.select(layer, current, {});
    return schedule_.select(layer, current, scores(current, query_mass, deviation));
  }

 private:
  // Checks one input over `current` and returns weight / (the sum of its candidates' non-NaN values), 0 when
  // that sum is 0.
  [[nodiscard]] double weight_of(const TokenSet& current, std::span<const float> term, const char* name,
                                 double weight) const {
    detail::require(term.size() == current.size(), "QueryAwareSelector: {} {} values for a set of {} tokens",
                    term.size(), name, current.size());
    double sum = 0.0;
    for (std::size_t i = 0; i < current.size(); ++i) {
      if (!schedule_.is_reusable(current[i])) continue;
      detail::require(!(term[i] < 0.0f), "QueryAwareSelector: {} {} of token {} (entry {}) is negative", name, term[i],
                      current[i], i);
      if (!std::isnan(term[i])) sum += term[i];
    }
    return sum > 0.0 ? weight / sum : 0.0;
  }

  HKVDSelector schedule_;
  double query_weight_;
};

}  // namespace kvfuse
