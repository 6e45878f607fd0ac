// The best static split of a Cake request, found coarse to fine (kvfuse-cake-run's baseline).
//
// A static split at s computes the stored prefix's tokens [0, s) from the front while it loads [s, stored) over the
// link; its TTFT is about the later of the two, the first growing with s and the second shrinking, so over the
// fetch grid it falls to one minimum and rises again. The sweep measures 8 to 16 evenly spaced splits, from the
// compute end down, then halves the step around the best until it is one fetch chunk: each halving keeps the
// minimum of a curve of that shape within the best ± the step. A split whose load alone takes longer than the best
// time measured so far is not run: the link's throttle (ThrottledKVStore) holds its bytes to their nominal time,
// which is a bound on that split's TTFT, not an estimate. On 1K tokens in 16-token fetch chunks that is about 15
// runs where every split is 65, and on 4K about 20 where every split is 257.
#pragma once

#include <algorithm>
#include <bit>
#include <cstdint>
#include <limits>
#include <set>

#include "kvfuse/core/error.hpp"

namespace kvfuse_example {

struct SplitSweep {
  std::int64_t best_split = 0;                            // tokens computed from the front at the best split
  double best_s = std::numeric_limits<double>::infinity();  // its measured TTFT
  std::int64_t runs = 0;                                  // splits run
  std::int64_t skipped = 0;                               // splits not run: their load alone was slower than best_s
};

// `run(split)` measures one static split and returns its TTFT in seconds; `load_token_s` is the link's nominal time
// per stored token (0: an unlimited link, nothing is skipped).
template <class Run>
SplitSweep sweep_static_splits(std::int64_t stored, std::int64_t fetch_chunk, double load_token_s, Run&& run) {
  kvfuse::require(fetch_chunk > 0 && stored >= 0 && stored % fetch_chunk == 0,
                  "sweep_static_splits: stored {} is not a multiple of the fetch chunk {}", stored, fetch_chunk);
  const std::int64_t grid = stored / fetch_chunk;  // the splits g * fetch_chunk, g = 0 .. grid
  SplitSweep out;
  out.best_split = stored;
  std::set<std::int64_t> seen;
  const auto try_at = [&](std::int64_t g) {
    if (g < 0 || g > grid || !seen.insert(g).second) return;
    const std::int64_t split = g * fetch_chunk;
    if (static_cast<double>(stored - split) * load_token_s >= out.best_s) {
      ++out.skipped;
      return;
    }
    const double t = run(split);
    ++out.runs;
    if (t < out.best_s) {
      out.best_s = t;
      out.best_split = split;
    }
  };
  std::int64_t step = static_cast<std::int64_t>(std::bit_floor(static_cast<std::uint64_t>(std::max<std::int64_t>(grid / 8, 1))));
  for (std::int64_t g = grid; g > 0; g -= step) try_at(g);  // the compute end first: its times bound the link's
  try_at(0);
  while (step > 1) {
    step /= 2;
    const std::int64_t best = out.best_split / fetch_chunk;
    try_at(best - step);
    try_at(best + step);
  }
  return out;
}

}  // namespace kvfuse_example
