#pragma once
// KV deviation and deterministic top-k: the arguments shared by the CUDA launchers (kvfuse/cuda/kv_topk.cuh)
// and the CPU references of the test harness (harness/include/kvfuse/harness/ref/kv_topk.hpp), and their
// validation. CacheBlend section 4.1 ("KV deviation") scores every token by the squared L2
// distance between its recomputed and its cached K (or V) on one layer; section 4.3 keeps the r * N tokens
// of highest deviation (HKVD tokens), ties to the lower position.
//
// Layouts. K (or V) of one layer, storage f32, f16 or bf16 (both tensors the same dtype), sizes and strides
// in elements: element e of head h of token t is at  base + t * token_stride + h * head_stride + e  with the
// head_dim values of a head contiguous. NHD ([tokens, heads, dim]): token_stride = heads * dim,
// head_stride = dim; HND ([heads, tokens, dim]): token_stride = dim, head_stride = tokens * dim. The
// recomputed and the cached tensor have their own strides. Token t of the recomputed tensor is compared with
// row cached_rows[t] of the cached tensor when cached_rows is given (e.g. a compact [S, H, d] buffer of the
// selected tokens against the prompt's [N, H, d] buffer), else with row t.
//
// Top-k. Scores (fp32, e.g. the deviations) of num_items candidates; the result is the indices of the k
// candidates that rank first -- higher score, equal scores to the lower index -- in ascending order. With
// candidates sorted by position (as HKVDSelector's token sets are), "lower index" is "lower position". NaN
// scores rank above +inf (detail/topk.hpp). top_k_count(r, n) gives the k HKVDSelector keeps.
//
// Gradual filtering (HKVDSelectArgs, hkvd_select): the same top-k over the entries of S_l, the rows that must
// stay taken out of the ranking, S_{l+1} written as rows (HKVDSelector::select's set).
//
// fmt-free: CUDA translation units include it. The references never throw; like the launchers they return a
// kvfuse::Status and name the bad value in kvfuse::last_status_message().

#include <cmath>
#include <cstdint>
#include <limits>

#include "kvfuse/core/dtype.hpp"
#include "kvfuse/core/status.hpp"
#include "kvfuse/detail/kv_deviation.hpp"
#include "kvfuse/detail/math.hpp"
#include "kvfuse/detail/topk.hpp"

namespace kvfuse {

// dev[t] = sum_h sum_e (recomputed - cached)^2 over K or V of one layer (CacheBlend section 4.1).
struct KVDeviationArgs {
  const void* recomputed = nullptr;  // token t at recomputed + t * recomputed_token_stride
  const void* cached = nullptr;      // row r at cached + r * cached_token_stride
  float* deviation = nullptr;        // [num_tokens] output, fp32
  DType dtype = DType::bf16;         // storage of both tensors
  std::int64_t num_tokens = 0;
  std::int64_t num_heads = 0;
  std::int64_t head_dim = 0;
  std::int64_t recomputed_token_stride = 0;
  std::int64_t recomputed_head_stride = 0;
  std::int64_t cached_token_stride = 0;
  std::int64_t cached_head_stride = 0;
  // Optional [num_tokens] row of the cached tensor each token is compared with; nullptr: row t. Entries must
  // lie in [0, num_cached_rows): the CPU reference checks them, the GPU kernel trusts them.
  const std::int32_t* cached_rows = nullptr;
  std::int64_t num_cached_rows = 0;
};

// The k candidates of highest score (ties to the lower index), written as ascending indices.
struct TopKArgs {
  const float* scores = nullptr;    // [num_items]
  std::int32_t* indices = nullptr;  // [k] output, ascending
  std::int64_t num_items = 0;       // at most 2^31 - 1
  std::int64_t k = 0;               // 0 <= k <= num_items
};

// CacheBlend section 4.3 gradual filtering on the device: S_{l+1} from S_l and the per-entry scores of layer l,
// the set HKVDSelector::select(l, S_l, scores) returns (select/hkvd_selector.hpp). With an HKVDSelector `sel`
// of the request: mandatory[t] = !sel.is_reusable(t) for every row t, keep = sel.keep_count(l); the size of
// S_{l+1} is known on the host before the call, sel.plan().tokens_per_layer[l + 1].
struct HKVDSelectArgs {
  const std::int32_t* current = nullptr;    // [num_current] S_l: rows, strictly ascending
  const float* scores = nullptr;            // [num_current] score of entry i (kv_deviation, cached_rows = current)
  const std::uint8_t* mandatory = nullptr;  // [num_rows] nonzero: the row always stays (query, uncached chunks)
  std::int64_t num_current = 0;             // |S_l|, below 2^31
  std::int64_t num_rows = 0;                // N: rows lie in [0, N)
  std::int64_t keep = 0;                    // candidates (entries whose row is not mandatory) to keep, >= 0
  std::int32_t* next = nullptr;             // [num_current] output: S_{l+1}, ascending, a subset of S_l
  std::int32_t* num_next = nullptr;         // [1] output: |S_{l+1}|
};

// The number of tokens a ratio keeps, rounded as HKVDSelector keeps them (detail::keep_count: the nearest
// integer, halves up), so a GPU selection keeps exactly as many tokens as the host selector. Ratios outside
// [0, 1] are clamped; NaN gives 0.
[[nodiscard]] inline std::int64_t top_k_count(double ratio, std::int64_t n) noexcept { return detail::keep_count(ratio, n); }

namespace detail {
inline bool kv_topk_dtype_known(DType t) { return t == DType::f32 || t == DType::f16 || t == DType::bf16; }
}  // namespace detail

[[nodiscard]] inline Status validate(const KVDeviationArgs& a) noexcept {
  if (!detail::kv_topk_dtype_known(a.dtype))
    return refuse(Status::unsupported, "kv_deviation: dtype %d is not f32, f16 or bf16", static_cast<int>(a.dtype));
  if (a.num_tokens < 0 || a.num_tokens > std::numeric_limits<std::int32_t>::max())
    return refuse(Status::invalid_argument, "kv_deviation: num_tokens %lld is not in [0, 2^31)",
                  static_cast<long long>(a.num_tokens));
  if (a.num_heads < 1)
    return refuse(Status::invalid_argument, "kv_deviation: num_heads %lld must be at least 1",
                  static_cast<long long>(a.num_heads));
  if (a.head_dim < 1)
    return refuse(Status::invalid_argument, "kv_deviation: head_dim %lld must be at least 1",
                  static_cast<long long>(a.head_dim));
  if (a.head_dim > std::numeric_limits<std::int32_t>::max() / a.num_heads)
    return refuse(Status::invalid_argument, "kv_deviation: num_heads * head_dim = %lld * %lld exceeds 2^31",
                  static_cast<long long>(a.num_heads), static_cast<long long>(a.head_dim));
  if (a.recomputed_token_stride < 0 || a.recomputed_head_stride < 0)
    return refuse(Status::invalid_argument, "kv_deviation: recomputed strides (token %lld, head %lld) are negative",
                  static_cast<long long>(a.recomputed_token_stride), static_cast<long long>(a.recomputed_head_stride));
  if (a.cached_token_stride < 0 || a.cached_head_stride < 0)
    return refuse(Status::invalid_argument, "kv_deviation: cached strides (token %lld, head %lld) are negative",
                  static_cast<long long>(a.cached_token_stride), static_cast<long long>(a.cached_head_stride));
  if (a.num_tokens > 0 && (a.recomputed == nullptr || a.cached == nullptr || a.deviation == nullptr))
    return refuse(Status::invalid_argument, "kv_deviation: a null pointer (recomputed %p, cached %p, deviation %p)",
                  a.recomputed, a.cached, static_cast<const void*>(a.deviation));
  if (a.cached_rows != nullptr && a.num_cached_rows < 1)
    return refuse(Status::invalid_argument, "kv_deviation: cached_rows given but num_cached_rows is %lld",
                  static_cast<long long>(a.num_cached_rows));
  return Status::success;
}

[[nodiscard]] inline Status validate(const TopKArgs& a) noexcept {
  if (a.num_items < 0 || a.num_items > detail::top_k_max_items)
    return refuse(Status::invalid_argument, "top_k_tokens: num_items %lld is not in [0, 2^31)",
                  static_cast<long long>(a.num_items));
  if (a.k < 0 || a.k > a.num_items)
    return refuse(Status::invalid_argument, "top_k_tokens: k %lld is not in [0, num_items = %lld]",
                  static_cast<long long>(a.k), static_cast<long long>(a.num_items));
  if (a.k > 0 && (a.scores == nullptr || a.indices == nullptr))
    return refuse(Status::invalid_argument, "top_k_tokens: a null pointer (scores %p, indices %p) with k = %lld",
                  static_cast<const void*>(a.scores), static_cast<const void*>(a.indices), static_cast<long long>(a.k));
  return Status::success;
}

[[nodiscard]] inline Status validate(const HKVDSelectArgs& a) noexcept {
  if (a.num_current < 0 || a.num_current > detail::top_k_max_items)
    return refuse(Status::invalid_argument, "hkvd_select: num_current %lld is not in [0, 2^31)",
                  static_cast<long long>(a.num_current));
  if (a.num_rows < a.num_current || a.num_rows > detail::top_k_max_items)
    return refuse(Status::invalid_argument, "hkvd_select: num_rows %lld is not in [num_current = %lld, 2^31)",
                  static_cast<long long>(a.num_rows), static_cast<long long>(a.num_current));
  if (a.keep < 0)
    return refuse(Status::invalid_argument, "hkvd_select: keep %lld is negative", static_cast<long long>(a.keep));
  if (a.num_next == nullptr)
    return refuse(Status::invalid_argument, "hkvd_select: num_next is null");
  if ((a.num_current > 0 && (a.current == nullptr || a.scores == nullptr || a.next == nullptr)) ||
      (a.num_rows > 0 && a.mandatory == nullptr))
    return refuse(Status::invalid_argument,
                  "hkvd_select: a null pointer (current %p, scores %p, mandatory %p, next %p) with num_current = %lld, "
                  "num_rows = %lld",
                  static_cast<const void*>(a.current), static_cast<const void*>(a.scores),
                  static_cast<const void*>(a.mandatory), static_cast<const void*>(a.next),
                  static_cast<long long>(a.num_current), static_cast<long long>(a.num_rows));
  return Status::success;
}

}  // namespace kvfuse
