#pragma once
// LlamaConfig and LlamaWeights: the shape and the fp32 parameters of a Llama-architecture decoder, as the
// reference CPU backend (backend/cpu_llama.hpp) runs it. Both come from a GGUF file (from_gguf) or, for
// tests, from a hand-written config and LlamaWeights::random.
//
// Supported: architecture "llama" (RMSNorm, RoPE, grouped-query attention, SwiGLU MLP, optional untied
// output head), RoPE with no scaling, linear scaling, or per-frequency factors (GGUF tensor rope_freqs.weight,
// Llama 3.1). Everything else is refused with a kvfuse::error naming it: other architectures, YaRN and other
// RoPE scaling types, partial rotary embeddings (rope.dimension_count != head_dim), n_head not a multiple of
// n_head_kv, mixture-of-experts, bias or other extra tensors.

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <set>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <Eigen/Core>
#include <fmt/format.h>
#include <fmt/ranges.h>

#include "kvfuse/core/error.hpp"
#include "kvfuse/core/rope.hpp"
#include "kvfuse/core/types.hpp"
#include "kvfuse/model/gguf.hpp"

namespace kvfuse {

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

  [[nodiscard]] std::int64_t q_dim() const noexcept { return n_head * head_dim; }
  [[nodiscard]] std::int64_t kv_dim() const noexcept { return n_head_kv * head_dim; }
  [[nodiscard]] std::int64_t group_size() const noexcept { return n_head / n_head_kv; }

  // The RoPE frequency settings (core/rope.hpp): base, linear scaling, rope_freqs.weight divisors. They
  // point into rope_freq_factors, so they live as long as *this.
  [[nodiscard]] RopeFrequencyConfig rope_frequency_config() const noexcept {
    RopeFrequencyConfig f;
    f.head_dim = head_dim;
    f.base = rope_base;
    f.scaling = rope_linear_factor == 1.0 ? RopeScaling::none : RopeScaling::linear;
    f.factor = rope_linear_factor;
    f.freq_factors = rope_freq_factors.empty() ? nullptr : rope_freq_factors.data();
    return f;
  }

  // θ_i of the head_dim / 2 pairs in double: rope_frequencies (core/rope.hpp), the table the kernels round
  // to float. Throws kvfuse::error with its message on what it refuses (validate() refuses all of it first).
  [[nodiscard]] std::vector<double> rope_theta() const {
    std::vector<double> theta(static_cast<std::size_t>(head_dim / 2));
    const Status s = rope_frequencies(rope_frequency_config(), theta.data());
    detail::require(s == Status::success, "LlamaConfig: {}", last_status_message());
    return theta;
  }

  // Reads the llama.* metadata of a GGUF file (and the tensor rope_freqs.weight when present); refuses what
  // the backend does not implement (see the header comment).
  [[nodiscard]] static LlamaConfig from_gguf(const GGUFFile& file);

  void validate() const {
    const auto positive = [](std::int64_t v, const char* name) {
      detail::require(v >= 1, "LlamaConfig: {} = {} must be at least 1", name, v);
    };
    positive(n_layer, "n_layer");
    positive(n_embd, "n_embd");
    positive(n_head, "n_head");
    positive(n_head_kv, "n_head_kv");
    positive(head_dim, "head_dim");
    positive(n_ff, "n_ff");
    positive(n_vocab, "n_vocab");
    detail::require(n_head % n_head_kv == 0,
                    "LlamaConfig: n_head = {} is not a multiple of n_head_kv = {} (grouped-query attention needs "
                    "whole groups)",
                    n_head, n_head_kv);
    detail::require(head_dim % 2 == 0, "LlamaConfig: head_dim = {} must be even (RoPE rotates pairs)", head_dim);
    detail::require(n_vocab <= std::int64_t{1} << 31, "LlamaConfig: n_vocab = {} does not fit token_id", n_vocab);
    detail::require(std::isfinite(rope_base) && rope_base > 0, "LlamaConfig: rope_base = {} must be finite and > 0",
                    rope_base);
    detail::require(std::isfinite(rms_eps) && rms_eps > 0, "LlamaConfig: rms_eps = {} must be finite and > 0", rms_eps);
    detail::require(rope_pairing == RopePairing::interleaved || rope_pairing == RopePairing::half_split,
                    "LlamaConfig: rope_pairing = {} is neither interleaved nor half_split",
                    static_cast<int>(rope_pairing));
    detail::require(std::isfinite(rope_linear_factor) && rope_linear_factor > 0,
                    "LlamaConfig: rope_linear_factor = {} must be finite and > 0", rope_linear_factor);
    detail::require(rope_freq_factors.empty() || static_cast<std::int64_t>(rope_freq_factors.size()) == head_dim / 2,
                    "LlamaConfig: {} rope_freq_factors for head_dim / 2 = {} rotated pairs", rope_freq_factors.size(),
                    head_dim / 2);
    for (std::size_t i = 0; i < rope_freq_factors.size(); ++i) {
      detail::require(std::isfinite(rope_freq_factors[i]) && rope_freq_factors[i] > 0,
                      "LlamaConfig: rope_freq_factors[{}] = {} must be finite and > 0", i, rope_freq_factors[i]);
    }
  }
};

using RowMatrix = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;

// Weights of one decoder block. Matrices are row-major [out][in], so a projection is y = W x.
struct LlamaLayerWeights {
  Eigen::VectorXf attn_norm;  // [n_embd]
  RowMatrix wq;               // [q_dim][n_embd]
  RowMatrix wk;               // [kv_dim][n_embd]
  RowMatrix wv;               // [kv_dim][n_embd]
  RowMatrix wo;               // [n_embd][q_dim]
  Eigen::VectorXf ffn_norm;   // [n_embd]
  RowMatrix w_gate;           // [n_ff][n_embd]
  RowMatrix w_up;             // [n_ff][n_embd]
  RowMatrix w_down;           // [n_embd][n_ff]
};

struct LlamaWeights {
  RowMatrix token_embd;  // [n_vocab][n_embd]: row t embeds token t
  Eigen::VectorXf output_norm;
  RowMatrix output;  // [n_vocab][n_embd]; empty (0 x 0): tied to token_embd
  std::vector<LlamaLayerWeights> layers;

  [[nodiscard]] const RowMatrix& output_head() const noexcept { return output.size() == 0 ? token_embd : output; }

  // Shapes against `config`, and every value finite.
  void validate(const LlamaConfig& config) const {
    const auto matrix = [](const RowMatrix& m, std::int64_t rows, std::int64_t cols, const std::string& name) {
      detail::require(m.rows() == rows && m.cols() == cols, "LlamaWeights: {} is {} x {}, expected {} x {}", name,
                      m.rows(), m.cols(), rows, cols);
      detail::require(m.allFinite(), "LlamaWeights: {} holds a value that is not finite", name);
    };
    const auto vector = [](const Eigen::VectorXf& v, std::int64_t size, const std::string& name) {
      detail::require(v.size() == size, "LlamaWeights: {} has {} values, expected {}", name, v.size(), size);
      detail::require(v.allFinite(), "LlamaWeights: {} holds a value that is not finite", name);
    };
    const std::int64_t e = config.n_embd;
    matrix(token_embd, config.n_vocab, e, "token_embd");
    vector(output_norm, e, "output_norm");
    if (output.size() != 0) matrix(output, config.n_vocab, e, "output");
    detail::require(static_cast<std::int64_t>(layers.size()) == config.n_layer,
                    "LlamaWeights: {} layers, expected n_layer = {}", layers.size(), config.n_layer);
    for (std::size_t l = 0; l < layers.size(); ++l) {
      const LlamaLayerWeights& w = layers[l];
      const std::string at = fmt::format("layer {} ", l);
      vector(w.attn_norm, e, at + "attn_norm");
      matrix(w.wq, config.q_dim(), e, at + "wq");
      matrix(w.wk, config.kv_dim(), e, at + "wk");
      matrix(w.wv, config.kv_dim(), e, at + "wv");
      matrix(w.wo, e, config.q_dim(), at + "wo");
      vector(w.ffn_norm, e, at + "ffn_norm");
      matrix(w.w_gate, config.n_ff, e, at + "w_gate");
      matrix(w.w_up, config.n_ff, e, at + "w_up");
      matrix(w.w_down, e, config.n_ff, at + "w_down");
    }
  }

  // The tensors of a GGUF Llama file dequantized to fp32: token_embd, output_norm, output (absent: tied to
  // token_embd), blk.N.{attn_norm, attn_q, attn_k, attn_v, attn_output, ffn_norm, ffn_gate, ffn_up,
  // ffn_down}.weight. A 2-D ggml tensor has dims [ne0 = in, ne1 = out] with ne0 contiguous, which is
  // exactly the row-major [out][in] matrix W of y = W x. Any other tensor (biases, experts, ...) is refused.
  [[nodiscard]] static LlamaWeights from_gguf(const GGUFFile& file, const LlamaConfig& config);

  // Deterministic pseudo-random weights for tests: matrices uniform in ±1/sqrt(in), norms in 1 ± 0.25,
  // embeddings uniform in ±1; tied output head. The generator (splitmix64) is fixed, so the same seed gives
  // the same weights on every platform.
  [[nodiscard]] static LlamaWeights random(const LlamaConfig& config, std::uint64_t seed) {
    config.validate();
    std::uint64_t state = seed;
    const auto uniform = [&state]() {  // splitmix64 -> [-1, 1)
      std::uint64_t z = (state += 0x9E3779B97F4A7C15ull);
      z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
      z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
      z ^= z >> 31;
      return static_cast<float>(static_cast<double>(z >> 11) * 0x1.0p-52 - 1.0);
    };
    const auto matrix = [&](std::int64_t rows, std::int64_t cols, float scale) {
      RowMatrix m(rows, cols);
      for (std::int64_t i = 0; i < m.size(); ++i) m.data()[i] = scale * uniform();
      return m;
    };
    const auto norm = [&](std::int64_t size) {
      Eigen::VectorXf v(size);
      for (std::int64_t i = 0; i < size; ++i) v[i] = 1.0f + 0.25f * uniform();
      return v;
    };
    const auto inv_sqrt = [](std::int64_t n) { return static_cast<float>(1.0 / std::sqrt(static_cast<double>(n))); };
    const std::int64_t e = config.n_embd;
    LlamaWeights w;
    w.token_embd = matrix(config.n_vocab, e, 1.0f);
    w.output_norm = norm(e);
    for (std::int64_t l = 0; l < config.n_layer; ++l) {
      LlamaLayerWeights layer;
      layer.attn_norm = norm(e);
      layer.wq = matrix(config.q_dim(), e, inv_sqrt(e));
      layer.wk = matrix(config.kv_dim(), e, inv_sqrt(e));
      layer.wv = matrix(config.kv_dim(), e, inv_sqrt(e));
      layer.wo = matrix(e, config.q_dim(), inv_sqrt(config.q_dim()));
      layer.ffn_norm = norm(e);
      layer.w_gate = matrix(config.n_ff, e, inv_sqrt(e));
      layer.w_up = matrix(config.n_ff, e, inv_sqrt(e));
      layer.w_down = matrix(e, config.n_ff, inv_sqrt(config.n_ff));
      w.layers.push_back(std::move(layer));
    }
    return w;
  }
};

inline LlamaConfig LlamaConfig::from_gguf(const GGUFFile& file) {
  const std::string& arch = file.get_string("general.architecture");
  detail::require(arch == "llama", "LlamaConfig: GGUF architecture '{}' is not supported (only 'llama')", arch);
  const auto u32 = [&file](const char* key) { return static_cast<std::int64_t>(file.get_u32(key)); };
  LlamaConfig c;
  c.n_layer = u32("llama.block_count");
  c.n_embd = u32("llama.embedding_length");
  c.n_ff = u32("llama.feed_forward_length");
  c.n_head = u32("llama.attention.head_count");
  detail::require(c.n_head >= 1, "LlamaConfig: llama.attention.head_count = {} must be at least 1", c.n_head);
  c.n_head_kv = file.contains("llama.attention.head_count_kv") ? u32("llama.attention.head_count_kv") : c.n_head;
  if (file.contains("llama.attention.key_length")) {
    c.head_dim = u32("llama.attention.key_length");
  } else {
    detail::require(c.n_embd % c.n_head == 0,
                    "LlamaConfig: llama.embedding_length = {} is not a multiple of llama.attention.head_count = {} "
                    "and llama.attention.key_length is absent",
                    c.n_embd, c.n_head);
    c.head_dim = c.n_embd / c.n_head;
  }
  if (file.contains("llama.attention.value_length")) {
    detail::require(u32("llama.attention.value_length") == c.head_dim,
                    "LlamaConfig: llama.attention.value_length = {} differs from the key length {} (not supported)",
                    u32("llama.attention.value_length"), c.head_dim);
  }
  const std::int64_t rot = file.contains("llama.rope.dimension_count") ? u32("llama.rope.dimension_count") : c.head_dim;
  detail::require(rot == c.head_dim,
                  "LlamaConfig: partial rotary embedding (llama.rope.dimension_count = {}, head_dim = {}) is not "
                  "supported",
                  rot, c.head_dim);
  if (file.contains("llama.expert_count")) {
    detail::require(u32("llama.expert_count") == 0,
                    "LlamaConfig: mixture of experts (llama.expert_count = {}) is not supported",
                    u32("llama.expert_count"));
  }
  c.rope_base = file.get_f32("llama.rope.freq_base", 10000.0f);
  c.rms_eps = file.get_f32("llama.attention.layer_norm_rms_epsilon");
  if (file.contains("llama.vocab_size")) {
    c.n_vocab = u32("llama.vocab_size");
  } else {
    const GGUFTensorInfo& embd = file.tensor("token_embd.weight");
    detail::require(embd.dims.size() == 2, "LlamaConfig: token_embd.weight has {} dims, expected 2", embd.dims.size());
    c.n_vocab = embd.dims[1];
  }
  const std::string scaling =
      file.contains("llama.rope.scaling.type") ? file.get_string("llama.rope.scaling.type") : std::string("none");
  if (scaling == "linear") {
    c.rope_linear_factor = file.get_f32("llama.rope.scaling.factor");
  } else {
    detail::require(scaling == "none",
                    "LlamaConfig: RoPE scaling type '{}' is not supported (only 'none', 'linear' and rope_freqs "
                    "factors)",
                    scaling);
    // Older files give linear scaling as llama.rope.scale_linear.
    c.rope_linear_factor = file.get_f32("llama.rope.scale_linear", 1.0f);
  }
  if (const GGUFTensorInfo* freqs = file.find_tensor("rope_freqs.weight")) {
    detail::require(freqs->n_elements() == c.head_dim / 2,
                    "LlamaConfig: rope_freqs.weight holds {} factors, expected head_dim / 2 = {}", freqs->n_elements(),
                    c.head_dim / 2);
    c.rope_freq_factors = file.dequantize(*freqs);
  }
  c.rope_pairing = RopePairing::interleaved;  // llama.cpp LLAMA_ROPE_TYPE_NORM for LLM_ARCH_LLAMA
  c.validate();
  return c;
}

inline LlamaWeights LlamaWeights::from_gguf(const GGUFFile& file, const LlamaConfig& config) {
  config.validate();
  std::set<std::string, std::less<>> expected{"token_embd.weight", "output_norm.weight", "output.weight",
                                              "rope_freqs.weight"};
  static constexpr const char* per_layer[] = {"attn_norm", "attn_q",   "attn_k", "attn_v",  "attn_output",
                                              "ffn_norm",  "ffn_gate", "ffn_up", "ffn_down"};
  for (std::int64_t l = 0; l < config.n_layer; ++l)
    for (const char* name : per_layer) expected.insert(fmt::format("blk.{}.{}.weight", l, name));
  for (const GGUFTensorInfo& t : file.tensors()) {
    detail::require(expected.contains(t.name),
                    "LlamaWeights: GGUF tensor '{}' is not part of the supported Llama architecture ({} layers, no "
                    "biases or experts)",
                    t.name, config.n_layer);
  }

  const auto matrix = [&file](const std::string& name, std::int64_t rows, std::int64_t cols) {
    const GGUFTensorInfo& info = file.tensor(name);
    detail::require(info.dims.size() == 2 && info.dims[0] == cols && info.dims[1] == rows,
                    "LlamaWeights: GGUF tensor '{}' has dims [{}], expected [{}, {}] (in, out)", name,
                    fmt::join(info.dims, ", "), cols, rows);
    RowMatrix m(rows, cols);
    file.dequantize_into(info, std::span<float>(m.data(), static_cast<std::size_t>(m.size())));
    return m;
  };
  const auto vector = [&file](const std::string& name, std::int64_t size) {
    const GGUFTensorInfo& info = file.tensor(name);
    detail::require(info.dims.size() == 1 && info.dims[0] == size,
                    "LlamaWeights: GGUF tensor '{}' has dims [{}], expected [{}]", name, fmt::join(info.dims, ", "),
                    size);
    Eigen::VectorXf v(size);
    file.dequantize_into(info, std::span<float>(v.data(), static_cast<std::size_t>(v.size())));
    return v;
  };

  const std::int64_t e = config.n_embd;
  LlamaWeights w;
  w.token_embd = matrix("token_embd.weight", config.n_vocab, e);
  w.output_norm = vector("output_norm.weight", e);
  if (file.find_tensor("output.weight") != nullptr) w.output = matrix("output.weight", config.n_vocab, e);
  for (std::int64_t l = 0; l < config.n_layer; ++l) {
    const auto name = [l](const char* what) { return fmt::format("blk.{}.{}.weight", l, what); };
    LlamaLayerWeights layer;
    layer.attn_norm = vector(name("attn_norm"), e);
    layer.wq = matrix(name("attn_q"), config.q_dim(), e);
    layer.wk = matrix(name("attn_k"), config.kv_dim(), e);
    layer.wv = matrix(name("attn_v"), config.kv_dim(), e);
    layer.wo = matrix(name("attn_output"), e, config.q_dim());
    layer.ffn_norm = vector(name("ffn_norm"), e);
    layer.w_gate = matrix(name("ffn_gate"), config.n_ff, e);
    layer.w_up = matrix(name("ffn_up"), config.n_ff, e);
    layer.w_down = matrix(name("ffn_down"), e, config.n_ff);
    w.layers.push_back(std::move(layer));
  }
  w.validate(config);
  return w;
}

}  // namespace kvfuse
