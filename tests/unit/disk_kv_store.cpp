// DiskKVStore and TieredKVStore: persistence, the file format, rejection of damaged or foreign files, and
// I/O failures. Expected file names, sizes and header bytes are written out by hand from the format in
// backend/kv_entry.hpp.
#include <doctest/doctest.h>

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <limits>
#include <optional>
#include <string>
#include <string_view>
#include <thread>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include "kvfuse/backend/disk_kv_store.hpp"
#include "kvfuse/backend/in_memory_store.hpp"
#include "kvfuse/backend/throttled_kv_store.hpp"
#include "kvfuse/backend/tiered_kv_store.hpp"

#include "../support/test_util.hpp"

// Each unit test file lives in its own namespace: the files are compiled together (a unity build).
namespace unit_disk_kv_store {

using kvfuse::DiskKVStore;
using kvfuse::InMemoryKVStore;
using kvfuse::KVBlock;
using kvfuse::KVKey;
using kvfuse::TieredKVStore;
using kvfuse_test::TempDir;
namespace fs = std::filesystem;

namespace {

KVBlock make_block(std::int64_t num_tokens, std::vector<unsigned char> bytes, std::int64_t first_position) {
  KVBlock b;
  b.num_tokens = num_tokens;
  for (unsigned char c : bytes) b.bytes.push_back(static_cast<std::byte>(c));
  b.first_position = first_position;
  return b;
}

std::vector<unsigned char> file_bytes(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

void overwrite_bytes(const fs::path& p, std::size_t offset, std::string_view bytes) {
  std::fstream f(p, std::ios::binary | std::ios::in | std::ios::out);
  REQUIRE(f.is_open());
  f.seekp(static_cast<std::streamoff>(offset));
  f.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  REQUIRE(f.good());
}

int count_files_ending(const fs::path& dir, std::string_view suffix) {
  int n = 0;
  for (const auto& entry : fs::directory_iterator(dir)) {
    if (entry.path().filename().string().ends_with(suffix)) ++n;
  }
  return n;
}

std::uint64_t u64_at(const std::vector<unsigned char>& bytes, std::size_t offset) {
  std::uint64_t v = 0;
  std::memcpy(&v, bytes.data() + offset, sizeof v);
  return v;
}

bool contains_text(const std::string& haystack, std::string_view needle) {
  return haystack.find(needle) != std::string::npos;
}

const KVKey key_a{0x1, 0xab};
const KVBlock block_a = make_block(7, {0x01, 0x02, 0x03, 0xfa}, 42);

void check_block_a(const std::optional<KVBlock>& got) {
  REQUIRE(got.has_value());
  CHECK(got->num_tokens == 7);
  CHECK(got->first_position == 42);
  REQUIRE(got->bytes.size() == 4);
  CHECK(got->bytes[0] == std::byte{0x01});
  CHECK(got->bytes[3] == std::byte{0xfa});
}

}  // namespace

TEST_CASE("xxh3 is XXH3-64 (the published empty-input vector), and Xxh3Stream equals it over the concatenation") {
  const auto bytes = [](std::string_view s) { return std::as_bytes(std::span(s.data(), s.size())); };
  CHECK(kvfuse::xxh3(bytes("")) == 0x2D06800538D394C2ull);
  CHECK(kvfuse::xxh3(bytes("foobar")) != kvfuse::xxh3(bytes("foobaz")));
  CHECK(kvfuse::xxh3(bytes("foobar"), 7) != kvfuse::xxh3(bytes("foobar")));
  kvfuse::Xxh3Stream stream(7);
  stream.update(bytes("foo")).update(bytes("bar"));
  CHECK(stream.digest() == kvfuse::xxh3(bytes("foobar"), 7));
}

TEST_CASE("DiskKVStore round-trips bytes, num_tokens and first_position in the documented file format") {
  TempDir tmp;
  DiskKVStore store(tmp.path / "nested" / "store");  // parents are created
  CHECK(store.directory() == tmp.path / "nested" / "store");
  CHECK(fs::is_directory(store.directory()));
  CHECK_FALSE(store.contains(key_a));
  CHECK_FALSE(store.get(key_a).has_value());
  CHECK(store.rejected() == 0);  // a missing file is a miss, not a rejection

  store.put(key_a, block_a);
  const fs::path file = store.directory() / "0000000000000001-00000000000000ab.kvb";
  CHECK(store.path_for(key_a) == file);
  REQUIRE(fs::exists(file));
  CHECK(store.contains(key_a));
  check_block_a(store.get(key_a));

  const std::vector<unsigned char> raw = file_bytes(file);
  REQUIRE(raw.size() == 76);  // 64-byte header + one page-table entry + 4 payload bytes
  CHECK(std::string(raw.begin(), raw.begin() + 8) == "KVFUSEKV");
  CHECK(u64_at(raw, 8) == (std::uint64_t{65536} << 32 | 3));  // u32 version 3, then the u32 page size
  CHECK(u64_at(raw, 16) == 0x1);
  CHECK(u64_at(raw, 24) == 0xab);
  CHECK(u64_at(raw, 32) == 7);
  CHECK(u64_at(raw, 40) == 42);
  CHECK(u64_at(raw, 48) == 4);
  std::vector<std::byte> page(4);
  std::memcpy(page.data(), raw.data() + 72, 4);
  CHECK(u64_at(raw, 64) == kvfuse::xxh3(page));
  std::vector<std::byte> header(56), table(8);
  std::memcpy(header.data(), raw.data(), 56);
  std::memcpy(table.data(), raw.data() + 64, 8);
  CHECK(u64_at(raw, 56) == kvfuse::xxh3(table, kvfuse::xxh3(header)));
  CHECK(raw[72] == 0x01);
  CHECK(raw[75] == 0xfa);

  // An empty block (no tokens, no bytes) is a valid entry too.
  const KVKey empty_key{0x1, 0x0};
  store.put(empty_key, make_block(0, {}, -3));
  CHECK(fs::file_size(store.path_for(empty_key)) == 64);
  const auto empty = store.get(empty_key);
  REQUIRE(empty.has_value());
  CHECK(empty->num_tokens == 0);
  CHECK(empty->bytes.empty());
  CHECK(empty->first_position == -3);
  CHECK(store.rejected() == 0);
}

TEST_CASE("DiskKVStore entries survive a new instance, put replaces, erase removes, no temp files stay") {
  TempDir tmp;
  {
    DiskKVStore store(tmp.path);
    store.put(key_a, make_block(1, {0x10}, 0));
    store.put(key_a, block_a);  // replaces
    store.put({0x2, 0xab}, make_block(2, {0x20, 0x21}, 5));
  }
  DiskKVStore reopened(tmp.path);
  check_block_a(reopened.get(key_a));
  const auto other = reopened.get({0x2, 0xab});
  REQUIRE(other.has_value());
  CHECK(other->num_tokens == 2);
  CHECK(other->first_position == 5);
  CHECK(count_files_ending(tmp.path, ".kvb") == 2);
  CHECK(count_files_ending(tmp.path, ".tmp") == 0);

  CHECK(reopened.erase(key_a));
  CHECK_FALSE(reopened.erase(key_a));
  CHECK_FALSE(reopened.contains(key_a));
  CHECK_FALSE(reopened.get(key_a).has_value());
  CHECK(reopened.contains({0x2, 0xab}));
  CHECK(reopened.rejected() == 0);
}

TEST_CASE("DiskKVStore rejects a corrupt payload byte, moves the file aside, and accepts a new put") {
  TempDir tmp;
  DiskKVStore store(tmp.path);
  store.put(key_a, block_a);
  const fs::path file = store.path_for(key_a);
  overwrite_bytes(file, 73, "\x7f");  // payload byte 1: 0x02 -> 0x7f

  CHECK_FALSE(store.get(key_a).has_value());
  CHECK(store.rejected() == 1);
  const std::string why = store.last_rejection();
  CHECK(contains_text(why, "checksum"));
  CHECK(contains_text(why, "0000000000000001-00000000000000ab.kvb"));
  CHECK_FALSE(fs::exists(file));
  CHECK(fs::exists(tmp.path / "0000000000000001-00000000000000ab.kvb.rejected"));
  CHECK_FALSE(store.contains(key_a));
  CHECK_FALSE(store.get(key_a).has_value());  // gone now: a plain miss
  CHECK(store.rejected() == 1);

  store.put(key_a, block_a);
  check_block_a(store.get(key_a));
  CHECK(store.rejected() == 1);

  // A second rejection of the same key replaces the older .rejected file.
  overwrite_bytes(file, 20, "\x55");  // a header byte (model) is checksummed too
  CHECK_FALSE(store.get(key_a).has_value());
  CHECK(store.rejected() == 2);
  CHECK(count_files_ending(tmp.path, ".rejected") == 1);
  CHECK(file_bytes(tmp.path / "0000000000000001-00000000000000ab.kvb.rejected")[20] == 0x55);
}

TEST_CASE("DiskKVStore rejects truncated files, wrong magic and unsupported versions") {
  TempDir tmp;
  DiskKVStore store(tmp.path);
  const fs::path file = store.path_for(key_a);

  SUBCASE("payload cut short") {
    store.put(key_a, block_a);
    fs::resize_file(file, 66);
    CHECK_FALSE(store.get(key_a).has_value());
    CHECK(contains_text(store.last_rejection(), "payload size 4 does not match entry size 66"));
  }
  SUBCASE("header cut short") {
    store.put(key_a, block_a);
    fs::resize_file(file, 10);
    CHECK_FALSE(store.get(key_a).has_value());
    CHECK(contains_text(store.last_rejection(), "truncated: 10 bytes"));
  }
  SUBCASE("empty file") {
    std::ofstream(file, std::ios::binary).flush();
    CHECK(store.contains(key_a));  // contains does not validate
    CHECK_FALSE(store.get(key_a).has_value());
    CHECK(contains_text(store.last_rejection(), "truncated: 0 bytes"));
  }
  SUBCASE("wrong magic") {
    store.put(key_a, block_a);
    overwrite_bytes(file, 0, "X");
    CHECK_FALSE(store.get(key_a).has_value());
    CHECK(contains_text(store.last_rejection(), "wrong magic"));
  }
  SUBCASE("unsupported version") {
    store.put(key_a, block_a);
    overwrite_bytes(file, 8, "\x01");  // a version-1 file (one whole-payload checksum) is not read
    CHECK_FALSE(store.get(key_a).has_value());
    CHECK(contains_text(store.last_rejection(), "unsupported format version 1"));
  }
  CHECK(store.rejected() == 1);
  CHECK_FALSE(fs::exists(file));
  CHECK(fs::exists(tmp.path / "0000000000000001-00000000000000ab.kvb.rejected"));
}

TEST_CASE("DiskKVStore rejects a foreign entry copied under another key's name") {
  TempDir tmp;
  DiskKVStore store(tmp.path);
  store.put(key_a, block_a);

  SUBCASE("another model") {
    const KVKey other_model{0x2, 0xab};
    fs::copy_file(store.path_for(key_a), tmp.path / "0000000000000002-00000000000000ab.kvb");
    CHECK(store.contains(other_model));
    CHECK_FALSE(store.get(other_model).has_value());
    const std::string why = store.last_rejection();
    CHECK(contains_text(why, "model 0x0000000000000001"));
    CHECK(contains_text(why, "0x0000000000000002"));
    CHECK(fs::exists(tmp.path / "0000000000000002-00000000000000ab.kvb.rejected"));
  }
  SUBCASE("other content") {
    const KVKey other_content{0x1, 0xcd};
    fs::copy_file(store.path_for(key_a), tmp.path / "0000000000000001-00000000000000cd.kvb");
    CHECK_FALSE(store.get(other_content).has_value());
    const std::string why = store.last_rejection();
    CHECK(contains_text(why, "content 0x00000000000000ab"));
    CHECK(contains_text(why, "0x00000000000000cd"));
  }
  CHECK(store.rejected() == 1);
  check_block_a(store.get(key_a));  // the original is untouched
  CHECK(store.rejected() == 1);
}

TEST_CASE("DiskKVStore reports I/O failures: directory removed, path is a file, negative num_tokens") {
  TempDir tmp;
  {
    DiskKVStore store(tmp.path / "store");
    store.put(key_a, block_a);
    fs::remove_all(tmp.path / "store");
    try {
      store.put(key_a, block_a);
      FAIL("put into a removed directory must throw");
    } catch (const kvfuse::error& e) {
      CHECK(contains_text(e.what(), (tmp.path / "store" / "0000000000000001-00000000000000ab.kvb").string()));
      CHECK(contains_text(e.what(), "No such file or directory"));
    }
    CHECK_FALSE(store.get(key_a).has_value());
    CHECK_FALSE(store.contains(key_a));
    CHECK_FALSE(store.erase(key_a));
    CHECK(store.rejected() == 0);
  }

  const fs::path regular = tmp.path / "plain-file";
  std::ofstream(regular) << "not a directory";
  try {
    DiskKVStore bad(regular);
    FAIL("a regular file is not a store directory");
  } catch (const kvfuse::error& e) {
    CHECK(contains_text(e.what(), regular.string()));
  }
  CHECK_THROWS_AS(DiskKVStore(regular / "below"), kvfuse::error);  // cannot create under a file

  DiskKVStore store(tmp.path / "store2");
  try {
    store.put(key_a, make_block(-1, {0x01}, 0));
    FAIL("negative num_tokens must be rejected");
  } catch (const kvfuse::error& e) {
    CHECK(contains_text(e.what(), "num_tokens = -1"));
  }
  CHECK_FALSE(store.contains(key_a));
  CHECK(count_files_ending(store.directory(), ".tmp") == 0);
}

TEST_CASE("DiskKVStore: a reader thread racing a writer only ever sees whole entries") {
  TempDir tmp;
  DiskKVStore store(tmp.path);
  const auto block_of = [](int i) {
    // Sizes and contents vary with i, so a torn file could not pass as any whole one.
    return make_block(i, std::vector<unsigned char>(static_cast<std::size_t>(1 + (i % 7) * 1000),
                                                    static_cast<unsigned char>(i)),
                      i);
  };
  std::atomic<bool> done{false};
  std::atomic<int> hits{0};
  int bad = 0;
  std::thread reader([&] {
    while (!done.load()) {
      const auto got = store.get(key_a);
      if (!got) continue;
      ++hits;
      const auto i = static_cast<int>(got->num_tokens);
      if (got->first_position != i || got->bytes.size() != static_cast<std::size_t>(1 + (i % 7) * 1000) ||
          got->bytes.back() != static_cast<std::byte>(static_cast<unsigned char>(i))) {
        ++bad;
      }
    }
  });
  // At least 300 puts, and on until the reader has overlapped with 100 of them (bounded, for slow machines).
  int puts = 0;
  while (puts < 300 || (hits.load() < 100 && puts < 100000)) store.put(key_a, block_of(puts++));
  done = true;
  reader.join();
  CHECK(hits.load() >= 100);
  CHECK(bad == 0);
  CHECK(store.rejected() == 0);
  const auto last = store.get(key_a);
  REQUIRE(last.has_value());
  CHECK(last->num_tokens == puts - 1);
  CHECK(count_files_ending(tmp.path, ".tmp") == 0);
}

TEST_CASE("TieredKVStore promotes slow hits and keeps serving from memory when the disk tier fails") {
  TempDir tmp;
  InMemoryKVStore memory;
  DiskKVStore disk(tmp.path / "disk");
  TieredKVStore<InMemoryKVStore, DiskKVStore> tiered(memory, disk);

  // Promotion: an entry only on disk is copied into memory by get.
  disk.put(key_a, block_a);
  CHECK(tiered.contains(key_a));
  CHECK_FALSE(memory.contains(key_a));
  check_block_a(tiered.get(key_a));
  CHECK(memory.contains(key_a));
  check_block_a(memory.get(key_a));

  // put writes both tiers.
  const KVKey key_b{0x1, 0xbb};
  tiered.put(key_b, make_block(2, {0x0b, 0x0c}, 9));
  CHECK(memory.contains(key_b));
  CHECK(disk.contains(key_b));
  CHECK(tiered.put_failures(1) == 0);
  CHECK(tiered.last_put_error(1).empty());

  // The disk tier goes away: reads are served from memory, puts keep the block in memory and record why.
  fs::remove_all(tmp.path / "disk");
  const KVKey key_c{0x1, 0xcc};
  CHECK_NOTHROW(tiered.put(key_c, make_block(3, {0x0c}, 11)));
  CHECK(tiered.put_failures(1) == 1);
  CHECK(contains_text(tiered.last_put_error(1), (tmp.path / "disk").string()));
  const auto c = tiered.get(key_c);
  REQUIRE(c.has_value());
  CHECK(c->num_tokens == 3);
  CHECK(c->first_position == 11);
  check_block_a(tiered.get(key_a));
  CHECK(tiered.get(key_b).has_value());
  CHECK_FALSE(tiered.get({0x1, 0xdd}).has_value());  // a miss in both tiers
  CHECK(disk.rejected() == 0);

  // erase: true when either tier had it.
  CHECK(tiered.erase(key_c));
  CHECK_FALSE(tiered.contains(key_c));
  CHECK_FALSE(tiered.erase(key_c));
}

TEST_CASE("ThrottledKVStore: a get returns the inner block no earlier than latency + bytes / bandwidth") {
  using clock = std::chrono::steady_clock;
  InMemoryKVStore memory;
  const KVKey key{1, 2};
  KVBlock block{4, std::vector<std::byte>(1'000'000, std::byte{7}), 12};
  memory.put(key, block);
  kvfuse::ThrottledKVStore link(memory, {/*megabytes_per_s=*/100.0, /*latency_ms=*/5.0});
  CHECK(link.contains(key));
  const auto t0 = clock::now();
  const auto got = link.get(key);
  const double seconds = std::chrono::duration<double>(clock::now() - t0).count();
  REQUIRE(got.has_value());
  CHECK(got->bytes == block.bytes);
  CHECK(got->first_position == 12);
  CHECK(seconds >= 0.015);  // 1 MB at 100 MB/s = 10 ms, + 5 ms latency: a lower bound, never an upper one
  CHECK(link.stats().reads == 1);
  CHECK(link.stats().bytes == 1'000'000);
  CHECK(link.stats().bytes_per_s() <= 1e6 / 0.015);

  // A miss costs the latency and returns nothing; puts and erases go straight through.
  CHECK_FALSE(link.get(KVKey{1, 3}).has_value());
  CHECK(link.stats().bytes == 1'000'000);
  link.put(KVKey{1, 4}, KVBlock{1, std::vector<std::byte>(8), 0});
  CHECK(memory.contains(KVKey{1, 4}));
  CHECK(link.erase(KVKey{1, 4}));
  CHECK_FALSE(memory.contains(KVKey{1, 4}));
}

TEST_CASE("ThrottledKVStore: concurrent gets share the link's bandwidth") {
  using clock = std::chrono::steady_clock;
  InMemoryKVStore memory;
  memory.put(KVKey{1, 1}, KVBlock{1, std::vector<std::byte>(500'000), 0});
  memory.put(KVKey{1, 2}, KVBlock{1, std::vector<std::byte>(500'000), 0});
  kvfuse::ThrottledKVStore link(memory, {/*megabytes_per_s=*/50.0, /*latency_ms=*/0.0});
  const auto t0 = clock::now();
  std::thread other([&] { CHECK(link.get(KVKey{1, 1}).has_value()); });
  CHECK(link.get(KVKey{1, 2}).has_value());
  other.join();
  // 1 MB through one 50 MB/s link: the second get ends at least 20 ms after the first began.
  CHECK(std::chrono::duration<double>(clock::now() - t0).count() >= 0.020);
  CHECK(link.stats().reads == 2);
  CHECK(link.stats().bytes == 1'000'000);
}

TEST_CASE("LinkConfig refuses negative or non-finite bandwidth and latency, naming them") {
  InMemoryKVStore memory;
  CHECK_THROWS_WITH_AS(kvfuse::ThrottledKVStore(memory, {-1.0, 0.0}), doctest::Contains("megabytes_per_s = -1"),
                       kvfuse::error);
  CHECK_THROWS_WITH_AS(kvfuse::ThrottledKVStore(memory, {1.0, std::numeric_limits<double>::infinity()}),
                       doctest::Contains("latency_ms = inf"), kvfuse::error);
  kvfuse::ThrottledKVStore unlimited(memory, {});
  CHECK(unlimited.link().megabytes_per_s == 0.0);
}

namespace {

// A block of `size` bytes whose byte i is i * 7 + 3 (mod 256): every range of it is recognisable.
KVBlock patterned_block(std::size_t size, std::int64_t first_position) {
  KVBlock b{static_cast<std::int64_t>(size / 16), std::vector<std::byte>(size), first_position};
  for (std::size_t i = 0; i < size; ++i) b.bytes[i] = static_cast<std::byte>((i * 7 + 3) & 0xffu);
  return b;
}

bool range_is(const std::optional<std::vector<std::byte>>& got, const KVBlock& block, std::size_t offset,
              std::size_t size) {
  return got.has_value() && got->size() == size &&
         std::equal(got->begin(), got->end(), block.bytes.begin() + static_cast<std::ptrdiff_t>(offset));
}

}  // namespace

TEST_CASE("Ranged reads (describe + get_range) return exactly the bytes of get, on every ranged store") {
  TempDir tmp;
  DiskKVStore disk(tmp.path);
  InMemoryKVStore memory;
  kvfuse::ThrottledKVStore link(memory, {/*megabytes_per_s=*/0.0, /*latency_ms=*/0.0});
  const KVBlock block = patterned_block(3 * 65536 + 1000, 17);  // four disk pages, the last one short
  const KVKey key{0x5, 0x6};
  disk.put(key, block);
  memory.put(key, block);
  const auto check_store = [&](auto& store) {
    CHECK_FALSE(store.describe(KVKey{0x5, 0x7}).has_value());
    const auto info = store.describe(key);
    REQUIRE(info.has_value());
    CHECK(info->num_tokens == block.num_tokens);
    CHECK(info->first_position == 17);
    CHECK(info->bytes == block.bytes.size());
    for (const auto& range : std::vector<std::pair<std::size_t, std::size_t>>{
             {0, 0}, {70000, 0}, {0, 10}, {65530, 20}, {65536, 65536}, {100, 3 * 65536}, {3 * 65536, 1000}, {0, block.bytes.size()}}) {
      const std::size_t offset = range.first;
      const std::size_t size = range.second;
      CAPTURE(offset);
      CAPTURE(size);
      CHECK(range_is(store.get_range(key, *info, offset, size), block, offset, size));
    }
    CHECK_THROWS_WITH_AS((void)store.get_range(key, *info, block.bytes.size() - 5, 6),
                         doctest::Contains("of a 197608-byte entry"), kvfuse::error);
  };
  check_store(disk);
  check_store(memory);
  check_store(link);
  CHECK(link.stats().reads == 10);  // describe x2, 8 ranges (the refused one reads nothing)
  CHECK(disk.rejected() == 0);
}

TEST_CASE("DiskKVStore::get_range checks only the pages it reads, and refuses a replaced entry without rejecting it") {
  TempDir tmp;
  DiskKVStore store(tmp.path);
  const KVBlock block = patterned_block(4 * 65536, 0);
  const KVKey key{0x5, 0x6};
  store.put(key, block);
  const auto info = store.describe(key);
  REQUIRE(info.has_value());

  SUBCASE("a corrupt page fails the ranges touching it, the file is set aside, get agrees") {
    const std::uint64_t payload = 64 + 4 * 8;
    overwrite_bytes(store.path_for(key), payload + 2 * 65536 + 5, "\x01");  // page 2
    CHECK(range_is(store.get_range(key, *info, 0, 2 * 65536), block, 0, 2 * 65536));  // pages 0-1 are fine
    CHECK(store.rejected() == 0);
    CHECK_FALSE(store.get_range(key, *info, 2 * 65536 - 1, 2).has_value());  // touches page 2
    CHECK(store.rejected() == 1);
    CHECK(contains_text(store.last_rejection(), "checksum mismatch in payload page 2"));
    CHECK_FALSE(store.describe(key).has_value());  // moved aside: a miss now
    CHECK_FALSE(store.get(key).has_value());
  }
  SUBCASE("an entry replaced since describe is another version: nullopt, not a rejection") {
    KVBlock other = block;
    other.bytes[0] = std::byte{0xee};
    store.put(key, other);
    CHECK_FALSE(store.get_range(key, *info, 0, 16).has_value());
    CHECK(store.rejected() == 0);
    const auto fresh = store.describe(key);
    REQUIRE(fresh.has_value());
    CHECK(fresh->version != info->version);
    const auto first = store.get_range(key, *fresh, 0, 1);
    REQUIRE(first.has_value());
    CHECK((*first)[0] == std::byte{0xee});
  }
  SUBCASE("a corrupt page-table entry or header byte fails describe") {
    overwrite_bytes(store.path_for(key), 64 + 8, "\x01");
    CHECK_FALSE(store.describe(key).has_value());
    CHECK(contains_text(store.last_rejection(), "header checksum mismatch"));
  }
}

TEST_CASE("InMemoryKVStore::get_range refuses an entry replaced or erased since describe") {
  InMemoryKVStore memory;
  const KVKey key{1, 2};
  memory.put(key, patterned_block(64, 0));
  const auto info = memory.describe(key);
  REQUIRE(info.has_value());
  CHECK(memory.get_range(key, *info, 0, 64).has_value());
  memory.put(key, patterned_block(64, 0));  // same bytes, a new put: another version
  CHECK_FALSE(memory.get_range(key, *info, 0, 64).has_value());
  const auto fresh = memory.describe(key);
  REQUIRE(fresh.has_value());
  memory.erase(key);
  CHECK_FALSE(memory.get_range(key, *fresh, 0, 64).has_value());
}

}  // namespace unit_disk_kv_store
