#pragma once
// KVSplit — Epic's chunking of static text (documents, system prompts, few-shot examples) into chunks
// whose KV is generated and cached independently (Epic, "Efficient Position-Independent Context
// Caching for Serving Large Language Models": sections 2.2 step 1, 3 step 1, 5).
//
// The paper provides two basic splitters (section 5), both here:
//   - fixed(n): fixed-size chunks of chunk_size tokens, the last one holding the remainder.
//   - at_boundaries(n, may_end_after): semantic chunks. The caller says where a chunk may end (after a
//     sentence, paragraph or passage end token); by default every such boundary is a cut, so each
//     semantic unit becomes its own chunk, as in the paper. min_tokens merges units shorter than it
//     into the next one, and max_tokens forces a cut inside a unit that runs longer.
// layout_from_chunks() turns the chunk ranges plus a query length into the PromptLayout the selection
// policies consume.
//
// When to use (section 6.6, Figure 9):
//   - Long documents (HotpotQA, 2WikiMQA, MuSiQue, needle in a haystack): split at semantic
//     boundaries. Chunks stay coherent, which recovers accuracy, and there are fewer of them, which
//     makes AttnLink (whose recomputation grows with the chunk count) faster.
//   - Short documents (few-shot examples as in SAMSum): fixed-size chunks, which were both more
//     accurate and cheaper there.
//   - Chunks that come from elsewhere (a RAG retriever's passages): skip KVSplit, build the layout
//     with layout_from_chunks() or PromptLayout::from_lengths().
//
// Defaults from the paper: chunk_size = 512 ("fixed-size chunks (e.g., 512 tokens)", section 5, which
// is also CacheBlend's chunking). The paper gives no bounds for semantic chunks: min_tokens = 1 and
// max_tokens = kNoTokenLimit keep every unit whole.
//
// Extension beyond the paper: BoundaryCut::last packs consecutive units into one chunk, cutting at the
// last boundary that keeps the chunk within max_tokens (needs a finite max_tokens to be useful).

#include <algorithm>
#include <concepts>
#include <cstdint>
#include <limits>
#include <span>
#include <vector>

#include "kvfuse/core/error.hpp"
#include "kvfuse/core/prompt.hpp"
#include "kvfuse/core/types.hpp"

namespace kvfuse {

inline constexpr std::int64_t kNoTokenLimit = std::numeric_limits<std::int64_t>::max();

// Which allowed boundary ends a semantic chunk, among those that keep it within [min_tokens, max_tokens].
enum class BoundaryCut {
  first,  // the first one: one chunk per semantic unit (the paper's semantic splitting)
  last,   // the last one: pack units up to max_tokens (kvfuse extension)
};

struct KVSplitConfig {
  std::int64_t chunk_size = 512;  // fixed(): tokens per chunk
  std::int64_t min_tokens = 1;    // at_boundaries(): boundaries that leave a shorter chunk are ignored
  std::int64_t max_tokens = kNoTokenLimit;  // at_boundaries(): a chunk never gets longer (forced cut)
  BoundaryCut cut = BoundaryCut::first;

  void validate() const {
    detail::require(chunk_size > 0, "KVSplitConfig: chunk_size = {} must be > 0", chunk_size);
    detail::require(min_tokens > 0, "KVSplitConfig: min_tokens = {} must be > 0", min_tokens);
    detail::require(max_tokens >= min_tokens, "KVSplitConfig: max_tokens = {} must be >= min_tokens = {}",
                    max_tokens, min_tokens);
    detail::require(cut == BoundaryCut::first || cut == BoundaryCut::last,
                    "KVSplitConfig: cut = {} is neither BoundaryCut::first nor BoundaryCut::last",
                    static_cast<int>(cut));
  }
};

// Every splitter returns ranges that cover [0, n) exactly, in order, contiguous, none empty
// (no chunks for n = 0).
class KVSplit {
 public:
  explicit KVSplit(KVSplitConfig config = {}) : config_(config) { config_.validate(); }

  [[nodiscard]] const KVSplitConfig& config() const noexcept { return config_; }

  // Fixed-size chunks of chunk_size tokens; the last one holds the remainder (section 5).
  [[nodiscard]] std::vector<TokenRange> fixed(std::int64_t n) const {
    require_length(n);
    std::vector<TokenRange> chunks;
    for (std::int64_t b = 0; b < n;) {
      const std::int64_t e = b + std::min(config_.chunk_size, n - b);
      chunks.push_back({b, e});
      b = e;
    }
    return chunks;
  }

  // Semantic chunks of n tokens (section 5). may_end_after(i) says a chunk may end after token i; it is
  // called only for i in [0, n - 1), in no particular order, and must not depend on earlier calls. The
  // end of the text always ends the last chunk, which may therefore be shorter than min_tokens.
  template <class Pred>
    requires std::predicate<Pred&, std::int64_t>
  [[nodiscard]] std::vector<TokenRange> at_boundaries(std::int64_t n, Pred&& may_end_after) const {
    require_length(n);
    std::vector<TokenRange> chunks;
    for (std::int64_t b = 0; b < n;) {
      const std::int64_t e = chunk_end(b, n, may_end_after);
      chunks.push_back({b, e});
      b = e;
    }
    return chunks;
  }

  // The same over token ids: may_end_after(i, tokens[i]) says a chunk may end after token i.
  template <class Pred>
    requires std::predicate<Pred&, std::int64_t, token_id>
  [[nodiscard]] std::vector<TokenRange> at_boundaries(std::span<const token_id> tokens, Pred&& may_end_after) const {
    return at_boundaries(static_cast<std::int64_t>(tokens.size()), [&](std::int64_t i) -> bool {
      return may_end_after(i, tokens[static_cast<std::size_t>(i)]);
    });
  }

 private:
  static void require_length(std::int64_t n) {
    detail::require(n >= 0, "KVSplit: token count {} must be >= 0", n);
  }

  // End (exclusive) of the chunk that starts at b < n. Lengths are compared against n - b so that
  // max_tokens = kNoTokenLimit never overflows.
  template <class Pred>
  [[nodiscard]] std::int64_t chunk_end(std::int64_t b, std::int64_t n, Pred& may_end_after) const {
    const std::int64_t rest = n - b;
    const std::int64_t lo = config_.min_tokens;
    const std::int64_t hi = std::min(config_.max_tokens, rest);  // longest allowed chunk
    if (config_.cut == BoundaryCut::first) {
      for (std::int64_t len = lo; len <= hi; ++len)
        if (len == rest || may_end_after(b + len - 1)) return b + len;
    } else {
      if (rest <= config_.max_tokens) return n;  // the end of the text is the last boundary in reach
      for (std::int64_t len = hi; len >= lo; --len)
        if (may_end_after(b + len - 1)) return b + len;
    }
    return b + hi;  // rest < min_tokens (first) takes the rest; otherwise no boundary: forced cut at max
  }

  KVSplitConfig config_;
};

// PromptLayout of the given chunks (all cached) followed by a query of query_len tokens. The chunks
// must be contiguous from position 0, as KVSplit produces them.
[[nodiscard]] inline PromptLayout layout_from_chunks(std::span<const TokenRange> chunks, std::int64_t query_len) {
  detail::require(query_len >= 0, "layout_from_chunks: query length {} must be >= 0", query_len);
  PromptLayout layout;
  layout.chunks.reserve(chunks.size());
  for (const TokenRange& r : chunks) layout.chunks.push_back({r, true});
  const std::int64_t start = chunks.empty() ? 0 : chunks.back().end;
  layout.query = {start, start + query_len};
  layout.validate();
  return layout;
}

// `layout` with every chunk longer than the splitter's chunk_size cut into fixed() chunks (a long document
// becomes several chunk caches, Epic §5's fixed-size chunking); shorter chunks, their cached flags, the query and
// the chunk context (which still ends on a chunk boundary) stay as they are.
[[nodiscard]] inline PromptLayout split_long_chunks(const PromptLayout& layout, const KVSplit& split) {
  layout.validate();
  PromptLayout out;
  out.query = layout.query;
  out.chunk_context = layout.chunk_context;
  for (const PromptChunk& c : layout.chunks) {
    if (c.range.size() <= split.config().chunk_size) {
      out.chunks.push_back(c);
      continue;
    }
    for (const TokenRange& r : split.fixed(c.range.size()))
      out.chunks.push_back({{c.range.begin + r.begin, c.range.begin + r.end}, c.cached});
  }
  out.validate();
  return out;
}

}  // namespace kvfuse
