#pragma once
// HKVDSelector: CacheBlend's choice of the tokens to recompute on each layer, with gradual filtering
// (CacheBlend section 4.3, Figure 9; defaults from sections 4.3, 5 and 5.1).
//
// What it does. Layer 0 computes every token. On a *check layer* l the engine has computed the K/V of the
// currently selected tokens S_l; it compares them with the K/V loaded from the chunk caches (the per-token
// KV deviation, kvfuse/detail/kv_deviation.hpp) and the selector keeps, for the following layers, only the
// reusable tokens of S_l with the highest deviation -- the HKVD tokens (Insight 1: recomputing them reduces
// the attention deviation most; Insight 2: HKVD tokens of one layer are likely HKVD tokens of the next).
// Check i keeps r_i * (number of reusable tokens) of them with r_1 >= r_2 >= ... >= r, each time among the
// survivors of the previous check, so the set only shrinks. The query (suffix) and every token of a chunk
// without stored KV (PromptChunk::cached == false) are always computed.
//
// When to use it. Position-independent reuse of chunk caches (RAG passages in any order) when the engine
// can compute the K/V deviation on a few layers and wants a data-driven selection per prompt. Prefer
// AttnLinkBoundary (Epic) for a static selection that needs no per-layer feedback, CCIScorer (Cache-Craft)
// when chunk statistics from earlier runs are stored with the caches, and plain prefix caching when chunks
// always appear in the same order. The recompute ratio r can come from LoadingController (section 5.1).
//
// Defaults and why.
//   - r = 0.15: the paper's default recompute ratio (section 5: "recomputing 15% of the tokens (the default
//     recompute ratio)"; r* = 15 % in section 5.1 from Figure 16).
//   - check layers {1, 2, 3}. Layer 0 can never be a check layer (rejected by validate()): its K/V depend
//     only on the token and its position, so after the positional fix-up the cached layer-0 K/V equal full
//     prefill and every deviation is 0. CacheBlend's reference implementation checks on layer 1 too.
//   - keep ratios r + {0.10, 0.05, 0} = {0.25, 0.20, 0.15}. Section 4.3 asks for r_1 "slightly higher than
//     r" and r_2 "slightly less than r_1". The first check has seen a single layer of cross-chunk attention,
//     so it gets the widest margin; the set reaches r after three layers. The margins cost 0.10 + 0.05
//     layer-equivalents of reusable tokens, about 0.5 % of a full prefill of a 30-layer model.
//     Margins (not absolute ratios) are configured so that changing r alone keeps the schedule consistent.
//   - the selector ranks whatever per-token scores it is given; for CacheBlend the deviations, of the tensor
//     (K or V; CacheBlend's reference implementation uses V) CacheBlend::rank_by names (fusion/fusion_method.hpp).
//     QueryAwareSelector (select/query_aware_selector.hpp) runs the same schedule on other scores.
//   - counts: check i keeps round(r_i * n_reusable) reusable tokens (nearest integer; the reference
//     implementation truncates, which turns 0.29 * 100 = 28.999... into 28; detail::keep_count, the same
//     count the GPU top-k keeps). Ties in deviation go to the lower position; a NaN deviation ranks first
//     (detail::ranks_before, the order of the GPU top-k too): a corrupt row is recomputed, not kept.

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <span>
#include <utility>
#include <vector>

#include "kvfuse/core/error.hpp"
#include "kvfuse/core/prompt.hpp"
#include "kvfuse/detail/kv_deviation.hpp"
#include "kvfuse/detail/math.hpp"

namespace kvfuse {

// The per-token KV deviations HKVDSelector ranks (CacheBlend section 4.1), on the host:
// out[i] = detail::kv_token_deviation(recomputed, cached, row_stride, rows[i], num_heads, head_dim).
// Every row must lie inside both matrices; bad shapes and out-of-range rows throw kvfuse::error. The CUDA
// deviation kernel (kv_topk.cuh) runs the same element math.
inline void kv_deviation(std::span<const float> recomputed, std::span<const float> cached, std::int64_t row_stride,
                         std::int64_t num_heads, std::int64_t head_dim, std::span<const std::int64_t> rows,
                         std::span<float> out) {
  detail::require(num_heads >= 1, "kv_deviation: num_heads {} must be at least 1", num_heads);
  detail::require(head_dim >= 1, "kv_deviation: head_dim {} must be at least 1", head_dim);
  detail::require(head_dim <= std::numeric_limits<std::int64_t>::max() / num_heads,
          "kv_deviation: num_heads * head_dim = {} * {} overflows int64", num_heads, head_dim);
  const std::int64_t width = num_heads * head_dim;
  detail::require(row_stride >= width, "kv_deviation: row_stride {} is smaller than num_heads * head_dim = {}", row_stride,
          width);
  detail::require(rows.size() == out.size(), "kv_deviation: {} rows but the output holds {} values", rows.size(),
          out.size());
  // Rows r with r * row_stride + width <= size, counted without overflow.
  const auto rows_in = [&](std::size_t size) -> std::int64_t {
    const auto n = static_cast<std::int64_t>(size);
    return n < width ? 0 : (n - width) / row_stride + 1;
  };
  const std::int64_t limit = std::min(rows_in(recomputed.size()), rows_in(cached.size()));
  for (std::size_t i = 0; i < rows.size(); ++i) {
    detail::require(rows[i] >= 0 && rows[i] < limit,
            "kv_deviation: row {} (entry {}) is outside the {} rows the recomputed ({} floats) and cached ({} floats) "
            "matrices hold",
            rows[i], i, limit, recomputed.size(), cached.size());
    out[i] = detail::kv_token_deviation(recomputed.data(), cached.data(), row_stride, rows[i], num_heads, head_dim);
  }
}

struct HKVDConfig {
  // r: fraction of the reusable tokens still recomputed after the last check layer.
  double recompute_ratio = 0.15;
  // Layers whose K/V deviation re-selects the set for the layers after them; strictly increasing, >= 1.
  std::vector<int> check_layers{1, 2, 3};
  // Check i keeps r_i = min(1, r + ratio_margins[i]); non-increasing, >= 0, the last one 0 (so r_last = r).
  std::vector<double> ratio_margins{0.10, 0.05, 0.0};
  // r_i of check i (CacheBlend section 4.3, gradual filtering).
  [[nodiscard]] double check_ratio(std::size_t i) const {
    detail::require(i < ratio_margins.size(), "HKVDConfig: check index {} is not below {}", i,
                    ratio_margins.size());
    return std::min(1.0, recompute_ratio + ratio_margins[i]);
  }

  void validate() const {
    detail::require(recompute_ratio >= 0.0 && recompute_ratio <= 1.0,
                    "HKVDConfig: recompute_ratio {} is not in [0, 1]", recompute_ratio);
    detail::require(!check_layers.empty(), "HKVDConfig: check_layers is empty; at least one check layer is needed");
    detail::require(check_layers.front() >= 1,
                    "HKVDConfig: check_layers[0] = {} must be at least 1 (layer-0 K/V depend only on token and "
                    "position, so their deviation is always 0)",
                    check_layers.front());
    for (std::size_t i = 1; i < check_layers.size(); ++i) {
      detail::require(check_layers[i] > check_layers[i - 1],
                      "HKVDConfig: check_layers[{}] = {} must be greater than check_layers[{}] = {}", i,
                      check_layers[i], i - 1, check_layers[i - 1]);
    }
    detail::require(ratio_margins.size() == check_layers.size(),
                    "HKVDConfig: {} ratio_margins for {} check_layers; give one margin per check layer",
                    ratio_margins.size(), check_layers.size());
    for (std::size_t i = 0; i < ratio_margins.size(); ++i) {
      detail::require(ratio_margins[i] >= 0.0 && ratio_margins[i] <= 1.0,
                      "HKVDConfig: ratio_margins[{}] = {} is not in [0, 1]", i, ratio_margins[i]);
      if (i > 0) {
        detail::require(ratio_margins[i] <= ratio_margins[i - 1],
                        "HKVDConfig: ratio_margins[{}] = {} exceeds ratio_margins[{}] = {}; gradual filtering "
                        "only shrinks the set",
                        i, ratio_margins[i], i - 1, ratio_margins[i - 1]);
      }
    }
    detail::require(ratio_margins.back() == 0.0,
                    "HKVDConfig: the last ratio margin is {} but must be 0 so that the last check keeps "
                    "recompute_ratio",
                    ratio_margins.back());
  }
};

// What gradual filtering will compute, known before any deviation is seen: the set sizes depend only on the
// layout and the ratio schedule, which tokens survive depends on the deviations.
struct HKVDPlan {
  std::int64_t num_tokens = 0;        // n: prompt tokens
  std::int64_t reusable_tokens = 0;   // tokens of cached chunks: the only ones a check can drop
  std::int64_t mandatory_tokens = 0;  // query + uncached chunks: computed on every layer
  std::vector<int> check_layers;
  std::vector<double> check_ratios;            // r_i of each check
  std::vector<std::int64_t> kept_reusable;     // reusable tokens kept by each check
  std::vector<std::int64_t> tokens_per_layer;  // |S_l|: tokens layer l computes, l = 0 .. L-1

  // sum_l |S_l| / (L * n): compute relative to full prefill (CacheBlend section 4.2: the overhead is
  // proportional to the number of selected tokens). 0 for an empty prompt.
  [[nodiscard]] double compute_fraction() const {
    std::int64_t total = 0;
    for (std::int64_t t : tokens_per_layer) total += t;
    const auto full = static_cast<double>(num_tokens) * static_cast<double>(tokens_per_layer.size());
    return full == 0.0 ? 0.0 : static_cast<double>(total) / full;
  }
};

class HKVDSelector {
 public:
  HKVDSelector(HKVDConfig config, PromptLayout layout, int num_layers)
      : config_(std::move(config)), layout_(std::move(layout)), num_layers_(num_layers) {
    config_.validate();
    layout_.validate();
    detail::require(num_layers_ >= 1, "HKVDSelector: num_layers {} must be at least 1", num_layers_);
    detail::require(config_.check_layers.back() < num_layers_,
                    "HKVDSelector: check layer {} is not below num_layers = {}", config_.check_layers.back(),
                    num_layers_);
    const std::int64_t n = layout_.num_tokens();
    reusable_.assign(static_cast<std::size_t>(n), 0);
    for (const PromptChunk& chunk : layout_.chunks) {
      if (!chunk.cached) continue;
      for (std::int64_t t = chunk.range.begin; t < chunk.range.end; ++t) reusable_[static_cast<std::size_t>(t)] = 1;
      num_reusable_ += chunk.range.size();
    }
  }

  [[nodiscard]] const HKVDConfig& config() const noexcept { return config_; }
  [[nodiscard]] const PromptLayout& layout() const noexcept { return layout_; }
  [[nodiscard]] int num_layers() const noexcept { return num_layers_; }
  [[nodiscard]] std::int64_t num_tokens() const noexcept { return layout_.num_tokens(); }
  [[nodiscard]] std::int64_t reusable_tokens() const noexcept { return num_reusable_; }
  [[nodiscard]] std::int64_t mandatory_tokens() const noexcept { return num_tokens() - num_reusable_; }

  // True when `pos` belongs to a cached chunk (so a check may drop it).
  [[nodiscard]] bool is_reusable(std::int64_t pos) const {
    validate_range({pos, pos + 1}, num_tokens(), "HKVDSelector::is_reusable");
    return reusable_[static_cast<std::size_t>(pos)] != 0;
  }

  // S_0: layer 0 computes every token.
  [[nodiscard]] TokenSet initial() const {
    TokenSet all;
    all.reserve(static_cast<std::size_t>(num_tokens()));
    append_range(all, {0, num_tokens()});
    return all;
  }

  [[nodiscard]] bool is_check_layer(int layer) const {
    check_layer_index(layer);
    return std::binary_search(config_.check_layers.begin(), config_.check_layers.end(), layer);
  }

  // Reusable tokens the check on `layer` keeps: round(r_i * n_reusable) (see the header comment).
  [[nodiscard]] std::int64_t keep_count(int layer) const {
    detail::require(is_check_layer(layer), "HKVDSelector::keep_count: layer {} is not a check layer", layer);
    return budget(check_position(layer));
  }

  // S_{l+1} from S_l = `current` (the tokens layer `layer` computed). On a check layer, score[i] ranks token
  // current[i]: CacheBlend's KV deviation on this layer, or any other per-token score where higher means
  // "recompute first" (QueryAwareSelector's query attention mass, select/query_aware_selector.hpp). The entries
  // of mandatory tokens are ignored, the others must be >= 0 or NaN (a NaN ranks first). The result keeps every
  // mandatory token of `current` plus its keep_count(layer) reusable tokens of highest score (ties: lower
  // position first), so it is a subset of `current` (CacheBlend section 4.3, gradual filtering). On other
  // layers the set is returned unchanged and `score` is not read (it may be empty).
  [[nodiscard]] TokenSet select(int layer, const TokenSet& current, std::span<const float> score) const {
    check_layer_index(layer);
    validate_current(current);
    if (!std::binary_search(config_.check_layers.begin(), config_.check_layers.end(), layer)) return current;
    detail::require(score.size() == current.size(),
                    "HKVDSelector::select: layer {} got {} scores for a set of {} tokens", layer, score.size(),
                    current.size());

    std::vector<std::size_t> candidates;  // indices into current of its reusable tokens
    candidates.reserve(current.size());
    std::vector<unsigned char> keep(current.size(), 0);
    for (std::size_t i = 0; i < current.size(); ++i) {
      if (reusable_[static_cast<std::size_t>(current[i])] != 0) {
        detail::require(!(score[i] < 0.0f),
                        "HKVDSelector::select: score {} of token {} (entry {}) on layer {} is negative", score[i],
                        current[i], i, layer);
        candidates.push_back(i);
      } else {
        keep[i] = 1;
      }
    }
    const auto k = static_cast<std::size_t>(
        std::min<std::int64_t>(budget(check_position(layer)), static_cast<std::int64_t>(candidates.size())));
    // Top-k by (score desc, position asc) in O(n); current is sorted, so position order is index order.
    detail::partition_top_k(std::span<std::size_t>(candidates), score.data(), k);
    for (std::size_t c = 0; c < k; ++c) keep[candidates[c]] = 1;

    TokenSet next;
    next.reserve(k + static_cast<std::size_t>(mandatory_tokens()));
    for (std::size_t i = 0; i < current.size(); ++i) {
      if (keep[i] != 0) next.push_back(current[i]);
    }
    return next;
  }

  // The set sizes gradual filtering produces on every layer.
  [[nodiscard]] HKVDPlan plan() const {
    HKVDPlan p;
    p.num_tokens = num_tokens();
    p.reusable_tokens = num_reusable_;
    p.mandatory_tokens = mandatory_tokens();
    p.check_layers = config_.check_layers;
    std::int64_t kept = num_reusable_;
    std::size_t next_check = 0;
    for (int layer = 0; layer < num_layers_; ++layer) {
      p.tokens_per_layer.push_back(p.mandatory_tokens + kept);
      if (next_check < config_.check_layers.size() && config_.check_layers[next_check] == layer) {
        kept = std::min(kept, budget(next_check));
        p.check_ratios.push_back(config_.check_ratio(next_check));
        p.kept_reusable.push_back(kept);
        ++next_check;
      }
    }
    return p;
  }

 private:
  void check_layer_index(int layer) const {
    detail::require(layer >= 0 && layer < num_layers_, "HKVDSelector: layer {} is not in [0, {})", layer,
                    num_layers_);
  }

  [[nodiscard]] std::size_t check_position(int layer) const {
    return static_cast<std::size_t>(
        std::lower_bound(config_.check_layers.begin(), config_.check_layers.end(), layer) -
        config_.check_layers.begin());
  }

  // round(r_i * n_reusable), the nearest integer (halves round up).
  [[nodiscard]] std::int64_t budget(std::size_t check) const {
    return detail::keep_count(config_.check_ratio(check), num_reusable_);
  }

  void validate_current(const TokenSet& current) const {
    const std::int64_t n = num_tokens();
    std::int64_t mandatory = 0;
    for (std::size_t i = 0; i < current.size(); ++i) {
      detail::require(current[i] >= 0 && current[i] < n, "HKVDSelector: token {} (entry {}) is not in [0, {})",
                      current[i], i, n);
      if (i > 0) {  // not current[i - 1] for i == 0: the message's arguments are evaluated before the check
        detail::require(current[i] > current[i - 1],
                        "HKVDSelector: token set is not sorted and unique: {} follows {} at entry {}", current[i],
                        current[i - 1], i);
      }
      if (reusable_[static_cast<std::size_t>(current[i])] == 0) ++mandatory;
    }
    detail::require(mandatory == mandatory_tokens(),
                    "HKVDSelector: token set holds {} of the {} mandatory tokens (query and uncached chunks)",
                    mandatory, mandatory_tokens());
  }

  HKVDConfig config_;
  PromptLayout layout_;
  int num_layers_;
  std::vector<unsigned char> reusable_;  // per position: 1 when in a cached chunk
  std::int64_t num_reusable_ = 0;
};

}  // namespace kvfuse
