#pragma once
// The one key scheme of every store entry kvfuse reads or writes. Every key carries the model fingerprint (KVKey::
// model: KV never crosses models); its content is a hash of token ids (hash_tokens, core/types.hpp), separated by
// domain so that entries of different kinds never collide:
//   chunk_cache_key      isolated = H(chunk): a chunk's KV computed alone at position 0 (CacheBlend, Epic);
//                        conditioned = H(chunk) seeded with H(context): computed behind a shared context
//                        (PromptLayout::chunk_context)
//   chained_prefix_key   prefix = H(chunk_0, ..., chunk_j) chained: chunk j's KV behind exactly the chunks before
//                        it (a prefix-cache entry on a layout's chunk boundaries)
//   variant_key          variant = H(chunk, ids of its stored prefix): a Cache-Craft chunk-cache variant (§3.3)
//   prefix_chunk_keys    Cake's prefix entries on a fixed grid of `chunk` tokens (Cake appendix A step 2): the plain
//                        chained hash, as the loader and the serving loop look them up

#include <algorithm>
#include <cstdint>
#include <span>
#include <vector>

#include "kvfuse/core/error.hpp"
#include "kvfuse/core/types.hpp"

namespace kvfuse {

namespace detail {

// splitmix64 finalizer: separates the key domains (isolated / prefix / variant) of one content hash.
[[nodiscard]] constexpr std::uint64_t mix64(std::uint64_t x) noexcept {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

enum class KeyDomain : std::uint64_t { isolated = 1, prefix = 2, variant = 3, conditioned = 4 };

[[nodiscard]] constexpr std::uint64_t domain_key(std::uint64_t h, KeyDomain d) noexcept {
  return mix64(h ^ (static_cast<std::uint64_t>(d) << 56));
}

}  // namespace detail

// Content id of a chunk (Cache-Craft's chunk hash, VariantCache's key).
[[nodiscard]] inline std::uint64_t chunk_content_id(std::span<const token_id> chunk) { return hash_tokens(chunk); }

// `context`: the shared context the chunk's KV was computed behind (PromptLayout::chunk_context); empty: alone.
[[nodiscard]] inline KVKey chunk_cache_key(std::uint64_t model, std::span<const token_id> chunk,
                                           std::span<const token_id> context = {}) {
  if (context.empty()) return {model, detail::domain_key(hash_tokens(chunk), detail::KeyDomain::isolated)};
  return {model, detail::domain_key(hash_tokens(chunk, hash_tokens(context)), detail::KeyDomain::conditioned)};
}

// `chained`: hash_tokens of chunk j seeded with the chained hash of chunks 0 .. j − 1 (kHashSeed for chunk 0).
[[nodiscard]] constexpr KVKey chained_prefix_key(std::uint64_t model, std::uint64_t chained) noexcept {
  return {model, detail::domain_key(chained, detail::KeyDomain::prefix)};
}

[[nodiscard]] inline KVKey variant_key(std::uint64_t model, std::uint64_t chunk_id,
                                       std::span<const std::uint64_t> stored_prefix) {
  std::uint64_t h = detail::mix64(chunk_id);
  for (std::uint64_t id : stored_prefix) h = detail::mix64(h ^ id);
  return {model, detail::domain_key(h, detail::KeyDomain::variant)};
}

// Prefix keys of a prompt split on a fixed grid of `chunk` tokens (the last chunk may be shorter):
// key j identifies the KV of tokens [j*chunk, min((j+1)*chunk, n)) *given* tokens [0, j*chunk), which is
// what a prefix cache stores (Cake, appendix A step 2).
[[nodiscard]] inline std::vector<KVKey> prefix_chunk_keys(std::uint64_t model, std::span<const token_id> tokens,
                                                          std::int64_t chunk) {
  detail::require(chunk > 0, "prefix_chunk_keys: chunk size {} must be positive", chunk);
  std::vector<KVKey> keys;
  std::uint64_t h = kHashSeed;
  const auto n = static_cast<std::int64_t>(tokens.size());
  for (std::int64_t b = 0; b < n; b += chunk) {
    const std::int64_t e = std::min(n, b + chunk);
    h = hash_tokens(tokens.subspan(static_cast<std::size_t>(b), static_cast<std::size_t>(e - b)), h);
    keys.push_back({model, h});
  }
  return keys;
}

}  // namespace kvfuse
