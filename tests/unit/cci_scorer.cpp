// Cache-Craft CCIScorer: every equation of sections 3.1-3.2.1 checked against hand-computed values.
#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "kvfuse/select/cci_scorer.hpp"

// Each unit test file lives in its own namespace: the files are compiled together (a unity build).
namespace unit_cci_scorer {

using kvfuse::ChunkAttention;
using kvfuse::ChunkProfile;
using kvfuse::ChunkScore;
using kvfuse::CCIScorer;
using kvfuse::CCIScorerConfig;
using kvfuse::PromptLayout;
using kvfuse::TokenSet;

namespace {

using Ids = std::vector<std::uint64_t>;
constexpr std::uint64_t kC1 = 11, kC2 = 22, kC3 = 33;

// The 3-chunk example: C1 = tokens {0, 1}, C2 = {2}, C3 = {3, 4}, question = {5} (its row is ignored).
// attn[q][k] = weight of key k for query q, two layers, causal.
const std::vector<std::vector<double>> kLayers = {
    {
        1.0, 0.0, 0.0, 0.0, 0.0, 0.0,  //
        0.5, 0.5, 0.0, 0.0, 0.0, 0.0,  //
        0.2, 0.2, 0.6, 0.0, 0.0, 0.0,  //
        0.1, 0.3, 0.2, 0.4, 0.0, 0.0,  //
        0.1, 0.1, 0.2, 0.4, 0.2, 0.0,  //
        0.1, 0.1, 0.1, 0.1, 0.1, 0.5,  //
    },
    {
        1.0, 0.0, 0.0, 0.0, 0.0, 0.0,  //
        0.3, 0.7, 0.0, 0.0, 0.0, 0.0,  //
        0.5, 0.3, 0.2, 0.0, 0.0, 0.0,  //
        0.2, 0.2, 0.2, 0.4, 0.0, 0.0,  //
        0.1, 0.1, 0.1, 0.3, 0.4, 0.0,  //
        0.2, 0.2, 0.2, 0.2, 0.1, 0.1,  //
    },
};

// By hand, per layer (eq. 3: queries of the later chunk on keys of the earlier; eq. 4: k < q only):
//   layer 1: intra(C1) = a10 = 0.5, intra(C2) = 0 (one token), intra(C3) = a43 = 0.4
//            inter(C1,C2) = a20 + a21 = 0.4, inter(C1,C3) = a30 + a31 + a40 + a41 = 0.6,
//            inter(C2,C3) = a32 + a42 = 0.4
//   layer 2: intra(C1) = 0.3, intra(C2) = 0, intra(C3) = 0.3
//            inter(C1,C2) = 0.8, inter(C1,C3) = 0.2 + 0.2 + 0.1 + 0.1 = 0.6, inter(C2,C3) = 0.2 + 0.1 = 0.3
// Eq. 9-10:
//   C1: a = 0, b = 0.5/4 = 0.125 and 0.3/4 = 0.075 -> a_bar = 0, b_bar = 0.1 -> CCI = sigmoid(0) = 0.5
//   C2: a = 0.4/(1*2) = 0.2 and 0.8/2 = 0.4 -> a_bar = 0.3; b_bar = 0 -> CCI = 1
//   C3: a = 0.6/(2*2) + 0.4/(2*1) = 0.35 and 0.6/4 + 0.3/2 = 0.3 -> a_bar = 0.325
//       b = 0.4/4 = 0.1 and 0.3/4 = 0.075 -> b_bar = 0.0875; a_bar/b_bar = 26/7 -> CCI = 1/(1 + e^(-26/7))
// Eq. 14 scores, summed over layers: C1 [0, 0]; C2 [0.4 + 0.8 = 1.2];
//   C3 token 3: (0.1+0.3+0.2) + (0.2+0.2+0.2) = 1.2, token 4: (0.1+0.1+0.2) + (0.1+0.1+0.1) = 0.7
// Inter summed over layers (eq. 6 weights): C2 <- C1: 1.2; C3 <- C1: 1.2, C3 <- C2: 0.7.
const double kCci3 = 1.0 / (1.0 + std::exp(-26.0 / 7.0));

ChunkAttention example_stats() {
  return ChunkAttention::from_token_attention(Ids{kC1, kC2, kC3}, PromptLayout::from_lengths({2, 1, 2}, 1), kLayers);
}

}  // namespace

TEST_CASE("cci: token-level inter and intra attention (eq. 3-4) and the eq. 14 token score") {
  const double* l1 = kLayers[0].data();
  CHECK(kvfuse::inter_attention(l1, 6, 0, 2, 2, 3) == doctest::Approx(0.4));  // inter(C1, C2)
  CHECK(kvfuse::inter_attention(l1, 6, 0, 2, 3, 5) == doctest::Approx(0.6));  // inter(C1, C3)
  CHECK(kvfuse::inter_attention(l1, 6, 2, 3, 3, 5) == doctest::Approx(0.4));  // inter(C2, C3)
  CHECK(kvfuse::intra_attention(l1, 6, 0, 2) == doctest::Approx(0.5));
  CHECK(kvfuse::intra_attention(l1, 6, 2, 3) == 0.0);  // one token: no k < q pair
  CHECK(kvfuse::intra_attention(l1, 6, 3, 5) == doctest::Approx(0.4));
  CHECK(kvfuse::token_prefix_attention(l1, 6, 3, 3) == doctest::Approx(0.6));
  CHECK(kvfuse::token_prefix_attention(l1, 6, 4, 3) == doctest::Approx(0.4));
  const std::vector<float> f(kLayers[0].begin(), kLayers[0].end());  // float input, as a GPU would record it
  CHECK(kvfuse::inter_attention(f.data(), 6, 0, 2, 3, 5) == doctest::Approx(0.6).epsilon(1e-6));
}

TEST_CASE("cci: ChunkAttention::from_token_attention builds the per-layer chunk mass matrices") {
  const ChunkAttention s = example_stats();
  REQUIRE(s.num_chunks() == 3);
  REQUIRE(s.num_layers() == 2);
  CHECK(s.chunk_sizes == std::vector<std::int64_t>{2, 1, 2});
  CHECK(s.mass(0, 0, 0) == doctest::Approx(0.5));
  CHECK(s.mass(0, 1, 0) == doctest::Approx(0.4));
  CHECK(s.mass(0, 1, 1) == 0.0);
  CHECK(s.mass(0, 2, 0) == doctest::Approx(0.6));
  CHECK(s.mass(0, 2, 1) == doctest::Approx(0.4));
  CHECK(s.mass(0, 2, 2) == doctest::Approx(0.4));
  CHECK(s.mass(1, 1, 0) == doctest::Approx(0.8));
  CHECK(s.mass(1, 2, 1) == doctest::Approx(0.3));
  CHECK(s.mass(1, 0, 2) == 0.0);  // causal: an earlier chunk never sees a later one
  CHECK(s.token_prefix_attention[0] == std::vector<double>{0.0, 0.0});
  CHECK(s.token_prefix_attention[1][0] == doctest::Approx(1.2));
  CHECK(s.token_prefix_attention[2][0] == doctest::Approx(1.2));
  CHECK(s.token_prefix_attention[2][1] == doctest::Approx(0.7));
}

TEST_CASE("cci: a and b (eq. 9), layer means (eq. 10), CCI (eq. 11)") {
  // C3, layer 1: 0.6/(2*2) + 0.4/(2*1) = 0.35; b = 0.4/2^2 = 0.1.
  CHECK(kvfuse::cci_a(std::vector<double>{0.6, 0.4}, std::vector<std::int64_t>{2, 1}, 2) == doctest::Approx(0.35));
  CHECK(kvfuse::cci_b(0.4, 2) == doctest::Approx(0.1));
  CHECK(kvfuse::cci_a(std::vector<double>{}, std::vector<std::int64_t>{}, 2) == 0.0);  // first chunk
  CHECK(kvfuse::cci_a(std::vector<double>{0.0}, std::vector<std::int64_t>{0}, 2) == 0.0);  // empty prefix chunk
  CHECK(kvfuse::cci_b(0.0, 0) == 0.0);  // empty chunk
  CHECK(kvfuse::layer_mean(std::vector<double>{0.35, 0.3}) == doctest::Approx(0.325));
  CHECK(kvfuse::cache_context_impact(0.325, 0.0875) == doctest::Approx(kCci3));
  CHECK(kvfuse::cache_context_impact(1.0, 1.0) == doctest::Approx(1.0 / (1.0 + std::exp(-1.0))));
  CHECK(kvfuse::cache_context_impact(0.0, 0.1) == 0.5);   // no outside influence: sigmoid(0)
  CHECK(kvfuse::cache_context_impact(0.3, 0.0) == 1.0);   // one-token chunk with a prefix: a/b = +inf
  CHECK(kvfuse::cache_context_impact(0.0, 0.0) == 0.5);   // nothing at all: ratio 0
}

TEST_CASE("cci: prefix overlap beta (eq. 6)") {
  const Ids stored{1, 2, 3};
  const std::vector<double> inter{0.5, 0.3, 0.2};
  // Partial overlap: chunks 1 and 3 kept -> (0.5 + 0.2) / 1.0.
  CHECK(kvfuse::prefix_overlap(stored, inter, Ids{3, 9, 1}) == doctest::Approx(0.7));
  CHECK(kvfuse::prefix_overlap(stored, inter, Ids{3, 1, 2}) == doctest::Approx(1.0));  // order-invariant
  CHECK(kvfuse::prefix_overlap(stored, inter, Ids{7, 8}) == 0.0);
  CHECK(kvfuse::prefix_overlap(stored, inter, Ids{}) == 0.0);
  // Zero stored inter attention (the chunk was first): 1 for the same (empty) prefix, else 0.
  CHECK(kvfuse::prefix_overlap(Ids{}, std::vector<double>{}, Ids{}) == 1.0);
  CHECK(kvfuse::prefix_overlap(Ids{}, std::vector<double>{}, Ids{5}) == 0.0);
}

TEST_CASE("cci: order penalty gamma is the normalized Kendall-tau distance (eq. 7)") {
  CHECK(kvfuse::order_penalty(Ids{2, 1, 3}, Ids{1, 2, 3}) == doctest::Approx(1.0 / 3.0));  // D = 1, T = 3
  CHECK(kvfuse::order_penalty(Ids{1, 2, 3}, Ids{1, 2, 3}) == 0.0);
  CHECK(kvfuse::order_penalty(Ids{1, 2, 3, 4}, Ids{4, 3, 2, 1}) == doctest::Approx(1.0));        // D = 6, T = 6
  CHECK(kvfuse::order_penalty(Ids{1, 2, 3, 4}, Ids{2, 1, 4, 3}) == doctest::Approx(1.0 / 3.0));  // D = 2, T = 6
  // Only common chunks count: A_old = <2, 4>, A_new = <4, 2> -> D = 1, T = 1.
  CHECK(kvfuse::order_penalty(Ids{1, 2, 3, 4}, Ids{4, 9, 2}) == doctest::Approx(1.0));
  CHECK(kvfuse::order_penalty(Ids{1, 2}, Ids{2, 7}) == 0.0);  // m = 1: no pair
  CHECK(kvfuse::order_penalty(Ids{}, Ids{}) == 0.0);           // m = 0
}

TEST_CASE("cci: beta' (eq. 8), CFO (eq. 12) and N = ceil(CFO |C|)") {
  CHECK(kvfuse::adjusted_prefix_overlap(0.8, 0.25) == doctest::Approx(0.6));
  CHECK(kvfuse::adjusted_prefix_overlap(1.0, 1.0) == 0.0);
  CHECK(kvfuse::cache_fix_overhead(0.9, 0.6) == doctest::Approx(0.36));       // 0.9 * 0.4
  CHECK(kvfuse::cache_fix_overhead(0.9, 0.6, 2.0) == doctest::Approx(0.72));  // alpha = 2
  CHECK(kvfuse::cache_fix_overhead(0.9, 1.0) == 0.0);

  CHECK(kvfuse::recompute_count(0.1 * 3, 10) == 3);  // 3.0000000000000004 is 3, not 4
  CHECK(kvfuse::recompute_count(0.31, 10) == 4);     // ceil(3.1)
  CHECK(kvfuse::recompute_count(0.25, 4) == 1);
  CHECK(kvfuse::recompute_count(0.26, 4) == 2);      // ceil(1.04)
  CHECK(kvfuse::recompute_count(0.0, 10) == 0);      // ratio 0
  CHECK(kvfuse::recompute_count(1.0, 10) == 10);     // ratio 1
  CHECK(kvfuse::recompute_count(1.5, 10) == 10);     // alpha > 1 clipped to |C|
  CHECK(kvfuse::recompute_count(0.5, 0) == 0);       // empty chunk
  CHECK(kvfuse::recompute_count(0.5, 1) == 1);       // one-token chunk
  // Any positive CFO · |C| needs at least one token, however small: ceil(1e-11) = 1, ceil(5e-10) = 1.
  CHECK(kvfuse::recompute_count(1e-12, 10) == 1);
  CHECK(kvfuse::recompute_count(5e-10, 1) == 1);
  CHECK(kvfuse::recompute_count(std::numeric_limits<double>::denorm_min(), 1000) == 1);
}

TEST_CASE("cci: tolerant ceiling behind N = ceil(CFO |C|)") {
  using kvfuse::detail::tolerant_ceil;
  CHECK(tolerant_ceil(0.0) == 0.0);
  CHECK(tolerant_ceil(3.0) == 3.0);
  CHECK(tolerant_ceil(3.1) == 4.0);
  CHECK(tolerant_ceil(0.1 * 3 * 10) == 3.0);        // 3.0000000000000004
  CHECK(tolerant_ceil(1000.0000005) == 1000.0);      // 5e-7 above 1000 is within 1e-9 * 1000 = 1e-6
  CHECK(tolerant_ceil(1000.000002) == 1001.0);       // 2e-6 above is not
  CHECK(tolerant_ceil(1e-12) == 1.0);                // 0 < x < 1: the slack (1e-21) stays below x
  CHECK(tolerant_ceil(0.999999) == 1.0);
  CHECK(tolerant_ceil(4503599627370496.0) == 4503599627370496.0);  // 2^52: no integer is lost
  CHECK(tolerant_ceil(-2.5) == -2.0);
}

TEST_CASE("cci: top-N tokens by inter attention, ties to the lower position (eq. 14)") {
  const std::vector<double> scores{0.2, 0.5, 0.5, 0.1, 0.5};
  CHECK(kvfuse::rank_tokens(scores) == std::vector<std::int64_t>{1, 2, 4, 0, 3});
  CHECK(kvfuse::select_recompute_tokens(scores, 2) == TokenSet{1, 2});
  CHECK(kvfuse::select_recompute_tokens(scores, 4) == TokenSet{0, 1, 2, 4});
  CHECK(kvfuse::select_recompute_tokens(scores, 0).empty());
  CHECK(kvfuse::select_recompute_tokens(scores, 5) == TokenSet{0, 1, 2, 3, 4});
  CHECK(kvfuse::select_recompute_tokens(std::vector<double>{0.3, 0.3, 0.3}, 2) == TokenSet{0, 1});  // all equal
  CHECK(kvfuse::select_recompute_tokens(std::vector<double>{}, 0).empty());
}

TEST_CASE("cci: CCIScorer profiles the 3-chunk example") {
  const auto profiles = CCIScorer{}.profile(example_stats());
  REQUIRE(profiles.size() == 3);
  const ChunkProfile& p1 = profiles[0];
  const ChunkProfile& p2 = profiles[1];
  const ChunkProfile& p3 = profiles[2];

  CHECK(p1.chunk_id == kC1);
  CHECK(p1.stored_prefix.empty());
  CHECK(p1.a_bar == 0.0);
  CHECK(p1.b_bar == doctest::Approx(0.1));
  CHECK(p1.cci == 0.5);
  CHECK(p1.token_ranking == std::vector<std::int64_t>{0, 1});  // all-zero scores: by position

  CHECK(p2.stored_prefix == Ids{kC1});
  CHECK(p2.a_bar == doctest::Approx(0.3));
  CHECK(p2.b_bar == 0.0);
  CHECK(p2.cci == 1.0);
  REQUIRE(p2.prefix_inter.size() == 1);
  CHECK(p2.prefix_inter[0] == doctest::Approx(1.2));

  CHECK(p3.size == 2);
  CHECK(p3.stored_prefix == Ids{kC1, kC2});
  CHECK(p3.a_bar == doctest::Approx(0.325));
  CHECK(p3.b_bar == doctest::Approx(0.0875));
  CHECK(p3.cci == doctest::Approx(kCci3));
  REQUIRE(p3.prefix_inter.size() == 2);
  CHECK(p3.prefix_inter[0] == doctest::Approx(1.2));
  CHECK(p3.prefix_inter[1] == doctest::Approx(0.7));
  CHECK(p3.token_ranking == std::vector<std::int64_t>{0, 1});

  const ChunkProfile single = CCIScorer{}.profile(example_stats(), 2);
  CHECK(single.cci == doctest::Approx(kCci3));
}

TEST_CASE("cci: CCIScorer scores C3 behind new prefixes") {
  const CCIScorer scorer;
  const ChunkProfile p3 = scorer.profile(example_stats(), 2);

  SUBCASE("same prefix: beta = 1, gamma = 0, CFO = 0, nothing to recompute") {
    const ChunkScore s = scorer.score(p3, Ids{kC1, kC2});
    CHECK(s.beta == 1.0);
    CHECK(s.gamma == 0.0);
    CHECK(s.beta_adjusted == 1.0);
    CHECK(s.cfo == 0.0);
    CHECK(s.num_recompute == 0);
    CHECK(s.recompute.empty());
  }
  SUBCASE("paper case (i) C4-C2-C3: only C2 shared -> beta = 0.7/1.9") {
    const ChunkScore s = scorer.score(p3, Ids{44, kC2});
    CHECK(s.beta == doctest::Approx(7.0 / 19.0));
    CHECK(s.gamma == 0.0);
    CHECK(s.cfo == doctest::Approx(kCci3 * 12.0 / 19.0));  // ~0.6166
    CHECK(s.num_recompute == 2);                            // ceil(1.233)
    CHECK(s.recompute == TokenSet{0, 1});
  }
  SUBCASE("paper case (ii) C5-C6-C3: nothing shared -> CFO = CCI") {
    const ChunkScore s = scorer.score(p3, Ids{55, 66});
    CHECK(s.beta == 0.0);
    CHECK(s.cfo == doctest::Approx(kCci3));
    CHECK(s.num_recompute == 2);
  }
  SUBCASE("C1 shared only: beta = 1.2/1.9, N = ceil(0.7193) = 1, the token with more prefix attention") {
    const ChunkScore s = scorer.score(p3, Ids{kC1, 44});
    CHECK(s.beta == doctest::Approx(12.0 / 19.0));
    CHECK(s.cfo == doctest::Approx(kCci3 * 7.0 / 19.0));
    CHECK(s.num_recompute == 1);
    CHECK(s.recompute == TokenSet{0});
  }
  SUBCASE("reordered prefix C2-C1: beta = 1 but gamma = 1, so beta' = 0") {
    const ChunkScore s = scorer.score(p3, Ids{kC2, kC1});
    CHECK(s.beta == 1.0);
    CHECK(s.gamma == 1.0);
    CHECK(s.beta_adjusted == 0.0);
    CHECK(s.cfo == doctest::Approx(kCci3));
    CHECK(s.recompute == TokenSet{0, 1});
  }
  SUBCASE("alpha scales CFO (eq. 12)") {
    const ChunkScore s = CCIScorer{CCIScorerConfig{0.5}}.score(p3, Ids{kC1, 44});
    CHECK(s.cfo == doctest::Approx(0.5 * kCci3 * 7.0 / 19.0));
    CHECK(s.num_recompute == 1);  // ceil(0.3597)
  }
}

TEST_CASE("cci: prefix coverage scales beta by the share of the current prefix the stored prefix held") {
  const CCIScorer paper;
  const CCIScorer covered{CCIScorerConfig{1.0, true}};
  const ChunkProfile p2 = paper.profile(example_stats(), 1);  // stored behind C1
  const ChunkProfile p3 = paper.profile(example_stats(), 2);  // stored behind C1 C2

  SUBCASE("stored behind C1, now behind C1 44 55: eq. 6 alone says beta = 1 and recomputes nothing") {
    const ChunkScore alone = paper.score(p2, Ids{kC1, 44, 55});
    CHECK(alone.beta == 1.0);
    CHECK(alone.coverage == 1.0);
    CHECK(alone.cfo == 0.0);
    const ChunkScore s = covered.score(p2, Ids{kC1, 44, 55});
    CHECK(s.coverage == doctest::Approx(1.0 / 3.0));
    CHECK(s.beta == doctest::Approx(1.0 / 3.0));
    CHECK(s.gamma == 0.0);
    CHECK(s.cfo == doctest::Approx(2.0 / 3.0));  // CCI(C2) = 1
    CHECK(s.num_recompute == 1);                 // ceil(2/3) of its one token
  }
  SUBCASE("the stored prefix, and a part of it: coverage 1, the paper's score exactly") {
    for (const Ids& prefix : {Ids{kC1, kC2}, Ids{kC1}, Ids{}}) {
      const ChunkScore a = paper.score(p3, prefix);
      const ChunkScore b = covered.score(p3, prefix);
      CHECK(b.coverage == 1.0);
      CHECK(b.beta == a.beta);
      CHECK(b.cfo == a.cfo);
      CHECK(b.recompute == a.recompute);
    }
  }
  SUBCASE("C1 shared, C2 replaced by 44: beta = 1.2/1.9 times 1/2") {
    const ChunkScore s = covered.score(p3, Ids{kC1, 44});
    CHECK(s.coverage == 0.5);
    CHECK(s.beta == doctest::Approx(6.0 / 19.0));
    CHECK(s.cfo == doctest::Approx(kCci3 * 13.0 / 19.0));
    CHECK(s.num_recompute == 2);  // ceil(1.34) where the paper's score recomputes 1
  }
  CHECK(kvfuse::prefix_coverage(Ids{kC1}, Ids{kC1, 44, 55, 66}) == 0.25);
  CHECK_THROWS_WITH_AS((void)kvfuse::prefix_coverage(Ids{kC1}, Ids{44, 44}),
                       doctest::Contains("appears more than once"), kvfuse::error);
}

TEST_CASE("cci: whole prompts — same prompt twice, 100% hit with reordered chunks, empty prefix") {
  const CCIScorer scorer;
  const auto profiles = scorer.profile(example_stats());

  const auto same = scorer.score(profiles, Ids{kC1, kC2, kC3});
  for (const ChunkScore& s : same) {
    CHECK(s.beta == 1.0);
    CHECK(s.gamma == 0.0);
    CHECK(s.cfo == 0.0);
    CHECK(s.recompute.empty());
  }

  const auto reordered = scorer.score(profiles, Ids{kC2, kC1, kC3});
  // C1 was first (no stored prefix) and is now behind C2: beta = 0 -> CFO = CCI = 0.5 -> N = 1 of 2.
  CHECK(reordered[0].cfo == 0.5);
  CHECK(reordered[0].recompute == TokenSet{0});
  // C2 is now first: its stored prefix C1 is gone -> beta = 0 -> CFO = CCI = 1 -> all of it.
  CHECK(reordered[1].beta == 0.0);
  CHECK(reordered[1].cfo == 1.0);
  CHECK(reordered[1].recompute == TokenSet{0});
  // C3 keeps both prefix chunks in swapped order: gamma = 1 (> 0).
  CHECK(reordered[2].gamma == 1.0);
  CHECK(reordered[2].cfo == doctest::Approx(kCci3));

  // Empty chunks and an empty prompt.
  const auto empty_chunk =
      ChunkAttention::from_token_attention(Ids{1, 2}, PromptLayout::from_lengths({0, 1}, 0),
                                           std::vector<std::vector<double>>{{1.0}});
  const auto ep = scorer.profile(empty_chunk);
  CHECK(ep[0].size == 0);
  CHECK(ep[0].cci == 0.5);
  CHECK(scorer.score(ep[0], Ids{9}).num_recompute == 0);
  CHECK(ep[1].cci == 0.5);  // one token, behind an empty chunk: a = b = 0
  const auto none = ChunkAttention::from_token_attention(Ids{}, PromptLayout::from_lengths({}, 0),
                                                         std::vector<std::vector<double>>{{}});
  CHECK(scorer.profile(none).empty());
}

TEST_CASE("cci: bad input throws kvfuse::error naming the value") {
  using kvfuse::error;
  CHECK_THROWS_WITH_AS(CCIScorer(CCIScorerConfig{-1.0}), doctest::Contains("alpha = -1"), error);
  CHECK_THROWS_WITH_AS(CCIScorer(CCIScorerConfig{std::nan("")}), doctest::Contains("alpha = nan"), error);

  auto neg = kLayers;
  neg[1][3 * 6 + 1] = -0.2;
  CHECK_THROWS_WITH_AS(
      ChunkAttention::from_token_attention(Ids{kC1, kC2, kC3}, PromptLayout::from_lengths({2, 1, 2}, 1), neg),
      doctest::Contains("layer 1 attn[3][1] = -0.2"), error);
  auto acausal = kLayers;
  acausal[0][0 * 6 + 4] = 0.1;
  CHECK_THROWS_WITH_AS(
      ChunkAttention::from_token_attention(Ids{kC1, kC2, kC3}, PromptLayout::from_lengths({2, 1, 2}, 1), acausal),
      doctest::Contains("attn[0][4] = 0.1"), error);
  CHECK_THROWS_WITH_AS(
      ChunkAttention::from_token_attention(Ids{kC1, kC2}, PromptLayout::from_lengths({2, 1, 2}, 1), kLayers),
      doctest::Contains("2 chunk ids for 3 chunks"), error);
  CHECK_THROWS_WITH_AS(
      ChunkAttention::from_token_attention(Ids{kC1, kC2, kC3}, PromptLayout::from_lengths({2, 1, 1}, 1), kLayers),
      doctest::Contains("layer 0 has 36 weights, expected 5 x 5"), error);

  ChunkAttention s = example_stats();
  s.layer_mass[1][2 * 3 + 0] = std::nan("");
  CHECK_THROWS_WITH_AS(CCIScorer{}.profile(s), doctest::Contains("layer 1 mass[2][0] = nan"), error);
  s = example_stats();
  s.layer_mass[0][0 * 3 + 2] = 0.3;
  CHECK_THROWS_WITH_AS(CCIScorer{}.profile(s), doctest::Contains("mass[0][2] = 0.3 must be 0"), error);
  s = example_stats();
  s.chunk_ids[2] = kC1;
  CHECK_THROWS_WITH_AS(CCIScorer{}.profile(s), doctest::Contains("chunk id 0xb appears more than once"), error);
  s = example_stats();
  s.token_prefix_attention[2].pop_back();
  CHECK_THROWS_WITH_AS(CCIScorer{}.profile(s),
                       doctest::Contains("token_prefix_attention[2] has 1 tokens but chunk 2 has 2"), error);
  CHECK_THROWS_WITH_AS(CCIScorer{}.profile(example_stats(), 3), doctest::Contains("chunk index 3"), error);

  CHECK_THROWS_WITH_AS((void)kvfuse::cci_b(-0.5, 2), doctest::Contains("intra(C_i) = -0.5"), error);
  CHECK_THROWS_WITH_AS((void)kvfuse::cci_a(std::vector<double>{0.1}, std::vector<std::int64_t>{}, 2),
                       doctest::Contains("1 inter values for 0 prefix chunks"), error);
  CHECK_THROWS_WITH_AS((void)kvfuse::layer_mean(std::vector<double>{}), doctest::Contains("0 layers"), error);
  CHECK_THROWS_WITH_AS((void)kvfuse::cache_context_impact(std::numeric_limits<double>::infinity(), 1.0),
                       doctest::Contains("a_bar = inf"), error);
  CHECK_THROWS_WITH_AS((void)kvfuse::order_penalty(Ids{1, 2, 1}, Ids{}), doctest::Contains("chunk id 0x1 appears"),
                       error);
  CHECK_THROWS_WITH_AS((void)kvfuse::adjusted_prefix_overlap(1.5, 0.0), doctest::Contains("beta = 1.5"), error);
  CHECK_THROWS_WITH_AS((void)kvfuse::cache_fix_overhead(0.5, 0.5, -2.0), doctest::Contains("alpha = -2"), error);
  CHECK_THROWS_WITH_AS((void)kvfuse::recompute_count(-0.1, 4), doctest::Contains("cfo = -0.1"), error);
  CHECK_THROWS_WITH_AS((void)kvfuse::select_recompute_tokens(std::vector<double>{0.1, 0.2}, 3),
                       doctest::Contains("n = 3 is not in [0, 2]"), error);
  CHECK_THROWS_WITH_AS((void)kvfuse::rank_tokens(std::vector<double>{0.1, std::nan("")}),
                       doctest::Contains("token 1 = nan"), error);

  const CCIScorer scorer;
  ChunkProfile p = scorer.profile(example_stats(), 2);
  CHECK_THROWS_WITH_AS((void)scorer.score(p, Ids{kC3}),
                       doctest::Contains("chunk 0x21 appears in its own current prefix"), error);
  CHECK_THROWS_WITH_AS((void)scorer.score(p, Ids{kC1, kC1}), doctest::Contains("chunk id 0xb appears more than once"),
                       error);
  const auto profiles = scorer.profile(example_stats());
  CHECK_THROWS_WITH_AS((void)scorer.score(profiles, Ids{kC1, kC3}),
                       doctest::Contains("chunk 0x16 is not in the new prompt"), error);
  p.token_ranking = {1, 1};
  CHECK_THROWS_WITH_AS((void)scorer.score(p, Ids{}), doctest::Contains("ranking entry 1 is out of [0, 2) or repeated"),
                       error);
}

}  // namespace unit_cci_scorer
