#pragma once
// FusionPipeline: the driver for an engine that serves one request at a time. Chunk caches live in a KVStore, and
// every FusionMethod (fusion_method.hpp) runs as one policy of the same layer-wise partial prefill on an engine that
// models FixedSetFusionBackend or PerLayerFusionBackend (fusion/fusion_backend.hpp; the reference CPU backend's
// model is CpuLlamaFusion). The engine keeps the request's KV; the pipeline plans, loads, checks and shifts, and
// drives its prefill. Its parts, each usable by an engine that drives itself:
//   planner.hpp       plan_fusion: each chunk's source and S_0 from the store's index (no side effects)
//   entry_loader.hpp  the stored KV into the engine, checked, and the recover rules for unusable entries; layer by
//                     layer through connector.hpp's I/O executor (FusionConnector, persistent: one per pipeline)
//   variant_book.hpp  Cache-Craft's variants (VariantCache and where each was rotated)
//   load_control.hpp  L_p (Cache-Craft eq. 16), CacheBlend §5.1's ratio and storage tier from measured speeds
//   fusion_result.hpp FusionResult, LoadConfig
//
// Offline (chunk caches are generated ahead of time, as in the papers):
//   store_chunk_caches(tokens, layout)  each chunk's KV alone at position 0 (CacheBlend, Epic), or behind the
//                                       layout's chunk_context, once per (model fingerprint, chunk tokens, context)
//   record_context(tokens, layout)      an earlier prompt's full prefill with attention statistics: each chunk's
//                                       in-context KV stored as a prefix-cache entry (keyed by the chain of chunks
//                                       before it) and as a Cache-Craft variant (CCIScorer's ChunkProfile)
// Online:
//   plan(tokens, layout, method)        FusionPlan (planner.hpp): reads the store's index and the variants only
//   run(tokens, layout, method)         load, check and RoPE-shift the planned KV, then the partial prefill with the
//                                       method's S_l (layer_schedule) -> logits, timed; the KV stays in the engine
//
// Layer-pipelined loading (LoadConfig::layerwise, on by default; needs a LayerwiseFusionBackend engine and a
// RangedKVStore; not for QueryProbe, whose two passes over the same KV load it whole first): the entries are read
// a layer at a time while the engine computes, L_p layers ahead (Cache-Craft §3.4.2, Algorithm 2; entry_loader.hpp).
// L_p is eq. 16 on the load and compute times per layer measured on the previous layer-pipelined run
// (load_control.hpp; 1 before any run; LoadConfig::preload_depth fixes it). The bytes
// installed are those of a whole-block load, so the result is the same bit for bit; the trace (FusionResult::load)
// records per layer the read, the wait, the install and the compute. A layer read that fails or times out
// (LoadConfig::layer_timeout_ms) stops the prefill, which runs again without that entry.
//
// Store entries are never trusted blindly (entry_loader.hpp): one that is missing, has the wrong size or token
// count, or was rotated at other positions than recorded is not used. An isolated chunk cache is then recomputed
// and put back (a put that throws kvfuse::error is kept in FusionResult::put_failures and does not fail the
// request); a prefix or variant entry, or a chunk cache computed behind a chunk context, turns its chunk into
// `compute`. The disk store adds checksums below this.
//
// Keys: every key carries the model fingerprint. Contents are domain-separated hashes of the chunk tokens:
// isolated = H(chunk) (seeded with H(context) behind a chunk context), prefix = H(chunk_0, ..., chunk_j) chained,
// variant = H(chunk, ids of its stored prefix).
//
// Thread safety: a pipeline drives one engine, whose KV belongs to the request being served, so its requests are
// serialized: run, run_after_prefix, plan, record_context, store_chunk_caches, store_prefix, drop_stale_variants and
// set_load_config may be called from any number of threads and take turns on one lock (the variant cache is
// synchronized itself, variants() may be read at any time). Serve in parallel with one pipeline per engine (worker,
// backend) over one shared store, which must then be safe for concurrent use (every kvfuse store is). Each pipeline
// has its own variant cache: a variant that another pipeline evicted (and erased) is dropped by this one's next
// Cache-Craft run, or computed instead when it vanishes mid-request. Calls that use the engine outside the pipeline
// (run_composed: Cake's prefix, then run_after_prefix) must be serialized with the pipeline's requests by the caller.

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <mutex>
#include <span>
#include <utility>
#include <variant>
#include <vector>

#include <fmt/format.h>

#include "kvfuse/backend/concepts.hpp"
#include "kvfuse/cache/variant_cache.hpp"
#include "kvfuse/core/error.hpp"
#include "kvfuse/core/keys.hpp"
#include "kvfuse/core/prompt.hpp"
#include "kvfuse/core/types.hpp"
#include "kvfuse/fusion/entry_loader.hpp"
#include "kvfuse/fusion/fusion_backend.hpp"
#include "kvfuse/fusion/fusion_method.hpp"
#include "kvfuse/fusion/fusion_result.hpp"
#include "kvfuse/fusion/layer_protocol.hpp"
#include "kvfuse/fusion/layer_schedule.hpp"
#include "kvfuse/fusion/planner.hpp"
#include "kvfuse/fusion/variant_book.hpp"

namespace kvfuse {

template <FixedSetFusionBackend Backend, KVStore Store>
class FusionPipeline {
 public:
  // The engine's shape (model, layers, bytes per row, the cost of a forward call) is read here, once.
  FusionPipeline(Backend& backend, Store& store, VariantCacheConfig variants = {}, LoadConfig load = {})
      : backend_(&backend),
        store_(&store),
        shape_(engine_shape(backend)),
        variants_(variants),
        load_(load),
        loader_(backend, store, shape_) {
    load_.validate();
  }

  [[nodiscard]] LoadConfig load_config() const {
    std::lock_guard lock(mutex_);
    return load_;
  }
  void set_load_config(LoadConfig load) {
    load.validate();
    std::lock_guard lock(mutex_);
    load_ = load;
  }

  [[nodiscard]] Backend& backend() const noexcept { return *backend_; }
  [[nodiscard]] Store& store() const noexcept { return *store_; }
  [[nodiscard]] VariantCache& variants() noexcept { return variants_.cache(); }
  [[nodiscard]] const VariantCache& variants() const noexcept { return variants_.cache(); }
  // The variants as a plan chooses from them (planner.hpp): for an engine that plans its own requests.
  [[nodiscard]] VariantIndex variant_index() const { return variants_.index(); }

  [[nodiscard]] KVKey isolated_key(std::span<const token_id> chunk, std::span<const token_id> context = {}) const {
    return chunk_cache_key(shape_.model, chunk, context);
  }

  // The engine as a plan sees it (planner.hpp).
  [[nodiscard]] EngineShape shape() const { return shape_; }

  // Offline: the isolated cache of every chunk of the layout that the store does not hold yet, computed at
  // position 0, or behind the layout's chunk_context when it has one (the chunks after it: the engine prefills
  // the context and the chunk, and keeps the chunk's rows). Returns the number computed.
  std::int64_t store_chunk_caches(std::span<const token_id> tokens, const PromptLayout& layout) {
    check_prompt(tokens, layout, "FusionPipeline::store_chunk_caches");
    std::lock_guard lock(mutex_);
    const auto context = slice(tokens, {0, layout.chunk_context});
    std::int64_t computed = 0;
    for (const PromptChunk& c : layout.chunks) {
      if (c.range.empty() || c.range.end <= layout.chunk_context) continue;
      const auto chunk = slice(tokens, c.range);
      const KVKey key = isolated_key(chunk, context);
      if (store_->get(key).has_value()) continue;  // a get, not contains: validates it, warms a tiered store
      if (context.empty()) {
        loader_.put(key, backend_->chunk_kv(chunk, 0));
      } else {
        const std::vector<token_id> both = chunk_cache_input(tokens, layout, c.range);
        backend_->begin(both);
        TokenSet rows;
        append_range(rows, {0, static_cast<std::int64_t>(both.size())});
        (void)backend_->prefill(rows);
        loader_.put(key, backend_->save_rows({layout.chunk_context, static_cast<std::int64_t>(both.size())}));
      }
      ++computed;
    }
    return computed;
  }

  // Offline: an earlier prompt's full prefill with attention statistics. Stores each chunk's in-context KV
  // as a prefix-cache entry and as a Cache-Craft variant (the profile from CCIScorer, eq. 3-11, 14); KV of
  // variants the VariantCache evicts is erased from the store.
  void record_context(std::span<const token_id> tokens, const PromptLayout& layout)
    requires PerLayerFusionBackend<Backend> || AttentionStatisticsBackend<Backend>
  {
    check_prompt(tokens, layout, "FusionPipeline::record_context");
    std::lock_guard lock(mutex_);
    const ChunkProfiles chunks = VariantBook::profile(*backend_, tokens, layout);
    std::uint64_t prefix = kHashSeed;
    for (std::size_t j = 0; j < layout.chunks.size(); ++j) {
      const TokenRange r = layout.chunks[j].range;
      prefix = hash_tokens(slice(tokens, r), prefix);
      if (r.empty()) continue;
      const KVBlock block = backend_->save_rows(r);
      loader_.put(chained_prefix_key(shape_.model, prefix), block);
      if (!chunks.variant[j]) continue;
      const ChunkProfile& profile = chunks.profiles[j];
      const KVKey vkey = variant_key(shape_.model, profile.chunk_id, profile.stored_prefix);
      variants_.admit(profile, vkey, r.begin, *store_);
      loader_.put(vkey, block);  // also refreshes the KV of a variant that was already known
    }
  }

  // Drops the Cache-Craft variants whose KV the store no longer holds (an engine that evicted or lost it), so
  // that lookups never choose a variant that cannot be loaded. run() calls it first. Returns the number dropped.
  std::int64_t drop_stale_variants() {
    std::lock_guard lock(mutex_);
    return variants_.drop_stale(*store_);
  }

  // Online, no compute: what `method` will do for this prompt given what the store holds now (Cache-Craft
  // variants are assumed to be in the store: see drop_stale_variants).
  [[nodiscard]] FusionPlan plan(std::span<const token_id> tokens, const PromptLayout& layout,
                                const FusionMethod& method) const {
    check_prompt(tokens, layout, "FusionPipeline::plan");
    std::lock_guard lock(mutex_);
    return plan_fusion(0, tokens, layout, method, shape_, *store_, variants_.index());
  }

  // Online: the prompt's KV (in the engine) and last-token logits by `method`, timed. A method whose S_l
  // needs per-layer feedback (CacheBlend, QueryAware, Cache-Craft with focus termination) is refused with a
  // named error when the engine models only FixedSetFusionBackend.
  FusionResult run(std::span<const token_id> tokens, const PromptLayout& layout, const FusionMethod& method) {
    check_prompt(tokens, layout, "FusionPipeline::run");
    std::lock_guard lock(mutex_);
    backend_->begin(tokens);
    FusionResult out;
    fuse(tokens, layout, method, 0, out);
    return out;
  }

  // A method type that always needs per-layer feedback does not compile for a fixed-set engine.
  template <class Method>
    requires(needs_per_layer_backend<Method> && !PerLayerFusionBackend<Backend>)
  FusionResult run(std::span<const token_id> tokens, const PromptLayout& layout, const Method& method) = delete;

  // Offline, for run_composed: the exact KV of the prompt's first `prefix_tokens` tokens, stored as Cake's
  // prefix-cache entries (prefix_chunk_keys on a grid of `fetch_chunk` tokens: what an earlier request with
  // the same prefix leaves behind). Returns the number of entries put.
  std::int64_t store_prefix(std::span<const token_id> tokens, std::int64_t prefix_tokens, std::int64_t fetch_chunk) {
    detail::require(prefix_tokens >= 1 && prefix_tokens <= static_cast<std::int64_t>(tokens.size()) && fetch_chunk >= 1,
                    "FusionPipeline::store_prefix: {} prefix tokens of a {}-token prompt in chunks of {}",
                    prefix_tokens, tokens.size(), fetch_chunk);
    const auto prefix = tokens.first(static_cast<std::size_t>(prefix_tokens));
    std::lock_guard lock(mutex_);
    backend_->begin(prefix);
    TokenSet all;
    append_range(all, {0, prefix_tokens});
    (void)backend_->prefill(all);
    const auto keys = prefix_chunk_keys(shape_.model, prefix, fetch_chunk);
    for (std::int64_t b = 0; b < prefix_tokens; b += fetch_chunk)
      loader_.put(keys[static_cast<std::size_t>(b / fetch_chunk)],
                  backend_->save_rows({b, std::min(b + fetch_chunk, prefix_tokens)}));
    return static_cast<std::int64_t>(keys.size());
  }

  // Online, for a request whose first rows are already prepared: the engine's request for `tokens` has begun
  // (begin) and rows [0, exact_prefix), a chunk boundary of `layout`, are resident and exact (Cake prepares
  // them in run_composed, kvfuse/runtime.hpp). Their chunks are reported as `prefix` and none of their rows is
  // recomputed; the chunks after them are assembled by `method` as in run().
  FusionResult run_after_prefix(std::span<const token_id> tokens, const PromptLayout& layout,
                                const FusionMethod& method, std::int64_t exact_prefix) {
    check_prompt(tokens, layout, "FusionPipeline::run_after_prefix");
    const bool boundary = exact_prefix == 0 || std::any_of(layout.chunks.begin(), layout.chunks.end(), [&](const PromptChunk& c) {
      return c.range.end == exact_prefix;
    });
    detail::require(boundary && exact_prefix < static_cast<std::int64_t>(tokens.size()),
                    "FusionPipeline::run_after_prefix: exact prefix {} is not a chunk boundary before the query {}",
                    exact_prefix, layout.query);
    std::lock_guard lock(mutex_);
    FusionResult out;
    fuse(tokens, layout, method, exact_prefix, out);
    return out;
  }

 private:
  // run() after begin(): plan, load + check + shift, the engine's prefill with the method's S_l. Rows
  // [0, exact_prefix), a chunk boundary, are already resident and exact (Cake, run_composed): their chunks are
  // reported as `prefix` and none of their rows is recomputed.
  void fuse(std::span<const token_id> tokens, const PromptLayout& layout, const FusionMethod& method,
            std::int64_t exact_prefix, FusionResult& out) {
    if (std::holds_alternative<CacheCraft>(method)) variants_.drop_stale(*store_);
    const auto t0 = std::chrono::steady_clock::now();
    out.plan = plan_fusion(0, tokens, layout, method, shape_, *store_, variants_.index());
    FusionPlan& plan = out.plan;
    for (ChunkPlan& c : plan.chunks)
      if (c.range.end <= exact_prefix) c = {c.range, KVSource::prefix, KVKey{}, c.range.begin, 0.0, {}, 0};
    if (exact_prefix > 0) finish_plan(plan, method, shape_, exact_prefix);
    variants_.record_uses(plan);
    const FusionMethod chosen = loader_.measured().control(method, plan, out);
    if constexpr (MeasuredTierStore<Store>) {
      if (loader_.measured().valid()) {
        out.tier = loader_.measured().choose_tier(chosen, plan, store_->tier_devices());
        if (out.tier) loader_.placement = out.tier->device.value_or(0);
      }
    }
    out.time.plan_ms = detail::ms_since(t0);

    bool pipelined = false;
    if constexpr (detail::EntryLoader<Backend, Store>::layered) {
      if (load_.layerwise && !plan.two_pass) {  // a second pass would read the layers again: loaded whole first
        loader_.load_layerwise(tokens, chosen, exact_prefix, load_, out, [&](std::vector<double>* policy_ms) {
          return prefill(plan, chosen, out, policy_ms);
        });
        pipelined = true;
      }
    }
    if (!pipelined) {
      loader_.load_whole(tokens, chosen, exact_prefix, out);
      const auto t1 = std::chrono::steady_clock::now();
      out.logits = prefill(plan, chosen, out, nullptr);
      out.time.prefill_ms = detail::ms_since(t1);
    }
    std::int64_t total = 0;
    for (std::int64_t sel : out.selected_per_layer) total += sel;
    out.recompute_fraction = static_cast<double>(total) / (static_cast<double>(shape_.num_layers) *
                                                           static_cast<double>(tokens.size()));
  }

  // The engine's prefill with the method's S_l (layer_schedule); |S_l| into out.selected_per_layer, the
  // policy's time per layer into policy_ms when given.
  std::vector<float> prefill(const FusionPlan& plan, const FusionMethod& method, FusionResult& out,
                             std::vector<double>* policy_ms) {
    const std::int64_t num_layers = shape_.num_layers;
    const LayerSchedule schedule = layer_schedule(plan, method, num_layers);
    out.selected_per_layer.clear();
    std::vector<float> logits;
    if (schedule.fixed_set()) {
      logits = backend_->prefill(plan.initial);
      out.selected_per_layer.assign(static_cast<std::size_t>(num_layers), static_cast<std::int64_t>(plan.initial.size()));
    } else if constexpr (PerLayerFusionBackend<Backend>) {
      const SelectionPolicy next = [&](const LayerReport& r) {
        out.selected_per_layer.push_back(static_cast<std::int64_t>(r.selected.size()));
        const auto t0 = std::chrono::steady_clock::now();
        TokenSet s = schedule.next(r);
        if (policy_ms != nullptr) policy_ms->push_back(detail::ms_since(t0));
        return s;
      };
      const StatisticsRequest stats{schedule.needs_attention ? &plan.layout : nullptr,
                                    schedule.needs_query_mass ? plan.layout.query : TokenRange{}};
      logits = backend_->prefill(plan.initial, next, stats);
      if (schedule.second_pass) {  // QueryProbe: the rows its probe pass chose, on every layer, over the same KV
        detail::require(schedule.second_pass->has_value(),
                        "FusionPipeline: method '{}' ended its probe pass before the last layer", plan.method);
        const TokenSet& rows = **schedule.second_pass;
        if (!rows.empty()) {
          logits = backend_->prefill(rows);
          for (std::int64_t& n : out.selected_per_layer) n += static_cast<std::int64_t>(rows.size());
        }
      }
    } else {
      throw error(fmt::format("FusionPipeline: method '{}' changes the recomputed set per layer, which this "
                              "backend cannot (it models FixedSetFusionBackend only)",
                              plan.method));
    }
    out.focus = *schedule.focus;
    return logits;
  }

  Backend* backend_;
  Store* store_;
  EngineShape shape_;
  mutable std::mutex mutex_;  // serializes the requests on the engine; guards everything below but the cache
  VariantBook variants_;
  LoadConfig load_;
  detail::EntryLoader<Backend, Store> loader_;
};

}  // namespace kvfuse
