// detail/rope.hpp: RoPE apply / inverse / shift, both pairings, against hand-computed rotations.
#include <doctest/doctest.h>

#include <array>
#include <cmath>
#include <cstdint>
#include <vector>

#include "kvfuse/detail/rope.hpp"

using kvfuse::detail::RopePairing;
using kvfuse::detail::RopeParams;

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

double max_abs_diff(const std::vector<float>& a, const std::vector<float>& b) {
  double m = 0;
  for (std::size_t i = 0; i < a.size(); ++i) m = std::max(m, std::fabs(static_cast<double>(a[i]) - b[i]));
  return m;
}

}  // namespace

TEST_CASE("rope_theta: base^(-2i/d), divided by the frequency factor") {
  RopeParams p{8, 10000.0, 1.0, nullptr, RopePairing::interleaved};
  CHECK(kvfuse::detail::rope_theta(p, 0) == doctest::Approx(1.0));
  CHECK(kvfuse::detail::rope_theta(p, 1) == doctest::Approx(0.1));
  CHECK(kvfuse::detail::rope_theta(p, 2) == doctest::Approx(0.01));
  CHECK(kvfuse::detail::rope_theta(p, 3) == doctest::Approx(0.001));
  const float factors[4] = {1.0f, 2.0f, 4.0f, 8.0f};
  p.freq_factors = factors;
  CHECK(kvfuse::detail::rope_theta(p, 1) == doctest::Approx(0.05));
  CHECK(kvfuse::detail::rope_theta(p, 3) == doctest::Approx(0.000125));
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

TEST_CASE("rope_apply: interleaved pairs (x0,x1),(x2,x3), half-split pairs (x0,x2),(x1,x3)") {
  // d = 4, base 100: θ0 = 1, θ1 = 100^(-1/2) = 0.1; at position 1 the pairs turn by 1 and 0.1 rad.
  // Expected values: cos 1 = 0.5403023, sin 1 = 0.8414710, cos 0.1 = 0.9950042, sin 0.1 = 0.0998334.
  RopeParams p{4, 100.0, 1.0, nullptr, RopePairing::interleaved};
  std::array<float, 4> x{1, 2, 3, 4};
  kvfuse::detail::rope_apply(x.data(), p, 1);
  // (1 cos1 − 2 sin1, 1 sin1 + 2 cos1, 3 cos.1 − 4 sin.1, 3 sin.1 + 4 cos.1)
  check_close(x, std::array<double, 4>{-1.1426397, 1.9220756, 2.5856788, 4.2795169}, 1e-6);

  p.pairing = RopePairing::half_split;
  x = {1, 2, 3, 4};
  kvfuse::detail::rope_apply(x.data(), p, 1);
  // (1 cos1 − 3 sin1, 2 cos.1 − 4 sin.1, 1 sin1 + 3 cos1, 2 sin.1 + 4 cos.1)
  check_close(x, std::array<double, 4>{-1.9841106, 1.5906747, 2.4623779, 4.1796835}, 1e-6);
}

TEST_CASE("rope_apply: linear position scale and frequency factors") {
  // Position 3, scale 0.5, factors {1, 2}: angles 0.5·3·1/1 = 1.5 and 0.5·3·0.1/2 = 0.075.
  const float factors[2] = {1.0f, 2.0f};
  RopeParams p{4, 100.0, 0.5, factors, RopePairing::interleaved};
  std::array<float, 4> x{1, 2, 3, 4};
  kvfuse::detail::rope_apply(x.data(), p, 3);
  check_close(x, std::array<double, 4>{-1.9242528, 1.1389694, 2.6918476, 4.2135444}, 1e-6);
}

TEST_CASE("rope_apply at position 0 is the identity; the table form equals the on-the-fly form") {
  for (RopePairing pairing : {RopePairing::interleaved, RopePairing::half_split}) {
    RopeParams p{16, 10000.0, 1.0, nullptr, pairing};
    std::vector<float> x = ramp(16);
    const std::vector<float> original = x;
    kvfuse::detail::rope_apply(x.data(), p, 0);
    CHECK(x == original);

    std::vector<float> cos_t(8), sin_t(8);
    kvfuse::detail::rope_cos_sin(p, 37.0, cos_t.data(), sin_t.data());
    std::vector<float> y = original;
    kvfuse::detail::rope_rotate_head(y.data(), 16, pairing, cos_t.data(), sin_t.data());
    x = original;
    kvfuse::detail::rope_apply(x.data(), p, 37);
    CHECK(x == y);
  }
}

TEST_CASE("rope_inverse undoes rope_apply; rope_shift(p -> p + delta) equals rope_apply at p + delta") {
  for (RopePairing pairing : {RopePairing::interleaved, RopePairing::half_split}) {
    CAPTURE(static_cast<int>(pairing));
    RopeParams p{64, 100000.0, 1.0, nullptr, pairing};
    for (std::int64_t pos : {std::int64_t{1}, std::int64_t{17}, std::int64_t{511}, std::int64_t{5500}}) {
      CAPTURE(pos);
      const std::vector<float> original = ramp(64);
      std::vector<float> x = original;
      kvfuse::detail::rope_apply(x.data(), p, pos);
      kvfuse::detail::rope_inverse(x.data(), p, pos);
      CHECK(max_abs_diff(x, original) <= 2e-6);  // two float rotations of values <= 2 in magnitude

      for (std::int64_t delta : {std::int64_t{-1}, std::int64_t{1}, std::int64_t{300}, -pos}) {
        CAPTURE(delta);
        std::vector<float> shifted = original;
        kvfuse::detail::rope_apply(shifted.data(), p, pos);
        kvfuse::detail::rope_shift(shifted.data(), p, pos, pos + delta);
        std::vector<float> direct = original;
        kvfuse::detail::rope_apply(direct.data(), p, pos + delta);
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
  kvfuse::detail::rope_apply(a.data(), RopeParams{d, 10000.0, 1.0, nullptr, RopePairing::half_split}, 9);
  std::vector<float> b = gguf;
  kvfuse::detail::rope_apply(b.data(), RopeParams{d, 10000.0, 1.0, nullptr, RopePairing::interleaved}, 9);
  for (std::int64_t i = 0; i < d / 2; ++i) {
    CHECK(b[static_cast<std::size_t>(2 * i)] == a[static_cast<std::size_t>(i)]);
    CHECK(b[static_cast<std::size_t>(2 * i + 1)] == a[static_cast<std::size_t>(i + d / 2)]);
  }
}
