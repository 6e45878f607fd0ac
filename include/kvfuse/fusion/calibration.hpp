#pragma once
// A per-model correctness gate for KV reuse. A reuse method that is faithful on one model can garble another
// (an architecture it was not designed for, a model trained without long contexts). Before serving a model
// with a method, calibrate() measures the method's settings against full prefill on a few sample prompts,
// cheapest first, and returns the first one whose teacher-forced fidelity stays within a budget and is no worse
// than naive reuse's on the same prompts — or refuses the method for that model, with every figure it measured.
// The second condition is there because recomputing a subset of tokens can be worse than recomputing none
// (docs/fidelity.md: on Qwen2, CacheBlend at r = 0.15 has a larger teacher-forced KL than naive reuse on short
// passages); a setting that loses to doing nothing is never the cheapest acceptable one.
//
// The measurement is the engine's (`evaluate`): for one setting, the mean over the sample prompts of the
// fraction of token-layers recomputed and of the teacher-forced figures — full prefill's greedy answer fed
// after the method's KV, KL(full ‖ method) averaged over the answer tokens and the share of them whose top-1
// token agrees (kvfuse/harness/metrics.hpp computes both; harness/calibrate.hpp runs it on the reference backend
// and caches the result per model fingerprint).
//
// Families and their settings, cheapest first: cacheblend (r), attnlink (k), cachecraft (α of eq. 12),
// queryaware (r, with λ = 0.5); a family's default setting goes by its plain name ("cacheblend" is r = 0.15). The cost
// of a setting is what it recomputes, which grows with each of these knobs.

#include <array>
#include <cmath>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "kvfuse/core/error.hpp"
#include "kvfuse/fusion/fusion_method.hpp"

namespace kvfuse {

struct CalibrationBudget {
  double max_kl_answer = 0.05;       // mean teacher-forced KL(full ‖ method) over the answer tokens, nats
  double min_top1_agreement = 0.95;  // share of answer tokens whose top-1 token equals full prefill's

  void validate() const {
    detail::require(std::isfinite(max_kl_answer) && max_kl_answer >= 0.0,
                    "CalibrationBudget: max_kl_answer = {} must be finite and >= 0", max_kl_answer);
    detail::require(min_top1_agreement >= 0.0 && min_top1_agreement <= 1.0,
                    "CalibrationBudget: min_top1_agreement = {} must be in [0, 1]", min_top1_agreement);
  }
  [[nodiscard]] bool admits(double kl_answer, double top1) const noexcept {
    return kl_answer <= max_kl_answer && top1 >= min_top1_agreement;
  }
};

// What `evaluate` measured for one setting, means over the sample prompts.
struct CalibrationMeasure {
  double recompute_fraction = 0.0;
  double kl_answer_mean = 0.0;
  double top1_agreement = 0.0;
};

struct CalibrationPoint {
  std::string method;  // method_name of the setting
  CalibrationMeasure measure;
  bool admitted = false;  // within the budget and no worse than naive reuse (KL <= naive's)
};

struct Calibration {
  std::uint64_t model_fingerprint = 0;
  std::string family;
  CalibrationBudget budget;
  CalibrationMeasure naive;              // naive reuse on the same prompts: what every setting must not lose to
  std::vector<CalibrationPoint> points;  // the settings measured, cheapest first; the last is the chosen one
  std::optional<std::string> chosen;     // method_name of the cheapest admitted setting; nullopt: refused

  // The chosen setting; throws kvfuse::error naming the family, the budget and what was measured when refused.
  [[nodiscard]] FusionMethod method() const {
    if (chosen) return parse_method(*chosen);
    std::string seen;
    for (const CalibrationPoint& p : points)
      seen += fmt::format("{}{}: KL {:.4f}, top-1 {:.3f}, recomputed {:.3f}", seen.empty() ? "" : "; ", p.method,
                          p.measure.kl_answer_mean, p.measure.top1_agreement, p.measure.recompute_fraction);
    throw error(fmt::format(
        "calibration refuses {} for model {:016x}: no setting keeps teacher-forced KL <= {} with top-1 agreement "
        ">= {} and no worse than naive reuse (KL {:.4f}, top-1 {:.3f}) (measured {})",
        family, model_fingerprint, budget.max_kl_answer, budget.min_top1_agreement, naive.kl_answer_mean,
        naive.top1_agreement, seen));
  }
};

// Whether calibrate() accepts a setting measured `m`: within `budget`, and no worse than naive reuse's KL.
[[nodiscard]] inline bool admits(const CalibrationBudget& budget, const CalibrationMeasure& naive,
                                 const CalibrationMeasure& m) noexcept {
  return budget.admits(m.kl_answer_mean, m.top1_agreement) && m.kl_answer_mean <= naive.kl_answer_mean;
}

// The method families calibrate() knows, each with settings to choose from (full, prefix and naive have none).
inline constexpr std::array<std::string_view, 6> kCalibrationFamilies{"cacheblend", "attnlink",  "cachecraft",
                                                                      "cachecraft-cover", "queryaware", "queryprobe"};

// The settings calibrate() tries for a family, cheapest first.
[[nodiscard]] inline std::vector<std::string> calibration_settings(std::string_view family) {
  if (family == "cacheblend") return {"cacheblend@0.05", "cacheblend@0.1", "cacheblend", "cacheblend@0.2",
                                      "cacheblend@0.3", "cacheblend@0.5"};
  // QueryAware with λ = 0.5: the query mass alone (λ = 1) closes little of naive reuse's gap on SmolLM2 and
  // Gemma 3 (docs/results.md), mixed with the KV deviation it does.
  if (family == "queryaware") return {"queryaware@0.05:0.5", "queryaware@0.1:0.5", "queryaware@0.15:0.5",
                                      "queryaware@0.2:0.5", "queryaware@0.3:0.5", "queryaware@0.5:0.5"};
  // QueryProbe's r, as CacheBlend's (docs/fidelity.md: it closes more of naive reuse's gap at equal recompute).
  if (family == "queryprobe") return {"queryprobe@0.05", "queryprobe@0.1", "queryprobe", "queryprobe@0.2",
                                      "queryprobe@0.3", "queryprobe@0.5"};
  if (family == "attnlink") return {"attnlink@1", "attnlink@4", "attnlink", "attnlink@32", "attnlink@64"};
  if (family == "cachecraft") return {"cachecraft@0.25", "cachecraft@0.5", "cachecraft", "cachecraft@2", "cachecraft@4"};
  // Cache-Craft with prefix coverage (a kvfuse extension: eq. 6's β scaled by the share of the current prefix's
  // chunks the variant saw, CCIScorerConfig::prefix_coverage): more recompute than the same α without it, so a family
  // of its own, its α from half the paper's down.
  if (family == "cachecraft-cover") return {"cachecraft@0.125-cover", "cachecraft@0.25-cover", "cachecraft@0.5-cover",
                                            "cachecraft-cover", "cachecraft@2-cover"};
  throw error(fmt::format("calibration: unknown method family '{}' ({}; full, prefix and naive have no setting to "
                          "calibrate)",
                          family, fmt::join(kCalibrationFamilies, ", ")));
}

// Measures naive reuse, then `family`'s settings cheapest first with evaluate(const FusionMethod&) ->
// CalibrationMeasure, and stops at the first within `budget` and no worse than naive reuse (the cheapest
// admitted: cost grows along the list).
template <class Evaluate>
[[nodiscard]] Calibration calibrate(std::uint64_t model_fingerprint, std::string_view family,
                                    const CalibrationBudget& budget, Evaluate&& evaluate) {
  budget.validate();
  const std::vector<std::string> settings = calibration_settings(family);  // an unknown family fails first
  const auto measure = [&evaluate](const std::string& name) {
    const CalibrationMeasure m = evaluate(parse_method(name));
    detail::require(std::isfinite(m.kl_answer_mean) && m.kl_answer_mean >= 0.0 && m.top1_agreement >= 0.0 &&
                        m.top1_agreement <= 1.0 && m.recompute_fraction >= 0.0 && m.recompute_fraction <= 2.0,
                    "calibrate: {} measured KL {}, top-1 {}, recomputed {} (need KL >= 0, top-1 in [0, 1], the "
                    "recomputed share in [0, 2]: a two-pass method, QueryProbe, counts both passes)",
                    name, m.kl_answer_mean, m.top1_agreement, m.recompute_fraction);
    return m;
  };
  Calibration c;
  c.model_fingerprint = model_fingerprint;
  c.family = std::string(family);
  c.budget = budget;
  c.naive = measure("naive");
  for (const std::string& name : settings) {
    const CalibrationMeasure m = measure(name);
    c.points.push_back({name, m, admits(budget, c.naive, m)});
    if (c.points.back().admitted) {
      c.chosen = name;
      break;
    }
  }
  return c;
}

// `auto`: across the families calibrated for one model at one budget, the admitted setting that recomputes least
// (the chosen point's recompute fraction on the sample prompts); nullopt when every family was refused.
[[nodiscard]] inline std::optional<std::string> cheapest_admitted(std::span<const Calibration> calibrations) {
  std::optional<std::string> best;
  double best_fraction = 0.0;
  for (const Calibration& c : calibrations) {
    if (!c.chosen) continue;
    const double fraction = c.points.back().measure.recompute_fraction;  // the last point is the chosen one
    if (!best || fraction < best_fraction) {
      best = c.chosen;
      best_fraction = fraction;
    }
  }
  return best;
}

}  // namespace kvfuse
