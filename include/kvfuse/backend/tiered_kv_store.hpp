#pragma once
// TieredKVStore: two KVStores used as one, a fast tier (memory) in front of a slow one (disk).
//
// When to use it: a chunk cache that serves hot entries from DRAM and keeps every entry on disk, e.g.
// TieredKVStore<InMemoryKVStore, DiskKVStore>. It holds references; both stores must outlive it.
//   get:      the fast tier; on a miss the slow tier, and a slow hit is copied into the fast tier (promotion).
//   describe / get_range (RangedKVStore, when both tiers are): from the tier describe found the entry in
//             (KVBlockInfo::tier: 0 fast, 1 slow). Ranged reads do not promote: a layer-pipelined load reads
//             the slow tier each time until a whole get promotes the entry.
//   put:      into both (placement 0), or into the slow tier only (placement 1, set_placement: where CacheBlend
//             §5.1's loading controller says the slow tier does not delay the first token). When the slow
//             tier's put throws kvfuse::error (disk full, directory gone), the block is put in the fast tier,
//             the failure is counted and kept (slow_put_failures(), last_slow_error()) and put does not throw:
//             losing the disk copy must not lose the request.
//   contains: either tier.
//   erase:    both tiers; true if either had the key.
// Nothing is evicted here: bound the fast tier by erasing from it directly.
//
// Each tier's reads are measured (tier_stats), and tier_devices() describes the tiers as the loading controller
// sees them: their cost per GB (TierCosts, given) and their measured read throughput.
//
// Thread safety: as safe as the two stores (one reader plus one writer thread for the kvfuse models). A
// promotion racing a put of the same key may leave the fast tier with the slow tier's older block; keys are
// content hashes, so both blocks hold the same KV.

#include <array>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <mutex>
#include <optional>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "kvfuse/backend/concepts.hpp"
#include "kvfuse/backend/disk_kv_store.hpp"
#include "kvfuse/backend/in_memory_store.hpp"
#include "kvfuse/core/error.hpp"
#include "kvfuse/core/types.hpp"
#include "kvfuse/schedule/loading_controller.hpp"

namespace kvfuse {

// The cost of keeping a GB in each tier (CacheBlend §5.1's C_store), in any unit: only their order matters to
// LoadingController::choose_device. Default: memory ten times the disk.
struct TierCosts {
  double fast_per_gb = 1.0;
  double slow_per_gb = 0.1;
};

// Two tiers exactly: a tiered store inside another would have its tier tags (KVBlockInfo::tier) overwritten.
template <KVStore Fast, KVStore Slow>
  requires(!MeasuredTierStore<Fast> && !MeasuredTierStore<Slow>)
class TieredKVStore {
 public:
  TieredKVStore(Fast& fast, Slow& slow, TierCosts costs = {}) noexcept : fast_(fast), slow_(slow), costs_(costs) {}

  [[nodiscard]] bool contains(const KVKey& key) const { return fast_.contains(key) || slow_.contains(key); }

  [[nodiscard]] std::optional<KVBlock> get(const KVKey& key) {
    if (std::optional<KVBlock> block = timed(0, [&] { return fast_.get(key); })) return block;
    std::optional<KVBlock> block = timed(1, [&] { return slow_.get(key); });
    if (block) fast_.put(key, *block);
    return block;
  }

  [[nodiscard]] std::optional<KVBlockInfo> describe(const KVKey& key)
    requires RangedKVStore<Fast> && RangedKVStore<Slow>
  {
    if (std::optional<KVBlockInfo> info = timed(0, [&] { return fast_.describe(key); })) {
      info->tier = 0;
      return info;
    }
    std::optional<KVBlockInfo> info = timed(1, [&] { return slow_.describe(key); });
    if (info) info->tier = 1;
    return info;
  }

  [[nodiscard]] std::optional<std::vector<std::byte>> get_range(const KVKey& key, const KVBlockInfo& info,
                                                                std::uint64_t offset, std::uint64_t size)
    requires RangedKVStore<Fast> && RangedKVStore<Slow>
  {
    detail::require(info.tier <= 1, "TieredKVStore::get_range: tier {} of a two-tier store", info.tier);
    if (info.tier == 0) return timed(0, [&] { return fast_.get_range(key, info, offset, size); });
    return timed(1, [&] { return slow_.get_range(key, info, offset, size); });
  }

  void put(const KVKey& key, KVBlock block) {
    const bool slow_only = placement() == 1;
    if (!slow_only) fast_.put(key, block);
    try {
      slow_.put(key, slow_only ? block : std::move(block));
    } catch (const error& e) {
      if (slow_only) fast_.put(key, std::move(block));
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

  // Reads served by tier 0 (fast) or 1 (slow), measured.
  [[nodiscard]] ReadStats tier_stats(std::size_t tier) const {
    detail::require(tier <= 1, "TieredKVStore::tier_stats: tier {} of a two-tier store", tier);
    std::lock_guard lock(mutex_);
    return stats_[tier];
  }

  // MeasuredTierStore: the tiers, fastest first, with their cost per GB and measured read throughput (0 while a
  // tier has delivered no byte).
  [[nodiscard]] std::vector<StorageDevice> tier_devices() const {
    std::lock_guard lock(mutex_);
    return {{"fast", costs_.fast_per_gb, stats_[0].bytes_per_s(), 0.0},
            {"slow", costs_.slow_per_gb, stats_[1].bytes_per_s(), 0.0}};
  }

  // MeasuredTierStore: new entries go to tier `tier` and the slower ones (0: both tiers, 1: the slow one only).
  void set_placement(std::size_t tier) {
    detail::require(tier <= 1, "TieredKVStore::set_placement: tier {} of a two-tier store", tier);
    std::lock_guard lock(mutex_);
    placement_ = tier;
  }
  [[nodiscard]] std::size_t placement() const {
    std::lock_guard lock(mutex_);
    return placement_;
  }

 private:
  template <class Read>
  auto timed(std::size_t tier, Read&& read) {
    const auto t0 = std::chrono::steady_clock::now();
    auto result = read();
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    std::int64_t bytes = 0;
    if constexpr (std::is_same_v<decltype(result), std::optional<KVBlock>>) {
      if (result) bytes = static_cast<std::int64_t>(result->bytes.size());
    } else if constexpr (std::is_same_v<decltype(result), std::optional<std::vector<std::byte>>>) {
      if (result) bytes = static_cast<std::int64_t>(result->size());
    }
    std::lock_guard lock(mutex_);
    stats_[tier].add(bytes, seconds);
    return result;
  }

  Fast& fast_;
  Slow& slow_;
  TierCosts costs_;
  mutable std::mutex mutex_;  // guards the failure record, the statistics and the placement
  std::int64_t slow_put_failures_ = 0;
  std::string last_slow_error_;
  std::array<ReadStats, 2> stats_{};
  std::size_t placement_ = 0;
};

static_assert(RangedKVStore<TieredKVStore<InMemoryKVStore, DiskKVStore>>);
static_assert(MeasuredTierStore<TieredKVStore<InMemoryKVStore, DiskKVStore>>);

}  // namespace kvfuse
