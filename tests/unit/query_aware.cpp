// QueryAware through the one loop (FusionPipeline on the CPU backend): the query mass reaches the policy,
// lambda = 0 reproduces CacheBlend's S_l on every layer, r = 1 is full prefill. The small random-weights Llama
// of the other fusion tests; the paged engine's bit-for-bit check is with the other methods in fusion_pipeline.cpp.
#include <doctest/doctest.h>

#include <algorithm>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "kvfuse/backend/in_memory_store.hpp"
#include "kvfuse/cpu.hpp"
#include "kvfuse/fusion/fusion_pipeline.hpp"

#include "../support/fusion_prompts.hpp"
#include "../support/small_llama.hpp"
#include "../support/test_util.hpp"

// Each unit test file lives in its own namespace: the files are compiled together (a unity build).
namespace unit_query_aware {

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

namespace {

// CpuLlamaFusion that records, per layer of its last per-layer prefill, S_l and the query mass it reported.
class RecordingEngine {
 public:
  explicit RecordingEngine(const CpuLlama& model) : inner_(model) {}
  [[nodiscard]] std::uint64_t model_fingerprint() const { return inner_.model_fingerprint(); }
  [[nodiscard]] std::int64_t num_layers() const { return inner_.num_layers(); }
  [[nodiscard]] std::size_t block_bytes(std::int64_t rows) const { return inner_.block_bytes(rows); }
  [[nodiscard]] KVBlock chunk_kv(std::span<const token_id> t, std::int64_t first) const {
    return inner_.chunk_kv(t, first);
  }
  void begin(std::span<const token_id> tokens) { inner_.begin(tokens); }
  void load_rows(TokenRange r, const KVBlock& block) { inner_.load_rows(r, block); }
  void shift_rows(TokenRange r, std::int64_t delta) { inner_.shift_rows(r, delta); }
  std::vector<float> prefill(const TokenSet& rows) { return inner_.prefill(rows); }
  std::vector<float> prefill(const TokenSet& rows, const SelectionPolicy& next, const StatisticsRequest& stats) {
    selected.clear();
    query_mass.clear();
    return inner_.prefill(rows, [&](const LayerReport& r) {
      selected.push_back(r.selected);
      query_mass.emplace_back(r.query_mass.begin(), r.query_mass.end());
      return next(r);
    }, stats);
  }
  [[nodiscard]] KVBlock save_rows(TokenRange r) const { return inner_.save_rows(r); }
  [[nodiscard]] const LlamaKVCache& kv() const { return inner_.kv(); }

  std::vector<TokenSet> selected;
  std::vector<std::vector<float>> query_mass;

 private:
  CpuLlamaFusion inner_;
};
static_assert(PerLayerFusionBackend<RecordingEngine>);

}  // namespace

TEST_CASE("queryaware: the query mass reaches the policy; lambda = 0 selects CacheBlend's S_l on every layer") {
  const CpuLlama model = small_llama();
  const Prompt p = assemble({kSystem, kA, kB, kC}, kQuery);
  const auto n = static_cast<std::int64_t>(p.tokens.size());
  InMemoryKVStore store;
  RecordingEngine engine(model);
  FusionPipeline pipeline(engine, store);
  pipeline.store_chunk_caches(p.tokens, p.layout);

  const FusionResult blend = pipeline.run(p.tokens, p.layout, parse_method("cacheblend"));
  const std::vector<TokenSet> blend_sets = engine.selected;
  for (const std::vector<float>& m : engine.query_mass) CHECK(m.empty());  // CacheBlend does not ask for it

  // lambda = 0: the deviation alone, CacheBlend's selection (and so its logits, bit for bit).
  const FusionResult same = pipeline.run(p.tokens, p.layout, parse_method("queryaware@0.15:0"));
  CHECK(engine.selected == blend_sets);
  CHECK(same.selected_per_layer == blend.selected_per_layer);
  CHECK(same.logits == blend.logits);

  // lambda = 1: the query mass on every layer, one value per computed row; layer 0 computes every row, so its
  // values add up to |query| x heads. The same budgets as CacheBlend, other tokens.
  const FusionResult aware = pipeline.run(p.tokens, p.layout, parse_method("queryaware"));
  CHECK(aware.plan.method == "queryaware");
  CHECK(aware.selected_per_layer == blend.selected_per_layer);
  CHECK(aware.selected_per_layer.front() == n);
  for (const ChunkPlan& c : aware.plan.chunks) CHECK(c.source == KVSource::isolated);
  REQUIRE(engine.query_mass.size() == static_cast<std::size_t>(model.config().n_layer));
  for (std::size_t l = 0; l < engine.query_mass.size(); ++l)
    CHECK(engine.query_mass[l].size() == engine.selected[l].size());
  double total = 0;
  for (float m : engine.query_mass[0]) total += m;
  CHECK(total == doctest::Approx(static_cast<double>(kQuery.size() * model.config().n_head)).epsilon(1e-5));
  CHECK(engine.selected != blend_sets);
  // Every S_l holds the query rows (and so the last row), and S_{l+1} ⊆ S_l.
  for (std::size_t l = 0; l < engine.selected.size(); ++l) {
    for (std::int64_t t = p.layout.query.begin; t < p.layout.query.end; ++t)
      CHECK(std::binary_search(engine.selected[l].begin(), engine.selected[l].end(), t));
    if (l > 0)
      CHECK(std::includes(engine.selected[l - 1].begin(), engine.selected[l - 1].end(), engine.selected[l].begin(),
                          engine.selected[l].end()));
  }
  // A mix asks for both the query mass and the deviation.
  const FusionResult mixed = pipeline.run(p.tokens, p.layout, parse_method("queryaware@0.15:0.5"));
  CHECK(mixed.selected_per_layer == blend.selected_per_layer);
  for (std::size_t l = 0; l < engine.query_mass.size(); ++l)
    CHECK(engine.query_mass[l].size() == engine.selected[l].size());
}

TEST_CASE("queryaware with r = 1 recomputes everything: full prefill up to float rounding") {
  const CpuLlama model = small_llama();
  const Prompt p = assemble({kSystem, kA, kB, kC}, kQuery);
  InMemoryKVStore store;
  CpuLlamaFusion engine(model);
  FusionPipeline pipeline(engine, store);
  pipeline.store_chunk_caches(p.tokens, p.layout);
  const LlamaPrefill reference = model.full_prefill(p.tokens);
  for (const std::string name : {"queryaware@1", "queryaware@1:0.5"}) {
    CAPTURE(name);
    const FusionResult r = pipeline.run(p.tokens, p.layout, parse_method(name));
    CHECK(r.recompute_fraction == 1.0);
    CHECK(diff(r.logits, reference.logits).rounding());
    for (std::size_t l = 0; l < reference.kv.k.size(); ++l) {
      CHECK(diff(engine.kv().k[l], reference.kv.k[l]).rounding());
      CHECK(diff(engine.kv().v[l], reference.kv.v[l]).rounding());
    }
  }
}

}  // namespace unit_query_aware
