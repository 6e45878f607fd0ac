// kvfuse::cuda::kv_deviation, top_k_tokens and hkvd_select against their CPU references (kvfuse/harness/ref/kv_topk.hpp)
// and an fp64 deviation loop / a stable-sort selection written here; top_k_tokens also against the full-sort
// baseline (cub radix sort).
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <vector>

#include "harness.cuh"
#include "kvfuse/cuda/kv_topk.cuh"
#include "kvfuse/harness/ref/kv_topk.hpp"

using kvfuse::DType;
using kvfuse::KVDeviationArgs;
using kvfuse::TopKArgs;
using kvfuse::gpu_test::DeviceBuffer;
using kvfuse::gpu_test::rng;

namespace {

struct DevCase {
  std::int64_t tokens, heads, dim;
  bool hnd;
  std::int64_t pad;     // elements after each token row (NHD) or head plane (HND)
  std::int64_t offset;  // elements the tensors start after their allocation (1: misaligned, scalar path)
  bool with_rows;
};

template <class T>
void run_deviation(const DevCase& c, DType dtype) {
  const std::int64_t rows = c.with_rows ? c.tokens + 3 : c.tokens;
  auto strides = [&](std::int64_t n) {
    struct S {
      std::int64_t token, head, total;
    };
    if (c.hnd) return S{c.dim, n * c.dim + c.pad, c.heads * (n * c.dim + c.pad) + c.offset};
    return S{c.heads * c.dim + c.pad, c.dim, n * (c.heads * c.dim + c.pad) + c.offset};
  };
  const auto rs = strides(c.tokens);
  const auto cs = strides(rows);
  const std::vector<T> rec = kvfuse::gpu_test::random_values<T>(static_cast<std::size_t>(rs.total), -2.0f, 2.0f);
  const std::vector<T> cac = kvfuse::gpu_test::random_values<T>(static_cast<std::size_t>(cs.total), -2.0f, 2.0f);
  std::vector<std::int32_t> row_map(static_cast<std::size_t>(c.tokens));
  std::uniform_int_distribution<std::int32_t> pick(0, static_cast<std::int32_t>(rows - 1));
  for (auto& r : row_map) r = pick(rng());

  DeviceBuffer<T> d_rec(rec.size());
  DeviceBuffer<T> d_cac(cac.size());
  DeviceBuffer<std::int32_t> d_rows(row_map.size());
  DeviceBuffer<float> d_dev(static_cast<std::size_t>(c.tokens));
  d_rec.upload(rec);
  d_cac.upload(cac);
  d_rows.upload(row_map);
  d_dev.poison();

  KVDeviationArgs a;
  a.dtype = dtype;
  a.num_tokens = c.tokens;
  a.num_heads = c.heads;
  a.head_dim = c.dim;
  a.recomputed_token_stride = rs.token;
  a.recomputed_head_stride = rs.head;
  a.cached_token_stride = cs.token;
  a.cached_head_stride = cs.head;
  a.num_cached_rows = c.with_rows ? rows : 0;
  a.recomputed = d_rec.data() + c.offset;
  a.cached = d_cac.data() + c.offset;
  a.deviation = d_dev.data();
  a.cached_rows = c.with_rows ? d_rows.data() : nullptr;
  KVFUSE_GPU_OK(kvfuse::cuda::kv_deviation(a));
  KVFUSE_GPU_CUDA(cudaDeviceSynchronize());
  const std::vector<float> got = d_dev.download();

  std::vector<double> expected(static_cast<std::size_t>(c.tokens));
  for (std::int64_t t = 0; t < c.tokens; ++t) {
    const std::int64_t row = c.with_rows ? row_map[static_cast<std::size_t>(t)] : t;
    double sum = 0;
    for (std::int64_t h = 0; h < c.heads; ++h) {
      for (std::int64_t e = 0; e < c.dim; ++e) {
        const double x = kvfuse::to_float(rec[static_cast<std::size_t>(c.offset + t * rs.token + h * rs.head + e)]);
        const double y = kvfuse::to_float(cac[static_cast<std::size_t>(c.offset + row * cs.token + h * cs.head + e)]);
        sum += (x - y) * (x - y);
      }
    }
    expected[static_cast<std::size_t>(t)] = sum;
  }
  std::vector<float> cpu(static_cast<std::size_t>(c.tokens));
  KVDeviationArgs h = a;
  h.recomputed = rec.data() + c.offset;
  h.cached = cac.data() + c.offset;
  h.deviation = cpu.data();
  h.cached_rows = c.with_rows ? row_map.data() : nullptr;
  KVFUSE_GPU_OK(kvfuse::ref::kv_deviation(h));

  const std::vector<double> got_d(got.begin(), got.end());
  const std::vector<double> cpu_d(cpu.begin(), cpu.end());
  const double err = kvfuse::gpu_test::relative_error(got_d, expected);
  const double err_cpu = kvfuse::gpu_test::relative_error(got_d, cpu_d);
  double worst = 0;
  std::size_t worst_at = 0;
  for (std::size_t t = 0; t < expected.size(); ++t) {
    const double e = std::fabs(got_d[t] - expected[t]) / std::max(expected[t], 1e-30);
    if (!(e <= worst)) {
      worst = e;
      worst_at = t;
    }
  }
  KVFUSE_GPU_CHECK(err <= 1e-5 && err_cpu <= 1e-5 && worst <= 1e-5,
                   "%s tokens %lld heads %lld dim %lld %s pad %lld offset %lld rows %d: rel err vs fp64 %.3g, vs "
                   "ref %.3g, worst token %zu: got %.9g expected %.9g",
                   kvfuse::dtype_name(dtype), static_cast<long long>(c.tokens), static_cast<long long>(c.heads),
                   static_cast<long long>(c.dim), c.hnd ? "HND" : "NHD", static_cast<long long>(c.pad),
                   static_cast<long long>(c.offset), c.with_rows ? 1 : 0, err, err_cpu, worst_at,
                   static_cast<double>(got_d[worst_at]), expected[worst_at]);
}

enum class Scores { distinct, three_values, all_equal, squared_normal, special };

std::vector<float> make_scores(std::int64_t n, Scores kind) {
  std::vector<float> s(static_cast<std::size_t>(n));
  std::uniform_real_distribution<float> uniform(0.0f, 100.0f);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::uniform_int_distribution<int> small(0, 2);
  std::uniform_int_distribution<int> ten(0, 9);
  const float special[] = {std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity(),
                           -std::numeric_limits<float>::infinity(), -0.0f, 0.0f};
  for (auto& v : s) {
    switch (kind) {
      case Scores::distinct:
        v = uniform(rng());
        break;
      case Scores::three_values:
        v = static_cast<float>(small(rng()));
        break;
      case Scores::all_equal:
        v = 0.5f;
        break;
      case Scores::squared_normal: {
        const float x = normal(rng());
        v = x * x;
        break;
      }
      case Scores::special: {
        const int p = ten(rng());
        v = p < 5 ? special[p] : uniform(rng()) - 50.0f;
        break;
      }
    }
  }
  return s;
}

const char* scores_name(Scores kind) {
  switch (kind) {
    case Scores::distinct:
      return "distinct";
    case Scores::three_values:
      return "three values";
    case Scores::all_equal:
      return "all equal";
    case Scores::squared_normal:
      return "squared normal";
    case Scores::special:
      return "NaN/inf/-0 mixed";
  }
  return "?";
}

// Indices and the first position where two index lists differ (or -1).
std::int64_t first_difference(const std::vector<std::int32_t>& a, const std::vector<std::int32_t>& b) {
  for (std::size_t i = 0; i < std::min(a.size(), b.size()); ++i)
    if (a[i] != b[i]) return static_cast<std::int64_t>(i);
  return a.size() == b.size() ? -1 : static_cast<std::int64_t>(std::min(a.size(), b.size()));
}

// Output buffers hold k indices plus this many poisoned guard entries after them: a selection of more than
// k indices (a threshold one key too low) would write there even when its first k indices are right.
constexpr std::int64_t guard = 64;

// The first guard entry (at or after k) that is no longer the poison -1, or -1.
std::int64_t first_overwritten_guard(const std::vector<std::int32_t>& out, std::int64_t k) {
  for (std::size_t i = static_cast<std::size_t>(k); i < out.size(); ++i)
    if (out[i] != -1) return static_cast<std::int64_t>(i);
  return -1;
}

void run_top_k(std::int64_t n, Scores kind) {
  const std::vector<float> scores = make_scores(n, kind);
  DeviceBuffer<float> d_scores(scores.size());
  d_scores.upload(scores);
  const std::size_t ws_bytes = kvfuse::cuda::top_k_workspace_bytes(n);
  const std::size_t sort_bytes = kvfuse::cuda::top_k_by_sort_workspace_bytes(n);
  KVFUSE_GPU_CHECK(ws_bytes > 0 && sort_bytes > 0, "workspace queries failed for n %lld", static_cast<long long>(n));
  DeviceBuffer<unsigned char> ws(ws_bytes);
  DeviceBuffer<unsigned char> sort_ws(sort_bytes);
  const std::int64_t ks[] = {1, kvfuse::top_k_count(0.15, n), n / 2, n};
  for (std::int64_t k : ks) {
    if (k < 1) continue;
    std::vector<std::int32_t> expected(static_cast<std::size_t>(k));
    TopKArgs h;
    h.scores = scores.data();
    h.indices = expected.data();
    h.num_items = n;
    h.k = k;
    KVFUSE_GPU_OK(kvfuse::ref::top_k_tokens(h));

    DeviceBuffer<std::int32_t> d_out(static_cast<std::size_t>(k + guard));
    TopKArgs a;
    a.scores = d_scores.data();
    a.indices = d_out.data();
    a.num_items = n;
    a.k = k;
    for (int rep = 0; rep < 2; ++rep) {  // twice: same result whatever the scheduling, state reset per call
      d_out.poison();
      KVFUSE_GPU_OK(kvfuse::cuda::top_k_tokens(a, ws.data(), ws.size()));
      KVFUSE_GPU_CUDA(cudaDeviceSynchronize());
      std::vector<std::int32_t> got = d_out.download();
      const std::int64_t spill = first_overwritten_guard(got, k);
      got.resize(static_cast<std::size_t>(k));
      const std::int64_t at = first_difference(got, expected);
      KVFUSE_GPU_CHECK(at < 0 && spill < 0,
                       "radix top-k n %lld k %lld %s rep %d: first difference at %lld: got %d expected %d; "
                       "first guard entry written: %lld",
                       static_cast<long long>(n), static_cast<long long>(k), scores_name(kind), rep,
                       static_cast<long long>(at), at >= 0 ? got[static_cast<std::size_t>(at)] : 0,
                       at >= 0 ? expected[static_cast<std::size_t>(at)] : 0, static_cast<long long>(spill));
      if (at >= 0 || spill >= 0) return;
    }
    if (kind == Scores::special) continue;  // the sort baseline orders -0.0 and NaN differently (documented)
    d_out.poison();
    KVFUSE_GPU_OK(kvfuse::cuda::top_k_tokens_by_sort(a, sort_ws.data(), sort_ws.size()));
    KVFUSE_GPU_CUDA(cudaDeviceSynchronize());
    std::vector<std::int32_t> sorted = d_out.download();
    const std::int64_t spill = first_overwritten_guard(sorted, k);
    sorted.resize(static_cast<std::size_t>(k));
    const std::int64_t at = first_difference(sorted, expected);
    KVFUSE_GPU_CHECK(at < 0 && spill < 0,
                     "sort baseline n %lld k %lld %s: first difference at %lld: got %d expected %d; first guard "
                     "entry written: %lld",
                     static_cast<long long>(n), static_cast<long long>(k), scores_name(kind),
                     static_cast<long long>(at), at >= 0 ? sorted[static_cast<std::size_t>(at)] : 0,
                     at >= 0 ? expected[static_cast<std::size_t>(at)] : 0, static_cast<long long>(spill));
  }
}

}  // namespace

KVFUSE_GPU_TEST("kv_deviation: every dtype, NHD/HND, padded, misaligned, cached_rows vs fp64") {
  const DevCase cases[] = {
      {1, 1, 64, false, 0, 0, false},    {37, 8, 128, false, 0, 0, false}, {1000, 8, 128, true, 0, 0, false},
      {300, 4, 64, false, 8, 0, true},   {257, 2, 256, true, 16, 0, true}, {100, 3, 3, false, 0, 0, false},
      {129, 4, 128, false, 0, 1, false}, {64, 32, 64, true, 0, 1, true},   {5000, 8, 128, false, 0, 0, true},
  };
  for (const DevCase& c : cases) {
    run_deviation<float>(c, DType::f32);
    run_deviation<kvfuse::f16>(c, DType::f16);
    run_deviation<kvfuse::bf16>(c, DType::bf16);
  }
}

KVFUSE_GPU_TEST("top_k_tokens: exact CPU-reference set at N = 1 .. 3M, ties, NaN; sort baseline agrees") {
  // (1 << 20) + 7: a last block of 7 items; 3000017: more items than radix_max_blocks blocks cover in one
  // grid-stride step.
  const std::int64_t sizes[] = {1, 100, 4096, 32768, 131072, 1 << 20, (1 << 20) + 7, 3000017};
  const Scores kinds[] = {Scores::distinct, Scores::three_values, Scores::all_equal, Scores::squared_normal,
                          Scores::special};
  for (std::int64_t n : sizes)
    if (n <= kvfuse::gpu_test::max_n())
      for (Scores kind : kinds) run_top_k(n, kind);
}

KVFUSE_GPU_TEST("kv_deviation then top_k_tokens: GPU deviations select what the CPU selects from them") {
  const std::int64_t n = 20000;
  const std::int64_t width = 8 * 128;
  const auto rec = kvfuse::gpu_test::random_values<kvfuse::bf16>(static_cast<std::size_t>(n * width));
  auto cac = rec;
  std::uniform_int_distribution<std::int64_t> pick(0, n * width - 1);
  for (int i = 0; i < 5000; ++i) cac[static_cast<std::size_t>(pick(rng()))] = kvfuse::to_bf16(0.25f);
  DeviceBuffer<kvfuse::bf16> d_rec(rec.size());
  DeviceBuffer<kvfuse::bf16> d_cac(cac.size());
  DeviceBuffer<float> d_dev(static_cast<std::size_t>(n));
  d_rec.upload(rec);
  d_cac.upload(cac);
  d_dev.poison();
  KVDeviationArgs a;
  a.recomputed = d_rec.data();
  a.cached = d_cac.data();
  a.deviation = d_dev.data();
  a.dtype = DType::bf16;
  a.num_tokens = n;
  a.num_heads = 8;
  a.head_dim = 128;
  a.recomputed_token_stride = a.cached_token_stride = width;
  a.recomputed_head_stride = a.cached_head_stride = 128;
  KVFUSE_GPU_OK(kvfuse::cuda::kv_deviation(a));
  const std::int64_t k = kvfuse::top_k_count(0.15, n);
  DeviceBuffer<std::int32_t> d_out(static_cast<std::size_t>(k));
  DeviceBuffer<unsigned char> ws(kvfuse::cuda::top_k_workspace_bytes(n));
  TopKArgs t;
  t.scores = d_dev.data();
  t.indices = d_out.data();
  t.num_items = n;
  t.k = k;
  d_out.poison();
  KVFUSE_GPU_OK(kvfuse::cuda::top_k_tokens(t, ws.data(), ws.size()));
  KVFUSE_GPU_CUDA(cudaDeviceSynchronize());
  const std::vector<float> dev = d_dev.download();
  std::vector<std::int32_t> expected(static_cast<std::size_t>(k));
  TopKArgs h = t;
  h.scores = dev.data();
  h.indices = expected.data();
  KVFUSE_GPU_OK(kvfuse::ref::top_k_tokens(h));
  const std::vector<std::int32_t> got = d_out.download();
  const std::int64_t at = first_difference(got, expected);
  KVFUSE_GPU_CHECK(at < 0, "pipeline: first difference at %lld", static_cast<long long>(at));
}

KVFUSE_GPU_TEST("top_k_tokens refuses a small or misaligned workspace and bad k") {
  DeviceBuffer<float> scores(1000);
  DeviceBuffer<std::int32_t> out(1000);
  const std::size_t need = kvfuse::cuda::top_k_workspace_bytes(1000);
  DeviceBuffer<unsigned char> ws(need + 256);
  TopKArgs a;
  a.scores = scores.data();
  a.indices = out.data();
  a.num_items = 1000;
  a.k = 10;
  KVFUSE_GPU_CHECK(kvfuse::cuda::top_k_tokens(a, ws.data(), need - 1) == kvfuse::Status::invalid_argument,
                   "a workspace one byte short was accepted");
  KVFUSE_GPU_CHECK(kvfuse::cuda::top_k_tokens(a, ws.data() + 8, need) == kvfuse::Status::invalid_argument,
                   "a misaligned workspace was accepted");
  a.k = 1001;
  KVFUSE_GPU_CHECK(kvfuse::cuda::top_k_tokens(a, ws.data(), need) == kvfuse::Status::invalid_argument,
                   "k > num_items was accepted");
  a.k = 0;  // nothing to select: success without a launch, the output untouched
  out.poison();
  KVFUSE_GPU_CHECK(kvfuse::cuda::top_k_tokens(a, ws.data(), need) == kvfuse::Status::success, "k = 0 was refused");
  KVFUSE_GPU_CUDA(cudaDeviceSynchronize());
  const std::vector<std::int32_t> untouched = out.download();
  KVFUSE_GPU_CHECK(first_overwritten_guard(untouched, 0) < 0, "k = 0 wrote index %lld",
                   static_cast<long long>(first_overwritten_guard(untouched, 0)));
}

namespace {

// Gradual filtering of one request on the GPU, checked against kvfuse::ref::hkvd_select (whose set is
// HKVDSelector::select's: tests/unit/kv_topk_ref.cpp) and a stable-sort selection written here. Rows
// [0, n): every 5th block of 1000 rows and the last `query` rows are mandatory. From S_0 = every row, three
// checks keep round(r_i * reusable) candidates (r_i = 0.25, 0.20, 0.15); scores with heavy ties, NaN and +inf
// mixed in, the mandatory entries' scores garbage (-1 for half of them).
void run_hkvd_select(std::int64_t n, std::int64_t query) {
  std::vector<std::uint8_t> mandatory(static_cast<std::size_t>(n), 0);
  std::int64_t reusable = 0;
  for (std::int64_t t = 0; t < n; ++t) {
    mandatory[static_cast<std::size_t>(t)] = (t / 1000) % 5 == 4 || t >= n - query ? 1 : 0;
    reusable += mandatory[static_cast<std::size_t>(t)] == 0 ? 1 : 0;
  }
  std::vector<std::int32_t> set(static_cast<std::size_t>(n));
  for (std::int64_t t = 0; t < n; ++t) set[static_cast<std::size_t>(t)] = static_cast<std::int32_t>(t);
  DeviceBuffer<std::uint8_t> d_mandatory(mandatory.size());
  d_mandatory.upload(mandatory);
  DeviceBuffer<std::int32_t> d_current(set.size()), d_next(set.size() + 16), d_count(1);
  DeviceBuffer<float> d_scores(set.size());
  DeviceBuffer<unsigned char> ws(kvfuse::cuda::hkvd_select_workspace_bytes(n));
  std::uniform_int_distribution<int> pick(0, 99);
  std::uniform_real_distribution<float> value(0.0f, 50.0f);
  for (const double ratio : {0.25, 0.20, 0.15}) {
    const auto size = static_cast<std::int64_t>(set.size());
    std::vector<float> scores(set.size());
    for (std::size_t i = 0; i < scores.size(); ++i) {
      const int p = pick(rng());
      scores[i] = p < 2 ? std::numeric_limits<float>::quiet_NaN()
                  : p < 4 ? std::numeric_limits<float>::infinity()
                  : p < 30 ? static_cast<float>(p % 3)
                           : value(rng());
      if (mandatory[static_cast<std::size_t>(set[i])] != 0 && p % 2 == 0) scores[i] = -1.0f;
    }
    d_current.upload(set);
    d_scores.upload(scores);
    d_next.poison();
    d_count.poison();
    kvfuse::HKVDSelectArgs a;
    a.current = d_current.data();
    a.scores = d_scores.data();
    a.mandatory = d_mandatory.data();
    a.num_current = size;
    a.num_rows = n;
    a.keep = kvfuse::top_k_count(ratio, reusable);
    a.next = d_next.data();
    a.num_next = d_count.data();
    KVFUSE_GPU_OK(kvfuse::cuda::hkvd_select(a, ws.data(), ws.size()));
    KVFUSE_GPU_CUDA(cudaDeviceSynchronize());

    std::vector<std::int32_t> ref(set.size());
    std::int32_t ref_count = -1;
    kvfuse::HKVDSelectArgs h = a;
    h.current = set.data();
    h.scores = scores.data();
    h.mandatory = mandatory.data();
    h.next = ref.data();
    h.num_next = &ref_count;
    KVFUSE_GPU_OK(kvfuse::ref::hkvd_select(h));
    ref.resize(static_cast<std::size_t>(ref_count));
    // Independently: the mandatory entries, and the best `keep` candidates by a stable sort (NaN first).
    std::vector<std::int32_t> candidates;
    for (std::int64_t i = 0; i < size; ++i)
      if (mandatory[static_cast<std::size_t>(set[static_cast<std::size_t>(i)])] == 0)
        candidates.push_back(static_cast<std::int32_t>(i));
    std::stable_sort(candidates.begin(), candidates.end(), [&](std::int32_t x, std::int32_t y) {
      const float u = scores[static_cast<std::size_t>(x)], w = scores[static_cast<std::size_t>(y)];
      if (std::isnan(u) || std::isnan(w)) return std::isnan(u) && !std::isnan(w);
      return u > w;
    });
    std::vector<std::uint8_t> keep(set.size(), 0);
    for (std::size_t c = 0; c < candidates.size() && static_cast<std::int64_t>(c) < a.keep; ++c)
      keep[static_cast<std::size_t>(candidates[c])] = 1;
    std::vector<std::int32_t> want;
    for (std::size_t i = 0; i < set.size(); ++i)
      if (keep[i] != 0 || mandatory[static_cast<std::size_t>(set[i])] != 0) want.push_back(set[i]);
    KVFUSE_GPU_CHECK(ref == want, "n %lld ratio %g: the CPU reference differs from the stable-sort selection",
                     static_cast<long long>(n), ratio);

    const std::int32_t count = d_count.download()[0];
    std::vector<std::int32_t> got = d_next.download();
    KVFUSE_GPU_CHECK(count == ref_count, "n %lld ratio %g: count %d, want %d", static_cast<long long>(n), ratio, count,
                     ref_count);
    KVFUSE_GPU_CHECK(std::all_of(got.begin() + ref_count, got.end(), [](std::int32_t x) { return x == -1; }),
                     "n %lld ratio %g: rows written past the count", static_cast<long long>(n), ratio);
    got.resize(static_cast<std::size_t>(ref_count));
    const std::int64_t at = first_difference(got, ref);
    KVFUSE_GPU_CHECK(at < 0, "n %lld ratio %g: S_{l+1} differs from the CPU reference at entry %lld",
                     static_cast<long long>(n), ratio, static_cast<long long>(at));
    set = ref;
  }
}

}  // namespace

KVFUSE_GPU_TEST("hkvd_select: gradual filtering equals the CPU reference, N = 100 .. 1M") {
  for (const std::int64_t n : {std::int64_t{100}, std::int64_t{4096}, std::int64_t{131072}, std::int64_t{1} << 20})
    run_hkvd_select(n, 37);
}

KVFUSE_GPU_TEST("hkvd_select refuses a small or misaligned workspace; keep 0 keeps the mandatory rows") {
  const std::vector<std::int32_t> rows = {0, 1, 2, 3, 4, 5};
  const std::vector<float> scores = {5, 4, 3, 2, 1, 0};
  const std::vector<std::uint8_t> mandatory = {0, 0, 1, 0, 0, 1};
  DeviceBuffer<std::int32_t> d_rows(rows.size()), d_next(rows.size()), d_count(1);
  DeviceBuffer<float> d_scores(scores.size());
  DeviceBuffer<std::uint8_t> d_mandatory(mandatory.size());
  d_rows.upload(rows);
  d_scores.upload(scores);
  d_mandatory.upload(mandatory);
  const std::size_t need = kvfuse::cuda::hkvd_select_workspace_bytes(6);
  DeviceBuffer<unsigned char> ws(need + 256);
  kvfuse::HKVDSelectArgs a;
  a.current = d_rows.data();
  a.scores = d_scores.data();
  a.mandatory = d_mandatory.data();
  a.num_current = 6;
  a.num_rows = 6;
  a.keep = 0;
  a.next = d_next.data();
  a.num_next = d_count.data();
  KVFUSE_GPU_CHECK(kvfuse::cuda::hkvd_select(a, ws.data(), need - 1) == kvfuse::Status::invalid_argument,
                   "a workspace one byte short was accepted");
  KVFUSE_GPU_CHECK(kvfuse::cuda::hkvd_select(a, ws.data() + 8, need) == kvfuse::Status::invalid_argument,
                   "a misaligned workspace was accepted");
  KVFUSE_GPU_OK(kvfuse::cuda::hkvd_select(a, ws.data(), need));
  KVFUSE_GPU_CUDA(cudaDeviceSynchronize());
  std::vector<std::int32_t> got = d_next.download();
  got.resize(static_cast<std::size_t>(d_count.download()[0]));
  KVFUSE_GPU_CHECK((got == std::vector<std::int32_t>{2, 5}), "keep 0 kept %zu rows, want the mandatory 2 and 5",
                   got.size());
  a.keep = 2;
  KVFUSE_GPU_OK(kvfuse::cuda::hkvd_select(a, ws.data(), need));
  KVFUSE_GPU_CUDA(cudaDeviceSynchronize());
  got = d_next.download();
  got.resize(static_cast<std::size_t>(d_count.download()[0]));
  KVFUSE_GPU_CHECK((got == std::vector<std::int32_t>{0, 1, 2, 5}), "keep 2 kept %zu rows, want 0, 1, 2, 5",
                   got.size());
}
