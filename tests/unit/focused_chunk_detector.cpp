// FocusedChunkDetector: Cache-Craft section 3.2.2, eq. 15 and Algorithm 1. Expected values are worked
// out by hand from the algorithm (comments), with attention in multiples of 1/8 so every cumulative
// score is exact. Notation: s = cumulative scores sorted descending, diff_i = s_i - s_{i+1},
// p_i = diff_i / sum(diff), jump_i = h_{i+1} - h_i = -p_{i+1} ln p_{i+1} (i = 1..k-2),
// i* = argmax jump_i (ties: lowest i), F = the chunks above gap i*+1 = top (i* + 1) (Algorithm 1 line 9
// as read in the header), so cut = |F| = i* + 1.
#include <doctest/doctest.h>

#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "kvfuse/core/error.hpp"
#include "kvfuse/select/focused_chunk_detector.hpp"

#include "../support/error_of.hpp"

// Each unit test file lives in its own namespace: the files are compiled together (a unity build).
namespace unit_focused_chunk_detector {

namespace {

using kvfuse::FocusedChunkConfig;
using kvfuse::FocusedChunkDetector;
using Idx = std::vector<std::size_t>;
using kvfuse_test::error_of;

// -p ln p, written out here independently of the library.
double ent(double p) { return p > 0.0 ? -p * std::log(p) : 0.0; }

// 4 chunks, 6 layers, in units of 1/8 of the question's attention mass.
const std::vector<std::vector<float>> kSeq = {
    {2 / 8.f, 3 / 8.f, 3 / 8.f, 0 / 8.f},  // layer 0
    {1 / 8.f, 2 / 8.f, 1 / 8.f, 4 / 8.f},  // layer 1
    {0 / 8.f, 3 / 8.f, 5 / 8.f, 0 / 8.f},  // layer 2
    {1 / 8.f, 0 / 8.f, 7 / 8.f, 0 / 8.f},  // layer 3
    {1 / 8.f, 6 / 8.f, 0 / 8.f, 1 / 8.f},  // layer 4
    {0 / 8.f, 2 / 8.f, 0 / 8.f, 6 / 8.f},  // layer 5
};

void check_trace(const kvfuse::FocusLayerTrace& t, const std::vector<double>& cumulative, const Idx& order,
                 const std::vector<double>& jumps, std::size_t cut, const Idx& focused) {
  CHECK(t.cumulative == cumulative);  // exact: multiples of 1/8
  CHECK(t.order == order);
  REQUIRE(t.jumps.size() == jumps.size());
  for (std::size_t i = 0; i < jumps.size(); ++i) CHECK(t.jumps[i] == doctest::Approx(jumps[i]).epsilon(1e-12));
  CHECK(t.cut == cut);
  CHECK(t.focused == focused);
}

}  // namespace

TEST_CASE("FocusedChunkDetector: 4 chunks, 6 layers, w = 2 stops at layer 3 with F* = {1, 2, 3}") {
  FocusedChunkDetector d(4, 6, FocusedChunkConfig{2});
  REQUIRE_FALSE(d.is_final());

  // Layer 1 (0-based 0): cinter = (2/8, 3/8, 3/8, 0). Sorted: C1 3/8, C2 3/8 (tie: lower index first),
  // C0 2/8, C3 0. diff = (0, 1/8, 2/8), sum 3/8, p = (0, 1/3, 2/3).
  // jump_1 = -p_2 ln p_2 = ln(3)/3 = 0.3662, jump_2 = -p_3 ln p_3 = -(2/3) ln(2/3) = 0.2703 -> i* = 1,
  // F = top 2 = {C1, C2} (the chunks above gap 2, 3/8 -> 2/8).
  CHECK_FALSE(d.observe(0, kSeq[0]));
  check_trace(d.trace()[0], {0.25, 0.375, 0.375, 0.0}, {1, 2, 0, 3}, {std::log(3.0) / 3.0, ent(2.0 / 3.0)}, 2,
              {1, 2});

  // Layer 2: cinter = (3/8, 5/8, 4/8, 4/8). Sorted: C1 5/8, C2 4/8, C3 4/8 (tie), C0 3/8.
  // diff = (1/8, 0, 1/8), p = (1/2, 0, 1/2). jump_1 = -0 ln 0 = 0, jump_2 = ln(2)/2 = 0.3466
  // -> i* = 2, F = top 3 = {C1, C2, C3}: k-1 chunks, impossible under the literal "top i*".
  // F changed, so the run of equal F restarts at 1.
  CHECK_FALSE(d.observe(1, kSeq[1]));
  check_trace(d.trace()[1], {0.375, 0.625, 0.5, 0.5}, {1, 2, 3, 0}, {0.0, std::log(2.0) / 2.0}, 3, {1, 2, 3});

  // Layer 3: cinter = (3/8, 8/8, 9/8, 4/8). Sorted: C2 9/8, C1 1, C3 4/8, C0 3/8.
  // diff = (1/8, 4/8, 1/8), sum 6/8, p = (1/6, 2/3, 1/6). jump_1 = -(2/3) ln(2/3) = 0.2703,
  // jump_2 = ln(6)/6 = 0.2986 -> i* = 2, F = top 3 = {C2, C1, C3} = {1, 2, 3}: same F for 2 layers,
  // l = 3 >= w -> final, F* = {1, 2, 3}, L* = 3.
  CHECK(d.observe(2, kSeq[2]));
  check_trace(d.trace()[2], {0.375, 1.0, 1.125, 0.5}, {2, 1, 3, 0}, {ent(2.0 / 3.0), std::log(6.0) / 6.0}, 3,
              {1, 2, 3});

  REQUIRE(d.is_final());
  const kvfuse::FocusDecision& dec = d.decision();
  CHECK(dec.stabilised);
  CHECK(dec.focused == Idx{1, 2, 3});
  CHECK(dec.cutoff_layer == 3);  // L* = 3 (1-based): layers 0, 1, 2 recompute every chunk
  CHECK(d.layers_observed() == 3);

  // Unfocused chunk 0 stops at 0-based layer 3; focused chunks 1, 2 and 3 go on.
  CHECK(dec.recomputes(0, 2));
  CHECK_FALSE(dec.recomputes(0, 3));
  CHECK_FALSE(dec.recomputes(0, 5));
  CHECK(dec.recomputes(1, 5));
  CHECK(dec.recomputes(2, 3));
  CHECK(dec.recomputes(3, 5));

  // Algorithm 1 breaks at line 13: later layers are not observed.
  const std::string msg = error_of([&] { d.observe(3, kSeq[3]); });
  CHECK(msg.find("layer 3") != std::string::npos);
  CHECK(msg.find("L* = 3") != std::string::npos);
}

TEST_CASE("FocusedChunkDetector: the same sequence with w = 4 never stabilises, with w = 3 at the last layer") {
  FocusedChunkDetector d(4, 6, FocusedChunkConfig{4});
  for (std::size_t l = 0; l < 5; ++l) CHECK_FALSE(d.observe(l, kSeq[l]));
  CHECK(d.observe(5, kSeq[5]));

  // Layers 1-3 as above: F = {1, 2}, {1, 2, 3}, {1, 2, 3}.
  // Layer 4: cinter = (4/8, 8/8, 16/8, 4/8). Sorted: C2 2, C1 1, C0 4/8, C3 4/8 (tie).
  //   diff = (1, 4/8, 0), sum 12/8, p = (2/3, 1/3, 0). jump_1 = ln(3)/3 = 0.3662, jump_2 = 0 -> i* = 1,
  //   F = top 2 = {C2, C1} = {1, 2}.
  check_trace(d.trace()[3], {0.5, 1.0, 2.0, 0.5}, {2, 1, 0, 3}, {std::log(3.0) / 3.0, 0.0}, 2, {1, 2});
  // Layer 5: cinter = (5/8, 14/8, 16/8, 5/8). Sorted: C2 2, C1 14/8, C0 5/8, C3 5/8.
  //   diff = (2/8, 9/8, 0), sum 11/8, p = (2/11, 9/11, 0). jump_1 = -(9/11) ln(9/11) = 0.1642,
  //   jump_2 = 0 -> i* = 1, F = top 2 = {1, 2}.
  check_trace(d.trace()[4], {0.625, 1.75, 2.0, 0.625}, {2, 1, 0, 3}, {ent(9.0 / 11.0), 0.0}, 2, {1, 2});
  // Layer 6: cinter = (5/8, 16/8, 16/8, 11/8). Sorted: C1 2, C2 2 (tie), C3 11/8, C0 5/8.
  //   diff = (0, 5/8, 6/8), sum 11/8, p = (0, 5/11, 6/11). jump_1 = -(5/11) ln(5/11) = 0.3584,
  //   jump_2 = -(6/11) ln(6/11) = 0.3306 -> i* = 1, F = top 2 = {1, 2}.
  check_trace(d.trace()[5], {0.625, 2.0, 2.0, 1.375}, {1, 2, 3, 0}, {ent(5.0 / 11.0), ent(6.0 / 11.0)}, 2,
              {1, 2});

  // F over the layers: {1,2}, {1,2,3}, {1,2,3}, {1,2}, {1,2}, {1,2}: at most 3 in a row, w = 4 -> no
  // early stop: L* = L and every chunk is kept.
  const kvfuse::FocusDecision& dec = d.decision();
  CHECK_FALSE(dec.stabilised);
  CHECK(dec.cutoff_layer == 6);  // L* = L
  CHECK(dec.focused == Idx{0, 1, 2, 3});
  CHECK(dec.recomputes(0, 5));
  CHECK(dec.recomputes(3, 5));

  // w = 3: layers 4, 5, 6 give {1, 2} three times -> final at the last layer, L* = 6 = L, but stabilised
  // with F* = {1, 2} (unlike the run above, where F* is every chunk).
  FocusedChunkDetector d3(4, 6, FocusedChunkConfig{3});
  for (std::size_t l = 0; l < 5; ++l) CHECK_FALSE(d3.observe(l, kSeq[l]));
  CHECK(d3.observe(5, kSeq[5]));
  CHECK(d3.decision().stabilised);
  CHECK(d3.decision().cutoff_layer == 6);
  CHECK(d3.decision().focused == Idx{1, 2});
}

TEST_CASE("FocusedChunkDetector: w = 1 decides at the first layer") {
  FocusedChunkDetector d(4, 6, FocusedChunkConfig{1});
  CHECK(d.observe(0, kSeq[0]));  // F = {C1, C2} at layer 1, see the first test
  CHECK(d.decision().stabilised);
  CHECK(d.decision().focused == Idx{1, 2});
  CHECK(d.decision().cutoff_layer == 1);
}

TEST_CASE("FocusedChunkDetector: all-equal attention has no cut point, so every chunk is focused") {
  // Equal cumulative scores: diff = (0, 0, 0, 0), sum(diff) = 0, p = 0/0 -> no cut, F = all chunks,
  // the same at every layer -> final after w layers.
  FocusedChunkDetector d(5, 8, FocusedChunkConfig{3});
  const std::vector<float> equal(5, 0.2f);
  CHECK_FALSE(d.observe(0, equal));
  CHECK_FALSE(d.observe(1, equal));
  CHECK(d.observe(2, equal));
  for (const auto& t : d.trace()) {
    CHECK(t.order == Idx{0, 1, 2, 3, 4});  // ties: lower chunk index first
    CHECK(t.jumps.empty());
    CHECK(t.cut == 5);
    CHECK(t.focused == Idx{0, 1, 2, 3, 4});
  }
  CHECK(d.decision().stabilised);
  CHECK(d.decision().focused == Idx{0, 1, 2, 3, 4});
  CHECK(d.decision().cutoff_layer == 3);

  // All-zero attention is all-equal too.
  FocusedChunkDetector z(3, 2, FocusedChunkConfig{2});
  z.observe(0, std::vector<float>(3, 0.0f));
  CHECK(z.observe(1, std::vector<float>(3, 0.0f)));
  CHECK(z.decision().focused == Idx{0, 1, 2});
}

TEST_CASE("FocusedChunkDetector: one chunk and two chunks have no cut point") {
  FocusedChunkDetector one(1, 4, FocusedChunkConfig{2});
  const std::vector<float> a = {0.5f};
  CHECK_FALSE(one.observe(0, a));
  CHECK(one.observe(1, a));
  CHECK(one.trace()[1].cumulative == std::vector<double>{1.0});
  CHECK(one.trace()[1].cut == 1);
  CHECK(one.decision().focused == Idx{0});
  CHECK(one.decision().cutoff_layer == 2);

  // k = 2: line 8's argmax ranges over i in [k-2] = nothing -> F = both chunks, even with a clear gap.
  FocusedChunkDetector two(2, 4, FocusedChunkConfig{2});
  const std::vector<float> b = {0.9f, 0.1f};
  two.observe(0, b);
  CHECK(two.observe(1, b));
  CHECK(two.trace()[0].jumps.empty());
  CHECK(two.decision().focused == Idx{0, 1});
}

TEST_CASE("FocusedChunkDetector: w larger than the layer count never stops early") {
  FocusedChunkDetector d(3, 2, FocusedChunkConfig{5});
  const std::vector<float> a = {0.7f, 0.2f, 0.1f};
  CHECK_FALSE(d.observe(0, a));
  CHECK(d.observe(1, a));
  CHECK_FALSE(d.decision().stabilised);
  CHECK(d.decision().cutoff_layer == 2);
  CHECK(d.decision().focused == Idx{0, 1, 2});
}

TEST_CASE("focus_cut: Algorithm 1 lines 5-9 on sorted scores, |F| = i* + 1") {
  // 5 chunks (8, 7, 4, 3, 0): diff = (1, 3, 1, 3), sum 8, p = (1/8, 3/8, 1/8, 3/8);
  // jumps = (ent(p_2), ent(p_3), ent(p_4)) = (ent(3/8), ent(1/8), ent(3/8)) = (0.3678, 0.2599, 0.3678)
  // -> first maximum, i* = 1 -> |F| = 2: the chunks above gap 2 (7 -> 4).
  const double c[] = {8.0, 7.0, 4.0, 3.0, 0.0};
  double jc[3] = {};
  CHECK(kvfuse::detail::focus_cut(c, 5, jc) == 2);
  CHECK(jc[0] == doctest::Approx(ent(3.0 / 8.0)));
  CHECK(jc[1] == doctest::Approx(ent(1.0 / 8.0)));
  CHECK(jc[2] == doctest::Approx(ent(3.0 / 8.0)));

  // (5, 3, 3, 0): diff = (2, 0, 3), sum 5, p = (2/5, 0, 3/5); jump_1 = 0, jump_2 = -(3/5) ln(3/5) = 0.3065
  // -> i* = 2 -> |F| = 3 = k-1, the chunks above gap 3 (3 -> 0).
  const double g[] = {5.0, 3.0, 3.0, 0.0};
  double jg[2] = {-1.0, -1.0};
  CHECK(kvfuse::detail::focus_cut(g, 4, jg) == 3);
  CHECK(jg[0] == 0.0);
  CHECK(jg[1] == doctest::Approx(ent(0.6)));

  // (6, 5, 1, 0): diff = (1, 4, 1), sum 6, p = (1/6, 4/6, 1/6);
  // jump_1 = -(2/3) ln(2/3) = 0.2703 < jump_2 = ln(6)/6 = 0.2986 -> i* = 2 -> |F| = 3. The largest gap
  // (5 -> 1) is gap 2, but -p ln p peaks at p = 1/e, so the moderate p_3 = 1/6 outscores p_2 = 2/3.
  const double b[] = {6.0, 5.0, 1.0, 0.0};
  CHECK(kvfuse::detail::focus_cut(b, 4, nullptr) == 3);

  // (1, 1, 0, 0): diff = (0, 1, 0), p = (0, 1, 0); jumps = (-1 ln 1, -0 ln 0) = (0, 0); argmax tie ->
  // i* = 1 -> |F| = 2, the chunks above the only gap (the literal "top i*" gave 1).
  const double d[] = {1.0, 1.0, 0.0, 0.0};
  double jd[2] = {-1.0, -1.0};
  CHECK(kvfuse::detail::focus_cut(d, 4, jd) == 2);
  CHECK(jd[0] == 0.0);
  CHECK(jd[1] == 0.0);

  // A lone gap is invisible to the paper's -p ln p (p one-hot -> every jump 0 -> tie -> i* = 1 -> 2):
  // (10, 0, 0, 0) p = (1, 0, 0) and (1, 1, 1, 0) p = (0, 0, 1) both give |F| = 2. Kept as published.
  const double a[] = {10.0, 0.0, 0.0, 0.0};
  CHECK(kvfuse::detail::focus_cut(a, 4, nullptr) == 2);
  const double h[] = {1.0, 1.0, 1.0, 0.0};
  CHECK(kvfuse::detail::focus_cut(h, 4, nullptr) == 2);

  // No cut point: k <= 2 or no gaps -> |F| = k.
  const double e[] = {3.0, 1.0};
  CHECK(kvfuse::detail::focus_cut(e, 2, nullptr) == 2);
  const double f[] = {2.0, 2.0, 2.0};
  CHECK(kvfuse::detail::focus_cut(f, 3, nullptr) == 3);
  CHECK(kvfuse::detail::focus_entropy_term(0.5) == doctest::Approx(std::log(2.0) / 2.0));
  CHECK(kvfuse::detail::focus_entropy_term(0.0) == 0.0);
}

TEST_CASE("FocusedChunkDetector: scores (1, 1, 0, 0) focus the top 2 chunks, in any chunk order") {
  // Sorted (1, 1, 0, 0): p = (0, 1, 0), jumps (0, 0), i* = 1 -> F = top 2 (see focus_cut above).
  FocusedChunkDetector d(4, 3, FocusedChunkConfig{1});
  CHECK(d.observe(0, std::vector<float>{1.0f, 1.0f, 0.0f, 0.0f}));
  CHECK(d.trace()[0].cut == 2);
  CHECK(d.decision().focused == Idx{0, 1});
  CHECK(d.decision().cutoff_layer == 1);

  // Chunks reordered: (0, 1, 0, 1) sorts to C1, C3, C0, C2 -> F = {1, 3}.
  FocusedChunkDetector r(4, 3, FocusedChunkConfig{1});
  CHECK(r.observe(0, std::vector<float>{0.0f, 1.0f, 0.0f, 1.0f}));
  CHECK(r.trace()[0].order == Idx{1, 3, 0, 2});
  CHECK(r.decision().focused == Idx{1, 3});
}

TEST_CASE("FocusedChunkDetector: a clear 3-of-10 focus (chunks 2, 5, 7) is found at L* = w") {
  // Like bench/bench_focus.cpp: 10 chunks, 30 layers, chunks 2, 5 and 7 get most of the question's
  // attention. Every layer, in units of 1/64 (row sum 64/64 = 1):
  //   C0 3, C1 5, C2 12, C3 4, C4 3, C5 14, C6 4, C7 13, C8 3, C9 3.
  // Cumulative after l layers = l * row, and p does not change with the scale, so every layer:
  //   sorted: C5 14, C7 13, C2 12, C1 5, C3 4, C6 4, C0 3, C4 3, C8 3, C9 3 (ties: lower index first)
  //   diff = (1, 1, 7, 1, 0, 1, 0, 0, 0)/64, sum 11/64, p = (1, 1, 7, 1, 0, 1, 0, 0, 0)/11
  //   jump_i = ent(p_{i+1}), i = 1..8: (ent(1/11), ent(7/11), ent(1/11), 0, ent(1/11), 0, 0, 0)
  //   ent(7/11) = (7/11) ln(11/7) = 0.2876 > ent(1/11) = ln(11)/11 = 0.2180 -> i* = 2
  //   F = top 3 = {C5, C7, C2} = {2, 5, 7}.
  // Default w = 5: the same F for layers 1..5 -> final at l = 5: F* = {2, 5, 7}, L* = 5.
  const std::vector<float> row = {3 / 64.f, 5 / 64.f, 12 / 64.f, 4 / 64.f, 3 / 64.f,
                                  14 / 64.f, 4 / 64.f, 13 / 64.f, 3 / 64.f, 3 / 64.f};
  FocusedChunkDetector d(10, 30);
  CHECK(d.config().window == 5);
  for (std::size_t l = 0; l < 4; ++l) CHECK_FALSE(d.observe(l, row));
  CHECK(d.observe(4, row));

  const double e1 = std::log(11.0) / 11.0;
  const double e7 = 7.0 / 11.0 * std::log(11.0 / 7.0);
  CHECK(e7 > e1);  // the hand ranking above
  check_trace(d.trace()[0], {3 / 64.0, 5 / 64.0, 12 / 64.0, 4 / 64.0, 3 / 64.0, 14 / 64.0, 4 / 64.0, 13 / 64.0,
                             3 / 64.0, 3 / 64.0},
              {5, 7, 2, 1, 3, 6, 0, 4, 8, 9}, {e1, e7, e1, 0.0, e1, 0.0, 0.0, 0.0}, 3, {2, 5, 7});
  for (const auto& t : d.trace()) CHECK(t.focused == Idx{2, 5, 7});

  const kvfuse::FocusDecision& dec = d.decision();
  CHECK(dec.stabilised);
  CHECK(dec.focused == Idx{2, 5, 7});
  CHECK(dec.cutoff_layer == 5);
  CHECK(dec.recomputes(0, 4));
  CHECK_FALSE(dec.recomputes(0, 5));
  CHECK_FALSE(dec.recomputes(9, 29));
  CHECK(dec.recomputes(2, 29));
  CHECK(dec.recomputes(5, 29));
  CHECK(dec.recomputes(7, 5));
}

TEST_CASE("FocusedChunkDetector: bad config and bad input throw kvfuse::error naming the value") {
  CHECK_THROWS_AS(FocusedChunkDetector(4, 6, FocusedChunkConfig{0}), kvfuse::error);
  CHECK(error_of([] { FocusedChunkConfig{0}.validate(); }).find("window = 0") != std::string::npos);
  CHECK(error_of([] { FocusedChunkDetector(0, 6); }).find("num_chunks = 0") != std::string::npos);
  CHECK(error_of([] { FocusedChunkDetector(4, 0); }).find("num_layers = 0") != std::string::npos);

  FocusedChunkDetector d(3, 4, FocusedChunkConfig{2});
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const float inf = std::numeric_limits<float>::infinity();
  const std::vector<float> with_nan = {0.1f, nan, 0.2f};
  const std::vector<float> with_negative = {0.1f, 0.2f, -0.5f};
  const std::vector<float> with_inf = {inf, 0.2f, 0.1f};
  const std::vector<float> too_short = {0.1f, 0.2f};
  const std::vector<float> ok = {0.5f, 0.25f, 0.25f};

  std::string msg = error_of([&] { d.observe(0, with_nan); });
  CHECK(msg.find("nan") != std::string::npos);
  CHECK(msg.find("chunk 1") != std::string::npos);
  msg = error_of([&] { d.observe(0, with_negative); });
  CHECK(msg.find("-0.5") != std::string::npos);
  CHECK(msg.find("chunk 2") != std::string::npos);
  CHECK(error_of([&] { d.observe(0, with_inf); }).find("inf") != std::string::npos);
  CHECK(error_of([&] { d.observe(0, too_short); }).find("2 attention values") != std::string::npos);
  CHECK(error_of([&] { d.observe(1, ok); }).find("layer 1 observed out of order") != std::string::npos);
  CHECK(error_of([&] { (void)d.decision(); }).find("after 0 of 4 layers") != std::string::npos);

  // Rejected input left no trace: the detector still works from layer 0.
  CHECK(d.layers_observed() == 0);
  CHECK_FALSE(d.observe(0, ok));
  CHECK(d.trace()[0].cumulative == std::vector<double>{0.5, 0.25, 0.25});
}

}  // namespace unit_focused_chunk_detector
