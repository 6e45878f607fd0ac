// CPU emulation of the KV deviation and top-k kernels (tests/emu/README.md): the real
// kernels/include/kvfuse/cuda/kv_topk.cuh, transformed by transform_kernel.py (static shared memory poisoned
// per block), every CUDA thread a fiber (warp shuffles and __syncthreads are barriers), blocks in a random
// order on every launch (grids of up to 8 blocks: all blocks at once, threads interleaved at random), CUB
// and thrust replaced by the host stubs in cuda_stub/cub and cuda_stub/thrust (CUB's temporary-storage
// protocol, temporary storage overwritten before use). Run through the launchers:
//  - kv_deviation against a double-precision loop written here (relative error <= 1e-5) and
//    kvfuse::ref::kv_deviation; the output is not written past num_tokens. f32 / f16 / bf16 x NHD / HND,
//    padded strides, misaligned pointers, odd head_dims and head rows padded to 16 bytes around a head_dim
//    that is not (the scalar path), cached_rows.
//  - top_k_tokens (radix select: 1 memset, 6 passes with a last-block ticket, stable compaction) on a
//    poisoned workspace and again on the workspace the previous call left, against kvfuse::ref::top_k_tokens
//    and an independent std::stable_sort selection, bit for bit (index sets in ascending order), nothing
//    written past k or outside the workspace. N = 1 ... 40000 and one N above 1024 blocks x 2048 items
//    (grid-stride loop); k = 0, 1, N/3, N-1, N; distinct, 3-valued, all-equal scores, NaN / +-inf / -0.0 mixed in.
//  - top_k_tokens_by_sort (iota kernel, CUB SortPairsDescending then SortKeys) on the same cases without NaN.
//  - the launchers' refusals (workspace too small or misaligned).
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <limits>
#include <numeric>
#include <random>
#include <utility>
#include <vector>

#include "kvfuse/harness/ref/kv_topk.hpp"
#include "kvfuse/select/hkvd_selector.hpp"
#include "kv_topk_emu.cuh"

namespace {

using kvfuse::DType;
using kvfuse::Status;

int failures = 0;
int deviation_runs = 0;
int topk_runs = 0;
int sort_runs = 0;
int select_runs = 0;
std::mt19937_64 rng(3);

// 256-byte aligned bytes (cudaMalloc's alignment), between two guards of 4096 bytes of 0x5A.
struct Buffer {
  static constexpr std::size_t guard = 4096;
  std::vector<std::uint64_t> words;
  std::uint8_t* data;
  std::size_t bytes;
  explicit Buffer(std::size_t n, std::uint8_t fill) : words((n + 2 * guard) / 8 + 40, 0), bytes(n) {
    data = reinterpret_cast<std::uint8_t*>(words.data()) + guard;
    data += (256 - reinterpret_cast<std::uintptr_t>(data) % 256) % 256;
    std::memset(data - guard, 0x5A, guard);
    std::memset(data, fill, bytes);
    std::memset(data + bytes, 0x5A, guard);
  }
  bool guard_intact() const {
    const auto is_guard = [](std::uint8_t b) { return b == 0x5A; };
    return std::all_of(data - guard, data, is_guard) && std::all_of(data + bytes, data + bytes + guard, is_guard);
  }
};

// ---------------------------------------------------------------------------------------------------------
// Deviation

// NHD: token_stride = heads * (dim + head_pad) + pad, head_stride = dim + head_pad; HND: token_stride = dim,
// head_stride = tokens * dim + pad. `offset` elements before the first (1: misaligned pointers).
template <class T>
void run_deviation(DType dtype, std::int64_t tokens, std::int64_t heads, std::int64_t dim, bool hnd, std::int64_t pad,
                   std::int64_t offset, bool rows_map, std::int64_t head_pad) {
  ++deviation_runs;
  const std::int64_t rows = rows_map ? tokens + 3 : tokens;
  struct Strides {
    std::int64_t token, head, total;
  };
  const auto strides = [&](std::int64_t n) {
    if (hnd) return Strides{dim, n * dim + pad, heads * (n * dim + pad) + offset + 8};
    return Strides{heads * (dim + head_pad) + pad, dim + head_pad, n * (heads * (dim + head_pad) + pad) + offset + 8};
  };
  const Strides rs = strides(tokens), cs = strides(rows);
  Buffer rb(static_cast<std::size_t>(rs.total) * sizeof(T), 0), cb(static_cast<std::size_t>(cs.total) * sizeof(T), 0);
  T* rec = reinterpret_cast<T*>(rb.data);
  T* cac = reinterpret_cast<T*>(cb.data);
  std::uniform_real_distribution<float> u(-2.0f, 2.0f);
  for (std::int64_t i = 0; i < rs.total; ++i) rec[i] = kvfuse::from_float<T>(u(rng));
  for (std::int64_t i = 0; i < cs.total; ++i) cac[i] = kvfuse::from_float<T>(u(rng));
  std::vector<std::int32_t> map(static_cast<std::size_t>(tokens));
  std::uniform_int_distribution<std::int32_t> pick(0, static_cast<std::int32_t>(rows - 1));
  for (auto& r : map) r = pick(rng);
  std::vector<float> got(static_cast<std::size_t>(tokens) + 16, std::numeric_limits<float>::quiet_NaN());
  std::vector<float> ref(got.size(), std::numeric_limits<float>::quiet_NaN());
  kvfuse::KVDeviationArgs a;
  a.dtype = dtype;
  a.num_tokens = tokens;
  a.num_heads = heads;
  a.head_dim = dim;
  a.recomputed_token_stride = rs.token;
  a.recomputed_head_stride = rs.head;
  a.cached_token_stride = cs.token;
  a.cached_head_stride = cs.head;
  a.recomputed = rec + offset;
  a.cached = cac + offset;
  a.deviation = got.data();
  a.cached_rows = rows_map ? map.data() : nullptr;
  a.num_cached_rows = rows_map ? rows : 0;
  kvfuse::KVDeviationArgs r = a;
  r.deviation = ref.data();
  const Status ks = kvfuse::cuda::kv_deviation(a);
  const Status rsts = kvfuse::ref::kv_deviation(r);
  double worst = 0.0, worst_ref = 0.0;
  bool guard_ok = true;
  for (std::size_t i = static_cast<std::size_t>(tokens); i < got.size(); ++i) guard_ok = guard_ok && std::isnan(got[i]);
  for (std::int64_t t = 0; t < tokens; ++t) {
    const std::int64_t row = rows_map ? map[static_cast<std::size_t>(t)] : t;
    double s = 0.0;
    for (std::int64_t h = 0; h < heads; ++h)
      for (std::int64_t e = 0; e < dim; ++e) {
        const double x = kvfuse::to_float(rec[offset + t * rs.token + h * rs.head + e]);
        const double y = kvfuse::to_float(cac[offset + row * cs.token + h * cs.head + e]);
        s += (x - y) * (x - y);
      }
    const double g = got[static_cast<std::size_t>(t)];
    const double e = std::fabs(g - s) / std::max(s, 1e-30);
    const double er = std::fabs(g - ref[static_cast<std::size_t>(t)]) / std::max(s, 1e-30);
    if (!(e <= worst)) worst = e;  // NaN propagates
    if (!(er <= worst_ref)) worst_ref = er;
  }
  if (ks == Status::success && rsts == Status::success && worst <= 1e-5 && worst_ref <= 1e-5 && guard_ok) return;
  ++failures;
  std::printf(
      "FAIL kv_deviation %s tokens=%lld heads=%lld dim=%lld %s pad=%lld head_pad=%lld offset=%lld cached_rows=%d: "
      "status "
      "kernel %s ref %s, worst relative error %.3g (fp64), %.3g (ref), %s\n",
      kvfuse::dtype_name(dtype), static_cast<long long>(tokens), static_cast<long long>(heads),
      static_cast<long long>(dim), hnd ? "HND" : "NHD", static_cast<long long>(pad), static_cast<long long>(head_pad),
      static_cast<long long>(offset), rows_map ? 1 : 0, kvfuse::status_string(ks), kvfuse::status_string(rsts), worst,
      worst_ref, guard_ok ? "guard intact" : "written past num_tokens");
}

// ---------------------------------------------------------------------------------------------------------
// Top-k

// The expected selection, independently: a stable sort by score, descending (every NaN above +inf, -0.0 equal
// to +0.0), the first k indices, ascending.
std::vector<std::int32_t> expected_top_k(const std::vector<float>& s, std::int64_t k) {
  std::vector<std::int32_t> idx(s.size());
  std::iota(idx.begin(), idx.end(), 0);
  std::stable_sort(idx.begin(), idx.end(), [&](std::int32_t a, std::int32_t b) {
    const float x = s[static_cast<std::size_t>(a)], y = s[static_cast<std::size_t>(b)];
    if (std::isnan(x) || std::isnan(y)) return std::isnan(x) && !std::isnan(y);
    return x > y;  // -0.0 == +0.0
  });
  idx.resize(static_cast<std::size_t>(k));
  std::sort(idx.begin(), idx.end());
  return idx;
}

const char* kind_name(int kind) {
  static const char* names[] = {"distinct", "3-valued", "all-equal", "specials(NaN,+-inf,-0)", "specials(no NaN)"};
  return names[kind];
}

std::vector<float> make_scores(std::int64_t n, int kind) {
  std::vector<float> s(static_cast<std::size_t>(n));
  std::uniform_real_distribution<float> u(0.0f, 100.0f);
  std::uniform_int_distribution<int> three(0, 2), ten(0, 9);
  const float special[] = {std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity(),
                           -std::numeric_limits<float>::infinity(), -0.0f, 0.0f};
  for (auto& v : s) {
    switch (kind) {
      case 0:
        v = u(rng);
        break;
      case 1:
        v = static_cast<float>(three(rng));
        break;
      case 2:
        v = 0.5f;
        break;
      default: {
        const int p = ten(rng);
        const int first = kind == 3 ? 0 : 1;  // kind 4: no NaN
        v = p < 5 && p >= first ? special[p] : u(rng) - 50.0f;
        if (kind == 3 && p == 0 && ten(rng) < 5) v = -v;  // negative NaN too
      }
    }
  }
  return s;
}

void report_topk(const char* op, std::int64_t n, std::int64_t k, int kind, const char* what) {
  ++failures;
  std::printf("FAIL %s n=%lld k=%lld scores=%s: %s\n", op, static_cast<long long>(n), static_cast<long long>(k),
              kind_name(kind), what);
}

// Checks `out` (num_items + 16 entries poisoned with -7, of which the first k are the result) against the
// reference and the expectation.
bool check_indices(const char* op, const std::vector<std::int32_t>& out, const std::vector<std::int32_t>& want,
                   const std::vector<std::int32_t>& ref, std::int64_t n, std::int64_t k, int kind) {
  const auto kk = static_cast<std::size_t>(k);
  for (std::size_t i = kk; i < out.size(); ++i)
    if (out[i] != -7) {
      report_topk(op, n, k, kind, "an index was written past k");
      return false;
    }
  if (!std::equal(want.begin(), want.end(), ref.begin())) {
    report_topk(op, n, k, kind, "kvfuse::ref::top_k_tokens differs from the stable-sort selection");
    return false;
  }
  for (std::size_t i = 0; i < kk; ++i)
    if (out[i] != want[i]) {
      char what[160];
      std::snprintf(what, sizeof what, "index %zu is %d, expected %d", i, out[i], want[i]);
      report_topk(op, n, k, kind, what);
      return false;
    }
  return true;
}

void run_topk(const std::vector<float>& scores, std::int64_t k, int kind, bool by_sort_too) {
  const auto n = static_cast<std::int64_t>(scores.size());
  kvfuse::TopKArgs a;
  a.scores = scores.data();
  a.num_items = n;
  a.k = k;
  std::vector<std::int32_t> ref(static_cast<std::size_t>(n) + 16, -7);
  kvfuse::TopKArgs r = a;
  r.indices = ref.data();
  if (kvfuse::ref::top_k_tokens(r) != Status::success) {
    report_topk("ref::top_k_tokens", n, k, kind, kvfuse::last_status_message());
    return;
  }
  const std::vector<std::int32_t> want = expected_top_k(scores, k);

  // Radix select: a poisoned workspace, then the same workspace again (its state left by the first call).
  const std::size_t bytes = kvfuse::cuda::top_k_workspace_bytes(n);
  Buffer ws(bytes, 0xAB);
  for (int call = 0; call < 2; ++call) {
    ++topk_runs;
    std::vector<std::int32_t> out(static_cast<std::size_t>(n) + 16, -7);
    a.indices = out.data();
    const Status s = kvfuse::cuda::top_k_tokens(a, ws.data, bytes);
    if (s != Status::success) {
      report_topk("top_k_tokens", n, k, kind, kvfuse::last_status_message());
      return;
    }
    if (!ws.guard_intact()) {
      report_topk("top_k_tokens", n, k, kind, "written outside the workspace");
      return;
    }
    if (!check_indices(call == 0 ? "top_k_tokens (poisoned workspace)" : "top_k_tokens (reused workspace)", out, want,
                       ref, n, k, kind))
      return;
    if (k > 0) {
      long long count = 0;
      std::memcpy(&count, ws.data + kvfuse::cuda::impl::topk::state_bytes + kvfuse::cuda::impl::topk::hist_bytes,
                  sizeof count);
      if (count != k) {
        report_topk("top_k_tokens", n, k, kind, "the compaction's selected count is not k");
        return;
      }
    }
  }
  if (!by_sort_too) return;
  ++sort_runs;
  const std::size_t sort_bytes = kvfuse::cuda::top_k_by_sort_workspace_bytes(n);
  Buffer sws(sort_bytes, 0xCD);
  std::vector<std::int32_t> out(static_cast<std::size_t>(n) + 16, -7);
  a.indices = out.data();
  const Status s = kvfuse::cuda::top_k_tokens_by_sort(a, sws.data, sort_bytes);
  if (s != Status::success) {
    report_topk("top_k_tokens_by_sort", n, k, kind, kvfuse::last_status_message());
    return;
  }
  if (!sws.guard_intact()) {
    report_topk("top_k_tokens_by_sort", n, k, kind, "written outside the workspace");
    return;
  }
  check_indices("top_k_tokens_by_sort", out, want, ref, n, k, kind);
}

// ---------------------------------------------------------------------------------------------------------
// Gradual filtering

// Scores of `kind` (make_scores) that HKVDSelector accepts for candidates: >= 0 or NaN (-inf becomes +inf,
// -0.0 stays).
std::vector<float> candidate_scores(std::int64_t n, int kind) {
  std::vector<float> s = make_scores(n, kind);
  for (auto& v : s)
    if (v < 0.0f) v = -v;
  return s;
}

// One request: chunks of `lengths` (every third one without stored KV) and a query of `query` rows, an
// HKVDSelector of recompute ratio r over 5 layers (checks on 1, 2, 3). From S_0 = every row, each check layer
// draws scores of `kind` for the entries of S_l (the mandatory entries' scores are garbage: negative, NaN) and
// S_{l+1} comes from HKVDSelector::select, kvfuse::ref::hkvd_select and kvfuse::cuda::hkvd_select (on a
// poisoned workspace): the same rows and count, nothing written past the count or outside the workspace.
void run_select(const std::vector<std::int64_t>& lengths, std::int64_t query, double r, int kind) {
  kvfuse::PromptLayout layout = kvfuse::PromptLayout::from_lengths(lengths, query);
  for (std::size_t c = 0; c < layout.chunks.size(); c += 3) layout.chunks[c].cached = c == 0;
  for (std::size_t c = 2; c < layout.chunks.size(); c += 3) layout.chunks[c].cached = false;
  kvfuse::HKVDConfig config;
  config.recompute_ratio = r;
  const kvfuse::HKVDSelector selector(config, layout, 5);
  const std::int64_t n = layout.num_tokens();
  std::vector<std::uint8_t> mandatory(static_cast<std::size_t>(n));
  for (std::int64_t t = 0; t < n; ++t) mandatory[static_cast<std::size_t>(t)] = selector.is_reusable(t) ? 0 : 1;
  kvfuse::TokenSet set = selector.initial();
  const auto fail = [&](int layer, const char* what) {
    ++failures;
    std::printf("FAIL hkvd_select n=%lld chunks=%zu r=%g scores=%s layer %d: %s\n", static_cast<long long>(n),
                lengths.size(), r, kind_name(kind), layer, what);
  };
  for (int layer = 1; layer <= 3; ++layer) {
    ++select_runs;
    const auto size = static_cast<std::int64_t>(set.size());
    std::vector<float> scores = candidate_scores(size, kind);
    for (std::size_t i = 0; i < set.size(); i += 2)
      if (mandatory[static_cast<std::size_t>(set[i])] != 0) scores[i] = i % 4 == 0 ? -3.0f : -NAN;
    const kvfuse::TokenSet want = selector.select(layer, set, scores);
    std::vector<std::int32_t> current(set.begin(), set.end());

    kvfuse::HKVDSelectArgs a;
    a.current = current.data();
    a.scores = scores.data();
    a.mandatory = mandatory.data();
    a.num_current = size;
    a.num_rows = n;
    a.keep = selector.keep_count(layer);
    std::vector<std::int32_t> ref(static_cast<std::size_t>(size) + 16, -7), out(ref.size(), -7);
    std::int32_t ref_count = -1, count = -1;
    a.next = ref.data();
    a.num_next = &ref_count;
    if (kvfuse::ref::hkvd_select(a) != Status::success) return fail(layer, kvfuse::last_status_message());
    const std::size_t bytes = kvfuse::cuda::hkvd_select_workspace_bytes(size);
    Buffer ws(bytes, 0xAB);
    a.next = out.data();
    a.num_next = &count;
    if (kvfuse::cuda::hkvd_select(a, ws.data, bytes) != Status::success)
      return fail(layer, kvfuse::last_status_message());
    if (!ws.guard_intact()) return fail(layer, "written outside the workspace");
    if (ref_count != static_cast<std::int32_t>(want.size()) ||
        !std::equal(want.begin(), want.end(), ref.begin(), [](std::int64_t x, std::int32_t y) { return x == y; }))
      return fail(layer, "kvfuse::ref::hkvd_select differs from HKVDSelector::select");
    if (count != ref_count || !std::equal(out.begin(), out.begin() + count, ref.begin()))
      return fail(layer, "the kernel's S_{l+1} differs from the reference");
    if (std::any_of(out.begin() + count, out.end(), [](std::int32_t x) { return x != -7; }))
      return fail(layer, "a row was written past the count");
    set = want;
  }
}

void check_refusals() {
  std::vector<float> s(5000, 1.0f);
  std::vector<std::int32_t> out(100, -7);
  kvfuse::TopKArgs a;
  a.scores = s.data();
  a.indices = out.data();
  a.num_items = 5000;
  a.k = 100;
  const std::size_t bytes = kvfuse::cuda::top_k_workspace_bytes(a.num_items);
  Buffer ws(bytes + 256, 0);
  const long long before = emu::launches;
  const bool refused = bytes > 0 && kvfuse::cuda::top_k_tokens(a, ws.data, bytes - 1) == Status::invalid_argument &&
                       kvfuse::cuda::top_k_tokens(a, nullptr, bytes) == Status::invalid_argument &&
                       kvfuse::cuda::top_k_tokens(a, ws.data + 16, bytes) == Status::invalid_argument &&
                       kvfuse::cuda::top_k_tokens_by_sort(a, ws.data, 16) == Status::invalid_argument;
  if (!refused || emu::launches != before || out[0] != -7) {
    ++failures;
    std::printf("FAIL a too small, null or misaligned workspace was not refused before any launch\n");
  }
}

}  // namespace

int main() {
  emu::block_order = emu::BlockOrder::shuffled;
  // Grids of up to 8 blocks (N <= 16384 scores, <= 64 tokens) run their blocks at once, threads interleaved at
  // random: a block that takes the ticket before all of its threads merged their histogram is exposed.
  emu::concurrent_blocks_max = 8;

  struct DeviationCase {
    std::int64_t tokens, heads, dim;
    bool hnd;
    std::int64_t pad, offset;
    bool rows;
    std::int64_t head_pad;
  };
  const DeviationCase deviation_cases[] = {
      {1, 1, 64, false, 0, 0, false, 0},
      {37, 8, 128, false, 0, 0, false, 0},
      {100, 8, 128, true, 0, 0, false, 0},
      {30, 4, 64, false, 8, 0, true, 0},
      {25, 2, 256, true, 16, 0, true, 0},
      {10, 3, 3, false, 0, 0, false, 0},
      {12, 4, 128, false, 0, 1, false, 0},
      {6, 32, 64, true, 0, 1, true, 0},
      {17, 5, 8, false, 0, 0, true, 0},
      {9, 2, 64, false, 1, 0, false, 0},
      {2000, 2, 64, false, 0, 0, true, 0},
      {1500, 4, 40, true, 0, 1, false, 0},
      // Head rows 16-byte aligned but head_dim * size is not a multiple of 16 (scalar path) for f16 / bf16.
      {20, 3, 12, false, 0, 0, false, 4},
      {15, 4, 2, false, 0, 0, true, 6},
  };
  for (const DeviationCase& c : deviation_cases) {
    run_deviation<float>(DType::f32, c.tokens, c.heads, c.dim, c.hnd, c.pad, c.offset, c.rows, c.head_pad);
    run_deviation<kvfuse::f16>(DType::f16, c.tokens, c.heads, c.dim, c.hnd, c.pad, c.offset, c.rows, c.head_pad);
    run_deviation<kvfuse::bf16>(DType::bf16, c.tokens, c.heads, c.dim, c.hnd, c.pad, c.offset, c.rows, c.head_pad);
  }
  const long long vector_launches = emu::launches_by_kernel["kv_deviation_kernel<T, true>"];
  const long long scalar_launches = emu::launches_by_kernel["kv_deviation_kernel<T, false>"];
  if (vector_launches == 0 || scalar_launches == 0) {
    ++failures;
    std::printf("FAIL the deviation's vector (%lld launches) or scalar (%lld) path never ran\n", vector_launches,
                scalar_launches);
  }

  for (std::int64_t n : {1, 2, 3, 7, 100, 255, 256, 257, 1000, 2047, 2048, 2049, 4096, 5000, 20000, 40000}) {
    for (int kind = 0; kind < 5; ++kind) {
      const std::vector<float> scores = make_scores(n, kind);
      std::vector<std::int64_t> ks = {0, 1, n / 3, n - 1, n};
      std::sort(ks.begin(), ks.end());
      ks.erase(std::unique(ks.begin(), ks.end()), ks.end());
      for (std::int64_t k : ks) run_topk(scores, k, kind, kind != 3);
    }
  }
  // More than radix_max_blocks x 2048 items: the histogram loop strides over the grid.
  {
    const std::int64_t n = 1024 * 2048 + 12345;
    run_topk(make_scores(n, 0), n / 3, 0, false);
    run_topk(make_scores(n, 1), kvfuse::top_k_count(0.15, n), 1, false);
  }
  // Gradual filtering: layouts from a few rows to 40K, recompute ratios 0 (the last check keeps no candidate),
  // 0.15, 0.5 and 1 (every candidate stays), every kind of non-negative scores.
  const std::vector<std::pair<std::vector<std::int64_t>, std::int64_t>> layouts = {
      {{5, 0, 7}, 3}, {{100, 200, 50, 300}, 20}, {{1000, 3000, 2000, 1500, 700}, 40}, {{20000, 20000}, 64}};
  for (const auto& [lengths, query] : layouts)
    for (const double r : {0.0, 0.15, 0.5, 1.0})
      for (int kind = 0; kind < 4; ++kind) run_select(lengths, query, r, kind);
  check_refusals();
  const long long radix = emu::launches_by_kernel["radix_pass_kernel<radix_threads>"];
  const long long iota = emu::launches_by_kernel["impl::topk::iota_kernel"];
  const long long ranks = emu::launches_by_kernel["impl::topk::hkvd_rank_kernel"];
  const long long flags = emu::launches_by_kernel["impl::topk::hkvd_flag_kernel"];
  if (radix == 0 || iota == 0 || ranks == 0 || flags == 0 || emu::cub_calls == 0) {
    ++failures;
    std::printf("FAIL a kernel never ran (radix passes %lld, iota %lld, hkvd rank %lld, hkvd flag %lld, CUB calls "
                "%lld)\n",
                radix, iota, ranks, flags, emu::cub_calls);
  }
  std::printf(
      "emu.kv_topk: %d deviation cases (vector launches %lld, scalar %lld), %d top_k_tokens calls, %d "
      "top_k_tokens_by_sort calls, %d hkvd_select calls, %d failed; %lld kernel launches (%lld radix passes), "
      "%lld CUB calls, %lld emulated threads\n",
      deviation_runs, vector_launches, scalar_launches, topk_runs, sort_runs, select_runs, failures, emu::launches,
      radix, emu::cub_calls, emu::emulated_threads);
  return failures == 0 ? 0 : 1;
}
