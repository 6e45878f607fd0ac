// ggml types and block formats (model/ggml_type.hpp, model/ggml_quant.hpp). Each quantized type is checked on
// blocks packed here the way ggml's quantizers (quantize_row_*_ref) pack them, against values computed from the
// format's definition (element e -> its quant and its group's scale); scales are powers of two or small dyadic
// numbers, so the expected floats are exact whatever the order of operations. Then every type against random
// blocks dequantized by an independent implementation, the Python gguf package
// (tests/data/ggml_quant_vectors.txt, bit-exact), and fp16 / bf16 against an ldexp formula for all 65536 patterns.
#include "kvfuse/model/ggml_quant.hpp"
#include "kvfuse/model/ggml_type.hpp"

#include <doctest/doctest.h>

#include <array>
#include <bit>
#include <cmath>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

// Each unit test file lives in its own namespace: the files are compiled together (a unity build).
namespace unit_ggml_quant {

namespace q = kvfuse::detail;
using kvfuse::GGMLType;
using kvfuse::ggml_type_traits;

namespace {

constexpr std::uint32_t t(GGMLType type) { return static_cast<std::uint32_t>(type); }

void put_u16(std::vector<std::uint8_t>& b, std::size_t at, std::uint16_t v) {
  b[at] = static_cast<std::uint8_t>(v & 0xff);
  b[at + 1] = static_cast<std::uint8_t>(v >> 8);
}

// fp16 bit patterns of the scales used below.
constexpr std::uint16_t h_0_125 = 0x3000;
constexpr std::uint16_t h_0_25 = 0x3400;
constexpr std::uint16_t h_0_5 = 0x3800;
constexpr std::uint16_t h_0_75 = 0x3a00;
constexpr std::uint16_t h_1 = 0x3c00;
constexpr std::uint16_t h_2 = 0x4000;
constexpr std::uint16_t h_minus_1 = 0xbc00;

std::vector<float> dequant(GGMLType type, const std::vector<std::uint8_t>& block) {
  const auto traits = ggml_type_traits(type);
  REQUIRE(block.size() % static_cast<std::size_t>(traits.type_size) == 0);
  const auto n_blocks = static_cast<std::int64_t>(block.size()) / traits.type_size;
  std::vector<float> y(static_cast<std::size_t>(n_blocks * traits.block_size), -12345.0f);
  REQUIRE(q::dequantize_blocks(type, block.data(), n_blocks, y.data()));
  return y;
}

std::filesystem::path data_file(const char* name) {
  return std::filesystem::path(__FILE__).parent_path().parent_path() / "data" / name;
}

// Independent binary16 decoding: (-1)^s * 2^(e - 15) * (1 + m / 1024), subnormals 2^-14 * (m / 1024).
double fp16_reference(std::uint16_t h) {
  const int s = h >> 15;
  const int e = (h >> 10) & 31;
  const int m = h & 1023;
  const double sign = s ? -1.0 : 1.0;
  if (e == 31) return m == 0 ? sign * INFINITY : NAN;
  if (e == 0) return sign * std::ldexp(m / 1024.0, -14);
  return sign * std::ldexp(1.0 + m / 1024.0, e - 15);
}

}  // namespace

TEST_CASE("ggml type numbers, block sizes and bytes per block are ggml's") {
  struct Row {
    std::uint32_t number;
    const char* name;
    std::int64_t block_size;
    std::int64_t type_size;
    bool dequantizable;
  };
  // ggml.h enum ggml_type; ggml-common.h block structs (e.g. block_q6_K = 128 + 64 + 16 + 2 bytes).
  const Row rows[] = {{0, "F32", 1, 4, true},        {1, "F16", 1, 2, true},        {2, "Q4_0", 32, 18, true},
                      {3, "Q4_1", 32, 20, true},     {6, "Q5_0", 32, 22, true},     {7, "Q5_1", 32, 24, true},
                      {8, "Q8_0", 32, 34, true},     {9, "Q8_1", 32, 40, false},    {10, "Q2_K", 256, 84, true},
                      {11, "Q3_K", 256, 110, true},  {12, "Q4_K", 256, 144, true},  {13, "Q5_K", 256, 176, true},
                      {14, "Q6_K", 256, 210, true},  {15, "Q8_K", 256, 292, false}, {16, "IQ2_XXS", 256, 66, false},
                      {20, "IQ4_NL", 32, 18, false}, {24, "I8", 1, 1, false},       {28, "F64", 1, 8, false},
                      {30, "BF16", 1, 2, true},      {35, "TQ2_0", 256, 66, false}, {39, "MXFP4", 32, 17, false}};
  for (const Row& row : rows) {
    CAPTURE(row.name);
    const auto traits = ggml_type_traits(GGMLType{row.number});
    REQUIRE(traits.name != nullptr);
    CHECK(std::string(traits.name) == row.name);
    CHECK(traits.block_size == row.block_size);
    CHECK(traits.type_size == row.type_size);
    CHECK(traits.dequantizable == row.dequantizable);
  }
  CHECK(t(GGMLType::q6_k) == 14);
  CHECK(t(GGMLType::bf16) == 30);
  for (const std::uint32_t retired : {4u, 5u, 31u, 32u, 33u, 36u, 37u, 38u, 42u, 1000u, 0xffffffffu}) {
    CAPTURE(retired);
    CHECK(ggml_type_traits(GGMLType{retired}).name == nullptr);
    CHECK_FALSE(ggml_type_traits(GGMLType{retired}).dequantizable);
  }
}

TEST_CASE("fp16 -> fp32 is exact: zeros, normals, subnormals, extremes, infinities, NaN") {
  CHECK(q::fp16_to_fp32(0x0000) == 0.0f);
  CHECK_FALSE(std::signbit(q::fp16_to_fp32(0x0000)));
  CHECK(q::fp16_to_fp32(0x8000) == 0.0f);
  CHECK(std::signbit(q::fp16_to_fp32(0x8000)));
  CHECK(q::fp16_to_fp32(0x3c00) == 1.0f);
  CHECK(q::fp16_to_fp32(0xc000) == -2.0f);
  CHECK(q::fp16_to_fp32(0x3555) == 0.333251953125f);          // 0x155 / 1024 * 2^-2 + 2^-2
  CHECK(q::fp16_to_fp32(0x7bff) == 65504.0f);                 // largest finite
  CHECK(q::fp16_to_fp32(0x0400) == 6.103515625e-05f);         // smallest normal 2^-14
  CHECK(q::fp16_to_fp32(0x0001) == 5.9604644775390625e-08f);  // smallest subnormal 2^-24
  CHECK(q::fp16_to_fp32(0x8001) == -5.9604644775390625e-08f);
  CHECK(q::fp16_to_fp32(0x03ff) == 6.097555160522461e-05f);  // largest subnormal 1023 * 2^-24
  CHECK(q::fp16_to_fp32(0x0200) == 3.0517578125e-05f);       // 2^-15
  CHECK(q::fp16_to_fp32(0x7c00) == INFINITY);
  CHECK(q::fp16_to_fp32(0xfc00) == -INFINITY);
  CHECK(std::isnan(q::fp16_to_fp32(0x7e00)));
  CHECK(std::isnan(q::fp16_to_fp32(0x7c01)));
  CHECK(std::isnan(q::fp16_to_fp32(0xffff)));
  CHECK(std::bit_cast<std::uint32_t>(q::fp16_to_fp32(0x7e00)) == 0x7fc00000u);  // quiet NaN stays quiet
}

TEST_CASE("fp16 -> fp32 agrees with the ldexp definition for all 65536 patterns") {
  int mismatches = 0;
  for (std::uint32_t h = 0; h <= 0xffff; ++h) {
    const float got = q::fp16_to_fp32(static_cast<std::uint16_t>(h));
    const double want = fp16_reference(static_cast<std::uint16_t>(h));
    const bool same = std::isnan(want) ? std::isnan(got)
                                       : (static_cast<double>(got) == want && std::signbit(got) == std::signbit(want));
    if (!same) ++mismatches;
  }
  CHECK(mismatches == 0);
}

TEST_CASE("bf16 -> fp32 is the top half of the fp32 pattern") {
  CHECK(q::bf16_to_fp32(0x3f80) == 1.0f);
  CHECK(q::bf16_to_fp32(0xc049) == -3.140625f);
  CHECK(q::bf16_to_fp32(0x0001) == std::ldexp(1.0f, -133));  // smallest subnormal
  CHECK(q::bf16_to_fp32(0x7f80) == INFINITY);
  CHECK(std::signbit(q::bf16_to_fp32(0x8000)));
  CHECK(std::isnan(q::bf16_to_fp32(0x7fc0)));
}

TEST_CASE("F32, F16 and BF16 blocks are one little-endian element each") {
  const std::vector<std::uint8_t> f32 = {0x00, 0x00, 0x80, 0x3f, 0x00, 0x00, 0x20, 0xc1};  // 1.0f, -10.0f
  CHECK(dequant(GGMLType::f32, f32) == std::vector<float>{1.0f, -10.0f});
  const std::vector<std::uint8_t> f16 = {0x00, 0x3c, 0x00, 0xc5, 0x01, 0x00};  // 1, -5, 2^-24
  CHECK(dequant(GGMLType::f16, f16) == std::vector<float>{1.0f, -5.0f, 5.9604644775390625e-08f});
  const std::vector<std::uint8_t> bf16 = {0x80, 0x3f, 0x49, 0xc0};
  CHECK(dequant(GGMLType::bf16, bf16) == std::vector<float>{1.0f, -3.140625f});
}

TEST_CASE("Q4_0: y = (nibble - 8) * d, low nibbles are elements 0-15, high nibbles 16-31") {
  std::vector<std::uint8_t> b(18);
  put_u16(b, 0, h_0_5);
  for (int j = 0; j < 16; ++j) b[2 + j] = static_cast<std::uint8_t>(j | ((15 - j) << 4));
  const std::vector<float> expected = {-4.0f, -3.5f, -3.0f, -2.5f, -2.0f, -1.5f, -1.0f, -0.5f,  //
                                       0.0f,  0.5f,  1.0f,  1.5f,  2.0f,  2.5f,  3.0f,  3.5f,   //
                                       3.5f,  3.0f,  2.5f,  2.0f,  1.5f,  1.0f,  0.5f,  0.0f,   //
                                       -0.5f, -1.0f, -1.5f, -2.0f, -2.5f, -3.0f, -3.5f, -4.0f};
  CHECK(dequant(GGMLType::q4_0, b) == expected);
}

TEST_CASE("Q4_1: y = nibble * d + m, with d = 0.5 and m = -1") {
  std::vector<std::uint8_t> b(20);
  put_u16(b, 0, h_0_5);
  put_u16(b, 2, h_minus_1);
  for (int j = 0; j < 16; ++j) b[4 + j] = static_cast<std::uint8_t>(j | ((15 - j) << 4));
  const std::vector<float> expected = {-1.0f, -0.5f, 0.0f, 0.5f, 1.0f, 1.5f, 2.0f,  2.5f,  //
                                       3.0f,  3.5f,  4.0f, 4.5f, 5.0f, 5.5f, 6.0f,  6.5f,  //
                                       6.5f,  6.0f,  5.5f, 5.0f, 4.5f, 4.0f, 3.5f,  3.0f,  //
                                       2.5f,  2.0f,  1.5f, 1.0f, 0.5f, 0.0f, -0.5f, -1.0f};
  CHECK(dequant(GGMLType::q4_1, b) == expected);

  // Two blocks: the second starts 20 bytes in and fills elements 32-63.
  std::vector<std::uint8_t> two(40, 0);
  put_u16(two, 20, h_2);
  put_u16(two, 22, h_1);
  two[24] = 0x31;  // element 32: 1 * 2 + 1 = 3, element 48: 3 * 2 + 1 = 7
  const auto y = dequant(GGMLType::q4_1, two);
  CHECK(y[0] == 0.0f);
  CHECK(y[32] == 3.0f);
  CHECK(y[48] == 7.0f);
  CHECK(y[33] == 1.0f);
}

TEST_CASE("Q5_0 and Q5_1: the fifth bit of element j is bit j of qh") {
  // 5-bit quants L[e], packed as quantize_row_q5_*_ref does.
  std::array<int, 32> L{};
  for (int e = 0; e < 32; ++e) L[e] = (e * 11 + 3) % 32;
  const auto pack = [&L](std::vector<std::uint8_t>& b, std::size_t qh_at) {
    std::uint32_t qh = 0;
    for (int j = 0; j < 16; ++j) {
      b[qh_at + 4 + j] = static_cast<std::uint8_t>((L[j] & 0xf) | ((L[j + 16] & 0xf) << 4));
      qh |= static_cast<std::uint32_t>((L[j] >> 4) & 1) << j;
      qh |= static_cast<std::uint32_t>((L[j + 16] >> 4) & 1) << (j + 16);
    }
    for (int k = 0; k < 4; ++k) b[qh_at + k] = static_cast<std::uint8_t>(qh >> (8 * k));
  };
  std::vector<std::uint8_t> b0(22);
  put_u16(b0, 0, h_0_25);
  pack(b0, 2);
  const auto y0 = dequant(GGMLType::q5_0, b0);
  for (int e = 0; e < 32; ++e) {
    CAPTURE(e);
    CHECK(y0[e] == static_cast<float>(L[e] - 16) * 0.25f);
  }
  CHECK(y0[0] == -3.25f);  // L = 3: (3 - 16) * 0.25
  CHECK(y0[2] == 2.25f);   // L = 25 (fifth bit set): 9 * 0.25
  CHECK(y0[17] == 3.5f);   // L = 190 % 32 = 30, a high-nibble element with the fifth bit: 14 * 0.25
  std::vector<std::uint8_t> b1(24);
  put_u16(b1, 0, h_0_5);
  put_u16(b1, 2, h_2);
  pack(b1, 4);
  const auto y1 = dequant(GGMLType::q5_1, b1);
  for (int e = 0; e < 32; ++e) {
    CAPTURE(e);
    CHECK(y1[e] == static_cast<float>(L[e]) * 0.5f + 2.0f);
  }
}

TEST_CASE("Q8_0: y = int8 * d") {
  std::vector<std::uint8_t> b(34);
  put_u16(b, 0, h_0_125);
  const std::int8_t qs[32] = {-128, -127, -1, 0,  1, 2,  64, 127, 5, -5, 10, -10, 0, 0,  0, 0,
                              100,  -100, 3,  -3, 7, -7, 8,  -8,  9, -9, 1,  -1,  2, -2, 4, -4};
  for (int j = 0; j < 32; ++j) b[2 + j] = static_cast<std::uint8_t>(qs[j]);
  const auto y = dequant(GGMLType::q8_0, b);
  CHECK(y[0] == -16.0f);
  CHECK(y[1] == -15.875f);
  CHECK(y[2] == -0.125f);
  CHECK(y[7] == 15.875f);
  for (int j = 0; j < 32; ++j) CHECK(y[j] == qs[j] * 0.125f);
}

TEST_CASE("Q2_K: 16 groups of 16, y = d * (sc & 15) * q - dmin * (sc >> 4)") {
  std::array<int, 256> L{};
  for (int e = 0; e < 256; ++e) L[e] = (e * 5 + e / 16) % 4;
  std::vector<std::uint8_t> b(84, 0);
  for (int g = 0; g < 16; ++g) b[g] = static_cast<std::uint8_t>((g % 16) | (((15 - g) % 16) << 4));
  for (int j = 0; j < 256; j += 128) {  // quantize_row_q2_K_ref packing
    for (int l = 0; l < 32; ++l) {
      b[16 + j / 4 + l] =
          static_cast<std::uint8_t>(L[j + l] | (L[j + l + 32] << 2) | (L[j + l + 64] << 4) | (L[j + l + 96] << 6));
    }
  }
  put_u16(b, 80, h_0_5);
  put_u16(b, 82, h_0_25);
  const auto y = dequant(GGMLType::q2_k, b);
  for (int e = 0; e < 256; ++e) {
    CAPTURE(e);
    const int g = e / 16;
    CHECK(y[e] == 0.5f * static_cast<float>(g) * static_cast<float>(L[e]) - 0.25f * static_cast<float>(15 - g));
  }
  CHECK(y[0] == -3.75f);   // g 0: 0 - 0.25 * 15
  CHECK(y[255] == 15.0f);  // g 15, L = (1275 + 15) % 4 = 2: 0.5 * 15 * 2 - 0.25 * 0
}

TEST_CASE("Q3_K: signed 6-bit group scales, 3-bit quants with the high bit in hmask") {
  std::array<int, 16> scale6{};  // 6-bit stored scales; the group scale is scale6 - 32
  for (int g = 0; g < 16; ++g) scale6[g] = (g * 13 + 7) % 64;
  std::array<int, 256> L{};  // stored 3-bit quants; the value is L - 4
  for (int e = 0; e < 256; ++e) L[e] = (e * 3 + e / 32) % 8;
  std::vector<std::uint8_t> b(110, 0);
  for (int j = 0; j < 16; ++j) {  // quantize_row_q3_K_ref scale packing
    const int l = scale6[j];
    if (j < 8) {
      b[96 + j] = static_cast<std::uint8_t>(l & 0xf);
    } else {
      b[96 + j - 8] = static_cast<std::uint8_t>(b[96 + j - 8] | ((l & 0xf) << 4));
    }
    b[96 + 8 + j % 4] = static_cast<std::uint8_t>(b[96 + 8 + j % 4] | ((l >> 4) << (2 * (j / 4))));
  }
  std::array<int, 256> low = L;
  for (int j = 0; j < 256; ++j) {  // high bit of element j -> bit j / 32 of hmask[j % 32]
    if (low[j] > 3) {
      b[j % 32] = static_cast<std::uint8_t>(b[j % 32] | (1 << (j / 32)));
      low[j] -= 4;
    }
  }
  for (int j = 0; j < 256; j += 128) {
    for (int l = 0; l < 32; ++l) {
      b[32 + j / 4 + l] = static_cast<std::uint8_t>(low[j + l] | (low[j + l + 32] << 2) | (low[j + l + 64] << 4) |
                                                    (low[j + l + 96] << 6));
    }
  }
  put_u16(b, 108, h_0_25);
  const auto y = dequant(GGMLType::q3_k, b);
  for (int e = 0; e < 256; ++e) {
    CAPTURE(e);
    CHECK(y[e] == 0.25f * static_cast<float>(scale6[e / 16] - 32) * static_cast<float>(L[e] - 4));
  }
  CHECK(y[0] == 25.0f);  // scale6 7 -> -25, L 0 -> -4: 0.25 * -25 * -4
}

namespace {

// quantize_row_q4_K_ref / q5_K packing of eight 6-bit scales and mins into 12 bytes.
void pack_scale_min_k4(std::uint8_t* s, const std::array<int, 8>& ls, const std::array<int, 8>& lm) {
  for (int j = 0; j < 8; ++j) {
    if (j < 4) {
      s[j] = static_cast<std::uint8_t>(ls[j]);
      s[j + 4] = static_cast<std::uint8_t>(lm[j]);
    } else {
      s[j + 4] = static_cast<std::uint8_t>((ls[j] & 0xf) | ((lm[j] & 0xf) << 4));
      s[j - 4] = static_cast<std::uint8_t>(s[j - 4] | ((ls[j] >> 4) << 6));
      s[j] = static_cast<std::uint8_t>(s[j] | ((lm[j] >> 4) << 6));
    }
  }
}

}  // namespace

TEST_CASE("Q4_K and Q5_K: 8 sub-blocks of 32 with 6-bit scales and mins, y = d * sc * q - dmin * m") {
  const std::array<int, 8> ls = {1, 63, 17, 32, 48, 5, 62, 33};  // j >= 4 use the two high bits
  const std::array<int, 8> lm = {0, 2, 63, 16, 47, 60, 1, 31};
  std::array<int, 256> L{};
  for (int e = 0; e < 256; ++e) L[e] = (e * 7 + e / 32) % 32;

  SUBCASE("Q4_K") {
    std::vector<std::uint8_t> b(144, 0);
    put_u16(b, 0, h_0_5);
    put_u16(b, 2, h_0_125);
    pack_scale_min_k4(b.data() + 4, ls, lm);
    for (int j = 0; j < 256; j += 64) {
      for (int l = 0; l < 32; ++l) {
        b[16 + j / 2 + l] = static_cast<std::uint8_t>((L[j + l] & 0xf) | ((L[j + l + 32] & 0xf) << 4));
      }
    }
    const auto y = dequant(GGMLType::q4_k, b);
    for (int e = 0; e < 256; ++e) {
      CAPTURE(e);
      const int j = e / 32;
      CHECK(y[e] ==
            0.5f * static_cast<float>(ls[j]) * static_cast<float>(L[e] & 0xf) - 0.125f * static_cast<float>(lm[j]));
    }
  }
  SUBCASE("Q5_K") {
    std::vector<std::uint8_t> b(176, 0);
    put_u16(b, 0, h_0_75);
    put_u16(b, 2, h_0_25);
    pack_scale_min_k4(b.data() + 4, ls, lm);
    std::uint8_t m1 = 1;
    std::uint8_t m2 = 2;
    for (int n = 0; n < 256; n += 64) {  // quantize_row_q5_K_ref: fifth bits into qh
      for (int j = 0; j < 32; ++j) {
        int l1 = L[n + j];
        int l2 = L[n + j + 32];
        if (l1 > 15) {
          l1 -= 16;
          b[16 + j] |= m1;
        }
        if (l2 > 15) {
          l2 -= 16;
          b[16 + j] |= m2;
        }
        b[48 + n / 2 + j] = static_cast<std::uint8_t>(l1 | (l2 << 4));
      }
      m1 = static_cast<std::uint8_t>(m1 << 2);
      m2 = static_cast<std::uint8_t>(m2 << 2);
    }
    const auto y = dequant(GGMLType::q5_k, b);
    for (int e = 0; e < 256; ++e) {
      CAPTURE(e);
      const int j = e / 32;
      CHECK(y[e] == 0.75f * static_cast<float>(ls[j]) * static_cast<float>(L[e]) - 0.25f * static_cast<float>(lm[j]));
    }
  }
}

TEST_CASE("Q6_K: one hand-built block of 256 with int8 group scales, y = d * scale * (q - 32)") {
  std::array<int, 256> L{};  // 6-bit stored quants
  for (int e = 0; e < 256; ++e) L[e] = (e * 7) % 64;
  std::array<int, 16> sc{};
  for (int g = 0; g < 16; ++g) sc[g] = g - 8;
  sc[3] = -128;
  sc[12] = 127;
  std::vector<std::uint8_t> b(210, 0);
  for (int j = 0; j < 256; j += 128) {  // quantize_row_q6_K_ref packing
    std::uint8_t* ql = b.data() + j / 2;
    std::uint8_t* qh = b.data() + 128 + j / 4;
    for (int l = 0; l < 32; ++l) {
      ql[l] = static_cast<std::uint8_t>((L[j + l] & 0xf) | ((L[j + l + 64] & 0xf) << 4));
      ql[l + 32] = static_cast<std::uint8_t>((L[j + l + 32] & 0xf) | ((L[j + l + 96] & 0xf) << 4));
      qh[l] = static_cast<std::uint8_t>((L[j + l] >> 4) | ((L[j + l + 32] >> 4) << 2) | ((L[j + l + 64] >> 4) << 4) |
                                        ((L[j + l + 96] >> 4) << 6));
    }
  }
  for (int g = 0; g < 16; ++g) b[192 + g] = static_cast<std::uint8_t>(static_cast<std::int8_t>(sc[g]));
  put_u16(b, 208, h_0_25);
  const auto y = dequant(GGMLType::q6_k, b);
  for (int e = 0; e < 256; ++e) {
    CAPTURE(e);
    CHECK(y[e] == 0.25f * static_cast<float>(sc[e / 16]) * static_cast<float>(L[e] - 32));
  }
  // By hand: e = 0: L 0, scale -8 -> 0.25 * -8 * -32 = 64. e = 100: L 700 % 64 = 60, group 6 (scale -2)
  // -> 0.25 * -2 * 28 = -14. e = 255: L 1785 % 64 = 57, group 15 (scale 7) -> 0.25 * 7 * 25 = 43.75.
  // e = 48: L 336 % 64 = 16, group 3 (scale -128) -> 0.25 * -128 * -16 = 512. e = 200: L 1400 % 64 = 56,
  // group 12 (scale 127) -> 0.25 * 127 * 24 = 762.
  CHECK(y[0] == 64.0f);
  CHECK(y[100] == -14.0f);
  CHECK(y[255] == 43.75f);
  CHECK(y[48] == 512.0f);
  CHECK(y[200] == 762.0f);
}

TEST_CASE("dequantize_blocks refuses types it cannot dequantize and writes nothing") {
  std::vector<std::uint8_t> block(292, 0x11);
  std::vector<float> y(256, 7.0f);
  for (const GGMLType type : {GGMLType::q8_1, GGMLType::q8_k, GGMLType::iq2_xxs, GGMLType::i32, GGMLType::f64}) {
    CHECK_FALSE(q::dequantize_blocks(type, block.data(), 1, y.data()));
  }
  CHECK_FALSE(q::dequantize_blocks(GGMLType{4}, block.data(), 1, y.data()));
  CHECK_FALSE(q::dequantize_block(GGMLType{99}, block.data(), y.data()));
  CHECK(y == std::vector<float>(256, 7.0f));
  CHECK(q::dequantize_blocks(GGMLType::q8_0, block.data(), 0, y.data()));  // zero blocks: nothing to do
}

TEST_CASE("every dequantizable type matches the Python gguf package bit for bit on random blocks") {
  std::ifstream in(data_file("ggml_quant_vectors.txt"));
  REQUIRE_MESSAGE(in.good(), "missing ", data_file("ggml_quant_vectors.txt").string());
  std::string line;
  int types_checked = 0;
  while (std::getline(in, line)) {
    if (line.empty() || line[0] == '#') continue;
    std::istringstream fields(line);
    std::string name;
    std::int64_t n_blocks = 0;
    std::string hex;
    fields >> name >> n_blocks >> hex;
    CAPTURE(name);
    std::uint32_t number = 0;
    auto traits_of = [](std::uint32_t n) { return ggml_type_traits(GGMLType{n}); };
    while (number < 64 && (traits_of(number).name == nullptr || name != traits_of(number).name)) ++number;
    REQUIRE(number < 64);
    const GGMLType type{number};
    const auto traits = ggml_type_traits(type);
    REQUIRE(hex.size() == static_cast<std::size_t>(2 * n_blocks * traits.type_size));
    std::vector<std::uint8_t> bytes(hex.size() / 2);
    for (std::size_t i = 0; i < bytes.size(); ++i) {
      bytes[i] = static_cast<std::uint8_t>(std::stoul(hex.substr(2 * i, 2), nullptr, 16));
    }
    std::vector<float> y(static_cast<std::size_t>(n_blocks * traits.block_size));
    REQUIRE(q::dequantize_blocks(type, bytes.data(), n_blocks, y.data()));
    int mismatches = 0;
    for (std::size_t i = 0; i < y.size(); ++i) {
      std::string word;
      REQUIRE(static_cast<bool>(fields >> word));
      const auto want = static_cast<std::uint32_t>(std::stoul(word, nullptr, 16));
      const std::uint32_t got = std::bit_cast<std::uint32_t>(y[i]);
      const bool both_nan = std::isnan(y[i]) && std::isnan(std::bit_cast<float>(want));
      if (got != want && !both_nan) ++mismatches;
    }
    CHECK(mismatches == 0);
    ++types_checked;
  }
  CHECK(types_checked == 13);
}

}  // namespace unit_ggml_quant
