// QueryProbe: the selector's layer fusion and order, the engine's report of the query's attention on every row,
// and the two passes through the one loop (FusionPipeline on the CPU backend): r = 1 is full prefill, r = 0 is
// naive reuse, both bit for bit; FusionConnector hands an engine's step loop the second pass (CpuBatchEngine ==
// FusionPipeline alone: tests/unit/batch_engine.cpp). The small random-weights Llama of the other fusion tests.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "kvfuse/backend/in_memory_store.hpp"
#include "kvfuse/core/status.hpp"
#include "kvfuse/cpu.hpp"
#include "kvfuse/fusion/connector.hpp"
#include "kvfuse/fusion/fusion_pipeline.hpp"
#include "kvfuse/select/query_probe_selector.hpp"

#include "../support/error_of.hpp"
#include "../support/fusion_prompts.hpp"
#include "../support/small_llama.hpp"
#include "../support/test_util.hpp"

// Each unit test file lives in its own namespace: the files are compiled together (a unity build).
namespace unit_query_probe {

using namespace kvfuse;
using kvfuse_test::assemble;
using kvfuse_test::diff;
using kvfuse_test::kA;
using kvfuse_test::kB;
using kvfuse_test::kC;
using kvfuse_test::kQuery;
using kvfuse_test::kSystem;
using kvfuse_test::Prompt;
using kvfuse_test::small_llama;

TEST_CASE("QueryProbeSelector keeps the candidates of highest mean share over the layers; ties to the lower row") {
  QueryProbeSelector s({2, 3, 5, 7}, 0.5, 2);
  // Layer 0: rows 2 and 3 take shares 1/4 and 3/4 of the candidates' mass (row 0, not a candidate, is ignored);
  // layer 1: rows 5 and 7 half each. Means: 2: 1/8, 3: 3/8, 5: 1/4, 7: 1/4 -> 3, then 5 before 7 (lower row).
  s.observe(0, std::vector<float>{9, 0, 1, 3, 0, 0, 0, 0});
  s.observe(1, std::vector<float>{0, 0, 0, 0, 0, 2, 0, 2});
  CHECK(s.layers_seen() == 2);
  CHECK(s.select() == TokenSet{3, 5});
  // A layer whose candidates get no weight adds nothing; r = 0 keeps none, r = 1 every candidate.
  QueryProbeSelector none({2, 3}, 0.0, 1);
  none.observe(0, std::vector<float>{1, 0, 0, 0});
  CHECK(none.select().empty());
  QueryProbeSelector all({2, 3}, 1.0, 1);
  all.observe(0, std::vector<float>{1, 0, 0, 0});
  CHECK(all.select() == TokenSet{2, 3});
  // A NaN row (a corrupt stored row) ranks first: it is recomputed, not kept.
  QueryProbeSelector corrupt({1, 2, 3}, 0.34, 1);
  corrupt.observe(0, std::vector<float>{0, 5, std::numeric_limits<float>::quiet_NaN(), 1});
  CHECK(corrupt.select() == TokenSet{2});
}

TEST_CASE("QueryProbeSelector refuses a bad ratio, unsorted candidates, layers out of order and short reports") {
  const auto message = [](auto&& f) { return kvfuse_test::error_of(f); };
  CHECK(message([] { QueryProbeSelector({1}, 1.5, 1); }).find("ratio 1.5 is not in [0, 1]") != std::string::npos);
  CHECK(message([] { QueryProbeSelector({3, 1}, 0.5, 1); }).find("not sorted and distinct") != std::string::npos);
  QueryProbeSelector s({1, 4}, 0.5, 2);
  CHECK(message([&] { s.observe(1, std::vector<float>(5, 1.0f)); }).find("layer 1 observed after 0 layers") !=
        std::string::npos);
  CHECK(message([&] { s.observe(0, std::vector<float>(3, 1.0f)); }).find("candidate row 4 needs more") !=
        std::string::npos);
}

TEST_CASE("queryprobe method names: r round trips, a bad r is refused by name") {
  CHECK(method_name(parse_method("queryprobe")) == "queryprobe");
  CHECK(std::get<QueryProbe>(parse_method("queryprobe")).recompute_ratio == 0.15);
  CHECK(method_name(parse_method("queryprobe@0.3")) == "queryprobe@0.3");
  CHECK(std::get<QueryProbe>(parse_method("queryprobe@0.3")).recompute_ratio == 0.3);
  CHECK(kvfuse_test::error_of([] { (void)parse_method("queryprobe@1.2"); }).find("r = 1.2 must be in [0, 1]") !=
        std::string::npos);
  CHECK(kvfuse_test::error_of([] { (void)parse_method("queryprobe@x"); }).find("'x' is not a number") !=
        std::string::npos);
}

TEST_CASE("CpuLlama reports the query's attention on every row: |query| x heads per layer, query_mass on S_l") {
  const CpuLlama model = small_llama();
  const Prompt p = assemble({kSystem, kA, kB, kC}, kQuery);
  LlamaKVCache kv = model.full_prefill(p.tokens).kv;
  TokenSet rows;  // the query rows and a few others
  for (std::int64_t t : {2, 9}) rows.push_back(t);
  append_range(rows, p.layout.query);
  std::vector<std::vector<float>> all, selected;
  const SelectionPolicy record = [&](const LayerReport& r) {
    all.emplace_back(r.row_query_mass.begin(), r.row_query_mass.end());
    selected.emplace_back(r.query_mass.begin(), r.query_mass.end());
    return r.selected;
  };
  PartialPrefillOptions options;
  options.query_mass_rows = p.layout.query;
  (void)model.partial_prefill(p.tokens, kv, rows, record, options);
  REQUIRE(all.size() == static_cast<std::size_t>(model.config().n_layer));
  for (std::size_t l = 0; l < all.size(); ++l) {
    CAPTURE(l);
    REQUIRE(all[l].size() == p.tokens.size());
    double total = 0.0;
    for (float w : all[l]) total += w;
    CHECK(total == doctest::Approx(static_cast<double>(kQuery.size() * model.config().n_head)).epsilon(1e-5));
    for (std::size_t i = 0; i < rows.size(); ++i) CHECK(selected[l][i] == all[l][static_cast<std::size_t>(rows[i])]);
  }
  // Without the query mass asked for, neither is reported.
  all.clear();
  (void)model.partial_prefill(p.tokens, kv, rows, record);
  for (const std::vector<float>& m : all) CHECK(m.empty());
}

TEST_CASE("queryprobe: r = 1 is full prefill and r = 0 naive reuse, bit for bit; the second pass adds r x reused") {
  const CpuLlama model = small_llama();
  const Prompt p = assemble({kSystem, kA, kB, kC}, kQuery);
  const auto n = static_cast<std::int64_t>(p.tokens.size());
  const std::int64_t layers = model.config().n_layer;
  InMemoryKVStore store;
  CpuLlamaFusion engine(model);
  FusionPipeline pipeline(engine, store);
  pipeline.store_chunk_caches(p.tokens, p.layout);

  const FusionResult full = pipeline.run(p.tokens, p.layout, FullRecompute{});
  const LlamaKVCache full_kv = engine.kv();
  const FusionResult naive = pipeline.run(p.tokens, p.layout, NaiveReuse{});
  const LlamaKVCache naive_kv = engine.kv();
  const auto naive_rows = static_cast<std::int64_t>(naive.plan.initial.size());
  const std::int64_t reused = n - naive_rows;

  const FusionResult everything = pipeline.run(p.tokens, p.layout, parse_method("queryprobe@1"));
  CHECK(everything.plan.two_pass);
  CHECK(everything.plan.per_layer);
  CHECK(everything.plan.statistics.query_mass);
  CHECK(everything.logits == full.logits);
  for (std::size_t l = 0; l < full_kv.k.size(); ++l) {
    CHECK(engine.kv().k[l] == full_kv.k[l]);
    CHECK(engine.kv().v[l] == full_kv.v[l]);
  }
  CHECK(diff(everything.logits, model.full_prefill(p.tokens).logits).rounding());

  const FusionResult nothing = pipeline.run(p.tokens, p.layout, parse_method("queryprobe@0"));
  CHECK(nothing.logits == naive.logits);
  for (std::size_t l = 0; l < naive_kv.k.size(); ++l) {
    CHECK(engine.kv().k[l] == naive_kv.k[l]);
    CHECK(engine.kv().v[l] == naive_kv.v[l]);
  }

  // Each layer's count is the probe's rows (the naive ones) plus the second pass's: the naive ones and
  // round(r x reused) reused rows.
  const FusionResult probe = pipeline.run(p.tokens, p.layout, parse_method("queryprobe@0.5"));
  const std::int64_t chosen = detail::keep_count(0.5, reused);
  REQUIRE(probe.selected_per_layer.size() == static_cast<std::size_t>(layers));
  for (std::int64_t s : probe.selected_per_layer) CHECK(s == naive_rows + naive_rows + chosen);
  CHECK(probe.recompute_fraction ==
        doctest::Approx(static_cast<double>(2 * naive_rows + chosen) / static_cast<double>(n)));
  CHECK(probe.logits != naive.logits);
  CHECK(probe.logits != full.logits);
}

TEST_CASE("queryprobe with nothing stored: no second pass, the probe pass is full prefill, bit for bit") {
  const CpuLlama model = small_llama();
  const Prompt p = assemble({kSystem, kA, kB, kC}, kQuery);
  InMemoryKVStore store;  // empty: every chunk computed
  CpuLlamaFusion engine(model);
  FusionPipeline pipeline(engine, store);
  const FusionResult full = pipeline.run(p.tokens, p.layout, FullRecompute{});
  const FusionResult probe = pipeline.run(p.tokens, p.layout, parse_method("queryprobe@0.5"));
  CHECK(probe.plan.two_pass);
  CHECK(probe.recompute_fraction == 1.0);  // one pass of every row, not two
  CHECK(probe.logits == full.logits);
}

TEST_CASE("FusionConnector::second_pass: the rows QueryProbe's probe chose, after its last layer and not before") {
  const CpuLlama model = small_llama();
  const Prompt p = assemble({kSystem, kA, kB, kC}, kQuery);
  InMemoryKVStore store;
  CpuLlamaFusion engine(model);
  FusionPipeline pipeline(engine, store);
  pipeline.store_chunk_caches(p.tokens, p.layout);
  FusionConnector connector(store, engine_shape(engine));
  const FusionMethod method = parse_method("queryprobe@0.5");
  const FusionPlan plan = connector.plan(1, p.tokens, p.layout, method);
  CHECK(plan.two_pass);
  REQUIRE(connector.start(plan, method) == Status::success);
  TokenSet rows;
  CHECK(connector.second_pass(1, rows) == Status::invalid_argument);
  CHECK(std::string(last_status_message()).find("has not run the last layer of its probe pass") != std::string::npos);
  // The probe pass as an engine runs it: the loaded layers installed, the connector's policy after every layer.
  engine.begin(p.tokens);
  for (const ChunkPlan& c : plan.chunks) {
    if (c.source != KVSource::isolated) continue;
    engine.load_rows(c.range, *store.get(c.key));
    engine.shift_rows(c.range, c.shift());
  }
  const SelectionPolicy next = [&](const LayerReport& r) {
    TokenSet s;
    REQUIRE(connector.after_layer(1, r, s) == Status::success);
    return s.empty() ? r.selected : s;
  };
  (void)engine.prefill(plan.initial, next, StatisticsRequest{nullptr, plan.layout.query});
  REQUIRE(connector.second_pass(1, rows) == Status::success);
  // The naive rows and half the reused ones: what FusionPipeline's own two passes recompute.
  const FusionResult alone = pipeline.run(p.tokens, p.layout, method);
  CHECK(static_cast<std::int64_t>(rows.size()) ==
        alone.selected_per_layer.front() - static_cast<std::int64_t>(plan.initial.size()));
  CHECK(std::includes(rows.begin(), rows.end(), plan.initial.begin(), plan.initial.end()));
  connector.finish_and_wait(1);
  // A one-pass plan has no second pass.
  const FusionPlan naive = connector.plan(2, p.tokens, p.layout, NaiveReuse{});
  CHECK(!naive.two_pass);
  REQUIRE(connector.start(naive, NaiveReuse{}) == Status::success);
  CHECK(connector.second_pass(2, rows) == Status::invalid_argument);
  CHECK(std::string(last_status_message()).find("has a one-pass plan") != std::string::npos);
  connector.finish_and_wait(2);
}

}  // namespace unit_query_probe
