// LlamaCppBatchEngine on the real SmolLM2 model: several requests per llama_decode give each request exactly the
// logits and tokens it gets alone, whatever the others do (arrive, decode, get cancelled, read broken entries);
// bad requests and models are refused by name.
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include <doctest/doctest.h>

#include "passages.hpp"

#include "kvfuse/backend/in_memory_store.hpp"
#include "kvfuse/fusion/fusion_pipeline.hpp"
#include "kvfuse/llamacpp.hpp"
#include "kvfuse/llamacpp_batch.hpp"
#include "kvfuse/model/gguf.hpp"
#include "kvfuse/harness/rag_prompt.hpp"
#include "kvfuse/model/tokenizer.hpp"
#include "support/model_path.hpp"

namespace {

using kvfuse::llamacpp::BatchEvent;
using kvfuse::llamacpp::BatchFinish;
using kvfuse::llamacpp::BatchOptions;
using kvfuse::llamacpp::BatchRequest;
using kvfuse::llamacpp::LlamaCppFusion;
using kvfuse_test::RealModel;
using Engine = kvfuse::llamacpp::LlamaCppBatchEngine<kvfuse::InMemoryKVStore>;

using kvfuse_llamacpp_test::kPassages;

BatchRequest rag_request(const std::filesystem::path& model, std::vector<std::string> passages,
                         kvfuse::FusionMethod method) {
  const kvfuse::GGUFFile file = kvfuse::GGUFFile::open(model);
  const kvfuse::Tokenizer tok = kvfuse::Tokenizer::from_gguf(file);
  const kvfuse::RagPrompt p = kvfuse::build_rag_prompt(
      tok, "Answer the question using the documents.", passages, "Which river flows through the capital of the country "
                                                                 "where the composer of the opera was born?");
  BatchRequest r;
  r.tokens = p.tokens;
  r.layout = p.layout();
  r.method = std::move(method);
  r.max_new_tokens = 6;
  return r;
}

// The passages in another order: a different prompt over the same chunk caches.
std::vector<std::string> rotated(std::size_t by) {
  std::vector<std::string> p = kPassages;
  std::rotate(p.begin(), p.begin() + static_cast<std::ptrdiff_t>(by), p.end());
  return p;
}

struct Outcome {
  std::vector<float> logits;               // of the prompt's last row
  std::vector<kvfuse::token_id> tokens;
  std::int64_t rejected = 0;
  BatchFinish finish = BatchFinish::none;
};

void record(std::map<std::uint64_t, Outcome>& out, const std::vector<BatchEvent>& events) {
  for (const BatchEvent& e : events) {
    CHECK_MESSAGE(e.finish != BatchFinish::error, e.error);
    Outcome& o = out[e.request];
    if (!e.logits.empty()) {
      o.logits = e.logits;
      o.rejected = e.rejected_entries;
    }
    if (e.token) o.tokens.push_back(*e.token);
    if (e.finish != BatchFinish::none) o.finish = e.finish;
  }
}

std::map<std::uint64_t, Outcome> run_until_idle(Engine& engine, std::map<std::uint64_t, Outcome> out = {}) {
  while (!engine.idle()) record(out, engine.step());
  return out;
}

Outcome alone(Engine& engine, const BatchRequest& r) {
  REQUIRE(engine.idle());
  const std::uint64_t id = engine.submit(r);
  return run_until_idle(engine).at(id);
}

// Bit for bit: the same logits and the same tokens.
void check_equal(const Outcome& batched, const Outcome& solo) {
  REQUIRE(batched.logits.size() == solo.logits.size());
  CHECK(std::memcmp(batched.logits.data(), solo.logits.data(), solo.logits.size() * sizeof(float)) == 0);
  CHECK(batched.tokens == solo.tokens);
  CHECK(batched.tokens.size() == 6);
  CHECK(batched.finish == BatchFinish::length);
}

// SmolLM2, its chunk caches stored by FusionPipeline over LlamaCppFusion (the same block format and fingerprint),
// and Cache-Craft's variants recorded from an earlier prompt.
struct Setup {
  std::filesystem::path model;
  kvfuse::InMemoryKVStore store;
  std::unique_ptr<LlamaCppFusion> fusion;
  std::unique_ptr<kvfuse::FusionPipeline<LlamaCppFusion, kvfuse::InMemoryKVStore>> pipeline;

  explicit Setup(std::filesystem::path path) : model(std::move(path)) {
    fusion = std::make_unique<LlamaCppFusion>(model, kvfuse::llamacpp::LlamaCppOptions{.n_ctx = 2048});
    pipeline = std::make_unique<kvfuse::FusionPipeline<LlamaCppFusion, kvfuse::InMemoryKVStore>>(*fusion, store);
    const BatchRequest r = rag_request(model, kPassages, kvfuse::FullRecompute{});
    pipeline->store_chunk_caches(r.tokens, r.layout);
    std::vector<std::string> earlier = kPassages;
    std::reverse(earlier.begin() + 1, earlier.end());
    const BatchRequest warm = rag_request(model, earlier, kvfuse::FullRecompute{});
    pipeline->record_context(warm.tokens, warm.layout);
  }

  // Full prefill, naive reuse, AttnLink and Cache-Craft, each on its own prompt.
  [[nodiscard]] std::vector<BatchRequest> four_methods() const {
    std::vector<BatchRequest> r = {rag_request(model, rotated(1), kvfuse::FullRecompute{}),
                                   rag_request(model, rotated(2), kvfuse::NaiveReuse{}),
                                   rag_request(model, rotated(3), kvfuse::parse_method("attnlink@16")),
                                   rag_request(model, kPassages, kvfuse::parse_method("cachecraft-nofocus"))};
    r[3].variants = pipeline->variant_index();
    return r;
  }
};

std::optional<std::filesystem::path> smollm2() { return kvfuse_test::real_model(true, RealModel::smollm2); }

BatchOptions options() {
  BatchOptions o;
  o.llama.threads = 2;
  o.region_cells = 512;
  return o;
}

}  // namespace

TEST_CASE("llama.cpp batch: full, naive, AttnLink and Cache-Craft requests in one engine each give the first-token "
          "logits and greedy tokens of the same request alone, bit for bit") {
  const auto model = smollm2();
  if (!model) return;
  Setup setup(*model);
  Engine engine(*model, setup.store, options());
  CHECK(engine.model_fingerprint() == setup.fusion->model_fingerprint());
  const std::vector<BatchRequest> requests = setup.four_methods();
  std::vector<std::uint64_t> ids;
  for (const BatchRequest& r : requests) ids.push_back(engine.submit(r));
  // Every request's S_0 is the plan FusionPipeline makes for it, and stored blocks are used.
  std::map<std::uint64_t, Outcome> first;
  record(first, engine.step());
  for (std::size_t i = 0; i < ids.size(); ++i)
    CHECK(engine.plan(ids[i]).initial == setup.pipeline->plan(requests[i].tokens, requests[i].layout,
                                                                  requests[i].method).initial);
  CHECK(engine.plan(ids[1]).initial.size() < requests[1].tokens.size() / 4);
  CHECK(engine.plan(ids[3]).chunks[1].source == kvfuse::KVSource::variant);
  const std::map<std::uint64_t, Outcome> batched = run_until_idle(engine, std::move(first));
  for (std::size_t i = 0; i < ids.size(); ++i) {
    CAPTURE(i);
    const Outcome& b = batched.at(ids[i]);
    CHECK(b.rejected == 0);
    check_equal(b, alone(engine, requests[i]));
    // And close to FusionPipeline's run of it on LlamaCppFusion, whose cells sit elsewhere (rounding only).
    const kvfuse::FusionResult single = setup.pipeline->run(requests[i].tokens, requests[i].layout, requests[i].method);
    CHECK(kvfuse::argmax_token(b.logits) == kvfuse::argmax_token(single.logits));
  }
}

TEST_CASE("llama.cpp batch: a request arriving while others decode, and a decode step of one request, leave every "
          "request's logits and tokens as alone") {
  const auto model = smollm2();
  if (!model) return;
  Setup setup(*model);
  Engine engine(*model, setup.store, options());
  const std::vector<BatchRequest> requests = setup.four_methods();
  const std::uint64_t a = engine.submit(requests[0]);
  const std::uint64_t b = engine.submit(requests[2]);
  std::map<std::uint64_t, Outcome> out;
  while (out[a].tokens.size() < 2 || out[b].tokens.empty()) record(out, engine.step());
  const std::uint64_t c = engine.submit(requests[1]);  // a and b decode while c prefills
  out = run_until_idle(engine, std::move(out));
  check_equal(out.at(a), alone(engine, requests[0]));
  check_equal(out.at(b), alone(engine, requests[2]));
  check_equal(out.at(c), alone(engine, requests[1]));
  // Alone, a decode step holds the request's token and the throwaway one.
  (void)engine.submit(requests[1]);
  std::map<std::uint64_t, Outcome> solo;
  while (solo.empty() || solo.begin()->second.tokens.empty()) record(solo, engine.step());
  (void)engine.step();
  CHECK(engine.last_step_tokens() == 2);
  (void)run_until_idle(engine);
}

TEST_CASE("llama.cpp batch: a cancelled request frees its cells for the next and the others are unchanged") {
  const auto model = smollm2();
  if (!model) return;
  Setup setup(*model);
  BatchOptions o = options();
  o.max_requests = 2;
  Engine engine(*model, setup.store, o);
  const std::vector<BatchRequest> requests = setup.four_methods();
  const std::uint64_t a = engine.submit(requests[1]);
  const std::uint64_t b = engine.submit(requests[2]);
  const std::uint64_t c = engine.submit(requests[0]);  // waits for a region
  std::map<std::uint64_t, Outcome> out;
  while (out[b].tokens.empty()) record(out, engine.step());
  CHECK(engine.running() == 2);
  CHECK(engine.request_cells(b) == static_cast<std::int64_t>(requests[2].tokens.size()));
  engine.cancel(b);
  out = run_until_idle(engine, std::move(out));
  CHECK(out.at(b).finish == BatchFinish::cancelled);
  check_equal(out.at(a), alone(engine, requests[1]));
  check_equal(out.at(c), alone(engine, requests[0]));  // in b's cells
  // A request cancelled before it ran never gets a token.
  const std::uint64_t d = engine.submit(requests[3]);
  engine.cancel(d);
  const std::map<std::uint64_t, Outcome> gone = run_until_idle(engine);
  CHECK(gone.at(d).finish == BatchFinish::cancelled);
  CHECK(gone.at(d).tokens.empty());
}

TEST_CASE("llama.cpp batch: entries of one request that fail to read are computed instead and leave the other "
          "requests' results unchanged") {
  const auto model = smollm2();
  if (!model) return;
  Setup setup(*model);
  Engine engine(*model, setup.store, options());
  const std::vector<BatchRequest> requests = setup.four_methods();
  const BatchRequest good = requests[2];  // AttnLink over rotated(3)
  // A fifth passage only the broken request has, and a second: one stored truncated, one that llama.cpp refuses.
  std::vector<std::string> passages = kPassages;
  passages.push_back("The Elbe rises in the Krkonose mountains and flows through Dresden and Magdeburg.");
  passages.push_back("Hamburg is the second largest city of Germany, on the Elbe near the North Sea.");
  const BatchRequest broken = rag_request(*model, passages, kvfuse::NaiveReuse{});
  setup.pipeline->store_chunk_caches(broken.tokens, broken.layout);
  const std::size_t n = broken.layout.chunks.size();
  const auto key_of = [&](std::size_t j) {
    const kvfuse::TokenRange r = broken.layout.chunks[j].range;
    return setup.pipeline->isolated_key(
        std::span(broken.tokens).subspan(static_cast<std::size_t>(r.begin), static_cast<std::size_t>(r.size())));
  };
  kvfuse::KVBlock truncated = *setup.store.get(key_of(n - 2));
  truncated.bytes.resize(truncated.bytes.size() - 1);
  setup.store.put(key_of(n - 2), truncated);
  // llama.cpp's sequence state: 8 bytes, the stream and cell counts, 12 bytes per cell, V transposed, the layer
  // count — a layer count the model does not have makes llama.cpp refuse it after it took the cells.
  kvfuse::KVBlock refused = *setup.store.get(key_of(n - 1));
  const std::uint32_t layers = 999;
  std::memcpy(refused.bytes.data() + 16 + 12 * refused.num_tokens + 4, &layers, 4);
  setup.store.put(key_of(n - 1), refused);

  const std::uint64_t g = engine.submit(good);
  const std::uint64_t x = engine.submit(broken);
  const std::map<std::uint64_t, Outcome> out = run_until_idle(engine);
  CHECK(out.at(x).rejected == 2);
  CHECK(out.at(g).rejected == 0);
  check_equal(out.at(g), alone(engine, good));
  const Outcome broken_alone = alone(engine, broken);
  CHECK(broken_alone.rejected == 2);
  check_equal(out.at(x), broken_alone);
}

TEST_CASE("llama.cpp batch: bad requests are refused at submit naming the bad value, and so are per-layer methods "
          "and sliding-window models") {
  const auto model = smollm2();
  if (!model) return;
  kvfuse::InMemoryKVStore store;
  Engine engine(*model, store, options());
  BatchRequest r = rag_request(*model, kPassages, kvfuse::NaiveReuse{});
  BatchRequest bad = r;
  bad.tokens[3] = -5;
  CHECK_THROWS_WITH_AS(engine.submit(bad), doctest::Contains("token -5 at index 3"), kvfuse::error);
  bad = r;
  bad.max_new_tokens = 0;
  CHECK_THROWS_WITH_AS(engine.submit(bad), doctest::Contains("max_new_tokens = 0"), kvfuse::error);
  bad = r;
  bad.max_new_tokens = 500;
  try {
    (void)engine.submit(bad);
    FAIL("accepted");
  } catch (const kvfuse::error& e) {
    CHECK(e.code() == kvfuse::Status::beyond_context);
    CHECK(std::string(e.what()).find("BatchOptions::region_cells") != std::string::npos);
  }
  bad = r;
  bad.tokens.pop_back();
  CHECK_THROWS_AS(engine.submit(bad), kvfuse::error);  // the layout covers one token more
  bad = r;
  bad.method = kvfuse::parse_method("cacheblend");
  CHECK_THROWS_WITH_AS(engine.submit(bad), doctest::Contains("changes the recomputed set per layer"), kvfuse::error);
  CHECK(engine.idle());
  BatchOptions odd = options();
  odd.region_cells = 300;
  CHECK_THROWS_WITH_AS(Engine(*model, store, odd), doctest::Contains("region_cells 300"), kvfuse::error);
  if (const auto gemma = kvfuse_test::real_model(true, RealModel::gemma3))
    CHECK_THROWS_WITH_AS(Engine(*gemma, store, options()), doctest::Contains("sliding-window layers"), kvfuse::error);
}
