#pragma once
// layer_schedule: what a fusion method does on each layer of the one loop, decided in one place for every
// method — the rows S_0 the first layer computes and the policy that turns layer l's report into S_{l+1}.
// Methods are dispatched by an exhaustive std::visit over FusionMethod: adding a method to the variant
// without a branch here does not compile.
//
//   FullRecompute   S_l = every token.
//   PrefixCaching   S_l = every token of the chunks without a usable prefix entry, and the query (fixed).
//   NaiveReuse      S_l = the query and chunks without a usable cache (fixed).
//   AttnLink        S_l = Epic's boundary tokens and the query (AttnLinkBoundary, Epic §4.2; fixed).
//   CacheCraft      S_l = per reused variant the eq. 14 tokens to fix, chunks to compute, the query; with
//                   focus termination, the tokens of chunks outside F* leave the set from layer L* on
//                   (FocusedChunkDetector, Cache-Craft §3.2.2, Algorithm 1: needs attention statistics).
//   CacheBlend      S_0 = every token; check layers keep the tokens of highest KV deviation, down to r
//                   (HKVDSelector, CacheBlend §4.3 gradual filtering: needs KV deviations).
//   QueryAware      S_0 = every token; check layers keep the tokens the query rows attend to most (mixed with
//                   the KV deviation when λ < 1), down to r on CacheBlend's schedule (QueryAwareSelector: needs
//                   the query mass, and KV deviations when λ < 1).
//   QueryProbe      two passes: S_l = the naive rows on every layer, reporting the query's attention on every
//                   row; then S_l = those rows and the reused rows QueryProbeSelector chose, on every layer
//                   (second_pass; needs the query mass).
// A schedule without `next` recomputes one fixed set on every layer: an engine that cannot change the set
// per layer or report deviations / statistics can still run it.

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <iterator>
#include <memory>
#include <optional>
#include <utility>
#include <variant>
#include <vector>

#include "kvfuse/core/error.hpp"
#include "kvfuse/core/prompt.hpp"
#include "kvfuse/core/types.hpp"
#include "kvfuse/fusion/fusion_method.hpp"
#include "kvfuse/fusion/layer_protocol.hpp"
#include "kvfuse/select/attnlink_boundary.hpp"
#include "kvfuse/select/focused_chunk_detector.hpp"
#include "kvfuse/select/hkvd_selector.hpp"
#include "kvfuse/select/query_aware_selector.hpp"
#include "kvfuse/select/query_probe_selector.hpp"

namespace kvfuse {

struct LayerSchedule {
  TokenSet initial;                // S_0, sorted; always holds the prompt's last token
  SelectionPolicy next;            // S_{l+1} from layer l's report; empty: S_l = S_0 on every layer
  bool needs_deviation = false;    // `next` reads LayerReport::k_deviation / v_deviation
  bool needs_attention = false;    // `next` reads LayerReport::attention (groups = the plan's layout)
  bool needs_query_mass = false;   // `next` reads LayerReport::query_mass (query = the plan's layout.query)
  // Cache-Craft focus termination: Algorithm 1's decision (L*, F* as layout chunk indices) once it is made.
  std::shared_ptr<std::optional<FocusDecision>> focus = std::make_shared<std::optional<FocusDecision>>();
  // QueryProbe: the rows of the second pass, set by `next` after the probe's last layer (empty when it chose no
  // row: nothing reused, or r = 0; the probe pass is then the result); null for one pass.
  std::shared_ptr<std::optional<TokenSet>> second_pass;

  // Whether one fixed set serves every layer (no per-layer feedback needed).
  [[nodiscard]] bool fixed_set() const noexcept { return !next; }
};

namespace detail {

template <class... F>
struct Overloaded : F... {
  using F::operator()...;
};
template <class... F>
Overloaded(F...) -> Overloaded<F...>;

// Every token of the chunks that are computed, the chunk-local tokens to fix of reused ones, and the query.
inline TokenSet computed_and_fixed_rows(const FusionPlan& plan) {
  TokenSet rows;
  for (const ChunkPlan& c : plan.chunks) {
    if (c.source == KVSource::compute) {
      append_range(rows, c.range);
    } else {
      for (std::int64_t t : c.recompute) rows.push_back(c.range.begin + t);
    }
  }
  append_range(rows, plan.layout.query);
  return rows;
}

inline TokenSet all_rows(const FusionPlan& plan) {
  TokenSet rows;
  append_range(rows, {0, plan.layout.num_tokens()});
  return rows;
}

// Cache-Craft §3.2.2: from L* on, the tokens of unfocused candidate chunks keep their (fixed so far) KV.
inline SelectionPolicy focus_termination(const FusionPlan& plan, const CacheCraft& craft, std::int64_t num_layers,
                                         const std::shared_ptr<std::optional<FocusDecision>>& focus) {
  std::vector<std::size_t> candidates;  // the chunks whose tokens are being fixed
  for (std::size_t j = 0; j < plan.chunks.size(); ++j)
    if (plan.chunks[j].source == KVSource::variant && !plan.chunks[j].recompute.empty()) candidates.push_back(j);
  if (candidates.empty()) return {};
  auto detector =
      std::make_shared<FocusedChunkDetector>(candidates.size(), static_cast<std::size_t>(num_layers), craft.focus);
  std::vector<TokenRange> ranges;
  for (const ChunkPlan& c : plan.chunks) ranges.push_back(c.range);
  return [detector, candidates, ranges, layout = plan.layout, focus](const LayerReport& r) -> TokenSet {
    detail::require(r.attention != nullptr, "Cache-Craft focus termination: layer {} reported no attention statistics",
                    r.layer);
    if (detector->is_final()) return r.selected;
    const std::vector<float> all = question_attention(*r.attention, r.selected, layout);  // eq. 15 term
    std::vector<float> mine;
    for (std::size_t j : candidates) mine.push_back(all[j]);
    if (!detector->observe(static_cast<std::size_t>(r.layer), mine)) return r.selected;
    const FocusDecision& d = detector->decision();
    *focus = FocusDecision{d.stabilised, {}, d.cutoff_layer};
    std::vector<TokenRange> dropped;
    for (std::size_t i = 0; i < candidates.size(); ++i) {
      if (std::binary_search(d.focused.begin(), d.focused.end(), i)) {
        (*focus)->focused.push_back(candidates[i]);
      } else {
        dropped.push_back(ranges[candidates[i]]);
      }
    }
    TokenSet next;
    for (std::int64_t t : r.selected) {
      const bool drop = std::any_of(dropped.begin(), dropped.end(), [t](TokenRange range) { return range.contains(t); });
      if (!drop) next.push_back(t);
    }
    return next;
  };
}

}  // namespace detail

// The schedule of `method` for a plan (its chunks' sources and layout with cached = source != compute) on a
// model of `num_layers` layers.
[[nodiscard]] inline LayerSchedule layer_schedule(const FusionPlan& plan, const FusionMethod& method,
                                                  std::int64_t num_layers) {
  detail::require(num_layers >= 1, "layer_schedule: num_layers = {} must be >= 1", num_layers);
  LayerSchedule s;
  std::visit(detail::Overloaded{
                 [&](const FullRecompute&) { s.initial = detail::all_rows(plan); },
                 [&](const PrefixCaching&) { s.initial = detail::computed_and_fixed_rows(plan); },
                 [&](const NaiveReuse&) { s.initial = detail::computed_and_fixed_rows(plan); },
                 [&](const AttnLink& link) { s.initial = AttnLinkBoundary(link.config).plan(plan.layout).tokens; },
                 [&](const CacheCraft& craft) {
                   s.initial = detail::computed_and_fixed_rows(plan);
                   if (craft.focus_termination) {
                     s.next = detail::focus_termination(plan, craft, num_layers, s.focus);
                     s.needs_attention = static_cast<bool>(s.next);
                   }
                 },
                 [&](const CacheBlend& blend) {
                   s.initial = detail::all_rows(plan);  // layer 0 computes every token (section 4.3)
                   detail::require(blend.rank_by == KVTensor::key || blend.rank_by == KVTensor::value,
                                   "CacheBlend::rank_by = {} is neither KVTensor::key nor KVTensor::value",
                                   static_cast<int>(blend.rank_by));
                   auto selector =
                       std::make_shared<HKVDSelector>(blend.config, plan.layout, static_cast<int>(num_layers));
                   const bool by_value = blend.rank_by == KVTensor::value;
                   s.next = [selector, by_value](const LayerReport& r) {  // gradual filtering
                     return selector->select(static_cast<int>(r.layer), r.selected,
                                             by_value ? r.v_deviation : r.k_deviation);
                   };
                   s.needs_deviation = true;
                 },
                 [&](const QueryAware& aware) {
                   s.initial = detail::all_rows(plan);  // layer 0 computes every token (CacheBlend §4.3)
                   detail::require(aware.rank_by == KVTensor::key || aware.rank_by == KVTensor::value,
                                   "QueryAware::rank_by = {} is neither KVTensor::key nor KVTensor::value",
                                   static_cast<int>(aware.rank_by));
                   auto selector = std::make_shared<QueryAwareSelector>(
                       aware.config, plan.layout, static_cast<int>(num_layers), aware.query_weight);
                   const bool by_value = aware.rank_by == KVTensor::value;
                   s.next = [selector, by_value](const LayerReport& r) {
                     return selector->select(static_cast<int>(r.layer), r.selected, r.query_mass,
                                             by_value ? r.v_deviation : r.k_deviation);
                   };
                   s.needs_query_mass = selector->reads_query_mass();
                   s.needs_deviation = selector->reads_deviation();
                 },
                 [&](const QueryProbe& probe) {
                   probe.validate();
                   s.initial = detail::computed_and_fixed_rows(plan);  // the probe pass: naive reuse
                   TokenSet candidates;
                   for (const ChunkPlan& c : plan.chunks)
                     if (c.source == KVSource::isolated || c.source == KVSource::variant)
                       for (std::int64_t t = c.range.begin; t < c.range.end; ++t)
                         if (!std::binary_search(s.initial.begin(), s.initial.end(), t)) candidates.push_back(t);
                   auto selector =
                       std::make_shared<QueryProbeSelector>(std::move(candidates), probe.recompute_ratio, num_layers);
                   s.second_pass = std::make_shared<std::optional<TokenSet>>();
                   s.next = [selector, second = s.second_pass, naive = s.initial, num_layers](const LayerReport& r) {
                     selector->observe(r.layer, r.row_query_mass);
                     if (r.layer + 1 == num_layers) {  // none chosen: the probe pass is the result
                       TokenSet rows;
                       const TokenSet chosen = selector->select();
                       if (!chosen.empty())
                         std::set_union(naive.begin(), naive.end(), chosen.begin(), chosen.end(),
                                        std::back_inserter(rows));
                       *second = std::move(rows);
                     }
                     return r.selected;
                   };
                   s.needs_query_mass = true;
                 },
             },
             method);
  const std::int64_t n = plan.layout.num_tokens();
  detail::require(!s.initial.empty() && s.initial.back() == n - 1,
                  "layer_schedule: the prompt's last token must be part of the query (layout query {})",
                  plan.layout.query);
  return s;
}

}  // namespace kvfuse
