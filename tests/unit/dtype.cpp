// Storage types (core/dtype.hpp): the fp32 <-> fp16 / bf16 conversions the kernels and their CPU
// references share. The oracles are independent: the compiler's _Float16 (IEEE binary16, round to nearest even)
// for fp16, and the definition of bf16 (the top 16 bits of a float, rounded to nearest even) for bf16.
#include <doctest/doctest.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <string_view>

#include "kvfuse/core/dtype.hpp"
#include "kvfuse/core/status.hpp"
#include "../support/model_path.hpp"

// Each unit test file lives in its own namespace: the files are compiled together (a unity build).
namespace unit_dtype {

using kvfuse::bf16;
using kvfuse::DType;
using kvfuse::f16;

namespace {

// GCC 12 and Clang 15+ have _Float16 on x86-64; Clang 14 (the sanitize preset's compiler on Debian 12) does not.
constexpr const char* kNoFloat16 = "this compiler has no _Float16, the fp16 oracle: its comparisons did not run";

bool is_nan_f16(std::uint16_t h) { return (h & 0x7c00u) == 0x7c00u && (h & 0x3ffu) != 0; }

// bf16 by definition: the nearest bf16 value to f (ties to the even mantissa), computed in double.
std::uint16_t bf16_oracle(float f) {
  const auto bits = std::bit_cast<std::uint32_t>(f);
  const std::uint32_t down = bits & 0xffff0000u;
  const std::uint32_t up = down + 0x10000u;
  const double lo = std::bit_cast<float>(down);
  const double hi = std::bit_cast<float>(up);  // may be inf for the largest finite floats: handled by the caller
  const double dl = std::abs(static_cast<double>(f) - lo);
  const double dh = std::abs(hi - static_cast<double>(f));
  if (dl < dh) return static_cast<std::uint16_t>(down >> 16);
  if (dh < dl) return static_cast<std::uint16_t>(up >> 16);
  return static_cast<std::uint16_t>(((down >> 16) & 1u) == 0 ? down >> 16 : up >> 16);
}

}  // namespace

TEST_CASE("every fp16 value converts to fp32 and back unchanged, and matches _Float16") {
  for (std::uint32_t h = 0; h <= 0xffffu; ++h) {
    const auto bits = static_cast<std::uint16_t>(h);
    const float f = kvfuse::to_float(f16{bits});
    if (is_nan_f16(bits)) {
      CHECK(std::isnan(f));
      CHECK(is_nan_f16(kvfuse::to_f16(f).bits));
      continue;
    }
#ifdef __FLT16_MANT_DIG__
    const auto oracle = std::bit_cast<_Float16>(bits);
    REQUIRE(std::bit_cast<std::uint32_t>(f) == std::bit_cast<std::uint32_t>(static_cast<float>(oracle)));
#endif
    REQUIRE(kvfuse::to_f16(f).bits == bits);
  }
#ifndef __FLT16_MANT_DIG__
  kvfuse_test::skip(kNoFloat16);
#endif
}

TEST_CASE("fp32 -> fp16 rounds to nearest even like _Float16, subnormals and overflow included") {
#ifdef __FLT16_MANT_DIG__
  std::mt19937 rng(7);
  std::uniform_int_distribution<std::uint32_t> any_bits;
  std::uniform_real_distribution<float> small(-1e-4f, 1e-4f);
  for (int i = 0; i < 2'000'000; ++i) {
    const float f = (i % 2 == 0) ? std::bit_cast<float>(any_bits(rng)) : small(rng);
    if (std::isnan(f)) continue;
    const auto oracle = std::bit_cast<std::uint16_t>(static_cast<_Float16>(f));
    REQUIRE_MESSAGE(kvfuse::to_f16(f).bits == oracle, "f = " << f);
  }
#else
  kvfuse_test::skip(kNoFloat16);
#endif
  // Exact ties between two halves: the even one wins.
  for (std::uint32_t h = 0; h < 0x7bffu; ++h) {
    const float lo = kvfuse::to_float(f16{static_cast<std::uint16_t>(h)});
    const float hi = kvfuse::to_float(f16{static_cast<std::uint16_t>(h + 1)});
    const float mid = static_cast<float>((static_cast<double>(lo) + hi) / 2);  // exact in fp32
    REQUIRE(kvfuse::to_f16(mid).bits == ((h & 1u) == 0 ? h : h + 1));
  }
  CHECK(kvfuse::to_f16(65504.0f).bits == 0x7bffu);
  CHECK(kvfuse::to_f16(65519.99f).bits == 0x7bffu);
  CHECK(kvfuse::to_f16(65520.0f).bits == 0x7c00u);
  CHECK(kvfuse::to_f16(-1e10f).bits == 0xfc00u);
  CHECK(kvfuse::to_f16(std::ldexp(1.0f, -24)).bits == 0x0001u);
  CHECK(kvfuse::to_f16(std::ldexp(1.0f, -25)).bits == 0x0000u);  // tie between 0 and 2^-24: even (0)
  CHECK(kvfuse::to_f16(-0.0f).bits == 0x8000u);
}

TEST_CASE("fp32 -> bf16 rounds to nearest even; every bf16 value round-trips") {
  for (std::uint32_t h = 0; h <= 0xffffu; ++h) {
    const auto bits = static_cast<std::uint16_t>(h);
    const float f = kvfuse::to_float(bf16{bits});
    REQUIRE(std::bit_cast<std::uint32_t>(f) == h << 16);
    if (std::isnan(f)) {
      CHECK(std::isnan(kvfuse::to_float(kvfuse::to_bf16(f))));
    } else {
      REQUIRE(kvfuse::to_bf16(f).bits == bits);
    }
  }
  std::mt19937 rng(11);
  std::uniform_int_distribution<std::uint32_t> any_bits;
  for (int i = 0; i < 2'000'000; ++i) {
    const float f = std::bit_cast<float>(any_bits(rng));
    if (!std::isfinite(f) || std::abs(f) > 3.38e38f) continue;  // the oracle's upper neighbour must be finite
    REQUIRE_MESSAGE(kvfuse::to_bf16(f).bits == bf16_oracle(f), "f = " << f);
  }
  CHECK(kvfuse::to_bf16(std::bit_cast<float>(0x3f808000u)).bits == 0x3f80u);  // tie, even stays
  CHECK(kvfuse::to_bf16(std::bit_cast<float>(0x3f818000u)).bits == 0x3f82u);  // tie, odd rounds up
  CHECK(kvfuse::to_bf16(std::numeric_limits<float>::max()).bits == 0x7f80u);  // rounds to inf
}

TEST_CASE("round_to, from_float and the dtype table agree with the conversions") {
  CHECK(kvfuse::round_to(DType::f32, 0.1f) == 0.1f);
  CHECK(kvfuse::round_to(DType::bf16, 0.1f) == kvfuse::to_float(kvfuse::to_bf16(0.1f)));
  CHECK(kvfuse::round_to(DType::f16, 0.1f) == 0.0999755859375f);  // fp16 0x2e66, the nearest to 0.1
  CHECK(kvfuse::from_float<bf16>(3.0f).bits == kvfuse::to_bf16(3.0f).bits);
  CHECK(kvfuse::from_float<f16>(3.0f).bits == kvfuse::to_f16(3.0f).bits);
  CHECK(kvfuse::from_float<float>(3.0f) == 3.0f);
  CHECK(kvfuse::dtype_size(DType::f32) == 4);
  CHECK(kvfuse::dtype_size(DType::bf16) == 2);
  CHECK(std::string_view(kvfuse::dtype_name(DType::f16)) == "f16");
  CHECK(std::string_view(kvfuse::dtype_name(static_cast<DType>(9))) == "unknown dtype");
}

TEST_CASE("refuse records a message naming the bad value and returns the status") {
  const kvfuse::Status s = kvfuse::refuse(kvfuse::Status::unsupported, "rope: head_dim %d is not 64, 128 or 256", 96);
  CHECK(s == kvfuse::Status::unsupported);
  CHECK(std::string_view(kvfuse::last_status_message()) == "rope: head_dim 96 is not 64, 128 or 256");
  CHECK(std::string_view(kvfuse::status_string(kvfuse::Status::invalid_argument)) == "invalid argument");
}

}  // namespace unit_dtype
