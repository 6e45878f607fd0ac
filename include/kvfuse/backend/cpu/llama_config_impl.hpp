#pragma once
// The out-of-class member functions of backend/cpu/llama_config.hpp (the structs and what each does are there).
// llama_config.hpp includes this file at its end unless KVFUSE_CPU_SEPARATE_COMPILATION is defined
// (core/config.hpp).

#include "kvfuse/backend/cpu/llama_config.hpp"

namespace kvfuse {

KVFUSE_CPU_INLINE RopeFrequencyConfig LlamaConfig::rope_frequency_config(std::int64_t layer) const noexcept {
  RopeFrequencyConfig f;
  f.head_dim = head_dim;
  if (is_local(layer)) {
    f.base = rope_base_local;
    return f;
  }
  f.base = rope_base;
  f.scaling = rope_linear_factor == 1.0 ? RopeScaling::none : RopeScaling::linear;
  f.factor = rope_linear_factor;
  f.freq_factors = rope_freq_factors.empty() ? nullptr : rope_freq_factors.data();
  return f;
}

KVFUSE_CPU_INLINE std::vector<double> LlamaConfig::rope_theta(std::int64_t layer) const {
  std::vector<double> theta(static_cast<std::size_t>(head_dim / 2));
  const Status s = rope_frequencies(rope_frequency_config(layer), theta.data());
  detail::require(s == Status::success, "LlamaConfig: {}", last_status_message());
  return theta;
}

KVFUSE_CPU_INLINE void LlamaConfig::validate() const {
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
  detail::require(context_length >= 0, "LlamaConfig: context_length = {} must be >= 0 (0: unknown)",
                  context_length);
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
  validate_architecture();
}

KVFUSE_CPU_INLINE void LlamaConfig::validate_architecture() const {
  if (architecture == LlamaArchitecture::llama || architecture == LlamaArchitecture::qwen2) {
    const char* name = architecture == LlamaArchitecture::llama ? "llama" : "qwen2";
    detail::require(sliding_window == 0 && local_layers.empty() && embedding_scale == 1.0 && attention_scale == 0.0 &&
                        final_logit_softcap == 0.0,
                    "LlamaConfig: architecture {} has no sliding window, local layers, embedding scale, attention "
                    "scale or logit soft-cap (sliding_window = {}, {} local_layers, embedding_scale = {}, "
                    "attention_scale = {}, final_logit_softcap = {})",
                    name, sliding_window, local_layers.size(), embedding_scale, attention_scale, final_logit_softcap);
    detail::require(architecture == LlamaArchitecture::llama || rope_freq_factors.empty(),
                    "LlamaConfig: qwen2 has no rope_freq_factors (llama.cpp's qwen2 graph applies none); got {}",
                    rope_freq_factors.size());
    return;
  }
  detail::require(architecture == LlamaArchitecture::gemma3,
                  "LlamaConfig: architecture = {} is none of llama, gemma3 and qwen2",
                  static_cast<int>(architecture));
  detail::require(rope_freq_factors.empty(),
                  "LlamaConfig: gemma3 has no rope_freq_factors (llama.cpp's gemma3 graph applies none); got {}",
                  rope_freq_factors.size());
  detail::require(local_layers.empty() || static_cast<std::int64_t>(local_layers.size()) == n_layer,
                  "LlamaConfig: {} local_layers flags for n_layer = {}", local_layers.size(), n_layer);
  bool any_local = false;
  for (std::size_t l = 0; l < local_layers.size(); ++l) {
    detail::require(local_layers[l] <= 1, "LlamaConfig: local_layers[{}] = {} is neither 0 nor 1", l,
                    local_layers[l]);
    any_local = any_local || local_layers[l] != 0;
  }
  detail::require(sliding_window >= 0 && (!any_local || sliding_window >= 1),
                  "LlamaConfig: sliding_window = {} must be >= 0, and >= 1 when a layer is local", sliding_window);
  detail::require(std::isfinite(rope_base_local) && rope_base_local > 0,
                  "LlamaConfig: rope_base_local = {} must be finite and > 0", rope_base_local);
  detail::require(std::isfinite(embedding_scale) && embedding_scale > 0,
                  "LlamaConfig: embedding_scale = {} must be finite and > 0", embedding_scale);
  detail::require(std::isfinite(attention_scale) && attention_scale >= 0,
                  "LlamaConfig: attention_scale = {} must be finite and >= 0 (0: 1 / sqrt(head_dim))",
                  attention_scale);
  detail::require(std::isfinite(final_logit_softcap) && final_logit_softcap >= 0,
                  "LlamaConfig: final_logit_softcap = {} must be finite and >= 0 (0: none)", final_logit_softcap);
}

KVFUSE_CPU_INLINE LlamaConfig LlamaConfig::from_gguf(const GGUFFile& file) {
  const std::string& arch = file.get_string("general.architecture");
  detail::require(arch == "llama" || arch == "gemma3" || arch == "qwen2",
                  "LlamaConfig: GGUF architecture '{}' is not supported (only 'llama', 'gemma3' and 'qwen2')", arch);
  const auto key = [&arch](std::string_view name) { return fmt::format("{}.{}", arch, name); };
  const auto u32 = [&file](const std::string& k) { return static_cast<std::int64_t>(file.get_u32(k)); };
  LlamaConfig c;
  c.architecture = arch == "gemma3"  ? LlamaArchitecture::gemma3
                   : arch == "qwen2" ? LlamaArchitecture::qwen2
                                     : LlamaArchitecture::llama;
  c.n_layer = u32(key("block_count"));
  c.n_embd = u32(key("embedding_length"));
  c.n_ff = u32(key("feed_forward_length"));
  c.context_length = file.get_u32(key("context_length"), 0);
  c.n_head = u32(key("attention.head_count"));
  detail::require(c.n_head >= 1, "LlamaConfig: {} = {} must be at least 1", key("attention.head_count"), c.n_head);
  c.n_head_kv = file.contains(key("attention.head_count_kv")) ? u32(key("attention.head_count_kv")) : c.n_head;
  if (file.contains(key("attention.key_length"))) {
    c.head_dim = u32(key("attention.key_length"));
  } else {
    detail::require(c.n_embd % c.n_head == 0,
                    "LlamaConfig: {} = {} is not a multiple of {} = {} and {} is absent", key("embedding_length"),
                    c.n_embd, key("attention.head_count"), c.n_head, key("attention.key_length"));
    c.head_dim = c.n_embd / c.n_head;
  }
  if (file.contains(key("attention.value_length"))) {
    detail::require(u32(key("attention.value_length")) == c.head_dim,
                    "LlamaConfig: {} = {} differs from the key length {} (not supported)",
                    key("attention.value_length"), u32(key("attention.value_length")), c.head_dim);
  }
  const std::int64_t rot = file.contains(key("rope.dimension_count")) ? u32(key("rope.dimension_count")) : c.head_dim;
  detail::require(rot == c.head_dim,
                  "LlamaConfig: partial rotary embedding ({} = {}, head_dim = {}) is not supported",
                  key("rope.dimension_count"), rot, c.head_dim);
  if (file.contains(key("expert_count"))) {
    detail::require(u32(key("expert_count")) == 0, "LlamaConfig: mixture of experts ({} = {}) is not supported",
                    key("expert_count"), u32(key("expert_count")));
  }
  c.rope_base = file.get_f32(key("rope.freq_base"), 10000.0f);
  c.rms_eps = file.get_f32(key("attention.layer_norm_rms_epsilon"));
  if (file.contains(key("vocab_size"))) {
    c.n_vocab = u32(key("vocab_size"));
  } else {
    const GGUFTensorInfo& embd = file.tensor("token_embd.weight");
    detail::require(embd.dims.size() == 2, "LlamaConfig: token_embd.weight has {} dims, expected 2", embd.dims.size());
    c.n_vocab = embd.dims[1];
  }
  const std::string scaling =
      file.contains(key("rope.scaling.type")) ? file.get_string(key("rope.scaling.type")) : std::string("none");
  if (scaling == "linear") {
    c.rope_linear_factor = file.get_f32(key("rope.scaling.factor"));
  } else {
    detail::require(scaling == "none",
                    "LlamaConfig: RoPE scaling type '{}' is not supported (only 'none', 'linear' and rope_freqs "
                    "factors)",
                    scaling);
    // Older files give linear scaling as {arch}.rope.scale_linear.
    c.rope_linear_factor = file.get_f32(key("rope.scale_linear"), 1.0f);
  }
  if (c.architecture == LlamaArchitecture::llama) {
    if (const GGUFTensorInfo* freqs = file.find_tensor("rope_freqs.weight")) {
      detail::require(freqs->n_elements() == c.head_dim / 2,
                      "LlamaConfig: rope_freqs.weight holds {} factors, expected head_dim / 2 = {}",
                      freqs->n_elements(), c.head_dim / 2);
      c.rope_freq_factors = file.dequantize(*freqs);
    }
    c.rope_pairing = RopePairing::interleaved;  // llama.cpp LLAMA_ROPE_TYPE_NORM for LLM_ARCH_LLAMA
  } else if (c.architecture == LlamaArchitecture::qwen2) {
    c.rope_pairing = RopePairing::half_split;  // llama_model_rope_type: LLAMA_ROPE_TYPE_NEOX for LLM_ARCH_QWEN2
  } else {
    c.read_gemma3(file);
  }
  c.validate();
  return c;
}

// llama.cpp llama_model_gemma3::load_arch_hparams and its graph, in the terms of LlamaConfig.
KVFUSE_CPU_INLINE void LlamaConfig::read_gemma3(const GGUFFile& file) {
  const auto key = [](std::string_view name) { return fmt::format("gemma3.{}", name); };
  rope_pairing = RopePairing::half_split;  // llama_model_rope_type: LLAMA_ROPE_TYPE_NEOX for LLM_ARCH_GEMMA3
  // llama.cpp rounds these to float: the input scale sqrtf(n_embd) and f_attention_scale, which is
  // 1 / sqrt(n_embd / n_head) (integer division) for the 62-layer 27B and 1 / sqrt(head_dim) otherwise
  // (gemma_pytorch's query_pre_attn_scalar).
  embedding_scale = std::sqrt(static_cast<float>(n_embd));
  attention_scale = 1.0f / std::sqrt(static_cast<float>(n_layer == 62 ? n_embd / n_head : head_dim));
  final_logit_softcap = file.get_f32(key("final_logit_softcapping"), 0.0f);
  // Head sizes and rotary dimensions of the local layers, where given, must be the global ones.
  const std::pair<const char*, std::int64_t> same[] = {{"attention.key_length_swa", head_dim},
                                                       {"attention.value_length_swa", head_dim},
                                                       {"rope.dimension_count_swa", head_dim}};
  for (const auto& [name, expected] : same) {
    if (!file.contains(key(name))) continue;
    const std::int64_t value = file.get_u32(key(name));
    detail::require(value == expected, "LlamaConfig: {} = {} differs from the global layers' {} (not supported)",
                    key(name), value, expected);
  }
  // No window (absent or 0): every layer global (llama.cpp LLAMA_SWA_TYPE_NONE), rope.freq_base_swa unused.
  sliding_window = file.get_u32(key("attention.sliding_window"), 0);
  if (sliding_window == 0) return;
  rope_base_local = file.get_f32(key("rope.freq_base_swa"), 10000.0f);  // llama.cpp rope_freq_base_train_swa
  // llama.cpp load_swa_pattern: a per-layer array (bool, uint32 or int32; nonzero = local), else the period
  // n of set_swa_pattern (default 6): layer l is local iff n == 0 or l % n < n − 1.
  const std::string pattern_key = key("attention.sliding_window_pattern");
  local_layers.assign(static_cast<std::size_t>(n_layer), 0);
  const GGUFValue* pattern = file.find(pattern_key);
  if (const auto* array = pattern != nullptr ? std::get_if<GGUFArray>(pattern) : nullptr) {
    detail::require(static_cast<std::int64_t>(array->size()) == n_layer,
                    "LlamaConfig: {} holds {} entries for {} layers", pattern_key, array->size(), n_layer);
    const auto flags = [this](const auto& values) {
      for (std::size_t l = 0; l < values.size(); ++l) local_layers[l] = values[l] ? 1 : 0;
    };
    if (const auto* b = std::get_if<std::vector<bool>>(&array->values)) {
      flags(*b);
    } else if (const auto* u = std::get_if<std::vector<std::uint32_t>>(&array->values)) {
      flags(*u);
    } else if (const auto* i = std::get_if<std::vector<std::int32_t>>(&array->values)) {
      flags(*i);
    } else {
      throw error(fmt::format("LlamaConfig: {} is an {}; llama.cpp reads a per-layer array of bool, uint32 or int32, "
                              "or one integer period",
                              pattern_key, gguf_type_name(*pattern)));
    }
    return;
  }
  const std::int64_t period = pattern != nullptr ? file.get_u32(pattern_key) : 6;
  for (std::int64_t l = 0; l < n_layer; ++l)
    local_layers[static_cast<std::size_t>(l)] = period == 0 || l % period < period - 1 ? 1 : 0;
}

KVFUSE_CPU_INLINE LlamaWeights LlamaWeights::from_gguf(const GGUFFile& file, const LlamaConfig& config) {
  config.validate();
  const bool gemma3 = config.architecture == LlamaArchitecture::gemma3;
  const bool qwen2 = config.architecture == LlamaArchitecture::qwen2;
  std::set<std::string, std::less<>> expected{"token_embd.weight", "output_norm.weight", "output.weight"};
  if (config.architecture == LlamaArchitecture::llama) expected.insert("rope_freqs.weight");
  static constexpr const char* per_layer[] = {"attn_norm", "attn_q",   "attn_k", "attn_v",  "attn_output",
                                              "ffn_norm",  "ffn_gate", "ffn_up", "ffn_down"};
  static constexpr const char* per_layer_gemma3[] = {"attn_q_norm", "attn_k_norm", "post_attention_norm",
                                                     "post_ffw_norm"};
  static constexpr const char* per_layer_qwen2_bias[] = {"attn_q", "attn_k", "attn_v"};
  for (std::int64_t l = 0; l < config.n_layer; ++l) {
    for (const char* name : per_layer) expected.insert(fmt::format("blk.{}.{}.weight", l, name));
    if (gemma3)
      for (const char* name : per_layer_gemma3) expected.insert(fmt::format("blk.{}.{}.weight", l, name));
    if (qwen2)
      for (const char* name : per_layer_qwen2_bias) expected.insert(fmt::format("blk.{}.{}.bias", l, name));
  }
  for (const GGUFTensorInfo& t : file.tensors()) {
    if (gemma3) {
      detail::require(expected.contains(t.name),
                      "LlamaWeights: GGUF tensor '{}' is not part of the supported gemma3 architecture ({} layers, no "
                      "biases, rope_freqs or EmbeddingGemma dense_2 / dense_3 projections)",
                      t.name, config.n_layer);
    } else if (qwen2) {
      detail::require(expected.contains(t.name),
                      "LlamaWeights: GGUF tensor '{}' is not part of the supported qwen2 architecture ({} layers, "
                      "biases of attn_q, attn_k and attn_v only, no rope_freqs or experts)",
                      t.name, config.n_layer);
    } else {
      detail::require(expected.contains(t.name),
                      "LlamaWeights: GGUF tensor '{}' is not part of the supported Llama architecture ({} layers, no "
                      "biases or experts)",
                      t.name, config.n_layer);
    }
  }

  const auto matrix = [&file](const std::string& name, std::int64_t rows, std::int64_t cols) {
    const GGUFTensorInfo& info = file.tensor(name);
    detail::require(info.dims.size() == 2 && info.dims[0] == cols && info.dims[1] == rows,
                    "LlamaWeights: GGUF tensor '{}' has dims [{}], expected [{}, {}] (in, out)", name,
                    fmt::join(info.dims, ", "), cols, rows);
    WeightMatrix w;
    if (info.type != GGMLType::f32) {
      w = WeightMatrix::from_blocks(info.type, rows, cols, file.raw(info));
    } else {
      RowMatrix m(rows, cols);
      file.dequantize_into(info, std::span<float>(m.data(), static_cast<std::size_t>(m.size())));
      w = WeightMatrix(std::move(m));
    }
    file.release_pages(file.raw(info));  // copied: the mapped pages need not stay resident beside the copy
    return w;
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
    if (gemma3) {
      layer.attn_q_norm = vector(name("attn_q_norm"), config.head_dim);
      layer.attn_k_norm = vector(name("attn_k_norm"), config.head_dim);
      layer.attn_post_norm = vector(name("post_attention_norm"), e);
      layer.ffn_post_norm = vector(name("post_ffw_norm"), e);
    }
    if (qwen2) {
      const auto bias = [l](const char* what) { return fmt::format("blk.{}.{}.bias", l, what); };
      layer.bq = vector(bias("attn_q"), config.q_dim());
      layer.bk = vector(bias("attn_k"), config.kv_dim());
      layer.bv = vector(bias("attn_v"), config.kv_dim());
    }
    w.layers.push_back(std::move(layer));
  }
  w.validate(config);
  return w;
}

KVFUSE_CPU_INLINE void LlamaWeights::validate(const LlamaConfig& config) const {
  const auto matrix = [](const WeightMatrix& m, std::int64_t rows, std::int64_t cols, const std::string& name) {
    detail::require(m.rows() == rows && m.cols() == cols, "LlamaWeights: {} is {} x {}, expected {} x {}", name,
                    m.rows(), m.cols(), rows, cols);
    detail::require(m.all_finite(), "LlamaWeights: {} holds a value that is not finite", name);
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
    if (config.architecture == LlamaArchitecture::gemma3) {
      vector(w.attn_q_norm, config.head_dim, at + "attn_q_norm");
      vector(w.attn_k_norm, config.head_dim, at + "attn_k_norm");
      vector(w.attn_post_norm, e, at + "attn_post_norm");
      vector(w.ffn_post_norm, e, at + "ffn_post_norm");
    } else {
      detail::require(w.attn_q_norm.size() == 0 && w.attn_k_norm.size() == 0 && w.attn_post_norm.size() == 0 &&
                          w.ffn_post_norm.size() == 0,
                      "LlamaWeights: {}has gemma3 norms (attn_q_norm, attn_k_norm, attn_post_norm, ffn_post_norm), "
                      "which architecture {} does not have",
                      at, config.architecture == LlamaArchitecture::llama ? "llama" : "qwen2");
    }
    if (config.architecture == LlamaArchitecture::qwen2) {
      vector(w.bq, config.q_dim(), at + "bq");
      vector(w.bk, config.kv_dim(), at + "bk");
      vector(w.bv, config.kv_dim(), at + "bv");
    } else {
      detail::require(w.bq.size() == 0 && w.bk.size() == 0 && w.bv.size() == 0,
                      "LlamaWeights: {}has Q / K / V biases (bq, bk, bv), which only architecture qwen2 has", at);
    }
  }
}

KVFUSE_CPU_INLINE LlamaWeights LlamaWeights::random(const LlamaConfig& config, std::uint64_t seed) {
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
  const auto bias = [&](std::int64_t size) {
    Eigen::VectorXf v(size);
    for (std::int64_t i = 0; i < size; ++i) v[i] = 0.5f * uniform();
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
    if (config.architecture == LlamaArchitecture::gemma3) {
      layer.attn_q_norm = norm(config.head_dim);
      layer.attn_k_norm = norm(config.head_dim);
      layer.attn_post_norm = norm(e);
      layer.ffn_post_norm = norm(e);
    }
    if (config.architecture == LlamaArchitecture::qwen2) {
      layer.bq = bias(config.q_dim());
      layer.bk = bias(config.kv_dim());
      layer.bv = bias(config.kv_dim());
    }
    w.layers.push_back(std::move(layer));
  }
  return w;
}

}  // namespace kvfuse
