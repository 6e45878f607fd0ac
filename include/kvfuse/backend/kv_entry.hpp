#pragma once
// The stored form of a KV block: one byte string that names its key and model and checks itself. DiskKVStore keeps
// it as a file, RedisKVStore as a value; both read it with the functions here, so a foreign, stale, truncated or
// damaged entry is rejected the same way wherever it is stored, and one fuzzer covers both.
//
// Entry format, version 3 (integers little-endian; a big-endian host is refused at compile time):
//   offset  0  char[8]  magic "KVFUSEKV"
//           8  u32      format version (3)
//          12  u32      page size P in bytes (65536): the payload is checksummed page by page
//          16  u64      key.model
//          24  u64      key.content
//          32  i64      num_tokens
//          40  i64      first_position
//          48  u64      payload byte count B
//          56  u64      header checksum: XXH3 of the page table, seeded with XXH3 of bytes [0, 56)
//          64  u64[ceil(B / P)]  page table: XXH3 of each payload page (the last one may be short)
//   64 + 8 ceil(B / P)  bytes    payload (KVBlock::bytes)
// Pages make ranged reads checkable (RangedKVStore: a reader fetches the header, the page table and only the pages
// a byte range touches, as the layer-pipelined loader reads one layer of a block). The header checksum doubles as
// the entry's version (KVBlockInfo::version): a ranged read of an entry replaced since describe() sees another
// version and fails instead of mixing two entries. Entries of other versions (2: FNV-1a checksums) are rejected
// as unsupported: a cache miss, recomputed and rewritten.

#include <algorithm>
#include <bit>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include <fmt/format.h>

#include "kvfuse/core/hash.hpp"
#include "kvfuse/core/types.hpp"

namespace kvfuse {

static_assert(std::endian::native == std::endian::little, "kvfuse's stored KV entries are little-endian");

inline constexpr std::string_view kv_entry_magic = "KVFUSEKV";
inline constexpr std::uint32_t kv_entry_version = 3;
inline constexpr std::uint32_t kv_entry_page_bytes = 65536;
inline constexpr std::size_t kv_entry_header_bytes = 64;
inline constexpr std::size_t kv_entry_checksum_offset = 56;

// A checked header and page table.
struct KVEntryLayout {
  KVBlockInfo info;                   // num_tokens, first_position, bytes (payload size), version (header checksum)
  std::uint64_t page_bytes = 0;       // payload page size
  std::uint64_t payload_offset = 0;   // where the payload starts: 64 + 8 * pages
  std::vector<std::uint64_t> pages;   // XXH3 of each payload page (filled by parse_kv_entry_pages)

  [[nodiscard]] std::uint64_t num_pages() const noexcept { return (payload_offset - kv_entry_header_bytes) / 8; }
};

namespace detail {

template <class T>
void kv_entry_store(std::span<std::byte> header, std::size_t offset, T value) noexcept {
  std::memcpy(header.data() + offset, &value, sizeof(T));
}

template <class T>
[[nodiscard]] T kv_entry_load(std::span<const std::byte> header, std::size_t offset) noexcept {
  T value;
  std::memcpy(&value, header.data() + offset, sizeof(T));
  return value;
}

[[nodiscard]] inline std::uint64_t kv_entry_checksum(std::span<const std::byte> header,
                                                     std::span<const std::byte> table) noexcept {
  return xxh3(table, xxh3(header.first(kv_entry_checksum_offset)));
}

}  // namespace detail

// Header + page table of `block` stored under `key`: the entry is these bytes followed by block.bytes.
[[nodiscard]] inline std::vector<std::byte> kv_entry_prefix(const KVKey& key, const KVBlock& block) {
  const std::span<const std::byte> payload(block.bytes);
  const std::uint64_t pages = (payload.size() + kv_entry_page_bytes - 1) / kv_entry_page_bytes;
  std::vector<std::byte> prefix(kv_entry_header_bytes + pages * sizeof(std::uint64_t));
  const std::span<std::byte> header = std::span(prefix).first(kv_entry_header_bytes);
  std::memcpy(header.data(), kv_entry_magic.data(), kv_entry_magic.size());
  detail::kv_entry_store<std::uint32_t>(header, 8, kv_entry_version);
  detail::kv_entry_store<std::uint32_t>(header, 12, kv_entry_page_bytes);
  detail::kv_entry_store<std::uint64_t>(header, 16, key.model);
  detail::kv_entry_store<std::uint64_t>(header, 24, key.content);
  detail::kv_entry_store<std::int64_t>(header, 32, block.num_tokens);
  detail::kv_entry_store<std::int64_t>(header, 40, block.first_position);
  detail::kv_entry_store<std::uint64_t>(header, 48, payload.size());
  for (std::uint64_t i = 0; i < pages; ++i) {
    const std::size_t at = i * kv_entry_page_bytes;
    const std::uint64_t sum = xxh3(payload.subspan(at, std::min<std::size_t>(kv_entry_page_bytes, payload.size() - at)));
    std::memcpy(prefix.data() + kv_entry_header_bytes + i * sizeof(std::uint64_t), &sum, sizeof sum);
  }
  detail::kv_entry_store<std::uint64_t>(
      header, kv_entry_checksum_offset,
      detail::kv_entry_checksum(header, std::span(prefix).subspan(kv_entry_header_bytes)));
  return prefix;
}

// Checks an entry's first kv_entry_header_bytes bytes against `key` and the entry's total size in bytes; on
// success fills `layout` (all but `pages`) and returns "", else why the entry is rejected. The header checksum
// covers the page table too: parse_kv_entry_pages checks it.
[[nodiscard]] inline std::string parse_kv_entry_header(std::span<const std::byte> header, std::uint64_t entry_bytes,
                                                       const KVKey& key, KVEntryLayout& layout) {
  if (header.size() < kv_entry_header_bytes || entry_bytes < kv_entry_header_bytes) {
    return fmt::format("truncated: {} bytes, shorter than the {}-byte header", std::min<std::uint64_t>(header.size(), entry_bytes),
                       kv_entry_header_bytes);
  }
  if (std::memcmp(header.data(), kv_entry_magic.data(), kv_entry_magic.size()) != 0) {
    return "wrong magic (not a kvfuse KV entry)";
  }
  if (const auto version = detail::kv_entry_load<std::uint32_t>(header, 8); version != kv_entry_version) {
    return fmt::format("unsupported format version {} (this reader knows {})", version, kv_entry_version);
  }
  layout.page_bytes = detail::kv_entry_load<std::uint32_t>(header, 12);
  if (layout.page_bytes == 0) return "page size 0";
  const auto payload = detail::kv_entry_load<std::uint64_t>(header, 48);
  const std::uint64_t pages = payload / layout.page_bytes + (payload % layout.page_bytes != 0 ? 1 : 0);
  if (payload > entry_bytes || pages > entry_bytes / sizeof(std::uint64_t) ||
      kv_entry_header_bytes + pages * sizeof(std::uint64_t) + payload != entry_bytes) {
    return fmt::format("payload size {} does not match entry size {} (expected {} + {} header and page-table bytes)",
                       payload, entry_bytes, payload, kv_entry_header_bytes + pages * sizeof(std::uint64_t));
  }
  if (const auto model = detail::kv_entry_load<std::uint64_t>(header, 16); model != key.model) {
    return fmt::format("foreign entry: model 0x{:016x} but key wants 0x{:016x}", model, key.model);
  }
  if (const auto content = detail::kv_entry_load<std::uint64_t>(header, 24); content != key.content) {
    return fmt::format("foreign entry: content 0x{:016x} but key wants 0x{:016x}", content, key.content);
  }
  layout.info.num_tokens = detail::kv_entry_load<std::int64_t>(header, 32);
  if (layout.info.num_tokens < 0) return fmt::format("num_tokens = {} is negative", layout.info.num_tokens);
  layout.info.first_position = detail::kv_entry_load<std::int64_t>(header, 40);
  layout.info.bytes = payload;
  layout.info.version = detail::kv_entry_load<std::uint64_t>(header, kv_entry_checksum_offset);
  layout.payload_offset = kv_entry_header_bytes + pages * sizeof(std::uint64_t);
  layout.pages.clear();
  return {};
}

// Checks the page table (layout.num_pages() * 8 bytes at offset kv_entry_header_bytes) against the header
// checksum and fills layout.pages: "" or why the entry is rejected.
[[nodiscard]] inline std::string parse_kv_entry_pages(std::span<const std::byte> header,
                                                      std::span<const std::byte> table, KVEntryLayout& layout) {
  if (table.size() != layout.num_pages() * sizeof(std::uint64_t)) {
    return fmt::format("page table of {} bytes, expected {}", table.size(), layout.num_pages() * sizeof(std::uint64_t));
  }
  const std::uint64_t computed = detail::kv_entry_checksum(header, table);
  if (computed != layout.info.version) {
    return fmt::format("header checksum mismatch: stored 0x{:016x}, computed 0x{:016x}", layout.info.version, computed);
  }
  layout.pages.resize(static_cast<std::size_t>(layout.num_pages()));
  if (!table.empty()) std::memcpy(layout.pages.data(), table.data(), table.size());
  return {};
}

// Checks payload pages [first_page, ...) read into `bytes` (whole pages; the entry's last page may be short)
// against the page table: "" or why they fail.
[[nodiscard]] inline std::string check_kv_entry_pages(const KVEntryLayout& layout, std::uint64_t first_page,
                                                      std::span<const std::byte> bytes) {
  const auto page_bytes = static_cast<std::size_t>(layout.page_bytes);
  for (std::size_t at = 0; at < bytes.size(); at += page_bytes) {
    const std::uint64_t page = first_page + at / page_bytes;
    if (page >= layout.pages.size()) return fmt::format("payload page {} past the page table", page);
    const std::uint64_t computed = xxh3(bytes.subspan(at, std::min(page_bytes, bytes.size() - at)));
    if (computed != layout.pages[static_cast<std::size_t>(page)]) {
      return fmt::format("checksum mismatch in payload page {} (bytes {} ..): stored 0x{:016x}, computed 0x{:016x}",
                         page, page * layout.page_bytes, layout.pages[static_cast<std::size_t>(page)], computed);
    }
  }
  return {};
}

// The whole pages that cover payload bytes [offset, offset + size): pages [first_page, ...), payload bytes
// [begin, end). offset + size <= layout.info.bytes.
struct KVEntryPageSpan {
  std::uint64_t first_page = 0;
  std::uint64_t begin = 0;
  std::uint64_t end = 0;
};

[[nodiscard]] inline KVEntryPageSpan kv_entry_page_span(const KVEntryLayout& layout, std::uint64_t offset,
                                                        std::uint64_t size) noexcept {
  if (size == 0) return {offset / layout.page_bytes, offset, offset};
  const std::uint64_t first = offset / layout.page_bytes;
  const std::uint64_t last = (offset + size - 1) / layout.page_bytes + 1;
  return {first, first * layout.page_bytes, std::min(last * layout.page_bytes, layout.info.bytes)};
}

// Parses and checks a whole entry held in memory (a Redis value, a fuzzer input): "" and `block` filled, or why it
// is rejected.
[[nodiscard]] inline std::string parse_kv_entry(std::span<const std::byte> entry, const KVKey& key, KVBlock& block) {
  KVEntryLayout layout;
  if (std::string why = parse_kv_entry_header(entry, entry.size(), key, layout); !why.empty()) return why;
  const std::span<const std::byte> header = entry.first(kv_entry_header_bytes);
  const std::span<const std::byte> table =
      entry.subspan(kv_entry_header_bytes, layout.payload_offset - kv_entry_header_bytes);
  if (std::string why = parse_kv_entry_pages(header, table, layout); !why.empty()) return why;
  const std::span<const std::byte> payload = entry.subspan(layout.payload_offset);
  if (std::string why = check_kv_entry_pages(layout, 0, payload); !why.empty()) return why;
  block.num_tokens = layout.info.num_tokens;
  block.first_position = layout.info.first_position;
  block.bytes.assign(payload.begin(), payload.end());
  return {};
}

}  // namespace kvfuse
