#pragma once
// The store behind kvfuse-server. CpuBatchEngine is a template over one store type, while --store picks one at run
// time: kvfuse::AnyKVStore forwards every call to the store it wraps, counting the chunk caches the planner found
// (hits) and did not find (misses) in its batched lookups. StoreStack owns the stores --store names:
//
//   memory                      InMemoryKVStore (bounded: --memory-bytes, least recently used evicted)
//   DIR                         TieredKVStore: InMemoryKVStore over DiskKVStore(DIR), written through
//   redis://HOST:PORT           TieredKVStore: InMemoryKVStore over RedisKVStore (a shared tier: several servers
//   redis-cluster://H:P,...     on one Redis load each other's chunk caches), written through
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include "kvfuse/backend/any_kv_store.hpp"
#include "kvfuse/backend/disk_kv_store.hpp"
#include "kvfuse/backend/in_memory_store.hpp"
#include "kvfuse/backend/tiered_kv_store.hpp"
#if KVFUSE_WITH_REDIS
#include "kvfuse/backend/redis_kv_store.hpp"
#endif

namespace kvfuse_server {

// Whether --store names a Redis server or Cluster.
[[nodiscard]] inline bool is_redis_uri(std::string_view spec) {
  return spec.starts_with("redis://") || spec.starts_with("redis-cluster://");
}

// The stores --store names (see the header comment), and a kvfuse::AnyKVStore over the outermost one. Each tier of
// a TieredKVStore is a kvfuse::AnyKVStore too, so that the hits of each tier are counted where they happen (the
// tiered store asks the slow tier only for what the fast one missed).
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

  [[nodiscard]] kvfuse::AnyKVStore& store() noexcept { return *any_; }
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
  std::optional<kvfuse::AnyKVStore> fast_, slow_;  // the tiers of a tiered store
  std::optional<kvfuse::TieredKVStore<kvfuse::AnyKVStore, kvfuse::AnyKVStore>> tiered_;
  std::optional<kvfuse::AnyKVStore> any_;
  std::string slow_name_;
  std::string description_;
};

}  // namespace kvfuse_server
