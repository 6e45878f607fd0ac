// AttnLinkBoundary (Epic section 4.2): expected sets are written out by hand from the layouts below.
#include <doctest/doctest.h>

#include <cstdint>
#include <random>
#include <vector>

#include "kvfuse/select/attnlink_boundary.hpp"

// Each unit test file lives in its own namespace: the files are compiled together (a unity build).
namespace unit_attnlink_boundary {

using kvfuse::AttnLinkBoundary;
using kvfuse::AttnLinkChunkSelection;
using kvfuse::AttnLinkConfig;
using kvfuse::PromptLayout;
using kvfuse::TokenRange;
using kvfuse::TokenSet;

namespace {

AttnLinkConfig cfg(std::int64_t k, std::int64_t tail) {
  AttnLinkConfig c;
  c.k = k;
  c.tail_tokens = tail;
  return c;
}

}  // namespace

TEST_CASE("AttnLinkConfig defaults are the paper's AttnLink-16, all k at the head of the next chunk") {
  const AttnLinkConfig c;
  CHECK(c.k == 16);
  CHECK(c.tail_tokens == 0);
  CHECK(c.head_tokens() == 16);
  CHECK_NOTHROW(AttnLinkBoundary{});
}

TEST_CASE("AttnLinkConfig::split_evenly is section 4.2's k/2 + k/2") {
  CHECK(AttnLinkConfig::split_evenly(4).tail_tokens == 2);
  CHECK(AttnLinkConfig::split_evenly(4).head_tokens() == 2);
  CHECK(AttnLinkConfig::split_evenly(5).tail_tokens == 2);
  CHECK(AttnLinkConfig::split_evenly(5).head_tokens() == 3);
  CHECK(AttnLinkConfig::split_evenly(0).head_tokens() == 0);
}

TEST_CASE("AttnLink k=2: first two tokens of every non-first chunk, plus the query") {
  // chunks [0,5) [5,9) [9,15), query [15,18)
  const auto layout = PromptLayout::from_lengths({5, 4, 6}, 3);
  const auto plan = AttnLinkBoundary{cfg(2, 0)}.plan(layout);
  CHECK(plan.tokens == TokenSet{5, 6, 9, 10, 15, 16, 17});
  CHECK(plan.query == TokenRange{15, 18});
  REQUIRE(plan.chunks.size() == 3);
  CHECK(plan.chunks[0] == AttnLinkChunkSelection{{0, 0}, {5, 5}});  // at position 0: exact, not recomputed
  CHECK(plan.chunks[1] == AttnLinkChunkSelection{{5, 7}, {9, 9}});
  CHECK(plan.chunks[2] == AttnLinkChunkSelection{{9, 11}, {15, 15}});  // no boundary before the query
}

TEST_CASE("AttnLink splits k between the tail of the previous chunk and the head of the next") {
  const auto layout = PromptLayout::from_lengths({5, 4, 6}, 3);  // [0,5) [5,9) [9,15) | [15,18)

  SUBCASE("one from each side") {
    const auto plan = AttnLinkBoundary{cfg(2, 1)}.plan(layout);
    CHECK(plan.tokens == TokenSet{4, 5, 8, 9, 15, 16, 17});
    CHECK(plan.chunks[0] == AttnLinkChunkSelection{{0, 0}, {4, 5}});
    CHECK(plan.chunks[1] == AttnLinkChunkSelection{{5, 6}, {8, 9}});
    CHECK(plan.chunks[2] == AttnLinkChunkSelection{{9, 10}, {15, 15}});
  }
  SUBCASE("all from the previous chunk") {
    const auto plan = AttnLinkBoundary{cfg(2, 2)}.plan(layout);
    CHECK(plan.tokens == TokenSet{3, 4, 7, 8, 15, 16, 17});
  }
  SUBCASE("split_evenly(4)") {
    const auto plan = AttnLinkBoundary{AttnLinkConfig::split_evenly(4)}.plan(layout);
    CHECK(plan.tokens == TokenSet{3, 4, 5, 6, 7, 8, 9, 10, 15, 16, 17});
  }
}

TEST_CASE("AttnLink k larger than a chunk is clipped to the chunk, without duplicates") {
  SUBCASE("head only") {
    // [0,3) [3,5) [5,9) | [9,10)
    const auto plan = AttnLinkBoundary{cfg(10, 0)}.plan(PromptLayout::from_lengths({3, 2, 4}, 1));
    CHECK(plan.tokens == TokenSet{3, 4, 5, 6, 7, 8, 9});
    CHECK(plan.chunks[1] == AttnLinkChunkSelection{{3, 5}, {5, 5}});
    CHECK(plan.chunks[2] == AttnLinkChunkSelection{{5, 9}, {9, 9}});
  }
  SUBCASE("head and tail of a middle chunk meet without overlapping") {
    // [0,4) [4,9) [9,13) | [13,14); head 3, tail 3: chunk 1 gives head [4,7) and tail [7,9)
    const auto plan = AttnLinkBoundary{cfg(6, 3)}.plan(PromptLayout::from_lengths({4, 5, 4}, 1));
    CHECK(plan.tokens == TokenSet{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 13});
    CHECK(plan.chunks[0] == AttnLinkChunkSelection{{0, 0}, {1, 4}});
    CHECK(plan.chunks[1] == AttnLinkChunkSelection{{4, 7}, {7, 9}});
    CHECK(plan.chunks[2] == AttnLinkChunkSelection{{9, 12}, {13, 13}});
  }
  SUBCASE("head and tail both cover a short middle chunk") {
    // [0,3) [3,5) [5,9) | [9,10); head 4, tail 6
    const auto plan = AttnLinkBoundary{cfg(10, 6)}.plan(PromptLayout::from_lengths({3, 2, 4}, 1));
    CHECK(plan.tokens == TokenSet{0, 1, 2, 3, 4, 5, 6, 7, 8, 9});
    CHECK(plan.chunks[0] == AttnLinkChunkSelection{{0, 0}, {0, 3}});
    CHECK(plan.chunks[1] == AttnLinkChunkSelection{{3, 5}, {5, 5}});
    CHECK(plan.chunks[2] == AttnLinkChunkSelection{{5, 9}, {9, 9}});
  }
}

TEST_CASE("AttnLink on one-token chunks") {
  const auto layout = PromptLayout::from_lengths({1, 1, 1}, 1);  // [0,1) [1,2) [2,3) | [3,4)
  CHECK(AttnLinkBoundary{}.plan(layout).tokens == TokenSet{1, 2, 3});
  // All from the tail: chunks 0 and 1 precede a boundary, chunk 2 precedes only the query.
  CHECK(AttnLinkBoundary{cfg(16, 16)}.plan(layout).tokens == TokenSet{0, 1, 3});
}

TEST_CASE("AttnLink skips empty chunks: boundaries are between non-empty neighbours") {
  // [0,0) [0,3) [3,3) [3,5) [5,5) | [5,6)
  const auto layout = PromptLayout::from_lengths({0, 3, 0, 2, 0}, 1);
  const auto plan = AttnLinkBoundary{cfg(2, 1)}.plan(layout);
  CHECK(plan.tokens == TokenSet{2, 3, 5});
  REQUIRE(plan.chunks.size() == 5);
  CHECK(plan.chunks[0] == AttnLinkChunkSelection{{0, 0}, {0, 0}});
  CHECK(plan.chunks[1] == AttnLinkChunkSelection{{0, 0}, {2, 3}});  // first non-empty chunk, at position 0
  CHECK(plan.chunks[2] == AttnLinkChunkSelection{{3, 3}, {3, 3}});
  CHECK(plan.chunks[3] == AttnLinkChunkSelection{{3, 4}, {5, 5}});
  CHECK(plan.chunks[4] == AttnLinkChunkSelection{{5, 5}, {5, 5}});
}

TEST_CASE("AttnLink on an empty prompt and on a query alone") {
  const auto empty = AttnLinkBoundary{}.plan(PromptLayout::from_lengths({}, 0));
  CHECK(empty.tokens.empty());
  CHECK(empty.chunks.empty());
  CHECK(empty.query == TokenRange{0, 0});

  CHECK(AttnLinkBoundary{}.plan(PromptLayout::from_lengths({}, 3)).tokens == TokenSet{0, 1, 2});
  CHECK(AttnLinkBoundary{}.plan(PromptLayout::from_lengths({0, 0}, 2)).tokens == TokenSet{0, 1});
  CHECK(AttnLinkBoundary{}.plan(PromptLayout::from_lengths({4, 4}, 0)).tokens == TokenSet{4, 5, 6, 7});
}

TEST_CASE("AttnLink selects every token of an uncached chunk") {
  auto layout = PromptLayout::from_lengths({4, 3, 5}, 2);  // [0,4) [4,7) [7,12) | [12,14)

  SUBCASE("middle chunk uncached: neighbours still get their boundary tokens") {
    layout.chunks[1].cached = false;
    const auto plan = AttnLinkBoundary{cfg(2, 1)}.plan(layout);
    CHECK(plan.tokens == TokenSet{3, 4, 5, 6, 7, 12, 13});
    CHECK(plan.chunks[0] == AttnLinkChunkSelection{{0, 0}, {3, 4}});
    CHECK(plan.chunks[1] == AttnLinkChunkSelection{{4, 7}, {7, 7}});
    CHECK(plan.chunks[2] == AttnLinkChunkSelection{{7, 8}, {12, 12}});
  }
  SUBCASE("first chunk uncached") {
    layout.chunks[0].cached = false;
    const auto plan = AttnLinkBoundary{cfg(2, 0)}.plan(layout);
    CHECK(plan.tokens == TokenSet{0, 1, 2, 3, 4, 5, 7, 8, 12, 13});
  }
  SUBCASE("k = 0 still recomputes uncached chunks") {
    layout.chunks[2].cached = false;
    CHECK(AttnLinkBoundary{cfg(0, 0)}.plan(layout).tokens == TokenSet{7, 8, 9, 10, 11, 12, 13});
  }
}

TEST_CASE("AttnLink k = 0 is Naive reuse: the query only") {
  const auto plan = AttnLinkBoundary{cfg(0, 0)}.plan(PromptLayout::from_lengths({5, 4, 6}, 3));
  CHECK(plan.tokens == TokenSet{15, 16, 17});
}

TEST_CASE("AttnLink k = 2 with one tail token: the last token before and the first after each boundary") {
  const auto plan = AttnLinkBoundary{cfg(2, 1)}.plan(PromptLayout::from_lengths({5, 4, 6}, 3));
  CHECK(plan.tokens == TokenSet{4, 5, 8, 9, 15, 16, 17});
}

TEST_CASE("AttnLink plan depends only on the layout: same prompt twice, reordered chunks") {
  const AttnLinkBoundary attn{cfg(2, 0)};
  const auto layout = PromptLayout::from_lengths({3, 5}, 1);
  const auto first = attn.plan(layout);
  const auto second = attn.plan(layout);
  CHECK(first.tokens == second.tokens);
  CHECK(first.chunks == second.chunks);
  CHECK(first.tokens == TokenSet{3, 4, 8});
  // The same two chunks in the other order: the boundary moves to position 5.
  CHECK(attn.plan(PromptLayout::from_lengths({5, 3}, 1)).tokens == TokenSet{5, 6, 8});
}

TEST_CASE("AttnLink rejects bad config and bad layouts, naming the value") {
  CHECK_THROWS_WITH_AS(AttnLinkBoundary{cfg(-1, 0)}, doctest::Contains("k = -1"), kvfuse::error);
  CHECK_THROWS_WITH_AS(AttnLinkBoundary{cfg(4, 5)}, doctest::Contains("tail_tokens = 5"), kvfuse::error);
  CHECK_THROWS_WITH_AS(AttnLinkBoundary{cfg(4, -2)}, doctest::Contains("tail_tokens = -2"), kvfuse::error);

  PromptLayout gap = PromptLayout::from_lengths({3, 3}, 1);
  gap.chunks[1].range = {4, 6};
  gap.query = {6, 7};
  CHECK_THROWS_WITH_AS((void)AttnLinkBoundary{}.plan(gap), doctest::Contains("[4, 6)"), kvfuse::error);
}

TEST_CASE("AttnLink property: per-token definition over random layouts") {
  // Independent per-position statement of the rule: a token of a non-empty cached chunk C is selected iff
  // C does not start at 0 and the token is among C's first head_tokens, or a non-empty chunk follows C
  // and the token is among C's last tail_tokens. Every token of an uncached chunk and of the query is.
  std::mt19937_64 rng(20240607);
  for (int iter = 0; iter < 300; ++iter) {
    std::uniform_int_distribution<std::int64_t> nchunks(0, 6), len(0, 9), kdist(0, 12);
    std::vector<std::int64_t> lengths(static_cast<std::size_t>(nchunks(rng)));
    for (auto& l : lengths) l = len(rng);
    auto layout = PromptLayout::from_lengths(lengths, len(rng));
    for (auto& c : layout.chunks) c.cached = (rng() % 4) != 0;
    const std::int64_t k = kdist(rng);
    const std::int64_t tail = std::uniform_int_distribution<std::int64_t>(0, k)(rng);
    const auto plan = AttnLinkBoundary{cfg(k, tail)}.plan(layout);

    TokenSet expected;
    for (std::size_t i = 0; i < layout.chunks.size(); ++i) {
      const auto& c = layout.chunks[i];
      bool next_nonempty = false;
      for (std::size_t j = i + 1; j < layout.chunks.size(); ++j)
        next_nonempty = next_nonempty || !layout.chunks[j].range.empty();
      for (std::int64_t p = c.range.begin; p < c.range.end; ++p) {
        const bool in_head = c.range.begin > 0 && p - c.range.begin < k - tail;
        const bool in_tail = next_nonempty && c.range.end - p <= tail;
        if (!c.cached || in_head || in_tail) expected.push_back(p);
      }
    }
    for (std::int64_t p = layout.query.begin; p < layout.query.end; ++p) expected.push_back(p);
    REQUIRE(plan.tokens == expected);

    // The per-chunk ranges describe the same set and stay inside their chunk.
    TokenSet from_ranges;
    for (std::size_t i = 0; i < plan.chunks.size(); ++i) {
      const auto& s = plan.chunks[i];
      const TokenRange r = layout.chunks[i].range;
      CHECK(r.begin <= s.head.begin);
      CHECK(s.head.begin <= s.head.end);
      CHECK(s.head.end <= s.tail.begin);
      CHECK(s.tail.begin <= s.tail.end);
      CHECK(s.tail.end <= r.end);
      kvfuse::append_range(from_ranges, s.head);
      kvfuse::append_range(from_ranges, s.tail);
    }
    kvfuse::append_range(from_ranges, layout.query);
    CHECK(from_ranges == expected);
  }
}

}  // namespace unit_attnlink_boundary
