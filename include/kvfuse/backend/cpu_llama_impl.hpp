#pragma once
// The out-of-class member functions of backend/cpu_llama.hpp (the classes and what each does are there).
// cpu_llama.hpp includes this file at its end unless KVFUSE_CPU_SEPARATE_COMPILATION is defined (core/config.hpp).

#include "kvfuse/backend/cpu_llama.hpp"

namespace kvfuse {

KVFUSE_CPU_INLINE void CpuLlamaSession::compute_kv(TokenRange r) {
  validate_range(r, num_tokens(), "CpuLlamaSession::compute_kv");
  detail::require(!r.empty(), "CpuLlamaSession::compute_kv: empty range {}", r);
  detail::require(prefix_ >= r.begin,
                  "CpuLlamaSession::compute_kv: computing {} needs the KV of [0, {}) but only [0, {}) is resident", r,
                  r.begin, prefix_);
  const bool last = r.end == num_tokens();
  logits_ = model_->compute_rows(
      kv_, r, std::span<const token_id>(prompt_).subspan(static_cast<std::size_t>(r.begin), static_cast<std::size_t>(r.size())),
      last);  // empty unless r ends the prompt: earlier KV changed, recompute on demand
  mark(r);
}

KVFUSE_CPU_INLINE void CpuLlamaSession::install_kv(TokenRange r, const KVBlock& block) {
  validate_range(r, num_tokens(), "CpuLlamaSession::install_kv");
  detail::require(block.bytes.size() == LlamaKVCache::block_bytes(kv_.num_layers(), kv_.kv_dim, r.size()),
                  "CpuLlamaSession::install_kv: block for {} holds {} bytes, expected {}", r, block.bytes.size(),
                  LlamaKVCache::block_bytes(kv_.num_layers(), kv_.kv_dim, r.size()));
  for (std::size_t at = 0; at < block.bytes.size(); at += sizeof(float)) {
    float value = 0;
    std::memcpy(&value, block.bytes.data() + at, sizeof value);
    detail::require(std::isfinite(value), "CpuLlamaSession::install_kv: the block for {} holds {} at float {}", r,
                    value, at / sizeof(float));
  }
  kv_.write_block(r, block);
  logits_.clear();  // they were computed against the KV just replaced
  mark(r);
}

KVFUSE_CPU_INLINE KVBlock CpuLlamaSession::export_kv(TokenRange r) const {
  validate_range(r, num_tokens(), "CpuLlamaSession::export_kv");
  for (std::int64_t t = r.begin; t < r.end; ++t)
    detail::require(resident_[static_cast<std::size_t>(t)],
                    "CpuLlamaSession::export_kv: token {} of {} is not resident", t, r);
  return kv_.to_block(r);
}

KVFUSE_CPU_INLINE std::span<const float> CpuLlamaSession::logits() {
  detail::require(prefix_ == num_tokens(), "CpuLlamaSession::logits: only [0, {}) of {} tokens is resident", prefix_,
                  num_tokens());
  if (logits_.empty()) {
    const std::int64_t last = num_tokens() - 1;
    logits_ = model_->run(kv_, TokenSet{last}, std::span<const token_id>(&prompt_.back(), 1), nullptr, nullptr, true,
                          nullptr);
  }
  return logits_;
}

KVFUSE_CPU_INLINE KVBlock CpuLlamaFusion::chunk_kv(std::span<const token_id> tokens,
                                                   std::int64_t first_position) const {
  const LlamaKVCache kv = model_->prefill_chunk(tokens, first_position);
  KVBlock block = encode(kv.to_block({0, kv.num_rows()}));
  block.first_position = first_position;
  return block;
}

KVFUSE_CPU_INLINE void CpuLlamaFusion::load_rows(TokenRange r, const KVBlock& block) {
  detail::require(block.bytes.size() == block_bytes(r.size()),
                  "CpuLlamaFusion::load_rows: the block for rows {} holds {} bytes, expected {} ({} storage)", r,
                  block.bytes.size(), block_bytes(r.size()), dtype_name(storage_));
  kv_.write_block(r, decode(block));
  for (std::int64_t row = r.begin; row < r.end; ++row)
    kv_.positions[static_cast<std::size_t>(row)] = block.first_position + (row - r.begin);
}

KVFUSE_CPU_INLINE void CpuLlamaFusion::load_layer_rows(std::int64_t layer, TokenRange r,
                                                       std::span<const std::byte> bytes, std::int64_t first_position) {
  validate_range(r, kv_.num_rows(), "CpuLlamaFusion::load_layer_rows");
  detail::require(layer >= 0 && layer < num_layers() && bytes.size() == layer_bytes(r.size()),
                  "CpuLlamaFusion::load_layer_rows: {} bytes for layer {} of rows {} (first position {}), expected "
                  "{} bytes of one of {} layers ({} storage)",
                  bytes.size(), layer, r, first_position, layer_bytes(r.size()), num_layers(), dtype_name(storage_));
  const auto values = static_cast<std::size_t>(r.size() * kv_.kv_dim);
  const std::size_t half = bytes.size() / 2;
  decode_values(bytes.first(half), kv_.k_row(layer, r.begin), values);
  decode_values(bytes.subspan(half), kv_.v_row(layer, r.begin), values);
}

KVFUSE_CPU_INLINE std::vector<float> CpuLlamaFusion::prefill(const TokenSet& rows, const SelectionPolicy& next,
    const StatisticsRequest& stats) {
  PartialPrefillOptions options;
  options.attention_groups = stats.groups;
  options.query_mass_rows = stats.query;
  options.before_layer = hook_;
  return model_->partial_prefill(tokens_, kv_, rows, next, options).logits;
}

KVFUSE_CPU_INLINE KVBlock CpuLlamaFusion::encode(KVBlock block) const {
  if (storage_ == DType::f32) return block;
  const std::size_t count = block.bytes.size() / sizeof(float);
  std::vector<std::byte> out(count * 2);
  for (std::size_t i = 0; i < count; ++i) {
    float value = 0;
    std::memcpy(&value, block.bytes.data() + i * sizeof(float), sizeof value);
    const std::uint16_t bits = storage_ == DType::bf16 ? to_bf16(value).bits : to_f16(value).bits;
    std::memcpy(out.data() + i * 2, &bits, sizeof bits);
  }
  block.bytes = std::move(out);
  return block;
}

KVFUSE_CPU_INLINE KVBlock CpuLlamaFusion::decode(const KVBlock& block) const {
  if (storage_ == DType::f32) return block;
  KVBlock out{block.num_tokens, std::vector<std::byte>(block.bytes.size() / 2 * sizeof(float)), block.first_position};
  decode_values(block.bytes, reinterpret_cast<float*>(out.bytes.data()), block.bytes.size() / 2);
  return out;
}

KVFUSE_CPU_INLINE void CpuLlamaFusion::decode_values(std::span<const std::byte> in, float* out,
                                                     std::size_t count) const {
  if (storage_ == DType::f32) {
    std::memcpy(out, in.data(), count * sizeof(float));
    return;
  }
  for (std::size_t i = 0; i < count; ++i) {
    std::uint16_t bits = 0;
    std::memcpy(&bits, in.data() + i * 2, sizeof bits);
    out[i] = storage_ == DType::bf16 ? to_float(bf16{bits}) : to_float(f16{bits});
  }
}

}  // namespace kvfuse
