// Cake's adaptive token-budget scheduling: decode first, then plain prefill, then Cake prefill.
#include <doctest/doctest.h>

#include "kvfuse/schedule/token_budget_scheduler.hpp"

// Each unit test file lives in its own namespace: the files are compiled together (a unity build).
namespace unit_token_budget_scheduler {

using namespace kvfuse;

TEST_CASE("decode first, then plain prefill FCFS, then the cached-prefix (Cake) prefill") {
  const std::vector<std::uint64_t> decodes{1, 2, 3};
  const std::vector<PrefillRequest> prefills{{10, 100, true}, {11, 3, false}, {12, 5, false}};
  SUBCASE("tight budget: Cake gets nothing") {
    const StepPlan p = TokenBudgetScheduler({8}).plan_step(decodes, prefills);
    REQUIRE(p.allocations.size() == 5);
    CHECK(p.allocations[3].id == 11);
    CHECK(p.allocations[3].tokens == 3);
    CHECK(p.allocations[4].id == 12);
    CHECK(p.allocations[4].tokens == 2);
    CHECK(p.used_tokens == 8);
    CHECK(p.cached_prefill_share() == 0.0);
  }
  SUBCASE("what is left goes to Cake and is its GPU share") {
    const StepPlan p = TokenBudgetScheduler({16}).plan_step(decodes, prefills);
    REQUIRE(p.allocations.size() == 6);
    CHECK(p.allocations[5].id == 10);
    CHECK(p.allocations[5].use == BudgetUse::cached_prefill);
    CHECK(p.allocations[5].tokens == 16 - 3 - 3 - 5);
    CHECK(p.cached_prefill_share() == doctest::Approx(5.0 / 16.0));
  }
  SUBCASE("more decodes than budget: the rest wait") {
    const std::vector<std::uint64_t> many{1, 2, 3, 4, 5};
    const StepPlan p = TokenBudgetScheduler({4}).plan_step(many, prefills);
    CHECK(p.allocations.size() == 4);
    CHECK(p.used_tokens == 4);
  }
  SUBCASE("idle engine: the default budget of 512 all goes to Cake") {
    const std::vector<PrefillRequest> cake{{7, 16384, true}};
    const StepPlan p = TokenBudgetScheduler().plan_step({}, cake);
    CHECK(p.cached_prefill_share() == 1.0);
  }
}

TEST_CASE("bad input is refused") {
  CHECK_THROWS_WITH_AS(TokenBudgetScheduler({0}), doctest::Contains("token_budget = 0"), error);
  const std::vector<PrefillRequest> bad{{9, -1, false}};
  CHECK_THROWS_WITH_AS((void)TokenBudgetScheduler().plan_step({}, bad), doctest::Contains("request 9 has -1"), error);
}

}  // namespace unit_token_budget_scheduler
