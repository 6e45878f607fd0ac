// FusionPipeline's layer-pipelined loading (Cache-Craft §3.4.2, Algorithm 2): stored chunk KV read one layer at a
// time on an I/O thread while the engine computes. Checked: the result equals whole-block loading bit for bit
// for every method, on memory and on a disk store behind a link; L_p comes from PreloadPlanner on measured
// times; a read that fails, throws or stalls mid-prefill (and a corrupt page on disk) ends in compute with the
// output of a whole-block run that found the entry unusable.
#include <doctest/doctest.h>

#include <chrono>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <optional>
#include <span>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "kvfuse/cpu.hpp"

#include "../support/fusion_prompts.hpp"
#include "../support/small_llama.hpp"
#include "../support/test_util.hpp"

// Each unit test file lives in its own namespace: the files are compiled together (a unity build).
namespace unit_layer_pipeline {

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
using kvfuse_test::TempDir;

namespace {

// A test double in front of a real store: the ranged reads of one entry fail, throw or stall from one byte
// offset (one layer) on. Everything else is the inner store's.
enum class Fault { none, miss, raise, stall };

template <RangedKVStore Inner>
struct FaultyStore {
  Inner* inner;
  KVKey bad{};
  std::uint64_t from_offset = 0;
  Fault fault = Fault::none;
  std::chrono::milliseconds stall{0};
  int faults = 0;

  bool contains(const KVKey& k) const { return inner->contains(k); }
  std::vector<bool> contains_many(std::span<const KVKey> ks) const { return inner->contains_many(ks); }
  std::optional<KVBlock> get(const KVKey& k) { return inner->get(k); }
  std::vector<std::optional<KVBlock>> get_many(std::span<const KVKey> ks) { return inner->get_many(ks); }
  void put(const KVKey& k, KVBlock b) { inner->put(k, std::move(b)); }
  bool erase(const KVKey& k) { return inner->erase(k); }
  std::optional<KVBlockInfo> describe(const KVKey& k) { return inner->describe(k); }
  bool get_into(const KVKey& k, const KVBlockInfo& info, std::uint64_t offset, std::span<std::byte> out) {
    if (fault != Fault::none && k == bad && offset >= from_offset) {
      ++faults;
      if (fault == Fault::miss) return false;
      if (fault == Fault::raise) throw error("connection reset by peer");
      std::this_thread::sleep_for(stall);
    }
    return inner->get_into(k, info, offset, out);
  }
  std::optional<std::vector<std::byte>> get_range(const KVKey& k, const KVBlockInfo& info, std::uint64_t offset,
                                                  std::uint64_t size) {
    return detail::get_range_by_get_into(*this, "FaultyStore", k, info, offset, size);
  }
};

static_assert(RangedKVStore<FaultyStore<InMemoryKVStore>>);

LoadConfig whole_blocks() {
  LoadConfig c;
  c.layerwise = false;
  return c;
}

const std::vector<std::string> kMethods = {"full",       "prefix",     "naive",  "attnlink@2", "cachecraft",
                                           "cachecraft-nofocus", "cacheblend", "cacheblend@0.5", "queryaware",
                                           "queryaware@0.5:0.5"};

}  // namespace

TEST_CASE("layer-pipelined loading equals whole-block loading bit for bit, for every method") {
  const CpuLlama model = small_llama();
  const Prompt p = assemble({kSystem, kA, kB, kC}, kQuery);
  const Prompt earlier = assemble({kSystem, kA, kC, kB}, chunk_tokens(4, 9));
  const std::int64_t layers = model.config().n_layer;
  TempDir dir;
  InMemoryKVStore memory;
  DiskKVStore disk(dir.path);
  ThrottledKVStore linked_disk(disk, {/*megabytes_per_s=*/50.0, /*latency_ms=*/0.2});

  const auto check_store = [&](auto& store) {
    CpuLlamaFusion engine(model);
    FusionPipeline pipeline(engine, store);
    pipeline.store_chunk_caches(p.tokens, p.layout);
    pipeline.record_context(earlier.tokens, earlier.layout);
    for (const std::string& name : kMethods) {
      CAPTURE(name);
      const FusionMethod method = parse_method(name);
      pipeline.set_load_config(whole_blocks());
      const FusionResult whole = pipeline.run(p.tokens, p.layout, method);
      const std::vector<std::vector<float>> whole_k = engine.kv().k;
      pipeline.set_load_config({});
      const FusionResult piped = pipeline.run(p.tokens, p.layout, method);
      CHECK(piped.logits == whole.logits);
      CHECK(engine.kv().k == whole_k);
      CHECK(piped.selected_per_layer == whole.selected_per_layer);
      CHECK(piped.plan.initial == whole.plan.initial);
      CHECK_FALSE(whole.load.layerwise);
      CHECK(whole.load.layers.empty());
      bool loads = false;
      for (const ChunkPlan& c : piped.plan.chunks) loads = loads || c.source != KVSource::compute;
      CHECK(piped.load.layerwise == loads);
      CHECK(piped.load.layers.size() == static_cast<std::size_t>(loads ? layers : 0));
      CHECK(piped.load.restarts == 0);
      CHECK(piped.rejected_entries == 0);
      if (loads) {
        CHECK(piped.load.depth >= 1);
        CHECK(piped.load.depth <= layers);
        for (const LayerLoadTiming& t : piped.load.layers) {
          CHECK(t.read_ms > 0.0);
          CHECK(t.compute_ms > 0.0);
        }
      }
    }
  };
  SUBCASE("memory") { check_store(memory); }
  SUBCASE("disk behind a 50 MB/s link") { check_store(linked_disk); }
}

TEST_CASE("L_p is Cache-Craft eq. 16 on the load and compute times measured by the previous run") {
  const CpuLlama model = small_llama();
  const Prompt p = assemble({kSystem, kA, kB, kC}, kQuery);
  const auto layers = static_cast<std::size_t>(model.config().n_layer);
  InMemoryKVStore memory;
  ThrottledKVStore slow(memory, {/*megabytes_per_s=*/1.0, /*latency_ms=*/0.0});  // loads slower than compute
  CpuLlamaFusion engine(model);
  FusionPipeline pipeline(engine, slow);
  pipeline.store_chunk_caches(p.tokens, p.layout);

  const FusionResult first = pipeline.run(p.tokens, p.layout, NaiveReuse{});
  CHECK(first.load.layerwise);
  CHECK_FALSE(first.load.depth_from_measurement);  // nothing measured yet: one layer ahead
  CHECK(first.load.depth == 1);
  const FusionResult second = pipeline.run(p.tokens, p.layout, NaiveReuse{});
  CHECK(second.load.depth_from_measurement);
  CHECK(second.load.estimated_load_ms_per_layer > 0.0);
  CHECK(second.load.estimated_compute_ms_per_layer > 0.0);
  const PreloadPlanner planner(
      {layers, second.load.estimated_compute_ms_per_layer, second.load.estimated_load_ms_per_layer});
  CHECK(static_cast<std::size_t>(second.load.depth) == planner.depth());
  CHECK(second.logits == first.logits);

  LoadConfig fixed;
  fixed.preload_depth = 3;
  pipeline.set_load_config(fixed);
  const FusionResult third = pipeline.run(p.tokens, p.layout, NaiveReuse{});
  CHECK(third.load.depth == 3);
  CHECK_FALSE(third.load.depth_from_measurement);
  CHECK(third.logits == first.logits);
  fixed.preload_depth = 100;  // more than the model has: all layers
  pipeline.set_load_config(fixed);
  CHECK(pipeline.run(p.tokens, p.layout, NaiveReuse{}).load.depth == static_cast<std::int64_t>(layers));
  CHECK_THROWS_WITH_AS(pipeline.set_load_config(LoadConfig{true, -1, 0.0}), doctest::Contains("preload_depth = -1"),
                       kvfuse::error);
}

TEST_CASE("a layer read that fails, throws or stalls mid-prefill ends in compute with the whole-block output") {
  const CpuLlama model = small_llama();
  const Prompt p = assemble({kSystem, kA, kB, kC}, kQuery);
  InMemoryKVStore memory;
  FaultyStore<InMemoryKVStore> store{&memory};
  CpuLlamaFusion engine(model);
  FusionPipeline pipeline(engine, store);
  pipeline.store_chunk_caches(p.tokens, p.layout);
  pipeline.record_context(p.tokens, p.layout);  // prefix entries of this very prompt
  const std::uint64_t layer_b = engine.layer_bytes(static_cast<std::int64_t>(kB.size()));

  // Whole-block references, with the entries intact (isolated caches are recomputed identically when lost).
  pipeline.set_load_config(whole_blocks());
  const std::vector<float> naive = pipeline.run(p.tokens, p.layout, NaiveReuse{}).logits;
  const std::vector<float> blend = pipeline.run(p.tokens, p.layout, parse_method("cacheblend")).logits;
  const FusionPlan prefix_plan = pipeline.plan(p.tokens, p.layout, PrefixCaching{});
  REQUIRE(prefix_plan.chunks[2].source == KVSource::prefix);
  // The prefix entry of [system, A, B] lost: B and C are computed (a prefix entry is exact only behind its own).
  const KVKey b_prefix = prefix_plan.chunks[2].key;
  std::optional<KVBlock> b_block = memory.get(b_prefix);
  REQUIRE(b_block.has_value());
  memory.erase(b_prefix);
  const std::vector<float> prefix_without_b = pipeline.run(p.tokens, p.layout, PrefixCaching{}).logits;
  memory.put(b_prefix, *b_block);

  LoadConfig piped;
  piped.layer_timeout_ms = 40.0;
  pipeline.set_load_config(piped);
  const std::span<const token_id> b_tokens(p.tokens.data() + p.layout.chunks[2].range.begin, kB.size());
  const KVKey b_isolated = pipeline.isolated_key(b_tokens);

  struct Case {
    const char* name;
    Fault fault;
    const char* why;
  };
  for (const Case& c : {Case{"miss", Fault::miss, "layer 3 of the entry is missing, changed or corrupt"},
                        Case{"throw", Fault::raise, "reading layer 3 failed: connection reset by peer"},
                        Case{"stall", Fault::stall, "did not arrive within 40 ms"}}) {
    CAPTURE(c.name);
    store.fault = c.fault;
    store.stall = std::chrono::milliseconds(400);
    store.from_offset = 3 * layer_b;  // layers 0-2 arrive, layer 3 does not

    SUBCASE("an isolated chunk cache: recomputed, put back, the same output as with it") {
      store.bad = b_isolated;
      store.faults = 0;
      for (const char* method : {"naive", "cacheblend"}) {
        CAPTURE(method);
        const FusionResult r = pipeline.run(p.tokens, p.layout, parse_method(method));
        CHECK(store.faults >= 1);
        CHECK(r.load.restarts == 1);
        CHECK(r.rejected_entries == 1);
        REQUIRE(r.load.failures.size() == 1);
        CHECK(r.load.failures[0].find(c.why) != std::string::npos);
        CHECK(r.load.failures[0].find("rows [15, 26)") != std::string::npos);
        CHECK(r.plan.chunks[2].source == KVSource::isolated);
        CHECK(r.logits == (std::string(method) == "naive" ? naive : blend));
        CHECK(r.time.chunk_compute_ms > 0.0);
      }
    }
    SUBCASE("with another chunk cache unusable before the prefill (installed whole): CacheBlend is still exact") {
      // A's entry was rotated at other positions than recorded: rejected at describe, recomputed, installed
      // whole. The aborted prefill overwrites A's rows (CacheBlend's and QueryAware's S_0 is every row); the
      // restart must install them again.
      const std::span<const token_id> a_tokens(p.tokens.data() + p.layout.chunks[1].range.begin, kA.size());
      const KVKey a_isolated = pipeline.isolated_key(a_tokens);
      for (const char* method : {"cacheblend", "cacheblend@0.5", "queryaware", "naive"}) {
        CAPTURE(method);
        KVBlock moved = *memory.get(a_isolated);
        moved.first_position = 5;
        memory.put(a_isolated, moved);
        store.bad = b_isolated;
        pipeline.set_load_config(whole_blocks());
        const FusionResult whole = pipeline.run(p.tokens, p.layout, parse_method(method));
        memory.put(a_isolated, moved);
        pipeline.set_load_config(piped);
        const FusionResult r = pipeline.run(p.tokens, p.layout, parse_method(method));
        CHECK(r.load.restarts == 1);
        CHECK(r.rejected_entries == 2);
        CHECK(r.logits == whole.logits);
        CHECK(r.selected_per_layer == whole.selected_per_layer);
        CHECK(r.time.prefill_ms > 0.0);
      }
    }
    SUBCASE("a prefix entry: its chunk and the ones after it computed, as if the entry were missing") {
      store.bad = b_prefix;
      const FusionResult r = pipeline.run(p.tokens, p.layout, PrefixCaching{});
      CHECK(r.load.restarts == 1);
      CHECK(r.plan.chunks[1].source == KVSource::prefix);
      CHECK(r.plan.chunks[2].source == KVSource::compute);
      CHECK(r.plan.chunks[3].source == KVSource::compute);
      CHECK(r.logits == prefix_without_b);
    }
  }
}

TEST_CASE("a corrupt page of a disk entry is found by the layer read that touches it; the request computes") {
  const CpuLlama model = small_llama();
  const Prompt p = assemble({kSystem, kA, kB, kC}, kQuery);
  TempDir dir;
  DiskKVStore disk(dir.path);
  CpuLlamaFusion engine(model);
  FusionPipeline pipeline(engine, disk);
  pipeline.store_chunk_caches(p.tokens, p.layout);
  pipeline.record_context(p.tokens, p.layout);
  const FusionPlan plan = pipeline.plan(p.tokens, p.layout, PrefixCaching{});
  REQUIRE(plan.chunks[3].source == KVSource::prefix);
  const KVKey c_prefix = plan.chunks[3].key;
  const auto info = disk.describe(c_prefix);
  REQUIRE(info.has_value());
  // Layer 4 of C's entry (the payload is one 64 KiB page here: the page table has one entry).
  const std::uint64_t layer_b = engine.layer_bytes(static_cast<std::int64_t>(kC.size()));
  {
    std::fstream f(disk.path_for(c_prefix), std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(static_cast<std::streamoff>(64 + 8 + 4 * layer_b + 3));
    const char x = 0x7f;
    f.write(&x, 1);
  }
  const FusionResult r = pipeline.run(p.tokens, p.layout, PrefixCaching{});
  CHECK(r.load.restarts == 1);
  CHECK(r.rejected_entries == 1);
  CHECK(disk.rejected() == 1);
  CHECK(disk.last_rejection().find("checksum mismatch in payload page 0") != std::string::npos);
  CHECK(r.plan.chunks[3].source == KVSource::compute);
  // The same as a whole-block run that finds the entry gone (it was set aside).
  pipeline.set_load_config(whole_blocks());
  const FusionResult whole = pipeline.run(p.tokens, p.layout, PrefixCaching{});
  CHECK(whole.plan.chunks[3].source == KVSource::compute);
  CHECK(r.logits == whole.logits);
}

TEST_CASE("cacheblend@auto: CacheBlend §5.1's loading controller picks r from the measured load and compute speeds") {
  CHECK(method_name(parse_method("cacheblend@auto")) == "cacheblend@auto");
  CHECK(std::get<CacheBlend>(parse_method("cacheblend@auto")).loading_controller);
  const CpuLlama model = small_llama();
  const Prompt p = assemble({kSystem, kA, kB, kC}, kQuery);
  const auto n = static_cast<double>(p.tokens.size());
  InMemoryKVStore memory;
  ThrottledKVStore slow(memory, {/*megabytes_per_s=*/0.5, /*latency_ms=*/0.0});  // loading a layer > recomputing it
  CpuLlamaFusion engine(model);
  FusionPipeline pipeline(engine, slow);
  pipeline.store_chunk_caches(p.tokens, p.layout);
  const FusionMethod automatic = parse_method("cacheblend@auto");

  const FusionResult first = pipeline.run(p.tokens, p.layout, automatic);  // nothing measured: r* = 0.15
  CHECK_FALSE(first.controller.has_value());
  CHECK(first.logits == pipeline.run(p.tokens, p.layout, parse_method("cacheblend")).logits);

  const FusionResult second = pipeline.run(p.tokens, p.layout, automatic);
  REQUIRE(second.controller.has_value());
  const RatioDecision& d = *second.controller;
  CHECK(d.load_seconds > 0.0);
  CHECK(d.ratio >= 0.15);
  CHECK(d.ratio <= 1.0);
  CHECK(d.ratio == std::max(0.15, d.matching_ratio));
  CHECK(d.loading_bound);  // 0.5 MB/s: loading dominates, so r rises above r*
  // The run is CacheBlend at the chosen ratio: the last layers keep the fraction it implies.
  const FusionResult fixed = pipeline.run(p.tokens, p.layout, with_recompute_ratio(CacheBlend{}, d.ratio));
  CHECK(second.selected_per_layer == fixed.selected_per_layer);
  CHECK(second.logits == fixed.logits);
  CHECK(static_cast<double>(second.selected_per_layer.back()) >= 0.15 * n - 1);
}

TEST_CASE("on a tiered store the loading controller places new entries in the cheapest tier that does not delay") {
  const CpuLlama model = small_llama();
  const Prompt p = assemble({kSystem, kA, kB, kC}, kQuery);
  // Measures both tiers: a run that reads the slow tier, then one that reads memory (after promotion); the
  // decision of a third run with `method` is returned.
  const auto decide = [&](auto& tiered, InMemoryKVStore& memory, const FusionMethod& method) {
    CpuLlamaFusion engine(model);
    FusionPipeline pipeline(engine, tiered);
    pipeline.store_chunk_caches(p.tokens, p.layout);
    memory.clear();
    const FusionResult first = pipeline.run(p.tokens, p.layout, method);
    CHECK_FALSE(first.tier.has_value());  // nothing measured before it
    CHECK(tiered.tier_stats(1).bytes > 0);
    CHECK(tiered.tier_stats(0).bytes == 0);
    pipeline.store_chunk_caches(p.tokens, p.layout);  // validating gets promote the entries into memory
    const FusionResult second = pipeline.run(p.tokens, p.layout, method);
    CHECK_FALSE(second.tier.has_value());  // decided before this run read (and measured) memory
    CHECK(tiered.tier_stats(0).bytes > 0);
    const FusionResult third = pipeline.run(p.tokens, p.layout, method);
    CHECK(third.logits == second.logits);
    REQUIRE(third.tier.has_value());
    REQUIRE(third.tier->options.size() == 2);
    // New chunk caches go where the decision says.
    const Prompt fresh = assemble({chunk_tokens(7, 40)}, kQuery);
    CHECK(pipeline.store_chunk_caches(fresh.tokens, fresh.layout) == 1);
    const KVKey key = pipeline.isolated_key(std::span<const token_id>(fresh.tokens.data(), 7));
    CHECK(tiered.contains(key));
    return std::pair{*third.tier, memory.contains(key)};
  };

  SUBCASE("a slow remote tier would delay naive reuse, which recomputes almost nothing: memory") {
    InMemoryKVStore memory;
    InMemoryKVStore far;
    ThrottledKVStore remote(far, {/*megabytes_per_s=*/0.1, /*latency_ms=*/0.0});
    TieredKVStore tiered(memory, remote);
    const auto [d, in_memory] = decide(tiered, memory, NaiveReuse{});
    CHECK(d.options[0].load_seconds < d.options[1].load_seconds);
    CHECK_FALSE(d.options[1].no_extra_delay);
    CHECK(d.device == std::optional<std::size_t>(0));
    CHECK(in_memory);
  }
  SUBCASE("a second memory tier at a tenth of the cost, under a full recompute of every layer: the cheap tier") {
    InMemoryKVStore memory;
    InMemoryKVStore cheap;
    TieredKVStore tiered(memory, cheap);
    const auto [d, in_memory] = decide(tiered, memory, parse_method("cacheblend@1"));
    CHECK(d.options[1].no_extra_delay);
    CHECK(d.device == std::optional<std::size_t>(1));
    CHECK_FALSE(in_memory);  // placed in the cheap tier only
  }
}

}  // namespace unit_layer_pipeline
