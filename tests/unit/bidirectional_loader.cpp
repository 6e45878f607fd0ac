// Cake BidirectionalLoader: hand-computed schedules in virtual time (Algorithm 1), the adaptive fallback,
// the guarantee against the baselines, store failures, and real threads moving real KV bytes.
#include <doctest/doctest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
#include <random>
#include <thread>

#include "kvfuse/backend/in_memory_store.hpp"
#include "kvfuse/harness/simulated.hpp"
#include "kvfuse/schedule/bidirectional_loader.hpp"
#include "kvfuse/schedule/threaded_loader.hpp"

#include "../support/test_util.hpp"

// Each unit test file lives in its own namespace: the files are compiled together (a unity build).
namespace unit_bidirectional_loader {

using namespace kvfuse;

namespace {

using SimLoader = BidirectionalLoader<SimulatedCompute, SimulatedStore>;
using kvfuse_test::iota_tokens;

// Store the first `stored_chunks` prefix chunks of `tokens` (no bytes; the simulated store costs tokens).
template <class Store>
void store_prefix(Store& store, std::uint64_t model, const std::vector<token_id>& tokens, std::int64_t fetch,
                  std::size_t stored_chunks) {
  const auto keys = prefix_chunk_keys(model, tokens, fetch);
  const auto n = static_cast<std::int64_t>(tokens.size());
  for (std::size_t j = 0; j < keys.size() && j < stored_chunks; ++j) {
    const std::int64_t b = static_cast<std::int64_t>(j) * fetch;
    store.put(keys[j], KVBlock{std::min(fetch, n - b), {}});
  }
}

// One byte per token over a link of 16 bit/s: a 2-token fetch chunk takes exactly 1 s.
constexpr double kTwoTokensPerSecondGbps = 16e-9;

struct Sim {
  SimulatedCompute compute;
  SimulatedStore store;
};

Sim make_sim(double a_s, double b_s, std::int64_t chunk, double gbps, double share = 1.0) {
  return {SimulatedCompute({a_s, b_s, chunk}, ResourceTrace::constant(share, gbps)),
          SimulatedStore({0.0, 1}, ResourceTrace::constant(share, gbps))};
}

}  // namespace

TEST_CASE("Algorithm 1: compute from the front, load from the back, meet in the middle") {
  // 8 tokens, compute chunk 2 (1 s each), fetch chunk 2 (1 s each).
  // t=0: compute [0,2), fetch [6,8).  t=1: compute [2,4), fetch [4,6).  t=2: pointers meet at 4.
  auto [compute, store] = make_sim(1.0, 0.0, 2, kTwoTokensPerSecondGbps);
  const auto tokens = iota_tokens(8);
  store_prefix(store, compute.model_fingerprint(), tokens, 2, 4);
  for (LoaderMode mode : {LoaderMode::adaptive, LoaderMode::bidirectional}) {
    auto sim = make_sim(1.0, 0.0, 2, kTwoTokensPerSecondGbps);
    store_prefix(sim.store, sim.compute.model_fingerprint(), tokens, 2, 4);
    const LoaderTrace t = SimLoader({2, 2, mode}).run(sim.compute, sim.store, tokens);
    CHECK(t.stored_tokens == 8);
    CHECK(t.meet_token == 4);
    CHECK(t.computed_tokens == 4);
    CHECK(t.loaded_tokens == 4);
    CHECK(t.cover_s == doctest::Approx(2.0));
    CHECK(t.ready_s == doctest::Approx(2.0));
    CHECK(sim.compute.resident_prefix() == 8);
    REQUIRE(t.steps.size() == 4);
    CHECK(t.steps[0].tokens == TokenRange{0, 2});
    CHECK(t.steps[0].source == KVSource::compute);
    CHECK(t.steps[1].tokens == TokenRange{6, 8});
    CHECK(t.steps[1].source == KVSource::prefix);
    CHECK(t.steps[3].tokens == TokenRange{4, 6});
    CHECK(t.steps[3].start_s == doctest::Approx(1.0));
  }
  const StaticSplit oracle = best_static_split(compute, store, tokens, 8, LoaderConfig{2, 2});
  CHECK(oracle.split == 4);
  CHECK(oracle.ready_s == doctest::Approx(2.0));
}

TEST_CASE("static split: compute [0, s) while loading [s, stored), both from the start; s on the fetch grid") {
  // 8 stored tokens, compute chunk 2 (1 s each), fetch chunk 2 (1 s each): a split at s takes
  // max(s / 2, (8 - s) / 2) seconds.
  const auto tokens = iota_tokens(8);
  for (std::int64_t s : {0, 2, 4, 6, 8}) {
    CAPTURE(s);
    auto sim = make_sim(1.0, 0.0, 2, kTwoTokensPerSecondGbps);
    store_prefix(sim.store, sim.compute.model_fingerprint(), tokens, 2, 4);
    LoaderConfig config{2, 2, LoaderMode::static_split};
    config.split = s;
    const LoaderTrace t = SimLoader(config).run(sim.compute, sim.store, tokens);
    CHECK(t.meet_token == s);
    CHECK(t.loaded_tokens == 8 - s);
    CHECK(t.ready_s == doctest::Approx(static_cast<double>(std::max(s, 8 - s)) / 2.0));
    CHECK(sim.compute.resident_prefix() == 8);
  }
  LoaderConfig off_grid{2, 2, LoaderMode::static_split};
  off_grid.split = 3;
  CHECK_THROWS_WITH_AS(SimLoader{off_grid}, doctest::Contains("split = 3 must be a non-negative multiple"), error);
}

TEST_CASE("compute chunks grow as a + b*i and stop at the loaded boundary") {
  // a = 1, b = 1, chunk 4: chunk 0 takes 1 s, chunk 1 takes 2 s. Fetch chunk 2 takes 1 s. 12 tokens.
  // t=0 compute [0,4) (->1), loads [10,12) (->1). t=1: compute [4,8) (->3, truncated? l=10 so no),
  // loads [8,10) (->2), [6,8) (->3). At t=3 compute reaches 8 and loads reached 6: covered at 3.
  auto sim = make_sim(1.0, 1.0, 4, kTwoTokensPerSecondGbps);
  const auto tokens = iota_tokens(12);
  store_prefix(sim.store, sim.compute.model_fingerprint(), tokens, 2, 6);
  const LoaderTrace t = SimLoader({4, 2, LoaderMode::bidirectional}).run(sim.compute, sim.store, tokens);
  CHECK(t.cover_s == doctest::Approx(3.0));
  CHECK(t.meet_token == 8);
  CHECK(t.loaded_tokens == 4);
  CHECK(sim.compute.resident_prefix() == 12);
}

TEST_CASE("adaptive fallback: a compute chunk that cannot beat the loads is not started") {
  // Compute chunk of 4 tokens takes 10 s; a 2-token fetch 1 s; 8 tokens. Loads finish at 4 s.
  // Published Cake starts compute chunk 0 at t=0 and the GPU is busy until 10 s.
  const auto tokens = iota_tokens(8);
  const LoaderEstimate est{10.0, 0.0, 1.0};
  auto run = [&](LoaderMode mode) {
    auto sim = make_sim(10.0, 0.0, 4, kTwoTokensPerSecondGbps);
    store_prefix(sim.store, sim.compute.model_fingerprint(), tokens, 2, 4);
    LoaderTrace t = SimLoader({4, 2, mode}, est).run(sim.compute, sim.store, tokens);
    CHECK(sim.compute.resident_prefix() == 8);
    return t;
  };
  const LoaderTrace adaptive = run(LoaderMode::adaptive);
  const LoaderTrace paper = run(LoaderMode::bidirectional);
  const LoaderTrace compute_only = run(LoaderMode::compute_only);
  const LoaderTrace load_only = run(LoaderMode::load_only);
  CHECK(adaptive.ready_s == doctest::Approx(4.0));
  CHECK(adaptive.computed_tokens == 0);
  CHECK(adaptive.skipped_compute_chunks == 1);
  CHECK(paper.cover_s == doctest::Approx(4.0));
  CHECK(paper.ready_s == doctest::Approx(10.0));  // the GPU tail the fallback avoids
  CHECK(compute_only.ready_s == doctest::Approx(20.0));
  CHECK(compute_only.loaded_tokens == 0);
  CHECK(load_only.ready_s == doctest::Approx(4.0));
  CHECK(load_only.computed_tokens == 0);
}

TEST_CASE("adaptive: the compute chunk is cut where the loads are predicted to meet it") {
  // 16 tokens; a compute chunk of 8 tokens takes 8 s (1 s per token), a 2-token fetch 1 s. Ending the first chunk
  // at e, both sides are done at max(e, 8 - e / 2): e = 6 (loads reach 6 at 5 s, compute at 6 s) beats the whole
  // chunk (8 s) and waiting for the loads (8 s), and equals the best static split.
  const auto tokens = iota_tokens(16);
  auto run = [&](LoaderMode mode) {
    auto sim = make_sim(8.0, 0.0, 8, kTwoTokensPerSecondGbps);
    store_prefix(sim.store, sim.compute.model_fingerprint(), tokens, 2, 8);
    LoaderTrace t = SimLoader({8, 2, mode}, {8.0, 0.0, 1.0}).run(sim.compute, sim.store, tokens);
    CHECK(sim.compute.resident_prefix() == 16);
    return t;
  };
  const LoaderTrace adaptive = run(LoaderMode::adaptive);
  CHECK(adaptive.ready_s == doctest::Approx(6.0));
  CHECK(adaptive.meet_token == 6);
  const auto first = std::find_if(adaptive.steps.begin(), adaptive.steps.end(),
                                  [](const LoaderStep& st) { return st.source == KVSource::compute; });
  REQUIRE(first != adaptive.steps.end());
  CHECK(first->tokens == TokenRange{0, 6});
  CHECK(run(LoaderMode::bidirectional).ready_s == doctest::Approx(8.0));
  auto sim = make_sim(8.0, 0.0, 8, kTwoTokensPerSecondGbps);
  store_prefix(sim.store, sim.compute.model_fingerprint(), tokens, 2, 8);
  CHECK(best_static_split(sim.compute, sim.store, tokens, 16, {8, 2}).ready_s == doctest::Approx(6.0));
}

TEST_CASE("idle budget: a wrong prediction costs at most one chunk's time") {
  // The estimate claims fetches take 0.1 s, but the link delivers a 2-token chunk in 100 s. The compute
  // side waits at most its chunk's predicted time (1 s) and then computes everything.
  const auto tokens = iota_tokens(8);
  auto sim = make_sim(1.0, 0.0, 2, kTwoTokensPerSecondGbps / 100);
  store_prefix(sim.store, sim.compute.model_fingerprint(), tokens, 2, 4);
  const LoaderTrace t = SimLoader({2, 2, LoaderMode::adaptive}, {1.0, 0.0, 0.1}).run(sim.compute, sim.store, tokens);
  // compute-only would take 4 s; with one skipped decision the loader may lose at most 1 s.
  CHECK(t.ready_s <= 4.0 + 1.0 + 1e-9);
  CHECK(t.skipped_compute_chunks >= 1);
  CHECK(t.meet_token == 8);
}

TEST_CASE("only the stored prefix is loaded; the rest is computed after the meeting point") {
  auto sim = make_sim(1.0, 0.0, 2, kTwoTokensPerSecondGbps);
  const auto tokens = iota_tokens(10);
  store_prefix(sim.store, sim.compute.model_fingerprint(), tokens, 2, 3);  // [0, 6) stored
  const SimLoader loader({2, 2, LoaderMode::bidirectional});
  CHECK(loader.stored_prefix(sim.compute, sim.store, tokens) == 6);
  const LoaderTrace t = loader.run(sim.compute, sim.store, tokens);
  // t=0: compute [0,2), fetch [4,6). t=1: compute [2,4), fetch [2,4). t=2: both reach 4 / 2 -> covered,
  // meeting at 4 (the fetch of [2,4) was redundant). Then [6,8), [8,10) are computed: ready at 4.
  CHECK(t.stored_tokens == 6);
  CHECK(t.meet_token == 4);
  CHECK(t.loaded_tokens == 2);
  CHECK(t.computed_tokens == 8);
  CHECK(t.cover_s == doctest::Approx(2.0));
  CHECK(t.ready_s == doctest::Approx(4.0));
  CHECK(sim.compute.resident_prefix() == 10);

  SUBCASE("a different model's entries are not a hit") {
    SimulatedCompute other({1.0, 0.0, 2}, ResourceTrace::constant(1, 1), 0xBEEF);
    CHECK(loader.stored_prefix(other, sim.store, tokens) == 0);
  }
  SUBCASE("a different prefix is not a hit") {
    auto changed = tokens;
    changed[0] = 7;
    CHECK(loader.stored_prefix(sim.compute, sim.store, changed) == 0);
  }
}

TEST_CASE("edge cases: empty prompt, nothing stored, one-token chunks") {
  SUBCASE("empty prompt") {
    auto sim = make_sim(1.0, 0.0, 2, 1);
    const LoaderTrace t = SimLoader().run(sim.compute, sim.store, std::vector<token_id>{});
    CHECK(t.ready_s == 0.0);
    CHECK(t.steps.empty());
    CHECK(t.computed_tokens == 0);
  }
  SUBCASE("nothing stored: plain chunked prefill") {
    auto sim = make_sim(1.0, 0.0, 2, 1);
    const LoaderTrace t = SimLoader({2, 2}).run(sim.compute, sim.store, iota_tokens(5));
    CHECK(t.stored_tokens == 0);
    CHECK(t.computed_tokens == 5);
    CHECK(t.ready_s == doctest::Approx(2.5));  // chunks of 2, 2, 1 tokens at 1 s per full chunk
  }
  SUBCASE("one-token chunks") {
    auto sim = make_sim(1.0, 0.0, 1, 8e-9);  // one token per second each way
    const auto tokens = iota_tokens(5);
    store_prefix(sim.store, sim.compute.model_fingerprint(), tokens, 1, 5);
    const LoaderTrace t = SimLoader({1, 1, LoaderMode::bidirectional}).run(sim.compute, sim.store, tokens);
    CHECK(t.computed_tokens + t.loaded_tokens == 5);
    CHECK(t.ready_s == doctest::Approx(3.0));  // ceil(5 / 2) steps
    CHECK(sim.compute.resident_prefix() == 5);
  }
  SUBCASE("the same prompt twice gives the same schedule") {
    const auto tokens = iota_tokens(64);
    auto a = make_sim(1.0, 0.1, 8, 64e-9);
    auto b = make_sim(1.0, 0.1, 8, 64e-9);
    store_prefix(a.store, a.compute.model_fingerprint(), tokens, 4, 16);
    store_prefix(b.store, b.compute.model_fingerprint(), tokens, 4, 16);
    const SimLoader loader({8, 4});
    const LoaderTrace first = loader.run(a.compute, a.store, tokens);
    const LoaderTrace second = loader.run(b.compute, b.store, tokens);
    CHECK(first.meet_token == second.meet_token);
    CHECK(first.ready_s == second.ready_s);
  }
}

TEST_CASE("bad configuration is refused with the value named") {
  CHECK_THROWS_WITH_AS(SimLoader({0, 128}), doctest::Contains("compute_chunk = 0"), error);
  CHECK_THROWS_WITH_AS(SimLoader({512, -3}), doctest::Contains("fetch_chunk = -3"), error);
  CHECK_THROWS_WITH_AS(SimLoader({}, {-1.0, 0, 0}), doctest::Contains("a_s = -1"), error);
}

namespace {
// A store whose entries vanish between lookup and fetch (eviction, a store going away).
class VanishingStore : public SimulatedStore {
 public:
  using SimulatedStore::SimulatedStore;
  std::optional<KVBlock> get(const KVKey& key) {
    if (++gets_ > survive_) return std::nullopt;
    return SimulatedStore::get(key);
  }
  int survive_ = 1;

 private:
  int gets_ = 0;
};
static_assert(CostModeledStore<VanishingStore>);
}  // namespace

TEST_CASE("a store entry that vanishes mid-request: compute covers the rest, nothing is lost") {
  const auto tokens = iota_tokens(16);
  for (LoaderMode mode : {LoaderMode::adaptive, LoaderMode::load_only}) {
    SimulatedCompute c({1.0, 0.0, 2}, ResourceTrace::constant(1, kTwoTokensPerSecondGbps));
    VanishingStore s({0.0, 1}, ResourceTrace::constant(1, kTwoTokensPerSecondGbps));
    store_prefix(s, c.model_fingerprint(), tokens, 2, 8);
    const LoaderTrace t = BidirectionalLoader<SimulatedCompute, VanishingStore>({2, 2, mode}).run(c, s, tokens);
    CHECK(t.load_failure.find("missing") != std::string::npos);
    CHECK(t.loaded_tokens == 2);  // the one fetch that succeeded: [14, 16)
    CHECK(t.meet_token == 14);
    CHECK(c.resident_prefix() == 16);
  }
}

TEST_CASE("never slower than the best single resource by more than one chunk; close to the oracle") {
  std::mt19937_64 rng(1234);
  std::uniform_real_distribution<double> u(0.0, 1.0);
  // 300 random configurations; 30 under the sanitizers (an ASan build took 60 s for the 300).
  const int trials = kvfuse_test::kSanitized ? 30 : 300;
  for (int trial = 0; trial < trials; ++trial) {
    const std::int64_t compute_chunk = std::int64_t{64} << (rng() % 4);
    const std::int64_t fetch_chunk = std::int64_t{16} << (rng() % 4);
    const std::int64_t n = 256 + static_cast<std::int64_t>(rng() % 4096);
    const double a = 0.001 + 0.1 * u(rng), b = 0.01 * u(rng) * u(rng);
    const double share = 0.05 + 0.95 * u(rng);
    const double gbps = 0.5 + 100 * u(rng) * u(rng);
    const double latency = 0.002 * u(rng);
    const std::int64_t kv_bytes = 100'000 + static_cast<std::int64_t>(u(rng) * 900'000);
    const ComputeCostModel cost{a, b, compute_chunk};
    const LinkCostModel link{latency, kv_bytes};
    const auto trace = ResourceTrace::constant(share, gbps);
    const LoaderEstimate est{a / share, b / share,
                             latency + static_cast<double>(fetch_chunk * kv_bytes) * 8 / (gbps * 1e9)};
    const auto tokens = iota_tokens(n);
    auto run = [&](LoaderMode mode) {
      SimulatedCompute compute(cost, trace);
      SimulatedStore store(link, trace);
      store_prefix(store, compute.model_fingerprint(), tokens, fetch_chunk, static_cast<std::size_t>(n));
      const LoaderTrace t = SimLoader({compute_chunk, fetch_chunk, mode}, est).run(compute, store, tokens);
      REQUIRE(compute.resident_prefix() == n);
      return std::pair{t, best_static_split(compute, store, tokens, n, {compute_chunk, fetch_chunk})};
    };
    const auto [cake, oracle] = run(LoaderMode::adaptive);
    const double c_only = run(LoaderMode::compute_only).first.ready_s;
    const double l_only = run(LoaderMode::load_only).first.ready_s;
    // The baselines against closed forms: compute-only = sum over chunks of (a + b i) * size / C / share,
    // load-only = one fetch per fetch chunk, sized, back to back.
    double c_expected = 0;
    for (std::int64_t b0 = 0; b0 < n; b0 += compute_chunk)
      c_expected += (a + b * static_cast<double>(b0 / compute_chunk)) *
                    static_cast<double>(std::min(compute_chunk, n - b0)) / static_cast<double>(compute_chunk) / share;
    double l_expected = 0;
    for (std::int64_t b0 = 0; b0 < n; b0 += fetch_chunk)
      l_expected += latency + static_cast<double>(std::min(fetch_chunk, n - b0) * kv_bytes) * 8 / (gbps * 1e9);
    CHECK(c_only == doctest::Approx(c_expected).epsilon(1e-9));
    CHECK(l_only == doctest::Approx(l_expected).epsilon(1e-9));
    CHECK(oracle.ready_s <= std::min(c_only, l_only) * (1 + 1e-12));
    const double last_chunk = (a + b * static_cast<double>((n - 1) / compute_chunk)) / share;
    const double fetch = est.fetch_chunk_s;
    const double one_chunk = std::max(last_chunk, fetch);
    INFO("trial " << trial << " n=" << n << " C=" << compute_chunk << " F=" << fetch_chunk);
    CHECK(cake.ready_s <= std::min(c_only, l_only) + one_chunk + 1e-9);
    CHECK(cake.ready_s <= 1.02 * oracle.ready_s + one_chunk + 1e-9);
  }
}

// ------------------------------------------------------------------------------------------ real threads
namespace {

// A compute backend with real data: the "KV" of token t is a hash of tokens [0, t], so it depends on the
// whole prefix like real KV, and a wrong assembly shows. Each chunk also takes real time.
class PrefixHashCompute {
 public:
  explicit PrefixHashCompute(std::vector<token_id> tokens, std::chrono::microseconds per_chunk)
      : tokens_(std::move(tokens)), kv_(tokens_.size(), 0), have_(tokens_.size(), 0), per_chunk_(per_chunk) {}

  [[nodiscard]] std::uint64_t model_fingerprint() const noexcept { return 0xC0FFEE; }

  void compute_kv(TokenRange r) {
    for (std::int64_t t = r.begin; t < r.end; ++t) {
      const std::uint64_t prev = t == 0 ? kHashSeed : kv_.at(static_cast<std::size_t>(t - 1));
      detail::require(t == 0 || have_[static_cast<std::size_t>(t - 1)], "token {} computed before its prefix", t);
      kv_[static_cast<std::size_t>(t)] = hash_tokens(std::span(&tokens_[static_cast<std::size_t>(t)], 1), prev);
      have_[static_cast<std::size_t>(t)] = 1;
    }
    std::this_thread::sleep_for(per_chunk_);
  }
  void install_kv(TokenRange r, const KVBlock& block) {
    REQUIRE(block.bytes.size() == static_cast<std::size_t>(r.size()) * sizeof(std::uint64_t));
    std::memcpy(&kv_[static_cast<std::size_t>(r.begin)], block.bytes.data(), block.bytes.size());
    for (std::int64_t t = r.begin; t < r.end; ++t) have_[static_cast<std::size_t>(t)] = 1;
  }

  [[nodiscard]] std::vector<std::uint64_t> full_prefill() const {
    PrefixHashCompute fresh(tokens_, std::chrono::microseconds(0));
    fresh.compute_kv({0, static_cast<std::int64_t>(tokens_.size())});
    return fresh.kv_;
  }
  [[nodiscard]] const std::vector<std::uint64_t>& kv() const { return kv_; }
  [[nodiscard]] bool all_resident() const {
    return std::all_of(have_.begin(), have_.end(), [](char h) { return h != 0; });
  }

 private:
  std::vector<token_id> tokens_;
  std::vector<std::uint64_t> kv_;
  std::vector<char> have_;
  std::chrono::microseconds per_chunk_;
};
static_assert(ComputeBackend<PrefixHashCompute>);

// A store that sleeps per get (a slow link) and can go away after a number of gets.
class SlowStore : public InMemoryKVStore {
 public:
  std::optional<KVBlock> get(const KVKey& key) {
    std::this_thread::sleep_for(std::chrono::microseconds(300));
    if (fail_after >= 0 && gets_++ >= fail_after) throw std::runtime_error("connection reset by peer");
    return InMemoryKVStore::get(key);
  }
  int fail_after = -1;

 private:
  std::atomic<int> gets_{0};
};
static_assert(KVStore<SlowStore> && !CostModeledStore<SlowStore>);

void fill_store(SlowStore& store, const PrefixHashCompute& compute, const std::vector<token_id>& tokens,
                std::int64_t fetch, std::int64_t stored_tokens) {
  const auto full = compute.full_prefill();
  const auto keys = prefix_chunk_keys(compute.model_fingerprint(), tokens, fetch);
  for (std::int64_t b = 0; b < stored_tokens; b += fetch) {
    const std::int64_t e = std::min(stored_tokens, b + fetch);
    KVBlock block{e - b, std::vector<std::byte>(static_cast<std::size_t>(e - b) * sizeof(std::uint64_t))};
    std::memcpy(block.bytes.data(), &full[static_cast<std::size_t>(b)], block.bytes.size());
    store.put(keys[static_cast<std::size_t>(b / fetch)], std::move(block));
  }
}

}  // namespace

TEST_CASE("real threads: loaded and computed KV assemble to exactly the full prefill") {
  const auto tokens = iota_tokens(1000);
  for (LoaderMode mode : {LoaderMode::adaptive, LoaderMode::bidirectional, LoaderMode::load_only,
                          LoaderMode::compute_only}) {
    PrefixHashCompute compute(tokens, std::chrono::microseconds(500));
    SlowStore store;
    fill_store(store, compute, tokens, 32, 800);  // a stored prefix of 800 tokens, the rest is new
    const LoaderTrace t = run_threaded(BidirectionalLoader<PrefixHashCompute, SlowStore>({64, 32, mode}), compute, store, tokens);
    CHECK(t.stored_tokens == 800);
    CHECK(t.computed_tokens + t.loaded_tokens == 1000);
    CHECK(t.load_failure.empty());
    CHECK(compute.all_resident());
    CHECK(compute.kv() == compute.full_prefill());
    if (mode == LoaderMode::load_only) CHECK(t.loaded_tokens == 800);
    if (mode == LoaderMode::compute_only) CHECK(t.loaded_tokens == 0);
  }
}

TEST_CASE("real threads: a store that goes away mid-request loses nothing") {
  const auto tokens = iota_tokens(600);
  PrefixHashCompute compute(tokens, std::chrono::microseconds(2000));
  SlowStore store;
  fill_store(store, compute, tokens, 32, 600);
  store.fail_after = 3;
  const LoaderTrace t = run_threaded(BidirectionalLoader<PrefixHashCompute, SlowStore>({64, 32}), compute, store, tokens);
  CHECK(t.load_failure.find("connection reset by peer") != std::string::npos);
  CHECK(compute.kv() == compute.full_prefill());
  CHECK(t.loaded_tokens <= 3 * 32);
}

TEST_CASE("real threads: a stored block of the wrong size is refused, not installed") {
  const auto tokens = iota_tokens(256);
  PrefixHashCompute compute(tokens, std::chrono::microseconds(100));
  SlowStore store;
  fill_store(store, compute, tokens, 32, 256);
  const auto keys = prefix_chunk_keys(compute.model_fingerprint(), tokens, 32);
  store.put(keys.back(), KVBlock{5, std::vector<std::byte>(40)});
  const LoaderTrace t =
      run_threaded(BidirectionalLoader<PrefixHashCompute, SlowStore>({64, 32, LoaderMode::load_only}), compute, store, tokens);
  CHECK(t.load_failure.find("holds 5 tokens, expected 32") != std::string::npos);
  CHECK(t.loaded_tokens == 0);
  CHECK(compute.kv() == compute.full_prefill());
}

TEST_CASE("the guarantee holds under time-varying GPU share and bandwidth") {
  // Random step traces; "one chunk's time" is the longest single step actually seen in the run.
  std::mt19937_64 rng(99);
  std::uniform_real_distribution<double> u(0.0, 1.0);
  const std::int64_t n = 4096, compute_chunk = 512, fetch_chunk = 128, kv_bytes = 800'000;
  const auto tokens = iota_tokens(n);
  for (int trial = 0; trial < 60; ++trial) {
    std::vector<TracePoint> points;
    double t = 0;
    for (int i = 0; i < 30; ++i) {
      points.push_back({t, 0.05 + 0.95 * u(rng), 1 + 30 * u(rng)});
      t += 0.02 + 0.2 * u(rng);
    }
    const ResourceTrace trace(points);
    const ComputeCostModel cost{0.005 + 0.03 * u(rng), 0.002 * u(rng), compute_chunk};
    const LoaderEstimate est{cost.a_s / points[0].gpu_share, cost.b_s / points[0].gpu_share,
                             static_cast<double>(fetch_chunk * kv_bytes) * 8 / (points[0].bandwidth_gbps * 1e9)};
    auto run = [&](LoaderMode mode) {
      SimulatedCompute compute(cost, trace);
      SimulatedStore store({0.0, kv_bytes}, trace);
      store_prefix(store, compute.model_fingerprint(), tokens, fetch_chunk, static_cast<std::size_t>(n));
      LoaderTrace result = SimLoader({compute_chunk, fetch_chunk, mode}, est).run(compute, store, tokens);
      REQUIRE(compute.resident_prefix() == n);
      return std::pair{result, best_static_split(compute, store, tokens, n, {compute_chunk, fetch_chunk})};
    };
    const auto [cake, oracle] = run(LoaderMode::adaptive);
    const LoaderTrace c_only = run(LoaderMode::compute_only).first;
    const LoaderTrace l_only = run(LoaderMode::load_only).first;
    double one_chunk = 0;
    for (const LoaderTrace* r : {&cake, &c_only, &l_only})
      for (const LoaderStep& s : r->steps) one_chunk = std::max(one_chunk, s.end_s - s.start_s);
    INFO("trial " << trial);
    CHECK(cake.ready_s <= std::min(c_only.ready_s, l_only.ready_s) + one_chunk + 1e-9);
    CHECK(cake.ready_s <= 1.02 * oracle.ready_s + one_chunk + 1e-9);
  }
}

TEST_CASE("CakeRace: after one wait, the idle budget left still gates later chunks") {
  // Compute chunk (4 tokens) estimated 10 s, fetch (4 tokens) 1 s; 16 stored tokens.
  detail::CakeRace race({4, 4, LoaderMode::adaptive}, {10.0, 0.0, 1.0}, 16, 16);
  TokenRange r;
  REQUIRE(race.next_fetch() == TokenRange{12, 16});
  // t=0: loads predicted to reach 0 at 1 + 3 = 4 s, compute [0,4) at 10 s: wait (budget 10 s).
  CHECK(race.decide_compute(0.0, 0.0, r) == detail::CakeRace::Decision::wait);
  // t=4: the fetch overran (4 s so far), assume 4 s each: reach 0 at 8 + 12 = 20 s > 14 s: start.
  CHECK(race.decide_compute(4.0, 0.0, r) == detail::CakeRace::Decision::start);
  race.compute_started(4.0);  // 4 s of the 10 s budget used
  race.fetch_done({12, 16}, 0.0, 5.0);
  race.fetch_done({8, 12}, 5.0, 6.0);
  race.compute_done({0, 4}, 4.0, 14.0);
  // t=14: [4,8) would end at 24 s; the fetch of [4,8) in flight since 13.5 s ends at 14.5 s: wait.
  CHECK(race.decide_compute(14.0, 13.5, r) == detail::CakeRace::Decision::wait);
  CHECK(r == TokenRange{4, 8});
  CHECK(race.idle_deadline() == doctest::Approx(20.0));  // 6 s of budget left
  // The budget runs out at 20 s: from then on the compute side starts regardless.
  CHECK(race.decide_compute(19.9, 13.5, r) == detail::CakeRace::Decision::wait);
  CHECK(race.decide_compute(20.0, 13.5, r) == detail::CakeRace::Decision::start);
}

}  // namespace unit_bidirectional_loader
