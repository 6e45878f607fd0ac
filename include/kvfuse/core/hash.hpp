#pragma once
// The one content hash kvfuse uses: XXH3-64 (xxHash, used header-only), seeded. Token keys (hash_tokens,
// core/types.hpp), store-entry checksums (backend/kv_entry.hpp), model fingerprints and calibration file names
// all call xxh3() or Xxh3Stream. It detects corruption and tells contents apart at several GB/s; it is not a
// cryptographic hash. fmt-free and allocation-free.

#include <cstddef>
#include <cstdint>
#include <span>

#ifndef XXH_INLINE_ALL
#define XXH_INLINE_ALL
#endif
#include <xxhash.h>

namespace kvfuse {

// The seed of an unchained hash. Chaining passes one hash as the seed of the next: xxh3(b, xxh3(a)).
inline constexpr std::uint64_t kHashSeed = 0;

// XXH3-64 of `bytes` with `seed`.
[[nodiscard]] inline std::uint64_t xxh3(std::span<const std::byte> bytes, std::uint64_t seed = kHashSeed) noexcept {
  return XXH3_64bits_withSeed(bytes.data(), bytes.size(), seed);
}

// XXH3-64 of a sequence of byte spans, as if concatenated (model weights tensor by tensor, a file block by block).
class Xxh3Stream {
 public:
  explicit Xxh3Stream(std::uint64_t seed = kHashSeed) noexcept { XXH3_64bits_reset_withSeed(&state_, seed); }
  Xxh3Stream& update(std::span<const std::byte> bytes) noexcept {
    XXH3_64bits_update(&state_, bytes.data(), bytes.size());
    return *this;
  }
  template <class T>
  Xxh3Stream& update_value(const T& value) noexcept {
    return update(std::as_bytes(std::span(&value, 1)));
  }
  [[nodiscard]] std::uint64_t digest() const noexcept { return XXH3_64bits_digest(&state_); }

 private:
  XXH3_state_t state_{};
};

}  // namespace kvfuse
