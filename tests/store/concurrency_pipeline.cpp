// 64 concurrent requests on five FusionPipelines (two models, one engine each) over one shared TieredKVStore
// (memory over disk): prompts built from a small pool of chunks, so requests share chunk caches; CacheBlend, Epic's
// AttnLink, Cache-Craft, naive reuse, prefix caching and full prefill mixed; chunk caches put (store_chunk_caches)
// while other requests read the same keys; Cache-Craft variants evicted and erased (record_context on pipelines
// with a two-variant cache) while other requests run. Every request's logits must equal, bit for bit, those of the
// same request run alone on a fresh store, and nothing may throw.
#include <doctest/doctest.h>

#include <cstddef>
#include <cstdint>
#include <exception>
#include <latch>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "kvfuse/backend/disk_kv_store.hpp"
#include "kvfuse/backend/in_memory_store.hpp"
#include "kvfuse/backend/tiered_kv_store.hpp"
#include "kvfuse/cpu.hpp"
#include "kvfuse/fusion/fusion_pipeline.hpp"

#include "../support/fusion_prompts.hpp"
#include "../support/small_llama.hpp"
#include "../support/test_util.hpp"

// Each store test file lives in its own namespace: the files are compiled together (a unity build).
namespace store_concurrency_pipeline {

using namespace kvfuse;
using kvfuse_test::assemble;
using kvfuse_test::chunk_tokens;
using kvfuse_test::Prompt;

namespace {

using Tiered = TieredKVStore<InMemoryKVStore, DiskKVStore>;
using Pipeline = FusionPipeline<CpuLlamaFusion, Tiered>;

constexpr int kRequests = 64;

const std::vector<std::vector<token_id>>& chunk_pool() {
  static const std::vector<std::vector<token_id>> pool = [] {
    std::vector<std::vector<token_id>> p;
    for (std::uint32_t i = 0; i < 8; ++i) p.push_back(chunk_tokens(5 + (i * 3) % 8, 20 + i));
    return p;
  }();
  return pool;
}

Prompt prompt_of(const std::vector<int>& chunks, int query) {
  std::vector<std::vector<token_id>> parts{kvfuse_test::kSystem};
  for (int c : chunks) parts.push_back(chunk_pool()[static_cast<std::size_t>(c)]);
  return assemble(parts, chunk_tokens(4 + static_cast<std::size_t>(query), 60 + static_cast<std::uint32_t>(query)));
}

// Earlier prompts the model-1 pipelines recorded offline (Cache-Craft's variants, prefix-cache entries).
const std::vector<Prompt>& offline_contexts() {
  static const std::vector<Prompt> contexts{prompt_of({0, 1, 2}, 0), prompt_of({3, 4, 5}, 1), prompt_of({6, 7, 0}, 2),
                                            prompt_of({2, 5, 7}, 0)};
  return contexts;
}

// One request: on model 1 (store_chunk_caches when the method reuses isolated caches, then run) or on model 2
// (record_context of an earlier prompt, which evicts variants from a two-variant cache and erases their KV, then
// store_chunk_caches and run).
struct Request {
  bool model2 = false;
  Prompt prompt;
  std::string method;
  std::optional<Prompt> context;  // model 2: recorded first
};

Request request_of(int r) {
  static const std::vector<std::vector<int>> triples{{0, 1, 2}, {1, 2, 3}, {2, 0, 4}, {3, 4, 5},
                                                     {5, 6, 7}, {6, 7, 0}, {2, 5, 7}, {4, 1, 6}};
  Request q;
  q.model2 = r % 4 == 3;
  q.prompt = prompt_of(triples[static_cast<std::size_t>(r) % triples.size()], r % 3);
  if (q.model2) {
    static const std::vector<std::string> methods{"full", "cacheblend", "attnlink@4"};
    q.method = methods[static_cast<std::size_t>(r / 4) % methods.size()];
    q.context = prompt_of(triples[static_cast<std::size_t>(r + 3) % triples.size()], (r + 1) % 3);
  } else {
    static const std::vector<std::string> methods{"cacheblend", "attnlink@4", "cachecraft", "full", "naive", "prefix"};
    q.method = methods[static_cast<std::size_t>(r) % methods.size()];
  }
  return q;
}

VariantCacheConfig variant_config(bool model2) {
  VariantCacheConfig c;
  if (model2) {  // two variants: every record_context evicts, and erases the evicted KV from the shared store
    c.num_chunks = 2;
    c.variants_per_chunk = 1;
  }
  return c;
}

void setup(Pipeline& pipeline, bool model2) {
  if (!model2)
    for (const Prompt& c : offline_contexts()) pipeline.record_context(c.tokens, c.layout);
}

std::vector<float> serve(Pipeline& pipeline, const Request& q) {
  const FusionMethod method = parse_method(q.method);
  if (q.context) pipeline.record_context(q.context->tokens, q.context->layout);
  if (q.method != "full" && q.method != "prefix" && q.method != "cachecraft")
    pipeline.store_chunk_caches(q.prompt.tokens, q.prompt.layout);
  (void)pipeline.plan(q.prompt.tokens, q.prompt.layout, method);
  return pipeline.run(q.prompt.tokens, q.prompt.layout, method).logits;
}

}  // namespace

TEST_CASE("64 concurrent requests on five pipelines over one tiered store: each as if it ran alone") {
  const CpuLlama model1 = kvfuse_test::small_llama(5);
  const CpuLlama model2 = kvfuse_test::small_llama(6);
  std::vector<Request> requests;
  for (int r = 0; r < kRequests; ++r) requests.push_back(request_of(r));

  // Alone: a fresh store, a fresh engine and pipeline with the same offline setup, then the request.
  std::vector<std::vector<float>> alone;
  for (const Request& q : requests) {
    kvfuse_test::TempDir tmp;
    InMemoryKVStore memory;
    DiskKVStore disk(tmp.path);
    Tiered tiered(memory, disk);
    CpuLlamaFusion engine(q.model2 ? model2 : model1);
    Pipeline pipeline(engine, tiered, variant_config(q.model2));
    setup(pipeline, q.model2);
    alone.push_back(serve(pipeline, q));
  }

  // Together: three pipelines of model 1 and two of model 2 (one engine each) on one store, 64 threads.
  kvfuse_test::TempDir tmp;
  InMemoryKVStore memory;
  DiskKVStore disk(tmp.path);
  Tiered tiered(memory, disk);
  std::vector<std::unique_ptr<CpuLlamaFusion>> engines;
  std::vector<std::unique_ptr<Pipeline>> pipelines;
  for (int i = 0; i < 5; ++i) {
    const bool m2 = i >= 3;
    engines.push_back(std::make_unique<CpuLlamaFusion>(m2 ? model2 : model1));
    pipelines.push_back(std::make_unique<Pipeline>(*engines.back(), tiered, variant_config(m2)));
    setup(*pipelines.back(), m2);
  }
  std::vector<std::vector<float>> together(kRequests);
  std::vector<std::string> errors(kRequests);
  std::latch start(kRequests);
  std::vector<std::thread> threads;
  for (int r = 0; r < kRequests; ++r) {
    threads.emplace_back([&, r] {
      const Request& q = requests[static_cast<std::size_t>(r)];
      Pipeline& pipeline = *pipelines[static_cast<std::size_t>(q.model2 ? 3 + r % 2 : r % 3)];
      start.arrive_and_wait();
      try {
        together[static_cast<std::size_t>(r)] = serve(pipeline, q);
      } catch (const std::exception& e) {
        errors[static_cast<std::size_t>(r)] = e.what();
      }
    });
  }
  for (std::thread& t : threads) t.join();

  for (int r = 0; r < kRequests; ++r) {
    CAPTURE(r);
    CAPTURE(requests[static_cast<std::size_t>(r)].method);
    CHECK(errors[static_cast<std::size_t>(r)] == "");
    CHECK(together[static_cast<std::size_t>(r)] == alone[static_cast<std::size_t>(r)]);
  }
  CHECK(tiered.put_failures(0) == 0);
  CHECK(tiered.put_failures(1) == 0);
  CHECK(disk.rejected() == 0);
  // The model-2 caches evicted (and erased) variants: each holds at most its two, all of them in the store or
  // dropped at its next Cache-Craft run.
  for (int i = 3; i < 5; ++i) CHECK(pipelines[static_cast<std::size_t>(i)]->variants().size() <= 2);
}

}  // namespace store_concurrency_pipeline
