#pragma once
// The store behind kvfuse-server. CpuBatchEngine is a template over one store type, while --store picks one at run
// time: AnyKVStore models RangedKVStore and forwards every call to the store it wraps, counting the chunk caches the
// planner found (hits) and did not find (misses) in its batched lookups. StoreStack owns the stores --store names:
//
//   memory                      InMemoryKVStore (bounded: --memory-bytes, least recently used evicted)
//   DIR                         TieredKVStore: InMemoryKVStore over DiskKVStore(DIR), written through
//   redis://HOST:PORT           TieredKVStore: InMemoryKVStore over RedisKVStore (a shared tier: several servers
//   redis-cluster://H:P,...     on one Redis load each other's chunk caches), written through
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include "kvfuse/backend/concepts.hpp"
#include "kvfuse/backend/disk_kv_store.hpp"
#include "kvfuse/backend/in_memory_store.hpp"
#include "kvfuse/backend/tiered_kv_store.hpp"
#include "kvfuse/core/types.hpp"
#if KVFUSE_WITH_REDIS
#include "kvfuse/backend/redis_kv_store.hpp"
#endif

namespace kvfuse_server {

class AnyKVStore {
 public:
  template <kvfuse::RangedKVStore S>
  explicit AnyKVStore(S& store) : impl_(std::make_unique<Model<S>>(store)) {}

  [[nodiscard]] bool contains(const kvfuse::KVKey& key) const { return impl_->contains(key); }
  [[nodiscard]] std::vector<bool> contains_many(std::span<const kvfuse::KVKey> keys) const {
    std::vector<bool> held = impl_->contains_many(keys);
    std::int64_t found = 0;
    for (const bool h : held) found += h ? 1 : 0;
    hits_ += found;
    misses_ += static_cast<std::int64_t>(held.size()) - found;
    return held;
  }
  [[nodiscard]] std::optional<kvfuse::KVBlock> get(const kvfuse::KVKey& key) { return impl_->get(key); }
  [[nodiscard]] std::vector<std::optional<kvfuse::KVBlock>> get_many(std::span<const kvfuse::KVKey> keys) {
    return impl_->get_many(keys);
  }
  void put(const kvfuse::KVKey& key, kvfuse::KVBlock block) { impl_->put(key, std::move(block)); }
  bool erase(const kvfuse::KVKey& key) { return impl_->erase(key); }
  [[nodiscard]] std::optional<kvfuse::KVBlockInfo> describe(const kvfuse::KVKey& key) { return impl_->describe(key); }
  [[nodiscard]] std::optional<std::vector<std::byte>> get_range(const kvfuse::KVKey& key,
                                                                const kvfuse::KVBlockInfo& info, std::uint64_t offset,
                                                                std::uint64_t size) {
    return impl_->get_range(key, info, offset, size);
  }
  [[nodiscard]] bool get_into(const kvfuse::KVKey& key, const kvfuse::KVBlockInfo& info, std::uint64_t offset,
                              std::span<std::byte> out) {
    return impl_->get_into(key, info, offset, out);
  }

  // Chunk caches the planner's lookups found / did not find.
  [[nodiscard]] std::int64_t hits() const noexcept { return hits_.load(); }
  [[nodiscard]] std::int64_t misses() const noexcept { return misses_.load(); }

 private:
  struct Base {
    virtual ~Base() = default;
    [[nodiscard]] virtual bool contains(const kvfuse::KVKey& key) const = 0;
    [[nodiscard]] virtual std::vector<bool> contains_many(std::span<const kvfuse::KVKey> keys) const = 0;
    [[nodiscard]] virtual std::optional<kvfuse::KVBlock> get(const kvfuse::KVKey& key) = 0;
    [[nodiscard]] virtual std::vector<std::optional<kvfuse::KVBlock>> get_many(std::span<const kvfuse::KVKey> keys) = 0;
    virtual void put(const kvfuse::KVKey& key, kvfuse::KVBlock block) = 0;
    virtual bool erase(const kvfuse::KVKey& key) = 0;
    [[nodiscard]] virtual std::optional<kvfuse::KVBlockInfo> describe(const kvfuse::KVKey& key) = 0;
    [[nodiscard]] virtual std::optional<std::vector<std::byte>> get_range(const kvfuse::KVKey& key,
                                                                          const kvfuse::KVBlockInfo& info,
                                                                          std::uint64_t offset, std::uint64_t size) = 0;
    [[nodiscard]] virtual bool get_into(const kvfuse::KVKey& key, const kvfuse::KVBlockInfo& info, std::uint64_t offset,
                                        std::span<std::byte> out) = 0;
  };

  template <class S>
  struct Model final : Base {
    explicit Model(S& store) : s(store) {}
    bool contains(const kvfuse::KVKey& key) const override { return static_cast<bool>(s.contains(key)); }
    std::vector<bool> contains_many(std::span<const kvfuse::KVKey> keys) const override { return s.contains_many(keys); }
    std::optional<kvfuse::KVBlock> get(const kvfuse::KVKey& key) override { return s.get(key); }
    std::vector<std::optional<kvfuse::KVBlock>> get_many(std::span<const kvfuse::KVKey> keys) override {
      return s.get_many(keys);
    }
    void put(const kvfuse::KVKey& key, kvfuse::KVBlock block) override { s.put(key, std::move(block)); }
    bool erase(const kvfuse::KVKey& key) override { return static_cast<bool>(s.erase(key)); }
    std::optional<kvfuse::KVBlockInfo> describe(const kvfuse::KVKey& key) override { return s.describe(key); }
    std::optional<std::vector<std::byte>> get_range(const kvfuse::KVKey& key, const kvfuse::KVBlockInfo& info,
                                                    std::uint64_t offset, std::uint64_t size) override {
      return s.get_range(key, info, offset, size);
    }
    bool get_into(const kvfuse::KVKey& key, const kvfuse::KVBlockInfo& info, std::uint64_t offset,
                  std::span<std::byte> out) override {
      return s.get_into(key, info, offset, out);
    }
    S& s;
  };

  std::unique_ptr<Base> impl_;
  mutable std::atomic<std::int64_t> hits_{0};
  mutable std::atomic<std::int64_t> misses_{0};
};
static_assert(kvfuse::RangedKVStore<AnyKVStore>);

// Whether --store names a Redis server or Cluster.
[[nodiscard]] inline bool is_redis_uri(std::string_view spec) {
  return spec.starts_with("redis://") || spec.starts_with("redis-cluster://");
}

// The stores --store names (see the header comment), and an AnyKVStore over the outermost one. Each tier of a
// TieredKVStore is an AnyKVStore too, so that the hits of each tier are counted where they happen (the tiered store
// asks the slow tier only for what the fast one missed).
class StoreStack {
 public:
  // memory_bytes: the capacity of the memory tier (least recently used entries evicted; InMemoryKVStore).
  StoreStack(const std::string& spec, std::int64_t memory_bytes) : memory_(memory_bytes) {
    if (spec == "memory") {
      any_.emplace(memory_);
      description_ = "memory";
      return;
    }
    fast_.emplace(memory_);
    if (is_redis_uri(spec)) {
#if KVFUSE_WITH_REDIS
      redis_.emplace(spec);
      slow_.emplace(*redis_);
      // CacheBlend §5.1's C_store per GB: local DRAM, and a share of a remote server's DRAM.
      tiered_.emplace(kvfuse::TieredConfig{{{"memory", 1.0}, {"redis", 0.3}}}, *fast_, *slow_);
      slow_name_ = "redis";
      description_ = fmt::format("memory -> redis ({})", spec);
#else
      throw kvfuse::error(fmt::format("--store {}: this build has no Redis support (hiredis; -DKVFUSE_REDIS=ON)", spec));
#endif
    } else {
      kvfuse::require(!spec.empty(), "--store: empty; memory, a directory or a redis:// URI");
      disk_.emplace(spec);
      slow_.emplace(*disk_);
      tiered_.emplace(kvfuse::TieredConfig{{{"memory", 1.0}, {"disk", 0.1}}}, *fast_, *slow_);
      slow_name_ = "disk";
      description_ = fmt::format("memory -> disk ({})", spec);
    }
    any_.emplace(*tiered_);
  }
  StoreStack(const StoreStack&) = delete;
  StoreStack& operator=(const StoreStack&) = delete;

  [[nodiscard]] AnyKVStore& store() noexcept { return *any_; }
  [[nodiscard]] const std::string& description() const noexcept { return description_; }
  [[nodiscard]] const kvfuse::InMemoryKVStore& memory() const noexcept { return memory_; }

  // Chunk caches the planner's lookups found, per tier (fastest first).
  [[nodiscard]] std::vector<std::pair<std::string, std::int64_t>> hits_per_tier() const {
    if (!tiered_) return {{"memory", any_->hits()}};
    return {{"memory", fast_->hits()}, {slow_name_, slow_->hits()}};
  }

  // Reads a Redis tier could not answer and values it rejected (0 without one).
  [[nodiscard]] std::int64_t redis_unavailable() const {
#if KVFUSE_WITH_REDIS
    return redis_ ? redis_->unavailable() : 0;
#else
    return 0;
#endif
  }
  [[nodiscard]] std::int64_t redis_rejected() const {
#if KVFUSE_WITH_REDIS
    return redis_ ? redis_->rejected() : 0;
#else
    return 0;
#endif
  }

 private:
  kvfuse::InMemoryKVStore memory_;
  std::optional<kvfuse::DiskKVStore> disk_;
#if KVFUSE_WITH_REDIS
  std::optional<kvfuse::RedisKVStore> redis_;
#endif
  std::optional<AnyKVStore> fast_, slow_;  // the tiers of a tiered store
  std::optional<kvfuse::TieredKVStore<AnyKVStore, AnyKVStore>> tiered_;
  std::optional<AnyKVStore> any_;
  std::string slow_name_;
  std::string description_;
};

}  // namespace kvfuse_server
