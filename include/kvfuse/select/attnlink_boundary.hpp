#pragma once
// AttnLinkBoundary — Epic's AttnLink (Epic, section 4.2): recompute only k tokens at every chunk
// boundary, plus the query, and reuse the stored KV of everything else. The selected set is decided
// before prefill from the prompt's layout alone ("static attention sparsity") and is the same at every
// layer.
//
// Why: each chunk's KV is generated in isolation, so its first tokens act as an attention sink that
// absorbs the attention of later tokens (section 4.2.2). Recomputing them in the context of the
// preceding chunks "cripples" the sink. Cost is O(k · N) per layer instead of O(N^2) (section 4.2).
//
// When to use:
//   - Many independently cached chunks (RAG passages, few-shot examples, documents) and TTFT matters
//     more than numerical closeness to full prefill: AttnLink recomputes a nearly constant number of
//     tokens per chunk, so its cost grows with the chunk count, not with the prompt length.
//   - Prefer HKVDSelector (CacheBlend) when output must stay numerically close to full prefill: it
//     picks tokens per layer by KV deviation instead of by position. On short chunks (a few hundred
//     tokens) both recompute about as many tokens (section 6.3, MultiNews), so AttnLink saves little.
//   - Recomputed tokens grow with the chunk count, so fewer, semantically whole chunks (KVSplit) make
//     AttnLink cheaper and more accurate on long documents (section 6.6).
//
// Defaults from the paper:
//   - k = 16: AttnLink-16 / Epic-16 is the configuration of the serving experiments (sections 6.4,
//     6.5); section 6.3 reports k = 20 as sufficient for accuracy, and k < 20 in general (section 1).
//     Larger k does not necessarily help (section 6.3).
//   - tail_tokens = 0: all k tokens are the first k of the following chunk. Section 4.2.1 counts
//     "k tokens from each chunk" and section 4.2.2 motivates recomputing "the first few tokens of each
//     chunk"; section 4.2's opening sentence instead splits k as k/2 from the preceding chunk and k/2
//     from the following one. AttnLinkConfig::split_evenly(k) gives that reading.
//
// Decisions where the paper is silent:
//   - The chunk that starts at position 0 has no boundary before it: its stored KV was generated at
//     position 0 with no prefix, which is exactly what full prefill computes, and its first tokens are
//     the prompt's genuine attention sink. So its head is not recomputed. Leading empty chunks do not
//     count: the first non-empty chunk is the one at position 0.
//   - Boundaries are between consecutive non-empty chunks; empty chunks are skipped. The query is
//     always recomputed in full, so there is no boundary between the last chunk and the query.
//   - A chunk with cached == false has no stored KV: all its tokens are selected. Boundaries next to it
//     still select the tail of the chunk before it and the head of the chunk after it.
//   - k (or its head / tail share) larger than a chunk is clipped to that chunk; selections never
//     reach into a neighbouring chunk, and a chunk's head and tail never overlap.

#include <algorithm>
#include <cstdint>
#include <vector>

#include "kvfuse/core/error.hpp"
#include "kvfuse/core/prompt.hpp"
#include "kvfuse/core/types.hpp"

namespace kvfuse {

struct AttnLinkConfig {
  // Tokens recomputed at each chunk boundary (AttnLink-k). 0 gives Naive reuse: only the query.
  std::int64_t k = 16;
  // How many of the k come from the end of the preceding chunk; the other k - tail_tokens are the
  // first tokens of the following chunk.
  std::int64_t tail_tokens = 0;

  [[nodiscard]] constexpr std::int64_t head_tokens() const noexcept { return k - tail_tokens; }

  // Section 4.2: "k/2 tokens selected from the preceding chunk and k/2 from the following chunk";
  // an odd k gives the extra token to the following chunk's head.
  [[nodiscard]] static constexpr AttnLinkConfig split_evenly(std::int64_t k) noexcept { return {k, k / 2}; }

  void validate() const {
    detail::require(k >= 0, "AttnLinkConfig: k = {} must be >= 0", k);
    detail::require(tail_tokens >= 0 && tail_tokens <= k, "AttnLinkConfig: tail_tokens = {} must be in [0, k = {}]",
                    tail_tokens, k);
  }
};

// What AttnLink recomputes inside one chunk of the layout: two disjoint ranges of that chunk.
struct AttnLinkChunkSelection {
  TokenRange head;  // first tokens of the chunk (the whole chunk when uncached); empty = [begin, begin)
  TokenRange tail;  // last tokens of the chunk, after `head`; empty = [end, end)

  friend constexpr bool operator==(const AttnLinkChunkSelection&, const AttnLinkChunkSelection&) = default;
};

// AttnLink's set is static: every layer recomputes the same `tokens` (section 4.2.1, eq. 1-3 at layer i).
struct AttnLinkPlan {
  TokenSet tokens;                             // sorted positions to recompute: chunk selections and query
  std::vector<AttnLinkChunkSelection> chunks;  // one entry per chunk of the layout, same order
  TokenRange query;
};

class AttnLinkBoundary {
 public:
  explicit AttnLinkBoundary(AttnLinkConfig config = {}) : config_(config) { config_.validate(); }

  [[nodiscard]] const AttnLinkConfig& config() const noexcept { return config_; }

  // Epic section 4.2: k tokens at each chunk boundary plus the user query (k' tokens in section 4.2.1).
  [[nodiscard]] AttnLinkPlan plan(const PromptLayout& layout) const {
    layout.validate();
    AttnLinkPlan out;
    out.query = layout.query;
    out.chunks.reserve(layout.chunks.size());
    for (const PromptChunk& c : layout.chunks)
      out.chunks.push_back({{c.range.begin, c.range.begin}, {c.range.end, c.range.end}});

    const std::int64_t head = config_.head_tokens();
    const std::int64_t tail = config_.tail_tokens;
    std::size_t prev = 0;  // index of the last non-empty chunk seen; meaningful once one is seen
    for (std::size_t i = 0; i < layout.chunks.size(); ++i) {
      const PromptChunk& c = layout.chunks[i];
      if (c.range.empty()) continue;
      AttnLinkChunkSelection& sel = out.chunks[i];
      if (!c.cached) sel.head = c.range;
      if (c.range.begin > 0) {  // a boundary with the previous non-empty chunk
        if (c.cached) sel.head = {c.range.begin, c.range.begin + std::min(head, c.range.size())};
        const TokenRange p = layout.chunks[prev].range;
        AttnLinkChunkSelection& psel = out.chunks[prev];
        psel.tail = {std::max(psel.head.end, p.end - std::min(tail, p.size())), p.end};
      }
      prev = i;
    }

    // Chunks are contiguous and ascending and head precedes tail, so appending keeps the set sorted.
    for (const AttnLinkChunkSelection& sel : out.chunks) {
      append_range(out.tokens, sel.head);
      append_range(out.tokens, sel.tail);
    }
    append_range(out.tokens, layout.query);
    return out;
  }

 private:
  AttnLinkConfig config_;
};

}  // namespace kvfuse
