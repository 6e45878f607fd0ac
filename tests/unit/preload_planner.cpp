// PreloadPlanner: Cache-Craft section 3.4.2, eq. 16 and Algorithm 2. Expected depths and timelines are
// worked out by hand (comments) with integer times, so every time is exact.
// Eq. 16: L_p = max(1, (L - 1)(1 - T_prefill / T_load) + 1); no gaps iff (L - L_p) T_load <= (L - 1) T_prefill.
#include <doctest/doctest.h>

#include <cmath>
#include <limits>
#include <vector>

#include "kvfuse/core/error.hpp"
#include "kvfuse/schedule/preload_planner.hpp"

// Each unit test file lives in its own namespace: the files are compiled together (a unity build).
namespace unit_preload_planner {

namespace {

using kvfuse::PreloadConfig;
using kvfuse::PreloadPlan;
using kvfuse::PreloadPlanner;

struct Row {
  double issue, load_start, load_finish, compute_start, compute_finish;
};

void check_timeline(const PreloadPlan& plan, const std::vector<Row>& rows) {
  REQUIRE(plan.layers.size() == rows.size());
  for (std::size_t i = 0; i < rows.size(); ++i) {
    CAPTURE(i);
    CHECK(plan.layers[i].layer == i);
    CHECK(plan.layers[i].load_issue == rows[i].issue);
    CHECK(plan.layers[i].load_start == rows[i].load_start);
    CHECK(plan.layers[i].load_finish == rows[i].load_finish);
    CHECK(plan.layers[i].compute_start == rows[i].compute_start);
    CHECK(plan.layers[i].compute_finish == rows[i].compute_finish);
  }
}

}  // namespace

TEST_CASE("PreloadPlanner: Fig. 19, L = 5 and T_prefill : T_load = 1 : 2 preloads 3 layers without gaps") {
  // L_p = (5 - 1)(1 - 1/2) + 1 = 3.
  const PreloadPlanner planner(PreloadConfig{5, 1.0, 2.0});
  CHECK(planner.exact_depth() == 3.0);
  CHECK(planner.depth() == 3);

  // Iteration 0 issues layers 0..3 at t = 0; loads run back to back: [0,2] [2,4] [4,6] [6,8].
  // Layer 0 computes once L_p = 3 layers are loaded: [6,7]; then [7,8], [8,9], [9,10] (layer 3 loaded at 8).
  // Iteration 1 begins at 7 (layer 0 done) and issues layer 4: starts when the stream frees at 8, [8,10];
  // layer 4 computes [10,11]. No gaps; makespan 11 = 5 loads of 2 + 1 compute.
  const PreloadPlan plan = planner.plan();
  CHECK(plan.depth == 3);
  CHECK(plan.buffer_layers == 4);  // layers i..i+L_p
  check_timeline(plan, {{0, 0, 2, 6, 7}, {0, 2, 4, 7, 8}, {0, 4, 6, 8, 9}, {0, 6, 8, 9, 10}, {7, 8, 10, 10, 11}});
  CHECK(plan.initial_wait == 6.0);
  CHECK(plan.gap_time == 0.0);
  CHECK(plan.makespan == 11.0);
}

TEST_CASE("PreloadPlanner: shallower preloading than eq. 16 leaves execution gaps") {
  const PreloadPlanner planner(PreloadConfig{5, 1.0, 2.0});

  // L_p = 1: iteration 0 issues layers 0, 1: loads [0,2] [2,4]; layer 0 computes [2,3].
  // Iteration 1 (t = 3) issues layer 2: [4,6]; layer 1 computes max(3, 4) = 4: [4,5], gap 1.
  // Iteration 2 (t = 5) issues layer 3: [6,8]; layer 2 computes [6,7], gap 1.
  // Iteration 3 (t = 7) issues layer 4: [8,10]; layer 3 computes [8,9], gap 1; layer 4 [10,11], gap 1.
  const PreloadPlan one = planner.plan(1);
  CHECK(one.buffer_layers == 2);
  check_timeline(one, {{0, 0, 2, 2, 3}, {0, 2, 4, 4, 5}, {3, 4, 6, 6, 7}, {5, 6, 8, 8, 9}, {7, 8, 10, 10, 11}});
  CHECK(one.initial_wait == 2.0);
  CHECK(one.gap_time == 4.0);
  CHECK(one.makespan == 11.0);

  // L_p = 2: iteration 0 issues layers 0..2: [0,2] [2,4] [4,6]; layer 0 computes after 2 loads: [4,5];
  // layer 1 [5,6]; layer 2 [6,7]. Iteration 1 (t = 5) issues layer 3: [6,8], computes [8,9], gap 1.
  // Iteration 2 (t = 6) issues layer 4: [8,10], computes [10,11], gap 1.
  const PreloadPlan two = planner.plan(2);
  check_timeline(two, {{0, 0, 2, 4, 5}, {0, 2, 4, 5, 6}, {0, 4, 6, 6, 7}, {5, 6, 8, 8, 9}, {6, 8, 10, 10, 11}});
  CHECK(two.initial_wait == 4.0);
  CHECK(two.gap_time == 2.0);
}

TEST_CASE("PreloadPlanner: loading faster than compute preloads one layer") {
  // T_prefill = 2 > T_load = 1: eq. 16 gives 3 (1 - 2) + 1 = -2, Algorithm 2 line 1 clamps it to 1.
  const PreloadPlanner planner(PreloadConfig{4, 2.0, 1.0});
  CHECK(planner.exact_depth() == 1.0);
  CHECK(planner.depth() == 1);

  // Iteration 0 issues layers 0, 1: [0,1] [1,2]; layer 0 computes [1,3]. Iteration 1 (t = 3) issues
  // layer 2: [3,4]; layer 1 computes [3,5]. Iteration 2 (t = 5): layer 3 [5,6]; layer 2 [5,7]; layer 3 [7,9].
  const PreloadPlan plan = planner.plan();
  check_timeline(plan, {{0, 0, 1, 1, 3}, {0, 1, 2, 3, 5}, {3, 3, 4, 5, 7}, {5, 5, 6, 7, 9}});
  CHECK(plan.gap_time == 0.0);
  CHECK(plan.makespan == 9.0);

  // Equal times: T_prefill >= T_load, one layer.
  CHECK(PreloadPlanner(PreloadConfig{32, 1.5, 1.5}).depth() == 1);
  CHECK(PreloadPlanner(PreloadConfig{32, 1.5, 1.5}).plan().gap_time == 0.0);
}

TEST_CASE("PreloadPlanner: non-integer eq. 16 rounds up to the fewest gap-free layers") {
  // L = 32, 1 : 4: L_p = 31 (1 - 1/4) + 1 = 24.25 -> 25 (the paper preloads 24 of 32 on SSD, Fig. 29).
  // 25: (32 - 25) 4 = 28 <= 31 -> no gaps; 24: (32 - 24) 4 = 32 > 31 -> a gap.
  const PreloadPlanner planner(PreloadConfig{32, 1.0, 4.0});
  CHECK(planner.exact_depth() == doctest::Approx(24.25));
  CHECK(planner.depth() == 25);
  const PreloadPlan p25 = planner.plan();
  CHECK(p25.gap_time == 0.0);
  CHECK(p25.initial_wait == 100.0);  // 25 loads of 4
  CHECK(p25.makespan == 132.0);      // then 32 back-to-back layers
  // 24: compute starts at 96, layer i would start at 96 + i, but layer 31 is loaded only at 4 * 32 = 128:
  // one unit of gap before the last layer; makespan 128 + 1.
  const PreloadPlan p24 = planner.plan(24);
  CHECK(p24.gap_time == 1.0);
  CHECK(p24.makespan == 129.0);

  // L = 10, 1 : 3: 9 (1 - 1/3) + 1 = 7 exactly; the floating quotient is 7.000000000000001, and a plain
  // ceil of it would say 8. (10 - 7) 3 = 9 <= 9: 7 is gap-free; (10 - 6) 3 = 12 > 9: 6 is not.
  const PreloadPlanner exact(PreloadConfig{10, 1.0, 3.0});
  CHECK(exact.depth() == 7);
  CHECK(exact.plan().gap_time == 0.0);
  CHECK(exact.plan(6).gap_time > 0.0);

  // L = 4, 0.3 : 0.9: 3 (1 - 1/3) + 1 = 3 in decimals, but in doubles 3 * 0.3 = 0.8999999999999999 < 0.9;
  // the relative slack keeps it at 3 rather than 4.
  CHECK(PreloadPlanner(PreloadConfig{4, 0.3, 0.9}).depth() == 3);
}

TEST_CASE("PreloadPlanner: degenerate times") {
  // GPU-resident caches (T_load = 0): one layer, computes back to back from t = 0.
  const PreloadPlan resident = PreloadPlanner(PreloadConfig{3, 1.0, 0.0}).plan();
  CHECK(resident.depth == 1);
  check_timeline(resident, {{0, 0, 0, 0, 1}, {0, 0, 0, 1, 2}, {1, 1, 1, 2, 3}});

  // No compute (T_prefill = 0 < T_load = 1): L_p = (3 - 1)(1 - 0) + 1 = 3 = L, buffer = L layers.
  const PreloadPlanner load_only(PreloadConfig{3, 0.0, 1.0});
  CHECK(load_only.exact_depth() == 3.0);
  const PreloadPlan lo = load_only.plan();
  CHECK(lo.depth == 3);
  CHECK(lo.buffer_layers == 3);
  check_timeline(lo, {{0, 0, 1, 3, 3}, {0, 1, 2, 3, 3}, {0, 2, 3, 3, 3}});

  // Both zero, and the defaults (32 layers, no timing known): one layer ahead, everything at t = 0.
  CHECK(PreloadPlanner(PreloadConfig{4, 0.0, 0.0}).plan().makespan == 0.0);
  const PreloadPlanner defaults;
  CHECK(defaults.config().num_layers == 32);
  CHECK(defaults.depth() == 1);
  CHECK(defaults.plan().layers.size() == 32);

  // One layer: (1 - 1)(...) + 1 = 1; the buffer holds the single layer.
  const PreloadPlan single = PreloadPlanner(PreloadConfig{1, 1.0, 5.0}).plan();
  CHECK(single.depth == 1);
  CHECK(single.buffer_layers == 1);
  check_timeline(single, {{0, 0, 5, 5, 6}});
}

TEST_CASE("PreloadPlanner: bad config and depth throw kvfuse::error naming the value") {
  CHECK_THROWS_AS(PreloadPlanner(PreloadConfig{0, 1.0, 1.0}), kvfuse::error);
  CHECK_THROWS_WITH_AS(PreloadPlanner(PreloadConfig{0, 1.0, 1.0}), doctest::Contains("num_layers = 0"), kvfuse::error);
  CHECK_THROWS_WITH_AS(PreloadPlanner(PreloadConfig{4, -1.0, 1.0}),
                       doctest::Contains("compute_time_per_layer = -1"), kvfuse::error);
  CHECK_THROWS_WITH_AS(PreloadPlanner(PreloadConfig{4, 1.0, std::numeric_limits<double>::quiet_NaN()}),
                       doctest::Contains("load_time_per_layer = nan"), kvfuse::error);
  CHECK_THROWS_WITH_AS(PreloadPlanner(PreloadConfig{4, 1.0, std::numeric_limits<double>::infinity()}),
                       doctest::Contains("load_time_per_layer = inf"), kvfuse::error);

  const PreloadPlanner planner(PreloadConfig{5, 1.0, 2.0});
  CHECK_THROWS_WITH_AS((void)planner.plan(0), doctest::Contains("depth = 0"), kvfuse::error);
  CHECK_THROWS_WITH_AS((void)planner.plan(6),
                       doctest::Contains("depth = 6 must be in [1, num_layers = 5]"), kvfuse::error);
}

}  // namespace unit_preload_planner
