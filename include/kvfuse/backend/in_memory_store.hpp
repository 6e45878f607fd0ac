#pragma once
// InMemoryKVStore: a KVStore in host memory (also a RangedKVStore: describe / get_into / get_range copy part of an
// entry, as the layer-pipelined loader reads a layer). The default store for tests, examples and engines that keep
// chunk caches in DRAM. An entry's version is the number of its put (a store-wide counter).
//
// Capacity: unbounded by default. InMemoryKVStore(capacity_bytes) keeps at most that many payload bytes: a put
// evicts the least recently used entries (a get, get_many hit, get_into or put uses an entry) until the new one
// fits; a block larger than the whole capacity is not stored (counted in rejected()). A read of an entry evicted
// after its describe fails as for an erased one (get_into returns false): the reader computes instead.
//
// Thread safety: safe for any number of concurrent threads, on distinct and the same keys: one mutex guards the
// map, and every call copies under it (a get returns a copy, never a reference into the map).

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <list>
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
  InMemoryKVStore() = default;
  // At most capacity_bytes of payload (> 0; see the header comment).
  explicit InMemoryKVStore(std::int64_t capacity_bytes) : capacity_(capacity_bytes) {
    detail::require(capacity_bytes > 0, "InMemoryKVStore: capacity_bytes = {} must be > 0 (the default constructor "
                    "makes an unbounded store)", capacity_bytes);
  }

  [[nodiscard]] bool contains(const KVKey& key) const {
    std::lock_guard lock(mutex_);
    return map_.contains(key);
  }
  [[nodiscard]] std::optional<KVBlock> get(const KVKey& key) {
    std::lock_guard lock(mutex_);
    auto it = map_.find(key);
    if (it == map_.end()) return std::nullopt;
    touch(it->second);
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
      if (auto it = map_.find(keys[i]); it != map_.end()) {
        touch(it->second);
        out[i] = it->second.block;
      }
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
                              std::span<std::byte> out) {
    detail::require_in_entry("InMemoryKVStore", "get_into", info, offset, out.size());
    std::lock_guard lock(mutex_);
    auto it = map_.find(key);
    if (it == map_.end() || it->second.version != info.version || it->second.block.bytes.size() != info.bytes)
      return false;
    touch(it->second);
    if (!out.empty()) std::memcpy(out.data(), it->second.block.bytes.data() + offset, out.size());
    return true;
  }
  [[nodiscard]] std::optional<std::vector<std::byte>> get_range(const KVKey& key, const KVBlockInfo& info,
                                                                std::uint64_t offset, std::uint64_t size) {
    return detail::get_range_by_get_into(*this, "InMemoryKVStore", key, info, offset, size);
  }
  void put(const KVKey& key, KVBlock block) {
    std::lock_guard lock(mutex_);
    const auto size = static_cast<std::int64_t>(block.bytes.size());
    if (auto it = map_.find(key); it != map_.end()) remove(it);
    if (capacity_ > 0 && size > capacity_) {
      ++rejected_;
      return;
    }
    while (capacity_ > 0 && bytes_ + size > capacity_) {  // least recently used first
      remove(map_.find(recency_.back()));
      ++evictions_;
    }
    recency_.push_front(key);
    map_.emplace(key, Entry{std::move(block), ++puts_, recency_.begin()});
    bytes_ += size;
  }
  bool erase(const KVKey& key) {
    std::lock_guard lock(mutex_);
    auto it = map_.find(key);
    if (it == map_.end()) return false;
    remove(it);
    return true;
  }
  // Drops every entry (an engine bounding its memory between requests).
  void clear() {
    std::lock_guard lock(mutex_);
    map_.clear();
    recency_.clear();
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
  [[nodiscard]] std::int64_t capacity() const noexcept { return capacity_; }  // 0: unbounded
  // Entries evicted to make room, and blocks not stored because they were larger than the capacity.
  [[nodiscard]] std::int64_t evictions() const {
    std::lock_guard lock(mutex_);
    return evictions_;
  }
  [[nodiscard]] std::int64_t rejected() const {
    std::lock_guard lock(mutex_);
    return rejected_;
  }

 private:
  struct Entry {
    KVBlock block;
    std::uint64_t version = 0;
    std::list<KVKey>::iterator recency;  // its place in recency_
  };
  using Map = std::unordered_map<KVKey, Entry, KVKeyHash>;

  void touch(Entry& e) { recency_.splice(recency_.begin(), recency_, e.recency); }
  void remove(Map::iterator it) {
    bytes_ -= static_cast<std::int64_t>(it->second.block.bytes.size());
    recency_.erase(it->second.recency);
    map_.erase(it);
  }

  mutable std::mutex mutex_;
  Map map_;
  std::list<KVKey> recency_;  // most recently used first
  std::uint64_t puts_ = 0;
  std::int64_t bytes_ = 0;
  std::int64_t capacity_ = 0;
  std::int64_t evictions_ = 0;
  std::int64_t rejected_ = 0;
};

static_assert(RangedKVStore<InMemoryKVStore>);

}  // namespace kvfuse
