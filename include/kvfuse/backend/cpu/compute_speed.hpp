#pragma once
// The CPU engine's compute speed as Cake's chunk rule needs it (CakeSpeeds, schedule/chunk_sizes.hpp): seconds per
// compute call = a + b · rows, the least-squares line through prefills of 16, 64 and 256 rows at the front of
// `tokens` (after a warm-up; the faster of two passes each: a busy machine only adds time). The fetch side is the
// caller's (a link's nominal latency and bandwidth; 0 and 0 for a memory store, learnt from fetches by
// CakeSpeedMeter as requests run). About 2 × (16 + 64 + 256) rows of prefill.

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <initializer_list>
#include <span>
#include <vector>

#include "kvfuse/backend/cpu_llama.hpp"
#include "kvfuse/core/error.hpp"
#include "kvfuse/schedule/chunk_sizes.hpp"

namespace kvfuse {

[[nodiscard]] inline CakeSpeeds measure_cake_speeds(const CpuLlama& model, std::span<const token_id> tokens,
                                                    double fetch_call_s = 0.0, double fetch_token_s = 0.0) {
  detail::require(!tokens.empty(), "measure_cake_speeds: no tokens to compute");
  const std::vector<token_id> prompt(tokens.begin(), tokens.end());
  const auto timed = [&](std::int64_t rows) {
    CpuLlamaSession session(model, prompt);
    const auto t0 = std::chrono::steady_clock::now();
    session.compute_kv({0, rows});
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  };
  const auto n = static_cast<std::int64_t>(prompt.size());
  (void)timed(std::min<std::int64_t>(16, n));  // warm-up
  double sx = 0, sy = 0, sxx = 0, sxy = 0, points = 0;
  for (const std::int64_t rows : {std::int64_t{16}, std::int64_t{64}, std::int64_t{256}}) {
    const std::int64_t r = std::min(rows, n);
    const auto x = static_cast<double>(r);
    const double y = std::min(timed(r), timed(r));
    sx += x, sy += y, sxx += x * x, sxy += x * y, points += 1;
  }
  // seconds = a + b·rows: b = cov(x, y) / var(x), a = mean y - b · mean x (a >= 0).
  const double var = sxx / points - (sx / points) * (sx / points);
  const double slope = var > 0 ? (sxy / points - sx / points * sy / points) / var : 0.0;
  const double per_token = slope > 0 ? slope : sy / sx;
  const double fixed = std::max(0.0, sy / points - per_token * sx / points);
  CakeSpeeds speeds{fixed, std::max(per_token, 1e-12), fetch_call_s, fetch_token_s};
  speeds.validate();
  return speeds;
}

}  // namespace kvfuse
