#pragma once
// The shape of a fused prompt: reusable chunks (system prompt, passages, ...) followed by the query,
// and TokenSet, the sorted set of token positions a selection policy asks to recompute.

#include <algorithm>
#include <cstdint>
#include <vector>

#include "kvfuse/core/error.hpp"
#include "kvfuse/core/types.hpp"

namespace kvfuse {

// Sorted, duplicate-free token positions.
using TokenSet = std::vector<std::int64_t>;

[[nodiscard]] inline TokenSet make_token_set(std::vector<std::int64_t> tokens) {
  std::sort(tokens.begin(), tokens.end());
  tokens.erase(std::unique(tokens.begin(), tokens.end()), tokens.end());
  return tokens;
}

inline void append_range(TokenSet& set, TokenRange r) {
  for (std::int64_t t = r.begin; t < r.end; ++t) set.push_back(t);
}

// `rows` (sorted) with every gap between two of its runs of adjacent rows filled when the gap is shorter than
// run_cost_rows: for an engine whose forward call costs run_cost_rows rows beyond the rows it computes, one more
// run costs a call and a filled gap costs its rows, and the two choices are independent from gap to gap, so
// filling exactly the gaps below the call's cost gives the cheapest superset of `rows` (ties stay unfilled).
// Nothing before the first row or after the last is added.
[[nodiscard]] inline TokenSet merge_runs(const TokenSet& rows, std::int64_t run_cost_rows) {
  TokenSet out;
  out.reserve(rows.size());
  for (std::size_t i = 0; i < rows.size(); ++i) {
    if (i > 0 && rows[i] - rows[i - 1] - 1 < run_cost_rows) append_range(out, {rows[i - 1] + 1, rows[i]});
    out.push_back(rows[i]);
  }
  return out;
}

struct PromptChunk {
  TokenRange range;
  bool cached = true;  // false: no stored KV for this chunk, so every token of it must be computed
};

// prompt = chunks[0] ++ chunks[1] ++ ... ++ query, contiguous from position 0. Chunks may be empty.
//
// chunk_context: rows [0, chunk_context) are the prompt's shared context (BOS, the system prompt, template glue),
// always computed, and every chunk cache of the prompt is computed behind it: the chunk's KV as it is after exactly
// these rows (at positions chunk_context, chunk_context + 1, ...), stored under a key of the context and the chunk.
// A chunk computed alone from position 0 turns its first tokens into attention sinks (Epic §4.2) that a reuse must
// then recompute; behind the context every chunk shares the one real sink (APE's shared prefix). 0: chunk caches
// computed alone from position 0 (CacheBlend §3, Epic). It must end on a chunk boundary, and no chunk inside it may
// be cached.
struct PromptLayout {
  std::vector<PromptChunk> chunks;
  TokenRange query;
  std::int64_t chunk_context = 0;

  [[nodiscard]] std::int64_t num_tokens() const noexcept { return query.end; }

  void validate() const {
    std::int64_t next = 0;
    bool context_boundary = chunk_context == 0;
    for (std::size_t i = 0; i < chunks.size(); ++i) {
      const TokenRange r = chunks[i].range;
      detail::require(r.begin == next && r.end >= r.begin,
                      "PromptLayout: chunk {} is [{}, {}) but must start at {} and not be reversed", i, r.begin,
                      r.end, next);
      detail::require(!(chunks[i].cached && !r.empty() && r.end <= chunk_context),
                      "PromptLayout: chunk {} [{}, {}) is cached but lies in the chunk context [0, {}), which is "
                      "always computed",
                      i, r.begin, r.end, chunk_context);
      context_boundary = context_boundary || r.end == chunk_context;
      next = r.end;
    }
    detail::require(query.begin == next && query.end >= query.begin,
                    "PromptLayout: query is [{}, {}) but must start at {} (end of the last chunk)", query.begin,
                    query.end, next);
    detail::require(chunk_context >= 0 && context_boundary,
                    "PromptLayout: chunk_context = {} is not 0 or the end of a chunk", chunk_context);
  }

  // Layout from chunk lengths followed by a query of `query_len` tokens; all chunks cached.
  [[nodiscard]] static PromptLayout from_lengths(const std::vector<std::int64_t>& chunk_lengths,
                                                 std::int64_t query_len) {
    PromptLayout layout;
    std::int64_t pos = 0;
    for (std::int64_t len : chunk_lengths) {
      detail::require(len >= 0, "PromptLayout: chunk length {} is negative", len);
      layout.chunks.push_back({{pos, pos + len}, true});
      pos += len;
    }
    detail::require(query_len >= 0, "PromptLayout: query length {} is negative", query_len);
    layout.query = {pos, pos + query_len};
    return layout;
  }
};

}  // namespace kvfuse
