#pragma once
// The two concepts an engine models to run kvfuse's fusion methods with its own forward pass and KV layout.
// FusionPipeline (fusion/fusion_pipeline.hpp) plans a request, loads and checks the stored chunk KV, and
// makes these calls; the engine keeps the request's KV (its own buffers, pages, cells).
//
// FixedSetFusionBackend — an engine that can recompute ONE token set on every layer over KV it was given
// (enough for full prefill, prefix caching, naive reuse, Epic's AttnLink and Cache-Craft without focus
// termination: their S_l is fixed, layer_schedule(...).fixed_set()). Calls, in order, for one request:
//   cb.model_fingerprint()        -> uint64: part of every store key, so KV never crosses models
//   cb.num_layers()               -> int64
//   cb.block_bytes(n)             -> size_t: bytes of a KVBlock of n rows in the engine's layout (a stored block
//                                    of another size is refused, never installed)
//   b.chunk_kv(tokens, first)     -> KVBlock: offline, the KV of `tokens` computed alone at positions
//                                    first, first + 1, ... (a chunk cache; block.first_position = first)
//   b.begin(tokens)               -> void: a new request for the prompt `tokens`; no row is resident
//   b.load_rows(r, block)         -> void: stored KV for prompt rows r, rotated at positions
//                                    block.first_position + (0 .. r.size() − 1)
//   b.shift_rows(r, delta)        -> void: RoPE-shift K of rows r by delta on every layer (one rotation by
//                                    new − old), so row t sits at position t
//   b.prefill(rows)               -> std::vector<float>: recompute `rows` (sorted, holding the last row) on
//                                    every layer against the resident KV with the exact causal mask by
//                                    position, row t at position t; the logits of the last row. Rows not in
//                                    `rows` keep their KV.
//   cb.save_rows(r)               -> KVBlock: the resident KV of rows r (first_position = row r.begin's
//                                    position), to store it (prefix-cache entries, Cache-Craft variants)
//
// PerLayerFusionBackend — a refinement for engines that can change the set per layer and report what the
// methods with per-layer feedback need (CacheBlend's gradual filtering: KV deviations; Cache-Craft's focus
// termination: attention statistics; QueryAware: the query's attention mass):
//   b.prefill(rows, next, stats)  -> std::vector<float>: as above with S_0 = rows; after computing layer l's
//                                    S_l the engine calls next(LayerReport{l, S_l, K and V deviation of each
//                                    row of S_l against the KV it had before, attention statistics over
//                                    stats.groups when it is set, and when stats.query is not empty the
//                                    query mass: per row of S_l the softmax weight the rows of stats.query
//                                    put on it, summed over them and over the heads}) and computes S_{l+1} =
//                                    its result on layer l + 1. An empty `next` keeps S_l. Both statistics
//                                    come from the softmax the layer computes (StatisticsRequest,
//                                    layer_protocol.hpp).
//
// AttentionStatisticsBackend — a refinement for engines that keep one set for every layer but can report
// attention statistics during a full prefill: what FusionPipeline::record_context needs to profile Cache-Craft's
// variants (eq. 3-11, 14). Every PerLayerFusionBackend gives them through its per-layer prefill; an engine with a
// fixed set only (kvfuse's llama.cpp integration) models
//   b.prefill(rows, groups, sink)         -> std::vector<float>: prefill(rows) of every row of a request just
//                                            begun, calling sink(l, LayerAttention over groups) once per layer,
//                                            l = 0 .. L − 1 (AttentionSink, layer_protocol.hpp)
//
// LayerwiseFusionBackend — a refinement for engines that take stored KV one layer at a time, so that reading
// layers l + 1 .. l + L_p of the chunk caches overlaps computing layer l (FusionPipeline's layer-pipelined
// loading: Cache-Craft §3.4.2, Algorithm 2; CacheBlend §5's pipelining of loading with recompute):
//   cb.layer_bytes(n)                     -> size_t: bytes of one layer of a KVBlock of n rows. A block is its
//                                            layers 0 .. L − 1 in order: block_bytes(n) == L · layer_bytes(n)
//   b.load_layer_rows(l, r, bytes, first) -> void: layer l of stored KV for prompt rows r (`bytes`: that layer's
//                                            part of a block rotated at positions first + (0 .. r.size() − 1));
//                                            the rows already sit at this prompt's positions (row t at t), only
//                                            their layer-l K and V change
//   b.shift_layer_rows(l, r, delta)       -> void: RoPE-shift the K of rows r on layer l by delta
//   b.set_layer_hook(hook)                -> void: from now on every prefill calls hook(l) before it reads layer
//                                            l's KV, exactly once per layer, l = 0, 1, ..., L − 1 in order
//                                            (LayerHook, layer_protocol.hpp); an empty hook removes it
// The pipeline sets the hook for one prefill and removes it after (a hook the engine had is not kept); it calls
// load_layer_rows / shift_layer_rows from inside the hook, on the engine's thread. The hook may throw: the
// prefill must let the exception through.
//
// RunCostBackend — a refinement for engines whose forward call has a cost of its own beyond the rows it computes
// (llama.cpp: each llama_decode is a pass over the weights, and a fixed set is recomputed in one call per run of
// adjacent positions):
//   cb.run_cost_rows()                    -> int64: that cost, in rows (what computing that many more rows in a
//                                            call would cost). The planner then merges the runs of a fixed set
//                                            whose gap costs less to recompute than another call (merge_runs,
//                                            EngineShape::run_cost_rows): more rows, each exact, fewer calls.
//
// A method that needs the refinement is refused for a backend without it: at compile time when the method's
// type is static (FusionPipeline::run with CacheBlend or QueryAware), with a named error when it arrives in a
// FusionMethod.

#include <concepts>
#include <cstddef>
#include <cstdint>
#include <span>
#include <type_traits>
#include <utility>
#include <vector>

#include "kvfuse/core/prompt.hpp"
#include "kvfuse/core/types.hpp"
#include "kvfuse/fusion/fusion_method.hpp"
#include "kvfuse/fusion/layer_protocol.hpp"

namespace kvfuse {

template <class B>
concept FixedSetFusionBackend =
    requires(B& b, const B& cb, std::span<const token_id> tokens, std::int64_t n, TokenRange r, const KVBlock& block,
             const TokenSet& rows) {
      { cb.model_fingerprint() } -> std::convertible_to<std::uint64_t>;
      { cb.num_layers() } -> std::convertible_to<std::int64_t>;
      { cb.block_bytes(n) } -> std::convertible_to<std::size_t>;
      { b.chunk_kv(tokens, n) } -> std::same_as<KVBlock>;
      { b.begin(tokens) } -> std::same_as<void>;
      { b.load_rows(r, block) } -> std::same_as<void>;
      { b.shift_rows(r, n) } -> std::same_as<void>;
      { b.prefill(rows) } -> std::same_as<std::vector<float>>;
      { cb.save_rows(r) } -> std::same_as<KVBlock>;
    };

template <class B>
concept PerLayerFusionBackend =
    FixedSetFusionBackend<B> &&
    requires(B& b, const TokenSet& rows, const SelectionPolicy& next, const StatisticsRequest& stats) {
      { b.prefill(rows, next, stats) } -> std::same_as<std::vector<float>>;
    };

template <class B>
concept AttentionStatisticsBackend =
    FixedSetFusionBackend<B> && requires(B& b, const TokenSet& rows, const PromptLayout& groups,
                                         const AttentionSink& sink) {
      { b.prefill(rows, groups, sink) } -> std::same_as<std::vector<float>>;
    };

template <class B>
concept LayerwiseFusionBackend =
    FixedSetFusionBackend<B> && requires(B& b, const B& cb, std::int64_t n, TokenRange r,
                                         std::span<const std::byte> bytes, LayerHook hook) {
      { cb.layer_bytes(n) } -> std::convertible_to<std::size_t>;
      { b.load_layer_rows(n, r, bytes, n) } -> std::same_as<void>;
      { b.shift_layer_rows(n, r, n) } -> std::same_as<void>;
      { b.set_layer_hook(std::move(hook)) } -> std::same_as<void>;
    };

template <class B>
concept RunCostBackend = FixedSetFusionBackend<B> && requires(const B& cb) {
  { cb.run_cost_rows() } -> std::convertible_to<std::int64_t>;
};

// Whether every instance of method type M needs per-layer feedback (compile-time refusal for fixed-set
// engines). Cache-Craft needs it only with focus termination, a run-time setting: checked when it runs.
template <class M>
inline constexpr bool needs_per_layer_backend =
    std::is_same_v<M, CacheBlend> || std::is_same_v<M, QueryAware> || std::is_same_v<M, QueryProbe>;

}  // namespace kvfuse
