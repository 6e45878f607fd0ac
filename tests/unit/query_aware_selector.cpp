// QueryAwareSelector (kvfuse's query-aware selection on CacheBlend's gradual filtering, section 4.3) on
// hand-built reports, the QueryAware method's names and its schedule. Expected sets are worked out by hand.
#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <string>
#include <variant>
#include <vector>

#include "kvfuse/fusion/fusion_backend.hpp"
#include "kvfuse/fusion/fusion_method.hpp"
#include "kvfuse/fusion/layer_schedule.hpp"
#include "kvfuse/select/hkvd_selector.hpp"
#include "kvfuse/select/query_aware_selector.hpp"

#include "../support/error_of.hpp"

// Each unit test file lives in its own namespace: the files are compiled together (a unity build).
namespace unit_query_aware_selector {

using namespace kvfuse;
using kvfuse_test::error_of;

namespace {

HKVDConfig one_check(double r) {
  HKVDConfig c;
  c.recompute_ratio = r;
  c.check_layers = {1};
  c.ratio_margins = {0.0};
  return c;
}

constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();

}  // namespace

TEST_CASE("QueryAwareSelector keeps the reused tokens the query attends to most; query rows and the last row stay") {
  // Chunks [0, 4) and [4, 8), query [8, 10). r = 0.25: round(0.25 * 8) = 2 of the 8 reusable tokens.
  const QueryAwareSelector sel(one_check(0.25), PromptLayout::from_lengths({4, 4}, 2), 3);
  const TokenSet all = sel.schedule().initial();
  REQUIRE(all.size() == 10);
  CHECK(sel.schedule().keep_count(1) == 2);
  // The query rows' own entries (huge here) are ignored, and so is the deviation (λ = 1, the default).
  const std::vector<float> mass = {0.1f, 0.9f, 0.0f, 0.3f, 0.3f, 0.05f, 0.8f, 0.2f, 50.0f, 70.0f};
  const std::vector<float> deviation = {9, 0, 9, 0, 9, 0, 0, 9, 0, 0};
  CHECK(sel.select(1, all, mass, deviation) == TokenSet{1, 6, 8, 9});
  CHECK(sel.select(1, all, mass, {}) == TokenSet{1, 6, 8, 9});  // the deviation is not read
  // Layers that are not check layers keep the set and read nothing.
  CHECK(sel.select(0, all, {}, {}) == all);
  CHECK(sel.select(2, TokenSet{1, 6, 8, 9}, {}, {}) == TokenSet{1, 6, 8, 9});

  // Ties go to the lower position, a NaN ranks first (detail::ranks_before): 3 and 4 tie at 0.5.
  std::vector<float> tied(10, 0.1f);
  tied[3] = tied[4] = 0.5f;
  CHECK(sel.select(1, all, tied, {}) == TokenSet{3, 4, 8, 9});
  const QueryAwareSelector one(one_check(0.125), PromptLayout::from_lengths({4, 4}, 2), 3);  // keeps 1
  CHECK(one.select(1, all, tied, {}) == TokenSet{3, 8, 9});
  tied[7] = kNaN;
  CHECK(one.select(1, all, tied, {}) == TokenSet{7, 8, 9});

  // An uncached chunk is mandatory like the query; r = 0 keeps only the mandatory rows.
  PromptLayout partly = PromptLayout::from_lengths({4, 4}, 2);
  partly.chunks[0].cached = false;
  const QueryAwareSelector none(one_check(0.0), partly, 3);
  CHECK(none.select(1, all, mass, {}) == TokenSet{0, 1, 2, 3, 8, 9});
}

TEST_CASE("QueryAwareSelector mixes: each term divided by its sum over the candidates") {
  // Chunks [0, 2) and [2, 4), query [4, 5).
  const PromptLayout layout = PromptLayout::from_lengths({2, 2}, 1);
  const TokenSet all{0, 1, 2, 3, 4};
  const std::vector<float> mass = {1, 3, 0, 0, 9};        // shares 0.25, 0.75, 0, 0 of 4
  const std::vector<float> deviation = {0, 0, 2, 2, 100};  // shares 0, 0, 0.5, 0.5 of 4
  const QueryAwareSelector half(one_check(0.5), layout, 2, 0.5);
  CHECK(half.scores(all, mass, deviation) == std::vector<float>{0.125f, 0.375f, 0.25f, 0.25f, 0.0f});
  CHECK(half.select(1, all, mass, deviation) == TokenSet{1, 2, 4});  // 2 and 3 tie: the lower position
  // λ = 0.9 leans to the query mass: 0.9 · 0.25 + 0 = 0.225 beats 0.1 · 0.5 = 0.05.
  const QueryAwareSelector mostly_query(one_check(0.5), layout, 2, 0.9);
  CHECK(mostly_query.select(1, all, mass, deviation) == TokenSet{0, 1, 4});
  // Units do not matter: the same deviations scaled by 1e6 give the same scores.
  std::vector<float> scaled = deviation;
  for (float& d : scaled) d *= 1e6f;
  CHECK(half.scores(all, mass, scaled) == half.scores(all, mass, deviation));
  // A term whose candidates sum to 0 adds nothing; an infinite value becomes NaN and ranks first.
  const std::vector<float> zero(5, 0.0f);
  CHECK(half.scores(all, zero, deviation) == std::vector<float>{0.0f, 0.0f, 0.25f, 0.25f, 0.0f});
  std::vector<float> corrupt = deviation;
  corrupt[0] = std::numeric_limits<float>::infinity();
  const std::vector<float> s = half.scores(all, mass, corrupt);
  CHECK(std::isnan(s[0]));
  CHECK(s[1] == 0.375f);  // 0.5 · 0.75 + 0.5 · 2 / ∞
  CHECK(half.select(1, all, mass, corrupt) == TokenSet{0, 1, 4});
  // One term alone ranks its raw values.
  CHECK(QueryAwareSelector(one_check(0.5), layout, 2, 1.0).scores(all, mass, {}) ==
        std::vector<float>{1, 3, 0, 0, 0});
  CHECK(QueryAwareSelector(one_check(0.5), layout, 2, 0.0).scores(all, {}, deviation) ==
        std::vector<float>{0, 0, 2, 2, 0});
}

TEST_CASE("QueryAwareSelector with lambda = 0 is HKVDSelector's selection on every layer, ties and NaN included") {
  std::mt19937_64 rng(11);
  const PromptLayout layout = PromptLayout::from_lengths({13, 17, 9}, 5);
  const HKVDSelector blend(HKVDConfig{}, layout, 6);
  const QueryAwareSelector aware(HKVDConfig{}, layout, 6, 0.0);
  for (int trial = 0; trial < 50; ++trial) {
    TokenSet a = blend.initial();
    TokenSet b = aware.schedule().initial();
    for (int layer = 0; layer < 6; ++layer) {
      std::vector<float> dev(a.size());
      for (float& d : dev) {  // few distinct values, neighbours one ulp apart, some NaN
        const float base = static_cast<float>(rng() % 4);
        d = rng() % 3 == 0 ? std::nextafter(base, 10.0f) : base;
        if (rng() % 29 == 0) d = kNaN;
      }
      a = blend.select(layer, a, dev);
      b = aware.select(layer, b, {}, dev);
      REQUIRE(a == b);
    }
  }
  // Gradual filtering's set sizes are HKVDPlan's.
  TokenSet s = aware.schedule().initial();
  const HKVDPlan plan = aware.schedule().plan();
  for (int layer = 0; layer < 6; ++layer) {
    CHECK(static_cast<std::int64_t>(s.size()) == plan.tokens_per_layer[static_cast<std::size_t>(layer)]);
    s = aware.select(layer, s, {}, std::vector<float>(s.size(), 1.0f));
  }
}

TEST_CASE("QueryAwareSelector refuses a bad lambda, wrong sizes and negative values by name") {
  const PromptLayout layout = PromptLayout::from_lengths({2, 2}, 1);
  const TokenSet all{0, 1, 2, 3, 4};
  CHECK(error_of([&] { (void)QueryAwareSelector(one_check(0.5), layout, 2, 1.5); })
            .find("query_weight (lambda) = 1.5 is not in [0, 1]") != std::string::npos);
  const QueryAwareSelector sel(one_check(0.5), layout, 2, 0.5);
  CHECK(error_of([&] { (void)sel.select(1, all, std::vector<float>(3, 1.0f), std::vector<float>(5, 1.0f)); })
            .find("3 query mass values for a set of 5 tokens") != std::string::npos);
  CHECK(error_of([&] { (void)sel.select(1, all, std::vector<float>(5, 1.0f), {}); })
            .find("0 deviation values for a set of 5 tokens") != std::string::npos);
  CHECK(error_of([&] { (void)sel.select(1, all, std::vector<float>{1, -2, 1, 1, 1}, std::vector<float>(5, 1.0f)); })
            .find("query mass -2 of token 1") != std::string::npos);
  const std::vector<float> ones(4, 1.0f);
  CHECK(error_of([&] { (void)sel.select(1, TokenSet{0, 1, 2, 3}, ones, ones); }).find("1 mandatory tokens") !=
        std::string::npos);
}

TEST_CASE("queryaware method names: r and lambda round trip, bad settings are refused by name") {
  for (const char* name : {"queryaware", "queryaware@0.2", "queryaware@0.15:0.5", "queryaware@0.3:0", "queryaware@1"})
    CHECK(method_name(parse_method(name)) == name);
  CHECK(method_name(parse_method("queryaware@0.15")) == "queryaware");
  CHECK(method_name(parse_method("queryaware@0.2:1")) == "queryaware@0.2");
  const QueryAware q = std::get<QueryAware>(parse_method("queryaware@0.3:0.25"));
  CHECK(q.config.recompute_ratio == 0.3);
  CHECK(q.query_weight == 0.25);
  CHECK(q.rank_by == KVTensor::value);
  CHECK(std::get<QueryAware>(parse_method("queryaware")).query_weight == 1.0);
  // Gradual filtering margins shrink so that r + margin stays <= 1, as for CacheBlend.
  CHECK(std::get<QueryAware>(parse_method("queryaware@0.95")).config.ratio_margins ==
        std::get<CacheBlend>(parse_method("cacheblend@0.95")).config.ratio_margins);
  CHECK(error_of([] { (void)parse_method("queryaware@"); }).find("no value after '@'") != std::string::npos);
  CHECK(error_of([] { (void)parse_method("queryaware@:0.5"); }).find("no r before ':'") != std::string::npos);
  CHECK(error_of([] { (void)parse_method("queryaware@0.2:"); }).find("no lambda after ':'") != std::string::npos);
  CHECK(error_of([] { (void)parse_method("queryaware@0.2:1.5"); }).find("lambda = 1.5 must be in [0, 1]") !=
        std::string::npos);
  CHECK(error_of([] { (void)parse_method("queryaware@x"); }).find("setting 'x' is not a number") != std::string::npos);
  CHECK(error_of([] { (void)parse_method("queryaware@1.5"); }).find("1.5") != std::string::npos);
  CHECK(error_of([] { (void)parse_method("queryaware@auto"); }).find("setting 'auto' is not a number") !=
        std::string::npos);
  CHECK(error_of([] { (void)parse_method("query"); }).find("queryaware[@r[:lambda]]") != std::string::npos);
}

TEST_CASE("QueryAware's schedule: layer 0 computes every row, check layers ask for the query mass") {
  FusionPlan plan;
  plan.layout = PromptLayout::from_lengths({4, 4}, 2);
  QueryAware method = with_recompute_ratio(QueryAware{}, 0.25);
  method.config.check_layers = {1};
  method.config.ratio_margins = {0.0};
  const LayerSchedule s = layer_schedule(plan, method, 3);
  CHECK(s.initial == TokenSet{0, 1, 2, 3, 4, 5, 6, 7, 8, 9});
  CHECK(s.needs_query_mass);
  CHECK_FALSE(s.needs_deviation);
  CHECK_FALSE(s.needs_attention);
  REQUIRE_FALSE(s.fixed_set());
  const std::vector<float> mass = {0.1f, 0.9f, 0.0f, 0.3f, 0.3f, 0.05f, 0.8f, 0.2f, 5.0f, 7.0f};
  const std::vector<float> none(10, 0.0f);
  CHECK(s.next(LayerReport{1, s.initial, none, none, nullptr, mass}) == TokenSet{1, 6, 8, 9});
  method.query_weight = 0.5;
  const LayerSchedule mixed = layer_schedule(plan, method, 3);
  CHECK(mixed.needs_query_mass);
  CHECK(mixed.needs_deviation);
  method.query_weight = 0.0;
  const LayerSchedule deviation_only = layer_schedule(plan, method, 3);
  CHECK_FALSE(deviation_only.needs_query_mass);
  CHECK(deviation_only.needs_deviation);
  // An engine that can only recompute one fixed set cannot run it (FusionPipeline refuses it at compile time).
  static_assert(needs_per_layer_backend<QueryAware> && needs_per_layer_backend<CacheBlend>);
  static_assert(!needs_per_layer_backend<AttnLink>);
}

}  // namespace unit_query_aware_selector
