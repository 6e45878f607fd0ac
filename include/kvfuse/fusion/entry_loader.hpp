#pragma once
// FusionPipeline's loader (fusion/fusion_pipeline.hpp): a plan's stored chunk KV into the engine, checked, at this
// prompt's positions.
//
//   whole blocks      every planned entry read whole (get), checked, installed (load_rows) and RoPE-shifted
//                     (shift_rows) before layer 0
//   layer-pipelined   headers first (describe), checked; then the prefill, with the engine's per-layer hook taking
//                     layer l from the FusionConnector (connector.hpp) and installing it (load_layer_rows,
//                     shift_layer_rows). The connector's I/O executor reads layers 0 .. L_p − 1 before layer 0
//                     computes, then layer j once layer j − L_p − 1 is done (Cache-Craft §3.4.2, Algorithm 2): one
//                     executor of one thread for the loader's lifetime, the code that reads for a batching engine.
//                     Cache-Craft variant chunks load through it like the others: a variant is a stored block rotated
//                     at recorded positions; only choosing it (planner.hpp) and keeping it (variant_book.hpp) are
//                     Cache-Craft's own.
//
// An entry is checked before it is used: present, its token count, the position its K was rotated at and its bytes
// as planned (entry_fits). One that is not, or whose layer read fails or times out mid-prefill, is rejected by the
// recover rules: an isolated chunk cache is recomputed (chunk_kv), put back and installed whole (one computed behind
// a chunk context is computed in context instead); a prefix or
// variant chunk is computed instead, and so is every prefix chunk after a broken one (a prefix entry is exact only
// behind the entries before it). A failed layer read stops the prefill (the hook throws); it runs again without it.

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include "kvfuse/backend/concepts.hpp"
#include "kvfuse/core/error.hpp"
#include "kvfuse/core/status.hpp"
#include "kvfuse/core/types.hpp"
#include "kvfuse/fusion/connector.hpp"
#include "kvfuse/fusion/fusion_backend.hpp"
#include "kvfuse/fusion/fusion_method.hpp"
#include "kvfuse/fusion/fusion_result.hpp"
#include "kvfuse/fusion/load_control.hpp"
#include "kvfuse/fusion/planner.hpp"

namespace kvfuse::detail {

// Thrown by the per-layer hook to stop a prefill whose layer read failed; the loader catches it.
struct LayerReadFailed {};

// The connector of a loader whose engine and store take layer-pipelined loading; nothing otherwise.
template <class Store, bool Layered>
struct LayerReader {
  LayerReader(Store&, const EngineShape&) {}
};
template <class Store>
struct LayerReader<Store, true> {
  // One I/O thread: a single-request driver has one request reading, a layer at a time.
  LayerReader(Store& store, const EngineShape& shape) : connector(store, shape, {1, 0.0, 1}) {}
  FusionConnector<Store> connector;
  std::uint64_t next_request = 0;
};

template <FixedSetFusionBackend Backend, KVStore Store>
class EntryLoader {
 public:
  static constexpr bool layered = LayerwiseFusionBackend<Backend> && RangedKVStore<Store>;

  EntryLoader(Backend& backend, Store& store, const EngineShape& shape)
      : backend_(&backend),
        store_(&store),
        shape_(shape),
        reader_(store, shape),
        measured_(shape.num_layers,
                  static_cast<double>(backend.block_bytes(1)) / static_cast<double>(shape.num_layers)) {}

  [[nodiscard]] MeasuredLoad& measured() noexcept { return measured_; }

  // Where puts go on a MeasuredTierStore: tier `placement` and the slower ones (0: every tier).
  std::size_t placement = 0;

  void put(const KVKey& key, KVBlock block) {
    if constexpr (MeasuredTierStore<Store>) store_->put(key, std::move(block), placement);
    else store_->put(key, std::move(block));
  }

  // Every planned block whole, before the prefill.
  void load_whole(std::span<const token_id> tokens, const FusionMethod& method, std::int64_t exact_prefix,
                  FusionResult& out) {
    bool prefix_broken = false;
    for (ChunkPlan& c : out.plan.chunks) {
      if (!loads(c, exact_prefix)) continue;
      if (prefix_broken && c.source == KVSource::prefix) {
        c.source = KVSource::compute;
        continue;
      }
      (void)load_block(c, tokens, out, prefix_broken);
    }
    if (out.rejected_entries > 0) finish_plan(out.plan, method, shape_, exact_prefix);  // S_0 changes
  }

  // Layer-pipelined loading (the header comment); `prefill(policy_ms)` runs the engine's prefill of out.plan with
  // the method's S_l and returns the logits, the policy's time per layer into *policy_ms when given.
  template <class Prefill>
    requires layered
  void load_layerwise(std::span<const token_id> tokens, const FusionMethod& method, std::int64_t exact_prefix,
                      const LoadConfig& config, FusionResult& out, Prefill&& prefill) {
    FusionPlan& plan = out.plan;
    std::vector<std::optional<KVBlockInfo>> described(plan.chunks.size());  // the entries read layer by layer
    // Chunks installed whole (recomputed isolated caches, blocks the engine takes whole): an aborted prefill
    // overwrites their rows on the layers it computed (CacheBlend's and QueryAware's S_0 is every row), so they are
    // installed again before it re-runs.
    std::vector<std::pair<std::size_t, KVBlock>> whole;
    bool prefix_broken = false;
    for (std::size_t j = 0; j < plan.chunks.size(); ++j) {
      ChunkPlan& c = plan.chunks[j];
      if (!loads(c, exact_prefix)) continue;
      if (prefix_broken && c.source == KVSource::prefix) {
        c.source = KVSource::compute;
        continue;
      }
      const std::int64_t rows = c.range.size();
      // The connector cuts a block into layers by the plan's shape; an engine whose block of these rows is not that
      // (bytes not linear in the rows) takes it whole.
      if (backend_->block_bytes(rows) != shape_.block_bytes(rows) ||
          backend_->layer_bytes(rows) != shape_.layer_bytes(rows)) {
        if (std::optional<KVBlock> block = load_block(c, tokens, out, prefix_broken))
          whole.emplace_back(j, std::move(*block));
        continue;
      }
      const auto t0 = std::chrono::steady_clock::now();
      const std::optional<KVBlockInfo> info = store_->describe(c.key);
      const bool usable = info.has_value() && entry_fits(*info, c, backend_->block_bytes(rows));
      out.time.load_ms += ms_since(t0);
      if (usable) {
        described[j] = *info;
      } else if (std::optional<KVBlock> block = reject(c, tokens, out, prefix_broken)) {
        install(c, *block, out);
        whole.emplace_back(j, std::move(*block));
      }
    }
    if (out.rejected_entries > 0) finish_plan(plan, method, shape_, exact_prefix);

    const FusionTimings before = out.time;  // what the restarts add to these is not prefill time
    const auto t0 = std::chrono::steady_clock::now();
    for (;;) {
      if (std::none_of(described.begin(), described.end(), [](const auto& d) { return d.has_value(); })) {
        out.load.layers.clear();  // nothing left to read per layer
        out.logits = prefill(nullptr);
        break;
      }
      std::vector<std::size_t> failed;
      if (prefill_pipelined(described, method, config, out, prefill, failed)) break;
      ++out.load.restarts;
      std::size_t broken_at = plan.chunks.size();  // prefix entries after this chunk are not exact any more
      for (std::size_t j : failed) {
        described[j].reset();
        bool broken = false;
        if (std::optional<KVBlock> block = reject(plan.chunks[j], tokens, out, broken)) {
          install(plan.chunks[j], *block, out);
          whole.emplace_back(j, std::move(*block));
        }
        if (broken) broken_at = std::min(broken_at, j);
      }
      for (const auto& [j, block] : whole) install(plan.chunks[j], block, out);  // idempotent
      for (std::size_t j = broken_at + 1; j < plan.chunks.size(); ++j) {
        if (!described[j] || plan.chunks[j].source != KVSource::prefix) continue;
        plan.chunks[j].source = KVSource::compute;
        described[j].reset();
      }
      finish_plan(plan, method, shape_, exact_prefix);
    }
    out.time.prefill_ms = ms_since(t0) - (out.time.chunk_compute_ms - before.chunk_compute_ms) -
                          (out.time.load_ms - before.load_ms) - (out.time.shift_ms - before.shift_ms);
  }

 private:
  // One prefill with the connector reading the described entries L_p layers ahead. Returns false, with the chunks
  // whose reads failed (reasons in out.load.failures), when it had to stop.
  template <class Prefill>
  bool prefill_pipelined(const std::vector<std::optional<KVBlockInfo>>& described, const FusionMethod& method,
                         const LoadConfig& config, FusionResult& out, Prefill& prefill,
                         std::vector<std::size_t>& failed) {
    using clock = std::chrono::steady_clock;
    const FusionPlan& plan = out.plan;
    FusionConnector<Store>& connector = reader_.connector;
    LoadTrace& trace = out.load;
    trace.layerwise = true;
    trace.layers.assign(static_cast<std::size_t>(shape_.num_layers), {});

    // What the connector reads: the described entries; the other chunks are computed or already in the engine.
    FusionPlan reads = plan;
    reads.request_id = ++reader_.next_request;
    reads.method = method_name(method);  // the method as run (cacheblend@auto: at the controller's ratio)
    LoadStart start{0, config.layer_timeout_ms, /*preload=*/true, {}};
    std::uint64_t layer_bytes = 0;
    for (std::size_t j = 0; j < plan.chunks.size(); ++j) {
      if (!described[j]) {
        reads.chunks[j].bytes = 0;
        continue;
      }
      start.described.push_back(*described[j]);
      layer_bytes += shape_.layer_bytes(plan.chunks[j].range.size());
    }
    measured_.choose_depth(plan, layer_bytes, config.preload_depth, trace);
    start.preload_depth = trace.depth;
    const Status started = connector.start(reads, method, std::move(start));
    require_code(started == Status::success, started, "FusionPipeline: {}", last_status_message());

    struct Stop {  // on every way out: no hook left with dangling references, no read left for the request
      Backend* backend;
      FusionConnector<Store>& connector;
      std::uint64_t request;
      ~Stop() {
        backend->set_layer_hook({});
        connector.finish_and_wait(request);
      }
    } const stop{backend_, connector, reads.request_id};
    auto mark = clock::now();
    const auto hook = [&](std::int64_t l) {
      const auto entered = clock::now();
      if (l > 0) trace.layers[static_cast<std::size_t>(l - 1)].compute_ms = std::chrono::duration<double, std::milli>(entered - mark).count();
      const LayerLoad in = connector.wait_for_layer(reads.request_id, l);
      if (in.status != Status::success) throw LayerReadFailed{};
      LayerLoadTiming& timing = trace.layers[static_cast<std::size_t>(l)];
      const auto got = clock::now();
      timing.wait_ms = std::chrono::duration<double, std::milli>(got - entered).count();
      timing.read_ms = in.read_ms;
      for (const LayerPiece& p : in.pieces) {
        backend_->load_layer_rows(l, p.rows, p.bytes, p.stored_first_position);
        if (p.rows.begin != p.stored_first_position)
          backend_->shift_layer_rows(l, p.rows, p.rows.begin - p.stored_first_position);
      }
      mark = clock::now();
      timing.install_ms = std::chrono::duration<double, std::milli>(mark - got).count();
    };
    backend_->set_layer_hook(hook);
    std::vector<double> policy_ms;
    try {
      out.logits = prefill(&policy_ms);
    } catch (const LayerReadFailed&) {  // anything else propagates; `stop` removes the hook
      ReadFailure failure = connector.failure(reads.request_id);
      for (std::size_t j : failure.chunks)
        trace.failures.push_back(fmt::format("rows {}: {}", plan.chunks[j].range, failure.why));
      failed = std::move(failure.chunks);
      return false;
    }
    trace.layers.back().compute_ms = ms_since(mark);
    for (std::size_t l = 0; l < trace.layers.size() && l < policy_ms.size(); ++l) {
      trace.layers[l].policy_ms = policy_ms[l];
      trace.layers[l].compute_ms -= policy_ms[l];
    }
    measured_.record(plan, trace, out.selected_per_layer, layer_bytes);  // for the next run's L_p and controller
    return true;
  }

  // The chunks whose stored KV the plan loads: not computed, not inside the exact prefix.
  static bool loads(const ChunkPlan& c, std::int64_t exact_prefix) {
    return c.source != KVSource::compute && c.range.end > exact_prefix;
  }

  // One planned block whole: read, checked, installed; the block installed, if any (reject's on an unusable one).
  std::optional<KVBlock> load_block(ChunkPlan& c, std::span<const token_id> tokens, FusionResult& out,
                                    bool& prefix_broken) {
    const auto t0 = std::chrono::steady_clock::now();
    std::optional<KVBlock> block = store_->get(c.key);
    const bool usable = block.has_value() &&
                        entry_fits({.num_tokens = block->num_tokens, .first_position = block->first_position,
                                    .bytes = block->bytes.size()},
                                   c, backend_->block_bytes(c.range.size()));
    out.time.load_ms += ms_since(t0);
    if (!usable) block = reject(c, tokens, out, prefix_broken);
    if (block) install(c, *block, out);
    return block;
  }

  // The recover rules (the header comment) for a planned entry that is missing or unusable, or whose read failed:
  // the recomputed isolated cache to install, or nothing (the chunk is computed).
  std::optional<KVBlock> reject(ChunkPlan& c, std::span<const token_id> tokens, FusionResult& out,
                                bool& prefix_broken) {
    ++out.rejected_entries;
    // A cache computed behind a chunk context cannot be recomputed alone mid-request (the engine holds this
    // request's rows): the chunk is computed in context instead.
    if (c.source == KVSource::isolated && out.plan.layout.chunk_context == 0) {
      const auto t0 = std::chrono::steady_clock::now();
      KVBlock block = backend_->chunk_kv(slice(tokens, c.range), 0);
      c.stored_first_position = 0;
      try {  // losing the copy must not lose the request (a store that is down throws kvfuse::error)
        put(c.key, block);
      } catch (const error& e) {
        out.put_failures.emplace_back(e.what());
      }
      out.time.chunk_compute_ms += ms_since(t0);
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
    out.time.load_ms += ms_since(t0);
    t0 = std::chrono::steady_clock::now();
    if (c.range.begin != c.stored_first_position) backend_->shift_rows(c.range, c.range.begin - c.stored_first_position);
    out.time.shift_ms += ms_since(t0);
  }

  Backend* backend_;
  Store* store_;
  EngineShape shape_;
  LayerReader<Store, layered> reader_;
  MeasuredLoad measured_;
};

}  // namespace kvfuse::detail
