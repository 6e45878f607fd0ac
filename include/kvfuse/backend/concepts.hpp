#pragma once
// The two backend concepts an engine models to plug its compute and storage into kvfuse policies.
//
// Policies are templates over these concepts; each model sits next to a
// static_assert(kvfuse::ComputeBackend<...>) / static_assert(kvfuse::KVStore<...>).
//
// ComputeBackend — the calls policies make on the engine's compute device:
//   b.model_fingerprint()      -> uint64: identifies model weights + settings; part of every KVKey, so
//                                  KV is never reused across models.
//   b.compute_kv(r)             -> void: compute K/V for prompt tokens r (a TokenRange) with the KV of
//                                  tokens [0, r.begin) already resident, and keep it resident.
//                                  (Cake's compute side: chunked prefill.)
//   b.install_kv(r, block)      -> void: make loaded KV for tokens r resident (copy into the engine's KV
//                                  buffer / pages). block.num_tokens == r.size().
//
// KVStore — a keyed store of KV blocks (memory, disk, remote). Keys carry the model fingerprint and a
// content hash (see core/types.hpp):
//   s.contains(key)        -> bool
//   s.get(key)             -> std::optional<KVBlock>: the block, or nullopt when absent
//   s.put(key, block)      -> void: insert or replace
//   s.erase(key)           -> bool: whether something was removed
//   s.contains_many(keys)  -> std::vector<bool> (a const member): contains of each key of a std::span<const KVKey>,
//                             result i for keys[i]
//   s.get_many(keys)       -> std::vector<std::optional<KVBlock>>: get of each key, result i for keys[i]
// The batched calls answer a request's keys in as few round trips as the store allows (RedisKVStore: one pipeline
// per node; TieredKVStore: one batch per tier for the keys still missing); a store may also just loop. A failure in
// them is what it is in the store's single-key call: where get misses when the store cannot answer (RedisKVStore
// with its server down), get_many misses for the keys it could not ask; where get throws kvfuse::error, get_many
// throws, and none of its results is returned.
// Errors: what a store throws is a kvfuse::error whose code() (core/status.hpp) says why: Status::store_unavailable
// when the store cannot be reached or its I/O fails (a server down, refusing or timing out; a store directory gone,
// a disk full, EIO), Status::corrupt_entry when it throws over an entry that fails its checks (kvfuse's stores do
// not: they reject the entry, a miss, and count it), Status::invalid_argument for a bad call.
// Thread safety: kvfuse's own stores (InMemoryKVStore, DiskKVStore, TieredKVStore and ThrottledKVStore over safe
// stores) are safe for any number of concurrent threads, on distinct and the same keys: several pipelines (one per
// engine) share one store, and each reads from its I/O thread while others put and erase. A store an engine brings
// must be too when it is shared so; one pipeline alone needs one reader thread (its loader's I/O thread) plus one
// writer thread (the engine) at a time.
//
// RangedKVStore — a KVStore that also reads part of an entry (the layer-pipelined loader of FusionPipeline
// reads one layer of a stored block at a time):
//   s.describe(key)                        -> std::optional<KVBlockInfo>: the entry's size, token count, first
//                                             position and version, or nullopt when absent or unusable
//   s.get_range(key, info, offset, size)   -> std::optional<std::vector<std::byte>>: payload bytes
//                                             [offset, offset + size) of the entry `info` describes; nullopt
//                                             when it is gone, was replaced since (another info.version) or
//                                             fails the store's checks. offset + size <= info.bytes.
//   s.get_into(key, info, offset, out)     -> bool: the same bytes [offset, offset + out.size()) read into `out`
//                                             (a std::span<std::byte> the caller owns: an engine's staging
//                                             buffer), with no copy the store can avoid; false exactly where
//                                             get_range returns nullopt (the contents of `out` are then
//                                             unspecified). kvfuse's stores implement get_range by get_into
//                                             (detail::get_range_by_get_into), so the two never differ.
// A range outside the entry (offset + size > info.bytes) is a kvfuse::error (invalid_argument), not a miss.
//
// MeasuredTierStore — a KVStore of any number of tiers (fastest first) that measures each tier's reads and puts an
// entry where each put says (TieredKVStore); FusionPipeline asks CacheBlend §5.1's loading controller where they
// belong:
//   s.tier_devices()       -> std::vector<StorageDevice>: one per tier, fastest first: its name, its cost per GB and
//                             its measured read throughput (0 while unmeasured)
//   s.put(key, block, i)   -> void: insert or replace in tier i and the slower ones, not the faster ones;
//                             s.put(key, block) is i = 0 (every tier)
//
// CostModeledCompute / CostModeledStore — optional refinements for backends that run in virtual time
// (the simulated backends): instead of taking wall time, an operation reports when it would finish if
// started at `start_s`. Policies that see these run a deterministic discrete-event schedule.
//   b.compute_finish_s(r, start_s)              -> double
//   s.load_finish_s(key, num_tokens, start_s)   -> double

#include <concepts>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include "kvfuse/core/error.hpp"
#include "kvfuse/core/types.hpp"

namespace kvfuse {

template <class B>
concept ComputeBackend = requires(B& b, const B& cb, TokenRange r, const KVBlock& block) {
  { cb.model_fingerprint() } -> std::convertible_to<std::uint64_t>;
  { b.compute_kv(r) } -> std::same_as<void>;
  { b.install_kv(r, block) } -> std::same_as<void>;
};

template <class S>
concept KVStore = requires(S& s, const S& cs, const KVKey& key, KVBlock block, std::span<const KVKey> keys) {
  { cs.contains(key) } -> std::convertible_to<bool>;
  { cs.contains_many(keys) } -> std::same_as<std::vector<bool>>;
  { s.get(key) } -> std::same_as<std::optional<KVBlock>>;
  { s.get_many(keys) } -> std::same_as<std::vector<std::optional<KVBlock>>>;
  { s.put(key, std::move(block)) } -> std::same_as<void>;
  { s.erase(key) } -> std::convertible_to<bool>;
};

template <class S>
concept RangedKVStore = KVStore<S> && requires(S& s, const KVKey& key, const KVBlockInfo& info, std::uint64_t offset,
                                               std::span<std::byte> out) {
  { s.describe(key) } -> std::same_as<std::optional<KVBlockInfo>>;
  { s.get_range(key, info, offset, offset) } -> std::same_as<std::optional<std::vector<std::byte>>>;
  { s.get_into(key, info, offset, out) } -> std::same_as<bool>;
};

namespace detail {

// Throws kvfuse::error unless payload bytes [offset, offset + size) lie inside the entry `info` describes; `store`
// and `call` name the call refused ("DiskKVStore", "get_into").
inline void require_in_entry(std::string_view store, std::string_view call, const KVBlockInfo& info,
                             std::uint64_t offset, std::uint64_t size) {
  require(offset <= info.bytes && size <= info.bytes - offset, "{}::{}: bytes [{}, {}) of a {}-byte entry", store, call,
          offset, offset + size, info.bytes);
}

// A ranged store's get_range: its get_into on a buffer of `size` bytes of the result's own, so that both calls are
// one implementation. `store` names the store in the error for a range outside the entry.
template <class S>
[[nodiscard]] std::optional<std::vector<std::byte>> get_range_by_get_into(S& s, std::string_view store,
                                                                           const KVKey& key, const KVBlockInfo& info,
                                                                           std::uint64_t offset, std::uint64_t size) {
  require_in_entry(store, "get_range", info, offset, size);
  std::vector<std::byte> bytes(static_cast<std::size_t>(size));
  if (!s.get_into(key, info, offset, std::span<std::byte>(bytes))) return std::nullopt;
  return bytes;
}

}  // namespace detail

// A storage tier as CacheBlend §5.1's loading controller (schedule/loading_controller.hpp) sees it.
struct StorageDevice {
  std::string name;
  double cost_per_gb = 0;            // C_store per GB for the storage period considered (e.g. per month)
  double bandwidth_bytes_per_s = 0;  // Throughput(storage_device), measured offline
  double latency_s = 0;              // fixed delay of each per-layer fetch

  void validate() const {
    detail::require_finite_nonneg(cost_per_gb, fmt::format("StorageDevice '{}': cost_per_gb", name));
    detail::require_finite_positive(bandwidth_bytes_per_s,
                                    fmt::format("StorageDevice '{}': bandwidth_bytes_per_s", name));
    detail::require_finite_nonneg(latency_s, fmt::format("StorageDevice '{}': latency_s", name));
  }
};

// What a store's reads delivered, measured (ThrottledKVStore per link, TieredKVStore per tier): a loading
// controller fed with these uses the tier's measured throughput rather than a nominal one.
struct ReadStats {
  std::int64_t reads = 0;     // get, get_many, describe and get_into (get_range) calls
  std::int64_t bytes = 0;     // payload bytes they returned
  double seconds = 0.0;       // wall time spent inside them, summed over calls

  // Bytes per second as the readers saw them; 0 before any byte.
  [[nodiscard]] double bytes_per_s() const noexcept { return seconds > 0 ? static_cast<double>(bytes) / seconds : 0.0; }
  void add(std::int64_t b, double s) noexcept {
    ++reads;
    bytes += b;
    seconds += s;
  }
};

template <class S>
concept MeasuredTierStore =
    KVStore<S> && requires(S& s, const S& cs, const KVKey& key, KVBlock block, std::size_t tier) {
      { cs.tier_devices() } -> std::same_as<std::vector<StorageDevice>>;
      { s.put(key, std::move(block), tier) } -> std::same_as<void>;
    };

template <class B>
concept CostModeledCompute = ComputeBackend<B> && requires(const B& cb, TokenRange r, double t) {
  { cb.compute_finish_s(r, t) } -> std::convertible_to<double>;
};

template <class S>
concept CostModeledStore = KVStore<S> && requires(const S& cs, const KVKey& key, std::int64_t n, double t) {
  { cs.load_finish_s(key, n, t) } -> std::convertible_to<double>;
};

}  // namespace kvfuse
