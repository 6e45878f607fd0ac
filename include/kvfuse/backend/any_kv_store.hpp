#pragma once
// A store chosen at run time behind one type. The pipelines and engines are templates over their store, so a
// program whose store is picked by a flag (memory, disk, Redis, tiers, a link in front) would compile its pipeline
// once per combination; over AnyKVStore it compiles it once. Each call is forwarded through one virtual call to the
// store wrapped (which must outlive this), and the chunk caches the planner's batched lookups found (hits) and did
// not find (misses) are counted.
//
//   AnyKVStore        a RangedKVStore over any RangedKVStore. Not a MeasuredTierStore, so it can be a tier of a
//                     TieredKVStore (kvfuse-server counts each tier's hits that way).
//   AnyTieredKVStore  a RangedKVStore and MeasuredTierStore over any store that is both (a TieredKVStore): the
//                     loading controller's choice of tier and puts into a tier reach the store wrapped.
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <utility>
#include <vector>

#include "kvfuse/backend/concepts.hpp"
#include "kvfuse/core/types.hpp"

namespace kvfuse {

template <bool Tiered>
class BasicAnyKVStore {
 public:
  template <RangedKVStore S>
    requires(!Tiered || MeasuredTierStore<S>)
  explicit BasicAnyKVStore(S& store) : impl_(std::make_unique<Model<S>>(store)) {}

  [[nodiscard]] bool contains(const KVKey& key) const { return impl_->contains(key); }
  [[nodiscard]] std::vector<bool> contains_many(std::span<const KVKey> keys) const {
    std::vector<bool> held = impl_->contains_many(keys);
    std::int64_t found = 0;
    for (const bool h : held) found += h ? 1 : 0;
    hits_ += found;
    misses_ += static_cast<std::int64_t>(held.size()) - found;
    return held;
  }
  [[nodiscard]] std::optional<KVBlock> get(const KVKey& key) { return impl_->get(key); }
  [[nodiscard]] std::vector<std::optional<KVBlock>> get_many(std::span<const KVKey> keys) {
    return impl_->get_many(keys);
  }
  void put(const KVKey& key, KVBlock block) { impl_->put(key, std::move(block)); }
  bool erase(const KVKey& key) { return impl_->erase(key); }
  [[nodiscard]] std::optional<KVBlockInfo> describe(const KVKey& key) { return impl_->describe(key); }
  [[nodiscard]] std::optional<std::vector<std::byte>> get_range(const KVKey& key, const KVBlockInfo& info,
                                                                std::uint64_t offset, std::uint64_t size) {
    return impl_->get_range(key, info, offset, size);
  }
  [[nodiscard]] bool get_into(const KVKey& key, const KVBlockInfo& info, std::uint64_t offset,
                              std::span<std::byte> out) {
    return impl_->get_into(key, info, offset, out);
  }

  // MeasuredTierStore (AnyTieredKVStore only).
  [[nodiscard]] std::vector<StorageDevice> tier_devices() const
    requires Tiered
  {
    return impl_->tier_devices();
  }
  void put(const KVKey& key, KVBlock block, std::size_t tier)
    requires Tiered
  {
    impl_->put(key, std::move(block), tier);
  }

  // Chunk caches the planner's lookups found / did not find.
  [[nodiscard]] std::int64_t hits() const noexcept { return hits_.load(); }
  [[nodiscard]] std::int64_t misses() const noexcept { return misses_.load(); }

 private:
  struct Base {
    virtual ~Base() = default;
    [[nodiscard]] virtual bool contains(const KVKey& key) const = 0;
    [[nodiscard]] virtual std::vector<bool> contains_many(std::span<const KVKey> keys) const = 0;
    [[nodiscard]] virtual std::optional<KVBlock> get(const KVKey& key) = 0;
    [[nodiscard]] virtual std::vector<std::optional<KVBlock>> get_many(std::span<const KVKey> keys) = 0;
    virtual void put(const KVKey& key, KVBlock block) = 0;
    virtual bool erase(const KVKey& key) = 0;
    [[nodiscard]] virtual std::optional<KVBlockInfo> describe(const KVKey& key) = 0;
    [[nodiscard]] virtual std::optional<std::vector<std::byte>> get_range(const KVKey& key, const KVBlockInfo& info,
                                                                          std::uint64_t offset,
                                                                          std::uint64_t size) = 0;
    [[nodiscard]] virtual bool get_into(const KVKey& key, const KVBlockInfo& info, std::uint64_t offset,
                                        std::span<std::byte> out) = 0;
    [[nodiscard]] virtual std::vector<StorageDevice> tier_devices() const = 0;
    virtual void put(const KVKey& key, KVBlock block, std::size_t tier) = 0;
  };

  template <class S>
  struct Model final : Base {
    explicit Model(S& store) : s(store) {}
    bool contains(const KVKey& key) const override { return static_cast<bool>(s.contains(key)); }
    std::vector<bool> contains_many(std::span<const KVKey> keys) const override { return s.contains_many(keys); }
    std::optional<KVBlock> get(const KVKey& key) override { return s.get(key); }
    std::vector<std::optional<KVBlock>> get_many(std::span<const KVKey> keys) override { return s.get_many(keys); }
    void put(const KVKey& key, KVBlock block) override { s.put(key, std::move(block)); }
    bool erase(const KVKey& key) override { return static_cast<bool>(s.erase(key)); }
    std::optional<KVBlockInfo> describe(const KVKey& key) override { return s.describe(key); }
    std::optional<std::vector<std::byte>> get_range(const KVKey& key, const KVBlockInfo& info, std::uint64_t offset,
                                                    std::uint64_t size) override {
      return s.get_range(key, info, offset, size);
    }
    bool get_into(const KVKey& key, const KVBlockInfo& info, std::uint64_t offset,
                  std::span<std::byte> out) override {
      return s.get_into(key, info, offset, out);
    }
    // Reached through AnyTieredKVStore only, whose constructor admits MeasuredTierStores only.
    std::vector<StorageDevice> tier_devices() const override {
      if constexpr (MeasuredTierStore<S>) return s.tier_devices();
      else return {};
    }
    void put(const KVKey& key, KVBlock block, std::size_t tier) override {
      if constexpr (MeasuredTierStore<S>) s.put(key, std::move(block), tier);
      else s.put(key, std::move(block));
    }
    S& s;
  };

  std::unique_ptr<Base> impl_;
  mutable std::atomic<std::int64_t> hits_{0};
  mutable std::atomic<std::int64_t> misses_{0};
};

using AnyKVStore = BasicAnyKVStore<false>;
using AnyTieredKVStore = BasicAnyKVStore<true>;
static_assert(RangedKVStore<AnyKVStore> && !MeasuredTierStore<AnyKVStore>);
static_assert(RangedKVStore<AnyTieredKVStore> && MeasuredTierStore<AnyTieredKVStore>);

}  // namespace kvfuse
