#pragma once
// CompressedKVStore: a KVStore that compresses each block's payload (lz4 or zstd) in front of any other KVStore
// (InMemoryKVStore, DiskKVStore, TieredKVStore, a remote store...), so the inner store holds and its link carries
// fewer bytes, at the cost of CPU time on every put and get. Needs liblz4 and libzstd (target kvfuse::codecs).
//
// The inner store keeps, under the same key, a KVBlock with the same num_tokens and first_position whose bytes
// are (integers little-endian, like DiskKVStore's files; a big-endian host is refused at compile time):
//   offset  0  char[4]  magic "KVFZ"
//           4  u8       format version (1)
//           5  u8       codec: 0 none, 1 lz4 (block format), 2 zstd (one frame, content size in its header)
//           6  u8       byte-shuffle width W: 0 none, 2 or 4 (see CodecOptions::shuffle)
//           7  u8       0
//           8  u64      raw payload size R
//          16  u64      XXH3-64 of the raw payload (kvfuse::xxh3, seed 0), before any shuffle
//          24  ...      the payload, shuffled when W > 0, compressed by the codec (none: R bytes)
// The codec and shuffle of each entry are in its header, so a store reads entries written with any options.
//
// get() trusts nothing: an entry too short for the header, a wrong magic or version, an unknown codec or shuffle
// width, a raw size that the compressed bytes cannot hold (checked before allocating; for zstd, also against the
// frame's), a decompression error, a decompressed size other than R, or a checksum mismatch is a miss (nullopt),
// counted with its reason (rejected(), last_rejection()); get() never throws for a bad entry and never returns
// wrong bytes. A rejected entry stays in the inner store until it is overwritten or erased. put() throws
// kvfuse::error when the codec cannot take the block (lz4: payloads up to LZ4_MAX_INPUT_SIZE bytes); both forward
// the inner store's errors.
//
// It is a KVStore but not a RangedKVStore: a compressed entry cannot be read one layer at a time, so
// FusionPipeline's layer-pipelined loader falls back to whole-block loads over it.
//
// stats(): bytes put and stored, bytes read and returned, seconds spent compressing and decompressing (each
// including its XXH3), so the saving in bytes can be weighed against the CPU time.
//
// Thread safety: as `inner`. Compression contexts and shuffle buffers are per thread (a shuffle buffer keeps the
// size of the largest payload its thread shuffled); the statistics and the rejection record are guarded by a mutex.

#include <lz4.h>
#include <zstd.h>

#include <algorithm>
#include <array>
#include <bit>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include "kvfuse/backend/concepts.hpp"
#include "kvfuse/backend/in_memory_store.hpp"
#include "kvfuse/core/error.hpp"
#include "kvfuse/core/hash.hpp"
#include "kvfuse/core/types.hpp"

namespace kvfuse {

enum class Codec : std::uint8_t { none = 0, lz4 = 1, zstd = 2 };

[[nodiscard]] constexpr std::string_view codec_name(Codec c) noexcept {
  switch (c) {
    case Codec::none: return "none";
    case Codec::lz4: return "lz4";
    case Codec::zstd: return "zstd";
  }
  return "?";
}

struct CodecOptions {
  Codec codec = Codec::lz4;
  int zstd_level = 3;        // ZSTD_minCLevel() .. ZSTD_maxCLevel() (negative: faster; 0: zstd's default, 3)
  int lz4_acceleration = 1;  // 1 .. 65537: higher is faster and compresses less (LZ4_compress_fast)
  // Byte-shuffle before compressing (as Blosc): 0 off, or the element size, 2 (f16 / bf16 KV) or 4 (f32 KV). Byte
  // k of every element goes to the k-th plane, so the sign / exponent bytes, which vary little, lie together.
  int shuffle = 0;
  // The largest raw payload get() decompresses: an entry claiming more is rejected before anything is allocated
  // (a damaged or hostile header must not make a reader allocate what its bytes claim).
  std::uint64_t max_raw_bytes = std::uint64_t{1} << 31;

  void validate() const {
    detail::require(codec == Codec::none || codec == Codec::lz4 || codec == Codec::zstd,
                    "CodecOptions: codec = {} is not none, lz4 or zstd", static_cast<int>(codec));
    detail::require(zstd_level >= ZSTD_minCLevel() && zstd_level <= ZSTD_maxCLevel(),
                    "CodecOptions: zstd_level = {} is outside [{}, {}]", zstd_level, ZSTD_minCLevel(),
                    ZSTD_maxCLevel());
    detail::require(lz4_acceleration >= 1 && lz4_acceleration <= 65537,
                    "CodecOptions: lz4_acceleration = {} is outside [1, 65537]", lz4_acceleration);
    detail::require(shuffle == 0 || shuffle == 2 || shuffle == 4, "CodecOptions: shuffle = {} is not 0, 2 or 4",
                    shuffle);
    detail::require(max_raw_bytes > 0, "CodecOptions: max_raw_bytes = 0 must be > 0");
  }
};

// What a CompressedKVStore has done, summed over calls.
struct CodecStats {
  std::int64_t puts = 0;
  std::int64_t raw_bytes_put = 0;     // payload bytes given to put()
  std::int64_t stored_bytes_put = 0;  // bytes handed to the inner store: header + compressed payload
  double compress_s = 0.0;            // compressing and hashing
  std::int64_t gets = 0;              // blocks decoded and returned (misses and rejections excluded)
  std::int64_t stored_bytes_got = 0;  // bytes of those entries as the inner store returned them
  std::int64_t raw_bytes_got = 0;     // payload bytes returned
  double decompress_s = 0.0;          // decompressing and checking

  // Stored bytes per raw byte put (1 before any byte; < 1 is a saving).
  [[nodiscard]] double stored_ratio() const noexcept {
    return raw_bytes_put > 0 ? static_cast<double>(stored_bytes_put) / static_cast<double>(raw_bytes_put) : 1.0;
  }
};

static_assert(std::endian::native == std::endian::little, "CompressedKVStore's entry headers are little-endian");

namespace detail {

inline constexpr std::array<char, 4> kv_codec_magic{'K', 'V', 'F', 'Z'};
inline constexpr std::uint8_t kv_codec_version = 1;
inline constexpr std::size_t kv_codec_header_bytes = 24;
// A zstd block of 128 KiB can shrink to 4 bytes (RLE): no valid frame decompresses to more than this per byte.
inline constexpr std::uint64_t zstd_max_expansion = 32768;
// An lz4 sequence's length bytes add at most 255 output bytes each.
inline constexpr std::uint64_t lz4_max_expansion = 255;

// Byte-shuffle of W-byte elements (inverse: its undoing): byte k of element i goes to k · n + i, n = size / W;
// the size % W tail bytes stay last.
template <std::size_t W>
void byte_shuffle(std::span<const std::byte> in, std::span<std::byte> out, bool inverse) noexcept {
  const std::size_t n = in.size() / W;
  if (inverse) {
    for (std::size_t i = 0; i < n; ++i)
      for (std::size_t k = 0; k < W; ++k) out[i * W + k] = in[k * n + i];
  } else {
    for (std::size_t i = 0; i < n; ++i)
      for (std::size_t k = 0; k < W; ++k) out[k * n + i] = in[i * W + k];
  }
  const auto tail = static_cast<std::ptrdiff_t>(n * W);
  std::copy(in.begin() + tail, in.end(), out.begin() + tail);
}

// byte_shuffle with W = width (2 or 4).
inline void byte_shuffle(std::span<const std::byte> in, std::span<std::byte> out, unsigned width, bool inverse) {
  if (width == 2) byte_shuffle<2>(in, out, inverse);
  else byte_shuffle<4>(in, out, inverse);
}

struct ZstdCCtxFree {
  void operator()(ZSTD_CCtx* c) const noexcept { ZSTD_freeCCtx(c); }
};
struct ZstdDCtxFree {
  void operator()(ZSTD_DCtx* d) const noexcept { ZSTD_freeDCtx(d); }
};

// This thread's zstd contexts, reused across calls (a context costs an allocation of up to megabytes).
[[nodiscard]] inline ZSTD_CCtx* zstd_cctx() {
  thread_local const std::unique_ptr<ZSTD_CCtx, ZstdCCtxFree> ctx(ZSTD_createCCtx());
  require(ctx != nullptr, "CompressedKVStore: ZSTD_createCCtx failed");
  return ctx.get();
}
[[nodiscard]] inline ZSTD_DCtx* zstd_dctx() {
  thread_local const std::unique_ptr<ZSTD_DCtx, ZstdDCtxFree> ctx(ZSTD_createDCtx());
  return ctx.get();
}

// This thread's buffer for shuffled bytes, `size` long: it keeps the largest size asked for (no allocation and no
// page faults per call once warm).
[[nodiscard]] inline std::span<std::byte> shuffle_scratch(std::size_t size) {
  thread_local std::vector<std::byte> buffer;
  if (buffer.size() < size) buffer.resize(size);
  return std::span(buffer).first(size);
}

}  // namespace detail

template <KVStore Inner>
class CompressedKVStore {
 public:
  CompressedKVStore(Inner& inner, CodecOptions options) : inner_(&inner), options_(options) { options_.validate(); }

  [[nodiscard]] const CodecOptions& options() const noexcept { return options_; }

  // Whether the inner store holds the key; the entry is not decoded (get() may still reject it).
  [[nodiscard]] bool contains(const KVKey& key) const { return inner_->contains(key); }
  [[nodiscard]] std::vector<bool> contains_many(std::span<const KVKey> keys) const {
    return inner_->contains_many(keys);
  }

  // The decoded block, or nullopt when the inner store has none or the entry is rejected (see the header comment).
  [[nodiscard]] std::optional<KVBlock> get(const KVKey& key) { return decoded(key, inner_->get(key)); }

  // get of each key, the entries read with one get_many of the inner store: result i belongs to keys[i].
  [[nodiscard]] std::vector<std::optional<KVBlock>> get_many(std::span<const KVKey> keys) {
    std::vector<std::optional<KVBlock>> out = inner_->get_many(keys);
    for (std::size_t i = 0; i < out.size(); ++i) out[i] = decoded(keys[i], out[i]);
    return out;
  }

  // Compresses the payload with options().codec and puts the entry into the inner store.
  void put(const KVKey& key, KVBlock block) {
    const auto start = std::chrono::steady_clock::now();
    KVBlock stored{block.num_tokens, encode(block.bytes), block.first_position};
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    const auto stored_bytes = static_cast<std::int64_t>(stored.bytes.size());
    inner_->put(key, std::move(stored));
    std::lock_guard lock(mutex_);
    ++stats_.puts;
    stats_.raw_bytes_put += static_cast<std::int64_t>(block.bytes.size());
    stats_.stored_bytes_put += stored_bytes;
    stats_.compress_s += seconds;
  }

  bool erase(const KVKey& key) { return inner_->erase(key); }

  [[nodiscard]] CodecStats stats() const {
    std::lock_guard lock(mutex_);
    return stats_;
  }
  // How many entries get() has rejected, and why it rejected the last one (empty before the first).
  [[nodiscard]] std::int64_t rejected() const {
    std::lock_guard lock(mutex_);
    return rejected_;
  }
  [[nodiscard]] std::string last_rejection() const {
    std::lock_guard lock(mutex_);
    return last_rejection_;
  }

 private:
  // The block an inner entry of `key` decodes to, or nullopt when there is none or it is rejected (counted).
  [[nodiscard]] std::optional<KVBlock> decoded(const KVKey& key, const std::optional<KVBlock>& stored) {
    if (!stored) return std::nullopt;
    const auto start = std::chrono::steady_clock::now();
    KVBlock block{stored->num_tokens, {}, stored->first_position};
    if (std::string why = decode(stored->bytes, options_.max_raw_bytes, block.bytes); !why.empty()) {
      std::lock_guard lock(mutex_);
      ++rejected_;
      last_rejection_ = fmt::format("CompressedKVStore: rejected entry {:016x}-{:016x} ({} bytes): {}", key.model,
                                    key.content, stored->bytes.size(), why);
      return std::nullopt;
    }
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    std::lock_guard lock(mutex_);
    ++stats_.gets;
    stats_.stored_bytes_got += static_cast<std::int64_t>(stored->bytes.size());
    stats_.raw_bytes_got += static_cast<std::int64_t>(block.bytes.size());
    stats_.decompress_s += seconds;
    return block;
  }

  template <class T>
  static void store_at(std::vector<std::byte>& out, std::size_t offset, T value) noexcept {
    std::memcpy(out.data() + offset, &value, sizeof(T));
  }
  template <class T>
  [[nodiscard]] static T load_at(std::span<const std::byte> in, std::size_t offset) noexcept {
    T value;
    std::memcpy(&value, in.data() + offset, sizeof(T));
    return value;
  }

  // Header + `payload` (shuffled when options().shuffle > 0) compressed.
  [[nodiscard]] std::vector<std::byte> encode(std::span<const std::byte> payload) const {
    constexpr std::size_t h = detail::kv_codec_header_bytes;
    std::span<const std::byte> raw = payload;
    if (options_.shuffle > 0) {
      const std::span<std::byte> shuffled = detail::shuffle_scratch(payload.size());
      detail::byte_shuffle(payload, shuffled, static_cast<unsigned>(options_.shuffle), false);
      raw = shuffled;
    }
    std::vector<std::byte> out;
    switch (options_.codec) {
      case Codec::none:
        out.resize(h + raw.size());
        if (!raw.empty()) std::memcpy(out.data() + h, raw.data(), raw.size());
        break;
      case Codec::lz4: {
        detail::require(raw.size() <= LZ4_MAX_INPUT_SIZE,
                        "CompressedKVStore: a {}-byte payload exceeds lz4's limit of {} bytes", raw.size(),
                        LZ4_MAX_INPUT_SIZE);
        const int src = static_cast<int>(raw.size());
        const int bound = LZ4_compressBound(src);
        out.resize(h + static_cast<std::size_t>(bound));
        const int n = LZ4_compress_fast(reinterpret_cast<const char*>(raw.data()),
                                        reinterpret_cast<char*>(out.data() + h), src, bound, options_.lz4_acceleration);
        detail::require(n > 0, "CompressedKVStore: lz4 failed to compress a {}-byte payload", raw.size());
        out.resize(h + static_cast<std::size_t>(n));
        break;
      }
      case Codec::zstd: {
        out.resize(h + ZSTD_compressBound(raw.size()));
        const std::size_t n = ZSTD_compressCCtx(detail::zstd_cctx(), out.data() + h, out.size() - h, raw.data(),
                                                raw.size(), options_.zstd_level);
        detail::require(!ZSTD_isError(n), "CompressedKVStore: zstd level {} failed on a {}-byte payload: {}",
                        options_.zstd_level, raw.size(), ZSTD_getErrorName(n));
        out.resize(h + n);
        break;
      }
    }
    std::memcpy(out.data(), detail::kv_codec_magic.data(), detail::kv_codec_magic.size());
    store_at<std::uint8_t>(out, 4, detail::kv_codec_version);
    store_at<std::uint8_t>(out, 5, static_cast<std::uint8_t>(options_.codec));
    store_at<std::uint8_t>(out, 6, static_cast<std::uint8_t>(options_.shuffle));
    store_at<std::uint8_t>(out, 7, 0);
    store_at<std::uint64_t>(out, 8, raw.size());
    store_at<std::uint64_t>(out, 16, xxh3(payload));
    return out;
  }

  // Decodes an entry into `payload`; returns an empty string, or why the entry is rejected.
  [[nodiscard]] static std::string decode(std::span<const std::byte> entry, std::uint64_t max_raw_bytes,
                                          std::vector<std::byte>& payload) {
    constexpr std::size_t h = detail::kv_codec_header_bytes;
    if (entry.size() < h) return fmt::format("{} bytes, shorter than the {}-byte codec header", entry.size(), h);
    if (std::memcmp(entry.data(), detail::kv_codec_magic.data(), detail::kv_codec_magic.size()) != 0) {
      return "wrong magic (not a CompressedKVStore entry)";
    }
    if (const auto v = load_at<std::uint8_t>(entry, 4); v != detail::kv_codec_version) {
      return fmt::format("unsupported format version {} (this reader knows {})", v, detail::kv_codec_version);
    }
    const auto codec = static_cast<Codec>(load_at<std::uint8_t>(entry, 5));
    const auto shuffle = load_at<std::uint8_t>(entry, 6);
    if (shuffle != 0 && shuffle != 2 && shuffle != 4) return fmt::format("unknown shuffle width {}", shuffle);
    const auto size = load_at<std::uint64_t>(entry, 8);
    const std::span<const std::byte> packed = entry.subspan(h);
    // Sizes the packed bytes cannot hold, or above max_raw_bytes, are refused before anything is allocated.
    if (size > max_raw_bytes) return fmt::format("raw size {} exceeds max_raw_bytes {}", size, max_raw_bytes);
    switch (codec) {
      case Codec::none:
        if (size != packed.size()) {
          return fmt::format("raw size {} but {} bytes stored uncompressed", size, packed.size());
        }
        break;
      case Codec::lz4:
        if (packed.size() > static_cast<std::size_t>(LZ4_compressBound(LZ4_MAX_INPUT_SIZE))) {
          return fmt::format("{} lz4 bytes exceed the largest lz4 block", packed.size());
        }
        if (size > std::min<std::uint64_t>(LZ4_MAX_INPUT_SIZE, packed.size() * detail::lz4_max_expansion)) {
          return fmt::format("raw size {} is more than {} lz4 bytes can hold", size, packed.size());
        }
        break;
      case Codec::zstd: {
        const unsigned long long frame = ZSTD_getFrameContentSize(packed.data(), packed.size());
        if (frame == ZSTD_CONTENTSIZE_ERROR || frame == ZSTD_CONTENTSIZE_UNKNOWN) {
          return "not a zstd frame with a content size";
        }
        if (frame != size) return fmt::format("raw size {} differs from the zstd frame's {}", size, frame);
        if (size > packed.size() * detail::zstd_max_expansion) {
          return fmt::format("raw size {} is more than {} zstd bytes can hold", size, packed.size());
        }
        break;
      }
      default: return fmt::format("unknown codec {}", static_cast<int>(codec));
    }
    payload.resize(static_cast<std::size_t>(size));
    const std::span<std::byte> raw = shuffle > 0 ? detail::shuffle_scratch(payload.size()) : std::span(payload);
    switch (codec) {
      case Codec::none:
        if (size > 0) std::memcpy(raw.data(), packed.data(), raw.size());
        break;
      case Codec::lz4: {
        const int n = LZ4_decompress_safe(reinterpret_cast<const char*>(packed.data()),
                                          reinterpret_cast<char*>(raw.data()), static_cast<int>(packed.size()),
                                          static_cast<int>(size));
        if (n < 0) return fmt::format("lz4 decompression failed (error {})", n);
        if (static_cast<std::uint64_t>(n) != size) {
          return fmt::format("lz4 decompressed {} bytes, header says {}", n, size);
        }
        break;
      }
      case Codec::zstd: {
        ZSTD_DCtx* ctx = detail::zstd_dctx();
        if (ctx == nullptr) return "ZSTD_createDCtx failed";
        const std::size_t n = ZSTD_decompressDCtx(ctx, raw.data(), raw.size(), packed.data(), packed.size());
        if (ZSTD_isError(n)) return fmt::format("zstd decompression failed: {}", ZSTD_getErrorName(n));
        if (n != size) return fmt::format("zstd decompressed {} bytes, header says {}", n, size);
        break;
      }
    }
    if (shuffle > 0) detail::byte_shuffle(raw, payload, shuffle, true);
    const auto stored = load_at<std::uint64_t>(entry, 16);
    if (const std::uint64_t computed = xxh3(payload); computed != stored) {
      return fmt::format("checksum mismatch: stored 0x{:016x}, computed 0x{:016x}", stored, computed);
    }
    return {};
  }

  Inner* inner_;
  CodecOptions options_;
  mutable std::mutex mutex_;
  CodecStats stats_;
  std::int64_t rejected_ = 0;
  std::string last_rejection_;
};

static_assert(KVStore<CompressedKVStore<InMemoryKVStore>>);
static_assert(!RangedKVStore<CompressedKVStore<InMemoryKVStore>>);

}  // namespace kvfuse
