// AnyKVStore / AnyTieredKVStore: every call reaches the store wrapped, lookups are counted, and the tiered one
// forwards the tiers' devices and puts into a tier.
#include <doctest/doctest.h>

#include <cstddef>
#include <vector>

#include "kvfuse/backend/any_kv_store.hpp"
#include "kvfuse/backend/in_memory_store.hpp"
#include "kvfuse/backend/tiered_kv_store.hpp"

// Each store test file lives in its own namespace: the files are compiled together (a unity build).
namespace store_any_kv_store {

using namespace kvfuse;

namespace {

KVBlock block_of(std::byte value) {
  KVBlock b;
  b.num_tokens = 1;
  b.bytes.assign(16, value);
  return b;
}

}  // namespace

TEST_CASE("AnyKVStore forwards every call to the store it wraps and counts the batched lookups") {
  InMemoryKVStore memory;
  AnyKVStore store(memory);
  const KVKey held{1, 2}, absent{1, 3};
  store.put(held, block_of(std::byte{7}));
  CHECK(memory.contains(held));
  CHECK(store.contains(held));
  CHECK_FALSE(store.contains(absent));
  const std::vector<KVKey> keys{held, absent, held};
  CHECK(store.contains_many(keys) == std::vector<bool>{true, false, true});
  CHECK((store.hits() == 2 && store.misses() == 1));
  const auto many = store.get_many(keys);
  CHECK((many.size() == 3 && many[0].has_value() && !many[1].has_value()));
  const auto info = store.describe(held);
  REQUIRE(info.has_value());
  std::vector<std::byte> out(4);
  CHECK(store.get_into(held, *info, 4, out));
  CHECK(out[0] == std::byte{7});
  const auto range = store.get_range(held, *info, 0, 8);
  CHECK((range.has_value() && range->size() == 8));
  CHECK(store.erase(held));
  CHECK_FALSE(memory.contains(held));
  CHECK_FALSE(store.get(held).has_value());
}

TEST_CASE("AnyTieredKVStore forwards the tiers' devices and a put into a tier to the tiered store it wraps") {
  InMemoryKVStore fast, slow;
  TieredKVStore tiered(TieredConfig{{{"dram", 1.0}, {"disk", 0.1}}}, fast, slow);
  AnyTieredKVStore store(tiered);
  const std::vector<StorageDevice> devices = store.tier_devices();
  REQUIRE(devices.size() == 2);
  CHECK((devices[0].name == "dram" && devices[1].name == "disk"));
  store.put({1, 1}, block_of(std::byte{1}), 1);
  CHECK((!fast.contains({1, 1}) && slow.contains({1, 1})));
  store.put({1, 2}, block_of(std::byte{2}));  // a plain put: every tier
  CHECK((fast.contains({1, 2}) && slow.contains({1, 2})));
  CHECK(store.get({1, 1}).has_value());  // read through the tiered store: promoted into the fast tier
  CHECK(fast.contains({1, 1}));
}

}  // namespace store_any_kv_store
