// The CPU backend's dispatched kernels (detail/cpu_kernels.hpp) against their portable versions and a double
// reference, and WeightMatrix's on-the-fly dequantization (backend/cpu/weight_matrix.hpp) against dequantizing
// the whole tensor at once: bit for bit, and through CpuLlama (a Q8_0 model equals its fp32 dequantization).
#include "kvfuse/detail/cpu_kernels.hpp"

#include <doctest/doctest.h>

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "kvfuse/backend/cpu/dequantize.hpp"
#include "kvfuse/backend/cpu/llama.hpp"
#include "kvfuse/backend/cpu/quantized_gemv.hpp"
#include "kvfuse/backend/cpu/weight_matrix.hpp"
#include "kvfuse/model/ggml_quant.hpp"
#include "../support/small_llama.hpp"
#include "../support/test_util.hpp"

// Each unit test file lives in its own namespace: the files are compiled together (a unity build).
namespace unit_cpu_kernels {

namespace {

namespace d = kvfuse::detail;
using kvfuse::GGMLType;
using kvfuse::WeightMatrix;

using kvfuse_test::random_floats;

// Random ggml blocks of `type` for rows x cols, with every fp16 scale field set to `scale` (finite values).
std::vector<std::byte> random_blocks(GGMLType type, std::int64_t rows, std::int64_t cols, std::mt19937& rng) {
  const kvfuse::GGMLTypeTraits traits = kvfuse::ggml_type_traits(type);
  const std::int64_t blocks = rows * cols / traits.block_size;
  std::vector<std::byte> bytes(static_cast<std::size_t>(blocks * traits.type_size));
  for (std::byte& b : bytes) b = static_cast<std::byte>(rng() & 0xff);
  const auto put_scale = [&](std::int64_t at, std::uint16_t h) {
    bytes[static_cast<std::size_t>(at)] = static_cast<std::byte>(h & 0xff);
    bytes[static_cast<std::size_t>(at + 1)] = static_cast<std::byte>(h >> 8);
  };
  for (std::int64_t b = 0; b < blocks; ++b) {
    const std::int64_t at = b * traits.type_size;
    if (type == GGMLType::q8_0) put_scale(at, 0x2400);  // d = 2^-6
    if (type == GGMLType::q4_1) {
      put_scale(at, 0x2c00);      // d = 2^-4
      put_scale(at + 2, 0xb800);  // m = -0.5
    }
    if (type == GGMLType::q4_k) {
      put_scale(at, 0x1c00);      // d = 2^-8
      put_scale(at + 2, 0x1c00);  // dmin
    }
  }
  return bytes;
}

// C = A B in double, A [m][k], B [k][n] row-major.
std::vector<double> reference_product(const std::vector<float>& a, const std::vector<float>& b, std::int64_t m,
                                      std::int64_t k, std::int64_t n) {
  std::vector<double> c(static_cast<std::size_t>(m * n), 0.0);
  for (std::int64_t i = 0; i < m; ++i)
    for (std::int64_t p = 0; p < k; ++p)
      for (std::int64_t j = 0; j < n; ++j)
        c[static_cast<std::size_t>(i * n + j)] +=
            static_cast<double>(a[static_cast<std::size_t>(i * k + p)]) * b[static_cast<std::size_t>(p * n + j)];
  return c;
}

}  // namespace

TEST_CASE("gemm_packed: dispatched and portable products equal the double product, through both packers") {
  std::mt19937 rng(7);
  for (const std::int64_t m : {1, 5, 6, 7, 13, 70}) {
    for (const std::int64_t k : {1, 8, 33, 64}) {
      for (const std::int64_t n : {1, 15, 16, 17, 40}) {
        const std::vector<float> a = random_floats(static_cast<std::size_t>(m * k), rng);
        const std::vector<float> b = random_floats(static_cast<std::size_t>(k * n), rng);
        std::vector<float> bt(b.size());  // B^T [n][k]
        for (std::int64_t p = 0; p < k; ++p)
          for (std::int64_t j = 0; j < n; ++j)
            bt[static_cast<std::size_t>(j * k + p)] = b[static_cast<std::size_t>(p * n + j)];
        std::vector<float> from_rows(static_cast<std::size_t>(d::packed_size(k, n)));
        std::vector<float> from_transposed(from_rows.size());
        d::pack_rows(b.data(), n, k, n, from_rows.data());
        d::pack_transposed(bt.data(), k, n, k, from_transposed.data());
        CHECK(from_rows == from_transposed);
        const std::vector<double> want = reference_product(a, b, m, k, n);
        // ldc > n: columns past n stay untouched.
        const float canary = 12345.0f;
        std::vector<float> fast(static_cast<std::size_t>(m * (n + 3)), canary);
        std::vector<float> slow(fast.size(), canary);
        d::gemm_packed(a.data(), k, m, k, from_rows.data(), n, fast.data(), n + 3);
        d::portable::gemm_packed(a.data(), k, m, k, from_rows.data(), n, slow.data(), n + 3);
        for (std::int64_t i = 0; i < m; ++i) {
          for (std::int64_t j = 0; j < n + 3; ++j) {
            const auto at = static_cast<std::size_t>(i * (n + 3) + j);
            if (j >= n) {
              CHECK(fast[at] == canary);
              CHECK(slow[at] == canary);
              continue;
            }
            const double w = want[static_cast<std::size_t>(i * n + j)];
            CHECK(std::abs(fast[at] - w) <= 1e-5 * static_cast<double>(k));
            CHECK(std::abs(slow[at] - w) <= 1e-5 * static_cast<double>(k));
          }
        }
      }
    }
  }
}

TEST_CASE("gemm_packed on the first k rows (panel_stride) or first n columns of panels packed for more gives the "
          "same bits as panels packed for k x n") {
  std::mt19937 rng(9);
  int compared = 0;
  for (const std::int64_t m : {1, 7, 8, 70}) {
    for (const std::int64_t k : {1, 17, 64}) {
      for (const std::int64_t n : {5, 16, 40, 64}) {
        const std::int64_t rows = k + 19;  // B is the first k of these rows (attention: a block's keys of V)
        const std::vector<float> a = random_floats(static_cast<std::size_t>(m * k), rng);
        const std::vector<float> b = random_floats(static_cast<std::size_t>(rows * n), rng);
        std::vector<float> own(static_cast<std::size_t>(d::packed_size(k, n)));
        std::vector<float> longer(static_cast<std::size_t>(d::packed_size(rows, n)));
        d::pack_rows(b.data(), n, k, n, own.data());
        d::pack_rows(b.data(), n, rows, n, longer.data());
        const auto product = [&](auto gemm, const std::vector<float>& panels, std::int64_t stride) {
          std::vector<float> c(static_cast<std::size_t>(m * n), -1.0f);
          gemm(a.data(), k, m, k, panels.data(), n, c.data(), n, stride);
          return c;
        };
        const auto dispatched = [](auto... x) { d::gemm_packed(x...); };
        const auto portable = [](auto... x) { d::portable::gemm_packed(x...); };
        INFO("m " << m << " k " << k << " n " << n);
        const std::int64_t stride = d::kPanelWidth * rows;
        CHECK(product(dispatched, longer, stride) == product(dispatched, own, 0));
        CHECK(product(portable, longer, stride) == product(portable, own, 0));
        CHECK(product(portable, own, d::kPanelWidth * k) == product(portable, own, 0));
        // B the first n columns of panels packed for n + 7 (attention: a block's keys of K^T): the padding columns
        // hold values, not zeros, and are computed but never stored.
        const std::vector<float> wider_rows = kvfuse_test::widened(b, k, n, n + 7, 3.0f);
        std::vector<float> wider(static_cast<std::size_t>(d::packed_size(k, n + 7)));
        d::pack_rows(wider_rows.data(), n + 7, k, n + 7, wider.data());
        CHECK(product(dispatched, wider, 0) == product(dispatched, own, 0));
        CHECK(product(portable, wider, 0) == product(portable, own, 0));
#if KVFUSE_CPU_DISPATCH_AVX2
        if (d::cpu_uses_avx2()) {
          const auto avx2 = [](auto... x) { d::avx2::gemm_packed(x...); };
          CHECK(product(avx2, longer, stride) == product(avx2, own, 0));
          CHECK(product(avx2, wider, 0) == product(avx2, own, 0));
        }
#endif
        ++compared;
      }
    }
  }
  CHECK(compared == 4 * 3 * 4);
}

TEST_CASE("pack_transposed: the dispatched packer moves the same floats as the portable one, any row stride") {
  std::mt19937 rng(9);
  for (const std::int64_t n : {1, 8, 16, 31, 32, 48}) {
    for (const std::int64_t k : {1, 7, 8, 64, 576}) {
      for (const std::int64_t extra : {0, 3, 64}) {  // row stride ld_s = k + extra
        const std::int64_t ld = k + extra;
        const std::vector<float> src = random_floats(static_cast<std::size_t>(n * ld), rng);
        std::vector<float> fast(static_cast<std::size_t>(d::packed_size(k, n)), -1.0f);
        std::vector<float> slow(fast.size(), -2.0f);
        d::pack_transposed(src.data(), ld, n, k, fast.data());
        d::portable::pack_transposed(src.data(), ld, n, k, slow.data());
        INFO("n " << n << " k " << k << " ld " << ld);
        CHECK(std::memcmp(fast.data(), slow.data(), fast.size() * sizeof(float)) == 0);
      }
    }
  }
}

TEST_CASE("gemv: dispatched and portable equal the double dot products") {
  std::mt19937 rng(8);
  for (const std::int64_t k : {1, 7, 8, 16, 33, 576}) {
    const std::int64_t n = 9;
    const std::vector<float> w = random_floats(static_cast<std::size_t>(n * (k + 2)), rng);
    const std::vector<float> x = random_floats(static_cast<std::size_t>(k), rng);
    std::vector<float> fast(static_cast<std::size_t>(n));
    std::vector<float> slow(fast.size());
    d::gemv(w.data(), k + 2, n, k, x.data(), fast.data());
    d::portable::gemv(w.data(), k + 2, n, k, x.data(), slow.data());
    for (std::int64_t j = 0; j < n; ++j) {
      double want = 0;
      for (std::int64_t p = 0; p < k; ++p)
        want += static_cast<double>(w[static_cast<std::size_t>(j * (k + 2) + p)]) * x[static_cast<std::size_t>(p)];
      CHECK(std::abs(fast[static_cast<std::size_t>(j)] - want) <= 1e-5 * static_cast<double>(k));
      CHECK(std::abs(slow[static_cast<std::size_t>(j)] - want) <= 1e-5 * static_cast<double>(k));
    }
  }
}

TEST_CASE("softmax_row: the dispatched softmax equals attention_softmax_row to float rounding, masks exactly") {
  std::mt19937 rng(9);
  const float inf = std::numeric_limits<float>::infinity();
  for (const std::int64_t n : {1, 7, 8, 9, 64, 300}) {
    for (int pattern = 0; pattern < 3; ++pattern) {
      std::vector<float> scores = random_floats(static_cast<std::size_t>(n), rng);
      for (std::int64_t j = 0; j < n; ++j) {
        float& s = scores[static_cast<std::size_t>(j)];
        s *= 40.0f;                                // base-2 scores spread over 2^±40
        if (pattern == 1 && j % 3 == 1) s = -inf;  // masked keys
        if (pattern == 2) s = -inf;                // a row without a visible key
      }
      std::vector<float> want = scores;
      d::attention_softmax_row(want.data(), n);
      std::vector<float> got = scores;
      d::softmax_row(got.data(), n);
      for (std::int64_t j = 0; j < n; ++j) {
        const float w = want[static_cast<std::size_t>(j)];
        const float g = got[static_cast<std::size_t>(j)];
        if (scores[static_cast<std::size_t>(j)] == -inf) {
          CHECK(g == 0.0f);
        } else {
          CHECK(std::abs(g - w) <= 4e-7f * w + 1e-30f);
        }
      }
    }
  }
}

TEST_CASE("mask_scale_row: the dispatched mask scales visible keys and masks the rest exactly as attention_visible") {
  std::mt19937 rng(13);
  std::uniform_int_distribution<std::int64_t> position(0, 40);
  const float factor = 0.125f * 1.44269504f;
  int masked = 0;
  int visible = 0;
  for (const std::int64_t n : {0, 1, 7, 8, 9, 31, 100}) {
    for (const std::int64_t window : {0, -1, 1, 3, 17}) {
      for (const std::int64_t qpos : {0, 5, 20, 40}) {
        std::vector<std::int64_t> pos(static_cast<std::size_t>(n));
        for (std::int64_t& p : pos) p = position(rng);  // any order, repeats: positions, not indices
        const std::vector<float> raw = random_floats(static_cast<std::size_t>(n), rng);
        std::vector<float> fast = raw;
        std::vector<float> slow = raw;
        d::mask_scale_row(fast.data(), pos.data(), n, qpos, window, factor);
        d::portable::mask_scale_row(slow.data(), pos.data(), n, qpos, window, factor);
        INFO("n " << n << " window " << window << " qpos " << qpos);
        // memcmp: the same bits (n == 0: empty rows, whose data() may be null, which memcmp must not get).
        CHECK((n == 0 || std::memcmp(fast.data(), slow.data(), fast.size() * sizeof(float)) == 0));
        for (std::size_t r = 0; r < pos.size(); ++r) {
          if (kvfuse::detail::attention_visible(pos[r], qpos, window)) {
            CHECK(fast[r] == raw[r] * factor);
            ++visible;
          } else {
            CHECK(fast[r] == -std::numeric_limits<float>::infinity());
            ++masked;
          }
        }
      }
    }
  }
  CHECK(masked > 100);
  CHECK(visible > 100);
}

TEST_CASE("dequantize_blocks_cpu (AVX2 where the CPU has it) equals ggml's reference bit for bit, any scale bits") {
  // Random bytes everywhere, scales included: fp16 scales that are NaN, infinite, subnormal or zero come up, and
  // products that overflow or round; the reference's arithmetic must be reproduced to the last bit. One exception:
  // where Q4_1's d and m are both NaN, which NaN q·d + m returns depends on the operand order the compiler picked
  // for the reference's addition, so there both must be NaN, payloads aside.
  std::mt19937 rng(11);
  INFO("AVX2 path taken: " << d::cpu_uses_avx2());
  for (const GGMLType type : {GGMLType::q4_1, GGMLType::q5_0, GGMLType::q8_0, GGMLType::q4_0, GGMLType::q4_k,
                              GGMLType::q6_k}) {
    const kvfuse::GGMLTypeTraits traits = kvfuse::ggml_type_traits(type);
    INFO("type " << std::string(traits.name));
    const std::int64_t blocks = 4096;
    std::vector<std::uint8_t> bytes(static_cast<std::size_t>(blocks * traits.type_size));
    for (std::uint8_t& b : bytes) b = static_cast<std::uint8_t>(rng() & 0xff);
    for (const std::uint16_t h : {std::uint16_t{0x7c00}, std::uint16_t{0xfc00}, std::uint16_t{0x7e01},
                                  std::uint16_t{0x0001}, std::uint16_t{0x8000}, std::uint16_t{0x7bff}}) {
      bytes[0] = static_cast<std::uint8_t>(h & 0xff);  // block 0's scale: inf, -inf, NaN, subnormal, -0, max
      bytes[1] = static_cast<std::uint8_t>(h >> 8);
      std::vector<float> expected(static_cast<std::size_t>(blocks * traits.block_size));
      std::vector<float> got(expected.size(), -1.0f);
      REQUIRE(d::dequantize_blocks(type, bytes.data(), blocks, expected.data()));
      REQUIRE(d::dequantize_blocks_cpu(type, bytes.data(), blocks, got.data()));
      std::int64_t differ = 0;
      for (std::size_t i = 0; i < got.size(); ++i) {
        const bool same_bits = std::memcmp(&got[i], &expected[i], sizeof(float)) == 0;
        if (!same_bits && !(std::isnan(got[i]) && std::isnan(expected[i]))) ++differ;
      }
      CHECK(differ == 0);
    }
  }
  std::vector<float> untouched(32, 7.0f);
  CHECK_FALSE(d::dequantize_blocks_cpu(GGMLType::iq2_xs, nullptr, 1, untouched.data()));
  CHECK(untouched[0] == 7.0f);
}

TEST_CASE("gemv_blocks_cpu equals detail::gemv of the dequantized rows bit for bit, for 1 to 6 vectors at once") {
  // Random bytes everywhere, fp16 scales included (inf, NaN, subnormal come up): the fused product must be the
  // same FMAs on the same values as dequantize_blocks_cpu followed by gemv. NaN results need only both be NaN.
  std::mt19937 rng(12);
  INFO("AVX2 path taken: " << d::cpu_uses_avx2());
  for (const GGMLType type : {GGMLType::q5_0, GGMLType::q8_0}) {
    const kvfuse::GGMLTypeTraits traits = kvfuse::ggml_type_traits(type);
    INFO("type " << std::string(traits.name));
    const std::int64_t n = 37;
    const std::int64_t k = 640;
    const std::int64_t row_bytes = k / traits.block_size * traits.type_size;
    std::vector<std::uint8_t> bytes(static_cast<std::size_t>(n * row_bytes));
    for (std::uint8_t& b : bytes) b = static_cast<std::uint8_t>(rng() & 0xff);
    std::vector<float> rows(static_cast<std::size_t>(n * k));
    REQUIRE(d::dequantize_blocks_cpu(type, bytes.data(), n * k / traits.block_size, rows.data()));
    for (std::int64_t m = 1; m <= 6; ++m) {
      CAPTURE(m);
      std::vector<std::vector<float>> x(static_cast<std::size_t>(m));
      std::vector<std::vector<float>> want(static_cast<std::size_t>(m), std::vector<float>(static_cast<std::size_t>(n)));
      std::vector<std::vector<float>> got(static_cast<std::size_t>(m), std::vector<float>(static_cast<std::size_t>(n)));
      std::vector<const float*> xs;
      std::vector<float*> ys;
      for (std::int64_t i = 0; i < m; ++i) {
        const auto u = static_cast<std::size_t>(i);
        x[u] = random_floats(static_cast<std::size_t>(k), rng);
        d::gemv(rows.data(), k, n, k, x[u].data(), want[u].data());
        xs.push_back(x[u].data());
        ys.push_back(got[u].data());
      }
      if (!d::gemv_blocks_cpu(type, bytes.data(), row_bytes, n, k, xs.data(), m, ys.data())) {
        CHECK_FALSE(d::cpu_uses_avx2());  // only a CPU without AVX2 has no fused path for these types
        continue;
      }
      std::int64_t differ = 0;
      for (std::size_t i = 0; i < want.size(); ++i)
        for (std::size_t j = 0; j < want[i].size(); ++j) {
          const bool same_bits = std::memcmp(&got[i][j], &want[i][j], sizeof(float)) == 0;
          if (!same_bits && !(std::isnan(got[i][j]) && std::isnan(want[i][j]))) ++differ;
        }
      CHECK(differ == 0);
    }
  }
  std::vector<float> untouched(4, 7.0f);
  const float* x0 = untouched.data();
  float* y0 = untouched.data();
  CHECK_FALSE(d::gemv_blocks_cpu(GGMLType::q4_1, nullptr, 20, 1, 32, &x0, 1, &y0));  // no fused Q4_1
  CHECK(untouched[0] == 7.0f);
}

TEST_CASE("WeightMatrix: rows dequantized on the fly are the whole tensor's dequantization, bit for bit") {
  std::mt19937 rng(10);
  for (const GGMLType type : {GGMLType::q4_1, GGMLType::q5_0, GGMLType::q8_0, GGMLType::q4_k, GGMLType::q6_k,
                              GGMLType::f16}) {
    const std::int64_t rows = 5;
    const std::int64_t cols = 512;
    const std::vector<std::byte> bytes = random_blocks(type, rows, cols, rng);
    std::vector<float> whole(static_cast<std::size_t>(rows * cols));
    const kvfuse::GGMLTypeTraits traits = kvfuse::ggml_type_traits(type);
    REQUIRE(d::dequantize_blocks(type, reinterpret_cast<const std::uint8_t*>(bytes.data()),
                                 rows * cols / traits.block_size, whole.data()));
    const WeightMatrix w = WeightMatrix::from_blocks(type, rows, cols, bytes);
    CHECK(w.rows() == rows);
    CHECK(w.cols() == cols);
    CHECK(!w.is_f32());
    CHECK(w.bytes() == bytes.size());
    const kvfuse::RowMatrix dense = w.dense();
    CHECK(std::memcmp(dense.data(), whole.data(), whole.size() * sizeof(float)) == 0);
    std::vector<float> two(static_cast<std::size_t>(2 * cols));
    w.dequantize_rows(2, 2, two.data());
    CHECK(std::memcmp(two.data(), whole.data() + 2 * cols, two.size() * sizeof(float)) == 0);
    const std::vector<float> edge = w.elements(cols - 7, 20);  // across a row boundary
    CHECK(std::memcmp(edge.data(), whole.data() + cols - 7, edge.size() * sizeof(float)) == 0);
  }
  CHECK_THROWS(WeightMatrix::from_blocks(GGMLType::q8_0, 2, 48, std::vector<std::byte>(102)));  // 48 % 32 != 0
}

TEST_CASE("CpuLlama on Q8_0 weights equals CpuLlama on their fp32 dequantization: logits and KV") {
  const kvfuse::LlamaConfig c = kvfuse_test::small_llama_config();
  std::mt19937 rng(11);
  const auto q8 = [&](std::int64_t rows, std::int64_t cols) {
    return WeightMatrix::from_blocks(GGMLType::q8_0, rows, cols, random_blocks(GGMLType::q8_0, rows, cols, rng));
  };
  kvfuse::LlamaWeights quantized = kvfuse::LlamaWeights::random(c, 3);
  quantized.token_embd = q8(c.n_vocab, c.n_embd);
  for (kvfuse::LlamaLayerWeights& l : quantized.layers) {
    l.wq = q8(c.q_dim(), c.n_embd);
    l.wk = q8(c.kv_dim(), c.n_embd);
    l.wv = q8(c.kv_dim(), c.n_embd);
    l.wo = q8(c.n_embd, c.q_dim());
    l.w_gate = q8(c.n_ff, c.n_embd);
    l.w_up = q8(c.n_ff, c.n_embd);
    l.w_down = q8(c.n_embd, c.n_ff);
  }
  kvfuse::LlamaWeights dense = quantized;
  dense.token_embd = quantized.token_embd.dense();
  for (kvfuse::LlamaLayerWeights& l : dense.layers)
    for (WeightMatrix* m : l.projections()) *m = m->dense();
  const kvfuse::CpuLlama a(c, quantized, kvfuse::CpuLlamaOptions{2, 8});
  const kvfuse::CpuLlama b(c, dense, kvfuse::CpuLlamaOptions{2, 8});
  std::vector<kvfuse::token_id> tokens;
  for (int i = 0; i < 40; ++i) tokens.push_back(static_cast<kvfuse::token_id>((i * 37 + 5) % c.n_vocab));
  const kvfuse::LlamaPrefill pa = a.full_prefill(tokens);
  const kvfuse::LlamaPrefill pb = b.full_prefill(tokens);
  CHECK(pa.logits == pb.logits);
  CHECK(pa.kv.k == pb.kv.k);
  CHECK(pa.kv.v == pb.kv.v);
}

}  // namespace unit_cpu_kernels
