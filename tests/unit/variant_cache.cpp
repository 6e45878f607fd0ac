// Cache-Craft VariantCache (section 3.3): lowest-CFO variant lookup, f_r += 1/CFO, lowest-f_r eviction.
#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <numeric>
#include <vector>

#include "kvfuse/cache/variant_cache.hpp"

// Each unit test file lives in its own namespace: the files are compiled together (a unity build).
namespace unit_variant_cache {

using kvfuse::ChunkProfile;
using kvfuse::KVKey;
using kvfuse::TokenSet;
using kvfuse::VariantCache;
using kvfuse::VariantCacheConfig;

namespace {

using Ids = std::vector<std::uint64_t>;

constexpr double kAlpha = 1.0;  // Cache-Craft eq. 12's default α, as the method passes it

// A hand-made profile; the token ranking is size-1, size-2, ..., 0 so the chosen tokens are recognizable.
ChunkProfile make_profile(std::uint64_t chunk, std::int64_t size, Ids prefix, std::vector<double> inter, double cci) {
  ChunkProfile p;
  p.chunk_id = chunk;
  p.size = size;
  p.stored_prefix = std::move(prefix);
  p.prefix_inter = std::move(inter);
  p.cci = cci;
  p.token_ranking.resize(static_cast<std::size_t>(size));
  std::iota(p.token_ranking.rbegin(), p.token_ranking.rend(), std::int64_t{0});
  return p;
}

KVKey key(std::uint64_t content) { return KVKey{7, content}; }

VariantCacheConfig config(std::int64_t n, std::int64_t m) {
  VariantCacheConfig c;
  c.num_chunks = n;
  c.variants_per_chunk = m;
  return c;
}

}  // namespace

TEST_CASE("variant cache: paper defaults N = 100, M = 5") {
  const VariantCache cache;
  CHECK(cache.config().num_chunks == 100);
  CHECK(cache.config().variants_per_chunk == 5);
  CHECK_FALSE(cache.config().cap_variants_per_chunk);
  CHECK(cache.capacity() == 500);
  CHECK(cache.size() == 0);
}

TEST_CASE("variant cache: with prefix coverage the variant that saw the whole current prefix wins") {
  constexpr std::uint64_t kX = 100;
  VariantCache cache;
  // V1 behind [1], V2 behind [1, 2, 3]; both CCI 0.5. Behind [1, 2, 3] eq. 6 gives both beta = 1 (CFO 0), so V1,
  // the older, wins; with coverage V1 holds 1 of the 3 chunks (beta 1/3, CFO 0.5 * 2/3) and V2 wins with CFO 0.
  const auto v1 = cache.insert(make_profile(kX, 6, {1}, {1.0}, 0.5), key(1));
  const auto v2 = cache.insert(make_profile(kX, 6, {1, 2, 3}, {1.0, 1.0, 1.0}, 0.5), key(2));
  const auto paper = cache.best(kX, Ids{1, 2, 3}, {kAlpha});
  REQUIRE(paper);
  CHECK(paper->variant_id == v1.variant_id);
  CHECK(paper->score.cfo == 0.0);
  const auto covered = cache.best(kX, Ids{1, 2, 3}, {kAlpha, true});
  REQUIRE(covered);
  CHECK(covered->variant_id == v2.variant_id);
  CHECK(covered->score.cfo == 0.0);
  // Behind [1, 4, 5, 6] neither saw 4, 5, 6: V1 holds 1 of 4 (beta 1/4, CFO 0.375, 3 of 6 tokens), V2 1 of 4
  // with a third of its attention (beta 1/12, CFO 0.5 * 11/12): V1 wins.
  const auto both_moved = cache.best(kX, Ids{1, 4, 5, 6}, {kAlpha, true});
  REQUIRE(both_moved);
  CHECK(both_moved->variant_id == v1.variant_id);
  CHECK(both_moved->score.coverage == 0.25);
  CHECK(both_moved->score.cfo == doctest::Approx(0.375));
  CHECK(both_moved->score.num_recompute == 3);
}

TEST_CASE("variant cache: lookup picks the lowest-CFO variant") {
  constexpr std::uint64_t kX = 100;
  VariantCache cache;
  // V1 computed behind [1, 2] (inter 1 and 1), CCI 0.8; V2 behind [3] (inter 2), CCI 0.6.
  const auto r1 = cache.insert(make_profile(kX, 10, {1, 2}, {1.0, 1.0}, 0.8), key(1));
  const auto r2 = cache.insert(make_profile(kX, 10, {3}, {2.0}, 0.6), key(2));
  REQUIRE(r1.inserted);
  REQUIRE(r2.inserted);
  CHECK(cache.size() == 2);
  CHECK(cache.num_chunks() == 1);

  SUBCASE("same prefix as V1: V1 CFO 0, V2 CFO 0.6") {
    const auto m = cache.best(kX, Ids{1, 2}, {kAlpha});
    REQUIRE(m);
    CHECK(m->variant_id == r1.variant_id);
    CHECK(m->kv == key(1));
    CHECK(m->score.cfo == 0.0);
    CHECK(m->score.recompute.empty());
  }
  SUBCASE("[3, 1]: V1 beta 0.5 -> CFO 0.4; V2 beta 1 -> CFO 0") {
    const auto m = cache.best(kX, Ids{3, 1}, {kAlpha});
    REQUIRE(m);
    CHECK(m->variant_id == r2.variant_id);
    CHECK(m->score.beta == 1.0);
  }
  SUBCASE("[2, 1]: V1 beta 1 but gamma 1 -> CFO 0.8; V2 CFO 0.6 -> N = 6") {
    const auto m = cache.best(kX, Ids{2, 1}, {kAlpha});
    REQUIRE(m);
    CHECK(m->variant_id == r2.variant_id);
    CHECK(m->score.cfo == doctest::Approx(0.6));
    CHECK(m->score.num_recompute == 6);
    CHECK(m->score.recompute == TokenSet{4, 5, 6, 7, 8, 9});  // first 6 of the ranking 9, 8, ..., 0
  }
  SUBCASE("[1]: V1 beta 0.5 -> CFO 0.4, N = 4; V2 CFO 0.6") {
    const auto m = cache.best(kX, Ids{1}, {kAlpha});
    REQUIRE(m);
    CHECK(m->variant_id == r1.variant_id);
    CHECK(m->score.beta == doctest::Approx(0.5));
    CHECK(m->score.cfo == doctest::Approx(0.4));
    CHECK(m->score.recompute == TokenSet{6, 7, 8, 9});
  }
  SUBCASE("empty prefix (first chunk): V1 CFO 0.8, V2 CFO 0.6") {
    const auto m = cache.best(kX, Ids{}, {kAlpha});
    REQUIRE(m);
    CHECK(m->variant_id == r2.variant_id);
  }
  SUBCASE("a chunk without variants is a miss") {
    CHECK_FALSE(cache.best(555, Ids{}, {kAlpha}).has_value());
    CHECK_FALSE(cache.lookup(555, Ids{}, {kAlpha}).has_value());
  }
}

TEST_CASE("variant cache: alpha is the caller's; it scales CFO and N but never changes the choice") {
  constexpr std::uint64_t kX = 100;
  VariantCache cache;
  const auto r1 = cache.insert(make_profile(kX, 10, {1, 2}, {1.0, 1.0}, 0.8), key(1));
  const auto r2 = cache.insert(make_profile(kX, 10, {3}, {2.0}, 0.6), key(2));
  // Behind [3]: V2 matches exactly (CFO 0 at any alpha); V1 has beta 0 -> CFO = alpha * 0.8.
  for (double alpha : {0.0, 0.5, 1.0, 3.0}) {
    CAPTURE(alpha);
    const auto m = cache.best(kX, Ids{3}, {alpha});
    REQUIRE(m);
    CHECK(m->variant_id == r2.variant_id);
  }
  // Behind [1]: V1 beta 0.5 -> CFO = alpha * 0.4; V2 beta 0 -> alpha * 0.6. Alpha 0 still picks V1.
  for (double alpha : {0.0, 0.5, 2.0}) {
    CAPTURE(alpha);
    const auto m = cache.best(kX, Ids{1}, {alpha});
    REQUIRE(m);
    CHECK(m->variant_id == r1.variant_id);
    CHECK(m->score.cfo == doctest::Approx(alpha * 0.4));
    CHECK(m->score.num_recompute == std::min<std::int64_t>(10, static_cast<std::int64_t>(std::ceil(alpha * 4.0 - 1e-9))));
  }
  CHECK_THROWS_WITH_AS((void)cache.best(kX, Ids{1}, {-0.5}), doctest::Contains("alpha = -0.5"), kvfuse::error);
  // record_use: what lookup() adds, for a match a request used after planning with best().
  const auto m = cache.best(kX, Ids{1}, {1.0});
  CHECK(cache.record_use(m->variant_id, m->score.cfo) == doctest::Approx(2.5));
  CHECK_THROWS_WITH_AS((void)cache.record_use(999, 0.5), doctest::Contains("no variant 999"), kvfuse::error);
}

TEST_CASE("variant cache: CFO ties go to the oldest variant") {
  VariantCache cache;
  const auto first = cache.insert(make_profile(5, 4, {1}, {1.0}, 0.5), key(1));
  cache.insert(make_profile(5, 4, {2}, {1.0}, 0.5), key(2));
  const auto m = cache.best(5, Ids{9}, {kAlpha});  // both: beta 0 -> CFO 0.5
  REQUIRE(m);
  CHECK(m->variant_id == first.variant_id);
}

TEST_CASE("variant cache: f_r += 1/CFO on lookup, capped for CFO = 0; best() does not count") {
  VariantCacheConfig c;
  c.max_reuse_bonus = 100.0;
  VariantCache cache(c);
  const auto r1 = cache.insert(make_profile(100, 10, {1, 2}, {1.0, 1.0}, 0.8), key(1));
  cache.insert(make_profile(100, 10, {3}, {2.0}, 0.6), key(2));

  auto m = cache.lookup(100, Ids{1}, {kAlpha});  // V1, CFO 0.4 -> +2.5
  REQUIRE(m);
  CHECK(m->variant_id == r1.variant_id);
  CHECK(m->reuse_frequency == doctest::Approx(2.5));
  m = cache.lookup(100, Ids{1}, {kAlpha});
  CHECK(m->reuse_frequency == doctest::Approx(5.0));
  (void)cache.best(100, Ids{1, 2}, {kAlpha});
  CHECK(cache.entries()[0].reuse_frequency == doctest::Approx(5.0));
  m = cache.lookup(100, Ids{1, 2}, {kAlpha});  // exact match: CFO 0 -> capped bonus 100
  CHECK(m->score.cfo == 0.0);
  CHECK(m->reuse_frequency == doctest::Approx(105.0));

  const auto entries = cache.entries();
  REQUIRE(entries.size() == 2);
  CHECK(entries[0].id == r1.variant_id);
  CHECK(entries[0].reuse_frequency == doctest::Approx(105.0));
  CHECK(entries[1].reuse_frequency == 0.0);
  CHECK(entries[1].kv == key(2));
  CHECK(cache.variants(100).size() == 2);
  CHECK(cache.variants(4242).empty());

  CHECK(kvfuse::reuse_frequency_increment(0.4, 100.0) == doctest::Approx(2.5));
  CHECK(kvfuse::reuse_frequency_increment(0.0, 100.0) == 100.0);
  CHECK(kvfuse::reuse_frequency_increment(0.001, 100.0) == 100.0);  // 1/CFO = 1000, capped
  CHECK(kvfuse::reuse_frequency_increment(2.0, 100.0) == doctest::Approx(0.5));
}

TEST_CASE("variant cache: a full cache evicts the lowest f_r, ties to the oldest") {
  VariantCache cache(config(2, 1));  // N x M = 2
  const auto a = cache.insert(make_profile(1, 4, {}, {}, 0.5), key(1));
  cache.insert(make_profile(2, 4, {}, {}, 0.5), key(2));
  CHECK(cache.size() == 2);

  SUBCASE("all f_r equal: the oldest goes") {
    const auto r = cache.insert(make_profile(3, 4, {}, {}, 0.5), key(3));
    CHECK(r.inserted);
    REQUIRE(r.evicted.size() == 1);
    CHECK(r.evicted[0].id == a.variant_id);
    CHECK(r.evicted[0].kv == key(1));
    CHECK_FALSE(cache.contains(1));
    CHECK(cache.size() == 2);
  }
  SUBCASE("the used variant survives, the unused one goes; a new variant is the next victim until used") {
    REQUIRE(cache.lookup(1, Ids{9}, {kAlpha}));  // chunk 1: beta 0 -> CFO 0.5 -> f_r 2
    const auto r = cache.insert(make_profile(3, 4, {}, {}, 0.5), key(3));
    REQUIRE(r.evicted.size() == 1);
    CHECK(r.evicted[0].profile.chunk_id == 2);
    CHECK(r.evicted[0].kv == key(2));
    CHECK(cache.contains(1));
    CHECK(cache.contains(3));
    // Next insertion: chunk 3 (f_r 0) goes before chunk 1 (f_r 2).
    const auto r2 = cache.insert(make_profile(4, 4, {}, {}, 0.5), key(4));
    REQUIRE(r2.evicted.size() == 1);
    CHECK(r2.evicted[0].profile.chunk_id == 3);
    CHECK(cache.entries()[0].reuse_frequency == doctest::Approx(2.0));
  }
}

TEST_CASE("variant cache: the limit is N x M in total, optionally M per chunk") {
  SUBCASE("paper: one popular chunk may hold all N x M variants") {
    VariantCache cache(config(2, 1));
    cache.insert(make_profile(1, 4, {8}, {1.0}, 0.5), key(1));
    const auto r = cache.insert(make_profile(1, 4, {9}, {1.0}, 0.5), key(2));
    CHECK(r.inserted);
    CHECK(r.evicted.empty());
    CHECK(cache.variants(1).size() == 2);
    CHECK(cache.num_chunks() == 1);
  }
  SUBCASE("cap_variants_per_chunk: a chunk's new variant replaces its own lowest f_r one") {
    VariantCacheConfig c = config(3, 1);
    c.cap_variants_per_chunk = true;
    VariantCache cache(c);
    cache.insert(make_profile(1, 4, {8}, {1.0}, 0.5), key(1));
    cache.insert(make_profile(2, 4, {}, {}, 0.5), key(2));
    const auto r = cache.insert(make_profile(1, 4, {9}, {1.0}, 0.5), key(3));  // cache not full (2 of 3)
    CHECK(r.inserted);
    REQUIRE(r.evicted.size() == 1);
    CHECK(r.evicted[0].kv == key(1));
    CHECK(cache.variants(1).size() == 1);
    CHECK(cache.contains(2));
  }
}

TEST_CASE("variant cache: same chunk and prefix is stored once") {
  VariantCache cache(config(1, 1));
  const auto r1 = cache.insert(make_profile(1, 4, {8}, {1.0}, 0.5), key(1));
  const auto r2 = cache.insert(make_profile(1, 4, {8}, {2.0}, 0.7), key(2));
  CHECK_FALSE(r2.inserted);
  CHECK(r2.variant_id == r1.variant_id);
  CHECK(r2.evicted.empty());
  CHECK(cache.size() == 1);
  CHECK(cache.entries()[0].kv == key(1));
}

TEST_CASE("variant cache with CCIScorer: same prompt twice, and a 100% hit with reordered chunks") {
  // Prompt [A, B, C] of 2, 1 and 2 tokens; one layer of attention (rows = queries).
  //   inter(A,B) = 0.2 + 0.2 = 0.4; inter(A,C) = 0.1+0.3+0.1+0.1 = 0.6; inter(B,C) = 0.2 + 0.2 = 0.4
  //   intra(A) = 0.5, intra(B) = 0, intra(C) = 0.4
  //   CCI(A) = 0.5 (no prefix); CCI(B) = 1 (b = 0); CCI(C) = sigmoid((0.6/4 + 0.4/2) / (0.4/4)) = sigmoid(3.5)
  const std::vector<std::vector<double>> layers = {{
      1.0, 0.0, 0.0, 0.0, 0.0,  //
      0.5, 0.5, 0.0, 0.0, 0.0,  //
      0.2, 0.2, 0.6, 0.0, 0.0,  //
      0.1, 0.3, 0.2, 0.4, 0.0,  //
      0.1, 0.1, 0.2, 0.4, 0.2,  //
  }};
  constexpr std::uint64_t kA = 1, kB = 2, kC = 3;
  const auto stats = kvfuse::ChunkAttention::from_token_attention(
      Ids{kA, kB, kC}, kvfuse::PromptLayout::from_lengths({2, 1, 2}, 0), layers);
  VariantCache cache;
  for (const ChunkProfile& p : kvfuse::CCIScorer{}.profile(stats)) REQUIRE(cache.insert(p, key(p.chunk_id)).inserted);
  const double cci_c = 1.0 / (1.0 + std::exp(-3.5));

  SUBCASE("same prompt twice: beta = 1, gamma = 0, CFO = 0, no tokens, f_r gets the capped bonus") {
    const Ids prompt{kA, kB, kC};
    for (std::size_t i = 0; i < prompt.size(); ++i) {
      const auto m = cache.lookup(prompt[i], Ids(prompt.begin(), prompt.begin() + static_cast<std::ptrdiff_t>(i)), {kAlpha});
      REQUIRE(m);
      CHECK(m->kv == key(prompt[i]));
      CHECK(m->score.beta == 1.0);
      CHECK(m->score.gamma == 0.0);
      CHECK(m->score.cfo == 0.0);
      CHECK(m->score.num_recompute == 0);
      CHECK(m->score.recompute.empty());
      CHECK(m->reuse_frequency == 1000.0);
    }
  }
  SUBCASE("100% hit, reordered [B, A, C]") {
    const auto b = cache.lookup(kB, Ids{}, {kAlpha});  // B first now: stored prefix [A] gone -> CFO = CCI(B) = 1
    REQUIRE(b);
    CHECK(b->score.cfo == 1.0);
    CHECK(b->score.recompute == TokenSet{0});
    const auto a = cache.lookup(kA, Ids{kB}, {kAlpha});  // A was first, now behind B: beta 0 -> CFO = 0.5 -> 1 of 2
    REQUIRE(a);
    CHECK(a->score.cfo == 0.5);
    CHECK(a->score.recompute == TokenSet{0});
    CHECK(a->reuse_frequency == doctest::Approx(2.0));
    const auto c = cache.lookup(kC, Ids{kB, kA}, {kAlpha});  // beta 1, gamma 1 -> CFO = CCI(C) -> ceil(1.94) = 2
    REQUIRE(c);
    CHECK(c->score.gamma == 1.0);
    CHECK(c->score.cfo == doctest::Approx(cci_c));
    CHECK(c->score.recompute == TokenSet{0, 1});
  }
}

TEST_CASE("variant cache: bad config and bad input throw kvfuse::error naming the value") {
  using kvfuse::error;
  VariantCacheConfig c;
  c.num_chunks = 0;
  CHECK_THROWS_WITH_AS(VariantCache{c}, doctest::Contains("num_chunks (N) = 0"), error);
  c = {};
  c.variants_per_chunk = -1;
  CHECK_THROWS_WITH_AS(VariantCache{c}, doctest::Contains("variants_per_chunk (M) = -1"), error);
  c = {};
  c.max_reuse_bonus = 0.0;
  CHECK_THROWS_WITH_AS(VariantCache{c}, doctest::Contains("max_reuse_bonus = 0"), error);
  c = {};
  c.num_chunks = std::int64_t{1} << 62;
  CHECK_THROWS_WITH_AS(VariantCache{c}, doctest::Contains("overflows"), error);
  CHECK_THROWS_WITH_AS((void)kvfuse::reuse_frequency_increment(std::nan(""), 10.0), doctest::Contains("cfo = nan"),
                       error);
  CHECK_THROWS_WITH_AS((void)kvfuse::reuse_frequency_increment(0.5, -1.0), doctest::Contains("max_bonus = -1"), error);
  c = {};
  c.max_reuse_bonus = std::numeric_limits<double>::infinity();
  CHECK_THROWS_WITH_AS(VariantCache{c}, doctest::Contains("max_reuse_bonus = inf"), error);

  VariantCache cache;
  cache.insert(make_profile(1, 4, {}, {}, 0.5), key(1));
  CHECK_THROWS_WITH_AS(cache.insert(make_profile(2, 4, {}, {}, 0.5), key(1)),
                       doctest::Contains("KVKey {model 0x7, content 0x1} is already stored"), error);
  CHECK_THROWS_WITH_AS(cache.insert(make_profile(2, 4, {}, {}, 1.5), key(2)), doctest::Contains("cci = 1.5"), error);
  CHECK_THROWS_WITH_AS(cache.insert(make_profile(1, 5, {3}, {1.0}, 0.5), key(2)),
                       doctest::Contains("chunk 0x1 has 5 tokens but its stored variants have 4"), error);
  CHECK_THROWS_WITH_AS(cache.insert(make_profile(2, 4, {2}, {1.0}, 0.5), key(2)),
                       doctest::Contains("appears in its own stored prefix"), error);
  CHECK_THROWS_WITH_AS((void)cache.lookup(1, Ids{1}, {kAlpha}), doctest::Contains("chunk 0x1 appears in its own current prefix"),
                       error);
  CHECK_THROWS_WITH_AS((void)cache.best(1, Ids{4, 4}, {kAlpha}), doctest::Contains("chunk id 0x4 appears more than once"), error);
  CHECK(cache.size() == 1);
}

TEST_CASE("variant cache: erase removes one variant, its KV key and, with the last variant, the chunk") {
  constexpr std::uint64_t kX = 100;
  VariantCache cache;
  const auto a = cache.insert(make_profile(kX, 10, {1, 2}, {1.0, 1.0}, 0.8), key(1));
  const auto b = cache.insert(make_profile(kX, 10, {3}, {2.0}, 0.6), key(2));
  CHECK(cache.size() == 2);
  CHECK(cache.erase(b.variant_id));
  CHECK_FALSE(cache.erase(b.variant_id));
  CHECK(cache.size() == 1);
  CHECK(cache.best(kX, Ids{3}, {kAlpha})->variant_id == a.variant_id);  // the only one left
  CHECK(cache.insert(make_profile(kX, 10, {4}, {2.0}, 0.6), key(2)).inserted);  // its KV key is free again
  CHECK(cache.erase(a.variant_id));
  CHECK(cache.contains(kX));
  CHECK(cache.num_chunks() == 1);
  for (const kvfuse::VariantEntry& v : cache.entries()) CHECK(cache.erase(v.id));
  CHECK_FALSE(cache.contains(kX));
  CHECK(cache.size() == 0);
}

}  // namespace unit_variant_cache
