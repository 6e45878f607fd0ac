// GGUFFile (model/gguf.hpp): a small GGUF written byte by byte here is parsed back; every way of breaking it
// (each truncation, each flipped byte, and the named corruptions) raises kvfuse::error with a message naming
// the problem; the real SmolLM2 file (when present) parses and dequantizes to the values the Python gguf
// package produced (tests/data/smollm2_dequant_samples.txt, made by tests/data/make_dequant_samples.py).
#include "kvfuse/model/gguf.hpp"

#include <doctest/doctest.h>

#include "../support/model_path.hpp"
#include <unistd.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <span>
#include <sstream>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

// Each unit test file lives in its own namespace: the files are compiled together (a unity build).
namespace unit_gguf {

using kvfuse::GGMLType;
using kvfuse::GGUFArray;
using kvfuse::GGUFFile;
using kvfuse::GGUFTensorInfo;
using kvfuse::GGUFValueType;

namespace {

// ---------------------------------------------------------------- a GGUF writer for tests
class Writer {
 public:
  std::vector<std::byte> bytes;
  std::map<std::string, std::size_t> at;  // label -> byte offset, for targeted corruption

  void mark(const std::string& label) { at[label] = bytes.size(); }
  template <class T>
  void scalar(T v) {
    using U = std::conditional_t<sizeof(T) == 1, std::uint8_t,
                                 std::conditional_t<sizeof(T) == 2, std::uint16_t,
                                                    std::conditional_t<sizeof(T) == 4, std::uint32_t, std::uint64_t>>>;
    const U bits = std::bit_cast<U>(v);
    for (std::size_t i = 0; i < sizeof(T); ++i) bytes.push_back(static_cast<std::byte>((bits >> (8 * i)) & 0xff));
  }
  void str(std::string_view s) {
    scalar<std::uint64_t>(s.size());
    for (const char c : s) bytes.push_back(static_cast<std::byte>(c));
  }
  void key(const std::string& k, GGUFValueType type) {
    mark("key:" + k);
    str(k);
    mark("type:" + k);
    scalar(static_cast<std::uint32_t>(type));
    mark("value:" + k);
  }
  void pad(std::size_t alignment) {
    while (bytes.size() % alignment != 0) bytes.push_back(std::byte{0});
  }
  void put_u32(const std::string& label, std::uint32_t v) { put(label, v); }
  void put_u64(const std::string& label, std::uint64_t v) { put(label, v); }

 private:
  template <class T>
  void put(const std::string& label, T v) {
    const std::size_t pos = at.at(label);
    for (std::size_t i = 0; i < sizeof(T); ++i) bytes[pos + i] = static_cast<std::byte>((v >> (8 * i)) & 0xff);
  }
};

struct Tensor {
  std::string name;
  std::vector<std::uint64_t> dims;
  GGMLType type;
  std::vector<std::uint8_t> data;
};

struct Options {
  std::uint32_t version = 3;
  std::optional<std::uint32_t> alignment;  // written as general.alignment when set
  int nesting = 2;                         // depth of the nested-array entry
  bool with_iq2_xxs = false;               // add a tensor of a type kvfuse cannot dequantize
};

std::uint16_t f16_bits(float v) {  // the few values the tests use, exact in fp16
  if (v == 1.0f) return 0x3c00;
  if (v == -2.0f) return 0xc000;
  if (v == 0.5f) return 0x3800;
  if (v == 65504.0f) return 0x7bff;
  if (v == 2.0f) return 0x4000;
  if (v == -1.0f) return 0xbc00;
  FAIL("no fp16 pattern for ", v);
  return 0;
}

void push_f32(std::vector<std::uint8_t>& d, float v) {
  const auto bits = std::bit_cast<std::uint32_t>(v);
  for (int i = 0; i < 4; ++i) d.push_back(static_cast<std::uint8_t>(bits >> (8 * i)));
}
void push_f16(std::vector<std::uint8_t>& d, float v) {
  const std::uint16_t bits = f16_bits(v);
  d.push_back(static_cast<std::uint8_t>(bits & 0xff));
  d.push_back(static_cast<std::uint8_t>(bits >> 8));
}

std::vector<Tensor> small_tensors(const Options& options) {
  std::vector<Tensor> tensors;
  Tensor a{"a.weight", {3, 2}, GGMLType::f32, {}};  // [ne1 = 2][ne0 = 3] = 0 1 2 / 3 4 5
  for (int i = 0; i < 6; ++i) push_f32(a.data, static_cast<float>(i));
  tensors.push_back(a);
  Tensor b{"b", {4}, GGMLType::f16, {}};
  for (const float v : {1.0f, -2.0f, 0.5f, 65504.0f}) push_f16(b.data, v);
  tensors.push_back(b);
  Tensor c{"c", {32, 2}, GGMLType::q8_0, {}};  // row 0: d 0.5, q = j - 16; row 1: d 2, q = j
  push_f16(c.data, 0.5f);
  for (int j = 0; j < 32; ++j) c.data.push_back(static_cast<std::uint8_t>(static_cast<std::int8_t>(j - 16)));
  push_f16(c.data, 2.0f);
  for (int j = 0; j < 32; ++j) c.data.push_back(static_cast<std::uint8_t>(j));
  tensors.push_back(c);
  if (options.with_iq2_xxs) tensors.push_back({"iq", {256}, GGMLType::iq2_xxs, std::vector<std::uint8_t>(66, 0)});
  Tensor d{"d", {32}, GGMLType::q4_1, {}};  // d 0.5, m -1, low nibbles j, high nibbles 15 - j
  push_f16(d.data, 0.5f);
  push_f16(d.data, -1.0f);
  for (int j = 0; j < 16; ++j) d.data.push_back(static_cast<std::uint8_t>(j | ((15 - j) << 4)));
  tensors.push_back(d);
  return tensors;
}

// The whole test file: header, metadata of every value type, tensor infos, padding, data. The file ends
// exactly where the last tensor's data ends, so every proper prefix is truncated somewhere that matters.
Writer small_file(const Options& options = {}) {
  const std::vector<Tensor> tensors = small_tensors(options);
  const std::uint32_t given = options.alignment.value_or(32);
  const std::uint32_t alignment = given != 0 ? given : 32;  // the layout's; a bad given value is still written
  Writer w;
  w.bytes = {std::byte{'G'}, std::byte{'G'}, std::byte{'U'}, std::byte{'F'}};
  w.mark("version");
  w.scalar(options.version);
  w.mark("n_tensors");
  w.scalar<std::uint64_t>(tensors.size());
  w.mark("n_kv");
  w.scalar<std::uint64_t>(0);  // patched below
  std::uint64_t n_kv = 0;
  const auto key = [&](const std::string& k, GGUFValueType type) {
    w.key(k, type);
    ++n_kv;
  };
  key("general.architecture", GGUFValueType::string);
  w.str("llama");
  if (options.alignment) {
    key("general.alignment", GGUFValueType::uint32);
    w.scalar(*options.alignment);
  }
  key("test.u8", GGUFValueType::uint8);
  w.scalar<std::uint8_t>(200);
  key("test.i8", GGUFValueType::int8);
  w.scalar<std::int8_t>(-100);
  key("test.u16", GGUFValueType::uint16);
  w.scalar<std::uint16_t>(60000);
  key("test.i16", GGUFValueType::int16);
  w.scalar<std::int16_t>(-30000);
  key("llama.block_count", GGUFValueType::uint32);
  w.scalar<std::uint32_t>(30);
  key("test.i32", GGUFValueType::int32);
  w.scalar<std::int32_t>(-7);
  key("test.f32", GGUFValueType::float32);
  w.scalar(0.5f);
  key("test.bool", GGUFValueType::boolean);
  w.scalar<std::uint8_t>(1);
  key("test.u64", GGUFValueType::uint64);
  w.scalar<std::uint64_t>(std::uint64_t{1} << 40);
  key("test.i64", GGUFValueType::int64);
  w.scalar<std::int64_t>(-(std::int64_t{1} << 40));
  key("test.f64", GGUFValueType::float64);
  w.scalar(0.1);
  key("tokenizer.ggml.tokens", GGUFValueType::array);
  w.scalar(static_cast<std::uint32_t>(GGUFValueType::string));
  w.mark("count:tokenizer.ggml.tokens");
  w.scalar<std::uint64_t>(3);
  for (const char* s : {"a", "bc", ""}) w.str(s);
  key("tokenizer.ggml.token_type", GGUFValueType::array);
  w.scalar(static_cast<std::uint32_t>(GGUFValueType::int32));
  w.scalar<std::uint64_t>(3);
  for (const std::int32_t v : {1, -2, 3}) w.scalar(v);
  key("tokenizer.ggml.scores", GGUFValueType::array);
  w.scalar(static_cast<std::uint32_t>(GGUFValueType::float32));
  w.scalar<std::uint64_t>(2);
  for (const float v : {0.5f, -1.5f}) w.scalar(v);
  key("test.bools", GGUFValueType::array);
  w.scalar(static_cast<std::uint32_t>(GGUFValueType::boolean));
  w.scalar<std::uint64_t>(2);
  w.scalar<std::uint8_t>(1);
  w.scalar<std::uint8_t>(0);
  // test.nested: `nesting` levels of single-element arrays around one uint16 array {7, 8}, e.g. depth 2:
  // [[7, 8]]; the depth-1 array also holds a second, empty uint16 array: [[7, 8], []].
  key("test.nested", GGUFValueType::array);
  for (int level = 1; level < options.nesting; ++level) {
    w.scalar(static_cast<std::uint32_t>(GGUFValueType::array));
    w.scalar<std::uint64_t>(level == 1 ? 2 : 1);
  }
  w.scalar(static_cast<std::uint32_t>(GGUFValueType::uint16));
  w.scalar<std::uint64_t>(2);
  w.scalar<std::uint16_t>(7);
  w.scalar<std::uint16_t>(8);
  if (options.nesting > 1) {
    w.scalar(static_cast<std::uint32_t>(GGUFValueType::uint16));
    w.scalar<std::uint64_t>(0);
  }
  w.put_u64("n_kv", n_kv);

  std::uint64_t offset = 0;
  std::vector<std::uint64_t> offsets;
  for (const Tensor& t : tensors) {
    offsets.push_back(offset);
    offset += t.data.size();
    offset = (offset + alignment - 1) / alignment * alignment;
  }
  for (std::size_t i = 0; i < tensors.size(); ++i) {
    const Tensor& t = tensors[i];
    w.mark("name:" + t.name);
    w.str(t.name);
    w.mark("n_dims:" + t.name);
    w.scalar(static_cast<std::uint32_t>(t.dims.size()));
    for (std::size_t d = 0; d < t.dims.size(); ++d) {
      w.mark("dim" + std::to_string(d) + ":" + t.name);
      w.scalar(t.dims[d]);
    }
    w.mark("ggml_type:" + t.name);
    w.scalar(static_cast<std::uint32_t>(t.type));
    w.mark("offset:" + t.name);
    w.scalar(offsets[i]);
  }
  w.pad(alignment);
  w.mark("data");
  for (std::size_t i = 0; i < tensors.size(); ++i) {
    while (w.bytes.size() < w.at["data"] + offsets[i]) w.bytes.push_back(std::byte{0});
    for (const std::uint8_t b : tensors[i].data) w.bytes.push_back(static_cast<std::byte>(b));
  }
  return w;
}

// The message of the kvfuse::error that parsing (and dequantizing every tensor of) `bytes` raises; "" if none.
std::string error_of(const std::vector<std::byte>& bytes) {
  try {
    const GGUFFile file = GGUFFile::parse(bytes);
    for (const GGUFTensorInfo& info : file.tensors()) (void)file.dequantize(info);
  } catch (const kvfuse::error& e) {
    return e.what();
  }
  return "";
}

bool has(const std::string& text, std::string_view part) { return text.find(part) != std::string::npos; }

std::vector<float> iota_floats(int n, float scale, float shift) {
  std::vector<float> v;
  for (int i = 0; i < n; ++i) v.push_back(static_cast<float>(i) * scale + shift);
  return v;
}

}  // namespace

static_assert(!std::is_copy_constructible_v<GGUFFile> && !std::is_copy_assignable_v<GGUFFile>);
static_assert(std::is_nothrow_move_constructible_v<GGUFFile> && std::is_nothrow_move_assignable_v<GGUFFile>);

TEST_CASE("GGUF: a hand-written v3 file parses back: header, metadata of every type, tensor infos") {
  const Writer w = small_file();
  const GGUFFile f = GGUFFile::parse(w.bytes);
  CHECK(f.version() == 3);
  CHECK(f.alignment() == 32);
  CHECK(f.data_offset() == w.at.at("data"));
  CHECK(f.data_offset() % 32 == 0);
  CHECK(f.file_size() == w.bytes.size());

  REQUIRE(f.metadata().size() == 17);
  CHECK(f.metadata()[0].key == "general.architecture");  // file order kept
  CHECK(f.get_string("general.architecture") == "llama");
  CHECK(f.get_u32("llama.block_count") == 30);
  CHECK(f.get_u32("test.u8") == 200);
  CHECK(f.get_i32("test.i8") == -100);
  CHECK(f.get_u32("test.u16") == 60000);
  CHECK(f.get_i32("test.i16") == -30000);
  CHECK(f.get_i32("test.i32") == -7);
  CHECK(f.get_u64("test.u64") == std::uint64_t{1} << 40);
  CHECK(f.get_i64("test.i64") == -(std::int64_t{1} << 40));
  CHECK(f.get_f32("test.f32") == 0.5f);
  CHECK(f.get_f32("test.f64") == 0.1f);  // float64 rounded to float
  CHECK(std::get<double>(f.value("test.f64")) == 0.1);
  CHECK(f.get_bool("test.bool"));
  CHECK(kvfuse::gguf_type(f.value("test.u16")) == GGUFValueType::uint16);
  CHECK(kvfuse::gguf_type(f.value("test.bool")) == GGUFValueType::boolean);

  CHECK(f.get_string_array("tokenizer.ggml.tokens") == std::vector<std::string>{"a", "bc", ""});
  const auto token_type = f.get_i32_array("tokenizer.ggml.token_type");
  CHECK(std::vector<std::int32_t>(token_type.begin(), token_type.end()) == std::vector<std::int32_t>{1, -2, 3});
  const auto scores = f.get_f32_array("tokenizer.ggml.scores");
  CHECK(std::vector<float>(scores.begin(), scores.end()) == std::vector<float>{0.5f, -1.5f});
  CHECK(std::get<std::vector<bool>>(f.get_array("test.bools").values) == std::vector<bool>{true, false});

  const GGUFArray& nested = f.get_array("test.nested");
  CHECK(nested.element_type() == GGUFValueType::array);
  REQUIRE(nested.size() == 2);
  const auto& inner = std::get<std::vector<GGUFArray>>(nested.values);
  CHECK(std::get<std::vector<std::uint16_t>>(inner[0].values) == std::vector<std::uint16_t>{7, 8});
  CHECK(inner[1].element_type() == GGUFValueType::uint16);
  CHECK(inner[1].size() == 0);
  CHECK(kvfuse::gguf_type_name(f.value("test.nested")) == "array of array of uint16");
  CHECK(kvfuse::gguf_type_name(f.value("tokenizer.ggml.tokens")) == "array of string");

  REQUIRE(f.tensors().size() == 4);
  const GGUFTensorInfo& a = f.tensor("a.weight");
  CHECK(a.dims == std::vector<std::int64_t>{3, 2});
  CHECK(a.type == GGMLType::f32);
  CHECK(a.offset == 0);
  CHECK(a.file_offset == f.data_offset());
  CHECK(a.size == 24);
  CHECK(a.n_elements() == 6);
  CHECK(a.row_length() == 3);
  CHECK(a.n_rows() == 2);
  const GGUFTensorInfo& b = f.tensor("b");
  CHECK(b.offset == 32);
  CHECK(b.size == 8);
  const GGUFTensorInfo& c = f.tensor("c");
  CHECK(c.type == GGMLType::q8_0);
  CHECK(c.offset == 64);
  CHECK(c.size == 68);
  const GGUFTensorInfo& d = f.tensor("d");
  CHECK(d.type == GGMLType::q4_1);
  CHECK(d.offset == 160);
  CHECK(d.size == 20);
  CHECK(d.file_offset + d.size == f.file_size());
  CHECK(f.tensors()[3].name == "d");  // file order kept
  CHECK(f.find_tensor("nope") == nullptr);
  CHECK(f.contains("test.u8"));
  CHECK_FALSE(f.contains("test.missing"));
  CHECK(f.find("test.missing") == nullptr);
}

TEST_CASE("GGUF: tensors dequantize in ggml order (ne0 fastest); raw() is the bytes in place") {
  const Writer w = small_file();
  const GGUFFile f = GGUFFile::parse(w.bytes);
  CHECK(f.dequantize(f.tensor("a.weight")) == std::vector<float>{0, 1, 2, 3, 4, 5});
  CHECK(f.dequantize(f.tensor("b")) == std::vector<float>{1.0f, -2.0f, 0.5f, 65504.0f});
  std::vector<float> c_expected = iota_floats(32, 0.5f, -8.0f);  // (j - 16) * 0.5
  const std::vector<float> c_row1 = iota_floats(32, 2.0f, 0.0f);
  c_expected.insert(c_expected.end(), c_row1.begin(), c_row1.end());
  CHECK(f.dequantize(f.tensor("c")) == c_expected);
  CHECK(f.dequantize_rows(f.tensor("c"), 1, 1) == c_row1);
  CHECK(f.dequantize_rows(f.tensor("c"), 2, 0).empty());
  CHECK(f.dequantize(f.tensor("d")) == std::vector<float>{-1.0f, -0.5f, 0.0f, 0.5f, 1.0f, 1.5f, 2.0f,  2.5f,
                                                          3.0f,  3.5f,  4.0f, 4.5f, 5.0f, 5.5f, 6.0f,  6.5f,
                                                          6.5f,  6.0f,  5.5f, 5.0f, 4.5f, 4.0f, 3.5f,  3.0f,
                                                          2.5f,  2.0f,  1.5f, 1.0f, 0.5f, 0.0f, -0.5f, -1.0f});
  std::vector<float> out(6);
  f.dequantize_into(f.tensor("a.weight"), out);
  CHECK(out == std::vector<float>{0, 1, 2, 3, 4, 5});

  const auto raw = f.raw(f.tensor("b"));
  REQUIRE(raw.size() == 8);
  CHECK(raw.data() == w.bytes.data() + f.data_offset() + 32);
  CHECK(raw[0] == std::byte{0x00});
  CHECK(raw[1] == std::byte{0x3c});

  std::vector<float> wrong(5);
  CHECK_THROWS_WITH_AS(f.dequantize_into(f.tensor("a.weight"), wrong),
                       doctest::Contains("needs an output of 6 floats, got 5"), kvfuse::error);
  CHECK_THROWS_WITH_AS((void)f.dequantize_rows(f.tensor("c"), 1, 2),
                       doctest::Contains("rows [1, 1+2) are outside tensor 'c' with 2 rows"), kvfuse::error);
  CHECK_THROWS_WITH_AS((void)f.dequantize_rows(f.tensor("c"), -1, 1), doctest::Contains("outside tensor 'c'"),
                       kvfuse::error);
}

TEST_CASE("GGUF: infos are re-validated on use, so an edited info cannot read outside the file") {
  const Writer w = small_file();
  const GGUFFile f = GGUFFile::parse(w.bytes);
  GGUFTensorInfo moved = f.tensor("d");
  moved.file_offset = f.file_size() - 10;
  CHECK_THROWS_WITH_AS((void)f.raw(moved), doctest::Contains("exceeds the file size"), kvfuse::error);
  CHECK_THROWS_AS((void)f.dequantize(moved), kvfuse::error);
  GGUFTensorInfo grown = f.tensor("a.weight");
  grown.dims = {3, 1000};
  CHECK_THROWS_WITH_AS((void)f.dequantize(grown),
                       doctest::Contains("has size 24, but its dims and type F32 make 12000"), kvfuse::error);
  GGUFTensorInfo retyped = f.tensor("a.weight");
  retyped.type = static_cast<GGMLType>(77);
  CHECK_THROWS_WITH_AS((void)f.raw(retyped), doctest::Contains("unknown ggml type 77"), kvfuse::error);
}

TEST_CASE("GGUF: typed getters name the key and its actual type") {
  const Writer w = small_file();
  const GGUFFile f = GGUFFile::parse(w.bytes);
  CHECK_THROWS_WITH_AS((void)f.get_u32("llama.missing"), "GGUF: metadata key 'llama.missing' not found", kvfuse::error);
  CHECK_THROWS_WITH_AS((void)f.get_u32("general.architecture"),
                       "GGUF: metadata key 'general.architecture' has type string, expected an integer (uint32)",
                       kvfuse::error);
  CHECK_THROWS_WITH_AS((void)f.get_u32("test.i32"), "GGUF: metadata key 'test.i32' = -7 (int32) does not fit in uint32",
                       kvfuse::error);
  CHECK_THROWS_WITH_AS((void)f.get_i32("test.u64"),
                       "GGUF: metadata key 'test.u64' = 1099511627776 (uint64) does not fit in int32", kvfuse::error);
  CHECK_THROWS_WITH_AS((void)f.get_u32("test.bool"),
                       "GGUF: metadata key 'test.bool' has type bool, expected an integer (uint32)", kvfuse::error);
  CHECK_THROWS_WITH_AS((void)f.get_f32("llama.block_count"),
                       "GGUF: metadata key 'llama.block_count' has type uint32, expected float32", kvfuse::error);
  CHECK_THROWS_WITH_AS((void)f.get_string("test.f32"),
                       "GGUF: metadata key 'test.f32' has type float32, expected string", kvfuse::error);
  CHECK_THROWS_WITH_AS((void)f.get_bool("test.u8"), "GGUF: metadata key 'test.u8' has type uint8, expected bool",
                       kvfuse::error);
  CHECK_THROWS_WITH_AS((void)f.get_i32_array("tokenizer.ggml.scores"),
                       "GGUF: metadata key 'tokenizer.ggml.scores' has type array of float32, expected array of int32",
                       kvfuse::error);
  CHECK_THROWS_WITH_AS((void)f.get_string_array("llama.block_count"),
                       "GGUF: metadata key 'llama.block_count' has type uint32, expected array of string",
                       kvfuse::error);
  CHECK_THROWS_WITH_AS((void)f.tensor("blk.0.attn_q.weight"),
                       "GGUF: tensor 'blk.0.attn_q.weight' not found (4 tensors in the file)", kvfuse::error);
  CHECK(f.get_u32("llama.missing", 7u) == 7);
  CHECK(f.get_u32("llama.block_count", 7u) == 30);
  CHECK(f.get_f32("llama.rope.missing", 1e4f) == 1e4f);
  CHECK(f.get_bool("tokenizer.ggml.add_bos_token", true));
  CHECK_THROWS_AS((void)f.get_f32("llama.block_count", 1.0f), kvfuse::error);  // present, wrong type
}

TEST_CASE("GGUF: version 2 files and general.alignment") {
  Options v2;
  v2.version = 2;
  CHECK(GGUFFile::parse(small_file(v2).bytes).version() == 2);

  Options aligned;
  aligned.alignment = 64;
  const Writer w = small_file(aligned);
  const GGUFFile f = GGUFFile::parse(w.bytes);
  CHECK(f.alignment() == 64);
  CHECK(f.data_offset() % 64 == 0);
  CHECK(f.tensor("b").offset == 64);
  CHECK(f.tensor("c").offset == 128);
  CHECK(f.tensor("d").offset == 256);
  CHECK(f.dequantize(f.tensor("b")) == std::vector<float>{1.0f, -2.0f, 0.5f, 65504.0f});

  Options odd;
  odd.alignment = 48;
  CHECK(has(error_of(small_file(odd).bytes), "general.alignment = 48 is not a power of two"));
  Options zero;
  zero.alignment = 0;
  CHECK(has(error_of(small_file(zero).bytes), "general.alignment = 0 is not a power of two"));
  Writer wrong_type = small_file(aligned);
  wrong_type.put_u32("type:general.alignment", static_cast<std::uint32_t>(GGUFValueType::int32));
  CHECK(error_of(wrong_type.bytes) == "GGUF: metadata key 'general.alignment' has type int32, expected uint32");
}

TEST_CASE("GGUF: every truncation of the file is rejected with kvfuse::error, never a crash") {
  const Writer w = small_file();
  REQUIRE(error_of(w.bytes).empty());
  int rejected = 0;
  for (std::size_t n = 0; n < w.bytes.size(); ++n) {
    const std::vector<std::byte> prefix(w.bytes.begin(), w.bytes.begin() + static_cast<std::ptrdiff_t>(n));
    try {
      (void)GGUFFile::parse(prefix);
    } catch (const kvfuse::error&) {
      ++rejected;
    }
  }
  CHECK(rejected == static_cast<int>(w.bytes.size()));
  const std::vector<std::byte> header_only(w.bytes.begin(), w.bytes.begin() + 10);
  CHECK(error_of(header_only) ==
        "GGUF: truncated file: the tensor count needs 8 bytes at byte offset 8, but only 2 of the file's 10 bytes "
        "remain");
  const std::vector<std::byte> no_data(w.bytes.begin(), w.bytes.end() - 1);
  CHECK(has(error_of(no_data), "GGUF: tensor 'd' data ["));
  CHECK(has(error_of(no_data), "exceeds the file size"));
}

TEST_CASE("GGUF: every single corrupted byte is rejected or parsed, never a crash or an out-of-bounds read") {
  const Writer w = small_file();
  int errors = 0;
  for (std::size_t i = 0; i < w.bytes.size(); ++i) {
    for (const std::byte flip : {std::byte{0xff}, std::byte{0x80}, std::byte{0x01}}) {
      std::vector<std::byte> bad = w.bytes;
      bad[i] ^= flip;
      if (!error_of(bad).empty()) ++errors;
    }
  }
  CHECK(errors > 0);  // the loop's value is that it ran to the end (under ASan in the sanitize build)
}

TEST_CASE("GGUF: malformed headers and metadata name what is wrong and where") {
  SUBCASE("bad magic") {
    Writer w = small_file();
    w.bytes[3] = std::byte{'G'};
    CHECK(error_of(w.bytes) == "GGUF: bad magic 47 47 55 47 at byte offset 0, expected 47 47 55 46 (\"GGUF\")");
  }
  SUBCASE("versions other than 2 and 3") {
    Writer w = small_file();
    w.put_u32("version", 1);
    CHECK(error_of(w.bytes) == "GGUF: unsupported version 1 (kvfuse reads versions 2 and 3)");
    w.put_u32("version", 4);
    CHECK(error_of(w.bytes) == "GGUF: unsupported version 4 (kvfuse reads versions 2 and 3)");
    w.put_u32("version", 0x03000000);
    CHECK(error_of(w.bytes) == "GGUF: big-endian files are not supported (version field reads 0x03000000)");
  }
  SUBCASE("huge counts are bounded by the remaining bytes before anything is allocated") {
    Writer w = small_file();
    w.put_u64("n_kv", std::uint64_t{1} << 60);
    CHECK(has(error_of(w.bytes), "GGUF: header claims 1152921504606846976 metadata entries and 4 tensors, but the"));
    w = small_file();
    w.put_u64("n_tensors", ~std::uint64_t{0});
    CHECK(has(error_of(w.bytes), "and 18446744073709551615 tensors, but the"));
    w = small_file();
    w.put_u64("count:tokenizer.ggml.tokens", std::uint64_t{1} << 50);
    CHECK(has(error_of(w.bytes),
              "GGUF: metadata key 'tokenizer.ggml.tokens' claims an array of 1125899906842624 string elements"));
  }
  SUBCASE("string length beyond the end of the file") {
    Writer w = small_file();
    w.put_u64("value:general.architecture", std::uint64_t{1} << 40);
    CHECK(has(error_of(w.bytes),
              "GGUF: value of metadata key 'general.architecture': string length 1099511627776 at "
              "byte offset"));
    w = small_file();
    w.put_u64("key:test.u8", 100000);
    CHECK(has(error_of(w.bytes), "GGUF: key of metadata entry 1: string length 100000"));
  }
  SUBCASE("unknown value type") {
    Writer w = small_file();
    w.put_u32("type:test.u8", 13);
    CHECK(has(error_of(w.bytes), "GGUF: metadata key 'test.u8' has unknown value type 13 (at byte offset"));
  }
  SUBCASE("duplicate key") {
    Writer w = small_file();
    w.bytes[w.at.at("key:test.i8") + 8 + 5] = std::byte{'u'};  // "test.i8" -> "test.u8"
    CHECK(error_of(w.bytes) == "GGUF: duplicate metadata key 'test.u8' (entry 2)");
  }
  SUBCASE("bool other than 0 or 1") {
    Writer w = small_file();
    w.bytes[w.at.at("value:test.bool")] = std::byte{2};
    CHECK(has(error_of(w.bytes), "GGUF: metadata key 'test.bool' has bool value 2 at byte offset"));
  }
  SUBCASE("nested arrays: 8 levels parse, 9 are refused") {
    Options deep;
    deep.nesting = 8;
    const Writer ok = small_file(deep);
    const GGUFFile f = GGUFFile::parse(ok.bytes);
    CHECK(kvfuse::gguf_type_name(f.value("test.nested")) ==
          "array of array of array of array of array of array of array of array of uint16");
    deep.nesting = 9;
    CHECK(has(error_of(small_file(deep).bytes), "GGUF: metadata key 'test.nested' nests arrays deeper than 8 levels"));
  }
}

TEST_CASE("GGUF: malformed tensor infos name the tensor") {
  SUBCASE("n_dims > 4") {
    Writer w = small_file();
    w.put_u32("n_dims:a.weight", 5);
    CHECK(has(error_of(w.bytes), "GGUF: tensor 'a.weight' has n_dims 5 > 4 (at byte offset"));
  }
  SUBCASE("element count overflows int64") {
    Writer w = small_file();
    w.put_u64("dim0:a.weight", std::uint64_t{1} << 62);
    w.put_u64("dim1:a.weight", 4);
    CHECK(error_of(w.bytes) ==
          "GGUF: tensor 'a.weight' element count overflows int64 at dim ne1 = 4 (4611686018427387904 elements before "
          "it)");
    w.put_u64("dim0:a.weight", std::uint64_t{1} << 63);
    CHECK(has(error_of(w.bytes), "GGUF: tensor 'a.weight' dim ne0 = 9223372036854775808 exceeds int64"));
  }
  SUBCASE("a zero dim makes an empty tensor, but the other dims must still not overflow") {
    Writer w = small_file();
    w.put_u64("dim0:a.weight", 0);
    w.put_u64("dim1:a.weight", 5);
    const GGUFFile f = GGUFFile::parse(w.bytes);
    CHECK(f.tensor("a.weight").size == 0);
    CHECK(f.tensor("a.weight").n_rows() == 5);
    CHECK(f.dequantize(f.tensor("a.weight")).empty());
    CHECK(f.dequantize_rows(f.tensor("a.weight"), 2, 3).empty());
    const std::int64_t big = std::int64_t{1} << 62;
    const std::vector<std::int64_t> fits = {0, big, 1};
    CHECK(kvfuse::detail::gguf_tensor_nbytes("x", fits, GGMLType::f32) == 0);
    const std::vector<std::int64_t> overflows = {0, big, 4};
    CHECK_THROWS_WITH_AS((void)kvfuse::detail::gguf_tensor_nbytes("x", overflows, GGMLType::f32),
                         "GGUF: tensor 'x' element count overflows int64 at dim ne2 = 4 (4611686018427387904 elements "
                         "before it)",
                         kvfuse::error);
  }
  SUBCASE("row length not a multiple of the block size") {
    Writer w = small_file();
    w.put_u64("dim0:c", 16);
    w.put_u64("dim1:c", 4);
    CHECK(error_of(w.bytes) == "GGUF: tensor 'c' row length ne0 = 16 is not a multiple of the Q8_0 block size 32");
  }
  SUBCASE("unknown tensor type") {
    Writer w = small_file();
    w.put_u32("ggml_type:a.weight", 4);
    CHECK(error_of(w.bytes) == "GGUF: tensor 'a.weight' has unknown ggml type 4");
  }
  SUBCASE("duplicate tensor name") {
    Writer w = small_file();
    w.bytes[w.at.at("name:c") + 8] = std::byte{'b'};
    CHECK(error_of(w.bytes) == "GGUF: duplicate tensor name 'b' (tensor 2)");
  }
  SUBCASE("misaligned data offset") {
    Writer w = small_file();
    w.put_u64("offset:b", 33);
    CHECK(has(error_of(w.bytes), "GGUF: tensor 'b' data offset 33 (at byte offset"));
    CHECK(has(error_of(w.bytes), "is not a multiple of the alignment 32"));
  }
  SUBCASE("tensor data beyond the end of the file") {
    Writer w = small_file();
    w.put_u64("offset:d", 4096);
    const std::string start = std::to_string(w.at.at("data") + 4096);
    const std::string end = std::to_string(w.at.at("data") + 4096 + 20);
    CHECK(error_of(w.bytes) ==
          "GGUF: tensor 'd' data [" + start + ", " + end + ") exceeds the file size " + std::to_string(w.bytes.size()));
    w.put_u64("offset:d", std::uint64_t{1} << 63);
    CHECK(has(error_of(w.bytes), "GGUF: tensor 'd' data at offset 9223372036854775808 (+ data section start"));
  }
  SUBCASE("a tensor type kvfuse cannot dequantize parses, and dequantizing it names type and tensor") {
    Options with_iq;
    with_iq.with_iq2_xxs = true;
    const Writer w = small_file(with_iq);
    const GGUFFile f = GGUFFile::parse(w.bytes);
    CHECK(f.tensor("iq").size == 66);
    CHECK(f.raw(f.tensor("iq")).size() == 66);
    CHECK_THROWS_WITH_AS((void)f.dequantize(f.tensor("iq")),
                         doctest::Contains("GGUF: unsupported tensor type IQ2_XXS of 'iq'"), kvfuse::error);
  }
}

TEST_CASE("GGUF: open() maps a file read-only; the mapping moves with the object; bad paths are named") {
  const Writer w = small_file();
  const std::filesystem::path dir = std::filesystem::temp_directory_path();
  const std::filesystem::path path = dir / ("kvfuse_gguf_test_" + std::to_string(::getpid()) + ".gguf");
  {
    std::ofstream out(path, std::ios::binary);
    out.write(reinterpret_cast<const char*>(w.bytes.data()), static_cast<std::streamsize>(w.bytes.size()));
  }
  {
    GGUFFile opened = GGUFFile::open(path);
    const GGUFFile moved = std::move(opened);
    CHECK(moved.get_u32("llama.block_count") == 30);
    CHECK(opened.file_size() == 0);  // NOLINT(bugprone-use-after-move): moved-from is documented as empty
    CHECK(opened.tensors().empty());
    CHECK(opened.metadata().empty());
    CHECK_FALSE(opened.contains("llama.block_count"));
    CHECK(moved.dequantize(moved.tensor("c")).size() == 64);
    GGUFFile assigned = GGUFFile::parse(w.bytes);
    assigned = GGUFFile::open(path);
    CHECK(assigned.dequantize(assigned.tensor("a.weight")) == std::vector<float>{0, 1, 2, 3, 4, 5});
    // Released pages read back unchanged, a tensor's or the whole file's; a range outside the mapping is ignored.
    const std::vector<float> c = assigned.dequantize(assigned.tensor("c"));
    assigned.release_pages(assigned.raw(assigned.tensor("c")));
    CHECK(assigned.dequantize(assigned.tensor("c")) == c);
    assigned.release_pages();
    CHECK(assigned.dequantize(assigned.tensor("a.weight")) == std::vector<float>{0, 1, 2, 3, 4, 5});
    CHECK(assigned.get_u32("llama.block_count") == 30);
    assigned.release_pages(std::as_bytes(std::span(w.bytes)));
    CHECK(assigned.dequantize(assigned.tensor("c")) == c);
  }
  {
    std::ofstream truncate(path, std::ios::binary | std::ios::trunc);
    truncate.write(reinterpret_cast<const char*>(w.bytes.data()), 100);
  }
  const std::string named = "(file '" + path.string() + "')";
  CHECK_THROWS_WITH_AS((void)GGUFFile::open(path), doctest::Contains(named.c_str()), kvfuse::error);
  { std::ofstream empty(path, std::ios::binary | std::ios::trunc); }
  CHECK_THROWS_WITH_AS((void)GGUFFile::open(path), doctest::Contains("GGUF: truncated file: the magic needs 4 bytes"),
                       kvfuse::error);
  std::filesystem::remove(path);
  const std::string cannot_open = "GGUF: cannot open '" + path.string() + "': No such file or directory";
  CHECK_THROWS_WITH_AS((void)GGUFFile::open(path), cannot_open.c_str(), kvfuse::error);
  CHECK_THROWS_WITH_AS((void)GGUFFile::open(dir), doctest::Contains("is not a regular file"), kvfuse::error);
}

// ---------------------------------------------------------------- the real model

TEST_CASE("real model: GGUF: the SmolLM2-135M-Instruct file matches the Python gguf package's dequantization") {
  const auto model = kvfuse_test::real_model(/*optimized_only=*/false);
  if (!model) return;
  const std::filesystem::path& path = *model;
  const std::filesystem::path samples_path =
      std::filesystem::path(__FILE__).parent_path().parent_path() / "data" / "smollm2_dequant_samples.txt";
  std::ifstream samples(samples_path);
  REQUIRE_MESSAGE(samples.good(), "missing ", samples_path.string());

  const GGUFFile f = GGUFFile::open(path);
  std::string line;
  int rows_checked = 0;
  int sums_checked = 0;
  while (std::getline(samples, line)) {
    if (line.empty() || line[0] == '#') continue;
    std::istringstream in(line);
    std::string record;
    in >> record;
    if (record == "model") {
      std::uint64_t size = 0;
      in >> size;
      if (f.file_size() != size) {
        kvfuse_test::skip(path.string() + " has " + std::to_string(f.file_size()) + " bytes, not SmolLM2's " +
                          std::to_string(size) + " (it parsed: " + std::to_string(f.tensors().size()) + " tensors)");
        return;
      }
    } else if (record == "counts") {
      std::size_t tensors = 0;
      std::size_t kvs = 0;
      std::uint32_t blocks = 0;
      in >> tensors >> kvs >> blocks;
      CHECK(f.tensors().size() == tensors);
      CHECK(f.metadata().size() == kvs);
      CHECK(f.get_u32("llama.block_count") == blocks);
    } else if (record == "row") {
      std::string name;
      std::string type;
      std::int64_t row = 0;
      in >> name >> type >> row;
      CAPTURE(name);
      CAPTURE(row);
      const GGUFTensorInfo& info = f.tensor(name);
      CHECK(kvfuse::ggml_type_name(info.type) == type);
      const std::vector<float> values = f.dequantize_rows(info, row, 1);
      for (int i = 0; i < 8; ++i) {
        std::string word;
        REQUIRE(static_cast<bool>(in >> word));
        CHECK(values[static_cast<std::size_t>(i)] == std::strtof(word.c_str(), nullptr));  // bit-exact
      }
      ++rows_checked;
    } else if (record == "sum") {
      std::string name;
      std::string type;
      double expected = 0;
      in >> name >> type >> expected;
      CAPTURE(name);
      const GGUFTensorInfo& info = f.tensor(name);
      CHECK(kvfuse::ggml_type_name(info.type) == type);
      double sum = 0;
      for (const float v : f.dequantize(info)) sum += v;
      CHECK(sum == doctest::Approx(expected).epsilon(1e-9));
      ++sums_checked;
    }
  }
  CHECK(rows_checked == 8);
  CHECK(sums_checked == 3);

  // What the CPU backend and the tokenizer read from it.
  CHECK(f.version() == 3);
  CHECK(f.get_string("general.architecture") == "llama");
  CHECK(f.get_u32("llama.embedding_length") == 576);
  CHECK(f.get_u32("llama.attention.head_count_kv") == 3);
  CHECK(f.get_f32("llama.rope.freq_base") == 100000.0f);
  CHECK(f.get_string_array("tokenizer.ggml.tokens").size() == 49152);
  CHECK(f.get_string_array("tokenizer.ggml.merges").size() == 48900);
  CHECK(f.get_i32_array("tokenizer.ggml.token_type").size() == 49152);
  const GGUFTensorInfo& embd = f.tensor("token_embd.weight");
  CHECK(embd.dims == std::vector<std::int64_t>{576, 49152});
  CHECK(embd.type == GGMLType::q8_0);
  const GGUFTensorInfo& q = f.tensor("blk.0.attn_q.weight");
  CHECK(q.type == GGMLType::q4_1);
  int q4_1 = 0;
  int f32 = 0;
  int q8_0 = 0;
  for (const GGUFTensorInfo& info : f.tensors()) {
    q4_1 += info.type == GGMLType::q4_1;
    f32 += info.type == GGMLType::f32;
    q8_0 += info.type == GGMLType::q8_0;
  }
  CHECK(q4_1 == 210);
  CHECK(f32 == 61);
  CHECK(q8_0 == 1);
}

}  // namespace unit_gguf
