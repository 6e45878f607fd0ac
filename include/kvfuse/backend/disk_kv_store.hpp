#pragma once
// DiskKVStore: a persistent KVStore over a directory, one checksummed file per key.
//
// When to use it: chunk caches that must outlive the process or exceed DRAM (put it behind an
// InMemoryKVStore with TieredKVStore, backend/tiered_kv_store.hpp). Files are named
// "<model:016x>-<content:016x>.kvb" after the key.
//
// File format, version 2 (integers in host byte order: little-endian on every host kvfuse targets; a
// big-endian reader sees version 0x02000000 and rejects the file rather than misreading it):
//   offset  0  char[8]  magic "KVFUSEKV"
//           8  u32      format version (2)
//          12  u32      page size P in bytes (65536): the payload is checksummed page by page
//          16  u64      key.model
//          24  u64      key.content
//          32  i64      num_tokens
//          40  i64      first_position
//          48  u64      payload byte count B
//          56  u64      header checksum: 64-bit FNV-1a over bytes [0, 56) and then the page table
//          64  u64[ceil(B / P)]  page table: FNV-1a of each payload page (the last one may be short)
//   64 + 8 ceil(B / P)  bytes    payload (KVBlock::bytes)
// Pages make ranged reads checkable (RangedKVStore: get_range reads the header, the page table and only the
// pages a byte range touches, as the layer-pipelined loader reads one layer of a block); the header checksum
// doubles as the entry's version (KVBlockInfo::version), so a range read of an entry replaced since
// describe() fails instead of mixing two entries. Version-1 files (one whole-payload checksum) are rejected
// as unsupported: a cache miss, recomputed and rewritten.
//
// put() writes a temp file in the same directory ("<name>.<pid>-<n>.tmp") and renames it over the entry, so a
// reader sees the old file or the new one, never a half-written one; failures throw kvfuse::error naming the
// file and remove the temp file. There is no fsync: after a crash an entry may be missing or, on file systems
// that reorder data and metadata, damaged — get() detects that. Temp files of crashed writers are never read
// and may be deleted while no writer runs.
//
// get() trusts nothing: a file with the wrong magic or version, a short file, a payload size that does not
// match the file size, a bad checksum, or a header naming another key (a "foreign" file copied under this
// key's name) is rejected: get() returns nullopt, the file is renamed to "<name>.rejected" (replacing an
// older one) for inspection, and rejected() / last_rejection() count and explain it. An I/O error while
// reading an existing file is a rejection too, not an exception.
//
// Thread safety: one reader thread plus one writer thread at a time (the KVStore contract). Writers of other
// DiskKVStore instances or processes on the same directory are safe for readers (atomic rename), but a
// rejection racing another instance's put may move that put's fresh file aside (it is then a cache miss).

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include "kvfuse/backend/concepts.hpp"
#include "kvfuse/core/error.hpp"
#include "kvfuse/core/hash.hpp"
#include "kvfuse/core/types.hpp"

namespace kvfuse {
namespace detail {

inline constexpr std::string_view kv_file_magic = "KVFUSEKV";
inline constexpr std::uint32_t kv_file_version = 2;
inline constexpr std::uint32_t kv_file_page_bytes = 65536;
inline constexpr std::size_t kv_file_checksum_offset = 56;
inline constexpr std::size_t kv_file_header_bytes = 64;

[[nodiscard]] constexpr std::uint64_t kv_file_pages(std::uint64_t payload, std::uint64_t page) noexcept {
  return payload / page + (payload % page != 0 ? 1 : 0);
}

using KVFileHeaderBytes = std::array<std::byte, kv_file_header_bytes>;

template <class T>
void kv_file_store(KVFileHeaderBytes& header, std::size_t offset, T value) noexcept {
  std::memcpy(header.data() + offset, &value, sizeof(T));
}

template <class T>
[[nodiscard]] T kv_file_load(const KVFileHeaderBytes& header, std::size_t offset) noexcept {
  T value;
  std::memcpy(&value, header.data() + offset, sizeof(T));
  return value;
}

// Closes a POSIX file descriptor on scope exit.
class ScopedFd {
 public:
  explicit ScopedFd(int fd) noexcept : fd_(fd) {}
  ScopedFd(const ScopedFd&) = delete;
  ScopedFd& operator=(const ScopedFd&) = delete;
  ~ScopedFd() { ::close(fd_); }
  [[nodiscard]] int get() const noexcept { return fd_; }

 private:
  int fd_;
};

// Reads exactly dst.size() bytes at `offset`; returns an empty string, or why it could not.
[[nodiscard]] inline std::string pread_exact(int fd, std::span<std::byte> dst, std::uint64_t offset) {
  std::size_t done = 0;
  while (done < dst.size()) {
    const ::ssize_t n = ::pread(fd, dst.data() + done, dst.size() - done, static_cast<::off_t>(offset + done));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return fmt::format("read failed at byte {}: {}", offset + done, std::strerror(errno));
    if (n == 0) return fmt::format("truncated while reading: end of file at byte {}", offset + done);
    done += static_cast<std::size_t>(n);
  }
  return {};
}

}  // namespace detail

class DiskKVStore {
 public:
  // Creates `dir` (and its parents) when missing; throws kvfuse::error naming `dir` when it cannot, or when
  // it exists and is not a directory.
  explicit DiskKVStore(std::filesystem::path dir) : dir_(std::move(dir)) {
    std::error_code ec;
    std::filesystem::create_directories(dir_, ec);
    if (ec || !std::filesystem::is_directory(dir_)) {
      throw error(fmt::format("DiskKVStore: cannot use '{}' as a store directory: {}", dir_.string(),
                              ec ? ec.message() : std::string("exists and is not a directory")));
    }
  }

  [[nodiscard]] const std::filesystem::path& directory() const noexcept { return dir_; }

  // The file of `key`: directory() / "<model:016x>-<content:016x>.kvb".
  [[nodiscard]] std::filesystem::path path_for(const KVKey& key) const {
    return dir_ / fmt::format("{:016x}-{:016x}.kvb", key.model, key.content);
  }

  // Whether the key's file exists; it is not validated (get() may still reject it).
  [[nodiscard]] bool contains(const KVKey& key) const {
    std::error_code ec;
    return std::filesystem::exists(path_for(key), ec);
  }

  // The block, or nullopt when the file is absent or rejected (see the header comment).
  [[nodiscard]] std::optional<KVBlock> get(const KVKey& key) {
    std::optional<KVBlock> out;
    (void)with_entry(key, [&](int fd, const Entry& e) -> std::string {
      KVBlock block{e.info.num_tokens, std::vector<std::byte>(static_cast<std::size_t>(e.info.bytes)),
                    e.info.first_position};
      if (std::string why = detail::pread_exact(fd, block.bytes, e.payload_offset); !why.empty()) return why;
      if (std::string why = check_pages(e, 0, block.bytes); !why.empty()) return why;
      out = std::move(block);
      return {};
    });
    return out;
  }

  // RangedKVStore: the entry's header (checked: magic, version, key, header checksum), or nullopt when the
  // file is absent or rejected. No payload byte is read.
  [[nodiscard]] std::optional<KVBlockInfo> describe(const KVKey& key) {
    std::optional<KVBlockInfo> out;
    (void)with_entry(key, [&](int, const Entry& e) -> std::string {
      out = e.info;
      return {};
    });
    return out;
  }

  // RangedKVStore: payload bytes [offset, offset + size) of the entry `info` described. Reads the header, the
  // page table and the pages the range touches, and checks them; nullopt when the file is absent, was replaced
  // since describe() (another version: not a rejection), or fails a check (rejected as get() would).
  [[nodiscard]] std::optional<std::vector<std::byte>> get_range(const KVKey& key, const KVBlockInfo& info,
                                                                std::uint64_t offset, std::uint64_t size) {
    detail::require(offset <= info.bytes && size <= info.bytes - offset,
                    "DiskKVStore::get_range: bytes [{}, {}) of a {}-byte entry", offset, offset + size, info.bytes);
    std::optional<std::vector<std::byte>> out;
    const bool same = with_entry(key, [&](int fd, const Entry& e) -> std::string {
      if (e.info.version != info.version || e.info.bytes != info.bytes) return {};  // replaced since describe()
      if (size == 0) {
        out.emplace();
        return {};
      }
      const std::uint64_t page = e.page_bytes;
      const std::uint64_t first = offset / page;
      const std::uint64_t last = size == 0 ? first : (offset + size - 1) / page + 1;  // pages [first, last)
      const std::uint64_t begin = first * page;
      std::vector<std::byte> pages(static_cast<std::size_t>(std::min(last * page, e.info.bytes) - begin));
      if (std::string why = detail::pread_exact(fd, pages, e.payload_offset + begin); !why.empty()) return why;
      if (std::string why = check_pages(e, first, pages); !why.empty()) return why;
      const auto skip = static_cast<std::ptrdiff_t>(offset - begin);
      out.emplace(pages.begin() + skip, pages.begin() + skip + static_cast<std::ptrdiff_t>(size));
      return {};
    });
    if (!same) return std::nullopt;
    return out;
  }

  // Writes the block atomically (temp file + rename), replacing any entry of the key. Throws kvfuse::error
  // naming the file and the reason (num_tokens < 0, directory gone, disk full, permissions); the old entry,
  // if any, is then untouched and no temp file is left.
  void put(const KVKey& key, KVBlock block) {
    const std::filesystem::path path = path_for(key);
    detail::require(block.num_tokens >= 0, "DiskKVStore: cannot store '{}': num_tokens = {} must be >= 0",
                    path.string(), block.num_tokens);
    std::filesystem::path temp = path;
    temp += fmt::format(".{}-{}.tmp", ::getpid(), temp_counter_.fetch_add(1, std::memory_order_relaxed));
    try {
      write_entry(temp, path, key, block);
      std::lock_guard lock(mutex_);
      std::error_code ec;
      std::filesystem::rename(temp, path, ec);
      if (ec) {
        throw error(fmt::format("DiskKVStore: cannot store '{}': rename from '{}' failed: {}", path.string(),
                                temp.string(), ec.message()));
      }
    } catch (...) {
      std::error_code ignored;
      std::filesystem::remove(temp, ignored);
      throw;
    }
  }

  // Removes the key's file; returns whether it existed. Throws kvfuse::error when it exists but cannot be
  // removed.
  bool erase(const KVKey& key) {
    const std::filesystem::path path = path_for(key);
    std::error_code ec;
    const bool removed = std::filesystem::remove(path, ec);
    if (ec) throw error(fmt::format("DiskKVStore: cannot erase '{}': {}", path.string(), ec.message()));
    return removed;
  }

  // How many files get() has rejected, and why it rejected the last one (empty before the first).
  [[nodiscard]] std::int64_t rejected() const {
    std::lock_guard lock(mutex_);
    return rejected_;
  }
  [[nodiscard]] std::string last_rejection() const {
    std::lock_guard lock(mutex_);
    return last_rejection_;
  }

 private:
  static void write_entry(const std::filesystem::path& temp, const std::filesystem::path& path, const KVKey& key,
                          const KVBlock& block) {
    detail::KVFileHeaderBytes header{};
    std::memcpy(header.data(), detail::kv_file_magic.data(), detail::kv_file_magic.size());
    detail::kv_file_store<std::uint32_t>(header, 8, detail::kv_file_version);
    detail::kv_file_store<std::uint32_t>(header, 12, detail::kv_file_page_bytes);
    detail::kv_file_store<std::uint64_t>(header, 16, key.model);
    detail::kv_file_store<std::uint64_t>(header, 24, key.content);
    detail::kv_file_store<std::int64_t>(header, 32, block.num_tokens);
    detail::kv_file_store<std::int64_t>(header, 40, block.first_position);
    detail::kv_file_store<std::uint64_t>(header, 48, block.bytes.size());
    const std::span<const std::byte> payload(block.bytes);
    std::vector<std::uint64_t> table(
        static_cast<std::size_t>(detail::kv_file_pages(payload.size(), detail::kv_file_page_bytes)));
    for (std::size_t i = 0; i < table.size(); ++i) {
      const std::size_t at = i * detail::kv_file_page_bytes;
      table[i] = fnv1a(payload.subspan(at, std::min<std::size_t>(detail::kv_file_page_bytes, payload.size() - at)));
    }
    const std::uint64_t checksum =
        fnv1a(std::as_bytes(std::span(table)), fnv1a(std::span(header).first<detail::kv_file_checksum_offset>()));
    detail::kv_file_store<std::uint64_t>(header, detail::kv_file_checksum_offset, checksum);

    errno = 0;
    std::ofstream out(temp, std::ios::binary | std::ios::trunc);
    if (!out.is_open()) {
      throw error(fmt::format("DiskKVStore: cannot store '{}': cannot create temp file '{}': {}", path.string(),
                              temp.string(), errno_reason()));
    }
    out.write(reinterpret_cast<const char*>(header.data()), static_cast<std::streamsize>(header.size()));
    out.write(reinterpret_cast<const char*>(table.data()), static_cast<std::streamsize>(table.size() * sizeof(std::uint64_t)));
    if (!block.bytes.empty()) {
      out.write(reinterpret_cast<const char*>(block.bytes.data()), static_cast<std::streamsize>(block.bytes.size()));
    }
    out.flush();
    if (out.good()) out.close();
    if (!out.good()) {
      throw error(fmt::format("DiskKVStore: cannot store '{}': writing temp file '{}' ({} bytes) failed: {}",
                              path.string(), temp.string(),
                              header.size() + table.size() * sizeof(std::uint64_t) + block.bytes.size(), errno_reason()));
    }
  }

  [[nodiscard]] static std::string errno_reason() {
    return errno != 0 ? std::string(std::strerror(errno)) : std::string("stream error");
  }

  // A checked header and page table of an open entry.
  struct Entry {
    KVBlockInfo info;
    std::uint64_t page_bytes = 0;
    std::uint64_t payload_offset = 0;
    std::vector<std::uint64_t> pages;  // FNV-1a of each payload page
  };

  // Opens the key's file and runs `use(fd, entry)` on its checked header; a reason `use` returns rejects the
  // file like a bad header. Returns false when the file is absent or rejected.
  template <class Use>
  bool with_entry(const KVKey& key, Use&& use) {
    const std::filesystem::path path = path_for(key);
    const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
      const int err = errno;
      if (err != ENOENT && err != ENOTDIR) reject(path, nullptr, fmt::format("cannot open: {}", std::strerror(err)));
      return false;
    }
    const detail::ScopedFd file(fd);
    struct stat st {};
    if (::fstat(fd, &st) != 0) {
      reject(path, nullptr, fmt::format("cannot stat: {}", std::strerror(errno)));
      return false;
    }
    Entry entry;
    std::string reason = read_header(fd, st, key, entry);
    if (reason.empty()) reason = use(fd, entry);
    if (reason.empty()) return true;
    reject(path, &st, reason);
    return false;
  }

  // Reads and validates the header and page table of the open entry; returns an empty string, or why it is
  // rejected.
  [[nodiscard]] static std::string read_header(int fd, const struct stat& st, const KVKey& key, Entry& entry) {
    if (!S_ISREG(st.st_mode)) return "not a regular file";
    const auto file_size = static_cast<std::uint64_t>(st.st_size);
    if (file_size < detail::kv_file_header_bytes) {
      return fmt::format("truncated: {} bytes, shorter than the {}-byte header", file_size,
                         detail::kv_file_header_bytes);
    }
    detail::KVFileHeaderBytes header{};
    if (std::string why = detail::pread_exact(fd, header, 0); !why.empty()) return why;
    if (std::memcmp(header.data(), detail::kv_file_magic.data(), detail::kv_file_magic.size()) != 0) {
      return "wrong magic (not a kvfuse KV file)";
    }
    if (const auto version = detail::kv_file_load<std::uint32_t>(header, 8); version != detail::kv_file_version) {
      return fmt::format("unsupported format version {} (this reader knows {})", version, detail::kv_file_version);
    }
    entry.page_bytes = detail::kv_file_load<std::uint32_t>(header, 12);
    if (entry.page_bytes == 0) return "page size 0";
    const auto payload_bytes = detail::kv_file_load<std::uint64_t>(header, 48);
    const std::uint64_t pages = detail::kv_file_pages(payload_bytes, entry.page_bytes);
    entry.payload_offset = detail::kv_file_header_bytes + pages * sizeof(std::uint64_t);
    if (payload_bytes > file_size || pages > file_size / sizeof(std::uint64_t) ||
        entry.payload_offset + payload_bytes != file_size) {
      return fmt::format("payload size {} does not match file size {} (expected {} + {} header and page-table bytes)",
                         payload_bytes, file_size, payload_bytes, entry.payload_offset);
    }
    entry.pages.resize(static_cast<std::size_t>(pages));
    if (std::string why = detail::pread_exact(fd, std::as_writable_bytes(std::span(entry.pages)),
                                              detail::kv_file_header_bytes);
        !why.empty()) {
      return why;
    }
    const auto stored = detail::kv_file_load<std::uint64_t>(header, detail::kv_file_checksum_offset);
    const std::uint64_t computed = fnv1a(std::as_bytes(std::span(entry.pages)),
                                         fnv1a(std::span(header).first<detail::kv_file_checksum_offset>()));
    if (stored != computed) {
      return fmt::format("header checksum mismatch: stored 0x{:016x}, computed 0x{:016x}", stored, computed);
    }
    if (const auto model = detail::kv_file_load<std::uint64_t>(header, 16); model != key.model) {
      return fmt::format("foreign entry: model 0x{:016x} but key wants 0x{:016x}", model, key.model);
    }
    if (const auto content = detail::kv_file_load<std::uint64_t>(header, 24); content != key.content) {
      return fmt::format("foreign entry: content 0x{:016x} but key wants 0x{:016x}", content, key.content);
    }
    entry.info.num_tokens = detail::kv_file_load<std::int64_t>(header, 32);
    if (entry.info.num_tokens < 0) return fmt::format("num_tokens = {} is negative", entry.info.num_tokens);
    entry.info.first_position = detail::kv_file_load<std::int64_t>(header, 40);
    entry.info.bytes = payload_bytes;
    entry.info.version = stored;
    return {};
  }

  // Checks payload pages [first, first + n) read into `bytes` (whole pages; the entry's last page may be short)
  // against the page table; returns an empty string, or why they fail.
  [[nodiscard]] static std::string check_pages(const Entry& e, std::uint64_t first, std::span<const std::byte> bytes) {
    for (std::size_t at = 0; at < bytes.size(); at += static_cast<std::size_t>(e.page_bytes)) {
      const std::uint64_t page = first + at / e.page_bytes;
      const std::uint64_t computed =
          fnv1a(bytes.subspan(at, std::min<std::size_t>(static_cast<std::size_t>(e.page_bytes), bytes.size() - at)));
      if (computed != e.pages[static_cast<std::size_t>(page)]) {
        return fmt::format("checksum mismatch in payload page {} (bytes {} ..): stored 0x{:016x}, computed 0x{:016x}",
                           page, page * e.page_bytes, e.pages[static_cast<std::size_t>(page)], computed);
      }
    }
    return {};
  }

  // Counts a rejection and moves the file to "<name>.rejected". When `opened` is given, the file is moved only
  // if the path still names that file (a put may have replaced it since it was read).
  void reject(const std::filesystem::path& path, const struct stat* opened, std::string_view reason) {
    std::filesystem::path aside = path;
    aside += ".rejected";
    std::lock_guard lock(mutex_);
    struct stat now {};
    const bool same_file = opened == nullptr || (::stat(path.c_str(), &now) == 0 && now.st_dev == opened->st_dev &&
                                                 now.st_ino == opened->st_ino);
    std::string fate;
    if (same_file) {
      std::error_code ec;
      std::filesystem::rename(path, aside, ec);
      fate = ec ? fmt::format("could not move it to '{}': {}", aside.string(), ec.message())
                : fmt::format("moved to '{}'", aside.string());
    } else {
      fate = "left in place: replaced by a newer put";
    }
    ++rejected_;
    last_rejection_ = fmt::format("DiskKVStore: rejected '{}': {}; {}", path.string(), reason, fate);
  }

  inline static std::atomic<std::uint64_t> temp_counter_{0};

  std::filesystem::path dir_;
  mutable std::mutex mutex_;  // guards the counters; serializes renames with rejections
  std::int64_t rejected_ = 0;
  std::string last_rejection_;
};

static_assert(RangedKVStore<DiskKVStore>);

}  // namespace kvfuse
