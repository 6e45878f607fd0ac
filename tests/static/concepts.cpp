// Static tests: every backend model satisfies its concept, near-misses are rejected, the loader's drivers
// instantiate for the models, and the umbrella headers compile. Building this file is the test.
#include "kvfuse/kvfuse.hpp"
#include "kvfuse/runtime.hpp"
#include "kvfuse/harness/simulated.hpp"
#include "kvfuse/stores.hpp"

namespace {

// The smallest engine-side models, as an engine would write them.
struct MinimalCompute {
  std::uint64_t model_fingerprint() const { return 1; }
  void compute_kv(kvfuse::TokenRange) {}
  void install_kv(kvfuse::TokenRange, const kvfuse::KVBlock&) {}
};
struct MinimalStore {
  bool contains(const kvfuse::KVKey&) const { return false; }
  std::vector<bool> contains_many(std::span<const kvfuse::KVKey> keys) const { return std::vector<bool>(keys.size()); }
  std::optional<kvfuse::KVBlock> get(const kvfuse::KVKey&) { return std::nullopt; }
  std::vector<std::optional<kvfuse::KVBlock>> get_many(std::span<const kvfuse::KVKey> keys) {
    return std::vector<std::optional<kvfuse::KVBlock>>(keys.size());
  }
  void put(const kvfuse::KVKey&, kvfuse::KVBlock) {}
  bool erase(const kvfuse::KVKey&) { return false; }
};

// Near-misses.
struct ComputeWithoutInstall {
  std::uint64_t model_fingerprint() const { return 1; }
  void compute_kv(kvfuse::TokenRange) {}
};
struct ComputeWithMutableFingerprint {  // model_fingerprint must be callable on a const backend
  std::uint64_t model_fingerprint() { return 1; }
  void compute_kv(kvfuse::TokenRange) {}
  void install_kv(kvfuse::TokenRange, const kvfuse::KVBlock&) {}
};
struct StoreReturningPointer : MinimalStore {  // get must return std::optional<KVBlock>
  const kvfuse::KVBlock* get(const kvfuse::KVKey&) { return nullptr; }
};
struct StoreWithoutErase {
  bool contains(const kvfuse::KVKey&) const { return false; }
  std::vector<bool> contains_many(std::span<const kvfuse::KVKey> keys) const { return std::vector<bool>(keys.size()); }
  std::optional<kvfuse::KVBlock> get(const kvfuse::KVKey&) { return std::nullopt; }
  std::vector<std::optional<kvfuse::KVBlock>> get_many(std::span<const kvfuse::KVKey> keys) {
    return std::vector<std::optional<kvfuse::KVBlock>>(keys.size());
  }
  void put(const kvfuse::KVKey&, kvfuse::KVBlock) {}
};
struct StoreWithoutBatches {  // contains_many and get_many are part of KVStore
  bool contains(const kvfuse::KVKey&) const { return false; }
  std::optional<kvfuse::KVBlock> get(const kvfuse::KVKey&) { return std::nullopt; }
  void put(const kvfuse::KVKey&, kvfuse::KVBlock) {}
  bool erase(const kvfuse::KVKey&) { return false; }
};
struct StoreWithMutableContainsMany : MinimalStore {  // contains_many must be callable on a const store
  std::vector<bool> contains_many(std::span<const kvfuse::KVKey> keys) { return std::vector<bool>(keys.size()); }
};
struct StoreWithBatchGetOfPointers : MinimalStore {  // get_many must return one std::optional<KVBlock> per key
  std::vector<const kvfuse::KVBlock*> get_many(std::span<const kvfuse::KVKey> keys) {
    return std::vector<const kvfuse::KVBlock*>(keys.size());
  }
};
struct MinimalRangedStore : MinimalStore {
  std::optional<kvfuse::KVBlockInfo> describe(const kvfuse::KVKey&) { return std::nullopt; }
  std::optional<std::vector<std::byte>> get_range(const kvfuse::KVKey&, const kvfuse::KVBlockInfo&, std::uint64_t,
                                                  std::uint64_t) {
    return std::nullopt;
  }
  bool get_into(const kvfuse::KVKey&, const kvfuse::KVBlockInfo&, std::uint64_t, std::span<std::byte>) { return false; }
};
struct RangedStoreWithoutGetInto : MinimalStore {  // get_into is part of RangedKVStore
  std::optional<kvfuse::KVBlockInfo> describe(const kvfuse::KVKey&) { return std::nullopt; }
  std::optional<std::vector<std::byte>> get_range(const kvfuse::KVKey&, const kvfuse::KVBlockInfo&, std::uint64_t,
                                                  std::uint64_t) {
    return std::nullopt;
  }
};
struct TierStoreWithPlacementState : MinimalStore {  // the tier is an argument of the put, not store-wide state
  std::vector<kvfuse::StorageDevice> tier_devices() const { return {}; }
  void set_placement(std::size_t) {}
};
struct TierStoreWithPutIntoTier : MinimalStore {
  using MinimalStore::put;
  std::vector<kvfuse::StorageDevice> tier_devices() const { return {}; }
  void put(const kvfuse::KVKey&, kvfuse::KVBlock, std::size_t) {}
};

}  // namespace

// Models shipped with kvfuse.
static_assert(kvfuse::KVStore<kvfuse::InMemoryKVStore>);
static_assert(kvfuse::KVStore<kvfuse::DiskKVStore>);
static_assert(kvfuse::KVStore<kvfuse::TieredKVStore<kvfuse::InMemoryKVStore, kvfuse::DiskKVStore>>);
static_assert(kvfuse::RangedKVStore<kvfuse::InMemoryKVStore> && kvfuse::RangedKVStore<kvfuse::DiskKVStore>);
static_assert(kvfuse::RangedKVStore<kvfuse::TieredKVStore<kvfuse::InMemoryKVStore, kvfuse::DiskKVStore>>);
static_assert(kvfuse::RangedKVStore<kvfuse::ThrottledKVStore<kvfuse::DiskKVStore>>);
static_assert(kvfuse::MeasuredTierStore<kvfuse::TieredKVStore<kvfuse::InMemoryKVStore, kvfuse::DiskKVStore>>);
static_assert(!kvfuse::MeasuredTierStore<kvfuse::InMemoryKVStore>);
static_assert(!kvfuse::RangedKVStore<kvfuse::SimulatedStore>);
// Two tiers exactly: a tiered store is not a tier of another (its tier tags would be overwritten).
template <class F, class S>
concept Tierable = requires { typename kvfuse::TieredKVStore<F, S>; };
static_assert(Tierable<kvfuse::InMemoryKVStore, kvfuse::DiskKVStore>);
static_assert(!Tierable<kvfuse::TieredKVStore<kvfuse::InMemoryKVStore, kvfuse::DiskKVStore>, kvfuse::DiskKVStore>);
static_assert(kvfuse::ComputeBackend<kvfuse::SimulatedCompute>);
static_assert(kvfuse::CostModeledCompute<kvfuse::SimulatedCompute>);
static_assert(kvfuse::KVStore<kvfuse::SimulatedStore>);
static_assert(kvfuse::CostModeledStore<kvfuse::SimulatedStore>);

// Engine-side models and near-misses.
static_assert(kvfuse::ComputeBackend<MinimalCompute> && !kvfuse::CostModeledCompute<MinimalCompute>);
static_assert(kvfuse::KVStore<MinimalStore> && !kvfuse::CostModeledStore<MinimalStore>);
static_assert(!kvfuse::ComputeBackend<ComputeWithoutInstall>);
static_assert(!kvfuse::ComputeBackend<ComputeWithMutableFingerprint>);
static_assert(!kvfuse::KVStore<StoreReturningPointer>);
static_assert(!kvfuse::KVStore<StoreWithoutErase>);
static_assert(!kvfuse::KVStore<StoreWithoutBatches>);
static_assert(!kvfuse::KVStore<StoreWithMutableContainsMany>);
static_assert(!kvfuse::KVStore<StoreWithBatchGetOfPointers>);
static_assert(kvfuse::RangedKVStore<MinimalRangedStore>);
static_assert(!kvfuse::RangedKVStore<RangedStoreWithoutGetInto>);
static_assert(kvfuse::MeasuredTierStore<TierStoreWithPutIntoTier>);
static_assert(!kvfuse::MeasuredTierStore<TierStoreWithPlacementState>);
static_assert(!kvfuse::KVStore<kvfuse::SimulatedCompute>);
static_assert(!kvfuse::ComputeBackend<kvfuse::InMemoryKVStore>);

// The loader accepts any pair of models: run_threaded (real threads) for every pair, BidirectionalLoader::run
// (virtual time) only when both model their costs. The explicit instantiations compile every member and the
// whole threaded driver for these pairs; the concept checks say which run() exists.
template class kvfuse::BidirectionalLoader<MinimalCompute, MinimalStore>;
template class kvfuse::BidirectionalLoader<kvfuse::SimulatedCompute, kvfuse::SimulatedStore>;
template kvfuse::LoaderTrace kvfuse::run_threaded(const kvfuse::BidirectionalLoader<MinimalCompute, MinimalStore>&,
                                                  MinimalCompute&, MinimalStore&, std::span<const kvfuse::token_id>);
template kvfuse::LoaderTrace kvfuse::run_threaded(
    const kvfuse::BidirectionalLoader<kvfuse::SimulatedCompute, kvfuse::InMemoryKVStore>&, kvfuse::SimulatedCompute&,
    kvfuse::InMemoryKVStore&, std::span<const kvfuse::token_id>);

// Cake's requests in an engine's step loop instantiate for the smallest engine and store.
template class kvfuse::CakeRequests<MinimalCompute, MinimalStore>;

template <class Loader, class Compute, class Store>
concept VirtualTimeRun = requires(const Loader& l, Compute& c, Store& s, std::span<const kvfuse::token_id> t) {
  { l.run(c, s, t) } -> std::same_as<kvfuse::LoaderTrace>;
};
static_assert(VirtualTimeRun<kvfuse::BidirectionalLoader<kvfuse::SimulatedCompute, kvfuse::SimulatedStore>,
                             kvfuse::SimulatedCompute, kvfuse::SimulatedStore>);
static_assert(!VirtualTimeRun<kvfuse::BidirectionalLoader<MinimalCompute, MinimalStore>, MinimalCompute, MinimalStore>);
static_assert(!VirtualTimeRun<kvfuse::BidirectionalLoader<kvfuse::SimulatedCompute, kvfuse::InMemoryKVStore>,
                              kvfuse::SimulatedCompute, kvfuse::InMemoryKVStore>);

// Vocabulary types are plain values.
static_assert(std::is_trivially_copyable_v<kvfuse::TokenRange>);
static_assert(std::is_trivially_copyable_v<kvfuse::KVKey>);
static_assert(kvfuse::TokenRange{2, 5}.size() == 3 && kvfuse::TokenRange{5, 5}.empty());

int main() { return 0; }
