// Simulated backends: the cost model and the time-varying trace, checked against hand computation.
#include <doctest/doctest.h>

#include "kvfuse/harness/simulated.hpp"

// Each unit test file lives in its own namespace: the files are compiled together (a unity build).
namespace unit_simulated_backends {

using namespace kvfuse;

TEST_CASE("ComputeCostModel: chunk i costs a + b*i, partial chunks their token fraction") {
  const ComputeCostModel cost{1.0, 2.0, 4};
  // [2,9): chunk 0 half (1 * 2/4 = 0.5) + chunk 1 whole (1 + 2 = 3) + chunk 2 quarter ((1 + 4) / 4 = 1.25).
  CHECK(cost.work_s({2, 9}) == doctest::Approx(4.75));
  CHECK(cost.work_s({0, 0}) == 0.0);
  CHECK_THROWS_WITH_AS(ComputeCostModel({-1.0, 0, 4}).validate(), doctest::Contains("a_s = -1"), error);
  CHECK_THROWS_WITH_AS(ComputeCostModel({1.0, 0, 0}).validate(), doctest::Contains("chunk_tokens = 0"), error);
}

TEST_CASE("ResourceTrace: work integrates the rate over the step function") {
  const ResourceTrace trace({{0.0, 1.0, 10.0}, {1.0, 0.5, 0.0}, {3.0, 0.25, 5.0}});
  const auto share = [](const TracePoint& p) { return p.gpu_share; };
  const auto bw = [](const TracePoint& p) { return p.bandwidth_gbps; };
  CHECK(trace.finish(0.0, 0.5, share) == doctest::Approx(0.5));
  // 1 unit in [0,1), then 0.5/s: 1 more unit by t = 3.
  CHECK(trace.finish(0.0, 2.0, share) == doctest::Approx(3.0));
  // from t = 2: 0.5 units by 3, then 0.25/s: 0.5 more by 5.
  CHECK(trace.finish(2.0, 1.0, share) == doctest::Approx(5.0));
  // bandwidth is 0 during [1,3): 10 units by t=1, the 11th at 3.2.
  CHECK(trace.finish(0.0, 11.0, bw) == doctest::Approx(3.2));
  CHECK(trace.at(2.5).gpu_share == 0.5);
  const ResourceTrace dead({{0.0, 1.0, 1.0}, {1.0, 0.0, 1.0}});
  CHECK_THROWS_WITH_AS((void)dead.finish(0.0, 2.0, share), doctest::Contains("rate is 0 from t = 1"), error);
}

TEST_CASE("ResourceTrace::parse: text form and its errors") {
  const ResourceTrace t = ResourceTrace::parse("# t_ms share gbps\n0 1 25\n\n500 0.5 7 # burst\n");
  REQUIRE(t.points().size() == 2);
  CHECK(t.points()[1].t_s == doctest::Approx(0.5));
  CHECK(t.points()[1].gpu_share == 0.5);
  CHECK(t.points()[1].bandwidth_gbps == 7.0);
  CHECK_THROWS_WITH_AS(ResourceTrace::parse("0 1 x7\n"), doctest::Contains("'x7' is not a number"), error);
  CHECK_THROWS_WITH_AS(ResourceTrace::parse("0 1\n"), doctest::Contains("got 2 values"), error);
  CHECK_THROWS_WITH_AS(ResourceTrace::parse("0 1.5 3\n"), doctest::Contains("gpu share 1.5"), error);
  CHECK_THROWS_WITH_AS(ResourceTrace::parse("5 1 3\n"), doctest::Contains("first point at t = 0.005"), error);
  CHECK_THROWS_WITH_AS(ResourceTrace::parse("0 1 3\n0 1 3\n"), doctest::Contains("not after"), error);
}

TEST_CASE("SimulatedStore: latency + bytes / bandwidth") {
  SimulatedStore store({0.5, 1000}, ResourceTrace::constant(1.0, 8e-6));  // 8 kbit/s = 1000 bytes/s
  CHECK(store.load_finish_s(KVKey{}, 3, 1.0) == doctest::Approx(1.0 + 0.5 + 3.0));
  store.put({1, 2}, KVBlock{3, {}});
  CHECK(store.contains({1, 2}));
  CHECK(store.erase({1, 2}));
  CHECK_FALSE(store.get({1, 2}));
}

TEST_CASE("SimulatedCompute refuses to compute before the prefix is resident") {
  SimulatedCompute compute({1.0, 0.0, 4}, ResourceTrace::constant(1, 1));
  compute.compute_kv({0, 4});
  CHECK_THROWS_WITH_AS(compute.compute_kv({8, 12}), doctest::Contains("only [0, 4) is resident"), error);
  compute.install_kv({4, 8}, KVBlock{4, {}});
  compute.compute_kv({8, 12});
  CHECK(compute.resident_prefix() == 12);
  CHECK_THROWS_WITH_AS(compute.install_kv({12, 14}, KVBlock{3, {}}), doctest::Contains("block of 3 tokens"), error);
}

}  // namespace unit_simulated_backends
