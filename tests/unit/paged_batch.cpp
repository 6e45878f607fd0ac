// The toy paged engine with its own step loop (examples/paged_batch_engine.hpp): several requests' KV in one shared
// pool of pages, one CpuLlama::forward over the batch through FusionConnector's hooks. Each request's logits and KV
// equal FusionPipeline::run of it alone on CpuLlamaFusion, bit for bit; its pages go back when it finishes; one
// request's failed read leaves the others unchanged and is recomputed in the next step.
#include <doctest/doctest.h>

#include <algorithm>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "kvfuse/backend/in_memory_store.hpp"
#include "kvfuse/cpu.hpp"
#include "kvfuse/fusion/fusion_pipeline.hpp"

#include "../../examples/paged_batch_engine.hpp"
#include "../support/error_of.hpp"
#include "../support/fusion_prompts.hpp"
#include "../support/small_llama.hpp"

// Each unit test file lives in its own namespace: the files are compiled together (a unity build).
namespace unit_paged_batch {

using namespace kvfuse;
using kvfuse_example::PagedBatchEngine;
using kvfuse_test::assemble;
using kvfuse_test::chunk_tokens;
using kvfuse_test::error_of;
using kvfuse_test::kA;
using kvfuse_test::kB;
using kvfuse_test::kC;
using kvfuse_test::kQuery;
using kvfuse_test::kSystem;
using kvfuse_test::Prompt;
using kvfuse_test::small_llama;

namespace {

// An InMemoryKVStore whose describe() fails for one key: the connector's read of that entry fails.
class FailingStore {
 public:
  std::optional<KVKey> fail_key;
  InMemoryKVStore inner;

  bool contains(const KVKey& k) const { return inner.contains(k); }
  std::vector<bool> contains_many(std::span<const KVKey> keys) const { return inner.contains_many(keys); }
  std::optional<KVBlock> get(const KVKey& k) { return inner.get(k); }
  std::vector<std::optional<KVBlock>> get_many(std::span<const KVKey> keys) { return inner.get_many(keys); }
  void put(const KVKey& k, KVBlock b) { inner.put(k, std::move(b)); }
  bool erase(const KVKey& k) { return inner.erase(k); }
  std::optional<KVBlockInfo> describe(const KVKey& k) {
    if (fail_key && k == *fail_key) return std::nullopt;
    return inner.describe(k);
  }
  std::optional<std::vector<std::byte>> get_range(const KVKey& k, const KVBlockInfo& info, std::uint64_t offset,
                                                  std::uint64_t size) {
    return inner.get_range(k, info, offset, size);
  }
  bool get_into(const KVKey& k, const KVBlockInfo& info, std::uint64_t offset, std::span<std::byte> out) {
    return inner.get_into(k, info, offset, out);
  }
};
static_assert(RangedKVStore<FailingStore>);

using Engine = PagedBatchEngine<FailingStore>;

// Three prompts reusing the same chunks in other orders and positions (3 + 2 + 3 pages of 16 rows).
std::vector<Prompt> prompts() {
  return {assemble({kSystem, kA, kB, kC}, kQuery), assemble({kSystem, kC, kA}, kQuery),
          assemble({kSystem, kB, kC, kA}, chunk_tokens(4, 9))};
}

// Each prompt's chunk caches, stored as FusionPipeline stores them over CpuLlamaFusion.
void store_chunk_caches(const CpuLlama& model, FailingStore& store, const std::vector<Prompt>& ps) {
  CpuLlamaFusion engine(model);
  FusionPipeline pipeline(engine, store);
  for (const Prompt& p : ps) pipeline.store_chunk_caches(p.tokens, p.layout);
}

// The reference: FusionPipeline::run of the request alone on CpuLlamaFusion; its logits and KV.
std::pair<std::vector<float>, LlamaKVCache> alone(const CpuLlama& model, FailingStore& store, const Prompt& p,
                                                  const std::string& method) {
  CpuLlamaFusion engine(model);
  FusionPipeline pipeline(engine, store);
  std::vector<float> logits = pipeline.run(p.tokens, p.layout, parse_method(method)).logits;
  return {std::move(logits), engine.kv()};
}

void check_same_kv(const LlamaKVCache& a, const LlamaKVCache& b) {
  CHECK(a.positions == b.positions);
  CHECK(a.k == b.k);
  CHECK(a.v == b.v);
}

}  // namespace

TEST_CASE("PagedBatchEngine: a batch of requests gives each one's logits and KV alone, bit for bit; pages return") {
  const CpuLlama model = small_llama();
  const std::vector<Prompt> ps = prompts();
  FailingStore store;
  store_chunk_caches(model, store, ps);
  for (const std::string method : {"naive", "attnlink", "cacheblend", "queryaware@0.15:0.5"}) {
    CAPTURE(method);
    Engine engine(model, store, 8);  // exactly the three prompts' pages
    std::vector<std::uint64_t> ids;
    for (const Prompt& p : ps) ids.push_back(engine.admit(p.tokens, p.layout, parse_method(method)));
    CHECK(engine.free_pages() == 0);
    CHECK(error_of([&] { (void)engine.admit(ps[0].tokens, ps[0].layout, parse_method(method)); })
              .find("3 pages, 0 are free") != std::string::npos);
    std::set<std::int64_t> pages;  // no page of the pool is held twice
    for (std::uint64_t id : ids) pages.insert(engine.block_table(id).begin(), engine.block_table(id).end());
    CHECK(pages.size() == 8);

    const std::vector<Engine::StepResult> got = engine.step();
    REQUIRE(got.size() == ps.size());
    for (std::size_t i = 0; i < ps.size(); ++i) {
      CAPTURE(i);
      REQUIRE(got[i].status == Status::success);
      CHECK(got[i].request == ids[i]);
      const auto [logits, kv] = alone(model, store, ps[i], method);
      CHECK(got[i].logits == logits);
      check_same_kv(engine.gather(ids[i]), kv);  // the rows scattered back into the pages
    }
    CHECK(engine.step().empty());  // every request is prefilled
    for (std::uint64_t id : ids) engine.finish(id);
    CHECK(engine.free_pages() == 8);
  }
}

TEST_CASE("PagedBatchEngine: one request's failed read leaves the others unchanged; it is recomputed next step") {
  const CpuLlama model = small_llama();
  const std::vector<Prompt> ps = prompts();
  // A chunk only the second request uses, its entry failing every read.
  const Prompt lonely = assemble({kSystem, chunk_tokens(10, 77), kA}, kQuery);
  FailingStore store;
  store_chunk_caches(model, store, {ps[0], lonely, ps[1]});
  const KVKey lonely_key = chunk_cache_key(model.fingerprint(), chunk_tokens(10, 77));
  store.fail_key = lonely_key;

  Engine engine(model, store, 16);
  const std::uint64_t first = engine.admit(ps[0].tokens, ps[0].layout, parse_method("cacheblend"));
  const std::uint64_t failing = engine.admit(lonely.tokens, lonely.layout, parse_method("cacheblend"));
  const std::uint64_t third = engine.admit(ps[1].tokens, ps[1].layout, parse_method("naive"));
  const std::vector<Engine::StepResult> got = engine.step();
  REQUIRE(got.size() == 3);
  CHECK(got[1].request == failing);
  CHECK(got[1].status == Status::corrupt_entry);
  CHECK(got[1].logits.empty());
  REQUIRE(got[0].status == Status::success);
  REQUIRE(got[2].status == Status::success);
  CHECK(got[0].logits == alone(model, store, ps[0], "cacheblend").first);
  CHECK(got[2].logits == alone(model, store, ps[1], "naive").first);

  // The next step runs the failed request alone, its chunk computed in context: as with the entry gone.
  const std::vector<Engine::StepResult> again = engine.step();
  REQUIRE(again.size() == 1);
  CHECK(again[0].request == failing);
  REQUIRE(again[0].status == Status::success);
  store.fail_key.reset();
  (void)store.erase(lonely_key);
  const auto [logits, kv] = alone(model, store, lonely, "cacheblend");
  CHECK(again[0].logits == logits);
  check_same_kv(engine.gather(failing), kv);

  for (std::uint64_t id : {first, failing, third}) engine.finish(id);
  CHECK(engine.free_pages() == 16);
}

TEST_CASE("PagedBatchEngine with cachecraft through the public VariantBook: the first request's chunks become "
          "variants; a request in another order loads them and gets FusionPipeline's logits and KV after "
          "record_context of the first; a variant whose read fails is forgotten") {
  const CpuLlama model = small_llama();
  const std::vector<Prompt> ps = prompts();
  FailingStore store;  // empty: the first request finds no variant
  Engine engine(model, store, 16);
  const std::uint64_t first = engine.admit(ps[0].tokens, ps[0].layout, parse_method("cachecraft"));
  const std::vector<Engine::StepResult> cold = engine.step();
  REQUIRE(cold.size() == 1);
  REQUIRE(cold[0].status == Status::success);
  FailingStore empty;
  CHECK(cold[0].logits == alone(model, empty, ps[0], "full").first);  // every row computed: full prefill
  CHECK(engine.variants().size() == 4);  // system, A, B, C: each computed on every layer
  CHECK(store.inner.size() == 4);

  // The reference: the single-request driver with the first prompt recorded as context.
  FailingStore reference_store;
  CpuLlamaFusion reference_engine(model);
  FusionPipeline pipeline(reference_engine, reference_store);
  pipeline.record_context(ps[0].tokens, ps[0].layout);
  const FusionPlan expected = pipeline.plan(ps[1].tokens, ps[1].layout, parse_method("cachecraft"));
  for (const ChunkPlan& c : expected.chunks) CHECK(c.source == KVSource::variant);
  const std::vector<float> reference = pipeline.run(ps[1].tokens, ps[1].layout, parse_method("cachecraft")).logits;

  const std::uint64_t second = engine.admit(ps[1].tokens, ps[1].layout, parse_method("cachecraft"));
  const std::vector<Engine::StepResult> warm = engine.step();
  REQUIRE(warm.size() == 1);
  REQUIRE(warm[0].status == Status::success);
  CHECK(warm[0].logits == reference);
  check_same_kv(engine.gather(second), reference_engine.kv());

  // A variant whose KV the store lost: the read fails, the variant is forgotten, the chunk is computed next step.
  const std::vector<VariantEntry> held = engine.variants().entries();
  const auto c_variant =  // the variant C's plan loads
      std::find_if(held.begin(), held.end(), [&](const VariantEntry& v) { return v.kv == expected.chunks[1].key; });
  REQUIRE(c_variant != held.end());
  const VariantEntry lost = *c_variant;
  REQUIRE(store.inner.erase(lost.kv));
  const std::uint64_t third = engine.admit(ps[1].tokens, ps[1].layout, parse_method("cachecraft"));
  const std::vector<Engine::StepResult> failed = engine.step();
  REQUIRE(failed.size() == 1);
  CHECK(failed[0].status != Status::success);
  for (const VariantEntry& v : engine.variants().entries()) CHECK(v.id != lost.id);
  const std::vector<Engine::StepResult> again = engine.step();
  REQUIRE(again.size() == 1);
  CHECK(again[0].status == Status::success);
  for (std::uint64_t id : {first, second, third}) engine.finish(id);
  CHECK(engine.free_pages() == 16);
}

}  // namespace unit_paged_batch
