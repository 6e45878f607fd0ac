#pragma once
// The one content hash kvfuse uses: 64-bit FNV-1a (Fowler–Noll–Vo), chained through `seed`. Token keys
// (hash_tokens, core/types.hpp), store-entry checksums (backend/disk_kv_store.hpp) and the CPU backend's
// model fingerprint all call fnv1a(). It detects corruption and tells contents apart; it is not a
// cryptographic hash. fmt-free and allocation-free.

#include <cstddef>
#include <cstdint>
#include <span>

namespace kvfuse {

// FNV-1a's 64-bit offset basis: the seed of an unchained hash.
inline constexpr std::uint64_t kFnvOffset = 0xcbf29ce484222325ull;

// 64-bit FNV-1a over `bytes`, continuing from `seed` (fnv1a(b, fnv1a(a)) == fnv1a(a ‖ b)).
[[nodiscard]] constexpr std::uint64_t fnv1a(std::span<const std::byte> bytes, std::uint64_t seed = kFnvOffset) noexcept {
  std::uint64_t h = seed;
  for (std::byte b : bytes) {
    h ^= static_cast<std::uint64_t>(b);
    h *= 0x100000001b3ull;  // FNV 64-bit prime
  }
  return h;
}

}  // namespace kvfuse
