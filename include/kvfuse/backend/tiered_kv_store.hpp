#pragma once
// TieredKVStore: two KVStores used as one, a fast tier (memory) in front of a slow one (disk).
//
// When to use it: a chunk cache that serves hot entries from DRAM and keeps every entry on disk, e.g.
// TieredKVStore<InMemoryKVStore, DiskKVStore>. It holds references; both stores must outlive it.
//   get:      the fast tier; on a miss the slow tier, and a slow hit is copied into the fast tier (promotion).
//   put:      into both. When the slow tier's put throws kvfuse::error (disk full, directory gone), the block
//             stays in the fast tier, the failure is counted and kept (slow_put_failures(), last_slow_error())
//             and put does not throw: losing the disk copy must not lose the request.
//   contains: either tier.
//   erase:    both tiers; true if either had the key.
// Nothing is evicted here: bound the fast tier by erasing from it directly.
//
// Thread safety: as safe as the two stores (one reader plus one writer thread for the kvfuse models). A
// promotion racing a put of the same key may leave the fast tier with the slow tier's older block; keys are
// content hashes, so both blocks hold the same KV.

#include <cstdint>
#include <mutex>
#include <optional>
#include <string>
#include <utility>

#include "kvfuse/backend/concepts.hpp"
#include "kvfuse/backend/disk_kv_store.hpp"
#include "kvfuse/backend/in_memory_store.hpp"
#include "kvfuse/core/error.hpp"
#include "kvfuse/core/types.hpp"

namespace kvfuse {

template <KVStore Fast, KVStore Slow>
class TieredKVStore {
 public:
  TieredKVStore(Fast& fast, Slow& slow) noexcept : fast_(fast), slow_(slow) {}

  [[nodiscard]] bool contains(const KVKey& key) const { return fast_.contains(key) || slow_.contains(key); }

  [[nodiscard]] std::optional<KVBlock> get(const KVKey& key) {
    if (std::optional<KVBlock> block = fast_.get(key)) return block;
    std::optional<KVBlock> block = slow_.get(key);
    if (block) fast_.put(key, *block);
    return block;
  }

  void put(const KVKey& key, KVBlock block) {
    fast_.put(key, block);
    try {
      slow_.put(key, std::move(block));
    } catch (const error& e) {
      std::lock_guard lock(mutex_);
      ++slow_put_failures_;
      last_slow_error_ = e.what();
    }
  }

  bool erase(const KVKey& key) {
    const bool in_fast = fast_.erase(key);
    const bool in_slow = slow_.erase(key);
    return in_fast || in_slow;
  }

  // How many slow-tier puts failed (the block was kept in the fast tier only), and the last failure's message.
  [[nodiscard]] std::int64_t slow_put_failures() const {
    std::lock_guard lock(mutex_);
    return slow_put_failures_;
  }
  [[nodiscard]] std::string last_slow_error() const {
    std::lock_guard lock(mutex_);
    return last_slow_error_;
  }

 private:
  Fast& fast_;
  Slow& slow_;
  mutable std::mutex mutex_;  // guards the failure record
  std::int64_t slow_put_failures_ = 0;
  std::string last_slow_error_;
};

static_assert(KVStore<TieredKVStore<InMemoryKVStore, DiskKVStore>>);

}  // namespace kvfuse
