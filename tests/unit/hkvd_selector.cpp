// HKVDSelector (CacheBlend section 4.3, gradual filtering) and the per-token KV deviation it ranks by
// (CacheBlend section 4.1). Every expected set below is worked out by hand from the definitions.
#include <doctest/doctest.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <span>
#include <vector>

#include "kvfuse/detail/kv_deviation.hpp"
#include "kvfuse/detail/math.hpp"
#include "kvfuse/detail/topk.hpp"
#include "kvfuse/select/hkvd_selector.hpp"

// Each unit test file lives in its own namespace: the files are compiled together (a unity build).
namespace unit_hkvd_selector {

using kvfuse::HKVDConfig;
using kvfuse::HKVDSelector;
using kvfuse::PromptLayout;
using kvfuse::TokenSet;

namespace {

HKVDConfig schedule(double r, std::vector<int> layers, std::vector<double> margins) {
  HKVDConfig c;
  c.recompute_ratio = r;
  c.check_layers = std::move(layers);
  c.ratio_margins = std::move(margins);
  return c;
}

}  // namespace

// ---------------------------------------------------------------------------------------------- deviation

TEST_CASE("kv deviation: squared L2 over 2 heads x 2 dims, padding ignored") {
  // 3 rows, row_stride 5: 2 heads x 2 dims, then one padding float that must not count.
  const std::vector<float> recomputed = {
      0, 0, 0, 0, 100,   // row 0
      1, 2, 3, 4, 100,   // row 1
      -1, 0, 2, 2, 100,  // row 2
  };
  const std::vector<float> cached = {
      1, 1, 1, 1, -100,   // row 0: diffs -1 -1 -1 -1 -> 4
      0, 2, 5, 1, -100,   // row 1: diffs 1 0 -2 3 -> 1 + 0 + 4 + 9 = 14
      -1, 0.5f, 0, 2, 7,  // row 2: diffs 0 -0.5 2 0 -> 0.25 + 4 = 4.25
  };
  CHECK(kvfuse::detail::kv_row_deviation(recomputed.data() + 5, cached.data() + 5, 2, 2) == 14.0f);
  CHECK(kvfuse::detail::kv_token_deviation(recomputed.data(), cached.data(), 5, 2, 2, 2) == 4.25f);

  const std::vector<std::int64_t> rows = {2, 0, 1};
  std::vector<float> out(3, -1.0f);
  kvfuse::kv_deviation(recomputed, cached, 5, 2, 2, rows, out);
  CHECK(out == std::vector<float>{4.25f, 4.0f, 14.0f});

  // Identical tensors: zero deviation; no rows: nothing written.
  kvfuse::kv_deviation(recomputed, recomputed, 5, 2, 2, rows, out);
  CHECK(out == std::vector<float>{0.0f, 0.0f, 0.0f});
  kvfuse::kv_deviation(recomputed, cached, 5, 2, 2, {}, {});
}

TEST_CASE("kv deviation: the last row needs only num_heads * head_dim values, not a full stride") {
  // 2 rows of stride 6 holding 1 head x 4 dims: 6 + 4 = 10 floats suffice.
  const std::vector<float> a = {1, 1, 1, 1, 9, 9, 2, 2, 2, 2};
  const std::vector<float> b = {0, 0, 0, 0, 0, 0, 0, 0, 0, 3};
  std::vector<float> out(1);
  const std::vector<std::int64_t> last = {1};
  kvfuse::kv_deviation(a, b, 6, 1, 4, last, out);
  CHECK(out[0] == 4.0f + 4.0f + 4.0f + 1.0f);
}

TEST_CASE("kv deviation: bad shapes and rows throw naming the value") {
  const std::vector<float> a(10, 0.0f);
  const std::vector<float> shorter(4, 0.0f);
  std::vector<float> out(1);
  const std::vector<std::int64_t> row0 = {0};
  const std::vector<std::int64_t> row_far = {2};
  const std::vector<std::int64_t> row_neg = {-1};
  const std::vector<std::int64_t> two_rows = {0, 1};
  CHECK_THROWS_WITH_AS(kvfuse::kv_deviation(a, a, 5, 0, 2, row0, out),
                       doctest::Contains("num_heads 0"), kvfuse::error);
  CHECK_THROWS_WITH_AS(kvfuse::kv_deviation(a, a, 5, 2, -3, row0, out),
                       doctest::Contains("head_dim -3"), kvfuse::error);
  CHECK_THROWS_WITH_AS(kvfuse::kv_deviation(a, a, 3, 2, 2, row0, out),
                       doctest::Contains("row_stride 3"), kvfuse::error);
  CHECK_THROWS_WITH_AS(kvfuse::kv_deviation(a, a, 5, 2, 2, two_rows, out),
                       doctest::Contains("2 rows"), kvfuse::error);
  // a holds rows 0 and 1 (10 floats, stride 5); row 2 is outside.
  CHECK_THROWS_WITH_AS(kvfuse::kv_deviation(a, a, 5, 2, 2, row_far, out),
                       doctest::Contains("row 2"), kvfuse::error);
  CHECK_THROWS_WITH_AS(kvfuse::kv_deviation(a, a, 5, 2, 2, row_neg, out),
                       doctest::Contains("row -1"), kvfuse::error);
  // num_heads * head_dim must not overflow int64 (2^32 * 2^32 = 2^64); the largest product that fits passes
  // that check and fails on the stride instead.
  constexpr std::int64_t kHuge = std::int64_t{1} << 32;
  CHECK_THROWS_WITH_AS(kvfuse::kv_deviation(a, a, 5, kHuge, kHuge, row0, out),
                       doctest::Contains("num_heads * head_dim = 4294967296 * 4294967296 overflows"), kvfuse::error);
  const std::int64_t max = std::numeric_limits<std::int64_t>::max();
  CHECK_THROWS_WITH_AS(kvfuse::kv_deviation(a, a, 5, 2, max / 2, row0, out),
                       doctest::Contains("row_stride 5 is smaller"), kvfuse::error);
  CHECK_THROWS_WITH_AS(kvfuse::kv_deviation(a, a, 5, 2, max / 2 + 1, row0, out),
                       doctest::Contains("overflows"), kvfuse::error);
  // The cached matrix is the shorter one: it holds row 0 only (4 floats = one token's values).
  kvfuse::kv_deviation(a, shorter, 5, 2, 2, row0, out);
  const std::vector<std::int64_t> row1 = {1};
  CHECK_THROWS_AS(kvfuse::kv_deviation(a, shorter, 5, 2, 2, row1, out), kvfuse::error);
}

// ------------------------------------------------------------------------------------------- top-k order

TEST_CASE("HKVD order: deviation descending, ties to the lower position; O(n) partial top-k") {
  using kvfuse::detail::ranks_before;
  CHECK(ranks_before(2.0f, 7, 1.0f, 0));   // higher score first, wherever it sits
  CHECK_FALSE(ranks_before(1.0f, 0, 2.0f, 7));
  CHECK(ranks_before(1.0f, 3, 1.0f, 5));   // tie: lower position first
  CHECK_FALSE(ranks_before(1.0f, 5, 1.0f, 3));
  CHECK_FALSE(ranks_before(1.0f, 4, 1.0f, 4));  // irreflexive

  // Scores by position 0..7: 0:3 1:5 2:5 3:1 4:5 5:0 6:3 7:2. Full order: 1 2 4 0 6 7 3 5.
  const std::vector<float> scores = {3, 5, 5, 1, 5, 0, 3, 2};
  const std::vector<std::size_t> order = {1, 2, 4, 0, 6, 7, 3, 5};
  for (std::size_t k = 0; k <= scores.size() + 1; ++k) {
    CAPTURE(k);
    std::vector<std::size_t> positions = {7, 6, 5, 4, 3, 2, 1, 0};
    kvfuse::detail::partition_top_k(std::span<std::size_t>(positions), scores.data(), k);
    const std::size_t kept = std::min(k, scores.size());
    std::vector<std::size_t> top(positions.begin(), positions.begin() + static_cast<std::ptrdiff_t>(kept));
    std::sort(top.begin(), top.end());
    std::vector<std::size_t> expected(order.begin(), order.begin() + static_cast<std::ptrdiff_t>(kept));
    std::sort(expected.begin(), expected.end());
    CHECK(top == expected);
  }
}

TEST_CASE("one top-k order: ranks_before (host) and top_k_key (GPU radix select) agree, NaN first") {
  const float inf = std::numeric_limits<float>::infinity();
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const std::vector<float> values = {-inf, -1e30f, -1.0f, -1e-40f, -0.0f, 0.0f, 1e-40f, 0.5f, 1.0f, 1e30f, inf,
                                     nan, -nan};
  for (float a : values) {
    for (float b : values) {
      for (std::int64_t pa : {0, 3, 7}) {
        for (std::int64_t pb : {0, 3, 7}) {
          CAPTURE(a);
          CAPTURE(b);
          CAPTURE(pa);
          CAPTURE(pb);
          CHECK(kvfuse::detail::ranks_before(a, pa, b, pb) ==
                (kvfuse::detail::top_k_key(a, pa) > kvfuse::detail::top_k_key(b, pb)));
        }
      }
    }
  }
  CHECK(kvfuse::detail::ranks_before(nan, 5, inf, 0));  // NaN above +inf
  CHECK(kvfuse::detail::ranks_before(nan, 1, nan, 2));  // NaNs tie: lower position first
}

// ----------------------------------------------------------------------------------------------- config

TEST_CASE("HKVDConfig defaults follow the paper: r = 0.15, checks on layers 1-3 shrinking to r") {
  const HKVDConfig c;
  c.validate();
  CHECK(c.recompute_ratio == 0.15);
  CHECK(c.check_layers == std::vector<int>{1, 2, 3});
  CHECK(c.check_ratio(0) == doctest::Approx(0.25));
  CHECK(c.check_ratio(1) == doctest::Approx(0.20));
  CHECK(c.check_ratio(2) == 0.15);
  CHECK(c.check_ratio(0) > c.check_ratio(1));
  CHECK(c.check_ratio(1) > c.check_ratio(2));
  // Margins saturate at 1.
  CHECK(schedule(0.95, {1, 2}, {0.1, 0.0}).check_ratio(0) == 1.0);
}

TEST_CASE("HKVDConfig rejects bad values and names them") {
  struct Case {
    HKVDConfig config;
    const char* needle;
  };
  const std::vector<Case> cases = {
      {schedule(1.5, {1}, {0.0}), "recompute_ratio 1.5"},
      {schedule(-0.1, {1}, {0.0}), "recompute_ratio -0.1"},
      {schedule(std::numeric_limits<double>::quiet_NaN(), {1}, {0.0}), "recompute_ratio nan"},
      {schedule(0.15, {}, {}), "check_layers is empty"},
      {schedule(0.15, {0, 2}, {0.1, 0.0}), "check_layers[0] = 0"},
      {schedule(0.15, {2, 2}, {0.1, 0.0}), "check_layers[1] = 2"},
      {schedule(0.15, {3, 1}, {0.1, 0.0}), "check_layers[1] = 1"},
      {schedule(0.15, {1, 2}, {0.0}), "1 ratio_margins for 2 check_layers"},
      {schedule(0.15, {1, 2}, {-0.1, 0.0}), "ratio_margins[0] = -0.1"},
      {schedule(0.15, {1, 2, 3}, {0.1, 0.2, 0.0}), "ratio_margins[1] = 0.2"},
      {schedule(0.15, {1, 2}, {0.1, 0.05}), "last ratio margin is 0.05"},
  };
  for (const Case& c : cases) {
    CAPTURE(c.needle);
    CHECK_THROWS_WITH_AS(c.config.validate(), doctest::Contains(c.needle), kvfuse::error);
    // The selector validates its config on construction.
    CHECK_THROWS_AS(HKVDSelector(c.config, PromptLayout::from_lengths({4}, 1), 8), kvfuse::error);
  }
}

TEST_CASE("HKVDSelector rejects bad layer counts and layers") {
  const auto layout = PromptLayout::from_lengths({4, 4}, 2);
  CHECK_THROWS_WITH_AS(HKVDSelector(HKVDConfig{}, layout, 0), doctest::Contains("num_layers 0"), kvfuse::error);
  // Default check layers go up to 3, so 3 layers are too few.
  CHECK_THROWS_WITH_AS(HKVDSelector(HKVDConfig{}, layout, 3), doctest::Contains("check layer 3"), kvfuse::error);
  PromptLayout broken = layout;
  broken.query = {9, 10};
  CHECK_THROWS_AS(HKVDSelector(HKVDConfig{}, broken, 8), kvfuse::error);

  const HKVDSelector sel(HKVDConfig{}, layout, 4);
  CHECK_THROWS_WITH_AS((void)sel.is_check_layer(4), doctest::Contains("layer 4"), kvfuse::error);
  CHECK_THROWS_WITH_AS((void)sel.is_check_layer(-1), doctest::Contains("layer -1"), kvfuse::error);
  CHECK_THROWS_WITH_AS((void)sel.keep_count(0), doctest::Contains("layer 0 is not a check layer"), kvfuse::error);
}

// ----------------------------------------------------------------------------------------- selection

TEST_CASE("HKVDSelector: exact sets per layer on 10 tokens with two checks") {
  // chunks [0,4) [4,8) cached, query [8,10). 8 reusable tokens.
  // r = 0.25, checks on layers 1 and 3 with margins 0.25, 0 -> r_1 = 0.5 keeps round(0.5 * 8) = 4,
  // r_2 = 0.25 keeps round(0.25 * 8) = 2. 5 layers.
  const HKVDSelector sel(schedule(0.25, {1, 3}, {0.25, 0.0}), PromptLayout::from_lengths({4, 4}, 2), 5);
  CHECK(sel.num_tokens() == 10);
  CHECK(sel.reusable_tokens() == 8);
  CHECK(sel.mandatory_tokens() == 2);
  CHECK(sel.is_reusable(7));
  CHECK_FALSE(sel.is_reusable(8));

  TokenSet s0 = sel.initial();
  CHECK(s0 == TokenSet{0, 1, 2, 3, 4, 5, 6, 7, 8, 9});
  CHECK_FALSE(sel.is_check_layer(0));
  CHECK(sel.select(0, s0, {}) == s0);  // layer 0: computes everything, keeps the set

  REQUIRE(sel.is_check_layer(1));
  CHECK(sel.keep_count(1) == 4);
  // Reusable deviations: 0:.1 1:.9 2:.3 3:.8 4:.2 5:.7 6:.05 7:.6 -> top 4 = {1, 3, 5, 7}.
  // The query's entries (99) are ignored: it is kept anyway.
  const std::vector<float> dev1 = {0.1f, 0.9f, 0.3f, 0.8f, 0.2f, 0.7f, 0.05f, 0.6f, 99.0f, 99.0f};
  const TokenSet s2 = sel.select(1, s0, dev1);
  CHECK(s2 == TokenSet{1, 3, 5, 7, 8, 9});

  CHECK_FALSE(sel.is_check_layer(2));
  const TokenSet s3 = sel.select(2, s2, {});
  CHECK(s3 == s2);

  REQUIRE(sel.is_check_layer(3));
  CHECK(sel.keep_count(3) == 2);
  // Deviations of {1, 3, 5, 7, 8, 9}: 1:.5 3:.1 5:.4 7:.2 -> top 2 = {1, 5}. Query entries are NaN: ignored.
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const std::vector<float> dev3 = {0.5f, 0.1f, 0.4f, 0.2f, nan, nan};
  const TokenSet s4 = sel.select(3, s3, dev3);
  CHECK(s4 == TokenSet{1, 5, 8, 9});
  CHECK(sel.select(4, s4, {}) == s4);

  const kvfuse::HKVDPlan plan = sel.plan();
  CHECK(plan.num_tokens == 10);
  CHECK(plan.reusable_tokens == 8);
  CHECK(plan.mandatory_tokens == 2);
  CHECK(plan.check_layers == std::vector<int>{1, 3});
  CHECK(plan.check_ratios == std::vector<double>{0.5, 0.25});
  CHECK(plan.kept_reusable == std::vector<std::int64_t>{4, 2});
  // Layers 0 and 1 compute all 10, layers 2-3 compute 4 + 2, layer 4 computes 2 + 2.
  CHECK(plan.tokens_per_layer == std::vector<std::int64_t>{10, 10, 6, 6, 4});
  CHECK(plan.compute_fraction() == doctest::Approx(36.0 / 50.0));
}

TEST_CASE("HKVDSelector: the first check sees the full prompt, the later ones only the survivors") {
  // A token dropped at the first check never comes back, however high its later deviation would be:
  // later checks only see (and return subsets of) the survivors.
  const HKVDSelector sel(schedule(0.2, {1, 2}, {0.2, 0.0}), PromptLayout::from_lengths({10}, 0), 3);
  // r_1 = 0.4 keeps 4 of 10, r_2 = 0.2 keeps 2.
  std::vector<float> dev1(10);
  for (std::size_t i = 0; i < 10; ++i) dev1[i] = static_cast<float>(i);  // top 4: {6, 7, 8, 9}
  const TokenSet s2 = sel.select(1, sel.initial(), dev1);
  CHECK(s2 == TokenSet{6, 7, 8, 9});
  const std::vector<float> dev2 = {3.0f, 1.0f, 2.0f, 0.0f};  // 6:3 7:1 8:2 9:0 -> {6, 8}
  CHECK(sel.select(2, s2, dev2) == TokenSet{6, 8});
}

TEST_CASE("HKVDSelector: equal deviations go to the lower positions") {
  const HKVDSelector sel(schedule(0.5, {1}, {0.0}), PromptLayout::from_lengths({3, 3}, 1), 2);
  // 6 reusable, keep 3; all equal -> {0, 1, 2} plus the query 6.
  const std::vector<float> equal(7, 1.0f);
  CHECK(sel.select(1, sel.initial(), equal) == TokenSet{0, 1, 2, 6});
  // A tie across the cut: 5 leads, then 1 and 3 tie at 2.0 and 4 at 2.0 too -> lowest two of {1, 3, 4}.
  const std::vector<float> cut = {0.0f, 2.0f, 0.0f, 2.0f, 2.0f, 9.0f, 0.0f};
  CHECK(sel.select(1, sel.initial(), cut) == TokenSet{1, 3, 5, 6});
  // Zero deviations everywhere still fill the budget, from the front.
  const std::vector<float> zeros(7, 0.0f);
  CHECK(sel.select(1, sel.initial(), zeros) == TokenSet{0, 1, 2, 6});
}

TEST_CASE("HKVDSelector: tokens of uncached chunks are always computed and never count as reusable") {
  PromptLayout layout = PromptLayout::from_lengths({3, 3, 2}, 2);
  layout.chunks[1].cached = false;  // tokens 3, 4, 5 have no stored KV
  const HKVDSelector sel(schedule(0.4, {1}, {0.0}), layout, 3);
  CHECK(sel.reusable_tokens() == 5);   // 0 1 2 6 7
  CHECK(sel.mandatory_tokens() == 5);  // 3 4 5 8 9
  CHECK(sel.keep_count(1) == 2);       // round(0.4 * 5)
  // Reusable: 0:.3 1:.1 2:.5 6:.2 7:.4 -> {2, 7}; uncached tokens have low deviations but stay.
  const std::vector<float> dev = {0.3f, 0.1f, 0.5f, 0.0f, 0.0f, 0.0f, 0.2f, 0.4f, 0.0f, 0.0f};
  CHECK(sel.select(1, sel.initial(), dev) == TokenSet{2, 3, 4, 5, 7, 8, 9});
  CHECK(sel.plan().tokens_per_layer == std::vector<std::int64_t>{10, 10, 7});
}

TEST_CASE("HKVDSelector: ratio 0 keeps only mandatory tokens, ratio 1 keeps everything") {
  PromptLayout layout = PromptLayout::from_lengths({2, 2, 2}, 2);
  layout.chunks[0].cached = false;
  const std::vector<float> dev = {5, 4, 3, 2, 1, 0, 7, 7};

  const HKVDSelector none(schedule(0.0, {1}, {0.0}), layout, 2);
  CHECK(none.keep_count(1) == 0);
  CHECK(none.select(1, none.initial(), dev) == TokenSet{0, 1, 6, 7});

  const HKVDSelector all(schedule(1.0, {1}, {0.0}), layout, 2);
  CHECK(all.keep_count(1) == 4);
  CHECK(all.select(1, all.initial(), dev) == all.initial());
  CHECK(all.plan().compute_fraction() == 1.0);
}

TEST_CASE("HKVDSelector: empty prompt and a prompt that is only the query") {
  const HKVDSelector empty(HKVDConfig{}, PromptLayout::from_lengths({}, 0), 4);
  CHECK(empty.initial().empty());
  CHECK(empty.select(1, {}, {}).empty());
  CHECK(empty.keep_count(1) == 0);
  CHECK(empty.plan().tokens_per_layer == std::vector<std::int64_t>{0, 0, 0, 0});
  CHECK(empty.plan().compute_fraction() == 0.0);

  // Empty chunks around a bare query: nothing reusable, the query stays.
  const HKVDSelector query_only(HKVDConfig{}, PromptLayout::from_lengths({0, 0}, 3), 4);
  const std::vector<float> dev(3, 1.0f);
  CHECK(query_only.select(1, query_only.initial(), dev) == TokenSet{0, 1, 2});
}

TEST_CASE("HKVDSelector: one-token chunks; the budget may exceed a chunk") {
  // Four one-token chunks and a one-token query; r = 0.5 keeps 2 of 4 reusable tokens, i.e. more than one
  // chunk holds: selection is over the whole prompt, not per chunk.
  const HKVDSelector sel(schedule(0.5, {1}, {0.0}), PromptLayout::from_lengths({1, 1, 1, 1}, 1), 2);
  const std::vector<float> dev = {0.2f, 0.8f, 0.1f, 0.9f, 0.0f};
  CHECK(sel.select(1, sel.initial(), dev) == TokenSet{1, 3, 4});
}

TEST_CASE("HKVDSelector: keep counts round to the nearest token") {
  // 100 reusable tokens: r = 0.29 keeps 29 (0.29 * 100 = 28.999... in floating point).
  const HKVDSelector a(schedule(0.29, {1}, {0.0}), PromptLayout::from_lengths({100}, 1), 2);
  CHECK(a.keep_count(1) == 29);
  // 7 reusable tokens: 0.15 * 7 = 1.05 -> 1; 0.3 * 7 = 2.1 -> 2; 0.4 * 7 = 2.8 -> 3.
  const auto layout = PromptLayout::from_lengths({7}, 1);
  CHECK(HKVDSelector(schedule(0.15, {1}, {0.0}), layout, 2).keep_count(1) == 1);
  CHECK(HKVDSelector(schedule(0.3, {1}, {0.0}), layout, 2).keep_count(1) == 2);
  CHECK(HKVDSelector(schedule(0.4, {1}, {0.0}), layout, 2).keep_count(1) == 3);
}

TEST_CASE("HKVDSelector: gradual filtering only shrinks the set and matches the plan (randomised)") {
  // Three chunks (middle one uncached), 40-token query, default schedule, 8 layers; pseudo-random
  // deviations from a fixed LCG.
  PromptLayout layout = PromptLayout::from_lengths({300, 50, 260}, 40);
  layout.chunks[1].cached = false;
  const HKVDSelector sel(HKVDConfig{}, layout, 8);
  const kvfuse::HKVDPlan plan = sel.plan();
  // 560 reusable: 0.25 * 560 = 140, 0.20 * 560 = 112, 0.15 * 560 = 84; 90 mandatory (50 uncached + query).
  CHECK(plan.kept_reusable == std::vector<std::int64_t>{140, 112, 84});
  CHECK(plan.tokens_per_layer == std::vector<std::int64_t>{650, 650, 230, 202, 174, 174, 174, 174});

  std::uint64_t state = 12345;
  const auto next_float = [&] {
    state = state * 6364136223846793005ull + 1442695040888963407ull;
    return static_cast<float>((state >> 40) % 1000);  // many ties on purpose
  };
  TokenSet s = sel.initial();
  for (int layer = 0; layer < sel.num_layers(); ++layer) {
    CAPTURE(layer);
    CHECK(static_cast<std::int64_t>(s.size()) == plan.tokens_per_layer[static_cast<std::size_t>(layer)]);
    std::vector<float> dev(s.size());
    for (float& d : dev) d = next_float();
    const TokenSet next = sel.select(layer, s, dev);
    CHECK(std::includes(s.begin(), s.end(), next.begin(), next.end()));  // subset of the previous set
    for (std::int64_t q = 610; q < 650; ++q) CHECK(std::binary_search(next.begin(), next.end(), q));
    for (std::int64_t u = 300; u < 350; ++u) CHECK(std::binary_search(next.begin(), next.end(), u));
    if (sel.is_check_layer(layer)) {
      // Every dropped reusable token has a deviation <= every kept one (ties: the dropped one is later).
      float min_kept = std::numeric_limits<float>::infinity();
      std::int64_t last_kept_at_min = -1;
      float max_dropped = -1.0f;
      std::int64_t first_dropped_at_max = -1;
      for (std::size_t i = 0; i < s.size(); ++i) {
        if (!sel.is_reusable(s[i])) continue;
        const bool kept = std::binary_search(next.begin(), next.end(), s[i]);
        if (kept && dev[i] <= min_kept) {
          min_kept = dev[i];
          last_kept_at_min = s[i];
        }
        if (!kept && dev[i] > max_dropped) {
          max_dropped = dev[i];
          first_dropped_at_max = s[i];
        }
      }
      CHECK(max_dropped <= min_kept);
      if (max_dropped == min_kept) CHECK(first_dropped_at_max > last_kept_at_min);
    }
    s = next;
  }
}

TEST_CASE("HKVDSelector: same prompt twice gives the same sets") {
  const HKVDSelector sel(HKVDConfig{}, PromptLayout::from_lengths({8, 8}, 4), 4);
  std::vector<float> dev(20);
  for (std::size_t i = 0; i < dev.size(); ++i) dev[i] = static_cast<float>((i * 7) % 5);
  const TokenSet first = sel.select(1, sel.initial(), dev);
  const TokenSet second = sel.select(1, sel.initial(), dev);
  CHECK(first == second);
}

TEST_CASE("HKVDSelector::select validates the set and the deviations") {
  PromptLayout layout = PromptLayout::from_lengths({4, 4}, 2);
  const HKVDSelector sel(schedule(0.25, {1}, {0.0}), layout, 3);
  const TokenSet all = sel.initial();
  const std::vector<float> dev(10, 1.0f);

  CHECK_THROWS_WITH_AS((void)sel.select(1, all, std::vector<float>(9, 1.0f)),
                       doctest::Contains("9 scores for a set of 10 tokens"), kvfuse::error);
  std::vector<float> negative = dev;
  negative[2] = -0.5f;
  CHECK_THROWS_WITH_AS((void)sel.select(1, all, negative),
                       doctest::Contains("score -0.5 of token 2"), kvfuse::error);
  // A NaN deviation is not an error: the token ranks first (detail::ranks_before, the GPU top-k's order).
  std::vector<float> with_nan = dev;
  with_nan[3] = std::numeric_limits<float>::quiet_NaN();
  const TokenSet kept = sel.select(1, all, with_nan);  // keeps round(0.25 * 8) = 2 reusable + 2 query tokens
  CHECK(kept == TokenSet{0, 3, 8, 9});
  CHECK_THROWS_WITH_AS((void)sel.select(1, TokenSet{0, 2, 1, 8, 9}, std::vector<float>(5, 1.0f)),
                       doctest::Contains("1 follows 2"), kvfuse::error);
  CHECK_THROWS_WITH_AS((void)sel.select(1, TokenSet{0, 8, 9, 10}, std::vector<float>(4, 1.0f)),
                       doctest::Contains("token 10"), kvfuse::error);
  CHECK_THROWS_WITH_AS((void)sel.select(2, TokenSet{0, 1, 8}, {}),
                       doctest::Contains("1 of the 2 mandatory"), kvfuse::error);
  CHECK_THROWS_WITH_AS((void)sel.select(3, all, dev), doctest::Contains("layer 3"), kvfuse::error);
  CHECK_THROWS_WITH_AS((void)sel.is_reusable(10), doctest::Contains("[10, 11)"), kvfuse::error);
}

}  // namespace unit_hkvd_selector
