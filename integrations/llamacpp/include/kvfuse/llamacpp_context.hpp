#pragma once
// LlamaCppContext: what kvfuse's llama.cpp engines share — the model and one llama_context, the stored block format
// (llama.cpp's sequence state, measured once), the fingerprint that keys it, and the batch and decode plumbing.
// LlamaCppFusion (llamacpp.hpp, one request at a time) and LlamaCppBatchEngine (llamacpp_batch.hpp, several
// requests per llama_decode) both build on it, so a block either stores the other reads.
//
// model_fingerprint() hashes every byte of the GGUF file together with what fixes the state layout (which
// llama.cpp source: KVFUSE_LLAMACPP_SOURCE_ID, set by the build to its sha256; the KV cache type, V transposed or
// not, swa_full, the measured state size): KV never crosses models, llama.cpp builds or layouts. The number of
// sequences and cells of the context do not enter the stored bytes (a sequence's state names one sequence).

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <initializer_list>
#include <limits>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <thread>
#include <utility>
#include <vector>

#include <fmt/format.h>
#include <llama.h>

#include "kvfuse/backend/cpu/llama_config.hpp"
#include "kvfuse/core/error.hpp"
#include "kvfuse/core/hash.hpp"
#include "kvfuse/core/types.hpp"
#include "kvfuse/detail/llamacpp_state.hpp"

#ifndef KVFUSE_LLAMACPP_SOURCE_ID
#error "KVFUSE_LLAMACPP_SOURCE_ID names the llama.cpp source this is built against (the kvfuse::llamacpp target sets it)"
#endif

namespace kvfuse::llamacpp {

struct LlamaCppOptions {
  int threads = 0;                // llama.cpp's n_threads and n_threads_batch; 0: the hardware's cores
  std::uint32_t n_ctx = 8192;     // KV cells: the prompt, the rows being recomputed, a chunk cache, the answer
  std::uint32_t n_batch = 512;    // tokens per llama_decode
  std::uint32_t n_ubatch = 512;   // tokens per graph
  // Scratch sequence pairs of LlamaCppFusion, for the blocks being read (two at once), saved or computed.
  std::uint32_t scratch_pairs = 4;
  ggml_type kv_type = GGML_TYPE_F16;  // K and V cache type (part of the fingerprint: it changes the stored bytes)
  // llama.cpp's flash attention. Off by default: the attention statistics (record_context) read the softmax
  // llama.cpp computes without it; with it on they are refused with a named error.
  bool flash_attention = false;
  // Install llama.cpp's eval callback, which the attention statistics need (record_context: Cache-Craft's
  // variants, prefix-cache entries). It has a price on every decode: with it, llama.cpp decoded one Gemma 3 token
  // in 2.4 s instead of 0.03 s here. Off: the statistics are refused with a named error.
  bool attention_statistics = true;
  bool quiet = true;  // silence llama.cpp's log below errors
  // What one more llama_decode costs beyond its rows, in rows (RunCostBackend, fusion_backend.hpp): a fixed set's
  // runs of adjacent rows closer than this are recomputed in one decode. Off (0) by default: on 2 cores a decode's
  // own cost was 1.6–4.6 rows' time (SmolLM2, Gemma 3; kvfuse-bench-prefill --decode-cost), yet merging at 2 and 4
  // made SmolLM2's Cache-Craft slower end to end, its recomputed rows costing more than the decodes they saved
  // (docs/llamacpp.md §5). An engine whose decode is a dear pass over large weights sets it.
  std::int64_t run_cost_rows = 0;
};

namespace detail {

// XXH3 over every byte of a file (kvfuse/core/hash.hpp), read in 1 MiB blocks.
[[nodiscard]] inline std::uint64_t file_hash(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  kvfuse::detail::require(in.good(), "LlamaCppContext: cannot open '{}'", path.string());
  std::vector<char> buf(std::size_t{1} << 20);
  Xxh3Stream h;
  while (in) {
    in.read(buf.data(), static_cast<std::streamsize>(buf.size()));
    const auto got = static_cast<std::size_t>(in.gcount());
    h.update(std::as_bytes(std::span(buf.data(), got)));
  }
  kvfuse::detail::require(in.eof(), "LlamaCppContext: reading '{}' failed", path.string());
  return h.digest();
}

inline void quiet_log(ggml_log_level level, const char* text, void*) {
  if (level == GGML_LOG_LEVEL_ERROR) std::fputs(text, stderr);
}

}  // namespace detail

// The context an engine is made with: its sequences, tokens per batch entry, eval callback, and its name in errors.
struct ContextShape {
  std::uint32_t n_seq_max = 1;
  std::int32_t seqs_per_token = 1;
  ggml_backend_sched_eval_callback eval = nullptr;
  void* eval_user = nullptr;
  std::string_view who = "LlamaCppContext";
};

class LlamaCppContext {
 public:
  // Loads the GGUF with llama.cpp (mmap) and makes one context. Throws with the path and llama.cpp's refusal.
  LlamaCppContext(const std::filesystem::path& gguf, LlamaCppOptions options, ContextShape shape)
      : options_(options), who_(shape.who) {
    kvfuse::detail::require(options_.n_batch >= 1 && options_.n_ubatch >= 1 && options_.n_ctx >= 16,
                            "{}: n_batch {}, n_ubatch {}, n_ctx {} (need >= 1, >= 1, >= 16)", who_, options_.n_batch,
                            options_.n_ubatch, options_.n_ctx);
    kvfuse::detail::require(options_.run_cost_rows >= 0, "{}: run_cost_rows {} (need >= 0)", who_,
                            options_.run_cost_rows);
    if (options_.quiet) llama_log_set(detail::quiet_log, nullptr);
    llama_backend_init();
    llama_model_params mp = llama_model_default_params();
    model_.reset(llama_model_load_from_file(gguf.string().c_str(), mp));
    kvfuse::detail::require(model_ != nullptr, "{}: llama.cpp cannot load '{}'", who_, gguf.string());
    vocab_ = llama_model_get_vocab(model_.get());
    n_vocab_ = llama_vocab_n_tokens(vocab_);
    n_layer_ = llama_model_n_layer(model_.get());

    llama_context_params cp = llama_context_default_params();
    const int threads = options_.threads > 0 ? options_.threads
                                             : static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
    cp.n_ctx = options_.n_ctx;
    cp.n_batch = options_.n_batch;
    cp.n_ubatch = options_.n_ubatch;
    cp.n_seq_max = shape.n_seq_max;
    cp.n_threads = threads;
    cp.n_threads_batch = threads;
    cp.type_k = options_.kv_type;
    cp.type_v = options_.kv_type;
    cp.flash_attn_type = options_.flash_attention ? LLAMA_FLASH_ATTN_TYPE_ENABLED : LLAMA_FLASH_ATTN_TYPE_DISABLED;
    cp.swa_full = true;
    cp.kv_unified = true;
    cp.no_perf = true;
    if (shape.eval != nullptr) {  // through forward_eval: off until the engine is made (enable_eval)
      eval_ = shape.eval;
      eval_user_ = shape.eval_user;
      cp.cb_eval = &LlamaCppContext::forward_eval;
      cp.cb_eval_user_data = this;
    }
    ctx_.reset(llama_init_from_model(model_.get(), cp));
    kvfuse::detail::require(ctx_ != nullptr, "{}: llama.cpp cannot make a context for '{}' ({} cells, {} sequences)",
                            who_, gguf.string(), options_.n_ctx, shape.n_seq_max);
    mem_ = llama_get_memory(ctx_.get());
    kvfuse::detail::require(llama_memory_can_shift(mem_),
                            "{}: llama.cpp cannot shift the KV of '{}' (M-RoPE or a per-layer RoPE size): "
                            "position-independent reuse needs it",
                            who_, gguf.string());
    threads_ = threads;
    const std::int32_t swa = llama_model_n_swa(model_.get());
    window_ = swa > 0 ? swa : std::numeric_limits<llama_pos>::max();  // no window: one piece (positions are int32)
    batch_ = llama_batch_init(static_cast<std::int32_t>(options_.n_batch), 0, shape.seqs_per_token);

    measure_block_layout();
    prepare_block_shift(gguf);
    const std::uint64_t layout[] = {static_cast<std::uint64_t>(options_.kv_type),
                                    options_.flash_attention ? 1u : 0u,  // V transposed in the state without it
                                    1u /* swa_full */, state_base_, state_per_row_};
    fingerprint_ = xxh3(std::as_bytes(std::span(layout)),
                        xxh3(std::as_bytes(std::span(std::string_view(KVFUSE_LLAMACPP_SOURCE_ID))),
                             detail::file_hash(gguf)));
  }

  LlamaCppContext(const LlamaCppContext&) = delete;
  LlamaCppContext& operator=(const LlamaCppContext&) = delete;
  ~LlamaCppContext() { llama_batch_free(batch_); }

  [[nodiscard]] std::uint64_t model_fingerprint() const noexcept { return fingerprint_; }
  [[nodiscard]] std::int64_t num_layers() const noexcept { return n_layer_; }
  // A block is llama.cpp's sequence state of its rows, one state per piece of at most the sliding window's rows:
  // per piece a fixed header, and the same bytes per cell (both measured once).
  [[nodiscard]] std::size_t block_bytes(std::int64_t n) const noexcept {
    const auto pieces = static_cast<std::size_t>(n <= 0 ? 0 : (n - 1) / window_ + 1);
    return pieces * state_base_ + static_cast<std::size_t>(n) * state_per_row_;
  }
  // Why `bytes` cannot be a stored block of n rows at positions first .. first + n − 1 for this context (empty when
  // it can): each piece read without llama.cpp (detail/llamacpp_state.hpp) — its size, magic, the cache and layer
  // types and sizes measured at construction, every cache's cells holding each of the piece's positions once (in
  // any order: llama.cpp writes cells in the order of the cache, and a fragmented cache may hold a sequence's
  // positions out of order). What it leaves to the restore: free cells.
  [[nodiscard]] std::string block_mismatch(std::span<const std::byte> bytes, std::int64_t n, std::int64_t first) const {
    std::vector<detail::SequenceStateShape> pieces;
    return read_block(bytes, n, first, pieces);
  }
  // Whether shift_block moves blocks: kvfuse reads this model's RoPE (LlamaConfig of the same GGUF), the cache is
  // f16 or f32, and a block moved by it matched llama.cpp's own computation at the new positions at construction.
  [[nodiscard]] bool shifts_blocks() const noexcept { return rope_.has_value(); }
  // Moves a stored block of n rows at positions first, ... by delta positions in its bytes, piece by piece
  // (detail::move_sequence_state): restored, it sits at its new positions with K rotated there. llama.cpp's own
  // shift (llama_memory_seq_add) rotates K of every cell of the cache on every layer on the next decode, whatever
  // it moved; this touches the block's rows alone. False, the bytes unchanged, when !shifts_blocks(); throws, the
  // bytes unchanged, when block_mismatch has a reason.
  bool shift_block(std::span<std::byte> bytes, std::int64_t n, std::int64_t first, std::int64_t delta) const {
    if (!rope_) return false;
    std::vector<detail::SequenceStateShape> pieces;
    if (const std::string why = read_block(bytes, n, first, pieces); !why.empty())
      throw error(fmt::format("{}::shift_block: the block for positions [{}, {}] {}", who_, first, first + n - 1, why));
    std::size_t at = 0;
    for (std::size_t k = 0; k < pieces.size(); ++k) {
      const std::size_t size = block_bytes(std::min(window_, n - static_cast<std::int64_t>(k) * window_));
      detail::move_sequence_state(bytes.subspan(at, size), pieces[k], *rope_, delta);
      at += size;
    }
    return true;
  }
  // Rows per stored piece: the model's sliding window (2^31 − 1 without one).
  [[nodiscard]] std::int64_t window() const noexcept { return window_; }
  [[nodiscard]] llama_context* context() const noexcept { return ctx_.get(); }
  [[nodiscard]] int threads() const noexcept { return threads_; }
  [[nodiscard]] std::int64_t run_cost_rows() const noexcept { return options_.run_cost_rows; }
  [[nodiscard]] std::int64_t vocab_size() const noexcept { return n_vocab_; }

 protected:
  struct ModelDeleter {
    void operator()(llama_model* m) const noexcept { llama_model_free(m); }
  };
  struct ContextDeleter {
    void operator()(llama_context* c) const noexcept { llama_free(c); }
  };

  // Entry i of the batch: token, position, sequences; its logits kept when `logits`.
  void set_token(std::size_t i, token_id token, std::int64_t pos, std::span<const llama_seq_id> seqs, bool logits) {
    batch_.token[i] = token;
    batch_.pos[i] = static_cast<llama_pos>(pos);
    batch_.n_seq_id[i] = static_cast<std::int32_t>(seqs.size());
    std::copy(seqs.begin(), seqs.end(), batch_.seq_id[i]);
    batch_.logits[i] = logits ? 1 : 0;
  }

  void fill_batch(std::span<const token_id> tokens, std::int64_t first, std::initializer_list<llama_seq_id> seqs,
                  bool logits_all) {
    batch_.n_tokens = static_cast<std::int32_t>(tokens.size());
    for (std::size_t i = 0; i < tokens.size(); ++i)
      set_token(i, tokens[i], first + static_cast<std::int64_t>(i), std::span(seqs.begin(), seqs.size()), logits_all);
  }

  // llama_decode of the batch; a named error for no room (1) or a failure.
  void decode(std::string_view what, std::int64_t first, std::size_t m) {
    const std::int32_t rc = llama_decode(ctx_.get(), batch_);
    if (rc == 1)
      throw error(fmt::format("{}::{}: no room for {} tokens at position {} in a context of {} cells "
                              "(LlamaCppOptions::n_ctx)",
                              who_, what, m, first, options_.n_ctx));
    kvfuse::detail::require(rc == 0, "{}::{}: llama_decode of {} tokens at position {} failed ({})", who_, what, m,
                            first, rc);
  }

  [[nodiscard]] std::vector<float> logits_of(std::int32_t i) const {
    const float* z = llama_get_logits_ith(ctx_.get(), i);
    return {z, z + n_vocab_};
  }

  std::vector<std::byte> save_sequence(llama_seq_id seq) {
    std::vector<std::byte> bytes(llama_state_seq_get_size(ctx_.get(), seq));
    const std::size_t wrote =
        llama_state_seq_get_data(ctx_.get(), reinterpret_cast<std::uint8_t*>(bytes.data()), bytes.size(), seq);
    kvfuse::detail::require(wrote == bytes.size() && !bytes.empty(),
                            "{}: llama.cpp saved {} of {} bytes of a sequence state", who_, wrote, bytes.size());
    return bytes;
  }

  void check_logits(std::span<const float> logits, std::string_view what) const {
    kvfuse::detail::require(static_cast<std::int64_t>(logits.size()) == n_vocab_,
                            "{}::{}: {} logits for a vocabulary of {}", who_, what, logits.size(), n_vocab_);
  }

  // The engine's eval callback sees the graphs from here on (not the measuring decodes of the constructor).
  void enable_eval() noexcept { eval_on_ = eval_ != nullptr; }

  LlamaCppOptions options_;
  std::string who_;
  std::unique_ptr<llama_model, ModelDeleter> model_;
  std::unique_ptr<llama_context, ContextDeleter> ctx_;
  llama_memory_t mem_ = nullptr;
  const llama_vocab* vocab_ = nullptr;
  std::int32_t n_vocab_ = 0;
  std::int64_t n_layer_ = 0;
  int threads_ = 0;
  llama_batch batch_{};
  std::uint64_t fingerprint_ = 0;
  std::size_t state_empty_ = 0, state_base_ = 0, state_per_row_ = 0;
  std::uint32_t state_magic_ = 0;                         // of every sequence state of this build
  std::vector<std::vector<std::uint64_t>> state_layouts_;  // per cache: its layers' types and sizes (block_mismatch)
  std::int64_t window_ = 0;  // rows per stored piece: the sliding window (no limit without one)
  std::optional<detail::StateRope> rope_;  // how shift_block rotates K; none: llama.cpp shifts

 private:
  static bool forward_eval(ggml_tensor* t, bool ask, void* user) {
    auto* self = static_cast<LlamaCppContext*>(user);
    if (!self->eval_on_) return !ask;  // asked: not wanted; computed: go on
    return self->eval_(t, ask, self->eval_user_);
  }

  ggml_backend_sched_eval_callback eval_ = nullptr;
  void* eval_user_ = nullptr;
  bool eval_on_ = false;

  // block_bytes(n) = base + n · per_row for n <= window_, from the state sizes of one and two tokens decoded in
  // sequence 0 (a state names its one sequence in every cell, however many share the cell). The two-token state
  // must read as two cells at positions 0 and 1 in every cache, or this build's layout is not the one kvfuse reads.
  void measure_block_layout() {
    state_empty_ = llama_state_seq_get_size(ctx_.get(), 0);
    const token_id t[2] = {0, 0};
    fill_batch(std::span<const token_id>(t, 1), 0, {0}, false);
    decode("measure", 0, 1);
    const std::size_t one = llama_state_seq_get_size(ctx_.get(), 0);
    fill_batch(std::span<const token_id>(t + 1, 1), 1, {0}, false);
    decode("measure", 1, 1);
    const std::size_t two = llama_state_seq_get_size(ctx_.get(), 0);
    kvfuse::detail::require(two > one && one > state_empty_,
                            "{}: llama.cpp's sequence state does not grow with its cells ({}, {}, {} bytes)", who_,
                            state_empty_, one, two);
    state_per_row_ = two - one;
    state_base_ = one - state_per_row_;
    const std::vector<std::byte> probe = save_sequence(0);
    detail::SequenceStateShape shape;
    std::string why = detail::read_sequence_state(probe, shape);
    for (const detail::CacheState& cache : shape.caches)
      if (why.empty() && cache.positions != std::vector<std::int32_t>{0, 1})
        why = fmt::format("holds {} cells in a cache, not positions 0 and 1", cache.positions.size());
    kvfuse::detail::require(why.empty(),
                            "{}: llama.cpp's sequence state of two tokens is not the layout kvfuse reads "
                            "(detail/llamacpp_state.hpp): it {}",
                            who_, why);
    state_magic_ = shape.magic;
    for (detail::CacheState& cache : shape.caches) state_layouts_.push_back(std::move(cache.layout));
    llama_memory_clear(mem_, true);
  }

  // shift_block's RoPE, where kvfuse can rotate this model's K: LlamaConfig reads the GGUF (which layers are local,
  // each layer's base, linear scaling and frequency factors), llama.cpp's RoPE type is that pairing, the cache is f16 or f32, and its states hold the
  // global layers' cache then the local layers' (llama.cpp's iSWA order) with K rows of n_head_kv · head_dim.
  // Then the check: token 0 decoded alone at position 0, its state moved by kShiftProbe, against token 0 decoded
  // at kShiftProbe by llama.cpp (a lone token attends only to itself, so its K differs by the rotation alone).
  // Anything else leaves rope_ empty: llama.cpp shifts.
  void prepare_block_shift(const std::filesystem::path& gguf) {
    if (options_.kv_type != GGML_TYPE_F16 && options_.kv_type != GGML_TYPE_F32) return;
    std::optional<LlamaConfig> config;
    try {
      config = LlamaConfig::from_gguf(GGUFFile::open(gguf));
    } catch (const std::exception&) {
      return;  // an architecture or RoPE kvfuse's CPU backend does not read
    }
    const llama_rope_type type = llama_model_rope_type(model_.get());
    if (!(type == LLAMA_ROPE_TYPE_NORM && config->rope_pairing == RopePairing::interleaved) &&
        !(type == LLAMA_ROPE_TYPE_NEOX && config->rope_pairing == RopePairing::half_split))
      return;
    std::vector<std::vector<std::int64_t>> layers(state_layouts_.size());
    for (std::int64_t l = 0; l < config->n_layer; ++l) {
      if (layers.size() == 1) layers[0].push_back(l);
      else if (layers.size() == 2) layers[config->is_local(l) ? 1 : 0].push_back(l);
    }
    detail::StateRope rope{options_.kv_type, config->n_head_kv, config->head_dim, config->rope_pairing, {}};
    const std::uint64_t row = ggml_row_size(options_.kv_type, config->n_head_kv * config->head_dim);
    for (std::size_t c = 0; c < layers.size(); ++c) {
      const std::vector<std::uint64_t>& layout = state_layouts_[c];
      if (layout.size() < 2 || layout[1] != layers[c].size() || layers[c].empty()) return;
      std::vector<detail::LayerRope>& ropes = rope.layers.emplace_back();
      for (std::size_t j = 0; j < layers[c].size(); ++j) {
        if (layout[2 + 2 * j] != static_cast<std::uint64_t>(options_.kv_type) || layout[3 + 2 * j] != row) return;
        const RopeFrequencyConfig f = config->rope_frequency_config(layers[c][j]);
        if (f.scaling == RopeScaling::llama3) return;
        detail::LayerRope& r = ropes.emplace_back();
        r.base = static_cast<float>(f.base);
        r.freq_scale = f.scaling == RopeScaling::linear ? static_cast<float>(1.0 / f.factor) : 1.0f;
        if (f.freq_factors != nullptr) r.freq_factors.assign(f.freq_factors, f.freq_factors + config->head_dim / 2);
      }
    }
    const token_id t = 0;
    const auto state_at = [&](std::int64_t pos) {
      fill_batch(std::span<const token_id>(&t, 1), pos, {0}, false);
      decode("measure", pos, 1);
      std::vector<std::byte> bytes = save_sequence(0);
      llama_memory_clear(mem_, true);
      return bytes;
    };
    std::vector<std::byte> moved = state_at(0);
    const std::vector<std::byte> there = state_at(kShiftProbe);
    detail::SequenceStateShape shape, expected;
    if (moved.size() != there.size() || !detail::read_sequence_state(moved, shape).empty() ||
        !detail::read_sequence_state(there, expected).empty() || !same_layout(shape) || !same_layout(expected))
      return;
    detail::move_sequence_state(moved, shape, rope, kShiftProbe);
    if (!detail::read_sequence_state(moved, shape).empty()) return;
    const std::int64_t width = config->n_head_kv * config->head_dim;
    std::vector<float> a, b;
    std::vector<ggml_fp16_t> halves;
    for (std::size_t c = 0; c < shape.caches.size(); ++c) {
      if (shape.caches[c].positions != expected.caches[c].positions) return;
      for (std::size_t l = 0; l < shape.caches[c].k_at.size(); ++l) {
        detail::load_values(moved.data() + shape.caches[c].k_at[l], options_.kv_type, static_cast<std::size_t>(width),
                            a, halves);
        detail::load_values(there.data() + expected.caches[c].k_at[l], options_.kv_type,
                            static_cast<std::size_t>(width), b, halves);
        float scale = 0, worst = 0;
        for (std::size_t i = 0; i < a.size(); ++i) {
          scale = std::max(scale, std::abs(b[i]));
          worst = std::max(worst, std::abs(a[i] - b[i]));
        }
        if (worst > kShiftTolerance * std::max(scale, 1.0f)) return;
      }
    }
    rope_ = std::move(rope);
  }

  // block_mismatch, with each piece's shape in `pieces`.
  std::string read_block(std::span<const std::byte> bytes, std::int64_t n, std::int64_t first,
                         std::vector<detail::SequenceStateShape>& pieces) const {
    if (n <= 0 || bytes.size() != block_bytes(n))
      return fmt::format("is {} bytes, not the {} of {} rows", bytes.size(), block_bytes(n), n);
    std::size_t at = 0;
    std::vector<std::int32_t> sorted;
    for (std::int64_t done = 0; done < n; done += window_) {
      const std::int64_t rows = std::min(window_, n - done);
      const std::size_t size = block_bytes(rows);
      detail::SequenceStateShape& shape = pieces.emplace_back();
      if (std::string why = detail::read_sequence_state(bytes.subspan(at, size), shape); !why.empty())
        return fmt::format("is not a sequence state of this model and build: the piece at byte {} {}", at, why);
      if (!same_layout(shape))
        return fmt::format("is not a sequence state of this model and build: the piece at byte {} has magic 0x{:08x} "
                           "and another cache or layer layout",
                           at, shape.magic);
      for (const detail::CacheState& cache : shape.caches) {
        sorted = cache.positions;
        std::sort(sorted.begin(), sorted.end());
        bool each_once = static_cast<std::int64_t>(sorted.size()) == rows;
        for (std::size_t i = 0; each_once && i < sorted.size(); ++i)
          each_once = sorted[i] == first + done + static_cast<std::int64_t>(i);
        if (!each_once)
          return fmt::format("holds positions [{}, {}] in {} cells at byte {}, not each of [{}, {}] once",
                             sorted.empty() ? -1 : sorted.front(), sorted.empty() ? -1 : sorted.back(), sorted.size(),
                             at, first + done, first + done + rows - 1);
      }
      at += size;
    }
    return {};
  }

  // Whether a state read by detail::read_sequence_state has this context's magic, caches and layers.
  [[nodiscard]] bool same_layout(const detail::SequenceStateShape& shape) const {
    if (shape.magic != state_magic_ || shape.caches.size() != state_layouts_.size()) return false;
    for (std::size_t c = 0; c < shape.caches.size(); ++c)
      if (shape.caches[c].layout != state_layouts_[c]) return false;
    return true;
  }

  // The probe's move, and how far the moved K may lie from llama.cpp's (of the row's largest value): the same
  // angles, but f16 rounds twice (kvfuse's rotated value, and llama.cpp's at 0 before it), 2^-10 each.
  static constexpr std::int64_t kShiftProbe = 1000;
  static constexpr float kShiftTolerance = 4e-3f;
};

}  // namespace kvfuse::llamacpp
