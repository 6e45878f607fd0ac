#pragma once
// KV scatter and gather: the arguments shared by the CUDA launchers (kvfuse/cuda/kv_scatter.cuh) and the CPU
// references of the test harness (harness/include/kvfuse/harness/ref/kv_scatter.hpp), and their validation.
//
//   scatter: after a layer recomputed the K/V of S selected tokens (a compact buffer, row i = token i), write
//            row i into the cache at slot slots[i] (CacheBlend section 4.3: the recomputed HKVD tokens
//            replace their cached K/V; the other tokens keep the reused values).
//   gather:  read the cached rows of reused chunks into the prompt's contiguous buffer: row i of the buffer
//            is the cache row at slot slots[i] (a chunk's range of slots, or any list).
//
// K and V move in one call (two tensors with the same layout; the V pointers may both be null to move K
// only). Storage f32, f16 or bf16 (the bytes are copied, NaN payloads included). Sizes and strides in
// elements; element e of head h of a row is at  row + h * head_stride + e  with the head_dim values of a head
// contiguous.
//
// Compact buffer (the scatter source, the gather destination): row i at base + i * token_stride
// (NHD [S, H, d]: token_stride = H * d, head_stride = d; HND [H, S, d]: token_stride = d, head_stride = S * d).
//
// Cache (KVCacheLayout), one layer:
//   contiguous (page_table == nullptr): slot s at base + s * slot_stride, 0 <= s < num_slots. This also
//     covers vLLM's slot_mapping: a [num_blocks, block_size, H, d] cache addressed by the physical slot
//     block * block_size + offset is contiguous with slot_stride = H * d.
//   paged (a block table, vLLM style): slot s is logical; page_table[s / page_size] is its physical page and
//     s % page_size its row there: base + page_table[s / page_size] * page_stride + (s % page_size) *
//     slot_stride, 0 <= s < num_slots, page_table holds ceil(num_slots / page_size) entries in
//     [0, num_pages). [num_pages, page_size, H, d]: slot_stride = H * d, head_stride = d,
//     page_stride = page_size * H * d.
//
// Trust. The host cannot read device memory cheaply, so the launchers validate what the host knows (sizes,
// strides, pointers, that the written tensor's rows cannot overlap); the entries of slots and page_table are
// trusted on the GPU (out of range: undefined behaviour; duplicate scatter destinations: one of the rows wins,
// unspecified which). The CPU references check every entry and refuse, writing nothing, a slot or page out
// of range and (scatter) two rows written to the same physical slot.
//
// fmt-free: CUDA translation units include it. The references never throw.

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <limits>
#include <new>
#include <vector>

#include "kvfuse/core/config.hpp"
#include "kvfuse/core/dtype.hpp"
#include "kvfuse/core/status.hpp"

namespace kvfuse {

struct KVCacheLayout {
  std::int64_t num_slots = 0;                // addressable (logical) slots
  std::int64_t slot_stride = 0;              // between consecutive slots (of a page when paged)
  std::int64_t head_stride = 0;              // between the heads of a slot
  const std::int32_t* page_table = nullptr;  // nullptr: contiguous; else [ceil(num_slots / page_size)]
  std::int64_t page_size = 0;                // paged: slots per page
  std::int64_t page_stride = 0;              // paged: between physical pages
  std::int64_t num_pages = 0;                // paged: physical pages in the cache
};

// Element offset of slot `slot` (head 0, element 0) in a cache with layout `c`; the slot and its page-table
// entry are not checked.
KVFUSE_HOST_DEVICE std::int64_t cache_slot_offset(const KVCacheLayout& c, std::int64_t slot) {
  if (c.page_table == nullptr) return slot * c.slot_stride;
  const std::int64_t page = c.page_table[slot / c.page_size];
  return page * c.page_stride + (slot % c.page_size) * c.slot_stride;
}

struct KVScatterArgs {
  const void* src_k = nullptr;  // compact rows: row i at src + i * src_token_stride
  const void* src_v = nullptr;  // nullptr (with cache_v) to scatter K only
  std::int64_t src_token_stride = 0;
  std::int64_t src_head_stride = 0;
  void* cache_k = nullptr;
  void* cache_v = nullptr;
  KVCacheLayout cache;
  const std::int32_t* slots = nullptr;  // [num_tokens] destination slot of row i
  std::int64_t num_tokens = 0;
  std::int64_t num_heads = 0;
  std::int64_t head_dim = 0;
  DType dtype = DType::bf16;
};

struct KVGatherArgs {
  const void* cache_k = nullptr;
  const void* cache_v = nullptr;  // nullptr (with dst_v) to gather K only
  KVCacheLayout cache;
  void* dst_k = nullptr;  // compact rows: row i at dst + i * dst_token_stride
  void* dst_v = nullptr;
  std::int64_t dst_token_stride = 0;
  std::int64_t dst_head_stride = 0;
  const std::int32_t* slots = nullptr;  // [num_tokens] source slot of row i
  std::int64_t num_tokens = 0;
  std::int64_t num_heads = 0;
  std::int64_t head_dim = 0;
  DType dtype = DType::bf16;
};

namespace detail {

// Rows of `count` tokens with `heads` heads of `dim` values at token_stride / head_stride never share an
// element: heads disjoint inside a token and tokens disjoint (NHD-like), or the other way round (HND-like).
inline bool kv_copy_rows_disjoint(std::int64_t count, std::int64_t token_stride, std::int64_t head_stride,
                                  std::int64_t heads, std::int64_t dim) {
  const bool heads_apart = heads == 1 || head_stride >= dim;
  const bool tokens_apart = count <= 1 || token_stride >= dim;
  const bool nhd = heads_apart && (count <= 1 || token_stride >= (heads - 1) * head_stride + dim);
  const bool hnd = tokens_apart && (heads == 1 || head_stride >= (count - 1) * token_stride + dim);
  return nhd || hnd;
}

struct KVCopyShape {
  const char* op;
  DType dtype;
  std::int64_t num_tokens, num_heads, head_dim;
  std::int64_t compact_token_stride, compact_head_stride;
  const KVCacheLayout* cache;
  const std::int32_t* slots;
  bool writes_cache;
};

inline Status validate_kv_copy(const KVCopyShape& s) noexcept {
  const auto ll = [](std::int64_t v) { return static_cast<long long>(v); };
  if (s.dtype != DType::f32 && s.dtype != DType::f16 && s.dtype != DType::bf16)
    return refuse(Status::unsupported, "%s: dtype %d is not f32, f16 or bf16", s.op, static_cast<int>(s.dtype));
  if (s.num_tokens < 0 || s.num_tokens > std::numeric_limits<std::int32_t>::max())
    return refuse(Status::invalid_argument, "%s: num_tokens %lld is not in [0, 2^31)", s.op, ll(s.num_tokens));
  if (s.num_heads < 1)
    return refuse(Status::invalid_argument, "%s: num_heads %lld must be at least 1", s.op, ll(s.num_heads));
  if (s.head_dim < 1)
    return refuse(Status::invalid_argument, "%s: head_dim %lld must be at least 1", s.op, ll(s.head_dim));
  if (s.head_dim > std::numeric_limits<std::int32_t>::max() / s.num_heads)
    return refuse(Status::invalid_argument, "%s: num_heads * head_dim = %lld * %lld exceeds 2^31", s.op,
                  ll(s.num_heads), ll(s.head_dim));
  if (s.compact_token_stride < 0 || s.compact_head_stride < 0)
    return refuse(Status::invalid_argument, "%s: compact buffer strides (token %lld, head %lld) are negative", s.op,
                  ll(s.compact_token_stride), ll(s.compact_head_stride));
  const KVCacheLayout& c = *s.cache;
  if (c.num_slots < 0 || c.num_slots > std::numeric_limits<std::int32_t>::max())
    return refuse(Status::invalid_argument, "%s: cache num_slots %lld is not in [0, 2^31)", s.op, ll(c.num_slots));
  if (s.num_tokens > 0 && c.num_slots == 0)
    return refuse(Status::invalid_argument, "%s: %lld rows but the cache has no slots", s.op, ll(s.num_tokens));
  if (c.slot_stride < 0 || c.head_stride < 0)
    return refuse(Status::invalid_argument, "%s: cache strides (slot %lld, head %lld) are negative", s.op,
                  ll(c.slot_stride), ll(c.head_stride));
  if (c.page_table != nullptr) {
    if (c.page_size < 1)
      return refuse(Status::invalid_argument, "%s: page_size %lld must be at least 1", s.op, ll(c.page_size));
    if (c.num_pages < 1 || c.page_stride < 0)
      return refuse(Status::invalid_argument, "%s: paged cache with num_pages %lld, page_stride %lld", s.op,
                    ll(c.num_pages), ll(c.page_stride));
  }
  if (s.writes_cache) {
    const std::int64_t rows = c.page_table != nullptr ? std::min(c.page_size, c.num_slots) : c.num_slots;
    if (!kv_copy_rows_disjoint(rows, c.slot_stride, c.head_stride, s.num_heads, s.head_dim))
      return refuse(Status::invalid_argument,
                    "%s: cache slots overlap (slot_stride %lld, head_stride %lld, %lld heads of %lld)", s.op,
                    ll(c.slot_stride), ll(c.head_stride), ll(s.num_heads), ll(s.head_dim));
    const std::int64_t page_span = (rows - 1) * c.slot_stride + (s.num_heads - 1) * c.head_stride + s.head_dim;
    if (c.page_table != nullptr && c.num_pages > 1 && c.page_stride < page_span)
      return refuse(Status::invalid_argument, "%s: page_stride %lld is below the %lld elements a page spans", s.op,
                    ll(c.page_stride), ll(page_span));
  } else if (!kv_copy_rows_disjoint(s.num_tokens, s.compact_token_stride, s.compact_head_stride, s.num_heads,
                                    s.head_dim)) {
    return refuse(Status::invalid_argument,
                  "%s: destination rows overlap (token_stride %lld, head_stride %lld, %lld heads of %lld)", s.op,
                  ll(s.compact_token_stride), ll(s.compact_head_stride), ll(s.num_heads), ll(s.head_dim));
  }
  if (s.num_tokens > 0 && s.slots == nullptr) return refuse(Status::invalid_argument, "%s: slots is null", s.op);
  return Status::success;
}

inline Status validate_kv_copy_pointers(const char* op, std::int64_t num_tokens, const void* src_k, const void* src_v,
                                        const void* dst_k, const void* dst_v) noexcept {
  if (num_tokens == 0) return Status::success;
  if (src_k == nullptr || dst_k == nullptr)
    return refuse(Status::invalid_argument, "%s: a null K pointer (source %p, destination %p)", op, src_k, dst_k);
  if ((src_v == nullptr) != (dst_v == nullptr))
    return refuse(Status::invalid_argument, "%s: V source %p and destination %p: give both or neither", op, src_v,
                  dst_v);
  return Status::success;
}

}  // namespace detail

[[nodiscard]] inline Status validate(const KVScatterArgs& a) noexcept {
  const Status s = detail::validate_kv_copy({"kv_scatter", a.dtype, a.num_tokens, a.num_heads, a.head_dim,
                                             a.src_token_stride, a.src_head_stride, &a.cache, a.slots, true});
  if (s != Status::success) return s;
  return detail::validate_kv_copy_pointers("kv_scatter", a.num_tokens, a.src_k, a.src_v, a.cache_k, a.cache_v);
}

[[nodiscard]] inline Status validate(const KVGatherArgs& a) noexcept {
  const Status s = detail::validate_kv_copy({"kv_gather", a.dtype, a.num_tokens, a.num_heads, a.head_dim,
                                             a.dst_token_stride, a.dst_head_stride, &a.cache, a.slots, false});
  if (s != Status::success) return s;
  return detail::validate_kv_copy_pointers("kv_gather", a.num_tokens, a.cache_k, a.cache_v, a.dst_k, a.dst_v);
}

}  // namespace kvfuse
