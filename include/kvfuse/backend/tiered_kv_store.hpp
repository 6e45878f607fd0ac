#pragma once
// TieredKVStore: any number of KVStores used as one, fastest first (memory → disk → remote).
//
// When to use it: a chunk cache that serves hot entries from DRAM and keeps every entry on disk or on a shared
// server, e.g. TieredKVStore<InMemoryKVStore, DiskKVStore> or TieredKVStore<InMemoryKVStore, DiskKVStore,
// RedisKVStore>. It holds references; the tiers must outlive it.
//   get:      the first tier that has the key; a hit in tier i is copied into the faster tiers 0 .. i−1
//             (promotion). A promotion is dropped when a put or erase of the key (or of another key of its lock
//             stripe) ran since the get began, so an erase that returned stays an erase (FusionPipeline erases the
//             KV of evicted Cache-Craft variants) and a put is never overwritten by an older read.
//   get_many: get of each key, each tier asked once (its get_many) for the keys no faster tier had, the hits promoted
//             as get's are.
//   describe / get_into / get_range (RangedKVStore, when every tier is): from the tier describe found the entry in
//             (KVBlockInfo::tier). Ranged reads do not promote: a layer-pipelined load reads the slower tier each
//             time until a whole get promotes the entry.
//   put:      into tier p, an argument of the put (put(key, block, p); put(key, block) is p = 0: FusionPipeline
//             passes where CacheBlend §5.1's loading controller says a tier does not delay the first token) and the
//             slower ones, by the write policy (TieredConfig::write); never into the faster ones:
//               write_through  tiers p .. N−1, synchronously.
//               write_back     tier p synchronously; tiers p+1 .. N−1 by flush() (the destructor flushes too). The
//                              pending block is held here until then; a later put or erase of the key replaces or
//                              cancels it. Losing the process before a flush loses only the slower copies.
//             A tier's put that throws kvfuse::error (disk full, directory gone, server down) is counted and kept per
//             tier (put_failures, last_put_error; slow_put_failures, last_slow_error over every tier but the first) and
//             put does not throw: losing a copy must not lose the request.
//             When no tier that should hold the block took it, the faster tiers are tried, p−1 down to 0.
//   contains: any tier. contains_many: likewise, each tier asked once (its contains_many) for the keys still missing.
//   erase:    every tier, and the pending write; true if any tier had the key. A tier's erase that throws
//             kvfuse::error (server down) is counted and kept (erase_failures, last_erase_error) and erase does not
//             throw: the copy it could not remove is unreferenced KV under a content key, never wrong for that key.
// Nothing is evicted here: bound a tier by erasing from it directly.
//
// Each tier's reads are measured (tier_stats), and tier_devices() describes the tiers as the loading controller
// sees them: their name and cost per GB (TierSpec, given) and their measured read throughput.
//
// Thread safety: safe for any number of concurrent threads, on distinct and the same keys, when the tiers are (every
// kvfuse store is). Writes of one key are serialized: puts, erases, promotions and flushes of a key hold one of
// kStripes locks (chosen by the key's hash) while they write, so they never interleave tier by tier; reads take
// no lock, and a promotion checks the stripe's write count under it. A flush holds each stripe's lock while it
// writes that stripe's pending blocks into the slower tiers.

#include <array>
#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <tuple>
#include <type_traits>
#include <unordered_map>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include "kvfuse/backend/concepts.hpp"
#include "kvfuse/backend/disk_kv_store.hpp"
#include "kvfuse/backend/in_memory_store.hpp"
#include "kvfuse/core/error.hpp"
#include "kvfuse/core/types.hpp"

namespace kvfuse {

// When put() writes the tiers slower than the tier it was given.
enum class WritePolicy {
  write_through,  // synchronously, in put()
  write_back,     // in flush()
};

// One tier as the loading controller sees it.
struct TierSpec {
  std::string name;
  double cost_per_gb = 0.0;  // CacheBlend §5.1's C_store of a GB in this tier, any unit: only the order matters
};

struct TieredConfig {
  // One per tier, fastest first. Empty: "tier0", "tier1", ..., each tier a tenth of the cost of the one before it
  // (1, 0.1, 0.01, ...).
  std::vector<TierSpec> tiers;
  WritePolicy write = WritePolicy::write_through;

  void validate(std::size_t num_tiers) const {
    detail::require(tiers.empty() || tiers.size() == num_tiers, "TieredConfig: {} tier specs for a {}-tier store",
                    tiers.size(), num_tiers);
    for (std::size_t i = 0; i < tiers.size(); ++i) {
      detail::require(!tiers[i].name.empty(), "TieredConfig: tier {} has no name", i);
      detail::require_finite_nonneg(tiers[i].cost_per_gb, fmt::format("TieredConfig: tier '{}' cost_per_gb", tiers[i].name));
    }
  }
};

// At least two tiers, none of them tiered: a tiered store inside another would have its tier tags
// (KVBlockInfo::tier) overwritten.
template <KVStore... Tiers>
  requires(sizeof...(Tiers) >= 2 && (!MeasuredTierStore<Tiers> && ...))
class TieredKVStore {
 public:
  static constexpr std::size_t kTiers = sizeof...(Tiers);
  static constexpr std::size_t kStripes = 64;  // locks that serialize the writes of one key

  TieredKVStore(Tiers&... tiers) : TieredKVStore(TieredConfig{}, tiers...) {}
  TieredKVStore(TieredConfig config, Tiers&... tiers) : tiers_(tiers...), config_(std::move(config)) {
    config_.validate(kTiers);
    if (config_.tiers.empty()) {
      double cost = 1.0;
      for (std::size_t i = 0; i < kTiers; ++i, cost /= 10) config_.tiers.push_back({fmt::format("tier{}", i), cost});
    }
  }
  TieredKVStore(const TieredKVStore&) = delete;
  TieredKVStore& operator=(const TieredKVStore&) = delete;
  ~TieredKVStore() { flush(); }

  [[nodiscard]] const TieredConfig& config() const noexcept { return config_; }

  [[nodiscard]] bool contains(const KVKey& key) const {
    for (std::size_t i = 0; i < kTiers; ++i)
      if (on_tier(i, [&](auto& tier) { return static_cast<bool>(tier.contains(key)); })) return true;
    return false;
  }

  [[nodiscard]] std::vector<bool> contains_many(std::span<const KVKey> keys) const {
    std::vector<bool> out(keys.size(), false);
    const auto ask = [&](std::size_t t, std::span<const KVKey> missing) {
      return on_tier(t, [&](auto& tier) { return tier.contains_many(missing); });
    };
    each_tier_once(keys, ask, [&](std::size_t i, std::size_t, bool) { out[i] = true; });
    return out;
  }

  [[nodiscard]] std::optional<KVBlock> get(const KVKey& key) {
    const std::uint64_t writes = stripe_of(key).writes.load(std::memory_order_acquire);
    for (std::size_t i = 0; i < kTiers; ++i) {
      std::optional<KVBlock> block = timed(i, [&](auto& tier) { return tier.get(key); });
      if (!block) continue;
      if (i > 0) promote(key, *block, i, writes);
      return block;
    }
    return std::nullopt;
  }

  [[nodiscard]] std::vector<std::optional<KVBlock>> get_many(std::span<const KVKey> keys) {
    std::vector<std::uint64_t> writes(keys.size());
    for (std::size_t i = 0; i < keys.size(); ++i)
      writes[i] = stripe_of(keys[i]).writes.load(std::memory_order_acquire);
    std::vector<std::optional<KVBlock>> out(keys.size());
    const auto ask = [&](std::size_t t, std::span<const KVKey> missing) {
      return timed(t, [&](auto& tier) { return tier.get_many(missing); });
    };
    each_tier_once(keys, ask, [&](std::size_t i, std::size_t t, std::optional<KVBlock>&& block) {
      if (t > 0) promote(keys[i], *block, t, writes[i]);
      out[i] = std::move(block);
    });
    return out;
  }

  [[nodiscard]] std::optional<KVBlockInfo> describe(const KVKey& key)
    requires(RangedKVStore<Tiers> && ...)
  {
    for (std::size_t i = 0; i < kTiers; ++i) {
      if (std::optional<KVBlockInfo> info = timed(i, [&](auto& tier) { return tier.describe(key); })) {
        info->tier = static_cast<std::uint32_t>(i);
        return info;
      }
    }
    return std::nullopt;
  }

  [[nodiscard]] bool get_into(const KVKey& key, const KVBlockInfo& info, std::uint64_t offset, std::span<std::byte> out)
    requires(RangedKVStore<Tiers> && ...)
  {
    detail::require(info.tier < kTiers, "TieredKVStore::get_into: tier {} of a {}-tier store", info.tier, kTiers);
    return timed(info.tier, [&](auto& tier) { return tier.get_into(key, info, offset, out); }, out.size());
  }
  [[nodiscard]] std::optional<std::vector<std::byte>> get_range(const KVKey& key, const KVBlockInfo& info,
                                                                std::uint64_t offset, std::uint64_t size)
    requires(RangedKVStore<Tiers> && ...)
  {
    return detail::get_range_by_get_into(*this, "TieredKVStore", key, info, offset, size);
  }

  // Into tier 0 and, by the write policy, every slower one.
  void put(const KVKey& key, KVBlock block) { put(key, std::move(block), 0); }

  // MeasuredTierStore: into tier `tier` and, by the write policy, the slower ones (see the header comment).
  void put(const KVKey& key, KVBlock block, std::size_t tier) {
    check_tier(tier, "put");
    const bool back = config_.write == WritePolicy::write_back;
    Write write(stripe_of(key));
    write.stripe.pending.erase(key);
    const std::size_t last = back ? tier : kTiers - 1;
    bool stored = false;
    for (std::size_t t = tier; t <= last; ++t) stored = put_into(t, key, block) || stored;
    for (std::size_t t = tier; !stored && t-- > 0;) stored = put_into(t, key, block);
    if (back && tier + 1 < kTiers) write.stripe.pending.insert_or_assign(key, Pending{std::move(block), tier + 1});
  }

  bool erase(const KVKey& key) {
    Write write(stripe_of(key));
    write.stripe.pending.erase(key);
    bool erased = false;
    for (std::size_t t = 0; t < kTiers; ++t) {
      try {
        erased = on_tier(t, [&](auto& tier) { return static_cast<bool>(tier.erase(key)); }) || erased;
      } catch (const error& e) {
        std::lock_guard lock(mutex_);
        ++erase_failures_[t];
        last_erase_error_[t] = e.what();
      }
    }
    return erased;
  }

  // write_back: writes every pending block into the tiers slower than the one it was placed in. Returns how many
  // blocks it wrote (their failed tier puts are counted as put's are). Safe to call from a thread of its own.
  std::int64_t flush() {
    std::int64_t flushed = 0;
    for (Stripe& stripe : stripes_) {
      {
        std::lock_guard lock(stripe.mutex);
        if (stripe.pending.empty()) continue;
      }
      Write write(stripe);
      for (const auto& [key, pending] : stripe.pending) {
        for (std::size_t t = pending.from_tier; t < kTiers; ++t) put_into(t, key, pending.block);
        ++flushed;
      }
      stripe.pending.clear();
    }
    return flushed;
  }

  // write_back: blocks put but not flushed yet.
  [[nodiscard]] std::int64_t pending_writes() const {
    std::int64_t n = 0;
    for (const Stripe& stripe : stripes_) {
      std::lock_guard lock(stripe.mutex);
      n += static_cast<std::int64_t>(stripe.pending.size());
    }
    return n;
  }

  // How many puts into tier `tier` (put, promotion, flush) threw kvfuse::error, and the last one's message.
  [[nodiscard]] std::int64_t put_failures(std::size_t tier) const {
    check_tier(tier, "put_failures");
    std::lock_guard lock(mutex_);
    return put_failures_[tier];
  }
  [[nodiscard]] std::string last_put_error(std::size_t tier) const {
    check_tier(tier, "last_put_error");
    std::lock_guard lock(mutex_);
    return last_put_error_[tier];
  }
  // How many erases of tier `tier` threw kvfuse::error, and the last one's message.
  [[nodiscard]] std::int64_t erase_failures(std::size_t tier) const {
    check_tier(tier, "erase_failures");
    std::lock_guard lock(mutex_);
    return erase_failures_[tier];
  }
  [[nodiscard]] std::string last_erase_error(std::size_t tier) const {
    check_tier(tier, "last_erase_error");
    std::lock_guard lock(mutex_);
    return last_erase_error_[tier];
  }
  // The same for every tier but the first (a two-tier store's slow tier): the failures summed, the last message.
  [[nodiscard]] std::int64_t slow_put_failures() const {
    std::lock_guard lock(mutex_);
    std::int64_t n = 0;
    for (std::size_t i = 1; i < kTiers; ++i) n += put_failures_[i];
    return n;
  }
  [[nodiscard]] std::string last_slow_error() const {
    std::lock_guard lock(mutex_);
    return last_slow_error_;
  }

  // Reads (get, get_many, describe, get_into and get_range) served by tier `tier`, measured: a get_many is one read.
  [[nodiscard]] ReadStats tier_stats(std::size_t tier) const {
    check_tier(tier, "tier_stats");
    std::lock_guard lock(mutex_);
    return stats_[tier];
  }

  // MeasuredTierStore: the tiers, fastest first, with their name, cost per GB and measured read throughput (0 while
  // a tier has delivered no byte).
  [[nodiscard]] std::vector<StorageDevice> tier_devices() const {
    std::lock_guard lock(mutex_);
    std::vector<StorageDevice> out;
    for (std::size_t i = 0; i < kTiers; ++i)
      out.push_back({config_.tiers[i].name, config_.tiers[i].cost_per_gb, stats_[i].bytes_per_s(), 0.0});
    return out;
  }

 private:
  struct Pending {
    KVBlock block;
    std::size_t from_tier = 0;  // the first tier it still goes to
  };
  struct Stripe {
    mutable std::mutex mutex;                // held by the writes of its keys and by promotions
    std::atomic<std::uint64_t> writes{0};    // writes of its keys so far (bumped when one ends)
    std::unordered_map<KVKey, Pending, KVKeyHash> pending;  // write_back: blocks for the slower tiers
  };
  // A put, erase or flush of a stripe's keys: holds the stripe's lock and, when it ends, voids the promotions of
  // reads that began before it.
  struct Write {
    explicit Write(Stripe& s) : stripe(s), lock(s.mutex) {}
    Write(const Write&) = delete;
    Write& operator=(const Write&) = delete;
    ~Write() { stripe.writes.fetch_add(1, std::memory_order_release); }
    Stripe& stripe;
    std::lock_guard<std::mutex> lock;
  };

  Stripe& stripe_of(const KVKey& key) { return stripes_[KVKeyHash{}(key) % kStripes]; }

  // A plain throw (not detail::require), so that the compiler sees the indexing after it in bounds.
  static void check_tier(std::size_t tier, const char* what) {
    if (tier >= kTiers) throw error(fmt::format("TieredKVStore::{}: tier {} of a {}-tier store", what, tier, kTiers));
  }

  // f(tier i), for a tier index known at run time.
  template <std::size_t I = 0, class F>
  auto on_tier(std::size_t i, F&& f) const {
    if constexpr (I + 1 == kTiers) {
      return f(std::get<I>(tiers_));
    } else {
      if (i == I) return f(std::get<I>(tiers_));
      return on_tier<I + 1>(i, std::forward<F>(f));
    }
  }

  // Asks tiers 0, 1, ... in turn, each once, about the keys no faster tier answered: ask(t, keys) returns one result
  // per key, true or engaged where tier t answered it, and take(i, t, result) receives tier t's answer for keys[i].
  template <class Ask, class Take>
  static void each_tier_once(std::span<const KVKey> keys, Ask&& ask, Take&& take) {
    std::vector<std::size_t> missing(keys.size());
    for (std::size_t i = 0; i < keys.size(); ++i) missing[i] = i;
    std::vector<KVKey> asked(keys.begin(), keys.end());
    for (std::size_t t = 0; t < kTiers && !asked.empty(); ++t) {
      auto results = ask(t, std::span<const KVKey>(asked));
      std::size_t kept = 0;
      for (std::size_t j = 0; j < asked.size(); ++j) {
        if (results[j]) {
          take(missing[j], t, std::move(results[j]));
        } else {
          missing[kept] = missing[j];
          asked[kept] = asked[j];
          ++kept;
        }
      }
      missing.resize(kept);
      asked.resize(kept);
    }
  }

  // Copies a block that a read found in tier `from` into the faster tiers, unless a put or erase of the key's stripe
  // ran since the read began (`writes`: the stripe's write count then): what that wrote (or removed) stands, the
  // block read before it does not.
  void promote(const KVKey& key, const KVBlock& block, std::size_t from, std::uint64_t writes) {
    Stripe& stripe = stripe_of(key);
    std::lock_guard lock(stripe.mutex);
    if (stripe.writes.load(std::memory_order_relaxed) == writes)
      for (std::size_t t = 0; t < from; ++t) put_into(t, key, block);
  }

  // A copy of `block` into tier `tier`; a kvfuse::error is counted and kept. Returns whether the tier took it.
  bool put_into(std::size_t tier, const KVKey& key, const KVBlock& block) {
    try {
      on_tier(tier, [&](auto& t) { t.put(key, block); });
      return true;
    } catch (const error& e) {
      std::lock_guard lock(mutex_);
      ++put_failures_[tier];
      last_put_error_[tier] = e.what();
      if (tier > 0) last_slow_error_ = e.what();
      return false;
    }
  }

  // A read of tier `tier`, timed and added to its statistics with the payload bytes it returned (get_into: `range`
  // bytes when it returns true).
  template <class Read>
  auto timed(std::size_t tier, Read&& read, std::size_t range = 0) {
    const auto t0 = std::chrono::steady_clock::now();
    auto result = on_tier(tier, std::forward<Read>(read));
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    std::int64_t bytes = 0;
    if constexpr (std::is_same_v<decltype(result), std::optional<KVBlock>>) {
      if (result) bytes = static_cast<std::int64_t>(result->bytes.size());
    } else if constexpr (std::is_same_v<decltype(result), bool>) {
      if (result) bytes = static_cast<std::int64_t>(range);
    } else if constexpr (std::is_same_v<decltype(result), std::vector<std::optional<KVBlock>>>) {
      for (const std::optional<KVBlock>& block : result)
        bytes += block ? static_cast<std::int64_t>(block->bytes.size()) : 0;
    }
    std::lock_guard lock(mutex_);
    stats_[tier].add(bytes, seconds);
    return result;
  }

  std::tuple<Tiers&...> tiers_;
  TieredConfig config_;
  std::array<Stripe, kStripes> stripes_;
  mutable std::mutex mutex_;  // guards the failure records and the statistics
  std::array<std::int64_t, kTiers> put_failures_{};
  std::array<std::string, kTiers> last_put_error_{};
  std::array<std::int64_t, kTiers> erase_failures_{};
  std::array<std::string, kTiers> last_erase_error_{};
  std::string last_slow_error_;
  std::array<ReadStats, kTiers> stats_{};
};

static_assert(RangedKVStore<TieredKVStore<InMemoryKVStore, DiskKVStore>>);
static_assert(MeasuredTierStore<TieredKVStore<InMemoryKVStore, DiskKVStore>>);
static_assert(MeasuredTierStore<TieredKVStore<InMemoryKVStore, DiskKVStore, InMemoryKVStore>>);

}  // namespace kvfuse
