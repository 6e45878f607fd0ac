// DiskKVStore under real faults: a writer SIGKILLed in the middle of puts (no torn entry, and the temp files it
// leaves are swept by the next store opened on the directory), a full disk (writes past RLIMIT_FSIZE fail with
// EFBIG) and a read-only directory (an unprivileged process): puts fail with kvfuse::error naming the file (code
// Status::store_unavailable), a TieredKVStore in front keeps serving from memory, and nothing wrong is ever read.
#include <doctest/doctest.h>

#include <signal.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include <fmt/format.h>

#include "kvfuse/backend/disk_kv_store.hpp"
#include "kvfuse/backend/in_memory_store.hpp"
#include "kvfuse/backend/tiered_kv_store.hpp"
#include "kvfuse/core/error.hpp"

#include "support/test_util.hpp"

// Each store test file lives in its own namespace: the files are compiled together (a unity build).
namespace store_disk_faults {

using kvfuse::DiskKVStore;
using kvfuse::KVBlock;
using kvfuse::KVKey;
namespace fs = std::filesystem;

namespace {

KVBlock filled(std::size_t bytes, unsigned char value, std::int64_t first_position = 0) {
  return KVBlock{static_cast<std::int64_t>(bytes / 64), std::vector<std::byte>(bytes, std::byte{value}),
                 first_position};
}

int count_suffix(const fs::path& dir, std::string_view suffix) {
  int n = 0;
  for (const auto& e : fs::directory_iterator(dir))
    if (e.path().filename().string().ends_with(suffix)) ++n;
  return n;
}

}  // namespace

TEST_CASE("a writer SIGKILLed mid-put leaves no torn entry, and its temp files are swept when a store opens") {
  kvfuse_test::TempDir tmp;
  const KVKey key{0x5, 0x77};
  const KVBlock a = filled(std::size_t{8} << 20, 0xa1);
  const KVBlock b = filled(std::size_t{8} << 20, 0xb2);
  int leftovers = 0;
  int swept = 0;
  // The directory exists before the first writer: one killed before it opened its store (a slow start under
  // ThreadSanitizer or a busy machine) leaves nothing to count, not a missing directory.
  fs::create_directories(tmp.path);
  for (int trial = 0; trial < 12; ++trial) {
    const ::pid_t child = ::fork();
    REQUIRE(child >= 0);
    if (child == 0) {  // the writer: puts A and B over the same key until killed
      DiskKVStore writer(tmp.path);
      for (int i = 0;; ++i) writer.put(key, i % 2 == 0 ? a : b);
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(5 + 7 * trial));
    REQUIRE(::kill(child, SIGKILL) == 0);
    int status = 0;
    REQUIRE(::waitpid(child, &status, 0) == child);
    CHECK(WIFSIGNALED(status));
    leftovers += count_suffix(tmp.path, ".tmp");

    DiskKVStore reader(tmp.path);  // opening sweeps the dead writer's temp files
    swept += static_cast<int>(reader.swept());
    CHECK(count_suffix(tmp.path, ".tmp") == 0);
    const std::optional<KVBlock> got = reader.get(key);
    if (got) CHECK((got->bytes == a.bytes || got->bytes == b.bytes));  // the old entry or the new one, never torn
    CHECK(reader.rejected() == 0);
  }
  CHECK(swept == leftovers);
  MESSAGE(leftovers << " temp files of killed writers over 12 SIGKILLs, all swept");
}

TEST_CASE("sweep_temp_files keeps live writers' temp files and removes old ones") {
  kvfuse_test::TempDir tmp;
  DiskKVStore store(tmp.path, kvfuse::DiskKVStoreOptions{std::chrono::seconds(3600)});
  const fs::path live = tmp.path / fmt::format("0000000000000001-0000000000000002.kvb.{}-9.tmp", ::getpid());
  const fs::path dead = tmp.path / "0000000000000001-0000000000000003.kvb.2147483646-1.tmp";  // no such pid
  const fs::path other = tmp.path / "notes.tmp";                                              // not a temp of ours
  for (const fs::path& p : {live, dead, other}) std::ofstream(p) << "x";
  CHECK(store.sweep_temp_files() == 1);
  CHECK(fs::exists(live));
  CHECK_FALSE(fs::exists(dead));
  CHECK(fs::exists(other));
  fs::last_write_time(live, fs::file_time_type::clock::now() - std::chrono::hours(2));
  CHECK(store.sweep_temp_files() == 1);  // older than temp_max_age: a writer that never finished
  CHECK_FALSE(fs::exists(live));
  CHECK(store.swept() == 2);
  CHECK_THROWS_AS(DiskKVStore(tmp.path, kvfuse::DiskKVStoreOptions{std::chrono::seconds(-1)}), kvfuse::error);
}

TEST_CASE("a full disk: puts fail with kvfuse::error, store_unavailable, no temp file left; the tiered store serves") {
  kvfuse_test::TempDir tmp;
  kvfuse::InMemoryKVStore memory;
  DiskKVStore disk(tmp.path);
  kvfuse::TieredKVStore<kvfuse::InMemoryKVStore, DiskKVStore> tiered(memory, disk);
  const KVKey small_key{0x5, 0x1};
  const KVKey big_key{0x5, 0x2};
  disk.put(small_key, filled(4096, 0x11));

  // Files may not grow past 1 MiB from here: writes beyond fail with EFBIG, as on a full disk.
  struct rlimit old {};
  REQUIRE(::getrlimit(RLIMIT_FSIZE, &old) == 0);
  const auto old_handler = ::signal(SIGXFSZ, SIG_IGN);
  struct rlimit limited = old;
  limited.rlim_cur = 1 << 20;
  REQUIRE(::setrlimit(RLIMIT_FSIZE, &limited) == 0);
  std::string message;
  std::optional<kvfuse::Status> code;
  try {
    disk.put(big_key, filled(std::size_t{4} << 20, 0x22));
  } catch (const kvfuse::error& e) {
    message = e.what();
    code = e.code();
  }
  tiered.put(big_key, filled(std::size_t{4} << 20, 0x22));
  REQUIRE(::setrlimit(RLIMIT_FSIZE, &old) == 0);
  ::signal(SIGXFSZ, old_handler);

  CHECK(message.find(disk.path_for(big_key).string()) != std::string::npos);
  CHECK(message.find("failed") != std::string::npos);
  CHECK(code == kvfuse::Status::store_unavailable);
  CHECK(count_suffix(tmp.path, ".tmp") == 0);
  CHECK_FALSE(disk.contains(big_key));
  CHECK(tiered.slow_put_failures() == 1);
  const std::optional<KVBlock> got = tiered.get(big_key);  // served from memory
  REQUIRE(got.has_value());
  CHECK(got->bytes == filled(std::size_t{4} << 20, 0x22).bytes);
  REQUIRE(disk.get(small_key).has_value());  // what was there is intact
  CHECK(disk.get(small_key)->bytes == filled(4096, 0x11).bytes);
}

TEST_CASE("a read-only store directory: puts fail with kvfuse::error (store_unavailable), reads work, tiers serve") {
  kvfuse_test::TempDir tmp;
  const KVKey old_key{0x6, 0x1};
  const KVKey new_key{0x6, 0x2};
  DiskKVStore(tmp.path).put(old_key, filled(4096, 0x33));
  fs::permissions(tmp.path, fs::perms::owner_all | fs::perms::group_read | fs::perms::group_exec |
                                fs::perms::others_read | fs::perms::others_exec);
  fs::permissions(DiskKVStore(tmp.path).path_for(old_key), fs::perms::owner_read | fs::perms::owner_write |
                                                               fs::perms::group_read | fs::perms::others_read);
  // The check runs in a child process that cannot write the directory: a user other than the owner when this
  // runs as root (root writes anywhere), else the owner after chmod 0555.
  const ::pid_t child = ::fork();
  REQUIRE(child >= 0);
  if (child == 0) {
    if (::geteuid() == 0) {
      if (::setgid(65534) != 0 || ::setuid(65534) != 0) ::_exit(90);
    } else {
      fs::permissions(tmp.path, fs::perms::owner_read | fs::perms::owner_exec | fs::perms::group_read |
                                    fs::perms::group_exec | fs::perms::others_read | fs::perms::others_exec);
    }
    int failed = 0;
    DiskKVStore disk(tmp.path);
    try {
      disk.put(new_key, filled(4096, 0x44));
      failed |= 1;  // the put must throw
    } catch (const kvfuse::error& e) {
      if (std::string(e.what()).find(disk.path_for(new_key).string()) == std::string::npos) failed |= 2;
      if (e.code() != kvfuse::Status::store_unavailable) failed |= 16;
    }
    const std::optional<KVBlock> old = disk.get(old_key);
    if (!old || old->bytes != filled(4096, 0x33).bytes) failed |= 4;
    kvfuse::InMemoryKVStore memory;
    kvfuse::TieredKVStore<kvfuse::InMemoryKVStore, DiskKVStore> tiered(memory, disk);
    tiered.put(new_key, filled(4096, 0x44));
    const std::optional<KVBlock> got = tiered.get(new_key);
    if (!got || got->bytes != filled(4096, 0x44).bytes || tiered.slow_put_failures() != 1) failed |= 8;
    ::_exit(failed);
  }
  int status = 0;
  REQUIRE(::waitpid(child, &status, 0) == child);
  REQUIRE(WIFEXITED(status));
  CHECK(WEXITSTATUS(status) == 0);  // bits: 1 put did not throw, 2 message, 4 old entry, 8 tiered store, 16 code
  fs::permissions(tmp.path, fs::perms::owner_all);
  CHECK(count_suffix(tmp.path, ".tmp") == 0);
}

}  // namespace store_disk_faults
