#pragma once
// Numeric helpers shared by several policies:
//  - tolerant_ceil: ⌈x⌉ that ignores floating-point noise just above an integer (Cache-Craft eq. 14's
//    N = ⌈CFO · |C|⌉, the preload depth ⌈L_p⌉ of eq. 16);
//  - the token order "score descending, ties to the lower position" in which CacheBlend keeps its HKVD
//    tokens (section 4.3) and Cache-Craft ranks a chunk's tokens (eq. 14), an O(n) top-k over it, and the
//    rounding of a keep ratio to a count;
//  - the activations of the CPU backend's gemma3 decoder: GELU (tanh approximation) and the final logit
//    soft-cap.
// The per-element pieces are KVFUSE_HOST_DEVICE so a CUDA top-k can use the very same order.

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <span>

#include "kvfuse/core/config.hpp"

namespace kvfuse::detail {

// ⌈x⌉, except that an x within a relative 1e-9 above an integer n (0 <= x − n <= 1e-9 · |x|) counts as n,
// so that rounding noise (0.1 · 3 · 10 = 3.0000000000000004) does not add a whole unit. The slack is
// relative at every magnitude: for 0 < x < 1 it is below x, so a tiny positive x still gives 1.
KVFUSE_HOST_DEVICE double tolerant_ceil(double x) {
  const double below = std::floor(x);
  return x - below <= 1e-9 * std::fabs(x) ? below : below + 1.0;
}

// True when a token with `score_a` at `pos_a` ranks before one with `score_b` at `pos_b`: higher score
// first, equal scores to the lower position (CacheBlend section 4.3 HKVD tokens, Cache-Craft eq. 14).
// NaN ranks above every number (+inf included), NaNs tie with each other, −0 equals +0: a token whose
// recomputed or cached row is corrupt is recomputed first. This is kvfuse's one top-k order: the radix key
// of the CUDA top-k (detail/topk.hpp, top_k_key) encodes exactly this order for float scores.
template <class Score, class Pos>
KVFUSE_HOST_DEVICE bool ranks_before(Score score_a, Pos pos_a, Score score_b, Pos pos_b) {
  const bool nan_a = score_a != score_a;
  const bool nan_b = score_b != score_b;
  if (nan_a || nan_b) return nan_a && (!nan_b || pos_a < pos_b);
  return score_a > score_b || (score_a == score_b && pos_a < pos_b);
}

// Strict weak order on positions into `scores` by ranks_before, for std::sort / std::nth_element. It is a
// strict total order (NaNs included), so the result does not depend on the algorithm.
template <class Score>
struct ScoreDescending {
  const Score* scores;

  template <class Pos>
  KVFUSE_HOST_DEVICE bool operator()(Pos a, Pos b) const {
    return ranks_before(scores[a], a, scores[b], b);
  }
};

// The number of items a ratio keeps out of n: round(ratio · n) to the nearest integer, halves up
// (floor(ratio · n + 0.5); truncation would turn 0.29 · 100 = 28.999... into 28). Ratios outside [0, 1]
// are clamped; NaN keeps none. HKVDSelector's keep counts (CacheBlend section 4.3) and the GPU top-k's k
// (top_k_count) are this function.
KVFUSE_HOST_DEVICE std::int64_t keep_count(double ratio, std::int64_t n) {
  if (n <= 0 || !(ratio > 0.0)) return 0;
  if (ratio >= 1.0) return n;
  const auto k = static_cast<std::int64_t>(std::floor(ratio * static_cast<double>(n) + 0.5));
  return k > n ? n : k;
}

// Moves the k positions of `positions` that rank first by scores[position] (ScoreDescending) to its
// front, in unspecified order; the rest follow. O(n) on average (std::nth_element); k >= size keeps all.
template <class Score, class Pos>
void partition_top_k(std::span<Pos> positions, const Score* scores, std::size_t k) {
  if (k >= positions.size()) return;
  std::nth_element(positions.begin(), positions.begin() + static_cast<std::ptrdiff_t>(k), positions.end(),
                   ScoreDescending<Score>{scores});
}

// GELU, tanh approximation: 0.5 x (1 + tanh(sqrt(2/π) (x + 0.044715 x³))), in float, the formula of ggml's
// ggml_gelu_f32 (llama.cpp LLM_FFN_GELU; Hugging Face gelu_pytorch_tanh, Gemma 3's hidden_activation).
// (ggml's CPU kernel reads it from a table at fp16-rounded x; this evaluates it at x.)
KVFUSE_HOST_DEVICE float gelu_tanh(float x) {
  constexpr float sqrt_2_over_pi = 0.79788456080286535587989211986876f;
  constexpr float coef_a = 0.044715f;
  return 0.5f * x * (1.0f + std::tanh(sqrt_2_over_pi * x * (1.0f + coef_a * x * x)));
}

// Logit soft-capping cap · tanh(x / cap) (Gemma 2 / 3 final_logit_softcapping), as llama.cpp's graph
// computes it: x scaled by 1 / cap, tanh, scaled by cap, in float.
KVFUSE_HOST_DEVICE float softcap(float x, float cap) { return cap * std::tanh(x * (1.0f / cap)); }

}  // namespace kvfuse::detail
