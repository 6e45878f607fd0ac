#pragma once
// Prompts of the fusion tests: [system, passages..., query] made of deterministic token pieces of the small
// Llama's 96-token vocabulary, with their layout.
#include <cstddef>
#include <cstdint>
#include <vector>

#include "kvfuse/core/prompt.hpp"
#include "kvfuse/core/types.hpp"

namespace kvfuse_test {

inline std::vector<kvfuse::token_id> chunk_tokens(std::size_t n, std::uint32_t seed) {
  std::vector<kvfuse::token_id> t(n);
  for (std::size_t i = 0; i < n; ++i)
    t[i] = static_cast<kvfuse::token_id>((seed * 2654435761u + 31u * i * i + 7u * i) % 96u);
  return t;
}

struct Prompt {
  std::vector<kvfuse::token_id> tokens;
  kvfuse::PromptLayout layout;
};

inline Prompt assemble(const std::vector<std::vector<kvfuse::token_id>>& chunks,
                       const std::vector<kvfuse::token_id>& query) {
  Prompt p;
  std::vector<std::int64_t> lengths;
  for (const auto& c : chunks) {
    p.tokens.insert(p.tokens.end(), c.begin(), c.end());
    lengths.push_back(static_cast<std::int64_t>(c.size()));
  }
  p.tokens.insert(p.tokens.end(), query.begin(), query.end());
  p.layout = kvfuse::PromptLayout::from_lengths(lengths, static_cast<std::int64_t>(query.size()));
  return p;
}

inline const std::vector<kvfuse::token_id> kSystem = chunk_tokens(6, 1);
inline const std::vector<kvfuse::token_id> kA = chunk_tokens(9, 2);
inline const std::vector<kvfuse::token_id> kB = chunk_tokens(11, 3);
inline const std::vector<kvfuse::token_id> kC = chunk_tokens(8, 4);
inline const std::vector<kvfuse::token_id> kQuery = chunk_tokens(5, 5);

// Three prompts reusing the same chunks in other orders and positions (the batch-engine tests).
inline std::vector<Prompt> reordered_prompts() {
  return {assemble({kSystem, kA, kB, kC}, kQuery), assemble({kSystem, kC, kA}, kQuery),
          assemble({kSystem, kB, kC, kA}, chunk_tokens(4, 9))};
}

}  // namespace kvfuse_test
