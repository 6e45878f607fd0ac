// TieredKVStore: a get that misses the fast tier, reads a slower one and then promotes must not put back a key
// that an erase removed while the read was under way (FusionPipeline::record_context erases the KV of evicted
// Cache-Craft variants and relies on it staying gone).
#include <doctest/doctest.h>

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <thread>
#include <vector>

#include "kvfuse/backend/disk_kv_store.hpp"
#include "kvfuse/backend/in_memory_store.hpp"
#include "kvfuse/backend/throttled_kv_store.hpp"
#include "kvfuse/backend/tiered_kv_store.hpp"

#include "../support/test_util.hpp"

// Each store test file lives in its own namespace: the files are compiled together (a unity build).
namespace store_tiered_promotion_race {

using namespace kvfuse;

namespace {

KVBlock block_for(const KVKey& key) {
  KVBlock b;
  b.num_tokens = 4;
  b.first_position = 0;
  b.bytes.resize(256);
  for (std::size_t i = 0; i < b.bytes.size(); ++i) b.bytes[i] = static_cast<std::byte>((key.content * 31 + i) & 0xff);
  return b;
}

// `trials` times: the key only in the slowest tier (fast copy dropped), four threads getting it in a loop while one
// erases it through the tiered store. Returns how many trials ended with the key back in some tier.
template <class Tiered, class Fast, class Slow>
int resurrections(Tiered& tiered, Fast& fast, Slow& slow, int trials) {
  int back = 0;
  for (int t = 0; t < trials; ++t) {
    const KVKey key{0x7, static_cast<std::uint64_t>(t)};
    const KVBlock block = block_for(key);
    tiered.put(key, block);
    fast.erase(key);  // only the slow tier has it: every get reads it there and promotes
    std::atomic<bool> erased{false};
    std::atomic<int> started{0};
    std::atomic<int> wrong{0};
    std::vector<std::thread> getters;
    for (int g = 0; g < 4; ++g) {
      getters.emplace_back([&] {
        started.fetch_add(1);
        while (!erased.load()) {
          const std::optional<KVBlock> got = tiered.get(key);
          if (got && got->bytes != block.bytes) wrong.fetch_add(1);
        }
      });
    }
    while (started.load() < 4) std::this_thread::yield();
    std::this_thread::sleep_for(std::chrono::microseconds(200 + 37 * (t % 11)));
    CHECK(tiered.erase(key));
    erased = true;
    for (std::thread& g : getters) g.join();
    CHECK(wrong.load() == 0);
    if (fast.contains(key) || slow.contains(key) || tiered.get(key).has_value()) ++back;
  }
  return back;
}

}  // namespace

TEST_CASE("an erase racing promoting gets: the key never comes back (memory over a remote link)") {
  InMemoryKVStore memory;
  InMemoryKVStore far;
  ThrottledKVStore remote(far, {/*megabytes_per_s=*/0.0, /*latency_ms=*/0.3});  // a read takes >= 0.3 ms
  TieredKVStore tiered(memory, remote);
  CHECK(resurrections(tiered, memory, far, 150) == 0);
}

TEST_CASE("an erase racing promoting gets: the key never comes back (memory over disk)") {
  kvfuse_test::TempDir tmp;
  InMemoryKVStore memory;
  DiskKVStore disk(tmp.path);
  TieredKVStore tiered(memory, disk);
  CHECK(resurrections(tiered, memory, disk, 150) == 0);
}

}  // namespace store_tiered_promotion_race
