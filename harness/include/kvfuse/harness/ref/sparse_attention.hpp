#pragma once
// CPU reference of the sparse-query attention with the exact positional causal mask and its epilogues
// (kvfuse::ref::sparse_attention) kernels: host memory, element by element, the same element math as the CUDA kernels,
// so CI checks the kernels without a GPU (tests/emu runs the kernels' own sources against it). Part of kvfuse's test
// and benchmark harness, not of the library: arguments, layouts and validation are
// kvfuse/kernel_args/sparse_attention.hpp, which the launchers (kvfuse/cuda/sparse_attention.cuh) share.

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "kvfuse/kernel_args/sparse_attention.hpp"

namespace kvfuse {

namespace ref {

namespace attention_detail {

template <class T>
float load(const void* base, std::int64_t offset) {
  return to_float(static_cast<const T*>(base)[offset]);
}

template <class T>
void sparse_attention_typed(const SparseAttentionArgs& a) {
  using kvfuse::detail::attention_lse;
  using kvfuse::detail::attention_output_scale;
  using kvfuse::detail::attention_probability;
  using kvfuse::detail::attention_visible;
  using kvfuse::detail::softmax_advance;
  using kvfuse::detail::softmax_weight;
  constexpr std::int64_t block = 64;  // keys per online-softmax step
  const std::int64_t d = a.head_dim;
  const std::int64_t group = a.num_q_heads / a.num_kv_heads;
  const float factor = kvfuse::detail::attention_score_factor(a.scale);
  const auto nq = static_cast<std::size_t>(a.num_queries);
  const auto nc = static_cast<std::size_t>(a.num_chunks);
  if (nc > 0) std::fill(a.mass, a.mass + nq * nc, 0.0f);
  if (a.self_mass != nullptr) std::fill(a.self_mass, a.self_mass + nq, 0.0f);
  if (a.query_mass != nullptr) std::fill(a.query_mass, a.query_mass + a.num_keys, 0.0f);
  std::vector<float> q(static_cast<std::size_t>(d));
  std::vector<float> acc(static_cast<std::size_t>(d));
  std::vector<float> scores(static_cast<std::size_t>(a.num_keys));
  for (std::int64_t i = 0; i < a.num_queries; ++i) {
    for (std::int64_t h = 0; h < a.num_q_heads; ++h) {
      const std::int64_t kvh = h / group;
      for (std::int64_t e = 0; e < d; ++e)
        q[static_cast<std::size_t>(e)] = load<T>(a.q, i * a.q_token_stride + h * a.q_head_stride + e);
      // Base-2 scores, −inf where masked.
      for (std::int64_t j = 0; j < a.num_keys; ++j) {
        float s = kvfuse::detail::attention_neg_inf();
        if (attention_visible(a.k_pos[j], a.q_pos[i])) {
          float dot = 0.0f;
          const std::int64_t kb = j * a.k_token_stride + kvh * a.k_head_stride;
          for (std::int64_t e = 0; e < d; ++e) dot += q[static_cast<std::size_t>(e)] * load<T>(a.k, kb + e);
          s = dot * factor;
        }
        scores[static_cast<std::size_t>(j)] = s;
      }
      float m = kvfuse::detail::attention_neg_inf();
      float l = 0.0f;
      std::fill(acc.begin(), acc.end(), 0.0f);
      for (std::int64_t j0 = 0; j0 < a.num_keys; j0 += block) {
        const std::int64_t j1 = std::min(a.num_keys, j0 + block);
        float block_max = kvfuse::detail::attention_neg_inf();
        for (std::int64_t j = j0; j < j1; ++j) block_max = std::max(block_max, scores[static_cast<std::size_t>(j)]);
        const float alpha = softmax_advance(m, block_max);
        l *= alpha;
        for (auto& x : acc) x *= alpha;
        for (std::int64_t j = j0; j < j1; ++j) {
          const float p = softmax_weight(scores[static_cast<std::size_t>(j)], m);
          if (p == 0.0f) continue;  // masked (or underflowed): contributes nothing, whatever V holds
          l += p;
          const std::int64_t vb = j * a.v_token_stride + kvh * a.v_head_stride;
          for (std::int64_t e = 0; e < d; ++e) acc[static_cast<std::size_t>(e)] += p * load<T>(a.v, vb + e);
        }
      }
      const float inv = attention_output_scale(l);
      const float lse = attention_lse(m, l);
      T* o = static_cast<T*>(a.o) + i * a.o_token_stride + h * a.o_head_stride;
      for (std::int64_t e = 0; e < d; ++e) o[e] = from_float<T>(acc[static_cast<std::size_t>(e)] * inv);
      a.lse[i * a.num_q_heads + h] = lse;
      // The epilogues: softmax weights e^(s·ln2 − LSE), summed over the query heads.
      if (a.self_mass != nullptr)
        a.self_mass[i] += attention_probability(scores[static_cast<std::size_t>(a.self_rows[i])], lse);
      if (a.query_mass != nullptr && i >= a.query_begin && i < a.query_end)
        for (std::int64_t j = 0; j < a.num_keys; ++j)
          a.query_mass[j] += attention_probability(scores[static_cast<std::size_t>(j)], lse);
      if (nc == 0) continue;
      float* mass = a.mass + static_cast<std::size_t>(i) * nc;
      for (std::size_t c = 0; c < nc; ++c)
        for (std::int64_t j = a.chunk_starts[c]; j < a.chunk_starts[c + 1]; ++j)
          mass[c] += attention_probability(scores[static_cast<std::size_t>(j)], lse);
    }
  }
}

}  // namespace attention_detail

// CPU reference of kvfuse::cuda::sparse_attention on host pointers: fp32 dot products and accumulation,
// the online softmax of kvfuse/detail/attention.hpp over blocks of 64 keys, one rounding of O to the
// storage dtype. Supports every dtype, head_dim and stride. Keys with p = 0 (masked) are skipped, so the
// values of an invisible key never reach the output. Refuses what validate() and validate_host_data()
// refuse; nothing is written then.
[[nodiscard]] inline Status sparse_attention(const SparseAttentionArgs& args) noexcept {
  if (const Status s = validate(args); s != Status::success) return s;
  if (const Status s = validate_host_data(args); s != Status::success) return s;
  const SparseAttentionArgs a = resolved(args);
  try {
    switch (a.dtype) {
      case DType::f32: attention_detail::sparse_attention_typed<float>(a); break;
      case DType::f16: attention_detail::sparse_attention_typed<f16>(a); break;
      case DType::bf16: attention_detail::sparse_attention_typed<bf16>(a); break;
    }
  } catch (...) {
    return refuse(Status::invalid_argument, "sparse_attention: out of host memory");
  }
  return Status::success;
}

}  // namespace ref
}  // namespace kvfuse
