#pragma once
// CPU reference of the KV scatter and gather (kvfuse::ref::kv_scatter, kv_gather) kernels: host memory, element by
// element, the same element math as the CUDA kernels, so CI checks the kernels without a GPU (tests/emu runs the
// kernels' own sources against it). Part of kvfuse's test and benchmark harness, not of the library: arguments, layouts
// and validation are kvfuse/kernel_args/kv_scatter.hpp, which the launchers (kvfuse/cuda/kv_scatter.cuh) share.

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <limits>
#include <new>
#include <vector>

#include "kvfuse/kernel_args/kv_scatter.hpp"

namespace kvfuse {

namespace ref {

namespace kv_copy_detail {

// Every slot in [0, num_slots) and its page-table entry in [0, num_pages).
inline Status check_slots(const char* op, const KVCacheLayout& c, const std::int32_t* slots,
                          std::int64_t num_tokens) noexcept {
  for (std::int64_t i = 0; i < num_tokens; ++i) {
    const std::int64_t slot = slots[i];
    if (slot < 0 || slot >= c.num_slots)
      return refuse(Status::invalid_argument, "%s: slots[%lld] = %lld is not in [0, %lld)", op,
                    static_cast<long long>(i), static_cast<long long>(slot), static_cast<long long>(c.num_slots));
    if (c.page_table != nullptr) {
      const std::int64_t page = c.page_table[slot / c.page_size];
      if (page < 0 || page >= c.num_pages)
        return refuse(Status::invalid_argument,
                      "%s: page_table[%lld] = %lld (for slots[%lld] = %lld) is not in [0, %lld)", op,
                      static_cast<long long>(slot / c.page_size), static_cast<long long>(page),
                      static_cast<long long>(i), static_cast<long long>(slot), static_cast<long long>(c.num_pages));
    }
  }
  return Status::success;
}

// Copies `num_heads` heads of `row_bytes` bytes each.
inline void copy_row(unsigned char* dst, std::int64_t dst_head_stride, const unsigned char* src,
                     std::int64_t src_head_stride, std::int64_t num_heads, std::size_t row_bytes) noexcept {
  for (std::int64_t h = 0; h < num_heads; ++h)
    std::memcpy(dst + h * dst_head_stride, src + h * src_head_stride, row_bytes);
}

}  // namespace kv_copy_detail

// CPU reference of kvfuse::cuda::kv_scatter: cache row at slots[i] = compact row i, K and V. Refuses (writing
// nothing) a slot or page out of range and two rows that land on the same physical slot.
[[nodiscard]] inline Status kv_scatter(const KVScatterArgs& a) noexcept {
  if (const Status s = validate(a); s != Status::success) return s;
  if (const Status s = kv_copy_detail::check_slots("kv_scatter", a.cache, a.slots, a.num_tokens); s != Status::success)
    return s;
  try {
    std::vector<std::int64_t> offsets(static_cast<std::size_t>(a.num_tokens));
    for (std::int64_t i = 0; i < a.num_tokens; ++i)
      offsets[static_cast<std::size_t>(i)] = cache_slot_offset(a.cache, a.slots[i]);
    std::vector<std::int64_t> sorted = offsets;
    std::sort(sorted.begin(), sorted.end());
    const auto dup = std::adjacent_find(sorted.begin(), sorted.end());
    if (dup != sorted.end()) {
      std::int64_t first = -1;
      std::int64_t second = -1;
      for (std::int64_t i = 0; i < a.num_tokens; ++i) {
        if (offsets[static_cast<std::size_t>(i)] != *dup) continue;
        (first < 0 ? first : second) = i;
        if (second >= 0) break;
      }
      return refuse(Status::invalid_argument,
                    "kv_scatter: rows %lld and %lld (slots %d and %d) are written to the same cache slot",
                    static_cast<long long>(first), static_cast<long long>(second), a.slots[first], a.slots[second]);
    }
    const std::int64_t size = dtype_size(a.dtype);
    const auto row_bytes = static_cast<std::size_t>(a.head_dim * size);
    const void* src[2] = {a.src_k, a.src_v};
    void* dst[2] = {a.cache_k, a.cache_v};
    for (int tensor = 0; tensor < 2; ++tensor) {
      if (src[tensor] == nullptr) continue;
      for (std::int64_t i = 0; i < a.num_tokens; ++i) {
        kv_copy_detail::copy_row(static_cast<unsigned char*>(dst[tensor]) + offsets[static_cast<std::size_t>(i)] * size,
                                 a.cache.head_stride * size,
                                 static_cast<const unsigned char*>(src[tensor]) + i * a.src_token_stride * size,
                                 a.src_head_stride * size, a.num_heads, row_bytes);
      }
    }
  } catch (const std::bad_alloc&) {
    return refuse(Status::invalid_argument, "kv_scatter: out of host memory for %lld slot offsets",
                  static_cast<long long>(a.num_tokens));
  }
  return Status::success;
}

// CPU reference of kvfuse::cuda::kv_gather: compact row i = cache row at slots[i], K and V. Refuses (writing
// nothing) a slot or page out of range.
[[nodiscard]] inline Status kv_gather(const KVGatherArgs& a) noexcept {
  if (const Status s = validate(a); s != Status::success) return s;
  if (const Status s = kv_copy_detail::check_slots("kv_gather", a.cache, a.slots, a.num_tokens); s != Status::success)
    return s;
  const std::int64_t size = dtype_size(a.dtype);
  const auto row_bytes = static_cast<std::size_t>(a.head_dim * size);
  const void* src[2] = {a.cache_k, a.cache_v};
  void* dst[2] = {a.dst_k, a.dst_v};
  for (int tensor = 0; tensor < 2; ++tensor) {
    if (src[tensor] == nullptr) continue;
    for (std::int64_t i = 0; i < a.num_tokens; ++i) {
      kv_copy_detail::copy_row(
          static_cast<unsigned char*>(dst[tensor]) + i * a.dst_token_stride * size, a.dst_head_stride * size,
          static_cast<const unsigned char*>(src[tensor]) + cache_slot_offset(a.cache, a.slots[i]) * size,
          a.cache.head_stride * size, a.num_heads, row_bytes);
    }
  }
  return Status::success;
}

}  // namespace ref
}  // namespace kvfuse
