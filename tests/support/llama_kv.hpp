#pragma once
// Helpers of the CPU backend's tests (cpu_llama.cpp, gemma3.cpp): every row selected, a cache's K and V
// flattened, and the check that rows need not be sorted by position.
#include <cstddef>
#include <cstdint>
#include <numeric>
#include <span>
#include <vector>

#include <doctest/doctest.h>

#include "kvfuse/backend/cpu_llama.hpp"

#include "test_util.hpp"

namespace kvfuse_test {

inline kvfuse::TokenSet all_rows(std::int64_t n) {
  kvfuse::TokenSet s(static_cast<std::size_t>(n));
  std::iota(s.begin(), s.end(), std::int64_t{0});
  return s;
}

// K and V of every layer, concatenated.
inline std::vector<float> flat_kv(const kvfuse::LlamaKVCache& kv) {
  std::vector<float> out;
  for (std::size_t l = 0; l < kv.k.size(); ++l) {
    out.insert(out.end(), kv.k[l].begin(), kv.k[l].end());
    out.insert(out.end(), kv.v[l].begin(), kv.v[l].end());
  }
  return out;
}

// Rows need not be sorted by position: `tokens` computed in reversed row order, every row selected (positions
// travel with the rows), give `full_kv`'s K per position (full prefill of `tokens`), to rounding.
inline void check_reversed_rows_equal_full(const kvfuse::CpuLlama& model, std::span<const kvfuse::token_id> tokens,
                                           const kvfuse::LlamaKVCache& full_kv) {
  const auto n = static_cast<std::int64_t>(tokens.size());
  const std::int64_t layers = model.config().n_layer;
  std::vector<kvfuse::token_id> reversed(tokens.rbegin(), tokens.rend());
  kvfuse::LlamaKVCache rev(layers, model.config().kv_dim(), n);
  for (std::int64_t r = 0; r < n; ++r) rev.positions[static_cast<std::size_t>(r)] = n - 1 - r;
  // partial_prefill needs the logits row last: select all rows; its logits are those of position 0.
  model.partial_prefill(reversed, rev, all_rows(n), {});
  for (std::int64_t r = 0; r < n; ++r)
    for (std::int64_t l = 0; l < layers; ++l) {
      const std::vector<float> got(rev.k_row(l, r), rev.k_row(l, r) + rev.kv_dim);
      const std::vector<float> want(full_kv.k_row(l, n - 1 - r), full_kv.k_row(l, n - 1 - r) + rev.kv_dim);
      CHECK(diff(got, want).rounding());
    }
}

}  // namespace kvfuse_test
