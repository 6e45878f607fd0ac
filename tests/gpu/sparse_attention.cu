// kvfuse::cuda::sparse_attention against an fp64 CPU reference written here (two-pass softmax, the mask
// written out as pos_k <= pos_q), on fresh random inputs with poisoned outputs: bf16 / f16, head_dim 64 /
// 128, GQA, packed and strided layouts, query and key counts that are not multiples of the 64-row tiles,
// queries before and after every key, unsorted queries, dense causal, and the chunk-mass epilogue; the self-
// and query-mass epilogues against the CPU reference kvfuse::ref::sparse_attention on the same inputs.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>

#include "harness.cuh"
#include "kvfuse/cuda/sparse_attention.cuh"
#include "kvfuse/harness/ref/sparse_attention.hpp"

using kvfuse::DType;
using kvfuse::SparseAttentionArgs;
using kvfuse::gpu_test::DeviceBuffer;
using kvfuse::gpu_test::rng;
using kvfuse::gpu_test::strf;

namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

struct Config {
  const char* label;
  DType dtype;
  int d, hq, hkv, n, s;
  bool strided;             // K/V HND, Q/O padded NHD; else packed NHD (strides left 0)
  bool dense;               // every key is a query, positions 0..N-1 (checked against causal-by-index)
  bool shuffle_queries;     // query positions in random order
  std::vector<std::int64_t> chunk_starts;  // empty: no epilogue
};

// A [tokens, heads, d] tensor in a physical layout; `logical` holds the stored values as floats,
// packed [tokens][heads][d].
template <class T>
struct HostTensor {
  std::int64_t tokens, heads, d, ts, hs;
  std::vector<T> storage;
  std::vector<float> logical;

  HostTensor(std::int64_t n, std::int64_t h, std::int64_t dim, std::int64_t token_stride, std::int64_t head_stride)
      : tokens(n), heads(h), d(dim), ts(token_stride), hs(head_stride) {
    const std::int64_t span = n == 0 ? 8 : (n - 1) * ts + (h - 1) * hs + dim;
    storage = kvfuse::gpu_test::random_values<T>(static_cast<std::size_t>(span), -1.0f, 1.0f);
    logical.resize(static_cast<std::size_t>(n * h * dim));
    for (std::int64_t t = 0; t < n; ++t)
      for (std::int64_t k = 0; k < h; ++k)
        for (std::int64_t e = 0; e < dim; ++e)
          logical[static_cast<std::size_t>((t * h + k) * dim + e)] =
              kvfuse::to_float(storage[static_cast<std::size_t>(t * ts + k * hs + e)]);
  }
  double at(const std::vector<T>& phys, std::int64_t t, std::int64_t k, std::int64_t e) const {
    return kvfuse::to_float(phys[static_cast<std::size_t>(t * ts + k * hs + e)]);
  }
};

struct Reference {
  std::vector<double> o, lse, mass;
};

// fp64, two passes. Visibility: pos_k[j] <= pos_q[i], or j <= i when `by_index` (dense causal).
Reference reference(const std::vector<float>& q, const std::vector<float>& k, const std::vector<float>& v,
                    const std::vector<std::int32_t>& qp, const std::vector<std::int32_t>& kp, int hq, int hkv, int d,
                    const std::vector<std::int64_t>& chunks, bool by_index) {
  const auto s = static_cast<std::int64_t>(qp.size());
  const auto n = static_cast<std::int64_t>(kp.size());
  const std::int64_t c_count = chunks.empty() ? 0 : static_cast<std::int64_t>(chunks.size()) - 1;
  const double scale = 1.0 / std::sqrt(static_cast<double>(d));
  Reference r;
  r.o.assign(static_cast<std::size_t>(s * hq * d), 0.0);
  r.lse.assign(static_cast<std::size_t>(s * hq), -kInf);
  r.mass.assign(static_cast<std::size_t>(s * c_count), 0.0);
  std::vector<double> w(static_cast<std::size_t>(n));
  for (std::int64_t i = 0; i < s; ++i)
    for (int h = 0; h < hq; ++h) {
      const int g = h / (hq / hkv);
      double mx = -kInf;
      for (std::int64_t j = 0; j < n; ++j) {
        const bool visible = by_index ? j <= i : kp[static_cast<std::size_t>(j)] <= qp[static_cast<std::size_t>(i)];
        double dot = -kInf;
        if (visible) {
          dot = 0;
          for (int e = 0; e < d; ++e)
            dot += static_cast<double>(q[static_cast<std::size_t>((i * hq + h) * d + e)]) *
                   k[static_cast<std::size_t>((j * hkv + g) * d + e)];
          dot *= scale;
        }
        w[static_cast<std::size_t>(j)] = dot;
        mx = std::max(mx, dot);
      }
      if (mx == -kInf) continue;
      double sum = 0;
      for (std::int64_t j = 0; j < n; ++j) sum += std::exp(w[static_cast<std::size_t>(j)] - mx);
      const double lse = mx + std::log(sum);
      r.lse[static_cast<std::size_t>(i * hq + h)] = lse;
      for (std::int64_t j = 0; j < n; ++j) {
        const double p = std::exp(w[static_cast<std::size_t>(j)] - lse);
        if (p == 0) continue;
        for (int e = 0; e < d; ++e)
          r.o[static_cast<std::size_t>((i * hq + h) * d + e)] += p * v[static_cast<std::size_t>((j * hkv + g) * d + e)];
        for (std::int64_t c = 0; c < c_count; ++c)
          if (j >= chunks[static_cast<std::size_t>(c)] && j < chunks[static_cast<std::size_t>(c + 1)])
            r.mass[static_cast<std::size_t>(i * c_count + c)] += p;
      }
    }
  return r;
}

// Compares one launch's outputs with the fp64 reference; prints the worst rows on failure.
template <class T>
void check_outputs(const Config& cfg, const Reference& ref, const HostTensor<T>& o, const std::vector<T>& o_phys,
                   const std::vector<float>& lse, const std::vector<float>& mass, const std::vector<std::int32_t>& qp) {
  const auto s = static_cast<std::int64_t>(qp.size());
  const std::int64_t n = cfg.n, hq = cfg.hq, d = cfg.d;
  const std::int64_t c_count = cfg.chunk_starts.empty() ? 0 : static_cast<std::int64_t>(cfg.chunk_starts.size()) - 1;
  std::vector<double> o_got(ref.o.size());
  for (std::int64_t i = 0; i < s; ++i)
    for (std::int64_t h = 0; h < hq; ++h)
      for (std::int64_t e = 0; e < d; ++e) o_got[static_cast<std::size_t>((i * hq + h) * d + e)] = o.at(o_phys, i, h, e);
  const double tol = cfg.dtype == DType::bf16 ? 1e-2 : 5e-3;
  const double err = kvfuse::gpu_test::relative_error(o_got, ref.o);
  std::printf("    O relative error %.3g (tolerance %.3g)\n", err, tol);
  KVFUSE_GPU_CHECK(err <= tol, "%s: O relative error %g > %g", cfg.label, err, tol);
  if (!(err <= tol)) {  // the worst rows, to tell a tile-boundary bug from a layout bug
    int shown = 0;
    for (std::int64_t i = 0; i < s && shown < 8; ++i)
      for (std::int64_t h = 0; h < hq && shown < 8; ++h) {
        double diff = 0, norm = 0;
        for (std::int64_t e = 0; e < d; ++e) {
          const auto x = static_cast<std::size_t>((i * hq + h) * d + e);
          diff += (o_got[x] - ref.o[x]) * (o_got[x] - ref.o[x]);
          norm += ref.o[x] * ref.o[x];
        }
        if (!(diff <= tol * tol * std::max(norm, 1e-12))) {
          ++shown;
          std::printf("    row %lld (tile %lld, pos %d) head %lld: |diff| %.3g |ref| %.3g, o[0] got %.5g want %.5g\n",
                      static_cast<long long>(i), static_cast<long long>(i / 64), qp[static_cast<std::size_t>(i)],
                      static_cast<long long>(h), std::sqrt(diff), std::sqrt(norm),
                      o_got[static_cast<std::size_t>((i * hq + h) * d)], ref.o[static_cast<std::size_t>((i * hq + h) * d)]);
        }
      }
  }
  if (cfg.strided) {  // the padding between O's heads and tokens is untouched
    std::vector<bool> used(o_phys.size(), false);
    for (std::int64_t i = 0; i < s; ++i)
      for (std::int64_t h = 0; h < hq; ++h)
        for (std::int64_t e = 0; e < d; ++e) used[static_cast<std::size_t>(i * o.ts + h * o.hs + e)] = true;
    std::size_t touched = 0;
    for (std::size_t x = 0; x < o_phys.size(); ++x)
      if (!used[x] && std::memcmp(&o_phys[x], &o.storage[x], sizeof(T)) != 0) ++touched;
    KVFUSE_GPU_CHECK(touched == 0, "%s: %zu padding elements of O were written", cfg.label, touched);
  }
  int lse_bad = 0;
  for (std::size_t r = 0; r < ref.lse.size(); ++r) {
    const double got = lse[r];
    const bool ok = ref.lse[r] == -kInf ? got == -kInf : std::fabs(got - ref.lse[r]) <= 1e-3 * (1 + std::fabs(ref.lse[r]));
    if (!ok && ++lse_bad <= 5)
      std::printf("    LSE row %zu head %zu: got %.7g want %.7g\n", r / static_cast<std::size_t>(hq),
                  r % static_cast<std::size_t>(hq), got, ref.lse[r]);
  }
  KVFUSE_GPU_CHECK(lse_bad == 0, "%s: %d LSE values off", cfg.label, lse_bad);
  // A query that sees no key: O = 0 exactly.
  for (std::int64_t i = 0; i < s; ++i) {
    if (ref.lse[static_cast<std::size_t>(i * hq)] != -kInf) continue;
    bool zero = true;
    for (std::int64_t h = 0; h < hq; ++h)
      for (std::int64_t e = 0; e < d; ++e) zero = zero && o_got[static_cast<std::size_t>((i * hq + h) * d + e)] == 0.0;
    KVFUSE_GPU_CHECK(zero, "%s: query %lld sees no key but O != 0", cfg.label, static_cast<long long>(i));
  }
  if (c_count > 0) {
    int mass_bad = 0;
    for (std::size_t r = 0; r < ref.mass.size(); ++r) {
      const double got = mass[r];
      if (!(std::fabs(got - ref.mass[r]) <= 1e-3 * std::max(1.0, ref.mass[r])) && ++mass_bad <= 5)
        std::printf("    mass query %zu chunk %zu: got %.7g want %.7g\n", r / static_cast<std::size_t>(c_count),
                    r % static_cast<std::size_t>(c_count), got, ref.mass[r]);
    }
    KVFUSE_GPU_CHECK(mass_bad == 0, "%s: %d mass values off", cfg.label, mass_bad);
    const bool covering = cfg.chunk_starts.front() == 0 && cfg.chunk_starts.back() == n;
    if (covering) {
      for (std::int64_t i = 0; i < s; ++i) {
        double total = 0;
        for (std::int64_t c = 0; c < c_count; ++c) total += mass[static_cast<std::size_t>(i * c_count + c)];
        const double want = ref.lse[static_cast<std::size_t>(i * hq)] == -kInf ? 0.0 : static_cast<double>(hq);
        KVFUSE_GPU_CHECK(std::fabs(total - want) <= 1e-3 * hq, "%s: query %lld: sum of chunk mass %g, want %g",
                         cfg.label, static_cast<long long>(i), total, want);
      }
    }
  }
}

// Runs one configuration without and (if the launcher would split on this device) with a workspace; the
// workspace size goes to *workspace_bytes when given.
template <class T>
void run_case(const Config& cfg, std::int64_t* workspace_bytes = nullptr) {
  std::printf("  case %s: %s d=%d Hq=%d Hkv=%d N=%d S=%d %s%s%s chunks=%zu\n", cfg.label, kvfuse::dtype_name(cfg.dtype),
              cfg.d, cfg.hq, cfg.hkv, cfg.n, cfg.s, cfg.strided ? "strided" : "NHD", cfg.dense ? " dense" : "",
              cfg.shuffle_queries ? " shuffled" : "", cfg.chunk_starts.empty() ? 0 : cfg.chunk_starts.size() - 1);
  // Positions: keys from 3 with gaps of 1..3; queries a random subset of them plus one before and one after
  // every key. Dense: keys and queries at 0..N-1.
  std::vector<std::int32_t> kp(static_cast<std::size_t>(cfg.n));
  std::vector<std::int32_t> qp;
  if (cfg.dense) {
    for (int j = 0; j < cfg.n; ++j) kp[static_cast<std::size_t>(j)] = j;
    qp = kp;
  } else {
    std::uniform_int_distribution<int> gap(1, 3);
    std::int32_t pos = 3;
    for (auto& x : kp) {
      x = pos;
      pos += gap(rng());
    }
    std::vector<std::int32_t> pool = kp;
    std::shuffle(pool.begin(), pool.end(), rng());
    qp.assign(pool.begin(), pool.begin() + std::min<std::ptrdiff_t>(cfg.s - 2, cfg.n));
    qp.push_back(2);  // before every key: sees none
    qp.push_back(kp.empty() ? 100 : kp.back() + 5);
    std::sort(qp.begin(), qp.end());
    if (cfg.shuffle_queries) std::shuffle(qp.begin(), qp.end(), rng());
  }
  const auto s = static_cast<std::int64_t>(qp.size());
  const std::int64_t n = cfg.n, hq = cfg.hq, hkv = cfg.hkv, d = cfg.d;

  HostTensor<T> q = cfg.strided ? HostTensor<T>(s, hq, d, hq * (d + 8) + 8, d + 8) : HostTensor<T>(s, hq, d, hq * d, d);
  HostTensor<T> k = cfg.strided ? HostTensor<T>(n, hkv, d, d, n * d) : HostTensor<T>(n, hkv, d, hkv * d, d);
  HostTensor<T> v = cfg.strided ? HostTensor<T>(n, hkv, d, d, n * d) : HostTensor<T>(n, hkv, d, hkv * d, d);
  HostTensor<T> o = cfg.strided ? HostTensor<T>(s, hq, d, hq * (d + 8) + 8, d + 8) : HostTensor<T>(s, hq, d, hq * d, d);
  const std::int64_t c_count = cfg.chunk_starts.empty() ? 0 : static_cast<std::int64_t>(cfg.chunk_starts.size()) - 1;

  DeviceBuffer<T> dq(q.storage.size()), dk(k.storage.size()), dv(v.storage.size()), d_o(o.storage.size());
  DeviceBuffer<std::int32_t> dqp(std::max<std::size_t>(qp.size(), 1)), dkp(std::max<std::size_t>(kp.size(), 1));
  DeviceBuffer<float> dlse(static_cast<std::size_t>(s * hq));
  DeviceBuffer<float> dmass(static_cast<std::size_t>(std::max<std::int64_t>(s * c_count, 1)));
  DeviceBuffer<std::int64_t> dchunks(std::max<std::size_t>(cfg.chunk_starts.size(), 1));
  dq.upload(q.storage);
  dk.upload(k.storage);
  dv.upload(v.storage);
  dqp.upload(qp);
  dkp.upload(kp);
  dchunks.upload(cfg.chunk_starts);

  SparseAttentionArgs a;
  a.dtype = cfg.dtype;
  a.num_queries = s;
  a.num_keys = n;
  a.num_q_heads = hq;
  a.num_kv_heads = hkv;
  a.head_dim = d;
  a.q = dq.data();
  a.k = dk.data();
  a.v = dv.data();
  a.o = d_o.data();
  if (cfg.strided) {
    a.q_token_stride = q.ts;
    a.q_head_stride = q.hs;
    a.k_token_stride = k.ts;
    a.k_head_stride = k.hs;
    a.v_token_stride = v.ts;
    a.v_head_stride = v.hs;
    a.o_token_stride = o.ts;
    a.o_head_stride = o.hs;
  }
  a.q_pos = dqp.data();
  a.k_pos = dkp.data();
  a.lse = dlse.data();
  a.num_chunks = c_count;
  a.chunk_starts = c_count > 0 ? dchunks.data() : nullptr;
  a.mass = c_count > 0 ? dmass.data() : nullptr;
  const Reference ref = reference(q.logical, k.logical, v.logical, qp, kp, cfg.hq, cfg.hkv, cfg.d, cfg.chunk_starts,
                                  cfg.dense);
  // Without a workspace (one block per query tile and head), then with one if the launcher would split
  // the KV loops on this device.
  const std::int64_t ws_bytes = kvfuse::cuda::sparse_attention_workspace_bytes(a);
  if (workspace_bytes != nullptr) *workspace_bytes = ws_bytes;
  DeviceBuffer<float> workspace(static_cast<std::size_t>(std::max<std::int64_t>(ws_bytes / 4, 1)));
  for (const bool split : {false, true}) {
    if (split && ws_bytes == 0) break;
    std::printf("    %s\n", split ? strf("split KV, workspace %lld bytes", static_cast<long long>(ws_bytes)).c_str()
                                 : "no workspace");
    if (split) {
      workspace.poison();
      a.workspace = workspace.data();
      a.workspace_bytes = ws_bytes;
    }
    d_o.upload(o.storage);  // random bytes between the rows (strided): must stay untouched
    if (!cfg.strided) d_o.poison();
    dlse.poison();
    dmass.poison();
    KVFUSE_GPU_OK(kvfuse::cuda::sparse_attention(a));
    KVFUSE_GPU_CUDA(cudaDeviceSynchronize());
    check_outputs(cfg, ref, o, d_o.download(), dlse.download(), c_count > 0 ? dmass.download() : std::vector<float>{},
                  qp);
  }
}

}  // namespace

KVFUSE_GPU_TEST("sparse_attention: bf16 hd128 GQA 32/8, S and N not multiples of 64") {
  run_case<kvfuse::bf16>({"bf16-128", DType::bf16, 128, 32, 8, 1000, 150, false, false, false, {}});
}

KVFUSE_GPU_TEST("sparse_attention: f16 hd64 GQA 9/3 strided (HND K/V, padded Q/O)") {
  run_case<kvfuse::f16>({"f16-64-strided", DType::f16, 64, 9, 3, 777, 65, true, false, false, {}});
}

KVFUSE_GPU_TEST("sparse_attention: bf16 hd64 and f16 hd128, larger prompt") {
  run_case<kvfuse::bf16>({"bf16-64-2k", DType::bf16, 64, 8, 2, 2048, 300, false, false, false, {}});
  run_case<kvfuse::f16>({"f16-128-2k", DType::f16, 128, 8, 2, 2048, 200, false, false, false, {}});
}

KVFUSE_GPU_TEST("sparse_attention: every query selected equals dense causal attention") {
  run_case<kvfuse::bf16>({"dense-bf16-64", DType::bf16, 64, 4, 1, 300, 300, false, true, false, {}});
  run_case<kvfuse::f16>({"dense-f16-128", DType::f16, 128, 6, 3, 200, 200, false, true, false, {}});
}

KVFUSE_GPU_TEST("sparse_attention: unsorted query positions") {
  run_case<kvfuse::bf16>({"shuffled", DType::bf16, 128, 4, 2, 500, 140, false, false, true, {}});
}

KVFUSE_GPU_TEST("sparse_attention: tiny shapes (one key, two queries)") {
  run_case<kvfuse::bf16>({"tiny", DType::bf16, 64, 2, 2, 1, 2, false, false, false, {}});
  run_case<kvfuse::f16>({"small", DType::f16, 128, 3, 1, 63, 3, true, false, false, {}});
}

KVFUSE_GPU_TEST("sparse_attention: chunk mass epilogue") {
  // Covering chunks with one empty chunk and boundaries inside 64-key tiles; then chunks covering a part.
  run_case<kvfuse::bf16>({"mass-covering", DType::bf16, 128, 8, 2, 700, 90, false, false, false,
                          {0, 100, 100, 250, 513, 700}});
  run_case<kvfuse::f16>({"mass-partial", DType::f16, 64, 9, 3, 600, 70, true, false, false, {37, 64, 300}});
}

KVFUSE_GPU_TEST("sparse_attention: split KV (few queries, long prompt) and split mass") {
  // 1 query tile x 4 heads: the launcher splits the 64 KV tiles (8 splits on a 132-SM GPU).
  std::int64_t bytes = 0;
  run_case<kvfuse::bf16>({"split-bf16-128", DType::bf16, 128, 4, 1, 4096, 40, false, false, false, {}}, &bytes);
  KVFUSE_GPU_CHECK(bytes > 0, "the split configuration asked for no workspace");
  run_case<kvfuse::f16>({"split-f16-64-strided", DType::f16, 64, 6, 2, 3000, 100, true, false, false, {}});
  run_case<kvfuse::bf16>({"split-mass", DType::bf16, 64, 4, 2, 2000, 40, false, false, false,
                          {0, 300, 301, 1024, 1500, 2000}});
}

namespace {

// The self- and query-mass epilogues (with the chunk mass next to them when `chunks`) against
// kvfuse::ref::sparse_attention on the same inputs (the reference is checked against fp64 in
// tests/unit/sparse_attention_ref.cpp): within 1e-3 of max(1, |ref|), outputs poisoned first, with and without
// the split workspace. The engine's shape: keys are the prompt's rows at positions 0..N-1, the queries a
// sorted random subset of the rows with the last row, each query's own row its position, the query rows the
// last `query_rows` entries.
template <class T>
void run_epilogues(DType dtype, int d, int hq, int hkv, int n, int s, int query_rows, bool chunks) {
  std::printf("  epilogues %s d=%d Hq=%d Hkv=%d N=%d S=%d query rows %d%s\n", kvfuse::dtype_name(dtype), d, hq, hkv, n,
              s, query_rows, chunks ? " + chunk mass" : "");
  std::vector<std::int32_t> kp(static_cast<std::size_t>(n));
  for (int j = 0; j < n; ++j) kp[static_cast<std::size_t>(j)] = j;
  std::vector<std::int32_t> pool(kp.begin(), kp.end() - 1);
  std::shuffle(pool.begin(), pool.end(), rng());
  std::vector<std::int32_t> qp(pool.begin(), pool.begin() + (s - 1));
  qp.push_back(n - 1);
  std::sort(qp.begin(), qp.end());
  const std::vector<std::int64_t> starts = chunks ? std::vector<std::int64_t>{0, n / 3, n / 3, n - 50, n}
                                                  : std::vector<std::int64_t>{};
  const std::int64_t c_count = chunks ? 4 : 0;
  const auto q = kvfuse::gpu_test::random_values<T>(static_cast<std::size_t>(s * hq * d));
  const auto k = kvfuse::gpu_test::random_values<T>(static_cast<std::size_t>(n * hkv * d));
  const auto v = kvfuse::gpu_test::random_values<T>(static_cast<std::size_t>(n * hkv * d));
  DeviceBuffer<T> dq(q.size()), dk(k.size()), dv(v.size()), d_o(q.size());
  DeviceBuffer<std::int32_t> dqp(qp.size()), dkp(kp.size());
  DeviceBuffer<float> dlse(static_cast<std::size_t>(s * hq)), dself(static_cast<std::size_t>(s) + 8);
  DeviceBuffer<float> dquery(static_cast<std::size_t>(n) + 8);
  DeviceBuffer<float> dmass(static_cast<std::size_t>(std::max<std::int64_t>(s * c_count, 1)));
  DeviceBuffer<std::int64_t> dstarts(std::max<std::size_t>(starts.size(), 1));
  dq.upload(q);
  dk.upload(k);
  dv.upload(v);
  dqp.upload(qp);
  dkp.upload(kp);
  dstarts.upload(starts);

  SparseAttentionArgs a;
  a.dtype = dtype;
  a.num_queries = s;
  a.num_keys = n;
  a.num_q_heads = hq;
  a.num_kv_heads = hkv;
  a.head_dim = d;
  a.q = dq.data();
  a.k = dk.data();
  a.v = dv.data();
  a.o = d_o.data();
  a.q_pos = dqp.data();
  a.k_pos = dkp.data();
  a.lse = dlse.data();
  a.num_chunks = c_count;
  a.chunk_starts = chunks ? dstarts.data() : nullptr;
  a.mass = chunks ? dmass.data() : nullptr;
  a.self_rows = dqp.data();  // positions are rows
  a.self_mass = dself.data();
  a.query_begin = s - query_rows;
  a.query_end = s;
  a.query_mass = dquery.data();

  // The reference on host copies.
  std::vector<T> o_ref(q.size());
  std::vector<float> lse_ref(static_cast<std::size_t>(s * hq)), self_ref(static_cast<std::size_t>(s));
  std::vector<float> query_ref(static_cast<std::size_t>(n));
  std::vector<float> mass_ref(static_cast<std::size_t>(std::max<std::int64_t>(s * c_count, 1)));
  SparseAttentionArgs r = a;
  r.q = q.data();
  r.k = k.data();
  r.v = v.data();
  r.o = o_ref.data();
  r.q_pos = qp.data();
  r.k_pos = kp.data();
  r.lse = lse_ref.data();
  r.chunk_starts = chunks ? starts.data() : nullptr;
  r.mass = chunks ? mass_ref.data() : nullptr;
  r.self_rows = qp.data();
  r.self_mass = self_ref.data();
  r.query_mass = query_ref.data();
  KVFUSE_GPU_OK(kvfuse::ref::sparse_attention(r));

  const auto compare = [](const char* what, const std::vector<float>& got, const std::vector<float>& want,
                          std::size_t count) {
    int bad = 0;
    for (std::size_t x = 0; x < count; ++x)
      if (!(std::fabs(got[x] - want[x]) <= 1e-3 * std::max(1.0f, std::fabs(want[x]))) && ++bad <= 5)
        std::printf("    %s[%zu]: got %.7g want %.7g\n", what, x, static_cast<double>(got[x]),
                    static_cast<double>(want[x]));
    for (std::size_t x = count; x < got.size(); ++x)
      if (!std::isnan(got[x]) && ++bad <= 5) std::printf("    %s[%zu] past the end was written\n", what, x);
    return bad;
  };
  const std::int64_t ws_bytes = kvfuse::cuda::sparse_attention_workspace_bytes(a);
  DeviceBuffer<float> workspace(static_cast<std::size_t>(std::max<std::int64_t>(ws_bytes / 4, 1)));
  for (const bool split : {false, true}) {
    if (split && ws_bytes == 0) break;
    a.workspace = split ? workspace.data() : nullptr;
    a.workspace_bytes = split ? ws_bytes : 0;
    dself.poison();
    dquery.poison();
    dmass.poison();
    KVFUSE_GPU_OK(kvfuse::cuda::sparse_attention(a));
    KVFUSE_GPU_CUDA(cudaDeviceSynchronize());
    const int self_bad = compare("self_mass", dself.download(), self_ref, static_cast<std::size_t>(s));
    const int query_bad = compare("query_mass", dquery.download(), query_ref, static_cast<std::size_t>(n));
    const int mass_bad =
        chunks ? compare("mass", dmass.download(), mass_ref, static_cast<std::size_t>(s * c_count)) : 0;
    KVFUSE_GPU_CHECK(self_bad == 0 && query_bad == 0 && mass_bad == 0,
                     "%s: %d self-mass, %d query-mass, %d chunk-mass values off", split ? "split" : "no workspace",
                     self_bad, query_bad, mass_bad);
  }
}

}  // namespace

KVFUSE_GPU_TEST("sparse_attention: self- and query-mass epilogues equal the CPU reference") {
  run_epilogues<kvfuse::bf16>(DType::bf16, 128, 32, 8, 1000, 150, 20, false);  // query rows in 1 tile
  run_epilogues<kvfuse::f16>(DType::f16, 64, 9, 3, 777, 130, 70, true);      // over 2 tiles, chunk mass too
  run_epilogues<kvfuse::bf16>(DType::bf16, 64, 4, 1, 4096, 40, 40, true);    // split KV: every query a query row
}

KVFUSE_GPU_TEST("sparse_attention: launcher refusals") {
  DeviceBuffer<kvfuse::bf16> buf(64 * 64);
  DeviceBuffer<std::int32_t> pos(64);
  DeviceBuffer<float> lse(64);
  SparseAttentionArgs a;
  a.num_queries = 1;
  a.num_keys = 1;
  a.num_q_heads = 1;
  a.num_kv_heads = 1;
  a.head_dim = 64;
  a.q = a.k = a.v = buf.data();
  a.o = buf.data();
  a.q_pos = a.k_pos = pos.data();
  a.lse = lse.data();
  const auto expect = [](SparseAttentionArgs x, kvfuse::Status want, const char* what) {
    const kvfuse::Status got = kvfuse::cuda::sparse_attention(x);
    std::printf("    %s -> %s: %s\n", what, kvfuse::status_string(got), kvfuse::last_status_message());
    KVFUSE_GPU_CHECK(got == want, "%s: got %s", what, kvfuse::status_string(got));
  };
  SparseAttentionArgs x = a;
  x.head_dim = 96;
  expect(x, kvfuse::Status::unsupported, "head_dim 96");
  x = a;
  x.dtype = DType::f32;
  expect(x, kvfuse::Status::unsupported, "f32");
  x = a;
  x.k_token_stride = 68;
  expect(x, kvfuse::Status::unsupported, "stride 68");
  x = a;
  x.num_q_heads = 3;
  x.num_kv_heads = 2;
  expect(x, kvfuse::Status::invalid_argument, "Hq 3, Hkv 2");
  x = a;
  x.q = buf.data() + 1;
  expect(x, kvfuse::Status::unsupported, "misaligned q");
  x = a;
  x.num_queries = 0;  // nothing to compute: success, and no workspace (zero query tiles to split)
  expect(x, kvfuse::Status::success, "no queries");
  KVFUSE_GPU_CHECK(kvfuse::cuda::sparse_attention_workspace_bytes(x) == 0, "no queries: a workspace was asked for");
}
