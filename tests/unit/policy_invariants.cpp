// Invariants every selection policy and every KVStore model must keep, as TEST_CASE_TEMPLATEs: the
// same checks over each policy / backend, so a new one gets them by being added to the list.
#include <doctest/doctest.h>

#include <random>

#include "kvfuse/backend/in_memory_store.hpp"
#include "kvfuse/harness/simulated.hpp"
#include "kvfuse/select/attnlink_boundary.hpp"
#include "kvfuse/select/hkvd_selector.hpp"
#include "kvfuse/select/query_aware_selector.hpp"

// Each unit test file lives in its own namespace: the files are compiled together (a unity build).
namespace unit_policy_invariants {

using namespace kvfuse;

namespace {

// Each adapter returns the tokens a policy recomputes at the last layer of a 4-layer model, with
// `budget` in [0, 1] mapped to the policy's knob (ratio r, or k as a fraction of the longest chunk).
HKVDConfig gradual_filtering(double budget) {
  HKVDConfig cfg;
  cfg.recompute_ratio = budget;
  cfg.ratio_margins = {std::min(1.0, budget + 0.2) - budget, std::min(1.0, budget + 0.1) - budget, 0.0};
  return cfg;
}

struct HKVDPolicy {
  static TokenSet select(const PromptLayout& layout, double budget, std::mt19937_64& rng) {
    const HKVDSelector selector(gradual_filtering(budget), layout, 4);
    TokenSet current = selector.initial();
    std::uniform_real_distribution<float> dev(0.0f, 1.0f);
    for (int layer = 0; layer < 4; ++layer) {
      std::vector<float> deviation(current.size());
      for (float& d : deviation) d = dev(rng);
      current = selector.select(layer, current, deviation);
    }
    return current;
  }
};

// Query mass mixed with the deviation (lambda = 0.5), so that both inputs are read.
struct QueryAwarePolicy {
  static TokenSet select(const PromptLayout& layout, double budget, std::mt19937_64& rng) {
    const QueryAwareSelector selector(gradual_filtering(budget), layout, 4, 0.5);
    TokenSet current = selector.schedule().initial();
    std::uniform_real_distribution<float> value(0.0f, 1.0f);
    for (int layer = 0; layer < 4; ++layer) {
      std::vector<float> mass(current.size());
      std::vector<float> deviation(current.size());
      for (float& m : mass) m = value(rng);
      for (float& d : deviation) d = value(rng);
      current = selector.select(layer, current, mass, deviation);
    }
    return current;
  }
};

struct AttnLinkPolicy {
  static TokenSet select(const PromptLayout& layout, double budget, std::mt19937_64&) {
    std::int64_t longest = 0;
    for (const PromptChunk& c : layout.chunks) longest = std::max(longest, c.range.size());
    const auto k = static_cast<std::int64_t>(std::llround(budget * static_cast<double>(longest)));
    return AttnLinkBoundary({k, 0}).plan(layout).tokens;
  }
};

PromptLayout random_layout(std::mt19937_64& rng) {
  std::vector<std::int64_t> lengths(rng() % 6);
  for (auto& len : lengths) len = static_cast<std::int64_t>(rng() % 9);  // empty and one-token chunks too
  PromptLayout layout = PromptLayout::from_lengths(lengths, static_cast<std::int64_t>(rng() % 4));
  for (PromptChunk& c : layout.chunks) c.cached = rng() % 4 != 0;
  return layout;
}

}  // namespace

TEST_CASE_TEMPLATE("selection policies: sorted, in range, query and uncached tokens always in", Policy, HKVDPolicy,
                   QueryAwarePolicy, AttnLinkPolicy) {
  std::mt19937_64 rng(42);
  for (int trial = 0; trial < 300; ++trial) {
    const PromptLayout layout = random_layout(rng);
    const double budget = (trial % 3 == 0) ? 0.0 : (trial % 3 == 1 ? 1.0 : static_cast<double>(rng() % 100) / 100);
    const TokenSet set = Policy::select(layout, budget, rng);
    INFO("trial " << trial);
    CHECK(std::is_sorted(set.begin(), set.end()));
    CHECK(std::adjacent_find(set.begin(), set.end()) == set.end());
    CHECK((set.empty() || (set.front() >= 0 && set.back() < layout.num_tokens())));
    auto in = [&](std::int64_t t) { return std::binary_search(set.begin(), set.end(), t); };
    for (std::int64_t t = layout.query.begin; t < layout.query.end; ++t) CHECK(in(t));
    for (const PromptChunk& c : layout.chunks)
      if (!c.cached)
        for (std::int64_t t = c.range.begin; t < c.range.end; ++t) CHECK(in(t));
  }
}

TEST_CASE_TEMPLATE("selection policies: the same prompt twice gives the same plan", Policy, HKVDPolicy,
                   QueryAwarePolicy, AttnLinkPolicy) {
  std::mt19937_64 layout_rng(7);
  const PromptLayout layout = random_layout(layout_rng);
  std::mt19937_64 a(3), b(3);
  CHECK(Policy::select(layout, 0.3, a) == Policy::select(layout, 0.3, b));
}

// ------------------------------------------------------------------------------------------- stores
namespace {
struct MakeInMemory {
  using type = InMemoryKVStore;
  static type make() { return {}; }
};
struct MakeSimulated {
  using type = SimulatedStore;
  static type make() { return SimulatedStore({0.0, 16}, ResourceTrace::constant(1.0, 10.0)); }
};
}  // namespace

TEST_CASE_TEMPLATE("KVStore models: put, get, replace, erase, keys carry the model", Maker, MakeInMemory,
                   MakeSimulated) {
  auto store = Maker::make();
  static_assert(KVStore<typename Maker::type>);
  const KVKey key{1, 42};
  const KVKey same_content_other_model{2, 42};
  CHECK_FALSE(store.contains(key));
  CHECK_FALSE(store.get(key).has_value());
  store.put(key, KVBlock{2, std::vector<std::byte>(8, std::byte{7})});
  CHECK(store.contains(key));
  CHECK_FALSE(store.contains(same_content_other_model));
  const auto got = store.get(key);
  REQUIRE(got.has_value());
  CHECK(got->num_tokens == 2);
  CHECK(got->bytes == std::vector<std::byte>(8, std::byte{7}));
  store.put(key, KVBlock{3, std::vector<std::byte>(12, std::byte{9})});
  CHECK(store.get(key)->num_tokens == 3);
  CHECK(store.erase(key));
  CHECK_FALSE(store.erase(key));
  CHECK_FALSE(store.contains(key));
}

}  // namespace unit_policy_invariants
