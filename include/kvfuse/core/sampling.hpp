#pragma once
// sample_token: the next token from a row of logits — greedy (argmax_token) at temperature 0, else drawn from
// softmax(logits / T). Every engine that generates (CpuBatchEngine, the llama.cpp batch engine) calls this one.
// greedy_tokens: greedy decoding of one sequence after its prompt, for the engines' single-request decoders
// (CpuLlama::greedy_decode, LlamaCppFusion::greedy).

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <span>
#include <vector>

#include "kvfuse/core/error.hpp"
#include "kvfuse/core/types.hpp"

namespace kvfuse {

[[nodiscard]] inline token_id sample_token(std::span<const float> logits, double temperature, std::mt19937_64& rng) {
  detail::require(std::isfinite(temperature) && temperature >= 0.0,
                  "sample_token: temperature = {} must be finite and >= 0", temperature);
  if (temperature == 0.0) return argmax_token(logits);
  const float top = *std::max_element(logits.begin(), logits.end());
  std::vector<double> weights(logits.size());
  for (std::size_t i = 0; i < logits.size(); ++i)
    weights[i] = std::exp((static_cast<double>(logits[i]) - top) / temperature);
  std::discrete_distribution<token_id> pick(weights.begin(), weights.end());
  return pick(rng);
}

// Argmax tokens from the logits after a prompt until `eos` (not included) or max_new_tokens tokens; `feed(token)`
// appends a token to the sequence and returns the logits after it (not called after the last token).
template <class Feed>
[[nodiscard]] std::vector<token_id> greedy_tokens(std::span<const float> last_logits, std::int64_t max_new_tokens,
                                                  token_id eos, Feed&& feed) {
  std::vector<token_id> out;
  std::vector<float> logits(last_logits.begin(), last_logits.end());
  while (static_cast<std::int64_t>(out.size()) < max_new_tokens) {
    const token_id next = argmax_token(logits);
    if (next == eos) break;
    out.push_back(next);
    if (static_cast<std::int64_t>(out.size()) == max_new_tokens) break;
    logits = feed(next);
  }
  return out;
}

}  // namespace kvfuse
