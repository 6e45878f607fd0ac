// CpuBatchEngine's Cake requests (Cake §3, §4, §5.4, appendix B): a full-prefill request whose prompt has stored
// prefix entries loads them from the back on the engine's Cake I/O thread while its compute side advances from the
// front with what the token budget leaves; where they meet the loaded KV is installed and the rest is chunked
// prefill. Batched with plain, fusion and decoding requests behind a throttled link, every request gets the tokens
// it gets alone, wherever the sides meet; a failed load is computed instead and changes no other request; each
// step's plan is decode first, then chunked prefill, then Cake's compute side, within the budget.
#include <doctest/doctest.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <fstream>
#include <functional>
#include <map>
#include <set>
#include <span>
#include <vector>

#include "kvfuse/cpu.hpp"

#include "../support/fusion_prompts.hpp"
#include "../support/small_llama.hpp"
#include "../support/test_util.hpp"

// Each unit test file lives in its own namespace: the files are compiled together (a unity build).
namespace unit_batch_engine_cake {

using namespace kvfuse;

namespace {

using Tiered = TieredKVStore<InMemoryKVStore, DiskKVStore>;
using Linked = ThrottledKVStore<Tiered>;

// The small random Llama of the CPU tests with an untied output head: with the tied one it predicts its input
// token, so greedy decoding would repeat one token and could not tell a wrong step from a right one.
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

GenerationRequest full_request(std::vector<token_id> tokens, std::int64_t decode, double temperature = 0.0) {
  GenerationRequest r;
  const auto n = static_cast<std::int64_t>(tokens.size());
  r.layout = PromptLayout::from_lengths({n - 8}, 8);
  r.tokens = std::move(tokens);
  r.max_new_tokens = decode;
  r.temperature = temperature;
  r.seed = 9;
  return r;
}

// The first `stored` tokens' KV (full prefill's) as prefix entries of kFetchChunk tokens, as an earlier request
// would have left them (Cake appendix A, step 2).
template <class S>
void store_prefix(const CpuLlama& model, std::span<const token_id> prompt, std::int64_t stored, S& store) {
  const LlamaPrefill full = model.full_prefill(prompt);
  const auto keys = prefix_chunk_keys(model.fingerprint(), prompt, kFetchChunk);
  for (std::int64_t b = 0; b < stored; b += kFetchChunk)
    store.put(keys[static_cast<std::size_t>(b / kFetchChunk)],
              full.kv.to_block({b, std::min(b + kFetchChunk, stored)}));
}

struct Run {
  std::map<std::uint64_t, std::vector<token_id>> tokens;
  std::map<std::uint64_t, RequestMetrics> metrics;
  std::int64_t cake_rows = 0;  // summed over the steps
};

// Every request submitted before the first step, in order (ids 1, 2, ...), run to the end; `each_step` sees every
// step's stats and events.
template <class Store>
Run run_all(CpuBatchEngine<Store>& engine, const std::vector<GenerationRequest>& requests,
            const std::function<void(const StepStats&, const std::vector<TokenEvent>&)>& each_step = {}) {
  Run out;
  for (const GenerationRequest& r : requests) out.tokens[engine.submit(r)];
  for (int step = 0; !engine.idle(); ++step) {
    const std::vector<TokenEvent> events = engine.step();
    for (const TokenEvent& e : events) {
      REQUIRE_MESSAGE(e.status == Status::success, e.error);
      if (e.token) out.tokens[e.request].push_back(*e.token);
      if (e.finish != FinishReason::none) out.metrics[e.request] = e.metrics;
    }
    out.cake_rows += engine.last_step().cake_rows;
    if (each_step) each_step(engine.last_step(), events);
    REQUIRE(step < 100000);
  }
  return out;
}

// The tokens of `r` served alone by an engine over an empty store: plain chunked prefill, then decoding.
std::vector<token_id> alone(const CpuLlama& model, const GenerationRequest& r) {
  InMemoryKVStore empty;
  CpuBatchEngine<InMemoryKVStore> engine(model, empty, {{kBudget}, {}, 64});
  return run_all(engine, {r}).tokens.at(1);
}

BatchEngineConfig cake_config(LoaderMode mode) {
  BatchEngineConfig c{{kBudget}, {}, 64};
  c.cake.fetch_chunk = kFetchChunk;
  c.cake.mode = mode;
  return c;
}

// Checks one step's plan (Cake §3, §5.4): one token to every decoding request first, then chunked prefill in
// arrival order, then Cake's compute side, within the budget; a Cake allocation only once every plain prefill got
// all it still needed. `remaining` tracks the plain full requests' prompts (ids not in `cake`).
void check_plan(const StepStats& s, const std::set<std::uint64_t>& decoding, const std::set<std::uint64_t>& cake,
                std::map<std::uint64_t, std::int64_t>& remaining) {
  const StepPlan& p = s.plan;
  std::size_t k = 0;
  for (; k < p.allocations.size() && p.allocations[k].use == BudgetUse::decode; ++k) {
    CHECK(p.allocations[k].tokens == 1);
    CHECK(decoding.count(p.allocations[k].id) == 1);
  }
  CHECK(k == decoding.size());
  bool cake_seen = false;
  std::int64_t cake_tokens = 0;
  for (; k < p.allocations.size(); ++k) {
    const BudgetAllocation& a = p.allocations[k];
    CHECK(a.use != BudgetUse::decode);
    CHECK(a.tokens > 0);
    if (a.use == BudgetUse::cached_prefill) {
      CHECK(cake.count(a.id) == 1);
      cake_seen = true;
      cake_tokens += a.tokens;
    } else {
      CHECK_FALSE(cake_seen);  // plain prefill before every Cake compute side
      if (remaining.count(a.id) != 0) remaining[a.id] -= a.tokens;
    }
  }
  CHECK(p.used_tokens <= kBudget);
  CHECK(s.cake_rows <= cake_tokens);
  if (cake_seen)
    for (const auto& [id, left] : remaining) CHECK(left == 0);
}

}  // namespace

TEST_CASE("CpuBatchEngine: Cake requests batched with plain, fusion and decoding requests get their tokens alone") {
  const CpuLlama model = small_untied_llama();
  kvfuse_test::TempDir dir;
  InMemoryKVStore memory;
  DiskKVStore disk(dir.path);
  Tiered tiered(memory, disk);
  // 768 B of KV per token: a 32-token chunk is 24 KB, about 0.7 ms at 50 MB/s with 0.2 ms latency, a step of the
  // budget about as long: the two sides of a Cake request meet somewhere in the middle (where, the test does not
  // depend on).
  Linked store(tiered, {50.0, 0.2});
  store_prefix(model, make_prompt(200, 2), 160, memory);
  store_prefix(model, make_prompt(128, 3), 128, memory);  // the whole prompt: its last chunk is computed
  store_prefix(model, make_prompt(180, 4), 128, disk);
  const kvfuse_test::Prompt fused = kvfuse_test::assemble({kvfuse_test::kSystem, kvfuse_test::kA, kvfuse_test::kB},
                                                          kvfuse_test::kQuery);
  {
    CpuLlamaFusion engine(model);
    FusionPipeline pipeline(engine, memory);
    pipeline.store_chunk_caches(fused.tokens, fused.layout);
  }
  GenerationRequest blend;
  blend.tokens = fused.tokens;
  blend.layout = fused.layout;
  blend.method = parse_method("cacheblend");
  blend.max_new_tokens = 4;
  const std::vector<GenerationRequest> requests{full_request(make_prompt(100, 1), 4),
                                                full_request(make_prompt(200, 2), 3),
                                                full_request(make_prompt(128, 3), 5, 0.8),  // sampled
                                                blend,
                                                full_request(make_prompt(180, 4), 3)};
  const std::set<std::uint64_t> cake{2, 3, 5};
  std::vector<std::vector<token_id>> expected;
  for (const GenerationRequest& r : requests) expected.push_back(alone(model, r));
  {  // the reference itself: full prefill and greedy decoding
    const LlamaPrefill full = model.full_prefill(requests[1].tokens);
    LlamaKVCache kv = full.kv;
    CHECK(expected[1] == model.greedy_decode(kv, full.logits, 3, -1));
  }
  {  // the fusion request alone, over the store with its chunk caches
    CpuBatchEngine<Linked> engine(model, store, cake_config(LoaderMode::adaptive));
    expected[3] = run_all(engine, {blend}).tokens.at(1);
  }
  // compute_only: Cake requests that load nothing, so their compute side surely runs on what is left.
  for (LoaderMode mode :
       {LoaderMode::bidirectional, LoaderMode::adaptive, LoaderMode::compute_only, LoaderMode::load_only}) {
    CAPTURE(static_cast<int>(mode));
    CpuBatchEngine<Linked> engine(model, store, cake_config(mode));
    const Run run = run_all(engine, requests);
    std::int64_t meets = 0;
    for (std::uint64_t id = 1; id <= requests.size(); ++id) {
      CAPTURE(id);
      CHECK(run.tokens.at(id) == expected[id - 1]);
      const RequestMetrics& m = run.metrics.at(id);
      CHECK(m.stored_prefix == std::map<std::uint64_t, std::int64_t>{{2, 160}, {3, 96}, {5, 128}}[id]);
      if (cake.count(id) == 0) continue;
      CHECK(m.meet_token + m.loaded_tokens == m.stored_prefix);
      CHECK(m.recomputed_rows == doctest::Approx(static_cast<double>(m.prompt_tokens - m.loaded_tokens)));
      if (mode == LoaderMode::compute_only) CHECK(m.loaded_tokens == 0);
      if (mode == LoaderMode::load_only) CHECK(m.meet_token == 0);
      meets += m.meet_token;
    }
    CHECK(run.cake_rows == meets);  // Cake's compute sides computed exactly up to their meeting points
  }
}

TEST_CASE("CpuBatchEngine: a Cake request's failed load is computed instead and leaves the other requests unchanged") {
  const CpuLlama model = small_untied_llama();
  kvfuse_test::TempDir dir;
  DiskKVStore disk(dir.path);
  const std::vector<GenerationRequest> requests{full_request(make_prompt(100, 1), 3),
                                                full_request(make_prompt(200, 2), 4),
                                                full_request(make_prompt(150, 5), 3)};
  store_prefix(model, requests[1].tokens, 160, disk);
  store_prefix(model, requests[2].tokens, 128, disk);
  const auto keys = prefix_chunk_keys(model.fingerprint(), requests[1].tokens, kFetchChunk);
  {  // one payload byte (the payload ends the file) of request 2's chunk [64, 96) flipped
    std::fstream f(disk.path_for(keys[2]), std::ios::in | std::ios::out | std::ios::binary);
    f.seekg(-5, std::ios::end);
    const auto byte = static_cast<char>(~f.get());
    f.seekp(-5, std::ios::end);
    f.put(byte);
  }
  // Load-only: the compute sides wait for their loads, which go from the back: request 2's chunks 4 and 3 land,
  // chunk 2 fails, and compute covers [0, 96); request 3 loads its whole prefix.
  CpuBatchEngine<DiskKVStore> engine(model, disk, cake_config(LoaderMode::load_only));
  const Run run = run_all(engine, requests);
  CHECK(disk.rejected() == 1);
  CHECK(run.metrics.at(2).stored_prefix == 160);
  CHECK(run.metrics.at(2).meet_token == 96);
  CHECK(run.metrics.at(2).loaded_tokens == 64);
  CHECK(run.metrics.at(3).loaded_tokens == 128);
  for (std::uint64_t id = 1; id <= requests.size(); ++id) {
    CAPTURE(id);
    CHECK(run.tokens.at(id) == alone(model, requests[id - 1]));
  }
}

TEST_CASE("CpuBatchEngine with store_prefixes: a full prefill leaves its prompt's whole grid chunks as prefix entries "
          "(full prefill's KV), and a later prompt that extends it is a Cake request that gets its tokens alone") {
  const CpuLlama model = small_untied_llama();
  const GenerationRequest first = full_request(make_prompt(100, 7), 3);
  std::vector<token_id> longer = first.tokens;  // the next turn of a conversation: the same tokens, then more
  for (token_id t : make_prompt(60, 8)) longer.push_back(t);
  const GenerationRequest second = full_request(longer, 4);
  const auto keys = prefix_chunk_keys(model.fingerprint(), first.tokens, kFetchChunk);
  const auto longer_keys = prefix_chunk_keys(model.fingerprint(), second.tokens, kFetchChunk);
  REQUIRE(keys.size() == 4);  // [0, 32), [32, 64), [64, 96) and the shorter [96, 100)
  REQUIRE(std::equal(keys.begin(), keys.begin() + 3, longer_keys.begin()));

  SUBCASE("off (the default): a full prefill stores nothing") {
    InMemoryKVStore store;
    CpuBatchEngine<InMemoryKVStore> engine(model, store, cake_config(LoaderMode::adaptive));
    (void)run_all(engine, {first});
    engine.connector().wait_for_saves();
    CHECK(store.size() == 0);
  }
  SUBCASE("on") {
    InMemoryKVStore store;
    BatchEngineConfig config = cake_config(LoaderMode::adaptive);
    config.store_prefixes = true;
    CpuBatchEngine<InMemoryKVStore> engine(model, store, config);
    const Run one = run_all(engine, {first});
    engine.connector().wait_for_saves();
    CHECK(one.tokens.at(1) == alone(model, first));
    CHECK(one.metrics.at(1).stored_prefix == 0);
    const LlamaPrefill full = model.full_prefill(first.tokens);
    for (std::size_t j = 0; j < 3; ++j) {  // 100 / 32 whole chunks (and 102 / 32: the answer adds none)
      CAPTURE(j);
      const std::optional<KVBlock> block = store.get(keys[j]);
      REQUIRE(block.has_value());
      const auto b = static_cast<std::int64_t>(j) * kFetchChunk;
      const KVBlock want = full.kv.to_block({b, b + kFetchChunk});
      CHECK(block->first_position == b);
      CHECK(block->num_tokens == kFetchChunk);
      REQUIRE(block->bytes.size() == want.bytes.size());
      // Chunked prefill's KV: full prefill's to float rounding (its query blocks end where the budget cut them).
      std::vector<float> got(block->bytes.size() / sizeof(float)), ref(got.size());
      std::memcpy(got.data(), block->bytes.data(), block->bytes.size());
      std::memcpy(ref.data(), want.bytes.data(), want.bytes.size());
      for (std::size_t i = 0; i < got.size(); ++i) REQUIRE(got[i] == doctest::Approx(ref[i]).epsilon(1e-4));
    }
    CHECK_FALSE(store.contains(keys[3]));  // the shorter last chunk is not a whole one

    const Run two = run_all(engine, {second});  // ids continue: the second request is 2
    engine.connector().wait_for_saves();
    const RequestMetrics& m = two.metrics.at(2);
    CHECK(m.stored_prefix == 96);
    CHECK(m.meet_token + m.loaded_tokens == 96);
    CHECK(two.tokens.at(2) == alone(model, second));
    CHECK(store.contains(longer_keys[3]));  // its own new whole chunks [96, 128) and [128, 160) (its last token's)
    CHECK(store.contains(longer_keys[4]));
    CHECK(store.size() == 5);  // 163 rows of KV at its end: no whole chunk more
  }
}

TEST_CASE("CpuBatchEngine with store_prefixes: a finished answer's KV extends the prefix entries, so the next turn "
          "(prompt, answer, more) loads it by Cake and gets its tokens alone") {
  const CpuLlama model = small_untied_llama();
  BatchEngineConfig config = cake_config(LoaderMode::adaptive);
  config.store_prefixes = true;
  InMemoryKVStore store;
  CpuBatchEngine<InMemoryKVStore> engine(model, store, config);
  const GenerationRequest first = full_request(make_prompt(100, 7), 40);
  const Run one = run_all(engine, {first});
  engine.connector().wait_for_saves();
  const std::vector<token_id>& answer = one.tokens.at(1);
  REQUIRE(answer.size() == 40);  // to its length: 100 + 39 rows of KV, 4 whole chunks

  std::vector<token_id> next = first.tokens;  // the next turn: the prompt, the answer, then more
  next.insert(next.end(), answer.begin(), answer.end());
  for (token_id t : make_prompt(20, 9)) next.push_back(t);
  const GenerationRequest second = full_request(next, 4);
  const auto keys = prefix_chunk_keys(model.fingerprint(), second.tokens, kFetchChunk);
  CHECK(store.size() == 4);
  for (std::size_t j = 0; j < 4; ++j) CHECK(store.contains(keys[j]));
  // [96, 128): the prompt's last 4 rows and the answer's first 28, decoded one by one: full prefill's KV to rounding.
  const std::optional<KVBlock> block = store.get(keys[3]);
  REQUIRE(block.has_value());
  const KVBlock want = model.full_prefill(second.tokens).kv.to_block({96, 128});
  REQUIRE(block->bytes.size() == want.bytes.size());
  std::vector<float> got(block->bytes.size() / sizeof(float)), ref(got.size());
  std::memcpy(got.data(), block->bytes.data(), block->bytes.size());
  std::memcpy(ref.data(), want.bytes.data(), want.bytes.size());
  for (std::size_t i = 0; i < got.size(); ++i) REQUIRE(got[i] == doctest::Approx(ref[i]).epsilon(1e-4));

  const Run two = run_all(engine, {second});
  const RequestMetrics& m = two.metrics.at(2);
  CHECK(m.stored_prefix == 128);
  CHECK(m.meet_token + m.loaded_tokens == 128);
  CHECK(two.tokens.at(2) == alone(model, second));
}

TEST_CASE("CpuBatchEngine: each step decodes first, then chunked prefill, then Cake's compute side, within budget") {
  const CpuLlama model = small_untied_llama();
  InMemoryKVStore memory;
  const std::vector<GenerationRequest> requests{full_request(make_prompt(100, 1), 4),
                                                full_request(make_prompt(200, 2), 6),
                                                full_request(make_prompt(60, 6), 5),
                                                full_request(make_prompt(180, 4), 3)};
  store_prefix(model, requests[1].tokens, 160, memory);
  store_prefix(model, requests[3].tokens, 128, memory);
  const std::set<std::uint64_t> cake{2, 4};
  for (LoaderMode mode : {LoaderMode::compute_only, LoaderMode::bidirectional}) {
    CAPTURE(static_cast<int>(mode));
    CpuBatchEngine<InMemoryKVStore> engine(model, memory, cake_config(mode));
    std::set<std::uint64_t> decoding;
    std::map<std::uint64_t, std::int64_t> remaining{{1, 100}, {3, 60}};
    int step = 0;
    bool cake_ran = false;
    const Run run = run_all(engine, requests, [&](const StepStats& s, const std::vector<TokenEvent>& events) {
      CAPTURE(step);
      check_plan(s, decoding, cake, remaining);
      // The plain requests' 160 tokens fill the first three steps of 48; Cake's compute sides get what is left.
      if (step < 3) CHECK(s.cake_rows == 0);
      cake_ran = cake_ran || s.cake_rows > 0;
      for (const TokenEvent& e : events) {
        if (e.token) decoding.insert(e.request);
        if (e.finish != FinishReason::none) decoding.erase(e.request);
      }
      ++step;
    });
    if (mode == LoaderMode::compute_only) CHECK(cake_ran);
    for (std::uint64_t id = 1; id <= requests.size(); ++id) {
      CAPTURE(id);
      CHECK(run.tokens.at(id) == alone(model, requests[id - 1]));
    }
  }
}

TEST_CASE("CpuBatchEngine: a Cake request cancelled while its loads run leaves, and the others are unchanged") {
  const CpuLlama model = small_untied_llama();
  InMemoryKVStore memory;
  ThrottledKVStore<InMemoryKVStore> slow(memory, {1.0, 5.0});  // a 24 KB chunk takes about 30 ms
  const std::vector<GenerationRequest> requests{full_request(make_prompt(200, 2), 4),
                                                full_request(make_prompt(100, 1), 3)};
  store_prefix(model, requests[0].tokens, 160, memory);
  CpuBatchEngine<ThrottledKVStore<InMemoryKVStore>> engine(model, slow, cake_config(LoaderMode::load_only));
  const std::uint64_t cake = engine.submit(requests[0]);
  const std::uint64_t plain = engine.submit(requests[1]);
  (void)engine.step();
  engine.cancel(cake);
  std::vector<token_id> tokens;
  bool cancelled = false;
  while (!engine.idle()) {
    for (const TokenEvent& e : engine.step()) {
      if (e.request == cake && e.finish == FinishReason::cancelled) {
        cancelled = true;
        CHECK(e.metrics.stored_prefix == 160);  // it was a Cake request
        CHECK(e.metrics.meet_token == 0);
      }
      if (e.request == plain && e.token) tokens.push_back(*e.token);
    }
  }
  CHECK(cancelled);
  CHECK(tokens == alone(model, requests[1]));
}

TEST_CASE("CpuBatchEngine with measured speeds: a Cake request computes at most its chosen chunk per step, and its "
          "tokens equal serving it alone") {
  const CpuLlama model = small_untied_llama();
  InMemoryKVStore memory;
  const std::vector<GenerationRequest> requests{full_request(make_prompt(200, 2), 6)};
  store_prefix(model, requests[0].tokens, 160, memory);
  // 1 ms per token on both sides, no fixed costs: T* = 80 ms for 160 stored tokens, 2 % of it is under one token,
  // so the rule's smallest chunk, 16 tokens.
  const CakeSpeeds speeds{0.0, 0.001, 0.0, 0.001};
  REQUIRE(choose_chunk_sizes(speeds, 160).compute_chunk == 16);
  for (LoaderMode mode : {LoaderMode::compute_only, LoaderMode::adaptive}) {
    CAPTURE(static_cast<int>(mode));
    BatchEngineConfig config = cake_config(mode);
    config.cake_speeds = speeds;
    CpuBatchEngine<InMemoryKVStore> engine(model, memory, config);
    std::int64_t most = 0;
    const Run run = run_all(engine, requests, [&](const StepStats& s, const std::vector<TokenEvent>&) {
      most = std::max(most, s.cake_rows);
    });
    CHECK(most <= 16);
    if (mode == LoaderMode::compute_only) CHECK(most == 16);
    CHECK(run.metrics.at(1).stored_prefix == 160);
    CHECK(run.tokens.at(1) == alone(model, requests[0]));
  }
}

}  // namespace unit_batch_engine_cake
