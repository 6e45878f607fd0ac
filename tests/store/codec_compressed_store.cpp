// CompressedKVStore: bit-exact round trips per codec on KV-like fp32 / fp16 data and on empty and tiny blocks,
// entries written with another codec, damaged entries (a miss with a reason, never an exception or wrong bytes),
// layering over DiskKVStore, contains_many / get_many, option validation, statistics, and one reader next to one
// writer (tsan).
#include <doctest/doctest.h>

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <optional>
#include <random>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "kvfuse/backend/compressed_kv_store.hpp"
#include "kvfuse/backend/disk_kv_store.hpp"
#include "kvfuse/backend/in_memory_store.hpp"
#include "kvfuse/core/dtype.hpp"

#include "../support/error_of.hpp"
#include "../support/test_util.hpp"

// Each store test file lives in its own namespace: the files are compiled together (a unity build).
namespace store_codec_compressed_store {

using kvfuse::Codec;
using kvfuse::CodecOptions;
using kvfuse::CompressedKVStore;
using kvfuse::DiskKVStore;
using kvfuse::InMemoryKVStore;
using kvfuse::KVBlock;
using kvfuse::KVKey;

namespace {

// KV-like rows, layer after layer (K rows then V rows, as LlamaKVCache::to_block): per channel a log-normal
// scale (K has outlier channels) and a slow drift along the positions (RoPE-rotated K), plus Gaussian noise;
// stored as fp32 or rounded to fp16.
KVBlock kv_block(std::int64_t rows, kvfuse::DType dtype, std::uint32_t seed, std::int64_t layers = 4,
                 std::int64_t width = 64) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> noise(0.0f, 1.0f);
  std::vector<float> scale(static_cast<std::size_t>(width));
  for (float& s : scale) s = std::exp(0.8f * noise(rng));
  std::vector<float> values;
  for (std::int64_t l = 0; l < layers; ++l)
    for (int kv = 0; kv < 2; ++kv)
      for (std::int64_t r = 0; r < rows; ++r)
        for (std::int64_t c = 0; c < width; ++c) {
          const float drift = kv == 0 ? std::sin(0.05f * static_cast<float>(r * (c % 8 + 1))) : 0.0f;
          values.push_back(scale[static_cast<std::size_t>(c)] * (drift + 0.5f * noise(rng)));
        }
  KVBlock b;
  b.num_tokens = rows;
  b.first_position = 11;
  if (dtype == kvfuse::DType::f32) {
    b.bytes.resize(values.size() * sizeof(float));
    std::memcpy(b.bytes.data(), values.data(), b.bytes.size());
  } else {
    std::vector<kvfuse::f16> half;
    for (float v : values) half.push_back(kvfuse::to_f16(v));
    b.bytes.resize(half.size() * sizeof(kvfuse::f16));
    std::memcpy(b.bytes.data(), half.data(), b.bytes.size());
  }
  return b;
}

KVBlock bytes_block(std::vector<unsigned char> bytes, std::int64_t num_tokens = 1) {
  KVBlock b;
  b.num_tokens = num_tokens;
  b.first_position = 3;
  for (unsigned char c : bytes) b.bytes.push_back(static_cast<std::byte>(c));
  return b;
}

void check_same(const std::optional<KVBlock>& got, const KVBlock& want) {
  REQUIRE(got.has_value());
  CHECK(got->num_tokens == want.num_tokens);
  CHECK(got->first_position == want.first_position);
  CHECK(got->bytes == want.bytes);
}

const std::vector<CodecOptions> all_codecs{{Codec::none},     {Codec::lz4},         {Codec::lz4, 3, 8},
                                           {Codec::zstd, 1},  {Codec::zstd, 3},     {Codec::zstd, -5},
                                           {Codec::none, 3, 1, 2}, {Codec::lz4, 3, 1, 4}, {Codec::zstd, 1, 1, 2}};

std::string describe(const CodecOptions& o) {
  return std::string(kvfuse::codec_name(o.codec)) + " zstd_level " + std::to_string(o.zstd_level) +
         " lz4_acceleration " + std::to_string(o.lz4_acceleration) + " shuffle " + std::to_string(o.shuffle);
}

bool has(const std::string& haystack, std::string_view needle) {
  if (haystack.find(needle) != std::string::npos) return true;
  MESSAGE("\"" << haystack << "\" lacks \"" << std::string(needle) << "\"");
  return false;
}

const KVKey key{0x51, 0x7e};

}  // namespace

TEST_CASE("CompressedKVStore round-trips KV-like fp32 and fp16 blocks bit for bit with every codec") {
  const KVBlock f32 = kv_block(48, kvfuse::DType::f32, 1);
  const KVBlock f16 = kv_block(48, kvfuse::DType::f16, 2);
  for (const CodecOptions& o : all_codecs) {
    CAPTURE(describe(o));
    InMemoryKVStore inner;
    CompressedKVStore store(inner, o);
    CHECK_FALSE(store.contains(key));
    CHECK_FALSE(store.get(key).has_value());
    CHECK(store.rejected() == 0);  // absent: a miss, not a rejection

    store.put(key, f32);
    CHECK(store.contains(key));
    check_same(store.get(key), f32);
    store.put(key, f16);  // replaces
    check_same(store.get(key), f16);

    const kvfuse::CodecStats s = store.stats();
    CHECK(s.puts == 2);
    CHECK(s.gets == 2);
    CHECK(s.raw_bytes_put == static_cast<std::int64_t>(f32.bytes.size() + f16.bytes.size()));
    CHECK(s.raw_bytes_got == s.raw_bytes_put);
    CHECK(s.stored_bytes_got == s.stored_bytes_put);
    CHECK(inner.bytes() == static_cast<std::int64_t>(inner.get(key)->bytes.size()));
    CHECK(s.compress_s > 0);
    CHECK(s.decompress_s > 0);
    CHECK(store.rejected() == 0);
    if (o.codec == Codec::none) {
      CHECK(s.stored_bytes_put == s.raw_bytes_put + 2 * 24);  // the header only
    } else if (o.codec == Codec::zstd && o.zstd_level > 0) {
      CHECK(s.stored_ratio() < 0.97);  // entropy coding: exponents and high mantissa bytes compress
    } else {
      CHECK(s.stored_ratio() < 1.01);  // lz4 (and zstd's fast levels) find few repeats in noisy floats
    }
    CHECK(store.erase(key));
    CHECK_FALSE(store.contains(key));
  }
}

TEST_CASE("CompressedKVStore: a byte shuffle of 4 saves bytes on KV-like fp32") {
  // The planes of sign / exponent bytes repeat where the interleaved bytes do not. (Shuffling cannot help data
  // without repeats: lz4's literals and zstd's Huffman tables depend on the byte histogram only.)
  const KVBlock b = kv_block(64, kvfuse::DType::f32, 7);
  for (const Codec c : {Codec::lz4, Codec::zstd}) {
    CAPTURE(kvfuse::codec_name(c));
    const auto stored = [&](int shuffle) {
      InMemoryKVStore inner;
      CompressedKVStore store(inner, CodecOptions{c, 1, 1, shuffle});
      store.put(key, b);
      check_same(store.get(key), b);
      return store.stats().stored_bytes_put;
    };
    CHECK(stored(4) < stored(0));
  }
}

TEST_CASE("CompressedKVStore round-trips empty and tiny blocks with every codec") {
  const std::vector<KVBlock> blocks{bytes_block({}, 0), bytes_block({0x7f}), bytes_block({0, 0, 0}),
                                    bytes_block({1, 2, 3, 4, 5, 6, 7}),  // a tail the shuffle leaves in place
                                    bytes_block(std::vector<unsigned char>(100000, 0), 5)};
  for (const CodecOptions& o : all_codecs) {
    CAPTURE(describe(o));
    InMemoryKVStore inner;
    CompressedKVStore store(inner, o);
    for (std::size_t i = 0; i < blocks.size(); ++i) {
      CAPTURE(i);
      const KVKey k{1, i};
      store.put(k, blocks[i]);
      check_same(store.get(k), blocks[i]);
    }
    if (o.codec != Codec::none) CHECK(inner.get(KVKey{1, 4})->bytes.size() < 1000);  // 100 kB of zeros
    CHECK(store.rejected() == 0);
  }
}

TEST_CASE("CompressedKVStore reads entries written with another codec or level: the header says which") {
  const KVBlock b = kv_block(32, kvfuse::DType::f16, 3);
  for (const CodecOptions& writer : all_codecs) {
    InMemoryKVStore inner;
    CompressedKVStore<InMemoryKVStore>(inner, writer).put(key, b);
    for (const CodecOptions& reader : all_codecs) {
      CAPTURE(describe(writer));
      CAPTURE(describe(reader));
      CompressedKVStore store(inner, reader);
      check_same(store.get(key), b);
      CHECK(store.rejected() == 0);
    }
  }
}

TEST_CASE("CompressedKVStore rejects damaged entries: a miss with a reason, never an exception or wrong bytes") {
  const KVBlock b = kv_block(32, kvfuse::DType::f32, 4);
  struct Damage {
    const char* what;
    std::vector<Codec> codecs;
    void (*apply)(std::vector<std::byte>&);
    const char* reason;  // a substring of last_rejection(); codec-specific ones are checked by the codec's name
  };
  const std::vector<Damage> damages{
      {"flipped compressed bytes", {Codec::none, Codec::lz4, Codec::zstd},
       [](std::vector<std::byte>& e) {
         const std::size_t at = 24 + (e.size() - 24) / 3;
         for (std::size_t i = at; i < at + 16; ++i) e[i] ^= std::byte{0x5a};
       },
       ""},
      {"truncated", {Codec::none, Codec::lz4, Codec::zstd}, [](std::vector<std::byte>& e) { e.resize(e.size() - 7); },
       ""},
      {"raw size + 1", {Codec::none, Codec::lz4, Codec::zstd},
       [](std::vector<std::byte>& e) {
         std::uint64_t v = 0;
         std::memcpy(&v, e.data() + 8, 8);
         ++v;
         std::memcpy(e.data() + 8, &v, 8);
       },
       ""},
      {"raw size - 1", {Codec::none, Codec::lz4, Codec::zstd},
       [](std::vector<std::byte>& e) {
         std::uint64_t v = 0;
         std::memcpy(&v, e.data() + 8, 8);
         --v;
         std::memcpy(e.data() + 8, &v, 8);
       },
       ""},
      {"raw size 2^62", {Codec::none, Codec::lz4, Codec::zstd},
       [](std::vector<std::byte>& e) {
         const std::uint64_t v = std::uint64_t{1} << 62;
         std::memcpy(e.data() + 8, &v, 8);
       },
       "raw size"},
      {"checksum", {Codec::none, Codec::lz4, Codec::zstd}, [](std::vector<std::byte>& e) { e[16] ^= std::byte{1}; },
       "checksum mismatch"},
      {"unknown codec", {Codec::lz4}, [](std::vector<std::byte>& e) { e[5] = std::byte{7}; }, "unknown codec 7"},
      {"unknown shuffle width", {Codec::zstd}, [](std::vector<std::byte>& e) { e[6] = std::byte{3}; },
       "unknown shuffle width 3"},
      {"shuffle flag cleared", {Codec::zstd}, [](std::vector<std::byte>& e) { e[6] = std::byte{0}; },
       "checksum mismatch"},
      {"codec id of another codec", {Codec::lz4}, [](std::vector<std::byte>& e) { e[5] = std::byte{2}; }, "zstd"},
      {"wrong magic", {Codec::zstd}, [](std::vector<std::byte>& e) { e[0] = std::byte{'X'}; }, "wrong magic"},
      {"format version 2", {Codec::zstd}, [](std::vector<std::byte>& e) { e[4] = std::byte{2}; },
       "unsupported format version 2"},
      {"shorter than the header", {Codec::zstd}, [](std::vector<std::byte>& e) { e.resize(23); }, "shorter than"},
  };
  for (const Damage& d : damages) {
    for (const Codec c : d.codecs) {
      CAPTURE(d.what);
      CAPTURE(kvfuse::codec_name(c));
      InMemoryKVStore inner;
      CompressedKVStore store(inner, CodecOptions{c, 3, 1, 4});
      store.put(key, b);
      KVBlock entry = *inner.get(key);
      d.apply(entry.bytes);
      inner.put(key, entry);
      std::optional<KVBlock> got;
      CHECK_NOTHROW(got = store.get(key));
      CHECK_FALSE(got.has_value());
      CHECK(store.rejected() == 1);
      CHECK(store.stats().gets == 0);
      const std::string why = store.last_rejection();
      CHECK(has(why, "CompressedKVStore: rejected entry 0000000000000051-000000000000007e"));
      CHECK(has(why, d.reason));
      CHECK(store.contains(key));  // left in place until overwritten
      store.put(key, b);
      check_same(store.get(key), b);
      CHECK(store.rejected() == 1);
    }
  }
}

TEST_CASE("CompressedKVStore rejects a block its inner store holds that it did not write") {
  InMemoryKVStore inner;
  inner.put(key, kv_block(8, kvfuse::DType::f32, 5));
  CompressedKVStore store(inner, CodecOptions{});
  CHECK_FALSE(store.get(key).has_value());
  CHECK(store.rejected() == 1);
  CHECK(has(store.last_rejection(), "wrong magic"));
}

TEST_CASE("CompressedKVStore: contains_many and get_many equal contains and get, a foreign entry a miss in both") {
  InMemoryKVStore inner;
  CompressedKVStore store(inner, CodecOptions{Codec::zstd});
  const KVKey a{9, 1}, b{9, 2}, foreign{9, 3}, absent{9, 4};
  store.put(a, kv_block(8, kvfuse::DType::f32, 1));
  store.put(b, kv_block(3, kvfuse::DType::f16, 2));
  inner.put(foreign, kv_block(4, kvfuse::DType::f32, 3));  // not written by a CompressedKVStore
  const std::vector<KVKey> keys{a, foreign, absent, b, a};
  CHECK(store.contains_many(keys) == std::vector<bool>{true, true, false, true, true});
  const std::vector<std::optional<KVBlock>> got = store.get_many(keys);
  REQUIRE(got.size() == keys.size());
  for (std::size_t i = 0; i < keys.size(); ++i) {
    CAPTURE(i);
    const std::optional<KVBlock> one = store.get(keys[i]);
    CHECK(got[i].has_value() == one.has_value());
    if (one) CHECK(got[i]->bytes == one->bytes);
  }
  CHECK_FALSE(got[1].has_value());
  CHECK(store.rejected() == 2);  // the foreign entry, by get_many and by get
  CHECK(store.stats().gets == 6);
}

TEST_CASE("CompressedKVStore over DiskKVStore: compressed files, persistence across codecs, damage caught below") {
  kvfuse_test::TempDir tmp;
  const KVBlock b = kv_block(64, kvfuse::DType::f16, 6);
  DiskKVStore disk(tmp.path);
  {
    CompressedKVStore store(disk, CodecOptions{Codec::zstd, 3});
    store.put(key, b);
    check_same(store.get(key), b);
    const auto file = std::filesystem::file_size(disk.path_for(key));
    CHECK(file < b.bytes.size());
    CHECK(static_cast<std::int64_t>(file) > store.stats().stored_bytes_put);  // DiskKVStore's header + page table
  }
  {
    DiskKVStore reopened(tmp.path);
    CompressedKVStore store(reopened, CodecOptions{Codec::lz4});
    check_same(store.get(key), b);  // written with zstd, read by an lz4 store
    store.put(KVKey{2, 2}, b);
    check_same(store.get(KVKey{2, 2}), b);
  }
  // A damaged file: DiskKVStore's page checksum rejects it first; the wrapper sees a miss.
  {
    std::fstream f(disk.path_for(key), std::ios::binary | std::ios::in | std::ios::out);
    REQUIRE(f.is_open());
    f.seekp(-5, std::ios::end);
    f.put('\x42');
  }
  CompressedKVStore store(disk, CodecOptions{Codec::zstd});
  std::optional<KVBlock> got;
  CHECK_NOTHROW(got = store.get(key));
  CHECK_FALSE(got.has_value());
  CHECK(disk.rejected() == 1);
  CHECK(store.rejected() == 0);
  // Damage inside a well-formed disk entry (written directly): the wrapper's checks catch it.
  InMemoryKVStore scratch;
  CompressedKVStore<InMemoryKVStore>(scratch, CodecOptions{Codec::zstd}).put(key, b);
  KVBlock entry = *scratch.get(key);
  entry.bytes[entry.bytes.size() / 2] ^= std::byte{0x10};
  disk.put(key, entry);
  CHECK_FALSE(store.get(key).has_value());
  CHECK(store.rejected() == 1);
  CHECK(disk.rejected() == 1);
}

TEST_CASE("CompressedKVStore refuses a raw size above max_raw_bytes before allocating it") {
  InMemoryKVStore inner;
  const KVKey big{9, 9};
  const KVBlock b = kv_block(64, kvfuse::DType::f32, 8);
  CompressedKVStore<InMemoryKVStore>(inner, CodecOptions{Codec::zstd}).put(big, b);
  CodecOptions small{Codec::zstd};
  small.max_raw_bytes = b.bytes.size() - 1;
  CompressedKVStore reader(inner, small);
  CHECK_FALSE(reader.get(big).has_value());
  CHECK(reader.rejected() == 1);
  CHECK(has(reader.last_rejection(), fmt::format("raw size {} exceeds max_raw_bytes {}", b.bytes.size(),
                                                 b.bytes.size() - 1)));
  small.max_raw_bytes = b.bytes.size();
  CHECK(CompressedKVStore(inner, small).get(big)->bytes == b.bytes);  // exactly the limit is read
}

TEST_CASE("CodecOptions names the bad value") {
  InMemoryKVStore inner;
  CHECK(has(kvfuse_test::error_of([&] { CompressedKVStore s(inner, CodecOptions{Codec::zstd, 100}); }),
            "zstd_level = 100"));
  CHECK(has(kvfuse_test::error_of([&] { CompressedKVStore s(inner, CodecOptions{Codec::lz4, 3, 0}); }),
            "lz4_acceleration = 0"));
  CHECK(has(kvfuse_test::error_of([&] { CompressedKVStore s(inner, CodecOptions{static_cast<Codec>(9)}); }),
            "codec = 9"));
  CHECK(has(kvfuse_test::error_of([&] { CompressedKVStore s(inner, CodecOptions{Codec::lz4, 3, 1, 3}); }),
            "shuffle = 3"));
  CHECK(has(kvfuse_test::error_of([&] { CompressedKVStore s(inner, CodecOptions{Codec::lz4, 3, 1, 0, 0}); }),
            "max_raw_bytes = 0"));
}

TEST_CASE("CompressedKVStore: one reader thread next to one writer thread (the KVStore contract)") {
  InMemoryKVStore inner;
  CompressedKVStore store(inner, CodecOptions{Codec::zstd, 1});
  std::vector<KVBlock> blocks;
  for (std::uint32_t i = 0; i < 4; ++i) blocks.push_back(kv_block(16, kvfuse::DType::f16, 10 + i));
  constexpr int rounds = 50;
  std::thread writer([&] {
    for (int r = 0; r < rounds; ++r)
      for (std::size_t i = 0; i < blocks.size(); ++i) {
        store.put(KVKey{9, i}, blocks[(i + static_cast<std::size_t>(r)) % blocks.size()]);
      }
  });
  int hits = 0;
  int wrong = 0;
  for (int r = 0; r < rounds; ++r)
    for (std::size_t i = 0; i < blocks.size(); ++i)
      if (const auto got = store.get(KVKey{9, i})) {
        ++hits;
        bool known = false;
        for (const KVBlock& b : blocks) known = known || got->bytes == b.bytes;
        wrong += known ? 0 : 1;
      }
  writer.join();
  CHECK(wrong == 0);
  CHECK(store.rejected() == 0);
  CHECK(store.stats().puts == rounds * 4);
  CHECK(store.stats().gets == hits);
}

}  // namespace store_codec_compressed_store
