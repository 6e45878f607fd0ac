#pragma once
// DiskKVStore: a persistent KVStore over a directory, one checksummed file per key.
//
// When to use it: chunk caches that must outlive the process or exceed DRAM (put it behind an
// InMemoryKVStore with TieredKVStore, backend/tiered_kv_store.hpp). Files are named
// "<model:016x>-<content:016x>.kvb" after the key.
//
// Each file is one stored entry in kvfuse's entry format (backend/kv_entry.hpp: magic, version, model, key, token
// count, first position, payload size, XXH3 checksums of the header and of each 64 KiB payload page), the format
// RedisKVStore stores too. Ranged reads (RangedKVStore: get_into, get_range) read the header, the page table and only
// the pages a byte range touches, as the layer-pipelined loader reads one layer of a block.
//
// put() writes a temp file in the same directory ("<name>.<pid>-<n>.tmp") and renames it over the entry, so a
// reader sees the old file or the new one, never a half-written one; failures throw kvfuse::error naming the
// file (code() Status::store_unavailable for an I/O failure: directory gone, disk full, EIO, permissions) and
// remove the temp file. There is no fsync: after a crash an entry may be missing or, on file systems
// that reorder data and metadata, damaged — get() detects that. Temp files of writers that died mid-put are never
// read; the constructor sweeps them (sweep_temp_files): a temp file whose writer process is gone, or older than
// DiskKVStoreOptions::temp_max_age, is removed. (Writer processes are checked by pid: on a directory shared across
// hosts or pid namespaces only the age applies — set temp_max_age above the longest put there.)
//
// get() trusts nothing: a file with the wrong magic or version, a short file, a payload size that does not
// match the file size, a bad checksum, or a header naming another key (a "foreign" file copied under this
// key's name) is rejected: get() returns nullopt, the file is renamed to "<name>.rejected" (replacing an
// older one) for inspection, and rejected() / last_rejection() count and explain it. An I/O error while
// reading an existing file is a rejection too, not an exception: no read throws for a damaged entry.
//
// Thread safety: every call may run concurrently with any other, on the same key or not, from any number of
// threads, instances and processes on the same directory: writes are atomic renames, reads check what they read.
// A rejection racing another instance's put may move that put's fresh file aside (it is then a cache miss).

#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <limits>
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
#include "kvfuse/backend/kv_entry.hpp"
#include "kvfuse/core/error.hpp"
#include "kvfuse/core/types.hpp"

namespace kvfuse {
namespace detail {

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

struct DiskKVStoreOptions {
  // A temp file older than this is a dead writer's, whatever its pid says (see sweep_temp_files).
  std::chrono::seconds temp_max_age{std::chrono::hours(1)};
};

class DiskKVStore {
 public:
  // Creates `dir` (and its parents) when missing; throws kvfuse::error naming `dir` when it cannot
  // (Status::store_unavailable), or when it exists and is not a directory (Status::invalid_argument). Then sweeps
  // the temp files of dead writers (sweep_temp_files).
  explicit DiskKVStore(std::filesystem::path dir, DiskKVStoreOptions options = {})
      : dir_(std::move(dir)), options_(options) {
    detail::require(options_.temp_max_age.count() >= 0, "DiskKVStoreOptions: temp_max_age = {} s must be >= 0",
                    options_.temp_max_age.count());
    std::error_code ec;
    std::filesystem::create_directories(dir_, ec);
    if (ec || !std::filesystem::is_directory(dir_)) {
      // A path that names a file is the caller's mistake; a directory that cannot be made is the disk failing.
      std::error_code file_ec;
      const bool names_file = std::filesystem::exists(dir_, file_ec) && !std::filesystem::is_directory(dir_, file_ec);
      throw error(names_file ? Status::invalid_argument : Status::store_unavailable,
                  fmt::format("DiskKVStore: cannot use '{}' as a store directory: {}", dir_.string(),
                              ec ? ec.message() : std::string("exists and is not a directory")));
    }
    (void)sweep_temp_files();
  }

  // Removes the temp files ("<entry>.kvb.<pid>-<n>.tmp") that no live put will rename: those whose writer pid no
  // longer runs on this host, and those older than DiskKVStoreOptions::temp_max_age. Returns how many it removed.
  // Safe while other writers run: a live writer's temp file is younger than temp_max_age and its pid is alive.
  std::int64_t sweep_temp_files() {
    std::int64_t removed = 0;
    std::error_code ec;
    const auto now = std::filesystem::file_time_type::clock::now();
    for (const std::filesystem::directory_entry& e : std::filesystem::directory_iterator(dir_, ec)) {
      const std::string name = e.path().filename().string();
      const std::optional<::pid_t> writer = temp_file_writer(name);
      if (!writer) continue;
      std::error_code stat_ec;
      const auto modified = e.last_write_time(stat_ec);
      if (stat_ec) continue;  // already gone (renamed by its writer, or swept by another instance)
      const bool dead = *writer != ::getpid() && ::kill(*writer, 0) != 0 && errno == ESRCH;
      if (dead || now - modified > options_.temp_max_age) {
        std::error_code rm_ec;
        if (std::filesystem::remove(e.path(), rm_ec)) ++removed;
      }
    }
    std::lock_guard lock(mutex_);
    swept_ += removed;
    return removed;
  }

  // Temp files removed by sweeps so far.
  [[nodiscard]] std::int64_t swept() const {
    std::lock_guard lock(mutex_);
    return swept_;
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

  // contains of each key, one file at a time: result i belongs to keys[i].
  [[nodiscard]] std::vector<bool> contains_many(std::span<const KVKey> keys) const {
    std::vector<bool> out(keys.size());
    for (std::size_t i = 0; i < keys.size(); ++i) out[i] = contains(keys[i]);
    return out;
  }

  // get of each key, one file at a time: result i belongs to keys[i].
  [[nodiscard]] std::vector<std::optional<KVBlock>> get_many(std::span<const KVKey> keys) {
    std::vector<std::optional<KVBlock>> out;
    out.reserve(keys.size());
    for (const KVKey& key : keys) out.push_back(get(key));
    return out;
  }

  // The block, or nullopt when the file is absent or rejected (see the header comment).
  [[nodiscard]] std::optional<KVBlock> get(const KVKey& key) {
    std::optional<KVBlock> out;
    (void)with_entry(key, [&](int fd, const KVEntryLayout& e) -> std::string {
      KVBlock block{e.info.num_tokens, std::vector<std::byte>(static_cast<std::size_t>(e.info.bytes)),
                    e.info.first_position};
      if (std::string why = detail::pread_exact(fd, block.bytes, e.payload_offset); !why.empty()) return why;
      if (std::string why = check_kv_entry_pages(e, 0, block.bytes); !why.empty()) return why;
      out = std::move(block);
      return {};
    });
    return out;
  }

  // RangedKVStore: the entry's header (checked: magic, version, key, header checksum), or nullopt when the
  // file is absent or rejected. No payload byte is read.
  [[nodiscard]] std::optional<KVBlockInfo> describe(const KVKey& key) {
    std::optional<KVBlockInfo> out;
    (void)with_entry(key, [&](int, const KVEntryLayout& e) -> std::string {
      out = e.info;
      return {};
    });
    return out;
  }

  // RangedKVStore: payload bytes [offset, offset + out.size()) of the entry `info` described, read into `out`. Reads
  // the header, the page table and the pages the range touches, and checks them: the pages the range covers whole are
  // read straight into `out`, the (at most two) it covers in part through a page-sized buffer. False when the file is
  // absent, was replaced since describe() (another version: not a rejection), or fails a check (rejected as get()
  // would).
  [[nodiscard]] bool get_into(const KVKey& key, const KVBlockInfo& info, std::uint64_t offset,
                              std::span<std::byte> out) {
    detail::require_in_entry("DiskKVStore", "get_into", info, offset, out.size());
    bool read = false;
    const bool same = with_entry(key, [&](int fd, const KVEntryLayout& e) -> std::string {
      if (e.info.version != info.version || e.info.bytes != info.bytes) return {};  // replaced since describe()
      std::string why = read_payload(fd, e, offset, out);
      read = why.empty();
      return why;
    });
    return same && read;
  }
  [[nodiscard]] std::optional<std::vector<std::byte>> get_range(const KVKey& key, const KVBlockInfo& info,
                                                                std::uint64_t offset, std::uint64_t size) {
    return detail::get_range_by_get_into(*this, "DiskKVStore", key, info, offset, size);
  }

  // Writes the block atomically (temp file + rename), replacing any entry of the key. Throws kvfuse::error
  // naming the file and the reason: num_tokens < 0 (Status::invalid_argument); directory gone, disk full, I/O
  // error, permissions (Status::store_unavailable). The old entry, if any, is then untouched and no temp file is
  // left.
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
        throw error(Status::store_unavailable,
                    fmt::format("DiskKVStore: cannot store '{}': rename from '{}' failed: {}", path.string(),
                                temp.string(), ec.message()));
      }
    } catch (...) {
      std::error_code ignored;
      std::filesystem::remove(temp, ignored);
      throw;
    }
  }

  // Removes the key's file; returns whether it existed. Throws kvfuse::error (Status::store_unavailable) when it
  // exists but cannot be removed.
  bool erase(const KVKey& key) {
    const std::filesystem::path path = path_for(key);
    std::error_code ec;
    const bool removed = std::filesystem::remove(path, ec);
    if (ec) {
      throw error(Status::store_unavailable,
                  fmt::format("DiskKVStore: cannot erase '{}': {}", path.string(), ec.message()));
    }
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
    const std::vector<std::byte> prefix = kv_entry_prefix(key, block);
    errno = 0;
    std::ofstream out(temp, std::ios::binary | std::ios::trunc);
    if (!out.is_open()) {
      throw error(Status::store_unavailable,
                  fmt::format("DiskKVStore: cannot store '{}': cannot create temp file '{}': {}", path.string(),
                              temp.string(), errno_reason()));
    }
    out.write(reinterpret_cast<const char*>(prefix.data()), static_cast<std::streamsize>(prefix.size()));
    if (!block.bytes.empty()) {
      out.write(reinterpret_cast<const char*>(block.bytes.data()), static_cast<std::streamsize>(block.bytes.size()));
    }
    out.flush();
    if (out.good()) out.close();
    if (!out.good()) {
      throw error(Status::store_unavailable,
                  fmt::format("DiskKVStore: cannot store '{}': writing temp file '{}' ({} bytes) failed: {}",
                              path.string(), temp.string(),
                              prefix.size() + block.bytes.size(), errno_reason()));
    }
  }

  // Reads payload bytes [offset, offset + out.size()) of the open entry `e` into `out`, checking every page they
  // touch against the page table: the whole pages inside the range straight into `out`, a page the range covers in
  // part (its first and its last) into a buffer of its own, of which the range's part is copied. "" or why it failed.
  [[nodiscard]] static std::string read_payload(int fd, const KVEntryLayout& e, std::uint64_t offset,
                                                std::span<std::byte> out) {
    const std::uint64_t page = e.page_bytes;
    const std::uint64_t end = offset + out.size();
    // The whole pages inside the range: [whole_begin, whole_end) (the entry's last page is whole up to its end).
    const std::uint64_t whole_begin = std::min((offset + page - 1) / page * page, end);
    const std::uint64_t whole_end = std::max(whole_begin, end == e.info.bytes ? end : end / page * page);
    if (whole_end > whole_begin) {
      const std::span<std::byte> dst = out.subspan(whole_begin - offset, whole_end - whole_begin);
      if (std::string why = detail::pread_exact(fd, dst, e.payload_offset + whole_begin); !why.empty()) return why;
      if (std::string why = check_kv_entry_pages(e, whole_begin / page, dst); !why.empty()) return why;
    }
    std::vector<std::byte> part;
    for (const auto& [from, to] : {std::pair{offset, whole_begin}, std::pair{whole_end, end}}) {
      if (from == to) continue;
      const std::uint64_t page_begin = from / page * page;
      part.resize(static_cast<std::size_t>(std::min(page, e.info.bytes - page_begin)));
      if (std::string why = detail::pread_exact(fd, part, e.payload_offset + page_begin); !why.empty()) return why;
      if (std::string why = check_kv_entry_pages(e, from / page, part); !why.empty()) return why;
      std::memcpy(out.data() + (from - offset), part.data() + (from - page_begin), static_cast<std::size_t>(to - from));
    }
    return {};
  }

  // The writer pid of a temp file name "<16 hex>-<16 hex>.kvb.<pid>-<n>.tmp", or nullopt for any other name.
  [[nodiscard]] static std::optional<::pid_t> temp_file_writer(std::string_view name) {
    constexpr std::string_view entry_suffix = ".kvb.";
    constexpr std::string_view temp_suffix = ".tmp";
    const std::size_t at = name.find(entry_suffix);
    if (at != 33 || !name.ends_with(temp_suffix)) return std::nullopt;
    const std::string_view tail = name.substr(at + entry_suffix.size(),
                                              name.size() - at - entry_suffix.size() - temp_suffix.size());
    const std::size_t dash = tail.find('-');
    if (dash == 0 || dash == std::string_view::npos) return std::nullopt;
    std::int64_t pid = 0;
    for (const char c : tail.substr(0, dash)) {
      if (c < '0' || c > '9') return std::nullopt;
      pid = pid * 10 + (c - '0');
      if (pid > std::numeric_limits<::pid_t>::max()) return std::nullopt;
    }
    return pid > 0 ? std::optional<::pid_t>(static_cast<::pid_t>(pid)) : std::nullopt;
  }

  [[nodiscard]] static std::string errno_reason() {
    return errno != 0 ? std::string(std::strerror(errno)) : std::string("stream error");
  }

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
    KVEntryLayout entry;
    std::string reason = read_header(fd, st, key, entry);
    if (reason.empty()) reason = use(fd, entry);
    if (reason.empty()) return true;
    reject(path, &st, reason);
    return false;
  }

  // Reads and checks the header and page table of the open entry (backend/kv_entry.hpp); returns an empty string,
  // or why it is rejected.
  [[nodiscard]] static std::string read_header(int fd, const struct stat& st, const KVKey& key, KVEntryLayout& entry) {
    if (!S_ISREG(st.st_mode)) return "not a regular file";
    const auto file_size = static_cast<std::uint64_t>(st.st_size);
    std::array<std::byte, kv_entry_header_bytes> header{};
    if (file_size >= header.size()) {
      if (std::string why = detail::pread_exact(fd, header, 0); !why.empty()) return why;
    }
    if (std::string why = parse_kv_entry_header(header, file_size, key, entry); !why.empty()) return why;
    std::vector<std::byte> table(static_cast<std::size_t>(entry.payload_offset - kv_entry_header_bytes));
    if (std::string why = detail::pread_exact(fd, table, kv_entry_header_bytes); !why.empty()) return why;
    return parse_kv_entry_pages(header, table, entry);
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
  DiskKVStoreOptions options_;
  mutable std::mutex mutex_;  // guards the counters; serializes renames with rejections
  std::int64_t rejected_ = 0;
  std::int64_t swept_ = 0;
  std::string last_rejection_;
};

static_assert(RangedKVStore<DiskKVStore>);

}  // namespace kvfuse
