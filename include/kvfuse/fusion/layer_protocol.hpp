#pragma once
// The per-layer protocol of the fusion loop, independent of any backend: what an engine's forward pass
// reports after computing the selected rows S_l of layer l (KV deviations; on request attention statistics
// and the query's attention mass), and what a method's policy returns (S_{l+1}). Every position-independent
// reuse method is the same layer-wise partial prefill (CacheBlend §4.3, Epic §4.2, Cache-Craft §3.2);
// fusion/layer_schedule.hpp says, per method, which rows each layer computes. The reference CPU backend
// (backend/cpu/llama.hpp) is one engine that speaks it.
//
// Also here: Cache-Craft's statistics computed from these reports (question_attention: eq. 15's term;
// chunk_attention: eq. 3, 4 and 14's inputs).

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <span>
#include <vector>

#include "kvfuse/core/error.hpp"
#include "kvfuse/core/prompt.hpp"
#include "kvfuse/core/types.hpp"
#include "kvfuse/select/cci_scorer.hpp"

namespace kvfuse {

// Attention statistics of one layer of the loop, for the rows it computed (S_l, in order), against
// groups of KV rows given by a PromptLayout over the rows: chunk j of the layout is group j, the query is
// group chunks.size(). Weights are the softmax probabilities summed over all query heads.
struct LayerAttention {
  std::int64_t num_groups = 0;
  std::vector<float> mass;       // [|S_l|][num_groups]: weight of selected row i on the rows of group g
  std::vector<float> self_mass;  // [|S_l|]: weight of selected row i on itself (part of its own group's mass)

  [[nodiscard]] float at(std::size_t i, std::size_t group) const noexcept {
    return mass[i * static_cast<std::size_t>(num_groups) + group];
  }
};

// What a selection policy sees after layer `layer` of the loop.
struct LayerReport {
  std::int64_t layer = 0;
  const TokenSet& selected;            // S_l: the rows this layer computed (ascending)
  std::span<const float> k_deviation;  // per entry of selected: squared L2 of recomputed − cached K (CacheBlend 4.1)
  std::span<const float> v_deviation;  // the same for V
  const LayerAttention* attention;     // nullptr unless statistics were asked for (LayerSchedule::needs_attention)
  // Per entry of selected: the softmax weight the query rows (StatisticsRequest::query, all in S_l) put on that
  // row on this layer, summed over the query rows and over all query heads. On a sliding-window layer (Gemma 3's
  // local layers) it is the weight over every row at a position <= the query row's, as if the layer had no
  // window: the window would hide all but the last few hundred positions from the query. Empty unless asked for
  // (LayerSchedule::needs_query_mass; QueryAwareSelector ranks by it).
  std::span<const float> query_mass{};
  // With query_mass, the same weight on every row of the prompt, computed or not ([num_tokens]; QueryProbe ranks
  // the rows it did not compute by it).
  std::span<const float> row_query_mass{};
};

// The statistics a per-layer engine computes for the policy besides the K / V deviations, all from the softmax
// the layer computes anyway (PerLayerFusionBackend's prefill, fusion/fusion_backend.hpp).
struct StatisticsRequest {
  const PromptLayout* groups = nullptr;  // set: LayerReport::attention over these groups (LayerAttention)
  TokenRange query{};                    // non-empty: LayerReport::query_mass, the attention of these rows
};

// Returns S_{l+1} ⊆ S_l, which must keep the last row. The value returned after the last layer is not used.
using SelectionPolicy = std::function<TokenSet(const LayerReport&)>;

// Receives layer l's attention statistics from an engine's full prefill (AttentionStatisticsBackend,
// fusion/fusion_backend.hpp), once per layer in order.
using AttentionSink = std::function<void(std::int64_t layer, LayerAttention attention)>;

// Called by the engine's forward pass with l before it reads layer l's KV (before computing layer l), on the
// thread that runs the pass: the layer-pipelined loader waits there for layer l's stored KV and installs it
// (vLLM's connector: wait_for_layer_load). It may throw; the pass then stops and the exception propagates.
using LayerHook = std::function<void(std::int64_t layer)>;

// Cache-Craft eq. 15's per-layer term inter_l(C_i, U): the attention mass of the question's rows (the
// layout's query) on each chunk, from one layer of the loop with statistics over groups = layout.
// Every query row must be in `selected` (fusion methods always recompute the question).
[[nodiscard]] inline std::vector<float> question_attention(const LayerAttention& stats, const TokenSet& selected,
                                                           const PromptLayout& layout) {
  layout.validate();
  const std::size_t m = layout.chunks.size();
  detail::require(stats.num_groups == static_cast<std::int64_t>(m) + 1,
                  "question_attention: statistics over {} groups for a layout of {} chunks + query", stats.num_groups,
                  m);
  detail::require(stats.mass.size() == selected.size() * (m + 1),
                  "question_attention: {} mass values for {} selected rows x {} groups", stats.mass.size(),
                  selected.size(), m + 1);
  std::vector<float> out(m, 0.0f);
  std::int64_t seen = 0;
  for (std::size_t i = 0; i < selected.size(); ++i) {
    if (!layout.query.contains(selected[i])) continue;
    ++seen;
    for (std::size_t j = 0; j < m; ++j) out[j] += stats.at(i, j);
  }
  detail::require(seen == layout.query.size(), "question_attention: {} of the {} query rows {} were selected", seen,
                  layout.query.size(), layout.query);
  return out;
}

// Cache-Craft's per-chunk statistics (ChunkAttention: eq. 3 inter, eq. 4 intra, the eq. 14 token scores)
// from a run of the loop with statistics over groups = layout, one LayerAttention per layer in order, layer l
// over the rows selected[l] (S_l, ascending). A chunk's statistics are its rows' (the queries of C_i), so they
// are exact for a chunk whose rows were in every S_l (computed_on_every_layer) and partial for any other. intra
// excludes each token's weight on itself (eq. 4: k < l strictly).
[[nodiscard]] inline ChunkAttention chunk_attention(std::vector<std::uint64_t> ids, const PromptLayout& layout,
                                                    const std::vector<LayerAttention>& layers,
                                                    const std::vector<TokenSet>& selected) {
  layout.validate();
  const std::size_t m = layout.chunks.size();
  detail::require(ids.size() == m, "chunk_attention: {} chunk ids for {} chunks", ids.size(), m);
  detail::require(!layers.empty(), "chunk_attention: no layers");
  detail::require(selected.size() == layers.size(), "chunk_attention: {} selections for {} layers", selected.size(),
                  layers.size());
  ChunkAttention out;
  out.chunk_ids = std::move(ids);
  std::vector<std::int64_t> chunk_of(static_cast<std::size_t>(layout.num_tokens()), -1);  // -1: the query's rows
  for (std::size_t i = 0; i < m; ++i) {
    const TokenRange c = layout.chunks[i].range;
    out.chunk_sizes.push_back(c.size());
    out.token_prefix_attention.emplace_back(static_cast<std::size_t>(c.size()), 0.0);
    for (std::int64_t row = c.begin; row < c.end; ++row)
      chunk_of[static_cast<std::size_t>(row)] = static_cast<std::int64_t>(i);
  }
  for (std::size_t l = 0; l < layers.size(); ++l) {
    const LayerAttention& a = layers[l];
    const TokenSet& rows = selected[l];
    detail::require(a.num_groups == static_cast<std::int64_t>(m) + 1 && a.mass.size() == rows.size() * (m + 1) &&
                        a.self_mass.size() == rows.size(),
                    "chunk_attention: layer {} holds statistics of {} rows x {} groups; it selected {} rows, over {} "
                    "chunks + query",
                    l, a.self_mass.size(), a.num_groups, rows.size(), m);
    std::vector<double> mass(m * m, 0.0);
    for (std::size_t q = 0; q < rows.size(); ++q) {
      detail::require(rows[q] >= 0 && rows[q] < layout.num_tokens(), "chunk_attention: layer {} selected row {} of a "
                      "{}-row layout", l, rows[q], layout.num_tokens());
      const std::int64_t chunk = chunk_of[static_cast<std::size_t>(rows[q])];
      if (chunk < 0) continue;
      const auto i = static_cast<std::size_t>(chunk);
      double prefix = 0.0;
      for (std::size_t j = 0; j < i; ++j) {
        mass[i * m + j] += a.at(q, j);  // eq. 3: inter(C_j, C_i)
        prefix += a.at(q, j);
      }
      mass[i * m + i] += std::max(0.0, static_cast<double>(a.at(q, i)) - a.self_mass[q]);  // eq. 4: intra(C_i)
      const auto t = static_cast<std::size_t>(rows[q] - layout.chunks[i].range.begin);
      out.token_prefix_attention[i][t] += prefix;  // eq. 14 score
    }
    out.layer_mass.push_back(std::move(mass));
  }
  out.validate();
  return out;
}

// The same from a run that selected every row on every layer (a full prefill with statistics).
[[nodiscard]] inline ChunkAttention chunk_attention(std::vector<std::uint64_t> ids, const PromptLayout& layout,
                                                    const std::vector<LayerAttention>& layers) {
  TokenSet all;
  append_range(all, {0, layout.num_tokens()});
  return chunk_attention(std::move(ids), layout, layers, std::vector<TokenSet>(layers.size(), all));
}

// Whether every row of `chunk` is in every S_l of `selected`: its chunk_attention statistics are complete.
[[nodiscard]] inline bool computed_on_every_layer(TokenRange chunk, std::span<const TokenSet> selected) {
  return !selected.empty() && std::all_of(selected.begin(), selected.end(), [chunk](const TokenSet& s) {
    const auto first = std::lower_bound(s.begin(), s.end(), chunk.begin);
    return s.end() - first >= chunk.size() && (chunk.empty() || *(first + (chunk.size() - 1)) == chunk.end - 1);
  });
}

}  // namespace kvfuse
