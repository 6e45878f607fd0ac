#pragma once
// LlamaCppBatchEngine: kvfuse's fixed-set methods (full prefill, prefix caching, naive reuse, Epic's AttnLink,
// Cache-Craft without focus termination) for several requests at once inside llama.cpp — an engine that owns its
// step loop, as CpuBatchEngine (kvfuse/backend/cpu/batch_engine.hpp) does for the reference backend: requests
// keyed by id arrive (submit) and leave (cancel, or when done) between steps, each is planned by kvfuse's planner
// (plan_fusion, the one FusionConnector::plan and FusionPipeline use) from what the store holds when it is
// admitted, its stored blocks are loaded, and every step is ONE llama_decode holding each running request's next
// rows, each request in its own sequence.
//
// Blocks are LlamaCppContext's (llama.cpp sequence states under the same fingerprint), so what FusionPipeline over
// LlamaCppFusion stores (store_chunk_caches, record_context's Cache-Craft variants) this engine reads. With
// BatchOptions::save_chunk_caches (a server's setting) it also stores: a request's reusable chunks the store lacks
// are computed alone at position 0 when it is admitted (CacheBlend's chunk cache, one llama_decode each in the
// scratch region) and put, so later requests load them. In a step, a decoding request adds one token; a
// prefilling one, after the decodes and in order of arrival, the next run of its S_0 (llama_decode takes, per
// sequence, only positions that continue it, so each maximal run of recomputed rows is a step of its own, the
// stored rows before it joining the request's sequence first, as in LlamaCppFusion), cut to what is left of the step's budget (LlamaCppOptions::n_ubatch tokens: one
// graph per step).
//
// Batched equals alone, bit for bit: a request's logits and tokens do not depend on the other requests of its
// steps. Two things of llama.cpp's CPU path would make them depend on it, and the engine rules both out:
//   - Attention runs over all n_kv cells, summed in SIMD blocks (masked cells add exact zeros), so where a
//     request's cells sit can change its rounding, and llama.cpp's own cell search puts them wherever other
//     requests left room. So each request owns a region of BatchOptions::region_cells cells (a
//     multiple of 256: a margin over SIMD blocks; an offset of 8 cells changed nothing on the AVX-512 kernels
//     measured, docs/llamacpp.md §4), its row at position p in cell base + p. llama.cpp picks cells itself (the
//     first free ones from its head), so every cell no request holds belongs to a filler
//     sequence of its region (filler position p in cell base + p), and a step frees exactly the cells its rows go
//     to (the filler's or a recomputed row's stored copy); the batch lists them in cell order. A finished request's
//     cells go back to its region's filler.
//   - llama.cpp multiplies a ubatch of one token on another path than one of several (without the fix below a
//     request's greedy tokens alone differed from batched). A step of one token (one request decoding) gets a
//     throwaway second token in a scratch sequence of a scratch region.
// A stored block's cells must be in position order for its rows to land in cell base + p (llama.cpp writes a
// sequence's state in cell order; LlamaCppFusion's blocks are); one that is not is refused like a corrupt one.
//
// Failures stay with their request: an entry missing, of the wrong size or positions, or refused by llama.cpp is
// computed instead (FusionConnector::recover's rule; a prefix entry after a broken one too) and counted in the
// request's first event; the other requests are not touched. Bad input is refused at submit with a kvfuse::error
// naming it. A failed llama_decode ends the step's requests with an error event and resets the cells.
//
// Not supported, refused by name: models with sliding-window layers (Gemma 3: llama.cpp may reuse a cell its
// window hides, so the filler layout does not hold), and methods whose recomputed set changes per layer
// (CacheBlend, Cache-Craft with focus termination). Not thread-safe: the engine's loop calls it.

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <filesystem>
#include <map>
#include <optional>
#include <random>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include <fmt/format.h>
#include <llama.h>

#include "kvfuse/backend/concepts.hpp"
#include "kvfuse/core/error.hpp"
#include "kvfuse/core/keys.hpp"
#include "kvfuse/core/prompt.hpp"
#include "kvfuse/core/sampling.hpp"
#include "kvfuse/core/status.hpp"
#include "kvfuse/core/types.hpp"
#include "kvfuse/fusion/fusion_method.hpp"
#include "kvfuse/fusion/planner.hpp"
#include "kvfuse/llamacpp_context.hpp"

namespace kvfuse::llamacpp {

struct BatchOptions {
  // n_ubatch is each step's token budget; n_ctx is set from the regions; scratch_pairs and attention_statistics
  // are LlamaCppFusion's (unused here)
  LlamaCppOptions llama{};
  std::uint32_t max_requests = 4;      // running at once (the rest wait for a region)
  std::uint32_t region_cells = 1024;   // cells of a request: its prompt and answer (a multiple of 256)
  bool save_chunk_caches = false;      // put the chunk caches of a request's reusable chunks the store lacks
};

struct BatchRequest {
  std::vector<token_id> tokens;        // the prompt
  PromptLayout layout;                 // its chunks and query; covers every token
  FusionMethod method = FullRecompute{};
  std::int64_t max_new_tokens = 16;
  std::vector<token_id> stop_tokens;   // generation ends at one of these (not returned)
  double temperature = 0.0;            // 0: greedy; > 0: sampled from softmax(logits / temperature)
  std::uint64_t seed = 0;              // of the sampler (temperature > 0)
  VariantIndex variants{};             // Cache-Craft: the variants its plan may choose (FusionPipeline's)
};

enum class BatchFinish { none, length, stop, cancelled, error };

struct BatchEvent {
  std::uint64_t request = 0;
  std::optional<token_id> token;       // a new token
  std::vector<float> logits;           // with the first token: the prompt's last row's logits
  std::int64_t rejected_entries = 0;   // with the first token: stored entries refused, their chunks computed
  BatchFinish finish = BatchFinish::none;
  Status status = Status::success;     // of a request that ended in error
  std::string error;
  std::int64_t loaded_rows = 0;        // with the first token: prompt rows whose KV came from the store
  std::int64_t recomputed_rows = 0;    // with the first token: prompt rows computed (|S_0|, every layer)
};

template <KVStore Store>
class LlamaCppBatchEngine : public LlamaCppContext {
 public:
  LlamaCppBatchEngine(const std::filesystem::path& gguf, Store& store, BatchOptions options = {})
      : LlamaCppContext(gguf, context_options(options), {3 * options.max_requests + 5, 1, nullptr, nullptr,
                                                         "LlamaCppBatchEngine"}),
        store_(&store),
        regions_(options.max_requests),
        region_cells_(options.region_cells),
        shape_(engine_shape(static_cast<const LlamaCppContext&>(*this))),
        save_chunk_caches_(options.save_chunk_caches) {
    kvfuse::detail::require(llama_model_n_swa(model_.get()) <= 0,
                            "LlamaCppBatchEngine: '{}' has sliding-window layers (window {}): llama.cpp may reuse a "
                            "cell its window hides, which the engine's cell layout does not allow (use LlamaCppFusion)",
                            gguf.string(), llama_model_n_swa(model_.get()));
    region_of_.assign(regions_, 0);
    fill_cells();
  }

  // Queues a request; its id. Throws kvfuse::error naming a bad field.
  std::uint64_t submit(BatchRequest request) {
    check_prompt(request.tokens, request.layout, "LlamaCppBatchEngine::submit");
    kvfuse::detail::require(request.layout.chunk_context == 0,
                            "LlamaCppBatchEngine::submit: chunk_context = {}: chunk caches computed behind a context "
                            "are not supported (a llama.cpp sequence state holds every row of its sequence); use 0",
                            request.layout.chunk_context);
    for (std::size_t i = 0; i < request.tokens.size(); ++i)
      kvfuse::detail::require(request.tokens[i] >= 0 && request.tokens[i] < n_vocab_,
                              "LlamaCppBatchEngine::submit: token {} at index {} is outside the vocabulary [0, {})",
                              request.tokens[i], i, n_vocab_);
    kvfuse::detail::require(request.max_new_tokens >= 1,
                            "LlamaCppBatchEngine::submit: max_new_tokens = {} must be >= 1", request.max_new_tokens);
    kvfuse::detail::require(std::isfinite(request.temperature) && request.temperature >= 0.0,
                            "LlamaCppBatchEngine::submit: temperature = {} must be finite and >= 0",
                            request.temperature);
    const auto need = static_cast<std::int64_t>(request.tokens.size()) + request.max_new_tokens;
    kvfuse::detail::require_code(need <= region_cells_, Status::beyond_context,
                                 "LlamaCppBatchEngine::submit: {} prompt tokens + max_new_tokens {} = {} exceed a "
                                 "request's {} cells (BatchOptions::region_cells)",
                                 request.tokens.size(), request.max_new_tokens, need, region_cells_);
    const FusionPlan plan = plan_fusion(0, request.tokens, request.layout, request.method, shape_, *store_,
                                        request.variants);
    kvfuse::detail::require(plan.initial.back() == static_cast<std::int64_t>(request.tokens.size()) - 1,
                            "LlamaCppBatchEngine::submit: method '{}' does not recompute the prompt's last row",
                            plan.method);
    kvfuse::detail::require(!plan.per_layer,
                            "LlamaCppBatchEngine::submit: method '{}' changes the recomputed set per layer, which one "
                            "llama_decode per step cannot (fixed-set methods only)",
                            plan.method);
    const std::uint64_t id = next_id_++;
    queued_.push_back({id, std::move(request)});
    return id;
  }

  // The request leaves at the next step with BatchFinish::cancelled, its cells freed.
  void cancel(std::uint64_t request) { cancelled_.push_back(request); }

  [[nodiscard]] bool idle() const noexcept { return queued_.empty() && running_.empty(); }
  [[nodiscard]] std::int64_t running() const noexcept { return static_cast<std::int64_t>(running_.size()); }
  [[nodiscard]] const FusionPlan& plan(std::uint64_t request) const { return running_.at(request).plan; }
  // Tokens of the last step's llama_decode, the throwaway one included; the requests' rows in it (0: no decode),
  // and of those the decoding requests' tokens.
  [[nodiscard]] std::int64_t last_step_tokens() const noexcept { return last_step_tokens_; }
  [[nodiscard]] std::int64_t last_step_rows() const noexcept { return last_step_rows_; }
  [[nodiscard]] std::int64_t last_step_decodes() const noexcept { return last_step_decodes_; }
  // Chunk caches put (save_chunk_caches), and puts the store refused (the request goes on; the chunk is computed
  // again by a later one).
  [[nodiscard]] std::int64_t chunk_caches_saved() const noexcept { return saved_; }
  [[nodiscard]] std::int64_t put_failures() const noexcept { return put_failures_; }
  // Cells of the request's sequence (llama.cpp's count, from its state's size).
  [[nodiscard]] std::int64_t request_cells(std::uint64_t request) {
    const std::size_t size = llama_state_seq_get_size(ctx_.get(), seq_request(running_.at(request).region));
    return size > state_empty_ ? static_cast<std::int64_t>((size - state_base_) / state_per_row_) : 0;
  }

  // One engine step: cancellations, admissions, then one llama_decode; the tokens and finishes it produced.
  std::vector<BatchEvent> step() {
    std::vector<BatchEvent> events;
    for (std::uint64_t id : std::exchange(cancelled_, {})) {
      std::erase_if(queued_, [&](const Queued& q) {
        if (q.id == id) events.push_back({id, {}, {}, 0, BatchFinish::cancelled, Status::cancelled, {}});
        return q.id == id;
      });
      if (running_.contains(id)) end(id, {id, {}, {}, 0, BatchFinish::cancelled, Status::cancelled, {}}, events);
    }
    while (!queued_.empty() && running_.size() < regions_) {
      const std::uint64_t id = queued_.front().id;
      try {
        admit(std::move(queued_.front()));
      } catch (const error& e) {  // a store that throws: the request ends, its cells back to the filler
        end(id, {id, {}, {}, 0, BatchFinish::error, e.code(), e.what()}, events);
      }
      queued_.pop_front();
    }
    std::vector<Slice> slices = plan_step();
    last_step_rows_ = last_step_decodes_ = 0;
    if (slices.empty()) return events;
    try {
      run(slices);
    } catch (const error& e) {  // every running request ends; the cells start over
      std::vector<std::uint64_t> ids;
      for (const auto& [id, r] : running_) ids.push_back(id);
      for (std::uint64_t id : ids) end(id, {id, {}, {}, 0, BatchFinish::error, e.code(), e.what()}, events);
      llama_memory_clear(mem_, true);
      fill_cells();
      return events;
    }
    for (const Slice& s : slices) finish_slice(s, events);
    return events;
  }

 private:
  struct Queued {
    std::uint64_t id;
    BatchRequest request;
  };
  struct Running {
    BatchRequest request;
    FusionPlan plan;
    std::size_t region = 0;
    std::size_t next_row = 0;            // index into plan.initial of the next row to recompute
    std::int64_t attached_end = 0;       // the request's sequence holds rows [0, attached_end)
    std::vector<bool> staged;            // per row: a stored row in the staging sequence
    std::int64_t rejected = 0;
    std::int64_t generated = 0;
    token_id last = 0;                   // the token to decode next
    bool decoding = false;
    std::mt19937_64 rng;
  };
  // One request's rows of a step: positions [first, first + tokens.size()).
  struct Slice {
    std::uint64_t id;
    std::int64_t first;
    std::vector<token_id> tokens;
    bool wants_logits;
    std::int32_t batch_index = 0;        // of its last token
  };

  static LlamaCppOptions context_options(const BatchOptions& o) {
    kvfuse::detail::require(o.max_requests >= 1 && 3 * o.max_requests + 5 <= llama_max_parallel_sequences() &&
                                o.region_cells >= 256 && o.region_cells % 256 == 0 && o.llama.n_ubatch >= 2 &&
                                o.llama.n_ubatch > o.max_requests && o.llama.n_batch >= o.llama.n_ubatch,
                            "LlamaCppBatchEngine: max_requests {} (1 .. {}, below n_ubatch), region_cells {} (a "
                            "multiple of 256), n_ubatch {} (>= 2), n_batch {} (>= n_ubatch)",
                            o.max_requests, (llama_max_parallel_sequences() - 5) / 3, o.region_cells,
                            o.llama.n_ubatch, o.llama.n_batch);
    LlamaCppOptions l = o.llama;
    l.n_ctx = (o.max_requests + 1) * o.region_cells;  // the last region: the throwaway token's
    l.attention_statistics = false;
    return l;
  }

  // Sequences of region g: the request, its staging sequence, the filler; after the scratch region's filler, the
  // throwaway token's and the restore scratch (3 · max_requests + 5 in all).
  static constexpr llama_seq_id seq_request(std::size_t g) noexcept { return static_cast<llama_seq_id>(3 * g); }
  static constexpr llama_seq_id seq_staging(std::size_t g) noexcept { return static_cast<llama_seq_id>(3 * g + 1); }
  static constexpr llama_seq_id seq_filler(std::size_t g) noexcept { return static_cast<llama_seq_id>(3 * g + 2); }
  [[nodiscard]] llama_seq_id seq_throwaway() const noexcept { return seq_filler(regions_) + 1; }
  [[nodiscard]] llama_seq_id seq_scratch() const noexcept { return seq_filler(regions_) + 2; }

  // Every cell to its region's filler, in cell order from an empty cache: filler position p in cell base + p. The
  // first region's filler is decoded; the others restore its state (no forward pass: restoring a sequence takes
  // the first free cells, contiguous and in order). What a filler cell holds never matters: it is masked.
  void fill_cells() {
    const std::vector<token_id> zeros(options_.n_ubatch, 0);
    decode_into(seq_filler(0), 0, region_cells_, zeros);
    const std::vector<std::byte> state = save_sequence(seq_filler(0));
    for (std::size_t g = 1; g <= regions_; ++g) {
      const llama_seq_id seq = seq_filler(g);
      const std::size_t read = llama_state_seq_set_data(
          ctx_.get(), reinterpret_cast<const std::uint8_t*>(state.data()), state.size(), seq);
      kvfuse::detail::require(read == state.size() && llama_memory_seq_pos_min(mem_, seq) == 0 &&
                                  llama_memory_seq_pos_max(mem_, seq) == region_cells_ - 1,
                              "LlamaCppBatchEngine: llama.cpp did not restore the filler of region {} ({} of {} "
                              "bytes read)",
                              g, read, state.size());
    }
  }

  // Tokens (cycled from `tokens`) at positions [lo, hi) of an empty or continued sequence, n_ubatch at a time.
  void decode_into(llama_seq_id seq, std::int64_t lo, std::int64_t hi, std::span<const token_id> tokens) {
    for (std::int64_t p = lo; p < hi;) {
      const std::int64_t m = std::min<std::int64_t>(hi - p, options_.n_ubatch);
      batch_.n_tokens = static_cast<std::int32_t>(m);
      for (std::int64_t i = 0; i < m; ++i)
        set_token(static_cast<std::size_t>(i), tokens[static_cast<std::size_t>(p - lo + i) % tokens.size()], p + i,
                  std::span(&seq, 1), false);
      decode("fill", p, static_cast<std::size_t>(m));
      p += m;
    }
  }

  void admit(Queued q) {
    std::size_t g = 0;
    while (region_of_[g] != 0) ++g;
    region_of_[g] = q.id;
    Running& r = running_[q.id];
    r.region = g;
    r.request = std::move(q.request);
    r.staged.assign(r.request.tokens.size(), false);
    r.rng.seed(r.request.seed);
    r.plan = plan_fusion(q.id, r.request.tokens, r.request.layout, r.request.method, shape_, *store_,
                         r.request.variants);
    bool prefix_broken = false, changed = false;  // a prefix entry is exact only behind the ones before it
    for (ChunkPlan& c : r.plan.chunks) {
      if (c.source == KVSource::compute || (!(prefix_broken && c.source == KVSource::prefix) && load(r, c))) continue;
      if (!prefix_broken || c.source != KVSource::prefix) ++r.rejected;
      prefix_broken = prefix_broken || c.source == KVSource::prefix;
      c.source = KVSource::compute;
      changed = true;
    }
    if (changed) finish_plan(r.plan, r.request.method, shape_);  // S_0 with the chunks computed instead
    if (save_chunk_caches_) save_chunk_caches(r);
  }

  // Each reusable chunk of r computed for it (the store lacks it) alone at position 0 in the scratch region's cells
  // [0, n) — freed from its filler, which takes them back after — and put under its chunk-cache key.
  void save_chunk_caches(const Running& r) {
    for (std::size_t j = 0; j < r.plan.chunks.size(); ++j) {
      const ChunkPlan& c = r.plan.chunks[j];
      const std::int64_t n = c.range.size();
      if (c.source != KVSource::compute || !r.request.layout.chunks[j].cached || n == 0 || n > region_cells_) continue;
      const std::span<const token_id> tokens(r.request.tokens.data() + c.range.begin, static_cast<std::size_t>(n));
      const KVKey key = chunk_cache_key(shape_.model, tokens);
      if (store_->contains(key)) continue;  // an earlier chunk of this prompt with the same tokens
      const llama_seq_id x = seq_scratch(), filler = seq_filler(regions_);
      llama_memory_seq_rm(mem_, filler, 0, static_cast<llama_pos>(n));
      decode_into(x, 0, n, tokens);
      KVBlock block{n, save_sequence(x), 0};
      llama_memory_seq_cp(mem_, x, filler, -1, -1);
      llama_memory_seq_rm(mem_, x, -1, -1);
      try {
        store_->put(key, std::move(block));
        ++saved_;
      } catch (const error&) {
        ++put_failures_;
      }
    }
  }

  // The chunk's stored block into its cells (base + its rows), at its rows' positions, staged; false (cells back to
  // the filler) when the entry is unusable.
  bool load(Running& r, const ChunkPlan& c) {
    std::optional<KVBlock> block = store_->get(c.key);
    const std::int64_t n = c.range.size();
    if (!block || block->num_tokens != n || block->first_position != c.stored_first_position ||
        !block_mismatch(block->bytes, n, block->first_position).empty())
      return false;
    // Moved in its bytes where kvfuse rotates this model's K; else llama.cpp shifts it after the restore.
    const bool moved = c.shift() != 0 && shift_block(block->bytes, n, block->first_position, c.shift());
    const std::int64_t first = moved ? c.range.begin : block->first_position;
    const llama_seq_id x = seq_scratch(), filler = seq_filler(r.region);
    const auto lo = static_cast<llama_pos>(c.range.begin), hi = static_cast<llama_pos>(c.range.end);
    llama_memory_seq_rm(mem_, filler, lo, hi);  // exactly the chunk's cells are free
    const std::size_t read = llama_state_seq_set_data(
        ctx_.get(), reinterpret_cast<const std::uint8_t*>(block->bytes.data()), block->bytes.size(), x);
    if (read != block->bytes.size() || llama_memory_seq_pos_min(mem_, x) != first ||
        llama_memory_seq_pos_max(mem_, x) != first + n - 1) {
      llama_memory_seq_rm(mem_, x, -1, -1);
      const std::vector<token_id> zero(1, 0);
      decode_into(x, lo, hi, zero);  // llama.cpp freed them: the filler takes them back
      llama_memory_seq_cp(mem_, x, filler, -1, -1);
      llama_memory_seq_rm(mem_, x, -1, -1);
      return false;
    }
    if (c.shift() != 0 && !moved)
      llama_memory_seq_add(mem_, x, -1, -1, static_cast<llama_pos>(c.shift()));  // K re-rotated on the next decode
    llama_memory_seq_cp(mem_, x, seq_staging(r.region), -1, -1);
    llama_memory_seq_rm(mem_, x, -1, -1);
    std::fill(r.staged.begin() + c.range.begin, r.staged.begin() + c.range.end, true);
    return true;
  }

  // Each running request's rows of this step (decodes first, then prefills in arrival order within the budget),
  // in region order: the order of their cells.
  std::vector<Slice> plan_step() {
    std::vector<std::pair<bool, std::uint64_t>> order;  // decodes first, then by id: the order of arrival
    for (const auto& [id, r] : running_) order.emplace_back(!r.decoding, id);
    std::sort(order.begin(), order.end());
    auto budget = static_cast<std::int64_t>(options_.n_ubatch);
    std::vector<std::pair<std::size_t, Slice>> picked;
    for (const auto& [prefills, id] : order) {
      Running& r = running_.at(id);
      const auto n = static_cast<std::int64_t>(r.request.tokens.size());
      if (r.decoding) {
        picked.push_back({r.region, {id, n + r.generated - 1, {r.last}, true}});
        --budget;
        continue;
      }
      if (budget == 0) continue;
      const TokenSet& rows = r.plan.initial;
      std::size_t j = r.next_row + 1;
      while (j < rows.size() && rows[j] == rows[j - 1] + 1 && static_cast<std::int64_t>(j - r.next_row) < budget) ++j;
      const std::int64_t a = rows[r.next_row], b = rows[j - 1] + 1;
      picked.push_back({r.region, {id, a, {r.request.tokens.begin() + a, r.request.tokens.begin() + b}, b == n}});
      budget -= b - a;
    }
    std::sort(picked.begin(), picked.end(), [](const auto& x, const auto& y) { return x.first < y.first; });
    std::vector<Slice> out;
    for (auto& [g, s] : picked) out.push_back(std::move(s));
    return out;
  }

  // Frees each slice's cells, then one llama_decode of every slice in cell order (and the throwaway token when the
  // step has one token).
  void run(std::vector<Slice>& slices) {
    std::int64_t total = 0;
    for (const Slice& s : slices) {
      Running& r = running_.at(s.id);
      const auto a = static_cast<llama_pos>(s.first), b = static_cast<llama_pos>(s.first + std::ssize(s.tokens));
      if (!r.decoding) attach(r, s.first);
      llama_memory_seq_rm(mem_, seq_staging(r.region), a, b);  // stale stored copies of recomputed rows
      llama_memory_seq_rm(mem_, seq_filler(r.region), a, b);
      total += std::ssize(s.tokens);
    }
    const bool pad = total == 1;
    if (pad) llama_memory_seq_rm(mem_, seq_filler(regions_), 0, 1);
    batch_.n_tokens = static_cast<std::int32_t>(total + (pad ? 1 : 0));
    std::size_t i = 0;
    for (Slice& s : slices) {
      const llama_seq_id seq = seq_request(running_.at(s.id).region);
      for (std::size_t t = 0; t < s.tokens.size(); ++t, ++i)
        set_token(i, s.tokens[t], s.first + static_cast<std::int64_t>(t), std::span(&seq, 1),
                  s.wants_logits && t + 1 == s.tokens.size());
      s.batch_index = static_cast<std::int32_t>(i - 1);
    }
    const llama_seq_id t = seq_throwaway();
    if (pad) set_token(i, 0, 0, std::span(&t, 1), false);
    last_step_tokens_ = batch_.n_tokens;
    last_step_rows_ = total;
    for (const Slice& s : slices) last_step_decodes_ += running_.at(s.id).decoding ? 1 : 0;
    decode("step", slices.front().first, static_cast<std::size_t>(batch_.n_tokens));
    if (pad) {
      llama_memory_seq_cp(mem_, t, seq_filler(regions_), -1, -1);
      llama_memory_seq_rm(mem_, t, -1, -1);
    }
  }

  // Staged rows [attached_end, lo) join the request's sequence, which then continues at lo.
  void attach(Running& r, std::int64_t lo) {
    for (std::int64_t t = r.attached_end; t < lo; ++t)
      kvfuse::detail::require(r.staged[static_cast<std::size_t>(t)],
                              "LlamaCppBatchEngine: row {} of request {} is neither recomputed nor loaded", t,
                              r.plan.request_id);
    if (lo > r.attached_end) {
      const auto a = static_cast<llama_pos>(r.attached_end), b = static_cast<llama_pos>(lo);
      llama_memory_seq_cp(mem_, seq_staging(r.region), seq_request(r.region), a, b);
      llama_memory_seq_rm(mem_, seq_staging(r.region), a, b);
    }
    std::fill(r.staged.begin() + r.attached_end, r.staged.begin() + lo, false);
  }

  void finish_slice(const Slice& s, std::vector<BatchEvent>& events) {
    Running& r = running_.at(s.id);
    const std::int64_t end_row = s.first + std::ssize(s.tokens);
    if (!r.decoding) {
      r.attached_end = end_row;
      while (r.next_row < r.plan.initial.size() && r.plan.initial[r.next_row] < end_row) ++r.next_row;
      if (!s.wants_logits) return;
    }
    BatchEvent event{s.id, {}, {}, 0, BatchFinish::none, Status::success, {}};
    std::vector<float> logits = logits_of(s.batch_index);
    const token_id next = sample_token(logits, r.request.temperature, r.rng);
    if (!r.decoding) {
      event.logits = std::move(logits);
      event.rejected_entries = r.rejected;
      event.recomputed_rows = static_cast<std::int64_t>(r.plan.initial.size());
      for (const ChunkPlan& c : r.plan.chunks)
        if (c.source != KVSource::compute) event.loaded_rows += c.range.size();
      r.decoding = true;
    }
    const std::vector<token_id>& stop = r.request.stop_tokens;
    if (std::find(stop.begin(), stop.end(), next) != stop.end()) {
      event.finish = BatchFinish::stop;
      end(s.id, std::move(event), events);
      return;
    }
    event.token = next;
    r.last = next;
    if (++r.generated == r.request.max_new_tokens) {
      event.finish = BatchFinish::length;
      end(s.id, std::move(event), events);
      return;
    }
    events.push_back(std::move(event));
  }

  // The request leaves: its cells back to its region's filler (every position of the region is the request's,
  // staged, or the filler's, once).
  void end(std::uint64_t id, BatchEvent event, std::vector<BatchEvent>& events) {
    const auto it = running_.find(id);
    if (it != running_.end()) {
      const std::size_t g = it->second.region;
      for (llama_seq_id s : {seq_request(g), seq_staging(g)}) {
        llama_memory_seq_cp(mem_, s, seq_filler(g), -1, -1);
        llama_memory_seq_rm(mem_, s, -1, -1);
      }
      region_of_[g] = 0;
      running_.erase(it);
    }
    events.push_back(std::move(event));
  }

  Store* store_;
  std::size_t regions_;
  std::int64_t region_cells_;
  EngineShape shape_;
  bool save_chunk_caches_;
  std::vector<std::uint64_t> region_of_;  // per region: its request (0: free)
  std::deque<Queued> queued_;
  std::map<std::uint64_t, Running> running_;
  std::vector<std::uint64_t> cancelled_;
  std::uint64_t next_id_ = 1;
  std::int64_t last_step_tokens_ = 0;
  std::int64_t last_step_rows_ = 0;
  std::int64_t last_step_decodes_ = 0;
  std::int64_t saved_ = 0;
  std::int64_t put_failures_ = 0;
};

}  // namespace kvfuse::llamacpp
