// harness/ref/rope.hpp: the CPU references of the RoPE kernels (fp32 angles) and their validation. Expected values
// come from a double-precision loop written here (its own pairing and rotation formula, angle p·θ_f in
// double), the Llama 3.1 table from Meta's apply_scaling written out here; round trip and shift properties
// are checked at positions up to 131072, and every refusal for its status and a message naming the value.
#include "kvfuse/harness/ref/rope.hpp"

#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "../support/rope_test_util.hpp"
#include "../support/test_util.hpp"

// Each unit test file lives in its own namespace: the files are compiled together (a unity build).
namespace unit_rope_kernels_ref {

using kvfuse::DType;
using kvfuse::Status;
using kvfuse::RopePairing;
using kvfuse::RopeArgs;
using kvfuse::RopeFrequencyConfig;
using kvfuse::RopeOp;
using kvfuse::RopeScaling;
using kvfuse::RopeStrides;
using kvfuse::test::AlignedBuffer;
using kvfuse::test::Layout;
using kvfuse::test::load;
using kvfuse::test::offset;
using kvfuse::test::padded_strides;
using kvfuse::test::run_ref;
using kvfuse::test::storage_ulp;
using kvfuse::test::store;
using kvfuse_test::message_has;

namespace {

constexpr DType all_dtypes[] = {DType::f32, DType::f16, DType::bf16};
constexpr RopePairing all_pairings[] = {RopePairing::interleaved, RopePairing::half_split};
constexpr std::int64_t all_head_dims[] = {64, 128, 256};
constexpr std::uint8_t sentinel = 0xA5;  // bytes outside every view

// Bytes of the element (l, t, h, e) set in `mask`.
void mark_view(std::vector<bool>& mask, const RopeArgs& a, const RopeStrides& s) {
  const int size = kvfuse::dtype_size(a.dtype);
  for (std::int64_t l = 0; l < a.num_layers; ++l)
    for (std::int64_t t = 0; t < a.num_tokens; ++t)
      for (std::int64_t h = 0; h < a.num_heads; ++h)
        for (std::int64_t e = 0; e < a.head_dim; ++e)
          for (int b = 0; b < size; ++b)
            mask[static_cast<std::size_t>((offset(s, l, t, h) + e) * size + b)] = true;
}

// The angle multiplier of token t under op, written independently of the library.
double op_position(RopeOp op, const std::vector<std::int32_t>& from, const std::vector<std::int32_t>& to,
                   std::int64_t t) {
  const auto i = static_cast<std::size_t>(t);
  if (op == RopeOp::apply) return from[i];
  if (op == RopeOp::inverse) return -static_cast<double>(from[i]);
  return static_cast<double>(to[i]) - static_cast<double>(from[i]);
}

// Expected value of element e of a head vector x (double) after rotation by angle q·θ_f: the partner of e
// and the sign of its sine term, from the pairing's definition.
double expected_element(const std::vector<double>& x, std::int64_t e, RopePairing pairing, const float* theta,
                        double q, double& pair_magnitude) {
  const auto d = static_cast<std::int64_t>(x.size());
  std::int64_t pair = 0;
  std::int64_t partner = 0;
  bool first = false;
  if (pairing == RopePairing::interleaved) {
    pair = e / 2;
    first = e % 2 == 0;
    partner = first ? e + 1 : e - 1;
  } else {
    pair = e % (d / 2);
    first = e < d / 2;
    partner = first ? e + d / 2 : e - d / 2;
  }
  const double angle = q * static_cast<double>(theta[pair]);
  const double c = std::cos(angle);
  const double s = std::sin(angle);
  const double xe = x[static_cast<std::size_t>(e)];
  const double xp = x[static_cast<std::size_t>(partner)];
  pair_magnitude = std::hypot(xe, xp);
  return first ? xe * c - xp * s : xp * s + xe * c;
}

void fill_theta(RopeArgs& a, double base) {
  RopeFrequencyConfig c;
  c.head_dim = a.head_dim;
  c.base = base;
  REQUIRE(kvfuse::rope_frequencies(c, a.theta) == Status::success);
}

}  // namespace

TEST_CASE("rope refs: every dtype x pairing x head_dim x NHD/HND x in/out of place x layers, vs a double loop") {
  std::mt19937 rng(20261121);
  std::uniform_real_distribution<float> value(-2.0f, 2.0f);
  std::uniform_int_distribution<std::int32_t> position(0, 131072);
  const std::int64_t n = 5;
  const std::int64_t heads = 3;
  int cases = 0;
  for (DType dtype : all_dtypes)
    for (RopePairing pairing : all_pairings)
      for (std::int64_t d : all_head_dims)
        for (Layout layout : {Layout::nhd, Layout::hnd})
          for (bool in_place : {true, false})
            for (std::int64_t layers : {std::int64_t{1}, std::int64_t{3}})
              for (RopeOp op : {RopeOp::apply, RopeOp::inverse, RopeOp::shift}) {
                CAPTURE(std::string(kvfuse::dtype_name(dtype)));
                CAPTURE(static_cast<int>(pairing));
                CAPTURE(d);
                CAPTURE(layout == Layout::nhd ? "NHD" : "HND");
                CAPTURE(in_place);
                CAPTURE(layers);
                CAPTURE(std::string(kvfuse::rope_op_name(op)));
                RopeArgs a;
                a.dtype = dtype;
                a.pairing = pairing;
                a.head_dim = d;
                a.num_tokens = n;
                a.num_heads = heads;
                a.num_layers = layers;
                fill_theta(a, 10000.0);
                const int size = kvfuse::dtype_size(dtype);
                a.in_strides = padded_strides(layout, dtype, n, heads, d);
                // Out of place writes the other layout: input and output strides are independent.
                a.out_strides = in_place ? a.in_strides
                                         : padded_strides(layout == Layout::nhd ? Layout::hnd : Layout::nhd, dtype,
                                                          n, heads, d);
                const auto in_bytes = static_cast<std::size_t>(layers * a.in_strides.layer * size);
                const auto out_bytes = static_cast<std::size_t>(layers * a.out_strides.layer * size);
                AlignedBuffer in(in_bytes, sentinel);
                AlignedBuffer out(out_bytes, sentinel);
                a.in = in.data();
                a.out = in_place ? in.data() : out.data();

                std::vector<std::int32_t> from(static_cast<std::size_t>(n)), to(static_cast<std::size_t>(n));
                for (std::int64_t t = 0; t < n; ++t) {
                  from[static_cast<std::size_t>(t)] = t == 0 ? 131072 : position(rng);
                  to[static_cast<std::size_t>(t)] = t == 1 ? 0 : position(rng);
                }
                a.positions = from.data();
                if (op == RopeOp::shift) a.new_positions = to.data();

                for (std::int64_t l = 0; l < layers; ++l)
                  for (std::int64_t t = 0; t < n; ++t)
                    for (std::int64_t h = 0; h < heads; ++h)
                      for (std::int64_t e = 0; e < d; ++e) store(dtype, in.data(), offset(a.in_strides, l, t, h) + e, value(rng));
                const std::vector<std::uint8_t> in_before(in.bytes(), in.bytes() + in.size());

                REQUIRE(run_ref(op, a) == Status::success);

                double worst = 0;  // largest error over its tolerance
                std::vector<double> x(static_cast<std::size_t>(d));
                for (std::int64_t l = 0; l < layers; ++l)
                  for (std::int64_t t = 0; t < n; ++t) {
                    const double q = op_position(op, from, to, t);
                    for (std::int64_t h = 0; h < heads; ++h) {
                      for (std::int64_t e = 0; e < d; ++e)
                        x[static_cast<std::size_t>(e)] =
                            load(dtype, in_before.data(), offset(a.in_strides, l, t, h) + e);
                      for (std::int64_t e = 0; e < d; ++e) {
                        double magnitude = 0;
                        const double expect = expected_element(x, e, pairing, a.theta, q, magnitude);
                        const double got = load(dtype, a.out, offset(a.out_strides, l, t, h) + e);
                        // fp32 math: angle within ~3e-7 rad, products rounded; then one storage rounding.
                        const double math = 1e-6 * magnitude;
                        const double tolerance = math + 0.5 * storage_ulp(dtype, std::fabs(expect) + math);
                        worst = std::max(worst, std::fabs(got - expect) / tolerance);
                      }
                    }
                  }
                CHECK(worst <= 1.0);

                // Nothing outside the output view changed; out of place, the input is untouched.
                std::vector<bool> mask(in_place ? in_bytes : out_bytes, false);
                mark_view(mask, a, a.out_strides);
                const std::uint8_t* written = in_place ? in.bytes() : out.bytes();
                std::size_t stray = 0;
                for (std::size_t b = 0; b < mask.size(); ++b)
                  if (!mask[b] && written[b] != sentinel) ++stray;
                CHECK(stray == 0);
                if (!in_place) CHECK(std::memcmp(in.bytes(), in_before.data(), in_bytes) == 0);
                ++cases;
              }
  CHECK(cases == 3 * 2 * 3 * 2 * 2 * 2 * 3);
}

namespace {

// Round trip and shift at positions up to 131072 on [tokens][heads][d] (NHD, tight): the largest
// elementwise |error| over its bound, which is one storage ulp of the pair's magnitude for f16 / bf16 and
// 1e-6 of the pair's magnitude for f32 (a few fp32 ulps: each rotation's angle is good to ~2.4e-7 rad).
struct PropertyErrors {
  double round_trip = 0;
  double shift = 0;
};

PropertyErrors property_errors(DType dtype, RopePairing pairing, std::int64_t d, std::mt19937& rng) {
  const std::int64_t n = 48;
  const std::int64_t heads = 4;
  const int size = kvfuse::dtype_size(dtype);
  RopeArgs a;
  a.dtype = dtype;
  a.pairing = pairing;
  a.head_dim = d;
  a.num_tokens = n;
  a.num_heads = heads;
  a.in_strides = a.out_strides = kvfuse::rope_nhd_strides(n, heads, d);
  fill_theta(a, 500000.0);
  const auto count = static_cast<std::size_t>(n * heads * d);
  AlignedBuffer original(count * static_cast<std::size_t>(size), sentinel);
  std::uniform_real_distribution<float> value(-4.0f, 4.0f);
  for (std::size_t i = 0; i < count; ++i) store(dtype, original.data(), static_cast<std::int64_t>(i), value(rng));
  std::uniform_int_distribution<std::int32_t> position(0, 131072);
  std::vector<std::int32_t> old_pos(static_cast<std::size_t>(n)), new_pos(static_cast<std::size_t>(n));
  for (std::size_t t = 0; t < old_pos.size(); ++t) {
    old_pos[t] = t == 0 ? 131072 : (t == 1 ? 131071 : position(rng));
    new_pos[t] = t == 0 ? 0 : (t == 2 ? 131072 : position(rng));
  }

  // Largest |got − want| over the bound at the pair magnitude of `want`.
  const auto worst = [&](const void* got, const void* want) {
    double w = 0;
    for (std::int64_t row = 0; row < n * heads; ++row)
      for (std::int64_t i = 0; i < d / 2; ++i) {
        std::int64_t first = 0;
        std::int64_t second = 0;
        kvfuse::detail::rope_pair(pairing, d, i, first, second);
        const double a0 = load(dtype, want, row * d + first);
        const double b0 = load(dtype, want, row * d + second);
        const double magnitude = std::hypot(a0, b0);
        const double ulp = dtype == DType::f32 ? 1e-6 * magnitude : storage_ulp(dtype, magnitude);
        w = std::max(w, std::fabs(load(dtype, got, row * d + first) - a0) / ulp);
        w = std::max(w, std::fabs(load(dtype, got, row * d + second) - b0) / ulp);
      }
    return w;
  };

  PropertyErrors errors;
  AlignedBuffer x(count * static_cast<std::size_t>(size), sentinel);
  std::memcpy(x.data(), original.data(), x.size());
  a.in = a.out = x.data();
  a.positions = old_pos.data();
  REQUIRE(kvfuse::ref::rope_apply(a) == Status::success);
  REQUIRE(kvfuse::ref::rope_inverse(a) == Status::success);
  errors.round_trip = worst(x.data(), original.data());

  std::memcpy(x.data(), original.data(), x.size());
  REQUIRE(kvfuse::ref::rope_apply(a) == Status::success);  // at the old positions
  a.new_positions = new_pos.data();
  REQUIRE(kvfuse::ref::rope_shift(a) == Status::success);  // old -> new in one rotation
  a.new_positions = nullptr;
  AlignedBuffer direct(count * static_cast<std::size_t>(size), sentinel);
  std::memcpy(direct.data(), original.data(), direct.size());
  a.in = a.out = direct.data();
  a.positions = new_pos.data();
  REQUIRE(kvfuse::ref::rope_apply(a) == Status::success);  // straight at the new positions
  errors.shift = worst(x.data(), direct.data());
  return errors;
}

}  // namespace

TEST_CASE("rope refs: apply-then-inverse and shift-vs-apply-at-new within one bf16/f16 ulp (f32: 1e-6) up to 131072") {
  std::mt19937 rng(7);
  for (DType dtype : all_dtypes)
    for (RopePairing pairing : all_pairings)
      for (std::int64_t d : all_head_dims) {
        CAPTURE(std::string(kvfuse::dtype_name(dtype)));
        CAPTURE(static_cast<int>(pairing));
        CAPTURE(d);
        const PropertyErrors e = property_errors(dtype, pairing, d, rng);
        CHECK(e.round_trip <= 1.0);
        CHECK(e.shift <= 1.0);
      }
}

TEST_CASE("rope refs: the fp32-angle reference agrees with the CPU backend's double-angle RoPE at small positions") {
  // The two differ by the float rounding of θ (angle error <= p·θ·2^-24) plus float rounding of the rotation.
  // The CPU backend's RoPE: the double table, detail::rope_cos_sin and rope_rotate_head (as CpuLlama runs it).
  std::mt19937 rng(11);
  std::uniform_real_distribution<float> value(-1.0f, 1.0f);
  for (RopePairing pairing : all_pairings)
    for (std::int64_t d : all_head_dims) {
      CAPTURE(static_cast<int>(pairing));
      CAPTURE(d);
      const std::int64_t n = 32;  // positions 0 .. 31
      RopeArgs a;
      a.dtype = DType::f32;
      a.pairing = pairing;
      a.head_dim = d;
      a.num_tokens = n;
      a.num_heads = 1;
      a.in_strides = a.out_strides = kvfuse::rope_nhd_strides(n, 1, d);
      fill_theta(a, 10000.0);
      std::vector<std::int32_t> positions(static_cast<std::size_t>(n));
      for (std::int64_t t = 0; t < n; ++t) positions[static_cast<std::size_t>(t)] = static_cast<std::int32_t>(t);
      a.positions = positions.data();
      AlignedBuffer x(static_cast<std::size_t>(n * d) * 4, sentinel);
      auto* xf = static_cast<float*>(x.data());
      for (std::int64_t i = 0; i < n * d; ++i) xf[i] = value(rng);
      std::vector<float> y(xf, xf + n * d);
      a.in = a.out = x.data();
      REQUIRE(kvfuse::ref::rope_apply(a) == Status::success);
      RopeFrequencyConfig frequencies;
      frequencies.head_dim = d;
      frequencies.base = 10000.0;
      std::vector<double> table(static_cast<std::size_t>(d / 2));
      REQUIRE(kvfuse::rope_frequencies(frequencies, table.data()) == Status::success);
      std::vector<float> cos_t(table.size()), sin_t(table.size());
      double worst = 0;
      for (std::int64_t t = 0; t < n; ++t) {
        float* row = y.data() + t * d;
        std::vector<float> before(row, row + d);
        kvfuse::detail::rope_cos_sin(table.data(), d / 2, static_cast<double>(t), cos_t.data(), sin_t.data());
        kvfuse::detail::rope_rotate_head(row, d, pairing, cos_t.data(), sin_t.data());
        for (std::int64_t i = 0; i < d / 2; ++i) {
          std::int64_t first = 0;
          std::int64_t second = 0;
          kvfuse::detail::rope_pair(pairing, d, i, first, second);
          const double magnitude = std::hypot(static_cast<double>(before[static_cast<std::size_t>(first)]),
                                              static_cast<double>(before[static_cast<std::size_t>(second)]));
          const double theta = std::pow(10000.0, -2.0 * static_cast<double>(i) / static_cast<double>(d));
          const double bound = (static_cast<double>(t) * theta * 0x1p-24 + 1e-6) * magnitude;
          for (std::int64_t e : {first, second})
            worst = std::max(worst, std::fabs(static_cast<double>(xf[t * d + e]) - row[e]) / bound);
        }
      }
      CHECK(worst <= 1.0);
    }
}

TEST_CASE("rope_frequencies: default, linear and Llama 3.1 tables vs the published formulas") {
  float theta[kvfuse::rope_max_pairs];
  RopeFrequencyConfig c;
  c.head_dim = 128;
  c.base = 500000.0;
  REQUIRE(kvfuse::rope_frequencies(c, theta) == Status::success);
  for (int i = 0; i < 64; ++i) {
    CAPTURE(i);
    const double want = std::exp(-static_cast<double>(i) / 64.0 * std::log(500000.0));
    CHECK(std::fabs(theta[i] - want) <= 0x1p-24 * want);
  }
  c.scaling = RopeScaling::linear;
  c.factor = 4.0;
  REQUIRE(kvfuse::rope_frequencies(c, theta) == Status::success);
  for (int i = 0; i < 64; ++i) {
    const double want = std::exp(-static_cast<double>(i) / 64.0 * std::log(500000.0)) / 4.0;
    CHECK(std::fabs(theta[i] - want) <= 0x1p-24 * want);
  }

  // Llama 3.1 8B: rope_theta 500000, factor 8, low_freq_factor 1, high_freq_factor 4, original 8192.
  // Meta's apply_scaling (llama/model.py), written out: wavelen = 2π / freq; wavelen < 8192/4 keeps freq,
  // wavelen > 8192/1 divides it by 8, in between smooth = (8192 / wavelen − 1) / (4 − 1) blends
  // (1 − smooth)·freq/8 + smooth·freq.
  c.scaling = RopeScaling::llama3;
  c.factor = 8.0;
  c.low_freq_factor = 1.0;
  c.high_freq_factor = 4.0;
  c.original_max_position = 8192.0;
  REQUIRE(kvfuse::rope_frequencies(c, theta) == Status::success);
  int kept = 0, divided = 0, blended = 0;
  for (int i = 0; i < 64; ++i) {
    CAPTURE(i);
    const double freq = 1.0 / std::pow(500000.0, static_cast<double>(2 * i) / 128.0);
    const double wavelen = 2.0 * M_PI / freq;
    double want = 0;
    if (wavelen < 8192.0 / 4.0) {
      want = freq;
      ++kept;
    } else if (wavelen > 8192.0 / 1.0) {
      want = freq / 8.0;
      ++divided;
    } else {
      const double smooth = (8192.0 / wavelen - 1.0) / (4.0 - 1.0);
      want = (1 - smooth) * freq / 8.0 + smooth * freq;
      ++blended;
      CHECK(theta[i] < freq);
      CHECK(theta[i] > freq / 8.0);
    }
    CHECK(std::fabs(theta[i] - want) <= 0x1p-24 * want);
  }
  // Pairs 0..28 keep their frequency, 29..34 are blended, 35..63 are divided by 8.
  CHECK(kept == 29);
  CHECK(blended == 6);
  CHECK(divided == 29);
  CHECK(theta[0] == 1.0f);
  CHECK(theta[63] == static_cast<float>(std::pow(500000.0, -126.0 / 128.0) / 8.0));

  RopeScaling s = RopeScaling::none;
  CHECK(kvfuse::rope_scaling_from_name("llama3", s) == Status::success);
  CHECK(s == RopeScaling::llama3);
  CHECK(kvfuse::rope_scaling_from_name("linear", s) == Status::success);
  CHECK(s == RopeScaling::linear);
  CHECK(kvfuse::rope_scaling_from_name("default", s) == Status::success);
  CHECK(s == RopeScaling::none);
}

TEST_CASE("rope refs: a fused QKV row rotates Q and K in one call and leaves V alone") {
  // [tokens][Hq + 2·Hkv][d] with num_heads = Hq + Hkv: heads 0..Hq+Hkv−1 rotate, the V heads stay as they are.
  const std::int64_t n = 3, hq = 4, hkv = 2, d = 64;
  const std::int64_t row = (hq + 2 * hkv) * d;
  RopeArgs a;
  a.dtype = DType::f32;
  a.pairing = RopePairing::half_split;
  a.head_dim = d;
  a.num_tokens = n;
  a.num_heads = hq + hkv;
  a.in_strides = a.out_strides = RopeStrides{row, d, 0};
  fill_theta(a, 10000.0);
  AlignedBuffer qkv(static_cast<std::size_t>(n * row) * 4, sentinel);
  auto* x = static_cast<float*>(qkv.data());
  for (std::int64_t i = 0; i < n * row; ++i) x[i] = static_cast<float>(i % 17) * 0.125f - 1.0f;
  const std::vector<float> before(x, x + n * row);
  const std::int32_t positions[] = {5, 1000, 77};
  a.positions = positions;
  a.in = a.out = qkv.data();
  REQUIRE(kvfuse::ref::rope_apply(a) == Status::success);
  for (std::int64_t t = 0; t < n; ++t)
    for (std::int64_t h = 0; h < hq + 2 * hkv; ++h) {
      std::vector<double> head(before.begin() + t * row + h * d, before.begin() + t * row + (h + 1) * d);
      for (std::int64_t e = 0; e < d; ++e) {
        double magnitude = 0;
        const double want =
            h < hq + hkv ? expected_element(head, e, a.pairing, a.theta, positions[t], magnitude) : head[e];
        CHECK(std::fabs(x[t * row + h * d + e] - want) <= 1e-6 * std::max(1.0, magnitude));
      }
    }
}

namespace {

// A valid in-place bf16 NHD call on `buffer` (n tokens, 2 heads, d 128) to break one field at a time.
RopeArgs valid_args(AlignedBuffer& buffer, const std::int32_t* positions, std::int64_t n) {
  RopeArgs a;
  a.dtype = DType::bf16;
  a.pairing = RopePairing::interleaved;
  a.head_dim = 128;
  a.num_tokens = n;
  a.num_heads = 2;
  a.in_strides = a.out_strides = kvfuse::rope_nhd_strides(n, 2, 128);
  a.in = a.out = buffer.data();
  a.positions = positions;
  fill_theta(a, 10000.0);
  return a;
}

// Runs every op on `a` and checks that each refuses with `status`, names `needle`, and writes nothing.
void check_refused(const RopeArgs& a, Status status, const std::string& needle, const AlignedBuffer& buffer,
                   bool shift_only = false) {
  const std::vector<std::uint8_t> before(buffer.bytes(), buffer.bytes() + buffer.size());
  for (RopeOp op : {RopeOp::apply, RopeOp::inverse, RopeOp::shift}) {
    if (shift_only && op != RopeOp::shift) continue;
    CAPTURE(std::string(kvfuse::rope_op_name(op)));
    RopeArgs b = a;
    if (op == RopeOp::shift && b.new_positions == nullptr) b.new_positions = b.positions;
    if (op != RopeOp::shift) b.new_positions = nullptr;
    CHECK(run_ref(op, b) == status);
    CHECK(message_has(needle));
    CHECK(std::memcmp(buffer.bytes(), before.data(), buffer.size()) == 0);
  }
}

}  // namespace

TEST_CASE("rope refs: refusals name the bad value and write nothing") {
  const std::int64_t n = 4;
  AlignedBuffer buffer(static_cast<std::size_t>(n * 2 * 128 * 2 + 64), sentinel);
  std::int32_t positions[] = {0, 1, 2, 3};
  const RopeArgs good = valid_args(buffer, positions, n);
  REQUIRE(kvfuse::ref::rope_apply(good) == Status::success);

  RopeArgs a = good;
  a.head_dim = 63;
  check_refused(a, Status::invalid_argument, "63", buffer);
  a.head_dim = 96;
  check_refused(a, Status::unsupported, "96", buffer);
  a = good;
  a.dtype = static_cast<DType>(9);
  check_refused(a, Status::unsupported, "9", buffer);
  a = good;
  a.pairing = static_cast<RopePairing>(5);
  check_refused(a, Status::unsupported, "pairing 5", buffer);
  a = good;
  a.num_tokens = -3;
  check_refused(a, Status::invalid_argument, "-3", buffer);
  a = good;
  a.in = nullptr;
  check_refused(a, Status::invalid_argument, "in pointer is null", buffer);
  a = good;
  a.out = nullptr;
  check_refused(a, Status::invalid_argument, "out pointer is null", buffer);
  a = good;
  a.positions = nullptr;
  check_refused(a, Status::invalid_argument, "positions pointer is null", buffer);
  a = good;
  a.in = a.out = static_cast<kvfuse::bf16*>(buffer.data()) + 1;  // 2 bytes off a 16-byte boundary
  check_refused(a, Status::invalid_argument, "not 16-byte aligned", buffer);
  a = good;
  a.in_strides.token = a.out_strides.token = 2 * 128 + 4;  // 520 bytes
  check_refused(a, Status::invalid_argument, "260", buffer);
  a = good;
  a.in_strides.token = a.out_strides.token = 128;  // token rows overlap the second head
  check_refused(a, Status::invalid_argument, "overlap", buffer);
  a = good;
  a.in_strides.head = a.out_strides.head = 64;  // heads closer than head_dim
  check_refused(a, Status::invalid_argument, "head stride 64", buffer);
  a = good;
  a.out_strides = kvfuse::rope_hnd_strides(n, 2, 128);  // in place with other strides
  check_refused(a, Status::invalid_argument, "in place", buffer);
  a = good;
  a.out = static_cast<kvfuse::bf16*>(buffer.data()) + 8;  // out of place, overlapping
  check_refused(a, Status::invalid_argument, "overlaps", buffer);
  a = good;
  a.theta[5] = 0.0f;
  check_refused(a, Status::invalid_argument, "theta[5]", buffer);
  a = good;
  positions[2] = 1 << 24;
  check_refused(a, Status::invalid_argument, "16777216", buffer);
  positions[2] = -(1 << 24);
  check_refused(a, Status::invalid_argument, "-16777216", buffer);
  positions[2] = 2;

  // Shift: new_positions null, |new|, |new − old| out of range; apply / inverse refuse new_positions.
  std::int32_t far[] = {0, 1, 2, 3};
  a = good;
  a.new_positions = far;
  CHECK(kvfuse::ref::rope_apply(a) == Status::invalid_argument);
  CHECK(message_has("new_positions must be null"));
  positions[1] = -(1 << 23);
  far[1] = (1 << 23) + 5;
  check_refused(a, Status::invalid_argument, "16777221", buffer, true);
  positions[1] = 1;
  far[1] = 1;
  a.new_positions = nullptr;
  CHECK(kvfuse::ref::rope_shift(a) == Status::invalid_argument);
  CHECK(message_has("new_positions pointer is null"));

  // Nothing to do is success, whatever the pointers.
  a = good;
  a.num_tokens = 0;
  a.in = a.out = nullptr;
  a.positions = nullptr;
  CHECK(kvfuse::ref::rope_apply(a) == Status::success);
  a = good;
  a.num_layers = 0;
  CHECK(kvfuse::ref::rope_inverse(a) == Status::success);
}

TEST_CASE("rope_frequencies: partial rotary, unknown scaling and bad values are refused, naming them") {
  float theta[kvfuse::rope_max_pairs];
  for (float& t : theta) t = -1.0f;
  const auto refused = [&](const RopeFrequencyConfig& c, Status status, const std::string& needle) {
    CHECK(kvfuse::rope_frequencies(c, theta) == status);
    CHECK(message_has(needle));
    CHECK(theta[0] == -1.0f);  // nothing written
  };
  RopeFrequencyConfig c;
  c.head_dim = 128;
  c.rotary_dim = 64;
  refused(c, Status::unsupported, "rotary_dim 64");
  c.rotary_dim = 0;
  c.head_dim = 80;
  refused(c, Status::unsupported, "80");
  c.head_dim = 7;
  refused(c, Status::invalid_argument, "7");
  c.head_dim = 128;
  c.scaling = static_cast<RopeScaling>(7);
  refused(c, Status::unsupported, "scaling type 7");
  c.scaling = RopeScaling::none;
  c.base = -2.0;
  refused(c, Status::invalid_argument, "-2");
  c.base = 10000.0;
  c.scaling = RopeScaling::linear;
  c.factor = 0.0;
  refused(c, Status::invalid_argument, "factor 0");
  c.scaling = RopeScaling::llama3;
  c.factor = 8.0;
  c.low_freq_factor = 4.0;
  c.high_freq_factor = 4.0;
  refused(c, Status::invalid_argument, "high_freq_factor 4");
  c.high_freq_factor = 8.0;
  c.original_max_position = -1.0;
  refused(c, Status::invalid_argument, "original_max_position -1");

  RopeScaling s = RopeScaling::none;
  for (const char* name : {"yarn", "dynamic", "longrope"}) {
    CHECK(kvfuse::rope_scaling_from_name(name, s) == Status::unsupported);
    CHECK(message_has(std::string("\"") + name + "\""));
  }
}

}  // namespace unit_rope_kernels_ref
