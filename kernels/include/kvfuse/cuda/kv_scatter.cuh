#pragma once
// CUDA KV scatter and gather between a compact row buffer and a contiguous or paged KV cache:
//
//   kv_scatter(args, stream)   cache row at slots[i] = compact row i     (recomputed tokens into the cache)
//   kv_gather(args, stream)    compact row i = cache row at slots[i]     (reused chunks into the prompt buffer)
//
// Arguments, layouts and validation are shared with the CPU references (kvfuse/kernel_args/kv_scatter.hpp); read
// its header for the cache layouts. K and V move in the same launch. One warp per row (grid-stride), 16-byte
// vector copies when every pointer, stride and head row is 16-byte aligned, element copies otherwise; the
// bytes are copied unchanged. Slots and page-table entries are trusted (not checked on the GPU: out of range
// is undefined behaviour, duplicate scatter destinations leave one of the rows, unspecified which); use the
// CPU reference to check them when debugging. No allocation, no synchronization: CUDA-graph capturable.

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "kvfuse/cuda/status.cuh"
#include "kvfuse/kernel_args/kv_scatter.hpp"

namespace kvfuse::cuda {

namespace impl::kv_copy {

inline constexpr int copy_threads = 256;
inline constexpr int copy_unroll = 4;  // units each lane moves per step (loads first, then stores)

// One copy direction in units of `Unit` (uint4 for the vector path, else the element type's size): every
// stride of the compact buffer and of the cache divided by sizeof(Unit) / element size.
struct RowCopyPlan {
  const void* from_k;
  const void* from_v;  // nullptr: K only
  void* to_k;
  void* to_v;
  std::int64_t compact_token_stride;
  std::int64_t compact_head_stride;
  kvfuse::KVCacheLayout cache;
  const std::int32_t* slots;
  std::int64_t num_tokens;
  int num_heads;
  int units_per_head;
  bool to_cache;  // scatter: compact -> cache; gather: cache -> compact
};

template <class Unit>
__device__ __forceinline__ void copy_row(const Unit* __restrict__ from, std::int64_t from_head_stride,
                                         Unit* __restrict__ to, std::int64_t to_head_stride, int units_per_head,
                                         int total, int lane) {
  for (int base = lane; base < total; base += 32 * copy_unroll) {
    Unit v[copy_unroll];
#pragma unroll
    for (int u = 0; u < copy_unroll; ++u) {
      const int j = base + u * 32;
      if (j < total) {
        const int h = j / units_per_head;
        v[u] = from[h * from_head_stride + (j - h * units_per_head)];
      }
    }
#pragma unroll
    for (int u = 0; u < copy_unroll; ++u) {
      const int j = base + u * 32;
      if (j < total) {
        const int h = j / units_per_head;
        to[h * to_head_stride + (j - h * units_per_head)] = v[u];
      }
    }
  }
}

template <class Unit>
__global__ void __launch_bounds__(copy_threads) kv_row_copy_kernel(RowCopyPlan p) {
  const int lane = static_cast<int>(threadIdx.x) & 31;
  const std::int64_t warps = (static_cast<std::int64_t>(gridDim.x) * copy_threads) / 32;
  const int total = p.num_heads * p.units_per_head;
  for (std::int64_t t = (static_cast<std::int64_t>(blockIdx.x) * copy_threads + threadIdx.x) / 32; t < p.num_tokens;
       t += warps) {
    const std::int64_t cache_offset = kvfuse::cache_slot_offset(p.cache, p.slots[t]);
    const std::int64_t compact_offset = t * p.compact_token_stride;
    const std::int64_t from_offset = p.to_cache ? compact_offset : cache_offset;
    const std::int64_t to_offset = p.to_cache ? cache_offset : compact_offset;
    const std::int64_t from_head = p.to_cache ? p.compact_head_stride : p.cache.head_stride;
    const std::int64_t to_head = p.to_cache ? p.cache.head_stride : p.compact_head_stride;
    copy_row(static_cast<const Unit*>(p.from_k) + from_offset, from_head, static_cast<Unit*>(p.to_k) + to_offset,
             to_head, p.units_per_head, total, lane);
    if (p.from_v != nullptr) {
      copy_row(static_cast<const Unit*>(p.from_v) + from_offset, from_head, static_cast<Unit*>(p.to_v) + to_offset,
               to_head, p.units_per_head, total, lane);
    }
  }
}

inline bool aligned_to16(const void* p) { return (reinterpret_cast<std::uintptr_t>(p) & 15u) == 0; }

// Launches the copy; element_bytes is the dtype's size, and every stride of `p` is still in elements.
inline Status launch_row_copy(RowCopyPlan p, std::int64_t head_dim, int element_bytes, const char* what,
                              cudaStream_t stream) noexcept {
  const auto bytes16 = [&](std::int64_t stride) { return (stride * element_bytes) % 16 == 0; };
  const bool paged = p.cache.page_table != nullptr;
  const bool vectorized = aligned_to16(p.from_k) && aligned_to16(p.to_k) &&
                          (p.from_v == nullptr || (aligned_to16(p.from_v) && aligned_to16(p.to_v))) &&
                          bytes16(head_dim) && bytes16(p.compact_token_stride) && bytes16(p.compact_head_stride) &&
                          bytes16(p.cache.slot_stride) && bytes16(p.cache.head_stride) &&
                          (!paged || bytes16(p.cache.page_stride));
  const int unit_bytes = vectorized ? 16 : element_bytes;
  const int scale = unit_bytes / element_bytes;  // elements per unit; every stride divides by it
  p.compact_token_stride /= scale;
  p.compact_head_stride /= scale;
  p.cache.slot_stride /= scale;
  p.cache.head_stride /= scale;
  p.cache.page_stride /= scale;
  p.units_per_head = static_cast<int>(head_dim / scale);
  constexpr std::int64_t rows_per_block = copy_threads / 32;
  const std::int64_t wanted = (p.num_tokens + rows_per_block - 1) / rows_per_block;
  const auto blocks = static_cast<unsigned>(wanted < (1 << 20) ? wanted : (1 << 20));
  if (vectorized) {
    kv_row_copy_kernel<uint4><<<blocks, copy_threads, 0, stream>>>(p);
  } else if (element_bytes == 4) {
    kv_row_copy_kernel<std::uint32_t><<<blocks, copy_threads, 0, stream>>>(p);
  } else {
    kv_row_copy_kernel<std::uint16_t><<<blocks, copy_threads, 0, stream>>>(p);
  }
  return launch_status(what);
}

}  // namespace impl::kv_copy

// Writes compact row i (K and V) into the cache at slots[i]. See kvfuse::KVScatterArgs.
[[nodiscard]] inline Status kv_scatter(const kvfuse::KVScatterArgs& args, cudaStream_t stream = nullptr) noexcept {
  if (const Status s = kvfuse::validate(args); s != Status::success) return s;
  if (args.num_tokens == 0) return Status::success;
  impl::kv_copy::RowCopyPlan p{};
  p.from_k = args.src_k;
  p.from_v = args.src_v;
  p.to_k = args.cache_k;
  p.to_v = args.cache_v;
  p.compact_token_stride = args.src_token_stride;
  p.compact_head_stride = args.src_head_stride;
  p.cache = args.cache;
  p.slots = args.slots;
  p.num_tokens = args.num_tokens;
  p.num_heads = static_cast<int>(args.num_heads);
  p.to_cache = true;
  return impl::kv_copy::launch_row_copy(p, args.head_dim, kvfuse::dtype_size(args.dtype), "kv_scatter", stream);
}

// Reads the cache rows at slots[i] (K and V) into compact row i. See kvfuse::KVGatherArgs.
[[nodiscard]] inline Status kv_gather(const kvfuse::KVGatherArgs& args, cudaStream_t stream = nullptr) noexcept {
  if (const Status s = kvfuse::validate(args); s != Status::success) return s;
  if (args.num_tokens == 0) return Status::success;
  impl::kv_copy::RowCopyPlan p{};
  p.from_k = args.cache_k;
  p.from_v = args.cache_v;
  p.to_k = args.dst_k;
  p.to_v = args.dst_v;
  p.compact_token_stride = args.dst_token_stride;
  p.compact_head_stride = args.dst_head_stride;
  p.cache = args.cache;
  p.slots = args.slots;
  p.num_tokens = args.num_tokens;
  p.num_heads = static_cast<int>(args.num_heads);
  p.to_cache = false;
  return impl::kv_copy::launch_row_copy(p, args.head_dim, kvfuse::dtype_size(args.dtype), "kv_gather", stream);
}

}  // namespace kvfuse::cuda
