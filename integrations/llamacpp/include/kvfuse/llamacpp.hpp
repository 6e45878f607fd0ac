#pragma once
// kvfuse on llama.cpp: LlamaCppFusion models FixedSetFusionBackend (kvfuse/fusion/fusion_backend.hpp) over
// llama.cpp's public C API, so that FusionPipeline runs full prefill, prefix caching, naive reuse (what
// llama.cpp's own --cache-reuse does: shift matching chunks into place, recompute nothing), Epic's AttnLink and
// Cache-Craft (its fixed set from the stored variants) inside llama.cpp itself. It also reports attention
// statistics over the prompt's chunks during a full prefill (AttentionStatisticsBackend), which is what
// FusionPipeline::record_context needs to profile Cache-Craft's variants (eq. 3-11, 14).
//
// What it is not: a PerLayerFusionBackend. llama_decode runs every layer of a batch for the same tokens, so
// neither CacheBlend's gradual filtering (S_l shrinking per layer, §4.3) nor Cache-Craft's focus termination
// (stopping the recompute of unfocused chunks after layer l*, §3.2.3) can be expressed; FusionPipeline refuses
// both for this backend with a named error.
//
// How the concept maps onto llama.cpp (one llama_context, kv_unified, swa_full, n_seq_max = 4 + 2 ·
// LlamaCppOptions::scratch_pairs):
//   - A stored block (KVBlock::bytes) is llama_state_seq_get_data of a sequence holding exactly the block's rows:
//     llama.cpp's own sequence-state format (cells with their positions, then each layer's K and V rows), one
//     state per piece of at most the model's sliding window (llama.cpp leaves out of a sequence's state the cells
//     its window no longer shows to the sequence's last position; within one window it keeps them all).
//   - load_rows checks the block without llama.cpp (LlamaCppContext::block_mismatch: its size, its pieces'
//     layout and positions), so that a bad block is reported when it is loaded, and keeps the bytes; shift_rows
//     moves it in its bytes (LlamaCppContext::shift_block: the cells' positions, K re-rotated with each layer's own
//     RoPE base). The block enters the cache only when the first run at or after its first row needs it (restored;
//     a block llama.cpp still refuses there, for want of free cells, is a named error), and joins the staging
//     sequence S. llama.cpp's own shift, llama_memory_seq_add, is the fallback for a model whose RoPE kvfuse does not
//     read: it re-rotates K of every cell of the cache on the next decode, so one per restored block is dear. Without
//     flash attention a decode attends over every cell up to the highest one in use (llama_kv_cache::get_n_kv), so
//     restoring lazily keeps each run's attention to the prompt so far rather than the whole prompt
//     (docs/llamacpp.md §8).
//   - llama_decode accepts, per sequence, only positions that continue it (the first new position must be
//     seq_pos_max + 1, with no gaps). So prefill(rows) walks the prompt left to right: for each maximal run
//     [a, b) of rows to recompute, the staged rows before a join the request's sequence R
//     (llama_memory_seq_cp + seq_rm), the stale copies of rows [a, b) are dropped, and tokens a .. b − 1 are
//     decoded in R at their positions. A token decoded at position p attends to R's cells at positions <= p:
//     the exact causal mask by position. One llama_decode per run (and per n_batch tokens): a decode is a pass
//     over the weights, so the engine reports that cost (LlamaCppOptions::run_cost_rows; 0, off, by default:
//     docs/llamacpp.md §5) and the planner merges runs closer than it (RunCostBackend, merge_runs).
//   - Every cell belongs to two sequences (R with its pin P, S with its pin Q, a scratch pair): a cell of one
//     sequence that a sliding-window layer masks may be overwritten by llama.cpp's slot search, and a cell of two
//     never is, so rows that a later run or save_rows still needs are never lost on Gemma 3's local layers.
//   - save_rows copies R's cells of rows r into a scratch sequence and saves that sequence's state; chunk_kv
//     decodes the chunk alone in a scratch pair at positions first, first + 1, ... and saves it. Neither touches
//     the request's sequences, so the pipeline may compute a chunk cache in the middle of assembling a request.
//   - The stored block format, the fingerprint and the decode plumbing are LlamaCppContext's
//     (llamacpp_context.hpp), shared with LlamaCppBatchEngine (llamacpp_batch.hpp).
//
// Also here, for a serving loop and the evaluation harness: greedy generation after the prompt, teacher-forced
// logits over given tokens, and truncation back to the prompt. Thread safety: none; one LlamaCppFusion (like one
// llama_context) is used by one thread at a time.

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include <fmt/format.h>
#include <llama.h>

#include "kvfuse/core/error.hpp"
#include "kvfuse/core/prompt.hpp"
#include "kvfuse/core/sampling.hpp"
#include "kvfuse/core/types.hpp"
#include "kvfuse/fusion/fusion_backend.hpp"
#include "kvfuse/fusion/layer_protocol.hpp"
#include "kvfuse/llamacpp_context.hpp"

namespace kvfuse::llamacpp {

class LlamaCppFusion : public LlamaCppContext {
 public:
  // Loads the GGUF with llama.cpp (mmap) and makes one context. Throws with the path and llama.cpp's refusal.
  explicit LlamaCppFusion(const std::filesystem::path& gguf, LlamaCppOptions options = {})
      : LlamaCppContext(gguf, options,
                        {kFirstScratch + 2 * options.scratch_pairs, 2,
                         options.attention_statistics ? &LlamaCppFusion::eval_callback : nullptr, this,
                         "LlamaCppFusion"}) {
    kvfuse::detail::require(options_.scratch_pairs >= 2, "LlamaCppFusion: scratch_pairs {} (need >= 2)",
                            options_.scratch_pairs);
    scratch_free_.assign(options_.scratch_pairs, true);
    enable_eval();
  }

  // ---- FixedSetFusionBackend (model_fingerprint, num_layers, block_bytes: LlamaCppContext's)
  KVBlock chunk_kv(std::span<const token_id> tokens, std::int64_t first) {
    kvfuse::detail::require(!tokens.empty() && first >= 0, "LlamaCppFusion::chunk_kv: {} tokens at position {}",
                            tokens.size(), first);
    const int slot = take_scratch("chunk_kv");
    const llama_seq_id x = scratch_seq(slot);
    decode_run(tokens, first, {x, x + 1}, false);
    const auto n = static_cast<std::int64_t>(tokens.size());
    KVBlock block{n, save_range(x, first, first + n), first};
    drop_scratch(slot);
    return block;
  }

  void begin(std::span<const token_id> tokens) {
    kvfuse::detail::require(!tokens.empty(), "LlamaCppFusion::begin: an empty prompt");
    kvfuse::detail::require(tokens.size() <= options_.n_ctx,
                            "LlamaCppFusion::begin: a {}-token prompt in a context of {} cells (LlamaCppOptions::n_ctx)",
                            tokens.size(), options_.n_ctx);
    for (token_id t : tokens)
      kvfuse::detail::require(t >= 0 && t < n_vocab_, "LlamaCppFusion::begin: token {} outside the vocabulary of {}",
                              t, n_vocab_);
    llama_memory_clear(mem_, true);
    tokens_.assign(tokens.begin(), tokens.end());
    staged_.assign(tokens.size(), false);
    attached_end_ = 0;
    shift_pending_ = false;
    last_rows_.clear();
    scratch_free_.assign(options_.scratch_pairs, true);
    deferred_.clear();
  }

  // Stored KV of rows r, rotated at positions block.first_position + (0 .. r.size() − 1): checked now, entered into
  // llama.cpp's cache when a run first needs it (see the header).
  void load_rows(TokenRange r, const KVBlock& block) {
    check_range(r, "load_rows");
    kvfuse::detail::require(block.num_tokens == r.size() && block.bytes.size() == block_bytes(r.size()),
                            "LlamaCppFusion::load_rows: a block of {} rows and {} bytes for rows {} ({} bytes)",
                            block.num_tokens, block.bytes.size(), r, block_bytes(r.size()));
    for (std::int64_t t = r.begin; t < r.end; ++t)
      kvfuse::detail::require(!staged_[static_cast<std::size_t>(t)] && t >= attached_end_,
                              "LlamaCppFusion::load_rows: row {} of rows {} is resident already", t, r);
    for (const Deferred& d : deferred_)
      kvfuse::detail::require(d.rows.end <= r.begin || r.end <= d.rows.begin,
                              "LlamaCppFusion::load_rows: rows {} overlap rows {}, loaded already", r, d.rows);
    if (const std::string why = block_mismatch(block.bytes, r.size(), block.first_position); !why.empty())
      throw error(fmt::format("LlamaCppFusion::load_rows: the stored block for rows {} {}", r, why));
    deferred_.push_back({r, block.bytes, block.first_position, block.first_position});
  }

  // RoPE-shift rows r (loaded, not yet at their positions) by delta: in the block's bytes where shift_block can
  // (then llama.cpp restores it at its new positions), else by llama.cpp when it is restored.
  void shift_rows(TokenRange r, std::int64_t delta) {
    check_range(r, "shift_rows");
    const auto it = std::find_if(deferred_.begin(), deferred_.end(),
                                 [&](const Deferred& d) { return d.rows == r && d.first != r.begin; });
    kvfuse::detail::require(it != deferred_.end(),
                            "LlamaCppFusion::shift_rows: rows {} are not a loaded block waiting for its positions",
                            r);
    const bool moved = shift_block(it->bytes, r.size(), it->stored_first, it->first + delta - it->stored_first);
    it->first += delta;
    if (moved) it->stored_first = it->first;
  }

  // Recomputes `rows` (ascending, holding the last row) over the resident KV, each at its position; the logits of
  // the last row.
  std::vector<float> prefill(const TokenSet& rows) { return prefill_impl(rows, nullptr); }

  // The resident KV of rows r (rows of the request's sequence), first_position = r.begin.
  [[nodiscard]] KVBlock save_rows(TokenRange r) const {
    auto& self = const_cast<LlamaCppFusion&>(*this);  // scratch sequences only: the request's KV is unchanged
    self.check_range(r, "save_rows");
    kvfuse::detail::require(r.end <= attached_end_ && !shift_pending_,
                            "LlamaCppFusion::save_rows: rows {} are not computed yet (rows [0, {}) are{})", r,
                            attached_end_, shift_pending_ ? "; a shift waits for the next prefill" : "");
    return {r.size(), self.save_range(kRequest, r.begin, r.end), r.begin};
  }

  // ---- AttentionStatisticsBackend: prefill(rows) of a request whose rows are all recomputed (a full prefill),
  // calling sink(l, LayerAttention over `groups`) after layer l, l = 0 .. L − 1. From llama.cpp's softmax
  // ("kq_soft_max" through the eval callback, the probabilities llama.cpp computes), summed over the heads.
  std::vector<float> prefill(const TokenSet& rows, const PromptLayout& groups,
                             const AttentionSink& sink) {
    kvfuse::detail::require(!options_.flash_attention && options_.attention_statistics,
                            "LlamaCppFusion: attention statistics read llama.cpp's softmax through its eval callback: "
                            "they need LlamaCppOptions::attention_statistics on and flash_attention off");
    const auto n = static_cast<std::int64_t>(tokens_.size());
    kvfuse::detail::require(static_cast<std::int64_t>(rows.size()) == n && attached_end_ == 0 &&
                                groups.num_tokens() == n,
                            "LlamaCppFusion: attention statistics need a full prefill of a new request over a layout of "
                            "its {} rows ({} rows, layout of {}, {} rows computed)",
                            n, rows.size(), groups.num_tokens(), attached_end_);
    groups.validate();
    Statistics stats;
    stats.groups = &groups;
    stats.num_groups = static_cast<std::int64_t>(groups.chunks.size()) + 1;
    stats.group_of.assign(static_cast<std::size_t>(n), stats.num_groups - 1);
    for (std::size_t j = 0; j < groups.chunks.size(); ++j)
      for (std::int64_t t = groups.chunks[j].range.begin; t < groups.chunks[j].range.end; ++t)
        stats.group_of[static_cast<std::size_t>(t)] = static_cast<std::int64_t>(j);
    stats.layers.resize(static_cast<std::size_t>(n_layer_));
    for (LayerAttention& a : stats.layers) {
      a.num_groups = stats.num_groups;
      a.mass.assign(static_cast<std::size_t>(n * stats.num_groups), 0.0f);
      a.self_mass.assign(static_cast<std::size_t>(n), 0.0f);
    }
    stats.rows_seen.assign(static_cast<std::size_t>(n_layer_), 0);
    std::vector<float> logits = prefill_impl(rows, &stats);
    for (std::int64_t l = 0; l < n_layer_; ++l) {
      kvfuse::detail::require(stats.rows_seen[static_cast<std::size_t>(l)] == n,
                              "LlamaCppFusion: llama.cpp's softmax of layer {} covered {} of {} rows", l,
                              stats.rows_seen[static_cast<std::size_t>(l)], n);
      sink(l, std::move(stats.layers[static_cast<std::size_t>(l)]));
    }
    return logits;
  }

  // ---- after a prefill: what a serving loop does next
  // Greedy tokens after the prompt (stops at eos or max_new_tokens), decoded in the request's sequence.
  std::vector<token_id> greedy(std::span<const float> last_logits, std::int64_t max_new_tokens, token_id eos) {
    check_logits(last_logits, "greedy");
    return greedy_tokens(last_logits, max_new_tokens, eos,
                         [&](token_id t) { return append(std::span<const token_id>(&t, 1), false).front(); });
  }

  // Teacher forcing: the distributions before each of `tokens` when they are fed after the prompt — the first
  // is last_logits, then one per token but the last (CpuLlama::forced_logits's contract).
  std::vector<std::vector<float>> forced_logits(std::span<const float> last_logits, std::span<const token_id> tokens) {
    check_logits(last_logits, "forced_logits");
    std::vector<std::vector<float>> out;
    if (tokens.empty()) return out;
    out.emplace_back(last_logits.begin(), last_logits.end());
    if (tokens.size() > 1) {
      std::vector<std::vector<float>> rest = append(tokens.first(tokens.size() - 1), true);
      for (auto& v : rest) out.push_back(std::move(v));
    }
    return out;
  }

  // Drops what greedy / forced_logits appended: the request's sequence holds the prompt again.
  void truncate_to_prompt() {
    const auto n = static_cast<llama_pos>(tokens_.size());
    llama_memory_seq_rm(mem_, kRequest, n, -1);
    llama_memory_seq_rm(mem_, kRequestPin, n, -1);
    attached_end_ = std::min<std::int64_t>(attached_end_, n);
  }

  // ---- inspection (tests)
  // The rows the last prefill decoded, in order.
  [[nodiscard]] const TokenSet& last_prefill_rows() const noexcept { return last_rows_; }
  // Cells of the request's sequence at positions [0, n) (llama.cpp's own count, from the size of its state, one
  // window at a time as save_range saves it).
  [[nodiscard]] std::int64_t request_cells() const {
    auto& self = const_cast<LlamaCppFusion&>(*this);  // a scratch sequence only
    const int slot = self.take_scratch("request_cells");
    const llama_seq_id y = scratch_seq(slot);
    std::int64_t cells = 0;
    for (std::int64_t p = 0; p < static_cast<std::int64_t>(tokens_.size()); p += window_) {
      const std::int64_t end = std::min(static_cast<std::int64_t>(tokens_.size()), p + window_);
      llama_memory_seq_cp(mem_, kRequest, y, static_cast<llama_pos>(p), static_cast<llama_pos>(end));
      const std::size_t size = llama_state_seq_get_size(ctx_.get(), y);
      llama_memory_seq_rm(mem_, y, -1, -1);
      if (size > state_empty_) cells += static_cast<std::int64_t>((size - state_base_) / state_per_row_);
    }
    self.release_scratch(slot);
    return cells;
  }
 private:
  // Sequence ids: the request R and its pin P, the staging sequence S and its pin Q, then scratch pairs.
  static constexpr llama_seq_id kRequest = 0, kRequestPin = 1, kStaging = 2, kStagingPin = 3, kFirstScratch = 4;

  struct Deferred {  // a loaded block not yet in llama.cpp's cache
    TokenRange rows{};
    std::vector<std::byte> bytes;      // llama.cpp's sequence state of the rows at stored_first, ...
    std::int64_t stored_first = 0;     // position of its first row in `bytes`
    std::int64_t first = 0;            // ... once shifted (rows.begin before prefill)
  };
  struct Statistics {
    const PromptLayout* groups = nullptr;
    std::int64_t num_groups = 0;
    std::vector<std::int64_t> group_of;     // per row
    std::vector<LayerAttention> layers;     // per layer, rows in order
    std::vector<std::int64_t> rows_seen;    // per layer: rows whose softmax was read
  };

  static constexpr llama_seq_id scratch_seq(int slot) noexcept { return kFirstScratch + 2 * slot; }

  int take_scratch(std::string_view who) {
    for (std::size_t i = 0; i < scratch_free_.size(); ++i)
      if (scratch_free_[i]) {
        scratch_free_[i] = false;
        return static_cast<int>(i);
      }
    throw error(fmt::format("LlamaCppFusion::{}: all {} scratch sequence pairs are in use "
                            "(LlamaCppOptions::scratch_pairs)",
                            who, scratch_free_.size()));
  }
  void release_scratch(int slot) noexcept { scratch_free_[static_cast<std::size_t>(slot)] = true; }
  void drop_scratch(int slot) noexcept {
    llama_memory_seq_rm(mem_, scratch_seq(slot), -1, -1);
    llama_memory_seq_rm(mem_, scratch_seq(slot) + 1, -1, -1);
    release_scratch(slot);
  }

  // The block `bytes` of rows r, stored at positions first .. first + r.size() − 1, into scratch sequence `slot` and
  // its pin. Piece by piece (save_range): each restored into a scratch pair of its own, then joined to the slot's
  // pair, so that every cell belongs to two sequences whenever llama.cpp searches for free cells. Throws, the slot
  // dropped, when llama.cpp refuses a piece (not a state of this model and build, or no free cells) or the state
  // holds other positions.
  void restore(int slot, TokenRange r, std::span<const std::byte> bytes, std::int64_t first) {
    const llama_seq_id x = scratch_seq(slot);
    std::size_t at = 0;
    for (std::int64_t done = 0; done < r.size(); done += window_) {
      const std::size_t size = block_bytes(std::min(window_, r.size() - done));
      const int piece = take_scratch("prefill");
      const llama_seq_id y = scratch_seq(piece);
      const std::size_t read = llama_state_seq_set_data(
          ctx_.get(), reinterpret_cast<const std::uint8_t*>(bytes.data()) + at, size, y);
      if (read == size) {
        llama_memory_seq_cp(mem_, y, y + 1, -1, -1);
        llama_memory_seq_cp(mem_, y, x, -1, -1);
        llama_memory_seq_cp(mem_, y, x + 1, -1, -1);
      }
      drop_scratch(piece);
      if (read != size) {
        drop_scratch(slot);
        throw error(fmt::format("LlamaCppFusion::prefill: llama.cpp refused the stored block for rows {} ({} of {} "
                                "bytes of the piece at byte {} read): not a sequence state of this model and build, "
                                "or no free cells in a context of {} (LlamaCppOptions::n_ctx)",
                                r, read, size, at, options_.n_ctx));
      }
      at += size;
    }
    const llama_pos lo = llama_memory_seq_pos_min(mem_, x), hi = llama_memory_seq_pos_max(mem_, x);
    if (lo != first || hi != first + r.size() - 1) {
      drop_scratch(slot);
      throw error(fmt::format("LlamaCppFusion::prefill: the stored block for rows {} holds positions [{}, {}], not "
                              "[{}, {}]",
                              r, lo, hi, first, first + r.size() - 1));
    }
  }

  // Every loaded block whose first row is before `end` enters the cache at its own positions and joins the staging
  // sequence (a block shift_block could not move is moved by llama.cpp here, its K rotated on the next decode).
  void restore_before(std::int64_t end) {
    while (!deferred_.empty() && deferred_.front().rows.begin < end) {
      const Deferred& d = deferred_.front();
      const int slot = take_scratch("prefill");
      restore(slot, d.rows, d.bytes, d.stored_first);
      const llama_seq_id x = scratch_seq(slot);
      if (d.first != d.stored_first) {
        llama_memory_seq_add(mem_, x, static_cast<llama_pos>(d.stored_first),
                             static_cast<llama_pos>(d.stored_first + d.rows.size()),
                             static_cast<llama_pos>(d.first - d.stored_first));
        shift_pending_ = true;  // llama.cpp rotates K on the next decode
      }
      llama_memory_seq_cp(mem_, x, kStaging, -1, -1);
      llama_memory_seq_cp(mem_, x, kStagingPin, -1, -1);
      std::fill(staged_.begin() + d.rows.begin, staged_.begin() + d.rows.end, true);
      drop_scratch(slot);
      deferred_.erase(deferred_.begin());
    }
  }

  // Staged rows [lo, hi) join the request's sequence.
  void attach(std::int64_t lo, std::int64_t hi) {
    if (lo >= hi) return;
    for (std::int64_t t = lo; t < hi; ++t)
      kvfuse::detail::require(staged_[static_cast<std::size_t>(t)],
                              "LlamaCppFusion::prefill: row {} is neither recomputed nor loaded", t);
    const auto a = static_cast<llama_pos>(lo), b = static_cast<llama_pos>(hi);
    llama_memory_seq_cp(mem_, kStaging, kRequest, a, b);
    llama_memory_seq_cp(mem_, kStaging, kRequestPin, a, b);
    llama_memory_seq_rm(mem_, kStaging, a, b);
    llama_memory_seq_rm(mem_, kStagingPin, a, b);
    std::fill(staged_.begin() + lo, staged_.begin() + hi, false);
  }

  // Rows of the request's sequence at positions >= lo go back to staging (a second prefill of the request).
  void detach_from(std::int64_t lo) {
    if (lo >= attached_end_) return;
    const auto a = static_cast<llama_pos>(lo);
    llama_memory_seq_cp(mem_, kRequest, kStaging, a, -1);
    llama_memory_seq_cp(mem_, kRequest, kStagingPin, a, -1);
    llama_memory_seq_rm(mem_, kRequest, a, -1);
    llama_memory_seq_rm(mem_, kRequestPin, a, -1);
    std::fill(staged_.begin() + lo, staged_.begin() + attached_end_, true);
    attached_end_ = lo;
  }

  std::vector<float> prefill_impl(const TokenSet& rows, Statistics* stats) {
    const auto n = static_cast<std::int64_t>(tokens_.size());
    kvfuse::detail::require(!rows.empty() && rows.back() == n - 1,
                            "LlamaCppFusion::prefill: the rows must hold the last row {} (got {} rows{})", n - 1,
                            rows.size(), rows.empty() ? "" : fmt::format(", last {}", rows.back()));
    for (std::size_t i = 0; i < rows.size(); ++i)
      kvfuse::detail::require(rows[i] >= 0 && (i == 0 || rows[i] > rows[i - 1]),
                              "LlamaCppFusion::prefill: rows must ascend from >= 0 (row {} at {})", rows[i], i);
    for (const Deferred& d : deferred_)
      kvfuse::detail::require(d.first == d.rows.begin,
                              "LlamaCppFusion::prefill: rows {} were loaded at position {} and not shifted to their own",
                              d.rows, d.first);
    std::sort(deferred_.begin(), deferred_.end(),
              [](const Deferred& x, const Deferred& y) { return x.rows.begin < y.rows.begin; });
    detach_from(rows.front());
    last_rows_ = rows;
    stats_ = stats;
    std::vector<float> logits;
    try {
      std::size_t i = 0;
      while (i < rows.size()) {
        std::size_t j = i + 1;
        while (j < rows.size() && rows[j] == rows[j - 1] + 1) ++j;
        const std::int64_t a = rows[i], b = rows[j - 1] + 1;
        restore_before(b);
        attach(attached_end_, a);
        const auto pa = static_cast<llama_pos>(a), pb = static_cast<llama_pos>(b);
        llama_memory_seq_rm(mem_, kStaging, pa, pb);  // stale copies of the rows about to be recomputed
        llama_memory_seq_rm(mem_, kStagingPin, pa, pb);
        std::fill(staged_.begin() + a, staged_.begin() + b, false);
        logits = decode_run(std::span<const token_id>(tokens_).subspan(static_cast<std::size_t>(a),
                                                                         static_cast<std::size_t>(b - a)),
                            a, {kRequest, kRequestPin}, b == n);
        attached_end_ = b;
        i = j;
      }
    } catch (...) {
      stats_ = nullptr;
      throw;
    }
    stats_ = nullptr;
    return logits;
  }

  // Decodes tokens at positions first, first + 1, ... in the sequences `seqs` (n_batch at a time); the logits of
  // the last token when `want_last`.
  std::vector<float> decode_run(std::span<const token_id> tokens, std::int64_t first,
                                std::initializer_list<llama_seq_id> seqs, bool want_last) {
    std::vector<float> logits;
    for (std::size_t done = 0; done < tokens.size();) {
      const std::size_t m = std::min<std::size_t>(options_.n_batch, tokens.size() - done);
      fill_batch(tokens.subspan(done, m), first + static_cast<std::int64_t>(done), seqs, false);
      const bool last = done + m == tokens.size();
      if (last && want_last) batch_.logits[m - 1] = 1;
      decode("prefill", first + static_cast<std::int64_t>(done), m);
      if (last && want_last) {
        const float* z = llama_get_logits_ith(ctx_.get(), static_cast<std::int32_t>(m - 1));
        logits.assign(z, z + n_vocab_);
      }
      done += m;
    }
    return logits;
  }

  // Tokens appended to the request's sequence after what it holds; the logits of every token when `all`, else of
  // the last.
  std::vector<std::vector<float>> append(std::span<const token_id> tokens, bool all) {
    std::vector<std::vector<float>> out;
    const llama_pos next = llama_memory_seq_pos_max(mem_, kRequest) + 1;
    for (std::size_t done = 0; done < tokens.size();) {
      const std::size_t m = std::min<std::size_t>(options_.n_batch, tokens.size() - done);
      fill_batch(tokens.subspan(done, m), next + static_cast<std::int64_t>(done), {kRequest, kRequestPin}, all);
      if (!all && done + m == tokens.size()) batch_.logits[m - 1] = 1;
      decode("append", next + static_cast<std::int64_t>(done), m);
      for (std::size_t i = 0; i < m; ++i) {
        if (!all && i + 1 < m) continue;
        if (!all && done + m != tokens.size()) continue;
        const float* z = llama_get_logits_ith(ctx_.get(), static_cast<std::int32_t>(i));
        out.emplace_back(z, z + n_vocab_);
      }
      done += m;
    }
    return out;
  }

  void decode(std::string_view what, std::int64_t first, std::size_t m) {
    LlamaCppContext::decode(what, first, m);
    shift_pending_ = false;
  }

  // The block of rows at positions [lo, hi) of sequence `seq`: llama.cpp's state of a scratch sequence holding
  // them, one piece of at most window_ rows at a time. llama.cpp leaves out of a sequence's state the cells its
  // sliding-window layers no longer show to the sequence's last position; within one window none is left out, so
  // every piece is whole on every layer (a row recomputed inside a long chunk still finds the rows before it).
  std::vector<std::byte> save_range(llama_seq_id seq, std::int64_t lo, std::int64_t hi) {
    std::vector<std::byte> bytes;
    const int slot = take_scratch("save");
    const llama_seq_id y = scratch_seq(slot);
    for (std::int64_t p = lo; p < hi; p += window_) {
      const std::int64_t end = std::min(hi, p + window_);
      llama_memory_seq_cp(mem_, seq, y, static_cast<llama_pos>(p), static_cast<llama_pos>(end));
      const std::vector<std::byte> piece = save_sequence(y);
      llama_memory_seq_rm(mem_, y, -1, -1);
      kvfuse::detail::require(piece.size() == block_bytes(end - p),
                              "LlamaCppFusion: llama.cpp's state of rows [{}, {}) is {} bytes, not {}", p, end,
                              piece.size(), block_bytes(end - p));
      bytes.insert(bytes.end(), piece.begin(), piece.end());
    }
    release_scratch(slot);
    return bytes;
  }

  void check_range(TokenRange r, std::string_view who) const {
    kvfuse::detail::require(r.begin >= 0 && r.begin < r.end && r.end <= static_cast<std::int64_t>(tokens_.size()),
                            "LlamaCppFusion::{}: rows {} outside the {}-token prompt", who, r, tokens_.size());
  }
  // llama.cpp's eval callback: during an attention-statistics prefill, reads each layer's softmax
  // ("kq_soft_max-<layer>", [n_kv][n_tokens][n_head], cells in position order in a new request's cache).
  static bool eval_callback(ggml_tensor* t, bool ask, void* user) {
    auto* self = static_cast<LlamaCppFusion*>(user);
    if (self->stats_ == nullptr) return !ask;  // asked: not wanted; computed: go on
    const std::string_view name = ggml_get_name(t);
    constexpr std::string_view prefix = "kq_soft_max-";
    if (name.substr(0, prefix.size()) != prefix) return !ask;
    if (ask) return true;
    self->read_softmax(t, std::stoll(std::string(name.substr(prefix.size()))));
    return true;
  }

  void read_softmax(const ggml_tensor* t, std::int64_t layer) {
    Statistics& s = *stats_;
    kvfuse::detail::require(t->type == GGML_TYPE_F32 && layer >= 0 && layer < n_layer_ && ggml_is_contiguous(t),
                            "LlamaCppFusion: unexpected softmax tensor for layer {}", layer);
    const std::int64_t n_kv = t->ne[0], n_tok = t->ne[1], n_head = t->ne[2] * t->ne[3];
    const auto* p = static_cast<const float*>(t->data);
    LayerAttention& a = s.layers[static_cast<std::size_t>(layer)];
    // Rows of this graph: the batch's tokens in order, after the rows already read for this layer.
    const std::int64_t row0 = s.rows_seen[static_cast<std::size_t>(layer)];
    const auto n = static_cast<std::int64_t>(s.group_of.size());
    for (std::int64_t h = 0; h < n_head; ++h)
      for (std::int64_t i = 0; i < n_tok; ++i) {
        const std::int64_t row = row0 + i;
        if (row >= n) break;
        const float* w = p + (h * n_tok + i) * n_kv;
        float* mass = a.mass.data() + row * s.num_groups;
        for (std::int64_t c = 0; c < std::min(n_kv, row + 1); ++c) mass[s.group_of[static_cast<std::size_t>(c)]] += w[c];
        a.self_mass[static_cast<std::size_t>(row)] += w[row];
      }
    s.rows_seen[static_cast<std::size_t>(layer)] += n_tok;
  }

  std::vector<token_id> tokens_;
  std::vector<bool> staged_;        // per row: in the staging sequence
  std::int64_t attached_end_ = 0;   // the request's sequence holds rows [0, attached_end_)
  bool shift_pending_ = false;      // a shift llama.cpp applies on the next decode
  std::vector<bool> scratch_free_;
  std::vector<Deferred> deferred_;  // loaded blocks not yet in the cache; by first row once prefill began
  TokenSet last_rows_;
  Statistics* stats_ = nullptr;
};

static_assert(FixedSetFusionBackend<LlamaCppFusion>);
static_assert(!PerLayerFusionBackend<LlamaCppFusion>);
static_assert(AttentionStatisticsBackend<LlamaCppFusion>);
static_assert(RunCostBackend<LlamaCppFusion>);

}  // namespace kvfuse::llamacpp
