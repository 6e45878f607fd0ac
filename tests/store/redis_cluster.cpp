// RedisKVStore on a real three-master Redis Cluster: keys spread over the masters by slot (checked against the
// servers' CLUSTER KEYSLOT and DBSIZE), round trips (get_many and contains_many over the three masters), MOVED after
// a slot is moved by hand (SETSLOT + MIGRATE), ASK while a slot migrates, a killed master (its keys miss, the others
// hit) and no reachable seed.
#include <doctest/doctest.h>

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "kvfuse/backend/redis_kv_store.hpp"

#include "support/error_of.hpp"
#include "support/model_path.hpp"
#include "support/redis_server.hpp"

// Each store test file lives in its own namespace: the files are compiled together (a unity build).
namespace store_redis_cluster {

using kvfuse::KVBlock;
using kvfuse::KVBlockInfo;
using kvfuse::KVKey;
using kvfuse::RedisKVStore;
using kvfuse_test::random_block;
using kvfuse_test::RedisCluster;
using kvfuse_test::same_block;
using kvfuse_test::slice;
using Clock = std::chrono::steady_clock;

namespace {

constexpr std::uint64_t model = 0xfeed;

bool has(const std::string& text, std::string_view needle) {
  if (text.find(needle) != std::string::npos) return true;
  MESSAGE("\"" << text << "\" lacks \"" << std::string(needle) << "\"");
  return false;
}

// Keys {model, c} for c = from, from + 1, ... whose Redis key falls in `slot`.
std::vector<KVKey> keys_in_slot(const RedisKVStore& store, std::size_t slot, std::size_t count, std::uint64_t from) {
  std::vector<KVKey> out;
  for (std::uint64_t c = from; out.size() < count; ++c) {
    if (kvfuse::redis_key_slot(store.key_name(KVKey{model, c})) == slot) out.push_back(KVKey{model, c});
  }
  return out;
}

// Moves `slot` from node `src` to node `dst` by hand, as redis-cli --cluster reshard does, migrating `keys`.
void begin_migration(RedisCluster& cluster, std::size_t slot, std::size_t src, std::size_t dst) {
  cluster.node(dst).client().ok({"CLUSTER", "SETSLOT", std::to_string(slot), "IMPORTING", cluster.id(src)});
  cluster.node(src).client().ok({"CLUSTER", "SETSLOT", std::to_string(slot), "MIGRATING", cluster.id(dst)});
}

void migrate(RedisCluster& cluster, const RedisKVStore& store, std::size_t src, std::size_t dst, const KVKey& key) {
  cluster.node(src).client().ok({"MIGRATE", "127.0.0.1", std::to_string(cluster.node(dst).port()), store.key_name(key),
                                 "0", "5000"});
}

void finish_migration(RedisCluster& cluster, std::size_t slot, std::size_t dst) {
  for (std::size_t n = 0; n < RedisCluster::size(); ++n) {
    cluster.node(n).client().ok({"CLUSTER", "SETSLOT", std::to_string(slot), "NODE", cluster.id(dst)});
  }
}

}  // namespace

TEST_CASE("RedisKVStore cluster: keys spread over the three masters; round trips through the cluster") {
  if (!kvfuse_test::redis_available()) {
    kvfuse_test::skip("redis-server / redis-cli not on PATH");
    return;
  }
  RedisCluster cluster;
  RedisKVStore store(fmt::format("redis-cluster://{}", cluster.node(0).address()));  // one seed is enough
  CHECK(store.options().cluster);

  // The slot function agrees with the servers, hash tags included.
  auto client = cluster.node(0).client();
  for (const std::string& name : {std::string("foo"), std::string("{user1000}.following"), std::string("foo{}{bar}"),
                                  std::string("a{b"), store.key_name(KVKey{model, 1})}) {
    CAPTURE(name);
    CHECK(kvfuse::redis_key_slot(name) == client.integer({"CLUSTER", "KEYSLOT", name}));
  }

  std::vector<KVKey> keys;
  std::vector<KVBlock> blocks;
  for (std::uint64_t i = 0; i < 60; ++i) {
    keys.push_back(KVKey{model, i});
    blocks.push_back(random_block(i, 1000 + 2000 * i, static_cast<std::int64_t>(i)));
    store.put(keys.back(), blocks.back());
  }
  long long total = 0;
  for (std::size_t n = 0; n < RedisCluster::size(); ++n) {
    const long long keys_here = cluster.node(n).client().integer({"DBSIZE"});
    MESSAGE("node " << n << " holds " << keys_here << " keys");
    CHECK(keys_here > 0);
    total += keys_here;
  }
  CHECK(total == 60);
  for (std::size_t i = 0; i < keys.size(); i += 7) {  // each key lives on its slot's master
    const std::size_t owner = cluster.owner(kvfuse::redis_key_slot(store.key_name(keys[i])));
    CHECK(cluster.node(owner).client().integer({"EXISTS", store.key_name(keys[i])}) == 1);
  }

  for (std::size_t i = 0; i < keys.size(); ++i) CHECK(same_block(store.get(keys[i]), blocks[i]));
  std::vector<KVKey> wanted = keys;
  wanted.push_back(KVKey{model, 1000});
  const std::vector<std::optional<KVBlock>> many = store.get_many(wanted);
  REQUIRE(many.size() == 61);
  for (std::size_t i = 0; i < keys.size(); ++i) CHECK(same_block(many[i], blocks[i]));
  CHECK_FALSE(many[60].has_value());
  const std::vector<bool> held = store.contains_many(wanted);  // one pipeline of EXISTS per master
  REQUIRE(held.size() == 61);
  for (std::size_t i = 0; i < keys.size(); ++i) CHECK(held[i]);
  CHECK_FALSE(held[60]);
  for (std::size_t i = 0; i < keys.size(); i += 11) {
    const std::optional<KVBlockInfo> info = store.describe(keys[i]);
    REQUIRE(info.has_value());
    CHECK(store.get_range(keys[i], *info, 100, 500) == slice(blocks[i], 100, 500));
    std::vector<std::byte> out(500);
    CHECK(store.get_into(keys[i], *info, 100, out));
    CHECK(out == slice(blocks[i], 100, 500));
  }
  CHECK(store.contains(keys[5]));
  CHECK(store.erase(keys[5]));
  CHECK_FALSE(store.contains(keys[5]));
  CHECK(store.moved_redirects() == 0);
  CHECK(store.ask_redirects() == 0);
  CHECK(store.rejected() == 0);
  CHECK(store.unavailable() == 0);
}

TEST_CASE("RedisKVStore cluster: MOVED after a slot moves to another master updates the slot map") {
  if (!kvfuse_test::redis_available()) {
    kvfuse_test::skip("redis-server / redis-cli not on PATH");
    return;
  }
  RedisCluster cluster;
  RedisKVStore store(cluster.uri());
  const KVKey key{model, 42};
  const std::size_t slot = kvfuse::redis_key_slot(store.key_name(key));
  const KVBlock block = random_block(42, 150000);
  store.put(key, block);  // the store has read the slot map
  const std::optional<KVBlockInfo> info = store.describe(key);
  REQUIRE(info.has_value());
  const std::size_t src = cluster.owner(slot);
  const std::size_t dst = (src + 1) % RedisCluster::size();

  begin_migration(cluster, slot, src, dst);
  migrate(cluster, store, src, dst, key);
  finish_migration(cluster, slot, dst);
  REQUIRE(cluster.owner(slot) == dst);
  CHECK(cluster.node(src).client().integer({"DBSIZE"}) == 0);

  CHECK(same_block(store.get(key), block));  // src answers MOVED; the store follows it
  CHECK(store.moved_redirects() == 1);
  CHECK(same_block(store.get(key), block));  // the map now says dst: no more redirections
  CHECK(store.get_range(key, *info, 70000, 1000) == slice(block, 70000, 1000));
  const KVBlock replacement = random_block(43, 1000);
  store.put(key, replacement);
  CHECK(same_block(store.get(key), replacement));
  CHECK(store.moved_redirects() == 1);
  CHECK(store.ask_redirects() == 0);
  CHECK(store.unavailable() == 0);
}

TEST_CASE("RedisKVStore cluster: ASK during a slot migration, without changing the slot map") {
  if (!kvfuse_test::redis_available()) {
    kvfuse_test::skip("redis-server / redis-cli not on PATH");
    return;
  }
  RedisCluster cluster;
  RedisKVStore store(cluster.uri());
  const std::size_t slot = 1000;  // on node 0
  const std::vector<KVKey> keys = keys_in_slot(store, slot, 3, 0);
  const KVBlock stays = random_block(1, 100000), moves = random_block(2, 100000), fresh = random_block(3, 5000);
  store.put(keys[0], stays);
  store.put(keys[1], moves);
  const std::size_t src = cluster.owner(slot);
  const std::size_t dst = (src + 1) % RedisCluster::size();

  begin_migration(cluster, slot, src, dst);
  migrate(cluster, store, src, dst, keys[1]);
  CHECK(same_block(store.get(keys[0]), stays));  // still on the source: served there
  CHECK(store.ask_redirects() == 0);
  CHECK(same_block(store.get(keys[1]), moves));  // moved: the source answers ASK
  CHECK(store.ask_redirects() == 1);
  const std::optional<KVBlockInfo> info = store.describe(keys[1]);  // MULTI/EXEC after ASKING
  REQUIRE(info.has_value());
  CHECK(store.get_range(keys[1], *info, 65536, 20000) == slice(moves, 65536, 20000));
  CHECK(store.ask_redirects() == 3);
  store.put(keys[2], fresh);  // a new key of a migrating slot goes to the target
  CHECK(store.ask_redirects() == 4);
  CHECK(cluster.node(dst).client().integer({"CLUSTER", "COUNTKEYSINSLOT", std::to_string(slot)}) == 2);
  const std::vector<std::optional<KVBlock>> many = store.get_many(keys);
  CHECK(same_block(many[0], stays));
  CHECK(same_block(many[1], moves));
  CHECK(same_block(many[2], fresh));
  CHECK(store.moved_redirects() == 0);  // ASK never changes the map: the source still serves keys[0]
  const std::int64_t asks = store.ask_redirects();
  CHECK(store.contains_many(keys) == std::vector<bool>{true, true, true});  // EXISTS follows ASK like GET
  CHECK(store.ask_redirects() == asks + 2);
  CHECK(same_block(store.get(keys[0]), stays));

  // Finishing the migration turns the redirections into one MOVED.
  migrate(cluster, store, src, dst, keys[0]);
  finish_migration(cluster, slot, dst);
  CHECK(same_block(store.get(keys[0]), stays));
  CHECK(store.moved_redirects() == 1);
  CHECK(store.unavailable() == 0);
  CHECK(store.rejected() == 0);
}

TEST_CASE("RedisKVStore cluster: a killed master makes its keys misses while the others hit") {
  if (!kvfuse_test::redis_available()) {
    kvfuse_test::skip("redis-server / redis-cli not on PATH");
    return;
  }
  RedisCluster cluster;
  kvfuse::RedisOptions options = kvfuse::parse_redis_uri(cluster.uri());
  options.command_timeout = std::chrono::milliseconds(500);
  RedisKVStore store(options);
  std::vector<KVKey> keys;
  std::vector<KVBlock> blocks;
  std::vector<std::size_t> owners;
  for (std::uint64_t i = 0; i < 30; ++i) {
    keys.push_back(KVKey{model, i});
    blocks.push_back(random_block(i, 3000));
    store.put(keys.back(), blocks.back());
    owners.push_back(cluster.owner(kvfuse::redis_key_slot(store.key_name(keys.back()))));
  }
  const std::size_t dead = 2;
  cluster.node(dead).kill();
  const auto t0 = Clock::now();
  int hits = 0, misses = 0;
  for (std::size_t i = 0; i < keys.size(); ++i) {
    CAPTURE(i);
    if (owners[i] == dead) {
      CHECK_FALSE(store.get(keys[i]).has_value());
      ++misses;
    } else {
      CHECK(same_block(store.get(keys[i]), blocks[i]));
      ++hits;
    }
  }
  const std::vector<std::optional<KVBlock>> many = store.get_many(keys);
  for (std::size_t i = 0; i < keys.size(); ++i) CHECK(many[i].has_value() == (owners[i] != dead));
  const std::vector<bool> held = store.contains_many(keys);
  for (std::size_t i = 0; i < keys.size(); ++i) CHECK(held[i] == (owners[i] != dead));
  const double seconds = std::chrono::duration<double>(Clock::now() - t0).count();
  MESSAGE("reads with a master down took " << seconds << " s");
  CHECK(seconds < 3.0);
  CHECK(hits > 0);
  CHECK(misses > 0);
  CHECK(store.unavailable() == 3 * misses);  // get, get_many and contains_many of each key on the dead master
  CHECK(has(store.last_error(), cluster.node(dead).address()));

  std::size_t victim = 0;
  while (owners[victim] != dead) ++victim;
  const std::string message = kvfuse_test::error_of([&] { store.put(keys[victim], blocks[victim]); });
  CHECK(has(message, "cannot store"));
  CHECK(kvfuse_test::code_of([&] { store.put(keys[victim], blocks[victim]); }) == kvfuse::Status::store_unavailable);
  CHECK(has(message, cluster.node(dead).address()));
  std::size_t alive = 0;
  while (owners[alive] == dead) ++alive;
  store.put(keys[alive], blocks[0]);
  CHECK(same_block(store.get(keys[alive]), blocks[0]));
}

TEST_CASE("RedisKVStore cluster: no reachable seed: misses that name the slot map, puts that throw") {
  if (!kvfuse_test::redis_available()) {
    kvfuse_test::skip("redis-server / redis-cli not on PATH");
    return;
  }
  const int p1 = kvfuse_test::free_loopback_port(false);
  const int p2 = kvfuse_test::free_loopback_port(false);
  RedisKVStore store(fmt::format("redis-cluster://127.0.0.1:{},127.0.0.1:{}", p1, p2));
  CHECK_FALSE(store.get(KVKey{1, 2}).has_value());
  CHECK(has(store.last_error(), "cannot read the cluster's slot map from any node"));
  CHECK(has(store.last_error(), fmt::format("127.0.0.1:{}", p2)));
  CHECK(has(kvfuse_test::error_of([&] { store.put(KVKey{1, 2}, random_block(1, 10)); }), "slot map"));
  for (const std::optional<KVBlock>& block : store.get_many(std::vector<KVKey>{KVKey{1, 2}, KVKey{1, 3}})) {
    CHECK_FALSE(block.has_value());
  }
  CHECK(store.unavailable() == 3);
}

}  // namespace store_redis_cluster
