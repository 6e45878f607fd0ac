#pragma once
// Key math of the deterministic top-k over per-token scores (CacheBlend section 4.3: keep the tokens of
// highest KV deviation, ties to the lower position), shared by the CPU reference (kvfuse::ref, the test harness) and the
// CUDA radix select (kernels/include/kvfuse/cuda/kv_topk.cuh).
//
// Every token i with score s gets the unique 64-bit key
//     key(s, i) = (orderable_bits(s) << 32) | (0xFFFFFFFF - i),
// so "higher score first, equal scores to the lower index" is plain unsigned order of keys, and the k tokens
// to keep are exactly the k largest keys: no tie logic anywhere. The radix select finds the k-th largest key
// digit by digit from the top (radix_pass_shift / radix_pass_bits), and the selection is every key >= it.
//
// The order is detail::ranks_before (detail/math.hpp), kvfuse's one top-k order, encoded as a key: every NaN
// (any sign or payload) ranks above +inf, so a token whose recomputed or cached row holds a NaN or an inf is
// recomputed first (a corrupted cached row gets overwritten); NaNs tie with each other and go to the lower
// index; -0.0 and +0.0 are the same score. A unit test checks key order == ranks_before on special values.
//
// fmt-free and CUDA-free: kernels include it.

#include <cmath>
#include <cstdint>

#include "kvfuse/core/config.hpp"
#include "kvfuse/core/dtype.hpp"

namespace kvfuse::detail {

// Largest index a key can hold: indices are < 2^31 (the top-k output is int32).
inline constexpr std::int64_t top_k_max_items = 0x7FFFFFFF;

// Order-preserving map float -> uint32: a < b  <=>  orderable_bits(a) < orderable_bits(b) for non-NaN a, b;
// -0.0 maps like +0.0; every NaN maps to 0xFFFFFFFF, above +inf (0xFF800000).
KVFUSE_HOST_DEVICE std::uint32_t orderable_bits(float f) {
  std::uint32_t u = float_bits(f);
  if ((u & 0x7FFFFFFFu) > 0x7F800000u) return 0xFFFFFFFFu;  // NaN
  if (u == 0x80000000u) u = 0u;                             // -0.0 -> +0.0
  // Non-negative floats: set the sign bit (they sort above every negative); negative: flip all bits.
  return (u & 0x80000000u) != 0 ? ~u : (u | 0x80000000u);
}

// The unique key of token `index` (0 <= index <= top_k_max_items) with score `score`: larger key = ranks
// first (higher score, or equal score and lower index).
KVFUSE_HOST_DEVICE std::uint64_t top_k_key(float score, std::int64_t index) {
  return (static_cast<std::uint64_t>(orderable_bits(score)) << 32) |
         static_cast<std::uint64_t>(0xFFFFFFFFu - static_cast<std::uint32_t>(index));
}

// CacheBlend section 4.3 gradual filtering over a token set S_l (HKVDSelector::select): the rows that must
// always stay (the query, chunks without stored KV) are kept outside the ranking, and of the other entries
// (the candidates) the `keep` of highest score survive. On the top-k keys: entry i ranks with
// hkvd_rank_score, its own score for a candidate and -inf for a mandatory entry; candidate scores are >= 0 or
// NaN (HKVDSelector refuses negative ones), so every candidate key lies above every mandatory key and the
// min(keep, |S_l|) largest keys hold the `keep` best candidates (all of them when there are fewer). Entry i
// is in S_{l+1} iff hkvd_kept: mandatory, or its key is at least the k-th largest (`threshold`, when k > 0).
KVFUSE_HOST_DEVICE float hkvd_rank_score(float score, bool mandatory) { return mandatory ? -INFINITY : score; }

KVFUSE_HOST_DEVICE bool hkvd_kept(bool mandatory, std::uint64_t key, bool any_ranked, std::uint64_t threshold) {
  return mandatory || (any_ranked && key >= threshold);
}

// The radix select's passes over the 64-bit key, most significant digit first: 11, 11, 10 bits over the
// score half, then 11, 11, 10 over the index half. Distinct scores are resolved after at most three passes;
// ties continue into the index bits. Shared-memory histograms of 2048 bins.
inline constexpr int radix_passes = 6;
inline constexpr int radix_max_bins = 1 << 11;

// Lowest bit of pass `pass`'s digit: 53, 42, 32, 21, 10, 0.
KVFUSE_HOST_DEVICE int radix_pass_shift(int pass) {
  const int within = pass % 3;
  return (pass < 3 ? 32 : 0) + (within == 0 ? 21 : within == 1 ? 10 : 0);
}

KVFUSE_HOST_DEVICE int radix_pass_bits(int pass) { return (pass % 3) == 2 ? 10 : 11; }

// The bits above pass `pass`'s digit (the prefix a key must match to be a candidate of that pass).
KVFUSE_HOST_DEVICE std::uint64_t radix_prefix_mask(int pass) {
  const int low = radix_pass_shift(pass) + radix_pass_bits(pass);
  return low >= 64 ? 0ull : ~((1ull << low) - 1ull);
}

// Digit of `key` in pass `pass`: bits [shift, shift + bits).
KVFUSE_HOST_DEVICE std::uint32_t radix_digit(std::uint64_t key, int pass) {
  return static_cast<std::uint32_t>(key >> radix_pass_shift(pass)) & ((1u << radix_pass_bits(pass)) - 1u);
}

// One step of the select, after the histogram `hist` of the pass's digit over the candidates (keys matching
// `prefix` under radix_prefix_mask(pass)): finds the digit holding the `remaining`-th largest candidate
// (1 <= remaining <= number of candidates), adds it to `prefix`, subtracts the candidates of higher digits
// from `remaining`, and returns true when that digit's candidates are all selected (its count equals the new
// `remaining`): then every key >= `prefix` (lower bits zero) is selected, exactly k of them. The GPU runs
// the same rule with a parallel scan over the bins.
KVFUSE_HOST_DEVICE bool radix_select_step(const std::uint32_t* hist, int pass, std::uint64_t& prefix,
                                          std::uint32_t& remaining) {
  const int bins = 1 << radix_pass_bits(pass);
  std::uint32_t above = 0;
  for (int b = bins - 1; b >= 0; --b) {
    const std::uint32_t count = hist[b];
    if (above + count >= remaining) {
      prefix |= static_cast<std::uint64_t>(b) << radix_pass_shift(pass);
      remaining -= above;
      return count == remaining;
    }
    above += count;
  }
  return true;  // unreachable when remaining <= number of candidates
}

}  // namespace kvfuse::detail
