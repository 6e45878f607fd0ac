// kvfuse::cuda::kv_scatter / kv_gather against their CPU references (kvfuse/harness/ref/kv_scatter.hpp): bit-exact
// caches and buffers, rows the scatter must not touch keep their (poisoned) bytes, contiguous and paged
// caches (token-major and head-major), NHD and HND compact buffers, vector and element paths.
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <numeric>
#include <random>
#include <vector>

#include "harness.cuh"
#include "kvfuse/cuda/kv_scatter.cuh"
#include "kvfuse/harness/ref/kv_scatter.hpp"

using kvfuse::DType;
using kvfuse::KVCacheLayout;
using kvfuse::KVGatherArgs;
using kvfuse::KVScatterArgs;
using kvfuse::gpu_test::DeviceBuffer;
using kvfuse::gpu_test::rng;

namespace {

struct CopyCase {
  std::int64_t slots, rows, heads, dim;
  bool paged;
  std::int64_t page_size;
  bool hnd;  // compact buffer [H, rows, d]
  bool with_v;
  std::int64_t offset;  // elements every tensor starts after its allocation (1: element path)
  bool cache_hnd;       // cache [H, slots, d] (paged: [pages, H, page_size, d]) instead of [slots, H, d]
};

template <class T>
std::int64_t first_mismatch(const std::vector<T>& a, const std::vector<T>& b) {
  for (std::size_t i = 0; i < a.size(); ++i)
    if (std::memcmp(&a[i], &b[i], sizeof(T)) != 0) return static_cast<std::int64_t>(i);
  return -1;
}

template <class T>
void run_copy(const CopyCase& c, DType dtype) {
  const char* name = kvfuse::dtype_name(dtype);
  // Cache layout: [pages, page_size, H, d] (paged, a shuffled page table with spare pages) or [slots, H, d];
  // with cache_hnd [pages, H, page_size, d] or [H, slots, d].
  KVCacheLayout layout;
  layout.num_slots = c.slots;
  layout.slot_stride = c.cache_hnd ? c.dim : c.heads * c.dim;
  layout.head_stride = c.cache_hnd ? (c.paged ? c.page_size : c.slots) * c.dim : c.dim;
  std::vector<std::int32_t> table;
  std::int64_t cache_elems = c.slots * c.heads * c.dim;
  if (c.paged) {
    const std::int64_t logical = (c.slots + c.page_size - 1) / c.page_size;
    const std::int64_t physical = logical + 5;
    std::vector<std::int32_t> pages(static_cast<std::size_t>(physical));
    std::iota(pages.begin(), pages.end(), 0);
    std::shuffle(pages.begin(), pages.end(), rng());
    table.assign(pages.begin(), pages.begin() + logical);
    layout.page_size = c.page_size;
    layout.page_stride = c.page_size * c.heads * c.dim;
    layout.num_pages = physical;
    cache_elems = physical * c.page_size * c.heads * c.dim;
  }
  cache_elems += c.offset;
  const std::int64_t compact_elems = c.rows * c.heads * c.dim + c.offset;
  const std::int64_t token_stride = c.hnd ? c.dim : c.heads * c.dim;
  const std::int64_t head_stride = c.hnd ? c.rows * c.dim : c.dim;

  std::vector<std::int32_t> all(static_cast<std::size_t>(c.slots));
  std::iota(all.begin(), all.end(), 0);
  std::shuffle(all.begin(), all.end(), rng());
  const std::vector<std::int32_t> slots(all.begin(), all.begin() + c.rows);

  const auto src_k = kvfuse::gpu_test::random_values<T>(static_cast<std::size_t>(compact_elems));
  const auto src_v = kvfuse::gpu_test::random_values<T>(static_cast<std::size_t>(compact_elems));
  DeviceBuffer<T> d_src_k(src_k.size()), d_src_v(src_v.size());
  DeviceBuffer<T> d_cache_k(static_cast<std::size_t>(cache_elems)), d_cache_v(static_cast<std::size_t>(cache_elems));
  DeviceBuffer<std::int32_t> d_slots(slots.size());
  DeviceBuffer<std::int32_t> d_table(std::max<std::size_t>(table.size(), 1));
  d_src_k.upload(src_k);
  d_src_v.upload(src_v);
  d_slots.upload(slots);
  if (c.paged) d_table.upload(table);
  d_cache_k.poison();
  d_cache_v.poison();

  KVScatterArgs s;
  s.src_token_stride = token_stride;
  s.src_head_stride = head_stride;
  s.num_tokens = c.rows;
  s.num_heads = c.heads;
  s.head_dim = c.dim;
  s.dtype = dtype;
  s.cache = layout;
  s.src_k = d_src_k.data() + c.offset;
  s.src_v = c.with_v ? d_src_v.data() + c.offset : nullptr;
  s.cache_k = d_cache_k.data() + c.offset;
  s.cache_v = c.with_v ? d_cache_v.data() + c.offset : nullptr;
  s.slots = d_slots.data();
  s.cache.page_table = c.paged ? d_table.data() : nullptr;
  KVFUSE_GPU_OK(kvfuse::cuda::kv_scatter(s));
  KVFUSE_GPU_CUDA(cudaDeviceSynchronize());
  const auto got_k = d_cache_k.download();
  const auto got_v = d_cache_v.download();

  unsigned char ones[sizeof(T)];
  std::memset(ones, 0xFF, sizeof ones);
  T poison;
  std::memcpy(&poison, ones, sizeof poison);  // DeviceBuffer::poison's bytes: what the CPU scatter starts from
  std::vector<T> ref_k(got_k.size(), poison);
  std::vector<T> ref_v = ref_k;
  KVScatterArgs h = s;
  h.src_k = src_k.data() + c.offset;
  h.src_v = c.with_v ? src_v.data() + c.offset : nullptr;
  h.cache_k = ref_k.data() + c.offset;
  h.cache_v = c.with_v ? ref_v.data() + c.offset : nullptr;
  h.slots = slots.data();
  h.cache.page_table = c.paged ? table.data() : nullptr;
  KVFUSE_GPU_OK(kvfuse::ref::kv_scatter(h));
  const std::int64_t bad_k = first_mismatch(got_k, ref_k);
  const std::int64_t bad_v = first_mismatch(got_v, ref_v);
  KVFUSE_GPU_CHECK(bad_k < 0 && bad_v < 0,
                   "scatter %s slots %lld rows %lld H %lld d %lld %s %s page %lld %s V %d offset %lld: first K "
                   "mismatch at element %lld, V at %lld",
                   name, static_cast<long long>(c.slots), static_cast<long long>(c.rows),
                   static_cast<long long>(c.heads), static_cast<long long>(c.dim), c.paged ? "paged" : "contiguous",
                   c.cache_hnd ? "HND" : "NHD", static_cast<long long>(c.page_size), c.hnd ? "HND" : "NHD",
                   c.with_v ? 1 : 0,
                   static_cast<long long>(c.offset), static_cast<long long>(bad_k), static_cast<long long>(bad_v));

  // Gather every other slot of the cache just written (written and poisoned rows alike, some twice).
  std::vector<std::int32_t> gslots(static_cast<std::size_t>(c.rows));
  std::uniform_int_distribution<std::int32_t> pick(0, static_cast<std::int32_t>(c.slots - 1));
  for (std::size_t i = 0; i < gslots.size(); ++i) gslots[i] = i % 2 == 0 ? slots[i] : pick(rng());
  d_slots.upload(gslots);
  DeviceBuffer<T> d_out_k(static_cast<std::size_t>(compact_elems)), d_out_v(static_cast<std::size_t>(compact_elems));
  d_out_k.poison();
  d_out_v.poison();
  KVGatherArgs g;
  g.cache_k = d_cache_k.data() + c.offset;
  g.cache_v = c.with_v ? d_cache_v.data() + c.offset : nullptr;
  g.cache = s.cache;
  g.dst_k = d_out_k.data() + c.offset;
  g.dst_v = c.with_v ? d_out_v.data() + c.offset : nullptr;
  g.dst_token_stride = token_stride;
  g.dst_head_stride = head_stride;
  g.slots = d_slots.data();
  g.num_tokens = c.rows;
  g.num_heads = c.heads;
  g.head_dim = c.dim;
  g.dtype = dtype;
  KVFUSE_GPU_OK(kvfuse::cuda::kv_gather(g));
  KVFUSE_GPU_CUDA(cudaDeviceSynchronize());
  const auto out_k = d_out_k.download();
  const auto out_v = d_out_v.download();
  std::vector<T> exp_k(out_k.size(), poison);
  std::vector<T> exp_v(out_v.size(), poison);
  KVGatherArgs hg = g;
  hg.cache_k = got_k.data() + c.offset;
  hg.cache_v = c.with_v ? got_v.data() + c.offset : nullptr;
  hg.cache.page_table = h.cache.page_table;
  hg.dst_k = exp_k.data() + c.offset;
  hg.dst_v = c.with_v ? exp_v.data() + c.offset : nullptr;
  hg.slots = gslots.data();
  KVFUSE_GPU_OK(kvfuse::ref::kv_gather(hg));
  const std::int64_t gk = first_mismatch(out_k, exp_k);
  const std::int64_t gv = first_mismatch(out_v, exp_v);
  KVFUSE_GPU_CHECK(gk < 0 && gv < 0,
                   "gather %s rows %lld H %lld d %lld %s %s %s V %d offset %lld: first K mismatch at %lld, V at %lld",
                   name, static_cast<long long>(c.rows), static_cast<long long>(c.heads), static_cast<long long>(c.dim),
                   c.paged ? "paged" : "contiguous", c.cache_hnd ? "HND" : "NHD", c.hnd ? "HND" : "NHD",
                   c.with_v ? 1 : 0,
                   static_cast<long long>(c.offset), static_cast<long long>(gk), static_cast<long long>(gv));
}

}  // namespace

KVFUSE_GPU_TEST("kv_scatter / kv_gather: bit-exact vs CPU reference, untouched rows untouched") {
  const CopyCase cases[] = {
      {4096, 700, 8, 128, false, 0, false, true, 0, false},  {4096, 700, 8, 128, true, 16, false, true, 0, false},
      {1000, 333, 2, 64, true, 7, true, true, 0, false},     {1000, 1, 4, 256, false, 0, true, false, 0, false},
      {513, 200, 3, 3, false, 0, false, true, 0, false},     {513, 200, 3, 3, true, 5, true, true, 0, false},
      {2048, 1024, 8, 128, true, 16, false, true, 1, false}, {300, 300, 1, 64, false, 0, false, false, 1, false},
      {1000, 300, 4, 128, false, 0, false, true, 0, true},   {1000, 300, 4, 64, true, 16, true, true, 0, true},
      {300, 100, 3, 5, true, 7, false, false, 0, true},
  };
  for (const CopyCase& c : cases) {
    run_copy<float>(c, DType::f32);
    run_copy<kvfuse::f16>(c, DType::f16);
    run_copy<kvfuse::bf16>(c, DType::bf16);
  }
}

KVFUSE_GPU_TEST("kv_scatter refuses host-visible errors (V without cache V, overlapping slots)") {
  DeviceBuffer<float> buf(4096);
  DeviceBuffer<std::int32_t> slots(4);
  KVScatterArgs s;
  s.src_k = buf.data();
  s.src_v = buf.data();
  s.src_token_stride = 16;
  s.src_head_stride = 8;
  s.cache_k = buf.data();
  s.cache.num_slots = 64;
  s.cache.slot_stride = 16;
  s.cache.head_stride = 8;
  s.slots = slots.data();
  s.num_tokens = 4;
  s.num_heads = 2;
  s.head_dim = 8;
  s.dtype = DType::f32;
  KVFUSE_GPU_CHECK(kvfuse::cuda::kv_scatter(s) == kvfuse::Status::invalid_argument,
                   "V source without V cache accepted");
  s.src_v = nullptr;
  s.cache.slot_stride = 8;
  KVFUSE_GPU_CHECK(kvfuse::cuda::kv_scatter(s) == kvfuse::Status::invalid_argument, "overlapping cache slots accepted");
}
