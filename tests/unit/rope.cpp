// RoPE: the one frequency table (core/rope.hpp rope_frequencies) and the CPU backend's double-angle rotation
// (detail/rope.hpp rope_cos_sin + rope_rotate_head, what CpuLlama runs): both pairings against
// hand-computed rotations, inverse and shift, and the float table of the kernels as the rounded double one.
#include <doctest/doctest.h>

#include <array>
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "../support/test_util.hpp"
#include "kvfuse/core/rope.hpp"
#include "kvfuse/detail/rope.hpp"
#include "kvfuse/harness/ref/rope.hpp"

// Each unit test file lives in its own namespace: the files are compiled together (a unity build).
namespace unit_rope {

using kvfuse::RopeFrequencyConfig;
using kvfuse::RopePairing;
using kvfuse::RopeScaling;
using kvfuse::Status;
using kvfuse_test::max_abs_diff;
using kvfuse_test::message_has;

namespace {

// |a - b| <= tol for every element.
template <std::size_t N>
void check_close(const std::array<float, N>& a, const std::array<double, N>& b, double tol) {
  for (std::size_t i = 0; i < N; ++i) {
    CAPTURE(i);
    CHECK(std::fabs(static_cast<double>(a[i]) - b[i]) <= tol);
  }
}

std::vector<float> ramp(std::int64_t d) {
  std::vector<float> x(static_cast<std::size_t>(d));
  for (std::int64_t i = 0; i < d; ++i)
    x[static_cast<std::size_t>(i)] = 0.25f * static_cast<float>(i) - 1.5f + 0.1f * static_cast<float>(i % 3);
  return x;
}

RopeFrequencyConfig frequencies(std::int64_t head_dim, double base) {
  RopeFrequencyConfig c;
  c.head_dim = head_dim;
  c.base = base;
  return c;
}

// The CPU backend's RoPE of one head vector: θ from the table, cos / sin of position · θ in double, the
// rotation in float. A negative position is the inverse, a difference of positions a shift.
void cpu_rope(float* x, const RopeFrequencyConfig& c, RopePairing pairing, double position) {
  const auto pairs = static_cast<std::size_t>(c.head_dim / 2);
  std::vector<double> theta(pairs);
  REQUIRE(kvfuse::rope_frequencies(c, theta.data()) == Status::success);
  std::vector<float> cos_t(pairs), sin_t(pairs);
  kvfuse::detail::rope_cos_sin(theta.data(), c.head_dim / 2, position, cos_t.data(), sin_t.data());
  kvfuse::detail::rope_rotate_head(x, c.head_dim, pairing, cos_t.data(), sin_t.data());
}

}  // namespace

TEST_CASE("rope_frequencies: base^(-2i/d), divided by the frequency factor") {
  RopeFrequencyConfig c = frequencies(8, 10000.0);
  double theta[4] = {};
  REQUIRE(kvfuse::rope_frequencies(c, theta) == Status::success);
  CHECK(theta[0] == doctest::Approx(1.0));
  CHECK(theta[1] == doctest::Approx(0.1));
  CHECK(theta[2] == doctest::Approx(0.01));
  CHECK(theta[3] == doctest::Approx(0.001));
  const float factors[4] = {1.0f, 2.0f, 4.0f, 8.0f};
  c.freq_factors = factors;
  REQUIRE(kvfuse::rope_frequencies(c, theta) == Status::success);
  CHECK(theta[1] == doctest::Approx(0.05));
  CHECK(theta[3] == doctest::Approx(0.000125));
}

TEST_CASE("rope_frequencies: one table, two precisions: the kernels' float table is the double one rounded once") {
  for (std::int64_t d : {64, 128, 256}) {
    for (RopeScaling scaling : {RopeScaling::none, RopeScaling::linear, RopeScaling::llama3}) {
      CAPTURE(d);
      CAPTURE(static_cast<int>(scaling));
      RopeFrequencyConfig c = frequencies(d, 500000.0);
      c.scaling = scaling;
      c.factor = 8.0;
      double exact[kvfuse::rope_max_pairs] = {};
      float rounded[kvfuse::rope_max_pairs] = {};
      REQUIRE(kvfuse::rope_frequencies(c, exact) == Status::success);
      REQUIRE(kvfuse::rope_frequencies(c, rounded) == Status::success);
      for (std::int64_t i = 0; i < d / 2; ++i) CHECK(rounded[i] == static_cast<float>(exact[i]));
    }
  }
}

TEST_CASE("rope_frequencies (double): any even head_dim; refusals name the value and write nothing") {
  double theta[64];
  for (double& t : theta) t = -1.0;
  REQUIRE(kvfuse::rope_frequencies(frequencies(80, 10000.0), theta) == Status::success);  // the CPU backend's
  CHECK(theta[39] == doctest::Approx(std::pow(10000.0, -78.0 / 80.0)));
  for (double& t : theta) t = -1.0;
  const auto refused = [&](const RopeFrequencyConfig& c, Status status, const std::string& needle) {
    CHECK(kvfuse::rope_frequencies(c, theta) == status);
    CHECK(message_has(needle));
    CHECK(theta[0] == -1.0);  // nothing written
  };
  refused(frequencies(7, 10000.0), Status::invalid_argument, "head_dim 7");
  refused(frequencies(0, 10000.0), Status::invalid_argument, "head_dim 0");
  const float factors[4] = {1.0f, 2.0f, 0.0f, 1.0f};
  RopeFrequencyConfig c = frequencies(8, 10000.0);
  c.freq_factors = factors;
  refused(c, Status::invalid_argument, "freq_factors[2] = 0");
  const float good[4] = {1.0f, 2.0f, 4.0f, 8.0f};
  c.freq_factors = good;
  c.scaling = RopeScaling::llama3;
  c.factor = 8.0;
  refused(c, Status::invalid_argument, "scale twice");
}

TEST_CASE("rope_rotate_pair rotates counter-clockwise") {
  float a = 1.0f, b = 0.0f;
  kvfuse::detail::rope_rotate_pair(a, b, 0.0f, 1.0f);  // +90 degrees: (1, 0) -> (0, 1)
  CHECK(a == 0.0f);
  CHECK(b == 1.0f);
  a = 3.0f;
  b = 4.0f;
  kvfuse::detail::rope_rotate_pair(a, b, 0.6f, 0.8f);  // (3·0.6 − 4·0.8, 3·0.8 + 4·0.6)
  CHECK(a == doctest::Approx(-1.4));
  CHECK(b == doctest::Approx(4.8));
}

TEST_CASE("CPU RoPE: interleaved pairs (x0,x1),(x2,x3), half-split pairs (x0,x2),(x1,x3)") {
  // d = 4, base 100: θ0 = 1, θ1 = 100^(-1/2) = 0.1; at position 1 the pairs turn by 1 and 0.1 rad.
  // Expected values: cos 1 = 0.5403023, sin 1 = 0.8414710, cos 0.1 = 0.9950042, sin 0.1 = 0.0998334.
  const RopeFrequencyConfig c = frequencies(4, 100.0);
  std::array<float, 4> x{1, 2, 3, 4};
  cpu_rope(x.data(), c, RopePairing::interleaved, 1);
  // (1 cos1 − 2 sin1, 1 sin1 + 2 cos1, 3 cos.1 − 4 sin.1, 3 sin.1 + 4 cos.1)
  check_close(x, std::array<double, 4>{-1.1426397, 1.9220756, 2.5856788, 4.2795169}, 1e-6);

  x = {1, 2, 3, 4};
  cpu_rope(x.data(), c, RopePairing::half_split, 1);
  // (1 cos1 − 3 sin1, 2 cos.1 − 4 sin.1, 1 sin1 + 3 cos1, 2 sin.1 + 4 cos.1)
  check_close(x, std::array<double, 4>{-1.9841106, 1.5906747, 2.4623779, 4.1796835}, 1e-6);
}

TEST_CASE("CPU RoPE: linear scaling and frequency factors") {
  // Position 3, linear factor 2, factors {1, 2}: angles 3·1/1/2 = 1.5 and 3·0.1/2/2 = 0.075.
  const float factors[2] = {1.0f, 2.0f};
  RopeFrequencyConfig c = frequencies(4, 100.0);
  c.scaling = RopeScaling::linear;
  c.factor = 2.0;
  c.freq_factors = factors;
  std::array<float, 4> x{1, 2, 3, 4};
  cpu_rope(x.data(), c, RopePairing::interleaved, 3);
  check_close(x, std::array<double, 4>{-1.9242528, 1.1389694, 2.6918476, 4.2135444}, 1e-6);
}

TEST_CASE("CPU RoPE at position 0 is the identity; at 37 it is the rotation of its definition") {
  for (RopePairing pairing : {RopePairing::interleaved, RopePairing::half_split}) {
    const RopeFrequencyConfig c = frequencies(16, 10000.0);
    const std::vector<float> original = ramp(16);
    std::vector<float> x = original;
    cpu_rope(x.data(), c, pairing, 0);
    CHECK(x == original);

    x = original;
    cpu_rope(x.data(), c, pairing, 37);
    for (std::int64_t i = 0; i < 8; ++i) {
      const std::int64_t a = pairing == RopePairing::interleaved ? 2 * i : i;
      const std::int64_t b = pairing == RopePairing::interleaved ? 2 * i + 1 : i + 8;
      const double angle = 37.0 * std::pow(10000.0, -2.0 * static_cast<double>(i) / 16.0);
      const double xa = original[static_cast<std::size_t>(a)];
      const double xb = original[static_cast<std::size_t>(b)];
      CHECK(std::fabs(x[static_cast<std::size_t>(a)] - (xa * std::cos(angle) - xb * std::sin(angle))) <= 1e-6);
      CHECK(std::fabs(x[static_cast<std::size_t>(b)] - (xa * std::sin(angle) + xb * std::cos(angle))) <= 1e-6);
    }
  }
}

TEST_CASE("CPU RoPE: the inverse undoes it; a shift p -> p + delta equals RoPE at p + delta") {
  for (RopePairing pairing : {RopePairing::interleaved, RopePairing::half_split}) {
    CAPTURE(static_cast<int>(pairing));
    const RopeFrequencyConfig c = frequencies(64, 100000.0);
    for (std::int64_t pos : {std::int64_t{1}, std::int64_t{17}, std::int64_t{511}, std::int64_t{5500}}) {
      CAPTURE(pos);
      const std::vector<float> original = ramp(64);
      std::vector<float> x = original;
      cpu_rope(x.data(), c, pairing, static_cast<double>(pos));
      cpu_rope(x.data(), c, pairing, -static_cast<double>(pos));
      CHECK(max_abs_diff(x, original) <= 2e-6);  // two float rotations of values <= 2 in magnitude

      for (std::int64_t delta : {std::int64_t{-1}, std::int64_t{1}, std::int64_t{300}, -pos}) {
        CAPTURE(delta);
        std::vector<float> shifted = original;
        cpu_rope(shifted.data(), c, pairing, static_cast<double>(pos));
        cpu_rope(shifted.data(), c, pairing, static_cast<double>(delta));  // CpuLlama::rope_shift's rotation
        std::vector<float> direct = original;
        cpu_rope(direct.data(), c, pairing, static_cast<double>(pos + delta));
        CHECK(max_abs_diff(shifted, direct) <= 2e-6);
      }
    }
  }
}

TEST_CASE("interleaved pairing on GGUF-permuted vectors equals half-split pairing on HF vectors") {
  // The HF->GGUF converter reorders each head so that GGUF element 2i is HF element i and GGUF element
  // 2i+1 is HF element i + d/2; RoPE must then commute with that reordering.
  const std::int64_t d = 8;
  const std::vector<float> hf = ramp(d);
  std::vector<float> gguf(static_cast<std::size_t>(d));
  for (std::int64_t i = 0; i < d / 2; ++i) {
    gguf[static_cast<std::size_t>(2 * i)] = hf[static_cast<std::size_t>(i)];
    gguf[static_cast<std::size_t>(2 * i + 1)] = hf[static_cast<std::size_t>(i + d / 2)];
  }
  std::vector<float> a = hf;
  cpu_rope(a.data(), frequencies(d, 10000.0), RopePairing::half_split, 9);
  std::vector<float> b = gguf;
  cpu_rope(b.data(), frequencies(d, 10000.0), RopePairing::interleaved, 9);
  for (std::int64_t i = 0; i < d / 2; ++i) {
    CHECK(b[static_cast<std::size_t>(2 * i)] == a[static_cast<std::size_t>(i)]);
    CHECK(b[static_cast<std::size_t>(2 * i + 1)] == a[static_cast<std::size_t>(i + d / 2)]);
  }
}

}  // namespace unit_rope
