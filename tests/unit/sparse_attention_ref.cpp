// harness/ref/sparse_attention.hpp: the CPU reference of sparse-query attention with an exact positional causal
// mask, against an independent fp64 two-pass softmax written here, on every dtype, head_dim 64/128, GQA,
// packed and strided layouts; the mask's exactness, the chunk-, self- and query-mass epilogues (also by hand)
// and the validation messages;
// and the whole-row form of the same softmax that the CPU backend runs (detail::attention_softmax_row).
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "kvfuse/core/dtype.hpp"
#include "kvfuse/core/status.hpp"
#include "kvfuse/harness/ref/sparse_attention.hpp"
#include "../support/test_util.hpp"

// Each unit test file lives in its own namespace: the files are compiled together (a unity build).
namespace unit_sparse_attention_ref {

using kvfuse::DType;
using kvfuse::SparseAttentionArgs;
using kvfuse::Status;

namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

// A [tokens, heads, d] tensor in storage dtype with explicit strides (elements).
struct Tensor {
  DType dtype = DType::f32;
  std::int64_t tokens = 0, heads = 0, d = 0, token_stride = 0, head_stride = 0;
  std::vector<unsigned char> bytes;

  Tensor(DType t, std::int64_t n, std::int64_t h, std::int64_t dim, std::int64_t ts, std::int64_t hs)
      : dtype(t), tokens(n), heads(h), d(dim), token_stride(ts), head_stride(hs) {
    const std::int64_t span = n == 0 ? 0 : (n - 1) * ts + (h - 1) * hs + dim;
    bytes.assign(static_cast<std::size_t>(std::max<std::int64_t>(span, 1) * kvfuse::dtype_size(t)), 0xAB);
  }
  std::int64_t offset(std::int64_t t, std::int64_t h, std::int64_t e) const {
    return t * token_stride + h * head_stride + e;
  }
  float get(std::int64_t t, std::int64_t h, std::int64_t e) const {
    const auto at = static_cast<std::size_t>(offset(t, h, e));
    switch (dtype) {
      case DType::f32: return reinterpret_cast<const float*>(bytes.data())[at];
      case DType::f16: return kvfuse::to_float(reinterpret_cast<const kvfuse::f16*>(bytes.data())[at]);
      case DType::bf16: return kvfuse::to_float(reinterpret_cast<const kvfuse::bf16*>(bytes.data())[at]);
    }
    return 0;
  }
  void set(std::int64_t t, std::int64_t h, std::int64_t e, float x) {
    const auto at = static_cast<std::size_t>(offset(t, h, e));
    switch (dtype) {
      case DType::f32: reinterpret_cast<float*>(bytes.data())[at] = x; break;
      case DType::f16: reinterpret_cast<kvfuse::f16*>(bytes.data())[at] = kvfuse::to_f16(x); break;
      case DType::bf16: reinterpret_cast<kvfuse::bf16*>(bytes.data())[at] = kvfuse::to_bf16(x); break;
    }
  }
  void fill_random(std::mt19937& rng, float lo, float hi) {
    std::uniform_real_distribution<float> dist(lo, hi);
    for (std::int64_t t = 0; t < tokens; ++t)
      for (std::int64_t h = 0; h < heads; ++h)
        for (std::int64_t e = 0; e < d; ++e) set(t, h, e, dist(rng));
  }
};

enum class Layout { nhd, strided };

// Packed NHD, or: Q/O padded NHD (head stride d + 8, token stride heads·(d + 8) + 16), K/V HND.
Tensor make_tensor(DType t, std::int64_t n, std::int64_t h, std::int64_t d, Layout layout, bool kv) {
  if (layout == Layout::nhd) return Tensor(t, n, h, d, h * d, d);
  if (kv) return Tensor(t, n, h, d, d, n * d);
  return Tensor(t, n, h, d, h * (d + 8) + 16, d + 8);
}

struct Problem {
  DType dtype = DType::bf16;
  std::int64_t hq = 4, hkv = 2, d = 64;
  Layout layout = Layout::nhd;
  float scale = 0.0f;
  std::vector<std::int32_t> q_pos, k_pos;
  std::vector<std::int64_t> chunk_starts;  // empty: no epilogue
  Tensor q, k, v, o;
  std::vector<float> lse, mass;

  Problem(DType t, std::int64_t q_heads, std::int64_t kv_heads, std::int64_t dim, Layout l, std::vector<std::int32_t> qp,
          std::vector<std::int32_t> kp)
      : dtype(t), hq(q_heads), hkv(kv_heads), d(dim), layout(l), q_pos(std::move(qp)), k_pos(std::move(kp)),
        q(make_tensor(t, static_cast<std::int64_t>(q_pos.size()), q_heads, dim, l, false)),
        k(make_tensor(t, static_cast<std::int64_t>(k_pos.size()), kv_heads, dim, l, true)),
        v(make_tensor(t, static_cast<std::int64_t>(k_pos.size()), kv_heads, dim, l, true)),
        o(make_tensor(t, static_cast<std::int64_t>(q_pos.size()), q_heads, dim, l, false)) {}

  std::int64_t s() const { return static_cast<std::int64_t>(q_pos.size()); }
  std::int64_t n() const { return static_cast<std::int64_t>(k_pos.size()); }
  std::int64_t chunks() const { return chunk_starts.empty() ? 0 : static_cast<std::int64_t>(chunk_starts.size()) - 1; }

  SparseAttentionArgs args() {
    lse.assign(static_cast<std::size_t>(s() * hq), std::nanf(""));
    mass.assign(static_cast<std::size_t>(s() * chunks()), std::nanf(""));
    SparseAttentionArgs a;
    a.dtype = dtype;
    a.num_queries = s();
    a.num_keys = n();
    a.num_q_heads = hq;
    a.num_kv_heads = hkv;
    a.head_dim = d;
    a.scale = scale;
    a.q = q.bytes.data();
    a.k = k.bytes.data();
    a.v = v.bytes.data();
    a.o = o.bytes.data();
    if (layout == Layout::strided) {  // packed NHD is left to the 0 = default strides
      a.q_token_stride = q.token_stride;
      a.q_head_stride = q.head_stride;
      a.k_token_stride = k.token_stride;
      a.k_head_stride = k.head_stride;
      a.v_token_stride = v.token_stride;
      a.v_head_stride = v.head_stride;
      a.o_token_stride = o.token_stride;
      a.o_head_stride = o.head_stride;
    }
    a.q_pos = q_pos.data();
    a.k_pos = k_pos.data();
    a.lse = lse.data();
    a.num_chunks = chunks();
    a.chunk_starts = chunk_starts.empty() ? nullptr : chunk_starts.data();
    a.mass = mass.empty() ? nullptr : mass.data();
    return a;
  }
};

// The independent oracle: fp64, two passes (max, then sum), the mask written out as pos_k <= pos_q.
struct Expected {
  std::vector<double> o;     // [S][Hq][d]
  std::vector<double> lse;   // [S][Hq]
  std::vector<double> mass;  // [S][C]
  std::vector<double> prob;  // [S][Hq][N] softmax weights, when asked for
};

Expected oracle(const Problem& p, bool keep_prob = false) {
  const double scale = p.scale != 0.0f ? static_cast<double>(p.scale) : 1.0 / std::sqrt(static_cast<double>(p.d));
  const std::int64_t c_count = p.chunks();
  Expected e;
  e.o.assign(static_cast<std::size_t>(p.s() * p.hq * p.d), 0.0);
  e.lse.assign(static_cast<std::size_t>(p.s() * p.hq), -kInf);
  e.mass.assign(static_cast<std::size_t>(p.s() * c_count), 0.0);
  if (keep_prob) e.prob.assign(static_cast<std::size_t>(p.s() * p.hq * p.n()), 0.0);
  std::vector<double> w(static_cast<std::size_t>(p.n()));
  for (std::int64_t i = 0; i < p.s(); ++i) {
    for (std::int64_t h = 0; h < p.hq; ++h) {
      const std::int64_t g = h * p.hkv / p.hq;  // KV head of query head h
      double mx = -kInf;
      for (std::int64_t j = 0; j < p.n(); ++j) {
        if (p.k_pos[static_cast<std::size_t>(j)] > p.q_pos[static_cast<std::size_t>(i)]) {
          w[static_cast<std::size_t>(j)] = -kInf;
          continue;
        }
        double dot = 0;
        for (std::int64_t x = 0; x < p.d; ++x)
          dot += static_cast<double>(p.q.get(i, h, x)) * static_cast<double>(p.k.get(j, g, x));
        w[static_cast<std::size_t>(j)] = dot * scale;
        mx = std::max(mx, dot * scale);
      }
      if (mx == -kInf) continue;  // no visible key: O = 0, LSE = -inf, no mass
      double sum = 0;
      for (std::int64_t j = 0; j < p.n(); ++j) sum += std::exp(w[static_cast<std::size_t>(j)] - mx);
      const double lse = mx + std::log(sum);
      e.lse[static_cast<std::size_t>(i * p.hq + h)] = lse;
      for (std::int64_t j = 0; j < p.n(); ++j) {
        const double prob = std::exp(w[static_cast<std::size_t>(j)] - lse);
        if (keep_prob) e.prob[static_cast<std::size_t>((i * p.hq + h) * p.n() + j)] = prob;
        for (std::int64_t x = 0; x < p.d; ++x)
          e.o[static_cast<std::size_t>((i * p.hq + h) * p.d + x)] += prob * static_cast<double>(p.v.get(j, g, x));
        for (std::int64_t c = 0; c < c_count; ++c)
          if (j >= p.chunk_starts[static_cast<std::size_t>(c)] && j < p.chunk_starts[static_cast<std::size_t>(c + 1)])
            e.mass[static_cast<std::size_t>(i * c_count + c)] += prob;
      }
    }
  }
  return e;
}

double tolerance(DType t) {
  switch (t) {
    case DType::f32: return 1e-5;
    case DType::f16: return 2e-3;
    case DType::bf16: return 1e-2;
  }
  return 0;
}

// ||O - expected|| / ||expected|| over all outputs, LSE within 1e-4 (relative to 1 + |LSE|), -inf exact.
void check_against_oracle(const Problem& p, const Expected& e) {
  double diff = 0, norm = 0;
  for (std::int64_t i = 0; i < p.s(); ++i)
    for (std::int64_t h = 0; h < p.hq; ++h)
      for (std::int64_t x = 0; x < p.d; ++x) {
        const double got = p.o.get(i, h, x);
        const double want = e.o[static_cast<std::size_t>((i * p.hq + h) * p.d + x)];
        REQUIRE(std::isfinite(got));
        diff += (got - want) * (got - want);
        norm += want * want;
      }
  const double rel = norm > 0 ? std::sqrt(diff / norm) : std::sqrt(diff);
  CAPTURE(rel);
  CHECK(rel <= tolerance(p.dtype));
  for (std::size_t r = 0; r < e.lse.size(); ++r) {
    CAPTURE(r);
    const double got = p.lse[r];
    if (e.lse[r] == -kInf) {
      CHECK(got == -kInf);
    } else {
      CHECK(std::fabs(got - e.lse[r]) <= 1e-4 * (1.0 + std::fabs(e.lse[r])));
    }
  }
}

// Prompt positions with gaps (starting at `first`), and a sorted random subset of them as queries, plus a
// query before every key and one after every key.
void random_positions(std::mt19937& rng, std::int64_t n, std::int64_t s, std::int32_t first,
                      std::vector<std::int32_t>& q_pos, std::vector<std::int32_t>& k_pos) {
  std::uniform_int_distribution<int> gap(1, 3);
  k_pos.resize(static_cast<std::size_t>(n));
  std::int32_t pos = first;
  for (auto& x : k_pos) {
    x = pos;
    pos += gap(rng);
  }
  std::vector<std::int32_t> pool = k_pos;
  std::shuffle(pool.begin(), pool.end(), rng);
  q_pos.assign(pool.begin(), pool.begin() + (s - 2));
  q_pos.push_back(first - 1);             // sees no key
  q_pos.push_back(k_pos.back() + 7);      // sees every key
  std::sort(q_pos.begin(), q_pos.end());
}

}  // namespace

TEST_CASE("sparse_attention ref matches an fp64 two-pass softmax: dtypes, head_dim, GQA, layouts") {
  std::mt19937 rng(1234);
  // Under the sanitizers (kvfuse_test::kSanitized: they check code paths) one head_dim and no 32-head case; the whole
  // grid in the optimized build (an ASan build took 56 s for this file).
  std::vector<std::pair<std::int64_t, std::int64_t>> heads = {{9, 3}, {32, 8}, {2, 2}};
  std::vector<std::int64_t> dims = {64, 128};
  if (kvfuse_test::kSanitized) {
    heads = {{9, 3}, {2, 2}};
    dims = {64};
  }
  for (const DType t : {DType::bf16, DType::f16, DType::f32})
    for (const std::int64_t d : dims)
      for (const auto& heads_q_kv : heads)
        for (const Layout layout : {Layout::nhd, Layout::strided}) {
          const std::int64_t hq = heads_q_kv.first;
          const std::int64_t hkv = heads_q_kv.second;
          CAPTURE(kvfuse::dtype_name(t));
          CAPTURE(d);
          CAPTURE(hq);
          CAPTURE(hkv);
          CAPTURE(static_cast<int>(layout));
          std::vector<std::int32_t> qp, kp;
          random_positions(rng, 131, 21, 3, qp, kp);
          Problem p(t, hq, hkv, d, layout, qp, kp);
          p.q.fill_random(rng, -1.0f, 1.0f);
          p.k.fill_random(rng, -1.0f, 1.0f);
          p.v.fill_random(rng, -1.0f, 1.0f);
          if (hq == 2) p.scale = 0.3f;  // an explicit scale; elsewhere 0 selects 1/sqrt(d)
          REQUIRE(kvfuse::ref::sparse_attention(p.args()) == Status::success);
          check_against_oracle(p, oracle(p));
          CHECK(p.lse[0] == -std::numeric_limits<float>::infinity());  // the query before every key
          for (std::int64_t x = 0; x < d; ++x) CHECK(p.o.get(0, 0, x) == 0.0f);
        }
}

TEST_CASE("every query selected at positions 0..N-1 equals dense causal attention") {
  std::mt19937 rng(99);
  const std::int64_t n = 77, hq = 4, hkv = 2, d = 64;
  std::vector<std::int32_t> pos(static_cast<std::size_t>(n));
  for (std::int64_t j = 0; j < n; ++j) pos[static_cast<std::size_t>(j)] = static_cast<std::int32_t>(j);
  Problem p(DType::f32, hq, hkv, d, Layout::nhd, pos, pos);
  p.q.fill_random(rng, -2.0f, 2.0f);
  p.k.fill_random(rng, -2.0f, 2.0f);
  p.v.fill_random(rng, -1.0f, 1.0f);
  REQUIRE(kvfuse::ref::sparse_attention(p.args()) == Status::success);
  // Dense causal attention by index (row i sees columns 0..i), fp64.
  const double scale = 1.0 / std::sqrt(static_cast<double>(d));
  double worst = 0;
  for (std::int64_t i = 0; i < n; ++i)
    for (std::int64_t h = 0; h < hq; ++h) {
      const std::int64_t g = h / (hq / hkv);
      std::vector<double> w(static_cast<std::size_t>(i + 1));
      double mx = -kInf;
      for (std::int64_t j = 0; j <= i; ++j) {
        double dot = 0;
        for (std::int64_t x = 0; x < d; ++x) dot += double{p.q.get(i, h, x)} * double{p.k.get(j, g, x)};
        w[static_cast<std::size_t>(j)] = dot * scale;
        mx = std::max(mx, dot * scale);
      }
      double sum = 0;
      for (auto& x : w) sum += (x = std::exp(x - mx));
      CHECK(p.lse[static_cast<std::size_t>(i * hq + h)] == doctest::Approx(mx + std::log(sum)).epsilon(1e-5));
      for (std::int64_t x = 0; x < d; ++x) {
        double want = 0;
        for (std::int64_t j = 0; j <= i; ++j) want += w[static_cast<std::size_t>(j)] / sum * p.v.get(j, g, x);
        worst = std::max(worst, std::fabs(want - p.o.get(i, h, x)));
      }
    }
  CHECK(worst <= 1e-5);
}

TEST_CASE("a query sees exactly the keys at or before its position, equal positions included") {
  // Keys with gaps in their positions; queries between, on and past them. With Q = 0 every visible key has
  // the same score, so O is the mean of the visible V rows: V[j] = e_j makes O[i][j] = 1/count or 0.
  const std::vector<std::int32_t> kp = {2, 3, 4, 7, 8, 12, 13};
  const std::vector<std::int32_t> qp = {1, 4, 5, 7, 11, 12, 40};
  const std::vector<int> visible = {0, 3, 3, 4, 5, 6, 7};  // keys with pos <= query pos, counted by hand
  for (const DType t : {DType::bf16, DType::f32}) {
    CAPTURE(kvfuse::dtype_name(t));
    Problem p(t, 2, 1, 64, Layout::nhd, qp, kp);
    for (std::int64_t j = 0; j < p.n(); ++j)
      for (std::int64_t x = 0; x < p.d; ++x) {
        p.k.set(j, 0, x, 0.25f * static_cast<float>((j * 7 + x) % 5));
        p.v.set(j, 0, x, x == j ? 1.0f : 0.0f);
      }
    for (std::int64_t i = 0; i < p.s(); ++i)
      for (std::int64_t h = 0; h < p.hq; ++h)
        for (std::int64_t x = 0; x < p.d; ++x) p.q.set(i, h, x, 0.0f);
    REQUIRE(kvfuse::ref::sparse_attention(p.args()) == Status::success);
    for (std::int64_t i = 0; i < p.s(); ++i) {
      CAPTURE(i);
      const int count = visible[static_cast<std::size_t>(i)];
      for (std::int64_t h = 0; h < p.hq; ++h) {
        const float lse = p.lse[static_cast<std::size_t>(i * p.hq + h)];
        if (count == 0) {
          CHECK(lse == -std::numeric_limits<float>::infinity());
        } else {
          CHECK(lse == doctest::Approx(std::log(count)).epsilon(1e-6));
        }
        for (std::int64_t x = 0; x < p.d; ++x) {
          const double want = x < count ? 1.0 / count : 0.0;
          CHECK(p.o.get(i, h, x) == doctest::Approx(want).epsilon(t == DType::f32 ? 1e-6 : 4e-3));
        }
      }
    }
  }
}

TEST_CASE("changing K and V of a key the query cannot see leaves its output bitwise unchanged") {
  std::mt19937 rng(5);
  std::vector<std::int32_t> qp, kp;
  random_positions(rng, 150, 12, 0, qp, kp);
  Problem p(DType::bf16, 9, 3, 128, Layout::strided, qp, kp);
  p.q.fill_random(rng, -1.0f, 1.0f);
  p.k.fill_random(rng, -1.0f, 1.0f);
  p.v.fill_random(rng, -1.0f, 1.0f);
  REQUIRE(kvfuse::ref::sparse_attention(p.args()) == Status::success);
  const std::vector<unsigned char> before = p.o.bytes;
  const std::vector<float> lse_before = p.lse;
  // Query 5 sits at some key position; every key past it is invisible to it. Scramble those keys.
  const std::int32_t cut = p.q_pos[5];
  std::int64_t changed = 0;
  for (std::int64_t j = 0; j < p.n(); ++j) {
    if (p.k_pos[static_cast<std::size_t>(j)] <= cut) continue;
    ++changed;
    for (std::int64_t g = 0; g < p.hkv; ++g)
      for (std::int64_t x = 0; x < p.d; ++x) {
        p.k.set(j, g, x, 100.0f);
        p.v.set(j, g, x, -1000.0f);
      }
  }
  REQUIRE(changed > 0);
  REQUIRE(kvfuse::ref::sparse_attention(p.args()) == Status::success);
  for (std::int64_t i = 0; i < p.s(); ++i) {
    if (p.q_pos[static_cast<std::size_t>(i)] > cut) continue;
    CAPTURE(i);
    for (std::int64_t h = 0; h < p.hq; ++h) {
      const auto off = static_cast<std::size_t>(p.o.offset(i, h, 0) * 2);
      CHECK(std::memcmp(before.data() + off, p.o.bytes.data() + off, static_cast<std::size_t>(p.d * 2)) == 0);
      const auto r = static_cast<std::size_t>(i * p.hq + h);
      CHECK(std::memcmp(&lse_before[r], &p.lse[r], sizeof(float)) == 0);
    }
  }
  // ...while a query that sees them does change.
  CHECK(std::memcmp(before.data() + p.o.offset(p.s() - 1, 0, 0) * 2, p.o.bytes.data() + p.o.offset(p.s() - 1, 0, 0) * 2,
                    static_cast<std::size_t>(p.d * 2)) != 0);
}

TEST_CASE("chunk mass: sums to Hq over covering chunks and matches an independent computation") {
  std::mt19937 rng(17);
  std::vector<std::int32_t> qp, kp;
  random_positions(rng, 140, 15, 2, qp, kp);
  for (const bool covering : {true, false}) {
    CAPTURE(covering);
    Problem p(DType::f16, 6, 2, 64, Layout::nhd, qp, kp);
    p.q.fill_random(rng, -1.5f, 1.5f);
    p.k.fill_random(rng, -1.5f, 1.5f);
    p.v.fill_random(rng, -1.0f, 1.0f);
    // Covering: [0,30) [30,30) (empty) [30,95) [95,140). Partial: keys before 10 and from 120 on are in none.
    p.chunk_starts = covering ? std::vector<std::int64_t>{0, 30, 30, 95, 140} : std::vector<std::int64_t>{10, 64, 120};
    REQUIRE(kvfuse::ref::sparse_attention(p.args()) == Status::success);
    const Expected e = oracle(p);
    const std::int64_t c_count = p.chunks();
    for (std::int64_t i = 0; i < p.s(); ++i) {
      CAPTURE(i);
      double total = 0;
      for (std::int64_t c = 0; c < c_count; ++c) {
        const auto r = static_cast<std::size_t>(i * c_count + c);
        CHECK(std::fabs(p.mass[r] - e.mass[r]) <= 1e-4);
        total += p.mass[r];
      }
      const bool sees_keys = p.q_pos[static_cast<std::size_t>(i)] >= p.k_pos[0];
      if (covering) CHECK(total == doctest::Approx(sees_keys ? static_cast<double>(p.hq) : 0.0).epsilon(1e-5));
      if (covering) CHECK(p.mass[static_cast<std::size_t>(i * c_count + 1)] == 0.0f);  // the empty chunk
    }
  }
}

TEST_CASE("self and query mass by hand: equal scores give uniform weights over the visible keys") {
  // Q = 0: every visible key gets weight 1 / (number visible). Keys at positions 0..5; queries are rows 1, 3, 5.
  Problem p(DType::f32, 2, 1, 64, Layout::nhd, {1, 3, 5}, {0, 1, 2, 3, 4, 5});
  for (std::int64_t i = 0; i < p.s(); ++i)
    for (std::int64_t h = 0; h < p.hq; ++h)
      for (std::int64_t e = 0; e < p.d; ++e) p.q.set(i, h, e, 0.0f);
  std::mt19937 rng(5);
  p.k.fill_random(rng, -1.0f, 1.0f);
  p.v.fill_random(rng, -1.0f, 1.0f);
  const std::vector<std::int32_t> self_rows = {1, 3, 5};
  std::vector<float> self(3, std::nanf("")), query(6, std::nanf(""));
  auto a = p.args();
  a.self_rows = self_rows.data();
  a.self_mass = self.data();
  a.query_begin = 1;  // the query rows: the entries at positions 3 and 5
  a.query_end = 3;
  a.query_mass = query.data();
  REQUIRE(kvfuse::ref::sparse_attention(a) == Status::success);
  // Hq = 2 heads of 1 / (pos + 1) each on the own row.
  CHECK(self[0] == doctest::Approx(2.0 / 2));
  CHECK(self[1] == doctest::Approx(2.0 / 4));
  CHECK(self[2] == doctest::Approx(2.0 / 6));
  // Keys 0..3 are seen by both query rows (1/4 + 1/6 per head), keys 4 and 5 by the row at 5 only.
  for (int j = 0; j < 6; ++j) {
    CAPTURE(j);
    CHECK(query[static_cast<std::size_t>(j)] == doctest::Approx(j <= 3 ? 2 * (1.0 / 4 + 1.0 / 6) : 2.0 / 6));
  }
  // An empty query range: every key 0. No query at all: the same.
  a.query_begin = a.query_end = 2;
  REQUIRE(kvfuse::ref::sparse_attention(a) == Status::success);
  CHECK(std::all_of(query.begin(), query.end(), [](float x) { return x == 0.0f; }));
}

TEST_CASE("self and query mass match an fp64 computation and the CPU engine's per-row softmax") {
  std::mt19937 rng(23);
  std::vector<std::int32_t> qp, kp;
  random_positions(rng, 120, 20, 3, qp, kp);
  Problem p(DType::bf16, 6, 2, 64, Layout::strided, qp, kp);
  p.q.fill_random(rng, -1.5f, 1.5f);
  p.k.fill_random(rng, -1.5f, 1.5f);
  p.v.fill_random(rng, -1.0f, 1.0f);
  // Own row: the key at the query's position; the two queries outside the keys get rows 0 and 119.
  std::vector<std::int32_t> self_rows(qp.size());
  for (std::size_t i = 0; i < qp.size(); ++i) {
    const auto at = std::lower_bound(kp.begin(), kp.end(), qp[i]);
    self_rows[i] = at != kp.end() && *at == qp[i] ? static_cast<std::int32_t>(at - kp.begin()) : (i == 0 ? 0 : 119);
  }
  std::vector<float> self(qp.size(), std::nanf("")), query(kp.size(), std::nanf(""));
  auto a = p.args();
  a.self_rows = self_rows.data();
  a.self_mass = self.data();
  a.query_begin = 14;  // the last 6 entries, the one that sees every key included
  a.query_end = 20;
  a.query_mass = query.data();
  REQUIRE(kvfuse::ref::sparse_attention(a) == Status::success);
  const Expected e = oracle(p, true);
  const auto prob = [&](std::int64_t i, std::int64_t h, std::int64_t j) {
    return e.prob[static_cast<std::size_t>((i * p.hq + h) * p.n() + j)];
  };
  // The CPU engine (backend/cpu/llama.hpp, attention()): per query row and head, the base-2 scores of every
  // key, masked, through detail::attention_softmax_row; head_self takes the own row's weight, head_query adds
  // the query rows' weights per key; both summed over the heads.
  const float factor = kvfuse::detail::attention_score_factor(static_cast<float>(1.0 / std::sqrt(64.0)));
  std::vector<double> engine_self(qp.size(), 0.0), engine_query(kp.size(), 0.0);
  std::vector<float> w(kp.size());
  for (std::int64_t i = 0; i < p.s(); ++i) {
    for (std::int64_t h = 0; h < p.hq; ++h) {
      for (std::int64_t j = 0; j < p.n(); ++j) {
        float dot = 0.0f;
        for (std::int64_t x = 0; x < p.d; ++x) dot += p.q.get(i, h, x) * p.k.get(j, h / 3, x);
        w[static_cast<std::size_t>(j)] =
            kvfuse::detail::attention_visible(kp[static_cast<std::size_t>(j)], qp[static_cast<std::size_t>(i)])
                ? dot * factor
                : kvfuse::detail::attention_neg_inf();
      }
      kvfuse::detail::attention_softmax_row(w.data(), p.n());
      engine_self[static_cast<std::size_t>(i)] += w[static_cast<std::size_t>(self_rows[static_cast<std::size_t>(i)])];
      if (i >= 14)
        for (std::size_t j = 0; j < w.size(); ++j) engine_query[j] += w[j];
    }
  }
  for (std::int64_t i = 0; i < p.s(); ++i) {
    CAPTURE(i);
    double want = 0;
    for (std::int64_t h = 0; h < p.hq; ++h) want += prob(i, h, self_rows[static_cast<std::size_t>(i)]);
    CHECK(std::fabs(self[static_cast<std::size_t>(i)] - want) <= 1e-4);
    CHECK(std::fabs(self[static_cast<std::size_t>(i)] - engine_self[static_cast<std::size_t>(i)]) <= 1e-5);
  }
  CHECK(self[0] == 0.0f);  // the query before every key sees none
  double total = 0;
  for (std::int64_t j = 0; j < p.n(); ++j) {
    CAPTURE(j);
    double want = 0;
    for (std::int64_t i = 14; i < 20; ++i)
      for (std::int64_t h = 0; h < p.hq; ++h) want += prob(i, h, j);
    CHECK(std::fabs(query[static_cast<std::size_t>(j)] - want) <= 1e-4);
    CHECK(std::fabs(query[static_cast<std::size_t>(j)] - engine_query[static_cast<std::size_t>(j)]) <= 1e-5);
    total += query[static_cast<std::size_t>(j)];
  }
  CHECK(total == doctest::Approx(6.0 * p.hq).epsilon(1e-5));  // each query row's weights sum to 1 per head
}

TEST_CASE("sparse_attention validation refuses bad arguments and names the value") {
  const std::vector<std::int32_t> kp = {0, 1, 2, 3};
  const std::vector<std::int32_t> qp = {1, 3};
  Problem p(DType::bf16, 4, 2, 64, Layout::nhd, qp, kp);
  const auto refused = [](SparseAttentionArgs a, const char* needle) {
    CAPTURE(needle);
    CHECK(kvfuse::ref::sparse_attention(a) == Status::invalid_argument);
    const std::string message = kvfuse::last_status_message();
    CAPTURE(message);
    CHECK(message.find(needle) != std::string::npos);
  };
  REQUIRE(kvfuse::ref::sparse_attention(p.args()) == Status::success);
  {
    auto a = p.args();
    a.num_q_heads = 9;
    a.num_kv_heads = 4;
    refused(a, "num_q_heads 9 is not a multiple of num_kv_heads 4");
  }
  {
    auto a = p.args();
    a.head_dim = 0;
    refused(a, "head_dim 0");
  }
  {
    auto a = p.args();
    a.num_keys = -3;
    refused(a, "num_keys -3");
  }
  {
    auto a = p.args();
    a.k_head_stride = -64;
    refused(a, "k_head_stride -64");
  }
  {
    auto a = p.args();
    a.scale = std::numeric_limits<float>::infinity();
    refused(a, "scale inf");
  }
  {
    auto a = p.args();
    a.dtype = static_cast<DType>(7);
    refused(a, "dtype 7");
  }
  {
    auto a = p.args();
    a.v = nullptr;
    refused(a, "k, v or k_pos is null");
  }
  {
    auto a = p.args();
    const std::vector<std::int32_t> unsorted = {0, 5, 4, 6};
    a.k_pos = unsorted.data();
    refused(a, "k_pos[1] = 5 > k_pos[2] = 4");
  }
  {
    auto a = p.args();
    const std::vector<std::int64_t> starts = {0, 3, 2};
    a.num_chunks = 2;
    a.chunk_starts = starts.data();
    std::vector<float> mass(4);
    a.mass = mass.data();
    refused(a, "chunk_starts[2] = 2");
  }
  {
    auto a = p.args();
    const std::vector<std::int64_t> starts = {0, 5};
    a.num_chunks = 1;
    a.chunk_starts = starts.data();
    std::vector<float> mass(2);
    a.mass = mass.data();
    refused(a, "chunk_starts[1] = 5");
  }
  {
    auto a = p.args();
    a.num_chunks = 1;
    refused(a, "1 chunks but chunk_starts");
  }
  {
    auto a = p.args();
    a.workspace_bytes = -16;
    refused(a, "workspace_bytes -16");
  }
}

TEST_CASE("self- and query-mass arguments are refused, naming the value") {
  const std::vector<std::int32_t> kp = {0, 1, 2, 3};
  const std::vector<std::int32_t> qp = {1, 3};
  Problem p(DType::bf16, 4, 2, 64, Layout::nhd, qp, kp);
  std::vector<float> self(2), query(4);
  std::vector<std::int32_t> rows = {1, 4};
  const auto refused = [](SparseAttentionArgs a, const char* needle) {
    CAPTURE(needle);
    CHECK(kvfuse::ref::sparse_attention(a) == Status::invalid_argument);
    const std::string message = kvfuse::last_status_message();
    CAPTURE(message);
    CHECK(message.find(needle) != std::string::npos);
  };
  auto a = p.args();
  a.self_mass = self.data();
  refused(a, "self_rows is null");
  a.self_rows = rows.data();
  refused(a, "self_rows[1] = 4");
  rows[1] = 3;
  CHECK(kvfuse::ref::sparse_attention(a) == Status::success);
  a.query_mass = query.data();
  a.query_begin = 1;
  a.query_end = 3;
  refused(a, "query rows [1, 3)");
  a.query_begin = 2;
  a.query_end = 1;
  refused(a, "query rows [2, 1)");
  a.query_begin = -1;
  refused(a, "query rows [-1, 1)");
  a.query_begin = 0;
  a.query_end = 2;
  CHECK(kvfuse::ref::sparse_attention(a) == Status::success);
}

TEST_CASE("attention_softmax_row (the CPU backend's softmax): fp64 two-pass softmax, masked keys exactly 0") {
  // Base-2 scores as the callers form them: natural-log scores times log2(e); −inf where masked.
  std::mt19937 rng(77);
  std::uniform_real_distribution<float> score(-30.0f, 30.0f);
  for (const std::int64_t n : {1, 2, 63, 64, 65, 1000}) {
    CAPTURE(n);
    std::vector<float> natural(static_cast<std::size_t>(n));
    std::vector<float> row(natural.size());
    for (std::size_t j = 0; j < natural.size(); ++j) {
      const bool masked = j % 3 == 1;  // never the first key: every row sees one
      natural[j] = masked ? -std::numeric_limits<float>::infinity() : score(rng);
      row[j] = masked ? kvfuse::detail::attention_neg_inf()
                      : natural[j] * kvfuse::detail::attention_score_factor(1.0f);
    }
    double mx = -kInf;
    for (const float s : natural) mx = std::max(mx, static_cast<double>(s));
    double sum = 0;
    for (const float s : natural) sum += std::exp(static_cast<double>(s) - mx);
    const float lse = kvfuse::detail::attention_softmax_row(row.data(), n);
    CHECK(std::fabs(static_cast<double>(lse) - (mx + std::log(sum))) <= 1e-5 * (1.0 + std::fabs(mx)));
    double total = 0;
    for (std::size_t j = 0; j < row.size(); ++j) {
      CAPTURE(j);
      const double want = std::exp(static_cast<double>(natural[j]) - mx) / sum;
      if (j % 3 == 1) CHECK(row[j] == 0.0f);
      CHECK(std::fabs(static_cast<double>(row[j]) - want) <= 1e-5 * want + 1e-12);
      total += row[j];
    }
    CHECK(total == doctest::Approx(1.0).epsilon(1e-5));
  }
  // A row without a visible key: every probability 0 (not NaN), LSE −inf.
  std::vector<float> none(5, kvfuse::detail::attention_neg_inf());
  CHECK(kvfuse::detail::attention_softmax_row(none.data(), 5) == -kInf);
  for (const float p : none) CHECK(p == 0.0f);
}

}  // namespace unit_sparse_attention_ref
