#pragma once
// Per-token KV deviation, the score CacheBlend ranks tokens by (section 4.1 "KV deviation", section 4.3
// HKVD tokens): the squared L2 distance between the freshly recomputed K (or V) of a token on one layer and
// the K (or V) loaded from the chunk cache, summed over all KV heads and head dims. Whether the engine passes
// K or V here is the engine's choice (CacheBlend::rank_by; V by default, as in CacheBlend's reference
// implementation); HKVDSelector::select ranks the resulting deviations whichever tensor they came from.
//
// The element math is KVFUSE_HOST_DEVICE so the CUDA deviation kernel runs the very function the host
// reference (and the tests) run. Layout: K or V of one layer as a row-major matrix with one row per token;
// the num_heads * head_dim values of a token (head-major: head h occupies [h * head_dim, (h + 1) * head_dim))
// start its row, and row_stride >= num_heads * head_dim leaves room for padding or a fused K|V row.
//
// fmt-free, so nvcc compiles it; the checked host helper kvfuse::kv_deviation() is in select/hkvd_selector.hpp.

#include <cstdint>

#include "kvfuse/core/config.hpp"
#include "kvfuse/core/dtype.hpp"

namespace kvfuse::detail {

// sum + sum_{e < count} (recomputed[e] - cached[e])^2: the deviation of `count` consecutive values of one
// head added to a running fp32 sum, in order. T is the storage type (float, f16 or bf16), widened exactly to
// fp32 before the subtraction. kv_row_deviation is its sum over a whole fp32 row.
template <class T>
KVFUSE_HOST_DEVICE float kv_accumulate_deviation(float sum, const T* recomputed, const T* cached,
                                                 std::int64_t count) {
  for (std::int64_t e = 0; e < count; ++e) {
    const float d = to_float(recomputed[e]) - to_float(cached[e]);
    sum += d * d;
  }
  return sum;
}

// Delta_kv(KV_i, KV_i^full)[j] for one token (CacheBlend section 4.1), taken as the squared L2 norm of
// (recomputed - cached) over the token's num_heads * head_dim values; `recomputed_row` and `cached_row`
// point at the first value of the token's row.
KVFUSE_HOST_DEVICE float kv_row_deviation(const float* recomputed_row, const float* cached_row, std::int64_t num_heads,
                                          std::int64_t head_dim) {
  return kv_accumulate_deviation(0.0f, recomputed_row, cached_row, num_heads * head_dim);
}

// kv_row_deviation of token row `row` of two [rows, row_stride] matrices (the recomputed and the cached
// K or V of one layer, both indexed by the same row).
KVFUSE_HOST_DEVICE float kv_token_deviation(const float* recomputed, const float* cached, std::int64_t row_stride,
                                            std::int64_t row, std::int64_t num_heads, std::int64_t head_dim) {
  const std::int64_t offset = row * row_stride;
  return kv_row_deviation(recomputed + offset, cached + offset, num_heads, head_dim);
}


}  // namespace kvfuse::detail
