// serve: Cake's adaptive scheduling mode (Cake §3, §5.4) in a step loop on the reference CPU backend. Four
// requests share one token budget and one store behind a throttled link: a plain one and three Cake requests
// (two prefixes in memory, one of them stored whole, and one on disk). Whatever the race does, each request's
// greedy tokens are those of serving it alone (full prefill, then greedy decoding) and its prompt's KV and
// logits equal full prefill's to float rounding (chunked prefill groups rows differently); the trace shows
// decode first, plain prefill next, and Cake's compute side fed only from what was left.
#include <doctest/doctest.h>

#include <algorithm>
#include <cstdint>
#include <fstream>
#include <map>
#include <span>
#include <vector>

#include "kvfuse/cpu.hpp"
#include "kvfuse/runtime.hpp"

#include "../support/small_llama.hpp"
#include "../support/test_util.hpp"

using namespace kvfuse;

namespace {

using Session = CpuLlamaSession;
using Tiered = TieredKVStore<InMemoryKVStore, DiskKVStore>;
using Linked = ThrottledKVStore<Tiered>;

// The small random Llama of the CPU tests with an untied output head: with the tied one it predicts its input
// token, so greedy decoding would repeat one token and could not tell a wrong decode step from a right one.
CpuLlama small_untied_llama() {
  const LlamaConfig c = kvfuse_test::small_llama_config();
  LlamaWeights w = LlamaWeights::random(c, 1);
  w.output = LlamaWeights::random(c, 1001).token_embd;
  return CpuLlama(c, std::move(w), CpuLlamaOptions{2, 8});
}

constexpr std::int64_t kFetchChunk = 32;
constexpr std::int64_t kBudget = 48;

std::vector<token_id> make_prompt(std::size_t n, std::size_t salt) {
  std::vector<token_id> p(n);
  for (std::size_t i = 0; i < n; ++i) p[i] = static_cast<token_id>((i * 37 + salt * 11 + 5) % 96);
  return p;
}

// Serving a request alone: full prefill of its prompt, then greedy decoding.
struct Alone {
  LlamaPrefill full;
  std::vector<token_id> tokens;
};

Alone serve_alone(const CpuLlama& model, std::span<const token_id> prompt, std::int64_t decode) {
  Alone a{model.full_prefill(prompt), {}};
  LlamaKVCache kv = a.full.kv;
  a.tokens = model.greedy_decode(kv, a.full.logits, decode, -1);
  return a;
}

// The first `stored` tokens' KV (from full prefill) as prefix-cache entries of kFetchChunk tokens, as an
// earlier request would have left them (Cake appendix A, step 2).
template <KVStore S>
void store_prefix(const CpuLlama& model, std::span<const token_id> prompt, std::int64_t stored, S& store) {
  const LlamaPrefill full = model.full_prefill(prompt);
  const auto keys = prefix_chunk_keys(model.fingerprint(), prompt, kFetchChunk);
  for (std::int64_t b = 0; b < stored; b += kFetchChunk)
    store.put(keys[static_cast<std::size_t>(b / kFetchChunk)],
              full.kv.to_block({b, std::min(b + kFetchChunk, stored)}));
}

struct Spec {
  std::uint64_t id;
  std::size_t length;
  std::int64_t decode;
};

std::vector<ServedRequest<Session>> make_requests(const CpuLlama& model, const std::vector<Spec>& specs) {
  std::vector<ServedRequest<Session>> out;
  for (const Spec& s : specs) {
    std::vector<token_id> p = make_prompt(s.length, s.id);
    out.push_back({s.id, Session(model, p), p, s.decode});
  }
  return out;
}

// Property (a): every request's tokens equal serving it alone; its prompt KV and last-token logits equal full
// prefill's to rounding.
void check_same_as_alone(const CpuLlama& model, std::vector<ServedRequest<Session>>& requests, const ServingTrace& t) {
  REQUIRE(t.requests.size() == requests.size());
  for (std::size_t i = 0; i < requests.size(); ++i) {
    CAPTURE(requests[i].id);
    const Alone a = serve_alone(model, requests[i].prompt, requests[i].decode_tokens);
    CHECK(t.requests[i].tokens == a.tokens);
    CHECK(static_cast<std::int64_t>(t.requests[i].tokens.size()) == requests[i].decode_tokens);
    Session& s = requests[i].engine;
    REQUIRE(s.resident_prefix() == s.num_tokens());
    for (std::size_t l = 0; l < a.full.kv.k.size(); ++l) {
      CHECK(kvfuse_test::diff(s.kv().k[l], a.full.kv.k[l]).rounding());
      CHECK(kvfuse_test::diff(s.kv().v[l], a.full.kv.v[l]).rounding());
    }
    CHECK(kvfuse_test::diff(s.logits(), a.full.logits).rounding());
    const LoaderTrace& lt = t.requests[i].loader;
    CHECK(lt.computed_tokens + lt.loaded_tokens == s.num_tokens());
    CHECK(lt.stored_tokens < s.num_tokens());  // the last prompt token is always computed
  }
}

// Properties (b) and (c), replayed from the trace alone: decode first, one token to every request in decode
// state; plain prefill next, each getting all it asked for before Cake gets anything; Cake's compute side runs
// only with cached_prefill tokens, from the front, up to its meeting point; the budget is never exceeded.
void check_schedule(const std::vector<ServedRequest<Session>>& requests, const ServingTrace& t) {
  std::map<std::uint64_t, std::size_t> index;
  for (std::size_t i = 0; i < requests.size(); ++i) index[requests[i].id] = i;
  std::vector<std::int64_t> emitted(requests.size(), 0);
  std::vector<std::int64_t> front(requests.size(), 0);  // Cake: the compute side's front
  std::vector<std::int64_t> next(requests.size(), -1);  // plain prefill: the next token; -1 not in that phase
  std::vector<bool> prompt_done(requests.size(), false);
  const auto cake = [&](std::size_t i) { return t.requests[i].loader.stored_tokens > 0; };
  for (std::size_t i = 0; i < requests.size(); ++i)
    if (!cake(i)) next[i] = 0;
  for (std::size_t step = 0; step < t.steps.size(); ++step) {
    CAPTURE(step);
    const ServingStep& s = t.steps[step];
    for (std::uint64_t id : s.met) {
      const std::size_t i = index.at(id);
      REQUIRE(cake(i));
      CHECK(next[i] == -1);
      next[i] = t.requests[i].loader.stored_tokens;
    }
    // Who is in decode state, and what each plain prefill still needs: from the earlier steps alone.
    std::vector<std::uint64_t> decoding;
    std::int64_t plain_need = 0, plain_asked = 0;
    for (std::size_t i = 0; i < requests.size(); ++i) {
      if (prompt_done[i] && emitted[i] < requests[i].decode_tokens) decoding.push_back(requests[i].id);
      if (next[i] >= 0 && !prompt_done[i]) plain_need += static_cast<std::int64_t>(requests[i].prompt.size()) - next[i];
    }
    CHECK(s.decoding == decoding);
    for (const PrefillRequest& w : s.waiting) {
      const std::size_t i = index.at(w.id);
      CHECK(!prompt_done[i]);
      CHECK(w.cached_prefix == (next[i] == -1));
      if (w.cached_prefix) continue;
      CHECK(w.remaining_tokens == static_cast<std::int64_t>(requests[i].prompt.size()) - next[i]);
      plain_asked += w.remaining_tokens;
    }
    CHECK(plain_asked == plain_need);
    // (b) one decode token to each, first, and within the budget.
    REQUIRE(s.work.size() == s.plan.allocations.size());
    REQUIRE(s.plan.allocations.size() >= decoding.size());
    std::int64_t used = 0, plain_tokens = 0, cake_tokens = 0;
    for (std::size_t k = 0; k < s.plan.allocations.size(); ++k) {
      const BudgetAllocation& a = s.plan.allocations[k];
      CHECK(s.work[k].id == a.id);
      CHECK(s.work[k].use == a.use);
      CHECK((a.use == BudgetUse::decode) == (k < decoding.size()));
      if (k < decoding.size()) {
        CHECK(a.id == decoding[k]);
        CHECK(a.tokens == 1);
      }
      CHECK(a.tokens > 0);
      used += a.tokens;
      if (a.use == BudgetUse::prefill) plain_tokens += a.tokens;
      if (a.use == BudgetUse::cached_prefill) cake_tokens += a.tokens;
    }
    CHECK(used == s.plan.used_tokens);
    CHECK(used <= kBudget);
    // (c) Cake's compute side only gets what decodes and plain prefills left.
    if (cake_tokens > 0) {
      CHECK(plain_tokens == plain_need);
      CHECK(cake_tokens <= kBudget - static_cast<std::int64_t>(decoding.size()) - plain_need);
    }
    // What ran: replay it.
    for (std::size_t k = 0; k < s.work.size(); ++k) {
      const StepWork& w = s.work[k];
      const BudgetAllocation& a = s.plan.allocations[k];
      const std::size_t i = index.at(w.id);
      const auto n = static_cast<std::int64_t>(requests[i].prompt.size());
      if (w.use == BudgetUse::decode) {
        CHECK(w.computed.empty());
        REQUIRE(w.token.has_value());
      } else if (w.use == BudgetUse::prefill) {
        REQUIRE(next[i] >= 0);
        CHECK(w.computed == TokenRange{next[i], next[i] + a.tokens});
        next[i] = w.computed.end;
        if (next[i] == n) prompt_done[i] = true;
        CHECK(w.token.has_value() == (prompt_done[i] && requests[i].decode_tokens > 0));
      } else {
        REQUIRE(cake(i));
        CHECK(next[i] == -1);
        CHECK(!w.token.has_value());
        CHECK(w.computed.size() <= a.tokens);
        if (!w.computed.empty()) {
          CHECK(w.computed.begin == front[i]);
          front[i] = w.computed.end;
        }
      }
      if (w.token) {
        REQUIRE(emitted[i] < static_cast<std::int64_t>(t.requests[i].tokens.size()));
        CHECK(*w.token == t.requests[i].tokens[static_cast<std::size_t>(emitted[i])]);
        if (emitted[i] == 0) CHECK(t.requests[i].first_token_step == static_cast<std::int64_t>(step));
        ++emitted[i];
        if (emitted[i] == requests[i].decode_tokens) CHECK(t.requests[i].last_step == static_cast<std::int64_t>(step));
      }
    }
    for (const LandedLoad& l : s.landed) {  // each a load of the request's loader trace
      const LoaderTrace& lt = t.requests[index.at(l.id)].loader;
      CHECK(std::any_of(lt.steps.begin(), lt.steps.end(),
                        [&](const LoaderStep& x) { return x.source == KVSource::prefix && x.tokens == l.tokens; }));
    }
  }
  for (std::size_t i = 0; i < requests.size(); ++i) {
    CAPTURE(requests[i].id);
    CHECK(prompt_done[i]);
    CHECK(emitted[i] == requests[i].decode_tokens);
    const LoaderTrace& lt = t.requests[i].loader;
    // The compute side's front is the meeting point: Cake computed [0, meet) from the front, only with
    // cached_prefill tokens, and loaded [meet, stored).
    CHECK(front[i] == lt.meet_token);
    const auto n = static_cast<std::int64_t>(requests[i].prompt.size());
    CHECK(lt.computed_tokens == lt.meet_token + n - lt.stored_tokens);
  }
}

}  // namespace

TEST_CASE("decode_step: one greedy token per call, the same as generate") {
  const CpuLlama model = small_untied_llama();
  const std::vector<token_id> p = make_prompt(40, 3);
  Session a(model, p), b(model, p);
  a.compute_kv({0, 40});
  b.compute_kv({0, 40});
  const std::vector<token_id> expected = b.generate(5, -1);
  std::vector<token_id> got;
  for (int i = 0; i < 5; ++i) got.push_back(a.decode_step());
  CHECK(got == expected);
  CHECK(a.kv().num_rows() == 40);  // the prompt's KV is left alone
  CHECK(a.generate(5, -1) == expected);
}

TEST_CASE("serve: a plain request and three Cake requests in one step loop, each as if served alone") {
  const CpuLlama model = small_untied_llama();
  kvfuse_test::TempDir dir;
  InMemoryKVStore memory;
  DiskKVStore disk(dir.path);
  Tiered tiered(memory, disk);
  // 768 B of KV per token: a 32-token chunk is 24 KB, about 0.7 ms at 50 MB/s with 0.2 ms latency, a step of
  // the budget about as long: the two sides of a Cake request meet somewhere in the middle (where, the test
  // does not depend on).
  Linked store(tiered, {50.0, 0.2});
  const std::vector<Spec> specs{{1, 100, 4}, {2, 200, 3}, {3, 128, 5}, {4, 180, 3}};
  store_prefix(model, make_prompt(200, 2), 160, memory);
  store_prefix(model, make_prompt(128, 3), 128, memory);  // the whole prompt: its last chunk is computed
  store_prefix(model, make_prompt(180, 4), 128, disk);
  // compute_only: Cake requests that load nothing, so their compute side surely runs on what is left.
  for (LoaderMode mode : {LoaderMode::bidirectional, LoaderMode::adaptive, LoaderMode::compute_only}) {
    CAPTURE(static_cast<int>(mode));
    std::vector<ServedRequest<Session>> run = make_requests(model, specs);
    const ServingTrace t = serve(TokenBudgetScheduler({kBudget}),
                                 BidirectionalLoader<Session, Linked>({kBudget, kFetchChunk, mode}), run, store);
    CHECK(t.requests[0].loader.stored_tokens == 0);
    CHECK(t.requests[1].loader.stored_tokens == 160);
    CHECK(t.requests[2].loader.stored_tokens == 96);
    CHECK(t.requests[3].loader.stored_tokens == 128);
    for (const ServedRequestTrace& r : t.requests) CHECK(r.loader.load_failure.empty());
    if (mode == LoaderMode::compute_only)
      for (const ServedRequestTrace& r : t.requests) CHECK(r.loader.loaded_tokens == 0);
    // The plain request's 100 tokens fill the first two steps: no Cake compute there.
    for (std::size_t step = 0; step < 2; ++step)
      for (const BudgetAllocation& a : t.steps[step].plan.allocations) CHECK(a.use == BudgetUse::prefill);
    check_schedule(run, t);
    check_same_as_alone(model, run, t);
  }
}

TEST_CASE("serve: a stored entry evicted or corrupt mid-run is computed instead, with the same output") {
  const CpuLlama model = small_untied_llama();
  kvfuse_test::TempDir dir;
  DiskKVStore disk(dir.path);
  std::vector<ServedRequest<Session>> requests = make_requests(model, {{1, 100, 3}, {2, 200, 4}});
  store_prefix(model, requests[1].prompt, 160, disk);
  const auto keys = prefix_chunk_keys(model.fingerprint(), requests[1].prompt, kFetchChunk);
  // Load-only: the compute side waits for the loads, which go from the back: chunks 4 and 3 land, chunk 2
  // fails, and compute covers [0, 96).
  const LoaderConfig load_only{kBudget, kFetchChunk, LoaderMode::load_only};
  SUBCASE("evicted after the lookup") {
    struct Evicting {  // the first load evicts chunk 2, as an eviction racing the loads would
      DiskKVStore* inner;
      KVKey victim;
      bool contains(const KVKey& k) const { return inner->contains(k); }
      std::vector<bool> contains_many(std::span<const KVKey> ks) const { return inner->contains_many(ks); }
      std::optional<KVBlock> get(const KVKey& k) {
        inner->erase(victim);
        return inner->get(k);
      }
      std::vector<std::optional<KVBlock>> get_many(std::span<const KVKey> ks) {
        inner->erase(victim);
        return inner->get_many(ks);
      }
      void put(const KVKey& k, KVBlock b) { inner->put(k, std::move(b)); }
      bool erase(const KVKey& k) { return inner->erase(k); }
    } store{&disk, keys[2]};
    const ServingTrace t =
        serve(TokenBudgetScheduler({kBudget}), BidirectionalLoader<Session, Evicting>(load_only), requests, store);
    CHECK(t.requests[1].loader.load_failure.find("tokens [64, 96) is missing") != std::string::npos);
    CHECK(t.requests[1].loader.loaded_tokens == 64);
    check_schedule(requests, t);
    check_same_as_alone(model, requests, t);
  }
  SUBCASE("a corrupt file") {
    {  // one payload byte (the payload ends the file) flipped
      std::fstream f(disk.path_for(keys[2]), std::ios::in | std::ios::out | std::ios::binary);
      f.seekg(-5, std::ios::end);
      const auto byte = static_cast<char>(~f.get());
      f.seekp(-5, std::ios::end);
      f.put(byte);
    }
    const ServingTrace t =
        serve(TokenBudgetScheduler({kBudget}), BidirectionalLoader<Session, DiskKVStore>(load_only), requests, disk);
    CHECK(t.requests[1].loader.load_failure.find("tokens [64, 96) is missing") != std::string::npos);
    CHECK(t.requests[1].loader.loaded_tokens == 64);
    CHECK(disk.rejected() == 1);
    check_schedule(requests, t);
    check_same_as_alone(model, requests, t);
  }
}

TEST_CASE("serve refuses bad requests by name and rethrows an engine's error after stopping the loads") {
  const CpuLlama model = small_untied_llama();
  InMemoryKVStore store;
  const BidirectionalLoader<Session, InMemoryKVStore> loader({kBudget, kFetchChunk});
  const TokenBudgetScheduler scheduler({kBudget});
  const std::vector<token_id> p = make_prompt(64, 1);
  auto one = [&](std::uint64_t id, std::vector<token_id> prompt, std::int64_t decode) {
    return ServedRequest<Session>{id, Session(model, p), std::move(prompt), decode};
  };
  {
    std::vector<ServedRequest<Session>> r;
    r.push_back(one(7, p, 1));
    r.push_back(one(8, p, 1));
    r.push_back(one(7, p, 1));
    CHECK_THROWS_WITH_AS(serve(scheduler, loader, r, store), doctest::Contains("request id 7 is used twice"), error);
  }
  {
    std::vector<ServedRequest<Session>> r;
    r.push_back(one(3, {}, 1));
    CHECK_THROWS_WITH_AS(serve(scheduler, loader, r, store), doctest::Contains("request 3 has an empty prompt"), error);
  }
  {
    std::vector<ServedRequest<Session>> r;
    r.push_back(one(4, p, -2));
    CHECK_THROWS_WITH_AS(serve(scheduler, loader, r, store), doctest::Contains("decode_tokens = -2"), error);
  }
  {
    // A Cake request with loads to do, and an engine holding another prompt than its request says.
    std::vector<ServedRequest<Session>> r;
    r.push_back(one(5, make_prompt(100, 1), 1));
    std::vector<ServedRequest<Session>> cake = make_requests(model, {{6, 200, 1}});
    store_prefix(model, cake[0].prompt, 192, store);
    r.push_back(std::move(cake[0]));
    CHECK_THROWS_WITH_AS(serve(scheduler, loader, r, store), doctest::Contains("is not inside [0, 64)"), error);
  }
}
