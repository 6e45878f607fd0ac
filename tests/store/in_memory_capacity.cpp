// InMemoryKVStore with a capacity: a put evicts the least recently used entries until the new one fits, a read
// makes an entry recent, a block larger than the capacity is not stored, and a ranged read of an entry evicted
// after its describe fails (the reader computes instead) rather than returning another entry's bytes.
#include <doctest/doctest.h>

#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "kvfuse/backend/in_memory_store.hpp"
#include "kvfuse/core/error.hpp"
#include "kvfuse/core/status.hpp"

#include "support/error_of.hpp"

// Each store test file lives in its own namespace: the files are compiled together (a unity build).
namespace store_in_memory_capacity {

using kvfuse::InMemoryKVStore;
using kvfuse::KVBlock;
using kvfuse::KVKey;

namespace {

KVKey key(std::uint64_t n) { return KVKey{n, n * 7 + 1}; }
KVBlock block(std::size_t bytes, std::byte fill) { return KVBlock{1, std::vector<std::byte>(bytes, fill), 0}; }

}  // namespace

TEST_CASE("in_memory_capacity: a put evicts the least recently used entries until the new one fits") {
  InMemoryKVStore store(300);
  store.put(key(1), block(100, std::byte{1}));
  store.put(key(2), block(100, std::byte{2}));
  store.put(key(3), block(100, std::byte{3}));
  CHECK(store.get(key(1)).has_value());  // 1 is now the most recent; 2 the least
  store.put(key(4), block(150, std::byte{4}));
  CHECK(!store.contains(key(2)));
  CHECK(!store.contains(key(3)));  // 100 + 100 + 150 > 300: the next least recent goes too
  CHECK(store.contains(key(1)));
  CHECK(store.contains(key(4)));
  CHECK(store.bytes() == 250);
  CHECK(store.evictions() == 2);
  CHECK(store.size() == 2);
}

TEST_CASE("in_memory_capacity: replacing an entry frees its old bytes before evicting anything") {
  InMemoryKVStore store(200);
  store.put(key(1), block(100, std::byte{1}));
  store.put(key(2), block(100, std::byte{2}));
  store.put(key(1), block(100, std::byte{9}));
  CHECK(store.evictions() == 0);
  CHECK(store.get(key(1))->bytes[0] == std::byte{9});
  CHECK(store.contains(key(2)));
}

TEST_CASE("in_memory_capacity: a block larger than the capacity is not stored and evicts nothing") {
  InMemoryKVStore store(100);
  store.put(key(1), block(60, std::byte{1}));
  store.put(key(2), block(101, std::byte{2}));
  CHECK(!store.contains(key(2)));
  CHECK(store.contains(key(1)));
  CHECK(store.rejected() == 1);
  CHECK(store.evictions() == 0);
}

TEST_CASE("in_memory_capacity: get_many and get_into make an entry recent; a read after eviction fails") {
  InMemoryKVStore store(200);
  store.put(key(1), block(100, std::byte{1}));
  store.put(key(2), block(100, std::byte{2}));
  const std::optional<kvfuse::KVBlockInfo> info = store.describe(key(1));
  REQUIRE(info.has_value());
  std::vector<std::byte> out(50);
  CHECK(store.get_into(key(1), *info, 10, out));  // 1 recent: 2 is evicted next
  store.put(key(3), block(100, std::byte{3}));
  CHECK(store.contains(key(1)));
  CHECK(!store.contains(key(2)));
  const std::vector<KVKey> keys{key(3)};
  CHECK(store.get_many(keys)[0].has_value());  // 3 recent: 1 is evicted next
  store.put(key(4), block(100, std::byte{4}));
  CHECK(!store.contains(key(1)));
  CHECK(!store.get_into(key(1), *info, 0, out));  // evicted after its describe: the read fails
}

TEST_CASE("in_memory_capacity: a capacity of zero or less is refused, naming the value") {
  CHECK(kvfuse_test::code_of([] { InMemoryKVStore store(0); }) == kvfuse::Status::invalid_argument);
  CHECK(kvfuse_test::error_of([] { InMemoryKVStore store(-5); }).find("-5") != std::string::npos);
}

}  // namespace store_in_memory_capacity
