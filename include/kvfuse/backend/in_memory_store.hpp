#pragma once
// InMemoryKVStore: a KVStore in host memory (also a RangedKVStore: describe / get_into / get_range copy part of an
// entry, as the layer-pipelined loader reads a layer). The default store for tests, examples and engines that keep
// chunk caches in DRAM. An entry's version is the number of its put (a store-wide counter).
//
// Thread safety: safe for any number of concurrent threads, on distinct and the same keys: one mutex guards the
// map, and every call copies under it (a get returns a copy, never a reference into the map).

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <mutex>
#include <optional>
#include <span>
#include <unordered_map>
#include <vector>

#include "kvfuse/backend/concepts.hpp"
#include "kvfuse/core/error.hpp"

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
    return it->second.block;
  }
  // contains / get of each key, under one lock: result i belongs to keys[i].
  [[nodiscard]] std::vector<bool> contains_many(std::span<const KVKey> keys) const {
    std::vector<bool> out(keys.size());
    std::lock_guard lock(mutex_);
    for (std::size_t i = 0; i < keys.size(); ++i) out[i] = map_.contains(keys[i]);
    return out;
  }
  [[nodiscard]] std::vector<std::optional<KVBlock>> get_many(std::span<const KVKey> keys) {
    std::vector<std::optional<KVBlock>> out(keys.size());
    std::lock_guard lock(mutex_);
    for (std::size_t i = 0; i < keys.size(); ++i)
      if (auto it = map_.find(keys[i]); it != map_.end()) out[i] = it->second.block;
    return out;
  }
  [[nodiscard]] std::optional<KVBlockInfo> describe(const KVKey& key) const {
    std::lock_guard lock(mutex_);
    auto it = map_.find(key);
    if (it == map_.end()) return std::nullopt;
    const KVBlock& b = it->second.block;
    return KVBlockInfo{b.num_tokens, b.first_position, b.bytes.size(), it->second.version};
  }
  // RangedKVStore: payload bytes [offset, offset + out.size()) of the entry `info` describes, copied into `out` under
  // the lock; false when it was erased or replaced since describe.
  [[nodiscard]] bool get_into(const KVKey& key, const KVBlockInfo& info, std::uint64_t offset,
                              std::span<std::byte> out) const {
    detail::require_in_entry("InMemoryKVStore", "get_into", info, offset, out.size());
    std::lock_guard lock(mutex_);
    auto it = map_.find(key);
    if (it == map_.end() || it->second.version != info.version || it->second.block.bytes.size() != info.bytes)
      return false;
    if (!out.empty()) std::memcpy(out.data(), it->second.block.bytes.data() + offset, out.size());
    return true;
  }
  [[nodiscard]] std::optional<std::vector<std::byte>> get_range(const KVKey& key, const KVBlockInfo& info,
                                                                std::uint64_t offset, std::uint64_t size) const {
    return detail::get_range_by_get_into(*this, "InMemoryKVStore", key, info, offset, size);
  }
  void put(const KVKey& key, KVBlock block) {
    std::lock_guard lock(mutex_);
    bytes_ += static_cast<std::int64_t>(block.bytes.size());
    Entry& entry = map_[key];
    bytes_ -= static_cast<std::int64_t>(entry.block.bytes.size());
    entry = Entry{std::move(block), ++puts_};
  }
  bool erase(const KVKey& key) {
    std::lock_guard lock(mutex_);
    auto it = map_.find(key);
    if (it == map_.end()) return false;
    bytes_ -= static_cast<std::int64_t>(it->second.block.bytes.size());
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
  struct Entry {
    KVBlock block;
    std::uint64_t version = 0;
  };
  mutable std::mutex mutex_;
  std::unordered_map<KVKey, Entry, KVKeyHash> map_;
  std::uint64_t puts_ = 0;
  std::int64_t bytes_ = 0;
};

static_assert(RangedKVStore<InMemoryKVStore>);

}  // namespace kvfuse
