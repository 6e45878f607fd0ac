#pragma once
// Element math of attention with an exact positional causal mask, shared by the sparse-attention CPU
// reference (kvfuse::ref::sparse_attention, the test harness), the CUDA kernel (kvfuse/cuda/sparse_attention.cuh) and the
// CPU Llama backend (backend/cpu/llama.hpp, through attention_softmax_row), so all three mask, rescale and
// normalize the same way: one softmax.
//
// Online softmax (FlashAttention): keys are visited in blocks; each query row keeps a running maximum m of
// its scores, a running sum l of 2^(s − m) and an output accumulator acc = Σ 2^(s − m) · v. When a block
// raises the maximum from m to m', l and acc are rescaled by 2^(m − m'). At the end O = acc / l.
//
// Scores are kept in base 2: s = (q · k) · scale · log2(e), so a weight is one exp2. A row that has seen
// no visible key yet has m = −inf and l = 0; the helpers below return finite values (never NaN) for it,
// and a row that sees no key at all ends with O = 0 and LSE = −inf. The log-sum-exp returned to callers
// is in natural-log units: LSE = ln Σ_j e^(scale · q·k_j) = (m + log2 l) · ln 2.
//
// fmt-free and CUDA-free apart from KVFUSE_HOST_DEVICE: kernels include it.

#include <cmath>
#include <cstdint>

#include "kvfuse/core/config.hpp"

namespace kvfuse::detail {

inline constexpr float kAttentionLog2e = 1.4426950408889634f;  // log2(e)
inline constexpr float kAttentionLn2 = 0.6931471805599453f;    // ln(2)

// Exact positional causal mask: key j is visible to query i iff pos_k[j] <= pos_q[i], by position, not by
// index (equal positions are visible: a token attends to itself).
// (int32 positions of the kernels widen exactly; the CPU backend's are int64.)
KVFUSE_HOST_DEVICE bool attention_visible(std::int64_t key_pos, std::int64_t query_pos) {
  return key_pos <= query_pos;
}

// The same mask on a sliding-window layer (llama.cpp LLAMA_SWA_TYPE_STANDARD, Gemma 3's local layers): key j
// is visible iff pos_q[i] − window < pos_k[j] <= pos_q[i]. window <= 0: no window, attention_visible.
KVFUSE_HOST_DEVICE bool attention_visible(std::int64_t key_pos, std::int64_t query_pos, std::int64_t window) {
  return key_pos <= query_pos && (window <= 0 || query_pos - key_pos < window);
}

// The factor that turns a raw dot product q · k into a base-2 score: scale · log2(e).
KVFUSE_HOST_DEVICE float attention_score_factor(float scale) { return scale * kAttentionLog2e; }

// −inf, the score of a masked key and the running maximum of a row that has seen no visible key.
KVFUSE_HOST_DEVICE float attention_neg_inf() { return -INFINITY; }

// Factor 2^(m_old − m_new) by which l and acc are rescaled when the running maximum moves from m_old to
// m_new >= m_old. While the row has seen no visible key (m_new = −inf, so l = acc = 0) it is 1, not NaN;
// from −inf to a finite maximum it is 0.
KVFUSE_HOST_DEVICE float softmax_rescale(float m_old, float m_new) {
  return m_new == -INFINITY ? 1.0f : exp2f(m_old - m_new);
}

// The value subtracted from a score before exp2: the running maximum m, or 0 while the row has seen no
// visible key (m = −inf: then every score so far is −inf too, and −inf − 0 gives weight 0, not NaN).
KVFUSE_HOST_DEVICE float softmax_shift(float m) { return m == -INFINITY ? 0.0f : m; }

// Unnormalized weight 2^(s − m) of a base-2 score s under running maximum m >= s; 0 for a masked score
// (s = −inf), also when the row has no visible key yet (m = −inf); never NaN. softmax_shift(m) depends on
// the row only, so a kernel computes it once per row.
KVFUSE_HOST_DEVICE float softmax_weight(float s, float m) { return exp2f(s - softmax_shift(m)); }

// One online-softmax step of a row: `block_max` is the maximum base-2 score of the new block of keys
// (−inf if none is visible). Updates the running maximum `m` and returns the factor 2^(m_old − m_new) by
// which the caller rescales l and acc before adding the block's weights softmax_weight(s, m).
KVFUSE_HOST_DEVICE float softmax_advance(float& m, float block_max) {
  const float m_new = m > block_max ? m : block_max;
  const float alpha = softmax_rescale(m, m_new);
  m = m_new;
  return alpha;
}

// 1 / l, the factor that normalizes acc into the output; 0 for a row that saw no key (O = 0).
KVFUSE_HOST_DEVICE float attention_output_scale(float l) { return l > 0.0f ? 1.0f / l : 0.0f; }

// Natural-log log-sum-exp of a row from its base-2 running maximum m and sum l: (m + log2 l) · ln 2;
// −inf for a row that saw no key.
KVFUSE_HOST_DEVICE float attention_lse(float m, float l) {
  return l > 0.0f ? (m + log2f(l)) * kAttentionLn2 : -INFINITY;
}

// Softmax probability of a key with base-2 score s in a row whose natural-log LSE is `lse`:
// e^(s·ln2 − lse) = 2^(s − lse · log2 e). 0 for a masked key (s = −inf) and for a row without keys.
// The per-chunk attention mass is the sum of these over the visible keys of a chunk and over the query
// heads: mass[i][c] = Σ_h Σ_{j ∈ c, pos_k[j] <= pos_q[i]} 2^(s_hij − LSE_hi · log2 e), Cache-Craft's
// a_kl of eq. 3–4 summed over heads (inter/intra attention, eq. 14 token scores, eq. 15 focused chunks).
KVFUSE_HOST_DEVICE float attention_probability(float s, float lse) {
  return lse == -INFINITY ? 0.0f : exp2f(s - lse * kAttentionLog2e);
}

// Softmax of one whole row of n base-2 scores, in place: the online softmax above with the row as a single
// block (m = its maximum visible score, l = Σ softmax_weight(s_j, m)), each weight then scaled by
// attention_output_scale(l). Afterwards scores[j] is the probability of key j: exactly 0 where it was
// masked (s = −inf), all 0 for a row without a visible key. Returns the row's natural-log LSE. For callers
// that hold a row's scores at once (the CPU backend multiplies the probabilities by V as one matrix).
KVFUSE_HOST_DEVICE float attention_softmax_row(float* scores, std::int64_t n) {
  float block_max = attention_neg_inf();
  for (std::int64_t j = 0; j < n; ++j) block_max = scores[j] > block_max ? scores[j] : block_max;
  float m = attention_neg_inf();
  softmax_advance(m, block_max);  // from no key seen: l = 0, nothing to rescale
  float l = 0.0f;
  for (std::int64_t j = 0; j < n; ++j) {
    scores[j] = softmax_weight(scores[j], m);
    l += scores[j];
  }
  const float inv = attention_output_scale(l);
  for (std::int64_t j = 0; j < n; ++j) scores[j] *= inv;
  return attention_lse(m, l);
}

}  // namespace kvfuse::detail
