// FusionPipeline: every method through the one loop, checked against full prefill; the chunk-cache store's
// failure modes (corrupt, foreign-model, missing entries, a store that goes away) through the real pipeline;
// the edge cases that crashed other implementations (100 % hit with reordered chunks, the same prompt twice,
// empty and one-token chunks); engines other than CpuLlamaFusion (a paged KV layout, a fixed-set engine). A
// small random-weights Llama runs everywhere; the real-model cases run SmolLM2 and Gemma 3 on real text
// (Release builds with the model files).
#include <doctest/doctest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "kvfuse/backend/disk_kv_store.hpp"
#include "kvfuse/backend/in_memory_store.hpp"
#include "kvfuse/backend/tiered_kv_store.hpp"
#include "kvfuse/cpu.hpp"
#include "kvfuse/harness/metrics.hpp"
#include "kvfuse/harness/rag_prompt.hpp"
#include "kvfuse/fusion/fusion_pipeline.hpp"
#include "kvfuse/runtime.hpp"

#include "../../examples/paged_engine.hpp"
#include "../support/error_of.hpp"
#include "../support/fusion_prompts.hpp"
#include "../support/model_path.hpp"
#include "../support/small_llama.hpp"
#include "../support/test_util.hpp"

// Each unit test file lives in its own namespace: the files are compiled together (a unity build).
namespace unit_fusion_pipeline {

using namespace kvfuse;
using kvfuse_test::error_of;
using kvfuse_test::assemble;
using kvfuse_test::chunk_tokens;
using kvfuse_test::kA;
using kvfuse_test::kB;
using kvfuse_test::kC;
using kvfuse_test::kQuery;
using kvfuse_test::kSystem;
using kvfuse_test::Prompt;
using kvfuse_test::TempDir;
using kvfuse_test::diff;
using kvfuse_test::max_abs_diff;
using kvfuse_test::small_llama;
namespace fs = std::filesystem;


TEST_CASE("method names: defaults are bare, sweep points are name@value, bad names are refused") {
  for (const char* name : {"full", "prefix", "naive", "cacheblend", "attnlink", "cachecraft", "cacheblend@0.05",
                           "attnlink@4", "cachecraft@2", "cachecraft-nofocus", "cachecraft@0.5-nofocus",
                           "cachecraft-cover", "cachecraft@0.125-nofocus-cover"})
    CHECK(method_name(parse_method(name)) == name);
  CHECK(std::get<CacheCraft>(parse_method("cachecraft@0.125-nofocus-cover")).scoring.prefix_coverage);
  CHECK_FALSE(std::get<CacheCraft>(parse_method("cachecraft@0.125-nofocus")).scoring.prefix_coverage);
  CHECK(error_of([] { (void)parse_method("cachecraft-cover-nofocus"); }).find("[-nofocus][-cover], in that order") !=
        std::string::npos);
  CHECK(method_name(parse_method("cacheblend@0.15")) == "cacheblend");
  CHECK(std::get<CacheBlend>(parse_method("cacheblend@0.3")).config.recompute_ratio == 0.3);
  // Gradual filtering margins shrink so that r + margin stays <= 1.
  const std::vector<double> margins = std::get<CacheBlend>(parse_method("cacheblend@0.95")).config.ratio_margins;
  REQUIRE(margins.size() == 3);
  CHECK(margins[0] == doctest::Approx(0.05));
  CHECK(margins[1] == doctest::Approx(0.05));
  CHECK(margins[2] == 0.0);
  CHECK(std::get<AttnLink>(parse_method("attnlink@32")).config.k == 32);
  CHECK(error_of([] { (void)parse_method("blend"); }).find("unknown fusion method 'blend'") != std::string::npos);
  CHECK(error_of([] { (void)parse_method("attnlink@2.5"); }).find("k = 2.5") != std::string::npos);
  CHECK(error_of([] { (void)parse_method("cacheblend@x"); }).find("setting 'x' is not a number") != std::string::npos);
  CHECK(error_of([] { (void)parse_method("cacheblend@1.5"); }).find("1.5") != std::string::npos);
  CHECK(error_of([] { (void)parse_method("naive@3"); }).find("takes no setting") != std::string::npos);
  CHECK(error_of([] { (void)parse_method("cacheblend@"); }).find("no value after '@'") != std::string::npos);
  CHECK(error_of([] { (void)parse_method("attnlink@1e30"); }).find("k = 1e30") != std::string::npos);
  CHECK(error_of([] { (void)parse_method("cachecraft@-1"); }).find("alpha = -1") != std::string::npos);
}

TEST_CASE("100 % recompute is full prefill, bit for bit: full and CacheBlend r = 1") {
  const CpuLlama model = small_llama();
  InMemoryKVStore store;
  CpuLlamaFusion engine(model);
  FusionPipeline pipeline(engine, store);
  const Prompt p = assemble({kSystem, kA, kB, kC}, kQuery);
  pipeline.store_chunk_caches(p.tokens, p.layout);
  const LlamaPrefill reference = model.full_prefill(p.tokens);

  for (const std::string name : {"full", "cacheblend@1"}) {
    CAPTURE(name);
    const FusionResult r = pipeline.run(p.tokens, p.layout, parse_method(name));
    CHECK(r.logits == reference.logits);
    CHECK(r.recompute_fraction == 1.0);
    for (std::int64_t l = 0; l < model.config().n_layer; ++l) {
      CHECK(engine.kv().k[static_cast<std::size_t>(l)] == reference.kv.k[static_cast<std::size_t>(l)]);
      CHECK(engine.kv().v[static_cast<std::size_t>(l)] == reference.kv.v[static_cast<std::size_t>(l)]);
    }
  }
  // Full recompute loads nothing.
  CHECK(pipeline.plan(p.tokens, p.layout, FullRecompute{}).chunks[1].source == KVSource::compute);
  // AttnLink with k >= every chunk recomputes all but the first chunk, whose isolated cache at position 0 is
  // exact: full prefill up to float rounding.
  const FusionResult link = pipeline.run(p.tokens, p.layout, parse_method("attnlink@64"));
  CHECK(link.recompute_fraction == doctest::Approx(1.0 - 6.0 / static_cast<double>(p.tokens.size())));
  CHECK(max_abs_diff(link.logits, reference.logits) < 1e-4);
}

TEST_CASE("each method end to end: sources, S_l sizes and the recompute fraction follow the plan") {
  const CpuLlama model = small_llama();
  InMemoryKVStore store;
  CpuLlamaFusion engine(model);
  FusionPipeline pipeline(engine, store);
  const Prompt p = assemble({kSystem, kA, kB, kC}, kQuery);
  const auto n = static_cast<std::int64_t>(p.tokens.size());
  const std::int64_t layers = model.config().n_layer;
  CHECK(pipeline.store_chunk_caches(p.tokens, p.layout) == 4);
  CHECK(pipeline.store_chunk_caches(p.tokens, p.layout) == 0);  // computed once per (model, chunk)
  // An earlier prompt: same system prompt and first passage, the others swapped.
  const Prompt earlier = assemble({kSystem, kA, kC, kB}, chunk_tokens(4, 9));
  pipeline.record_context(earlier.tokens, earlier.layout);
  const LlamaPrefill reference = model.full_prefill(p.tokens);

  SUBCASE("naive: the query only, on every layer") {
    const FusionResult r = pipeline.run(p.tokens, p.layout, NaiveReuse{});
    for (const ChunkPlan& c : r.plan.chunks) CHECK(c.source == KVSource::isolated);
    CHECK(r.plan.initial == TokenSet{n - 5, n - 4, n - 3, n - 2, n - 1});
    CHECK(r.selected_per_layer == std::vector<std::int64_t>(static_cast<std::size_t>(layers), 5));
    CHECK(r.recompute_fraction == doctest::Approx(5.0 / static_cast<double>(n)));
    CHECK(r.logits != reference.logits);  // isolated caches are not the prompt's KV
  }
  SUBCASE("prefix: system + A are loaded exactly, everything after them is recomputed") {
    const FusionResult r = pipeline.run(p.tokens, p.layout, PrefixCaching{});
    CHECK(r.plan.chunks[0].source == KVSource::prefix);
    CHECK(r.plan.chunks[1].source == KVSource::prefix);
    CHECK(r.plan.chunks[2].source == KVSource::compute);  // B follows C in the earlier prompt
    CHECK(r.plan.chunks[3].source == KVSource::compute);
    const std::int64_t after = n - 15;
    CHECK(r.selected_per_layer == std::vector<std::int64_t>(static_cast<std::size_t>(layers), after));
    CHECK(max_abs_diff(r.logits, reference.logits) < 1e-4);
  }
  SUBCASE("CacheBlend r = 0.15: layer 0 all, then the HKVDSelector schedule") {
    const FusionResult r = pipeline.run(p.tokens, p.layout, CacheBlend{});
    const HKVDPlan expected = HKVDSelector(HKVDConfig{}, p.layout, static_cast<int>(layers)).plan();
    CHECK(r.selected_per_layer == expected.tokens_per_layer);
    CHECK(r.selected_per_layer.front() == n);
    CHECK(r.recompute_fraction == doctest::Approx(expected.compute_fraction()));
  }
  SUBCASE("AttnLink k = 4: the first 4 tokens of B and C and of A, plus the query, on every layer") {
    const FusionResult r = pipeline.run(p.tokens, p.layout, parse_method("attnlink@4"));
    TokenSet expected{6, 7, 8, 9, 15, 16, 17, 18, 26, 27, 28, 29};
    for (std::int64_t t = n - 5; t < n; ++t) expected.push_back(t);
    CHECK(r.plan.initial == expected);
    CHECK(r.selected_per_layer == std::vector<std::int64_t>(static_cast<std::size_t>(layers), 17));
  }
  // Cache-Craft's variants come from an earlier prompt in which a chunk D preceded C, B and A.
  InMemoryKVStore craft_store;
  CpuLlamaFusion craft_engine(model);
  FusionPipeline craft(craft_engine, craft_store);
  const Prompt with_d = assemble({kSystem, chunk_tokens(7, 6), kC, kB, kA}, chunk_tokens(4, 9));
  craft.record_context(with_d.tokens, with_d.layout);
  CHECK(craft.variants().size() == 5);

  SUBCASE("Cache-Craft: variants by CFO, exact prefixes fix nothing, changed prefixes fix ceil(CFO |C|) tokens") {
    CacheCraft method;
    method.focus.window = 2;
    const FusionResult r = craft.run(p.tokens, p.layout, method);
    REQUIRE(r.plan.chunks.size() == 4);
    for (const ChunkPlan& c : r.plan.chunks) CHECK(c.source == KVSource::variant);
    // The system prompt sits behind the same (no) chunks as when it was computed: beta' = 1, CFO = 0 (eq. 12).
    CHECK(r.plan.chunks[0].cfo == 0.0);
    CHECK(r.plan.chunks[0].recompute.empty());
    // A, B and C lost D (and more) from their prefix: CFO > 0 and N = ceil(CFO * |C|) tokens (eq. 12, 14).
    for (std::size_t j : {std::size_t{1}, std::size_t{2}, std::size_t{3}}) {
      const ChunkPlan& c = r.plan.chunks[j];
      CHECK(c.cfo > 0.0);
      CHECK(static_cast<std::int64_t>(c.recompute.size()) ==
            std::min(c.range.size(), static_cast<std::int64_t>(std::ceil(c.cfo * static_cast<double>(c.range.size()) - 1e-9))));
    }
    std::int64_t planned = 5;
    for (const ChunkPlan& c : r.plan.chunks) planned += static_cast<std::int64_t>(c.recompute.size());
    CHECK(static_cast<std::int64_t>(r.plan.initial.size()) == planned);
    CHECK(r.selected_per_layer.front() == planned);
    REQUIRE(r.focus.has_value());
    // Before L* every selected token is recomputed; from L* on, only focused chunks' tokens and the query.
    for (std::size_t l = 0; l < r.focus->cutoff_layer && l < r.selected_per_layer.size(); ++l)
      CHECK(r.selected_per_layer[l] == planned);
    std::int64_t kept = 5;
    for (std::size_t j : r.focus->focused) kept += static_cast<std::int64_t>(r.plan.chunks[j].recompute.size());
    for (std::size_t l = r.focus->cutoff_layer; l < r.selected_per_layer.size(); ++l)
      CHECK(r.selected_per_layer[l] == kept);
    // The VariantCache counted the accesses: f_r > 0 for the four chosen variants, 0 for D's.
    std::int64_t used = 0;
    for (const VariantEntry& v : craft.variants().entries()) used += v.reuse_frequency > 0.0 ? 1 : 0;
    CHECK(used == 4);
  }
  SUBCASE("Cache-Craft with prefix coverage fixes a chunk whose variant saw only part of its new prefix") {
    // C's variant behind [system] alone: now behind [system, A, B], eq. 6 gives beta = 1 and CFO = 0.
    const Prompt c_first = assemble({kSystem, kC}, kQuery);
    craft.record_context(c_first.tokens, c_first.layout);
    const FusionResult paper = craft.run(p.tokens, p.layout, parse_method("cachecraft-nofocus"));
    CHECK(paper.plan.chunks[3].cfo == 0.0);
    CHECK(paper.plan.chunks[3].recompute.empty());
    // With coverage (1 of the 3 chunks before it was there) the planner scores it CCI (1 - beta/3) > 0.
    const FusionResult cover = craft.run(p.tokens, p.layout, parse_method("cachecraft-nofocus-cover"));
    CHECK(cover.plan.chunks[3].cfo > 0.0);
    CHECK_FALSE(cover.plan.chunks[3].recompute.empty());
    CHECK(cover.recompute_fraction > paper.recompute_fraction);
  }
  SUBCASE("Cache-Craft with a large alpha and no focus termination recomputes every token of a moved chunk") {
    const FusionResult r = craft.run(p.tokens, p.layout, parse_method("cachecraft@1000-nofocus"));
    CHECK(r.plan.chunks[1].recompute.size() == kA.size());
    CHECK(r.plan.chunks[2].recompute.size() == kB.size());
    CHECK(r.plan.chunks[3].recompute.size() == kC.size());
    CHECK(!r.focus.has_value());
    // The rest is exact in-context KV, so the result is full prefill up to float rounding.
    CHECK(max_abs_diff(r.logits, reference.logits) < 1e-4);
  }
}

TEST_CASE("edge cases: 100 % hit with reordered chunks, the same prompt twice, empty and one-token chunks") {
  const CpuLlama model = small_llama();
  InMemoryKVStore store;
  CpuLlamaFusion engine(model);
  FusionPipeline pipeline(engine, store);
  const Prompt first = assemble({kSystem, kA, kB, kC}, kQuery);
  pipeline.store_chunk_caches(first.tokens, first.layout);

  // Reordered: every chunk hits; each loaded chunk is moved to its new place by one RoPE shift, which
  // matches computing the chunk alone at that place.
  const Prompt reordered = assemble({kSystem, kC, kA, kB}, kQuery);
  const FusionResult r = pipeline.run(reordered.tokens, reordered.layout, NaiveReuse{});
  CHECK(r.rejected_entries == 0);
  for (const ChunkPlan& c : r.plan.chunks) CHECK(c.source == KVSource::isolated);
  const TokenRange a = reordered.layout.chunks[2].range;
  const LlamaKVCache direct = model.prefill_chunk(kA, a.begin);
  const LlamaKVCache loaded = engine.kv().slice(a);
  CHECK(loaded.positions == direct.positions);
  for (std::int64_t l = 0; l < model.config().n_layer; ++l) {
    CHECK(max_abs_diff(loaded.k[static_cast<std::size_t>(l)], direct.k[static_cast<std::size_t>(l)]) < 1e-4);
    CHECK(max_abs_diff(loaded.v[static_cast<std::size_t>(l)], direct.v[static_cast<std::size_t>(l)]) < 1e-4);
  }

  // The same prompt twice: same plan, bit-identical results, nothing recomputed offline.
  for (const FusionMethod& m : {FusionMethod{NaiveReuse{}}, FusionMethod{CacheBlend{}}, FusionMethod{AttnLink{}}}) {
    const FusionResult x = pipeline.run(reordered.tokens, reordered.layout, m);
    const FusionResult y = pipeline.run(reordered.tokens, reordered.layout, m);
    CHECK(x.logits == y.logits);
    CHECK(x.plan.initial == y.plan.initial);
    CHECK(x.selected_per_layer == y.selected_per_layer);
  }
  CHECK(pipeline.store_chunk_caches(reordered.tokens, reordered.layout) == 0);

  // Empty and one-token chunks, through every method.
  const Prompt odd = assemble({kSystem, {}, {kA.front()}, kB, {}}, kQuery);
  pipeline.store_chunk_caches(odd.tokens, odd.layout);
  pipeline.record_context(odd.tokens, odd.layout);
  const LlamaPrefill reference = model.full_prefill(odd.tokens);
  for (const std::string name : {"full", "prefix", "naive", "cacheblend", "attnlink", "cachecraft", "cacheblend@1"}) {
    CAPTURE(name);
    const FusionResult x = pipeline.run(odd.tokens, odd.layout, parse_method(name));
    for (float v : x.logits) REQUIRE(std::isfinite(v));
    CHECK(x.plan.chunks[1].source == KVSource::compute);  // empty: nothing to load
    if (name == "full" || name == "cacheblend@1") CHECK(x.logits == reference.logits);
    if (name == "prefix") CHECK(max_abs_diff(x.logits, reference.logits) < 1e-4);  // all loaded, exact
  }
}

TEST_CASE("chunk-cache store on disk: corrupt and foreign-model entries are rejected and recomputed, never used") {
  const CpuLlama model = small_llama(5);
  const CpuLlama other = small_llama(6);
  REQUIRE(model.fingerprint() != other.fingerprint());
  const Prompt p = assemble({kSystem, kA, kB}, kQuery);
  TempDir dir;

  std::vector<float> clean;
  {
    InMemoryKVStore memory;
    DiskKVStore disk(dir.path);
    TieredKVStore tiered(memory, disk);
    CpuLlamaFusion engine(model);
    FusionPipeline pipeline(engine, tiered);
    CHECK(pipeline.store_chunk_caches(p.tokens, p.layout) == 3);
    clean = pipeline.run(p.tokens, p.layout, NaiveReuse{}).logits;
  }
  // A new process: nothing in memory, the disk entries persist and give the same result.
  InMemoryKVStore memory;
  DiskKVStore disk(dir.path);
  TieredKVStore tiered(memory, disk);
  CpuLlamaFusion engine(model);
  FusionPipeline pipeline(engine, tiered);
  CHECK(pipeline.store_chunk_caches(p.tokens, p.layout) == 0);
  CHECK(pipeline.run(p.tokens, p.layout, NaiveReuse{}).logits == clean);

  // Corrupt one byte of A's entry: the disk tier rejects it, the pipeline recomputes A's cache and puts it back.
  memory.clear();
  const std::span<const token_id> a(p.tokens.data() + p.layout.chunks[1].range.begin, kA.size());
  const fs::path a_file = disk.path_for(pipeline.isolated_key(a));
  {
    std::fstream f(a_file, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(200);
    const char x = 0x5a;
    f.write(&x, 1);
  }
  FusionResult r = pipeline.run(p.tokens, p.layout, NaiveReuse{});
  CHECK(r.rejected_entries == 1);
  CHECK(disk.rejected() == 1);
  CHECK(disk.last_rejection().find("checksum") != std::string::npos);
  CHECK(r.time.chunk_compute_ms > 0.0);
  CHECK(r.logits == clean);
  memory.clear();
  CHECK(disk.get(pipeline.isolated_key(a)).has_value());  // the recomputed entry is valid again

  // A foreign model's entry under this model's key name (same chunk content): rejected, recomputed.
  InMemoryKVStore other_memory;
  TieredKVStore other_tiered(other_memory, disk);
  CpuLlamaFusion other_engine(other);
  FusionPipeline other_pipeline(other_engine, other_tiered);
  CHECK(other_pipeline.store_chunk_caches(p.tokens, p.layout) == 3);  // keys carry the model: no sharing
  fs::copy_file(disk.path_for(other_pipeline.isolated_key(a)), a_file, fs::copy_options::overwrite_existing);
  memory.clear();
  r = pipeline.run(p.tokens, p.layout, NaiveReuse{});
  CHECK(r.rejected_entries == 1);
  CHECK(disk.rejected() == 2);
  CHECK(disk.last_rejection().find(fmt::format("{:#x}", other.fingerprint())) != std::string::npos);
  CHECK(r.logits == clean);
}

TEST_CASE("a store that goes away mid-request loses nothing: missing entries become recomputed chunks") {
  const CpuLlama model = small_llama();
  const Prompt p = assemble({kSystem, kA, kB}, kQuery);
  const LlamaPrefill reference = model.full_prefill(p.tokens);
  TempDir dir;
  InMemoryKVStore memory;
  DiskKVStore disk(dir.path);
  TieredKVStore tiered(memory, disk);
  CpuLlamaFusion engine(model);
  FusionPipeline pipeline(engine, tiered);
  pipeline.store_chunk_caches(p.tokens, p.layout);
  pipeline.record_context(p.tokens, p.layout);

  // Planned against a full store, then the store disappears before the KV is read.
  const FusionPlan planned = pipeline.plan(p.tokens, p.layout, PrefixCaching{});
  CHECK(planned.chunks[2].source == KVSource::prefix);
  memory.clear();
  fs::remove_all(dir.path);
  const FusionResult prefix = pipeline.run(p.tokens, p.layout, PrefixCaching{});
  CHECK(prefix.logits == reference.logits);  // every chunk recomputed: full prefill
  CHECK(prefix.recompute_fraction == 1.0);

  const FusionResult naive = pipeline.run(p.tokens, p.layout, NaiveReuse{});
  for (const ChunkPlan& c : naive.plan.chunks) CHECK(c.source == KVSource::compute);
  CHECK(naive.logits == reference.logits);

  // Cache-Craft forgets the variants whose KV is gone instead of choosing them and failing to load them.
  CHECK(pipeline.variants().size() == 3);
  const FusionResult craft = pipeline.run(p.tokens, p.layout, CacheCraft{});
  CHECK(pipeline.variants().size() == 0);
  CHECK(craft.rejected_entries == 0);
  for (const ChunkPlan& c : craft.plan.chunks) CHECK(c.source == KVSource::compute);
  CHECK(craft.logits == reference.logits);

  // Writing into the vanished directory fails in the disk tier only; the memory tier keeps the entries.
  CHECK(pipeline.store_chunk_caches(p.tokens, p.layout) == 3);
  CHECK(tiered.put_failures(1) == 3);
  CHECK(pipeline.run(p.tokens, p.layout, NaiveReuse{}).rejected_entries == 0);
}

TEST_CASE("bad input: a layout that does not cover the prompt, a prompt without a query") {
  const CpuLlama model = small_llama();
  InMemoryKVStore store;
  CpuLlamaFusion engine(model);
  FusionPipeline pipeline(engine, store);
  const Prompt p = assemble({kSystem, kA}, kQuery);
  PromptLayout short_layout = p.layout;
  short_layout.query.end -= 1;
  CHECK(error_of([&] { (void)pipeline.run(p.tokens, short_layout, NaiveReuse{}); })
            .find("covers 19 tokens but the prompt has 20") != std::string::npos);
  const Prompt no_query = assemble({kSystem, kA}, {});
  pipeline.store_chunk_caches(no_query.tokens, no_query.layout);
  CHECK(error_of([&] { (void)pipeline.run(no_query.tokens, no_query.layout, NaiveReuse{}); })
            .find("last token must be part of the query") != std::string::npos);
}

namespace {

// Every method on a MuSiQue-style prompt through the pipeline on a real model: each closes more than
// `min_gap_closed` of naive reuse's teacher-forced KL gap (full prefill's 8-token greedy answer fed after each
// method's KV), and prefix caching reproduces full prefill's distribution.
void check_methods_close_naive_gap(kvfuse_test::RealModel which, const std::vector<std::string>& methods,
                                   double min_gap_closed) {
  const auto path = kvfuse_test::real_model(/*optimized_only=*/true, which);
  if (!path) return;
  const GGUFFile file = GGUFFile::open(*path);
  const Tokenizer tok = Tokenizer::from_gguf(file);
  const CpuLlama model = CpuLlama::from_gguf(file);
  const std::vector<std::string> passages{
      "Exeter College is one of the constituent colleges of the University of Oxford in England, founded in 1314.",
      "Hannibal and Scipio is a 1637 tragedy by Thomas Nabbes, who was educated at Exeter College, Oxford.",
      "The Southern Maryland Electric Cooperative is headquartered in Hughesville, in Charles County, Maryland."};
  const RagPrompt prompt = build_rag_prompt(tok, "Answer the question using the documents, in a few words.",
                                            passages, "Where was the author of Hannibal and Scipio educated?");
  std::vector<std::string> earlier = passages;
  std::reverse(earlier.begin() + 1, earlier.end());
  const RagPrompt warm = build_rag_prompt(tok, "Answer the question using the documents, in a few words.", earlier,
                                          "Which county is Hughesville in?");
  InMemoryKVStore store;
  CpuLlamaFusion engine(model);
  FusionPipeline pipeline(engine, store);
  pipeline.store_chunk_caches(prompt.tokens, prompt.layout());
  pipeline.record_context(warm.tokens, warm.layout());

  const FusionResult full = pipeline.run(prompt.tokens, prompt.layout(), FullRecompute{});
  CHECK(full.logits == model.full_prefill(prompt.tokens).logits);
  LlamaKVCache decoded = pipeline.backend().kv();  // greedy_decode extends the KV it is given
  const std::vector<token_id> answer = model.greedy_decode(decoded, full.logits, 8, tok.eos());
  REQUIRE(!answer.empty());
  MESSAGE("full prefill's answer: " << tok.decode(answer, false));
  const auto forced = [&](const FusionResult& r) {
    LlamaKVCache kv = pipeline.backend().kv();
    return model.forced_logits(kv, r.logits, answer);
  };
  const std::vector<std::vector<float>> reference = forced(full);
  const eval::TeacherForced naive =
      eval::teacher_forced(reference, forced(pipeline.run(prompt.tokens, prompt.layout(), NaiveReuse{})));
  MESSAGE("naive: KL answer " << naive.kl_mean << ", top-1 " << naive.top1_agreement);
  REQUIRE(naive.kl_mean > 0.0);
  for (const std::string& name : methods) {
    CAPTURE(name);
    const FusionResult r = pipeline.run(prompt.tokens, prompt.layout(), parse_method(name));
    const eval::TeacherForced tf = eval::teacher_forced(reference, forced(r));
    const double gap_closed = 1.0 - tf.kl_mean / naive.kl_mean;
    MESSAGE(name << ": KL answer " << tf.kl_mean << ", top-1 " << tf.top1_agreement << ", gap closed " << gap_closed
                 << ", recomputed " << r.recompute_fraction);
    CHECK(r.recompute_fraction < 1.0);
    CHECK(gap_closed > min_gap_closed);
  }
  // Prefix caching reuses exact KV (the system prompt and the first passage): full prefill's distribution.
  CHECK(eval::kl_divergence(full.logits, pipeline.run(prompt.tokens, prompt.layout(), PrefixCaching{}).logits) < 1e-6);
}

}  // namespace

// QueryAware runs with λ = 0.5 (query mass and KV deviation): the query mass alone (λ = 1) measures 0.40 of the
// gap on SmolLM2 but 0.11 on Gemma 3 here, on layers 1-3 where the question mostly attends to what is near it.
TEST_CASE("real model: SmolLM2: every method on a MuSiQue-style prompt closes part of naive reuse's KL gap") {
  // Measured (gap closed): cacheblend 0.39, attnlink 0.80, cachecraft 0.96, cacheblend@0.5 0.78.
  check_methods_close_naive_gap(kvfuse_test::RealModel::smollm2,
                                {"prefix", "cacheblend", "queryaware@0.15:0.5", "attnlink", "cachecraft", "cacheblend@0.5"},
                                0.25);
}

TEST_CASE("real model: Gemma 3: every method on a plain-text MuSiQue-style prompt closes part of naive reuse's KL gap") {
  // Measured (gap closed): cacheblend 0.63, attnlink 0.93, cachecraft 0.97, cacheblend@0.5 0.94.
  check_methods_close_naive_gap(kvfuse_test::RealModel::gemma3,
                                {"prefix", "cacheblend", "queryaware@0.15:0.5", "attnlink", "cachecraft", "cacheblend@0.5"},
                                0.25);
}

// ------------------------------------------------------------------------- engines other than CpuLlamaFusion
namespace {

// A second engine of the fusion loop with its own KV layout (examples/paged_engine.hpp): pages of 16 rows
// behind a block table, its own KVBlock format and fingerprint, CpuLlama's arithmetic. The test is that
// FusionPipeline assumes nothing of LlamaKVCache, so both engines must give the same logits for the same plans.
using kvfuse_example::PagedEngine;
static_assert(PerLayerFusionBackend<PagedEngine>);

// An engine that can only recompute one fixed set on every layer (llama.cpp's public API is of this kind):
// CpuLlamaFusion without the per-layer prefill.
class FixedSetEngine {
 public:
  explicit FixedSetEngine(const CpuLlama& model) : inner_(model) {}
  [[nodiscard]] std::uint64_t model_fingerprint() const { return inner_.model_fingerprint(); }
  [[nodiscard]] std::int64_t num_layers() const { return inner_.num_layers(); }
  [[nodiscard]] std::size_t block_bytes(std::int64_t rows) const { return inner_.block_bytes(rows); }
  [[nodiscard]] KVBlock chunk_kv(std::span<const token_id> t, std::int64_t first) const { return inner_.chunk_kv(t, first); }
  void begin(std::span<const token_id> tokens) { inner_.begin(tokens); }
  void load_rows(TokenRange r, const KVBlock& block) { inner_.load_rows(r, block); }
  void shift_rows(TokenRange r, std::int64_t delta) { inner_.shift_rows(r, delta); }
  std::vector<float> prefill(const TokenSet& rows) { return inner_.prefill(rows); }
  [[nodiscard]] KVBlock save_rows(TokenRange r) const { return inner_.save_rows(r); }

 private:
  CpuLlamaFusion inner_;
};
static_assert(FixedSetFusionBackend<FixedSetEngine> && !PerLayerFusionBackend<FixedSetEngine>);

// The fixed-set engine with a cost per forward call (RunCostBackend), counting the runs of adjacent rows each
// prefill gets: llama.cpp's integration decodes each run in a call of its own.
class RunCostEngine : public FixedSetEngine {
 public:
  RunCostEngine(const CpuLlama& model, std::int64_t cost) : FixedSetEngine(model), cost_(cost) {}
  [[nodiscard]] std::int64_t run_cost_rows() const { return cost_; }
  std::vector<float> prefill(const TokenSet& rows) {
    runs = 0;
    for (std::size_t i = 0; i < rows.size(); ++i) runs += i == 0 || rows[i] != rows[i - 1] + 1;
    return FixedSetEngine::prefill(rows);
  }
  std::int64_t runs = 0;

 private:
  std::int64_t cost_;
};
static_assert(RunCostBackend<RunCostEngine> && !RunCostBackend<FixedSetEngine>);

template <class Pipeline, class Method>
concept RunsMethod = requires(Pipeline& p, std::span<const token_id> t, const PromptLayout& l, const Method& m) {
  p.run(t, l, m);
};
using FixedPipeline = FusionPipeline<FixedSetEngine, InMemoryKVStore>;
static_assert(RunsMethod<FixedPipeline, AttnLink> && RunsMethod<FixedPipeline, NaiveReuse>);
static_assert(!RunsMethod<FixedPipeline, CacheBlend>);  // refused at compile time: needs per-layer feedback
static_assert(!RunsMethod<FixedPipeline, QueryAware>);
static_assert(RunsMethod<FusionPipeline<PagedEngine, InMemoryKVStore>, CacheBlend>);
static_assert(RunsMethod<FusionPipeline<PagedEngine, InMemoryKVStore>, QueryAware>);

}  // namespace

TEST_CASE("a paged engine runs the same plans as CpuLlamaFusion and gives the same logits, bit for bit") {
  const CpuLlama model = small_llama();
  const Prompt p = assemble({kSystem, kA, kB, kC}, kQuery);
  const Prompt earlier = assemble({kSystem, kA, kC, kB}, chunk_tokens(4, 9));
  InMemoryKVStore flat_store;
  InMemoryKVStore paged_store;
  CpuLlamaFusion flat_engine(model);
  PagedEngine paged_engine(model);
  FusionPipeline flat(flat_engine, flat_store);
  FusionPipeline paged(paged_engine, paged_store);
  flat.store_chunk_caches(p.tokens, p.layout);
  paged.store_chunk_caches(p.tokens, p.layout);
  flat.record_context(earlier.tokens, earlier.layout);
  paged.record_context(earlier.tokens, earlier.layout);
  CHECK(flat.isolated_key(kA) != paged.isolated_key(kA));  // the key carries the engine's layout
  for (const std::string name :
       {"full", "prefix", "naive", "cacheblend", "attnlink@4", "cachecraft", "cachecraft-nofocus", "queryaware",
        "queryaware@0.3:0.5"}) {
    CAPTURE(name);
    const FusionResult a = flat.run(p.tokens, p.layout, parse_method(name));
    const FusionResult b = paged.run(p.tokens, p.layout, parse_method(name));
    CHECK(a.logits == b.logits);
    CHECK(a.selected_per_layer == b.selected_per_layer);
    CHECK(a.plan.initial == b.plan.initial);
    for (std::size_t j = 0; j < a.plan.chunks.size(); ++j) CHECK(a.plan.chunks[j].source == b.plan.chunks[j].source);
    const LlamaKVCache kv = paged_engine.gather();
    CHECK(kv.positions == flat_engine.kv().positions);
    for (std::size_t l = 0; l < kv.k.size(); ++l) {
      CHECK(kv.k[l] == flat_engine.kv().k[l]);
      CHECK(kv.v[l] == flat_engine.kv().v[l]);
    }
  }
  // A block of the wrong size is refused by name, never decoded into the pages.
  const KVBlock short_block{2, std::vector<std::byte>(8), 0};
  CHECK(error_of([&] { paged_engine.load_rows({0, 2}, short_block); }).find("holds 8 bytes, expected") !=
        std::string::npos);
}

TEST_CASE("a fixed-set engine runs the fixed-set methods; per-layer methods are refused by name") {
  const CpuLlama model = small_llama();
  const Prompt p = assemble({kSystem, kA, kB, kC}, kQuery);
  InMemoryKVStore fixed_store;
  InMemoryKVStore store;
  FixedSetEngine fixed_engine(model);
  CpuLlamaFusion engine(model);
  FusionPipeline fixed(fixed_engine, fixed_store);
  FusionPipeline reference(engine, store);
  fixed.store_chunk_caches(p.tokens, p.layout);
  reference.store_chunk_caches(p.tokens, p.layout);
  for (const std::string name : {"full", "naive", "attnlink", "cachecraft"}) {  // no variants: no focus
    CAPTURE(name);
    CHECK(fixed.run(p.tokens, p.layout, parse_method(name)).logits ==
          reference.run(p.tokens, p.layout, parse_method(name)).logits);
  }
  CHECK(error_of([&] { (void)fixed.run(p.tokens, p.layout, parse_method("cacheblend@0.2")); })
            .find("method 'cacheblend@0.2' changes the recomputed set per layer") != std::string::npos);
  CHECK(error_of([&] { (void)fixed.run(p.tokens, p.layout, parse_method("queryaware")); })
            .find("method 'queryaware' changes the recomputed set per layer") != std::string::npos);
}

TEST_CASE("merge_runs fills exactly the gaps shorter than a call's cost, nothing outside the first and last row") {
  const TokenSet rows{3, 4, 7, 8, 9, 15, 30};  // gaps 2, 5, 14
  CHECK(merge_runs(rows, 0) == rows);
  CHECK(merge_runs(rows, 2) == rows);  // a tie stays unfilled: the same cost, fewer rows
  CHECK(merge_runs(rows, 3) == TokenSet{3, 4, 5, 6, 7, 8, 9, 15, 30});
  CHECK(merge_runs(rows, 6) == TokenSet{3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 30});
  TokenSet all;
  append_range(all, {3, 31});
  CHECK(merge_runs(rows, 15) == all);
  CHECK(merge_runs({}, 100).empty());
  CHECK(merge_runs({5}, 100) == TokenSet{5});
}

namespace {
struct ShapeProbe {  // what engine_shape reads of an engine
  std::int64_t run_cost = 0;
  [[nodiscard]] std::uint64_t model_fingerprint() const { return 0xABC; }
  [[nodiscard]] std::int64_t num_layers() const { return 4; }
  [[nodiscard]] std::size_t block_bytes(std::int64_t rows) const { return static_cast<std::size_t>(rows) * 4 * 96; }
};
struct CostlyShapeProbe : ShapeProbe {
  [[nodiscard]] std::int64_t run_cost_rows() const { return run_cost; }
};
}  // namespace

TEST_CASE("engine_shape: model, layers and bytes per row of one layer from the engine; its call cost when it has one; "
          "a negative call cost is refused, naming it") {
  const EngineShape free_calls = engine_shape(ShapeProbe{});
  CHECK(free_calls.model == 0xABC);
  CHECK(free_calls.num_layers == 4);
  CHECK(free_calls.layer_bytes_per_row == 96);
  CHECK(free_calls.block_bytes(3) == 3 * 4 * 96);
  CHECK(free_calls.run_cost_rows == 0);
  CHECK(engine_shape(CostlyShapeProbe{{40}}).run_cost_rows == 40);
  CHECK(error_of([] { (void)engine_shape(CostlyShapeProbe{{-2}}); }).find("run_cost_rows() is -2") !=
        std::string::npos);
  // The CPU engine's: its own fingerprint, n_layer, K and V of kv_dim floats per layer and row.
  const CpuLlama model = small_llama();
  const EngineShape cpu = engine_shape(CpuLlamaFusion(model));
  CHECK(cpu.model == CpuLlamaFusion(model).model_fingerprint());
  CHECK(cpu.num_layers == model.config().n_layer);
  CHECK(cpu.layer_bytes_per_row == static_cast<std::size_t>(2 * model.config().kv_dim()) * sizeof(float));
}

TEST_CASE("an engine with a cost per forward call gets a fixed set's close runs merged: fewer calls, the rows a "
          "superset, every added row recomputed exactly") {
  const CpuLlama model = small_llama();
  const Prompt p = assemble({kSystem, kA, kB, kC}, kQuery);
  const LlamaPrefill reference = model.full_prefill(p.tokens);
  const auto n = static_cast<std::int64_t>(p.tokens.size());
  InMemoryKVStore store;
  RunCostEngine free_calls(model, 0);
  FusionPipeline<RunCostEngine, InMemoryKVStore> a(free_calls, store);
  a.store_chunk_caches(p.tokens, p.layout);
  const FusionMethod link = parse_method("attnlink@2");
  const FusionResult unmerged = a.run(p.tokens, p.layout, link);
  // A cost between the shortest and the longest gap of AttnLink's S_0: some runs merge, not all.
  std::vector<std::int64_t> gaps;
  const TokenSet& s0 = unmerged.plan.initial;
  for (std::size_t i = 1; i < s0.size(); ++i)
    if (s0[i] > s0[i - 1] + 1) gaps.push_back(s0[i] - s0[i - 1] - 1);
  std::sort(gaps.begin(), gaps.end());
  REQUIRE(gaps.size() >= 2);
  const std::int64_t mid = gaps.front() + 1;
  REQUIRE(gaps.back() >= mid);
  RunCostEngine costly(model, mid), very_costly(model, n);
  FusionPipeline<RunCostEngine, InMemoryKVStore> b(costly, store), c(very_costly, store);
  const FusionResult some = b.run(p.tokens, p.layout, link);
  const FusionResult one = c.run(p.tokens, p.layout, link);
  CHECK(a.shape().run_cost_rows == 0);
  CHECK(c.shape().run_cost_rows == n);
  CHECK(some.plan.initial == merge_runs(unmerged.plan.initial, mid));
  CHECK(one.plan.initial == merge_runs(unmerged.plan.initial, n));
  CHECK(std::includes(one.plan.initial.begin(), one.plan.initial.end(), unmerged.plan.initial.begin(),
                      unmerged.plan.initial.end()));
  CHECK(free_calls.runs > costly.runs);
  CHECK(costly.runs > very_costly.runs);
  CHECK(very_costly.runs == 1);
  CHECK(one.selected_per_layer.front() == static_cast<std::int64_t>(one.plan.initial.size()));
  CHECK(one.recompute_fraction > unmerged.recompute_fraction);
  // One run from the first boundary to the end over the first chunk's exact cache (position 0): full prefill up to
  // float rounding, which the unmerged set is not.
  CHECK(max_abs_diff(one.logits, reference.logits) < 1e-4);
  CHECK(max_abs_diff(unmerged.logits, reference.logits) > 1e-3);
  // Per-layer methods keep their sets: the engine here is fixed-set only, so none runs; the CPU engine does not
  // report a call cost (it computes any set in one pass per layer).
  static_assert(!RunCostBackend<CpuLlamaFusion>);
}

TEST_CASE("one request composed of Cake and a fusion method: Cake prepares the stored exact prefix, the method the rest") {
  const CpuLlama model = small_llama();
  InMemoryKVStore store;
  CpuLlamaFusion engine(model);
  FusionPipeline pipeline(engine, store);
  const Prompt p = assemble({kSystem, kA, kB, kC}, kQuery);  // chunks end at 6, 15, 26, 34; query [34, 39)
  const auto n = static_cast<std::int64_t>(p.tokens.size());
  pipeline.store_chunk_caches(p.tokens, p.layout);
  // An earlier request left [system, A] and one more token (17 tokens, fetch chunks of 4): the exact prefix is
  // cut back to the chunk boundary 15.
  CHECK(pipeline.store_prefix(p.tokens, 17, 4) == 5);
  const LlamaPrefill reference = model.full_prefill(p.tokens);

  std::vector<float> naive_logits;
  for (LoaderMode mode : {LoaderMode::adaptive, LoaderMode::compute_only, LoaderMode::load_only}) {
    CAPTURE(static_cast<int>(mode));
    const LoaderConfig cake{8, 4, mode};
    const ComposedResult full = run_composed(pipeline, p.tokens, p.layout, FusionMethod{FullRecompute{}}, cake);
    CHECK(full.exact_prefix == 15);
    CHECK(full.prefix.num_tokens == 15);
    CHECK(full.prefix.computed_tokens + full.prefix.loaded_tokens == 15);
    if (mode == LoaderMode::load_only) CHECK(full.prefix.loaded_tokens == 12);  // [0, 12): the 4-token grid
    CHECK(full.fusion.plan.chunks[0].source == KVSource::prefix);
    CHECK(full.fusion.plan.chunks[1].source == KVSource::prefix);
    CHECK(full.fusion.plan.initial.front() == 15);  // no row of the exact prefix is recomputed
    // Exact prefix + full recompute of the rest = full prefill, up to float rounding (rows computed in other
    // groupings than full prefill's, as chunked prefill is).
    CHECK(diff(full.fusion.logits, reference.logits).rounding());
    for (std::size_t l = 0; l < reference.kv.k.size(); ++l) {
      CHECK(diff(engine.kv().k[l], reference.kv.k[l]).rounding());
      CHECK(diff(engine.kv().v[l], reference.kv.v[l]).rounding());
    }
    // A fusion method after the exact prefix: the same result whatever Cake computed or loaded.
    const ComposedResult naive = run_composed(pipeline, p.tokens, p.layout, FusionMethod{NaiveReuse{}}, cake);
    CHECK(naive.fusion.plan.initial == TokenSet{34, 35, 36, 37, 38});
    if (naive_logits.empty()) naive_logits = naive.fusion.logits;
    CHECK(diff(naive.fusion.logits, naive_logits).rounding());
    const ComposedResult blend = run_composed(pipeline, p.tokens, p.layout, parse_method("cacheblend"), cake);
    CHECK(blend.fusion.selected_per_layer.front() == n - 15);  // layer 0: every row after the exact prefix
  }
  // Nothing stored for another prompt: no exact prefix, the method alone.
  const Prompt other = assemble({kB, kA, kC}, kQuery);
  pipeline.store_chunk_caches(other.tokens, other.layout);
  const ComposedResult alone = run_composed(pipeline, other.tokens, other.layout, FusionMethod{NaiveReuse{}}, LoaderConfig{8, 4});
  CHECK(alone.exact_prefix == 0);
  CHECK(alone.fusion.logits == pipeline.run(other.tokens, other.layout, NaiveReuse{}).logits);
}

TEST_CASE("chunk caches stored as bf16 / f16: half the bytes, keys of their own, a small measured loss") {
  const CpuLlama model = small_llama();
  const Prompt p = assemble({kSystem, kA, kB, kC}, kQuery);
  InMemoryKVStore fp32_store;
  CpuLlamaFusion fp32_engine(model);
  FusionPipeline fp32(fp32_engine, fp32_store);
  fp32.store_chunk_caches(p.tokens, p.layout);
  const FusionResult reference = fp32.run(p.tokens, p.layout, NaiveReuse{});
  for (kvfuse::DType storage : {kvfuse::DType::bf16, kvfuse::DType::f16}) {
    CAPTURE(std::string(kvfuse::dtype_name(storage)));
    InMemoryKVStore store;
    CpuLlamaFusion engine(model, storage);
    FusionPipeline pipeline(engine, store);
    CHECK(engine.model_fingerprint() != fp32_engine.model_fingerprint());
    pipeline.store_chunk_caches(p.tokens, p.layout);
    CHECK(2 * store.bytes() == fp32_store.bytes());
    const FusionResult r = pipeline.run(p.tokens, p.layout, NaiveReuse{});
    CHECK(r.rejected_entries == 0);
    const double kl = kvfuse::eval::kl_divergence(reference.logits, r.logits);
    MESSAGE(std::string(kvfuse::dtype_name(storage)) << " storage: KL vs the fp32 store " << kl);
    CHECK(kl > 0.0);   // the rounding is really there
    CHECK(kl < 1e-3);  // and small
    // Full prefill loads nothing: identical.
    CHECK(pipeline.run(p.tokens, p.layout, FullRecompute{}).logits == fp32.run(p.tokens, p.layout, FullRecompute{}).logits);
    // An fp32 block under this engine's key is refused, never misread: recomputed and put back.
    store.put(pipeline.isolated_key(kA), fp32_engine.chunk_kv(kA, 0));
    CHECK(pipeline.run(p.tokens, p.layout, NaiveReuse{}).rejected_entries == 1);
  }
}

}  // namespace unit_fusion_pipeline
