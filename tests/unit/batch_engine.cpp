// The engine drives, kvfuse plans: CpuLlama::forward over a ragged batch, FusionConnector's request-keyed hooks and
// CpuBatchEngine's continuous batching. Batched == alone bit for bit for every method; a request arriving mid-run;
// one request's failed or stalled read leaves the others' results unchanged; planning twice gives the same plan and
// touches no store but its batched lookup; Cache-Craft's variants made by the engine's own requests.
#include <doctest/doctest.h>

#include <atomic>
#include <chrono>
#include <map>
#include <string>
#include <thread>
#include <vector>

#include "kvfuse/backend/cpu/batch_engine.hpp"
#include "kvfuse/backend/in_memory_store.hpp"
#include "kvfuse/cpu.hpp"
#include "kvfuse/fusion/fusion_pipeline.hpp"
#include "kvfuse/harness/rag_prompt.hpp"

#include "../support/fusion_prompts.hpp"
#include "../support/model_path.hpp"
#include "../support/small_llama.hpp"

// Each unit test file lives in its own namespace: the files are compiled together (a unity build).
namespace unit_batch_engine {

using namespace kvfuse;
using kvfuse_test::assemble;
using kvfuse_test::chunk_tokens;
using kvfuse_test::kA;
using kvfuse_test::kB;
using kvfuse_test::kC;
using kvfuse_test::kQuery;
using kvfuse_test::kSystem;
using kvfuse_test::Prompt;
using kvfuse_test::small_llama;

namespace {

// An InMemoryKVStore that counts every call and can fail or stall the reads of one key.
class ProbeStore {
 public:
  std::optional<KVKey> fail_key;   // describe / get_range of this key fail (as a corrupt entry)
  std::optional<KVKey> stall_key;  // get_range of this key sleeps stall_ms first
  int stall_ms = 0;
  mutable std::atomic<int> lookups{0};  // contains_many calls
  mutable std::atomic<int> other{0};    // every other call that reads or writes

  bool contains(const KVKey& k) const { return ++other, inner_.contains(k); }
  std::vector<bool> contains_many(std::span<const KVKey> keys) const {
    ++lookups;
    return inner_.contains_many(keys);
  }
  std::optional<KVBlock> get(const KVKey& k) { return ++other, inner_.get(k); }
  std::vector<std::optional<KVBlock>> get_many(std::span<const KVKey> keys) { return ++other, inner_.get_many(keys); }
  void put(const KVKey& k, KVBlock b) { ++other, inner_.put(k, std::move(b)); }
  bool erase(const KVKey& k) { return ++other, inner_.erase(k); }
  std::optional<KVBlockInfo> describe(const KVKey& k) {
    ++other;
    if (fail_key && k == *fail_key) return std::nullopt;
    return inner_.describe(k);
  }
  std::optional<std::vector<std::byte>> get_range(const KVKey& k, const KVBlockInfo& info, std::uint64_t offset,
                                                  std::uint64_t size) {
    ++other;
    if (stall_key && k == *stall_key) std::this_thread::sleep_for(std::chrono::milliseconds(stall_ms));
    return inner_.get_range(k, info, offset, size);
  }
  bool get_into(const KVKey& k, const KVBlockInfo& info, std::uint64_t offset, std::span<std::byte> out) {
    ++other;
    if (stall_key && k == *stall_key) std::this_thread::sleep_for(std::chrono::milliseconds(stall_ms));
    return inner_.get_into(k, info, offset, out);
  }
  InMemoryKVStore& inner() noexcept { return inner_; }

 private:
  InMemoryKVStore inner_;
};
static_assert(RangedKVStore<ProbeStore>);

std::vector<Prompt> prompts() { return kvfuse_test::reordered_prompts(); }

// Greedy tokens of FusionPipeline::run (the single-request driver) and CpuLlama::greedy_decode: the reference.
std::vector<token_id> alone_by_pipeline(const CpuLlama& model, ProbeStore& store, const Prompt& p,
                                        const std::string& method, std::int64_t n) {
  CpuLlamaFusion engine(model);
  FusionPipeline pipeline(engine, store);
  const FusionResult r = pipeline.run(p.tokens, p.layout, parse_method(method));
  return model.greedy_decode(engine.kv(), r.logits, n, -1);
}

// Every request of `requests` through one engine, submitted at the step given; their tokens by request.
std::map<std::uint64_t, std::vector<token_id>> serve(CpuBatchEngine<ProbeStore>& engine,
                                                     std::vector<std::pair<int, GenerationRequest>> requests,
                                                     std::map<std::uint64_t, RequestMetrics>* metrics = nullptr) {
  std::map<std::uint64_t, std::vector<token_id>> out;
  std::size_t next = 0;
  for (int step = 0; next < requests.size() || !engine.idle(); ++step) {
    while (next < requests.size() && requests[next].first <= step) out[engine.submit(requests[next++].second)];
    for (const TokenEvent& e : engine.step()) {
      REQUIRE_MESSAGE(e.status == Status::success, e.error);
      if (e.token) out[e.request].push_back(*e.token);
      if (e.finish != FinishReason::none && metrics != nullptr) (*metrics)[e.request] = e.metrics;
    }
    REQUIRE(step < 1000);
  }
  return out;
}

GenerationRequest request_of(const Prompt& p, const std::string& method, std::int64_t n) {
  GenerationRequest r;
  r.tokens = p.tokens;
  r.layout = p.layout;
  r.method = parse_method(method);
  r.max_new_tokens = n;
  return r;
}

void store_chunk_caches(const CpuLlama& model, ProbeStore& store) {
  CpuLlamaFusion engine(model);
  FusionPipeline pipeline(engine, store);
  for (const Prompt& p : prompts()) pipeline.store_chunk_caches(p.tokens, p.layout);
}

// An engine that served one cachecraft request for prompts()[0] (system, A, B, C) with no variant stored: its tokens
// and metrics; the next, prompts()[1] (system, C, A), reorders its chunks.
struct CraftEngine {
  CpuLlama model = small_llama();
  std::vector<Prompt> ps = prompts();
  Prompt first = ps[0];
  Prompt second = ps[1];
  ProbeStore store;
  CpuBatchEngine<ProbeStore> engine{model, store};
  std::map<std::uint64_t, RequestMetrics> metrics;
  std::map<std::uint64_t, std::vector<token_id>> cold =
      serve(engine, {{0, request_of(first, "cachecraft", 4)}}, &metrics);
};

}  // namespace

TEST_CASE("CpuLlama::forward: a batch of partial prefills gives each request's logits bit for bit") {
  const CpuLlama model = small_llama();
  const std::vector<Prompt> ps = prompts();
  // Alone: partial_prefill with CacheBlend-like filtering (keep every other row, always the last) after layer 1.
  const auto policy = [](const LayerReport& r) {
    if (r.layer != 1) return r.selected;
    TokenSet next;
    for (std::size_t i = 0; i < r.selected.size(); ++i)
      if (i % 2 == 0 || i + 1 == r.selected.size()) next.push_back(r.selected[i]);
    return next;
  };
  std::vector<std::vector<float>> alone;
  for (const Prompt& p : ps) {
    LlamaKVCache kv = model.full_prefill(p.tokens).kv;  // stale-free KV: recomputing rows over it
    TokenSet rows;
    append_range(rows, {0, static_cast<std::int64_t>(p.tokens.size())});
    alone.push_back(model.partial_prefill(p.tokens, kv, rows, policy).logits);
  }
  struct Filter final : StepHooks {
    std::int64_t before = 0;
    Status before_layer(std::size_t, std::int64_t) override { return ++before, Status::success; }
    Status after_layer(std::size_t, const LayerReport& r, TokenSet& next) override {
      if (r.layer != 1) return Status::success;
      for (std::size_t i = 0; i < r.selected.size(); ++i)
        if (i % 2 == 0 || i + 1 == r.selected.size()) next.push_back(r.selected[i]);
      return Status::success;
    }
  } hooks;
  std::vector<LlamaKVCache> kvs;
  for (const Prompt& p : ps) kvs.push_back(model.full_prefill(p.tokens).kv);
  std::vector<BatchItem> items(ps.size());
  for (std::size_t i = 0; i < ps.size(); ++i) {
    items[i].kv = &kvs[i];
    append_range(items[i].rows, {0, static_cast<std::int64_t>(ps[i].tokens.size())});
    items[i].tokens = ps[i].tokens;
    items[i].needs.after_layer = true;
    items[i].needs.k_deviation = true;
  }
  model.forward(items, hooks);
  CHECK(hooks.before == static_cast<std::int64_t>(ps.size()) * model.config().n_layer);
  for (std::size_t i = 0; i < ps.size(); ++i) {
    CHECK(items[i].status == Status::success);
    CHECK(items[i].logits == alone[i]);
    CHECK(items[i].selected_per_layer[2] < items[i].selected_per_layer[1]);
  }
}

TEST_CASE("CpuLlama::forward: a hook's failure takes only its item out of the step") {
  const CpuLlama model = small_llama();
  const std::vector<Prompt> ps = prompts();
  struct FailSecond final : StepHooks {
    Status before_layer(std::size_t item, std::int64_t layer) override {
      return item == 1 && layer == 3 ? Status::store_unavailable : Status::success;
    }
    Status after_layer(std::size_t, const LayerReport&, TokenSet&) override { return Status::success; }
  } hooks;
  std::vector<LlamaKVCache> kvs;
  std::vector<BatchItem> items(ps.size());
  for (const Prompt& p : ps) kvs.push_back(model.full_prefill(p.tokens).kv);
  for (std::size_t i = 0; i < ps.size(); ++i) {
    items[i].kv = &kvs[i];
    append_range(items[i].rows, {0, static_cast<std::int64_t>(ps[i].tokens.size())});
    items[i].tokens = ps[i].tokens;
  }
  model.forward(items, hooks);
  CHECK(items[1].status == Status::store_unavailable);
  CHECK(items[1].logits.empty());
  CHECK(items[1].selected_per_layer.size() == 3);
  for (std::size_t i : {std::size_t{0}, std::size_t{2}}) {
    CHECK(items[i].status == Status::success);
    CHECK(items[i].logits == model.full_prefill(ps[i].tokens).logits);
  }
}

TEST_CASE("FusionConnector::plan: planning twice gives the same plan and touches the store only through one lookup") {
  const CpuLlama model = small_llama();
  ProbeStore store;
  store_chunk_caches(model, store);
  CpuBatchEngine<ProbeStore> engine(model, store);
  const Prompt p = prompts()[1];
  for (const std::string method : {"naive", "cacheblend", "attnlink", "prefix", "queryaware@0.15:0.5"}) {
    CAPTURE(method);
    store.lookups = 0;
    store.other = 0;
    const FusionPlan a = engine.connector().plan(7, p.tokens, p.layout, parse_method(method));
    const FusionPlan b = engine.connector().plan(7, p.tokens, p.layout, parse_method(method));
    CHECK(store.lookups == 2);
    CHECK(store.other == 0);
    CHECK(a.request_id == 7);
    CHECK(a.initial == b.initial);
    CHECK(a.per_layer == b.per_layer);
    CHECK(a.statistics == b.statistics);
    CHECK(a.bytes_to_read() == b.bytes_to_read());
    REQUIRE(a.chunks.size() == b.chunks.size());
    for (std::size_t j = 0; j < a.chunks.size(); ++j) {
      CHECK(a.chunks[j].source == b.chunks[j].source);
      CHECK(a.chunks[j].key == b.chunks[j].key);
      CHECK(a.chunks[j].shift() == b.chunks[j].shift());
    }
  }
  const FusionPlan blend = engine.connector().plan(1, p.tokens, p.layout, parse_method("cacheblend"));
  CHECK(blend.per_layer);
  CHECK(blend.statistics.v_deviation);  // CacheBlend ranks by V deviation by default
  CHECK_FALSE(blend.statistics.k_deviation);
  CHECK_FALSE(blend.statistics.query_mass);
  CHECK(blend.bytes_to_read() > 0);
  const FusionPlan link = engine.connector().plan(1, p.tokens, p.layout, parse_method("attnlink"));
  CHECK_FALSE(link.per_layer);
  CHECK_FALSE(link.statistics.any());
}

TEST_CASE("chunk_end: a chunked prefill ends on a query block unless it reaches the prompt's end or none lies in its "
          "range") {
  CHECK(chunk_end(0, 100, 524, 64) == 64);
  CHECK(chunk_end(0, 512, 1000, 64) == 512);
  CHECK(chunk_end(64, 505, 1000, 64) == 512);
  CHECK(chunk_end(64, 460, 524, 64) == 524);  // the prompt's last row: any length
  CHECK(chunk_end(60, 6, 200, 64) == 64);
  CHECK(chunk_end(10, 6, 200, 64) == 16);     // no multiple of 64 in (10, 16]: the budget's end
  CHECK(chunk_end(10, 60, 200, 64) == 64);
}

TEST_CASE("CpuBatchEngine: batched requests give the tokens of each request alone, for every method") {
  const CpuLlama model = small_llama();
  ProbeStore store;
  store_chunk_caches(model, store);
  const std::vector<Prompt> ps = prompts();
  for (const std::string method :
       {"full", "naive", "cacheblend", "cacheblend@1", "attnlink", "queryaware@0.15:0.5", "queryprobe@0.5"}) {
    CAPTURE(method);
    std::vector<std::pair<int, GenerationRequest>> all;
    for (const Prompt& p : ps) all.emplace_back(0, request_of(p, method, 5));
    CpuBatchEngine<ProbeStore> batched(model, store, {{6}, {}, 64});  // a small budget: chunked full prefill
    const auto got = serve(batched, all);
    REQUIRE(got.size() == ps.size());
    std::size_t i = 0;
    for (const auto& [id, tokens] : got) {
      CAPTURE(i);
      CHECK(tokens == alone_by_pipeline(model, store, ps[i], method, 5));
      CpuBatchEngine<ProbeStore> alone(model, store);
      CHECK(serve(alone, {{0, request_of(ps[i], method, 5)}}).begin()->second == tokens);
      ++i;
    }
  }
}

TEST_CASE("CpuBatchEngine: a request arriving mid-run gets the tokens it gets alone") {
  const CpuLlama model = small_llama();
  ProbeStore store;
  store_chunk_caches(model, store);
  const std::vector<Prompt> ps = prompts();
  CpuBatchEngine<ProbeStore> engine(model, store);
  const auto got = serve(engine, {{0, request_of(ps[0], "cacheblend", 6)},
                                  {0, request_of(ps[1], "full", 6)},
                                  {3, request_of(ps[2], "attnlink", 4)}});
  REQUIRE(got.size() == 3);
  CHECK(got.at(3) == alone_by_pipeline(model, store, ps[2], "attnlink", 4));
  CHECK(got.at(1) == alone_by_pipeline(model, store, ps[0], "cacheblend", 6));
}

TEST_CASE("CpuBatchEngine: one request's failed read turns its chunk into compute and leaves the others unchanged") {
  const CpuLlama model = small_llama();
  ProbeStore store;
  store_chunk_caches(model, store);
  // A chunk only the second request uses, its entry failing every read.
  const Prompt lonely = assemble({kSystem, chunk_tokens(10, 77), kA}, kQuery);
  {
    CpuLlamaFusion e(model);
    FusionPipeline pipeline(e, store);
    pipeline.store_chunk_caches(lonely.tokens, lonely.layout);
  }
  store.fail_key = chunk_cache_key(model.fingerprint(), chunk_tokens(10, 77));
  const std::vector<Prompt> ps = prompts();
  CpuBatchEngine<ProbeStore> engine(model, store);
  std::map<std::uint64_t, RequestMetrics> metrics;
  const auto got = serve(engine,
                         {{0, request_of(ps[0], "cacheblend", 4)}, {0, request_of(lonely, "cacheblend", 4)},
                          {0, request_of(ps[1], "naive", 4)}},
                         &metrics);
  CHECK(metrics.at(2).restarts == 1);
  CHECK(metrics.at(1).restarts == 0);
  CHECK(metrics.at(3).restarts == 0);
  CHECK(got.at(1) == alone_by_pipeline(model, store, ps[0], "cacheblend", 4));
  CHECK(got.at(3) == alone_by_pipeline(model, store, ps[1], "naive", 4));
  // The failed request: its chunk computed in context, the same as with the entry gone.
  store.fail_key.reset();
  (void)store.inner().erase(chunk_cache_key(model.fingerprint(), chunk_tokens(10, 77)));
  CpuBatchEngine<ProbeStore> again(model, store);
  const FusionPlan without = again.connector().plan(1, lonely.tokens, lonely.layout, parse_method("cacheblend"));
  CHECK(without.chunks[1].source == KVSource::compute);
  CHECK(got.at(2) == serve(again, {{0, request_of(lonely, "cacheblend", 4)}}).begin()->second);
}

TEST_CASE("CpuBatchEngine: one request's stalled read times out into compute and leaves the others unchanged") {
  const CpuLlama model = small_llama();
  ProbeStore store;
  store_chunk_caches(model, store);
  const Prompt lonely = assemble({kSystem, chunk_tokens(12, 78), kB}, kQuery);
  {
    CpuLlamaFusion e(model);
    FusionPipeline pipeline(e, store);
    pipeline.store_chunk_caches(lonely.tokens, lonely.layout);
  }
  store.stall_key = chunk_cache_key(model.fingerprint(), chunk_tokens(12, 78));
  store.stall_ms = 400;
  const std::vector<Prompt> ps = prompts();
  BatchEngineConfig config;
  config.connector.layer_timeout_ms = 100;
  config.connector.io_threads = 2;
  std::map<std::uint64_t, RequestMetrics> metrics;
  std::map<std::uint64_t, std::vector<token_id>> got;
  {
    CpuBatchEngine<ProbeStore> engine(model, store, config);
    got = serve(engine, {{0, request_of(lonely, "naive", 4)}, {1, request_of(ps[2], "attnlink", 4)}}, &metrics);
  }
  CHECK(metrics.at(1).restarts == 1);
  store.stall_key.reset();
  CHECK(got.at(2) == alone_by_pipeline(model, store, ps[2], "attnlink", 4));
}

TEST_CASE("CpuBatchEngine: chunk caches missing from the store are computed alone after the request's prefill, in "
          "the budget a step leaves, and saved") {
  const CpuLlama model = small_llama();
  ProbeStore store;
  const std::vector<Prompt> ps = prompts();
  BatchEngineConfig config;
  config.budget.token_budget = static_cast<std::int64_t>(ps[0].tokens.size());  // the cold prompt fills a step
  CpuBatchEngine<ProbeStore> engine(model, store, config);
  std::map<std::uint64_t, std::vector<token_id>> first;
  (void)engine.submit(request_of(ps[0], "naive", 3));
  std::int64_t chunk_rows = 0;
  for (int step = 0; !engine.idle(); ++step) {
    for (const TokenEvent& e : engine.step()) {
      REQUIRE_MESSAGE(e.status == Status::success, e.error);
      if (e.token) first[e.request].push_back(*e.token);
    }
    const StepStats& s = engine.last_step();
    if (step == 0) {  // the request's prefill alone: every row (nothing stored), and no chunk cache beside it
      CHECK(s.items == 1);
      CHECK(s.prefill_rows == static_cast<std::int64_t>(ps[0].tokens.size()));
    } else {
      chunk_rows += s.prefill_rows;
    }
    REQUIRE(step < 100);
  }
  std::int64_t chunk_tokens_total = 0;
  for (const PromptChunk& c : ps[0].layout.chunks) chunk_tokens_total += c.range.size();
  CHECK(chunk_rows == chunk_tokens_total);  // each chunk's cache once, in the decode steps
  engine.wait_for_saves();
  for (const PromptChunk& c : ps[0].layout.chunks) {
    const auto chunk = std::span<const token_id>(ps[0].tokens).subspan(static_cast<std::size_t>(c.range.begin),
                                                                         static_cast<std::size_t>(c.range.size()));
    const std::optional<KVBlock> stored = store.inner().get(chunk_cache_key(model.fingerprint(), chunk));
    REQUIRE(stored.has_value());
    CHECK(stored->bytes == CpuLlamaFusion(model).chunk_kv(chunk, 0).bytes);  // the chunk cache, bit for bit
  }
  // The first request computed every chunk in context (a full prefill); the next one reuses them.
  LlamaPrefill full = model.full_prefill(ps[0].tokens);
  CHECK(first.begin()->second == model.greedy_decode(full.kv, full.logits, 3, -1));
  std::map<std::uint64_t, RequestMetrics> metrics;
  (void)serve(engine, {{0, request_of(ps[1], "naive", 3)}}, &metrics);
  CHECK(metrics.begin()->second.loaded_tokens == static_cast<std::int64_t>(ps[1].tokens.size()) - ps[1].layout.query.size());
}

TEST_CASE("CpuBatchEngine and FusionPipeline: chunk caches behind a chunk context are the chunk's rows of a prefill "
          "of context + chunk, bit for bit, keyed by both; a request reusing them equals FusionPipeline alone") {
  const CpuLlama model = small_llama();
  std::vector<Prompt> ps = prompts();
  for (Prompt& p : ps) {  // kSystem is the context: computed, and every chunk cache is computed behind it
    p.layout.chunks[0].cached = false;
    p.layout.chunk_context = p.layout.chunks[0].range.end;
  }
  const auto context = std::span<const token_id>(kSystem);
  const auto conditioned = [&](std::span<const token_id> chunk) {  // the reference: context + chunk, its rows kept
    std::vector<token_id> both(context.begin(), context.end());
    both.insert(both.end(), chunk.begin(), chunk.end());
    return model.prefill_chunk(both, 0).to_block({static_cast<std::int64_t>(context.size()),
                                                  static_cast<std::int64_t>(both.size())});
  };
  ProbeStore store;
  {
    CpuBatchEngine<ProbeStore> engine(model, store);
    (void)serve(engine, {{0, request_of(ps[0], "naive", 2)}});  // cold: computes and stores the chunk caches
    engine.wait_for_saves();
  }
  ProbeStore by_pipeline;
  {
    CpuLlamaFusion engine(model);
    FusionPipeline pipeline(engine, by_pipeline);
    CHECK(pipeline.store_chunk_caches(ps[0].tokens, ps[0].layout) == 3);  // not the context
  }
  for (const auto& chunk : {kA, kB, kC}) {
    const KVKey key = chunk_cache_key(model.fingerprint(), chunk, context);
    CHECK(key != chunk_cache_key(model.fingerprint(), chunk));  // never a cache computed alone
    const std::optional<KVBlock> stored = store.inner().get(key), piped = by_pipeline.inner().get(key);
    REQUIRE(stored.has_value());
    REQUIRE(piped.has_value());
    const KVBlock expected = conditioned(chunk);
    CHECK(stored->first_position == static_cast<std::int64_t>(context.size()));
    CHECK(stored->bytes == expected.bytes);
    CHECK(piped->first_position == stored->first_position);
    CHECK(piped->bytes == expected.bytes);
  }
  // The plan loads them at the context's end, shifted to their places; the context's rows are computed.
  CpuBatchEngine<ProbeStore> engine(model, store);
  const FusionPlan plan = engine.connector().plan(1, ps[1].tokens, ps[1].layout, parse_method("naive"));
  CHECK(plan.chunks[0].source == KVSource::compute);
  for (std::size_t j = 1; j < plan.chunks.size(); ++j) {
    CHECK(plan.chunks[j].source == KVSource::isolated);
    CHECK(plan.chunks[j].stored_first_position == static_cast<std::int64_t>(context.size()));
  }
  for (const std::string method : {"naive", "cacheblend", "attnlink@2"}) {
    CAPTURE(method);
    std::map<std::uint64_t, RequestMetrics> metrics;
    const auto got = serve(engine, {{0, request_of(ps[1], method, 3)}, {0, request_of(ps[2], method, 3)}}, &metrics);
    CHECK(got.begin()->second == alone_by_pipeline(model, store, ps[1], method, 3));
    CHECK(std::next(got.begin())->second == alone_by_pipeline(model, store, ps[2], method, 3));
    CHECK(metrics.begin()->second.loaded_tokens == static_cast<std::int64_t>(kC.size() + kA.size()));
  }
  // One that does not fit its plan (here: rotated at position 0, not behind the context) is not recomputed alone
  // mid-request: its chunk is computed in context, as if the store lacked it.
  const auto run_over = [&](ProbeStore& s) {
    CpuLlamaFusion e(model);
    FusionPipeline pipeline(e, s);
    return pipeline.run(ps[0].tokens, ps[0].layout, parse_method("naive"));
  };
  const KVKey a_key = chunk_cache_key(model.fingerprint(), kA, context);
  ProbeStore moved, lacking;
  for (ProbeStore* s : {&moved, &lacking}) {
    CpuLlamaFusion e(model);
    FusionPipeline(e, *s).store_chunk_caches(ps[0].tokens, ps[0].layout);
  }
  KVBlock at_zero = *moved.inner().get(a_key);
  at_zero.first_position = 0;
  moved.inner().put(a_key, at_zero);
  REQUIRE(lacking.inner().erase(a_key));
  const FusionResult with_moved = run_over(moved), with_lacking = run_over(lacking);
  CHECK(with_moved.rejected_entries == 1);
  CHECK(with_moved.plan.chunks[1].source == KVSource::compute);
  CHECK(with_lacking.plan.chunks[1].source == KVSource::compute);
  CHECK(with_moved.logits == with_lacking.logits);

  // A cached chunk inside the context, or a context that ends inside a chunk, is refused by name.
  Prompt bad = ps[0];
  bad.layout.chunks[0].cached = true;
  CHECK_THROWS_WITH_AS(bad.layout.validate(), doctest::Contains("lies in the chunk context"), kvfuse::error);
  bad = ps[0];
  bad.layout.chunk_context = 3;
  CHECK_THROWS_WITH_AS(bad.layout.validate(), doctest::Contains("chunk_context = 3 is not 0 or the end of a chunk"),
                       kvfuse::error);
}

TEST_CASE("CpuBatchEngine: queued chunk caches are computed one a step while other prefills take the whole budget") {
  // Query blocks of one row: the chunked prefills take every token the budget gives them (chunk_end).
  const CpuLlama model(kvfuse_test::small_llama_config(), LlamaWeights::random(kvfuse_test::small_llama_config(), 5),
                       CpuLlamaOptions{2, 1});
  ProbeStore store;
  const std::vector<Prompt> ps = prompts();
  BatchEngineConfig config;
  config.budget.token_budget = static_cast<std::int64_t>(ps[0].tokens.size());
  CpuBatchEngine<ProbeStore> engine(model, store, config);
  (void)engine.submit(request_of(ps[0], "naive", 1));  // cold: every row in its one prefill step, 4 chunks queued
  for (int i = 0; i < 8; ++i) (void)engine.submit(request_of(ps[1], "full", 1));  // chunked prefills, 8 prompts
  for (int step = 0; step < 5; ++step) {
    for (const TokenEvent& e : engine.step()) REQUIRE_MESSAGE(e.status == Status::success, e.error);
    const StepStats& s = engine.last_step();
    if (step == 0) continue;
    CAPTURE(step);
    CHECK(s.plan.used_tokens == s.plan.token_budget);  // the full-prefill requests took the whole budget
    CHECK(s.items == static_cast<std::int64_t>(s.plan.allocations.size()) + 1);  // and one chunk cache beside them
  }
  engine.wait_for_saves();
  for (const PromptChunk& c : ps[0].layout.chunks) {
    const auto chunk = std::span<const token_id>(ps[0].tokens).subspan(static_cast<std::size_t>(c.range.begin),
                                                                         static_cast<std::size_t>(c.range.size()));
    CHECK(store.inner().get(chunk_cache_key(model.fingerprint(), chunk)).has_value());
  }
  while (!engine.idle()) (void)engine.step();
}

TEST_CASE("CpuBatchEngine: a cancelled request leaves with its KV freed; bad requests are refused by name") {
  const CpuLlama model = small_llama();
  ProbeStore store;
  CpuBatchEngine<ProbeStore> engine(model, store);
  const std::vector<Prompt> ps = prompts();
  const std::uint64_t a = engine.submit(request_of(ps[0], "full", 50));
  const std::uint64_t b = engine.submit(request_of(ps[1], "full", 3));
  (void)engine.step();
  engine.cancel(a);
  bool cancelled = false;
  while (!engine.idle())
    for (const TokenEvent& e : engine.step())
      if (e.request == a) cancelled = cancelled || e.finish == FinishReason::cancelled;
  CHECK(cancelled);
  CHECK(b == 2);
  GenerationRequest bad = request_of(ps[0], "full", 3);
  bad.tokens.push_back(1);  // the layout no longer covers the prompt
  CHECK_THROWS_WITH_AS(engine.submit(bad), doctest::Contains("the layout covers"), error);
  GenerationRequest big = request_of(ps[0], "full", 1 << 20);
  try {
    (void)engine.submit(big);
    CHECK(model.config().context_length == 0);
  } catch (const error& e) {
    CHECK(e.code() == Status::beyond_context);
  }
  GenerationRequest hot = request_of(ps[0], "full", 3);
  hot.temperature = -1;
  CHECK_THROWS_WITH_AS(engine.submit(hot), doctest::Contains("temperature = -1"), error);
}

TEST_CASE("CpuBatchEngine with cachecraft: chunks without a variant are computed and become variants; a request in "
          "another order loads them and gets FusionPipeline's tokens after record_context of the first") {
  CraftEngine e;
  auto& [model, ps, first, second, store, engine, metrics, cold] = e;
  CHECK(metrics.at(1).loaded_tokens == 0);
  CHECK(metrics.at(1).recomputed_rows == doctest::Approx(static_cast<double>(first.tokens.size())));
  CHECK(cold.at(1) == alone_by_pipeline(model, store, first, "full", 4));  // every row computed: full prefill
  engine.wait_for_saves();
  CHECK(store.inner().size() == 4);  // no isolated chunk caches: the four chunks' variants only
  CHECK(engine.variants().size() == 4);

  // The reference: the single-request driver with the first prompt recorded as context (its full prefill's
  // attention statistics, the same numbers the engine's cold request reported).
  ProbeStore reference_store;
  CpuLlamaFusion reference_engine(model);
  FusionPipeline pipeline(reference_engine, reference_store);
  pipeline.record_context(first.tokens, first.layout);
  const FusionPlan expected = pipeline.plan(second.tokens, second.layout, parse_method("cachecraft"));
  const FusionResult r = pipeline.run(second.tokens, second.layout, parse_method("cachecraft"));
  const auto reference = model.greedy_decode(reference_engine.kv(), r.logits, 4, -1);

  const auto warm = serve(engine, {{0, request_of(second, "cachecraft", 4)}}, &metrics);
  CHECK(engine.variants().size() == 4);
  std::int64_t loaded = 0;
  for (const ChunkPlan& c : expected.chunks) {
    CHECK(c.source == KVSource::variant);
    loaded += c.range.size();
  }
  CHECK(metrics.at(2).loaded_tokens == loaded);
  CHECK(metrics.at(2).recomputed_rows < static_cast<double>(second.tokens.size()));
  CHECK(warm.at(2) == reference);

  // A variant whose KV the store lost: the read fails, the chunk is computed, the variant is forgotten.
  const VariantEntry lost = engine.variants().entries().front();
  REQUIRE(store.inner().erase(lost.kv));
  const auto again = serve(engine, {{0, request_of(first, "cachecraft", 4)}}, &metrics);
  CHECK(metrics.at(3).restarts == 1);
  CHECK(again.at(3).size() == 4);
  for (const VariantEntry& v : engine.variants().entries()) CHECK(v.id != lost.id);
}

TEST_CASE("CpuBatchEngine with cachecraft: a variant chunk fixed whole on every layer becomes a variant for its new "
          "prefix, which a later request in that order loads with nothing to fix") {
  CraftEngine e;
  auto& [model, ps, first, second, store, engine, metrics, cold] = e;
  engine.wait_for_saves();
  REQUIRE(engine.variants().size() == 4);
  // α = 1000: CFO ≥ 1 for every chunk whose stored prefix is not within its new prefix (eq. 6-8: C, stored behind
  // system, A, B, now behind system alone), fixed whole: exact KV. A's stored prefix (system) is within its new one
  // (system, C): β' = 1, CFO = 0.
  const auto whole = serve(engine, {{0, request_of(second, "cachecraft@1000-nofocus", 4)}}, &metrics);
  engine.wait_for_saves();
  const auto full = alone_by_pipeline(model, store, second, "full", 4);
  CHECK(whole.at(2) == full);
  CHECK(metrics.at(2).recomputed_rows ==
        doctest::Approx(static_cast<double>(kC.size() + second.layout.query.size())));
  CHECK(engine.variants().size() == 5);  // and C behind (system)
  // The same order again: C's new variant has exactly this prefix (β' = 1, CFO = 0): only the query is computed.
  (void)serve(engine, {{0, request_of(second, "cachecraft", 4)}}, &metrics);
  CHECK(metrics.at(3).loaded_tokens == second.layout.query.begin);
  CHECK(metrics.at(3).recomputed_rows == doctest::Approx(static_cast<double>(second.layout.query.size())));
}

TEST_CASE("real model: SmolLM2 batched requests of every fixed-set and per-layer method, and Cache-Craft with the "
          "engine's own variants, equal FusionPipeline alone") {
  const auto path = kvfuse_test::real_model(/*optimized_only=*/true);
  if (!path) return;
  const GGUFFile file = GGUFFile::open(*path);
  const Tokenizer tok = Tokenizer::from_gguf(file);
  const CpuLlama model = CpuLlama::from_gguf(file);
  const std::vector<std::string> passages{
      "Exeter College is one of the constituent colleges of the University of Oxford in England, founded in 1314.",
      "Hannibal and Scipio is a 1637 tragedy by Thomas Nabbes, who was educated at Exeter College, Oxford.",
      "The Southern Maryland Electric Cooperative is headquartered in Hughesville, in Charles County, Maryland."};
  std::vector<std::string> reordered{passages[2], passages[0], passages[1]};
  const std::string system = "Answer the question using the documents, in a few words.";
  const std::vector<RagPrompt> rag{
      build_rag_prompt(tok, system, passages, "Where was the author of Hannibal and Scipio educated?"),
      build_rag_prompt(tok, system, reordered, "Which county is Hughesville in?")};
  std::vector<Prompt> ps;
  for (const RagPrompt& r : rag) ps.push_back({r.tokens, r.layout()});
  ProbeStore store;
  {
    CpuLlamaFusion engine(model);
    FusionPipeline pipeline(engine, store);
    for (const Prompt& p : ps) pipeline.store_chunk_caches(p.tokens, p.layout);
  }
  for (const std::string method : {"naive", "cacheblend", "attnlink", "queryprobe"}) {
    CAPTURE(method);
    CpuBatchEngine<ProbeStore> engine(model, store);
    const auto got = serve(engine, {{0, request_of(ps[0], method, 4)}, {0, request_of(ps[1], method, 4)}});
    CHECK(got.at(1) == alone_by_pipeline(model, store, ps[0], method, 4));
    CHECK(got.at(2) == alone_by_pipeline(model, store, ps[1], method, 4));
    MESSAGE(method << ": " << tok.decode(got.at(1), false) << " | " << tok.decode(got.at(2), false));
  }
  // Cache-Craft: the first request's chunks become the engine's variants; the second, its passages in another order,
  // gets what FusionPipeline gives with the first prompt recorded as context.
  ProbeStore craft_store;
  CpuBatchEngine<ProbeStore> engine(model, craft_store);
  (void)serve(engine, {{0, request_of(ps[0], "cachecraft@0.5", 4)}});
  engine.wait_for_saves();
  std::map<std::uint64_t, RequestMetrics> metrics;
  const auto got = serve(engine, {{0, request_of(ps[1], "cachecraft@0.5", 4)}}, &metrics);
  CHECK(metrics.at(2).loaded_tokens > 0);
  ProbeStore reference_store;
  CpuLlamaFusion reference_engine(model);
  FusionPipeline pipeline(reference_engine, reference_store);
  pipeline.record_context(ps[0].tokens, ps[0].layout);
  const FusionResult r = pipeline.run(ps[1].tokens, ps[1].layout, parse_method("cachecraft@0.5"));
  CHECK(got.at(2) == model.greedy_decode(reference_engine.kv(), r.logits, 4, -1));
  MESSAGE("cachecraft@0.5: " << tok.decode(got.at(2), false) << ", " << metrics.at(2).loaded_tokens << " of "
                             << ps[1].tokens.size() << " rows loaded, " << metrics.at(2).recomputed_rows
                             << " recomputed");
}

}  // namespace unit_batch_engine
