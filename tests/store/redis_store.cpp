// RedisKVStore against a real redis-server: the stored value, round trips (get, get_many and contains_many in one
// round trip each, describe + get_range / get_into), rejection of foreign, other-model, garbage, truncated and
// damaged values, replacement between describe and get_range, TTL expiry, maxmemory eviction and noeviction, URIs
// and key slots.
#include <doctest/doctest.h>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include <fmt/format.h>

#include "kvfuse/backend/redis_kv_store.hpp"
#include "kvfuse/backend/tiered_kv_store.hpp"

#include "support/error_of.hpp"
#include "support/model_path.hpp"
#include "support/redis_server.hpp"

// Each store test file lives in its own namespace: the files are compiled together (a unity build).
namespace store_redis_store {

using kvfuse::KVBlock;
using kvfuse::KVBlockInfo;
using kvfuse::KVKey;
using kvfuse::RedisKVStore;
using kvfuse::RedisOptions;
using kvfuse_test::entry_value;
using kvfuse_test::random_block;
using kvfuse_test::RedisServer;
using kvfuse_test::same_block;
using kvfuse_test::slice;

namespace {

constexpr std::size_t page = kvfuse::kv_entry_page_bytes;

RedisOptions options_for(const RedisServer& server) {
  RedisOptions o = kvfuse::parse_redis_uri(server.uri());
  o.command_timeout = std::chrono::milliseconds(2000);
  return o;
}

bool has(const std::string& text, std::string_view needle) {
  if (text.find(needle) != std::string::npos) return true;
  MESSAGE("\"" << text << "\" lacks \"" << std::string(needle) << "\"");
  return false;
}

}  // namespace

TEST_CASE("RedisKVStore: round trip, the stored value, get_many, describe + get_range") {
  if (!kvfuse_test::redis_available()) {
    kvfuse_test::skip("redis-server / redis-cli not on PATH");
    return;
  }
  RedisServer server;
  RedisKVStore store(options_for(server));
  auto client = server.client();

  const KVKey a{0x1111, 0xaaaa}, b{0x1111, 0xbbbb}, c{0x1111, 0xcccc}, missing{0x1111, 0xdddd};
  const KVBlock block_a = random_block(1, 3 * page + 1234, 48, 100);  // four pages, the last one short
  const KVBlock block_b = random_block(2, page, 16, 0);               // exactly one page
  const KVBlock block_c{0, {}, 7};                                    // empty payload
  store.put(a, block_a);
  store.put(b, block_b);
  store.put(c, block_c);

  // The value is the entry format byte for byte, under "kvfuse:<model:016x>-<content:016x>", with no expiry.
  CHECK(store.key_name(a) == "kvfuse:0000000000001111-000000000000aaaa");
  CHECK(client.text({"GET", store.key_name(a)}) == entry_value(a, block_a));
  CHECK(client.integer({"PTTL", store.key_name(a)}) == -1);

  CHECK(same_block(store.get(a), block_a));
  CHECK(same_block(store.get(b), block_b));
  CHECK(same_block(store.get(c), block_c));
  CHECK_FALSE(store.get(missing).has_value());
  CHECK(store.contains(a));
  CHECK_FALSE(store.contains(missing));

  const std::vector<KVKey> keys{a, missing, c, b, a};
  const std::vector<std::optional<KVBlock>> many = store.get_many(keys);
  REQUIRE(many.size() == 5);
  CHECK(same_block(many[0], block_a));
  CHECK_FALSE(many[1].has_value());
  CHECK(same_block(many[2], block_c));
  CHECK(same_block(many[3], block_b));
  CHECK(same_block(many[4], block_a));

  const std::optional<KVBlockInfo> info = store.describe(a);
  REQUIRE(info.has_value());
  CHECK(info->num_tokens == 48);
  CHECK(info->first_position == 100);
  CHECK(info->bytes == block_a.bytes.size());
  std::uint64_t stored_checksum = 0;
  const std::string value = entry_value(a, block_a);
  std::memcpy(&stored_checksum, value.data() + kvfuse::kv_entry_checksum_offset, sizeof stored_checksum);
  CHECK(info->version == stored_checksum);
  const std::uint64_t n = block_a.bytes.size();
  for (const auto& range : std::vector<std::pair<std::uint64_t, std::uint64_t>>{
           {0, n}, {0, 1}, {1000, 70000}, {page, page}, {page - 1, 2}, {n - 1234, 1234}, {n - 1, 1}, {5, 0}, {n, 0}}) {
    const std::uint64_t offset = range.first;
    const std::uint64_t size = range.second;
    CAPTURE(offset);
    CAPTURE(size);
    const std::optional<std::vector<std::byte>> got = store.get_range(a, *info, offset, size);
    REQUIRE(got.has_value());
    CHECK(*got == slice(block_a, offset, size));
  }
  const std::optional<KVBlockInfo> empty_info = store.describe(c);
  REQUIRE(empty_info.has_value());
  CHECK(empty_info->bytes == 0);
  CHECK(store.get_range(c, *empty_info, 0, 0) == std::vector<std::byte>{});
  CHECK(kvfuse_test::error_of([&] { (void)store.get_range(a, *info, n - 10, 11); }).find("get_range") !=
        std::string::npos);

  // Nothing counted as rejected or unavailable; every read measured.
  CHECK(store.rejected() == 0);
  CHECK(store.unavailable() == 0);
  const kvfuse::ReadStats stats = store.read_stats();
  CHECK(stats.reads == 4 + 1 + 1 + 9 + 1 + 1);  // gets, get_many, describe, get_ranges, describe, get_range
  CHECK(stats.bytes == static_cast<std::int64_t>(2 * block_a.bytes.size() + 2 * block_b.bytes.size() + 2 * n + 1 +
                                                 70000 + page + 2 + 1234 + 1));
  CHECK(stats.seconds > 0);

  // Replacing and erasing.
  const KVBlock block_a2 = random_block(3, 100, 2, 0);
  store.put(a, block_a2);
  CHECK(same_block(store.get(a), block_a2));
  CHECK(store.erase(a));
  CHECK_FALSE(store.erase(a));
  CHECK_FALSE(store.get(a).has_value());
  CHECK_FALSE(store.describe(a).has_value());
  CHECK_FALSE(store.get_range(a, *info, 0, 10).has_value());
  CHECK(store.rejected() == 0);
  CHECK(store.unavailable() == 0);
}

TEST_CASE("RedisKVStore: contains_many and get_many equal contains and get, each in one round trip") {
  if (!kvfuse_test::redis_available()) {
    kvfuse_test::skip("redis-server / redis-cli not on PATH");
    return;
  }
  RedisServer server;
  RedisKVStore store(options_for(server));
  auto client = server.client();
  // Read events the server has processed (INFO stats): one per round trip of a client, the INFO's own included.
  const auto reads_processed = [&] {
    const std::string info = client.text({"INFO", "stats"});
    const std::string field = "total_reads_processed:";
    const std::size_t at = info.find(field);
    REQUIRE(at != std::string::npos);
    return std::stoll(info.substr(at + field.size()));
  };
  std::vector<KVKey> keys;
  std::vector<KVBlock> blocks;
  for (std::uint64_t i = 0; i < 20; ++i) {
    keys.push_back(KVKey{0x2222, i});
    blocks.push_back(random_block(i, 100 + 50 * i));
    if (i % 3 != 0) store.put(keys.back(), blocks.back());  // every third key absent
  }
  keys.push_back(keys[1]);  // a repeat
  blocks.push_back(blocks[1]);

  long long before = reads_processed();
  const std::vector<bool> held = store.contains_many(keys);
  CHECK(reads_processed() - before <= 2);  // the pipeline and the INFO: not one per key
  before = reads_processed();
  const std::vector<std::optional<KVBlock>> got = store.get_many(keys);
  CHECK(reads_processed() - before <= 2);
  REQUIRE(held.size() == keys.size());
  REQUIRE(got.size() == keys.size());
  for (std::size_t i = 0; i < keys.size(); ++i) {
    CAPTURE(i);
    CHECK(held[i] == store.contains(keys[i]));
    CHECK(held[i] == (i % 3 != 0 || i == 20));
    CHECK(got[i].has_value() == held[i]);
    if (held[i]) CHECK(same_block(got[i], blocks[i]));
  }
  CHECK(store.contains_many(std::vector<KVKey>{}).empty());
  CHECK(store.get_many(std::vector<KVKey>{}).empty());
  CHECK(store.unavailable() == 0);
}

TEST_CASE("RedisKVStore: get_into fills the caller's buffer with the bytes of get_range, and fails where it fails") {
  if (!kvfuse_test::redis_available()) {
    kvfuse_test::skip("redis-server / redis-cli not on PATH");
    return;
  }
  RedisServer server;
  RedisKVStore store(options_for(server));
  const KVKey key{0x3333, 1};
  const KVBlock block = random_block(9, 3 * page + 777);
  store.put(key, block);
  const std::optional<KVBlockInfo> info = store.describe(key);
  REQUIRE(info.has_value());
  const std::uint64_t n = block.bytes.size();
  for (const auto& range : std::vector<std::pair<std::uint64_t, std::uint64_t>>{
           {0, n}, {0, 1}, {page - 3, 6}, {page, 2 * page}, {n - 777, 777}, {n, 0}}) {
    const std::uint64_t offset = range.first;
    const std::uint64_t size = range.second;
    CAPTURE(offset);
    CAPTURE(size);
    std::vector<std::byte> out(static_cast<std::size_t>(size));
    CHECK(store.get_into(key, *info, offset, out));
    CHECK(out == slice(block, offset, size));
    CHECK(store.get_range(key, *info, offset, size) == out);
  }
  std::vector<std::byte> out(10);
  CHECK(kvfuse_test::code_of([&] { (void)store.get_into(key, *info, n - 5, out); }) ==
        kvfuse::Status::invalid_argument);
  store.put(key, random_block(10, 3 * page + 777));  // replaced: another version
  CHECK_FALSE(store.get_into(key, *info, 0, out));
  CHECK_FALSE(store.get_range(key, *info, 0, 10).has_value());
  CHECK(store.rejected() == 0);
  CHECK(store.unavailable() == 0);
}

TEST_CASE("RedisKVStore: works as the slow tier of a TieredKVStore") {
  if (!kvfuse_test::redis_available()) {
    kvfuse_test::skip("redis-server / redis-cli not on PATH");
    return;
  }
  RedisServer server;
  kvfuse::InMemoryKVStore memory;
  RedisKVStore redis(options_for(server));
  kvfuse::TieredKVStore<kvfuse::InMemoryKVStore, RedisKVStore> tiered(memory, redis);
  const KVKey key{7, 8};
  const KVBlock block = random_block(4, 2 * page + 5);
  tiered.put(key, block);
  CHECK(memory.erase(key));
  const std::optional<KVBlockInfo> info = tiered.describe(key);
  REQUIRE(info.has_value());
  CHECK(info->tier == 1);
  CHECK(tiered.get_range(key, *info, page, page + 5) == slice(block, page, page + 5));
  CHECK(same_block(tiered.get(key), block));
  CHECK(memory.contains(key));  // promoted

  // With Redis down, a put still lands in memory: the tier's kvfuse::error is counted, not thrown.
  server.kill();
  const KVKey other{7, 9};
  tiered.put(other, block);
  CHECK(same_block(memory.get(other), block));
  CHECK(tiered.put_failures(1) == 1);
  CHECK(has(tiered.last_put_error(1), "cannot store"));
}

TEST_CASE("RedisKVStore: foreign, other-model, garbage, truncated, old and non-string values are rejected") {
  if (!kvfuse_test::redis_available()) {
    kvfuse_test::skip("redis-server / redis-cli not on PATH");
    return;
  }
  RedisServer server;
  RedisKVStore store(options_for(server));
  auto client = server.client();

  const KVKey key{0x42, 0x1000};
  const KVBlock block = random_block(5, page + 300);
  const std::string good = entry_value(key, block);
  std::string old_version = good;
  old_version[8] = 2;
  struct Case {
    const char* what;
    std::string value;
    const char* reason;
  };
  const std::vector<Case> cases{
      {"another key's entry", entry_value(KVKey{0x42, 0x2000}, block), "foreign entry: content"},
      {"another model's entry", entry_value(KVKey{0x43, 0x1000}, block), "foreign entry: model"},
      {"garbage", std::string(5000, 'x'), "wrong magic"},
      {"a short value", "KVFUSE", "truncated"},
      {"the empty string", "", "truncated"},
      {"a truncated entry", good.substr(0, good.size() - 1), "does not match entry size"},
      {"an entry with a byte appended", good + "!", "does not match entry size"},
      {"format version 2", old_version, "unsupported format version 2"},
  };
  std::int64_t rejected = 0;
  for (const Case& c : cases) {
    CAPTURE(c.what);
    client.ok({"SET", store.key_name(key), c.value});
    CHECK_FALSE(store.get(key).has_value());
    CHECK(store.rejected() == ++rejected);
    CHECK(has(store.last_rejection(), c.reason));
    CHECK(has(store.last_rejection(), store.key_name(key)));
    CHECK(has(store.last_rejection(), server.address()));
    CHECK_FALSE(store.get_many(std::vector<KVKey>{key}).front().has_value());
    CHECK(store.rejected() == ++rejected);
    CHECK_FALSE(store.describe(key).has_value());
    CHECK(store.rejected() == ++rejected);
    CHECK(has(store.last_rejection(), c.reason));
    // Left in place (see the header comment): the value is untouched.
    CHECK(client.text({"GET", store.key_name(key)}) == c.value);
  }
  // A key holding a list.
  CHECK(client.integer({"DEL", store.key_name(key)}) == 1);
  CHECK(client.integer({"RPUSH", store.key_name(key), "x"}) == 1);
  CHECK_FALSE(store.get(key).has_value());
  CHECK(has(store.last_rejection(), "WRONGTYPE"));
  CHECK_FALSE(store.describe(key).has_value());
  CHECK(store.rejected() == rejected + 2);
  CHECK(store.unavailable() == 0);

  // A put replaces a rejected value.
  store.put(key, block);
  CHECK(same_block(store.get(key), block));
}

TEST_CASE("RedisKVStore: one flipped payload byte rejects get and the ranges over its page only") {
  if (!kvfuse_test::redis_available()) {
    kvfuse_test::skip("redis-server / redis-cli not on PATH");
    return;
  }
  RedisServer server;
  RedisKVStore store(options_for(server));
  auto client = server.client();

  const KVKey key{9, 9};
  const KVBlock block = random_block(6, 3 * page + 10);
  store.put(key, block);
  const std::optional<KVBlockInfo> info = store.describe(key);
  REQUIRE(info.has_value());
  const std::uint64_t payload_offset = kvfuse::kv_entry_header_bytes + 4 * 8;
  const std::uint64_t flipped = 2 * page + 77;  // in page 2
  const char damaged = static_cast<char>(static_cast<unsigned char>(block.bytes[flipped]) ^ 0x01);
  CHECK(client.integer({"SETRANGE", store.key_name(key), std::to_string(payload_offset + flipped),
                        std::string(1, damaged)}) > 0);

  CHECK_FALSE(store.get(key).has_value());
  CHECK(store.rejected() == 1);
  CHECK(has(store.last_rejection(), "checksum mismatch in payload page 2"));

  // The header and page table are intact: describe still works, and so do ranges away from page 2.
  const std::optional<KVBlockInfo> again = store.describe(key);
  REQUIRE(again.has_value());
  CHECK(again->version == info->version);
  CHECK(store.get_range(key, *info, 0, 2 * page) == slice(block, 0, 2 * page));
  CHECK(store.get_range(key, *info, 3 * page, 10) == slice(block, 3 * page, 10));
  CHECK(store.rejected() == 1);
  CHECK_FALSE(store.get_range(key, *info, 2 * page + 100, 10).has_value());  // the damaged page, not the byte
  CHECK_FALSE(store.get_range(key, *info, page, 2 * page).has_value());
  CHECK(store.rejected() == 3);
  CHECK(has(store.last_rejection(), "page 2"));

  // A flipped header byte (num_tokens) fails the header checksum.
  store.put(key, block);
  CHECK(client.integer({"SETRANGE", store.key_name(key), "32", std::string(1, '\x7f')}) > 0);
  CHECK_FALSE(store.describe(key).has_value());
  CHECK(has(store.last_rejection(), "header checksum mismatch"));
  CHECK_FALSE(store.get_range(key, *info, 0, 10).has_value());
  CHECK(store.rejected() == 5);
  CHECK(store.unavailable() == 0);
}

TEST_CASE("RedisKVStore: get_range of an entry replaced or erased since describe is a plain miss") {
  if (!kvfuse_test::redis_available()) {
    kvfuse_test::skip("redis-server / redis-cli not on PATH");
    return;
  }
  RedisServer server;
  RedisKVStore store(options_for(server));
  const KVKey key{1, 2};
  const KVBlock first = random_block(7, 2 * page + 9);
  const KVBlock second = random_block(8, 2 * page + 9);  // same size, other bytes: another version
  store.put(key, first);
  const std::optional<KVBlockInfo> info = store.describe(key);
  REQUIRE(info.has_value());
  store.put(key, second);
  CHECK_FALSE(store.get_range(key, *info, 0, 100).has_value());
  CHECK_FALSE(store.get_range(key, *info, page, page + 9).has_value());
  const std::optional<KVBlockInfo> now = store.describe(key);
  REQUIRE(now.has_value());
  CHECK(now->version != info->version);
  CHECK(store.get_range(key, *now, page, page + 9) == slice(second, page, page + 9));
  store.put(key, random_block(9, 10));  // another size
  CHECK_FALSE(store.get_range(key, *now, 0, 10).has_value());
  CHECK(store.erase(key));
  CHECK_FALSE(store.get_range(key, *now, 0, 10).has_value());
  CHECK(store.rejected() == 0);
  CHECK(store.unavailable() == 0);
}

TEST_CASE("RedisKVStore: entries expire after the TTL: a miss, not an error") {
  if (!kvfuse_test::redis_available()) {
    kvfuse_test::skip("redis-server / redis-cli not on PATH");
    return;
  }
  RedisServer server;
  RedisOptions options = options_for(server);
  options.ttl = std::chrono::milliseconds(300);
  RedisKVStore store(options);
  const KVKey key{3, 4};
  const KVBlock block = random_block(10, 1000);
  store.put(key, block);
  const long long pttl = server.client().integer({"PTTL", store.key_name(key)});
  CHECK(pttl > 0);
  CHECK(pttl <= 300);
  CHECK(same_block(store.get(key), block));
  std::this_thread::sleep_for(std::chrono::milliseconds(500));
  CHECK_FALSE(store.get(key).has_value());
  CHECK_FALSE(store.describe(key).has_value());
  CHECK_FALSE(store.contains(key));
  CHECK(store.rejected() == 0);
  CHECK(store.unavailable() == 0);
}

TEST_CASE("RedisKVStore: maxmemory with allkeys-lru evicts entries: misses, no errors") {
  if (!kvfuse_test::redis_available()) {
    kvfuse_test::skip("redis-server / redis-cli not on PATH");
    return;
  }
  RedisServer server({"--maxmemory", "4mb", "--maxmemory-policy", "allkeys-lru"});
  RedisKVStore store(options_for(server));
  std::vector<KVBlock> blocks;
  for (std::uint64_t i = 0; i < 60; ++i) {  // 6 MB into 4 MB
    blocks.push_back(random_block(100 + i, 100000));
    store.put(KVKey{5, i}, blocks.back());
  }
  int hits = 0;
  for (std::uint64_t i = 0; i < 60; ++i) {
    const std::optional<KVBlock> got = store.get(KVKey{5, i});
    if (got) {
      ++hits;
      CHECK(same_block(got, blocks[i]));
    }
  }
  MESSAGE(hits << " of 60 entries survived eviction");
  CHECK(hits > 0);
  CHECK(hits < 60);
  CHECK(store.rejected() == 0);
  CHECK(store.unavailable() == 0);
}

TEST_CASE("RedisKVStore: maxmemory with noeviction: put throws the server's OOM error") {
  if (!kvfuse_test::redis_available()) {
    kvfuse_test::skip("redis-server / redis-cli not on PATH");
    return;
  }
  RedisServer server({"--maxmemory", "3mb", "--maxmemory-policy", "noeviction"});
  RedisKVStore store(options_for(server));
  const KVBlock block = random_block(11, 100000);
  std::string message;
  std::uint64_t stored = 0;
  for (; stored < 100 && message.empty(); ++stored) {
    message = kvfuse_test::error_of([&] { store.put(KVKey{6, stored}, block); });
    if (message == "(no kvfuse::error)") message.clear();
  }
  REQUIRE_FALSE(message.empty());
  CHECK(has(message, "OOM"));
  CHECK(has(message, "cannot store"));
  CHECK(has(message, server.address()));
  CHECK(store.last_error() == message);
  CHECK(same_block(store.get(KVKey{6, 0}), block));  // reads still work
  CHECK(store.unavailable() == 0);
}

TEST_CASE("RedisKVStore: an error reply to a read is a miss, counted") {
  if (!kvfuse_test::redis_available()) {
    kvfuse_test::skip("redis-server / redis-cli not on PATH");
    return;
  }
  RedisServer server({"--rename-command", "GET", ""});  // GET is now an unknown command
  RedisKVStore store(options_for(server));
  const KVKey key{12, 13};
  const KVBlock block = random_block(12, 500);
  store.put(key, block);
  CHECK_FALSE(store.get(key).has_value());
  CHECK(store.unavailable() == 1);
  CHECK(has(store.last_error(), "unknown command"));
  CHECK(has(store.last_error(), server.address()));
  CHECK(store.rejected() == 0);
  const std::optional<KVBlockInfo> info = store.describe(key);  // GETRANGE still works
  REQUIRE(info.has_value());
  CHECK(store.get_range(key, *info, 0, 500) == block.bytes);
}

TEST_CASE("parse_redis_uri and RedisOptions: accepted forms and clear errors") {
  const RedisOptions single = kvfuse::parse_redis_uri("redis://10.0.0.5:6380");
  CHECK_FALSE(single.cluster);
  REQUIRE(single.nodes.size() == 1);
  CHECK(single.nodes[0] == kvfuse::RedisEndpoint{"10.0.0.5", 6380});
  const RedisOptions cluster = kvfuse::parse_redis_uri("redis-cluster://a.example:7000,[::1]:7001,b:7002");
  CHECK(cluster.cluster);
  REQUIRE(cluster.nodes.size() == 3);
  CHECK(cluster.nodes[0] == kvfuse::RedisEndpoint{"a.example", 7000});
  CHECK(cluster.nodes[1] == kvfuse::RedisEndpoint{"::1", 7001});
  CHECK(cluster.nodes[2] == kvfuse::RedisEndpoint{"b", 7002});
  CHECK(kvfuse::parse_redis_uri("redis-cluster://h:1").nodes.size() == 1);

  for (const auto& bad : std::vector<std::pair<std::string, std::string>>{
           {"http://h:6379", "'http://h:6379' is not a Redis URI"},
           {"h:6379", "'h:6379' is not a Redis URI"},
           {"redis://", "node '' is not HOST:PORT"},
           {"redis://host", "node 'host' is not HOST:PORT"},
           {"redis://:6379", "invalid host ''"},
           {"redis://host:0", "port '0'"},
           {"redis://host:65536", "port '65536'"},
           {"redis://host:12x", "port '12x'"},
           {"redis://host:", "port ''"},
           {"redis://host:6379/0", "port '6379/0'"},
           {"redis://user@host:6379", "invalid host 'user@host'"},
           {"redis://a:1,b:2", "names 2 nodes"},
           {"redis-cluster://a:1,", "node '' is not HOST:PORT"},
           {"redis-cluster://[::1:7000", "not HOST:PORT"},
       }) {
    const std::string& uri = bad.first;
    const std::string& needle = bad.second;
    CAPTURE(uri);
    const std::string message = kvfuse_test::error_of([&] { (void)kvfuse::parse_redis_uri(uri); });
    CHECK(has(message, needle));
    CHECK(has(message, uri));
  }

  RedisOptions bad;
  bad.command_timeout = std::chrono::milliseconds(0);
  CHECK(has(kvfuse_test::error_of([&] { RedisKVStore s(bad); }), "command_timeout = 0 ms"));
  bad = {};
  bad.nodes.push_back({"h", 1});
  CHECK(has(kvfuse_test::error_of([&] { RedisKVStore s(bad); }), "2 nodes given for a single server"));
  bad = {};
  bad.reconnect_max = std::chrono::milliseconds(10);
  CHECK(has(kvfuse_test::error_of([&] { RedisKVStore s(bad); }), "reconnect_max = 10 ms"));
  bad = {};
  bad.nodes[0].port = 70000;
  CHECK(has(kvfuse_test::error_of([&] { RedisKVStore s(bad); }), "port 70000"));
  bad = {};
  bad.ttl = std::chrono::milliseconds(-1);
  CHECK(has(kvfuse_test::error_of([&] { RedisKVStore s(bad); }), "ttl = -1 ms"));
}

TEST_CASE("redis_key_slot: CRC16-XMODEM mod 16384 with hash tags") {
  CHECK(kvfuse::redis_key_slot("123456789") == (0x31C3 & 16383));  // the XMODEM check value
  CHECK(kvfuse::redis_key_slot("foo") == 12182);
  CHECK(kvfuse::redis_key_slot("{user1000}.following") == kvfuse::redis_key_slot("user1000"));
  CHECK(kvfuse::redis_key_slot("a{user1000}b{x}") == kvfuse::redis_key_slot("user1000"));
  CHECK(kvfuse::redis_key_slot("foo{}{bar}") != kvfuse::redis_key_slot("bar"));  // empty tag: the whole key
  CHECK(kvfuse::redis_key_slot("foo{bar") == kvfuse::redis_key_slot(std::string_view("foo{bar")));
  CHECK(kvfuse::redis_key_slot("") == 0);
}

}  // namespace store_redis_store
