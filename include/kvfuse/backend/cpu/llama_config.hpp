#pragma once
// LlamaConfig and LlamaWeights: the shape and the fp32 parameters of a Llama-architecture decoder, as the
// reference CPU backend (backend/cpu_llama.hpp) runs it. Both come from a GGUF file (from_gguf) or, for
// tests, from a hand-written config and LlamaWeights::random.
//
// Supported: architecture "llama" (RMSNorm, RoPE, grouped-query attention, SwiGLU MLP, optional untied
// output head), RoPE with no scaling, linear scaling, or per-frequency factors (GGUF tensor rope_freqs.weight,
// Llama 3.1). Architecture "gemma3" (llama.cpp LLM_ARCH_GEMMA3, the Gemma 3 text decoders): the same block
// plus embeddings scaled by sqrt(n_embd), a per-head RMSNorm of Q and K, RMSNorms of the attention and MLP
// outputs before each residual add, a GELU (tanh approximation) gated MLP, NeoX RoPE pairing, interleaved
// local (sliding-window) and global attention layers with their own RoPE bases, an optional final logit
// soft-cap. Architecture "qwen2" (llama.cpp LLM_ARCH_QWEN2, Qwen2 and Qwen2.5): the llama block with biases
// added to the Q, K and V projections (attn_q.bias, attn_k.bias, attn_v.bias, all three required) and NeoX
// RoPE pairing. Everything else is refused with a kvfuse::error naming it: other architectures, YaRN and other
// RoPE scaling types, partial rotary embeddings (rope.dimension_count != head_dim), n_head not a multiple of
// n_head_kv, mixture-of-experts, other bias or extra tensors (attn_output.bias, output.bias, EmbeddingGemma's
// dense_2 / dense_3 projections among them), sliding-window patterns in a form llama.cpp does not define.

#include <array>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <set>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <variant>
#include <vector>

#include <Eigen/Core>
#include <fmt/format.h>
#include <fmt/ranges.h>

#include "kvfuse/backend/cpu/weight_matrix.hpp"
#include "kvfuse/core/config.hpp"
#include "kvfuse/core/error.hpp"
#include "kvfuse/core/rope.hpp"
#include "kvfuse/core/types.hpp"
#include "kvfuse/model/gguf.hpp"

namespace kvfuse {

// The decoder a LlamaConfig describes: llama.cpp's graph of that name. There is one forward pass; the
// gemma3 steps and the qwen2 biases (see the header comment) are switched on by it.
enum class LlamaArchitecture : int {
  llama = 0,   // LLM_ARCH_LLAMA
  gemma3 = 1,  // LLM_ARCH_GEMMA3
  qwen2 = 2,   // LLM_ARCH_QWEN2
};

struct LlamaConfig {
  std::int64_t n_layer = 0;    // decoder blocks L
  std::int64_t n_embd = 0;     // hidden size
  std::int64_t n_head = 0;     // query heads
  std::int64_t n_head_kv = 0;  // key/value heads (GQA: query head h reads KV head h / (n_head / n_head_kv))
  std::int64_t head_dim = 0;   // per-head dimension, even; all of it is rotated
  std::int64_t n_ff = 0;       // MLP hidden size
  std::int64_t n_vocab = 0;
  double rope_base = 10000.0;
  double rms_eps = 1e-5;
  RopePairing rope_pairing = RopePairing::interleaved;  // GGUF Llama: interleaved (see core/rope.hpp)
  double rope_linear_factor = 1.0;                      // rope.scaling.type "linear": positions / factor
  std::vector<float> rope_freq_factors;                 // head_dim / 2 divisors of θ_i, or empty
  // The context the model was trained for (GGUF {arch}.context_length: SmolLM2 8192, Gemma 3 270M 32768); 0:
  // unknown. CpuLlama refuses to compute a row at a position >= it unless CpuLlamaOptions::allow_beyond_context.
  std::int64_t context_length = 0;

  // The architecture and the settings only gemma3 has (llama and qwen2 keep the neutral defaults; validate()
  // checks).
  LlamaArchitecture architecture = LlamaArchitecture::llama;
  // Local layers attend within a sliding window (llama.cpp LLAMA_SWA_TYPE_STANDARD): a query at position p
  // sees a key at position p_k iff p − sliding_window < p_k <= p. Global layers are plain causal.
  std::int64_t sliding_window = 0;
  std::vector<std::uint8_t> local_layers;  // n_layer flags (1: local), or empty: every layer global
  double rope_base_local = 10000.0;        // RoPE base of local layers, unscaled (GGUF rope.freq_base_swa)
  double embedding_scale = 1.0;            // h = token_embd[t] · embedding_scale (gemma3: sqrt(n_embd))
  double attention_scale = 0.0;            // scale of q · k; 0: 1 / sqrt(head_dim)
  double final_logit_softcap = 0.0;        // logits = cap · tanh(logits / cap); 0: none

  [[nodiscard]] std::int64_t q_dim() const noexcept { return n_head * head_dim; }
  [[nodiscard]] std::int64_t kv_dim() const noexcept { return n_head_kv * head_dim; }
  [[nodiscard]] std::int64_t group_size() const noexcept { return n_head / n_head_kv; }

  [[nodiscard]] bool is_local(std::int64_t layer) const noexcept {
    return !local_layers.empty() && local_layers[static_cast<std::size_t>(layer)] != 0;
  }
  // The sliding window of `layer`'s attention: sliding_window on a local layer, 0 (plain causal) on a global one.
  [[nodiscard]] std::int64_t attention_window(std::int64_t layer) const noexcept {
    return is_local(layer) ? sliding_window : 0;
  }
  // The factor of q · k in the attention scores.
  [[nodiscard]] float attention_score_scale() const noexcept {
    return static_cast<float>(attention_scale > 0 ? attention_scale : 1.0 / std::sqrt(static_cast<double>(head_dim)));
  }

  // The RoPE frequency settings of `layer` (core/rope.hpp): on a global layer rope_base, linear scaling and
  // the rope_freqs.weight divisors (which point into rope_freq_factors, so they live as long as *this); on a
  // local one rope_base_local alone (llama.cpp rotates local layers with rope_freq_scale_train_swa = 1).
  [[nodiscard]] RopeFrequencyConfig rope_frequency_config(std::int64_t layer) const noexcept;

  // θ_i of the head_dim / 2 pairs of `layer` in double: rope_frequencies (core/rope.hpp), the table the
  // kernels round to float. Throws kvfuse::error with its message on what it refuses (validate() refuses all
  // of it first).
  [[nodiscard]] std::vector<double> rope_theta(std::int64_t layer) const;

  // Reads the llama.*, gemma3.* or qwen2.* metadata of a GGUF file (and, for llama, the tensor rope_freqs.weight
  // when present); refuses what the backend does not implement (see the header comment).
  [[nodiscard]] static LlamaConfig from_gguf(const GGUFFile& file);

  void validate() const;

 private:
  void read_gemma3(const GGUFFile& file);

  void validate_architecture() const;
};

// Weights of one decoder block. Matrices are row-major [out][in], so a projection is y = W x; they are held as
// the GGUF file stores them (WeightMatrix: fp32, or ggml blocks dequantized when used), norms in fp32.
struct LlamaLayerWeights {
  Eigen::VectorXf attn_norm;  // [n_embd]
  WeightMatrix wq;            // [q_dim][n_embd]
  WeightMatrix wk;            // [kv_dim][n_embd]
  WeightMatrix wv;            // [kv_dim][n_embd]
  WeightMatrix wo;            // [n_embd][q_dim]
  Eigen::VectorXf ffn_norm;   // [n_embd]
  WeightMatrix w_gate;        // [n_ff][n_embd]
  WeightMatrix w_up;          // [n_ff][n_embd]
  WeightMatrix w_down;        // [n_embd][n_ff]
  // gemma3 only (empty otherwise): the RMSNorm weights of each Q and each K head ([head_dim]), and of the
  // attention and MLP outputs before they join the residual stream ([n_embd]).
  Eigen::VectorXf attn_q_norm;
  Eigen::VectorXf attn_k_norm;
  Eigen::VectorXf attn_post_norm;
  Eigen::VectorXf ffn_post_norm;
  // qwen2 only (empty otherwise): the biases of the Q, K and V projections, q = W_q x + bq and so on.
  Eigen::VectorXf bq;  // [q_dim]
  Eigen::VectorXf bk;  // [kv_dim]
  Eigen::VectorXf bv;  // [kv_dim]

  // The seven weight projections in one order: the model's fingerprint hashes them so, bf16 products pack them.
  [[nodiscard]] std::array<const WeightMatrix*, 7> projections() const {
    return {&wq, &wk, &wv, &wo, &w_gate, &w_up, &w_down};
  }
  [[nodiscard]] std::array<WeightMatrix*, 7> projections() { return {&wq, &wk, &wv, &wo, &w_gate, &w_up, &w_down}; }
};

struct LlamaWeights {
  WeightMatrix token_embd;  // [n_vocab][n_embd]: row t embeds token t
  Eigen::VectorXf output_norm;
  WeightMatrix output;  // [n_vocab][n_embd]; empty (0 x 0): tied to token_embd
  std::vector<LlamaLayerWeights> layers;

  [[nodiscard]] const WeightMatrix& output_head() const noexcept { return output.size() == 0 ? token_embd : output; }

  // Shapes against `config`, and every value finite.
  void validate(const LlamaConfig& config) const;

  // The tensors of a GGUF Llama file: token_embd, output_norm, output (absent: tied to
  // token_embd), blk.N.{attn_norm, attn_q, attn_k, attn_v, attn_output, ffn_norm, ffn_gate, ffn_up,
  // ffn_down}.weight, for gemma3 also blk.N.{attn_q_norm, attn_k_norm, post_attention_norm,
  // post_ffw_norm}.weight, for qwen2 also blk.N.{attn_q, attn_k, attn_v}.bias. The gemma3 norm weights are used
  // as stored: llama.cpp's converter already added the 1 of Gemma's RMSNorm (x · (1 + w)) to them. A 2-D ggml
  // tensor has dims [ne0 = in, ne1 = out] with ne0 contiguous, which is exactly the row-major [out][in] matrix W
  // of y = W x. Any other tensor (other biases, experts, EmbeddingGemma's dense_2 / dense_3, ...) is refused, and
  // so is a qwen2 file without one of its biases. Matrices keep
  // the file's type (WeightMatrix::from_blocks, a copy of the bytes; fp32 ones as values), norms are read as fp32.
  [[nodiscard]] static LlamaWeights from_gguf(const GGUFFile& file, const LlamaConfig& config);

  // Deterministic pseudo-random weights for tests: matrices uniform in ±1/sqrt(in), norms in 1 ± 0.25,
  // embeddings uniform in ±1; tied output head; gemma3's extra norms and qwen2's biases (uniform in ±0.5) drawn
  // after each layer's llama tensors.
  // The generator (splitmix64) is fixed, so the same seed gives the same weights on every platform.
  [[nodiscard]] static LlamaWeights random(const LlamaConfig& config, std::uint64_t seed);
};

}  // namespace kvfuse

// The member functions' definitions (header-only unless KVFUSE_CPU_SEPARATE_COMPILATION: core/config.hpp).
#ifndef KVFUSE_CPU_SEPARATE_COMPILATION
#include "kvfuse/backend/cpu/llama_config_impl.hpp"
#endif
