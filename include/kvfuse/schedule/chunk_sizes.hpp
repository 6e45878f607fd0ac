#pragma once
// Cake's chunk sizes from measured speeds, and the speeds measured as requests run.
//
// Cake (ICML 2025) fixes the compute chunk at vLLM's 512-token budget and the fetch chunk at 128 tokens, chosen
// empirically on A100s (§5, "I/O bandwidth control"; §5.3 varies the compute chunk). Where one chunk takes a
// large share of the time to first token — a CPU, a small GPU share, a short prefix — that granularity is what
// Cake loses: the two sides meet only on chunk boundaries, and the adaptive mode's guarantee
// (BidirectionalLoader: never slower than the better single resource by more than one compute chunk) is only as
// tight as one chunk. Small chunks cost more per token, though: every compute call and every fetch has a fixed
// cost (weights read once per forward pass, kernel launches; the link's latency).
//
// choose_chunk_sizes: the rule. With a compute chunk of c tokens taking a + b·c seconds and a fetch chunk of
// f tokens taking L + β·f, the ideal time to cover a prefix of P tokens — both sides busy until they meet, no
// fixed costs — is T* = P / (1/b + 1/β). Each chunk is the largest (on a grid of `granularity` tokens, at most
// `max_chunk`) whose time is at most `chunk_share` of T* (so at most that share of any TTFT Cake can reach),
// unless that would make its fixed cost more than `max_fixed_share` of its time: then the smallest chunk whose
// fixed cost is that share. For the compute chunk that share is at most half the link's share of the ideal
// throughput, b / (b + β): on a link that brings a few per cent, Cake can beat compute-only (in the largest chunks)
// by no more than that, so its own calls must cost less (a 2 MB/s link and SmolLM2 on 2 cores: 512-token chunks).
//
// SpeedMeter: exponentially weighted least squares of seconds = fixed + per_token · tokens over observed steps,
// kept per engine (compute) and per store (fetch) across requests; CakeSpeedMeter holds both and reads a
// LoaderTrace. Policies only: no clock, no thread.

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>

#include "kvfuse/core/error.hpp"
#include "kvfuse/core/types.hpp"
#include "kvfuse/schedule/bidirectional_loader.hpp"

namespace kvfuse {

// What one compute chunk and one fetch chunk cost: seconds = fixed + per_token · tokens.
struct CakeSpeeds {
  double compute_call_s = 0;   // a: one compute call's fixed cost
  double compute_token_s = 0;  // b: per computed token (> 0)
  double fetch_call_s = 0;     // L: one fetch's fixed cost (the link's latency)
  double fetch_token_s = 0;    // β: per loaded token (KV bytes per token / bandwidth); 0: an unlimited link

  void validate() const {
    detail::require_finite_nonneg(compute_call_s, "CakeSpeeds: compute_call_s");
    detail::require_finite_nonneg(compute_token_s, "CakeSpeeds: compute_token_s");
    detail::require(compute_token_s > 0, "CakeSpeeds: compute_token_s = 0 would make compute free");
    detail::require_finite_nonneg(fetch_call_s, "CakeSpeeds: fetch_call_s");
    detail::require_finite_nonneg(fetch_token_s, "CakeSpeeds: fetch_token_s");
  }

  [[nodiscard]] double compute_chunk_s(std::int64_t tokens) const noexcept {
    return compute_call_s + compute_token_s * static_cast<double>(tokens);
  }
  [[nodiscard]] double fetch_chunk_s(std::int64_t tokens) const noexcept {
    return fetch_call_s + fetch_token_s * static_cast<double>(tokens);
  }

  // T* = P / (1/b + 1/β): both sides at their per-token speeds with no fixed cost, meeting where both finish.
  [[nodiscard]] double ideal_ttft_s(std::int64_t prefix_tokens) const noexcept {
    if (fetch_token_s == 0) return 0;
    const double rate = 1 / compute_token_s + 1 / fetch_token_s;  // tokens per second, both sides together
    return static_cast<double>(prefix_tokens) / rate;
  }

  // With chunks of c and f tokens: P / (c / (a + b·c) + f / (L + β·f)).
  [[nodiscard]] double predicted_ttft_s(std::int64_t prefix_tokens, std::int64_t compute_chunk,
                                        std::int64_t fetch_chunk) const noexcept {
    const double f = fetch_chunk_s(fetch_chunk);
    const double rate = static_cast<double>(compute_chunk) / compute_chunk_s(compute_chunk) +
                        (f > 0 ? static_cast<double>(fetch_chunk) / f : std::numeric_limits<double>::infinity());
    return static_cast<double>(prefix_tokens) / rate;
  }

  // The adaptive mode's a-priori costs for chunks of these sizes (the growth with position folded into b). A free
  // link (L = β = 0, e.g. a memory tier not yet measured) is known to be fast, not unknown (0 to the loader): its
  // fetch chunk is given kFreeFetchS, so the compute side waits for the loads (within its idle budget, one compute
  // chunk's time) instead of racing them.
  static constexpr double kFreeFetchS = 1e-6;
  [[nodiscard]] LoaderEstimate estimate(std::int64_t compute_chunk, std::int64_t fetch_chunk) const noexcept {
    return {compute_chunk_s(compute_chunk), 0.0, std::max(fetch_chunk_s(fetch_chunk), kFreeFetchS), compute_call_s};
  }
};

struct ChunkRule {
  double chunk_share = 0.02;     // one chunk's time at most this share of the ideal TTFT ...
  double max_fixed_share = 0.1;  // ... unless its fixed cost would then exceed this share of its time
  std::int64_t granularity = 16; // chunks are multiples of this many tokens
  std::int64_t max_chunk = 512;  // and at most this many (Cake's compute chunk)

  void validate() const {
    detail::require(chunk_share > 0 && chunk_share < 1, "ChunkRule: chunk_share = {} must be in (0, 1)", chunk_share);
    detail::require(max_fixed_share > 0 && max_fixed_share < 1, "ChunkRule: max_fixed_share = {} must be in (0, 1)",
                    max_fixed_share);
    detail::require(granularity > 0 && max_chunk >= granularity && max_chunk % granularity == 0,
                    "ChunkRule: max_chunk = {} must be a positive multiple of granularity = {}", max_chunk, granularity);
  }
};

struct ChunkSizes {
  std::int64_t compute_chunk = 0;
  std::int64_t fetch_chunk = 0;
};

namespace detail {

// One side's chunk: the largest on the grid with fixed + per_token·x <= budget_s, raised to the smallest with
// fixed <= share·(fixed + per_token·x), i.e. x >= fixed·(1 - share) / (share·per_token); within [grid, max].
[[nodiscard]] inline std::int64_t rule_chunk(double fixed, double per_token, double budget_s, const ChunkRule& rule) {
  if (per_token <= 0) return rule.max_chunk;  // free per token: only the fixed cost counts
  const auto grid = static_cast<double>(rule.granularity);
  const double by_share = std::floor((budget_s - fixed) / per_token / grid) * grid;
  const double floor_tokens =
      std::ceil(fixed * (1 - rule.max_fixed_share) / (rule.max_fixed_share * per_token) / grid) * grid;
  const double x = std::clamp(std::max(by_share, floor_tokens), grid, static_cast<double>(rule.max_chunk));
  return static_cast<std::int64_t>(x);
}

}  // namespace detail

// The compute and fetch chunks for a stored prefix of `prefix_tokens` (see the top of this header).
[[nodiscard]] inline ChunkSizes choose_chunk_sizes(const CakeSpeeds& speeds, std::int64_t prefix_tokens,
                                                   const ChunkRule& rule = {}) {
  speeds.validate();
  rule.validate();
  detail::require(prefix_tokens >= 0, "choose_chunk_sizes: prefix_tokens = {} must be >= 0", prefix_tokens);
  const double budget_s = rule.chunk_share * speeds.ideal_ttft_s(prefix_tokens);
  ChunkRule compute_rule = rule;  // its fixed cost at most half the link's share b / (b + β) (see the top)
  if (const double b = speeds.compute_token_s, beta = speeds.fetch_token_s; beta > 0)
    compute_rule.max_fixed_share = std::min(rule.max_fixed_share, 0.5 * b / (b + beta));
  return {detail::rule_chunk(speeds.compute_call_s, speeds.compute_token_s, budget_s, compute_rule),
          detail::rule_chunk(speeds.fetch_call_s, speeds.fetch_token_s, budget_s, rule)};
}

// seconds = fixed + per_token · tokens, fitted by exponentially weighted least squares: each observation gets
// weight `alpha`, the older ones (1 - alpha) of theirs. Until the observed sizes differ (coefficient of variation
// under 0.1) the fixed cost stays at its prior and only per_token is fitted.
class SpeedMeter {
 public:
  SpeedMeter(double fixed_s, double per_token_s, double alpha = 0.2)
      : fixed_(fixed_s), per_token_(per_token_s), alpha_(alpha) {
    detail::require_finite_nonneg(fixed_s, "SpeedMeter: fixed_s");
    detail::require_finite_nonneg(per_token_s, "SpeedMeter: per_token_s");
    detail::require(alpha > 0 && alpha <= 1, "SpeedMeter: alpha = {} must be in (0, 1]", alpha);
  }

  void observe(std::int64_t tokens, double seconds) {
    if (tokens <= 0 || !(seconds > 0) || !std::isfinite(seconds)) return;
    const auto x = static_cast<double>(tokens);
    const double w = observed_ ? alpha_ : 1.0;
    x_ += w * (x - x_);
    y_ += w * (seconds - y_);
    xx_ += w * (x * x - xx_);
    xy_ += w * (x * seconds - xy_);
    observed_ = true;
    const double var = xx_ - x_ * x_;
    if (var > 0.01 * x_ * x_) {  // sizes differ: fit both, fixed >= 0
      const double slope = (xy_ - x_ * y_) / var;
      fixed_ = std::max(0.0, y_ - slope * x_);
    }
    per_token_ = std::max(0.0, (y_ - fixed_) / x_);
  }

  [[nodiscard]] double fixed_s() const noexcept { return fixed_; }
  [[nodiscard]] double per_token_s() const noexcept { return per_token_; }

 private:
  double fixed_, per_token_, alpha_;
  double x_ = 0, y_ = 0, xx_ = 0, xy_ = 0;  // weighted means of tokens, seconds, tokens², tokens·seconds
  bool observed_ = false;
};

// The speeds of one engine's compute and one store's link, kept across requests.
class CakeSpeedMeter {
 public:
  explicit CakeSpeedMeter(const CakeSpeeds& prior, double alpha = 0.2)
      : compute_(prior.compute_call_s, prior.compute_token_s, alpha),
        fetch_(prior.fetch_call_s, prior.fetch_token_s, alpha) {
    prior.validate();
  }

  [[nodiscard]] SpeedMeter& compute() noexcept { return compute_; }
  [[nodiscard]] SpeedMeter& fetch() noexcept { return fetch_; }

  // Every compute step and every fetch that landed (abandoned and failed ones say nothing about the link).
  void observe(const LoaderTrace& trace) {
    for (const LoaderStep& s : trace.steps)
      if (s.source == KVSource::compute) compute_.observe(s.tokens.size(), s.end_s - s.start_s);
    observe_fetches(trace);
  }
  // The fetches only: where the trace's compute steps shared their time with other work (an engine's steps).
  void observe_fetches(const LoaderTrace& trace) {
    for (const LoaderStep& s : trace.steps)
      if (s.source == KVSource::prefix && s.used) fetch_.observe(s.tokens.size(), s.end_s - s.start_s);
  }

  [[nodiscard]] CakeSpeeds speeds() const {
    // Compute is never free: a fit that found no per-token cost keeps a tiny one.
    return {compute_.fixed_s(), std::max(compute_.per_token_s(), 1e-12), fetch_.fixed_s(), fetch_.per_token_s()};
  }

 private:
  SpeedMeter compute_, fetch_;
};

}  // namespace kvfuse
