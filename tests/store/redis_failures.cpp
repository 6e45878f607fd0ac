// RedisKVStore when the server fails: killed (reads miss at once, puts and erases throw, no reconnection before the
// backoff expires, recovery after a restart), stopped with SIGSTOP past the command timeout (a bounded miss, recovery
// after SIGCONT), and never started (connection refused); put and erase then throw Status::store_unavailable.
#include <doctest/doctest.h>

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "kvfuse/backend/redis_kv_store.hpp"

#include "support/error_of.hpp"
#include "support/model_path.hpp"
#include "support/redis_server.hpp"

// Each store test file lives in its own namespace: the files are compiled together (a unity build).
namespace store_redis_failures {

using kvfuse::KVBlock;
using kvfuse::KVKey;
using kvfuse::RedisKVStore;
using kvfuse::RedisOptions;
using kvfuse_test::random_block;
using kvfuse_test::RedisServer;
using kvfuse_test::same_block;
using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

namespace {

double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

bool has(const std::string& text, std::string_view needle) {
  if (text.find(needle) != std::string::npos) return true;
  MESSAGE("\"" << text << "\" lacks \"" << std::string(needle) << "\"");
  return false;
}

}  // namespace

TEST_CASE("RedisKVStore: a killed server: misses and throws at once, waits out the backoff, recovers after restart") {
  if (!kvfuse_test::redis_available()) {
    kvfuse_test::skip("redis-server / redis-cli not on PATH");
    return;
  }
  RedisServer server;
  RedisOptions options = kvfuse::parse_redis_uri(server.uri());
  options.connect_timeout = milliseconds(500);
  options.command_timeout = milliseconds(500);
  options.reconnect_initial = milliseconds(1500);
  options.reconnect_max = milliseconds(3000);
  RedisKVStore store(options);
  const KVKey key{1, 1};
  const KVBlock block = random_block(1, 70000);
  store.put(key, block);
  REQUIRE(same_block(store.get(key), block));

  server.kill();
  const auto failed_at = Clock::now();
  CHECK_FALSE(store.get(key).has_value());  // the connection breaks: a miss
  CHECK(seconds_since(failed_at) < 1.0);  // no wait for a dead server (bounds loose for TSan on a busy machine)
  CHECK(store.unavailable() == 1);
  CHECK(has(store.last_error(), "get"));
  CHECK(has(store.last_error(), server.address()));

  // Within the backoff nothing touches the network: immediate misses and throws.
  auto t0 = Clock::now();
  CHECK_FALSE(store.contains(key));
  CHECK_FALSE(store.describe(key).has_value());
  CHECK_FALSE(store.get_many(std::vector<KVKey>{key, KVKey{1, 2}})[0].has_value());
  CHECK(store.unavailable() == 5);
  CHECK(has(store.last_error(), "not retried for another"));
  const std::string put_error = kvfuse_test::error_of([&] { store.put(key, block); });
  CHECK(has(put_error, "cannot store"));
  CHECK(has(put_error, store.key_name(key)));
  CHECK(has(put_error, server.address()));
  CHECK(has(kvfuse_test::error_of([&] { (void)store.erase(key); }), "cannot erase"));
  CHECK(seconds_since(t0) < 1.0);  // well inside the 1.5 s backoff

  // Even with the server back, the store waits for the backoff to expire before reconnecting.
  server.restart();
  REQUIRE(seconds_since(failed_at) < 1.2);  // restarting took well under the 1.5 s backoff
  CHECK_FALSE(store.get(key).has_value());
  CHECK(has(store.last_error(), "not retried for another"));
  std::this_thread::sleep_until(failed_at + milliseconds(1600));
  CHECK_FALSE(store.get(key).has_value());  // reconnected: the restarted server is empty (no persistence)
  const std::int64_t misses = store.unavailable();
  store.put(key, block);
  CHECK(same_block(store.get(key), block));
  CHECK(store.unavailable() == misses);
  CHECK(store.rejected() == 0);
}

TEST_CASE("RedisKVStore: a stopped server (SIGSTOP): a miss within the command timeout, recovery after SIGCONT") {
  if (!kvfuse_test::redis_available()) {
    kvfuse_test::skip("redis-server / redis-cli not on PATH");
    return;
  }
  RedisServer server;
  RedisOptions options = kvfuse::parse_redis_uri(server.uri());
  options.command_timeout = milliseconds(300);
  options.reconnect_initial = milliseconds(100);
  options.reconnect_max = milliseconds(400);
  RedisKVStore store(options);
  const KVKey key{2, 2};
  const KVBlock block = random_block(2, 3 * 65536);
  store.put(key, block);
  const std::optional<kvfuse::KVBlockInfo> info = store.describe(key);
  REQUIRE(info.has_value());

  server.pause();
  auto t0 = Clock::now();
  CHECK_FALSE(store.get(key).has_value());
  const double waited = seconds_since(t0);
  MESSAGE("get against a stopped server returned after " << waited << " s (command timeout 0.3 s)");
  CHECK(waited >= 0.25);
  CHECK(waited < 1.5);
  CHECK(has(store.last_error(), "no reply within the command timeout (300 ms)"));

  // After the backoff a reconnection succeeds (the kernel accepts) and times out again: bounded the same way.
  std::this_thread::sleep_for(milliseconds(150));
  t0 = Clock::now();
  CHECK_FALSE(store.get_range(key, *info, 0, 100).has_value());
  CHECK(seconds_since(t0) < 1.5);
  t0 = Clock::now();
  CHECK(has(kvfuse_test::error_of([&] { store.put(KVKey{2, 3}, block); }), "cannot store"));
  CHECK(seconds_since(t0) < 1.5);
  CHECK(store.unavailable() == 2);

  server.resume();
  bool recovered = false;
  const auto deadline = Clock::now() + std::chrono::seconds(5);
  while (!recovered && Clock::now() < deadline) {
    recovered = same_block(store.get(key), block);
    if (!recovered) std::this_thread::sleep_for(milliseconds(50));
  }
  CHECK(recovered);
  CHECK(store.get_range(key, *info, 65536, 10) == kvfuse_test::slice(block, 65536, 10));
  store.put(KVKey{2, 3}, block);
  CHECK(same_block(store.get(KVKey{2, 3}), block));
  CHECK(store.rejected() == 0);
}

TEST_CASE("RedisKVStore: no server at all: constructing works, reads miss, puts throw 'Connection refused'") {
  if (!kvfuse_test::redis_available()) {
    kvfuse_test::skip("redis-server / redis-cli not on PATH");
    return;
  }
  const int port = kvfuse_test::free_loopback_port(false);
  RedisKVStore store(fmt::format("redis://127.0.0.1:{}", port));
  const auto t0 = Clock::now();
  CHECK_FALSE(store.get(KVKey{3, 3}).has_value());
  CHECK(has(store.last_error(), "Connection refused"));
  CHECK(has(store.last_error(), fmt::format("127.0.0.1:{}", port)));
  const std::string message = kvfuse_test::error_of([&] { store.put(KVKey{3, 3}, random_block(3, 10)); });
  CHECK(has(message, "cannot store"));
  CHECK(has(message, "Connection refused"));  // the backoff's message keeps the first failure's reason
  CHECK(seconds_since(t0) < 1.0);
  CHECK(store.unavailable() == 1);
}

TEST_CASE("RedisKVStore: put and erase throw Status::store_unavailable for a server killed, stopped or refusing; "
          "batched reads miss") {
  if (!kvfuse_test::redis_available()) {
    kvfuse_test::skip("redis-server / redis-cli not on PATH");
    return;
  }
  using kvfuse::Status;
  using kvfuse_test::code_of;
  const KVKey key{4, 4};
  const KVBlock block = random_block(4, 1000);
  const std::vector<KVKey> keys{key, KVKey{4, 5}};
  const auto check_down = [&](RedisKVStore& store) {
    CHECK(code_of([&] { store.put(key, block); }) == Status::store_unavailable);
    CHECK(code_of([&] { (void)store.erase(key); }) == Status::store_unavailable);
    const std::int64_t misses = store.unavailable();
    CHECK(store.contains_many(keys) == std::vector<bool>{false, false});
    const std::vector<std::optional<KVBlock>> got = store.get_many(keys);
    CHECK((!got[0].has_value() && !got[1].has_value()));
    CHECK(store.unavailable() == misses + 4);  // each key of each batch, as the single-key calls count
  };
  SUBCASE("killed") {
    RedisServer server;
    RedisOptions options = kvfuse::parse_redis_uri(server.uri());
    options.reconnect_initial = milliseconds(100);
    RedisKVStore store(options);
    store.put(key, block);
    server.kill();
    check_down(store);
  }
  SUBCASE("stopped past the command timeout") {
    RedisServer server;
    RedisOptions options = kvfuse::parse_redis_uri(server.uri());
    options.command_timeout = milliseconds(200);
    RedisKVStore store(options);
    store.put(key, block);
    server.pause();
    CHECK(code_of([&] { store.put(key, block); }) == Status::store_unavailable);
    CHECK(has(store.last_error(), "no reply within the command timeout"));
    check_down(store);
    server.resume();
  }
  SUBCASE("refusing connections") {
    RedisKVStore store(fmt::format("redis://127.0.0.1:{}", kvfuse_test::free_loopback_port(false)));
    check_down(store);
  }
  SUBCASE("a bad block is a bad argument, whatever the server") {
    RedisKVStore store(fmt::format("redis://127.0.0.1:{}", kvfuse_test::free_loopback_port(false)));
    CHECK(code_of([&] { store.put(key, KVBlock{-1, {}, 0}); }) == Status::invalid_argument);
  }
}

}  // namespace store_redis_failures
