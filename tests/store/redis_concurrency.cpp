// RedisKVStore shared by 16 threads (one store, one server): puts of two variants of each key, gets, get_many,
// describe + get_range on the same keys. Every read returns one of the variants bit for bit or, for a range of an
// entry replaced since describe, nothing; nothing is ever rejected (the transactions keep header and pages of one
// entry together) and nothing fails.
#include <doctest/doctest.h>

#include <array>
#include <atomic>
#include <cstdint>
#include <optional>
#include <random>
#include <thread>
#include <vector>

#include "kvfuse/backend/redis_kv_store.hpp"

#include "support/model_path.hpp"
#include "support/redis_server.hpp"

// Each store test file lives in its own namespace: the files are compiled together (a unity build).
namespace store_redis_concurrency {

using kvfuse::KVBlock;
using kvfuse::KVBlockInfo;
using kvfuse::KVKey;
using kvfuse::RedisKVStore;
using kvfuse_test::random_block;
using kvfuse_test::same_block;
using kvfuse_test::slice;

TEST_CASE("RedisKVStore: 16 threads get, put, get_many and get_range shared keys with no failure") {
  if (!kvfuse_test::redis_available()) {
    kvfuse_test::skip("redis-server / redis-cli not on PATH");
    return;
  }
  kvfuse_test::RedisServer server;
  RedisKVStore store(server.uri());
  constexpr std::uint64_t num_keys = 6;
  constexpr std::size_t bytes = 2 * 65536 + 1000;  // three pages
  std::vector<KVKey> keys;
  std::vector<std::array<KVBlock, 2>> variants;
  std::vector<std::array<std::uint64_t, 2>> versions;
  for (std::uint64_t k = 0; k < num_keys; ++k) {
    keys.push_back(KVKey{77, k});
    variants.push_back({random_block(2 * k, bytes, 8), random_block(2 * k + 1, bytes, 8)});
    std::array<std::uint64_t, 2> v{};
    for (int i = 0; i < 2; ++i) {
      store.put(keys[k], variants[k][static_cast<std::size_t>(i)]);
      const std::optional<KVBlockInfo> info = store.describe(keys[k]);
      REQUIRE(info.has_value());
      v[static_cast<std::size_t>(i)] = info->version;
    }
    REQUIRE(v[0] != v[1]);
    versions.push_back(v);
  }

  std::atomic<int> wrong{0}, missing{0}, ranges_read{0}, ranges_replaced{0};
  const auto matches = [&](std::size_t k, const std::optional<KVBlock>& got) {
    return same_block(got, variants[k][0]) || same_block(got, variants[k][1]);
  };
  std::vector<std::thread> threads;
  for (int t = 0; t < 16; ++t) {
    threads.emplace_back([&, t] {
      std::mt19937_64 rng(static_cast<std::uint64_t>(t));
      for (int iter = 0; iter < 50; ++iter) {
        const std::size_t k = rng() % num_keys;
        switch (rng() % 4) {
          case 0:
            store.put(keys[k], variants[k][rng() % 2]);
            break;
          case 1: {
            const std::optional<KVBlock> got = store.get(keys[k]);
            if (!got) ++missing;
            else if (!matches(k, got)) ++wrong;
            break;
          }
          case 2: {
            const std::vector<KVKey> some{keys[k], keys[(k + 1) % num_keys], keys[(k + 2) % num_keys]};
            const std::vector<std::optional<KVBlock>> got = store.get_many(some);
            for (std::size_t j = 0; j < got.size(); ++j) {
              if (!got[j]) ++missing;
              else if (!matches((k + j) % num_keys, got[j])) ++wrong;
            }
            break;
          }
          default: {
            const std::optional<KVBlockInfo> info = store.describe(keys[k]);
            if (!info) {
              ++missing;
              break;
            }
            const std::size_t which = info->version == versions[k][0] ? 0 : 1;
            if (info->version != versions[k][which]) {
              ++wrong;
              break;
            }
            const std::uint64_t offset = rng() % bytes;
            const std::uint64_t size = rng() % (bytes - offset + 1);
            const std::optional<std::vector<std::byte>> got = store.get_range(keys[k], *info, offset, size);
            if (!got) {
              ++ranges_replaced;  // replaced since describe: allowed
            } else if (*got != slice(variants[k][which], offset, size)) {
              ++wrong;
            } else {
              ++ranges_read;
            }
          }
        }
      }
    });
  }
  for (std::thread& t : threads) t.join();
  MESSAGE(ranges_read.load() << " ranges read, " << ranges_replaced.load() << " replaced since describe");
  CHECK(wrong.load() == 0);
  CHECK(missing.load() == 0);
  CHECK(ranges_read.load() > 0);
  CHECK(store.rejected() == 0);
  CHECK(store.unavailable() == 0);
  CHECK(store.last_rejection().empty());
  CHECK(store.last_error().empty());
}

}  // namespace store_redis_concurrency
