#pragma once
// FusionPipeline: chunk caches in a KVStore, and every FusionMethod (fusion_method.hpp) run as one policy of
// the same layer-wise partial prefill on an engine that models FixedSetFusionBackend or
// PerLayerFusionBackend (fusion/fusion_backend.hpp; the reference CPU backend's model is CpuLlamaFusion). The
// engine keeps the request's KV; the pipeline plans, loads, checks and shifts, and drives its prefill.
//
// Offline (chunk caches are generated ahead of time, as in the papers):
//   store_chunk_caches(tokens, layout)  each chunk's KV computed alone at position 0 (CacheBlend, Epic), once
//                                       per (model fingerprint, chunk tokens): chunks already stored are skipped
//   record_context(tokens, layout)      a full prefill with attention statistics of an earlier prompt (a
//                                       PerLayerFusionBackend or AttentionStatisticsBackend engine): every
//                                       chunk's in-context KV stored as a prefix-cache entry (keyed by the chain
//                                       of chunks before it) and as a Cache-Craft variant (VariantCache, with the
//                                       ChunkProfile of CCIScorer: CCI, stored prefix, eq. 14 token ranking)
// Online:
//   plan(tokens, layout, method)        FusionPlan: each chunk's source (isolated / prefix / variant / compute),
//                                       S_0, Cache-Craft's CFO and tokens per chunk; reads the store's index only
//   run(tokens, layout, method)         load the planned KV from the store, check it, RoPE-shift it to this
//                                       prompt's positions, partial prefill with the method's S_l
//                                       (layer_schedule) -> logits, with the time of each step; the prompt's KV
//                                       stays in the engine
//
// Layer-pipelined loading (LoadConfig::layerwise, on by default): when the engine models LayerwiseFusionBackend
// and the store RangedKVStore, run() checks each planned entry's header (describe), then an I/O thread reads
// the entries one layer at a time (get_range) while the engine computes: layers 0 .. L_p − 1 before layer 0
// computes, then layer j once layer j − L_p − 1 is done, so at most L_p + 1 layers are buffered (Cache-Craft
// §3.4.2, Algorithm 2). L_p is eq. 16 (PreloadPlanner) on the load and compute times per layer measured on
// this pipeline's previous layer-pipelined run, scaled to this plan's bytes and rows (1 before any run;
// LoadConfig::preload_depth fixes it). The engine's per-layer hook waits for layer l, installs and shifts it,
// and the trace (FusionResult::load) records per layer the read, the wait, the install and the compute. The
// bytes installed are those of a whole-block load, so the result is the same bit for bit. A layer read that
// fails or times out (LoadConfig::layer_timeout_ms) stops the prefill; its chunk is handled as an unusable
// entry (below) and the prefill runs again, so the request still completes by compute.
//
// Store entries are never trusted blindly: a block that is missing, has the wrong size or token count, or was
// rotated at other positions than recorded is not used. An isolated chunk cache is then recomputed and put back
// (a put that throws kvfuse::error, e.g. the store is down, is kept in FusionResult::put_failures and does not fail
// the request); a prefix or variant entry turns its chunk into `compute` (recomputed in full, on every layer). The
// disk store (backend/disk_kv_store.hpp) adds checksums and model checks below this.
//
// Keys: every key carries the model fingerprint. Contents are domain-separated hashes of the chunk tokens:
// isolated = H(chunk), prefix = H(chunk_0, ..., chunk_j) chained, variant = H(chunk, ids of its stored prefix).
//
// Thread safety: a pipeline drives one engine, whose KV belongs to the request being served, so its requests are
// serialized: run, run_after_prefix, plan, record_context, store_chunk_caches, store_prefix, drop_stale_variants and
// set_load_config may be called from any number of threads and take turns on one lock (the variant cache is
// synchronized itself, variants() may be read at any time). Serve in parallel with one pipeline per engine (worker,
// backend) over one shared store, which must then be safe for concurrent use (every kvfuse store is). Each pipeline
// has its own variant cache: a variant that another pipeline evicted (and erased) is dropped by this one's next
// Cache-Craft run, or computed instead when it vanishes mid-request. Calls that use the engine outside the pipeline
// (run_composed: Cake's prefix, then run_after_prefix) must be serialized with the pipeline's requests by the caller.

#include <chrono>
#include <cstdint>
#include <algorithm>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <optional>
#include <span>
#include <unordered_map>
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
#include "kvfuse/detail/layer_pipe.hpp"
#include "kvfuse/fusion/fusion_backend.hpp"
#include "kvfuse/fusion/fusion_method.hpp"
#include "kvfuse/fusion/layer_schedule.hpp"
#include "kvfuse/fusion/planner.hpp"
#include "kvfuse/schedule/loading_controller.hpp"
#include "kvfuse/schedule/preload_planner.hpp"
#include "kvfuse/select/attnlink_boundary.hpp"
#include "kvfuse/select/cci_scorer.hpp"
#include "kvfuse/select/focused_chunk_detector.hpp"
#include "kvfuse/select/hkvd_selector.hpp"

namespace kvfuse {

namespace detail {

[[nodiscard]] inline double ms_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace detail

// Online time of one run, split by step; ttft_ms() is their sum. With layer-pipelined loading the layer reads,
// installs and shifts happen during the prefill: load_ms is then the entries' headers (describe) and
// prefill_ms includes what the per-layer trace (FusionResult::load) splits out.
struct FusionTimings {
  double plan_ms = 0.0;           // hash the chunks, look up the store's index and Cache-Craft's variants
  double load_ms = 0.0;           // bring stored chunk KV in (store get, checks, copy into the prompt's KV)
  double shift_ms = 0.0;          // RoPE shift of loaded K to this prompt's positions
  double chunk_compute_ms = 0.0;  // isolated chunk caches recomputed because the store had none usable
  double prefill_ms = 0.0;        // the partial prefill, up to the first token's logits

  [[nodiscard]] double ttft_ms() const noexcept {
    return plan_ms + load_ms + shift_ms + chunk_compute_ms + prefill_ms;
  }
};

// How FusionPipeline brings stored chunk KV in.
struct LoadConfig {
  // Layer-pipelined loading (see the header comment); needs a LayerwiseFusionBackend and a RangedKVStore, and
  // is off for other pairs. false: every block whole before layer 0.
  bool layerwise = true;
  // L_p, the layers read before layer 0 computes (Cache-Craft eq. 16). 0: from PreloadPlanner on measured times.
  std::int64_t preload_depth = 0;
  // A layer that has not arrived this long after the engine asked for it fails the entry being read (it is
  // computed instead). 0: wait as long as the store takes. A read in flight cannot be cancelled: the run returns
  // once it does, so a store's own timeout bounds a stalled read (one that never returns blocks the run).
  double layer_timeout_ms = 0.0;

  void validate() const {
    detail::require(preload_depth >= 0, "LoadConfig: preload_depth = {} must be >= 0", preload_depth);
    detail::require_finite_nonneg(layer_timeout_ms, "LoadConfig: layer_timeout_ms");
  }
};

// One layer of a layer-pipelined prefill. Times in ms.
struct LayerLoadTiming {
  double read_ms = 0.0;     // I/O thread: reading this layer of every entry (store time)
  double wait_ms = 0.0;     // engine thread: waiting for it in the hook, i.e. load time visible in TTFT
  double install_ms = 0.0;  // engine thread: load_layer_rows and shift_layer_rows
  double compute_ms = 0.0;  // engine thread: the layer's compute (hook to next hook, without the policy)
  double policy_ms = 0.0;   // engine thread: the method's policy choosing S_{l+1} after this layer

  // Read time hidden behind compute.
  [[nodiscard]] double hidden_ms() const noexcept { return read_ms > wait_ms ? read_ms - wait_ms : 0.0; }
};

// What the loading of one run did.
struct LoadTrace {
  bool layerwise = false;                 // layer-pipelined loading ran (some entry was read per layer)
  std::int64_t depth = 0;                 // L_p used
  bool depth_from_measurement = false;    // L_p from PreloadPlanner on measured times (else configured, or 1)
  double estimated_load_ms_per_layer = 0.0;     // eq. 16's T_load, when measured
  double estimated_compute_ms_per_layer = 0.0;  // eq. 16's T_prefill, when measured
  std::int64_t restarts = 0;              // prefills run again after a layer read failed or timed out
  std::vector<std::string> failures;      // why, one per failed entry
  std::vector<LayerLoadTiming> layers;    // of the prefill that produced the result

  [[nodiscard]] double wait_ms() const noexcept {
    double t = 0.0;
    for (const LayerLoadTiming& l : layers) t += l.wait_ms;
    return t;
  }
  [[nodiscard]] double read_ms() const noexcept {
    double t = 0.0;
    for (const LayerLoadTiming& l : layers) t += l.read_ms;
    return t;
  }
};

struct FusionResult {
  FusionPlan plan;
  std::vector<float> logits;                     // of the last prompt token (the prompt's KV is in the engine)
  std::vector<std::int64_t> selected_per_layer;  // |S_l|
  double recompute_fraction = 0.0;               // sum_l |S_l| / (L · n)
  FusionTimings time;
  std::int64_t rejected_entries = 0;             // planned store entries that were missing or unusable
  std::vector<std::string> put_failures;         // recomputed isolated caches the store failed to take back: why
  // Cache-Craft with focus termination, once Algorithm 1 decided: L* and F* as layout chunk indices among the
  // candidate chunks (variants with tokens to fix); other chunks are not subject to early termination.
  std::optional<FocusDecision> focus;
  LoadTrace load;
  // CacheBlend with its loading controller (cacheblend@auto), once speeds were measured: CacheBlend §5.1's
  // decision for this request (the ratio the run used is decision.ratio).
  std::optional<RatioDecision> controller;
  // On a MeasuredTierStore (TieredKVStore), once speeds were measured: CacheBlend §5.1's device choice at this
  // request's recompute ratio — the cheapest tier that loads a layer no slower than the request recomputes one;
  // the store places new entries there (none fits: every tier).
  std::optional<DeviceDecision> tier;
};

template <FixedSetFusionBackend Backend, KVStore Store>
class FusionPipeline {
 public:
  FusionPipeline(Backend& backend, Store& store, VariantCacheConfig variants = {}, LoadConfig load = {})
      : backend_(&backend), store_(&store), variants_(variants), load_(load) {
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
  [[nodiscard]] VariantCache& variants() noexcept { return variants_; }
  [[nodiscard]] const VariantCache& variants() const noexcept { return variants_; }

  [[nodiscard]] KVKey isolated_key(std::span<const token_id> chunk) const {
    return chunk_cache_key(backend_->model_fingerprint(), chunk);
  }

  // The engine as a plan sees it (planner.hpp).
  [[nodiscard]] EngineShape shape() const {
    const std::int64_t layers = backend_->num_layers();
    return {backend_->model_fingerprint(), layers, backend_->block_bytes(1) / static_cast<std::size_t>(layers)};
  }

  // Offline: the isolated cache of every chunk of the layout (computed at position 0) that the store does not
  // hold yet. Returns the number computed.
  std::int64_t store_chunk_caches(std::span<const token_id> tokens, const PromptLayout& layout) {
    check_prompt(tokens, layout, "FusionPipeline::store_chunk_caches");
    std::lock_guard lock(mutex_);
    std::int64_t computed = 0;
    for (const PromptChunk& c : layout.chunks) {
      if (c.range.empty()) continue;
      const auto chunk = slice(tokens, c.range);
      const KVKey key = isolated_key(chunk);
      if (store_->get(key).has_value()) continue;  // a get, not contains: validates it, warms a tiered store
      put_entry(key, backend_->chunk_kv(chunk, 0));
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
    const auto n = static_cast<std::int64_t>(tokens.size());
    std::vector<LayerAttention> layers;
    TokenSet all;
    append_range(all, {0, n});
    backend_->begin(tokens);
    if constexpr (PerLayerFusionBackend<Backend>) {
      const SelectionPolicy keep_all = [&layers](const LayerReport& r) {
        layers.push_back(*r.attention);
        return r.selected;
      };
      (void)backend_->prefill(all, keep_all, StatisticsRequest{&layout});
    } else {
      const AttentionSink keep = [&layers](std::int64_t, LayerAttention a) { layers.push_back(std::move(a)); };
      (void)backend_->prefill(all, layout, keep);
    }

    // Chunk ids must be unique for the statistics (Cache-Craft eq. 6-7 treat prefixes as sets): an empty chunk
    // or a repeat of an earlier chunk gets a placeholder id and is not stored as a variant.
    std::vector<std::uint64_t> ids;
    std::vector<bool> variant_of(layout.chunks.size(), false);
    for (std::size_t j = 0; j < layout.chunks.size(); ++j) {
      const std::uint64_t id = chunk_content_id(slice(tokens, layout.chunks[j].range));
      variant_of[j] = !layout.chunks[j].range.empty() && std::find(ids.begin(), ids.end(), id) == ids.end();
      ids.push_back(variant_of[j] ? id : detail::mix64(id ^ (0x5bd1e995ull * (j + 1))));
    }
    const std::vector<ChunkProfile> profiles = CCIScorer().profile(chunk_attention(ids, layout, layers));

    std::uint64_t prefix = kHashSeed;
    for (std::size_t j = 0; j < layout.chunks.size(); ++j) {
      const TokenRange r = layout.chunks[j].range;
      prefix = hash_tokens(slice(tokens, r), prefix);
      if (r.empty()) continue;
      const KVBlock block = backend_->save_rows(r);
      put_entry(prefix_key(prefix), block);
      if (!variant_of[j]) continue;
      const KVKey vkey = variant_key(backend_->model_fingerprint(), profiles[j].chunk_id, profiles[j].stored_prefix);
      const VariantInsertResult inserted = variants_.insert(profiles[j], vkey);
      // The pipeline's own state first: a store that throws (offline, a server down) leaves it consistent.
      for (const VariantEntry& gone : inserted.evicted) variant_positions_.erase(gone.kv.content);
      variant_positions_[vkey.content] = r.begin;
      for (const VariantEntry& gone : inserted.evicted) store_->erase(gone.kv);
      put_entry(vkey, block);  // also refreshes the KV of a variant that was already known
    }
  }

  // Drops the Cache-Craft variants whose KV the store no longer holds (an engine that evicted or lost it), so
  // that lookups never choose a variant that cannot be loaded. run() calls it first. Returns the number dropped.
  std::int64_t drop_stale_variants() {
    std::lock_guard lock(mutex_);
    return drop_stale();
  }

  // Online, no compute: what `method` will do for this prompt given what the store holds now (Cache-Craft
  // variants are assumed to be in the store: see drop_stale_variants).
  [[nodiscard]] FusionPlan plan(std::span<const token_id> tokens, const PromptLayout& layout,
                                const FusionMethod& method) const {
    check_prompt(tokens, layout, "FusionPipeline::plan");
    std::lock_guard lock(mutex_);
    return make_plan(tokens, layout, method);
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
    const auto keys = prefix_chunk_keys(backend_->model_fingerprint(), prefix, fetch_chunk);
    for (std::int64_t b = 0; b < prefix_tokens; b += fetch_chunk)
      put_entry(keys[static_cast<std::size_t>(b / fetch_chunk)], backend_->save_rows({b, std::min(b + fetch_chunk, prefix_tokens)}));
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

  [[nodiscard]] Store& store() const noexcept { return *store_; }

  // A method type that always needs per-layer feedback does not compile for a fixed-set engine.
  template <class Method>
    requires(needs_per_layer_backend<Method> && !PerLayerFusionBackend<Backend>)
  FusionResult run(std::span<const token_id> tokens, const PromptLayout& layout, const Method& method) = delete;

 private:
  // drop_stale_variants(), under the lock.
  std::int64_t drop_stale() {
    std::int64_t dropped = 0;
    for (const VariantEntry& v : variants_.entries()) {
      if (store_->contains(v.kv)) continue;
      variants_.erase(v.id);
      variant_positions_.erase(v.kv.content);
      ++dropped;
    }
    return dropped;
  }

  // run() after begin(): plan, load + check + shift, the engine's prefill with the method's S_l. Rows
  // [0, exact_prefix), a chunk boundary, are already resident and exact (Cake, run_composed): their chunks are
  // reported as `prefix` and none of their rows is recomputed.
  void fuse(std::span<const token_id> tokens, const PromptLayout& layout, const FusionMethod& method,
            std::int64_t exact_prefix, FusionResult& out) {
    const auto n = static_cast<std::int64_t>(tokens.size());
    const std::int64_t num_layers = backend_->num_layers();
    if (std::holds_alternative<CacheCraft>(method)) drop_stale();
    const auto t0 = std::chrono::steady_clock::now();
    out.plan = make_plan(tokens, layout, method);
    FusionPlan& plan = out.plan;
    for (ChunkPlan& c : plan.chunks)
      if (c.range.end <= exact_prefix) c = {c.range, KVSource::prefix, KVKey{}, c.range.begin, 0.0, {}, 0};
    if (exact_prefix > 0) finish_plan(plan, method, exact_prefix);
    for (const ChunkPlan& c : plan.chunks)  // the run uses the planned variants: f_r += 1/CFO (section 3.3)
      if (c.source == KVSource::variant) variants_.record_use(c.variant_id, c.cfo);
    const FusionMethod chosen = control(method, plan, out);
    place(chosen, plan, out);
    out.time.plan_ms = detail::ms_since(t0);

    bool pipelined = false;
    if constexpr (LayerwiseFusionBackend<Backend> && RangedKVStore<Store>) {
      if (load_.layerwise) {
        fuse_layerwise(tokens, chosen, exact_prefix, out);
        pipelined = true;
      }
    }
    if (!pipelined) {
      load_whole(tokens, chosen, exact_prefix, out);
      const auto t1 = std::chrono::steady_clock::now();
      out.logits = prefill(plan, chosen, out, nullptr);
      out.time.prefill_ms = detail::ms_since(t1);
    }
    std::int64_t total = 0;
    for (std::int64_t sel : out.selected_per_layer) total += sel;
    out.recompute_fraction = static_cast<double>(total) / (static_cast<double>(num_layers) * static_cast<double>(n));
  }

  // CacheBlend §5.1: with the loading controller on and speeds measured, the ratio whose recompute of a layer
  // takes as long as loading it (never below r*), from this plan's loaded tokens and the measured speeds.
  FusionMethod control(const FusionMethod& method, const FusionPlan& plan, FusionResult& out) const {
    const auto* blend = std::get_if<CacheBlend>(&method);
    if (blend == nullptr || !blend->loading_controller || !measured_.valid || !(measured_.load_ms_per_byte > 0.0))
      return method;
    const StorageDevice device{"store", 0.0, 1e3 / measured_.load_ms_per_byte, 0.0};
    out.controller = LoadingController({blend->config.recompute_ratio}).choose_ratio(loading_request(plan), device);
    CacheBlend chosen = with_recompute_ratio(*blend, out.controller->ratio);
    chosen.loading_controller = false;
    return chosen;
  }

  // CacheBlend §5.1's second question on a MeasuredTierStore: the cheapest tier that loads a layer of this
  // request no slower than it recomputes one (ratio: the r of CacheBlend's or QueryAware's gradual filtering,
  // else |S_0| / n); new entries go there.
  void place(const FusionMethod& method, const FusionPlan& plan, FusionResult& out) {
    if constexpr (MeasuredTierStore<Store>) {
      if (!measured_.valid) return;
      const std::vector<StorageDevice> tiers = store_->tier_devices();
      if (std::any_of(tiers.begin(), tiers.end(), [](const StorageDevice& d) { return d.bandwidth_bytes_per_s <= 0; }))
        return;  // a tier not measured yet
      const auto* blend = std::get_if<CacheBlend>(&method);
      const auto* aware = std::get_if<QueryAware>(&method);
      const double ratio = blend != nullptr   ? blend->config.recompute_ratio
                           : aware != nullptr ? aware->config.recompute_ratio
                                              : static_cast<double>(plan.initial.size()) /
                                                    static_cast<double>(plan.layout.num_tokens());
      out.tier = LoadingController({0.0}).choose_device(loading_request(plan), tiers, ratio);
      placement_ = out.tier->device.value_or(0);
    }
  }

  // The request as CacheBlend §5.1's delay estimators see it: the tokens loaded, their bytes per layer, and
  // Prefill(LLM, L) of one layer from the measured compute speed.
  [[nodiscard]] LoadingRequest loading_request(const FusionPlan& plan) const {
    const std::int64_t num_layers = backend_->num_layers();
    LoadingRequest request;
    for (const ChunkPlan& c : plan.chunks)
      if (c.source != KVSource::compute) request.context_tokens += c.range.size();
    request.num_layers = static_cast<int>(num_layers);
    request.kv_bytes_per_token_per_layer =
        static_cast<double>(backend_->block_bytes(1)) / static_cast<double>(num_layers);
    request.prefill_seconds_per_layer =  // every row of the prompt
        measured_.compute_ms_per_row * static_cast<double>(plan.layout.num_tokens()) / 1e3;
    return request;
  }

  // The chunks whose stored KV the plan loads: not computed, not inside the exact prefix.
  static bool loads(const ChunkPlan& c, std::int64_t exact_prefix) {
    return c.source != KVSource::compute && c.range.end > exact_prefix;
  }

  // A planned entry that is missing or unusable (or whose read failed): an isolated chunk cache is recomputed
  // and put back, and returned to be loaded; a prefix or variant chunk is computed instead, and so is every
  // prefix chunk after a broken one (a prefix entry is only exact behind the entries before it).
  std::optional<KVBlock> reject_entry(ChunkPlan& c, std::span<const token_id> tokens, FusionResult& out,
                                      bool& prefix_broken) {
    ++out.rejected_entries;
    if (c.source == KVSource::isolated) {
      const auto t0 = std::chrono::steady_clock::now();
      KVBlock block = backend_->chunk_kv(slice(tokens, c.range), 0);
      c.stored_first_position = 0;
      try {  // losing the copy must not lose the request (a store that is down throws kvfuse::error)
        put_entry(c.key, block);
      } catch (const error& e) {
        out.put_failures.emplace_back(e.what());
      }
      out.time.chunk_compute_ms += detail::ms_since(t0);
      return block;
    }
    prefix_broken = prefix_broken || c.source == KVSource::prefix;
    c.source = KVSource::compute;
    c.recompute.clear();
    return std::nullopt;
  }

  // A whole block into the engine at this prompt's positions.
  void install(const ChunkPlan& c, const KVBlock& block, FusionResult& out) {
    auto t0 = std::chrono::steady_clock::now();
    backend_->load_rows(c.range, block);
    out.time.load_ms += detail::ms_since(t0);
    t0 = std::chrono::steady_clock::now();
    if (c.range.begin != c.stored_first_position) backend_->shift_rows(c.range, c.range.begin - c.stored_first_position);
    out.time.shift_ms += detail::ms_since(t0);
  }

  // Every planned block whole, before the prefill.
  void load_whole(std::span<const token_id> tokens, const FusionMethod& method, std::int64_t exact_prefix,
                  FusionResult& out) {
    FusionPlan& plan = out.plan;
    bool prefix_broken = false;
    for (ChunkPlan& c : plan.chunks) {
      if (!loads(c, exact_prefix)) continue;
      if (prefix_broken && c.source == KVSource::prefix) {
        c.source = KVSource::compute;
        continue;
      }
      const auto t0 = std::chrono::steady_clock::now();
      std::optional<KVBlock> block = store_->get(c.key);
      const bool usable = block.has_value() && block->num_tokens == c.range.size() &&
                          block->first_position == c.stored_first_position &&
                          block->bytes.size() == backend_->block_bytes(c.range.size());
      out.time.load_ms += detail::ms_since(t0);
      if (!usable) block = reject_entry(c, tokens, out, prefix_broken);
      if (block) install(c, *block, out);
    }
    if (out.rejected_entries > 0) finish_plan(plan, method, exact_prefix);  // chunks now `compute` change S_0
  }

  // The engine's prefill with the method's S_l (layer_schedule); |S_l| into out.selected_per_layer, the
  // policy's time per layer into policy_ms when given.
  std::vector<float> prefill(const FusionPlan& plan, const FusionMethod& method, FusionResult& out,
                             std::vector<double>* policy_ms) {
    const std::int64_t num_layers = backend_->num_layers();
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
    } else {
      throw error(fmt::format("FusionPipeline: method '{}' changes the recomputed set per layer, which this "
                              "backend cannot (it models FixedSetFusionBackend only)",
                              plan.method));
    }
    out.focus = *schedule.focus;
    return logits;
  }

  // Layer-pipelined loading (header comment): headers first, then the prefill with the I/O thread reading
  // layers ahead; a failed layer read makes its chunk an unusable entry and the prefill runs again.
  void fuse_layerwise(std::span<const token_id> tokens, const FusionMethod& method, std::int64_t exact_prefix,
                      FusionResult& out)
    requires LayerwiseFusionBackend<Backend> && RangedKVStore<Store>
  {
    FusionPlan& plan = out.plan;
    std::vector<detail::LayerStream> streams;
    // Chunks installed whole (recomputed isolated caches): an aborted prefill overwrites their rows on the layers
    // it computed (CacheBlend's and QueryAware's S_0 is every row), so they are installed again before the
    // prefill re-runs.
    std::vector<std::pair<std::size_t, KVBlock>> whole;
    bool prefix_broken = false;
    for (std::size_t j = 0; j < plan.chunks.size(); ++j) {
      ChunkPlan& c = plan.chunks[j];
      if (!loads(c, exact_prefix)) continue;
      if (prefix_broken && c.source == KVSource::prefix) {
        c.source = KVSource::compute;
        continue;
      }
      const auto t0 = std::chrono::steady_clock::now();
      const std::optional<KVBlockInfo> info = store_->describe(c.key);
      const bool usable = info.has_value() && info->num_tokens == c.range.size() &&
                          info->first_position == c.stored_first_position &&
                          info->bytes == backend_->block_bytes(c.range.size()) &&
                          backend_->block_bytes(c.range.size()) ==
                              static_cast<std::size_t>(backend_->num_layers()) * backend_->layer_bytes(c.range.size());
      out.time.load_ms += detail::ms_since(t0);
      if (usable) {
        streams.push_back({j, c.key, *info, backend_->layer_bytes(c.range.size())});
      } else if (std::optional<KVBlock> block = reject_entry(c, tokens, out, prefix_broken)) {
        install(c, *block, out);
        whole.emplace_back(j, std::move(*block));
      }
    }
    if (out.rejected_entries > 0) finish_plan(plan, method, exact_prefix);

    const FusionTimings before = out.time;  // what the restarts add to these is not prefill time
    const auto t0 = std::chrono::steady_clock::now();
    for (;;) {
      if (streams.empty()) {  // nothing left to read per layer
        out.load.layers.clear();
        out.logits = prefill(plan, method, out, nullptr);
        break;
      }
      std::vector<std::size_t> failed;
      if (prefill_pipelined(streams, method, out, failed)) break;
      ++out.load.restarts;
      std::size_t broken_at = plan.chunks.size();  // prefix entries after this chunk are not exact any more
      for (std::size_t f : failed) {
        ChunkPlan& c = plan.chunks[streams[f].chunk];
        bool broken = false;
        if (std::optional<KVBlock> block = reject_entry(c, tokens, out, broken)) {
          install(c, *block, out);
          whole.emplace_back(streams[f].chunk, std::move(*block));
        }
        if (broken) broken_at = std::min(broken_at, streams[f].chunk);
      }
      for (const auto& [j, block] : whole) install(plan.chunks[j], block, out);  // idempotent
      std::vector<detail::LayerStream> kept;
      for (std::size_t i = 0; i < streams.size(); ++i) {
        ChunkPlan& c = plan.chunks[streams[i].chunk];
        if (std::find(failed.begin(), failed.end(), i) != failed.end()) continue;
        if (streams[i].chunk > broken_at && c.source == KVSource::prefix) {
          c.source = KVSource::compute;
          continue;
        }
        kept.push_back(streams[i]);
      }
      streams = std::move(kept);
      finish_plan(plan, method, exact_prefix);
    }
    out.time.prefill_ms = detail::ms_since(t0) - (out.time.chunk_compute_ms - before.chunk_compute_ms) -
                          (out.time.load_ms - before.load_ms) - (out.time.shift_ms - before.shift_ms);
  }

  // One prefill with the I/O thread reading `streams` a layer ahead. Returns false, with the indices of the
  // streams whose reads failed (reasons in out.load.failures), when it had to stop.
  bool prefill_pipelined(const std::vector<detail::LayerStream>& streams, const FusionMethod& method,
                         FusionResult& out, std::vector<std::size_t>& failed)
    requires LayerwiseFusionBackend<Backend> && RangedKVStore<Store>
  {
    using clock = std::chrono::steady_clock;
    const FusionPlan& plan = out.plan;
    const std::int64_t num_layers = backend_->num_layers();
    LoadTrace& trace = out.load;
    trace.layerwise = true;
    trace.layers.assign(static_cast<std::size_t>(num_layers), {});
    std::uint64_t layer_bytes = 0;
    for (const detail::LayerStream& st : streams) layer_bytes += st.layer_bytes;
    trace.depth = load_.preload_depth > 0 ? std::min(load_.preload_depth, num_layers) : 1;
    trace.depth_from_measurement = load_.preload_depth == 0 && measured_.valid;
    if (trace.depth_from_measurement) {  // eq. 16 on this plan's bytes and rows
      trace.estimated_load_ms_per_layer = measured_.load_ms_per_byte * static_cast<double>(layer_bytes);
      // Rows per layer: |S_0| scaled by this method's mean |S_l| / |S_0| when it ran before; |S_0| otherwise (an
      // overestimate for methods that filter: it can only make L_p smaller, which costs waits between layers but
      // never the waiting up front for layers whose compute would have hidden them).
      const auto rows = measured_.rows_per_initial.find(plan.method);
      trace.estimated_compute_ms_per_layer = measured_.compute_ms_per_row * static_cast<double>(plan.initial.size()) *
                                             (rows == measured_.rows_per_initial.end() ? 1.0 : rows->second);
      trace.depth = static_cast<std::int64_t>(
          PreloadPlanner({static_cast<std::size_t>(num_layers), trace.estimated_compute_ms_per_layer,
                          trace.estimated_load_ms_per_layer})
              .depth());
    }

    detail::LayerPipe pipe(static_cast<std::size_t>(num_layers));
    auto mark = clock::now();
    std::thread io;
    struct Stop {  // on every way out: no hook left with dangling references, the I/O thread joined
      Backend* backend;
      detail::LayerPipe& pipe;
      std::thread& io;
      ~Stop() {
        backend->set_layer_hook({});
        pipe.stop();
        if (io.joinable()) io.join();
      }
    } const stop_io{backend_, pipe, io};
    io = std::thread([&] {
      for (std::int64_t l = 0; l < num_layers; ++l) {
        if (!pipe.wait_to_read(l, trace.depth)) return;  // Algorithm 2: layer l once layer l − L_p − 1 is done
        const auto t0 = clock::now();
        std::vector<std::vector<std::byte>> layer(streams.size());
        for (std::size_t i = 0; i < streams.size(); ++i) {
          const detail::LayerStream& st = streams[i];
          if (!pipe.reading(i)) return;  // the engine gave up (timeout) or stopped: read no further entry
          std::string why;
          try {
            std::optional<std::vector<std::byte>> bytes =
                store_->get_range(st.key, st.info, static_cast<std::uint64_t>(l) * st.layer_bytes, st.layer_bytes);
            if (bytes && bytes->size() == st.layer_bytes) {
              layer[i] = std::move(*bytes);
              continue;
            }
            why = fmt::format("layer {} of the entry is missing, changed or corrupt", l);
          } catch (const std::exception& e) {
            why = fmt::format("reading layer {} failed: {}", l, e.what());
          } catch (...) {
            why = fmt::format("reading layer {} failed: unknown exception", l);
          }
          pipe.fail(i, std::move(why));
          return;
        }
        pipe.publish(l, std::move(layer), detail::ms_since(t0));
      }
    });

    mark = clock::now();
    const auto hook = [&](std::int64_t l) {
      const auto entered = clock::now();
      if (l > 0) trace.layers[static_cast<std::size_t>(l - 1)].compute_ms = std::chrono::duration<double, std::milli>(entered - mark).count();
      std::vector<std::vector<std::byte>> layer;
      if (!pipe.take(l, l == 0 ? trace.depth - 1 : l, load_.layer_timeout_ms, layer)) throw detail::LayerReadFailed{};
      LayerLoadTiming& timing = trace.layers[static_cast<std::size_t>(l)];
      const auto got = clock::now();
      timing.wait_ms = std::chrono::duration<double, std::milli>(got - entered).count();
      for (std::size_t i = 0; i < streams.size(); ++i) {
        const ChunkPlan& c = plan.chunks[streams[i].chunk];
        backend_->load_layer_rows(l, c.range, layer[i], c.stored_first_position);
        if (c.range.begin != c.stored_first_position)
          backend_->shift_layer_rows(l, c.range, c.range.begin - c.stored_first_position);
      }
      mark = clock::now();
      timing.install_ms = std::chrono::duration<double, std::milli>(mark - got).count();
    };
    backend_->set_layer_hook(hook);
    std::vector<double> policy_ms;
    bool stopped = false;
    try {
      out.logits = prefill(plan, method, out, &policy_ms);
    } catch (const detail::LayerReadFailed&) {
      stopped = true;
    }  // anything else propagates; stop_io removes the hook and joins
    backend_->set_layer_hook({});
    pipe.stop();
    io.join();
    if (stopped) {
      for (auto& [stream, why] : pipe.failures()) {
        failed.push_back(stream);
        trace.failures.push_back(fmt::format("rows {}: {}", plan.chunks[streams[stream].chunk].range, why));
      }
      return false;
    }
    trace.layers.back().compute_ms = detail::ms_since(mark);
    double read = 0.0;
    double compute = 0.0;
    for (std::size_t l = 0; l < trace.layers.size(); ++l) {
      LayerLoadTiming& t = trace.layers[l];
      t.read_ms = pipe.read_ms(l);
      if (l < policy_ms.size()) {
        t.policy_ms = policy_ms[l];
        t.compute_ms -= t.policy_ms;
      }
      read += t.read_ms;
      compute += t.compute_ms;
    }
    std::int64_t rows = 0;
    for (std::int64_t sel : out.selected_per_layer) rows += sel;
    measured_.valid = true;  // for the next run's L_p and loading controller
    measured_.load_ms_per_byte = read / (static_cast<double>(layer_bytes) * static_cast<double>(num_layers));
    measured_.compute_ms_per_row = compute / static_cast<double>(rows);
    measured_.rows_per_initial[plan.method] =
        static_cast<double>(rows) / (static_cast<double>(num_layers) * static_cast<double>(plan.initial.size()));
    return true;
  }

  // A put of an entry: on a MeasuredTierStore into the tier place() chose last (and the slower ones).
  void put_entry(const KVKey& key, KVBlock block) {
    if constexpr (MeasuredTierStore<Store>) store_->put(key, std::move(block), placement_);
    else store_->put(key, std::move(block));
  }

  [[nodiscard]] KVKey prefix_key(std::uint64_t chained) const {
    return chained_prefix_key(backend_->model_fingerprint(), chained);
  }

  // Sources per chunk and S_0, from what the store and the variant cache hold now; changes nothing.
  FusionPlan make_plan(std::span<const token_id> tokens, const PromptLayout& layout, const FusionMethod& method) const {
    return plan_fusion(0, tokens, layout, method, shape(), *store_, {&variants_, &variant_positions_});
  }

  void finish_plan(FusionPlan& plan, const FusionMethod& method, std::int64_t exact_prefix = 0) const {
    kvfuse::finish_plan(plan, method, shape(), exact_prefix);
  }

  Backend* backend_;
  Store* store_;
  mutable std::mutex mutex_;  // serializes the requests on the engine; guards everything below but variants_
  VariantCache variants_;
  std::unordered_map<std::uint64_t, std::int64_t> variant_positions_;  // variant key content -> first position
  LoadConfig load_;
  struct {
    bool valid = false;
    double load_ms_per_byte = 0.0;    // of the last layer-pipelined run's reads
    double compute_ms_per_row = 0.0;  // per row computed on one layer, of the same run
    std::map<std::string, double> rows_per_initial;  // per method name: mean |S_l| / |S_0| of its last run
  } measured_;
  std::size_t placement_ = 0;  // MeasuredTierStore: the tier of new entries, as place() chose last (0: every tier)
};

}  // namespace kvfuse
