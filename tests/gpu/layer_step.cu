// The kernels composed as docs/kernels.md's example composes them: one CacheBlend-style partial-prefill
// step of a reused prompt (RoPE shift of every layer's cached K, KV deviation + top-k on a check layer,
// scatter of the recomputed rows, sparse-query attention with the chunk-mass epilogue), on the device and,
// step by step, through the CPU references on the same data. Each device step's output is compared with
// the reference fed the device's previous outputs, so a failure names the step.
#include <algorithm>
#include <cstdint>
#include <numeric>
#include <vector>

#include "harness.cuh"
#include "kvfuse/cuda/kv_scatter.cuh"
#include "kvfuse/cuda/kv_topk.cuh"
#include "kvfuse/cuda/rope.cuh"
#include "kvfuse/cuda/sparse_attention.cuh"
#include "kvfuse/harness/ref/kv_scatter.hpp"
#include "kvfuse/harness/ref/kv_topk.hpp"
#include "kvfuse/harness/ref/rope.hpp"
#include "kvfuse/harness/ref/sparse_attention.hpp"

using kvfuse::bf16;
using kvfuse::DType;
using kvfuse::gpu_test::DeviceBuffer;
using kvfuse::gpu_test::rng;

namespace {

// Elementwise: |got - want| <= one bf16 ulp of the larger magnitude (the device's sincosf and the host's
// sin/cos may round an angle one ulp apart), with a floor of 1e-5 for values near zero, whose float error
// comes from the pair's magnitude (about 1 here), not their own.
int bf16_ulp_mismatches(const std::vector<bf16>& got, const std::vector<bf16>& want) {
  int bad = 0;
  for (std::size_t i = 0; i < want.size(); ++i) {
    const float g = kvfuse::to_float(got[i]);
    const float w = kvfuse::to_float(want[i]);
    const float ulp = std::max(std::max(std::abs(w), std::abs(g)) * (1.0f / 128.0f), 1e-5f);
    if (!(std::abs(g - w) <= ulp)) ++bad;
  }
  return bad;
}

}  // namespace

KVFUSE_GPU_TEST("a partial-prefill step composed of the kernels equals the CPU references step by step") {
  constexpr std::int64_t n = 700, layers = 2, hq = 8, hkv = 2, d = 128;
  constexpr std::int64_t row = hkv * d;
  const std::int64_t layer_elems = n * row;

  // The prompt: two reused chunks moved from their stored positions, then the question (positions 0..n-1).
  std::vector<std::int32_t> pos(n), old_pos(n);
  std::iota(pos.begin(), pos.end(), 0);
  for (std::int64_t t = 0; t < n; ++t) old_pos[t] = t < 350 ? static_cast<std::int32_t>(t + 4000) : static_cast<std::int32_t>(t - 350);
  // Selected tokens S_l (sorted): every 5th token plus the question's last 20.
  std::vector<std::int32_t> sel;
  for (std::int32_t t = 0; t < n; ++t)
    if (t % 5 == 0 || t >= n - 20) sel.push_back(t);
  const auto s = static_cast<std::int64_t>(sel.size());

  auto k_all = kvfuse::gpu_test::random_values<bf16>(static_cast<std::size_t>(layers * layer_elems));
  auto v_all = kvfuse::gpu_test::random_values<bf16>(static_cast<std::size_t>(layers * layer_elems));
  const auto q_new = kvfuse::gpu_test::random_values<bf16>(static_cast<std::size_t>(s * hq * d));
  const auto k_new = kvfuse::gpu_test::random_values<bf16>(static_cast<std::size_t>(s * row));
  const auto v_new = kvfuse::gpu_test::random_values<bf16>(static_cast<std::size_t>(s * row));

  DeviceBuffer<bf16> d_k(k_all.size()), d_v(v_all.size()), d_q_new(q_new.size()), d_k_new(k_new.size()),
      d_v_new(v_new.size()), d_out(static_cast<std::size_t>(s * hq * d));
  DeviceBuffer<std::int32_t> d_pos(n), d_old_pos(n), d_sel(sel.size()), d_keep(sel.size());
  DeviceBuffer<float> d_dev(sel.size()), d_lse(static_cast<std::size_t>(s * hq)), d_mass(static_cast<std::size_t>(s * 3));
  DeviceBuffer<std::int64_t> d_chunks(4);
  d_k.upload(k_all);
  d_v.upload(v_all);
  d_q_new.upload(q_new);
  d_k_new.upload(k_new);
  d_v_new.upload(v_new);
  d_pos.upload(pos);
  d_old_pos.upload(old_pos);
  d_sel.upload(sel);
  const std::vector<std::int64_t> chunk_starts = {0, 350, 680, n};
  d_chunks.upload(chunk_starts);

  // 1. Move every layer's cached K to this prompt's positions, one rotation by new - old.
  kvfuse::RopeFrequencyConfig freq;
  freq.head_dim = d;
  freq.base = 10000.0;
  kvfuse::RopeArgs shift;
  shift.dtype = DType::bf16;
  shift.pairing = kvfuse::RopePairing::half_split;
  shift.head_dim = d;
  shift.num_tokens = n;
  shift.num_heads = hkv;
  shift.num_layers = layers;
  shift.in = shift.out = d_k.data();
  shift.in_strides = shift.out_strides = kvfuse::rope_nhd_strides(n, hkv, d);
  shift.positions = d_old_pos.data();
  shift.new_positions = d_pos.data();
  KVFUSE_GPU_OK(kvfuse::rope_frequencies(freq, shift.theta));
  KVFUSE_GPU_OK(kvfuse::cuda::rope_shift(shift));
  KVFUSE_GPU_CUDA(cudaDeviceSynchronize());
  {
    kvfuse::RopeArgs host = shift;
    host.in = host.out = k_all.data();
    host.positions = old_pos.data();
    host.new_positions = pos.data();
    KVFUSE_GPU_OK(kvfuse::ref::rope_shift(host));
    const int bad = bf16_ulp_mismatches(d_k.download(), k_all);
    KVFUSE_GPU_CHECK(bad == 0, "rope_shift: %d of %zu elements differ from the reference by more than 1 ulp", bad,
                     k_all.size());
    k_all = d_k.download();  // later steps start from the device's K
  }

  // 2. Check layer 0: deviation of the recomputed V of S from the cached V rows, keep the top 40 %.
  kvfuse::KVDeviationArgs dv;
  dv.dtype = DType::bf16;
  dv.num_tokens = s;
  dv.num_heads = hkv;
  dv.head_dim = d;
  dv.recomputed = d_v_new.data();
  dv.cached = d_v.data();
  dv.cached_rows = d_sel.data();
  dv.num_cached_rows = n;
  dv.deviation = d_dev.data();
  dv.recomputed_token_stride = dv.cached_token_stride = row;
  dv.recomputed_head_stride = dv.cached_head_stride = d;
  d_dev.poison();
  KVFUSE_GPU_OK(kvfuse::cuda::kv_deviation(dv));
  kvfuse::TopKArgs tk;
  tk.scores = d_dev.data();
  tk.num_items = s;
  tk.k = kvfuse::top_k_count(0.4, s);
  tk.indices = d_keep.data();
  const std::size_t ws_bytes = kvfuse::cuda::top_k_workspace_bytes(s);
  DeviceBuffer<std::uint8_t> ws(ws_bytes);
  d_keep.poison();
  KVFUSE_GPU_OK(kvfuse::cuda::top_k_tokens(tk, ws.data(), ws_bytes));
  KVFUSE_GPU_CUDA(cudaDeviceSynchronize());
  {
    const std::vector<float> dev = d_dev.download();
    std::vector<float> want(dev.size());
    kvfuse::KVDeviationArgs host = dv;
    host.recomputed = v_new.data();
    host.cached = v_all.data();
    host.cached_rows = sel.data();
    host.deviation = want.data();
    KVFUSE_GPU_OK(kvfuse::ref::kv_deviation(host));
    std::vector<double> got_d(dev.begin(), dev.end()), want_d(want.begin(), want.end());
    const double err = kvfuse::gpu_test::relative_error(got_d, want_d);
    KVFUSE_GPU_CHECK(err <= 1e-5, "kv_deviation: relative error %.3g", err);
    std::vector<std::int32_t> keep_want(static_cast<std::size_t>(tk.k));
    kvfuse::TopKArgs host_tk = tk;
    host_tk.scores = dev.data();  // the device's deviations: the selection itself must match exactly
    host_tk.indices = keep_want.data();
    KVFUSE_GPU_OK(kvfuse::ref::top_k_tokens(host_tk));
    std::vector<std::int32_t> keep = d_keep.download();
    keep.resize(keep_want.size());
    KVFUSE_GPU_CHECK(keep == keep_want, "top_k_tokens: the kept set differs from the reference's");
  }

  // 3. Layer 0: the recomputed K/V rows of S over the cached rows.
  kvfuse::KVScatterArgs sc;
  sc.dtype = DType::bf16;
  sc.num_tokens = s;
  sc.num_heads = hkv;
  sc.head_dim = d;
  sc.src_k = d_k_new.data();
  sc.src_v = d_v_new.data();
  sc.src_token_stride = row;
  sc.src_head_stride = d;
  sc.cache_k = d_k.data();
  sc.cache_v = d_v.data();
  sc.slots = d_sel.data();
  sc.cache.num_slots = n;
  sc.cache.slot_stride = row;
  sc.cache.head_stride = d;
  KVFUSE_GPU_OK(kvfuse::cuda::kv_scatter(sc));
  KVFUSE_GPU_CUDA(cudaDeviceSynchronize());
  {
    kvfuse::KVScatterArgs host = sc;
    host.src_k = k_new.data();
    host.src_v = v_new.data();
    host.cache_k = k_all.data();
    host.cache_v = v_all.data();
    host.slots = sel.data();
    KVFUSE_GPU_OK(kvfuse::ref::kv_scatter(host));
    const auto k_dev = d_k.download();
    const auto v_dev = d_v.download();
    const bool same = std::equal(k_dev.begin(), k_dev.end(), k_all.begin(), [](bf16 a, bf16 b) { return a.bits == b.bits; }) &&
                      std::equal(v_dev.begin(), v_dev.end(), v_all.begin(), [](bf16 a, bf16 b) { return a.bits == b.bits; });
    KVFUSE_GPU_CHECK(same, "kv_scatter: the cache differs from the reference's");
  }

  // 4. Layer 0: the selected queries attend to every key at a position <= theirs; mass per chunk.
  kvfuse::SparseAttentionArgs at;
  at.dtype = DType::bf16;
  at.num_queries = s;
  at.num_keys = n;
  at.num_q_heads = hq;
  at.num_kv_heads = hkv;
  at.head_dim = d;
  at.q = d_q_new.data();
  at.q_pos = d_sel.data();  // positions = token indices here
  at.k = d_k.data();
  at.v = d_v.data();
  at.k_pos = d_pos.data();
  at.o = d_out.data();
  at.lse = d_lse.data();
  at.num_chunks = 3;
  at.chunk_starts = d_chunks.data();
  at.mass = d_mass.data();
  at.workspace_bytes = kvfuse::cuda::sparse_attention_workspace_bytes(at);
  DeviceBuffer<std::uint8_t> attn_ws(static_cast<std::size_t>(std::max<std::int64_t>(at.workspace_bytes, 16)));
  at.workspace = attn_ws.data();
  d_out.poison();
  d_lse.poison();
  d_mass.poison();
  KVFUSE_GPU_OK(kvfuse::cuda::sparse_attention(at));
  KVFUSE_GPU_CUDA(cudaDeviceSynchronize());
  {
    std::vector<bf16> out(static_cast<std::size_t>(s * hq * d));
    std::vector<float> lse(static_cast<std::size_t>(s * hq)), mass(static_cast<std::size_t>(s * 3));
    kvfuse::SparseAttentionArgs host = at;
    host.q = q_new.data();
    host.q_pos = sel.data();
    host.k = k_all.data();
    host.v = v_all.data();
    host.k_pos = pos.data();
    host.o = out.data();
    host.lse = lse.data();
    host.chunk_starts = chunk_starts.data();
    host.mass = mass.data();
    host.workspace = nullptr;
    host.workspace_bytes = 0;
    KVFUSE_GPU_OK(kvfuse::ref::sparse_attention(host));
    const double e_out = kvfuse::gpu_test::relative_error(kvfuse::gpu_test::to_double(d_out.download()),
                                                         kvfuse::gpu_test::to_double(out));
    const auto lse_dev = d_lse.download();
    const auto mass_dev = d_mass.download();
    const double e_lse = kvfuse::gpu_test::relative_error(std::vector<double>(lse_dev.begin(), lse_dev.end()),
                                                         std::vector<double>(lse.begin(), lse.end()));
    const double e_mass = kvfuse::gpu_test::relative_error(std::vector<double>(mass_dev.begin(), mass_dev.end()),
                                                          std::vector<double>(mass.begin(), mass.end()));
    KVFUSE_GPU_CHECK(e_out <= 1e-2, "sparse_attention: O relative error %.3g", e_out);
    KVFUSE_GPU_CHECK(e_lse <= 1e-4, "sparse_attention: LSE relative error %.3g", e_lse);
    KVFUSE_GPU_CHECK(e_mass <= 1e-3, "sparse_attention: chunk mass relative error %.3g", e_mass);
  }
}
