// TieredKVStore (memory over disk) under 64 threads of get / get_many / put (into either tier) / erase / describe /
// get_range on shared keys.
// Keys are content hashes in real use: here every key has one fixed content, so any hit must be exactly it.
#include <doctest/doctest.h>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "kvfuse/backend/disk_kv_store.hpp"
#include "kvfuse/backend/in_memory_store.hpp"
#include "kvfuse/backend/tiered_kv_store.hpp"

#include "../support/test_util.hpp"

// Each store test file lives in its own namespace: the files are compiled together (a unity build).
namespace store_concurrency_tiered_store {

using namespace kvfuse;

namespace {

constexpr int kThreads = 64;
constexpr int kKeys = 12;

KVKey key_of(int k) { return {0x5eed, 0x1000u + static_cast<std::uint64_t>(k)}; }

// The one content of key k: sizes differ per key, bytes depend on key and offset.
KVBlock content_of(int k) {
  KVBlock b;
  b.num_tokens = 3 + k;
  b.first_position = 7 * k;
  b.bytes.resize(static_cast<std::size_t>(1000 + 517 * k));
  for (std::size_t i = 0; i < b.bytes.size(); ++i) b.bytes[i] = static_cast<std::byte>((i * 131 + static_cast<std::size_t>(k) * 17) >> 2);
  return b;
}

struct Counts {
  std::atomic<std::int64_t> hits{0};
  std::atomic<std::int64_t> range_hits{0};
  std::atomic<std::int64_t> wrong{0};
  std::atomic<std::int64_t> thrown{0};
};

// kThreads threads, each `ops` random operations; a write-back store also gets a thread that flushes.
void hammer(TieredKVStore<InMemoryKVStore, DiskKVStore>& tiered, int ops, Counts& counts, std::string& first_error) {
  std::vector<KVBlock> contents;
  for (int k = 0; k < kKeys; ++k) contents.push_back(content_of(k));
  std::atomic<int> done{0};
  std::mutex error_mutex;
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      std::mt19937 rng(static_cast<std::uint32_t>(1234 + t));
      for (int i = 0; i < ops; ++i) {
        const int k = static_cast<int>(rng() % kKeys);
        const KVKey key = key_of(k);
        const KVBlock& want = contents[static_cast<std::size_t>(k)];
        try {
          switch (rng() % 8) {
            case 0:
              tiered.put(key, want);
              break;
            case 1:  // the loading controller's choice: memory and disk, or disk only
              tiered.put(key, want, rng() % 2);
              break;
            case 2:
              (void)tiered.erase(key);
              break;
            case 3: {
              if (i % 2 == 0) {
                (void)tiered.contains(key);
                break;
              }
              const int other = (k + 1) % kKeys;
              const std::vector<KVKey> both{key, key_of(other)};
              (void)tiered.contains_many(both);
              const std::vector<std::optional<KVBlock>> got = tiered.get_many(both);
              for (std::size_t j = 0; j < got.size(); ++j) {
                if (!got[j]) continue;
                ++counts.hits;
                if (got[j]->bytes != contents[static_cast<std::size_t>(j == 0 ? k : other)].bytes) ++counts.wrong;
              }
              break;
            }
            case 4:
            case 5: {
              const std::optional<KVBlock> got = tiered.get(key);
              if (!got) break;
              ++counts.hits;
              if (got->bytes != want.bytes || got->num_tokens != want.num_tokens ||
                  got->first_position != want.first_position)
                ++counts.wrong;
              break;
            }
            default: {
              const std::optional<KVBlockInfo> info = tiered.describe(key);
              if (!info) break;
              if (info->bytes != want.bytes.size() || info->num_tokens != want.num_tokens ||
                  info->first_position != want.first_position || info->tier > 1) {
                ++counts.wrong;
                break;
              }
              const std::uint64_t offset = rng() % info->bytes;
              const std::uint64_t size = rng() % (info->bytes - offset + 1);
              const std::optional<std::vector<std::byte>> range = tiered.get_range(key, *info, offset, size);
              if (!range) break;  // erased or replaced since describe
              ++counts.range_hits;
              if (*range != std::vector<std::byte>(want.bytes.begin() + static_cast<std::ptrdiff_t>(offset),
                                                   want.bytes.begin() + static_cast<std::ptrdiff_t>(offset + size)))
                ++counts.wrong;
            }
          }
        } catch (const std::exception& e) {
          ++counts.thrown;
          std::lock_guard lock(error_mutex);
          if (first_error.empty()) first_error = e.what();
        }
      }
      ++done;
    });
  }
  std::thread flusher([&] {
    while (done.load() < kThreads) (void)tiered.flush();
  });
  for (std::thread& t : threads) t.join();
  flusher.join();
}

void check_all_equal_content(TieredKVStore<InMemoryKVStore, DiskKVStore>& tiered, InMemoryKVStore& memory,
                             DiskKVStore& disk) {
  for (int k = 0; k < kKeys; ++k) {
    const KVBlock want = content_of(k);
    for (const std::optional<KVBlock>& got : {tiered.get(key_of(k)), memory.get(key_of(k)), disk.get(key_of(k))}) {
      if (got) CHECK(got->bytes == want.bytes);
    }
  }
}

}  // namespace

TEST_CASE("64 threads on one write-through TieredKVStore: every hit is exactly the key's content, nothing throws") {
  kvfuse_test::TempDir tmp;
  InMemoryKVStore memory;
  DiskKVStore disk(tmp.path);
  TieredKVStore tiered(memory, disk);
  Counts counts;
  std::string error;
  hammer(tiered, 150, counts, error);
  CHECK_MESSAGE(counts.thrown.load() == 0, error);
  CHECK(counts.wrong.load() == 0);
  CHECK(counts.hits.load() > 0);
  CHECK(counts.range_hits.load() > 0);
  CHECK(tiered.put_failures(0) == 0);
  CHECK(tiered.put_failures(1) == 0);
  CHECK(disk.rejected() == 0);
  check_all_equal_content(tiered, memory, disk);
  // Erasing through the store leaves nothing behind in any tier.
  for (int k = 0; k < kKeys; ++k) (void)tiered.erase(key_of(k));
  CHECK(memory.size() == 0);
  for (int k = 0; k < kKeys; ++k) CHECK_FALSE(disk.contains(key_of(k)));
}

TEST_CASE("64 threads on one write-back TieredKVStore with a flushing thread: the same, and a final flush fills disk") {
  kvfuse_test::TempDir tmp;
  InMemoryKVStore memory;
  DiskKVStore disk(tmp.path);
  TieredConfig config;
  config.write = WritePolicy::write_back;
  TieredKVStore tiered(config, memory, disk);
  Counts counts;
  std::string error;
  hammer(tiered, 150, counts, error);
  CHECK_MESSAGE(counts.thrown.load() == 0, error);
  CHECK(counts.wrong.load() == 0);
  CHECK(counts.hits.load() > 0);
  CHECK(disk.rejected() == 0);
  check_all_equal_content(tiered, memory, disk);
  for (int k = 0; k < kKeys; ++k) tiered.put(key_of(k), content_of(k));
  (void)tiered.flush();
  CHECK(tiered.pending_writes() == 0);
  for (int k = 0; k < kKeys; ++k) {
    const std::optional<KVBlock> on_disk = disk.get(key_of(k));
    REQUIRE(on_disk.has_value());
    CHECK(on_disk->bytes == content_of(k).bytes);
  }
}

}  // namespace store_concurrency_tiered_store
