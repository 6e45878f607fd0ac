#pragma once
// TokenBudgetScheduler — Cake's adaptive token-budget scheduling (Cake, ICML 2025: sections 3 and 5.4).
//
// What it does: splits one engine step's token budget between requests: first one token to every
// decode request, then chunked prefill of requests without a prefix-cache hit (first come, first
// served), and only what is left to the compute side of Cake requests (prefix-cache prefill). The share
// a Cake request gets (its tokens / budget) is the GPU share its BidirectionalLoader sees; the loads
// proceed regardless, so a busy GPU shifts the meeting point toward the front instead of stalling.
//
// When to use it: in the engine's step loop when Cake requests are served next to other traffic. With
// no Cake requests it is vLLM's chunked-prefill policy (decode first, then prefill).
//
// Default from the paper: budget 512 tokens per step.

#include <cstdint>
#include <span>
#include <vector>

#include "kvfuse/core/error.hpp"

namespace kvfuse {

struct TokenBudgetConfig {
  std::int64_t token_budget = 512;

  void validate() const {
    detail::require(token_budget > 0, "TokenBudgetConfig: token_budget = {} must be > 0", token_budget);
  }
};

struct PrefillRequest {
  std::uint64_t id = 0;
  std::int64_t remaining_tokens = 0;  // tokens of the prompt still to compute
  bool cached_prefix = false;         // true: a Cake request (its KV is also being loaded from the back)
};

enum class BudgetUse { decode, prefill, cached_prefill };

struct BudgetAllocation {
  std::uint64_t id = 0;
  std::int64_t tokens = 0;
  BudgetUse use = BudgetUse::decode;
};

struct StepPlan {
  std::int64_t token_budget = 0;
  std::vector<BudgetAllocation> allocations;  // in priority order
  std::int64_t used_tokens = 0;

  // Fraction of the step's budget that went to Cake requests (their GPU share this step).
  [[nodiscard]] double cached_prefill_share() const noexcept {
    std::int64_t cake = 0;
    for (const auto& a : allocations)
      if (a.use == BudgetUse::cached_prefill) cake += a.tokens;
    return static_cast<double>(cake) / static_cast<double>(token_budget);
  }
};

class TokenBudgetScheduler {
 public:
  explicit TokenBudgetScheduler(TokenBudgetConfig cfg = {}) : cfg_(cfg) { cfg_.validate(); }

  // One step: `decodes` are the ids of running decode requests (one token each, in order); `prefills`
  // are waiting prefill requests in arrival order. Requests that get no tokens wait for the next step.
  [[nodiscard]] StepPlan plan_step(std::span<const std::uint64_t> decodes,
                                   std::span<const PrefillRequest> prefills) const {
    StepPlan plan;
    plan.token_budget = cfg_.token_budget;
    std::int64_t left = cfg_.token_budget;
    for (std::uint64_t id : decodes) {
      if (left == 0) break;
      plan.allocations.push_back({id, 1, BudgetUse::decode});
      --left;
    }
    for (bool cake_pass : {false, true}) {
      for (const PrefillRequest& p : prefills) {
        detail::require(p.remaining_tokens >= 0, "TokenBudgetScheduler: request {} has {} remaining tokens", p.id,
                        p.remaining_tokens);
        if (p.cached_prefix != cake_pass || p.remaining_tokens == 0 || left == 0) continue;
        const std::int64_t take = std::min(left, p.remaining_tokens);
        plan.allocations.push_back({p.id, take, cake_pass ? BudgetUse::cached_prefill : BudgetUse::prefill});
        left -= take;
      }
    }
    plan.used_tokens = cfg_.token_budget - left;
    return plan;
  }

  [[nodiscard]] const TokenBudgetConfig& config() const noexcept { return cfg_; }

 private:
  TokenBudgetConfig cfg_;
};

}  // namespace kvfuse
