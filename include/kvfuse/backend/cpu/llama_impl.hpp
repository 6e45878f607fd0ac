#pragma once
// CpuLlama's member functions (the class and what each does: backend/cpu/llama.hpp). llama.hpp includes this file
// at its end, so the engine stays header-only; with KVFUSE_CPU_SEPARATE_COMPILATION defined it does not, and one
// translation unit compiles them (src/cpu.cpp, the kvfuse_cpu_compiled target kvfuse's own binaries link), so
// that the forward pass is not compiled again in every file that uses the engine.

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <numeric>
#include <span>
#include <utility>
#include <vector>

#include "kvfuse/backend/cpu/llama.hpp"
#include "kvfuse/backend/cpu/quantized_gemv.hpp"
#include "kvfuse/core/hash.hpp"
#include "kvfuse/core/sampling.hpp"
#include "kvfuse/detail/attention.hpp"
#include "kvfuse/detail/cpu_kernels.hpp"
#include "kvfuse/detail/kv_deviation.hpp"
#include "kvfuse/detail/math.hpp"
#include "kvfuse/detail/rope.hpp"

namespace kvfuse {

KVFUSE_CPU_INLINE CpuLlama CpuLlama::from_gguf(const GGUFFile& file, CpuLlamaOptions options) {
  options.validate();  // before the weights are read: a refused option costs no load
  LlamaConfig config = LlamaConfig::from_gguf(file);
  LlamaWeights weights = LlamaWeights::from_gguf(file, config);
  file.release_pages();  // the weights are copied: the file's pages need not stay resident beside them
  return CpuLlama(std::move(config), std::move(weights), options);
}

KVFUSE_CPU_INLINE std::vector<float> CpuLlama::compute_rows(LlamaKVCache& kv, TokenRange r,
                                                            std::span<const token_id> r_tokens,
                                                            bool want_logits) const {
  check_kv(kv, "CpuLlama::compute_rows");
  validate_range(r, kv.num_rows(), "CpuLlama::compute_rows");
  detail::require(!r.empty() && r_tokens.size() == static_cast<std::size_t>(r.size()),
                  "CpuLlama::compute_rows: rows {} with {} tokens", r, r_tokens.size());
  TokenSet rows;
  append_range(rows, r);
  return run(kv, std::move(rows), r_tokens, nullptr, nullptr, want_logits, nullptr);
}

KVFUSE_CPU_INLINE std::vector<float> CpuLlama::compute_all_rows(LlamaKVCache& kv, std::span<const token_id> tokens,
                                                                bool want_logits) const {
  const std::int64_t n = kv.num_rows();
  const std::int64_t block = options_.prefill_block_rows == 0 ? n : options_.prefill_block_rows;
  std::vector<float> logits;
  // Chunked prefill: each block attends to the rows of the blocks before it.
  for (std::int64_t b = 0; b < n; b += block) {
    const TokenRange r{b, std::min(n, b + block)};
    logits = compute_rows(kv, r, tokens.subspan(static_cast<std::size_t>(b), static_cast<std::size_t>(r.size())),
                          want_logits && r.end == n);
  }
  return logits;
}

KVFUSE_CPU_INLINE LlamaPrefill CpuLlama::full_prefill(std::span<const token_id> tokens) const {
  detail::require(!tokens.empty(), "CpuLlama::full_prefill: no tokens");
  LlamaPrefill out{prefill_kv(tokens, 0, "CpuLlama::full_prefill"), {}};
  out.logits = compute_all_rows(out.kv, tokens, true);
  return out;
}

KVFUSE_CPU_INLINE LlamaKVCache CpuLlama::prefill_chunk(std::span<const token_id> tokens,
                                                       std::int64_t first_position) const {
  detail::require(first_position >= 0, "CpuLlama::prefill_chunk: first_position {} is negative", first_position);
  LlamaKVCache kv = prefill_kv(tokens, first_position, "CpuLlama::prefill_chunk");
  if (!tokens.empty()) (void)compute_all_rows(kv, tokens, false);
  return kv;
}

KVFUSE_CPU_INLINE void CpuLlama::rope_shift(LlamaKVCache& kv, TokenRange rows, std::int64_t delta) const {
  check_kv(kv, "CpuLlama::rope_shift");
  validate_range(rows, kv.num_rows(), "CpuLlama::rope_shift");
  for (std::int64_t r = rows.begin; r < rows.end; ++r) {
    const std::int64_t p = kv.positions[static_cast<std::size_t>(r)];
    detail::require(p + delta >= 0, "CpuLlama::rope_shift: row {} at position {} would move to {}", r, p, p + delta);
  }
  for (std::int64_t l = 0; l < config_.n_layer; ++l) rope_shift_layer(kv, l, rows, delta);
  for (std::int64_t r = rows.begin; r < rows.end; ++r) kv.positions[static_cast<std::size_t>(r)] += delta;
}

KVFUSE_CPU_INLINE void CpuLlama::rope_shift_layer(LlamaKVCache& kv, std::int64_t layer, TokenRange rows,
                                                  std::int64_t delta) const {
  check_kv(kv, "CpuLlama::rope_shift_layer");
  validate_range(rows, kv.num_rows(), "CpuLlama::rope_shift_layer");
  detail::require(layer >= 0 && layer < config_.n_layer, "CpuLlama::rope_shift_layer: layer {} of {}", layer,
                  config_.n_layer);
  const std::int64_t hd = config_.head_dim;
  const std::vector<double> theta = config_.rope_theta(layer);
  std::vector<float> cos_d(theta.size());
  std::vector<float> sin_d(theta.size());
  detail::rope_cos_sin(theta.data(), hd / 2, static_cast<double>(delta), cos_d.data(), sin_d.data());
  for (std::int64_t r = rows.begin; r < rows.end; ++r) {
    float* k = kv.k_row(layer, r);
    for (std::int64_t g = 0; g < config_.n_head_kv; ++g)
      detail::rope_rotate_head(k + g * hd, hd, config_.rope_pairing, cos_d.data(), sin_d.data());
  }
}

KVFUSE_CPU_INLINE PartialPrefillResult CpuLlama::partial_prefill(std::span<const token_id> tokens, LlamaKVCache& merged,
    const TokenSet& initial, const SelectionPolicy& policy, const PartialPrefillOptions& options) const {
  check_kv(merged, "CpuLlama::partial_prefill");
  const auto n = static_cast<std::int64_t>(tokens.size());
  detail::require(n >= 1, "CpuLlama::partial_prefill: no tokens");
  detail::require(merged.num_rows() == n, "CpuLlama::partial_prefill: {} tokens but the merged KV holds {} rows", n,
                  merged.num_rows());
  check_tokens(tokens, "CpuLlama::partial_prefill");
  check_selection(initial, n, "CpuLlama::partial_prefill: initial set");
  detail::require(!initial.empty() && initial.back() == n - 1,
                  "CpuLlama::partial_prefill: the initial set must contain the last row {} (its logits are the "
                  "result)",
                  n - 1);
  if (options.attention_groups != nullptr) {
    options.attention_groups->validate();
    detail::require(options.attention_groups->num_tokens() == n,
                    "CpuLlama::partial_prefill: attention groups cover {} tokens, the prompt has {}",
                    options.attention_groups->num_tokens(), n);
  }
  validate_range(options.query_mass_rows, n, "CpuLlama::partial_prefill: query_mass_rows");
  std::vector<token_id> initial_tokens(initial.size());
  for (std::size_t i = 0; i < initial.size(); ++i) initial_tokens[i] = tokens[static_cast<std::size_t>(initial[i])];
  PartialPrefillResult result;
  const SelectionPolicy keep = [](const LayerReport& r) { return r.selected; };
  result.logits = run(merged, initial, initial_tokens, policy ? &policy : &keep, options.attention_groups, true,
                      &result.selected_per_layer, options.before_layer ? &options.before_layer : nullptr,
                      options.query_mass_rows);
  return result;
}

KVFUSE_CPU_INLINE TokenSet CpuLlama::append_rows(LlamaKVCache& kv, std::span<const token_id> tokens) const {
  check_kv(kv, "CpuLlama::extend");
  detail::require(!tokens.empty(), "CpuLlama::extend: no tokens");
  const std::int64_t first =
      kv.positions.empty() ? 0 : *std::max_element(kv.positions.begin(), kv.positions.end()) + 1;
  LlamaKVCache added = prefill_kv(tokens, first, "CpuLlama::extend");
  const std::int64_t begin = kv.num_rows();
  kv.append(added);
  TokenSet rows(tokens.size());
  std::iota(rows.begin(), rows.end(), begin);
  return rows;
}

KVFUSE_CPU_INLINE std::vector<token_id> CpuLlama::greedy_decode(LlamaKVCache& kv, std::span<const float> last_logits,
    std::int64_t max_new_tokens, token_id eos) const {
  detail::require(static_cast<std::int64_t>(last_logits.size()) == config_.n_vocab,
                  "CpuLlama::greedy_decode: {} logits for a vocabulary of {}", last_logits.size(), config_.n_vocab);
  detail::require(max_new_tokens >= 0, "CpuLlama::greedy_decode: max_new_tokens = {} is negative", max_new_tokens);
  return greedy_tokens(last_logits, max_new_tokens, eos,
                       [&](token_id t) { return extend(kv, std::span<const token_id>(&t, 1)); });
}

KVFUSE_CPU_INLINE std::vector<std::vector<float>> CpuLlama::forced_logits(LlamaKVCache& kv,
    std::span<const float> last_logits, std::span<const token_id> tokens) const {
  detail::require(static_cast<std::int64_t>(last_logits.size()) == config_.n_vocab,
                  "CpuLlama::forced_logits: {} logits for a vocabulary of {}", last_logits.size(), config_.n_vocab);
  std::vector<std::vector<float>> out;
  if (tokens.empty()) return out;
  out.emplace_back(last_logits.begin(), last_logits.end());
  for (std::size_t i = 0; i + 1 < tokens.size(); ++i) out.push_back(extend(kv, tokens.subspan(i, 1)));
  return out;
}

KVFUSE_CPU_INLINE LlamaKVCache CpuLlama::prefill_kv(std::span<const token_id> tokens, std::int64_t first_position,
                                                    const char* what) const {
  check_tokens(tokens, what);
  check_context(first_position + static_cast<std::int64_t>(tokens.size()) - 1);  // before the caller's kv grows
  LlamaKVCache kv(config_.n_layer, config_.kv_dim(), static_cast<std::int64_t>(tokens.size()));
  for (std::size_t r = 0; r < tokens.size(); ++r) kv.positions[r] = first_position + static_cast<std::int64_t>(r);
  return kv;
}

KVFUSE_CPU_INLINE void CpuLlama::check_context(std::int64_t last) const {
  if (config_.context_length == 0 || options_.allow_beyond_context) return;
  detail::require_code(last < config_.context_length, Status::beyond_context,
                  "CpuLlama: the prompt reaches position {} ({} tokens), beyond the model's trained context of {} "
                  "tokens (LlamaConfig::context_length); refused, as its output would not be trustworthy "
                  "(CpuLlamaOptions::allow_beyond_context runs it anyway)",
                  last, last + 1, config_.context_length);
}

KVFUSE_CPU_INLINE void CpuLlama::check_tokens(std::span<const token_id> tokens, const char* what) const {
  for (std::size_t i = 0; i < tokens.size(); ++i) {
    detail::require(tokens[i] >= 0 && tokens[i] < config_.n_vocab,
                    "{}: token {} at index {} is outside the vocabulary [0, {})", what, tokens[i], i,
                    config_.n_vocab);
  }
}

KVFUSE_CPU_INLINE void CpuLlama::check_kv(const LlamaKVCache& kv, const char* what) const {
  detail::require(kv.num_layers() == config_.n_layer && kv.kv_dim == config_.kv_dim(),
                  "{}: KV cache of {} layers x {} does not fit the model ({} layers x {})", what, kv.num_layers(),
                  kv.kv_dim, config_.n_layer, config_.kv_dim());
  kv.check_shape(what);
}

KVFUSE_CPU_INLINE void CpuLlama::check_selection(const TokenSet& set, std::int64_t n, const char* what) {
  for (std::size_t i = 0; i < set.size(); ++i) {
    detail::require(set[i] >= 0 && set[i] < n, "{}: row {} (entry {}) is outside [0, {})", what, set[i], i, n);
    // Not set[i - 1] for i == 0 (the message's arguments are evaluated before the check).
    if (i > 0) {
      detail::require(set[i] > set[i - 1], "{}: row {} (entry {}) is not above the previous row {}", what, set[i], i,
                      set[i - 1]);
    }
  }
}

KVFUSE_CPU_INLINE void CpuLlama::project(const RowMatrix& x, const WeightMatrix& w, RowMatrix& y,
                                         std::vector<float>& panels) const {
  if (options_.products == CpuProducts::bf16) {
    project_bf16(x, w, y);
    return;
  }
  const std::int64_t m = x.rows();
  const std::int64_t out = w.rows();
  const std::int64_t k = w.cols();
  y.resize(m, out);
  const std::int64_t n_panels = (out + detail::kPanelWidth - 1) / detail::kPanelWidth;
  const bool few_rows = m <= detail::kRowBlock;
  if (!few_rows) panels.resize(static_cast<std::size_t>(detail::packed_size(k, out)));
  // Split by multiply-adds only: a one-row projection (decoding) stays on the calling thread, as its ~0.1 ms
  // would otherwise wait for a worker to wake, a scheduler time slice when other processes share the cores.
  const std::int64_t tasks = tasks_for(m * out * k, n_panels);
  pool_->parallel_for(tasks, [&](std::int64_t t) {
    const std::int64_t c0 = n_panels * t / tasks * detail::kPanelWidth;
    const std::int64_t c1 = std::min(out, n_panels * (t + 1) / tasks * detail::kPanelWidth);
    if (!few_rows) {
      float* mine = panels.data() + c0 * k;
      pack_weight_rows(w, c0, c1, mine);
      detail::gemm_packed(x.data(), k, m, k, mine, c1 - c0, y.data() + c0, out);
      return;
    }
    thread_local std::vector<float> panel;
    panel.resize(static_cast<std::size_t>(detail::kPanelWidth * k));
    for (std::int64_t c = c0; c < c1; c += detail::kPanelWidth) {
      const std::int64_t n = std::min(detail::kPanelWidth, c1 - c);
      pack_weight_rows(w, c, c + n, panel.data());
      detail::gemm_packed(x.data(), k, m, k, panel.data(), n, y.data() + c, out);
    }
  });
}

KVFUSE_CPU_INLINE void CpuLlama::project_bf16(const RowMatrix& x, const WeightMatrix& w, RowMatrix& y) const {
  const std::int64_t m = x.rows();
  const std::int64_t out = w.rows();
  const std::int64_t k = w.cols();
  const std::int64_t kp = detail::amx_padded_k(k);
  const auto packed =
      std::find_if(bf16_panels_.begin(), bf16_panels_.end(), [&](const auto& e) { return e.first == &w; });
  detail::require(packed != bf16_panels_.end(), "CpuLlama: a {} x {} projection without bf16 panels", out, k);
  const bf16* const panels = packed->second.data();
  y.resize(m, out);
  thread_local std::vector<bf16> x_rows;  // of the calling thread, reached by the tasks through a pointer
  x_rows.resize(static_cast<std::size_t>(detail::amx_padded_rows(m) * kp));
  bf16* const a = x_rows.data();
  rows_in_parallel(m, k, [&](Eigen::Index i) { detail::amx_round_row(x.row(i).data(), k, a + i * kp); });
  std::fill(a + m * kp, a + detail::amx_padded_rows(m) * kp, bf16{});
  // Tasks of whole pairs of panels (the kernel's 32-column blocks).
  constexpr std::int64_t unit = 2 * detail::kAmxPanel;
  const std::int64_t units = (out + unit - 1) / unit;
  const std::int64_t tasks = tasks_for(m * out * k, units);
  pool_->parallel_for(tasks, [&](std::int64_t t) {
    const std::int64_t c0 = units * t / tasks * unit;
    const std::int64_t c1 = std::min(out, units * (t + 1) / tasks * unit);
    if (c0 >= c1) return;
    const bool done = detail::gemm_bf16(a, m, k, panels + c0 * kp, c1 - c0, y.data() + c0, out);
    detail::require(done, "CpuLlama: bf16 products without AMX");  // CpuLlamaOptions::validate refused that
  });
}

KVFUSE_CPU_INLINE void CpuLlama::pack_projections_bf16() {
  std::vector<const WeightMatrix*> all;
  for (const LlamaLayerWeights& w : weights_.layers)
    for (const WeightMatrix* m : w.projections()) all.push_back(m);
  bf16_panels_.resize(all.size());
  pool_->parallel_for(static_cast<std::int64_t>(all.size()), [&](std::int64_t i) {
    const WeightMatrix& w = *all[static_cast<std::size_t>(i)];
    const std::int64_t k = w.cols();
    std::vector<bf16> panels(static_cast<std::size_t>(detail::amx_packed_size(k, w.rows())));
    std::vector<bf16> scratch(static_cast<std::size_t>(detail::amx_pack_scratch(k)));
    std::vector<float> rows(static_cast<std::size_t>(detail::kAmxPanel * k));
    for (std::int64_t r = 0; r < w.rows(); r += detail::kAmxPanel) {
      const std::int64_t n = std::min(detail::kAmxPanel, w.rows() - r);
      w.dequantize_rows(r, n, rows.data());
      detail::amx_pack_transposed(rows.data(), k, n, k, panels.data() + r * detail::amx_padded_k(k), scratch.data());
    }
    bf16_panels_[static_cast<std::size_t>(i)] = {&w, std::move(panels)};
  });
}

KVFUSE_CPU_INLINE void CpuLlama::pack_weight_rows(const WeightMatrix& w, std::int64_t r0, std::int64_t r1,
                                                  float* panels) {
  const std::int64_t k = w.cols();
  if (w.is_f32()) {
    detail::pack_transposed(w.values().data() + r0 * k, k, r1 - r0, k, panels);
    return;
  }
  thread_local std::vector<float> rows;
  rows.resize(static_cast<std::size_t>(detail::kPanelWidth * k));
  for (std::int64_t r = r0; r < r1; r += detail::kPanelWidth) {
    const std::int64_t n = std::min(detail::kPanelWidth, r1 - r);
    w.dequantize_rows(r, n, rows.data());
    detail::pack_transposed(rows.data(), k, n, k, panels + (r - r0) * k);
  }
}

KVFUSE_CPU_INLINE void CpuLlama::matvec_rows(const WeightMatrix& w, std::int64_t r0, std::int64_t r1,
                                             const RowMatrix& xs, std::span<float* const> ys) {
  const std::int64_t k = w.cols();
  if (w.is_f32()) {
    for (std::size_t i = 0; i < ys.size(); ++i)
      detail::gemv(w.values().data() + r0 * k, k, r1 - r0, k, xs.row(static_cast<Eigen::Index>(i)).data(), ys[i]);
    return;
  }
  std::vector<const float*> xp(ys.size());
  for (std::size_t i = 0; i < ys.size(); ++i) xp[i] = xs.row(static_cast<Eigen::Index>(i)).data();
  if (detail::gemv_blocks_cpu(w.type(), w.row_blocks(r0), w.row_bytes(), r1 - r0, k, xp.data(),
                              static_cast<std::int64_t>(ys.size()), ys.data()))
    return;
  thread_local std::vector<float> rows;
  rows.resize(static_cast<std::size_t>(kHeadTile * k));
  for (std::int64_t r = r0; r < r1; r += kHeadTile) {
    const std::int64_t n = std::min(kHeadTile, r1 - r);
    w.dequantize_rows(r, n, rows.data());
    for (std::size_t i = 0; i < ys.size(); ++i)
      detail::gemv(rows.data(), k, n, k, xs.row(static_cast<Eigen::Index>(i)).data(), ys[i] + (r - r0));
  }
}

KVFUSE_CPU_INLINE void CpuLlama::rms_norm_heads(RowMatrix& x, std::int64_t heads, const Eigen::VectorXf& weight) const {
  const std::int64_t hd = config_.head_dim;
  for (Eigen::Index i = 0; i < x.rows(); ++i) {
    for (std::int64_t head = 0; head < heads; ++head) {
      auto v = x.row(i).segment(head * hd, hd);
      v = (v * rms_scale(v)).cwiseProduct(weight.transpose());
    }
  }
}

KVFUSE_CPU_INLINE void CpuLlama::attention(std::int64_t layer, const LlamaKVCache& kv, const TokenSet& sel,
                                           const RowMatrix& q, RowMatrix& out,
                                           const std::vector<GroupRun>* group_runs, std::int64_t num_groups,
                                           LayerAttention* stats, TokenRange query,
                                           std::vector<float>* query_mass,
                                           std::vector<float>* row_query_mass) const {
  using StridedMap = Eigen::Map<const RowMatrix, 0, Eigen::OuterStride<>>;
  const auto s = static_cast<std::int64_t>(sel.size());
  const std::int64_t hd = config_.head_dim;
  const std::int64_t qd = config_.q_dim();
  const std::int64_t kvd = config_.kv_dim();
  const std::int64_t n_head = config_.n_head;
  const std::int64_t group = config_.group_size();
  const std::int64_t bs = options_.query_block;
  const std::int64_t blocks = (s + bs - 1) / bs;
  const std::vector<std::int64_t>& pos = kv.positions;
  const auto n_rows = static_cast<std::int64_t>(pos.size());

  const std::int64_t window = config_.attention_window(layer);  // 0 on a global layer

  // Rows a block of queries can see all lie in [first[b], keys[b]): keys[b] is one past the last row at a
  // position <= the block's highest query position (rows after it are masked for every query of the
  // block); on a sliding-window layer first[b] skips the leading rows at positions <= the block's lowest
  // query position − window (masked for every query of the block as well). A query's own row lies inside.
  std::vector<std::int64_t> first(static_cast<std::size_t>(blocks), 0);
  std::vector<std::int64_t> keys(static_cast<std::size_t>(blocks));
  for (std::int64_t b = 0; b < blocks; ++b) {
    std::int64_t max_pos = std::numeric_limits<std::int64_t>::min();
    std::int64_t min_pos = std::numeric_limits<std::int64_t>::max();
    for (std::int64_t i = b * bs; i < std::min(s, (b + 1) * bs); ++i) {
      const std::int64_t p = pos[static_cast<std::size_t>(sel[static_cast<std::size_t>(i)])];
      max_pos = std::max(max_pos, p);
      min_pos = std::min(min_pos, p);
    }
    std::int64_t r = n_rows;
    while (r > 0 && pos[static_cast<std::size_t>(r - 1)] > max_pos) --r;
    keys[static_cast<std::size_t>(b)] = r;
    if (window > 0) {
      std::int64_t f = 0;
      while (f < r && pos[static_cast<std::size_t>(f)] <= min_pos - window) ++f;
      first[static_cast<std::size_t>(b)] = f;
    }
  }

  out.resize(s, qd);
  std::vector<float> head_mass;
  std::vector<float> head_self;
  if (stats != nullptr) {
    head_mass.assign(static_cast<std::size_t>(n_head * s * num_groups), 0.0f);
    head_self.assign(static_cast<std::size_t>(n_head * s), 0.0f);
  }
  // Query mass: per head and per block holding query entries, the weights of those entries summed per KV row
  // (each task writes its own slot; the slots are added in a fixed order below).
  const std::int64_t query_block0 = query.begin / bs;
  const std::int64_t query_blocks = query.empty() ? 0 : (query.end - 1) / bs + 1 - query_block0;
  std::vector<double> head_query;
  if (query_mass != nullptr) head_query.assign(static_cast<std::size_t>(n_head * query_blocks * n_rows), 0.0);
  // Base-2 scores (detail/attention.hpp): q·k · scale · log2(e).
  const float factor = detail::attention_score_factor(config_.attention_score_scale());
  // Group mass of head h for the block's rows i0 .. i0 + m − 1 (probabilities p, as attend_rows leaves them): each
  // query's weights summed per group in double, in the order of the KV rows; kLanes queries at a time, so that
  // their independent chains of additions overlap (the sums are the same as one query at a time).
  const auto group_mass = [&](std::int64_t h, std::int64_t i0, std::int64_t m, std::int64_t r0, std::int64_t nk,
                              const float* p) {
    constexpr std::int64_t kLanes = 4;
    thread_local std::vector<double> acc;
    for (std::int64_t i = 0; i < m; i += kLanes) {
      const std::int64_t lanes = std::min(kLanes, m - i);
      acc.assign(static_cast<std::size_t>(kLanes * num_groups), 0.0);
      for (const GroupRun& run : *group_runs) {
        const std::int64_t lo = std::max(run.begin, r0) - r0;
        const std::int64_t hi = std::min(run.end, r0 + nk) - r0;
        if (lo >= hi) continue;
        double* a = acc.data() + run.group;  // lane l's sum of this group: a[l * num_groups]
        if (lanes == kLanes) {
          const float* w0 = p + i * nk;
          double a0 = a[0];
          double a1 = a[num_groups];
          double a2 = a[2 * num_groups];
          double a3 = a[3 * num_groups];
          for (std::int64_t r = lo; r < hi; ++r) {
            a0 += w0[r];
            a1 += w0[nk + r];
            a2 += w0[2 * nk + r];
            a3 += w0[3 * nk + r];
          }
          a[0] = a0;
          a[num_groups] = a1;
          a[2 * num_groups] = a2;
          a[3 * num_groups] = a3;
          continue;
        }
        for (std::int64_t l = 0; l < lanes; ++l) {
          const float* w = p + (i + l) * nk;
          double sum = a[l * num_groups];
          for (std::int64_t r = lo; r < hi; ++r) sum += w[r];
          a[l * num_groups] = sum;
        }
      }
      for (std::int64_t l = 0; l < lanes; ++l) {
        float* dst = head_mass.data() + ((h * s) + i0 + i + l) * num_groups;
        for (std::int64_t gi = 0; gi < num_groups; ++gi)
          dst[gi] = static_cast<float>(acc[static_cast<std::size_t>(l * num_groups + gi)]);
        const std::int64_t row = sel[static_cast<std::size_t>(i0 + i + l)];
        head_self[static_cast<std::size_t>(h * s + i0 + i + l)] = p[(i + l) * nk + row - r0];
      }
    }
  };
  // Scores p ([m][nk], row i: query i0 + i against rows r0 ..) of head h, block b -> probabilities, in place:
  // the exact (windowed) causal mask, softmax, and the statistics the caller asked for.
  const auto attend_rows = [&](std::int64_t h, std::int64_t b, std::int64_t i0, std::int64_t m, std::int64_t r0,
                               std::int64_t nk, float* p) {
    for (std::int64_t i = 0; i < m; ++i) {
      const std::int64_t row = sel[static_cast<std::size_t>(i0 + i)];
      const std::int64_t qpos = pos[static_cast<std::size_t>(row)];
      float* w = p + i * nk;
      // Exact (windowed) causal mask by position: −inf, probability 0.
      detail::mask_scale_row(w, pos.data() + r0, nk, qpos, window, factor);
      detail::softmax_row(w, nk);  // the softmax of the kernels and their reference
      if (query_mass != nullptr && window == 0 && query.contains(i0 + i)) {
        double* col = head_query.data() + ((h * query_blocks) + b - query_block0) * n_rows + r0;
        for (std::int64_t r = 0; r < nk; ++r) col[r] += w[r];
      }
    }
    if (stats != nullptr) group_mass(h, i0, m, r0, nk, p);
  };
  // K^T and V of KV head g, rows [0, max keys), packed once for all blocks when every block's keys start at row 0 (no
  // sliding window): a block's keys are the first nk columns of K^T's panels (columns past them are computed and not
  // stored) and the first nk rows of V's (gemm_packed's panel_stride), so each product is the one of the block's own.
  const std::int64_t shared_keys = window == 0 && blocks > 0 ? *std::max_element(keys.begin(), keys.end()) : 0;
  const std::int64_t k_size = detail::packed_size(hd, shared_keys);  // K^T [hd][keys]
  const std::int64_t v_size = detail::packed_size(shared_keys, hd);  // V [keys][hd]
  // The calling thread's (the tasks read it through `shared`), kept between calls: the size of one layer's K and V.
  thread_local std::vector<float> shared_panels;
  shared_panels.resize(static_cast<std::size_t>(config_.n_head_kv * (k_size + v_size)));
  float* const shared = shared_panels.data();
  const auto pack_shared = [&](std::int64_t g) {
    float* k_dst = shared + g * (k_size + v_size);
    detail::pack_transposed(kv.k_row(layer, 0) + g * hd, kvd, shared_keys, hd, k_dst);
    detail::pack_rows(kv.v_row(layer, 0) + g * hd, kvd, shared_keys, hd, k_dst + k_size);
  };
  // One task: KV head g (GQA: the consecutive query heads g·group .. g·group + group − 1 share it) and one
  // block of queries; the K^T and V rows the block can see are packed once (detail/cpu_kernels.hpp) for all
  // the group's heads unless shared above, then per head: scores, mask, softmax, P V.
  const auto group_block = [&](std::int64_t task) {
    const std::int64_t g = task / blocks;
    const std::int64_t b = task % blocks;
    const std::int64_t i0 = b * bs;
    const std::int64_t m = std::min(s, i0 + bs) - i0;
    const std::int64_t r0 = first[static_cast<std::size_t>(b)];
    const std::int64_t nk = keys[static_cast<std::size_t>(b)] - r0;  // score j is row r0 + j
    thread_local std::vector<float> k_panels;
    thread_local std::vector<float> v_panels;
    thread_local std::vector<float> scores;
    const float* k_packed = shared + g * (k_size + v_size);
    const float* v_packed = k_packed + k_size;
    std::int64_t v_stride = detail::kPanelWidth * shared_keys;
    if (shared_keys == 0) {
      k_panels.resize(static_cast<std::size_t>(detail::packed_size(hd, nk)));
      v_panels.resize(static_cast<std::size_t>(detail::packed_size(nk, hd)));
      detail::pack_transposed(kv.k_row(layer, r0) + g * hd, kvd, nk, hd, k_panels.data());
      detail::pack_rows(kv.v_row(layer, r0) + g * hd, kvd, nk, hd, v_panels.data());
      k_packed = k_panels.data();
      v_packed = v_panels.data();
      v_stride = 0;
    }
    scores.resize(static_cast<std::size_t>(m * nk));
    for (std::int64_t h = g * group; h < (g + 1) * group; ++h) {
      detail::gemm_packed(q.data() + i0 * qd + h * hd, qd, m, hd, k_packed, nk, scores.data(), nk);
      attend_rows(h, b, i0, m, r0, nk, scores.data());
      detail::gemm_packed(scores.data(), nk, m, nk, v_packed, hd, out.data() + i0 * qd + h * hd, qd, v_stride);
    }
  };
  std::int64_t work = 0;  // multiply-adds of QK^T and PV
  for (std::int64_t b = 0; b < blocks; ++b)
    work += 2 * n_head * std::min(bs, s - b * bs) *
            (keys[static_cast<std::size_t>(b)] - first[static_cast<std::size_t>(b)]) * hd;
  const std::int64_t n_tasks = config_.n_head_kv * blocks;
  if (tasks_for(work, n_tasks) == 1) {
    if (shared_keys > 0)
      for (std::int64_t g = 0; g < config_.n_head_kv; ++g) pack_shared(g);
    for (std::int64_t t = 0; t < n_tasks; ++t) group_block(t);
  } else {
    if (shared_keys > 0) pool_->parallel_for(config_.n_head_kv, pack_shared);
    pool_->parallel_for(n_tasks, group_block);
  }
  // On a sliding-window layer the query rows see only the last `window` positions, which says nothing of
  // what they attend to in the rest of the prompt: the query mass is then the weight of the same query rows
  // over every row at a position <= theirs (this layer's scores without the window; its output is the
  // windowed attention above). |query| x n scores per head, into the head's first query slot.
  if (query_mass != nullptr && window > 0 && !query.empty()) {
    const auto head_query_unwindowed = [&](std::int64_t h) {
      const StridedMap k(kv.k_row(layer, 0) + (h / group) * hd, n_rows, hd, Eigen::OuterStride<>(kvd));
      Eigen::VectorXf w(n_rows);
      double* col = head_query.data() + h * query_blocks * n_rows;
      for (std::int64_t i = query.begin; i < query.end; ++i) {
        const std::int64_t qpos = pos[static_cast<std::size_t>(sel[static_cast<std::size_t>(i)])];
        w.noalias() = k * Eigen::Map<const Eigen::VectorXf>(q.data() + i * qd + h * hd, hd);
        for (std::int64_t r = 0; r < n_rows; ++r)
          w[r] = detail::attention_visible(pos[static_cast<std::size_t>(r)], qpos, 0) ? w[r] * factor
                                                                                     : detail::attention_neg_inf();
        detail::attention_softmax_row(w.data(), n_rows);
        for (std::int64_t r = 0; r < n_rows; ++r) col[r] += w[r];
      }
    };
    if (tasks_for(2 * n_head * query.size() * n_rows * hd, n_head) == 1) {
      for (std::int64_t h = 0; h < n_head; ++h) head_query_unwindowed(h);
    } else {
      pool_->parallel_for(n_head, head_query_unwindowed);
    }
  }
  if (stats != nullptr) {
    stats->num_groups = num_groups;
    stats->mass.assign(static_cast<std::size_t>(s * num_groups), 0.0f);
    stats->self_mass.assign(static_cast<std::size_t>(s), 0.0f);
    for (std::int64_t h = 0; h < n_head; ++h) {
      for (std::int64_t i = 0; i < s * num_groups; ++i)
        stats->mass[static_cast<std::size_t>(i)] += head_mass[static_cast<std::size_t>(h * s * num_groups + i)];
      for (std::int64_t i = 0; i < s; ++i)
        stats->self_mass[static_cast<std::size_t>(i)] += head_self[static_cast<std::size_t>(h * s + i)];
    }
  }
  if (query_mass != nullptr) {
    const auto row_mass = [&](std::int64_t row) {
      double sum = 0.0;
      for (std::int64_t slot = 0; slot < n_head * query_blocks; ++slot)
        sum += head_query[static_cast<std::size_t>(slot * n_rows + row)];
      return static_cast<float>(sum);
    };
    query_mass->assign(static_cast<std::size_t>(s), 0.0f);
    for (std::int64_t i = 0; i < s; ++i)
      (*query_mass)[static_cast<std::size_t>(i)] = row_mass(sel[static_cast<std::size_t>(i)]);
    if (row_query_mass != nullptr) {
      row_query_mass->assign(static_cast<std::size_t>(n_rows), 0.0f);
      for (std::int64_t r = 0; r < n_rows; ++r) (*row_query_mass)[static_cast<std::size_t>(r)] = row_mass(r);
    }
  }
}

KVFUSE_CPU_INLINE std::vector<float> CpuLlama::run(LlamaKVCache& kv, TokenSet sel, std::span<const token_id> sel_tokens,
                                                   const SelectionPolicy* policy, const PromptLayout* groups,
                                                   bool want_logits, std::vector<std::int64_t>* sizes,
                                                   const LayerHook* before_layer, TokenRange query_rows) const {
  struct Adapter final : StepHooks {
    const SelectionPolicy* policy;
    const LayerHook* hook;
    Adapter(const SelectionPolicy* p, const LayerHook* h) : policy(p), hook(h) {}
    Status before_layer(std::size_t, std::int64_t layer) override {
      if (hook != nullptr) (*hook)(layer);  // may throw: the single-request API lets it through
      return Status::success;
    }
    Status after_layer(std::size_t, const LayerReport& report, TokenSet& next) override {
      next = (*policy)(report);
      return Status::success;
    }
  } adapter(policy, before_layer);
  BatchItem item;
  item.kv = &kv;
  item.rows = std::move(sel);
  item.tokens = sel_tokens;
  item.want_logits = want_logits;
  item.needs = {policy != nullptr, policy != nullptr, policy != nullptr, groups, query_rows};
  forward(std::span<BatchItem>(&item, 1), adapter);
  if (sizes != nullptr) sizes->insert(sizes->end(), item.selected_per_layer.begin(), item.selected_per_layer.end());
  return std::move(item.logits);
}

KVFUSE_CPU_INLINE void CpuLlama::forward(std::span<BatchItem> items, StepHooks& hooks) const {
  const std::int64_t e = config_.n_embd;
  const std::int64_t hd = config_.head_dim;
  const std::int64_t pairs = hd / 2;
  const RopePairing pairing = config_.rope_pairing;
  const bool gemma3 = config_.architecture == LlamaArchitecture::gemma3;
  const std::size_t n_items = items.size();

  // Per item: its rows of the concatenated hidden states [offset, offset + sel.size()), S_l, the index in S_0 of
  // each entry of S_l (origin), its RoPE cos / sin per S_0 row and kind of layer, its KV rows in runs by group.
  struct Active {
    TokenSet sel;
    std::vector<std::int64_t> origin;
    std::vector<float> cos_t[2];
    std::vector<float> sin_t[2];
    std::vector<GroupRun> group_runs;
    std::int64_t num_groups = 0;
    std::int64_t offset = 0;
    bool live = true;
  };
  std::vector<Active> act(n_items);
  std::int64_t total = 0;
  for (std::size_t it = 0; it < n_items; ++it) {
    BatchItem& item = items[it];
    LlamaKVCache& kv = *item.kv;
    check_kv(kv, "CpuLlama::forward");
    check_selection(item.rows, kv.num_rows(), "CpuLlama::forward: rows");
    detail::require(!item.rows.empty() && item.tokens.size() == item.rows.size(),
                    "CpuLlama::forward: item {} has {} rows and {} tokens", it, item.rows.size(), item.tokens.size());
    check_tokens(item.tokens, "CpuLlama::forward");
    for (std::size_t other = 0; other < it; ++other)
      detail::require(items[other].kv != item.kv, "CpuLlama::forward: items {} and {} share a KV cache", other, it);
    std::int64_t last_position = -1;
    for (const std::int64_t r : item.rows)
      last_position = std::max(last_position, kv.positions[static_cast<std::size_t>(r)]);
    check_context(last_position);
    item.status = Status::success;
    item.logits.clear();
    item.selected_per_layer.clear();
    Active& a = act[it];
    a.sel = item.rows;
    const auto s = static_cast<std::int64_t>(a.sel.size());
    a.origin.resize(a.sel.size());
    std::iota(a.origin.begin(), a.origin.end(), std::int64_t{0});
    // RoPE cos / sin of every S_0 row (double angle, detail/rope.hpp), one table per kind of layer
    // ([LlamaConfig::is_local(l)]: the global and the local layers' θ), reused on every layer of that kind.
    for (std::int64_t l = 0; l < config_.n_layer; ++l) {
      const std::size_t kind = config_.is_local(l) ? 1 : 0;
      if (!a.cos_t[kind].empty()) continue;
      const std::vector<double> theta = config_.rope_theta(l);
      a.cos_t[kind].resize(static_cast<std::size_t>(s * pairs));
      a.sin_t[kind].resize(a.cos_t[kind].size());
      for (std::int64_t i = 0; i < s; ++i) {
        const auto p = static_cast<double>(kv.positions[static_cast<std::size_t>(a.sel[static_cast<std::size_t>(i)])]);
        detail::rope_cos_sin(theta.data(), pairs, p, a.cos_t[kind].data() + i * pairs, a.sin_t[kind].data() + i * pairs);
      }
    }
    if (const PromptLayout* groups = item.needs.groups; groups != nullptr) {
      a.num_groups = static_cast<std::int64_t>(groups->chunks.size()) + 1;
      // Chunk j's rows are group j, every other row (prefix, query, beyond the layout) the last group; the runs, in
      // row order, disjoint and covering every row, are what attention's group mass walks.
      std::vector<std::int64_t> group_of_row(static_cast<std::size_t>(kv.num_rows()), a.num_groups - 1);
      for (std::size_t j = 0; j < groups->chunks.size(); ++j)
        for (std::int64_t r = groups->chunks[j].range.begin; r < groups->chunks[j].range.end; ++r)
          group_of_row[static_cast<std::size_t>(r)] = static_cast<std::int64_t>(j);
      for (std::int64_t r = 0; r < kv.num_rows(); ++r) {
        const std::int64_t g = group_of_row[static_cast<std::size_t>(r)];
        if (!a.group_runs.empty() && a.group_runs.back().group == g)
          a.group_runs.back().end = r + 1;
        else
          a.group_runs.push_back({r, r + 1, g});
      }
    }
    a.offset = total;
    total += s;
  }

  RowMatrix h(total, e);
  for (std::size_t it = 0; it < n_items; ++it)
    for (std::size_t i = 0; i < act[it].sel.size(); ++i)
      weights_.token_embd.dequantize_rows(items[it].tokens[i], 1,
                                          h.row(act[it].offset + static_cast<std::int64_t>(i)).data());
  if (config_.embedding_scale != 1.0) h *= static_cast<float>(config_.embedding_scale);

  // Drops the rows of items whose set changed (or that left the step) from h: the rows kept of each item, in order.
  const auto regather = [&](const std::vector<std::vector<std::int64_t>>& keep_rows) {
    std::int64_t rows = 0;
    for (std::size_t it = 0; it < n_items; ++it) rows += static_cast<std::int64_t>(keep_rows[it].size());
    RowMatrix kept(rows, e);
    std::int64_t at = 0;
    for (std::size_t it = 0; it < n_items; ++it) {
      for (std::int64_t r : keep_rows[it]) kept.row(at++) = h.row(act[it].offset + r);
      act[it].offset = at - static_cast<std::int64_t>(keep_rows[it].size());
    }
    h = std::move(kept);
  };

  RowMatrix x, q, k, v, att, tmp, gate, up, q_item, att_item;
  std::vector<float> panels;  // project's dequantized weight panels
  std::vector<float> k_dev, v_dev, query_mass, row_query_mass;
  LayerAttention stats;
  TokenSet next;
  for (std::int64_t l = 0; l < config_.n_layer; ++l) {
    bool dropped = false;
    for (std::size_t it = 0; it < n_items; ++it) {
      if (!act[it].live) continue;
      items[it].status = hooks.before_layer(it, l);
      if (items[it].status == Status::success) continue;
      act[it].live = false;
      dropped = true;
    }
    if (dropped) {
      std::vector<std::vector<std::int64_t>> keep(n_items);
      for (std::size_t it = 0; it < n_items; ++it) {
        if (!act[it].live) {
          act[it].sel.clear();
          continue;
        }
        keep[it].resize(act[it].sel.size());
        std::iota(keep[it].begin(), keep[it].end(), std::int64_t{0});
      }
      regather(keep);
    }
    if (h.rows() == 0) break;  // every item left the step
    const LlamaLayerWeights& w = weights_.layers[static_cast<std::size_t>(l)];
    rms_norm(h, w.attn_norm, x);
    project(x, w.wq, q, panels);
    project(x, w.wk, k, panels);
    project(x, w.wv, v, panels);
    if (w.bq.size() != 0) {  // qwen2's Q / K / V biases (LlamaWeights::validate: all three or none)
      q.rowwise() += w.bq.transpose();
      k.rowwise() += w.bk.transpose();
      v.rowwise() += w.bv.transpose();
    }
    if (gemma3) {
      rms_norm_heads(q, config_.n_head, w.attn_q_norm);
      rms_norm_heads(k, config_.n_head_kv, w.attn_k_norm);
    }
    const std::size_t kind = config_.is_local(l) ? 1 : 0;
    att.resize(h.rows(), config_.q_dim());
    std::vector<std::vector<std::int64_t>> keep(n_items);
    bool changed = false;
    for (std::size_t it = 0; it < n_items; ++it) {
      Active& a = act[it];
      if (!a.live) continue;
      BatchItem& item = items[it];
      LlamaKVCache& kv = *item.kv;
      const auto s = static_cast<std::int64_t>(a.sel.size());
      for (std::int64_t i = 0; i < s; ++i) {
        const float* c = a.cos_t[kind].data() + a.origin[static_cast<std::size_t>(i)] * pairs;
        const float* sn = a.sin_t[kind].data() + a.origin[static_cast<std::size_t>(i)] * pairs;
        for (std::int64_t head = 0; head < config_.n_head; ++head)
          detail::rope_rotate_head(q.row(a.offset + i).data() + head * hd, hd, pairing, c, sn);
        for (std::int64_t head = 0; head < config_.n_head_kv; ++head)
          detail::rope_rotate_head(k.row(a.offset + i).data() + head * hd, hd, pairing, c, sn);
      }
      // CacheBlend section 4.1: deviation of the recomputed K / V from the cached rows, when asked for.
      k_dev.resize(item.needs.k_deviation ? static_cast<std::size_t>(s) : 0);
      v_dev.resize(item.needs.v_deviation ? static_cast<std::size_t>(s) : 0);
      for (std::size_t i = 0; i < k_dev.size(); ++i)
        k_dev[i] = detail::kv_row_deviation(k.row(a.offset + static_cast<std::int64_t>(i)).data(),
                                            kv.k_row(l, a.sel[i]), config_.n_head_kv, hd);
      for (std::size_t i = 0; i < v_dev.size(); ++i)
        v_dev[i] = detail::kv_row_deviation(v.row(a.offset + static_cast<std::int64_t>(i)).data(),
                                            kv.v_row(l, a.sel[i]), config_.n_head_kv, hd);
      for (std::int64_t i = 0; i < s; ++i) {
        const std::int64_t row = a.sel[static_cast<std::size_t>(i)];
        std::copy_n(k.row(a.offset + i).data(), k.cols(), kv.k_row(l, row));
        std::copy_n(v.row(a.offset + i).data(), v.cols(), kv.v_row(l, row));
      }
      const TokenRange query_rows = item.needs.query;
      TokenRange query{};  // the entries of sel that are query rows (sel is sorted: one run)
      if (!query_rows.empty()) {
        query = {std::lower_bound(a.sel.begin(), a.sel.end(), query_rows.begin) - a.sel.begin(),
                 std::lower_bound(a.sel.begin(), a.sel.end(), query_rows.end) - a.sel.begin()};
        detail::require(query.size() == query_rows.size(),
                        "CpuLlama::forward: layer {} computes {} of the query rows {}; their attention mass "
                        "needs all of them",
                        l, query.size(), query_rows);
      }
      const bool with_stats = item.needs.groups != nullptr;
      q_item = q.middleRows(a.offset, s);
      attention(l, kv, a.sel, q_item, att_item, with_stats ? &a.group_runs : nullptr, a.num_groups,
                with_stats ? &stats : nullptr, query, query_rows.empty() ? nullptr : &query_mass,
                query_rows.empty() ? nullptr : &row_query_mass);
      att.middleRows(a.offset, s) = att_item;
      item.selected_per_layer.push_back(s);
      if (!item.needs.after_layer) continue;
      next.clear();
      item.status = hooks.after_layer(
          it, LayerReport{l, a.sel, k_dev, v_dev, with_stats ? &stats : nullptr,
                          query_rows.empty() ? std::span<const float>{} : std::span<const float>(query_mass),
                          query_rows.empty() ? std::span<const float>{} : std::span<const float>(row_query_mass)},
          next);
      if (item.status != Status::success) {
        a.live = false;
        changed = true;
        continue;
      }
      if (l + 1 == config_.n_layer || next.empty() || next == a.sel) continue;  // S_L is not used
      check_selection(next, kv.num_rows(), "CpuLlama::forward: policy result");
      detail::require(!item.want_logits || next.back() == item.rows.back(),
                      "CpuLlama::forward: the policy dropped the last row {} after layer {}", item.rows.back(), l);
      // S_{l+1} ⊆ S_l: the entries of S_l kept.
      std::vector<std::int64_t>& kept = keep[it];
      std::vector<std::int64_t> kept_origin(next.size());
      std::size_t j = 0;
      for (std::size_t i = 0; i < next.size(); ++i) {
        while (j < a.sel.size() && a.sel[j] < next[i]) ++j;
        detail::require(j < a.sel.size() && a.sel[j] == next[i],
                        "CpuLlama::forward: the policy selected row {} after layer {}, which layer {} did not "
                        "compute (S_{{l+1}} must be a subset of S_l)",
                        next[i], l, l);
        kept.push_back(static_cast<std::int64_t>(j));
        kept_origin[i] = a.origin[j];
      }
      a.origin = std::move(kept_origin);
      a.sel = next;
      changed = true;
    }
    project(att, w.wo, tmp, panels);
    if (gemma3) {
      rms_norm(tmp, w.attn_post_norm, att);
      h += att;
    } else {
      h += tmp;
    }
    rms_norm(h, w.ffn_norm, x);
    project(x, w.w_gate, gate, panels);
    project(x, w.w_up, up, panels);
    rows_in_parallel(gate.rows(), 16 * gate.cols(), [&](Eigen::Index i) {  // an exp or tanh: ~16 operations a value
      auto row = gate.row(i);
      if (gemma3) {
        row = row.unaryExpr([](float g) { return detail::gelu_tanh(g); }).cwiseProduct(up.row(i));  // GeGLU
      } else {
        row = row.unaryExpr([](float g) { return g / (1.0f + std::exp(-g)); }).cwiseProduct(up.row(i));  // SwiGLU
      }
    });
    project(gate, w.w_down, tmp, panels);
    if (gemma3) {
      rms_norm(tmp, w.ffn_post_norm, x);
      h += x;
    } else {
      h += tmp;
    }
    if (!changed || l + 1 == config_.n_layer) continue;
    for (std::size_t it = 0; it < n_items; ++it) {  // rows of items whose set did not change are all kept
      if (!act[it].live) {
        act[it].sel.clear();
        keep[it].clear();
      } else if (keep[it].empty()) {
        keep[it].resize(act[it].sel.size());
        std::iota(keep[it].begin(), keep[it].end(), std::int64_t{0});
      }
    }
    regather(keep);
  }

  // The output head for every item that wants logits at once: each tile of the head is dequantized once for all
  // of their last rows.
  std::vector<std::size_t> heads;
  for (std::size_t it = 0; it < n_items; ++it)
    if (act[it].live && items[it].want_logits) heads.push_back(it);
  if (heads.empty()) return;
  RowMatrix lasts(static_cast<Eigen::Index>(heads.size()), config_.n_embd);
  for (std::size_t i = 0; i < heads.size(); ++i) {
    const Active& a = act[heads[i]];
    RowMatrix last = h.row(a.offset + static_cast<std::int64_t>(a.sel.size()) - 1);
    rms_norm(last, weights_.output_norm, x);
    lasts.row(static_cast<Eigen::Index>(i)) = x.row(0);
    items[heads[i]].logits.resize(static_cast<std::size_t>(config_.n_vocab));
  }
  const WeightMatrix& head = weights_.output_head();
  const auto n_heads = static_cast<std::int64_t>(heads.size());
  const std::int64_t tasks = tasks_for(n_heads * head.size(), config_.n_vocab / 256);
  pool_->parallel_for(tasks, [&](std::int64_t t) {
    const std::int64_t r0 = config_.n_vocab * t / tasks;
    const std::int64_t r1 = config_.n_vocab * (t + 1) / tasks;
    std::vector<float*> ys(heads.size());
    for (std::size_t i = 0; i < heads.size(); ++i) ys[i] = items[heads[i]].logits.data() + r0;
    matvec_rows(head, r0, r1, lasts, ys);
  });
  if (config_.final_logit_softcap > 0) {
    const auto cap = static_cast<float>(config_.final_logit_softcap);
    for (const std::size_t it : heads)
      for (float& z : items[it].logits) z = detail::softcap(z, cap);
  }
}

KVFUSE_CPU_INLINE std::uint64_t CpuLlama::compute_fingerprint() const noexcept {
  Xxh3Stream h;
  const auto bytes = [&h](const void* data, std::size_t size) {
    h.update(std::span(static_cast<const std::byte*>(data), size));
  };
  const std::int64_t dims[] = {config_.n_layer,
                               config_.n_embd,
                               config_.n_head,
                               config_.n_head_kv,
                               config_.head_dim,
                               config_.n_ff,
                               config_.n_vocab,
                               static_cast<std::int64_t>(config_.rope_pairing),
                               static_cast<std::int64_t>(config_.architecture),
                               config_.sliding_window};
  bytes(dims, sizeof dims);
  const double reals[] = {config_.rope_base,       config_.rms_eps,         config_.rope_linear_factor,
                          config_.rope_base_local, config_.embedding_scale, config_.attention_scale,
                          config_.final_logit_softcap};
  bytes(reals, sizeof reals);
  bytes(config_.rope_freq_factors.data(), config_.rope_freq_factors.size() * sizeof(float));
  bytes(config_.local_layers.data(), config_.local_layers.size());
  const auto vector = [&](const Eigen::VectorXf& v) {
    const std::int64_t size = v.size();
    bytes(&size, sizeof size);
    bytes(v.data(), static_cast<std::size_t>(size) * sizeof(float));
  };
  const auto matrix = [&](const WeightMatrix& m) {
    const std::int64_t shape[] = {static_cast<std::int64_t>(m.type()), m.rows(), m.cols()};
    bytes(shape, sizeof shape);
    h.update(m.raw());
  };
  matrix(weights_.token_embd);
  vector(weights_.output_norm);
  matrix(weights_.output);
  for (const LlamaLayerWeights& w : weights_.layers) {
    for (const WeightMatrix* m : w.projections()) matrix(*m);
    for (const Eigen::VectorXf* v : {&w.attn_norm, &w.ffn_norm, &w.attn_q_norm, &w.attn_k_norm, &w.attn_post_norm,
                                     &w.ffn_post_norm})
      vector(*v);
    if (w.bq.size() != 0)  // qwen2 only, so the other architectures' fingerprints stay as they were
      for (const Eigen::VectorXf* v : {&w.bq, &w.bk, &w.bv}) vector(*v);
  }
  if (options_.products != CpuProducts::fp32) {  // other KV bits; fp32's fingerprints stay as they were
    const auto products = static_cast<std::int64_t>(options_.products);
    bytes(&products, sizeof products);
  }
  return h.digest();
}

}  // namespace kvfuse
