// The batched and buffer-filling reads of every kvfuse store that needs no server: contains_many / get_many answer
// what contains / get answer key by key (TieredKVStore asking each tier once, for the keys still missing), get_into
// fills the caller's buffer with exactly the bytes get_range returns and fails where it fails, and I/O failures of
// DiskKVStore throw kvfuse::error with Status::store_unavailable.
#include <doctest/doctest.h>

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "kvfuse/backend/disk_kv_store.hpp"
#include "kvfuse/backend/in_memory_store.hpp"
#include "kvfuse/harness/simulated.hpp"
#include "kvfuse/backend/throttled_kv_store.hpp"
#include "kvfuse/backend/tiered_kv_store.hpp"
#include "kvfuse/core/error.hpp"
#include "kvfuse/core/status.hpp"

#include "support/error_of.hpp"
#include "support/test_util.hpp"

// Each store test file lives in its own namespace: the files are compiled together (a unity build).
namespace store_batched_reads {

using kvfuse::DiskKVStore;
using kvfuse::InMemoryKVStore;
using kvfuse::KVBlock;
using kvfuse::KVBlockInfo;
using kvfuse::KVKey;
using kvfuse::Status;
using kvfuse::TieredKVStore;
using kvfuse_test::code_of;
namespace fs = std::filesystem;

namespace {

constexpr std::size_t page = kvfuse::kv_entry_page_bytes;

// `bytes` bytes, each a function of its index and `seed`, so that every range of every block differs.
KVBlock block_of(std::uint64_t seed, std::size_t bytes, std::int64_t first_position = 0) {
  KVBlock block{static_cast<std::int64_t>(bytes / 64), std::vector<std::byte>(bytes), first_position};
  for (std::size_t i = 0; i < bytes; ++i)
    block.bytes[i] = static_cast<std::byte>((i * 131 + seed * 7 + i / 251) & 0xff);
  return block;
}

bool same(const std::optional<KVBlock>& a, const std::optional<KVBlock>& b) {
  if (a.has_value() != b.has_value()) return false;
  return !a || (a->bytes == b->bytes && a->num_tokens == b->num_tokens && a->first_position == b->first_position);
}

// Checks contains_many and get_many against contains and get of each key: stored keys, absent ones, a repeat, and
// no key at all.
template <class Store>
void check_batches_equal_single_calls(Store& store, const std::vector<KVKey>& keys) {
  CAPTURE(keys.size());
  const std::vector<bool> held = store.contains_many(std::span<const KVKey>(keys));
  REQUIRE(held.size() == keys.size());
  for (std::size_t i = 0; i < keys.size(); ++i) CHECK(held[i] == static_cast<bool>(store.contains(keys[i])));
  const std::vector<std::optional<KVBlock>> got = store.get_many(std::span<const KVKey>(keys));
  REQUIRE(got.size() == keys.size());
  for (std::size_t i = 0; i < keys.size(); ++i) {
    CAPTURE(i);
    CHECK(same(got[i], store.get(keys[i])));
  }
  CHECK(store.contains_many(std::span<const KVKey>()).empty());
  CHECK(store.get_many(std::span<const KVKey>()).empty());
}

// An InMemoryKVStore tier that counts the calls a tiered store makes on it and the keys it is asked about.
struct CountingTier : InMemoryKVStore {
  mutable int contains_calls = 0;
  mutable int contains_many_calls = 0;
  int get_calls = 0;
  int get_many_calls = 0;
  mutable std::vector<std::vector<KVKey>> asked;  // the keys of each batched call

  bool contains(const KVKey& key) const {
    ++contains_calls;
    return InMemoryKVStore::contains(key);
  }
  std::vector<bool> contains_many(std::span<const KVKey> keys) const {
    ++contains_many_calls;
    asked.emplace_back(keys.begin(), keys.end());
    return InMemoryKVStore::contains_many(keys);
  }
  std::optional<KVBlock> get(const KVKey& key) {
    ++get_calls;
    return InMemoryKVStore::get(key);
  }
  std::vector<std::optional<KVBlock>> get_many(std::span<const KVKey> keys) {
    ++get_many_calls;
    asked.emplace_back(keys.begin(), keys.end());
    return InMemoryKVStore::get_many(keys);
  }
};
static_assert(kvfuse::KVStore<CountingTier>);

// Checks get_into against get_range over ranges inside, across and at the ends of the pages of `block`.
template <class Store>
void check_get_into_equals_get_range(Store& store, const KVKey& key, const KVBlock& block) {
  const std::optional<KVBlockInfo> info = store.describe(key);
  REQUIRE(info.has_value());
  const std::uint64_t n = block.bytes.size();
  for (const auto& bounds : std::vector<std::pair<std::uint64_t, std::uint64_t>>{
           {0, 0}, {n, 0}, {0, 10}, {page - 5, 10}, {page, page}, {100, 2 * page}, {page + 1, page - 2},
           {3 * page, n - 3 * page}, {3 * page + 7, n - 3 * page - 7}, {0, n}, {n - 1, 1}}) {
    const std::uint64_t offset = bounds.first;
    const std::uint64_t size = bounds.second;
    CAPTURE(offset);
    CAPTURE(size);
    std::vector<std::byte> out(static_cast<std::size_t>(size), std::byte{0x5a});
    REQUIRE(store.get_into(key, *info, offset, std::span<std::byte>(out)));
    const std::optional<std::vector<std::byte>> range = store.get_range(key, *info, offset, size);
    REQUIRE(range.has_value());
    CHECK(out == *range);
    CHECK(out == std::vector<std::byte>(block.bytes.begin() + static_cast<std::ptrdiff_t>(offset),
                                        block.bytes.begin() + static_cast<std::ptrdiff_t>(offset + size)));
  }
  std::vector<std::byte> past(6);
  try {
    (void)store.get_into(key, *info, n - 5, std::span<std::byte>(past));
    FAIL("get_into of a range past the entry did not throw");
  } catch (const kvfuse::error& e) {
    CHECK(e.code() == Status::invalid_argument);
    CHECK(std::string(e.what()).find("get_into: bytes [") != std::string::npos);
  }
}

}  // namespace

TEST_CASE("contains_many and get_many equal contains and get key by key, on every store type") {
  kvfuse_test::TempDir tmp;
  const KVKey a{7, 1}, b{7, 2}, c{7, 3}, absent{7, 4}, other_model{8, 1};
  const std::vector<KVKey> keys{a, absent, b, a, other_model, c};
  const auto fill = [&](auto& store) {
    store.put(a, block_of(1, 3 * page + 99, 5));
    store.put(b, block_of(2, 10));
    store.put(c, KVBlock{0, {}, 9});
  };
  SUBCASE("InMemoryKVStore") {
    InMemoryKVStore store;
    fill(store);
    check_batches_equal_single_calls(store, keys);
  }
  SUBCASE("DiskKVStore") {
    DiskKVStore store(tmp.path);
    fill(store);
    check_batches_equal_single_calls(store, keys);
  }
  SUBCASE("ThrottledKVStore: one get_many is one read of the link, of every byte it returned") {
    InMemoryKVStore inner;
    kvfuse::ThrottledKVStore store(inner, {/*megabytes_per_s=*/0.0, /*latency_ms=*/0.0});
    fill(store);
    const std::vector<std::optional<KVBlock>> got = store.get_many(std::span<const KVKey>(keys));
    CHECK(store.stats().reads == 1);
    CHECK(store.stats().bytes == static_cast<std::int64_t>(2 * (3 * page + 99) + 10));
    check_batches_equal_single_calls(store, keys);
  }
  SUBCASE("TieredKVStore over memory and disk, the keys spread over both") {
    InMemoryKVStore memory;
    DiskKVStore disk(tmp.path);
    TieredKVStore tiered(memory, disk);
    fill(tiered);
    memory.erase(a);  // on disk only
    tiered.put(KVKey{7, 5}, block_of(5, 20), 1);
    std::vector<KVKey> spread = keys;
    spread.push_back(KVKey{7, 5});
    check_batches_equal_single_calls(tiered, spread);
  }
  SUBCASE("SimulatedStore") {
    kvfuse::SimulatedStore store({0.001, 64}, kvfuse::ResourceTrace::constant(1.0, 10.0));
    fill(store);
    check_batches_equal_single_calls(store, keys);
  }
}

TEST_CASE("TieredKVStore asks each tier once, for the keys no faster tier had, and promotes the hits of get_many") {
  CountingTier fast, middle, slow;
  TieredKVStore tiered(fast, middle, slow);
  const KVKey in_fast{1, 1}, in_middle{1, 2}, in_slow{1, 3}, nowhere{1, 4};
  fast.put(in_fast, block_of(1, 100));
  middle.put(in_middle, block_of(2, 200));
  slow.put(in_slow, block_of(3, 300));
  const std::vector<KVKey> keys{in_fast, in_middle, in_slow, nowhere};

  const std::vector<bool> held = tiered.contains_many(keys);
  CHECK(held == std::vector<bool>{true, true, true, false});
  CHECK(fast.contains_many_calls == 1);
  CHECK(middle.contains_many_calls == 1);
  CHECK(slow.contains_many_calls == 1);
  CHECK(fast.asked.back() == keys);
  CHECK(middle.asked.back() == std::vector<KVKey>{in_middle, in_slow, nowhere});
  CHECK(slow.asked.back() == std::vector<KVKey>{in_slow, nowhere});

  const std::vector<std::optional<KVBlock>> got = tiered.get_many(keys);
  REQUIRE(got.size() == 4);
  CHECK(same(got[0], block_of(1, 100)));
  CHECK(same(got[1], block_of(2, 200)));
  CHECK(same(got[2], block_of(3, 300)));
  CHECK_FALSE(got[3].has_value());
  CHECK(fast.get_many_calls == 1);
  CHECK(middle.get_many_calls == 1);
  CHECK(slow.get_many_calls == 1);
  CHECK(fast.asked.back() == keys);
  CHECK(middle.asked.back() == std::vector<KVKey>{in_middle, in_slow, nowhere});
  CHECK(slow.asked.back() == std::vector<KVKey>{in_slow, nowhere});
  // Never key by key.
  CHECK(fast.contains_calls + middle.contains_calls + slow.contains_calls == 0);
  CHECK(fast.get_calls + middle.get_calls + slow.get_calls == 0);
  // Promoted as get promotes: into every faster tier.
  CHECK(fast.InMemoryKVStore::contains(in_middle));
  CHECK(fast.InMemoryKVStore::contains(in_slow));
  CHECK(middle.InMemoryKVStore::contains(in_slow));
  CHECK(tiered.tier_stats(0).reads == 1);  // one batched read per tier
  CHECK(tiered.tier_stats(2).bytes == 300);

  // Every key in the fastest tier now but one: the slower tiers are asked about that one alone; none missing, they are
  // not asked at all.
  const std::vector<std::optional<KVBlock>> again = tiered.get_many(std::vector<KVKey>{in_slow, in_middle});
  CHECK((again[0].has_value() && again[1].has_value()));
  CHECK(fast.get_many_calls == 2);
  CHECK(middle.get_many_calls == 1);
  CHECK(slow.get_many_calls == 1);
  (void)tiered.get_many(std::vector<KVKey>{nowhere, in_fast});
  CHECK(middle.asked.back() == std::vector<KVKey>{nowhere});
  CHECK(slow.asked.back() == std::vector<KVKey>{nowhere});
}

TEST_CASE("get_into fills the caller's buffer with exactly the bytes of get_range, on every ranged store") {
  kvfuse_test::TempDir tmp;
  const KVKey key{0x5, 0x6};
  const KVBlock block = block_of(3, 3 * page + 1000, 17);  // four pages, the last one short
  SUBCASE("InMemoryKVStore") {
    InMemoryKVStore store;
    store.put(key, block);
    check_get_into_equals_get_range(store, key, block);
  }
  SUBCASE("DiskKVStore") {
    DiskKVStore store(tmp.path);
    store.put(key, block);
    check_get_into_equals_get_range(store, key, block);
    CHECK(store.rejected() == 0);
  }
  SUBCASE("ThrottledKVStore: get_range is one read of the link, as get_into is") {
    InMemoryKVStore inner;
    kvfuse::ThrottledKVStore store(inner, {/*megabytes_per_s=*/0.0, /*latency_ms=*/0.0});
    store.put(key, block);
    check_get_into_equals_get_range(store, key, block);
    CHECK(store.stats().reads == 1 + 2 * 11);  // describe, then each range once by get_into and once by get_range
  }
  SUBCASE("TieredKVStore, from the slow tier") {
    InMemoryKVStore memory;
    DiskKVStore disk(tmp.path);
    TieredKVStore tiered(memory, disk);
    tiered.put(key, block, 1);
    check_get_into_equals_get_range(tiered, key, block);
    CHECK(tiered.tier_stats(1).reads == 1 + 2 * 11);
    CHECK_FALSE(memory.contains(key));  // ranged reads do not promote
  }
}

TEST_CASE("get_into is false where get_range is nullopt: an entry replaced, erased or damaged since describe") {
  kvfuse_test::TempDir tmp;
  const KVKey key{0x9, 0x1};
  const KVBlock block = block_of(4, 3 * page);
  std::vector<std::byte> out(100);
  SUBCASE("InMemoryKVStore") {
    InMemoryKVStore store;
    store.put(key, block);
    const std::optional<KVBlockInfo> info = store.describe(key);
    REQUIRE(info.has_value());
    store.put(key, block);  // the same bytes, another version
    CHECK_FALSE(store.get_into(key, *info, 0, out));
    CHECK_FALSE(store.get_range(key, *info, 0, out.size()).has_value());
    const std::optional<KVBlockInfo> fresh = store.describe(key);
    store.erase(key);
    CHECK_FALSE(store.get_into(key, *fresh, 0, out));
    CHECK_FALSE(store.get_range(key, *fresh, 0, out.size()).has_value());
  }
  SUBCASE("DiskKVStore: a flipped byte fails the ranges over its page only, and rejects the file") {
    DiskKVStore store(tmp.path);
    store.put(key, block);
    const std::optional<KVBlockInfo> info = store.describe(key);
    REQUIRE(info.has_value());
    {
      std::fstream f(store.path_for(key), std::ios::in | std::ios::out | std::ios::binary);
      f.seekp(-static_cast<std::streamoff>(page) + 3, std::ios::end);  // in the last page
      f.put('\x7f');
    }
    CHECK(store.get_into(key, *info, page - 50, out));  // pages 0 and 1 only
    CHECK(store.rejected() == 0);
    CHECK_FALSE(store.get_into(key, *info, 2 * page - 50, out));  // touches the last page
    CHECK(store.rejected() == 1);
    CHECK(store.last_rejection().find("checksum mismatch in payload page 2") != std::string::npos);
    CHECK_FALSE(store.get_range(key, *info, 0, 10).has_value());  // moved aside: absent
  }
}

TEST_CASE("DiskKVStore throws Status::store_unavailable for I/O failures and invalid_argument for bad calls") {
  kvfuse_test::TempDir tmp;
  const KVKey key{0x3, 0x3};
  DiskKVStore store(tmp.path / "store");
  // The directory gone: the put cannot write its temp file.
  fs::remove_all(tmp.path / "store");
  CHECK(code_of([&] { store.put(key, block_of(1, 100)); }) == Status::store_unavailable);
  // A file that cannot be removed (a non-empty directory under the entry's name).
  fs::create_directories(store.path_for(key) / "inside");
  CHECK(code_of([&] { (void)store.erase(key); }) == Status::store_unavailable);
  // A store directory that cannot be made (its parent is a file), and one that is a file.
  std::ofstream(tmp.path / "file") << "x";
  CHECK(code_of([&] { DiskKVStore bad(tmp.path / "file" / "sub"); }) == Status::store_unavailable);
  CHECK(code_of([&] { DiskKVStore bad(tmp.path / "file"); }) == Status::invalid_argument);
  // A bad block.
  DiskKVStore fresh(tmp.path / "fresh");
  CHECK(code_of([&] { fresh.put(key, KVBlock{-1, {}, 0}); }) == Status::invalid_argument);
}

}  // namespace store_batched_reads
