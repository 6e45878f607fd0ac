#pragma once
// CPU reference of the KV deviation, deterministic top-k and gradual filtering (kvfuse::ref::kv_deviation, top_k,
// hkvd_select) kernels: host memory, element by element, the same element math as the CUDA kernels, so CI checks the
// kernels without a GPU (tests/emu runs the kernels' own sources against it). Part of kvfuse's test and benchmark
// harness, not of the library: arguments, layouts and validation are kvfuse/kernel_args/kv_topk.hpp, which the
// launchers (kvfuse/cuda/kv_topk.cuh) share.

#include <cmath>
#include <cstdint>
#include <limits>

#include "kvfuse/kernel_args/kv_topk.hpp"

namespace kvfuse {

namespace ref {

namespace kv_topk_detail {

// The radix select of the top-k (detail/topk.hpp) on the host: the k-th largest of the keys key_of(i),
// i < n (1 <= k <= n), found digit by digit as the GPU passes find it.
template <class KeyOf>
std::uint64_t radix_threshold(std::int64_t n, std::int64_t k, KeyOf key_of) noexcept {
  std::uint64_t prefix = 0;
  auto remaining = static_cast<std::uint32_t>(k);
  std::uint32_t hist[kvfuse::detail::radix_max_bins];
  for (int pass = 0; pass < kvfuse::detail::radix_passes; ++pass) {
    const int bins = 1 << kvfuse::detail::radix_pass_bits(pass);
    for (int b = 0; b < bins; ++b) hist[b] = 0;
    const std::uint64_t mask = kvfuse::detail::radix_prefix_mask(pass);
    for (std::int64_t i = 0; i < n; ++i) {
      const std::uint64_t key = key_of(i);
      if ((key & mask) == prefix) ++hist[kvfuse::detail::radix_digit(key, pass)];
    }
    if (kvfuse::detail::radix_select_step(hist, pass, prefix, remaining)) break;
  }
  return prefix;
}

template <class T>
void kv_deviation_rows(const KVDeviationArgs& a) noexcept {
  const auto* recomputed = static_cast<const T*>(a.recomputed);
  const auto* cached = static_cast<const T*>(a.cached);
  for (std::int64_t t = 0; t < a.num_tokens; ++t) {
    const std::int64_t row = a.cached_rows != nullptr ? a.cached_rows[t] : t;
    float sum = 0.0f;
    for (std::int64_t h = 0; h < a.num_heads; ++h) {
      sum = kvfuse::detail::kv_accumulate_deviation(
          sum, recomputed + t * a.recomputed_token_stride + h * a.recomputed_head_stride,
          cached + row * a.cached_token_stride + h * a.cached_head_stride, a.head_dim);
    }
    a.deviation[t] = sum;
  }
}

}  // namespace kv_topk_detail

// CPU reference of kvfuse::cuda::kv_deviation: deviation[t] = sum over heads (0 up) of the in-order fp32
// sums of kvfuse::detail::kv_accumulate_deviation -- bit for bit detail::kv_row_deviation on contiguous fp32
// rows. Refuses (writing nothing) a cached_rows entry outside [0, num_cached_rows).
[[nodiscard]] inline Status kv_deviation(const KVDeviationArgs& a) noexcept {
  if (const Status s = validate(a); s != Status::success) return s;
  if (a.cached_rows != nullptr) {
    for (std::int64_t t = 0; t < a.num_tokens; ++t) {
      if (a.cached_rows[t] < 0 || a.cached_rows[t] >= a.num_cached_rows)
        return refuse(Status::invalid_argument, "kv_deviation: cached_rows[%lld] = %d is not in [0, %lld)",
                      static_cast<long long>(t), a.cached_rows[t], static_cast<long long>(a.num_cached_rows));
    }
  }
  switch (a.dtype) {
    case DType::f32:
      kv_topk_detail::kv_deviation_rows<float>(a);
      break;
    case DType::f16:
      kv_topk_detail::kv_deviation_rows<f16>(a);
      break;
    case DType::bf16:
      kv_topk_detail::kv_deviation_rows<bf16>(a);
      break;
  }
  return Status::success;
}

// CPU reference of kvfuse::cuda::top_k_tokens, by the same radix select the kernel runs (detail/topk.hpp):
// per pass a histogram of the digit over the keys matching the prefix found so far, then
// radix_select_step; finally every key >= the prefix, in index order. O(6 * num_items), no allocation.
[[nodiscard]] inline Status top_k_tokens(const TopKArgs& a) noexcept {
  if (const Status s = validate(a); s != Status::success) return s;
  if (a.k == 0) return Status::success;
  const std::uint64_t prefix = kv_topk_detail::radix_threshold(
      a.num_items, a.k, [&](std::int64_t i) { return kvfuse::detail::top_k_key(a.scores[i], i); });
  std::int64_t out = 0;
  for (std::int64_t i = 0; i < a.num_items && out < a.k; ++i) {
    if (kvfuse::detail::top_k_key(a.scores[i], i) >= prefix) a.indices[out++] = static_cast<std::int32_t>(i);
  }
  return Status::success;
}

// CPU reference of kvfuse::cuda::hkvd_select: the same keys (detail::hkvd_rank_score, detail::top_k_key),
// the same radix select (radix_threshold) and the same rule (detail::hkvd_kept), so the same set as the
// kernel and as HKVDSelector::select. Refuses (writing nothing) what HKVDSelector refuses: a row of current
// outside [0, num_rows) or not above the previous one, a negative candidate score, a mandatory row missing
// from current. O(num_rows + 6 * num_current), no allocation.
[[nodiscard]] inline Status hkvd_select(const HKVDSelectArgs& a) noexcept {
  if (const Status s = validate(a); s != Status::success) return s;
  std::int64_t mandatory_in_current = 0;
  for (std::int64_t i = 0; i < a.num_current; ++i) {
    const std::int32_t row = a.current[i];
    if (row < 0 || row >= a.num_rows || (i > 0 && row <= a.current[i - 1]))
      return refuse(Status::invalid_argument,
                    "hkvd_select: current[%lld] = %d is not in [0, num_rows = %lld) or not above the entry before",
                    static_cast<long long>(i), row, static_cast<long long>(a.num_rows));
    if (a.mandatory[row] != 0) {
      ++mandatory_in_current;
    } else if (a.scores[i] < 0.0f) {
      return refuse(Status::invalid_argument, "hkvd_select: score %g of row %d (entry %lld) is negative",
                    static_cast<double>(a.scores[i]), row, static_cast<long long>(i));
    }
  }
  std::int64_t mandatory_rows = 0;
  for (std::int64_t t = 0; t < a.num_rows; ++t) mandatory_rows += a.mandatory[t] != 0 ? 1 : 0;
  if (mandatory_in_current != mandatory_rows)
    return refuse(Status::invalid_argument, "hkvd_select: current holds %lld of the %lld mandatory rows",
                  static_cast<long long>(mandatory_in_current), static_cast<long long>(mandatory_rows));

  const auto key_of = [&](std::int64_t i) {
    return kvfuse::detail::top_k_key(kvfuse::detail::hkvd_rank_score(a.scores[i], a.mandatory[a.current[i]] != 0), i);
  };
  const std::int64_t k = a.keep < a.num_current ? a.keep : a.num_current;
  const std::uint64_t threshold = k > 0 ? kv_topk_detail::radix_threshold(a.num_current, k, key_of) : 0;
  std::int32_t out = 0;
  for (std::int64_t i = 0; i < a.num_current; ++i) {
    if (kvfuse::detail::hkvd_kept(a.mandatory[a.current[i]] != 0, key_of(i), k > 0, threshold))
      a.next[out++] = a.current[i];
  }
  *a.num_next = out;
  return Status::success;
}

}  // namespace ref
}  // namespace kvfuse
