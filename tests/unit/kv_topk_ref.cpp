// harness/ref/kv_topk.hpp: the CPU references of the KV deviation (CacheBlend section 4.1) and of the deterministic
// top-k (section 4.3, ties to the lower position) that the CUDA kernels are checked against. Expected values
// come from plain loops written here: a double-precision deviation and a std::stable_sort ranking.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "kvfuse/core/prompt.hpp"
#include "kvfuse/detail/kv_deviation.hpp"
#include "kvfuse/detail/topk.hpp"
#include "kvfuse/harness/ref/kv_topk.hpp"

#include "../support/test_util.hpp"
#include "kvfuse/select/hkvd_selector.hpp"

// Each unit test file lives in its own namespace: the files are compiled together (a unity build).
namespace unit_kv_topk_ref {

using kvfuse::DType;
using kvfuse::KVDeviationArgs;
using kvfuse::Status;
using kvfuse::TopKArgs;

using kvfuse_test::message_has;

namespace {

// Independent top-k: stable sort of the indices by score descending (NaN first, as documented), take k,
// sort ascending.
std::vector<std::int32_t> expected_top_k(const std::vector<float>& scores, std::int64_t k) {
  std::vector<std::int32_t> order(scores.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](std::int32_t a, std::int32_t b) {
    const float x = scores[static_cast<std::size_t>(a)];
    const float y = scores[static_cast<std::size_t>(b)];
    if (std::isnan(x) || std::isnan(y)) return std::isnan(x) && !std::isnan(y);
    return x > y;
  });
  order.resize(static_cast<std::size_t>(k));
  std::sort(order.begin(), order.end());
  return order;
}

std::vector<std::int32_t> run_top_k(const std::vector<float>& scores, std::int64_t k) {
  std::vector<std::int32_t> out(static_cast<std::size_t>(k), -7);
  TopKArgs a;
  a.scores = scores.data();
  a.indices = out.data();
  a.num_items = static_cast<std::int64_t>(scores.size());
  a.k = k;
  REQUIRE(kvfuse::ref::top_k_tokens(a) == Status::success);
  return out;
}


}  // namespace

TEST_CASE("orderable_bits: monotone over floats, -0 like +0, NaN above +inf") {
  const float inf = std::numeric_limits<float>::infinity();
  const float denorm = std::numeric_limits<float>::denorm_min();
  const std::vector<float> ascending{-inf,   -3.3e38f, -2.0f, -1.0f, -denorm, 0.0f,
                                     denorm, 1e-30f,   1.0f,  1.5f,  3e38f,   inf};
  for (std::size_t i = 1; i < ascending.size(); ++i) {
    CAPTURE(i);
    CHECK(kvfuse::detail::orderable_bits(ascending[i - 1]) < kvfuse::detail::orderable_bits(ascending[i]));
  }
  CHECK(kvfuse::detail::orderable_bits(-0.0f) == kvfuse::detail::orderable_bits(0.0f));
  const float nan = std::numeric_limits<float>::quiet_NaN();
  CHECK(kvfuse::detail::orderable_bits(nan) == 0xFFFFFFFFu);
  CHECK(kvfuse::detail::orderable_bits(-nan) == 0xFFFFFFFFu);
  CHECK(kvfuse::detail::orderable_bits(nan) > kvfuse::detail::orderable_bits(inf));
}

TEST_CASE("top_k_key: higher score first, equal scores to the lower index") {
  using kvfuse::detail::top_k_key;
  CHECK(top_k_key(2.0f, 9) > top_k_key(1.0f, 0));
  CHECK(top_k_key(1.0f, 3) > top_k_key(1.0f, 4));
  CHECK(top_k_key(0.0f, 0) > top_k_key(0.0f, 0x7FFFFFFE));
  CHECK(top_k_key(-0.0f, 1) < top_k_key(0.0f, 0));
}

TEST_CASE("radix passes tile the 64-bit key from the top") {
  int covered = 64;
  for (int p = 0; p < kvfuse::detail::radix_passes; ++p) {
    CAPTURE(p);
    const int shift = kvfuse::detail::radix_pass_shift(p);
    const int bits = kvfuse::detail::radix_pass_bits(p);
    CHECK(shift + bits == covered);
    CHECK(bits <= 11);
    CHECK(kvfuse::detail::radix_prefix_mask(p) == (covered == 64 ? 0ull : ~((1ull << covered) - 1ull)));
    covered = shift;
  }
  CHECK(covered == 0);
  const std::uint64_t key = 0xFEDCBA9876543210ull;
  std::uint64_t rebuilt = 0;
  for (int p = 0; p < kvfuse::detail::radix_passes; ++p)
    rebuilt |= static_cast<std::uint64_t>(kvfuse::detail::radix_digit(key, p)) << kvfuse::detail::radix_pass_shift(p);
  CHECK(rebuilt == key);
}

TEST_CASE("top_k_count rounds like HKVDSelector::keep_count") {
  for (std::int64_t n : {1, 3, 7, 10, 100, 1000, 4096, 131072}) {
    for (double r : {0.0, 0.05, 0.125, 0.15, 0.29, 0.3, 0.5, 0.85, 1.0}) {
      kvfuse::HKVDConfig c;
      c.recompute_ratio = r;
      c.check_layers = {1};
      c.ratio_margins = {0.0};
      kvfuse::PromptLayout layout;
      layout.chunks.push_back({{0, n}, true});
      layout.query = {n, n + 1};
      const kvfuse::HKVDSelector selector(c, layout, 2);
      CAPTURE(n);
      CAPTURE(r);
      CHECK(kvfuse::top_k_count(r, n) == selector.keep_count(1));
    }
  }
  CHECK(kvfuse::top_k_count(0.29, 100) == 29);  // truncation would give 28
  CHECK(kvfuse::top_k_count(0.125, 4) == 1);    // 0.5 rounds up
  CHECK(kvfuse::top_k_count(1.5, 10) == 10);
  CHECK(kvfuse::top_k_count(-0.5, 10) == 0);
  CHECK(kvfuse::top_k_count(std::nan(""), 10) == 0);
  CHECK(kvfuse::top_k_count(0.5, 0) == 0);
}

TEST_CASE("top_k_tokens equals a stable-sort selection on random, tied and special scores") {
  std::mt19937 rng(1234);
  std::uniform_real_distribution<float> uniform(0.0f, 10.0f);
  std::uniform_int_distribution<int> three(0, 2);
  const float inf = std::numeric_limits<float>::infinity();
  const float nan = std::numeric_limits<float>::quiet_NaN();
  for (std::int64_t n : {1, 2, 7, 100, 1000, 5000}) {
    for (int kind = 0; kind < 5; ++kind) {
      std::vector<float> scores(static_cast<std::size_t>(n));
      for (std::size_t i = 0; i < scores.size(); ++i) {
        switch (kind) {
          case 0:
            scores[i] = uniform(rng);
            break;  // distinct
          case 1:
            scores[i] = static_cast<float>(three(rng));
            break;  // heavy ties
          case 2:
            scores[i] = 1.0f;
            break;  // all equal: index bits decide
          case 3:
            scores[i] = uniform(rng) - 5.0f;
            break;    // negatives and zero crossings
          default: {  // NaN, inf, -0, denormals mixed in
            const int pick = three(rng) + 3 * three(rng);
            const float special[] = {nan, inf, -inf, -0.0f, 0.0f, std::numeric_limits<float>::denorm_min()};
            scores[i] = pick < 6 ? special[pick] : uniform(rng);
          }
        }
      }
      for (std::int64_t k : {std::int64_t{0}, std::int64_t{1}, n / 3, (n * 15 + 50) / 100, n - 1, n}) {
        CAPTURE(n);
        CAPTURE(kind);
        CAPTURE(k);
        CHECK(run_top_k(scores, k) == expected_top_k(scores, k));
      }
    }
  }
}

TEST_CASE("top_k_tokens: ties go to the lower index") {
  const std::vector<float> scores{1, 3, 2, 3, 3, 0, 2};
  CHECK(run_top_k(scores, 2) == std::vector<std::int32_t>{1, 3});
  CHECK(run_top_k(scores, 4) == std::vector<std::int32_t>{1, 2, 3, 4});
}

TEST_CASE("top_k_tokens refuses bad sizes and pointers, naming the value") {
  std::vector<float> scores(10, 1.0f);
  std::vector<std::int32_t> out(10);
  TopKArgs a;
  a.scores = scores.data();
  a.indices = out.data();
  a.num_items = 10;
  a.k = 11;
  CHECK(kvfuse::ref::top_k_tokens(a) == Status::invalid_argument);
  CHECK(message_has("k 11"));
  a.k = -1;
  CHECK(kvfuse::ref::top_k_tokens(a) == Status::invalid_argument);
  CHECK(message_has("k -1"));
  a.k = 3;
  a.num_items = std::int64_t{1} << 31;
  CHECK(kvfuse::ref::top_k_tokens(a) == Status::invalid_argument);
  CHECK(message_has("num_items 2147483648"));
  a.num_items = 10;
  a.indices = nullptr;
  CHECK(kvfuse::ref::top_k_tokens(a) == Status::invalid_argument);
  CHECK(message_has("null pointer"));
  a.k = 0;
  CHECK(kvfuse::ref::top_k_tokens(a) == Status::success);
}

namespace {

struct DeviationCase {
  std::int64_t tokens, heads, dim;
  bool hnd;          // [heads, tokens, dim] instead of [tokens, heads, dim]
  std::int64_t pad;  // extra elements after each token row (NHD) or head plane (HND)
};

// Strides of a case: {token_stride, head_stride, total elements}.
struct Strides {
  std::int64_t token, head, total;
};

Strides strides_of(const DeviationCase& c, std::int64_t rows) {
  if (c.hnd) return {c.dim, rows * c.dim + c.pad, c.heads * (rows * c.dim + c.pad)};
  return {c.heads * c.dim + c.pad, c.dim, rows * (c.heads * c.dim + c.pad)};
}

template <class T>
void check_deviation(const DeviationCase& c, DType dtype, bool with_rows) {
  std::mt19937 rng(static_cast<unsigned>(c.tokens * 31 + c.heads * 7 + c.dim + (c.hnd ? 1 : 0)));
  std::uniform_real_distribution<float> dist(-2.0f, 2.0f);
  const std::int64_t cached_rows_count = with_rows ? c.tokens + 5 : c.tokens;
  const Strides rs = strides_of(c, c.tokens);
  const Strides cs = strides_of(c, cached_rows_count);
  std::vector<T> rec(static_cast<std::size_t>(rs.total));
  std::vector<T> cac(static_cast<std::size_t>(cs.total));
  for (auto& v : rec) v = kvfuse::from_float<T>(dist(rng));
  for (auto& v : cac) v = kvfuse::from_float<T>(dist(rng));
  std::vector<std::int32_t> rows(static_cast<std::size_t>(c.tokens));
  for (std::size_t t = 0; t < rows.size(); ++t)
    rows[t] = static_cast<std::int32_t>((t * 7 + 3) % static_cast<std::size_t>(cached_rows_count));

  std::vector<float> dev(static_cast<std::size_t>(c.tokens), -1.0f);
  KVDeviationArgs a;
  a.recomputed = rec.data();
  a.cached = cac.data();
  a.deviation = dev.data();
  a.dtype = dtype;
  a.num_tokens = c.tokens;
  a.num_heads = c.heads;
  a.head_dim = c.dim;
  a.recomputed_token_stride = rs.token;
  a.recomputed_head_stride = rs.head;
  a.cached_token_stride = cs.token;
  a.cached_head_stride = cs.head;
  if (with_rows) {
    a.cached_rows = rows.data();
    a.num_cached_rows = cached_rows_count;
  }
  REQUIRE(kvfuse::ref::kv_deviation(a) == Status::success);
  for (std::int64_t t = 0; t < c.tokens; ++t) {
    const std::int64_t row = with_rows ? rows[static_cast<std::size_t>(t)] : t;
    double expected = 0;
    for (std::int64_t h = 0; h < c.heads; ++h) {
      for (std::int64_t e = 0; e < c.dim; ++e) {
        const double x = kvfuse::to_float(rec[static_cast<std::size_t>(t * rs.token + h * rs.head + e)]);
        const double y = kvfuse::to_float(cac[static_cast<std::size_t>(row * cs.token + h * cs.head + e)]);
        expected += (x - y) * (x - y);
      }
    }
    CAPTURE(t);
    CHECK(std::fabs(dev[static_cast<std::size_t>(t)] - expected) <= 1e-5 * expected + 1e-30);
  }
}

}  // namespace

TEST_CASE("ref::kv_deviation equals a double loop on every dtype and layout") {
  const DeviationCase cases[] = {{1, 1, 1, false, 0},  {5, 2, 64, false, 0}, {9, 4, 128, true, 0},
                                 {7, 3, 16, false, 5}, {6, 2, 32, true, 3},  {3, 8, 256, false, 0}};
  for (const DeviationCase& c : cases) {
    for (bool with_rows : {false, true}) {
      CAPTURE(c.tokens);
      CAPTURE(c.heads);
      CAPTURE(c.dim);
      CAPTURE(c.hnd);
      CAPTURE(with_rows);
      check_deviation<float>(c, DType::f32, with_rows);
      check_deviation<kvfuse::f16>(c, DType::f16, with_rows);
      check_deviation<kvfuse::bf16>(c, DType::bf16, with_rows);
    }
  }
}

TEST_CASE("ref::kv_deviation on contiguous fp32 rows is kv_row_deviation bit for bit") {
  const std::int64_t tokens = 11;
  const std::int64_t heads = 4;
  const std::int64_t dim = 32;
  std::mt19937 rng(99);
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  std::vector<float> rec(static_cast<std::size_t>(tokens * heads * dim));
  std::vector<float> cac(rec.size());
  for (auto& v : rec) v = dist(rng);
  for (auto& v : cac) v = dist(rng);
  std::vector<float> dev(static_cast<std::size_t>(tokens));
  KVDeviationArgs a;
  a.recomputed = rec.data();
  a.cached = cac.data();
  a.deviation = dev.data();
  a.dtype = DType::f32;
  a.num_tokens = tokens;
  a.num_heads = heads;
  a.head_dim = dim;
  a.recomputed_token_stride = a.cached_token_stride = heads * dim;
  a.recomputed_head_stride = a.cached_head_stride = dim;
  REQUIRE(kvfuse::ref::kv_deviation(a) == Status::success);
  for (std::int64_t t = 0; t < tokens; ++t) {
    const float expected = kvfuse::detail::kv_token_deviation(rec.data(), cac.data(), heads * dim, t, heads, dim);
    CAPTURE(t);
    CHECK(std::memcmp(&dev[static_cast<std::size_t>(t)], &expected, sizeof(float)) == 0);
  }
}

TEST_CASE("ref::kv_deviation refuses bad arguments, naming the value") {
  std::vector<float> x(64, 0.0f);
  std::vector<float> dev(4, -1.0f);
  std::vector<std::int32_t> rows{0, 1, 9, 2};
  KVDeviationArgs a;
  a.recomputed = x.data();
  a.cached = x.data();
  a.deviation = dev.data();
  a.dtype = DType::f32;
  a.num_tokens = 4;
  a.num_heads = 2;
  a.head_dim = 8;
  a.recomputed_token_stride = a.cached_token_stride = 16;
  a.recomputed_head_stride = a.cached_head_stride = 8;
  a.cached_rows = rows.data();
  a.num_cached_rows = 4;
  CHECK(kvfuse::ref::kv_deviation(a) == Status::invalid_argument);
  CHECK(message_has("cached_rows[2] = 9"));
  CHECK(dev[0] == -1.0f);  // nothing written
  a.cached_rows = nullptr;
  a.head_dim = 0;
  CHECK(kvfuse::ref::kv_deviation(a) == Status::invalid_argument);
  CHECK(message_has("head_dim 0"));
  a.head_dim = 8;
  a.num_heads = -3;
  CHECK(kvfuse::ref::kv_deviation(a) == Status::invalid_argument);
  CHECK(message_has("num_heads -3"));
  a.num_heads = 2;
  a.cached_head_stride = -8;
  CHECK(kvfuse::ref::kv_deviation(a) == Status::invalid_argument);
  CHECK(message_has("head -8"));
  a.cached_head_stride = 8;
  a.dtype = static_cast<DType>(7);
  CHECK(kvfuse::ref::kv_deviation(a) == Status::unsupported);
  CHECK(message_has("dtype 7"));
  a.dtype = DType::f32;
  a.deviation = nullptr;
  CHECK(kvfuse::ref::kv_deviation(a) == Status::invalid_argument);
  CHECK(message_has("null pointer"));
}

// ------------------------------------------------------------------------------ gradual filtering (hkvd_select)

namespace {

struct Selected {
  Status status;
  std::vector<std::int32_t> rows;
};

// `keep` of run_hkvd_select: the selector's keep count of the layer.
constexpr std::int64_t selector_keep = std::numeric_limits<std::int64_t>::min();

// ref::hkvd_select on S_l = `current`, with the mandatory rows of `selector`'s layout.
Selected run_hkvd_select(const kvfuse::HKVDSelector& selector, int layer, const kvfuse::TokenSet& current,
                         const std::vector<float>& scores, std::int64_t keep) {
  const std::int64_t n = selector.num_tokens();
  std::vector<std::uint8_t> mandatory(static_cast<std::size_t>(n));
  for (std::int64_t t = 0; t < n; ++t) mandatory[static_cast<std::size_t>(t)] = selector.is_reusable(t) ? 0 : 1;
  const std::vector<std::int32_t> rows(current.begin(), current.end());
  std::vector<std::int32_t> next(current.size() + 1, -7);
  std::int32_t count = -1;
  kvfuse::HKVDSelectArgs a;
  a.current = rows.data();
  a.scores = scores.data();
  a.mandatory = mandatory.data();
  a.num_current = static_cast<std::int64_t>(rows.size());
  a.num_rows = n;
  a.keep = keep == selector_keep ? selector.keep_count(layer) : keep;
  a.next = next.data();
  a.num_next = &count;
  Selected out{kvfuse::ref::hkvd_select(a), {}};
  if (out.status == Status::success) {
    CHECK(next[static_cast<std::size_t>(count)] == -7);  // nothing past the count
    out.rows.assign(next.begin(), next.begin() + count);
  }
  return out;
}

std::vector<std::int32_t> rows_of(const kvfuse::TokenSet& s) { return {s.begin(), s.end()}; }

}  // namespace

TEST_CASE("hkvd_select by hand: the mandatory rows stay, the best candidates fill the keep count") {
  // Chunks [0, 4) cached, [4, 6) uncached, [6, 10) cached; query [10, 12). Reusable: 8 rows; r = 0.25 with one
  // check on layer 1: keep round(0.25 * 8) = 2.
  kvfuse::PromptLayout layout = kvfuse::PromptLayout::from_lengths({4, 2, 4}, 2);
  layout.chunks[1].cached = false;
  kvfuse::HKVDConfig c;
  c.recompute_ratio = 0.25;
  c.check_layers = {1};
  c.ratio_margins = {0.0};
  const kvfuse::HKVDSelector selector(c, layout, 2);
  REQUIRE(selector.keep_count(1) == 2);
  const kvfuse::TokenSet all = selector.initial();
  // Rows 0..11; the mandatory rows 4, 5, 10, 11 get scores that would win (they must not take a slot).
  const std::vector<float> scores{1, 5, 2, 5, 99, 99, 0, 3, 4, 1, 99, -1};
  // Candidates by score: 1 (5), 3 (5), 8 (4), 7 (3) ...: rows 1 and 3 (the tie at 5 keeps both).
  const Selected s = run_hkvd_select(selector, 1, all, scores, selector_keep);
  REQUIRE(s.status == Status::success);
  CHECK(s.rows == std::vector<std::int32_t>{1, 3, 4, 5, 10, 11});
  CHECK(s.rows == rows_of(selector.select(1, all, scores)));
  // Three kept: row 8 (score 4) is the third.
  CHECK(run_hkvd_select(selector, 1, all, scores, 3).rows == std::vector<std::int32_t>{1, 3, 4, 5, 8, 10, 11});
  // keep 0: only the mandatory rows; keep above the candidates: S_l unchanged.
  CHECK(run_hkvd_select(selector, 1, all, scores, 0).rows == std::vector<std::int32_t>{4, 5, 10, 11});
  CHECK(run_hkvd_select(selector, 1, all, scores, 100).rows == rows_of(all));
  // A NaN candidate ranks first; equal scores go to the lower row.
  std::vector<float> with_nan = scores;
  with_nan[9] = std::numeric_limits<float>::quiet_NaN();
  CHECK(run_hkvd_select(selector, 1, all, with_nan, selector_keep).rows ==
        std::vector<std::int32_t>{1, 4, 5, 9, 10, 11});
  CHECK(rows_of(selector.select(1, all, with_nan)) == std::vector<std::int32_t>{1, 4, 5, 9, 10, 11});
}

TEST_CASE("hkvd_select equals HKVDSelector::select over gradual filtering on random layouts and scores") {
  std::mt19937 rng(99);
  std::uniform_real_distribution<float> uniform(0.0f, 10.0f);
  std::uniform_int_distribution<int> three(0, 2);
  std::uniform_int_distribution<std::int64_t> length(0, 300);
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const float inf = std::numeric_limits<float>::infinity();
  for (int trial = 0; trial < 40; ++trial) {
    std::vector<std::int64_t> lengths(static_cast<std::size_t>(1 + trial % 6));
    for (auto& l : lengths) l = length(rng);
    kvfuse::PromptLayout layout = kvfuse::PromptLayout::from_lengths(lengths, 1 + trial % 17);
    for (std::size_t i = 1; i < layout.chunks.size(); i += 3) layout.chunks[i].cached = false;
    kvfuse::HKVDConfig c;
    c.recompute_ratio = (trial % 5) * 0.25;  // 0, 0.25, 0.5, 0.75, 1
    const kvfuse::HKVDSelector selector(c, layout, 6);
    kvfuse::TokenSet set = selector.initial();
    for (int layer = 1; layer <= 3; ++layer) {
      std::vector<float> scores(set.size());
      for (std::size_t i = 0; i < set.size(); ++i) {
        const int kind = trial % 4;
        scores[i] = kind == 0   ? uniform(rng)
                    : kind == 1 ? static_cast<float>(three(rng))
                    : kind == 2 ? 2.0f
                                : (three(rng) == 0 ? (three(rng) == 0 ? nan : three(rng) == 0 ? inf : -0.0f)
                                                   : uniform(rng));
        if (!selector.is_reusable(set[i]) && i % 2 == 0) scores[i] = -1.0f;  // ignored for mandatory rows
      }
      const kvfuse::TokenSet want = selector.select(layer, set, scores);
      const Selected got = run_hkvd_select(selector, layer, set, scores, selector_keep);
      CAPTURE(trial);
      CAPTURE(layer);
      REQUIRE(got.status == Status::success);
      CHECK(got.rows == rows_of(want));
      set = want;
    }
  }
}

TEST_CASE("hkvd_select refuses what HKVDSelector refuses, naming the value") {
  const kvfuse::PromptLayout layout = kvfuse::PromptLayout::from_lengths({4}, 2);  // query rows 4, 5
  kvfuse::HKVDConfig c;
  c.check_layers = {1};
  c.ratio_margins = {0.0};
  const kvfuse::HKVDSelector selector(c, layout, 2);
  const std::vector<float> ok{1, 2, 3, 4, 0, 0};
  CHECK(run_hkvd_select(selector, 1, {0, 1, 2, 3, 4, 5}, ok, selector_keep).status == Status::success);
  CHECK(run_hkvd_select(selector, 1, {0, 1, 2, 3, 4, 5}, {1, -2, 3, 4, 0, 0}, selector_keep).status ==
        Status::invalid_argument);
  CHECK(message_has("score -2 of row 1"));
  CHECK(run_hkvd_select(selector, 1, {0, 2, 1, 3, 4, 5}, ok, selector_keep).status == Status::invalid_argument);
  CHECK(message_has("current[2] = 1"));
  CHECK(run_hkvd_select(selector, 1, {0, 1, 2, 3, 4}, ok, selector_keep).status == Status::invalid_argument);
  CHECK(message_has("1 of the 2 mandatory rows"));
  CHECK(run_hkvd_select(selector, 1, {0, 1, 2, 3, 4, 5}, ok, -4).status == Status::invalid_argument);
  CHECK(message_has("keep -4"));

  kvfuse::HKVDSelectArgs a;
  std::int32_t count = 0;
  a.num_next = &count;
  a.num_current = 3;
  a.num_rows = 2;
  CHECK(kvfuse::ref::hkvd_select(a) == Status::invalid_argument);
  CHECK(message_has("num_rows 2"));
  a.num_rows = 3;
  CHECK(kvfuse::ref::hkvd_select(a) == Status::invalid_argument);
  CHECK(message_has("null pointer"));
  a.num_next = nullptr;
  CHECK(kvfuse::ref::hkvd_select(a) == Status::invalid_argument);
  CHECK(message_has("num_next is null"));
  a = {};
  count = -1;
  a.num_next = &count;
  CHECK(kvfuse::ref::hkvd_select(a) == Status::success);  // empty S_l: empty S_{l+1}
  CHECK(count == 0);
}

}  // namespace unit_kv_topk_ref
