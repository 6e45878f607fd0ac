// KVSplit (Epic section 5): expected chunkings are written out by hand; the random property test checks
// the definition (coverage, bounds, cuts at boundaries) without re-running the algorithm.
#include <doctest/doctest.h>

#include <algorithm>
#include <cstdint>
#include <random>
#include <set>
#include <vector>

#include "kvfuse/split/kv_split.hpp"

// Each unit test file lives in its own namespace: the files are compiled together (a unity build).
namespace unit_kv_split {

using kvfuse::BoundaryCut;
using kvfuse::KVSplit;
using kvfuse::KVSplitConfig;
using kvfuse::TokenRange;
using Chunks = std::vector<TokenRange>;

namespace {

KVSplitConfig fixed_cfg(std::int64_t chunk_size) {
  KVSplitConfig c;
  c.chunk_size = chunk_size;
  return c;
}

KVSplitConfig bounded(std::int64_t min_tokens, std::int64_t max_tokens, BoundaryCut cut = BoundaryCut::first) {
  KVSplitConfig c;
  c.min_tokens = min_tokens;
  c.max_tokens = max_tokens;
  c.cut = cut;
  return c;
}

// "A chunk may end after token i" for i in `after`.
auto ends_after(std::set<std::int64_t> after) {
  return [after = std::move(after)](std::int64_t i) { return after.count(i) > 0; };
}

}  // namespace

TEST_CASE("KVSplitConfig defaults: 512-token fixed chunks, unbounded semantic units") {
  const KVSplitConfig c;
  CHECK(c.chunk_size == 512);
  CHECK(c.min_tokens == 1);
  CHECK(c.max_tokens == kvfuse::kNoTokenLimit);
  CHECK(c.cut == BoundaryCut::first);
  CHECK(KVSplit{}.fixed(1000) == Chunks{{0, 512}, {512, 1000}});
}

TEST_CASE("KVSplit::fixed: chunks of chunk_size, remainder last") {
  CHECK(KVSplit{fixed_cfg(4)}.fixed(10) == Chunks{{0, 4}, {4, 8}, {8, 10}});
  CHECK(KVSplit{fixed_cfg(4)}.fixed(8) == Chunks{{0, 4}, {4, 8}});
  CHECK(KVSplit{fixed_cfg(4)}.fixed(3) == Chunks{{0, 3}});
  CHECK(KVSplit{fixed_cfg(1)}.fixed(3) == Chunks{{0, 1}, {1, 2}, {2, 3}});
  CHECK(KVSplit{fixed_cfg(4)}.fixed(0).empty());
  CHECK_THROWS_WITH_AS((void)KVSplit{}.fixed(-1), doctest::Contains("-1"), kvfuse::error);
}

TEST_CASE("KVSplit::at_boundaries, default: every boundary ends a chunk (one chunk per unit)") {
  CHECK(KVSplit{}.at_boundaries(12, ends_after({2, 6, 9})) == Chunks{{0, 3}, {3, 7}, {7, 10}, {10, 12}});
  // A boundary after the last token changes nothing: the end of the text always ends a chunk.
  CHECK(KVSplit{}.at_boundaries(5, ends_after({4})) == Chunks{{0, 5}});
  CHECK(KVSplit{}.at_boundaries(5, ends_after({})) == Chunks{{0, 5}});
  CHECK(KVSplit{}.at_boundaries(3, ends_after({0, 1})) == Chunks{{0, 1}, {1, 2}, {2, 3}});
}

TEST_CASE("KVSplit::at_boundaries, first boundary: min and max") {
  SUBCASE("boundary exactly at max") {
    CHECK(KVSplit{bounded(1, 4)}.at_boundaries(10, ends_after({3, 7})) == Chunks{{0, 4}, {4, 8}, {8, 10}});
  }
  SUBCASE("no boundary: forced cut at max") {
    CHECK(KVSplit{bounded(1, 4)}.at_boundaries(10, ends_after({})) == Chunks{{0, 4}, {4, 8}, {8, 10}});
  }
  SUBCASE("boundary one past max: forced cut at max first") {
    CHECK(KVSplit{bounded(1, 4)}.at_boundaries(10, ends_after({4})) == Chunks{{0, 4}, {4, 5}, {5, 9}, {9, 10}});
  }
  SUBCASE("boundaries before min are ignored") {
    // From 0: lengths 3..6 allowed; after 0 and 1 are too early, after 4 gives [0,5).
    // From 5: after 5 is too early (length 1); the rest has 4 tokens.
    CHECK(KVSplit{bounded(3, 6)}.at_boundaries(9, ends_after({0, 1, 4, 5})) == Chunks{{0, 5}, {5, 9}});
  }
  SUBCASE("the last chunk may be shorter than min") {
    CHECK(KVSplit{bounded(3, 6)}.at_boundaries(5, ends_after({2})) == Chunks{{0, 3}, {3, 5}});
  }
  SUBCASE("min = max is a fixed split") {
    CHECK(KVSplit{bounded(3, 3)}.at_boundaries(7, ends_after({0, 4})) == Chunks{{0, 3}, {3, 6}, {6, 7}});
  }
  SUBCASE("mixed") {
    CHECK(KVSplit{bounded(2, 6)}.at_boundaries(12, ends_after({2, 4, 6, 9})) ==
          Chunks{{0, 3}, {3, 5}, {5, 7}, {7, 10}, {10, 12}});
  }
}

TEST_CASE("KVSplit::at_boundaries, last boundary (packing extension)") {
  SUBCASE("packs units up to max") {
    // From 0: lengths 6..2 tried longest first, after 4 gives [0,5); from 5: after 9 gives [5,10);
    // the rest (2 tokens) fits.
    CHECK(KVSplit{bounded(2, 6, BoundaryCut::last)}.at_boundaries(12, ends_after({2, 4, 6, 9})) ==
          Chunks{{0, 5}, {5, 10}, {10, 12}});
  }
  SUBCASE("boundary exactly at max, then none: forced cut") {
    CHECK(KVSplit{bounded(1, 4, BoundaryCut::last)}.at_boundaries(10, ends_after({3})) ==
          Chunks{{0, 4}, {4, 8}, {8, 10}});
  }
  SUBCASE("boundaries before min are ignored") {
    CHECK(KVSplit{bounded(3, 5, BoundaryCut::last)}.at_boundaries(8, ends_after({0, 1})) ==
          Chunks{{0, 5}, {5, 8}});
  }
  SUBCASE("unbounded max: the whole text is one chunk") {
    CHECK(KVSplit{bounded(1, kvfuse::kNoTokenLimit, BoundaryCut::last)}.at_boundaries(9, ends_after({2, 5})) ==
          Chunks{{0, 9}});
  }
}

TEST_CASE("KVSplit::at_boundaries over token ids") {
  // Token 1 plays the sentence end: boundaries after positions 1, 3 and 6.
  const std::vector<kvfuse::token_id> tokens{5, 1, 7, 1, 3, 3, 1, 9};
  const auto split = KVSplit{}.at_boundaries(tokens, [](std::int64_t, kvfuse::token_id t) { return t == 1; });
  CHECK(split == Chunks{{0, 2}, {2, 4}, {4, 7}, {7, 8}});
  // The position is passed along with the id.
  const auto by_pos = KVSplit{}.at_boundaries(tokens, [](std::int64_t i, kvfuse::token_id) { return i == 4; });
  CHECK(by_pos == Chunks{{0, 5}, {5, 8}});
  CHECK(KVSplit{}.at_boundaries(std::vector<kvfuse::token_id>{}, [](std::int64_t, kvfuse::token_id) { return true; })
            .empty());
}

TEST_CASE("KVSplit::at_boundaries on an empty text makes no chunks and asks nothing") {
  int calls = 0;
  const auto split = KVSplit{}.at_boundaries(0, [&](std::int64_t) {
    ++calls;
    return true;
  });
  CHECK(split.empty());
  CHECK(calls == 0);
  CHECK_THROWS_WITH_AS((void)KVSplit{}.at_boundaries(-3, ends_after({})), doctest::Contains("-3"), kvfuse::error);
}

TEST_CASE("KVSplitConfig rejects bad values, naming them") {
  CHECK_THROWS_WITH_AS(KVSplit{fixed_cfg(0)}, doctest::Contains("chunk_size = 0"), kvfuse::error);
  CHECK_THROWS_WITH_AS(KVSplit{fixed_cfg(-5)}, doctest::Contains("chunk_size = -5"), kvfuse::error);
  CHECK_THROWS_WITH_AS(KVSplit{bounded(0, 4)}, doctest::Contains("min_tokens = 0"), kvfuse::error);
  CHECK_THROWS_WITH_AS(KVSplit{bounded(5, 4)}, doctest::Contains("max_tokens = 4 must be >= min_tokens = 5"),
                       kvfuse::error);
  CHECK_THROWS_WITH_AS(KVSplit{bounded(1, 4, static_cast<BoundaryCut>(7))}, doctest::Contains("cut = 7"),
                       kvfuse::error);
}

TEST_CASE("layout_from_chunks: cached chunks followed by the query") {
  const Chunks chunks{{0, 3}, {3, 5}};
  const auto layout = kvfuse::layout_from_chunks(chunks, 4);
  REQUIRE(layout.chunks.size() == 2);
  CHECK(layout.chunks[0].range == TokenRange{0, 3});
  CHECK(layout.chunks[1].range == TokenRange{3, 5});
  CHECK(layout.chunks[0].cached);
  CHECK(layout.chunks[1].cached);
  CHECK(layout.query == TokenRange{5, 9});
  CHECK(layout.num_tokens() == 9);

  const auto only_query = kvfuse::layout_from_chunks(Chunks{}, 2);
  CHECK(only_query.chunks.empty());
  CHECK(only_query.query == TokenRange{0, 2});
  CHECK(kvfuse::layout_from_chunks(KVSplit{fixed_cfg(4)}.fixed(10), 0).query == TokenRange{10, 10});

  CHECK_THROWS_WITH_AS((void)kvfuse::layout_from_chunks(chunks, -2), doctest::Contains("-2"), kvfuse::error);
  const Chunks gap{{0, 3}, {4, 6}};
  CHECK_THROWS_WITH_AS((void)kvfuse::layout_from_chunks(gap, 1), doctest::Contains("[4, 6)"), kvfuse::error);
  const Chunks late{{2, 3}};
  CHECK_THROWS_WITH_AS((void)kvfuse::layout_from_chunks(late, 1), doctest::Contains("[2, 3)"), kvfuse::error);
}

TEST_CASE("KVSplit property: random texts, boundaries and bounds") {
  std::mt19937_64 rng(7031);
  for (int iter = 0; iter < 500; ++iter) {
    const std::int64_t n = std::uniform_int_distribution<std::int64_t>(0, 150)(rng);
    const std::int64_t min_tokens = std::uniform_int_distribution<std::int64_t>(1, 12)(rng);
    const std::int64_t max_tokens =
        (rng() % 5 == 0) ? kvfuse::kNoTokenLimit
                         : min_tokens + std::uniform_int_distribution<std::int64_t>(0, 20)(rng);
    const BoundaryCut cut = (rng() % 2 == 0) ? BoundaryCut::first : BoundaryCut::last;
    const double density = std::uniform_real_distribution<double>(0.0, 0.5)(rng);
    std::vector<bool> boundary(static_cast<std::size_t>(n));
    for (auto&& b : boundary) b = std::bernoulli_distribution(density)(rng);
    const auto is_boundary = [&](std::int64_t i) { return boundary[static_cast<std::size_t>(i)]; };

    bool called_outside = false;
    const auto split = KVSplit{bounded(min_tokens, max_tokens, cut)}.at_boundaries(n, [&](std::int64_t i) {
      called_outside = called_outside || i < 0 || i >= n - 1;
      return i >= 0 && i < n && is_boundary(i);
    });
    CHECK_FALSE(called_outside);

    // Covers [0, n) exactly, contiguous, no empty chunk.
    std::int64_t next = 0;
    for (const TokenRange& r : split) {
      REQUIRE(r.begin == next);
      REQUIRE(r.end > r.begin);
      next = r.end;
    }
    REQUIRE(next == n);

    for (std::size_t c = 0; c < split.size(); ++c) {
      const TokenRange r = split[c];
      const bool last_chunk = c + 1 == split.size();
      CHECK(r.size() <= max_tokens);
      if (!last_chunk) CHECK(r.size() >= min_tokens);
      // A cut before the end of the text is at a boundary, or forced at max with no boundary in reach.
      if (!last_chunk && !is_boundary(r.end - 1)) {
        CHECK(r.size() == max_tokens);
        for (std::int64_t i = r.begin + min_tokens - 1; i < r.end; ++i) CHECK_FALSE(is_boundary(i));
      }
      if (cut == BoundaryCut::first) {
        // No allowed boundary before the cut.
        for (std::int64_t i = r.begin + min_tokens - 1; i < r.end - 1; ++i) CHECK_FALSE(is_boundary(i));
      } else {
        // A chunk that is not the last one had more than max_tokens left, and no allowed boundary lies
        // after its cut within max_tokens.
        if (!last_chunk) {
          REQUIRE(n - r.begin > max_tokens);
          for (std::int64_t i = r.end; i <= r.begin + max_tokens - 1; ++i) CHECK_FALSE(is_boundary(i));
        }
      }
    }

    // Fixed split with the same sizes.
    const auto fixed = KVSplit{fixed_cfg(min_tokens)}.fixed(n);
    CHECK(static_cast<std::int64_t>(fixed.size()) == (n + min_tokens - 1) / min_tokens);
    for (std::size_t c = 0; c < fixed.size(); ++c) {
      CHECK(fixed[c].begin == static_cast<std::int64_t>(c) * min_tokens);
      CHECK(fixed[c].end == std::min(n, fixed[c].begin + min_tokens));
    }
  }
}

TEST_CASE("split_long_chunks: only chunks longer than chunk_size are cut, in place, flags, query and context kept") {
  kvfuse::PromptLayout layout = kvfuse::PromptLayout::from_lengths({6, 25, 10, 0}, 4);
  layout.chunks[2].cached = false;
  const kvfuse::PromptLayout split = kvfuse::split_long_chunks(layout, kvfuse::KVSplit({/*chunk_size=*/10}));
  std::vector<kvfuse::TokenRange> ranges;
  for (const kvfuse::PromptChunk& c : split.chunks) ranges.push_back(c.range);
  CHECK(ranges == std::vector<kvfuse::TokenRange>{{0, 6}, {6, 16}, {16, 26}, {26, 31}, {31, 41}, {41, 41}});
  CHECK(split.chunks[4].cached == false);
  CHECK(split.chunks[1].cached);
  CHECK(split.query == layout.query);
  // Nothing longer than chunk_size: the same layout.
  const kvfuse::PromptLayout same = kvfuse::split_long_chunks(layout, kvfuse::KVSplit({/*chunk_size=*/25}));
  CHECK(same.chunks.size() == layout.chunks.size());
  // A chunk context (the first chunk, computed) stays: the passages' caches are still computed behind it.
  layout.chunks[0].cached = false;
  layout.chunk_context = 6;
  const kvfuse::PromptLayout behind = kvfuse::split_long_chunks(layout, kvfuse::KVSplit({/*chunk_size=*/10}));
  CHECK_NOTHROW(behind.validate());
  CHECK(behind.chunk_context == 6);
}

}  // namespace unit_kv_split
