#pragma once
// ThrottledKVStore: a KVStore reached over a link of limited bandwidth and fixed latency, in real time — it
// stands for a remote store or a slow SSD in front of any other store (InMemoryKVStore, DiskKVStore, ...).
//
// get() returns `inner`'s block no earlier than latency + bytes / bandwidth after the request, with the link
// shared: the bytes of concurrent gets queue on one token bucket (the link is busy until every byte sent so
// far has drained), so two threads loading at once each see half the bandwidth. contains() and erase() are
// index operations and put() writes are not throttled: the link models the read path a loader waits on.
// A get that finds nothing costs the latency only. get_many is one request: the latency once and the bytes of every
// block it returns; contains_many, like contains, is not throttled. Over a RangedKVStore it is one too: describe()
// costs the latency, get_into() (and get_range(), which is get_into) the latency and its bytes, on the same link.
//
// It also measures what it served (ReadStats: bytes returned, seconds spent in reads, reads), so a loading
// controller can be fed the tier's measured throughput rather than its nominal one.
//
// Thread safety: safe for any number of concurrent threads when `inner` is (every kvfuse store is): the calls are
// forwarded to `inner`, and the link state and the statistics are guarded by a mutex. The sleep happens outside
// the lock, so concurrent reads wait on the link together.

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <mutex>
#include <optional>
#include <span>
#include <thread>
#include <utility>
#include <vector>

#include "kvfuse/backend/concepts.hpp"
#include "kvfuse/backend/in_memory_store.hpp"
#include "kvfuse/core/error.hpp"
#include "kvfuse/core/types.hpp"

namespace kvfuse {

struct LinkConfig {
  double megabytes_per_s = 0.0;  // bandwidth in 10^6 bytes per second; 0 = unlimited
  double latency_ms = 0.0;       // added to every get, once

  void validate() const {
    detail::require_finite_nonneg(megabytes_per_s, "LinkConfig: megabytes_per_s");
    detail::require_finite_nonneg(latency_ms, "LinkConfig: latency_ms");
  }
};

template <KVStore Inner>
class ThrottledKVStore {
 public:
  ThrottledKVStore(Inner& inner, LinkConfig link) : inner_(&inner), link_(link) { link_.validate(); }

  [[nodiscard]] const LinkConfig& link() const noexcept { return link_; }

  [[nodiscard]] bool contains(const KVKey& key) const { return inner_->contains(key); }
  [[nodiscard]] std::vector<bool> contains_many(std::span<const KVKey> keys) const {
    return inner_->contains_many(keys);
  }

  [[nodiscard]] std::optional<KVBlock> get(const KVKey& key) {
    return over_link([&] { return inner_->get(key); },
                     [](const std::optional<KVBlock>& b) { return b ? b->bytes.size() : std::size_t{0}; });
  }

  [[nodiscard]] std::vector<std::optional<KVBlock>> get_many(std::span<const KVKey> keys) {
    return over_link([&] { return inner_->get_many(keys); },
                     [](const std::vector<std::optional<KVBlock>>& blocks) {
                       std::size_t bytes = 0;
                       for (const std::optional<KVBlock>& b : blocks) bytes += b ? b->bytes.size() : 0;
                       return bytes;
                     });
  }

  [[nodiscard]] std::optional<KVBlockInfo> describe(const KVKey& key)
    requires RangedKVStore<Inner>
  {
    return over_link([&] { return inner_->describe(key); }, [](const auto&) { return std::size_t{0}; });
  }

  [[nodiscard]] bool get_into(const KVKey& key, const KVBlockInfo& info, std::uint64_t offset, std::span<std::byte> out)
    requires RangedKVStore<Inner>
  {
    return over_link([&] { return inner_->get_into(key, info, offset, out); },
                     [&](bool read) { return read ? out.size() : std::size_t{0}; });
  }
  [[nodiscard]] std::optional<std::vector<std::byte>> get_range(const KVKey& key, const KVBlockInfo& info,
                                                                std::uint64_t offset, std::uint64_t size)
    requires RangedKVStore<Inner>
  {
    return detail::get_range_by_get_into(*this, "ThrottledKVStore", key, info, offset, size);
  }

  void put(const KVKey& key, KVBlock block) { inner_->put(key, std::move(block)); }
  bool erase(const KVKey& key) { return inner_->erase(key); }

  [[nodiscard]] ReadStats stats() const {
    std::lock_guard lock(mutex_);
    return stats_;
  }

 private:
  // Runs `read` on `inner`, then holds its result until the link has carried bytes_of(result) behind the bytes
  // of earlier reads (token bucket) plus the latency, and counts it in the statistics.
  template <class Read, class Bytes>
  auto over_link(Read&& read, Bytes&& bytes_of) {
    using clock = std::chrono::steady_clock;
    const auto start = clock::now();
    auto result = read();
    const auto bytes = static_cast<std::int64_t>(bytes_of(result));
    clock::time_point ready;
    {
      std::lock_guard lock(mutex_);
      // Token bucket: the link sends one byte stream at megabytes_per_s; these bytes queue behind earlier ones.
      const auto begin = std::max(start, link_free_);
      link_free_ = begin + transfer_time(bytes);
      ready = link_free_ + std::chrono::duration_cast<clock::duration>(
                               std::chrono::duration<double, std::milli>(link_.latency_ms));
    }
    std::this_thread::sleep_until(ready);
    const double seconds = std::chrono::duration<double>(clock::now() - start).count();
    std::lock_guard lock(mutex_);
    stats_.add(bytes, seconds);
    return result;
  }

  [[nodiscard]] std::chrono::steady_clock::duration transfer_time(std::int64_t bytes) const {
    if (link_.megabytes_per_s <= 0.0 || bytes == 0) return {};
    return std::chrono::duration_cast<std::chrono::steady_clock::duration>(
        std::chrono::duration<double>(static_cast<double>(bytes) / (link_.megabytes_per_s * 1e6)));
  }

  Inner* inner_;
  LinkConfig link_;
  mutable std::mutex mutex_;
  std::chrono::steady_clock::time_point link_free_{};
  ReadStats stats_;
};

static_assert(RangedKVStore<ThrottledKVStore<InMemoryKVStore>>);

}  // namespace kvfuse
