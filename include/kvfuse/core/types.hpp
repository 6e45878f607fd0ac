#pragma once
// Vocabulary types: token ids, half-open token ranges, chunks, store keys and KV blocks.

#include <algorithm>
#include <cstddef>
#include <bit>
#include <cstdint>
#include <functional>
#include <span>
#include <vector>

#include <fmt/format.h>

#include "kvfuse/core/error.hpp"
#include "kvfuse/core/hash.hpp"

namespace kvfuse {

using token_id = std::int32_t;

// Half-open range [begin, end) of token positions in a prompt.
struct TokenRange {
  std::int64_t begin = 0;
  std::int64_t end = 0;

  [[nodiscard]] constexpr std::int64_t size() const noexcept { return end - begin; }
  [[nodiscard]] constexpr bool empty() const noexcept { return end <= begin; }
  [[nodiscard]] constexpr bool contains(std::int64_t pos) const noexcept { return pos >= begin && pos < end; }
  friend constexpr bool operator==(const TokenRange&, const TokenRange&) = default;
};

// Checks that `r` is a well-formed sub-range of [0, n).
inline void validate_range(TokenRange r, std::int64_t n, const char* what) {
  detail::require(r.begin >= 0 && r.begin <= r.end && r.end <= n,
                  "{}: token range [{}, {}) is not inside [0, {})", what, r.begin, r.end, n);
}

// The piece of [begin, end) that starts at `begin` and ends at the next multiple of `chunk` (or `end`):
// walking a range on a fixed chunk grid, as chunked prefill and prefix caches do.
[[nodiscard]] constexpr TokenRange grid_chunk(std::int64_t begin, std::int64_t end, std::int64_t chunk) noexcept {
  return {begin, std::min(end, (begin / chunk + 1) * chunk)};
}

// Key of a stored KV entry: which model produced it and which token content it covers.
// `content` is a content hash (chunk hash, or chained prefix hash for prefix caches).
struct KVKey {
  std::uint64_t model = 0;
  std::uint64_t content = 0;
  friend constexpr bool operator==(const KVKey&, const KVKey&) = default;
};

struct KVKeyHash {
  std::size_t operator()(const KVKey& k) const noexcept {
    return static_cast<std::size_t>(k.model * 0x9E3779B97F4A7C15ull ^ k.content);
  }
};

// Where the KV of a run of prompt tokens comes from. One vocabulary for Cake's loader (compute from the
// front, prefix-cache entries loaded from the back) and the fusion plans (chunk caches reused anywhere).
enum class KVSource {
  compute,   // computed for this prompt (prefill of the tokens, or recompute of every token of a chunk)
  prefix,    // a prefix-cache entry: computed behind exactly the tokens before it here (exact KV)
  isolated,  // a chunk's own cache, computed alone at its stored positions (naive, CacheBlend, AttnLink)
  variant,   // a Cache-Craft variant: the chunk computed behind some earlier prompt's chunks
};

// KV of a run of tokens as opaque bytes, in the engine's own layout. Engines that store K rotated (RoPE)
// record the positions it was computed at, first_position .. first_position + num_tokens - 1, so that
// reusing the block at other positions is one RoPE shift by the difference.
struct KVBlock {
  std::int64_t num_tokens = 0;
  std::vector<std::byte> bytes;
  std::int64_t first_position = 0;
};

// An entry of a ranged store as describe() sees it, before any payload byte is read (RangedKVStore).
struct KVBlockInfo {
  std::int64_t num_tokens = 0;
  std::int64_t first_position = 0;
  std::uint64_t bytes = 0;    // payload size: KVBlock::bytes.size()
  std::uint64_t version = 0;  // identifies this entry's contents: ranged reads of a replaced entry fail
  std::uint32_t tier = 0;     // which tier of a tiered store holds it (TieredKVStore: its index, fastest first); else 0
};

// Content hash of token ids: xxh3 (core/hash.hpp) over each id's 4 bytes, least significant first, so the
// key does not depend on the host's byte order. Chained: hash_tokens(tokens, seed) seeds with `seed`.
// Chunk keys use seed = kHashSeed; prefix keys chain chunk by chunk so key j covers tokens [0, end_j).
[[nodiscard]] inline std::uint64_t hash_tokens(std::span<const token_id> tokens,
                                               std::uint64_t seed = kHashSeed) noexcept {
  if constexpr (std::endian::native == std::endian::little) {
    return xxh3(std::as_bytes(tokens), seed);
  } else {
    Xxh3Stream h(seed);
    for (token_id t : tokens) {
      const auto u = static_cast<std::uint32_t>(t);
      const std::byte le[4] = {std::byte(u & 0xffu), std::byte((u >> 8) & 0xffu), std::byte((u >> 16) & 0xffu),
                               std::byte(u >> 24)};
      h.update(le);
    }
    return h.digest();
  }
}

// Index of the largest logit (greedy decoding's token), the lowest index among equals.
[[nodiscard]] inline token_id argmax_token(std::span<const float> logits) {
  detail::require(!logits.empty(), "argmax_token: no logits");
  std::size_t best = 0;
  for (std::size_t i = 1; i < logits.size(); ++i)
    if (logits[i] > logits[best]) best = i;
  return static_cast<token_id>(best);
}

}  // namespace kvfuse

template <>
struct fmt::formatter<kvfuse::TokenRange> : fmt::formatter<std::string_view> {
  auto format(const kvfuse::TokenRange& r, format_context& ctx) const {
    return fmt::format_to(ctx.out(), "[{}, {})", r.begin, r.end);
  }
};
