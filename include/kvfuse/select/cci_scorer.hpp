#pragma once
// CCIScorer — Cache-Craft's chunk-cache reusability score and choice of the tokens to recompute.
//
// What it does: a "chunk-cache" is the KV of a chunk C computed inside an old prompt C_1 .. C_{i-1} C
// (Cache-Craft eq. 2). When C is reused behind a different prefix, CCIScorer decides how many and which
// of its tokens must be recomputed:
//   offline, from the attention statistics of the prompt that produced the cache (ChunkAttention):
//     inter / intra attention (eq. 3-4) -> a_l, b_l per layer (eq. 9) -> layer means ā, b̄ (eq. 10)
//     -> Cache Context Impact CCI = sigmoid(ā / b̄) (eq. 11), and the chunk's tokens ranked by their
//     attention to earlier chunks (eq. 14). The result is a ChunkProfile, the metadata stored next to the KV;
//   online, against the chunk's prefix in the new prompt:
//     prefix overlap β (eq. 6), order penalty γ = normalized Kendall-τ distance (eq. 7), β' = β(1 − γ)
//     (eq. 8), Cache Fix Overhead CFO = α · CCI · (1 − β') (eq. 12), and N = ⌈CFO · |C|⌉ tokens to
//     recompute, the top N of the ranking (eq. 14). The result is a ChunkScore.
// Paper: Cache-Craft ("Managing Chunk-Caches for Efficient Retrieval-Augmented Generation", SIGMOD 2025),
// sections 3.1 and 3.2.1.
//
// When to use: RAG prompts assembled from chunk KV that was computed in other prompts, when attention
// statistics were recorded while the KV was computed, and the recompute budget of each chunk should follow
// how contextualized the chunk is and how much its prefix changed. Keep several variants per chunk with
// VariantCache (cache/variant_cache.hpp), which scores its variants with these functions. Use CacheBlend's
// HKVDSelector when no attention statistics exist (it ranks tokens by KV deviation at run time), Epic's
// AttnLinkBoundary for a fixed, statistics-free budget at every chunk start.
//
// Defaults from the paper: α = 1 (eq. 12; the paper fits α on a validation set with eq. 13 and reports
// α = 0.5 .. 3). One extension, off by default: CCIScorerConfig::prefix_coverage scales β by the share of the
// current prefix that the stored prefix held (prefix_coverage below), which eq. 6 does not count.
//
// Conventions where the paper leaves room (all documented at the function that applies them):
//  - Attention statistics are per layer, aggregated over heads (sum or mean, the same for every layer). All
//    quantities here are ratios within a layer or of layer means, so that choice cancels. β (eq. 6) and the
//    eq. 14 token scores use inter attention summed over layers (the paper writes them without a layer).
//  - inter(C_j, C_i) for j < i is the attention of queries in C_i on keys in C_j (the causal direction,
//    eq. 5). intra(C_i) counts key k and query q of C_i with k < q strictly (eq. 4), so a token's weight on
//    itself is not counted and a one-token chunk has intra = 0.
//  - β's prefix S_new is the chunk's prefix in the new prompt (the chunks before it), as in eq. 6's
//    "prefix overlap". When the stored prefix carries no inter attention (it is empty: the chunk was first),
//    eq. 6 is 0/0: β = 1 when the current prefix equals the stored one, else 0.
//  - b̄ = 0 (every chunk of one token): ā / b̄ is +∞ → CCI = 1 when ā > 0, and 0 → CCI = 1/2 when ā = 0.
//  - N = ⌈CFO · |C|⌉ treats a product within 1e-9 (relative) above an integer as that integer, so that
//    floating-point noise (0.1 · 3 · 10 = 3.0000000000000004) does not add a token, while any positive
//    product, however small, still gives N >= 1 (detail::tolerant_ceil); N is clipped to [0, |C|].
//  - Token lists are chunk-local offsets (0 .. |C| − 1); add the chunk's start in the new prompt.
//  - A chunk id must not repeat within a prompt or prefix (Kendall-τ and eq. 6 treat prefixes as sets):
//    repeated ids are rejected.

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <numeric>
#include <span>
#include <vector>

#include <fmt/format.h>

#include "kvfuse/core/error.hpp"
#include "kvfuse/core/prompt.hpp"
#include "kvfuse/core/types.hpp"
#include "kvfuse/detail/math.hpp"

namespace kvfuse {

// ------------------------------------------------------------------------------------- token-level sums
// `attn` is one layer's attention, row-major n × n: attn[q * n + k] = weight of key k in the softmax of
// query q (zero for k > q). Ranges are half-open [begin, end) token positions.

// Cache-Craft eq. 3: inter(C_j, C_i) for an earlier chunk C_j = [earlier_begin, earlier_end) and a later
// chunk C_i = [later_begin, later_end): attention of the queries of C_i on the keys of C_j.
template <class T>
inline double inter_attention(const T* attn, std::int64_t n, std::int64_t earlier_begin,
                                          std::int64_t earlier_end, std::int64_t later_begin,
                                          std::int64_t later_end) {
  double sum = 0.0;
  for (std::int64_t q = later_begin; q < later_end; ++q)
    for (std::int64_t k = earlier_begin; k < earlier_end; ++k) sum += static_cast<double>(attn[q * n + k]);
  return sum;
}

// Cache-Craft eq. 4: intra(C) for C = [begin, end): attention of each query of C on the strictly earlier
// keys of C.
template <class T>
inline double intra_attention(const T* attn, std::int64_t n, std::int64_t begin, std::int64_t end) {
  double sum = 0.0;
  for (std::int64_t q = begin; q < end; ++q)
    for (std::int64_t k = begin; k < q; ++k) sum += static_cast<double>(attn[q * n + k]);
  return sum;
}

// Cache-Craft eq. 14 score of one token: Σ_{j<i} inter(C_j, t) = attention of query `token` on all keys of
// the earlier chunks, which occupy [0, prefix_end).
template <class T>
inline double token_prefix_attention(const T* attn, std::int64_t n, std::int64_t token,
                                                 std::int64_t prefix_end) {
  double sum = 0.0;
  for (std::int64_t k = 0; k < prefix_end; ++k) sum += static_cast<double>(attn[token * n + k]);
  return sum;
}

namespace detail {

// A read-only span over a vector, spelled out (nvcc's front end does not convert vector to span implicitly).
template <class T>
std::span<const T> span_of(const std::vector<T>& v) noexcept {
  return {v.data(), v.size()};
}

// Throws when an id occurs twice in `ids`.
inline void require_unique_ids(std::span<const std::uint64_t> ids, const char* what) {
  std::vector<std::uint64_t> sorted(ids.begin(), ids.end());
  std::sort(sorted.begin(), sorted.end());
  const auto dup = std::adjacent_find(sorted.begin(), sorted.end());
  require(dup == sorted.end(), "{}: chunk id {:#x} appears more than once", what,
          dup == sorted.end() ? 0 : *dup);
}

inline bool contains_id(std::span<const std::uint64_t> ids, std::uint64_t id) {
  return std::find(ids.begin(), ids.end(), id) != ids.end();
}

}  // namespace detail

// ------------------------------------------------------------------ attention statistics of one prompt

// Attention statistics recorded while a prompt C_1 .. C_m was computed: what the offline half of
// Cache-Craft (eq. 3-4, 9-11, 14) needs. Chunks are contiguous; position 0 is the first token of C_1.
struct ChunkAttention {
  std::vector<std::uint64_t> chunk_ids;    // content hash of C_1 .. C_m, unique
  std::vector<std::int64_t> chunk_sizes;   // |C_1| .. |C_m|
  // One m × m row-major matrix per layer; layer_mass[l][i * m + j] is the attention mass of the queries of
  // C_i on the keys of C_j in layer l: inter_l(C_j, C_i) (eq. 3) for j < i, intra_l(C_i) (eq. 4) for j == i,
  // and 0 for j > i (causal).
  std::vector<std::vector<double>> layer_mass;
  // token_prefix_attention[i][t]: attention of token t of C_i on all tokens of C_1 .. C_{i-1}, summed over
  // layers (the eq. 14 score). Size |C_i| per chunk.
  std::vector<std::vector<double>> token_prefix_attention;

  [[nodiscard]] std::size_t num_chunks() const noexcept { return chunk_ids.size(); }
  [[nodiscard]] std::size_t num_layers() const noexcept { return layer_mass.size(); }

  // Mass of the queries of C_i on the keys of C_j in `layer` (no bounds check; call validate() first).
  [[nodiscard]] double mass(std::size_t layer, std::size_t i, std::size_t j) const noexcept {
    return layer_mass[layer][i * num_chunks() + j];
  }

  void validate() const {
    const std::size_t m = chunk_ids.size();
    detail::require(chunk_sizes.size() == m, "ChunkAttention: {} chunk sizes for {} chunk ids",
                    chunk_sizes.size(), m);
    detail::require(token_prefix_attention.size() == m,
                    "ChunkAttention: token_prefix_attention has {} chunks, expected {}",
                    token_prefix_attention.size(), m);
    detail::require(!layer_mass.empty(), "ChunkAttention: layer_mass has 0 layers, needs at least 1 (eq. 10)");
    detail::require_unique_ids(detail::span_of(chunk_ids), "ChunkAttention");
    for (std::size_t i = 0; i < m; ++i) {
      detail::require(chunk_sizes[i] >= 0, "ChunkAttention: chunk {} size {} is negative", i, chunk_sizes[i]);
      detail::require(token_prefix_attention[i].size() == static_cast<std::size_t>(chunk_sizes[i]),
                      "ChunkAttention: token_prefix_attention[{}] has {} tokens but chunk {} has {}", i,
                      token_prefix_attention[i].size(), i, chunk_sizes[i]);
      for (std::size_t t = 0; t < token_prefix_attention[i].size(); ++t) {
        const double x = token_prefix_attention[i][t];
        detail::require(detail::is_finite_nonneg(x),
                        "ChunkAttention: token_prefix_attention[{}][{}] = {} must be finite and >= 0", i,
                        t, x);
      }
    }
    for (std::size_t l = 0; l < layer_mass.size(); ++l) {
      detail::require(layer_mass[l].size() == m * m, "ChunkAttention: layer {} has {} mass entries, expected {} x {}",
                      l, layer_mass[l].size(), m, m);
      for (std::size_t i = 0; i < m; ++i) {
        for (std::size_t j = 0; j < m; ++j) {
          const double x = layer_mass[l][i * m + j];
          detail::require(detail::is_finite_nonneg(x),
                          "ChunkAttention: layer {} mass[{}][{}] = {} must be finite and >= 0", l, i, j, x);
          detail::require(x == 0.0 || (j <= i && chunk_sizes[i] > 0 && chunk_sizes[j] > 0),
                          "ChunkAttention: layer {} mass[{}][{}] = {} must be 0 (a later or empty chunk)", l, i, j,
                          x);
        }
      }
    }
  }

  // Builds the statistics from full token-level attention, one row-major n × n matrix per layer
  // (attn[q * n + k], n = layout.num_tokens(), the query rows of layout.query are ignored), applying
  // eq. 3, eq. 4 and the eq. 14 token score.
  template <class T>
  [[nodiscard]] static ChunkAttention from_token_attention(std::vector<std::uint64_t> ids, const PromptLayout& layout,
                                                           const std::vector<std::vector<T>>& layers) {
    layout.validate();
    const std::size_t m = layout.chunks.size();
    detail::require(ids.size() == m, "ChunkAttention::from_token_attention: {} chunk ids for {} chunks", ids.size(),
                    m);
    detail::require(!layers.empty(), "ChunkAttention::from_token_attention: 0 layers, needs at least 1");
    const std::int64_t n = layout.num_tokens();
    const auto nn = static_cast<std::size_t>(n) * static_cast<std::size_t>(n);
    for (std::size_t l = 0; l < layers.size(); ++l) {
      detail::require(layers[l].size() == nn,
                      "ChunkAttention::from_token_attention: layer {} has {} weights, expected {} x {}", l,
                      layers[l].size(), n, n);
      for (std::int64_t q = 0; q < n; ++q) {
        for (std::int64_t k = 0; k < n; ++k) {
          const auto x = static_cast<double>(layers[l][static_cast<std::size_t>(q * n + k)]);
          detail::require(detail::is_finite_nonneg(x),
                          "ChunkAttention::from_token_attention: layer {} attn[{}][{}] = {} must be finite and "
                          ">= 0",
                          l, q, k, x);
          detail::require(k <= q || x == 0.0,
                          "ChunkAttention::from_token_attention: layer {} attn[{}][{}] = {} but attention must be "
                          "causal (0 for a later key)",
                          l, q, k, x);
        }
      }
    }

    ChunkAttention stats;
    stats.chunk_ids = std::move(ids);
    stats.layer_mass.assign(layers.size(), std::vector<double>(m * m, 0.0));
    stats.token_prefix_attention.resize(m);
    for (std::size_t i = 0; i < m; ++i) {
      const TokenRange ci = layout.chunks[i].range;
      stats.chunk_sizes.push_back(ci.size());
      stats.token_prefix_attention[i].assign(static_cast<std::size_t>(ci.size()), 0.0);
      for (std::size_t l = 0; l < layers.size(); ++l) {
        const T* attn = layers[l].data();
        for (std::size_t j = 0; j < i; ++j) {
          const TokenRange cj = layout.chunks[j].range;
          stats.layer_mass[l][i * m + j] = inter_attention(attn, n, cj.begin, cj.end, ci.begin, ci.end);
        }
        stats.layer_mass[l][i * m + i] = intra_attention(attn, n, ci.begin, ci.end);
        for (std::int64_t t = ci.begin; t < ci.end; ++t)
          stats.token_prefix_attention[i][static_cast<std::size_t>(t - ci.begin)] +=
              kvfuse::token_prefix_attention(attn, n, t, ci.begin);
      }
    }
    return stats;
  }
};

// ------------------------------------------------------------------ one function per equation

// Cache-Craft eq. 9, a(C_i) for one layer: Σ_{j<i} inter(C_j, C_i) / (|C_i| · |C_j|). `inter_from_prefix[j]`
// is inter(C_j, C_i) and `prefix_sizes[j]` is |C_j|. Empty chunks contribute 0 (their inter must be 0).
[[nodiscard]] inline double cci_a(std::span<const double> inter_from_prefix, std::span<const std::int64_t> prefix_sizes,
                                  std::int64_t chunk_size) {
  detail::require(inter_from_prefix.size() == prefix_sizes.size(), "cci_a: {} inter values for {} prefix chunks",
                  inter_from_prefix.size(), prefix_sizes.size());
  detail::require(chunk_size >= 0, "cci_a: chunk size {} is negative", chunk_size);
  double a = 0.0;
  for (std::size_t j = 0; j < prefix_sizes.size(); ++j) {
    detail::require_finite_nonneg(inter_from_prefix[j], "cci_a: inter(C_j, C_i)");
    detail::require(prefix_sizes[j] >= 0, "cci_a: prefix chunk {} size {} is negative", j, prefix_sizes[j]);
    if (chunk_size == 0 || prefix_sizes[j] == 0) {
      detail::require(inter_from_prefix[j] == 0.0, "cci_a: inter = {} with an empty chunk (prefix chunk {})",
                      inter_from_prefix[j], j);
      continue;
    }
    a += inter_from_prefix[j] / (static_cast<double>(chunk_size) * static_cast<double>(prefix_sizes[j]));
  }
  return a;
}

// Cache-Craft eq. 9, b(C_i) for one layer: intra(C_i) / |C_i|². An empty chunk has b = 0.
[[nodiscard]] inline double cci_b(double intra, std::int64_t chunk_size) {
  detail::require_finite_nonneg(intra, "cci_b: intra(C_i)");
  detail::require(chunk_size >= 0, "cci_b: chunk size {} is negative", chunk_size);
  if (chunk_size == 0) {
    detail::require(intra == 0.0, "cci_b: intra = {} for an empty chunk", intra);
    return 0.0;
  }
  const auto c = static_cast<double>(chunk_size);
  return intra / (c * c);
}

// Cache-Craft eq. 10: ā = (1/L) Σ_l a_l (and the same for b̄).
[[nodiscard]] inline double layer_mean(std::span<const double> per_layer) {
  detail::require(!per_layer.empty(), "layer_mean: 0 layers, needs at least 1");
  double sum = 0.0;
  for (double x : per_layer) {
    detail::require_finite_nonneg(x, "layer_mean: per-layer value");
    sum += x;
  }
  return sum / static_cast<double>(per_layer.size());
}

// Cache-Craft eq. 11: CCI = 1 / (1 + e^{−ā/b̄}). b̄ = 0 gives 1 when ā > 0 and 1/2 when ā = 0.
[[nodiscard]] inline double cache_context_impact(double a_bar, double b_bar) {
  detail::require_finite_nonneg(a_bar, "cache_context_impact: a_bar");
  detail::require_finite_nonneg(b_bar, "cache_context_impact: b_bar");
  if (b_bar == 0.0) return a_bar > 0.0 ? 1.0 : 0.5;
  return 1.0 / (1.0 + std::exp(-(a_bar / b_bar)));
}

// Cache-Craft eq. 6, prefix overlap β of a chunk-cache computed behind `stored_prefix` (chunk ids in order,
// `prefix_inter[j]` = inter(stored_prefix[j], C) summed over layers) when reused behind `current_prefix`:
// the share of the stored prefix's inter attention that comes from chunks also in the current prefix.
// With zero stored inter attention (empty stored prefix) β = 1 if the prefixes are equal, else 0.
[[nodiscard]] inline double prefix_overlap(std::span<const std::uint64_t> stored_prefix,
                                           std::span<const double> prefix_inter,
                                           std::span<const std::uint64_t> current_prefix) {
  detail::require(stored_prefix.size() == prefix_inter.size(),
                  "prefix_overlap: {} inter values for a stored prefix of {} chunks", prefix_inter.size(),
                  stored_prefix.size());
  detail::require_unique_ids(stored_prefix, "prefix_overlap: stored prefix");
  detail::require_unique_ids(current_prefix, "prefix_overlap: current prefix");
  double total = 0.0;
  double shared = 0.0;
  for (std::size_t j = 0; j < stored_prefix.size(); ++j) {
    detail::require_finite_nonneg(prefix_inter[j], "prefix_overlap: inter(C_j, C)");
    total += prefix_inter[j];
    if (detail::contains_id(current_prefix, stored_prefix[j])) shared += prefix_inter[j];
  }
  if (total == 0.0) {
    const bool same = std::equal(stored_prefix.begin(), stored_prefix.end(), current_prefix.begin(),
                                 current_prefix.end());
    return same ? 1.0 : 0.0;
  }
  return shared / total;
}

// Cache-Craft eq. 7, order penalty γ = D / T: the normalized Kendall-τ distance between the chunks common
// to both prefixes, in stored order (A_old) and in current order (A_new). D = discordant pairs,
// T = m(m − 1)/2 with m common chunks; γ = 0 when m < 2.
[[nodiscard]] inline double order_penalty(std::span<const std::uint64_t> stored_prefix,
                                          std::span<const std::uint64_t> current_prefix) {
  detail::require_unique_ids(stored_prefix, "order_penalty: stored prefix");
  detail::require_unique_ids(current_prefix, "order_penalty: current prefix");
  // Positions in the current prefix of the common chunks, taken in stored order; D counts inversions.
  std::vector<std::size_t> new_pos;
  for (std::uint64_t id : stored_prefix) {
    const auto it = std::find(current_prefix.begin(), current_prefix.end(), id);
    if (it != current_prefix.end()) new_pos.push_back(static_cast<std::size_t>(it - current_prefix.begin()));
  }
  const std::size_t m = new_pos.size();
  if (m < 2) return 0.0;
  std::size_t discordant = 0;
  for (std::size_t x = 0; x < m; ++x)
    for (std::size_t y = x + 1; y < m; ++y) discordant += new_pos[x] > new_pos[y] ? 1 : 0;
  return static_cast<double>(discordant) / (static_cast<double>(m) * static_cast<double>(m - 1) / 2.0);
}

// Prefix coverage κ = |S_old ∩ S_new| / |S_new|: the share of the current prefix's chunks that the stored prefix
// held, counted by chunk (1 for an empty current prefix). kvfuse's extension, not the paper's: eq. 6 weighs what
// the stored prefix had and the current one lacks, but not what the current one adds, so a chunk-cache stored
// behind (C_1) and reused behind (C_1 C_2 ... C_9) scores β = 1, γ = 0 and recomputes nothing, although it never
// attended to the eight chunks now before it. With CCIScorerConfig::prefix_coverage, β is multiplied by κ (1/9).
[[nodiscard]] inline double prefix_coverage(std::span<const std::uint64_t> stored_prefix,
                                            std::span<const std::uint64_t> current_prefix) {
  detail::require_unique_ids(stored_prefix, "prefix_coverage: stored prefix");
  detail::require_unique_ids(current_prefix, "prefix_coverage: current prefix");
  if (current_prefix.empty()) return 1.0;
  std::size_t held = 0;
  for (std::uint64_t id : current_prefix) held += detail::contains_id(stored_prefix, id) ? 1 : 0;
  return static_cast<double>(held) / static_cast<double>(current_prefix.size());
}

// Cache-Craft eq. 8: β' = β · (1 − γ).
[[nodiscard]] inline double adjusted_prefix_overlap(double beta, double gamma) {
  detail::require(std::isfinite(beta) && beta >= 0.0 && beta <= 1.0,
                  "adjusted_prefix_overlap: beta = {} must be in [0, 1]", beta);
  detail::require(std::isfinite(gamma) && gamma >= 0.0 && gamma <= 1.0,
                  "adjusted_prefix_overlap: gamma = {} must be in [0, 1]", gamma);
  return beta * (1.0 - gamma);
}

// Cache-Craft eq. 12: CFO = α · CCI · (1 − β').
[[nodiscard]] inline double cache_fix_overhead(double cci, double beta_adjusted, double alpha = 1.0) {
  detail::require(std::isfinite(cci) && cci >= 0.0 && cci <= 1.0, "cache_fix_overhead: cci = {} must be in [0, 1]",
                  cci);
  detail::require(std::isfinite(beta_adjusted) && beta_adjusted >= 0.0 && beta_adjusted <= 1.0,
                  "cache_fix_overhead: beta_adjusted = {} must be in [0, 1]", beta_adjusted);
  detail::require_finite_nonneg(alpha, "cache_fix_overhead: alpha");
  return alpha * cci * (1.0 - beta_adjusted);
}

// Cache-Craft eq. 14's budget: N = ⌈CFO · |C|⌉, clipped to [0, |C|]. A product within 1e-9 (relative) above an
// integer counts as that integer (detail::tolerant_ceil); any positive product, however small, gives N >= 1.
[[nodiscard]] inline std::int64_t recompute_count(double cfo, std::int64_t chunk_size) {
  detail::require_finite_nonneg(cfo, "recompute_count: cfo");
  detail::require(chunk_size >= 0, "recompute_count: chunk size {} is negative", chunk_size);
  const double x = cfo * static_cast<double>(chunk_size);
  if (x >= static_cast<double>(chunk_size)) return chunk_size;
  return static_cast<std::int64_t>(detail::tolerant_ceil(x));  // in [0, |C|] since 0 <= x < |C|
}

// Cache-Craft eq. 14's order: token offsets of a chunk by score (Σ_{j<i} inter(C_j, t)) descending, ties to
// the lower offset (detail::ScoreDescending). Every prefix of the result is the top-N set for that N.
[[nodiscard]] inline std::vector<std::int64_t> rank_tokens(std::span<const double> scores) {
  for (std::size_t t = 0; t < scores.size(); ++t)
    detail::require(detail::is_finite_nonneg(scores[t]), "rank_tokens: score of token {} = {} must be finite and >= 0",
                    t, scores[t]);
  std::vector<std::int64_t> order(scores.size());
  std::iota(order.begin(), order.end(), std::int64_t{0});
  std::sort(order.begin(), order.end(), detail::ScoreDescending<double>{scores.data()});
  return order;
}

namespace detail {
// The first n entries of a ranking, as a sorted TokenSet.
inline TokenSet top_of_ranking(std::span<const std::int64_t> ranking, std::int64_t n) {
  return make_token_set(std::vector<std::int64_t>(ranking.begin(), ranking.begin() + n));
}
}  // namespace detail

// Cache-Craft eq. 14: the n tokens with the highest scores (ties to the lower offset), sorted by offset.
[[nodiscard]] inline TokenSet select_recompute_tokens(std::span<const double> scores, std::int64_t n) {
  detail::require(n >= 0 && n <= static_cast<std::int64_t>(scores.size()),
                  "select_recompute_tokens: n = {} is not in [0, {}]", n, scores.size());
  const std::vector<std::int64_t> ranking = rank_tokens(scores);
  return detail::top_of_ranking(detail::span_of(ranking), n);
}

// ------------------------------------------------------------------ the scorer

struct CCIScorerConfig {
  double alpha = 1.0;  // eq. 12 scaling; the paper fits it with eq. 13 (0.5 .. 3 studied, 1 by default)
  // kvfuse's extension, off by default: β (eq. 6) scaled by the prefix coverage κ (prefix_coverage below), so that
  // chunks the stored prefix never held count against reuse too (by number; lost chunks weigh their attention).
  bool prefix_coverage = false;

  void validate() const {
    detail::require_finite_nonneg(alpha, "CCIScorerConfig: alpha");
  }
};

// Offline metadata of one chunk-cache: what Cache-Craft stores next to the KV (section 3.3: CCI and the
// ordered token list) plus the stored prefix and its inter attention that β needs (eq. 6).
struct ChunkProfile {
  std::uint64_t chunk_id = 0;
  std::int64_t size = 0;                       // |C|
  std::vector<std::uint64_t> stored_prefix;    // ids of C_1 .. C_{i-1} when the KV was computed, in order
  std::vector<double> prefix_inter;            // inter(stored_prefix[j], C), summed over layers
  double a_bar = 0.0;                          // eq. 10
  double b_bar = 0.0;                          // eq. 10
  double cci = 0.5;                            // eq. 11
  std::vector<std::int64_t> token_ranking;     // all offsets 0 .. size-1 in eq. 14 order

  void validate() const {
    detail::require(size >= 0, "ChunkProfile {:#x}: size {} is negative", chunk_id, size);
    detail::require(prefix_inter.size() == stored_prefix.size(),
                    "ChunkProfile {:#x}: {} inter values for a stored prefix of {} chunks", chunk_id,
                    prefix_inter.size(), stored_prefix.size());
    detail::require_unique_ids(detail::span_of(stored_prefix), "ChunkProfile: stored prefix");
    detail::require(!detail::contains_id(detail::span_of(stored_prefix), chunk_id),
                    "ChunkProfile {:#x}: the chunk appears in its own stored prefix", chunk_id);
    for (double x : prefix_inter) detail::require_finite_nonneg(x, "ChunkProfile: prefix_inter");
    detail::require_finite_nonneg(a_bar, "ChunkProfile: a_bar");
    detail::require_finite_nonneg(b_bar, "ChunkProfile: b_bar");
    detail::require(std::isfinite(cci) && cci >= 0.0 && cci <= 1.0, "ChunkProfile {:#x}: cci = {} must be in [0, 1]",
                    chunk_id, cci);
    detail::require(token_ranking.size() == static_cast<std::size_t>(size),
                    "ChunkProfile {:#x}: token ranking has {} entries for {} tokens", chunk_id, token_ranking.size(),
                    size);
    std::vector<bool> seen(static_cast<std::size_t>(size), false);
    for (std::int64_t t : token_ranking) {
      detail::require(t >= 0 && t < size && !seen[static_cast<std::size_t>(t)],
                      "ChunkProfile {:#x}: token ranking entry {} is out of [0, {}) or repeated", chunk_id, t, size);
      seen[static_cast<std::size_t>(t)] = true;
    }
  }
};

// Online result for one chunk-cache against the current prefix.
struct ChunkScore {
  std::uint64_t chunk_id = 0;
  std::int64_t size = 0;
  double cci = 0.0;            // eq. 11 (from the profile)
  double beta = 0.0;           // eq. 6 (times coverage with CCIScorerConfig::prefix_coverage)
  double coverage = 1.0;       // κ (prefix_coverage); 1 unless CCIScorerConfig::prefix_coverage
  double gamma = 0.0;          // eq. 7
  double beta_adjusted = 0.0;  // eq. 8
  double cfo = 0.0;            // eq. 12
  std::int64_t num_recompute = 0;  // N = ⌈CFO · |C|⌉ clipped to [0, |C|]
  TokenSet recompute;          // eq. 14: chunk-local offsets of the N tokens, sorted
};

namespace detail {
// β, γ, β' and CFO of a validated profile against `current_prefix` (checked here) under `config` (validated
// here); N and the recompute set are left empty (fill_recompute adds them).
inline ChunkScore score_cfo(const ChunkProfile& p, std::span<const std::uint64_t> current_prefix,
                            const CCIScorerConfig& config) {
  config.validate();
  require(!contains_id(current_prefix, p.chunk_id), "CCIScorer: chunk {:#x} appears in its own current prefix",
          p.chunk_id);
  ChunkScore s;
  s.chunk_id = p.chunk_id;
  s.size = p.size;
  s.cci = p.cci;
  if (config.prefix_coverage) s.coverage = prefix_coverage(span_of(p.stored_prefix), current_prefix);
  // eq. 6, times κ with prefix_coverage
  s.beta = s.coverage * prefix_overlap(span_of(p.stored_prefix), span_of(p.prefix_inter), current_prefix);
  s.gamma = order_penalty(span_of(p.stored_prefix), current_prefix);                                       // eq. 7
  s.beta_adjusted = adjusted_prefix_overlap(s.beta, s.gamma);                                              // eq. 8
  s.cfo = cache_fix_overhead(p.cci, s.beta_adjusted, config.alpha);                                        // eq. 12
  return s;
}

// N = ⌈CFO · |C|⌉ and the top N of the profile's ranking (eq. 14), for a score from score_cfo on `p`.
inline void fill_recompute(ChunkScore& s, const ChunkProfile& p) {
  s.num_recompute = recompute_count(s.cfo, p.size);
  s.recompute = top_of_ranking(span_of(p.token_ranking), s.num_recompute);
}

// score_cfo and fill_recompute: the full online score of a validated profile.
inline ChunkScore score_profile(const ChunkProfile& p, std::span<const std::uint64_t> current_prefix,
                                const CCIScorerConfig& config) {
  ChunkScore s = score_cfo(p, current_prefix, config);
  fill_recompute(s, p);
  return s;
}
}  // namespace detail

// Cache-Craft sections 3.1-3.2.1: profiles chunk-caches offline and scores them against new prefixes online.
class CCIScorer {
 public:
  explicit CCIScorer(CCIScorerConfig config = {}) : config_(config) { config_.validate(); }

  [[nodiscard]] const CCIScorerConfig& config() const noexcept { return config_; }

  // Offline: the profile of every chunk of the prompt that `stats` was recorded on (eq. 9-11, 14).
  [[nodiscard]] std::vector<ChunkProfile> profile(const ChunkAttention& stats) const {
    stats.validate();
    std::vector<ChunkProfile> out;
    out.reserve(stats.num_chunks());
    for (std::size_t i = 0; i < stats.num_chunks(); ++i) out.push_back(profile_validated(stats, i));
    return out;
  }

  // Offline: the profile of chunk `chunk` (0-based) of that prompt.
  [[nodiscard]] ChunkProfile profile(const ChunkAttention& stats, std::size_t chunk) const {
    stats.validate();
    detail::require(chunk < stats.num_chunks(), "CCIScorer::profile: chunk index {} is not below {}", chunk,
                    stats.num_chunks());
    return profile_validated(stats, chunk);
  }

  // Online: β, γ, β', CFO, N and the tokens to recompute for `p` behind `current_prefix` (ids of the chunks
  // before it in the new prompt, in order).
  [[nodiscard]] ChunkScore score(const ChunkProfile& p, std::span<const std::uint64_t> current_prefix) const {
    p.validate();
    return detail::score_profile(p, current_prefix, config_);
  }

  // Online, a whole new prompt: `new_prompt` lists the chunk ids of the new prompt in order; each profile's
  // chunk must occur in it, and its current prefix is what precedes it there. Results follow `profiles`.
  [[nodiscard]] std::vector<ChunkScore> score(std::span<const ChunkProfile> profiles,
                                              std::span<const std::uint64_t> new_prompt) const {
    detail::require_unique_ids(new_prompt, "CCIScorer::score: new prompt");
    std::vector<ChunkScore> out;
    out.reserve(profiles.size());
    for (const ChunkProfile& p : profiles) {
      const auto it = std::find(new_prompt.begin(), new_prompt.end(), p.chunk_id);
      detail::require(it != new_prompt.end(), "CCIScorer::score: chunk {:#x} is not in the new prompt", p.chunk_id);
      out.push_back(score(p, new_prompt.first(static_cast<std::size_t>(it - new_prompt.begin()))));
    }
    return out;
  }

 private:
  static ChunkProfile profile_validated(const ChunkAttention& stats, std::size_t i) {
    const std::size_t layers = stats.num_layers();
    const std::int64_t size = stats.chunk_sizes[i];
    const std::span<const std::int64_t> prefix_sizes(stats.chunk_sizes.data(), i);
    ChunkProfile p;
    p.chunk_id = stats.chunk_ids[i];
    p.size = size;
    p.stored_prefix.assign(stats.chunk_ids.begin(), stats.chunk_ids.begin() + static_cast<std::ptrdiff_t>(i));
    p.prefix_inter.assign(i, 0.0);
    std::vector<double> a(layers), b(layers), inter(i);
    for (std::size_t l = 0; l < layers; ++l) {
      for (std::size_t j = 0; j < i; ++j) {
        inter[j] = stats.mass(l, i, j);
        p.prefix_inter[j] += inter[j];
      }
      a[l] = cci_a(detail::span_of(inter), prefix_sizes, size);  // eq. 9
      b[l] = cci_b(stats.mass(l, i, i), size);                   // eq. 9
    }
    p.a_bar = layer_mean(detail::span_of(a));                    // eq. 10
    p.b_bar = layer_mean(detail::span_of(b));                    // eq. 10
    p.cci = cache_context_impact(p.a_bar, p.b_bar);              // eq. 11
    p.token_ranking = rank_tokens(detail::span_of(stats.token_prefix_attention[i]));  // eq. 14
    return p;
  }

  CCIScorerConfig config_;
};

}  // namespace kvfuse
