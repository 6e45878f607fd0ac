// libFuzzer target for the stored-entry parser (include/kvfuse/backend/kv_entry.hpp) that DiskKVStore files and
// RedisKVStore values both go through. Each input is an entry, read three ways: whole (parse_kv_entry, as a
// Redis get does), against the key its own header names and against a fixed one; and ranged (header, page table,
// the pages of a byte range, as describe + get_range do). Rejections are the expected answer to malformed
// input. A crash, a sanitizer report, an exception, a leak or an out-of-memory is a bug, and so is an accepted
// entry that is not exactly what kv_entry_prefix writes for its block (the parser let something through that the
// writer never produces). How to build and run it: tests/fuzz/README.md.
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <string>
#include <vector>

#include "kvfuse/backend/kv_entry.hpp"

namespace {

void check(const std::span<const std::byte> entry, const kvfuse::KVKey& key) {
  kvfuse::KVBlock block;
  if (kvfuse::parse_kv_entry(entry, key, block).empty()) {
    // Accepted: it must be the writer's own bytes for this key and block (unless another page size was used).
    std::uint32_t page_bytes = 0;
    std::memcpy(&page_bytes, entry.data() + 12, sizeof page_bytes);
    if (page_bytes == kvfuse::kv_entry_page_bytes) {
      std::vector<std::byte> again = kvfuse::kv_entry_prefix(key, block);
      again.insert(again.end(), block.bytes.begin(), block.bytes.end());
      if (again.size() != entry.size() || std::memcmp(again.data(), entry.data(), entry.size()) != 0)
        __builtin_trap();
    }
  }
  // Ranged: header, page table, then the pages of the payload's middle third.
  kvfuse::KVEntryLayout layout;
  const std::span<const std::byte> header = entry.first(std::min(entry.size(), kvfuse::kv_entry_header_bytes));
  if (!kvfuse::parse_kv_entry_header(header, entry.size(), key, layout).empty()) return;
  const std::span<const std::byte> table =
      entry.subspan(kvfuse::kv_entry_header_bytes, layout.payload_offset - kvfuse::kv_entry_header_bytes);
  if (!kvfuse::parse_kv_entry_pages(header, table, layout).empty()) return;
  const std::uint64_t offset = layout.info.bytes / 3;
  const std::uint64_t size = layout.info.bytes / 3;
  const kvfuse::KVEntryPageSpan pages = kvfuse::kv_entry_page_span(layout, offset, size);
  if (pages.begin > offset || pages.end < offset + size || pages.end > layout.info.bytes) __builtin_trap();
  (void)kvfuse::check_kv_entry_pages(layout, pages.first_page,
                                     entry.subspan(layout.payload_offset + pages.begin, pages.end - pages.begin));
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::span<const std::byte> entry = std::as_bytes(std::span(data, size));
  if (size >= 32) {
    kvfuse::KVKey own{};
    std::memcpy(&own.model, data + 16, sizeof own.model);
    std::memcpy(&own.content, data + 24, sizeof own.content);
    check(entry, own);
  }
  check(entry, kvfuse::KVKey{0x1, 0xab});
  return 0;
}
