#pragma once
// VariantBook: Cache-Craft's variants (§3.3) kept by whoever drives the forward pass: the VariantCache and where each
// variant's KV was rotated, which plan_fusion reads (VariantIndex). The cache holds metadata only; the KV is in the
// caller's store, under variant_key(model, chunk, ids of its stored prefix). FusionPipeline fills it offline
// (record_context); an engine that owns its step loop (CpuBatchEngine, or one outside kvfuse on FusionConnector's
// hooks) fills it from its own cachecraft requests:
//
//   plan = connector.plan(r, tokens, layout, method, book.index());  book.record_uses(plan);
//   if (VariantBook::collects_variants(method, layout, plan))        the forward pass reports attention statistics
//     LayerNeeds::after_layer = true, groups = &plan.layout;         over the layout's chunks; after_layer keeps each
//                                                                   layer's LayerReport::attention and selected
//   at the end of the prefill: for (v : VariantBook::new_variants(tokens, layout, plan, attention, selected, model))
//     save v.rows under v.key; once stored: book.admit(v.profile, v.key, v.rows.begin, store)
//   a failed read of a planned variant: book.forget(plan.chunks[j]) before recovering the plan

#include <algorithm>
#include <cstdint>
#include <span>
#include <unordered_map>
#include <utility>
#include <variant>
#include <vector>

#include "kvfuse/backend/concepts.hpp"
#include "kvfuse/cache/variant_cache.hpp"
#include "kvfuse/core/keys.hpp"
#include "kvfuse/core/prompt.hpp"
#include "kvfuse/core/types.hpp"
#include "kvfuse/fusion/fusion_backend.hpp"
#include "kvfuse/fusion/fusion_method.hpp"
#include "kvfuse/fusion/layer_protocol.hpp"
#include "kvfuse/fusion/planner.hpp"
#include "kvfuse/select/cci_scorer.hpp"

namespace kvfuse {

// What record_context learns from an earlier prompt's statistics: per chunk, its Cache-Craft profile and whether it
// becomes a variant.
struct ChunkProfiles {
  std::vector<ChunkProfile> profiles;  // CCIScorer's (eq. 3-11, 14), one per layout chunk
  std::vector<bool> variant;           // false: an empty chunk or a repeat of an earlier one
};

// A variant a request's prefill made (VariantBook::new_variants): its profile, the store key of its KV, and the rows
// of the request that hold that KV (rotated at rows.begin: the variant's first position).
struct NewVariant {
  ChunkProfile profile;
  KVKey key;
  TokenRange rows;
};

// The first position of a variant's KV is guarded by the caller's lock (FusionPipeline's; CpuBatchEngine's step
// thread); the cache is synchronized itself.
class VariantBook {
 public:
  explicit VariantBook(VariantCacheConfig config) : cache_(config) {}

  [[nodiscard]] VariantCache& cache() noexcept { return cache_; }
  [[nodiscard]] const VariantCache& cache() const noexcept { return cache_; }

  // What plan_fusion may choose from.
  [[nodiscard]] VariantIndex index() const { return {&cache_, &first_positions_}; }

  // The profile of every chunk of an earlier prompt from the attention statistics (groups = layout) of its full
  // prefill on `backend`, which keeps the prompt's KV.
  template <class Backend>
    requires PerLayerFusionBackend<Backend> || AttentionStatisticsBackend<Backend>
  [[nodiscard]] static ChunkProfiles profile(Backend& backend, std::span<const token_id> tokens,
                                             const PromptLayout& layout) {
    std::vector<LayerAttention> layers;
    TokenSet all;
    append_range(all, {0, static_cast<std::int64_t>(tokens.size())});
    backend.begin(tokens);
    if constexpr (PerLayerFusionBackend<Backend>) {
      const SelectionPolicy keep_all = [&layers](const LayerReport& r) {
        layers.push_back(*r.attention);
        return r.selected;
      };
      (void)backend.prefill(all, keep_all, StatisticsRequest{&layout});
    } else {
      const AttentionSink keep = [&layers](std::int64_t, LayerAttention a) { layers.push_back(std::move(a)); };
      (void)backend.prefill(all, layout, keep);
    }
    return profiles_of(tokens, layout, layers, std::vector<TokenSet>(layers.size(), all));
  }

  // The profiles from the attention statistics (groups = layout) of a run whose layer l computed the rows
  // selected[l]: a chunk becomes a variant when its rows were computed on every layer (its statistics are then
  // complete: computed_on_every_layer) and it is neither empty nor a repeat of an earlier chunk.
  [[nodiscard]] static ChunkProfiles profiles_of(std::span<const token_id> tokens, const PromptLayout& layout,
                                                 const std::vector<LayerAttention>& layers,
                                                 const std::vector<TokenSet>& selected) {
    // Chunk ids must be unique for the statistics (Cache-Craft eq. 6-7 treat prefixes as sets): an empty chunk
    // or a repeat of an earlier chunk gets a placeholder id and is not stored as a variant.
    std::vector<std::uint64_t> ids;
    ChunkProfiles out;
    out.variant.assign(layout.chunks.size(), false);
    for (std::size_t j = 0; j < layout.chunks.size(); ++j) {
      const TokenRange r = layout.chunks[j].range;
      const std::uint64_t id = chunk_content_id(slice(tokens, r));
      const bool unique = !r.empty() && std::find(ids.begin(), ids.end(), id) == ids.end();
      out.variant[j] = unique && computed_on_every_layer(r, selected);
      ids.push_back(unique ? id : detail::mix64(id ^ (0x5bd1e995ull * (j + 1))));
    }
    out.profiles = CCIScorer().profile(chunk_attention(ids, layout, layers, selected));
    return out;
  }

  // Whether a request of `method` with this plan makes variants: Cache-Craft computing every row of a reusable chunk
  // of `layout` (the request's; the plan's marks what it loads) on its first layer (none stored, or a variant whose
  // ⌈CFO · |C|⌉ is the whole chunk). Its forward pass then collects attention statistics over the layout's chunks
  // for new_variants (§3.3: a variant per new chunk and prefix).
  [[nodiscard]] static bool collects_variants(const FusionMethod& method, const PromptLayout& layout,
                                              const FusionPlan& plan) {
    if (!std::holds_alternative<CacheCraft>(method)) return false;
    for (std::size_t j = 0; j < plan.chunks.size(); ++j)
      if (layout.chunks[j].cached && !plan.chunks[j].range.empty() &&
          computed_on_every_layer(plan.chunks[j].range, {&plan.initial, 1}))
        return true;
    return false;
  }

  // At the end of such a request's prefill, from each layer's statistics (groups = plan.layout) and the rows S_l it
  // computed: each reusable chunk of `layout` computed on every layer (focus termination did not stop it) that is
  // not the variant it loaded, with its profile (CCI, the eq. 14 order) and key under `model`'s fingerprint.
  [[nodiscard]] static std::vector<NewVariant> new_variants(std::span<const token_id> tokens,
                                                            const PromptLayout& layout, const FusionPlan& plan,
                                                            const std::vector<LayerAttention>& layers,
                                                            const std::vector<TokenSet>& selected,
                                                            std::uint64_t model) {
    detail::require(!layers.empty() && layers.size() == selected.size(),
                    "VariantBook::new_variants: {} layers of attention statistics for {} layers of rows (a request "
                    "that collects variants asks its forward pass for groups = &plan.layout on every layer)",
                    layers.size(), selected.size());
    std::vector<NewVariant> out;
    ChunkProfiles found = profiles_of(tokens, plan.layout, layers, selected);
    for (std::size_t j = 0; j < plan.chunks.size(); ++j) {
      if (!found.variant[j] || !layout.chunks[j].cached) continue;
      ChunkProfile& p = found.profiles[j];
      KVKey key = variant_key(model, p.chunk_id, p.stored_prefix);
      if (key == plan.chunks[j].key) continue;  // the variant it loaded
      out.push_back({std::move(p), std::move(key), plan.chunks[j].range});
    }
    return out;
  }

  // Admits a variant whose KV (under `kv`, rotated at first_position) the caller puts next. The KV of the variants
  // it evicts is erased from `store`; this book is updated first, so a store that throws leaves it consistent.
  template <KVStore Store>
  void admit(const ChunkProfile& profile, const KVKey& kv, std::int64_t first_position, Store& store) {
    const VariantInsertResult inserted = cache_.insert(profile, kv);
    for (const VariantEntry& gone : inserted.evicted) first_positions_.erase(gone.kv.content);
    first_positions_[kv.content] = first_position;
    for (const VariantEntry& gone : inserted.evicted) store.erase(gone.kv);
  }

  // Drops the variants whose KV `store` no longer holds. Returns the number dropped.
  template <KVStore Store>
  std::int64_t drop_stale(Store& store) {
    std::int64_t dropped = 0;
    for (const VariantEntry& v : cache_.entries()) {
      if (store.contains(v.kv)) continue;
      cache_.erase(v.id);
      first_positions_.erase(v.kv.content);
      ++dropped;
    }
    return dropped;
  }

  // Forgets the variant a plan's chunk loaded (its read failed: the KV is gone or unusable).
  void forget(const ChunkPlan& c) {
    if (c.source != KVSource::variant) return;
    cache_.erase(c.variant_id);
    first_positions_.erase(c.key.content);
  }

  // A run uses its planned variants: f_r += 1/CFO (Cache-Craft §3.3).
  void record_uses(const FusionPlan& plan) {
    for (const ChunkPlan& c : plan.chunks)
      if (c.source == KVSource::variant) cache_.record_use(c.variant_id, c.cfo);
  }

 private:
  VariantCache cache_;
  std::unordered_map<std::uint64_t, std::int64_t> first_positions_;  // variant key content -> first position
};

}  // namespace kvfuse
