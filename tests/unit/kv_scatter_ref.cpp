// harness/ref/kv_scatter.hpp: the CPU references of KV scatter (recomputed rows into the cache) and gather (cached
// rows into the prompt buffer), contiguous and paged caches, against element loops written here.
#include <doctest/doctest.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "kvfuse/harness/ref/kv_scatter.hpp"

#include "../support/test_util.hpp"

// Each unit test file lives in its own namespace: the files are compiled together (a unity build).
namespace unit_kv_scatter_ref {

using kvfuse::DType;
using kvfuse::KVCacheLayout;
using kvfuse::KVGatherArgs;
using kvfuse::KVScatterArgs;
using kvfuse::Status;

using kvfuse_test::message_has;

namespace {


// A cache of one layer: contiguous [slots, H, d] or paged [pages, page_size, H, d] with a random page table.
struct TestCache {
  std::int64_t heads, dim;
  bool paged;
  std::int64_t page_size = 0;
  std::int64_t num_pages = 0;
  std::vector<std::int32_t> table;
  KVCacheLayout layout;
  std::int64_t elements = 0;

  TestCache(std::int64_t slots, std::int64_t h, std::int64_t d, bool is_paged, std::int64_t ps, std::mt19937& rng)
      : heads(h), dim(d), paged(is_paged), page_size(ps) {
    layout.num_slots = slots;
    layout.slot_stride = h * d;
    layout.head_stride = d;
    if (paged) {
      const std::int64_t logical = (slots + ps - 1) / ps;
      num_pages = logical + 3;  // spare pages nobody maps
      std::vector<std::int32_t> pages(static_cast<std::size_t>(num_pages));
      std::iota(pages.begin(), pages.end(), 0);
      std::shuffle(pages.begin(), pages.end(), rng);
      table.assign(pages.begin(), pages.begin() + logical);
      layout.page_table = table.data();
      layout.page_size = ps;
      layout.page_stride = ps * h * d;
      layout.num_pages = num_pages;
      elements = num_pages * ps * h * d;
    } else {
      elements = slots * h * d;
    }
  }

  // Element index of (slot, head, e), computed here from the layout's definition.
  [[nodiscard]] std::int64_t at(std::int64_t slot, std::int64_t h, std::int64_t e) const {
    const std::int64_t base = paged ? table[static_cast<std::size_t>(slot / page_size)] * page_size * heads * dim +
                                          (slot % page_size) * heads * dim
                                    : slot * heads * dim;
    return base + h * dim + e;
  }
};

// Compact buffer of `rows` rows, NHD or HND.
struct Compact {
  std::int64_t token_stride, head_stride;
  std::int64_t at(std::int64_t i, std::int64_t h, std::int64_t e) const {
    return i * token_stride + h * head_stride + e;
  }
};

Compact compact_layout(std::int64_t rows, std::int64_t heads, std::int64_t dim, bool hnd) {
  return hnd ? Compact{dim, rows * dim} : Compact{heads * dim, dim};
}

template <class T>
std::vector<T> random_tensor(std::int64_t n, std::mt19937& rng) {
  std::uniform_real_distribution<float> dist(-4.0f, 4.0f);
  std::vector<T> v(static_cast<std::size_t>(n));
  for (auto& x : v) x = kvfuse::from_float<T>(dist(rng));
  return v;
}

template <class T>
bool same_bits(const T& a, const T& b) {
  return std::memcmp(&a, &b, sizeof(T)) == 0;
}

template <class T>
void check_scatter_gather(DType dtype, bool paged, bool hnd, bool with_v) {
  std::mt19937 rng(static_cast<unsigned>(paged * 4 + hnd * 2 + with_v + static_cast<int>(dtype) * 8));
  const std::int64_t heads = 3;
  const std::int64_t dim = 8;
  const std::int64_t slots = 61;
  const std::int64_t rows = 17;
  TestCache cache(slots, heads, dim, paged, 5, rng);
  const Compact src = compact_layout(rows, heads, dim, hnd);

  std::vector<std::int32_t> all(static_cast<std::size_t>(slots));
  std::iota(all.begin(), all.end(), 0);
  std::shuffle(all.begin(), all.end(), rng);
  const std::vector<std::int32_t> slot_of(all.begin(), all.begin() + rows);

  const auto rec_k = random_tensor<T>(rows * heads * dim, rng);
  const auto rec_v = random_tensor<T>(rows * heads * dim, rng);
  const auto before_k = random_tensor<T>(cache.elements, rng);
  const auto before_v = random_tensor<T>(cache.elements, rng);
  auto cache_k = before_k;
  auto cache_v = before_v;

  KVScatterArgs s;
  s.src_k = rec_k.data();
  s.src_v = with_v ? rec_v.data() : nullptr;
  s.src_token_stride = src.token_stride;
  s.src_head_stride = src.head_stride;
  s.cache_k = cache_k.data();
  s.cache_v = with_v ? cache_v.data() : nullptr;
  s.cache = cache.layout;
  s.slots = slot_of.data();
  s.num_tokens = rows;
  s.num_heads = heads;
  s.head_dim = dim;
  s.dtype = dtype;
  REQUIRE(kvfuse::ref::kv_scatter(s) == Status::success);

  // Expected cache: a copy of `before` with the selected slots overwritten, element by element.
  auto expect_k = before_k;
  auto expect_v = before_v;
  for (std::int64_t i = 0; i < rows; ++i) {
    for (std::int64_t h = 0; h < heads; ++h) {
      for (std::int64_t e = 0; e < dim; ++e) {
        const auto c = static_cast<std::size_t>(cache.at(slot_of[static_cast<std::size_t>(i)], h, e));
        expect_k[c] = rec_k[static_cast<std::size_t>(src.at(i, h, e))];
        if (with_v) expect_v[c] = rec_v[static_cast<std::size_t>(src.at(i, h, e))];
      }
    }
  }
  std::int64_t changed = 0;
  for (std::size_t j = 0; j < cache_k.size(); ++j) {
    CAPTURE(j);
    REQUIRE(same_bits(cache_k[j], expect_k[j]));
    REQUIRE(same_bits(cache_v[j], expect_v[j]));
    changed += same_bits(cache_k[j], before_k[j]) ? 0 : 1;
  }
  CHECK(changed > rows * heads * dim / 2);  // the scatter did write (random values rarely coincide)

  // Gather the same slots back (plus a repeated one) into a poisoned compact buffer: the recomputed rows.
  std::vector<std::int32_t> gather_slots = slot_of;
  gather_slots.push_back(slot_of[3]);
  const auto grows = static_cast<std::int64_t>(gather_slots.size());
  const Compact dst = compact_layout(grows, heads, dim, hnd);
  std::vector<T> out_k(static_cast<std::size_t>(grows * heads * dim), kvfuse::from_float<T>(-99.0f));
  std::vector<T> out_v = out_k;
  KVGatherArgs g;
  g.cache_k = cache_k.data();
  g.cache_v = with_v ? cache_v.data() : nullptr;
  g.cache = cache.layout;
  g.dst_k = out_k.data();
  g.dst_v = with_v ? out_v.data() : nullptr;
  g.dst_token_stride = dst.token_stride;
  g.dst_head_stride = dst.head_stride;
  g.slots = gather_slots.data();
  g.num_tokens = grows;
  g.num_heads = heads;
  g.head_dim = dim;
  g.dtype = dtype;
  REQUIRE(kvfuse::ref::kv_gather(g) == Status::success);
  for (std::int64_t i = 0; i < grows; ++i) {
    const std::int64_t r = i < rows ? i : 3;
    for (std::int64_t h = 0; h < heads; ++h) {
      for (std::int64_t e = 0; e < dim; ++e) {
        CAPTURE(i);
        CAPTURE(h);
        CAPTURE(e);
        REQUIRE(same_bits(out_k[static_cast<std::size_t>(dst.at(i, h, e))],
                          rec_k[static_cast<std::size_t>(src.at(r, h, e))]));
        if (with_v)
          REQUIRE(same_bits(out_v[static_cast<std::size_t>(dst.at(i, h, e))],
                            rec_v[static_cast<std::size_t>(src.at(r, h, e))]));
        else
          REQUIRE(same_bits(out_v[static_cast<std::size_t>(dst.at(i, h, e))], kvfuse::from_float<T>(-99.0f)));
      }
    }
  }
}

// A small valid scatter (contiguous cache of 8 slots, 2 heads of 4, f32) to break one field at a time.
struct Fixture {
  std::vector<float> src = std::vector<float>(3 * 8, 1.0f);
  std::vector<float> cache = std::vector<float>(8 * 8, 0.0f);
  std::vector<std::int32_t> slots{2, 5, 7};
  KVScatterArgs args;
  Fixture() {
    args.src_k = src.data();
    args.src_token_stride = 8;
    args.src_head_stride = 4;
    args.cache_k = cache.data();
    args.cache.num_slots = 8;
    args.cache.slot_stride = 8;
    args.cache.head_stride = 4;
    args.slots = slots.data();
    args.num_tokens = 3;
    args.num_heads = 2;
    args.head_dim = 4;
    args.dtype = DType::f32;
  }
};

}  // namespace

TEST_CASE("ref::kv_scatter / kv_gather: every dtype, contiguous and paged, NHD and HND, K+V and K only") {
  for (bool paged : {false, true}) {
    for (bool hnd : {false, true}) {
      for (bool with_v : {true, false}) {
        CAPTURE(paged);
        CAPTURE(hnd);
        CAPTURE(with_v);
        check_scatter_gather<float>(DType::f32, paged, hnd, with_v);
        check_scatter_gather<kvfuse::f16>(DType::f16, paged, hnd, with_v);
        check_scatter_gather<kvfuse::bf16>(DType::bf16, paged, hnd, with_v);
      }
    }
  }
}

TEST_CASE("cache_slot_offset: contiguous and paged addressing") {
  KVCacheLayout c;
  c.num_slots = 100;
  c.slot_stride = 48;
  CHECK(kvfuse::cache_slot_offset(c, 7) == 7 * 48);
  const std::vector<std::int32_t> table{4, 0, 9};
  c.page_table = table.data();
  c.page_size = 16;
  c.page_stride = 16 * 48 + 32;  // padded pages
  c.num_pages = 10;
  c.num_slots = 48;
  CHECK(kvfuse::cache_slot_offset(c, 0) == 4 * (16 * 48 + 32));
  CHECK(kvfuse::cache_slot_offset(c, 17) == 0 * (16 * 48 + 32) + 1 * 48);
  CHECK(kvfuse::cache_slot_offset(c, 47) == 9 * (16 * 48 + 32) + 15 * 48);
}

TEST_CASE("ref::kv_scatter refuses bad slots, pages, duplicates and shapes, naming the value, writing nothing") {
  SUBCASE("slot out of range") {
    Fixture f;
    f.slots[1] = 8;
    CHECK(kvfuse::ref::kv_scatter(f.args) == Status::invalid_argument);
    CHECK(message_has("slots[1] = 8"));
    CHECK(std::all_of(f.cache.begin(), f.cache.end(), [](float v) { return v == 0.0f; }));
  }
  SUBCASE("negative slot") {
    Fixture f;
    f.slots[2] = -1;
    CHECK(kvfuse::ref::kv_scatter(f.args) == Status::invalid_argument);
    CHECK(message_has("slots[2] = -1"));
  }
  SUBCASE("duplicate destination") {
    Fixture f;
    f.slots = {2, 5, 2};
    f.args.slots = f.slots.data();
    CHECK(kvfuse::ref::kv_scatter(f.args) == Status::invalid_argument);
    CHECK(message_has("rows 0 and 2"));
    CHECK(std::all_of(f.cache.begin(), f.cache.end(), [](float v) { return v == 0.0f; }));
  }
  SUBCASE("page table entry out of range, and two logical pages on one physical page") {
    Fixture f;
    std::vector<std::int32_t> table{1, 3};
    f.args.cache.page_table = table.data();
    f.args.cache.page_size = 4;
    f.args.cache.page_stride = 32;
    f.args.cache.num_pages = 2;
    CHECK(kvfuse::ref::kv_scatter(f.args) == Status::invalid_argument);
    CHECK(message_has("page_table[1] = 3"));
    table[1] = 1;         // both logical pages on physical page 1
    f.slots = {2, 5, 6};  // slot 2 -> page 1 row 2, slot 5 -> row 1, slot 6 -> row 2 again
    f.args.slots = f.slots.data();
    CHECK(kvfuse::ref::kv_scatter(f.args) == Status::invalid_argument);
    CHECK(message_has("same cache slot"));
  }
  SUBCASE("shapes") {
    Fixture f;
    f.args.cache.page_table = f.slots.data();
    f.args.cache.page_size = 0;
    CHECK(kvfuse::ref::kv_scatter(f.args) == Status::invalid_argument);
    CHECK(message_has("page_size 0"));
    f.args.cache.page_table = nullptr;
    f.args.cache.slot_stride = 4;  // slots overlap
    CHECK(kvfuse::ref::kv_scatter(f.args) == Status::invalid_argument);
    CHECK(message_has("slot_stride 4"));
    f.args.cache.slot_stride = 8;
    f.args.src_v = f.src.data();  // V source without V cache
    CHECK(kvfuse::ref::kv_scatter(f.args) == Status::invalid_argument);
    CHECK(message_has("give both or neither"));
    f.args.src_v = nullptr;
    f.args.dtype = static_cast<DType>(5);
    CHECK(kvfuse::ref::kv_scatter(f.args) == Status::unsupported);
    CHECK(message_has("dtype 5"));
    f.args.dtype = DType::f32;
    f.args.head_dim = 0;
    CHECK(kvfuse::ref::kv_scatter(f.args) == Status::invalid_argument);
    CHECK(message_has("head_dim 0"));
  }
}

TEST_CASE("ref::kv_gather refuses a bad slot and overlapping destination rows") {
  std::vector<float> cache(8 * 8, 2.0f);
  std::vector<float> out(3 * 8, 0.0f);
  std::vector<std::int32_t> slots{0, 9, 1};
  KVGatherArgs g;
  g.cache_k = cache.data();
  g.cache.num_slots = 8;
  g.cache.slot_stride = 8;
  g.cache.head_stride = 4;
  g.dst_k = out.data();
  g.dst_token_stride = 8;
  g.dst_head_stride = 4;
  g.slots = slots.data();
  g.num_tokens = 3;
  g.num_heads = 2;
  g.head_dim = 4;
  g.dtype = DType::f32;
  CHECK(kvfuse::ref::kv_gather(g) == Status::invalid_argument);
  CHECK(message_has("slots[1] = 9"));
  CHECK(std::all_of(out.begin(), out.end(), [](float v) { return v == 0.0f; }));
  slots[1] = 3;
  g.dst_token_stride = 6;
  CHECK(kvfuse::ref::kv_gather(g) == Status::invalid_argument);
  CHECK(message_has("token_stride 6"));
  g.dst_token_stride = 8;
  CHECK(kvfuse::ref::kv_gather(g) == Status::success);
  CHECK(std::all_of(out.begin(), out.end(), [](float v) { return v == 2.0f; }));
}

}  // namespace unit_kv_scatter_ref
