// VariantCache (Cache-Craft section 3.3) is internally synchronized: 32 threads inserting, looking up and erasing
// variants of shared chunks keep it consistent (never over N × M, every admission, eviction and erase accounted).
#include <doctest/doctest.h>

#include <atomic>
#include <cstdint>
#include <numeric>
#include <random>
#include <set>
#include <thread>
#include <utility>
#include <vector>

#include "kvfuse/cache/variant_cache.hpp"

// Each store test file lives in its own namespace: the files are compiled together (a unity build).
namespace store_concurrency_variant_cache {

using namespace kvfuse;

TEST_CASE("32 threads on one VariantCache: consistent counts, never over capacity, unique KV keys") {
  VariantCacheConfig config;
  config.num_chunks = 3;
  config.variants_per_chunk = 2;  // N × M = 6 for 8 chunks × 4 prefixes: evictions all the time
  VariantCache cache(config);
  std::atomic<std::int64_t> inserted{0};
  std::atomic<std::int64_t> evicted{0};
  std::atomic<std::int64_t> erased{0};
  std::atomic<std::int64_t> over_capacity{0};
  std::atomic<std::int64_t> thrown{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 32; ++t) {
    threads.emplace_back([&, t] {
      std::mt19937 rng(static_cast<std::uint32_t>(t + 1));
      for (int i = 0; i < 300; ++i) {
        const std::uint64_t chunk = rng() % 8;
        const std::uint64_t before = 100 + rng() % 4;  // the one chunk of its stored prefix
        try {
          switch (rng() % 4) {
            case 0:
            case 1: {
              ChunkProfile p;
              p.chunk_id = chunk;
              p.size = 6;
              p.stored_prefix = {before};
              p.prefix_inter = {1.0};
              p.cci = 0.25 + 0.1 * static_cast<double>(before - 100);
              p.token_ranking.resize(6);
              std::iota(p.token_ranking.begin(), p.token_ranking.end(), std::int64_t{0});
              const VariantInsertResult r = cache.insert(std::move(p), KVKey{1, chunk * 16 + before});
              inserted += r.inserted ? 1 : 0;
              evicted += static_cast<std::int64_t>(r.evicted.size());
              break;
            }
            case 2: {
              const std::vector<std::uint64_t> prefix{100 + rng() % 4};
              if (const std::optional<VariantMatch> m = cache.lookup(chunk, prefix, {1.0}))
                erased += (rng() % 2 == 0 && cache.erase(m->variant_id)) ? 1 : 0;
              break;
            }
            default:
              if (cache.size() > cache.capacity() || static_cast<std::int64_t>(cache.entries().size()) > cache.capacity())
                ++over_capacity;
          }
        } catch (const std::exception&) {
          ++thrown;
        }
      }
    });
  }
  for (std::thread& t : threads) t.join();
  CHECK(thrown.load() == 0);
  CHECK(over_capacity.load() == 0);
  CHECK(evicted.load() > 0);
  const std::vector<VariantEntry> entries = cache.entries();
  CHECK(static_cast<std::int64_t>(entries.size()) == cache.size());
  CHECK(cache.size() == inserted.load() - evicted.load() - erased.load());
  std::set<std::uint64_t> keys;
  for (const VariantEntry& v : entries) keys.insert(v.kv.content);
  CHECK(keys.size() == entries.size());
}

}  // namespace store_concurrency_variant_cache
