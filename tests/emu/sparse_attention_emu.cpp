// CPU emulation of the sparse-query attention kernels (tests/emu/README.md): the real
// kernels/include/kvfuse/cuda/sparse_attention.cuh, its inline PTX (mma.sync, ldmatrix, cp.async) replaced
// by warp-collective emulations (ptx_emu.inc) by transform_kernel.py, every CUDA thread a fiber, run
// through the launcher (attention, split-KV combine, chunk-, query- and self-mass epilogues) and compared with
// kvfuse::ref::sparse_attention: O (relative Frobenius error; fp32 accumulation order and the bf16/f16
// rounding of P differ from the reference), LSE, chunk mass, self mass and query mass, that O is not written
// outside its view, and that an epilogue nobody asked for launches nothing.
//   kvfuse-emu-sparse_attention [--deferred | --eager] [case index]      (default: every case in both modes)
// --eager lands every cp.async when it is issued (a missing barrier before a buffer refill then corrupts
// what other warps still read); by default copies land at cp.async.wait_group (a read of a tile before the
// wait, or before the barrier after it, sees poisoned shared memory).
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "kvfuse/harness/ref/sparse_attention.hpp"
#include "sparse_attention_emu.cuh"

namespace {

using kvfuse::DType;

struct Case {
  DType dtype;
  int head_dim, q_heads, kv_heads, keys, queries;
  bool strided;   // padded token strides for Q/O, HND with padding for K/V
  bool shuffled;  // query positions unsorted
  bool dense;     // every token is a query at its own position (dense causal attention)
  bool workspace; // pass the split-KV workspace the launcher asks for
  std::vector<std::int64_t> chunks;  // chunk_starts (C + 1 entries) or empty: no mass epilogue
  bool self = false;                 // self-mass epilogue (each query's own key row)
  std::int64_t query = -1;           // query-mass epilogue over the last `query` entries; -1: none
};

int failures = 0;
std::mt19937 rng(7);
std::string current_case;  // emu::label: named in an emulator abort

template <class T>
void run(int index, const Case& c) {
  std::vector<std::int32_t> kp(static_cast<std::size_t>(c.keys)), qp;
  if (c.dense) {
    for (int j = 0; j < c.keys; ++j) kp[static_cast<std::size_t>(j)] = j;
    qp = kp;
  } else {
    std::uniform_int_distribution<int> gap(1, 3);
    int pos = 3;
    for (auto& x : kp) {
      x = pos;
      pos += gap(rng);
    }
    auto pool = kp;
    std::shuffle(pool.begin(), pool.end(), rng);
    qp.assign(pool.begin(), pool.begin() + std::min(c.queries - 2, c.keys));
    qp.push_back(2);                                   // sees no key: O = 0, LSE = -inf
    qp.push_back(kp.empty() ? 100 : kp.back() + 5);  // sees every key
    std::sort(qp.begin(), qp.end());
    if (c.shuffled) std::shuffle(qp.begin(), qp.end(), rng);
  }
  const auto S = static_cast<std::int64_t>(qp.size());
  const std::int64_t N = c.keys, hq = c.q_heads, hkv = c.kv_heads, d = c.head_dim;
  const std::int64_t q_ts = c.strided ? hq * (d + 8) + 8 : hq * d, q_hs = c.strided ? d + 8 : d;
  const std::int64_t k_ts = c.strided ? d : hkv * d, k_hs = c.strided ? N * d + 8 : d;
  const auto span = [](std::int64_t n, std::int64_t h, std::int64_t dd, std::int64_t ts, std::int64_t hs) {
    return n == 0 ? std::int64_t{8} : (n - 1) * ts + (h - 1) * hs + dd;
  };
  std::uniform_real_distribution<float> uniform(-1.0f, 1.0f);
  const auto random_tensor = [&](std::int64_t count) {
    std::vector<T> v(static_cast<std::size_t>(count + 8));
    for (auto& x : v) x = kvfuse::from_float<T>(uniform(rng));
    return v;
  };
  const auto q = random_tensor(span(S, hq, d, q_ts, q_hs));
  const auto k = random_tensor(span(N, hkv, d, k_ts, k_hs));
  const auto v = random_tensor(span(N, hkv, d, k_ts, k_hs));
  std::vector<T> o_kernel(static_cast<std::size_t>(span(S, hq, d, q_ts, q_hs)), T{0xFFFF}), o_ref(o_kernel.size());
  std::vector<float> lse_kernel(static_cast<std::size_t>(S * hq), NAN), lse_ref(lse_kernel.size(), NAN);
  const std::int64_t C = c.chunks.empty() ? 0 : static_cast<std::int64_t>(c.chunks.size()) - 1;
  std::vector<float> mass_kernel(static_cast<std::size_t>(std::max<std::int64_t>(S * C, 1)), NAN);
  std::vector<float> mass_ref(mass_kernel.size(), NAN);
  // Self rows: the key at the query's position (queries are drawn from the key positions), else any key.
  std::vector<std::int32_t> self_rows(static_cast<std::size_t>(S));
  for (std::int64_t i = 0; i < S && N > 0; ++i) {
    const auto at = std::lower_bound(kp.begin(), kp.end(), qp[static_cast<std::size_t>(i)]);
    self_rows[static_cast<std::size_t>(i)] = at != kp.end() && *at == qp[static_cast<std::size_t>(i)]
                                                 ? static_cast<std::int32_t>(at - kp.begin())
                                                 : static_cast<std::int32_t>(i % N);
  }
  std::vector<float> self_kernel(static_cast<std::size_t>(S) + 4, NAN), self_ref(self_kernel.size(), NAN);
  std::vector<float> query_kernel(static_cast<std::size_t>(N) + 4, NAN), query_ref(query_kernel.size(), NAN);
  const std::int64_t query_rows = std::min(c.query, S);

  kvfuse::SparseAttentionArgs a;
  a.dtype = c.dtype;
  a.num_queries = S;
  a.num_keys = N;
  a.num_q_heads = hq;
  a.num_kv_heads = hkv;
  a.head_dim = d;
  a.q = q.data();
  a.k = k.data();
  a.v = v.data();
  a.o = o_kernel.data();
  a.q_token_stride = a.o_token_stride = q_ts;
  a.q_head_stride = a.o_head_stride = q_hs;
  a.k_token_stride = a.v_token_stride = k_ts;
  a.k_head_stride = a.v_head_stride = k_hs;
  a.q_pos = qp.data();
  a.k_pos = kp.data();
  a.lse = lse_kernel.data();
  a.num_chunks = C;
  a.chunk_starts = C != 0 ? c.chunks.data() : nullptr;
  a.mass = C != 0 ? mass_kernel.data() : nullptr;
  a.self_rows = c.self ? self_rows.data() : nullptr;
  a.self_mass = c.self ? self_kernel.data() : nullptr;
  a.query_begin = query_rows >= 0 ? S - query_rows : 0;
  a.query_end = query_rows >= 0 ? S : 0;
  a.query_mass = query_rows >= 0 ? query_kernel.data() : nullptr;
  std::vector<float> workspace;
  std::int64_t workspace_bytes = 0;
  if (c.workspace) {
    workspace_bytes = kvfuse::cuda::sparse_attention_workspace_bytes(a);
    workspace.assign(static_cast<std::size_t>(workspace_bytes / 4 + 4), NAN);
    a.workspace = workspace.data();
    a.workspace_bytes = workspace_bytes;
  }
  char name[200];
  std::snprintf(name, sizeof name,
                "%s case %d: %s d=%d Hq=%d Hkv=%d N=%d S=%lld%s%s%s C=%lld%s query=%lld workspace=%lld",
                emu::eager_copies ? "eager" : "deferred", index, kvfuse::dtype_name(c.dtype), c.head_dim, c.q_heads,
                c.kv_heads, c.keys, static_cast<long long>(S), c.strided ? " strided" : "",
                c.shuffled ? " unsorted" : "", c.dense ? " dense" : "", static_cast<long long>(C),
                c.self ? " self" : "", static_cast<long long>(query_rows), static_cast<long long>(workspace_bytes));

  current_case = name;
  emu::label = current_case.c_str();
  const long long launches_before = emu::launches;
  const long long self_before = emu::launches_by_kernel["sparse_attention_self_mass_kernel<T, D>"];
  const long long mass_before = emu::launches_by_kernel["sparse_attention_mass_kernel<T, D>"];
  if (const auto s = kvfuse::cuda::sparse_attention(a); s != kvfuse::Status::success) {
    std::printf("FAIL %s: launcher returned %s: %s\n", name, kvfuse::status_string(s), kvfuse::last_status_message());
    ++failures;
    return;
  }
  const long long launches = emu::launches - launches_before;
  const bool self_ran = emu::launches_by_kernel["sparse_attention_self_mass_kernel<T, D>"] != self_before;
  const bool mass_ran = emu::launches_by_kernel["sparse_attention_mass_kernel<T, D>"] != mass_before;
  int unwanted = 0;  // an epilogue launched for nobody
  if (self_ran != (c.self && S > 0) || mass_ran != (S > 0 && (C > 0 || query_rows > 0))) ++unwanted;
  kvfuse::SparseAttentionArgs r = a;
  r.o = o_ref.data();
  r.lse = lse_ref.data();
  r.mass = C != 0 ? mass_ref.data() : nullptr;
  r.self_mass = c.self ? self_ref.data() : nullptr;
  r.query_mass = query_rows >= 0 ? query_ref.data() : nullptr;
  if (const auto s = kvfuse::ref::sparse_attention(r); s != kvfuse::Status::success) {
    std::printf("FAIL %s: reference returned %s: %s\n", name, kvfuse::status_string(s), kvfuse::last_status_message());
    ++failures;
    return;
  }

  std::vector<bool> in_view(o_kernel.size(), false);
  double diff = 0.0, norm = 0.0, worst = 0.0;
  std::int64_t worst_at = -1;
  int non_finite = 0, lse_bad = 0, mass_bad = 0, outside_written = 0;
  for (std::int64_t i = 0; i < S; ++i)
    for (std::int64_t h = 0; h < hq; ++h) {
      for (std::int64_t e = 0; e < d; ++e) {
        const auto at = static_cast<std::size_t>(i * q_ts + h * q_hs + e);
        in_view[at] = true;
        const double x = kvfuse::to_float(o_kernel[at]), y = kvfuse::to_float(o_ref[at]);
        if (!std::isfinite(x)) {
          if (++non_finite <= 3)
            std::printf("  %s: O[query %lld][head %lld][%lld] = %g (not finite)\n", name, static_cast<long long>(i),
                        static_cast<long long>(h), static_cast<long long>(e), x);
          continue;
        }
        diff += (x - y) * (x - y);
        norm += y * y;
        if (std::fabs(x - y) > worst) {
          worst = std::fabs(x - y);
          worst_at = static_cast<std::int64_t>(at);
        }
      }
      const float l1 = lse_kernel[static_cast<std::size_t>(i * hq + h)];
      const float l2 = lse_ref[static_cast<std::size_t>(i * hq + h)];
      const bool ok = std::isinf(l2) ? l1 == l2 : std::fabs(l1 - l2) <= 1e-4f * (1.0f + std::fabs(l2));
      if (!ok && ++lse_bad <= 3)
        std::printf("  %s: LSE[query %lld (pos %d)][head %lld] = %g, reference %g\n", name,
                    static_cast<long long>(i), qp[static_cast<std::size_t>(i)], static_cast<long long>(h),
                    static_cast<double>(l1), static_cast<double>(l2));
    }
  for (std::size_t x = 0; x < o_kernel.size(); ++x) {
    if (in_view[x]) continue;
    if (o_kernel[x].bits != 0xFFFF && ++outside_written <= 3)
      std::printf("  %s: O element %zu outside the output view was written\n", name, x);
  }
  for (std::int64_t x = 0; x < S * C; ++x) {
    const float m1 = mass_kernel[static_cast<std::size_t>(x)], m2 = mass_ref[static_cast<std::size_t>(x)];
    if (!(std::fabs(m1 - m2) <= 1e-4f * std::max(1.0f, std::fabs(m2))) && ++mass_bad <= 3)
      std::printf("  %s: mass[query %lld][chunk %lld] = %g, reference %g\n", name, static_cast<long long>(x / C),
                  static_cast<long long>(x % C), static_cast<double>(m1), static_cast<double>(m2));
  }
  // Self and query mass: within 1e-4 of the reference, and nothing written past S or N (or at all when not asked).
  const auto compare = [&](const char* what, const std::vector<float>& got, const std::vector<float>& want,
                           std::int64_t count, bool asked) {
    int bad = 0;
    for (std::size_t x = 0; x < got.size(); ++x) {
      const bool inside = asked && static_cast<std::int64_t>(x) < count;
      const bool ok = inside ? std::fabs(got[x] - want[x]) <= 1e-4f * std::max(1.0f, std::fabs(want[x]))
                             : std::isnan(got[x]);
      if (!ok && ++bad <= 3)
        std::printf("  %s: %s[%zu] = %g, reference %g%s\n", name, what, x, static_cast<double>(got[x]),
                    static_cast<double>(want[x]), inside ? "" : " (must not be written)");
    }
    return bad;
  };
  const int self_bad = compare("self_mass", self_kernel, self_ref, S, c.self);
  const int query_bad = compare("query_mass", query_kernel, query_ref, N, query_rows >= 0);
  const double rel = std::sqrt(diff / std::max(norm, 1e-30));
  const double tol = c.dtype == DType::bf16 ? 1e-2 : 5e-3;
  const bool pass = rel <= tol && non_finite == 0 && lse_bad == 0 && mass_bad == 0 && outside_written == 0 &&
                    self_bad == 0 && query_bad == 0 && unwanted == 0;
  failures += pass ? 0 : 1;
  std::printf("%s %s: %lld launches, O relative error %.3g (tolerance %.0e, worst |diff| %.3g at element %lld), "
              "non-finite O %d, bad LSE %d, bad mass %d, bad self mass %d, bad query mass %d, writes outside O %d, "
              "unwanted epilogue launches %d\n",
              pass ? "ok  " : "FAIL", name, launches, rel, tol, worst, static_cast<long long>(worst_at), non_finite,
              lse_bad, mass_bad, self_bad, query_bad, outside_written, unwanted);
}

}  // namespace

int main(int argc, char** argv) {
  bool deferred = true;
  bool eager = true;
  int only = -1;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--eager") == 0)
      deferred = false;
    else if (std::strcmp(argv[i], "--deferred") == 0)
      eager = false;
    else
      only = std::atoi(argv[i]);
  }
  for (const bool mode_eager : {false, true}) {
    if (mode_eager ? !eager : !deferred) continue;
    emu::eager_copies = mode_eager;
    std::printf("cp.async copies land %s\n",
                mode_eager ? "when issued (--eager)" : "at cp.async.wait_group (--deferred)");
    int index = 0;
    const auto go = [&](auto tag, const Case& c) {
      if (only < 0 || only == index) run<decltype(tag)>(index, c);
      ++index;
    };
    const kvfuse::bf16 bf16{};
    const kvfuse::f16 f16{};
    // dtype, d, Hq, Hkv, N, S, strided, unsorted, dense, workspace, chunk_starts, self mass, query rows
    go(bf16, {DType::bf16, 64, 2, 1, 150, 70, false, false, false, false, {}, true, 6});  // query tile tail, GQA
    go(f16, {DType::f16, 128, 3, 1, 130, 20, true, false, false, false, {}, false, 20});  // strided, d = 128
    go(bf16, {DType::bf16, 64, 2, 2, 100, 100, false, false, true, false, {}, true, 30});  // dense causal
    go(bf16, {DType::bf16, 128, 2, 1, 200, 40, false, true, false, false, {0, 50, 50, 129, 200}, true, 5});  // empty
    go(f16, {DType::f16, 64, 2, 1, 1100, 30, false, false, false, true, {10, 700, 1000}, true, 4});  // split KV + mass
    go(bf16, {DType::bf16, 128, 1, 1, 1, 2, false, false, false, true, {0, 1}, true, 1});  // one key
    go(bf16, {DType::bf16, 128, 9, 3, 333, 80, true, false, false, true, {}, true});  // GQA 3, strided, self only
    go(f16, {DType::f16, 64, 32, 8, 200, 70, false, false, false, false, {0, 64, 128, 200}});  // many heads
    go(bf16, {DType::bf16, 64, 4, 1, 2100, 50, false, true, false, true, {0, 1000, 2100}, false, 0});  // unsorted
    go(f16, {DType::f16, 128, 2, 2, 1500, 129, true, false, false, true, {5, 64, 65, 1499}, true, 70});  // 3 tiles
    go(bf16, {DType::bf16, 64, 2, 1, 0, 3, false, false, false, true, {}, false, 3});  // no keys
    go(bf16, {DType::bf16, 128, 4, 2, 300, 300, false, false, true, true, {0, 100, 300}});  // dense + mass
    go(f16, {DType::f16, 64, 8, 2, 900, 200, false, false, false, true, {}, false, 20});  // query mass alone, split
  }
  const long long self_launches = emu::launches_by_kernel["sparse_attention_self_mass_kernel<T, D>"];
  if (self_launches == 0) {
    ++failures;
    std::printf("FAIL the self-mass kernel never ran\n");
  }
  std::printf("emu.sparse_attention: %d failed, %lld kernel launches (%lld self mass), %lld emulated threads\n",
              failures, emu::launches, self_launches, emu::emulated_threads);
  return failures == 0 ? 0 : 1;
}
