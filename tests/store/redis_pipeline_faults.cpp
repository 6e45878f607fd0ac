// Redis failing under FusionPipeline, at the request level: a request served from a store that includes
// RedisKVStore (alone, or as the far tier of TieredKVStore<InMemoryKVStore, DiskKVStore, RedisKVStore>) while the
// server is killed between requests or during the layer-pipelined load, paused past the command timeout mid-load,
// holds damaged or foreign values, is a Redis Cluster that loses a node, or restarts empty. Each request must
// complete (nothing escapes run()), its logits must equal exactly those of the same request on a healthy store that
// holds the same caches, and nothing wrong may be used: what the store could not deliver intact is recomputed
// (rejected_entries, the plan's sources, the store's rejected() / unavailable()). A missing isolated chunk cache is
// recomputed bit for bit (CacheBlend, Epic's AttnLink), so those logits do not change; CacheBlend at r = 1
// recomputes every row on every layer and must equal full prefill.
#include <doctest/doctest.h>

#include <array>
#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <functional>
#include <map>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <thread>
#include <type_traits>
#include <utility>
#include <vector>

#include "kvfuse/backend/disk_kv_store.hpp"
#include "kvfuse/backend/in_memory_store.hpp"
#include "kvfuse/backend/redis_kv_store.hpp"
#include "kvfuse/backend/tiered_kv_store.hpp"
#include "kvfuse/cpu.hpp"
#include "kvfuse/fusion/fusion_pipeline.hpp"

#include "support/fusion_prompts.hpp"
#include "support/model_path.hpp"
#include "support/redis_server.hpp"
#include "support/small_llama.hpp"
#include "support/test_util.hpp"

// Each store test file lives in its own namespace: the files are compiled together (a unity build).
namespace store_redis_pipeline_faults {

using namespace kvfuse;
using kvfuse_test::Prompt;
using kvfuse_test::RedisServer;
using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

namespace {

using Tiered = TieredKVStore<InMemoryKVStore, DiskKVStore, RedisKVStore>;

// [system, A, B, C, query]: four cached chunks, so four entries read per layer.
const Prompt& request() {
  using namespace kvfuse_test;
  static const Prompt p = assemble({kSystem, kA, kB, kC}, kQuery);
  return p;
}
constexpr std::size_t kChunks = 4;
constexpr unsigned kAll = (1u << kChunks) - 1;

const std::vector<std::string>& methods() {
  static const std::vector<std::string> m{"cacheblend", "attnlink", "cacheblend@1"};
  return m;
}

const CpuLlama& model() {
  static const CpuLlama m = kvfuse_test::small_llama(5);
  return m;
}

std::span<const token_id> chunk(std::size_t j) {
  const TokenRange r = request().layout.chunks[j].range;
  return std::span<const token_id>(request().tokens).subspan(static_cast<std::size_t>(r.begin),
                                                             static_cast<std::size_t>(r.size()));
}

KVKey key_of(std::size_t j) {
  CpuLlamaFusion engine(model());
  InMemoryKVStore none;
  return FusionPipeline(engine, none).isolated_key(chunk(j));
}

// Logits of `method` on a healthy in-memory store holding the isolated caches of the chunks in `cached` (a bit per
// chunk). Memoized: the references are computed once.
const std::vector<float>& reference(const std::string& method, unsigned cached) {
  static std::map<std::pair<std::string, unsigned>, std::vector<float>> memo;
  auto it = memo.find({method, cached});
  if (it != memo.end()) return it->second;
  InMemoryKVStore store;
  CpuLlamaFusion engine(model());
  FusionPipeline pipeline(engine, store);
  const Prompt& p = request();
  pipeline.store_chunk_caches(p.tokens, p.layout);
  for (std::size_t j = 0; j < kChunks; ++j)
    if ((cached >> j & 1u) == 0) store.erase(pipeline.isolated_key(chunk(j)));
  return memo[{method, cached}] = pipeline.run(p.tokens, p.layout, parse_method(method)).logits;
}

const std::vector<float>& full_prefill() { return reference("full", 0); }

RedisOptions options_for(const std::string& uri, milliseconds command_timeout = milliseconds(1000)) {
  RedisOptions o = parse_redis_uri(uri);
  o.connect_timeout = milliseconds(500);
  o.command_timeout = command_timeout;
  o.reconnect_initial = milliseconds(100);
  o.reconnect_max = milliseconds(400);
  return o;
}

// A RangedKVStore forwarding to `inner` that runs `fault` once, just before ranged read number `at` (get_into, which
// get_range calls; 0-based, counted from arm()): on the pipeline's I/O thread, in the middle of a layer-pipelined load.
template <RangedKVStore Inner>
class FaultAt {
 public:
  explicit FaultAt(Inner& inner) : inner_(&inner) {}

  void arm(std::int64_t at, std::function<void()> fault) {
    at_ = at;
    fault_ = std::move(fault);
    reads_ = 0;
  }
  [[nodiscard]] std::int64_t reads() const { return reads_.load(); }

  [[nodiscard]] bool contains(const KVKey& key) const { return inner_->contains(key); }
  [[nodiscard]] std::vector<bool> contains_many(std::span<const KVKey> keys) const {
    return inner_->contains_many(keys);
  }
  [[nodiscard]] std::optional<KVBlock> get(const KVKey& key) { return inner_->get(key); }
  [[nodiscard]] std::vector<std::optional<KVBlock>> get_many(std::span<const KVKey> keys) {
    return inner_->get_many(keys);
  }
  void put(const KVKey& key, KVBlock block) { inner_->put(key, std::move(block)); }
  bool erase(const KVKey& key) { return inner_->erase(key); }
  [[nodiscard]] std::optional<KVBlockInfo> describe(const KVKey& key) { return inner_->describe(key); }
  [[nodiscard]] bool get_into(const KVKey& key, const KVBlockInfo& info, std::uint64_t offset,
                              std::span<std::byte> out) {
    if (reads_.fetch_add(1) == at_ && fault_) fault_();
    return inner_->get_into(key, info, offset, out);
  }
  [[nodiscard]] std::optional<std::vector<std::byte>> get_range(const KVKey& key, const KVBlockInfo& info,
                                                                std::uint64_t offset, std::uint64_t size) {
    return kvfuse::detail::get_range_by_get_into(*this, "FaultAt", key, info, offset, size);
  }

 private:
  Inner* inner_;
  std::int64_t at_ = -1;
  std::function<void()> fault_;
  std::atomic<std::int64_t> reads_{0};
};

// How the request's store reaches Redis.
enum class Far { alone, tiered };
std::string name_of(Far f) { return f == Far::alone ? "RedisKVStore" : "TieredKVStore<memory, disk, redis>"; }

// Calls body(store, tiered) with the store a pipeline serves from: FaultAt over `redis` alone, or over a tiered
// store of another host (empty memory and disk tiers in a temp dir: only Redis holds the caches); tiered is null
// for Redis alone.
template <class Body>
void with_store(Far far, RedisKVStore& redis, Body&& body) {
  if (far == Far::alone) {
    FaultAt<RedisKVStore> store(redis);
    body(store, static_cast<Tiered*>(nullptr));
  } else {
    kvfuse_test::TempDir dir;
    InMemoryKVStore memory;
    DiskKVStore disk(dir.path);
    Tiered tiered(memory, disk, redis);
    FaultAt<Tiered> store(tiered);
    body(store, &tiered);
  }
}

template <class Store>
using Pipeline = FusionPipeline<CpuLlamaFusion, Store>;

// The request by `method`; an exception that escapes run() fails the check and yields an empty result.
template <class Store>
FusionResult serve(Pipeline<Store>& pipeline, const std::string& method) {
  const Prompt& p = request();
  try {
    return pipeline.run(p.tokens, p.layout, parse_method(method));
  } catch (const std::exception& e) {
    FAIL_CHECK("run() threw: " << std::string(e.what()));
  }
  return {};
}

// The logits expected of `method` when the chunks in `cached` load: CacheBlend at r = 1 is full prefill whatever
// is cached.
void check_logits(const FusionResult& r, const std::string& method, unsigned cached) {
  CHECK(r.logits == reference(method, cached));
  if (method == "cacheblend@1") CHECK(r.logits == full_prefill());
}

// Every chunk in `cached` planned from its isolated cache at position 0, every other one computed.
void check_sources(const FusionResult& r, unsigned cached) {
  REQUIRE(r.plan.chunks.size() == kChunks);
  for (std::size_t j = 0; j < kChunks; ++j) {
    CAPTURE(j);
    CHECK(r.plan.chunks[j].source == ((cached >> j & 1u) != 0 ? KVSource::isolated : KVSource::compute));
    if ((cached >> j & 1u) != 0) CHECK(r.plan.chunks[j].stored_first_position == 0);
  }
}

// The caches of the request stored in Redis by another host (a pipeline over Redis alone).
void store_caches(RedisKVStore& redis) {
  CpuLlamaFusion engine(model());
  Pipeline<RedisKVStore> pipeline(engine, redis);
  pipeline.store_chunk_caches(request().tokens, request().layout);
}

bool has(const std::string& text, std::string_view needle) {
  if (text.find(needle) != std::string::npos) return true;
  MESSAGE("\"" << text << "\" lacks \"" << std::string(needle) << "\"");
  return false;
}

double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

#define KVFUSE_NEEDS_REDIS()                                  \
  if (!kvfuse_test::redis_available()) {                      \
    kvfuse_test::skip("redis-server / redis-cli not on PATH"); \
    return;                                                   \
  }

}  // namespace

TEST_CASE("Redis killed between requests: the next requests plan without it and complete; puts are absorbed") {
  KVFUSE_NEEDS_REDIS();
  const Prompt& p = request();

  SUBCASE("RedisKVStore alone") {
    RedisServer server;
    RedisKVStore redis(options_for(server.uri()));
    CpuLlamaFusion engine(model());
    Pipeline<RedisKVStore> pipeline(engine, redis);
    CHECK(pipeline.store_chunk_caches(p.tokens, p.layout) == static_cast<std::int64_t>(kChunks));
    for (const std::string& m : methods()) {  // healthy: every chunk loaded from Redis
      CAPTURE(m);
      const FusionResult r = serve(pipeline, m);
      check_logits(r, m, kAll);
      check_sources(r, kAll);
      CHECK(r.rejected_entries == 0);
      CHECK(r.load.layerwise);
    }
    server.kill();
    for (const std::string& m : methods()) {  // the caches are gone: every chunk computed, nothing rejected
      CAPTURE(m);
      const FusionResult r = serve(pipeline, m);
      check_logits(r, m, 0);
      check_sources(r, 0);
      CHECK(r.rejected_entries == 0);
    }
    CHECK(redis.unavailable() >= 1);
    CHECK(redis.rejected() == 0);
    // Putting caches offline is where a dead server shows: the store's put throws (documented), the pipeline's does.
    CHECK_THROWS_AS(pipeline.store_chunk_caches(p.tokens, p.layout), kvfuse::error);
  }

  SUBCASE("far tier of TieredKVStore: the host that stored the caches keeps serving them from memory") {
    RedisServer server;
    RedisKVStore redis(options_for(server.uri()));
    kvfuse_test::TempDir dir;
    InMemoryKVStore memory;
    DiskKVStore disk(dir.path);
    Tiered tiered(memory, disk, redis);
    CpuLlamaFusion engine(model());
    Pipeline<Tiered> pipeline(engine, tiered);
    pipeline.store_chunk_caches(p.tokens, p.layout);
    server.kill();
    for (const std::string& m : methods()) {
      CAPTURE(m);
      const FusionResult r = serve(pipeline, m);
      check_logits(r, m, kAll);
      check_sources(r, kAll);
      CHECK(r.rejected_entries == 0);
    }
    CHECK(tiered.put_failures(2) == 0);
  }

  SUBCASE("far tier of TieredKVStore: another host computes, its puts land in memory and disk") {
    RedisServer server;
    RedisKVStore redis(options_for(server.uri()));
    store_caches(redis);
    server.kill();
    with_store(Far::tiered, redis, [&](auto& store, Tiered* tiered) {
      CpuLlamaFusion engine(model());
      Pipeline<std::remove_cvref_t<decltype(store)>> pipeline(engine, store);
      for (const std::string& m : methods()) {
        CAPTURE(m);
        const FusionResult r = serve(pipeline, m);
        check_logits(r, m, 0);
        check_sources(r, 0);
      }
      CHECK_NOTHROW(pipeline.store_chunk_caches(p.tokens, p.layout));  // Redis's failures absorbed
      CHECK(tiered->put_failures(2) == static_cast<std::int64_t>(kChunks));
      CHECK(tiered->put_failures(0) == 0);
      CHECK(tiered->put_failures(1) == 0);
      for (const std::string& m : methods()) {  // now served from this host's memory
        CAPTURE(m);
        const FusionResult r = serve(pipeline, m);
        check_logits(r, m, kAll);
        check_sources(r, kAll);
        CHECK(r.rejected_entries == 0);
      }
    });
    CHECK(redis.rejected() == 0);
  }
}

TEST_CASE("Redis killed during the layer-pipelined load: the chunks read from then on are recomputed, same logits") {
  KVFUSE_NEEDS_REDIS();
  // Read `at` of the request: 4 entries a layer, so 8 is layer 2's first read (a kill between layer loads) and 9
  // its second (a kill within a layer, after chunk 0's rows of layer 2 arrived).
  for (const Far far : {Far::alone, Far::tiered}) {
    for (const std::int64_t at : {std::int64_t{8}, std::int64_t{9}}) {
      for (const std::string& m : methods()) {
        CAPTURE(name_of(far));
        CAPTURE(at);
        CAPTURE(m);
        RedisServer server;
        RedisKVStore redis(options_for(server.uri()));
        store_caches(redis);
        with_store(far, redis, [&](auto& store, Tiered* tiered) {
          CpuLlamaFusion engine(model());
          Pipeline<std::remove_cvref_t<decltype(store)>> pipeline(engine, store);
          store.arm(at, [&server] { server.kill(); });
          const FusionResult r = serve(pipeline, m);
          CHECK(store.reads() > at);
          check_logits(r, m, kAll);
          check_sources(r, kAll);  // recomputed isolated caches: still isolated, at position 0
          CHECK(r.load.layerwise);
          CHECK(r.load.restarts >= 1);
          CHECK(r.rejected_entries >= 1);
          CHECK(static_cast<std::int64_t>(r.load.failures.size()) == r.rejected_entries);
          CHECK(r.time.chunk_compute_ms > 0.0);
          CHECK(redis.unavailable() >= 1);
          CHECK(redis.rejected() == 0);  // a dead server is a miss, not a damaged value
          if (tiered == nullptr) {
            // Put back to a dead server: recorded, the request goes on.
            CHECK(static_cast<std::int64_t>(r.put_failures.size()) == r.rejected_entries);
            for (const std::string& why : r.put_failures) CHECK(has(why, "cannot store"));
          } else {
            CHECK(r.put_failures.empty());  // TieredKVStore kept them in memory and disk
            CHECK(tiered->put_failures(2) == r.rejected_entries);
            CHECK(tiered->put_failures(0) == 0);
          }
        });
      }
    }
  }
}

TEST_CASE("Redis paused (SIGSTOP) past the command timeout during the load: bounded, same logits, then recovery") {
  KVFUSE_NEEDS_REDIS();
  for (const Far far : {Far::alone, Far::tiered}) {
    for (const std::string& m : methods()) {
      CAPTURE(name_of(far));
      CAPTURE(m);
      RedisServer server;
      RedisKVStore redis(options_for(server.uri(), milliseconds(200)));
      store_caches(redis);
      with_store(far, redis, [&](auto& store, Tiered* tiered) {
        CpuLlamaFusion engine(model());
        LoadConfig load;
        load.layer_timeout_ms = 200;
        Pipeline<std::remove_cvref_t<decltype(store)>> pipeline(engine, store, VariantCacheConfig{}, load);
        store.arm(9, [&server] { server.pause(); });
        const auto t0 = Clock::now();
        const FusionResult r = serve(pipeline, m);
        const double took = seconds_since(t0);
        server.resume();
        MESSAGE(name_of(far) << ", " << m << ": the request took " << took << " s with the server stopped");
        CHECK(took < 10.0);
        check_logits(r, m, kAll);
        check_sources(r, kAll);
        CHECK(r.load.restarts >= 1);
        CHECK(r.rejected_entries >= 1);
        CHECK(redis.unavailable() >= 1);
        CHECK(redis.rejected() == 0);
        if (tiered != nullptr) CHECK(r.put_failures.empty());

        // After SIGCONT and the backoff, Redis serves the caches again: a request without rejections.
        std::this_thread::sleep_for(milliseconds(500));
        pipeline.set_load_config({});
        const FusionResult again = serve(pipeline, m);
        check_logits(again, m, kAll);
        check_sources(again, kAll);
        CHECK(again.rejected_entries == 0);
      });
    }
  }
}

TEST_CASE("damaged or foreign values in Redis: rejected, recomputed and put back, same logits") {
  KVFUSE_NEEDS_REDIS();
  const Prompt& p = request();
  // The value of chunk A (chunk 1) is replaced before the request; `value` is its valid value, `other_key` chunk
  // B's, `other_model` chunk A's entry of another model.
  struct Damage {
    const char* what;
    std::function<std::string(const std::string& value, const std::string& other_key, const std::string& other_model)>
        make;
    bool mid_load;  // passes describe (header and page table intact): caught by get_range's page check
  };
  const std::vector<Damage> damages{
      {"garbage", [](const std::string& v, auto&, auto&) { return std::string(v.size(), '\x5a'); }, false},
      {"truncated", [](const std::string& v, auto&, auto&) { return v.substr(0, v.size() / 2); }, false},
      {"another model's entry", [](auto&, auto&, const std::string& m) { return m; }, false},
      {"another key's entry", [](auto&, const std::string& k, auto&) { return k; }, false},
      {"a flipped payload byte", [](const std::string& v, auto&, auto&) {
         std::string d = v;
         d[d.size() - 10] = static_cast<char>(d[d.size() - 10] ^ 0x01);
         return d;
       }, true},
  };

  RedisServer server;
  kvfuse_test::RedisClient client = server.client();
  RedisKVStore redis(options_for(server.uri()));
  store_caches(redis);
  std::string other_model;
  {  // another model's caches of the same chunks, under its own keys
    const CpuLlama other = kvfuse_test::small_llama(6);
    CpuLlamaFusion engine(other);
    Pipeline<RedisKVStore> pipeline(engine, redis);
    pipeline.store_chunk_caches(p.tokens, p.layout);
    CHECK(engine.model_fingerprint() != CpuLlamaFusion(model()).model_fingerprint());
    other_model = client.text({"GET", redis.key_name(pipeline.isolated_key(chunk(1)))});
  }
  const std::string name = redis.key_name(key_of(1));
  const std::string value = client.text({"GET", name});
  const std::string other_key = client.text({"GET", redis.key_name(key_of(2))});
  REQUIRE(value.size() > 100);
  REQUIRE(other_model.size() == value.size());

  for (const Far far : {Far::alone, Far::tiered}) {
    for (const Damage& d : damages) {
      for (const std::string& m : methods()) {
        CAPTURE(name_of(far));
        CAPTURE(d.what);
        CAPTURE(m);
        client.ok({"SET", name, d.make(value, other_key, other_model)});
        const std::int64_t rejected_before = redis.rejected();
        with_store(far, redis, [&](auto& store, Tiered* tiered) {
          CpuLlamaFusion engine(model());
          Pipeline<std::remove_cvref_t<decltype(store)>> pipeline(engine, store);
          const FusionResult r = serve(pipeline, m);
          check_logits(r, m, kAll);
          check_sources(r, kAll);
          CHECK(r.rejected_entries == 1);
          CHECK(r.put_failures.empty());
          CHECK(r.load.restarts == (d.mid_load ? 1 : 0));
          CHECK(redis.rejected() == rejected_before + 1);
          CHECK(has(redis.last_rejection(), name));
          CHECK(client.text({"GET", name}) == value);  // put back: the recomputed cache replaced the damage
          if (tiered != nullptr) CHECK(tiered->put_failures(2) == 0);
          const FusionResult again = serve(pipeline, m);
          check_logits(again, m, kAll);
          CHECK(again.rejected_entries == 0);
        });
      }
    }
  }
  CHECK(redis.unavailable() == 0);
}

TEST_CASE("Redis Cluster: a node killed during the load, then between requests: same logits") {
  KVFUSE_NEEDS_REDIS();
  kvfuse_test::RedisCluster cluster;
  RedisKVStore redis(options_for(cluster.uri()));
  store_caches(redis);
  std::array<std::size_t, kChunks> owner{};
  for (std::size_t j = 0; j < kChunks; ++j) owner[j] = cluster.owner(redis_key_slot(redis.key_name(key_of(j))));
  // The node of chunk A (chunk 1) is killed at chunk A's read of layer 1, with the request under way.
  const std::size_t dead = owner[1];
  unsigned alive = 0;
  for (std::size_t j = 0; j < kChunks; ++j)
    if (owner[j] != dead) alive |= 1u << j;
  MESSAGE("chunks on the killed node: mask " << (kAll & ~alive));

  FaultAt<RedisKVStore> store(redis);
  CpuLlamaFusion engine(model());
  Pipeline<FaultAt<RedisKVStore>> pipeline(engine, store);
  for (const std::string& m : methods()) {
    CAPTURE(m);
    const FusionResult r = serve(pipeline, m);
    check_logits(r, m, kAll);
    CHECK(r.rejected_entries == 0);
  }
  store.arm(5, [&cluster, dead] { cluster.node(dead).kill(); });
  {
    const FusionResult r = serve(pipeline, "cacheblend");
    CHECK(store.reads() > 5);
    check_logits(r, "cacheblend", kAll);
    check_sources(r, kAll);
    CHECK(r.load.restarts >= 1);
    CHECK(r.rejected_entries >= 1);
    CHECK(static_cast<std::int64_t>(r.put_failures.size()) == r.rejected_entries);  // the dead node's chunks
    CHECK(redis.rejected() == 0);
  }
  // The node stays down: its chunks are planned as compute, the other nodes' are loaded.
  for (const std::string& m : methods()) {
    CAPTURE(m);
    const FusionResult r = serve(pipeline, m);
    check_logits(r, m, alive);
    check_sources(r, alive);
    CHECK(r.rejected_entries == 0);
  }
  CHECK(redis.unavailable() >= 1);
  CHECK(redis.rejected() == 0);
}

TEST_CASE("Redis restarted empty after a kill: the store reconnects after the backoff and requests hit again") {
  KVFUSE_NEEDS_REDIS();
  const Prompt& p = request();
  RedisServer server;
  RedisKVStore redis(options_for(server.uri()));
  CpuLlamaFusion engine(model());
  Pipeline<RedisKVStore> pipeline(engine, redis);
  pipeline.store_chunk_caches(p.tokens, p.layout);
  CHECK(serve(pipeline, "cacheblend").rejected_entries == 0);

  server.kill();
  check_logits(serve(pipeline, "cacheblend"), "cacheblend", 0);
  server.restart();
  // Offline puts fail until the backoff (at most reconnect_max, 400 ms) lets the store reconnect.
  const auto deadline = Clock::now() + std::chrono::seconds(5);
  int attempts = 0;
  bool stored = false;
  while (!stored && Clock::now() < deadline) {
    ++attempts;
    try {
      (void)pipeline.store_chunk_caches(p.tokens, p.layout);
      stored = true;
    } catch (const kvfuse::error&) {
      std::this_thread::sleep_for(milliseconds(50));
    }
  }
  MESSAGE("caches stored again after " << attempts << " attempt(s)");
  REQUIRE(stored);
  CHECK(server.client().integer({"DBSIZE"}) == static_cast<long long>(kChunks));
  const std::int64_t unavailable = redis.unavailable();
  const std::int64_t reads = redis.read_stats().reads;
  for (const std::string& m : methods()) {
    CAPTURE(m);
    const FusionResult r = serve(pipeline, m);
    check_logits(r, m, kAll);
    check_sources(r, kAll);
    CHECK(r.rejected_entries == 0);
    CHECK(r.load.layerwise);
  }
  CHECK(redis.read_stats().reads > reads);
  CHECK(redis.unavailable() == unavailable);
  CHECK(redis.rejected() == 0);
}

#undef KVFUSE_NEEDS_REDIS

}  // namespace store_redis_pipeline_faults
