#pragma once
// Sparse-query attention with an exact positional causal mask: the arguments shared by the CUDA launcher
// kvfuse::cuda::sparse_attention (kernels/include/kvfuse/cuda/sparse_attention.cuh) and its CPU reference
// kvfuse::ref::sparse_attention (harness/include/kvfuse/harness/ref/sparse_attention.hpp, the test harness), and
// their common validation.
//
// A prompt of N tokens has keys and values K, V [N, Hkv, d] and int32 positions pos_k[N] (non-decreasing
// along the key index, as in any prompt). S selected query tokens have Q [S, Hq, d] and positions pos_q[S].
// Query i sees key j iff pos_k[j] <= pos_q[i] (exact, by position). Query head h reads KV head
// h / (Hq / Hkv) (GQA). Outputs: O [S, Hq, d] in the storage dtype of the inputs (fp32 accumulation,
// one rounding at the end) and LSE [S, Hq] fp32 (natural log); a query that sees no key gets O = 0 and
// LSE = −inf. Optional epilogues, each computed only when its output is given (softmax_hij: the weight query
// i puts on key j in query head h; each output is overwritten):
//  - chunk mass: with chunk boundaries chunk_starts[0..C] (key indices), mass[S, C] = Σ_h Σ_{j ∈
//    [chunk_starts[c], chunk_starts[c+1]), visible} softmax_hij (Cache-Craft eq. 3–4 weights summed over
//    heads, what its inter/intra statistics and eq. 15 focused-chunk detection consume);
//  - self mass: self_mass[S] = Σ_h softmax_{h,i,self_rows[i]}, the weight query i puts on its own key row
//    (LayerAttention::self_mass: Cache-Craft eq. 4 leaves it out of a chunk's intra attention);
//  - query mass: query_mass[N] = Σ_{i ∈ [query_begin, query_end)} Σ_h softmax_hij, the weight the query rows
//    (a contiguous range of the selected entries: the question) put on key j (QueryAware ranks by it;
//    LayerReport::query_mass of entry e of S_l is query_mass[row of e]).
//
// Layouts: every tensor is [tokens, heads, d] with the d elements of a head contiguous and a token stride
// and a head stride in elements; 0 means packed NHD (token stride H·d, head stride d). HND
// ([heads, tokens, d]) is token stride d, head stride N·d. LSE is packed [S, Hq], mass packed [S, C].
//
// fmt-free: CUDA translation units include it. validate() reads no pointed-to data (the launcher's pointers
// are device pointers); the CPU reference also checks the data it can read (validate_host_data).

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "kvfuse/core/dtype.hpp"
#include "kvfuse/core/status.hpp"
#include "kvfuse/detail/attention.hpp"

namespace kvfuse {

struct SparseAttentionArgs {
  DType dtype = DType::bf16;      // storage of Q, K, V and O
  std::int64_t num_queries = 0;   // S: selected query tokens
  std::int64_t num_keys = 0;      // N: prompt tokens (keys and values)
  std::int64_t num_q_heads = 0;   // Hq
  std::int64_t num_kv_heads = 0;  // Hkv; Hq % Hkv == 0
  std::int64_t head_dim = 0;      // d
  float scale = 0.0f;             // softmax scale; 0 selects 1 / sqrt(d)

  const void* q = nullptr;  // [S, Hq, d]
  std::int64_t q_token_stride = 0;
  std::int64_t q_head_stride = 0;
  const void* k = nullptr;  // [N, Hkv, d]
  std::int64_t k_token_stride = 0;
  std::int64_t k_head_stride = 0;
  const void* v = nullptr;  // [N, Hkv, d]
  std::int64_t v_token_stride = 0;
  std::int64_t v_head_stride = 0;
  const std::int32_t* q_pos = nullptr;  // [S]; sorted non-decreasing for speed (each tile stops early)
  const std::int32_t* k_pos = nullptr;  // [N]; non-decreasing (required)

  void* o = nullptr;  // [S, Hq, d], storage dtype
  std::int64_t o_token_stride = 0;
  std::int64_t o_head_stride = 0;
  float* lse = nullptr;  // [S, Hq] fp32, natural log

  // Optional epilogue, enabled when num_chunks > 0.
  std::int64_t num_chunks = 0;                 // C
  const std::int64_t* chunk_starts = nullptr;  // [C + 1] key indices, non-decreasing, within [0, N]
  float* mass = nullptr;                       // [S, C] fp32, overwritten

  // Optional self-mass epilogue, enabled when self_mass is not null.
  const std::int32_t* self_rows = nullptr;  // [S] key index of query i's own row (S_l's rows), in [0, N)
  float* self_mass = nullptr;               // [S] fp32, overwritten

  // Optional query-mass epilogue, enabled when query_mass is not null.
  std::int64_t query_begin = 0;  // the query rows: entries [query_begin, query_end) of the S queries
  std::int64_t query_end = 0;
  float* query_mass = nullptr;  // [N] fp32, overwritten

  // Optional scratch of the CUDA launcher (kvfuse::cuda::sparse_attention_workspace_bytes): with it, few
  // selected queries split their KV loops over more blocks. Not read by the CPU reference.
  void* workspace = nullptr;
  std::int64_t workspace_bytes = 0;
};

namespace detail {

// A stride argument with 0 resolved to the packed NHD value.
inline std::int64_t attention_stride(std::int64_t given, std::int64_t packed) { return given != 0 ? given : packed; }

}  // namespace detail

// The arguments with every 0 stride replaced by its packed NHD value and scale 0 by 1 / sqrt(d).
[[nodiscard]] inline SparseAttentionArgs resolved(const SparseAttentionArgs& a) noexcept {
  SparseAttentionArgs r = a;
  const std::int64_t d = a.head_dim;
  r.q_token_stride = detail::attention_stride(a.q_token_stride, a.num_q_heads * d);
  r.q_head_stride = detail::attention_stride(a.q_head_stride, d);
  r.k_token_stride = detail::attention_stride(a.k_token_stride, a.num_kv_heads * d);
  r.k_head_stride = detail::attention_stride(a.k_head_stride, d);
  r.v_token_stride = detail::attention_stride(a.v_token_stride, a.num_kv_heads * d);
  r.v_head_stride = detail::attention_stride(a.v_head_stride, d);
  r.o_token_stride = detail::attention_stride(a.o_token_stride, a.num_q_heads * d);
  r.o_head_stride = detail::attention_stride(a.o_head_stride, d);
  if (a.scale == 0.0f && d > 0) r.scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(d)));
  return r;
}

// Checks sizes, strides, pointers and the scale without reading any pointed-to data. Returns
// Status::success or refuses with invalid_argument and a message naming the bad value.
[[nodiscard]] inline Status validate(const SparseAttentionArgs& a) noexcept {
  constexpr std::int64_t int32_max = std::numeric_limits<std::int32_t>::max();
  if (a.dtype != DType::f32 && a.dtype != DType::f16 && a.dtype != DType::bf16)
    return refuse(Status::invalid_argument, "sparse_attention: dtype %d is not f32, f16 or bf16",
                  static_cast<int>(a.dtype));
  if (a.num_queries < 0 || a.num_queries > int32_max)
    return refuse(Status::invalid_argument, "sparse_attention: num_queries %lld is outside [0, 2^31)",
                  static_cast<long long>(a.num_queries));
  if (a.num_keys < 0 || a.num_keys > int32_max)
    return refuse(Status::invalid_argument, "sparse_attention: num_keys %lld is outside [0, 2^31)",
                  static_cast<long long>(a.num_keys));
  if (a.num_q_heads <= 0 || a.num_kv_heads <= 0)
    return refuse(Status::invalid_argument, "sparse_attention: num_q_heads %lld and num_kv_heads %lld must be > 0",
                  static_cast<long long>(a.num_q_heads), static_cast<long long>(a.num_kv_heads));
  if (a.num_q_heads % a.num_kv_heads != 0)
    return refuse(Status::invalid_argument,
                  "sparse_attention: num_q_heads %lld is not a multiple of num_kv_heads %lld",
                  static_cast<long long>(a.num_q_heads), static_cast<long long>(a.num_kv_heads));
  if (a.head_dim <= 0)
    return refuse(Status::invalid_argument, "sparse_attention: head_dim %lld must be > 0",
                  static_cast<long long>(a.head_dim));
  if (!std::isfinite(a.scale))
    return refuse(Status::invalid_argument, "sparse_attention: scale %g is not finite", static_cast<double>(a.scale));
  const SparseAttentionArgs r = resolved(a);
  const struct {
    const char* name;
    std::int64_t value;
  } strides[] = {{"q_token_stride", r.q_token_stride}, {"q_head_stride", r.q_head_stride},
                 {"k_token_stride", r.k_token_stride}, {"k_head_stride", r.k_head_stride},
                 {"v_token_stride", r.v_token_stride}, {"v_head_stride", r.v_head_stride},
                 {"o_token_stride", r.o_token_stride}, {"o_head_stride", r.o_head_stride}};
  for (const auto& s : strides)
    if (s.value < 0)
      return refuse(Status::invalid_argument, "sparse_attention: %s %lld is negative", s.name,
                    static_cast<long long>(s.value));
  if (a.num_queries > 0 && (a.q == nullptr || a.q_pos == nullptr || a.o == nullptr || a.lse == nullptr))
    return refuse(Status::invalid_argument,
                  "sparse_attention: %lld queries but q, q_pos, o or lse is null (q %p, q_pos %p, o %p, lse %p)",
                  static_cast<long long>(a.num_queries), a.q, static_cast<const void*>(a.q_pos), a.o,
                  static_cast<const void*>(a.lse));
  if (a.num_keys > 0 && (a.k == nullptr || a.v == nullptr || a.k_pos == nullptr))
    return refuse(Status::invalid_argument, "sparse_attention: %lld keys but k, v or k_pos is null (k %p, v %p, k_pos %p)",
                  static_cast<long long>(a.num_keys), a.k, a.v, static_cast<const void*>(a.k_pos));
  if (a.num_chunks < 0 || a.num_chunks > int32_max)
    return refuse(Status::invalid_argument, "sparse_attention: num_chunks %lld is outside [0, 2^31)",
                  static_cast<long long>(a.num_chunks));
  if (a.num_chunks > 0 && (a.chunk_starts == nullptr || (a.num_queries > 0 && a.mass == nullptr)))
    return refuse(Status::invalid_argument, "sparse_attention: %lld chunks but chunk_starts %p or mass %p is null",
                  static_cast<long long>(a.num_chunks), static_cast<const void*>(a.chunk_starts),
                  static_cast<const void*>(a.mass));
  if (a.self_mass != nullptr && a.num_queries > 0 && a.self_rows == nullptr)
    return refuse(Status::invalid_argument, "sparse_attention: self_mass %p given but self_rows is null",
                  static_cast<const void*>(a.self_mass));
  if (a.query_mass != nullptr && (a.query_begin < 0 || a.query_end < a.query_begin || a.query_end > a.num_queries))
    return refuse(Status::invalid_argument,
                  "sparse_attention: query rows [%lld, %lld) are not a range within the %lld queries",
                  static_cast<long long>(a.query_begin), static_cast<long long>(a.query_end),
                  static_cast<long long>(a.num_queries));
  if (a.workspace_bytes < 0)
    return refuse(Status::invalid_argument, "sparse_attention: workspace_bytes %lld is negative",
                  static_cast<long long>(a.workspace_bytes));
  return Status::success;
}

// Checks the data validate() cannot read, on host pointers: key positions non-decreasing; chunk_starts
// non-decreasing within [0, N]; self_rows within [0, N). (Query positions need no order for correctness;
// sorted queries make the kernel's tiles stop early.)
[[nodiscard]] inline Status validate_host_data(const SparseAttentionArgs& a) noexcept {
  for (std::int64_t j = 1; j < a.num_keys; ++j)
    if (a.k_pos[j] < a.k_pos[j - 1])
      return refuse(Status::invalid_argument,
                    "sparse_attention: key positions decrease at index %lld (k_pos[%lld] = %d > k_pos[%lld] = %d)",
                    static_cast<long long>(j), static_cast<long long>(j - 1), a.k_pos[j - 1],
                    static_cast<long long>(j), a.k_pos[j]);
  for (std::int64_t c = 0; c <= a.num_chunks && a.num_chunks > 0; ++c) {
    const std::int64_t s = a.chunk_starts[c];
    if (s < 0 || s > a.num_keys || (c > 0 && s < a.chunk_starts[c - 1]))
      return refuse(Status::invalid_argument,
                    "sparse_attention: chunk_starts[%lld] = %lld is not in [chunk_starts[c-1], num_keys = %lld]",
                    static_cast<long long>(c), static_cast<long long>(s), static_cast<long long>(a.num_keys));
  }
  for (std::int64_t i = 0; i < a.num_queries && a.self_mass != nullptr; ++i)
    if (a.self_rows[i] < 0 || a.self_rows[i] >= a.num_keys)
      return refuse(Status::invalid_argument,
                    "sparse_attention: self_rows[%lld] = %d is not in [0, num_keys = %lld)", static_cast<long long>(i),
                    a.self_rows[i], static_cast<long long>(a.num_keys));
  return Status::success;
}

}  // namespace kvfuse
