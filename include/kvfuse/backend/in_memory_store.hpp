#pragma once
// InMemoryKVStore: a thread-safe KVStore in host memory. The default store for tests, examples and
// engines that keep chunk caches in DRAM.

#include <cstdint>
#include <mutex>
#include <optional>
#include <unordered_map>

#include "kvfuse/backend/concepts.hpp"

namespace kvfuse {

class InMemoryKVStore {
 public:
  [[nodiscard]] bool contains(const KVKey& key) const {
    std::lock_guard lock(mutex_);
    return map_.contains(key);
  }
  [[nodiscard]] std::optional<KVBlock> get(const KVKey& key) {
    std::lock_guard lock(mutex_);
    auto it = map_.find(key);
    if (it == map_.end()) return std::nullopt;
    return it->second;
  }
  void put(const KVKey& key, KVBlock block) {
    std::lock_guard lock(mutex_);
    bytes_ += static_cast<std::int64_t>(block.bytes.size());
    auto [it, inserted] = map_.try_emplace(key, std::move(block));
    if (!inserted) {
      bytes_ -= static_cast<std::int64_t>(it->second.bytes.size());
      it->second = std::move(block);
    }
  }
  bool erase(const KVKey& key) {
    std::lock_guard lock(mutex_);
    auto it = map_.find(key);
    if (it == map_.end()) return false;
    bytes_ -= static_cast<std::int64_t>(it->second.bytes.size());
    map_.erase(it);
    return true;
  }
  // Drops every entry (an engine bounding its memory between requests).
  void clear() {
    std::lock_guard lock(mutex_);
    map_.clear();
    bytes_ = 0;
  }
  [[nodiscard]] std::size_t size() const {
    std::lock_guard lock(mutex_);
    return map_.size();
  }
  [[nodiscard]] std::int64_t bytes() const {
    std::lock_guard lock(mutex_);
    return bytes_;
  }

 private:
  mutable std::mutex mutex_;
  std::unordered_map<KVKey, KVBlock, KVKeyHash> map_;
  std::int64_t bytes_ = 0;
};

static_assert(KVStore<InMemoryKVStore>);

}  // namespace kvfuse
