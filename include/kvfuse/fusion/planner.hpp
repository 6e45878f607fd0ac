#pragma once
// The scheduler side of the fusion loop: plan_fusion decides, for one request, where each chunk's KV comes from
// and which rows the first layer computes, from what the store and the Cache-Craft variant cache hold now. A
// plan is plain data (FusionPlan, fusion_method.hpp) and planning has no side effects: it never writes a store,
// never counts a variant use, never waits for a running request (vLLM's connector asks the same of
// get_num_new_matched_tokens). The store is asked once per plan for every key (KVStore::contains_many).
//
//   chunk source    isolated chunk cache (CacheBlend, Epic, QueryAware, naive reuse; computed behind the layout's
//                   chunk_context when it has one), prefix entry (prefix
//                   caching: the longest run of leading chunks stored behind exactly the chunks before them),
//                   Cache-Craft variant (the best one by eq. 12's CFO), or compute (nothing usable stored)
//   S_0, per_layer, statistics    from layer_schedule (the one place methods are dispatched); a fixed S_0's runs
//                   merged where the engine's cost per forward call exceeds the gap (EngineShape::run_cost_rows)
//   bytes           per loaded chunk, what the engine's loader reads
//
// FusionPipeline (the single-request driver) and FusionConnector (request-keyed hooks for an engine's own step
// loop) both plan with it.

#include <algorithm>
#include <cstdint>
#include <optional>
#include <span>
#include <unordered_map>
#include <variant>
#include <vector>

#include "kvfuse/backend/concepts.hpp"
#include "kvfuse/cache/variant_cache.hpp"
#include "kvfuse/core/error.hpp"
#include "kvfuse/core/keys.hpp"
#include "kvfuse/core/prompt.hpp"
#include "kvfuse/core/types.hpp"
#include "kvfuse/fusion/fusion_method.hpp"
#include "kvfuse/fusion/layer_schedule.hpp"

namespace kvfuse {

// What a plan needs to know of the engine.
struct EngineShape {
  std::uint64_t model = 0;                // model fingerprint: part of every key
  std::int64_t num_layers = 0;
  std::size_t layer_bytes_per_row = 0;    // bytes of one row of one layer of a stored block (K and V)
  // What one more forward call costs the engine beyond the rows it computes, in rows (RunCostBackend): an engine
  // that recomputes a fixed set in one call per run of adjacent positions (llama.cpp) pays a pass over the
  // weights per run. A fixed set's runs closer than this are merged (merge_runs). 0: calls are free.
  std::int64_t run_cost_rows = 0;

  [[nodiscard]] std::size_t block_bytes(std::int64_t rows) const noexcept {
    return static_cast<std::size_t>(num_layers) * layer_bytes(rows);
  }
  [[nodiscard]] std::size_t layer_bytes(std::int64_t rows) const noexcept {
    return static_cast<std::size_t>(rows) * layer_bytes_per_row;
  }
};

// The shape of an engine that reports model_fingerprint(), num_layers(), block_bytes(rows) and, when a forward call
// costs it more than its rows, run_cost_rows() (RunCostBackend): how every engine's EngineShape is read.
template <class Engine>
[[nodiscard]] EngineShape engine_shape(const Engine& engine) {
  EngineShape shape{engine.model_fingerprint(), engine.num_layers(),
                    engine.block_bytes(1) / static_cast<std::size_t>(engine.num_layers())};
  if constexpr (requires { engine.run_cost_rows(); }) {
    shape.run_cost_rows = engine.run_cost_rows();
    detail::require(shape.run_cost_rows >= 0, "engine_shape: the engine's run_cost_rows() is {}, below 0",
                    shape.run_cost_rows);
  }
  return shape;
}

// Cache-Craft variants a plan may choose from: the cache and where each variant's KV was rotated (by key content).
struct VariantIndex {
  const VariantCache* cache = nullptr;
  const std::unordered_map<std::uint64_t, std::int64_t>* first_positions = nullptr;
};

// Throws unless `layout` covers `tokens` exactly (a non-empty prompt).
inline void check_prompt(std::span<const token_id> tokens, const PromptLayout& layout, const char* what) {
  layout.validate();
  detail::require(layout.num_tokens() == static_cast<std::int64_t>(tokens.size()) && !tokens.empty(),
                  "{}: the layout covers {} tokens but the prompt has {}", what, layout.num_tokens(), tokens.size());
}

[[nodiscard]] inline std::span<const token_id> slice(std::span<const token_id> tokens, TokenRange r) {
  return tokens.subspan(static_cast<std::size_t>(r.begin), static_cast<std::size_t>(r.size()));
}

// What the chunk cache of rows r of a prompt with this layout is computed from: its chunk context (rows
// [0, layout.chunk_context), none when 0) and then the chunk's tokens; the cache is the last r.size() rows.
[[nodiscard]] inline std::vector<token_id> chunk_cache_input(std::span<const token_id> tokens, const PromptLayout& layout,
                                                             TokenRange r) {
  std::vector<token_id> out(tokens.begin(), tokens.begin() + layout.chunk_context);
  const auto chunk = slice(tokens, r);
  out.insert(out.end(), chunk.begin(), chunk.end());
  return out;
}

// layout.cached from the chunks' sources, S_0 and the per-layer statistics from layer_schedule, and the bytes each
// loaded chunk reads. Rows [0, exact_prefix) are already resident and exact (Cake's stored prefix): none of them
// is recomputed. Called again when a chunk's entry turns out unusable and the chunk becomes `compute`.
inline void finish_plan(FusionPlan& plan, const FusionMethod& method, const EngineShape& shape,
                        std::int64_t exact_prefix = 0) {
  for (std::size_t j = 0; j < plan.chunks.size(); ++j) {
    ChunkPlan& c = plan.chunks[j];
    plan.layout.chunks[j].cached = c.source != KVSource::compute;
    c.bytes = c.source == KVSource::compute || c.range.end <= exact_prefix ? 0 : shape.block_bytes(c.range.size());
  }
  const LayerSchedule schedule = layer_schedule(plan, method, shape.num_layers);
  plan.initial = schedule.initial;
  std::erase_if(plan.initial, [exact_prefix](std::int64_t row) { return row < exact_prefix; });
  plan.per_layer = !schedule.fixed_set();
  plan.two_pass = schedule.second_pass != nullptr;
  // Only adds rows, each recomputed exactly: fidelity cannot drop, calls do.
  if (!plan.per_layer && shape.run_cost_rows > 0) plan.initial = merge_runs(plan.initial, shape.run_cost_rows);
  const KVTensor rank = std::visit(
      [](const auto& m) {
        if constexpr (requires { m.rank_by; }) return m.rank_by;
        return KVTensor::key;
      },
      method);
  plan.statistics = {schedule.needs_deviation && rank == KVTensor::key,
                     schedule.needs_deviation && rank == KVTensor::value, schedule.needs_attention,
                     schedule.needs_attention, schedule.needs_query_mass};
}

// The plan of `method` for request `request_id`: no side effects (see the header comment).
template <KVStore Store>
[[nodiscard]] FusionPlan plan_fusion(std::uint64_t request_id, std::span<const token_id> tokens,
                                     const PromptLayout& layout, const FusionMethod& method, const EngineShape& shape,
                                     Store& store, VariantIndex variants = {}) {
  check_prompt(tokens, layout, "plan_fusion");
  FusionPlan plan;
  plan.request_id = request_id;
  plan.method = method_name(method);
  plan.layout = layout;
  plan.chunks.resize(layout.chunks.size());
  for (std::size_t j = 0; j < layout.chunks.size(); ++j) plan.chunks[j].range = layout.chunks[j].range;

  const bool prefix = std::holds_alternative<PrefixCaching>(method);
  const auto* craft = std::get_if<CacheCraft>(&method);
  const bool isolated = !prefix && craft == nullptr && !std::holds_alternative<FullRecompute>(method);
  // Which chunks look a key up, and the keys, asked of the store at once.
  std::vector<std::size_t> asks;
  std::vector<KVKey> keys;
  const auto context = slice(tokens, {0, layout.chunk_context});  // chunk caches computed behind it
  std::uint64_t chained = kHashSeed;
  for (std::size_t j = 0; j < layout.chunks.size(); ++j) {
    const PromptChunk& pc = layout.chunks[j];
    const auto chunk = slice(tokens, pc.range);
    chained = hash_tokens(chunk, chained);
    if (!pc.cached || pc.range.empty() || !(prefix || isolated)) continue;
    asks.push_back(j);
    keys.push_back(prefix ? chained_prefix_key(shape.model, chained) : chunk_cache_key(shape.model, chunk, context));
  }
  const std::vector<bool> held = keys.empty() ? std::vector<bool>{} : store.contains_many(std::span<const KVKey>(keys));
  detail::require(held.size() == keys.size(), "plan_fusion: the store answered {} of {} lookups", held.size(),
                  keys.size());
  bool prefix_open = true;
  for (std::size_t a = 0; a < asks.size(); ++a) {
    ChunkPlan& c = plan.chunks[asks[a]];
    if (prefix) {
      // A prefix entry is exact only behind the entries before it: the run stops at the first chunk missing.
      prefix_open = prefix_open && held[a];
      if (prefix_open) {
        c.source = KVSource::prefix;
        c.key = keys[a];
        c.stored_first_position = c.range.begin;
      }
    } else if (held[a]) {
      c.source = KVSource::isolated;
      c.key = keys[a];
      c.stored_first_position = layout.chunk_context;
    }
  }
  if (craft != nullptr && variants.cache != nullptr) {
    std::vector<std::uint64_t> ids;
    for (std::size_t j = 0; j < layout.chunks.size(); ++j) {
      const PromptChunk& pc = layout.chunks[j];
      if (pc.range.empty()) continue;
      const std::uint64_t id = chunk_content_id(slice(tokens, pc.range));
      // A chunk repeated within the prompt has no prefix-as-a-set score (eq. 6-7): it is recomputed.
      const bool repeated = std::find(ids.begin(), ids.end(), id) != ids.end();
      if (pc.cached && !repeated) {
        if (std::optional<VariantMatch> m = variants.cache->best(id, ids, craft->scoring)) {  // eq. 12 CFO, eq. 14
          const auto at = variants.first_positions->find(m->kv.content);
          if (at != variants.first_positions->end()) {
            ChunkPlan& c = plan.chunks[j];
            c.source = KVSource::variant;
            c.key = m->kv;
            c.stored_first_position = at->second;
            c.cfo = m->score.cfo;
            c.recompute = std::move(m->score.recompute);
            c.variant_id = m->variant_id;
          }
        }
      }
      if (!repeated) ids.push_back(id);
    }
  }
  finish_plan(plan, method, shape);
  return plan;
}

}  // namespace kvfuse
