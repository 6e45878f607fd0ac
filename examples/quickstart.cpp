// The README's first-use tour, compiled and run by CTest (test example.quickstart).
//
// An engine-side ComputeBackend over a toy KV buffer, the in-memory store behind a slow link, Cake's loader with real
// threads, CacheBlend's HKVD selection over a 30-layer model, and Epic's AttnLink plan.
#include <chrono>
#include <cstdio>
#include <cstring>
#include <numeric>
#include <random>
#include <thread>

#include <fmt/format.h>

#include "kvfuse/kvfuse.hpp"
#include "kvfuse/runtime.hpp"
#include "kvfuse/stores.hpp"

namespace {

// One uint64 of "KV" per token, derived from the whole prefix as real KV is; compute takes real time.
class ToyCompute {
 public:
  explicit ToyCompute(std::span<const kvfuse::token_id> tokens) : tokens_(tokens.begin(), tokens.end()),
                                                                  kv_(tokens.size()) {}
  [[nodiscard]] std::uint64_t model_fingerprint() const { return 0x5A11; }
  void compute_kv(kvfuse::TokenRange r) {
    for (std::int64_t t = r.begin; t < r.end; ++t) kv_[static_cast<std::size_t>(t)] = kv_at(t);
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  void install_kv(kvfuse::TokenRange r, const kvfuse::KVBlock& block) {
    std::memcpy(&kv_[static_cast<std::size_t>(r.begin)], block.bytes.data(), block.bytes.size());
  }
  [[nodiscard]] std::uint64_t kv_at(std::int64_t t) const {
    return kvfuse::hash_tokens(std::span(tokens_).first(static_cast<std::size_t>(t + 1)));
  }
  [[nodiscard]] const std::vector<std::uint64_t>& kv() const { return kv_; }

 private:
  std::vector<kvfuse::token_id> tokens_;
  std::vector<std::uint64_t> kv_;
};
static_assert(kvfuse::ComputeBackend<ToyCompute>);

// The in-memory store behind a slow link: 1 ms per 128-token block.
class SlowStore : public kvfuse::InMemoryKVStore {
 public:
  std::optional<kvfuse::KVBlock> get(const kvfuse::KVKey& key) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
    return InMemoryKVStore::get(key);
  }
};
static_assert(kvfuse::KVStore<SlowStore>);

}  // namespace

int main() {
  // --- Cake: a 2048-token prompt whose KV is stored as a prefix cache in 128-token blocks.
  std::vector<kvfuse::token_id> prompt(2048);
  std::iota(prompt.begin(), prompt.end(), 100);
  ToyCompute compute(prompt);
  SlowStore store;
  const auto keys = kvfuse::prefix_chunk_keys(compute.model_fingerprint(), prompt, 128);
  for (std::size_t j = 0; j < keys.size(); ++j) {
    kvfuse::KVBlock block{128, std::vector<std::byte>(128 * sizeof(std::uint64_t))};
    std::vector<std::uint64_t> kv(128);
    for (std::int64_t i = 0; i < 128; ++i) kv[static_cast<std::size_t>(i)] = compute.kv_at(static_cast<std::int64_t>(j) * 128 + i);
    std::memcpy(block.bytes.data(), kv.data(), block.bytes.size());
    store.put(keys[j], std::move(block));
  }
  kvfuse::BidirectionalLoader<ToyCompute, SlowStore> loader({512, 128});
  const kvfuse::LoaderTrace trace = kvfuse::run_threaded(loader, compute, store, prompt);
  bool exact = true;
  for (std::int64_t t = 0; t < 2048; ++t) exact = exact && compute.kv()[static_cast<std::size_t>(t)] == compute.kv_at(t);
  fmt::print("Cake: met at token {} ({} computed, {} loaded) after {:.1f} ms; KV exact: {}\n", trace.meet_token,
             trace.computed_tokens, trace.loaded_tokens, trace.ready_s * 1e3, exact);

  // --- CacheBlend: system prompt + 3 passages + query; layer 0 full, then gradual filtering to 15 %.
  const auto layout = kvfuse::PromptLayout::from_lengths({40, 512, 512, 512}, 20);
  const int layers = 30;
  kvfuse::HKVDSelector hkvd({}, layout, layers);
  std::mt19937 rng(1);
  std::normal_distribution<float> noise(0.0f, 1.0f);
  const std::int64_t heads = 3, head_dim = 64, width = heads * head_dim;
  kvfuse::TokenSet selected = hkvd.initial();
  for (int l = 0; l < layers; ++l) {
    // Recomputed vs cached V of the selected tokens (random here; the engine's real K/V in practice).
    std::vector<float> recomputed(selected.size() * static_cast<std::size_t>(width));
    std::vector<float> cached(recomputed.size());
    for (float& x : recomputed) x = noise(rng);
    for (float& x : cached) x = noise(rng);
    std::vector<std::int64_t> rows(selected.size());
    std::iota(rows.begin(), rows.end(), 0);
    std::vector<float> deviation(selected.size());
    kvfuse::kv_deviation(recomputed, cached, width, heads, head_dim, rows, deviation);
    selected = hkvd.select(l, selected, deviation);
  }
  fmt::print("CacheBlend: {} of {} tokens recomputed after the last check layer\n", selected.size(),
             layout.num_tokens());

  // --- Epic: the first k = 16 tokens of every non-first chunk, plus the query.
  const kvfuse::AttnLinkPlan plan = kvfuse::AttnLinkBoundary().plan(layout);
  fmt::print("Epic AttnLink-16: {} tokens recomputed at every layer\n", plan.tokens.size());
  return exact ? 0 : 1;
}
