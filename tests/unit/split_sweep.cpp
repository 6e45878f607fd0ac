// kvfuse-cake-run's coarse-to-fine sweep for the best static split (examples/split_sweep.hpp).
#include <doctest/doctest.h>

#include <algorithm>
#include <bit>
#include <cstdint>
#include <limits>
#include <vector>

#include "../../examples/split_sweep.hpp"

namespace unit_split_sweep {
namespace {

// A static split's TTFT as the model of it: the later of computing [0, s) and loading [s, stored).
struct Split {
  double compute_call_s, compute_token_s, load_token_s;
  std::int64_t stored, chunk;
  double operator()(std::int64_t s) const {
    const double compute = static_cast<double>((s + chunk - 1) / chunk) * compute_call_s +
                           static_cast<double>(s) * compute_token_s;
    return std::max(compute, static_cast<double>(stored - s) * load_token_s);
  }
};

double exhaustive_min(const Split& f, std::int64_t fetch_chunk) {
  double best = std::numeric_limits<double>::infinity();
  for (std::int64_t s = 0; s <= f.stored; s += fetch_chunk) best = std::min(best, f(s));
  return best;
}

}  // namespace

TEST_CASE("the split sweep finds every split's minimum on the fetch grid with a fraction of the runs, at every link") {
  for (const std::int64_t stored : {1024, 2048, 4096}) {
    for (const double mbps : {2.0, 4.0, 8.0, 15.0, 30.0, 60.0, 120.0}) {
      const double load_token_s = 46080.0 / (mbps * 1e6);  // SmolLM2's fp32 KV per token over the link
      const Split f{0.08, 0.0021, load_token_s, stored, 112};
      std::int64_t runs = 0;
      const kvfuse_example::SplitSweep s = kvfuse_example::sweep_static_splits(stored, 16, load_token_s, [&](std::int64_t split) {
        ++runs;
        return f(split);
      });
      CAPTURE(stored);
      CAPTURE(mbps);
      CHECK(s.best_s == exhaustive_min(f, 16));
      CHECK(f(s.best_split) == s.best_s);
      CHECK(s.runs == runs);
      CHECK(runs <= 2 * (std::bit_width(static_cast<std::uint64_t>(stored / 16)) + 4));  // 65 splits: <= 22 runs
    }
  }
}

TEST_CASE("the split sweep never runs a split whose load alone is slower than the best time measured so far") {
  const double load_token_s = 46080.0 / 2e6;  // 2 MB/s: loading the whole 1K prefix takes 23.6 s
  const Split f{0.08, 0.0021, load_token_s, 1024, 112};
  double best = std::numeric_limits<double>::infinity();
  const kvfuse_example::SplitSweep s = kvfuse_example::sweep_static_splits(1024, 16, load_token_s, [&](std::int64_t split) {
    CHECK(static_cast<double>(1024 - split) * load_token_s < best);
    best = std::min(best, f(split));
    return f(split);
  });
  CHECK(s.skipped > 0);
  CHECK(s.best_s == exhaustive_min(f, 16));
}

TEST_CASE("the split sweep runs the one split of a prefix shorter than a fetch chunk, and refuses a prefix off its grid") {
  std::vector<std::int64_t> splits;
  const kvfuse_example::SplitSweep s = kvfuse_example::sweep_static_splits(0, 16, 0.001, [&](std::int64_t split) {
    splits.push_back(split);
    return 0.5;
  });
  CHECK(splits == std::vector<std::int64_t>{0});
  CHECK(s.best_split == 0);
  CHECK(s.best_s == 0.5);
  CHECK_THROWS_WITH(kvfuse_example::sweep_static_splits(1000, 16, 0.0, [](std::int64_t) { return 1.0; }),
                    doctest::Contains("stored 1000 is not a multiple of the fetch chunk 16"));
}

}  // namespace unit_split_sweep
