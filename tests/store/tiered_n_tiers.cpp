// TieredKVStore over three tiers: promotion into every faster tier, ranged reads from the tier that holds the
// entry, the tier of a put, the write policies (write-through, write-back with flush), failing tiers, names and costs.
#include <doctest/doctest.h>

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "kvfuse/backend/disk_kv_store.hpp"
#include "kvfuse/backend/in_memory_store.hpp"
#include "kvfuse/backend/tiered_kv_store.hpp"

#include "../support/error_of.hpp"
#include "../support/test_util.hpp"

// Each store test file lives in its own namespace: the files are compiled together (a unity build).
namespace store_tiered_n_tiers {

using namespace kvfuse;
using kvfuse_test::error_of;
namespace fs = std::filesystem;

namespace {

KVBlock block_of(std::uint8_t seed, std::size_t bytes = 300) {
  KVBlock b;
  b.num_tokens = 5;
  b.first_position = 2;
  b.bytes.resize(bytes);
  for (std::size_t i = 0; i < bytes; ++i) b.bytes[i] = static_cast<std::byte>(seed + i);
  return b;
}

bool contains_text(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

}  // namespace

TEST_CASE("three tiers: a get hits the first tier that has the key and promotes it into every faster one") {
  kvfuse_test::TempDir tmp;
  InMemoryKVStore memory;
  InMemoryKVStore second;
  DiskKVStore disk(tmp.path);
  TieredKVStore tiered(memory, second, disk);
  static_assert(decltype(tiered)::kTiers == 3);
  const KVKey key{1, 2};
  disk.put(key, block_of(7));
  CHECK(tiered.contains(key));

  // describe / get_range: from the tier that holds it, without promotion.
  std::optional<KVBlockInfo> info = tiered.describe(key);
  REQUIRE(info.has_value());
  CHECK(info->tier == 2);
  CHECK(info->bytes == 300);
  std::optional<std::vector<std::byte>> range = tiered.get_range(key, *info, 10, 20);
  REQUIRE(range.has_value());
  const KVBlock seven = block_of(7);
  CHECK(*range == std::vector<std::byte>(seven.bytes.begin() + 10, seven.bytes.begin() + 30));
  CHECK_FALSE(memory.contains(key));
  CHECK_FALSE(second.contains(key));
  KVBlockInfo bad = *info;
  bad.tier = 3;
  CHECK(contains_text(error_of([&] { (void)tiered.get_range(key, bad, 0, 1); }), "tier 3 of a 3-tier store"));

  // get: promoted into tiers 0 and 1; the next describe finds it in tier 0.
  const std::optional<KVBlock> got = tiered.get(key);
  REQUIRE(got.has_value());
  CHECK(got->bytes == block_of(7).bytes);
  CHECK(memory.contains(key));
  CHECK(second.contains(key));
  info = tiered.describe(key);
  REQUIRE(info.has_value());
  CHECK(info->tier == 0);

  // A hit in the middle tier promotes into the first only.
  const KVKey other{1, 3};
  second.put(other, block_of(9));
  CHECK(tiered.get(other).has_value());
  CHECK(memory.contains(other));
  CHECK_FALSE(disk.contains(other));

  // Each tier's reads are measured.
  CHECK(tiered.tier_stats(2).bytes >= 300 + 20);
  CHECK(tiered.tier_stats(1).bytes == 300);
  CHECK(contains_text(error_of([&] { (void)tiered.tier_stats(3); }), "tier_stats: tier 3 of a 3-tier store"));

  // erase: every tier.
  CHECK(tiered.erase(key));
  CHECK_FALSE(memory.contains(key));
  CHECK_FALSE(second.contains(key));
  CHECK_FALSE(disk.contains(key));
  CHECK_FALSE(tiered.erase(key));
}

TEST_CASE("write-through: a put with tier p writes tier p and every slower one, synchronously, never a faster one") {
  kvfuse_test::TempDir tmp;
  InMemoryKVStore memory;
  InMemoryKVStore second;
  DiskKVStore disk(tmp.path);
  TieredKVStore tiered(memory, second, disk);
  CHECK(tiered.config().write == WritePolicy::write_through);
  tiered.put({1, 1}, block_of(1));
  CHECK((memory.contains({1, 1}) && second.contains({1, 1}) && disk.contains({1, 1})));
  tiered.put({1, 2}, block_of(2), 1);
  CHECK_FALSE(memory.contains({1, 2}));
  CHECK((second.contains({1, 2}) && disk.contains({1, 2})));
  tiered.put({1, 3}, block_of(3), 2);
  CHECK((!memory.contains({1, 3}) && !second.contains({1, 3}) && disk.contains({1, 3})));
  tiered.put({1, 4}, block_of(4));  // the tier is the put's, not the store's: a plain put is tier 0 again
  CHECK((memory.contains({1, 4}) && second.contains({1, 4}) && disk.contains({1, 4})));
  tiered.put({1, 5}, block_of(5), 0);
  CHECK((memory.contains({1, 5}) && second.contains({1, 5}) && disk.contains({1, 5})));
  CHECK(tiered.pending_writes() == 0);
  CHECK(contains_text(error_of([&] { tiered.put({1, 6}, block_of(6), 3); }), "put: tier 3 of a 3-tier store"));
  CHECK_FALSE(tiered.contains({1, 6}));
}

TEST_CASE("write-back writes the put's tier; flush, or the destructor, writes the slower ones") {
  kvfuse_test::TempDir tmp;
  InMemoryKVStore memory;
  InMemoryKVStore second;
  DiskKVStore disk(tmp.path);
  TieredConfig config;
  config.write = WritePolicy::write_back;
  {
    TieredKVStore tiered(config, memory, second, disk);
    tiered.put({2, 1}, block_of(1));
    CHECK(memory.contains({2, 1}));
    CHECK_FALSE(second.contains({2, 1}));
    CHECK_FALSE(disk.contains({2, 1}));
    CHECK(tiered.pending_writes() == 1);
    CHECK(tiered.flush() == 1);
    CHECK(tiered.pending_writes() == 0);
    CHECK(second.get({2, 1})->bytes == block_of(1).bytes);
    CHECK(disk.get({2, 1})->bytes == block_of(1).bytes);
    CHECK(tiered.flush() == 0);

    // A put replaces the pending block; an erase cancels it.
    tiered.put({2, 2}, block_of(2));
    tiered.put({2, 2}, block_of(3));
    CHECK(tiered.pending_writes() == 1);
    CHECK(tiered.flush() == 1);
    CHECK(disk.get({2, 2})->bytes == block_of(3).bytes);
    tiered.put({2, 3}, block_of(4));
    CHECK(tiered.erase({2, 3}));
    CHECK(tiered.flush() == 0);
    CHECK_FALSE(tiered.contains({2, 3}));

    // Tier 1: the second tier now, the disk at flush; the memory tier never.
    tiered.put({2, 4}, block_of(5), 1);
    CHECK((!memory.contains({2, 4}) && second.contains({2, 4}) && !disk.contains({2, 4})));
    CHECK(tiered.flush() == 1);
    CHECK(disk.contains({2, 4}));
    CHECK_FALSE(memory.contains({2, 4}));

    // The slowest tier: nothing is left for later.
    tiered.put({2, 5}, block_of(6), 2);
    CHECK(disk.contains({2, 5}));
    CHECK(tiered.pending_writes() == 0);

    tiered.put({2, 6}, block_of(7));
    CHECK(tiered.pending_writes() == 1);
  }
  CHECK(disk.get({2, 6})->bytes == block_of(7).bytes);  // flushed by the destructor
}

TEST_CASE("a failing tier is counted per tier and never fails the request") {
  kvfuse_test::TempDir tmp;
  InMemoryKVStore memory;
  DiskKVStore disk(tmp.path / "disk");
  InMemoryKVStore remote;
  TieredKVStore tiered(memory, disk, remote);
  fs::remove_all(tmp.path / "disk");

  // Write-through: the disk's failure is kept, memory and the remote tier hold the block.
  CHECK_NOTHROW(tiered.put({3, 1}, block_of(1)));
  CHECK(tiered.put_failures(0) == 0);
  CHECK(tiered.put_failures(1) == 1);
  CHECK(tiered.put_failures(2) == 0);
  CHECK(contains_text(tiered.last_put_error(1), (tmp.path / "disk").string()));
  CHECK(tiered.last_put_error(2).empty());
  CHECK((memory.contains({3, 1}) && remote.contains({3, 1})));

  // A promotion into the failing tier is counted too; the get still returns the block.
  remote.put({3, 2}, block_of(2));
  const std::optional<KVBlock> got = tiered.get({3, 2});
  REQUIRE(got.has_value());
  CHECK(got->bytes == block_of(2).bytes);
  CHECK(memory.contains({3, 2}));
  CHECK(tiered.put_failures(1) == 2);
  CHECK(tiered.slow_put_failures() == 2);  // every tier but the first
  CHECK(tiered.last_slow_error() == tiered.last_put_error(1));

  // A put into the failing tier of a two-tier store: no tier that should hold it took it, so the faster one does.
  InMemoryKVStore memory2;
  TieredKVStore two(memory2, disk);
  CHECK_NOTHROW(two.put({3, 3}, block_of(3), 1));
  CHECK(two.put_failures(1) == 1);
  CHECK(memory2.get({3, 3})->bytes == block_of(3).bytes);
}

namespace {

// A tier whose erase fails like a store that went away.
struct UnerasableStore : InMemoryKVStore {
  bool erase(const KVKey& key) { throw error(fmt::format("cannot erase {:x}: the server went away", key.content)); }
};
static_assert(KVStore<UnerasableStore>);

}  // namespace

TEST_CASE("a tier's failed erase is counted per tier, and erase still removes the key from the other tiers") {
  InMemoryKVStore memory;
  UnerasableStore remote;
  TieredKVStore tiered(memory, remote);
  tiered.put({4, 1}, block_of(1));
  bool erased = false;
  CHECK_NOTHROW(erased = tiered.erase({4, 1}));
  CHECK(erased);
  CHECK_FALSE(memory.contains({4, 1}));
  CHECK(tiered.erase_failures(0) == 0);
  CHECK(tiered.erase_failures(1) == 1);
  CHECK(contains_text(tiered.last_erase_error(1), "the server went away"));
  CHECK(tiered.last_erase_error(0).empty());
  CHECK(contains_text(error_of([&] { (void)tiered.erase_failures(2); }), "tier 2"));
}

TEST_CASE("tier names and costs: defaults, configured, and bad configurations named") {
  InMemoryKVStore a;
  InMemoryKVStore b;
  InMemoryKVStore c;
  const TieredKVStore defaults(a, b, c);
  const std::vector<StorageDevice> d = defaults.tier_devices();
  REQUIRE(d.size() == 3);
  CHECK(d[0].name == "tier0");
  CHECK(d[2].name == "tier2");
  CHECK(d[0].cost_per_gb == 1.0);
  CHECK(d[1].cost_per_gb == doctest::Approx(0.1));
  CHECK(d[2].cost_per_gb == doctest::Approx(0.01));
  CHECK(d[1].bandwidth_bytes_per_s == 0.0);  // nothing read yet

  TieredConfig config;
  config.tiers = {{"dram", 3.0}, {"ssd", 0.2}, {"redis", 0.5}};
  TieredKVStore named(config, a, b, c);
  b.put({4, 1}, block_of(1));
  (void)named.get({4, 1});
  const std::vector<StorageDevice> n = named.tier_devices();
  CHECK(n[1].name == "ssd");
  CHECK(n[2].cost_per_gb == 0.5);
  CHECK(n[1].bandwidth_bytes_per_s > 0.0);

  config.tiers.pop_back();
  CHECK(contains_text(error_of([&] { TieredKVStore x(config, a, b, c); }), "2 tier specs for a 3-tier store"));
  config.tiers = {{"dram", 1.0}, {"", 0.1}};
  CHECK(contains_text(error_of([&] { TieredKVStore x(config, a, b); }), "tier 1 has no name"));
  config.tiers = {{"dram", 1.0}, {"ssd", -2.0}};
  CHECK(contains_text(error_of([&] { TieredKVStore x(config, a, b); }), "tier 'ssd' cost_per_gb = -2"));
}

}  // namespace store_tiered_n_tiers
