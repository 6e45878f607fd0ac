#pragma once
// sample_token: the next token from a row of logits — greedy (argmax_token) at temperature 0, else drawn from
// softmax(logits / T). Every engine that generates (CpuBatchEngine, the llama.cpp batch engine) calls this one.

#include <algorithm>
#include <cmath>
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

}  // namespace kvfuse
