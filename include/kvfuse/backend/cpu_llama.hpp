#pragma once
// Reference CPU compute backend: a Llama- or Gemma 3-architecture model from a GGUF file (or random weights) run
// in fp32 with Eigen on the CPU, and the operations kvfuse's policies need from a compute device.
//
// When to use: to run and judge the fusion and scheduling policies on a real model without a GPU — tests,
// examples, conformance and quality measurements (always against full prefill of the same prompt on the same
// model). It is a reference, not a serving engine: fp32, no batching, no paged KV.
//
// Pieces (each in its own header under backend/cpu/):
//   LlamaConfig, LlamaWeights  the model (llama_config.hpp): from_gguf, or LlamaWeights::random for tests
//   LlamaKVCache               per-layer K / V rows with their positions, KVBlock bytes (kv_cache.hpp)
//   CpuLlama                   the forward pass and the fusion loop's operations (llama.hpp)
//   CpuLlamaSession            here: one request's prompt and KV, a model of kvfuse::ComputeBackend
//   CpuLlamaFusion             here: one request's KV for the fusion loop, a model of PerLayerFusionBackend
//
// The RoPE math lives in detail/rope.hpp (KVFUSE_HOST_DEVICE, shared with the CUDA kernels).

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <utility>
#include <vector>

#include "kvfuse/backend/concepts.hpp"
#include "kvfuse/backend/cpu/kv_cache.hpp"
#include "kvfuse/backend/cpu/llama.hpp"
#include "kvfuse/backend/cpu/llama_config.hpp"
#include "kvfuse/core/dtype.hpp"
#include "kvfuse/core/error.hpp"
#include "kvfuse/core/hash.hpp"
#include "kvfuse/core/prompt.hpp"
#include "kvfuse/core/types.hpp"
#include "kvfuse/fusion/fusion_backend.hpp"
#include "kvfuse/fusion/layer_protocol.hpp"
#include "kvfuse/select/cci_scorer.hpp"

namespace kvfuse {

// One request on a CpuLlama: the prompt's tokens and their KV, filled by computing ranges (compute_kv, with
// the KV of every earlier token resident) and by installing loaded ranges (install_kv). KV rows are prompt
// positions 0 .. n-1; KVBlock bytes follow LlamaKVCache's layout (per layer the K rows then the V rows,
// fp32, K rotated at the block's prompt positions). The model must outlive the session.
class CpuLlamaSession {
 public:
  CpuLlamaSession(const CpuLlama& model, std::vector<token_id> prompt)
      : model_(&model),
        prompt_(std::move(prompt)),
        kv_(model.config().n_layer, model.config().kv_dim(), static_cast<std::int64_t>(prompt_.size())),
        resident_(prompt_.size(), false) {
    detail::require(!prompt_.empty(), "CpuLlamaSession: empty prompt");
    model.check_tokens(prompt_, "CpuLlamaSession");
  }

  [[nodiscard]] std::uint64_t model_fingerprint() const noexcept { return model_->fingerprint(); }
  [[nodiscard]] std::int64_t num_tokens() const noexcept { return static_cast<std::int64_t>(prompt_.size()); }
  [[nodiscard]] std::span<const token_id> prompt() const noexcept { return prompt_; }
  [[nodiscard]] const LlamaKVCache& kv() const noexcept { return kv_; }

  // Length of the longest resident prefix [0, p).
  [[nodiscard]] std::int64_t resident_prefix() const noexcept { return prefix_; }

  // Computes the KV of prompt tokens r; the KV of [0, r.begin) must be resident.
  void compute_kv(TokenRange r);

  // Makes loaded KV resident for prompt tokens r (block layout: LlamaKVCache::to_block).
  void install_kv(TokenRange r, const KVBlock& block);

  // The resident KV of prompt tokens r as a KVBlock, to put in a KVStore.
  [[nodiscard]] KVBlock export_kv(TokenRange r) const;

  // Logits of the last prompt token; the whole prompt must be resident. Unless the last call was a
  // compute_kv that ended the prompt, the last token is recomputed against the resident KV first.
  [[nodiscard]] std::span<const float> logits();

  // Greedy continuation of the prompt (CpuLlama::greedy_decode on a copy of the session's KV).
  [[nodiscard]] std::vector<token_id> generate(std::int64_t max_new_tokens, token_id eos) {
    const std::span<const float> first = logits();
    LlamaKVCache kv = kv_;
    return model_->greedy_decode(kv, first, max_new_tokens, eos);
  }

 private:
  void mark(TokenRange r) {
    for (std::int64_t t = r.begin; t < r.end; ++t) resident_[static_cast<std::size_t>(t)] = true;
    while (prefix_ < num_tokens() && resident_[static_cast<std::size_t>(prefix_)]) ++prefix_;
  }

  const CpuLlama* model_;
  std::vector<token_id> prompt_;
  LlamaKVCache kv_;
  std::vector<bool> resident_;
  std::int64_t prefix_ = 0;
  std::vector<float> logits_;  // of the last prompt token, once computed
};

static_assert(ComputeBackend<CpuLlamaSession>);

// CpuLlama as an engine of the fusion loop (fusion/fusion_backend.hpp: all three concepts): one request's KV
// in a LlamaKVCache, the per-layer partial prefill of CpuLlama::partial_prefill, stored KV taken whole or a
// layer at a time; and a ComputeBackend for Cake on the same KV (run_composed). Not thread-safe; one request at a time (Cake's loader calls compute_kv
// and install_kv from its calling thread only).
class CpuLlamaFusion {
 public:
  // `storage`: the dtype of the KV blocks it stores and loads — f32, or f16 / bf16 (rounded to nearest even,
  // core/dtype.hpp) to halve the bytes a store holds and a link carries. The request's KV stays fp32; blocks
  // of another storage dtype get other keys (the fingerprint includes it), so they never mix.
  explicit CpuLlamaFusion(const CpuLlama& model, DType storage = DType::f32) : model_(&model), storage_(storage) {
    detail::require(storage == DType::f32 || storage == DType::f16 || storage == DType::bf16,
                    "CpuLlamaFusion: storage dtype {} is not f32, f16 or bf16", static_cast<int>(storage));
  }

  [[nodiscard]] const CpuLlama& model() const noexcept { return *model_; }
  [[nodiscard]] DType storage() const noexcept { return storage_; }
  [[nodiscard]] std::uint64_t model_fingerprint() const noexcept {
    if (storage_ == DType::f32) return model_->fingerprint();
    const std::uint64_t parts[2] = {model_->fingerprint(), static_cast<std::uint64_t>(storage_)};
    return xxh3(std::as_bytes(std::span(parts)));
  }
  [[nodiscard]] std::int64_t num_layers() const noexcept { return model_->config().n_layer; }
  [[nodiscard]] std::size_t block_bytes(std::int64_t rows) const {
    return LlamaKVCache::block_bytes(model_->config().n_layer, model_->config().kv_dim(), rows) / sizeof(float) *
           static_cast<std::size_t>(dtype_size(storage_));
  }

  [[nodiscard]] KVBlock chunk_kv(std::span<const token_id> tokens, std::int64_t first_position) const;

  void begin(std::span<const token_id> tokens) {
    tokens_.assign(tokens.begin(), tokens.end());
    kv_ = LlamaKVCache(model_->config().n_layer, model_->config().kv_dim(), static_cast<std::int64_t>(tokens.size()));
  }

  void load_rows(TokenRange r, const KVBlock& block);

  void shift_rows(TokenRange r, std::int64_t delta) { model_->rope_shift(kv_, r, delta); }

  // LayerwiseFusionBackend: a block is its layers in order (LlamaKVCache's layout), each K rows then V rows.
  [[nodiscard]] std::size_t layer_bytes(std::int64_t rows) const {
    return block_bytes(rows) / static_cast<std::size_t>(model_->config().n_layer);
  }

  void load_layer_rows(std::int64_t layer, TokenRange r, std::span<const std::byte> bytes, std::int64_t first_position);

  void shift_layer_rows(std::int64_t layer, TokenRange r, std::int64_t delta) {
    model_->rope_shift_layer(kv_, layer, r, delta);
  }

  void set_layer_hook(LayerHook hook) { hook_ = std::move(hook); }

  // ComputeBackend (Cake's compute side, for the stored exact prefix of a request): rows r computed on every
  // layer with rows [0, r.begin) resident; loaded prefix blocks installed at their positions.
  void compute_kv(TokenRange r) {
    (void)model_->compute_rows(
        kv_, r, std::span<const token_id>(tokens_).subspan(static_cast<std::size_t>(r.begin), static_cast<std::size_t>(r.size())),
        false);
  }
  void install_kv(TokenRange r, const KVBlock& block) { load_rows(r, block); }

  std::vector<float> prefill(const TokenSet& rows) { return prefill(rows, {}, {}); }

  std::vector<float> prefill(const TokenSet& rows, const SelectionPolicy& next, const StatisticsRequest& stats);

  [[nodiscard]] KVBlock save_rows(TokenRange r) const { return encode(kv_.to_block(r)); }

  // The request's KV after prefill (for decoding: CpuLlama::greedy_decode).
  [[nodiscard]] LlamaKVCache& kv() noexcept { return kv_; }
  [[nodiscard]] const LlamaKVCache& kv() const noexcept { return kv_; }

 private:
  // An fp32 block (LlamaKVCache::to_block) in the storage dtype, value by value; decode is its inverse.
  [[nodiscard]] KVBlock encode(KVBlock block) const;

  [[nodiscard]] KVBlock decode(const KVBlock& block) const;

  // `count` values of the storage dtype in `in` as floats at `out`.
  void decode_values(std::span<const std::byte> in, float* out, std::size_t count) const;

  const CpuLlama* model_;
  DType storage_ = DType::f32;
  std::vector<token_id> tokens_;
  LlamaKVCache kv_;
  LayerHook hook_;
};

static_assert(FixedSetFusionBackend<CpuLlamaFusion>);
static_assert(LayerwiseFusionBackend<CpuLlamaFusion>);
static_assert(PerLayerFusionBackend<CpuLlamaFusion>);
static_assert(ComputeBackend<CpuLlamaFusion>);

}  // namespace kvfuse

// The member functions' definitions (header-only unless KVFUSE_CPU_SEPARATE_COMPILATION: core/config.hpp).
#ifndef KVFUSE_CPU_SEPARATE_COMPILATION
#include "kvfuse/backend/cpu_llama_impl.hpp"
#endif
