// CPU emulation of the KV scatter / gather kernel (tests/emu/README.md): the real
// kernels/include/kvfuse/cuda/kv_scatter.cuh, transformed by transform_kernel.py and run thread by thread
// through kvfuse::cuda::kv_scatter / kv_gather, compared bit for bit with kvfuse::ref::kv_scatter /
// kv_gather and with the copy written out here (slot -> page -> element address computed independently).
// Whole buffers are compared: a scatter must leave every other cache row (and the padding) as it was, a
// gather must not write outside the compact rows. Covers f32 / f16 / bf16, contiguous and paged caches
// (shuffled page table with spare pages), token-major and head-major caches, NHD and HND compact buffers,
// K only, head_dims that rule out the 16-byte path, misaligned pointers (element copies), and that each of
// the three kernel instantiations (uint4, uint32, uint16 units) ran.
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "kvfuse/harness/ref/kv_scatter.hpp"
#include "kv_scatter_emu.cuh"

namespace {

using kvfuse::DType;
using kvfuse::Status;

// 16-byte aligned bytes.
struct Buffer {
  std::vector<std::uint64_t> words;
  std::uint8_t* data;
  std::size_t bytes;
  explicit Buffer(std::size_t n) : words(n / 8 + 4, 0), bytes(n) {
    data = reinterpret_cast<std::uint8_t*>(words.data());
    data += (16 - reinterpret_cast<std::uintptr_t>(data) % 16) % 16;
  }
  Buffer(const Buffer& o) : Buffer(o.bytes) { std::memcpy(data, o.data, bytes); }
  Buffer& operator=(const Buffer&) = delete;
};

struct Case {
  DType dtype;
  std::int64_t slots, rows, heads, dim;
  bool paged;
  std::int64_t page_size;
  bool compact_hnd;  // compact buffer [H, S, d] (else [S, H, d])
  bool cache_hnd;    // head-major cache (a page / the cache is [H, slots, d]) (else token-major)
  bool with_v;
  std::int64_t offset;  // elements added to every pointer (1: misaligned, element copies)
  std::int64_t pad;     // elements of padding after each compact row / head block
};

int runs = 0;
int failures = 0;
std::mt19937_64 rng(11);

void fill_random(Buffer& b) {
  for (std::size_t i = 0; i < b.bytes; ++i) b.data[i] = static_cast<std::uint8_t>(rng());
}

std::int64_t first_difference(const Buffer& x, const Buffer& y, int size) {
  for (std::size_t i = 0; i < x.bytes; ++i)
    if (x.data[i] != y.data[i]) return static_cast<std::int64_t>(i) / size;
  return -1;
}

void fail(const Case& c, const char* what, std::int64_t at) {
  ++failures;
  std::printf(
      "FAIL %s slots=%lld rows=%lld heads=%lld dim=%lld %s page_size=%lld compact=%s cache=%s %s "
      "offset=%lld pad=%lld: %s (first differing element %lld)\n",
      kvfuse::dtype_name(c.dtype), static_cast<long long>(c.slots), static_cast<long long>(c.rows),
      static_cast<long long>(c.heads), static_cast<long long>(c.dim), c.paged ? "paged" : "contiguous",
      static_cast<long long>(c.page_size), c.compact_hnd ? "HND" : "NHD", c.cache_hnd ? "head-major" : "token-major",
      c.with_v ? "K+V" : "K only", static_cast<long long>(c.offset), static_cast<long long>(c.pad), what,
      static_cast<long long>(at));
}

// Checks one operation ("scatter" or "gather"): both statuses success, and the written K and V buffers equal
// the rows expected from the address loop and the reference's, byte for byte. Reports the first failure.
bool outcome_ok(const Case& c, const std::string& op, Status kernel, Status reference, const Buffer& got_k,
                const Buffer& got_v, const Buffer& want_k, const Buffer& want_v, const Buffer& ref_k,
                const Buffer& ref_v, int size) {
  if (kernel != Status::success || reference != Status::success) {
    fail(c,
         (op + " status kernel " + kvfuse::status_string(kernel) + ", reference " + kvfuse::status_string(reference) +
          ": " + kvfuse::last_status_message())
             .c_str(),
         -1);
    return false;
  }
  const struct {
    const Buffer& got;
    const Buffer& want;
    const char* what;
  } checks[] = {{got_k, want_k, " K differs from the expected rows"},
                {got_v, want_v, " V differs from the expected rows"},
                {got_k, ref_k, " K differs from kvfuse::ref"},
                {got_v, ref_v, " V differs from kvfuse::ref"}};
  for (const auto& check : checks) {
    if (const auto at = first_difference(check.got, check.want, size); at >= 0) {
      fail(c, (op + check.what).c_str(), at);
      return false;
    }
  }
  return true;
}

void run(const Case& c) {
  ++runs;
  const int size = kvfuse::dtype_size(c.dtype);
  const std::int64_t H = c.heads, d = c.dim, S = c.rows;
  // Cache layout.
  kvfuse::KVCacheLayout L;
  L.num_slots = c.slots;
  std::vector<std::int32_t> table;
  std::int64_t cache_elems;
  if (c.paged) {
    const std::int64_t logical = (c.slots + c.page_size - 1) / c.page_size, physical = logical + 5;
    std::vector<std::int32_t> pages(static_cast<std::size_t>(physical));
    std::iota(pages.begin(), pages.end(), 0);
    std::shuffle(pages.begin(), pages.end(), rng);
    table.assign(pages.begin(), pages.begin() + logical);
    L.page_table = table.data();
    L.page_size = c.page_size;
    L.num_pages = physical;
    L.slot_stride = c.cache_hnd ? d : H * d;
    L.head_stride = c.cache_hnd ? c.page_size * d : d;
    L.page_stride = c.page_size * H * d;
    cache_elems = physical * L.page_stride;
  } else {
    L.slot_stride = c.cache_hnd ? d : H * d;
    L.head_stride = c.cache_hnd ? c.slots * d : d;
    cache_elems = c.slots * H * d;
  }
  cache_elems += c.offset;
  // Compact layout.
  const std::int64_t ts = c.compact_hnd ? d : H * d + c.pad, hs = c.compact_hnd ? S * d + c.pad : d;
  const std::int64_t compact_elems = (c.compact_hnd ? H * hs : S * ts) + c.offset;
  const auto cache_bytes = static_cast<std::size_t>(cache_elems * size);
  const auto compact_bytes = static_cast<std::size_t>(compact_elems * size);

  std::vector<std::int32_t> all(static_cast<std::size_t>(c.slots));
  std::iota(all.begin(), all.end(), 0);
  std::shuffle(all.begin(), all.end(), rng);
  const std::vector<std::int32_t> slots(all.begin(), all.begin() + S);  // distinct: scatter destinations
  std::vector<std::int32_t> gather_slots(static_cast<std::size_t>(S));  // any, repeats allowed
  std::uniform_int_distribution<std::int32_t> pick(0, static_cast<std::int32_t>(c.slots - 1));
  for (std::size_t i = 0; i < gather_slots.size(); ++i) gather_slots[i] = i % 2 == 0 ? slots[i] : pick(rng);

  // Element address of (slot, head, element) in the cache, of (row, head, element) in the compact buffer.
  const auto cache_at = [&](std::int64_t slot, std::int64_t h, std::int64_t e) {
    std::int64_t base = slot * L.slot_stride;
    if (c.paged)
      base = table[static_cast<std::size_t>(slot / c.page_size)] * L.page_stride + (slot % c.page_size) * L.slot_stride;
    return c.offset + base + h * L.head_stride + e;
  };
  const auto compact_at = [&](std::int64_t i, std::int64_t h, std::int64_t e) {
    return c.offset + i * ts + h * hs + e;
  };
  const auto copy_element = [&](Buffer& to, std::int64_t to_at, const Buffer& from, std::int64_t from_at) {
    std::memcpy(to.data + to_at * size, from.data + from_at * size, static_cast<std::size_t>(size));
  };

  // Scatter: source rows random, the cache holds older random rows.
  Buffer src_k(compact_bytes), src_v(compact_bytes), cache_k(cache_bytes), cache_v(cache_bytes);
  fill_random(src_k);
  fill_random(src_v);
  fill_random(cache_k);
  fill_random(cache_v);
  Buffer ref_k(cache_k), ref_v(cache_v), want_k(cache_k), want_v(cache_v);
  for (std::int64_t i = 0; i < S; ++i)
    for (std::int64_t h = 0; h < H; ++h)
      for (std::int64_t e = 0; e < d; ++e) {
        copy_element(want_k, cache_at(slots[static_cast<std::size_t>(i)], h, e), src_k, compact_at(i, h, e));
        if (c.with_v)
          copy_element(want_v, cache_at(slots[static_cast<std::size_t>(i)], h, e), src_v, compact_at(i, h, e));
      }
  const auto at = [&](Buffer& b) { return static_cast<void*>(b.data + c.offset * size); };
  kvfuse::KVScatterArgs s;
  s.src_k = at(src_k);
  s.src_v = c.with_v ? at(src_v) : nullptr;
  s.src_token_stride = ts;
  s.src_head_stride = hs;
  s.cache_k = at(cache_k);
  s.cache_v = c.with_v ? at(cache_v) : nullptr;
  s.cache = L;
  s.slots = slots.data();
  s.num_tokens = S;
  s.num_heads = H;
  s.head_dim = d;
  s.dtype = c.dtype;
  kvfuse::KVScatterArgs r = s;
  r.cache_k = at(ref_k);
  r.cache_v = c.with_v ? at(ref_v) : nullptr;
  if (!outcome_ok(c, "scatter", kvfuse::cuda::kv_scatter(s), kvfuse::ref::kv_scatter(r), cache_k, cache_v, want_k,
                  want_v, ref_k, ref_v, size))
    return;

  // Gather from the updated cache into poisoned compact buffers.
  Buffer dst_k(compact_bytes), dst_v(compact_bytes);
  std::memset(dst_k.data, 0xFF, compact_bytes);
  std::memset(dst_v.data, 0xFF, compact_bytes);
  Buffer gref_k(dst_k), gref_v(dst_v), gwant_k(dst_k), gwant_v(dst_v);
  for (std::int64_t i = 0; i < S; ++i)
    for (std::int64_t h = 0; h < H; ++h)
      for (std::int64_t e = 0; e < d; ++e) {
        copy_element(gwant_k, compact_at(i, h, e), cache_k, cache_at(gather_slots[static_cast<std::size_t>(i)], h, e));
        if (c.with_v)
          copy_element(gwant_v, compact_at(i, h, e), cache_v,
                       cache_at(gather_slots[static_cast<std::size_t>(i)], h, e));
      }
  kvfuse::KVGatherArgs g;
  g.cache_k = at(cache_k);
  g.cache_v = c.with_v ? at(cache_v) : nullptr;
  g.cache = L;
  g.dst_k = at(dst_k);
  g.dst_v = c.with_v ? at(dst_v) : nullptr;
  g.dst_token_stride = ts;
  g.dst_head_stride = hs;
  g.slots = gather_slots.data();
  g.num_tokens = S;
  g.num_heads = H;
  g.head_dim = d;
  g.dtype = c.dtype;
  kvfuse::KVGatherArgs gr = g;
  gr.dst_k = at(gref_k);
  gr.dst_v = c.with_v ? at(gref_v) : nullptr;
  outcome_ok(c, "gather", kvfuse::cuda::kv_gather(g), kvfuse::ref::kv_gather(gr), dst_k, dst_v, gwant_k, gwant_v,
             gref_k, gref_v, size);
}

}  // namespace

int main() {
  const Case shapes[] = {
      // slots rows heads dim paged page_size compact_hnd cache_hnd with_v offset pad
      {DType::f32, 409, 70, 8, 128, false, 0, false, false, true, 0, 0},
      {DType::f32, 409, 70, 8, 128, true, 16, false, false, true, 0, 0},
      {DType::f32, 100, 33, 2, 64, true, 7, true, false, true, 0, 0},
      {DType::f32, 100, 1, 4, 256, false, 0, true, false, false, 0, 0},
      {DType::f32, 51, 20, 3, 3, false, 0, false, false, true, 0, 0},
      {DType::f32, 51, 20, 3, 3, true, 5, true, false, true, 0, 0},
      {DType::f32, 204, 102, 8, 128, true, 16, false, false, true, 1, 0},
      {DType::f32, 30, 30, 1, 64, false, 0, false, false, false, 1, 0},
      {DType::f32, 77, 40, 3, 24, true, 3, true, false, true, 0, 0},
      {DType::f32, 100, 30, 4, 128, false, 0, false, true, true, 0, 0},
      {DType::f32, 100, 30, 4, 64, true, 16, true, true, true, 0, 0},
      {DType::f32, 300, 100, 3, 5, true, 7, false, true, false, 0, 0},
      {DType::f32, 120, 45, 4, 64, true, 8, false, true, true, 0, 1},       // padded compact rows: element copies
      {DType::f32, 120, 45, 4, 64, false, 0, true, false, true, 0, 8},      // padding that keeps 16-byte rows
      {DType::f32, 5000, 1200, 2, 64, true, 32, false, false, true, 0, 0},  // 150 blocks
  };
  int count = 0;
  for (const Case& shape : shapes)
    for (DType dtype : {DType::f32, DType::f16, DType::bf16}) {
      Case c = shape;
      c.dtype = dtype;
      run(c);
      ++count;
    }
  // No rows: nothing launched, nothing written.
  {
    const long long before = emu::launches;
    kvfuse::KVScatterArgs s;
    s.num_heads = 1;
    s.head_dim = 8;
    s.cache.num_slots = 4;
    s.cache.slot_stride = 8;
    s.cache.head_stride = 8;
    s.dtype = DType::f16;
    if (kvfuse::cuda::kv_scatter(s) != Status::success || emu::launches != before) {
      ++failures;
      std::printf("FAIL an empty scatter launched a kernel or was refused\n");
    }
  }
  // Every kernel instantiation ran (the vector path and both element paths).
  for (const char* kernel :
       {"kv_row_copy_kernel<uint4>", "kv_row_copy_kernel<std::uint32_t>", "kv_row_copy_kernel<std::uint16_t>"}) {
    if (emu::launches_by_kernel[kernel] == 0) {
      ++failures;
      std::printf("FAIL %s never ran\n", kernel);
    }
  }
  std::printf(
      "emu.kv_scatter: %d cases (scatter + gather each), %d failed, %lld kernel launches "
      "(uint4 %lld, uint32 %lld, uint16 %lld), %lld emulated threads\n",
      runs, failures, emu::launches, emu::launches_by_kernel["kv_row_copy_kernel<uint4>"],
      emu::launches_by_kernel["kv_row_copy_kernel<std::uint32_t>"],
      emu::launches_by_kernel["kv_row_copy_kernel<std::uint16_t>"], emu::emulated_threads);
  return failures == 0 && count == runs ? 0 : 1;
}
